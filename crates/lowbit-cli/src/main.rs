//! `lowbit`: quantize, dequantize, convert, inspect, bench and doctor.
//!
//! Every command returns `lowbit::Result`; an error is printed as one line on stderr and the exit code is 1
//! (2 for command-line usage errors, which clap reports itself).

mod bench;
mod commands;
mod doctor;
mod plot;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "lowbit",
    version,
    about = "Low-bit quantized inference kernels: quantize, convert, inspect, benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Quantize every linear `*.weight` of a checkpoint (round to nearest), by default into AWQ GEMM layout.
    Quantize(commands::QuantizeArgs),
    /// Turn every quantized layer back into an fp16 `*.weight` [out, in].
    Dequantize(commands::DequantizeArgs),
    /// Convert a quantized checkpoint between AWQ, GPTQ (v1/v2), compressed-tensors and int8, code for code.
    Convert(commands::ConvertArgs),
    /// Describe a checkpoint: format, bits, group size, layers, shapes, bytes before and after.
    Inspect(commands::InspectArgs),
    /// Time lowbit's kernels against the dense baseline in the same process.
    Bench(bench::BenchArgs),
    /// Report the CUDA driver, GPU, NVRTC and kernel cache, and compile every kernel.
    Doctor(doctor::DoctorArgs),
    /// Draw bench records (JSON lines) as an SVG of speed-ups over the baseline.
    Plot(plot::PlotArgs),
    /// Quantize a layer, check it against the dense result and time both on the best device present.
    Demo(commands::DemoArgs),
}

/// Exit code of command-line usage errors (clap's convention).
const USAGE_ERROR: u8 = 2;

/// Parses the command line; usage errors become one `lowbit: error: ...` line (help and version print as usual).
fn parse_cli() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e)
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            // clap's rendering spans several lines (message, usage, hint); keep the message lines only.
            let rendered = e.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .take_while(|l| !l.starts_with("Usage:"))
                .filter(|l| !l.is_empty())
                .collect();
            let message = message.join(" ");
            eprintln!(
                "lowbit: error: {} (see lowbit --help)",
                message.trim_start_matches("error: ")
            );
            Err(ExitCode::from(USAGE_ERROR))
        }
    }
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.command {
        Command::Quantize(a) => commands::quantize(a),
        Command::Dequantize(a) => commands::dequantize(a),
        Command::Convert(a) => commands::convert(a),
        Command::Inspect(a) => commands::inspect(a),
        Command::Bench(a) => bench::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Demo(a) => commands::demo(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the CLI contract is that scripts can grep the message.
            eprintln!("lowbit: error: {}", e.to_string().replace('\n', " | "));
            ExitCode::FAILURE
        }
    }
}

/// Where the tool writes: `--force` decides whether an existing output may be replaced.
#[derive(clap::Args, Clone, Debug)]
pub struct OutputArgs {
    /// Output file or directory.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Replace the output if it exists.
    #[arg(long)]
    pub force: bool,
}
