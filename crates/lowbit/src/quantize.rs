//! Round-to-nearest (RTN) quantization of a dense `[N, K]` weight into a [`QuantMatrix`].
//!
//! Per row `n`, per group of `G` inputs (AutoAWQ's `pseudo_quantize_tensor`):
//! - zero point (asymmetric): `s = max(max - min, 1e-5) / (2^bits - 1)`, `z = clamp(-round(min / s), 0, 2^bits - 1)`,
//!   `q = clamp(round(w / s) + z, 0, 2^bits - 1)`;
//! - symmetric: `s = max(absmax, 1e-5) / (2^(bits-1) - 1)`, `q = clamp(round(w / s), -2^(bits-1), 2^(bits-1) - 1)`,
//!   stored as the unsigned code `q + 2^(bits-1)`.
//!
//! `round` is round-half-to-even (`torch.round`). [`RtnArithmetic::AutoAwqF16`] reproduces AutoAWQ 0.2.9 bit for
//! bit: it runs on an fp16 copy of the weight and rounds every PyTorch operation to fp16 the way its CUDA kernels
//! do (compute in f32, round once to fp16). [`RtnArithmetic::F32`] computes in f32, rounding only the scale to
//! `scale_dtype` before the codes are computed from it, so the stored scale is the one the codes were fitted to.

use crate::dtype::{round_to, DType};
use crate::error::{ensure, Error, Result};
use crate::formats::QuantMatrix;
use half::f16;
use rayon::prelude::*;

/// How the RTN arithmetic is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtnArithmetic {
    /// f32 throughout; the scale is rounded to `scale_dtype` before codes are computed.
    F32,
    /// AutoAWQ 0.2.9 on a GPU: every operation rounded to fp16; scales stored as fp16 (`scale_dtype` must be F16).
    AutoAwqF16,
}

/// Parameters of [`quantize_rtn`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtnConfig {
    /// 4 or 8.
    pub bits: u8,
    /// Inputs per group along K; pass K for per-channel (the configs' `-1`).
    pub group_size: usize,
    /// Asymmetric (min/max, zero codes) if true, symmetric (absmax, no zeros) if false.
    pub zero_point: bool,
    /// f32, or AutoAWQ's fp16 emulated exactly.
    pub arithmetic: RtnArithmetic,
    /// The dtype the scales will be stored in (f16, bf16 or f32).
    pub scale_dtype: DType,
}

impl RtnConfig {
    /// AutoAWQ's quantizer: 4-bit, zero point, fp16 arithmetic, fp16 scales.
    pub fn autoawq(group_size: usize) -> Self {
        Self {
            bits: 4,
            group_size,
            zero_point: true,
            arithmetic: RtnArithmetic::AutoAwqF16,
            scale_dtype: DType::F16,
        }
    }
}

/// `torch.clamp(min=1e-5)`'s floor on the quantization range (keeps all-equal groups from a zero scale).
const MIN_RANGE: f32 = 1e-5;

