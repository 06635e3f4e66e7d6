//! Dequantization on a CUDA GPU: packed int4 (AWQ, GPTQ, compressed-tensors) or int8 per-channel weights in,
//! `W^T` out, as a row-major `[K, N]` f16/bf16 matrix (what AutoAWQ's dequantize returns and what a GEMM computing
//! `x[M, K] · W^T` consumes). Results are bit-exact: every element is `round((q - z) · s)` with one rounding.
//!
//! Operator pattern (shared by every CUDA op of lowbit):
//! ```no_run
//! # use lowbit::{DType, cuda::CudaDevice, ops::dequantize::cuda::*};
//! # fn main() -> lowbit::Result<()> {
//! let dev = CudaDevice::new(0)?;
//! let desc = DequantDesc { layout: Int4Layout::Awq, k: 4096, n: 4096, group_size: 128, zeros: true,
//!                          g_idx: false, dtype: DType::F16 };
//! let op = DequantizeInt4::new(&dev, desc)?;           // validates once, compiles/loads the kernel once
//! # let (qweight, qzeros, scales) = (dev.alloc_zeros::<i32>(4096 * 512)?, dev.alloc_zeros::<i32>(32 * 512)?,
//! #     dev.alloc_zeros::<half::f16>(32 * 4096)?);
//! let mut out = dev.alloc_zeros::<half::f16>(4096 * 4096)?;  // [K, N]
//! let weight = Int4Weight { qweight: &qweight, zeros: Some(&qzeros), scales: &scales, g_idx: None };
//! op.run(dev.stream(), &weight, &mut out, None)?;      // no allocation, no sync: graph-capturable
//! # Ok(()) }
//! ```

use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use crate::cuda::{LaunchConfig, DEQUANTIZE};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use cudarc::driver::PushKernelArg;

/// Threads per block of every dequantize kernel (`DEQUANT_BLOCK` in `kernels/dequantize.cu`).
const BLOCK: u32 = 256;

/// How int4 codes are packed (exact layouts: `shared/formats.md`). `G'` = `K / group_size` groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Int4Layout {
    /// AutoAWQ GEMM: `qweight [K, N/8]` int32 (AWQ nibble order), `qzeros [G', N/8]`, `scales [G', N]`.
    Awq,
    /// GPTQ with v2 zeros (stored `z`; convert v1's `z − 1` when loading): `qweight [K/8, N]` int32 packed along K,
    /// `qzeros [G', N/8]`, `scales [G', N]`, optional `g_idx [K]`.
    Gptq,
    /// compressed-tensors `pack-quantized`: `weight_packed [N, K/8]` (codes `q + 8`), optional
    /// `weight_zero_point [N/8, G']` (`zp + 8`), `weight_scale [N, G']`, optional `weight_g_idx [K]`.
    CompressedTensors,
}

impl Int4Layout {
    /// Short name (`awq`, `gptq`, `ct`), as in kernel names.
    pub fn name(self) -> &'static str {
        match self {
            Int4Layout::Awq => "awq",
            Int4Layout::Gptq => "gptq",
            Int4Layout::CompressedTensors => "ct",
        }
    }
}

/// What an int4 dequantization computes; validated by [`DequantizeInt4::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DequantDesc {
    /// Packing of the codes, zeros and scales.
    pub layout: Int4Layout,
    /// Input features (rows of the output).
    pub k: usize,
    /// Output features (columns of the output).
    pub n: usize,
    /// Inputs per group along K; `k` for per channel.
    pub group_size: usize,
    /// Whether a zero-point tensor is given (otherwise every zero is 8: symmetric).
    pub zeros: bool,
    /// Whether a `g_idx [K]` (GPTQ act-order) is given (otherwise the group of `k` is `k / group_size`).
    pub g_idx: bool,
    /// `f16` or `bf16`: the dtype of the scales and of the output.
    pub dtype: DType,
}

impl DequantDesc {
    /// Number of groups `G'`.
    pub fn groups(&self) -> usize {
        self.k / self.group_size
    }

