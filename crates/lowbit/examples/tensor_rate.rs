//! How fast does one SM's tensor pipe run the decode kernel's small-token multiplies? The decode kernel slows by
//! ~3-5 µs on 8192 x 28672 when a batch grows from 8 to 9 tokens (a second 8-token tile), on both of its paths. This
//! probe times the two instruction shapes alone on one CTA, back to back, with independent accumulators:
//! - `mma.sync.m16n8k16` (f16, fp32 accumulation) from 4, 8 or 16 warps, four independent chains per warp;
//! - `wgmma.m64nNk16` with A from registers (the decode kernel's form) for N = 8, 16, 32, 64 from 1, 2 or 4
//!   warpgroups, two accumulators per warpgroup and step, up to four steps in flight (as the decode kernel);
//! - the K-split GEMM tile's k16 step (linear_w4a16_gemm.cu): two `wgmma.m64n64k16` with A from registers, one group
//!   a step, the wait leaving one in flight, with and without the conversion of the step two ahead (16 bytes of
//!   codes from shared memory every two steps, the lop3/magic-number dequant and one scale multiply a register),
//!   from 1 to 4 warpgroups. Whether the conversion slows the tensor pipe it runs beside is what this part asks;
//! - the same step with A from shared memory too (`ss`): the converted fragments stored there by stmatrix (the
//!   128-byte swizzle of a K-major tile), fenced to the async proxy, and the warpgroup's named barrier before the
//!   wgmmas that read them, i.e. the weight converted into shared memory instead of registers (1 or 2 warpgroups).
//!
//! It prints SM cycles per instruction (per step for the K-split part) and multiply-adds per SM cycle; the K-split
//! part also the SM clock it ran at (`clock64` against `%globaltimer`).
//!
//! ```text
//! cargo run --release --example tensor_rate [--compile-only]
//! ```
//! `--compile-only` compiles the probe for sm_90a with NVRTC and prints ptxas's report (no GPU needed), and with
//! `LOWBIT_DUMP_CUBIN=dir` writes its CUBIN there as `tensor_rate.cubin` (as the GEMM's compile tests do).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use lowbit::cuda::{driver_error, CudaDevice, DevicePtr, KernelSource};

const SOURCE: &str = r#"
#include "common.cuh"
using namespace lowbit;

// Every warp: `iters` rounds of four mma.sync on four independent accumulators.
extern "C" __global__ void __launch_bounds__(512, 1) mma_rate(int iters, unsigned long long* out) {
    float d[4][4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) d[c][i] = 0.0f;
    const u32 v = 0x3c003c00u ^ threadIdx.x;  // finite f16 pairs
    const uint4 a = make_uint4(v, v + 1, v + 2, v + 3);
    __syncthreads();
    const unsigned long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < 4; ++c) FragmentOps<F16>::mma<true>(d[c], a, v, v + c);
    }
    __syncthreads();
    const unsigned long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) s += d[c][i];
    if (s == 12345.0f) out[7] = 1;
    if (threadIdx.x == 0) out[0] = t0, out[1] = t1;
}

// Waits for every wgmma and keeps their results alive (a sum the host never sees unless it is 12345).
template <int R>
__device__ __forceinline__ void keep_accumulators(float (&d)[2][R], unsigned long long* out) {
    wgmma_wait<0>();
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < R; ++i) {
            wgmma_fence_operand(d[t][i]);
            s += d[t][i];
        }
    if (s == 12345.0f) out[7] = 1;
}

// Every warpgroup: `iters` steps of two wgmma.m64nNk16 (A from registers, B zeroed shared memory), each step one
// commit group, waiting until at most three groups are in flight.
template <int N>
__device__ void wgmma_steps(u64 desc, int iters, unsigned long long* out) {
    float d[2][N / 2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < N / 2; ++i) d[t][i] = 0.0f;
    const u32 v = 0x3c003c00u ^ threadIdx.x;
    const uint4 a = make_uint4(v, v + 1, v + 2, v + 3);
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int t = 0; t < 2; ++t) wgmma_m64k16<F16, N>(d[t], a, desc + 2 * (it & 3), 1);
        wgmma_commit();
        wgmma_wait<3>();
    }
    keep_accumulators(d, out);
}

