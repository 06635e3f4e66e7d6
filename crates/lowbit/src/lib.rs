//! # lowbit
//!
//! Low-bit quantized inference kernels: int4/int8 weights from AWQ, GPTQ and compressed-tensors checkpoints
//! (and per-block quantized convolution weights), dequantized or multiplied with f32/f16/bf16 activations on
//! NVIDIA GPUs (kernels compiled at run time with NVRTC) or on any CPU.
//!
//! Layout of the crate:
//! - [`formats`]: one module per checkpoint format, all converting through [`formats::QuantMatrix`].
//! - [`quantize`]: round-to-nearest quantization (f32, or AutoAWQ's fp16 arithmetic bit for bit).
//! - [`ops`]: one module per operation; in each, `reference` (f64, the ground truth), `cpu` and `cuda`.
//! - [`checkpoint`]: reading model directories / safetensors, writing checkpoints atomically.
//! - [`cuda`]: the CUDA backend (device discovery, NVRTC module cache, launches).
//! - `testing` (hidden): seeded inputs shared by the tests, `lowbit bench` and `lowbit demo`.

pub mod checkpoint;
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod formats;
pub mod ops;
pub mod quantize;
pub mod tensor;
#[doc(hidden)]
pub mod testing;

pub use dtype::{DType, Float};
pub use error::{Error, Result};
pub use formats::QuantMatrix;
pub use tensor::{Tensor, TensorRef};
