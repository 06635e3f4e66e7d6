//! W8A8 on the CPU: the online activation quantizer (rayon over rows) and the two int8 GEMMs.
//!
//! Both GEMMs run the same integer core. The output `[M, N]` is cut into tiles of up to `TILE_ROWS × TILE_COLS`
//! (in parallel); a tile walks K one block at a time, so the block's slice of its activation rows and weight rows
//! stays in L1 while every `MR × NR` micro-tile of int32 block dots is computed (i8 × i8 products widened to i32,
//! which compilers turn into `pmaddwd`-style multiply-adds) and handed to the scheme's combination.

use super::{
    check_activation_shape, check_bias, check_smoothquant_activations, check_smoothquant_weight, check_weight_for,
    quantize_row, ActivationQuant, QuantizedActivations, MAX_EXACT_BLOCK,
};
use crate::dtype::Float;
use crate::error::{ensure, Result};
use crate::formats::block::{check_len, BlockQuantWeight};
use rayon::prelude::*;
use std::ops::Range;

/// Activation rows per micro-tile.
const MR: usize = 4;
/// Weight rows (output columns) per micro-tile.
const NR: usize = 4;
/// Output rows per parallel tile.
const TILE_ROWS: usize = 32;
/// Output columns per parallel tile (fewer when that leaves threads idle).
const TILE_COLS: usize = 64;

/// The online activation quantizer (see [`super::quantize_activations`]), parallel over rows.
pub fn quantize_activations<T: Float>(
    x: &[T],
    m: usize,
    k: usize,
    block_size: usize,
    mode: ActivationQuant,
) -> Result<QuantizedActivations> {
    check_activation_shape(m, k, block_size)?;
    check_len("activations", x.len(), m * k, "M · K")?;
    let blocks = k.div_ceil(block_size);
    let mut codes = vec![0i8; m * k];
    let mut scales = vec![0f32; m * blocks];
    let mut offsets = vec![0f32; m * blocks];
    let mut code_sums = vec![0i32; m * blocks];
    codes
        .par_chunks_mut(k)
        .zip(scales.par_chunks_mut(blocks))
        .zip(offsets.par_chunks_mut(blocks))
        .zip(code_sums.par_chunks_mut(blocks))
        .enumerate()
        .try_for_each(|(r, (((codes, scales), offsets), sums))| {
            quantize_row(
                &x[r * k..(r + 1) * k],
                r,
                block_size,
                mode,
                codes,
                scales,
                offsets,
                sums,
            )
        })?;
    Ok(QuantizedActivations {
        m,
        k,
        block_size,
        codes,
        scales,
        offsets,
        code_sums,
    })
}

