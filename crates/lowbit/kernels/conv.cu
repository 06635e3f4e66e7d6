// 2-D convolution with MNN-style per-block int4/int8 weights (offset form w = q * scale + offset, seed 004),
// NCHW fp16/fp32 activations and output, fp32 accumulation. Host side: src/ops/conv/cuda.rs.
//
// Kernels (extern "C", instantiated at the bottom):
//   conv_pack_nhwc_{f16,f32}   NCHW x -> (zero-padded) NHWC fp16 copy in the workspace (32x32 smem transpose; fp32 is rounded
//                              to fp16 here, once)
//   conv_igemm_w{4,8}_{l,t,m,s}  the implicit-GEMM tensor-core convolution on that copy, tile l = 128x128,
//                              t = 128x64, m = 64x128, s = 64x64 (output channels x output pixels)
//   conv_direct_{f16,f32}      one thread per output, fp32 FMA, reading NCHW x and the int8 codes directly: the path
//                              for channel counts the GEMM cannot tile (Ci/groups not a multiple of 32, blocks not
//                              a multiple of 16 channels), depthwise included
//
// THE GEMM. Per group, out[co, n] = sum_k W[co, k] * X[k, n] with n = (b, oy, ox) over the whole batch and
// k = (chunk of 32 input channels, tap (ky, kx), channel in chunk): chunk-major, so the 9 taps of a 3x3 kernel
// read shifted copies of the same pixels one after another (L1 hits for the cp.async.ca of the activations) and
// a chunk's weights share their block parameters. One K tile = one chunk at one tap = 32 k.
// * Activations (mma B operand) come from the NHWC copy: a pixel's 32 channels at one tap are 64 contiguous bytes,
//   four 16-byte cp.async (zero-filled where the tap falls in the padding), stored [pixel][64 B] with the 16-byte
//   chunks XOR-swizzled by (pixel >> 1) & 3 so that ldmatrix.x4 reads 8 pixels without bank conflicts.
// * Weights (mma A operand) are repacked once on the host into PANELS: 64 output channels x one K tile, holding
//   the codes in mma fragment order (a lane's four m16 tiles of one k16 step in 16 contiguous bytes for int4,
//   2 x 16 for int8) followed by the block parameters {scale, offset} as fp16 pairs of the 8 rows a lane group
//   owns. Codes are stored biased (int4 q + 8, int8 q + 128) so the magic-number conversion (common.cuh) needs
//   no xor: int4 low nibbles 0x6400 | u = 1024 + u, minus 1032 = q; high nibbles (1024 + 16u) / 16 - 72 = q;
//   int8 prmt next to 0x64, minus 1152 = q. All exact. Then w = fma(q, scale, offset): one fp16 rounding.
//   Dequantization happens in registers right before the mma; no dequantized weight exists in memory.
// * Range: scale and offset are multiplied on the host by 2^e per output channel (e chosen so that every
//   |q * scale + offset| of the row is at most 2^14), which keeps them normal fp16 whatever the weight's
//   magnitude; the epilogue multiplies the fp32 sum by 2^-e (exact), then adds the fp32 bias and clamps.
// * Pipeline: STAGES-deep cp.async ring, one __syncthreads per K tile. Warp tile 64 x WN (4 x WN/8 mma per k16
//   step; the weight conversion, ~14 ALU ops per m16 tile, is amortised over WN/8 mmas).
// * Epilogue: fragments straight to NCHW: a lane stores two adjacent pixels (4 or 8 bytes) when OH*OW is even,
//   one element at a time otherwise.
#include "common.cuh"

