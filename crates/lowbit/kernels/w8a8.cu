// W8A8: int8 activations x int8 weights on the int8 tensor cores, fp16/bf16 in and out. Host side:
// src/ops/w8a8/cuda.rs; the scheme (formats.md, ops/w8a8/mod.rs):
//   C[m, n] = sum_b [ sA*sB*dot_b + sA*oB*sumA_b + oA*(sB*sumB_b + bs_b*oB) ] (+ bias[n])
// per K block b, dot_b = sum a_q*b_q exact in int32. SmoothQuant is the same GEMM with one block per row and zero
// offsets (per-token x per-channel scales in the epilogue).
//
// Kernels (extern "C", instantiated at the bottom):
//   w8a8_quantize_<t>_<mode>_<v>  fp16/bf16 activations [M, K] -> int8 codes [M, K_pad] (zero padded) and per
//       (row, block) params float4 {scale, offset, code sum, 0} stored [blocks][M]. <v>:
//       - r1/r2/r4/r8: a warp per block, its values in registers; v2/v4/v8: the same with vector loads;
//       - v8g4/g8/g16: 16-byte loads, groups of 4-16 lanes per block, several blocks per warp (blocks <= 128);
//       - cta2/cta4/cta8: a CTA per block (SmoothQuant's per-token rows), up to 2048 H values held in registers;
//         cta: the same in two passes, any length; loop: a warp per block, two passes, any block.
//       Bit-exact with the CPU quantizer: every step is an IEEE-rounded f32 operation.
//   w8a8_gemm_<t>_s<stages>  the mma.sync GEMM (sm_80+), applying each block's correction in registers.
//   w8a8_wgmma_<t>_s<stages>  the Hopper GEMM (sm_90a): warp-specialised, TMA, wgmma; see its section below.
//   w8a8_wgmma_channel_<t>_s<stages>  the same for a per-channel weight: per block out += sA*dot, and sB once in
//       the epilogue (the host prepares the weight records with sB = 1 and oB / sB for oB).
//   w8a8_wgmma_channel_sym_<t>_s<stages>  the same with symmetric activations and a symmetric weight: every offset
//       term is zero, so neither the tf32 wgmma nor the W record's copy.
//   w8a8_wgmma[_channel]_trace_f16_s4  twins that also write a per-stage timeline (StageTrace): diagnosis only.
//
// GEMM design (mma.sync m16n8k32 s8, runs on sm_80 and later):
// - CTA tile 128 (M) x 128 (N), 8 warps as 2 x 4, warp tile 64 x 32: per k step of 32, 4 A fragments
//   (ldmatrix.x4), 2 ldmatrix.x4 for the 4 B fragments, 16 mma. A stage holds 128 bytes of K of both tiles
//   (rows of 128 bytes, 16-byte chunks XOR-swizzled by row % 8 so ldmatrix is conflict free) plus the block
//   parameters of the blocks the stage ends ("slots": 4 / 2 / 1 for blocks of 32 / 64 / >= 128), all copied with
//   cp.async in a STAGES-deep pipeline.
// - Two accumulators: int32 for the running block (the first k step of a block writes it with C = 0), f32 for the
//   output. At a block's last k step each element gets acc += sA*(sB*dot + oB*sumA) + oA*ot, ot = sB*sumB + bs*oB
//   precomputed per (column, block) when the weight is prepared. The dot is converted with the exact magic-number
//   trick when blocks are <= 256 long (|dot| <= 2^22), with I2F otherwise (SmoothQuant: once per output).
// - Weight codes are padded at prepare time to [N_pad, K_pad] (multiples of 128), activation codes to K_pad by the
//   quantizer, so every copy is a full 16-byte cp.async; rows past M are zero-filled. Padding codes are 0 and do
//   not change any dot; code sums and block lengths count real elements only.
// - Epilogue: f32 + bias rounded once to the output type, staged through shared memory, 16-byte row stores.
#include "common.cuh"

using namespace lowbit;

// Kernel parameters; mirrored by `QuantizeParams` / `GemmParams` in src/ops/w8a8/cuda.rs (same field order).
struct QuantizeParams {
    const void* x;          // [M, ldx] f16/bf16
    signed char* codes;     // [M, k_pad]
    float4* params;         // [blocks][M] {scale, offset, code sum, 0}
    u32 m, k, ldx, k_pad;
    u32 block, blocks;
};

struct GemmParams {
    const signed char* a;      // [M, k_pad] activation codes
    const float4* a_params;    // [blocks][M] {sA, oA, sumA, 0}
    const signed char* w;      // [n_pad, k_pad] weight codes
    const float4* w_params;    // [blocks][n_pad] {sB, oB, sB*sumB + bs*oB, 0}
    const float* bias;         // [N] or null
    const float* channel_scales;  // [N]: a per-channel weight's sB (the `_channel` kernels), else null
    unsigned long long* trace;    // the `_trace` kernel's per-stage timeline (STAGE_TRACE), else null
    void* out;                 // [M, ldo] f16/bf16
    u32 m, n, n_pad, k_pad, ldo;
    u32 blocks;       // K blocks
    u32 block_steps;  // k steps (of 32) per block; the last block may end early
    u32 k_steps;      // k steps holding real data: ceil(K / 32)
    u32 slots;        // parameter slots per stage: 4 / 2 / 1
    u32 tiles_m, tiles_n;
    u32 small_dot;    // 1 when every block dot is at most 2^22 in magnitude (blocks <= 256 long)
};

// ------------------------------------------------------------------------------------------------------------------
// Output types
// ------------------------------------------------------------------------------------------------------------------

template <class T>
struct Io;
template <>
struct Io<__half> {
    __device__ static __forceinline__ float load(const void* p, u64 i) {
        return __half2float(reinterpret_cast<const __half*>(p)[i]);
    }
    __device__ static __forceinline__ float from_bits(u32 b) { return __half2float(__ushort_as_half((u16)b)); }
    using Pair = __half2;
    __device__ static __forceinline__ u32 pack(float lo, float hi) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const u32*>(&h);
    }
};
template <>
struct Io<__nv_bfloat16> {
    __device__ static __forceinline__ float load(const void* p, u64 i) {
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
    }
    __device__ static __forceinline__ float from_bits(u32 b) { return __uint_as_float(b << 16); }
    using Pair = __nv_bfloat162;
    __device__ static __forceinline__ u32 pack(float lo, float hi) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const u32*>(&h);
    }
};

// ------------------------------------------------------------------------------------------------------------------
// Activation quantization
// ------------------------------------------------------------------------------------------------------------------

template <int WIDTH = 32>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
template <int WIDTH = 32>
__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
    return v;
}
template <int WIDTH = 32>
__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

