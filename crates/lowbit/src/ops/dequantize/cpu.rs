//! CPU dequantization, parallel with rayon.
//!
//! Each value is `T::from_f32((code - zero) as f32 * scale)`: the product of a small integer and an f16/bf16 scale
//! is exact in f32, so there is a single rounding, to `T` — what AutoAWQ's `dequantize_gemm` and the CUDA kernel
//! produce, bit for bit.
//!
//! Both layouts compute runs of up to [`RUN`] outputs in f32 (widen, subtract, multiply; compiled for AVX2 where the
//! CPU has it) and round each run to `T` with one [`Float::from_f32_slice`] (eight values per instruction on F16C
//! CPUs). `[N, K]` walks each weight row group by group. `[K, N]` is cut into tasks of [`BLOCK_K`] output rows, and
//! those into tiles of [`TILE_K`] × [`TILE_N`]: a tile's codes are read along K and transposed in L1, 8 × 8 bytes at
//! a time, so that every output row of the tile is written as one contiguous run. A task finishes one strip of
//! `TILE_N` columns before the next, so the pages it reads and writes meanwhile stay within the TLB's reach (rows of
//! `[N, K]` and of `[K, N]` lie a page or more apart; a page walk per access is what makes a plain scatter slow).

use super::Layout;
use crate::dtype::Float;
use crate::error::{ensure, Result};
use crate::formats::QuantMatrix;
use rayon::prelude::*;
use std::iter::repeat;

/// Outputs computed in f32 before one bulk rounding to `T` (a stack buffer that stays in L1).
const RUN: usize = 256;
/// `[K, N]` output rows per task.
const BLOCK_K: usize = 256;
/// `[K, N]` output rows per tile.
const TILE_K: usize = 64;
/// `[K, N]` output columns per tile: the tile's transposed codes (`TILE_K × TILE_N` bytes) stay in L1, and each
/// output row receives whole cache lines.
const TILE_N: usize = 128;
const _: () = assert!(TILE_N <= RUN && TILE_K % 8 == 0 && TILE_N % 8 == 0);

/// Dequantizes `q` into `out` (`N * K` values) in `layout`.
pub fn dequantize<T: Float>(q: &QuantMatrix, layout: Layout, out: &mut [T]) -> Result<()> {
    q.validate()?;
    ensure(
        out.len() == q.n * q.k,
        "out",
        format!("{} elements", out.len()),
        &format!("must hold N*K = {} values", q.n * q.k),
    )?;
    match layout {
        Layout::Nk => out
            .par_chunks_mut(q.k)
            .enumerate()
            .for_each(|(n, row)| dequantize_row(q, n, row)),
        Layout::Kn => out
            .par_chunks_mut(BLOCK_K * q.n)
            .enumerate()
            .for_each(|(block, rows)| dequantize_transposed_rows(q, block * BLOCK_K, rows)),
    }
    Ok(())
}

/// Fills `out` (`K` values) with the weight row `W[n, ..]`.
fn dequantize_row<T: Float>(q: &QuantMatrix, n: usize, out: &mut [T]) {
    let codes = &q.codes[n * q.k..][..q.k];
    let stride = q.groups_stride();
    let scales = &q.scales[n * stride..][..stride];
    let mut scratch = [0f32; RUN];
    match &q.g_idx {
        Some(g_idx) => {
            // Act-order: the group changes from input to input, so gather each input's zero and scale.
            let (mut run_zeros, mut run_scales) = ([0f32; RUN], [0f32; RUN]);
            for (start, (codes, out)) in codes.chunks(RUN).zip(out.chunks_mut(RUN)).enumerate() {
                let len = codes.len();
                for (i, &g) in g_idx[start * RUN..][..len].iter().enumerate() {
                    let g = g as usize;
                    (run_zeros[i], run_scales[i]) = (q.zero(n, g) as f32, scales[g]);
                }
                let (zeros, scales) = (run_zeros[..len].iter().copied(), run_scales[..len].iter().copied());
                dequantize_run(codes, zeros, scales, out, &mut scratch);
            }
        }
        None => {
            for (g, (codes, out)) in codes.chunks(q.group_size).zip(out.chunks_mut(q.group_size)).enumerate() {
                let (zero, scale) = (q.zero(n, g) as f32, scales[g]);
                for (codes, out) in codes.chunks(RUN).zip(out.chunks_mut(RUN)) {
                    dequantize_run(codes, repeat(zero), repeat(scale), out, &mut scratch);
                }
            }
        }
    }
}

