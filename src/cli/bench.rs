//! `flashcore bench`: time flashcore on a suite or an ad-hoc shape, print a table, write JSON,
//! draw a plot, and join our numbers with other implementations' records (PyTorch SDPA from
//! `bench/sdpa.py`). See docs/bench-json.md.
//!
//! Exit codes: 0 ok (some records may be skipped, each with its reason); 1 runtime failure (no
//! GPU, nothing measured, unreadable file); 2 usage errors.

use crate::attention::{AttentionParams, DType, Layout};
use crate::bench::record::{BenchFile, Mode, Pass, Record, Status, FLASHCORE};
use crate::bench::suites::{label, Suite};
use crate::bench::timing::TimingConfig;
use crate::bench::{plot, report, run_shapes, RunOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Which timing modes to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Event,
    Graph,
    Both,
}

impl ModeArg {
    pub fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Event => vec![Mode::Event],
            ModeArg::Graph => vec![Mode::Graph],
            ModeArg::Both => vec![Mode::Event, Mode::Graph],
        }
    }
}

/// Time flashcore on a suite or an ad-hoc shape.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// A named suite: seed (16 shapes), fa3 (FlashAttention-3 paper sweep, 72 shapes), decode,
    /// backward (the training shapes, bf16), or varlen (packed batches of mixed lengths
    /// beside the dense call at the same tokens; bench/varlen.py's cases).
    #[arg(long, value_enum)]
    pub suite: Option<Suite>,
    /// Ad-hoc shape: batch size.
    #[arg(long, value_name = "B")]
    pub batch: Option<usize>,
    /// Ad-hoc shape: query heads.
    #[arg(long, value_name = "H")]
    pub heads: Option<usize>,
    /// Ad-hoc shape: key/value heads (default: --heads).
    #[arg(long, value_name = "H")]
    pub heads_kv: Option<usize>,
    /// Ad-hoc shape: query sequence length.
    #[arg(long, value_name = "S")]
    pub seqlen: Option<usize>,
    /// Ad-hoc shape: key sequence length (default: --seqlen).
    #[arg(long, value_name = "S")]
    pub seqlen_k: Option<usize>,
    /// Ad-hoc shape: head dimension (with --suite: keep only this head dim's shapes).
    #[arg(long, value_name = "D")]
    pub headdim: Option<usize>,
    /// Element type (ad-hoc: default f16; suites: keep only this dtype's shapes).
    #[arg(long, value_name = "f16|bf16")]
    pub dtype: Option<DType>,
    /// Ad-hoc shape: causal mask.
    #[arg(long)]
    pub causal: bool,
    /// Ad-hoc shape: sliding window `LEFT,RIGHT` (flash-attn's window_size, −1 unbounded).
    /// FLOPs and TFLOPS are still counted for the whole (or causal) score matrix: compare times.
    #[arg(long, value_name = "LEFT,RIGHT", value_parser = super::attn_args::parse_window, allow_hyphen_values = true)]
    pub window: Option<crate::attention::Window>,
    /// Layout of q, k, v, o.
    #[arg(long, default_value = "bshd", value_name = "bshd|bhsd")]
    pub layout: Layout,
    /// Timed calls per shape in per-call (event) mode.
    #[arg(long, default_value_t = TimingConfig::default().reps, value_name = "N")]
    pub reps: usize,
    /// Untimed calls before timing (event mode makes at least one per buffer set).
    #[arg(long, default_value_t = TimingConfig::default().warmup, value_name = "N")]
    pub warmup: usize,
    /// Launches captured per CUDA graph in graph mode.
    #[arg(long, default_value_t = TimingConfig::default().graph_calls, value_name = "N")]
    pub graph_calls: usize,
    /// Timed graph replays per shape in graph mode.
    #[arg(long, default_value_t = TimingConfig::default().graph_reps, value_name = "N")]
    pub graph_reps: usize,
    /// Timing mode: per-call device events, CUDA-graph replay, or both.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Write the records to this JSON file (schema: docs/bench-json.md).
    #[arg(long, value_name = "FILE.json")]
    pub json: Option<PathBuf>,
    /// Draw TFLOPS vs sequence length (ours and --compare records) to this PNG.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Timing mode the plot shows (default: graph when present, else event).
    #[arg(long, value_enum, value_name = "event|graph")]
    pub plot_mode: Option<PlotMode>,
    /// Other implementations' records (same schema, e.g. from bench/sdpa.py): print the joined
    /// table (our median, each one's median, ours/best) and draw them on --plot. Repeatable.
    #[arg(long, value_name = "FILE.json")]
    pub compare: Vec<PathBuf>,
    /// Read our records from this file instead of running (no GPU needed). Repeatable.
    #[arg(long, value_name = "FILE.json")]
    pub from_json: Vec<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub device: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0x5EED, value_name = "N")]
    pub seed: u64,
    /// Time the backward pass (dQ, dK, dV from the forward's O and LSE and a random dO) and a
    /// forward then backward, instead of the forward. FLOPs as flash-attn counts them: 2.5× and
    /// 3.5× the forward's.
    #[arg(long)]
    pub backward: bool,
    /// Instead of timing: where each shape's launch spends its SM cycles (the cycle-timer build
    /// of the same kernel, per-CTA phase marks, on rotating random inputs; N launches).
    #[arg(long, value_name = "N")]
    pub phases: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlotMode {
    Event,
    Graph,
}

