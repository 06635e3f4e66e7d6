//! The W4A16 GEMM for prefill on Hopper (sm_90a): `y[M, N] = act(x[M, K] · W^T + bias)` with wgmma, for M from
//! 64 up (any M works; below ~64 the decode kernel is faster). It reads the same [`DeviceW4`] as the decode kernel,
//! so one prepared weight serves every batch size ([`crate::ops::linear::QuantLinear`] picks the kernel per call).
//!
//! ```no_run
//! # use lowbit::{DType, cuda::CudaDevice, ops::linear::cuda::gemm::LinearW4A16Gemm};
//! # fn main() -> lowbit::Result<()> {
//! # let w: lowbit::QuantMatrix = unimplemented!();
//! let dev = CudaDevice::new(0)?;
//! let op = LinearW4A16Gemm::new(&dev, &w, DType::F16, 4096)?; // batches of up to 4096 rows
//! let mut ws = dev.alloc_zeros::<u8>(op.workspace_bytes())?;
//! # let (x, mut y) = (dev.alloc_zeros::<half::f16>(4096 * w.k)?, dev.alloc_zeros::<half::f16>(4096 * w.n)?);
//! op.run(dev.stream(), &x, 4096, None, &mut y, &mut ws)?;
//! # Ok(()) }
//! ```
//!
//! Kernel: `kernels/linear_w4a16_gemm.cu` (its header explains the design). Numerics: each weight is
//! `round((q − z) · s)` in the activation type, as dequantize + cuBLAS computes it; fp32 accumulation; bias and
//! activation in fp32; one rounding of y.

use super::{call_buffers, smem_limits, stage_x, CallBuffers, DeviceW4, RepackedW4, K_TILE, MAX_GROUP_ROWS};
use crate::cuda::{launch_ex, resident_cluster_count, Launch};
use crate::cuda::{tensor_map_2d, KernelSource, MapElement, TensorMap};
use crate::cuda::{CudaDevice, CudaFunction, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use crate::formats::QuantMatrix;
use crate::ops::linear::Activation;
use std::sync::Arc;

/// The kernel source; the host prepends the `#define`s of one variant.
const SOURCE: &str = include_str!("../../../../kernels/linear_w4a16_gemm.cu");

/// The kernel source with no variant selected (the g128 f16 kernel with zeros), compiled by `lowbit doctor`.
pub const KERNEL: KernelSource = KernelSource {
    name: "linear_w4a16_gemm",
    source: SOURCE,
};

/// Batches up to this many rows use the kernel with 64 tokens per warpgroup, larger ones 128.
pub const SMALL_BATCH: usize = 64;
/// A linear layer's batches up to this many rows use the kernel with 16 tokens per warpgroup: it converts the
/// weight as every tile does, but spends a quarter of the 64-token tile's tensor work on padding rows.
pub const TINY_BATCH: usize = 16;
/// Threads per CTA: two consumer warpgroups and the TMA producer warpgroup.
const BLOCK: u32 = 384;
/// Most CTAs one tile is split into along K.
const MAX_SPLITS: usize = 8;
/// `Gemm::STAGING_BYTES`: the epilogue's staging, per consumer warp 1 KB (linear) or four 528-byte slices
/// (convolution).
const EPILOGUE_STAGING: [usize; 2] = [8 * 1024, 8 * 4 * 528];
/// Fewest k tiles (of 128) a split keeps: shorter ones spend more on the fp32 partials than they save.
const MIN_KT_PER_SPLIT: usize = 4;
/// `MAX_CLUSTER` of the kernel: split-K arrival counters per tile.
const MAX_CLUSTER: usize = 8;

/// How a tile's k range is split: `groups` thread-block clusters of `cluster` CTAs each. The clusters of a tile
/// reduce in shared memory, then (groups > 1) add their sums through global memory. Or `stream`: the kernel's
/// STREAM-K, every CTA the same number of k tiles, split tiles finished by a fix-up in global memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// CTAs per split tile: `cluster · groups`.
    pub splits: usize,
    pub cluster: usize,
    pub groups: usize,
    /// Tiles that run unsplit before the split ones (the kernel's HYBRID): 0, or the full waves of a grid of
    /// [`LinearW4A16Gemm::hybrid_grid`] CTAs when only the last, at most half-full wave splits.
    pub whole: usize,
    /// STREAM-K over every SM (then `splits` is 1).
    pub stream: bool,
}

impl SplitPlan {
    const NONE: SplitPlan = SplitPlan {
        splits: 1,
        cluster: 1,
        groups: 1,
        whole: 0,
        stream: false,
    };

    const STREAM: SplitPlan = SplitPlan {
        stream: true,
        ..SplitPlan::NONE
    };
}

/// The launch-cost model that picks the tile and the split (`estimated_cost`), in microseconds of an H200
/// (examples/gemm_trace timelines, M = 64 and 256, K = 4096 and 14336; M = 16 on 8192 x 28672 for 16 tokens). One k
/// tile (128 k) of a 256-column tile with 16, 64 and 128 tokens per warpgroup, or of the K-split tile (128 columns,
/// 64 tokens: half the codes and the tensor work of the 64-token tile's k tile, the same x):
fn kt_us(v: &GemmVariant) -> f64 {
    match v.wg_tokens {
        64 if v.ksplit => KSPLIT_KT_US,
        _ if v.ksplit => KSPLIT_WIDE_KT_US,
        16 => 0.65,
        64 => 0.97,
        96 => KT_96_US,
        _ => 1.42,
    }
}
/// The 96-token tile's k tile (`m64n96k16`, a stage of 24 KB of x and 16 KB of codes): the 128-token tile's scaled
/// by their main loops' ratio in the same call, 1.14 against 1.30 us a k tile (192 x 8192 x 28672, median CTA;
/// `bench/results/2026-11-28-h200-linear-96-token-tile/`). It then takes 129..192 rows (two tiles of 96 where the
/// 128-token tile pads to 256) and 65..96, and leaves 256 and up to the 128-token tile.
const KT_96_US: f64 = 1.24;
/// The K-split tile's k tile: 0.62 us at M = 256 on 4096 x 14336 and 0.67 at M = 64 on 4096 x 4096
/// (`bench/results/2026-11-27-h200-gemm-trace-ksplit.txt`), not half the 64-token tile's 0.97: a stage of its size
/// takes 0.40 us to land even with idle consumers (`w4a16-gemm.md`, "Alternate stages, and deeper wgmma queues").
const KSPLIT_KT_US: f64 = 0.65;
/// The 128-token K-split tile's k tile (`m64n128k16` on a stage of 32 KB of x and 8 KB of codes): 0.82 us at M = 256
/// on 4096 x 4096 (`bench/results/2026-11-28-h200-gemm-trace-ksplit128.txt`). With it the model picks the 64-token
/// K-split tile up to 128 rows there and this one at 192 and 256, as measured (`-linear-ksplit128-sweep.jsonl`).
/// Since the tile's producers and early release (4e54954) the two k tiles take 0.80 and 0.62 us: the same ratio,
/// and the same choices (`bench/results/2026-11-28-h200-linear-ksplit-pipeline-ab/`).
const KSPLIT_WIDE_KT_US: f64 = 0.82;
/// Tokens of the K-split tiles (their wgmma N).
const KSPLIT_TOKENS: [usize; 2] = [64, 128];
/// The K-split tile's exchange of the warpgroups' partial sums per item (16 KB each way through shared memory at
/// 64 tokens, twice 16 KB at 128).
fn ksplit_exchange_us(v: &GemmVariant) -> f64 {
    if v.wg_tokens > 64 {
        0.6
    } else {
        0.3
    }
}
/// The split-K epilogue: a fixed part, then the partial's bytes pushed to other CTAs of the cluster through
/// distributed shared memory (~15 GB/s per SM; 64-token tiles: 3.3 us at 2 splits, 5.6 at 6; 128-token: 7.0 at 3).
const SPLIT_EPILOGUE_US: f64 = 1.0;
const PUSH_US_PER_KB: f64 = 0.07;
/// What the global step of a tile split into several cluster groups adds: the last cluster's copy of the others'
/// sums and its own epilogue took ~5 us per tile at 2 and at 4 groups (the non-last clusters' publish ~1.6 us).
const GROUPS_EPILOGUE_US: f64 = 5.0;
/// What STREAM-K adds to a launch, when it is forced (the tile is still chosen by cost): publishing a partial (a
/// GPU-scope release behind 2-8 KB per warp), then per piece of a tile an L2 round trip of the last warp's loads.
/// Fitted to the H200 runs (`w4a16-gemm.md`): 4-5% faster than whole tiles without RAMP on 8192 x 28672 (112 tiles
/// of 64 k tiles, 3 pieces a tile) at M = 1-64; 10-25% slower where a tile has 8-9 pieces (16 tiles of 32 k tiles,
/// M = 64) and cluster split-K fills the SMs.
const STREAM_FIXUP_US: f64 = 1.5;
const STREAM_PIECE_US: f64 = 1.0;
/// The kernel's RAMP in the linear 16- and 64-token tiles: while the pipeline first fills, stage i is issued only
/// once stage i - 2 has landed. With every SM asking for its 6 stages at once, each SM's first stage landed 3.6-3.9
/// us after the launch (examples/gemm_trace), and the consumers waited for it. H200, M = 16 and 64 on the anchor
/// layers' split-K plans: 4-7% faster (`w4a16-gemm.md`); one stage was slower; the 128-token tile moved by less
/// than 1.5% either way.
const RAMP_STAGES: usize = 2;

