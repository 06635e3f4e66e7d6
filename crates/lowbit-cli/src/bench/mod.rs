//! `lowbit bench`: lowbit's kernels and the dense baseline, timed in the same process.
//!
//! Each device module (`cpu`, `cuda`) measures the ops it supports and hands every measurement to a [`Sink`] as a
//! [`BenchRecord`] (one line of shared/bench-format.md). The sink prints JSON lines as they come (`--json`) or a
//! table at the end, and drives the progress bar on stderr. A device module's entry point is
//! `run(&BenchArgs, &mut Sink) -> lowbit::Result<()>`; it calls [`Sink::expect`] with the number of records it will
//! produce, [`Sink::push`] for each, and uses [`time_us`] (or its own device timer) to measure.

mod cpu;
mod cuda;

pub(crate) use cpu::dense_f32_linear;

use indicatif::{ProgressBar, ProgressStyle};
use lowbit::{Error, Result};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// cpu | cuda | cuda:N | auto (CUDA when present, else the CPU)
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// dequant | linear | w8a8 | conv (all the device supports when absent)
    #[arg(long)]
    pub op: Option<String>,
    /// MxKxN (repeatable; dequant uses K and N). Default: M ∈ {1, 64} × K = N = 4096.
    #[arg(long)]
    pub shape: Vec<String>,
    /// Activation/output dtype: f32 | f16 | bf16 (repeatable; default per device: f32 on the CPU, f16 for dequant)
    #[arg(long)]
    pub dtype: Vec<String>,
    /// Weight bits: 4 or 8
    #[arg(long, default_value_t = 4)]
    pub wbits: u8,
    /// Group size along K (-1: per channel)
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    pub group: i64,
    /// Symmetric weights (no zero points)
    #[arg(long)]
    pub symmetric: bool,
    /// Convolution cases for `--op conv`: `BxCxHxW,kKsSpP` with Co = C, or `...,coN` (repeatable).
    /// Default on the CPU: 1x64x56x56,k3s1p1 and 1x256x14x14,k1s1p0,co512.
    #[arg(long)]
    pub conv: Vec<String>,
    /// JSON lines (shared/bench-format.md) instead of a table
    #[arg(long)]
    pub json: bool,
    /// `--op linear` on CUDA: also write the measured dispatch table of QuantLinear (the fastest kernel per shape
    /// and M in this run) to FILE (JSON), as committed in bench/results/dispatch-*.json
    #[arg(long, value_name = "FILE")]
    pub dispatch: Option<std::path::PathBuf>,
}

/// The default problem sizes: decode (M = 1) and a small prefill (M = 64) of a 4096 × 4096 layer.
pub const DEFAULT_SHAPES: [Shape; 2] = [
    Shape { m: 1, k: 4096, n: 4096 },
    Shape {
        m: 64,
        k: 4096,
        n: 4096,
    },
];

/// Implementations that are baselines: the table's ratio column compares every other row with one of these.
pub const BASELINES: [&str; 8] = [
    "dense_f32",
    "cublas_fp16",
    "cublas_bf16",
    "cublaslt_fp16",
    "cublaslt_bf16",
    "cublaslt_int8",
    "cudnn_fp16",
    "memcpy",
];

/// How a record was timed, from its implementation's name: `_graph` (CUDA-graph replay), `_sustained` (alone under
/// sustained load), or "" (in turn with the others). A ratio compares records timed the same way.
pub fn timing_mode(implementation: &str) -> &'static str {
    if implementation.ends_with("_graph") {
        "_graph"
    } else if implementation.contains("_sustained") {
        "_sustained"
    } else {
        ""
    }
}

/// The baseline implementation a record is (`cublas_fp16_sustained` → `cublas_fp16`), if it is one.
pub fn baseline_stem(implementation: &str) -> Option<&str> {
    let stem = implementation
        .strip_suffix(timing_mode(implementation))
        .unwrap_or(implementation);
    BASELINES.contains(&stem).then_some(stem)
}

/// The baseline a baseline implementation stands for: cuBLASLt's dense product is another way of running
/// `cublas_fp16` (`cublas_bf16`), and a ratio is taken against the faster of the two in the same run.
pub fn baseline_family(implementation: &str) -> &str {
    match implementation {
        "cublaslt_fp16" => "cublas_fp16",
        "cublaslt_bf16" => "cublas_bf16",
        other => other,
    }
}

