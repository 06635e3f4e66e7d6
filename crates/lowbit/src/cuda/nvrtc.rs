//! NVRTC: the embedded kernel sources, where `cuda_fp16.h` lives, and compiling a source to CUBIN.
//!
//! Every kernel file `#include "common.cuh"`; the header is handed to NVRTC from memory, so the only files NVRTC
//! reads from disk are the CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`) found by [`include_dir`].

use crate::error::{Error, Result};
use cudarc::nvrtc::sys as nvrtc_sys;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};

/// One `.cu` file of `crates/lowbit/kernels`, embedded in the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// File stem (`"dequantize"`): names the module in errors, logs and the disk cache.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub source: &'static str,
}

/// Device code shared by every kernel, passed to NVRTC as the in-memory header `common.cuh`.
pub const COMMON_HEADER: &str = include_str!("../../kernels/common.cuh");

/// `kernels/dequantize.cu`: packed int4/int8 -> f16/bf16.
pub const DEQUANTIZE: KernelSource = KernelSource {
    name: "dequantize",
    source: include_str!("../../kernels/dequantize.cu"),
};

/// Every kernel source of the crate; `lowbit doctor` compiles each. Add new `.cu` files here.
pub const KERNELS: &[KernelSource] = &[
    DEQUANTIZE,
    crate::ops::linear::cuda::KERNEL,
    crate::ops::linear::cuda::gemm::KERNEL,
    crate::ops::w8a8::cuda::KERNEL,
    crate::ops::conv::cuda::KERNEL,
];

/// `source` with a variant's `#define`s prepended, named `name` (unique per variant): made once per process and
/// leaked (a handful per process), because [`KernelSource`] holds `&'static str`s and the module cache keys on them.
pub fn variant_source(name: String, defines: impl FnOnce() -> String, source: &'static str) -> &'static KernelSource {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static SOURCES: OnceLock<Mutex<HashMap<String, &'static KernelSource>>> = OnceLock::new();
    let mut map = SOURCES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    map.entry(name).or_insert_with_key(|name| {
        Box::leak(Box::new(KernelSource {
            name: Box::leak(name.clone().into_boxed_str()),
            source: Box::leak((defines() + source).into_boxed_str()),
        }))
    })
}

/// Experiments: `#define` lines from the environment variable `var` (`NAME=VALUE` pairs separated by `;`), appended to
/// a kernel family's variant sources (`LOWBIT_GEMM_DEFINES` for the GEMM, `LOWBIT_DECODE_DEFINES` for the decode
/// kernel), so that one binary can time kernel options that are not variant fields yet: an experiment puts them in
/// the kernel behind `#ifndef` defaults (as 128e305 did with `LB_KS_PRODUCERS` and `LB_KS_EARLY_RELEASE`, now the
/// K-split tile's code). They follow the variant's own defines, so they cannot override those. The kernel cache is
/// keyed by the source, so each setting compiles once.
pub fn experiment_defines(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_default()
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .map(|(name, value)| format!("#define {} {}\n", name.trim(), value.trim()))
        .collect()
}

/// The architectures `lowbit doctor --compile-only` accepts (others are passed to NVRTC as given).
pub const KNOWN_ARCHES: &[&str] = &["sm_80", "sm_86", "sm_89", "sm_90a"];

/// The NVRTC target for a compute capability: `sm_90a` on Hopper (wgmma/setmaxnreg), `sm_XY` elsewhere.
pub fn arch_for(major: i32, minor: i32) -> String {
    match (major, minor) {
        (9, 0) => "sm_90a".to_string(),
        _ => format!("sm_{major}{minor}"),
    }
}

/// Whether the NVRTC library can be loaded (checked before any call: cudarc panics when it is missing).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable(
            "NVRTC (libnvrtc.so) not found; add its directory to LD_LIBRARY_PATH".into(),
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    check(rc, "nvrtcVersion")?;
    Ok((major, minor))
}

/// The directory holding `cuda_fp16.h`: `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, or
/// the `include` beside a `lib` directory on `LD_LIBRARY_PATH` (the layout of the pip `nvidia-cuda-*` wheels).
pub fn include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            candidates.push(PathBuf::from(v).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        for lib in std::env::split_paths(&paths) {
            if let Some(parent) = lib.parent() {
                candidates.push(parent.join("include"));
            }
        }
    }
    candidates.into_iter().find(|d| d.join("cuda_fp16.h").is_file())
}

/// The options every kernel is compiled with (also part of the disk-cache key).
pub fn compile_options(arch: &str, include: Option<&Path>) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        // Exactness of the conversions relies on explicit rounding; no fast-math.
        "--fmad=true".to_string(),
        // Registers, shared memory and spills of every kernel go into the log (`lowbit doctor`).
        "--ptxas-options=-v".to_string(),
    ];
    if let Some(dir) = include {
        opts.push(format!("--include-path={}", dir.display()));
    }
    // LOWBIT_NVRTC_LINEINFO=1: source lines in the CUBIN, so that compute-sanitizer and Nsight Compute name the
    // kernel line of a hazard or a stall (`scripts/device-sanitize.sh`). It does not change the code generated.
    if std::env::var_os("LOWBIT_NVRTC_LINEINFO").is_some_and(|v| v == "1") {
        opts.push("--generate-line-info".to_string());
    }
    opts
}

/// A kernel compiled to CUBIN for one architecture.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN image, loadable with `cuModuleLoadData`.
    pub cubin: Vec<u8>,
    /// NVRTC's log, including `ptxas info` resource lines.
    pub log: String,
}

