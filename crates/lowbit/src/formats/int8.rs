//! int8 weight-only, as compressed-tensors writes it (`format: "int-quantized"` / `"naive-quantized"`,
//! `num_bits: 8`, `type: "int"`, strategy `channel` or `group`), which vLLM reads as W8A16.
//!
//! | tensor | shape | dtype | meaning |
//! |---|---|---|---|
//! | `weight` | `[N, K]` | int8 | signed codes `q ∈ [-128, 127]`, unpacked |
//! | `weight_scale` | `[N, K/G]` | f16 / bf16 / f32 | `[N, 1]` per channel; `[]`/`[1]` (per tensor) is read as `[N, 1]` |
//! | `weight_zero_point` | `[N, K/G]` | int8 | optional (asymmetric; symmetric checkpoints omit it) |
//!
//! `W[n, k] = (q - zp) * s`. lowbit's unsigned codes are `q + 128` (zero code `zp + 128`).

use super::{
    cannot_hold, check_scales_storable, dims2_nonempty, input, read_group_scales, tensor_name, GroupAxis, QuantMatrix,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::{Tensor, TensorRef};

/// Checkpoint name suffix of the int8 codes.
pub const WEIGHT: &str = "weight";
/// Checkpoint name suffix of the scales.
pub const WEIGHT_SCALE: &str = "weight_scale";
/// Checkpoint name suffix of the zero points (asymmetric only).
pub const WEIGHT_ZERO_POINT: &str = "weight_zero_point";
/// Code width.
pub const BITS: u8 = 8;
/// Signed code + `OFFSET` = lowbit's unsigned code.
const OFFSET: i16 = 128;

/// An int8 weight-only weight, tensors kept as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8Weight {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Inputs per group (`k` per channel).
    pub group_size: usize,
    /// `[N, K]` signed codes.
    pub weight: Vec<i8>,
    /// `[N, K/G]` scales, exact values of `scale_dtype`.
    pub weight_scale: Vec<f32>,
    /// The dtype the scales are stored in.
    pub scale_dtype: DType,
    /// `[N, K/G]` signed zero points; `None` when symmetric.
    pub weight_zero_point: Option<Vec<i8>>,
}

impl Int8Weight {
    /// Number of scale groups.
    pub fn groups(&self) -> usize {
        self.k / self.group_size
    }

    /// Reads and validates the tensors of layer `prefix` (errors name `prefix.weight` etc.). The group count is
    /// `weight_scale.cols`.
    pub fn from_tensors(
        prefix: &str,
        weight: &TensorRef,
        weight_scale: &TensorRef,
        weight_zero_point: Option<&TensorRef>,
    ) -> Result<Self> {
        let weight = input(prefix, WEIGHT, weight)?;
        let scale = input(prefix, WEIGHT_SCALE, weight_scale)?;

        let (n, k) = dims2_nonempty(&weight, "[N, K]")?;
        let codes = weight.to_i8()?;

        let (scale_values, scale_dtype, groups) = if scale.numel() == 1 && scale.shape.len() <= 1 {
            // Per-tensor scale: one group per row, every row the same.
            let value = scale.to_finite_f32()?[0];
            (vec![value; n], scale.dtype, 1)
        } else {
            read_group_scales(&scale, n, k, GroupAxis::Cols)?
        };

        let zero_point = match weight_zero_point {
            Some(t) => {
                let zp = input(prefix, WEIGHT_ZERO_POINT, t)?;
                zp.expect_shape(&[n, groups], "[N, K/G] (same as weight_scale)")?;
                Some(zp.to_i8()?)
            }
            None => None,
        };
        Ok(Self {
            n,
            k,
            group_size: k / groups,
            weight: codes,
            weight_scale: scale_values,
            scale_dtype,
            weight_zero_point: zero_point,
        })
    }

    /// The checkpoint tensors of layer `prefix`: `weight` (int8), `weight_scale` `[N, K/G]`, and
    /// `weight_zero_point` where present.
    pub fn to_tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let groups = self.groups();
        let mut out = vec![
            (
                tensor_name(prefix, WEIGHT),
                Tensor::from_i8(vec![self.n, self.k], &self.weight),
            ),
            (
                tensor_name(prefix, WEIGHT_SCALE),
                Tensor::from_f32(vec![self.n, groups], &self.weight_scale, self.scale_dtype),
            ),
        ];
        if let Some(zp) = &self.weight_zero_point {
            out.push((
                tensor_name(prefix, WEIGHT_ZERO_POINT),
                Tensor::from_i8(vec![self.n, groups], zp),
            ));
        }
        out
    }

    /// Converts `q`; fails with [`crate::Error::Conversion`] unless it is 8-bit without act-order `g_idx`.
    pub fn from_quant(q: &QuantMatrix) -> Result<Self> {
        q.validate()?;
        check_scales_storable(q)?;
        if q.bits != BITS {
            return Err(cannot_hold(
                q,
                "int8",
                format!("int8 weight-only holds 8-bit codes (got {})", q.bits),
            ));
        }
        if !q.has_trivial_g_idx() {
            return Err(cannot_hold(
                q,
                "int8",
                "act-order g_idx cannot be stored: int8 weight-only has no g_idx",
            ));
        }
        let to_signed = |c: &u8| (*c as i16 - OFFSET) as i8;
        Ok(Self {
            n: q.n,
            k: q.k,
            group_size: q.k / (q.scales.len() / q.n),
            weight: q.codes.iter().map(to_signed).collect(),
            weight_scale: q.scales.clone(),
            scale_dtype: q.scale_dtype,
            weight_zero_point: q.zeros.as_ref().map(|z| z.iter().map(to_signed).collect()),
        })
    }

    /// Converts into a [`QuantMatrix`] (zeros `None` when symmetric).
    pub fn to_quant(&self) -> QuantMatrix {
        let to_code = |q: &i8| (*q as i16 + OFFSET) as u8;
        QuantMatrix {
            n: self.n,
            k: self.k,
            bits: BITS,
            group_size: self.group_size,
            codes: self.weight.iter().map(to_code).collect(),
            zeros: self.weight_zero_point.as_ref().map(|z| z.iter().map(to_code).collect()),
            scales: self.weight_scale.clone(),
            scale_dtype: self.scale_dtype,
            g_idx: None,
        }
    }
}
