//! CPU side of `lowbit bench`.
//!
//! - `linear`: [`LinearCpu`] (impl `lowbit`) against the `gemm` crate's f32 GEMM on the same weight dequantized to
//!   dense f32 (impl `dense_f32`), both on all cores through rayon.
//! - `dequant`: `ops::dequantize::cpu::dequantize` into `[N, K]` (impl `lowbit`) and `[K, N]` (impl `lowbit_kn`)
//!   against a parallel copy of half the bytes it moves (impl `memcpy`, so the copy reads and writes the same total).
//!   Records have `M = 0`.
//! - `w8a8`: per-block W8A8 with online activation quantization included (impl `lowbit`, block = `--group`, 128 by
//!   default) and SmoothQuant per-token × per-channel (impl `lowbit_smoothquant`), against `dense_f32` on the same
//!   weight dequantized.
//! - `conv`: [`Conv2dCpu`] (int8 or int4 per-block weights, f32 NCHW) against im2col + the same dense f32 GEMM on
//!   the unquantized weight (the im2col is timed too: a dense convolution has to do it).

use super::{time_us, BenchArgs, BenchRecord, Shape, Sink};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::{cpu::Conv2dCpu, Conv2dParams};
use lowbit::ops::dequantize::{cpu::dequantize, Layout};
use lowbit::ops::linear::LinearCpu;
use lowbit::ops::w8a8::cpu::{BlockW8a8Cpu, SmoothQuantCpu};
use lowbit::ops::w8a8::{quantize_activations, ActivationQuant};
use lowbit::testing::{random_quant, QuantSpec, Scales, SplitMix64, Zeros};
use lowbit::{DType, Error, Float, QuantMatrix, Result};
use rayon::prelude::*;

/// Benchmarks every op the CPU has that `args` asks for.
pub fn run(args: &BenchArgs, sink: &mut Sink) -> Result<()> {
    if let Some(op) = args
        .op
        .as_deref()
        .filter(|op| !["linear", "dequant", "w8a8", "conv"].contains(op))
    {
        return Err(Error::Unsupported(format!(
            "bench --op {op} on the CPU (CPU benches: linear, dequant, w8a8, conv)"
        )));
    }
    if args.wbits != 4 && args.wbits != 8 {
        return Err(Error::invalid("--wbits", args.wbits, "must be 4 or 8"));
    }
    let device = cpu_model();
    let shapes = args.shapes()?;
    let linear_dtypes = args.dtypes(&[DType::F32])?;
    let dequant_dtypes = args.dtypes(&[DType::F16])?;
    let mut dequant_shapes: Vec<Shape> = Vec::new();
    for s in &shapes {
        let s = Shape { m: 0, ..*s };
        if !dequant_shapes.contains(&s) {
            dequant_shapes.push(s);
        }
    }
    if args.wants("linear") {
        sink.expect(shapes.len() * (1 + linear_dtypes.len()));
    }
    if args.wants("dequant") {
        sink.expect(dequant_shapes.len() * (1 + DEQUANT_LAYOUTS.len()) * dequant_dtypes.len());
    }
    if args.wants("w8a8") {
        sink.expect(shapes.len() * 3);
    }
    let convs: Vec<ConvCase> = if args.conv.is_empty() {
        DEFAULT_CONVS
            .iter()
            .map(|c| ConvCase::parse(c))
            .collect::<Result<_>>()?
    } else {
        args.conv.iter().map(|c| ConvCase::parse(c)).collect::<Result<_>>()?
    };
    if args.wants("conv") {
        sink.expect(convs.len() * 2);
    }
    if args.wants("linear") {
        for &shape in &shapes {
            bench_linear(args, shape, &linear_dtypes, &device, sink)?;
        }
    }
    if args.wants("dequant") {
        for &shape in &dequant_shapes {
            bench_dequant(args, shape, &dequant_dtypes, &device, sink)?;
        }
    }
    if args.wants("w8a8") {
        for &shape in &shapes {
            bench_w8a8(args, shape, &device, sink)?;
        }
    }
    if args.wants("conv") {
        for case in &convs {
            bench_conv(args, case, &device, sink)?;
        }
    }
    Ok(())
}

/// Small enough for a 2-core machine: a ResNet 3×3 stage and a 1×1 projection.
const DEFAULT_CONVS: [&str; 2] = ["1x64x56x56,k3s1p1", "1x256x14x14,k1s1p0,co512"];

/// A square-kernel convolution case, `BxCxHxW,kKsSpP[,coN]` (the `conv` field of a bench record, without `co`).
pub(super) struct ConvCase {
    pub(super) input: [usize; 4],
    pub(super) co: usize,
    pub(super) kernel: usize,
    pub(super) stride: usize,
    pub(super) padding: usize,
    pub(super) label: String,
}