impl Compiled {
    /// The `ptxas info` lines of the log (registers, shared memory, stack, spills per kernel).
    pub fn resource_lines(&self) -> impl Iterator<Item = &str> {
        self.log
            .lines()
            .filter(|l| l.contains("ptxas info") || l.contains("stack frame") || l.contains("spill"))
    }

    /// The log's lines of kernels with a stack frame or spills (local memory): empty when every kernel keeps its
    /// state in registers and shared memory.
    pub fn local_memory(&self) -> Vec<&str> {
        self.log
            .lines()
            .filter(|l| l.contains("stack frame"))
            .filter(|l| !l.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"))
            .collect()
    }

    /// The log's warnings that ptxas serialised a wgmma pipeline (C7514, C7515: it cannot prove that no other
    /// instruction touches an in-flight accumulator, so every wgmma waits for the one before) or injected waits
    /// of its own (C7517, C7519: a register use it could not match to one of ours). Every test still passes with
    /// either; only the speed shows it.
    pub fn wgmma_serialisation(&self) -> Vec<&str> {
        self.log
            .lines()
            .filter(|l| l.contains("are serialized") || l.contains("is injected"))
            .collect()
    }
}

/// Compiles `kernel` for `arch` (e.g. `sm_90a`) to CUBIN. Needs NVRTC, not a GPU.
pub fn compile(kernel: &KernelSource, arch: &str) -> Result<Compiled> {
    nvrtc_version()?; // presence check, before any other NVRTC symbol is touched
    let include = include_dir();
    if include.is_none() {
        return Err(Error::CudaUnavailable(
            "cuda_fp16.h not found: set CUDA_HOME to a CUDA toolkit (or the pip nvidia/cu13 directory)".into(),
        ));
    }
    let options = compile_options(arch, include.as_deref());
    let program = Program::new(kernel)?;
    let compiled = program.compile(&options);
    let log = program.log();
    let compile_error = |detail: String| Error::Compile {
        kernel: kernel.name.to_string(),
        arch: arch.to_string(),
        log: if log.trim().is_empty() { detail } else { log.clone() },
    };
    compiled.map_err(&compile_error)?;
    let cubin = program.cubin().map_err(&compile_error)?;
    Ok(Compiled { cubin, log })
}

/// Owns an `nvrtcProgram` and the strings it points into.
struct Program {
    handle: nvrtc_sys::nvrtcProgram,
    _strings: Vec<CString>,
}

impl Program {
    fn new(kernel: &KernelSource) -> Result<Self> {
        let cstr = |s: &str, what: &str| {
            CString::new(s).map_err(|_| Error::Compile {
                kernel: kernel.name.into(),
                arch: String::new(),
                log: format!("{what} contains a NUL byte"),
            })
        };
        let source = cstr(kernel.source, "source")?;
        let name = cstr(&format!("{}.cu", kernel.name), "name")?;
        let header = cstr(COMMON_HEADER, "common.cuh")?;
        let header_name = cstr("common.cuh", "header name")?;
        let headers = [header.as_ptr()];
        let header_names = [header_name.as_ptr()];
        let mut handle: nvrtc_sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a NUL-terminated string kept alive in `_strings` for the program's life.
        let rc = unsafe {
            nvrtc_sys::nvrtcCreateProgram(
                &mut handle,
                source.as_ptr(),
                name.as_ptr(),
                1,
                headers.as_ptr(),
                header_names.as_ptr(),
            )
        };
        check(rc, "nvrtcCreateProgram")?;
        Ok(Self {
            handle,
            _strings: vec![source, name, header, header_name],
        })
    }

    fn compile(&self, options: &[String]) -> std::result::Result<(), String> {
        let c_opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).unwrap_or_default())
            .collect();
        let ptrs: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: `ptrs` points into `c_opts`, alive for the call.
        let rc = unsafe { nvrtc_sys::nvrtcCompileProgram(self.handle, ptrs.len() as i32, ptrs.as_ptr()) };
        check(rc, "nvrtcCompileProgram").map_err(|e| e.to_string())
    }

    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: live program handle; the buffer has the size NVRTC asked for.
        unsafe {
            if nvrtc_sys::nvrtcGetProgramLogSize(self.handle, &mut size) != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                return String::new();
            }
            let mut buf = vec![0 as c_char; size.max(1)];
            if nvrtc_sys::nvrtcGetProgramLog(self.handle, buf.as_mut_ptr()) != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                return String::new();
            }
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
        }
    }

    fn cubin(&self) -> std::result::Result<Vec<u8>, String> {
        let mut size = 0usize;
        // SAFETY: live, compiled program handle; the buffer has the size NVRTC reported.
        unsafe {
            check(
                nvrtc_sys::nvrtcGetCUBINSize(self.handle, &mut size),
                "nvrtcGetCUBINSize",
            )
            .map_err(|e| e.to_string())?;
            if size == 0 {
                return Err("NVRTC produced no CUBIN (was a virtual compute_XY architecture given?)".into());
            }
            let mut buf = vec![0u8; size];
            check(
                nvrtc_sys::nvrtcGetCUBIN(self.handle, buf.as_mut_ptr() as *mut c_char),
                "nvrtcGetCUBIN",
            )
            .map_err(|e| e.to_string())?;
            Ok(buf)
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from nvrtcCreateProgram and is destroyed once.
        unsafe {
            nvrtc_sys::nvrtcDestroyProgram(&mut self.handle);
        }
    }
}

fn check(rc: nvrtc_sys::nvrtcResult, call: &str) -> Result<()> {
    if rc == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            context: call.to_string(),
            message: format!("{rc:?}"),
        })
    }
}
