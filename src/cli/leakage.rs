//! `flashcore leakage`: dudect-style fixed-vs-random timing test of a kernel (docs/design.md §5).
//!
//! Each class is measured four ways: the kernel's time (queued behind a device-side
//! wait), the SM cycles of its cycle-timer build, and the time and the SM cycles of the
//! hardware-floor build (value mode, shipped kernel only). The verdict per class
//! ([`crate::leakage::verdict`]): leak in cycles (fail), cycles within the floor's (pass), time
//! only within the floor (pass), above the floor (fail), unattributed (fail), no leak (pass).
//!
//! Decode mode (`--decode --secret-len`, [`crate::leakage::decode`]): the KV-cache
//! decode call with secret key counts (or, `--public-counts`, public ones: the comparison that
//! must fail), timed without the cycle timer and the floor, which do not apply to it.
//!
//! Exit codes: 0 every class passes; 1 some class fails; 2 usage errors, device errors (no GPU
//! included), or too few measurements for any test.

use crate::attention::{AttentionParams, Context, DType, Layout};
use crate::bench::{device, env};
use crate::kernels::LeakyControl;
use crate::leakage::report::{
    format_cycles_table, format_floor_cycles_table, format_floor_table, format_table,
    format_verdict_table, summary_line, DecodeRun, EnvInfo, LeakageFile, RunInfo,
};
use crate::leakage::run::{DEFAULT_QUEUE_NS, MIN_POOL};
use crate::leakage::verdict::Attribution;
use crate::leakage::{DecodeConfig, FixedClass, Harness, LeakageConfig, LengthClass};
use std::path::PathBuf;

/// The deliberately leaky control kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlArg {
    /// Every CTA exits at once when the first element of its Q tile is +0.0.
    EarlyExit,
    /// Secret-length mode, skipping the key blocks past the true length (implies --secret-len).
    SkipPastLength,
    /// The hardware floor: data-oblivious by construction (the softmax sees a public pattern),
    /// the shipped TMA loads and GEMMs over the same inputs. What it shows is the machine's.
    Floor,
}

impl ControlArg {
    fn control(self) -> Option<LeakyControl> {
        match self {
            ControlArg::EarlyExit => Some(LeakyControl::EarlyExitOnZeroQ),
            ControlArg::SkipPastLength => Some(LeakyControl::SkipPastSecretLength),
            ControlArg::Floor => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            ControlArg::EarlyExit => "control:early-exit",
            ControlArg::SkipPastLength => "control:skip-past-length",
            ControlArg::Floor => "control:floor",
        }
    }
}

/// The order of a paged cache's block table (decode mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PageOrder {
    /// Sequence b's pages are b·P … b·P + P − 1 of the pool, in order.
    Identity,
    /// A fixed random permutation of the pool (drawn from --seed), the same for every launch.
    Shuffled,
}