    /// Element counts of (qweight int32 words, zeros int32 words, scales, output) that `run` requires.
    pub fn lens(&self) -> (usize, usize, usize, usize) {
        let (k, n, g) = (self.k, self.n, self.groups());
        (k * n / 8, if self.zeros { g * n / 8 } else { 0 }, g * n, k * n)
    }

    /// Bytes the operation must move: reads of qweight, zeros and scales (and g_idx) plus writes of the output.
    pub fn bytes(&self) -> usize {
        let (q, z, s, o) = self.lens();
        let g_idx = if self.g_idx { self.k } else { 0 };
        (q + z + g_idx) * 4 + (s + o) * self.dtype.size()
    }

    /// Checks every rule [`DequantizeInt4::new`] enforces (no GPU needed).
    pub fn validate(&self) -> Result<()> {
        check_dims(self.k, self.n)?;
        let t = self.layout.name();
        ensure(self.k % 8 == 0, "k", self.k, &format!("{t}: K must be a multiple of 8"))?;
        ensure(
            self.group_size > 0 && self.k % self.group_size == 0,
            "group_size",
            self.group_size,
            &format!("must divide K = {}", self.k),
        )?;
        ensure(
            self.group_size % 8 == 0,
            "group_size",
            self.group_size,
            "must be a multiple of 8 (or K)",
        )?;
        if self.g_idx && self.layout == Int4Layout::Awq {
            return Err(Error::invalid(
                "g_idx",
                "present",
                "AWQ has no g_idx (act-order is GPTQ-only)",
            ));
        }
        check_dtype(self.dtype)
    }
}

/// Device buffers of one int4 weight, named as in the checkpoint; shapes per [`Int4Layout`].
pub struct Int4Weight<'a, T> {
    /// `qweight` / `weight_packed`, int32 words.
    pub qweight: &'a dyn DevicePtr<i32>,
    /// `qzeros` / `weight_zero_point`, int32 words; required iff [`DequantDesc::zeros`].
    pub zeros: Option<&'a dyn DevicePtr<i32>>,
    /// `scales` / `weight_scale`, in the descriptor's dtype.
    pub scales: &'a dyn DevicePtr<T>,
    /// `g_idx [K]` (values in `0..G'`; larger values are clamped to `G' − 1`); required iff [`DequantDesc::g_idx`].
    pub g_idx: Option<&'a dyn DevicePtr<i32>>,
}

/// Kernel parameters, passed by value; field order matches `struct DequantParams` in `kernels/dequantize.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DequantParams {
    qweight: u64,
    zeros: u64,
    scales: u64,
    g_idx: u64,
    out: u64,
    k: u32,
    n: u32,
    group_size: u32,
    groups: u32,
    group_shift: u32,
}

// SAFETY: plain-old-data, `#[repr(C)]`, layout identical to the CUDA struct (5 pointers, then 5 u32).
unsafe impl DeviceRepr for DequantParams {}

impl DequantParams {
    /// The shape part, fixed when the operator is created; `run` fills in the buffer pointers.
    fn shape(k: usize, n: usize, group_size: usize, groups: usize) -> Self {
        Self {
            qweight: 0,
            zeros: 0,
            scales: 0,
            g_idx: 0,
            out: 0,
            k: k as u32,
            n: n as u32,
            group_size: group_size as u32,
            groups: groups as u32,
            group_shift: group_shift(group_size, groups),
        }
    }
}

/// The validated, ready-to-launch part every dequantize operator shares.
#[derive(Debug, Clone)]
struct Launch {
    kernel: String,
    function: CudaFunction,
    config: LaunchConfig,
    params: DequantParams,
}

impl Launch {
    /// One thread per tile: `threads` threads.
    fn new(device: &CudaDevice, kernel: String, threads: u64, params: DequantParams) -> Result<Self> {
        let function = device.function(&DEQUANTIZE, &kernel)?;
        Self::with_blocks(kernel, function, threads.div_ceil(BLOCK as u64), params)
    }

