//! The CPU convolution: implicit GEMM over tiles, dequantizing weights inside each tile.
//!
//! Per batch item and group the convolution is a GEMM `out[co, p] = Σ_k W[co, k] · X[k, p]` with
//! `k = (ci, ky, kx)` and `p = (oy, ox)`. Work is split into tiles of output channels × output pixels; a tile
//! packs its slice of `X` (im2col of just those pixels; a plain copy for 1×1 stride-1 unpadded convolutions, where
//! `X` is the input itself), then for each micro-panel of `MR` output channels dequantizes that panel's int4/int8
//! codes to f32 (`q · scale + offset`) and runs an `MR × NR` register-blocked micro-kernel over all of `K`.
//! The dense f32 weight never exists as a whole; at most `MR · K` of it at a time per thread.

use super::{check_bias, Conv2dParams, ConvGeometry};
use crate::dtype::Float;
use crate::error::Result;
use crate::formats::block::{check_len, BlockQuantWeight, BlockShape};
use rayon::prelude::*;

/// Output channels per micro-tile.
const MR: usize = 6;
/// Output pixels per micro-tile (two AVX registers of f32).
const NR: usize = 16;
/// Budget for one packed input tile (`K × pixels` f32, 256 KiB), so it stays in L2 while every panel reads it.
const INPUT_TILE_FLOATS: usize = 64 * 1024;
/// Upper bound on the pixels of a tile, so even tiny `K` leaves tiles for every thread.
const MAX_TILE_PIXELS: usize = 256;

/// A convolution prepared for the CPU: weights repacked once into micro-panels, bias and parameters checked.
#[derive(Debug, Clone)]
pub struct Conv2dCpu {
    shape: BlockShape,
    params: Conv2dParams,
    /// Micro-panels per group: `⌈Co/groups / MR⌉`.
    panels_per_group: usize,
    /// Codes `[groups][panels][K][MR]`; rows past a group's last output channel are zero.
    panel_codes: Vec<i8>,
    /// Block scales `[groups][panels][blocks][MR]` (zero for padding rows).
    panel_scales: Vec<f32>,
    /// Block offsets, same layout as `panel_scales`.
    panel_offsets: Vec<f32>,
    /// `[Co]`, zeros when there is no bias.
    bias: Vec<f32>,
}

