//! MNN-style per-block quantized weights in offset form (seed 004): `w = q · scale + offset`, signed `q`.
//!
//! A [`BlockQuantWeight`] has `rows` (`Co` of a convolution, `N` of a linear layer) and, per row, `channels`
//! input channels times `Kh·Kw` kernel taps (`K` and 1×1 for a linear layer). Codes are stored `[rows, channels,
//! Kh, Kw]` (PyTorch's `OIHW`), one signed code per byte: int4 `[−8, 7]`, int8 `[−128, 127]`.
//!
//! Blocks run along input channels only, as MNN's `quanC` does: each row has `blocks` parameter pairs
//! (`scale`, `offset`), block `b` covers channels `b·block_channels ..` and is shared by all kernel taps, so the
//! parameter of `(row, ci)` is `row · blocks + ci / block_channels` (MNN: `blocks = quanC / Co`,
//! `ci_per_block = Ci / blocks`). In the `[rows, channels·taps]` view a block is therefore a contiguous run of
//! `block_channels · taps` columns. A linear weight may end in a shorter block (K = 3884 with blocks of 64); a
//! convolution built with [`BlockShape::conv`] has equal blocks, as MNN requires.
//!
//! MNN's int4 byte layout is `[Co, Kh, Kw, ⌈Ci/2⌉]` bytes, two input channels per byte with the **even** channel
//! in the high nibble: `q_even = (b >> 4) − 8`, `q_odd = (b & 15) − 8` ([`BlockQuantWeight::from_mnn_int4_bytes`],
//! [`BlockQuantWeight::to_mnn_int4_bytes`]).

use crate::error::{ensure, Error, Result};
use crate::formats::QuantMatrix;

/// Code width of a block-quantized weight; codes are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockBits {
    /// Codes in `[−8, 7]`.
    Int4,
    /// Codes in `[−128, 127]`.
    Int8,
}

impl BlockBits {
    /// The bit count, 4 or 8.
    pub fn bits(self) -> u8 {
        match self {
            BlockBits::Int4 => 4,
            BlockBits::Int8 => 8,
        }
    }

    /// Smallest code: `−2^(bits−1)`.
    pub fn q_min(self) -> i32 {
        -(1 << (self.bits() - 1))
    }

    /// Largest code: `2^(bits−1) − 1`.
    pub fn q_max(self) -> i32 {
        (1 << (self.bits() - 1)) - 1
    }
}

/// Asymmetric offset-form parameters of one block with values in `[min, max]`, computed in f32 exactly as
/// MNN (formats.md) states: `scale = (max − min) / (2^bits − 1)`, `offset = max − q_max · scale`, so `max` maps to
/// `q_max` and `min` to `q_min`.
///
/// Degenerate rule: where `scale` comes out zero or subnormal (an all-equal or all-zero block) it is replaced by
/// `scale = 1, offset = max`; every value then quantizes to 0 and dequantizes to `max`, exactly for an all-equal
/// block. (MNN's `|scale| > 1e-5` test would also collapse blocks of small but distinct values; this one does not.)
/// `max − min` must be finite, which the caller checks.
#[inline]
pub fn offset_form_params(min: f32, max: f32, bits: BlockBits) -> (f32, f32) {
    let levels = ((1u32 << bits.bits()) - 1) as f32;
    let scale = (max - min) / levels;
    if scale >= f32::MIN_POSITIVE {
        (scale, max - bits.q_max() as f32 * scale)
    } else {
        (1.0, max)
    }
}

/// The code of `value` in a block with `scale`/`offset`: `clamp(round((value − offset) / scale), q_min, q_max)`,
/// f32 arithmetic, rounding half away from zero (C `roundf`, as MNN's kernels). A NaN `value` gives `q_min`
/// (callers reject non-finite data before quantizing).
#[inline(always)]
pub fn quantize_offset_form(value: f32, scale: f32, offset: f32, q_min: f32, q_max: f32) -> i8 {
    // Clamping one step wider first changes no result but bounds `x`, so the rounding below is exact.
    let x = ((value - offset) / scale).max(q_min - 1.0).min(q_max + 1.0);
    (round_half_away_from_zero(x).clamp(q_min as i32, q_max as i32)) as i8
}

