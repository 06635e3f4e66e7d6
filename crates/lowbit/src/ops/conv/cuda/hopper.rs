//! The Hopper path of [`super::Conv2dCuda`]: an ungrouped, stride-1 int4 or int8 convolution computed by the W4A16
//! wgmma GEMM (`kernels/linear_w4a16_gemm.cu`, section CONVOLUTION) instead of the mma.sync implicit GEMM. int8
//! codes take the GEMM's int8 layout (`repack_int8`, the kernel's INT8 CODES): one byte per weight, converted at
//! the cost of int4 codes.
//!
//! The input is first written as a zero-padded NHWC fp16 image `[B][H + 2ph][W + 2pw][Ci]` (one transpose kernel).
//! Tokens are the positions of that padded grid, so the activations of kernel tap `(r, s)` for tokens `m..m + BM`
//! are simply rows `m + r·dh·Wp + s·dw ..` of the image: one TMA box per 64 channels, no im2col anywhere. The
//! weight is the layer `[Co, Kh·Kw·Ci]` with K in (tap, channel) order, repacked like any linear weight, its
//! per-block offsets carried next to the scales (`q·s + o` per pair, one fp16 rounding as in `conv.cu`).
//! The positions of the right and bottom padding bands are computed and dropped by the epilogue, which writes
//! NCHW: the extra work is `(H + 2ph)(W + 2pw) / (OH·OW) − 1` (7% at 56×56 with a 3×3 kernel).

