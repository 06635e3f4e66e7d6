//! How fast can one pass read a weight-sized buffer, by load path? The decode kernel streams its weights with TMA
//! bulk copies (16 KB units, 3 stages, two CTAs per SM) at ~3.8 TB/s, where cuBLAS's fp16 GEMV reads at ~4.4 TB/s.
//! This times the two load paths alone, on the same bytes: plain 16-byte loads by every thread (`ldg`) and a
//! producer warp's bulk copies into a ring of stages that consumer threads release (`tma`), each CTA on a contiguous
//! range. Buffers rotate beyond 2x L2, so every pass reads device memory.
//!
//! Then the same ring on a 2 MiB window that stays in L2 (unit u of a CTA is read at u mod 128), one CTA on each of
//! 8 ... 132 SMs: how fast one SM's shared memory fills from L2 when few or all SMs ask. The W4A16 GEMM's tiles all
//! land 29-34 GB/s per SM (`docs/notes/w4a16-gemm.md`, "The K-split tile"): if the rate per SM stays there with few
//! SMs asking, an SM's intake is the limit; if it rises, the L2 is (and a TMA multicast of x would pay).
//!
//! Last, the GEMM's stages without its math: x from L2 and the codes from memory per stage, at the sizes of the
//! K-split, 64- and 128-token tiles, with the consumers reading x from shared memory as the wgmmas do, or not; and in
//! clusters of two CTAs that share x, each copying it or multicasting it to both (`stages_mc`'s modes). Then the
//! split-K exchange between the two CTAs of a cluster, by DSMEM or through global memory (`exchange`).
//!
//! ```text
//! cargo run --release --example stream_probe -- [MB per buffer, default 122]
//! LOWBIT_PROBE=stages cargo run --release --example stream_probe   # the stages and the exchange only
//! ```

use cudarc::driver::{LaunchConfig, PushKernelArg};
use lowbit::cuda::{CudaDevice, CudaSlice, DevicePtr, KernelSource, StreamTimer};

const SOURCE: &str = r#"
#include "common.cuh"
using namespace lowbit;

