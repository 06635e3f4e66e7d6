//! `lowbit dequantize`: every quantized layer back to a dense `P.weight` `[out, in]`.

use super::{copied_tensors, layer_tensors, open_quantized, progress, write_output};
use crate::OutputArgs;
use lowbit::checkpoint::{dtype_to_st, OutTensor};
use lowbit::ops::dequantize::{dequantize_to_tensor, Layout};
use lowbit::{DType, Error, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DequantizeArgs {
    /// A quantized `.safetensors` file or model directory (AWQ, GPTQ, compressed-tensors, int8).
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Dtype of the dense weights: f16 | bf16 | f32
    #[arg(long, default_value = "f16")]
    pub dtype: String,
}

fn parse_dtype(s: &str) -> Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f16" | "fp16" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::Bf16),
        "f32" | "fp32" | "float32" => Ok(DType::F32),
        _ => Err(Error::invalid("--dtype", format!("{s:?}"), "must be f16, bf16 or f32")),
    }
}

pub fn run(a: DequantizeArgs) -> Result<()> {
    let dtype = parse_dtype(&a.dtype)?;
    let (ckpt, layers) = open_quantized(
        &a.input,
        &a.out,
        "no quantized layer found (qweight/qzeros/scales, weight_packed/weight_scale or int8 weight/weight_scale)",
    )?;
    let consumed = layer_tensors(&layers);

    // Dense weights are computed as the writer reaches them, so outputs larger than memory stream through.
    let bar = progress(layers.len(), "dequantize");
    let mut out: Vec<(String, OutTensor<'_>)> = Vec::new();
    for layer in &layers {
        let name = layer.tensor_name("weight");
        if ckpt.contains(&name) && !consumed.contains(name.as_str()) {
            return Err(Error::invalid(
                &name,
                "present beside the quantized tensors",
                "a quantized layer must not also have a dense weight",
            ));
        }
        let (ckpt, bar) = (&ckpt, &bar);
        let dense = OutTensor::deferred(dtype_to_st(dtype), vec![layer.n, layer.k], move || {
            bar.set_message(layer.prefix.clone());
            let q = ckpt.load_layer(layer)?;
            let weight = dequantize_to_tensor(&q, Layout::Nk, dtype)?;
            bar.inc(1);
            Ok(weight.data)
        });
        out.push((name, dense));
    }
    out.extend(copied_tensors(&ckpt, &consumed)?);
    write_output(&ckpt, &a.out, &out, None)?;
    bar.finish_and_clear();
    println!(
        "wrote {}: {} layers dequantized to {dtype} [out, in], {} tensors copied",
        a.out.output.display(),
        layers.len(),
        ckpt.len() - consumed.len()
    );
    Ok(())
}
