//! The W4A16 linear layer on a CUDA GPU for decode-sized batches (M = 1..64): `y[M, N] = x[M, K] · W^T (+ bias)`
//! with f16 or bf16 activations, int4 weights (AWQ, GPTQ with or without act-order, compressed-tensors: anything
//! that unpacks to a [`QuantMatrix`]) and fp32 accumulation on the tensor cores. Larger batches run as chunks of
//! [`MAX_M`] rows, one launch each: the `mma.sync` tensor-core path for any M on GPUs without the Hopper GEMM
//! ([`gemm`]).
//!
//! ```no_run
//! # use lowbit::{DType, cuda::CudaDevice, ops::linear::cuda::LinearW4A16Cuda};
//! # fn main() -> lowbit::Result<()> {
//! # let w: lowbit::QuantMatrix = unimplemented!();
//! let dev = CudaDevice::new(0)?;
//! let op = LinearW4A16Cuda::new(&dev, &w, DType::F16, 16)?; // repacks and uploads the weight once, M <= 16
//! let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes())?;
//! # let (x, mut y) = (dev.alloc_zeros::<half::f16>(16 * w.k)?, dev.alloc_zeros::<half::f16>(16 * w.n)?);
//! op.run(dev.stream(), &x, 16, None, &mut y, &mut ws)?; // no allocation, no sync: graph-capturable
//! # Ok(()) }
//! ```
//!
//! What happens (kernel: `kernels/linear_w4a16.cu`, whose header comment explains the tricks):
//! - [`repack`] turns the weight, once, into the kernel's private layout: act-order `g_idx` resolved into a
//!   permutation of K (x is gathered through it on the device), K padded to a multiple of 128 and N to the tile
//!   width with weights that dequantize to exactly 0, every 32-bit word holding one thread's mma A fragment in
//!   the nibble order the lop3 conversion wants, and units of `N_CTA x 128` weights stored contiguously in the
//!   order the CTAs stream them. [`RepackedW4::unpack`] inverts it exactly (tested).
//! - One launch per 64 rows (two with act-order or unaligned x): a stream-K grid of one CTA per SM; tiles split
//!   between CTAs are summed in a fixed order by the last CTA to finish, so results are deterministic and the same
//!   for every M (row 0 of a batch is bit-identical to the single-row call).
//!
//! Numerics: each weight is `round((q - z) · s)` in the activation type (exactly what dequantization produces),
//! products and sums are fp32, the bias is added in fp32, and the result is rounded once to the activation type.
//! Scales are converted to the activation type when the weight is prepared (exact for f16 scales with f16
//! activations and bf16 with bf16; otherwise rounded once, as every fused kernel does).

pub mod gemm;

use crate::cuda::blas::{blas_error, LtMatmul, LtTypes};
use crate::cuda::checked_buffer as buffer;
use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use crate::cuda::{tensor_map_2d, KernelSource, LaunchConfig, MapElement, TensorMap};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use crate::formats::QuantMatrix;
use crate::ops::activation::Activation;
use cudarc::driver::PushKernelArg;
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::Arc;

/// The kernel source; the host prepends the `#define`s of one variant.
const SOURCE: &str = include_str!("../../../kernels/linear_w4a16.cu");

/// The kernel source with no variant selected: its default block (the M <= 8 kernel of a large layer, TMA on
/// sm_90) is what `lowbit doctor --compile-only` compiles (listed in [`crate::cuda::KERNELS`]).
pub const KERNEL: KernelSource = KernelSource {
    name: "linear_w4a16",
    source: SOURCE,
};

/// k per unit (`K_TILE` in the kernel).
pub const K_TILE: usize = 128;
/// Output columns per warp (`WARP_N`).
const WARP_N: usize = 32;
/// x row pitch in shared memory, elements (`X_PITCH`).
const X_PITCH: usize = K_TILE + 8;
/// Scale/zero rows a unit can touch (`MAX_GROUP_ROWS`): group sizes are multiples of 16.
const MAX_GROUP_ROWS: usize = K_TILE / 16;
/// Shared memory of a GPU of compute capability `cc`: what one SM has and the most one CTA may use (opt-in).
fn smem_limits(cc: (i32, i32)) -> SmemLimits {
    let (per_sm, per_cta) = match cc {
        (9.., _) => (228, 227),
        (8, 0) | (8, 7) => (164, 163),
        _ => (100, 99),
    };
    SmemLimits {
        per_sm: per_sm * 1024,
        per_cta: per_cta * 1024,
    }
}

/// Shared-memory capacities in bytes ([`smem_limits`]).
#[derive(Debug, Clone, Copy)]
struct SmemLimits {
    per_sm: usize,
    per_cta: usize,
}

/// Shared memory the system reserves per CTA (sm_80 and later).
const SMEM_RESERVED_PER_CTA: usize = 1024;
/// Largest batch one launch of the kernel takes (8 token tiles of 8); larger batches run as chunks of this many rows.
pub const MAX_M: usize = 64;
/// Largest batch of the decode kernel for a weight with offsets ([`DeviceW4::upload_with_offsets`]).
pub const MAX_M_OFFSETS: usize = 16;
/// Nibble position of A-fragment element `i` in its word (the AWQ interleave, see the kernel header).
const NIBBLE_OF: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

// ------------------------------------------------------------------------------------------------------------------
// Host-side repack
// ------------------------------------------------------------------------------------------------------------------

/// Shape decisions for one weight, independent of M (so every batch size computes in the same order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Output features.
    pub n: usize,
    /// Input features of the kernel's weight: the layer's `input_k`, or twice it for an 8-bit weight run as two
    /// int4 planes (see [`repack`]).
    pub k: usize,
    /// Input features of the layer (columns of x).
    pub input_k: usize,
    /// Warps per CTA (each covers 32 output columns): 8, 4 or 2.
    pub warps: usize,
    /// Output columns per tile (`32 * warps`).
    pub n_cta: usize,
    /// N rounded up to a whole tile.
    pub n_pad: usize,
    /// K rounded up to a whole unit (128).
    pub k_pad: usize,
    /// k per scale group in the kernel's (sorted) k space; `k_pad` for per-channel weights.
    pub group: usize,
    /// Scale/zero rows per tile: `ceil(k_pad / group)`.
    pub group_rows: usize,
    /// Groups of the source weight (the rest of `group_rows` is padding).
    pub groups: usize,
    /// Bits per code in the units: 4, or 8 for the GEMM-only layout of [`repack_int8`].
    pub code_bits: usize,
}

impl Plan {
    /// Chooses the tile width and padding for an `n x k` weight with `groups` groups of `group_size`.
    pub fn new(n: usize, k: usize, group_size: usize, groups: usize) -> Result<Plan> {
        // The widest tile that divides N (192 and 576 take 64), else the widest that wastes at most 1/32 of the
        // columns on padding.
        const WIDTHS: [usize; 3] = [256, 128, 64];
        let n_cta = WIDTHS
            .into_iter()
            .find(|&t| n % t == 0)
            .or_else(|| WIDTHS.into_iter().find(|&t| n.next_multiple_of(t) - n <= n / 32))
            .unwrap_or(64);
        let k_pad = k.next_multiple_of(K_TILE);
        let group = if groups == 1 { k_pad } else { group_size };
        if group % 16 != 0 {
            return Err(Error::Unsupported(format!(
                "CUDA W4A16 linear: group size {group_size} (a multiple of 16, or one group per row, is required)"
            )));
        }
        Ok(Plan {
            n,
            k,
            input_k: k,
            warps: n_cta / WARP_N,
            n_cta,
            n_pad: n.next_multiple_of(n_cta),
            k_pad,
            group,
            group_rows: k_pad.div_ceil(group),
            groups,
            code_bits: 4,
        })
    }

    /// Tiles along N.
    pub fn n_tiles(&self) -> usize {
        self.n_pad / self.n_cta
    }

    /// Units (tiles of `n_cta x 128`) along K.
    pub fn k_tiles(&self) -> usize {
        self.k_pad / K_TILE
    }

    /// 32-bit words per unit.
    fn unit_words(&self) -> usize {
        self.n_cta * K_TILE * self.code_bits / 32
    }

    /// The code whose weight is exactly 0 whatever the scale (padding, and the zero of a symmetric weight).
    fn mid_code(&self) -> u8 {
        1 << (self.code_bits - 1)
    }

    /// Bit offset, inside its unit, of A-fragment element `i` of word `j` of `lane` in 32-k chunk `kc` of `warp`
    /// ([`fragment_element`] gives its column and k). 4-bit codes: lane words of 4 fragments (two tiles x two k16
    /// steps), nibble order [`NIBBLE_OF`]. 8-bit codes (the GEMM's INT8 CODES): per k16 step a lane's 16 bytes,
    /// tile 0 then tile 1, each as k 0..7 then k 8..15 of rows (g, g, g + 8, g + 8), so that two bytes next to
    /// `0x64` bytes are one fp16 register pair.
    fn code_bit(&self, warp: usize, kc: usize, lane: usize, j: usize, i: usize) -> usize {
        if self.code_bits == 4 {
            (((warp * 4 + kc) * 32 + lane) * 4 + j) * 32 + 4 * NIBBLE_OF[i]
        } else {
            let (step, tile, half, e) = (kc * 2 + j / 2, j % 2, i >> 2, i & 3);
            8 * (warp * 4096 + step * 512 + lane * 16 + tile * 8 + half * 4 + e)
        }
    }

    /// Every A-fragment element of a unit: `(bit offset of its code, column offset, k offset)` within the unit.
    fn unit_elements(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.warps).flat_map(move |warp| {
            (0..4).flat_map(move |kc| {
                (0..32).flat_map(move |lane| {
                    (0..4).flat_map(move |j| {
                        (0..8).map(move |i| {
                            let (dn, dk) = fragment_element(lane, j, i);
                            (self.code_bit(warp, kc, lane, j, i), warp * WARP_N + dn, kc * 32 + dk)
                        })
                    })
                })
            })
        })
    }
}

/// A weight in the kernel's layout (host memory), plus what is needed to restore the [`QuantMatrix`].
#[derive(Debug, Clone, PartialEq)]
pub struct RepackedW4 {
    /// Shape decisions.
    pub plan: Plan,
    /// The activation (and converted scale) dtype.
    pub act: DType,
    /// Codes, `unit_words` per unit, units in (n tile, k tile) order; see the kernel header for a word's content.
    pub words: Vec<u32>,
    /// `[n_tiles][group_rows][n_cta]` scale bits in `act`, the columns of a tile in `param_slot` order.
    pub scales: Vec<u16>,
    /// `[n_tiles][group_rows][n_cta / 2]`, two zero codes per byte in `param_slot` order (low nibble first);
    /// `None` = all 8.
    pub zeros: Option<Vec<u8>>,
    /// The column of x each position of the kernel's k order reads (act-order, and the two planes of an 8-bit
    /// weight); `None`: position k reads column k.
    pub perm: Option<Vec<u32>>,
    /// 8-bit weights: the int4-plane column of each kernel position (what `unpack` needs); `None` otherwise.
    plane_perm: Option<Vec<u32>>,
    /// Bits of the source weight (4, or 8 stored as two int4 planes).
    source_bits: u8,
    /// Round-trip facts: the source stored zeros (even if all 8), carried a g_idx (even if trivial), its scale dtype
    /// and group size.
    zeros_given: bool,
    g_idx_given: bool,
    scale_dtype: DType,
    group_size: usize,
}

/// The act-order permutation of K: inputs sorted by group (stably). `None` when `g_idx` is absent or trivial.
/// Fails unless every group then holds exactly `group_size` consecutive positions (true of GPTQ's desc_act).
fn act_order(w: &QuantMatrix) -> Result<Option<Vec<u32>>> {
    let Some(g_idx) = w.g_idx.as_ref().filter(|_| !w.has_trivial_g_idx()) else {
        return Ok(None);
    };
    let mut perm: Vec<u32> = (0..w.k as u32).collect();
    perm.sort_by_key(|&k| g_idx[k as usize]);
    if let Some(p) = (0..w.k).find(|&p| g_idx[perm[p] as usize] as usize != p / w.group_size) {
        return Err(Error::Unsupported(format!(
            "CUDA W4A16 linear: g_idx must give every group exactly group_size = {} inputs (position {p} of the \
             sorted order is in group {})",
            w.group_size, g_idx[perm[p] as usize]
        )));
    }
    Ok(Some(perm))
}

/// `value` in the bits of `act` (f16 or bf16).
fn to_bits(act: DType, value: f32) -> u16 {
    match act {
        DType::Bf16 => bf16::from_f32(value).to_bits(),
        _ => f16::from_f32(value).to_bits(),
    }
}

fn from_bits(act: DType, bits: u16) -> f32 {
    match act {
        DType::Bf16 => bf16::from_bits(bits).to_f32(),
        _ => f16::from_bits(bits).to_f32(),
    }
}

