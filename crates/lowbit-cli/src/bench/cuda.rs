//! CUDA side of `lowbit bench`.
//!
//! - `dequant`: [`DequantizeInt4`] (AWQ layout, impl `lowbit`; `--wbits 8`: [`DequantizeInt8`]) against a
//!   device-to-device copy of half the bytes it moves (impl `memcpy`, so the copy reads and writes the same total).
//!   Default shapes: K × N = 4096 × 4096, 4096 × 14336, 14336 × 4096, 8192 × 28672 (records have `M = 0`).
//!
//! Method: random inputs (never zeros), rotated among as many copies as it takes to exceed 4 × L2, so every launch
//! reads from device memory; a warm-up; then 7 batches, each timing the kernel and then the copy with CUDA events
//! around ~20 ms of back-to-back launches; the median batch is reported.
//!
//! `LOWBIT_BENCH_VARIANTS=1` adds records for every AWQ kernel variant (`lowbit_r2`, `lowbit_r4`, `lowbit_r8`: one tile of 2 / 4 / 8
//! rows per thread; `lowbit_p8`: persistent and pipelined), the
//! GPTQ and compressed-tensors kernels (`lowbit_gptq`, `lowbit_gptq_r8`, `lowbit_ct`) at the same shape, and
//! `memset_out` (the output bytes written alone: the write-only ceiling), for tuning.

use super::{BenchArgs, BenchRecord, Shape, Sink};
use half::{bf16, f16};
use lowbit::cuda::{
    capture_graph, copy_device, CudaDevice, CudaSlice, CudaStream, DeviceRepr, StreamTimer, ValidAsZeroBits,
};
use lowbit::ops::dequantize::cuda::{DequantDesc, DequantizeInt4, DequantizeInt8, Int4Layout, Int4Weight};
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, Float, Result};
use std::sync::Arc;

/// The dequant shapes of the speed target (K, N).
const DEQUANT_SHAPES: [(usize, usize); 4] = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)];
const BATCHES: usize = 7;
/// Target duration of one timed batch.
const BATCH_MS: f64 = 20.0;
/// Timed rounds of [`Rounds`] (after an untimed one) and the target duration of one launcher's batch in a round,
/// unless `LOWBIT_BENCH_TURNS=ROUNDSxMS` (for example `25x2`) sets them: by default the same batches as
/// [`median_of_batches`], the method of every committed record.
const TURN_ROUNDS: usize = BATCHES;
const TURN_BATCH_MS: f64 = BATCH_MS;

/// The rounds and batch duration of [`Rounds`]: `LOWBIT_BENCH_TURNS`, or the defaults.
fn turns() -> Result<(usize, f64)> {
    match std::env::var("LOWBIT_BENCH_TURNS") {
        Ok(v) => parse_turns(&v),
        Err(_) => Ok((TURN_ROUNDS, TURN_BATCH_MS)),
    }
}

/// `ROUNDSxMS` as (rounds, batch ms).
fn parse_turns(v: &str) -> Result<(usize, f64)> {
    let parsed = v
        .split_once('x')
        .and_then(|(r, ms)| Some((r.parse::<usize>().ok()?, ms.parse::<f64>().ok()?)));
    match parsed {
        Some((rounds, ms)) if (1..=1000).contains(&rounds) && (0.1..=1000.0).contains(&ms) => Ok((rounds, ms)),
        _ => Err(Error::invalid(
            "LOWBIT_BENCH_TURNS",
            v,
            "must be ROUNDSxMS: 1 to 1000 rounds of batches of 0.1 to 1000 ms",
        )),
    }
}

#[path = "cuda_conv.rs"]
mod conv;
#[path = "cuda_linear.rs"]
mod linear;
#[path = "cuda_w8a8.rs"]
mod w8a8;

