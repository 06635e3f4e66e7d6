//! The fast CPU linear layer: `y[M, N] = x[M, K] · W^T (+ bias)` straight from int4/int8 codes.
//!
//! [`LinearCpu::new`] validates the weight and repacks it once:
//! - **Tiles of 16 output columns.** For each tile and each input `k`, the 16 codes sit side by side (4-bit: 8 bytes,
//!   low nibbles = columns 0..8, high nibbles = columns 8..16; 8-bit: 16 bytes), so one load and a widening
//!   convert give two 8-lane f32 vectors of codes. The last tile is padded with zero codes and zero scales.
//! - **Act-order resolved.** A non-trivial `g_idx` is turned into a permutation of K that makes every group
//!   contiguous; [`LinearCpu::forward`] gathers `x` in that order while converting it to f32.
//! - **Per-group constants.** `scale` and `scale * zero` per (column, group), 16 at a time.
//!
//! The arithmetic, per output element (row `m`, column `n`), is the same for every batch size and every code path:
//! K is cut into blocks (each group, split into pieces of at most `BLOCK_K` = 128); for each block
//! `acc = Σ x[k] * code[k]` (f32, one FMA per `k` in order), then `y += scale * acc - (scale * zero) * Σ x[k]`.
//! Subtracting the zero once per block instead of once per weight is what lets the inner loop be a bare FMA.
//! Because no path reorders this sum, row 0 of a batch equals the single-row result bit for bit.
//!
//! Two ways to feed that loop, chosen by batch size (they give identical bits):
//! - **Decode as you go** (`M <= FUSED_MAX_ROWS`, decode/GEMV): the inner loop decodes the codes of up to four tiles
//!   and FMAs them into up to four rows; work is split over (rows ×) column tiles.
//! - **Decode once per row chunk** (GEMM): a block of two tiles is decoded into a small f32 tile in L1 and reused by
//!   a register-blocked 6×16 micro-kernel over every row of the chunk; work is split over (rows × columns).
//!
//! Kernels exist for AVX2+FMA (x86-64, detected at run time, no `RUSTFLAGS` needed) and for any CPU (portable
//! eight-lane arrays the compiler vectorises; multiply and add are separate there, so its bits differ from AVX2's
//! fused multiply-add by rounding only).

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::formats::QuantMatrix;
use rayon::prelude::*;
use std::borrow::Cow;
use std::ops::Range;

/// Output columns per weight tile: two 8-lane f32 vectors.
const TILE_N: usize = 16;
/// Lanes per vector.
const LANES: usize = 8;
/// Longest run of `k` accumulated before it is folded into `y`; longer groups are split. Sized so a decoded block
/// of two tiles (2 × 128 × 16 × 4 B = 16 KiB) stays in L1 beside the activations it meets.
const BLOCK_K: usize = 128;
/// Batches of at most this many rows decode the codes inside the FMA loop; larger ones decode each block once.
/// (Measured: decode-as-you-go 4 rows at a time matches the decoded-tile path's FMA rate up to about here, while
/// decoding into a tile costs a store per weight that few rows cannot repay.)
const FUSED_MAX_ROWS: usize = 16;
/// Rows per decode-as-you-go kernel: 4 rows × 2 vectors = 8 accumulators, beside the decode temporaries.
const FUSED_ROWS_PER_KERNEL: usize = 4;
/// Tiles decoded together in the GEMM path (and the widest tile count its micro-kernels cover).
const DECODE_TILES: usize = 2;
/// Most rows a micro-kernel covers: 6 rows × 2 vectors = 12 accumulators of the 16 AVX2 registers.
const MAX_ROWS_PER_KERNEL: usize = 6;
/// Rows per GEMM task: each decoded block is reused by this many rows.
const GEMM_ROW_CHUNK: usize = 96;
/// Column tiles per task (GEMV and GEMM): 128 columns, a multiple of the widest decode-as-you-go kernel (4 tiles).
const TILE_CHUNK: usize = 8;

/// The instruction set a [`LinearCpu`] runs its inner loops with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuIsa {
    /// x86-64 AVX2 with FMA, detected at run time.
    Avx2Fma,
    /// Plain Rust on eight-lane arrays; runs anywhere.
    Portable,
}

