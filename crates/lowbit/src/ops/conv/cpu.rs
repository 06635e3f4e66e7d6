//! The CPU convolution: implicit GEMM over tiles, dequantizing weights inside each tile.
//!
//! Per batch item and group the convolution is a GEMM `out[co, p] = Σ_k W[co, k] · X[k, p]` with
//! `k = (ci, ky, kx)` and `p = (oy, ox)`. Work is split into tiles of output channels × output pixels. A tile walks
//! `K` in chunks of `KC`: it packs that chunk of `X` for its pixels (im2col of just those; a plain copy for 1×1
//! stride-1 unpadded convolutions, where `X` is the input itself), dequantizes the same chunk of its output
//! channels' int4/int8 codes to f32 (`q · scale + offset`), and runs an `MR × NR` register-blocked micro-kernel
//! over every (channel panel, pixel panel) pair. The dense f32 weight never exists as a whole; at most
//! `channels × KC` of it per thread.
//!
//! Convolutions with one input channel per group (depthwise, or `Ci = 1`) have `K = Kh·Kw` only, too short for a
//! GEMM; they run a direct kernel instead, one output plane at a time.

use super::{check_bias, Conv2dParams, ConvGeometry};
use crate::dtype::Float;
use crate::error::Result;
use crate::formats::block::{check_len, BlockQuantWeight, BlockShape};
use rayon::prelude::*;
use std::any::TypeId;
use std::borrow::Cow;
use std::ops::Range;