    /// A persistent kernel striding over `tiles`: as many blocks as stay resident, shrunk so that every thread gets
    /// the same number of tiles (±1), which keeps the last pass from running on a fraction of the GPU.
    /// Also returns the tiles each thread gets.
    fn persistent(device: &CudaDevice, kernel: String, tiles: u64, params: DequantParams) -> Result<(Self, u64)> {
        let function = device.function(&DEQUANTIZE, &kernel)?;
        // The occupancy query needs the context current on this thread (cudarc does not bind it here).
        device
            .context()
            .bind_to_thread()
            .map_err(crate::cuda::driver_error("cuCtxSetCurrent"))?;
        let per_sm = function
            .occupancy_max_active_blocks_per_multiprocessor(BLOCK, 0, None)
            .map_err(crate::cuda::driver_error(format!("occupancy of {kernel}")))?
            .max(1) as u64;
        let resident = device.info().sm_count.max(1) as u64 * per_sm * BLOCK as u64;
        let tiles_per_thread = tiles.div_ceil(resident).max(1);
        let blocks = tiles.div_ceil(tiles_per_thread * BLOCK as u64);
        Ok((Self::with_blocks(kernel, function, blocks, params)?, tiles_per_thread))
    }

    fn with_blocks(kernel: String, function: CudaFunction, blocks: u64, params: DequantParams) -> Result<Self> {
        ensure(
            blocks <= i32::MAX as u64,
            "weight",
            format!("[{}, {}]", params.k, params.n),
            "too large for one launch",
        )?;
        Ok(Self {
            kernel,
            function,
            config: LaunchConfig {
                grid_dim: (blocks.max(1) as u32, 1, 1),
                block_dim: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            },
            params,
        })
    }

    fn launch(&self, stream: &CudaStream, params: DequantParams) -> Result<()> {
        let mut builder = stream.launch_builder(&self.function);
        builder.arg(&params);
        // SAFETY: `params` was built from buffers whose lengths and alignment `run` checked against the validated
        // descriptor, and the kernel only touches those ranges.
        unsafe { builder.launch(self.config) }
            .map(|_| ())
            .map_err(launch_error(&self.kernel))
    }
}

/// int4 → f16/bf16 dequantization of one weight shape (AWQ, GPTQ or compressed-tensors).
#[derive(Debug, Clone)]
pub struct DequantizeInt4 {
    desc: DequantDesc,
    launch: Launch,
}

impl DequantizeInt4 {
    /// Validates `desc` and loads its kernel (compiled by NVRTC on first use).
    ///
    /// Rules: `N % 8 == 0`, `K % 8 == 0`, `group_size` divides K and is a multiple of 8, dtype f16/bf16, no
    /// `g_idx` with AWQ.
    pub fn new(device: &CudaDevice, desc: DequantDesc) -> Result<Self> {
        Self::with_variant(device, desc, None)
    }

