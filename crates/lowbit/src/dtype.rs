//! Element types: the storage dtypes lowbit reads and writes, and the float types activations come in.

use half::{bf16, f16};

/// Storage dtype of a tensor (safetensors names in [`DType::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DType {
    F32,
    F16,
    Bf16,
    I32,
    I8,
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::I8 | DType::U8 => 1,
        }
    }

    /// The short name used in CLI output and bench records (`f16`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
        }
    }

    /// Whether this is a floating-point dtype.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A floating-point element type activations and outputs come in: `f32`, `f16` or `bf16`.
///
/// Kernels compute in f32 and convert at the edges, so this is all they need of the type.
pub trait Float: Copy + Send + Sync + Default + PartialEq + std::fmt::Debug + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    /// Rounds to nearest, ties to even.
    fn from_f32(v: f32) -> Self;

    /// `dst[i] = Self::from_f32(src[i])` for equal-length slices; types with bulk hardware conversion override it.
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "from_f32_slice: lengths differ");
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
}

impl Float for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    /// Eight values per instruction where the CPU has F16C (the same round-to-nearest-even as `from_f32`).
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "from_f32_slice: lengths differ");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: the CPU has F16C (checked just above), the only feature the function is compiled for.
            return unsafe { f32_to_f16_f16c(src, dst) };
        }
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(s);
        }
    }
}

/// `dst[i] = f16::from_f32(src[i])` with F16C's `vcvtps2ph` (round to nearest even, exactly as `half` rounds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f32_to_f16_f16c(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let whole = src.len() / 8 * 8;
    for (s, d) in src[..whole].chunks_exact(8).zip(dst[..whole].chunks_exact_mut(8)) {
        // Both chunks hold exactly 8 elements: 32 bytes read, 16 bytes written.
        let halves = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
        _mm_storeu_si128(d.as_mut_ptr().cast(), halves);
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = f16::from_f32(s);
    }
}

impl Float for bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Rounds `v` to the precision of `dtype` (identity for f32), returning it as f32.
///
/// Scales are kept as f32 inside lowbit; this is how they keep exactly the value their stored dtype can hold.
pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}
