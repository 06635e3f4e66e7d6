// W4A16 GEMM for prefill on Hopper (sm_90a): y[M, N] = act(x[M, K] · W^T + bias), W int4 with group scales and
// zeros, x/y fp16 or bf16, fp32 accumulation with wgmma. Host side: src/ops/linear/cuda/gemm.rs. It reads the SAME
// repacked weight as the decode kernel (linear_w4a16.cu), so a layer is prepared once for every M.
//
// Design (prefill is a tensor-core problem: the weight bytes are amortised over many tokens):
//
// * THE WEIGHT IS THE REGISTER "A" OPERAND. wgmma.m64nNk16 can take A (64 x 16) from registers, in the m16n8k16 A
//   fragment layout per warp, and B (16 x N) from shared memory. The repacked weight word of a lane IS that fragment
//   (8 int4 codes of rows {g, g+8} x k {2t, 2t+1, 2t+8, 2t+9}), so a warp converts its word to (q - z) * s with the
//   lop3 magic-number trick (FragmentOps<T>::dequant + one mul per register) and hands it to wgmma without touching
//   shared memory again. A dense fp16 weight never exists anywhere. The activations x are B: K-major rows of tokens,
//   loaded by TMA with the 128-byte swizzle wgmma reads without bank conflicts.
//
// * TILES. A CTA owns one decode tile of N_CTA = 256 (or 128) output columns and BM tokens, and walks its k range
//   128 at a time: one repacked unit (16 KB of codes + its scale/zero rows, two bulk copies) and the x tile (two TMA
//   boxes of 64 k x BM tokens) per pipeline stage. Two consumer warpgroups split the tile: by columns when
//   N_CTA = 256 (each owns 4 decode warps' 128 columns), by tokens when N_CTA = 128. A warpgroup issues two
//   m64nWG_TOKENSk16 per k16 step (the two 16-row tiles of its warps' repacked words): WG_TOKENS = 128 holds 128
//   fp32 accumulators per thread, WG_TOKENS = 64 (small batches, half the wasted rows) 64, WG_TOKENS = 16 (a
//   linear layer's batches of up to 16 rows: the GEMM then streams the weight like the decode kernel, with a
//   quarter of the 64-token tile's tensor work) 16. A third warpgroup is the TMA producer; setmaxnreg moves its
//   registers to the consumers.
//
// * K-SPLIT TILE (LB_KSPLIT; QuantLinear's table takes it where it measured fastest, such as 4096 x 4096 from 33
//   rows on). A CTA owns 128 columns x 64 or 128 tokens (WG_TOKENS: the wgmma N; 128 runs m64n128k16, the shape
//   whose rate the 128-token tile reaches, on a stage of 32 KB of x and 8 KB of codes), and its two consumer
//   warpgroups split an item's k range by stages: warpgroup wg takes k tiles
//   kt0 + wg, kt0 + wg + 2, ..., all 8 k16 steps of each, and converts only their codes, so no weight is converted
//   twice. (Splitting every stage's steps 4 : 4 ran as fast, with a second x descriptor and conversion path, and
//   no lookahead but 2.) At M = 64 on a 4096-wide layer the 256-column tile had 16 tiles to split six ways, each
//   CTA pushing a 64 KB fp32 partial over DSMEM; half tiles make 32, whose partials are half the size and whose
//   CTAs each do the same tensor work. Over a 256-column weight a tile is half a repacked unit (LB_UNIT_N 256):
//   the unit is warp-major, so its half is one contiguous copy, and the scale rows come whole. The warpgroups' two
//   partials meet in shared memory (exchange_halves); then each holds half the tokens, and every epilogue runs as
//   for the token-split 128-column tile. Since the warpgroups walk their own stages, each has its own producer
//   thread (PRODUCERS), and each releases a stage as soon as its last wgmma is done (EARLY_RELEASE in stage_step).
//
// * OVERLAP. Each k16 step: wgmma.fence, two wgmmas, commit, wait until at most LOOK - 1 groups are in flight,
//   then convert the A fragments of the step LOOK ahead (LB_LOOKAHEAD, 2 or 3; 4 or 8 fragment buffers, so the one
//   written is read by no group in flight). The tensor cores always have the next step queued while a warp
//   converts, which a one-step lookahead did not guarantee at the 64-token tile (conversion latency ~ one group's
//   run time). A stage is released to the producer (its "empty" mbarrier) as soon as a wait has retired its last
//   group, i.e. when no wgmma can still read it: in the next stage's first step, or (the K-split tile) by draining
//   the warpgroup's wgmmas after its last.
//
// * INT8 WEIGHTS (LB_WBITS 8, fp16 only). The same units hold one unsigned 8-bit code per weight (32 KB at
//   N_CTA = 256) in the same fragment order, two bytes per register: each fragment register is one prmt into
//   {1024 + u, 1024 + u'} and one sub of {1024 + z, ...} (Converter::dequant), then the scale, so an int8 layer
//   costs the tensor cores what an int4 one does. (The decode kernel reads 8-bit weights as two int4 planes
//   instead: cuda.rs `repack` and `repack_int8`.)
//
// * NUMERICS. Each weight is round((q - z) * s) in the activation type: exactly what dequantize + cuBLAS computes;
//   products and sums are fp32 inside wgmma; bias and the activation are applied in fp32; y is rounded once.
//
// * SPLIT-K. When tiles are too few to fill the GPU (M = 256 on a 4096-wide layer: 32 tiles for 132 SMs), each
//   tile is `splits` CTAs over disjoint k ranges, launched as thread-block clusters, and they reduce their fp32
//   partials through distributed shared memory, always summing in split order (deterministic; epilogue_split).
//   A GPC holds whole clusters: on an H200 only 30 clusters of 4 one-CTA-per-SM CTAs are resident, so 32 tiles
//   could not split 4 ways in one cluster each. They split as `groups` clusters per tile instead (4 = 2 x 2):
//   each cluster reduces in shared memory, then the clusters add their sums through global memory.
//   HYBRID: with more tiles than CTAs and the last wave at most half full (448 tiles on 132 SMs: 3 waves and 52
//   tiles), the first `whole` tiles (the full waves) run unsplit and only the rest split (clusters of 2 over the
//   whole grid), so the last wave takes half as long instead of leaving most SMs idle.
//   STREAM-K (s.stream, when the host forces it: small batches whose tiles do not fill the SMs evenly, such as 112
//   tiles of 16 tokens on 132 SMs; on the H200 it matched the whole tiles once RAMP was in): CTA c of G takes the
//   contiguous units [c U / G, (c + 1) U / G) of the U = tiles x k tiles in tile order, so every SM streams the same
//   number of weight bytes. A tile whose k range is split between CTAs is finished by a fix-up per warp (a warp's
//   accumulators are its own 32 columns), as in the decode kernel: each piece's warp writes its fp32 partial to its
//   CTA's slot (first segment 2c, last 2c + 1) and bumps the (tile, warp) counter; the last to arrive sums the
//   slots in piece order (lowest k first) and stores y. The same order whoever arrives last: repeated runs are
//   bit-identical, and the partition depends on the shape only.
//
// * STAGGER (LB_LAG; the linear 128-token tile of 256 columns with 4 stages, i.e. 4-bit codes: the int8 layout's
//   3-stage tile was slower with it). Warpgroup 1 starts once warpgroup 0 has done LAG k tiles, and stays that far
//   behind on the same stages. Both used to finish an item at once and run their epilogues with the tensor cores
//   idle (~4.5% of a K = 4096 item). Now one's epilogue overlaps the other's wgmmas: one warpgroup alone drives the
//   tensor pipe at ~97% of the pair's rate (measured). 3-6% at M = 1024 and 4096 (f16).
//
// * PERSISTENT. The grid is at most one CTA per SM; CTA c takes work items (tile x split) c, c + grid, ... and the
//   producer runs ahead across items, so the next tile's stages fill while the consumers run an epilogue: K = 4096
//   tiles have only 32 k tiles, and a drained and refilled pipeline per tile cost ~7% there.
//
// * EPILOGUE. Without split-K, from registers through a little staging per warp, past the pipeline stages so it
//   never races the producer: stmatrix.trans turns the accumulator fragments into token rows for 16-byte stores
//   (epilogue_staged), or stmatrix into channel rows for runs along NCHW planes (epilogue_conv). With split-K
//   (then every CTA has one item) through the fp32 tile in the stages' shared memory (epilogue_split). The
//   activation is a template argument: inlining every activation at every element (erff, expf) outgrew the
//   instruction cache and cost ~20 us per convolution tile.
//
// * DEPENDENT LAUNCH (the host launches with programmatic stream serialization). Every CTA lets the next kernel
//   launch at once (griddepcontrol.launch_dependents): its CTAs take SMs as this launch's CTAs exit, so one
//   launch's tail (the last items, the split epilogues) overlaps the next one's first stages. In turn, the producer
//   issues its first stages' weight copies (the operator's own, never written by a kernel) before it waits for the
//   previous kernel (griddepcontrol.wait), and their x copies after; the consumers wait before anything else, since
//   they write y, the partials and the counters, which the previous launch may still use. A convolution's previous
//   kernel is its pack kernel, which writes the image. Without the attribute the wait returns at once.
//
// * CONVOLUTION (LB_CONV): a stride-1 convolution is this GEMM over a zero-padded NHWC input. Tokens are the
//   positions of the padded grid [B][Hp][Wp] (Hp = H + 2 ph, ...), K runs (tap, channel), and the x rows of
//   tap (r, s) for tokens m..m+BM are rows m + r dh Wp + s dw .. of the padded image: one TMA box per 64 channels,
//   only its row coordinate moves with the tap. Positions past the output (the right and bottom padding bands)
//   are computed and dropped; the epilogue writes the rest to NCHW y. Weights in MNN's offset form (q s + o,
//   LB_ZEROS 2) are fma(q, s, o) per pair, the same single rounding as the direct kernel of conv.cu.
//
// * ORDER. Consecutive CTAs walk 16 column tiles before the next token tile, so the ~132 CTAs in flight share a few
//   MB of weights and of x in L2 instead of streaming both from memory.
//
// The host prepends the #defines selecting one variant (LB_DTYPE, LB_ZEROS, LB_WG_N, LB_WG_TOKENS, LB_STAGES,
// LB_UNIT_GROUPS, LB_CONV, LB_LOOKAHEAD, LB_WBITS, LB_RAMP, LB_LAG, LB_KSPLIT, LB_UNIT_N).
#include "common.cuh"

