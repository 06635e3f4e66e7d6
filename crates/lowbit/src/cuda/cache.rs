//! The compiled-kernel cache: in memory for the process, and on disk across processes.
//!
//! A disk entry is keyed by a hash of everything that decides the CUBIN: the kernel source, `common.cuh`, the
//! compile options (which carry the architecture and include path), the NVRTC version and lowbit's version. The
//! entry carries its length and a checksum of its payload, so a truncated or corrupt file is recompiled and
//! overwritten, never loaded. Entries are written to a temporary file and renamed into place (atomic on POSIX).
//! A cache that cannot be read or written only costs a recompile.

use super::nvrtc::{self, Compiled, KernelSource};
use crate::error::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// First bytes of every cache entry (format version 1).
const MAGIC: &[u8; 8] = b"LBCUBIN1";
/// Magic + payload length + payload checksum.
const HEADER_LEN: usize = 8 + 8 + 8;

/// Where a compiled kernel came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Already compiled by this process.
    Memory,
    /// Read from the disk cache.
    Disk,
    /// Compiled by NVRTC now (and written to the disk cache when possible).
    Compiled,
}

/// The disk cache directory: `$LOWBIT_CACHE_DIR`, else `$XDG_CACHE_HOME/lowbit`, else `~/.cache/lowbit`.
pub fn cache_dir() -> Option<PathBuf> {
    let non_empty = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty()).map(PathBuf::from);
    non_empty("LOWBIT_CACHE_DIR")
        .or_else(|| non_empty("XDG_CACHE_HOME").map(|d| d.join("lowbit")))
        .or_else(|| non_empty("HOME").map(|d| d.join(".cache").join("lowbit")))
}

/// One kernel's place in the memory cache: empty until its CUBIN is compiled or read from disk. Each has its own
/// lock, held across the compile, so two threads asking for the same kernel compile it once while different
/// kernels compile at the same time (NVRTC is thread-safe).
type Slot = Arc<Mutex<Option<Arc<Vec<u8>>>>>;
type MemoryCache = Mutex<HashMap<(&'static str, String), Slot>>;

fn memory() -> &'static MemoryCache {
    static CACHE: OnceLock<MemoryCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Compiles at most this many kernels at once in [`prefetch`]: a GEMM variant's NVRTC run holds ~250 MB.
const MAX_PARALLEL_COMPILES: usize = 8;

/// The CUBIN of `kernel` for `arch`: from memory, from disk, or compiled by NVRTC (then stored in both).
pub fn cubin(kernel: &KernelSource, arch: &str) -> Result<(Arc<Vec<u8>>, CacheOutcome)> {
    let slot: Slot = {
        let mut memory = memory().lock().unwrap_or_else(|e| e.into_inner());
        memory.entry((kernel.name, arch.to_string())).or_default().clone()
    };
    let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(hit) = slot.as_ref() {
        return Ok((hit.clone(), CacheOutcome::Memory));
    }
    let path = entry_path(kernel, arch);
    let (image, outcome) = match path.as_deref().and_then(read_entry) {
        Some(image) => (image, CacheOutcome::Disk),
        None => {
            let Compiled { cubin, .. } = nvrtc::compile(kernel, arch)?;
            if let Some(path) = &path {
                write_entry(path, &cubin);
            }
            (cubin, CacheOutcome::Compiled)
        }
    };
    let image = Arc::new(image);
    *slot = Some(image.clone());
    Ok((image, outcome))
}

/// Brings the CUBINs of `kernels` for `arch` into the memory cache, compiling those not on disk in parallel (up to
/// [`MAX_PARALLEL_COMPILES`] at once), so an operator with several variants pays for its slowest compile rather than
/// for their sum. Returns the first error in `kernels`' order.
pub fn prefetch(kernels: &[&KernelSource], arch: &str) -> Result<()> {
    // Kernels already in memory need no thread (the common case: every layer of a model after the first).
    let in_memory = |k: &KernelSource| {
        let memory = memory().lock().unwrap_or_else(|e| e.into_inner());
        let slot = memory.get(&(k.name, arch.to_string()));
        slot.is_some_and(|slot| slot.try_lock().is_ok_and(|image| image.is_some()))
    };
    let missing: Vec<&KernelSource> = kernels.iter().copied().filter(|k| !in_memory(k)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    on_compile_threads(&missing, |k| cubin(k, arch).map(drop))
        .into_iter()
        .collect()
}

/// `f` over `items` on a pool of up to [`MAX_PARALLEL_COMPILES`] threads (a pool of its own, so compiles neither
/// wait for nor crowd out the CPU kernels' global pool), the results in `items`' order.
pub fn on_compile_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.min(MAX_PARALLEL_COMPILES).min(items.len()).max(1))
        .build()
    {
        Ok(pool) => pool.install(|| items.par_iter().map(&f).collect()),
        Err(_) => items.iter().map(f).collect(), // no threads to be had: one at a time
    }
}

