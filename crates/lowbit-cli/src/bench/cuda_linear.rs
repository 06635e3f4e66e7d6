//! CUDA `lowbit bench --op linear`: [`QuantLinear`] and each of its kernels against cuBLAS, in the same run.
//!
//! Implementations (records' `impl`): `lowbit` ([`QuantLinear::run`] with its measured dispatch, launches back to
//! back), `lowbit_graph` (the same calls captured once into a CUDA graph and replayed: no launch gaps; M <= 64),
//! `lowbit_decode` / `lowbit_gemm` / `lowbit_dequant_cublas` (QuantLinear with that kernel forced, where it
//! applies), `lowbit_decode_planes` / `lowbit_gemm_planes` (8-bit weights with f16: the decode kernel at M <= 64
//! and the GEMM at M >= 64 on two int4 planes, `repack`, where QuantLinear reads the int8 layout, `repack_int8`),
//! and the baselines `cublas_fp16` / `cublas_bf16` (dense `x · W^T` with the unquantized weight, fp32 accumulation,
//! cublasGemmEx with the device's 32 MiB cuBLAS workspace) and `cublaslt_fp16` / `cublaslt_bf16` (the same product
//! through cuBLASLt, planned for each M). Ratios are taken against the faster of the two.
//! `--dispatch FILE` writes the fastest kernel per shape and M of this run as QuantLinear's dispatch table.
//!
//! Default problem: K × N ∈ {4096 × 4096, 4096 × 14336, 14336 × 4096, 8192 × 28672} × M ∈ {1, 4, 16, 64, 256,
//! 1024, 4096}, group `--group` (128), zero points unless `--symmetric`, f16 unless `--dtype`. Every weight (and,
//! for cuBLAS, every dense weight) is rotated among as many copies as it takes to exceed 2 × L2, so each launch
//! reads device memory. Timing: the launchers of one M take turns (`Rounds`): an untimed round, then 7 rounds of
//! one ~20 ms batch of launches each between CUDA events, back to back, so all of them run at the same clocks; the
//! median batch is reported (`LOWBIT_BENCH_TURNS=ROUNDSxMS` changes the rounds and the batch length). CUDA-graph
//! replays are timed after them, and from M = 256 on (every M with `LOWBIT_BENCH_SUSTAINED=all`) QuantLinear and
//! both baselines again, each alone under sustained load (`lowbit_sustained`, `cublas_fp16_sustained`,
//! `cublaslt_fp16_sustained`; see `sustained_us`). `bytes` is what the call must move at least: codes, scales and
//! zeros (or the dense weight), x and y.
//!
//! `LOWBIT_BENCH_VARIANTS=1` adds decode-kernel records with the grid forced to one (`lowbit_1sm`) or two
//! (`lowbit_2sm`) CTAs per SM; `LOWBIT_BENCH_CTAS=66,88` with exactly that many CTAs (`lowbit_c66`, ...),
//! `LOWBIT_BENCH_STAGES=3,4` with that pipeline depth (`lowbit_s3`, ...), `LOWBIT_BENCH_TMA=0` with the cp.async
//! pipeline instead of TMA (`lowbit_tma0`), `LOWBIT_BENCH_SPLITS=1,8` with cluster
//! split-K forced to that split count, 1 being stream-K (`lowbit_k1`, ...); `LOWBIT_BENCH_NO_PDL=1` with the decode
//! kernel launched without programmatic dependent launch (`lowbit_nopdl`); `LOWBIT_BENCH_GATHER=0,1` with GATHERED
//! TILES forced off or on (`lowbit_gather0`, ...), `LOWBIT_BENCH_PAIRED=0,1` with their two splits as clusters of two
//! CTAs (0) or in one CTA (1; `lowbit_paired0`, ...). Each also gets a graph record (`_graph`).
//! `LOWBIT_BENCH_NO_PDL=1` also times the GEMM without it (`lowbit_gemm_nopdl`, M >= 64 on sm_90), and
//! `LOWBIT_BENCH_STREAM=1` the GEMM with STREAM-K wherever its tiles allow it (`lowbit_gemm_stream`, M <= 1024),
//! `LOWBIT_BENCH_GEMM_STAGES=3,4` with at most that many pipeline stages in its 16- and 64-token tiles
//! (`lowbit_gemm_s3`, ...), `LOWBIT_BENCH_GEMM_RAMP=0,1` with at most that many stages in flight while its
//! pipeline first fills, 0 being all of them, on every tile (`lowbit_gemm_ramp0`, ...), `LOWBIT_BENCH_GEMM_LAG=0,1`
//! with the 64- and 128-token tiles' second consumer warpgroup that many k tiles behind (`lowbit_gemm_lag0`, ...),
//! `LOWBIT_BENCH_GEMM_KSPLIT=on,3,t128,t128x2,t128x2r1` on its K-split tile at every M > 16, split as the cost model
//! says or that many ways, on the tile of 64 or 128 tokens or as chosen, and with that RAMP (`lowbit_gemm_kson`,
//! `lowbit_gemm_ks3`, `lowbit_gemm_kst128`, ...; QuantLinear's own `lowbit_gemm_ksplit` is timed from M = 17 on),
//! `LOWBIT_BENCH_GEMM_LOOK=2,3` with its 16- and 64-token tiles, and its K-split tile forced, converting that many
//! k16 steps ahead of their wgmmas (`lowbit_gemm_look2`, `lowbit_gemm_kslook2`, ...).
//! `LOWBIT_BENCH_ACTIVATION=silu` builds QuantLinear's layers with that fused epilogue (records `lowbit_silu`, ...).

