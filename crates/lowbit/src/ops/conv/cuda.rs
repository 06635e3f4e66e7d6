//! The per-block quantized convolution on a CUDA GPU: NCHW f16 or f32 input and output, int4/int8
//! [`BlockQuantWeight`]s (per-output-channel or per-input-channel-block scale and offset), bias, none/relu/relu6,
//! any kernel size, stride, padding, dilation and groups.
//!
//! ```no_run
//! # use lowbit::{cuda::CudaDevice, ops::conv::{cuda::Conv2dCuda, Conv2dParams}};
//! # fn main() -> lowbit::Result<()> {
//! # let w: lowbit::formats::block::BlockQuantWeight = unimplemented!();
//! let dev = CudaDevice::new(0)?;
//! let params = Conv2dParams { padding: (1, 1), ..Conv2dParams::default() };
//! let conv = Conv2dCuda::new(&dev, &w, None, params)?; // validates, repacks and uploads the weight once
//! let input = [8, 256, 56, 56];
//! let out = conv.output_shape(input)?;
//! let mut ws = dev.alloc_zeros::<u8>(conv.workspace_bytes(input)?.max(1))?;
//! # let x = dev.alloc_zeros::<half::f16>(input.iter().product())?;
//! let mut y = dev.alloc_zeros::<half::f16>(out.iter().product())?;
//! conv.run(dev.stream(), &x, input, &mut y, &mut ws)?; // no allocation, no sync: graph-capturable
//! # Ok(()) }
//! ```
//!
//! Two paths (kernel: `kernels/conv.cu`, whose header explains the layouts):
//! - **Implicit GEMM on the tensor cores** when the input channels per group are a multiple of 32 and the weight's
//!   blocks a multiple of 16 channels: the input is first copied to NHWC fp16 in the workspace (one small kernel;
//!   f32 input is rounded to f16 there), then `mma.sync` m16n8k16 with fp32 accumulation over tiles of output
//!   channels × output pixels (the whole batch), the int4/int8 codes converted to f16 weights in registers.
//!   [`repack`] lays the weight out once as the kernel reads it.
//! - **Direct**: one thread per output, f32 arithmetic, reading the NCHW input and the int8 codes directly; for
//!   every other shape (depthwise, 3 or 17 input channels, blocks of 8 channels ...).
//!
//! Numerics of the GEMM path: each weight is `fma(q, scale·2^e, offset·2^e)` rounded once to f16 (scale and offset
//! themselves rounded to f16 after the exact per-output-channel scaling by `2^e`, which keeps them in f16's normal
//! range for any weight magnitude), products and sums are f32, the sum is multiplied by `2^-e` (exact), the f32 bias
//! added, the clamp applied and the result rounded once to the output type. With f32 input the activations are
//! rounded to f16 (relative error ≤ 2^-11; values beyond ±65504 become ±inf), so an f32 convolution on this path is
//! about as accurate as an f16 one: a mean relative error around 1e-3 against the f64 reference (tested). The
//! direct path computes in f32 throughout.

use super::{check_bias, Conv2dParams, ConvGeometry};
use crate::cuda::checked_buffer as buffer;
use crate::cuda::{cuda_error, launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use crate::cuda::{DevicePtrMut, DeviceRepr, KernelSource, LaunchConfig};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use crate::formats::block::{BlockBits, BlockQuantWeight, BlockShape};
use cudarc::driver::PushKernelArg;
use half::f16;
use rayon::prelude::*;

mod gemv;
mod hopper;
mod linear_form;

/// `kernels/conv.cu`, listed in [`crate::cuda::KERNELS`].
pub const KERNEL: KernelSource = KernelSource {
    name: "conv",
    source: include_str!("../../../kernels/conv.cu"),
};

/// Output channels per panel (= per warp): four m16 tiles (`WM`).
const PANEL_ROWS: usize = 64;
/// k per K tile: 32 input channels of one tap (`KC`).
const K_TILE: usize = 32;
/// k16 mma steps per K tile.
const K16_STEPS: usize = K_TILE / 16;
/// Bytes of one pixel's 32 f16 channels in a stage (`B_ROW_BYTES`).
const PIXEL_BYTES: usize = K_TILE * 2;
/// Pipeline depth (`LB_CONV_STAGES`).
const STAGES: usize = 4;
/// Every dequantized weight of a row, scaled by the row's `2^e`, stays within this bound (f16 max is 65504).
const ROW_RANGE: f64 = 16384.0;
/// Threads per block of the pack and direct kernels.
const BLOCK: u32 = 256;

/// Bytes of one panel (codes, then the block parameters) for `bits`-bit codes (`Panel<BITS>::BYTES`).
fn panel_bytes(bits: BlockBits) -> usize {
    PANEL_ROWS * K_TILE * bits.bits() as usize / 8 + K16_STEPS * PANEL_ROWS * 4
}

/// A tile shape of the implicit-GEMM kernel: output channels × output pixels per CTA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tile {
    /// 128 × 128, four warps of 64 × 64.
    M128N128,
    /// 128 × 64, two warps of 64 × 64.
    M128N64,
    /// 64 × 128, two warps of 64 × 64.
    M64N128,
    /// 64 × 64, two warps of 64 × 32.
    M64N64,
}

impl Tile {
    /// Every tile the kernel source instantiates.
    pub const ALL: [Tile; 4] = [Tile::M128N128, Tile::M128N64, Tile::M64N128, Tile::M64N64];

    /// `(warps along M, warps along N, pixels per warp)`, as the kernel's template arguments.
    fn warps(self) -> (usize, usize, usize) {
        match self {
            Tile::M128N128 => (2, 2, 64),
            Tile::M128N64 => (2, 1, 64),
            Tile::M64N128 => (1, 2, 64),
            Tile::M64N64 => (1, 2, 32),
        }
    }

    /// Panels (64 output channels each) per CTA.
    fn panels(self) -> usize {
        self.warps().0
    }

    /// Output pixels per CTA.
    pub fn pixels(self) -> usize {
        let (_, warps_n, wn) = self.warps();
        warps_n * wn
    }

    /// Output channels per CTA.
    pub fn channels(self) -> usize {
        self.panels() * PANEL_ROWS
    }

