//! The timing loops, written against [`Backend`] so that they run (and are unit-tested) without
//! a GPU. `device.rs` implements `Backend` with CUDA events and graphs around a flashcore `Plan`.
//!
//! * **Per-call** ([`time_per_call`]): after the warm-up, each call is bracketed by its own pair
//!   of device events; calls are enqueued in chunks of [`TimingConfig::chunk`] and the stream is
//!   synchronised once per chunk. A sample is the time between the two events of one call.
//! * **Graph replay** ([`time_graph`]): `graph_calls` launches are captured into one graph; there
//!   are enough graphs ([`graph_schedules`]) that together they touch every buffer set. A sample
//!   is one replay timed by events, divided by `graph_calls`.
//!
//! Calls rotate over the buffer sets (set `i mod sets` for the i-th call) so that what one call
//! reads is not in L2 from the call before ([`sets_needed`]).

use crate::error::{Error, Result};

/// What the timing loops need from a device.
pub trait Backend {
    /// Number of buffer sets the launches rotate over (at least 1).
    fn sets(&self) -> usize;
    /// Enqueues one call reading buffer set `set`.
    fn launch(&mut self, set: usize) -> Result<()>;
    /// Enqueues a timestamp into marker slot `slot` (a device event record).
    fn mark(&mut self, slot: usize) -> Result<()>;
    /// Blocks until everything enqueued so far has finished.
    fn sync(&mut self) -> Result<()>;
    /// Milliseconds between the marks last recorded in `start` and `end` (after [`sync`]).
    ///
    /// [`sync`]: Backend::sync
    fn elapsed_ms(&mut self, start: usize, end: usize) -> Result<f64>;
    /// Captures one launch per entry of `sets`, in order, into a new graph; returns its index.
    fn capture(&mut self, sets: &[usize]) -> Result<usize>;
    /// Enqueues one replay of graph `graph`.
    fn replay(&mut self, graph: usize) -> Result<()>;
}

/// How much to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimingConfig {
    /// Untimed calls before the timed ones (per-call mode: at least one per buffer set is made
    /// regardless; graph mode: `ceil(warmup / graph_calls)` replays after one of every graph).
    pub warmup: usize,
    /// Per-call samples.
    pub reps: usize,
    /// Launches captured in one graph.
    pub graph_calls: usize,
    /// Graph-replay samples.
    pub graph_reps: usize,
    /// Calls (or replays) enqueued between two synchronisations.
    pub chunk: usize,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            warmup: 20,
            reps: 200,
            graph_calls: 20,
            graph_reps: 50,
            chunk: 64,
        }
    }
}

impl TimingConfig {
    pub fn validate(&self) -> Result<()> {
        let check = |arg: &'static str, v: usize| {
            if v == 0 {
                Err(Error::InvalidArgument {
                    arg,
                    rule: "must be at least 1".into(),
                })
            } else {
                Ok(())
            }
        };
        check("reps", self.reps)?;
        check("graph-calls", self.graph_calls)?;
        check("graph-reps", self.graph_reps)?;
        check("chunk", self.chunk)
    }
}

/// Number of buffer sets to rotate over: enough that the inputs of all sets together are at
/// least twice the L2 size (`2 · l2_bytes / input_bytes`, rounded up), never fewer than 2, and
/// no more than fit in `max_total_bytes` (counting `set_bytes`, inputs and outputs, per set).
/// Returns 0 when not even one set fits.
pub fn sets_needed(l2_bytes: u64, input_bytes: u64, set_bytes: u64, max_total_bytes: u64) -> usize {
    let want = if input_bytes == 0 {
        2
    } else {
        (2 * l2_bytes).div_ceil(input_bytes).max(2)
    };
    let fit = max_total_bytes.checked_div(set_bytes).unwrap_or(u64::MAX);
    want.min(fit).min(usize::MAX as u64) as usize
}

/// The buffer sets each captured graph launches on: graph `g` makes calls on sets
/// `(g · calls + i) mod sets` for `i < calls`, and there are `ceil(sets / calls)` graphs, so that
/// replaying them round-robin touches every set.
pub fn graph_schedules(sets: usize, calls: usize) -> Vec<Vec<usize>> {
    let sets = sets.max(1);
    let calls = calls.max(1);
    (0..sets.div_ceil(calls))
        .map(|g| (0..calls).map(|i| (g * calls + i) % sets).collect())
        .collect()
}

/// Per-call samples in microseconds (`cfg.reps` of them).
pub fn time_per_call<B: Backend>(b: &mut B, cfg: &TimingConfig) -> Result<Vec<f64>> {
    cfg.validate()?;
    let sets = b.sets().max(1);
    let mut next = 0usize;
    // Warm-up: every set at least once (first touch, parameter blocks), then the rest.
    for _ in 0..cfg.warmup.max(sets) {
        b.launch(next % sets)?;
        next += 1;
    }
    b.sync()?;
    let mut out = Vec::with_capacity(cfg.reps);
    while out.len() < cfg.reps {
        let n = cfg.chunk.min(cfg.reps - out.len());
        for i in 0..n {
            b.mark(2 * i)?;
            b.launch(next % sets)?;
            b.mark(2 * i + 1)?;
            next += 1;
        }
        b.sync()?;
        for i in 0..n {
            out.push(b.elapsed_ms(2 * i, 2 * i + 1)? * 1e3);
        }
    }
    Ok(out)
}

/// Graph-replay samples in microseconds per call (`cfg.graph_reps` of them).
pub fn time_graph<B: Backend>(b: &mut B, cfg: &TimingConfig) -> Result<Vec<f64>> {
    cfg.validate()?;
    let schedules = graph_schedules(b.sets(), cfg.graph_calls);
    let mut graphs = Vec::with_capacity(schedules.len());
    for s in &schedules {
        graphs.push(b.capture(s)?);
    }
    // Warm-up: each graph once, then enough replays to cover `warmup` calls.
    for &g in &graphs {
        b.replay(g)?;
    }
    let mut next = 0usize;
    for _ in 0..cfg.warmup.div_ceil(cfg.graph_calls) {
        b.replay(graphs[next % graphs.len()])?;
        next += 1;
    }
    b.sync()?;
    let per = cfg.graph_calls as f64;
    let mut out = Vec::with_capacity(cfg.graph_reps);
    while out.len() < cfg.graph_reps {
        let n = cfg.chunk.min(cfg.graph_reps - out.len());
        for i in 0..n {
            b.mark(2 * i)?;
            b.replay(graphs[next % graphs.len()])?;
            b.mark(2 * i + 1)?;
            next += 1;
        }
        b.sync()?;
        for i in 0..n {
            out.push(b.elapsed_ms(2 * i, 2 * i + 1)? * 1e3 / per);
        }
    }
    Ok(out)
}
