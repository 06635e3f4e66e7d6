//! The f64 ground truth of dequantization: `W[n, k] = (code - zero) * scale`, each factor exactly as stored.

use crate::formats::QuantMatrix;

/// The dense `[N, K]` weight of `q` in f64 (exact: every value is a small integer times an f32).
///
/// `q` must satisfy [`QuantMatrix::validate`]; this is a test oracle and indexes without checking.
pub fn dequantize(q: &QuantMatrix) -> Vec<f64> {
    let stride = q.scales.len() / q.n.max(1);
    let mut out = Vec::with_capacity(q.n * q.k);
    for n in 0..q.n {
        for k in 0..q.k {
            let g = q.group_of(k);
            let centered = q.codes[n * q.k + k] as f64 - q.zero(n, g) as f64;
            out.push(centered * q.scales[n * stride + g] as f64);
        }
    }
    out
}