/// Benchmarks every op CUDA has that `args` asks for.
pub fn run(args: &BenchArgs, sink: &mut Sink) -> Result<()> {
    match args.op.as_deref() {
        Some("linear") => return linear::run(args, sink),
        Some("w8a8") => return w8a8::run(args, sink),
        Some("conv") => return conv::run(args, sink),
        _ => {}
    }
    if let Some(op) = args.op.as_deref().filter(|op| *op != "dequant") {
        return Err(Error::Unsupported(format!(
            "bench --op {op} on CUDA (CUDA benches: dequant, linear, w8a8, conv)"
        )));
    }
    let dev = args.cuda_device()?;
    let shapes: Vec<(usize, usize)> = if args.shape.is_empty() {
        DEQUANT_SHAPES.to_vec()
    } else {
        let mut v: Vec<(usize, usize)> = args.shapes()?.iter().map(|s| (s.k, s.n)).collect();
        v.dedup();
        v
    };
    let dtypes = args.dtypes(&[DType::F16])?;
    let variants = std::env::var("LOWBIT_BENCH_VARIANTS").is_ok_and(|v| v == "1");
    let impls = if variants && args.wbits == 4 { 10 } else { 2 };
    sink.expect(shapes.len() * dtypes.len() * impls);
    for &(k, n) in &shapes {
        for &dtype in &dtypes {
            match dtype {
                DType::F16 => bench_dequant::<f16>(&dev, args, k, n, variants, sink)?,
                DType::Bf16 => bench_dequant::<bf16>(&dev, args, k, n, variants, sink)?,
                other => return Err(Error::invalid("--dtype", other, "CUDA dequant writes f16 or bf16")),
            }
        }
    }
    Ok(())
}

/// One input set (weights + output) per rotation slot.
struct Set<T> {
    qweight: CudaSlice<i32>,
    zeros: Option<CudaSlice<i32>>,
    scales: CudaSlice<T>,
    out: CudaSlice<T>,
}

fn bench_dequant<T: Float + DeviceRepr + ValidAsZeroBits>(
    dev: &Arc<CudaDevice>,
    args: &BenchArgs,
    k: usize,
    n: usize,
    variants: bool,
    sink: &mut Sink,
) -> Result<()> {
    let group = args.group_for(k)?;
    let stream = dev.stream().clone();
    let name = dev.info().name.clone();
    let dtype = T::DTYPE;
    let mut rng = SplitMix64(0x5EED ^ (k * 31 + n) as u64);
    let record = |implementation: &str, bytes: usize, us: f64| {
        let mut r = BenchRecord::new(
            "dequant",
            implementation,
            &name,
            dtype,
            Shape { m: 0, k, n },
            bytes as u64,
            us,
        );
        r.wbits = Some(args.wbits);
        r.group = Some(if group == k { -1 } else { group as i64 });
        r
    };

    if args.wbits == 8 {
        sink.status(format!("dequant int8 {k}x{n} {dtype}"));
        let op = DequantizeInt8::new(dev, k, n, dtype)?;
        let bytes = op.bytes();
        let sets = rotation(dev, bytes);
        let weight: Vec<i8> = (0..k * n).map(|_| rng.next_u64() as i8).collect();
        let scales: Vec<T> = (0..n).map(|_| T::from_f32(random_scale(&mut rng))).collect();
        let mut data = Vec::new();
        for _ in 0..sets {
            data.push((dev.upload(&weight)?, dev.upload(&scales)?, dev.alloc_zeros::<T>(k * n)?));
        }
        let (ours, copy) = time_against_copy(dev, &stream, bytes, sets, |i| {
            let (w, s, o) = &mut data[i];
            op.run(&stream, &*w, &*s, o, None)
        })?;
        sink.push(record("lowbit", bytes, ours))?;
        sink.push(record("memcpy", bytes, copy))?;
        return Ok(());
    }

    let desc = |layout| DequantDesc {
        layout,
        k,
        n,
        group_size: group,
        zeros: !args.symmetric,
        g_idx: false,
        dtype,
    };
    let awq = desc(Int4Layout::Awq);
    let bytes = awq.bytes();
    let sets = rotation(dev, bytes);
    let (q_len, z_len, s_len, o_len) = awq.lens();
    // Random codes and zeros covering every nibble; scales of a realistic magnitude.
    let qweight: Vec<i32> = (0..q_len).map(|_| rng.next_u64() as i32).collect();
    let zeros: Vec<i32> = (0..z_len).map(|_| rng.next_u64() as i32).collect();
    let scales: Vec<T> = (0..s_len).map(|_| T::from_f32(random_scale(&mut rng))).collect();
    let mut data: Vec<Set<T>> = Vec::new();
    for _ in 0..sets {
        data.push(Set {
            qweight: dev.upload(&qweight)?,
            zeros: if awq.zeros { Some(dev.upload(&zeros)?) } else { None },
            scales: dev.upload(&scales)?,
            out: dev.alloc_zeros::<T>(o_len)?,
        });
    }
    // The same buffers hold a GPTQ or compressed-tensors weight of the same shape (equal element counts; scales
    // are transposed for compressed-tensors, which only changes which value is read).
    let mut runs: Vec<(String, DequantizeInt4)> = vec![("lowbit".into(), DequantizeInt4::new(dev, awq)?)];
    if variants {
        for v in ["r2", "r4", "r8", "p8"] {
            runs.push((format!("lowbit_{v}"), DequantizeInt4::with_variant(dev, awq, Some(v))?));
        }
        let gptq = desc(Int4Layout::Gptq);
        runs.push(("lowbit_gptq".into(), DequantizeInt4::new(dev, gptq)?));
        runs.push((
            "lowbit_gptq_p8".into(),
            DequantizeInt4::with_variant(dev, gptq, Some("p8"))?,
        ));
        runs.push((
            "lowbit_ct".into(),
            DequantizeInt4::new(dev, desc(Int4Layout::CompressedTensors))?,
        ));
    }
    for (i, (label, op)) in runs.iter().enumerate() {
        sink.status(format!("dequant {label} ({}) {k}x{n} {dtype}", op.kernel_name()));
        let (ours, copy) = time_against_copy(dev, &stream, bytes, sets, |i| {
            let s = &mut data[i];
            let weight = Int4Weight {
                qweight: &s.qweight,
                zeros: s.zeros.as_ref().map(|z| z as _),
                scales: &s.scales,
                g_idx: None,
            };
            op.run(&stream, &weight, &mut s.out, None)
        })?;
        sink.push(record(label, bytes, ours))?;
        if i == 0 {
            sink.push(record("memcpy", bytes, copy))?;
        }
    }
    if variants {
        // Diagnostic, not a baseline: writing the output bytes alone (memset), the write-only ceiling.
        let mut memset = |i: usize| -> Result<()> {
            stream.memset_zeros(&mut data[i].out).map_err(|e| Error::Cuda {
                context: "cuMemsetD8Async".into(),
                message: e.to_string(),
            })
        };
        let us = median_of_batches(dev, &stream, sets, &mut memset)?;
        sink.push(record("memset_out", o_len * dtype.size(), us))?;
    }
    Ok(())
}