/// Where A-fragment element `i` of word `j` of `lane` lives inside a unit: (column, k) offsets.
/// Word `j` = k16 step `j / 2` of the lane's 32-k chunk, 16-row tile `j % 2` of the warp's 32 columns.
#[inline]
fn fragment_element(lane: usize, j: usize, i: usize) -> (usize, usize) {
    let (g, t) = (lane / 4, lane % 4);
    let n = (j % 2) * 16 + g + 8 * ((i >> 1) & 1);
    let k = (j / 2) * 16 + 2 * t + (i & 1) + 8 * (i >> 2);
    (n, k)
}

/// Position of column `c` of a tile within its scale/zero rows. Each warp's 32 columns are stored lane group first:
/// for g = 0..7 the columns of (16-row tile 0, row g), (tile 0, row g + 8), (tile 1, row g), (tile 1, row g + 8),
/// which are the four accumulator rows of lanes 4g..4g+3, so a lane reads its four scales with one 8-byte load and
/// its four zero codes with one 16-bit load (kernel header, SCALE/ZERO LAYOUT).
pub(crate) fn param_slot(c: usize) -> usize {
    let (warp, r) = (c / WARP_N, c % WARP_N);
    let (tile, half, g) = (r / 16, (r / 8) % 2, r % 8);
    warp * WARP_N + g * 4 + tile * 2 + half
}

/// Converts a 4-bit [`QuantMatrix`] into the layout of the CUDA kernel for activations of dtype `act`.
///
/// Errors: bits other than 4, group sizes that are not multiples of 16 (per-channel is fine), act-order groups of
/// unequal size, and scales outside the range of `act`.
pub fn repack(w: &QuantMatrix, act: DType) -> Result<RepackedW4> {
    w.validate()?;
    match w.bits {
        4 => repack_codes(w, act, 4),
        8 => {
            let mut r = repack_codes(&int4_planes(w)?, act, 4)?;
            // x feeds both planes: kernel position p reads x column (plane column) mod K.
            let k = w.k;
            let plane_perm = r.perm.take().unwrap_or_else(|| (0..2 * k as u32).collect());
            r.perm = Some(plane_perm.iter().map(|&c| c % k as u32).collect());
            r.plane_perm = Some(plane_perm);
            r.plan.input_k = k;
            (r.source_bits, r.group_size, r.g_idx_given) = (8, w.group_size, w.g_idx.is_some());
            r.zeros_given = w.zeros.is_some();
            Ok(r)
        }
        bits => Err(Error::Unsupported(format!(
            "CUDA linear: {bits}-bit weights (4 and 8 only)"
        ))),
    }
}

/// An 8-bit weight as an int4 weight of twice the inputs: `q = 16 q_hi + q_lo` and `z = 16 z_hi + z_lo`, so
/// `(q - z) s = (q_hi - z_hi) (16 s) + (q_lo - z_lo) s` exactly: the high nibbles with scale `16 s` are inputs
/// `0..K`, the low nibbles with scale `s` inputs `K..2K`, and x is read twice. The int4 kernels then run 8-bit
/// weights at 8 bits per weight with no kernel of their own. Groups double (high-plane groups first).
fn int4_planes(w: &QuantMatrix) -> Result<QuantMatrix> {
    let (n, k, groups) = (w.n, w.k, w.groups());
    let mut codes = vec![0u8; n * 2 * k];
    for (row, out) in w.codes.chunks_exact(k).zip(codes.chunks_exact_mut(2 * k)) {
        for (i, &q) in row.iter().enumerate() {
            out[i] = q >> 4;
            out[k + i] = q & 0xF;
        }
    }
    let mut zeros = vec![0u8; n * 2 * groups];
    let mut scales = vec![0f32; n * 2 * groups];
    for r in 0..n {
        for g in 0..groups {
            let z = w.zero(r, g);
            let s = w.scales[r * groups + g];
            zeros[r * 2 * groups + g] = z >> 4;
            zeros[r * 2 * groups + groups + g] = z & 0xF;
            scales[r * 2 * groups + g] = 16.0 * s; // exact: a power-of-two multiple
            scales[r * 2 * groups + groups + g] = s;
        }
    }
    let group_size = if groups == 1 { k } else { w.group_size };
    if group_size % 16 != 0 {
        return Err(Error::Unsupported(format!(
            "CUDA linear, 8-bit: group size {group_size} (a multiple of 16 is required, per channel too)"
        )));
    }
    Ok(QuantMatrix {
        n,
        k: 2 * k,
        bits: 4,
        group_size,
        codes,
        zeros: Some(zeros),
        scales,
        scale_dtype: w.scale_dtype,
        g_idx: w.g_idx.as_ref().map(|g| {
            g.iter()
                .chain(g)
                .enumerate()
                .map(|(i, &gi)| gi + if i < k { 0 } else { groups as u32 })
                .collect()
        }),
    })
}

/// An 8-bit weight in the int8 layout (one byte per code, in the fragment order of the int4 words; the GEMM
/// kernel's INT8 CODES): each register pair then converts with one `prmt` and one `sub`, one MMA per 16 k, where
/// the two int4 planes of [`repack`] cost twice the tensor-core work and twice the conversions. Every CUDA linear
/// kernel reads it (decode, GEMM, dense dequantization); fp16 activations only.
///
/// Errors: those of [`repack`], bits other than 8, and bf16 activations.
pub fn repack_int8(w: &QuantMatrix, act: DType) -> Result<RepackedW4> {
    w.validate()?;
    if w.bits != 8 {
        return Err(Error::invalid(
            "weight bits",
            w.bits,
            "must be 8 for the int8 GEMM layout",
        ));
    }
    if act != DType::F16 {
        return Err(Error::Unsupported(format!(
            "the int8 GEMM layout with {act} activations (f16 only: bf16 cannot hold 1024 + code)"
        )));
    }
    repack_codes(w, act, 8)
}

/// The layout every CUDA linear kernel reads fastest: [`repack_int8`] for an 8-bit weight with fp16 activations
/// (one MMA per 16 k), [`repack`] otherwise (bf16 cannot hold 1024 + code, so its 8-bit weights are two int4
/// planes). What `QuantLinear`, the GEMM operator and the Hopper convolution prepare.
pub fn repack_preferred(w: &QuantMatrix, act: DType) -> Result<RepackedW4> {
    if w.bits == 8 && act == DType::F16 {
        repack_int8(w, act)
    } else {
        repack(w, act)
    }
}

/// [`repack`] of a weight of `code_bits`-bit codes (4, or 8 for [`repack_int8`]).
fn repack_codes(w: &QuantMatrix, act: DType, code_bits: usize) -> Result<RepackedW4> {
    if !matches!(act, DType::F16 | DType::Bf16) {
        return Err(Error::invalid("activation dtype", act, "must be f16 or bf16"));
    }
    let groups = w.groups();
    let plan = Plan {
        code_bits,
        ..Plan::new(w.n, w.k, w.group_size, groups)?
    };
    let mid = plan.mid_code();
    let perm = act_order(w)?;
    let source_k = |p: usize| perm.as_ref().map_or(p, |perm| perm[p] as usize);
    let (n_tiles, k_tiles, n_cta, rows) = (plan.n_tiles(), plan.k_tiles(), plan.n_cta, plan.group_rows);
    // Groups in sorted order: position p is in group p / group_size (act_order checked it), which is also what
    // `group_of` says without g_idx, so zero/scale lookups below use the sorted group index directly.
    let real_group = |p: usize| if groups == 1 { 0 } else { p / w.group_size };

    // Scales and zeros per (tile, group row, column).
    let mut scales = vec![0u16; n_tiles * rows * n_cta];
    let has_zeros = !w.is_symmetric();
    // Zero codes of `code_bits` each, in param_slot order (4-bit: low nibble first).
    let pad_zeros = if code_bits == 4 { (mid << 4) | mid } else { mid };
    let mut zeros = has_zeros.then(|| vec![pad_zeros; n_tiles * rows * n_cta * code_bits / 8]);
    for nt in 0..n_tiles {
        for r in 0..rows.min(groups) {
            for c in 0..n_cta.min(w.n.saturating_sub(nt * n_cta)) {
                let n = nt * n_cta + c;
                let s = w.scales[n * groups + r];
                let bits = to_bits(act, s);
                if !from_bits(act, bits).is_finite() {
                    return Err(Error::invalid(
                        "scales",
                        format!("{s} at row {n}, group {r}"),
                        format!("must be within the range of {act} activations"),
                    ));
                }
                let i = (nt * rows + r) * n_cta + param_slot(c);
                scales[i] = bits;
                if let Some(z) = zeros.as_mut() {
                    if code_bits == 4 {
                        let shift = (i & 1) * 4;
                        z[i / 2] = (z[i / 2] & !(0xF << shift)) | (w.zero(n, r) << shift);
                    } else {
                        z[i] = w.zero(n, r);
                    }
                }
            }
        }
    }

    // Codes, unit by unit.
    let unit_words = plan.unit_words();
    let mut words = vec![0u32; n_tiles * k_tiles * unit_words];
    words
        .par_chunks_exact_mut(unit_words)
        .enumerate()
        .for_each(|(u, unit)| {
            let (nt, kt) = (u / k_tiles, u % k_tiles);
            for (bit, dn, dk) in plan.unit_elements() {
                let (n, p) = (nt * n_cta + dn, kt * K_TILE + dk);
                let code = if n >= w.n {
                    mid
                } else if p >= w.k {
                    // K padding: the code equals its zero, so the weight is exactly 0 whatever the scale.
                    if real_group(p) < groups {
                        w.zero(n, real_group(p))
                    } else {
                        mid
                    }
                } else {
                    w.codes[n * w.k + source_k(p)]
                };
                unit[bit / 32] |= u32::from(code) << (bit % 32);
            }
        });

    Ok(RepackedW4 {
        plan,
        act,
        words,
        scales,
        zeros,
        perm,
        plane_perm: None,
        source_bits: code_bits as u8,
        zeros_given: w.zeros.is_some(),
        g_idx_given: w.g_idx.is_some(),
        scale_dtype: w.scale_dtype,
        group_size: w.group_size,
    })
}

impl RepackedW4 {
    /// Planes a dense dequantization sums (see [`DeviceW4::dense_planes`]).
    fn dense_planes(&self) -> Option<usize> {
        let k = self.plan.input_k;
        match (self.source_bits, &self.perm) {
            (4, None) => Some(1),
            (8, None) if self.plan.code_bits == 8 => Some(1), // the int8 layout
            (8, Some(perm))
                if self.plan.code_bits == 4
                    && k % K_TILE == 0
                    && perm.iter().enumerate().all(|(p, &c)| c as usize == p % k) =>
            {
                Some(2)
            }
            _ => None,
        }
    }

    /// The [`QuantMatrix`] this was made from (exact when its scales are representable in the activation dtype).
    pub fn unpack(&self) -> QuantMatrix {
        if self.source_bits == 8 && self.plan.code_bits == 4 {
            return self.unpack_planes();
        }
        self.unpack_codes()
    }

