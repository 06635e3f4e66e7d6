//! The f64 reference convolution: weights dequantized in f64, direct loops, f64 accumulation.

use super::{check_bias, Conv2dParams, ConvGeometry};
use crate::error::Result;
use crate::formats::block::{check_len, BlockQuantWeight};

/// Convolves NCHW `x` of shape `input` (`[B, Ci, H, W]`) with `weight` (`[Co, Ci/groups, Kh, Kw]`), adds `bias`
/// (`[Co]`) and applies the activation clamp; returns the NCHW output `[B, Co, OH, OW]` in f64.
pub fn conv2d(
    x: &[f32],
    input: [usize; 4],
    weight: &BlockQuantWeight,
    bias: Option<&[f32]>,
    params: &Conv2dParams,
) -> Result<Vec<f64>> {
    let geo = ConvGeometry::new(input, weight.shape(), params)?;
    check_len("input", x.len(), input.iter().product(), "B · Ci · H · W")?;
    check_bias(bias, geo.output[1])?;

    let [batch, ci_total, h, w] = input;
    let [_, co_total, out_h, out_w] = geo.output;
    let (kh, kw) = geo.kernel;
    let (ci_g, co_g) = (geo.channels_per_group(), geo.out_channels_per_group());
    let shape = *weight.shape();
    let dense: Vec<f64> = (0..co_total * shape.cols())
        .map(|i| {
            let (co, col) = (i / shape.cols(), i % shape.cols());
            let p = weight.param_index(co, col / shape.taps());
            weight.codes()[i] as f64 * weight.scales()[p] as f64 + weight.offsets()[p] as f64
        })
        .collect();
    let (lo, hi) = params.activation.bounds();
    let (lo, hi) = (lo as f64, hi as f64);

    let mut out = Vec::with_capacity(geo.output.iter().product());
    for b in 0..batch {
        for co in 0..co_total {
            let group = co / co_g;
            for oy in 0..out_h {
                for ox in 0..out_w {
                    let mut acc = bias.map_or(0.0, |bias| bias[co] as f64);
                    for c in 0..ci_g {
                        let ci = group * ci_g + c;
                        for ky in 0..kh {
                            let Some(iy) = geo.input_row(oy, ky) else { continue };
                            for kx in 0..kw {
                                let Some(ix) = geo.input_col(ox, kx) else { continue };
                                let xv = x[((b * ci_total + ci) * h + iy) * w + ix] as f64;
                                acc += xv * dense[((co * ci_g + c) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    // Written out (not `max`/`min`) so a NaN passes through instead of becoming a bound.
                    out.push(if acc < lo {
                        lo
                    } else if acc > hi {
                        hi
                    } else {
                        acc
                    });
                }
            }
        }
    }
    Ok(out)
}