// The online scheme of formats.md in explicitly rounded f32 steps (no fma contraction), as the CPU computes it.
// Asymmetric: scale = (max - min) / 255, offset = max - 127 * scale, codes in [-128, 127]; symmetric:
// scale = max|a| / 127, codes in [-127, 127]. A zero or subnormal scale becomes 1 (offset max): all codes 0.
template <bool SYM>
struct BlockQuantizer {
    float scale, offset, q_lo, q_hi;
    float inv;      // 1 / scale, rounded
    float shift;    // -offset / scale, rounded: (v - offset) / scale ~ v * inv + shift, one FFMA
    float near;     // |x - rint(x)| at least this: x may be too close to k + 1/2 to round like the CPU's quotient
    __device__ __forceinline__ BlockQuantizer(float lo, float hi) {
        if (SYM) {
            const float s = __fdiv_rn(fmaxf(fabsf(lo), fabsf(hi)), 127.0f);
            scale = s >= 1.17549435e-38f ? s : 1.0f;
            offset = 0.0f;
            q_lo = -127.0f;
        } else {
            const float s = __fdiv_rn(__fsub_rn(hi, lo), 255.0f);
            const bool normal = s >= 1.17549435e-38f;
            scale = normal ? s : 1.0f;
            offset = normal ? __fsub_rn(hi, __fmul_rn(127.0f, s)) : hi;
            q_lo = -128.0f;
        }
        q_hi = 127.0f;
        inv = __frcp_rn(scale);
        shift = -__fmul_rn(offset, inv);
        // The error bound of codes() below, doubled: 3e-5 + 1.8e-7 |shift|.
        near = 0.5f - (1e-4f + 4e-7f * fabsf(shift));
    }
    // The codes clamp(round_half_away(RN(v - offset) / scale), q_lo, q_hi) of N values, as the CPU computes them.
    // The IEEE division costs ~10 instructions an element, so it is only done where it can matter:
    // - x = v * inv + shift (one rounding) is within (2|x| + 3|shift|) * 2^-24 of (v - offset) / scale, and the
    //   CPU's quotient within 2|x| * 2^-24 of it; |x| <= ~128 after the clamp.
    // - Unless x lies within `0.5 - near` of a rounding boundary k + 1/2, both round to the same integer, and there
    //   is no tie: round-to-nearest-even by the magic-number addition gives the CPU's code. Clamping to the
    //   integer bounds first commutes with the rounding (a clamped x is an integer, never near a half).
    // - When any of the N is in that band, those are divided and rounded half away exactly. The band is rare for
    //   f16 data (~2e-4 of elements) but common for bf16 (8-bit mantissas put many quotients on exact halves):
    //   dividing all N then cost bf16 SmoothQuant ~35%.
    // So the common path has no branch or saved predicate per element, no division, no roundf and no
    // sixteenth-rate F2I: ~8 instructions an element.
    template <int N>
    __device__ __forceinline__ void codes(const float (&v)[N], int (&c)[N]) const {
        bool any_near = false;
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const float x = fminf(fmaxf(__fmaf_rn(v[e], inv, shift), q_lo), q_hi);
            const float t = __fadd_rn(x, ROUNDING_MAGIC);  // x rounded into the mantissa
            any_near |= fabsf(__fsub_rn(x, __fsub_rn(t, ROUNDING_MAGIC))) >= near;
            c[e] = __float_as_int(t) - ROUNDING_MAGIC_BITS;
        }
        if (any_near) {  // the near ones the CPU's way; the test is redone (FRND, not the magic number) so that
                         // the common path keeps no predicate per element for it
#pragma unroll
            for (int e = 0; e < N; ++e) {
                const float x = fminf(fmaxf(__fmaf_rn(v[e], inv, shift), q_lo), q_hi);
                if (fabsf(__fsub_rn(x, rintf(x))) >= near)
                    c[e] = (int)fminf(fmaxf(roundf(__fdiv_rn(__fsub_rn(v[e], offset), scale)), q_lo), q_hi);
            }
        }
    }
    __device__ __forceinline__ int code(float v) const {
        const float one[1] = {v};
        int c[1];
        codes<1>(one, c);
        return c[0];
    }
};

// One warp per (row, block). PER_LANE > 0: the block (<= 32 * PER_LANE values) is held in registers, one read;
// PER_LANE = 0: any block length, two passes over memory.
template <class T, bool SYM, int PER_LANE>
__device__ __forceinline__ void quantize_block(const QuantizeParams& p) {
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (warp >= (u64)p.m * p.blocks) return;
    const u32 row = (u32)(warp / p.blocks), b = (u32)(warp % p.blocks);
    const u32 start = b * p.block, len = min(p.block, p.k - start);
    const u64 src = (u64)row * p.ldx + start;
    signed char* codes = p.codes + (u64)row * p.k_pad + start;

    float lo = __int_as_float(0x7F800000), hi = -lo;  // +inf, -inf
    float v[PER_LANE > 0 ? PER_LANE : 1];
    if (PER_LANE > 0) {
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const u32 idx = lane + 32 * i;
            v[i] = idx < len ? Io<T>::load(p.x, src + idx) : 0.0f;
            if (idx < len) lo = fminf(lo, v[i]), hi = fmaxf(hi, v[i]);
        }
    } else {
        for (u32 idx = lane; idx < len; idx += 32) {
            const float x = Io<T>::load(p.x, src + idx);
            lo = fminf(lo, x), hi = fmaxf(hi, x);
        }
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    const BlockQuantizer<SYM> q(lo, hi);
    int sum = 0;
    if (PER_LANE > 0) {
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const u32 idx = lane + 32 * i;
            if (idx < len) {
                const int c = q.code(v[i]);
                codes[idx] = (signed char)c;
                sum += c;
            }
        }
    } else {
        for (u32 idx = lane; idx < len; idx += 32) {
            const int c = q.code(Io<T>::load(p.x, src + idx));
            codes[idx] = (signed char)c;
            sum += c;
        }
    }
    sum = warp_sum(sum);
    if (lane == 0) p.params[(u64)b * p.m + row] = make_float4(q.scale, q.offset, (float)sum, 0.0f);
    // The last block also zeroes the row's padding up to k_pad (the GEMM reads whole 128-byte k tiles).
    if (b == p.blocks - 1) {
        for (u32 idx = p.k + lane; idx < p.k_pad; idx += 32) p.codes[(u64)row * p.k_pad + idx] = 0;
    }
}

// The vector variant: lane l holds the N consecutive values l*N .. l*N + N - 1 of the block (one 2N-byte load,
// one N-byte store of codes). The host launches it when every row and block start is N-element aligned (K and
// the block a multiple of N, x aligned to 2N bytes). Groups that straddle the end of a partial block go element
// by element.
// The low bytes of four codes as one word (three PRMT).
__device__ __forceinline__ u32 pack4_s8(int c0, int c1, int c2, int c3) {
    return __byte_perm(__byte_perm(c0, c1, 0x0040), __byte_perm(c2, c3, 0x0040), 0x5410);
}