/// The dense baselines of a `dtype` product: (cublasGemmEx, cuBLASLt) record names.
pub fn dense_baselines(dtype: lowbit::DType) -> (&'static str, &'static str) {
    if dtype == lowbit::DType::Bf16 {
        ("cublas_bf16", "cublaslt_bf16")
    } else {
        ("cublas_fp16", "cublaslt_fp16")
    }
}

/// A problem size `M × K × N` (y[M, N] = x[M, K] · W^T).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// A weight shape `(K, N)` and the batch sizes benchmarked on it.
pub type Problem = ((usize, usize), Vec<usize>);

impl BenchArgs {
    /// The `--shape` values, or `DEFAULT_SHAPES`.
    pub fn shapes(&self) -> Result<Vec<Shape>> {
        if self.shape.is_empty() {
            return Ok(DEFAULT_SHAPES.to_vec());
        }
        self.shape.iter().map(|s| parse_shape(s)).collect()
    }

    /// The `--shape`s grouped by weight `(K, N)`, each with its batch sizes in order; without `--shape`, every
    /// default shape with every default M (the CUDA GEMM benches prepare each weight once for all its M).
    pub fn problems(&self, shapes: &[(usize, usize)], ms: &[usize]) -> Result<Vec<Problem>> {
        if self.shape.is_empty() {
            return Ok(shapes.iter().map(|&kn| (kn, ms.to_vec())).collect());
        }
        let mut problems: Vec<((usize, usize), Vec<usize>)> = Vec::new();
        for s in self.shapes()? {
            match problems.iter_mut().find(|(kn, _)| *kn == (s.k, s.n)) {
                Some((_, ms)) => ms.push(s.m),
                None => problems.push(((s.k, s.n), vec![s.m])),
            }
        }
        Ok(problems)
    }

    /// Whether `op` was asked for (every op is, when `--op` is absent).
    pub fn wants(&self, op: &str) -> bool {
        self.op.as_deref().map_or(true, |o| o == op)
    }

    /// The `group` field of a record for group size `group_size` along `k` inputs (-1: per channel).
    pub fn group_field(group_size: usize, k: usize) -> i64 {
        if group_size == k {
            -1
        } else {
            group_size as i64
        }
    }

    /// The group size for a layer with `k` inputs (`-1` = per channel = `k`).
    pub fn group_for(&self, k: usize) -> Result<usize> {
        match self.group {
            -1 => Ok(k),
            g if g > 0 && k % g as usize == 0 => Ok(g as usize),
            g => Err(Error::invalid(
                "--group",
                g,
                format!("must be -1 or a positive divisor of K = {k}"),
            )),
        }
    }

    /// The GPU `--device` names (`auto` means GPU 0 here: the caller already chose CUDA).
    pub fn cuda_device(&self) -> Result<std::sync::Arc<lowbit::cuda::CudaDevice>> {
        let spec = if self.device == "auto" {
            "cuda"
        } else {
            self.device.as_str()
        };
        match lowbit::cuda::Device::from_spec(spec)? {
            lowbit::cuda::Device::Cuda(dev) => Ok(dev),
            _ => Err(Error::CudaUnavailable("no GPU selected".into())),
        }
    }

    /// The `--dtype` values, or `default`.
    pub fn dtypes(&self, default: &[lowbit::DType]) -> Result<Vec<lowbit::DType>> {
        use lowbit::DType;
        if self.dtype.is_empty() {
            return Ok(default.to_vec());
        }
        self.dtype
            .iter()
            .map(|d| match d.as_str() {
                "f32" => Ok(DType::F32),
                "f16" => Ok(DType::F16),
                "bf16" => Ok(DType::Bf16),
                other => Err(Error::invalid("--dtype", other, "must be f32, f16 or bf16")),
            })
            .collect()
    }
}

fn parse_shape(s: &str) -> Result<Shape> {
    let dims: Vec<usize> = s
        .split('x')
        .filter_map(|d| d.trim().parse().ok())
        .filter(|&d| d > 0)
        .collect();
    match dims[..] {
        [m, k, n] if s.split('x').count() == 3 => Ok(Shape { m, k, n }),
        _ => Err(Error::invalid(
            "--shape",
            s,
            "must be MxKxN with three positive integers",
        )),
    }
}