use super::{graph_replay_us, median_of_batches, sustained_us, BenchArgs, BenchRecord, Rounds, Shape, Sink};
use half::{bf16, f16};
use lowbit::cuda::Device;
use lowbit::cuda::{CudaDevice, CudaSlice, ValidAsZeroBits};
use lowbit::ops::linear::cuda::gemm::{supported, LinearW4A16Gemm};
use lowbit::ops::linear::cuda::{
    repack, repack_preferred, CublasLinear, CublasLtLinear, DenseElement, DeviceW4, LinearW4A16Cuda, Tuning,
};
use lowbit::ops::linear::quant_linear::DispatchEntry;
use lowbit::ops::linear::{Activation, DispatchTable, QuantLinear};
use lowbit::testing::SplitMix64;
use lowbit::{DType, Error, QuantMatrix, Result};
use std::cell::RefCell;
use std::sync::Arc;

/// The (K, N) shapes of the speed targets.
const SHAPES: [(usize, usize); 4] = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672)];
/// Batch sizes timed per shape.
const MS: [usize; 7] = [1, 4, 16, 64, 256, 1024, 4096];
/// Largest batch of the decode kernel.
const MAX_DECODE_M: usize = lowbit::ops::linear::cuda::MAX_M;
/// Calls captured per graph (cycling through the rotation sets).
const GRAPH_CALLS: usize = 32;
/// From this batch size on (compute-bound GEMMs, held by the power cap) the bench also times QuantLinear and the
/// baselines alone under sustained load (`_sustained` records; `LOWBIT_BENCH_SUSTAINED=0` leaves them out,
/// `LOWBIT_BENCH_SUSTAINED=all` adds them at every M: the decode kernel at 16 rows reaches the cap too).
const SUSTAINED_MIN_M: usize = 256;

/// The GEMM with one setting changed (a `LOWBIT_BENCH_*` knob), timed beside `lowbit_gemm` as `label` at the batch
/// sizes it `takes`: `setup` applied to each rotation set's operator in `ops`.
struct GemmKnob {
    label: String,
    takes: fn(usize) -> bool,
    setup: GemmSetup,
    ops: Vec<LinearW4A16Gemm>,
}

/// What a [`GemmKnob`] changes in an operator.
type GemmSetup = Box<dyn Fn(&mut LinearW4A16Gemm) -> Result<()>>;

impl GemmKnob {
    fn new(
        label: String,
        takes: fn(usize) -> bool,
        setup: impl Fn(&mut LinearW4A16Gemm) -> Result<()> + 'static,
    ) -> Self {
        GemmKnob {
            label,
            takes,
            setup: Box::new(setup),
            ops: Vec::new(),
        }
    }
}

/// The counts of environment variable `var`, a comma-separated list (none when unset).
fn list_var(var: &str) -> Result<Vec<usize>> {
    let Ok(list) = std::env::var(var) else {
        return Ok(Vec::new());
    };
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            item.trim()
                .parse()
                .map_err(|_| Error::invalid(var, item, "must be a comma-separated list of counts"))
        })
        .collect()
}

