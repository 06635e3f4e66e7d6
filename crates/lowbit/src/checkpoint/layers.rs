//! Finding quantized linear layers in a checkpoint by their tensor names and shapes.
//!
//! - `P.qweight` + `P.qzeros` + `P.scales`: AWQ GEMM (`qweight [K, N/8]`, packed along N) or GPTQ
//!   (`qweight [K*bits/32, N]`, packed along K). `quant_method` decides when config.json has one; otherwise a
//!   `P.g_idx` means GPTQ, and else the shapes do (`scales [groups, N]` matches `qweight` columns ×8 for AWQ, ×1
//!   for GPTQ).
//! - `P.weight_packed` + `P.weight_scale`: compressed-tensors `pack-quantized`.
//! - `P.weight` stored as int8 + `P.weight_scale`: int8 weight-only (compressed-tensors `int-quantized`).
//!
//! Group sizes are inferred from shapes (`K / groups`) and checked against config.json when it states one.

use super::{Checkpoint, QuantMethod, StDtype};
use crate::error::{Error, Result};
use crate::formats::awq::AwqWeight;
use crate::formats::compressed_tensors::CompressedTensorsWeight;
use crate::formats::gptq::{GptqVersion, GptqWeight};
use crate::formats::int8::Int8Weight;
use crate::formats::{Format, QuantMatrix};

/// The tensor suffixes a layer of `format` may have (the first two are always present).
pub fn layer_suffixes(format: Format) -> &'static [&'static str] {
    match format {
        Format::Awq => &["qweight", "qzeros", "scales"],
        Format::Gptq => &["qweight", "qzeros", "scales", "g_idx"],
        Format::CompressedTensors => &[
            "weight_packed",
            "weight_scale",
            "weight_zero_point",
            "weight_shape",
            "weight_g_idx",
        ],
        Format::Int8 => &["weight", "weight_scale", "weight_zero_point"],
    }
}

/// A quantized linear layer found in a checkpoint: `W[n, k]` in groups of `group_size` along K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantLayer {
    /// Name prefix (`model.layers.0.self_attn.q_proj`); the tensors are `prefix.qweight` etc.
    pub prefix: String,
    pub format: Format,
    pub bits: u8,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Inputs per group; `k` for per-channel.
    pub group_size: usize,
    /// Whether zero points are in use (asymmetric): AWQ `zero_point` and GPTQ `!sym` from config.json (true without
    /// one), compressed-tensors and int8 when `weight_zero_point` exists.
    pub zero_point: bool,
    /// Whether a `g_idx` / `weight_g_idx` tensor is present (possibly act-order).
    pub has_g_idx: bool,
    /// Names of every tensor that belongs to the layer.
    pub tensors: Vec<String>,
}

impl QuantLayer {
    /// Bytes of the layer's stored tensors.
    pub fn stored_bytes(&self, ckpt: &Checkpoint) -> u64 {
        self.tensors
            .iter()
            .filter_map(|t| ckpt.raw(t).ok())
            .map(|r| r.data.len() as u64)
            .sum()
    }

    /// Bytes the dense weight would take in fp16.
    pub fn fp16_bytes(&self) -> u64 {
        (self.n * self.k * 2) as u64
    }

    /// Name of the layer's tensor with this suffix.
    pub fn tensor_name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }
}

fn dims2(ckpt: &Checkpoint, name: &str) -> Result<(usize, usize)> {
    match ckpt.shape(name) {
        Some(&[r, c]) => Ok((r, c)),
        Some(other) => Err(Error::invalid(name, format!("shape {other:?}"), "must be 2-D")),
        None => Err(Error::MissingTensor {
            name: name.to_string(),
            context: None,
        }),
    }
}

fn require(ckpt: &Checkpoint, name: &str, why: &str) -> Result<()> {
    if ckpt.contains(name) {
        Ok(())
    } else {
        Err(Error::MissingTensor {
            name: name.to_string(),
            context: Some(why.to_string()),
        })
    }
}

