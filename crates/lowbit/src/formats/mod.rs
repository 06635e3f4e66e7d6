//! Quantized weight formats: one module per checkpoint format, all meeting in [`QuantMatrix`].
//!
//! Every format unpacks losslessly into a [`QuantMatrix`] (unsigned codes, zero codes, scales, optional `g_idx`)
//! and packs back from one, so conversion between formats is `unpack` then `pack`, failing with
//! [`crate::Error::Conversion`] where the target cannot hold what the source has.
//! Exact layouts: `shared/formats.md` (summarised in each module's docs).

pub mod awq;
pub mod block;
pub mod compressed_tensors;
pub mod gptq;
pub mod int8;

use crate::dtype::DType;
use crate::error::{ensure, Result};

/// A format-neutral quantized linear weight: `W[n, k] = (codes[n, k] - zero[n, g]) * scale[n, g]`.
///
/// Orientation follows `nn.Linear`: `N` = out_features rows, `K` = in_features columns, groups run along K.
/// Codes are unsigned (`0..2^bits`); a signed format stores `q + 2^(bits-1)`. Scales are kept as f32 holding
/// exactly the values of `scale_dtype` (f16/bf16 convert to f32 without loss), so nothing is rounded twice.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    /// Output features (rows of W).
    pub n: usize,
    /// Input features (columns of W).
    pub k: usize,
    /// 4 or 8.
    pub bits: u8,
    /// Inputs per group along K; `k` for per-channel.
    pub group_size: usize,
    /// `[N, K]` row-major unsigned codes, one per byte.
    pub codes: Vec<u8>,
    /// `[N, groups]` unsigned zero codes; `None` means symmetric (zero = `2^(bits-1)`).
    pub zeros: Option<Vec<u8>>,
    /// `[N, groups]` scales (exact values of `scale_dtype`).
    pub scales: Vec<f32>,
    /// The dtype the scales are stored in by the source format (f16 or bf16 for checkpoints).
    pub scale_dtype: DType,
    /// Group of each input `k` (GPTQ act-order); `None` means `k / group_size`.
    pub g_idx: Option<Vec<u32>>,
}

impl QuantMatrix {
    /// Number of scale/zero groups per output row.
    pub fn groups(&self) -> usize {
        match &self.g_idx {
            Some(g) => g.iter().map(|&x| x as usize + 1).max().unwrap_or(0),
            None => self.k.div_ceil(self.group_size),
        }
    }

    /// The group of input `k`.
    #[inline]
    pub fn group_of(&self, k: usize) -> usize {
        match &self.g_idx {
            Some(g) => g[k] as usize,
            None => k / self.group_size,
        }
    }

    /// The zero code of row `n`, group `g`.
    #[inline]
    pub fn zero(&self, n: usize, g: usize) -> u8 {
        match &self.zeros {
            Some(z) => z[n * self.groups_stride() + g],
            None => 1 << (self.bits - 1),
        }
    }

    /// Row stride of `scales`/`zeros`: the group count, cached-free (cheap for the no-g_idx case).
    #[inline]
    pub(crate) fn groups_stride(&self) -> usize {
        self.scales.len() / self.n.max(1)
    }

    /// Whether `g_idx` is absent or equal to the trivial `k / group_size` (so formats without g_idx can hold it).
    pub fn has_trivial_g_idx(&self) -> bool {
        match &self.g_idx {
            None => true,
            Some(g) => g.iter().enumerate().all(|(k, &x)| x as usize == k / self.group_size),
        }
    }