namespace lowbit {
namespace conv {

constexpr int WM = 64;                  // output channels per warp (= per panel): four m16 tiles
constexpr int KC = 32;                  // k per K tile: 32 channels of one tap
constexpr int K16 = KC / 16;            // k16 mma steps per K tile
constexpr int PARAM_BYTES = K16 * WM * 4;  // fp16 {scale, offset} per (k16 step, row)
constexpr int B_ROW_BYTES = KC * 2;     // one pixel's 32 fp16 channels

template <int BITS>
struct Panel {
    static constexpr int CODE_BYTES = WM * KC * BITS / 8;  // 1024 (int4) / 2048 (int8)
    static constexpr int BYTES = CODE_BYTES + PARAM_BYTES;  // 1536 / 2560
};

// The geometry and clamp both kernels take, first in their arguments. Mirrored by `ConvShape`, `IgemmArgs` and
// `DirectArgs` in src/ops/conv/cuda.rs (same field order; the pointers after the shape start 8-byte aligned).
struct ConvShape {
    int batch, ci, h, w;
    int co, oh, ow;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int cg, co_g;                 // input / output channels per group
    float lo, hi;                 // activation clamp
};

struct IgemmArgs : ConvShape {
    const unsigned char* weight;  // panels [groups][m_panels][k_tiles][Panel::BYTES]
    const float* row_scale;       // [Co]: 2^-e, undoes the fp16 range scaling of the row
    const float* bias;            // [Co] (zeros when the layer has none)
    const __half* x;              // NHWC [B, H, W, Ci] fp16
    void* out;                    // NCHW [B, Co, OH, OW], fp16 or fp32
    int m_panels;                 // panels per group: ceil(co_g / 64)
    int k_tiles;                  // (cg / 32) * kh * kw
    int n_total;                  // B * OH * OW
    int out_f32;                  // 1: fp32 output, 0: fp16
    int pair_store;               // 1: OH * OW even and out 8-byte aligned: store pixel pairs
};

// 16-byte global -> shared copies by shared-space address; src_bytes < 16 zero-fills the rest without reading it.
// .ca (through L1) for the activations: the taps of one chunk re-read neighbouring pixels. .cg for the weights.
__device__ __forceinline__ void cp_async16_ca(u32 smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16_cg(u32 smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}

// D += A * B, m16n8k16, fp16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_f16_f32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr u32 INT4_BIAS = 0x64086408u;     // {1032, 1032} = 1024 + 8
constexpr u32 NEG_INT4_HI = 0xD480D480u;   // {-72, -72} = -(64 + 8)

// {s, o} (fp16 pair) -> {s, s} and {o, o}.
__device__ __forceinline__ void split_param(u32 p, u32& s2, u32& o2) {
    s2 = prmt(p, p, 0x1010);
    o2 = prmt(p, p, 0x3232);
}

// The A fragment of one m16 tile from its codes: rows g (registers 0, 2) and g + 8 (1, 3) get their own
// {scale, offset}. int4: one word, nibble pairs (0,4) (1,5) (2,6) (3,7) = registers 0..3.
__device__ __forceinline__ void dequant_a_int4(u32 w, u32 pg, u32 ph, u32 (&a)[4]) {
    u32 sg, og, sh, oh;
    split_param(pg, sg, og);
    split_param(ph, sh, oh);
    const u32 w8 = w >> 8;
    a[0] = F16::fma(F16::sub(and_or<0x000F000Fu, F16::MAGIC>(w), INT4_BIAS), sg, og);
    a[1] = F16::fma(F16::fma(and_or<0x00F000F0u, F16::MAGIC>(w), F16::ONE_SIXTEENTH, NEG_INT4_HI), sh, oh);
    a[2] = F16::fma(F16::sub(and_or<0x000F000Fu, F16::MAGIC>(w8), INT4_BIAS), sg, og);
    a[3] = F16::fma(F16::fma(and_or<0x00F000F0u, F16::MAGIC>(w8), F16::ONE_SIXTEENTH, NEG_INT4_HI), sh, oh);
}

// int8: `lo` holds bytes (g, k) (g, k+1) (g+8, k) (g+8, k+1), `hi` the same at k + 8; each byte is q + 128.
__device__ __forceinline__ void dequant_a_int8(u32 lo, u32 hi, u32 pg, u32 ph, u32 (&a)[4]) {
    u32 sg, og, sh, oh;
    split_param(pg, sg, og);
    split_param(ph, sh, oh);
    a[0] = F16::fma(F16::sub(prmt(lo, F16::MAGIC, 0x5150), F16::INT8_BIAS), sg, og);
    a[1] = F16::fma(F16::sub(prmt(lo, F16::MAGIC, 0x5352), F16::INT8_BIAS), sh, oh);
    a[2] = F16::fma(F16::sub(prmt(hi, F16::MAGIC, 0x5150), F16::INT8_BIAS), sg, og);
    a[3] = F16::fma(F16::sub(prmt(hi, F16::MAGIC, 0x5352), F16::INT8_BIAS), sh, oh);
}


template <int BITS, int WARPS_M, int WARPS_N, int WN, int STAGES>
struct Igemm {
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int BM = WM * WARPS_M;
    static constexpr int BN = WN * WARPS_N;
    static constexpr int NT = WN / 8;  // n8 tiles per warp
    static constexpr int PIXELS_PER_THREAD = BN / THREADS;
    static constexpr int CODE_BYTES = Panel<BITS>::CODE_BYTES;
    static constexpr int PANEL = Panel<BITS>::BYTES;
    static constexpr int A_BYTES = WARPS_M * PANEL;
    static constexpr int STAGE_BYTES = A_BYTES + BN * B_ROW_BYTES;
    static_assert(BN % THREADS == 0, "every thread copies whole pixels");
    static_assert(WN % 16 == 0, "ldmatrix.x4 loads two n8 tiles");
    static_assert(PANEL % 16 == 0 && A_BYTES % 128 == 0, "16-byte copies, aligned B region");

    // This thread's pixels: the image offset (-1 past the last pixel) and the input position of tap (0, 0);
    // and the K tile the next load_stage copies, as (chunk, ky, kx).
    struct Loader {
        long long base[PIXELS_PER_THREAD];
        int iy0[PIXELS_PER_THREAD], ix0[PIXELS_PER_THREAD];
        int chunk, ky, kx;
    };

    __device__ static __forceinline__ void init_loader(const IgemmArgs& p, int group, int n0, Loader& ld) {
        const int ohw = p.oh * p.ow;
#pragma unroll
        for (int j = 0; j < PIXELS_PER_THREAD; ++j) {
            const int n = n0 + (int)threadIdx.x + j * THREADS;
            ld.base[j] = -1;
            ld.iy0[j] = ld.ix0[j] = 0;
            if (n < p.n_total) {
                const int b = n / ohw, r = n - b * ohw;
                const int oy = r / p.ow, ox = r - oy * p.ow;
                ld.base[j] = (long long)b * p.h * p.w * p.ci + (long long)group * p.cg;
                ld.iy0[j] = oy * p.sh - p.ph;
                ld.ix0[j] = ox * p.sw - p.pw;
            }
        }
        ld.chunk = ld.ky = ld.kx = 0;
    }

    // Issues the copies of K tile `kt` (the loader's next one) into the stage at shared address `stage`, then
    // advances the loader to the next tap (taps inner, chunks outer: the packing order of the panels).
    __device__ static __forceinline__ void load_stage(const IgemmArgs& p, int group, int m_tile, int kt, u32 stage,
                                                      Loader& ld) {
        // Weights: WARPS_M panels; a panel past the group's last one (a partial CTA tile) is zero-filled.
        constexpr int CHUNKS = PANEL / 16;
        for (int i = threadIdx.x; i < WARPS_M * CHUNKS; i += THREADS) {
            const int pm = i / CHUNKS, c = i - pm * CHUNKS;
            const int panel = m_tile * WARPS_M + pm;
            const bool ok = panel < p.m_panels;
            const unsigned char* src =
                p.weight + (((size_t)group * p.m_panels + (ok ? panel : 0)) * p.k_tiles + kt) * PANEL + c * 16;
            cp_async16_cg(stage + pm * PANEL + c * 16, src, ok ? 16 : 0);
        }
        // Activations: each thread copies whole 64-byte pixel rows, zero where the tap falls in the padding.
#pragma unroll
        for (int j = 0; j < PIXELS_PER_THREAD; ++j) {
            const int row = threadIdx.x + j * THREADS;
            const int iy = ld.iy0[j] + ld.ky * p.dh, ix = ld.ix0[j] + ld.kx * p.dw;
            const bool ok = ld.base[j] >= 0 && (unsigned)iy < (unsigned)p.h && (unsigned)ix < (unsigned)p.w;
            const __half* src = ok ? p.x + ld.base[j] + ((long long)iy * p.w + ix) * p.ci + ld.chunk * KC : p.x;
            const u32 dst = stage + A_BYTES + row * B_ROW_BYTES;
            const int swizzle = (row >> 1) & 3;
#pragma unroll
            for (int c = 0; c < 4; ++c) cp_async16_ca(dst + ((c ^ swizzle) << 4), src + c * 8, ok ? 16 : 0);
        }
        if (++ld.kx == p.kw) {
            ld.kx = 0;
            if (++ld.ky == p.kh) {
                ld.ky = 0;
                ++ld.chunk;
            }
        }
    }

    // The mmas of one K tile: per k16 step, the lane's 8 block parameters and 4 m16 tiles of codes (ld.shared.v4,
    // conflict-free), converted to A fragments in registers, then WN/8 B fragments by ldmatrix.x4.
    __device__ static __forceinline__ void compute_stage(u32 stage, int warp_m, int warp_n, int lane,
                                                         float (&acc)[4][NT][4]) {
        const u32 a_base = stage + warp_m * PANEL;
        const u32 b_base = stage + A_BYTES;
        const int g = lane >> 2;
#pragma unroll
        for (int ks = 0; ks < K16; ++ks) {
            // {scale, offset} of rows 16j + 8h + g at index 2j + h.
            const uint4 p0 = lds128(a_base + CODE_BYTES + ks * (WM * 4) + g * 32);
            const uint4 p1 = lds128(a_base + CODE_BYTES + ks * (WM * 4) + g * 32 + 16);
            const u32 prm[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
            u32 a[4][4];
            if (BITS == 4) {
                const uint4 v = lds128(a_base + ks * 512 + lane * 16);
                dequant_a_int4(v.x, prm[0], prm[1], a[0]);
                dequant_a_int4(v.y, prm[2], prm[3], a[1]);
                dequant_a_int4(v.z, prm[4], prm[5], a[2]);
                dequant_a_int4(v.w, prm[6], prm[7], a[3]);
            } else {
                const uint4 v0 = lds128(a_base + ks * 1024 + lane * 16);
                const uint4 v1 = lds128(a_base + ks * 1024 + 512 + lane * 16);
                dequant_a_int8(v0.x, v0.y, prm[0], prm[1], a[0]);
                dequant_a_int8(v0.z, v0.w, prm[2], prm[3], a[1]);
                dequant_a_int8(v1.x, v1.y, prm[4], prm[5], a[2]);
                dequant_a_int8(v1.z, v1.w, prm[6], prm[7], a[3]);
            }
#pragma unroll
            for (int q = 0; q < NT / 2; ++q) {
                // Matrices: (pixels +0..7, k 0-7), (+0..7, k 8-15), (+8..15, k 0-7), (+8..15, k 8-15).
                const int n = warp_n * WN + q * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int chunk = ks * 2 + ((lane >> 3) & 1);
                u32 b[4];
                ldmatrix_x4(b, b_base + n * B_ROW_BYTES + ((chunk ^ ((n >> 1) & 3)) << 4));
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    mma_f16_f32(acc[j][2 * q], a[j], b[0], b[1]);
                    mma_f16_f32(acc[j][2 * q + 1], a[j], b[2], b[3]);
                }
            }
        }
    }

    __device__ static __forceinline__ float clamp(float v, float lo, float hi) {
        // Written out (not fminf/fmaxf) so that a NaN passes through, as in the reference.
        return v < lo ? lo : (v > hi ? hi : v);
    }

    // acc * 2^-e + bias, clamped, to NCHW. Lane (g, t) holds rows 16j + g (+8) x pixels nt * 8 + 2t (+1).
    __device__ static __forceinline__ void epilogue(const IgemmArgs& p, int group, int m_tile, int n0, int warp_m,
                                                    int warp_n, int lane, const float (&acc)[4][NT][4]) {
        const int g = lane >> 2, t = lane & 3;
        const long long ohw = (long long)p.oh * p.ow;
        long long pixel_off[NT];  // offset of (b, co = 0, pixel) in out, -1 past the end
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int n = n0 + warp_n * WN + nt * 8 + 2 * t;
            const long long b = n / ohw;
            pixel_off[nt] = n < p.n_total ? b * p.co * ohw + (n - b * ohw) : -1;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = m_tile * BM + warp_m * WM + 16 * j + 8 * h + g;
                if (row >= p.co_g) continue;
                const int co = group * p.co_g + row;
                const float rs = p.row_scale[co], bias = p.bias[co];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (pixel_off[nt] < 0) continue;
                    const float v0 = clamp(fmaf(acc[j][nt][2 * h], rs, bias), p.lo, p.hi);
                    const float v1 = clamp(fmaf(acc[j][nt][2 * h + 1], rs, bias), p.lo, p.hi);
                    const long long off = pixel_off[nt] + co * ohw;
                    if (p.pair_store) {
                        // OH*OW even: pixels 2t, 2t+1 are in the same image, adjacent and pair-aligned.
                        if (p.out_f32) {
                            *reinterpret_cast<float2*>(static_cast<float*>(p.out) + off) = make_float2(v0, v1);
                        } else {
                            *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + off) = __floats2half2_rn(v0, v1);
                        }
                    } else {
                        // The second pixel may be past the end or in the next image.
                        const int n1 = n0 + warp_n * WN + nt * 8 + 2 * t + 1;
                        const long long b1 = n1 / ohw;
                        const long long off1 = b1 * p.co * ohw + (n1 - b1 * ohw) + co * ohw;
                        if (p.out_f32) {
                            static_cast<float*>(p.out)[off] = v0;
                            if (n1 < p.n_total) static_cast<float*>(p.out)[off1] = v1;
                        } else {
                            static_cast<__half*>(p.out)[off] = __float2half_rn(v0);
                            if (n1 < p.n_total) static_cast<__half*>(p.out)[off1] = __float2half_rn(v1);
                        }
                    }
                }
            }
        }
    }

    __device__ static __forceinline__ void run(const IgemmArgs& p) {
        extern __shared__ __align__(128) unsigned char smem[];
        const u32 smem0 = smem_addr(smem);
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
        const int n0 = blockIdx.x * BN, m_tile = blockIdx.y, group = blockIdx.z;
        Loader ld;
        init_loader(p, group, n0, ld);
        float acc[4][NT][4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) acc[j][nt][0] = acc[j][nt][1] = acc[j][nt][2] = acc[j][nt][3] = 0.0f;

#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < p.k_tiles) load_stage(p, group, m_tile, s, smem0 + s * STAGE_BYTES, ld);
            cp_async_commit();
        }
        for (int kt = 0; kt < p.k_tiles; ++kt) {
            cp_async_wait<STAGES - 2>();
            // Stage kt is visible to all, and every warp is done with stage kt - 1, which the next load reuses.
            __syncthreads();
            const int next = kt + STAGES - 1;
            if (next < p.k_tiles) load_stage(p, group, m_tile, next, smem0 + (next % STAGES) * STAGE_BYTES, ld);
            cp_async_commit();
            compute_stage(smem0 + (kt % STAGES) * STAGE_BYTES, warp_m, warp_n, lane, acc);
        }
        cp_async_wait<0>();
        epilogue(p, group, m_tile, n0, warp_m, warp_n, lane, acc);
    }
};