    fn threads(self) -> usize {
        let (m, n, _) = self.warps();
        32 * m * n
    }

    /// Dynamic shared memory of one CTA (`Igemm::STAGE_BYTES * STAGES`).
    fn smem_bytes(self, bits: BlockBits) -> usize {
        STAGES * (self.panels() * panel_bytes(bits) + self.pixels() * PIXEL_BYTES)
    }

    /// Relative throughput of one SM running this tile at full occupancy (the larger tiles re-read less and
    /// spread the weight conversion over more mmas); used only to choose between tiles.
    fn efficiency(self) -> f64 {
        match self {
            Tile::M128N128 => 1.0,
            Tile::M128N64 | Tile::M64N128 => 0.85,
            Tile::M64N64 => 0.6,
        }
    }

    /// `128x128`, ... (bench labels).
    pub fn name(self) -> &'static str {
        match self {
            Tile::M128N128 => "128x128",
            Tile::M128N64 => "128x64",
            Tile::M64N128 => "64x128",
            Tile::M64N64 => "64x64",
        }
    }

    fn kernel_name(self, bits: BlockBits) -> String {
        let suffix = match self {
            Tile::M128N128 => "l",
            Tile::M128N64 => "t",
            Tile::M64N128 => "m",
            Tile::M64N64 => "s",
        };
        format!("conv_igemm_w{}_{suffix}", bits.bits())
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Host-side repack
// ------------------------------------------------------------------------------------------------------------------

/// A weight in the implicit-GEMM kernel's layout (host memory).
#[derive(Debug, Clone, PartialEq)]
pub struct RepackedConv {
    /// Panels `[groups][m_panels][k_tiles][panel bytes]`: codes in mma fragment order, then fp16
    /// `{scale·2^e, offset·2^e}` pairs (see the kernel header).
    pub bytes: Vec<u8>,
    /// `[Co]`: `2^-e` per output channel.
    pub row_scale: Vec<f32>,
    /// Panels of 64 output channels per group.
    pub m_panels: usize,
    /// K tiles per panel: `(Ci/groups / 32) · Kh · Kw`.
    pub k_tiles: usize,
}

/// Whether the implicit-GEMM kernel can take `shape`: 32-channel K tiles inside one group, and every k16 step
/// inside one block.
pub fn gemm_supported(shape: &BlockShape) -> bool {
    shape.channels % K_TILE == 0 && shape.block_channels % 16 == 0
}

/// The exponent `e` of a row whose blocks have `(scale, offset)` pairs `params`: the largest with every
/// `|q · scale + offset| · 2^e ≤ ROW_RANGE`, within ±100 (so `2^-e` is a normal f32).
fn row_exponent(params: impl Iterator<Item = (f32, f32)>, bits: BlockBits) -> i32 {
    let q_abs = -bits.q_min() as f64;
    let bound = params.fold(0f64, |m, (s, o)| m.max(s.abs() as f64 * q_abs + o.abs() as f64));
    if bound == 0.0 {
        return 0;
    }
    ((ROW_RANGE / bound).log2().floor() as i32).clamp(-100, 100)
}

/// Lays `w` (a convolution weight of `groups` groups) out as the implicit-GEMM kernel reads it. Fails unless
/// [`gemm_supported`].
pub fn repack(w: &BlockQuantWeight, groups: usize) -> Result<RepackedConv> {
    let shape = *w.shape();
    if !gemm_supported(&shape) || groups == 0 || shape.rows % groups != 0 {
        return Err(Error::Unsupported(format!(
            "CUDA implicit-GEMM convolution: {} input channels per group in blocks of {} over {groups} groups (needs \
             a multiple of 32 channels in blocks of a multiple of 16)",
            shape.channels, shape.block_channels
        )));
    }
    let (bits, taps, cg, blocks) = (w.bits(), shape.taps(), shape.channels, shape.blocks());
    let co_g = shape.rows / groups;
    let m_panels = co_g.div_ceil(PANEL_ROWS);
    let k_tiles = cg / K_TILE * taps;
    let panel = panel_bytes(bits);
    let code_bytes = PANEL_ROWS * K_TILE * bits.bits() as usize / 8;

    let exponents: Vec<i32> = (0..shape.rows)
        .map(|co| {
            let p = co * blocks..(co + 1) * blocks;
            row_exponent(
                w.scales()[p.clone()]
                    .iter()
                    .copied()
                    .zip(w.offsets()[p].iter().copied()),
                bits,
            )
        })
        .collect();
    let row_scale = exponents.iter().map(|&e| 2f32.powi(-e)).collect();

    let mut bytes = vec![0u8; groups * m_panels * k_tiles * panel];
    bytes.par_chunks_exact_mut(panel).enumerate().for_each(|(unit, out)| {
        let (kt, pm, g) = (unit % k_tiles, unit / k_tiles % m_panels, unit / (k_tiles * m_panels));
        let (chunk, tap) = (kt / taps, kt % taps);
        // The output channel of panel row `row`, if it exists.
        let channel = |row: usize| {
            let local = pm * PANEL_ROWS + row;
            (local < co_g).then_some(g * co_g + local)
        };
        // The biased code of (panel row, k of the tile): q + 8 / q + 128; padding rows hold code 0.
        let code = |row: usize, k: usize| -> u8 {
            let q = channel(row).map_or(0, |co| w.codes()[(co * cg + chunk * K_TILE + k) * taps + tap]) as i32;
            (q - bits.q_min()) as u8
        };
        for ks in 0..K16_STEPS {
            for lane in 0..32 {
                let (lg, lt) = (lane / 4, lane % 4);
                for j in 0..4 {
                    // Fragment element (row offset, k offset) of register r, element e: rows g / g+8 alternate
                    // by register (0, 2: row g; 1, 3: row g + 8), registers 2, 3 are 8 k further.
                    let at =
                        |reg: usize, e: usize| (16 * j + lg + 8 * (reg & 1), 16 * ks + 2 * lt + e + 8 * (reg >> 1));
                    match bits {
                        BlockBits::Int4 => {
                            // Nibble i: register i % 4, element i / 4 (the lop3 pairs (0,4) (1,5) (2,6) (3,7)).
                            let mut word = 0u32;
                            for i in 0..8 {
                                let (r, k) = at(i % 4, i / 4);
                                word |= u32::from(code(r, k)) << (4 * i);
                            }
                            let o = (ks * 32 + lane) * 16 + j * 4;
                            out[o..o + 4].copy_from_slice(&word.to_le_bytes());
                        }
                        BlockBits::Int8 => {
                            // Byte b: register b / 2 (word j's low u32 holds registers 0, 1), element b % 2.
                            let o = ks * 1024 + (j / 2) * 512 + lane * 16 + (j % 2) * 8;
                            for b in 0..8 {
                                let (r, k) = at(b / 2, b % 2);
                                out[o + b] = code(r, k);
                            }
                        }
                    }
                }
            }
            // Parameters of rows 16j + 8h + g at [ks][g][2j + h]: fp16 {scale, offset} scaled by the row's 2^e.
            let block = (chunk * K_TILE + ks * 16) / shape.block_channels;
            for lg in 0..8 {
                for r in 0..8 {
                    let row = 16 * (r / 2) + 8 * (r % 2) + lg;
                    let (s, o) = channel(row).map_or((0.0, 0.0), |co| {
                        let p = co * blocks + block;
                        let f = 2f64.powi(exponents[co]);
                        (w.scales()[p] as f64 * f, w.offsets()[p] as f64 * f)
                    });
                    let pair = u32::from(f16::from_f64(s).to_bits()) | u32::from(f16::from_f64(o).to_bits()) << 16;
                    let at = code_bytes + ks * PANEL_ROWS * 4 + lg * 32 + r * 4;
                    out[at..at + 4].copy_from_slice(&pair.to_le_bytes());
                }
            }
        }
    });
    Ok(RepackedConv {
        bytes,
        row_scale,
        m_panels,
        k_tiles,
    })
}

// ------------------------------------------------------------------------------------------------------------------
// Kernel arguments
// ------------------------------------------------------------------------------------------------------------------

/// `lowbit::conv::ConvShape` in the kernel, in field order: the geometry and clamp both kernels' arguments start with.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConvShape {
    batch: i32,
    ci: i32,
    h: i32,
    w: i32,
    co: i32,
    oh: i32,
    ow: i32,
    kh: i32,
    kw: i32,
    sh: i32,
    sw: i32,
    ph: i32,
    pw: i32,
    dh: i32,
    dw: i32,
    cg: i32,
    co_g: i32,
    lo: f32,
    hi: f32,
}

