//! Operations. Each has its own module holding, side by side, `reference` (f64 accumulation, the ground truth),
//! `cpu` (the fast CPU kernel) and `cuda` (the launcher of the CUDA kernel of the same name in `kernels/`).

pub mod activation;
pub mod conv;
pub mod conv_int8;
pub mod dequantize;
pub mod linear;
pub mod w8a8;

pub use activation::Activation;