    /// An 8-bit weight back from its two int4 planes.
    fn unpack_planes(&self) -> QuantMatrix {
        let planes = RepackedW4 {
            perm: self
                .plane_perm
                .clone()
                .filter(|p| p.iter().enumerate().any(|(i, &c)| i as u32 != c)),
            plane_perm: None,
            source_bits: 4,
            zeros_given: true,
            g_idx_given: self.g_idx_given,
            group_size: if self.plan.groups == 2 {
                self.plan.input_k
            } else {
                self.group_size
            },
            plan: Plan {
                input_k: self.plan.k,
                ..self.plan.clone()
            },
            ..self.clone()
        }
        .unpack_codes();
        let (n, k, groups) = (self.plan.n, self.plan.input_k, self.plan.groups / 2);
        let mut codes = vec![0u8; n * k];
        for (out, row) in codes.chunks_exact_mut(k).zip(planes.codes.chunks_exact(2 * k)) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = (row[i] << 4) | row[k + i];
            }
        }
        let zeros_all = planes.zeros.as_ref().expect("planes always carry zeros");
        let mut zeros = vec![0u8; n * groups];
        let mut scales = vec![0f32; n * groups];
        for r in 0..n {
            for g in 0..groups {
                zeros[r * groups + g] = (zeros_all[r * 2 * groups + g] << 4) | zeros_all[r * 2 * groups + groups + g];
                scales[r * groups + g] = planes.scales[r * 2 * groups + groups + g];
            }
        }
        QuantMatrix {
            n,
            k,
            bits: 8,
            group_size: self.group_size,
            codes,
            zeros: self.zeros_given.then_some(zeros),
            scales,
            scale_dtype: self.scale_dtype,
            g_idx: planes.g_idx.map(|g| g[..k].to_vec()),
        }
    }

    fn unpack_codes(&self) -> QuantMatrix {
        let p = &self.plan;
        let (n_cta, rows, k_tiles) = (p.n_cta, p.group_rows, p.k_tiles());
        let mask = (1u32 << p.code_bits) - 1;
        let mut codes = vec![0u8; p.n * p.k];
        let unit_words = p.unit_words();
        for (u, unit) in self.words.chunks_exact(unit_words).enumerate() {
            let (nt, kt) = (u / k_tiles, u % k_tiles);
            for (bit, dn, dk) in p.unit_elements() {
                let (n, pos) = (nt * n_cta + dn, kt * K_TILE + dk);
                if n < p.n && pos < p.k {
                    let k = self.perm.as_ref().map_or(pos, |perm| perm[pos] as usize);
                    codes[n * p.k + k] = ((unit[bit / 32] >> (bit % 32)) & mask) as u8;
                }
            }
        }
        let mut scales = vec![0f32; p.n * p.groups];
        let mut zeros = vec![p.mid_code(); p.n * p.groups];
        for n in 0..p.n {
            for g in 0..p.groups {
                let i = ((n / n_cta) * rows + g) * n_cta + param_slot(n % n_cta);
                scales[n * p.groups + g] = from_bits(self.act, self.scales[i]);
                if let Some(z) = &self.zeros {
                    zeros[n * p.groups + g] = if p.code_bits == 4 {
                        (z[i / 2] >> ((i & 1) * 4)) & 0xF
                    } else {
                        z[i]
                    };
                }
            }
        }
        let g_idx = self.g_idx_given.then(|| {
            let mut g_idx: Vec<u32> = (0..p.k).map(|k| (k / self.group_size) as u32).collect();
            if let Some(perm) = &self.perm {
                for (pos, &k) in perm.iter().enumerate() {
                    g_idx[k as usize] = (pos / self.group_size) as u32;
                }
            }
            g_idx
        });
        QuantMatrix {
            n: p.n,
            k: p.k,
            bits: p.code_bits as u8,
            group_size: self.group_size,
            codes,
            zeros: self.zeros_given.then_some(zeros),
            scales,
            scale_dtype: self.scale_dtype,
            g_idx,
        }
    }

    /// Bytes the kernel reads from the weight per call (codes, scales, zeros).
    pub fn weight_bytes(&self) -> usize {
        self.words.len() * 4 + self.scales.len() * 2 + self.zeros.as_ref().map_or(0, Vec::len)
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Kernel variants
// ------------------------------------------------------------------------------------------------------------------

/// One compiled specialisation of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Activation dtype.
    pub act: DType,
    /// Token tiles of 8 (1, 2, 4 or 8): batches up to `8 * mt` rows.
    pub mt: usize,
    /// Whether zero points are read (otherwise every zero is 8).
    pub zeros: bool,
    /// Whether per-group offsets are read instead ([`DeviceW4::upload_with_offsets`]; symmetric codes, M <= 16).
    pub offsets: bool,
    /// Warps per CTA.
    pub warps: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Stages filled by a producer warp with TMA bulk copies (mbarrier pipeline) instead of cp.async by every
    /// thread with a CTA barrier per stage.
    pub tma: bool,
    /// CTAs per SM the registers are capped for (`__launch_bounds__` minimum blocks).
    pub min_blocks: usize,
    /// The group size is a multiple of 128: a stage holds one scale/zero row (not 8) and no group boundary is
    /// checked inside a unit.
    pub unit_groups: bool,
    /// A shared-memory area of its own for cluster split-K's partials (split-K operators only): the CTAs of a
    /// cluster push into it while the owner may still be reading its stages, so the reduction needs one cluster
    /// barrier, not two.
    pub receive: bool,
    /// Bits per weight code: 4, or 8 for the int8 layout of [`repack_int8`] (fp16 only).
    pub wbits: usize,
    /// The mma warps multiply with wgmma (`m64n{8 mt}k16`, x read from shared memory in the 128-byte swizzle)
    /// instead of mma.sync (sm_90a, TMA variants without offsets, `mt` <= 4, warps a multiple of 4).
    pub wgmma: bool,
    /// The stores apply `Shape::act`, QuantLinear's activation (see `Variant::can_fuse_activation`).
    pub activation: bool,
    /// GATHERED TILES: a kernel tile of `warps` < 8 warps reads its 32-column slices out of the weight's stored
    /// 256-column units (see [`gathered_tile_warps`]).
    pub gather: bool,
    /// BOTH SPLITS IN ONE CTA (gathered tiles): twice `warps` mma warps, one per k half and slice, each half with a
    /// ring of `stages / 2`; one CTA per tile, no cluster (the kernel's header says why).
    pub paired: bool,
}

impl Variant {
    /// The variant `new` picks on sm_90 for `mt` token tiles on a grid of `ctas_per_sm` CTAs per SM: TMA for
    /// M <= 32 (registers capped for two CTAs per SM when the grid has two and M <= 16), cp.async for M <= 64 (a
    /// producer warp would leave the 8 mma warps 224 registers, too tight for M = 64). Stages: 3 when two CTAs
    /// share an SM -- deeper is slower (H200, 8192 x 28672, M = 1: 39.4 us at 3 stages, 41.7 at 4, 46.6 at 6) --
    /// otherwise 8, 6, 5 for M <= 16, 32, 64; `with_tuning` lowers them to what the GPU's shared memory holds.
    /// Older GPUs use cp.async throughout (`with_tuning` clears `tma` there).
    pub fn default_for(
        act: DType,
        mt: usize,
        zeros: bool,
        unit_groups: bool,
        warps: usize,
        ctas_per_sm: usize,
    ) -> Variant {
        let (tma, min_blocks, stages) = match (mt, ctas_per_sm) {
            (1 | 2, 2..) => (true, 2, 3),
            (1 | 2, _) => (true, 1, 8),
            (4, _) => (true, 1, 6),
            _ => (false, 1, 5),
        };
        Variant {
            act,
            mt,
            zeros,
            offsets: false,
            warps,
            stages,
            tma,
            min_blocks,
            unit_groups,
            receive: false,
            wbits: 4,
            wgmma: false,
            activation: false,
            gather: false,
            paired: false,
        }
    }

    /// This (gathered, TMA) variant with both k splits of a tile in one CTA: one CTA per SM, so its registers are
    /// capped for one; a ring per split of this variant's depth, and the RECEIVE area for the second split's partial.
    fn paired(self) -> Variant {
        Variant {
            paired: true,
            min_blocks: 1,
            stages: 2 * self.stages,
            receive: true,
            ..self
        }
    }

    /// Whether this variant has an `activation` twin: the `mma.sync` variants of M <= 16 without offsets. Above 16
    /// rows the per-element call cost more than the separate pass it saves (H200: 4096² at M = 64 19.7 -> 27.9 µs
    /// with silu); the forced wgmma variants of M <= 16 spilled with it.
    fn can_fuse_activation(&self) -> bool {
        !self.offsets && !self.wgmma && self.mt <= 2
    }

    /// This variant reading offsets instead of zero points. At M <= 16 its x sums take 12 more registers, which
    /// the 96 of two CTAs per SM cannot spare: that variant is capped for one CTA per SM.
    fn with_offsets(self) -> Variant {
        Variant {
            zeros: false,
            offsets: true,
            wgmma: false,
            min_blocks: if self.mt >= 2 { 1 } else { self.min_blocks },
            ..self
        }
    }

    /// Lowers `stages` (to no fewer than 2) until `min_blocks` CTAs (those its registers are capped for) fit in
    /// one SM's shared memory together, and one CTA within the per-CTA limit.
    fn fit_stages(&mut self, limits: SmemLimits) {
        let fits = |v: &Variant| {
            v.smem_bytes() <= limits.per_cta && v.min_blocks * (v.smem_bytes() + SMEM_RESERVED_PER_CTA) <= limits.per_sm
        };
        // Paired variants keep an even depth (two rings).
        let step = if self.paired { 2 } else { 1 };
        while self.stages > 2 * step && !fits(self) {
            self.stages -= step;
        }
    }

    /// Threads per CTA: the mma warps, plus the producer warp with TMA; twice both when paired.
    pub fn block_threads(&self) -> usize {
        (self.warps * 32 + if self.tma { 32 } else { 0 }) * if self.paired { 2 } else { 1 }
    }

    /// Dynamic shared memory of one CTA (`Linear::SMEM_BYTES`).
    pub fn smem_bytes(&self) -> usize {
        let n_cta = self.warps * WARP_N;
        let group_rows = if self.unit_groups { 1 } else { MAX_GROUP_ROWS };
        let x_pitch = if self.wgmma { K_TILE } else { X_PITCH };
        let stage = n_cta * K_TILE * self.wbits / 8
            + self.mt * 8 * x_pitch * 2
            + group_rows * n_cta * 2
            + if self.offsets {
                group_rows * n_cta * 2
            } else if self.zeros {
                group_rows * n_cta * self.wbits / 8
            } else {
                0
            };
        // Rounded up like the kernel's STAGE_BYTES (its x rows are a TMA tensor copy's destination): to 128 bytes,
        // or to 1024 in the 128-byte swizzle, with 1 KB of slack to align the base.
        let align = if self.wgmma { 1024 } else { 128 };
        let stage = stage.next_multiple_of(align);
        self.stages * stage
            + if self.tma { self.stages * 16 } else { 0 }
            + if self.receive { self.slot_floats() * 4 } else { 0 }
            + if self.wgmma { 1024 } else { 0 }
    }

    /// fp32 elements of one split-tile partial (`Linear::SLOT_FLOATS`).
    fn slot_floats(&self) -> usize {
        self.warps * WARP_N * self.mt * 8
    }

    fn name(&self) -> String {
        format!(
            "linear_w4a16_{}_b{}_m{}_z{}{}_g{}_w{}_s{}_{}{}{}{}{}{}{}",
            self.act.name(),
            self.wbits,
            self.mt,
            u8::from(self.zeros),
            if self.offsets { "_off" } else { "" },
            if self.unit_groups { "unit" } else { "any" },
            self.warps,
            self.stages,
            if self.tma { "tma" } else { "cpasync" },
            self.min_blocks,
            if self.receive { "_recv" } else { "" },
            if self.wgmma { "_wgmma" } else { "" },
            if self.activation { "_act" } else { "" },
            if self.gather { "_gather" } else { "" },
            if self.paired { "_paired" } else { "" }
        )
    }

    /// The kernel source of this variant, made once per process (the module cache keys on its `&'static` name).
    fn source(&self) -> &'static KernelSource {
        crate::cuda::variant_source(
            self.name(),
            || {
                format!(
                "#define LB_DTYPE {}\n#define LB_MT {}\n#define LB_ZEROS {}\n#define LB_WARPS {}\n#define LB_STAGES {}\n\
                 #define LB_TMA {}\n#define LB_MIN_BLOCKS {}\n#define LB_UNIT_GROUPS {}\n#define LB_RECEIVE {}\n\
                 #define LB_WBITS {}\n#define LB_OFFSETS {}\n#define LB_WGMMA {}\n#define LB_ACTIVATION {}\n\
                 #define LB_GATHER {}\n#define LB_PAIRED {}\n",
                if self.act == DType::Bf16 { "BF16" } else { "F16" },
                self.mt,
                u8::from(self.zeros),
                self.warps,
                self.stages,
                u8::from(self.tma),
                self.min_blocks,
                u8::from(self.unit_groups),
                u8::from(self.receive),
                self.wbits,
                u8::from(self.offsets),
                u8::from(self.wgmma),
                u8::from(self.activation),
                u8::from(self.gather),
                u8::from(self.paired)
            ) + &crate::cuda::experiment_defines("LOWBIT_DECODE_DEFINES")
            },
            SOURCE,
        )
    }
}

/// Whether `variant`, loaded as `function`, runs cluster split-K's `splits` CTAs per tile as thread-block clusters:
/// when all `n_tiles` tiles' clusters fit on the GPU at once. The others (on an H200, the one-CTA-per-SM variants of
/// M > 16) reduce the same splits in the same order through global memory.
fn runs_as_clusters(variant: &Variant, function: &CudaFunction, splits: usize, n_tiles: usize) -> bool {
    let (block, smem) = (variant.block_threads() as u32, variant.smem_bytes());
    splits > 1 && !variant.paired && crate::cuda::resident_cluster_count(function, block, smem, splits) >= n_tiles
}

/// Token tiles for a batch of `m` rows.
fn token_tiles(m: usize) -> usize {
    match m {
        0..=8 => 1,
        9..=16 => 2,
        17..=32 => 4,
        _ => 8,
    }
}

/// Pointers of `Linear::Args` in the kernel, in field order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KernelArgs {
    qweight: u64,
    scales: u64,
    zeros: u64,
    x: u64,
    bias: u64,
    y: u64,
    partials: u64,
    counters: u64,
    trace: u64,
}

/// `lowbit::w4a16::Shape` in the kernel, in field order (11 ints, padding, 2 int64, the clamp flag and bounds, the
/// activation).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KernelShape {
    m: i32,
    n: i32,
    k: i32,
    kt: i32,
    nt: i32,
    group: i32,
    gp: i32,
    ctas: i32,
    group_shift: i32,
    splits: i32,
    cluster: i32,
    x_stride: i64,
    y_stride: i64,
    clamp: i32,
    lo: f32,
    hi: f32,
    act: i32,
}

// SAFETY: plain-old-data `#[repr(C)]` structs laid out like their CUDA counterparts (u64 pointers, i32, i64).
unsafe impl DeviceRepr for KernelArgs {}
unsafe impl DeviceRepr for KernelShape {}

// ------------------------------------------------------------------------------------------------------------------
// The operator
// ------------------------------------------------------------------------------------------------------------------