impl ConvShape {
    /// The kernels' view of `geo` with the clamp `[lo, hi]`, or the error naming the input when a dimension, a
    /// parameter or B·OH·OW does not fit the kernels' i32 fields.
    pub(crate) fn for_launch(geo: &ConvGeometry, bounds: (f32, f32)) -> Result<Self> {
        let [batch, _, oh, ow] = geo.output;
        let (pad, stride, dilation) = (geo.padding, geo.stride, geo.dilation);
        let params = [pad.0, pad.1, stride.0, stride.1, dilation.0, dilation.1];
        if geo
            .input
            .iter()
            .chain(&geo.output)
            .chain(&params)
            .chain(&[batch * oh * ow])
            .any(|&v| v > i32::MAX as usize)
        {
            return Err(Error::invalid(
                "input",
                format!("shape {:?}", geo.input),
                "dimensions, parameters and B·OH·OW must fit in i32 for the CUDA kernels",
            ));
        }
        Ok(Self::new(geo, bounds))
    }

    /// The kernels' view of `geo` (every value checked to fit in i32) with the clamp `[lo, hi]`.
    fn new(geo: &ConvGeometry, (lo, hi): (f32, f32)) -> Self {
        let [batch, ci, h, w] = geo.input;
        let [_, co, oh, ow] = geo.output;
        let i = |v: usize| v as i32;
        Self {
            batch: i(batch),
            ci: i(ci),
            h: i(h),
            w: i(w),
            co: i(co),
            oh: i(oh),
            ow: i(ow),
            kh: i(geo.kernel.0),
            kw: i(geo.kernel.1),
            sh: i(geo.stride.0),
            sw: i(geo.stride.1),
            ph: i(geo.padding.0),
            pw: i(geo.padding.1),
            dh: i(geo.dilation.0),
            dw: i(geo.dilation.1),
            cg: i(geo.channels_per_group()),
            co_g: i(geo.out_channels_per_group()),
            lo,
            hi,
        }
    }
}

/// `lowbit::conv::IgemmArgs` in the kernel (a `ConvShape`, then 5 pointers, then 4-byte fields).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct IgemmArgs {
    shape: ConvShape,
    weight: u64,
    row_scale: u64,
    bias: u64,
    x: u64,
    out: u64,
    m_panels: i32,
    k_tiles: i32,
    n_total: i32,
    out_f32: i32,
    pair_store: i32,
}

/// `lowbit::conv::DirectArgs` in the kernel (a `ConvShape`, then 5 pointers, then the weight's blocks).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DirectArgs {
    shape: ConvShape,
    codes: u64,
    params: u64,
    bias: u64,
    x: u64,
    out: u64,
    blocks: i32,
    block_channels: i32,
}

// The kernel's structs (C++ layout: the ConvShape base first, 76 bytes, then the pointers from byte 80).
const _: () = assert!(std::mem::size_of::<ConvShape>() == 76);
const _: () = assert!(std::mem::offset_of!(IgemmArgs, weight) == 80 && std::mem::size_of::<IgemmArgs>() == 144);
const _: () = assert!(std::mem::offset_of!(DirectArgs, codes) == 80 && std::mem::size_of::<DirectArgs>() == 128);

// SAFETY: plain-old-data `#[repr(C)]` structs laid out like their CUDA counterparts (u64 pointers, i32, f32).
unsafe impl DeviceRepr for IgemmArgs {}
unsafe impl DeviceRepr for DirectArgs {}

// ------------------------------------------------------------------------------------------------------------------
// The operator
// ------------------------------------------------------------------------------------------------------------------

