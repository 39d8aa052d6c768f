//! `docs/performance.md`, generated from benchmark records: a manifest
//! (`bench/results/current.json`) names, per suite, the record files of its newest side-by-side
//! run; this module joins them into one table per suite, with the GPU, date and flashcore commit
//! the records carry. Nothing on the page is typed by hand except the manifest's titles and notes.

use super::record::{BenchFile, Env, Mode, Pass, Record, Shape, Status, FLASHCORE};
use super::stats::Stats;
use crate::attention::{DType, Layout};
use crate::error::{Error, Result};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The manifest: which records make the page.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub suites: Vec<SuiteEntry>,
}

/// One suite's table.
#[derive(Debug, Clone, Deserialize)]
pub struct SuiteEntry {
    /// The records' `suite` (for varlen: the prefix of `varlen/<mix>/<tokens>`).
    pub suite: String,
    pub title: String,
    /// The timing mode shown (records of other modes are left out).
    pub mode: Mode,
    #[serde(default)]
    pub note: Option<String>,
    pub files: Vec<FileEntry>,
}

/// A record file, relative to the manifest's folder; `implementations` keeps only those.
#[derive(Debug, Clone, Deserialize)]
pub struct FileEntry {
    pub path: String,
    #[serde(default)]
    pub implementations: Option<Vec<String>>,
}

/// Reads the manifest at `path` and every file it names, and renders the page.
pub fn render_from(manifest: &Path) -> Result<String> {
    let text = std::fs::read_to_string(manifest).map_err(|e| Error::io(manifest, e))?;
    let m: Manifest = serde_json::from_str(&text)
        .map_err(|e| Error::Other(format!("{}: bad manifest: {e}", manifest.display())))?;
    let dir = manifest.parent().unwrap_or(Path::new("."));
    let mut suites = Vec::with_capacity(m.suites.len());
    for s in &m.suites {
        let mut records = Vec::new();
        for f in &s.files {
            let path = dir.join(&f.path);
            let keep = |r: &Record| {
                f.implementations
                    .as_ref()
                    .is_none_or(|k| k.contains(&r.implementation))
            };
            records.extend(read_records(&path)?.into_iter().filter(keep));
        }
        suites.push((s.clone(), records));
    }
    Ok(render(&display_dir(manifest), &suites))
}

/// The manifest's folder as the page names it (`bench/results`), whatever the working directory.
fn display_dir(manifest: &Path) -> String {
    let parts: Vec<_> = manifest
        .parent()
        .map(|p| p.components().rev().take(2).collect())
        .unwrap_or_default();
    let mut v: Vec<String> = parts
        .iter()
        .rev()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    v.retain(|c| c != "." && !c.is_empty());
    v.join("/")
}

/// A `flashcore-bench` file, or the rows `bench/varlen.py` writes (`{"device", "records": [{mix,
/// tokens, batch, max_len, …}]}`), read as records of the varlen suite.
fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    if let Ok(rows) = serde_json::from_str::<VarlenPyFile>(&text) {
        return Ok(rows
            .records
            .iter()
            .map(|r| r.record(&rows.device))
            .collect());
    }
    BenchFile::from_json(&text)
        .map(|f| f.records)
        .map_err(|e| Error::Other(format!("{}: {e}", path.display())))
}

#[derive(Deserialize)]
struct VarlenPyFile {
    device: String,
    records: Vec<VarlenPyRow>,
}

#[derive(Deserialize)]
struct VarlenPyRow {
    mix: String,
    tokens: usize,
    batch: usize,
    max_len: usize,
    head_dim: usize,
    heads: usize,
    causal: bool,
    implementation: String,
    mode: String,
    median_us: f64,
    tflops: f64,
}

impl VarlenPyRow {
    /// As a record: `bench/varlen.py` times bf16 only, and its "eager" rows are per-call events.
    fn record(&self, device: &str) -> Record {
        let mode = if self.mode == "graph" {
            Mode::Graph
        } else {
            Mode::Event
        };
        Record {
            implementation: self.implementation.clone(),
            suite: Some(format!("varlen/{}/{}", self.mix, self.tokens)),
            shape: Shape {
                batch: self.batch,
                heads_q: self.heads,
                heads_kv: self.heads,
                seqlen_q: self.max_len,
                seqlen_k: self.max_len,
                head_dim: self.head_dim,
                causal: self.causal,
                layout: Layout::Bshd,
                window: None,
            },
            dtype: DType::Bf16,
            mode,
            pass: Pass::Forward,
            status: Status::Ok,
            skip_reason: None,
            flops: 0.0,
            time_us: Some(Stats {
                n: 0,
                min: self.median_us,
                median: self.median_us,
                mean: self.median_us,
                p95: self.median_us,
                p99: self.median_us,
                max: self.median_us,
                stddev: 0.0,
            }),
            tflops: Some(self.tflops),
            method: None,
            env: Env {
                gpu: Some(device.to_string()),
                ..Env::default()
            },
        }
    }
}

