// Dequantization of packed int4/int8 weights to fp16/bf16, output W^T as [K, N] row-major (what AutoAWQ's
// dequantize returns and what a GEMM computing x[M, K] . W^T consumes).
//
// One thread writes a tile of 8 consecutive output columns (one 16-byte store per row) over several rows, with all
// of its weight loads issued before the first conversion. No shared memory: every byte is loaded and stored once,
// with 16-byte stores coalesced across the warp. Exact: out = round((q - z) * s), see common.cuh.
// Stores are evict-first (st.global.cs): the output is 80% of the bytes and is never re-read by this kernel, so
// letting it linger in L2 only delays the weight reads; on an H200 this took the large AWQ shapes from 1.12x to
// 1.04x the time of a device-to-device copy of the same bytes.
//
// Kernels (extern "C", instantiated at the bottom; the host picks one per descriptor):
//   dequant_awq_<t>_<v>    AWQ GEMM layout:  qweight [K, N/8] (AWQ nibble order), qzeros [G', N/8], scales [G', N]
//   dequant_gptq_<t>_<v>   GPTQ (v2 zeros):  qweight [K/8, N] (packed along K), qzeros [G', N/8], scales [G', N]
//   dequant_ct_<t>[_vec]   compressed-tensors pack-quantized: weight_packed [N, K/8], zero_point [N/8, G'],
//                          weight_scale [N, G'] (codes stored as q + 8)
//   dequant_int8_<t>[_vec] int8 per channel: weight [N, K] (signed), scales [N]
// where <t> is f16 or bf16 (the dtype of scales and output), G' the number of groups, and <v> the variant:
// rR = one tile of R rows x 8 columns per thread, pR = persistent and pipelined. (A variant with 16-byte weight
// loads and 4 strided 16-byte stores per row ran 2.3x slower on an H200: stores must stay contiguous per warp.)
#include "common.cuh"

using namespace lowbit;

// Kernel parameters; mirrored by `DequantParams` in crates/lowbit/src/ops/dequantize/cuda.rs (same field order).
struct DequantParams {
    const u32* qweight;  // packed codes (int8 layout: bytes)
    const u32* zeros;    // packed zero codes, or null for symmetric (zero = 8)
    const void* scales;  // f16/bf16
    const int* g_idx;    // group of each input k, or null for k / group_size
    void* out;           // [K, N] f16/bf16
    u32 k, n;
    u32 group_size;
    u32 groups;          // G': rows of scales/zeros (columns for compressed-tensors)
    u32 group_shift;     // log2(group_size) when a power of two, else 0xFFFFFFFF (divide)
};

// No zero-point tensor: every code has zero 8 (symmetric int4, and compressed-tensors' +8 offset).
#define SYMMETRIC_ZERO_WORD 0x88888888u

__device__ __forceinline__ u32 group_of(const DequantParams& p, u32 k) {
    if (p.g_idx) return min((u32)__ldg(p.g_idx + k), p.groups - 1);  // clamp: device data cannot be trusted
    return p.group_shift != 0xFFFFFFFFu ? (k >> p.group_shift) : k / p.group_size;
}

// ------------------------------------------------------------------------------------------------------------------
// AWQ and GPTQ: scales/zeros are [G', N] rows, the thread tile is ROWS x 8 columns, lanes run along N.
// ------------------------------------------------------------------------------------------------------------------
// Tile t covers rows [ROWS * (t / (N/8)), +ROWS) and columns [8 * (t % (N/8)), +8): consecutive tiles are
// consecutive 8-column blocks of one row band, so a warp's loads and stores are contiguous.
template <int ROWS>
__device__ __forceinline__ void tile_origin(const DequantParams& p, u64 tile, u32& k0, u32& cw) {
    const u32 col_words = p.n / 8;
    cw = (u32)(tile % col_words);
    k0 = (u32)(tile / col_words) * ROWS;
}

