//! 2-D convolution with per-block quantized weights (MNN's `CONV_FpAInt4B` family, seed 004).
//!
//! `out[b, co, oy, ox] = clamp(bias[co] + Σ_{ci ∈ group(co), ky, kx} x[b, ci, iy, ix] · w[co, ci, ky, kx])`
//! with `iy = oy·sh − ph + ky·dh`, `ix = ox·sw − pw + kx·dw` (taps outside the input read zero), NCHW activations
//! and output, weights a [`BlockQuantWeight`](crate::formats::block::BlockQuantWeight) of shape `[Co, Ci/groups, Kh, Kw]` dequantized as
//! `q · scale + offset` per input-channel block. The clamp is the fused activation ([`Activation`]).
//!
//! - [`reference::conv2d`]: f64 accumulation, the ground truth.
//! - [`cpu::Conv2dCpu`]: prepared once per weight, implicit GEMM over tiles (dequantization inside the tile), rayon.
//! - [`cuda::Conv2dCuda`]: the same operator on a CUDA GPU (tensor-core implicit GEMM, or a direct kernel).

pub mod cpu;
pub mod cuda;
pub mod reference;

use crate::error::{ensure, Result};
use crate::formats::block::BlockShape;

/// The activation fused into the epilogue: a clamp (none, relu, relu6; `Activation::bounds`), MNN's `minV`/`maxV`.
pub use crate::ops::activation::Activation;

/// Convolution hyper-parameters; each pair is `(height, width)`. Padding is symmetric (both sides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
    pub activation: Activation,
}

impl Conv2dParams {
    /// Checks what can be checked without the input: positive stride, dilation and groups, and `Co` (the
    /// weight's rows) divisible by `groups`.
    pub fn validate(&self, co: usize) -> Result<()> {
        ensure(
            self.stride.0 > 0 && self.stride.1 > 0,
            "stride",
            format!("{:?}", self.stride),
            "stride must be positive",
        )?;
        ensure(
            self.dilation.0 > 0 && self.dilation.1 > 0,
            "dilation",
            format!("{:?}", self.dilation),
            "dilation must be positive",
        )?;
        ensure(
            self.activation.is_clamp(),
            "activation",
            self.activation.name(),
            "a convolution fuses none, relu or relu6",
        )?;
        let g = self.groups;
        ensure(g > 0, "groups", g, "groups must be positive")?;
        ensure(
            co % g == 0,
            "groups",
            format!("{g} groups for Co = {co}"),
            "output channels must be divisible by groups",
        )
    }
}

impl Default for Conv2dParams {
    /// Stride 1, no padding, dilation 1, one group, no activation.
    fn default() -> Self {
        Self {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            activation: Activation::None,
        }
    }
}

/// The padding that keeps the spatial size at stride 1 ("same"): `dilation · (k − 1) / 2` per axis. Exact when
/// `dilation · (k − 1)` is even (every odd kernel); otherwise the output is one smaller.
pub fn same_padding(kernel: (usize, usize), dilation: (usize, usize)) -> (usize, usize) {
    (dilation.0 * (kernel.0 - 1) / 2, dilation.1 * (kernel.1 - 1) / 2)
}

