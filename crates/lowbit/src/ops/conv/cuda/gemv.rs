//! The GEMV route of [`super::Conv2dCuda`]: a 1×1, unit-stride, unpadded, ungrouped convolution over a 1×1 feature
//! map (a classifier or squeeze-excitation layer on pooled features) at a batch of at most [`MAX_M_OFFSETS`] is a
//! linear layer of that many tokens, and the NCHW input already is its `[B, Ci]` token matrix, the NCHW output its
//! `[B, Co]` result. It runs on the W4A16 decode kernel (`kernels/linear_w4a16.cu`, with OFFSETS) in one launch,
//! instead of a GEMM tile that would be almost all padding.
//!
//! Larger feature maps keep the GEMM even when they are small: with a 4×4 map at batch 1 (16 positions) the two
//! transposes to and from NHWC made this route slower than the Hopper GEMM on the H200 (17.8 against 15.1 µs,
//! `bench/results/2026-11-22-h200-conv-gemv.jsonl`).

use super::super::ConvGeometry;
use super::linear_form::LinearForm;
use crate::cuda::{CudaDevice, CudaStream};
use crate::error::Result;
use crate::ops::activation::Activation;
use crate::ops::conv::Conv2dParams;
use crate::ops::linear::cuda::{CallBuffers, LinearW4A16Cuda, Tuning, MAX_M_OFFSETS};

/// The decode operator of one 1×1 convolution weight.
#[derive(Debug)]
pub(super) struct GemvConv {
    linear: LinearW4A16Cuda,
}

/// Whether `params` and a `(Kh, Kw)` kernel make a convolution a linear layer per output position.
pub(super) fn applies(kernel: (usize, usize), params: &Conv2dParams) -> bool {
    kernel == (1, 1) && params.stride == (1, 1) && params.padding == (0, 0) && params.groups == 1
}

impl GemvConv {
    pub(super) fn new(device: &CudaDevice, form: &LinearForm) -> Result<Self> {
        Ok(Self {
            linear: LinearW4A16Cuda::with_weight(device, form.weight.clone(), MAX_M_OFFSETS, Tuning::default())?,
        })
    }

    /// Whether a convolution of geometry `geo` takes this route: a 1×1 map at a batch of at most
    /// [`MAX_M_OFFSETS`].
    pub(super) fn takes(geo: &ConvGeometry) -> bool {
        let [batch, _, oh, ow] = geo.output;
        (oh, ow) == (1, 1) && batch <= MAX_M_OFFSETS
    }

    /// Workspace: the decode kernel's.
    pub(super) fn workspace_bytes(&self) -> usize {
        self.linear.workspace_bytes()
    }

    /// `y = conv(x)` for NCHW fp16 `x` and `y`, with the fp16 `bias` (`[Co]`) and `activation`. Buffers were checked
    /// by the caller (`x`, `y`, `ws` of `workspace_bytes`), and `takes(geo)` holds.
    pub(super) fn run(
        &self,
        stream: &CudaStream,
        geo: &ConvGeometry,
        activation: Activation,
        (x, y, workspace, bias): (u64, u64, u64, u64),
    ) -> Result<()> {
        let [batch, ci, _, _] = geo.input;
        if batch == 0 {
            return Ok(());
        }
        let clamp = (activation != Activation::None).then(|| activation.bounds());
        let buffers = CallBuffers { x, y, bias, workspace };
        self.linear
            .launch(stream, batch, &buffers, (ci, geo.output[1]), clamp, Activation::None)
    }
}