// One 16-byte load that bypasses L1 (each word is read once), as the weight streams read.
__device__ __forceinline__ uint4 ldg_nc(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// CTA c reads 16-byte words [c n / ctas, (c + 1) n / ctas), UNROLL loads in flight per thread.
template <int UNROLL>
__device__ void ldg_stream(const uint4* __restrict__ src, long long n, long long ctas, unsigned* out) {
    const long long b = (long long)blockIdx.x * n / ctas, e = (long long)(blockIdx.x + 1) * n / ctas;
    unsigned acc = 0;
    for (long long i = b + threadIdx.x; i < e; i += (long long)blockDim.x * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            const long long k = i + (long long)j * blockDim.x;
            v[j] = k < e ? ldg_nc(src + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;  // keeps the loads
}
extern "C" __global__ void ldg4(const uint4* src, long long n, long long ctas, unsigned* out) {
    ldg_stream<4>(src, n, ctas, out);
}
extern "C" __global__ void ldg8(const uint4* src, long long n, long long ctas, unsigned* out) {
    ldg_stream<8>(src, n, ctas, out);
}

// CTA c reads `per_cta` 16-byte words of an L2-resident window of `wrap` words (a power of two; word k at k mod
// wrap) by plain loads, UNROLL in flight per thread: the load/store unit's path from L2, against the bulk copies'
// below.
template <int UNROLL>
__device__ void ldg_window(const uint4* __restrict__ src, long long per_cta, long long wrap, unsigned* out) {
    const long long b = (long long)blockIdx.x * per_cta;
    unsigned acc = 0;
    for (long long i = threadIdx.x; i < per_cta; i += (long long)blockDim.x * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) {
            v[j] = ldg_nc(src + ((b + i + (long long)j * blockDim.x) & (wrap - 1)));
        }
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}
extern "C" __global__ void ldg_l2(const uint4* src, long long per_cta, long long wrap, unsigned* out) {
    ldg_window<8>(src, per_cta, wrap, out);
}

// The producer of a ring of `stages` buffers of `unit` bytes (one thread): for each of `count` stages it waits until
// the consumers have freed the buffer, announces `unit` bytes on its full barrier and issues copy(i, buffer, full).
template <class Copy>
__device__ void produce_ring(char* smem, u32 bars, int count, int stages, int unit, const Copy& copy) {
    for (int i = 0, buf = 0; i < count; ++i) {
        if (i >= stages) mbar_wait(bars + (stages + buf) * 8, ((i / stages) - 1) & 1);
        mbar_arrive_expect_tx(bars + buf * 8, unit);
        copy(i, smem + buf * unit, bars + buf * 8);
        if (++buf == stages) buf = 0;
    }
}

// Both paths at once: the `tma` ring on an L2 window (16 KB units), and each stage the 256 consumer threads also
// load `extra` 16-byte words each from the window (a power-of-two count of words) by plain loads, before they
// release the stage.
extern "C" __global__ void tma_ldg(const char* src, int count, int unit, int stages, int window, int extra,
                                   unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const u32 bars = smem_addr(smem + stages * unit);
    if (threadIdx.x == 0) init_pipeline_barriers(bars, stages, 256);
    __syncthreads();
    if (threadIdx.x >= 256) {
        if (threadIdx.x == 256) {
            produce_ring(smem, bars, count, stages, unit, [&](int i, char* dst, u32 full) {
                bulk_copy(dst, src + (long long)((blockIdx.x + i) % window) * unit, unit, full);
            });
        }
        return;
    }
    const uint4* words = reinterpret_cast<const uint4*>(src);
    const long long wrap = (long long)window * unit / 16;
    unsigned acc = 0;
    for (int i = 0, buf = 0; i < count; ++i) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (j < extra) {
                const long long at = (long long)(blockIdx.x * 7 + i) * 256 * extra + j * 256 + threadIdx.x;
                v[j] = ldg_nc(words + (at & (wrap - 1)));
            }
        }
        mbar_wait(bars + buf * 8, (i / stages) & 1);
        acc ^= reinterpret_cast<const unsigned*>(smem + buf * unit)[threadIdx.x];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (j < extra) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
        mbar_arrive(bars + (stages + buf) * 8);
        if (++buf == stages) buf = 0;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// CTA c copies units [c units / ctas, ...) of `unit` bytes into a ring of `stages`; 256 consumer threads read one
// word each and release the stage. Thread 256 issues the copies. `window` > 0: unit u is read at u mod window.
extern "C" __global__ void tma(const char* src, long long units, int ctas, int unit, int stages, int window,
                               unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const u32 bars = smem_addr(smem + stages * unit);
    const long long b = (long long)blockIdx.x * units / ctas, e = (long long)(blockIdx.x + 1) * units / ctas;
    const int count = (int)(e - b);
    if (threadIdx.x == 0) init_pipeline_barriers(bars, stages, 256);
    __syncthreads();
    if (threadIdx.x >= 256) {
        if (threadIdx.x == 256) {
            produce_ring(smem, bars, count, stages, unit, [&](int i, char* dst, u32 full) {
                const long long u = window > 0 ? (b + i) % window : b + i;
                bulk_copy(dst, src + u * unit, unit, full);
            });
        }
        return;
    }
    unsigned acc = 0;
    for (int i = 0, buf = 0; i < count; ++i) {
        mbar_wait(bars + buf * 8, (i / stages) & 1);
        acc ^= reinterpret_cast<const unsigned*>(smem + buf * unit)[threadIdx.x];
        mbar_arrive(bars + (stages + buf) * 8);
        if (++buf == stages) buf = 0;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// The consumers of the stage kernels below (threads 0..255): wait for each stage, read its x part `reads` times
// with 16-byte shared loads (as the wgmmas read x as their B operand: 2 passes a stage for the K-split tile, 4 for the
// 64- and 128-token tiles), touch the codes, and release it.
__device__ void consume_stages(const char* smem, u32 bars, int count, int x_unit, int unit, int nstages, int reads,
                               unsigned* out) {
    unsigned acc = 0;
    for (int i = 0, buf = 0; i < count; ++i) {
        mbar_wait(bars + buf * 8, (i / nstages) & 1);
        const u32 stage = smem_addr(smem + buf * unit);
        // Up to 8 independent 16-byte loads a thread per pass (x_unit <= 32 KB, a power of two), all in flight.
        for (int r = 0; r < reads; ++r) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int at = (threadIdx.x + j * 256) * 16;
                if (at < x_unit) {
                    const uint4 v = lds128(stage + ((at + r * 528) & (x_unit - 1)));
                    acc ^= v.x ^ v.y ^ v.z ^ v.w;
                }
            }
        }
        acc ^= reinterpret_cast<const unsigned*>(smem + buf * unit + x_unit)[threadIdx.x];
        mbar_arrive(bars + (nstages + buf) * 8);
        if (++buf == nstages) buf = 0;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

// The GEMM's stages without its math: each stage is `x_unit` bytes from an L2 window (x: unit u at u mod window) and
// `w_unit` bytes from device memory (the codes: CTA c's contiguous range, wrapping at w_units), by two bulk copies.
// The 256 consumer threads are `consume_stages`.
extern "C" __global__ void stages(const char* x, int window, const char* w, long long w_units, int count,
                                  int x_unit, int w_unit, int nstages, int reads, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const int unit = x_unit + w_unit;
    const u32 bars = smem_addr(smem + nstages * unit);
    if (threadIdx.x == 0) init_pipeline_barriers(bars, nstages, 256);
    __syncthreads();
    if (threadIdx.x >= 256) {
        if (threadIdx.x == 256) {
            produce_ring(smem, bars, count, nstages, unit, [&](int i, char* dst, u32 full) {
                const long long wu = ((long long)blockIdx.x * count + i) % w_units;
                bulk_copy(dst, x + (long long)((blockIdx.x + i) % window) * x_unit, x_unit, full);
                bulk_copy(dst + x_unit, w + wu * w_unit, w_unit, full);
            });
        }
        return;
    }
    consume_stages(smem, bars, count, x_unit, unit, nstages, reads, out);
}

// The same stages with a producer warpgroup (threads 256..383) that copies x by 16-byte cp.async (the load/store
// unit's path, which takes in more per SM than bulk copies: `l2_paths`) while its first thread copies the codes by
// one bulk copy (`lsu` 1), or copies both by cp.async (`lsu` 2); `lsu` 0 copies both by bulk copies as `stages`
// does. Each producer thread's cp.async complete on the stage's full barrier (cp.async.mbarrier.arrive.noinc), so
// it counts 128 arrivals plus the bulk copies' one.
extern "C" __global__ void stages_lsu(const char* x, int window, const char* w, long long w_units, int count,
                                      int x_unit, int w_unit, int nstages, int reads, int lsu, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const int unit = x_unit + w_unit;
    const u32 bars = smem_addr(smem + nstages * unit);
    if (threadIdx.x == 0) {
        for (int st = 0; st < nstages; ++st) {
            mbar_init(bars + st * 8, lsu == 2 ? 128 : lsu == 1 ? 129 : 1);
            mbar_init(bars + (nstages + st) * 8, 256);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x >= 256) {
        const int p = threadIdx.x - 256;
        for (int i = 0, buf = 0; i < count; ++i) {
            if (i >= nstages) mbar_wait(bars + (nstages + buf) * 8, ((i / nstages) - 1) & 1);
            const u32 full = bars + buf * 8, dst = smem_addr(smem + buf * unit);
            const long long wu = ((long long)blockIdx.x * count + i) % w_units;
            const char* xs = x + (long long)((blockIdx.x + i) % window) * x_unit;
            const char* ws = w + wu * w_unit;
            if (lsu == 0) {
                if (p == 0) {
                    mbar_arrive_expect_tx(full, unit);
                    bulk_copy(dst, xs, x_unit, full);
                    bulk_copy(dst + x_unit, ws, w_unit, full);
                }
            } else {
                if (lsu == 1 && p == 0) {
                    mbar_arrive_expect_tx(full, w_unit);
                    bulk_copy(dst + x_unit, ws, w_unit, full);
                }
                for (int at = p * 16; at < x_unit; at += 128 * 16) cp_async16_shared(dst + at, xs + at);
                if (lsu == 2)
                    for (int at = p * 16; at < w_unit; at += 128 * 16) cp_async16_shared(dst + x_unit + at, ws + at);
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(full) : "memory");
            }
            if (++buf == nstages) buf = 0;
        }
        return;
    }
    consume_stages(smem, bars, count, x_unit, unit, nstages, reads, out);
}

// The same stages in clusters of two CTAs that stream the same x (cluster c's units) and their own codes. `mode`:
// 0: each CTA copies all of x itself;
// 1: CTA r copies half r of each x unit into both CTAs' stages (.multicast::cluster), so each SM requests half the
//    x bytes and still receives all of them; consumers release a stage with one arrival per warp on both CTAs'
//    empty barriers (the peer's producer writes into it too), the remote one with .release.cluster;
// 2: as 1, the remote arrival with the default semantics (.release.cta), as CUTLASS's ClusterBarrier::arrive;
// 3: as 2, but CTA 0 multicasts each whole x unit and CTA 1 copies none (one request per unit, as a TMA tensor
//    multicast of a cluster's shared operand does).
extern "C" __global__ void __cluster_dims__(2, 1, 1)
    stages_mc(const char* x, int window, const char* w, long long w_units, int count, int x_unit, int w_unit,
              int nstages, int mode, unsigned* out) {
    extern __shared__ __align__(128) char smem[];
    const int unit = x_unit + w_unit;
    const bool multicast = mode != 0;
    const u32 bars = smem_addr(smem + nstages * unit);
    u32 rank;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    if (threadIdx.x == 0) init_pipeline_barriers(bars, nstages, multicast ? 16 : 8);
    cluster_sync();  // both CTAs' barriers exist before any remote arrival or copy
    unsigned acc = 0;
    if (threadIdx.x == 256) {
        const int half = x_unit / 2;
        for (int i = 0, buf = 0; i < count; ++i) {
            if (i >= nstages) mbar_wait(bars + (nstages + buf) * 8, ((i / nstages) - 1) & 1);
            const u32 full = bars + buf * 8, dst = smem_addr(smem + buf * unit);
            mbar_arrive_expect_tx(full, unit);
            const char* xs = x + (long long)((blockIdx.x / 2 + i) % window) * x_unit;
            if (multicast) {
                const int part = mode == 3 ? x_unit : half, at = mode == 3 ? 0 : rank * half;
                if (mode != 3 || rank == 0)
                    asm volatile(
                        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                        " [%0], [%1], %2, [%3], %4;\n" ::"r"(dst + at),
                        "l"(xs + at), "r"(part), "r"(full), "h"((unsigned short)3)
                        : "memory");
            } else {
                bulk_copy(dst, xs, x_unit, full);
            }
            const long long wu = ((long long)blockIdx.x * count + i) % w_units;
            bulk_copy(dst + x_unit, w + wu * w_unit, w_unit, full);
            if (++buf == nstages) buf = 0;
        }
    } else if (threadIdx.x < 256) {
        for (int i = 0, buf = 0; i < count; ++i) {
            mbar_wait(bars + buf * 8, (i / nstages) & 1);
            acc ^= reinterpret_cast<const unsigned*>(smem + buf * unit)[threadIdx.x];
            __syncwarp();
            const u32 empty = bars + (nstages + buf) * 8;
            if ((threadIdx.x & 31) == 0) {
                mbar_arrive(empty);
                if (mode == 1)
                    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                                     cluster_map(empty, rank ^ 1))
                                 : "memory");
                else if (multicast)
                    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_map(empty, rank ^ 1))
                                 : "memory");
            }
            if (++buf == nstages) buf = 0;
        }
    }
    cluster_sync();  // no CTA exits while its peer may still copy into it or arrive on its barriers
    if (acc == 0x9e3779b9u) out[0] = acc;
}
// A split-K exchange between the two CTAs of a cluster, `floats` fp32 per CTA, `iters` times over: each CTA hands
// its peer `floats` values, a cluster barrier, the peer sums them, a cluster barrier (before the next round writes).
// mode 0: pushed into the peer's shared memory (st.shared::cluster, 16 bytes a store), read back from its own, as
//         the GEMM's split epilogue does;
// mode 1: through global memory: stored into this CTA's workspace slot, the peer's slot loaded from L2 (.cg);
// mode 2: the two barriers alone.
extern "C" __global__ void __cluster_dims__(2, 1, 1)
    exchange(float* ws, int floats, int iters, int mode, unsigned* out) {
    extern __shared__ __align__(16) float4 slab[];
    u32 rank;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    const int n4 = floats / 4;
    float4* mine = reinterpret_cast<float4*>(ws) + (size_t)blockIdx.x * n4;
    const float4* theirs = reinterpret_cast<const float4*>(ws) + (size_t)(blockIdx.x ^ 1) * n4;
    const u32 base = smem_addr(slab), peer = cluster_map(base, rank ^ 1);
    float acc = 0.0f;
    cluster_sync();
    for (int it = 0; it < iters; ++it) {
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            const float f = (float)(i + it);
            const float4 v = make_float4(f, f + 1.0f, f + 2.0f, f + 3.0f);
            if (mode == 0) st_cluster_f32x4(peer + i * 16, v);
            else if (mode == 1) mine[i] = v;
        }
        cluster_sync();
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (mode == 0) v = lds128f(base + i * 16);
            else if (mode == 1)
                asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(theirs + i));
            acc += v.x + v.y + v.z + v.w;
        }
        cluster_sync();
    }
    if (acc == 1234.5f) out[0] = 1;
}
"#;