/// Fills `out` (whole rows of `W^T`, `[K, N]`) with rows `k0 ..` of `W^T`: a strip of `TILE_N` columns at a time,
/// each strip a tile of `TILE_K` rows at a time.
fn dequantize_transposed_rows<T: Float>(q: &QuantMatrix, k0: usize, out: &mut [T]) {
    let rows = out.len() / q.n;
    let stride = q.groups_stride();
    let mut codes_t = [0u8; TILE_K * TILE_N];
    let (mut zeros, mut scales, mut scratch) = ([0f32; TILE_N], [0f32; TILE_N], [0f32; RUN]);
    for n0 in (0..q.n).step_by(TILE_N) {
        let cols = TILE_N.min(q.n - n0);
        let mut group = usize::MAX;
        for r0 in (0..rows).step_by(TILE_K) {
            let tile_rows = TILE_K.min(rows - r0);
            // The next tile's codes and outputs lie in as many pages as it has columns and rows: too many streams
            // for the hardware prefetchers, so ask for them while this tile computes.
            let next = if r0 + TILE_K < rows {
                Some((n0, cols, r0 + TILE_K))
            } else {
                (n0 + TILE_N < q.n).then(|| (n0 + TILE_N, TILE_N.min(q.n - n0 - TILE_N), 0))
            };
            if let Some((n0, cols, r0)) = next {
                let tile_rows = TILE_K.min(rows - r0);
                for j in n0..n0 + cols {
                    prefetch(&q.codes[j * q.k + k0 + r0..][..tile_rows]);
                }
                for r in r0..r0 + tile_rows {
                    prefetch(&out[r * q.n + n0..][..cols]);
                }
            }
            transpose_codes(q, n0, cols, k0 + r0, tile_rows, &mut codes_t);
            for r in 0..tile_rows {
                let g = q.group_of(k0 + r0 + r);
                if g != group {
                    // The zero and scale of each column of the strip in group g (refreshed once per group, or per
                    // row with act-order).
                    group = g;
                    for j in 0..cols {
                        (zeros[j], scales[j]) = (q.zero(n0 + j, g) as f32, q.scales[(n0 + j) * stride + g]);
                    }
                }
                let codes = &codes_t[r * TILE_N..][..cols];
                let (zeros, scales) = (zeros[..cols].iter().copied(), scales[..cols].iter().copied());
                dequantize_run(
                    codes,
                    zeros,
                    scales,
                    &mut out[(r0 + r) * q.n + n0..][..cols],
                    &mut scratch,
                );
            }
        }
    }
}

/// `codes_t[r * TILE_N + j] = W[n0 + j, k0 + r]` for `j < cols`, `r < rows`: whole 8 × 8 blocks as words, the
/// ragged edges (N or K not a multiple of 8) byte by byte.
fn transpose_codes(q: &QuantMatrix, n0: usize, cols: usize, k0: usize, rows: usize, codes_t: &mut [u8]) {
    let code_row = |j: usize| &q.codes[(n0 + j) * q.k + k0..][..rows];
    let (block_cols, block_rows) = (cols / 8 * 8, rows / 8 * 8);
    for j in (0..block_cols).step_by(8) {
        for r in (0..block_rows).step_by(8) {
            let block = std::array::from_fn(|c| u64::from_le_bytes(code_row(j + c)[r..r + 8].try_into().unwrap()));
            for (i, word) in transpose_8x8(block).iter().enumerate() {
                codes_t[(r + i) * TILE_N + j..][..8].copy_from_slice(&word.to_le_bytes());
            }
        }
    }
    for j in 0..cols {
        let first_row = if j < block_cols { block_rows } else { 0 };
        for (r, &code) in code_row(j).iter().enumerate().skip(first_row) {
            codes_t[r * TILE_N + j] = code;
        }
    }
}

