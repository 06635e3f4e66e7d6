//! [`ConvInt8Cuda`]: the int8 convolution on the GPU. The same integer dot and the same f32 epilogue as
//! [`super::ConvInt8Cpu`], so both give the same output codes bit for bit. Two routes (`kernels/conv.cu`):
//! - **GEMM** (one group, cuBLASLt present): the `[B·OH·OW][taps]` int8 patches go to the workspace, cuBLASLt's
//!   int8 tensor-core GEMM forms every int32 dot, `conv_int8_epilogue` applies the epilogue and writes NCHW. With
//!   Ci a multiple of 16 the patches come from a padded NHWC copy (`conv_pack_nhwc_i8`, then
//!   `conv_int8_im2col_nhwc`: taps in (ky, kx, channel) order, 16 bytes per load); otherwise `conv_int8_im2col`
//!   gathers each code from NCHW. The integer dots are exact whoever computes them.
//! - **Direct** (groups, depthwise, or no cuBLASLt): `conv_int8`, a dp4a implicit GEMM on the CUDA cores.

use super::{prepare, ConvInt8Params};
use crate::cuda::checked_buffer as buffer;
use crate::cuda::{cuda_error, launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use crate::cuda::{DevicePtrMut, DeviceRepr, LaunchConfig};
use crate::error::{Error, Result};
use crate::formats::block::{BlockQuantWeight, BlockShape};
use crate::ops::conv::cuda::{ConvShape, KERNEL};
use crate::ops::conv::ConvGeometry;
use crate::ops::w8a8::cuda::CublasLtInt8;
use cudarc::driver::PushKernelArg;
use std::sync::Mutex;

/// Taps per step of the kernel (`I8_STEP`): each weight row is padded with zeros to a multiple of it.
const STEP: usize = 32;
/// Output channels and pixels per CTA (`I8_TILE`).
const TILE: usize = 64;

/// Bytes of the padded NHWC int8 copy of the input (the GEMM route's NHWC patches), 256-byte rounded.
fn padded_image_bytes(geo: &ConvGeometry) -> usize {
    let [batch, ci, h, w] = geo.input;
    (batch * (h + 2 * geo.padding.0) * (w + 2 * geo.padding.1) * ci).next_multiple_of(256)
}

/// The GEMM route's rows: the output pixels rounded up to 16 (zero patches), which cuBLASLt's int8 kernels take.
fn gemm_rows(pixels: usize) -> usize {
    pixels.next_multiple_of(16)
}

/// `lowbit::conv::Int8Args` in the kernel: a `ConvShape`, 5 pointers, 5 ints, then 2 pointers.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Int8Args {
    shape: ConvShape,
    weight: u64,
    m: u64,
    bias: u64,
    x: u64,
    out: u64,
    taps: i32,
    taps_pad: i32,
    zero_point: i32,
    q_lo: i32,
    q_hi: i32,
    cols: u64,
    acc: u64,
}

// SAFETY: plain-old-data `#[repr(C)]` struct laid out like `lowbit::conv::Int8Args` (i32/f32 fields, u64 pointers).
unsafe impl DeviceRepr for Int8Args {}

/// An int8 convolution prepared once on the device (weight checked, epilogue folded, codes uploaded) for any input
/// shape.
pub struct ConvInt8Cuda {
    context: std::sync::Arc<cudarc::driver::CudaContext>,
    /// The device's stream: cuBLASLt plans allocate their workspace on it.
    alloc_stream: std::sync::Arc<CudaStream>,
    shape: BlockShape,
    params: ConvInt8Params,
    /// `[Co][taps_pad]` weight codes, zero past the taps.
    weight: CudaSlice<i8>,
    m: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    q_lo: i32,
    q_hi: i32,
    taps_pad: usize,
    direct: CudaFunction,
    /// The GEMM route's kernels and its cuBLASLt plans, one per B·OH·OW met so far (`None`: the direct route).
    gemm: Option<GemmRoute>,
}