/// Everything a convolution's loops need, derived and validated once from the input shape, weight and params.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    /// Input `[B, Ci, H, W]`.
    pub input: [usize; 4],
    /// Output `[B, Co, OH, OW]`.
    pub output: [usize; 4],
    /// Kernel `(Kh, Kw)`.
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl ConvGeometry {
    /// Validates the configuration and computes the output shape
    /// `OH = (H + 2·ph − dh·(Kh − 1) − 1) / sh + 1` (likewise OW).
    ///
    /// Fails with a typed error for a zero dimension, stride, dilation or group count, `Ci` or `Co` not divisible
    /// by `groups`, a weight whose input channels are not `Ci / groups`, or a dilated kernel larger than the
    /// padded input.
    pub fn new(input: [usize; 4], weight: &BlockShape, params: &Conv2dParams) -> Result<Self> {
        let [b, ci, h, w] = input;
        let (co, kernel) = (weight.rows, weight.kernel);
        params.validate(co)?;
        let g = params.groups;
        ensure(
            b > 0 && ci > 0 && h > 0 && w > 0,
            "input",
            format!("shape {input:?}"),
            "[B, Ci, H, W] must all be positive",
        )?;
        ensure(
            ci % g == 0,
            "groups",
            format!("{g} groups for Ci = {ci}"),
            "input channels must be divisible by groups",
        )?;
        ensure(
            weight.channels == ci / g,
            "weight",
            format!("shape [{co}, {}, {}, {}]", weight.channels, kernel.0, kernel.1),
            &format!("weight input channels must equal Ci / groups = {}", ci / g),
        )?;
        let out_h = out_extent(
            "input",
            h,
            kernel.0,
            params.stride.0,
            params.padding.0,
            params.dilation.0,
            "height",
        )?;
        let out_w = out_extent(
            "input",
            w,
            kernel.1,
            params.stride.1,
            params.padding.1,
            params.dilation.1,
            "width",
        )?;
        let output = [b, co, out_h, out_w];
        ensure(
            output.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).is_some()
                && input.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).is_some(),
            "input",
            format!("shape {input:?}"),
            "element counts must fit in usize",
        )?;
        Ok(Self {
            input,
            output,
            kernel,
            stride: params.stride,
            padding: params.padding,
            dilation: params.dilation,
            groups: g,
        })
    }

    /// The input row that output row `oy` reads through kernel row `ky`, or `None` where it falls in the padding.
    pub fn input_row(&self, oy: usize, ky: usize) -> Option<usize> {
        input_coordinate(oy * self.stride.0 + ky * self.dilation.0, self.padding.0, self.input[2])
    }

    /// The input column that output column `ox` reads through kernel column `kx`, or `None` in the padding.
    pub fn input_col(&self, ox: usize, kx: usize) -> Option<usize> {
        input_coordinate(ox * self.stride.1 + kx * self.dilation.1, self.padding.1, self.input[3])
    }

    /// Input channels per group.
    pub fn channels_per_group(&self) -> usize {
        self.input[1] / self.groups
    }

    /// Output channels per group.
    pub fn out_channels_per_group(&self) -> usize {
        self.output[1] / self.groups
    }

    /// Output pixels per channel `OH · OW`.
    pub fn out_pixels(&self) -> usize {
        self.output[2] * self.output[3]
    }

    /// Whether the convolution is a plain GEMM `[Co, Ci] × [Ci, H·W]` per batch (1×1, stride 1, no padding).
    pub fn is_pointwise(&self) -> bool {
        self.kernel == (1, 1) && self.stride == (1, 1) && self.padding == (0, 0)
    }
}

/// Output extent along one axis, failing when the dilated kernel does not fit the padded input.
fn out_extent(
    tensor: &str,
    size: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    axis: &str,
) -> Result<usize> {
    // Saturating: absurd user values must produce an error below, not an overflow panic.
    let padded = size.saturating_add(pad.saturating_mul(2));
    let span = dilation.saturating_mul(k - 1).saturating_add(1);
    ensure(
        span <= padded,
        tensor,
        format!("{axis} {size} with padding {pad}"),
        &format!("the dilated kernel spans {span} > padded {axis} {padded}"),
    )?;
    Ok((padded - span) / stride + 1)
}

/// Validates the optional bias: `Co` finite values.
pub(crate) fn check_bias(bias: Option<&[f32]>, co: usize) -> Result<()> {
    if let Some(bias) = bias {
        crate::formats::block::check_len("bias", bias.len(), co, "Co")?;
        crate::formats::block::check_finite("bias", bias)?;
    }
    Ok(())
}

/// `padded − padding` when it lands inside `0..extent` (a padded coordinate back to an input one).
fn input_coordinate(padded: usize, padding: usize, extent: usize) -> Option<usize> {
    padded.checked_sub(padding).filter(|&i| i < extent)
}
