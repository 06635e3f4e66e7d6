// Shared device code of every lowbit kernel: integer -> fp16/bf16 conversions, nibble/byte shuffles, memory
// helpers, and the tensor-core / async-copy primitives (cp.async, TMA bulk copies, mbarriers, ldmatrix). Compiled by NVRTC at run time (the host passes this file as an in-memory header named "common.cuh").
//
// Conventions used throughout:
// - A "word" is 32 bits holding 8 int4 codes or 4 int8 codes, little-endian (nibble i = bits 4i..4i+3).
// - An "AWQ-ordered" int4 word holds the codes of 8 consecutive output columns c0..c7 in the nibble order of
//   AutoAWQ's GEMM layout: nibble i holds column ORDER[i], ORDER = [0, 2, 4, 6, 1, 3, 5, 7]. In this order the nibble
//   pairs (0,4), (1,5), (2,6), (3,7) are the column pairs (0,1), (2,3), (4,5), (6,7), which is what lets one lop3
//   turn a nibble pair into a packed pair of 16-bit floats in natural column order (seed 000 / formats.md).
// - Converted values travel as packed pairs (`half2`/`bf162` bit patterns in a u32); a uint4 holds 8 values.
// - Every conversion is exact: (q - z) is formed exactly in the 16-bit type and multiplied by the scale with one
//   rounding, so results equal round((q - z) * s) computed in f32 and rounded once (bit-exact with the CPU path).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned long long u64;

namespace lowbit {

// ------------------------------------------------------------------------------------------------------------------
// Bit manipulation
// ------------------------------------------------------------------------------------------------------------------

// (x & MASK) | MAGIC in one lop3. The LUT of lop3 is the truth table of the operation applied to the three
// canonical inputs a = 0xF0, b = 0xCC, c = 0xAA: (0xF0 & 0xCC) | 0xAA = 0xEA.
template <u32 MASK, u32 MAGIC>
__device__ __forceinline__ u32 and_or(u32 x) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(x), "n"(MASK), "n"(MAGIC));
    return d;
}

// Byte permute (PTX prmt): result byte i = byte SEL[4i..4i+3] of the 8-byte value {b:a} (a = bytes 0-3, b = 4-7).
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) { return __byte_perm(a, b, sel); }

// 4x4 byte transpose: out[i] byte j = in[j] byte i.
__device__ __forceinline__ void transpose_bytes_4x4(const u32 in[4], u32 out[4]) {
    const u32 lo01 = prmt(in[0], in[1], 0x5140);  // [in0.b0, in1.b0, in0.b1, in1.b1]
    const u32 hi01 = prmt(in[0], in[1], 0x7362);  // [in0.b2, in1.b2, in0.b3, in1.b3]
    const u32 lo23 = prmt(in[2], in[3], 0x5140);
    const u32 hi23 = prmt(in[2], in[3], 0x7362);
    out[0] = prmt(lo01, lo23, 0x5410);  // [in0.b0, in1.b0, in2.b0, in3.b0]
    out[1] = prmt(lo01, lo23, 0x7632);
    out[2] = prmt(hi01, hi23, 0x5410);
    out[3] = prmt(hi01, hi23, 0x7632);
}

// A natural-order int4 word (nibble j = column j) in AWQ order (nibble i = column ORDER[i]).
__device__ __forceinline__ u32 natural_to_awq_order(u32 w) {
    u32 even = w & 0x0F0F0F0Fu;          // columns 0, 2, 4, 6 in the low nibble of bytes 0..3
    u32 odd = (w >> 4) & 0x0F0F0F0Fu;    // columns 1, 3, 5, 7
    even |= even >> 4;                   // byte 0 = (c0, c2), byte 2 = (c4, c6)
    odd |= odd >> 4;                     // byte 0 = (c1, c3), byte 2 = (c5, c7)
    return prmt(even, odd, 0x6420);      // bytes (c0,c2) (c4,c6) (c1,c3) (c5,c7) = nibbles c0 c2 c4 c6 c1 c3 c5 c7
}