extern "C" __global__ void __launch_bounds__(512, 1) wgmma_rate(int n, int iters, unsigned long long* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;
    unsigned char* p = smem + (base - smem_addr(smem));
    for (int i = threadIdx.x; i < 16384 / 16; i += blockDim.x) reinterpret_cast<uint4*>(p)[i] = make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();
    __syncthreads();
    const u64 desc = smem_desc_sw128(base);
    const unsigned long long t0 = clock64();
    switch (n) {
        case 8: wgmma_steps<8>(desc, iters, out); break;
        case 16: wgmma_steps<16>(desc, iters, out); break;
        case 32: wgmma_steps<32>(desc, iters, out); break;
        default: wgmma_steps<64>(desc, iters, out); break;
    }
    __syncthreads();
    const unsigned long long t1 = clock64();
    if (threadIdx.x == 0) out[0] = t0, out[1] = t1;
}

// wgmma.m64n64k16 with A and B from shared memory (both K-major, 128-byte swizzle).
__device__ __forceinline__ void wgmma_ss_m64n64k16(float (&d)[32], u64 a_desc, u64 b_desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
        "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, "
        "1, 1, 1, 0, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a_desc), "l"(b_desc));
}

// One step's A fragments (both tiles), converted as the GEMM's Converter does it: 16 bytes of codes from shared
// memory every two steps, the lop3/magic-number dequant, one scale multiply a register (codes, zeros and scale fixed).
struct StepConverter {
    u32 words, lo[2], hi[2];
    uint4 wq;
    template <int C>
    __device__ __forceinline__ void convert(uint4 (&r)[2]) {
        const u32 scale = 0x3c003c00u;  // {1, 1}
        if (C % 2 == 0) wq = lds128(words + C * 512 + (threadIdx.x & 31) * 16);
        const u32 w[2] = {C % 2 == 0 ? wq.x : wq.z, C % 2 == 0 ? wq.y : wq.w};
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            const uint4 q = FragmentOps<F16>::dequant(w[t], lo[t], hi[t]);
            r[t] = make_uint4(F16::mul(q.x, scale), F16::mul(q.y, scale), F16::mul(q.z, scale), F16::mul(q.w, scale));
        }
    }
};

// One k16 step J of the K-split tile's main loop (LOOK 2, four fragment buffers): two wgmmas, commit, wait for all
// but this group, then (CONVERT) the fragments of step J + 2, whose buffer step J - 2 read and the wait retired.
// SHARED: A from shared memory instead of registers, two 64-row tiles of 64 k at `a_tiles` (the warpgroup's own,
// 8 KB each, step J at bytes 32 J of each row). The converted fragments go there by stmatrix (warp w's rows
// 16 w .. 16 w + 15 of each tile), fenced to the async proxy, and the warpgroup's named barrier precedes the wgmmas
// that read them.
template <int J, bool SHARED, bool CONVERT>
__device__ __forceinline__ void ksplit_step(float (&d)[2][32], uint4 (&frag)[4][2], StepConverter& cv, u64 b_desc,
                                            u32 a_tiles) {
    if (SHARED && CONVERT) named_barrier_sync(1 + (threadIdx.x >> 7), 128);
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        if (SHARED) wgmma_ss_m64n64k16(d[t], smem_desc_sw128(a_tiles + t * 8192) + 2 * J, b_desc + 2 * J);
        else wgmma_m64k16<F16, 64>(d[t], frag[J][t], b_desc + 2 * J, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
    if (!CONVERT) return;
    constexpr int C = (J + 2) % 4;
    uint4 r[2];
    cv.template convert<C>(r);
    if (!SHARED) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            frag[C][t] = r[t];
            wgmma_fence_operand(frag[C][t].x), wgmma_fence_operand(frag[C][t].y);
            wgmma_fence_operand(frag[C][t].z), wgmma_fence_operand(frag[C][t].w);
        }
        return;
    }
    // stmatrix: lane l addresses row l % 8 of matrix l / 8 (rows + 8 for matrices 1 and 3, k + 8 for 2 and 3).
    const int lane = threadIdx.x & 31, m = lane >> 3;
    const int row = ((threadIdx.x >> 5) & 3) * 16 + (m & 1) * 8 + (lane & 7), chunk = 2 * C + (m >> 1);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        const u32 regs[4] = {r[t].x, r[t].y, r[t].z, r[t].w};
        stmatrix_x4<false>(a_tiles + t * 8192 + row * 128 + ((chunk ^ (row & 7)) << 4), regs);
    }
    fence_proxy_async_shared();
}