/// Checks a shape-inferred group size against config.json's, when it states one.
fn check_config_group(scales: &str, k: usize, groups: usize, config_group: Option<usize>) -> Result<usize> {
    if groups == 0 || k % groups != 0 {
        return Err(Error::invalid(
            scales,
            format!("{groups} groups for K = {k}"),
            "K must be a multiple of the number of groups",
        ));
    }
    let inferred = k / groups;
    match config_group {
        Some(g) if g != inferred && !(g >= k && groups == 1) => Err(Error::invalid(
            scales,
            format!("{groups} groups for K = {k} (group size {inferred})"),
            format!("config.json group_size {g} needs K/{g} groups"),
        )),
        _ => Ok(inferred),
    }
}

/// Reads `weight_shape` ([N, K], stored as i32 or i64) of a compressed-tensors layer.
fn read_weight_shape(ckpt: &Checkpoint, name: &str) -> Result<(usize, usize)> {
    let raw = ckpt.raw(name)?;
    let values: Vec<i64> = match raw.dtype {
        StDtype::I64 => raw
            .data
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        StDtype::I32 => raw
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
            .collect(),
        other => {
            return Err(Error::invalid(
                name,
                format!("dtype {other:?}"),
                "dtype must be I32 or I64",
            ))
        }
    };
    match values[..] {
        [n, k] if n > 0 && k > 0 => Ok((n as usize, k as usize)),
        _ => Err(Error::invalid(
            name,
            format!("{values:?}"),
            "must hold [N, K], both positive",
        )),
    }
}

pub(super) fn detect(ckpt: &Checkpoint) -> Result<Vec<QuantLayer>> {
    let cfg = ckpt.quant_config();
    let mut layers = Vec::new();
    for name in ckpt.names() {
        if let Some(prefix) = name.strip_suffix(".qweight") {
            layers.push(detect_qweight(ckpt, prefix)?);
        } else if let Some(prefix) = name.strip_suffix(".weight_packed") {
            layers.push(detect_packed(ckpt, prefix)?);
        } else if let Some(prefix) = name.strip_suffix(".weight") {
            if ckpt.st_dtype(name) == Some(StDtype::I8) && ckpt.contains(&format!("{prefix}.weight_scale")) {
                layers.push(detect_int8(ckpt, prefix)?);
            }
        }
    }
    if let Some(cfg) = cfg {
        let conflicting = layers.iter().find(|l| match cfg.method {
            QuantMethod::Awq => l.format != Format::Awq,
            QuantMethod::Gptq => l.format != Format::Gptq,
            QuantMethod::CompressedTensors => !matches!(l.format, Format::CompressedTensors | Format::Int8),
            QuantMethod::Other(_) => false,
        });
        if let Some(l) = conflicting {
            return Err(Error::invalid(
                l.tensor_name(layer_suffixes(l.format)[0]),
                format!("a {} layer", l.format),
                format!("config.json says quant_method {}", cfg.method),
            ));
        }
    }
    layers.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    Ok(layers)
}

