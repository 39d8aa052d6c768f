//! `flashcore bench`: device-event timing, CUDA-graph replay, statistics, reports and plots.
//!
//! * [`stats`]: min/median/mean/p95/p99/max (linear-interpolation percentiles), TFLOPS.
//! * [`timing`]: the per-call and graph-replay loops over a [`timing::Backend`], and the
//!   rotation arithmetic (buffer sets ≥ 2× L2); GPU-free, unit-tested with a fake backend.
//! * [`device`]: the CUDA backend (events, stream capture) and the flashcore `Plan` launcher.
//! * [`backward`]: the launcher of the backward pass (alone, or after the forward).
//! * [`suites`]: the `seed` and `fa3` shape lists. [`varlen`]: the varlen suite.
//! * [`record`]: the JSON schema (docs/bench-json.md). [`env`]: clocks, driver, commit, date.
//! * [`report`]: result tables and the join with other implementations. [`plot`]: the PNG.
//! * [`page`]: docs/performance.md from the records a manifest names.

pub mod backward;
pub mod device;
pub mod env;
pub mod page;
pub mod phases;
pub mod plot;
pub mod record;
pub mod report;
pub mod stats;
pub mod suites;
pub mod timing;
pub mod varlen;

use crate::attention::{AttentionParams, Context};
use crate::error::Result;
use device::{CudaBackend, DeviceInfo, Launcher, PlanLauncher};
use record::{Clocks, Env, Method, Mode, Pass, Record, Shape, Status, FLASHCORE};
use stats::Stats;
use timing::TimingConfig;

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub device: usize,
    pub timing: TimingConfig,
    pub modes: Vec<Mode>,
    /// Suite name recorded in each record (None for ad-hoc shapes).
    pub suite: Option<String>,
    /// Seed of the random inputs.
    pub seed: u64,
    /// At most this fraction of the free device memory goes to buffer sets.
    pub mem_fraction: f64,
    /// The passes timed per shape, in order (default: the forward).
    pub passes: Vec<Pass>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: 0,
            timing: TimingConfig::default(),
            modes: vec![Mode::Event, Mode::Graph],
            suite: None,
            seed: 0x5EED,
            mem_fraction: 0.8,
            passes: vec![Pass::Forward],
        }
    }
}

/// A forward record of `mode` for `p`: measured from `samples` (µs), or skipped with `reason`.
pub fn make_record(
    p: &AttentionParams,
    mode: Mode,
    outcome: std::result::Result<Vec<f64>, String>,
    method: Option<Method>,
    suite: Option<String>,
    env: Env,
) -> Record {
    make_pass_record(p, Pass::Forward, mode, outcome, method, suite, env)
}

/// [`make_record`] for any pass (FLOPs: the forward's times [`Pass::flop_factor`]).
pub fn make_pass_record(
    p: &AttentionParams,
    pass: Pass,
    mode: Mode,
    outcome: std::result::Result<Vec<f64>, String>,
    method: Option<Method>,
    suite: Option<String>,
    env: Env,
) -> Record {
    let flops = p.flops() * pass.flop_factor();
    let (status, skip_reason, time_us) = match outcome {
        Ok(samples) => match Stats::from_samples(&samples) {
            Some(s) => (Status::Ok, None, Some(s)),
            None => (Status::Skipped, Some("no finite samples".to_string()), None),
        },
        Err(reason) => (Status::Skipped, Some(reason), None),
    };
    Record {
        implementation: FLASHCORE.into(),
        suite,
        shape: Shape::of(p),
        dtype: p.dtype,
        mode,
        pass,
        status,
        skip_reason,
        flops,
        tflops: time_us.map(|t| stats::tflops(flops, t.median)),
        time_us,
        method,
        env,
    }
}