/// Benchmarks the linear op on the GPU `args.device` names.
pub fn run(args: &BenchArgs, sink: &mut Sink) -> Result<()> {
    let dev = args.cuda_device()?;
    if !matches!(args.wbits, 4 | 8) {
        return Err(Error::invalid("--wbits", args.wbits, "CUDA linear takes 4 or 8"));
    }
    let problems = args.problems(&SHAPES, &MS)?;
    let dtypes = args.dtypes(&[DType::F16])?;
    let mut variants: Vec<(String, Tuning)> = Vec::new();
    if std::env::var("LOWBIT_BENCH_VARIANTS").is_ok_and(|v| v == "1") {
        for per_sm in [1, 2] {
            let tuning = Tuning {
                ctas_per_sm: Some(per_sm),
                ..Tuning::default()
            };
            variants.push((format!("lowbit_{per_sm}sm"), tuning));
        }
    }
    if std::env::var("LOWBIT_BENCH_NO_PDL").is_ok_and(|v| v == "1") {
        let tuning = Tuning {
            dependent_launch: Some(false),
            ..Tuning::default()
        };
        variants.push(("lowbit_nopdl".to_string(), tuning));
    }
    // LOWBIT_BENCH_WGMMA=0,1: the decode kernel with mma.sync (0) or wgmma (1) forced.
    for value in list_var("LOWBIT_BENCH_WGMMA")? {
        let tuning = Tuning {
            wgmma: Some(value != 0),
            ..Tuning::default()
        };
        variants.push((format!("lowbit_wg{value}"), tuning));
    }
    // LOWBIT_BENCH_GATHER=0,1: the decode kernel's GATHERED TILES forced off (0) or on (1).
    for value in list_var("LOWBIT_BENCH_GATHER")? {
        let tuning = Tuning {
            gather: Some(value != 0),
            ..Tuning::default()
        };
        variants.push((format!("lowbit_gather{value}"), tuning));
    }
    // LOWBIT_BENCH_PAIRED=0,1: gathered tiles with both splits in one CTA (1) or as clusters of two CTAs (0).
    for value in list_var("LOWBIT_BENCH_PAIRED")? {
        let tuning = Tuning {
            paired: Some(value != 0),
            ..Tuning::default()
        };
        variants.push((format!("lowbit_paired{value}"), tuning));
    }
    // LOWBIT_BENCH_TMA=0: the decode kernel's cp.async pipeline (the one before Hopper) where a TMA variant exists.
    for value in list_var("LOWBIT_BENCH_TMA")? {
        let tuning = Tuning {
            tma: Some(value != 0),
            ..Tuning::default()
        };
        variants.push((format!("lowbit_tma{value}"), tuning));
    }
    for (var, prefix) in [
        ("LOWBIT_BENCH_CTAS", "c"),
        ("LOWBIT_BENCH_STAGES", "s"),
        ("LOWBIT_BENCH_SPLITS", "k"),
    ] {
        for value in list_var(var)? {
            let tuning = match prefix {
                "c" => Tuning {
                    ctas: Some(value),
                    ..Tuning::default()
                },
                "k" => Tuning {
                    splits: Some(value),
                    ..Tuning::default()
                },
                _ => Tuning {
                    stages: Some(value),
                    ..Tuning::default()
                },
            };
            variants.push((format!("lowbit_{prefix}{value}"), tuning));
        }
    }
    let count: usize = problems.iter().map(|(_, ms)| ms.len()).sum();
    sink.expect(count * dtypes.len() * (5 + 2 * variants.len()));
    let mut table = DispatchTable::default();
    for ((k, n), ms) in &problems {
        for &dtype in &dtypes {
            match dtype {
                DType::F16 => bench_shape::<f16>(&dev, args, *k, *n, ms, &variants, sink, &mut table)?,
                DType::Bf16 => bench_shape::<bf16>(&dev, args, *k, *n, ms, &variants, sink, &mut table)?,
                other => return Err(Error::invalid("--dtype", other, "CUDA linear takes f16 or bf16")),
            }
        }
    }
    if let Some(path) = &args.dispatch {
        // Entries of other weight widths already in the file are kept (one file per device for 4 and 8 bits).
        if let Ok(old) = std::fs::read_to_string(path) {
            if let Ok(old) = serde_json::from_str::<DispatchTable>(&old) {
                table
                    .entries
                    .extend(old.entries.into_iter().filter(|e| e.wbits != args.wbits));
            }
        }
        let json = serde_json::to_string_pretty(&table).map_err(|e| Error::parse(path, e))?;
        lowbit::checkpoint::write_file_atomic(path, json.as_bytes(), true)?;
    }
    Ok(())
}

