//! W8A8: int8 activations × int8 weights with int32 accumulation (seed 004's "scheme 2", SmoothQuant).
//!
//! Two schemes share one integer core:
//! - **Per-block** (MNN scheme 2, llama.cpp MMQ): activations are quantized online per row and K block
//!   ([`quantize_activations`]), weights are a [`BlockQuantWeight`] with the same K blocks or per channel (one
//!   block per row: its scale and offset hold in every activation block), and per block `i` (`bs` its real length;
//!   the last block of K = 3884 with blocks of 64 has 44)
//!   `C[m,n] = Σ_i [ sA·sB·Σ a_q b_q + sA·oB·Σ a_q + oA·sB·Σ b_q + bs·oA·oB ]`, the block dot exact in int32, the
//!   combination in f32; `Σ a_q` is computed at quantization, `Σ b_q` (per activation block) when the weight is
//!   prepared.
//! - **SmoothQuant**: int8 activations with per-token scales × int8 weights with per-channel scales:
//!   `y[m,n] = s_tok[m] · s_ch[n] · Σ_k a[m,k] · w[n,k]` (+ bias).
//!
//! [`QuantizedActivations`] are made once and reused by every GEMM that reads the same input (q, k, v).
//! [`reference`](mod@reference) has the f64 ground truth of both GEMMs; [`cpu`] the rayon kernels.

pub mod cpu;
pub mod cuda;
pub mod reference;

use crate::dtype::Float;
use crate::error::{ensure, Error, Result};
use crate::formats::block::{
    check_finite, check_len, check_range, min_max, offset_form_params, quantize_offset_form, symmetric_scale,
    BlockBits, BlockQuantWeight, SYMMETRIC_Q_MAX,
};

/// Largest K block whose int8 × int8 dot is exact in int32 for any codes: 65536 · 128 · 128 = 2^30.
pub const MAX_EXACT_BLOCK: usize = 1 << 16;

/// How activations are quantized per (row, block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationQuant {
    /// formats.md's online scheme: `scale = (max − min) / 255`, `offset = max − 127 · scale` (max → 127,
    /// min → −128), `q = clamp(round((a − offset) / scale), −128, 127)`, all in f32.
    Asymmetric,
    /// Per-token-per-block symmetric: `scale = max|a| / 127`, offset 0, `q = clamp(round(a / scale), −127, 127)`.
    /// With one block per row (`block_size = K`) these are SmoothQuant's per-token activations.
    Symmetric,
}

/// Int8 activations `[M, K]` with per-(row, block) scale, offset and code sum: `a = q · scale + offset`.
///
/// All-equal (also all-zero) blocks get `scale = 1`, `offset = max` (asymmetric) or `scale = 1` (symmetric): finite,
/// every code 0, dequantizing exactly (see [`offset_form_params`]).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedActivations {
    m: usize,
    k: usize,
    block_size: usize,
    /// `[M, K]`.
    codes: Vec<i8>,
    /// `[M, blocks]`.
    scales: Vec<f32>,
    /// `[M, blocks]`; all zero for symmetric activations.
    offsets: Vec<f32>,
    /// `[M, blocks]`: `Σ q` over the block, the `sA·oB·Σ a_q` term's sum.
    code_sums: Vec<i32>,
}

impl QuantizedActivations {
    /// Builds quantized activations from their parts: codes `[M, K]`, scales and offsets `[M, ⌈K/block_size⌉]`
    /// (finite). Code sums are computed here.
    pub fn from_parts(
        m: usize,
        k: usize,
        block_size: usize,
        codes: Vec<i8>,
        scales: Vec<f32>,
        offsets: Vec<f32>,
    ) -> Result<Self> {
        check_activation_input("activation_codes", codes.len(), m, k, block_size)?;
        let params = m * k.div_ceil(block_size);
        check_len("activation_scales", scales.len(), params, "M · ⌈K / block_size⌉")?;
        check_len("activation_offsets", offsets.len(), params, "M · ⌈K / block_size⌉")?;
        check_finite("activation_scales", &scales)?;
        check_finite("activation_offsets", &offsets)?;
        let code_sums = codes
            .chunks_exact(k)
            .flat_map(|row| row.chunks(block_size).map(|b| b.iter().map(|&q| q as i32).sum::<i32>()))
            .collect();
        Ok(Self {
            m,
            k,
            block_size,
            codes,
            scales,
            offsets,
            code_sums,
        })
    }

    /// All-zero activations of a checked geometry, for a quantizer to fill in.
    fn zeroed(m: usize, k: usize, block_size: usize) -> Self {
        let params = m * k.div_ceil(block_size);
        Self {
            m,
            k,
            block_size,
            codes: vec![0; m * k],
            scales: vec![0.0; params],
            offsets: vec![0.0; params],
            code_sums: vec![0; params],
        }
    }

