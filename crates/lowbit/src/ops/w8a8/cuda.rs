//! W8A8 on a CUDA GPU: the online activation quantizer and one int8 tensor-core GEMM for both schemes (per-block
//! W8A8 and SmoothQuant), f16 or bf16 activations in and out. Kernels: `kernels/w8a8.cu` (its header explains the
//! tiling and the in-register per-block correction).
//!
//! ```no_run
//! # use lowbit::{DType, cuda::CudaDevice, ops::w8a8::{ActivationQuant, cuda::W8a8LinearCuda}};
//! # fn main() -> lowbit::Result<()> {
//! # let w: lowbit::formats::block::BlockQuantWeight = unimplemented!();
//! let dev = CudaDevice::new(0)?;
//! // Pads and uploads the weight once, with its per-(column, block) code-sum terms.
//! let op = W8a8LinearCuda::block(&dev, &w, None, ActivationQuant::Asymmetric, DType::F16)?;
//! let m = 1024;
//! let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes(m))?;
//! # let (x, mut y) = (dev.alloc_zeros::<half::f16>(m * 4096)?, dev.alloc_zeros::<half::f16>(m * 4096)?);
//! op.run(dev.stream(), &x, m, &mut y, &mut ws)?; // quantize + GEMM: no allocation, no sync
//! # Ok(()) }
//! ```
//!
//! - [`QuantizeActivationsCuda`] quantizes `[M, K]` activations per (row, K block) into a
//!   [`QuantizedActivationsCuda`], bit for bit as [`crate::ops::w8a8::quantize_activations`] does on the CPU; run
//!   it once and hand the result to several GEMMs ([`W8a8LinearCuda::run_quantized`]: q, k, v).
//! - [`W8a8LinearCuda::block`] prepares a per-block weight ([`BlockQuantWeight`], offset form, the activations'
//!   K blocks: 32, 64, a multiple of 128, or one block per row); [`W8a8LinearCuda::channel_weight`] a per-channel
//!   weight for activations in such blocks; [`W8a8LinearCuda::smoothquant`] a per-channel symmetric weight for
//!   per-token symmetric activations. Both compute `y = Σ_blocks (...) + bias` in f32 and round
//!   once to the output type.
//! - [`CublasLtInt8`]: cuBLASLt's int8 × int8 → int32 GEMM, the int8 speed ceiling `lowbit bench` compares with.
//!
//! Device layouts: activation codes `[M, K_pad]` (K padded with zero codes to a multiple of 128), parameters
//! `[blocks][M]` of `{scale, offset, code sum, 0}` (f32); weight codes `[N_pad, K_pad]`, parameters `[blocks][N_pad]`
//! of `{sB, oB, sB·Σb_q + bs·oB, 0}` for the mma.sync kernel, or per (block, 128-column tile) records for the Hopper
//! kernel (`hopper_weight_params`: the offset terms as a tf32 operand, then the scales).
//!
//! On sm_90a the GEMM is the warp-specialised Hopper kernel (TMA producer, two wgmma consumer warpgroups taking
//! turns, the per-block offset terms as one 3xTF32 wgmma per block); elsewhere, and for blocks of 32 or 64, the
//! mma.sync kernel. H200 figures and what limits them: `docs/notes/w8a8.md`. Non-finite activations give unspecified (but in-bounds) results: the device
//! cannot report them; the CPU quantizer does.

use super::{
    check_activation_input, check_channel_weight, check_linear, check_smoothquant_weight, weight_blocks,
    ActivationQuant, QuantizedActivations, MAX_EXACT_BLOCK,
};
use crate::cuda::blas::{LtMatmul, LtTypes};
use crate::cuda::checked_buffer as buffer;
use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use crate::cuda::{tensor_map_2d, KernelSource, LaunchConfig, MapElement, TensorMap};
use crate::dtype::{DType, Float};
use crate::error::{ensure, Error, Result};
use crate::formats::block::BlockQuantWeight;
use cudarc::driver::{sys, PushKernelArg};

/// The kernel source (quantizer and GEMM); listed in [`crate::cuda::KERNELS`].
pub const KERNEL: KernelSource = KernelSource {
    name: "w8a8",
    source: include_str!("../../../kernels/w8a8.cu"),
};

/// Threads per CTA of every kernel (`W8A8_THREADS`, and the quantizer's block).
const THREADS: u32 = 256;
/// GEMM tile rows / columns (`TILE_M`, `TILE_N`).
const TILE: usize = 128;
/// K codes per pipeline stage (`TILE_K`): K is padded to a multiple of it.
const TILE_K: usize = 128;
/// K codes per mma step.
const K_STEP: usize = 32;
/// f32 per parameter record (`float4`).
const PARAM: usize = 4;
/// Shared memory of one stage with `slots` parameter slots (`stage_bytes` in the kernel).
fn stage_bytes(slots: usize) -> usize {
    2 * TILE * TILE_K + 2 * slots * TILE * PARAM * 4
}
/// Threads of the Hopper GEMM (`HOPPER_THREADS`): two consumer warpgroups and a producer.
const HOPPER_THREADS: u32 = 384;
/// Bytes per staged output row (`OUT_PITCH`).
const OUT_PITCH: usize = 2 * TILE + 16;
/// Shared bytes of a Hopper stage's block parameters (`PARAM_BYTES`: A's float4 per row, one weight record, padding
/// to keep stages 1024-byte aligned).
const HOPPER_PARAM_BYTES: usize = 7168;
/// f32s of one (K block, 128-column tile) record of the Hopper kernel's weight parameters (`W_PARAM_BYTES`): the
/// columns' tf32 offset operand (8 each, 32-byte swizzle), then their scales sB.
const HOPPER_W_RECORD: usize = TILE * 8 + TILE;
/// Shared memory of the Hopper GEMM with `stages` stages: the stages, the staged output tile, a full and an empty
/// mbarrier per stage.
fn hopper_smem_bytes(stages: usize) -> usize {
    SMEM_ALIGN + stages * (2 * TILE * TILE_K + HOPPER_PARAM_BYTES) + TILE * OUT_PITCH + 2 * stages * 8
}