/// A random int4 or int8 weight: codes and zeros over every value, f16/bf16-exact scales of realistic size.
#[allow(clippy::too_many_arguments)]
fn random_weight(
    rng: &mut SplitMix64,
    n: usize,
    k: usize,
    group: usize,
    zeros: bool,
    dtype: DType,
    wbits: u8,
) -> QuantMatrix {
    let groups = k / group;
    let mask = (1u64 << wbits) - 1;
    let mut codes = vec![0u8; n * k];
    for chunk in codes.chunks_mut(64 / wbits as usize) {
        let mut bits = rng.next_u64();
        for c in chunk {
            *c = (bits & mask) as u8;
            bits >>= wbits;
        }
    }
    QuantMatrix {
        n,
        k,
        bits: wbits,
        group_size: group,
        codes,
        zeros: zeros.then(|| (0..n * groups).map(|_| (rng.next_u64() & mask) as u8).collect()),
        scales: (0..n * groups)
            .map(|_| lowbit::dtype::round_to(dtype, 2f32.powf(rng.uniform(-9.0, -5.0))))
            .collect(),
        scale_dtype: dtype,
        g_idx: None,
    }
}

#[allow(clippy::too_many_arguments)]
fn bench_shape<T: DenseElement + ValidAsZeroBits>(
    dev: &Arc<CudaDevice>,
    args: &BenchArgs,
    k: usize,
    n: usize,
    ms: &[usize],
    tunings: &[(String, Tuning)],
    sink: &mut Sink,
    table: &mut DispatchTable,
) -> Result<()> {
    let dtype = T::DTYPE;
    let group = args.group_for(k)?;
    let stream = dev.stream().clone();
    let name = dev.info().name.clone();
    let mut rng = SplitMix64(0x11ea ^ (k * 131 + n) as u64);
    sink.status(format!("linear {k}x{n} {dtype}: preparing weights"));
    let w = random_weight(&mut rng, n, k, group, !args.symmetric, dtype, args.wbits);
    // What QuantLinear prepares (8-bit weights with f16: the int8 layout).
    let packed = repack_preferred(&w, dtype)?;
    let int8_layout = packed.plan.code_bits == 8;
    let max_m = ms.iter().copied().max().unwrap_or(1);
    if ms.contains(&0) {
        return Err(Error::invalid("--shape", "M = 0", "must be at least 1"));
    }

    // Rotation: enough copies of the layer (and of the dense weight) to exceed 2 x L2.
    let l2 = dev.info().l2_bytes;
    let copies = |bytes: usize| (2 * l2 / bytes.max(1) + 1).max(2);
    let sets = copies(packed.weight_bytes());
    let device = Device::Cuda(dev.clone());
    // LOWBIT_BENCH_ACTIVATION=silu (relu, relu6, gelu): QuantLinear's layers with that fused epilogue, their records
    // named with it (`lowbit_silu`, `lowbit_decode_silu`, `lowbit_graph_silu`, ...).
    let activation = match std::env::var("LOWBIT_BENCH_ACTIVATION") {
        Ok(name) => Activation::parse(&name)?,
        Err(_) => Activation::None,
    };
    let suffix = match activation {
        Activation::None => String::new(),
        a => format!("_{}", a.name()),
    };
    let mut layers: Vec<QuantLinear> = (0..sets)
        .map(|_| QuantLinear::new(&device, &w, None, activation, dtype, max_m))
        .collect::<Result<_>>()?;
    // The GEMM launched without programmatic dependent launch (LOWBIT_BENCH_NO_PDL=1), with STREAM-K forced
    // (LOWBIT_BENCH_STREAM=1), with its pipeline's first fill at that many stages in flight (LOWBIT_BENCH_GEMM_RAMP)
    // or with at most that many pipeline stages in its 16- and 64-token tiles (LOWBIT_BENCH_GEMM_STAGES=3,4), or
    // with its second consumer warpgroup that many k tiles behind the first (LOWBIT_BENCH_GEMM_LAG=0,1,3), against
    // `lowbit_gemm`, one operator per rotation set.
    let mut knobs: Vec<GemmKnob> = Vec::new();
    if std::env::var("LOWBIT_BENCH_NO_PDL").is_ok_and(|v| v == "1") {
        knobs.push(GemmKnob::new(
            "lowbit_gemm_nopdl".into(),
            |m| m >= 64,
            |g| {
                g.set_dependent_launch(false);
                Ok(())
            },
        ));
    }
    if std::env::var("LOWBIT_BENCH_STREAM").is_ok_and(|v| v == "1") {
        knobs.push(GemmKnob::new(
            "lowbit_gemm_stream".into(),
            |m| m <= 1024,
            |g| {
                g.force_stream_k(true);
                Ok(())
            },
        ));
    }
    for lag in list_var("LOWBIT_BENCH_GEMM_LAG")? {
        let dev = dev.clone();
        knobs.push(GemmKnob::new(
            format!("lowbit_gemm_lag{lag}"),
            |m| m >= 256,
            move |g| g.set_lag(&dev, lag),
        ));
    }
    for ramp in list_var("LOWBIT_BENCH_GEMM_RAMP")? {
        let dev = dev.clone();
        knobs.push(GemmKnob::new(
            format!("lowbit_gemm_ramp{ramp}"),
            |_| true,
            move |g| g.set_ramp(&dev, ramp),
        ));
    }
    for stages in list_var("LOWBIT_BENCH_GEMM_STAGES")? {
        let dev = dev.clone();
        knobs.push(GemmKnob::new(
            format!("lowbit_gemm_s{stages}"),
            |m| m <= 64,
            move |g| {
                g.set_stages(&dev, 16, stages)?;
                g.set_stages(&dev, 64, stages)
            },
        ));
    }
    // LOWBIT_BENCH_GEMM_LOOK=2,3: the 16- and 64-token tiles converting that many k16 steps ahead of their wgmmas
    // (`lowbit_gemm_look2`), and the K-split tile, forced, likewise (`lowbit_gemm_kslook2`).
    for look in list_var("LOWBIT_BENCH_GEMM_LOOK")? {
        let d = dev.clone();
        knobs.push(GemmKnob::new(
            format!("lowbit_gemm_look{look}"),
            |m| m <= 64,
            move |g| {
                g.set_lookahead(&d, 16, look)?;
                g.set_lookahead(&d, 64, look)
            },
        ));
        let d = dev.clone();
        knobs.push(GemmKnob::new(
            format!("lowbit_gemm_kslook{look}"),
            |m| m > 16,
            move |g| {
                g.force_k_split(true);
                g.set_k_split_lookahead(&d, look)
            },
        ));
    }
    // LOWBIT_BENCH_GEMM_KSPLIT=on,3,t128,t128x2,t128x2r1: the GEMM on its K-split tile at every M > 16 with the cost
    // model's splits (`lowbit_gemm_kson`), or with that many (`lowbit_gemm_ks3`), on the K-split tile of 64 or 128
    // tokens (`lowbit_gemm_kst128`, and with 2 splits `lowbit_gemm_kst128x2`), and with that many stages in flight
    // while its pipeline first fills (`r1`: RAMP 1; `r0`: all of them); `off`: the choice by batch size, the other
    // knobs' splits (`lowbit_gemm_ksoff`).
    if let Ok(list) = std::env::var("LOWBIT_BENCH_GEMM_KSPLIT") {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let knob = ksplit_item(item)?;
            let dev = dev.clone();
            knobs.push(GemmKnob::new(
                format!("lowbit_gemm_ks{item}"),
                |m| m > 16,
                move |g| {
                    g.force_k_split(knob.on);
                    g.force_tile_tokens(knob.tokens);
                    g.force_splits(knob.splits);
                    match knob.ramp {
                        Some(ramp) => g.set_k_split_ramp(&dev, ramp),
                        None => Ok(()),
                    }
                },
            ));
        }
    }
    for knob in &mut knobs {
        if !ms.iter().any(|&m| (knob.takes)(m)) {
            continue;
        }
        for _ in 0..sets {
            let weight = DeviceW4::upload(dev, &packed)?;
            if !supported(dev, &weight) {
                break;
            }
            let mut gemm = LinearW4A16Gemm::with_weight(dev, weight, max_m, None)?;
            (knob.setup)(&mut gemm)?;
            knob.ops.push(gemm);
        }
    }
    let gemm_variants: Vec<GemmKnob> = knobs.into_iter().filter(|k| !k.ops.is_empty()).collect();
    let mut variant_ops: Vec<(&str, Vec<LinearW4A16Cuda>)> = Vec::new();
    for (label, tuning) in tunings {
        let v = (0..sets)
            .map(|_| {
                let weight = DeviceW4::upload(dev, &packed)?;
                LinearW4A16Cuda::with_weight(dev, weight, max_m.min(MAX_DECODE_M), *tuning)
            })
            .collect::<Result<_>>()?;
        variant_ops.push((label, v));
    }
    // The same 8-bit weight as two int4 planes (the layout before the int8 one), decode and GEMM operators.
    let mut planes: Vec<(LinearW4A16Cuda, Option<LinearW4A16Gemm>)> = Vec::new();
    if int8_layout {
        let packed = repack(&w, dtype)?;
        for _ in 0..sets {
            let weight = DeviceW4::upload(dev, &packed)?;
            let decode = LinearW4A16Cuda::with_weight(dev, weight.clone(), max_m.min(MAX_DECODE_M), Tuning::default())?;
            let gemm = supported(dev, &weight)
                .then(|| LinearW4A16Gemm::with_weight(dev, weight, max_m, None))
                .transpose()?;
            planes.push((decode, gemm));
        }
    }
    let dense = dense_weight::<T>(&w);
    let dense_sets = copies(dense.len() * 2);
    let dense_w: Vec<CudaSlice<T>> = (0..dense_sets).map(|_| dev.upload(&dense)).collect::<Result<_>>()?;
    drop(dense);
    let blas = CublasLinear::new(dev, n, k)?;
    // The forced GEMM variants may need more (STREAM-K's slots).
    let ws_bytes = gemm_variants
        .iter()
        .filter_map(|v| v.ops.first())
        .map(LinearW4A16Gemm::workspace_bytes)
        .fold(layers[0].workspace_bytes(max_m), usize::max);
    let mut ws = dev.alloc_zeros::<u8>(ws_bytes.max(1))?;
    let planes_ws = planes.first().map_or(1, |(d, g)| {
        d.workspace_bytes()
            .max(g.as_ref().map_or(0, |g| g.workspace_bytes()))
            .max(1)
    });
    let mut ws_planes = dev.alloc_zeros::<u8>(planes_ws)?;

    for &m in ms {
        let xs: Vec<CudaSlice<T>> = (0..sets.max(dense_sets))
            .map(|_| {
                let x: Vec<T> = (0..m * k).map(|_| T::from_f32(rng.uniform(-1.0, 1.0))).collect();
                dev.upload(&x)
            })
            .collect::<Result<_>>()?;
        let mut ys: Vec<CudaSlice<T>> = (0..sets.max(dense_sets))
            .map(|_| dev.alloc_zeros(m * n))
            .collect::<Result<_>>()?;
        let shape = Shape { m, k, n };
        let quant_bytes = packed_bytes(&w) + (m * k + m * n) * 2;
        let dense_bytes = (n * k + m * k + m * n) * 2;
        let record = |implementation: &str, bytes: usize, us: f64| {
            let mut r = BenchRecord::new("linear", implementation, &name, dtype, shape, bytes as u64, us);
            r.wbits = Some(args.wbits);
            r.group = Some(if group == k { -1 } else { group as i64 });
            r
        };

        let (baseline, lt_baseline) = crate::bench::dense_baselines(dtype);
        // Every launcher of this M, timed in turn (`Rounds`): cuBLAS; each kernel QuantLinear has for this M, forced
        // (the fastest goes into the dispatch table); the two-plane and no-PDL comparisons; QuantLinear with its
        // own dispatch.
        let mut lt = CublasLtLinear::<T>::new(dev, m, n, k)?;
        let kernels = layers[0].available(m);
        let dispatched = layers[0].kernel_for(m).name();
        let times = {
            let (layers_c, ys_c) = (RefCell::new(&mut layers), RefCell::new(&mut ys));
            let (ws_c, ws_planes_c) = (RefCell::new(&mut ws), RefCell::new(&mut ws_planes));
            let (layers_c, ys_c, ws_c, ws_planes_c) = (&layers_c, &ys_c, &ws_c, &ws_planes_c);
            let (stream, xs, dense_w, blas, planes) = (&stream, &xs, &dense_w, &blas, &planes);
            let mut rounds = Rounds::new();
            let mut timed: Vec<(String, usize)> = Vec::new(); // (impl, bytes) of each launcher, in order
            rounds.add(dense_sets, move |i| {
                blas.run(&dense_w[i], &xs[i], m, &mut ys_c.borrow_mut()[i])
            });
            timed.push((baseline.into(), dense_bytes));
            for forced in kernels.iter().copied().map(Some).chain([None]) {
                rounds.add(sets, move |i| {
                    let mut layers = layers_c.borrow_mut();
                    layers[i].force_kernel(forced);
                    layers[i].run(stream, &xs[i], m, &mut ys_c.borrow_mut()[i], &mut **ws_c.borrow_mut())
                });
                let name = forced.map_or(format!("lowbit{suffix}"), |kernel| {
                    format!("lowbit_{}{suffix}", kernel.name())
                });
                timed.push((name, quant_bytes));
            }
            if !planes.is_empty() && m <= MAX_DECODE_M {
                rounds.add(sets, move |i| {
                    let (ys, ws) = (&mut ys_c.borrow_mut()[i], &mut **ws_planes_c.borrow_mut());
                    planes[i].0.run(stream, &xs[i], m, None, ys, ws)
                });
                timed.push(("lowbit_decode_planes".into(), quant_bytes));
            }
            if planes.first().is_some_and(|p| p.1.is_some()) && m >= 64 {
                rounds.add(sets, move |i| {
                    let gemm = planes[i].1.as_ref().expect("checked");
                    gemm.run(
                        stream,
                        &xs[i],
                        m,
                        None,
                        &mut ys_c.borrow_mut()[i],
                        &mut **ws_planes_c.borrow_mut(),
                    )
                });
                timed.push(("lowbit_gemm_planes".into(), quant_bytes));
            }
            for GemmKnob { label, ops, .. } in gemm_variants.iter().filter(|v| (v.takes)(m)) {
                rounds.add(sets, move |i| {
                    let (ys, ws) = (&mut ys_c.borrow_mut()[i], &mut **ws_c.borrow_mut());
                    ops[i].run(stream, &xs[i], m, None, ys, ws)
                });
                timed.push((label.clone(), quant_bytes));
            }
            // The second baseline, after the kernels (see `best` below): cuBLASLt planned for this M.
            let lt_c = RefCell::new(&mut lt);
            rounds.add(dense_sets, move |i| {
                lt_c.borrow_mut()
                    .run(stream, &dense_w[i], &xs[i], &mut ys_c.borrow_mut()[i])
            });
            timed.push((lt_baseline.into(), dense_bytes));
            sink.status(format!(
                "linear {m}x{k}x{n} {dtype}: {} launchers in turn (QuantLinear: {dispatched})",
                timed.len()
            ));
            timed.into_iter().zip(rounds.run(dev, stream)?).collect::<Vec<_>>()
        };
        layers.iter_mut().for_each(|l| l.force_kernel(None));
        for ((name, bytes), us) in &times {
            sink.push(record(name, *bytes, *us))?;
        }
        // The fastest forced kernel: the records right after the baseline, one per kernel.
        let best = kernels
            .iter()
            .zip(&times[1..])
            .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .map(|(&kernel, _)| kernel);
        if let Some(kernel) = best {
            table.entries.push(DispatchEntry {
                device: name.clone(),
                wbits: args.wbits,
                k,
                n,
                m,
                kernel,
            });
        }

        if m <= MAX_DECODE_M {
            sink.status(format!("linear lowbit_graph {m}x{k}x{n} {dtype}"));
            let replay = graph_replay_us(dev, &stream, sets, GRAPH_CALLS, |i| {
                layers[i].run(&stream, &xs[i], m, &mut ys[i], &mut ws)
            })?;
            sink.push(record(&format!("lowbit_graph{suffix}"), quant_bytes, replay))?;
        }

        // Compute-bound batches (or every batch, on request): QuantLinear and both baselines, each alone under
        // sustained load (`sustained_us`).
        let sustained = std::env::var("LOWBIT_BENCH_SUSTAINED");
        if sustained.as_deref().is_ok_and(|v| v == "all")
            || (m >= SUSTAINED_MIN_M && sustained.map_or(true, |v| v != "0"))
        {
            sink.status(format!("linear sustained {m}x{k}x{n} {dtype}"));
            let us = sustained_us(dev, &stream, dense_sets, |i| {
                blas.run(&dense_w[i], &xs[i], m, &mut ys[i])
            })?;
            sink.push(record(&format!("{baseline}_sustained"), dense_bytes, us))?;
            let us = sustained_us(dev, &stream, sets, |i| {
                layers[i].run(&stream, &xs[i], m, &mut ys[i], &mut ws)
            })?;
            sink.push(record(&format!("lowbit_sustained{suffix}"), quant_bytes, us))?;
            let us = sustained_us(dev, &stream, dense_sets, |i| {
                lt.run(&stream, &dense_w[i], &xs[i], &mut ys[i])
            })?;
            sink.push(record(&format!("{lt_baseline}_sustained"), dense_bytes, us))?;
        }

        for (label, v) in variant_ops.iter().filter(|_| m <= MAX_DECODE_M) {
            sink.status(format!("linear {label} {m}x{k}x{n} {dtype}"));
            let mut ws_v = dev.alloc_zeros::<u8>(v[0].workspace_bytes())?;
            let us = median_of_batches(dev, &stream, sets, |i| {
                v[i].run(&stream, &xs[i], m, None, &mut ys[i], &mut ws_v)
            })?;
            sink.push(record(label, quant_bytes, us))?;
            let replay = graph_replay_us(dev, &stream, sets, GRAPH_CALLS, |i| {
                v[i].run(&stream, &xs[i], m, None, &mut ys[i], &mut ws_v)
            })?;
            sink.push(record(&format!("{label}_graph"), quant_bytes, replay))?;
        }
    }
    Ok(())
}

