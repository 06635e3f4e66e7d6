//! A convolution weight as a linear layer: what the routes of [`super::Conv2dCuda`] through the linear kernels
//! share (the Hopper GEMM for every ungrouped unit-stride convolution, the decode kernel for 1×1 convolutions of a
//! few positions). The weight is `[Co, taps·Ci]` with K in (tap, channel) order, its codes symmetric, its per-block
//! offsets carried next to the scales (`DeviceW4::upload_with_offsets`), so each weight is `(code − midpoint)·s + o
//! = q·s + o`; the bias in fp16.

use crate::cuda::{cuda_error, CudaDevice, CudaSlice};
use crate::dtype::DType;
use crate::error::Result;
use crate::formats::block::{BlockBits, BlockQuantWeight};
use crate::formats::QuantMatrix;
use crate::ops::linear::cuda::{repack_preferred, DeviceW4};
use half::f16;
use std::sync::Arc;

/// The weight on the device in the linear kernels' layout, and the bias.
#[derive(Debug)]
pub(super) struct LinearForm {
    pub weight: Arc<DeviceW4>,
    /// `[Co]` fp16.
    pub bias: CudaSlice<u16>,
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
/// offsets `[Co][groups]` likewise.
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

impl LinearForm {
    /// Repacks and uploads `weight` (int4 or int8 blocks of a multiple of 16 channels), or `None` when its scales,
    /// offsets or bias do not fit fp16 (`fp16_normal`, `fp16_finite`; the mma.sync path keeps any magnitude exact
    /// with a per-channel power of two) or its blocks do not suit the linear layout.
    pub(super) fn new(device: &CudaDevice, weight: &BlockQuantWeight, bias: &[f32]) -> Result<Option<Self>> {
        if weight.shape().block_channels % 16 != 0 {
            return Ok(None);
        }
        let (matrix, offsets) = as_linear(weight);
        if !matrix.scales.iter().all(|&v| fp16_normal(v)) || !offsets.iter().chain(bias).all(|&v| fp16_finite(v)) {
            return Ok(None);
        }
        let packed = repack_preferred(&matrix, DType::F16)?;
        let weight = DeviceW4::upload_with_offsets(device, &packed, &offsets)?;
        let bias: Vec<u16> = bias.iter().map(|&b| f16::from_f32(b).to_bits()).collect();
        let bias = device
            .stream()
            .clone_htod(&bias)
            .map_err(|e| cuda_error("upload of the convolution bias", e))?;
        Ok(Some(Self { weight, bias }))
    }
}