// N 16-bit values packed in pairs (value e in half e % 2 of word e / 2) as floats.
template <class T, int N>
__device__ __forceinline__ void unpack_pairs(const u32 (&w)[4], float (&v)[N]) {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = Io<T>::from_bits((w[e / 2] >> (16 * (e % 2))) & 0xFFFFu);
}
// The eight values of one 16-byte load.
template <class T>
__device__ __forceinline__ void unpack8(const uint4& t, float (&v)[8]) {
    const u32 w[4] = {t.x, t.y, t.z, t.w};
    unpack_pairs<T, 8>(w, v);
}
// Lane-wise min / max of two packed pairs of T (one HMNMX2).
template <class T>
__device__ __forceinline__ u32 pair_min(u32 a, u32 b) {
    using P = typename Io<T>::Pair;
    const P m = __hmin2(*reinterpret_cast<const P*>(&a), *reinterpret_cast<const P*>(&b));
    return *reinterpret_cast<const u32*>(&m);
}
template <class T>
__device__ __forceinline__ u32 pair_max(u32 a, u32 b) {
    using P = typename Io<T>::Pair;
    const P m = __hmax2(*reinterpret_cast<const P*>(&a), *reinterpret_cast<const P*>(&b));
    return *reinterpret_cast<const u32*>(&m);
}
// Widens [lo, hi] to the eight values of one 16-byte load: the min / max run on the packed pairs (3 + 3 HMNMX2),
// only their two survivors are converted (the order of min / max does not matter, and f16 / bf16 -> f32 is exact
// and monotonic).
template <class T>
__device__ __forceinline__ void widen_range8(const uint4& t, float& lo, float& hi) {
    const u32 mn = pair_min<T>(pair_min<T>(t.x, t.y), pair_min<T>(t.z, t.w));
    const u32 mx = pair_max<T>(pair_max<T>(t.x, t.y), pair_max<T>(t.z, t.w));
    lo = fminf(lo, fminf(Io<T>::from_bits(mn & 0xFFFFu), Io<T>::from_bits(mn >> 16)));
    hi = fmaxf(hi, fmaxf(Io<T>::from_bits(mx & 0xFFFFu), Io<T>::from_bits(mx >> 16)));
}
template <class T, int N>
__device__ __forceinline__ void load_values(const void* x, u64 i, float (&v)[N]) {
    const unsigned short* src = reinterpret_cast<const unsigned short*>(x) + i;
    u32 w[4] = {0, 0, 0, 0};  // N values as 16-bit pairs
    if (N == 1) w[0] = src[0];
    if (N == 2) w[0] = *reinterpret_cast<const u32*>(src);
    if (N == 4) {
        const uint2 t = *reinterpret_cast<const uint2*>(src);
        w[0] = t.x, w[1] = t.y;
    }
    if (N == 8) {
        const uint4 t = *reinterpret_cast<const uint4*>(src);
        w[0] = t.x, w[1] = t.y, w[2] = t.z, w[3] = t.w;
    }
    unpack_pairs<T, N>(w, v);
}

// GROUP < 32: each warp quantizes 32 / GROUP blocks, GROUP lanes each (blocks of at most GROUP * N values; with
// N = 8, 16-byte loads also for blocks of 32..128). The shuffles stay within a group: every xor offset is < GROUP.
template <class T, bool SYM, int N, int GROUP = 32>
__device__ __forceinline__ void quantize_block_vec(const QuantizeParams& p) {
    const u64 unit = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / GROUP;  // (row, block) of this lane's group
    const int lane = threadIdx.x % GROUP;
    // Whole warps leave together (the shuffles need every lane); a group past the end computes nothing.
    if (((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32 * (32 / GROUP) >= (u64)p.m * p.blocks) return;
    const bool valid = unit < (u64)p.m * p.blocks;
    const u32 row = valid ? (u32)(unit / p.blocks) : 0, b = valid ? (u32)(unit % p.blocks) : 0;
    const u32 start = b * p.block, len = min(p.block, p.k - start);
    const u64 src = (u64)row * p.ldx + start;
    signed char* codes = p.codes + (u64)row * p.k_pad + start;
    const u32 first = valid ? lane * N : len;  // an invalid group sees an empty block
    const bool whole = first + N <= len;

    float v[N];
    float lo = __int_as_float(0x7F800000), hi = -lo;  // +inf, -inf
    const bool pair_range = N == 8 && whole;  // the common case: the range on the packed pairs
    if constexpr (N == 8) {
        if (pair_range) {
            const uint4 t = *reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(p.x) + src + first);
            widen_range8<T>(t, lo, hi);
            unpack8<T>(t, v);
        }
    }
    if (!pair_range) {
        if (whole) {
            load_values<T, N>(p.x, src + first, v);
        } else {
#pragma unroll
            for (int e = 0; e < N; ++e) v[e] = first + e < len ? Io<T>::load(p.x, src + first + e) : 0.0f;
        }
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (first + e < len) lo = fminf(lo, v[e]), hi = fmaxf(hi, v[e]);
    }
    lo = warp_min<GROUP>(lo);
    hi = warp_max<GROUP>(hi);
    const BlockQuantizer<SYM> q(lo, hi);
    int c[N], sum = 0;
    q.codes(v, c);
#pragma unroll
    for (int e = 0; e < N; ++e) {
        c[e] = first + e < len ? c[e] : 0;
        sum += c[e];
    }
    u32 packed[2] = {0, 0};  // N codes, 4 per word
    if constexpr (N == 8) {
        packed[0] = pack4_s8(c[0], c[1], c[2], c[3]);
        packed[1] = pack4_s8(c[4], c[5], c[6], c[7]);
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) packed[e / 4] |= (u32)(c[e] & 0xFF) << (8 * (e % 4));
    }
    if (whole) {
        if (N == 8) *reinterpret_cast<uint2*>(codes + first) = make_uint2(packed[0], packed[1]);
        if (N == 4) *reinterpret_cast<u32*>(codes + first) = packed[0];
        if (N == 2) *reinterpret_cast<unsigned short*>(codes + first) = (unsigned short)packed[0];
        if (N == 1) codes[first] = (signed char)packed[0];
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e)
            if (first + e < len) codes[first + e] = (signed char)(packed[e / 4] >> (8 * (e % 4)));
    }
    sum = warp_sum<GROUP>(sum);
    if (!valid) return;
    if (lane == 0) p.params[(u64)b * p.m + row] = make_float4(q.scale, q.offset, (float)sum, 0.0f);
    if (b == p.blocks - 1) {
        for (u32 idx = p.k + lane; idx < p.k_pad; idx += GROUP) p.codes[(u64)row * p.k_pad + idx] = 0;
    }
}

// One CTA of 256 threads per (row, block), for blocks longer than a warp's registers hold (SmoothQuant's one block
// per row): eight consecutive values per thread and 16-byte load (the host launches it when K and the block are
// multiples of 8 and x is 16-byte aligned). HELD > 0: the block (at most 2048 HELD values) stays in registers, all
// of a thread's loads in flight at once and one read of memory; HELD = 0: any length, two passes over the block
// (the second reads it from L2), one 16-byte load in flight per thread at a time (~1.7 TB/s at K = 14336).
template <class T, bool SYM, int HELD>
__device__ __forceinline__ void quantize_block_cta(const QuantizeParams& p) {
    __shared__ float part_lo[8], part_hi[8];
    __shared__ int part_sum[8];
    const u32 row = blockIdx.x / p.blocks, b = blockIdx.x % p.blocks;
    const u32 start = b * p.block, len = min(p.block, p.k - start);  // a multiple of 8
    const u64 src = (u64)row * p.ldx + start;
    signed char* codes = p.codes + (u64)row * p.k_pad + start;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

    float lo = __int_as_float(0x7F800000), hi = -lo;  // +inf, -inf
    uint4 held[HELD > 0 ? HELD : 1];
    const uint4* row_x = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(p.x) + src);
    if (HELD > 0) {
#pragma unroll
        for (int c = 0; c < HELD; ++c) {
            const u32 i = (c * 256 + threadIdx.x) * 8;
            if (i < len) held[c] = row_x[i / 8];
        }
#pragma unroll
        for (int c = 0; c < HELD; ++c) {
            if ((c * 256 + threadIdx.x) * 8 >= len) break;
            widen_range8<T>(held[c], lo, hi);
        }
    } else {
        for (u32 i = threadIdx.x * 8; i < len; i += 256 * 8) {
            float v[8];
            load_values<T, 8>(p.x, src + i, v);
#pragma unroll
            for (int e = 0; e < 8; ++e) lo = fminf(lo, v[e]), hi = fmaxf(hi, v[e]);
        }
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    if (lane == 0) part_lo[warp] = lo, part_hi[warp] = hi;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < 8; ++w) lo = fminf(lo, part_lo[w]), hi = fmaxf(hi, part_hi[w]);
    const BlockQuantizer<SYM> q(lo, hi);

    int sum = 0;
    // The codes of values i .. i + 7.
    auto emit = [&](u32 i, const float (&v)[8]) {
        int c[8];
        q.codes(v, c);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += c[e];
        *reinterpret_cast<uint2*>(codes + i) =
            make_uint2(pack4_s8(c[0], c[1], c[2], c[3]), pack4_s8(c[4], c[5], c[6], c[7]));
    };
    if (HELD > 0) {
#pragma unroll
        for (int c = 0; c < HELD; ++c) {  // unrolled: the registers are indexed at compile time
            const u32 i = (c * 256 + threadIdx.x) * 8;
            if (i >= len) break;
            float v[8];
            unpack8<T>(held[c], v);
            emit(i, v);
        }
    } else {
        for (u32 i = threadIdx.x * 8; i < len; i += 256 * 8) {
            float v[8];
            load_values<T, 8>(p.x, src + i, v);
            emit(i, v);
        }
    }
    sum = warp_sum(sum);
    if (lane == 0) part_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) total += part_sum[w];
        p.params[(u64)b * p.m + row] = make_float4(q.scale, q.offset, (float)total, 0.0f);
    }
    if (b == p.blocks - 1) {
        for (u32 idx = p.k + threadIdx.x; idx < p.k_pad; idx += 256) p.codes[(u64)row * p.k_pad + idx] = 0;
    }
}