namespace lowbit {
namespace w4a16_gemm {

typedef unsigned char u8;

constexpr int K_TILE = 128;     // k per stage (= one repacked unit)
constexpr int X_BOX_K = 64;     // k per TMA box: one 128-byte swizzled row of 16-bit values
constexpr int RASTER_N = 16;    // column tiles walked before the next token tile (L2 reuse)

struct Shape {
    int M, N, K;
    int KT;           // k tiles (units per column tile)
    int NT;           // column tiles
    int MT;           // token tiles
    int group;        // k per scale group in the repacked k space, a multiple of 16
    int GP;           // scale/zero rows per column tile
    int group_shift;  // log2(group) when a power of two, else -1
    int splits;       // CTAs per output tile (split-K), at most 8: `groups` clusters of `cluster` CTAs
    int cluster;      // CTAs per thread-block cluster (split-K; 1 without)
    int groups;       // clusters per tile: 1, or more when clusters of `splits` do not all fit (SPLIT-K)
    int whole;        // tiles run unsplit before the split ones: 0, or a multiple of the grid (HYBRID)
    int stream;       // 1: STREAM-K (CTA c takes units [c U / G, (c + 1) U / G)); splits is then 1
    int split_pairs;  // split-K epilogue: row pairs per CTA of a cluster, ceil(BM / 2 / cluster)
    int split_pairs_recip;  // ceil(2^16 / split_pairs): pair / split_pairs = (pair * recip) >> 16 (exact, pair < 128)
    int activation;   // Activation code (common.cuh)
    int y_vector;     // y rows are 16-byte aligned: 16-byte stores
    long long y_stride;
    // LB_CONV only (see the header): x is the padded NHWC input [B * Hp * Wp][channels].
    int channels;     // C: input channels, a multiple of 64 (one TMA box never straddles two taps)
    int kernel_w;     // taps per kernel row (S)
    int tap_row;      // row shift of one kernel row: dh * Wp
    int tap_col;      // row shift of one kernel column: dw
    int taps;         // R * S (k past R * S * C is padding: read as zeros)
    int grid_tokens;  // Hp * Wp, tokens per image
    int grid_w;       // Wp
    int out_h, out_w; // Ho, Wo: the positions of the padded grid that are outputs
    int batch;        // B
    long long out_plane;  // Ho * Wo: y is [B][N][Ho][Wo]
};

// LB_ZEROS: how a weight's zero point is given.
constexpr int ZEROS_NONE = 0;     // symmetric: (q - 8) s (int8 codes: q - 128)
constexpr int ZEROS_CODES = 1;    // zero codes of the weight's width: (q - z) s
constexpr int ZEROS_OFFSETS = 2;  // MNN offset form: (q - 8) s + o (int8: q - 128), o fp16 per column and group

struct Args {
    const uint4* qweight;  // repacked codes (linear_w4a16.cu), N_CTA * 4 uint4 per unit, units in (nt, kt) order
    const u16* scales;     // [NT][GP][N_CTA] bits of T in param_slot order
    const u8* zeros;       // [NT][GP][N_CTA / 2] zero codes in param_slot order
    const u16* bias;       // [N] bits of T, or null
    u16* y;                // [M][y_stride] bits of T
    u64* trace;            // diagnostics, normally null: TRACE_SLOTS timestamps per CTA (see Trace)
    float* partials;       // split-K with groups > 1: [tiles][cluster][groups][2 split_pairs][N_CTA] fp32;
                           // STREAM-K: [2 G][BM * N_CTA] fp32, one slot per CTA and partial segment
    u32* counters;         // [tiles][MAX_CLUSTER] arrivals (split-K groups: per rank; STREAM-K: per consumer
                           // warp), zero between launches
};

constexpr int MAX_CLUSTER = 8;  // counters per tile

// EXPERIMENT (off; from stop 48's d00a678): LB_EXP_NO_MATH keeps every stage wait and release and drops the
// conversion and the wgmmas, so gemm_trace's main loop is the fill alone. Results are garbage.
#ifndef LB_EXP_NO_MATH
#define LB_EXP_NO_MATH 0
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

// WG_TOKENS: the wgmma N, tokens per consumer warpgroup (16 or 64 for small batches, 128 otherwise).
// KSPLIT: the two consumer warpgroups take alternate stages of an item's k range (WG_N 1; see the header's K-SPLIT
// TILE). UNIT_N: columns of a repacked unit, N_CTA or (K-split tile over a 256-column weight) 2 N_CTA.
template <class T, int ZMODE, int WG_N, int WG_TOKENS, int STAGES, bool UNIT_GROUPS, bool CONV, int LOOK, int WBITS,
          int RAMP, int LAG, bool KSPLIT, int UNIT_N>
struct Gemm {
    static_assert(LOOK == 2 || LOOK == 3, "k16 steps converted ahead of the wgmmas: 2 or 3");
    static_assert(LAG >= 0 && LAG < STAGES, "STAGGER: warpgroup 1 at most STAGES - 1 k tiles behind");
    static_assert(!KSPLIT || (WG_N == 1 && LAG == 0 && !CONV && (WG_TOKENS == 64 || WG_TOKENS == 128)),
                  "K-split tile: 128 columns x 64 or 128 tokens, no STAGGER, linear only");
    static_assert(UNIT_N == 128 * WG_N || (KSPLIT && UNIT_N == 256), "a tile is a unit, or half of one");
    static constexpr int STAGGER_BARRIER = 2;  // named barrier 1 is consumer_sync's
    static_assert(WBITS == 4 || (WBITS == 8 && T::MAGIC == F16::MAGIC),
                  "int8 codes: fp16 activations only (bf16 cannot hold 1024 + u; see INT8 CODES)");
    static constexpr int FRAG_BUFS = LOOK == 2 ? 4 : 8;  // >= 2 LOOK - 1, dividing the 8 steps of a stage
    static constexpr int STEPS = K_TILE / 16;           // k16 steps of a stage
    static constexpr bool HAS_ZEROS = ZMODE == ZEROS_CODES;
    static constexpr bool OFFSETS = ZMODE == ZEROS_OFFSETS;
    static constexpr int ACC = WG_TOKENS / 2;  // fp32 accumulators per thread per 64-row tile
    static constexpr int N_CTA = 128 * WG_N;  // output columns per tile
    static constexpr int HALVES = UNIT_N / N_CTA;  // tiles per repacked unit's columns: 1, or 2 (K-split half tiles)
    static constexpr int WG_M = KSPLIT ? 1 : 2 / WG_N;  // consumer warpgroups along tokens
    static constexpr int BM = WG_M * WG_TOKENS;
    // Stages between two of one warpgroup's: 1, or 2 when the warpgroups take alternate stages (KSPLIT).
    static constexpr int STRIDE = KSPLIT ? 2 : 1;
    // The K-split tile's warpgroups each walk their own stages (the header's K-SPLIT TILE): one producer thread per
    // warpgroup's stages (produce), and each stage released as soon as its last wgmma is done (stage_step).
    static constexpr int PRODUCERS = KSPLIT ? 2 : 1;
    // EVEN RING (KSPLIT): a wait on a stage slot's barrier names the phase by its parity, which is unambiguous only
    // if the phase before it has completed. With an even ring a slot's uses alternate neither producer nor (within
    // an item) warpgroup, and each waited for the slot's previous use itself. With 3 stages they do: once warpgroup
    // 1 had released stage 1 before warpgroup 0 released stage 0, producer 0, refilling slot 0 with stage 6, waited
    // for parity 1 (stage 3's release) while phase 0 was still open, passed at once and overwrote stage 0 as it was
    // read. The host keeps K-split rings even.
    static_assert(!KSPLIT || STAGES % 2 == 0, "the K-split tile's warpgroups and producers take alternate stages");
    static constexpr bool EARLY_RELEASE = KSPLIT;
    // Tokens per warpgroup in the epilogue: a K-split tile's warpgroups first trade halves (exchange_halves), so
    // each then holds the sums of 32 tokens, as the token-split tile's do.
    static constexpr int EPI_TOKENS = KSPLIT ? WG_TOKENS / 2 : WG_TOKENS;
    static constexpr int CONSUMERS = 256;     // two consumer warpgroups
    static constexpr int BLOCK = 384;         // + the producer warpgroup
    static constexpr int X_BYTES = BM * K_TILE * 2;  // two boxes of BM rows x 128 B
    static constexpr int W_BYTES = N_CTA * K_TILE * WBITS / 8;  // the tile's codes: a unit, or its half
    static constexpr int GROUP_ROWS = UNIT_GROUPS ? 1 : K_TILE / 16;
    // Scale and zero rows are the unit's whole rows (a half tile reads its half of them: Converter::pw).
    static constexpr int S_BYTES = GROUP_ROWS * UNIT_N * 2;
    // Zero rows: 4- or 8-bit codes, or fp16 offsets laid out like the scales.
    static constexpr int Z_ROW_BYTES = HAS_ZEROS ? UNIT_N * WBITS / 8 : OFFSETS ? UNIT_N * 2 : 0;
    static constexpr int Z_BYTES = GROUP_ROWS * Z_ROW_BYTES;
    // x first: swizzled tiles must be 1024-byte aligned, so stages are padded to a multiple of 1024.
    static constexpr int STAGE_BYTES = (X_BYTES + W_BYTES + S_BYTES + Z_BYTES + 1023) / 1024 * 1024;
    // The split-K slabs: splits x ceil(BM / 2 / splits) <= BM / 2 + 8 row pairs of N_CTA / 16 blocks of 36 floats
    // and 4 of padding (epilogue_split).
    static constexpr int Y_BYTES = (BM / 2 + 8) * (N_CTA / 16 * 36 + 4) * 4;
    // Per-warp staging of the register epilogue, past the stages (the producer may be filling those for the next
    // item meanwhile): two 8-token slices of the warp's 32 columns (epilogue_staged), or for a convolution four
    // [32 channels][8 tokens] slices, 16 bytes of padding apart (epilogue_conv).
    static constexpr int CONV_SLICE_BYTES = 32 * 16 + 16;
    static constexpr int STAGING_BYTES = CONV ? 8 * 4 * CONV_SLICE_BYTES : 8 * 1024;
    // KSPLIT: the halves the warpgroups trade, past the staging (exchange_halves): ACC / 2 floats per tile and thread,
    // both tiles at once, or (128 tokens: 64 KB would cost a stage) one tile per pass.
    static constexpr int EXCHANGE_PASSES = KSPLIT && WG_TOKENS > 64 ? 2 : 1;
    static constexpr int EXCHANGE_BYTES = KSPLIT ? CONSUMERS * ACC * 4 / EXCHANGE_PASSES : 0;
    static constexpr int PIPE_BYTES = STAGES * STAGE_BYTES + STAGING_BYTES + EXCHANGE_BYTES;
    static constexpr int DATA_BYTES = PIPE_BYTES > Y_BYTES ? PIPE_BYTES : Y_BYTES;
    static constexpr int TILE_FLOATS = BM * N_CTA;
    // Tiles that may take STREAM-K (the host's STREAM_MAX_TOKENS): the 128-token tile's fix-up would spill.
    static constexpr bool STREAM = WG_TOKENS <= 64 && !CONV && !KSPLIT;

    __device__ static __forceinline__ void wgmma(float (&d)[ACC], uint4 a, u64 desc, int accumulate) {
        wgmma_m64k16<T, WG_TOKENS>(d, a, desc, accumulate);
    }

    __device__ static __forceinline__ int group_row(const Shape& s, int k) {
        return s.group_shift >= 0 ? k >> s.group_shift : k / s.group;
    }