impl CpuIsa {
    /// The fastest instruction set this CPU supports.
    pub fn detect() -> Self {
        if CpuIsa::Avx2Fma.is_supported() {
            CpuIsa::Avx2Fma
        } else {
            CpuIsa::Portable
        }
    }

    /// Whether this CPU can run it.
    pub fn is_supported(self) -> bool {
        match self {
            CpuIsa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            CpuIsa::Avx2Fma => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(not(target_arch = "x86_64"))]
            CpuIsa::Avx2Fma => false,
        }
    }

    /// Short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            CpuIsa::Avx2Fma => "avx2+fma",
            CpuIsa::Portable => "portable",
        }
    }
}

/// A K range that is accumulated on its own, then folded into `y` with its group's scale and zero.
#[derive(Debug, Clone, Copy)]
struct KBlock {
    /// First position in the (permuted) K order.
    start: usize,
    len: usize,
    group: usize,
}

/// A quantized linear weight repacked for the CPU; see the module docs for the layout and the arithmetic.
#[derive(Debug, Clone)]
pub struct LinearCpu {
    n: usize,
    k: usize,
    bits: u8,
    groups: usize,
    tiles: usize,
    /// Codes, tile after tile; within a tile, `k` (permuted order) after `k`, `code_bytes_per_k()` bytes each.
    codes: Vec<u8>,
    /// `[tiles][groups][16]` scales (zero for padding columns).
    scales: Vec<f32>,
    /// `[tiles][groups][16]` scale × zero code.
    scaled_zeros: Vec<f32>,
    /// Every K block, in order.
    blocks: Vec<KBlock>,
    /// Original input index of each permuted position; `None` when groups are already contiguous.
    perm: Option<Vec<usize>>,
    isa: CpuIsa,
}

impl LinearCpu {
    /// Validates `w` and repacks it for the fastest instruction set of this CPU.
    pub fn new(w: &QuantMatrix) -> Result<Self> {
        Self::with_isa(w, CpuIsa::detect())
    }

    /// Like [`LinearCpu::new`] with a chosen instruction set (tests use it to cover the portable kernels).
    pub fn with_isa(w: &QuantMatrix, isa: CpuIsa) -> Result<Self> {
        if !isa.is_supported() {
            return Err(Error::Unsupported(format!(
                "CPU instruction set {} on this CPU",
                isa.name()
            )));
        }
        w.validate()?;
        let groups = w.groups();
        let (perm, group_ranges) = contiguous_groups(w, groups);
        let blocks = group_ranges
            .iter()
            .enumerate()
            .flat_map(|(group, range)| {
                range.clone().step_by(BLOCK_K).map(move |start| KBlock {
                    start,
                    len: BLOCK_K.min(range.end - start),
                    group,
                })
            })
            .collect();
        let tiles = w.n.div_ceil(TILE_N);
        let mut this = Self {
            n: w.n,
            k: w.k,
            bits: w.bits,
            groups,
            tiles,
            codes: Vec::new(),
            scales: vec![0.0; tiles * groups * TILE_N],
            scaled_zeros: vec![0.0; tiles * groups * TILE_N],
            blocks,
            perm,
            isa,
        };
        this.codes = this.pack_codes(w);
        for n in 0..w.n {
            let (tile, col) = (n / TILE_N, n % TILE_N);
            for g in 0..groups {
                let scale = w.scales[n * groups + g];
                let at = (tile * groups + g) * TILE_N + col;
                this.scales[at] = scale;
                this.scaled_zeros[at] = scale * f32::from(w.zero(n, g));
            }
        }
        Ok(this)
    }

    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Weight bits (4 or 8).
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// The instruction set the kernels run with.
    pub fn isa(&self) -> CpuIsa {
        self.isa
    }

    fn code_bytes_per_k(&self) -> usize {
        TILE_N * usize::from(self.bits) / 8
    }

