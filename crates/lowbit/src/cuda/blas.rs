//! One cuBLASLt "TN" product, planned once: `y[M, N] = x[M, K] · W^T` with `W` a row-major `[N, K]` matrix (in
//! cuBLAS's column-major view, `y^T = (W as K × N)^T · (x^T as K × M)`). The handle, descriptors, a 32 MiB workspace
//! (NVIDIA's recommendation for Hopper) and the heuristic's first algorithm are made in [`LtMatmul::new`], so a call
//! is one `cublasLtMatmul`. The baselines `lowbit bench` measures (`cublaslt_int8`, `cublaslt_fp16`) and the int8
//! convolution's GEMM are this plan.

use crate::cuda::{driver_error, CudaSlice, CudaStream, DevicePtrMut};
use crate::error::{ensure, Error, Result};
use cudarc::cublaslt::{result as lt, sys as lts};
use std::sync::Arc;

/// The element types of a product: what the operands hold, what `y` holds, and how it accumulates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LtTypes {
    /// int8 operands, int32 accumulation and output (the IMMA kernels).
    Int8,
    /// f16 operands and output, fp32 accumulation.
    F16,
    /// bf16 operands and output, fp32 accumulation.
    Bf16,
}

impl LtTypes {
    /// (operand type, output type, compute type, scale type)
    fn types(
        self,
    ) -> (
        lts::cudaDataType,
        lts::cudaDataType,
        lts::cublasComputeType_t,
        lts::cudaDataType,
    ) {
        use lts::{cublasComputeType_t as C, cudaDataType as D};
        match self {
            LtTypes::Int8 => (D::CUDA_R_8I, D::CUDA_R_32I, C::CUBLAS_COMPUTE_32I, D::CUDA_R_32I),
            LtTypes::F16 => (D::CUDA_R_16F, D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
            LtTypes::Bf16 => (D::CUDA_R_16BF, D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, D::CUDA_R_32F),
        }
    }
}

/// The workspace cuBLAS recommends on Hopper (4 MiB suffices before it).
pub const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A planned cuBLASLt product (see the module documentation).
pub struct LtMatmul {
    handle: lts::cublasLtHandle_t,
    desc: lts::cublasLtMatmulDesc_t,
    layouts: [lts::cublasLtMatrixLayout_t; 3],
    algo: lts::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    types: LtTypes,
    /// (m, n, k)
    pub(crate) dims: (usize, usize, usize),
}

impl std::fmt::Debug for LtMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LtMatmul")
            .field("types", &self.types)
            .field("dims", &self.dims)
            .finish_non_exhaustive()
    }
}

/// A cuBLAS or cuBLASLt status as [`Error::Cuda`], `context` naming the call.
pub(crate) fn blas_error<E: std::fmt::Debug>(context: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Cuda {
        context: context.into(),
        message: format!("{e:?}"),
    }
}

