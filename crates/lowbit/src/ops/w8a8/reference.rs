//! The ground truth of W8A8: the online quantizer written out scalar from formats.md, and both GEMMs computed in
//! f64 from the dequantized operands (so the per-block decomposition of the fast kernels is checked, not assumed).

use super::{
    check_activation_input, check_linear, check_smoothquant_activations, check_smoothquant_weight, ActivationQuant,
    QuantizedActivations,
};
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::formats::block::{check_range, BlockQuantWeight};

/// The online activation quantizer, one element at a time, literally as formats.md states it (f32 arithmetic).
/// The CPU quantizer must agree with it bit for bit.
pub fn quantize_activations<T: Float>(
    x: &[T],
    m: usize,
    k: usize,
    block_size: usize,
    mode: ActivationQuant,
) -> Result<QuantizedActivations> {
    check_activation_input("activations", x.len(), m, k, block_size)?;
    let mut codes = Vec::with_capacity(m * k);
    let (mut scales, mut offsets) = (Vec::new(), Vec::new());
    for r in 0..m {
        for start in (0..k).step_by(block_size) {
            let block: Vec<f32> = x[r * k + start..r * k + (start + block_size).min(k)]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            if let Some(i) = block.iter().position(|v| !v.is_finite()) {
                return Err(Error::invalid(
                    "activations",
                    format!("{} at [{r}, {}]", block[i], start + i),
                    "activations must be finite",
                ));
            }
            let (scale, offset, q_lo, q_hi) = match mode {
                ActivationQuant::Asymmetric => {
                    let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let min = block.iter().copied().fold(f32::INFINITY, f32::min);
                    check_range("activations", r, start / block_size, min, max)?;
                    let scale = (max - min) / 255.0;
                    if scale >= f32::MIN_POSITIVE {
                        (scale, max - 127.0 * scale, -128.0, 127.0)
                    } else {
                        (1.0, max, -128.0, 127.0)
                    }
                }
                ActivationQuant::Symmetric => {
                    let abs_max = block.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let scale = abs_max / 127.0;
                    (if scale >= f32::MIN_POSITIVE { scale } else { 1.0 }, 0.0, -127.0, 127.0)
                }
            };
            codes.extend(
                block
                    .iter()
                    .map(|&v| ((v - offset) / scale).round().clamp(q_lo, q_hi) as i8),
            );
            scales.push(scale);
            offsets.push(offset);
        }
    }
    QuantizedActivations::from_parts(m, k, block_size, codes, scales, offsets)
}

/// Per-block W8A8 in f64: `C[m, n] = Σ_k (sA·a_q + oA)(sB·b_q + oB) + bias[n]`, each factor dequantized in f64
/// with its own block's parameters (the weight's blocks: the activations', or one per row). Returns `[M, N]`.
pub fn block_w8a8(a: &QuantizedActivations, weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Vec<f64>> {
    check_linear(weight, bias, a.k(), a.block_size(), "per-block W8A8")?;
    let a_deq = dequantize_f64(a.codes(), a.k(), a.block_size(), a.scales(), a.offsets());
    let w_block = weight.shape().block_channels;
    let w_deq = dequantize_f64(weight.codes(), a.k(), w_block, weight.scales(), weight.offsets());
    Ok(matmul_nt(&a_deq, &w_deq, a.k(), bias))
}

/// SmoothQuant in f64: `y[m, n] = s_tok[m] · s_ch[n] · Σ_k a[m, k] · w[n, k] + bias[n]`. Returns `[M, N]`.
pub fn smoothquant(a: &QuantizedActivations, weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Vec<f64>> {
    check_smoothquant_weight(weight)?;
    check_smoothquant_activations(a)?;
    check_linear(weight, bias, a.k(), a.block_size(), "SmoothQuant")?;
    let k = a.k();
    let a_deq = dequantize_f64(a.codes(), k, k, a.scales(), a.offsets());
    let w_deq = dequantize_f64(weight.codes(), k, k, weight.scales(), weight.offsets());
    Ok(matmul_nt(&a_deq, &w_deq, k, bias))
}

/// `codes[r, c] · scale[r, b] + offset[r, b]` in f64 for rows of `k` codes in blocks of `block`.
fn dequantize_f64(codes: &[i8], k: usize, block: usize, scales: &[f32], offsets: &[f32]) -> Vec<f64> {
    let blocks = k.div_ceil(block);
    codes
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let p = i / k * blocks + i % k / block;
            q as f64 * scales[p] as f64 + offsets[p] as f64
        })
        .collect()
}

/// `a [M, K] · w [N, K]^T + bias` in f64.
fn matmul_nt(a: &[f64], w: &[f64], k: usize, bias: Option<&[f32]>) -> Vec<f64> {
    a.chunks_exact(k)
        .flat_map(|a_row| {
            w.chunks_exact(k).enumerate().map(move |(j, w_row)| {
                let dot: f64 = a_row.iter().zip(w_row).map(|(x, y)| x * y).sum();
                dot + bias.map_or(0.0, |b| b[j] as f64)
            })
        })
        .collect()
}