    /// As [`DequantizeInt4::new`], with the AWQ/GPTQ kernel variant forced instead of the tuned default:
    /// `r2`/`r4`/`r8` (one tile of 2/4/8 rows x 8 columns per thread; GPTQ: `r8`) or `p8` (persistent and pipelined).
    /// For benchmarking and tests.
    #[doc(hidden)]
    pub fn with_variant(device: &CudaDevice, desc: DequantDesc, variant: Option<&str>) -> Result<Self> {
        desc.validate()?;
        let t = desc.dtype.name();
        let params = DequantParams::shape(desc.k, desc.n, desc.group_size, desc.groups());
        let (k, n) = (desc.k as u64, desc.n as u64);
        let layout = desc.layout.name();
        let kernel = |v: &str| format!("dequant_{layout}_{t}_{v}");
        let launch = match (desc.layout, variant) {
            (Int4Layout::CompressedTensors, _) => {
                // Vector loads need each weight row (K/2 bytes) to be a multiple of 16 bytes.
                let vec = if desc.k % 32 == 0 { "_vec" } else { "" };
                Launch::new(
                    device,
                    format!("dequant_ct_{t}{vec}"),
                    transposed_threads(desc.k, desc.n, 32),
                    params,
                )?
            }
            // Tuned on an H200 (bench `LOWBIT_BENCH_VARIANTS=1`): the persistent, pipelined kernel is best when
            // every thread gets at most 2 tiles (small layers, e.g. 4096 x 4096, where a one-tile-per-thread grid
            // ends on a partial wave); one 2-row tile per thread is best for large AWQ layers (8192 x 28672: r2 1.03x
            // the copy time, r4 1.04x, r8 1.06x, p8 1.15x). GPTQ: p8 always.
            (Int4Layout::Awq, None) => {
                let (p8, tiles_per_thread) = Launch::persistent(device, kernel("p8"), k.div_ceil(8) * (n / 8), params)?;
                if tiles_per_thread <= 2 {
                    p8
                } else {
                    Launch::new(device, kernel("r2"), k.div_ceil(2) * (n / 8), params)?
                }
            }
            (Int4Layout::Gptq, None) => Launch::persistent(device, kernel("p8"), k.div_ceil(8) * (n / 8), params)?.0,
            (_, Some(v)) => {
                let allowed: &[&str] = match desc.layout {
                    Int4Layout::Awq => &["r2", "r4", "r8", "p8"],
                    _ => &["r8", "p8"],
                };
                ensure(
                    allowed.contains(&v),
                    "kernel variant",
                    v,
                    &format!("must be one of {allowed:?}"),
                )?;
                match v {
                    "p8" => Launch::persistent(device, kernel(v), k.div_ceil(8) * (n / 8), params)?.0,
                    _ => {
                        let rows: u64 = v[1..].parse().unwrap_or(8);
                        Launch::new(device, kernel(v), k.div_ceil(rows) * (n / 8), params)?
                    }
                }
            }
        };
        Ok(Self { desc, launch })
    }

    /// The validated description.
    pub fn desc(&self) -> &DequantDesc {
        &self.desc
    }

    /// The kernel this operator launches.
    pub fn kernel_name(&self) -> &str {
        &self.launch.kernel
    }

    /// Shape of the output: `[K, N]` (`W^T`, row-major).
    pub fn output_shape(&self) -> [usize; 2] {
        [self.desc.k, self.desc.n]
    }

    /// Device scratch `run` needs: none.
    pub fn workspace_bytes(&self) -> usize {
        0
    }

    /// Writes `W^T` as `[K, N]` into `out` on `stream`. Checks buffer lengths, alignment and dtype on the host;
    /// never allocates or synchronises.
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        weight: &Int4Weight<'_, T>,
        out: &mut dyn DevicePtrMut<T>,
        workspace: Option<&mut dyn DevicePtrMut<u8>>,
    ) -> Result<()> {
        let _ = workspace; // none needed
        let d = &self.desc;
        ensure(
            T::DTYPE == d.dtype,
            "out",
            T::DTYPE,
            &format!("dtype must be {} (the descriptor's)", d.dtype),
        )?;
        let (q_len, z_len, s_len, o_len) = d.lens();
        let layout = d.layout.name();
        // 16-byte vector accesses: scales (rows layouts), qweight (GPTQ, CT with vector loads) and the output.
        let q_align = if d.layout == Int4Layout::Awq { 4 } else { 16 };
        let s_align = if d.layout == Int4Layout::CompressedTensors {
            2
        } else {
            16
        };
        let qweight = pointer(weight.qweight, stream, &format!("{layout}.qweight"), q_len, q_align)?;
        let zeros = optional(weight.zeros, d.zeros, stream, &format!("{layout}.zeros"), z_len, 4)?;
        let scales = pointer(weight.scales, stream, &format!("{layout}.scales"), s_len, s_align)?;
        let g_idx = optional(weight.g_idx, d.g_idx, stream, &format!("{layout}.g_idx"), d.k, 4)?;
        let out = pointer_mut(out, stream, "out", o_len, 16)?;
        self.launch.launch(
            stream,
            DequantParams {
                qweight,
                zeros,
                scales,
                g_idx,
                out,
                ..self.launch.params
            },
        )
    }
}

/// int8 per-channel → f16/bf16 dequantization: `weight [N, K]` int8 (signed), `scales [N]`, out `W^T [K, N]`.
#[derive(Debug, Clone)]
pub struct DequantizeInt8 {
    k: usize,
    n: usize,
    dtype: DType,
    launch: Launch,
}

