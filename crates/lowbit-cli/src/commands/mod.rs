//! quantize, dequantize, convert, inspect, demo; and what they share: reading an input, packing a layer into a
//! format, the `quantization_config` each format writes, and writing the output (a `.safetensors` file, or a
//! model directory when the input is one).

mod convert;
mod demo;
mod dequantize;
mod inspect;
mod quantize;

pub use convert::{run as convert, ConvertArgs};
pub use demo::{run as demo, DemoArgs};
pub use dequantize::{run as dequantize, DequantizeArgs};
pub use inspect::{run as inspect, InspectArgs};
pub use quantize::{run as quantize, QuantizeArgs};

use crate::OutputArgs;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lowbit::checkpoint::{
    check_output, config_with_quantization, write_model_dir, write_safetensors, Checkpoint, OutTensor, QuantConfig,
    QuantLayer, METADATA_QUANT_KEY,
};
use lowbit::formats::awq::AwqWeight;
use lowbit::formats::compressed_tensors::CompressedTensorsWeight;
use lowbit::formats::gptq::{GptqVersion, GptqWeight};
use lowbit::formats::int8::Int8Weight;
use lowbit::formats::{Format, QuantMatrix};
use lowbit::{Error, Result, Tensor};
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;

/// Parses a format name given on the command line; the error names the option.
fn parse_format(option: &str, value: &str) -> Result<Format> {
    value.parse().map_err(|_| {
        Error::invalid(
            option,
            format!("{value:?}"),
            "must be one of awq, gptq, compressed-tensors, int8",
        )
    })
}

/// How a format stores a weight, as far as a checkpoint-wide `quantization_config` is concerned.
#[derive(Debug, Clone, PartialEq)]
struct Scheme {
    format: Format,
    bits: u8,
    /// `None` for per-channel.
    group_size: Option<usize>,
    /// Whether zero points are stored / used (AWQ `zero_point`, GPTQ `!sym`, compressed-tensors `!symmetric`).
    zero_point: bool,
    gptq_version: GptqVersion,
    /// Modules left in float (AWQ `modules_to_not_convert`, compressed-tensors `ignore`).
    not_converted: Vec<String>,
}

impl Scheme {
    /// The `quantization_config` the quantizer of `self.format` would write.
    fn config_json(&self) -> Value {
        let modules = (!self.not_converted.is_empty()).then_some(self.not_converted.as_slice());
        match self.format {
            Format::Awq => QuantConfig::awq_json(self.bits, self.group_size.unwrap_or(0), self.zero_point, modules),
            Format::Gptq => QuantConfig::gptq_json(
                self.bits,
                self.group_size,
                !self.zero_point,
                self.gptq_version.checkpoint_format(),
            ),
            Format::CompressedTensors => QuantConfig::compressed_tensors_json(
                "pack-quantized",
                self.bits,
                self.group_size,
                !self.zero_point,
                &self.not_converted,
            ),
            Format::Int8 => QuantConfig::compressed_tensors_json(
                "int-quantized",
                self.bits,
                self.group_size,
                !self.zero_point,
                &self.not_converted,
            ),
        }
    }
}

/// The checkpoint tensors of `q` in `format`, named `prefix.<suffix>`.
fn pack(format: Format, q: &QuantMatrix, prefix: &str, gptq_version: GptqVersion) -> Result<Vec<(String, Tensor)>> {
    Ok(match format {
        Format::Awq => AwqWeight::from_quant(q)?.to_tensors(prefix),
        Format::Gptq => GptqWeight::from_quant(q, gptq_version)?.to_tensors(prefix),
        Format::CompressedTensors => CompressedTensorsWeight::from_quant(q)?.to_tensors(prefix),
        Format::Int8 => Int8Weight::from_quant(q)?.to_tensors(prefix),
    })
}

