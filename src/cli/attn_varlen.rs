//! `flashcore attn` on a packed variable-length input: `q` `[total_q, Hq, D]`, `k`,
//! `v` `[total_k, Hkv, D]` (F16 or BF16) and `cu_seqlens_q`, `cu_seqlens_k` (I32 `[B + 1]`, flash-
//! attn's prefix sums). Checks the metadata on the host (a clear error before any launch), runs
//! `Context::attention_varlen_host` (or the float64 reference with --cpu) and writes `out`
//! (q's shape) and, with --lse, `lse` F32 `[Hq, total_q]`. With --grad it also reads
//! the output gradient `do` (q's shape and dtype), runs `Context::attention_varlen_backward` (or
//! the float64 reference's gradients) and writes `dq` (q's shape), `dk`, `dv` (k's shape).

use super::attn_args::AttnArgs;
use crate::attention::launch::varlen::{check_cu_seqlens, check_varlen};
use crate::attention::{validate, AttentionParams, Context, Element, Layout};
use crate::error::{Error, Result};
use crate::reference;
use crate::tensor_io::{self, Tensor, TensorData};
use std::collections::BTreeMap;
use std::path::Path;

/// Whether the file holds a packed varlen input (a tensor named `cu_seqlens_q`).
pub fn has_varlen(path: &Path) -> Result<bool> {
    Ok(tensor_io::tensor_names(path)?
        .iter()
        .any(|n| n == "cu_seqlens_q"))
}

fn bad(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::TensorFile(format!("{}: {msg}", path.display()))
}

/// The metadata array `name`: I32, 1-D.
fn read_cu(path: &Path, name: &str) -> Result<Vec<i32>> {
    let t = tensor_io::read_i32(path, name)?;
    if t.shape.len() != 1 {
        return Err(bad(
            path,
            format!("`{name}` must be 1-D [B + 1], got shape {:?}", t.shape),
        ));
    }
    Ok(t.values)
}