/// A launch's result as the crate's error.
fn launched<T>(result: Result<T, cudarc::driver::DriverError>) -> lowbit::Result<()> {
    result.map(|_| ()).map_err(lowbit::cuda::driver_error("stream_probe"))
}

const PROBE: KernelSource = KernelSource {
    name: "stream_probe",
    source: SOURCE,
};

/// The `tma` kernel's launch: `ctas` CTAs, each copying its share of the units through a ring of `stages` x `unit`
/// bytes; `window` > 0 wraps the unit index (reads from L2).
struct Ring {
    ctas: usize,
    unit: usize,
    stages: usize,
    window: usize,
}

impl Ring {
    fn smem(&self) -> usize {
        self.stages * self.unit + 16 * self.stages
    }

    fn launch(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        f: &cudarc::driver::CudaFunction,
        src: u64,
        units: usize,
        out: u64,
    ) -> lowbit::Result<()> {
        let (units, ctas) = (units as i64, self.ctas as i32);
        let (unit, stages, window) = (self.unit as i32, self.stages as i32, self.window as i32);
        let mut b = stream.launch_builder(f);
        b.arg(&src)
            .arg(&units)
            .arg(&ctas)
            .arg(&unit)
            .arg(&stages)
            .arg(&window)
            .arg(&out);
        let cfg = LaunchConfig {
            grid_dim: (self.ctas as u32, 1, 1),
            block_dim: (288, 1, 1),
            shared_mem_bytes: self.smem() as u32,
        };
        // SAFETY: the kernel copies `units` units of `unit` bytes from src (or, with a window, its first `window`
        // units), which the caller's buffer holds, and may write out[0].
        launched(unsafe { b.launch(cfg) })
    }
}