// ------------------------------------------------------------------------------------------------------------------
// NCHW -> NHWC fp16 (the GEMM's activation layout). With padding (ph, pw) the output is the zero-padded image
// [B][H + 2ph][W + 2pw][C] that the Hopper GEMM path reads (its padding bands are written as zeros here, so the
// workspace needs no clearing). A CTA transposes 64 consecutive positions of one padded image x 64 channels through
// shared memory: each thread locates its position once and issues its 16 channel loads before storing any (memory
// parallelism is what a transpose lacks), then a warp per position writes its 64 channels as half2 pairs: one whole
// 128-byte line, where 32 channels left each line's halves to two CTAs (that version ran far below copy speed).
// Grid (ceil((H + 2ph)(W + 2pw) / 64), ceil(C / 64), B), block 256.
// ------------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(signed char v) { return (float)v; }

// Channels cc, cc + 1 of one position (`both`: cc + 1 < C; `paired`: C even, so the pair is one aligned half2).
__device__ __forceinline__ void store_channels(__half* dst, float a, float b, bool both, bool paired) {
    if (both && paired) {
        *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
    } else {
        dst[0] = __float2half_rn(a);
        if (both) dst[1] = __float2half_rn(b);
    }
}
__device__ __forceinline__ void store_channels(signed char* dst, float a, float b, bool both, bool) {
    dst[0] = (signed char)a;
    if (both) dst[1] = (signed char)b;
}