/// The shapes the arguments ask for, or a usage error.
pub fn shapes(args: &BenchArgs) -> Result<Vec<AttentionParams>, String> {
    let adhoc = args.batch.is_some()
        || args.heads.is_some()
        || args.heads_kv.is_some()
        || args.seqlen.is_some()
        || args.seqlen_k.is_some()
        || (args.headdim.is_some() && args.suite.is_none())
        || args.causal
        || args.window.is_some();
    match (args.suite, adhoc) {
        (Some(_), true) => Err(
            "give either --suite or an ad-hoc shape (--heads, --seqlen, --headdim, …), not both"
                .into(),
        ),
        (Some(suite), false) => {
            let out: Vec<AttentionParams> = suite
                .shapes(args.layout)
                .into_iter()
                .filter(|p| args.dtype.is_none_or(|d| d == p.dtype))
                .filter(|p| args.headdim.is_none_or(|d| d == p.head_dim))
                .collect();
            if out.is_empty() {
                return Err("the suite has no shapes of that dtype and head dim".into());
            }
            Ok(out)
        }
        (None, true) => {
            let (Some(h), Some(s), Some(d)) = (args.heads, args.seqlen, args.headdim) else {
                return Err(
                    "an ad-hoc shape needs --heads, --seqlen and --headdim (--batch defaults to 1)"
                        .into(),
                );
            };
            let mut p = AttentionParams::new(args.batch.unwrap_or(1), h, s, d)
                .seqlen_k(args.seqlen_k.unwrap_or(s))
                .dtype(args.dtype.unwrap_or(DType::F16))
                .layout(args.layout)
                .causal(args.causal)
                .window(args.window.unwrap_or_default());
            p.heads_kv = args.heads_kv.unwrap_or(h);
            Ok(vec![p])
        }
        (None, false) => Err("nothing to do: give --suite, an ad-hoc shape, or --from-json".into()),
    }
}

/// `--phases N`: the phase breakdown of each shape's kernel (src/bench/phases.rs).
fn run_phases(shapes: &[AttentionParams], device: usize, launches: usize) -> i32 {
    if launches == 0 {
        return super::fail(2, "--phases needs at least one launch");
    }
    let ctx = match crate::attention::Context::new(device) {
        Ok(c) => c,
        Err(e) => return super::fail(1, e),
    };
    let l2 = match crate::bench::device::device_info(&ctx) {
        Ok(info) => info.l2_bytes,
        Err(e) => return super::fail(1, e),
    };
    for p in shapes {
        // Enough input sets that each launch reads from memory, not from L2 (as the bench does),
        // within half the free device memory.
        let (input_bytes, set_bytes) = crate::bench::device::set_bytes(p);
        let free = match crate::bench::device::free_bytes(&ctx) {
            Ok(f) => f,
            Err(e) => return super::fail(1, e),
        };
        let sets = crate::bench::timing::sets_needed(l2, input_bytes, set_bytes, free / 2);
        if sets == 0 {
            return super::fail(
                1,
                format!("one buffer set ({set_bytes} bytes) does not fit in device memory"),
            );
        }
        match crate::bench::phases::measure(&ctx, p, launches, sets) {
            Ok(r) => println!(
                "{} {}\n{}",
                p.dtype.name(),
                label(p),
                crate::bench::phases::render(&r)
            ),
            Err(e) => return super::fail(1, e),
        }
    }
    0
}

/// "" for the forward, "/bwd" or "/f+b" otherwise (progress lines).
fn pass_tag(pass: Pass) -> String {
    match pass.tag() {
        "" => String::new(),
        tag => format!("/{tag}"),
    }
}

/// `--suite varlen`: the varlen cases (filtered by --headdim), timed, tabulated, written to --json.
fn run_varlen(args: &BenchArgs, timing: TimingConfig) -> i32 {
    use crate::bench::varlen;
    if args.backward || args.phases.is_some() || !args.compare.is_empty() || args.plot.is_some() {
        return super::fail(
            2,
            "--suite varlen times the forward only, with no --backward, --phases, --compare or --plot",
        );
    }
    if args.layout != Layout::Bshd {
        return super::fail(2, "--suite varlen runs packed (bshd) tensors only");
    }
    let cases: Vec<varlen::Case> = varlen::cases(args.seed)
        .into_iter()
        .filter(|c| args.headdim.is_none_or(|d| d == c.head_dim))
        .collect();
    let opts = RunOptions {
        device: args.device,
        timing,
        modes: args.mode.modes(),
        suite: Some("varlen".into()),
        seed: args.seed,
        ..RunOptions::default()
    };
    let n = cases.len();
    let result = varlen::run(&cases, &opts, |i, recs| {
        let c = &cases[i];
        let summary: Vec<String> = recs
            .iter()
            .map(|r| match (r.status, r.time_us) {
                (Status::Ok, Some(t)) => {
                    format!("{} {} {:.1} us", r.implementation, r.mode.name(), t.median)
                }
                _ => format!("{} {} skipped", r.implementation, r.mode.name()),
            })
            .collect();
        eprintln!(
            "[{}/{n}] {} {} B{} d{}{}: {}",
            i + 1,
            c.mix,
            c.tokens,
            c.lens.len(),
            c.head_dim,
            if c.causal { " causal" } else { "" },
            summary.join(", ")
        );
    });
    let recs = match result {
        Ok(r) => r,
        Err(e) => return super::fail(1, e),
    };
    if let Some(path) = &args.json {
        if let Err(e) = BenchFile::new(recs.clone()).write(path) {
            return super::fail(1, e);
        }
    }
    print!("{}", varlen::format(&cases, &recs));
    if recs.iter().any(Record::is_ok) {
        0
    } else {
        super::fail(1, "nothing was measured")
    }
}