/// How many copies of a working set of `bytes` it takes to exceed 4 × L2 (at least 2). Just over 2 × L2 left some
/// copies partly cached at mid sizes (the copy baseline moved by 14% with a 1% change of size).
fn rotation(dev: &CudaDevice, bytes: usize) -> usize {
    (4 * dev.info().l2_bytes / bytes.max(1) + 1).max(2)
}

/// Median µs per launch of `launch(set)` and of a device-to-device copy of `bytes / 2`, measured in alternating
/// batches with CUDA events, both rotating over `sets` buffers.
fn time_against_copy(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    bytes: usize,
    sets: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<(f64, f64)> {
    let half = bytes / 2;
    let mut copies: Vec<(CudaSlice<u8>, CudaSlice<u8>)> = Vec::new();
    let fill: Vec<u8> = (0..half).map(|i| (i * 131 % 251) as u8 + 1).collect();
    for _ in 0..sets {
        copies.push((dev.upload(&fill)?, dev.alloc_zeros::<u8>(half)?));
    }
    let mut copy = |i: usize| -> Result<()> {
        let (src, dst) = &mut copies[i];
        copy_device(stream, src, dst)
    };
    // Warm up both (module load, clocks), then size the batches from a rough timing.
    let probe_ours = timed(dev, stream, 20, sets, &mut launch)?;
    let probe_copy = timed(dev, stream, 20, sets, &mut copy)?;
    let reps = |us: f64| ((BATCH_MS * 1e3 / us.max(0.5)) as usize).clamp(10, 20_000);
    let (reps_ours, reps_copy) = (reps(probe_ours), reps(probe_copy));
    let mut ours = Vec::new();
    let mut copied = Vec::new();
    for _ in 0..BATCHES {
        ours.push(timed(dev, stream, reps_ours, sets, &mut launch)?);
        copied.push(timed(dev, stream, reps_copy, sets, &mut copy)?);
    }
    dev.synchronize()?;
    Ok((median(ours), median(copied)))
}

/// µs per call of `f` over `reps` calls rotating through `sets`, between two timing events.
fn timed(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    reps: usize,
    sets: usize,
    f: &mut impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let timer = StreamTimer::new(dev)?;
    batch(&timer, stream, reps, sets, f)?;
    Ok(timer.elapsed_ms()? * 1e3 / reps as f64)
}

/// `reps` calls of `f` rotating through `sets` between `timer`'s marks, without waiting for them.
fn batch(
    timer: &StreamTimer,
    stream: &CudaStream,
    reps: usize,
    sets: usize,
    f: &mut impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    timer.start(stream)?;
    for i in 0..reps {
        f(i % sets)?;
    }
    timer.stop(stream)
}

/// Median µs per call of `launch(set)` rotating through `sets`: a warm-up, then `BATCHES` batches of ~`BATCH_MS`
/// between CUDA events.
fn median_of_batches(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    sets: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let probe = timed(dev, stream, 5, sets, &mut launch)?; // warm-up: module load, clocks
    let reps = ((BATCH_MS * 1e3 / probe.max(0.5)) as usize).clamp(5, 20_000);
    let samples = (0..BATCHES)
        .map(|_| timed(dev, stream, reps, sets, &mut launch))
        .collect::<Result<Vec<_>>>()?;
    dev.synchronize()?;
    Ok(median(samples))
}

/// Launchers timed in turn, so that every one of them runs at the same clocks.
///
/// Under sustained tensor-core load the H200 leaves its 1980 MHz boost for ~1500 MHz (its power cap) within
/// ~100 ms (`docs/notes/w4a16-gemm.md`, "Timing in turn"). Timed one after the other, the launcher timed first (the
/// baseline) ran partly at the boost clock and those after it did not. Here one untimed round brings the GPU to the
/// state it then stays in, and each of the [`TURN_ROUNDS`] rounds times one batch of ~[`TURN_BATCH_MS`] of every
/// launcher, in an order shuffled anew each round (fixed seeds). A rotation of one order kept each launcher's
/// predecessor: QuantLinear, always after dequantize + cuBLAS, read 1-5% above the same GEMM forced, which always
/// followed cuBLAS. The batches of a round run back to back on the stream, their events read after it, so the GPU
/// never idles between launchers.
///
/// No batch length is neutral (notes, "Turns of 2 ms"): with ~20 ms a launcher still starts at the clock its
/// predecessor's power left (QuantLinear and the GEMM it dispatches to, two launchers of one kernel, read up to 5%
/// apart at M ≥ 1024); with ~2 ms (`LOWBIT_BENCH_TURNS=25x2`) they agree within 2%, but every launcher runs at
/// the clock of the round's mix, so a baseline timed beside a kernel that draws more power is slowed by it.
pub(super) struct Rounds<'a> {
    entries: Vec<(usize, Launcher<'a>)>,
}

/// `launch(set)`: one call on rotation set `set`.
type Launcher<'a> = Box<dyn FnMut(usize) -> Result<()> + 'a>;

impl<'a> Rounds<'a> {
    pub(super) fn new() -> Self {
        Self { entries: Vec::new() }
    }

    /// Adds `launch(set)`, rotating through `sets`; returns its index in [`Rounds::run`]'s result.
    pub(super) fn add(&mut self, sets: usize, launch: impl FnMut(usize) -> Result<()> + 'a) -> usize {
        self.entries.push((sets, Box::new(launch)));
        self.entries.len() - 1
    }

    /// Median µs per call of each launcher, in the order they were added.
    pub(super) fn run(mut self, dev: &CudaDevice, stream: &Arc<CudaStream>) -> Result<Vec<f64>> {
        let (rounds, batch_ms) = turns()?;
        let mut reps = Vec::with_capacity(self.entries.len());
        for (sets, launch) in &mut self.entries {
            let probe = timed(dev, stream, 5, *sets, launch)?; // module load, and a batch size
            reps.push(((batch_ms * 1e3 / probe.max(0.5)) as usize).clamp(1, 20_000));
        }
        let n = self.entries.len();
        let timers = (0..n).map(|_| StreamTimer::new(dev)).collect::<Result<Vec<_>>>()?;
        let mut samples = vec![Vec::with_capacity(rounds); n];
        let mut order: Vec<usize> = (0..n).collect();
        for round in 0..=rounds {
            let mut rng = SplitMix64(0x0DE5 + round as u64);
            for j in (1..n).rev() {
                order.swap(j, rng.below(j as u64 + 1) as usize);
            }
            for &e in &order {
                let (sets, launch) = &mut self.entries[e];
                batch(&timers[e], stream, reps[e], *sets, launch)?;
            }
            for ((timer, reps), samples) in timers.iter().zip(&reps).zip(&mut samples) {
                let us = timer.elapsed_ms()? * 1e3 / *reps as f64;
                if round > 0 {
                    samples.push(us);
                }
            }
        }
        dev.synchronize()?;
        Ok(samples.into_iter().map(median).collect())
    }
}

/// Median µs per call of `launch(set)` run alone under sustained load: [`SUSTAINED_WARMUP_MS`] of calls untimed, then
/// [`SUSTAINED_MS`] of ~[`SUSTAINED_WINDOW_MS`] windows between CUDA events.
///
/// At large M the GEMMs are held by the H200's power cap, and the clock the cap leaves depends on the kernel's own
/// power: run alone for seconds, the W4A16 GEMM held ~1455 MHz and cuBLAS ~1380 MHz at 700 W on 4096 × 8192 × 28672
/// (`examples/sustained_clock`). Timed in turn ([`Rounds`]), a launcher runs at a clock its neighbours' power
/// sets. These records are what a prefill that keeps the GPU busy with this one kernel sees.
pub(super) fn sustained_us(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    sets: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let probe = timed(dev, stream, 3, sets, &mut launch)?;
    let reps = |ms: f64| ((ms * 1e3 / probe.max(0.5)) as usize).max(1);
    timed(dev, stream, reps(SUSTAINED_WARMUP_MS), sets, &mut launch)?;
    let windows = (SUSTAINED_MS / SUSTAINED_WINDOW_MS) as usize;
    let samples = (0..windows)
        .map(|_| timed(dev, stream, reps(SUSTAINED_WINDOW_MS), sets, &mut launch))
        .collect::<Result<Vec<_>>>()?;
    Ok(median(samples))
}

/// Untimed load before a sustained measurement: the power cap settles within ~0.2 s (`sustained_us`).
const SUSTAINED_WARMUP_MS: f64 = 500.0;
/// Timed load of a sustained measurement.
const SUSTAINED_MS: f64 = 1000.0;
const SUSTAINED_WINDOW_MS: f64 = 100.0;

/// Median µs per call of `launch(set)` replayed from a CUDA graph of `calls` calls cycling through the sets (no
/// launch gaps). Fails when the calls cannot be captured.
fn graph_replay_us(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    sets: usize,
    calls: usize,
    mut launch: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    dev.synchronize()?;
    let graph = capture_graph(stream, || (0..calls).try_for_each(|c| launch(c % sets)))?;
    let replay = median_of_batches(dev, stream, 1, |_| {
        graph.launch().map_err(|e| Error::Cuda {
            context: "cuGraphLaunch".into(),
            message: format!("{e:?}"),
        })
    })?;
    Ok(replay / calls as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A random scale in [2^-10, 2^-6): products stay well inside fp16 range.
fn random_scale(rng: &mut SplitMix64) -> f32 {
    2f32.powf(rng.uniform(-10.0, -6.0))
}

#[cfg(test)]
mod tests {
    use super::parse_turns;

    #[test]
    fn turns_knob() {
        assert_eq!(parse_turns("25x2").unwrap(), (25, 2.0));
        assert_eq!(parse_turns("7x20").unwrap(), (7, 20.0));
        assert_eq!(parse_turns("3x0.5").unwrap(), (3, 0.5));
        for bad in ["25", "x2", "25x", "0x2", "25x0", "2.5x2", "25x2x3", "-1x2", "25xnan"] {
            let err = parse_turns(bad).unwrap_err().to_string();
            assert!(err.contains("LOWBIT_BENCH_TURNS") && err.contains(bad), "{err}");
        }
    }
}