// The padding holds `pad` (0 for fp16; the int8 convolution's zero point Z_I, the code of a real 0).
template <class T, class TOut>
__device__ __forceinline__ void pack_nhwc(const T* x, TOut* xt, int c, int h, int w, int ph, int pw, float pad) {
    __shared__ float tile[64][65];  // [channel][position]; pitch 65: both passes are free of bank conflicts
    const int tid = threadIdx.x, wp = w + 2 * pw, grid = (h + 2 * ph) * wp;
    const int p0 = blockIdx.x * 64, c0 = blockIdx.y * 64;
    const long long b = blockIdx.z;
    {
        const int p = p0 + (tid & 63), y = p / wp - ph, xx = p % wp - pw;
        const bool inside = p < grid && y >= 0 && y < h && xx >= 0 && xx < w;
        const T* src = x + ((b * c + c0) * h + y) * w + xx;  // channel c0 of this position (when inside)
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const int i = (tid >> 6) + 4 * k;
            v[k] = c0 + i >= c ? 0.0f : inside ? to_f32(src[(long long)i * h * w]) : pad;
        }
#pragma unroll
        for (int k = 0; k < 16; ++k) tile[(tid >> 6) + 4 * k][tid & 63] = v[k];
    }
    __syncthreads();
    const int pair = tid & 31, cc = c0 + 2 * pair;  // the channel pair this thread writes
    TOut* out = xt + b * grid * (long long)c + cc;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int p = (tid >> 5) + 8 * q;
        if (p0 + p >= grid) break;
        if (cc < c)
            store_channels(out + (long long)(p0 + p) * c, tile[2 * pair][p], tile[2 * pair + 1][p], cc + 1 < c,
                           (c & 1) == 0);
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Direct convolution: one thread per output element (NCHW order, so stores are coalesced), fp32 throughout:
// w = fma(q, scale, offset) in fp32 as the CPU kernel computes it.
// ------------------------------------------------------------------------------------------------------------------

