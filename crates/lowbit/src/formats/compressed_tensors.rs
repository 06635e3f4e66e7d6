//! compressed-tensors `pack-quantized` (llm-compressor checkpoints, read by vLLM), int4 or int8 codes.
//!
//! | tensor | shape | dtype | packing |
//! |---|---|---|---|
//! | `weight_packed` | `[N, K/P]` | int32 | signed `q` stored as `q + 2^(bits-1)`, `P = 32/bits` along **K**, natural order |
//! | `weight_scale` | `[N, K/G]` | f16 / bf16 / f32 | plain (`[N, 1]` per channel) |
//! | `weight_zero_point` | `[N/P, K/G]` | int32 | optional (asymmetric); signed zp + `2^(bits-1)` packed along **N** |
//! | `weight_shape` | `[2]` | int32 | `[N, K]` |
//! | `weight_g_idx` | `[K]` | int32 | optional (act-order) |
//!
//! `W[n, k] = (q - zp) * s` with signed `q` and `zp`; the stored `q + 2^(bits-1)` is exactly lowbit's unsigned
//! code, so packing is a plain bit copy. Symmetric int4 `weight_packed` transposed equals GPTQ v2 `qweight`.
//! compressed-tensors pads K and N up to whole words; lowbit requires them to be multiples of `P` instead.

use super::{
    cannot_hold, check_scales_storable, dims2_nonempty, input, natural_order, nontrivial_g_idx, pack_words, per_word,
    read_g_idx, read_group_scales, tensor_name, unpack_words, Axis, GroupAxis, QuantMatrix, WordLayout,
};
use crate::dtype::DType;
use crate::error::{ensure, Result};
use crate::tensor::{Tensor, TensorRef};

/// Checkpoint name suffix of the packed codes.
pub const WEIGHT_PACKED: &str = "weight_packed";
/// Checkpoint name suffix of the scales.
pub const WEIGHT_SCALE: &str = "weight_scale";
/// Checkpoint name suffix of the packed zero points (asymmetric only).
pub const WEIGHT_ZERO_POINT: &str = "weight_zero_point";
/// Checkpoint name suffix of the `[N, K]` shape tensor.
pub const WEIGHT_SHAPE: &str = "weight_shape";
/// Checkpoint name suffix of the act-order group index.
pub const WEIGHT_G_IDX: &str = "weight_g_idx";
/// `weight_packed` `[N, K/P]`: packed along K, stored N major.
const WEIGHT_LAYOUT: WordLayout = WordLayout {
    packed: Axis::X,
    major: Axis::N,
};
/// `weight_zero_point` `[N/P, K/G]`: packed along N, stored N major.
const ZERO_POINT_LAYOUT: WordLayout = WordLayout {
    packed: Axis::N,
    major: Axis::N,
};

/// A compressed-tensors `pack-quantized` weight, tensors kept as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedTensorsWeight {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// 4 or 8 (`num_bits`).
    pub bits: u8,
    /// Inputs per group (`k` for the `channel` strategy).
    pub group_size: usize,
    /// `[N, K/P]` packed unsigned codes.
    pub weight_packed: Vec<i32>,
    /// `[N, K/G]` scales, exact values of `scale_dtype`.
    pub weight_scale: Vec<f32>,
    /// The dtype the scales are stored in.
    pub scale_dtype: DType,
    /// `[N/P, K/G]` packed unsigned zero codes; `None` when symmetric.
    pub weight_zero_point: Option<Vec<i32>>,
    /// `[K]` act-order group of each input, when the checkpoint has one.
    pub g_idx: Option<Vec<u32>>,
}

impl CompressedTensorsWeight {
    /// Number of scale groups.
    pub fn groups(&self) -> usize {
        self.weight_scale.len() / self.n.max(1)
    }

    /// Reads and validates the tensors of layer `prefix` (errors name `prefix.weight_packed` etc.). `bits` is the
    /// config's `num_bits`; the group count is `weight_scale.cols`. `weight_shape`, when given, must be int32
    /// `[N, K]` matching `weight_packed` (no padding).
    pub fn from_tensors(
        prefix: &str,
        bits: u8,
        weight_packed: &TensorRef,
        weight_scale: &TensorRef,
        weight_zero_point: Option<&TensorRef>,
        weight_shape: Option<&TensorRef>,
        weight_g_idx: Option<&TensorRef>,
    ) -> Result<Self> {
        ensure(
            bits == 4 || bits == 8,
            "num_bits",
            bits,
            "pack-quantized num_bits must be 4 or 8",
        )?;
        let per = per_word(bits);
        let packed = input(prefix, WEIGHT_PACKED, weight_packed)?;
        let scale = input(prefix, WEIGHT_SCALE, weight_scale)?;

        let (n, word_cols) = dims2_nonempty(&packed, &format!("[N, K/{per}]"))?;
        let k = word_cols * per;
        let packed_words = packed.to_i32()?;

        if let Some(t) = weight_shape {
            let shape = input(prefix, WEIGHT_SHAPE, t)?;
            shape.expect_shape(&[2], "[2] = [N, K]")?;
            let dims = shape.to_i32()?;
            ensure(
                dims[0] as i64 == n as i64 && dims[1] as i64 == k as i64,
                &shape.name,
                format!("{dims:?}"),
                &format!("must equal [N, K] = [{n}, {k}] from weight_packed (lowbit does not take padded K)"),
            )?;
        }

        let (scale_values, scale_dtype, groups) = read_group_scales(&scale, n, k, GroupAxis::Cols)?;

        let zero_point = match weight_zero_point {
            Some(t) => {
                let zp = input(prefix, WEIGHT_ZERO_POINT, t)?;
                ensure(
                    n % per == 0,
                    &zp.name,
                    format!("N = {n}"),
                    &format!("N must be a multiple of {per} to pack zero points along N"),
                )?;
                zp.expect_shape(&[n / per, groups], &format!("[N/{per}, K/G]"))?;
                Some(zp.to_i32()?)
            }
            None => None,
        };
        let g_idx = read_g_idx(prefix, WEIGHT_G_IDX, weight_g_idx, k, groups)?;
        Ok(Self {
            n,
            k,
            bits,
            group_size: k / groups,
            weight_packed: packed_words,
            weight_scale: scale_values,
            scale_dtype,
            weight_zero_point: zero_point,
            g_idx,
        })
    }

