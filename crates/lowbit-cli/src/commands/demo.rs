//! `lowbit demo`: one realistic layer, quantized to AWQ int4, checked against the dense result and timed against
//! the dense baseline on the best device present — the whole library in under a minute.
//!
//! The weight is `[N, K]` drawn from a seeded PRNG with the features that make real LLM weights hard to quantize
//! (rows of different spread, a few large input channels); the activations have outlier channels as real ones do.
//! Two errors are reported, because they answer different questions:
//! - lowbit vs the exact product with the dequantized weight (f64): is the kernel right? (~1e-6 with f32 output on
//!   the CPU, ~1e-4 with fp16 output on the GPU: the output rounding)
//! - lowbit vs the product with the unquantized weight: what does 4-bit RTN cost? (~15% on this weight)
//!
//! Timings: CPU, the median of batches of calls (`lowbit bench`'s timer); GPU, the median of batches between CUDA
//! events, every weight rotated among enough copies to exceed 2 x L2 so each call reads device memory.

use super::human_bytes;
use crate::bench::{dense_f32_linear, time_us, Shape};
use half::f16;
use lowbit::cuda::{CudaDevice, CudaSlice, Device, StreamTimer};
use lowbit::formats::awq::AwqWeight;
use lowbit::ops::dequantize::cuda::{DequantDesc, DequantizeInt4, Int4Layout, Int4Weight};
use lowbit::ops::dequantize::{dequantize_to_tensor, Layout};
use lowbit::ops::linear::cuda::CublasLinear;
use lowbit::ops::linear::{reference, Activation, LinearCpu, QuantLinear};
use lowbit::quantize::{quantize_rtn, RtnConfig};
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, QuantMatrix, Result};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// cpu | cuda | cuda:N | auto
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Weight shape NxK (out_features x in_features).
    #[arg(long, default_value = "4096x4096")]
    pub shape: String,
    /// Group size along K.
    #[arg(long, default_value_t = 128)]
    pub group_size: usize,
    /// Batch sizes (rows of activations) to check and time, comma-separated.
    #[arg(long, default_value = "1,16", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// PRNG seed of the weight and activations.
    #[arg(long, default_value_t = 2024)]
    pub seed: u64,
}

/// Uniform in (0, 1] from 53 bits (never 0, so the logarithm below is finite).
fn open_unit(rng: &mut SplitMix64) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// A standard normal by Box–Muller: deterministic on every platform.
fn normal(rng: &mut SplitMix64) -> f32 {
    let (u, v) = (open_unit(rng), open_unit(rng));
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// A `[n, k]` weight like a trained projection: N(0, 0.02) per element, each row's spread scaled by 0.5..1.5, and
/// one input channel in 64 four times larger (what AWQ's activation-aware scaling exists for).
fn realistic_weight(n: usize, k: usize, rng: &mut SplitMix64) -> Vec<f32> {
    let row_scale: Vec<f32> = (0..n).map(|_| 0.5 + open_unit(rng) as f32).collect();
    let mut w = vec![0f32; n * k];
    for (row, chunk) in w.chunks_exact_mut(k).enumerate() {
        for (col, v) in chunk.iter_mut().enumerate() {
            let channel = if col % 64 == 7 { 4.0 } else { 1.0 };
            *v = 0.02 * row_scale[row] * channel * normal(rng);
        }
    }
    w
}

/// `[m, k]` activations: N(0, 1) with one channel in 128 ten times larger (LLM activation outliers).
fn realistic_activations(m: usize, k: usize, rng: &mut SplitMix64) -> Vec<f32> {
    (0..m * k)
        .map(|i| normal(rng) * if i % k % 128 == 3 { 10.0 } else { 1.0 })
        .collect()
}

/// `mean |a - b| / mean |b|`, the metric the tests use.
fn mean_rel(a: &[f32], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).sum();
    let base: f64 = b.iter().map(|y| y.abs()).sum();
    diff / base.max(f64::MIN_POSITIVE)
}

/// `y = x · W^T` in f64 with the unquantized weight.
fn dense_f64(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let mut y = vec![0f64; m * n];
    y.par_chunks_mut(n).enumerate().for_each(|(row, out)| {
        let xr = &x[row * k..(row + 1) * k];
        for (col, o) in out.iter_mut().enumerate() {
            *o = xr
                .iter()
                .zip(&w[col * k..(col + 1) * k])
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
        }
    });
    y
}