/// µs per launch: one warm-up launch per source, then the median of 5 batches of `per_batch` launches cycling
/// through `sources` (rotated buffers, or one address over and over).
fn median_us(
    dev: &CudaDevice,
    sources: &[u64],
    per_batch: usize,
    launch: &dyn Fn(u64) -> lowbit::Result<()>,
) -> lowbit::Result<f64> {
    let (timer, stream) = (StreamTimer::new(dev)?, dev.stream());
    for &p in sources {
        launch(p)?;
    }
    let mut runs = Vec::new();
    for _ in 0..5 {
        timer.start(stream)?;
        for p in sources.iter().cycle().take(per_batch) {
            launch(*p)?;
        }
        runs.push(timer.stop_ms(stream)? * 1e3 / per_batch as f64);
    }
    runs.sort_by(f64::total_cmp);
    Ok(runs[2])
}

/// A launch on `stream` of a plain-load kernel (`ldg4`, `ldg8`, `ldg_l2`): `(CTAs, threads)`, the source, its two
/// 64-bit arguments, and the word it may write. The caller names the bytes the kernel reads from `src`, which must
/// be live.
fn launch_loads(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    f: &cudarc::driver::CudaFunction,
    (ctas, threads): (usize, u32),
    src: u64,
    args: [i64; 2],
    out: u64,
) -> lowbit::Result<()> {
    let mut b = stream.launch_builder(f);
    b.arg(&src).arg(&args[0]).arg(&args[1]).arg(&out);
    let cfg = LaunchConfig {
        grid_dim: (ctas as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the kernels read within the range their caller states of a live buffer, and may write out[0].
    launched(unsafe { b.launch(cfg) })
}

/// A launch of one of the GEMM-stage kernels (`stages`, `stages_mc`, `stages_lsu`): `ctas` CTAs of `threads`, each
/// streaming `count` stages of an `x_unit` from L2 (a 512 KB window of the x buffer) and a `w_unit` of codes from a
/// rotated buffer, through `nstages` stages; then the kernel's own int arguments.
struct StageLaunch {
    ctas: usize,
    threads: u32,
    x_unit: usize,
    w_unit: usize,
    nstages: usize,
    count: usize,
}

impl StageLaunch {
    fn smem(&self) -> usize {
        self.nstages * (self.x_unit + self.w_unit) + 16 * self.nstages
    }

    /// µs a stage: the kernel timed over the codes buffers `w` (each of `w_bytes`), x from `x`.
    fn stage_us(
        &self,
        dev: &CudaDevice,
        kernel: &str,
        (x, w, w_bytes): (u64, &[u64], usize),
        extra: &[i32],
        out: u64,
    ) -> lowbit::Result<f64> {
        let stream = dev.stream();
        let f = dev.function_with_shared_memory(&PROBE, kernel, self.smem())?;
        let window = ((512 << 10) / self.x_unit) as i32;
        let w_units = (w_bytes / self.w_unit) as i64;
        let ints = [self.count, self.x_unit, self.w_unit, self.nstages].map(|v| v as i32);
        let us = median_us(dev, w, 20, &|p| {
            let mut b = stream.launch_builder(&f);
            b.arg(&x).arg(&window).arg(&p).arg(&w_units);
            ints.iter().chain(extra).for_each(|v| {
                b.arg(v);
            });
            b.arg(&out);
            let cfg = LaunchConfig {
                grid_dim: (self.ctas as u32, 1, 1),
                block_dim: (self.threads, 1, 1),
                shared_mem_bytes: self.smem() as u32,
            };
            // SAFETY: the kernel reads `window` x units of x and w units below w_units of p (live buffers of at
            // least those sizes), and may write out[0].
            launched(unsafe { b.launch(cfg) })
        })?;
        Ok(us / self.count as f64)
    }
}

fn main() -> lowbit::Result<()> {
    let mb: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(122);
    if std::env::var("LOWBIT_PROBE").as_deref() == Ok("compile") {
        // Without a GPU: does the probe compile, and with what resources?
        let compiled = lowbit::cuda::compile(&PROBE, "sm_90a")?;
        compiled.resource_lines().for_each(|l| println!("{l}"));
        return Ok(());
    }
    let dev = CudaDevice::new(0)?;
    let stream = dev.stream().clone();
    let sms = dev.info().sm_count as usize;
    let bytes = mb << 20;
    let copies = (2 * dev.info().l2_bytes / bytes + 2).max(3);
    let bufs: Vec<CudaSlice<u8>> = (0..copies)
        .map(|_| dev.alloc_zeros::<u8>(bytes))
        .collect::<lowbit::Result<_>>()?;
    let out = dev.alloc_zeros::<u32>(1)?;
    let out_ptr = out.device_ptr(&stream).0;
    println!(
        "{} ({sms} SMs), {mb} MiB per pass, {copies} buffers rotated",
        dev.info().name
    );
    if std::env::var("LOWBIT_PROBE").as_deref() == Ok("l2-paths") {
        return l2_paths(&dev, &bufs, out_ptr);
    }
    if std::env::var("LOWBIT_PROBE").as_deref() == Ok("stages") {
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(&stream).0).collect();
        gemm_stages(&dev, ptrs[0], &ptrs, bytes, sms, out_ptr)?;
        return exchanges(&dev, out_ptr);
    }

    let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(&stream).0).collect();
    let time = |label: &str, launch: &dyn Fn(u64) -> lowbit::Result<()>| -> lowbit::Result<()> {
        let us = median_us(&dev, &ptrs, 10 * copies, launch)?;
        println!("{label:<28} {us:8.2} us  {:6.3} TB/s", bytes as f64 / us / 1e6);
        Ok(())
    };
    for (name, per_sm, threads) in [
        ("ldg4", 1, 1024),
        ("ldg4", 2, 512),
        ("ldg8", 2, 256),
        ("ldg8", 4, 256),
        ("ldg4", 8, 256),
    ] {
        let f = dev.function(&PROBE, name)?;
        let ctas = per_sm * sms;
        let n = (bytes / 16) as i64;
        time(&format!("{name} {per_sm}/SM x {threads}"), &|p| {
            // The kernel reads n 16-byte words of p, a live buffer of `bytes`.
            launch_loads(&stream, &f, (ctas, threads), p, [n, ctas as i64], out_ptr)
        })?;
    }
    for (per_sm, unit_kb, stages) in [(2, 16, 3), (2, 16, 4), (1, 16, 6), (2, 32, 3), (3, 16, 3), (4, 8, 4)] {
        let ring = Ring {
            ctas: per_sm * sms,
            unit: unit_kb << 10,
            stages,
            window: 0,
        };
        let f = dev.function_with_shared_memory(&PROBE, "tma", ring.smem())?;
        let units = bytes / ring.unit;
        time(&format!("tma {per_sm}/SM {unit_kb} KB x {stages}"), &|p| {
            ring.launch(&stream, &f, p, units, out_ptr)
        })?;
    }

    // From L2: 16 KB units of a 2 MiB window, 6 stages (the GEMM's 64-token tile), 512 units (8 MiB) per CTA.
    let per_cta = 512;
    let src = ptrs[0];
    println!("from L2 (a 2 MiB window), one CTA per SM, 16 KB x 6:");
    for ctas in [8usize, 16, 33, 66, 99, sms] {
        let ring = Ring {
            ctas,
            unit: 16 << 10,
            stages: 6,
            window: 128,
        };
        let f = dev.function_with_shared_memory(&PROBE, "tma", ring.smem())?;
        let us = median_us(&dev, &[src], 10, &|p| {
            ring.launch(&stream, &f, p, per_cta * ctas, out_ptr)
        })?;
        let per_sm = (per_cta * 16384) as f64 / us / 1e3; // GB/s
        println!(
            "  {ctas:3} SMs {us:8.1} us  {per_sm:6.1} GB/s per SM  {:6.2} TB/s in all",
            per_sm * ctas as f64 / 1e3
        );
    }

    gemm_stages(&dev, src, &ptrs, bytes, sms, out_ptr)
}