/// Launch configuration overrides for benchmarking ([`LinearW4A16Cuda::with_tuning`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    /// Pipeline stages (capped at what fits in shared memory).
    pub stages: Option<usize>,
    /// Force the TMA producer (true) or the cp.async pipeline (false) where a TMA variant exists.
    pub tma: Option<bool>,
    /// Grid = this many CTAs per SM (the same for every M); `None`: [`default_ctas_per_sm`].
    pub ctas_per_sm: Option<usize>,
    /// Grid = exactly this many CTAs (fewer, longer stream-K pieces than one per SM, say), with the kernels of
    /// `ctas_per_sm`; overrides its grid size.
    pub ctas: Option<usize>,
    /// Split-K by clusters of this many CTAs (2, 4 or 8; 1 = stream-K) instead of [`cluster_splits`]'s choice.
    /// Overrides the grid options (the grid is then tiles x splits).
    pub splits: Option<usize>,
    /// Whether to launch as the programmatic dependent of the stream's previous kernel (sm_90; default: when the
    /// grid covers at least 95% of the SMs).
    pub dependent_launch: Option<bool>,
    /// Force wgmma (true) or mma.sync (false) in the variants that can take either ([`Variant::wgmma`]; default:
    /// wgmma for 17..32 rows on sm_90).
    pub wgmma: Option<bool>,
    /// Force GATHERED TILES on (the widest of 7, 6, 5 warps whose tiles divide the weight; an error where none
    /// does or the weight cannot take them) or off; default: [`gathered_tile_warps`]. On, the split count is 2:
    /// over stream-K's grid, one CTA per gathered tile and no fix-up, H200 8192 x 28672 took 39.4 us at M = 1
    /// against 32.4 (`bench/results/2026-11-29-h200-decode-gather-m16/`). Up to 16 rows; above, the stored tiles.
    pub gather: Option<bool>,
    /// With gathered tiles, both k splits of a tile in one CTA (true, the default) or a cluster of two CTAs, two per
    /// SM (H200, 8192 x 28672, f16: 30.6 against 32.5 us at M = 1, 38.5 against 43.4 at M = 16;
    /// `bench/results/2026-11-29-h200-decode-paired/`).
    pub paired: Option<bool>,
}

/// The split count of cluster split-K for a weight of `n_tiles` x `k_tiles` units of `code_bits`-bit codes on `sms`
/// SMs (the decode kernel's CLUSTER SPLIT-K), or 1 for stream-K: the largest of 8, 4, 2 whose tiles x splits CTAs
/// fit on the SMs one each and fill at least 80% of them, with at least two units per split; failing that, the same
/// at two CTAs per SM. Small layers (4096 x 4096: 16 tiles x 8), 4096 x 14336 (56 x 2) and 8192 x 28672 (112 x 2, two
/// per SM) get it; wider ones stay on stream-K. Shape only (batch invariance).
/// H200, M = 1, µs against stream-K: 4096 x 14336 int4 at 2 splits 15.1 against 17.9 (85% of the SMs: a 90%
/// rule had refused it), int8 19.4 against 26.0; 8192 x 28672 int8 at 2 splits, two CTAs per SM, 62.0 against
/// 66.7. 8192 x 28672 int4 at 2 splits, two per SM: 32.7-33.0 against 35.4 at M = 1, 39.9-40.0 against 39.7-40.3
/// at M = 16 (`bench/results/2026-11-29-h200-decode-decomposition/`; at stop 37, before the x tensor copy and the
/// later main-loop work, it had gained nothing).
///
/// 8-bit codes first try 4 splits, when their CTAs fill between 80% of one wave and two whole waves of two CTAs per
/// SM (`bench/results/2026-11-27-h200-linear-w8-splits.jsonl`, M = 1 / 4, µs, back-to-back launches):
/// 4096 x 14336 17.0 / 17.4 against 20.0 / 20.4 at 2 splits (one cluster of 4 per tile, 224 CTAs); 8192 x 28672
/// 60.1 / 60.9 against 62.1 / 63.0 (448 CTAs, too many clusters to be resident, so the global fix-up: the second
/// wave fills the first one's tail). 8 splits were slower on both.
pub fn cluster_splits(n_tiles: usize, k_tiles: usize, sms: usize, code_bits: usize) -> usize {
    // `splits` per tile fill at least 80% of `slots` CTAs, with at least two units per split.
    let fills = |splits: usize, slots: usize| n_tiles * splits * 10 >= slots * 8 && k_tiles >= 2 * splits;
    let fill = |slots: usize| [8, 4, 2].into_iter().find(|&s| n_tiles * s <= slots && fills(s, slots));
    let two_per_sm = 2 * sms;
    if code_bits == 8 {
        // Four splits over at most two waves of two CTAs per SM.
        let four = (n_tiles * 4 <= 2 * two_per_sm && fills(4, two_per_sm)).then_some(4);
        return four.or_else(|| fill(sms)).or_else(|| fill(two_per_sm)).unwrap_or(1);
    }
    fill(sms).or_else(|| fill(two_per_sm)).unwrap_or(1)
}

/// Warps of the stored units that GATHERED TILES cut kernel tiles from (256 columns).
const GATHER_STORED_WARPS: usize = 8;

/// Token tiles up to which the kernels gather (M <= 16). Above, the stored tiles (same two splits, hence the same
/// bits) are faster: at M = 17..32 they multiply with wgmma, which takes whole warpgroups, and at 33..64 a gathered
/// grid no longer fits two CTAs per SM (H200, 8192 x 28672, M = 32: 61.2 us gathered, 57.6 stored).
const GATHER_MAX_MT: usize = 2;

/// GATHERED TILES (the decode kernel's header): the warps (7, 6 or 5) of a kernel tile narrower than the stored 256
/// columns, over a weight of `slices` 32-column slices, whose tiles split in two make more CTAs than the stored
/// tiles do, with two k tiles per split; on `sms` SMs they must also fill at least 95% of two CTAs per SM, and
/// `None` for `sms` (forced) takes the first that divides. `None`: the stored tiles. Shape only (batch invariance).
/// 8192 x 28672 (896 slices): 7 warps, 128 tiles, 256 splits (in 128 paired CTAs), against 112 x 2 = 224.
pub fn gathered_tile_warps(slices: usize, k_tiles: usize, sms: Option<usize>) -> Option<usize> {
    let stored = 2 * slices / GATHER_STORED_WARPS;
    let fills = |ctas: usize| sms.map_or(true, |sms| ctas <= 2 * sms && ctas * 20 >= 2 * sms * 19);
    [7, 6, 5].into_iter().find(|&w| {
        let ctas = 2 * slices / w;
        slices % w == 0 && k_tiles >= 4 && ctas > stored && fills(ctas)
    })
}

/// CTAs per SM for a weight of `units` (128-k x tile-width pieces) on `sms` SMs: two when each CTA still gets at
/// least 6 units (more warps hide more latency), one otherwise (every split tile costs a fix-up, which dominates
/// small layers). Depends on the shape only, never on M (batch invariance).
pub fn default_ctas_per_sm(units: usize, sms: usize) -> usize {
    if units >= 6 * 2 * sms {
        2
    } else {
        1
    }
}

/// A repacked int4 weight in device memory: what every W4A16 kernel (decode and GEMM) reads, uploaded once and
/// shared between the operators of one layer (`Arc`).
pub struct DeviceW4 {
    plan: Plan,
    act: DType,
    qweight: CudaSlice<u32>,
    scales: CudaSlice<u16>,
    zeros: Option<CudaSlice<u8>>,
    /// Per-group offsets of a weight in offset form (`(q − midpoint)·s + o`, [`DeviceW4::upload_with_offsets`]):
    /// `[n_tiles][group_rows][n_cta]` bits of `act`, laid out like the scales.
    offsets: Option<CudaSlice<u16>>,
    perm: Option<CudaSlice<u32>>,
    weight_bytes: usize,
    /// Planes a dense [N, K] dequantization sums per position when the kernel's k order is x's own order (no
    /// act-order): 1 for int4, 2 for an 8-bit weight as two planes (K a multiple of 128); `None` otherwise.
    dense_planes: Option<usize>,
}

impl std::fmt::Debug for DeviceW4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceW4")
            .field("plan", &self.plan)
            .field("act", &self.act)
            .finish_non_exhaustive()
    }
}

impl DeviceW4 {
    /// Uploads `packed` on the device's stream.
    pub fn upload(device: &CudaDevice, packed: &RepackedW4) -> Result<Arc<Self>> {
        Self::upload_parts(device, packed, None)
    }

    /// [`DeviceW4::upload`], with `offsets` already in the scales' layout when the weight has them.
    fn upload_parts(device: &CudaDevice, packed: &RepackedW4, offsets: Option<Vec<u16>>) -> Result<Arc<Self>> {
        let plan = &packed.plan;
        if plan.n_tiles() * plan.k_tiles() > i32::MAX as usize
            || plan.k_pad > i32::MAX as usize
            || plan.n_pad > i32::MAX as usize
        {
            return Err(Error::invalid(
                "weight",
                format!("[{}, {}]", plan.n, plan.k),
                "too large for one launch",
            ));
        }
        let upload_err = |e| crate::cuda::cuda_error("upload of the repacked weight", e);
        let stream = device.stream();
        Ok(Arc::new(Self {
            plan: plan.clone(),
            act: packed.act,
            qweight: stream.clone_htod(&packed.words).map_err(upload_err)?,
            scales: stream.clone_htod(&packed.scales).map_err(upload_err)?,
            zeros: packed
                .zeros
                .as_ref()
                .map(|z| stream.clone_htod(z))
                .transpose()
                .map_err(upload_err)?,
            offsets: offsets
                .as_ref()
                .map(|o| stream.clone_htod(o))
                .transpose()
                .map_err(upload_err)?,
            perm: packed
                .perm
                .as_ref()
                .map(|p| stream.clone_htod(p))
                .transpose()
                .map_err(upload_err)?,
            weight_bytes: packed.weight_bytes() + offsets.map_or(0, |o| o.len() * 2),
            dense_planes: packed.dense_planes(),
        }))
    }

    /// Uploads a symmetric `packed` weight (no zero points, no act-order) whose weights are `(q − midpoint)·s + o`
    /// with `offsets` `[n][groups]` (row-major, one per scale): the form of a convolution's per-block weights, with
    /// f16 activations. The operators that read offsets: the GEMM's convolution form and the decode kernel (M ≤ 16).
    /// Offsets must be finite in f16; they are rounded to it like the scales.
    pub fn upload_with_offsets(device: &CudaDevice, packed: &RepackedW4, offsets: &[f32]) -> Result<Arc<Self>> {
        let plan = &packed.plan;
        if packed.zeros.is_some() || packed.perm.is_some() {
            return Err(Error::invalid(
                "weight",
                "zero points or act-order",
                "a weight with offsets must be symmetric and in input order",
            ));
        }
        if packed.act != DType::F16 {
            // The convolution's dtype; the kernels' bf16 offset variants are neither compiled nor tested.
            return Err(Error::invalid(
                "act",
                packed.act,
                "a weight with offsets takes f16 activations",
            ));
        }
        if offsets.len() != plan.n * plan.groups {
            return Err(Error::invalid(
                "offsets",
                format!("{} values", offsets.len()),
                format!("must hold one per scale ({} x {})", plan.n, plan.groups),
            ));
        }
        if let Some(bad) = offsets
            .iter()
            .find(|&&o| !from_bits(packed.act, to_bits(packed.act, o)).is_finite())
        {
            return Err(Error::invalid(
                "offsets",
                bad,
                format!("must be finite in {}", packed.act.name()),
            ));
        }
        let mut laid = vec![0u16; plan.n_tiles() * plan.group_rows * plan.n_cta];
        for (n, row) in offsets.chunks_exact(plan.groups).enumerate() {
            let (nt, c) = (n / plan.n_cta, n % plan.n_cta);
            for (g, &o) in row.iter().enumerate() {
                laid[(nt * plan.group_rows + g) * plan.n_cta + param_slot(c)] = to_bits(packed.act, o);
            }
        }
        Self::upload_parts(device, packed, Some(laid))
    }

    /// Whether the weight carries per-group offsets ([`DeviceW4::upload_with_offsets`]).
    pub fn has_offsets(&self) -> bool {
        self.offsets.is_some()
    }

    /// See the field: `Some(planes)` when the weight can be dequantized to a dense [N, K] matrix in x's order.
    pub fn dense_planes(&self) -> Option<usize> {
        self.dense_planes
    }

    /// The shape decisions.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The activation dtype the scales were converted to.
    pub fn act(&self) -> DType {
        self.act
    }

    /// Bytes of weight (codes, scales, zeros) a kernel reads per call.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Whether the weight has an act-order permutation (x is gathered through it).
    pub fn has_perm(&self) -> bool {
        self.perm.is_some()
    }