template <bool SHARED, bool CONVERT>
__device__ void ksplit_steps(u64 b_desc, u32 words, u32 a_tiles, int iters, unsigned long long* out) {
    float d[2][32];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < 32; ++i) d[t][i] = 0.0f;
    const u32 v = 0x3c003c00u ^ threadIdx.x;
    uint4 frag[4][2];
#pragma unroll
    for (int b = 0; b < 4; ++b) frag[b][0] = frag[b][1] = make_uint4(v, v + 1, v + 2, v + 3);
    StepConverter cv;
    cv.words = words, cv.wq = make_uint4(0, 0, 0, 0);
    FragmentOps<F16>::zero_terms(0x88888888u, cv.lo, cv.hi);
    const u32 a = a_tiles + (threadIdx.x >> 7) * 16384;  // this warpgroup's A tiles (SHARED)
    for (int it = 0; it < iters; it += 4) {
        ksplit_step<0, SHARED, CONVERT>(d, frag, cv, b_desc, a);
        ksplit_step<1, SHARED, CONVERT>(d, frag, cv, b_desc, a);
        ksplit_step<2, SHARED, CONVERT>(d, frag, cv, b_desc, a);
        ksplit_step<3, SHARED, CONVERT>(d, frag, cv, b_desc, a);
    }
    keep_accumulators(d, out);
}