/// Overrides for benchmarking and testing ([`Conv2dCuda::with_tuning`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    /// Always use this tile (implicit-GEMM path only).
    pub tile: Option<Tile>,
    /// Use the direct kernel even where the implicit GEMM applies.
    pub direct: bool,
    /// Use the mma.sync implicit GEMM (or the direct kernel) even where the Hopper wgmma path or the decode route
    /// of 1×1 convolutions applies.
    pub no_hopper: bool,
    /// Leave 1×1 convolutions of 1×1 maps on the Hopper GEMM (or the older kernels), not the decode kernel.
    pub no_gemv: bool,
}

/// One loaded implicit-GEMM kernel.
#[derive(Debug)]
struct TileKernel {
    tile: Tile,
    function: CudaFunction,
    /// Resident CTAs per SM (occupancy query).
    ctas_per_sm: usize,
}

#[derive(Debug)]
enum Path {
    Gemm {
        weight: CudaSlice<u8>,
        row_scale: CudaSlice<f32>,
        m_panels: usize,
        k_tiles: usize,
        kernels: Vec<TileKernel>,
        pack_f16: CudaFunction,
        pack_f32: CudaFunction,
    },
    Direct {
        codes: CudaSlice<i8>,
        /// `[Co, blocks]` `{scale, offset}` pairs.
        params: CudaSlice<f32>,
        f16: CudaFunction,
        f32: CudaFunction,
    },
}

/// A quantized convolution prepared on one GPU: the weight repacked and uploaded, the kernels loaded.
#[derive(Debug)]
pub struct Conv2dCuda {
    shape: BlockShape,
    bits: BlockBits,
    params: Conv2dParams,
    bias: CudaSlice<f32>,
    path: Path,
    /// The weight as a linear layer in fp16, where the linear kernels can run it (`linear_form.rs`).
    linear: Option<linear_form::LinearForm>,
    /// The wgmma path for f16 inputs, where it applies (`hopper::applies`).
    hopper: Option<hopper::HopperConv>,
    /// The decode-kernel route for 1×1 convolutions of 1×1 maps at small batches (`gemv::applies`), f16 inputs.
    gemv: Option<gemv::GemvConv>,
    sm_count: usize,
    tuning: Tuning,
}

impl Conv2dCuda {
    /// Validates `weight` (`[Co, Ci/groups, Kh, Kw]`), `bias` (`[Co]`, finite) and `params`, repacks and uploads the
    /// weight once and loads the kernels (compiled by NVRTC on first use, then cached).
    pub fn new(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        params: Conv2dParams,
    ) -> Result<Self> {
        Self::with_tuning(device, weight, bias, params, Tuning::default())
    }

    /// As [`Conv2dCuda::new`] with the kernel choice forced (benchmarks and tests).
    #[doc(hidden)]
    pub fn with_tuning(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        params: Conv2dParams,
        tuning: Tuning,
    ) -> Result<Self> {
        let shape = *weight.shape();
        params.validate(shape.rows)?;
        check_bias(bias, shape.rows)?;
        let fits_i32 = |v: usize| v <= i32::MAX as usize;
        if ![
            shape.rows,
            shape.channels,
            shape.kernel.0,
            shape.kernel.1,
            shape.rows * shape.cols(),
        ]
        .into_iter()
        .all(fits_i32)
        {
            return Err(Error::invalid(
                "weight",
                format!(
                    "shape [{}, {}, {}, {}]",
                    shape.rows, shape.channels, shape.kernel.0, shape.kernel.1
                ),
                "dimensions and element count must fit in i32 for the CUDA kernels",
            ));
        }
        let upload_err = |e| cuda_error("upload of the convolution weight", e);
        let stream = device.stream();
        let bias_host = bias.map_or_else(|| vec![0.0; shape.rows], <[f32]>::to_vec);
        let bias = stream.clone_htod(&bias_host).map_err(upload_err)?;
        // A forced tile or path selects the older kernels (tests and benchmarks compare them).
        let forced = tuning.direct || tuning.no_hopper || tuning.tile.is_some();
        let use_hopper = !forced && hopper::applies(device, weight, params.groups, params.stride);
        let use_gemv = !forced
            && !tuning.no_gemv
            && gemv::applies(shape.kernel, &params)
            && device.info().compute_capability.0 >= 8;
        let linear = if use_hopper || use_gemv {
            linear_form::LinearForm::new(device, weight, &bias_host)?
        } else {
            None
        };
        let hopper = match &linear {
            Some(form) if use_hopper => hopper::HopperConv::new(device, form)?,
            _ => None,
        };
        let gemv = match &linear {
            Some(form) if use_gemv => Some(gemv::GemvConv::new(device, form)?),
            _ => None,
        };
        let path = if gemm_supported(&shape) && !tuning.direct {
            let packed = repack(weight, params.groups)?;
            let mut kernels = Vec::new();
            for tile in Tile::ALL {
                let name = tile.kernel_name(weight.bits());
                let smem = tile.smem_bytes(weight.bits());
                let function = device.function_with_shared_memory(&KERNEL, &name, smem)?;
                let ctas_per_sm = function
                    .occupancy_max_active_blocks_per_multiprocessor(tile.threads() as u32, smem, None)
                    .map_err(|e| cuda_error(format!("occupancy of {name}"), e))?;
                if ctas_per_sm == 0 {
                    // This GPU cannot hold the tile (shared memory): leave it out.
                    continue;
                }
                kernels.push(TileKernel {
                    tile,
                    function,
                    ctas_per_sm: ctas_per_sm as usize,
                });
            }
            if kernels.is_empty() {
                return Err(Error::Unsupported(
                    "CUDA convolution: no implicit-GEMM tile fits this GPU's shared memory".into(),
                ));
            }
            Path::Gemm {
                weight: stream.clone_htod(&packed.bytes).map_err(upload_err)?,
                row_scale: stream.clone_htod(&packed.row_scale).map_err(upload_err)?,
                m_panels: packed.m_panels,
                k_tiles: packed.k_tiles,
                kernels,
                pack_f16: device.function(&KERNEL, "conv_pack_nhwc_f16")?,
                pack_f32: device.function(&KERNEL, "conv_pack_nhwc_f32")?,
            }
        } else {
            let pairs: Vec<f32> = weight
                .scales()
                .iter()
                .zip(weight.offsets())
                .flat_map(|(&s, &o)| [s, o])
                .collect();
            Path::Direct {
                codes: stream.clone_htod(weight.codes()).map_err(upload_err)?,
                params: stream.clone_htod(&pairs).map_err(upload_err)?,
                f16: device.function(&KERNEL, "conv_direct_f16")?,
                f32: device.function(&KERNEL, "conv_direct_f32")?,
            }
        };
        Ok(Self {
            shape,
            bits: weight.bits(),
            params,
            bias,
            path,
            linear,
            hopper,
            gemv,
            sm_count: device.info().sm_count.max(1) as usize,
            tuning,
        })
    }

