//! The result table and the JSON file of `flashcore leakage` (schema `flashcore-leakage`,
//! version 1). GPU-free.

use super::run::ClassResult;
use super::stats::{TestResult, CERTAIN_T, LEAK_T};
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

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeakageFile {
    pub schema: String,
    pub version: u32,
    pub leak_threshold: f64,
    pub certain_threshold: f64,
    pub run: RunInfo,
    pub env: EnvInfo,
    pub results: Vec<ClassResult>,
}

impl LeakageFile {
    pub fn new(run: RunInfo, env: EnvInfo, results: Vec<ClassResult>) -> Self {
        LeakageFile {
            schema: "flashcore-leakage".into(),
            version: 1,
            leak_threshold: LEAK_T,
            certain_threshold: CERTAIN_T,
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
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for r in results {
        let a = &r.analysis;
        let med = |s: &Option<crate::bench::stats::Stats>| {
            s.map_or("-".into(), |s| format!("{:.3}", s.median))
        };
        let max = match a.max_abs_t() {
            None => "-".into(),
            Some(t) if t.is_infinite() => "inf".into(),
            Some(t) => format!("{t:.2}"),
        };
        let n = if r.stopped_by_budget {
            format!("{} (budget)", r.measurements)
        } else {
            r.measurements.to_string()
        };
        rows.push(vec![
            r.class.clone(),
            n,
            med(&r.fixed_us),
            med(&r.random_us),
            t_cell(a.raw),
            crop_cell(a.cropped),
            crop_cell(a.second_order),
            max,
            r.verdict.name().into(),
        ]);
    }
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
