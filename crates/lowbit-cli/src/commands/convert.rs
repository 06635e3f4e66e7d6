//! `lowbit convert`: a quantized checkpoint from one format to another, code for code (no re-quantization).

use super::{copied_tensors, layer_tensors, open_quantized, pack, parse_format, progress, write_output, Scheme};
use crate::OutputArgs;
use lowbit::checkpoint::{OutTensor, QuantLayer};
use lowbit::formats::gptq::GptqVersion;
use lowbit::{Error, Result};
use std::collections::BTreeSet;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConvertArgs {
    /// A quantized `.safetensors` file or model directory.
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
    /// awq | gptq | compressed-tensors | int8
    #[arg(long)]
    pub to: String,
    /// GPTQ zero convention written by --to gptq: v1 (`checkpoint_format: "gptq"`, read by every vLLM) or v2
    /// (`"gptq_v2"`; can also hold zero code 0).
    #[arg(long, default_value = "v1")]
    pub gptq_format: String,
}

/// The one value every layer has, or an error naming the layers that differ (a config holds one value).
fn uniform<T: Ord + Copy + std::fmt::Debug>(
    layers: &[QuantLayer],
    what: &str,
    f: impl Fn(&QuantLayer) -> T,
) -> Result<T> {
    let values: BTreeSet<T> = layers.iter().map(&f).collect();
    match values.len() {
        1 => Ok(*values.first().expect("one value")),
        _ => Err(Error::Unsupported(format!(
            "layers with different {what} ({values:?}) cannot share one quantization_config"
        ))),
    }
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let target = parse_format("--to", &a.to)?;
    let gptq_version = GptqVersion::parse(&a.gptq_format)
        .map_err(|_| Error::invalid("--gptq-format", format!("{:?}", a.gptq_format), "must be v1 or v2"))?;
    let (ckpt, layers) = open_quantized(&a.input, &a.out, "no quantized layer to convert")?;
    let bits = uniform(&layers, "bit widths", |l| l.bits)?;
    let group_size = uniform(&layers, "group sizes", |l| {
        if l.group_size == l.k {
            None
        } else {
            Some(l.group_size)
        }
    })?;
    // Zero points are kept if any layer has them (AWQ: unless config.json says zero_point false; GPTQ: sym false).
    let zero_point = layers.iter().any(|l| l.zero_point);
    let scheme = Scheme {
        format: target,
        bits,
        group_size,
        zero_point,
        gptq_version,
        not_converted: ckpt
            .quant_config()
            .map(|c| c.modules_to_not_convert.clone())
            .unwrap_or_default(),
    };

    let consumed = layer_tensors(&layers);
    let bar = progress(layers.len(), "convert");
    let mut out: Vec<(String, OutTensor<'_>)> = Vec::new();
    for layer in &layers {
        bar.set_message(layer.prefix.clone());
        let mut q = ckpt.load_layer(layer)?;
        if zero_point {
            // Every layer of an asymmetric checkpoint carries zero points, symmetric ones included.
            let mid = q.midpoint();
            q.zeros.get_or_insert_with(|| vec![mid; q.scales.len()]);
        } else if q.is_symmetric() {
            q.zeros = None;
        } else {
            return Err(Error::invalid(
                layer.tensor_name(lowbit::checkpoint::layer_suffixes(layer.format)[1]),
                "zero points other than the midpoint",
                "the checkpoint is declared symmetric (config.json sym / zero_point)",
            ));
        }
        let tensors = pack(target, &q, &layer.prefix, gptq_version)?;
        out.extend(tensors.into_iter().map(|(name, t)| (name, OutTensor::from(t))));
        bar.inc(1);
    }
    bar.finish_and_clear();
    out.extend(copied_tensors(&ckpt, &consumed)?);
    write_output(&ckpt, &a.out, &out, Some(scheme.config_json()))?;
    let from: BTreeSet<&str> = layers.iter().map(|l| l.format.name()).collect();
    let target_name = match target {
        lowbit::formats::Format::Gptq => format!("gptq ({})", gptq_version.checkpoint_format()),
        other => other.to_string(),
    };
    println!(
        "wrote {}: {} layers converted from {} to {target_name}, {} tensors copied",
        a.out.output.display(),
        layers.len(),
        from.into_iter().collect::<Vec<_>>().join("+"),
        ckpt.len() - consumed.len()
    );
    Ok(())
}
