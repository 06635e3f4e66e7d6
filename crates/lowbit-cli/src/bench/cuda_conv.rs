//! CUDA `lowbit bench --op conv`: [`Conv2dCuda`] against cuDNN's fp16 convolution on the same problems, in the
//! same run.
//!
//! Implementations (records' `impl`): `lowbit` (int4 or int8 `--wbits`, blocks of `--group` input channels where
//! that divides Ci, else one per output channel; f16 input and output unless `--dtype f32`), and `cudnn_fp16`
//! (cuDNN through cudarc on the dequantized weight in f16, NCHW, fp32 accumulation, tensor-op math, the fastest of
//! every forward algorithm cuDNN runs for the problem, found by timing each after a warm-up). libcudnn is looked up on
//! the library path (on the device machine it is inside PyTorch's install); without it the `lowbit` records are
//! still produced and a line on stderr says why the baseline is missing.
//!
//! Default cases: the cuDNN table of shared/anchors.md, `1x256x56x56,k3s1p1`, `8x256x56x56,k3s1p1`,
//! `32x512x28x28,k3s1p1`, `8x1024x14x14,k1s1p0,co2048`; `--conv BxCxHxW,kKsSpP[,coN]` replaces them. Records carry
//! `conv` = `BxCxHxW,kKsSpP` and the GEMM view `M = B·OH·OW`, `K = Ci·Kh·Kw`, `N = Co`; `bytes` is input + output
//! + weight as each implementation stores it.
//!
//! Method (as bench/cuda.rs): random data (never zeros); the input/output pair is rotated among as many copies as
//! it takes to exceed 4 × L2; a warm-up, then 7 batches of ~20 ms of back-to-back launches between CUDA events;
//! the median batch is reported. Before timing, lowbit's output is compared with cuDNN's (same dequantized
//! weights) and the mean relative difference is printed on stderr, with a warning above 1e-2.
//!
//! Each implementation is timed twice: launched back to back (`lowbit`, `cudnn_fp16`), and replayed from a CUDA
//! graph of 16 calls (`lowbit_graph`, `cudnn_fp16_graph`). The graph figure is the GPU time alone: cuDNN's legacy
//! API spends about 0.14 ms of host time per call on the device machine (its eager time did not drop below that
//! for any size on the H200), so its eager figure is a host-bound floor for small convolutions. If cuDNN refuses
//! the stream capture, its graph record is left out with a line on stderr.
//!
//! The full-int8 convolution (`ConvInt8Cuda`: int8 input and output with zero points, the case's weight requantized
//! to int8 per output channel) is timed on the same geometry as `lowbit_int8` / `lowbit_int8_graph` (dtype `i8`),
//! and with its dp4a kernel forced as `lowbit_int8_direct`.
//!
//! A 1×1 convolution of a 1×1 map at batch ≤ 16 runs on the decode kernel (`Conv2dCuda::uses_gemv`); it is also
//! timed on the route it replaced, `lowbit_gemm` / `lowbit_gemm_graph`.
//!
//! `LOWBIT_BENCH_VARIANTS=1` adds a record per implicit-GEMM tile forced (`lowbit_128x128`, ...), for tuning the
//! tile choice.

use super::super::cpu::ConvCase;
use super::{graph_replay_us, median, median_of_batches, rotation, timed, BenchArgs, BenchRecord, Shape, Sink};
use half::f16;
use lowbit::cuda::{CudaDevice, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::cuda::{cudnn_present, Conv2dCuda, CudnnConv, Tile, Tuning};
use lowbit::ops::conv::Conv2dParams;
use lowbit::ops::conv_int8::{ConvInt8Cuda, ConvInt8Params, Int8Quant};
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, Float, Result};
use std::sync::Arc;

/// Launches per timed probe when choosing cuDNN's algorithm.
const PROBE_LAUNCHES: usize = 10;

/// Calls captured per CUDA graph (cycling through the rotation sets).
const GRAPH_CALLS: usize = 16;

/// The cuDNN fp16 table of shared/anchors.md.
const DEFAULT_CONVS: [&str; 4] = [
    "1x256x56x56,k3s1p1",
    "8x256x56x56,k3s1p1",
    "32x512x28x28,k3s1p1",
    "8x1024x14x14,k1s1p0,co2048",
];

