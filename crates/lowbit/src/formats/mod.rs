//! Quantized weight formats: one module per checkpoint format, all meeting in [`QuantMatrix`].
//!
//! Every format unpacks losslessly into a [`QuantMatrix`] (unsigned codes, zero codes, scales, optional `g_idx`)
//! and packs back from one, so conversion between formats is `unpack` then `pack`, failing with
//! [`crate::Error::Conversion`] where the target cannot hold what the source has.
//! Exact layouts: `shared/formats.md` (summarised in each module's docs).

pub mod awq;
pub mod block;
pub mod compressed_tensors;
pub mod gptq;
pub mod int8;

use crate::dtype::DType;
use crate::error::{ensure, Result};

/// A format-neutral quantized linear weight: `W[n, k] = (codes[n, k] - zero[n, g]) * scale[n, g]`.
///
/// Orientation follows `nn.Linear`: `N` = out_features rows, `K` = in_features columns, groups run along K.
/// Codes are unsigned (`0..2^bits`); a signed format stores `q + 2^(bits-1)`. Scales are kept as f32 holding
/// exactly the values of `scale_dtype` (f16/bf16 convert to f32 without loss), so nothing is rounded twice.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    /// Output features (rows of W).
    pub n: usize,
    /// Input features (columns of W).
    pub k: usize,
    /// 4 or 8.
    pub bits: u8,
    /// Inputs per group along K; `k` for per-channel.
    pub group_size: usize,
    /// `[N, K]` row-major unsigned codes, one per byte.
    pub codes: Vec<u8>,
    /// `[N, groups]` unsigned zero codes; `None` means symmetric (zero = `2^(bits-1)`).
    pub zeros: Option<Vec<u8>>,
    /// `[N, groups]` scales (exact values of `scale_dtype`).
    pub scales: Vec<f32>,
    /// The dtype the scales are stored in by the source format (f16 or bf16 for checkpoints).
    pub scale_dtype: DType,
    /// Group of each input `k` (GPTQ act-order); `None` means `k / group_size`.
    pub g_idx: Option<Vec<u32>>,
}

impl QuantMatrix {
    /// Number of scale/zero groups per output row.
    pub fn groups(&self) -> usize {
        match &self.g_idx {
            Some(g) => g.iter().map(|&x| x as usize + 1).max().unwrap_or(0),
            None => self.k.div_ceil(self.group_size),
        }
    }

    /// The group of input `k`.
    #[inline]
    pub fn group_of(&self, k: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[k] as usize,
            None => k / self.group_size,
        }
    }

    /// The zero code of row `n`, group `g`.
    #[inline]
    pub fn zero(&self, n: usize, g: usize) -> u8 {
        match &self.zeros {
            Some(z) => z[n * self.groups_stride() + g],
            None => 1 << (self.bits - 1),
        }
    }

    /// Row stride of `scales`/`zeros`: the group count, cached-free (cheap for the no-g_idx case).
    #[inline]
    pub(crate) fn groups_stride(&self) -> usize {
        self.scales.len() / self.n.max(1)
    }

    /// Whether `g_idx` is absent or equal to the trivial `k / group_size` (so formats without g_idx can hold it).
    pub fn has_trivial_g_idx(&self) -> bool {
        match &self.g_idx {
            None => true,
            Some(g) => g.iter().enumerate().all(|(k, &x)| x as usize == k / self.group_size),
        }
    }

    /// Checks every invariant: shapes, code range, finite non-NaN scales, g_idx range.
    pub fn validate(&self) -> Result<()> {
        ensure(
            self.bits == 4 || self.bits == 8,
            "bits",
            self.bits,
            "bits must be 4 or 8",
        )?;
        ensure(
            self.n > 0 && self.k > 0,
            "weight",
            format!("shape [{}, {}]", self.n, self.k),
            "N and K must be positive",
        )?;
        ensure(
            self.group_size > 0 && (self.group_size == self.k || self.k % self.group_size == 0),
            "group_size",
            self.group_size,
            "group size must divide K",
        )?;
        ensure(
            self.codes.len() == self.n * self.k,
            "codes",
            format!("{} elements", self.codes.len()),
            &format!("must hold N*K = {} codes", self.n * self.k),
        )?;
        let max = (1u32 << self.bits) - 1;
        if let Some(i) = self.codes.iter().position(|&c| c as u32 > max) {
            return Err(crate::Error::invalid(
                "codes",
                format!("{} at index {i}", self.codes[i]),
                "codes must fit in `bits`",
            ));
        }
        let groups = self.groups();
        ensure(
            self.scales.len() == self.n * groups,
            "scales",
            format!("{} elements", self.scales.len()),
            &format!("must hold N*groups = {} scales", self.n * groups),
        )?;
        if let Some(i) = self.scales.iter().position(|s| !s.is_finite()) {
            return Err(crate::Error::invalid(
                "scales",
                format!("{} at index {i}", self.scales[i]),
                "scales must be finite",
            ));
        }
        if let Some(z) = &self.zeros {
            ensure(
                z.len() == self.n * groups,
                "zeros",
                format!("{} elements", z.len()),
                "must hold one zero per scale",
            )?;
            if let Some(i) = z.iter().position(|&c| c as u32 > max) {
                return Err(crate::Error::invalid(
                    "zeros",
                    format!("{} at index {i}", z[i]),
                    "zero codes must fit in `bits`",
                ));
            }
        }
        if let Some(g) = &self.g_idx {
            ensure(
                g.len() == self.k,
                "g_idx",
                format!("{} elements", g.len()),
                "g_idx must have K elements",
            )?;
        }
        Ok(())
    }
}