/// The GEMM's stages without its math (the `stages` kernel): x from a 512 KB window in L2, the codes from the rotated
/// buffers, 64 stages per CTA, the consumers reading x as the wgmmas would (`reads` passes) or not at all. Then in
/// clusters of two (`stages_mc`), by its four modes of copying x. `LOWBIT_PROBE=stages` runs this part alone.
fn gemm_stages(dev: &CudaDevice, src: u64, ptrs: &[u64], bytes: usize, sms: usize, out_ptr: u64) -> lowbit::Result<()> {
    println!("the GEMM's stages (x from L2 + codes from memory), one CTA per SM, 64 stages a CTA:");
    let variants = [
        ("stages", 0i32, "0 reads"),
        ("stages", 2, "2 reads"),
        ("stages", 4, "4 reads"),
        ("stages_mc", 0, "pairs, copy"),
        ("stages_mc", 1, "pairs, mc"),
        ("stages_mc", 2, "pairs, mc cta"),
        ("stages_mc", 3, "pairs, mc one"),
    ];
    for (label, x_kb, w_kb, nstages) in STAGE_SIZES {
        for ctas in [96usize, 128, sms] {
            for (kernel, reads, what) in variants {
                let (x_unit, w_unit) = (x_kb << 10, w_kb << 10);
                let launch = StageLaunch {
                    ctas,
                    threads: 288,
                    x_unit,
                    w_unit,
                    nstages,
                    count: 64,
                };
                let us = launch.stage_us(dev, kernel, (src, &ptrs[1..], bytes), &[reads], out_ptr)?;
                let per_sm = (x_unit + w_unit) as f64 / us / 1e3; // GB/s
                println!(
                    "  {label:<9} {x_kb} + {w_kb} KB x {nstages}, {ctas:3} CTAs, {what:<11}: {us:5.3} us a stage, \
                     {per_sm:6.1} GB/s per SM"
                );
            }
        }
    }
    Ok(())
}