/// Benchmarks the conv op on the GPU `args.device` names.
pub fn run(args: &BenchArgs, sink: &mut Sink) -> Result<()> {
    let dev = args.cuda_device()?;
    let specs: Vec<String> = if args.conv.is_empty() {
        DEFAULT_CONVS.iter().map(|s| s.to_string()).collect()
    } else {
        args.conv.clone()
    };
    let cases: Vec<ConvCase> = specs.iter().map(|s| ConvCase::parse(s)).collect::<Result<_>>()?;
    let dtypes = args.dtypes(&[DType::F16])?;
    let variants = std::env::var("LOWBIT_BENCH_VARIANTS").is_ok_and(|v| v == "1");
    let mut cudnn_ok = cudnn_present();
    if !cudnn_ok {
        eprintln!("lowbit bench: libcudnn not found on the library path; no cudnn_fp16 baseline");
    }
    let per_case = 2 * (dtypes.len() + usize::from(cudnn_ok)) + 3 + if variants { Tile::ALL.len() } else { 0 };
    sink.expect(cases.len() * per_case);
    for case in &cases {
        let problem = Problem::new(&dev, args, case)?;
        let mut cudnn_out = None;
        if cudnn_ok {
            sink.status(format!("conv cudnn_fp16 {}", case.label));
            // cudarc panics when a cuDNN symbol is missing (an old libcudnn): report it and go on without.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| problem.time_cudnn())) {
                Ok(result) => {
                    let (timing, out) = result?;
                    sink.push(problem.record("cudnn_fp16", DType::F16, timing.eager, problem.dense_bytes()))?;
                    if let Some(us) = timing.graph {
                        sink.push(problem.record("cudnn_fp16_graph", DType::F16, us, problem.dense_bytes()))?;
                    }
                    cudnn_out = Some(out);
                }
                Err(_) => {
                    eprintln!("lowbit bench: cuDNN failed (see the panic above); no further cudnn_fp16 records");
                    cudnn_ok = false;
                }
            }
        }
        for &dtype in &dtypes {
            sink.status(format!("conv lowbit {} {dtype}", case.label));
            let timing = match dtype {
                DType::F16 => problem.time_lowbit::<f16>(Tuning::default(), cudnn_out.as_deref(), true)?,
                DType::F32 => problem.time_lowbit::<f32>(Tuning::default(), None, true)?,
                other => return Err(Error::invalid("--dtype", other, "CUDA conv takes f16 or f32")),
            };
            sink.push(problem.lowbit_record("lowbit", dtype, timing.eager))?;
            if let Some(us) = timing.graph {
                sink.push(problem.lowbit_record("lowbit_graph", dtype, us))?;
            }
            if dtype == DType::F16 && problem.uses_gemv()? {
                // The route the decode kernel replaced for this 1x1 convolution (the Hopper GEMM on sm_90).
                sink.status(format!("conv lowbit_gemm {}", case.label));
                let tuning = Tuning {
                    no_gemv: true,
                    ..Tuning::default()
                };
                let timing = problem.time_lowbit::<f16>(tuning, None, true)?;
                sink.push(problem.lowbit_record("lowbit_gemm", dtype, timing.eager))?;
                if let Some(us) = timing.graph {
                    sink.push(problem.lowbit_record("lowbit_gemm_graph", dtype, us))?;
                }
            }
            if dtype == DType::F16 && problem.uses_hopper()? {
                // The mma.sync implicit GEMM the Hopper path replaced, for comparison.
                sink.status(format!("conv lowbit_mmasync {}", case.label));
                let tuning = Tuning {
                    no_hopper: true,
                    ..Tuning::default()
                };
                let timing = problem.time_lowbit::<f16>(tuning, None, false)?;
                sink.push(problem.lowbit_record("lowbit_mmasync", dtype, timing.eager))?;
            }
        }
        sink.status(format!("conv lowbit_int8 {}", case.label));
        let timing = problem.time_int8(false)?;
        sink.push(problem.int8_record("lowbit_int8", timing.eager))?;
        if let Some(us) = timing.graph {
            sink.push(problem.int8_record("lowbit_int8_graph", us))?;
        }
        let timing = problem.time_int8(true)?;
        sink.push(problem.int8_record("lowbit_int8_direct", timing.eager))?;
        if variants {
            for tile in Tile::ALL {
                sink.status(format!("conv lowbit {} {}", tile.name(), case.label));
                let tuning = Tuning {
                    tile: Some(tile),
                    ..Tuning::default()
                };
                let timing = problem.time_lowbit::<f16>(tuning, None, false)?;
                sink.push(problem.lowbit_record(&format!("lowbit_{}", tile.name()), DType::F16, timing.eager))?;
            }
        }
    }
    Ok(())
}