    /// Checks every invariant: shapes, code range, finite non-NaN scales, g_idx range.
    pub fn validate(&self) -> Result<()> {
        ensure(
            self.bits == 4 || self.bits == 8,
            "bits",
            self.bits,
            "bits must be 4 or 8",
        )?;
        ensure(
            self.n > 0 && self.k > 0,
            "weight",
            format!("shape [{}, {}]", self.n, self.k),
            "N and K must be positive",
        )?;
        ensure(
            self.group_size > 0 && (self.group_size == self.k || self.k % self.group_size == 0),
            "group_size",
            self.group_size,
            "group size must divide K",
        )?;
        ensure(
            self.codes.len() == self.n * self.k,
            "codes",
            format!("{} elements", self.codes.len()),
            &format!("must hold N*K = {} codes", self.n * self.k),
        )?;
        let max = ((1u32 << self.bits) - 1) as u8;
        if let Some(i) = first_above(&self.codes, max) {
            return Err(crate::Error::invalid(
                "codes",
                format!("{} at index {i}", self.codes[i]),
                "codes must fit in `bits`",
            ));
        }
        let groups = self.groups();
        ensure(
            self.scales.len() == self.n * groups,
            "scales",
            format!("{} elements", self.scales.len()),
            &format!("must hold N*groups = {} scales", self.n * groups),
        )?;
        if let Some(i) = self.scales.iter().position(|s| !s.is_finite()) {
            return Err(crate::Error::invalid(
                "scales",
                format!("{} at index {i}", self.scales[i]),
                "scales must be finite",
            ));
        }
        if let Some(z) = &self.zeros {
            ensure(
                z.len() == self.n * groups,
                "zeros",
                format!("{} elements", z.len()),
                "must hold one zero per scale",
            )?;
            if let Some(i) = first_above(z, max) {
                return Err(crate::Error::invalid(
                    "zeros",
                    format!("{} at index {i}", z[i]),
                    "zero codes must fit in `bits`",
                ));
            }
        }
        if let Some(g) = &self.g_idx {
            ensure(
                g.len() == self.k,
                "g_idx",
                format!("{} elements", g.len()),
                "g_idx must have K elements",
            )?;
        }
        Ok(())
    }
}

/// The index of the first code above `max` (`2^bits - 1`), if any. Codes are checked on every kernel call, so the
/// scan is a parallel, vectorisable OR over chunks; only a chunk with an offender is searched element by element.
fn first_above(codes: &[u8], max: u8) -> Option<usize> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    if max == u8::MAX {
        return None; // 8-bit: every byte is a code
    }
    let over = |chunk: &[u8]| chunk.iter().fold(0u8, |acc, &c| acc | c) & !max != 0;
    let chunk = codes.par_chunks(CHUNK).position_first(over)?;
    let offset = chunk * CHUNK;
    codes[offset..].iter().position(|&c| c > max).map(|i| offset + i)
}

impl QuantMatrix {
    /// The symmetric zero code `2^(bits-1)` (what `zeros: None` means).
    pub fn midpoint(&self) -> u8 {
        1 << (self.bits - 1)
    }

    /// Whether every zero equals the midpoint, i.e. the weight is symmetric even if zeros are stored.
    pub fn is_symmetric(&self) -> bool {
        let mid = self.midpoint();
        match &self.zeros {
            None => true,
            Some(z) => z.iter().all(|&x| x == mid),
        }
    }

    /// Drops stored zeros that all equal the midpoint (AWQ and GPTQ always store zeros; compressed-tensors and
    /// int8 omit them when symmetric). Changes no dequantized value.
    pub fn drop_symmetric_zeros(&mut self) {
        if self.is_symmetric() {
            self.zeros = None;
        }
    }
}

/// A checkpoint format lowbit reads and writes (the CLI's `--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// AutoAWQ GEMM layout ([`awq::AwqWeight`]).
    Awq,
    /// AutoGPTQ / GPTQModel ([`gptq::GptqWeight`]).
    Gptq,
    /// compressed-tensors `pack-quantized` int4/int8 ([`compressed_tensors::CompressedTensorsWeight`]).
    CompressedTensors,
    /// compressed-tensors `int-quantized` int8 weight-only ([`int8::Int8Weight`]).
    Int8,
}

impl Format {
    /// Every format, in CLI help order.
    pub const ALL: [Format; 4] = [Format::Awq, Format::Gptq, Format::CompressedTensors, Format::Int8];