fn detect_qweight(ckpt: &Checkpoint, prefix: &str) -> Result<QuantLayer> {
    let cfg = ckpt.quant_config();
    let qweight = format!("{prefix}.qweight");
    let qzeros = format!("{prefix}.qzeros");
    let scales = format!("{prefix}.scales");
    let g_idx = format!("{prefix}.g_idx");
    let why = format!("{qweight} exists; AWQ and GPTQ layers need qweight, qzeros and scales");
    require(ckpt, &qzeros, &why)?;
    require(ckpt, &scales, &why)?;
    let (qw_rows, qw_cols) = dims2(ckpt, &qweight)?;
    let (groups, n) = dims2(ckpt, &scales)?;
    let has_g_idx = ckpt.contains(&g_idx);

    let format = match cfg.map(|c| &c.method) {
        Some(QuantMethod::Awq) => Format::Awq,
        Some(QuantMethod::Gptq) => Format::Gptq,
        _ if has_g_idx => Format::Gptq,
        _ if n == qw_cols * 8 => Format::Awq,
        _ => Format::Gptq,
    };
    let config_group = cfg.and_then(|c| c.group_size);
    let mut tensors = vec![qweight.clone(), qzeros, scales.clone()];
    let layer = match format {
        Format::Awq => {
            let bits = cfg.map_or(4, |c| c.bits);
            if bits != 4 || n != qw_cols * 8 {
                return Err(Error::invalid(
                    &qweight,
                    format!("shape [{qw_rows}, {qw_cols}] with {bits}-bit codes and scales [{groups}, {n}]"),
                    "AWQ GEMM stores 4-bit codes: qweight [K, N/8] and scales [K/G, N]",
                ));
            }
            let k = qw_rows;
            let group_size = check_config_group(&scales, k, groups, config_group)?;
            QuantLayer {
                prefix: prefix.to_string(),
                format,
                bits,
                n,
                k,
                group_size,
                zero_point: cfg.map_or(true, |c| c.zero_point),
                has_g_idx: false,
                tensors,
            }
        }
        _ => {
            // bits: config.json's, or implied by g_idx's length (K) against qweight's rows (K*bits/32), or 4.
            let g_idx_len = ckpt.shape(&g_idx).and_then(|s| s.first().copied());
            let bits = match (cfg, g_idx_len) {
                (Some(c), _) => c.bits,
                (None, Some(k)) if k > 0 && (qw_rows * 32) % k == 0 => (qw_rows * 32 / k) as u8,
                _ => 4,
            };
            if ![4, 8].contains(&bits) || qw_cols != n {
                return Err(Error::invalid(
                    &qweight,
                    format!("shape [{qw_rows}, {qw_cols}] with {bits}-bit codes and scales [{groups}, {n}]"),
                    "GPTQ stores qweight [K*bits/32, N] and scales [groups, N] with bits 4 or 8",
                ));
            }
            let k = qw_rows * 32 / bits as usize;
            if let Some(len) = g_idx_len.filter(|&len| len != k) {
                return Err(Error::invalid(
                    &g_idx,
                    format!("{len} elements"),
                    format!("must have K = {k}"),
                ));
            }
            let group_size = match (has_g_idx, config_group) {
                // Act-order: groups need not be contiguous, only their count is ceil(K/G).
                (true, Some(g)) if groups == k.div_ceil(g) => g,
                _ => check_config_group(&scales, k, groups, config_group)?,
            };
            if has_g_idx {
                tensors.push(g_idx);
            }
            QuantLayer {
                prefix: prefix.to_string(),
                format: Format::Gptq,
                bits,
                n,
                k,
                group_size,
                // Without a config, keep zeros: GPTQ always stores them, and `sym` is unknown.
                zero_point: cfg.map_or(true, |c| c.zero_point),
                has_g_idx,
                tensors,
            }
        }
    };
    Ok(layer)
}

fn detect_packed(ckpt: &Checkpoint, prefix: &str) -> Result<QuantLayer> {
    let cfg = ckpt.quant_config();
    let packed = format!("{prefix}.weight_packed");
    let scale = format!("{prefix}.weight_scale");
    require(
        ckpt,
        &scale,
        &format!("{packed} exists; compressed-tensors layers need weight_scale"),
    )?;
    let (p_rows, p_cols) = dims2(ckpt, &packed)?;
    let (s_rows, groups) = dims2(ckpt, &scale)?;
    let bits = cfg.map_or(4, |c| c.bits);
    if ![4, 8].contains(&bits) {
        return Err(Error::invalid(
            &packed,
            format!("{bits}-bit codes"),
            "pack-quantized bits must be 4 or 8",
        ));
    }
    let pack = 32 / bits as usize;
    let shape_name = format!("{prefix}.weight_shape");
    let (n, k) = if ckpt.contains(&shape_name) {
        read_weight_shape(ckpt, &shape_name)?
    } else {
        (p_rows, p_cols * pack)
    };
    if p_rows != n || p_cols != k.div_ceil(pack) || s_rows != n {
        return Err(Error::invalid(
            &packed,
            format!("shape [{p_rows}, {p_cols}] with weight_scale [{s_rows}, {groups}] for W [{n}, {k}]"),
            format!("pack-quantized stores weight_packed [N, K/{pack}] and weight_scale [N, K/G]"),
        ));
    }
    let group_size = check_config_group(&scale, k, groups, cfg.and_then(|c| c.group_size))?;
    let mut tensors = vec![packed, scale];
    let mut zero_point = false;
    let mut has_g_idx = false;
    for (suffix, flag) in [("weight_zero_point", &mut zero_point), ("weight_g_idx", &mut has_g_idx)] {
        let name = format!("{prefix}.{suffix}");
        if ckpt.contains(&name) {
            *flag = true;
            tensors.push(name);
        }
    }
    if ckpt.contains(&shape_name) {
        tensors.push(shape_name);
    }
    Ok(QuantLayer {
        prefix: prefix.to_string(),
        format: Format::CompressedTensors,
        bits,
        n,
        k,
        group_size,
        zero_point,
        has_g_idx,
        tensors,
    })
}