    /// The output shape `[B, Co, OH, OW]` for an input of shape `[B, Ci, H, W]`, or why there is none.
    pub fn output_shape(&self, input: [usize; 4]) -> Result<[usize; 4]> {
        Ok(ConvGeometry::new(input, &self.shape, &self.params)?.output)
    }

    /// Whether this convolution runs on the tensor cores (implicit GEMM) rather than the direct kernel.
    pub fn uses_tensor_cores(&self) -> bool {
        self.hopper.is_some() || matches!(self.path, Path::Gemm { .. })
    }

    /// Whether f16 inputs of shape `input` run on the decode (GEMV) kernel: a 1×1, unit-stride, unpadded,
    /// ungrouped convolution over a 1×1 map at a batch of at most 16 (`gemv.rs`).
    pub fn uses_gemv(&self, input: [usize; 4]) -> Result<bool> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params)?;
        Ok(self.gemv_for(&geo).is_some())
    }

    /// The decode-kernel route, when it takes a convolution of geometry `geo` (f16 inputs).
    fn gemv_for(&self, geo: &ConvGeometry) -> Option<&gemv::GemvConv> {
        self.gemv.as_ref().filter(|_| gemv::GemvConv::takes(geo))
    }

    /// Whether f16 inputs run on the Hopper wgmma path (sm_90, int4, one group, stride 1, `Ci % 64 == 0`; see
    /// `hopper.rs`). f32 inputs always take the mma.sync or direct kernel.
    pub fn uses_hopper(&self) -> bool {
        self.hopper.is_some()
    }

    /// Diagnostics: on the Hopper path, later runs write the GEMM's CTA timelines to the device buffer at `address`
    /// ([`crate::ops::linear::cuda::gemm::LinearW4A16Gemm::set_trace`]); 0 turns tracing off.
    #[doc(hidden)]
    pub fn set_trace(&mut self, address: u64) {
        if let Some(hopper) = &mut self.hopper {
            hopper.set_trace(address);
        }
    }

    /// Device scratch [`Conv2dCuda::run`] needs for inputs of shape `input` (the NHWC f16 copy of the input on the
    /// implicit-GEMM path, 256-byte rounded; 0 on the direct path).
    pub fn workspace_bytes(&self, input: [usize; 4]) -> Result<usize> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params)?;
        let own = match self.path {
            Path::Gemm { .. } => (input.iter().product::<usize>() * 2).next_multiple_of(256),
            Path::Direct { .. } => 0,
        };
        let hopper = self.hopper.as_ref().map_or(0, |h| h.workspace_bytes(&geo));
        let gemv = self.gemv_for(&geo).map_or(0, gemv::GemvConv::workspace_bytes);
        Ok(own.max(hopper).max(gemv))
    }

    /// The tile the implicit-GEMM kernel uses for `input` (`None` on the direct path).
    pub fn tile_for(&self, input: [usize; 4]) -> Result<Option<Tile>> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params)?;
        Ok(match &self.path {
            Path::Gemm { kernels, m_panels, .. } => Some(
                self.choose_tile(kernels, *m_panels, geo.output[0] * geo.out_pixels(), geo.groups)
                    .tile,
            ),
            Path::Direct { .. } => None,
        })
    }

    /// The tile with the least estimated time: per SM, the CTAs it gets times the work of one, at the throughput
    /// of the CTAs it runs together (an SM is taken as saturated from 8 resident warps).
    fn choose_tile<'a>(
        &self,
        kernels: &'a [TileKernel],
        m_panels: usize,
        pixels: usize,
        groups: usize,
    ) -> &'a TileKernel {
        if let Some(k) = self.tuning.tile.and_then(|t| kernels.iter().find(|k| k.tile == t)) {
            return k;
        }
        let cost = |k: &TileKernel| {
            let ctas = pixels.div_ceil(k.tile.pixels()) * m_panels.div_ceil(k.tile.panels()) * groups;
            let per_sm = ctas.div_ceil(self.sm_count);
            let resident_warps = per_sm.min(k.ctas_per_sm) * k.tile.threads() / 32;
            let rate = k.tile.efficiency() * (resident_warps as f64 / 8.0).min(1.0);
            (per_sm * k.tile.channels() * k.tile.pixels()) as f64 / rate
        };
        kernels
            .iter()
            .min_by(|a, b| cost(a).total_cmp(&cost(b)))
            .expect("at least one tile is loaded")
    }

    /// Convolves `x` (NCHW, shape `input`, f16 or f32) into `y` (NCHW, [`Conv2dCuda::output_shape`], same type) on
    /// `stream`. Checks dtypes, shapes and buffer sizes on the host, then launches without allocating or
    /// synchronising (graph-capturable). `workspace` must hold [`Conv2dCuda::workspace_bytes`] and be 256-byte
    /// aligned; `run` calls sharing a workspace must be ordered.
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        input: [usize; 4],
        y: &mut dyn DevicePtrMut<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        if !matches!(T::DTYPE, DType::F16 | DType::F32) {
            return Err(Error::invalid("x", T::DTYPE, "dtype must be f16 or f32"));
        }
        let geo = ConvGeometry::new(input, &self.shape, &self.params)?;
        let shape = ConvShape::for_launch(&geo, self.params.activation.bounds())?;
        let [batch, ci, h, w] = input;
        let [_, co, oh, ow] = geo.output;
        let pixels = batch * oh * ow;
        let x_ptr = buffer(x.device_ptr(stream).0, x.len(), input.iter().product(), "x", 1)?;
        let y_len = y.len();
        let y_ptr = buffer(y.device_ptr_mut(stream).0, y_len, geo.output.iter().product(), "y", 1)?;
        let bias = self.bias.device_ptr(stream).0;
        let s = &geo;
        let ws_len = workspace.len();
        let ws = buffer(
            workspace.device_ptr_mut(stream).0,
            ws_len,
            self.workspace_bytes(input)?,
            "workspace",
            256,
        )?;
        if let (Some(linear), DType::F16) = (&self.linear, T::DTYPE) {
            let buffers = (x_ptr, y_ptr, ws, linear.bias.device_ptr(stream).0);
            if let Some(gemv) = self.gemv_for(&geo) {
                return gemv.run(stream, &geo, self.params.activation, buffers);
            }
            if let Some(hopper) = &self.hopper {
                return hopper.run(stream, &geo, self.params.activation, buffers);
            }
        }
        match &self.path {
            Path::Gemm {
                weight,
                row_scale,
                m_panels,
                k_tiles,
                kernels,
                pack_f16,
                pack_f32,
            } => {
                // NCHW -> NHWC f16 into the workspace.
                let hw = h * w;
                let pack_grid = (hw.div_ceil(64), ci.div_ceil(64), batch);
                let kernel = self.choose_tile(kernels, *m_panels, pixels, s.groups);
                let tile = kernel.tile;
                let grid = (
                    pixels.div_ceil(tile.pixels()),
                    m_panels.div_ceil(tile.panels()),
                    s.groups,
                );
                if pack_grid.1 > 65535
                    || pack_grid.2 > 65535
                    || grid.1 > 65535
                    || grid.2 > 65535
                    || hw > i32::MAX as usize
                {
                    return Err(Error::invalid(
                        "input",
                        format!("shape {input:?}"),
                        "too large for one launch (batch, channel tiles or groups beyond 65535)",
                    ));
                }
                let (c_arg, h_arg, w_arg, no_padding) = (ci as i32, h as i32, w as i32, 0i32);
                let pack = if T::DTYPE == DType::F16 { pack_f16 } else { pack_f32 };
                let mut b = stream.launch_builder(pack);
                b.arg(&x_ptr)
                    .arg(&ws)
                    .arg(&c_arg)
                    .arg(&h_arg)
                    .arg(&w_arg)
                    .arg(&no_padding)
                    .arg(&no_padding);
                let cfg = LaunchConfig {
                    grid_dim: (pack_grid.0 as u32, pack_grid.1 as u32, pack_grid.2 as u32),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: reads the B·Ci·H·W elements of x (checked above) and writes as many f16 at the start of
                // the workspace, which holds at least that many bytes times two (checked above).
                unsafe { b.launch(cfg) }.map_err(launch_error("conv_pack_nhwc"))?;

                // Pixel pairs go out as one 4/8-byte store when they stay inside an image and are aligned.
                let elem = T::DTYPE.size() as u64;
                let pair_store = (oh * ow) % 2 == 0 && y_ptr % (2 * elem) == 0;
                let args = IgemmArgs {
                    shape,
                    weight: weight.device_ptr(stream).0,
                    row_scale: row_scale.device_ptr(stream).0,
                    bias,
                    x: ws,
                    out: y_ptr,
                    m_panels: *m_panels as i32,
                    k_tiles: *k_tiles as i32,
                    n_total: pixels as i32,
                    out_f32: i32::from(T::DTYPE == DType::F32),
                    pair_store: i32::from(pair_store),
                };
                let cfg = LaunchConfig {
                    grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
                    block_dim: (tile.threads() as u32, 1, 1),
                    shared_mem_bytes: tile.smem_bytes(self.bits) as u32,
                };
                let mut b = stream.launch_builder(&kernel.function);
                b.arg(&args);
                // SAFETY: the kernel reads the NHWC copy (B·H·W·Ci f16, written above), the operator's own weight
                // panels (groups·m_panels·k_tiles of them), row scales and bias ([Co]), and writes B·Co·OH·OW
                // elements of y (checked above); every pixel and channel index is bounded by the arguments.
                unsafe { b.launch(cfg) }.map_err(launch_error("conv_igemm"))?;
            }
            Path::Direct {
                codes,
                params,
                f16,
                f32,
            } => {
                let total = (batch * co * oh * ow) as u64;
                let blocks = total.div_ceil(BLOCK as u64);
                if blocks > i32::MAX as u64 {
                    return Err(Error::invalid(
                        "input",
                        format!("shape {input:?}"),
                        "too large for one launch",
                    ));
                }
                let args = DirectArgs {
                    shape,
                    codes: codes.device_ptr(stream).0,
                    params: params.device_ptr(stream).0,
                    bias,
                    x: x_ptr,
                    out: y_ptr,
                    blocks: self.shape.blocks() as i32,
                    block_channels: self.shape.block_channels as i32,
                };
                let function = if T::DTYPE == DType::F16 { f16 } else { f32 };
                let mut b = stream.launch_builder(function);
                b.arg(&args);
                let cfg = LaunchConfig {
                    grid_dim: (blocks.max(1) as u32, 1, 1),
                    block_dim: (BLOCK, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: one thread per output element of y (checked above); each reads in-bounds taps of x
                // (checked length), its row of codes ([Co, Ci/groups, Kh, Kw]) and parameters ([Co, blocks]).
                unsafe { b.launch(cfg) }.map_err(launch_error("conv_direct"))?;
            }
        }
        Ok(())
    }
}

/// cuDNN's forward algorithms (the baseline's candidates, see [`CudnnConv`]).
pub use cudarc::cudnn::sys::cudnnConvolutionFwdAlgo_t as CudnnAlgo;

/// Whether libcudnn can be loaded (it is not shipped with lowbit; on the device machine it is in PyTorch's install).
pub fn cudnn_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::cudnn::sys::is_culib_present() }
}