// ------------------------------------------------------------------------------------------------------------------
// GEMM
// ------------------------------------------------------------------------------------------------------------------

#define W8A8_THREADS 256
#define TILE_M 128
#define TILE_N 128
#define TILE_K 128                                 // bytes (= codes) of K per pipeline stage
#define STEPS_PER_STAGE (TILE_K / 32)              // mma k steps per stage
#define TILE_BYTES (TILE_M * TILE_K)               // one operand tile of a stage (A and B are the same size)
#define SLOT_BYTES (TILE_M * 16)                   // one float4 per row (A) or column (B)
#define RASTER_GROUP 8                             // M tiles per raster group (consecutive CTAs share B tiles)
#define OUT_PITCH (TILE_N * 2 + 16)                // bytes per staged output row (padding breaks bank conflicts)

__host__ __device__ constexpr u32 stage_bytes(u32 slots) { return 2 * TILE_BYTES + 2 * slots * SLOT_BYTES; }

// Stages start 1024-byte aligned (the host adds SMEM_ALIGN bytes of slack): the 128-byte swizzle wgmma applies
// works on absolute address bits, so its 8-row atoms must be aligned.
#define SMEM_ALIGN 1024
__device__ __forceinline__ u32 aligned_smem_base(const void* smem) {
    return (smem_addr(smem) + SMEM_ALIGN - 1) & ~(u32)(SMEM_ALIGN - 1);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 128-byte-row tile.
__device__ __forceinline__ u32 swizzled(u32 row, u32 chunk) { return row * TILE_K + ((chunk ^ (row & 7)) << 4); }

// Issues the cp.async copies of k tile `kt` into the stage at shared address `stage`.
__device__ __forceinline__ void load_stage(const GemmParams& p, u32 stage, u32 kt, u32 m0, u32 n0, int tid) {
    const u64 k0 = (u64)kt * TILE_K;
#pragma unroll
    for (int it = 0; it < TILE_M * 8 / W8A8_THREADS; ++it) {
        const u32 c = tid + it * W8A8_THREADS, row = c / 8, chunk = c % 8;
        const u32 grow = m0 + row;
        const signed char* src = p.a + (u64)min(grow, p.m - 1) * p.k_pad + k0 + chunk * 16;
        cp_async16_shared(stage + swizzled(row, chunk), src, grow < p.m ? 16 : 0);
        const signed char* wsrc = p.w + (u64)(n0 + row) * p.k_pad + k0 + chunk * 16;
        cp_async16_shared(stage + TILE_BYTES + swizzled(row, chunk), wsrc, 16);
    }
    // Slot s holds the parameters of the block that k step kt * 4 + s * (4 / slots) belongs to (clamped: a slot
    // past the last block is never read).
    const u32 params = stage + 2 * TILE_BYTES;
    for (u32 s = 0; s < p.slots; ++s) {
        const u32 b = min((kt * STEPS_PER_STAGE + s * (STEPS_PER_STAGE / p.slots)) / p.block_steps, p.blocks - 1);
        if (tid < TILE_M) {
            const u32 grow = m0 + tid;
            cp_async16_shared(params + s * SLOT_BYTES + tid * 16, p.a_params + (u64)b * p.m + min(grow, p.m - 1),
                              grow < p.m ? 16 : 0);
        } else {
            const u32 col = tid - TILE_M;
            cp_async16_shared(params + (p.slots + s) * SLOT_BYTES + col * 16, p.w_params + (u64)b * p.n_pad + n0 + col,
                              16);
        }
    }
}

// Entries n, n + 1 of a per-column vector `v` [N] (0 past N or without one): the bias, the channel scales.
__device__ __forceinline__ float2 load_column_pair(const GemmParams& p, const float* v, u32 n) {
    float2 b = make_float2(0.0f, 0.0f);
    if (v) {
        if (n < p.n) b.x = __ldg(v + n);
        if (n + 1 < p.n) b.y = __ldg(v + n + 1);
    }
    return b;
}
__device__ __forceinline__ float2 load_bias_pair(const GemmParams& p, u32 n) { return load_column_pair(p, p.bias, n); }

// Rounds (lo, hi) once to T and writes the pair at (row, col) of the output tile staged at shared address `base`.
template <class T>
__device__ __forceinline__ void stage_pair(u32 base, u32 row, u32 col, float lo, float hi) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + row * OUT_PITCH + col * 2), "r"(Io<T>::pack(lo, hi)));
}

// Copies rows [first, first + ROWS) of the output tile staged at shared address `base` to global memory with THREADS
// threads (`tid` counted from 0): 16-byte row stores, element stores at the N edge or when rows are not 16-byte
// aligned; rows past M are skipped.
template <int ROWS, int THREADS>
__device__ __forceinline__ void store_rows(const GemmParams& p, u32 base, u32 m0, u32 n0, u32 first, int tid) {
    const bool vector_rows = p.ldo % 8 == 0;
    unsigned short* out = reinterpret_cast<unsigned short*>(p.out);
#pragma unroll
    for (int it = 0; it < ROWS * (TILE_N / 8) / THREADS; ++it) {
        const u32 c = tid + it * THREADS, row = first + c / (TILE_N / 8), chunk = c % (TILE_N / 8);
        const u32 grow = m0 + row, gcol = n0 + chunk * 8;
        if (grow >= p.m || gcol >= p.n) continue;
        const uint4 v = lds128(base + row * OUT_PITCH + chunk * 16);
        unsigned short* dst = out + (u64)grow * p.ldo + gcol;
        if (vector_rows && gcol + 8 <= p.n) {
            store_stream_v4(dst, v);
        } else {
#pragma unroll
            for (u32 e = 0; e < 8; ++e) {
                const u32 word = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
                if (gcol + e < p.n) dst[e] = (unsigned short)(word >> (16 * (e % 2)));
            }
        }
    }
}

