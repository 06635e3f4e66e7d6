//! One CUDA GPU: its context and stream, what it is, and its loaded kernels.

use super::nvrtc::{self, KernelSource};
use super::{cache, cuda_error, driver_error};
use crate::error::{Error, Result};
use cudarc::driver::{
    sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
    ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the driver reports about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA device ordinal (`cuda:N`).
    pub ordinal: usize,
    /// GPU name (`NVIDIA H200`).
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// The NVRTC target kernels are compiled for (`sm_90a` on Hopper).
    pub arch: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// L2 cache bytes.
    pub l2_bytes: usize,
    /// Device memory bytes.
    pub total_memory: usize,
    /// Driver API version as the driver reports it (13000 = 13.0).
    pub driver_version: i32,
}

/// A CUDA GPU ready for lowbit's kernels.
///
/// Holds the primary context, a non-default stream ([`CudaDevice::stream`]; graph capture needs one) and the
/// kernels loaded so far. cudarc's per-buffer event tracking is switched off: operators launch on the stream the
/// caller gives them and never synchronise, so ordering between streams is the caller's business (as in cuBLAS).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// The dynamic shared memory each function (`module::function`) is allowed: only ever raised, see
    /// [`CudaDevice::function_with_shared_memory`].
    shared_memory: Mutex<HashMap<String, usize>>,
    /// The cuBLAS workspace of every handle bound to `stream` ([`CudaDevice::blas_workspace`]).
    blas_workspace: Mutex<Option<Arc<CudaSlice<u8>>>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`. Fails with [`Error::CudaUnavailable`] when the driver, NVRTC or the GPU is missing.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
        super::probe()?;
        let count = super::device_count()?;
        if ordinal >= count {
            return Err(Error::invalid(
                "--device",
                format!("cuda:{ordinal}"),
                format!(
                    "this machine has {count} CUDA device(s): cuda:0..cuda:{}",
                    count.saturating_sub(1)
                ),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error("cuCtx (primary context)"))?;
        // SAFETY: set before any buffer is allocated; every operator documents that it only orders work on the
        // stream it is given.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_error("cuStreamCreate"))?;
        let attr = |a: sys::CUdevice_attribute| ctx.attribute(a).map_err(driver_error("cuDeviceGetAttribute"));
        use sys::CUdevice_attribute::*;
        let compute_capability = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(driver_error("cuDeviceGetName"))?,
            compute_capability,
            arch: nvrtc::arch_for(compute_capability.0, compute_capability.1),
            sm_count: attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize,
            total_memory: ctx.total_mem().map_err(driver_error("cuDeviceTotalMem"))?,
            driver_version: super::driver_version()?,
        };
        Ok(Arc::new(Self {
            ctx,
            stream,
            info,
            modules: Mutex::new(HashMap::new()),
            shared_memory: Mutex::new(HashMap::new()),
            blas_workspace: Mutex::new(None),
        }))
    }

    /// What the driver reports about this GPU.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The workspace of the cuBLAS handles bound to the device's stream: [`super::blas::BLAS_WORKSPACE_BYTES`],
    /// allocated on first use. Without one (`cublasSetWorkspace`) cuBLAS picks slower kernels at small batches:
    /// 26 against 13.8 µs at 1 × 4096 × 4096 on the H200. The handles share it because their calls are ordered on
    /// the one stream.
    pub fn blas_workspace(&self) -> Result<Arc<CudaSlice<u8>>> {
        let mut slot = self.blas_workspace.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ws) = slot.as_ref() {
            return Ok(ws.clone());
        }
        let ws = Arc::new(self.alloc_zeros::<u8>(super::blas::BLAS_WORKSPACE_BYTES)?);
        *slot = Some(ws.clone());
        Ok(ws)
    }

    /// The device's own stream (non-default, so it can be captured into a CUDA graph).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(driver_error("cuStreamCreate"))
    }

    /// The cudarc context (for cuBLAS handles, events, graphs).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Loads kernel `function` of `source`, compiling the module for this GPU's arch on first use (memory and disk
    /// cached). Operators call this once, in their constructor.
    pub fn function(&self, source: &KernelSource, function: &str) -> Result<CudaFunction> {
        let module = self.module(source)?;
        // Operators may be created on any thread; driver calls that take no context argument need it current.
        self.ctx.bind_to_thread().map_err(driver_error("cuCtxSetCurrent"))?;
        module
            .load_function(function)
            .map_err(driver_error(format!("cuModuleGetFunction {}::{function}", source.name)))
    }

    /// [`CudaDevice::function`], allowed at least `bytes` of dynamic shared memory per block (beyond the default
    /// 48 KB). The allowance belongs to the function, which every operator loading it shares, so it is only ever
    /// raised: set to each caller's own size, an operator made later with less (a W8A8 layer with blocks of 128
    /// after one with blocks of 64) made the earlier one's launches fail with CUDA_ERROR_INVALID_VALUE.
    pub fn function_with_shared_memory(
        &self,
        source: &KernelSource,
        function: &str,
        bytes: usize,
    ) -> Result<CudaFunction> {
        let f = self.function(source, function)?;
        let mut allowed = self.shared_memory.lock().unwrap_or_else(|e| e.into_inner());
        let key = format!("{}::{function}", source.name);
        if allowed.get(&key).is_some_and(|&have| have >= bytes) {
            return Ok(f);
        }
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(driver_error(format!("shared memory ({bytes} bytes) of {key}")))?;
        allowed.insert(key, bytes);
        Ok(f)
    }

    /// Compiles (or reads from the disk cache) the modules of `sources` for this GPU in parallel, ahead of the
    /// [`CudaDevice::function`] calls that load them: an operator with several kernel variants calls this first,
    /// so building it costs its slowest compile rather than the sum.
    pub fn prepare(&self, sources: &[&KernelSource]) -> Result<()> {
        cache::prefetch(sources, &self.info.arch)
    }

    /// The loaded module of `source` (compiled or read from the cache on first use).
    pub fn module(&self, source: &KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap_or_else(|e| e.into_inner()).get(source.name) {
            return Ok(m.clone());
        }
        // Compiled without holding `modules`, so other threads load other modules meanwhile; the cache compiles
        // each kernel once.
        let (cubin, _) = cache::cubin(source, &self.info.arch)?;
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(source.name) {
            return Ok(m.clone()); // loaded by another thread while this one waited for the CUBIN
        }
        let module = self
            .ctx
            .load_module(Ptx::from_binary(cubin.as_ref().clone()))
            .map_err(driver_error(format!(
                "cuModuleLoadData {} ({})",
                source.name, self.info.arch
            )))?;
        modules.insert(source.name, module.clone());
        Ok(module)
    }

    /// Copies `data` to a new device buffer (ordered on [`CudaDevice::stream`]).
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(data).map_err(driver_error("cuMemcpyHtoD"))
    }

    /// A zero-filled device buffer of `len` elements.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(len).map_err(driver_error("cuMemAlloc"))
    }

    /// Waits for [`CudaDevice::stream`], then copies `src` to the host.
    pub fn download<T: DeviceRepr + Default + Clone>(&self, src: &impl DevicePtr<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(src).map_err(driver_error("cuMemcpyDtoH"))
    }

    /// Blocks until all work on [`CudaDevice::stream`] is done, surfacing asynchronous kernel errors.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_error("cuStreamSynchronize"))?;
        self.ctx.check_err().map_err(driver_error("deferred CUDA error"))
    }
}

/// Copies `src` to `dst` (at least as long) on `stream`, device to device.
pub fn copy_device<T, S: DevicePtr<T>, D: DevicePtrMut<T>>(
    stream: &Arc<CudaStream>,
    src: &S,
    dst: &mut D,
) -> Result<()> {
    if dst.len() < src.len() {
        return Err(Error::invalid(
            "copy destination",
            format!("{} elements", dst.len()),
            format!("must hold the {} source elements", src.len()),
        ));
    }
    stream.memcpy_dtod(src, dst).map_err(driver_error("cuMemcpyDtoDAsync"))
}

/// Times work on a stream between two timing-enabled CUDA events (cudarc's `new_event(None)` creates events
/// without timing, whose `elapsed_ms` fails).
pub struct StreamTimer {
    start: CudaEvent,
    stop: CudaEvent,
}

impl StreamTimer {
    /// Two events created with `CU_EVENT_DEFAULT` (timing on).
    pub fn new(device: &CudaDevice) -> Result<Self> {
        let event = || {
            device
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_error("cuEventCreate"))
        };
        Ok(Self {
            start: event()?,
            stop: event()?,
        })
    }

    /// Marks the start on `stream`.
    pub fn start(&self, stream: &CudaStream) -> Result<()> {
        self.start.record(stream).map_err(driver_error("cuEventRecord"))
    }

    /// Marks the end on `stream`, waits for it, and returns the milliseconds between the marks.
    pub fn stop_ms(&self, stream: &CudaStream) -> Result<f64> {
        self.stop(stream)?;
        self.elapsed_ms()
    }

    /// Marks the end on `stream` without waiting (read it later with [`StreamTimer::elapsed_ms`]), so that the
    /// stream's next work follows without a gap.
    pub fn stop(&self, stream: &CudaStream) -> Result<()> {
        self.stop.record(stream).map_err(driver_error("cuEventRecord"))
    }

    /// Waits for the end mark and returns the milliseconds between the marks.
    pub fn elapsed_ms(&self) -> Result<f64> {
        self.stop.synchronize().map_err(driver_error("cuEventSynchronize"))?;
        let ms = self
            .start
            .elapsed_ms(&self.stop)
            .map_err(driver_error("cuEventElapsedTime"))?;
        Ok(ms as f64)
    }
}

/// Launch helper shared by operators: maps a launch failure to [`Error::Cuda`] naming the kernel.
pub(crate) fn launch_error(kernel: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| cuda_error(format!("launch of {kernel}"), e)
}