    /// Device addresses of (codes, scales, the zero terms or 0, act-order permutation or 0). The zero terms are the
    /// zero points, or the offsets of a weight that has them (never both: [`DeviceW4::upload_with_offsets`]); the
    /// kernels read either from their `zeros` argument.
    pub(crate) fn pointers(&self, stream: &CudaStream) -> (u64, u64, u64, u64) {
        let zero_terms = match (&self.zeros, &self.offsets) {
            (Some(z), _) => z.device_ptr(stream).0,
            (None, Some(o)) => o.device_ptr(stream).0,
            (None, None) => 0,
        };
        (
            self.qweight.device_ptr(stream).0,
            self.scales.device_ptr(stream).0,
            zero_terms,
            self.perm.as_ref().map_or(0, |p| p.device_ptr(stream).0),
        )
    }
}

/// A W4A16 linear layer prepared on one GPU: the repacked weight in device memory and its loaded kernels.
///
/// `run` calls on one operator must be ordered (one stream at a time, as with a cuBLAS workspace): the split-tile
/// counters live in the operator.
pub struct LinearW4A16Cuda {
    plan: Plan,
    act: DType,
    max_m: usize,
    ctas: usize,
    weight: Arc<DeviceW4>,
    counters: CudaSlice<u32>,
    /// Loaded kernels by token tiles, each with whether it runs as clusters (split-K only: all of a launch's
    /// clusters fit on the GPU at once) or reduces the same splits through global memory.
    kernels: Vec<(Variant, CudaFunction, bool)>,
    /// The x gather/realign kernel (same module as the first variant).
    stage_x: CudaFunction,
    /// Cluster split-K's split count (CTAs per tile), or 1: stream-K over `ctas` CTAs.
    splits: usize,
    /// The kernel's tiles along N: the plan's, or GATHERED TILES' ([`gathered_tile_warps`]).
    tiles: usize,
    /// Diagnostics: device address of a per-CTA timeline buffer, or 0 ([`LinearW4A16Cuda::set_trace`]).
    trace: u64,
    /// Launch as the programmatic dependent of the stream's previous kernel (the kernel's DEPENDENT LAUNCH; sm_90),
    /// by default when the grid covers at least 95% of the SMs. H200, M = 1, µs without / with: 8192 x 28672
    /// (264 CTAs) 40.6 / 36.6, 4096 x 4096 (128) 10.1 / 6.6, 14336 x 4096 (128) 20.0 / 16.9, but 4096 x 14336
    /// (112 CTAs) 16.4 / 18.7: the next launch's CTAs start early on the 20 idle SMs, two to an SM, and run there
    /// at half speed (our reading; not traced).
    dependent_launch: bool,
}

impl std::fmt::Debug for LinearW4A16Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearW4A16Cuda")
            .field("plan", &self.plan)
            .field("act", &self.act)
            .field("max_m", &self.max_m)
            .field("ctas", &self.ctas)
            .finish_non_exhaustive()
    }
}

impl LinearW4A16Cuda {
    /// Validates and repacks `w`, uploads it, and loads the kernels for batches of up to `max_m` rows of `act` (f16
    /// or bf16) activations (above [`MAX_M`], in chunks of [`MAX_M`] rows).
    pub fn new(device: &CudaDevice, w: &QuantMatrix, act: DType, max_m: usize) -> Result<Self> {
        Self::from_repacked(device, &repack(w, act)?, max_m, None)
    }

    /// Uploads an already repacked weight (repack once, upload to several devices or copies) and loads the
    /// kernels for batches of up to `max_m` rows; `stages` forces the pipeline depth (benchmarking; `None` for the
    /// tuned default).
    pub fn from_repacked(
        device: &CudaDevice,
        packed: &RepackedW4,
        max_m: usize,
        stages: Option<usize>,
    ) -> Result<Self> {
        Self::with_tuning(
            device,
            packed,
            max_m,
            Tuning {
                stages,
                ..Tuning::default()
            },
        )
    }

    /// As [`LinearW4A16Cuda::from_repacked`] with the launch configuration forced (benchmarking).
    #[doc(hidden)]
    pub fn with_tuning(device: &CudaDevice, packed: &RepackedW4, max_m: usize, tuning: Tuning) -> Result<Self> {
        Self::with_weight(device, DeviceW4::upload(device, packed)?, max_m, tuning)
    }

    /// The operator for a weight already on the device (shared with other operators of the same layer).
    pub fn with_weight(device: &CudaDevice, weight: Arc<DeviceW4>, max_m: usize, tuning: Tuning) -> Result<Self> {
        if max_m == 0 {
            return Err(Error::invalid("max_m", max_m, "must be at least 1"));
        }
        if weight.offsets.is_some() && max_m > MAX_M_OFFSETS {
            return Err(Error::invalid(
                "max_m",
                max_m,
                format!("must be at most {MAX_M_OFFSETS} for a weight with offsets"),
            ));
        }
        let (plan, act) = (weight.plan.clone(), weight.act);
        let units = plan.n_tiles() * plan.k_tiles();
        // The grid (hence the split of K) is the same for every M: batch invariance.
        let sms = device.info().sm_count as usize;
        // TMA bulk copies, mbarrier transaction counts and clusters are sm_90 features.
        let cc = device.info().compute_capability;
        let (tma_supported, limits) = (cc.0 >= 9, smem_limits(cc));
        // GATHERED TILES: int4 in 256-column units with one scale row per unit, no offsets, on sm_90.
        let gather_ok = tma_supported
            && plan.code_bits == 4
            && plan.warps == GATHER_STORED_WARPS
            && plan.group % K_TILE == 0
            && weight.offsets.is_none()
            && matches!(tuning.splits, None | Some(2));
        let slices = plan.n_tiles() * plan.warps;
        let gather_warps = match tuning.gather {
            Some(true) => Some(
                gathered_tile_warps(slices, plan.k_tiles(), None)
                    .filter(|_| gather_ok)
                    .ok_or_else(|| {
                        Error::invalid(
                            "gather",
                            true,
                            "needs sm_90, int4 codes in 256-column tiles, groups of 128 k or more, no offsets, \
                             2 splits, and 7, 6 or 5 dividing the 32-column slices",
                        )
                    })?,
            ),
            Some(false) => None,
            None if gather_ok => gathered_tile_warps(slices, plan.k_tiles(), Some(sms)),
            None => None,
        };
        let (tiles, warps) = match gather_warps {
            Some(w) => (slices / w, w),
            None => (plan.n_tiles(), plan.warps),
        };
        let splits = match tuning.splits {
            _ if gather_warps.is_some() => 2,
            Some(s @ (1 | 2 | 4 | 8)) if s <= plan.k_tiles() && (s == 1 || tma_supported) => s,
            Some(s) => {
                return Err(Error::invalid(
                    "splits",
                    s,
                    format!(
                        "must be 1, or 2, 4 or 8 and at most the {} k tiles, on sm_90+",
                        plan.k_tiles()
                    ),
                ))
            }
            None if tma_supported => cluster_splits(plan.n_tiles(), plan.k_tiles(), sms, plan.code_bits),
            None => 1,
        };
        // Cluster split-K takes the two-CTAs-per-SM variants (less shared memory each) even though its grid is at
        // most one CTA per SM: a GPC must hold whole clusters, and on an H200 fewer than 16 clusters of 8 one-per-SM
        // CTAs fit at once. Two CTAs sharing an SM cost little: the kernel is bound by DRAM, not by one SM's share.
        let ctas_per_sm = match splits {
            1 => tuning
                .ctas_per_sm
                .unwrap_or_else(|| default_ctas_per_sm(units, sms))
                .max(1),
            _ => tuning.ctas_per_sm.unwrap_or(2).max(1),
        };
        let zeros = weight.zeros.is_some();
        let unit_groups = plan.group % K_TILE == 0;
        let mut variants = Vec::new();
        // The largest launch: a chunk of MAX_M rows.
        let launch_m = max_m.min(MAX_M);
        for mt in [1, 2, 4, 8].into_iter().filter(|&mt| mt == 1 || 8 * mt / 2 < launch_m) {
            let gather = gather_warps.is_some() && mt <= GATHER_MAX_MT;
            let warps = if gather { warps } else { plan.warps };
            let mut variant = Variant::default_for(act, mt, zeros, unit_groups, warps, ctas_per_sm);
            variant.gather = gather;
            // M = 64 has no TMA variant (registers); nothing before sm_90 has.
            variant.tma = variant.tma && tma_supported && tuning.tma.unwrap_or(true);
            variant.receive = splits > 1;
            variant.wbits = plan.code_bits;
            // wgmma is sm_90a's alone, and takes whole warpgroups (tiles of 128 or 256 columns). By default it
            // serves M = 17..32, where mma.sync issues four mmas per fragment (H200, 8192 x 28672 at M = 32: 62-63
            // against 67-68 us); at M <= 16 the two read within noise of each other or mma.sync wins
            // (docs/notes/w4a16-decode.md, "wgmma").
            variant.wgmma = variant.tma && cc.0 == 9 && warps % 4 == 0 && mt <= 4 && tuning.wgmma.unwrap_or(mt == 4);
            if weight.offsets.is_some() {
                variant = variant.with_offsets();
            }
            if let Some(stages) = tuning.stages {
                variant.stages = stages.max(2);
            }
            if gather && variant.tma && tuning.paired.unwrap_or(true) {
                variant = variant.paired();
            }
            // The depth (forced or default) is capped at what fits in this GPU's shared memory.
            variant.fit_stages(limits);
            variants.push(variant);
        }
        // Up to four variants: compiled side by side, then loaded one by one.
        device.prepare(&variants.iter().map(|v| v.source()).collect::<Vec<_>>())?;
        let mut kernels = Vec::with_capacity(variants.len());
        for variant in variants {
            let function =
                device.function_with_shared_memory(variant.source(), "w4a16_linear", variant.smem_bytes())?;
            kernels.push((variant, function, false));
        }
        // The widest grid (gathered tiles outnumber the stored ones): sizes the workspace and the trace buffer.
        let ctas = match splits {
            1 => tuning.ctas.unwrap_or(ctas_per_sm * sms).clamp(1, units),
            _ => tiles * splits,
        };
        let stage_x = device.function(kernels[0].0.source(), "w4a16_stage_x")?;
        let counters = device
            .stream()
            .alloc_zeros(tiles * warps)
            .map_err(|e| crate::cuda::cuda_error("split-tile counters", e))?;
        let mut op = Self {
            ctas,
            weight,
            counters,
            kernels,
            stage_x,
            plan,
            act,
            max_m,
            splits,
            tiles,
            trace: 0,
            dependent_launch: tma_supported && tuning.dependent_launch.unwrap_or(ctas * 20 >= sms * 19),
        };
        let clusters: Vec<bool> = op.kernels.iter().map(|(v, f, _)| op.runs_as_clusters(v, f)).collect();
        for ((_, _, cluster), runs) in op.kernels.iter_mut().zip(clusters) {
            *cluster = runs;
        }
        Ok(op)
    }

    /// Diagnostics: every later launch writes its CTAs' timelines (10 `u64` per CTA, the kernels' `Trace` in
    /// `common.cuh`) to the device buffer at `address`, which must hold 10 x [`LinearW4A16Cuda::ctas`] values; 0
    /// turns tracing off.
    #[doc(hidden)]
    pub fn set_trace(&mut self, address: u64) {
        self.trace = address;
    }

    /// The shape decisions.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The activation dtype.
    pub fn act(&self) -> DType {
        self.act
    }

    /// Bytes of weight (codes, scales, zeros) read per call.
    pub fn weight_bytes(&self) -> usize {
        self.weight.weight_bytes
    }

    /// The device weight (shareable with a GEMM operator of the same layer).
    pub fn weight(&self) -> &Arc<DeviceW4> {
        &self.weight
    }

    /// CTAs of the widest launch (one per SM, fewer for tiny weights; with split-K every tile's splits, the
    /// gathered tiles' when there are any).
    pub fn ctas(&self) -> usize {
        self.ctas
    }

    /// CTAs per tile with cluster split-K, or 1 with stream-K (see [`cluster_splits`]).
    pub fn splits(&self) -> usize {
        self.splits
    }

    /// Output columns per kernel tile up to 16 rows: the plan's tile, or narrower with GATHERED TILES
    /// ([`gathered_tile_warps`]; above 16 rows the kernels take the stored tiles).
    pub fn tile_width(&self) -> usize {
        self.plan.n_pad / self.tiles
    }

    /// Tiles of `variant`'s grid: `tiles` when it gathers, the stored tiles otherwise.
    fn tiles_of(&self, variant: &Variant) -> usize {
        if variant.gather {
            self.tiles
        } else {
            self.plan.n_tiles()
        }
    }

    /// Whether `variant`, loaded as `function`, launches its splits as clusters ([`runs_as_clusters`] over its tiles).
    fn runs_as_clusters(&self, variant: &Variant, function: &CudaFunction) -> bool {
        runs_as_clusters(variant, function, self.splits, self.tiles_of(variant))
    }

    /// CTAs of `variant`'s launch: every tile's splits with split-K, the stream-K grid otherwise.
    fn ctas_of(&self, variant: &Variant) -> usize {
        match self.splits {
            1 => self.ctas,
            _ if variant.paired => self.tiles_of(variant),
            splits => self.tiles_of(variant) * splits,
        }
    }

