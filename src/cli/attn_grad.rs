//! `flashcore attn --grad`: the forward and the backward pass on `q`, `k`, `v` and the output
//! gradient `do` read from one safetensors file; writes `out`, `dq`, `dk`, `dv` (and `lse` with
//! `--lse`). On the GPU the gradients are the input dtype; with `--cpu` the float64 reference's,
//! as F32. The `--window`, `--softcap` and learnable `sinks` (F32 [Hq] in the file) apply
//! as in the forward; with sinks their gradient `dsink` (F32 [Hq]) is written too. Exit codes as
//! `flashcore attn`'s.

use super::attn_args::{check_sinks, run_summary, with_inferred_shapes, AttnArgs};
use crate::attention::backward::check_backward_params;
use crate::attention::{AttentionParams, Context, Element};
use crate::error::{Error, Result};
use crate::reference;
use crate::tensor_io::{self, AttnInput, Tensor, TensorData};
use std::path::Path;
use std::time::Instant;

/// `out`, `lse`, `dq`, `dk`, `dv` of one call.
struct GradOutputs {
    out: TensorData,
    lse: Vec<f32>,
    dq: TensorData,
    dk: TensorData,
    dv: TensorData,
    /// The sinks' gradient, F32 [Hq] (calls with sinks only).
    dsink: Option<Vec<f32>>,
}

pub fn attn_grad(args: &AttnArgs, sinks: Option<&[f32]>) -> Result<()> {
    crate::output::check_not_an_input(&args.output, &[&args.input])?;
    if crate::tensor_io_kv::has_kv_cache(&args.input)? {
        return Err(Error::invalid(
            "grad",
            "--grad takes q, k, v and do; a KV-cache input (k_cache, v_cache) has no backward pass",
        ));
    }
    if super::attn_varlen::has_varlen(&args.input)? {
        // Packed sequences with cu_seqlens: the varlen backward.
        return super::attn_varlen::attn_varlen(args, None);
    }
    let input = tensor_io::read_attn_input(&args.input, args.layout)?;
    let d_o = read_d_o(&args.input, &input)?;
    let p = AttentionParams {
        causal: args.causal,
        scale: args.scale,
        window: args.window.unwrap_or_default(),
        softcap: args.softcap.unwrap_or(0.0),
        ..input.params.clone()
    };
    check_backward_params(&p).map_err(|e| with_inferred_shapes(e, &args.input, &p))?;
    check_sinks(sinks, &p, &args.input)?;
    let start = Instant::now();
    let (g, engine) = if args.cpu {
        (
            cpu(&p, &input, &d_o, sinks),
            "cpu f64 reference".to_string(),
        )
    } else {
        gpu(args.device.unwrap_or(0), &p, &input, &d_o, sinks)?
    };
    let elapsed = start.elapsed();
    let dtype = g.out.dtype_name();
    let l = p.layout;
    let q_shape = l.shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim).to_vec();
    let k_shape = l
        .shape(p.batch, p.seqlen_k, p.heads_kv, p.head_dim)
        .to_vec();
    let t = |shape: &Vec<usize>, data: TensorData| Tensor {
        shape: shape.clone(),
        data,
    };
    let (out, dq, dk, dv) = (
        t(&q_shape, g.out),
        t(&q_shape, g.dq),
        t(&k_shape, g.dk),
        t(&k_shape, g.dv),
    );
    let dsink = g.dsink.map(|d| t(&vec![p.heads_q], TensorData::F32(d)));
    let mut tensors = vec![("out", &out), ("dq", &dq), ("dk", &dk), ("dv", &dv)];
    if let Some(d) = &dsink {
        tensors.push(("dsink", d));
    }
    tensor_io::write_attn_tensors(&args.output, &p, &tensors, args.lse.then_some(g.lse))?;
    println!(
        "flashcore attn --grad: {}{}: wrote out, dq {q_shape:?} and dk, dv {k_shape:?} {dtype}{}{} to {}",
        run_summary(&p, &engine, elapsed),
        super::attn_args::features_note(&p, sinks.is_some()),
        if dsink.is_some() { ", dsink F32" } else { "" },
        if args.lse { " and lse F32" } else { "" },
        args.output.display()
    );
    Ok(())
}

/// The output gradient `do`: present, q's dtype and q's shape.
fn read_d_o(path: &Path, input: &AttnInput) -> Result<TensorData> {
    let bad = |msg: String| Error::TensorFile(format!("{}: {msg}", path.display()));
    let mut all = tensor_io::read_file(path)?;
    let names: Vec<String> = all.keys().cloned().collect();
    let d_o = all.remove("do").ok_or_else(|| {
        bad(format!(
            "--grad needs the output gradient `do` (q's shape and dtype) in the file; it holds {}",
            names.join(", ")
        ))
    })?;
    if d_o.data.dtype_name() != input.q.dtype_name() {
        return Err(bad(format!(
            "tensor `do` has dtype {} but `q` has {}; they must match",
            d_o.data.dtype_name(),
            input.q.dtype_name()
        )));
    }
    let p = &input.params;
    let q_shape = p
        .layout
        .shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim)
        .to_vec();
    if d_o.shape != q_shape {
        return Err(bad(format!(
            "tensor `do` has shape {:?} but `q` has {q_shape:?}; the output gradient has q's shape",
            d_o.shape
        )));
    }
    Ok(d_o.data)
}