/// `x` rounded to tf32 (10 mantissa bits, to nearest even), as the tensor cores read it.
fn to_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0xFFF + ((bits >> 13) & 1)) & !0x1FFF)
}

/// The Hopper kernel's weight parameters from the `[blocks][N_pad]` float4 records `{sB, oB, ot, 0}`: per (block,
/// 128-column tile) one [`HOPPER_W_RECORD`]. Column c's offset operand is `(oB_hi, ot_hi, oB_hi, ot_hi, oB_lo,
/// ot_lo, 0, 0)` (x = x_hi + x_lo in tf32), stored at row c of a 32-byte-swizzled K-major tile (16-byte chunk
/// `j ^ ((c >> 2) & 1)`), so the kernel's tf32 wgmma reads it by descriptor; then the 128 scales sB.
fn hopper_weight_params(records: &[f32], blocks: usize, n_pad: usize) -> Vec<f32> {
    let tiles = n_pad / TILE;
    let mut out = vec![0f32; blocks * tiles * HOPPER_W_RECORD];
    let split = |x: f32| {
        let hi = to_tf32(x);
        (hi, to_tf32(x - hi))
    };
    for b in 0..blocks {
        for col in 0..n_pad {
            let src = (b * n_pad + col) * PARAM;
            let (sb, (ob_hi, ob_lo), (ot_hi, ot_lo)) = (records[src], split(records[src + 1]), split(records[src + 2]));
            let record = (b * tiles + col / TILE) * HOPPER_W_RECORD;
            let c = col % TILE;
            for (k, v) in [ob_hi, ot_hi, ob_hi, ot_hi, ob_lo, ot_lo, 0.0, 0.0]
                .into_iter()
                .enumerate()
            {
                let chunk = (k / 4) ^ ((c >> 2) & 1);
                out[record + c * 8 + chunk * 4 + k % 4] = v;
            }
            out[record + TILE * 8 + c] = sb;
        }
    }
    out
}
/// Slack for aligning the stages to 1024 bytes (`SMEM_ALIGN`: wgmma's 128-byte swizzle atoms).
const SMEM_ALIGN: usize = 1024;
/// Longest block whose dots the kernel converts with the exact magic-number trick (`|dot| ≤ 256 · 2^14 = 2^22`).
const SMALL_DOT_BLOCK: usize = 256;
/// Alignment of each part of a workspace.
const WORKSPACE_ALIGN: usize = 256;

/// Kernel parameters of the quantizer; field order matches `struct QuantizeParams` in `kernels/w8a8.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct QuantizeParams {
    x: u64,
    codes: u64,
    params: u64,
    m: u32,
    k: u32,
    ldx: u32,
    k_pad: u32,
    block: u32,
    blocks: u32,
}

/// Kernel parameters of the GEMM; field order matches `struct GemmParams` in `kernels/w8a8.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GemmParams {
    a: u64,
    a_params: u64,
    w: u64,
    w_params: u64,
    bias: u64,
    channel_scales: u64,
    trace: u64,
    out: u64,
    m: u32,
    n: u32,
    n_pad: u32,
    k_pad: u32,
    ldo: u32,
    blocks: u32,
    block_steps: u32,
    k_steps: u32,
    slots: u32,
    tiles_m: u32,
    tiles_n: u32,
    small_dot: u32,
}

// SAFETY: plain-old-data, `#[repr(C)]`, layouts identical to the CUDA structs (pointers, then u32s; no padding).
unsafe impl DeviceRepr for QuantizeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for GemmParams {}

/// Geometry of quantized activations on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationLayout {
    /// Rows `M`.
    pub m: usize,
    /// Columns `K`.
    pub k: usize,
    /// Columns per block (the last may be shorter).
    pub block_size: usize,
}

impl ActivationLayout {
    /// Checks the geometry (the CPU quantizer's rules, and 32-bit device indices).
    pub fn new(m: usize, k: usize, block_size: usize) -> Result<Self> {
        check_activation_input("activations", m * k, m, k, block_size)?;
        let layout = Self { m, k, block_size };
        ensure(
            m <= u32::MAX as usize && layout.k_pad() <= u32::MAX as usize && layout.codes_len() < 1 << 40,
            "activations",
            format!("shape [{m}, {k}]"),
            "M and K must fit in 32 bits on CUDA",
        )?;
        Ok(layout)
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Row pitch of the codes: K padded to a multiple of 128.
    pub fn k_pad(&self) -> usize {
        self.k.next_multiple_of(TILE_K)
    }

    /// Bytes of codes, `M · K_pad`.
    pub fn codes_len(&self) -> usize {
        self.m * self.k_pad()
    }

    /// f32 of parameters, `blocks · M · 4`.
    pub fn params_len(&self) -> usize {
        self.blocks() * self.m * PARAM
    }

    /// Bytes of one workspace holding codes and parameters (each 256-byte aligned).
    pub fn workspace_bytes(&self) -> usize {
        self.codes_len().next_multiple_of(WORKSPACE_ALIGN) + self.params_len() * 4
    }
}

/// Int8 activations on the device, made by [`QuantizeActivationsCuda::run`] (or uploaded): codes `[M, K_pad]` and
/// per-(row, block) `{scale, offset, code sum, 0}` records `[blocks][M]`.
#[derive(Debug)]
pub struct QuantizedActivationsCuda {
    layout: ActivationLayout,
    symmetric: bool,
    codes: CudaSlice<i8>,
    params: CudaSlice<f32>,
}

impl QuantizedActivationsCuda {
    /// Device buffers for `m` rows of `k` activations in blocks of `block_size`, to be filled by a quantizer.
    pub fn alloc(device: &CudaDevice, m: usize, k: usize, block_size: usize) -> Result<Self> {
        let layout = ActivationLayout::new(m, k, block_size)?;
        Ok(Self {
            layout,
            symmetric: false,
            codes: device.alloc_zeros(layout.codes_len())?,
            params: device.alloc_zeros(layout.params_len())?,
        })
    }