    /// The name the CLI and `quant_method` use: `awq`, `gptq`, `compressed-tensors`, `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Format::Awq => "awq",
            Format::Gptq => "gptq",
            Format::CompressedTensors => "compressed-tensors",
            Format::Int8 => "int8",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Format {
    type Err = crate::Error;

    /// Parses a format name case-insensitively; `compressed_tensors` and `ct` are accepted aliases.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "awq" => Ok(Format::Awq),
            "gptq" => Ok(Format::Gptq),
            "compressed-tensors" | "compressed_tensors" | "ct" => Ok(Format::CompressedTensors),
            "int8" => Ok(Format::Int8),
            _ => Err(crate::Error::invalid(
                "format",
                format!("{s:?}"),
                "must be one of awq, gptq, compressed-tensors, int8",
            )),
        }
    }
}

// ---- Helpers shared by the format modules ------------------------------------------------------------------------

/// The checkpoint name of tensor `suffix` of layer `prefix`: `prefix.suffix` (just `suffix` for an empty prefix).
pub fn tensor_name(prefix: &str, suffix: &str) -> String {
    if prefix.is_empty() {
        suffix.to_string()
    } else {
        format!("{prefix}.{suffix}")
    }
}

/// `t` renamed to `prefix.suffix` (so every error names the checkpoint tensor), after checking that its byte
/// length matches its shape (a `TensorRef` built by hand may be truncated).
pub(crate) fn input<'a>(
    prefix: &str,
    suffix: &str,
    t: &crate::tensor::TensorRef<'a>,
) -> Result<crate::tensor::TensorRef<'a>> {
    let t = crate::tensor::TensorRef {
        name: tensor_name(prefix, suffix),
        ..t.clone()
    };
    let want = t.shape.iter().product::<usize>() * t.dtype.size();
    ensure(
        t.data.len() == want,
        &t.name,
        format!("{} bytes for {} shape {:?}", t.data.len(), t.dtype, t.shape),
        "data length must equal product(shape) * dtype size",
    )?;
    Ok(t)
}

/// `t`'s two dimensions, which must both be positive; `meaning` names them (`"[K, N/8]"`).
pub(crate) fn dims2_nonempty(t: &crate::tensor::TensorRef<'_>, meaning: &str) -> Result<(usize, usize)> {
    let (rows, cols) = t.dims2()?;
    ensure(
        rows > 0 && cols > 0,
        &t.name,
        format!("shape {:?}", t.shape),
        &format!("{meaning} must be non-empty"),
    )?;
    Ok((rows, cols))
}

/// Where a format's scale (and zero) tensors keep their K/G groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupAxis {
    /// `[K/G, N]` (AWQ, GPTQ).
    Rows,
    /// `[N, K/G]` (compressed-tensors, int8).
    Cols,
}

/// Reads the scale tensor of an `[n, k]` weight (f32, f16 or bf16; finite), its groups along `axis`; the group
/// count must divide `k`. Returns the values as stored, their dtype and the group count.
pub(crate) fn read_group_scales(
    t: &crate::tensor::TensorRef<'_>,
    n: usize,
    k: usize,
    axis: GroupAxis,
) -> Result<(Vec<f32>, DType, usize)> {
    let (rows, cols) = t.dims2()?;
    let (groups, dim, shape, meaning) = match axis {
        GroupAxis::Rows => (rows, "row", [rows, n], "[K/G, N]"),
        GroupAxis::Cols => (cols, "column", [n, cols], "[N, K/G]"),
    };
    ensure(
        groups > 0 && k % groups == 0,
        &t.name,
        format!("shape {:?}", t.shape),
        &format!("the {dim} count (K/G groups) must divide K = {k}"),
    )?;
    t.expect_shape(&shape, meaning)?;
    Ok((t.to_finite_f32()?, t.dtype, groups))
}

/// Codes per packed int32 word for `bits` (8 for int4, 4 for int8).
pub(crate) fn per_word(bits: u8) -> usize {
    32 / bits as usize
}

/// Natural field order inside a word (field `i` holds element `i`).
pub(crate) const NATURAL_ORDER_4: [usize; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
/// Natural field order for 8-bit codes.
pub(crate) const NATURAL_ORDER_8: [usize; 4] = [0, 1, 2, 3];

/// The natural field order for `bits`.
pub(crate) fn natural_order(bits: u8) -> &'static [usize] {
    if bits == 4 {
        &NATURAL_ORDER_4
    } else {
        &NATURAL_ORDER_8
    }
}

