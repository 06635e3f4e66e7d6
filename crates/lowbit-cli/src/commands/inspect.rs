//! `lowbit inspect`: what a checkpoint holds: format, bits, group size, layers and their shapes, bytes.

use super::human_bytes;
use lowbit::checkpoint::{Checkpoint, QuantLayer};
use lowbit::Result;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Layers listed in full up to this many; longer lists show the first and last `ELIDED_KEEP`.
const LIST_MAX: usize = 12;
const ELIDED_KEEP: usize = 5;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// A `.safetensors` file or a model directory.
    pub input: PathBuf,
    /// List every layer (no eliding).
    #[arg(long)]
    pub all: bool,
}

/// "128", or "32, 64, 128" when layers differ (sorted by value).
fn distinct<T: Ord + std::fmt::Display>(values: impl Iterator<Item = T>) -> String {
    let set: std::collections::BTreeSet<T> = values.collect();
    set.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// A layer's group size as printed: `per-channel` or the number.
fn group_label(l: &QuantLayer) -> String {
    if l.group_size == l.k {
        "per-channel".to_string()
    } else {
        l.group_size.to_string()
    }
}

fn layer_row(l: &QuantLayer, width: usize) -> String {
    let mut flags = Vec::new();
    if l.zero_point {
        flags.push("zero point");
    }
    if l.has_g_idx {
        flags.push("g_idx");
    }
    let flags = if flags.is_empty() {
        String::new()
    } else {
        format!("  ({})", flags.join(", "))
    };
    let shape = format!("[out {}, in {}]", l.n, l.k);
    let (prefix, format, bits, group) = (&l.prefix, l.format.name(), l.bits, group_label(l));
    format!("  {prefix:<width$}  {format:<18}  {bits}-bit  group {group:<11}  {shape}{flags}")
}

pub fn run(a: InspectArgs) -> Result<()> {
    let ckpt = Checkpoint::open(&a.input)?;
    let layers = ckpt.quantized_layers()?;
    let files = ckpt.files();
    println!(
        "{}: {}, {} tensors, {}",
        a.input.display(),
        if ckpt.is_dir() {
            format!(
                "model directory ({} safetensors file{})",
                files.len(),
                if files.len() == 1 { "" } else { "s" }
            )
        } else {
            "safetensors file".to_string()
        },
        ckpt.len(),
        human_bytes(ckpt.data_bytes())
    );
    match ckpt.quant_config() {
        Some(qc) => {
            let mut parts = vec![format!("quant_method {}", qc.method), format!("bits {}", qc.bits)];
            parts.push(
                qc.group_size
                    .map_or("group_size -1 (per channel)".into(), |g| format!("group_size {g}")),
            );
            parts.push(format!("zero point {}", if qc.zero_point { "yes" } else { "no" }));
            if let Some(v) = &qc.version {
                parts.push(format!("version {v}"));
            }
            if let Some(f) = &qc.checkpoint_format {
                parts.push(format!("checkpoint_format {f}"));
            }
            if let Some(f) = &qc.format {
                parts.push(format!("format {f}"));
            }
            if qc.desc_act {
                parts.push("act-order".into());
            }
            if !qc.modules_to_not_convert.is_empty() {
                parts.push(format!("not converted: {}", qc.modules_to_not_convert.join(", ")));
            }
            println!("quantization_config: {}", parts.join(", "));
        }
        None => println!("quantization_config: none"),
    }

    if layers.is_empty() {
        let linear = ckpt
            .names()
            .filter(|n| n.ends_with(".weight") && ckpt.shape(n).is_some_and(|s| s.len() == 2))
            .count();
        println!("format: unquantized (no quantized layers; {linear} 2-D *.weight tensors)");
        return Ok(());
    }

    let mut by_format: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &layers {
        *by_format.entry(l.format.name()).or_default() += 1;
    }
    let formats: Vec<String> = by_format.iter().map(|(f, n)| format!("{f} ({n} layers)")).collect();
    println!("format: {}", formats.join(", "));
    println!("bits: {}", distinct(layers.iter().map(|l| l.bits)));
    // Numeric order, per-channel last.
    let mut labels: Vec<String> = layers.iter().map(group_label).collect();
    labels.sort_by_key(|g| g.parse::<usize>().unwrap_or(usize::MAX));
    labels.dedup();
    println!("group size: {}", labels.join(", "));
    println!("layers: {}", layers.len());
    let width = layers.iter().map(|l| l.prefix.len()).max().unwrap_or(0);
    if a.all || layers.len() <= LIST_MAX {
        layers.iter().for_each(|l| println!("{}", layer_row(l, width)));
    } else {
        layers[..ELIDED_KEEP]
            .iter()
            .for_each(|l| println!("{}", layer_row(l, width)));
        println!("  ... {} more (--all lists them) ...", layers.len() - 2 * ELIDED_KEEP);
        layers[layers.len() - ELIDED_KEEP..]
            .iter()
            .for_each(|l| println!("{}", layer_row(l, width)));
    }

    let stored: u64 = layers.iter().map(|l| l.stored_bytes(&ckpt)).sum();
    let fp16: u64 = layers.iter().map(|l| l.fp16_bytes()).sum();
    let weights: u64 = layers.iter().map(|l| (l.n * l.k) as u64).sum();
    println!(
        "quantized tensors: {} stored vs {} as fp16 ({:.2}x smaller, {:.2} bits per weight incl. scales and zeros)",
        human_bytes(stored),
        human_bytes(fp16),
        fp16 as f64 / stored.max(1) as f64,
        stored as f64 * 8.0 / weights.max(1) as f64
    );
    let layer_tensors: usize = layers.iter().map(|l| l.tensors.len()).sum();
    println!(
        "other tensors: {} ({})",
        ckpt.len() - layer_tensors,
        human_bytes(ckpt.data_bytes() - stored)
    );
    Ok(())
}