    fn pack_codes(&self, w: &QuantMatrix) -> Vec<u8> {
        let per_k = self.code_bytes_per_k();
        let mut packed = vec![0u8; self.tiles * self.k * per_k];
        packed
            .par_chunks_exact_mut(self.k * per_k)
            .enumerate()
            .for_each(|(tile, out)| {
                let code = |col: usize, src_k: usize| {
                    let n = tile * TILE_N + col;
                    if n < w.n {
                        w.codes[n * w.k + src_k]
                    } else {
                        0
                    }
                };
                for (pos, bytes) in out.chunks_exact_mut(per_k).enumerate() {
                    let src_k = self.perm.as_ref().map_or(pos, |p| p[pos]);
                    if self.bits == 4 {
                        for (col, b) in bytes.iter_mut().enumerate() {
                            *b = code(col, src_k) | code(col + TILE_N / 2, src_k) << 4;
                        }
                    } else {
                        for (col, b) in bytes.iter_mut().enumerate() {
                            *b = code(col, src_k);
                        }
                    }
                }
            });
        packed
    }

    /// `y[M, N] = x · W^T (+ bias)`, computed in f32 and stored as `T`.
    ///
    /// `x` holds `M` rows of `K` activations, row `m` starting at `m * x_row_stride` (`x_row_stride >= K`); its length
    /// must lie between `(M-1) * x_row_stride + K` (a tight view) and `M * x_row_stride` (the whole padded buffer).
    /// `y` is `[M, N]` row-major, fully overwritten; `bias` has `N` elements. `M = 0` does nothing.
    pub fn forward<T: Float>(
        &self,
        x: &[T],
        m: usize,
        x_row_stride: usize,
        bias: Option<&[f32]>,
        y: &mut [T],
    ) -> Result<()> {
        self.check_args(x.len(), m, x_row_stride, bias.map(<[f32]>::len), y.len())?;
        if m == 0 {
            return Ok(());
        }
        let acts = self.prepare_activations(x, m, x_row_stride);
        let fused = m <= FUSED_MAX_ROWS;
        let row_chunk = if fused { m } else { GEMM_ROW_CHUNK };
        let tasks: Vec<(Range<usize>, Range<usize>)> = chunks(0..m, row_chunk)
            .flat_map(|rows| chunks(0..self.tiles, TILE_CHUNK).map(move |tiles| (rows.clone(), tiles)))
            .collect();
        let out = OutPtr(y.as_mut_ptr());
        tasks.into_par_iter().for_each(|(rows, tiles)| {
            let acc = match self.isa {
                #[cfg(target_arch = "x86_64")]
                CpuIsa::Avx2Fma => self.run_task::<avx2::Avx2>(&acts, rows.clone(), tiles.clone(), fused),
                _ => self.run_task::<portable::Portable>(&acts, rows.clone(), tiles.clone(), fused),
            };
            // SAFETY: tasks cover disjoint (rows × tiles) blocks of `y`, and `store_task` writes only inside its
            // block, whose indices are below M*N = y.len() (checked by `check_args`).
            unsafe { self.store_task(&acc, rows, tiles, bias, out) };
        });
        Ok(())
    }

    fn check_args(&self, x_len: usize, m: usize, stride: usize, bias_len: Option<usize>, y_len: usize) -> Result<()> {
        if stride < self.k {
            return Err(Error::invalid(
                "x_row_stride",
                stride,
                format!("the row stride of x must be at least K = {}", self.k),
            ));
        }
        let (min_len, max_len) = match m {
            0 => (0, 0),
            _ => ((m - 1) * stride + self.k, m * stride),
        };
        if x_len < min_len || x_len > max_len {
            return Err(Error::invalid(
                "x",
                format!("{x_len} elements"),
                format!(
                    "M = {m} rows of K = {} at stride {stride} need {min_len}..={max_len} elements",
                    self.k
                ),
            ));
        }
        if y_len != m * self.n {
            return Err(Error::invalid(
                "y",
                format!("{y_len} elements"),
                format!("y must hold M*N = {m}*{} elements", self.n),
            ));
        }
        if let Some(len) = bias_len.filter(|&len| len != self.n) {
            return Err(Error::invalid(
                "bias",
                format!("{len} elements"),
                format!("bias must hold N = {} elements", self.n),
            ));
        }
        Ok(())
    }