/// Median µs per call: launched back to back, and replayed from a CUDA graph (where timed).
struct Timing {
    eager: f64,
    graph: Option<f64>,
}

/// One convolution with its random data on the device.
struct Problem<'a> {
    dev: &'a Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    case: &'a ConvCase,
    params: Conv2dParams,
    weight: BlockQuantWeight,
    wbits: u8,
    /// `[B, Co, OH, OW]`.
    output: [usize; 4],
    /// The input in f32 (values exact in f16).
    x: Vec<f32>,
    /// Input/output copies rotated per launch.
    sets: usize,
}

impl<'a> Problem<'a> {
    fn new(dev: &'a Arc<CudaDevice>, args: &BenchArgs, case: &'a ConvCase) -> Result<Self> {
        let [b, ci, h, w] = case.input;
        let (co, kk) = (case.co, case.kernel);
        let params = Conv2dParams {
            stride: (case.stride, case.stride),
            padding: (case.padding, case.padding),
            ..Conv2dParams::default()
        };
        let blocks = match args.group {
            g if g > 0 && ci % g as usize == 0 => ci / g as usize,
            _ => 1,
        };
        let bits = match args.wbits {
            4 => BlockBits::Int4,
            8 => BlockBits::Int8,
            other => return Err(Error::invalid("--wbits", other, "must be 4 or 8")),
        };
        let mut rng = SplitMix64(0xC0DE ^ (ci * 31 + co) as u64);
        let dense: Vec<f32> = (0..co * ci * kk * kk).map(|_| rng.signed_unit() * 0.05).collect();
        let weight = BlockQuantWeight::quantize(&dense, BlockShape::conv(co, ci, (kk, kk), blocks)?, bits)?;
        let x: Vec<f32> = (0..b * ci * h * w)
            .map(|_| f16::from_f32(rng.signed_unit()).to_f32())
            .collect();
        let output = lowbit::ops::conv::ConvGeometry::new(case.input, weight.shape(), &params)?.output;
        let io_bytes = (x.len() + output.iter().product::<usize>()) * 2;
        Ok(Self {
            dev,
            stream: dev.stream().clone(),
            case,
            params,
            weight,
            wbits: args.wbits,
            output,
            x,
            sets: rotation(dev, io_bytes),
        })
    }

    /// Whether the default operator for this case runs the Hopper wgmma path.
    fn uses_hopper(&self) -> Result<bool> {
        let conv = Conv2dCuda::new(self.dev, &self.weight, None, self.params)?;
        Ok(conv.uses_hopper())
    }

    fn uses_gemv(&self) -> Result<bool> {
        let conv = Conv2dCuda::new(self.dev, &self.weight, None, self.params)?;
        conv.uses_gemv(self.case.input)
    }

    /// The GEMM view: `M = B·OH·OW`, `K = Ci·Kh·Kw`, `N = Co`.
    fn shape(&self) -> Shape {
        let [b, _, oh, ow] = self.output;
        Shape {
            m: b * oh * ow,
            k: self.weight.shape().cols(),
            n: self.case.co,
        }
    }

    fn io_bytes(&self, dtype: DType) -> u64 {
        ((self.x.len() + self.output.iter().product::<usize>()) * dtype.size()) as u64
    }

    /// Bytes of the f16 run with a dense f16 weight.
    fn dense_bytes(&self) -> u64 {
        self.io_bytes(DType::F16) + 2 * self.weight.codes().len() as u64
    }

    fn record(&self, implementation: &str, dtype: DType, us: f64, bytes: u64) -> BenchRecord {
        let mut r = BenchRecord::new(
            "conv",
            implementation,
            &self.dev.info().name,
            dtype,
            self.shape(),
            bytes,
            us,
        );
        r.conv = Some(self.case.label.clone());
        r
    }

    fn lowbit_record(&self, implementation: &str, dtype: DType, us: f64) -> BenchRecord {
        let shape = self.weight.shape();
        let weight_bytes = self.weight.codes().len() * self.wbits as usize / 8 + 8 * shape.rows * shape.blocks();
        let mut r = self.record(implementation, dtype, us, self.io_bytes(dtype) + weight_bytes as u64);
        r.wbits = Some(self.wbits);
        r.group = Some(if shape.blocks() == 1 {
            -1
        } else {
            shape.block_channels as i64
        });
        r
    }