/// Time a kernel on a fixed input class against random inputs, interleaved at random, and run
/// Welch's t-test on the timings (raw, cropped at 100 percentiles, second order).
#[derive(clap::Args, Debug, Clone)]
pub struct LeakageArgs {
    /// Batch size.
    #[arg(long, default_value_t = 1, value_name = "B")]
    pub batch: usize,
    /// Heads (query heads; key/value heads too, unless --kv-heads).
    #[arg(long, default_value_t = 8, value_name = "H")]
    pub heads: usize,
    /// Sequence length (queries and keys; the padded length in --secret-len mode; the cache's
    /// capacity with --decode).
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
    /// Decode mode (needs --secret-len): the KV-cache decode call — --seqlen-q new queries per
    /// sequence over a cache of capacity --seqlen, the split-KV kernel and its combine timed
    /// together — with each sequence's key count as the secret: a fixed count (len-0, len-1,
    /// len-half, len-full) against counts uniform in [0, S]. No cycle timer and no floor (they
    /// do not apply to the decode call): a time difference fails.
    #[arg(long)]
    pub decode: bool,
    /// Decode mode: new query positions per sequence (1 to 16).
    #[arg(long, value_name = "N")]
    pub seqlen_q: Option<usize>,
    /// Decode mode: key/value heads (a divisor of --heads; default --heads).
    #[arg(long, value_name = "H")]
    pub kv_heads: Option<usize>,
    /// Decode mode: give the kernel the counts as public metadata (its walk ends at each count)
    /// — a deliberately leaky comparison, which the test must fail.
    #[arg(long)]
    pub public_counts: bool,
    /// Decode mode: a paged cache of pages of N rows (any N ≥ 1 dividing --seqlen; powers of two
    /// ≥ 16 load as TMA boxes, other sizes are gathered row by row);
    /// K and V are pools of batch · S / N pages read through a block table (public, fixed).
    #[arg(long, value_name = "N")]
    pub page_size: Option<usize>,
    /// Decode mode with --page-size: the block table's order (default shuffled).
    #[arg(long, value_enum, value_name = "ORDER")]
    pub page_order: Option<PageOrder>,
    /// Time a control kernel instead of the shipped one: a deliberately leaky one (the test's
    /// power check: it must report a leak) or the hardware floor.
    #[arg(long, value_enum)]
    pub control: Option<ControlArg>,
    /// Skip the cycle-timer build (the SM cycles per CTA; the verdict then cannot clear a time
    /// difference).
    #[arg(long)]
    pub no_cycles: bool,
    /// Skip the hardware-floor comparison, its timing and its cycles (the verdict then cannot
    /// clear a difference). There is no floor for a control or with --secret-len: there the
    /// floor build masks by the secret length like the shipped kernel, so it carries the secret.
    #[arg(long)]
    pub no_floor: bool,
    /// Queue each timed launch behind a device-side wait of this many microseconds, so the
    /// event interval holds the kernel alone (0: no wait, launch latency inside the interval).
    #[arg(long, default_value_t = DEFAULT_QUEUE_NS as f64 / 1000.0, value_name = "US")]
    pub queue_us: f64,
    /// Write the results to this JSON file (schema flashcore-leakage, version 4: version 2 plus
    /// the floor's cycle-timer build, `floor.cycles`, and the verdict `cycles_within_floor`
    /// (version 3), plus `run.decode` in decode mode).
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
    let mut params = AttentionParams::new(args.batch, args.heads, args.seqlen, args.headdim)
        .dtype(args.dtype)
        .layout(args.layout)
        .causal(args.causal);
    let decode = decode_config(args)?;
    if decode.is_some() {
        params.seqlen_q = args.seqlen_q.unwrap_or(1);
        params.heads_kv = args.kv_heads.unwrap_or(args.heads);
    }
    let control = args.control.and_then(ControlArg::control);
    let secret_len = args.secret_len || control == Some(LeakyControl::SkipPastSecretLength);
    if !(args.queue_us.is_finite() && args.queue_us >= 0.0) {
        return Err(format!(
            "--queue-us must be a number of microseconds ≥ 0 (got {})",
            args.queue_us
        ));
    }
    let mut cfg = LeakageConfig::new(params);
    cfg.secret_len = secret_len;
    cfg.decode = decode;
    cfg.control = control;
    cfg.floor_kernel = args.control == Some(ControlArg::Floor);
    // The floor comparison is for the shipped kernel in value mode (in secret-length mode the
    // floor build masks by the secret length too); the early-exit control's CTAs leave before
    // their cycle record; decode mode has neither (crate::leakage::decode).
    cfg.floor = !args.no_floor && args.control.is_none() && !secret_len && decode.is_none();
    cfg.cycles = !args.no_cycles && args.control != Some(ControlArg::EarlyExit) && decode.is_none();
    cfg.queue_ns = (args.queue_us * 1000.0).round() as u64;
    cfg.measurements = args.measurements;
    cfg.budget_s = args.budget_s;
    cfg.pool = args.pool;
    cfg.warmup = args.warmup;
    cfg.seed = args.seed;
    cfg.validate()?;
    let classes = match &args.class {
        Some(name) if decode.is_some() => vec![LengthClass::from_name(name)
            .map(FixedClass::Length)
            .ok_or_else(|| {
                let names: Vec<&str> = LengthClass::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "unknown class `{name}` in decode mode (the key counts are the secret); \
                     expected one of: {}",
                    names.join(", ")
                )
            })?],
        Some(name) => vec![FixedClass::parse(name, secret_len)?],
        None => FixedClass::all(secret_len),
    };
    Ok((cfg, classes))
}