/// The RAMP a tile is built with: [`RAMP_STAGES`] for the linear 16- and 64-token tiles, none elsewhere.
fn default_ramp(wg_tokens: usize, conv: bool) -> usize {
    if !conv && wg_tokens <= 64 {
        RAMP_STAGES
    } else {
        0
    }
}
/// The kernel's STAGGER: the second consumer warpgroup this many k tiles behind the first on the same stages, so
/// that their epilogues do not leave the tensor cores idle together. H200, 128-token tiles of 256 columns (the two
/// warpgroups on the two column halves), M = 1024 and 4096 on the anchor layers: 3-6% faster; lags of 1 and 3 k
/// tiles within 1% of 2 (`w4a16-gemm.md`, "STAGGER").
const STAGGER_K_TILES: usize = 2;
/// The fewest stages a tile takes the STAGGER with: the int8 layout's 128-token tile has 3, and there lags of 1 and
/// 2 were 1-2% slower than none (its leader is left too little prefetch).
const STAGGER_MIN_STAGES: usize = 4;

/// The STAGGER a tile is built with: [`STAGGER_K_TILES`] for the linear 128-token tile of 256 columns, none
/// elsewhere (the 128-column tile has 2 stages; the smaller tiles and the convolution were not measured with it).
fn default_lag(wg_n: usize, wg_tokens: usize, conv: bool) -> usize {
    if wg_n == 2 && wg_tokens == 128 && !conv {
        STAGGER_K_TILES
    } else {
        0
    }
}

/// Largest tile (tokens per warpgroup) that may take STREAM-K: its slots (two per SM, one tile of fp32 each) are
/// part of the workspace.
const STREAM_MAX_TOKENS: usize = 64;
/// Deepest pipeline (lowered to what fits in shared memory).
const MAX_STAGES: usize = 6;

/// Whether the GEMM runs on this device for this weight: sm_90 (wgmma, TMA) and tiles of 128 or 256 columns
/// (N = 192 or 576 layers have 64-column tiles: they use the decode kernel or dequantize + cuBLAS).
pub fn supported(device: &CudaDevice, weight: &DeviceW4) -> bool {
    device.info().compute_capability.0 == 9 && matches!(weight.plan.n_cta, 128 | 256)
}

/// One compiled specialisation of the GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmVariant {
    /// Activation dtype.
    pub act: DType,
    /// Zero points are read (otherwise every zero is 8).
    pub zeros: bool,
    /// Consumer warpgroups along the columns: 2 for 256-column tiles, 1 for 128 (the two then split the tokens).
    pub wg_n: usize,
    /// Tokens per consumer warpgroup (the wgmma N): 16, 64 or 128.
    pub wg_tokens: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// The group size is a multiple of 128 (one scale/zero row per stage).
    pub unit_groups: bool,
    /// MNN offset form, `(q − 8)·s + o` with an fp16 offset per column and group, instead of zero codes
    /// (the Hopper convolution path).
    pub offsets: bool,
    /// The convolution mode: x is a zero-padded NHWC image, y is NCHW (`ops::conv::cuda`).
    pub conv: bool,
    /// k16 steps whose weight fragments are converted ahead of the wgmmas (2 or 3; see the kernel's OVERLAP).
    pub lookahead: usize,
    /// Bits per weight code: 4, or 8 for the int8 layout of [`super::repack_int8`] (fp16 only).
    pub wbits: usize,
    /// Stages in flight while the pipeline first fills (the kernel's RAMP); 0: all of them.
    pub ramp: usize,
    /// k tiles the second consumer warpgroup runs behind the first (the kernel's STAGGER), below `stages`; 0: none.
    pub lag: usize,
    /// The kernel's K-SPLIT TILE: 128 columns whose two consumer warpgroups take alternate stages of a k range (`wg_n` 1).
    pub ksplit: bool,
    /// Columns of a repacked unit: `n_cta()`, or twice that for a K-split tile over a 256-column weight.
    pub unit_n: usize,
}

impl GemmVariant {
    /// The tile of `wg_tokens` tokens per warpgroup and `wg_n` column warpgroups for these weights, with every tuning
    /// knob at its default (all stages that fit are taken when it is loaded: [`GemmVariant::fitted`]). A convolution
    /// reads its weights in MNN's offset form.
    fn with_defaults(
        act: DType,
        wbits: usize,
        zeros: bool,
        unit_groups: bool,
        conv: bool,
        wg_n: usize,
        wg_tokens: usize,
    ) -> Self {
        GemmVariant {
            act,
            zeros,
            wg_n,
            wg_tokens,
            stages: MAX_STAGES,
            unit_groups,
            offsets: conv,
            conv,
            lookahead: default_lookahead(wg_tokens),
            wbits,
            ramp: default_ramp(wg_tokens, conv),
            lag: default_lag(wg_n, wg_tokens, conv),
            ksplit: false,
            unit_n: 128 * wg_n,
        }
    }

    /// The K-split tile of a linear layer whose repacked units are `unit_n` (128 or 256) columns wide: 128 columns
    /// x `tokens` (one of [`KSPLIT_TOKENS`]), the two consumer warpgroups on alternate stages of its k range.
    /// Lookahead 2: 3 and 4 were 2-3% slower at 4096² M = 64 and 128 on the 64-token one
    /// (`bench/results/2026-11-28-h200-linear-lookahead.jsonl`); the 128-token one has no registers for 8 buffers.
    fn k_split(act: DType, wbits: usize, zeros: bool, unit_groups: bool, unit_n: usize, tokens: usize) -> Self {
        GemmVariant {
            lookahead: 2,
            ksplit: true,
            unit_n,
            ..Self::with_defaults(act, wbits, zeros, unit_groups, false, 1, tokens)
        }
    }

    /// Tokens per CTA tile.
    pub fn bm(&self) -> usize {
        if self.ksplit {
            self.wg_tokens
        } else {
            (2 / self.wg_n) * self.wg_tokens
        }
    }

    /// CTA tiles per repacked unit's columns: 1, or 2 for K-split half tiles.
    pub fn halves(&self) -> usize {
        self.unit_n / self.n_cta()
    }

    /// Output columns per CTA tile.
    pub fn n_cta(&self) -> usize {
        128 * self.wg_n
    }

    fn stage_bytes(&self) -> usize {
        let group_rows = if self.unit_groups { 1 } else { MAX_GROUP_ROWS };
        let n_cta = self.n_cta();
        // Codes of the tile's columns; scale and zero rows of the whole unit.
        let bytes = self.bm() * K_TILE * 2
            + n_cta * K_TILE * self.wbits / 8
            + group_rows * self.unit_n * 2
            + group_rows * self.zero_row_bytes();
        bytes.next_multiple_of(1024)
    }

    /// This variant with as many of its stages as fit in `smem` bytes of shared memory per CTA (at least 2; an even
    /// number for the K-split tile, whose warpgroups and producers take alternate stages: the kernel's EVEN RING),
    /// and no STAGGER if fewer than [`STAGGER_MIN_STAGES`] remain.
    fn fitted(mut self, smem: usize) -> Self {
        while self.stages > 2 && (self.smem_bytes() > smem || (self.ksplit && self.stages % 2 == 1)) {
            self.stages -= 1;
        }
        if self.stages < STAGGER_MIN_STAGES {
            self.lag = 0;
        }
        self
    }

