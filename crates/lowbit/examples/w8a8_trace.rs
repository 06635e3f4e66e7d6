//! Where the per-block W8A8 Hopper GEMM's time goes inside a CTA: one launch of the `_trace` kernel writes, for CTA
//! 0's first tile, per k tile and consumer warpgroup, the SM clock when the warpgroup got its turn on the tensor
//! cores, issued its wgmmas, saw them complete and finished the block's correction. The summary says how long each
//! phase takes and whether one warpgroup's correction runs while the other's wgmmas are in flight (the ping-pong
//! the kernel is built for). An observer thread also stamps when each stage's copies really complete.
//!
//! ```text
//! cargo run --release --example w8a8_trace -- 4096x4096x4096 [--channel | --smoothquant] [--csv FILE]
//! ```
//! f16, asymmetric activations in blocks of 128, the GEMM alone on activations quantized beforehand. `--channel`: a
//! symmetric per-channel weight (the `_channel` kernel). `--smoothquant`: SmoothQuant, the same kernel with one
//! block per row, i.e. no correction until the tile's last k tile (the schedule without the per-block work).
//! `--csv`: the raw timeline, one row per k tile.

use half::f16;
use lowbit::cuda::{CudaDevice, StreamTimer};
use lowbit::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use lowbit::ops::w8a8::cuda::{QuantizedActivationsCuda, W8a8LinearCuda};
use lowbit::ops::w8a8::ActivationQuant;
use lowbit::testing::SplitMix64;
use lowbit::DType;

/// The kernel's `StageTrace` events and `TRACE_K_TILES`.
const EVENTS: [&str; 5] = ["landed", "turn", "issued", "done", "corrected"];
const LANDED: usize = 0;
const TURN: usize = 1;
const ISSUED: usize = 2;
const DONE: usize = 3;
const CORRECTED: usize = 4;
const K_TILES: usize = 64;
/// K codes per k tile and per block.
const TILE_K: usize = 128;