// 8x8 int4 transpose for layouts packed along K (GPTQ, compressed-tensors).
// in[j]: natural-order word of column j (nibble i = row i). out[i]: AWQ-ordered word of row i (8 columns).
// Pairing the columns (0,2), (4,6), (1,3), (5,7) in the first step puts every byte of the result in AWQ order, so
// no separate reordering is needed.
__device__ __forceinline__ void transpose_int4_8x8_to_awq(const u32 in[8], u32 out[8]) {
    const int first[4] = {0, 4, 1, 5};  // byte b of a result row holds columns (first[b], first[b] + 2)
    u32 even_rows[4], odd_rows[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const u32 lo = in[first[b]], hi = in[first[b] + 2];
        // byte r of even_rows[b]: (lo row 2r, hi row 2r); of odd_rows[b]: (lo row 2r+1, hi row 2r+1)
        even_rows[b] = (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0xF0F0F0F0u);
        odd_rows[b] = ((lo >> 4) & 0x0F0F0F0Fu) | (hi & 0xF0F0F0F0u);
    }
    u32 e[4], o[4];
    transpose_bytes_4x4(even_rows, e);  // e[r] = row 2r
    transpose_bytes_4x4(odd_rows, o);   // o[r] = row 2r + 1
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        out[2 * r] = e[r];
        out[2 * r + 1] = o[r];
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Integer -> 16-bit float conversions (exact), one struct per output type
// ------------------------------------------------------------------------------------------------------------------
//
// fp16: the magic number 0x6400 is 1024.0. In [1024, 2048) the fp16 step is exactly 1, so OR-ing an integer
// u < 1024 into the mantissa of 0x6400 gives the fp16 value 1024 + u with no arithmetic.
// bf16: 0x4300 is 128.0; in [128, 256) the bf16 step is 1 (7 mantissa bits), so 0x4300 | u = 128 + u for u < 128.
// The sign bit gives the negative variants for free: 0xE400 | u = -(1024 + u), 0xC300 | u = -(128 + u).

struct F16 {
    typedef __half scalar;
    static constexpr u32 MAGIC = 0x64006400u;       // {1024, 1024}
    static constexpr u32 ONE = 0x3C003C00u;         // {1, 1}
    static constexpr u32 ONE_SIXTEENTH = 0x2C002C00u;  // {1/16, 1/16}
    static constexpr u32 NEG_ONE_SIXTEENTH = 0xAC00AC00u;  // {-1/16, -1/16}
    static constexpr u32 INT8_BIAS = 0x64806480u;   // {1152, 1152} = 1024 + 128

    __device__ static __forceinline__ u32 sub(u32 a, u32 b) {
        u32 d;
        asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    __device__ static __forceinline__ u32 mul(u32 a, u32 b) {
        u32 d;
        asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    __device__ static __forceinline__ u32 fma(u32 a, u32 b, u32 c) {
        u32 d;
        asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
        return d;
    }

    // Per-group zero-point terms for an AWQ-ordered zero word z (see dequant_int4):
    // pairs 0 and 2 hold 1024 + z (subtracted), pairs 1 and 3 hold -(64 + z) (the fma addend).
    __device__ static __forceinline__ uint4 zero_terms(u32 z) {
        const u32 z_hi = z >> 8;  // nibbles 2,3,6,7 moved to where nibbles 0,1,4,5 were
        uint4 t;
        t.x = and_or<0x000F000Fu, MAGIC>(z);
        t.y = mul(and_or<0x00F000F0u, MAGIC>(z), NEG_ONE_SIXTEENTH);  // (1024 + 16z) * -1/16 = -(64 + z), exact
        t.z = and_or<0x000F000Fu, MAGIC>(z_hi);
        t.w = mul(and_or<0x00F000F0u, MAGIC>(z_hi), NEG_ONE_SIXTEENTH);
        return t;
    }

    // 8 int4 codes (AWQ-ordered word) -> (q - z) * s for columns 0..7 in natural order.
    // Low nibbles of a byte: (1024 + q) - (1024 + z). High nibbles land 4 bits up, as 1024 + 16q; instead of a
    // shift, one fma scales by 1/16 and subtracts: (1024 + 16q)/16 - (64 + z) = q - z. Both are exact.
    __device__ static __forceinline__ uint4 dequant_int4(u32 w, uint4 zt, uint4 s) {
        const u32 w_hi = w >> 8;
        uint4 r;
        r.x = mul(sub(and_or<0x000F000Fu, MAGIC>(w), zt.x), s.x);                   // columns 0, 1
        r.y = mul(fma(and_or<0x00F000F0u, MAGIC>(w), ONE_SIXTEENTH, zt.y), s.y);     // columns 2, 3
        r.z = mul(sub(and_or<0x000F000Fu, MAGIC>(w_hi), zt.z), s.z);                // columns 4, 5
        r.w = mul(fma(and_or<0x00F000F0u, MAGIC>(w_hi), ONE_SIXTEENTH, zt.w), s.w);  // columns 6, 7
        return r;
    }

    // 8 signed int8 codes (columns 0..3 in `lo`, 4..7 in `hi`, natural order) -> q * s.
    // XOR 0x80 makes u = q + 128 (unsigned); prmt puts byte u next to the fp16 exponent byte 0x64, giving 1024 + u;
    // subtracting 1152 leaves q exactly. Selectors 0x5150 / 0x5352 pair bytes (0,1) / (2,3); TensorRT-LLM's
    // 0x5250 / 0x5351 pair (0,2) / (1,3) because its preprocessing swapped bytes 1 and 2 first.
    __device__ static __forceinline__ uint4 dequant_int8(u32 lo, u32 hi, uint4 s) {
        lo ^= 0x80808080u;
        hi ^= 0x80808080u;
        uint4 r;
        r.x = mul(sub(prmt(lo, MAGIC, 0x5150), INT8_BIAS), s.x);
        r.y = mul(sub(prmt(lo, MAGIC, 0x5352), INT8_BIAS), s.y);
        r.z = mul(sub(prmt(hi, MAGIC, 0x5150), INT8_BIAS), s.z);
        r.w = mul(sub(prmt(hi, MAGIC, 0x5352), INT8_BIAS), s.w);
        return r;
    }
};

struct BF16 {
    typedef __nv_bfloat16 scalar;
    static constexpr u32 MAGIC = 0x43004300u;      // {128, 128}
    static constexpr u32 NEG_MAGIC = 0xC300C300u;  // {-128, -128}
    static constexpr u32 ONE = 0x3F803F80u;        // {1, 1}
    static constexpr u32 NEG_ZERO = 0x80008000u;   // {-0, -0}: the addend that turns fma into an exact-sign multiply

    // bf16x2 arithmetic through fma: sub/mul.bf16x2 need sm_90, fma.rn.bf16x2 exists from sm_80.
    __device__ static __forceinline__ u32 fma(u32 a, u32 b, u32 c) {
        u32 d;
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
        return d;
    }
    __device__ static __forceinline__ u32 mul(u32 a, u32 b) { return fma(a, b, NEG_ZERO); }

    // Per-group zero terms: pair i holds -(128 + z) for nibble pair (i, i + 4).
    __device__ static __forceinline__ uint4 zero_terms(u32 z) {
        uint4 t;
        t.x = and_or<0x000F000Fu, NEG_MAGIC>(z);
        t.y = and_or<0x000F000Fu, NEG_MAGIC>(z >> 4);
        t.z = and_or<0x000F000Fu, NEG_MAGIC>(z >> 8);
        t.w = and_or<0x000F000Fu, NEG_MAGIC>(z >> 12);
        return t;
    }

    // bf16 has too few mantissa bits for the fp16 trick on the high nibbles (128 + 16q overflows the mantissa),
    // so each nibble pair is shifted down first (TensorRT-LLM does the same): (128 + q) * 1 - (128 + z) = q - z.
    __device__ static __forceinline__ uint4 dequant_int4(u32 w, uint4 zt, uint4 s) {
        uint4 r;
        r.x = mul(fma(and_or<0x000F000Fu, MAGIC>(w), ONE, zt.x), s.x);          // columns 0, 1
        r.y = mul(fma(and_or<0x000F000Fu, MAGIC>(w >> 4), ONE, zt.y), s.y);     // columns 2, 3
        r.z = mul(fma(and_or<0x000F000Fu, MAGIC>(w >> 8), ONE, zt.z), s.z);     // columns 4, 5
        r.w = mul(fma(and_or<0x000F000Fu, MAGIC>(w >> 12), ONE, zt.w), s.w);    // columns 6, 7
        return r;
    }

    // int8 -> bf16 goes through fp32 (bf16 cannot hold 128 + u exactly for u >= 128): 0x4B000000 is 2^23, where
    // the fp32 step is 1, so prmt-ing byte u into its low byte gives 2^23 + u; subtracting 2^23 + 128 leaves q.
    // q * s is exact in fp32 (8-bit q times 8-bit significand), so the one rounding is the final cvt to bf16.
    __device__ static __forceinline__ float int8_to_f32(u32 word, u32 byte) {
        return __fsub_rn(__uint_as_float(prmt(word, 0x4B000000u, 0x7440u | byte)), 8388736.0f);
    }
    __device__ static __forceinline__ u32 pack_rn(float lo, float hi) {
        u32 d;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
    __device__ static __forceinline__ u32 scale_pair_mul(u32 word, u32 b0, u32 s) {
        const float s_lo = __uint_as_float(s << 16), s_hi = __uint_as_float(s & 0xFFFF0000u);
        return pack_rn(__fmul_rn(int8_to_f32(word, b0), s_lo), __fmul_rn(int8_to_f32(word, b0 + 1), s_hi));
    }
    __device__ static __forceinline__ uint4 dequant_int8(u32 lo, u32 hi, uint4 s) {
        lo ^= 0x80808080u;
        hi ^= 0x80808080u;
        uint4 r;
        r.x = scale_pair_mul(lo, 0, s.x);
        r.y = scale_pair_mul(lo, 2, s.y);
        r.z = scale_pair_mul(hi, 0, s.z);
        r.w = scale_pair_mul(hi, 2, s.w);
        return r;
    }
};

// ------------------------------------------------------------------------------------------------------------------
// Epilogue activations (codes match lowbit::ops::Activation)
// ------------------------------------------------------------------------------------------------------------------

enum Activation : int { ACT_NONE = 0, ACT_RELU = 1, ACT_RELU6 = 2, ACT_GELU = 3, ACT_SILU = 4 };

// GELU is the exact erf form (PyTorch's default), SiLU is x * sigmoid(x); both in fp32.
template <int ACT>
__device__ __forceinline__ float activate(float v) {
    switch (ACT) {
        case ACT_RELU: return fmaxf(v, 0.0f);
        case ACT_RELU6: return fminf(fmaxf(v, 0.0f), 6.0f);
        case ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
        case ACT_SILU: return v / (1.0f + expf(-v));
        default: return v;
    }
}

// The activation chosen at run time. Unrolled epilogues should dispatch once and call activate<ACT> instead:
// this inlines every activation at every element (erff and expf included), which can outgrow the instruction
// cache.
__device__ __forceinline__ float apply_activation(float v, int act) {
    switch (act) {
        case ACT_RELU: return activate<ACT_RELU>(v);
        case ACT_RELU6: return activate<ACT_RELU6>(v);
        case ACT_GELU: return activate<ACT_GELU>(v);
        case ACT_SILU: return activate<ACT_SILU>(v);
        default: return v;
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Memory helpers
// ------------------------------------------------------------------------------------------------------------------

// Weights are read once: stream them past L1 (evict-first) so that scales and zeros stay cached.
__device__ __forceinline__ u32 load_stream(const u32* p) { return __ldcs(p); }
__device__ __forceinline__ uint4 load_stream_v4(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
// Small tensors many threads re-read (scales, zeros, g_idx): read-only cache.
__device__ __forceinline__ u32 load_cached(const u32* p) { return __ldg(p); }
__device__ __forceinline__ uint4 load_cached_v4(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// Write-once outputs: evict-first (st.global.cs).
__device__ __forceinline__ void store_stream_v4(void* p, uint4 v) { __stcs(reinterpret_cast<uint4*>(p), v); }
// A 16-byte global store under a predicate: one instruction, where `if (p) *dst = v` may become a branch around it.
__device__ __forceinline__ void st_global_v4_if(void* dst, uint4 v, bool p) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %5, 0;\n @p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(dst),
        "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((int)p)
        : "memory");
}

// ------------------------------------------------------------------------------------------------------------------
// Tensor-core and async-copy primitives
// ------------------------------------------------------------------------------------------------------------------

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy that bypasses L1 (.cg: the weights are read once). When src_bytes < 16 the rest of
// the 16 bytes is zero-filled and nothing past src_bytes is read (the K tail of x).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// --- mbarrier pipeline (sm_90) -----------------------------------------------------------------------------------
// A stage's "full" barrier completes when the TMA engine has written all its bytes (expect_tx + complete_tx); its
// "empty" barrier completes when every consumer thread has arrived after reading it. Waiting uses the phase parity:
// the j-th use of a stage waits for phase j & 1.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::); }
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The mbarriers of a STAGES-deep producer/consumer pipeline at shared address `bars`: STAGES "full" barriers (the
// producer's one expect_tx arrival each), then STAGES "empty" ones (an arrival from each of `consumers` threads).
// Called by one thread, before the CTA barrier that publishes them.
__device__ __forceinline__ void init_pipeline_barriers(u32 bars, int stages, u32 consumers) {
    for (int st = 0; st < stages; ++st) {
        mbar_init(bars + st * 8, 1);
        mbar_init(bars + (stages + st) * 8, consumers);
    }
    mbar_init_fence();
}

// One TMA bulk copy global -> shared (16-byte aligned, size a multiple of 16), completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
            smem_addr(smem)),
        "l"(gmem), "r"(bytes), "r"(bar)
        : "memory");
}
// The same with the destination as a shared-space address.
__device__ __forceinline__ void bulk_copy(u32 smem, const void* gmem, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem),
        "l"(gmem), "r"(bytes), "r"(bar)
        : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) among `threads` threads, whole warps.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the other side of a named_barrier_sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Barrier among the first `threads` threads of the CTA only (the consumer warps; the producer warp never joins).
__device__ __forceinline__ void consumer_sync(int threads) { named_barrier_sync(1, threads); }

// threadIdx.x read where it is used: an epilogue's addresses derived from it cannot be hoisted above the main loop
// and held (or spilled) in registers across it.
__device__ __forceinline__ int thread_index() {
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    return tid;
}
__device__ __forceinline__ int lane_id() {
    int lane;
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
    return lane;
}

// Shared-memory loads by shared-space address (a u32 base plus constant offsets folds into the instruction's
// immediate, where generic pointers would be converted per access).
__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}
__device__ __forceinline__ float4 lds128f(u32 addr) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ float2 lds64f(u32 addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts128f(u32 addr, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}
__device__ __forceinline__ void sts64f(u32 addr, float2 v) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ uint2 lds64(u32 addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts32(u32 addr, u32 v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ u32 lds16(u32 addr) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
    return v;
}

// Two 8x8 b16 matrices (lanes 0-15 give the row addresses): one k16 step of a B fragment.
__device__ __forceinline__ void ldmatrix_x2(u32& r0, u32& r1, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; the thread receives, of matrix i,
// row lane/4, elements 2(lane%4) and 2(lane%4)+1 -- exactly an mma B fragment when the rows are tokens.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Every thread of every CTA of the cluster arrives (release) and waits (acquire): the cluster's shared memory
// written before is visible to all after. Not .aligned: callers may have diverged within a warp.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// The address of shared-memory location `addr` of this CTA in the CTA of cluster rank `rank`.
__device__ __forceinline__ u32 cluster_map(u32 addr, int rank) {
    u32 out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
    return out;
}
__device__ __forceinline__ void st_cluster_f32x4(u32 addr, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
}
#else
// Clusters exist from sm_90 on; the host launches none before (the decode kernel's shared code calls these).
__device__ __forceinline__ void cluster_sync() { __trap(); }
__device__ __forceinline__ u32 cluster_map(u32, int) { __trap(); return 0; }
__device__ __forceinline__ void st_cluster_f32x4(u32, float4) { __trap(); }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// Four 8x8 b16 matrices: register i of lane (g, t) holds row g, columns 2t and 2t + 1 of matrix i (the mma C/D
// fragment layout); lanes 8i..8i+7 address the 8 rows of matrix i (16 bytes each). TRANS stores each matrix
// transposed: the 8 addressed rows receive its columns.
template <bool TRANS>
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 (&r)[4]) {
    if (TRANS)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
    else
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
}
#endif

// x gathered through the act-order permutation and/or re-laid with a 16-byte aligned pitch and zero K padding:
// out[m][k] = x[m][perm ? perm[k] : k] for k < K, 0 for K <= k < k_pad.
__device__ __forceinline__ void stage_x(const unsigned short* x, long long x_stride, const u32* perm,
                                        unsigned short* out, int M, int K, int k_pad) {
    const long long total = (long long)M * k_pad;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int m = (int)(i / k_pad), k = (int)(i - (long long)m * k_pad);
        out[i] = k < K ? x[m * x_stride + (perm ? perm[k] : k)] : (unsigned short)0;
    }
}

// ------------------------------------------------------------------------------------------------------------------
// int4 weights as mma A fragments (the linear kernels' repacked layout, see linear_w4a16.cu)
// ------------------------------------------------------------------------------------------------------------------

typedef unsigned short u16;

// mma.sync m16n8k16 with fp32 accumulation for 16-bit operands of type TYPE ("f16" or "bf16"):
// D = A(16x16, rows = output columns) * B(16x8, columns = tokens) + C, with C = D (ACCUMULATE) or C = 0 (the first
// mma of a group's accumulator, which then needs no zeroing).
#define LB_MMA_M16N8K16(TYPE)                                                                                      \
    template <bool ACCUMULATE>                                                                                     \
    __device__ static __forceinline__ void mma(float(&d)[4], uint4 a, u32 b0, u32 b1) {                            \
        if (ACCUMULATE) {                                                                                          \
            asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, "                 \
                "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                                                  \
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                   \
                : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));                                       \
        } else {                                                                                                   \
            asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, "                 \
                "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};\n"                                              \
                : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                   \
                : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));                            \
        }                                                                                                          \
    }

// Per activation type: the mma, the int4 -> (q - z) conversion of a fragment word, the per-group zero terms and
// scales, and f32 <-> 16-bit conversions.
//
// Zero nibbles: a lane's four zero codes come as one 16-bit value, nibbles [z(tile 0, row g), z(tile 0, row g+8),
// z(tile 1, row g), z(tile 1, row g+8)] (the SCALE/ZERO LAYOUT of the header); zero_terms takes it in both halves
// of a register (z * 0x10001) and yields, per tile, the term of row g (`lo`) and of row g + 8 (`hi`) in the form
// dequant wants, the same value in both halves.
template <class T>
struct FragmentOps;

template <>
struct FragmentOps<F16> {
    LB_MMA_M16N8K16("f16")
    // A packed pair of f16 values as two floats.
    __device__ static __forceinline__ float2 pair_to_f32(u32 pair) { return __half22float2(*reinterpret_cast<const __half2*>(&pair)); }
    __device__ static __forceinline__ u32 mul2(u32 a, u32 b) { return F16::mul(a, b); }
    __device__ static __forceinline__ u32 fma2(u32 a, u32 b, u32 c) { return F16::fma(a, b, c); }

    // Row g codes (nibbles 0/4 of the word, and 2/6 after >> 8) become 1024 + q with one lop3 and are subtracted
    // as 1024 + z: 0x6400 is 1024.0 and its mantissa step is 1, so OR-ing z in is the addition. Row g + 8 codes
    // (nibbles 1/5, 3/7) land 4 bits up as 1024 + 16q; one fma scales by 1/16 and adds -(64 + z) (0xD400 is
    // -64.0 with step 1/16, so z goes in 4 bits up): (1024 + 16q) / 16 - (64 + z) = q - z. Both are exact.
    __device__ static __forceinline__ void zero_terms(u32 zz, u32 (&lo)[2], u32 (&hi)[2]) {
        lo[0] = and_or<0x000F000Fu, 0x64006400u>(zz);
        hi[0] = and_or<0x00F000F0u, 0xD400D400u>(zz);
        lo[1] = and_or<0x000F000Fu, 0x64006400u>(zz >> 8);
        hi[1] = and_or<0x00F000F0u, 0xD400D400u>(zz >> 8);
    }
    // The 8 codes of a fragment word -> the A fragment registers {(g, k), (g+8, k), (g, k+8), (g+8, k+8)} of q - z.
    __device__ static __forceinline__ uint4 dequant(u32 w, u32 lo, u32 hi) {
        const u32 w8 = w >> 8;
        return make_uint4(F16::sub(and_or<0x000F000Fu, F16::MAGIC>(w), lo),
                          F16::fma(and_or<0x00F000F0u, F16::MAGIC>(w), F16::ONE_SIXTEENTH, hi),
                          F16::sub(and_or<0x000F000Fu, F16::MAGIC>(w8), lo),
                          F16::fma(and_or<0x00F000F0u, F16::MAGIC>(w8), F16::ONE_SIXTEENTH, hi));
    }
    // 8-bit codes (the int8 layout, cuda.rs `repack_int8`): `lo` holds bytes (g, k) (g, k + 1) (g + 8, k)
    // (g + 8, k + 1) of the fragment, `hi` the same at k + 8. prmt next to the exponent byte 0x64 makes each pair
    // {1024 + u, 1024 + u'} (the fp16 step is 1 in [1024, 2048)); subtracting the zero term {1024 + z, 1024 + z}
    // of the row (load_group_terms<.., 8>) leaves u - z exactly: one prmt and one sub per register.
    // The zero terms of dequant8 from a lane group's four zero bytes (tile 0 row g, tile 0 row g + 8, tile 1 ...):
    // byte b of z4 next to byte 5 of {b:a} = 0x64, i.e. {1024 + z, 1024 + z}.
    __device__ static __forceinline__ void zero_terms8(u32 z4, u32 (&lo)[2], u32 (&hi)[2]) {
        lo[0] = prmt(z4, F16::MAGIC, 0x5050), hi[0] = prmt(z4, F16::MAGIC, 0x5151);
        lo[1] = prmt(z4, F16::MAGIC, 0x5252), hi[1] = prmt(z4, F16::MAGIC, 0x5353);
    }
    __device__ static __forceinline__ uint4 dequant8(u32 lo, u32 hi, u32 z_g, u32 z_g8) {
        return make_uint4(F16::sub(prmt(lo, F16::MAGIC, 0x5150), z_g), F16::sub(prmt(lo, F16::MAGIC, 0x5352), z_g8),
                          F16::sub(prmt(hi, F16::MAGIC, 0x5150), z_g), F16::sub(prmt(hi, F16::MAGIC, 0x5352), z_g8));
    }
    // Two scales (low half, high half) as f32.
    __device__ static __forceinline__ float2 scale_pair(u32 pair) {
        return __half22float2(*reinterpret_cast<const __half2*>(&pair));
    }
    __device__ static __forceinline__ float to_f32(u16 v) { return __half2float(__ushort_as_half(v)); }
    __device__ static __forceinline__ u16 from_f32(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

template <>
struct FragmentOps<BF16> {
    LB_MMA_M16N8K16("bf16")
    // A packed pair of bf16 values as two floats.
    __device__ static __forceinline__ float2 pair_to_f32(u32 pair) { return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u)); }
    __device__ static __forceinline__ u32 mul2(u32 a, u32 b) { return BF16::mul(a, b); }
    __device__ static __forceinline__ u32 fma2(u32 a, u32 b, u32 c) { return BF16::fma(a, b, c); }

    // bf16 has 7 mantissa bits, too few for 1024 + 16q, so every nibble pair is shifted down to bits 0-3 / 16-19
    // first (TensorRT-LLM does the same): 0x4300 | q = 128 + q, and fma((128 + q), 1, -(128 + z)) = q - z exactly
    // (0xC300 | z = -(128 + z); sub.bf16x2 needs sm_90, fma.bf16x2 exists from sm_80).
    __device__ static __forceinline__ void zero_terms(u32 zz, u32 (&lo)[2], u32 (&hi)[2]) {
        lo[0] = and_or<0x000F000Fu, BF16::NEG_MAGIC>(zz);
        hi[0] = and_or<0x000F000Fu, BF16::NEG_MAGIC>(zz >> 4);
        lo[1] = and_or<0x000F000Fu, BF16::NEG_MAGIC>(zz >> 8);
        hi[1] = and_or<0x000F000Fu, BF16::NEG_MAGIC>(zz >> 12);
    }
    __device__ static __forceinline__ uint4 dequant(u32 w, u32 lo, u32 hi) {
        return make_uint4(BF16::fma(and_or<0x000F000Fu, BF16::MAGIC>(w), BF16::ONE, lo),
                          BF16::fma(and_or<0x000F000Fu, BF16::MAGIC>(w >> 4), BF16::ONE, hi),
                          BF16::fma(and_or<0x000F000Fu, BF16::MAGIC>(w >> 8), BF16::ONE, lo),
                          BF16::fma(and_or<0x000F000Fu, BF16::MAGIC>(w >> 12), BF16::ONE, hi));
    }
    __device__ static __forceinline__ float2 scale_pair(u32 pair) {
        return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xFFFF0000u));
    }
    __device__ static __forceinline__ float to_f32(u16 v) { return __uint_as_float((u32)v << 16); }
    __device__ static __forceinline__ u16 from_f32(float v) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
};
#undef LB_MMA_M16N8K16

