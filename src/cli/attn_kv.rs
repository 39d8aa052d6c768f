//! `flashcore attn` on a KV-cache input (`k_cache`, `v_cache`, `cache_seqlens`, optional new
//! `k`, `v`; `src/tensor_io_kv.rs`): append the new rows at each sequence's length, then attend
//! with the new queries to the first `cache_seqlens[b] + n` rows. Writes `out` (and `lse`) and
//! the updated caches, so steps can be chained. A `block_table` makes the caches page pools.

use super::attn_args::AttnArgs;
use crate::attention::{validate, AttentionParams, Context, Element, KvCache, Layout};
use crate::error::{Error, Result};
use crate::reference;
use crate::tensor_io::{self, Tensor, TensorData};
use crate::tensor_io_kv::{self, KvInput};

pub fn attn_kv(args: &AttnArgs, sinks: Option<&[f32]>) -> Result<()> {
    if args.layout != Layout::Bshd {
        return Err(Error::invalid(
            "layout",
            "a KV-cache input is bshd ([B, S, H, D]) only",
        ));
    }
    let mut input = tensor_io_kv::read_kv_input(&args.input)?;
    let p = AttentionParams {
        causal: args.causal,
        scale: args.scale,
        window: args.window.unwrap_or_default(),
        softcap: args.softcap.unwrap_or(0.0),
        ..input.params.clone()
    };
    validate::check_params(&p)?;
    validate::check_kv_cache(&p)?;
    super::attn_args::check_sinks(sinks, &p, &args.input)?;
    let n = input.new_kv.as_ref().map_or(0, |(_, _, n)| *n);
    let counts: Vec<usize> = input.cache_seqlens.iter().map(|&l| l + n).collect();
    let (out, lse, engine) = if args.cpu {
        append_host(&mut input, &p);
        let (o, l) = cpu(&p, &input, &counts, sinks);
        (TensorData::F32(o), l, "cpu f64 reference".to_string())
    } else {
        gpu(args.device.unwrap_or(0), &p, &mut input, &counts, sinks)?
    };
    let shape = |s: usize, h: usize| vec![p.batch, s, h, p.head_dim];
    let out = Tensor {
        shape: shape(p.seqlen_q, p.heads_q),
        data: out,
    };
    // The caches as they came: [B, capacity, ...], or the pools.
    let cache_shape = match &input.block_table {
        Some((_, pg)) => vec![pg.num_pages, pg.page_size, p.heads_kv, p.head_dim],
        None => shape(p.seqlen_k, p.heads_kv),
    };
    let kc = Tensor {
        shape: cache_shape.clone(),
        data: input.k_cache,
    };
    let vc = Tensor {
        shape: cache_shape,
        data: input.v_cache,
    };
    tensor_io::write_attn_tensors(
        &args.output,
        &p,
        &[("out", &out), ("k_cache", &kc), ("v_cache", &vc)],
        args.lse.then_some(lse),
    )?;
    println!(
        "flashcore attn: KV cache B={} Sq={} capacity={} appended {n} row(s) Hq={} Hkv={} D={} {}{}{} on {engine}: wrote out, k_cache, v_cache{} to {}",
        p.batch,
        p.seqlen_q,
        p.seqlen_k,
        p.heads_q,
        p.heads_kv,
        p.head_dim,
        p.dtype.name(),
        if p.causal { " causal" } else { "" },
        super::attn_args::features_note(&p, sinks.is_some()),
        if args.lse { ", lse" } else { "" },
        args.output.display()
    );
    Ok(())
}

/// The append on host copies (the CPU path; the GPU path appends on the device).
fn append_host(input: &mut KvInput, p: &AttentionParams) {
    let Some((k, v, n)) = input.new_kv.take() else {
        return;
    };
    let row = p.heads_kv * p.head_dim;
    for b in 0..p.batch {
        for i in 0..n {
            let dst = input.row_offset(b, input.cache_seqlens[b] + i);
            let src = (b * n + i) * row;
            input.k_cache.copy_range(dst, &k, src, row);
            input.v_cache.copy_range(dst, &v, src, row);
        }
    }
}

/// A paged cache gathered into the contiguous `[B, capacity, Hkv, D]` form. Only each sequence's
/// first `counts[b]` rows are read (the rest stay zero): the table's slots past them were never
/// checked against the pool and may hold anything.
fn contiguous_f64(input: &KvInput, pool: &TensorData, counts: &[usize]) -> Vec<f64> {
    let p = &input.params;
    let row = p.heads_kv * p.head_dim;
    let all = pool.to_f64();
    if input.block_table.is_none() {
        return all;
    }
    let mut out = vec![0.0; p.batch * p.seqlen_k * row];
    for (b, &count) in counts.iter().enumerate() {
        for r in 0..count {
            let src = input.row_offset(b, r);
            let dst = (b * p.seqlen_k + r) * row;
            out[dst..dst + row].copy_from_slice(&all[src..src + row]);
        }
    }
    out
}

