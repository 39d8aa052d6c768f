//! The result tables and the JSON file of `flashcore leakage` (schema `flashcore-leakage`).
//! GPU-free.
//!
//! Versions: 2 added each class's `cycles`, `floor` and `attribution`, and the run's
//! queued-timing wait; 3 adds the floor's cycle-timer build (`floor.cycles`, the same fields as
//! `cycles`), the attribution `cycles_within_floor`, and `run.floor_cycles`; secret-length runs
//! have no floor. 4 adds `run.decode` (decode mode: the KV-cache call; absent otherwise).

use super::decode::DecodeConfig;
use super::run::ClassResult;
use super::stats::{Analysis, TestResult, CERTAIN_T, LEAK_T};
use super::verdict::{Attribution, FLOOR_SLACK};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What was timed: shape, mode, kernel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub batch: usize,
    pub heads: usize,
    pub seqlen: usize,
    pub head_dim: usize,
    pub dtype: String,
    pub layout: String,
    pub causal: bool,
    pub secret_len: bool,
    /// "shipped", or the leaky control's name.
    pub kernel: String,
    pub measurements_requested: usize,
    pub budget_s: Option<f64>,
    pub pool: usize,
    pub seed: u64,
    /// Queued-timing wait before each timed launch, microseconds (0: none).
    #[serde(default)]
    pub queue_us: f64,
    /// Whether the cycle-timer build, the floor, and the floor's cycle-timer build were measured.
    #[serde(default)]
    pub cycles: bool,
    #[serde(default)]
    pub floor: bool,
    #[serde(default)]
    pub floor_cycles: bool,
    /// Decode mode (version 4): the KV-cache call timed; `seqlen` is then the cache's capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeRun>,
}

/// The KV-cache decode call of a decode-mode run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeRun {
    /// New queries per sequence.
    pub seqlen_q: usize,
    pub heads_kv: usize,
    /// Secret or public counts, the paging.
    #[serde(flatten)]
    pub config: DecodeConfig,
}

/// Where and when.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EnvInfo {
    pub gpu: Option<String>,
    pub date: Option<String>,
    pub git_commit: Option<String>,
    pub cuda_driver_version: Option<i32>,
    pub driver: Option<String>,
    pub sm_mhz: Option<f64>,
    pub mem_mhz: Option<f64>,
}

/// The JSON schema version [`LeakageFile::new`] writes.
pub const SCHEMA_VERSION: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeakageFile {
    pub schema: String,
    pub version: u32,
    pub leak_threshold: f64,
    pub certain_threshold: f64,
    /// [`FLOOR_SLACK`]: how far above the floor's max |t| a time or cycles |t| still counts as
    /// the floor.
    #[serde(default)]
    pub floor_slack: f64,
    pub run: RunInfo,
    pub env: EnvInfo,
    pub results: Vec<ClassResult>,
}

impl LeakageFile {
    pub fn new(run: RunInfo, env: EnvInfo, results: Vec<ClassResult>) -> Self {
        LeakageFile {
            schema: "flashcore-leakage".into(),
            version: SCHEMA_VERSION,
            leak_threshold: LEAK_T,
            certain_threshold: CERTAIN_T,
            floor_slack: FLOOR_SLACK,
            run,
            env,
            results,
        }
    }

    pub fn write(&self, path: &Path) -> crate::Result<()> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| crate::Error::Other(format!("cannot encode JSON: {e}")))?;
        crate::output::write_atomic(path, (text + "\n").as_bytes())
    }
}

fn t_cell(r: Option<TestResult>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r.t.is_infinite() => "inf".into(),
        Some(r) => format!("{:.2}", r.t.abs()),
    }
}

fn crop_cell(r: Option<TestResult>) -> String {
    match r.and_then(|r| r.crop_percentile) {
        Some(p) => format!("{} @p{:.1}", t_cell(r), p),
        None => t_cell(r),
    }
}

/// Renders rows under a header, first and last columns left-aligned, the rest right-aligned.
fn render(header: &[&str], body: Vec<Vec<String>>) -> String {
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    rows.extend(body);
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (s, &w))| {
                let pad = w - s.chars().count();
                if c == 0 || c == header.len() - 1 {
                    format!("{s}{}", " ".repeat(pad))
                } else {
                    format!("{}{s}", " ".repeat(pad))
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
        if i == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            out.push_str(&"-".repeat(total));
            out.push('\n');
        }
    }
    out
}

fn max_cell(a: &Analysis) -> String {
    match a.max_abs_t() {
        None => "-".into(),
        Some(t) if t.is_infinite() => "inf".into(),
        Some(t) => format!("{t:.2}"),
    }
}