// The CTA's output tile under the grouped raster: RASTER_GROUP M tiles walk N together, so the B tiles they share
// stay in L2.
__device__ __forceinline__ void tile_origin(const GemmParams& p, u32 pid, u32& m0, u32& n0) {
    const u32 per_group = RASTER_GROUP * p.tiles_n;
    const u32 first_m = pid / per_group * RASTER_GROUP;
    const u32 group_m = min(p.tiles_m - first_m, (u32)RASTER_GROUP);
    m0 = (first_m + (pid % per_group) % group_m) * TILE_M;
    n0 = (pid % per_group) / group_m * TILE_N;
}

// The warp tile: 4 (m16) x 4 (n8) mma tiles.
struct Accumulators {
    int dot[4][4][4];   // the running block's int32 dots
    float out[4][4][4]; // the f32 result so far
};

// acc += sA*(sB*dot + oB*sumA) + oA*ot for every element of the warp tile; parameters from the stage's slot.
// Element (i, j, r): row i*16 + g + 8*(r / 2), column j*8 + 2t + r % 2 of the warp tile.
__device__ __forceinline__ void apply_block(Accumulators& acc, u32 a_params, u32 b_params, u32 wrow, u32 wcol,
                                            int lane, bool small_dot) {
    const int g = lane >> 2, t = lane & 3;
    float4 cp[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const uint4 v = lds128(b_params + (wcol + j * 8 + 2 * t + c) * 16);
            cp[j][c] = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), 0.0f);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4 v = lds128(a_params + (wrow + i * 16 + g + 8 * h) * 16);
            const float sa = __uint_as_float(v.x), oa = __uint_as_float(v.y), suma = __uint_as_float(v.z);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int r = 2 * h + c;
                    const int d = acc.dot[i][j][r];
                    const float f = small_dot ? small_int_to_f32(d) : __int2float_rn(d);
                    const float4 pb = cp[j][c];
                    const float inner = fmaf(pb.x, f, pb.y * suma);  // sB*dot + oB*sumA
                    float o = fmaf(sa, inner, acc.out[i][j][r]);
                    acc.out[i][j][r] = fmaf(oa, pb.z, o);             // + oA*(sB*sumB + bs*oB)
                }
            }
        }
    }
}

template <class T, int STAGES>
__device__ __forceinline__ void gemm(const GemmParams& p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    u32 m0, n0;
    tile_origin(p, blockIdx.x, m0, n0);
    const u32 wrow = (warp / 4) * 64, wcol = (warp % 4) * 32;

    const u32 base = aligned_smem_base(smem), sbytes = stage_bytes(p.slots);
    const u32 k_tiles = (p.k_steps + STEPS_PER_STAGE - 1) / STEPS_PER_STAGE;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if ((u32)s < k_tiles) load_stage(p, base + s * sbytes, s, m0, n0, tid);
        cp_async_commit();
    }

    Accumulators acc;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc.out[i][j][r] = 0.0f, acc.dot[i][j][r] = 0;

    // ldmatrix row addresses of this lane (before the per-stage base and k step offsets).
    const u32 a_row = wrow + (lane % 16), a_half = lane / 16;                        // A: 16 rows x 2 chunks
    const u32 b_row = wcol + (lane % 8) + (lane / 16) * 8, b_half = (lane / 8) % 2;  // B: 2 n8 tiles x 2 chunks
    u32 block_pos = 0;  // k steps of the running block done so far
    for (u32 kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const u32 next = kt + STAGES - 1;
        if (next < k_tiles) load_stage(p, base + (next % STAGES) * sbytes, next, m0, n0, tid);
        cp_async_commit();

        const u32 stage = base + (kt % STAGES) * sbytes;
        const u32 params = stage + 2 * TILE_BYTES;
#pragma unroll
        for (int ks = 0; ks < STEPS_PER_STAGE; ++ks) {
            const u32 step = kt * STEPS_PER_STAGE + ks;
            if (step >= p.k_steps) break;
            u32 af[4][4], bf[2][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) ldmatrix_x4(af[i], stage + swizzled(a_row + i * 16, 2 * ks + a_half));
#pragma unroll
            for (int q = 0; q < 2; ++q)
                ldmatrix_x4(bf[q], stage + TILE_BYTES + swizzled(b_row + q * 16, 2 * ks + b_half));
            if (block_pos == 0) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        mma_s8_m16n8k32<false>(acc.dot[i][j], af[i], bf[j / 2][2 * (j % 2)], bf[j / 2][2 * (j % 2) + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        mma_s8_m16n8k32<true>(acc.dot[i][j], af[i], bf[j / 2][2 * (j % 2)], bf[j / 2][2 * (j % 2) + 1]);
            }
            ++block_pos;
            if (block_pos == p.block_steps || step + 1 == p.k_steps) {
                const u32 slot = ks * p.slots / STEPS_PER_STAGE;
                apply_block(acc, params + slot * SLOT_BYTES, params + (p.slots + slot) * SLOT_BYTES, wrow, wcol, lane,
                            p.small_dot != 0);
                block_pos = 0;
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Epilogue: + bias, round once to T, stage the tile in shared memory, then 16-byte row stores.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const u32 col = wcol + j * 8 + 2 * t;
        const float2 bias = load_bias_pair(p, n0 + col);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                stage_pair<T>(base, wrow + i * 16 + g + 8 * h, col, acc.out[i][j][2 * h] + bias.x,
                              acc.out[i][j][2 * h + 1] + bias.y);
    }
    __syncthreads();
    store_rows<TILE_M, W8A8_THREADS>(p, base, m0, n0, 0, tid);
}

// ------------------------------------------------------------------------------------------------------------------
// GEMM on Hopper: warp-specialised wgmma m64n128k32 s8 (sm_90a)
// ------------------------------------------------------------------------------------------------------------------
// The tiles, block formula and epilogue of `gemm`, fed the way the tensor cores want:
// - 384 threads: warpgroups 0 and 1 consume (64 rows x 128 columns each), warpgroup 2 produces (one thread issues
//   the TMA copies; setmaxnreg hands its registers to the consumers). No CTA-wide barrier in the main loop: each
//   stage has a "full" mbarrier (its TMA bytes landed) and an "empty" one (all 256 consumer threads are done).
// - A stage is 128 codes of K: the A tile (TMA over the codes [M, k_pad], 128-byte swizzle, rows past M read as
//   zeros), the W tile (TMA over [n_pad, k_pad]) and, when the stage ends a K block, the block's parameters: A's
//   128 float4 (TMA over the parameters viewed as [blocks * M] rows of 4 f32: rows past the end read as zeros;
//   rows past M belong to the next block and only reach output rows that are never stored) and W's record (one bulk
//   copy: the tf32 offset operand and the scales sB, see W_PARAM_BYTES). The TMA swizzle is the layout `swizzled`
//   describes, so the stage feeds wgmma descriptors directly.
// - Persistent: one CTA per SM walks the tiles blockIdx.x, + gridDim.x, ... in the grouped raster order; the
//   producer runs ahead into the next tile while the consumers finish this one's epilogue.
// - Blocks are >= 128 codes (or one per row), so each stage lies in one block. A block's first wgmma overwrites
//   the int32 accumulator (scale-d = 0); at its last stage the warpgroup waits for its wgmmas, adds (sA*sB)*dot on
//   the CUDA cores and issues the block's offset terms as one tf32 wgmma (issue_offset_terms). The two warpgroups
//   take turns on the tensor cores, so one corrects while the other multiplies.
//   (Two accumulators per warpgroup, to overlap within it, left too few registers: ptxas serialised the wgmmas
//   and the correction ran as one dependent chain.)
// - A stage is released one stage later, once the wgmmas that read it (the int8 ones, and at a block end the tf32
//   one, which reads W's record from the stage) have retired.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

#define HOPPER_THREADS 384
#define HOPPER_CONSUMERS 256
// A block's parameters in a stage: A's float4 per row (SLOT_BYTES), then W's tile record as the host prepares it
// (W8a8LinearCuda, Hopper layout): the 128 columns' tf32 offset operand (32 B each, 32-byte swizzle), then their
// scales sB. Padded so every stage starts 1024-byte aligned.
#define W_OFFSET_BYTES (TILE_N * 32)
#define W_PARAM_BYTES (W_OFFSET_BYTES + TILE_N * 4)
#define PARAM_BYTES 7168
#define HOPPER_STAGE_BYTES (2 * TILE_BYTES + PARAM_BYTES)
#define HOPPER_OUT_BYTES (TILE_M * OUT_PITCH)          // the staged output tile, 64 rows per warpgroup

// Walks the k tiles of an output tile in order and tells which end a K block: blocks span `per_block` k tiles, the
// last k tile always ends one (a partial last block). Counters, not a division per stage.
struct BlockWalk {
    u32 per_block, in_block = 0, block = 0;  // `block`: the index of the running block
    __device__ __forceinline__ explicit BlockWalk(const GemmParams& p)
        : per_block((p.block_steps + STEPS_PER_STAGE - 1) / STEPS_PER_STAGE) {}
    // Whether k tile `kt` (of `k_tiles`, taken in order) ends the running block.
    __device__ __forceinline__ bool ends(u32 kt, u32 k_tiles) const {
        return in_block + 1 == per_block || kt + 1 == k_tiles;
    }
    __device__ __forceinline__ void next(bool ended) {
        in_block = ended ? 0 : in_block + 1;
        block += ended;
    }
};

// out += (sA*sB)*dot for this warp's rows of the warpgroup tile (`row0`: the warp's first row in the CTA tile),
// `a_params`: the rows' float4, `scales`: the columns' sB. Returns the rows' params. The dots are converted with
// I2FP: on sm_90 it issues once and ran 10% faster than the two-instruction magic-number conversion (H200).
// CHANNEL (a per-channel weight): out += sA*dot, sB is the epilogue's; no scale loads, no FMUL.
template <bool CHANNEL>
__device__ __forceinline__ void apply_scaled_dots(float (&out)[64], const int (&dot)[64], u32 a_params, u32 scales,
                                                  u32 row0, int lane, float4 (&rows)[2]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) rows[h] = lds128f(a_params + (row0 + g + 8 * h) * 16);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const float2 sb = CHANNEL ? make_float2(1.0f, 1.0f) : lds64f(scales + (j * 8 + 2 * t) * 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = 4 * j + 2 * h + c;
                const float scale = CHANNEL ? rows[h].x : rows[h].x * (c ? sb.y : sb.x);
                out[e] = fmaf(scale, __int2float_rn(dot[e]), out[e]);
            }
        }
    }
}