// Mirrored by `DirectArgs` in src/ops/conv/cuda.rs.
struct DirectArgs : ConvShape {
    const signed char* codes;  // [Co, Cg, Kh, Kw] signed codes
    const float2* params;      // [Co, blocks] {scale, offset}
    const float* bias;         // [Co]
    const void* x;             // NCHW, fp16 or fp32
    void* out;                 // NCHW, same type
    int blocks, block_channels;
};

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

template <class T>
__device__ __forceinline__ void direct(const DirectArgs& p) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)p.batch * p.co * p.oh * p.ow;
    if (idx >= total) return;
    const int ox = (int)(idx % p.ow);
    const int oy = (int)((idx / p.ow) % p.oh);
    const int co = (int)((idx / ((long long)p.ow * p.oh)) % p.co);
    const long long b = idx / ((long long)p.ow * p.oh * p.co);
    const int group = co / p.co_g;
    const T* x = static_cast<const T*>(p.x);
    const signed char* codes = p.codes + (long long)co * p.cg * p.kh * p.kw;
    float acc = 0.0f;
    for (int c = 0; c < p.cg; ++c) {
        const float2 so = p.params[(long long)co * p.blocks + c / p.block_channels];
        const T* plane = x + ((b * p.ci + group * p.cg + c) * p.h) * p.w;
        for (int ky = 0; ky < p.kh; ++ky) {
            const int iy = oy * p.sh - p.ph + ky * p.dh;
            if ((unsigned)iy >= (unsigned)p.h) continue;
            for (int kx = 0; kx < p.kw; ++kx) {
                const int ix = ox * p.sw - p.pw + kx * p.dw;
                if ((unsigned)ix >= (unsigned)p.w) continue;
                const float wv = fmaf((float)codes[(c * p.kh + ky) * p.kw + kx], so.x, so.y);
                acc = fmaf(to_f32(plane[(long long)iy * p.w + ix]), wv, acc);
            }
        }
    }
    const float v = acc + p.bias[co];
    store(static_cast<T*>(p.out) + idx, v < p.lo ? p.lo : (v > p.hi ? p.hi : v));
}

