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
use super::linear_form::LinearForm;
use crate::cuda::LaunchConfig;
use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaStream};
use crate::error::{Error, Result};
use crate::formats::block::BlockQuantWeight;
use crate::ops::activation::Activation;
use crate::ops::linear::cuda::gemm::{ConvFields, ConvLaunch, LinearW4A16Gemm};
use cudarc::driver::PushKernelArg;

/// Channels per TMA box: a box never straddles two taps when `Ci` is a multiple of it.
const BOX_CHANNELS: usize = 64;

/// The Hopper convolution of one weight: the GEMM operator on its [`LinearForm`].
#[derive(Debug)]
pub(super) struct HopperConv {
    gemm: LinearW4A16Gemm,
    /// `conv_pack_nhwc_f16` of `conv.cu`.
    pack: CudaFunction,
}

/// Whether the Hopper path can run this convolution: an sm_90 GPU, int4 or int8 codes, one group, unit stride, `Ci`
/// a multiple of 64. (The weight must also have a [`LinearForm`]: blocks of a multiple of 16 channels, scales and
/// offsets that fit fp16.)
pub(super) fn applies(device: &CudaDevice, weight: &BlockQuantWeight, groups: usize, stride: (usize, usize)) -> bool {
    device.info().compute_capability.0 == 9
        && groups == 1
        && stride == (1, 1)
        && weight.shape().channels % BOX_CHANNELS == 0
}

impl HopperConv {
    /// The GEMM's convolution form of `form`, or `None` when its tiles do not suit the GEMM (64-column tiles).
    pub(super) fn new(device: &CudaDevice, form: &LinearForm) -> Result<Option<Self>> {
        if !matches!(form.weight.plan().n_cta, 128 | 256) {
            return Ok(None);
        }
        Ok(Some(Self {
            gemm: LinearW4A16Gemm::for_conv(device, form.weight.clone())?,
            pack: device.function(&super::KERNEL, "conv_pack_nhwc_f16")?,
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

    /// Pads and transposes `x` (NCHW fp16 at `x`) into the workspace, then runs the GEMM into `y` (NCHW fp16) with
    /// the fp16 `bias` (`[Co]`). Buffers were checked by the caller (`x`, `y`, `ws` of `workspace_bytes`).
    pub(super) fn run(
        &self,
        stream: &CudaStream,
        geo: &ConvGeometry,
        activation: Activation,
        (x, y, ws, bias): (u64, u64, u64, u64),
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
            bias,
            activation,
            geometry,
        };
        self.gemm.run_conv(stream, &launch)
    }
}