    /// Uploads host activations (e.g. to run the GPU GEMM on exactly the CPU quantizer's operands).
    pub fn upload(device: &CudaDevice, a: &QuantizedActivations) -> Result<Self> {
        let layout = ActivationLayout::new(a.m(), a.k(), a.block_size())?;
        let k_pad = layout.k_pad();
        let mut codes = vec![0i8; layout.codes_len()];
        for (dst, src) in codes.chunks_exact_mut(k_pad).zip(a.codes().chunks_exact(a.k())) {
            dst[..a.k()].copy_from_slice(src);
        }
        let (m, blocks) = (a.m(), a.blocks());
        let mut params = vec![0f32; layout.params_len()];
        for r in 0..m {
            for b in 0..blocks {
                let (src, dst) = (r * blocks + b, (b * m + r) * PARAM);
                params[dst..dst + 3].copy_from_slice(&[a.scales()[src], a.offsets()[src], a.code_sums()[src] as f32]);
            }
        }
        Ok(Self {
            layout,
            symmetric: a.is_symmetric(),
            codes: device.upload(&codes)?,
            params: device.upload(&params)?,
        })
    }

    /// Downloads (waiting for the device stream) into host activations, plus the code sums the device computed
    /// (`[M, blocks]`; [`QuantizedActivations`] recomputes its own).
    pub fn download(&self, device: &CudaDevice) -> Result<(QuantizedActivations, Vec<i32>)> {
        let ActivationLayout { m, k, block_size } = self.layout;
        let (k_pad, blocks) = (self.layout.k_pad(), self.layout.blocks());
        let padded = device.download(&self.codes)?;
        let codes: Vec<i8> = padded
            .chunks_exact(k_pad)
            .flat_map(|row| row[..k].iter().copied())
            .collect();
        let params = device.download(&self.params)?;
        let field = |f: usize| -> Vec<f32> {
            (0..m * blocks)
                .map(|i| params[((i % blocks) * m + i / blocks) * PARAM + f])
                .collect()
        };
        let sums = field(2).into_iter().map(|s| s as i32).collect();
        let a = QuantizedActivations::from_parts(m, k, block_size, codes, field(0), field(1))?;
        Ok((a, sums))
    }

    /// The geometry.
    pub fn layout(&self) -> ActivationLayout {
        self.layout
    }

    /// Whether the activations were quantized symmetric (every offset zero).
    pub fn is_symmetric(&self) -> bool {
        self.symmetric
    }
}

/// The online activation quantizer on the GPU, for one `K`, block size, mode and input dtype (f16/bf16).
#[derive(Debug, Clone)]
pub struct QuantizeActivationsCuda {
    k: usize,
    block_size: usize,
    mode: ActivationQuant,
    dtype: DType,
    kernel: String,
    function: CudaFunction,
    /// A vector variant, launched when x is aligned for it.
    vector: Option<VectorQuantizer>,
}

/// A quantizer variant with vector loads. When K and the block are multiples of 8, 16-byte loads: `_v8g<G>` (groups
/// of G lanes per block, 32 / G blocks per warp) up to 128, `_v8` (a warp per block) up to 256, `_cta2/4/8` (a CTA
/// per block, held in registers) up to 16384, `_cta` (the same in two passes) beyond. Otherwise `_v<N>` (N consecutive values per lane, one 2N-byte load) when K and the block are
/// multiples of N.
#[derive(Debug, Clone)]
struct VectorQuantizer {
    name: String,
    function: CudaFunction,
    /// Alignment x needs, in bytes.
    align: u64,
    /// (row, block) units one CTA of 256 threads quantizes.
    units_per_cta: u64,
}

impl QuantizeActivationsCuda {
    /// Checks the geometry (`1 ≤ block_size ≤ K`) and dtype, and loads the kernel.
    pub fn new(device: &CudaDevice, k: usize, block_size: usize, mode: ActivationQuant, dtype: DType) -> Result<Self> {
        ActivationLayout::new(1, k, block_size)?;
        check_dtype(dtype)?;
        // Values per lane held in registers (one warp per block), or two passes for longer blocks.
        let variant = match block_size.div_ceil(32) {
            1 => "r1",
            2 => "r2",
            3 | 4 => "r4",
            5..=8 => "r8",
            _ => "loop",
        };
        let mode_name = match mode {
            ActivationQuant::Asymmetric => "asym",
            ActivationQuant::Symmetric => "sym",
        };
        let kernel = format!("w8a8_quantize_{}_{mode_name}_{variant}", dtype.name());
        let function = device.function(&KERNEL, &kernel)?;
        let per_lane = block_size.div_ceil(32).next_power_of_two();
        let warps = (THREADS / 32) as u64;
        let variant = if k % 8 == 0 && block_size % 8 == 0 {
            let group = (block_size / 8).next_power_of_two().max(4);
            Some(match group {
                // A CTA per block: held in registers up to 16384 values (`_cta<H>`: 2048 H), else two passes.
                64.. => {
                    let held = [2, 4, 8].into_iter().find(|&h| block_size <= 2048 * h);
                    (held.map_or("cta".to_string(), |h| format!("cta{h}")), 16, 1)
                }
                32 => ("v8".to_string(), 16, warps),
                _ => (format!("v8g{group}"), 16, warps * (32 / group) as u64),
            })
        } else if (2..=8).contains(&per_lane) && k % per_lane == 0 && block_size % per_lane == 0 {
            Some((format!("v{per_lane}"), 2 * per_lane as u64, warps))
        } else {
            None
        };
        let vector = match variant {
            Some((suffix, align, units_per_cta)) => {
                let name = format!("w8a8_quantize_{}_{mode_name}_{suffix}", dtype.name());
                let function = device.function(&KERNEL, &name)?;
                Some(VectorQuantizer {
                    name,
                    function,
                    align,
                    units_per_cta,
                })
            }
            None => None,
        };
        Ok(Self {
            k,
            block_size,
            mode,
            dtype,
            kernel,
            function,
            vector,
        })
    }

