//! CUDA side of `lowbit bench --op w8a8` (not written yet).

use super::{BenchArgs, Sink};
use lowbit::{Error, Result};

/// Benchmarks the CUDA w8a8 kernels against their baseline in the same run.
pub fn run(_args: &BenchArgs, _sink: &mut Sink) -> Result<()> {
    Err(Error::Unsupported("bench --op w8a8 on CUDA".into()))
}
