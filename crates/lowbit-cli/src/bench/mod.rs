//! `lowbit bench`: our kernels and the dense baseline, timed in the same process.

mod cpu;
mod cuda;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// cpu | cuda | cuda:N | auto
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// dequant | linear | w8a8 | conv (all when absent)
    #[arg(long)]
    pub op: Option<String>,
    /// MxKxN (repeatable)
    #[arg(long)]
    pub shape: Vec<String>,
    /// JSON lines (shared/bench-format.md) instead of a table
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: BenchArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("bench: not yet implemented".into()))
}