pub fn run(args: BenchArgs) -> i32 {
    let timing = TimingConfig {
        warmup: args.warmup,
        reps: args.reps,
        graph_calls: args.graph_calls,
        graph_reps: args.graph_reps,
        ..TimingConfig::default()
    };
    if let Err(e) = timing.validate() {
        return super::fail(2, e);
    }
    // Our records: loaded, or measured.
    let mut ours: Vec<Record> = Vec::new();
    if !args.from_json.is_empty() {
        if args.suite.is_some() || args.heads.is_some() || args.seqlen.is_some() {
            return super::fail(
                2,
                "--from-json reads records instead of running: drop the shape flags",
            );
        }
        for f in &args.from_json {
            match BenchFile::read(f) {
                Ok(b) => ours.extend(b.records),
                Err(e) => return super::fail(1, e),
            }
        }
    } else {
        let shapes = match shapes(&args) {
            Ok(s) => s,
            Err(e) => return super::fail(2, e),
        };
        if args.suite == Some(Suite::Varlen) {
            return run_varlen(&args, timing);
        }
        if shapes.is_empty() {
            return super::fail(2, "the suite has no shapes of that dtype");
        }
        if let Some(n) = args.phases {
            if args.backward {
                return super::fail(
                    2,
                    "--phases breaks down the forward kernel: drop --backward",
                );
            }
            return run_phases(&shapes, args.device, n);
        }
        let opts = RunOptions {
            device: args.device,
            timing,
            modes: args.mode.modes(),
            suite: args.suite.map(|s| s.name().to_string()),
            seed: args.seed,
            passes: if args.backward {
                vec![Pass::Backward, Pass::ForwardBackward]
            } else {
                vec![Pass::Forward]
            },
            ..RunOptions::default()
        };
        let tty = std::io::stdout().is_terminal();
        let bar = indicatif::ProgressBar::new(shapes.len() as u64);
        if tty {
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        } else {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let n = shapes.len();
        let result = run_shapes(&shapes, &opts, |i, recs| {
            let summary: Vec<String> = recs
                .iter()
                .map(|r| match (r.status, r.time_us) {
                    (Status::Ok, Some(t)) => {
                        format!("{}{} {:.2} us", r.mode.name(), pass_tag(r.pass), t.median)
                    }
                    _ => format!("{}{} skipped", r.mode.name(), pass_tag(r.pass)),
                })
                .collect();
            let line = format!(
                "[{}/{n}] {} {}: {}",
                i + 1,
                shapes[i].dtype.name(),
                label(&shapes[i]),
                summary.join(", ")
            );
            if tty {
                bar.set_message(line);
                bar.inc(1);
            } else {
                eprintln!("{line}");
            }
        });
        bar.finish_and_clear();
        ours = match result {
            Ok(r) => r,
            Err(e) => return super::fail(1, e),
        };
        if let Some(path) = &args.json {
            if let Err(e) = BenchFile::new(ours.clone()).write(path) {
                return super::fail(1, e);
            }
        }
    }
    print!("{}", report::format_results(&ours));
    let skipped = ours.iter().filter(|r| !r.is_ok()).count();
    if skipped > 0 {
        eprintln!("flashcore bench: {skipped} record(s) skipped (reasons in the table)");
    }

    let mut others: Vec<Record> = Vec::new();
    for f in &args.compare {
        match BenchFile::read(f) {
            Ok(b) => others.extend(b.records),
            Err(e) => return super::fail(1, e),
        }
    }
    let mut all = ours.clone();
    all.extend(others.iter().cloned());
    if !others.is_empty() {
        println!();
        print!("{}", report::format_join(&report::join(&all, FLASHCORE)));
    }
    if let Some(path) = &args.plot {
        let mode = args.plot_mode.map(|m| match m {
            PlotMode::Event => Mode::Event,
            PlotMode::Graph => Mode::Graph,
        });
        if let Err(e) = plot::render(&all, path, mode) {
            return super::fail(1, e);
        }
        eprintln!("flashcore bench: plot written to {}", path.display());
    }
    if ours.iter().any(Record::is_ok) || (!args.from_json.is_empty() && !all.is_empty()) {
        0
    } else {
        super::fail(1, "nothing was measured")
    }
}
