//! [`QuantLinear`]: the user-facing quantized linear layer, `y = act(x · W^T + bias)`, on the CPU or a CUDA GPU.
//!
//! Built from a [`QuantMatrix`] (or straight from a checkpoint layer of any supported format, with its bias), it
//! prepares the weight once and picks, per call, the fastest kernel for the batch size `m`:
//!
//! | kernel | what | where |
//! |---|---|---|
//! | [`LinearKernel::Decode`] | the fused W4A16 decode kernel (`mma.sync`, stream-K), larger M in chunks of 64 rows | any GPU |
//! | [`LinearKernel::Gemm`] | the W4A16 prefill GEMM (`wgmma`, TMA) | sm_90 |
//! | [`LinearKernel::GemmKSplit`] | the same GEMM on its K-split tile (narrow layers at a few dozen rows) | sm_90 |
//! | [`LinearKernel::DequantCublas`] | dequantize into a dense scratch weight, then cuBLAS | any GPU |
//! | [`LinearKernel::Cpu`] | [`LinearCpu`] | the host |
//!
//! The choice comes from a [`DispatchTable`] measured on the device (`bench/results/dispatch-*.json`, made by
//! `lowbit bench --op linear --dispatch`; embedded for the GPUs it covers). On a GPU it does not cover, a fixed rule
//! stands in: decode up to 16 rows, then the GEMM on sm_90; elsewhere decode up to [`DECODE_BEFORE_DENSE`] rows,
//! then dequantize + cuBLAS. A weight dequantize + cuBLAS cannot take (act-order) stays on the decode kernel.
//!
//! All GPU kernels of one layer read the same device weight ([`DeviceW4`]); the dense scratch weight of the
//! dequantize path is allocated on first use only.

use super::cuda::gemm::{self, LinearW4A16Gemm};
use super::cuda::{repack_preferred, CublasLinear, DenseElement, DeviceW4, LinearW4A16Cuda, Tuning, MAX_M};
use super::{Activation, LinearCpu};
use crate::checkpoint::{Checkpoint, QuantLayer};
use crate::cuda::LaunchConfig;
use crate::cuda::{launch_error, CudaDevice, CudaFunction, CudaSlice, CudaStream, Device, DevicePtr, DevicePtrMut};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use crate::formats::QuantMatrix;
use cudarc::driver::PushKernelArg;
use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::sync::{Arc, Mutex};

/// The kernel a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearKernel {
    /// [`LinearCpu`] on the host.
    Cpu,
    /// The fused W4A16 decode kernel (in chunks of 64 rows above 64).
    Decode,
    /// The Hopper W4A16 GEMM.
    Gemm,
    /// The Hopper W4A16 GEMM on its K-split tile: 128 columns x 64 tokens, the two consumer warpgroups on alternate
    /// stages of the k range, so a split tile pushes half the partial sums.
    #[serde(rename = "gemm_ksplit")]
    GemmKSplit,
    /// Dequantize to a dense scratch weight, then cuBLAS.
    DequantCublas,
}

impl LinearKernel {
    /// The name used in records and tables.
    pub fn name(self) -> &'static str {
        match self {
            LinearKernel::Cpu => "cpu",
            LinearKernel::Decode => "decode",
            LinearKernel::Gemm => "gemm",
            LinearKernel::GemmKSplit => "gemm_ksplit",
            LinearKernel::DequantCublas => "dequant_cublas",
        }
    }
}

/// One measured row: on `device`, for a `k x n` layer of `wbits`-bit weights at batch `m`, `kernel` was the fastest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchEntry {
    /// GPU name as the driver reports it (`NVIDIA H200`).
    pub device: String,
    /// Weight bits (4 or 8).
    #[serde(default = "four")]
    pub wbits: u8,
    pub k: usize,
    pub n: usize,
    pub m: usize,
    pub kernel: LinearKernel,
}

fn four() -> u8 {
    4
}

/// Measured fastest kernels per (device, weight bits, shape, M). A query takes the entries of the same GPU model and
/// weight bits (any bits when those were not measured), the measured shape nearest in size (log K·N, then K/N
/// aspect), and the largest measured M not above the batch (the smallest measured M below all of them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DispatchTable {
    pub entries: Vec<DispatchEntry>,
}

