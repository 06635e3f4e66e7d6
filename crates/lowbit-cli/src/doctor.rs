//! `lowbit doctor`: what CUDA pieces were found, and does every kernel compile.

use lowbit::cuda::{self, CudaDevice, KernelSource};
use std::time::Instant;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Compile every kernel with NVRTC without touching a GPU.
    #[arg(long)]
    pub compile_only: bool,
    /// Target architecture for --compile-only: sm_80 | sm_89 | sm_90a
    #[arg(long)]
    pub arch: Option<String>,
    /// With --compile-only: also write each kernel family's CUBIN to DIR/<name>.<arch>.cubin (for nvdisasm).
    #[arg(long, value_name = "DIR")]
    pub save_cubin: Option<std::path::PathBuf>,
}

pub fn run(a: DoctorArgs) -> lowbit::Result<()> {
    if a.compile_only {
        let arch = a.arch.as_deref().unwrap_or("sm_90a");
        if !arch.starts_with("sm_") {
            return Err(lowbit::Error::invalid(
                "--arch",
                arch,
                format!("must be a real architecture (sm_XY) such as {:?}", cuda::KNOWN_ARCHES),
            ));
        }
        report_toolchain();
        return compile_all(arch, true, a.save_cubin.as_deref());
    }
    if a.save_cubin.is_some() {
        return Err(lowbit::Error::invalid(
            "--save-cubin",
            a.save_cubin.unwrap_or_default().display().to_string(),
            "is only used with --compile-only",
        ));
    }
    if a.arch.is_some() {
        return Err(lowbit::Error::invalid(
            "--arch",
            a.arch.unwrap_or_default(),
            "is only used with --compile-only (a GPU run compiles for the GPU's own arch)",
        ));
    }

    println!(
        "driver library  {}",
        if cuda::driver_present() { "found" } else { "NOT FOUND" }
    );
    match cuda::driver_version() {
        Ok(v) => println!("driver CUDA     {}.{}", v / 1000, (v % 1000) / 10),
        Err(e) => println!("driver CUDA     {e}"),
    }
    println!(
        "cuBLAS          {}",
        if cuda::cublas_present() { "found" } else { "NOT FOUND" }
    );
    report_toolchain();
    let dev = CudaDevice::new(0)?;
    let info = dev.info();
    println!("GPU 0           {}", info.name);
    println!(
        "compute         {}.{} -> {}, {} SMs, L2 {} MiB, {:.1} GiB",
        info.compute_capability.0,
        info.compute_capability.1,
        info.arch,
        info.sm_count,
        info.l2_bytes >> 20,
        info.total_memory as f64 / (1u64 << 30) as f64
    );
    compile_all(&info.arch, false, None)?;
    // Load every module through the cache, as operators do.
    for k in cuda::KERNELS {
        let t = Instant::now();
        dev.module(k)?;
        println!("loaded {:<14} {:>8.1} ms (through the cache)", k.name, ms(t));
    }
    println!("ok");
    Ok(())
}

fn report_toolchain() {
    match cuda::nvrtc_version() {
        Ok((major, minor)) => println!("NVRTC           {major}.{minor}"),
        Err(e) => println!("NVRTC           {e}"),
    }
    match cuda::include_dir() {
        Some(d) => println!("include path    {}", d.display()),
        None => println!("include path    NOT FOUND (set CUDA_HOME; needs cuda_fp16.h)"),
    }
    match cuda::cache_dir() {
        Some(d) => println!("kernel cache    {}", d.display()),
        None => println!("kernel cache    none (no HOME / XDG_CACHE_HOME / LOWBIT_CACHE_DIR)"),
    }
}

/// Compiles every kernel source with NVRTC (bypassing the cache; several at once) and prints the times in order,
/// with `resources` ptxas's resource usage too; with `save`, writes each CUBIN there (atomically, replacing an older
/// dump).
fn compile_all(arch: &str, resources: bool, save: Option<&std::path::Path>) -> lowbit::Result<()> {
    if let Some(dir) = save {
        std::fs::create_dir_all(dir).map_err(|e| lowbit::Error::io(dir, e))?;
    }
    let compiled = cuda::on_compile_threads(cuda::KERNELS, |k| {
        let t = Instant::now();
        cuda::compile(k, arch).map(|c| (c, ms(t)))
    });
    for (k, compiled) in cuda::KERNELS.iter().zip(compiled) {
        let (compiled, ms) = compiled?;
        report(k, arch, &compiled, ms, resources)?;
        if let Some(dir) = save {
            let path = dir.join(format!("{}.{arch}.cubin", k.name));
            lowbit::checkpoint::write_file_atomic(&path, &compiled.cubin, true)?;
            println!("  saved {}", path.display());
        }
    }
    Ok(())
}

/// Prints one kernel's compile time (with `resources`, its ptxas lines too), and refuses a kernel that uses local
/// memory or whose wgmma pipeline ptxas serialised.
fn report(k: &KernelSource, arch: &str, compiled: &cuda::Compiled, ms: f64, resources: bool) -> lowbit::Result<()> {
    println!(
        "compiled {:<12} for {arch}: {:>7.1} ms, {} KiB CUBIN",
        k.name,
        ms,
        compiled.cubin.len() >> 10
    );
    if resources {
        for line in compiled.resource_lines() {
            println!("  {}", line.trim());
        }
    }
    // A kernel that spills (or keeps arrays in local memory) is a performance bug CI should see: the W4A16 GEMM
    // once ran 30% slower from a split-K epilogue that did, with every test passing.
    let local: Vec<&str> = compiled
        .resource_lines()
        .filter(|l| l.contains("spill") || l.contains("stack frame"))
        .filter(|l| !l.contains(" 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"))
        .collect();
    if !local.is_empty() {
        return Err(lowbit::Error::Compile {
            kernel: k.name.to_string(),
            arch: arch.to_string(),
            log: format!("uses local memory (spills or a stack frame): {local:?}"),
        });
    }
    // So is a wgmma pipeline ptxas serialises or had to add waits to.
    let serialised = compiled.wgmma_serialisation();
    if !serialised.is_empty() {
        return Err(lowbit::Error::Compile {
            kernel: k.name.to_string(),
            arch: arch.to_string(),
            log: format!("serialised wgmma pipeline, or waits ptxas had to add: {serialised:?}"),
        });
    }
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
