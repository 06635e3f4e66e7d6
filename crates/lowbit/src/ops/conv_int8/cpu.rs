//! [`ConvInt8Cpu`]: the int8 convolution on the CPU. Each output is one exact int32 dot of input codes (padding
//! reads `Z_I`) and weight codes, then the per-channel epilogue of [`super::Int8Epilogue`]. Rayon over (batch, output
//! channel) planes.

use super::{prepare, ConvInt8Params, Int8Epilogue};
use crate::error::Result;
use crate::formats::block::{check_len, BlockQuantWeight};
use crate::ops::conv::ConvGeometry;
use rayon::prelude::*;

/// An int8 convolution prepared once (weight checked, epilogue folded) for any input shape.
#[derive(Debug, Clone)]
pub struct ConvInt8Cpu {
    weight: BlockQuantWeight,
    params: ConvInt8Params,
    epilogue: Int8Epilogue,
}

impl ConvInt8Cpu {
    /// Validates `weight` (int8, symmetric, one scale per output channel), `bias` (Co values) and `params`.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>, params: ConvInt8Params) -> Result<Self> {
        let epilogue = prepare(weight, bias, &params)?;
        Ok(Self {
            weight: weight.clone(),
            params,
            epilogue,
        })
    }

    /// The output shape `[B, Co, OH, OW]` for `input` `[B, Ci, H, W]`, or the error that input would give.
    pub fn output_shape(&self, input: [usize; 4]) -> Result<[usize; 4]> {
        Ok(ConvGeometry::new(input, self.weight.shape(), &self.params.conv)?.output)
    }

    /// `out = ConvInt8(x)` for int8 NCHW `x` of shape `input`; `out` must hold `B · Co · OH · OW` codes.
    pub fn forward(&self, x: &[i8], input: [usize; 4], out: &mut [i8]) -> Result<()> {
        let geo = ConvGeometry::new(input, self.weight.shape(), &self.params.conv)?;
        check_len("input", x.len(), input.iter().product(), "B · Ci · H · W")?;
        check_len("output", out.len(), geo.output.iter().product(), "B · Co · OH · OW")?;
        let [_, ci_total, h, w] = input;
        let [_, co_total, out_h, out_w] = geo.output;
        let (kh, kw) = geo.kernel;
        let (ci_g, co_g) = (geo.channels_per_group(), geo.out_channels_per_group());
        let cols = self.weight.shape().cols();
        let z_i = self.params.input.zero_point as i32;
        out.par_chunks_mut(out_h * out_w).enumerate().for_each(|(plane, o)| {
            let (b, co) = (plane / co_total, plane % co_total);
            let g = co / co_g;
            let wrow = &self.weight.codes()[co * cols..(co + 1) * cols];
            for oy in 0..out_h {
                for ox in 0..out_w {
                    let mut acc = 0i32;
                    for c in 0..ci_g {
                        let xc = &x[((b * ci_total + g * ci_g + c) * h) * w..][..h * w];
                        for ky in 0..kh {
                            let iy = (oy * geo.stride.0 + ky * geo.dilation.0) as isize - geo.padding.0 as isize;
                            for kx in 0..kw {
                                let ix = (ox * geo.stride.1 + kx * geo.dilation.1) as isize - geo.padding.1 as isize;
                                let v = if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                    z_i // padding holds the quantized zero
                                } else {
                                    xc[iy as usize * w + ix as usize] as i32
                                };
                                acc += v * wrow[(c * kh + ky) * kw + kx] as i32;
                            }
                        }
                    }
                    o[oy * out_w + ox] = self.epilogue.apply(co, acc);
                }
            }
        });
        Ok(())
    }
}
