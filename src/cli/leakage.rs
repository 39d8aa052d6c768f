//! `flashcore leakage`: dudect-style fixed-vs-random timing test of a kernel (DESIGN.md §5).
//!
//! Exit codes: 0 no leak found in any class; 1 a leak (max |t| > 4.5) in some class; 2 usage
//! errors, device errors (no GPU included), or too few measurements for any test.

use crate::attention::{AttentionParams, Context, DType, Layout};
use crate::bench::{device, env};
use crate::kernels::LeakyControl;
use crate::leakage::report::{format_table, EnvInfo, LeakageFile, RunInfo};
use crate::leakage::run::MIN_POOL;
use crate::leakage::stats::{Verdict, LEAK_T};
use crate::leakage::{FixedClass, Harness, LeakageConfig};
use std::path::PathBuf;

/// The deliberately leaky control kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlArg {
    /// Every CTA exits at once when the first element of its Q tile is +0.0.
    EarlyExit,
    /// Secret-length mode, skipping the key blocks past the true length (implies --secret-len).
    SkipPastLength,
}

impl ControlArg {
    fn control(self) -> LeakyControl {
        match self {
            ControlArg::EarlyExit => LeakyControl::EarlyExitOnZeroQ,
            ControlArg::SkipPastLength => LeakyControl::SkipPastSecretLength,
        }
    }
    fn name(self) -> &'static str {
        match self {
            ControlArg::EarlyExit => "control:early-exit",
            ControlArg::SkipPastLength => "control:skip-past-length",
        }
    }
}

/// Time a kernel on a fixed input class against random inputs, interleaved at random, and run
/// Welch's t-test on the timings (raw, cropped at 100 percentiles, second order).
#[derive(clap::Args, Debug, Clone)]
pub struct LeakageArgs {
    /// Batch size.
    #[arg(long, default_value_t = 1, value_name = "B")]
    pub batch: usize,
    /// Heads (query and key/value).
    #[arg(long, default_value_t = 8, value_name = "H")]
    pub heads: usize,
    /// Sequence length (queries and keys; the padded length in --secret-len mode).
    #[arg(long, default_value_t = 512, value_name = "S")]
    pub seqlen: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64, value_name = "D")]
    pub headdim: usize,
    /// Element type.
    #[arg(long, default_value = "f16", value_name = "f16|bf16")]
    pub dtype: DType,
    /// Causal mask.
    #[arg(long)]
    pub causal: bool,
    /// Layout of q, k, v, o.
    #[arg(long, default_value = "bshd", value_name = "bshd|bhsd")]
    pub layout: Layout,
    /// Timed launches per class test (fixed and random together).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub measurements: usize,
    /// Stop a class test early after this many seconds of measuring.
    #[arg(long, value_name = "SECONDS")]
    pub budget_s: Option<f64>,
    /// Only this fixed class. Values: zeros, max, denormal, onehot, equal, range (and
    /// one-random, a fixed uniform draw: the harness's own check). With --secret-len: len-0,
    /// len-1, len-half, len-full. Default: each in turn (one-random excluded).
    #[arg(long, value_name = "NAME")]
    pub class: Option<String>,
    /// Secret-length mode: inputs identical, classes differ only in the true lengths (fixed
    /// length vs uniform random in [0, S]).
    #[arg(long)]
    pub secret_len: bool,
    /// Time a deliberately leaky control kernel instead of the shipped one (the test's power
    /// check: it must report a leak).
    #[arg(long, value_enum)]
    pub control: Option<ControlArg>,
    /// Write the results to this JSON file (schema flashcore-leakage, version 1).
    #[arg(long, value_name = "FILE.json")]
    pub json: Option<PathBuf>,
    /// Buffer sets per class (at least 16).
    #[arg(long, default_value_t = MIN_POOL, value_name = "N")]
    pub pool: usize,
    /// Untimed launches before each class test.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub warmup: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub device: usize,
    /// Seed of the random inputs and of the class order.
    #[arg(long, default_value_t = 0x1EA4, value_name = "N")]
    pub seed: u64,
}