/// The disk path of `kernel`'s entry for `arch`, or `None` without a cache directory or NVRTC.
pub fn entry_path(kernel: &KernelSource, arch: &str) -> Option<PathBuf> {
    let dir = cache_dir()?;
    let (major, minor) = nvrtc::nvrtc_version().ok()?;
    let options = nvrtc::compile_options(arch, nvrtc::include_dir().as_deref());
    let mut h = Fnv64::new();
    for part in [
        kernel.source,
        nvrtc::COMMON_HEADER,
        &options.join(" "),
        &format!("nvrtc {major}.{minor}"),
        env!("CARGO_PKG_VERSION"),
    ] {
        h.write(part.as_bytes());
        h.write(&[0xff]); // separator: ("ab", "c") and ("a", "bc") hash differently
    }
    Some(dir.join(format!("{}-{arch}-{:016x}.cubin", kernel.name, h.finish())))
}

/// Reads an entry, or `None` when it is absent, truncated or fails its checksum.
fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < HEADER_LEN || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    let payload = &bytes[HEADER_LEN..];
    (payload.len() == len && checksum(payload) == sum).then(|| payload.to_vec())
}

/// Writes an entry atomically (temporary file in the same directory, then rename); failures are ignored.
fn write_entry(path: &Path, payload: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let mut bytes = Vec::with_capacity(HEADER_LEN + payload.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&checksum(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    if std::fs::write(&tmp, &bytes).is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn checksum(payload: &[u8]) -> u64 {
    let mut h = Fnv64::new();
    h.write(payload);
    h.finish()
}

/// FNV-1a, 64 bit: stable across Rust versions and platforms (unlike `DefaultHasher`), which a key on disk needs.
struct Fnv64(u64);

impl Fnv64 {
    fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrupt_or_truncated_entries_are_rejected() {
        let dir = std::env::temp_dir().join(format!("lowbit-cache-test-{}", std::process::id()));
        let path = dir.join("k-sm_90a-0.cubin");
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        write_entry(&path, &payload);
        assert_eq!(read_entry(&path).as_deref(), Some(&payload[..]));

        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_LEN + 10] ^= 1; // one flipped bit in the payload
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read_entry(&path), None);

        bytes[HEADER_LEN + 10] ^= 1;
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap(); // truncated
        assert_eq!(read_entry(&path), None);

        std::fs::write(&path, b"LBCUBIN1").unwrap(); // header only
        assert_eq!(read_entry(&path), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Prefetched kernels are then served from memory, and threads asking for one kernel at once get one image.
    #[test]
    fn prefetch_fills_memory_and_concurrent_requests_share_one_cubin() {
        if !nvrtc::nvrtc_present() || nvrtc::include_dir().is_none() {
            println!("skipped: NVRTC or cuda_fp16.h not found");
            return;
        }
        const fn tiny(name: &'static str, source: &'static str) -> KernelSource {
            KernelSource { name, source }
        }
        const A: KernelSource = tiny("cache_test_a", "extern \"C\" __global__ void a(int *p) { *p = 1; }");
        const B: KernelSource = tiny("cache_test_b", "extern \"C\" __global__ void b(int *p) { *p = 2; }");
        const C: KernelSource = tiny("cache_test_c", "extern \"C\" __global__ void c(int *p) { *p = 3; }");
        prefetch(&[&A, &B], "sm_80").unwrap();
        for k in [&A, &B] {
            assert_eq!(cubin(k, "sm_80").unwrap().1, CacheOutcome::Memory, "{}", k.name);
        }
        let images = on_compile_threads(&[(); 4], |_| cubin(&C, "sm_80").unwrap().0);
        assert!(images.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        assert!(prefetch(&[&tiny("cache_test_bad", "not C++")], "sm_80").is_err());
    }

    #[test]
    fn fnv_is_the_reference_fnv1a() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(checksum(b""), 0xcbf29ce484222325);
        assert_eq!(checksum(b"a"), 0xaf63dc4c8601ec8c);
    }
}