/// The environment shared by every record of a run (clocks and date are filled per shape).
pub fn base_env(info: &DeviceInfo, device: usize) -> Env {
    let smi = env::query_smi(device);
    let mut software = std::collections::BTreeMap::new();
    software.insert(
        "flashcore".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    Env {
        gpu: Some(info.name.clone()),
        driver_version: smi.and_then(|s| s.driver_version),
        cuda_driver_version: info.cuda_driver_version,
        clocks_start: None,
        clocks_end: None,
        git_commit: env::git_commit(),
        date: env::now_utc(),
        software,
    }
}

/// Times one shape in every pass and mode of `opts`. Never fails: whatever goes wrong
/// (validation, memory, a launch, capture) becomes a skipped record with the reason.
pub fn run_shape(
    ctx: &Context,
    info: &DeviceInfo,
    p: &AttentionParams,
    opts: &RunOptions,
    env0: &Env,
) -> Vec<Record> {
    opts.passes
        .iter()
        .flat_map(|&pass| run_pass(ctx, info, p, pass, opts, env0))
        .collect()
}

/// The bytes of one buffer set of `pass`: what one call reads, and everything the set holds.
fn pass_set_bytes(p: &AttentionParams, pass: Pass) -> (u64, u64) {
    match pass {
        Pass::Forward => device::set_bytes(p),
        _ => backward::set_bytes(p),
    }
}

/// The launcher of `pass` over `sets` buffer sets.
fn make_launcher(
    ctx: &Context,
    p: &AttentionParams,
    pass: Pass,
    sets: usize,
    seed: u64,
) -> Result<Box<dyn Launcher>> {
    Ok(match pass {
        Pass::Forward => Box::new(PlanLauncher::new(ctx, p, sets, seed)?),
        Pass::Backward => Box::new(backward::BackwardLauncher::new(ctx, p, sets, seed, false)?),
        Pass::ForwardBackward => {
            Box::new(backward::BackwardLauncher::new(ctx, p, sets, seed, true)?)
        }
    })
}

/// Times one shape's `pass` in every mode of `opts` (skipped records with the reason on failure).
fn run_pass(
    ctx: &Context,
    info: &DeviceInfo,
    p: &AttentionParams,
    pass: Pass,
    opts: &RunOptions,
    env0: &Env,
) -> Vec<Record> {
    let mut env = env0.clone();
    env.date = env::now_utc();
    let skip_all = |reason: String, env: &Env| -> Vec<Record> {
        opts.modes
            .iter()
            .map(|&m| {
                make_pass_record(
                    p,
                    pass,
                    m,
                    Err(reason.clone()),
                    None,
                    opts.suite.clone(),
                    env.clone(),
                )
            })
            .collect()
    };
    let planned = match pass {
        Pass::Forward => ctx.plan(p).map(drop),
        _ => ctx.plan(p).and_then(|_| ctx.plan_backward(p)).map(drop),
    };
    if let Err(e) = planned {
        return skip_all(e.to_string(), &env);
    }
    let (input_bytes, set_bytes) = pass_set_bytes(p, pass);
    let free = match device::free_bytes(ctx) {
        Ok(f) => f,
        Err(e) => return skip_all(e.to_string(), &env),
    };
    let budget = (free as f64 * opts.mem_fraction) as u64;
    let sets = timing::sets_needed(info.l2_bytes, input_bytes, set_bytes, budget);
    if sets == 0 {
        return skip_all(
            format!("one buffer set ({set_bytes} bytes) does not fit in {budget} bytes of free device memory"),
            &env,
        );
    }
    let launcher = match make_launcher(ctx, p, pass, sets, opts.seed) {
        Ok(l) => l,
        Err(e) => return skip_all(e.to_string(), &env),
    };
    time_modes(ctx, info, launcher, input_bytes, opts, &mut env)
        .into_iter()
        .map(|(mode, samples, method, env)| {
            make_pass_record(
                p,
                pass,
                mode,
                samples,
                Some(method),
                opts.suite.clone(),
                env,
            )
        })
        .collect()
}

/// One mode's outcome: the mode, the samples (µs) or why none, the method, the environment.
pub(crate) type ModeTiming = (Mode, std::result::Result<Vec<f64>, String>, Method, Env);

/// Times `launcher` (its buffer sets already rotating) in every mode of `opts`: per mode the
/// samples (µs) or the failure, the method, and the environment with the clocks read before
/// and after.
pub(crate) fn time_modes(
    ctx: &Context,
    info: &DeviceInfo,
    launcher: Box<dyn Launcher>,
    input_bytes: u64,
    opts: &RunOptions,
    env: &mut Env,
) -> Vec<ModeTiming> {
    let sets = launcher.sets();
    let mut backend = CudaBackend::new(launcher, ctx.stream().clone());
    env.clocks_start = env::query_smi(opts.device).map(|s| s.clocks);
    let mut out = Vec::new();
    for &mode in &opts.modes {
        let t = &opts.timing;
        let (samples, method) = match mode {
            Mode::Event => (
                timing::time_per_call(&mut backend, t),
                Method {
                    warmup: t.warmup.max(sets),
                    reps: t.reps,
                    graph_calls: None,
                    buffer_sets: sets,
                    input_bytes_per_set: input_bytes,
                    l2_bytes: Some(info.l2_bytes),
                },
            ),
            Mode::Graph => (
                timing::time_graph(&mut backend, t),
                Method {
                    warmup: t.warmup,
                    reps: t.graph_reps,
                    graph_calls: Some(t.graph_calls),
                    buffer_sets: sets,
                    input_bytes_per_set: input_bytes,
                    l2_bytes: Some(info.l2_bytes),
                },
            ),
        };
        out.push((
            mode,
            samples.map_err(|e| e.to_string()),
            method,
            env.clone(),
        ));
    }
    drop(backend);
    let end: Option<Clocks> = env::query_smi(opts.device).map(|s| s.clocks);
    for r in &mut out {
        r.3.clocks_start = env.clocks_start;
        r.3.clocks_end = end;
    }
    out
}

/// Opens device `opts.device` and times every shape; `progress(i, records_of_shape_i)` is called
/// after each. Fails only when the device cannot be opened.
pub fn run_shapes(
    shapes: &[AttentionParams],
    opts: &RunOptions,
    mut progress: impl FnMut(usize, &[Record]),
) -> Result<Vec<Record>> {
    let ctx = Context::new(opts.device)?;
    let info = device::device_info(&ctx)?;
    let env0 = base_env(&info, opts.device);
    let mut all = Vec::new();
    for (i, p) in shapes.iter().enumerate() {
        let recs = run_shape(&ctx, &info, p, opts, &env0);
        progress(i, &recs);
        all.extend(recs);
    }
    Ok(all)
}