fn detect_int8(ckpt: &Checkpoint, prefix: &str) -> Result<QuantLayer> {
    let weight = format!("{prefix}.weight");
    let scale = format!("{prefix}.weight_scale");
    let (n, k) = dims2(ckpt, &weight)?;
    // Per-tensor scales ([] or [1]) count as one group per row, as `Int8Weight` reads them.
    let groups = match ckpt.shape(&scale) {
        Some([]) | Some([1]) => 1,
        _ => dims2(ckpt, &scale)?.1,
    };
    let group_size = check_config_group(&scale, k, groups, ckpt.quant_config().and_then(|c| c.group_size))?;
    let mut tensors = vec![weight, scale];
    let zero_point_name = format!("{prefix}.weight_zero_point");
    let zero_point = ckpt.contains(&zero_point_name);
    if zero_point {
        tensors.push(zero_point_name);
    }
    Ok(QuantLayer {
        prefix: prefix.to_string(),
        format: Format::Int8,
        bits: 8,
        n,
        k,
        group_size,
        zero_point,
        has_g_idx: false,
        tensors,
    })
}

impl Checkpoint {
    /// The GPTQ zero convention: config.json's `checkpoint_format`, or v1 (`"gptq"`, AutoGPTQ's) when absent.
    pub fn gptq_version(&self) -> Result<GptqVersion> {
        match self.quant_config().and_then(|c| c.checkpoint_format.as_deref()) {
            Some(f) => GptqVersion::parse(f),
            None => Ok(GptqVersion::V1),
        }
    }

    /// Reads a layer found by [`Checkpoint::quantized_layers`] through its format's validating reader and unpacks
    /// it into a [`QuantMatrix`].
    pub fn load_layer(&self, layer: &QuantLayer) -> Result<QuantMatrix> {
        let prefix = layer.prefix.as_str();
        let t = |suffix: &str| self.tensor(&layer.tensor_name(suffix));
        let opt = |suffix: &str| self.tensor_opt(&layer.tensor_name(suffix));
        let q = match layer.format {
            Format::Awq => AwqWeight::from_tensors(prefix, &t("qweight")?, &t("qzeros")?, &t("scales")?)?.to_quant(),
            Format::Gptq => {
                let g_idx = opt("g_idx")?;
                GptqWeight::from_tensors(
                    prefix,
                    layer.bits,
                    self.gptq_version()?,
                    &t("qweight")?,
                    &t("qzeros")?,
                    &t("scales")?,
                    g_idx.as_ref(),
                )?
                .to_quant()
            }
            Format::CompressedTensors => {
                // `weight_shape` was read (i32 or i64) when the layer was found; the quantized shape is checked
                // against it below, so the reader gets it only in the i32 form it takes.
                let shape_name = layer.tensor_name("weight_shape");
                let shape = match self.st_dtype(&shape_name) {
                    Some(StDtype::I32) => Some(self.tensor(&shape_name)?),
                    _ => None,
                };
                let (zp, g_idx) = (opt("weight_zero_point")?, opt("weight_g_idx")?);
                let q = CompressedTensorsWeight::from_tensors(
                    prefix,
                    layer.bits,
                    &t("weight_packed")?,
                    &t("weight_scale")?,
                    zp.as_ref(),
                    shape.as_ref(),
                    g_idx.as_ref(),
                )?
                .to_quant();
                if (q.n, q.k) != (layer.n, layer.k) {
                    return Err(Error::invalid(
                        shape_name,
                        format!("[{}, {}]", layer.n, layer.k),
                        format!(
                            "must equal [N, K] = [{}, {}] from weight_packed (padded K is not supported)",
                            q.n, q.k
                        ),
                    ));
                }
                q
            }
            Format::Int8 => {
                let zp = opt("weight_zero_point")?;
                Int8Weight::from_tensors(prefix, &t("weight")?, &t("weight_scale")?, zp.as_ref())?.to_quant()
            }
        };
        Ok(q)
    }
}
