// W4A16 linear for decode (M = 1..64): y[M, N] = x[M, K] · W^T (+ bias), W int4 with group scales and zeros,
// x/y fp16 or bf16, fp32 accumulation on the tensor cores (mma.sync m16n8k16, or wgmma: see WGMMA). Host side:
// src/ops/linear/cuda.rs.
//
// Design (decode is a memory problem: every weight byte is read once, everything else is bookkeeping):
//
// * The WEIGHT IS THE "A" OPERAND. mma.m16n8k16 multiplies A[16 x 16] by B[16 x 8]. We feed 16 output columns n
//   as the 16 rows of A and up to 8 tokens as the 8 columns of B (B = x^T). At M <= 8 one mma covers 16 n x 16 k,
//   half the instructions of the usual orientation, and M = 64 is 8 mmas on the same converted A fragment, so the
//   weight bytes and the int4 -> fp16 work do not grow with M.
//
// * REPACKED WEIGHT (done once on the host, see cuda.rs `repack`): a thread's A fragment of m16n8k16 is 8 values,
//   rows {g, g+8} x columns {2t, 2t+1, 2t+8, 2t+9} (g = lane / 4, t = lane % 4). The host stores exactly those 8
//   codes in one 32-bit word, nibble order [a0 a2 a4 a6 a1 a3 a5 a7] (a0 = (g, 2t), a1 = (g, 2t+1), a2 = (g+8, 2t),
//   ...), the AWQ interleave: one lop3 with mask 0x000f000f lifts nibbles 0 and 4 into the two halves of a
//   register, i.e. the pair (a0, a1) as packed fp16, ready for mma with no shuffles (FragmentOps<T>::dequant).
//   Four such words (two 16-row tiles x two k16 steps) form the lane's 16 bytes, and the 32 lanes' 16-byte pieces
//   are contiguous: every global load is a coalesced 16-byte cp.async and every shared read an ld.shared.v4 of
//   512 consecutive bytes per warp (no bank conflicts, no ldmatrix needed for the weight).
//
// * UNITS AND STREAM-K. The weight is cut into units of N_CTA columns x 128 k (16 KB at N_CTA = 256), stored
//   unit after unit in (n_tile, k_tile) order. CTA c of C (C = #SMs, one CTA per SM) streams the contiguous units
//   [c U / C, (c+1) U / C): every SM moves the same number of bytes whatever N is, so a 4096-wide layer fills all
//   132 SMs. A tile whose k range is split between CTAs is finished by a fix-up, warp by warp (a warp's 32 columns
//   are its own): each writes its fp32 partial to a workspace slot and bumps its (tile, warp) counter, and the last
//   to arrive sums the partials in CTA order (lowest k first) -- the same order whoever arrives last, so repeated
//   runs are byte-identical. The partition depends only on the shape and the SM count, never on M, so row 0 of an
//   M-row batch is bit-identical to M = 1.
//
// * CLUSTER SPLIT-K. The global fix-up costs GPU-scope round trips: a release behind the partial's stores, the
//   counter, then the last warp's loads of every partial (~5 us of a 10 us launch at 4096 x 4096, where each tile
//   is split 8 ways; examples/gemm_trace). When the tiles times a split count fill the GPU (the host decides:
//   `splits` > 1), CTA c takes split c % splits of tile c / splits, the equal k ranges of a tile are one thread-
//   block cluster, and the partials meet in shared memory (cluster_reduce): no global traffic but y. A variant
//   whose clusters cannot all be resident at once (M > 16 on an H200: one CTA per SM) keeps the same partition
//   and reduces through the global fix-up, in the same order: every M gives the same bits.
//
// * DEPENDENT LAUNCH (sm_90; the host launches with programmatic stream serialization). Every CTA lets the next
//   kernel launch at once (griddepcontrol.launch_dependents), so its CTAs take SMs as this launch's CTAs exit: the
//   tail of one launch (the slowest CTAs, the fix-ups) overlaps the start of the next. In turn, this kernel's
//   producer issues its first stages' weight copies (the operator's own, never written by a kernel) before it
//   waits for the previous kernel (griddepcontrol.wait), and their x copies after; the mma warps wait before
//   anything else, since they write y, the partials and the counters, which the previous launch may still use.
//   Without the attribute (older GPUs, graphs that do not keep it) the wait returns at once.
//
// * PIPELINE. Each unit is one shared-memory stage (weights, the x rows, the scale and zero rows it touches).
//   M <= 32 on sm_90 (LB_TMA): a ninth "producer" warp fills stages with TMA copies (one cp.async.bulk for the 16 KB
//   unit, one for the scale rows, one for the zero rows, one 2D tensor copy for the x rows), each stage guarded by a
//   "full" mbarrier (expect_tx bytes) and an "empty" one (all consumer threads arrive after reading), so the mma warps
//   spend no instructions on address math and never meet at a CTA barrier. M = 64, and every M before sm_90,
//   uses cp.async by every thread with one __syncthreads per stage (M = 64: its 8 warps use ~230 registers; a
//   ninth warp would cap them at 224).
//   The grid is one or two CTAs per SM, chosen from the shape alone (two when each CTA still gets >= 6 units).
//   Depth (host: Variant::default_for): 3 stages with two CTAs per SM; deeper was slower on H200 (8192 x 28672,
//   M = 1: 39.4 us at 3, 41.7 at 4, 46.6 at 6). When the group size is a multiple of 128 (LB_UNIT_GROUPS) a stage
//   holds one scale/zero row instead of eight (19 KB instead of 23 KB at M <= 8).
//   Measured on H200 (M = 1, 8192 x 28672): the cp.async version was issue-bound at 74.7 us (IPC ~0.4 with 2
//   warps per scheduler and a barrier per unit); TMA + 2 CTAs/SM gives 47 us.
//
// * DEQUANT WITHOUT THE SCALE. Decode is bound by instructions per weight (ncu: issue slots 65% busy, DRAM 44%),
//   so the per-weight path is only: one lop3 per pair of codes (plus one shift per word), one f16x2 sub / fma
//   that yields (q - z) exactly (the zero is folded into the magic-number constant, see FragmentOps<T>::dequant), and the
//   mma. (q - z) is a small integer, exact in fp16 and bf16. Each group's products go into a per-group fp32
//   accumulator, started by the group's first mma with C = 0; at the group's end (or the unit's end) the scale is
//   applied once per accumulator: acc = fma(acc_g, s[row], acc). With the weight as the A operand the scale is
//   per accumulator row, so that is 8 * MT FFMAs per group per thread instead of 4 HMUL2 per 8 weights. The
//   result is at least as accurate as multiplying round((q - z) * s) (the products are now exact), integer
//   inputs with power-of-two scales are still exact, and the order of every sum depends on the shape only.
//
// * SCALE/ZERO LAYOUT. Per tile and group row, each warp's 32 columns are stored lane-group first: for g = 0..7
//   the four columns (tile 0, row g), (tile 0, row g + 8), (tile 1, row g), (tile 1, row g + 8), i.e. exactly the
//   four accumulator rows of lane g*4..g*4+3 (cuda.rs `param_slot`). A lane reads its four scales with one 8-byte
//   ld.shared and its four zero codes with one 16-bit ld.shared, and forms all its zero terms with ~8 ALU ops.
//
// * OFFSETS (a 1x1 convolution of pooled features, src/ops/conv/cuda/gemv.rs). Per-block convolution weights are
//   q·s + o with a real offset o, which no integer zero point expresses. The codes stay symmetric (q + midpoint,
//   converted as usual) and o enters per group as o · sum(x over the group): one more mma per k16 step, an
//   all-ones A fragment times the x fragment, gives every token's sum in fp32, exactly as the weight products are
//   summed. The zero rows of a stage carry the offsets (fp16/bf16, the scales' layout). M <= 16 only.
//
// * WGMMA (sm_90a, TMA variants, M <= 32; the host's default at M = 17..32). mma.sync issues one mma per 8 tokens
//   per fragment, so at M = 32 four per converted fragment, and the tensor pipe's issue becomes the limit. With
//   wgmma.m64n(8 MT)k16 the warpgroup's four warps issue one instruction per tile and step whatever M, the A
//   fragment straight from the conversion's registers and x from shared memory (two 64-k boxes per stage in the
//   128-byte swizzle): 8192 x 28672 at M = 32 takes 62-63 us against 67-68 (H200). At M <= 16 the two are within
//   noise of each other or mma.sync is faster (compute_stage_wgmma). Same products, same sums, same bits.
//
// * GATHERED TILES (GATHER; int4, groups of 128 k or more). 8192 x 28672 has 112 tiles of 256 columns: two splits
//   make 224 CTAs and leave 40 SMs one CTA, so the busiest SMs move 18% more than their share; stream-K balances
//   the bytes but pays a global fix-up (H200: ~5 us of a 35 us launch). A kernel tile of WARPS = 7 warps (224
//   columns) gives 128 tiles, whose 256 splits fill 128 SMs (as PAIRED CTAs, below). The weight keeps its 256-column
//   units: kernel tile nt is the 32-column slices [7 nt, 7 nt + 7) of the stored ones, which lie in one stored
//   tile or run into the next. Each is a warp's contiguous 2 KB of a unit (and its 64 bytes of scales, 16 of
//   zeros, of a row), so a stage is at most two copies of each, landing where a 224-column unit would have them.
//   Up to 16 rows only (host: GATHER_MAX_MT): above, the stored tiles' two splits (the same k ranges, hence the same
//   bits) take wgmma at M = 17..32, which needs whole warpgroups.
//
// * BOTH SPLITS IN ONE CTA (PAIRED; gathered tiles). Two CTAs on one SM do not progress alike: the SM favours the
//   warps of the CTA it started first. As clusters of two CTAs, two per SM (H200, 8192 x 28672, M = 16), each SM's
//   first CTA ends its k range at ~28 us and its second at ~36 us, and for those last 8 us one CTA's warps cannot
//   keep the SM's share of DRAM busy (examples/gemm_trace's per-CTA timelines). A PAIRED CTA holds one tile's two
//   splits: warps [0, WARPS) take the first half of k and warps [WARPS, 2 WARPS) the second. Each half has a ring
//   of STAGES / 2 stages and a producer warp of its own. (With one producer feeding both rings in turn, each half
//   went at the slower one's pace: 42.8 us at M = 1.) The halves now end within ~1 us of each other, and the
//   launch takes 31.1 us against 32.3 at M = 1 and 37.0 against 38.1 at M = 16. The second half hands its
//   partial to the first through shared memory (the RECEIVE area), which adds it as cluster_reduce does
//   (split 0 + split 1), so the bits are those of the cluster form and of the stored tiles above 16 rows.
//
// The host prepends the #defines selecting one variant (LB_DTYPE, LB_MT, LB_ZEROS, LB_OFFSETS, LB_WARPS, LB_STAGES,
// LB_TMA, LB_MIN_BLOCKS, LB_UNIT_GROUPS, LB_RECEIVE, LB_WBITS, LB_WGMMA, LB_ACTIVATION, LB_GATHER, LB_PAIRED) and
// launches the extern "C" kernels at the bottom.
#include "common.cuh"

