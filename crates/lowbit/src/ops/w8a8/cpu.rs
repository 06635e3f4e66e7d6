//! W8A8 on the CPU: the online activation quantizer (rayon over rows) and the two int8 GEMMs.
//!
//! Both GEMMs run the same integer core. Weights are packed once into panels of `NR` output columns with each K
//! block padded to an even length and consecutive codes paired (`[panel][block][pair][NR][2]`); activations are
//! packed per call into pairs of i16 in one i32 (`[M][block][pair]`). Each pair step is then one 16-bit
//! multiply-add into int32 lanes per (row, 8 columns) — `vpmaddwd` on AVX2, portable autovectorisable code
//! elsewhere — and a block's int32 dots are exact. The output `[M, N]` is cut into tiles (in parallel); a tile
//! walks K one block at a time, so that block's slice of its activation rows and weight panels stays in L1, and
//! hands every `MR × NR` micro-tile of block dots to the scheme's combination.

use super::{
    check_activation_input, check_channel_weight, check_linear, check_smoothquant_activations,
    check_smoothquant_weight, quantize_row, weight_blocks, ActivationQuant, QuantizedActivations, QuantizedRow,
    MAX_EXACT_BLOCK,
};
use crate::dtype::Float;
use crate::error::{ensure, Result};
use crate::formats::block::{check_len, BlockQuantWeight};
use rayon::prelude::*;
use std::ops::Range;

/// Activation rows per micro-tile.
const MR: usize = 4;
/// Output columns per weight panel and micro-tile (two AVX2 registers of int32).
const NR: usize = 16;
/// Output rows per parallel tile.
const TILE_ROWS: usize = 64;
/// Weight panels per parallel tile (fewer when that leaves threads idle).
const TILE_PANELS: usize = 4;

/// Quantizes activations `x` (`[M, K]` row-major, f32/f16/bf16) per row and K block of `block_size` (the last
/// block may be partial; `block_size = K` is per token). Fails on non-finite values or a block whose range
/// `max − min` overflows f32. Rows are quantized in parallel.
pub fn quantize_activations<T: Float>(
    x: &[T],
    m: usize,
    k: usize,
    block_size: usize,
    mode: ActivationQuant,
) -> Result<QuantizedActivations> {
    check_activation_input("activations", x.len(), m, k, block_size)?;
    let mut a = QuantizedActivations::zeroed(m, k, block_size);
    let blocks = a.blocks();
    a.codes
        .par_chunks_mut(k)
        .zip(a.scales.par_chunks_mut(blocks))
        .zip(a.offsets.par_chunks_mut(blocks))
        .zip(a.code_sums.par_chunks_mut(blocks))
        .enumerate()
        .try_for_each(|(r, (((codes, scales), offsets), code_sums))| {
            let out = QuantizedRow {
                codes,
                scales,
                offsets,
                code_sums,
            };
            quantize_row(&x[r * k..(r + 1) * k], r, block_size, mode, out)
        })?;
    Ok(a)
}

/// Per-block W8A8 prepared for the CPU: int8 (or int4) offset-form weights `[N, K]` with the activations' K
/// blocks, or per channel, packed into panels, with the per-(column, block) code sums folded into `offset_terms`.
#[derive(Debug, Clone)]
pub struct BlockW8a8Cpu {
    linear: PackedLinear,
    /// `[panels][blocks][NR]` (zero for padding columns), per activation block.
    scales: Vec<f32>,
    /// `[panels][blocks][NR]`.
    offsets: Vec<f32>,
    /// `[panels][blocks][NR]`: `sB · Σ b_q + bs · oB`, the weight-only factor of the `oA` terms.
    offset_terms: Vec<f32>,
}

