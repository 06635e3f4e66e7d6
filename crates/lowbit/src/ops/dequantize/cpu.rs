//! CPU dequantization, parallel over rows with rayon.
//!
//! Each value is `T::from_f32(((code - zero) as f32) * scale)`: the product of a small integer and an f16/bf16
//! scale is exact in f32, so there is a single rounding, to `T` — what AutoAWQ's `dequantize_gemm` and the CUDA
//! kernel produce, bit for bit.

use super::Layout;
use crate::dtype::Float;
use crate::error::{ensure, Result};
use crate::formats::QuantMatrix;
use rayon::prelude::*;

/// K rows of a `[K, N]` output that one task fills: each weight row contributes a contiguous run of codes, and
/// the 64 output rows it scatters into stay in cache.
const KN_TILE: usize = 64;

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
            .for_each(|(n, row)| dequantize_span(q, n, 0, row)),
        Layout::Kn => out.par_chunks_mut(KN_TILE * q.n).enumerate().for_each(|(tile, dst)| {
            let k0 = tile * KN_TILE;
            let rows = dst.len() / q.n;
            let mut span = [T::default(); KN_TILE];
            for n in 0..q.n {
                dequantize_span(q, n, k0, &mut span[..rows]);
                for (r, &v) in span[..rows].iter().enumerate() {
                    dst[r * q.n + n] = v;
                }
            }
        }),
    }
    Ok(())
}

/// Fills `out` with `W[n, k0 .. k0 + out.len()]`.
fn dequantize_span<T: Float>(q: &QuantMatrix, n: usize, k0: usize, out: &mut [T]) {
    let codes = &q.codes[n * q.k + k0..][..out.len()];
    let stride = q.groups_stride();
    let scales = &q.scales[n * stride..][..stride];
    let value = |code: u8, zero: i32, scale: f32| T::from_f32((code as i32 - zero) as f32 * scale);
    match &q.g_idx {
        Some(g_idx) => {
            for ((o, &code), &g) in out.iter_mut().zip(codes).zip(&g_idx[k0..]) {
                let g = g as usize;
                *o = value(code, q.zero(n, g) as i32, scales[g]);
            }
        }
        None => {
            // Walk the contiguous runs of one group; for int4, convert the 16 possible values once per run.
            let mut start = 0;
            while start < out.len() {
                let g = (k0 + start) / q.group_size;
                let end = ((g + 1) * q.group_size - k0).min(out.len());
                let (zero, scale) = (q.zero(n, g) as i32, scales[g]);
                let (run, run_codes) = (&mut out[start..end], &codes[start..end]);
                if q.bits == 4 {
                    let lut: [T; 16] = std::array::from_fn(|c| value(c as u8, zero, scale));
                    for (o, &code) in run.iter_mut().zip(run_codes) {
                        *o = lut[code as usize & 15];
                    }
                } else {
                    for (o, &code) in run.iter_mut().zip(run_codes) {
                        *o = value(code, zero, scale);
                    }
                }
                start = end;
            }
        }
    }
}