/// One measurement: a line of shared/bench-format.md.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchRecord {
    pub op: String,
    #[serde(rename = "impl")]
    pub implementation: String,
    pub device: String,
    pub dtype: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wbits: Option<u8>,
    /// Group or block size along K; -1 per channel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<i64>,
    #[serde(rename = "M")]
    pub m: usize,
    #[serde(rename = "K")]
    pub k: usize,
    #[serde(rename = "N")]
    pub n: usize,
    /// Convolution geometry, e.g. `8x256x56x56,k3s1p1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conv: Option<String>,
    /// Bytes the operation must move at least.
    pub bytes: u64,
    /// Median time in microseconds.
    pub us: f64,
    pub source_commit: String,
}

impl BenchRecord {
    /// A record with the fields every device fills the same way; set `wbits`, `group`, `conv` as they apply.
    pub fn new(
        op: &str,
        implementation: &str,
        device: &str,
        dtype: lowbit::DType,
        shape: Shape,
        bytes: u64,
        us: f64,
    ) -> Self {
        Self {
            op: op.into(),
            implementation: implementation.into(),
            device: device.into(),
            dtype: dtype.name().into(),
            wbits: None,
            group: None,
            m: shape.m,
            k: shape.k,
            n: shape.n,
            conv: None,
            bytes,
            us,
            source_commit: SOURCE_COMMIT.into(),
        }
    }
}

/// The commit this binary was built from (`-dirty` if the tree had changes), embedded by build.rs.
pub const SOURCE_COMMIT: &str = env!("LOWBIT_SOURCE_COMMIT");

/// Where records go: JSON lines on stdout as they arrive, or a table at the end; plus the progress bar.
pub struct Sink {
    json: bool,
    records: Vec<BenchRecord>,
    progress: ProgressBar,
}

impl Sink {
    pub fn new(json: bool) -> Self {
        let progress = ProgressBar::new(0).with_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .expect("valid progress template"),
        );
        Self {
            json,
            records: Vec::new(),
            progress,
        }
    }

    /// Announces `count` more records (lengthens the progress bar).
    pub fn expect(&mut self, count: usize) {
        self.progress.inc_length(count as u64);
    }

    /// Shows what is being measured now.
    pub fn status(&self, message: String) {
        self.progress.set_message(message);
    }

    /// Takes one record: printed now with `--json`, in the table at the end otherwise.
    pub fn push(&mut self, record: BenchRecord) -> Result<()> {
        if self.json {
            let line = serde_json::to_string(&record).map_err(|e| Error::Unsupported(format!("bench record: {e}")))?;
            self.progress.suspend(|| println!("{line}"));
        }
        self.records.push(record);
        self.progress.inc(1);
        Ok(())
    }

    /// Clears the progress bar and prints the table (unless `--json`).
    pub fn finish(self) {
        self.progress.finish_and_clear();
        if !self.json {
            print_table(&self.records);
        }
    }
}

/// Columns: op, impl, dtype, M, K, N, µs, and the speedup over the baseline of the same op and shape.
fn print_table(records: &[BenchRecord]) {
    println!(
        "{:<8} {:<18} {:<5} {:>5} {:>6} {:>6} {:>12} {:>9}",
        "op", "impl", "dtype", "M", "K", "N", "µs", "speedup"
    );
    for r in records {
        // The baseline of the same op and shape, preferring one of the same dtype (cublas_fp16 vs cublas_bf16).
        // Baselines timed the way this record was, or in turn where there are none (graph replays).
        let same_problem = |b: &&BenchRecord| {
            baseline_stem(&b.implementation).is_some()
                && (b.op.as_str(), b.m, b.k, b.n) == (r.op.as_str(), r.m, r.k, r.n)
        };
        let mode = if records
            .iter()
            .filter(same_problem)
            .any(|b| timing_mode(&b.implementation) == timing_mode(&r.implementation))
        {
            timing_mode(&r.implementation)
        } else {
            ""
        };
        let candidates = || {
            records
                .iter()
                .filter(same_problem)
                .filter(move |b| timing_mode(&b.implementation) == mode)
        };
        // The first baseline found, or the fastest of its family (cuBLAS and cuBLASLt).
        fn family(b: &BenchRecord) -> &str {
            baseline_family(baseline_stem(&b.implementation).unwrap_or_default())
        }
        let first = candidates()
            .find(|b| b.dtype == r.dtype)
            .or_else(|| candidates().next());
        let baseline_us = first.map(|f| {
            candidates()
                .filter(|b| b.dtype == f.dtype && family(b) == family(f))
                .map(|b| b.us)
                .fold(f.us, f64::min)
        });
        let speedup = baseline_us.map_or("-".to_string(), |b| format!("{:.2}x", b / r.us));
        println!(
            "{:<8} {:<18} {:<5} {:>5} {:>6} {:>6} {:>12.1} {:>9}",
            r.op, r.implementation, r.dtype, r.m, r.k, r.n, r.us, speedup
        );
    }
    let mut baselines: Vec<String> = Vec::new();
    for b in records.iter().filter(|b| baseline_stem(&b.implementation).is_some()) {
        let name = format!("{} for {}", b.implementation, b.op);
        if !baselines.contains(&name) {
            baselines.push(name);
        }
    }
    if let Some(first) = records.first() {
        println!(
            "speedup = baseline µs / µs at the same op and shape (baselines: {}); device: {}",
            baselines.join(", "),
            first.device
        );
    }
}