/// The tables measured on our device GPUs (`lowbit bench --op linear --dispatch`), embedded.
const MEASURED: &[&str] = &[include_str!("../../../../../bench/results/dispatch-h200.json")];

impl DispatchTable {
    /// The embedded measured tables, merged.
    pub fn measured() -> Self {
        let mut table = DispatchTable::default();
        for json in MEASURED {
            // The embedded tables are ours and tested to parse; a broken one would only lose its entries.
            if let Ok(t) = serde_json::from_str::<DispatchTable>(json) {
                table.entries.extend(t.entries);
            }
        }
        table
    }

    /// The measured choice for `device`, a `k x n` layer and batch `m`, or `None` when this GPU was not measured.
    pub fn lookup(&self, device: &str, wbits: u8, k: usize, n: usize, m: usize) -> Option<LinearKernel> {
        LayerDispatch::new(self, device, wbits, k, n).choose(m)
    }
}

/// The rows of a [`DispatchTable`] that answer for one layer (same GPU and width, nearest measured shape), sorted by
/// M: resolved once when the layer is prepared, so a call only scans a handful of `(M, kernel)` pairs.
#[derive(Debug, Clone, Default, PartialEq)]
struct LayerDispatch {
    rows: Vec<(usize, LinearKernel)>,
}

impl LayerDispatch {
    fn new(table: &DispatchTable, device: &str, wbits: u8, k: usize, n: usize) -> Self {
        let gpu = || table.entries.iter().filter(|e| e.device == device);
        let same_width = gpu().any(|e| e.wbits == wbits);
        let candidates = || gpu().filter(|e| !same_width || e.wbits == wbits);
        let distance = |e: &DispatchEntry| {
            let size = ((e.k * e.n) as f64).ln() - ((k * n) as f64).ln();
            let aspect = (e.k as f64 / e.n as f64).ln() - (k as f64 / n as f64).ln();
            (size.abs(), aspect.abs())
        };
        let Some(nearest) = candidates().min_by(|a, b| {
            distance(a)
                .partial_cmp(&distance(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        }) else {
            return Self::default();
        };
        let mut rows: Vec<(usize, LinearKernel)> = candidates()
            .filter(|e| (e.k, e.n) == (nearest.k, nearest.n))
            .map(|e| (e.m, e.kernel))
            .collect();
        rows.sort_by_key(|&(m, _)| m);
        Self { rows }
    }

    /// The kernel of the largest measured M not above `m` (the smallest measured M below all of them).
    fn choose(&self, m: usize) -> Option<LinearKernel> {
        let below = self.rows.iter().rev().find(|&&(rm, _)| rm <= m);
        below.or(self.rows.first()).map(|&(_, kernel)| kernel)
    }
}

/// Shared memory of the dense dequantization's tile for `n_cta`-column tiles (`DENSE_PITCH` = 128 + 8 elements).
fn dense_tile_bytes(n_cta: usize) -> usize {
    n_cta * (128 + 8) * 2
}

/// Without the Hopper GEMM and a measured table, batches up to this many rows take the decode kernel (two 64-row
/// chunks), larger ones dequantize + cuBLAS. Measured on the H200 with both forced (`w4a16-decode.md`, "Any M"):
/// at M = 128 the chunked kernel was ahead on three anchor layers and 8% behind on 4096 x 4096; at M = 256 behind
/// on all four. GPUs before Hopper, whose cuBLAS also runs `mma.sync`, should not move the crossover lower.
pub const DECODE_BEFORE_DENSE: usize = 2 * MAX_M;

/// The rule for GPUs without measurements: the decode kernel up to 16 rows (from the H200's table), then the GEMM
/// on sm_90; elsewhere the decode kernel up to [`DECODE_BEFORE_DENSE`] rows, then dequantize + cuBLAS where it can
/// run (`dense`: not for act-order weights), the decode kernel where it cannot.
fn fallback(m: usize, gemm: bool, dense: bool) -> LinearKernel {
    match m {
        0..=16 => LinearKernel::Decode,
        _ if gemm => LinearKernel::Gemm,
        _ if m <= DECODE_BEFORE_DENSE || !dense => LinearKernel::Decode,
        _ => LinearKernel::DequantCublas,
    }
}

/// A quantized linear layer prepared for one device. See the module documentation.
pub struct QuantLinear {
    n: usize,
    k: usize,
    act: DType,
    activation: Activation,
    backend: Backend,
}

enum Backend {
    Cpu { op: LinearCpu, bias: Option<Vec<f32>> },
    Cuda(Box<CudaLinear>),
}

struct CudaLinear {
    device: Arc<CudaDevice>,
    weight: Arc<DeviceW4>,
    decode: LinearW4A16Cuda,
    gemm: Option<LinearW4A16Gemm>,
    /// The dequantize + cuBLAS path: kernels, cuBLAS handle, and the dense scratch weight (made on first use).
    dense: DensePath,
    /// `CudaSlice<f16>` or `CudaSlice<bf16>` (the layer's dtype).
    bias: Option<Box<dyn Any + Send + Sync>>,
    /// The measured choices per batch size for this layer on this GPU.
    dispatch: LayerDispatch,
    /// A kernel forced for every call (benchmarking, tests); `None`: the table's choice.
    forced: Option<LinearKernel>,
    /// Weight bits (the table is per bit width).
    wbits: u8,
    max_m: usize,
}

struct DensePath {
    dequantize: CudaFunction,
    bias_activation: CudaFunction,
    /// The bias + activation pass launches as the dependent of the kernel before it (sm_90).
    dependent_launch: bool,
    blas: CublasLinear,
    /// `CudaSlice<T>` of N * K elements, T the layer's dtype.
    scratch: Mutex<Option<Box<dyn Any + Send + Sync>>>,
}

impl std::fmt::Debug for QuantLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantLinear")
            .field("n", &self.n)
            .field("k", &self.k)
            .field("act", &self.act)
            .field("activation", &self.activation)
            .finish_non_exhaustive()
    }
}