/// Quantizes `weight` (`[N, K]` row-major, `nn.Linear` layout) with round-to-nearest.
///
/// Fails with [`Error::Invalid`] for a bad configuration, a wrong length, a NaN/Inf weight (or one that overflows
/// fp16 in [`RtnArithmetic::AutoAwqF16`]) or a scale that overflows `scale_dtype`.
pub fn quantize_rtn(weight: &[f32], n: usize, k: usize, cfg: &RtnConfig) -> Result<QuantMatrix> {
    ensure(cfg.bits == 4 || cfg.bits == 8, "bits", cfg.bits, "bits must be 4 or 8")?;
    ensure(
        n > 0 && k > 0,
        "weight",
        format!("shape [{n}, {k}]"),
        "N and K must be positive",
    )?;
    ensure(
        weight.len() == n * k,
        "weight",
        format!("{} elements", weight.len()),
        &format!("must hold N*K = {} values", n * k),
    )?;
    ensure(
        cfg.group_size > 0 && k % cfg.group_size == 0,
        "group_size",
        cfg.group_size,
        &format!("group size must divide K = {k}"),
    )?;
    ensure(
        matches!(cfg.scale_dtype, DType::F32 | DType::F16 | DType::Bf16),
        "scale_dtype",
        cfg.scale_dtype,
        "scale dtype must be f32, f16 or bf16",
    )?;
    ensure(
        cfg.arithmetic != RtnArithmetic::AutoAwqF16 || cfg.scale_dtype == DType::F16,
        "scale_dtype",
        cfg.scale_dtype,
        "AutoAWQ fp16 arithmetic stores fp16 scales",
    )?;

    let group = cfg.group_size;
    let groups = k / group;
    let mut codes = vec![0u8; n * k];
    let mut scales = vec![0f32; n * groups];
    let mut zeros = vec![0u8; n * groups];
    codes
        .par_chunks_mut(k)
        .zip(scales.par_chunks_mut(groups))
        .zip(zeros.par_chunks_mut(groups))
        .enumerate()
        .try_for_each(|(row, ((row_codes, row_scales), row_zeros))| -> Result<()> {
            let mut w = weight[row * k..(row + 1) * k].to_vec();
            if cfg.arithmetic == RtnArithmetic::AutoAwqF16 {
                // AutoAWQ quantizes `linear.half()`.
                w.iter_mut().for_each(|x| *x = to_f16(*x));
            }
            if let Some(i) = w.iter().position(|x| !x.is_finite()) {
                return Err(Error::invalid(
                    "weight",
                    format!("{} at [{row}, {i}]", weight[row * k + i]),
                    match cfg.arithmetic {
                        RtnArithmetic::F32 => "weights must be finite",
                        RtnArithmetic::AutoAwqF16 => "weights must be finite in fp16 (|w| <= 65504)",
                    },
                ));
            }
            for g in 0..groups {
                let span = g * group..(g + 1) * group;
                let (scale, zero) = quantize_group(&w[span.clone()], cfg, &mut row_codes[span]);
                ensure(
                    scale.is_finite() && scale > 0.0,
                    "weight",
                    format!("row {row}, group {g}: scale {scale}"),
                    &format!(
                        "the group's range must give a finite, positive {} scale",
                        cfg.scale_dtype
                    ),
                )?;
                row_scales[g] = scale;
                row_zeros[g] = zero;
            }
            Ok(())
        })?;

    Ok(QuantMatrix {
        n,
        k,
        bits: cfg.bits,
        group_size: group,
        codes,
        zeros: cfg.zero_point.then_some(zeros),
        scales,
        scale_dtype: cfg.scale_dtype,
        g_idx: None,
    })
}

/// Rounds to fp16 (nearest, ties to even), as PyTorch does with each fp16 result it computed in f32.
fn to_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantizes one group `w` into `codes`; returns (scale, zero code). The zero code is unused when symmetric.
fn quantize_group(w: &[f32], cfg: &RtnConfig, codes: &mut [u8]) -> (f32, u8) {
    let compat = cfg.arithmetic == RtnArithmetic::AutoAwqF16;
    // The rounding after each elementwise operation: fp16 in AutoAWQ mode, none in f32.
    let r = |x: f32| if compat { to_f16(x) } else { x };
    // `tensor / max_int`: PyTorch's CUDA division by a CPU scalar multiplies by the f32 reciprocal.
    let over_int = |x: f32, d: i32| {
        if compat {
            to_f16(x * (1.0 / d as f32))
        } else {
            round_to(cfg.scale_dtype, x / d as f32)
        }
    };
    let round = f32::round_ties_even;

    if cfg.zero_point {
        let max_code = ((1u32 << cfg.bits) - 1) as f32;
        let (lo, hi) = w.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
        let range = r(hi - lo).max(r(MIN_RANGE));
        let scale = over_int(range, max_code as i32);
        let zero = (-round(r(lo / scale))).clamp(0.0, max_code);
        for (c, &x) in codes.iter_mut().zip(w) {
            *c = (round(r(x / scale)) + zero).clamp(0.0, max_code) as u8;
        }
        // AutoAWQ's packer re-derives each code as round((w_deq + z*s) / s) in fp16; the accumulated fp16 error
        // there is below 0.05 of a step (|q|, |z| <= 15, three roundings of 2^-11 relative), so it returns q
        // unchanged and needs no emulation.
        (scale, zero as u8)
    } else {
        let max_q = ((1i32 << (cfg.bits - 1)) - 1) as f32;
        let min_q = -(1i32 << (cfg.bits - 1)) as f32;
        let absmax = w.iter().fold(0f32, |m, &x| m.max(x.abs()));
        let scale = over_int(absmax.max(r(MIN_RANGE)), max_q as i32);
        let offset = -min_q;
        for (c, &x) in codes.iter_mut().zip(w) {
            *c = (round(r(x / scale)).clamp(min_q, max_q) + offset) as u8;
        }
        (scale, offset as u8)
    }
}