    // One work item: a tile (nt, mt) and a split of its k range (`splits` 1: the whole tile). STREAM-K: a
    // segment of the tile's k range, one of `pieces` (the CTAs first_cta, ... that share the tile), whose partial
    // goes to `slot` when pieces > 1.
    struct Work {
        int nt, mt, split, splits, kt0, kt1;
        int tile_seq, pieces, first_cta, slot;
    };
    // The work items of a launch: the whole tiles, then the splits of the others.
    __device__ static __forceinline__ int item_count(const Shape& s) {
        return s.whole + (s.NT * s.MT - s.whole) * s.splits;
    }
    // Items in order: the whole tiles, then the splits of each other tile consecutively (HYBRID); tiles in groups
    // of RASTER_N column tiles, token tiles inner within a group (L2 reuse among the CTAs in flight).
    __device__ static __forceinline__ Work work(const Shape& s, int item) {
        Work w;
        int tile_seq = item;
        w.split = 0, w.splits = 1;
        if (item >= s.whole) {
            const int rest = item - s.whole;
            tile_seq = s.whole + rest / s.splits, w.split = rest % s.splits, w.splits = s.splits;
        }
        place_tile(s, tile_seq, w);
        w.kt0 = (int)((long long)w.split * s.KT / w.splits);
        w.kt1 = (int)((long long)(w.split + 1) * s.KT / w.splits);
        w.pieces = 1;
        return w;
    }

    // Tile `tile_seq` of the launch order: groups of RASTER_N column tiles, token tiles inner within a group.
    __device__ static __forceinline__ void place_tile(const Shape& s, int tile_seq, Work& w) {
        const int per_group = RASTER_N * s.MT, group = tile_seq / per_group;
        const int first_n = group * RASTER_N, width = min(RASTER_N, s.NT - first_n);
        const int local = tile_seq - group * per_group;
        w.tile_seq = tile_seq, w.nt = first_n + local % width, w.mt = local / width;
    }

    // STREAM-K (common.cuh's partition of all k tiles over the grid): the first unit of CTA c (c = gridDim.x: the
    // end), and the CTA whose range holds unit u.
    __device__ static __forceinline__ long long unit_begin(const Shape& s, int c) {
        return stream_unit_begin(c, (long long)s.NT * s.MT * s.KT, gridDim.x);
    }
    __device__ static __forceinline__ int cta_of(const Shape& s, long long u) {
        return stream_cta_of(u, (long long)s.NT * s.MT * s.KT, gridDim.x);
    }

    // STREAM-K: this CTA's segment of the tile holding unit u, up to the end of its range.
    __device__ static __forceinline__ Work stream_work(const Shape& s, long long u, long long end) {
        Work w;
        const int tile_seq = (int)(u / s.KT);
        const long long first = (long long)tile_seq * s.KT;
        place_tile(s, tile_seq, w);
        w.split = 0, w.splits = 1;
        w.kt0 = (int)(u - first), w.kt1 = (int)min((long long)s.KT, end - first);
        w.first_cta = cta_of(s, first);
        w.pieces = cta_of(s, first + s.KT - 1) - w.first_cta + 1;
        // A CTA's range splits at most its first and its last tile: slots 2c and 2c + 1.
        w.slot = 2 * blockIdx.x + (u == unit_begin(s, blockIdx.x) ? 0 : 1);
        return w;
    }

    // This CTA's work items in order: items blockIdx.x, + gridDim.x, ... (the grid is at most one CTA per SM), or
    // with STREAM-K the tile segments of its unit range.
    struct Cursor {
        long long at, end;  // the next item and the item count, or (STREAM-K) the next unit and the range's end
        __device__ __forceinline__ explicit Cursor(const Shape& s) {
            if (STREAM && s.stream) at = unit_begin(s, blockIdx.x), end = unit_begin(s, blockIdx.x + 1);
            else at = blockIdx.x, end = item_count(s);
        }
        __device__ __forceinline__ bool next(const Shape& s, Work& w) {
            if (at >= end) return false;
            if (STREAM && s.stream) {
                w = stream_work(s, at, end);
                at += w.kt1 - w.kt0;
            } else {
                w = work(s, (int)at);
                at += gridDim.x;
            }
            return true;
        }
    };

    // One stage's weight copies (codes, scale rows, zero rows), after announcing all of its bytes, x's included.
    __device__ static __forceinline__ void issue_weights(const Args& a, const Shape& s, u32 stage, u32 full,
                                                         const Work& w, int kt) {
        const int k0 = kt * K_TILE;
        const int g_lo = group_row(s, k0), rows = group_row(s, k0 + K_TILE - 1) - g_lo + 1;
        // A half tile's codes are the unit's second half or its first: a unit is warp-major (decode warp w's 32
        // columns at w W_BYTES / 4 in a 128-column tile's terms), so 4 warps' columns are contiguous.
        const int unit_nt = w.nt / HALVES, half = w.nt % HALVES;
        const size_t row0 = (size_t)unit_nt * s.GP + g_lo;
        mbar_arrive_expect_tx(full, X_BYTES + W_BYTES + rows * (UNIT_N * 2 + Z_ROW_BYTES));
        bulk_copy(stage + X_BYTES, a.qweight + (((size_t)unit_nt * s.KT + kt) * HALVES + half) * (W_BYTES / 16), W_BYTES,
                  full);
        bulk_copy(stage + X_BYTES + W_BYTES, a.scales + row0 * UNIT_N, rows * (UNIT_N * 2), full);
        if (Z_ROW_BYTES)
            bulk_copy(stage + X_BYTES + W_BYTES + S_BYTES, a.zeros + row0 * Z_ROW_BYTES, rows * Z_ROW_BYTES, full);
    }

    // One stage's x tile: two TMA boxes of 64 k x BM tokens.
    __device__ static __forceinline__ void issue_x(const TensorMap* xmap, const Shape& s, u32 stage, u32 full,
                                                   const Work& w, int kt) {
#pragma unroll
        for (int box = 0; box < 2; ++box) {
            const int k = kt * K_TILE + box * X_BOX_K;
            int col = k, row = w.mt * BM;
            if (CONV) {  // tap (r, q) and channel c of k; a padding tap reads rows past the end (zeros)
                const int tap = k / s.channels, r = tap / s.kernel_w;
                col = k - tap * s.channels;
                row += tap < s.taps ? r * s.tap_row + (tap - r * s.kernel_w) * s.tap_col : s.batch * s.grid_tokens;
            }
            tma_load_2d(stage + box * (BM * 128), xmap, col, row, full);
        }
    }

    // TMA producer (one thread): for every k tile of every item of this CTA, wait for the stage to be free, announce
    // its bytes, issue the copies. It runs ahead across items, so the next tile's stages fill during an epilogue.
    // DEPENDENT LAUNCH: the weights of the first item's first stages go out before the wait for the previous
    // kernel, their x after. (Only the first item's: the producer runs on 40 registers.)
    // RAMP (LB_RAMP > 0; the host's RAMP_STAGES for small batches): the first fill issues stage i only once stage
    // i - RAMP has landed, so that each SM's first stage is not queued behind the whole GPU's first STAGES stages
    // (it landed 3.6-3.9 us after the launch; the consumers waited). A compile-time constant: a register more in
    // the producer's 40 spilled.
    // PRODUCERS (the K-split tile: 2, lane 0 of producer warps 0 and 1): producer p issues the stages i with
    // i % PRODUCERS == p. Its warpgroups take alternate stages, and one thread issuing them all in order made each
    // warpgroup's next stage wait behind the other's release: 4-9% of a launch at 4096 x 4096, M = 64-256, with
    // EARLY_RELEASE (stage_step).
    __device__ static void produce(const TensorMap* xmap, const Args& a, const Shape& s, u32 base, u32 bars,
                                   int producer) {
        int early = 0;
        Work w;
        if (Cursor(s).next(s, w)) {
            early = min(RAMP > 0 && RAMP < STAGES ? RAMP : STAGES, w.kt1 - w.kt0);
            for (int i = producer; i < early; i += PRODUCERS)
                issue_weights(a, s, base + i * STAGE_BYTES, bars + i * 8, w, w.kt0 + i);
        }
        wait_for_prerequisite_grids();
        int buf = 0, i = 0;
        for (Cursor items(s); items.next(s, w);) {
            for (int kt = w.kt0; kt < w.kt1; ++kt, ++i) {
                const u32 full = bars + buf * 8, empty = bars + (STAGES + buf) * 8;
                const u32 stage = base + buf * STAGE_BYTES;
                if (PRODUCERS == 1 || i % PRODUCERS == producer) {
                    if (i >= early) {
                        if (i >= STAGES) mbar_wait(empty, ((i / STAGES) - 1) & 1);
                        else if (RAMP > 0 && i >= RAMP) mbar_wait(bars + (i - RAMP) * 8, 0);
                        issue_weights(a, s, stage, full, w, kt);
                    }
                    issue_x(xmap, s, stage, full, w, kt);
                }
                if (++buf == STAGES) buf = 0;
            }
        }
    }

    __device__ static __forceinline__ void fence_accumulators(float (&acc)[2][ACC]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int i = 0; i < ACC; ++i) wgmma_fence_operand(acc[t][i]);
    }

    // The conversion side of the main loop: the stage it reads, its words and group terms, two steps ahead of the
    // wgmmas (see mainloop). `pw`: the warp's 32-column slice in the unit's scale rows (its decode warp dw, plus 4
    // in a unit's second half tile).
    struct Converter {
        u32 ws, params, starts;
        int pw;
        uint4 wq;
        GroupTerms gt;
        u32 o2[2][2];  // OFFSETS: the offsets of rows g / g + 8 per tile as packed pairs {o, o}

        __device__ __forceinline__ void load_terms(int row, int lane) {
            gt = load_group_terms<T, HAS_ZEROS, UNIT_N, WBITS>(params, S_BYTES, row, pw, lane);
            if (OFFSETS) {  // laid out like the scales (one 8-byte load per lane group)
                const uint2 ov = lds64(params + S_BYTES + row * (UNIT_N * 2) + pw * 64 + (lane >> 2) * 8);
                o2[0][0] = prmt(ov.x, ov.x, 0x1010), o2[0][1] = prmt(ov.x, ov.x, 0x3232);
                o2[1][0] = prmt(ov.y, ov.y, 0x1010), o2[1][1] = prmt(ov.y, ov.y, 0x3232);
            }
        }

        // (q - z) * s, or (q - 8) * s + o, of one register (a pair of row `h` of tile `t`).
        __device__ __forceinline__ u32 scale(u32 q, int t, int h) const {
            return OFFSETS ? FragmentOps<T>::fma2(q, gt.s2[t][h], o2[t][h]) : FragmentOps<T>::mul2(q, gt.s2[t][h]);
        }

        // Points at the stage of k tile `kt` in buffer `stage` (waits for it to be full first: done by the caller).
        __device__ __forceinline__ void begin(const Shape& s, u32 stage, int kt, int dw, int lane) {
            // int4 codes: 16 bytes per lane and two steps; int8: per step.
            ws = stage + X_BYTES + dw * (W_BYTES / (N_CTA / 32)) + lane * 16;
            params = stage + X_BYTES + W_BYTES;
            // Bit j set: a group starts at k16 step j (j >= 1) of this unit; its row is the popcount up to j.
            starts = 0;
            if (!UNIT_GROUPS) {
                const int k0 = kt * K_TILE;
                for (int j = ((group_row(s, k0) + 1) * s.group - k0) >> 4; j < K_TILE / 16; j += s.group >> 4)
                    starts |= 1u << j;
            }
            load_terms(0, lane);  // a group starting at step 0 is the first row
        }