    /// `x` as f32 in permuted K order, and the sum of every (row, block).
    fn prepare_activations<'x, T: Float>(&self, x: &'x [T], m: usize, stride: usize) -> Activations<'x> {
        let (data, stride) = match (as_f32(x), &self.perm) {
            (Some(x), None) => (Cow::Borrowed(x), stride),
            _ => {
                let mut xf = vec![0.0f32; m * self.k];
                xf.par_chunks_exact_mut(self.k).enumerate().for_each(|(row, out)| {
                    let src = &x[row * stride..row * stride + self.k];
                    match &self.perm {
                        Some(perm) => out.iter_mut().zip(perm).for_each(|(o, &p)| *o = src[p].to_f32()),
                        None => out.iter_mut().zip(src).for_each(|(o, v)| *o = v.to_f32()),
                    }
                });
                (Cow::Owned(xf), self.k)
            }
        };
        let nblocks = self.blocks.len();
        let mut block_sums = vec![0.0f32; m * nblocks];
        block_sums
            .chunks_exact_mut(nblocks)
            .enumerate()
            .for_each(|(row, sums)| {
                let row_data = &data[row * stride..];
                for (sum, b) in sums.iter_mut().zip(&self.blocks) {
                    *sum = row_data[b.start..b.start + b.len].iter().sum();
                }
            });
        Activations {
            data,
            stride,
            block_sums,
        }
    }

    /// Computes one task's `[rows][tiles × 16]` outputs (before bias).
    fn run_task<B: Backend>(
        &self,
        acts: &Activations,
        rows: Range<usize>,
        tiles: Range<usize>,
        fused: bool,
    ) -> Vec<f32> {
        let cols = tiles.len() * TILE_N;
        let mut acc = vec![0.0f32; rows.len() * cols];
        let per_k = self.code_bytes_per_k();
        let tile_bytes = self.k * per_k;
        let scale_tile_stride = self.groups * TILE_N;
        let nblocks = self.blocks.len();
        // Pointers for the kernel covering block `b`, task rows from `row` and task tiles from `tile`. Each comes
        // from a slice running to the end of its buffer, which holds every row/tile the kernel reaches.
        let job = |b: usize, row: usize, tile: usize, acc: &mut [f32]| {
            let blk = &self.blocks[b];
            let scale_at = (tiles.start + tile) * scale_tile_stride + blk.group * TILE_N;
            BlockJob {
                x: acts.data[(rows.start + row) * acts.stride + blk.start..].as_ptr(),
                x_stride: acts.stride,
                x_sum: acts.block_sums[(rows.start + row) * nblocks + b..].as_ptr(),
                x_sum_stride: nblocks,
                len: blk.len,
                scales: self.scales[scale_at..].as_ptr(),
                scaled_zeros: self.scaled_zeros[scale_at..].as_ptr(),
                scale_tile_stride,
                y: acc[row * cols + tile * TILE_N..].as_mut_ptr(),
                y_stride: cols,
            }
        };
        let codes = |b: usize, tile: usize| {
            self.codes[(tiles.start + tile) * tile_bytes + self.blocks[b].start * per_k..].as_ptr()
        };
        if fused {
            // Tiles outer, K inner: consecutive kernel calls continue the same code streams.
            for rs in chunks(0..rows.len(), FUSED_ROWS_PER_KERNEL) {
                for ts in kernel_tiles(0..tiles.len(), tiles_per_kernel(rs.len())) {
                    for b in 0..nblocks {
                        let job = job(b, rs.start, ts.start, &mut acc);
                        // SAFETY: `job` and `codes` point into buffers holding these rows, tiles and inputs.
                        unsafe { B::packed(self.bits, rs.len(), ts.len(), &job, codes(b, ts.start), tile_bytes) };
                    }
                }
            }
        } else {
            // K outer: a block's activations stay in cache while every tile of the task meets them.
            let mut decoded = vec![AlignedRow::default(); DECODE_TILES * BLOCK_K];
            for (b, blk) in self.blocks.iter().enumerate() {
                for dts in chunks(0..tiles.len(), DECODE_TILES) {
                    let decoded_rows = decoded.as_mut_ptr().cast::<f32>();
                    // SAFETY: `decoded` holds DECODE_TILES × BLOCK_K rows; the codes hold these tiles and inputs.
                    unsafe {
                        B::decode(
                            self.bits,
                            codes(b, dts.start),
                            tile_bytes,
                            dts.len(),
                            blk.len,
                            decoded_rows,
                        )
                    };
                    for rs in chunks(0..rows.len(), MAX_ROWS_PER_KERNEL) {
                        for ts in kernel_tiles(0..dts.len(), tiles_per_kernel(rs.len())) {
                            let job = job(b, rs.start, dts.start + ts.start, &mut acc);
                            let rows_ptr = decoded[ts.start * BLOCK_K..].as_ptr().cast::<f32>();
                            // SAFETY: as above; `rows_ptr` holds the decoded rows of these tiles.
                            unsafe { B::decoded(rs.len(), ts.len(), &job, rows_ptr, BLOCK_K * TILE_N) };
                        }
                    }
                }
            }
        }
        acc
    }

    /// Writes a task's outputs (plus bias) into its block of `y`.
    ///
    /// # Safety
    /// `out` points at `M * N` elements, `rows` lies within M, and no other thread writes this block.
    unsafe fn store_task<T: Float>(
        &self,
        acc: &[f32],
        rows: Range<usize>,
        tiles: Range<usize>,
        bias: Option<&[f32]>,
        out: OutPtr<T>,
    ) {
        let cols = tiles.len() * TILE_N;
        let first_n = tiles.start * TILE_N;
        let last_n = (tiles.end * TILE_N).min(self.n);
        for (row, acc_row) in rows.zip(acc.chunks_exact(cols)) {
            for (n, &v) in (first_n..last_n).zip(acc_row) {
                let v = match bias {
                    Some(b) => v + b[n],
                    None => v,
                };
                out.0.add(row * self.n + n).write(T::from_f32(v));
            }
        }
    }
}

