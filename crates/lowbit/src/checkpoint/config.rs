//! `quantization_config` of a model's `config.json`: parsed into [`QuantConfig`], and written back in the exact
//! shapes AutoAWQ, GPTQModel and llm-compressor write (so vLLM, AutoAWQ and transformers load what lowbit writes).

use crate::error::{Error, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Which quantizer's conventions a checkpoint follows (`quant_method`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantMethod {
    /// AutoAWQ (`"awq"`).
    Awq,
    /// AutoGPTQ / GPTQModel (`"gptq"`).
    Gptq,
    /// llm-compressor's compressed-tensors (`"compressed-tensors"`).
    CompressedTensors,
    /// Any other `quant_method` (fp8, bitsandbytes, ...): reported, not read.
    Other(String),
}

impl QuantMethod {
    /// The `quant_method` string as it appears in config.json.
    pub fn name(&self) -> &str {
        match self {
            QuantMethod::Awq => "awq",
            QuantMethod::Gptq => "gptq",
            QuantMethod::CompressedTensors => "compressed-tensors",
            QuantMethod::Other(s) => s,
        }
    }
}

impl std::fmt::Display for QuantMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The parts of `quantization_config` lowbit uses, normalised across AWQ, GPTQ and compressed-tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    pub method: QuantMethod,
    /// Weight bits (`bits`, or `weights.num_bits` of compressed-tensors).
    pub bits: u8,
    /// Inputs per group along K; `None` for per-channel (`group_size: -1`, or strategy `"channel"`).
    pub group_size: Option<usize>,
    /// Whether zero points are stored: AWQ `zero_point`, GPTQ `!sym`, compressed-tensors `!symmetric`.
    pub zero_point: bool,
    /// AWQ kernel layout (`"gemm"`, `"gemv"`, ...).
    pub version: Option<String>,
    /// GPTQ act-order (`desc_act`), or compressed-tensors `actorder` set.
    pub desc_act: bool,
    /// GPTQ `checkpoint_format`: `"gptq"` (v1, zeros stored minus one) or `"gptq_v2"`.
    pub checkpoint_format: Option<String>,
    /// compressed-tensors `format` (`"pack-quantized"`, ...).
    pub format: Option<String>,
    /// Modules left unquantized (AWQ `modules_to_not_convert`, compressed-tensors `ignore`).
    pub modules_to_not_convert: Vec<String>,
    /// The `quantization_config` object exactly as read.
    pub raw: Value,
}

fn field_err(path: &Path, key: &str, v: &Value, want: &str) -> Error {
    Error::parse(path, format!("quantization_config.{key}: expected {want}, got {v}"))
}

fn get_uint(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| field_err(path, key, v, "a non-negative integer")),
    }
}

/// `group_size` as checkpoints write it: a positive integer, or -1 / null for per-channel.
fn get_group_size(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<Option<usize>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(-1) => Ok(None),
            Some(g) if g > 0 => Ok(Some(g as usize)),
            _ => Err(field_err(path, key, v, "a positive integer or -1")),
        },
    }
}

fn get_bool(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<Option<bool>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| field_err(path, key, v, "true or false")),
    }
}

fn get_str(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| field_err(path, key, v, "a string")),
    }
}

fn get_str_list(obj: &Map<String, Value>, key: &str, path: &Path) -> Result<Vec<String>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| field_err(path, key, v, "a list of strings"))
            })
            .collect(),
        Some(v) => Err(field_err(path, key, v, "a list of strings")),
    }
}

fn bits_u8(bits: Option<u64>, key: &str, path: &Path) -> Result<u8> {
    // Absent bits: every AWQ/GPTQ checkpoint in the wild that omits it is 4-bit.
    let bits = bits.unwrap_or(4);
    u8::try_from(bits).ok().filter(|b| (1..=8).contains(b)).ok_or_else(|| {
        Error::parse(
            path,
            format!("quantization_config.{key}: {bits} is not a bit width in 1..=8"),
        )
    })
}