namespace lowbit {
namespace w4a16 {

typedef unsigned char u8;

constexpr int K_TILE = 128;          // k per unit (= per pipeline stage)
constexpr int WARP_N = 32;           // output columns per warp: two 16-row A tiles
constexpr int X_PITCH = K_TILE + 8;  // x row pitch in smem (halves): +16 B puts the 8 rows an ldmatrix reads in
                                     // 8 different 4-bank groups (a 256 B pitch would be an 8-way conflict)
constexpr int MAX_GROUP_ROWS = 8;     // groups a 128-k unit can touch (group sizes are multiples of 16)


// ------------------------------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------------------------------

// Problem description shared by the kernels (passed by value).
struct Shape {
    int M;           // tokens (rows of x and y), 1..MT*8
    int N;           // output columns (y has N valid columns)
    int K;           // input columns of x (valid k; the weight is zero-padded to KT * 128)
    int KT;          // k tiles (units per n tile)
    int NT;          // n tiles
    int group;       // k per scale group in the repacked (act-order sorted) k space, a multiple of 16
    int GP;          // scale/zero rows per n tile
    int ctas;        // grid size C
    int group_shift; // log2(group) when it is a power of two, else -1
    int splits;      // > 1: equal k splits per tile (see CLUSTER SPLIT-K), ctas = NT * splits; 1: stream-K
    int cluster;     // with splits > 1: 1 = launched as clusters of `splits`, reduced in shared memory; 0 = the
                     // global fix-up, same partition and summation order (the variants whose clusters do not fit)
    long long x_stride;  // elements between rows of x
    long long y_stride;  // elements between rows of y
    int clamp;           // 1: outputs are clamped to [lo, hi] after the bias (relu, relu6 of a convolution)
    float lo, hi;
    int act;             // an Activation (common.cuh) applied after the bias and clamp: QuantLinear's epilogue
};

// The stored value of an output: fp32 sum + bias, clamped when asked, then the activation when the variant has one
// (ACTIVATION); one rounding follows. The clamp is written out (not fminf/fmaxf) so that a NaN passes through, as in
// the convolution's reference.
// The activation is a call, not inlined: inlined at every unrolled store element (erff and expf included) it
// pushed NVRTC's compile time of the decode variants from 47 to 123 s.
__device__ __noinline__ float activation_call(float v, int act) { return apply_activation(v, act); }
template <bool ACTIVATION>
__device__ __forceinline__ float finish(const Shape& s, float v) {
    v = s.clamp ? (v < s.lo ? s.lo : (v > s.hi ? s.hi : v)) : v;
    if constexpr (ACTIVATION) v = s.act != ACT_NONE ? activation_call(v, s.act) : v;
    return v;
}

// UNIT_GROUPS: the group size is a multiple of 128 (g128, per channel, ...), so each unit lies in one group: a
// stage holds one scale/zero row instead of MAX_GROUP_ROWS (more stages fit) and no group boundary is checked.
// WBITS: bits per weight code, 4, or 8 for the int8 layout (fp16 only; see INT8 CODES).
// OFFSETS: each weight is (q - midpoint)·s + o with a real per-group offset o (a convolution's per-block weights,
// routed here at batch 1: see OFFSETS below); the zero rows of a stage then hold the offsets, in T like the scales.
template <class T, int MT, bool HAS_ZEROS, bool OFFSETS, int WARPS, int STAGES, bool TMA, bool UNIT_GROUPS,
          bool RECEIVE, int WBITS, bool WGMMA, bool ACTIVATION, bool GATHER, bool PAIRED>
struct Linear {
    static_assert(WBITS == 4 || (WBITS == 8 && T::MAGIC == F16::MAGIC), "int8 codes: fp16 activations only");
    static_assert(!OFFSETS || (!HAS_ZEROS && MT <= 2), "offsets: symmetric codes, M <= 16");
    // ACTIVATION: Shape::act is applied in the stores (QuantLinear's epilogue), in the mma.sync variants of M <= 16
    // only. Above 16 rows the per-element call cost more than the separate pass it saves (H200, 4096² at M = 64:
    // 19.7 -> 27.9 µs with silu); the offset-form variant (a convolution's, which clamps instead) and the wgmma ones
    // of M <= 16 spilled 8 bytes with it at 96 registers. A variant of its own, so that the others pay nothing.
    static_assert(!ACTIVATION || (!OFFSETS && !WGMMA && MT <= 2), "activation: mma.sync variants of M <= 16");
    static_assert(!WGMMA || (TMA && !OFFSETS && MT <= 4 && WARPS % 4 == 0),
                  "wgmma: the TMA pipeline, no offsets, M <= 32, whole warpgroups");
    static_assert(!GATHER || (WARPS < 8 && UNIT_GROUPS && !OFFSETS && WBITS == 4),
                  "gathered tiles: fewer warps than the stored 8, int4 with zeros or none, groups of 128 k or more");
    static_assert(!PAIRED || (GATHER && TMA && RECEIVE && STAGES % 2 == 0),
                  "both splits in one CTA: gathered tiles, the TMA pipeline, a ring of STAGES / 2 per half");
    static constexpr int THREADS = WARPS * 32;           // consumer (mma) threads of one k split
    // PAIRED: two k splits, each with its ring of RING stages (otherwise one ring of all STAGES).
    static constexpr int RINGS = PAIRED ? 2 : 1, RING = STAGES / RINGS;
    static constexpr int CONSUMERS = THREADS * RINGS;
    static constexpr int BLOCK = CONSUMERS + (TMA ? 32 * RINGS : 0);  // + a producer warp per ring (TMA copies)
    static constexpr int N_CTA = WARPS * WARP_N;
    static constexpr int M_ROWS = MT * 8;
    // Bytes of one stage: weights, x rows, scale rows, zero rows (each a multiple of 16).
    static constexpr int W_BYTES = N_CTA * K_TILE * WBITS / 8;
    // x rows: at the padded pitch for ldmatrix, or (WGMMA) as two 64-k boxes of M_ROWS rows in the 128-byte swizzle.
    static constexpr int X_BYTES = WGMMA ? M_ROWS * K_TILE * 2 : M_ROWS * X_PITCH * 2;
    static constexpr int GROUP_ROWS = UNIT_GROUPS ? 1 : MAX_GROUP_ROWS;  // scale/zero rows per stage
    static constexpr int S_BYTES = GROUP_ROWS * N_CTA * 2;
    // Zero codes (or offsets) of one group row.
    static constexpr int Z_ROW_BYTES = OFFSETS ? N_CTA * 2 : HAS_ZEROS ? N_CTA * WBITS / 8 : 0;
    static constexpr int Z_BYTES = GROUP_ROWS * Z_ROW_BYTES;
    // Rounded up to 128 bytes: the x rows of every stage (after the weights) are the destination of a TMA tensor
    // copy, which needs a 128-byte aligned address; to 1024 bytes in the 128-byte swizzle (WGMMA), whose pattern
    // the copy and wgmma's descriptor both derive from the address.
    static constexpr int STAGE_ALIGN = WGMMA ? 1024 : 128;
    static constexpr int STAGE_BYTES = (W_BYTES + X_BYTES + S_BYTES + Z_BYTES + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    static_assert(W_BYTES % STAGE_ALIGN == 0, "the x rows of a stage must stay aligned");
    // GATHER: the stored units' warps (256 columns), and one warp's share of a unit / of a scale or zero row.
    static constexpr int STORED_WARPS = GATHER ? 8 : WARPS;
    static constexpr int CHUNK = W_BYTES / WARPS;
    static constexpr int S_CHUNK = WARP_N * 2, Z_CHUNK = WARP_N * WBITS / 8;
    // fp32 partial sums of one split tile, in accumulator-fragment order (see write_partial).
    static constexpr int SLOT_FLOATS = N_CTA * M_ROWS;
    // Stages, then (TMA) one full and one empty mbarrier per stage, then (RECEIVE) cluster_reduce's area.
    static constexpr int RECEIVE_OFFSET = STAGES * STAGE_BYTES + (TMA ? STAGES * 16 : 0);
    // WGMMA: + 1 KB of slack to align the stages' base to 1024 bytes.
    static constexpr int SMEM_BYTES = RECEIVE_OFFSET + (RECEIVE ? SLOT_FLOATS * 4 : 0) + (WGMMA ? 1024 : 0);

    struct Args {
        const uint4* qweight;  // repacked codes, W_BYTES per unit, units in (n_tile, k_tile) order
        const u16* scales;     // [NT][GP][N_CTA] bits of T, columns in param_slot order (header)
        const u8* zeros;       // [NT][GP][Z_ROW_BYTES] zero codes in param_slot order (4-bit: low nibble first),
                               // or with OFFSETS the offsets, bits of T laid out like the scales
        const u16* x;          // [M][x_stride] bits of T
        const u16* bias;       // [N] bits of T, or null
        u16* y;                // [M][y_stride] bits of T
        float* partials;       // [2 * ctas][SLOT_FLOATS]
        u32* counters;         // [NT][WARPS], zero between launches (a tile's last warp resets its counter)
        u64* trace;            // diagnostics, normally null: TRACE_SLOTS timestamps per CTA (common.cuh, Trace)
    };

    // GATHERED TILES: where slice j (a warp's 32 columns) of kernel tile nt is stored: (stored tile, warp).
    __device__ static __forceinline__ int2 stored_slice(int nt, int j) {
        const int slice = nt * WARPS + j;
        return make_int2(slice / STORED_WARPS, slice % STORED_WARPS);
    }
    // ... and where that slice's codes of k tile kt, and its scales and zeros of group row g, begin.
    __device__ static __forceinline__ const uint4* stored_codes(const Args& a, const Shape& s, int2 at, int kt) {
        return a.qweight + ((size_t)(at.x * s.KT + kt) * STORED_WARPS + at.y) * (CHUNK / 16);
    }
    __device__ static __forceinline__ const u16* stored_scales(const Args& a, const Shape& s, int2 at, int g) {
        return a.scales + ((size_t)at.x * s.GP + g) * (STORED_WARPS * WARP_N) + at.y * WARP_N;
    }
    __device__ static __forceinline__ const u8* stored_zeros(const Args& a, const Shape& s, int2 at, int g) {
        return a.zeros + ((size_t)at.x * s.GP + g) * (STORED_WARPS * Z_CHUNK) + at.y * Z_CHUNK;
    }

    // CTA c streams units [unit_begin(c), unit_begin(c + 1)) (common.cuh's STREAM-K partition).
    __device__ static __forceinline__ int unit_begin(int c, int units, int ctas) {
        return (int)stream_unit_begin(c, units, ctas);
    }
    __device__ static __forceinline__ int cta_of(int u, int units, int ctas) { return stream_cta_of(u, units, ctas); }

    // Issues the cp.async copies of unit u = (nt, kt) into `stage`.
    __device__ static __forceinline__ void load_stage(const Args& a, const Shape& s, char* stage, int u, int nt,
                                                      int kt, int tid) {
        // Weights: the unit is contiguous, W_BYTES / 16 chunks of 16 B, THREADS consecutive chunks per pass.
        if constexpr (GATHER) {
#pragma unroll
            for (int j = 0; j < W_BYTES / 16 / THREADS; ++j) {
                const int c = tid + j * THREADS;
                cp_async16(stage + c * 16, stored_codes(a, s, stored_slice(nt, c / (CHUNK / 16)), kt) + c % (CHUNK / 16));
            }
        } else {
            const uint4* wsrc = a.qweight + (size_t)u * (W_BYTES / 16) + tid;
#pragma unroll
            for (int j = 0; j < W_BYTES / 16 / THREADS; ++j)
                cp_async16(stage + (tid + j * THREADS) * 16, wsrc + j * THREADS);
        }
        // x: 16 chunks of 8 elements per valid row; thread tid takes chunk tid % 16 of rows tid / 16 + i * (THREADS /
        // 16). Chunks past K are zero-filled without reading.
        const int k0 = kt * K_TILE;
        {
            const int j = tid & 15, k = k0 + j * 8;
            const bool in = k < s.K;
            char* xs = stage + W_BYTES + j * 16;
#pragma unroll
            for (int i = 0; i < (M_ROWS * 16 + THREADS - 1) / THREADS; ++i) {
                const int m = (tid >> 4) + i * (THREADS / 16);
                if (m < s.M) {
                    const u16* src = in ? a.x + (size_t)m * s.x_stride + k : a.x;
                    cp_async16(xs + m * (X_PITCH * 2), src, in ? 16 : 0);
                }
            }
        }
        // Scale (and zero) rows of the groups this unit touches.
        const int g_lo = k0 / s.group, rows = (k0 + K_TILE - 1) / s.group - g_lo + 1;
        const size_t row0 = (size_t)nt * s.GP + g_lo;
        char* ss = stage + W_BYTES + X_BYTES;
        constexpr int S_CHUNKS = N_CTA * 2 / 16;  // per row
        if constexpr (GATHER) {  // UNIT_GROUPS: one row; a warp's 64 bytes of scales, 16 of zeros
            for (int c = tid; c < S_CHUNKS; c += THREADS)
                cp_async16(ss + c * 16,
                           stored_scales(a, s, stored_slice(nt, c / (S_CHUNK / 16)), g_lo) + c % (S_CHUNK / 16) * 8);
            if (Z_ROW_BYTES > 0 && tid < WARPS)
                cp_async16(ss + S_BYTES + tid * 16, stored_zeros(a, s, stored_slice(nt, tid), g_lo));
            return;
        }
        for (int c = tid; c < rows * S_CHUNKS; c += THREADS)
            cp_async16(ss + c * 16, a.scales + row0 * N_CTA + c * 8);  // rows are contiguous in both places
        if (Z_ROW_BYTES > 0) {
            constexpr int Z_CHUNKS = Z_ROW_BYTES / 16;
            for (int c = tid; c < rows * Z_CHUNKS; c += THREADS)
                cp_async16(ss + S_BYTES + c * 16, a.zeros + row0 * Z_ROW_BYTES + c * 16);
        }
    }

    // The zero terms and scales of this lane's four accumulator rows for group row `row` of the stage: one 8-byte
    // and one 16-bit shared load (the SCALE/ZERO LAYOUT of the header puts a lane group's four values together).
    __device__ static __forceinline__ GroupTerms load_group(u32 stage, int row, int warp, int lane) {
        return load_group_terms<T, HAS_ZEROS, N_CTA, WBITS>(stage + W_BYTES + X_BYTES, S_BYTES, row, warp, lane);
    }

    // HOISTED (paired, 9..16 rows): a lane's addresses in a stage, as offsets from its start (its weight words, its x
    // rows for ldmatrix, its scales and zero codes: one group row, UNIT_GROUPS), computed once. Otherwise ptxas
    // rebuilds them from the thread index at every stage: ~15 of the ~265 instructions a warp issues per stage at
    // M = 16, a launch that runs at the power cap. A shuffle is opaque to it, so they stay in registers. Measured
    // (H200, 8192 x 28672, gemm_trace A/B): M = 16 36.8 -> 36.2 us, but M = 1 and 4 31.1 -> 31.5 and 31.5 -> 31.9,
    // so the M <= 8 variants keep the rebuild, as do the two-CTA ones (their register budget is 96). compute_stage
    // and load_group_terms keep their own copies of these expressions: in any other form ptxas allocated the other
    // variants' registers differently. Zero codes are 4-bit here (gathered tiles).
    static constexpr bool HOISTED = PAIRED && MT == 2;
    struct LaneOffsets {
        u32 w, x, s, z;
    };
    __device__ static __forceinline__ LaneOffsets lane_offsets(int warp, int lane) {
        const int g = lane >> 2;
        const u32 w = warp * (W_BYTES / WARPS) + lane * 16, x = W_BYTES + ((lane & 7) * X_PITCH + (lane >> 3) * 8) * 2;
        const u32 s = W_BYTES + X_BYTES + warp * 64 + g * 8, z = W_BYTES + X_BYTES + S_BYTES + warp * 16 + g * 2;
        return {__shfl_sync(0xffffffffu, w, lane), __shfl_sync(0xffffffffu, x, lane),
                __shfl_sync(0xffffffffu, s, lane), __shfl_sync(0xffffffffu, z, lane)};
    }

    // OFFSETS: this lane's four offsets of group row `row` ([tile][row g, g + 8]), one 8-byte load like the scales.
    __device__ static __forceinline__ void load_offsets(u32 stage, int row, int warp, int lane, float (&o)[2][2]) {
        const uint2 ov = lds64(stage + W_BYTES + X_BYTES + S_BYTES + row * (N_CTA * 2) + warp * 64 + (lane >> 2) * 8);
        const float2 o0 = FragmentOps<T>::scale_pair(ov.x), o1 = FragmentOps<T>::scale_pair(ov.y);
        o[0][0] = o0.x, o[0][1] = o0.y, o[1][0] = o1.x, o[1][1] = o1.y;
    }

    // Tiles per pass over a unit: both (one pass) while the group accumulators fit in registers next to `acc`;
    // at M = 64 one tile per pass (the unit's words and x fragments are read from shared memory twice).
    static constexpr int T_PASSES = MT >= 8 ? 2 : 1;
    static constexpr int T_PER_PASS = 2 / T_PASSES;
    // x fragments loaded per k16 step instead of per 32-k chunk (M = 64: 16 registers fewer live).
    static constexpr bool X_PER_STEP = MT >= 8;

    // acc[t] += acc_g * scale of its row, for the tiles of pass `pass`: element i of a C fragment is row g
    // (i = 0, 1) or g + 8 (i = 2, 3). fmaf, so every variant rounds the same way (batch invariance).
    __device__ static __forceinline__ void apply_scales(float (&acc)[2][MT][4], const float (&acc_g)[T_PER_PASS][MT][4],
                                                        const GroupTerms& gt, int pass) {
#pragma unroll
        for (int tt = 0; tt < T_PER_PASS; ++tt)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = pass * T_PER_PASS + tt;
                    acc[t][mt][i] = __fmaf_rn(acc_g[tt][mt][i], gt.s[t][i >> 1], acc[t][mt][i]);
                }
    }