/// What a table row is matched on. Varlen rows match on the case (mix, tokens), head dim and
/// mask: the dense comparison and the other tools record other shapes for the same case.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RowKey {
    suite: String,
    dtype: &'static str,
    head_dim: usize,
    causal: bool,
    shape: Option<(usize, usize, usize, usize, usize)>,
    pass: &'static str,
}

fn row_key(r: &Record) -> RowKey {
    let suite = r.suite.clone().unwrap_or_default();
    let s = &r.shape;
    let shape = (!suite.starts_with("varlen"))
        .then_some((s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k));
    RowKey {
        suite,
        dtype: r.dtype.name(),
        head_dim: s.head_dim,
        causal: s.causal,
        shape,
        pass: r.pass.name(),
    }
}

/// An implementation of our own (the varlen suite's dense call, the PyTorch op) is a column but
/// never the "best other".
fn is_ours(implementation: &str) -> bool {
    implementation.starts_with(FLASHCORE)
}

/// One row of a table: its key, flashcore's record, each column's median (µs), and the fastest
/// other implementation (name, median µs) where there is one.
type Row = (RowKey, Record, Vec<Option<f64>>, Option<(String, f64)>);

struct Table {
    columns: Vec<String>,
    rows: Vec<Row>,
}

fn in_suite(r: &Record, suite: &str) -> bool {
    r.suite
        .as_deref()
        .is_some_and(|s| s == suite || s.starts_with(&format!("{suite}/")))
}