/// Activations ready for the kernels.
struct Activations<'x> {
    /// `[M, stride]` f32, K in permuted order.
    data: Cow<'x, [f32]>,
    stride: usize,
    /// `[M, blocks]`: the sum of each row over each K block.
    block_sums: Vec<f32>,
}

/// `y`'s base pointer, shared by tasks that write disjoint blocks.
struct OutPtr<T>(*mut T);
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: only used to write disjoint elements from different threads (see `LinearCpu::forward`).
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// One row of a decoded tile, aligned to a cache line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct AlignedRow([f32; TILE_N]);

/// `range` cut into consecutive pieces of at most `size`.
fn chunks(range: Range<usize>, size: usize) -> impl Iterator<Item = Range<usize>> + Clone {
    range.clone().step_by(size).map(move |s| s..(s + size).min(range.end))
}

/// How many tiles a micro-kernel of `rows` rows covers: enough independent accumulators to hide FMA latency,
/// few enough to stay in the 16 registers (3 rows × 2 tiles spills once decode temporaries are counted).
fn tiles_per_kernel(rows: usize) -> usize {
    match rows {
        1 => 4,
        2 => 2,
        _ => 1,
    }
}

/// `range` cut into pieces of `widest` tiles, the remainder into powers of two (the widths kernels exist for).
fn kernel_tiles(range: Range<usize>, widest: usize) -> impl Iterator<Item = Range<usize>> {
    let mut start = range.start;
    std::iter::from_fn(move || {
        let left = range.end - start;
        if left == 0 {
            return None;
        }
        let width = if left >= widest { widest } else { 1 << left.ilog2() };
        start += width;
        Some(start - width..start)
    })
}

/// `x` itself when `T` is f32.
fn as_f32<T: Float>(x: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32, so the slice is already a `[f32]`.
        Some(unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len()) })
    } else {
        None
    }
}