/// Decode mode's configuration from the arguments (`None` without --decode), or the usage
/// error of a decode-only flag given without it.
fn decode_config(args: &LeakageArgs) -> Result<Option<DecodeConfig>, String> {
    if !args.decode {
        for (given, flag) in [
            (args.seqlen_q.is_some(), "--seqlen-q"),
            (args.kv_heads.is_some(), "--kv-heads"),
            (args.public_counts, "--public-counts"),
            (args.page_size.is_some(), "--page-size"),
            (args.page_order.is_some(), "--page-order"),
        ] {
            if given {
                return Err(format!(
                    "{flag} belongs to decode mode: add --decode --secret-len"
                ));
            }
        }
        return Ok(None);
    }
    if args.page_order.is_some() && args.page_size.is_none() {
        return Err("--page-order orders a paged cache's block table: add --page-size N".into());
    }
    Ok(Some(DecodeConfig {
        secret_counts: !args.public_counts,
        page_size: args.page_size,
        shuffled_pages: args.page_size.is_some()
            && args.page_order.unwrap_or(PageOrder::Shuffled) == PageOrder::Shuffled,
    }))
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
        queue_us: cfg.queue_ns as f64 / 1000.0,
        cycles: cfg.cycles,
        floor: cfg.floor,
        floor_cycles: cfg.floor && cfg.cycles,
        decode: cfg.decode.map(|config| DecodeRun {
            seqlen_q: p.seqlen_q,
            heads_kv: p.heads_kv,
            config,
        }),
    };
    let mut harness = match Harness::new(&ctx, cfg) {
        Ok(h) => h,
        Err(e) => return super::fail(2, e),
    };
    let env = env_info(&ctx, args.device);
    let title = match &run_info.decode {
        Some(d) => format!(
            "flashcore leakage: {kernel} kernel, {} decode: batch {}, heads {}/{}, {} new \
             quer{} over a cache of {}, head dim {}, {}{}, {}; on {}",
            p.dtype.name(),
            p.batch,
            p.heads_q,
            p.heads_kv,
            p.seqlen_q,
            if p.seqlen_q == 1 { "y" } else { "ies" },
            p.seqlen_k,
            p.head_dim,
            p.layout.name(),
            if p.causal { " causal" } else { "" },
            d.config.describe(),
            env.gpu.as_deref().unwrap_or("?"),
        ),
        None => format!(
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
        ),
    };
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
    if run_info.queue_us > 0.0 {
        println!(
            "time: device events around each launch, queued behind a {} µs device-side wait",
            run_info.queue_us
        );
    } else {
        println!("time: device events around each launch (no queued wait)");
    }
    print!("{}", format_table(&results));
    if results.iter().any(|r| r.cycles.is_some()) {
        println!("\ncycles: the cycle-timer build of the same kernel (SM cycles per CTA, mean over the launch's CTAs)");
        print!("{}", format_cycles_table(&results));
    }
    if results.iter().any(|r| r.floor.is_some()) {
        println!("\nfloor: the hardware-floor build (shipped loads and GEMMs, no secret in the softmax), timed the same way");
        print!("{}", format_floor_table(&results));
    }
    if results
        .iter()
        .any(|r| r.floor.as_ref().is_some_and(|f| f.cycles.is_some()))
    {
        println!("\nfloor cycles: the floor's cycle-timer build (SM cycles per CTA), the same way");
        print!("{}", format_floor_cycles_table(&results));
    }
    match &run_info.decode {
        Some(d) => {
            println!("\ndecode: the whole call (split-KV kernel and combine) between the events; no cycle timer and no floor for it, so a time difference fails unattributed");
            if !d.config.secret_counts {
                println!("public counts: the kernel's walk ends at each count, so the counts show in its time: this comparison must fail (the test's power check)");
            }
        }
        None if run_info.secret_len && args.control.is_none() && !args.no_floor => {
            println!("\nfloor: none in secret-length mode (the floor build masks by the secret length like the shipped kernel, so it carries the secret and cannot clear a difference)");
        }
        None => {}
    }
    println!("\nverdict");
    print!("{}", format_verdict_table(&results));
    if let Some(path) = &args.json {
        if let Err(e) = LeakageFile::new(run_info, env, results.clone()).write(path) {
            return super::fail(2, e);
        }
    }
    for a in [
        Attribution::CycleLeak,
        Attribution::AboveFloor,
        Attribution::Unattributed,
        Attribution::CyclesWithinFloor,
        Attribution::WithinFloor,
    ] {
        if let Some(line) = summary_line(&results, a) {
            println!("{line}");
        }
    }
    if results
        .iter()
        .any(|r| !r.attribution.passes() && r.attribution != Attribution::Inconclusive)
    {
        return 1;
    }
    if results
        .iter()
        .any(|r| r.attribution == Attribution::Inconclusive)
    {
        return super::fail(
            2,
            "too few measurements in a class for any test (raise --budget-s or --measurements)",
        );
    }
    println!("pass: every class passes");
    0
}