    /// The mode.
    pub fn mode(&self) -> ActivationQuant {
        self.mode
    }

    /// Quantizes `x [m, K]` (contiguous rows) into `out` (allocated for this `m`, `K` and block size) on `stream`.
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        m: usize,
        out: &mut QuantizedActivationsCuda,
    ) -> Result<()> {
        let layout = ActivationLayout::new(m, self.k, self.block_size)?;
        ensure(
            out.layout == layout,
            "quantized_activations",
            format!("{:?}", out.layout),
            &format!("must be allocated for {layout:?}"),
        )?;
        let codes = out.codes.device_ptr_mut(stream).0;
        let params = out.params.device_ptr_mut(stream).0;
        self.launch(stream, x, layout, codes, params)?;
        out.symmetric = self.mode == ActivationQuant::Symmetric;
        Ok(())
    }

    fn launch<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        layout: ActivationLayout,
        codes: u64,
        params: u64,
    ) -> Result<()> {
        check_type::<T>(self.dtype, "x")?;
        let x = buffer(x.device_ptr(stream).0, x.len(), layout.m * layout.k, "x", 2)?;
        let vector = self.vector.as_ref().filter(|v| x % v.align == 0);
        let units = layout.m as u64 * layout.blocks() as u64;
        let blocks = units.div_ceil(vector.map_or(THREADS as u64 / 32, |v| v.units_per_cta));
        ensure(
            blocks <= i32::MAX as u64,
            "activations",
            format!("shape [{}, {}]", layout.m, layout.k),
            "too many blocks for one launch",
        )?;
        let params = QuantizeParams {
            x,
            codes,
            params,
            m: layout.m as u32,
            k: layout.k as u32,
            ldx: layout.k as u32,
            k_pad: layout.k_pad() as u32,
            block: layout.block_size as u32,
            blocks: layout.blocks() as u32,
        };
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (kernel, function) = match vector {
            Some(v) => (&v.name, &v.function),
            None => (&self.kernel, &self.function),
        };
        let mut builder = stream.launch_builder(function);
        builder.arg(&params);
        // SAFETY: x holds M·K elements (checked; the vector variant also needs its alignment, checked above), codes
        // and params were sized for this layout by their owner, and the kernel touches only those ranges.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(launch_error(kernel))
    }
}

/// Which GEMM kernel a [`W8a8LinearCuda`] launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmKernel {
    /// mma.sync m16n8k32 (sm_80 and later, every block size): `w8a8_gemm_<t>_s<stages>`.
    MmaSync,
    /// Warp-specialised wgmma m64n128k32 fed by TMA (sm_90a; blocks that are multiples of 128, or one per row):
    /// `w8a8_wgmma_<t>_s<stages>`.
    Wgmma,
}

/// Which scheme a [`W8a8LinearCuda`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum W8a8Scheme {
    /// Per-block W8A8: activations quantized per row and K block (the weight's blocks) in this mode.
    Block(ActivationQuant),
    /// Per-block W8A8 with a per-channel weight (one block per row, any offsets): activations quantized in K blocks
    /// of `block_size` in `mode`.
    ChannelWeight { mode: ActivationQuant, block_size: usize },
    /// SmoothQuant: per-token symmetric activations, per-channel symmetric weights.
    SmoothQuant,
}

/// The host checks of a weight (and bias) for `scheme`, before anything is uploaded.
fn check_scheme(weight: &BlockQuantWeight, bias: Option<&[f32]>, scheme: W8a8Scheme) -> Result<()> {
    let k = weight.shape().channels;
    match scheme {
        W8a8Scheme::Block(_) => check_linear(weight, bias, k, weight.shape().block_channels, "per-block W8A8"),
        W8a8Scheme::ChannelWeight { block_size, .. } => {
            check_channel_weight(weight)?;
            ActivationLayout::new(1, k, block_size)?;
            check_linear(weight, bias, k, block_size, "per-block W8A8")
        }
        W8a8Scheme::SmoothQuant => {
            check_smoothquant_weight(weight)?;
            check_linear(weight, bias, k, k, "SmoothQuant")
        }
    }
}

/// A W8A8 linear layer prepared on the GPU: `y[M, N] = x[M, K] · W^T (+ bias)` with int8 tensor-core products.
#[derive(Debug)]
pub struct W8a8LinearCuda {
    scheme: W8a8Scheme,
    n: usize,
    k: usize,
    block_size: usize,
    n_pad: usize,
    dtype: DType,
    /// `[N_pad, K_pad]`.
    codes: CudaSlice<i8>,
    /// `[blocks][N_pad][4]` for mma.sync; for the Hopper kernel `[blocks][N_pad / 128]` records
    /// ([`hopper_weight_params`]).
    params: CudaSlice<f32>,
    bias: Option<CudaSlice<f32>>,
    /// `[N]`: a per-channel weight's scales, applied in the `_channel` kernels' epilogue.
    channel_scales: Option<CudaSlice<f32>>,
    quantize: QuantizeActivationsCuda,
    kernel: String,
    gemm: CudaFunction,
    /// The Hopper kernel's map of `codes` (its TMA reads 128 x 128 tiles); `None` for mma.sync.
    codes_map: Option<TensorMap>,
    /// CTAs of a Hopper launch at most (it is persistent: one per SM).
    sms: usize,
    stages: usize,
    slots: usize,
    /// Dynamic shared memory of a launch.
    smem: usize,
    /// Where the `_trace` kernel writes its timeline ([`W8a8LinearCuda::set_trace`]); 0 normally.
    trace: u64,
}

impl W8a8LinearCuda {
    /// Prepares per-block W8A8: `weight` `[N, K]` in offset form (int8 or int4 codes) with K blocks of 32, 64, a
    /// multiple of 128, or one block per row; `bias` `[N]`; activations quantized in `mode` with the same blocks;
    /// `dtype` f16 or bf16 (activations and output). Pads and uploads the weight once.
    pub fn block(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        mode: ActivationQuant,
        dtype: DType,
    ) -> Result<Self> {
        let scheme = W8a8Scheme::Block(mode);
        check_scheme(weight, bias, scheme)?;
        Self::new(device, weight, bias, scheme, dtype, None)
    }