impl BlockW8a8Cpu {
    /// Prepares a linear weight (`[N, K]`, blocks of at most [`MAX_EXACT_BLOCK`] along K) and optional bias `[N]`,
    /// for activations quantized in the weight's K blocks.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Self> {
        Self::prepare(weight, bias, weight.shape().block_channels)
    }

    /// Prepares a per-channel weight (`[N, K]`, one block per row, any offsets) and optional bias `[N]` for
    /// activations quantized in K blocks of `block_size` (at most [`MAX_EXACT_BLOCK`]).
    pub fn channel_weight(weight: &BlockQuantWeight, bias: Option<&[f32]>, block_size: usize) -> Result<Self> {
        check_channel_weight(weight)?;
        Self::prepare(weight, bias, block_size)
    }

    fn prepare(weight: &BlockQuantWeight, bias: Option<&[f32]>, block: usize) -> Result<Self> {
        let k = weight.shape().channels;
        ensure(
            block <= MAX_EXACT_BLOCK,
            "block_size",
            block,
            "blocks longer than 65536 could overflow the int32 block dot",
        )?;
        // The activations' rules for their blocks (1 ≤ block ≤ K), as the quantizer will apply them.
        check_activation_input("activations", k, 1, k, block)?;
        let linear = PackedLinear::new(weight, bias, "per-block W8A8", block)?;
        let blocks = k.div_ceil(block);
        let params = linear.weight.panels * blocks * NR;
        let (mut scales, mut offsets, mut offset_terms) = (vec![0f32; params], vec![0f32; params], vec![0f32; params]);
        for wb in weight_blocks(weight, block) {
            let (c, b) = (wb.column, wb.block);
            let dst = (c / NR * blocks + b) * NR + c % NR;
            (scales[dst], offsets[dst], offset_terms[dst]) = (wb.scale, wb.offset, wb.offset_term());
        }
        Ok(Self {
            linear,
            scales,
            offsets,
            offset_terms,
        })
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.linear.weight.n
    }

    /// `C [M, N]` for activations quantized with this weight's K blocks.
    pub fn forward<T: Float>(&self, a: &QuantizedActivations) -> Result<Vec<T>> {
        self.linear.forward(a, |out| self.forward_into(a, out))
    }

    /// Like [`BlockW8a8Cpu::forward`], writing into `out` (`[M, N]`).
    pub fn forward_into<T: Float>(&self, a: &QuantizedActivations, out: &mut [T]) -> Result<()> {
        let w = &self.linear.weight;
        ensure(
            a.block_size == w.block,
            "block_size",
            format!("activations {} vs layer {}", a.block_size, w.block),
            "activations must be quantized in the layer's K blocks",
        )?;
        let blocks = w.blocks;
        w.gemm(
            a,
            out,
            |acc: &mut [[f32; NR]; MR], r, panel, blk, dots| {
                // acc += sA·(sB·dot + oB·Σa) + oA·(sB·Σb + bs·oB), f32, across the panel's columns.
                let p = (panel * blocks + blk) * NR;
                let (sb, ob, ot) = (
                    &self.scales[p..p + NR],
                    &self.offsets[p..p + NR],
                    &self.offset_terms[p..p + NR],
                );
                for ((acc_row, dot_row), &r) in acc.iter_mut().zip(dots).zip(&r) {
                    let pa = r * blocks + blk;
                    let (sa, oa, sum_a) = (a.scales[pa], a.offsets[pa], a.code_sums[pa] as f32);
                    for j in 0..NR {
                        acc_row[j] += sa * (sb[j] * dot_row[j] as f32 + ob[j] * sum_a) + oa * ot[j];
                    }
                }
            },
            |_, c, v| v + self.linear.bias(c),
        )
    }
}

/// SmoothQuant W8A8 prepared for the CPU: int8 weights `[N, K]` with one symmetric scale per output channel.
#[derive(Debug, Clone)]
pub struct SmoothQuantCpu {
    /// Packed with int32 chunks of at most [`MAX_EXACT_BLOCK`] as its K blocks; chunks are summed in int64.
    linear: PackedLinear,
    /// `[N]`.
    channel_scales: Vec<f32>,
}

