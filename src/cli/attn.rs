//! `flashcore attn`: attention on `q`, `k`, `v` read from a safetensors file, the result written
//! to another (`out`, and `lse` with `--lse`).
//!
//! Exit codes: 0 ok; 1 runtime errors (unreadable or malformed file, unsupported shape, no GPU);
//! 2 usage errors (reported by clap before anything runs).

pub use super::attn_args::AttnArgs;
use super::attn_args::{check_sinks, run_summary, with_inferred_shapes};
use crate::attention::{validate, AttentionParams, Context, Element};
use crate::error::{Error, Result};
use crate::reference;
use crate::tensor_io::{self, AttnInput, TensorData};
use std::time::Instant;

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
    // The window, softcap and sinks apply on every path: dense, KV cache, varlen.
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