        // Step j of the stage as the two A fragments (q - z) * s (registers x, z: row g; y, w: row g + 8).
        // Tile t's fragment (q - z) of a step whose words are `w`. INT8 CODES (WBITS 8): a lane's 16 bytes of a
        // step are its two tiles' fragments, words 2t and 2t + 1 of tile t (k and k + 8; FragmentOps<F16>::dequant8).
        __device__ __forceinline__ uint4 dequant(const uint4& w, int t) const {
            if (WBITS == 4) return FragmentOps<T>::dequant(t == 0 ? w.x : w.y, gt.lo[t], gt.hi[t]);
            return FragmentOps<F16>::dequant8(t == 0 ? w.x : w.z, t == 0 ? w.y : w.w, gt.lo[t], gt.hi[t]);
        }

        // Step J of the stage.
        template <int J>
        __device__ __forceinline__ void convert(uint4 (&frag)[2], int lane) {
            // int4: one 16-byte read per two steps (words x, y: step 2i; z, w: 2i + 1); int8: one per step.
            if (WBITS == 8) wq = lds128(ws + J * 512);
            else if (J % 2 == 0) wq = lds128(ws + (J / 2) * 512);
            if (!UNIT_GROUPS && J > 0 && (starts >> J) & 1) load_terms(__popc(starts & ((2u << J) - 1)), lane);
            const uint4 w = WBITS == 8 || J % 2 == 0 ? wq : make_uint4(wq.z, wq.w, 0, 0);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const uint4 q = dequant(w, t);
                frag[t] = make_uint4(scale(q.x, t, 0), scale(q.y, t, 1), scale(q.z, t, 0), scale(q.w, t, 1));
                wgmma_fence_operand(frag[t].x), wgmma_fence_operand(frag[t].y);
                wgmma_fence_operand(frag[t].z), wgmma_fence_operand(frag[t].w);
            }
        }
    };

    // A place in the ring of stages: the buffer and the parity of its use.
    struct Ring {
        int buf;
        u32 phase;
        // N stages on (N <= STAGES).
        template <int N>
        __device__ __forceinline__ Ring ahead() const {
            const int at = buf + N;
            return at >= STAGES ? Ring{at - STAGES, phase ^ 1} : Ring{at, phase};
        }
        // n stages on (any n >= 0).
        __device__ __forceinline__ Ring advanced(int n) const {
            const int to = buf + n;
            return Ring{to % STAGES, phase ^ ((to / STAGES) & 1)};
        }
        // The buffer N stages back.
        template <int N>
        __device__ __forceinline__ int buf_behind() const {
            return buf >= N ? buf - N : buf + STAGES - N;
        }
    };

    // One stage's STEPS k16 steps of wgmma, converting LOOK steps ahead: after step j's wgmmas the wait leaves at
    // most LOOK - 1 groups (j - LOOK + 2 .. j) in flight, and the fragments of step j + LOOK go to buffer
    // (j + LOOK) % FRAG_BUFS, which neither those groups nor the pending steps j + 1 .. j + LOOK - 1 use
    // (2 LOOK - 1 <= FRAG_BUFS, which divides STEPS). The last LOOK steps convert the first of the warpgroup's next
    // stage (waiting for it to be full). `first`: the warpgroup's first k tile of the item.
    template <int J>
    __device__ static __forceinline__ void stage_step(const Shape& s, u32 base, u32 bars, int kt, int first, int kt1,
                                                      Ring at, u64 x_desc, int dw, int lane, Converter& cv,
                                                      uint4 (&frag)[FRAG_BUFS][2], float (&acc)[2][ACC]) {
        // Step J reads k [16J, 16J + 16): box J / 4, 32 bytes per step inside its rows (the descriptor's address
        // field counts 16-byte units and the offset never carries out of it).
        const u64 desc = x_desc + (((J >> 2) * (BM * 128) + (J & 3) * 32) >> 4);
        const int accumulate = kt > first || J > 0;  // the first product overwrites D: no zeroing
        fence_accumulators(acc);
        wgmma_fence();
        if (!LB_EXP_NO_MATH) {
            wgmma(acc[0], frag[J % FRAG_BUFS][0], desc, accumulate);
            wgmma(acc[1], frag[J % FRAG_BUFS][1], desc, accumulate);
        }
        wgmma_commit();
        fence_accumulators(acc);
        wgmma_wait<LOOK - 1>();
        if (!EARLY_RELEASE && J == LOOK - 2 && kt > first) {  // the previous stage's last group is done: release it
            mbar_arrive(bars + (STAGES + at.template buf_behind<STRIDE>()) * 8);
        }
        if (J + LOOK < STEPS) {
            if (!LB_EXP_NO_MATH) cv.template convert<(J + LOOK) % STEPS>(frag[(J + LOOK) % FRAG_BUFS], lane);
        } else if (EARLY_RELEASE) {
            // EARLY_RELEASE (the K-split tile): after the stage's last step, drain this warpgroup's wgmmas (the other
            // warpgroup keeps the tensor cores busy), release the stage, and only then wait for the next one and
            // convert its first LOOK steps. Released at the next stage's first step instead, a stage stayed held
            // until that next stage had landed, so one late stage delayed the refill of the one before it too.
            if (J == STEPS - 1) {
                wgmma_wait<0>();
                fence_accumulators(acc);
                mbar_arrive(bars + (STAGES + at.buf) * 8);
                if (kt + STRIDE < kt1) {
                    const Ring next = at.template ahead<STRIDE>();
                    mbar_wait(bars + next.buf * 8, next.phase);
                    if (!LB_EXP_NO_MATH) {
                        cv.begin(s, base + next.buf * STAGE_BYTES, kt + STRIDE, dw, lane);
                        cv.template convert<0>(frag[0], lane);
                        cv.template convert<1>(frag[1], lane);
                        if (LOOK > 2) cv.template convert<2>(frag[2], lane);
                    }
                }
            }
        } else if (kt + STRIDE < kt1) {
            if (J == STEPS - LOOK) {
                const Ring next = at.template ahead<STRIDE>();
                mbar_wait(bars + next.buf * 8, next.phase);
                if (!LB_EXP_NO_MATH) cv.begin(s, base + next.buf * STAGE_BYTES, kt + STRIDE, dw, lane);
            }
            if (!LB_EXP_NO_MATH) cv.template convert<(J + LOOK) % STEPS>(frag[(J + LOOK) % FRAG_BUFS], lane);
        }
    }

    // The consumer warpgroups' main loop; returns with every wgmma complete and the accumulators in `acc`.
    // `ring`: the stage the item's first k tile is in, carried across items (on return: the next item's).
    // `arrive_kt` (STAGGER): after that k tile warpgroup 0 lets warpgroup 1 start; -1: none.
    // `nt`: the item's column tile (a half tile reads the unit's second half of the scale rows when odd).
    // KSPLIT: warpgroup wg takes k tiles kt0 + wg, kt0 + wg + 2, ... (stages of one parity in the ring).
    __device__ static __forceinline__ void mainloop(const Shape& s, u32 base, u32 bars, int nt, int kt0, int kt1, int wg,
                                                    int arrive_kt, Ring& ring, float (&acc)[2][ACC]) {
        const int lane = threadIdx.x & 31;
        const int dw = (WG_N == 2 ? wg * 4 : 0) + ((threadIdx.x >> 5) & 3);  // this warp's 32-column decode slice
        // x rows from: this warpgroup's token half (WG_N 1 with a token split), or all BM tokens.
        const int x_offset = KSPLIT || WG_N == 2 ? 0 : wg * (WG_TOKENS * 128);
        const int first = kt0 + (KSPLIT ? wg : 0);
        Ring at = ring;
        if (KSPLIT) {
            ring = ring.advanced(kt1 - kt0);  // the next item's first stage (the other tiles': where their loop ends)
            if (wg == 1) at = at.template ahead<1>();  // warpgroup 1 takes the odd stages
            // A one-tile item: warpgroup 1 has no stage, and exchange_halves leaves its accumulators out. (Zeroing
            // them here spilled the 128-token tile: a second definition of 128 registers that wgmma pins.)
            if (first >= kt1) return;
        }
        Converter cv;
        cv.pw = dw + (HALVES == 2 ? (nt & 1) * (N_CTA / 32) : 0);
        uint4 frag[FRAG_BUFS][2];
        mbar_wait(bars + at.buf * 8, at.phase);
        cv.begin(s, base + at.buf * STAGE_BYTES, first, dw, lane);
        cv.template convert<0>(frag[0], lane);
        cv.template convert<1>(frag[1], lane);
        if (LOOK > 2) cv.template convert<2>(frag[2], lane);
        for (int kt = first; kt < kt1; kt += STRIDE) {
            const u64 xd = smem_desc_sw128(base + at.buf * STAGE_BYTES + x_offset);
            stage_step<0>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<1>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<2>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<3>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<4>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<5>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<6>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            stage_step<7>(s, base, bars, kt, first, kt1, at, xd, dw, lane, cv, frag, acc);
            at = at.template ahead<STRIDE>();
            if (LAG > 0 && kt == arrive_kt) named_barrier_arrive(STAGGER_BARRIER, CONSUMERS);
        }
        wgmma_wait<0>();
        fence_accumulators(acc);
        if (!EARLY_RELEASE) mbar_arrive(bars + (STAGES + at.template buf_behind<STRIDE>()) * 8);  // its last stage
        if (!KSPLIT) ring = at;
    }