/// `x.round() as i32` for `|x| < 2^22`, in branch-free float and integer operations that vectorise (`f32::round`
/// is a libm call on CPUs without SSE4.1, and float-to-int casts saturate lane by lane).
#[inline(always)]
fn round_half_away_from_zero(x: f32) -> i32 {
    // Adding 1.5·2^23 rounds to an integer (ties to even) that then sits in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let shifted = x + MAGIC;
    let nearest_even = shifted - MAGIC;
    let q = shifted.to_bits() as i32 - MAGIC.to_bits() as i32;
    // Ties to even differ from ties away from zero where the tie went towards zero: step one away.
    let tie_towards_zero = (x - nearest_even).abs() == 0.5 && nearest_even.abs() < x.abs();
    let away = if x > 0.0 { 1 } else { -1 };
    q + if tie_towards_zero { away } else { 0 }
}

/// Geometry of a [`BlockQuantWeight`]: rows, input channels, kernel size and channels per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockShape {
    /// Output channels `Co` (conv) or output features `N` (linear).
    pub rows: usize,
    /// Input channels per row: `Ci / groups` (conv) or `K` (linear).
    pub channels: usize,
    /// Kernel size `(Kh, Kw)`; `(1, 1)` for a linear layer.
    pub kernel: (usize, usize),
    /// Input channels per block (`ci_per_block`); the last block of a row may be shorter.
    pub block_channels: usize,
}

impl BlockShape {
    /// A linear weight `[N, K]` with blocks of `block_size` along K (the last block may be partial).
    pub fn linear(n: usize, k: usize, block_size: usize) -> Self {
        Self {
            rows: n,
            channels: k,
            kernel: (1, 1),
            block_channels: block_size,
        }
    }

