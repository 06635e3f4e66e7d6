//! CUDA side of `lowbit bench --op conv` (not written yet).

use super::{BenchArgs, Sink};
use lowbit::{Error, Result};

/// Benchmarks the CUDA conv kernels against their baseline in the same run.
pub fn run(_args: &BenchArgs, _sink: &mut Sink) -> Result<()> {
    Err(Error::Unsupported("bench --op conv on CUDA".into()))
}
