//! GPTQ (AutoGPTQ / GPTQModel checkpoints, read by vLLM), 4-bit or 8-bit.
//!
//! | tensor | shape | dtype | packing |
//! |---|---|---|---|
//! | `qweight` | `[K/P, N]` | int32 | `P = 32/bits` codes along **K**: element k at row k/P, shift bits·(k%P) |
//! | `qzeros`  | `[K/G, N/P]` | int32 | along N, natural order |
//! | `scales`  | `[K/G, N]` | f16 (bf16, f32 accepted) | |
//! | `g_idx`   | `[K]` | int32 | group of input k (act-order / `desc_act`); trivially `k / G` |
//!
//! `W^T[k, n] = (q - z[g_idx[k], n]) * s[g_idx[k], n]`. `checkpoint_format: "gptq"` (v1) stores `z - 1` (so a
//! zero code of 0 cannot be written, and a stored field of `2^bits - 1` would mean an out-of-range zero);
//! `"gptq_v2"` stores `z`. Symmetric int4 zero words are `0x77777777` in v1 and `0x88888888` in v2.

use super::{
    cannot_hold, check_scales_storable, dims2_nonempty, input, natural_order, nontrivial_g_idx, pack_words, per_word,
    read_g_idx, read_group_scales, tensor_name, transpose, unpack_words, zeros_or_midpoint, Axis, GroupAxis,
    QuantMatrix, WordLayout,
};
use crate::dtype::DType;
use crate::error::{ensure, Error, Result};
use crate::tensor::{Tensor, TensorRef};

/// Checkpoint name suffix of the packed codes.
pub const QWEIGHT: &str = "qweight";
/// Checkpoint name suffix of the packed zero codes.
pub const QZEROS: &str = "qzeros";
/// Checkpoint name suffix of the scales.
pub const SCALES: &str = "scales";
/// Checkpoint name suffix of the group index of each input.
pub const G_IDX: &str = "g_idx";
/// `qweight` `[K/P, N]`: packed along K, stored K major.
const QWEIGHT_LAYOUT: WordLayout = WordLayout {
    packed: Axis::X,
    major: Axis::X,
};
/// `qzeros` `[K/G, N/P]`: packed along N, stored group major.
const QZEROS_LAYOUT: WordLayout = WordLayout {
    packed: Axis::N,
    major: Axis::X,
};

/// How zero codes are stored (`quantization_config.checkpoint_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GptqVersion {
    /// `"gptq"`: stores `z - 1` (readers add 1).
    V1,
    /// `"gptq_v2"`: stores `z`.
    V2,
}

impl GptqVersion {
    /// What is subtracted from a zero code before storing it.
    pub fn zero_offset(self) -> u8 {
        match self {
            GptqVersion::V1 => 1,
            GptqVersion::V2 => 0,
        }
    }

    /// The `checkpoint_format` string: `gptq` or `gptq_v2`.
    pub fn checkpoint_format(self) -> &'static str {
        match self {
            GptqVersion::V1 => "gptq",
            GptqVersion::V2 => "gptq_v2",
        }
    }

    /// Parses a `checkpoint_format` value (`gptq`, `gptq_v2`; `v1`, `v2` also accepted).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "gptq" | "v1" => Ok(GptqVersion::V1),
            "gptq_v2" | "v2" => Ok(GptqVersion::V2),
            _ => Err(Error::invalid(
                "checkpoint_format",
                format!("{s:?}"),
                "must be \"gptq\" (v1) or \"gptq_v2\"",
            )),
        }
    }
}