    /// Prepares per-block W8A8 with a per-channel weight: `weight` `[N, K]` in offset form with one block per row,
    /// `bias` `[N]`, activations quantized in `mode` in K blocks of `block_size` (32, 64 or a multiple of 128, at
    /// most 65536), `dtype` f16 or bf16. On sm_90a the kernel leaves the weight's scale to the epilogue (every
    /// scale non-zero): one FFMA per element and block instead of a scaled dot. With symmetric activations and a
    /// symmetric weight (every offset zero) the offset terms vanish too (the `_channel_sym` kernels): the fastest
    /// per-block form.
    pub fn channel_weight(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        block_size: usize,
        mode: ActivationQuant,
        dtype: DType,
    ) -> Result<Self> {
        let scheme = W8a8Scheme::ChannelWeight { mode, block_size };
        check_scheme(weight, bias, scheme)?;
        Self::new(device, weight, bias, scheme, dtype, None)
    }

    /// Prepares SmoothQuant: `weight` `[N, K]` with one symmetric scale per output channel (e.g.
    /// [`BlockQuantWeight::quantize_per_channel_symmetric`]), `bias` `[N]`, `dtype` f16 or bf16. Activations are
    /// quantized per token, symmetric.
    pub fn smoothquant(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        dtype: DType,
    ) -> Result<Self> {
        check_scheme(weight, bias, W8a8Scheme::SmoothQuant)?;
        Self::new(device, weight, bias, W8a8Scheme::SmoothQuant, dtype, None)
    }

    /// As [`W8a8LinearCuda::block`] / [`W8a8LinearCuda::channel_weight`] / [`W8a8LinearCuda::smoothquant`] with the
    /// GEMM kernel forced instead of the
    /// default (wgmma where it applies, mma.sync elsewhere). For tests and benchmarks.
    #[doc(hidden)]
    pub fn with_kernel(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        scheme: W8a8Scheme,
        dtype: DType,
        kernel: GemmKernel,
    ) -> Result<Self> {
        check_scheme(weight, bias, scheme)?;
        Self::new(device, weight, bias, scheme, dtype, Some(kernel))
    }