impl ConvCase {
    pub(super) fn parse(spec: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(
                "--conv",
                spec,
                "must be BxCxHxW,kKsSpP or BxCxHxW,kKsSpP,coN (positive integers)",
            )
        };
        let parts: Vec<&str> = spec.split(',').collect();
        let dims: Vec<usize> = parts[0]
            .split('x')
            .map(|d| d.parse().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let geometry = parts.get(1).ok_or_else(bad)?;
        let number = |after: char, until: Option<char>| -> Result<usize> {
            let start = geometry.find(after).ok_or_else(bad)? + 1;
            let end = until.and_then(|c| geometry.find(c)).unwrap_or(geometry.len());
            geometry.get(start..end).and_then(|v| v.parse().ok()).ok_or_else(bad)
        };
        let (kernel, stride, padding) = (number('k', Some('s'))?, number('s', Some('p'))?, number('p', None)?);
        let co = match parts.get(2) {
            Some(c) => c.strip_prefix("co").and_then(|v| v.parse().ok()).ok_or_else(bad)?,
            None => dims.get(1).copied().unwrap_or(0),
        };
        match dims[..] {
            [b, c, h, w] if [b, c, h, w, co, kernel, stride].iter().all(|&d| d > 0) && parts.len() <= 3 => Ok(Self {
                input: [b, c, h, w],
                co,
                kernel,
                stride,
                padding,
                label: format!("{},k{kernel}s{stride}p{padding}", parts[0]),
            }),
            _ => Err(bad()),
        }
    }
}

fn bench_conv(args: &BenchArgs, case: &ConvCase, device: &str, sink: &mut Sink) -> Result<()> {
    let [b, ci, h, w] = case.input;
    let (co, kk) = (case.co, case.kernel);
    let params = Conv2dParams {
        stride: (case.stride, case.stride),
        padding: (case.padding, case.padding),
        ..Conv2dParams::default()
    };
    // Blocks of `--group` input channels where that divides Ci, else one block per output channel.
    let blocks = match args.group {
        g if g > 0 && ci % g as usize == 0 => ci / g as usize,
        _ => 1,
    };
    let bits = if args.wbits == 4 {
        BlockBits::Int4
    } else {
        BlockBits::Int8
    };
    let mut rng = SplitMix64(0xC0DE ^ (ci * 31 + co) as u64);
    let dense: Vec<f32> = (0..co * ci * kk * kk).map(|_| rng.signed_unit() * 0.05).collect();
    let x: Vec<f32> = (0..b * ci * h * w).map(|_| rng.signed_unit()).collect();
    let weight = BlockQuantWeight::quantize(&dense, BlockShape::conv(co, ci, (kk, kk), blocks)?, bits)?;
    let conv = Conv2dCpu::new(&weight, None, params)?;
    let out = conv.output_shape(case.input)?;
    let shape = Shape {
        m: b * out[2] * out[3],
        k: ci * kk * kk,
        n: co,
    };
    let record = |implementation: &str, us: f64, bytes: u64| {
        let mut r = BenchRecord::new("conv", implementation, device, DType::F32, shape, bytes, us);
        r.conv = Some(case.label.clone());
        r
    };

    sink.status(format!("conv dense_f32 {}", case.label));
    let mut cols = vec![0.0f32; shape.m * shape.k];
    let mut y = vec![0.0f32; shape.m * shape.n];
    let us = time_us(|| {
        im2col(&x, case, out, &mut cols);
        dense_f32_linear(&cols, &dense, shape, &mut y)
    });
    let io_bytes = 4 * (x.len() + shape.m * shape.n) as u64;
    sink.push(record("dense_f32", us, io_bytes + 4 * dense.len() as u64))?;

    sink.status(format!("conv lowbit {}", case.label));
    let mut y = vec![0.0f32; b * co * out[2] * out[3]];
    conv.forward_into(&x, case.input, &mut y)?;
    let us = time_us(|| {
        conv.forward_into(&x, case.input, &mut y)
            .expect("arguments checked above");
    });
    let weight_bytes = (dense.len() * args.wbits as usize / 8 + 8 * co * blocks) as u64;
    let mut r = record("lowbit", us, io_bytes + weight_bytes);
    r.wbits = Some(args.wbits);
    r.group = Some(if blocks == 1 { -1 } else { (ci / blocks) as i64 });
    sink.push(r)
}