impl QuantLinear {
    /// Prepares `w` (4-bit, any supported format) with an optional `bias` (N values) and fused `activation` for
    /// activations of dtype `act` (f16 or bf16 on a GPU; also f32 on the CPU) and batches of up to `max_m` rows.
    pub fn new(
        device: &Device,
        w: &QuantMatrix,
        bias: Option<&[f32]>,
        activation: Activation,
        act: DType,
        max_m: usize,
    ) -> Result<Self> {
        w.validate()?;
        if let Some(b) = bias {
            if b.len() != w.n {
                return Err(Error::invalid(
                    "bias",
                    format!("{} values", b.len()),
                    format!("must hold N = {}", w.n),
                ));
            }
        }
        if max_m == 0 {
            return Err(Error::invalid("max_m", 0, "must be at least 1"));
        }
        let backend = match device {
            Device::Cpu => Backend::Cpu {
                op: LinearCpu::new(w)?,
                bias: bias.map(<[f32]>::to_vec),
            },
            Device::Cuda(dev) => Backend::Cuda(Box::new(CudaLinear::new(dev, w, bias, activation, act, max_m)?)),
        };
        Ok(QuantLinear {
            n: w.n,
            k: w.k,
            act,
            activation,
            backend,
        })
    }

    /// Prepares the checkpoint layer `layer` (see [`Checkpoint::quantized_layers`]) with its `<prefix>.bias` when
    /// the checkpoint has one.
    pub fn from_checkpoint(
        device: &Device,
        checkpoint: &Checkpoint,
        layer: &QuantLayer,
        activation: Activation,
        act: DType,
        max_m: usize,
    ) -> Result<Self> {
        let w = checkpoint.load_layer(layer)?;
        let bias = checkpoint
            .tensor_opt(&format!("{}.bias", layer.prefix))?
            .map(|t| t.to_f32())
            .transpose()?;
        Self::new(device, &w, bias.as_deref(), activation, act, max_m)
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Forces `kernel` for every call where it applies (others fall back to the rule), or restores the measured
    /// choice with `None` (benchmarking and tests).
    #[doc(hidden)]
    pub fn force_kernel(&mut self, kernel: Option<LinearKernel>) {
        if let Backend::Cuda(c) = &mut self.backend {
            c.forced = kernel;
        }
    }

    /// Replaces the measured dispatch table (tests, or a table measured on another GPU).
    pub fn set_dispatch_table(&mut self, table: DispatchTable) {
        if let Backend::Cuda(c) = &mut self.backend {
            c.dispatch = LayerDispatch::new(&table, &c.device.info().name, c.wbits, self.k, self.n);
        }
    }

    /// Bytes of weight a call reads (codes, scales, zeros; the GPU's repacked layout), or 0 on the CPU.
    pub fn weight_bytes(&self) -> usize {
        match &self.backend {
            Backend::Cpu { .. } => 0,
            Backend::Cuda(c) => c.weight.weight_bytes(),
        }
    }

    /// The kernels that can run a batch of `m` rows on this layer's device.
    pub fn available(&self, m: usize) -> Vec<LinearKernel> {
        match &self.backend {
            Backend::Cpu { .. } => vec![LinearKernel::Cpu],
            Backend::Cuda(c) => {
                let mut v = vec![LinearKernel::Decode];
                if let Some(g) = &c.gemm {
                    v.push(LinearKernel::Gemm);
                    // Up to 16 rows it would spend three quarters of its tensor work on padding (it runs there too).
                    if g.has_k_split() && m > gemm::TINY_BATCH {
                        v.push(LinearKernel::GemmKSplit);
                    }
                }
                if c.weight.dense_planes().is_some() {
                    v.push(LinearKernel::DequantCublas);
                }
                v
            }
        }
    }

    /// The kernel a batch of `m` rows runs.
    pub fn kernel_for(&self, m: usize) -> LinearKernel {
        match &self.backend {
            Backend::Cpu { .. } => LinearKernel::Cpu,
            Backend::Cuda(c) => c.kernel_for(m),
        }
    }

    /// `y = act(x · W^T + bias)` for `m` rows of host data, on the layer's device (uploads, runs, downloads on a
    /// GPU, where `T` must be the layer's dtype). The same call works for every backend.
    pub fn forward<T: Float>(&self, x: &[T], m: usize) -> Result<Vec<T>> {
        if x.len() != m * self.k {
            return Err(Error::invalid(
                "x",
                format!("{} values", x.len()),
                format!("must hold M * K = {m} * {}", self.k),
            ));
        }
        match &self.backend {
            Backend::Cpu { op, bias } => {
                let mut y = vec![0f32; m * self.n];
                let x32: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                op.forward(&x32, m, self.k, bias.as_deref(), &mut y)?;
                // The epilogue in f32, one rounding to T (what the GPU kernels do).
                Ok(y.iter().map(|&v| T::from_f32(self.activation.apply(v))).collect())
            }
            Backend::Cuda(c) => {
                if T::DTYPE != self.act {
                    return Err(Error::invalid(
                        "x",
                        T::DTYPE,
                        format!("dtype must be {} (the layer's)", self.act),
                    ));
                }
                // T is the layer's f16/bf16, so the f32 round trip below is exact.
                let x32: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                let y32 = match self.act {
                    DType::Bf16 => self.forward_cuda::<bf16>(c, &x32, m)?,
                    _ => self.forward_cuda::<f16>(c, &x32, m)?,
                };
                Ok(y32.into_iter().map(T::from_f32).collect())
            }
        }
    }

    fn forward_cuda<T: DenseElement + cudarc::driver::ValidAsZeroBits>(
        &self,
        c: &CudaLinear,
        x: &[f32],
        m: usize,
    ) -> Result<Vec<f32>> {
        let xt: Vec<T> = x.iter().map(|&v| T::from_f32(v)).collect();
        let x_dev = c.device.upload(&xt)?;
        let mut y_dev = c.device.alloc_zeros::<T>(m * self.n)?;
        let mut ws = c.device.alloc_zeros::<u8>(c.workspace_bytes(m).max(1))?;
        self.run(c.device.stream(), &x_dev, m, &mut y_dev, &mut ws)?;
        Ok(c.device.download(&y_dev)?.iter().map(|v| v.to_f32()).collect())
    }

    /// Device scratch [`QuantLinear::run`] needs for batches of up to `m` rows (GPU layers; 0 on the CPU).
    pub fn workspace_bytes(&self, m: usize) -> usize {
        match &self.backend {
            Backend::Cpu { .. } => 0,
            Backend::Cuda(c) => c.workspace_bytes(m),
        }
    }

    /// `y = act(x · W^T + bias)` on device buffers (GPU layers): `m` contiguous rows of x and y, no allocation except
    /// the dense scratch weight on the first dequantize + cuBLAS call, no synchronisation.
    pub fn run<T: DenseElement>(
        &self,
        stream: &CudaStream,
        x: &CudaSlice<T>,
        m: usize,
        y: &mut CudaSlice<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let Backend::Cuda(c) = &self.backend else {
            return Err(Error::Unsupported(
                "QuantLinear::run on device buffers of a CPU layer (use forward)".into(),
            ));
        };
        if T::DTYPE != self.act {
            return Err(Error::invalid(
                "x",
                T::DTYPE,
                format!("dtype must be {} (the layer's)", self.act),
            ));
        }
        if m > c.max_m {
            return Err(Error::invalid(
                "x",
                format!("{m} rows"),
                format!("at most max_m = {}", c.max_m),
            ));
        }
        let bias = c
            .bias
            .as_ref()
            .and_then(|b| b.downcast_ref::<CudaSlice<T>>())
            .map(|b| b as &dyn DevicePtr<T>);
        match (c.kernel_for(m), &c.gemm) {
            (LinearKernel::Decode, _) if c.decode.fuses_activation(m) => {
                c.decode
                    .run_with_activation(stream, x, m, bias, self.activation, y, workspace)
            }
            (LinearKernel::Decode, _) => {
                // Above 16 rows the activation is one more pass over y (faster there than the fused stores).
                c.decode.run(stream, x, m, bias, y, workspace)?;
                c.epilogue(stream, y, m, false, self.activation)
            }
            (kernel @ (LinearKernel::Gemm | LinearKernel::GemmKSplit), Some(g)) => {
                let tile = if kernel == LinearKernel::GemmKSplit {
                    gemm::GemmTile::KSplit
                } else {
                    gemm::GemmTile::Chosen
                };
                g.run_on(
                    tile,
                    stream,
                    (x, self.k),
                    m,
                    bias,
                    self.activation,
                    (y, self.n),
                    workspace,
                )
            }
            _ => c.run_dense(stream, x, m, self.activation, y),
        }
    }
}

impl CudaLinear {
    /// The decode operator (with the activation fused in its stores up to 16 rows: one launch fewer per call) and,
    /// where the GPU has it, the tensor-core GEMM, both on `weight`.
    fn decode_and_gemm(
        dev: &Arc<CudaDevice>,
        weight: &Arc<DeviceW4>,
        activation: Activation,
        max_m: usize,
    ) -> Result<(LinearW4A16Cuda, Option<LinearW4A16Gemm>)> {
        let decode = LinearW4A16Cuda::with_weight(dev, weight.clone(), max_m, Tuning::default())?;
        let decode = match activation {
            Activation::None => decode,
            _ => decode.with_fused_activation(dev)?,
        };
        let gemm = gemm::supported(dev, weight)
            .then(|| LinearW4A16Gemm::with_weight(dev, weight.clone(), max_m, None))
            .transpose()?;
        Ok((decode, gemm))
    }