// This lane's per-group terms for its four accumulator rows (tile t = 0, 1 x rows g, g + 8).
struct GroupTerms {
    u32 lo[2], hi[2];  // zero terms of rows g / g + 8 per tile (FragmentOps<T>::zero_terms, or for 8-bit codes
                       // {1024 + z, 1024 + z}: FragmentOps<F16>::dequant8)
    float s[2][2];     // scales [tile][row g, row g + 8]
    u32 s2[2][2];      // the same scales as packed pairs {s, s} of the activation type (scaling A fragments)
};

// The zero terms and scales of this lane's four accumulator rows from its scales' and zero codes' shared addresses
// in one scale/zero row: one 8-byte and one 16-bit (8-bit codes: 32-bit) shared load, because the SCALE/ZERO LAYOUT
// of linear_w4a16.cu puts a lane group's four values together.
template <class T, bool HAS_ZEROS, int WBITS = 4>
__device__ __forceinline__ GroupTerms group_terms_at(u32 s_at, u32 z_at) {
    const uint2 sv = lds64(s_at);
    GroupTerms gt;
    if (WBITS == 8 && HAS_ZEROS) {
        FragmentOps<F16>::zero_terms8(lds32(z_at), gt.lo, gt.hi);
    } else if (WBITS == 8) {  // symmetric: every zero is the midpoint 128 (an immediate operand of the sub)
        gt.lo[0] = gt.lo[1] = gt.hi[0] = gt.hi[1] = F16::INT8_BIAS;
    } else {
        u32 z = 0x8888u;  // symmetric: every zero is the midpoint 8
        if (HAS_ZEROS) z = lds16(z_at);
        FragmentOps<T>::zero_terms(z * 0x10001u, gt.lo, gt.hi);
    }
    const float2 s0 = FragmentOps<T>::scale_pair(sv.x), s1 = FragmentOps<T>::scale_pair(sv.y);
    gt.s[0][0] = s0.x, gt.s[0][1] = s0.y, gt.s[1][0] = s1.x, gt.s[1][1] = s1.y;
    gt.s2[0][0] = prmt(sv.x, sv.x, 0x1010), gt.s2[0][1] = prmt(sv.x, sv.x, 0x3232);
    gt.s2[1][0] = prmt(sv.y, sv.y, 0x1010), gt.s2[1][1] = prmt(sv.y, sv.y, 0x3232);
    return gt;
}

