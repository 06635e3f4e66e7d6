//! Dequantization: a [`QuantMatrix`] to its dense weight, `W[n, k] = (code - zero) * scale`.
//!
//! - [`reference`](mod@reference): the f64 ground truth.
//! - [`cpu`]: the rayon kernel, bit for bit what AutoAWQ's `dequantize_gemm` and the CUDA kernel produce.
//!
//! The CUDA launcher lives beside them in `cuda.rs`.

pub mod cpu;
pub mod cuda;
pub mod reference;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::formats::QuantMatrix;
use crate::tensor::Tensor;
use half::{bf16, f16};

/// Orientation of a dense output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[N, K]` = `[out, in]`, `nn.Linear`'s weight (what `lowbit dequantize` writes).
    Nk,
    /// `[K, N]` = `[in, out]`, `W^T` (what AutoAWQ's `dequantize_gemm` returns).
    Kn,
}

impl Layout {
    /// The dense shape of `q` in this layout.
    pub fn shape(self, q: &QuantMatrix) -> Vec<usize> {
        match self {
            Layout::Nk => vec![q.n, q.k],
            Layout::Kn => vec![q.k, q.n],
        }
    }
}

/// Dequantizes `q` on the CPU into an owned tensor of `dtype` (f32, f16 or bf16) in `layout`.
pub fn dequantize_to_tensor(q: &QuantMatrix, layout: Layout, dtype: DType) -> Result<Tensor> {
    fn run<T: crate::dtype::Float>(q: &QuantMatrix, layout: Layout, bytes: impl Fn(T) -> Vec<u8>) -> Result<Vec<u8>> {
        let mut out = vec![T::default(); q.n * q.k];
        cpu::dequantize(q, layout, &mut out)?;
        Ok(out.into_iter().flat_map(bytes).collect())
    }
    let data = match dtype {
        DType::F32 => run::<f32>(q, layout, |v| v.to_le_bytes().to_vec())?,
        DType::F16 => run::<f16>(q, layout, |v| v.to_le_bytes().to_vec())?,
        DType::Bf16 => run::<bf16>(q, layout, |v| v.to_le_bytes().to_vec())?,
        other => {
            return Err(Error::invalid(
                "dtype",
                other,
                "dequantized output must be f32, f16 or bf16",
            ))
        }
    };
    Ok(Tensor {
        dtype,
        shape: layout.shape(q),
        data,
    })
}