/// The K order that makes groups contiguous (`None`: the identity) and each group's range in it.
fn contiguous_groups(w: &QuantMatrix, groups: usize) -> (Option<Vec<usize>>, Vec<Range<usize>>) {
    if w.has_trivial_g_idx() {
        let ranges = (0..groups)
            .map(|g| g * w.group_size..((g + 1) * w.group_size).min(w.k))
            .collect();
        return (None, ranges);
    }
    let g_idx = w.g_idx.as_ref().expect("non-trivial g_idx is present");
    let mut perm: Vec<usize> = (0..w.k).collect();
    perm.sort_by_key(|&k| g_idx[k]); // stable: inputs keep their order inside a group
    let mut sizes = vec![0usize; groups];
    for &g in g_idx {
        sizes[g as usize] += 1;
    }
    let mut start = 0;
    let ranges = sizes
        .iter()
        .map(|&len| {
            start += len;
            start - len..start
        })
        .collect();
    (Some(perm), ranges)
}

/// Pointers for one K block, `MR` rows and `NT` tiles: the kernels' whole world.
///
/// Row `r` of activations is at `x + r * x_stride` (block's first k), its block sum at `x_sum + r * x_sum_stride`;
/// tile `t`'s 16 scales at `scales + t * scale_tile_stride`; output row `r`, tile `t` at `y + r * y_stride + 16 t`.
struct BlockJob {
    x: *const f32,
    x_stride: usize,
    x_sum: *const f32,
    x_sum_stride: usize,
    len: usize,
    scales: *const f32,
    scaled_zeros: *const f32,
    scale_tile_stride: usize,
    y: *mut f32,
    y_stride: usize,
}

