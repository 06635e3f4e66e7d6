//! The GEMV route of [`super::Conv2dCuda`]: a 1×1, unit-stride, unpadded, ungrouped convolution over at most
//! [`MAX_M_OFFSETS`] output positions (batch × OH × OW: a classifier or squeeze-excitation 1×1 on pooled features,
//! or a tiny feature map at batch 1) is a linear layer of that many tokens, and runs on the W4A16 decode kernel
//! (`kernels/linear_w4a16.cu`, with OFFSETS) instead of a GEMM tile that would be mostly padding.
//!
//! With a 1×1 feature map the NCHW input already is the `[B, Ci]` token matrix and the output the `[B, Co]` one, so
//! the convolution is one launch. Otherwise the input is transposed to NHWC (the convolution's pack kernel) and the
//! `[positions, Co]` result transposed back to NCHW by the same kernel, through the workspace.

use super::super::ConvGeometry;
use super::linear_form::LinearForm;
use crate::cuda::LaunchConfig;
use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaStream};
use crate::error::{Error, Result};
use crate::ops::activation::Activation;
use crate::ops::conv::Conv2dParams;
use crate::ops::linear::cuda::{CallBuffers, LinearW4A16Cuda, Tuning, MAX_M_OFFSETS};
use cudarc::driver::PushKernelArg;

/// The decode operator of one 1×1 convolution weight.
#[derive(Debug)]
pub(super) struct GemvConv {
    linear: LinearW4A16Cuda,
    /// `conv_pack_nhwc_f16` of `conv.cu`: NCHW → NHWC, and with the roles of the axes swapped, back.
    pack: CudaFunction,
}

/// Whether `params` and a `(Kh, Kw)` kernel make a convolution a linear layer per output position.
pub(super) fn applies(kernel: (usize, usize), params: &Conv2dParams) -> bool {
    kernel == (1, 1) && params.stride == (1, 1) && params.padding == (0, 0) && params.groups == 1
}

impl GemvConv {
    pub(super) fn new(device: &CudaDevice, form: &LinearForm) -> Result<Self> {
        Ok(Self {
            linear: LinearW4A16Cuda::with_weight(device, form.weight.clone(), MAX_M_OFFSETS, Tuning::default())?,
            pack: device.function(&super::KERNEL, "conv_pack_nhwc_f16")?,
        })
    }

    /// Whether a convolution of geometry `geo` takes this route: at most [`MAX_M_OFFSETS`] output positions.
    pub(super) fn takes(geo: &ConvGeometry) -> bool {
        geo.output[0] * geo.output[2] * geo.output[3] <= MAX_M_OFFSETS
    }

    /// Bytes of each NHWC staging buffer (none for a 1×1 feature map), 256-byte rounded.
    fn staging_bytes(geo: &ConvGeometry) -> (usize, usize) {
        let [batch, ci, h, w] = geo.input;
        if h * w == 1 {
            return (0, 0);
        }
        let co = geo.output[1];
        let rounded = |channels: usize| (batch * h * w * channels * 2).next_multiple_of(256);
        (rounded(ci), rounded(co))
    }

    /// Workspace: the decode kernel's, then the NHWC input and output.
    pub(super) fn workspace_bytes(&self, geo: &ConvGeometry) -> usize {
        let (xt, yt) = Self::staging_bytes(geo);
        self.linear.workspace_bytes().next_multiple_of(256) + xt + yt
    }

    /// Launches `conv_pack_nhwc_f16` on `[batch][c][h·w]` at `src`, writing `[batch][h·w][c]` to `dst`.
    fn transpose(&self, stream: &CudaStream, (src, dst): (u64, u64), [batch, c, hw]: [usize; 3]) -> Result<()> {
        let (c_arg, h_arg, w_arg, no_padding) = (c as i32, hw as i32, 1i32, 0i32);
        let mut b = stream.launch_builder(&self.pack);
        b.arg(&src)
            .arg(&dst)
            .arg(&c_arg)
            .arg(&h_arg)
            .arg(&w_arg)
            .arg(&no_padding)
            .arg(&no_padding);
        let cfg = LaunchConfig {
            grid_dim: (hw.div_ceil(64) as u32, c.div_ceil(64) as u32, batch as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads batch·c·hw fp16 at `src` and writes as many at `dst`; the caller checked both buffers.
        unsafe { b.launch(cfg) }.map_err(launch_error("conv_pack_nhwc (1x1 route)"))?;
        Ok(())
    }

    /// `y = conv(x)` for NCHW fp16 `x` and `y`, with the fp16 `bias` (`[Co]`) and `activation`. Buffers were checked
    /// by the caller (`x`, `y`, `ws` of `workspace_bytes`), and `takes(geo)` holds.
    pub(super) fn run(
        &self,
        stream: &CudaStream,
        geo: &ConvGeometry,
        activation: Activation,
        (x, y, ws, bias): (u64, u64, u64, u64),
    ) -> Result<()> {
        let [batch, ci, h, w] = geo.input;
        let (co, hw) = (geo.output[1], h * w);
        let positions = batch * hw;
        if positions == 0 {
            return Ok(());
        }
        if batch > 65535 || ci.div_ceil(64) > 65535 || co.div_ceil(64) > 65535 {
            return Err(Error::invalid(
                "input",
                format!("shape {:?}", geo.input),
                "too large for one launch",
            ));
        }
        let clamp = (activation != Activation::None).then(|| activation.bounds());
        let linear_ws = ws;
        let (xt_bytes, _) = Self::staging_bytes(geo);
        let staged = hw > 1;
        let (xt, yt) = {
            let base = ws + self.linear.workspace_bytes().next_multiple_of(256) as u64;
            (base, base + xt_bytes as u64)
        };
        if staged {
            self.transpose(stream, (x, xt), [batch, ci, hw])?;
        }
        let buffers = CallBuffers {
            x: if staged { xt } else { x },
            y: if staged { yt } else { y },
            bias,
            workspace: linear_ws,
        };
        self.linear.launch(stream, positions, &buffers, (ci, co), clamp)?;
        if staged {
            // [batch][hw][co] back to [batch][co][hw]: the same transpose with hw as the "channels".
            self.transpose(stream, (yt, y), [batch, hw, co])?;
        }
        Ok(())
    }
}