// ------------------------------------------------------------------------------------------------------------------
// ConvInt8 (seed 004's full-int8 convolution): int8 NCHW x with zero point Z_I (padding reads Z_I, which the fused
// bias accounts for), int8 symmetric weights, exact int32 dots, then per output channel
// O_q = clamp(round(m · acc + bias), q_lo, q_hi) with the CPU kernel's arithmetic (no fma: one rounding after the
// multiply, one after the add; round half away from zero), so both give the same codes bit for bit.
// A CTA computes 64 output channels x 64 output pixels of one (batch, group) as an implicit GEMM: per step of 32
// taps, the weight rows and the tile's input patches (im2col of the tile only) go to shared memory 4 codes per
// 32-bit word, and each thread runs dp4a for its 4 channels x 4 pixels.
// ------------------------------------------------------------------------------------------------------------------

constexpr int I8_TILE = 64;                 // output channels and pixels per CTA
constexpr int I8_STEP = 32;                 // taps per step
constexpr int I8_WORDS = I8_STEP / 4;       // 32-bit words of 4 codes per row and step
constexpr int I8_PITCH = I8_WORDS + 1;      // +1 word: the 16 pixel rows a warp reads fall in 16 different banks

// The int8 output code of one exact dot: the CPU kernel's arithmetic, bit for bit.
__device__ __forceinline__ signed char int8_output(int acc, float m, float bias, int q_lo, int q_hi) {
    const float v = roundf(__fadd_rn(__fmul_rn(m, __int2float_rn(acc)), bias));
    return (signed char)fminf(fmaxf(v, (float)q_lo), (float)q_hi);
}

// Mirrored by `Int8Args` in src/ops/conv_int8/cuda.rs.
struct Int8Args : ConvShape {
    const signed char* weight;  // [Co][taps_pad] codes, zero past `taps`
    const float* m;             // [Co] S_I S_W / S_O
    const float* bias;          // [Co] M · FusedBias
    const signed char* x;       // NCHW [B, Ci, H, W]
    signed char* out;           // NCHW [B, Co, OH, OW]
    int taps, taps_pad;         // Cg · Kh · Kw, and rounded up to a multiple of I8_STEP
    int zero_point;             // Z_I
    int q_lo, q_hi;             // the output clamp in codes (activation and int8 range)
    // The tensor-core route (one group): im2col of x, cuBLASLt's int8 GEMM, then conv_int8_epilogue.
    signed char* cols;          // [B·OH·OW][taps_pad] im2col codes (padding Z_I, past the taps 0)
    const int* acc;             // [B·OH·OW][Co] the GEMM's int32 dots
};

// The input code of tap t (channel, ky, kx of the weight row order) at output pixel (oy, ox): Z_I in the padding.
__device__ __forceinline__ int int8_tap(const Int8Args& p, const signed char* x, int t, int oy, int ox) {
    const int taps_per_channel = p.kh * p.kw;
    const int c = t / taps_per_channel, r = t - c * taps_per_channel, ky = r / p.kw, kx = r - ky * p.kw;
    const int iy = oy * p.sh - p.ph + ky * p.dh, ix = ox * p.sw - p.pw + kx * p.dw;
    return ((unsigned)iy < (unsigned)p.h && (unsigned)ix < (unsigned)p.w) ? x[((long long)c * p.h + iy) * p.w + ix]
                                                                           : p.zero_point;
}