    /// A convolution weight `[Co, Ci/groups, Kh, Kw]` with `blocks` equal blocks per output channel along the
    /// input channels (MNN: `blocks = quanC / Co`); `channels_per_group` must be a multiple of `blocks`.
    pub fn conv(co: usize, channels_per_group: usize, kernel: (usize, usize), blocks: usize) -> Result<Self> {
        ensure(
            blocks > 0,
            "blocks",
            blocks,
            "blocks per output channel (quanC / Co) must be positive",
        )?;
        ensure(
            channels_per_group % blocks == 0,
            "blocks",
            format!("{blocks} blocks over {channels_per_group} input channels"),
            "input channels per group must be a multiple of the blocks per output channel (ci_per_block = Ci / blocks)",
        )?;
        let shape = Self {
            rows: co,
            channels: channels_per_group,
            kernel,
            block_channels: channels_per_group / blocks,
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Kernel taps `Kh · Kw`.
    pub fn taps(&self) -> usize {
        self.kernel.0 * self.kernel.1
    }

    /// Columns per row: `channels · Kh · Kw`.
    pub fn cols(&self) -> usize {
        self.channels * self.taps()
    }

    /// Blocks per row: `⌈channels / block_channels⌉`.
    pub fn blocks(&self) -> usize {
        self.channels.div_ceil(self.block_channels)
    }

    /// Columns of a full block: `block_channels · Kh · Kw`.
    pub fn block_cols(&self) -> usize {
        self.block_channels * self.taps()
    }

    /// The column range of block `b` in a row (the last block may be shorter).
    pub fn block_col_range(&self, b: usize) -> std::ops::Range<usize> {
        let start = b * self.block_cols();
        start..(start + self.block_cols()).min(self.cols())
    }

    /// Checks that every dimension is positive and a block is at most a row.
    pub fn validate(&self) -> Result<()> {
        let (kh, kw) = self.kernel;
        ensure(
            self.rows > 0 && self.channels > 0 && kh > 0 && kw > 0,
            "weight",
            format!("shape [{}, {}, {kh}, {kw}]", self.rows, self.channels),
            "rows, channels and kernel size must be positive",
        )?;
        ensure(
            self.block_channels > 0 && self.block_channels <= self.channels,
            "block_size",
            self.block_channels,
            &format!("channels per block must be in 1..={}", self.channels),
        )?;
        // Every flat index (codes, parameters) must fit in usize; reject absurd shapes before allocating.
        ensure(
            self.rows.checked_mul(self.cols()).is_some(),
            "weight",
            format!("shape [{}, {}, {kh}, {kw}]", self.rows, self.channels),
            "element count must fit in usize",
        )
    }
}

/// A per-block quantized weight in offset form: `w[r, c] = q[r, c] · scale[r, b] + offset[r, b]`,
/// `b` the block of column `c` (see the module docs for the geometry).
///
/// Fields are private so the invariants checked at construction (shapes, code range, finite parameters) hold.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockQuantWeight {
    shape: BlockShape,
    bits: BlockBits,
    /// `[rows, channels, Kh, Kw]` signed codes, one per byte.
    codes: Vec<i8>,
    /// `[rows, blocks]`.
    scales: Vec<f32>,
    /// `[rows, blocks]`.
    offsets: Vec<f32>,
}

impl BlockQuantWeight {
    /// Quantizes dense weights `[rows, channels, Kh, Kw]` by round-to-nearest per block in offset form, as MNN
    /// does: per (row, block) `min`/`max` over all channels and taps of the block, parameters from
    /// [`offset_form_params`], codes from [`quantize_offset_form`].
    pub fn quantize(dense: &[f32], shape: BlockShape, bits: BlockBits) -> Result<Self> {
        shape.validate()?;
        check_len(
            "weight",
            dense.len(),
            shape.rows * shape.cols(),
            "rows · channels · Kh · Kw",
        )?;
        check_finite("weight", dense)?;
        let (q_min, q_max) = (bits.q_min() as f32, bits.q_max() as f32);
        let blocks = shape.blocks();
        let mut codes = vec![0i8; dense.len()];
        let mut scales = Vec::with_capacity(shape.rows * blocks);
        let mut offsets = Vec::with_capacity(shape.rows * blocks);
        for r in 0..shape.rows {
            for b in 0..blocks {
                let cols = shape.block_col_range(b);
                let base = r * shape.cols();
                let values = &dense[base + cols.start..base + cols.end];
                let (min, max) = min_max(values);
                check_range("weight", r, b, min, max)?;
                let (scale, offset) = offset_form_params(min, max, bits);
                for (q, &w) in codes[base + cols.start..base + cols.end].iter_mut().zip(values) {
                    *q = quantize_offset_form(w, scale, offset, q_min, q_max);
                }
                scales.push(scale);
                offsets.push(offset);
            }
        }
        Self::from_parts(shape, bits, codes, scales, offsets)
    }

    /// Quantizes a dense linear weight `[N, K]` per output channel, symmetric int8 (SmoothQuant's weights):
    /// one block per row, `scale = max|w| / 127`, `offset = 0`, `q = clamp(round(w / scale), −127, 127)`.
    /// An all-zero row gets `scale = 1` (zero or subnormal scales are replaced, as in [`offset_form_params`]).
    pub fn quantize_per_channel_symmetric(dense: &[f32], n: usize, k: usize) -> Result<Self> {
        let shape = BlockShape::linear(n, k, k);
        shape.validate()?;
        check_len("weight", dense.len(), n * k, "N · K")?;
        check_finite("weight", dense)?;
        let mut codes = vec![0i8; n * k];
        let mut scales = Vec::with_capacity(n);
        for (row, q_row) in dense.chunks_exact(k).zip(codes.chunks_exact_mut(k)) {
            let scale = symmetric_scale(row.iter().fold(0f32, |m, &v| m.max(v.abs())));
            for (q, &w) in q_row.iter_mut().zip(row) {
                *q = quantize_offset_form(w, scale, 0.0, -SYMMETRIC_Q_MAX, SYMMETRIC_Q_MAX);
            }
            scales.push(scale);
        }
        Self::from_parts(shape, BlockBits::Int8, codes, scales, vec![0.0; n])
    }

