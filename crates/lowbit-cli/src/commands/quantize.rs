//! `lowbit quantize`: round-to-nearest quantization of every linear weight of a checkpoint.

use super::{name_error, pack, parse_format, progress, shape_rule_violation, write_output, Scheme};
use crate::OutputArgs;
use lowbit::checkpoint::{check_output, dtype_from_st, Checkpoint, OutTensor};
use lowbit::formats::gptq::GptqVersion;
use lowbit::formats::Format;
use lowbit::quantize::{quantize_rtn, RtnArithmetic, RtnConfig};
use lowbit::{DType, Error, Result};
use std::path::PathBuf;

/// Name fragments of 2-D weights that are not linear layers to quantize: embeddings and the LM head stay in float
/// (as AutoAWQ, GPTQModel and llm-compressor leave them).
const DEFAULT_SKIP: [&str; 2] = ["embed", "lm_head"];

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// A `.safetensors` file or a model directory (unquantized).
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
    /// awq | gptq | compressed-tensors | int8
    #[arg(long, default_value = "awq")]
    pub format: String,
    /// 4 or 8 [default: 8 for int8, else 4] (awq: 4 only; int8: 8 only)
    #[arg(long)]
    pub bits: Option<u8>,
    /// Inputs per scale group along in_features; -1 for one group per output channel (not awq).
    #[arg(long, default_value_t = 128, allow_hyphen_values = true)]
    pub group_size: i64,
    /// Symmetric quantization (no zero points; absmax scales).
    #[arg(long)]
    pub symmetric: bool,
    /// `autoawq`: reproduce AutoAWQ 0.2.9's fp16 arithmetic bit for bit (4-bit, zero point).
    #[arg(long)]
    pub compat: Option<String>,
    /// GPTQ zero convention for --format gptq: v1 (`checkpoint_format: "gptq"`) or v2.
    #[arg(long, default_value = "v1")]
    pub gptq_format: String,
    /// Also leave in float every `*.weight` whose name contains this (repeatable; `embed` and `lm_head` always).
    #[arg(long)]
    pub skip: Vec<String>,
}

/// The validated settings of one run.
struct Plan {
    scheme: Scheme,
    rtn: RtnConfig,
    /// `None`: one group per output channel (the group size is K of each weight).
    group_size: Option<usize>,
    skip: Vec<String>,
}