// The same for scale/zero row `row` of a stage whose scale rows start at shared address `params` (zero rows follow
// after `s_bytes`). `warp` is the 32-column slice of the N_CTA-wide tile: 64 bytes of scales a row, 32 zero codes.
template <class T, bool HAS_ZEROS, int N_CTA, int WBITS = 4>
__device__ __forceinline__ GroupTerms load_group_terms(u32 params, int s_bytes, int row, int warp, int lane) {
    const int g = lane >> 2;
    const u32 z_at = WBITS == 8 ? params + s_bytes + row * N_CTA + warp * 32 + g * 4
                                : params + s_bytes + row * (N_CTA / 2) + warp * 16 + g * 2;
    return group_terms_at<T, HAS_ZEROS, WBITS>(params + row * (N_CTA * 2) + warp * 64 + g * 8, z_at);
}

// ------------------------------------------------------------------------------------------------------------------
// int8 tensor-core primitives (W8A8)
// ------------------------------------------------------------------------------------------------------------------

// cp_async16 to a shared-space address (a u32 base plus offsets, as ldmatrix takes it).
__device__ __forceinline__ void cp_async16_shared(u32 smem, const void* gmem, int src_bytes = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}

// mma.sync m16n8k32 s8 x s8 -> s32: D = A(16x32 row-major) * B(32x8 column-major) + C, with C = D (ACCUMULATE) or
// C = 0 (the first k step of a block, so the accumulator needs no zeroing). A fragment = ldmatrix_x4 of the
// 16x32-byte tile viewed as 16x16 b16 (matrices: rows 0-7 / 8-15 x bytes 0-15, then rows 0-7 / 8-15 x bytes 16-31);
// B fragment {b0, b1} = bytes 0-15 / 16-31 of 8 K-contiguous rows (one per output column).
template <bool ACCUMULATE>
__device__ __forceinline__ void mma_s8_m16n8k32(int (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if (ACCUMULATE) {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%10, %10, %10, %10};\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
    }
}