fn cpu(
    p: &AttentionParams,
    input: &AttnInput,
    d_o: &TensorData,
    sinks: Option<&[f32]>,
) -> GradOutputs {
    let (q, k, v) = (input.q.to_f64(), input.k.to_f64(), input.v.to_f64());
    let s64 = super::attn_args::sinks_f64(sinks);
    let fwd = reference::attention_f64_sinks(p, &q, &k, &v, s64.as_deref());
    let (g, dsink) =
        reference::attention_backward_f64_sinks(p, &q, &k, &v, &d_o.to_f64(), s64.as_deref());
    let f32s = |x: Vec<f64>| TensorData::F32(x.into_iter().map(|v| v as f32).collect());
    GradOutputs {
        out: f32s(fwd.out),
        lse: fwd.lse.into_iter().map(|v| v as f32).collect(),
        dq: f32s(g.dq),
        dk: f32s(g.dk),
        dv: f32s(g.dv),
        dsink: sinks.map(|_| dsink.into_iter().map(|v| v as f32).collect()),
    }
}

fn gpu(
    ordinal: usize,
    p: &AttentionParams,
    input: &AttnInput,
    d_o: &TensorData,
    sinks: Option<&[f32]>,
) -> Result<(GradOutputs, String)> {
    let ctx = Context::new(ordinal)?;
    let name = format!("GPU {ordinal} ({})", ctx.device_name());
    let g = match (&input.q, &input.k, &input.v, d_o) {
        (TensorData::F16(q), TensorData::F16(k), TensorData::F16(v), TensorData::F16(d)) => {
            let (o, l, dq, dk, dv, dsink) = launch(&ctx, p, q, k, v, d, sinks)?;
            GradOutputs {
                out: TensorData::F16(o),
                lse: l,
                dq: TensorData::F16(dq),
                dk: TensorData::F16(dk),
                dv: TensorData::F16(dv),
                dsink,
            }
        }
        (TensorData::Bf16(q), TensorData::Bf16(k), TensorData::Bf16(v), TensorData::Bf16(d)) => {
            let (o, l, dq, dk, dv, dsink) = launch(&ctx, p, q, k, v, d, sinks)?;
            GradOutputs {
                out: TensorData::Bf16(o),
                lse: l,
                dq: TensorData::Bf16(dq),
                dk: TensorData::Bf16(dk),
                dv: TensorData::Bf16(dv),
                dsink,
            }
        }
        // read_attn_input and read_d_o guarantee one 16-bit dtype for all four.
        _ => {
            return Err(Error::TensorFile(
                "q, k, v and do must share one dtype (F16 or BF16)".into(),
            ))
        }
    };
    Ok((g, name))
}

type Launched<T> = (Vec<T>, Vec<f32>, Vec<T>, Vec<T>, Vec<T>, Option<Vec<f32>>);

fn launch<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
    sinks: Option<&[f32]>,
) -> Result<Launched<T>> {
    let (q, k, v, d_o) = (
        ctx.upload(q)?,
        ctx.upload(k)?,
        ctx.upload(v)?,
        ctx.upload(d_o)?,
    );
    let mut out = ctx.alloc::<T>(p.q_len())?;
    let mut lse = ctx.alloc::<f32>(p.lse_len())?;
    let mut dq = ctx.alloc::<T>(p.q_len())?;
    let mut dk = ctx.alloc::<T>(p.kv_len())?;
    let mut dv = ctx.alloc::<T>(p.kv_len())?;
    let dsink = match sinks {
        Some(s) => {
            let s = ctx.upload(s)?;
            let mut ds = ctx.alloc::<f32>(p.heads_q)?;
            ctx.attention_with_sinks(p, &q, &k, &v, &mut out, Some(&mut lse), &s)?;
            ctx.attention_backward_with_sinks(
                p,
                &q,
                &k,
                &v,
                &out,
                Some(&lse),
                &d_o,
                &s,
                &mut dq,
                &mut dk,
                &mut dv,
                &mut ds,
            )?;
            Some(ctx.download(&ds)?)
        }
        None => {
            ctx.attention(p, &q, &k, &v, &mut out, Some(&mut lse))?;
            ctx.attention_backward(
                p,
                &q,
                &k,
                &v,
                &out,
                Some(&lse),
                &d_o,
                &mut dq,
                &mut dk,
                &mut dv,
            )?;
            None
        }
    };
    Ok((
        ctx.download(&out)?,
        ctx.download(&lse)?,
        ctx.download(&dq)?,
        ctx.download(&dk)?,
        ctx.download(&dv)?,
        dsink,
    ))
}