/// Transposes a row-major `[rows, cols]` matrix (in cache-sized tiles).
pub(crate) fn transpose<T: Copy + Default + Send + Sync>(src: &[T], rows: usize, cols: usize) -> Vec<T> {
    use rayon::prelude::*;
    const TILE: usize = 64;
    debug_assert_eq!(src.len(), rows * cols);
    let mut dst = vec![T::default(); rows * cols];
    if rows == 0 || cols == 0 {
        return dst;
    }
    // Each task owns TILE output rows (= TILE source columns).
    dst.par_chunks_mut(TILE * rows).enumerate().for_each(|(tile, out)| {
        let c0 = tile * TILE;
        let c1 = (c0 + TILE).min(cols);
        for r0 in (0..rows).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..c1 {
                    out[(c - c0) * rows + r] = src[r * cols + c];
                }
            }
        }
    });
    dst
}

/// An axis of an `[N, X]` code matrix: `N` output features, `X` the K inputs (codes) or the K/G groups (zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Axis {
    N,
    X,
}

/// How a format stores an `[N, X]` code matrix in int32 words: `32 / bits` consecutive codes along `packed` share
/// a word, and the word matrix is stored with `major` as its first dimension. E.g. AWQ `qweight` packs along N
/// and is stored `[K, N/8]` (`major: X`); GPTQ `qweight` packs along K and is stored `[K/P, N]` (`major: X` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WordLayout {
    pub packed: Axis,
    pub major: Axis,
}

/// Packs `codes` (`[n, x]` row-major, each `< 2^bits`) into words as `layout` says; field `i` of a word holds the
/// `order[i]`-th of its codes. The packed dimension must be a multiple of `32 / bits` (callers validate).
pub(crate) fn pack_words(codes: &[u8], n: usize, x: usize, bits: u8, order: &[usize], layout: WordLayout) -> Vec<i32> {
    let per = per_word(bits);
    match layout.packed {
        Axis::X => {
            let words_nx = pack_along_cols(codes, n, x, bits, order);
            match layout.major {
                Axis::N => words_nx,
                Axis::X => transpose(&words_nx, n, x / per),
            }
        }
        Axis::N => {
            let words_xn = pack_along_cols(&transpose(codes, n, x), x, n, bits, order);
            match layout.major {
                Axis::X => words_xn,
                Axis::N => transpose(&words_xn, x, n / per),
            }
        }
    }
}

/// Inverse of [`pack_words`]: the `[n, x]` codes held by `words`.
pub(crate) fn unpack_words(
    words: &[i32],
    n: usize,
    x: usize,
    bits: u8,
    order: &[usize],
    layout: WordLayout,
) -> Vec<u8> {
    let per = per_word(bits);
    match layout.packed {
        Axis::X => match layout.major {
            Axis::N => unpack_along_cols(words, n, x / per, bits, order),
            Axis::X => unpack_along_cols(&transpose(words, x / per, n), n, x / per, bits, order),
        },
        Axis::N => {
            let codes_xn = match layout.major {
                Axis::X => unpack_along_cols(words, x, n / per, bits, order),
                Axis::N => unpack_along_cols(&transpose(words, n / per, x), x, n / per, bits, order),
            };
            transpose(&codes_xn, x, n)
        }
    }
}

/// Packs a row-major `[rows, cols]` matrix of codes (each `< 2^bits`) into `[rows, cols / per]` i32 words along
/// the last axis: field `i` (bits `bits*i ..`) of word `c` holds element `c * per + order[i]`.
/// `cols` must be a multiple of `per = 32 / bits` (callers validate).
fn pack_along_cols(codes: &[u8], rows: usize, cols: usize, bits: u8, order: &[usize]) -> Vec<i32> {
    use rayon::prelude::*;
    let per = per_word(bits);
    debug_assert!(cols % per == 0 && order.len() == per && codes.len() == rows * cols);
    let word_cols = cols / per;
    let mut words = vec![0i32; rows * word_cols];
    if word_cols == 0 {
        return words;
    }
    words.par_chunks_mut(word_cols).enumerate().for_each(|(r, out)| {
        let row = &codes[r * cols..(r + 1) * cols];
        for (c, w) in out.iter_mut().enumerate() {
            let group = &row[c * per..(c + 1) * per];
            let mut word = 0u32;
            for (i, &src) in order.iter().enumerate() {
                word |= (group[src] as u32) << (bits as usize * i);
            }
            *w = word as i32;
        }
    });
    words
}