impl LtMatmul {
    /// Plans the product of an `m × k` x and an `n × k` W on `context`, the workspace allocated on `stream`.
    pub fn new(
        context: &Arc<cudarc::driver::CudaContext>,
        stream: &Arc<CudaStream>,
        types: LtTypes,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { lts::is_culib_present() } {
            return Err(Error::CudaUnavailable("cuBLASLt (libcublasLt.so.13) not found".into()));
        }
        context.bind_to_thread().map_err(driver_error("cuCtxSetCurrent"))?;
        let (operand, output, compute, scale) = types.types();
        let handle = lt::create_handle().map_err(blas_error("cublasLtCreate"))?;
        // From here on `plan` owns what is created, so an error drops (destroys) it.
        let mut plan = Self {
            handle,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            // SAFETY: a plain C struct of integers, overwritten by the heuristic below.
            algo: unsafe { std::mem::zeroed() },
            workspace: stream
                .alloc_zeros(BLAS_WORKSPACE_BYTES)
                .map_err(driver_error("cuMemAlloc"))?,
            types,
            dims: (m, n, k),
        };
        plan.desc = lt::create_matmul_desc(compute, scale).map_err(blas_error("cublasLtMatmulDescCreate"))?;
        let transpose = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // SAFETY: a live descriptor; the value is a cublasOperation_t as the attribute requires.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transpose as *const _ as *const _,
                std::mem::size_of_val(&transpose),
            )
        }
        .map_err(blas_error("cublasLtMatmulDescSetAttribute"))?;
        let layout = |t, rows: usize, cols: usize| {
            lt::create_matrix_layout(t, rows as u64, cols as u64, rows as i64)
                .map_err(blas_error("cublasLtMatrixLayoutCreate"))
        };
        plan.layouts[0] = layout(operand, k, n)?;
        plan.layouts[1] = layout(operand, k, m)?;
        plan.layouts[2] = layout(output, n, m)?;
        let pref = lt::create_matmul_pref().map_err(blas_error("cublasLtMatmulPreferenceCreate"))?;
        // SAFETY: live preference, the value is the u64 the attribute takes.
        let set = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &(BLAS_WORKSPACE_BYTES as u64) as *const u64 as *const _,
                8,
            )
        };
        // SAFETY: every descriptor is live.
        let heuristic = set.and_then(|_| unsafe {
            let l = plan.layouts;
            lt::get_matmul_algo_heuristic(plan.handle, plan.desc, l[0], l[1], l[2], l[2], pref)
        });
        // SAFETY: created above, destroyed once.
        unsafe { lt::destroy_matmul_pref(pref) }.map_err(blas_error("cublasLtMatmulPreferenceDestroy"))?;
        plan.algo = heuristic.map_err(blas_error("cublasLtMatmulAlgoGetHeuristic"))?.algo;
        Ok(plan)
    }

    /// Checks that `w`, `x` and `y` hold the N·K, M·K and M·N elements the product reads and writes.
    pub fn check_lengths(&self, w: usize, x: usize, y: usize) -> Result<()> {
        let (m, n, k) = self.dims;
        ensure(w >= n * k, "w", w, "needs N · K elements")?;
        ensure(x >= m * k, "x", x, "needs M · K elements")?;
        ensure(y >= m * n, "y", y, "needs M · N elements")
    }

    /// Runs the product on `stream` from device addresses: `w` N·K, `x` M·K operands, `y` M·N outputs.
    ///
    /// # Safety
    /// The three addresses must hold that many elements of the plan's types, and stay alive until the stream has
    /// run the call.
    pub unsafe fn run_raw(&mut self, stream: &CudaStream, w: u64, x: u64, y: u64) -> Result<()> {
        let (alpha_i, beta_i) = (1i32, 0i32);
        let (alpha_f, beta_f) = (1f32, 0f32);
        let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) = match self.types {
            LtTypes::Int8 => (&alpha_i as *const i32 as _, &beta_i as *const i32 as _),
            LtTypes::F16 | LtTypes::Bf16 => (&alpha_f as *const f32 as _, &beta_f as *const f32 as _),
        };
        let ws_len = self.workspace.len();
        let ws = self.workspace.device_ptr_mut(stream).0;
        // SAFETY: the caller guarantees w, x and y; the descriptors and workspace live as long as `self`.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                alpha,
                beta,
                w as *const _,
                self.layouts[0],
                x as *const _,
                self.layouts[1],
                y as *const _,
                self.layouts[2],
                y as *mut _,
                self.layouts[2],
                &self.algo,
                ws as *mut _,
                ws_len,
                stream.cu_stream() as *mut _,
            )
        }
        .map_err(blas_error("cublasLtMatmul"))
    }
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects with no thread affinity; `run_raw` takes `&mut self`,
// so one thread at a time uses them.
unsafe impl Send for LtMatmul {}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        // SAFETY: each object was created in `new` (null when creation stopped before it) and is destroyed once;
        // errors at teardown are ignored.
        unsafe {
            for l in self.layouts.into_iter().filter(|l| !l.is_null()) {
                let _ = lt::destroy_matrix_layout(l);
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