    fn new(
        dev: &Arc<CudaDevice>,
        w: &QuantMatrix,
        bias: Option<&[f32]>,
        activation: Activation,
        act: DType,
        max_m: usize,
    ) -> Result<Self> {
        let packed = repack_preferred(w, act)?;
        let weight = DeviceW4::upload(dev, &packed)?;
        // The dense path's kernel, the largest single compile on a cold cache, compiles on a thread of its own
        // while the decode and GEMM variants do (each family several at once).
        let source = &gemm::KERNEL;
        let (kernels, dense_compiled) = std::thread::scope(|s| {
            let dense = s.spawn(|| dev.prepare(&[source]));
            let kernels = Self::decode_and_gemm(dev, &weight, activation, max_m);
            (
                kernels,
                dense.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            )
        });
        let (decode, gemm) = kernels?;
        dense_compiled?;
        let suffix = act.name(); // f16 or bf16: repack checked it
        let dense = DensePath {
            dequantize: dev.function_with_shared_memory(
                source,
                &format!("w4a16_dequantize_repacked_{suffix}"),
                dense_tile_bytes(256),
            )?,
            bias_activation: dev.function(source, &format!("w4a16_bias_activation_{suffix}"))?,
            dependent_launch: dev.info().compute_capability.0 >= 9,
            blas: CublasLinear::new(dev, w.n, w.k)?,
            scratch: Mutex::new(None),
        };
        let bias: Option<Box<dyn Any + Send + Sync>> = match (bias, act) {
            (None, _) => None,
            (Some(b), DType::Bf16) => Some(Box::new(
                dev.upload(&b.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>())?,
            )),
            (Some(b), _) => Some(Box::new(
                dev.upload(&b.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>())?,
            )),
        };
        Ok(CudaLinear {
            device: dev.clone(),
            weight,
            decode,
            gemm,
            dense,
            bias,
            dispatch: LayerDispatch::new(&DispatchTable::measured(), &dev.info().name, w.bits, w.k, w.n),
            forced: None,
            wbits: w.bits,
            max_m,
        })
    }