    /// The operator with, next to each variant that can take it, a twin that applies an activation in its stores
    /// ([`LinearW4A16Cuda::run_with_activation`]): the `mma.sync` variants of M <= 16. A separate build, so that
    /// operators without an activation neither compile nor run the per-element call.
    pub fn with_fused_activation(mut self, device: &CudaDevice) -> Result<Self> {
        let twins: Vec<Variant> = self
            .kernels
            .iter()
            .filter(|(v, _, _)| v.can_fuse_activation())
            .map(|(v, _, _)| Variant { activation: true, ..*v })
            .collect();
        device.prepare(&twins.iter().map(|v| v.source()).collect::<Vec<_>>())?;
        for variant in twins {
            let function =
                device.function_with_shared_memory(variant.source(), "w4a16_linear", variant.smem_bytes())?;
            let cluster = self.runs_as_clusters(&variant, &function);
            self.kernels.push((variant, function, cluster));
        }
        Ok(self)
    }

    /// Whether [`LinearW4A16Cuda::run_with_activation`] takes an activation for a batch of `m` rows: built
    /// [`LinearW4A16Cuda::with_fused_activation`], up to 16 rows on the `mma.sync` variants.
    pub fn fuses_activation(&self, m: usize) -> bool {
        let mt = token_tiles(m.min(MAX_M));
        self.kernels.iter().any(|(v, _, _)| v.mt == mt && v.activation)
    }

    /// Diagnostics: per loaded kernel variant, its name and how many clusters of 2, 4 and 8 CTAs the GPU keeps
    /// resident at once (cluster split-K needs one per tile).
    #[doc(hidden)]
    pub fn cluster_residency(&self) -> Vec<(String, [usize; 3])> {
        self.kernels
            .iter()
            .map(|(v, f, _)| {
                let count = |s| crate::cuda::resident_cluster_count(f, v.block_threads() as u32, v.smem_bytes(), s);
                (v.name(), [count(2), count(4), count(8)])
            })
            .collect()
    }

    /// Bytes of x staged in the workspace (act-order gather / realignment) for one launch's rows, 256-byte rounded.
    fn staged_x_bytes(&self) -> usize {
        (self.max_m.min(MAX_M) * self.plan.k_pad * 2).next_multiple_of(256)
    }

    /// Device scratch `run` needs for batches of up to `max_m` rows: split-tile partial sums and room to stage x.
    pub fn workspace_bytes(&self) -> usize {
        let widest = self.kernels.iter().map(|(v, _, _)| v.slot_floats()).max().unwrap_or(0);
        self.staged_x_bytes() + 2 * self.ctas * widest * 4
    }

    /// `y[m, N] = x[m, K] · W^T (+ bias)` with contiguous rows; see [`LinearW4A16Cuda::run_strided`].
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        y: &mut dyn DevicePtrMut<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        self.run_strided(stream, x, self.plan.input_k, m, bias, y, self.plan.n, workspace)
    }

    /// `y[m, N] = x[m, K] · W^T (+ bias)` on `stream`: row `i` of x starts at element `i * x_stride`, row `i` of y
    /// at `i * y_stride`. Checks dtypes and buffer sizes on the host, then launches without allocating or
    /// synchronising (graph-capturable). `T` must be the activation dtype given to `new`; `m <= max_m`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_strided<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        x_stride: usize,
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        y: &mut dyn DevicePtrMut<T>,
        y_stride: usize,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let (x, y) = ((x, x_stride), (y, y_stride));
        self.run_checked(stream, x, m, bias, y, workspace, Activation::None)
    }

    /// As [`LinearW4A16Cuda::run`], with `activation` applied to every output after the bias, in fp32 before the one
    /// rounding to the activation type (the epilogue [`crate::ops::linear::QuantLinear`] fuses). An activation other
    /// than none is [`Error::Unsupported`] unless [`LinearW4A16Cuda::fuses_activation`] says yes for `m`: an operator
    /// built [`LinearW4A16Cuda::with_fused_activation`], up to 16 rows.
    #[allow(clippy::too_many_arguments)]
    pub fn run_with_activation<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        activation: Activation,
        y: &mut dyn DevicePtrMut<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let (x, y) = ((x, self.plan.input_k), (y, self.plan.n));
        self.run_checked(stream, x, m, bias, y, workspace, activation)
    }

    /// `call_buffers`'s checks, then the launch.
    #[allow(clippy::too_many_arguments)]
    fn run_checked<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        (x, x_stride): (&dyn DevicePtr<T>, usize),
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        (y, y_stride): (&mut dyn DevicePtrMut<T>, usize),
        workspace: &mut dyn DevicePtrMut<u8>,
        activation: Activation,
    ) -> Result<()> {
        let call = (self.act, self.max_m, self.workspace_bytes());
        match call_buffers(
            &self.plan,
            call,
            stream,
            (x, x_stride),
            m,
            bias,
            (y, y_stride),
            workspace,
        )? {
            Some(buffers) => self.launch(stream, m, &buffers, (x_stride, y_stride), None, activation),
            None => Ok(()),
        }
    }

    /// Launches on buffers already checked (`call_buffers`'s rules, `m` in `1..=max_m`), every output clamped to
    /// `clamp`'s `[lo, hi]` after the bias when given (a NaN passes: the relu/relu6 of a convolution routed here),
    /// then put through `activation` (QuantLinear's epilogue).
    ///
    /// A batch of more than [`MAX_M`] rows runs as chunks of [`MAX_M`] rows in order on `stream`, as Marlin does:
    /// each chunk reads the whole weight again, which the tensor work of 64 rows covers on the GPUs this path is for
    /// (those without the Hopper GEMM). Each chunk is the 64-row call of its rows, so the bits are those of any
    /// smaller batch (batch invariance). Chunks reuse the workspace and counters: a chunk's launch that starts
    /// early as a dependent (DEPENDENT LAUNCH) waits for the previous one before it reads x or writes anything.
    pub(crate) fn launch(
        &self,
        stream: &CudaStream,
        m: usize,
        buffers: &CallBuffers,
        strides: (usize, usize),
        clamp: Option<(f32, f32)>,
        activation: Activation,
    ) -> Result<()> {
        let bytes = self.act.size() as u64;
        for first in (0..m).step_by(MAX_M) {
            let chunk = CallBuffers {
                x: buffers.x + first as u64 * strides.0 as u64 * bytes,
                y: buffers.y + first as u64 * strides.1 as u64 * bytes,
                ..*buffers
            };
            self.launch_rows(stream, MAX_M.min(m - first), &chunk, strides, clamp, activation)?;
        }
        Ok(())
    }

    /// One launch for `m <= MAX_M` rows (see [`LinearW4A16Cuda::launch`]).
    fn launch_rows(
        &self,
        stream: &CudaStream,
        m: usize,
        buffers: &CallBuffers,
        (x_stride, y_stride): (usize, usize),
        clamp: Option<(f32, f32)>,
        activation: Activation,
    ) -> Result<()> {
        let p = &self.plan;
        let CallBuffers {
            x: x_ptr,
            y: y_ptr,
            bias: bias_ptr,
            workspace: ws,
        } = *buffers;

        let mt = token_tiles(m);
        let fused = activation != Activation::None;
        let (variant, function, cluster) = self
            .kernels
            .iter()
            .find(|(v, _, _)| v.mt == mt && v.activation == fused)
            .ok_or_else(|| match fused {
                true => Error::Unsupported(format!(
                    "the {activation:?} epilogue in the decode kernel at {m} rows: fused only up to 16 rows on \
                     mma.sync, by an operator built with_fused_activation"
                )),
                false => Error::invalid("x", format!("{m} rows"), "exceeds the operator's max_m"),
            })?;

        // x goes through the workspace when the kernel cannot read it in place: act-order gather, or rows that are
        // not 16-byte aligned (the kernel's 16-byte cp.async).
        // The TMA producer copies whole 128-k rows, so with it K must also be a multiple of 128.
        let (qweight, scales, zeros, perm) = self.weight.pointers(stream);
        let direct =
            perm == 0 && x_ptr % 16 == 0 && x_stride % 8 == 0 && p.k % if variant.tma { K_TILE } else { 8 } == 0;
        let (x_ptr, x_stride, x_cols) = if direct {
            (x_ptr, x_stride, p.k)
        } else {
            stage_x(stream, &self.stage_x, p, x_ptr, x_stride, perm, ws, m)?;
            (ws, p.k_pad, p.k_pad)
        };
        // The TMA producer reads a stage's x rows with one tensor copy: a box of m rows x X_PITCH columns lands at
        // the stage's padded row pitch (columns past x's are zeros). x's address and row stride are 16-byte
        // aligned on both paths above, as the map needs.
        // WGMMA: two boxes of m rows x 64 columns per stage, in the 128-byte swizzle (the kernel zeroes the rows
        // from m to the variant's token rows once: a box of zero-filled rows cost the TMA unit their bytes).
        let x_map = if variant.tma {
            let (box_cols, swizzle_128b) = if variant.wgmma {
                (K_TILE / 2, true)
            } else {
                (X_PITCH, false)
            };
            let element = MapElement::activation(self.act);
            tensor_map_2d("x", element, x_ptr, (m, x_cols, x_stride), (m, box_cols), swizzle_128b)?
        } else {
            TensorMap::unused()
        };

        let args = KernelArgs {
            qweight,
            scales,
            zeros,
            x: x_ptr,
            bias: bias_ptr,
            y: y_ptr,
            partials: ws + self.staged_x_bytes() as u64,
            counters: self.counters.device_ptr(stream).0,
            trace: self.trace,
        };
        let shape = KernelShape {
            m: m as i32,
            n: p.n as i32,
            k: p.k as i32,
            kt: p.k_tiles() as i32,
            nt: self.tiles_of(variant) as i32,
            group: p.group as i32,
            gp: p.group_rows as i32,
            ctas: self.ctas_of(variant) as i32,
            group_shift: if p.group.is_power_of_two() {
                p.group.trailing_zeros() as i32
            } else {
                -1
            },
            splits: self.splits as i32,
            cluster: i32::from(*cluster),
            x_stride: x_stride as i64,
            y_stride: y_stride as i64,
            clamp: i32::from(clamp.is_some()),
            lo: clamp.map_or(0.0, |c| c.0),
            hi: clamp.map_or(0.0, |c| c.1),
            act: activation.code(),
        };
        // Cluster split-K and the kernel's DEPENDENT LAUNCH, each when this operator uses it.
        let launch = crate::cuda::Launch {
            grid: self.ctas_of(variant) as u32,
            grid_y: 1,
            block: variant.block_threads() as u32,
            smem: variant.smem_bytes(),
            cluster: cluster.then_some(self.splits),
            dependent: self.dependent_launch,
        };
        // SAFETY: every pointer was checked above to cover what the kernel touches for this shape and m: x rows (K
        // valid columns; the kernel zero-fills past K without reading), y rows (N columns), bias (N), the workspace
        // (partials of 2 * ctas slots), and the operator's own weight buffers and counters; the TMA variants read x
        // through the map (m rows, zeros past its columns). `params` points at the three kernel parameters, in order.
        let mut params: [*mut std::ffi::c_void; 3] = [
            &x_map as *const TensorMap as *mut _,
            &args as *const KernelArgs as *mut _,
            &shape as *const KernelShape as *mut _,
        ];
        let cluster_ctas = if *cluster { self.splits } else { 1 };
        unsafe {
            crate::cuda::launch_ex(function, stream, launch, &mut params, || {
                format!("launching w4a16_linear (clusters of {cluster_ctas})")
            })
        }
    }
}

/// Dense `y[M, N] = x[M, K] · W^T` through cuBLAS (f16/bf16 operands, fp32 accumulation), `W` a row-major `[N, K]`
/// matrix: the baseline the W4A16 kernel is measured against (`lowbit bench --op linear`), and what a model would
/// run with unquantized weights. The handle is bound to the device's stream and given the device's cuBLAS workspace
/// ([`CudaDevice::blas_workspace`], the 32 MiB cuBLAS recommends on Hopper, which PyTorch sets too).
pub struct CublasLinear {
    blas: cudarc::cublas::CudaBlas,
    /// Kept alive as long as the handle that uses it.
    _workspace: Arc<CudaSlice<u8>>,
    n: usize,
    k: usize,
}