/// The split-K exchange (`exchange`): 8, 16 and 32 KB of fp32 a CTA handed to the other CTA of its cluster of two,
/// through shared memory (DSMEM) or through global memory, against the barriers alone; µs a round.
fn exchanges(dev: &CudaDevice, out_ptr: u64) -> lowbit::Result<()> {
    let stream = dev.stream();
    let sms = dev.info().sm_count as usize;
    let iters = 64i32;
    let ws = dev.alloc_zeros::<f32>(sms * 8192)?;
    let ws_ptr = ws.device_ptr(stream).0;
    println!("split-K exchange between the two CTAs of a cluster, 256 threads, {iters} rounds a launch:");
    for ctas in [96usize, 128] {
        for kb in [8usize, 16, 32] {
            let floats = (kb << 10) as i32 / 4;
            let f = dev.function_with_shared_memory(&PROBE, "exchange", kb << 10)?;
            for (mode, what) in [(0i32, "DSMEM push"), (1, "global + L2"), (2, "barriers only")] {
                let us = median_us(dev, &[ws_ptr], 20, &|p| {
                    let mut b = stream.launch_builder(&f);
                    b.arg(&p).arg(&floats).arg(&iters).arg(&mode).arg(&out_ptr);
                    let cfg = LaunchConfig {
                        grid_dim: (ctas as u32, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: (kb << 10) as u32,
                    };
                    // SAFETY: CTA c writes and reads slots c and c ^ 1 of `floats` fp32 each in ws (sms * 8192
                    // floats, ctas <= sms, floats <= 8192), and may write out[0].
                    launched(unsafe { b.launch(cfg) })
                })?;
                println!(
                    "  {ctas:3} CTAs, {kb:2} KB, {what:<13}: {:6.3} us a round",
                    us / iters as f64
                );
            }
        }
    }
    Ok(())
}

/// The stage sizes of the GEMM's tiles: x KB (from L2), codes KB (from memory), stages.
const STAGE_SIZES: [(&str, usize, usize, usize); 4] = [
    ("K-split", 16, 8, 6),
    ("64-token", 16, 16, 6),
    ("128-token", 32, 16, 4),
    ("K-split 128", 32, 8, 5),
];

/// How fast one SM takes in bytes from L2, by path: bulk copies into a ring of 3, 6 or 12 stages (if the rate grows
/// with the bytes in flight, latency limits it), plain 16-byte loads by 256-1024 threads, and both at once (the
/// ring, plus `extra` words a consumer thread per stage). On 8 SMs and on every SM; 2 MiB windows that stay in L2.
/// Then the GEMM's stages by copy path.
fn l2_paths(dev: &CudaDevice, bufs: &[CudaSlice<u8>], out_ptr: u64) -> lowbit::Result<()> {
    let stream = dev.stream().clone();
    let sms = dev.info().sm_count as usize;
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(&stream).0).collect();
    let src = ptrs[0];
    let median = |launch: &dyn Fn(u64) -> lowbit::Result<()>| median_us(dev, &[src], 10, launch);
    let report = |what: &str, ctas: usize, bytes_per_cta: f64, us: f64| {
        let per_sm = bytes_per_cta / us / 1e3;
        println!(
            "  {what:<34} {ctas:3} SMs {us:8.1} us {per_sm:6.1} GB/s per SM {:6.2} TB/s in all",
            per_sm * ctas as f64 / 1e3
        );
    };
    let per_cta = 512usize; // 16 KB units: 8 MiB a CTA
    println!("L2 intake per SM by path (2 MiB windows):");
    for ctas in [8usize, sms] {
        for stages in [3usize, 6, 12] {
            let ring = Ring {
                ctas,
                unit: 16 << 10,
                stages,
                window: 128,
            };
            let f = dev.function_with_shared_memory(&PROBE, "tma", ring.smem())?;
            let us = median(&|p| ring.launch(&stream, &f, p, per_cta * ctas, out_ptr))?;
            report(
                &format!("bulk copies, 16 KB x {stages}"),
                ctas,
                (per_cta << 14) as f64,
                us,
            );
        }
        for threads in [256u32, 512, 1024] {
            let f = dev.function(&PROBE, "ldg_l2")?;
            let (words, wrap) = ((per_cta << 10) as i64, (2i64 << 20) / 16);
            // The kernel reads the first 2 MiB of the buffer (wrap words).
            let us = median(&|p| launch_loads(&stream, &f, (ctas, threads), p, [words, wrap], out_ptr))?;
            report(
                &format!("plain loads, {threads} threads x 8"),
                ctas,
                (per_cta << 14) as f64,
                us,
            );
        }
        for extra in [0i32, 2, 4, 8] {
            let (unit, stages) = (16usize << 10, 6usize);
            let smem = stages * unit + 16 * stages;
            let f = dev.function_with_shared_memory(&PROBE, "tma_ldg", smem)?;
            let (count, unit_i, stages_i, window) = (per_cta as i32, unit as i32, stages as i32, 128i32);
            let us = median(&|p| {
                let mut b = stream.launch_builder(&f);
                b.arg(&p)
                    .arg(&count)
                    .arg(&unit_i)
                    .arg(&stages_i)
                    .arg(&window)
                    .arg(&extra)
                    .arg(&out_ptr);
                let cfg = LaunchConfig {
                    grid_dim: (ctas as u32, 1, 1),
                    block_dim: (288, 1, 1),
                    shared_mem_bytes: smem as u32,
                };
                // SAFETY: the kernel reads the first `window` units of the buffer and may write out[0].
                launched(unsafe { b.launch(cfg) })
            })?;
            let bytes = per_cta as f64 * (unit as f64 + 256.0 * 16.0 * extra as f64);
            report(&format!("both, 16 KB x 6 + {} KB loads", extra * 4), ctas, bytes, us);
        }
    }

    // The GEMM's stages (64 a CTA, one CTA per SM) with x by cp.async from a producer warpgroup and the codes by a
    // bulk copy, or both by cp.async, against both by bulk copies (`stages_lsu`).
    println!("the GEMM's stages by copy path, one CTA per SM, 64 stages a CTA:");
    for (label, x_kb, w_kb, nstages) in STAGE_SIZES {
        for ctas in [96usize, sms] {
            for (lsu, what) in [(0i32, "bulk copies"), (1, "x by cp.async"), (2, "all by cp.async")] {
                for reads in [0i32, 2] {
                    let launch = StageLaunch {
                        ctas,
                        threads: 384,
                        x_unit: x_kb << 10,
                        w_unit: w_kb << 10,
                        nstages,
                        count: 64,
                    };
                    let codes = (src, &ptrs[1..], bufs[0].len());
                    let us = launch.stage_us(dev, "stages_lsu", codes, &[reads, lsu], out_ptr)?;
                    let per_sm = ((x_kb + w_kb) << 10) as f64 / us / 1e3;
                    println!(
                        "  {label:<9} {x_kb} + {w_kb} KB x {nstages}, {ctas:3} CTAs, {what:<15} {reads} reads: \
                         {us:5.3} us a stage, {per_sm:6.1} GB/s per SM"
                    );
                }
            }
        }
    }
    Ok(())
}