/// The float64 reference ([`reference::kv_cache_sinks_f64`]: window, softcap, sinks), written
/// as f32.
fn cpu(
    p: &AttentionParams,
    input: &KvInput,
    counts: &[usize],
    sinks: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let s64 = super::attn_args::sinks_f64(sinks);
    let r = reference::kv_cache_sinks_f64(
        p,
        &input.q.to_f64(),
        &contiguous_f64(input, &input.k_cache, counts),
        &contiguous_f64(input, &input.v_cache, counts),
        &vec![0; counts.len()],
        counts,
        s64.as_deref(),
    );
    let f32s = |x: Vec<f64>| x.into_iter().map(|v| v as f32).collect();
    (f32s(r.out), f32s(r.lse))
}

fn gpu(
    ordinal: usize,
    p: &AttentionParams,
    input: &mut KvInput,
    counts: &[usize],
    sinks: Option<&[f32]>,
) -> Result<(TensorData, Vec<f32>, String)> {
    let ctx = Context::new(ordinal)?;
    let dsinks = sinks.map(|s| ctx.upload(s)).transpose()?;
    let name = format!("GPU {ordinal} ({})", ctx.device_name());
    let new = input.new_kv.take();
    let lens = input.cache_seqlens.clone();
    let table = input.block_table.clone();
    macro_rules! run {
        ($variant:ident) => {{
            let (TensorData::$variant(q), TensorData::$variant(kc), TensorData::$variant(vc)) =
                (&input.q, &mut input.k_cache, &mut input.v_cache)
            else {
                return Err(Error::TensorFile(
                    "q and the caches must share one dtype".into(),
                ));
            };
            let new = match &new {
                Some((TensorData::$variant(k), TensorData::$variant(v), _)) => Some((k, v)),
                Some(_) => return Err(Error::TensorFile("k and v must have q's dtype".into())),
                None => None,
            };
            let (o, l) = launch(
                &ctx,
                p,
                q,
                kc,
                vc,
                new,
                &lens,
                counts,
                table.as_ref(),
                dsinks.as_ref(),
            )?;
            (TensorData::$variant(o), l)
        }};
    }
    let (out, lse) = match &input.q {
        TensorData::F16(_) => run!(F16),
        TensorData::Bf16(_) => run!(Bf16),
        TensorData::F32(_) => return Err(Error::TensorFile("q must be F16 or BF16".into())),
    };
    Ok((out, lse, name))
}

/// Appends on the device, attends, and downloads the output, the LSE and the updated caches
/// (written back into `kc`, `vc`).
#[allow(clippy::too_many_arguments)]
fn launch<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    kc: &mut Vec<T>,
    vc: &mut Vec<T>,
    new: Option<(&Vec<T>, &Vec<T>)>,
    lens: &[usize],
    counts: &[usize],
    table: Option<&(Vec<i32>, crate::attention::Pages)>,
    sinks: Option<&cudarc::driver::CudaSlice<f32>>,
) -> Result<(Vec<T>, Vec<f32>)> {
    let dq = ctx.upload(q)?;
    let (mut dk, mut dv) = (ctx.upload(kc)?, ctx.upload(vc)?);
    let host_pages = table.map(|(t, pg)| (t.as_slice(), *pg));
    if let Some((k, v)) = new {
        ctx.append_kv(p, &mut dk, &ctx.upload(k)?, lens, host_pages)?;
        ctx.append_kv(p, &mut dv, &ctx.upload(v)?, lens, host_pages)?;
    }
    let dl = ctx.upload(&counts.iter().map(|&c| c as i32).collect::<Vec<_>>())?;
    let dt = match table {
        Some((t, _)) => Some(ctx.upload(t)?),
        None => None,
    };
    let mut out = ctx.alloc::<T>(p.q_len())?;
    let mut lse = ctx.alloc::<f32>(p.lse_len())?;
    let cache = match (&dt, table) {
        (Some(dt), Some((_, pg))) => KvCache::paged(&dk, &dv, &dl, dt, *pg),
        _ => KvCache::contiguous(&dk, &dv, &dl),
    };
    let cache = match sinks {
        Some(s) => cache.sinks(s),
        None => cache,
    };
    ctx.attention_kv_cache(p, &dq, &cache, &mut out, Some(&mut lse))?;
    *kc = ctx.download(&dk)?;
    *vc = ctx.download(&dv)?;
    Ok((ctx.download(&out)?, ctx.download(&lse)?))
}