impl CublasLinear {
    /// A cuBLAS handle on `device`'s stream, with its workspace, for an `n x k` weight.
    pub fn new(device: &CudaDevice, n: usize, k: usize) -> Result<Self> {
        if !crate::cuda::cublas_present() {
            return Err(Error::CudaUnavailable("cuBLAS (libcublas.so.13) not found".into()));
        }
        let stream = device.stream();
        let blas = cudarc::cublas::CudaBlas::new(stream.clone()).map_err(blas_error("cublasCreate"))?;
        let workspace = device.blas_workspace()?;
        let ptr = workspace.device_ptr(stream).0;
        // SAFETY: a live handle; the buffer outlives it (held in `Self`), and every handle given it runs on the same
        // stream, so their calls never overlap.
        unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, workspace.len()) }
            .result()
            .map_err(blas_error("cublasSetWorkspace"))?;
        Ok(Self {
            blas,
            _workspace: workspace,
            n,
            k,
        })
    }

    /// `y = x · W^T` for `m` rows (contiguous), on the handle's stream.
    pub fn run<T: DenseElement>(
        &self,
        w: &CudaSlice<T>,
        x: &CudaSlice<T>,
        m: usize,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        use cudarc::cublas::{sys::cublasOperation_t as Op, GemmConfig};
        let (n, k) = (self.n, self.k);
        let check = |name: &str, have: usize, need: usize| {
            if have < need {
                Err(Error::invalid(
                    name,
                    format!("{have} elements"),
                    format!("needs at least {need}"),
                ))
            } else {
                Ok(())
            }
        };
        check("w", w.len(), n * k)?;
        check("x", x.len(), m * k)?;
        check("y", y.len(), m * n)?;
        // Column-major view: y^T [N, M] = W [N, K] (the row-major [N, K] read transposed) · x^T [K, M].
        let cfg = GemmConfig {
            transa: Op::CUBLAS_OP_T,
            transb: Op::CUBLAS_OP_N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: T::from_f32(1.0),
            lda: k as i32,
            ldb: k as i32,
            beta: T::from_f32(0.0),
            ldc: n as i32,
        };
        // SAFETY: the three buffers were checked to hold the elements the GEMM reads and writes.
        unsafe { T::gemm(&self.blas, cfg, w, x, y) }.map_err(blas_error("cublasGemmEx"))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// The element types [`CublasLinear`] multiplies: f16 and bf16.
pub trait DenseElement: Float + DeviceRepr + cudarc::driver::ValidAsZeroBits + sealed::Sealed {
    /// The cuBLASLt product of this type ([`CublasLtLinear`]).
    #[doc(hidden)]
    const LT_TYPES: LtTypes;

    /// cuBLAS GEMM for this type.
    ///
    /// # Safety
    /// The buffers must hold what `cfg` describes.
    #[doc(hidden)]
    unsafe fn gemm(
        blas: &cudarc::cublas::CudaBlas,
        cfg: cudarc::cublas::GemmConfig<Self>,
        a: &CudaSlice<Self>,
        b: &CudaSlice<Self>,
        c: &mut CudaSlice<Self>,
    ) -> std::result::Result<(), cudarc::cublas::result::CublasError>;
}

macro_rules! dense_element {
    ($t:ty, $lt:expr) => {
        impl DenseElement for $t {
            const LT_TYPES: LtTypes = $lt;

            unsafe fn gemm(
                blas: &cudarc::cublas::CudaBlas,
                cfg: cudarc::cublas::GemmConfig<Self>,
                a: &CudaSlice<Self>,
                b: &CudaSlice<Self>,
                c: &mut CudaSlice<Self>,
            ) -> std::result::Result<(), cudarc::cublas::result::CublasError> {
                // SAFETY: forwarded from the caller.
                unsafe { cudarc::cublas::Gemm::gemm(blas, cfg, a, b, c) }
            }
        }
    };
}
dense_element!(f16, LtTypes::F16);
dense_element!(bf16, LtTypes::Bf16);

/// The same dense product through cuBLASLt ([`LtMatmul`]: descriptors, a 32 MiB workspace and the heuristic's first
/// algorithm, planned once per batch size): the second cuBLAS baseline of `lowbit bench --op linear`, the path
/// PyTorch takes for many of its linear layers.
#[derive(Debug)]
pub struct CublasLtLinear<T: DenseElement> {
    plan: LtMatmul,
    element: std::marker::PhantomData<T>,
}

impl<T: DenseElement> CublasLtLinear<T> {
    /// Plans `y = x · W^T` for `m` rows of `T`, an `n x k` weight, on the device's stream.
    pub fn new(device: &CudaDevice, m: usize, n: usize, k: usize) -> Result<Self> {
        Ok(Self {
            plan: LtMatmul::new(device.context(), device.stream(), T::LT_TYPES, m, n, k)?,
            element: std::marker::PhantomData,
        })
    }

    /// `y = x · W^T` on `stream` (x `[M, K]`, w `[N, K]` row-major, y `[M, N]`).
    pub fn run(&mut self, stream: &CudaStream, w: &CudaSlice<T>, x: &CudaSlice<T>, y: &mut CudaSlice<T>) -> Result<()> {
        self.plan.check_lengths(w.len(), x.len(), y.len())?;
        let (w, x) = (w.device_ptr(stream).0, x.device_ptr(stream).0);
        let y = y.device_ptr_mut(stream).0;
        // SAFETY: the three buffers were checked to hold the elements the product reads and writes.
        unsafe { self.plan.run_raw(stream, w, x, y) }
    }
}

/// Device addresses of one call's buffers ([`call_buffers`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallBuffers {
    pub x: u64,
    pub y: u64,
    /// 0 without a bias.
    pub bias: u64,
    pub workspace: u64,
}

/// The argument checks every W4A16 launcher makes: `x` of the operator's dtype `call.0` with at most `call.1` rows
/// of `plan.input_k` values `x_stride` apart, y rows of N values, bias N values, a 256-byte aligned workspace of
/// `call.2` bytes. Returns the buffers' addresses, or `None` when there is nothing to do (m = 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn call_buffers<T: Float + DeviceRepr>(
    plan: &Plan,
    call: (DType, usize, usize),
    stream: &CudaStream,
    (x, x_stride): (&dyn DevicePtr<T>, usize),
    m: usize,
    bias: Option<&dyn DevicePtr<T>>,
    (y, y_stride): (&mut dyn DevicePtrMut<T>, usize),
    workspace: &mut dyn DevicePtrMut<u8>,
) -> Result<Option<CallBuffers>> {
    let (act, max_m, workspace_bytes) = call;
    if T::DTYPE != act {
        return Err(Error::invalid(
            "x",
            T::DTYPE,
            format!("dtype must be {act} (the operator's)"),
        ));
    }
    if m > max_m {
        return Err(Error::invalid(
            "x",
            format!("{m} rows"),
            format!("at most max_m = {max_m}"),
        ));
    }
    if m == 0 {
        return Ok(None);
    }
    if x_stride < plan.input_k || y_stride < plan.n {
        return Err(Error::invalid(
            "x/y row stride",
            format!("{x_stride}/{y_stride}"),
            format!("must be at least K = {} / N = {}", plan.input_k, plan.n),
        ));
    }
    let rows_len = |stride: usize, width: usize| (m - 1) * stride + width;
    let x_ptr = buffer(
        x.device_ptr(stream).0,
        x.len(),
        rows_len(x_stride, plan.input_k),
        "x",
        2,
    )?;
    let y_len = y.len();
    let y_ptr = buffer(y.device_ptr_mut(stream).0, y_len, rows_len(y_stride, plan.n), "y", 2)?;
    let bias_ptr = match bias {
        Some(b) => buffer(b.device_ptr(stream).0, b.len(), plan.n, "bias", 2)?,
        None => 0,
    };
    let ws_len = workspace.len();
    let ws = buffer(
        workspace.device_ptr_mut(stream).0,
        ws_len,
        workspace_bytes,
        "workspace",
        256,
    )?;
    Ok(Some(CallBuffers {
        x: x_ptr,
        y: y_ptr,
        bias: bias_ptr,
        workspace: ws,
    }))
}

