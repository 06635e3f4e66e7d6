//! `lowbit doctor`: what CUDA pieces were found, and does every kernel compile.

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Compile every kernel with NVRTC without touching a GPU.
    #[arg(long)]
    pub compile_only: bool,
    /// Target architecture for --compile-only: sm_80 | sm_89 | sm_90a
    #[arg(long)]
    pub arch: Option<String>,
}

pub fn run(_a: DoctorArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("doctor: not yet implemented".into()))
}
