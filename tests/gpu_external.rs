//! The caller-owned-memory API (`attention::external`) on the GPU: strided inputs and outputs
//! give the same bits as contiguous ones, and padding around a strided output is never written.

mod common;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use flashcore::attention::external::{DeviceTensor, ExternalCall, ExternalContext, Strides};
use flashcore::attention::{AttentionParams, Layout};
use half::f16;

/// Copies a contiguous bshd tensor into rows of `d + pad` elements (padding set to `fill`).
fn padded(x: &[f16], rows: usize, d: usize, pad: usize, fill: f16) -> Vec<f16> {
    let mut out = vec![fill; rows * (d + pad)];
    for r in 0..rows {
        out[r * (d + pad)..r * (d + pad) + d].copy_from_slice(&x[r * d..(r + 1) * d]);
    }
    out
}

#[test]
fn strided_inputs_and_output_match_contiguous_bits() {
    let Some(ctx) = common::gpu("strided_inputs_and_output_match_contiguous_bits") else {
        return;
    };
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    let seed = common::seed();
    eprintln!("seed {seed}");
    let mut rng = common::rng_from(seed);
    for causal in [false, true] {
        let p = AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 4, 100, 64)
                .seqlen_k(130)
                .causal(causal)
        };
        let (q, k, v): (Vec<f16>, Vec<f16>, Vec<f16>) = (
            common::randn(&mut rng, p.q_len()),
            common::randn(&mut rng, p.kv_len()),
            common::randn(&mut rng, p.kv_len()),
        );
        let (want, _) = common::launch_unchecked(&ctx, &p, &q, &k, &v);

        // Every row padded by 64 elements of NaN: read through strides, never touched.
        let (d, pad) = (p.head_dim, 64);
        let nan = common::poison::<f16>();
        let q_rows = p.batch * p.seqlen_q * p.heads_q;
        let kv_rows = p.batch * p.seqlen_k * p.heads_kv;
        let dq = ctx.upload(&padded(&q, q_rows, d, pad, nan)).unwrap();
        let dk = ctx.upload(&padded(&k, kv_rows, d, pad, nan)).unwrap();
        let dv = ctx.upload(&padded(&v, kv_rows, d, pad, nan)).unwrap();
        let mut dout = ctx.upload(&vec![nan; q_rows * (d + pad)]).unwrap();
        let st = |s: usize, h: usize| Strides {
            batch: (s * h * (d + pad)) as i64,
            seq: (h * (d + pad)) as i64,
            head: (d + pad) as i64,
        };
        let stream = ctx.stream();
        let (qp, _g1) = dq.device_ptr(stream);
        let (kp, _g2) = dk.device_ptr(stream);
        let (vp, _g3) = dv.device_ptr(stream);
        let (op, _g4) = dout.device_ptr_mut(stream);
        let t = |ptr, strides| DeviceTensor { ptr, strides };
        let call = ExternalCall::new(
            p.clone(),
            t(qp, st(p.seqlen_q, p.heads_q)),
            t(kp, st(p.seqlen_k, p.heads_kv)),
            t(vp, st(p.seqlen_k, p.heads_kv)),
            t(op, st(p.seqlen_q, p.heads_q)),
        );
        // SAFETY: the buffers cover every element the strides reach and live past the sync.
        unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
        drop((_g1, _g2, _g3, _g4));
        let got = ctx.download(&dout).unwrap();
        for r in 0..q_rows {
            let row = &got[r * (d + pad)..(r + 1) * (d + pad)];
            let want_row = &want[r * d..(r + 1) * d];
            assert!(
                row[..d]
                    .iter()
                    .zip(want_row)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "causal={causal}: row {r} differs from the contiguous launch"
            );
            assert!(
                row[d..].iter().all(|x| x.to_bits() == nan.to_bits()),
                "causal={causal}: padding of row {r} was written"
            );
        }
    }
}