use super::super::ConvGeometry;
use crate::cuda::LaunchConfig;
use crate::cuda::{cuda_error, launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::formats::block::{BlockBits, BlockQuantWeight};
use crate::formats::QuantMatrix;
use crate::ops::activation::Activation;
use crate::ops::linear::cuda::gemm::{ConvFields, ConvLaunch, LinearW4A16Gemm};
use crate::ops::linear::cuda::{param_slot, repack_preferred, DeviceW4};
use cudarc::driver::PushKernelArg;
use half::f16;

/// Channels per TMA box: a box never straddles two taps when `Ci` is a multiple of it.
const BOX_CHANNELS: usize = 64;

/// The Hopper convolution of one weight: the GEMM operator, the weight's offsets and the bias in fp16.
#[derive(Debug)]
pub(super) struct HopperConv {
    gemm: LinearW4A16Gemm,
    /// `conv_pack_nhwc_f16` of `conv.cu`.
    pack: CudaFunction,
    /// `[n_tiles][group_rows][n_cta]` fp16 offsets, laid out like the repacked scales.
    offsets: CudaSlice<u16>,
    /// `[Co]` fp16.
    bias: CudaSlice<u16>,
}

/// Whether the Hopper path can run this convolution: an sm_90 GPU, int4 or int8 codes, one group, unit stride, `Ci`
/// a multiple of 64, blocks of a multiple of 16 channels. (The weight's scales and offsets must also be fp16
/// numbers: [`HopperConv::new`] checks them.)
pub(super) fn applies(device: &CudaDevice, weight: &BlockQuantWeight, groups: usize, stride: (usize, usize)) -> bool {
    let shape = weight.shape();
    device.info().compute_capability.0 == 9
        && groups == 1
        && stride == (1, 1)
        && shape.channels % BOX_CHANNELS == 0
        && shape.block_channels % 16 == 0
}

/// An fp16 number that keeps `v` to fp16 precision: zero, or a normal fp16 value. (Scales: every weight of the
/// block is relative to its scale.)
fn fp16_normal(v: f32) -> bool {
    v == 0.0 || (v.abs() >= f16::MIN_POSITIVE.to_f32() && v.abs() <= f16::MAX.to_f32())
}

/// A term added to the weights (an offset) or the outputs (the bias) fits fp16 when it is finite there: a
/// subnormal one is off by at most 2^-25, below half a unit of the last place of any weight `q·s` with `q ≠ 0`
/// and a normal scale. (int8 blocks of symmetric-ish data have offsets near 0: `max − 127·scale`.)
fn fp16_finite(v: f32) -> bool {
    v.abs() <= f16::MAX.to_f32()
}

/// The convolution weight as a linear `[Co, taps·Ci]` weight with K in (tap, channel) order: codes `q + 8` (int4)
/// or `q + 128` (int8), symmetric (the zero is the midpoint), the block scales repeated for every tap; and the
/// offsets `[Co][groups]` likewise, so that each weight is `(code − midpoint)·s + o = q·s + o`.
fn as_linear(weight: &BlockQuantWeight) -> (QuantMatrix, Vec<f32>) {
    let shape = weight.shape();
    let (co, ci, taps, blocks) = (shape.rows, shape.channels, shape.taps(), shape.blocks());
    let bits: u8 = if weight.bits() == BlockBits::Int8 { 8 } else { 4 };
    let midpoint = 1i32 << (bits - 1);
    let k = taps * ci;
    let mut codes = vec![0u8; co * k];
    for (n, row) in codes.chunks_exact_mut(k).enumerate() {
        for c in 0..ci {
            for tap in 0..taps {
                row[tap * ci + c] = (weight.codes()[(n * ci + c) * taps + tap] as i32 + midpoint) as u8;
            }
        }
    }
    let groups = taps * blocks;
    let mut scales = vec![0f32; co * groups];
    let mut offsets = vec![0f32; co * groups];
    for n in 0..co {
        for tap in 0..taps {
            for b in 0..blocks {
                let g = n * groups + tap * blocks + b;
                (scales[g], offsets[g]) = (weight.scales()[n * blocks + b], weight.offsets()[n * blocks + b]);
            }
        }
    }
    let matrix = QuantMatrix {
        n: co,
        k,
        bits,
        group_size: shape.block_channels,
        codes,
        zeros: None,
        scales,
        scale_dtype: DType::F32,
        g_idx: None,
    };
    (matrix, offsets)
}

impl HopperConv {
    /// Repacks and uploads `weight` for the GEMM, or `None` when its scales, offsets or bias do not fit fp16
    /// (`fp16_normal`, `fp16_finite`; the mma.sync path keeps any magnitude exact with a per-channel power of two)
    /// or its tiles do not suit the GEMM.
    pub(super) fn new(device: &CudaDevice, weight: &BlockQuantWeight, bias: &[f32]) -> Result<Option<Self>> {
        let (matrix, offsets) = as_linear(weight);
        if !matrix.scales.iter().all(|&v| fp16_normal(v)) || !offsets.iter().chain(bias).all(|&v| fp16_finite(v)) {
            return Ok(None);
        }
        let packed = repack_preferred(&matrix, DType::F16)?;
        let plan = &packed.plan;
        if !matches!(plan.n_cta, 128 | 256) {
            return Ok(None);
        }
        // Offsets in the scales' layout: [n tile][group row][column in param_slot order]; padding stays 0.
        let groups = matrix.groups();
        let mut laid = vec![0u16; plan.n_tiles() * plan.group_rows * plan.n_cta];
        for n in 0..matrix.n {
            let (nt, c) = (n / plan.n_cta, n % plan.n_cta);
            for g in 0..groups {
                laid[(nt * plan.group_rows + g) * plan.n_cta + param_slot(c)] =
                    f16::from_f32(offsets[n * groups + g]).to_bits();
            }
        }
        let upload_err = |e| cuda_error("upload of the convolution weight (Hopper path)", e);
        let stream = device.stream();
        let offsets = stream.clone_htod(&laid).map_err(upload_err)?;
        let bias: Vec<u16> = bias.iter().map(|&b| f16::from_f32(b).to_bits()).collect();
        let bias = stream.clone_htod(&bias).map_err(upload_err)?;
        let gemm = LinearW4A16Gemm::for_conv(device, DeviceW4::upload(device, &packed)?)?;
        let pack = device.function(&super::KERNEL, "conv_pack_nhwc_f16")?;
        Ok(Some(Self {
            gemm,
            pack,
            offsets,
            bias,
        }))
    }

    /// The padded grid of `geo`: `(Hp, Wp)`.
    fn grid(geo: &ConvGeometry) -> (usize, usize) {
        let [_, _, h, w] = geo.input;
        (h + 2 * geo.padding.0, w + 2 * geo.padding.1)
    }

    /// Bytes of the padded NHWC image (256-byte rounded).
    fn image_bytes(geo: &ConvGeometry) -> usize {
        let (hp, wp) = Self::grid(geo);
        (geo.input[0] * hp * wp * geo.input[1] * 2).next_multiple_of(256)
    }

    /// Diagnostics: the GEMM's CTA timeline hook ([`LinearW4A16Gemm::set_trace`]).
    pub(super) fn set_trace(&mut self, address: u64) {
        self.gemm.set_trace(address);
    }

    /// Workspace: the padded image.
    pub(super) fn workspace_bytes(&self, geo: &ConvGeometry) -> usize {
        Self::image_bytes(geo)
    }

    /// Pads and transposes `x` (NCHW fp16 at `x`) into the workspace, then runs the GEMM into `y` (NCHW fp16).
    /// Buffers were checked by the caller (`x`, `y`, `ws` of `workspace_bytes`).
    pub(super) fn run(
        &self,
        stream: &CudaStream,
        geo: &ConvGeometry,
        activation: Activation,
        (x, y, ws): (u64, u64, u64),
    ) -> Result<()> {
        let [batch, ci, h, w] = geo.input;
        let [_, _, oh, ow] = geo.output;
        let (hp, wp) = Self::grid(geo);
        let fits = |v: usize| v <= i32::MAX as usize;
        if !fits(batch * hp * wp) || batch > 65535 || ci.div_ceil(64) > 65535 {
            return Err(Error::invalid(
                "input",
                format!("shape {:?}", geo.input),
                "too large for one launch",
            ));
        }
        let (c_arg, h_arg, w_arg) = (ci as i32, h as i32, w as i32);
        let (ph, pw) = (geo.padding.0 as i32, geo.padding.1 as i32);
        let mut b = stream.launch_builder(&self.pack);
        b.arg(&x).arg(&ws).arg(&c_arg).arg(&h_arg).arg(&w_arg).arg(&ph).arg(&pw);
        let cfg = LaunchConfig {
            grid_dim: ((hp * wp).div_ceil(64) as u32, ci.div_ceil(64) as u32, batch as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads the B·Ci·H·W elements of x and writes B·Hp·Wp·Ci f16 at the start of the workspace, which
        // holds image_bytes (both checked by the caller).
        unsafe { b.launch(cfg) }.map_err(launch_error("conv_pack_nhwc (padded)"))?;

        let (kh, kw) = geo.kernel;
        let geometry = ConvFields {
            channels: ci as i32,
            kernel_w: kw as i32,
            tap_row: (geo.dilation.0 * wp) as i32,
            tap_col: geo.dilation.1 as i32,
            taps: (kh * kw) as i32,
            grid_tokens: (hp * wp) as i32,
            grid_w: wp as i32,
            out_h: oh as i32,
            out_w: ow as i32,
            batch: batch as i32,
            out_plane: (oh * ow) as i64,
        };
        let launch = ConvLaunch {
            x: ws,
            y,
            bias: self.bias.device_ptr(stream).0,
            offsets: self.offsets.device_ptr(stream).0,
            activation,
            geometry,
        };
        self.gemm.run_conv(stream, &launch)
    }
}