/// Output channels per micro-tile.
const MR: usize = 6;
/// Output pixels per micro-tile (two AVX registers of f32).
const NR: usize = 16;
/// Columns of `K` per packed chunk: a `KC × NR` input panel (16 KiB) stays in L1 while the micro-kernel runs.
const KC: usize = 256;
/// Output pixels per tile: the packed input chunk is `KC × TILE_PIXELS` f32 (128 KiB, L2).
const TILE_PIXELS: usize = 128;

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
        // Kernels read f32; f16/bf16 inputs are widened once here rather than at every tap of every tile.
        let x = widen(x);
        if geo.channels_per_group() == 1 {
            self.forward_direct(&geo, &x, out);
        } else {
            self.forward_gemm(&geo, &x, out);
        }
        Ok(geo.output)
    }

    /// The implicit-GEMM path (see the module docs).
    fn forward_gemm<T: Float>(&self, geo: &ConvGeometry, x: &[f32], out: &mut [T]) {
        let plan = TilePlan::new(geo);
        let pixels = geo.out_pixels();
        let (groups, co_g) = (geo.groups, geo.out_channels_per_group());
        let group_input = geo.channels_per_group() * geo.input[2] * geo.input[3];

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
                                self.gemm_tile(geo, x_group, g, rows.clone(), p)
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
    }

    /// One output tile of group `g`: output channels `rows` (local to the group, starting on a panel boundary)
    /// × output pixels `pixels`; returns it row-major in f32 with bias and activation applied.
    fn gemm_tile(
        &self,
        geo: &ConvGeometry,
        x_group: &[f32],
        g: usize,
        rows: Range<usize>,
        pixels: Range<usize>,
    ) -> Vec<f32> {
        let cols = self.shape.cols();
        let width = pixels.len();
        let panels = rows.start / MR..rows.end.div_ceil(MR);
        let pixel_panels = width.div_ceil(NR);
        let mut acc = vec![[[0f32; NR]; MR]; panels.len() * pixel_panels];
        let mut packed_x = vec![0f32; pixel_panels * KC * NR];
        let mut packed_w = vec![0f32; panels.len() * KC * MR];
        for k0 in (0..cols).step_by(KC) {
            let ks = k0..(k0 + KC).min(cols);
            pack_input_chunk(geo, x_group, ks.clone(), pixels.clone(), &mut packed_x);
            for (i, panel) in panels.clone().enumerate() {
                let dst = &mut packed_w[i * KC * MR..][..ks.len() * MR];
                self.dequantize_panel(g * self.panels_per_group + panel, ks.clone(), dst);
            }
            for (i, w_panel) in packed_w.chunks_exact(KC * MR).enumerate() {
                for (s, x_panel) in packed_x.chunks_exact(KC * NR).enumerate() {
                    let a = &w_panel[..ks.len() * MR];
                    microkernel(a, &x_panel[..ks.len() * NR], &mut acc[i * pixel_panels + s]);
                }
            }
        }
        // Epilogue: bias, activation clamp, row-major.
        let (lo, hi) = self.params.activation.bounds();
        let co_g = geo.out_channels_per_group();
        let mut tile = vec![0f32; rows.len() * width];
        for (r, tile_row) in tile.chunks_exact_mut(width).enumerate() {
            let local = rows.start + r;
            let (i, lane) = (local / MR - panels.start, local % MR);
            let bias = self.bias[g * co_g + local];
            for (p, o) in tile_row.iter_mut().enumerate() {
                *o = clamp_keep_nan(acc[i * pixel_panels + p / NR][lane][p % NR] + bias, lo, hi);
            }
        }
        tile
    }

    /// Dequantizes columns `ks` of micro-panel `panel` into `out` (`[ks.len()][MR]` f32): `q · scale + offset`
    /// with each column's block parameters, exactly as [`BlockQuantWeight::dequantize`] computes them.
    fn dequantize_panel(&self, panel: usize, ks: Range<usize>, out: &mut [f32]) {
        let (cols, blocks) = (self.shape.cols(), self.shape.blocks());
        let codes = &self.panel_codes[panel * cols * MR..(panel + 1) * cols * MR];
        let block_cols = self.shape.block_cols();
        for b in ks.start / block_cols..ks.end.div_ceil(block_cols).min(blocks) {
            let span = self.shape.block_col_range(b);
            let span = span.start.max(ks.start)..span.end.min(ks.end);
            let p = (panel * blocks + b) * MR;
            let scales: &[f32; MR] = self.panel_scales[p..p + MR].try_into().expect("MR lanes");
            let offsets: &[f32; MR] = self.panel_offsets[p..p + MR].try_into().expect("MR lanes");
            let dst = &mut out[(span.start - ks.start) * MR..(span.end - ks.start) * MR];
            for (w, q) in dst
                .chunks_exact_mut(MR)
                .zip(codes[span.start * MR..span.end * MR].chunks_exact(MR))
            {
                for lane in 0..MR {
                    w[lane] = q[lane] as f32 * scales[lane] + offsets[lane];
                }
            }
        }
    }

    /// The direct path for one input channel per group: each output plane `(b, co)` accumulates
    /// `w[co, ky, kx] · x[b, g, iy, ix]` tap by tap along output rows (contiguous at stride 1).
    fn forward_direct<T: Float>(&self, geo: &ConvGeometry, x: &[f32], out: &mut [T]) {
        let [_, ci, h, w] = geo.input;
        let [_, co, out_h, out_w] = geo.output;
        let (kh, kw) = geo.kernel;
        let co_g = geo.out_channels_per_group();
        let (lo, hi) = self.params.activation.bounds();
        out.par_chunks_mut(out_h * out_w)
            .enumerate()
            .for_each(|(plane, out_plane)| {
                let (b, c) = (plane / co, plane % co);
                let input_plane: Vec<f32> = x[(b * ci + c / co_g) * h * w..][..h * w]
                    .iter()
                    .map(|v| v.to_f32())
                    .collect();
                // One input channel per group means one block per output channel and panels of this layout:
                let (panel, lane) = ((c / co_g) * self.panels_per_group + c % co_g / MR, c % co_g % MR);
                let (scale, offset) = (
                    self.panel_scales[panel * MR + lane],
                    self.panel_offsets[panel * MR + lane],
                );
                let taps: Vec<f32> = (0..kh * kw)
                    .map(|t| self.panel_codes[(panel * kh * kw + t) * MR + lane] as f32 * scale + offset)
                    .collect();
                let mut row = vec![0f32; out_w];
                for (oy, out_row) in out_plane.chunks_exact_mut(out_w).enumerate() {
                    row.fill(self.bias[c]);
                    for ky in 0..kh {
                        let Some(iy) = geo.input_row(oy, ky) else { continue };
                        let in_row = &input_plane[iy * w..][..w];
                        for kx in 0..kw {
                            let shift = (kx * geo.dilation.1) as isize - geo.padding.1 as isize;
                            let valid = valid_outputs(shift, geo.stride.1, w, out_w);
                            if valid.is_empty() {
                                continue;
                            }
                            let tap = taps[ky * kw + kx];
                            let inputs = &in_row[((valid.start * geo.stride.1) as isize + shift) as usize..];
                            let outputs = &mut row[valid];
                            if geo.stride.1 == 1 {
                                // Contiguous: a plain axpy the compiler vectorises.
                                for (o, &v) in outputs.iter_mut().zip(inputs) {
                                    *o += tap * v;
                                }
                            } else {
                                for (o, &v) in outputs.iter_mut().zip(inputs.iter().step_by(geo.stride.1)) {
                                    *o += tap * v;
                                }
                            }
                        }
                    }
                    for (o, &v) in out_row.iter_mut().zip(&row) {
                        *o = T::from_f32(clamp_keep_nan(v, lo, hi));
                    }
                }
            });
    }
}