/// The configuration and the classes the arguments ask for, or a usage error.
pub fn config(args: &LeakageArgs) -> Result<(LeakageConfig, Vec<FixedClass>), String> {
    let params = AttentionParams::new(args.batch, args.heads, args.seqlen, args.headdim)
        .dtype(args.dtype)
        .layout(args.layout)
        .causal(args.causal);
    let control = args.control.map(ControlArg::control);
    let secret_len = args.secret_len || control == Some(LeakyControl::SkipPastSecretLength);
    let mut cfg = LeakageConfig::new(params);
    cfg.secret_len = secret_len;
    cfg.control = control;
    cfg.measurements = args.measurements;
    cfg.budget_s = args.budget_s;
    cfg.pool = args.pool;
    cfg.warmup = args.warmup;
    cfg.seed = args.seed;
    cfg.validate()?;
    let classes = match &args.class {
        Some(name) => vec![FixedClass::parse(name, secret_len)?],
        None => FixedClass::all(secret_len),
    };
    Ok((cfg, classes))
}

fn env_info(ctx: &Context, device_ordinal: usize) -> EnvInfo {
    let info = device::device_info(ctx).ok();
    let smi = env::query_smi(device_ordinal);
    EnvInfo {
        gpu: Some(ctx.device_name()),
        date: Some(env::now_utc()),
        git_commit: env::git_commit(),
        cuda_driver_version: info.and_then(|i| i.cuda_driver_version),
        driver: smi.as_ref().and_then(|s| s.driver_version.clone()),
        sm_mhz: smi.as_ref().and_then(|s| s.clocks.sm_mhz),
        mem_mhz: smi.as_ref().and_then(|s| s.clocks.mem_mhz),
    }
}

pub fn run(args: LeakageArgs) -> i32 {
    let (cfg, classes) = match config(&args) {
        Ok(c) => c,
        Err(e) => return super::fail(2, e),
    };
    let ctx = match Context::new(args.device) {
        Ok(c) => c,
        Err(e) => {
            return super::fail(
                2,
                format!("flashcore leakage needs a usable GPU (sm_90): {e}"),
            )
        }
    };
    let p = cfg.params.clone();
    let kernel = args.control.map_or("shipped", ControlArg::name);
    let run_info = RunInfo {
        batch: p.batch,
        heads: p.heads_q,
        seqlen: p.seqlen_q,
        head_dim: p.head_dim,
        dtype: p.dtype.name().into(),
        layout: p.layout.name().into(),
        causal: p.causal,
        secret_len: cfg.secret_len,
        kernel: kernel.into(),
        measurements_requested: cfg.measurements,
        budget_s: cfg.budget_s,
        pool: cfg.pool,
        seed: cfg.seed,
    };
    let mut harness = match Harness::new(&ctx, cfg) {
        Ok(h) => h,
        Err(e) => return super::fail(2, e),
    };
    let env = env_info(&ctx, args.device);
    let title = format!(
        "flashcore leakage: {kernel} kernel, {} {},{},{},{} {}{}{} on {}",
        p.dtype.name(),
        p.batch,
        p.heads_q,
        p.seqlen_q,
        p.head_dim,
        p.layout.name(),
        if p.causal { " causal" } else { "" },
        if run_info.secret_len {
            " secret-length"
        } else {
            ""
        },
        env.gpu.as_deref().unwrap_or("?"),
    );
    eprintln!("{title}");
    let mut results = Vec::with_capacity(classes.len());
    for (i, class) in classes.iter().enumerate() {
        match harness.run_class(*class) {
            Ok(r) => {
                eprintln!(
                    "[{}/{}] {}: n {}{}, max |t| {}, {}",
                    i + 1,
                    classes.len(),
                    r.class,
                    r.measurements,
                    if r.stopped_by_budget { " (budget)" } else { "" },
                    r.analysis
                        .max_abs_t()
                        .map_or("-".into(), |t| format!("{t:.2}")),
                    r.verdict.name()
                );
                results.push(r);
            }
            Err(e) => return super::fail(2, format!("class `{}`: {e}", class.name())),
        }
    }
    println!("{title}");
    print!("{}", format_table(&results));
    if let Some(path) = &args.json {
        if let Err(e) = LeakageFile::new(run_info, env, results.clone()).write(path) {
            return super::fail(2, e);
        }
    }
    let leaks: Vec<&str> = results
        .iter()
        .filter(|r| r.verdict.is_leak())
        .map(|r| r.class.as_str())
        .collect();
    if !leaks.is_empty() {
        println!(
            "LEAK: max |t| > {LEAK_T} for class(es) {} — the timing depends on the secret",
            leaks.join(", ")
        );
        return 1;
    }
    if results.iter().any(|r| r.verdict == Verdict::Inconclusive) {
        return super::fail(
            2,
            "too few measurements in a class for any test (raise --budget-s or --measurements)",
        );
    }
    println!("no leak found: max |t| ≤ {LEAK_T} in every class");
    0
}
