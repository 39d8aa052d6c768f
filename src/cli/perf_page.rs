//! `flashcore perf-page`: writes docs/performance.md from the benchmark records a manifest names
//! (no GPU needed). Exit codes: 0 ok, 1 an unreadable manifest or record file.

use crate::bench::page;
use std::path::PathBuf;

/// Generate the performance page from benchmark records.
#[derive(clap::Args, Debug, Clone)]
pub struct PerfPageArgs {
    /// The manifest naming each suite's record files (paths relative to its folder).
    #[arg(
        long,
        default_value = "bench/results/current.json",
        value_name = "FILE.json"
    )]
    pub manifest: PathBuf,
    /// Write the page here instead of to stdout.
    #[arg(long, value_name = "FILE.md")]
    pub out: Option<PathBuf>,
}

pub fn run(args: PerfPageArgs) -> i32 {
    let text = match page::render_from(&args.manifest) {
        Ok(t) => t,
        Err(e) => return super::fail(1, e),
    };
    match args.out {
        Some(path) => match crate::output::write_atomic(&path, text.as_bytes()) {
            Ok(()) => 0,
            Err(e) => super::fail(1, e),
        },
        None => {
            print!("{text}");
            0
        }
    }
}
