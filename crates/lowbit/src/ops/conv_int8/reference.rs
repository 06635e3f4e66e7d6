//! The int8 convolution in f64: dequantize the input and the weight, convolve, add the bias, requantize. Returns
//! the unrounded output codes `O / S_O + Z_O` after the activation clamp (not clamped to int8): a kernel's code must
//! be within 1 of `round(clamp(ref, −128, 127))` (its fused bias is rounded to f32 once).

use super::ConvInt8Params;
use crate::error::Result;
use crate::formats::block::BlockQuantWeight;
use crate::ops::conv::{check_bias, ConvGeometry};

/// See the module documentation. `x`: `[B, Ci, H, W]` int8 codes.
pub fn conv_int8(
    x: &[i8],
    input: [usize; 4],
    weight: &BlockQuantWeight,
    bias: Option<&[f32]>,
    params: &ConvInt8Params,
) -> Result<Vec<f64>> {
    super::prepare(weight, bias, params)?;
    let geo = ConvGeometry::new(input, weight.shape(), &params.conv)?;
    crate::formats::block::check_len("input", x.len(), input.iter().product(), "B · Ci · H · W")?;
    check_bias(bias, geo.output[1])?;
    let [batch, ci_total, h, w] = input;
    let [_, co_total, out_h, out_w] = geo.output;
    let (kh, kw) = geo.kernel;
    let (ci_g, co_g) = (geo.channels_per_group(), geo.out_channels_per_group());
    let cols = weight.shape().cols();
    let (s_i, z_i) = (params.input.scale as f64, params.input.zero_point as f64);
    let (s_o, z_o) = (params.output.scale as f64, params.output.zero_point as f64);
    let (lo, hi) = params.conv.activation.bounds();
    let mut out = Vec::with_capacity(geo.output.iter().product());
    for b in 0..batch {
        for co in 0..co_total {
            let s_w = weight.scales()[co] as f64;
            let g = co / co_g;
            for oy in 0..out_h {
                for ox in 0..out_w {
                    let mut acc = 0f64;
                    for c in 0..ci_g {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let (Some(iy), Some(ix)) = (geo.input_row(oy, ky), geo.input_col(ox, kx)) else {
                                    continue; // padding is the real zero
                                };
                                let xi = ((b * ci_total + g * ci_g + c) * h + iy) * w + ix;
                                let wi = co * cols + (c * kh + ky) * kw + kx;
                                acc += s_i * (x[xi] as f64 - z_i) * s_w * weight.codes()[wi] as f64;
                            }
                        }
                    }
                    let real = (acc + bias.map_or(0.0, |b| b[co] as f64)).clamp(lo as f64, hi as f64);
                    out.push(real / s_o + z_o);
                }
            }
        }
    }
    Ok(out)
}