// The block's offset terms, out += sA*oB*sumA + oA*ot, as one tf32 wgmma (the tensor cores are idle for it; the CUDA
// cores would spend two FFMA per element): A row m = (u_hi, oA_hi, u_lo, oA_lo, u_hi, oA_hi, 0, 0) with
// u = sA*sumA, B column n = (oB_hi, ot_hi, oB_hi, ot_hi, oB_lo, ot_lo, 0, 0) from the host, where x = x_hi + x_lo
// in tf32: hi*hi + lo*hi + hi*lo keeps near-f32 accuracy. A comes from registers: lane 4g + t holds k = t and
// t + 4 of its rows g and g + 8, which are the rows whose parameters it already has (`rows`), so the issue needs
// no shared-memory store, proxy fence or warpgroup barrier.
__device__ __forceinline__ void issue_offset_terms(float (&out)[64], const float4 (&rows)[2], u32 w_offset, int lane) {
    const int t = lane & 3;
    float a[4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float v = (t & 1) ? rows[h].y : rows[h].x * rows[h].z;  // k = t: oA for odd t, u for even
        const float hi = to_tf32(v), lo = to_tf32(v - hi);
        a[h] = t < 2 ? hi : lo;          // k = t:     u_hi, oA_hi, u_lo, oA_lo
        a[2 + h] = t < 2 ? hi : 0.0f;    // k = t + 4: u_hi, oA_hi, 0, 0
    }
    wgmma_fence();
    wgmma_tf32_m64n128k8(out, a, smem_desc_sw32(w_offset));
    wgmma_commit();
}

// The `_trace` kernel's timeline, for diagnosing the schedule (examples/w8a8_trace): CTA 0's first tile, per k tile
// (up to TRACE_K_TILES) and consumer warpgroup, the SM's clock64 as its first thread passes each event; the
// producer's row (`wg` 2) has the stage's empty wait done (STAGE_LANDED's slot), its copies issued (STAGE_TURN's)
// and the copies landed (STAGE_DONE's, from `observe_landings`).
enum StageTrace {
    STAGE_LANDED,     // the stage's data has landed (its full mbarrier)
    STAGE_TURN,       // its turn on the tensor cores (the named barrier passed)
    STAGE_ISSUED,     // its four int8 wgmmas issued and committed, the turn handed over
    STAGE_DONE,       // the wait returned: at a block end all its wgmmas have completed (one group in flight else)
    STAGE_CORRECTED,  // block end: the correction applied and the offset wgmma issued (else = STAGE_DONE)
    STAGE_EVENTS
};
#define TRACE_K_TILES 64
__device__ __forceinline__ void stage_stamp(const GemmParams& p, int wg, int tid, u32 tile, u32 kt, int event) {
    if (tile != 0 || kt >= TRACE_K_TILES || tid % 128 != 0) return;
    p.trace[(kt * 3 + wg) * STAGE_EVENTS + event] = clock64();
}

// The `_trace` kernels' observer, a second thread of the producer warpgroup: it waits on each stage's full barrier of
// CTA 0's first tile and stamps when the copies really landed (the producer row's STAGE_DONE slot). The consumers'
// STAGE_LANDED only says when they passed their wait, which is later whenever the data was there first.
template <int STAGES>
__device__ __forceinline__ void observe_landings(const GemmParams& p, u32 bars, u32 k_tiles) {
    if (blockIdx.x != 0) return;
    u32 buf = 0;
    for (u32 kt = 0; kt < k_tiles && kt < TRACE_K_TILES; ++kt) {
        mbar_wait(bars + buf * 8, (kt / STAGES) & 1);
        p.trace[(kt * 3 + 2) * STAGE_EVENTS + STAGE_DONE] = clock64();
        if (++buf == STAGES) buf = 0;
    }
}