fn parse_shape(s: &str) -> Result<(usize, usize)> {
    let dims: Vec<Option<usize>> = s.split('x').map(|d| d.trim().parse().ok()).collect();
    match dims[..] {
        [Some(n), Some(k)] if n > 0 && k > 0 => Ok((n, k)),
        _ => Err(Error::invalid(
            "--shape",
            format!("{s:?}"),
            "must be NxK, e.g. 4096x4096",
        )),
    }
}

/// Bytes of the AWQ tensors of `w`.
fn awq_bytes(w: &AwqWeight) -> u64 {
    (w.qweight.len() * 4 + w.qzeros.len() * 4 + w.scales.len() * w.scale_dtype.size()) as u64
}

fn fmt_time(us: f64) -> String {
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} us")
    }
}

/// One batch of activations and the two references every device is checked against.
struct Batch {
    m: usize,
    /// `[m, K]`, fp16-representable.
    x: Vec<f32>,
    /// f64 product with the dequantized weight.
    exact: Vec<f64>,
    /// f64 product with the unquantized weight.
    unquantized: Vec<f64>,
}

pub fn run(a: DemoArgs) -> Result<()> {
    let (n, k) = parse_shape(&a.shape)?;
    if a.group_size == 0 || k % a.group_size != 0 {
        return Err(Error::invalid(
            "--group-size",
            a.group_size,
            format!("must divide K = {k}"),
        ));
    }
    if n % 8 != 0 {
        return Err(Error::invalid(
            "--shape",
            format!("N = {n}"),
            "AWQ needs N to be a multiple of 8",
        ));
    }
    if a.batch.is_empty() || a.batch.contains(&0) {
        return Err(Error::invalid(
            "--batch",
            format!("{:?}", a.batch),
            "batch sizes must be positive",
        ));
    }
    // `auto` uses the GPU when there is a usable one and says why not otherwise; `cuda`/`cuda:N` insist.
    let gpu = match a.device.trim() {
        "auto" => CudaDevice::new(0).map_err(|e| e.to_string()),
        "cpu" => Err("--device cpu".to_string()),
        spec => match Device::from_spec(spec)? {
            Device::Cuda(dev) => Ok(dev),
            Device::Cpu => Err(format!("--device {spec}")),
        },
    };
    let mut rng = SplitMix64(a.seed);

    println!("lowbit demo: W4A16 linear layer, weight [{n}, {k}] (out x in, seeded synthetic LLM-like weights)");
    let weight = realistic_weight(n, k, &mut rng);
    let t = Instant::now();
    let q = quantize_rtn(&weight, n, k, &RtnConfig::autoawq(a.group_size))?;
    let awq = AwqWeight::from_quant(&q)?;
    let quant_s = t.elapsed().as_secs_f64();
    let round_trip = awq.to_quant() == q;
    println!(
        "  quantize (AutoAWQ RTN, int4, group {}) + pack AWQ GEMM: {quant_s:.2} s; unpack round trip exact: {}",
        a.group_size,
        if round_trip { "yes" } else { "NO" }
    );
    let fp16 = (n * k * 2) as u64;
    println!(
        "  weight memory: {} fp16 -> {} AWQ (qweight + qzeros + scales), {:.2}x smaller",
        human_bytes(fp16),
        human_bytes(awq_bytes(&awq)),
        fp16 as f64 / awq_bytes(&awq) as f64
    );
    if !round_trip {
        return Err(Error::Unsupported(
            "AWQ pack/unpack did not round-trip (a bug: please report)".into(),
        ));
    }

    let batches: Vec<Batch> = a
        .batch
        .iter()
        .map(|&m| {
            let x = realistic_activations(m, k, &mut rng);
            let exact = reference::linear(&x, m, &q, None);
            let unquantized = dense_f64(&x, m, &weight, n, k);
            Batch {
                m,
                x,
                exact,
                unquantized,
            }
        })
        .collect();
    cpu_section(&q, &weight, &batches)?;
    match gpu {
        Ok(dev) => cuda_section(&dev, &q, &awq, &weight, &batches)?,
        Err(why) => println!("cuda: skipped: {why} (`lowbit doctor` says what CUDA pieces were found)"),
    }
    println!(
        "err = mean|y - ref| / mean|ref|; exact = f64 product with the dequantized weight, dense = with the original"
    );
    Ok(())
}