/// Inverse of [`pack_along_cols`]: `[rows, word_cols]` words to `[rows, word_cols * per]` codes.
fn unpack_along_cols(words: &[i32], rows: usize, word_cols: usize, bits: u8, order: &[usize]) -> Vec<u8> {
    use rayon::prelude::*;
    let per = per_word(bits);
    debug_assert!(order.len() == per && words.len() == rows * word_cols);
    let cols = word_cols * per;
    let mask = (1u32 << bits) - 1;
    let mut codes = vec![0u8; rows * cols];
    if cols == 0 {
        return codes;
    }
    codes.par_chunks_mut(cols).enumerate().for_each(|(r, out)| {
        for (c, &w) in words[r * word_cols..(r + 1) * word_cols].iter().enumerate() {
            let group = &mut out[c * per..(c + 1) * per];
            for (i, &dst) in order.iter().enumerate() {
                group[dst] = ((w as u32 >> (bits as usize * i)) & mask) as u8;
            }
        }
    });
    codes
}

/// Reads the optional group-index tensor `prefix.suffix` (`[K]` int32, every entry in `0..groups`).
pub(crate) fn read_g_idx(
    prefix: &str,
    suffix: &str,
    t: Option<&crate::tensor::TensorRef<'_>>,
    k: usize,
    groups: usize,
) -> Result<Option<Vec<u32>>> {
    let Some(t) = t else { return Ok(None) };
    let t = input(prefix, suffix, t)?;
    t.expect_shape(&[k], "[K]")?;
    let raw = t.to_i32()?;
    if let Some(i) = raw.iter().position(|&g| g < 0 || g as usize >= groups) {
        return Err(crate::Error::invalid(
            &t.name,
            format!("{} at index {i}", raw[i]),
            format!("group indices must lie in 0..{groups} (the number of scale groups)"),
        ));
    }
    Ok(Some(raw.into_iter().map(|g| g as u32).collect()))
}

/// Checks that `scales` holds exactly values of `q.scale_dtype` (f16/bf16/f32), so writing them loses nothing.
pub(crate) fn check_scales_storable(q: &QuantMatrix) -> Result<()> {
    ensure(
        q.scale_dtype.is_float(),
        "scale_dtype",
        q.scale_dtype,
        "scale dtype must be f32, f16 or bf16",
    )?;
    if let Some(i) = q
        .scales
        .iter()
        .position(|&s| crate::dtype::round_to(q.scale_dtype, s) != s)
    {
        return Err(crate::Error::invalid(
            "scales",
            format!("{} at index {i}", q.scales[i]),
            format!(
                "scales must be exactly representable in their scale_dtype {}",
                q.scale_dtype
            ),
        ));
    }
    Ok(())
}

/// The [`crate::Error::Conversion`] for a `q` that format `to` cannot hold.
pub(crate) fn cannot_hold(q: &QuantMatrix, to: &str, reason: impl Into<String>) -> crate::Error {
    crate::Error::Conversion {
        from: format!("int{} weight [N={}, K={}]", q.bits, q.n, q.k),
        to: to.to_string(),
        reason: reason.into(),
    }
}

/// The zero codes of `q` as stored (`[N, groups]`), the midpoint where `q` is symmetric.
pub(crate) fn zeros_or_midpoint(q: &QuantMatrix) -> Vec<u8> {
    match &q.zeros {
        Some(z) => z.clone(),
        None => vec![q.midpoint(); q.scales.len()],
    }
}

/// `g` when it differs from the trivial `k / group_size`, else `None` (formats hand out `g_idx` only when it
/// carries information, so that a plain GPTQ weight converts to formats without `g_idx`).
pub(crate) fn nontrivial_g_idx(g: Option<Vec<u32>>, group_size: usize) -> Option<Vec<u32>> {
    g.filter(|g| g.iter().enumerate().any(|(k, &x)| x as usize != k / group_size))
}