    /// SmoothQuant's activations from their parts: codes `[M, K]` and per-token scales `[M]` (one block per row,
    /// no offset).
    pub fn per_token(m: usize, k: usize, codes: Vec<i8>, token_scales: Vec<f32>) -> Result<Self> {
        Self::from_parts(m, k, k, codes, token_scales, vec![0.0; m])
    }

    /// Rows `M`.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Columns `K`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns per block (the last block of a row may be shorter).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks per row: `⌈K / block_size⌉`.
    pub fn blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Codes `[M, K]`.
    pub fn codes(&self) -> &[i8] {
        &self.codes
    }

    /// Scales `[M, blocks]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Offsets `[M, blocks]`.
    pub fn offsets(&self) -> &[f32] {
        &self.offsets
    }

    /// Code sums `[M, blocks]`.
    pub fn code_sums(&self) -> &[i32] {
        &self.code_sums
    }

    /// Whether every offset is zero (symmetric activations).
    pub fn is_symmetric(&self) -> bool {
        self.offsets.iter().all(|&o| o == 0.0)
    }

    /// Dequantizes to f32 `[M, K]` (`q · scale + offset`); for tests and error reports.
    pub fn dequantize(&self) -> Vec<f32> {
        let blocks = self.blocks();
        let mut out = Vec::with_capacity(self.codes.len());
        for (r, row) in self.codes.chunks_exact(self.k).enumerate() {
            for (b, block) in row.chunks(self.block_size).enumerate() {
                let (s, o) = (self.scales[r * blocks + b], self.offsets[r * blocks + b]);
                out.extend(block.iter().map(|&q| q as f32 * s + o));
            }
        }
        out
    }
}

pub use cpu::quantize_activations;

/// The one check of every activation input (to a quantizer, or codes to [`QuantizedActivations::from_parts`]):
/// positive M and K, `1 ≤ block_size ≤ K`, blocks short enough that a code sum (|q| ≤ 128 per element) fits in
/// int32, and `len` (of `tensor`) equal to `M · K`.
fn check_activation_input(tensor: &str, len: usize, m: usize, k: usize, block_size: usize) -> Result<()> {
    ensure(
        m > 0 && k > 0 && m.checked_mul(k).is_some(),
        "activations",
        format!("shape [{m}, {k}]"),
        "M and K must be positive",
    )?;
    ensure(
        block_size > 0 && block_size <= k,
        "block_size",
        block_size,
        &format!("activation block size must be in 1..=K (K = {k})"),
    )?;
    ensure(
        block_size <= (i32::MAX as usize) / 128,
        "block_size",
        block_size,
        "a block's code sum must fit in int32 (block_size ≤ 16777215)",
    )?;
    check_len(tensor, len, m * k, "M · K")
}

/// Where the quantizer writes one row: codes `[K]` and per-block scale, offset and code sum.
struct QuantizedRow<'a> {
    codes: &'a mut [i8],
    scales: &'a mut [f32],
    offsets: &'a mut [f32],
    code_sums: &'a mut [i32],
}

/// Quantizes one row (`row.len() = K`) into `out`. The one definition of the online scheme; `row_index` only
/// names the row in errors.
fn quantize_row<T: Float>(
    row: &[T],
    row_index: usize,
    block_size: usize,
    mode: ActivationQuant,
    out: QuantizedRow,
) -> Result<()> {
    let mut values = vec![0f32; block_size];
    for (b, (block, block_codes)) in row.chunks(block_size).zip(out.codes.chunks_mut(block_size)).enumerate() {
        let values = &mut values[..block.len()];
        for (v, x) in values.iter_mut().zip(block) {
            *v = x.to_f32();
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "activations",
                format!("{} at [{row_index}, {}]", values[i], b * block_size + i),
                "activations must be finite",
            ));
        }
        let (scale, offset, q_min, q_max) = match mode {
            ActivationQuant::Asymmetric => {
                let (min, max) = min_max(values);
                check_range("activations", row_index, b, min, max)?;
                let (scale, offset) = offset_form_params(min, max, BlockBits::Int8);
                (
                    scale,
                    offset,
                    BlockBits::Int8.q_min() as f32,
                    BlockBits::Int8.q_max() as f32,
                )
            }
            ActivationQuant::Symmetric => {
                let abs_max = values.iter().fold(0f32, |m, v| m.max(v.abs()));
                (symmetric_scale(abs_max), 0.0, -SYMMETRIC_Q_MAX, SYMMETRIC_Q_MAX)
            }
        };
        let mut sum = 0i32;
        for (q, &v) in block_codes.iter_mut().zip(values.iter()) {
            *q = quantize_offset_form(v, scale, offset, q_min, q_max);
            sum += *q as i32;
        }
        (out.scales[b], out.offsets[b], out.code_sums[b]) = (scale, offset, sum);
    }
    Ok(())
}

