//! Where the W4A16 GEMM's time goes, CTA by CTA: times the kernel alone (weights rotated beyond L2), then runs one
//! traced launch and summarises its timeline (the kernel's `Trace` events, %globaltimer) over the CTAs.
//!
//! ```text
//! cargo run --release --example gemm_trace -- 256x4096x4096 64x4096x4096 [--rotate-io] [--splits 1] [--small-batch 0] [--tokens 64|128] [--ksplit] [--look64 2|3] [--look-ksplit 2|3] [--ramp-ksplit N] [--stream on|off] [--stages N] [--decode-splits 1|2|4|8] [--ctas-per-sm 1|2] [--gather on|off] [--paired on|off] [--wgmma on|off] [--pdl on|off]
//! ```
//! Each shape is `MxKxN` (f16, group 128, zero points), `decode:MxKxN` for the decode kernel (the same weight; the
//! stream-K fix-up's partials and counter show as `partials_seen`), or `conv:BxCxHxWxRxCo` for the convolution's
//! Hopper path (int4 blocks of 128 channels, stride 1, padding R / 2; the timeline covers the GEMM, the timing also
//! the pack).
//! `--rotate-io` rotates as many x and y buffers as weight copies (as `lowbit bench` does); by default all launches
//! share one x and one y. `--tokens` picks the tile's tokens per warpgroup, and with `--ksplit` the K-split tile's
//! (64 or 128), and `--ramp-ksplit` its RAMP (stages in flight while the pipeline first fills; 0: all).
//! `--stages` sets the pipeline depth of the GEMM tile and of the decode kernel (per ring when paired).
//! Output: one summary block per shape; with `LOWBIT_TRACE_CSV=dir` also the raw per-CTA timeline as
//! `dir/<shape>.csv`.

use half::f16;
use lowbit::cuda::{CudaDevice, CudaSlice, StreamTimer};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::conv::cuda::Conv2dCuda;
use lowbit::ops::conv::Conv2dParams;
use lowbit::ops::linear::cuda::gemm::LinearW4A16Gemm;
use lowbit::ops::linear::cuda::{repack, DeviceW4, LinearW4A16Cuda, Tuning};
use lowbit::testing::{random_quant, QuantSpec, SplitMix64};
use lowbit::DType;
use std::sync::Arc;

/// The kernel's `Trace` events: (slot, name), in time order.
const EVENTS: [(usize, &str); 8] = [
    (0, "entry"),
    (1, "first_full"),
    (2, "mainloop_end"),
    (3, "partials_seen"),
    (8, "global_step"),
    (9, "step_loaded"),
    (4, "item_end"),
    (5, "exit"),
];
/// `u64` slots per CTA (the kernel's `TRACE_SLOTS`): the events, and the counts `items` (6) and `sm` (7).
const SLOTS: usize = 10;
/// Weight copies rotated per shape, enough to exceed the 60 MB L2 at the smallest shape.
const MIN_ROTATION_BYTES: usize = 160 << 20;