fn table(entry: &SuiteEntry, records: &[Record]) -> Table {
    let shown: Vec<&Record> = records
        .iter()
        .filter(|r| r.mode == entry.mode && in_suite(r, &entry.suite))
        .collect();
    let columns: Vec<String> = shown
        .iter()
        .filter(|r| r.implementation != FLASHCORE)
        .map(|r| r.implementation.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    for ours in shown.iter().filter(|r| r.implementation == FLASHCORE) {
        let key = row_key(ours);
        if !seen.insert(key.clone()) {
            continue;
        }
        let medians: Vec<Option<f64>> = columns
            .iter()
            .map(|c| {
                shown
                    .iter()
                    .find(|r| &r.implementation == c && row_key(r) == key)
                    .and_then(|r| r.median_us())
            })
            .collect();
        let best = columns
            .iter()
            .zip(&medians)
            .filter(|(c, _)| !is_ours(c))
            .filter_map(|(c, m)| m.map(|m| (c.clone(), m)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        rows.push((key, (*ours).clone(), medians, best));
    }
    Table { columns, rows }
}

fn fmt_us(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.2}"),
        _ => "–".into(),
    }
}

fn ratio(ours: &Record, best: &Option<(String, f64)>) -> Option<f64> {
    match (ours.median_us(), best) {
        (Some(o), Some((_, b))) if *b > 0.0 => Some(o / b),
        _ => None,
    }
}

/// Where and when: the flashcore records' GPU, first date and commits.
struct Provenance {
    gpu: String,
    date: String,
    commits: String,
}

fn provenance(t: &Table) -> Provenance {
    let envs: Vec<&Env> = t.rows.iter().map(|r| &r.1.env).collect();
    let gpus: BTreeSet<&str> = envs.iter().filter_map(|e| e.gpu.as_deref()).collect();
    let date = envs
        .iter()
        .map(|e| e.date.get(..10).unwrap_or(&e.date))
        .min()
        .unwrap_or("unknown")
        .to_string();
    let commits: BTreeSet<&str> = envs
        .iter()
        .filter_map(|e| e.git_commit.as_deref())
        .map(|c| c.get(..7).unwrap_or(c))
        .collect();
    let join = |s: BTreeSet<&str>| {
        if s.is_empty() {
            "unknown".to_string()
        } else {
            s.into_iter().collect::<Vec<_>>().join(", ")
        }
    };
    Provenance {
        gpu: join(gpus),
        date,
        commits: join(commits),
    }
}

/// The range and geometric mean of flashcore ÷ best other, and how many rows flashcore leads.
fn summary(t: &Table) -> String {
    let ratios: Vec<f64> = t.rows.iter().filter_map(|r| ratio(&r.1, &r.3)).collect();
    if ratios.is_empty() {
        return "no row has another implementation".into();
    }
    let lo = ratios.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    let leads = ratios.iter().filter(|r| **r < 1.0).count();
    format!(
        "{lo:.3}–{hi:.3} (geomean {geo:.3}); flashcore leads at {leads} of {} rows",
        ratios.len()
    )
}

fn shape_cell(k: &RowKey, r: &Record) -> String {
    match k.shape {
        Some((b, hq, hkv, sq, sk)) => {
            let heads = if hq == hkv {
                format!("{hq}")
            } else {
                format!("{hq}/{hkv}")
            };
            let seq = if sq == sk {
                format!("{sq}")
            } else {
                format!("{sq}→{sk}")
            };
            format!("{b}×{heads}×{seq}×{}", k.head_dim)
        }
        None => format!(
            "{} ({} seqs, max {}), d{}",
            k.suite.trim_start_matches("varlen/"),
            r.shape.batch,
            r.shape.seqlen_q,
            k.head_dim
        ),
    }
}

/// The page for `suites` (each entry with its records); `dir` names the records' folder.
pub fn render(dir: &str, suites: &[(SuiteEntry, Vec<Record>)]) -> String {
    let tables: Vec<Table> = suites.iter().map(|(e, r)| table(e, r)).collect();
    let mut s = String::new();
    let _ = writeln!(s, "# Performance\n");
    let _ = writeln!(
        s,
        "<!-- Generated by `flashcore perf-page` from {dir}/current.json; edit that manifest, not this file. -->\n"
    );
    let _ = writeln!(
        s,
        "One table per suite, each from the newest side-by-side run named in \
         `{dir}/current.json`; every figure is a median read from the JSON records there \
         (schema: [bench-json.md](bench-json.md)). The older runs and what each optimisation \
         predicted and measured are in the journals [benchmarks](journal/benchmarks.md) and \
         [perf-notes](journal/perf-notes.md).\n"
    );
    let _ = writeln!(
        s,
        "| Suite | GPU | Date | flashcore commit | Records | flashcore ÷ best other |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for ((e, _), t) in suites.iter().zip(&tables) {
        let p = provenance(t);
        let folders: BTreeSet<String> = e
            .files
            .iter()
            .map(|f| {
                Path::new(&f.path)
                    .parent()
                    .map(PathBuf::from)
                    .unwrap_or_default()
                    .display()
                    .to_string()
            })
            .collect();
        let folders: Vec<String> = folders
            .into_iter()
            .map(|f| format!("`{dir}/{f}/`"))
            .collect();
        let _ = writeln!(
            s,
            "| [{}](#{}) | {} | {} | {} | {} | {} |",
            e.suite,
            anchor(&e.title),
            p.gpu,
            p.date,
            p.commits,
            folders.join(", "),
            summary(t)
        );
    }
    let _ = writeln!(
        s,
        "\nTimes are medians in µs per call; ratio = flashcore ÷ the fastest other implementation \
         in the same run (above 1: flashcore is slower); – = not measured or skipped. FLOPs are \
         counted as flash-attn counts them (`4·B·Hq·Sq·Sk·D`, halved for causal with Sq = Sk; the \
         backward 2.5× the forward). Implementations named `flashcore-…` are flashcore's own \
         (through PyTorch, or the dense call beside varlen) and never count as the best other."
    );
    for ((e, _), t) in suites.iter().zip(&tables) {
        let _ = writeln!(s, "\n## {}\n", e.title);
        let _ = writeln!(s, "Suite `{}`, {} mode.", e.suite, e.mode.name());
        if let Some(n) = &e.note {
            let _ = writeln!(s, "{n}");
        }
        let _ = writeln!(s);
        let passes: BTreeMap<&str, ()> = t.rows.iter().map(|r| (r.0.pass, ())).collect();
        let pass_col = passes.len() > 1;
        let mut head = "| dtype | shape (B×H×S×D) | causal |".to_string();
        let mut rule = "|---|---|---|".to_string();
        if pass_col {
            head += " pass |";
            rule += "---|";
        }
        head += " flashcore |";
        rule += "---:|";
        for c in &t.columns {
            let _ = write!(head, " {c} |");
            rule += "---:|";
        }
        head += " best other | ratio |";
        rule += "---|---:|";
        let _ = writeln!(s, "{head}\n{rule}");
        for (k, ours, medians, best) in &t.rows {
            let mut line = format!(
                "| {} | {} | {} |",
                k.dtype,
                shape_cell(k, ours),
                if k.causal { "yes" } else { "" }
            );
            if pass_col {
                let _ = write!(line, " {} |", k.pass);
            }
            let _ = write!(line, " {} |", fmt_us(ours.median_us()));
            for m in medians {
                let _ = write!(line, " {} |", fmt_us(*m));
            }
            let _ = write!(
                line,
                " {} | {} |",
                best.as_ref().map_or("–", |b| b.0.as_str()),
                ratio(ours, best).map_or("–".into(), |r| format!("{r:.3}"))
            );
            let _ = writeln!(s, "{line}");
        }
    }
    let _ = writeln!(
        s,
        "\n## Measuring on your GPU\n\n```sh\n\
         cargo run --release -- bench --suite fa3 --json fc.json     # prefill, the FA3 paper's shapes\n\
         cargo run --release -- bench --suite backward --backward    # backward and forward + backward\n\
         cargo run --release -- bench --suite decode                 # decode over KV caches\n\
         bash scripts/bench-vs-sdpa.sh                               # beside PyTorch SDPA and FA4\n\
         ```\n\n\
         To update this page, put the new run's JSON files under `{dir}/`, name them in \
         `{dir}/current.json`, and run `cargo run --release -- perf-page --out docs/performance.md`."
    );
    s
}

/// The anchor GitHub gives a heading.
fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}