impl SmoothQuantCpu {
    /// Prepares a per-channel symmetric weight (one block per row, zero offsets, e.g. from
    /// [`BlockQuantWeight::quantize_per_channel_symmetric`]) and optional bias `[N]`.
    pub fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>) -> Result<Self> {
        check_smoothquant_weight(weight)?;
        let k = weight.shape().channels;
        Ok(Self {
            linear: PackedLinear::new(weight, bias, "SmoothQuant", k.min(MAX_EXACT_BLOCK))?,
            channel_scales: weight.scales().to_vec(),
        })
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.linear.weight.n
    }

    /// `y [M, N]` for per-token activations (one symmetric block per row, see
    /// [`QuantizedActivations::per_token`] or [`ActivationQuant::Symmetric`] with `block_size = K`).
    pub fn forward<T: Float>(&self, a: &QuantizedActivations) -> Result<Vec<T>> {
        self.linear.forward(a, |out| self.forward_into(a, out))
    }

    /// Like [`SmoothQuantCpu::forward`], writing into `out` (`[M, N]`).
    pub fn forward_into<T: Float>(&self, a: &QuantizedActivations, out: &mut [T]) -> Result<()> {
        check_smoothquant_activations(a)?;
        self.linear.weight.gemm(
            a,
            out,
            |acc: &mut [[i64; NR]; MR], _, _, _, dots| {
                for (acc_row, dot_row) in acc.iter_mut().zip(dots) {
                    for (acc, &dot) in acc_row.iter_mut().zip(dot_row) {
                        *acc += dot as i64;
                    }
                }
            },
            // One rounding: the exact dot times the two f32 scales (exact in f64), plus bias, rounded to f32.
            |r, c, dot| {
                let y = dot as f64 * a.scales[r] as f64 * self.channel_scales[c] as f64;
                (y + self.linear.bias(c) as f64) as f32
            },
        )
    }
}

/// What both GEMMs hold besides their scheme's parameters: a checked linear weight's codes, packed, and the bias.
#[derive(Debug, Clone)]
struct PackedLinear {
    weight: PackedWeight,
    /// `[N]`.
    bias: Option<Vec<f32>>,
}

impl PackedLinear {
    /// Checks `weight` as `scheme`'s linear weight `[N, K]` and `bias` as `[N]`, then packs the codes with K blocks
    /// of `pack_block` (the span of one int32 dot).
    fn new(weight: &BlockQuantWeight, bias: Option<&[f32]>, scheme: &str, pack_block: usize) -> Result<Self> {
        let shape = weight.shape();
        check_linear(weight, bias, shape.channels, pack_block, scheme)?;
        Ok(Self {
            weight: PackedWeight::new(weight.codes(), shape.rows, shape.channels, pack_block),
            bias: bias.map(<[f32]>::to_vec),
        })
    }

    /// The bias of output column `c` (0 without a bias).
    fn bias(&self, c: usize) -> f32 {
        self.bias.as_ref().map_or(0.0, |b| b[c])
    }

    /// A new output `[M, N]` for activations `a`, filled by the scheme's `forward_into`.
    fn forward<T: Float>(
        &self,
        a: &QuantizedActivations,
        forward_into: impl FnOnce(&mut [T]) -> Result<()>,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); a.m * self.weight.n];
        forward_into(&mut out)?;
        Ok(out)
    }
}

/// Fails unless the activations have the weight's K.
fn check_activations_for(a: &QuantizedActivations, k: usize) -> Result<()> {
    ensure(
        a.k == k,
        "activations",
        format!("shape [{}, {}]", a.m, a.k),
        &format!("activation K must equal the weight's K = {k}"),
    )
}

/// Int8 weight codes `[N, K]` packed for the micro-kernel: panels of `NR` output columns, each K block padded to
/// an even length (`padded_block`) with zero codes, consecutive codes of a column side by side:
/// `[panel][block][padded_block / 2][NR][2]`. Columns past `N` are zero.
#[derive(Debug, Clone)]
struct PackedWeight {
    n: usize,
    k: usize,
    /// K columns per block (the int32 dot's span); the last block may be shorter.
    block: usize,
    blocks: usize,
    padded_block: usize,
    panels: usize,
    codes: Vec<i8>,
}

impl PackedWeight {
    fn new(codes: &[i8], n: usize, k: usize, block: usize) -> Self {
        let (blocks, padded_block, panels) = (k.div_ceil(block), block.next_multiple_of(2), n.div_ceil(NR));
        let mut packed = vec![0i8; panels * blocks * padded_block * NR];
        for (c, row) in codes.chunks_exact(k).enumerate() {
            for (i, &q) in row.iter().enumerate() {
                let (b, kb) = (i / block, i % block);
                packed[(((c / NR * blocks + b) * padded_block + kb) / 2 * NR + c % NR) * 2 + kb % 2] = q;
            }
        }
        Self {
            n,
            k,
            block,
            blocks,
            padded_block,
            panels,
            codes: packed,
        }
    }