    /// Bytes of one stage's zero (or offset) row: the unit's.
    fn zero_row_bytes(&self) -> usize {
        if self.offsets {
            self.unit_n * 2
        } else if self.zeros {
            self.unit_n * self.wbits / 8
        } else {
            0
        }
    }

    /// The kernel's `LB_ZEROS`: 0 symmetric, 1 zero codes, 2 offsets.
    fn zero_mode(&self) -> u8 {
        if self.offsets {
            2
        } else {
            u8::from(self.zeros)
        }
    }

    /// Dynamic shared memory (`Gemm::DATA_BYTES` + barriers + the split-K arrival word + 1 KB of alignment slack).
    pub fn smem_bytes(&self) -> usize {
        1024 + self.data_bytes() + self.stages * 16 + 16
    }

    /// `Gemm::DATA_BYTES`: the pipeline, the epilogue's staging and (K-split tile) the warpgroups' exchange
    /// (`EXCHANGE_BYTES`: 256 threads x wg_tokens / 2 floats, in two passes above 64 tokens), or the split-K slabs
    /// (`Y_BYTES`: BM / 2 + 8 row pairs of N_CTA / 16 blocks of 36 floats and 4 of padding) where larger.
    fn data_bytes(&self) -> usize {
        let split_k_tile = (self.bm() / 2 + 8) * self.pair_bytes();
        let staging = EPILOGUE_STAGING[usize::from(self.conv)];
        let passes = if self.wg_tokens > 64 { 2 } else { 1 };
        let exchange = if self.ksplit {
            256 * self.wg_tokens / 2 * 4 / passes
        } else {
            0
        };
        (self.stages * self.stage_bytes() + staging + exchange).max(split_k_tile)
    }

    /// Bytes of one row pair of a split-K slab (`Gemm::PAIR_FLOATS`).
    fn pair_bytes(&self) -> usize {
        (self.n_cta() / 16 * 36 + 4) * 4
    }

    /// Whether the last cluster of a tile split into `groups` clusters of `cluster` CTAs has room for the others'
    /// sums past its first slab (`epilogue_split`).
    fn groups_fit(&self, cluster: usize, groups: usize) -> bool {
        let pairs = (self.bm() / 2).div_ceil(cluster);
        pairs * self.pair_bytes() + (groups - 1) * 2 * pairs * self.n_cta() * 4 <= self.data_bytes()
    }

    fn name(&self) -> String {
        format!(
            "linear_w4a16_gemm_{}_w{}_z{}_g{}_wgn{}_t{}_s{}_l{}_r{}_d{}{}{}",
            self.act.name(),
            self.wbits,
            self.zero_mode(),
            if self.unit_groups { "unit" } else { "any" },
            self.wg_n,
            self.wg_tokens,
            self.stages,
            self.lookahead,
            self.ramp,
            self.lag,
            if self.conv { "_conv" } else { "" },
            if self.ksplit {
                format!("_ks{}", self.unit_n)
            } else {
                String::new()
            }
        )
    }

    fn source(&self) -> &'static KernelSource {
        crate::cuda::variant_source(
            self.name(),
            || {
                format!(
                    "#define LB_DTYPE {}\n#define LB_ZEROS {}\n#define LB_WG_N {}\n#define LB_WG_TOKENS {}\n\
                 #define LB_STAGES {}\n#define LB_UNIT_GROUPS {}\n#define LB_CONV {}\n#define LB_LOOKAHEAD {}\n\
                 #define LB_WBITS {}\n#define LB_RAMP {}\n#define LB_LAG {}\n#define LB_KSPLIT {}\n\
                 #define LB_UNIT_N {}\n",
                    if self.act == DType::Bf16 { "BF16" } else { "F16" },
                    self.zero_mode(),
                    self.wg_n,
                    self.wg_tokens,
                    self.stages,
                    u8::from(self.unit_groups),
                    u8::from(self.conv),
                    self.lookahead,
                    self.wbits,
                    self.ramp,
                    self.lag,
                    u8::from(self.ksplit),
                    self.unit_n
                ) + &crate::cuda::experiment_defines("LOWBIT_GEMM_DEFINES")
            },
            SOURCE,
        )
    }
}

/// `lowbit::w4a16_gemm::Args`, in field order.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemmArgs {
    qweight: u64,
    scales: u64,
    zeros: u64,
    bias: u64,
    y: u64,
    trace: u64,
    partials: u64,
    counters: u64,
}

/// `lowbit::w4a16_gemm::Shape`, in field order (15 ints, an int64, the convolution fields).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GemmShape {
    m: i32,
    n: i32,
    k: i32,
    kt: i32,
    nt: i32,
    mt: i32,
    group: i32,
    gp: i32,
    group_shift: i32,
    splits: i32,
    cluster: i32,
    groups: i32,
    whole: i32,
    stream: i32,
    split_pairs: i32,
    split_pairs_recip: i32,
    activation: i32,
    y_vector: i32,
    y_stride: i64,
    conv: ConvFields,
}

/// The convolution fields of `lowbit::w4a16_gemm::Shape` (zero for a linear layer): a stride-1 convolution over a
/// zero-padded NHWC image `[batch][grid_h][grid_w][channels]`, tokens = positions of that grid, y NCHW
/// `[batch][N][out_h][out_w]`. See the kernel header (CONVOLUTION).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ConvFields {
    /// Input channels, a multiple of 64.
    pub channels: i32,
    /// Kernel width S.
    pub kernel_w: i32,
    /// Token shift of one kernel row: `dilation_h · grid_w`.
    pub tap_row: i32,
    /// Token shift of one kernel column: `dilation_w`.
    pub tap_col: i32,
    /// Kernel taps R·S.
    pub taps: i32,
    /// Positions per image: `grid_h · grid_w`.
    pub grid_tokens: i32,
    pub grid_w: i32,
    pub out_h: i32,
    pub out_w: i32,
    pub batch: i32,
    /// `out_h · out_w`.
    pub out_plane: i64,
}

/// One convolution launch of the GEMM ([`LinearW4A16Gemm::run_conv`]): raw device addresses, already checked by
/// the caller.
pub(crate) struct ConvLaunch {
    /// The padded NHWC fp16 image, `batch · grid_tokens` rows of `channels`.
    pub x: u64,
    /// NCHW output.
    pub y: u64,
    /// `[N]` fp16, or 0.
    pub bias: u64,
    pub activation: Activation,
    pub geometry: ConvFields,
}

// SAFETY: plain-old-data `#[repr(C)]` values laid out like their CUDA counterparts.
unsafe impl DeviceRepr for GemmArgs {}
unsafe impl DeviceRepr for GemmShape {}

/// The W4A16 prefill GEMM prepared on one Hopper GPU. `run` calls on one operator must be ordered (one stream at a
/// time, as with a cuBLAS workspace): a tile split among several cluster groups counts their arrivals in
/// counters the operator owns.
pub struct LinearW4A16Gemm {
    weight: Arc<DeviceW4>,
    /// The kernels by tokens per warpgroup: 64 (small batches) and 128 (large), and for a linear layer first 16
    /// (up to [`TINY_BATCH`] rows) and 96 (129..192 rows without a 128-token tile's padding).
    kernels: Vec<GemmKernel>,
    /// A linear layer's K-split tiles (the kernel's K-SPLIT TILE) by tokens, [`KSPLIT_TOKENS`] (a convolution's
    /// operator has none), which only [`LinearW4A16Gemm::run_on`] with [`GemmTile::KSplit`] (or `force_k_split`)
    /// runs.
    k_split: Vec<GemmKernel>,
    /// Batches up to this many rows use the 64-token kernel (or the 16-token one).
    small_batch: usize,
    stage_x: CudaFunction,
    max_m: usize,
    sms: usize,
    /// Forced split count (benchmarking); `None`: [`LinearW4A16Gemm::splits`]'s choice.
    forced_splits: Option<usize>,
    /// STREAM-K forced on where the tile allows it (testing, benchmarking); otherwise the cost model's plans, which
    /// leave it out.
    forced_stream: bool,
    /// Forced tokens per warpgroup (benchmarking); `None`: chosen by batch size.
    forced_tokens: Option<usize>,
    /// The K-split tile forced on for every batch (testing, benchmarking).
    forced_ksplit: bool,
    /// Largest cluster a split tile may use (testing the cluster groups on small shapes); normally 8.
    max_cluster: usize,
    /// Diagnostics: device address of a per-CTA timeline buffer, or 0 ([`LinearW4A16Gemm::set_trace`]).
    trace: u64,
    /// Launch as the programmatic dependent of the stream's previous kernel (the kernel's DEPENDENT LAUNCH);
    /// always, unless turned off for benchmarking ([`LinearW4A16Gemm::set_dependent_launch`]).
    dependent_launch: bool,
    /// Arrival counters of tiles split into several cluster groups or by STREAM-K, `[sms][MAX_CLUSTER]` (at most
    /// one tile per SM splits either way), zero between launches (the last arrival resets its counter).
    counters: cudarc::driver::CudaSlice<u32>,
}