// The producer thread: every k tile of every tile of this CTA, each into the next free stage.
template <int STAGES, bool TRACE, bool OFFSETS>
__device__ __forceinline__ void produce(const TensorMap* a_map, const TensorMap* w_map, const TensorMap* ap_map,
                                        const GemmParams& p, u32 base, u32 bars, u32 k_tiles, u32 tiles) {
    u32 buf = 0, use = 0;
    for (u32 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        u32 m0, n0;
        tile_origin(p, tile, m0, n0);
        BlockWalk walk(p);
        for (u32 kt = 0; kt < k_tiles; ++kt, ++use) {
            const u32 full = bars + buf * 8, empty = bars + (STAGES + buf) * 8;
            if (use >= STAGES) mbar_wait(empty, (use / STAGES - 1) & 1);
            if (TRACE) stage_stamp(p, 2, 0, tile, kt, STAGE_LANDED);
            const bool params = walk.ends(kt, k_tiles);
            const u32 block = walk.block;
            const u32 stage = base + buf * HOPPER_STAGE_BYTES;
            const u32 param_bytes = SLOT_BYTES + (OFFSETS ? W_PARAM_BYTES : 0);  // no W record without offset terms
            mbar_arrive_expect_tx(full, 2 * TILE_BYTES + (params ? param_bytes : 0));
            tma_load_2d(stage, a_map, kt * TILE_K, m0, full);
            tma_load_2d(stage + TILE_BYTES, w_map, kt * TILE_K, n0, full);
            if (params) {
                tma_load_2d(stage + 2 * TILE_BYTES, ap_map, 0, block * p.m + m0, full);
                if (OFFSETS) {
                    const char* w_params = reinterpret_cast<const char*>(p.w_params);
                    bulk_copy(stage + 2 * TILE_BYTES + SLOT_BYTES,
                              w_params + ((u64)block * p.tiles_n + n0 / TILE_N) * W_PARAM_BYTES, W_PARAM_BYTES, full);
                }
            }
            if (TRACE) stage_stamp(p, 2, 0, tile, kt, STAGE_TURN);
            walk.next(params);
            if (++buf == STAGES) buf = 0;
        }
    }
}

// A consumer warpgroup (`wg` 0 or 1, `tid` 0..255 over both): rows wg * 64 .. + 64 of every tile of this CTA.
// The two warpgroups take turns issuing their wgmmas (wg 0 first, named barriers 4 and 5), so the tensor cores run
// one warpgroup's block while the other applies its correction on the CUDA cores (ping-pong).
template <class T, int STAGES, bool CHANNEL, bool TRACE, bool OFFSETS>
__device__ __forceinline__ void consume(const GemmParams& p, u32 base, u32 bars, u32 k_tiles, u32 tiles, int wg,
                                        int tid) {
    const int lane = tid % 32, warp = tid / 32;
    const u32 wg_row = wg * 64, row0 = wg_row + (warp % 4) * 16;
    const u32 out_tile = base + STAGES * HOPPER_STAGE_BYTES;
    const int my_turn = 4 + wg, their_turn = 5 - wg;
    u32 buf = 0, use = 0;
    bool first_turn = true;
    for (u32 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        u32 m0, n0;
        tile_origin(p, tile, m0, n0);
        int dot[64];
        float out[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) dot[i] = 0, out[i] = 0.0f;
        bool block_start = true, held = false;  // held: the previous stage, its wgmmas maybe still running
        u32 held_buf = 0;
        BlockWalk walk(p);
        for (u32 kt = 0; kt < k_tiles; ++kt, ++use) {
            mbar_wait(bars + buf * 8, (use / STAGES) & 1);
            if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_LANDED);
            const u32 stage = base + buf * HOPPER_STAGE_BYTES;
            if (wg == 1 || !first_turn) named_barrier_sync(my_turn, HOPPER_CONSUMERS);
            first_turn = false;
            if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_TURN);
            wgmma_fence();
            // All four k steps: past K the codes are zero padding up to k_pad, on both sides.
            // A k step is 32 bytes further along the rows: + 2 in the descriptors' address field (addr >> 4).
            const u64 a_desc = smem_desc_sw128(stage + wg_row * TILE_K), b_desc = smem_desc_sw128(stage + TILE_BYTES);
#pragma unroll
            for (int ks = 0; ks < STEPS_PER_STAGE; ++ks)
                wgmma_s8_m64n128k32(dot, a_desc + 2 * ks, b_desc + 2 * ks, (block_start && ks == 0) ? 0 : 1);
            wgmma_commit();
            named_barrier_arrive(their_turn, HOPPER_CONSUMERS);
            if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_ISSUED);
            block_start = walk.ends(kt, k_tiles);
            walk.next(block_start);
            if (block_start) {
                wgmma_wait<0>();  // this block's dots, and the previous block's offset terms
                wgmma_fence_operands(dot);
                wgmma_fence_operands(out);
                if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_DONE);
                const u32 params = stage + 2 * TILE_BYTES, w_offset = params + SLOT_BYTES;
                float4 rows[2];
                apply_scaled_dots<CHANNEL>(out, dot, params, w_offset + W_OFFSET_BYTES, row0, lane, rows);
                if (OFFSETS) issue_offset_terms(out, rows, w_offset, lane);
                if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_CORRECTED);
            } else {  // the block goes on: keep one stage of wgmmas in flight
                wgmma_wait<1>();
                if (TRACE) stage_stamp(p, wg, tid, tile, kt, STAGE_DONE), stage_stamp(p, wg, tid, tile, kt, STAGE_CORRECTED);
            }
            // The previous stage's wgmmas have retired. (Released right after the wait instead, before the
            // correction, it measured the same: the stages' copies land ~2900 cycles after their issue either way,
            // examples/w8a8_trace and docs/notes/w8a8.md.)
            if (held) mbar_arrive(bars + (STAGES + held_buf) * 8);
            held = true;
            held_buf = buf;
            if (++buf == STAGES) buf = 0;
        }
        wgmma_wait<0>();  // the last block's offset terms
        wgmma_fence_operands(out);
        mbar_arrive(bars + (STAGES + held_buf) * 8);

        // Epilogue: (* sB for CHANNEL) + bias, round once to T, stage this warpgroup's 64 rows, 16-byte row stores.
        const int g = lane >> 2, t = lane & 3;
        named_barrier_sync(2 + wg, 128);  // this warpgroup's stores of the previous tile have read the staging
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u32 col = j * 8 + 2 * t;
            const float2 bias = load_bias_pair(p, n0 + col);
            const float2 sb = CHANNEL ? load_column_pair(p, p.channel_scales, n0 + col) : make_float2(1.0f, 1.0f);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float lo = out[4 * j + 2 * h], hi = out[4 * j + 2 * h + 1];
                stage_pair<T>(out_tile, row0 + g + 8 * h, col, CHANNEL ? fmaf(lo, sb.x, bias.x) : lo + bias.x,
                              CHANNEL ? fmaf(hi, sb.y, bias.y) : hi + bias.y);
            }
        }
        named_barrier_sync(2 + wg, 128);
        store_rows<64, 128>(p, out_tile, m0, n0, wg_row, tid % 128);
    }
    if (wg == 0 && !first_turn) named_barrier_sync(my_turn, HOPPER_CONSUMERS);  // wg 1's last hand-over
}