    // Bias, activation, one rounding, then 8 columns of token m from column n on: one 16-byte store (8 planes of
    // NCHW y in the convolution mode).
    template <int ACT>
    __device__ static __forceinline__ void store_chunk(const Args& a, const Shape& s, int m, int n, const float (&v)[8]) {
        u16 out[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float b = (a.bias && n + e < s.N) ? FragmentOps<T>::to_f32(a.bias[n + e]) : 0.0f;
            out[e] = FragmentOps<T>::from_f32(activate<ACT>(v[e] + b));
        }
        if (CONV) {
            const long long at = conv_offset(s, m);
            if (at >= 0) {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (n + e < s.N) a.y[at + (long long)(n + e) * s.out_plane] = out[e];
            }
            return;
        }
        u16* dst = a.y + (size_t)m * s.y_stride + n;
        if (s.y_vector && n + 8 <= s.N) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(out);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (n + e < s.N) dst[e] = out[e];
        }
    }

    // Split-K epilogue. The splits of a tile are `groups` thread-block clusters (split = group * cluster + rank);
    // CTA r of a cluster finishes some of the tile's row pairs, at most P = ceil(BM / 2 / cluster). Linear: the
    // pairs p with p % cluster == r (SPREAD), so that the four pairs of one push instruction (its lanes' t4) go to
    // different owners rather than every CTA pushing to CTA 0 first. The convolution: [r P, (r + 1) P), since its
    // stores want a warp's positions consecutive. Either way a pair's owner is a multiply by a reciprocal, no
    // division. Once every CTA of the cluster is past its main loop (first barrier: nobody reads its stages any
    // more), each PUSHES its fp32 partial of those rows into CTA r's shared memory, slab `rank` of r's array, with
    // st.shared::cluster, and its own pairs with st.shared. (Both together took 256 x 4096^2, two splits, from 22.3
    // to 21.7 us; 64 x 4096^2, three splits, stayed at 11.1.) After
    // the second barrier every CTA sums its rows' slabs from its own shared memory in rank order (deterministic)
    // and stores them, or, with several groups, hands the sums to the global step below. Pulling the partials
    // with DSMEM loads instead cost a ~1 us round trip per reduction pass (7.2 us per item at the batch-1
    // convolution, two splits); a remote store needs no reply. Global partials reduced by one CTA took ~10 us per
    // tile: a GPU-scope fence behind 64-128 KB of stores, an arrival counter, then L2 round trips.
    // Slab layout: row PAIRS. A lane holds, per 8-token slice and 16-column tile, rows 2 t4 and 2 t4 + 1 of
    // columns c and c + 8: these four values are stored contiguously, (c, r0) (c + 8, r0) (c, r1) (c + 8, r1), so
    // each leaves as ONE 16-byte remote store (scalar remote stores made eight splits slower than the pull), and a
    // row's two come back as one 8-byte load. A 16-column block of a pair is thus 8 such quads (128 B), padded to
    // 144 B, and a pair padded by 16 B more, so that the reduction, where neighbouring threads read neighbouring
    // rows and blocks (linear) or rows and pairs (convolution), meets each bank once per phase.
    // The producer warpgroup takes part in both barriers.
    static constexpr int QUAD_BLOCK_FLOATS = 36;                             // one 16-column block of a row pair
    static constexpr int PAIR_FLOATS = N_CTA / 16 * QUAD_BLOCK_FLOATS + 4;   // one row pair of a slab
    static constexpr bool SPREAD = !CONV;  // pairs dealt round-robin (above)

    // Row r of the pair at `at` (a slab's pair, block b) summed over the cluster's slabs in rank order.
    __device__ static __forceinline__ void sum_slabs(u32 at, u32 slab_bytes, int cluster, float2 (&sum)[8]) {
#pragma unroll
        for (int q = 0; q < 8; ++q) sum[q] = lds64f(at + q * 16);
        for (int sp = 1; sp < cluster; ++sp) {
            at += slab_bytes;
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const float2 p = lds64f(at + q * 16);
                sum[q].x += p.x, sum[q].y += p.y;
            }
        }
    }

    template <int ACT>
    __device__ static __forceinline__ void store_sum(const Args& a, const Shape& s, int m, int n, const float2 (&sum)[8]) {
        float lo[8], hi[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) lo[q] = sum[q].x, hi[q] = sum[q].y;
        store_chunk<ACT>(a, s, m, n, lo);
        if (n + 8 < s.N) store_chunk<ACT>(a, s, m, n + 8, hi);
    }

    template <int ACT>
    __device__ static __forceinline__ void epilogue_split(const Args& a, const Shape& s, u32 base, const Work& w,
                                                          int wg, const float (&acc)[2][ACC]) {
        const int ctid = thread_index();  // (see thread_index)
        const int rank = w.split % s.cluster, group = w.split / s.cluster;
        const int share = s.split_pairs;  // row pairs per CTA of the cluster
        const u32 slab_bytes = share * (PAIR_FLOATS * 4);
        const int lane = ctid & 31, g = lane >> 2, t4 = lane & 3;
        const int dw = (WG_N == 2 ? wg * 4 : 0) + ((ctid >> 5) & 3);
        const int wm = WG_N == 2 ? 0 : wg;
        const u32 slab = base + rank * slab_bytes + g * 16;  // this CTA's slab in every owner, at this lane's quad
        // SPREAD: pair p is CTA p % cluster's, its index p / cluster there ((p * recip) >> 16, exact for p < 128).
        const int cluster_recip = (65536 + s.cluster - 1) / s.cluster;
        cluster_sync();  // nobody reads its stages any more: the slabs may overwrite them
#pragma unroll
        for (int j = 0; j < EPI_TOKENS / 8; ++j) {
            const int pair = wm * (EPI_TOKENS / 2) + j * 4 + t4;  // rows 2 pair, 2 pair + 1 of the tile
            int owner, index;
            if (SPREAD) {
                index = (pair * cluster_recip) >> 16, owner = pair - index * s.cluster;
            } else {
                owner = (pair * s.split_pairs_recip) >> 16, index = pair - owner * share;
            }
            const u32 pair_at = slab + index * (PAIR_FLOATS * 4);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int block = dw * 2 + t;  // columns 16 block .. 16 block + 15
                const u32 at = pair_at + block * (QUAD_BLOCK_FLOATS * 4);
                const float4 v = make_float4(acc[t][4 * j], acc[t][4 * j + 2], acc[t][4 * j + 1], acc[t][4 * j + 3]);
                if (owner == rank) sts128f(at, v);  // its own: no trip through the cluster window
                else st_cluster_f32x4(cluster_map(at, owner), v);
            }
        }
        cluster_sync();
        trace_stamp(a.trace, TRACE_PARTIALS_SEEN);

        constexpr int BLOCKS = N_CTA / 16;
        const int pairs = SPREAD ? (BM / 2 - rank + s.cluster - 1) / s.cluster
                                 : min(share, BM / 2 - rank * share);  // this CTA's row pairs
        // One row of one 16-column block per item, the two rows of a pair on neighbouring threads. Linear: then
        // consecutive blocks of the pair (16-byte stores along y's rows). Convolution: then consecutive pairs of
        // the block, so each channel plane receives a warp's 32 consecutive positions per store. Quad q of a block
        // holds (row 0, col q), (row 0, col q + 8), (row 1, col q), (row 1, col q + 8): a row's two are one 8-byte
        // load.
        auto locate = [&](int i, int& m, int& n) -> u32 {
            const int r = i & 1, item = i >> 1;
            const int pair = CONV ? item % pairs : item / BLOCKS, b = CONV ? item / pairs : item % BLOCKS;
            const int tile_pair = SPREAD ? pair * s.cluster + rank : rank * share + pair;
            m = w.mt * BM + 2 * tile_pair + r, n = w.nt * N_CTA + b * 16;
            return base + (pair * PAIR_FLOATS + b * QUAD_BLOCK_FLOATS) * 4 + r * 8;
        };
        if (s.groups == 1) {
            for (int i = ctid; i < 2 * pairs * BLOCKS; i += CONSUMERS) {
                int m, n;
                const u32 at = locate(i, m, n);
                if (m >= s.M || n >= s.N) continue;
                float2 sum[8];
                sum_slabs(at, slab_bytes, s.cluster, sum);
                store_sum<ACT>(a, s, m, n, sum);
            }
            return;
        }

        // GROUPS: the tile's clusters meet in global memory. Each publishes its sums (this CTA: its rows) to a
        // slot of its own and keeps them in slab 0; the last to arrive copies the other clusters' slots into its
        // shared memory past slab 0 (cp.async: every load in flight at once, no registers held), then adds them
        // in cluster order and stores y. A fixed order whoever arrives last: repeated runs are bit-identical.
        // Slot layout: float4 q of item i at q * stride + i, so that a warp's accesses are 512 contiguous bytes.
        // (Loading the slots item by item waited for an L2 round trip per item: ~6 us per tile at 4 items.)
        const int items = 2 * pairs * BLOCKS;
        const int tile = w.mt * s.NT + w.nt;
        const int stride = share * 2 * BLOCKS;  // items of the largest share
        float4* const slots =
            reinterpret_cast<float4*>(a.partials) + (long long)((tile * s.cluster + rank) * s.groups) * 4 * stride;
        for (int i = ctid; i < items; i += CONSUMERS) {
            int m, n;
            const u32 at = locate(i, m, n);
            float2 sum[8];
            sum_slabs(at, slab_bytes, s.cluster, sum);
            float4* dst = slots + group * 4 * stride + i;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                __stcg(dst + q * stride, make_float4(sum[2 * q].x, sum[2 * q].y, sum[2 * q + 1].x, sum[2 * q + 1].y));
                sts64f(at + (2 * q) * 16, sum[2 * q]), sts64f(at + (2 * q + 1) * 16, sum[2 * q + 1]);
            }
        }
        // Every consumer's stores, then one GPU-scope acq_rel arrival (cumulative over the barrier, as in the
        // decode kernel's fix-up); its result goes to the others through shared memory.
        const u32 arrival = base + DATA_BYTES + STAGES * 16;
        consumer_sync(CONSUMERS);
        u32* counter = a.counters + tile * MAX_CLUSTER + rank;
        if (ctid == 0) sts32(arrival, atomic_add_acq_rel_gpu(counter, 1u));
        consumer_sync(CONSUMERS);
        if (lds32(arrival) != (u32)(s.groups - 1)) return;
        trace_stamp(a.trace, TRACE_GLOBAL_STEP);
        // The other clusters' slots, in cluster order, past slab 0 (the host checked that they fit): one TMA bulk
        // copy per cluster, completing on the step's own mbarrier (initialised by `run`; a CTA takes at most one
        // split item per launch, so it completes phase 0 once). 256 threads' cp.async took ~2.8 us for 96 KB
        // (64 x 14336 x 4096: 4 groups); that is the L2 -> SM rate of ~25 B per cycle, far below what TMA moves.
        const u32 received = base + slab_bytes, step_bar = arrival + 8;
        if (ctid == 0) {
            *counter = 0;  // every cluster has arrived: ready for the next launch
            fence_proxy_async_global();  // the slots the acquire made visible, to the bulk copies' async proxy
            const u32 bytes = 4 * stride * 16;
            mbar_arrive_expect_tx(step_bar, (s.groups - 1) * bytes);
            for (int k = 0; k < s.groups - 1; ++k) {
                const int gr = k < group ? k : k + 1;
                bulk_copy(received + k * bytes, slots + gr * 4 * stride, bytes, step_bar);
            }
        }
        mbar_wait(step_bar, 0);
        trace_stamp(a.trace, TRACE_STEP_LOADED);
        for (int i = ctid; i < items; i += CONSUMERS) {
            int m, n;
            const u32 at = locate(i, m, n);
            if (m >= s.M || n >= s.N) continue;
            float2 sum[8];
            for (int gr = 0; gr < s.groups; ++gr) {
                const int k = gr < group ? gr : gr - 1;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    float2 lo, hi;
                    if (gr == group) {
                        lo = lds64f(at + (2 * q) * 16), hi = lds64f(at + (2 * q + 1) * 16);
                    } else {
                        const float4 v = lds128f(received + ((k * 4 + q) * stride + i) * 16);
                        lo = make_float2(v.x, v.y), hi = make_float2(v.z, v.w);
                    }
                    if (gr == 0) {
                        sum[2 * q] = lo, sum[2 * q + 1] = hi;
                    } else {
                        sum[2 * q].x += lo.x, sum[2 * q].y += lo.y, sum[2 * q + 1].x += hi.x, sum[2 * q + 1].y += hi.y;
                    }
                }
            }
            store_sum<ACT>(a, s, m, n, sum);
        }
    }

    // CONV: the offset in y of (token m, channel 0), or -1 when m is a position of the padding bands (no output).
    __device__ static __forceinline__ long long conv_offset(const Shape& s, int m) {
        const int b = m / s.grid_tokens, p = m - b * s.grid_tokens, ho = p / s.grid_w, wo = p - ho * s.grid_w;
        if (b >= s.batch || ho >= s.out_h || wo >= s.out_w) return -1;
        return (long long)b * s.N * s.out_plane + ho * s.out_w + wo;
    }

    // The first of the 32 output columns whose accumulators consumer warp `warp` (0..7) of warpgroup `wg` holds.
    __device__ static __forceinline__ int warp_columns(int nt, int wg, int warp) {
        return nt * N_CTA + ((WG_N == 2 ? wg * 4 : 0) + (warp & 3)) * 32;
    }

    // The bias of a lane's four accumulator columns (t, h): n_warp + 16t + 8h + g (0 past N or without bias).
    __device__ static __forceinline__ void load_lane_bias(const Args& a, const Shape& s, int n_warp, int g,
                                                          float (&bias)[2][2]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = n_warp + t * 16 + h * 8 + g;
                bias[t][h] = (a.bias && n < s.N) ? FragmentOps<T>::to_f32(a.bias[n]) : 0.0f;
            }
    }

    // Where both register epilogues start: the warp, its warpgroup's token half, its first column, and the bias of
    // the lane's four accumulator columns.
    struct WarpTile {
        int warp, wm, n_warp;
        float bias[2][2];
    };
    __device__ static __forceinline__ WarpTile warp_tile(const Args& a, const Shape& s, int nt, int wg) {
        const int ctid = thread_index();  // (see thread_index)
        WarpTile wt;
        wt.warp = ctid >> 5;
        wt.wm = WG_N == 2 ? 0 : wg;
        wt.n_warp = warp_columns(nt, wg, wt.warp);
        load_lane_bias(a, s, wt.n_warp, (ctid & 31) >> 2, wt.bias);
        return wt;
    }

    // 8-token slice j of a lane's accumulators, bias added, activated and rounded: register 2t + h holds column
    // (t, h, g) at tokens 2 t4 (low half) and 2 t4 + 1, i.e. the fragment of matrix 2t + h for stmatrix.
    template <int ACT>
    __device__ static __forceinline__ void pack_slice(const float (&acc)[2][ACC], int j, const float (&bias)[2][2],
                                                      u32 (&v)[4]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float lo = activate<ACT>(acc[t][4 * j + 2 * h] + bias[t][h]);
                const float hi = activate<ACT>(acc[t][4 * j + 2 * h + 1] + bias[t][h]);
                v[2 * t + h] = (u32)FragmentOps<T>::from_f32(lo) | ((u32)FragmentOps<T>::from_f32(hi) << 16);
            }
    }

    // CONV epilogue without split-K. A lane's accumulator pair is two consecutive tokens of one channel; per 32
    // tokens, stmatrix writes the warp's [32 channels][8 tokens] slices to its staging, then each lane takes one
    // token pair and stores it for 16 channels in turn: a warp store covers 32 consecutive positions of 2 channel
    // planes (2 x 64 contiguous bytes within a grid row), where storing the registers directly wrote 16-byte pieces
    // of 8 planes.
    template <int ACT>
    __device__ static __forceinline__ void epilogue_conv(const Args& a, const Shape& s, u32 staging, int nt, int mt,
                                                         int wg, const float (&acc)[2][ACC]) {
        const WarpTile wt = warp_tile(a, s, nt, wg);
        const int lane = thread_index() & 31;
        const u32 buf = staging + wt.warp * (4 * CONV_SLICE_BYTES);
        // Storing: this lane's token pair p of the 32 and channel parity `half`; channel 2q + half in turn.
        const int half = lane >> 4, p = lane & 15;
        const u32 get = buf + (p >> 2) * CONV_SLICE_BYTES + half * 16 + (p & 3) * 4;
        const int grid_h = s.grid_tokens / s.grid_w;
#pragma unroll
        for (int round = 0; round < EPI_TOKENS / 32; ++round) {
            __syncwarp();  // every lane has read the previous round
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = round * 4 + jj;
                u32 v[4];
                pack_slice<ACT>(acc, j, wt.bias, v);
                stmatrix_x4<false>(buf + jj * CONV_SLICE_BYTES + lane * 16, v);  // row = channel `lane` of the warp
            }
            __syncwarp();
            // Tokens m, m + 1 -> their offsets in image plane 0 (-1: a padding position or past M).
            const int m = mt * BM + wt.wm * EPI_TOKENS + round * 32 + 2 * p;
            const int b = m / s.grid_tokens, rest = m - b * s.grid_tokens, ho = rest / s.grid_w, wo = rest - ho * s.grid_w;
            int b1 = b, ho1 = ho, wo1 = wo + 1;
            if (wo1 == s.grid_w) {
                wo1 = 0;
                if (++ho1 == grid_h) ho1 = 0, ++b1;
            }
            auto offset = [&](int bb, int hh, int ww, int mm) -> long long {
                return mm < s.M && hh < s.out_h && ww < s.out_w ? (long long)bb * s.N * s.out_plane + hh * s.out_w + ww
                                                                  : -1;
            };
            const long long at0 = offset(b, ho, wo, m), at1 = offset(b1, ho1, wo1, m + 1);
            // One 4-byte store when both tokens are outputs, adjacent in y and 4-byte aligned in every plane.
            const bool pair = at0 >= 0 && at1 == at0 + 1 && ((at0 | s.out_plane) & 1) == 0;
#pragma unroll
            for (int q = 0; q < 16; ++q) {
                const int n = wt.n_warp + 2 * q + half;
                const u32 w = lds32(get + q * 32);
                if (n >= s.N) continue;
                u16* plane = a.y + (long long)n * s.out_plane;
                if (pair) {
                    *reinterpret_cast<u32*>(plane + at0) = w;
                } else {
                    if (at0 >= 0) plane[at0] = (u16)w;
                    if (at1 >= 0) plane[at1] = (u16)(w >> 16);
                }
            }
        }
    }

    // Epilogue without split-K (the producer may already be filling stages for the next item): bias and activation
    // in fp32, one rounding, then through the warp's 1 KB of staging. A lane's registers hold (column, token pair)s;
    // stmatrix.trans writes them as token rows of the warp's 32 columns, so each lane then stores 16 contiguous
    // bytes: a warp store covers 8 rows x 64 bytes in whole sectors, where storing the registers directly took
    // 4-byte pieces over 8 rows and ~5 us per tile (the CTA timeline of examples/gemm_trace).
    // Two copies of the unrolled loop: VECTOR (the tile's columns inside y, rows 16-byte aligned: every item of a
    // large layer) stores with one predicated 16-byte store per slice and no branch; the other checks each element.
    // With the per-element path inside every slice, the loop was ~60 instructions a slice with a divergent branch
    // around each store, and Nsight Compute put 45% of the epilogue's stall samples on fetching its instructions
    // (no_inst at the reconvergence points; 4096^3 on H200: the epilogue took 2.6 us of a 52 us item).
    template <int ACT, bool VECTOR>
    __device__ static __forceinline__ void store_slices(const Args& a, const Shape& s, u32 buf, int m0,
                                                        const WarpTile& wt, const float (&acc)[2][ACC]) {
        const int lane = thread_index() & 31;
        // Staging rows are 64 bytes (8 tokens x 4 chunks of 8 columns); chunk c of row r sits at c ^ ((r >> 1) & 3),
        // which puts the 8 rows of one stmatrix matrix (and the lanes of one read) on distinct banks.
        const int r = lane & 7, matrix = lane >> 3;  // stmatrix: this lane addresses row r of matrix 2t + h
        const u32 put = buf + r * 64 + ((matrix ^ ((r >> 1) & 3)) << 4);
        const int row = lane >> 2, chunk = lane & 3;  // read-back: 16 bytes of token row `row`
        const u32 get = buf + row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
        const int n = wt.n_warp + chunk * 8;
        u16* dst = a.y + (size_t)(m0 + row) * s.y_stride + n;
        const size_t slice_stride = (size_t)8 * s.y_stride;
#pragma unroll
        for (int j = 0; j < EPI_TOKENS / 8; ++j) {
            u32 v[4];
            pack_slice<ACT>(acc, j, wt.bias, v);
            const u32 slot = (j & 1) * 512;
            __syncwarp();  // every lane has read what it last read from this slot
            stmatrix_x4<true>(put + slot, v);
            __syncwarp();
            const uint4 out = lds128(get + slot);
            const int m = m0 + j * 8 + row;
            if (VECTOR) {
                st_global_v4_if(dst, out, m < s.M);
            } else if (m < s.M && n < s.N) {
                const u32 w[4] = {out.x, out.y, out.z, out.w};
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    if (n + e < s.N) dst[e] = (u16)(w[e >> 1] >> ((e & 1) * 16));
            }
            dst += slice_stride;
        }
    }

    template <int ACT>
    __device__ static __forceinline__ void epilogue_staged(const Args& a, const Shape& s, u32 staging, int nt, int mt,
                                                           int wg, const float (&acc)[2][ACC]) {
        const WarpTile wt = warp_tile(a, s, nt, wg);
        const u32 buf = staging + wt.warp * 1024;
        const int m0 = mt * BM + wt.wm * EPI_TOKENS;
        // Decided per tile, which ptxas sees to be uniform: a per-warp condition made it treat the main loop of the
        // next item as divergent (descriptors out of uniform registers in the 16- and 64-token tiles).
        if (s.y_vector && (nt + 1) * N_CTA <= s.N)
            store_slices<ACT, true>(a, s, buf, m0, wt, acc);
        else
            store_slices<ACT, false>(a, s, buf, m0, wt, acc);
    }

    // STREAM-K's fix-up of a tile split between CTAs, per consumer warp (common.cuh's warp_fixup: its accumulators
    // are its own 32 columns x WG_TOKENS tokens, float4 i of row t being float4 t ACC / 4 + i): true for the warp
    // that arrives last, which then holds the tile's sum in `acc` and stores y.
    __device__ static bool stream_fixup(const Args& a, const Shape& s, const Work& w, float (&acc)[2][ACC]) {
        const int ctid = thread_index();
        // CTA c's segment here is its first (slot 2c) when its range starts in this tile, else its last.
        auto slot_of = [&](int piece) {
            const int c = w.first_cta + piece;
            return 2 * c + (unit_begin(s, c) >= (long long)w.tile_seq * s.KT ? 0 : 1);
        };
        // BATCH pieces' loads in flight: 64 registers of float4 (two pieces of the 64-token tile spilled).
        constexpr int BATCH = ACC <= 8 ? 4 : 1;
        auto counter_of = [&] { return a.counters + (w.mt * s.NT + w.nt) * MAX_CLUSTER + (ctid >> 5); };
        return warp_fixup<ACC / 2, BATCH>(a.partials, TILE_FLOATS, w.slot, counter_of, w.pieces, slot_of, [] {},
                                          ctid >> 5, ctid & 31, &acc[0][0]);
    }

    // KSPLIT: the two warpgroups hold partial sums of the same WG_TOKENS x 128 outputs, over alternate stages of the
    // item's k. Warpgroup 0 keeps the first half of the tokens (accumulators 0 .. ACC / 2 - 1 of each tile),
    // warpgroup 1 the second: each hands the other the half it does not keep, through shared memory past the staging
    // (thread i of one warpgroup and thread i of the other hold the same outputs), and adds the half it receives. A
    // sum of two terms is the same whichever adds it, so the result does not depend on timing. Warpgroup 1 leaves its
    // sums in accumulators 0 .. ACC / 2 - 1 too, and both run the epilogue of a token-split tile of EPI_TOKENS tokens
    // each. `alone`: the item has one k tile, so warpgroup 1's accumulators hold nothing (mainloop) and count as zeros.
    __device__ static __forceinline__ void exchange_halves(u32 exchange, int wg, bool alone, float (&acc)[2][ACC]) {
        // What one warpgroup hands over per pass: the tiles of the pass x ACC / 2 floats a thread.
        constexpr u32 SIDE = CONSUMERS / 2 * ACC * 4 / EXCHANGE_PASSES;
        const u32 out = exchange + wg * SIDE, in = exchange + (1 - wg) * SIDE;
        exchange_pass<0>(out, in, wg, alone, acc);
        if (EXCHANGE_PASSES == 2) exchange_pass<1>(out, in, wg, alone, acc);
    }
    // One pass of exchange_halves. Accumulator indices must be compile-time constants (registers), so each warpgroup
    // has its own instance of each side; the barriers stay outside them: `bar.sync` is the aligned form, whose
    // waiting threads must all execute the same instruction (synccheck reported the two warpgroups meeting at two).
    template <int PASS>
    __device__ static __forceinline__ void exchange_pass(u32 out, u32 in, int wg, bool alone, float (&acc)[2][ACC]) {
        if (wg == 0) give_half<ACC / 2, PASS>(out, acc);
        else give_half<0, PASS>(out, acc);
        consumer_sync(CONSUMERS);  // both halves are written
        if (wg == 0) add_half<ACC / 2, PASS>(in, alone, acc);
        else add_half<0, PASS>(in, alone, acc);
        consumer_sync(CONSUMERS);  // both have read: the next pass or item may write again
    }
    // Accumulators GIVE .. GIVE + ACC / 2 - 1 of the pass's tiles, to the other warpgroup.
    template <int GIVE, int PASS>
    __device__ static __forceinline__ void give_half(u32 out, const float (&acc)[2][ACC]) {
        constexpr int QUADS = ACC / 8, TILES = 2 / EXCHANGE_PASSES;
        const int i = thread_index() & 127;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            if (t / TILES != PASS) continue;
#pragma unroll
            for (int q = 0; q < QUADS; ++q) {
                const int at = GIVE + 4 * q;
                sts128f(out + (((t % TILES) * QUADS + q) * 128 + i) * 16,
                        make_float4(acc[t][at], acc[t][at + 1], acc[t][at + 2], acc[t][at + 3]));
            }
        }
    }
    // Adds the other warpgroup's half into the one kept (the GIVE of give_half tells which) and leaves the sums in
    // 0 .. ACC / 2 - 1. Warpgroup 1's terms are zeros when `alone` (0 + v and v + 0, as if it had summed nothing into
    // zeroed accumulators).
    template <int GIVE, int PASS>
    __device__ static __forceinline__ void add_half(u32 in, bool alone, float (&acc)[2][ACC]) {
        constexpr int QUADS = ACC / 8, KEEP = ACC / 2 - GIVE, TILES = 2 / EXCHANGE_PASSES;
        const int i = thread_index() & 127;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
            if (t / TILES != PASS) continue;
#pragma unroll
            for (int q = 0; q < QUADS; ++q) {
                float4 v = lds128f(in + (((t % TILES) * QUADS + q) * 128 + i) * 16);
                const int at = KEEP + 4 * q;
                float4 own = make_float4(acc[t][at], acc[t][at + 1], acc[t][at + 2], acc[t][at + 3]);
                if (alone && GIVE > 0) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // warpgroup 0: nothing came
                if (alone && GIVE == 0) own = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // warpgroup 1: nothing summed
                // Into slot 4 q: for warpgroup 0 (KEEP 0) in place, for warpgroup 1 moved down.
                acc[t][4 * q] = own.x + v.x, acc[t][4 * q + 1] = own.y + v.y;
                acc[t][4 * q + 2] = own.z + v.z, acc[t][4 * q + 3] = own.w + v.w;
            }
        }
    }

    // The epilogue of one work item.
    template <int ACT>
    __device__ static __forceinline__ void finish_item(const Args& a, const Shape& s, u32 base, const Work& w, int wg,
                                                       float (&acc)[2][ACC]) {
        if (STREAM && w.pieces > 1 && !stream_fixup(a, s, w, acc)) return;
        if (w.splits > 1) {
            epilogue_split<ACT>(a, s, base, w, wg, acc);
        } else if (CONV) {
            epilogue_conv<ACT>(a, s, base + STAGES * STAGE_BYTES, w.nt, w.mt, wg, acc);
        } else {
            epilogue_staged<ACT>(a, s, base + STAGES * STAGE_BYTES, w.nt, w.mt, wg, acc);
        }
    }

    __device__ static void run(const TensorMap* xmap, const Args& a, const Shape& s) {
        extern __shared__ __align__(16) char smem_raw[];
        // Swizzled TMA tiles need 1024-byte alignment: the host allocates 1 KB of slack.
        const u32 raw = smem_addr(smem_raw), base = (raw + 1023) & ~1023u;
        const u32 bars = base + DATA_BYTES;
        // UNIFORM WARPGROUP INDEX (K-split and 96-token tiles): the index broadcast from lane 0, so that the compiler
        // knows it is warp-uniform (as CUTLASS's canonical_warp_group_idx does). The ring position and the x
        // descriptors derived from it then live in uniform registers: in the 64-token f16 K-split tile a stage's
        // wgmma stretch drops from 239 to 201 instructions (its 28 R2UR go). On the H200 (stop 49) the K-split
        // launch at 64 x 4096 x 14336 went from 20.2 to 18.7 us and the 96-token tile's at 96 x 8192 x 28672 from
        // 75.5 to 73.7. The 128-token tile lost 1-3% with it, and the 64-token token-split tiles (lookahead 3) spill.
        constexpr bool UNIFORM_WG = KSPLIT || WG_TOKENS == 96;
        const int tid = threadIdx.x, wg = UNIFORM_WG ? __shfl_sync(0xffffffffu, tid >> 7, 0) : tid >> 7;

        // Whether this CTA takes a split item: then its last one (the host's rule; whole is a multiple of the grid).
        const bool splits_a_tile = s.splits > 1 && s.whole + (int)blockIdx.x < item_count(s);
        allow_dependent_launch();  // DEPENDENT LAUNCH: the next kernel may take SMs as this one's CTAs exit

        if (tid == 0) {
            mbar_init(bars + STAGES * 16 + 8, 1);  // epilogue_split's global step (after the arrival word)
            init_pipeline_barriers(bars, STAGES, CONSUMERS / STRIDE);  // KSPLIT: one warpgroup reads a stage
        }
        __syncthreads();
        if (wg == 2) {
            setmaxnreg_dec<40>();
            if (tid % 32 == 0 && (tid - CONSUMERS) / 32 < PRODUCERS) produce(xmap, a, s, base, bars, (tid - CONSUMERS) / 32);
            if (splits_a_tile) cluster_sync(), cluster_sync();  // epilogue_split's two barriers
            return;
        }
        setmaxnreg_inc<232>();
        trace_stamp(a.trace, TRACE_ENTRY);
        // DEPENDENT LAUNCH: nothing the previous kernel may read or write (y, bias, the partials, the counters) is
        // touched before it has finished.
        wait_for_prerequisite_grids();
        Ring ring{0, 0};
        if (a.trace) mbar_wait(bars, 0), trace_stamp(a.trace, TRACE_FIRST_FULL);
        int taken = 0;
        // STAGGER (LAG > 0): warpgroup 1 starts once warpgroup 0 has done LAG k tiles of its first item (or all of
        // them, if fewer). The lag then persists, since each gains on the other while that one is in its epilogue;
        // it costs the leader LAG stages of prefetch.
        if (LAG > 0 && wg == 1) named_barrier_sync(STAGGER_BARRIER, CONSUMERS);
        // Persistent: the grid is at most one CTA per SM (Cursor). A CTA's split item is its last (the host's
        // rule), so the shared-memory epilogue, which reuses the stages, never races the producer.
        Work w;
        for (Cursor items(s); items.next(s, w);) {
            float acc[2][ACC];  // written by the first wgmma (accumulate = 0)
            const int arrive_kt = LAG > 0 && wg == 0 && taken == 0 ? min(w.kt0 + LAG, w.kt1) - 1 : -1;
            mainloop(s, base, bars, w.nt, w.kt0, w.kt1, wg, arrive_kt, ring, acc);
            if (KSPLIT) exchange_halves(base + STAGES * STAGE_BYTES + STAGING_BYTES, wg, w.kt1 - w.kt0 < 2, acc);
            if (taken == 0) trace_stamp(a.trace, TRACE_MAINLOOP_END);
            // One compile-time activation per launch keeps the unrolled epilogue small (see activate). A
            // convolution clamps at most (none/relu/relu6): its variants leave GELU and SiLU out.
            switch (s.activation) {
                case ACT_RELU: finish_item<ACT_RELU>(a, s, base, w, wg, acc); break;
                case ACT_RELU6: finish_item<ACT_RELU6>(a, s, base, w, wg, acc); break;
                case ACT_GELU: if (!CONV) finish_item<ACT_GELU>(a, s, base, w, wg, acc); break;
                case ACT_SILU: if (!CONV) finish_item<ACT_SILU>(a, s, base, w, wg, acc); break;
                default: finish_item<ACT_NONE>(a, s, base, w, wg, acc); break;
            }
            if (taken++ == 0) trace_stamp(a.trace, TRACE_ITEM_END);
        }
        trace_exit(a.trace, taken);
    }
};

