//! The `flashcore` command line: attn, bench, audit, leakage, perf-page.

use clap::{Parser, Subcommand};
use flashcore::cli;

#[derive(Parser)]
#[command(
    name = "flashcore",
    version,
    about = "Data-oblivious fused attention for NVIDIA Hopper (sm_90a)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run attention on q, k, v from a safetensors file and write the output to another.
    Attn(cli::attn::AttnArgs),
    /// Time flashcore (and read PyTorch SDPA records) on suites of shapes.
    Bench(cli::bench::BenchArgs),
    /// Prove on the SASS that no kernel's control flow or addresses depend on secret data.
    Audit(cli::audit::AuditArgs),
    /// dudect-style timing-leakage test of the shipped kernels.
    Leakage(cli::leakage::LeakageArgs),
    /// Write the performance page (docs/performance.md) from the benchmark records.
    PerfPage(cli::perf_page::PerfPageArgs),
}

fn main() {
    let args = Cli::parse();
    let code = match args.command {
        Command::Attn(a) => cli::attn::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Audit(a) => cli::audit::run(a),
        Command::Leakage(a) => cli::leakage::run(a),
        Command::PerfPage(a) => cli::perf_page::run(a),
    };
    std::process::exit(code);
}