/// `cols[(b, oh, ow), (c, kh, kw)]`: the input patch of every output pixel, zero outside the image.
fn im2col(x: &[f32], case: &ConvCase, out: [usize; 4], cols: &mut [f32]) {
    let [_, ci, h, w] = case.input;
    let (kk, stride, pad) = (case.kernel, case.stride, case.padding);
    let (ho, wo) = (out[2], out[3]);
    cols.par_chunks_mut(ci * kk * kk).enumerate().for_each(|(m, row)| {
        let (b, oh, ow) = (m / (ho * wo), m / wo % ho, m % wo);
        for (t, v) in row.iter_mut().enumerate() {
            let (c, kh, kw) = (t / (kk * kk), t / kk % kk, t % kk);
            let (ih, iw) = (
                (oh * stride + kh) as isize - pad as isize,
                (ow * stride + kw) as isize - pad as isize,
            );
            *v = if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < w {
                x[((b * ci + c) * h + ih as usize) * w + iw as usize]
            } else {
                0.0
            };
        }
    });
}

/// W8A8 in f32: the activation quantization is inside the timed region (it runs on every call in a real layer).
fn bench_w8a8(args: &BenchArgs, shape: Shape, device: &str, sink: &mut Sink) -> Result<()> {
    let Shape { m, k, n } = shape;
    let block = if args.group == -1 { k } else { args.group_for(k)? };
    let mut rng = SplitMix64(0x88A8 ^ (k * 31 + n) as u64);
    let dense: Vec<f32> = (0..n * k).map(|_| rng.signed_unit() * 0.05).collect();
    let x: Vec<f32> = (0..m * k).map(|_| rng.signed_unit()).collect();
    let block_weight = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, block), BlockBits::Int8)?;
    let channel_weight = BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k)?;

    sink.status(format!("w8a8 dense_f32 {m}x{k}x{n}"));
    let mut y = vec![0.0f32; m * n];
    let us = time_us(|| dense_f32_linear(&x, &dense, shape, &mut y));
    let dense_bytes = 4 * (n * k + m * k + m * n) as u64;
    sink.push(BenchRecord::new(
        "w8a8",
        "dense_f32",
        device,
        DType::F32,
        shape,
        dense_bytes,
        us,
    ))?;

    let bytes = (n * k + 4 * (m * k + m * n)) as u64;
    let record = |implementation: &str, us: f64, group: i64| {
        let mut r = BenchRecord::new("w8a8", implementation, device, DType::F32, shape, bytes, us);
        r.wbits = Some(8);
        r.group = Some(group);
        r
    };
    sink.status(format!("w8a8 lowbit {m}x{k}x{n}"));
    let gemm = BlockW8a8Cpu::new(&block_weight, None)?;
    let run = |y: &mut [f32]| -> Result<()> {
        let a = quantize_activations(&x, m, k, block, ActivationQuant::Asymmetric)?;
        gemm.forward_into(&a, y)
    };
    run(&mut y)?;
    let us = time_us(|| run(&mut y).expect("arguments checked above"));
    sink.push(record("lowbit", us, BenchArgs::group_field(block, k)))?;

    sink.status(format!("w8a8 lowbit_smoothquant {m}x{k}x{n}"));
    let gemm = SmoothQuantCpu::new(&channel_weight, None)?;
    let run = |y: &mut [f32]| -> Result<()> {
        let a = quantize_activations(&x, m, k, k, ActivationQuant::Symmetric)?;
        gemm.forward_into(&a, y)
    };
    run(&mut y)?;
    let us = time_us(|| run(&mut y).expect("arguments checked above"));
    sink.push(record("lowbit_smoothquant", us, -1))
}

fn bench_linear(args: &BenchArgs, shape: Shape, dtypes: &[DType], device: &str, sink: &mut Sink) -> Result<()> {
    let Shape { m, k, n } = shape;
    let w = random_weight(args, k, n)?;
    let lin = LinearCpu::new(&w)?;
    let mut rng = SplitMix64(0xBE7C4);
    let x: Vec<f32> = (0..m * k).map(|_| rng.signed_unit()).collect();

    sink.status(format!("linear dense_f32 {m}x{k}x{n}"));
    let mut dense = vec![0.0f32; n * k];
    dequantize(&w, Layout::Nk, &mut dense)?;
    let mut y = vec![0.0f32; m * n];
    let us = time_us(|| dense_f32_linear(&x, &dense, shape, &mut y));
    drop(dense);
    let bytes = 4 * (n * k + m * k + m * n) as u64;
    sink.push(BenchRecord::new(
        "linear",
        "dense_f32",
        device,
        DType::F32,
        shape,
        bytes,
        us,
    ))?;

    for &dtype in dtypes {
        sink.status(format!("linear lowbit {dtype} {m}x{k}x{n}"));
        let us = match dtype {
            DType::F32 => time_linear::<f32>(&lin, &x, m),
            DType::F16 => time_linear::<half::f16>(&lin, &x, m),
            _ => time_linear::<half::bf16>(&lin, &x, m),
        }?;
        let bytes = weight_bytes(&w) + (dtype.size() * (m * k + m * n)) as u64;
        let mut record = BenchRecord::new("linear", "lowbit", device, dtype, shape, bytes, us);
        record.wbits = Some(w.bits);
        record.group = Some(BenchArgs::group_field(w.group_size, w.k));
        sink.push(record)?;
    }
    Ok(())
}