    fn new(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        scheme: W8a8Scheme,
        dtype: DType,
        forced: Option<GemmKernel>,
    ) -> Result<Self> {
        check_dtype(dtype)?;
        let shape = *weight.shape();
        let (n, k) = (shape.rows, shape.channels);
        // The activations' K blocks: the GEMM's blocks, whatever the weight's.
        let block = match scheme {
            W8a8Scheme::Block(_) => shape.block_channels,
            W8a8Scheme::ChannelWeight { block_size, .. } => block_size,
            W8a8Scheme::SmoothQuant => k,
        };
        ActivationLayout::new(1, k, block)?;
        let blocks = k.div_ceil(block);
        ensure(
            block <= MAX_EXACT_BLOCK,
            "block_size",
            block,
            "blocks longer than 65536 could overflow the int32 block dot",
        )?;
        ensure(
            blocks == 1 || block == 32 || block == 64 || block % TILE_K == 0,
            "block_size",
            block,
            "CUDA W8A8 takes K blocks of 32, 64, a multiple of 128, or one block per row",
        )?;
        ensure(
            n <= u32::MAX as usize - TILE,
            "weight",
            format!("shape [{n}, {k}]"),
            "N must fit in 32 bits",
        )?;
        let (n_pad, k_pad) = (n.next_multiple_of(TILE), k.next_multiple_of(TILE_K));

        let mode = match scheme {
            W8a8Scheme::Block(mode) | W8a8Scheme::ChannelWeight { mode, .. } => mode,
            W8a8Scheme::SmoothQuant => ActivationQuant::Symmetric,
        };
        let quantize = QuantizeActivationsCuda::new(device, k, block, mode, dtype)?;
        // Parameter slots per stage: one per block a 128-code stage can end.
        let slots = if blocks > 1 && block < TILE_K {
            TILE_K / block
        } else {
            1
        };
        // wgmma needs sm_90a and stages that lie in one block (slots = 1); where it fits it is the default
        // (H200 measurements in docs/notes/w8a8.md).
        let wgmma_fits = device.info().arch == "sm_90a" && slots == 1;
        let choice = forced.unwrap_or(if wgmma_fits {
            GemmKernel::Wgmma
        } else {
            GemmKernel::MmaSync
        });
        if choice == GemmKernel::Wgmma && !wgmma_fits {
            return Err(Error::Unsupported(format!(
                "CUDA W8A8 wgmma kernel on {} with K blocks of {block} (needs sm_90a and blocks of 128·j or one per row)",
                device.info().arch
            )));
        }
        let limit = device
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(crate::cuda::driver_error("cuDeviceGetAttribute"))? as usize;
        // A per-channel weight on the Hopper kernel: sB is the same in every block, so it leaves the sum,
        // C = sB·Σ_b [sA·dot + sA·(oB/sB)·Σa_q + oA·(Σb_q + bs·oB/sB)]: the blocks' dots are scaled by sA alone and sB
        // joins once, in the epilogue (the `_channel` kernels), which drops an FMUL and a shared load per element and
        // block. The offset terms keep their tf32 wgmma with oB/sB for oB (exact for a symmetric weight: 0), so every
        // scale must be non-zero. Any other weight is prepared per (column, block), a per-channel one repeating its
        // parameters.
        let channel_epilogue = matches!(scheme, W8a8Scheme::ChannelWeight { .. })
            && choice == GemmKernel::Wgmma
            && weight
                .scales()
                .iter()
                .zip(weight.offsets())
                .all(|(&s, &o)| s != 0.0 && (o / s).is_finite());
        // Symmetric activations with a symmetric per-channel weight: every offset term is zero, and the
        // `_channel_sym` kernels skip them (no tf32 wgmma, no weight record per block).
        let no_offsets =
            channel_epilogue && mode == ActivationQuant::Symmetric && weight.offsets().iter().all(|&o| o == 0.0);
        // The deepest pipeline that fits (wgmma keeps one stage more in flight: it refills a stage only after the
        // wgmmas that read it have completed).
        let (depths, prefix): (&[usize], &str) = match choice {
            GemmKernel::MmaSync => (&[4, 3, 2], "gemm"),
            GemmKernel::Wgmma if no_offsets => (&[4, 3], "wgmma_channel_sym"),
            GemmKernel::Wgmma if channel_epilogue => (&[4, 3], "wgmma_channel"),
            GemmKernel::Wgmma => (&[4, 3], "wgmma"),
        };
        let smem_for = |stages: usize| match choice {
            GemmKernel::MmaSync => stages * stage_bytes(slots) + SMEM_ALIGN,
            GemmKernel::Wgmma => hopper_smem_bytes(stages),
        };
        let stages = depths.iter().copied().find(|&s| smem_for(s) <= limit).ok_or_else(|| {
            Error::Unsupported(format!(
                "CUDA W8A8: {limit} bytes of shared memory per block is less than {} stages ({} bytes)",
                depths[depths.len() - 1],
                smem_for(depths[depths.len() - 1])
            ))
        })?;
        let smem = smem_for(stages);
        let kernel = format!("w8a8_{prefix}_{}_s{stages}", dtype.name());
        let gemm = device.function_with_shared_memory(&KERNEL, &kernel, smem)?;

        // Codes padded with zeros; per (block, column) {sB, oB, sB·Σb_q + bs·oB, 0} (zeros for padding columns), or
        // for the `_channel` kernels {1, oB/sB, Σb_q + bs·oB/sB, 0} and the scales sB apart.
        let mut codes = vec![0i8; n_pad * k_pad];
        for (c, row) in weight.codes().chunks_exact(k).enumerate() {
            codes[c * k_pad..c * k_pad + k].copy_from_slice(row);
        }
        // The `_channel_sym` kernels read no weight records (every offset term is zero): one placeholder.
        let params = if no_offsets {
            vec![0f32; PARAM]
        } else {
            let mut params = vec![0f32; blocks * n_pad * PARAM];
            for wb in weight_blocks(weight, block) {
                let record = match channel_epilogue {
                    true => {
                        let offset = wb.offset / wb.scale;
                        [1.0, offset, wb.code_sum() as f32 + wb.codes.len() as f32 * offset]
                    }
                    false => [wb.scale, wb.offset, wb.offset_term()],
                };
                let dst = (wb.block * n_pad + wb.column) * PARAM;
                params[dst..dst + 3].copy_from_slice(&record);
            }
            match choice {
                GemmKernel::Wgmma => hopper_weight_params(&params, blocks, n_pad),
                GemmKernel::MmaSync => params,
            }
        };
        let channel_scales = match channel_epilogue {
            true => Some(device.upload(weight.scales())?),
            false => None,
        };
        let codes = device.upload(&codes)?;
        let codes_map = match choice {
            GemmKernel::MmaSync => None,
            GemmKernel::Wgmma => Some(tensor_map_2d(
                "weight codes",
                MapElement::U8,
                codes.device_ptr(device.stream()).0,
                (n_pad, k_pad, k_pad),
                (TILE, TILE_K),
                true,
            )?),
        };
        Ok(Self {
            scheme,
            n,
            k,
            block_size: block,
            n_pad,
            dtype,
            codes,
            codes_map,
            sms: device.info().sm_count as usize,
            params: device.upload(&params)?,
            bias: bias.map(|b| device.upload(b)).transpose()?,
            channel_scales,
            quantize,
            kernel,
            gemm,
            stages,
            slots,
            smem,
            trace: 0,
        })
    }

    /// Diagnosis (`examples/w8a8_trace`): with `address` non-zero, launches the `_trace` twin of the f16 Hopper
    /// kernel of 4 stages, which writes CTA 0's per-stage timeline there: for its first tile's first 64 k tiles and
    /// each consumer warpgroup, four `clock64` values (`[k tile][warpgroup][event]` u64, the kernel's
    /// `StageTrace`). `0` restores the normal kernel.
    #[doc(hidden)]
    pub fn set_trace(&mut self, device: &CudaDevice, address: u64) -> Result<()> {
        const PLAIN: &str = "_f16_s4";
        const TRACED: &str = "_trace_f16_s4";
        let plain = self.kernel.replace(TRACED, PLAIN);
        if self.gemm_kernel() != GemmKernel::Wgmma || !plain.ends_with(PLAIN) {
            return Err(Error::Unsupported(format!("no trace twin of {}", self.kernel)));
        }
        let name = match address {
            0 => plain,
            _ => plain.replace(PLAIN, TRACED),
        };
        self.gemm = device.function_with_shared_memory(&KERNEL, &name, self.smem)?;
        self.kernel = name;
        self.trace = address;
        Ok(())
    }

    /// The scheme.
    pub fn scheme(&self) -> W8a8Scheme {
        self.scheme
    }

    /// Output features `N`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features `K`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// K block size of the activations, and of the weight unless it is per channel (`K` for SmoothQuant).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The GEMM kernel launched (`w8a8_gemm_<dtype>_s<stages>` or `w8a8_wgmma_<dtype>_s<stages>`).
    pub fn kernel_name(&self) -> &str {
        &self.kernel
    }

    /// Which GEMM kernel the layer launches.
    pub fn gemm_kernel(&self) -> GemmKernel {
        if self.codes_map.is_some() {
            GemmKernel::Wgmma
        } else {
            GemmKernel::MmaSync
        }
    }

    /// Pipeline depth of the GEMM (what fits in this GPU's shared memory).
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The activation quantizer of this layer (its K, blocks and mode), to quantize once for several layers.
    pub fn quantizer(&self) -> &QuantizeActivationsCuda {
        &self.quantize
    }