/// Why `format` cannot store an `[n, k]` weight with `bits`-bit codes in groups of `group_size`, if it cannot.
fn shape_rule_violation(
    format: Format,
    bits: u8,
    zero_point: bool,
    n: usize,
    k: usize,
    group: usize,
) -> Option<String> {
    let per_word = 32 / bits as usize;
    if k % group != 0 {
        return Some(format!(
            "K = {k} (in_features) must be a multiple of the group size {group}"
        ));
    }
    let n_packed = match format {
        Format::Awq => true,
        Format::Gptq => true,
        Format::CompressedTensors => zero_point,
        Format::Int8 => false,
    };
    if n_packed && n % per_word != 0 {
        return Some(format!(
            "N = {n} (out_features) must be a multiple of {per_word} to pack it into int32 words"
        ));
    }
    let k_packed = matches!(format, Format::Gptq | Format::CompressedTensors);
    if k_packed && k % per_word != 0 {
        return Some(format!(
            "K = {k} (in_features) must be a multiple of {per_word} to pack it into int32 words"
        ));
    }
    None
}

/// Opens the input of a command that rewrites quantized layers (dequantize, convert), checks that its output may be
/// written, and finds the layers; an input without any fails, naming `none_found` as the rule it breaks.
fn open_quantized(input: &Path, out: &OutputArgs, none_found: &str) -> Result<(Checkpoint, Vec<QuantLayer>)> {
    let ckpt = Checkpoint::open(input)?;
    check_output(&out.output, input, out.force)?;
    let layers = ckpt.quantized_layers()?;
    if layers.is_empty() {
        return Err(Error::invalid(
            input.display().to_string(),
            format!("{} tensors", ckpt.len()),
            none_found,
        ));
    }
    Ok((ckpt, layers))
}

/// The names of the tensors `layers` are made of.
fn layer_tensors(layers: &[QuantLayer]) -> HashSet<&str> {
    layers
        .iter()
        .flat_map(|l| l.tensors.iter().map(String::as_str))
        .collect()
}

/// Every tensor of `ckpt` not in `consumed`, to be copied to the output unchanged.
fn copied_tensors<'a>(ckpt: &'a Checkpoint, consumed: &HashSet<&str>) -> Result<Vec<(String, OutTensor<'a>)>> {
    ckpt.names()
        .filter(|n| !consumed.contains(n))
        .map(|name| Ok((name.to_string(), ckpt.raw(name)?.into())))
        .collect()
}

/// Whether the output is a model directory: when the input is one and the output is not named `*.safetensors`.
fn output_is_dir(input: &Checkpoint, output: &Path) -> bool {
    input.is_dir() && output.extension().map_or(true, |e| e != "safetensors")
}

/// Writes `tensors` as the output of a command run on `input`: a model directory (config.json with `quant` as its
/// `quantization_config`, other files of the input copied) or a single file (`quant` recorded in its metadata).
fn write_output(
    input: &Checkpoint,
    out: &OutputArgs,
    tensors: &[(String, OutTensor<'_>)],
    quant: Option<Value>,
) -> Result<()> {
    let mut metadata = input.metadata().clone();
    metadata.remove(METADATA_QUANT_KEY);
    // transformers refuses safetensors weights whose metadata lacks a framework `format`.
    metadata.entry("format".into()).or_insert_with(|| "pt".into());
    if output_is_dir(input, &out.output) {
        let config = config_with_quantization(input.config(), quant);
        write_model_dir(
            &out.output,
            tensors,
            Some(&metadata),
            &config,
            Some(input.path()),
            out.force,
        )
    } else {
        if let Some(q) = quant {
            metadata.insert(METADATA_QUANT_KEY.into(), q.to_string());
        }
        write_safetensors(&out.output, tensors, Some(&metadata), out.force)
    }
}

/// A progress bar over `len` steps on stderr (drawn only when stderr is a terminal).
fn progress(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {wide_msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// `bytes` as a short human-readable size.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Replaces the generic tensor name a library function used (`"weight"`) with the checkpoint name.
fn name_error(e: Error, generic: &str, name: &str) -> Error {
    match e {
        Error::Invalid { tensor, value, rule } if tensor == generic => Error::Invalid {
            tensor: name.to_string(),
            value,
            rule,
        },
        other => other,
    }
}