// 1.5 * 2^23, where the f32 step is 1: adding it to a value of magnitude < 2^22 rounds the value to an integer
// (ties to even) that the mantissa then holds, as the int32 bits - ROUNDING_MAGIC_BITS.
#define ROUNDING_MAGIC 12582912.0f
#define ROUNDING_MAGIC_BITS 0x4B400000

// An int32 of magnitude <= 2^22 as f32, exactly, without the quarter-rate I2F: adding it to the bit pattern of
// ROUNDING_MAGIC places it in the mantissa; subtracting ROUNDING_MAGIC leaves the value.
__device__ __forceinline__ float small_int_to_f32(int v) {
    return __fsub_rn(__int_as_float(ROUNDING_MAGIC_BITS + v), ROUNDING_MAGIC);
}

// A CTA's timeline for diagnosing fixed costs (the host's trace hook; null in every normal launch): %globaltimer
// nanoseconds at each event, written by thread 0 (a consumer in every kernel that traces: the W4A16 GEMM and the
// decode kernel; examples/gemm_trace reads it).
enum Trace {
    TRACE_ENTRY,          // the CTA starts
    TRACE_FIRST_FULL,     // its first stage has landed
    TRACE_MAINLOOP_END,   // first item (decode: first segment): its main loop done
    TRACE_PARTIALS_SEEN,  // first item, split-K: every split's partial published (decode: this CTA's counted)
    TRACE_ITEM_END,       // first item: y (or its share of the reduction) written
    TRACE_EXIT,           // last item done
    TRACE_ITEMS,          // items (decode: units) taken (a count)
    TRACE_SM,             // %smid (a count)
    TRACE_GLOBAL_STEP,    // GEMM split-K in cluster groups: this CTA's cluster arrived last and starts the global step
    TRACE_STEP_LOADED,    // ... and the other clusters' sums have landed in its shared memory
    TRACE_SLOTS
};