// Issues every weight load of a tile: codes[r] = AWQ-ordered word of row k0 + r (0 past K).
template <bool GPTQ, int ROWS>
__device__ __forceinline__ void load_codes(const DequantParams& p, u32 k0, u32 cw, u32 (&codes)[ROWS]) {
    if (!GPTQ) {
        const u32 col_words = p.n / 8;
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
            codes[r] = (k0 + r < p.k) ? load_stream(p.qweight + (u64)(k0 + r) * col_words + cw) : 0u;
    } else {
        // qweight [K/8, N]: word (kw, n) holds rows 8kw..8kw+7 of column n. 8 columns x 8 rows = 32 bytes.
#pragma unroll
        for (int c = 0; c < ROWS / 8; ++c) {
            u32 col[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (k0 + 8 * c < p.k) {
                const u32* src = p.qweight + (u64)(k0 / 8 + c) * p.n + 8 * cw;
                const uint4 a = load_stream_v4(src), b = load_stream_v4(src + 4);
                col[0] = a.x; col[1] = a.y; col[2] = a.z; col[3] = a.w;
                col[4] = b.x; col[5] = b.y; col[6] = b.z; col[7] = b.w;
            }
            transpose_int4_8x8_to_awq(col, codes + 8 * c);
        }
    }
}

// Converts and stores a tile row by row, reloading zeros/scales only when the group changes.
template <class Conv, bool GPTQ, int ROWS>
__device__ __forceinline__ void store_tile(const DequantParams& p, u32 k0, u32 cw, const u32 (&codes)[ROWS]) {
    const u32 col_words = p.n / 8;
    const uint4* scales = reinterpret_cast<const uint4*>(p.scales);
    typename Conv::scalar* out = reinterpret_cast<typename Conv::scalar*>(p.out);
    u32 cur_group = 0xFFFFFFFFu;
    uint4 zt = make_uint4(0, 0, 0, 0), s = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const u32 k = k0 + r;
        if (k >= p.k) break;
        const u32 g = group_of(p, k);
        if (g != cur_group) {
            cur_group = g;
            u32 z = SYMMETRIC_ZERO_WORD;
            if (p.zeros) {
                z = load_cached(p.zeros + (u64)g * col_words + cw);
                if (GPTQ) z = natural_to_awq_order(z);
            }
            zt = Conv::zero_terms(z);
            s = load_cached_v4(scales + (u64)g * col_words + cw);
        }
        store_stream_v4(out + (u64)k * p.n + 8 * cw, Conv::dequant_int4(codes[r], zt, s));
    }
}

// AWQ and GPTQ (scales/zeros are [G', N] rows): one ROWS x 8 tile per thread.
template <class Conv, bool GPTQ, int ROWS>
__device__ __forceinline__ void dequant_rows(const DequantParams& p) {
    const u64 tile = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 k0, cw;
    tile_origin<ROWS>(p, tile, k0, cw);
    if (tile >= (u64)((p.k + ROWS - 1) / ROWS) * (p.n / 8)) return;
    u32 codes[ROWS];
    load_codes<GPTQ, ROWS>(p, k0, cw, codes);
    store_tile<Conv, GPTQ, ROWS>(p, k0, cw, codes);
}

// The same, persistent: a grid sized to the resident threads strides over the tiles, and each thread issues the
// loads of its next tile before converting and storing the current one, so reads stay in flight while it writes.
template <class Conv, bool GPTQ, int ROWS>
__device__ __forceinline__ void dequant_rows_pipelined(const DequantParams& p) {
    const u64 tiles = (u64)((p.k + ROWS - 1) / ROWS) * (p.n / 8);
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 tile = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (tile >= tiles) return;
    u32 k0, cw;
    tile_origin<ROWS>(p, tile, k0, cw);
    u32 next[ROWS];
    load_codes<GPTQ, ROWS>(p, k0, cw, next);
    while (true) {
        u32 codes[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) codes[r] = next[r];
        const u32 cur_k0 = k0, cur_cw = cw;
        tile += stride;
        const bool more = tile < tiles;
        if (more) {
            tile_origin<ROWS>(p, tile, k0, cw);
            load_codes<GPTQ, ROWS>(p, k0, cw, next);
        }
        store_tile<Conv, GPTQ, ROWS>(p, cur_k0, cur_cw, codes);
        if (!more) break;
    }
}

