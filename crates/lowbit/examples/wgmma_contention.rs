//! Does one warpgroup's CUDA-core work slow down while the other warpgroup's wgmmas execute? The per-block W8A8
//! GEMM's trace (examples/w8a8_trace) suggests that a warpgroup's correction makes no progress while the other
//! warpgroup's int8 wgmmas run. This probe measures it alone, on one CTA of two warpgroups: warpgroup 0 runs a
//! fixed loop of CUDA-core arithmetic (the correction's mix, or FFMAs alone) while warpgroup 1 keeps the tensor
//! cores busy with back-to-back wgmmas (int8 m64n128k32, or f16 m64n128k16 with A from registers), on zeroed
//! shared memory. It prints SM cycles for the loop alone and under each kind of wgmma, and the wgmmas' rate.
//!
//! ```text
//! cargo run --release --example wgmma_contention
//! ```

use cudarc::driver::{LaunchConfig, PushKernelArg};
use lowbit::cuda::{CudaDevice, DevicePtr, KernelSource};

const SOURCE: &str = r#"
#include "common.cuh"
using namespace lowbit;

// One k step: int8 m64n128k32 into int accumulators, f16 m64n128k16 (A from registers) into float ones.
__device__ __forceinline__ void one_wgmma(int (&d)[64], u64 a_desc, u64 b_desc) {
    wgmma_s8_m64n128k32(d, a_desc, b_desc, 1);
}
__device__ __forceinline__ void one_wgmma(float (&d)[64], u64, u64 b_desc) {
    wgmma_m64k16<F16, 128>(d, make_uint4(0, 0, 0, 0), b_desc, 1);
}

// `mmas` rounds of four wgmmas on zeroed shared memory, one round in flight behind the next: int8 m64n128k32 (ACC
// int) or f16 m64n128k16 (ACC float).
template <class ACC>
__device__ void back_to_back(u64 a_desc, u64 b_desc, int mmas, unsigned long long* out) {
    ACC d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0;
    for (int it = 0; it < mmas; ++it) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) one_wgmma(d, a_desc + 2 * ks, b_desc + 2 * ks);
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    ACC s = 0;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += d[i];
    if (s == ACC(12345)) out[7] = 1;  // keeps the wgmmas
}

// mode: 0 loop alone; 1 loop + int8 wgmmas; 2 loop + f16 wgmmas; 3 int8 wgmmas alone; 4 f16 wgmmas alone.
// kind: 0 the correction's mix per element (I2FP, FMUL, FFMA); 1 FFMA only.
extern "C" __global__ void __launch_bounds__(256, 1)
contention(int mode, int kind, int work, int mmas, unsigned long long* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 base = (smem_addr(smem) + 1023) & ~1023u;
    unsigned char* p = smem + (base - smem_addr(smem));
    for (int i = threadIdx.x; i < 24576 / 16; i += 256) reinterpret_cast<uint4*>(p)[i] = make_uint4(0, 0, 0, 0);
    fence_proxy_async_shared();
    __syncthreads();
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    if (wg == 1) {
        if (mode == 0) return;
        const u64 a_desc = smem_desc_sw128(base), b_desc = smem_desc_sw128(base + 8192);
        const unsigned long long t0 = clock64();
        if (mode == 1 || mode == 3) {
            back_to_back<int>(a_desc, b_desc, mmas, out);
        } else {
            back_to_back<float>(a_desc, b_desc, mmas, out);
        }
        const unsigned long long t1 = clock64();
        if (tid == 0) out[2] = t0, out[3] = t1;
        return;
    }
    if (mode >= 3) return;
    // Let warpgroup 1's wgmmas get going first.
    const unsigned long long w0 = clock64();
    while (clock64() - w0 < 4000) {}
    float acc[64];
    int dot[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f, dot[i] = threadIdx.x * 3 + i;
    const float sa = 1.0f + threadIdx.x * 1e-3f;
    const unsigned long long t0 = clock64();
    for (int it = 0; it < work; ++it) {
        if (kind == 0) {
#pragma unroll
            for (int i = 0; i < 64; ++i) acc[i] = fmaf(sa * (float)(i + it), __int2float_rn(dot[i] + it), acc[i]);
        } else {
#pragma unroll
            for (int i = 0; i < 64; ++i) acc[i] = fmaf(sa, acc[i], 1.0f);
        }
    }
    const unsigned long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += acc[i];
    if (s == 12345.0f) out[7] = 2;
    if (tid == 0) out[0] = t0, out[1] = t1;
}
"#;

const PROBE: KernelSource = KernelSource {
    name: "wgmma_contention",
    source: SOURCE,
};

fn main() -> lowbit::Result<()> {
    let dev = CudaDevice::new(0)?;
    let stream = dev.stream().clone();
    let smem = 24576 + 1024;
    let f = dev.function_with_shared_memory(&PROBE, "contention", smem)?;
    let out = dev.alloc_zeros::<u64>(8)?;
    let out_ptr = out.device_ptr(&stream).0;
    let run = |mode: i32, kind: i32, work: i32, mmas: i32| -> lowbit::Result<Vec<u64>> {
        let mut b = stream.launch_builder(&f);
        b.arg(&mode).arg(&kind).arg(&work).arg(&mmas).arg(&out_ptr);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: the kernel writes out[0..8] only.
        unsafe { b.launch(cfg) }.map_err(lowbit::cuda::driver_error("wgmma_contention"))?;
        dev.download(&out)
    };
    println!(
        "{}: one CTA, warpgroup 0's loop (cycles) alone and beside warpgroup 1's wgmmas",
        dev.info().name
    );
    for (kind, label) in [(0, "I2FP+FMUL+FFMA x64"), (1, "FFMA x64")] {
        for work in [16, 64] {
            let mut line = format!("  {label:<20} x{work:<3}");
            for (mode, what) in [(0, "alone"), (1, "int8 wgmma"), (2, "f16 wgmma")] {
                let mut best = u64::MAX;
                for _ in 0..5 {
                    let t = run(mode, kind, work, 4000)?;
                    best = best.min(t[1] - t[0]);
                }
                line += &format!("  {what}: {best:6}");
            }
            println!("{line}");
        }
    }
    for (mode, what, per) in [(3, "int8 m64n128k32", 4), (4, "f16 m64n128k16", 4)] {
        let t = run(mode, 0, 0, 2000)?;
        println!(
            "  {what} alone: {:.1} cycles per wgmma",
            (t[3] - t[2]) as f64 / (2000 * per) as f64
        );
    }
    Ok(())
}
