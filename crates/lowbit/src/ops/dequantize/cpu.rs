//! CPU dequantization, parallel with rayon.
//!
//! Each value is `T::from_f32((code - zero) as f32 * scale)`: the product of a small integer and an f16/bf16 scale
//! is exact in f32, so there is a single rounding, to `T` — what AutoAWQ's `dequantize_gemm` and the CUDA kernel
//! produce, bit for bit.
//!
//! Both layouts compute runs of up to `RUN` outputs in f32 (widen, subtract, multiply; compiled for AVX2 where the
//! CPU has it) and round each run to `T` with one [`Float::from_f32_slice`] (eight values per instruction on F16C
//! CPUs). `[N, K]` walks each weight row group by group.
//!
//! `[K, N]` gives each task a band of output rows and walks it one strip of `TILE_N` columns at a time, each strip
//! in tiles of `TILE_K` rows: a tile's codes are read along K and transposed in L1 (16 × 16 bytes per SSE2 step
//! on x86-64), so every output row of the tile is written as one contiguous run. The rows of `[N, K]` (and of
//! `[K, N]`) usually lie a whole number of pages apart, so a tile touches a page per row: walking a strip down the
//! band reuses the same code pages while they are in the TLB, and the next tile's codes are prefetched into L2
//! (into L1 they would evict each other: equal offsets in rows 4 KiB apart share one L1 set).

use super::Layout;
use crate::dtype::Float;
use crate::error::{ensure, Result};
use crate::formats::QuantMatrix;
use rayon::prelude::*;
use std::iter::repeat;

/// Outputs computed in f32 before one bulk rounding to `T` (a stack buffer that stays in L1).
const RUN: usize = 256;
/// Most `[K, N]` output rows per task (its code pages and output pages stay within the TLB's reach).
const MAX_BLOCK_K: usize = 1024;
/// `[K, N]` output rows per tile.
const TILE_K: usize = 64;
/// `[K, N]` output columns per tile: the tile's transposed codes (`TILE_K × TILE_N` bytes) stay in L1, and each
/// output row receives whole cache lines.
const TILE_N: usize = 128;
const _: () = assert!(TILE_N <= RUN && TILE_K % 16 == 0 && TILE_N % 16 == 0 && MAX_BLOCK_K % TILE_K == 0);

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
        Layout::Kn => {
            // Bands of whole tiles, at least four per thread when K allows.
            let band = q.k.div_ceil(4 * rayon::current_num_threads()).next_multiple_of(TILE_K);
            let band = band.min(MAX_BLOCK_K);
            out.par_chunks_mut(band * q.n)
                .enumerate()
                .for_each(|(i, rows)| dequantize_transposed_rows(q, i * band, rows))
        }
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
            // The next tile's codes: one line in each of `cols` pages, too many streams for the hardware prefetchers.
            let next = if r0 + TILE_K < rows {
                Some((n0, cols, r0 + TILE_K))
            } else {
                (n0 + TILE_N < q.n).then(|| (n0 + TILE_N, TILE_N.min(q.n - n0 - TILE_N), 0))
            };
            if let Some((n0, cols, r0)) = next {
                for j in n0..n0 + cols {
                    prefetch_l2(&q.codes[j * q.k + k0 + r0..][..TILE_K.min(rows - r0)]);
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

/// `codes_t[r * TILE_N + j] = W[n0 + j, k0 + r]` for `j < cols`, `r < rows`: whole 16 × 16 blocks with SSE2 on
/// x86-64, the ragged edges (and everything elsewhere) byte by byte.
fn transpose_codes(q: &QuantMatrix, n0: usize, cols: usize, k0: usize, rows: usize, codes_t: &mut [u8]) {
    let code_row = |j: usize| &q.codes[(n0 + j) * q.k + k0..][..rows];
    let (block_cols, block_rows) = if cfg!(target_arch = "x86_64") {
        (cols / 16 * 16, rows / 16 * 16)
    } else {
        (0, 0)
    };
    #[cfg(target_arch = "x86_64")]
    for j in (0..block_cols).step_by(16) {
        for r in (0..block_rows).step_by(16) {
            let block = std::array::from_fn(|i| &code_row(j + i)[r..r + 16]);
            transpose_16x16(block, &mut codes_t[r * TILE_N + j..], TILE_N);
        }
    }
    for j in 0..cols {
        let first_row = if j < block_cols { block_rows } else { 0 };
        for (r, &code) in code_row(j).iter().enumerate().skip(first_row) {
            codes_t[r * TILE_N + j] = code;
        }
    }
}

/// Transposes a 16 × 16 byte block with SSE2 (part of every x86-64 CPU): `dst[c * dst_stride + i] = rows[i][c]`.
/// Four rounds interleave registers `i` and `i + d` (d = 1, 2, 4, 8) in units of `d` bytes; after the last, register
/// `c` holds column `c`.
#[cfg(target_arch = "x86_64")]
fn transpose_16x16(rows: [&[u8]; 16], dst: &mut [u8], dst_stride: usize) {
    use std::arch::x86_64::*;
    #[inline(always)]
    fn round(a: [__m128i; 16], d: usize, unpack: impl Fn(__m128i, __m128i) -> (__m128i, __m128i)) -> [__m128i; 16] {
        let mut out = a;
        for block in (0..16).step_by(2 * d) {
            for h in 0..d {
                (out[block + 2 * h], out[block + 2 * h + 1]) = unpack(a[block + h], a[block + h + d]);
            }
        }
        out
    }
    assert!(rows.iter().all(|row| row.len() >= 16) && dst.len() >= 15 * dst_stride + 16);
    // SAFETY: SSE2 is part of x86-64; every load and store stays inside `rows` and `dst` (asserted above).
    unsafe {
        let a = std::array::from_fn(|i| _mm_loadu_si128(rows[i].as_ptr().cast()));
        let a = round(a, 1, |x, y| (_mm_unpacklo_epi8(x, y), _mm_unpackhi_epi8(x, y)));
        let a = round(a, 2, |x, y| (_mm_unpacklo_epi16(x, y), _mm_unpackhi_epi16(x, y)));
        let a = round(a, 4, |x, y| (_mm_unpacklo_epi32(x, y), _mm_unpackhi_epi32(x, y)));
        let a = round(a, 8, |x, y| (_mm_unpacklo_epi64(x, y), _mm_unpackhi_epi64(x, y)));
        for (c, column) in a.iter().enumerate() {
            _mm_storeu_si128(dst[c * dst_stride..].as_mut_ptr().cast(), *column);
        }
    }
}

/// Asks for every cache line of `data` to be brought into L2 ahead of use (a hint; nothing off x86-64).
#[inline]
fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        const LINE: usize = 64;
        let (start, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
        // One address in each line `data` touches: every LINE bytes, and its last byte.
        for offset in (0..bytes).step_by(LINE).chain(bytes.checked_sub(1)) {
            // SAFETY: a prefetch never faults and has no effect but on the cache; the address lies within `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn transpose_16x16_puts_byte_c_of_row_i_at_row_c_column_i() {
        let rows: Vec<Vec<u8>> = (0..16).map(|i| (0..16).map(|c| (16 * i + c) as u8).collect()).collect();
        let mut dst = [0u8; 16 * 20];
        transpose_16x16(std::array::from_fn(|i| &rows[i][..]), &mut dst, 20);
        for (i, row) in rows.iter().enumerate() {
            for (c, &byte) in row.iter().enumerate() {
                assert_eq!(dst[c * 20 + i], byte, "row {i} column {c}");
            }
        }
    }
}