/// A GPTQ weight, tensors kept as stored in the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct GptqWeight {
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// 4 or 8.
    pub bits: u8,
    /// Inputs per group (`K / groups`; `k` for per-channel, the config's `-1`).
    pub group_size: usize,
    /// How `qzeros` stores zero codes.
    pub version: GptqVersion,
    /// `[K/P, N]` packed codes.
    pub qweight: Vec<i32>,
    /// `[K/G, N/P]` packed zero codes, with the version's offset applied.
    pub qzeros: Vec<i32>,
    /// `[K/G, N]` scales, exact values of `scale_dtype`.
    pub scales: Vec<f32>,
    /// The dtype the scales are stored in.
    pub scale_dtype: DType,
    /// `[K]` group of each input, as stored; `None` when the checkpoint has none (trivial `k / G`).
    pub g_idx: Option<Vec<u32>>,
}

impl GptqWeight {
    /// Number of scale groups.
    pub fn groups(&self) -> usize {
        self.scales.len() / self.n.max(1)
    }

    /// Reads and validates the tensors of layer `prefix` (errors name `prefix.qweight` etc.). `bits` and `version`
    /// come from the config; the group count is `scales.rows`. `g_idx` is optional.
    pub fn from_tensors(
        prefix: &str,
        bits: u8,
        version: GptqVersion,
        qweight: &TensorRef,
        qzeros: &TensorRef,
        scales: &TensorRef,
        g_idx: Option<&TensorRef>,
    ) -> Result<Self> {
        ensure(bits == 4 || bits == 8, "bits", bits, "GPTQ bits must be 4 or 8")?;
        let per = per_word(bits);
        let qweight = input(prefix, QWEIGHT, qweight)?;
        let qzeros = input(prefix, QZEROS, qzeros)?;
        let scales = input(prefix, SCALES, scales)?;

        let (word_rows, n) = dims2_nonempty(&qweight, &format!("[K/{per}, N]"))?;
        ensure(
            n % per == 0,
            &qweight.name,
            format!("shape {:?}", qweight.shape),
            &format!("N must be a multiple of {per} (qzeros packs {per} columns per word)"),
        )?;
        let k = word_rows * per;
        let qweight_words = qweight.to_i32()?;
        let (scale_values, scale_dtype, groups) = read_group_scales(&scales, n, k, GroupAxis::Rows)?;
        qzeros.expect_shape(&[groups, n / per], &format!("[K/G, N/{per}]"))?;
        let qzeros_words = qzeros.to_i32()?;
        if version == GptqVersion::V1 {
            // v1 stores z - 1, so the all-ones field would decode to z = 2^bits, which no code can hold.
            let all_ones = (1u32 << bits) - 1;
            for (i, &w) in qzeros_words.iter().enumerate() {
                if let Some(f) = (0..per).find(|f| (w as u32 >> (bits as usize * f)) & all_ones == all_ones) {
                    return Err(Error::invalid(
                        &qzeros.name,
                        format!("word {i} = {:#010x}, field {f} = {all_ones}", w as u32),
                        format!(
                            "GPTQ v1 stores z - 1; a field of {all_ones} would mean z = {}",
                            all_ones + 1
                        ),
                    ));
                }
            }
        }

        let g_idx = read_g_idx(prefix, G_IDX, g_idx, k, groups)?;
        Ok(Self {
            n,
            k,
            bits,
            group_size: k / groups,
            version,
            qweight: qweight_words,
            qzeros: qzeros_words,
            scales: scale_values,
            scale_dtype,
            g_idx,
        })
    }

    /// The checkpoint tensors of layer `prefix`: `qweight`, `qzeros`, `scales`, `g_idx` (always written, trivial
    /// when absent, as AutoGPTQ does).
    pub fn to_tensors(&self, prefix: &str) -> Vec<(String, Tensor)> {
        let per = per_word(self.bits);
        let groups = self.groups();
        let g_idx: Vec<i32> = match &self.g_idx {
            Some(g) => g.iter().map(|&x| x as i32).collect(),
            None => (0..self.k).map(|k| (k / self.group_size) as i32).collect(),
        };
        vec![
            (
                tensor_name(prefix, QWEIGHT),
                Tensor::from_i32(vec![self.k / per, self.n], &self.qweight),
            ),
            (
                tensor_name(prefix, QZEROS),
                Tensor::from_i32(vec![groups, self.n / per], &self.qzeros),
            ),
            (
                tensor_name(prefix, SCALES),
                Tensor::from_f32(vec![groups, self.n], &self.scales, self.scale_dtype),
            ),
            (tensor_name(prefix, G_IDX), Tensor::from_i32(vec![self.k], &g_idx)),
        ]
    }