/// Fails unless every output is finite.
fn check_finite(what: &str, y: &[f32]) -> Result<()> {
    match y.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(Error::invalid(what, format!("{} at {i}", y[i]), "must be finite")),
        None => Ok(()),
    }
}

const TABLE_HEADER: [&str; 6] = ["M", "err vs exact", "err vs dense", "lowbit int4", "dense", "speedup"];

fn print_header(dense: &str) {
    let h = TABLE_HEADER;
    println!(
        "  {:>6}  {:>14}  {:>14}  {:>12}  {:>12}  {:>8}",
        h[0], h[1], h[2], h[3], dense, h[5]
    );
}

/// One table row; `note` follows it on the same line (the GPU's kernel for this batch).
fn print_row(b: &Batch, y: &[f32], lowbit_us: f64, dense_us: f64, note: &str) {
    println!(
        "  {:>6}  {:>14.2e}  {:>14.2e}  {:>12}  {:>12}  {:>7.2}x{}{note}",
        b.m,
        mean_rel(y, &b.exact),
        mean_rel(y, &b.unquantized),
        fmt_time(lowbit_us),
        fmt_time(dense_us),
        dense_us / lowbit_us,
        if note.is_empty() { "" } else { "  " }
    );
}

/// Checks [`LinearCpu`] against the exact and the unquantized products, and times it against dense f32.
fn cpu_section(q: &QuantMatrix, weight: &[f32], batches: &[Batch]) -> Result<()> {
    let (n, k) = (q.n, q.k);
    let lin = LinearCpu::new(q)?;
    println!(
        "cpu: {} ({} threads); dense = f32 GEMM of the gemm crate",
        lin.isa().name(),
        rayon::current_num_threads()
    );
    print_header("dense f32");
    for b in batches {
        let mut y = vec![0f32; b.m * n];
        lin.forward(&b.x, b.m, k, None, &mut y)?;
        check_finite("cpu output", &y)?;
        let lowbit_us = time_us(|| {
            lin.forward(&b.x, b.m, k, None, &mut y).expect("validated above");
        });
        let mut y_dense = vec![0f32; b.m * n];
        let shape = Shape { m: b.m, k, n };
        let dense_us = time_us(|| dense_f32_linear(&b.x, weight, shape, &mut y_dense));
        print_row(b, &y, lowbit_us, dense_us, "");
    }
    Ok(())
}

/// Median microseconds per call of `launch(i % sets)`: a warm-up batch, then five batches of ~10 ms between CUDA
/// events.
fn gpu_median_us(dev: &CudaDevice, sets: usize, mut launch: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    const BATCHES: usize = 5;
    const BATCH_US: f64 = 10_000.0;
    let stream = dev.stream();
    let timer = StreamTimer::new(dev)?;
    let mut batch = |reps: usize| -> Result<f64> {
        timer.start(stream)?;
        for i in 0..reps {
            launch(i % sets)?;
        }
        Ok(timer.stop_ms(stream)? * 1e3 / reps as f64)
    };
    let probe = batch(20)?;
    let reps = ((BATCH_US / probe.max(0.5)) as usize).clamp(10, 10_000);
    let mut samples: Vec<f64> = (0..BATCHES).map(|_| batch(reps)).collect::<Result<_>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[BATCHES / 2])
}

/// Copies of a buffer of `bytes` that together exceed 2 x L2, so a rotation among them reads device memory.
fn rotation(dev: &CudaDevice, bytes: usize) -> usize {
    (2 * dev.info().l2_bytes / bytes.max(1) + 1).max(2)
}

/// The GPU part: dequantization checked bit for bit against the CPU, then the W4A16 linear kernel checked like the
/// CPU one and timed against cuBLAS fp16 with the unquantized weight.
fn cuda_section(
    dev: &Arc<CudaDevice>,
    q: &QuantMatrix,
    awq: &AwqWeight,
    weight: &[f32],
    batches: &[Batch],
) -> Result<()> {
    let info = dev.info();
    println!(
        "cuda: {} ({}, {} SMs, {})",
        info.name,
        info.arch,
        info.sm_count,
        human_bytes(info.total_memory as u64)
    );
    cuda_dequantize(dev, q, awq)?;
    cuda_linear(dev, q, weight, batches)
}