fn time_linear<T: Float>(lin: &LinearCpu, x: &[f32], m: usize) -> Result<f64> {
    let x: Vec<T> = x.iter().map(|&v| T::from_f32(v)).collect();
    let mut y = vec![T::default(); m * lin.n()];
    lin.forward(&x, m, lin.k(), None, &mut y)?;
    Ok(time_us(|| {
        lin.forward(&x, m, lin.k(), None, &mut y)
            .expect("arguments checked above")
    }))
}

/// `y[M, N] = x[M, K] · W^T` with the `gemm` crate, `W` dense `[N, K]` f32 (nn.Linear layout), on all threads: the
/// dense baseline of the CPU benches and of `lowbit demo`.
pub(crate) fn dense_f32_linear(x: &[f32], w: &[f32], Shape { m, k, n }: Shape, y: &mut [f32]) {
    assert!(
        x.len() == m * k && w.len() == n * k && y.len() == m * n,
        "dense_f32_linear: shapes"
    );
    // SAFETY: the three buffers hold exactly [M, K], [N, K] and [M, N] (checked above); strides describe them:
    // y row-major (column stride 1, row stride N), x row-major, and W^T[k, n] = w[n * K + k].
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        )
    }
}

fn bench_dequant(args: &BenchArgs, shape: Shape, dtypes: &[DType], device: &str, sink: &mut Sink) -> Result<()> {
    let w = random_weight(args, shape.k, shape.n)?;
    for &dtype in dtypes {
        let bytes = weight_bytes(&w) + (dtype.size() * w.n * w.k) as u64;

        sink.status(format!("dequant memcpy {}x{}", shape.k, shape.n));
        let src = vec![0x5Au8; bytes as usize / 2];
        let mut dst = vec![0u8; src.len()];
        let us = time_us(|| parallel_copy(&src, &mut dst));
        sink.push(BenchRecord::new("dequant", "memcpy", device, dtype, shape, bytes, us))?;

        for (layout, implementation) in DEQUANT_LAYOUTS {
            sink.status(format!("dequant {implementation} {dtype} {}x{}", shape.k, shape.n));
            let us = match dtype {
                DType::F32 => time_dequant::<f32>(&w, layout),
                DType::F16 => time_dequant::<half::f16>(&w, layout),
                _ => time_dequant::<half::bf16>(&w, layout),
            }?;
            let mut record = BenchRecord::new("dequant", implementation, device, dtype, shape, bytes, us);
            record.wbits = Some(w.bits);
            record.group = Some(BenchArgs::group_field(w.group_size, w.k));
            sink.push(record)?;
        }
    }
    Ok(())
}

/// The dequantization output layouts timed, and the `impl` each is recorded as.
const DEQUANT_LAYOUTS: [(Layout, &str); 2] = [(Layout::Nk, "lowbit"), (Layout::Kn, "lowbit_kn")];

fn time_dequant<T: Float>(w: &QuantMatrix, layout: Layout) -> Result<f64> {
    let mut out = vec![T::default(); w.n * w.k];
    dequantize(w, layout, &mut out)?;
    Ok(time_us(|| {
        dequantize(w, layout, &mut out).expect("arguments checked above")
    }))
}

/// `dst = src` on all threads, in 1 MiB pieces.
fn parallel_copy(src: &[u8], dst: &mut [u8]) {
    const PIECE: usize = 1 << 20;
    dst.par_chunks_mut(PIECE)
        .zip(src.par_chunks(PIECE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// Bytes of the quantized weight as a checkpoint holds it: packed codes, f16 scales and packed zeros.
fn weight_bytes(w: &QuantMatrix) -> u64 {
    let groups = w.groups();
    let codes = w.n * w.k * usize::from(w.bits) / 8;
    let scales = 2 * w.n * groups;
    let zeros = w.zeros.as_ref().map_or(0, |_| w.n * groups * usize::from(w.bits) / 8);
    (codes + scales + zeros) as u64
}

/// A random `[N, K]` weight with the bits, group and zero points of `args` and checkpoint-like f16 scales.
fn random_weight(args: &BenchArgs, k: usize, n: usize) -> Result<QuantMatrix> {
    let mut spec = QuantSpec {
        scales: Scales::Uniform { lo: 0.002, hi: 0.012 },
        ..QuantSpec::new(n, k, args.wbits, args.group_for(k)?)
    };
    if args.symmetric {
        spec.zeros = Zeros::Symmetric;
    }
    Ok(random_quant(&mut SplitMix64(0x5EED ^ (k * 31 + n) as u64), &spec))
}

/// The CPU model from /proc/cpuinfo ("model name"), or "unknown CPU".
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