impl Conv2dCpu {
    /// Prepares `weight` (`[Co, Ci/groups, Kh, Kw]`) with an optional `bias` (`[Co]`) for repeated use.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>, params: Conv2dParams) -> Result<Self> {
        let shape = *weight.shape();
        params.validate(shape.rows)?;
        check_bias(bias, shape.rows)?;
        let co_g = shape.rows / params.groups;
        let panels_per_group = co_g.div_ceil(MR);
        let (cols, blocks) = (shape.cols(), shape.blocks());
        let panels = params.groups * panels_per_group;
        let mut panel_codes = vec![0i8; panels * cols * MR];
        let mut panel_scales = vec![0f32; panels * blocks * MR];
        let mut panel_offsets = vec![0f32; panels * blocks * MR];
        for co in 0..shape.rows {
            let (g, local) = (co / co_g, co % co_g);
            let (panel, lane) = (g * panels_per_group + local / MR, local % MR);
            for (c, &q) in weight.codes()[co * cols..(co + 1) * cols].iter().enumerate() {
                panel_codes[(panel * cols + c) * MR + lane] = q;
            }
            for b in 0..blocks {
                panel_scales[(panel * blocks + b) * MR + lane] = weight.scales()[co * blocks + b];
                panel_offsets[(panel * blocks + b) * MR + lane] = weight.offsets()[co * blocks + b];
            }
        }
        Ok(Self {
            shape,
            params,
            panels_per_group,
            panel_codes,
            panel_scales,
            panel_offsets,
            bias: bias.map_or_else(|| vec![0.0; shape.rows], <[f32]>::to_vec),
        })
    }

    /// The output shape `[B, Co, OH, OW]` for an input of shape `[B, Ci, H, W]`, or why there is none.
    pub fn output_shape(&self, input: [usize; 4]) -> Result<[usize; 4]> {
        Ok(ConvGeometry::new(input, &self.shape, &self.params)?.output)
    }

    /// Convolves NCHW `x` of shape `input`; returns the NCHW output (shape from [`Conv2dCpu::output_shape`]).
    pub fn forward<T: Float>(&self, x: &[T], input: [usize; 4]) -> Result<Vec<T>> {
        let output = self.output_shape(input)?;
        let mut out = vec![T::default(); output.iter().product()];
        self.forward_into(x, input, &mut out)?;
        Ok(out)
    }

    /// Like [`Conv2dCpu::forward`], writing into `out` (which must hold exactly the output); returns its shape.
    pub fn forward_into<T: Float>(&self, x: &[T], input: [usize; 4], out: &mut [T]) -> Result<[usize; 4]> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params)?;
        check_len("input", x.len(), input.iter().product(), "B · Ci · H · W")?;
        check_len("output", out.len(), geo.output.iter().product(), "B · Co · OH · OW")?;
        let plan = TilePlan::new(&geo, self.shape.cols());
        let pixels = geo.out_pixels();
        let (groups, co_g) = (geo.groups, geo.out_channels_per_group());
        let group_input = geo.channels_per_group() * input[2] * input[3];

        // Each (batch, group) owns a contiguous run of output rows, and each channel chunk of it a contiguous
        // sub-run, so both levels split `out` safely; pixel tiles inside a chunk are computed in parallel and
        // copied in.
        out.par_chunks_mut(co_g * pixels)
            .enumerate()
            .for_each(|(bg, out_group)| {
                let x_group = &x[bg * group_input..(bg + 1) * group_input];
                let g = bg % groups;
                out_group
                    .par_chunks_mut(plan.co_chunk * pixels)
                    .enumerate()
                    .for_each(|(chunk, out_rows)| {
                        let rows = (chunk * plan.co_chunk)..(chunk * plan.co_chunk + out_rows.len() / pixels);
                        let tiles: Vec<Vec<f32>> = (0..plan.pixel_tiles)
                            .into_par_iter()
                            .map(|t| {
                                let p = t * plan.tile_pixels..((t + 1) * plan.tile_pixels).min(pixels);
                                self.tile(&geo, x_group, g, rows.clone(), p)
                            })
                            .collect();
                        for (t, tile) in tiles.iter().enumerate() {
                            let width = tile.len() / rows.len();
                            for (r, tile_row) in tile.chunks_exact(width).enumerate() {
                                let start = r * pixels + t * plan.tile_pixels;
                                for (o, &v) in out_rows[start..start + width].iter_mut().zip(tile_row) {
                                    *o = T::from_f32(v);
                                }
                            }
                        }
                    });
            });
        Ok(geo.output)
    }

    /// One output tile of group `g`: output channels `rows` (local to the group, starting on a panel boundary)
    /// × output pixels `pixels`; returns it row-major in f32 with bias and activation applied.
    fn tile<T: Float>(
        &self,
        geo: &ConvGeometry,
        x_group: &[T],
        g: usize,
        rows: std::ops::Range<usize>,
        pixels: std::ops::Range<usize>,
    ) -> Vec<f32> {
        let cols = self.shape.cols();
        let width = pixels.len();
        let mut packed_x = vec![0f32; width.div_ceil(NR) * cols * NR];
        pack_input_tile(geo, x_group, pixels.start, width, &mut packed_x);
        let mut panel_weights = vec![0f32; cols * MR];
        let mut tile = vec![0f32; rows.len() * width];
        let (lo, hi) = self.params.activation.bounds();
        let co_g = geo.out_channels_per_group();
        for panel in rows.start / MR..rows.end.div_ceil(MR) {
            self.dequantize_panel(g * self.panels_per_group + panel, &mut panel_weights);
            for (s, x_panel) in packed_x.chunks_exact(cols * NR).enumerate() {
                let acc = microkernel(&panel_weights, x_panel);
                for (lane, acc_row) in acc.iter().enumerate() {
                    let local = panel * MR + lane;
                    if local >= rows.end {
                        break;
                    }
                    let bias = self.bias[g * co_g + local];
                    let out_row = &mut tile[(local - rows.start) * width..][..width];
                    for (o, &v) in out_row.iter_mut().skip(s * NR).zip(acc_row) {
                        *o = clamp_keep_nan(v + bias, lo, hi);
                    }
                }
            }
        }
        tile
    }

    /// Dequantizes micro-panel `panel` into `out` (`[K][MR]` f32): `q · scale + offset` with each block's
    /// parameters, exactly as [`BlockQuantWeight::dequantize`] computes them.
    fn dequantize_panel(&self, panel: usize, out: &mut [f32]) {
        let (cols, blocks) = (self.shape.cols(), self.shape.blocks());
        let codes = &self.panel_codes[panel * cols * MR..(panel + 1) * cols * MR];
        for b in 0..blocks {
            let p = (panel * blocks + b) * MR;
            let scales: &[f32; MR] = self.panel_scales[p..p + MR].try_into().expect("MR lanes");
            let offsets: &[f32; MR] = self.panel_offsets[p..p + MR].try_into().expect("MR lanes");
            let range = self.shape.block_col_range(b);
            let (dst, src) = (
                &mut out[range.start * MR..range.end * MR],
                &codes[range.start * MR..range.end * MR],
            );
            for (w, q) in dst.chunks_exact_mut(MR).zip(src.chunks_exact(MR)) {
                for lane in 0..MR {
                    w[lane] = q[lane] as f32 * scales[lane] + offsets[lane];
                }
            }
        }
    }
}