    // OFFSETS: acc[t] += o of its row * the group's sum of x over the token (element i is token 2(lane%4) + i%2,
    // whatever the row: every row of the ones-mma's result is the same sum).
    __device__ static __forceinline__ void apply_offsets(float (&acc)[2][MT][4], const float (&xs_g)[MT][4],
                                                         const float (&o)[2][2]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[t][mt][i] = __fmaf_rn(xs_g[mt][i], o[t][i >> 1], acc[t][mt][i]);
    }

    // One unit: 8 k16 steps x 2 tiles x MT token tiles of mma on (q - z), into per-group accumulators that are
    // scaled into `acc` at each group end and at the unit's end (UNIT_GROUPS: the whole unit is group row 0).
    // Bit j set: a group starts at k16 step j of unit kt (j >= 1). The group row of step j is then the number of
    // bits set up to j, so no counter stays live across the steps.
    __device__ static __forceinline__ u32 group_starts(const Shape& s, int kt) {
        u32 starts = 0;
        if (!UNIT_GROUPS) {
            const int k0 = kt * K_TILE;
            const int g_lo = s.group_shift >= 0 ? k0 >> s.group_shift : k0 / s.group;
            for (int j = ((g_lo + 1) * s.group - k0) >> 4; j < K_TILE / 16; j += s.group >> 4) starts |= 1u << j;
        }
        return starts;
    }