// ------------------------------------------------------------------------------------------------------------------
// compressed-tensors int4 and int8 per channel: the weight is [N, K] (packed along K), so the kernel transposes.
// Thread tile: 8 columns (8 weight rows) x KT rows, one 16-byte load per weight row (KT = 32 int4 or 16 int8).
// A warp is 4 tiles along K x 8 tiles along N, so each load instruction reads 64 contiguous bytes of 8 weight rows
// and each store instruction writes 128 contiguous bytes of 4 output rows.
// ------------------------------------------------------------------------------------------------------------------
template <class Conv, int BITS, bool VEC>
__device__ __forceinline__ void dequant_transposed(const DequantParams& p) {
    constexpr int KT = 128 / BITS;           // output rows per thread
    constexpr int CODES_PER_WORD = 32 / BITS;
    const u32 col_blocks = p.n / 8;
    const u32 warp_cols = (col_blocks + 7) / 8;  // warps across N
    const u32 lane = threadIdx.x % 32;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const u32 cb = (u32)(warp % warp_cols) * 8 + lane % 8;
    const u64 kb = (warp / warp_cols) * 4 + lane / 8;
    if (cb >= col_blocks || kb * KT >= p.k) return;
    const u32 n0 = cb * 8, k0 = (u32)(kb * KT);
    const u32 row_words = p.k / CODES_PER_WORD;  // words per weight row

    // 1. Load 4 words (KT codes) of each of the 8 weight rows.
    u32 raw[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const u32* src = p.qweight + (u64)(n0 + j) * row_words + k0 / CODES_PER_WORD;
        if (VEC && k0 + KT <= p.k) {
            const uint4 v = load_stream_v4(src);
            raw[j][0] = v.x; raw[j][1] = v.y; raw[j][2] = v.z; raw[j][3] = v.w;
        } else {
#pragma unroll
            for (int w = 0; w < 4; ++w)
                raw[j][w] = (k0 + w * CODES_PER_WORD < p.k) ? load_stream(src + w) : 0u;
        }
    }

    // 2. Per-channel scales (int8) are loaded once; grouped ones (int4) when the group changes.
    typename Conv::scalar* out = reinterpret_cast<typename Conv::scalar*>(p.out);
    const unsigned short* scales = reinterpret_cast<const unsigned short*>(p.scales);
    u32 cur_group = 0xFFFFFFFFu;
    uint4 zt = make_uint4(0, 0, 0, 0), s = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        // Transpose word w of the 8 weight rows into CODES_PER_WORD output rows of 8 columns.
        u32 rows_lo[8], rows_hi[4];
        if (BITS == 4) {
            const u32 col[8] = {raw[0][w], raw[1][w], raw[2][w], raw[3][w], raw[4][w], raw[5][w], raw[6][w], raw[7][w]};
            transpose_int4_8x8_to_awq(col, rows_lo);
        } else {
            const u32 c03[4] = {raw[0][w], raw[1][w], raw[2][w], raw[3][w]};
            const u32 c47[4] = {raw[4][w], raw[5][w], raw[6][w], raw[7][w]};
            transpose_bytes_4x4(c03, rows_lo);  // columns 0..3 of rows 0..3
            transpose_bytes_4x4(c47, rows_hi);  // columns 4..7
        }
#pragma unroll
        for (int r = 0; r < CODES_PER_WORD; ++r) {
            const u32 k = k0 + w * CODES_PER_WORD + r;
            if (k >= p.k) break;
            const u32 g = group_of(p, k);
            if (g != cur_group) {
                cur_group = g;
                // weight_scale [N, G']: the 8 columns' scales are a column of the table (8 small loads).
                u32 sv[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) sv[j] = __ldg(scales + (u64)(n0 + j) * p.groups + g);
                s = make_uint4(sv[0] | sv[1] << 16, sv[2] | sv[3] << 16, sv[4] | sv[5] << 16, sv[6] | sv[7] << 16);
                if (BITS == 4) {
                    // weight_zero_point [N/8, G'] packed along N, natural order, stored as zp + 8.
                    const u32 z = p.zeros ? natural_to_awq_order(load_cached(p.zeros + (u64)cb * p.groups + g))
                                          : SYMMETRIC_ZERO_WORD;
                    zt = Conv::zero_terms(z);
                }
            }
            const uint4 v = (BITS == 4) ? Conv::dequant_int4(rows_lo[r], zt, s)
                                        : Conv::dequant_int8(rows_lo[r % 4], rows_hi[r % 4], s);
            store_stream_v4(out + (u64)k * p.n + n0, v);
        }
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Instantiations. Block size 256 everywhere (the host launches with DEQUANT_BLOCK threads).
// ------------------------------------------------------------------------------------------------------------------
#define DEQUANT_BLOCK 256

#define ROWS_KERNEL(NAME, CONV, GPTQ, ROWS)                                                         \
    extern "C" __global__ void __launch_bounds__(DEQUANT_BLOCK) NAME(const DequantParams p) {       \
        dequant_rows<CONV, GPTQ, ROWS>(p);                                                          \
    }
#define PIPELINED_KERNEL(NAME, CONV, GPTQ, ROWS)                                                    \
    extern "C" __global__ void __launch_bounds__(DEQUANT_BLOCK) NAME(const DequantParams p) {       \
        dequant_rows_pipelined<CONV, GPTQ, ROWS>(p);                                                \
    }
#define TRANSPOSED_KERNEL(NAME, CONV, BITS, VEC)                                                    \
    extern "C" __global__ void __launch_bounds__(DEQUANT_BLOCK) NAME(const DequantParams p) {       \
        dequant_transposed<CONV, BITS, VEC>(p);                                                     \
    }

ROWS_KERNEL(dequant_awq_f16_r2, F16, false, 2)
ROWS_KERNEL(dequant_awq_f16_r4, F16, false, 4)
ROWS_KERNEL(dequant_awq_f16_r8, F16, false, 8)
ROWS_KERNEL(dequant_awq_bf16_r2, BF16, false, 2)
ROWS_KERNEL(dequant_awq_bf16_r4, BF16, false, 4)
ROWS_KERNEL(dequant_awq_bf16_r8, BF16, false, 8)
ROWS_KERNEL(dequant_gptq_f16_r8, F16, true, 8)
ROWS_KERNEL(dequant_gptq_bf16_r8, BF16, true, 8)
PIPELINED_KERNEL(dequant_awq_f16_p8, F16, false, 8)
PIPELINED_KERNEL(dequant_awq_bf16_p8, BF16, false, 8)
PIPELINED_KERNEL(dequant_gptq_f16_p8, F16, true, 8)
PIPELINED_KERNEL(dequant_gptq_bf16_p8, BF16, true, 8)
TRANSPOSED_KERNEL(dequant_ct_f16, F16, 4, false)
TRANSPOSED_KERNEL(dequant_ct_f16_vec, F16, 4, true)
TRANSPOSED_KERNEL(dequant_ct_bf16, BF16, 4, false)
TRANSPOSED_KERNEL(dequant_ct_bf16_vec, BF16, 4, true)
TRANSPOSED_KERNEL(dequant_int8_f16, F16, 8, false)
TRANSPOSED_KERNEL(dequant_int8_f16_vec, F16, 8, true)
TRANSPOSED_KERNEL(dequant_int8_bf16, BF16, 8, false)
TRANSPOSED_KERNEL(dequant_int8_bf16_vec, BF16, 8, true)