/// Asks the cache for every line of `data`, ahead of use (a hint; nothing off x86-64).
#[inline]
fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        let (start, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
        // One address in each line `data` touches: every LINE bytes, and its last byte.
        for offset in (0..bytes).step_by(LINE).chain(bytes.checked_sub(1)) {
            // SAFETY: a prefetch never faults and has no effect but on the cache; the address lies within `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Transposes an 8 × 8 byte block held as eight little-endian words: byte `c` of `a[r]` becomes byte `r` of word
/// `c`. Three rounds swap 1-, 2- and 4-byte sub-blocks between pairs of words (SWAR: plain integer operations).
#[inline(always)]
fn transpose_8x8(mut a: [u64; 8]) -> [u64; 8] {
    const ROUNDS: [(u32, u64, [(usize, usize); 4]); 3] = [
        (8, 0x00FF_00FF_00FF_00FF, [(0, 1), (2, 3), (4, 5), (6, 7)]),
        (16, 0x0000_FFFF_0000_FFFF, [(0, 2), (1, 3), (4, 6), (5, 7)]),
        (32, 0x0000_0000_FFFF_FFFF, [(0, 4), (1, 5), (2, 6), (3, 7)]),
    ];
    for (shift, mask, pairs) in ROUNDS {
        for (i, j) in pairs {
            let t = ((a[i] >> shift) ^ a[j]) & mask;
            a[j] ^= t;
            a[i] ^= t << shift;
        }
    }
    a
}

/// `out[i] = T::from_f32((codes[i] - zeros[i]) * scales[i])` for a run of at most [`RUN`] outputs, through the f32
/// values in `scratch` (the caller's, so that it is not zeroed for every run); compiled for AVX2 + F16C where the
/// CPU has them.
#[inline]
fn dequantize_run<T: Float>(
    codes: &[u8],
    zeros: impl Iterator<Item = f32>,
    scales: impl Iterator<Item = f32>,
    out: &mut [T],
    scratch: &mut [f32; RUN],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has AVX2 and F16C (checked just above), the features the function is compiled for.
        return unsafe { dequantize_run_avx2(codes, zeros, scales, out, scratch) };
    }
    dequantize_run_body(codes, zeros, scales, out, scratch)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_run_avx2<T: Float>(
    codes: &[u8],
    zeros: impl Iterator<Item = f32>,
    scales: impl Iterator<Item = f32>,
    out: &mut [T],
    scratch: &mut [f32; RUN],
) {
    dequantize_run_body(codes, zeros, scales, out, scratch)
}

/// [`dequantize_run`], compiled once per instruction set.
#[inline(always)]
fn dequantize_run_body<T: Float>(
    codes: &[u8],
    zeros: impl Iterator<Item = f32>,
    scales: impl Iterator<Item = f32>,
    out: &mut [T],
    scratch: &mut [f32; RUN],
) {
    let values = &mut scratch[..codes.len()];
    for (((v, &code), zero), scale) in values.iter_mut().zip(codes).zip(zeros).zip(scales) {
        *v = (code as f32 - zero) * scale;
    }
    T::from_f32_slice(values, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_8x8_moves_byte_c_of_word_r_to_byte_r_of_word_c() {
        let a: [u64; 8] = std::array::from_fn(|r| u64::from_le_bytes(std::array::from_fn(|c| (16 * r + c) as u8)));
        let t = transpose_8x8(a);
        for (r, word) in a.iter().enumerate() {
            for c in 0..8 {
                assert_eq!(t[c].to_le_bytes()[r], word.to_le_bytes()[c], "r {r} c {c}");
            }
        }
    }
}