fn main() -> lowbit::Result<()> {
    let mut shape = (4096, 4096, 4096);
    let (mut channel, mut smoothquant, mut csv) = (false, false, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--channel" => channel = true,
            "--smoothquant" => smoothquant = true,
            "--csv" => csv = args.next(),
            s => {
                let v: Vec<usize> = s.split('x').filter_map(|d| d.parse().ok()).collect();
                if v.len() != 3 {
                    return Err(lowbit::Error::invalid("shape", s, "MxKxN"));
                }
                shape = (v[0], v[1], v[2]);
            }
        }
    }
    let (m, k, n) = shape;
    let dev = CudaDevice::new(0)?;
    let mut rng = SplitMix64(0x7ACE);
    let dense: Vec<f32> = (0..n * k).map(|_| rng.signed_unit() * 0.05).collect();
    let asym = ActivationQuant::Asymmetric;
    let mut op = if smoothquant {
        let w = BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k)?;
        W8a8LinearCuda::smoothquant(&dev, &w, None, DType::F16)?
    } else if channel {
        let w = BlockQuantWeight::quantize_per_channel_symmetric(&dense, n, k)?;
        W8a8LinearCuda::channel_weight(&dev, &w, None, TILE_K, asym, DType::F16)?
    } else {
        let w = BlockQuantWeight::quantize(&dense, BlockShape::linear(n, k, TILE_K), BlockBits::Int8)?;
        W8a8LinearCuda::block(&dev, &w, None, asym, DType::F16)?
    };
    let x: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.signed_unit() * 2.0)).collect();
    let x = dev.upload(&x)?;
    let mut a = QuantizedActivationsCuda::alloc(&dev, m, k, op.block_size())?;
    op.quantizer().run(dev.stream(), &x, m, &mut a)?;
    let mut y = dev.alloc_zeros::<f16>(m * n)?;
    let stream = dev.stream().clone();
    for _ in 0..10 {
        op.run_quantized(&stream, &a, &mut y)?;
    }
    let timer = StreamTimer::new(&dev)?;
    let reps = 50;
    timer.start(&stream)?;
    for _ in 0..reps {
        op.run_quantized(&stream, &a, &mut y)?;
    }
    let us = timer.stop_ms(&stream)? * 1e3 / reps as f64;

    let trace = dev.alloc_zeros::<u64>(K_TILES * 3 * EVENTS.len())?;
    let (address, _sync) = lowbit::cuda::DevicePtr::device_ptr(&trace, &stream);
    op.set_trace(&dev, address)?;
    let kernel = op.kernel_name().to_string();
    op.run_quantized(&stream, &a, &mut y)?;
    op.set_trace(&dev, 0)?;
    let t = dev.download(&trace)?;
    dev.synchronize()?;

    let k_tiles = k.div_ceil(TILE_K).min(K_TILES);
    let t0 = t.iter().copied().filter(|&v| v != 0).min().unwrap_or(0);
    // ev(kt, wg, e): cycles since the first stamp.
    // Warpgroup 2 is the producer: its copies for the k tile issued (TURN's slot) after the stage's empty wait
    // (LANDED's slot).
    let ev = |kt: usize, wg: usize, e: usize| t[(kt * 3 + wg) * EVENTS.len() + e].saturating_sub(t0) as f64;
    println!("{m}x{k}x{n} {kernel}: {us:.1} us per launch; CTA 0, first tile, {k_tiles} k tiles (SM cycles)");

    // Per phase, over the k tiles past the first two (the pipeline filling).
    let steady = 2..k_tiles;
    let mean = |f: &dyn Fn(usize) -> f64| steady.clone().map(f).sum::<f64>() / steady.len().max(1) as f64;
    for wg in 0..2 {
        // From this k tile's `corrected` to the next one's `landed`: releasing a stage and passing the next one's
        // wait. Not a wait for data: the observer line below shows the copies complete long before.
        let next_landed = |kt: usize| {
            if kt + 1 < k_tiles {
                ev(kt + 1, wg, LANDED)
            } else {
                ev(kt, wg, CORRECTED)
            }
        };
        println!(
            "  warpgroup {wg}: per k tile {:5.0} = to the next wait {:4.0} + for the turn {:4.0} + issue {:4.0} + \
             wgmmas {:4.0} + correction {:4.0}",
            mean(&|kt| next_landed(kt) - ev(kt, wg, LANDED)),
            mean(&|kt| next_landed(kt) - ev(kt, wg, CORRECTED)),
            mean(&|kt| ev(kt, wg, TURN) - ev(kt, wg, LANDED)),
            mean(&|kt| ev(kt, wg, ISSUED) - ev(kt, wg, TURN)),
            mean(&|kt| ev(kt, wg, DONE) - ev(kt, wg, ISSUED)),
            mean(&|kt| ev(kt, wg, CORRECTED) - ev(kt, wg, DONE)),
        );
    }
    // The producer: from its issue to warpgroup 0 passing the stage's wait (bounded below by when the consumer gets
    // there, so it is not the copies' latency), and how long it waits for a free stage (its previous issue to this
    // stage's empty wait done).
    println!(
        "  producer: consumers pass the wait {:5.0} after the issue, issued {:5.0} before they want it; waits {:5.0} \
         for a free stage",
        mean(&|kt| ev(kt, 0, LANDED) - ev(kt, 2, TURN)),
        mean(&|kt| ev(kt - 1, 0, CORRECTED) - ev(kt, 2, TURN)),
        mean(&|kt| ev(kt, 2, LANDED) - ev(kt - 1, 2, TURN)),
    );
    // The observer thread's stamp: when the stage's copies really completed (the consumers' `landed` is when they
    // passed their wait, which may be long after).
    println!(
        "  observer: copies complete {:5.0} after issue, {:5.0} before warpgroup 0 passes its wait",
        mean(&|kt| ev(kt, 2, DONE) - ev(kt, 2, TURN)),
        mean(&|kt| ev(kt, 0, LANDED) - ev(kt, 2, DONE)),
    );
    // A warpgroup's wgmmas are in flight from its turn to its `done`; its correction from `done` to `corrected`.
    // Overlap: how much of each correction falls while the other warpgroup has wgmmas in flight, and how much of the
    // span has no wgmma in flight at all.
    let busy = |wg: usize| {
        steady
            .clone()
            .map(move |kt| (ev(kt, wg, TURN), ev(kt, wg, DONE)))
            .collect::<Vec<_>>()
    };
    let overlap = |a: (f64, f64), spans: &[(f64, f64)]| {
        spans
            .iter()
            .map(|&(s, e)| (a.1.min(e) - a.0.max(s)).max(0.0))
            .sum::<f64>()
    };
    for wg in 0..2 {
        let other = busy(1 - wg);
        let (mut covered, mut total) = (0.0, 0.0);
        for kt in steady.clone() {
            let c = (ev(kt, wg, DONE), ev(kt, wg, CORRECTED));
            covered += overlap(c, &other);
            total += c.1 - c.0;
        }
        println!(
            "  warpgroup {wg}'s corrections under the other's wgmmas: {:.0}%",
            100.0 * covered / total.max(1.0)
        );
    }
    let mut spans: Vec<(f64, f64)> = busy(0).into_iter().chain(busy(1)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (start, end) = (spans.first().map_or(0.0, |s| s.0), spans.last().map_or(0.0, |s| s.1));
    let (mut covered, mut reach) = (0.0, start);
    for (s, e) in spans {
        if e > reach {
            covered += e - s.max(reach);
            reach = e;
        }
    }
    println!(
        "  no wgmma in flight for {:.0}% of k tiles 2..{k_tiles} ({:.0} cycles)",
        100.0 * (1.0 - covered / (end - start).max(1.0)),
        end - start
    );

    if let Some(path) = csv {
        let mut out = String::from("k_tile");
        for wg in 0..2 {
            for e in EVENTS {
                out += &format!(",wg{wg}_{e}");
            }
        }
        out += ",producer_free,producer_issued,copies_complete";
        out += "\n";
        for kt in 0..k_tiles {
            out += &kt.to_string();
            for wg in 0..2 {
                for e in 0..EVENTS.len() {
                    out += &format!(",{:.0}", ev(kt, wg, e));
                }
            }
            out += &format!(
                ",{:.0},{:.0},{:.0}",
                ev(kt, 2, LANDED),
                ev(kt, 2, TURN),
                ev(kt, 2, DONE)
            );
            out += "\n";
        }
        std::fs::write(&path, out).map_err(|e| lowbit::Error::io(&path, e))?;
    }
    Ok(())
}
