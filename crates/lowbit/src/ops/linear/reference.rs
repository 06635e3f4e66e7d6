//! The ground truth for the linear layer: every weight dequantized exactly, every product accumulated in f64.
//!
//! Slow on purpose: no blocking, no reordering tricks, nothing that could share a bug with a kernel.

use crate::formats::QuantMatrix;
use rayon::prelude::*;

/// `W` as `[N, K]` f64, each element exactly `(code - zero) * scale` (exact: a small integer times an f32).
///
/// Panics if `w` breaks its invariants (run [`QuantMatrix::validate`] first); this is a test and baseline helper.
pub fn dequantized(w: &QuantMatrix) -> Vec<f64> {
    let groups = w.groups();
    let mut out = vec![0.0; w.n * w.k];
    for (n, row) in out.chunks_exact_mut(w.k).enumerate() {
        for (k, v) in row.iter_mut().enumerate() {
            let g = w.group_of(k);
            let code = f64::from(w.codes[n * w.k + k]);
            let zero = f64::from(w.zero(n, g));
            *v = (code - zero) * f64::from(w.scales[n * groups + g]);
        }
    }
    out
}

/// `y[M, N] = x[M, K] · W^T (+ bias)` with `W` dequantized exactly and f64 accumulation in order of `k`.
///
/// `x` is `[M, K]` row-major (contiguous rows), `bias` has `N` elements. Panics on mismatched lengths: this is the
/// reference for tests and benchmarks, not an entry point for user data.
pub fn linear(x: &[f32], m: usize, w: &QuantMatrix, bias: Option<&[f32]>) -> Vec<f64> {
    assert_eq!(
        x.len(),
        m * w.k,
        "reference::linear: x must hold M*K = {}*{} values",
        m,
        w.k
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), w.n, "reference::linear: bias must hold N = {} values", w.n);
    }
    let weight = dequantized(w);
    let mut y = vec![0.0; m * w.n];
    if w.n == 0 {
        return y;
    }
    y.par_chunks_exact_mut(w.n).enumerate().for_each(|(row, y_row)| {
        let x_row = &x[row * w.k..(row + 1) * w.k];
        for (n, out) in y_row.iter_mut().enumerate() {
            let w_row = &weight[n * w.k..(n + 1) * w.k];
            let dot: f64 = x_row.iter().zip(w_row).map(|(&a, &b)| f64::from(a) * b).sum();
            *out = dot + bias.map_or(0.0, |b| f64::from(b[n]));
        }
    });
    y
}