    /// `out [M, N]` for activations `a` (checked against this weight): packs the activations, then computes every
    /// tile with [`PackedWeight::tile`]'s `combine` and [`unpack_tile`]'s `finish` — all a GEMM scheme decides.
    fn gemm<T: Float, Acc: Copy + Default>(
        &self,
        a: &QuantizedActivations,
        out: &mut [T],
        combine: impl Fn(&mut [[Acc; NR]; MR], [usize; MR], usize, usize, &[[i32; NR]; MR]) + Sync,
        finish: impl Fn(usize, usize, Acc) -> f32 + Sync,
    ) -> Result<()> {
        check_activations_for(a, self.k)?;
        check_len("output", out.len(), a.m * self.n, "M · N")?;
        let pairs = self.pack_activations(&a.codes, a.m);
        par_tiles(a.m, self.n, out, |rows, panels| {
            let acc = self.tile(&pairs, rows.clone(), panels.clone(), &combine);
            unpack_tile(&acc, rows, panels, self.n, &finish)
        });
        Ok(())
    }

    /// The packed codes of one (panel, block): `[padded_block / 2][NR][2]`.
    fn panel_block(&self, panel: usize, blk: usize) -> &[i8] {
        let len = self.padded_block * NR;
        &self.codes[(panel * self.blocks + blk) * len..][..len]
    }

    /// Activation codes `[M, K]` as the micro-kernel reads them: per row and block, `padded_block / 2` pairs of
    /// consecutive codes, each pair two i16 in one i32 (first code in the low half), zero-padded.
    fn pack_activations(&self, codes: &[i8], m: usize) -> Vec<i32> {
        let row_pairs = self.blocks * self.padded_block / 2;
        let mut pairs = vec![0i32; m * row_pairs];
        pairs
            .par_chunks_mut(row_pairs)
            .zip(codes.par_chunks(self.k))
            .for_each(|(dst, row)| {
                for (dst_block, block) in dst.chunks_exact_mut(self.padded_block / 2).zip(row.chunks(self.block)) {
                    for (pair, q) in dst_block.iter_mut().zip(block.chunks(2)) {
                        let high = q.get(1).copied().unwrap_or(0);
                        *pair = (q[0] as i16 as u16 as u32 | (high as i16 as u16 as u32) << 16) as i32;
                    }
                }
            });
        pairs
    }

    /// The accumulators of output rows `rows` × weight panels `panels`, as micro-tiles
    /// `[⌈rows/MR⌉][panels]` of `MR × NR`. For each K block and micro-tile, `combine(acc, rows, panel, block,
    /// dots)` adds the block's int32 dots; rows past the tile's end repeat its last one (their results, like the
    /// padding columns, are dropped by [`unpack_tile`]).
    fn tile<Acc: Copy + Default>(
        &self,
        pairs: &[i32],
        rows: Range<usize>,
        panels: Range<usize>,
        combine: impl Fn(&mut [[Acc; NR]; MR], [usize; MR], usize, usize, &[[i32; NR]; MR]),
    ) -> Vec<[[Acc; NR]; MR]> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, the only feature `tile_avx2` is compiled for (checked just above).
            return unsafe { self.tile_avx2(pairs, rows, panels, combine) };
        }
        self.tile_body::<Acc, false>(pairs, rows, panels, combine)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn tile_avx2<Acc: Copy + Default>(
        &self,
        pairs: &[i32],
        rows: Range<usize>,
        panels: Range<usize>,
        combine: impl Fn(&mut [[Acc; NR]; MR], [usize; MR], usize, usize, &[[i32; NR]; MR]),
    ) -> Vec<[[Acc; NR]; MR]> {
        self.tile_body::<Acc, true>(pairs, rows, panels, combine)
    }

    /// [`PackedWeight::tile`], compiled once per instruction set (`AVX2` only where the CPU has it).
    #[inline(always)]
    fn tile_body<Acc: Copy + Default, const AVX2: bool>(
        &self,
        pairs: &[i32],
        rows: Range<usize>,
        panels: Range<usize>,
        combine: impl Fn(&mut [[Acc; NR]; MR], [usize; MR], usize, usize, &[[i32; NR]; MR]),
    ) -> Vec<[[Acc; NR]; MR]> {
        let row_tiles = rows.len().div_ceil(MR);
        let half = self.padded_block / 2;
        let row_pairs = self.blocks * half;
        let mut acc = vec![[[Acc::default(); NR]; MR]; row_tiles * panels.len()];
        for blk in 0..self.blocks {
            for rt in 0..row_tiles {
                let r: [usize; MR] = std::array::from_fn(|i| (rows.start + rt * MR + i).min(rows.end - 1));
                let a = r.map(|r| &pairs[r * row_pairs + blk * half..][..half]);
                for (i, panel) in panels.clone().enumerate() {
                    let b = self.panel_block(panel, blk);
                    #[cfg(target_arch = "x86_64")]
                    let dots = if AVX2 {
                        // SAFETY: only instantiated with AVX2 = true inside `tile_avx2`, which requires AVX2.
                        unsafe { block_dots_avx2(&a, b) }
                    } else {
                        block_dots_portable(&a, b)
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let dots = block_dots_portable(&a, b);
                    combine(&mut acc[rt * panels.len() + i], r, panel, blk, &dots);
                }
            }
        }
        acc
    }
}