pub fn attn_varlen(args: &AttnArgs, sinks: Option<&[f32]>) -> Result<()> {
    let path = &args.input;
    if args.layout != Layout::Bshd {
        return Err(Error::invalid(
            "layout",
            "a varlen input is packed [total, heads, head_dim] (bshd) only",
        ));
    }
    let names = tensor_io::tensor_names(path)?;
    if !names.iter().any(|n| n == "cu_seqlens_k") {
        return Err(bad(
            path,
            "a varlen input needs `cu_seqlens_k` beside `cu_seqlens_q`",
        ));
    }
    let cu_q = read_cu(path, "cu_seqlens_q")?;
    let cu_k = read_cu(path, "cu_seqlens_k")?;
    let mut t: BTreeMap<String, Tensor> =
        tensor_io::read_file_except(path, &["cu_seqlens_q", "cu_seqlens_k"])?;
    let mut take = |n: &str| {
        t.remove(n)
            .ok_or_else(|| bad(path, format!("a varlen input needs a tensor `{n}`")))
    };
    let (q, k, v) = (take("q")?, take("k")?, take("v")?);
    let d_o = if args.grad {
        let d = take("do").map_err(|_| {
            bad(
                path,
                "--grad needs the output gradient `do` (q's shape and dtype) in the file",
            )
        })?;
        if d.shape != q.shape || d.data.dtype_name() != q.data.dtype_name() {
            return Err(bad(
                path,
                format!(
                    "tensor `do` is {:?} {} but `q` is {:?} {}; the output gradient has q's shape and dtype",
                    d.shape,
                    d.data.dtype_name(),
                    q.shape,
                    q.data.dtype_name()
                ),
            ));
        }
        Some(d)
    } else {
        None
    };
    for (n, x) in [("q", &q), ("k", &k), ("v", &v)] {
        if x.shape.len() != 3 {
            return Err(bad(
                path,
                format!(
                    "`{n}` must be 3-D [total, heads, head_dim], got {:?}",
                    x.shape
                ),
            ));
        }
    }
    let dtype = q.data.attention_dtype().ok_or_else(|| {
        bad(
            path,
            format!(
                "`q` has dtype {}; expected F16 or BF16",
                q.data.dtype_name()
            ),
        )
    })?;
    if k.data.dtype_name() != q.data.dtype_name() || v.data.dtype_name() != q.data.dtype_name() {
        return Err(bad(path, "q, k and v must share one dtype (F16 or BF16)"));
    }
    if k.shape != v.shape {
        return Err(bad(
            path,
            format!("`v` must have k's shape {:?}, got {:?}", k.shape, v.shape),
        ));
    }
    // The prefix sums' own rules first (the shapes below are derived from them); check_varlen
    // checks them again against the shape.
    let batch = cu_q.len().saturating_sub(1);
    check_cu_seqlens("cu_seqlens_q", &cu_q, batch, q.shape[0], usize::MAX)?;
    check_cu_seqlens("cu_seqlens_k", &cu_k, batch, k.shape[0], usize::MAX)?;
    let lens = |cu: &[i32]| {
        cu.windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0)
            .max(1)
    };
    let p = AttentionParams {
        batch,
        seqlen_q: lens(&cu_q),
        seqlen_k: lens(&cu_k),
        heads_q: q.shape[1],
        heads_kv: k.shape[1],
        head_dim: q.shape[2],
        dtype,
        layout: Layout::Bshd,
        causal: args.causal,
        scale: args.scale,
        // Per sequence, bottom-right aligned to its own counts.
        window: args.window.unwrap_or_default(),
        softcap: args.softcap.unwrap_or(0.0),
    };
    if k.shape[2] != p.head_dim {
        return Err(bad(
            path,
            format!("q has head dim {} but k has {}", p.head_dim, k.shape[2]),
        ));
    }
    validate::check_params(&p)?;
    if d_o.is_some() {
        crate::attention::backward::varlen::check_varlen_backward_params(&p)?;
    }
    super::attn_args::check_sinks(sinks, &p, &args.input)?;
    let (total_q, _) = check_varlen(
        &p,
        &cu_q,
        &cu_k,
        q.data.len(),
        [k.data.len(), v.data.len()],
        q.data.len(),
        Some(p.heads_q * q.shape[0]),
    )?;
    let start = std::time::Instant::now();
    let mut grads: Option<[TensorData; 3]> = None;
    let (out, lse, engine) = if args.cpu {
        if let Some(d) = &d_o {
            // The forward's sinks join every row's denominator: the gradients need them too.
            let (g, _) = reference::varlen_backward_f64_sinks(
                &p,
                &cu_q,
                &cu_k,
                [None, None],
                &q.data.to_f64(),
                &k.data.to_f64(),
                &v.data.to_f64(),
                &d.data.to_f64(),
                super::attn_args::sinks_f64(sinks).as_deref(),
            );
            let f = |x: Vec<f64>| TensorData::F32(x.into_iter().map(|v| v as f32).collect());
            grads = Some([f(g.dq), f(g.dk), f(g.dv)]);
        }
        let s64 = super::attn_args::sinks_f64(sinks);
        let r = reference::varlen_sinks_f64(
            &p,
            &cu_q,
            &cu_k,
            &q.data.to_f64(),
            &k.data.to_f64(),
            &v.data.to_f64(),
            s64.as_deref(),
        );
        let f32s = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
        (
            TensorData::F32(f32s(r.out)),
            f32s(r.lse),
            "cpu f64 reference".to_string(),
        )
    } else {
        let ordinal = args.device.unwrap_or(0);
        let ctx = Context::new(ordinal)?;
        let name = format!("GPU {ordinal} ({})", ctx.device_name());
        let cu = [cu_q.as_slice(), cu_k.as_slice()];
        match (&q.data, &k.data, &v.data, d_o.as_ref().map(|d| &d.data)) {
            (TensorData::F16(q), TensorData::F16(k), TensorData::F16(v), d) => {
                let (o, l) = launch(&ctx, &p, cu, q, k, v, total_q, sinks)?;
                if let Some(TensorData::F16(d)) = d {
                    let [a, b, c] = launch_grad(&ctx, &p, cu, [q, k, v, &o, d], &l)?;
                    grads = Some([TensorData::F16(a), TensorData::F16(b), TensorData::F16(c)]);
                }
                (TensorData::F16(o), l, name)
            }
            (TensorData::Bf16(q), TensorData::Bf16(k), TensorData::Bf16(v), d) => {
                let (o, l) = launch(&ctx, &p, cu, q, k, v, total_q, sinks)?;
                if let Some(TensorData::Bf16(d)) = d {
                    let [a, b, c] = launch_grad(&ctx, &p, cu, [q, k, v, &o, d], &l)?;
                    grads = Some([
                        TensorData::Bf16(a),
                        TensorData::Bf16(b),
                        TensorData::Bf16(c),
                    ]);
                }
                (TensorData::Bf16(o), l, name)
            }
            _ => return Err(bad(path, "q, k and v must share one dtype (F16 or BF16)")),
        }
    };
    let elapsed = start.elapsed();
    let out = Tensor {
        shape: q.shape.clone(),
        data: out,
    };
    let mut tensors: Vec<(&str, &Tensor)> = vec![("out", &out)];
    let lse = Tensor {
        shape: vec![p.heads_q, total_q],
        data: TensorData::F32(lse),
    };
    if args.lse {
        tensors.push(("lse", &lse));
    }
    let grad_tensors = grads.map(|[a, b, c]| {
        let t = |shape: &Vec<usize>, data| Tensor {
            shape: shape.clone(),
            data,
        };
        [t(&q.shape, a), t(&k.shape, b), t(&k.shape, c)]
    });
    if let Some([dq, dk, dv]) = &grad_tensors {
        tensors.extend([("dq", dq), ("dk", dk), ("dv", dv)]);
    }
    tensor_io::write_file(&args.output, &tensors, Some(tensor_io::attn_metadata(&p)))?;
    println!(
        "flashcore attn{}: varlen B={} total_q={total_q} total_k={} Hq={} Hkv={} D={} {}{}{} on {engine} in {:.3} ms (wall, incl. setup): wrote out{}{} to {}",
        if args.grad { " --grad" } else { "" },
        p.batch,
        k.shape[0],
        p.heads_q,
        p.heads_kv,
        p.head_dim,
        p.dtype.name(),
        if p.causal { " causal" } else { "" },
        super::attn_args::features_note(&p, sinks.is_some()),
        elapsed.as_secs_f64() * 1e3,
        if grad_tensors.is_some() {
            " and dq, dk, dv"
        } else {
            ""
        },
        if args.lse { " and lse F32 [Hq, total_q]" } else { "" },
        args.output.display()
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn launch<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    [cu_q, cu_k]: [&[i32]; 2],
    q: &[T],
    k: &[T],
    v: &[T],
    total_q: usize,
    sinks: Option<&[f32]>,
) -> Result<(Vec<T>, Vec<f32>)> {
    if total_q == 0 {
        return Ok((Vec::new(), Vec::new())); // no query anywhere: nothing to compute
    }
    let (dq, dk, dv) = (ctx.upload(q)?, ctx.upload(k)?, ctx.upload(v)?);
    let mut out = ctx.alloc::<T>(q.len())?;
    let mut lse = ctx.alloc::<f32>(p.heads_q * total_q)?;
    let dsinks = sinks.map(|s| ctx.upload(s)).transpose()?;
    ctx.attention_varlen_host_with_sinks(
        p,
        &dq,
        &dk,
        &dv,
        [cu_q, cu_k],
        dsinks.as_ref(),
        &mut out,
        Some(&mut lse),
    )?;
    let (o, l) = (ctx.download(&out)?, ctx.download(&lse)?);
    Ok((o, l))
}