#endif  // sm_90

}  // namespace w4a16_gemm
}  // namespace lowbit

// ------------------------------------------------------------------------------------------------------------------
// Entry point of the variant selected by the host's #defines
// ------------------------------------------------------------------------------------------------------------------
#ifndef LB_DTYPE  // no variant selected (`lowbit doctor --compile-only`): the g128 f16 kernel with zeros
#define LB_DTYPE F16
#define LB_ZEROS 1
#define LB_WG_N 2
#define LB_WG_TOKENS 128
#define LB_STAGES 4
#define LB_UNIT_GROUPS 1
#endif
#ifndef LB_CONV
#define LB_CONV 0
#endif
#ifndef LB_LOOKAHEAD
#define LB_LOOKAHEAD 2
#endif
#ifndef LB_WBITS
#define LB_WBITS 4
#endif
#ifndef LB_RAMP
#define LB_RAMP 0
#endif
#ifndef LB_LAG
#define LB_LAG 0
#endif
#ifndef LB_KSPLIT
#define LB_KSPLIT 0
#endif
#ifndef LB_UNIT_N
#define LB_UNIT_N (128 * LB_WG_N)
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
typedef lowbit::w4a16_gemm::Gemm<lowbit::LB_DTYPE, LB_ZEROS, LB_WG_N, LB_WG_TOKENS, LB_STAGES, LB_UNIT_GROUPS != 0,
                                 LB_CONV != 0, LB_LOOKAHEAD, LB_WBITS, LB_RAMP, LB_LAG, LB_KSPLIT != 0, LB_UNIT_N>
    GemmVariant;