impl QuantConfig {
    /// Parses a `quantization_config` object; `path` (the config.json) is named in errors.
    pub fn from_json(qc: &Value, path: &Path) -> Result<Self> {
        let obj = qc
            .as_object()
            .ok_or_else(|| Error::parse(path, format!("quantization_config: expected an object, got {qc}")))?;
        let method_name = get_str(obj, "quant_method", path)?
            .ok_or_else(|| Error::parse(path, "quantization_config has no quant_method"))?;
        let method = match method_name.to_ascii_lowercase().as_str() {
            "awq" => QuantMethod::Awq,
            "gptq" => QuantMethod::Gptq,
            "compressed-tensors" | "compressed_tensors" => QuantMethod::CompressedTensors,
            _ => QuantMethod::Other(method_name),
        };
        let modules_to_not_convert = get_str_list(obj, "modules_to_not_convert", path)?;
        let mut cfg = QuantConfig {
            method: method.clone(),
            bits: 4,
            group_size: None,
            zero_point: false,
            version: None,
            desc_act: false,
            checkpoint_format: None,
            format: None,
            modules_to_not_convert,
            raw: qc.clone(),
        };
        match method {
            QuantMethod::Awq => {
                cfg.bits = bits_u8(
                    get_uint(obj, "bits", path)?.or(get_uint(obj, "w_bit", path)?),
                    "bits",
                    path,
                )?;
                cfg.group_size = match get_group_size(obj, "group_size", path)? {
                    Some(g) => Some(g),
                    None => get_group_size(obj, "q_group_size", path)?,
                };
                cfg.zero_point = get_bool(obj, "zero_point", path)?.unwrap_or(true);
                cfg.version = get_str(obj, "version", path)?.map(|v| v.to_ascii_lowercase());
            }
            QuantMethod::Gptq => {
                cfg.bits = bits_u8(get_uint(obj, "bits", path)?, "bits", path)?;
                cfg.group_size = get_group_size(obj, "group_size", path)?;
                cfg.zero_point = !get_bool(obj, "sym", path)?.unwrap_or(true);
                cfg.desc_act = get_bool(obj, "desc_act", path)?.unwrap_or(false);
                cfg.checkpoint_format = get_str(obj, "checkpoint_format", path)?;
            }
            QuantMethod::CompressedTensors => cfg.parse_compressed_tensors(obj, path)?,
            QuantMethod::Other(_) => {
                if let Some(b) = get_uint(obj, "bits", path)? {
                    cfg.bits = bits_u8(Some(b), "bits", path)?;
                }
                cfg.group_size = get_group_size(obj, "group_size", path).unwrap_or(None);
            }
        }
        Ok(cfg)
    }