/// A dense f16 convolution through cuDNN (NCHW, fp32 accumulation, tensor-op math): the baseline the quantized
/// kernel is measured against (`lowbit bench --op conv`), and what a model runs with unquantized weights. cuDNN
/// adds no bias or activation here. cudarc panics if a cuDNN symbol is missing; check [`cudnn_present`] first.
pub struct CudnnConv {
    conv: cudarc::cudnn::ConvDescriptor<f32>,
    x: cudarc::cudnn::TensorDescriptor<f16>,
    y: cudarc::cudnn::TensorDescriptor<f16>,
    w: cudarc::cudnn::FilterDescriptor<f16>,
    input: [usize; 4],
    output: [usize; 4],
    weight: [usize; 4],
}

impl CudnnConv {
    /// Every forward algorithm, for [`CudnnConv::workspace_bytes`] to accept or refuse.
    pub const ALGORITHMS: [CudnnAlgo; 8] = [
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        CudnnAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
    ];

    /// A cuDNN handle on `stream` and the descriptors of the convolution of an f16 input of shape `input` with a
    /// dense f16 weight of `shape`'s geometry under `params` (whose activation must be none).
    pub fn new(
        stream: std::sync::Arc<CudaStream>,
        input: [usize; 4],
        shape: &BlockShape,
        params: &Conv2dParams,
    ) -> Result<Self> {
        use cudarc::cudnn::sys::{cudnnConvolutionMode_t, cudnnMathType_t, cudnnTensorFormat_t};
        if !cudnn_present() {
            return Err(Error::CudaUnavailable("libcudnn not found on the library path".into()));
        }
        if params.activation != super::Activation::None {
            return Err(Error::invalid(
                "activation",
                format!("{:?}", params.activation),
                "the cuDNN baseline has none",
            ));
        }
        let geo = ConvGeometry::new(input, shape, params)?;
        let dims = |d: [usize; 4]| -> Result<[i32; 4]> {
            d.iter()
                .all(|&v| v <= i32::MAX as usize)
                .then(|| d.map(|v| v as i32))
                .ok_or_else(|| {
                    Error::invalid(
                        "input",
                        format!("shape {input:?}"),
                        "dimensions must fit in i32 for cuDNN",
                    )
                })
        };
        let weight = [shape.rows, shape.channels, shape.kernel.0, shape.kernel.1];
        let handle = cudarc::cudnn::Cudnn::new(stream).map_err(cudnn_error("cudnnCreate"))?;
        let nchw = cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let x = handle
            .create_4d_tensor::<f16>(nchw, dims(input)?)
            .map_err(cudnn_error("x descriptor"))?;
        let y = handle
            .create_4d_tensor::<f16>(nchw, dims(geo.output)?)
            .map_err(cudnn_error("y descriptor"))?;
        let w = handle
            .create_4d_filter::<f16>(nchw, dims(weight)?)
            .map_err(cudnn_error("filter descriptor"))?;
        let pair = |p: (usize, usize)| [p.0 as i32, p.1 as i32];
        let mut conv = handle
            .create_conv2d::<f32>(
                pair(geo.padding),
                pair(geo.stride),
                pair(geo.dilation),
                cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            )
            .map_err(cudnn_error("convolution descriptor"))?;
        conv.set_math_type(cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
            .map_err(cudnn_error("cudnnSetConvolutionMathType"))?;
        conv.set_group_count(geo.groups as i32)
            .map_err(cudnn_error("cudnnSetConvolutionGroupCount"))?;
        Ok(Self {
            conv,
            x,
            y,
            w,
            input,
            output: geo.output,
            weight,
        })
    }

    fn forward(&self) -> cudarc::cudnn::ConvForward<'_, f16, f32, f16> {
        cudarc::cudnn::ConvForward {
            conv: &self.conv,
            x: &self.x,
            w: &self.w,
            y: &self.y,
        }
    }

