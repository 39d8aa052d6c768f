//! `flashcore attn`: attention on `q`, `k`, `v` read from a safetensors file, the result written
//! to another (`out`, and `lse` with `--lse`).
//!
//! Exit codes: 0 ok; 1 runtime errors (unreadable or malformed file, unsupported shape, no GPU);
//! 2 usage errors (reported by clap before anything runs).

use crate::attention::{validate, AttentionParams, Context, Element, Layout, Window};
use crate::error::{Error, Result};
use crate::reference;
use crate::tensor_io::{self, AttnInput, TensorData};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

pub fn run(args: AttnArgs) -> i32 {
    match attn(&args) {
        Ok(()) => 0,
        Err(e) => super::fail(1, e),
    }
}

fn attn(args: &AttnArgs) -> Result<()> {
    crate::output::check_not_an_input(&args.output, &[&args.input])?;
    let sinks = tensor_io::read_sinks(&args.input)?;
    if args.grad {
        return super::attn_grad::attn_grad(args, sinks.as_deref());
    }
    // Issue 24's features apply on every path: dense, KV cache, varlen.
    if crate::tensor_io_kv::has_kv_cache(&args.input)? {
        return super::attn_kv::attn_kv(args, sinks.as_deref());
    }
    if super::attn_varlen::has_varlen(&args.input)? {
        return super::attn_varlen::attn_varlen(args, sinks.as_deref());
    }
    let input = tensor_io::read_attn_input(&args.input, args.layout)?;
    // NaN/Inf inputs are outside the contract (they propagate into the rows they reach): say so,
    // and go on.
    for (name, t) in [("q", &input.q), ("k", &input.k), ("v", &input.v)] {
        let bad = t.count_non_finite();
        if bad > 0 {
            eprintln!(
                "flashcore: warning: `{name}` in {} holds {bad} NaN/Inf value(s) of {}; outputs in the rows they reach will be NaN (README, Numerics)",
                args.input.display(),
                t.len()
            );
        }
    }
    let p = AttentionParams {
        causal: args.causal,
        scale: args.scale,
        window: args.window.unwrap_or_default(),
        softcap: args.softcap.unwrap_or(0.0),
        ..input.params.clone()
    };
    validate::check_params(&p).map_err(|e| with_inferred_shapes(e, &args.input, &p))?;
    check_sinks(sinks.as_deref(), &p, &args.input)?;
    let start = Instant::now();
    let (out, lse, engine) = if args.cpu {
        let s64: Option<Vec<f64>> = sinks
            .as_ref()
            .map(|s| s.iter().map(|&x| x as f64).collect());
        let r = reference::attention_f64_sinks(
            &p,
            &input.q.to_f64(),
            &input.k.to_f64(),
            &input.v.to_f64(),
            s64.as_deref(),
        );
        let f32s = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
        (
            TensorData::F32(f32s(r.out)),
            f32s(r.lse),
            "cpu f64 reference".to_string(),
        )
    } else {
        gpu(args.device.unwrap_or(0), &p, &input, sinks.as_deref())?
    };
    let elapsed = start.elapsed();
    let (out_dtype, shape) = (
        out.dtype_name(),
        p.layout.shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim),
    );
    tensor_io::write_attn_output(&args.output, &p, out, args.lse.then_some(lse))?;
    println!(
        "flashcore attn: {}: wrote out {shape:?} {out_dtype}{} to {}",
        run_summary(&p, &engine, elapsed),
        if args.lse { " and lse F32" } else { "" },
        args.output.display()
    );
    Ok(())
}

/// Runs the kernel on device `ordinal`; returns `out` in the input dtype, the LSE and a
/// description of the device.
fn gpu(
    ordinal: usize,
    p: &AttentionParams,
    input: &AttnInput,
    sinks: Option<&[f32]>,
) -> Result<(TensorData, Vec<f32>, String)> {
    let ctx = Context::new(ordinal)?;
    let name = format!("GPU {ordinal} ({})", ctx.device_name());
    Ok(match (&input.q, &input.k, &input.v) {
        (TensorData::F16(q), TensorData::F16(k), TensorData::F16(v)) => {
            let (o, l) = launch(&ctx, p, q, k, v, sinks)?;
            (TensorData::F16(o), l, name)
        }
        (TensorData::Bf16(q), TensorData::Bf16(k), TensorData::Bf16(v)) => {
            let (o, l) = launch(&ctx, p, q, k, v, sinks)?;
            (TensorData::Bf16(o), l, name)
        }
        // read_attn_input guarantees one 16-bit dtype for all three.
        _ => {
            return Err(Error::TensorFile(
                "q, k and v must share one dtype (F16 or BF16)".into(),
            ))
        }
    })
}

fn launch<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: Option<&[f32]>,
) -> Result<(Vec<T>, Vec<f32>)> {
    let (dq, dk, dv) = (ctx.upload(q)?, ctx.upload(k)?, ctx.upload(v)?);
    let mut out = ctx.alloc::<T>(p.q_len())?;
    let mut lse = ctx.alloc::<f32>(p.lse_len())?;
    match sinks {
        Some(s) => {
            let ds = ctx.upload(s)?;
            ctx.attention_with_sinks(p, &dq, &dk, &dv, &mut out, Some(&mut lse), &ds)?
        }
        None => ctx.attention(p, &dq, &dk, &dv, &mut out, Some(&mut lse))?,
    }
    Ok((ctx.download(&out)?, ctx.download(&lse)?))
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

/// Issue 24's features of a call for a success line: " window=L,R", " softcap=X", " sinks"
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