    /// Builds a weight from its parts: codes `[rows, channels, Kh, Kw]` (signed, within `bits`), scales and
    /// offsets `[rows, blocks]` (finite). Every part is validated and named in the error. Every constructor ends
    /// here, so the invariants are checked in one place.
    pub fn from_parts(
        shape: BlockShape,
        bits: BlockBits,
        codes: Vec<i8>,
        scales: Vec<f32>,
        offsets: Vec<f32>,
    ) -> Result<Self> {
        shape.validate()?;
        check_len(
            "codes",
            codes.len(),
            shape.rows * shape.cols(),
            "rows · channels · Kh · Kw",
        )?;
        let (q_min, q_max) = (bits.q_min(), bits.q_max());
        if let Some(i) = codes.iter().position(|&q| (q as i32) < q_min || (q as i32) > q_max) {
            return Err(Error::invalid(
                "codes",
                format!("{} at index {i}", codes[i]),
                format!("{}-bit codes must be in [{q_min}, {q_max}]", bits.bits()),
            ));
        }
        let params = shape.rows * shape.blocks();
        check_len("scales", scales.len(), params, "rows · blocks (MNN quanC)")?;
        check_len("offsets", offsets.len(), params, "rows · blocks (MNN quanC)")?;
        check_finite("scales", &scales)?;
        check_finite("offsets", &offsets)?;
        Ok(Self {
            shape,
            bits,
            codes,
            scales,
            offsets,
        })
    }

    /// A checkpoint's linear weight ([`QuantMatrix`]: AWQ, GPTQ, compressed-tensors, int8) in offset form, for the
    /// W8A8 kernels: `W = (u − z)·s = q·s + o` with the signed code `q = u − 2^(bits−1)` and `o = (2^(bits−1) − z)·s`.
    /// A group is a block (per channel: one block per row). The codes and scales are the checkpoint's; a symmetric
    /// weight gets offsets of exactly 0, otherwise each offset is that product rounded once to f32.
    /// Act-order weights (a `g_idx` that is not `k / group_size`) have no K blocks and are refused.
    pub fn from_quant(q: &QuantMatrix) -> Result<Self> {
        q.validate()?;
        ensure(
            q.has_trivial_g_idx(),
            "g_idx",
            "an act-order permutation",
            "per-block weights need groups of consecutive inputs (no act-order)",
        )?;
        let bits = if q.bits == 4 { BlockBits::Int4 } else { BlockBits::Int8 };
        let mid = q.midpoint() as i16;
        let codes = q.codes.iter().map(|&u| (u as i16 - mid) as i8).collect();
        let groups = q.groups();
        let offsets = (0..q.n * groups)
            .map(|p| (mid - q.zero(p / groups, p % groups) as i16) as f32 * q.scales[p])
            .collect();
        let shape = BlockShape::linear(q.n, q.k, q.group_size.min(q.k));
        Self::from_parts(shape, bits, codes, q.scales.clone(), offsets)
    }