impl DequantizeInt8 {
    /// Validates the shape (`N % 8 == 0`, `K % 4 == 0`) and dtype (f16/bf16) and loads the kernel.
    pub fn new(device: &CudaDevice, k: usize, n: usize, dtype: DType) -> Result<Self> {
        check_dims(k, n)?;
        ensure(k % 4 == 0, "k", k, "int8: K must be a multiple of 4")?;
        check_dtype(dtype)?;
        // Vector loads need each weight row (K bytes) to be a multiple of 16 bytes.
        let vec = if k % 16 == 0 { "_vec" } else { "" };
        let kernel = format!("dequant_int8_{}{vec}", dtype.name());
        let params = DequantParams::shape(k, n, k, 1);
        let launch = Launch::new(device, kernel, transposed_threads(k, n, 16), params)?;
        Ok(Self { k, n, dtype, launch })
    }

    /// The kernel this operator launches.
    pub fn kernel_name(&self) -> &str {
        &self.launch.kernel
    }

    /// Shape of the output: `[K, N]` (`W^T`, row-major).
    pub fn output_shape(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// Device scratch `run` needs: none.
    pub fn workspace_bytes(&self) -> usize {
        0
    }

    /// Bytes the operation must move (weight + scales read, output written).
    pub fn bytes(&self) -> usize {
        self.k * self.n + (self.n + self.k * self.n) * self.dtype.size()
    }

    /// Writes `W^T` as `[K, N]` into `out` on `stream`; host-side checks only, no allocation or synchronisation.
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        weight: &dyn DevicePtr<i8>,
        scales: &dyn DevicePtr<T>,
        out: &mut dyn DevicePtrMut<T>,
        workspace: Option<&mut dyn DevicePtrMut<u8>>,
    ) -> Result<()> {
        let _ = workspace;
        ensure(
            T::DTYPE == self.dtype,
            "out",
            T::DTYPE,
            &format!("dtype must be {}", self.dtype),
        )?;
        let q_align = if self.k % 16 == 0 { 16 } else { 4 };
        let qweight = pointer(weight, stream, "int8.weight", self.k * self.n, q_align)?;
        let scales = pointer(scales, stream, "int8.scales", self.n, 2)?;
        let out = pointer_mut(out, stream, "out", self.k * self.n, 16)?;
        self.launch.launch(
            stream,
            DequantParams {
                qweight,
                scales,
                out,
                ..self.launch.params
            },
        )
    }
}

/// Threads of the transposing kernels: warps of 4 (K) x 8 (N) tiles of `rows_per_tile` x 8.
fn transposed_threads(k: usize, n: usize, rows_per_tile: usize) -> u64 {
    let k_warps = k.div_ceil(rows_per_tile).div_ceil(4) as u64;
    let n_warps = (n / 8).div_ceil(8) as u64;
    k_warps * n_warps * 32
}

/// `log2(group_size)` when it is a power of two (or 31 for one group: k >> 31 = 0), else the "divide" sentinel.
fn group_shift(group_size: usize, groups: usize) -> u32 {
    if groups == 1 {
        31
    } else if group_size.is_power_of_two() {
        group_size.trailing_zeros()
    } else {
        u32::MAX
    }
}

fn check_dtype(dtype: DType) -> Result<()> {
    ensure(
        matches!(dtype, DType::F16 | DType::Bf16),
        "dtype",
        dtype,
        "CUDA dequantization writes f16 or bf16",
    )
}

fn check_dims(k: usize, n: usize) -> Result<()> {
    ensure(
        k > 0 && n > 0 && k <= u32::MAX as usize && n <= u32::MAX as usize,
        "weight",
        format!("[K={k}, N={n}]"),
        "K and N must be in 1..=2^32-1",
    )?;
    ensure(n % 8 == 0, "n", n, "N must be a multiple of 8 (16-byte output stores)")
}

fn ensure(cond: bool, tensor: &str, value: impl std::fmt::Display, rule: &str) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::invalid(tensor, value, rule))
    }
}