/// Turns micro-tiled accumulators (from [`PackedWeight::tile`]) into a row-major f32 tile of `rows` × the real
/// columns of `panels`, through `finish(row, col, acc)`.
fn unpack_tile<Acc: Copy>(
    acc: &[[[Acc; NR]; MR]],
    rows: Range<usize>,
    panels: Range<usize>,
    n: usize,
    finish: impl Fn(usize, usize, Acc) -> f32,
) -> Vec<f32> {
    let cols = panels.start * NR..(panels.end * NR).min(n);
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in 0..rows.len() {
        for c in 0..cols.len() {
            let v = acc[r / MR * panels.len() + c / NR][r % MR][c % NR];
            out.push(finish(rows.start + r, cols.start + c, v));
        }
    }
    out
}

/// Computes `[M, N]` in parallel tiles: `tile(rows, panels)` returns a row-major f32 tile of `rows` × the columns
/// of `panels`, written into `out` as `T`. Row chunks of `out` are contiguous, so they split safely; panel tiles
/// inside a chunk run in parallel too.
fn par_tiles<T: Float>(
    m: usize,
    n: usize,
    out: &mut [T],
    tile: impl Fn(Range<usize>, Range<usize>) -> Vec<f32> + Sync,
) {
    let (row_chunks, panels) = (m.div_ceil(TILE_ROWS), n.div_ceil(NR));
    // Narrow the panel tiles (down to one panel) when there are too few tiles to keep every thread busy (decode).
    let wanted = 4 * rayon::current_num_threads();
    let tile_panels = panels.div_ceil(wanted.div_ceil(row_chunks)).clamp(1, TILE_PANELS);
    let panel_tiles = panels.div_ceil(tile_panels);
    out.par_chunks_mut(TILE_ROWS * n)
        .enumerate()
        .for_each(|(chunk, out_rows)| {
            let rows = chunk * TILE_ROWS..chunk * TILE_ROWS + out_rows.len() / n;
            let tiles: Vec<Vec<f32>> = (0..panel_tiles)
                .into_par_iter()
                .map(|t| tile(rows.clone(), t * tile_panels..((t + 1) * tile_panels).min(panels)))
                .collect();
            for (t, tile) in tiles.iter().enumerate() {
                let (first_col, width) = (t * tile_panels * NR, tile.len() / rows.len());
                for (out_row, tile_row) in out_rows.chunks_exact_mut(n).zip(tile.chunks_exact(width)) {
                    for (o, &v) in out_row[first_col..first_col + width].iter_mut().zip(tile_row) {
                        *o = T::from_f32(v);
                    }
                }
            }
        });
}