    /// Reads MNN's int4 layout: `bytes` `[Co, Kh, Kw, ⌈channels/2⌉]`, channel `2j` in the high nibble and `2j+1`
    /// in the low nibble of byte `j`, each stored as `q + 8`. For an odd channel count the last low nibble is
    /// padding and is ignored.
    pub fn from_mnn_int4_bytes(shape: BlockShape, bytes: &[u8], scales: Vec<f32>, offsets: Vec<f32>) -> Result<Self> {
        shape.validate()?;
        let pairs = shape.channels.div_ceil(2);
        check_len(
            "mnn_int4_weight",
            bytes.len(),
            shape.rows * shape.taps() * pairs,
            "Co · Kh · Kw · ⌈Ci/2⌉ bytes",
        )?;
        let taps = shape.taps();
        let mut codes = vec![0i8; shape.rows * shape.cols()];
        for (r, row_bytes) in bytes.chunks_exact(taps * pairs).enumerate() {
            for (t, tap_bytes) in row_bytes.chunks_exact(pairs).enumerate() {
                for ci in 0..shape.channels {
                    let b = tap_bytes[ci / 2];
                    let nibble = if ci % 2 == 0 { b >> 4 } else { b & 0xF };
                    codes[(r * shape.channels + ci) * taps + t] = nibble as i8 - INT4_BIAS;
                }
            }
        }
        Self::from_parts(shape, BlockBits::Int4, codes, scales, offsets)
    }

    /// Writes MNN's int4 layout (see [`BlockQuantWeight::from_mnn_int4_bytes`]); an odd channel count's padding
    /// nibble is written as 8 (code 0). Fails unless the weight is int4.
    pub fn to_mnn_int4_bytes(&self) -> Result<Vec<u8>> {
        ensure(
            self.bits == BlockBits::Int4,
            "bits",
            self.bits.bits(),
            "MNN's packed layout holds int4 codes only",
        )?;
        let (channels, taps) = (self.shape.channels, self.shape.taps());
        let pairs = channels.div_ceil(2);
        let nibble = |r: usize, ci: usize, t: usize| -> u8 {
            if ci < channels {
                (self.codes[(r * channels + ci) * taps + t] + INT4_BIAS) as u8
            } else {
                INT4_BIAS as u8
            }
        };
        let mut bytes = Vec::with_capacity(self.shape.rows * taps * pairs);
        for r in 0..self.shape.rows {
            for t in 0..taps {
                for j in 0..pairs {
                    bytes.push(nibble(r, 2 * j, t) << 4 | nibble(r, 2 * j + 1, t));
                }
            }
        }
        Ok(bytes)
    }

    /// The geometry.
    pub fn shape(&self) -> &BlockShape {
        &self.shape
    }

    /// The code width.
    pub fn bits(&self) -> BlockBits {
        self.bits
    }

    /// Codes `[rows, channels, Kh, Kw]`.
    pub fn codes(&self) -> &[i8] {
        &self.codes
    }

    /// Scales `[rows, blocks]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Offsets `[rows, blocks]`.
    pub fn offsets(&self) -> &[f32] {
        &self.offsets
    }

    /// Index into scales/offsets of `(row, input channel)`: `row · blocks + channel / block_channels`.
    #[inline]
    pub fn param_index(&self, row: usize, channel: usize) -> usize {
        row * self.shape.blocks() + channel / self.shape.block_channels
    }

    /// Whether every offset is zero (a symmetric weight, as SmoothQuant needs).
    pub fn is_symmetric(&self) -> bool {
        self.offsets.iter().all(|&o| o == 0.0)
    }

    /// Dequantizes to dense f32 `[rows, channels, Kh, Kw]` (`q · scale + offset` in f32). For tests and tools;
    /// kernels dequantize inside their tiles instead.
    pub fn dequantize(&self) -> Vec<f32> {
        let cols = self.shape.cols();
        let mut out = Vec::with_capacity(self.codes.len());
        for (r, row) in self.codes.chunks_exact(cols).enumerate() {
            for b in 0..self.shape.blocks() {
                let p = r * self.shape.blocks() + b;
                let (scale, offset) = (self.scales[p], self.offsets[p]);
                out.extend(
                    row[self.shape.block_col_range(b)]
                        .iter()
                        .map(|&q| q as f32 * scale + offset),
                );
            }
        }
        out
    }