    // Tile t's A fragment (q - z) of k16 step ks of a 32-k chunk whose 16 bytes are wq (8-bit codes: wq, wq1).
    // 4-bit codes: words step 0 tile 0, tile 1, step 1 tile 0, tile 1; 8-bit codes (INT8 CODES of
    // linear_w4a16_gemm.cu): 16 bytes per step, words 2t and 2t + 1 of tile t.
    __device__ static __forceinline__ uint4 fragment(const uint4& wq, const uint4& wq1, int ks, int t,
                                                     const GroupTerms& gt) {
        if (WBITS == 8) {
            const uint4 w8 = ks == 0 ? wq : wq1;
            return FragmentOps<F16>::dequant8(t == 0 ? w8.x : w8.z, t == 0 ? w8.y : w8.w, gt.lo[t], gt.hi[t]);
        }
        const u32 word = ks == 0 ? (t == 0 ? wq.x : wq.y) : (t == 0 ? wq.z : wq.w);
        return FragmentOps<T>::dequant(word, gt.lo[t], gt.hi[t]);
    }

    __device__ static __forceinline__ void fence_group_sums(float (&acc_g)[2][MT][4]) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) wgmma_fence_operand(acc_g[t][mt][i]);
    }

    // WGMMA: the unit's 8 k16 steps as wgmma.m64n(8 MT)k16, A = this warp's fragment of a tile (the warpgroup's four
    // warps are its 64 rows), B = the stage's x boxes by descriptor. One instruction per tile and step whatever M,
    // and no x fragments in registers: at M = 9..16 the mma.sync path issues twice the mmas of M <= 8 (Nsight
    // Compute, 8192 x 28672 on H200: tensor pipe 17% -> 30% busy, math-throttle and dispatch stalls up by half).
    // A step's fragments sit in one of FRAG_BUFS buffers until its group retires, so FRAG_BUFS - 1 groups stay in
    // flight while the next step converts; the group sums are read only after wait<0>. The same products and the
    // same per-group fp32 sums as compute_stage, hence the same bits.
    // M <= 8: three buffers (a fourth spills at the 96 registers of two CTAs per SM).
    static constexpr int FRAG_BUFS = MT == 1 ? 3 : 4;
    __device__ static __forceinline__ void compute_stage_wgmma(u32 stage, const Shape& s, int kt, int warp, int lane,
                                                               float (&acc)[2][MT][4]) {
        // `stage` derives from consume's shuffled base, which ptxas knows to be warp-uniform: every step's
        // descriptor is built in uniform registers (otherwise two R2UR moves and a 64-bit add per wgmma, ~10% of
        // the instructions at M = 1).
        const u32 ws = stage + warp * (W_BYTES / WARPS) + lane * 16;
        const u64 x_desc = smem_desc_sw128(stage + W_BYTES);
        const u32 starts = group_starts(s, kt);
        GroupTerms gt = load_group(stage, 0, warp, lane);
        float acc_g[2][MT][4];
        uint4 frag[FRAG_BUFS][2];  // [step % FRAG_BUFS][tile]
        constexpr int CHUNK = WBITS == 8 ? 1024 : 512;  // bytes of a 32-k chunk per warp
        uint4 wq = WBITS == 4 ? lds128(ws) : make_uint4(0, 0, 0, 0), wq1 = wq;
#pragma unroll
        for (int kc = 0; kc < 4; ++kc) {
            // 4-bit codes: the next chunk's words are loaded before this chunk's wgmmas, which the asm statements'
            // memory clobbers would otherwise hold the load behind (8-bit codes: no registers left for it at M <= 8).
            uint4 nq = wq;
            if (WBITS == 8) {
                wq = lds128(ws + kc * CHUNK), wq1 = lds128(ws + kc * CHUNK + 512);
            } else if (kc < 3) {
                nq = lds128(ws + (kc + 1) * CHUNK);
            }
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                const int step = kc * 2 + ks, b = step % FRAG_BUFS;
                bool first = step == 0;  // the group's first product overwrites its sums
                if (!UNIT_GROUPS && (starts >> step) & 1) {  // warp-uniform: a group starts here
                    wgmma_wait<0>();
                    fence_group_sums(acc_g);
                    apply_scales(acc, acc_g, gt, 0);
                    gt = load_group(stage, __popc(starts & ((2u << step) - 1)), warp, lane);
                    first = true;
                }
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    frag[b][t] = fragment(wq, wq1, ks, t, gt);
                    wgmma_fence_operand(frag[b][t].x), wgmma_fence_operand(frag[b][t].y);
                    wgmma_fence_operand(frag[b][t].z), wgmma_fence_operand(frag[b][t].w);
                }
                // Step j reads k [16 j, 16 j + 16): box j / 4, 32 bytes per step inside its 128-byte rows (the
                // descriptor's address field counts 16-byte units).
                const u64 desc = x_desc + (((step >> 2) * (M_ROWS * 128) + (step & 3) * 32) >> 4);
                fence_group_sums(acc_g);
                wgmma_fence();
#pragma unroll
                for (int t = 0; t < 2; ++t)
                    wgmma_m64k16<T, MT * 8>(reinterpret_cast<float(&)[MT * 4]>(acc_g[t]), frag[b][t], desc, !first);
                wgmma_commit();
                fence_group_sums(acc_g);
                wgmma_wait<FRAG_BUFS - 1>();  // the buffer the next step fills is free
            }
            if (WBITS == 4) wq = nq;
        }
        wgmma_wait<0>();
        fence_group_sums(acc_g);
        apply_scales(acc, acc_g, gt, 0);
    }

    // HOISTED: `off` holds the lane's offsets (lane_offsets); the other variants derive them here.
    __device__ static __forceinline__ void compute_stage(u32 stage, const Shape& s, int kt, int warp, int lane,
                                                         const LaneOffsets& off, float (&acc)[2][MT][4]) {
        if constexpr (WGMMA) {
            compute_stage_wgmma(stage, s, kt, warp, lane, acc);
            return;
        }
        const u32 ws = HOISTED ? stage + off.w : stage + warp * (W_BYTES / WARPS) + lane * 16;
        // Row lane % 8 of a token tile at k offset 8 * (lane / 8) (x4: the four 8x8 matrices of a 32-k chunk).
        const u32 xs = HOISTED ? stage + off.x : stage + W_BYTES + ((lane & 7) * X_PITCH + (lane >> 3) * 8) * 2;
        auto group = [&](int row) {
            if constexpr (HOISTED) return group_terms_at<T, HAS_ZEROS, WBITS>(stage + off.s, stage + off.z);
            else return load_group(stage, row, warp, lane);
        };
        const u32 starts = group_starts(s, kt);
        // OFFSETS: the group's sums of x per token, by one more mma per k16 step with an all-ones A fragment.
        const uint4 ones = make_uint4(T::ONE, T::ONE, T::ONE, T::ONE);
        float xs_g[MT][4], offsets[2][2];
#pragma unroll
        for (int pass = 0; pass < T_PASSES; ++pass) {
            GroupTerms gt = group(0);
            if constexpr (OFFSETS) load_offsets(stage, 0, warp, lane, offsets);
            float acc_g[T_PER_PASS][MT][4];
#pragma unroll
            for (int kc = 0; kc < 4; ++kc) {
                // The chunk's 16 bytes (8-bit codes: 32; see `fragment`).
                const uint4 wq = lds128(ws + kc * (WBITS == 8 ? 1024 : 512));
                const uint4 wq1 = WBITS == 8 ? lds128(ws + kc * 1024 + 512) : wq;
                // B fragments of tokens mt*8..mt*8+7 for both k16 steps of this 32-k chunk: lanes 0-7 address
                // rows at k offset 0, lanes 8-15 at 8, 16-23 at 16, 24-31 at 24 -> regs (step 0 lo, hi, step 1
                // lo, hi). At M = 64 one step at a time (ldmatrix.x2, lanes 0-15), for registers.
                u32 xb[MT][4];
                if constexpr (!X_PER_STEP) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        ldmatrix_x4(xb[mt], xs + (mt * 8 * X_PITCH + kc * 32) * 2);
                }
#pragma unroll
                for (int ks = 0; ks < 2; ++ks) {
                    const int step = kc * 2 + ks;
                    if constexpr (X_PER_STEP) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt)
                            ldmatrix_x2(xb[mt][2 * ks], xb[mt][2 * ks + 1], xs + (mt * 8 * X_PITCH + step * 16) * 2);
                    }
                    if (!UNIT_GROUPS && (starts >> step) & 1) {  // warp-uniform: a group starts here
                        apply_scales(acc, acc_g, gt, pass);
#pragma unroll
                        for (int tt = 0; tt < T_PER_PASS; ++tt)
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                                for (int i = 0; i < 4; ++i) acc_g[tt][mt][i] = 0.0f;
                        const int row = __popc(starts & ((2u << step) - 1));
                        gt = group(row);
                        if constexpr (OFFSETS) {
                            apply_offsets(acc, xs_g, offsets);
#pragma unroll
                            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                                for (int i = 0; i < 4; ++i) xs_g[mt][i] = 0.0f;
                            load_offsets(stage, row, warp, lane, offsets);
                        }
                    }
                    if constexpr (OFFSETS) {
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            if (step == 0)
                                FragmentOps<T>::template mma<false>(xs_g[mt], ones, xb[mt][2 * ks], xb[mt][2 * ks + 1]);
                            else
                                FragmentOps<T>::template mma<true>(xs_g[mt], ones, xb[mt][2 * ks], xb[mt][2 * ks + 1]);
                        }
                    }