impl std::fmt::Debug for LinearW4A16Gemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearW4A16Gemm")
            .field("kernels", &self.kernels.iter().map(|k| k.variant).collect::<Vec<_>>())
            .field("k_split", &self.k_split.iter().map(|k| k.variant).collect::<Vec<_>>())
            .field("max_m", &self.max_m)
            .finish_non_exhaustive()
    }
}

impl LinearW4A16Gemm {
    /// Validates and repacks `w`, uploads it, and loads the kernel for batches of up to `max_m` rows of `act`
    /// (f16 or bf16) activations, in the layout of [`super::repack_preferred`].
    pub fn new(device: &CudaDevice, w: &QuantMatrix, act: DType, max_m: usize) -> Result<Self> {
        let packed: RepackedW4 = super::repack_preferred(w, act)?;
        Self::with_weight(device, DeviceW4::upload(device, &packed)?, max_m, None)
    }

    /// The operator for a weight already on the device (shared with the decode operator of the same layer);
    /// `splits` forces the split-K factor (benchmarking).
    pub fn with_weight(
        device: &CudaDevice,
        weight: Arc<DeviceW4>,
        max_m: usize,
        splits: Option<usize>,
    ) -> Result<Self> {
        if weight.has_offsets() {
            return Err(Error::invalid(
                "weight",
                "offsets",
                "a linear GEMM reads no offsets (see for_conv)",
            ));
        }
        Self::build(device, weight, max_m, splits, false)
    }

    /// The convolution form of the GEMM for an fp16 weight in offset form (`ops::conv::cuda`'s Hopper path; the
    /// weight from [`DeviceW4::upload_with_offsets`]): launched with [`LinearW4A16Gemm::run_conv`] only.
    pub(crate) fn for_conv(device: &CudaDevice, weight: Arc<DeviceW4>) -> Result<Self> {
        if !weight.has_offsets() {
            return Err(Error::invalid(
                "weight",
                "no offsets",
                "the convolution form reads per-group offsets",
            ));
        }
        Self::build(device, weight, i32::MAX as usize, None, true)
    }

    fn build(
        device: &CudaDevice,
        weight: Arc<DeviceW4>,
        max_m: usize,
        splits: Option<usize>,
        conv: bool,
    ) -> Result<Self> {
        if !supported(device, &weight) {
            return Err(Error::Unsupported(format!(
                "the W4A16 GEMM needs an sm_90 GPU and a weight with 128- or 256-column tiles (this is sm_{}{}, \
                 {}-column tiles)",
                device.info().compute_capability.0,
                device.info().compute_capability.1,
                weight.plan.n_cta
            )));
        }
        if max_m == 0 || max_m > i32::MAX as usize {
            return Err(Error::invalid("max_m", max_m, "must be in 1..=2^31-1"));
        }
        let plan = &weight.plan;
        let (zeros, unit_groups) = (weight.zeros.is_some(), plan.group % K_TILE == 0);
        let tile = |wg_tokens| {
            GemmVariant::with_defaults(
                weight.act,
                plan.code_bits,
                zeros,
                unit_groups,
                conv,
                plan.n_cta / 128,
                wg_tokens,
            )
        };
        let k_split_tile =
            |tokens| GemmVariant::k_split(weight.act, plan.code_bits, zeros, unit_groups, plan.n_cta, tokens);
        // The 16-token tile is the linear layer's: the convolution epilogue stores 32 tokens per round.
        let tokens: &[usize] = if conv { &[64, 128] } else { &[16, 64, 96, 128] };
        let k_split_tokens: &[usize] = if conv { &[] } else { &KSPLIT_TOKENS };
        let per_cta = smem_limits(device.info().compute_capability).per_cta;
        let variants: Vec<GemmVariant> = (tokens.iter().map(|&t| tile(t)))
            .chain(k_split_tokens.iter().map(|&t| k_split_tile(t)))
            .map(|v| v.fitted(per_cta))
            .collect();
        // Up to six variants: compiled side by side, then loaded one by one.
        device.prepare(&variants.iter().map(|v| v.source()).collect::<Vec<_>>())?;
        let mut kernels = variants
            .into_iter()
            .map(|v| load_variant(device, v))
            .collect::<Result<Vec<_>>>()?;
        let k_split = kernels.split_off(tokens.len());
        let stage_x = device.function(kernels[0].variant.source(), "w4a16_gemm_stage_x")?;
        let sms = device.info().sm_count as usize;
        let counters = device
            .stream()
            .alloc_zeros::<u32>(sms * MAX_CLUSTER)
            .map_err(|e| crate::cuda::cuda_error("split-K counters", e))?;
        Ok(Self {
            weight,
            kernels,
            k_split,
            small_batch: SMALL_BATCH,
            stage_x,
            max_m,
            sms,
            forced_splits: splits,
            forced_stream: false,
            forced_tokens: None,
            forced_ksplit: false,
            max_cluster: MAX_SPLITS,
            trace: 0,
            dependent_launch: true,
            counters,
        })
    }

    /// The variant a batch of `m` rows runs.
    pub fn variant(&self, m: usize) -> GemmVariant {
        self.kernel(m).variant
    }

    /// The kernel a launch of `m` rows on `tile` runs: the K-split tile, or with [`GemmTile::Chosen`]
    /// [`LinearW4A16Gemm::kernel`]'s choice (the K-split tile when forced on).
    fn launch_kernel(&self, m: usize, tile: GemmTile) -> Result<&GemmKernel> {
        match tile {
            GemmTile::KSplit => self
                .k_split_kernel(m)
                .ok_or_else(|| Error::Unsupported("a convolution's GEMM has no K-split tile".into())),
            GemmTile::Chosen => Ok(self.kernel(m)),
        }
    }

    /// The K-split tile for a batch of `m` rows: the forced token count if it has one, else 64 tokens up to 64
    /// rows and above them the one [`LinearW4A16Gemm::estimated_cost`] finds cheaper (of those with 4 stages or
    /// more, if any); `None` for a convolution.
    fn k_split_kernel(&self, m: usize) -> Option<&GemmKernel> {
        let by_tokens = |tokens| self.k_split.iter().find(|k| k.variant.wg_tokens == tokens);
        if let Some(k) = self.forced_tokens.and_then(by_tokens) {
            return Some(k);
        }
        if m <= KSPLIT_TOKENS[0] {
            return by_tokens(KSPLIT_TOKENS[0]);
        }
        let cost = |k: &&GemmKernel| self.estimated_cost(k, m, self.split_plan_for(k, m));
        // The cost model does not price the ring: with 2 stages (the int8 layout's 128-token tile) each warpgroup
        // waits for every stage it reads to be refilled.
        let cheapest = |min_stages: usize| {
            (self.k_split.iter())
                .filter(|k| k.variant.stages >= min_stages)
                .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        };
        cheapest(4).or_else(|| cheapest(0))
    }