// B: 16 KB of zeros in the 128-byte swizzle; the codes: 2 KB of zeros past it; (ss) each warpgroup's A tiles,
// 16 KB, past those.
// convert: 0 registers, 1 registers + conversion, 2 shared memory (ss), 3 ss + conversion.
extern "C" __global__ void __launch_bounds__(512, 1) ksplit_rate(int convert, int iters, unsigned long long* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;
    unsigned char* p = smem + (base - smem_addr(smem));
    for (int i = threadIdx.x; i < (24576 + 2 * 16384) / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(p)[i] = make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();
    __syncthreads();
    const u64 desc = smem_desc_sw128(base);
    const u32 a_tiles = base + 16384 + 2048 + 1024 * 6;  // 1024-aligned: 24 KB past base
    unsigned long long g0, g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    const unsigned long long t0 = clock64();
    switch (convert) {
        case 0: ksplit_steps<false, false>(desc, base + 16384, a_tiles, iters, out); break;
        case 1: ksplit_steps<false, true>(desc, base + 16384, a_tiles, iters, out); break;
        case 2: ksplit_steps<true, false>(desc, base + 16384, a_tiles, iters, out); break;
        default: ksplit_steps<true, true>(desc, base + 16384, a_tiles, iters, out); break;
    }
    __syncthreads();
    const unsigned long long t1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    // %globaltimer (ns) beside the cycles: the SM clock the probe ran at.
    if (threadIdx.x == 0) out[0] = t0, out[1] = t1, out[2] = g0, out[3] = g1;
}
"#;

const PROBE: KernelSource = KernelSource {
    name: "tensor_rate",
    source: SOURCE,
};

fn main() -> lowbit::Result<()> {
    if std::env::args().any(|a| a == "--compile-only") {
        let compiled = lowbit::cuda::compile(&PROBE, "sm_90a")?;
        compiled.resource_lines().for_each(|l| println!("{}", l.trim()));
        println!("serialised wgmma: {:?}", compiled.wgmma_serialisation());
        if let Some(dir) = std::env::var_os("LOWBIT_DUMP_CUBIN") {
            let path = std::path::Path::new(&dir).join("tensor_rate.cubin");
            std::fs::write(&path, &compiled.cubin).map_err(|source| lowbit::Error::Io { path, source })?;
        }
        return Ok(());
    }
    let dev = CudaDevice::new(0)?;
    let stream = dev.stream().clone();
    let smem = 16384 + 1024;
    let mma = dev.function(&PROBE, "mma_rate")?;
    let wgmma = dev.function_with_shared_memory(&PROBE, "wgmma_rate", smem)?;
    let ksplit_smem = 24576 + 2 * 16384 + 1024;
    let ksplit = dev.function_with_shared_memory(&PROBE, "ksplit_rate", ksplit_smem)?;
    let out = dev.alloc_zeros::<u64>(8)?;
    let out_ptr = out.device_ptr(&stream).0;
    // The fewest cycles of five launches of one CTA of `threads`, and that launch's nanoseconds (where the kernel
    // records them in out[2..4]; 0 otherwise).
    let best =
        |f: &cudarc::driver::CudaFunction, args: &[i32], threads: u32, smem: u32| -> lowbit::Result<(u64, u64)> {
            let mut best = (u64::MAX, 0);
            for _ in 0..5 {
                let mut b = stream.launch_builder(f);
                for a in args {
                    b.arg(a);
                }
                b.arg(&out_ptr);
                let cfg = LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem,
                };
                // SAFETY: the kernels write out[0..8] only.
                unsafe { b.launch(cfg) }.map_err(driver_error("tensor_rate"))?;
                let t = dev.download(&out)?;
                if t[1] - t[0] < best.0 {
                    best = (t[1] - t[0], t[3].saturating_sub(t[2]));
                }
            }
            Ok(best)
        };
    println!("{}: one CTA, back-to-back tensor instructions", dev.info().name);
    let iters = 4000;
    for warps in [4u32, 8, 16] {
        let cycles = best(&mma, &[iters], warps * 32, 0)?.0 as f64;
        let instrs = (warps * 4) as f64 * iters as f64;
        println!(
            "  mma.sync m16n8k16, {warps:2} warps: {:6.2} SM cycles per mma, {:6.0} MAC per SM cycle",
            cycles / instrs,
            instrs * 2048.0 / cycles
        );
    }
    for n in [8, 16, 32, 64] {
        for wgs in [1u32, 2, 4] {
            let cycles = best(&wgmma, &[n, iters], wgs * 128, smem as u32)?.0 as f64;
            let instrs = (wgs * 2) as f64 * iters as f64;
            println!(
                "  wgmma m64n{n}k16 (A in registers), {wgs} warpgroups: {:6.2} SM cycles per wgmma, {:6.0} MAC per \
                 SM cycle",
                cycles / instrs,
                instrs * (64 * n * 16) as f64 / cycles
            );
        }
    }
    // Shared memory holds A tiles for two warpgroups: more than two run the register form only.
    for wgs in [1u32, 2, 3, 4] {
        for convert in if wgs <= 2 { 0..4 } else { 0..2 } {
            let (cycles, ns) = best(&ksplit, &[convert, iters], wgs * 128, ksplit_smem as u32)?;
            let cycles = cycles as f64;
            let steps = wgs as f64 * iters as f64;
            println!(
                "  K-split step (2 x m64n64k16, A in {}), {wgs} warpgroups, conversion {}: {:6.2} SM cycles \
                 per step, {:6.0} MAC per SM cycle, SM clock {:4.0} MHz",
                if convert < 2 { "registers" } else { "shared memory" },
                if convert % 2 == 1 { "on " } else { "off" },
                cycles / steps,
                steps * (2 * 64 * 64 * 16) as f64 / cycles,
                cycles * 1e3 / ns.max(1) as f64
            );
        }
    }
    Ok(())
}