    /// The workspace `algo` needs, or `None` where cuDNN does not support it for this problem.
    pub fn workspace_bytes(&self, algo: CudnnAlgo) -> Option<usize> {
        self.forward().get_workspace_size(algo).ok()
    }

    /// `y = conv(x, w)` with `algo` on the handle's stream; `workspace` must hold [`CudnnConv::workspace_bytes`].
    pub fn run(
        &self,
        algo: CudnnAlgo,
        x: &CudaSlice<f16>,
        w: &CudaSlice<f16>,
        y: &mut CudaSlice<f16>,
        workspace: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let count = |d: [usize; 4]| d.iter().product::<usize>();
        buffer(0, x.len(), count(self.input), "x", 1)?;
        buffer(0, w.len(), count(self.weight), "w", 1)?;
        buffer(0, y.len(), count(self.output), "y", 1)?;
        let need = self
            .workspace_bytes(algo)
            .ok_or_else(|| Error::Unsupported(format!("cuDNN algorithm {algo:?} for this convolution")))?;
        buffer(0, workspace.len(), need, "workspace", 1)?;
        let (one, zero) = (f16::ONE, f16::ZERO);
        // SAFETY: x, w and y are f16 buffers at least as long as their descriptors say (checked above), and the
        // workspace holds what the algorithm asked for.
        unsafe { self.forward().launch(algo, Some(workspace), (one, zero), x, w, y) }
            .map_err(cudnn_error("cudnnConvolutionForward"))
    }
}