/// The cycle timer, one row per class that has it: median SM cycles per CTA of each class and
/// max |t| over every test on them (the verdict's number); the mean SM clock of each class and
/// its |t|; |t| of the device-side span and of the instrumented build's event time.
pub fn format_cycles_table(results: &[ClassResult]) -> String {
    let header = [
        "class",
        "n",
        "fixed cycles",
        "random cycles",
        "cycles |t|",
        "fixed MHz",
        "random MHz",
        "MHz |t|",
        "span |t|",
        "time |t|",
        "cycles verdict",
    ];
    let med = |s: &Option<crate::bench::stats::Stats>| {
        s.map_or("-".into(), |s| format!("{:.0}", s.median))
    };
    let mean =
        |s: &Option<crate::bench::stats::Stats>| s.map_or("-".into(), |s| format!("{:.1}", s.mean));
    let body = results
        .iter()
        .filter_map(|r| r.cycles.as_ref().map(|c| (r, c)))
        .map(|(r, c)| {
            let n = if c.stopped_by_budget {
                format!("{} (budget)", c.measurements)
            } else {
                c.measurements.to_string()
            };
            vec![
                r.class.clone(),
                n,
                med(&c.fixed_cycles),
                med(&c.random_cycles),
                max_cell(&c.cycles),
                mean(&c.fixed_mhz),
                mean(&c.random_mhz),
                max_cell(&c.mhz),
                max_cell(&c.span),
                max_cell(&c.time),
                c.verdict.name().into(),
            ]
        })
        .collect();
    render(&header, body)
}

/// The floor's cycle-timer build (as [`format_cycles_table`]), for the classes that have one.
pub fn format_floor_cycles_table(results: &[ClassResult]) -> String {
    let floors: Vec<ClassResult> = results
        .iter()
        .filter_map(|r| r.floor.as_deref().filter(|f| f.cycles.is_some()).cloned())
        .collect();
    format_cycles_table(&floors)
}

/// The floor control's timing table (as [`format_table`]), for the classes that have one.
pub fn format_floor_table(results: &[ClassResult]) -> String {
    let floors: Vec<ClassResult> = results
        .iter()
        .filter_map(|r| r.floor.as_deref().cloned())
        .collect();
    format_table(&floors)
}

/// The verdict per class: max |t| of the kernel's time, the floor's time, the kernel's cycles,
/// the floor's cycles, and of the SM clock (MHz) of both cycle-timer builds; and where the
/// difference comes from ([`super::verdict`]).
pub fn format_verdict_table(results: &[ClassResult]) -> String {
    let header = [
        "class",
        "time |t|",
        "floor |t|",
        "cycles |t|",
        "floor cycles |t|",
        "MHz |t|",
        "floor MHz |t|",
        "verdict",
    ];
    let cell = |t: Option<f64>| match t {
        None => "-".to_string(),
        Some(t) if t.is_infinite() => "inf".into(),
        Some(t) => format!("{t:.2}"),
    };
    let body = results
        .iter()
        .map(|r| {
            let e = r.evidence();
            vec![
                r.class.clone(),
                cell(e.time_t),
                cell(e.floor_t),
                cell(e.cycles_t),
                cell(e.floor_cycles_t),
                cell(r.mhz_t()),
                cell(r.floor.as_ref().and_then(|f| f.mhz_t())),
                r.attribution.name().into(),
            ]
        })
        .collect();
    render(&header, body)
}

/// One row per class: n, median time per class, max |t| raw / cropped / second order, overall
/// max |t| and the verdict.
pub fn format_table(results: &[ClassResult]) -> String {
    let header = [
        "class",
        "n",
        "fixed µs",
        "random µs",
        "raw |t|",
        "cropped |t|",
        "2nd-order |t|",
        "max |t|",
        "verdict",
    ];
    let mut body = Vec::new();
    for r in results {
        let a = &r.analysis;
        let med = |s: &Option<crate::bench::stats::Stats>| {
            s.map_or("-".into(), |s| format!("{:.3}", s.median))
        };
        let n = if r.stopped_by_budget {
            format!("{} (budget)", r.measurements)
        } else {
            r.measurements.to_string()
        };
        body.push(vec![
            r.class.clone(),
            n,
            med(&r.fixed_us),
            med(&r.random_us),
            t_cell(a.raw),
            crop_cell(a.cropped),
            crop_cell(a.second_order),
            max_cell(a),
            r.verdict.name().into(),
        ]);
    }
    render(&header, body)
}

fn num(t: Option<f64>) -> String {
    match t {
        None => "-".into(),
        Some(t) if t.is_infinite() => "inf".into(),
        Some(t) => format!("{t:.2}"),
    }
}

/// The summary line of one attribution: the classes that got it, each with the numbers the
/// verdict compared, and what it means; `None` when no class got it.
pub fn summary_line(results: &[ClassResult], a: Attribution) -> Option<String> {
    let classes: Vec<String> = results
        .iter()
        .filter(|r| r.attribution == a)
        .map(|r| {
            let e = r.evidence();
            let cycles = match e.floor_cycles_t {
                Some(_) => format!(
                    "cycles |t| {} vs floor {}",
                    num(e.cycles_t),
                    num(e.floor_cycles_t)
                ),
                None => format!("cycles |t| {}, no floor cycles", num(e.cycles_t)),
            };
            let time = match e.floor_t {
                Some(_) => format!("time |t| {} vs floor {}", num(e.time_t), num(e.floor_t)),
                None => format!("time |t| {}, no floor", num(e.time_t)),
            };
            let detail = match a {
                Attribution::CycleLeak => cycles,
                Attribution::CyclesWithinFloor => format!("{cycles}; {time}"),
                Attribution::WithinFloor | Attribution::AboveFloor | Attribution::Unattributed => {
                    time
                }
                Attribution::NoLeak | Attribution::Inconclusive => return r.class.clone(),
            };
            format!("{} ({detail})", r.class)
        })
        .collect();
    (!classes.is_empty()).then(|| format!("{}: {} — {}", a.name(), classes.join(", "), a.explain()))
}