    /// Device bytes of the prepared weight (codes, parameters, bias).
    pub fn weight_bytes(&self) -> usize {
        let floats = |b: &Option<CudaSlice<f32>>| b.as_ref().map_or(0, |b| b.len());
        self.codes.len() + 4 * (self.params.len() + floats(&self.bias) + floats(&self.channel_scales))
    }

    /// Scratch [`W8a8LinearCuda::run`] needs for `m` rows: the quantized activations.
    pub fn workspace_bytes(&self, m: usize) -> usize {
        ActivationLayout {
            m,
            k: self.k,
            block_size: self.block_size,
        }
        .workspace_bytes()
    }

    /// `y[m, N] = x[m, K] · W^T (+ bias)` on `stream`, activation quantization included (into `workspace`, at
    /// least [`W8a8LinearCuda::workspace_bytes`]`(m)` bytes, 256-byte aligned). Rows are contiguous. Checks on the
    /// host only; no allocation, no synchronisation (graph-capturable).
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        m: usize,
        y: &mut dyn DevicePtrMut<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let layout = ActivationLayout::new(m, self.k, self.block_size)?;
        // Every check before the first launch: a failing call leaves the workspace untouched.
        check_type::<T>(self.dtype, "y")?;
        let y_len = y.len();
        buffer(y.device_ptr_mut(stream).0, y_len, m * self.n, "y", 16)?;
        let have = workspace.len();
        let ws = buffer(
            workspace.device_ptr_mut(stream).0,
            have,
            layout.workspace_bytes(),
            "workspace",
            WORKSPACE_ALIGN as u64,
        )?;
        let params = ws + layout.codes_len().next_multiple_of(WORKSPACE_ALIGN) as u64;
        self.quantize.launch(stream, x, layout, ws, params)?;
        self.launch(stream, ws, params, m, y)
    }

    /// `y[m, N]` from activations already quantized with this layer's K blocks (and, for SmoothQuant, per token
    /// and symmetric), e.g. by [`W8a8LinearCuda::quantizer`]. Host checks only; no allocation or synchronisation.
    pub fn run_quantized<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        a: &QuantizedActivationsCuda,
        y: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let l = a.layout;
        ensure(
            l.k == self.k,
            "activations",
            format!("shape [{}, {}]", l.m, l.k),
            &format!("activation K must equal the weight's K = {}", self.k),
        )?;
        ensure(
            l.block_size == self.block_size,
            "block_size",
            format!("activations {} vs layer {}", l.block_size, self.block_size),
            "activations must be quantized in the layer's K blocks",
        )?;
        if self.scheme == W8a8Scheme::SmoothQuant {
            ensure(
                a.symmetric,
                "activation_offsets",
                "non-zero activation offsets",
                "SmoothQuant activations are symmetric (offset 0)",
            )?;
        }
        let (codes, params) = (a.codes.device_ptr(stream).0, a.params.device_ptr(stream).0);
        self.launch(stream, codes, params, l.m, y)
    }

    fn launch<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        a_codes: u64,
        a_params: u64,
        m: usize,
        y: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        check_type::<T>(self.dtype, "y")?;
        let have = y.len();
        let out = buffer(y.device_ptr_mut(stream).0, have, m * self.n, "y", 16)?;
        let (tiles_m, tiles_n) = (m.div_ceil(TILE), self.n_pad / TILE);
        let ctas = tiles_m as u64 * tiles_n as u64;
        ensure(
            ctas <= i32::MAX as u64,
            "activations",
            format!("M = {m}"),
            "too many tiles for one launch",
        )?;
        let blocks = self.k.div_ceil(self.block_size);
        let k_steps = self.k.div_ceil(K_STEP);
        let params = GemmParams {
            a: a_codes,
            a_params,
            w: self.codes.device_ptr(stream).0,
            w_params: self.params.device_ptr(stream).0,
            bias: self.bias.as_ref().map_or(0, |b| b.device_ptr(stream).0),
            channel_scales: self.channel_scales.as_ref().map_or(0, |s| s.device_ptr(stream).0),
            trace: self.trace,
            out,
            m: m as u32,
            n: self.n as u32,
            n_pad: self.n_pad as u32,
            k_pad: self.k.next_multiple_of(TILE_K) as u32,
            ldo: self.n as u32,
            blocks: blocks as u32,
            block_steps: if blocks == 1 { k_steps } else { self.block_size / K_STEP } as u32,
            k_steps: k_steps as u32,
            slots: self.slots as u32,
            tiles_m: tiles_m as u32,
            tiles_n: tiles_n as u32,
            small_dot: (self.block_size <= SMALL_DOT_BLOCK) as u32,
        };
        // The Hopper kernel reads the activations through tensor maps of exactly their extent.
        let maps = match &self.codes_map {
            None => None,
            Some(codes_map) => {
                let k_pad = params.k_pad as usize;
                // The parameters as [blocks · M] rows of 4 f32; TMA coordinates are i32.
                let param_rows = blocks * m;
                ensure(
                    param_rows + TILE <= i32::MAX as usize,
                    "activations",
                    format!("M = {m} with {blocks} K blocks"),
                    "M · blocks must fit in 31 bits",
                )?;
                let codes = (m, k_pad, k_pad);
                let a_map = tensor_map_2d("activation codes", MapElement::U8, a_codes, codes, (TILE, TILE_K), true)?;
                let rows = (param_rows, PARAM, PARAM);
                let a_params_map = tensor_map_2d(
                    "activation parameters",
                    MapElement::F32,
                    a_params,
                    rows,
                    (TILE, PARAM),
                    false,
                )?;
                Some((a_map, codes_map, a_params_map))
            }
        };
        let mut builder = stream.launch_builder(&self.gemm);
        let config = match &maps {
            None => {
                builder.arg(&params);
                LaunchConfig {
                    grid_dim: (ctas as u32, 1, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: self.smem as u32,
                }
            }
            Some((a_map, codes_map, a_params_map)) => {
                builder.arg(a_map).arg(*codes_map).arg(a_params_map).arg(&params);
                LaunchConfig {
                    grid_dim: (ctas.min(self.sms as u64) as u32, 1, 1),
                    block_dim: (HOPPER_THREADS, 1, 1),
                    shared_mem_bytes: self.smem as u32,
                }
            }
        };
        // SAFETY: y holds M·N elements (checked); the activation buffers were made for this K, blocks and M (checked
        // by the callers) and the weight buffers by `new`; the kernel reads and writes only within them.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(launch_error(&self.kernel))
    }
}