fn plan(a: &QuantizeArgs) -> Result<Plan> {
    let format = parse_format("--format", &a.format)?;
    let bits = a.bits.unwrap_or(if format == Format::Int8 { 8 } else { 4 });
    let bits_ok = match format {
        Format::Awq => bits == 4,
        Format::Int8 => bits == 8,
        Format::Gptq | Format::CompressedTensors => bits == 4 || bits == 8,
    };
    if !bits_ok {
        let rule = match format {
            Format::Awq => "--format awq stores 4-bit codes",
            Format::Int8 => "--format int8 stores 8-bit codes",
            _ => "--bits must be 4 or 8",
        };
        return Err(Error::invalid("--bits", bits, rule));
    }
    let group_size = match a.group_size {
        -1 if format != Format::Awq => None,
        g if g > 0 => Some(g as usize),
        g => {
            return Err(Error::invalid(
                "--group-size",
                g,
                "must be positive, or -1 (per channel) for gptq, compressed-tensors and int8",
            ))
        }
    };
    let arithmetic = match a.compat.as_deref() {
        None => RtnArithmetic::F32,
        Some("autoawq") => {
            if bits != 4 || a.symmetric {
                return Err(Error::invalid(
                    "--compat",
                    "autoawq",
                    "AutoAWQ quantizes 4-bit with zero points: drop --symmetric and use --bits 4",
                ));
            }
            RtnArithmetic::AutoAwqF16
        }
        Some(other) => {
            return Err(Error::invalid(
                "--compat",
                format!("{other:?}"),
                "the only value is autoawq",
            ))
        }
    };
    let gptq_version = GptqVersion::parse(&a.gptq_format)
        .map_err(|_| Error::invalid("--gptq-format", format!("{:?}", a.gptq_format), "must be v1 or v2"))?;
    let mut skip: Vec<String> = DEFAULT_SKIP.iter().map(|s| s.to_string()).collect();
    skip.extend(a.skip.iter().cloned());
    Ok(Plan {
        scheme: Scheme {
            format,
            bits,
            group_size,
            zero_point: !a.symmetric,
            gptq_version,
            not_converted: Vec::new(),
        },
        rtn: RtnConfig {
            bits,
            group_size: group_size.unwrap_or(0),
            zero_point: !a.symmetric,
            arithmetic,
            scale_dtype: DType::F16,
        },
        group_size,
        skip,
    })
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    let mut plan = plan(&a)?;
    let ckpt = Checkpoint::open(&a.input)?;
    check_output(&a.out.output, &a.input, a.out.force)?;
    if let Some(qc) = ckpt.quant_config() {
        return Err(Error::invalid(
            a.input.display().to_string(),
            format!("quant_method {}", qc.method),
            "quantize takes an unquantized checkpoint (dequantize it first, or use convert)",
        ));
    }
    if let Some(layer) = ckpt.quantized_layers()?.first() {
        return Err(Error::invalid(
            &layer.prefix,
            format!("a {} layer", layer.format),
            "quantize takes an unquantized checkpoint (dequantize it first, or use convert)",
        ));
    }

    let bar = progress(ckpt.len(), "quantize");
    let mut out: Vec<(String, OutTensor<'_>)> = Vec::new();
    let mut quantized = 0usize;
    let mut first_violation: Option<Error> = None;
    // Warnings for weights that break the format's shape rules; when nothing could be quantized the first one is
    // the error instead.
    let mut left_in_float: Vec<String> = Vec::new();
    for name in ckpt.names() {
        bar.set_message(name.to_string());
        let prefix = name.strip_suffix(".weight").unwrap_or(name);
        let eligible = is_linear_weight(&ckpt, name) && !plan.skip.iter().any(|s| name.contains(s.as_str()));
        if !eligible {
            out.push((name.to_string(), ckpt.raw(name)?.into()));
            bar.inc(1);
            continue;
        }
        let w = ckpt.tensor(name)?;
        let (n, k) = w.dims2()?;
        let group = plan.group_size.unwrap_or(k);
        let s = &plan.scheme;
        if let Some(rule) = shape_rule_violation(s.format, s.bits, s.zero_point, n, k, group) {
            left_in_float.push(format!("{name}: shape [{n}, {k}] left in float: {rule}"));
            first_violation.get_or_insert_with(|| Error::invalid(name, format!("shape [{n}, {k}]"), rule));
            plan.scheme.not_converted.push(prefix.to_string());
            out.push((name.to_string(), ckpt.raw(name)?.into()));
            bar.inc(1);
            continue;
        }
        let values = w.to_f32()?;
        let rtn = RtnConfig {
            group_size: group,
            ..plan.rtn
        };
        let q = quantize_rtn(&values, n, k, &rtn).map_err(|e| name_error(e, "weight", name))?;
        let tensors = pack(plan.scheme.format, &q, prefix, plan.scheme.gptq_version)?;
        out.extend(tensors.into_iter().map(|(t_name, t)| (t_name, OutTensor::from(t))));
        quantized += 1;
        bar.inc(1);
    }
    bar.finish_and_clear();

    if quantized == 0 {
        return Err(first_violation.unwrap_or_else(|| {
            Error::invalid(
                a.input.display().to_string(),
                format!("{} tensors", ckpt.len()),
                "nothing to quantize: no 2-D float *.weight outside embeddings and lm_head",
            )
        }));
    }
    left_in_float.iter().for_each(|w| eprintln!("lowbit: warning: {w}"));
    write_output(&ckpt, &a.out, &out, Some(plan.scheme.config_json()))?;
    let s = &plan.scheme;
    let group = s
        .group_size
        .map_or("per channel".to_string(), |g| format!("group size {g}"));
    println!(
        "wrote {}: {quantized} layers quantized ({}, {}-bit, {group}), {} tensors copied",
        a.out.output.display(),
        s.format,
        s.bits,
        ckpt.len() - quantized
    );
    Ok(())
}

/// A 2-D float `*.weight`: what a linear layer's weight looks like.
fn is_linear_weight(ckpt: &Checkpoint, name: &str) -> bool {
    name.ends_with(".weight")
        && ckpt.shape(name).is_some_and(|s| s.len() == 2)
        && ckpt.st_dtype(name).and_then(dtype_from_st).is_some_and(DType::is_float)
}