    /// The 16-token kernel for a linear layer's batches of up to [`TINY_BATCH`] rows, the 64-token one up to
    /// [`SMALL_BATCH`]; above, the tile of 64, 96 or 128 tokens whose launch [`LinearW4A16Gemm::estimated_cost`] finds
    /// cheapest. A convolution keeps the rule it was tuned with: 64 tokens when the 128-token tiles would not cover
    /// half the SMs. (The K-split tile is QuantLinear's choice, from its measured table: the cost model does not tell it
    /// apart from the 64-token tile well enough.)
    fn kernel(&self, m: usize) -> &GemmKernel {
        // Only when forced: the K-split choice prices both of its tiles, work every launch would otherwise repeat.
        if let Some(k) = self.forced_ksplit.then(|| self.k_split_kernel(m)).flatten() {
            return k;
        }
        let (small, large) = (&self.kernels[self.slot(64)], &self.kernels[self.slot(128)]);
        let tokens = match self.forced_tokens {
            Some(tokens) if self.has_tile(tokens) => tokens,
            _ if m <= TINY_BATCH && m <= self.small_batch && self.has_tile(16) => 16,
            _ if m <= self.small_batch => 64,
            _ if small.variant.conv => {
                if 2 * self.tiles(large, m) < self.sms {
                    64
                } else {
                    128
                }
            }
            _ => {
                // The cheapest of the 64-, 96- and 128-token tiles; min_by keeps the first, the smaller, on a tie.
                let cost = |tokens| {
                    let k = &self.kernels[self.slot(tokens)];
                    self.estimated_cost(k, m, self.split_plan_for(k, m))
                };
                [64, 96, 128]
                    .map(|tokens| (tokens, cost(tokens)))
                    .into_iter()
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(64, |(tokens, _)| tokens)
            }
        };
        &self.kernels[self.slot(tokens)]
    }

    /// Whether this operator has a tile of `tokens` per warpgroup (64 and 128 always; 16 and 96 for a linear layer).
    fn has_tile(&self, tokens: usize) -> bool {
        self.kernels.iter().any(|k| k.variant.wg_tokens == tokens)
    }

    /// The index in `kernels` of the tile with `tokens` per warpgroup, which the caller checked exists.
    fn slot(&self, tokens: usize) -> usize {
        let slot = self.kernels.iter().position(|k| k.variant.wg_tokens == tokens);
        slot.expect("64 and 128 always exist; other tiles are checked with has_tile")
    }

    /// Column tiles of `kernel`: the weight's, or twice as many half tiles.
    fn column_tiles(&self, kernel: &GemmKernel) -> usize {
        self.weight.plan.n_tiles() * kernel.variant.halves()
    }

    fn tiles(&self, kernel: &GemmKernel, m: usize) -> usize {
        self.column_tiles(kernel) * m.div_ceil(kernel.variant.bm())
    }

    /// A launch's main loop and split-K epilogue in microseconds (see [`KT_US`]): waves of CTAs x the k tiles of a
    /// split x the cost of one (the whole tiles' waves of a hybrid plan first), plus the epilogue of a split tile.
    /// Only its order matters: it chooses.
    fn estimated_cost(&self, kernel: &GemmKernel, m: usize, plan: SplitPlan) -> f64 {
        let v = &kernel.variant;
        let k_tiles = self.weight.plan.k_tiles();
        if plan.stream {
            let units = self.tiles(kernel, m) * k_tiles;
            let per_cta = units.div_ceil(units.min(self.sms));
            let pieces = k_tiles.div_ceil(per_cta) + 1; // the most CTAs sharing a tile
            return per_cta as f64 * kt_us(v) + STREAM_FIXUP_US + pieces as f64 * STREAM_PIECE_US;
        }
        let whole_waves = plan.whole.div_ceil(self.hybrid_grid());
        let waves = ((self.tiles(kernel, m) - plan.whole) * plan.splits).div_ceil(self.sms);
        let kt = k_tiles.div_ceil(plan.splits);
        let mut cost = (whole_waves * k_tiles + waves * kt) as f64 * kt_us(v);
        if v.ksplit {
            cost += (whole_waves + waves) as f64 * ksplit_exchange_us(v);
        }
        if plan.splits > 1 {
            let tile_kb = (v.bm() * v.n_cta() * 4) as f64 / 1024.0;
            let pushed = tile_kb * (plan.cluster - 1) as f64 / plan.cluster as f64;
            cost += SPLIT_EPILOGUE_US + PUSH_US_PER_KB * pushed;
        }
        if plan.groups > 1 {
            cost += GROUPS_EPILOGUE_US;
        }
        cost
    }

    /// How `kernel` splits the tiles of a batch of `m` rows. Linear: the cheapest plan
    /// ([`LinearW4A16Gemm::estimated_cost`]) among no split and every split count up to 8 (each split keeping at
    /// least 4 k tiles) whose clusters are all resident at once, one cluster per tile or, failing that, several
    /// smaller ones. Convolution (no workspace): the most splits whose one cluster per tile all fit, the rule its
    /// figures were measured with. A forced count is capped the same way.
    fn split_plan_for(&self, kernel: &GemmKernel, m: usize) -> SplitPlan {
        let tiles = self.tiles(kernel, m);
        let most = (self.weight.plan.k_tiles() / MIN_KT_PER_SPLIT).clamp(1, MAX_SPLITS);
        let wanted = self.forced_splits.unwrap_or(MAX_SPLITS).clamp(1, most);
        // The largest cluster dividing `splits` whose groups all fit, if any.
        let fitting = |splits: usize, groups_allowed: bool| {
            (2..=splits)
                .rev()
                .filter(|&cluster| splits % cluster == 0 && (groups_allowed || cluster == splits))
                .filter(|&cluster| cluster <= self.max_cluster)
                .filter(|&cluster| cluster == splits || kernel.variant.groups_fit(cluster, splits / cluster))
                .find(|&cluster| tiles * (splits / cluster) <= kernel.resident_clusters[cluster])
                .map(|cluster| SplitPlan {
                    splits,
                    cluster,
                    groups: splits / cluster,
                    whole: 0,
                    stream: false,
                })
        };
        if kernel.variant.conv {
            return (2..=wanted)
                .rev()
                .find_map(|s| fitting(s, false))
                .unwrap_or(SplitPlan::NONE);
        }
        // STREAM-K, only when forced (`force_stream_k`): linear tiles of up to STREAM_MAX_TOKENS tokens, at most one
        // per SM (the counters). Measured on the H200 it matched the whole-tile plan with RAMP on the one layer where
        // it had gained (`w4a16-gemm.md`), so the model does not offer it.
        let v = &kernel.variant;
        let stream = !v.conv && !v.ksplit && v.wg_tokens <= STREAM_MAX_TOKENS && tiles <= self.sms;
        if stream && self.forced_stream {
            return SplitPlan::STREAM;
        }
        if self.forced_splits.is_some() {
            return (2..=wanted)
                .rev()
                .find_map(|s| fitting(s, true))
                .unwrap_or(SplitPlan::NONE);
        }
        let candidates = (2..=wanted).filter_map(|s| fitting(s, true));
        // HYBRID: the full waves of whole tiles, then the rest (at most half a wave) split in two, as clusters of 2
        // over the whole grid.
        let grid = self.hybrid_grid();
        let (waves, rest) = (tiles / grid, tiles % grid);
        let fits = wanted >= 2 && self.max_cluster >= 2 && 2 * kernel.resident_clusters[2] >= grid;
        let hybrid = (fits && waves > 0 && rest > 0 && 2 * rest <= grid).then_some(SplitPlan {
            splits: 2,
            cluster: 2,
            groups: 1,
            whole: waves * grid,
            stream: false,
        });
        // Fewer splits first, so a tie keeps the cheaper epilogue.
        std::iter::once(SplitPlan::NONE)
            .chain(hybrid)
            .chain(candidates)
            .fold((SplitPlan::NONE, f64::INFINITY), |best, plan| {
                let cost = self.estimated_cost(kernel, m, plan);
                if cost < best.1 {
                    (plan, cost)
                } else {
                    best
                }
            })
            .0
    }

    /// Forces the kernel's STREAM-K on wherever the tile allows it (`true`); `false` restores the cost model's plans,
    /// which leave it out (testing, benchmarking).
    #[doc(hidden)]
    pub fn force_stream_k(&mut self, on: bool) {
        self.forced_stream = on;
    }

    /// Reloads every tile with at most `stages` stages in flight while the pipeline first fills (the kernel's
    /// RAMP; 0: all of them; benchmarking).
    #[doc(hidden)]
    pub fn set_ramp(&mut self, device: &CudaDevice, stages: usize) -> Result<()> {
        for tokens in self.kernels.iter().map(|k| k.variant.wg_tokens).collect::<Vec<_>>() {
            self.reload(device, tokens, |v| v.ramp = stages)?;
        }
        Ok(())
    }