extern "C" __global__ void __launch_bounds__(GemmVariant::BLOCK, 1)
    w4a16_gemm(const __grid_constant__ lowbit::TensorMap xmap, lowbit::w4a16_gemm::Args args,
               lowbit::w4a16_gemm::Shape shape) {
    GemmVariant::run(&xmap, args, shape);
}
#endif

// ------------------------------------------------------------------------------------------------------------------
// Dequantize + cuBLAS path of QuantLinear (any GPU): the repacked weight back to a dense [N, K] matrix of T, and the
// bias + activation pass after the dense GEMM
// ------------------------------------------------------------------------------------------------------------------

namespace lowbit {
namespace w4a16_gemm {

// One CTA per (column tile, k tile): every piece of the unit (and, for an 8-bit weight stored as two int4 planes,
// of its low-plane partner unit K / 128 tiles on; `wbits` 8: the int8 layout, two 16-byte pieces per lane and
// 32-k chunk) is converted to fp32 (q - z) * s, the planes summed, rounded once
// to T into a shared [N_CTA][128] tile, which is then written to dense[n][k] in coalesced 16-byte chunks -- the
// fragment order of the repacked words would otherwise scatter 4-byte stores over 8 rows (a third of copy speed).
constexpr int DENSE_PITCH = K_TILE + 8;  // shared tile row pitch (elements): +16 B spreads rows over banks

template <class T, int N_CTA>
__device__ __forceinline__ void dequantize_repacked(const uint4* qweight, const u16* scales, const u8* zeros,
                                                    u16* dense, int N, int K, int KT, int group, int GP,
                                                    int planes, int wbits) {
    extern __shared__ __align__(16) u16 tile[];  // [N_CTA][DENSE_PITCH]
    constexpr int PIECES = N_CTA * 4;              // 16-byte pieces per unit
    const int kt_in = KT / planes;                 // k tiles of the dense output
    const int nt = blockIdx.x / kt_in, kt = blockIdx.x - nt * kt_in;
    for (int piece = threadIdx.x; piece < PIECES; piece += blockDim.x) {
        const int warp = piece >> 7, kc = (piece >> 5) & 3, lane = piece & 31, g = lane >> 2, t = lane & 3;
        float v[2][2][4][2];  // [ks][tile][register][half]: fp32 (q - z) * s summed over the planes
        for (int plane = 0; plane < planes; ++plane) {
            const int ktp = kt + plane * kt_in;
            const size_t unit = (size_t)nt * KT + ktp;
            // int8 layout: step s of warp w at 16-byte piece w * 256 + s * 32 + lane of the unit.
            const uint4 wq = wbits == 8 ? make_uint4(0, 0, 0, 0) : qweight[unit * PIECES + piece];
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const size_t prow = (size_t)nt * GP + (ktp * K_TILE + kc * 32 + ks * 16) / group;
                const uint2 sv = *reinterpret_cast<const uint2*>(scales + prow * N_CTA + warp * 32 + g * 4);
                u32 lo[2], hi[2];
                uint4 w8 = make_uint4(0, 0, 0, 0);
                if (wbits == 8) {
                    w8 = qweight[unit * PIECES * 2 + warp * 256 + (kc * 2 + ks) * 32 + lane];
                    const u32 z4 = zeros ? *reinterpret_cast<const u32*>(zeros + prow * N_CTA + warp * 32 + g * 4)
                                         : 0x80808080u;
                    FragmentOps<F16>::zero_terms8(z4, lo, hi);
                } else {
                    u32 z = 0x8888u;
                    if (zeros)
                        z = *reinterpret_cast<const unsigned short*>(zeros + prow * (N_CTA / 2) + warp * 16 + g * 2);
                    FragmentOps<T>::zero_terms(z * 0x10001u, lo, hi);
                }
                const float2 s[2] = {FragmentOps<T>::scale_pair(sv.x), FragmentOps<T>::scale_pair(sv.y)};
#pragma unroll
                for (int tl = 0; tl < 2; ++tl) {
                    const u32 word = ks == 0 ? (tl == 0 ? wq.x : wq.y) : (tl == 0 ? wq.z : wq.w);
                    // exact (q - z) pairs (fp16 pairs for 8-bit codes, whatever T)
                    const uint4 q = wbits == 8 ? FragmentOps<F16>::dequant8(tl == 0 ? w8.x : w8.z,
                                                                            tl == 0 ? w8.y : w8.w, lo[tl], hi[tl])
                                               : FragmentOps<T>::dequant(word, lo[tl], hi[tl]);
                    const u32 r[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        // Registers 0, 2 are row g (scale .x), 1, 3 row g + 8 (scale .y).
                        const float sc = (i & 1) ? s[tl].y : s[tl].x;
                        const float2 d = wbits == 8 ? FragmentOps<F16>::pair_to_f32(r[i])
                                                    : FragmentOps<T>::pair_to_f32(r[i]);
                        v[ks][tl][i][0] = (plane ? v[ks][tl][i][0] : 0.0f) + d.x * sc;
                        v[ks][tl][i][1] = (plane ? v[ks][tl][i][1] : 0.0f) + d.y * sc;
                    }
                }
            }
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
#pragma unroll
            for (int tl = 0; tl < 2; ++tl)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = warp * 32 + tl * 16 + g + (i & 1) * 8, col = kc * 32 + ks * 16 + 2 * t + (i >> 1) * 8;
                    const u32 packed = (u32)FragmentOps<T>::from_f32(v[ks][tl][i][0]) |
                                       ((u32)FragmentOps<T>::from_f32(v[ks][tl][i][1]) << 16);
                    *reinterpret_cast<u32*>(tile + row * DENSE_PITCH + col) = packed;
                }
    }
    __syncthreads();
    constexpr int CHUNKS = K_TILE / 8;  // 16-byte chunks per tile row
    const bool vector = (K & 7) == 0;
    for (int i = threadIdx.x; i < N_CTA * CHUNKS; i += blockDim.x) {
        const int row = i / CHUNKS, c = i - row * CHUNKS;
        const int n = nt * N_CTA + row, k = kt * K_TILE + c * 8;
        if (n >= N || k >= K) continue;
        const u16* src = tile + row * DENSE_PITCH + c * 8;
        u16* dst = dense + (size_t)n * K + k;
        if (vector) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
            for (int e = 0; e < 8 && k + e < K; ++e) dst[e] = src[e];
        }
    }
}

}  // namespace w4a16_gemm
}  // namespace lowbit