    /// Takes the weight apart: `(shape, bits, codes, scales, offsets)`.
    pub fn into_parts(self) -> (BlockShape, BlockBits, Vec<i8>, Vec<f32>, Vec<f32>) {
        (self.shape, self.bits, self.codes, self.scales, self.offsets)
    }
}

/// MNN stores int4 code `q` as the nibble `q + 8`.
const INT4_BIAS: i8 = 8;

/// Symmetric int8 codes use `[−127, 127]` so that negating a tensor negates its codes.
pub const SYMMETRIC_Q_MAX: f32 = 127.0;

/// Symmetric scale `absmax / 127`, or 1 where that is zero or subnormal (an all-zero row or block).
#[inline]
pub fn symmetric_scale(abs_max: f32) -> f32 {
    let scale = abs_max / SYMMETRIC_Q_MAX;
    if scale >= f32::MIN_POSITIVE {
        scale
    } else {
        1.0
    }
}

/// `(min, max)` of a non-empty slice.
pub(crate) fn min_max(values: &[f32]) -> (f32, f32) {
    values.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
        (lo.min(v), hi.max(v))
    })
}

/// Fails unless `max − min` of block `b` of row `r` is finite in f32 (needed for a finite scale).
/// Runs once per block, so the message is only formatted on failure.
pub(crate) fn check_range(tensor: &str, r: usize, b: usize, min: f32, max: f32) -> Result<()> {
    if (max - min).is_finite() {
        return Ok(());
    }
    Err(Error::invalid(
        tensor,
        format!("block (row {r}, block {b}) spans [{min}, {max}]"),
        "max − min of a block must be finite in f32",
    ))
}

pub(crate) fn check_len(tensor: &str, got: usize, want: usize, meaning: &str) -> Result<()> {
    ensure(
        got == want,
        tensor,
        format!("{got} elements"),
        &format!("must hold {want} = {meaning}"),
    )
}

pub(crate) fn check_finite(tensor: &str, values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            tensor,
            format!("{} at index {i}", values[i]),
            "values must be finite",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtn_covers_min_and_max() {
        let w: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
        let q = BlockQuantWeight::quantize(&w, BlockShape::linear(2, 12, 4), BlockBits::Int4).unwrap();
        let deq = q.dequantize();
        for (row, (wr, dr)) in w.chunks(12).zip(deq.chunks(12)).enumerate() {
            for b in 0..3 {
                let p = q.param_index(row, b * 4);
                // Error is at most half a step (plus f32 rounding).
                let half_step = q.scales()[p] * 0.5 + 1e-6;
                for c in b * 4..b * 4 + 4 {
                    assert!((wr[c] - dr[c]).abs() <= half_step, "row {row} col {c}");
                }
            }
        }
    }

    #[test]
    fn rounding_matches_roundf() {
        // Neighbours by one ulp (away from / towards zero).
        let ulp = |x: f32, d: i32| f32::from_bits((x.to_bits() as i32 + d) as u32);
        let mut v = -130.0f32;
        while v <= 130.0 {
            let h = v + 0.5;
            for x in [v, ulp(v, 1), ulp(v, -1), h, ulp(h, 1), ulp(h, -1)]
                .into_iter()
                .filter(|x| x.is_finite())
            {
                assert_eq!(round_half_away_from_zero(x), x.round() as i32, "{x}");
            }
            v += 0.25;
        }
        assert_eq!(round_half_away_from_zero(0.49999997), 0);
        assert_eq!(round_half_away_from_zero(-0.5), -1);
        assert_eq!(round_half_away_from_zero(-0.0), 0);
        assert_eq!(quantize_offset_form(f32::NAN, 1.0, 0.0, -128.0, 127.0), -128);
    }

    #[test]
    fn all_equal_block_is_exact() {
        let (scale, offset) = offset_form_params(0.25, 0.25, BlockBits::Int8);
        assert_eq!((scale, offset), (1.0, 0.25));
        assert_eq!(quantize_offset_form(0.25, scale, offset, -128.0, 127.0), 0);
    }
}