/// The varlen backward on the GPU: dq, dk, dv from q, k, v, the forward's `o` and `lse`, and `do`
/// (`t` = [q, k, v, o, do]). No query or no key anywhere: zeros, nothing launched.
fn launch_grad<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    [cu_q, cu_k]: [&[i32]; 2],
    t: [&[T]; 5],
    lse: &[f32],
) -> Result<[Vec<T>; 3]> {
    let [q, k, v, o, d_o] = t;
    if q.is_empty() || k.is_empty() {
        return Ok([
            vec![T::from_f64(0.0); q.len()],
            vec![T::from_f64(0.0); k.len()],
            vec![T::from_f64(0.0); k.len()],
        ]);
    }
    let up = |x: &[T]| ctx.upload(x);
    let (dq_, dk_, dv_, o_, do_) = (up(q)?, up(k)?, up(v)?, up(o)?, up(d_o)?);
    let (cq, ck, l) = (ctx.upload(cu_q)?, ctx.upload(cu_k)?, ctx.upload(lse)?);
    let mut gq = ctx.alloc::<T>(q.len())?;
    let mut gk = ctx.alloc::<T>(k.len())?;
    let mut gv = ctx.alloc::<T>(k.len())?;
    ctx.attention_varlen_backward(
        p,
        &dq_,
        &dk_,
        &dv_,
        &cq,
        &ck,
        [None, None],
        &o_,
        &l,
        &do_,
        &mut gq,
        &mut gk,
        &mut gv,
    )?;
    Ok([ctx.download(&gq)?, ctx.download(&gk)?, ctx.download(&gv)?])
}
