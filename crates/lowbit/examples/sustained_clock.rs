//! Under sustained load, at what SM clock do the W4A16 GEMM and cuBLAS run, and how many cycles does a launch take?
//! At large M both are held by the H200's power cap (`docs/notes/w4a16-gemm.md`, "Timing in turn"). If the GEMM's
//! in-register conversion costs energy, it runs at a lower clock than cuBLAS for the same work. If not, the clocks
//! match and the gap is in the cycles.
//!
//! Each launcher runs alone, back to back, for `--seconds` (default 3), in the order GEMM, cuBLASLt, cuBLAS, GEMM.
//! Every ~100 ms the probe reads the launch time with CUDA events, and the SM clock, power and throttle reasons
//! through `nvidia-smi`. It prints one line per window, then medians over each phase's second half.
//!
//! ```text
//! cargo run --release --example sustained_clock -- 4096x8192x28672 [--seconds 3] [--ksplit] [--splits N]
//! ```
//! `--ksplit` runs the GEMM's K-split tile, and `--splits` forces its split count (as in `gemm_trace`).

use half::f16;
use lowbit::cuda::{CudaDevice, StreamTimer};
use lowbit::ops::linear::cuda::gemm::LinearW4A16Gemm;
use lowbit::ops::linear::cuda::{repack, CublasLinear, CublasLtLinear, DeviceW4};
use lowbit::testing::{random_quant, QuantSpec, SplitMix64};
use lowbit::DType;
use std::process::Command;
use std::time::{Duration, Instant};

/// (SM MHz, W, throttle reasons) from `nvidia-smi`, or zeros where it is not there.
fn gpu_state() -> (f64, f64, String) {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=clocks.sm,power.draw,clocks_throttle_reasons.active",
            "--format=csv,noheader,nounits",
        ])
        .output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let f: Vec<&str> = text.trim().split(',').map(str::trim).collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (num(0), num(1), f.get(2).unwrap_or(&"").to_string())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> lowbit::Result<()> {
    let mut shape = (4096, 8192, 28672);
    let mut seconds = 3.0f64;
    let (mut k_split, mut splits) = (false, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or(seconds),
            "--ksplit" => k_split = true,
            "--splits" => splits = args.next().and_then(|v| v.parse().ok()),
            s => {
                let d: Vec<usize> = s.split('x').filter_map(|v| v.parse().ok()).collect();
                assert_eq!(d.len(), 3, "the shape is MxKxN, got {s}");
                shape = (d[0], d[1], d[2]);
            }
        }
    }
    let (m, k, n) = shape;
    let dev = CudaDevice::new(0)?;
    let stream = dev.stream().clone();
    let mut rng = SplitMix64(7);
    let w = random_quant(&mut rng, &QuantSpec::new(n, k, 4, 128));
    let mut gemm = LinearW4A16Gemm::with_weight(&dev, DeviceW4::upload(&dev, &repack(&w, DType::F16)?)?, m, splits)?;
    gemm.force_k_split(k_split);
    let mut ws = dev.alloc_zeros::<u8>(gemm.workspace_bytes().max(1))?;
    let dense: Vec<f16> = (0..n * k).map(|_| f16::from_f32(rng.signed_unit() * 0.05)).collect();
    let dense = dev.upload(&dense)?;
    let x: Vec<f16> = (0..m * k).map(|_| f16::from_f32(rng.signed_unit())).collect();
    let x = dev.upload(&x)?;
    let mut y = dev.alloc_zeros::<f16>(m * n)?;
    let blas = CublasLinear::new(&dev, n, k)?;
    let mut lt = CublasLtLinear::<f16>::new(&dev, m, n, k)?;
    let timer = StreamTimer::new(&dev)?;

    println!("{m}x{k}x{n}, f16, group 128; window: launcher, us/launch, SM MHz, W, throttle reasons");
    let mut summary = Vec::new();
    for phase in ["gemm", "cublaslt", "cublas", "gemm"] {
        let mut launch = || match phase {
            "gemm" => gemm.run(&stream, &x, m, None, &mut y, &mut ws),
            "cublaslt" => lt.run(&stream, &dense, &x, &mut y),
            _ => blas.run(&dense, &x, m, &mut y),
        };
        timer.start(&stream)?;
        for _ in 0..3 {
            launch()?;
        }
        let calls = (150e3 / (timer.stop_ms(&stream)? * 1e3 / 3.0)).ceil().max(1.0) as usize;
        let start = Instant::now();
        let mut windows = Vec::new();
        while start.elapsed() < Duration::from_secs_f64(seconds) {
            // Enqueue ~150 ms of work, then read the clock while it runs.
            timer.start(&stream)?;
            for _ in 0..calls {
                launch()?;
            }
            let (mhz, watts, reasons) = gpu_state();
            let us = timer.stop_ms(&stream)? * 1e3 / calls as f64;
            println!(
                "{:6.2} s  {phase:9} {us:9.1} us  {mhz:6.0} MHz  {watts:6.1} W  {reasons}",
                start.elapsed().as_secs_f64()
            );
            windows.push((us, mhz, watts));
        }
        let late = &windows[windows.len() / 2..];
        let (us, mhz, watts) = (
            median(late.iter().map(|w| w.0).collect()),
            median(late.iter().map(|w| w.1).collect()),
            median(late.iter().map(|w| w.2).collect()),
        );
        summary.push((phase, us, mhz, watts));
    }
    println!("phase medians over each phase's second half:");
    for (phase, us, mhz, watts) in summary {
        println!(
            "  {phase:9} {us:9.1} us  {mhz:6.0} MHz  {watts:6.1} W  {:8.2} M SM cycles/launch",
            us * mhz / 1e6
        );
    }
    Ok(())
}
