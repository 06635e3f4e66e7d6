//! Finding quantized linear layers in a checkpoint by their tensor names and shapes.
//!
//! - `P.qweight` + `P.qzeros` + `P.scales`: AWQ GEMM (`qweight [K, N/8]`, packed along N) or GPTQ
//!   (`qweight [K*bits/32, N]`, packed along K). `quant_method` decides when config.json has one; otherwise a
//!   `P.g_idx` means GPTQ, and else the shapes do (`scales [groups, N]` matches `qweight` columns ×8 for AWQ, ×1
//!   for GPTQ).
//! - `P.weight_packed` + `P.weight_scale`: compressed-tensors `pack-quantized`.
//!
//! Group sizes are inferred from shapes (`K / groups`) and checked against config.json when it states one.

use super::{Checkpoint, QuantMethod, StDtype};
use crate::error::{Error, Result};

/// The checkpoint format of one quantized layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerFormat {
    /// AutoAWQ GEMM layout: `qweight`, `qzeros`, `scales`.
    Awq,
    /// AutoGPTQ / GPTQModel: `qweight`, `qzeros`, `scales`, optional `g_idx`.
    Gptq,
    /// compressed-tensors `pack-quantized`: `weight_packed`, `weight_scale`, optional `weight_zero_point`,
    /// `weight_shape`, `weight_g_idx`.
    CompressedTensors,
}

impl LayerFormat {
    /// Lower-case name as the CLI spells it (`awq`, `gptq`, `compressed-tensors`).
    pub fn name(self) -> &'static str {
        match self {
            LayerFormat::Awq => "awq",
            LayerFormat::Gptq => "gptq",
            LayerFormat::CompressedTensors => "compressed-tensors",
        }
    }

    /// The suffixes of the tensors a layer of this format may have (the first two are always present).
    pub fn suffixes(self) -> &'static [&'static str] {
        match self {
            LayerFormat::Awq => &["qweight", "qzeros", "scales"],
            LayerFormat::Gptq => &["qweight", "qzeros", "scales", "g_idx"],
            LayerFormat::CompressedTensors => &[
                "weight_packed",
                "weight_scale",
                "weight_zero_point",
                "weight_shape",
                "weight_g_idx",
            ],
        }
    }
}

impl std::fmt::Display for LayerFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A quantized linear layer found in a checkpoint: `W[n, k]` in groups of `group_size` along K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantLayer {
    /// Name prefix (`model.layers.0.self_attn.q_proj`); the tensors are `prefix.qweight` etc.
    pub prefix: String,
    pub format: LayerFormat,
    pub bits: u8,
    /// Output features.
    pub n: usize,
    /// Input features.
    pub k: usize,
    /// Inputs per group; `k` for per-channel.
    pub group_size: usize,
    /// Whether the layer stores zero points (asymmetric); compressed-tensors only when `weight_zero_point` exists.
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
        }
    }
    if let Some(cfg) = cfg {
        let conflicting = layers.iter().find(|l| match cfg.method {
            QuantMethod::Awq => l.format != LayerFormat::Awq,
            QuantMethod::Gptq => l.format != LayerFormat::Gptq,
            QuantMethod::CompressedTensors => l.format != LayerFormat::CompressedTensors,
            QuantMethod::Other(_) => false,
        });
        if let Some(l) = conflicting {
            return Err(Error::invalid(
                l.tensor_name(l.format.suffixes()[0]),
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
        Some(QuantMethod::Awq) => LayerFormat::Awq,
        Some(QuantMethod::Gptq) => LayerFormat::Gptq,
        _ if has_g_idx => LayerFormat::Gptq,
        _ if n == qw_cols * 8 => LayerFormat::Awq,
        _ => LayerFormat::Gptq,
    };
    let config_group = cfg.and_then(|c| c.group_size);
    let mut tensors = vec![qweight.clone(), qzeros, scales.clone()];
    let layer = match format {
        LayerFormat::Awq => {
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
            if ![2, 4, 8].contains(&bits) || qw_cols != n {
                return Err(Error::invalid(
                    &qweight,
                    format!("shape [{qw_rows}, {qw_cols}] with {bits}-bit codes and scales [{groups}, {n}]"),
                    "GPTQ stores qweight [K*bits/32, N] and scales [groups, N] with bits 2, 4 or 8",
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
                format: LayerFormat::Gptq,
                bits,
                n,
                k,
                group_size,
                zero_point: cfg.is_some_and(|c| c.zero_point),
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
        format: LayerFormat::CompressedTensors,
        bits,
        n,
        k,
        group_size,
        zero_point,
        has_g_idx,
        tensors,
    })
}
