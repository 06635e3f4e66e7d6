//! W4A16 / W8A16 linear layer: `y[M, N] = x[M, K] · W^T (+ bias)` with `W` an int4/int8 [`QuantMatrix`].
//!
//! - [`reference`](mod@reference): exact dequantization and f64 accumulation, the ground truth every kernel is tested against.
//! - [`cpu`]: [`LinearCpu`], the fast CPU kernel (weights repacked once, decoded inside the FMA loop).
//!
//! [`QuantMatrix`]: crate::formats::QuantMatrix

pub mod cpu;
pub mod cuda;
pub mod quant_linear;
pub mod reference;

pub use crate::ops::activation::Activation;
pub use cpu::{CpuIsa, LinearCpu};
pub use quant_linear::{DispatchTable, LinearKernel, QuantLinear};