struct GemmRoute {
    im2col: CudaFunction,
    epilogue: CudaFunction,
    plans: Mutex<Vec<(usize, CublasLtInt8)>>,
    /// Ci a multiple of 16: the patches come from a padded NHWC copy, 16 channels per load, with the weight's taps
    /// in (ky, kx, channel) order to match.
    nhwc: Option<NhwcPatches>,
}

struct NhwcPatches {
    pack: CudaFunction,
    im2col: CudaFunction,
    /// `[Co][taps_pad]` codes in (ky, kx, channel) order.
    weight: CudaSlice<i8>,
}

impl ConvInt8Cuda {
    /// Validates `weight` (int8, symmetric, one scale per output channel), `bias` (Co values) and `params`, and
    /// uploads the weight and the per-channel epilogue.
    pub fn new(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        params: ConvInt8Params,
    ) -> Result<Self> {
        Self::with_route(device, weight, bias, params, false)
    }

    /// As [`ConvInt8Cuda::new`], with `direct` forcing the dp4a kernel where the GEMM route applies (tests, bench).
    #[doc(hidden)]
    pub fn with_route(
        device: &CudaDevice,
        weight: &BlockQuantWeight,
        bias: Option<&[f32]>,
        params: ConvInt8Params,
        direct: bool,
    ) -> Result<Self> {
        let epilogue = prepare(weight, bias, &params)?;
        let shape = *weight.shape();
        let taps = shape.cols();
        let taps_pad = taps.next_multiple_of(STEP);
        if shape.rows * taps_pad > i32::MAX as usize {
            return Err(Error::invalid(
                "weight",
                format!("{} x {taps} codes", shape.rows),
                "must fit in i32 elements for the CUDA kernel",
            ));
        }
        let mut codes = vec![0i8; shape.rows * taps_pad];
        for (row, src) in codes.chunks_exact_mut(taps_pad).zip(weight.codes().chunks_exact(taps)) {
            row[..taps].copy_from_slice(src);
        }
        let stream = device.stream();
        let upload_err = |e| cuda_error("upload of the int8 convolution", e);
        Ok(Self {
            shape,
            params,
            weight: stream.clone_htod(&codes).map_err(upload_err)?,
            m: stream.clone_htod(&epilogue.m).map_err(upload_err)?,
            bias: stream.clone_htod(&epilogue.bias).map_err(upload_err)?,
            q_lo: epilogue.lo,
            q_hi: epilogue.hi,
            taps_pad,
            direct: device.function(&KERNEL, "conv_int8")?,
            gemm: if !direct && params.conv.groups == 1 && crate::cuda::cublaslt_present() {
                let nhwc = if shape.channels % 16 == 0 {
                    // (channel, ky, kx) -> (ky, kx, channel) within each padded row.
                    let (ci, kk) = (shape.channels, shape.kernel.0 * shape.kernel.1);
                    let mut reordered = vec![0i8; codes.len()];
                    for (dst, src) in reordered.chunks_exact_mut(taps_pad).zip(codes.chunks_exact(taps_pad)) {
                        for c in 0..ci {
                            for k in 0..kk {
                                dst[k * ci + c] = src[c * kk + k];
                            }
                        }
                    }
                    Some(NhwcPatches {
                        pack: device.function(&KERNEL, "conv_pack_nhwc_i8")?,
                        im2col: device.function(&KERNEL, "conv_int8_im2col_nhwc")?,
                        weight: stream.clone_htod(&reordered).map_err(upload_err)?,
                    })
                } else {
                    None
                };
                Some(GemmRoute {
                    im2col: device.function(&KERNEL, "conv_int8_im2col")?,
                    epilogue: device.function(&KERNEL, "conv_int8_epilogue")?,
                    plans: Mutex::new(Vec::new()),
                    nhwc,
                })
            } else {
                None
            },
            context: device.context().clone(),
            alloc_stream: device.stream().clone(),
        })
    }

