//! What `flashcore attn` takes (its arguments and their parsers) and the checks and report lines
//! its modes share: the dense call (`attn.rs`), gradients, KV-cache decode and varlen.

use crate::attention::{AttentionParams, Layout, Window};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Run attention on q, k, v from a safetensors file — or, when the file holds `k_cache`,
/// `v_cache` and `cache_seqlens` (I32 [B]) with optional new `k`, `v`, one decode step over that
/// KV cache: the new rows are appended at each sequence's length, the queries attend to the first
/// `cache_seqlens[b] + n` rows, and the updated caches are written beside `out`; or, when it holds
/// `cu_seqlens_q` and `cu_seqlens_k` (I32 [B + 1]), packed variable-length sequences (q
/// [total_q, Hq, D], k and v [total_k, Hkv, D]; `lse` is then [Hq, total_q]).
#[derive(clap::Args, Debug)]
pub struct AttnArgs {
    /// safetensors file holding `q`, `k`, `v` (F16 or BF16, all one dtype, 4-D in --layout).
    #[arg(long, value_name = "IN.safetensors")]
    pub input: PathBuf,
    /// Where to write `out` (shape of q; the input dtype, or F32 with --cpu) and `lse`.
    #[arg(long, value_name = "OUT.safetensors")]
    pub output: PathBuf,
    /// Layout of q, k, v and out: bshd [B, S, H, D] (flash-attn) or bhsd [B, H, S, D] (SDPA).
    #[arg(long, default_value = "bshd", value_name = "bshd|bhsd")]
    pub layout: Layout,
    /// Causal mask, bottom-right aligned when Sq ≠ Sk.
    #[arg(long)]
    pub causal: bool,
    /// Softmax scale (positive, finite); default 1/sqrt(head_dim).
    #[arg(long, value_name = "X", value_parser = parse_scale, allow_negative_numbers = true)]
    pub scale: Option<f32>,
    /// Sliding window `LEFT,RIGHT` (flash-attn's window_size; −1 = unbounded): query i, aligned
    /// bottom-right to the keys, sees key j iff i − LEFT ≤ j ≤ i + RIGHT (causal forces RIGHT = 0).
    #[arg(long, value_name = "LEFT,RIGHT", value_parser = parse_window, allow_hyphen_values = true)]
    pub window: Option<Window>,
    /// Logit softcap: scores become X · tanh(scale · q·k / X) before the softmax (Gemma 2); 0 = off.
    #[arg(long, value_name = "X", value_parser = parse_softcap, allow_negative_numbers = true)]
    pub softcap: Option<f32>,
    /// Also write `lse` (F32 [B, Hq, Sq], natural log; −inf for fully masked rows).
    #[arg(long)]
    pub lse: bool,
    /// Run the float64 CPU reference instead of the GPU (writes F32; no GPU needed).
    #[arg(long)]
    pub cpu: bool,
    /// CUDA device ordinal.
    #[arg(long, value_name = "N", conflicts_with = "cpu")]
    pub device: Option<usize>,
    /// Also run the backward pass: read the output gradient `do` (q's shape and dtype) from the
    /// input file and write `dq`, `dk`, `dv` beside `out` (src/cli/attn_grad.rs).
    #[arg(long)]
    pub grad: bool,
}

fn parse_scale(s: &str) -> std::result::Result<f32, String> {
    let x: f32 = s
        .parse()
        .map_err(|e| format!("`{s}` is not a number ({e})"))?;
    if x.is_finite() && x > 0.0 {
        Ok(x)
    } else {
        Err(format!("must be positive and finite, got {s}"))
    }
}

pub(super) fn parse_window(s: &str) -> std::result::Result<Window, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [l, r] = parts[..] else {
        return Err(format!(
            "`{s}` is not LEFT,RIGHT (two integers, -1 = unbounded)"
        ));
    };
    let side = |x: &str| -> std::result::Result<i64, String> {
        let v: i64 = x
            .parse()
            .map_err(|e| format!("`{x}` in `{s}` is not an integer ({e})"))?;
        if v < -1 {
            return Err(format!("window sides are -1 (unbounded) or >= 0, got {v}"));
        }
        Ok(v)
    };
    Ok(Window::from_flash_attn(side(l)?, side(r)?))
}

fn parse_softcap(s: &str) -> std::result::Result<f32, String> {
    let x: f32 = s
        .parse()
        .map_err(|e| format!("`{s}` is not a number ({e})"))?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err(format!("must be 0 (off) or positive and finite, got {s}"))
    }
}

/// `sinks` from the input file (if any) must hold one value per query head.
pub(super) fn check_sinks(
    sinks: Option<&[f32]>,
    p: &AttentionParams,
    input: &std::path::Path,
) -> Result<()> {
    match sinks {
        Some(s) if s.len() != p.heads_q => Err(Error::invalid(
            "sinks",
            format!(
                "`sinks` in {} has {} values, one per query head needs {}",
                input.display(),
                s.len(),
                p.heads_q
            ),
        )),
        _ => Ok(()),
    }
}

/// The float64 sinks of the reference.
pub(super) fn sinks_f64(sinks: Option<&[f32]>) -> Option<Vec<f64>> {
    sinks.map(|s| s.iter().map(|&x| x as f64).collect())
}

/// Appends to an invalid-argument error the shapes read from `input` as `p.layout`: shapes come
/// from the file, so say what was inferred, since a wrong --layout shows up here.
pub(super) fn with_inferred_shapes(e: Error, input: &Path, p: &AttentionParams) -> Error {
    match e {
        Error::InvalidArgument { arg, rule } => Error::InvalidArgument {
            arg,
            rule: format!(
                "{rule} (read from {} as {}: {})",
                input.display(),
                p.layout.name(),
                dims(p)
            ),
        },
        other => other,
    }
}

/// The shape as the CLI reports it: `B=.. Sq=.. Sk=.. Hq=.. Hkv=.. D=..`.
fn dims(p: &AttentionParams) -> String {
    format!(
        "B={} Sq={} Sk={} Hq={} Hkv={} D={}",
        p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim
    )
}

/// The window, softcap and sinks of a call for a success line: " window=L,R", " softcap=X", " sinks"
/// where present.
pub(super) fn features_note(p: &AttentionParams, sinks: bool) -> String {
    let mut s = String::new();
    if !p.window.is_unbounded() {
        let (l, r) = p.window.to_flash_attn();
        s += &format!(" window={l},{r}");
    }
    if p.softcap > 0.0 {
        s += &format!(" softcap={}", p.softcap);
    }
    if sinks {
        s += " sinks";
    }
    s
}

/// What ran, where and how long: the part of the success line that `attn` and `attn --grad`
/// share.
pub(super) fn run_summary(p: &AttentionParams, engine: &str, elapsed: Duration) -> String {
    format!(
        "{} {} {}{}{}{} scale={} on {engine} in {:.3} ms (wall, incl. setup)",
        dims(p),
        p.dtype.name(),
        p.layout.name(),
        if p.causal { " causal" } else { "" },
        if p.window.is_unbounded() {
            String::new()
        } else {
            let (l, r) = p.window.to_flash_attn();
            format!(" window={l},{r}")
        },
        if p.softcap > 0.0 {
            format!(" softcap={}", p.softcap)
        } else {
            String::new()
        },
        p.softmax_scale(),
        elapsed.as_secs_f64() * 1e3,
    )
}
