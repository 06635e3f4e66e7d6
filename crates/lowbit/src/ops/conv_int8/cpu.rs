//! [`ConvInt8Cpu`]: the int8 convolution on the CPU. Each output is one exact int32 dot of input codes (padding
//! reads `Z_I`) and weight codes, then the per-channel epilogue of [`super::Int8Epilogue`].
//!
//! Implicit GEMM by tiles: for a (batch, group, tile of `PIXELS` output pixels) task, the tile's input patches are
//! gathered once into a `[PIXELS][taps]` i16 panel (im2col of the tile only, so memory stays small), then every
//! output channel of the group is one contiguous i16 × i16 dot per pixel, which the compiler turns into SIMD
//! multiply-adds. Rayon over the tasks.

use super::{prepare, ConvInt8Params, Int8Epilogue};
use crate::error::Result;
use crate::formats::block::{check_len, BlockQuantWeight};
use crate::ops::conv::ConvGeometry;
use rayon::prelude::*;

/// Output pixels per task (the im2col panel holds `PIXELS · taps` i16 values).
const PIXELS: usize = 64;

/// An int8 convolution prepared once (weight checked, epilogue folded) for any input shape.
#[derive(Debug, Clone)]
pub struct ConvInt8Cpu {
    weight: BlockQuantWeight,
    /// The weight codes widened to i16 once (the dot multiplies i16 by i16: one SIMD multiply-add per pair).
    weights: Vec<i16>,
    params: ConvInt8Params,
    epilogue: Int8Epilogue,
}

impl ConvInt8Cpu {
    /// Validates `weight` (int8, symmetric, one scale per output channel), `bias` (Co values) and `params`.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>, params: ConvInt8Params) -> Result<Self> {
        let epilogue = prepare(weight, bias, &params)?;
        Ok(Self {
            weight: weight.clone(),
            weights: weight.codes().iter().map(|&q| q as i16).collect(),
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
        let [batch, ci_total, h, w] = input;
        let [_, co_total, out_h, out_w] = geo.output;
        let (kh, kw) = geo.kernel;
        let (ci_g, co_g, groups) = (geo.channels_per_group(), geo.out_channels_per_group(), geo.groups);
        let taps = ci_g * kh * kw;
        let pixels = out_h * out_w;
        let tiles = pixels.div_ceil(PIXELS);
        let z_i = self.params.input.zero_point as i16;
        // One task per (batch, group, pixel tile); each returns its outputs [co_g][tile pixels].
        let results: Vec<(usize, usize, usize, Vec<i8>)> = (0..batch * groups * tiles)
            .into_par_iter()
            .map(|task| {
                let (b, rest) = (task / (groups * tiles), task % (groups * tiles));
                let (g, tile) = (rest / tiles, rest % tiles);
                let p0 = tile * PIXELS;
                let np = PIXELS.min(pixels - p0);
                let mut panel = vec![z_i; np * taps]; // padding taps keep Z_I
                for (pi, patch) in panel.chunks_exact_mut(taps).enumerate() {
                    let (oy, ox) = ((p0 + pi) / out_w, (p0 + pi) % out_w);
                    for c in 0..ci_g {
                        let xc = &x[(b * ci_total + g * ci_g + c) * h * w..][..h * w];
                        for ky in 0..kh {
                            let Some(iy) = geo.input_row(oy, ky) else { continue };
                            for kx in 0..kw {
                                if let Some(ix) = geo.input_col(ox, kx) {
                                    patch[(c * kh + ky) * kw + kx] = xc[iy * w + ix] as i16;
                                }
                            }
                        }
                    }
                }
                let mut out = vec![0i8; co_g * np];
                for (j, o_row) in out.chunks_exact_mut(np).enumerate() {
                    let co = g * co_g + j;
                    let wrow = &self.weights[co * taps..(co + 1) * taps];
                    for (o, patch) in o_row.iter_mut().zip(panel.chunks_exact(taps)) {
                        let acc: i32 = patch.iter().zip(wrow).map(|(&a, &b)| a as i32 * b as i32).sum();
                        *o = self.epilogue.apply(co, acc);
                    }
                }
                (b, g, p0, out)
            })
            .collect();
        for (b, g, p0, tile) in results {
            let np = tile.len() / co_g;
            for (j, row) in tile.chunks_exact(np).enumerate() {
                let co = g * co_g + j;
                out[(b * co_total + co) * pixels + p0..][..np].copy_from_slice(row);
            }
        }
        Ok(())
    }
}