#pragma unroll
                    for (int tt = 0; tt < T_PER_PASS; ++tt) {
                        const int t = pass * T_PER_PASS + tt;
                        const uint4 frag = fragment(wq, wq1, ks, t, gt);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            if (step == 0)
                                FragmentOps<T>::template mma<false>(acc_g[tt][mt], frag, xb[mt][2 * ks], xb[mt][2 * ks + 1]);
                            else
                                FragmentOps<T>::template mma<true>(acc_g[tt][mt], frag, xb[mt][2 * ks], xb[mt][2 * ks + 1]);
                        }
                    }
                }
            }
            apply_scales(acc, acc_g, gt, pass);
            if constexpr (OFFSETS) apply_offsets(acc, xs_g, offsets);
        }
    }

    // Accumulator element i of (tile t, token tile mt) is column n = warp*32 + t*16 + g + 8*(i/2), token
    // m = mt*8 + 2*(lane%4) + i%2 (the mma C fragment with rows = columns of y).
    __device__ static __forceinline__ void store_output(const Args& a, const Shape& s, int nt, int warp, int,
                                                        const float (&v)[2][MT][4]) {
        // The lane index is re-read here: derived from the caller's `lane`, the row addresses below would be
        // hoisted out of the main loop and held (or spilled) in registers for its whole length.
        const int lane = lane_id();
        const int n0 = nt * N_CTA + warp * WARP_N + (lane >> 2);
        float b[2][2];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = n0 + t * 16 + h * 8;
                b[t][h] = (a.bias && n < s.N) ? FragmentOps<T>::to_f32(a.bias[n]) : 0.0f;
            }
        u16* y0 = a.y + (size_t)((lane & 3) * 2) * s.y_stride + n0;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = mt * 8 + (lane & 3) * 2 + e;
                u16* row = y0 + (size_t)(mt * 8 + e) * s.y_stride;
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        if (m < s.M && n0 + t * 16 + h * 8 < s.N)
                            row[t * 16 + h * 8] = FragmentOps<T>::from_f32(finish<ACTIVATION>(s, v[t][mt][h * 2 + e] + b[t][h]));
            }
            // Keep the compiler from hoisting every row's address math above the first stores (register spills).
            asm volatile("" ::: "memory");
        }
    }

    // End of a segment that does not cover its whole tile, per warp (common.cuh's warp_fixup: a warp's 32 columns are
    // independent of the other warps', float4 t MT + mt of a lane being acc[t][mt]): publish the partial; the warp
    // that arrives last among the tile's CTAs sums all partials of those columns in CTA order and writes them to y.
    // Per warp, not per CTA: no CTA barrier, so a warp that is done never waits for the slowest of its CTA, and the
    // last warp's loads of every slot are in flight together. (The timeline of examples/gemm_trace put the per-CTA
    // version at ~1.3 us to publish and ~3.6 us to reduce, half of a 4096 x 4096 launch.)
    __device__ static void fixup(const Args& a, const Shape& s, int nt, bool first_segment, int warp, int lane,
                                 float (&acc)[2][MT][4]) {
        const int c = blockIdx.x, units = s.NT * s.KT;
        const int c_first = s.splits > 1 ? nt * s.splits : cta_of(nt * s.KT, units, s.ctas);
        const int c_last = s.splits > 1 ? c_first + s.splits - 1 : cta_of(nt * s.KT + s.KT - 1, units, s.ctas);
        // A CTA's first segment uses slot 2c, a later one slot 2c + 1 (a CTA has at most two split segments).
        auto slot_of = [&](int piece) {
            const int cc = c_first + piece;
            return (s.splits > 1 || unit_begin(cc, units, s.ctas) / s.KT == nt) ? 2 * cc : 2 * cc + 1;
        };
        auto counted = [&] {
            if (first_segment) trace_stamp(a.trace, TRACE_PARTIALS_SEEN);  // warp 0's partial counted
        };
        // Four slots' loads in flight at M <= 8 (8 float4 per lane), one above, what the two-CTA variants' 96
        // registers leave (the main loop's state stays live across the fix-up).
        constexpr int SLOT_BATCH = MT == 1 && !WGMMA ? 4 : 1;
        auto counter_of = [&] { return a.counters + nt * WARPS + warp; };
        if (warp_fixup<2 * MT, SLOT_BATCH>(a.partials, SLOT_FLOATS, first_segment ? 2 * c : 2 * c + 1, counter_of,
                                           c_last - c_first + 1, slot_of, counted, warp, lane, &acc[0][0][0]))
            store_output(a, s, nt, warp, lane, acc);
    }

    // CLUSTER SPLIT-K's reduction (every consumer thread; the producer warp takes part in both barriers). The
    // tile's partial is F4 float4 (fragment (warp, t, mt) of lane l is float4 ((warp * 2 + t) * MT + mt) * 32 + l);
    // split r owns float4 [r F4 / S, (r + 1) F4 / S). Each CTA pushes its fragments into their owners' shared
    // memory, slab = its own split, with 16-byte st.shared::cluster (a remote store needs no reply); after a
    // cluster barrier each CTA sums its float4 over the slabs in split order (deterministic) and writes y.
    // RECEIVE: the slabs have an area of their own, so a CTA may push while the owner is still computing (one
    // barrier); otherwise they overwrite the owner's stages, which a first barrier must free.
    __device__ static void cluster_reduce(const Args& a, const Shape& s, u32 base, int nt, int split, int warp,
                                          int lane, int tid, const float (&acc)[2][MT][4]) {
        constexpr int F4 = SLOT_FLOATS / 4;
        const int share = F4 / s.splits;  // splits is 2, 4 or 8: it divides F4 = 64 * WARPS * MT
        if (!RECEIVE) cluster_sync();
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int i = ((warp * 2 + t) * MT + mt) * 32 + lane, owner = i / share;
                st_cluster_f32x4(cluster_map(base + (split * share + i - owner * share) * 16, owner),
                                 make_float4(acc[t][mt][0], acc[t][mt][1], acc[t][mt][2], acc[t][mt][3]));
            }
        cluster_sync();
        trace_stamp(a.trace, TRACE_PARTIALS_SEEN);
        for (int j = tid; j < share; j += THREADS) {
            float4 sum = lds128f(base + j * 16);
            for (int r = 1; r < s.splits; ++r) {
                const float4 q = lds128f(base + (r * share + j) * 16);
                sum.x += q.x, sum.y += q.y, sum.z += q.z, sum.w += q.w;
            }
            // Back from the float4 index to its fragment: C element e of (warp, t, mt) at lane l is column
            // warp*32 + t*16 + l/4 + 8*(e/2), token mt*8 + 2*(l%4) + e%2 (store_output's mapping).
            const int i = split * share + j, l = i & 31, f = i >> 5, mt = f % MT, wt = f / MT;
            const int n = nt * N_CTA + (wt >> 1) * WARP_N + (wt & 1) * 16 + (l >> 2);
            const float v[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int m = mt * 8 + (l & 3) * 2 + (e & 1), col = n + 8 * (e >> 1);
                if (m < s.M && col < s.N) {
                    const float b = a.bias ? FragmentOps<T>::to_f32(a.bias[col]) : 0.0f;
                    a.y[(size_t)m * s.y_stride + col] = FragmentOps<T>::from_f32(finish<ACTIVATION>(s, v[e] + b));
                }
            }
        }
    }

    // TMA producer (one warp): for each unit, wait until its buffer is free, announce the bytes, issue the copies:
    // the weight unit and the scale/zero rows as one contiguous copy each (`issue_weights`), x's rows as one tensor
    // copy (`issue_x`); lane 0 issues them all. DEPENDENT LAUNCH: the first stages' weight copies go out before the wait for the previous
    // kernel, x's after it.
    __device__ static void issue_weights(const Args& a, const Shape& s, char* stage, u32 full, int u, int lane) {
        const int nt = u / s.KT, k0 = (u - nt * s.KT) * K_TILE;
        const int g_lo = s.group_shift >= 0 ? k0 >> s.group_shift : k0 / s.group;
        const int g_hi = s.group_shift >= 0 ? (k0 + K_TILE - 1) >> s.group_shift : (k0 + K_TILE - 1) / s.group;
        const int rows = g_hi - g_lo + 1;
        const size_t row0 = (size_t)nt * s.GP + g_lo;
        // x: the tensor copy's box, M rows of X_PITCH (the padding columns come from the next unit or are zeros);
        // WGMMA: two boxes of M rows of 64 k.
        const u32 x_bytes = WGMMA ? 2 * s.M * 128 : s.M * (X_PITCH * 2);
        const u32 bytes = W_BYTES + x_bytes + rows * (N_CTA * 2 + Z_ROW_BYTES);
        if constexpr (GATHER) {
            // Slices [0, first) lie in one stored tile, the rest (if any) at the start of the next: one run of
            // contiguous codes, scales and zeros each.
            const int first = min(WARPS, STORED_WARPS - stored_slice(nt, 0).y), kt = k0 / K_TILE;
            auto copy_run = [&](int j, int n) {
                const int2 at = stored_slice(nt, j);
                bulk_copy(stage + j * CHUNK, stored_codes(a, s, at, kt), n * CHUNK, full);
                bulk_copy(stage + W_BYTES + X_BYTES + j * S_CHUNK, stored_scales(a, s, at, g_lo), n * S_CHUNK, full);
                if (Z_ROW_BYTES > 0)
                    bulk_copy(stage + W_BYTES + X_BYTES + S_BYTES + j * Z_CHUNK, stored_zeros(a, s, at, g_lo),
                              n * Z_CHUNK, full);
            };
            if (lane == 0) {
                mbar_arrive_expect_tx(full, bytes);
                copy_run(0, first);
                if (first < WARPS) copy_run(first, WARPS - first);
            }
            return;
        }
        if (lane == 0) {
            mbar_arrive_expect_tx(full, bytes);
            bulk_copy(stage, a.qweight + (size_t)u * (W_BYTES / 16), W_BYTES, full);
            bulk_copy(stage + W_BYTES + X_BYTES, a.scales + row0 * N_CTA, rows * (N_CTA * 2), full);
            if (Z_ROW_BYTES > 0)
                bulk_copy(stage + W_BYTES + X_BYTES + S_BYTES, a.zeros + row0 * Z_ROW_BYTES, rows * Z_ROW_BYTES, full);
        }
    }
    // The stage's x rows: one 2D tensor copy (box: M rows x X_PITCH columns, landing at the stage's padded row
    // pitch), where a bulk copy per row cost ~26 ns of the TMA unit per row and unit (H200, 8192 x 28672: the decode
    // kernel's time grew by 0.7 us per row from M = 9 to 16).
    __device__ static void issue_x(const TensorMap* xmap, const Shape& s, char* stage, u32 full, int u, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (lane == 0) {
            const int k0 = (u % s.KT) * K_TILE;
            tma_load_2d(smem_addr(stage + W_BYTES), xmap, k0, 0, full);
            // WGMMA: box b holds k0 + 64 b .. + 63, M rows of 128 bytes, M_ROWS rows apart.
            if (WGMMA) tma_load_2d(smem_addr(stage + W_BYTES + M_ROWS * 128), xmap, k0 + K_TILE / 2, 0, full);
        }
#endif
    }

    // Ring `ring`'s units [u_begin, u_begin + count) through its stages [ring RING, (ring + 1) RING) (PAIRED: a
    // producer warp per ring, so that neither half's refills wait for the other's).
    __device__ static void produce(const TensorMap* xmap, const Args& a, const Shape& s, char* smem, u32 bars,
                                   int u_begin, int count, int ring, int lane) {
        smem += ring * (RING * STAGE_BYTES);
        const u32 full0 = bars + ring * (RING * 8), empty0 = bars + (STAGES + ring * RING) * 8;
        const int early = min(RING, count);
        for (int i = 0; i < early; ++i) issue_weights(a, s, smem + i * STAGE_BYTES, full0 + i * 8, u_begin + i, lane);
        wait_for_prerequisite_grids();
        for (int i = 0; i < early; ++i) issue_x(xmap, s, smem + i * STAGE_BYTES, full0 + i * 8, u_begin + i, lane);
        int buf = early % RING;
        for (int i = early; i < count; ++i) {
            mbar_wait(empty0 + buf * 8, ((i / RING) - 1) & 1);
            char* stage = smem + buf * STAGE_BYTES;
            issue_weights(a, s, stage, full0 + buf * 8, u_begin + i, lane);
            issue_x(xmap, s, stage, full0 + buf * 8, u_begin + i, lane);
            if (++buf == RING) buf = 0;
        }
    }

    // PAIRED's reduction: the second k split's warps store their partials in the RECEIVE area (fragment (warp, t,
    // mt) of lane l at float4 ((warp * 2 + t) * MT + mt) * 32 + l, as cluster_reduce numbers them); after a barrier
    // of both halves the first split's warps add them to their own (split 0 + split 1, cluster_reduce's order) and
    // store the tile.
    __device__ static void pair_reduce(const Args& a, const Shape& s, u32 area, int nt, int ring, int warp, int lane,
                                       float (&acc)[2][MT][4]) {
        auto fragment_at = [&](int t, int mt) { return area + (((warp * 2 + t) * MT + mt) * 32 + lane) * 16; };
        if (ring == 1) {
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    sts128f(fragment_at(t, mt),
                            make_float4(acc[t][mt][0], acc[t][mt][1], acc[t][mt][2], acc[t][mt][3]));
        }
        named_barrier_sync(1, CONSUMERS);
        if (ring == 1) return;
        trace_stamp(a.trace, TRACE_PARTIALS_SEEN);
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const float4 q = lds128f(fragment_at(t, mt));
                acc[t][mt][0] += q.x, acc[t][mt][1] += q.y, acc[t][mt][2] += q.z, acc[t][mt][3] += q.w;
            }
        store_output(a, s, nt, warp, lane, acc);
    }

    __device__ static void run(const TensorMap* xmap, const Args& a, const Shape& s) {
        extern __shared__ __align__(128) char smem_raw[];
        char* smem = smem_raw + (WGMMA ? (1024 - (smem_addr(smem_raw) & 1023)) & 1023 : 0);
        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const int units = s.NT * s.KT;
        // PAIRED: ring r (the mma warps [r WARPS, (r + 1) WARPS), producer warp 2 WARPS + r, their stages) is split r
        // of tile blockIdx.x.
        const int ring = PAIRED ? (warp < CONSUMERS / 32 ? warp / WARPS : warp - CONSUMERS / 32) : 0;
        int u_begin, count;
        if (PAIRED) {
            const int k0 = ring * s.KT / 2;
            u_begin = blockIdx.x * s.KT + k0;
            count = (ring + 1) * s.KT / 2 - k0;
        } else if (s.splits > 1) {  // split c % splits of tile c / splits: k tiles [r KT / S, (r + 1) KT / S)
            const int nt = blockIdx.x / s.splits, r = blockIdx.x - nt * s.splits;
            const int k0 = r * s.KT / s.splits;
            u_begin = nt * s.KT + k0;
            count = (r + 1) * s.KT / s.splits - k0;
        } else {
            u_begin = unit_begin(blockIdx.x, units, s.ctas);
            count = unit_begin(blockIdx.x + 1, units, s.ctas) - u_begin;
        }
        const u32 bars = smem_addr(smem + STAGES * STAGE_BYTES);
        trace_stamp(a.trace, TRACE_ENTRY);
        allow_dependent_launch();  // DEPENDENT LAUNCH: the next kernel may take SMs as this one's CTAs exit

        // x rows M..M_ROWS-1 are never loaded: zero them once so the unused mma columns see finite values (WGMMA:
        // in both 64-k boxes of a stage, 128-byte rows).
        if (s.M < M_ROWS) {
            constexpr int ROW_CHUNKS = WGMMA ? 8 : X_PITCH / 8;  // 16-byte chunks per x row
            const int per_box = (M_ROWS - s.M) * ROW_CHUNKS, per_stage = (WGMMA ? 2 : 1) * per_box;
            for (int i = tid; i < STAGES * per_stage; i += BLOCK) {
                const int st = i / per_stage, r = i - st * per_stage, box = r / per_box, c = r - box * per_box;
                *reinterpret_cast<uint4*>(smem + st * STAGE_BYTES + W_BYTES + box * (M_ROWS * 128) +
                                          (s.M * ROW_CHUNKS + c) * 16) = make_uint4(0, 0, 0, 0);
            }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (WGMMA) fence_proxy_async_shared();  // wgmma reads them through the async proxy
#endif
        }
        // ENTRY BARRIER (RECEIVE): a CTA may push its partial into another's RECEIVE area while that one still
        // computes, so nothing else orders the push after the owner's start, which the CUDA programming guide requires
        // of distributed shared memory (racecheck reported every push as a write into "a block that might not have
        // entered yet"). Every thread passes one cluster barrier first: the CTAs of a cluster start together, so it
        // costs nothing measurable (M = 1-16, stop 54). Unconditional: a branch on s.cluster spilled the offset-form
        // variant (96 registers), and launched without a cluster a CTA is a cluster of one. (A split form, the
        // producer arriving before its copies and waiting after them, hung the decode tests in stop 53, perhaps as
        // the consumers could arrive at cluster_reduce's barrier, the next phase, before the producer's wait.)
        if (RECEIVE) cluster_sync();
        if constexpr (TMA) {
            if (tid == 0) init_pipeline_barriers(bars, STAGES, THREADS);
            __syncthreads();
            if (warp >= CONSUMERS / 32) {
                produce(xmap, a, s, smem, bars, u_begin, count, ring, lane);
                if (s.cluster) {  // cluster_reduce's barriers
                    cluster_sync();
                    if (!RECEIVE) cluster_sync();
                }
                return;
            }
        }
        consume(a, s, smem, u_begin, count, tid, ring);
    }

    // The mma warps' loop over this CTA's units: wait for a stage, compute it, release it; at each segment end
    // store the tile or hand it to the fix-up.
    // PAIRED: `ring`'s warps (tid numbered from the first of them) through its own stages.
    __device__ static void consume(const Args& a, const Shape& s, char* smem, int u_begin, int count, int tid,
                                   int ring) {
        tid -= ring * THREADS;
        const int warp = tid >> 5, lane = tid & 31;
        // The stages' and barriers' shared addresses, once: left to itself ptxas recomputes them in every iteration
        // from the CTA's cluster id (S2UR SR_CgaCtaId and five dependent instructions) right before the wait for
        // the stage. A shuffle is opaque to it, so the values stay in registers, and its result is warp-uniform to
        // ptxas: the stage addresses and wgmma's descriptors then live in uniform registers.
        const u32 base = __shfl_sync(0xffffffffu, smem_addr(smem), 0);
        // This ring's stages, and its full / empty barriers (at bars + buf * 8 / bars + (STAGES + buf) * 8).
        const u32 stages = base + ring * (RING * STAGE_BYTES);
        const u32 bars = base + STAGES * STAGE_BYTES + ring * (RING * 8);
        // DEPENDENT LAUNCH: nothing the previous kernel may read or write (x, y, the workspace, the counters) is
        // touched before it has finished.
        wait_for_prerequisite_grids();
        // Units advance as (nt, kt) pairs: one division here, none per stage. The loop keeps few registers live
        // (units left, stage and phase instead of an index) so that the two-CTA variants fit in 96 registers.
        int nt = u_begin / s.KT, kt = u_begin - nt * s.KT;  // unit being computed
        int ld_u = u_begin, ld_nt = nt, ld_kt = kt;          // next unit to load (cp.async path)
        if constexpr (!TMA) {
#pragma unroll 1
            for (int st = 0; st < STAGES - 1; ++st) {
                if (st < count) {
                    load_stage(a, s, smem + st * STAGE_BYTES, ld_u++, ld_nt, ld_kt, tid);
                    if (++ld_kt == s.KT) ld_kt = 0, ++ld_nt;
                }
                cp_async_commit();
            }
        }

        float acc[2][MT][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[t][mt][i] = 0.0f;

        int seg_start = kt;  // k tile where the current segment starts; -1: a later segment (starts at 0)
        int buf = 0, ld_buf = STAGES - 1;
        u32 phase = 0;  // parity of the current use of stage `buf` (TMA)
        // HOISTED: the lane's offsets once, and the first stage's diagnostic stamp outside the loop (3 instructions
        // a stage). The others keep both in the loop (hoisted, the two-CTA variants took up to 8 registers more).
        LaneOffsets off{};
        if constexpr (HOISTED) {
            off = lane_offsets(warp, lane);
            if (a.trace && count > 0) {
                mbar_wait(bars, 0);
                trace_stamp(a.trace, TRACE_FIRST_FULL);
            }
        }
#pragma unroll 1
        for (int left = count; left > 0; --left) {
            if constexpr (TMA) {
                mbar_wait(bars + buf * 8, phase);
                if (!HOISTED && left == count) trace_stamp(a.trace, TRACE_FIRST_FULL);
            } else {
                cp_async_wait<STAGES - 2>();
                __syncthreads();  // this stage visible to all; every warp is done with the buffer refilled next
                if (left > STAGES - 1) {
                    load_stage(a, s, smem + ld_buf * STAGE_BYTES, ld_u++, ld_nt, ld_kt, tid);
                    if (++ld_kt == s.KT) ld_kt = 0, ++ld_nt;
                }
                cp_async_commit();
                if (++ld_buf == STAGES) ld_buf = 0;
            }

            compute_stage(stages + buf * STAGE_BYTES, s, kt, warp, lane, off, acc);
            if constexpr (TMA) mbar_arrive(bars + (STAGES + buf) * 8);  // this thread is done reading the stage
            if (++buf == RING) buf = 0, phase ^= 1;

            if (kt == s.KT - 1 || left == 1) {  // segment end (CTA-uniform)
                if (seg_start >= 0) trace_stamp(a.trace, TRACE_MAINLOOP_END);
                if (PAIRED) {  // the ring's one segment, a split of the CTA's tile
                    pair_reduce(a, s, base + RECEIVE_OFFSET, nt, ring, warp, lane, acc);
                } else if (s.cluster) {  // the CTA's one segment, a split of its cluster's tile
                    cluster_reduce(a, s, stages + (RECEIVE ? RECEIVE_OFFSET : 0), nt, blockIdx.x % s.splits,
                                   warp, lane, tid, acc);
                } else if (seg_start <= 0 && kt == s.KT - 1) {
                    store_output(a, s, nt, warp, lane, acc);
                } else {
                    fixup(a, s, nt, seg_start >= 0, warp, lane, acc);
                }
                if (seg_start >= 0) trace_stamp(a.trace, TRACE_ITEM_END);
#pragma unroll
                for (int t = 0; t < 2; ++t)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int j = 0; j < 4; ++j) acc[t][mt][j] = 0.0f;
                seg_start = -1;
            }
            if (++kt == s.KT) kt = 0, ++nt;
        }
        if constexpr (!TMA) cp_async_wait<0>();
        trace_exit(a.trace, count);
    }
};

}  // namespace w4a16
}  // namespace lowbit