__device__ __forceinline__ void conv_int8(const Int8Args& p) {
    __shared__ int ws[I8_TILE][I8_PITCH];
    __shared__ int xs[I8_TILE][I8_PITCH];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;  // pixels tx + 16 j, channels ty + 16 i
    const int pixels = p.oh * p.ow;
    const int p0 = blockIdx.x * I8_TILE;
    const int co_tiles = (p.co_g + I8_TILE - 1) / I8_TILE;
    const int g = blockIdx.y / co_tiles, c0 = (blockIdx.y - g * co_tiles) * I8_TILE;
    const long long b = blockIdx.z;
    const signed char* x = p.x + (b * p.ci + (long long)g * p.cg) * p.h * p.w;
    int acc[4][4] = {};
    for (int k0 = 0; k0 < p.taps_pad; k0 += I8_STEP) {
        // Two words of each tile per thread: row = idx / I8_WORDS, word = idx % I8_WORDS.
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int idx = tid + e * 256, row = idx / I8_WORDS, word = idx % I8_WORDS;
            const int co = c0 + row;
            ws[row][word] = co < p.co_g ? *reinterpret_cast<const int*>(
                                              p.weight + (long long)(g * p.co_g + co) * p.taps_pad + k0 + word * 4)
                                        : 0;
            const int pix = p0 + row, oy = pix / p.ow, ox = pix - oy * p.ow;
            unsigned packed = 0;
#pragma unroll
            for (int t4 = 0; t4 < 4; ++t4) {
                const int t = k0 + word * 4 + t4;
                // Past the taps (zero weights) or past the pixels: any value, 0.
                const int v = t < p.taps && pix < pixels ? int8_tap(p, x, t, oy, ox) : 0;
                packed |= (unsigned)(v & 0xFF) << (8 * t4);
            }
            xs[row][word] = (int)packed;
        }
        __syncthreads();
#pragma unroll
        for (int w = 0; w < I8_WORDS; ++w) {
            int a[4], bx[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = ws[ty + 16 * i][w], bx[i] = xs[tx + 16 * i][w];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(a[i], bx[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int co = c0 + ty + 16 * i;
        if (co >= p.co_g) continue;
        const int gco = g * p.co_g + co;
        const float m = p.m[gco], bias = p.bias[gco];
        signed char* out = p.out + (b * p.co + gco) * (long long)pixels;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int pix = p0 + tx + 16 * j;
            if (pix >= pixels) continue;
            out[pix] = int8_output(acc[i][j], m, bias, p.q_lo, p.q_hi);
        }
    }
}

// im2col for the GEMM route: one thread per 4 taps of one output pixel, one 32-bit store. The rows are padded to a
// multiple of 16 with zeros (the host's `gemm_rows`).
__device__ __forceinline__ void conv_int8_im2col(const Int8Args& p) {
    const long long words = (long long)p.taps_pad / 4, pixels = (long long)p.oh * p.ow, rows = p.batch * pixels;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (rows + 15) / 16 * 16 * words) return;
    const long long m = i / words;
    const int t0 = (int)(i - m * words) * 4;
    unsigned packed = 0;
    if (m < rows) {
        const long long b = m / pixels;
        const int pix = (int)(m - b * pixels), oy = pix / p.ow, ox = pix - oy * p.ow;
        const signed char* x = p.x + b * p.ci * p.h * p.w;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int v = t0 + e < p.taps ? int8_tap(p, x, t0 + e, oy, ox) : 0;
            packed |= (unsigned)(v & 0xFF) << (8 * e);
        }
    }
    reinterpret_cast<unsigned*>(p.cols)[i] = packed;
}

// im2col from the padded NHWC copy (conv_pack_nhwc_i8) when Ci is a multiple of 16: taps in (ky, kx, channel)
// order, so 16 taps are 16 channels of one input position, always inside the padded image: one 16-byte load and
// one 16-byte store per thread, no bounds checks. Rows padded to 16 and taps past Kh·Kw·Ci are zeros.
__device__ __forceinline__ void conv_int8_im2col_nhwc(const Int8Args& p, const signed char* xp) {
    const long long chunks = (long long)p.taps_pad / 16, pixels = (long long)p.oh * p.ow, rows = p.batch * pixels;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (rows + 15) / 16 * 16 * chunks) return;
    const long long m = i / chunks;
    const int t0 = (int)(i - m * chunks) * 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (m < rows && t0 < p.taps) {
        const long long b = m / pixels;
        const int pix = (int)(m - b * pixels), oy = pix / p.ow, ox = pix - oy * p.ow;
        const int tap = t0 / p.ci, c = t0 - tap * p.ci, ky = tap / p.kw, kx = tap - ky * p.kw;
        const int hp = p.h + 2 * p.ph, wp = p.w + 2 * p.pw;
        const int y = oy * p.sh + ky * p.dh, x = ox * p.sw + kx * p.dw;  // padded coordinates
        v = *reinterpret_cast<const uint4*>(xp + ((b * hp + y) * wp + x) * p.ci + c);
    }
    reinterpret_cast<uint4*>(p.cols)[i] = v;
}