fn cuda_dequantize(dev: &Arc<CudaDevice>, q: &QuantMatrix, awq: &AwqWeight) -> Result<()> {
    let (n, k) = (q.n, q.k);
    let desc = DequantDesc {
        layout: Int4Layout::Awq,
        k,
        n,
        group_size: q.group_size,
        zeros: true,
        g_idx: false,
        dtype: DType::F16,
    };
    let op = DequantizeInt4::new(dev, desc)?;
    let scales: Vec<f16> = awq.scales.iter().map(|&s| f16::from_f32(s)).collect();
    let sets = rotation(dev, desc.bytes());
    let weights: Vec<(CudaSlice<i32>, CudaSlice<i32>, CudaSlice<f16>)> = (0..sets)
        .map(|_| {
            Ok((
                dev.upload(&awq.qweight)?,
                dev.upload(&awq.qzeros)?,
                dev.upload(&scales)?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut outs: Vec<CudaSlice<f16>> = (0..sets)
        .map(|_| dev.alloc_zeros::<f16>(k * n))
        .collect::<Result<_>>()?;
    let run = |i: usize| {
        let (qweight, qzeros, scales) = &weights[i];
        let weight = Int4Weight {
            qweight,
            zeros: Some(qzeros),
            scales,
            g_idx: None,
        };
        op.run(dev.stream(), &weight, &mut outs[i], None)
    };
    // Every launch writes the same values, so checking outs[0] after the timing checks them all.
    let us = gpu_median_us(dev, sets, run)?;
    let got: Vec<u8> = dev.download(&outs[0])?.iter().flat_map(|v| v.to_le_bytes()).collect();
    let exact = got == dequantize_to_tensor(q, Layout::Kn, DType::F16)?.data;
    println!(
        "  dequantize AWQ int4 -> fp16 [K, N]: bit-exact vs CPU: {}; {}, {:.0} GB/s",
        if exact { "yes" } else { "NO" },
        fmt_time(us),
        desc.bytes() as f64 / (us * 1e3)
    );
    if !exact {
        return Err(Error::Cuda {
            context: "demo".into(),
            message: "GPU dequantization differs from the CPU's (a bug: please report)".into(),
        });
    }
    Ok(())
}

fn cuda_linear(dev: &Arc<CudaDevice>, q: &QuantMatrix, weight: &[f32], batches: &[Batch]) -> Result<()> {
    let (n, k) = (q.n, q.k);
    let max_m = batches.iter().map(|b| b.m).max().unwrap_or(1);
    let device = Device::Cuda(dev.clone());
    let layer = || QuantLinear::new(&device, q, None, Activation::None, DType::F16, max_m);
    let mut layers = vec![layer()?];
    for _ in 1..rotation(dev, layers[0].weight_bytes()) {
        layers.push(layer()?);
    }
    let dense: Vec<f16> = weight.iter().map(|&w| f16::from_f32(w)).collect();
    let dense_w: Vec<CudaSlice<f16>> = (0..rotation(dev, dense.len() * 2))
        .map(|_| dev.upload(&dense))
        .collect::<Result<_>>()?;
    drop(dense);
    let blas = CublasLinear::new(dev, n, k)?;
    let mut ws = dev.alloc_zeros::<u8>(layers[0].workspace_bytes(max_m).max(1))?;
    let stream = dev.stream();

    println!(
        "  W4A16 linear (QuantLinear, fp16 activations and output); dense = cuBLAS fp16 GEMM with the unquantized weight"
    );
    print_header("cuBLAS fp16");
    for b in batches {
        let x: Vec<f16> = b.x.iter().map(|&v| f16::from_f32(v)).collect();
        let x = dev.upload(&x)?;
        let mut y = dev.alloc_zeros::<f16>(b.m * n)?;
        layers[0].run(stream, &x, b.m, &mut y, &mut ws)?;
        let out: Vec<f32> = dev.download(&y)?.iter().map(|v| v.to_f32()).collect();
        check_finite("cuda output", &out)?;
        let lowbit_us = gpu_median_us(dev, layers.len(), |i| layers[i].run(stream, &x, b.m, &mut y, &mut ws))?;
        let dense_us = gpu_median_us(dev, dense_w.len(), |i| blas.run(&dense_w[i], &x, b.m, &mut y))?;
        print_row(b, &out, lowbit_us, dense_us, layers[0].kernel_for(b.m).name());
    }
    Ok(())
}