    /// Input and output buffers, one pair per rotation slot.
    fn buffers<T: Float + DeviceRepr + ValidAsZeroBits>(&self) -> Result<Vec<(CudaSlice<T>, CudaSlice<T>)>> {
        let x: Vec<T> = self.x.iter().map(|&v| T::from_f32(v)).collect();
        (0..self.sets)
            .map(|_| {
                Ok((
                    self.dev.upload(&x)?,
                    self.dev.alloc_zeros::<T>(self.output.iter().product())?,
                ))
            })
            .collect()
    }

    /// Median µs per launch of `launch(set)` (see `median_of_batches`).
    fn median_us(&self, launch: impl FnMut(usize) -> Result<()>) -> Result<f64> {
        median_of_batches(self.dev, &self.stream, self.sets, launch)
    }

    /// Median µs per call of `launch(set)` replayed from a CUDA graph of `GRAPH_CALLS` calls cycling through the
    /// sets, or `None` (with a line on stderr) when the calls cannot be captured.
    fn median_graph_us(&self, what: &str, launch: impl FnMut(usize) -> Result<()>) -> Result<Option<f64>> {
        match graph_replay_us(self.dev, &self.stream, self.sets, GRAPH_CALLS, launch) {
            Ok(us) => Ok(Some(us)),
            Err(e) => {
                eprintln!("conv {}: {what} not timed from a CUDA graph: {e}", self.case.label);
                self.dev.synchronize()?;
                Ok(None)
            }
        }
    }

    /// Times lowbit with activations `T` (from a graph too when `graph`); when `check` holds cuDNN's output (f16),
    /// compares with it first.
    fn time_lowbit<T: Float + DeviceRepr + ValidAsZeroBits>(
        &self,
        tuning: Tuning,
        check: Option<&[f16]>,
        graph: bool,
    ) -> Result<Timing> {
        let conv = Conv2dCuda::with_tuning(self.dev, &self.weight, None, self.params, tuning)?;
        let mut ws = self
            .dev
            .alloc_zeros::<u8>(conv.workspace_bytes(self.case.input)?.max(1))?;
        let mut data = self.buffers::<T>()?;
        if let Some(want) = check {
            let (x, y) = &mut data[0];
            conv.run(&self.stream, &*x, self.case.input, y, &mut ws)?;
            let got = self.dev.download(&*y)?;
            let (diff, norm) = got.iter().zip(want).fold((0f64, 0f64), |(d, n), (g, w)| {
                let (g, w) = (g.to_f32() as f64, w.to_f32() as f64);
                (d + (g - w).abs(), n + w.abs())
            });
            let rel = diff / norm.max(f64::MIN_POSITIVE);
            eprintln!(
                "conv {}: lowbit vs cudnn_fp16 mean relative difference {rel:.2e}",
                self.case.label
            );
            if rel.is_nan() || rel > 1e-2 {
                eprintln!(
                    "conv {}: WARNING lowbit's output does not match cuDNN's (tests will say why)",
                    self.case.label
                );
            }
        }
        let mut launch = |i: usize| {
            let (x, y) = &mut data[i];
            conv.run(&self.stream, &*x, self.case.input, y, &mut ws)
        };
        let eager = self.median_us(&mut launch)?;
        let graph = if graph {
            self.median_graph_us("lowbit", &mut launch)?
        } else {
            None
        };
        Ok(Timing { eager, graph })
    }

    /// A record of the full-int8 convolution (int8 in and out, int8 per-channel weights).
    fn int8_record(&self, implementation: &str, us: f64) -> BenchRecord {
        let bytes = self.x.len() + self.output.iter().product::<usize>() + self.weight.codes().len();
        let mut r = self.record(implementation, DType::I8, us, bytes as u64);
        r.wbits = Some(8);
        r.group = Some(-1);
        r
    }

