//! Full-int8 convolution (seed 004's `ConvInt8`): int8 NCHW input with a per-tensor scale and zero point, int8
//! symmetric per-output-channel weights, int32 accumulation, int8 NCHW output with its own scale and zero point.
//!
//! With `I = S_I (I_q − Z_I)`, `W = S_W W_q` and `O_q = O / S_O + Z_O`, the convolution plus bias is
//! ```text
//! O_q = M · (Σ I_q W_q + FusedBias),   M = S_I S_W / S_O,
//! FusedBias = −Z_I Σ W_q + B / (S_I S_W) + Z_O / M
//! ```
//! per output channel: one int32 dot per output, one multiply and one add in f32, a rounding and a clamp. Padding
//! holds `Z_I` (the quantized zero), so the `−Z_I Σ W_q` term, summed over every tap when the weight is prepared,
//! is right at the borders too.
//!
//! Differences from MNN's code in the seed, both to be more accurate: `FusedBias` is kept in f32 instead of
//! truncating `B / (S_I S_W)` and `Z_O / M` to integers, and the result is rounded to nearest (ties away from zero)
//! instead of truncated. The activation (`Conv2dParams::activation`: none/relu/relu6) clamps in the real domain,
//! i.e. to `[round(lo / S_O) + Z_O, round(hi / S_O) + Z_O] ∩ [−128, 127]`.
//!
//! - [`reference`](mod@reference): dequantize, convolve and add the bias in f64, requantize: the ideal result.
//! - [`cpu`]: [`ConvInt8Cpu`], the integer kernel (rayon).
//! - [`cuda`]: [`ConvInt8Cuda`], the same integer dot and epilogue on the GPU (dp4a implicit GEMM).

pub mod cpu;
pub mod cuda;
pub mod reference;

pub use cpu::ConvInt8Cpu;
pub use cuda::ConvInt8Cuda;

use crate::error::{Error, Result};
use crate::formats::block::{BlockBits, BlockQuantWeight};
use crate::ops::conv::{check_bias, Conv2dParams};

/// A per-tensor int8 quantization: `real = scale · (q − zero_point)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Int8Quant {
    pub scale: f32,
    pub zero_point: i8,
}

impl Int8Quant {
    fn validate(&self, tensor: &str) -> Result<()> {
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(Error::invalid(
                tensor,
                format!("scale {}", self.scale),
                "must be finite and positive",
            ));
        }
        Ok(())
    }
}

/// The hyper-parameters of an int8 convolution: the geometry and activation, and the input and output quantization.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvInt8Params {
    pub conv: Conv2dParams,
    pub input: Int8Quant,
    pub output: Int8Quant,
}

/// The per-output-channel epilogue `O_q = clamp(round(m · acc + fused_bias), lo, hi)` (`fused_bias` here already
/// multiplied by `m`), prepared once from the weight, bias and quantization.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Epilogue {
    /// `M = S_I S_W / S_O` per output channel.
    pub m: Vec<f32>,
    /// `M · FusedBias` per output channel (f32).
    pub bias: Vec<f32>,
    /// Quantized clamp bounds (activation ∩ int8).
    pub lo: i32,
    pub hi: i32,
}

impl Int8Epilogue {
    /// The output code of channel `co` for the exact int32 dot `acc`.
    #[inline]
    pub fn apply(&self, co: usize, acc: i32) -> i8 {
        let v = (self.m[co] * acc as f32 + self.bias[co]).round();
        v.clamp(self.lo as f32, self.hi as f32) as i8
    }
}

/// Checks that `weight` is what the int8 convolution takes (8-bit, symmetric, one scale per output channel) and
/// prepares the epilogue.
pub fn prepare(weight: &BlockQuantWeight, bias: Option<&[f32]>, params: &ConvInt8Params) -> Result<Int8Epilogue> {
    let shape = weight.shape();
    if weight.bits() != BlockBits::Int8 {
        return Err(Error::invalid(
            "weight",
            "int4 codes",
            "the int8 convolution takes int8 weights",
        ));
    }
    if shape.blocks() != 1 {
        return Err(Error::invalid(
            "weight",
            format!("{} blocks per output channel", shape.blocks()),
            "the int8 convolution takes one scale per output channel",
        ));
    }
    if !weight.is_symmetric() {
        return Err(Error::invalid(
            "weight offsets",
            "non-zero offsets",
            "the int8 convolution takes symmetric weights (offset 0)",
        ));
    }
    // Every tap adds at most 128 · 127 to the int32 dot.
    const MAX_TAPS: usize = (i32::MAX as usize) / (128 * 127);
    if shape.cols() > MAX_TAPS {
        return Err(Error::invalid(
            "weight",
            format!("{} taps per output (Ci/groups · Kh · Kw)", shape.cols()),
            format!("at most {MAX_TAPS}, or the int32 accumulator could overflow"),
        ));
    }
    params.conv.validate(shape.rows)?;
    params.input.validate("input quantization")?;
    params.output.validate("output quantization")?;
    check_bias(bias, shape.rows)?;
    let (s_i, z_i) = (params.input.scale as f64, params.input.zero_point as f64);
    let (s_o, z_o) = (params.output.scale as f64, params.output.zero_point as f64);
    let cols = shape.cols();
    let mut m = Vec::with_capacity(shape.rows);
    let mut fused = Vec::with_capacity(shape.rows);
    for (co, row) in weight.codes().chunks_exact(cols).enumerate() {
        let s_w = weight.scales()[co] as f64;
        let w_sum: i64 = row.iter().map(|&q| q as i64).sum();
        let mc = s_i * s_w / s_o;
        let b = bias.map_or(0.0, |b| b[co] as f64);
        // M · FusedBias = M (−Z_I ΣW) + B / S_O + Z_O, formed in f64 and rounded once to f32.
        m.push(mc as f32);
        fused.push((mc * (-z_i * w_sum as f64) + b / s_o + z_o) as f32);
    }
    if let Some(co) = m.iter().position(|v| !v.is_finite() || *v == 0.0) {
        return Err(Error::invalid(
            "quantization",
            format!("S_I S_W / S_O = {} for output channel {co}", m[co]),
            "must be a finite, non-zero f32",
        ));
    }
    let (lo, hi) = params.conv.activation.bounds();
    let q = |v: f32| -> i32 {
        if v.is_infinite() {
            if v > 0.0 {
                127
            } else {
                -128
            }
        } else {
            ((v as f64 / s_o).round() + z_o).clamp(-128.0, 127.0) as i32
        }
    };
    Ok(Int8Epilogue {
        m,
        bias: fused,
        lo: q(lo),
        hi: q(hi),
    })
}