/// Median time of one call of `f`, in µs: warm up, then several timed batches of calls.
///
/// Warm-up runs at least 3 calls and 50 ms; each of the 7 batches repeats `f` enough to last ~40 ms, so short calls
/// are not dominated by timer resolution and long ones still give 7 samples.
pub fn time_us(mut f: impl FnMut()) -> f64 {
    const WARMUP: Duration = Duration::from_millis(50);
    const BATCH: Duration = Duration::from_millis(40);
    const BATCHES: usize = 7;
    let start = Instant::now();
    let mut calls = 0u32;
    while calls < 3 || start.elapsed() < WARMUP {
        f();
        calls += 1;
    }
    let per_call = start.elapsed() / calls;
    let reps = (BATCH.as_secs_f64() / per_call.as_secs_f64().max(1e-9)).ceil().max(1.0) as u32;
    let mut samples: Vec<f64> = (0..BATCHES)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / f64::from(reps)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[BATCHES / 2]
}

/// `lowbit bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if let Some(op) = args.op.as_deref() {
        if !["dequant", "linear", "w8a8", "conv"].contains(&op) {
            return Err(Error::invalid("--op", op, "must be dequant, linear, w8a8 or conv"));
        }
    }
    let mut sink = Sink::new(args.json);
    let result = match args.device.as_str() {
        "cpu" => cpu::run(&args, &mut sink),
        d if d == "cuda" || d.starts_with("cuda:") => cuda::run(&args, &mut sink),
        "auto" => match cuda::run(&args, &mut sink) {
            Err(Error::CudaUnavailable(why)) => {
                eprintln!("lowbit bench: CUDA unavailable ({why}); benchmarking the CPU");
                cpu::run(&args, &mut sink)
            }
            other => other,
        },
        other => Err(Error::invalid("--device", other, "must be cpu, cuda, cuda:N or auto")),
    };
    sink.finish();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_compare_with_baselines_timed_the_same_way() {
        assert_eq!(timing_mode("lowbit"), "");
        assert_eq!(timing_mode("lowbit_graph"), "_graph");
        assert_eq!(timing_mode("lowbit_sustained"), "_sustained");
        assert_eq!(timing_mode("lowbit_sustained_silu"), "_sustained");
        assert_eq!(baseline_stem("cublas_fp16_sustained"), Some("cublas_fp16"));
        assert_eq!(baseline_stem("cublaslt_bf16"), Some("cublaslt_bf16"));
        assert_eq!(baseline_stem("lowbit_sustained"), None);
        assert_eq!(baseline_family("cublaslt_fp16"), "cublas_fp16");
        assert_eq!(baseline_family("cublaslt_int8"), "cublaslt_int8");
    }

    #[test]
    fn shapes_parse_or_name_the_rule() {
        assert_eq!(
            parse_shape("1x4096x11008").unwrap(),
            Shape {
                m: 1,
                k: 4096,
                n: 11008
            }
        );
        for bad in ["", "1x2", "1x2x3x4", "0x2x3", "ax2x3", "1x-2x3"] {
            assert!(
                matches!(parse_shape(bad), Err(Error::Invalid { ref tensor, .. }) if tensor == "--shape"),
                "{bad}"
            );
        }
    }

    #[test]
    fn records_serialise_with_the_documented_field_names() {
        let mut r = BenchRecord::new(
            "linear",
            "lowbit",
            "cpu",
            lowbit::DType::F16,
            DEFAULT_SHAPES[0],
            10,
            1.5,
        );
        r.wbits = Some(4);
        r.group = Some(128);
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for key in [
            "op",
            "impl",
            "device",
            "dtype",
            "wbits",
            "group",
            "M",
            "K",
            "N",
            "bytes",
            "us",
            "source_commit",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v.get("conv").is_none());
        assert_eq!(v["impl"], "lowbit");
        assert_eq!(v["dtype"], "f16");
    }
}