fn cudnn_error(context: &'static str) -> impl Fn(cudarc::cudnn::CudnnError) -> Error {
    move |e| Error::Cuda {
        context: context.into(),
        message: format!("{e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::SplitMix64;

    /// Decodes a repacked weight the way the kernel does -- register r of an A fragment takes nibbles (r, r + 4)
    /// of its word (int4, the lop3 masks) or bytes (2r, 2r + 1) of its 8 bytes (int8, the prmt selectors); the
    /// low half is element 0; rows g / g + 8 take parameter pair 2j / 2j + 1 -- into the dense weight
    /// `[Co, Cg, taps]` it represents, each value `f16(q · s' + o') · 2^-e` as the kernel's fp16 fma computes it.
    fn decode(p: &RepackedConv, bits: BlockBits, shape: &BlockShape, groups: usize) -> Vec<f64> {
        let (taps, cg) = (shape.taps(), shape.channels);
        let co_g = shape.rows / groups;
        let panel = panel_bytes(bits);
        let code_bytes = PANEL_ROWS * K_TILE * bits.bits() as usize / 8;
        let half = |b: &[u8], at: usize| f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f64();
        let mut dense = vec![f64::NAN; shape.rows * shape.cols()];
        for (unit, bytes) in p.bytes.chunks_exact(panel).enumerate() {
            let (kt, pm, g) = (
                unit % p.k_tiles,
                unit / p.k_tiles % p.m_panels,
                unit / (p.k_tiles * p.m_panels),
            );
            let (chunk, tap) = (kt / taps, kt % taps);
            for ks in 0..K16_STEPS {
                for lane in 0..32 {
                    for j in 0..4 {
                        for reg in 0..4 {
                            for e in 0..2 {
                                let q = match bits {
                                    BlockBits::Int4 => {
                                        let o = (ks * 32 + lane) * 16 + j * 4;
                                        let word = u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
                                        ((word >> (4 * (reg + 4 * e))) & 15) as f64 - 8.0
                                    }
                                    BlockBits::Int8 => {
                                        let o = ks * 1024 + (j / 2) * 512 + lane * 16 + (j % 2) * 8;
                                        bytes[o + 2 * reg + e] as f64 - 128.0
                                    }
                                };
                                // PTX m16n8k16 A fragment: row g + 8 (reg & 1), column 2t + e + 8 (reg >> 1).
                                let row = 16 * j + lane / 4 + 8 * (reg & 1);
                                let k = 16 * ks + 2 * (lane % 4) + e + 8 * (reg >> 1);
                                let local = pm * PANEL_ROWS + row;
                                let at = code_bytes + ks * PANEL_ROWS * 4 + (lane / 4) * 32 + (2 * j + (reg & 1)) * 4;
                                let (s, o) = (half(bytes, at), half(bytes, at + 2));
                                let w = f16::from_f64(q * s + o).to_f64();
                                if local >= co_g {
                                    assert_eq!(w, 0.0, "padding row {local} must be zero");
                                    continue;
                                }
                                let co = g * co_g + local;
                                let ci = chunk * K_TILE + k;
                                dense[(co * cg + ci) * taps + tap] = w * p.row_scale[co] as f64;
                            }
                        }
                    }
                }
            }
        }
        dense
    }

    fn weight(
        rng: &mut SplitMix64,
        shape: BlockShape,
        bits: BlockBits,
        exact: bool,
        magnitude: f32,
    ) -> BlockQuantWeight {
        if exact {
            let codes = (0..shape.rows * shape.cols())
                .map(|_| rng.int(bits.q_min(), bits.q_max()) as i8)
                .collect();
            let n = shape.rows * shape.blocks();
            let scales = (0..n).map(|_| rng.pick(&[0.25, 0.5, 1.0, 2.0])).collect();
            let offsets = (0..n).map(|_| rng.int(-8, 8) as f32 * 0.5).collect();
            BlockQuantWeight::from_parts(shape, bits, codes, scales, offsets).unwrap()
        } else {
            let dense = rng.vec(shape.rows * shape.cols(), -magnitude, magnitude);
            BlockQuantWeight::quantize(&dense, shape, bits).unwrap()
        }
    }

    #[test]
    fn repacked_panels_decode_to_the_weight() {
        let mut rng = SplitMix64(0xC0_4E);
        // (Co, Cg, kernel, blocks, groups): partial panels, several chunks and taps, blocks of 16 channels.
        let cases = [
            (40, 32, (1, 1), 1, 1),
            (130, 64, (3, 3), 4, 1),
            (96, 32, (1, 3), 2, 2),
            (64, 96, (2, 1), 3, 1),
        ];
        for (co, cg, kernel, blocks, groups) in cases {
            for bits in [BlockBits::Int4, BlockBits::Int8] {
                let shape = BlockShape::conv(co, cg, kernel, blocks).unwrap();
                // Exact mode: every weight is exact in f16, so decoding must give it back bit for bit.
                let w = weight(&mut rng, shape, bits, true, 0.0);
                let got = decode(&repack(&w, groups).unwrap(), bits, &shape, groups);
                let want = w.dequantize();
                for (i, (&g, &d)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, d as f64, "{co}x{cg} {kernel:?} {bits:?}: element {i}");
                }
                // Tiny and huge magnitudes: the per-row 2^e keeps them in f16's normal range, so the relative
                // error stays at the f16 rounding of q · s' + o' (2^-11 of the row's largest |w|).
                for magnitude in [1e-6f32, 0.5, 3e5] {
                    let w = weight(&mut rng, shape, bits, false, magnitude);
                    let got = decode(&repack(&w, groups).unwrap(), bits, &shape, groups);
                    let want = w.dequantize();
                    let cols = shape.cols();
                    for (r, (g_row, w_row)) in got.chunks(cols).zip(want.chunks(cols)).enumerate() {
                        let max = w_row.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
                        for (&g, &d) in g_row.iter().zip(w_row) {
                            assert!(
                                (g - d as f64).abs() <= max * 2f64.powi(-10),
                                "magnitude {magnitude} row {r}: {g} vs {d}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unsupported_channel_counts_are_named() {
        let shape = BlockShape::conv(8, 17, (3, 3), 1).unwrap();
        let w = BlockQuantWeight::quantize(&vec![0.5; 8 * 17 * 9], shape, BlockBits::Int8).unwrap();
        assert!(!gemm_supported(&shape));
        assert!(matches!(repack(&w, 1), Err(Error::Unsupported(_))));
        // Blocks of 8 channels: each k16 step would need two parameter sets.
        assert!(!gemm_supported(&BlockShape::conv(8, 32, (1, 1), 4).unwrap()));
        assert!(gemm_supported(&BlockShape::conv(8, 32, (1, 1), 2).unwrap()));
    }

    #[test]
    fn tiles_match_the_kernel_instantiations() {
        let source = KERNEL.source;
        for tile in Tile::ALL {
            for bits in [BlockBits::Int4, BlockBits::Int8] {
                let (m, n, wn) = tile.warps();
                let line = format!(
                    "LB_CONV_IGEMM({}, {}, {m}, {n}, {wn})",
                    tile.kernel_name(bits),
                    bits.bits()
                );
                assert!(source.contains(&line), "conv.cu lacks {line}");
            }
        }
        assert!(source.contains(&format!("#define LB_CONV_STAGES {STAGES}")));
    }
}