/// The output columns `ox` whose input column `ox · stride + shift` lies in `0..w`.
fn valid_outputs(shift: isize, stride: usize, w: usize, out_w: usize) -> Range<usize> {
    let stride = stride as isize;
    // First ox with ox·stride + shift ≥ 0, and one past the last with ox·stride + shift ≤ w − 1.
    let first = if shift >= 0 { 0 } else { (-shift + stride - 1) / stride };
    let end = if w as isize - 1 - shift < 0 {
        0
    } else {
        (w as isize - 1 - shift) / stride + 1
    };
    let (first, end) = (first as usize, (end as usize).min(out_w));
    first.min(end)..end
}

/// `x` as f32: borrowed when `T` is f32, widened (in parallel) otherwise.
fn widen<T: Float>(x: &[T]) -> Cow<'_, [f32]> {
    if TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: `T` is `f32` (same TypeId), so this is the same slice with its own type.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len()) })
    } else {
        Cow::Owned(x.par_iter().map(|v| v.to_f32()).collect())
    }
}

/// How one GEMM-path convolution is cut into tiles.
struct TilePlan {
    /// Output pixels per tile.
    tile_pixels: usize,
    pixel_tiles: usize,
    /// Output channels per chunk of a group (a multiple of `MR`, or the whole group).
    co_chunk: usize,
}

impl TilePlan {
    fn new(geo: &ConvGeometry) -> Self {
        let pixels = geo.out_pixels();
        let tile_pixels = TILE_PIXELS.min(pixels);
        let pixel_tiles = pixels.div_ceil(tile_pixels);
        // Split output channels only when batch × groups × pixel tiles leaves threads idle (small images, GEMV):
        // every channel chunk re-packs its input tiles.
        let co_g = geo.out_channels_per_group();
        let tasks = geo.output[0] * geo.groups * pixel_tiles;
        let wanted = 2 * rayon::current_num_threads();
        let splits = wanted.div_ceil(tasks).clamp(1, co_g.div_ceil(MR));
        Self {
            tile_pixels,
            pixel_tiles,
            co_chunk: co_g.div_ceil(splits).next_multiple_of(MR),
        }
    }
}