    /// Times the full-int8 convolution (`ConvInt8Cuda`) on this geometry: int8 input and output with zero points,
    /// the case's weight requantized to int8 symmetric per output channel; `direct` forces the dp4a kernel (then
    /// launched back to back only).
    fn time_int8(&self, direct: bool) -> Result<Timing> {
        let shape = BlockShape::conv(
            self.case.co,
            self.case.input[1],
            (self.case.kernel, self.case.kernel),
            1,
        )?;
        let dense = self.weight.dequantize();
        let (mut codes, mut scales) = (Vec::with_capacity(dense.len()), Vec::with_capacity(shape.rows));
        for row in dense.chunks_exact(shape.cols()) {
            let scale = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE) / 127.0;
            codes.extend(row.iter().map(|v| (v / scale).round().clamp(-127.0, 127.0) as i8));
            scales.push(scale);
        }
        let weight = BlockQuantWeight::from_parts(shape, BlockBits::Int8, codes, scales, vec![0.0; shape.rows])?;
        let params = ConvInt8Params {
            conv: self.params,
            input: Int8Quant {
                scale: 1.0 / 127.0,
                zero_point: 3,
            },
            output: Int8Quant {
                scale: 0.05,
                zero_point: -2,
            },
        };
        let conv = ConvInt8Cuda::with_route(self.dev, &weight, None, params, direct)?;
        let mut ws = self
            .dev
            .alloc_zeros::<u8>(conv.workspace_bytes(self.case.input)?.max(1))?;
        let x: Vec<i8> = self
            .x
            .iter()
            .map(|&v| (v * 127.0).round().clamp(-128.0, 127.0) as i8)
            .collect();
        let mut data: Vec<(CudaSlice<i8>, CudaSlice<i8>)> = (0..self.sets)
            .map(|_| {
                Ok((
                    self.dev.upload(&x)?,
                    self.dev.alloc_zeros::<i8>(self.output.iter().product())?,
                ))
            })
            .collect::<Result<_>>()?;
        let mut launch = |i: usize| {
            let (x, y) = &mut data[i];
            conv.run(&self.stream, &*x, self.case.input, y, &mut ws)
        };
        let eager = self.median_us(&mut launch)?;
        let graph = if direct {
            None
        } else {
            self.median_graph_us("lowbit_int8", &mut launch)?
        };
        Ok(Timing { eager, graph })
    }

    /// Times cuDNN's fastest forward algorithm on the dequantized weight in f16; returns the timing and its output.
    fn time_cudnn(&self) -> Result<(Timing, Vec<f16>)> {
        let cudnn = CudnnConv::new(self.stream.clone(), self.case.input, self.weight.shape(), &self.params)?;
        let dense: Vec<f16> = self.weight.dequantize().into_iter().map(f16::from_f32).collect();
        let w = self.dev.upload(&dense)?;
        let mut data = self.buffers::<f16>()?;
        // Every algorithm cuDNN runs here (workspace up to 1 GiB), warmed up, then timed three times over
        // PROBE_LAUNCHES launches; the one with the lowest median probe is measured. (One cold probe of 3 launches
        // picked 300-400 us algorithms over a ~22 us one.)
        let mut best: Option<(f64, _, CudaSlice<u8>)> = None;
        for algo in CudnnConv::ALGORITHMS {
            let Some(bytes) = cudnn.workspace_bytes(algo).filter(|&b| b <= 1 << 30) else {
                continue;
            };
            let mut ws = self.dev.alloc_zeros::<u8>(bytes.max(1))?;
            let (x, y) = &mut data[0];
            if cudnn.run(algo, x, &w, y, &mut ws).is_err() {
                continue;
            }
            let mut launch = |i: usize| {
                let (x, y) = &mut data[i];
                cudnn.run(algo, x, &w, y, &mut ws)
            };
            timed(self.dev, &self.stream, 3, self.sets, &mut launch)?;
            let probes = (0..3)
                .map(|_| timed(self.dev, &self.stream, PROBE_LAUNCHES, self.sets, &mut launch))
                .collect::<Result<Vec<f64>>>()?;
            let probe = median(probes);
            if best.as_ref().map_or(true, |(t, _, _)| probe < *t) {
                best = Some((probe, algo, ws));
            }
        }
        let (_, algo, mut ws) = best.ok_or_else(|| Error::Cuda {
            context: "cudnnConvolutionForward".into(),
            message: format!("no forward algorithm runs {}", self.case.label),
        })?;
        eprintln!("conv {}: cuDNN algorithm {algo:?}", self.case.label);
        let mut launch = |i: usize| {
            let (x, y) = &mut data[i];
            cudnn.run(algo, x, &w, y, &mut ws)
        };
        let eager = self.median_us(&mut launch)?;
        let graph = self.median_graph_us("cudnn_fp16", &mut launch)?;
        let out = self.dev.download(&data[0].1)?;
        Ok((Timing { eager, graph }, out))
    }
}
