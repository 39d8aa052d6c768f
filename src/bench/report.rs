//! Plain-text tables: the results of a run, and the side-by-side join of our records with other
//! implementations' (`flashcore bench --compare FILE`).

use super::record::{Mode, Pass, Record, Shape, Status};
use super::suites::label;
use crate::attention::{DType, Layout};
use std::collections::BTreeSet;
use std::fmt::Write;

fn shape_label(s: &Shape) -> String {
    label(&s.params(DType::F16))
}

/// The mode column: the mode, and the pass unless it is the forward ("event bwd", "graph f+b").
fn mode_label(mode: Mode, pass: Pass) -> String {
    match pass {
        Pass::Forward => mode.name().to_string(),
        p => format!("{} {}", mode.name(), p.tag()),
    }
}

fn num(x: Option<f64>, prec: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.prec$}"),
        _ => "-".into(),
    }
}

/// One line per record: implementation, dtype, shape, mode, median/min/p95/p99 (µs), TFLOPS.
pub fn format_results(records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<15} {:<5} {:<28} {:<9} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "implementation",
        "dtype",
        "shape",
        "mode",
        "median_us",
        "min_us",
        "p95_us",
        "p99_us",
        "TFLOPS"
    );
    for r in records {
        let head = format!(
            "{:<15} {:<5} {:<28} {:<9}",
            r.implementation,
            r.dtype.name(),
            shape_label(&r.shape),
            mode_label(r.mode, r.pass)
        );
        match (r.status, r.time_us) {
            (Status::Ok, Some(t)) => {
                let _ = writeln!(
                    s,
                    "{head} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>8}",
                    t.median,
                    t.min,
                    t.p95,
                    t.p99,
                    num(r.tflops, 1)
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "{head} skipped: {}",
                    r.skip_reason.as_deref().unwrap_or("no samples")
                );
            }
        }
    }
    s
}

/// What rows are matched on: the shape (layout ignored), dtype, mode and pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JoinKey {
    pub shape: Shape,
    pub dtype: DType,
    pub mode: Mode,
    pub pass: Pass,
}

impl JoinKey {
    pub fn of(r: &Record) -> JoinKey {
        JoinKey {
            shape: Shape {
                layout: Layout::Bshd,
                ..r.shape
            },
            dtype: r.dtype,
            mode: r.mode,
            pass: r.pass,
        }
    }
}

/// One row of the joined table. Medians are µs; `None` means missing or skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinRow {
    pub key: JoinKey,
    pub ours: Option<f64>,
    pub ours_tflops: Option<f64>,
    /// One entry per column of [`Joined::columns`], in order.
    pub others: Vec<Option<f64>>,
    /// The fastest other implementation that has a median, and that median.
    pub best: Option<(String, f64)>,
    /// ours / best median: below 1 means ours is faster.
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    pub ours: String,
    /// The other implementations, sorted by name.
    pub columns: Vec<String>,
    pub rows: Vec<JoinRow>,
}

/// Joins the records of implementation `ours` with every other implementation's, per
/// (shape, dtype, mode, pass). Rows follow the order of first appearance (ours first, then keys only
/// the others have). When one implementation has several records for a key, the first counts.
pub fn join(records: &[Record], ours: &str) -> Joined {
    let columns: Vec<String> = records
        .iter()
        .filter(|r| r.implementation != ours)
        .map(|r| r.implementation.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut keys: Vec<JoinKey> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mine = records.iter().filter(|r| r.implementation == ours);
    let theirs = records.iter().filter(|r| r.implementation != ours);
    for r in mine.chain(theirs) {
        let k = JoinKey::of(r);
        if seen.insert(k) {
            keys.push(k);
        }
    }
    let find = |imp: &str, k: &JoinKey| {
        records
            .iter()
            .find(|r| r.implementation == imp && JoinKey::of(r) == *k)
    };
    let rows = keys
        .into_iter()
        .map(|key| {
            let me = find(ours, &key);
            let others: Vec<Option<f64>> = columns
                .iter()
                .map(|c| find(c, &key).and_then(Record::median_us))
                .collect();
            let best = columns
                .iter()
                .zip(&others)
                .filter_map(|(c, m)| m.map(|m| (c.clone(), m)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let ours_med = me.and_then(Record::median_us);
            let ratio = match (ours_med, &best) {
                (Some(o), Some((_, b))) if *b > 0.0 => Some(o / b),
                _ => None,
            };
            JoinRow {
                key,
                ours: ours_med,
                ours_tflops: me.filter(|r| r.is_ok()).and_then(|r| r.tflops),
                others,
                best,
                ratio,
            }
        })
        .collect();
    Joined {
        ours: ours.to_string(),
        columns,
        rows,
    }
}

/// The joined table: dtype, shape, mode, our median µs and TFLOPS, each other implementation's
/// median µs, the best of them, and ours/best (below 1: ours faster).
pub fn format_join(j: &Joined) -> String {
    let mut s = String::new();
    let mut head = format!(
        "{:<5} {:<28} {:<9} {:>12} {:>8}",
        "dtype",
        "shape",
        "mode",
        format!("{}_us", j.ours),
        "TFLOPS"
    );
    for c in &j.columns {
        let _ = write!(head, " {:>16}", format!("{c}_us"));
    }
    let _ = write!(head, " {:>16} {:>10}", "best_other", "ours/best");
    let _ = writeln!(s, "{head}");
    for r in &j.rows {
        let mut line = format!(
            "{:<5} {:<28} {:<9} {:>12} {:>8}",
            r.key.dtype.name(),
            shape_label(&r.key.shape),
            mode_label(r.key.mode, r.key.pass),
            num(r.ours, 2),
            num(r.ours_tflops, 1)
        );
        for m in &r.others {
            let _ = write!(line, " {:>16}", num(*m, 2));
        }
        let best = r.best.as_ref().map(|(n, _)| n.as_str()).unwrap_or("-");
        let _ = write!(line, " {:>16} {:>10}", best, num(r.ratio, 3));
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "(medians in µs per call; ours/best = {} median ÷ fastest other median, below 1 = {} faster; - = missing or skipped)",
        j.ours, j.ours
    );
    s
}