template <class T, int STAGES, bool CHANNEL, bool TRACE = false, bool OFFSETS = true>
__device__ __forceinline__ void gemm_hopper(const TensorMap* a_map, const TensorMap* w_map, const TensorMap* ap_map,
                                            const GemmParams& p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const u32 base = aligned_smem_base(smem);
    const u32 bars = base + STAGES * HOPPER_STAGE_BYTES + HOPPER_OUT_BYTES;
    const int tid = threadIdx.x, wg = tid / 128;
    const u32 k_tiles = (p.k_steps + STEPS_PER_STAGE - 1) / STEPS_PER_STAGE, tiles = p.tiles_m * p.tiles_n;
    if (tid == 0) init_pipeline_barriers(bars, STAGES, HOPPER_CONSUMERS);
    __syncthreads();
    if (wg == 2) {
        // The observer needs more than 24 registers (24 spilled); the trace kernels give the consumers 232.
        if (TRACE) setmaxnreg_dec<40>(); else setmaxnreg_dec<24>();
        if (tid == HOPPER_CONSUMERS) produce<STAGES, TRACE, OFFSETS>(a_map, w_map, ap_map, p, base, bars, k_tiles, tiles);
        if (TRACE && tid == HOPPER_CONSUMERS + 32) observe_landings<STAGES>(p, bars, k_tiles);
        return;
    }
    if (TRACE) setmaxnreg_inc<232>(); else setmaxnreg_inc<240>();
    consume<T, STAGES, CHANNEL, TRACE, OFFSETS>(p, base, bars, k_tiles, tiles, wg, tid);
}
#endif  // sm_90

// ------------------------------------------------------------------------------------------------------------------
// Instantiations
// ------------------------------------------------------------------------------------------------------------------

// One quantizer entry point: NAME runs the device function given after it (template arguments and all).
#define QUANTIZE_ENTRY(NAME, ...)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) NAME(const QuantizeParams p) { __VA_ARGS__(p); }
// `_r<N>`: a warp per block, N values per lane; `_loop`: a warp per block, two passes.
#define QUANTIZE_KERNELS(TNAME, T)                                                                  \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_r1, quantize_block<T, false, 1>)                    \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_r2, quantize_block<T, false, 2>)                    \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_r4, quantize_block<T, false, 4>)                    \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_r8, quantize_block<T, false, 8>)                    \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_loop, quantize_block<T, false, 0>)                  \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_r1, quantize_block<T, true, 1>)                      \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_r2, quantize_block<T, true, 2>)                      \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_r4, quantize_block<T, true, 4>)                      \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_r8, quantize_block<T, true, 8>)                      \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_loop, quantize_block<T, true, 0>)
// `_v<N>`: N values per lane, one vector load; `_v8g<G>`: groups of G lanes per block.
#define QUANTIZE_VEC_KERNELS(TNAME, T)                                                              \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v2, quantize_block_vec<T, false, 2>)                \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v4, quantize_block_vec<T, false, 4>)                \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v8, quantize_block_vec<T, false, 8>)                \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v2, quantize_block_vec<T, true, 2>)                  \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v4, quantize_block_vec<T, true, 4>)                  \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v8, quantize_block_vec<T, true, 8>)                  \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v8g4, quantize_block_vec<T, false, 8, 4>)           \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v8g8, quantize_block_vec<T, false, 8, 8>)           \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_v8g16, quantize_block_vec<T, false, 8, 16>)         \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v8g4, quantize_block_vec<T, true, 8, 4>)             \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v8g8, quantize_block_vec<T, true, 8, 8>)             \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_v8g16, quantize_block_vec<T, true, 8, 16>)
// `_cta`: a CTA per block, two passes, any block; `_cta<H>`: blocks of at most 2048 H values held in registers.
#define QUANTIZE_CTA_KERNELS(TNAME, T)                                                              \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_cta, quantize_block_cta<T, false, 0>)               \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_cta2, quantize_block_cta<T, false, 2>)              \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_cta4, quantize_block_cta<T, false, 4>)              \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_asym_cta8, quantize_block_cta<T, false, 8>)              \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_cta, quantize_block_cta<T, true, 0>)                 \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_cta2, quantize_block_cta<T, true, 2>)                \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_cta4, quantize_block_cta<T, true, 4>)                \
    QUANTIZE_ENTRY(w8a8_quantize_##TNAME##_sym_cta8, quantize_block_cta<T, true, 8>)
QUANTIZE_CTA_KERNELS(f16, __half)
QUANTIZE_CTA_KERNELS(bf16, __nv_bfloat16)
QUANTIZE_KERNELS(f16, __half)
QUANTIZE_KERNELS(bf16, __nv_bfloat16)
QUANTIZE_VEC_KERNELS(f16, __half)
QUANTIZE_VEC_KERNELS(bf16, __nv_bfloat16)

#define GEMM_KERNEL(NAME, T, STAGES)                                                                \
    extern "C" __global__ void __launch_bounds__(W8A8_THREADS, 1) NAME(const GemmParams p) {        \
        gemm<T, STAGES>(p);                                                                         \
    }
GEMM_KERNEL(w8a8_gemm_f16_s2, __half, 2)
GEMM_KERNEL(w8a8_gemm_f16_s3, __half, 3)
GEMM_KERNEL(w8a8_gemm_f16_s4, __half, 4)
GEMM_KERNEL(w8a8_gemm_bf16_s2, __nv_bfloat16, 2)
GEMM_KERNEL(w8a8_gemm_bf16_s3, __nv_bfloat16, 3)
GEMM_KERNEL(w8a8_gemm_bf16_s4, __nv_bfloat16, 4)

// The Hopper kernels exist on every architecture (one module for all) but only do work on sm_90a.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define WGMMA_BODY(T, STAGES, ...) gemm_hopper<T, STAGES, __VA_ARGS__>(&a_map, &w_map, &ap_map, p);
#else
#define WGMMA_BODY(T, STAGES, ...) __trap();
#endif
#define WGMMA_KERNEL(NAME, T, STAGES, ...)                                                            \
    extern "C" __global__ void __launch_bounds__(384, 1)                                              \
        NAME(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap w_map,        \
             const __grid_constant__ TensorMap ap_map, const GemmParams p) {                          \
        WGMMA_BODY(T, STAGES, __VA_ARGS__)                                                            \
    }
// Both types and depths of one kind; `_channel`: a per-channel weight, its scales applied once in the epilogue;
// `_channel_sym`: the same with symmetric activations and weight, so no offset terms (no tf32 wgmma, no W record).
#define WGMMA_KERNELS(PREFIX, CHANNEL, OFFSETS)                                                       \
    WGMMA_KERNEL(PREFIX##_f16_s3, __half, 3, CHANNEL, false, OFFSETS)                                 \
    WGMMA_KERNEL(PREFIX##_f16_s4, __half, 4, CHANNEL, false, OFFSETS)                                 \
    WGMMA_KERNEL(PREFIX##_bf16_s3, __nv_bfloat16, 3, CHANNEL, false, OFFSETS)                         \
    WGMMA_KERNEL(PREFIX##_bf16_s4, __nv_bfloat16, 4, CHANNEL, false, OFFSETS)
WGMMA_KERNELS(w8a8_wgmma, false, true)
WGMMA_KERNELS(w8a8_wgmma_channel, true, true)
WGMMA_KERNELS(w8a8_wgmma_channel_sym, true, false)
// `_trace`: the f16 kernels of 4 stages writing the per-stage timeline (StageTrace); diagnosis only.
WGMMA_KERNEL(w8a8_wgmma_trace_f16_s4, __half, 4, false, true)
WGMMA_KERNEL(w8a8_wgmma_channel_trace_f16_s4, __half, 4, true, true)