/// The weight side of a W8A8 GEMM, checked against the activations it will meet, and its optional bias (`N` finite
/// values).
fn check_linear(
    weight: &BlockQuantWeight,
    bias: Option<&[f32]>,
    a_k: usize,
    a_block: usize,
    scheme: &str,
) -> Result<()> {
    let shape = weight.shape();
    ensure(
        shape.kernel == (1, 1),
        "weight",
        format!("kernel {:?}", shape.kernel),
        &format!("{scheme} takes a linear weight [N, K] (kernel 1×1)"),
    )?;
    ensure(
        shape.channels == a_k,
        "weight",
        format!("shape [{}, {}]", shape.rows, shape.channels),
        &format!("weight K must equal the activations' K = {a_k}"),
    )?;
    ensure(
        shape.block_channels == a_block || shape.blocks() == 1,
        "block_size",
        format!("weight {} vs activations {a_block}", shape.block_channels),
        "weight K blocks must equal the activations' or span K (a per-channel weight)",
    )?;
    if let Some(bias) = bias {
        check_len("bias", bias.len(), shape.rows, "N")?;
        check_finite("bias", bias)?;
    }
    Ok(())
}

/// One weight column over one activation K block: what the per-block formula needs of the weight there.
pub(crate) struct WeightBlock<'a> {
    /// Output column `c`.
    pub column: usize,
    /// Activation K block `b`.
    pub block: usize,
    /// `sB`, `oB`: the column's parameters over this block (a per-channel weight's own, in every block).
    pub scale: f32,
    pub offset: f32,
    /// The column's codes in this block (`bs` of them).
    pub codes: &'a [i8],
}

impl WeightBlock<'_> {
    /// `Σ b_q` over the block.
    pub fn code_sum(&self) -> i32 {
        self.codes.iter().map(|&q| q as i32).sum()
    }

    /// `sB · Σ b_q + bs · oB`: the weight-only factor of the block's `oA` terms.
    pub fn offset_term(&self) -> f32 {
        self.scale * self.code_sum() as f32 + self.codes.len() as f32 * self.offset
    }
}

/// A checked linear weight (see [`check_linear`]) cut into the activations' K blocks of `a_block`, column by
/// column: a per-block weight has those blocks already; a per-channel weight (one block per row) repeats its
/// column's scale and offset in each, which is the per-block formula with parameters constant along K.
pub(crate) fn weight_blocks(weight: &BlockQuantWeight, a_block: usize) -> impl Iterator<Item = WeightBlock<'_>> {
    let shape = weight.shape();
    let (k, w_blocks) = (shape.channels, shape.blocks());
    weight
        .codes()
        .chunks_exact(k)
        .enumerate()
        .flat_map(move |(column, row)| {
            row.chunks(a_block).enumerate().map(move |(block, codes)| {
                let p = column * w_blocks + if w_blocks == 1 { 0 } else { block };
                WeightBlock {
                    column,
                    block,
                    scale: weight.scales()[p],
                    offset: weight.offsets()[p],
                    codes,
                }
            })
        })
}

/// A per-channel weight for per-block activations: one block per row (any offsets).
pub(crate) fn check_channel_weight(weight: &BlockQuantWeight) -> Result<()> {
    let blocks = weight.shape().blocks();
    ensure(
        blocks == 1,
        "weight",
        format!("{blocks} blocks per row"),
        "a per-channel weight has one block per row (one scale per output channel)",
    )
}

/// SmoothQuant weights: per channel and symmetric (zero offsets).
pub(crate) fn check_smoothquant_weight(weight: &BlockQuantWeight) -> Result<()> {
    check_channel_weight(weight)?;
    ensure(
        weight.is_symmetric(),
        "offsets",
        "non-zero weight offsets",
        "SmoothQuant weights are symmetric (offset 0)",
    )
}

/// SmoothQuant activations: one block per row (per-token scale) and zero offsets.
pub(crate) fn check_smoothquant_activations(a: &QuantizedActivations) -> Result<()> {
    ensure(
        a.blocks() == 1,
        "activations",
        format!("{} blocks per row", a.blocks()),
        "SmoothQuant activations have one scale per token (block_size = K)",
    )?;
    ensure(
        a.is_symmetric(),
        "activation_offsets",
        "non-zero activation offsets",
        "SmoothQuant activations are symmetric (offset 0)",
    )
}