    /// Whether calls take the GEMM route (im2col, cuBLASLt int8, epilogue) rather than the dp4a kernel.
    pub fn uses_gemm(&self) -> bool {
        self.gemm.is_some()
    }

    /// Bytes of workspace [`ConvInt8Cuda::run`] needs for `input`: the GEMM route's patches and int32 dots (0 for
    /// the direct route).
    pub fn workspace_bytes(&self, input: [usize; 4]) -> Result<usize> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params.conv)?;
        Ok(match &self.gemm {
            Some(gemm) => {
                let rows = gemm_rows(geo.output[0] * geo.output[2] * geo.output[3]);
                let image = if gemm.nhwc.is_some() {
                    padded_image_bytes(&geo)
                } else {
                    0
                };
                (rows * self.taps_pad).next_multiple_of(256)
                    + (rows * self.shape.rows * 4).next_multiple_of(256)
                    + image
            }
            None => 0,
        })
    }

    /// The output shape `[B, Co, OH, OW]` for `input` `[B, Ci, H, W]`, or the error that input would give.
    pub fn output_shape(&self, input: [usize; 4]) -> Result<[usize; 4]> {
        Ok(ConvGeometry::new(input, &self.shape, &self.params.conv)?.output)
    }

    /// `y = ConvInt8(x)` on `stream` for int8 NCHW `x` of shape `input`; `y` must hold `B · Co · OH · OW` codes. Only
    /// `y`'s first `B · Co · OH · OW` elements are written.
    pub fn run(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<i8>,
        input: [usize; 4],
        y: &mut dyn DevicePtrMut<i8>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let geo = ConvGeometry::new(input, &self.shape, &self.params.conv)?;
        let shape = ConvShape::for_launch(&geo, (0.0, 0.0))?;
        let [batch, _, _, _] = input;
        let [_, _, oh, ow] = geo.output;
        let groups = geo.groups * geo.out_channels_per_group().div_ceil(TILE);
        if batch > 65535 || groups > 65535 {
            return Err(Error::invalid(
                "input",
                format!("shape {input:?}"),
                "too large for one launch of the CUDA kernel (batch and channel tiles ≤ 65535)",
            ));
        }
        let x_ptr = buffer(x.device_ptr(stream).0, x.len(), input.iter().product(), "x", 1)?;
        let y_len = y.len();
        let y_ptr = buffer(y.device_ptr_mut(stream).0, y_len, geo.output.iter().product(), "y", 1)?;
        let ws_len = workspace.len();
        let ws_ptr = buffer(
            workspace.device_ptr_mut(stream).0,
            ws_len,
            self.workspace_bytes(input)?,
            "workspace",
            256,
        )?;
        let rows = batch * oh * ow;
        let mut args = Int8Args {
            shape,
            weight: self.weight.device_ptr(stream).0,
            m: self.m.device_ptr(stream).0,
            bias: self.bias.device_ptr(stream).0,
            x: x_ptr,
            out: y_ptr,
            taps: self.shape.cols() as i32,
            taps_pad: self.taps_pad as i32,
            zero_point: i32::from(self.params.input.zero_point),
            q_lo: self.q_lo,
            q_hi: self.q_hi,
            cols: ws_ptr,
            acc: ws_ptr + (gemm_rows(rows) * self.taps_pad).next_multiple_of(256) as u64,
        };
        if let Some(gemm) = &self.gemm {
            return self.run_gemm(stream, gemm, &mut args, &geo);
        }
        let cfg = LaunchConfig {
            grid_dim: ((oh * ow).div_ceil(TILE) as u32, groups as u32, batch as u32),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.direct);
        b.arg(&args);
        // SAFETY: x holds B·Ci·H·W codes and y B·Co·OH·OW (checked above); the kernel reads taps inside the image
        // only, weight rows of taps_pad codes for the Co channels, and writes each output element once.
        unsafe { b.launch(cfg) }.map_err(launch_error("conv_int8"))?;
        Ok(())
    }

    /// The GEMM route: patches, cuBLASLt int8 (`[rows][taps_pad] · [Co][taps_pad]^T`), epilogue.
    fn run_gemm(&self, stream: &CudaStream, gemm: &GemmRoute, args: &mut Int8Args, geo: &ConvGeometry) -> Result<()> {
        let [batch, ci, h, w] = geo.input;
        let rows = batch * geo.output[2] * geo.output[3];
        let padded = gemm_rows(rows);
        let words = padded * self.taps_pad / 4;
        let (hp, wp) = (h + 2 * geo.padding.0, w + 2 * geo.padding.1);
        if rows > i32::MAX as usize
            || words.div_ceil(256) > i32::MAX as usize
            || rows.div_ceil(32) > i32::MAX as usize
            || (hp * wp).div_ceil(64) > i32::MAX as usize
        {
            return Err(Error::invalid(
                "input",
                format!("{rows} output pixels"),
                "too large for one launch of the CUDA kernels",
            ));
        }
        let mut weight = args.weight;
        if let Some(nhwc) = &gemm.nhwc {
            // The padded NHWC copy sits after the patches and the dots in the workspace.
            let image = args.acc + (padded * self.shape.rows * 4).next_multiple_of(256) as u64;
            let (c_arg, h_arg, w_arg) = (ci as i32, h as i32, w as i32);
            let (ph, pw, zero) = (
                geo.padding.0 as i32,
                geo.padding.1 as i32,
                i32::from(self.params.input.zero_point),
            );
            let mut b = stream.launch_builder(&nhwc.pack);
            b.arg(&args.x)
                .arg(&image)
                .arg(&c_arg)
                .arg(&h_arg)
                .arg(&w_arg)
                .arg(&ph)
                .arg(&pw)
                .arg(&zero);
            let cfg = LaunchConfig {
                grid_dim: ((hp * wp).div_ceil(64) as u32, ci.div_ceil(64) as u32, batch as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: reads the B·Ci·H·W codes of x and writes B·Hp·Wp·Ci codes into the workspace (both checked by
            // `run`).
            unsafe { b.launch(cfg) }.map_err(launch_error("conv_pack_nhwc_i8"))?;
            let mut b = stream.launch_builder(&nhwc.im2col);
            b.arg(&*args).arg(&image);
            let cfg = LaunchConfig {
                grid_dim: (words.div_ceil(4 * 256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one thread per 16 bytes of the rows x taps_pad patches (checked by `run`); every load is inside
            // the padded copy (output positions map inside it by construction).
            unsafe { b.launch(cfg) }.map_err(launch_error("conv_int8_im2col_nhwc"))?;
            weight = nhwc.weight.device_ptr(stream).0;
        } else {
            let mut b = stream.launch_builder(&gemm.im2col);
            b.arg(&*args);
            let cfg = LaunchConfig {
                grid_dim: (words.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: one thread per 4-byte word of the rows x taps_pad patches in the workspace (checked by `run`);
            // it reads x only inside the image.
            unsafe { b.launch(cfg) }.map_err(launch_error("conv_int8_im2col"))?;
        }
        {
            let mut plans = gemm.plans.lock().unwrap_or_else(|e| e.into_inner());
            if !plans.iter().any(|(m, _)| *m == padded) {
                let plan = CublasLtInt8::on(
                    &self.context,
                    &self.alloc_stream,
                    padded,
                    self.shape.rows,
                    self.taps_pad,
                )?;
                plans.push((padded, plan));
            }
            let plan = &mut plans.iter_mut().find(|(m, _)| *m == padded).expect("inserted above").1;
            plan.run_raw(stream, weight, args.cols, args.acc)?;
        }
        let mut b = stream.launch_builder(&gemm.epilogue);
        b.arg(&*args);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(32) as u32, self.shape.rows.div_ceil(32) as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads the rows x Co int32 dots in the workspace and writes each of y's B·Co·OH·OW codes once
        // (checked by `run`).
        unsafe { b.launch(cfg) }.map_err(launch_error("conv_int8_epilogue"))?;
        Ok(())
    }
}