// dense[N][K] (K: the layer's input width; positions in k order, so the weight must have no act-order) from the
// repacked weight, `planes` = 2 for an 8-bit weight stored as two int4 planes (K a multiple of 128), `wbits` 8 for
// the int8 layout (fp16 pairs, so only with scales of the layer's type; any T); zeros may be null. Grid: column tiles x (KT / planes) CTAs of 256 threads, N_CTA * (128 + 8) * 2 bytes of shared memory.
#define LB_DEQUANTIZE_REPACKED(NAME, T)                                                                            \
    extern "C" __global__ void NAME(const uint4* qweight, const unsigned short* scales, const unsigned char* zeros, \
                                    unsigned short* dense, int N, int K, int KT, int group, int GP, int n_cta,     \
                                    int planes, int wbits) {                                                       \
        using lowbit::w4a16_gemm::dequantize_repacked;                                                            \
        const int p = planes, b = wbits;                                                                           \
        if (n_cta == 256) dequantize_repacked<T, 256>(qweight, scales, zeros, dense, N, K, KT, group, GP, p, b);  \
        if (n_cta == 128) dequantize_repacked<T, 128>(qweight, scales, zeros, dense, N, K, KT, group, GP, p, b);  \
        if (n_cta == 64) dequantize_repacked<T, 64>(qweight, scales, zeros, dense, N, K, KT, group, GP, p, b);    \
    }
LB_DEQUANTIZE_REPACKED(w4a16_dequantize_repacked_f16, lowbit::F16)
LB_DEQUANTIZE_REPACKED(w4a16_dequantize_repacked_bf16, lowbit::BF16)
#undef LB_DEQUANTIZE_REPACKED

// y[m][n] = act(y[m][n] + bias[n]) in fp32, one rounding: after a dense GEMM that wrote y without them, or after the
// decode kernel above the rows its stores fuse the activation for. Rows along y, columns along x (no division).
// DEPENDENT LAUNCH (sm_90, when the host asks for it): its CTAs may be resident while the kernel that writes y still
// runs, and wait for it before the first read; they let the next kernel launch at once, so the next layer's decode
// kernel issues its first weight copies under this pass, as it does after another decode launch.
template <class T>
__device__ __forceinline__ void bias_activation(unsigned short* y, long long y_stride, const unsigned short* bias, int M,
                                                int N, int activation) {
    typedef lowbit::FragmentOps<T> Ops;
    lowbit::wait_for_prerequisite_grids();
    lowbit::allow_dependent_launch();
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        unsigned short* row = y + m * y_stride;
        for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
            const float b = bias ? Ops::to_f32(bias[n]) : 0.0f;
            row[n] = Ops::from_f32(lowbit::apply_activation(Ops::to_f32(row[n]) + b, activation));
        }
    }
}
extern "C" __global__ void w4a16_bias_activation_f16(unsigned short* y, long long y_stride, const unsigned short* bias,
                                                     int M, int N, int activation) {
    bias_activation<lowbit::F16>(y, y_stride, bias, M, N, activation);
}
extern "C" __global__ void w4a16_bias_activation_bf16(unsigned short* y, long long y_stride, const unsigned short* bias,
                                                      int M, int N, int activation) {
    bias_activation<lowbit::BF16>(y, y_stride, bias, M, N, activation);
}

// x gathered through the act-order permutation and/or re-laid out for TMA (16-byte aligned rows of k_pad).
extern "C" __global__ void w4a16_gemm_stage_x(const unsigned short* x, long long x_stride, const unsigned int* perm,
                                              unsigned short* out, int M, int K, int k_pad) {
    lowbit::stage_x(x, x_stride, perm, out, M, K, k_pad);
}

#if !(defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
// wgmma and TMA tensor copies are sm_90a features; older GPUs use the decode kernel or dequantize + cuBLAS.
extern "C" __global__ void w4a16_gemm(const lowbit::TensorMap xmap, lowbit::w4a16_gemm::Args args,
                                      lowbit::w4a16_gemm::Shape shape) {
    __trap();
}
#endif