// ------------------------------------------------------------------------------------------------------------------
// Entry points of the variant selected by the host's #defines
// ------------------------------------------------------------------------------------------------------------------
#ifndef LB_DTYPE  // no variant selected (`lowbit doctor --compile-only`): the M <= 8 kernel of a large layer
#define LB_DTYPE F16
#define LB_MT 1
#define LB_ZEROS 1
#define LB_WARPS 8
#define LB_STAGES 3
#define LB_TMA (__CUDA_ARCH__ >= 900)
#define LB_MIN_BLOCKS 2
#define LB_UNIT_GROUPS 1
#define LB_RECEIVE 0
#endif
#ifndef LB_WBITS
#define LB_WBITS 4
#endif
#ifndef LB_OFFSETS
#define LB_OFFSETS 0
#endif
#ifndef LB_WGMMA
#define LB_WGMMA 0
#endif
#ifndef LB_ACTIVATION
#define LB_ACTIVATION 0
#endif
#ifndef LB_GATHER
#define LB_GATHER 0
#endif
#ifndef LB_PAIRED
#define LB_PAIRED 0
#endif
#if LB_TMA && __CUDA_ARCH__ < 900
#error "the TMA pipeline (LB_TMA) needs sm_90: select LB_TMA 0 for older GPUs"
#endif

typedef lowbit::w4a16::Linear<lowbit::LB_DTYPE, LB_MT, LB_ZEROS != 0, LB_OFFSETS != 0, LB_WARPS, LB_STAGES,
                              LB_TMA != 0, LB_UNIT_GROUPS != 0, LB_RECEIVE != 0, LB_WBITS, LB_WGMMA != 0,
                              LB_ACTIVATION != 0, LB_GATHER != 0, LB_PAIRED != 0>
    LinearVariant;

extern "C" __global__ void __launch_bounds__(LinearVariant::BLOCK, LB_MIN_BLOCKS)
    w4a16_linear(const __grid_constant__ lowbit::TensorMap xmap, LinearVariant::Args args,
                 lowbit::w4a16::Shape shape) {
    LinearVariant::run(&xmap, args, shape);
}

extern "C" __global__ void w4a16_stage_x(const unsigned short* x, long long x_stride, const unsigned int* perm,
                                         unsigned short* out, int M, int K, int k_pad) {
    lowbit::stage_x(x, x_stride, perm, out, M, K, k_pad);
}