    /// compressed-tensors keeps the scheme in `config_groups.<name>.weights`; lowbit reads the first group that
    /// quantizes weights (multi-scheme checkpoints are read layer by layer from the tensors themselves).
    fn parse_compressed_tensors(&mut self, obj: &Map<String, Value>, path: &Path) -> Result<()> {
        self.format = get_str(obj, "format", path)?;
        self.modules_to_not_convert = get_str_list(obj, "ignore", path)?;
        let groups = match obj.get("config_groups") {
            Some(Value::Object(g)) => g,
            Some(v) => return Err(field_err(path, "config_groups", v, "an object")),
            None => {
                return Err(Error::parse(
                    path,
                    "compressed-tensors quantization_config has no config_groups",
                ))
            }
        };
        let Some((name, group)) = groups
            .iter()
            .find(|(_, g)| g.get("weights").is_some_and(|w| w.is_object()))
        else {
            return Err(Error::parse(
                path,
                "quantization_config.config_groups: no group quantizes weights",
            ));
        };
        let weights = group["weights"].as_object().expect("checked is_object above");
        let key = |k: &str| format!("config_groups.{name}.weights.{k}");
        self.bits = bits_u8(get_uint(weights, "num_bits", path)?, &key("num_bits"), path)?;
        let strategy = get_str(weights, "strategy", path)?.unwrap_or_else(|| "group".into());
        self.group_size = match strategy.as_str() {
            "channel" | "tensor" => None,
            _ => get_group_size(weights, "group_size", path)?,
        };
        self.zero_point = !get_bool(weights, "symmetric", path)?.unwrap_or(true);
        // actorder: null/false = off; "group"/"weight"/true = act-order (a weight_g_idx tensor is present).
        self.desc_act = match weights.get("actorder") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(_) => true,
        };
        if self.format.is_none() {
            self.format = get_str(
                group.as_object().expect("a group with weights is an object"),
                "format",
                path,
            )?;
        }
        Ok(())
    }

    /// AutoAWQ's `quantization_config`, key for key as `AutoAWQForCausalLM.save_quantized` writes it
    /// (vLLM and transformers read it; vLLM ignores `version` and assumes the GEMM layout lowbit writes).
    pub fn awq_json(bits: u8, group_size: usize, zero_point: bool, modules_to_not_convert: Option<&[String]>) -> Value {
        json!({
            "quant_method": "awq",
            "bits": bits,
            "group_size": group_size,
            "zero_point": zero_point,
            "version": "gemm",
            "modules_to_not_convert": modules_to_not_convert,
        })
    }

    /// GPTQModel's `quantization_config` for a GPTQ checkpoint without act-order; `checkpoint_format` is
    /// `"gptq"` (v1: zeros stored minus one, what every vLLM GPTQ kernel reads) or `"gptq_v2"`.
    pub fn gptq_json(bits: u8, group_size: Option<usize>, sym: bool, checkpoint_format: &str) -> Value {
        json!({
            "quant_method": "gptq",
            "bits": bits,
            "group_size": group_size.map_or(-1, |g| g as i64),
            "desc_act": false,
            "sym": sym,
            "lm_head": false,
            "checkpoint_format": checkpoint_format,
        })
    }

    /// llm-compressor's `quantization_config` for a W{bits}A16 checkpoint of all `Linear` layers except `ignore`;
    /// `format` is `"pack-quantized"` (int4/int8 packed into int32) or `"int-quantized"` (int8 stored as int8).
    pub fn compressed_tensors_json(
        format: &str,
        bits: u8,
        group_size: Option<usize>,
        symmetric: bool,
        ignore: &[String],
    ) -> Value {
        json!({
            "quant_method": "compressed-tensors",
            "format": format,
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": bits,
                        "type": "int",
                        "symmetric": symmetric,
                        "strategy": if group_size.is_some() { "group" } else { "channel" },
                        "group_size": group_size,
                        "actorder": null,
                        "dynamic": false,
                        "observer": "minmax",
                        "observer_kwargs": {},
                        "block_structure": null,
                    },
                    "input_activations": null,
                    "output_activations": null,
                    "format": format,
                }
            },
            "ignore": ignore,
            "kv_cache_scheme": null,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<QuantConfig> {
        QuantConfig::from_json(&v, Path::new("config.json"))
    }

    #[test]
    fn awq_round_trips_through_awq_json() {
        let cfg = parse(QuantConfig::awq_json(4, 64, true, None)).unwrap();
        assert_eq!(cfg.method, QuantMethod::Awq);
        assert_eq!((cfg.bits, cfg.group_size, cfg.zero_point), (4, Some(64), true));
        assert_eq!(cfg.version.as_deref(), Some("gemm"));
        assert!(cfg.modules_to_not_convert.is_empty());
    }

    #[test]
    fn gptq_fields() {
        let cfg = parse(
            json!({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": true, "sym": false,
            "checkpoint_format": "gptq_v2"}),
        )
        .unwrap();
        assert_eq!(
            (cfg.bits, cfg.group_size, cfg.zero_point, cfg.desc_act),
            (8, None, true, true)
        );
        assert_eq!(cfg.checkpoint_format.as_deref(), Some("gptq_v2"));
        assert_eq!(
            parse(QuantConfig::gptq_json(4, Some(128), true, "gptq"))
                .unwrap()
                .group_size,
            Some(128)
        );
    }

    #[test]
    fn compressed_tensors_config_groups() {
        let ignore = vec!["lm_head".to_string()];
        let cfg = parse(QuantConfig::compressed_tensors_json(
            "pack-quantized",
            4,
            Some(32),
            false,
            &ignore,
        ))
        .unwrap();
        assert_eq!(cfg.method, QuantMethod::CompressedTensors);
        assert_eq!((cfg.bits, cfg.group_size, cfg.zero_point), (4, Some(32), true));
        assert_eq!(cfg.format.as_deref(), Some("pack-quantized"));
        assert_eq!(cfg.modules_to_not_convert, ignore);
        let channel = parse(QuantConfig::compressed_tensors_json(
            "int-quantized",
            8,
            None,
            true,
            &[],
        ))
        .unwrap();
        assert_eq!((channel.bits, channel.group_size, channel.zero_point), (8, None, false));
    }

    #[test]
    fn bad_fields_name_the_key_and_value() {
        let e = parse(json!({"quant_method": "awq", "bits": "four"}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("config.json") && e.contains("bits") && e.contains("four"),
            "{e}"
        );
        let e = parse(json!({"quant_method": "gptq", "group_size": 0}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("group_size") && e.contains('0'), "{e}");
        assert!(parse(json!({"bits": 4})).is_err());
        assert!(parse(json!({"quant_method": "compressed-tensors"})).is_err());
        let other = parse(json!({"quant_method": "fp8"})).unwrap();
        assert_eq!(other.method, QuantMethod::Other("fp8".into()));
    }
}
