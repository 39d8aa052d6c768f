//! The JSON records `flashcore bench --json` writes and `--compare` / `--from-json` read; the
//! schema is documented in docs/bench-json.md. `bench/sdpa.py` writes the same schema.

use super::stats::Stats;
use crate::attention::{AttentionParams, DType, Layout, Window};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// `schema` of every file.
pub const SCHEMA: &str = "flashcore-bench";
/// `version` of the schema this crate writes (and the newest it reads).
pub const VERSION: u32 = 1;
/// Our `implementation` name.
pub const FLASHCORE: &str = "flashcore";

/// How a sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One device-event pair around each single launch.
    Event,
    /// Device events around a CUDA-graph replay of `graph_calls` launches, divided by it.
    Graph,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Event => "event",
            Mode::Graph => "graph",
        }
    }
}

/// Which pass a record times: the forward (every record before `--backward` existed), the
/// backward alone (dQ, dK, dV from Q, K, V, O, LSE, dO), or a forward then a backward.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Pass {
    #[default]
    #[serde(rename = "forward")]
    Forward,
    #[serde(rename = "backward")]
    Backward,
    #[serde(rename = "forward+backward")]
    ForwardBackward,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::ForwardBackward => "forward+backward",
        }
    }

    /// The suffix tables and plots add to a record's mode or implementation ("" for the forward).
    pub fn tag(self) -> &'static str {
        match self {
            Pass::Forward => "",
            Pass::Backward => "bwd",
            Pass::ForwardBackward => "f+b",
        }
    }

    /// FLOPs of the pass relative to the forward's, as flash-attn counts them (the backward's
    /// five GEMMs against the forward's two: 2.5×).
    pub fn flop_factor(self) -> f64 {
        match self {
            Pass::Forward => 1.0,
            Pass::Backward => 2.5,
            Pass::ForwardBackward => 3.5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not measured; `skip_reason` says why (unsupported shape, backend error, …).
    Skipped,
}

/// The problem shape (everything public about the call except dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub causal: bool,
    #[serde(default)]
    pub layout: Layout,
    /// A sliding window, flash-attn's `(left, right)` with −1 unbounded; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<(i64, i64)>,
}

impl Shape {
    pub fn of(p: &AttentionParams) -> Shape {
        Shape {
            batch: p.batch,
            heads_q: p.heads_q,
            heads_kv: p.heads_kv,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            head_dim: p.head_dim,
            causal: p.causal,
            layout: p.layout,
            window: (!p.window.is_unbounded()).then(|| p.window.to_flash_attn()),
        }
    }

    pub fn params(&self, dtype: DType) -> AttentionParams {
        AttentionParams {
            batch: self.batch,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            dtype,
            layout: self.layout,
            causal: self.causal,
            scale: None,
            window: self
                .window
                .map_or_else(Default::default, |(l, r)| Window::from_flash_attn(l, r)),
            softcap: 0.0,
        }
    }
}

/// GPU clocks as `nvidia-smi` reports them, MHz.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Clocks {
    pub sm_mhz: Option<f64>,
    pub mem_mhz: Option<f64>,
}

/// Where and when a record was measured. Unknown values are `null`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Env {
    /// Device name (`cuDeviceGetName` / `torch.cuda.get_device_name`).
    pub gpu: Option<String>,
    /// Kernel driver version from `nvidia-smi`, e.g. "580.95.05".
    #[serde(default)]
    pub driver_version: Option<String>,
    /// `cuDriverGetVersion`: the CUDA version the driver supports, e.g. 13000.
    #[serde(default)]
    pub cuda_driver_version: Option<i32>,
    /// Clocks read just before this shape's first timed call and just after its last.
    #[serde(default)]
    pub clocks_start: Option<Clocks>,
    #[serde(default)]
    pub clocks_end: Option<Clocks>,
    /// flashcore's git commit (both implementations record it: it names the harness too).
    #[serde(default)]
    pub git_commit: Option<String>,
    /// UTC ISO-8601 time the record was made, e.g. "2026-11-22T08:00:00Z".
    pub date: String,
    /// Versions of the software measured, e.g. {"flashcore": "0.1.0"} or
    /// {"torch": "2.11.0", "cudnn": "91900"}.
    #[serde(default)]
    pub software: BTreeMap<String, String>,
}

/// How the samples were taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Method {
    pub warmup: usize,
    /// Samples asked for (per-call: calls; graph: replays).
    pub reps: usize,
    /// Launches per graph (graph mode only).
    pub graph_calls: Option<usize>,
    /// Buffer sets the calls rotate over, the bytes of one set's inputs, and the L2 size used.
    pub buffer_sets: usize,
    pub input_bytes_per_set: u64,
    pub l2_bytes: Option<u64>,
}

/// One (implementation, shape, dtype, mode) measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// "flashcore", or "sdpa-flash" / "sdpa-cudnn" / "sdpa-efficient".
    pub implementation: String,
    /// The suite it belongs to ("seed", "fa3"), or null for ad-hoc shapes.
    #[serde(default)]
    pub suite: Option<String>,
    pub shape: Shape,
    pub dtype: DType,
    pub mode: Mode,
    /// The pass timed; absent (older files, other tools) means the forward.
    #[serde(default)]
    pub pass: Pass,
    pub status: Status,
    #[serde(default)]
    pub skip_reason: Option<String>,
    /// flash-attn FLOP count: 4·B·Hq·Sq·Sk·D, halved for causal with Sq = Sk, times
    /// [`Pass::flop_factor`].
    pub flops: f64,
    /// Statistics of the samples, microseconds per call (null when skipped).
    #[serde(default)]
    pub time_us: Option<Stats>,
    /// flops / median time, 10¹² FLOP/s (null when skipped).
    #[serde(default)]
    pub tflops: Option<f64>,
    #[serde(default)]
    pub method: Option<Method>,
    pub env: Env,
}

impl Record {
    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok && self.time_us.is_some()
    }
    pub fn median_us(&self) -> Option<f64> {
        if self.status == Status::Ok {
            self.time_us.map(|s| s.median)
        } else {
            None
        }
    }
}

/// A whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    pub schema: String,
    pub version: u32,
    pub records: Vec<Record>,
}

impl BenchFile {
    pub fn new(records: Vec<Record>) -> BenchFile {
        BenchFile {
            schema: SCHEMA.into(),
            version: VERSION,
            records,
        }
    }

    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Other(format!("JSON: {e}")))
    }

    /// Parses a file: an object with `schema`, `version`, `records`, or a bare array of records.
    pub fn from_json(text: &str) -> Result<BenchFile> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Other(format!("not JSON: {e}")))?;
        let file = if value.is_array() {
            BenchFile::new(
                serde_json::from_value(value)
                    .map_err(|e| Error::Other(format!("bad record: {e}")))?,
            )
        } else {
            let f: BenchFile = serde_json::from_value(value)
                .map_err(|e| Error::Other(format!("bad bench file: {e}")))?;
            if f.schema != SCHEMA {
                return Err(Error::Other(format!(
                    "schema is `{}`, expected `{SCHEMA}`",
                    f.schema
                )));
            }
            if f.version > VERSION {
                return Err(Error::Other(format!(
                    "schema version {} is newer than this flashcore reads ({VERSION})",
                    f.version
                )));
            }
            f
        };
        Ok(file)
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        crate::output::write_atomic(path, (self.to_json()? + "\n").as_bytes())
    }

    pub fn read(path: &Path) -> Result<BenchFile> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        BenchFile::from_json(&text).map_err(|e| Error::Other(format!("{}: {e}", path.display())))
    }
}