/// cuBLASLt int8 GEMM, `y_i32[M, N] = x_i8[M, K] · W_i8^T` (int32 accumulation and output; "TN" layout, the one
/// IMMA kernels take): the int8 tensor-core ceiling `lowbit bench --op w8a8` reports beside lowbit's kernels.
#[derive(Debug)]
pub struct CublasLtInt8 {
    plan: LtMatmul,
}

impl CublasLtInt8 {
    /// A cuBLASLt handle, descriptors and the heuristic's best algorithm for an `m × k` by `n × k` int8 product.
    pub fn new(device: &CudaDevice, m: usize, n: usize, k: usize) -> Result<Self> {
        Self::on(device.context(), device.stream(), m, n, k)
    }

    /// As [`CublasLtInt8::new`] for a context and the stream its workspace is allocated on.
    pub(crate) fn on(
        context: &std::sync::Arc<cudarc::driver::CudaContext>,
        stream: &std::sync::Arc<CudaStream>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        Ok(Self {
            plan: LtMatmul::new(context, stream, LtTypes::Int8, m, n, k)?,
        })
    }

    /// `y = x · W^T` on `stream` from device addresses (x `[M, K]`, w `[N, K]` row-major int8; y `[M, N]` int32),
    /// for callers that checked the buffers themselves (`ops::conv_int8::cuda`).
    pub(crate) fn run_raw(&mut self, stream: &CudaStream, w: u64, x: u64, y: u64) -> Result<()> {
        // SAFETY: the caller guarantees w, x and y hold N·K, M·K and M·N elements.
        unsafe { self.plan.run_raw(stream, w, x, y) }
    }

    /// `y = x · W^T` on `stream` (x `[M, K]`, w `[N, K]` row-major int8; y `[M, N]` int32).
    pub fn run(
        &mut self,
        stream: &CudaStream,
        w: &CudaSlice<i8>,
        x: &CudaSlice<i8>,
        y: &mut CudaSlice<i32>,
    ) -> Result<()> {
        self.plan.check_lengths(w.len(), x.len(), y.len())?;
        let (w, x) = (w.device_ptr(stream).0, x.device_ptr(stream).0);
        let y = y.device_ptr_mut(stream).0;
        self.run_raw(stream, w, x, y)
    }
}

fn check_dtype(dtype: DType) -> Result<()> {
    ensure(
        matches!(dtype, DType::F16 | DType::Bf16),
        "dtype",
        dtype,
        "CUDA W8A8 takes f16 or bf16 activations",
    )
}

fn check_type<T: Float>(dtype: DType, name: &str) -> Result<()> {
    ensure(
        T::DTYPE == dtype,
        name,
        T::DTYPE,
        &format!("dtype must be {dtype} (the operator's)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn param_structs_match_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<QuantizeParams>(), 3 * 8 + 6 * 4);
        assert_eq!(std::mem::size_of::<GemmParams>(), 8 * 8 + 12 * 4);
        // The epilogue stages the output tile (TILE_M rows of OUT_PITCH = 2·128 + 16 bytes) in stage 0.
        assert!(stage_bytes(1) >= TILE * (TILE * 2 + 16));
        // The Hopper kernel's deepest pipeline fits in an H100/H200's 227 KB of shared memory per block.
        assert!(hopper_smem_bytes(4) <= 227 * 1024);
        // Stages stay 1024-byte aligned, and the weight record fits its slot after A's.
        const _: () = assert!((2 * TILE * TILE_K + HOPPER_PARAM_BYTES) % 1024 == 0);
        const _: () = assert!(TILE * 16 + HOPPER_W_RECORD * 4 <= HOPPER_PARAM_BYTES);
    }

    /// Every W8A8 kernel compiles for sm_90a without spills or a stack frame, and no Hopper kernel's wgmma pipeline
    /// is serialised or given waits by ptxas (NVRTC only, no GPU). A release of the stage moved behind one merged
    /// conditional wait once serialised every wgmma (C7514) with every GPU test passing: 40% slower.
    #[test]
    fn kernels_compile_without_local_memory_or_serialised_wgmma() {
        if !crate::cuda::nvrtc_present() || crate::cuda::include_dir().is_none() {
            println!("skipped: NVRTC or cuda_fp16.h not found");
            return;
        }
        let compiled = crate::cuda::compile(&KERNEL, "sm_90a").unwrap();
        let local = compiled.local_memory();
        assert!(local.is_empty(), "{local:?}");
        let serialised = compiled.wgmma_serialisation();
        assert!(serialised.is_empty(), "{serialised:?}");
    }

    #[test]
    fn tf32_split_is_exact_to_22_bits() {
        for x in [1.0f32, -2.7182817e3, 1e-7, 12345.678, 0.1] {
            let hi = to_tf32(x);
            assert_eq!(hi.to_bits() & 0x1FFF, 0);
            let lo = to_tf32(x - hi);
            assert!(((hi as f64 + lo as f64) - x as f64).abs() <= x.abs() as f64 * 2f64.powi(-21));
        }
    }

    #[test]
    fn layouts_pad_k_and_count_blocks() {
        let l = ActivationLayout::new(3, 3884, 64).unwrap();
        assert_eq!(
            (l.blocks(), l.k_pad(), l.codes_len(), l.params_len()),
            (61, 3968, 3 * 3968, 61 * 3 * 4)
        );
        assert_eq!(l.workspace_bytes(), (3 * 3968usize).next_multiple_of(256) + 61 * 3 * 16);
        assert!(ActivationLayout::new(2, 64, 65).is_err());
        assert!(ActivationLayout::new(0, 64, 32).is_err());
    }
}
