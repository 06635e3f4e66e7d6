//! Launches that cudarc's launch builder does not express: thread-block clusters and programmatic dependent launch
//! are launch attributes, so these go through `cuLaunchKernelEx` (the W4A16 decode kernel and the Hopper GEMM), and
//! the occupancy query for clusters that sizes their split-K plans.

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream};

/// How many clusters of `ctas` CTAs (along x) of `function`, launched with `block` threads and `smem` bytes of
/// dynamic shared memory per CTA, the GPU keeps resident at once; 0 when it cannot schedule that size at all.
pub(crate) fn resident_cluster_count(function: &CudaFunction, block: u32, smem: usize, ctas: usize) -> usize {
    let mut cluster = [cluster_attribute(ctas)];
    let config = launch_config((ctas as u32, 1), block, smem, std::ptr::null_mut(), &mut cluster);
    let mut count = 0i32;
    // SAFETY: `config` and `cluster` are live locals; `count` receives one int. A size the GPU cannot schedule is
    // an error or 0: either way no cluster of that size.
    let rc = unsafe { sys::cuOccupancyMaxActiveClusters(&mut count, function.cu_function(), &config) };
    if rc == sys::CUresult::CUDA_SUCCESS {
        count.max(0) as usize
    } else {
        0
    }
}

/// A launch of `grid` x `grid_y` CTAs of `block` threads with `smem` bytes of dynamic shared memory, in thread-block
/// clusters of `cluster` CTAs along x if given, and as the programmatic dependent of the stream's previous kernel if
/// `dependent` (the kernel then waits itself where it reads that kernel's output).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub grid: u32,
    pub grid_y: u32,
    pub block: u32,
    pub smem: usize,
    pub cluster: Option<usize>,
    pub dependent: bool,
}

/// Launches `function` as `launch` says. Clusters and dependent launch are launch attributes, which cudarc's launch
/// builder does not express, hence cuLaunchKernelEx. The driver copies the attributes and the parameters at launch.
/// A refused launch is [`Error::Cuda`] with `context()` ("launching ...") and the driver's code.
///
/// # Safety
/// `params` must point at the kernel's parameters, in order, each valid for everything the kernel does with it.
pub(crate) unsafe fn launch_ex(
    function: &CudaFunction,
    stream: &CudaStream,
    launch: Launch,
    params: &mut [*mut std::ffi::c_void],
    context: impl FnOnce() -> String,
) -> Result<()> {
    // A fixed array, not a Vec: a launch allocates nothing. Slots past `used` are never read.
    let mut attributes = [dependent_launch_attribute(); 2];
    let mut used = 0;
    if let Some(ctas) = launch.cluster {
        attributes[used] = cluster_attribute(ctas);
        used += 1;
    }
    if launch.dependent {
        attributes[used] = dependent_launch_attribute();
        used += 1;
    }
    let config = launch_config(
        (launch.grid, launch.grid_y),
        launch.block,
        launch.smem,
        stream.cu_stream(),
        &mut attributes[..used],
    );
    // SAFETY: `config` and `attributes` are alive across the call; the caller vouches for `params`.
    let rc = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            function.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    match rc {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        rc => Err(Error::Cuda {
            context: context(),
            message: format!("{rc:?}"),
        }),
    }
}

/// A launch of `grid` (x, y) CTAs of `block` threads with `smem` bytes of dynamic shared memory on
/// `stream` (null: none, for occupancy queries), with `attributes`, which must outlive its use.
fn launch_config(
    grid: (u32, u32),
    block: u32,
    smem: usize,
    stream: sys::CUstream,
    attributes: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem as u32,
        hStream: stream,
        attrs: attributes.as_mut_ptr(),
        numAttrs: attributes.len() as u32,
    }
}

/// The launch attribute for clusters of `ctas` CTAs along x.
fn cluster_attribute(ctas: usize) -> sys::CUlaunchAttribute {
    // SAFETY: CUlaunchAttribute is plain old data; all-zero is a valid value to fill in.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: ctas as u32,
        y: 1,
        z: 1,
    };
    attribute
}

/// The launch attribute that lets a kernel start before the previous one in its stream has finished (programmatic
/// dependent launch): it waits itself (`griddepcontrol.wait`) where it reads that kernel's output.
fn dependent_launch_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: CUlaunchAttribute is plain old data; all-zero is a valid value to fill in.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    attribute
}
