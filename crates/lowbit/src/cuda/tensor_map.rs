//! TMA tensor maps (`CUtensorMap`): how a Hopper kernel's producer reads a 2D tile of a global matrix with one
//! instruction. The host encodes the map once per (buffer, shape) and passes it by value as a `__grid_constant__`
//! kernel parameter (`TensorMap` in `kernels/common.cuh`).

use crate::dtype::DType;
use crate::error::{Error, Result};
use cudarc::driver::{sys, DeviceRepr};

/// An encoded tensor map, laid out as the kernel's 64-byte aligned `TensorMap` parameter.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct TensorMap(sys::CUtensorMap);

impl TensorMap {
    /// A map that no copy may use: the parameter of a kernel variant that reads no tensor.
    pub(crate) fn unused() -> TensorMap {
        // SAFETY: CUtensorMap is plain data; all zeros is a valid (never dereferenced) value.
        TensorMap(unsafe { std::mem::zeroed() })
    }
}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap")
    }
}

// SAFETY: 128 bytes of plain data, `#[repr(C)]` and aligned like the kernel's `struct alignas(64) TensorMap`.
unsafe impl DeviceRepr for TensorMap {}
// SAFETY: the map is an opaque value (addresses and sizes); the driver reads it only at launch.
unsafe impl Send for TensorMap {}
// SAFETY: as above; it is never mutated after encoding.
unsafe impl Sync for TensorMap {}

/// Element type of a mapped matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapElement {
    U8,
    F16,
    Bf16,
    F32,
}

impl MapElement {
    /// The element of a 16-bit activation matrix: bf16 for [`DType::Bf16`], fp16 otherwise.
    pub(crate) fn activation(dtype: DType) -> MapElement {
        if dtype == DType::Bf16 {
            MapElement::Bf16
        } else {
            MapElement::F16
        }
    }

    fn bytes(self) -> usize {
        match self {
            MapElement::U8 => 1,
            MapElement::F16 | MapElement::Bf16 => 2,
            MapElement::F32 => 4,
        }
    }

    fn data_type(self) -> sys::CUtensorMapDataType {
        use sys::CUtensorMapDataType as D;
        match self {
            MapElement::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            MapElement::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            MapElement::Bf16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            MapElement::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

/// A row-major `[rows, cols]` matrix of `element`s at device address `ptr`, `stride` elements between rows, read
/// in boxes of `box_cols` x `box_rows`. `swizzle_128b`: the box's 128-byte rows land in the 128-byte swizzle that
/// wgmma descriptors read (`box_cols` must then span at most 128 bytes); otherwise densely. Reads outside the
/// matrix return zeros. `what` names the matrix in errors.
pub(crate) fn tensor_map_2d(
    what: &str,
    element: MapElement,
    ptr: u64,
    (rows, cols, stride): (usize, usize, usize),
    (box_rows, box_cols): (usize, usize),
    swizzle_128b: bool,
) -> Result<TensorMap> {
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(stride * element.bytes()) as u64];
    let boxes: [u32; 2] = [box_cols as u32, box_rows as u32];
    let element_strides: [u32; 2] = [1, 1];
    let swizzle = if swizzle_128b {
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
    } else {
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
    };
    // SAFETY: an all-zero CUtensorMap is a valid value to be overwritten by the encoder.
    let mut map = TensorMap(unsafe { std::mem::zeroed() });
    // SAFETY: every pointer refers to a live local array of the rank the call says (2 dims, 1 stride).
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map.0,
            element.data_type(),
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Cuda {
            context: format!("cuTensorMapEncodeTiled for {what} ([{rows}, {cols}], row stride {stride})"),
            message: format!("{rc:?}"),
        });
    }
    Ok(map)
}