/// The eight-lane f32 operations the kernels are written in; one implementation per instruction set.
///
/// # Safety
/// Implementations may require CPU features: call only from code compiled for them (see [`Backend`]).
trait Lanes {
    type V: Copy;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(v: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`
    unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b - c`
    unsafe fn mul_sub(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// A 4-bit tile row (8 bytes: low nibbles columns 0..8, high nibbles 8..16) as two vectors of codes.
    unsafe fn decode4(p: *const u8) -> [Self::V; 2];
    /// An 8-bit tile row (16 bytes) as two vectors of codes.
    unsafe fn decode8(p: *const u8) -> [Self::V; 2];
}

/// Where a kernel reads tile rows of codes: packed bytes (decoded on the fly) or an already decoded f32 tile.
trait TileRows<L: Lanes> {
    /// Row `k` of tile `t` (relative to the job's first tile and k).
    unsafe fn row(&self, t: usize, k: usize) -> [L::V; 2];
}

/// Packed codes of `BITS` bits; `tile_stride` bytes between tiles.
struct Packed<const BITS: usize> {
    codes: *const u8,
    tile_stride: usize,
}

impl<L: Lanes, const BITS: usize> TileRows<L> for Packed<BITS> {
    #[inline(always)]
    unsafe fn row(&self, t: usize, k: usize) -> [L::V; 2] {
        let p = self.codes.add(t * self.tile_stride + k * TILE_N * BITS / 8);
        if BITS == 4 {
            L::decode4(p)
        } else {
            L::decode8(p)
        }
    }
}

/// Codes already converted to f32, `[tile][k][16]`; `tile_stride` floats between tiles.
struct Decoded {
    rows: *const f32,
    tile_stride: usize,
}

impl<L: Lanes> TileRows<L> for Decoded {
    #[inline(always)]
    unsafe fn row(&self, t: usize, k: usize) -> [L::V; 2] {
        let p = self.rows.add(t * self.tile_stride + k * TILE_N);
        [L::load(p), L::load(p.add(LANES))]
    }
}

/// The micro-kernel: one K block, `MR` rows × `NT` tiles, accumulated in registers and folded into `y`.
///
/// # Safety
/// Every pointer in `job` and `w` must be valid for the rows, tiles and `job.len` inputs described on [`BlockJob`].
#[inline(always)]
unsafe fn block_kernel<L: Lanes, W: TileRows<L>, const MR: usize, const NT: usize>(job: &BlockJob, w: &W) {
    let mut acc = [[[L::zero(); 2]; NT]; MR];
    for k in 0..job.len {
        let mut rows = [[L::zero(); 2]; NT];
        for (t, row) in rows.iter_mut().enumerate() {
            *row = w.row(t, k);
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = L::splat(*job.x.add(r * job.x_stride + k));
            for (acc_rt, row) in acc_r.iter_mut().zip(&rows) {
                acc_rt[0] = L::mul_add(xv, row[0], acc_rt[0]);
                acc_rt[1] = L::mul_add(xv, row[1], acc_rt[1]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let x_sum = L::splat(*job.x_sum.add(r * job.x_sum_stride));
        for (t, acc_rt) in acc_r.iter().enumerate() {
            for (h, &a) in acc_rt.iter().enumerate() {
                let at = t * job.scale_tile_stride + h * LANES;
                let zero_term = L::mul(L::load(job.scaled_zeros.add(at)), x_sum);
                let y = job.y.add(r * job.y_stride + t * TILE_N + h * LANES);
                L::store(
                    y,
                    L::add(L::load(y), L::mul_sub(L::load(job.scales.add(at)), a, zero_term)),
                );
            }
        }
    }
}

/// Decodes `len` rows of `tiles` tiles of packed codes into `[tile][k][16]` f32 (`BLOCK_K` rows per tile).
#[inline(always)]
unsafe fn decode_block<L: Lanes, const BITS: usize>(src: &Packed<BITS>, tiles: usize, len: usize, out: *mut f32) {
    for t in 0..tiles {
        for k in 0..len {
            let [lo, hi] = <Packed<BITS> as TileRows<L>>::row(src, t, k);
            let p = out.add((t * BLOCK_K + k) * TILE_N);
            L::store(p, lo);
            L::store(p.add(LANES), hi);
        }
    }
}

/// The entry points of one instruction set; each call runs a whole block, so the per-call cost is negligible.
trait Backend {
    /// `block_kernel` over packed codes with `mr` rows and `nt` tiles.
    unsafe fn packed(bits: u8, mr: usize, nt: usize, job: &BlockJob, codes: *const u8, tile_stride: usize);
    /// `block_kernel` over a decoded tile.
    unsafe fn decoded(mr: usize, nt: usize, job: &BlockJob, rows: *const f32, tile_stride: usize);
    /// `decode_block`.
    unsafe fn decode(bits: u8, codes: *const u8, tile_stride: usize, tiles: usize, len: usize, out: *mut f32);
}

/// Calls `block_kernel::<L, W, MR, NT>` for the runtime `(mr, nt)`; the pairs are those `kernel_shape` chooses.
macro_rules! dispatch_kernel {
    ($lanes:ty, $mr:expr, $nt:expr, $job:expr, $w:expr) => {
        match ($mr, $nt) {
            (1, 1) => block_kernel::<$lanes, _, 1, 1>($job, $w),
            (1, 2) => block_kernel::<$lanes, _, 1, 2>($job, $w),
            (1, 4) => block_kernel::<$lanes, _, 1, 4>($job, $w),
            (2, 1) => block_kernel::<$lanes, _, 2, 1>($job, $w),
            (2, 2) => block_kernel::<$lanes, _, 2, 2>($job, $w),
            (3, 1) => block_kernel::<$lanes, _, 3, 1>($job, $w),
            (4, 1) => block_kernel::<$lanes, _, 4, 1>($job, $w),
            (5, 1) => block_kernel::<$lanes, _, 5, 1>($job, $w),
            (6, 1) => block_kernel::<$lanes, _, 6, 1>($job, $w),
            other => unreachable!("no micro-kernel for (rows, tiles) = {other:?}"),
        }
    };
}

/// Defines a [`Backend`] whose entry points are compiled with `$features` (and so inline `$lanes`'s intrinsics).
macro_rules! define_backend {
    ($backend:ident, $lanes:ty $(, $features:literal)?) => {
        impl Backend for $backend {
            unsafe fn packed(bits: u8, mr: usize, nt: usize, job: &BlockJob, codes: *const u8, tile_stride: usize) {
                $(#[target_feature(enable = $features)])?
                unsafe fn run(bits: u8, mr: usize, nt: usize, job: &BlockJob, codes: *const u8, tile_stride: usize) {
                    if bits == 4 {
                        dispatch_kernel!($lanes, mr, nt, job, &Packed::<4> { codes, tile_stride })
                    } else {
                        dispatch_kernel!($lanes, mr, nt, job, &Packed::<8> { codes, tile_stride })
                    }
                }
                run(bits, mr, nt, job, codes, tile_stride)
            }

            unsafe fn decoded(mr: usize, nt: usize, job: &BlockJob, rows: *const f32, tile_stride: usize) {
                $(#[target_feature(enable = $features)])?
                unsafe fn run(mr: usize, nt: usize, job: &BlockJob, rows: *const f32, tile_stride: usize) {
                    dispatch_kernel!($lanes, mr, nt, job, &Decoded { rows, tile_stride })
                }
                run(mr, nt, job, rows, tile_stride)
            }

            unsafe fn decode(bits: u8, codes: *const u8, tile_stride: usize, tiles: usize, len: usize, out: *mut f32) {
                $(#[target_feature(enable = $features)])?
                unsafe fn run(bits: u8, codes: *const u8, tile_stride: usize, tiles: usize, len: usize, out: *mut f32) {
                    if bits == 4 {
                        decode_block::<$lanes, 4>(&Packed { codes, tile_stride }, tiles, len, out)
                    } else {
                        decode_block::<$lanes, 8>(&Packed { codes, tile_stride }, tiles, len, out)
                    }
                }
                run(bits, codes, tile_stride, tiles, len, out)
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// AVX2 + FMA lanes (`__m256`).
    pub(super) struct Avx2;

    impl Lanes for Avx2 {
        type V = __m256;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> __m256 {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn mul_add(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul_sub(a: __m256, b: __m256, c: __m256) -> __m256 {
            _mm256_fmsub_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn decode4(p: *const u8) -> [__m256; 2] {
            // 8 bytes -> 8 lanes of bytes; low nibble = columns 0..8, high nibble = columns 8..16.
            let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let lo = _mm256_and_si256(bytes, _mm256_set1_epi32(0xF));
            let hi = _mm256_srli_epi32::<4>(bytes);
            [_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)]
        }
        #[inline(always)]
        unsafe fn decode8(p: *const u8) -> [__m256; 2] {
            let lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(LANES).cast()));
            [_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi)]
        }
    }

    define_backend!(Avx2, Avx2, "avx2,fma");
}

mod portable {
    use super::*;

    /// Eight-lane arrays; the compiler vectorises them for whatever the target baseline is.
    pub(super) struct Portable;

    type V = [f32; LANES];

    impl Lanes for Portable {
        type V = V;
        #[inline(always)]
        unsafe fn zero() -> V {
            [0.0; LANES]
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> V {
            [v; LANES]
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> V {
            p.cast::<V>().read_unaligned()
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: V) {
            p.cast::<V>().write_unaligned(v)
        }
        #[inline(always)]
        unsafe fn mul_add(a: V, b: V, c: V) -> V {
            // Separate multiply and add: `f32::mul_add` is a slow library call on targets without FMA.
            std::array::from_fn(|i| a[i] * b[i] + c[i])
        }
        #[inline(always)]
        unsafe fn mul_sub(a: V, b: V, c: V) -> V {
            std::array::from_fn(|i| a[i] * b[i] - c[i])
        }
        #[inline(always)]
        unsafe fn mul(a: V, b: V) -> V {
            std::array::from_fn(|i| a[i] * b[i])
        }
        #[inline(always)]
        unsafe fn add(a: V, b: V) -> V {
            std::array::from_fn(|i| a[i] + b[i])
        }
        #[inline(always)]
        unsafe fn decode4(p: *const u8) -> [V; 2] {
            let bytes = p.cast::<[u8; LANES]>().read_unaligned();
            [bytes.map(|b| f32::from(b & 0xF)), bytes.map(|b| f32::from(b >> 4))]
        }
        #[inline(always)]
        unsafe fn decode8(p: *const u8) -> [V; 2] {
            let bytes = p.cast::<[u8; 2 * LANES]>().read_unaligned();
            [
                std::array::from_fn(|i| f32::from(bytes[i])),
                std::array::from_fn(|i| f32::from(bytes[LANES + i])),
            ]
        }
    }

    define_backend!(Portable, Portable);
}