/// Per-block W8A8 prepared for the CPU: int8 (or int4) offset-form weights `[N, K]` with the activations' K
/// blocks, their per-(column, block) code sums precomputed.
#[derive(Debug, Clone)]
pub struct BlockW8a8Cpu {
    n: usize,
    k: usize,
    block_size: usize,
    /// `[N, K]`.
    codes: Vec<i8>,
    /// `[N, blocks]`.
    scales: Vec<f32>,
    /// `[N, blocks]`.
    offsets: Vec<f32>,
    /// `[N, blocks]`: `sB · Σ b_q + bs · oB`, the weight-only factor of the `oA` terms.
    offset_terms: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl BlockW8a8Cpu {
    /// Prepares a linear weight (`[N, K]`, blocks of at most [`MAX_EXACT_BLOCK`] along K) and optional bias `[N]`.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Self> {
        let shape = *weight.shape();
        check_weight_for(weight, shape.channels, shape.block_channels, "per-block W8A8")?;
        ensure(
            shape.block_channels <= MAX_EXACT_BLOCK,
            "block_size",
            shape.block_channels,
            "blocks longer than 65536 could overflow the int32 block dot",
        )?;
        check_bias(bias, shape.rows)?;
        let (n, k, block_size, blocks) = (shape.rows, shape.channels, shape.block_channels, shape.blocks());
        let mut offset_terms = Vec::with_capacity(n * blocks);
        for (r, row) in weight.codes().chunks_exact(k).enumerate() {
            for (b, block) in row.chunks(block_size).enumerate() {
                let p = r * blocks + b;
                let code_sum: i32 = block.iter().map(|&q| q as i32).sum();
                offset_terms.push(weight.scales()[p] * code_sum as f32 + block.len() as f32 * weight.offsets()[p]);
            }
        }
        Ok(Self {
            n,
            k,
            block_size,
            codes: weight.codes().to_vec(),
            scales: weight.scales().to_vec(),
            offsets: weight.offsets().to_vec(),
            offset_terms,
            bias: bias.map(<[f32]>::to_vec),
        })
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `C [M, N]` for activations quantized with this weight's K blocks.
    pub fn forward<T: Float>(&self, a: &QuantizedActivations) -> Result<Vec<T>> {
        let mut out = vec![T::default(); a.m * self.n];
        self.forward_into(a, &mut out)?;
        Ok(out)
    }

    /// Like [`BlockW8a8Cpu::forward`], writing into `out` (`[M, N]`).
    pub fn forward_into<T: Float>(&self, a: &QuantizedActivations, out: &mut [T]) -> Result<()> {
        self.check_activations(a)?;
        check_len("output", out.len(), a.m * self.n, "M · N")?;
        let blocks = a.blocks();
        let gemm = Int8Gemm {
            a: &a.codes,
            b: &self.codes,
            k: self.k,
            block: self.block_size,
        };
        par_tiles(a.m, self.n, out, |rows, cols| {
            // Per block: acc += sA·(sB·dot + oB·Σa) + oA·(sB·Σb + bs·oB), f32.
            let acc = gemm.tile(
                rows.clone(),
                cols.clone(),
                |acc: &mut [[f32; NR]; MR], r, c, blk, dots| {
                    let pa = r.map(|r| r * blocks + blk);
                    let pb = c.map(|c| c * blocks + blk);
                    for i in 0..MR {
                        let (sa, oa, sum_a) = (a.scales[pa[i]], a.offsets[pa[i]], a.code_sums[pa[i]] as f32);
                        for j in 0..NR {
                            let (sb, ob) = (self.scales[pb[j]], self.offsets[pb[j]]);
                            acc[i][j] += sa * (sb * dots[i][j] as f32 + ob * sum_a) + oa * self.offset_terms[pb[j]];
                        }
                    }
                },
            );
            unpack_tile(&acc, rows, cols, |_, c, v| v + self.bias.as_ref().map_or(0.0, |b| b[c]))
        });
        Ok(())
    }

    fn check_activations(&self, a: &QuantizedActivations) -> Result<()> {
        ensure(
            a.k == self.k,
            "activations",
            format!("shape [{}, {}]", a.m, a.k),
            &format!("activation K must equal the weight's K = {}", self.k),
        )?;
        ensure(
            a.block_size == self.block_size,
            "block_size",
            format!("activations {} vs weight {}", a.block_size, self.block_size),
            "weight and activation K blocks must be equal",
        )
    }
}

/// SmoothQuant W8A8 prepared for the CPU: int8 weights `[N, K]` with one symmetric scale per output channel.
#[derive(Debug, Clone)]
pub struct SmoothQuantCpu {
    n: usize,
    k: usize,
    /// `[N, K]`.
    codes: Vec<i8>,
    /// `[N]`.
    channel_scales: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl SmoothQuantCpu {
    /// Prepares a per-channel symmetric weight (one block per row, zero offsets, e.g. from
    /// [`BlockQuantWeight::quantize_per_channel_symmetric`]) and optional bias `[N]`.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Self> {
        let shape = *weight.shape();
        check_smoothquant_weight(weight)?;
        check_weight_for(weight, shape.channels, shape.channels, "SmoothQuant")?;
        check_bias(bias, shape.rows)?;
        Ok(Self {
            n: shape.rows,
            k: shape.channels,
            codes: weight.codes().to_vec(),
            channel_scales: weight.scales().to_vec(),
            bias: bias.map(<[f32]>::to_vec),
        })
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `y [M, N]` for per-token activations (one symmetric block per row, see
    /// [`QuantizedActivations::per_token`] or [`ActivationQuant::Symmetric`] with `block_size = K`).
    pub fn forward<T: Float>(&self, a: &QuantizedActivations) -> Result<Vec<T>> {
        let mut out = vec![T::default(); a.m * self.n];
        self.forward_into(a, &mut out)?;
        Ok(out)
    }

    /// Like [`SmoothQuantCpu::forward`], writing into `out` (`[M, N]`).
    pub fn forward_into<T: Float>(&self, a: &QuantizedActivations, out: &mut [T]) -> Result<()> {
        check_smoothquant_activations(a)?;
        ensure(
            a.k == self.k,
            "activations",
            format!("shape [{}, {}]", a.m, a.k),
            &format!("activation K must equal the weight's K = {}", self.k),
        )?;
        check_len("output", out.len(), a.m * self.n, "M · N")?;
        // The integer dot runs in int32 chunks of at most MAX_EXACT_BLOCK, summed exactly in int64.
        let gemm = Int8Gemm {
            a: &a.codes,
            b: &self.codes,
            k: self.k,
            block: self.k.min(MAX_EXACT_BLOCK),
        };
        par_tiles(a.m, self.n, out, |rows, cols| {
            let acc = gemm.tile(
                rows.clone(),
                cols.clone(),
                |acc: &mut [[i64; NR]; MR], _, _, _, dots| {
                    for (acc_row, dot_row) in acc.iter_mut().zip(dots) {
                        for (acc, &dot) in acc_row.iter_mut().zip(dot_row) {
                            *acc += dot as i64;
                        }
                    }
                },
            );
            // One rounding: the exact dot times the two f32 scales (exact in f64), plus bias, rounded to f32.
            unpack_tile(&acc, rows, cols, |r, c, dot| {
                let y = dot as f64 * a.scales[r] as f64 * self.channel_scales[c] as f64;
                (y + self.bias.as_ref().map_or(0.0, |b| b[c] as f64)) as f32
            })
        });
        Ok(())
    }
}

/// The int8 GEMM core: `a` `[M, K]` and `b` `[N, K]` codes, int32 dots per K block of `block` columns.
struct Int8Gemm<'a> {
    a: &'a [i8],
    b: &'a [i8],
    k: usize,
    block: usize,
}

impl Int8Gemm<'_> {
    /// The accumulators of output rows `rows` × columns `cols`, as micro-tiles
    /// `[⌈rows/MR⌉ · ⌈cols/NR⌉]` of `MR × NR`. For each K block and micro-tile, `combine(acc, rows, cols, block,
    /// dots)` adds the block's int32 dots; rows/columns past the tile's end repeat its last one (their results are
    /// dropped by [`unpack_tile`]).
    fn tile<Acc: Copy + Default>(
        &self,
        rows: Range<usize>,
        cols: Range<usize>,
        combine: impl Fn(&mut [[Acc; NR]; MR], [usize; MR], [usize; NR], usize, &[[i32; NR]; MR]),
    ) -> Vec<[[Acc; NR]; MR]> {
        let (row_tiles, col_tiles) = (rows.len().div_ceil(MR), cols.len().div_ceil(NR));
        let mut acc = vec![[[Acc::default(); NR]; MR]; row_tiles * col_tiles];
        for (blk, start) in (0..self.k).step_by(self.block).enumerate() {
            let span = start..(start + self.block).min(self.k);
            for rt in 0..row_tiles {
                let r: [usize; MR] = std::array::from_fn(|i| (rows.start + rt * MR + i).min(rows.end - 1));
                let a_rows = r.map(|r| &self.a[r * self.k + span.start..r * self.k + span.end]);
                for ct in 0..col_tiles {
                    let c: [usize; NR] = std::array::from_fn(|j| (cols.start + ct * NR + j).min(cols.end - 1));
                    let b_rows = c.map(|c| &self.b[c * self.k + span.start..c * self.k + span.end]);
                    combine(&mut acc[rt * col_tiles + ct], r, c, blk, &block_dots(&a_rows, &b_rows));
                }
            }
        }
        acc
    }
}

/// Turns micro-tiled accumulators into a row-major `rows × cols` f32 tile through `finish(row, col, acc)`.
fn unpack_tile<Acc: Copy>(
    acc: &[[[Acc; NR]; MR]],
    rows: Range<usize>,
    cols: Range<usize>,
    finish: impl Fn(usize, usize, Acc) -> f32,
) -> Vec<f32> {
    let col_tiles = cols.len().div_ceil(NR);
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in 0..rows.len() {
        for c in 0..cols.len() {
            let v = acc[r / MR * col_tiles + c / NR][r % MR][c % NR];
            out.push(finish(rows.start + r, cols.start + c, v));
        }
    }
    out
}

/// Computes `[M, N]` in parallel tiles: `tile(rows, cols)` returns a row-major f32 tile, written into `out` as `T`.
/// Row chunks of `out` are contiguous, so they split safely; column tiles inside a chunk run in parallel too.
fn par_tiles<T: Float>(
    m: usize,
    n: usize,
    out: &mut [T],
    tile: impl Fn(Range<usize>, Range<usize>) -> Vec<f32> + Sync,
) {
    let row_chunks = m.div_ceil(TILE_ROWS);
    // Narrow the column tiles (down to NR) when there are too few tiles to keep every thread busy (decode, M = 1).
    let wanted = 4 * rayon::current_num_threads();
    let tile_cols = n
        .div_ceil(wanted.div_ceil(row_chunks).max(1))
        .next_multiple_of(NR)
        .clamp(NR, TILE_COLS);
    let col_tiles = n.div_ceil(tile_cols);
    out.par_chunks_mut(TILE_ROWS * n)
        .enumerate()
        .for_each(|(chunk, out_rows)| {
            let rows = chunk * TILE_ROWS..chunk * TILE_ROWS + out_rows.len() / n;
            let tiles: Vec<Vec<f32>> = (0..col_tiles)
                .into_par_iter()
                .map(|t| tile(rows.clone(), t * tile_cols..((t + 1) * tile_cols).min(n)))
                .collect();
            for (t, tile) in tiles.iter().enumerate() {
                let width = tile.len() / rows.len();
                for (out_row, tile_row) in out_rows.chunks_exact_mut(n).zip(tile.chunks_exact(width)) {
                    for (o, &v) in out_row[t * tile_cols..t * tile_cols + width].iter_mut().zip(tile_row) {
                        *o = T::from_f32(v);
                    }
                }
            }
        });
}

/// The `MR × NR` int32 dots of one K block: `dots[i][j] = Σ a[i][k] · b[j][k]`.
fn block_dots(a: &[&[i8]; MR], b: &[&[i8]; NR]) -> [[i32; NR]; MR] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, the only feature `block_dots_avx2` is compiled for (checked just above).
        return unsafe { block_dots_avx2(a, b) };
    }
    block_dots_body(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block_dots_avx2(a: &[&[i8]; MR], b: &[&[i8]; NR]) -> [[i32; NR]; MR] {
    block_dots_body(a, b)
}

/// Compiled once per instruction set. Each product of two i8 fits i16 and a block's sum fits i32 (blocks are at
/// most [`MAX_EXACT_BLOCK`]), so the widening multiply-add is exact.
#[inline(always)]
fn block_dots_body(a: &[&[i8]; MR], b: &[&[i8]; NR]) -> [[i32; NR]; MR] {
    let mut dots = [[0i32; NR]; MR];
    for (dot_row, a_row) in dots.iter_mut().zip(a) {
        for (dot, b_row) in dot_row.iter_mut().zip(b) {
            *dot = a_row
                .iter()
                .zip(b_row.iter())
                .map(|(&x, &y)| (x as i16 * y as i16) as i32)
                .sum();
        }
    }
    dots
}