/// `W` as a dense `[N, K]` matrix of `T`: what cuBLAS multiplies (each element `(q - z) · s`, rounded once).
fn dense_weight<T: DenseElement>(w: &QuantMatrix) -> Vec<T> {
    use rayon::prelude::*;
    let groups = w.groups();
    let mut dense = vec![T::from_f32(0.0); w.n * w.k];
    dense.par_chunks_mut(w.k).enumerate().for_each(|(n, row)| {
        for (k, v) in row.iter_mut().enumerate() {
            let g = w.group_of(k);
            let q = f32::from(w.codes[n * w.k + k]) - f32::from(w.zero(n, g));
            *v = T::from_f32(q * w.scales[n * groups + g]);
        }
    });
    dense
}

/// Bytes of a weight at its checkpoint size: codes, 16-bit scales, zeros of the code width.
fn packed_bytes(w: &QuantMatrix) -> usize {
    let (groups, bits) = (w.groups(), w.bits as usize);
    w.n * w.k * bits / 8 + w.n * groups * 2 + if w.zeros.is_some() { w.n * groups * bits / 8 } else { 0 }
}

/// One item of `LOWBIT_BENCH_GEMM_KSPLIT`: `off`, `on`, a split count `N`, or `tT` / `tTxN` (the K-split tile of T
/// tokens, split N ways): (K-split forced, its tokens, its splits).
/// One item of `LOWBIT_BENCH_GEMM_KSPLIT`: `off`, `on`, a split count, or `tT[xN][rR]` (tokens, splits, RAMP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KSplitKnob {
    on: bool,
    tokens: Option<usize>,
    splits: Option<usize>,
    ramp: Option<usize>,
}