    /// The checkpoint tensors of layer `prefix`: `weight_packed`, `weight_scale`, `weight_shape` (int32), and
    /// `weight_zero_point` / `weight_g_idx` where present.
    pub fn to_tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let per = per_word(self.bits);
        let groups = self.groups();
        let mut out = vec![
            (
                tensor_name(prefix, WEIGHT_PACKED),
                Tensor::from_i32(vec![self.n, self.k / per], &self.weight_packed),
            ),
            (
                tensor_name(prefix, WEIGHT_SCALE),
                Tensor::from_f32(vec![self.n, groups], &self.weight_scale, self.scale_dtype),
            ),
            (
                tensor_name(prefix, WEIGHT_SHAPE),
                Tensor::from_i32(vec![2], &[self.n as i32, self.k as i32]),
            ),
        ];
        if let Some(zp) = &self.weight_zero_point {
            out.push((
                tensor_name(prefix, WEIGHT_ZERO_POINT),
                Tensor::from_i32(vec![self.n / per, groups], zp),
            ));
        }
        if let Some(g) = &self.g_idx {
            let g: Vec<i32> = g.iter().map(|&x| x as i32).collect();
            out.push((tensor_name(prefix, WEIGHT_G_IDX), Tensor::from_i32(vec![self.k], &g)));
        }
        out
    }

    /// Packs `q`; zero points are written only when `q.zeros` is `Some` (see
    /// [`QuantMatrix::drop_symmetric_zeros`]). Fails with [`crate::Error::Conversion`] where K (or, with zero
    /// points, N) is not a multiple of `32 / bits`.
    pub fn from_quant(q: &QuantMatrix) -> Result<Self> {
        q.validate()?;
        check_scales_storable(q)?;
        let per = per_word(q.bits);
        let target = "compressed-tensors";
        if q.k % per != 0 {
            return Err(cannot_hold(
                q,
                target,
                format!(
                    "K = {} must be a multiple of {per} (weight_packed packs {per} codes per word)",
                    q.k
                ),
            ));
        }
        let groups = q.scales.len() / q.n;
        let order = natural_order(q.bits);
        let zero_point = match &q.zeros {
            Some(z) => {
                if q.n % per != 0 {
                    return Err(cannot_hold(
                        q,
                        target,
                        format!("N = {} must be a multiple of {per} to pack zero points along N", q.n),
                    ));
                }
                Some(pack_words(z, q.n, groups, q.bits, order, ZERO_POINT_LAYOUT))
            }
            None => None,
        };
        Ok(Self {
            n: q.n,
            k: q.k,
            bits: q.bits,
            group_size: q.k / groups,
            weight_packed: pack_words(&q.codes, q.n, q.k, q.bits, order, WEIGHT_LAYOUT),
            weight_scale: q.scales.clone(),
            scale_dtype: q.scale_dtype,
            weight_zero_point: zero_point,
            g_idx: q.g_idx.clone(),
        })
    }

    /// Unpacks into a [`QuantMatrix`] (zeros `None` when the checkpoint has no zero point; `g_idx` only where it
    /// is non-trivial).
    ///
    /// Assumes the invariants [`CompressedTensorsWeight::from_tensors`] / [`CompressedTensorsWeight::from_quant`]
    /// establish.
    pub fn to_quant(&self) -> QuantMatrix {
        let groups = self.groups();
        let order = natural_order(self.bits);
        let zeros = (self.weight_zero_point.as_ref())
            .map(|zp| unpack_words(zp, self.n, groups, self.bits, order, ZERO_POINT_LAYOUT));
        QuantMatrix {
            n: self.n,
            k: self.k,
            bits: self.bits,
            group_size: self.group_size,
            codes: unpack_words(&self.weight_packed, self.n, self.k, self.bits, order, WEIGHT_LAYOUT),
            zeros,
            scales: self.weight_scale.clone(),
            scale_dtype: self.scale_dtype,
            g_idx: nontrivial_g_idx(self.g_idx.clone(), self.group_size),
        }
    }
}