    /// Reloads the 64- and 128-token tiles with their second consumer warpgroup `k_tiles` k tiles behind the first
    /// (the kernel's STAGGER; 0: none; benchmarking; by default only the 128-token tile has it). A tile of fewer than
    /// [`STAGGER_MIN_STAGES`] stages keeps none.
    #[doc(hidden)]
    pub fn set_lag(&mut self, device: &CudaDevice, k_tiles: usize) -> Result<()> {
        let stages = self.kernels[self.slot(64)]
            .variant
            .stages
            .min(self.kernels[self.slot(128)].variant.stages);
        if k_tiles >= stages {
            return Err(Error::invalid(
                "lag",
                k_tiles,
                format!("must be below the tiles' {stages} stages"),
            ));
        }
        self.reload(device, 64, |v| v.lag = k_tiles)?;
        self.reload(device, 128, |v| v.lag = k_tiles)
    }

    /// Caps the CTAs per cluster of a split tile at `ctas` (at least 2), so that small shapes split into several
    /// cluster groups (testing).
    #[doc(hidden)]
    pub fn set_max_cluster(&mut self, ctas: usize) {
        self.max_cluster = ctas.max(2);
    }

    /// Sends batches of up to `rows` rows (instead of [`SMALL_BATCH`]) to the 64-token kernel (benchmarking).
    #[doc(hidden)]
    pub fn set_small_batch(&mut self, rows: usize) {
        self.small_batch = rows;
    }

    /// Reloads the kernel with `tokens` (16, 64 or 128) tokens per warpgroup to convert `steps` (2 or 3) k16
    /// steps ahead (benchmarking).
    #[doc(hidden)]
    pub fn set_lookahead(&mut self, device: &CudaDevice, tokens: usize, steps: usize) -> Result<()> {
        check_lookahead(steps)?;
        self.reload(device, tokens, |v| v.lookahead = steps)
    }

    /// Reloads the 64-token K-split tile to convert `steps` (2 or 3) k16 steps ahead (benchmarking; the 128-token
    /// one has registers for 2 only); without one, nothing.
    #[doc(hidden)]
    pub fn set_k_split_lookahead(&mut self, device: &CudaDevice, steps: usize) -> Result<()> {
        check_lookahead(steps)?;
        self.reload_k_split(device, 64, |v| v.lookahead = steps)
    }

    /// Reloads the K-split tiles with at most `stages` stages in flight while the pipeline first fills (the kernel's
    /// RAMP; 0: all of them; benchmarking).
    #[doc(hidden)]
    pub fn set_k_split_ramp(&mut self, device: &CudaDevice, stages: usize) -> Result<()> {
        self.reload_k_split(device, usize::MAX, |v| v.ramp = stages)
    }

    /// Reloads the K-split tiles of at most `max_tokens` tokens as `change` modifies their variants.
    fn reload_k_split(
        &mut self,
        device: &CudaDevice,
        max_tokens: usize,
        change: impl Fn(&mut GemmVariant),
    ) -> Result<()> {
        for k in self.k_split.iter_mut().filter(|k| k.variant.wg_tokens <= max_tokens) {
            let mut variant = k.variant;
            change(&mut variant);
            *k = load_variant(device, variant)?;
        }
        Ok(())
    }

    /// Reloads the kernel with `tokens` tokens per warpgroup with at most `stages` pipeline stages (2 or more;
    /// benchmarking).
    #[doc(hidden)]
    pub fn set_stages(&mut self, device: &CudaDevice, tokens: usize, stages: usize) -> Result<()> {
        if !(2..=MAX_STAGES).contains(&stages) {
            return Err(Error::invalid("stages", stages, "must be in 2..=6"));
        }
        self.reload(device, tokens, |v| v.stages = stages)
    }

    /// Reloads the kernel with `tokens` tokens per warpgroup as `change` modifies its variant.
    fn reload(&mut self, device: &CudaDevice, tokens: usize, change: impl FnOnce(&mut GemmVariant)) -> Result<()> {
        if !self.has_tile(tokens) {
            return Err(Error::invalid(
                "tokens",
                tokens,
                "this operator has no tile of that many tokens",
            ));
        }
        let slot = self.slot(tokens);
        let mut variant = self.kernels[slot].variant;
        change(&mut variant);
        self.kernels[slot] = load_variant(device, variant)?;
        Ok(())
    }

    /// Runs every batch on the kernel with `Some(16)` or `Some(96)` (linear), `Some(64)` or `Some(128)` tokens per
    /// warpgroup, and the K-split tile, where it runs, on the one of 64 or 128; `None` restores the choice by batch
    /// size (benchmarking).
    #[doc(hidden)]
    pub fn force_tile_tokens(&mut self, tokens: Option<usize>) {
        self.forced_tokens = tokens;
    }

    /// Runs every batch on the K-split tile (`true`; a linear layer's), or restores the choice by batch size
    /// (testing, benchmarking).
    #[doc(hidden)]
    pub fn force_k_split(&mut self, on: bool) {
        self.forced_ksplit = on;
    }

    /// Whether this operator has the K-split tile (a linear layer's operator does).
    pub fn has_k_split(&self) -> bool {
        !self.k_split.is_empty()
    }

    /// Forces the split count of every batch (capped as [`LinearW4A16Gemm::with_weight`]'s); `None`: the cost
    /// model's (benchmarking).
    #[doc(hidden)]
    pub fn force_splits(&mut self, splits: Option<usize>) {
        self.forced_splits = splits;
    }

    /// Diagnostics: every later launch writes its CTAs' timelines (`TRACE_SLOTS` = 10 `u64` per CTA, see the kernel's
    /// `Trace`) to the device buffer at `address`, which must hold 8 x SMs values; 0 turns tracing off.
    #[doc(hidden)]
    pub fn set_trace(&mut self, address: u64) {
        self.trace = address;
    }

    /// Launches with (true, the default) or without programmatic dependent launch (benchmarking).
    #[doc(hidden)]
    pub fn set_dependent_launch(&mut self, on: bool) {
        self.dependent_launch = on;
    }

    /// The device weight.
    pub fn weight(&self) -> &Arc<DeviceW4> {
        &self.weight
    }

    /// CTAs per output tile for a batch of `m` rows (split-K; 1: none).
    pub fn splits(&self, m: usize) -> usize {
        self.split_plan(m).splits
    }

    /// How a batch of `m` rows splits its tiles (see the kernel's SPLIT-K).
    pub fn split_plan(&self, m: usize) -> SplitPlan {
        self.split_plan_for(self.kernel(m), m)
    }

    /// The grid of a hybrid plan: every SM, in whole clusters of 2.
    pub fn hybrid_grid(&self) -> usize {
        self.sms - self.sms % 2
    }

    fn staged_x_bytes(&self) -> usize {
        (self.max_m * self.weight.plan.k_pad * 2).next_multiple_of(256)
    }

    /// Bytes of the fp32 partials of split tiles, at most: the sums that the cluster groups of split tiles
    /// exchange (the tiles x groups of a launch are at most SMs / 2 clusters of 2 CTAs or more, each publishing
    /// ceil(BM / 2 / cluster) row pairs per CTA), or, when STREAM-K is forced, its two slots of one tile per SM.
    fn partials_bytes(&self) -> usize {
        if self.kernels[0].variant.conv {
            return 0;
        }
        let k = &self.kernels[self.slot(128)].variant;
        let groups = self.sms * (k.bm() / 2 + 2) * k.n_cta() * 4;
        if !self.forced_stream {
            return groups;
        }
        let stream = self
            .kernels
            .iter()
            .map(|k| &k.variant)
            .filter(|v| v.wg_tokens <= STREAM_MAX_TOKENS);
        let slots = stream.map(|v| 2 * self.sms * v.bm() * v.n_cta() * 4).max().unwrap_or(0);
        groups.max(slots)
    }

    /// Device scratch `run` needs: x staged for TMA (act-order or unaligned x), then the split-K partials of
    /// tiles split into several cluster groups.
    pub fn workspace_bytes(&self) -> usize {
        self.staged_x_bytes() + self.partials_bytes()
    }