fn ksplit_item(item: &str) -> Result<KSplitKnob> {
    let bad = || {
        Error::invalid(
            "LOWBIT_BENCH_GEMM_KSPLIT",
            item,
            "must list off, on, split counts or tT[xN][rR]",
        )
    };
    let number = |s: &str| s.parse::<usize>().map_err(|_| bad());
    let knob = |on, tokens, splits, ramp| KSplitKnob {
        on,
        tokens,
        splits,
        ramp,
    };
    Ok(match item {
        "off" => knob(false, None, None, None),
        "on" => knob(true, None, None, None),
        _ => match item.strip_prefix('t') {
            Some(rest) => {
                let (rest, ramp) = match rest.split_once('r') {
                    Some((rest, r)) => (rest, Some(number(r)?)),
                    None => (rest, None),
                };
                match rest.split_once('x') {
                    Some((t, n)) => knob(true, Some(number(t)?), Some(number(n)?), ramp),
                    None => knob(true, Some(number(rest)?), None, ramp),
                }
            }
            None => knob(true, None, Some(number(item)?), None),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::ksplit_item;

    #[test]
    fn ksplit_knob_items() {
        let knob = |item| {
            let k = ksplit_item(item).unwrap();
            (k.on, k.tokens, k.splits, k.ramp)
        };
        assert_eq!(knob("off"), (false, None, None, None));
        assert_eq!(knob("on"), (true, None, None, None));
        assert_eq!(knob("3"), (true, None, Some(3), None));
        assert_eq!(knob("t128"), (true, Some(128), None, None));
        assert_eq!(knob("t128x2"), (true, Some(128), Some(2), None));
        assert_eq!(knob("t128x2r1"), (true, Some(128), Some(2), Some(1)));
        assert_eq!(knob("t64r0"), (true, Some(64), None, Some(0)));
        for bad in ["t", "tx2", "t128x", "x2", "two", "t128r", "t64rx2", "3r1"] {
            let err = ksplit_item(bad).unwrap_err().to_string();
            assert!(err.contains("LOWBIT_BENCH_GEMM_KSPLIT") && err.contains(bad), "{err}");
        }
    }
}