/// The device address of `buf` after checking it holds at least `len` elements and is `align`-byte aligned.
fn pointer<T>(buf: &dyn DevicePtr<T>, stream: &CudaStream, name: &str, len: usize, align: u64) -> Result<u64> {
    let (ptr, _sync) = buf.device_ptr(stream);
    check_buffer(name, ptr, buf.len(), len, align)?;
    Ok(ptr)
}

fn pointer_mut<T>(
    buf: &mut dyn DevicePtrMut<T>,
    stream: &CudaStream,
    name: &str,
    len: usize,
    align: u64,
) -> Result<u64> {
    let have = buf.len();
    let (ptr, _sync) = buf.device_ptr_mut(stream);
    check_buffer(name, ptr, have, len, align)?;
    Ok(ptr)
}

/// A buffer that must be present iff the descriptor says so; 0 (null) when absent.
fn optional(
    buf: Option<&dyn DevicePtr<i32>>,
    expected: bool,
    stream: &CudaStream,
    name: &str,
    len: usize,
    align: u64,
) -> Result<u64> {
    match (buf, expected) {
        (Some(b), true) => pointer(b, stream, name, len, align),
        (None, false) => Ok(0),
        (Some(_), false) => Err(Error::invalid(name, "given", "the descriptor was created without it")),
        (None, true) => Err(Error::invalid(name, "missing", "the descriptor requires it")),
    }
}

fn check_buffer(name: &str, ptr: u64, have: usize, need: usize, align: u64) -> Result<()> {
    ensure(
        have >= need,
        name,
        format!("{have} elements"),
        &format!("needs at least {need} elements"),
    )?;
    ensure(
        ptr % align == 0,
        name,
        format!("device address {ptr:#x}"),
        &format!("must be {align}-byte aligned"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> DequantDesc {
        DequantDesc {
            layout: Int4Layout::Awq,
            k: 256,
            n: 64,
            group_size: 128,
            zeros: true,
            g_idx: false,
            dtype: DType::F16,
        }
    }

    #[test]
    fn descriptor_rules_name_the_offending_field() {
        assert!(desc().validate().is_ok());
        let cases = [
            (DequantDesc { n: 60, ..desc() }, "n"),
            (DequantDesc { k: 250, ..desc() }, "k"),
            (
                DequantDesc {
                    group_size: 96,
                    ..desc()
                },
                "group_size",
            ),
            (
                DequantDesc {
                    group_size: 0,
                    ..desc()
                },
                "group_size",
            ),
            (
                DequantDesc {
                    k: 8,
                    group_size: 4,
                    ..desc()
                },
                "group_size",
            ),
            (
                DequantDesc {
                    dtype: DType::F32,
                    ..desc()
                },
                "dtype",
            ),
            (DequantDesc { g_idx: true, ..desc() }, "g_idx"),
            (DequantDesc { k: 0, ..desc() }, "weight"),
        ];
        for (d, field) in cases {
            match d.validate() {
                Err(Error::Invalid { tensor, .. }) => assert_eq!(tensor, field, "{d:?}"),
                other => panic!("{d:?}: expected Invalid({field}), got {other:?}"),
            }
        }
        assert!(DequantDesc {
            layout: Int4Layout::Gptq,
            g_idx: true,
            ..desc()
        }
        .validate()
        .is_ok());
    }

    #[test]
    fn sizes_and_group_shifts() {
        let d = desc();
        assert_eq!(d.lens(), (256 * 8, 2 * 8, 2 * 64, 256 * 64));
        assert_eq!(d.bytes(), (256 * 8 + 2 * 8) * 4 + (2 * 64 + 256 * 64) * 2);
        assert_eq!(group_shift(128, 32), 7);
        assert_eq!(group_shift(4096, 1), 31);
        assert_eq!(group_shift(40, 5), u32::MAX);
        // 4 K-tiles x 8 N-tiles per warp: K=64, N=128 (16 column blocks) -> 1 x 2 warps.
        assert_eq!(transposed_threads(64, 128, 32), 2 * 32);
    }
}