/// Packs rows `ks` of the im2col matrix, for output pixels `pixels`, of one (batch, group) input `x_group`
/// (`[Ci/groups, H, W]`) into `packed`: `[⌈pixels/NR⌉][KC][NR]` f32, taps outside the input zero. Lanes past the
/// last pixel are never written, so they stay zero from allocation.
fn pack_input_chunk(geo: &ConvGeometry, x_group: &[f32], ks: Range<usize>, pixels: Range<usize>, packed: &mut [f32]) {
    let [_, _, h, w] = geo.input;
    let out_w = geo.output[3];
    let (kh, kw) = geo.kernel;
    for k in ks.clone() {
        let mut put = |j: usize, v: f32| packed[(j / NR * KC + k - ks.start) * NR + j % NR] = v;
        let (c, ky, kx) = (k / (kh * kw), k % (kh * kw) / kw, k % kw);
        let plane = &x_group[c * h * w..(c + 1) * h * w];
        if geo.is_pointwise() {
            // 1×1, stride 1, no padding: the GEMM's right-hand side is the input itself.
            for (j, &v) in plane[pixels.clone()].iter().enumerate() {
                put(j, v);
            }
            continue;
        }
        let dy = (ky * geo.dilation.0) as isize - geo.padding.0 as isize;
        let dx = (kx * geo.dilation.1) as isize - geo.padding.1 as isize;
        // Output columns whose input column is inside the image; the same for every output row.
        let valid = valid_outputs(dx, geo.stride.1, w, out_w);
        // Walk the pixels one output row segment at a time: zeros, a strided run of the input row, zeros.
        let mut p = pixels.start;
        while p < pixels.end {
            let (oy, ox0) = (p / out_w, p % out_w);
            let segment = ox0..(out_w).min(ox0 + pixels.end - p);
            let j0 = p - pixels.start;
            let iy = (oy * geo.stride.0) as isize + dy;
            if (0..h as isize).contains(&iy) {
                let row = &plane[iy as usize * w..(iy as usize + 1) * w];
                for ox in segment.clone() {
                    let v = if valid.contains(&ox) {
                        row[((ox * geo.stride.1) as isize + dx) as usize]
                    } else {
                        0.0
                    };
                    put(j0 + ox - ox0, v);
                }
            } else {
                for ox in segment.clone() {
                    put(j0 + ox - ox0, 0.0);
                }
            }
            p += segment.len();
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

/// `acc[i][j] += Σ_k a[k][i] · b[k][j]` for `a` `[K][MR]` and `b` `[K][NR]`, accumulators in registers.
fn microkernel(a: &[f32], b: &[f32], acc: &mut [[f32; NR]; MR]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports the features `microkernel_avx2` is compiled for (checked just above).
        unsafe { microkernel_avx2(a, b, acc) };
        return;
    }
    microkernel_body::<false>(a, b, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn microkernel_avx2(a: &[f32], b: &[f32], acc: &mut [[f32; NR]; MR]) {
    microkernel_body::<true>(a, b, acc)
}

/// The micro-kernel, compiled once per instruction set; `FUSED` uses fused multiply-add (only where the CPU has it,
/// otherwise `mul_add` would be a slow library call).
#[inline(always)]
fn microkernel_body<const FUSED: bool>(a: &[f32], b: &[f32], acc_out: &mut [[f32; NR]; MR]) {
    let mut acc = *acc_out;
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
    *acc_out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable micro-kernel and the FMA one agree exactly on small integers (every sum exact either way).
    #[test]
    fn micro_kernels_agree_on_exact_data() {
        let k = 37;
        let a: Vec<f32> = (0..k * MR).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * NR).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut portable = [[1f32; NR]; MR];
        microkernel_body::<false>(&a, &b, &mut portable);
        for i in 0..MR {
            for j in 0..NR {
                let want: f32 = 1.0 + (0..k).map(|kk| a[kk * MR + i] * b[kk * NR + j]).sum::<f32>();
                assert_eq!(portable[i][j], want);
            }
        }
        let mut dispatched = [[1f32; NR]; MR];
        microkernel(&a, &b, &mut dispatched);
        assert_eq!(dispatched, portable);
    }
}
