//! Inputs for tests and benchmarks, shared by the test suites, `lowbit bench` and `lowbit demo` (not a stable API).
//!
//! - [`SplitMix64`]: a tiny seeded PRNG (the project uses no `rand` crate), so every run draws the same inputs.
//! - [`random_quant`]: a random [`QuantMatrix`] as a [`QuantSpec`] describes it.
//! - [`TempDir`]: a fresh directory removed on drop.
//! - [`cuda_device`]: the GPU for GPU tests, or a printed reason to skip them.

use crate::dtype::{round_to, DType};
use crate::formats::QuantMatrix;
use std::path::{Path, PathBuf};

/// splitmix64 (Steele, Lea, Flood 2014): 64-bit state, full period, good enough for test inputs.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is negligible for test-sized `n`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform integer in `lo..=hi`.
    pub fn int(&mut self, lo: i32, hi: i32) -> i32 {
        lo + self.below((hi - lo + 1) as u64) as i32
    }

    /// Uniform in `[0, 1)`, from the top 24 bits (every value exact in f32).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in `[-1, 1)`, never exactly zero (a zero input would hide a missing term).
    pub fn signed_unit(&mut self) -> f32 {
        let v = (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        if v == 0.0 {
            0.5
        } else {
            v
        }
    }

    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// One of `items`, uniformly.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` uniformly (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// Zero codes of a [`random_quant`] weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Zeros {
    /// `zeros: None`.
    Symmetric,
    /// Every zero code this value.
    All(u8),
    /// Uniform in `lo..=hi`.
    Random(u8, u8),
}

/// Scales of a [`random_quant`] weight; one in four is negative unless the variant says otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scales {
    /// `±2^e`, `e` uniform in `min_exp..=max_exp`: exact in f32, f16 and bf16, so with small integer operands
    /// every product and (short) sum is exact — the exact-integer test mode.
    PowerOfTwo { min_exp: i32, max_exp: i32 },
    /// `±2^u`, `u` uniform in `[min_exp, max_exp)`, rounded to the scale dtype: any value of it, over decades.
    LogUniform { min_exp: f32, max_exp: f32 },
    /// Uniform in `[lo, hi)` (never negated), rounded to the scale dtype: checkpoint-like scales.
    Uniform { lo: f32, hi: f32 },
}

/// How [`random_quant`] draws a weight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantSpec {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// 4 or 8.
    pub bits: u8,
    /// Inputs per group along K (must divide K).
    pub group_size: usize,
    pub zeros: Zeros,
    pub scales: Scales,
    /// What the scales are stored in (their values are exact in it).
    pub scale_dtype: DType,
    /// Act-order: `g_idx` a random permutation of the trivial `k / group_size`, so every group keeps its size.
    pub act_order: bool,
}

impl QuantSpec {
    /// An `[n, k]` weight with random zero codes over the whole range, log-uniform f16 scales in about
    /// `[2^-9, 2)`, no act-order.
    pub fn new(n: usize, k: usize, bits: u8, group_size: usize) -> Self {
        QuantSpec {
            n,
            k,
            bits,
            group_size,
            zeros: Zeros::Random(0, ((1u16 << bits) - 1) as u8),
            scales: Scales::LogUniform {
                min_exp: -9.0,
                max_exp: 1.0,
            },
            scale_dtype: DType::F16,
            act_order: false,
        }
    }
}

/// A random weight as `spec` describes it (valid: it passes [`QuantMatrix::validate`]). The first `2^bits` codes
/// run through every value, so a small weight still exercises every code.
pub fn random_quant(rng: &mut SplitMix64, spec: &QuantSpec) -> QuantMatrix {
    let s = spec;
    let levels = 1u64 << s.bits;
    let codes = (0..s.n * s.k)
        .map(|i| {
            if (i as u64) < levels {
                i as u8
            } else {
                rng.below(levels) as u8
            }
        })
        .collect();
    let groups = s.k / s.group_size;
    let zeros = match s.zeros {
        Zeros::Symmetric => None,
        Zeros::All(z) => Some(vec![z; s.n * groups]),
        Zeros::Random(lo, hi) => Some(
            (0..s.n * groups)
                .map(|_| lo + rng.below((hi - lo) as u64 + 1) as u8)
                .collect(),
        ),
    };
    let scales = (0..s.n * groups)
        .map(|_| draw_scale(rng, s.scales, s.scale_dtype))
        .collect();
    let g_idx = s.act_order.then(|| {
        let mut g: Vec<u32> = (0..s.k).map(|k| (k / s.group_size) as u32).collect();
        rng.shuffle(&mut g);
        g
    });
    let q = QuantMatrix {
        n: s.n,
        k: s.k,
        bits: s.bits,
        group_size: s.group_size,
        codes,
        zeros,
        scales,
        scale_dtype: s.scale_dtype,
        g_idx,
    };
    q.validate().expect("random_quant: the spec describes a valid weight");
    q
}

/// One scale as `scales` describes it, held as an exact value of `dtype`.
fn draw_scale(rng: &mut SplitMix64, scales: Scales, dtype: DType) -> f32 {
    // One in four negative: kernels must not assume positive scales. (Drawn before the magnitude.)
    let sign = |rng: &mut SplitMix64| if rng.below(4) == 0 { -1.0 } else { 1.0 };
    match scales {
        Scales::PowerOfTwo { min_exp, max_exp } => sign(rng) * 2f32.powi(rng.int(min_exp, max_exp)),
        Scales::LogUniform { min_exp, max_exp } => {
            round_to(dtype, sign(rng) * 2f32.powf(rng.uniform(min_exp, max_exp)))
        }
        Scales::Uniform { lo, hi } => round_to(dtype, rng.uniform(lo, hi)),
    }
}

/// A fresh empty directory under the system temp dir, removed (with its contents) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `lowbit-<tag>-<pid>-<counter>-<nanos>` (unique across threads and concurrent test binaries).
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("lowbit-{tag}-{}-{n}-{nanos}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempDir(dir)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    pub fn path(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }

    /// Names of the entries in the directory, sorted (temporaries start with a dot and would show here).
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap_or_else(|e| panic!("{}: {e}", self.0.display()))
            .map(|e| e.expect("directory entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GPU 0, opened once per process (so kernels compile once per test binary), or `None` after printing
/// `skipped: <why>` when there is no usable GPU: GPU tests call this first and return on `None`.
pub fn cuda_device() -> Option<std::sync::Arc<crate::cuda::CudaDevice>> {
    use std::sync::{Arc, OnceLock};
    static DEVICE: OnceLock<Result<Arc<crate::cuda::CudaDevice>, String>> = OnceLock::new();
    match DEVICE.get_or_init(|| crate::cuda::CudaDevice::new(0).map_err(|e| e.to_string())) {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            println!("skipped: {why}");
            None
        }
    }
}
