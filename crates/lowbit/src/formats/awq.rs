//! AutoAWQ's GEMM layout (`version: "gemm"`, the layout vLLM and SGLang read), 4-bit only.
//!
//! | tensor | shape | dtype | packing |
//! |---|---|---|---|
//! | `<layer>.qweight` | `[K, N/8]` | int32 | 8 codes along **N** per word, interleaved |
//! | `<layer>.qzeros`  | `[K/G, N/8]` | int32 | 8 zero codes along N per word, same interleave |
//! | `<layer>.scales`  | `[K/G, N]` | f16 (bf16, f32 accepted) | plain |
//!
//! Nibble `i` of word `c` holds column `8c + ORDER[i]`, `ORDER = [0, 2, 4, 6, 1, 3, 5, 7]` (what lets the
//! lop3 int4→fp16 trick emit columns in natural order). `W^T[k, n] = (q[k, n] - z[k/G, n]) * s[k/G, n]`;
//! zeros are stored as plain 0..15. AWQ always stores zeros, so a symmetric weight is written with zeros 8.

use super::{
    cannot_hold, check_scales_storable, dims2_nonempty, input, pack_words, read_group_scales, tensor_name, transpose,
    unpack_words, zeros_or_midpoint, Axis, GroupAxis, QuantMatrix, WordLayout,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::{Tensor, TensorRef};

/// Checkpoint name suffix of the packed codes.
pub const QWEIGHT: &str = "qweight";
/// Checkpoint name suffix of the packed zero codes.
pub const QZEROS: &str = "qzeros";
/// Checkpoint name suffix of the scales.
pub const SCALES: &str = "scales";
/// Code width: the GEMM layout is int4 only.
pub const BITS: u8 = 4;
/// Codes per int32 word.
pub const PACK: usize = 8;
/// Nibble `i` of a word holds column `8c + ORDER[i]`.
pub const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
/// Column `8c + j` sits in nibble `INV_ORDER[j]` (the inverse permutation of [`ORDER`]).
pub const INV_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
/// `qweight` `[K, N/8]` and `qzeros` `[K/G, N/8]`: packed along N, stored K (or group) major.
const LAYOUT: WordLayout = WordLayout {
    packed: Axis::N,
    major: Axis::X,
};

/// An AWQ GEMM-layout weight, tensors kept as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct AwqWeight {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Inputs per group along K (`k` for per-channel).
    pub group_size: usize,
    /// `[K, N/8]` packed codes.
    pub qweight: Vec<i32>,
    /// `[K/G, N/8]` packed zero codes.
    pub qzeros: Vec<i32>,
    /// `[K/G, N]` scales, exact values of `scale_dtype`.
    pub scales: Vec<f32>,
    /// The dtype the scales are stored in.
    pub scale_dtype: DType,
}

impl AwqWeight {
    /// Number of groups along K.
    pub fn groups(&self) -> usize {
        self.k / self.group_size
    }

    /// Reads and validates the three tensors of layer `prefix` (errors name `prefix.qweight` etc.). The group
    /// size is `K / scales.rows`.
    pub fn from_tensors(prefix: &str, qweight: &TensorRef, qzeros: &TensorRef, scales: &TensorRef) -> Result<Self> {
        let qweight = input(prefix, QWEIGHT, qweight)?;
        let qzeros = input(prefix, QZEROS, qzeros)?;
        let scales = input(prefix, SCALES, scales)?;

        let (k, word_cols) = dims2_nonempty(&qweight, "[K, N/8]")?;
        let n = word_cols * PACK;
        let qweight_words = qweight.to_i32()?;
        let (scale_values, scale_dtype, groups) = read_group_scales(&scales, n, k, GroupAxis::Rows)?;
        qzeros.expect_shape(&[groups, word_cols], "[K/G, N/8]")?;
        let qzeros_words = qzeros.to_i32()?;

        Ok(Self {
            n,
            k,
            group_size: k / groups,
            qweight: qweight_words,
            qzeros: qzeros_words,
            scales: scale_values,
            scale_dtype,
        })
    }

    /// The checkpoint tensors of layer `prefix`: `prefix.qweight`, `prefix.qzeros`, `prefix.scales`.
    pub fn to_tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let groups = self.groups();
        vec![
            (
                tensor_name(prefix, QWEIGHT),
                Tensor::from_i32(vec![self.k, self.n / PACK], &self.qweight),
            ),
            (
                tensor_name(prefix, QZEROS),
                Tensor::from_i32(vec![groups, self.n / PACK], &self.qzeros),
            ),
            (
                tensor_name(prefix, SCALES),
                Tensor::from_f32(vec![groups, self.n], &self.scales, self.scale_dtype),
            ),
        ]
    }

    /// Packs `q`. Fails with [`crate::Error::Conversion`] for 8-bit codes, a non-trivial (act-order) `g_idx` or
    /// N not a multiple of 8; a symmetric `q` is stored with zeros 8.
    pub fn from_quant(q: &QuantMatrix) -> Result<Self> {
        q.validate()?;
        check_scales_storable(q)?;
        if q.bits != BITS {
            return Err(cannot_hold(
                q,
                "AWQ",
                format!("the AWQ GEMM layout holds {BITS}-bit codes only"),
            ));
        }
        if !q.has_trivial_g_idx() {
            return Err(cannot_hold(
                q,
                "AWQ",
                "act-order g_idx cannot be stored: AWQ has no g_idx (groups are contiguous runs of K)",
            ));
        }
        if q.n % PACK != 0 {
            return Err(cannot_hold(
                q,
                "AWQ",
                format!(
                    "N = {} must be a multiple of {PACK} (qweight packs {PACK} columns per word)",
                    q.n
                ),
            ));
        }
        let groups = q.scales.len() / q.n;
        Ok(Self {
            n: q.n,
            k: q.k,
            group_size: q.k / groups,
            qweight: pack_words(&q.codes, q.n, q.k, BITS, &ORDER, LAYOUT),
            qzeros: pack_words(&zeros_or_midpoint(q), q.n, groups, BITS, &ORDER, LAYOUT),
            scales: transpose(&q.scales, q.n, groups),
            scale_dtype: q.scale_dtype,
        })
    }

    /// Unpacks into a [`QuantMatrix`] (zeros always `Some`; see [`QuantMatrix::drop_symmetric_zeros`]).
    ///
    /// Assumes the invariants [`AwqWeight::from_tensors`] / [`AwqWeight::from_quant`] establish.
    pub fn to_quant(&self) -> QuantMatrix {
        let groups = self.groups();
        QuantMatrix {
            n: self.n,
            k: self.k,
            bits: BITS,
            group_size: self.group_size,
            codes: unpack_words(&self.qweight, self.n, self.k, BITS, &ORDER, LAYOUT),
            zeros: Some(unpack_words(&self.qzeros, self.n, groups, BITS, &ORDER, LAYOUT)),
            scales: transpose(&self.scales, groups, self.n),
            scale_dtype: self.scale_dtype,
            g_idx: None,
        }
    }
}