fn main() -> lowbit::Result<()> {
    let mut shapes = Vec::new();
    let mut convs = Vec::new();
    let mut decodes = Vec::new();
    let mut splits = None;
    let mut small_batch = None;
    let mut tokens = None;
    let mut look64 = None;
    let mut look_ksplit = None;
    let mut ramp_ksplit = None;
    let mut decode_splits = None;
    let mut ctas_per_sm = None;
    let mut gather = None;
    let mut paired = None;
    let mut wgmma = None;
    let mut dependent_launch = None;
    let mut stream_k = false;
    let mut k_split = false;
    let mut rotate_io = false;
    let mut stages = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--splits" => splits = args.next().and_then(|v| v.parse().ok()),
            "--small-batch" => small_batch = args.next().and_then(|v| v.parse().ok()),
            "--rotate-io" => rotate_io = true,
            "--tokens" => tokens = args.next().and_then(|v| v.parse().ok()),
            "--look64" => look64 = args.next().and_then(|v| v.parse().ok()),
            "--look-ksplit" => look_ksplit = args.next().and_then(|v| v.parse().ok()),
            "--ramp-ksplit" => ramp_ksplit = args.next().and_then(|v| v.parse().ok()),
            "--decode-splits" => decode_splits = args.next().and_then(|v| v.parse().ok()),
            "--ctas-per-sm" => ctas_per_sm = args.next().and_then(|v| v.parse().ok()),
            "--gather" => gather = args.next().map(|v| v == "on"),
            "--paired" => paired = args.next().map(|v| v == "on"),
            "--wgmma" => wgmma = args.next().map(|v| v == "on"),
            "--pdl" => dependent_launch = args.next().map(|v| v == "on"),
            "--stream" => stream_k = args.next().is_some_and(|v| v == "on"),
            "--ksplit" => k_split = true,
            "--stages" => stages = args.next().and_then(|v| v.parse().ok()),
            s if s.starts_with("conv:") => convs.push(s.to_string()),
            s => {
                let (list, dims) = match s.strip_prefix("decode:") {
                    Some(dims) => (&mut decodes, dims),
                    None => (&mut shapes, s),
                };
                let d: Vec<usize> = dims.split('x').filter_map(|v| v.parse().ok()).collect();
                assert_eq!(d.len(), 3, "shapes are MxKxN or decode:MxKxN, got {s}");
                list.push((d[0], d[1], d[2]));
            }
        }
    }
    let dev = CudaDevice::new(0)?;
    for (m, k, n) in shapes {
        let (mut ops, x, y) = linear_problem(&dev, m, k, n, |weight| {
            let mut op = LinearW4A16Gemm::with_weight(&dev, weight, m, splits)?;
            if let Some(rows) = small_batch {
                op.set_small_batch(rows);
            }
            op.force_tile_tokens(tokens);
            if let Some(steps) = look64 {
                op.set_lookahead(&dev, 64, steps)?;
            }
            if let Some(steps) = look_ksplit {
                op.set_k_split_lookahead(&dev, steps)?;
            }
            if let Some(stages) = ramp_ksplit {
                op.set_k_split_ramp(&dev, stages)?;
            }
            op.force_stream_k(stream_k);
            op.force_k_split(k_split);
            if let Some(n) = stages {
                for tokens in [16, 64, 128] {
                    op.set_stages(&dev, tokens, n)?;
                }
            }
            Ok(op)
        })?;
        let copies = ops.len();
        let mut ws = dev.alloc_zeros::<u8>(ops[0].workspace_bytes().max(1))?;
        let stream = dev.stream().clone();
        // --rotate-io: as many x and y buffers as weight copies, rotated with them, as `lowbit bench` times it.
        let (xs, mut ys) = if rotate_io {
            let host = dev.download(&x)?;
            let xs = (0..copies)
                .map(|_| dev.upload(&host))
                .collect::<lowbit::Result<Vec<_>>>()?;
            let ys = (0..copies)
                .map(|_| dev.alloc_zeros::<f16>(m * n))
                .collect::<lowbit::Result<Vec<_>>>()?;
            (xs, ys)
        } else {
            (vec![x], vec![y])
        };
        let mut call = 0usize;
        let launch = |op: &LinearW4A16Gemm| {
            let j = call % xs.len();
            call += 1;
            op.run(&stream, &xs[j], m, None, &mut ys[j], &mut ws)
        };
        let (us, t) = time_and_trace(&dev, &mut ops, launch, LinearW4A16Gemm::set_trace)?;

        let v = ops[0].variant(m);
        println!(
            "== M={m} K={k} N={n}: {:.1} us/launch ({copies} weights rotated), tile {}x{} tokens x cols, \
             split {:?}, stages {}, lookahead {}",
            us,
            v.bm(),
            v.n_cta(),
            ops[0].split_plan(m),
            v.stages,
            v.lookahead
        );
        summarise(&t, &format!("{m}x{k}x{n}"));
    }
    for (m, k, n) in decodes {
        let tuning = Tuning {
            splits: decode_splits,
            stages,
            ctas_per_sm,
            gather,
            paired,
            wgmma,
            dependent_launch,
            ..Tuning::default()
        };
        let (mut ops, x, mut y) = linear_problem(&dev, m, k, n, |weight| {
            LinearW4A16Cuda::with_weight(&dev, weight, m, tuning)
        })?;
        let copies = ops.len();
        let mut ws = dev.alloc_zeros::<u8>(ops[0].workspace_bytes().max(1))?;
        let stream = dev.stream().clone();
        let launch = |op: &LinearW4A16Cuda| op.run(&stream, &x, m, None, &mut y, &mut ws);
        let (us, t) = time_and_trace(&dev, &mut ops, launch, LinearW4A16Cuda::set_trace)?;
        println!(
            "== decode M={m} K={k} N={n}: {us:.1} us/launch ({copies} weights rotated), {} CTAs, tile width {}, \
             splits {}, stages {}",
            ops[0].ctas(),
            ops[0].tile_width(),
            ops[0].splits(),
            stages.map_or("default".to_string(), |s| format!("{s} (per ring when paired)"))
        );
        for (name, resident) in ops[0].cluster_residency() {
            println!("  {name}: resident clusters of 2 / 4 / 8 CTAs: {resident:?}");
        }
        summarise(&t, &format!("decode-{m}x{k}x{n}"));
    }
    for spec in convs {
        let d: Vec<usize> = spec[5..].split('x').filter_map(|v| v.parse().ok()).collect();
        assert_eq!(d.len(), 6, "convolutions are conv:BxCxHxWxRxCo, got {spec}");
        let (b, c, h, w, r, co) = (d[0], d[1], d[2], d[3], d[4], d[5]);
        let mut rng = SplitMix64(11);
        let dense: Vec<f32> = (0..co * c * r * r).map(|_| rng.signed_unit() * 0.05).collect();
        let shape = BlockShape::conv(co, c, (r, r), (c / 128).max(1))?;
        let weight = BlockQuantWeight::quantize(&dense, shape, BlockBits::Int4)?;
        let params = Conv2dParams {
            padding: (r / 2, r / 2),
            ..Conv2dParams::default()
        };
        let input = [b, c, h, w];
        let copies = (MIN_ROTATION_BYTES / (co * c * r * r / 2)).clamp(1, 64);
        let mut convs = Vec::new();
        for _ in 0..copies {
            convs.push(Conv2dCuda::new(&dev, &weight, None, params)?);
        }
        assert!(convs[0].uses_hopper(), "{spec} does not take the Hopper path");
        let x: Vec<f16> = (0..b * c * h * w).map(|_| f16::from_f32(rng.signed_unit())).collect();
        let x = dev.upload(&x)?;
        let mut y = dev.alloc_zeros::<f16>(b * co * h * w)?;
        let mut ws = dev.alloc_zeros::<u8>(convs[0].workspace_bytes(input)?.max(1))?;
        let stream = dev.stream().clone();
        let launch = |op: &Conv2dCuda| op.run(&stream, &x, input, &mut y, &mut ws);
        let (us, t) = time_and_trace(&dev, &mut convs, launch, Conv2dCuda::set_trace)?;
        println!("== {spec}: {us:.1} us/run with the pack ({copies} weights rotated)");
        summarise(&t, &spec[5..]);
    }
    Ok(())
}

