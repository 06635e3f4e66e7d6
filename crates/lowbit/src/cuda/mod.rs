//! The CUDA backend: device selection, the NVRTC module cache (memory + disk), device buffers and launches.
//!
//! Nothing here needs CUDA at build time: cudarc loads `libcuda`, `libnvrtc` and `libcublas` when first used, and
//! every entry point checks that they are present first (cudarc panics when a library is missing), so a machine
//! without a GPU gets [`Error::CudaUnavailable`] and `--device auto` falls back to the CPU.
//!
//! How an operator is built on this module (see `ops::dequantize::cuda` for the first one):
//! 1. `Op::new(&CudaDevice, description)` validates shapes, dtypes, alignment rules and group sizes once, picks a
//!    kernel and resolves it with [`CudaDevice::function`] (compiled by NVRTC on first use, then cached), and
//!    reports the scratch it needs with `workspace_bytes()`.
//! 2. `op.run(&stream, buffers.., workspace)` checks buffer lengths and alignment (host-side, no device access) and
//!    launches on the caller's stream: no allocation, no synchronisation, so it can be captured in a CUDA graph.

pub mod blas;
mod cache;
mod device;
mod launch;
mod nvrtc;
mod tensor_map;

pub use cache::{cache_dir, on_compile_threads, CacheOutcome};
pub use device::{copy_device, CudaDevice, DeviceInfo, StreamTimer};
pub(crate) use launch::{launch_ex, resident_cluster_count, Launch};
pub use nvrtc::{
    arch_for, compile, compile_options, experiment_defines, include_dir, nvrtc_present, nvrtc_version, variant_source,
    Compiled, KernelSource, COMMON_HEADER, DEQUANTIZE, KERNELS, KNOWN_ARCHES,
};
pub(crate) use tensor_map::{tensor_map_2d, MapElement, TensorMap};

/// The CUBIN of a kernel for an architecture, through the memory and disk caches.
pub use cache::cubin as cached_cubin;
pub(crate) use device::launch_error;

pub use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    ValidAsZeroBits,
};

use crate::error::{Error, Result};
use std::sync::Arc;

pub use cudarc::driver::CudaGraph;

/// Captures the work `record` enqueues on `stream` into an instantiated CUDA graph (relaxed capture mode, so
/// modules may still be loaded meanwhile). Replay it with `graph.launch()`; it runs on `stream`.
pub fn capture_graph(stream: &Arc<CudaStream>, record: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(driver_error("cuStreamBeginCapture"))?;
    let recorded = record();
    // End the capture even when recording failed, so the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    recorded?;
    graph
        .map_err(driver_error("cuStreamEndCapture"))?
        .ok_or_else(|| Error::CudaUnavailable("stream capture produced no graph".into()))
}

/// Where an operation runs: the CPU, or one CUDA GPU.
#[derive(Debug, Clone)]
pub enum Device {
    /// The host CPU (rayon threads).
    Cpu,
    /// A CUDA GPU.
    Cuda(Arc<CudaDevice>),
}

impl Device {
    /// Parses a `--device` value: `cpu`, `cuda` (= `cuda:0`), `cuda:N`, or `auto` (the first GPU when CUDA is
    /// usable, otherwise the CPU, saying why on one line of stderr). `cuda`/`cuda:N` fail when CUDA is unusable.
    pub fn from_spec(spec: &str) -> Result<Device> {
        match spec.trim() {
            "cpu" => Ok(Device::Cpu),
            "auto" => match CudaDevice::new(0) {
                Ok(dev) => Ok(Device::Cuda(dev)),
                Err(e) => {
                    eprintln!("lowbit: {e}; using the CPU");
                    Ok(Device::Cpu)
                }
            },
            "cuda" => Ok(Device::Cuda(CudaDevice::new(0)?)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(CudaDevice::new(n)?)),
                _ => Err(Error::invalid("--device", other, "must be auto, cpu, cuda or cuda:N")),
            },
        }
    }

    /// The GPU, if this is one.
    pub fn cuda(&self) -> Option<&Arc<CudaDevice>> {
        match self {
            Device::Cuda(d) => Some(d),
            Device::Cpu => None,
        }
    }

    /// `cpu`, or the GPU's name.
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".to_string(),
            Device::Cuda(d) => d.info().name.clone(),
        }
    }
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether cuBLAS can be loaded.
pub fn cublas_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Whether cuBLASLt can be loaded.
pub fn cublaslt_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::cublaslt::sys::is_culib_present() }
}

/// Checks that the driver and NVRTC load and that a GPU is present; the error says which piece is missing.
pub fn probe() -> Result<()> {
    if !driver_present() {
        return Err(Error::CudaUnavailable("no CUDA driver (libcuda.so.1) found".into()));
    }
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable(
            "NVRTC (libnvrtc.so.13) not found; add its directory to LD_LIBRARY_PATH".into(),
        ));
    }
    match device_count()? {
        0 => Err(Error::CudaUnavailable("the CUDA driver reports no GPU".into())),
        _ => Ok(()),
    }
}

/// Number of CUDA GPUs (0 when the driver fails to initialise, e.g. no GPU or no kernel module).
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(Error::CudaUnavailable("no CUDA driver (libcuda.so.1) found".into()));
    }
    // A driver too old for a symbol cudarc binds makes cudarc panic; report it rather than abort.
    let count = std::panic::catch_unwind(|| {
        cudarc::driver::result::init()?;
        cudarc::driver::result::device::get_count()
    })
    .map_err(|_| Error::CudaUnavailable("the CUDA driver lacks a required entry point (too old?)".into()))?;
    match count {
        Ok(n) => Ok(n.max(0) as usize),
        // CUDA_ERROR_NO_DEVICE and friends: a driver without a usable GPU.
        Err(e) => Err(Error::CudaUnavailable(format!(
            "CUDA driver initialisation failed: {e}"
        ))),
    }
}

/// The driver's CUDA version (13000 = 13.0).
pub fn driver_version() -> Result<i32> {
    if !driver_present() {
        return Err(Error::CudaUnavailable("no CUDA driver (libcuda.so.1) found".into()));
    }
    let mut v = 0;
    // SAFETY: one out-pointer to a live integer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(driver_error("cuDriverGetVersion"))?;
    Ok(v)
}

/// [`Error::Cuda`] for a failed driver call (also for code that calls cudarc directly, such as the probes in
/// `examples/`).
pub fn cuda_error(context: impl Into<String>, e: cudarc::driver::DriverError) -> Error {
    let message = match (e.error_name(), e.error_string()) {
        (Ok(name), Ok(text)) => format!("{} ({})", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{:?}", e.0),
    };
    Error::Cuda {
        context: context.into(),
        message,
    }
}

/// `map_err` adapter for [`cuda_error`].
pub fn driver_error(context: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    let context = context.into();
    move |e| cuda_error(context, e)
}

/// Checks a device buffer a launcher is about to hand to a kernel: at least `need` elements (it holds `have`) and
/// `align`-byte aligned. Returns its address, or a typed error naming the tensor, the value and the rule.
pub(crate) fn checked_buffer(ptr: u64, have: usize, need: usize, name: &str, align: u64) -> crate::Result<u64> {
    if have < need {
        return Err(crate::Error::invalid(
            name,
            format!("{have} elements"),
            format!("needs at least {need}"),
        ));
    }
    if ptr % align != 0 {
        return Err(crate::Error::invalid(
            name,
            format!("address {ptr:#x}"),
            format!("must be {align}-byte aligned"),
        ));
    }
    Ok(ptr)
}