/// How one convolution is cut into tiles.
struct TilePlan {
    /// Output pixels per tile (a multiple of `NR` unless the image is smaller).
    tile_pixels: usize,
    pixel_tiles: usize,
    /// Output channels per chunk of a group (a multiple of `MR`, or the whole group).
    co_chunk: usize,
}

impl TilePlan {
    fn new(geo: &ConvGeometry, cols: usize) -> Self {
        let pixels = geo.out_pixels();
        let tile_pixels = (INPUT_TILE_FLOATS / cols / NR * NR)
            .clamp(NR, MAX_TILE_PIXELS)
            .min(pixels);
        let pixel_tiles = pixels.div_ceil(tile_pixels);
        // Split output channels only when batch × groups × pixel tiles leaves threads idle (small images, GEMV):
        // every channel chunk re-packs its input tiles.
        let co_g = geo.out_channels_per_group();
        let tasks = geo.output[0] * geo.groups * pixel_tiles;
        let wanted = 4 * rayon::current_num_threads();
        let splits = wanted.div_ceil(tasks).clamp(1, co_g.div_ceil(MR));
        Self {
            tile_pixels,
            pixel_tiles,
            co_chunk: co_g.div_ceil(splits).next_multiple_of(MR),
        }
    }
}

/// Packs the im2col slice of output pixels `p0 .. p0 + width` of one (batch, group) input `x_group`
/// (`[Ci/groups, H, W]`) into `packed`: `[⌈width/NR⌉][K][NR]` f32, taps outside the input zero. `packed` must
/// arrive zeroed (the lanes past `width` stay zero).
fn pack_input_tile<T: Float>(geo: &ConvGeometry, x_group: &[T], p0: usize, width: usize, packed: &mut [f32]) {
    let [_, _, h, w] = geo.input;
    let out_w = geo.output[3];
    let (kh, kw) = geo.kernel;
    let cols = geo.channels_per_group() * kh * kw;
    let slot = |k: usize, j: usize| (j / NR * cols + k) * NR + j % NR;
    for (c, plane) in x_group.chunks_exact(h * w).enumerate() {
        if geo.is_pointwise() {
            // 1×1, stride 1, no padding: the GEMM's right-hand side is the input itself.
            for (j, v) in plane[p0..p0 + width].iter().enumerate() {
                packed[slot(c, j)] = v.to_f32();
            }
            continue;
        }
        for ky in 0..kh {
            for kx in 0..kw {
                let k = (c * kh + ky) * kw + kx;
                let (dy, dx) = (
                    (ky * geo.dilation.0) as isize - geo.padding.0 as isize,
                    (kx * geo.dilation.1) as isize - geo.padding.1 as isize,
                );
                let (mut oy, mut ox) = (p0 / out_w, p0 % out_w);
                for j in 0..width {
                    let iy = (oy * geo.stride.0) as isize + dy;
                    let ix = (ox * geo.stride.1) as isize + dx;
                    if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                        packed[slot(k, j)] = plane[iy as usize * w + ix as usize].to_f32();
                    }
                    ox += 1;
                    if ox == out_w {
                        (oy, ox) = (oy + 1, 0);
                    }
                }
            }
        }
    }
}

/// `v` clamped to `[lo, hi]`, but NaN stays NaN (`f32::clamp` would too, but panics on NaN bounds; this cannot).
#[inline(always)]
pub(crate) fn clamp_keep_nan(v: f32, lo: f32, hi: f32) -> f32 {
    if v < lo {
        lo
    } else if v > hi {
        hi
    } else {
        v
    }
}

/// `acc[i][j] = Σ_k a[k][i] · b[k][j]` for `a` `[K][MR]` and `b` `[K][NR]`, accumulators in registers.
fn microkernel(a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features `microkernel_avx2` is compiled for (checked just above).
        return unsafe { microkernel_avx2(a, b) };
    }
    microkernel_body::<false>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn microkernel_avx2(a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    microkernel_body::<true>(a, b)
}

/// The micro-kernel, compiled once per instruction set; `FUSED` uses fused multiply-add (only where the CPU has it,
/// otherwise `mul_add` would be a slow library call).
#[inline(always)]
fn microkernel_body<const FUSED: bool>(a: &[f32], b: &[f32]) -> [[f32; NR]; MR] {
    let mut acc = [[0f32; NR]; MR];
    for (a_k, b_k) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        let a_k: &[f32; MR] = a_k.try_into().expect("MR lanes");
        let b_k: &[f32; NR] = b_k.try_into().expect("NR lanes");
        for (acc_row, &a_ki) in acc.iter_mut().zip(a_k) {
            for (c, &b_kj) in acc_row.iter_mut().zip(b_k) {
                *c = if FUSED {
                    a_ki.mul_add(b_kj, *c)
                } else {
                    *c + a_ki * b_kj
                };
            }
        }
    }
    acc
}