__device__ __forceinline__ void trace_stamp(u64* trace, int slot) {
    if (trace == nullptr || threadIdx.x != 0) return;
    u64 now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    trace[blockIdx.x * TRACE_SLOTS + slot] = now;
}
// The CTA's last stamp: its exit, how many items it took and the SM it ran on.
__device__ __forceinline__ void trace_exit(u64* trace, u32 items) {
    trace_stamp(trace, TRACE_EXIT);
    if (trace == nullptr || threadIdx.x != 0) return;
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    trace[blockIdx.x * TRACE_SLOTS + TRACE_ITEMS] = items;
    trace[blockIdx.x * TRACE_SLOTS + TRACE_SM] = sm;
}

// atomicAdd with acquire-release semantics at GPU scope: publishes this thread's earlier writes (and those ordered
// before them by a barrier) and acquires the writes published by earlier adds to the same counter. One instruction
// where a fence plus a relaxed atomicAdd would wait twice.
__device__ __forceinline__ u32 atomic_add_acq_rel_gpu(u32* counter, u32 value) {
    u32 old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(value) : "memory");
    return old;
}

// Programmatic dependent launch (sm_90; no-ops before, and when the launch did not ask for it). The first kernel
// lets its dependent start early; the dependent waits, before its first read of the first kernel's output, until
// that grid has completed and its writes are visible.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// STREAM-K partition of `units` work units over `ctas` CTAs (the decode kernel, the GEMM's STREAM-K): CTA c takes
// units [stream_unit_begin(c), stream_unit_begin(c + 1)), and stream_cta_of(u) is the CTA whose range holds unit u,
// the largest c with floor(c U / C) <= u.
__device__ __forceinline__ long long stream_unit_begin(long long c, long long units, long long ctas) {
    return c * units / ctas;
}
__device__ __forceinline__ int stream_cta_of(long long u, long long units, long long ctas) {
    return (int)(((u + 1) * ctas - 1) / units);
}