    fn kernel_for(&self, m: usize) -> LinearKernel {
        let (gemm, dense) = (self.gemm.is_some(), self.weight.dense_planes().is_some());
        let choice = self
            .forced
            .or_else(|| self.dispatch.choose(m))
            .unwrap_or_else(|| fallback(m, gemm, dense));
        match choice {
            LinearKernel::Gemm | LinearKernel::GemmKSplit if !gemm => fallback(m, gemm, dense),
            LinearKernel::DequantCublas if !dense => fallback(m, gemm, dense),
            LinearKernel::Cpu => fallback(m, gemm, dense),
            c => c,
        }
    }

    fn workspace_bytes(&self, m: usize) -> usize {
        let decode = self.decode.workspace_bytes();
        let gemm = self.gemm.as_ref().map_or(0, |g| g.workspace_bytes());
        let _ = m; // the workspace does not grow with m below max_m (each operator sized itself for max_m)
        decode.max(gemm)
    }

    /// Dequantize into the scratch weight, cuBLAS, then bias + activation when there are any.
    fn run_dense<T: DenseElement>(
        &self,
        stream: &CudaStream,
        x: &CudaSlice<T>,
        m: usize,
        activation: Activation,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        let p = self.weight.plan();
        let Some(planes) = self.weight.dense_planes() else {
            return Err(Error::Unsupported(
                "QuantLinear: dequantize + cuBLAS with act-order weights, or 8-bit weights with K not a multiple \
                 of 128 (the GEMM and decode kernels take them)"
                    .into(),
            ));
        };
        let mut scratch = self.dense.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if scratch
            .as_ref()
            .and_then(|s| s.downcast_ref::<CudaSlice<T>>())
            .is_none()
        {
            // First use, or a scratch of the other dtype (impossible: the layer has one dtype).
            let fresh: CudaSlice<T> = self.device.alloc_zeros(p.n * p.input_k)?;
            *scratch = Some(Box::new(fresh));
        }
        let dense = scratch
            .as_mut()
            .and_then(|s| s.downcast_mut::<CudaSlice<T>>())
            .expect("allocated above");
        let (qweight, scales, zeros, _) = self.weight.pointers(stream);
        let dense_ptr = dense.device_ptr_mut(stream).0;
        let wbits = p.code_bits as i32;
        let (ni, ki, kti, gi, gpi, ncta, planes_i) = (
            p.n as i32,
            p.input_k as i32,
            p.k_tiles() as i32,
            p.group as i32,
            p.group_rows as i32,
            p.n_cta as i32,
            planes as i32,
        );
        let mut b = stream.launch_builder(&self.dense.dequantize);
        b.arg(&qweight)
            .arg(&scales)
            .arg(&zeros)
            .arg(&dense_ptr)
            .arg(&ni)
            .arg(&ki)
            .arg(&kti)
            .arg(&gi)
            .arg(&gpi)
            .arg(&ncta)
            .arg(&planes_i)
            .arg(&wbits);
        let cfg = LaunchConfig {
            grid_dim: ((p.n_tiles() * p.k_tiles() / planes) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: dense_tile_bytes(p.n_cta) as u32,
        };
        // SAFETY: CTA (n tile, k tile) reads its unit(s) of the operator's own repacked weight and writes
        // dense[n][k] for n < N, k < K (checked per chunk) into the scratch buffer of N * K elements.
        unsafe { b.launch(cfg) }.map_err(launch_error("w4a16_dequantize_repacked"))?;
        self.dense.blas.run(dense, x, m, y)?;
        self.epilogue(stream, y, m, true, activation)
    }

    /// `y = act(y + bias)` in place (bias only when `with_bias` and the layer has one); nothing to do is no launch.
    fn epilogue<T: DenseElement>(
        &self,
        stream: &CudaStream,
        y: &mut CudaSlice<T>,
        m: usize,
        with_bias: bool,
        activation: Activation,
    ) -> Result<()> {
        let bias = self
            .bias
            .as_ref()
            .filter(|_| with_bias)
            .and_then(|b| b.downcast_ref::<CudaSlice<T>>());
        if bias.is_none() && activation == Activation::None {
            return Ok(());
        }
        let n = self.weight.plan().n;
        let y_ptr = y.device_ptr_mut(stream).0;
        let bias_ptr = bias.map_or(0, |b| b.device_ptr(stream).0);
        let (ys, mi, ni, code) = (n as i64, m as i32, n as i32, activation.code());
        // A CTA per 256 columns of a row (rows beyond 65535 loop), as the dependent of the kernel that wrote y on
        // sm_90: the next kernel then launches under this pass (the kernel's DEPENDENT LAUNCH).
        let launch = crate::cuda::Launch {
            grid: n.div_ceil(256).min(65_535) as u32,
            grid_y: m.min(65_535) as u32,
            block: 256,
            smem: 0,
            cluster: None,
            dependent: self.dense.dependent_launch,
        };
        let mut params: [*mut std::ffi::c_void; 6] = [
            &y_ptr as *const u64 as *mut _,
            &ys as *const i64 as *mut _,
            &bias_ptr as *const u64 as *mut _,
            &mi as *const i32 as *mut _,
            &ni as *const i32 as *mut _,
            &code as *const i32 as *mut _,
        ];
        // SAFETY: y holds m * N elements (the callers checked it), bias N; `params` points at the kernel's six
        // parameters, in order.
        unsafe {
            crate::cuda::launch_ex(&self.dense.bias_activation, stream, launch, &mut params, || {
                "launching w4a16_bias_activation".into()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule for unmeasured GPUs: the GEMM on sm_90 from 17 rows; elsewhere the decode kernel (in chunks above 64
    /// rows) up to `DECODE_BEFORE_DENSE`, then dequantize + cuBLAS, except for weights it cannot take.
    #[test]
    fn fallback_rule() {
        use LinearKernel::*;
        for dense in [true, false] {
            assert_eq!(fallback(1, true, dense), Decode);
            assert_eq!(fallback(16, false, dense), Decode);
            assert_eq!(fallback(17, true, dense), Gemm);
            assert_eq!(fallback(4096, true, dense), Gemm);
            assert_eq!(fallback(DECODE_BEFORE_DENSE, false, dense), Decode);
        }
        assert_eq!(fallback(DECODE_BEFORE_DENSE + 1, false, true), DequantCublas);
        assert_eq!(fallback(DECODE_BEFORE_DENSE + 1, false, false), Decode);
        assert_eq!(fallback(1 << 20, false, false), Decode);
    }

    /// Every embedded table parses whole (`measured` would drop a broken one silently), and the H200's sends
    /// 4096 x 4096 at 33..256 rows to the K-split tiles and the other anchor layers there as measured.
    #[test]
    fn embedded_tables_parse() {
        for json in MEASURED {
            serde_json::from_str::<DispatchTable>(json).unwrap();
        }
        let table = DispatchTable::measured();
        for m in [33, 47, 64, 128, 129, 160, 192, 256] {
            let at = |k, n| table.lookup("NVIDIA H200", 4, k, n, m);
            assert_eq!(at(4096, 4096), Some(LinearKernel::GemmKSplit), "M = {m}");
            // Measured at 4e54954: the K-split tile from 33 to 128 rows on 4096 x 14336, the GEMM from 192 on; and at
            // e1a5e2a, with the 96-token tile, the GEMM at 96 rows (not asserted: 3% apart) and at 160 rows, which
            // runs the same tiles from 129 rows on.
            let wide = if m <= 128 {
                LinearKernel::GemmKSplit
            } else {
                LinearKernel::Gemm
            };
            assert_eq!(at(4096, 14336), Some(wide), "M = {m}");
            // 8192 x 28672: the GEMM, but for 64 rows, where the K-split tile won in two sessions (72.2 against
            // 72.5 us at ca0fac9, 70.7 against 72.5 at f017b04).
            let widest = if m == 64 {
                LinearKernel::GemmKSplit
            } else {
                LinearKernel::Gemm
            };
            assert_eq!(at(8192, 28672), Some(widest), "M = {m}");
        }
    }
}