    /// `y[m, N] = x[m, K] · W^T (+ bias)` with contiguous rows and no activation.
    pub fn run<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        y: &mut dyn DevicePtrMut<T>,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let p = &self.weight.plan;
        self.run_strided(stream, x, p.input_k, m, bias, Activation::None, y, p.n, workspace)
    }

    /// `y[m, N] = act(x[m, K] · W^T + bias)` on `stream`, row `i` of x at element `i * x_stride`, of y at
    /// `i * y_stride`. Checks dtypes and sizes on the host, then launches without allocating or synchronising.
    #[allow(clippy::too_many_arguments)]
    pub fn run_strided<T: Float + DeviceRepr>(
        &self,
        stream: &CudaStream,
        x: &dyn DevicePtr<T>,
        x_stride: usize,
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        activation: Activation,
        y: &mut dyn DevicePtrMut<T>,
        y_stride: usize,
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let (xs, ys) = ((x, x_stride), (y, y_stride));
        self.run_on(GemmTile::Chosen, stream, xs, m, bias, activation, ys, workspace)
    }

    /// [`LinearW4A16Gemm::run_strided`] on `tile`, x and y given as (buffer, row stride). [`GemmTile::KSplit`] runs
    /// the K-split tile whatever `m` (QuantLinear's measured table takes it where it was fastest); it is an error
    /// for a convolution's operator, which has none.
    #[allow(clippy::too_many_arguments)]
    pub fn run_on<T: Float + DeviceRepr>(
        &self,
        tile: GemmTile,
        stream: &CudaStream,
        (x, x_stride): (&dyn DevicePtr<T>, usize),
        m: usize,
        bias: Option<&dyn DevicePtr<T>>,
        activation: Activation,
        (y, y_stride): (&mut dyn DevicePtrMut<T>, usize),
        workspace: &mut dyn DevicePtrMut<u8>,
    ) -> Result<()> {
        let p = &self.weight.plan;
        let kernel = self.launch_kernel(m, tile)?;
        let call = (self.weight.act, self.max_m, self.workspace_bytes());
        let Some(CallBuffers {
            x: x_ptr,
            y: y_ptr,
            bias: bias_ptr,
            workspace: ws,
        }) = call_buffers(p, call, stream, (x, x_stride), m, bias, (y, y_stride), workspace)?
        else {
            return Ok(());
        };
        let (qweight, scales, zeros, perm) = self.weight.pointers(stream);

        // TMA reads x in place when its rows are 16-byte aligned and in k order; otherwise x is staged.
        let direct = perm == 0 && x_ptr % 16 == 0 && (x_stride * 2) % 16 == 0;
        let (x_ptr, x_stride, x_cols) = if direct {
            (x_ptr, x_stride, p.k)
        } else {
            stage_x(stream, &self.stage_x, p, x_ptr, x_stride, perm, ws, m)?;
            (ws, p.k_pad, p.k_pad)
        };
        let args = GemmArgs {
            qweight,
            scales,
            zeros,
            bias: bias_ptr,
            y: y_ptr,
            partials: ws + self.staged_x_bytes() as u64,
            counters: self.counters.device_ptr(stream).0,
            ..GemmArgs::default()
        };
        let y_layout = (i32::from(y_ptr % 16 == 0 && y_stride % 8 == 0), y_stride as i64);
        // x's tensor map bounds (K or k_pad columns, m rows, x_stride), y rows (N columns), bias (N) and the
        // workspace (staged x) were checked above.
        self.launch(
            stream,
            kernel,
            m,
            (x_ptr, x_cols, x_stride),
            args,
            activation,
            y_layout,
            ConvFields::default(),
        )
    }
}

impl LinearW4A16Gemm {
    /// The convolution launch (an operator made by [`LinearW4A16Gemm::for_conv`]): `m = batch · grid_tokens`
    /// tokens of the padded NHWC image `launch.x` against the weight, y written NCHW. The caller has checked every
    /// buffer against the geometry.
    pub(crate) fn run_conv(&self, stream: &CudaStream, launch: &ConvLaunch) -> Result<()> {
        let g = &launch.geometry;
        let m = g.batch as usize * g.grid_tokens as usize;
        if m == 0 {
            return Ok(());
        }
        debug_assert!(self.kernel(m).variant.conv && self.kernel(m).variant.offsets);
        let (qweight, scales, offsets, _) = self.weight.pointers(stream);
        let args = GemmArgs {
            qweight,
            scales,
            zeros: offsets,
            bias: launch.bias,
            y: launch.y,
            ..GemmArgs::default()
        };
        let channels = g.channels as usize;
        self.launch(
            stream,
            self.kernel(m),
            m,
            (launch.x, channels, channels),
            args,
            launch.activation,
            (0, 0),
            *g,
        )
    }

    /// Launches `kernel` for `m` tokens on a persistent grid (one CTA per SM at most, each taking every
    /// gridDim-th tile x split): x read through a tensor map over `(address, columns, row stride)` of `m` rows, the
    /// other buffers in `args` (the trace hook is filled in here). Every buffer was checked by the caller.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        stream: &CudaStream,
        kernel: &GemmKernel,
        m: usize,
        (x, x_cols, x_stride): (u64, usize, usize),
        mut args: GemmArgs,
        activation: Activation,
        (y_vector, y_stride): (i32, i64),
        conv: ConvFields,
    ) -> Result<()> {
        let p = &self.weight.plan;
        let bm = kernel.variant.bm();
        let element = MapElement::activation(self.weight.act);
        // Boxes of 64 columns: one 128-byte swizzled row of 16-bit values.
        let xmap = tensor_map_2d("x", element, x, (m, x_cols, x_stride), (bm, 64), true)?;
        let m_tiles = m.div_ceil(bm);
        let split = self.split_plan_for(kernel, m);
        let splits = split.splits;
        // The split-K epilogue's share of the tile per CTA of a cluster, in row pairs (see `epilogue_split`).
        let split_pairs = (bm / 2).div_ceil(split.cluster);
        let column_tiles = self.column_tiles(kernel);
        let tiles = column_tiles * m_tiles;
        let items = if split.stream {
            tiles * p.k_tiles()
        } else {
            split.whole + (tiles - split.whole) * splits
        };
        if m > i32::MAX as usize || items > i32::MAX as usize {
            return Err(Error::invalid(
                "x",
                format!("{m} rows"),
                "too many tiles for one launch",
            ));
        }
        args.trace = self.trace;
        let shape = GemmShape {
            m: m as i32,
            n: p.n as i32,
            k: p.k as i32,
            kt: p.k_tiles() as i32,
            nt: column_tiles as i32,
            mt: m_tiles as i32,
            group: p.group as i32,
            gp: p.group_rows as i32,
            group_shift: if p.group.is_power_of_two() {
                p.group.trailing_zeros() as i32
            } else {
                -1
            },
            splits: splits as i32,
            cluster: split.cluster as i32,
            groups: split.groups as i32,
            whole: split.whole as i32,
            stream: i32::from(split.stream),
            split_pairs: split_pairs as i32,
            split_pairs_recip: 65536_usize.div_ceil(split_pairs) as i32,
            activation: activation.code(),
            y_vector,
            y_stride,
            conv,
        };
        // Split-K runs clusters of `cluster` CTAs (grid = items, a multiple of splits; a hybrid plan: every SM, in
        // whole clusters, each CTA's last item its split one); STREAM-K one CTA per SM, at least a unit each (here
        // `items` counts units). Every launch is the
        // programmatic dependent of the stream's previous kernel (the kernel's DEPENDENT LAUNCH: the next GEMM's
        // first weight stages load during this one's tail; a convolution's image comes from its pack kernel).
        let grid = if split.whole > 0 {
            self.hybrid_grid()
        } else {
            items.min(self.sms)
        };
        let launch = Launch {
            grid: grid as u32,
            grid_y: 1,
            block: BLOCK,
            smem: kernel.variant.smem_bytes(),
            cluster: (splits > 1).then_some(split.cluster),
            dependent: self.dependent_launch,
        };
        let mut params: [*mut std::ffi::c_void; 3] = [
            &xmap as *const TensorMap as *mut _,
            &args as *const GemmArgs as *mut _,
            &shape as *const GemmShape as *mut _,
        ];
        // SAFETY: x is read through the tensor map (zeros outside its bounds); y, bias and (conv) offsets were
        // checked by the caller for this m; the weight buffers are the operator's own. `params` points at the three
        // kernel parameters, in order.
        unsafe {
            launch_ex(&kernel.function, stream, launch, &mut params, || {
                format!("launching w4a16_gemm (splits {splits}, convolution {})", conv.taps > 0)
            })
        }
    }
}

