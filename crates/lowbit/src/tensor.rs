//! Plain host tensors: the currency between checkpoints, formats and the CLI.
//!
//! [`TensorRef`] borrows bytes (typically from a memory-mapped safetensors file); [`Tensor`] owns them. Both are
//! little-endian, row-major, as safetensors stores them. The typed readers validate dtype and shape and name the
//! tensor in their errors.

use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};

/// A borrowed tensor: dtype, shape and little-endian bytes.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// An owned tensor: dtype, shape and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

fn shape_str(shape: &[usize]) -> String {
    format!("shape {shape:?}")
}

impl<'a> TensorRef<'a> {
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<usize>, data: &'a [u8]) -> Result<Self> {
        let name = name.into();
        let want = shape.iter().product::<usize>() * dtype.size();
        if data.len() != want {
            return Err(Error::invalid(
                &name,
                format!("{} bytes for {} {dtype}", data.len(), shape_str(&shape)),
                "data length must equal product(shape) * dtype size",
            ));
        }
        Ok(Self {
            name,
            dtype,
            shape,
            data,
        })
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Fails unless the tensor is 2-D; returns (rows, cols).
    pub fn dims2(&self) -> Result<(usize, usize)> {
        match self.shape[..] {
            [r, c] => Ok((r, c)),
            _ => Err(Error::invalid(&self.name, shape_str(&self.shape), "must be 2-D")),
        }
    }

    /// Fails unless the shape equals `want` (the rule text says what the dims mean, e.g. "[K, N/8]").
    pub fn expect_shape(&self, want: &[usize], meaning: &str) -> Result<()> {
        if self.shape == want {
            Ok(())
        } else {
            Err(Error::invalid(
                &self.name,
                shape_str(&self.shape),
                format!("expected {want:?} = {meaning}"),
            ))
        }
    }

    fn expect_dtype(&self, allowed: &[DType]) -> Result<()> {
        if allowed.contains(&self.dtype) {
            Ok(())
        } else {
            let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
            Err(Error::invalid(
                &self.name,
                format!("dtype {}", self.dtype),
                format!("dtype must be {}", names.join(" or ")),
            ))
        }
    }

    /// Reads an I32 tensor.
    pub fn to_i32(&self) -> Result<Vec<i32>> {
        self.expect_dtype(&[DType::I32])?;
        Ok(self
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Reads an I8 tensor.
    pub fn to_i8(&self) -> Result<Vec<i8>> {
        self.expect_dtype(&[DType::I8])?;
        Ok(self.data.iter().map(|&b| b as i8).collect())
    }

    /// Reads an I8 or U8 tensor as raw bytes.
    pub fn to_u8(&self) -> Result<Vec<u8>> {
        self.expect_dtype(&[DType::U8, DType::I8])?;
        Ok(self.data.to_vec())
    }

    /// Reads any float tensor as f32 (exact for f16/bf16).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.expect_dtype(&[DType::F32, DType::F16, DType::Bf16])?;
        Ok(match self.dtype {
            DType::F32 => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            DType::F16 => self
                .data
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::Bf16 => self
                .data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => unreachable!("checked above"),
        })
    }

    /// Like [`TensorRef::to_f32`], but also rejects NaN/Inf (for scales).
    pub fn to_finite_f32(&self) -> Result<Vec<f32>> {
        let v = self.to_f32()?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::invalid(
                &self.name,
                format!("{} at flat index {i}", v[i]),
                "values must be finite",
            ));
        }
        Ok(v)
    }

    pub fn to_owned(&self) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data: self.data.to_vec(),
        }
    }
}

impl Tensor {
    /// Borrows this tensor under `name` (for the typed readers and their error messages).
    pub fn view(&self, name: impl Into<String>) -> TensorRef<'_> {
        TensorRef {
            name: name.into(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            data: &self.data,
        }
    }

    pub fn from_i32(shape: Vec<usize>, v: &[i32]) -> Self {
        Self {
            dtype: DType::I32,
            shape,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    pub fn from_i8(shape: Vec<usize>, v: &[i8]) -> Self {
        Self {
            dtype: DType::I8,
            shape,
            data: v.iter().map(|&x| x as u8).collect(),
        }
    }

    /// Stores f32 values as `dtype` (F32, F16 or BF16), rounding to nearest even.
    pub fn from_f32(shape: Vec<usize>, v: &[f32], dtype: DType) -> Self {
        let data = match dtype {
            DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DType::F16 => v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect(),
            DType::Bf16 => v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
            other => panic!("Tensor::from_f32: {other} is not a float dtype (caller bug)"),
        };
        Self { dtype, shape, data }
    }
}