/// An `m x k x n` linear problem (f16, int4 group 128 with zero points): one operator per weight copy (`make`),
/// enough copies to exceed L2, and the x and y buffers.
fn linear_problem<O>(
    dev: &CudaDevice,
    m: usize,
    k: usize,
    n: usize,
    make: impl Fn(Arc<DeviceW4>) -> lowbit::Result<O>,
) -> lowbit::Result<(Vec<O>, CudaSlice<f16>, CudaSlice<f16>)> {
    let mut rng = SplitMix64(7);
    let w = random_quant(&mut rng, &QuantSpec::new(n, k, 4, 128));
    let packed = repack(&w, DType::F16)?;
    let copies = (MIN_ROTATION_BYTES / (n * k / 2)).clamp(1, 64);
    let ops = (0..copies)
        .map(|_| make(DeviceW4::upload(dev, &packed)?))
        .collect::<lowbit::Result<Vec<O>>>()?;
    let x: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.signed_unit())).collect();
    Ok((ops, dev.upload(&x)?, dev.alloc_zeros::<f16>(m * n)?))
}

/// Times `launch` over the rotated operators (a warm-up, then 20 rounds, or `LOWBIT_TRACE_ROUNDS`), then traces one
/// launch of `ops[0]` after one of every other (so its weight is not in L2). Returns µs per launch and the trace
/// (SLOTS values per CTA).
fn time_and_trace<O>(
    dev: &CudaDevice,
    ops: &mut [O],
    mut launch: impl FnMut(&O) -> lowbit::Result<()>,
    set_trace: impl Fn(&mut O, u64),
) -> lowbit::Result<(f64, Vec<u64>)> {
    let stream = dev.stream().clone();
    for op in ops.iter().cycle().take(3 * ops.len()) {
        launch(op)?;
    }
    let timer = StreamTimer::new(dev)?;
    let rounds = std::env::var("LOWBIT_TRACE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let reps = rounds * ops.len();
    timer.start(&stream)?;
    for op in ops.iter().cycle().take(reps) {
        launch(op)?;
    }
    let us = timer.stop_ms(&stream)? * 1e3 / reps as f64;
    // Room for two CTAs per SM (the decode kernel's largest grid).
    let trace = dev.alloc_zeros::<u64>(SLOTS * 2 * dev.info().sm_count as usize)?;
    let (address, _sync) = lowbit::cuda::DevicePtr::device_ptr(&trace, &stream);
    set_trace(&mut ops[0], address);
    for op in &ops[1..] {
        launch(op)?;
    }
    launch(&ops[0])?;
    set_trace(&mut ops[0], 0);
    let t = dev.download(&trace)?;
    dev.synchronize()?;
    Ok((us, t))
}

/// Prints the timeline of one traced launch (`t`: SLOTS values per CTA) over its CTAs, and writes it as CSV when
/// `LOWBIT_TRACE_CSV` names a directory.
fn summarise(t: &[u64], name: &str) {
    let ctas: Vec<&[u64]> = t.chunks(SLOTS).filter(|c| c[0] != 0).collect();
    println!("  CTAs           {}", ctas.len());
    let t0 = ctas.iter().map(|c| c[0]).min().unwrap_or(0);
    let stat = |f: &dyn Fn(&[u64]) -> Option<f64>| -> String {
        let mut xs: Vec<f64> = ctas.iter().filter_map(|c| f(c)).collect();
        if xs.is_empty() {
            return "-".into();
        }
        xs.sort_by(f64::total_cmp);
        format!(
            "min {:7.2}  med {:7.2}  max {:7.2}",
            xs[0],
            xs[xs.len() / 2],
            xs[xs.len() - 1]
        )
    };
    let at = |slot: usize| move |c: &[u64]| (c[slot] != 0).then(|| (c[slot] - t0) as f64 / 1e3);
    for (slot, event) in EVENTS {
        println!("  {event:14} at  {}", stat(&at(slot)));
    }
    let span =
        |a: usize, b: usize| move |c: &[u64]| (c[a] != 0 && c[b] != 0).then(|| (c[b] as f64 - c[a] as f64) / 1e3);
    println!("  wait first     {}", stat(&span(0, 1)));
    println!("  mainloop       {}", stat(&span(1, 2)));
    println!("  epilogue       {}", stat(&span(2, 4)));
    println!("  exit after     {}", stat(&span(4, 5)));
    println!("  global step    {}", stat(&span(8, 4)));
    println!("   loads         {}", stat(&span(8, 9)));
    println!("   sum, store    {}", stat(&span(9, 4)));
    println!("  items/CTA      {}", stat(&|c: &[u64]| Some(c[6] as f64)));
    // CTAs sharing an SM need not progress alike (the decode kernel's BOTH SPLITS IN ONE CTA): the main loop's end by
    // a CTA's place among its SM's CTAs, in launch order ("alone": the only CTA its SM ran).
    let mut per_sm = std::collections::HashMap::<u64, usize>::new();
    ctas.iter().for_each(|c| *per_sm.entry(c[7]).or_default() += 1);
    let mut seen = std::collections::HashMap::<u64, usize>::new();
    let mut places = std::collections::BTreeMap::<String, Vec<f64>>::new();
    for c in &ctas {
        let rank = seen.entry(c[7]).or_default();
        let place = match (per_sm[&c[7]], *rank) {
            (1, _) => "alone".to_string(),
            (_, r) => format!("SM's CTA {}", r + 1),
        };
        *rank += 1;
        if let Some(end) = at(2)(c) {
            places.entry(place).or_default().push(end);
        }
    }
    for (place, mut ends) in places {
        ends.sort_by(f64::total_cmp);
        println!(
            "  {place:14} {:4} CTAs, mainloop_end at min {:7.2}  med {:7.2}  max {:7.2}",
            ends.len(),
            ends[0],
            ends[ends.len() / 2],
            ends[ends.len() - 1]
        );
    }
    if let Ok(dir) = std::env::var("LOWBIT_TRACE_CSV") {
        let mut csv = String::from("cta,sm,items");
        for (_, event) in EVENTS {
            csv += &format!(",{event}_us");
        }
        csv += "\n";
        for (i, c) in t.chunks(SLOTS).enumerate() {
            csv += &format!("{i},{},{}", c[7], c[6]);
            for (slot, _) in EVENTS {
                let e = c[slot];
                csv += &format!(",{:.3}", if e == 0 { -1.0 } else { (e - t0) as f64 / 1e3 });
            }
            csv += "\n";
        }
        std::fs::write(format!("{dir}/{name}.csv"), csv).ok();
    }
}