// The fix-up of a tile whose k range is split between CTAs (STREAM-K in the decode kernel and the GEMM), for one
// warp: its accumulators are its own columns, so no CTA barrier is needed, and `acc` is its F4 float4 (4 * F4
// floats, contiguous). The warp publishes them to slot `mine` and counts itself on counter_of(); the warp that
// arrives last among the tile's `pieces` sums every piece's slot, its own included, in piece order (lowest k first)
// into `acc`, resets the counter for the next launch and returns true; the others return false. The order does not
// depend on who arrives last, so repeated runs are bit-identical. `slot_of(p)` is piece p's slot (also called, its
// result unused, for p up to BATCH - 1 past the last piece: it must not read memory); `counted()` runs
// once the warp is counted (a trace stamp). BATCH pieces' loads are in flight at once (an L2 round trip each
// otherwise), as many as the caller's registers allow. Slot layout: float4 j of lane `lane` of warp `warp` (the
// caller's numbering) at (warp F4 + j) 32 + lane of the slot's slot_floats floats, so a warp's stores cover 512
// contiguous bytes. The functions are taken by reference: copying their closures cost the 64-token GEMM 8 bytes of
// spills, and the counter's address is formed where it is used, so it is not live across the stores and loads.
template <int F4, int BATCH, class CounterOf, class SlotOf, class Counted>
__device__ __forceinline__ bool warp_fixup(float* partials, long long slot_floats, int mine,
                                           const CounterOf& counter_of, int pieces, const SlotOf& slot_of,
                                           const Counted& counted, int warp, int lane, float* acc) {
    auto slot_ptr = [&](int slot, int j) {
        return reinterpret_cast<float4*>(partials + slot * slot_floats) + (warp * F4 + j) * 32 + lane;
    };
#pragma unroll
    for (int j = 0; j < F4; ++j)
        __stcg(slot_ptr(mine, j), make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
    // bar.warp.sync orders the lanes' stores before lane 0's release; the acq_rel add both publishes them and, for
    // the last arriver, acquires every other piece's.
    __syncwarp();
    u32 arrived = 0;
    if (lane == 0) arrived = atomic_add_acq_rel_gpu(counter_of(), 1u);
    arrived = __shfl_sync(0xFFFFFFFFu, arrived, 0);
    counted();
    if (arrived != (u32)(pieces - 1)) return false;
    __syncwarp();
    for (int p0 = 0; p0 < pieces; p0 += BATCH) {
        float4 q[BATCH][F4];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const int slot = slot_of(p0 + b);
            if (p0 + b < pieces) {
#pragma unroll
                for (int j = 0; j < F4; ++j) q[b][j] = __ldcg(slot_ptr(slot, j));
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            if (p0 + b >= pieces) break;
#pragma unroll
            for (int j = 0; j < F4; ++j) {
                float* d = acc + 4 * j;
                if (p0 + b == 0) {
                    d[0] = q[b][j].x, d[1] = q[b][j].y, d[2] = q[b][j].z, d[3] = q[b][j].w;
                } else {
                    d[0] += q[b][j].x, d[1] += q[b][j].y, d[2] += q[b][j].z, d[3] += q[b][j].w;
                }
            }
        }
    }
    if (lane == 0) *counter_of() = 0;  // every piece has arrived: ready for the next launch (graph replays included)
    return true;
}

// CUtensorMap: 128 opaque bytes, 64-byte aligned (the host encodes it; the kernel only passes its address to TMA).
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// ------------------------------------------------------------------------------------------------------------------
// Hopper (sm_90a): wgmma and TMA tensor copies
// ------------------------------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// A 2D TMA copy of one box of a tensor map (a __grid_constant__ kernel parameter) into shared memory, completing on
// mbarrier `bar`; c0 is the inner (contiguous) coordinate. Elements outside the tensor are written as zeros and still
// count towards the transaction bytes.
__device__ __forceinline__ void tma_load_2d(u32 smem, const void* tensor_map, int c0, int c1, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem),
        "l"(tensor_map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

// Register budget handed between warpgroups (producer down, consumers up); counts are per thread, multiples of 8.
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Ties registers to the program order of the wgmma asm statements: without it the compiler, which sees wgmma as
// synchronous, could read an accumulator before wgmma_wait or write an A fragment while a wgmma still reads it.
__device__ __forceinline__ void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wgmma_fence_operand(u32& r) { asm volatile("" : "+r"(r)::"memory"); }
// All 64 int32 accumulators of an s8 wgmma (after a wait: no read of them moves above it).
__device__ __forceinline__ void wgmma_fence_operands(int (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B: rows of 64 16-bit elements (128 B), 8-row groups 1024 B apart (stride byte offset),
// the tile 1024-byte aligned. Bits: [0,14) address >> 4, [16,30) leading byte offset >> 4 (unused when swizzled,
// 1 by convention), [32,46) stride byte offset >> 4, [62,64) layout 1 = 128-byte swizzle. Moving along K inside the
// 128-byte row is a plain address advance (+32 B per k16 step): the hardware applies the swizzle to the address.
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// D[64 x N] (+)= A[64 x 16] * B[16 x N], fp32 accumulators, A from registers (this warp's 16 rows as an
// m16n8k16-style A fragment), B a K-major shared-memory tile by descriptor; accumulate = 0 ignores D's old value.
// T: F16 or BF16; N: 8, 16, 32, 64 or 128 (N / 2 accumulators per thread).
// Accumulator d[4j + e] of a thread (warp w, lane = 4g + t): row 16w + g + 8(e / 2), column 8j + 2t + e % 2.
template <class T, int N>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint4 a, u64 desc, int accumulate);
// One definition for every shape; only the operand lists grow with N. For R = N / 2 accumulators:
// LB_ACC_OPS_R(0) binds d[0..R), LB_ACC_TEXT_R names them %0..%R-1 in the asm text, and LB_A_DESC_R / LB_PRED_R
// name the operands bound after them (the A fragment's four registers, the descriptor, `accumulate`).
// clang-format off
#define LB_ACC_OPS_4(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3])
#define LB_ACC_OPS_8(o) LB_ACC_OPS_4(o), LB_ACC_OPS_4(o + 4)
#define LB_ACC_OPS_16(o) LB_ACC_OPS_8(o), LB_ACC_OPS_8(o + 8)
#define LB_ACC_OPS_32(o) LB_ACC_OPS_16(o), LB_ACC_OPS_16(o + 16)
#define LB_ACC_OPS_48(o) LB_ACC_OPS_32(o), LB_ACC_OPS_16(o + 32)
#define LB_ACC_OPS_64(o) LB_ACC_OPS_32(o), LB_ACC_OPS_32(o + 32)
#define LB_ACC_TEXT_4 "%0, %1, %2, %3"
#define LB_ACC_TEXT_8 LB_ACC_TEXT_4 ", %4, %5, %6, %7"
#define LB_ACC_TEXT_16 LB_ACC_TEXT_8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define LB_ACC_TEXT_32 LB_ACC_TEXT_16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LB_ACC_TEXT_48 LB_ACC_TEXT_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define LB_ACC_TEXT_64 LB_ACC_TEXT_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, " \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LB_A_DESC_4 "{%4, %5, %6, %7}, %8"
#define LB_PRED_4 "%9"
#define LB_A_DESC_8 "{%8, %9, %10, %11}, %12"
#define LB_PRED_8 "%13"
#define LB_A_DESC_16 "{%16, %17, %18, %19}, %20"
#define LB_PRED_16 "%21"
#define LB_A_DESC_32 "{%32, %33, %34, %35}, %36"
#define LB_PRED_32 "%37"
#define LB_A_DESC_48 "{%48, %49, %50, %51}, %52"
#define LB_PRED_48 "%53"
#define LB_A_DESC_64 "{%64, %65, %66, %67}, %68"
#define LB_PRED_64 "%69"
#define LB_WGMMA_M64K16_RS(T, TYPE, N, R)                                                                    \
    template <>                                                                                             \
    __device__ __forceinline__ void wgmma_m64k16<T, N>(float(&d)[R], uint4 a, u64 desc, int accumulate) {  \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " LB_PRED_##R ", 0;\n"                                 \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " "                        \
                     "{" LB_ACC_TEXT_##R "}, " LB_A_DESC_##R ", p, 1, 1, 0;\n}\n"                              \
                     : LB_ACC_OPS_##R(0)                                                                    \
                     : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(desc), "r"(accumulate));                  \
    }
#define LB_WGMMA_M64K16_RS_BOTH(N, R) LB_WGMMA_M64K16_RS(F16, "f16", N, R) LB_WGMMA_M64K16_RS(BF16, "bf16", N, R)
LB_WGMMA_M64K16_RS_BOTH(8, 4)     // the decode kernel's token tile at M <= 8 (linear_w4a16.cu, WGMMA)
LB_WGMMA_M64K16_RS_BOTH(16, 8)    // M <= 16: the decode kernel, and the GEMM's tile for a handful of tokens
LB_WGMMA_M64K16_RS_BOTH(32, 16)   // the decode kernel at M <= 32
LB_WGMMA_M64K16_RS_BOTH(64, 32)   // the GEMM's 64-token tile
LB_WGMMA_M64K16_RS_BOTH(96, 48)   // the GEMM's 96-token tile (65..96 and 129..192 rows, unpadded to 128)
LB_WGMMA_M64K16_RS_BOTH(128, 64)  // the GEMM's 128-token tile
#undef LB_WGMMA_M64K16_RS_BOTH
#undef LB_WGMMA_M64K16_RS
#undef LB_ACC_OPS_4
#undef LB_ACC_OPS_8
#undef LB_ACC_OPS_16
#undef LB_ACC_OPS_32
#undef LB_ACC_OPS_48
#undef LB_ACC_OPS_64
#undef LB_ACC_TEXT_4
#undef LB_ACC_TEXT_8
#undef LB_ACC_TEXT_16
#undef LB_ACC_TEXT_32
#undef LB_ACC_TEXT_48
#undef LB_ACC_TEXT_64
#undef LB_A_DESC_4
#undef LB_PRED_4
#undef LB_A_DESC_8
#undef LB_PRED_8
#undef LB_A_DESC_16
#undef LB_PRED_16
#undef LB_A_DESC_32
#undef LB_PRED_32
#undef LB_A_DESC_48
#undef LB_PRED_48
#undef LB_A_DESC_64
#undef LB_PRED_64
// clang-format on

// Shared-memory matrix descriptor of a K-major operand in the 32-byte swizzle: rows of 32 bytes (8 tf32, one k8
// step), 8-row atoms of 256 B (stride byte offset), 16-byte chunk c of row r stored at chunk c ^ ((r >> 2) & 1)
// (address bit 4 ^= bit 7), the tile 256-byte aligned. Layout type 3 = 32-byte swizzle.
__device__ __forceinline__ u64 smem_desc_sw32(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(256 >> 4) << 32) | ((u64)3 << 62);
}

// f32 -> tf32 (round to nearest, ties away; low 13 bits zero), as a float.
__device__ __forceinline__ float to_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

// d[64 x 128] += A[64 x 8] * B[8 x 128] in f32 from tf32 operands; B K-major in shared memory (32-byte swizzle), A
// from registers: a = the thread's elements (row g, k t), (row g + 8, k t),
// (row g, k t + 4), (row g + 8, k t + 4) of its warp's 16 rows (lane = 4g + t), the layout of mma.m16n8k8's A;
// d[4j + e] as wgmma_s8_m64n128k32. No shared memory, so no store, proxy fence or warpgroup barrier before the issue.
__device__ __forceinline__ void wgmma_tf32_m64n128k8(float (&d)[64], const float (&a)[4], u64 desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "l"(desc_b));
}
// All 64 f32 accumulators of a wgmma (after a wait: no access moves above it).
__device__ __forceinline__ void wgmma_fence_operands(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders this thread's earlier generic-proxy view of global memory (including what an acquire made visible) before
// its later async-proxy (TMA) accesses.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// d[64 x 128] (+)= A[64 x 32] * B[32 x 128] in int32; accumulate = 0 ignores d's old value.
// d[4j + e] of a thread (warp w of the warpgroup, lane 4g + t): row 16w + g + 8(e / 2), column 8j + 2t + e % 2.
__device__ __forceinline__ void wgmma_s8_m64n128k32(int (&d)[64], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
        "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
        "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
          "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
          "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
          "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
          "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#endif  // sm_90

}  // namespace lowbit
