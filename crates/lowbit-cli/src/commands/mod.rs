//! quantize, dequantize, convert, inspect, demo.

use crate::OutputArgs;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// A `.safetensors` file or a model directory.
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
    #[arg(long, default_value = "awq")]
    pub format: String,
    #[arg(long, default_value_t = 4)]
    pub bits: u8,
    #[arg(long, default_value_t = 128)]
    pub group_size: usize,
    /// `autoawq`: reproduce AutoAWQ's fp16 arithmetic bit for bit.
    #[arg(long)]
    pub compat: Option<String>,
}

#[derive(clap::Args)]
pub struct DequantizeArgs {
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(clap::Args)]
pub struct ConvertArgs {
    pub input: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
    /// awq | gptq | compressed-tensors
    #[arg(long)]
    pub to: String,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    pub input: PathBuf,
}

#[derive(clap::Args)]
pub struct DemoArgs {
    /// cpu | cuda | cuda:N | auto
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn quantize(_a: QuantizeArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("quantize: not yet implemented".into()))
}
pub fn dequantize(_a: DequantizeArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("dequantize: not yet implemented".into()))
}
pub fn convert(_a: ConvertArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("convert: not yet implemented".into()))
}
pub fn inspect(_a: InspectArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("inspect: not yet implemented".into()))
}
pub fn demo(_a: DemoArgs) -> lowbit::Result<()> {
    Err(lowbit::Error::Unsupported("demo: not yet implemented".into()))
}