// The GEMM route's epilogue: acc [B·OH·OW][Co] -> int8 NCHW, through a 32 x 32 shared-memory tile so that the reads
// run along channels and the writes along pixels.
__device__ __forceinline__ void conv_int8_epilogue(const Int8Args& p) {
    __shared__ int tile[32][33];
    const long long pixels = (long long)p.oh * p.ow, rows = p.batch * pixels;
    const long long m0 = (long long)blockIdx.x * 32;
    const int c0 = blockIdx.y * 32, tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8 threads
    for (int r = ty; r < 32; r += 8) {
        const long long m = m0 + r;
        const int co = c0 + tx;
        tile[r][tx] = (m < rows && co < p.co) ? p.acc[m * p.co + co] : 0;
    }
    __syncthreads();
    for (int r = ty; r < 32; r += 8) {
        const int co = c0 + r;
        const long long m = m0 + tx;
        if (co >= p.co || m >= rows) continue;
        const long long b = m / pixels, pix = m - b * pixels;
        p.out[(b * p.co + co) * pixels + pix] = int8_output(tile[tx][r], p.m[co], p.bias[co], p.q_lo, p.q_hi);
    }
}

}  // namespace conv
}  // namespace lowbit

// ------------------------------------------------------------------------------------------------------------------
// Entry points. The host (src/ops/conv/cuda.rs `Tile`) mirrors the tile shapes, STAGES and shared-memory sizes.
// ------------------------------------------------------------------------------------------------------------------
#define LB_CONV_STAGES 4
#define LB_CONV_IGEMM(NAME, BITS, WARPS_M, WARPS_N, WN)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N)                                            \
        NAME(const lowbit::conv::IgemmArgs p) {                                                                     \
        lowbit::conv::Igemm<BITS, WARPS_M, WARPS_N, WN, LB_CONV_STAGES>::run(p);                                    \
    }
LB_CONV_IGEMM(conv_igemm_w4_l, 4, 2, 2, 64)
LB_CONV_IGEMM(conv_igemm_w4_t, 4, 2, 1, 64)
LB_CONV_IGEMM(conv_igemm_w4_m, 4, 1, 2, 64)
LB_CONV_IGEMM(conv_igemm_w4_s, 4, 1, 2, 32)
LB_CONV_IGEMM(conv_igemm_w8_l, 8, 2, 2, 64)
LB_CONV_IGEMM(conv_igemm_w8_t, 8, 2, 1, 64)
LB_CONV_IGEMM(conv_igemm_w8_m, 8, 1, 2, 64)
LB_CONV_IGEMM(conv_igemm_w8_s, 8, 1, 2, 32)

// The Hopper path's GEMM is launched as this kernel's programmatic dependent: it may start (barriers, tensor-map
// fetch) while the pack runs, and waits for the packed image before its first TMA read of it.
extern "C" __global__ void __launch_bounds__(256) conv_pack_nhwc_f16(const __half* x, __half* xt, int c, int h, int w,
                                                                      int ph, int pw) {
    lowbit::allow_dependent_launch();
    lowbit::conv::pack_nhwc(x, xt, c, h, w, ph, pw, 0.0f);
}
extern "C" __global__ void __launch_bounds__(256) conv_pack_nhwc_f32(const float* x, __half* xt, int c, int h, int w,
                                                                      int ph, int pw) {
    lowbit::conv::pack_nhwc(x, xt, c, h, w, ph, pw, 0.0f);
}
extern "C" __global__ void __launch_bounds__(256) conv_pack_nhwc_i8(const signed char* x, signed char* xt, int c,
                                                                     int h, int w, int ph, int pw, int zero_point) {
    lowbit::conv::pack_nhwc(x, xt, c, h, w, ph, pw, (float)zero_point);
}
extern "C" __global__ void __launch_bounds__(256) conv_direct_f16(const lowbit::conv::DirectArgs p) {
    lowbit::conv::direct<__half>(p);
}
extern "C" __global__ void __launch_bounds__(256) conv_direct_f32(const lowbit::conv::DirectArgs p) {
    lowbit::conv::direct<float>(p);
}
extern "C" __global__ void __launch_bounds__(256) conv_int8(const lowbit::conv::Int8Args p) {
    lowbit::conv::conv_int8(p);
}
extern "C" __global__ void __launch_bounds__(256) conv_int8_im2col(const lowbit::conv::Int8Args p) {
    lowbit::conv::conv_int8_im2col(p);
}
extern "C" __global__ void __launch_bounds__(256) conv_int8_epilogue(const lowbit::conv::Int8Args p) {
    lowbit::conv::conv_int8_epilogue(p);
}
extern "C" __global__ void __launch_bounds__(256) conv_int8_im2col_nhwc(const lowbit::conv::Int8Args p,
                                                                         const signed char* xp) {
    lowbit::conv::conv_int8_im2col_nhwc(p, xp);
}