/// The `MR × NR` int32 dots of one K block: `dots[i][j] = Σ_pairs lo(a_i)·b[j][0] + hi(a_i)·b[j][1]`, for `a` rows
/// of i16 pairs and `b` one packed (panel, block) `[pairs][NR][2]`. Exact: each product fits i16 × i16 and a
/// block (at most [`MAX_EXACT_BLOCK`]) sums below 2^31. Portable and autovectorisable.
#[inline(always)]
fn block_dots_portable(a: &[&[i32]; MR], b: &[i8]) -> [[i32; NR]; MR] {
    let mut dots = [[0i32; NR]; MR];
    for (p, b_pair) in b.chunks_exact(2 * NR).enumerate() {
        for (dot_row, a_row) in dots.iter_mut().zip(a) {
            let (lo, hi) = (a_row[p] as i16 as i32, a_row[p] >> 16);
            for (j, dot) in dot_row.iter_mut().enumerate() {
                *dot += lo * b_pair[2 * j] as i32 + hi * b_pair[2 * j + 1] as i32;
            }
        }
    }
    dots
}

/// [`block_dots_portable`] with AVX2: per pair step, one `vpmaddwd` per (row, 8 columns).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_dots_avx2(a: &[&[i32]; MR], b: &[i8]) -> [[i32; NR]; MR] {
    use std::arch::x86_64::*;
    const { assert!(NR == 16, "two registers of 8 int32 lanes per row") };
    let steps = b.len() / (2 * NR);
    let a = a.map(|row| &row[..steps]); // bounds-checked once; the loop below stays in range
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for p in 0..steps {
        let b_pair = b.as_ptr().add(p * 2 * NR);
        // 16 codes (8 columns × 2) widened to i16.
        let b_low = _mm256_cvtepi8_epi16(_mm_loadu_si128(b_pair.cast()));
        let b_high = _mm256_cvtepi8_epi16(_mm_loadu_si128(b_pair.add(NR).cast()));
        for (acc_row, a_row) in acc.iter_mut().zip(&a) {
            let a_pair = _mm256_set1_epi32(*a_row.get_unchecked(p));
            acc_row[0] = _mm256_add_epi32(acc_row[0], _mm256_madd_epi16(a_pair, b_low));
            acc_row[1] = _mm256_add_epi32(acc_row[1], _mm256_madd_epi16(a_pair, b_high));
        }
    }
    let mut dots = [[0i32; NR]; MR];
    for (dot_row, acc_row) in dots.iter_mut().zip(&acc) {
        _mm256_storeu_si256(dot_row.as_mut_ptr().cast(), acc_row[0]);
        _mm256_storeu_si256(dot_row.as_mut_ptr().add(8).cast(), acc_row[1]);
    }
    dots
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable micro-kernel (what non-AVX2 CPUs run) and the AVX2 one against a plain dot, on packed data
    /// with extreme codes.
    #[test]
    fn micro_kernels_agree_with_plain_dots() {
        let (n, k, block) = (NR + 3, 70, 35);
        let mut state = 0x1234_5678_u32;
        let mut code = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8 as i8
        };
        let w_codes: Vec<i8> = (0..n * k).map(|i| if i % 11 == 0 { -128 } else { code() }).collect();
        let a_codes: Vec<i8> = (0..MR * k).map(|i| if i % 7 == 0 { -128 } else { code() }).collect();
        let w = PackedWeight::new(&w_codes, n, k, block);
        let pairs = w.pack_activations(&a_codes, MR);
        let row_pairs = w.blocks * w.padded_block / 2;
        for panel in 0..w.panels {
            for blk in 0..w.blocks {
                let a: [&[i32]; MR] =
                    std::array::from_fn(|i| &pairs[i * row_pairs + blk * w.padded_block / 2..][..w.padded_block / 2]);
                let b = w.panel_block(panel, blk);
                let portable = block_dots_portable(&a, b);
                for (i, dot_row) in portable.iter().enumerate() {
                    for (j, &dot) in dot_row.iter().enumerate() {
                        let c = panel * NR + j;
                        let want: i32 = if c < n {
                            (blk * block..(blk + 1) * block)
                                .map(|kk| a_codes[i * k + kk] as i32 * w_codes[c * k + kk] as i32)
                                .sum()
                        } else {
                            0
                        };
                        assert_eq!(dot, want, "panel {panel} block {blk} row {i} col {j}");
                    }
                }
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 is present (checked just above).
                    assert_eq!(unsafe { block_dots_avx2(&a, b) }, portable);
                }
            }
        }
    }
}