    /// Packs `q` in `version`'s zero convention. Fails with [`crate::Error::Conversion`] where K or N is not a
    /// multiple of `32 / bits`, or (v1) a zero code is 0. A symmetric `q` gets zeros `2^(bits-1)`.
    pub fn from_quant(q: &QuantMatrix, version: GptqVersion) -> Result<Self> {
        q.validate()?;
        check_scales_storable(q)?;
        let per = per_word(q.bits);
        let target = format!("GPTQ ({})", version.checkpoint_format());
        for (dim, value, what) in [("K", q.k, "qweight packs"), ("N", q.n, "qzeros packs")] {
            if value % per != 0 {
                return Err(cannot_hold(
                    q,
                    &target,
                    format!("{dim} = {value} must be a multiple of {per} ({what} {per} codes per word)"),
                ));
            }
        }
        let groups = q.scales.len() / q.n;
        let mut zeros = zeros_or_midpoint(q);
        let offset = version.zero_offset();
        if let Some(i) = zeros.iter().position(|&z| z < offset) {
            return Err(cannot_hold(
                q,
                &target,
                format!(
                    "zero code 0 (row {}, group {}) cannot be stored: GPTQ v1 stores z - 1",
                    i / groups,
                    i % groups
                ),
            ));
        }
        zeros.iter_mut().for_each(|z| *z -= offset);

        let order = natural_order(q.bits);
        Ok(Self {
            n: q.n,
            k: q.k,
            bits: q.bits,
            group_size: q.k / groups,
            version,
            qweight: pack_words(&q.codes, q.n, q.k, q.bits, order, QWEIGHT_LAYOUT),
            qzeros: pack_words(&zeros, q.n, groups, q.bits, order, QZEROS_LAYOUT),
            scales: transpose(&q.scales, q.n, groups),
            scale_dtype: q.scale_dtype,
            g_idx: q.g_idx.clone(),
        })
    }

    /// Unpacks into a [`QuantMatrix`] with real zero codes (the v1 offset undone; zeros always `Some`) and
    /// `g_idx` only where it is non-trivial.
    ///
    /// Assumes the invariants [`GptqWeight::from_tensors`] / [`GptqWeight::from_quant`] establish.
    pub fn to_quant(&self) -> QuantMatrix {
        let groups = self.groups();
        let order = natural_order(self.bits);
        let mut zeros = unpack_words(&self.qzeros, self.n, groups, self.bits, order, QZEROS_LAYOUT);
        let offset = self.version.zero_offset();
        zeros.iter_mut().for_each(|z| *z += offset);
        QuantMatrix {
            n: self.n,
            k: self.k,
            bits: self.bits,
            group_size: self.group_size,
            codes: unpack_words(&self.qweight, self.n, self.k, self.bits, order, QWEIGHT_LAYOUT),
            zeros: Some(zeros),
            scales: transpose(&self.scales, groups, self.n),
            scale_dtype: self.scale_dtype,
            g_idx: nontrivial_g_idx(self.g_idx.clone(), self.group_size),
        }
    }

    /// The same weight with its zeros stored in `version`'s convention (v2 → v1 fails where a zero code is 0).
    pub fn to_version(&self, version: GptqVersion) -> Result<Self> {
        if version == self.version {
            return Ok(self.clone());
        }
        let mut out = Self::from_quant(&self.to_quant(), version)?;
        // Keep the checkpoint's g_idx tensor as it was, trivial or not.
        out.g_idx = self.g_idx.clone();
        Ok(out)
    }
}