#[test]
fn contiguous_external_call_matches_context_attention() {
    let Some(ctx) = common::gpu("contiguous_external_call_matches_context_attention") else {
        return;
    };
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    let mut rng = common::rng_from(common::seed());
    let p = AttentionParams::new(1, 8, 512, 128).layout(Layout::Bhsd);
    let (q, k, v): (Vec<f16>, Vec<f16>, Vec<f16>) = (
        common::randn(&mut rng, p.q_len()),
        common::randn(&mut rng, p.kv_len()),
        common::randn(&mut rng, p.kv_len()),
    );
    let (want, want_lse) = common::launch_unchecked(&ctx, &p, &q, &k, &v);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&k).unwrap(),
        ctx.upload(&v).unwrap(),
    );
    let mut dout = ctx.alloc::<f16>(p.q_len()).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    let s = Strides::contiguous(Layout::Bhsd, 512, 8, 128);
    let stream = ctx.stream();
    let (qp, _g1) = dq.device_ptr(stream);
    let (kp, _g2) = dk.device_ptr(stream);
    let (vp, _g3) = dv.device_ptr(stream);
    let (op, _g4) = dout.device_ptr_mut(stream);
    let (lp, _g5) = dlse.device_ptr_mut(stream);
    let t = |ptr| DeviceTensor { ptr, strides: s };
    let call = ExternalCall::new(p.clone(), t(qp), t(kp), t(vp), t(op)).lse(lp);
    // SAFETY: contiguous buffers of the call's shape, alive past the sync below.
    unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
    drop((_g1, _g2, _g3, _g4, _g5));
    let got = ctx.download(&dout).unwrap();
    let got_lse = ctx.download(&dlse).unwrap();
    assert!(got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(got_lse
        .iter()
        .zip(&want_lse)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn invalid_call_is_rejected_before_launch() {
    let Some(_ctx) = common::gpu("invalid_call_is_rejected_before_launch") else {
        return;
    };
    let ext = ExternalContext::new(0).unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let s = Strides::contiguous(Layout::Bshd, 8, 2, 64);
    let t = |ptr| DeviceTensor { ptr, strides: s };
    // Misaligned q: the typed error comes from validation; nothing is launched.
    let call = ExternalCall::new(p, t(0x1008), t(0x2000), t(0x3000), t(0x4000));
    // SAFETY: validation rejects the call before any pointer is used.
    let err = unsafe { ext.attention(&call, std::ptr::null_mut()) }.unwrap_err();
    assert!(err.to_string().contains("`q`"), "{err}");
}

/// Creating an external context, preparing a shape and launching leave the thread's current
/// CUDA context as the caller had it (none here): the CUDA runtime — torch — reads its current
/// device from it (found on a 2-GPU machine: a call on cuda:1 left device 1 current).
#[test]
fn the_callers_current_context_is_left_alone() {
    use cudarc::driver::result::ctx;
    let Some(own) = common::gpu("the_callers_current_context_is_left_alone") else {
        return;
    };
    let p = AttentionParams::new(1, 2, 64, 64);
    let (dq, mut dout) = (
        own.upload(&vec![f16::from_f32(0.5); p.q_len()]).unwrap(),
        own.alloc::<f16>(p.q_len()).unwrap(),
    );
    own.synchronize().unwrap();
    // SAFETY: null unbinds the thread's context.
    unsafe { ctx::set_current(std::ptr::null_mut()) }.unwrap();
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    assert_eq!(
        ctx::get_current().unwrap(),
        None,
        "ExternalContext::new bound a context"
    );
    ext.prepare(&p, false).unwrap();
    assert_eq!(ctx::get_current().unwrap(), None, "prepare bound a context");
    let s = Strides::contiguous(Layout::Bshd, 64, 2, 64);
    {
        let stream = own.stream();
        let (qp, _g1) = dq.device_ptr(stream);
        let (op, _g2) = dout.device_ptr_mut(stream);
        // cudarc's pointer access binds its own context: unbind again before the call.
        unsafe { ctx::set_current(std::ptr::null_mut()) }.unwrap();
        let t = |ptr| DeviceTensor { ptr, strides: s };
        let call = ExternalCall::new(p.clone(), t(qp), t(qp), t(qp), t(op));
        // SAFETY: buffers of the call's shape on device 0, alive past the sync below.
        unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
        assert_eq!(
            ctx::get_current().unwrap(),
            None,
            "attention bound a context"
        );
    }
    own.synchronize().unwrap();
    let out = own.download(&dout).unwrap();
    assert!(
        out.iter().all(|x| (x.to_f32() - 0.5).abs() < 1e-3),
        "attention of constant V"
    );
}

/// One KV-cache call through `ExternalCall` with its new rows, or `None` for the plain call:
/// (output, caches after the call, counts the append wrote).
struct AppendRun {
    out: Vec<f16>,
    k_cache: Vec<f16>,
    v_cache: Vec<f16>,
    counts: Vec<i32>,
}

#[allow(clippy::too_many_arguments)]
fn kv_call(
    ctx: &flashcore::attention::Context,
    ext: &ExternalContext,
    p: &AttentionParams,
    q: &[f16],
    caches: (&[f16], &[f16]),
    new_kv: Option<(&[f16], &[f16])>,
    lens: &[i32],
    paged: Option<(&[i32], flashcore::attention::Pages)>,
) -> AppendRun {
    use flashcore::attention::kv_append::KvAppend;
    let (pool_rows, cache_seq) = match paged {
        Some((_, pg)) => (pg.page_size, pg.page_size),
        None => (p.seqlen_k, p.seqlen_k),
    };
    let _ = pool_rows;
    let stream = ctx.stream();
    let dq = ctx.upload(q).unwrap();
    let mut dk = ctx.upload(caches.0).unwrap();
    let mut dv = ctx.upload(caches.1).unwrap();
    let dlens = ctx.upload(lens).unwrap();
    let mut dcounts = ctx.upload(&vec![-7i32; p.batch]).unwrap();
    let mut dout = ctx.upload(&vec![f16::NAN; p.q_len()]).unwrap();
    let new = new_kv.map(|(k, v)| (ctx.upload(k).unwrap(), ctx.upload(v).unwrap()));
    let table = paged.map(|(t, _)| ctx.upload(t).unwrap());
    {
        let (qp, _g1) = dq.device_ptr(stream);
        let (kp, _g2) = dk.device_ptr_mut(stream);
        let (vp, _g3) = dv.device_ptr_mut(stream);
        let (lp, _g4) = dlens.device_ptr(stream);
        let (cp, _g5) = dcounts.device_ptr_mut(stream);
        let (op, _g6) = dout.device_ptr_mut(stream);
        let qs = Strides::contiguous(Layout::Bshd, p.seqlen_q, p.heads_q, p.head_dim);
        let ks = Strides::contiguous(Layout::Bshd, cache_seq, p.heads_kv, p.head_dim);
        let t = |ptr, strides| DeviceTensor { ptr, strides };
        let mut call =
            ExternalCall::new(p.clone(), t(qp, qs), t(kp, ks), t(vp, ks), t(op, qs)).kv_lengths(lp);
        let _g7 = new.as_ref().map(|(k, v)| {
            let (nk, gk) = k.device_ptr(stream);
            let (nv, gv) = v.device_ptr(stream);
            let ns = Strides::contiguous(Layout::Bshd, p.seqlen_q, p.heads_kv, p.head_dim);
            call = call.clone().append(KvAppend {
                k: t(nk, ns),
                v: t(nv, ns),
                rows: p.seqlen_q,
                counts: cp,
            });
            (gk, gv)
        });
        let _g8 = table.as_ref().map(|tb| {
            let (tp, g) = tb.device_ptr(stream);
            call = call.clone().paged(tp, paged.unwrap().1);
            g
        });
        // SAFETY: every buffer is a live allocation of the call's extents, alive past the
        // downloads below (which synchronise the stream).
        unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
    }
    AppendRun {
        out: ctx.download(&dout).unwrap(),
        k_cache: ctx.download(&dk).unwrap(),
        v_cache: ctx.download(&dv).unwrap(),
        counts: ctx.download(&dcounts).unwrap(),
    }
}

/// The fused append (`ExternalCall::append`): rows go to cache rows `lens[b] ..` (contiguous and
/// through a shuffled block table), rows past the capacity are dropped, the counts buffer gets
/// `lens + n`, and the output has the bits of the same rows appended by hand followed by the
/// plain KV-cache call. Bad appends are errors before launch.
#[test]
fn fused_append_writes_the_rows_and_matches_append_then_attention() {
    let Some(ctx) = common::gpu("fused_append_writes_the_rows_and_matches_append_then_attention")
    else {
        return;
    };
    let ext = ExternalContext::new(0).unwrap();
    let mut rng = common::rng_from(common::seed());
    let (b, hq, hkv, n, cap, d, page) =
        (3usize, 8usize, 2usize, 2usize, 320usize, 128usize, 16usize);
    let mut p = AttentionParams::new(b, hq, n, d).seqlen_k(cap).causal(true);
    p.heads_kv = hkv;
    let row = hkv * d;
    let q: Vec<f16> = common::randn(&mut rng, p.q_len());
    let kc: Vec<f16> = common::randn(&mut rng, b * cap * row);
    let vc: Vec<f16> = common::randn(&mut rng, b * cap * row);
    let kn: Vec<f16> = common::randn(&mut rng, b * n * row);
    let vn: Vec<f16> = common::randn(&mut rng, b * n * row);
    let lens = [0i32, 150, cap as i32 - 1]; // the last sequence's second row spills
                                            // By hand: the rows that fit, then the plain call over min(lens + n, cap) keys.
    let (mut want_k, mut want_v) = (kc.clone(), vc.clone());
    for (s, &l) in lens.iter().enumerate() {
        for i in 0..n {
            let r = l as usize + i;
            if r < cap {
                let (dst, src) = ((s * cap + r) * row, (s * n + i) * row);
                want_k[dst..dst + row].copy_from_slice(&kn[src..src + row]);
                want_v[dst..dst + row].copy_from_slice(&vn[src..src + row]);
            }
        }
    }
    let after: Vec<i32> = lens
        .iter()
        .map(|&l| (l + n as i32).min(cap as i32))
        .collect();
    let plain = kv_call(&ctx, &ext, &p, &q, (&want_k, &want_v), None, &after, None);
    let fused = kv_call(
        &ctx,
        &ext,
        &p,
        &q,
        (&kc, &vc),
        Some((&kn, &vn)),
        &lens,
        None,
    );
    assert_eq!(
        fused.counts,
        lens.iter().map(|&l| l + n as i32).collect::<Vec<_>>()
    );
    assert!(
        fused.k_cache == want_k && fused.v_cache == want_v,
        "rows written where flash-attn puts them"
    );
    assert!(fused.out.iter().all(|x| x.is_finite()));
    assert!(
        fused
            .out
            .iter()
            .zip(&plain.out)
            .all(|(a, c)| a.to_bits() == c.to_bits()),
        "fused append then attention = append by hand then the plain call, bit for bit"
    );
    // Paged: a shuffled table over a pool with spare pages.
    let slots = cap / page;
    let num_pages = b * slots + 3;
    let mut order: Vec<i32> = (0..num_pages as i32).collect();
    use rand::seq::SliceRandom;
    order.shuffle(&mut rng);
    let table: Vec<i32> = order[..b * slots].to_vec();
    let pages = flashcore::attention::Pages {
        page_size: page,
        num_pages,
    };
    let mut pool_k: Vec<f16> = common::randn(&mut rng, num_pages * page * row);
    let mut pool_v: Vec<f16> = common::randn(&mut rng, num_pages * page * row);
    for s in 0..b {
        for r in 0..cap {
            let dst = (table[s * slots + r / page] as usize * page + r % page) * row;
            let src = (s * cap + r) * row;
            pool_k[dst..dst + row].copy_from_slice(&kc[src..src + row]);
            pool_v[dst..dst + row].copy_from_slice(&vc[src..src + row]);
        }
    }
    let paged = kv_call(
        &ctx,
        &ext,
        &p,
        &q,
        (&pool_k, &pool_v),
        Some((&kn, &vn)),
        &lens,
        Some((&table, pages)),
    );
    for s in 0..b {
        for r in 0..cap {
            let at = (table[s * slots + r / page] as usize * page + r % page) * row;
            let want = (s * cap + r) * row;
            assert!(
                paged.k_cache[at..at + row] == want_k[want..want + row],
                "paged K row {s}/{r}"
            );
            assert!(
                paged.v_cache[at..at + row] == want_v[want..want + row],
                "paged V row {s}/{r}"
            );
        }
    }
    assert!(paged
        .out
        .iter()
        .zip(&plain.out)
        .all(|(a, c)| a.to_bits() == c.to_bits()));
    // Errors before launch: an append without counts, zero rows.
    let s = Strides::contiguous(Layout::Bshd, cap, hkv, d);
    let t = |ptr| DeviceTensor { ptr, strides: s };
    let bad = flashcore::attention::kv_append::KvAppend {
        k: t(0x1000),
        v: t(0x2000),
        rows: 0,
        counts: 0x3000,
    };
    let call = ExternalCall::new(p.clone(), t(0x4000), t(0x5000), t(0x6000), t(0x7000))
        .kv_lengths(0x8000)
        .append(bad);
    // SAFETY: validation rejects the call before any pointer is used.
    let err = unsafe { ext.attention(&call, std::ptr::null_mut()) }.unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    let call = ExternalCall::new(p.clone(), t(0x4000), t(0x5000), t(0x6000), t(0x7000))
        .append(flashcore::attention::kv_append::KvAppend { rows: 1, ..bad });
    let err = unsafe { ext.attention(&call, std::ptr::null_mut()) }.unwrap_err();
    assert!(
        err.to_string().contains("needs KV-cache key counts"),
        "{err}"
    );
}

/// Host time: `ExternalContext::attention_loaded` launches only a call whose kernel a
/// plan holds already — before that it returns `false` and writes nothing — with `attention`'s
/// bits; and the tensor maps a plan keeps per buffer serve a decode loop that alternates q
/// buffers and caches (layers) with each call's own bits, those of the same call made alone on
/// a fresh context.
#[test]
fn loaded_calls_and_kept_tensor_maps_give_each_calls_own_bits() {
    let Some(ctx) = common::gpu("loaded_calls_and_kept_tensor_maps_give_each_calls_own_bits")
    else {
        return;
    };
    let mut rng = common::rng_from(common::seed());
    let (b, hq, hkv, cap, d) = (2usize, 8usize, 2usize, 320usize, 128usize);
    let mut p = AttentionParams::new(b, hq, 1, d).seqlen_k(cap).causal(true);
    p.heads_kv = hkv;
    let row = hkv * d;
    let qs: Vec<Vec<f16>> = (0..2).map(|_| common::randn(&mut rng, p.q_len())).collect();
    let caches: Vec<(Vec<f16>, Vec<f16>)> = (0..2)
        .map(|_| {
            (
                common::randn(&mut rng, b * cap * row),
                common::randn(&mut rng, b * cap * row),
            )
        })
        .collect();
    let lens = [100i32, cap as i32];
    let alone = |qi: usize, ci: usize| {
        let fresh = ExternalContext::new(0).unwrap();
        let (k, v) = &caches[ci];
        kv_call(&ctx, &fresh, &p, &qs[qi], (k, v), None, &lens, None).out
    };
    let want: Vec<Vec<Vec<f16>>> = (0..2)
        .map(|qi| (0..2).map(|ci| alone(qi, ci)).collect())
        .collect();
    assert!(want[0][0] != want[1][0] && want[0][0] != want[0][1]);

    let stream = ctx.stream();
    let dq: Vec<_> = qs.iter().map(|q| ctx.upload(q).unwrap()).collect();
    let dc: Vec<_> = caches
        .iter()
        .map(|(k, v)| (ctx.upload(k).unwrap(), ctx.upload(v).unwrap()))
        .collect();
    let dlens = ctx.upload(&lens).unwrap();
    let qst = Strides::contiguous(Layout::Bshd, 1, hq, d);
    let kst = Strides::contiguous(Layout::Bshd, cap, hkv, d);
    let t = |ptr, strides| DeviceTensor { ptr, strides };
    // One call of q buffer `qi` over caches `ci` into a fresh NaN output: (launched, output).
    let run = |ext: &ExternalContext, qi: usize, ci: usize, loaded_only: bool| {
        let mut dout = ctx.upload(&vec![f16::NAN; p.q_len()]).unwrap();
        let launched = {
            let (qp, _g1) = dq[qi].device_ptr(stream);
            let (kp, _g2) = dc[ci].0.device_ptr(stream);
            let (vp, _g3) = dc[ci].1.device_ptr(stream);
            let (lp, _g4) = dlens.device_ptr(stream);
            let (op, _g5) = dout.device_ptr_mut(stream);
            let call = ExternalCall::new(p.clone(), t(qp, qst), t(kp, kst), t(vp, kst), t(op, qst))
                .kv_lengths(lp);
            // SAFETY: live buffers of the call's extents, alive past the download below.
            if loaded_only {
                unsafe { ext.attention_loaded(&call, stream.cu_stream()) }.unwrap()
            } else {
                unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
                true
            }
        };
        (launched, ctx.download(&dout).unwrap())
    };
    let same = |a: &[f16], b: &[f16]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());

    let ext = ExternalContext::new(0).unwrap();
    let (launched, out) = run(&ext, 0, 0, true);
    assert!(!launched, "no plan yet: nothing is launched");
    assert!(out.iter().all(|x| x.is_nan()), "and nothing is written");
    let (_, out) = run(&ext, 0, 0, false);
    assert!(same(&out, &want[0][0]));
    let (launched, out) = run(&ext, 0, 0, true);
    assert!(
        launched && same(&out, &want[0][0]),
        "a loaded kernel: attention's bits"
    );
    // q buffers and layers' caches in turn, through kept maps: each call's own bits.
    for (i, &(qi, ci)) in [(1, 0), (0, 1), (1, 1), (0, 0), (1, 0), (0, 1), (1, 1)]
        .iter()
        .enumerate()
    {
        let (launched, out) = run(&ext, qi, ci, i % 2 == 0);
        assert!(
            launched && same(&out, &want[qi][ci]),
            "call {i}: q {qi}, caches {ci}"
        );
    }
}