/// Launches `stage_x` (a kernel of `stage_x(x, x_stride, perm, out, M, K, k_pad)`'s signature, `common.cuh`): the
/// `m` rows of x gathered through `perm` (0: none) into `dst` as rows of `plan.k_pad` values, zero past `plan.k`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_x(
    stream: &CudaStream,
    function: &CudaFunction,
    plan: &Plan,
    x: u64,
    x_stride: usize,
    perm: u64,
    dst: u64,
    m: usize,
) -> Result<()> {
    let total = (m * plan.k_pad) as u64;
    let (xs, mi, ki, kp) = (x_stride as i64, m as i32, plan.k as i32, plan.k_pad as i32);
    let mut b = stream.launch_builder(function);
    b.arg(&x).arg(&xs).arg(&perm).arg(&dst).arg(&mi).arg(&ki).arg(&kp);
    let cfg = LaunchConfig {
        grid_dim: (total.div_ceil(256).min(8192) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the callers checked m rows of x; perm, when given, has plan.k entries (each < plan.input_k); dst is
    // the start of a workspace holding at least max_m * k_pad values.
    unsafe { b.launch(cfg) }.map_err(launch_error("stage_x"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SplitMix64 as Rng;

    /// The decode kernel's split counts for the anchor layers on an H200's 132 SMs (256-column tiles, 128-k
    /// units), as `cluster_splits` documents them: the measured plans of `docs/notes/w4a16-decode.md`.
    #[test]
    fn split_counts_of_the_anchor_layers() {
        let sms = 132;
        // (n tiles, k tiles, bits, splits)
        for (n_tiles, k_tiles, bits, splits) in [
            (16, 32, 4, 8),  // 4096 x 4096
            (56, 32, 4, 2),  // 4096 x 14336
            (16, 112, 4, 8), // 14336 x 4096
            (112, 64, 4, 2), // 8192 x 28672: two per SM
            (140, 64, 4, 1), // wider: stream-K
            (16, 32, 8, 8),  // int8 4096 x 4096
            (56, 32, 8, 4),  // int8 4096 x 14336: one cluster of 4 per tile
            (112, 64, 8, 4), // int8 8192 x 28672: 448 CTAs, the global fix-up
            (106, 4, 8, 2),  // too few k tiles for 4 splits: two per SM at 2 splits
            (56, 6, 8, 2),   // 4 splits need 8 k tiles
            (300, 64, 8, 1), // too wide for any split
        ] {
            assert_eq!(
                cluster_splits(n_tiles, k_tiles, sms, bits),
                splits,
                "{n_tiles} x {k_tiles} tiles, {bits}-bit"
            );
        }
    }

    fn random_weight(rng: &mut Rng, n: usize, k: usize, g: usize, zeros: bool, act_order: bool) -> QuantMatrix {
        let groups = k / g;
        let codes = (0..n * k).map(|_| rng.below(16) as u8).collect();
        // f16-exact scales (and bf16-exact: 8 significant bits).
        let scales = (0..n * groups).map(|_| (1 + rng.below(255)) as f32 / 4096.0).collect();
        let zeros = zeros.then(|| (0..n * groups).map(|_| rng.below(16) as u8).collect());
        let g_idx = act_order.then(|| {
            let mut g_idx: Vec<u32> = (0..k).map(|i| (i / g) as u32).collect();
            for i in (1..k).rev() {
                g_idx.swap(i, rng.below(i as u64 + 1) as usize);
            }
            g_idx
        });
        QuantMatrix {
            n,
            k,
            bits: 4,
            group_size: g,
            codes,
            zeros,
            scales,
            scale_dtype: DType::F16,
            g_idx,
        }
    }

    /// `random_weight` as an 8-bit weight (codes and zeros over 0..=255).
    fn random_weight8(rng: &mut Rng, n: usize, k: usize, g: usize, zeros: bool, act_order: bool) -> QuantMatrix {
        let mut w = random_weight(rng, n, k, g, zeros, act_order);
        w.bits = 8;
        w.codes.iter_mut().for_each(|c| *c = rng.below(256) as u8);
        if let Some(z) = w.zeros.as_mut() {
            z.iter_mut().for_each(|c| *c = rng.below(256) as u8);
        }
        w
    }

    #[test]
    fn int8_layout_is_a_bijection_and_f16_only() {
        let mut rng = Rng(9);
        for &(n, k, g) in &[(64, 128, 32), (192, 4160, 64), (256, 1040, 80), (128, 100, 100)] {
            for zeros in [false, true] {
                for act_order in [false, true] {
                    if act_order && g == k {
                        continue;
                    }
                    let w = random_weight8(&mut rng, n, k, g, zeros, act_order);
                    let packed = repack_int8(&w, DType::F16).unwrap();
                    assert_eq!(packed.plan.code_bits, 8);
                    assert_eq!(packed.words.len(), packed.plan.n_pad * packed.plan.k_pad / 4);
                    assert_eq!(
                        packed.unpack(),
                        w,
                        "n={n} k={k} g={g} zeros={zeros} act_order={act_order}"
                    );
                }
            }
        }
        let w = random_weight8(&mut rng, 64, 128, 32, true, false);
        assert!(matches!(repack_int8(&w, DType::Bf16), Err(Error::Unsupported(_))));
        assert!(repack_int8(&random_weight(&mut rng, 64, 128, 32, true, false), DType::F16).is_err());
    }

    /// The int8 layout read the way the GEMM's Converter reads it (kernel header, INT8 CODES): lane `l` of warp
    /// `w` reads 16 bytes at `w * 4096 + step * 512 + l * 16`; bytes `8t + 4h + e` of tile `t` are row
    /// `16t + g + 8 (e >> 1)`, k `16 step + 2 (l % 4) + (e & 1) + 8h`. Zero codes: byte `param_slot(c)`.
    #[test]
    fn int8_layout_is_what_the_gemm_reads() {
        let mut rng = Rng(10);
        let w = random_weight8(&mut rng, 512, 384, 64, true, false);
        let packed = repack_int8(&w, DType::F16).unwrap();
        let p = &packed.plan;
        let bytes: Vec<u8> = packed.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let unit_bytes = p.n_cta * K_TILE;
        for (u, unit) in bytes.chunks_exact(unit_bytes).enumerate() {
            let (nt, kt) = (u / p.k_tiles(), u % p.k_tiles());
            for (b, &code) in unit.iter().enumerate() {
                let (warp, step, lane, t, h, e) =
                    (b / 4096, (b / 512) % 8, (b / 16) % 32, (b / 8) % 2, (b / 4) % 2, b % 4);
                let n = nt * p.n_cta + warp * 32 + 16 * t + lane / 4 + 8 * (e >> 1);
                let k = kt * K_TILE + 16 * step + 2 * (lane % 4) + (e & 1) + 8 * h;
                assert_eq!(code, w.codes[n * w.k + k], "unit {u} byte {b}");
            }
        }
        let zeros = packed.zeros.as_ref().unwrap();
        for n in 0..w.n {
            for g in 0..w.groups() {
                let slot = ((n / p.n_cta) * p.group_rows + g) * p.n_cta + param_slot(n % p.n_cta);
                assert_eq!(zeros[slot], w.zero(n, g));
            }
        }
    }

    #[test]
    fn eight_bit_planes_are_a_bijection_and_read_x_twice() {
        let mut rng = Rng(8);
        for &(n, k, g) in &[(64, 128, 32), (192, 4160, 64), (256, 256, 256)] {
            for zeros in [false, true] {
                for act_order in [false, true] {
                    if act_order && g == k {
                        continue;
                    }
                    let w = random_weight8(&mut rng, n, k, g, zeros, act_order);
                    let packed = repack(&w, DType::F16).unwrap();
                    assert_eq!(
                        packed.unpack(),
                        w,
                        "n={n} k={k} g={g} zeros={zeros} act_order={act_order}"
                    );
                    assert_eq!((packed.plan.k, packed.plan.input_k), (2 * k, k));
                    // Every input column is read exactly twice (once per plane).
                    let mut reads = vec![0; k];
                    packed
                        .perm
                        .as_ref()
                        .unwrap()
                        .iter()
                        .for_each(|&c| reads[c as usize] += 1);
                    assert!(reads.iter().all(|&r| r == 2));
                }
            }
        }
    }

    #[test]
    fn repack_is_a_bijection() {
        let mut rng = Rng(7);
        for &(n, k, g) in &[
            (64, 128, 32),
            (192, 192, 64),
            (576, 384, 128),
            (256, 4160, 64),
            (128, 100, 100),
        ] {
            for zeros in [false, true] {
                for act_order in [false, true] {
                    if act_order && g == k {
                        continue;
                    }
                    for act in [DType::F16, DType::Bf16] {
                        let w = random_weight(&mut rng, n, k, g, zeros, act_order);
                        let packed = repack(&w, act).unwrap();
                        assert_eq!(
                            packed.unpack(),
                            w,
                            "n={n} k={k} g={g} zeros={zeros} act_order={act_order}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn padding_dequantizes_to_zero() {
        // N = 100 pads to 128 columns and K = 100 to 128: every padded code equals its zero or has scale 0.
        let mut rng = Rng(3);
        let w = random_weight(&mut rng, 100, 96, 32, true, false);
        let packed = repack(&w, DType::F16).unwrap();
        let p = &packed.plan;
        assert_eq!((p.n_pad, p.k_pad, p.group_rows), (128, 128, 4));
        // Group row 3 covers k 96..128: all padding, scale 0.
        for c in 0..p.n_cta {
            assert_eq!(packed.scales[3 * p.n_cta + c], 0);
        }
        // Columns 100.. of every row have scale 0.
        for r in 0..p.group_rows {
            for c in 100..p.n_cta {
                assert_eq!(packed.scales[r * p.n_cta + param_slot(c)], 0);
            }
        }
    }

    #[test]
    fn param_slots_group_a_lanes_rows() {
        // Lane group g = 3 of warp 1 reads slots 32 + 12..16: columns 32 + {3, 11, 19, 27}.
        let slots: Vec<usize> = [35, 43, 51, 59].into_iter().map(param_slot).collect();
        assert_eq!(slots, [44, 45, 46, 47]);
        // A permutation of every tile width.
        for n_cta in [64, 128, 256] {
            let mut seen: Vec<usize> = (0..n_cta).map(param_slot).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n_cta).collect::<Vec<_>>());
        }
    }

    #[test]
    fn word_holds_one_mma_fragment() {
        // Lane 5 (g = 1, t = 1), word 0: rows {1, 9}, k {2, 3, 10, 11} in nibbles [a0 a2 a4 a6 a1 a3 a5 a7].
        assert_eq!(fragment_element(5, 0, 0), (1, 2));
        assert_eq!(fragment_element(5, 0, 1), (1, 3));
        assert_eq!(fragment_element(5, 0, 2), (9, 2));
        assert_eq!(fragment_element(5, 0, 7), (9, 11));
        // Word 3: second 16-row tile, second k16 step.
        assert_eq!(fragment_element(5, 3, 0), (17, 18));
    }

    #[test]
    fn gathered_tiles_of_the_anchor_layers() {
        // 8192 x 28672: 896 slices, 7 warps, 256 CTAs on 132 SMs; the other anchor layers keep their tiles.
        assert_eq!(gathered_tile_warps(896, 64, Some(132)), Some(7));
        for slices in [128, 448, 848, 1024] {
            assert_eq!(gathered_tile_warps(slices, 64, Some(132)), None, "{slices} slices");
        }
        // Forced: any divisor that adds CTAs; too few k tiles for two splits of two units.
        assert_eq!(gathered_tile_warps(56, 8, None), Some(7));
        assert_eq!(gathered_tile_warps(60, 8, None), Some(6));
        assert_eq!(gathered_tile_warps(56, 3, None), None);
        // The layers of the GPU test `gathered_tiles` have 256-column tiles, and 1920 columns do not.
        for (n, k, slices) in [(1792, 1024, 56), (1536, 640, 48), (1790, 2048, 56)] {
            let p = Plan::new(n, k, 128, k / 128).unwrap();
            assert_eq!((p.n_cta, p.n_tiles() * 8), (256, slices), "{n} x {k}");
        }
        assert_eq!(Plan::new(1920, 640, 128, 5).unwrap().n_cta, 128);
    }

    #[test]
    fn plan_picks_tiles() {
        let p = Plan::new(28672, 8192, 128, 64).unwrap();
        assert_eq!(
            (p.n_cta, p.n_tiles(), p.k_tiles(), p.group, p.group_rows),
            (256, 112, 64, 128, 64)
        );
        assert_eq!(Plan::new(192, 128, 32, 4).unwrap().n_cta, 64);
        assert_eq!(Plan::new(576, 128, 32, 4).unwrap().n_cta, 64);
        assert_eq!(Plan::new(4224, 128, 32, 4).unwrap().n_cta, 128);
        // Per channel: one group spanning the padded K.
        let p = Plan::new(64, 4160, 4160, 1).unwrap();
        assert_eq!((p.k_pad, p.group, p.group_rows), (4224, 4224, 1));
        assert!(matches!(Plan::new(64, 128, 8, 16), Err(Error::Unsupported(_))));
    }

    /// Every launched variant compiles without register spills: all of them for Hopper, the cp.async ones (what
    /// older GPUs get) for sm_80 and sm_89 too (NVRTC only, no GPU needed). Prints registers per variant;
    /// `LOWBIT_DUMP_CUBIN=<dir>` also writes each CUBIN there (for `cuobjdump -sass`); `LOWBIT_VARIANTS=<text>`
    /// compiles only the variants whose `<name>_<arch>` contains it (seconds instead of minutes).
    #[test]
    fn kernel_variants_compile_without_spills() {
        if !crate::cuda::nvrtc_present() || crate::cuda::include_dir().is_none() {
            println!("skipped: NVRTC or cuda_fp16.h not found");
            return;
        }
        let mut cases = Vec::new();
        for act in [DType::F16, DType::Bf16] {
            for mt in [1, 2, 4, 8] {
                for (zeros, unit_groups, warps, ctas_per_sm) in [(true, true, 8, 2), (false, false, 2, 1)] {
                    let v = Variant::default_for(act, mt, zeros, unit_groups, warps, ctas_per_sm);
                    cases.push((v, "sm_90a"));
                    if act == DType::F16 {
                        // The int8 layout, at the depth `with_tuning` would give it (its stages are twice the bytes).
                        let mut v8 = Variant { wbits: 8, ..v };
                        v8.fit_stages(smem_limits((9, 0)));
                        cases.push((v8, "sm_90a"));
                    }
                    if ctas_per_sm == 2 && v.tma {
                        cases.push((Variant { receive: true, ..v }, "sm_90a")); // cluster split-K
                    }
                    if v.tma && mt <= 4 && warps % 4 == 0 {
                        // wgmma in place of mma.sync, and its int8 layout.
                        for wv in [
                            Variant { wgmma: !v.wgmma, ..v },
                            Variant {
                                wgmma: !v.wgmma,
                                receive: true,
                                ..v
                            },
                        ] {
                            cases.push((wv, "sm_90a"));
                            if act == DType::F16 {
                                let mut wv8 = Variant { wbits: 8, ..wv };
                                wv8.fit_stages(smem_limits((9, 0)));
                                cases.push((wv8, "sm_90a"));
                            }
                        }
                    }
                    if mt <= 2 && act == DType::F16 {
                        // Offsets (a 1x1 convolution's weight), int4 and int8, both pipelines.
                        let vo = v.with_offsets();
                        let mut vo8 = Variant { wbits: 8, ..vo };
                        vo8.fit_stages(smem_limits((9, 0)));
                        cases.extend([(vo, "sm_90a"), (vo8, "sm_90a"), (Variant { tma: false, ..vo }, "sm_80")]);
                        if v.tma {
                            cases.push((Variant { receive: true, ..vo }, "sm_90a"));
                        }
                    }
                    if v.can_fuse_activation() {
                        // The activation twins (with_fused_activation), and the cluster split-K one.
                        cases.push((Variant { activation: true, ..v }, "sm_90a"));
                        if v.tma {
                            cases.push((
                                Variant {
                                    activation: true,
                                    receive: true,
                                    ..v
                                },
                                "sm_90a",
                            ));
                        }
                    }
                    if mt == 1 || mt == 8 {
                        for arch in ["sm_80", "sm_89"] {
                            let vc = Variant { tma: false, ..v };
                            cases.push((vc, arch));
                            if vc.can_fuse_activation() {
                                cases.push((Variant { activation: true, ..vc }, arch));
                            }
                        }
                    }
                }
            }
        }
        // GATHERED TILES (8192 x 28672's 7 warps): f16 and bf16, with and without zeros, up to M = 16, both
        // splits in one CTA (the default) and as clusters of two CTAs, two per SM.
        for act in [DType::F16, DType::Bf16] {
            for mt in 1..=GATHER_MAX_MT {
                for zeros in [true, false] {
                    let mut v = Variant::default_for(act, mt, zeros, true, 7, 2);
                    v.receive = true;
                    v.gather = true;
                    cases.push((v, "sm_90a"));
                    cases.push((Variant { activation: true, ..v }, "sm_90a"));
                    let p = v.paired();
                    cases.push((p, "sm_90a"));
                    cases.push((Variant { activation: true, ..p }, "sm_90a"));
                }
            }
        }
        let only = std::env::var("LOWBIT_VARIANTS").ok();
        for (v, arch) in cases {
            if only
                .as_ref()
                .is_some_and(|only| !format!("{}_{arch}", v.name()).contains(only.as_str()))
            {
                continue;
            }
            let compiled = crate::cuda::compile(v.source(), arch).unwrap();
            for line in compiled.resource_lines().filter(|l| l.contains("registers")) {
                println!("{} {arch}: {}", v.name(), line.trim());
            }
            if let Ok(dir) = std::env::var("LOWBIT_DUMP_CUBIN") {
                std::fs::write(format!("{dir}/{}_{arch}.cubin", v.name()), &compiled.cubin).unwrap();
            }
            println!("{} {arch}: {} bytes of shared memory", v.name(), v.smem_bytes());
            let report: Vec<&str> = compiled.log.lines().filter(|l| l.contains("spill")).collect();
            assert!(
                report
                    .iter()
                    .all(|l| l.contains(" 0 bytes spill stores, 0 bytes spill loads")),
                "{} {arch}: {report:?}",
                v.name()
            );
            assert!(
                v.smem_bytes() <= 227 * 1024,
                "{}: {} bytes of shared memory",
                v.name(),
                v.smem_bytes()
            );
            // Nor a wgmma pipeline that ptxas serialised or had to add waits to.
            let serialised = compiled.wgmma_serialisation();
            assert!(serialised.is_empty(), "{}: {serialised:?}", v.name());
        }
    }

    #[test]
    fn uneven_act_order_is_rejected() {
        let mut rng = Rng(11);
        let mut w = random_weight(&mut rng, 64, 128, 32, true, true);
        let g = w.g_idx.as_mut().unwrap();
        let i = g.iter().position(|&x| x == 0).unwrap();
        g[i] = 1; // group 0 now has 31 members, group 1 has 33
        assert!(matches!(repack(&w, DType::F16), Err(Error::Unsupported(_))));
    }
}