/// Which tile a launch takes ([`LinearW4A16Gemm::run_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmTile {
    /// [`LinearW4A16Gemm::kernel`]'s choice by batch size.
    Chosen,
    /// The K-split tile.
    KSplit,
}

/// One compiled GEMM variant and how many clusters of each size (index: CTAs per cluster) it can keep resident.
struct GemmKernel {
    variant: GemmVariant,
    function: CudaFunction,
    resident_clusters: [usize; MAX_SPLITS + 1],
}

/// The kernel's LB_LOOKAHEAD: 2 or 3 steps. (4 gained nothing on any small tile and spilled in the token-split
/// 64-token tile: `docs/notes/w4a16-gemm.md`, "Alternate stages, and deeper wgmma queues".)
fn check_lookahead(steps: usize) -> Result<()> {
    if (2..=3).contains(&steps) {
        Ok(())
    } else {
        Err(Error::invalid("lookahead", steps, "must be 2 or 3"))
    }
}

/// The lookahead a variant is built with: 3 for 16- and 64-token tiles, whose wgmma groups are too short to cover
/// a conversion two steps ahead; 2 for 128-token tiles, whose 128 accumulators leave no registers for 8 buffers.
fn default_lookahead(wg_tokens: usize) -> usize {
    if wg_tokens <= 64 {
        3
    } else {
        2
    }
}

/// Compiles (or fetches) `variant` with as many pipeline stages as fit, up to its `stages`, and allows it that
/// much dynamic shared memory.
fn load_variant(device: &CudaDevice, variant: GemmVariant) -> Result<GemmKernel> {
    let variant = variant.fitted(smem_limits(device.info().compute_capability).per_cta);
    let function = device.function_with_shared_memory(variant.source(), "w4a16_gemm", variant.smem_bytes())?;
    let mut resident_clusters = [0; MAX_SPLITS + 1];
    for (ctas, resident) in resident_clusters.iter_mut().enumerate().skip(2) {
        *resident = resident_cluster_count(&function, BLOCK, variant.smem_bytes(), ctas);
    }
    Ok(GemmKernel {
        variant,
        function,
        resident_clusters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the stage count settles on a Hopper GPU, and which tiles keep the STAGGER: the 4-bit 128-token tile of
    /// 256 columns (4 stages) does, the int8 layout's (3 stages, measured slower with it) and every other tile do not.
    #[test]
    fn stages_and_stagger_of_the_linear_tiles() {
        let smem = smem_limits((9, 0)).per_cta;
        let tile = |wbits: usize, wg_n: usize, wg_tokens: usize| {
            GemmVariant::with_defaults(DType::F16, wbits, true, true, false, wg_n, wg_tokens).fitted(smem)
        };
        let settled = |v: GemmVariant| (v.stages, v.lag);
        assert_eq!(settled(tile(4, 2, 128)), (4, STAGGER_K_TILES));
        assert_eq!(settled(tile(8, 2, 128)), (3, 0));
        assert_eq!(settled(tile(4, 1, 128)), (2, 0));
        assert_eq!(settled(tile(4, 2, 64)).1, 0);
        assert_eq!(settled(tile(4, 2, 16)).1, 0);
    }

    /// The K-split tiles' rings settle on an even number of stages (the kernel's EVEN RING), whatever the
    /// weight: the int8 layout's tiles, which fit 5 and 3, take 4 and 2.
    #[test]
    fn k_split_rings_are_even() {
        let smem = smem_limits((9, 0)).per_cta;
        let mut settled = Vec::new();
        for (act, wbits) in [(DType::F16, 4), (DType::Bf16, 4), (DType::F16, 8)] {
            for (zeros, unit_groups, unit_n) in [(true, true, 256), (true, false, 256), (false, false, 128)] {
                for tokens in KSPLIT_TOKENS {
                    let v = GemmVariant::k_split(act, wbits, zeros, unit_groups, unit_n, tokens).fitted(smem);
                    assert!(
                        v.stages % 2 == 0 && v.smem_bytes() <= smem,
                        "{}: {} stages",
                        v.name(),
                        v.stages
                    );
                    settled.push((wbits, unit_groups, tokens, v.stages));
                }
            }
        }
        assert!(settled.contains(&(4, true, 64, 6)) && settled.contains(&(4, true, 128, 4)));
        assert!(settled.contains(&(8, true, 64, 4)) && settled.contains(&(8, true, 128, 2)));
    }

    /// Every GEMM specialisation a layer or a convolution can load compiles for sm_90a without spills, a stack
    /// frame or a serialised wgmma pipeline (NVRTC only, no GPU). A split-K epilogue that kept arrays in local
    /// memory once cost 30% of the main loop's speed with every GPU test passing.
    #[test]
    fn gemm_variants_compile_without_local_memory() {
        let mut variants = Vec::new();
        for (act, wbits) in [(DType::F16, 4), (DType::Bf16, 4), (DType::F16, 8)] {
            let tiles = [(1, 16), (1, 64), (1, 96), (1, 128), (2, 16), (2, 64), (2, 96), (2, 128)];
            for (wg_n, wg_tokens) in tiles {
                // A linear layer with zero codes; a convolution (MNN offsets, no zero codes), f16 only, on 64- and
                // 128-token tiles.
                for (zeros, conv) in [(true, false), (false, true)] {
                    if !conv || (act == DType::F16 && (wg_tokens == 64 || wg_tokens == 128)) {
                        variants.push(GemmVariant::with_defaults(
                            act, wbits, zeros, true, conv, wg_n, wg_tokens,
                        ));
                    }
                }
            }
        }
        assert_compile_without_local_memory(&variants);
    }

    /// The same for the K-split tiles: 64 and 128 tokens, over 256- and 128-column units, with one scale row a
    /// stage or several.
    #[test]
    fn k_split_tiles_compile_without_local_memory() {
        let mut variants = Vec::new();
        for (act, wbits) in [(DType::F16, 4), (DType::Bf16, 4), (DType::F16, 8)] {
            for (unit_n, unit_groups) in [(256, true), (128, false)] {
                for tokens in KSPLIT_TOKENS {
                    variants.push(GemmVariant::k_split(act, wbits, true, unit_groups, unit_n, tokens));
                }
            }
        }
        // The lookahead benchmarking may also set (`set_k_split_lookahead`).
        let v = GemmVariant::k_split(DType::F16, 4, true, true, 256, 64);
        variants.push(GemmVariant { lookahead: 3, ..v });
        assert_compile_without_local_memory(&variants);
    }

    fn assert_compile_without_local_memory(variants: &[GemmVariant]) {
        if !crate::cuda::nvrtc_present() || crate::cuda::include_dir().is_none() {
            println!("skipped: NVRTC or cuda_fp16.h not found");
            return;
        }
        let limits = smem_limits((9, 0));
        // `LOWBIT_VARIANTS=<text>`: only the variants whose name contains it (seconds instead of minutes).
        let only = std::env::var("LOWBIT_VARIANTS").ok();
        let variants: Vec<GemmVariant> = (variants.iter().map(|v| v.fitted(limits.per_cta)))
            .filter(|v| only.as_ref().map_or(true, |only| v.name().contains(only.as_str())))
            .collect();
        let compiled = crate::cuda::on_compile_threads(&variants, |v| crate::cuda::compile(v.source(), "sm_90a"));
        for (v, compiled) in variants.iter().zip(compiled) {
            let compiled = compiled.unwrap();
            if let Ok(dir) = std::env::var("LOWBIT_DUMP_CUBIN") {
                std::fs::write(format!("{dir}/{}.cubin", v.name()), &compiled.cubin).unwrap();
            }
            let local = compiled.local_memory();
            println!(
                "{}: {} stages, {} bytes of shared memory",
                v.name(),
                v.stages,
                v.smem_bytes()
            );
            assert!(local.is_empty(), "{}: {local:?}", v.name());
            // Nor a wgmma pipeline that ptxas serialised or had to add waits to (what `lowbit doctor` refuses
            // for the default variant).
            let serialised = compiled.wgmma_serialisation();
            assert!(serialised.is_empty(), "{}: {serialised:?}", v.name());
        }
    }
}
