//! The window, softcap and sink features beyond the dense path, on the GPU against the float64 reference: sliding
//! windows, softcap and learnable sinks in varlen packs (each sequence's window bottom-right
//! aligned to its own counts; lengths 1, 17, 128, 129, 4097 in one pack, Sq ≠ Sk per sequence;
//! host- and device-built work lists with the same bits), softcap over KV caches (public and
//! secret counts, contiguous and paged, with windows, sinks and left padding), chunked prefill
//! with all three, and the combinations still refused. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;

use common::{gpu, poison, randn, rng_from, seed, tolerance};
use flashcore::attention::{
    AttentionParams, Context, DType, Element, KvCache, Layout, Pages, Window,
};
use flashcore::reference;
use rand::seq::SliceRandom;
use rand::Rng;

fn prefix(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn w(left: i64, right: i64) -> Window {
    Window::from_flash_attn(left, right)
}

fn sinks_for(rng: &mut impl Rng, heads: usize) -> Vec<f32> {
    (0..heads).map(|_| rng.random_range(-3.0f32..3.0)).collect()
}

/// Checks O and the LSE against the reference: finite, rel L2 within the dtype's bound, rows with
/// an LSE of −inf in the reference −inf here too (O = 0 there: the L2 covers it).
fn check(what: &str, dtype: DType, out: &[f64], lse: &[f32], want: &reference::RefOutput) {
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        panic!("{what}: non-finite output at {i}: {}", out[i]);
    }
    let err = reference::rel_l2(out, &want.out);
    assert!(
        err <= tolerance(dtype),
        "{what}: output rel L2 {err:.3e} > {:.0e}",
        tolerance(dtype)
    );
    let (mut gl, mut wl) = (Vec::new(), Vec::new());
    for (i, (&g, &wv)) in lse.iter().zip(&want.lse).enumerate() {
        if wv == f64::NEG_INFINITY {
            assert_eq!(g, f32::NEG_INFINITY, "{what}: lse[{i}]");
        } else {
            assert!(g.is_finite(), "{what}: lse[{i}] = {g} (want {wv})");
            gl.push(g as f64);
            wl.push(wv);
        }
    }
    if !wl.is_empty() {
        let e = reference::rel_l2(&gl, &wl);
        assert!(e <= 1e-3, "{what}: LSE rel L2 {e:.3e}");
    }
}

/// (Hq, Hkv, causal, window, softcap, sinks)
type Case = (usize, usize, bool, Window, f32, bool);

/// One varlen pack through the device-built list and the host-built list: both against the
/// reference, and bit-identical to each other.
fn varlen_case<T: Element>(ctx: &Context, dtype: DType, d: usize, case: Case, s: u64) {
    let (hq, hkv, causal, window, cap, with_sinks) = case;
    let mut rng = rng_from(s);
    let lq = [1usize, 17, 128, 129, 4097, 300, 0];
    let lk = [129usize, 4097, 17, 1, 4000, 300, 5];
    let (cu_q, cu_k) = (prefix(&lq), prefix(&lk));
    let (tq, tk) = (
        *cu_q.last().unwrap() as usize,
        *cu_k.last().unwrap() as usize,
    );
    let p = AttentionParams {
        batch: lq.len(),
        seqlen_q: *lq.iter().max().unwrap(),
        seqlen_k: *lk.iter().max().unwrap(),
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        causal,
        ..AttentionParams::new(1, 1, 1, d)
    }
    .window(window)
    .softcap(cap);
    let q: Vec<T> = randn(&mut rng, tq * hq * d);
    let k: Vec<T> = randn(&mut rng, tk * hkv * d);
    let v: Vec<T> = randn(&mut rng, tk * hkv * d);
    let sinks = sinks_for(&mut rng, hq);
    let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
    let want = reference::varlen_sinks_f64(
        &p,
        &cu_q,
        &cu_k,
        &f64s(&q),
        &f64s(&k),
        &f64s(&v),
        with_sinks.then_some(&s64[..]),
    );
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&k).unwrap(),
        ctx.upload(&v).unwrap(),
    );
    let (dcq, dck) = (ctx.upload(&cu_q).unwrap(), ctx.upload(&cu_k).unwrap());
    let dsinks = ctx.upload(&sinks).unwrap();
    let sk = with_sinks.then_some(&dsinks);
    let what = format!(
        "seed {s} {} d{d} hq{hq}/{hkv} causal {causal} window {:?} softcap {cap} sinks {with_sinks}",
        dtype.name(),
        window.to_flash_attn()
    );
    let mut results = Vec::new();
    for device_list in [true, false] {
        let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
        let mut dlse = ctx.upload(&vec![f32::NAN; hq * tq]).unwrap();
        if device_list {
            ctx.attention_varlen_device_with_sinks(
                &p,
                &dq,
                &dk,
                &dv,
                [&dcq, &dck],
                [None, None],
                sk,
                &mut dout,
                Some(&mut dlse),
            )
        } else {
            ctx.attention_varlen_host_with_sinks(
                &p,
                &dq,
                &dk,
                &dv,
                [&cu_q, &cu_k],
                sk,
                &mut dout,
                Some(&mut dlse),
            )
        }
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let out: Vec<T> = ctx.download(&dout).unwrap();
        let lse: Vec<f32> = ctx.download(&dlse).unwrap();
        check(
            &format!("{what} device list {device_list}"),
            dtype,
            &f64s(&out),
            &lse,
            &want,
        );
        results.push((
            f64s(&out).iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        ));
    }
    assert!(
        results[0] == results[1],
        "{what}: host- and device-built lists differ in bits"
    );
    eprintln!("ok {what}");
}

fn varlen_cases() -> Vec<Case> {
    vec![
        // Window + causal + GQA + softcap + sinks.
        (8, 2, true, w(100, -1), 5.0, true),
        // Both sides, no causal flag, sinks.
        (4, 4, false, w(64, 32), 0.0, true),
        // Softcap alone (GQA 4:1).
        (4, 1, false, w(-1, -1), 3.0, false),
        // Zero-width window: each row sees its diagonal key only.
        (4, 2, true, w(0, 0), 0.0, false),
        // right = 0 without the causal flag, long left edge over the 4k sequences, softcap, sinks.
        (4, 2, false, w(1500, 0), 5.0, true),
    ]
}

#[test]
fn varlen_windows_softcap_sinks_match_reference() {
    let Some(ctx) = gpu("varlen_windows_softcap_sinks_match_reference") else {
        return;
    };
    let s = seed();
    for (i, case) in varlen_cases().into_iter().enumerate() {
        let s = s.wrapping_add(i as u64);
        varlen_case::<half::f16>(&ctx, DType::F16, 64, case, s);
        varlen_case::<half::bf16>(&ctx, DType::Bf16, 128, case, s);
    }
}

/// Head dims 96 and 256 in varlen with every feature on (Gemma 2: d256, softcap; Phi-3: d96).
#[test]
fn varlen_head_dims_96_256_with_features_match_reference() {
    let Some(ctx) = gpu("varlen_head_dims_96_256_with_features_match_reference") else {
        return;
    };
    let s = seed();
    let case = (4, 2, true, w(200, -1), 5.0, true);
    varlen_case::<half::f16>(&ctx, DType::F16, 96, case, s);
    varlen_case::<half::bf16>(&ctx, DType::Bf16, 256, case, s.wrapping_add(1));
}

/// A paged copy of contiguous caches `[B, cap, Hkv, D]`: pages of `page` rows in a shuffled
/// pool, and the block table that finds them.
fn paged<T: Element + Copy>(
    rng: &mut impl Rng,
    cache: &[T],
    batch: usize,
    cap: usize,
    row: usize,
    page: usize,
) -> (Vec<T>, Vec<i32>) {
    let per = cap / page;
    let mut order: Vec<usize> = (0..batch * per).collect();
    order.shuffle(rng);
    let mut pool = vec![cache[0]; cache.len()];
    let mut table = vec![0i32; batch * per];
    for b in 0..batch {
        for i in 0..per {
            let dst = order[b * per + i];
            table[b * per + i] = dst as i32;
            let src = (b * cap + i * page) * row;
            pool[dst * page * row..(dst + 1) * page * row]
                .copy_from_slice(&cache[src..src + page * row]);
        }
    }
    (pool, table)
}

/// KV caches (decode, Sq ≤ 16) with a softcap, in every KV-cache build (public and secret
/// counts, contiguous and paged), with windows, sinks and left padding, against the reference.
#[test]
fn kv_cache_softcap_matches_reference_in_every_cache_kind() {
    let Some(ctx) = gpu("kv_cache_softcap_matches_reference_in_every_cache_kind") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 2048;
    let page = 64;
    let counts = [0usize, 7, 1999, 2048, 129];
    let starts = [0usize, 3, 1000, 17, 129];
    for (d, dtype) in [(64, DType::F16), (128, DType::F16), (256, DType::F16)] {
        for (sq, causal, hq, hkv, window, softcap) in [
            (1, true, 8, 2, w(-1, -1), 30.0f32),
            (4, true, 8, 1, w(300, -1), 4.0),
            (3, false, 4, 4, w(50, 2), 2.0),
        ] {
            let mut p = AttentionParams::new(counts.len(), hq, sq, d)
                .seqlen_k(cap)
                .dtype(dtype)
                .causal(causal)
                .window(window)
                .softcap(softcap);
            p.heads_kv = hkv;
            let q: Vec<half::f16> = randn(&mut rng, p.q_len());
            let kc: Vec<half::f16> = randn(&mut rng, p.kv_len());
            let vc: Vec<half::f16> = randn(&mut rng, p.kv_len());
            let row = hkv * d;
            let (kpool, table) = paged(&mut rng, &kc, counts.len(), cap, row, page);
            // The same shuffle for V: rebuild from the table.
            let mut vpool = vc.clone();
            for b in 0..counts.len() {
                for i in 0..cap / page {
                    let dst = table[b * (cap / page) + i] as usize;
                    let src = (b * cap + i * page) * row;
                    vpool[dst * page * row..(dst + 1) * page * row]
                        .copy_from_slice(&vc[src..src + page * row]);
                }
            }
            let sinks = sinks_for(&mut rng, hq);
            let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
            let dq = ctx.upload(&q).unwrap();
            let (dk, dv) = (ctx.upload(&kc).unwrap(), ctx.upload(&vc).unwrap());
            let (dkp, dvp) = (ctx.upload(&kpool).unwrap(), ctx.upload(&vpool).unwrap());
            let dtable = ctx.upload(&table).unwrap();
            let pages = Pages {
                page_size: page,
                num_pages: counts.len() * cap / page,
            };
            let dl = ctx
                .upload(&counts.iter().map(|&n| n as i32).collect::<Vec<_>>())
                .unwrap();
            let dst = ctx
                .upload(&starts.iter().map(|&n| n as i32).collect::<Vec<_>>())
                .unwrap();
            let dsink = ctx.upload(&sinks).unwrap();
            for (secret, is_paged, leftpad, with_sinks) in [
                (false, false, false, true),
                (true, false, true, true),
                (false, true, false, false),
                (true, true, false, true),
                (false, true, true, true),
            ] {
                let zero = [0usize; 5];
                let st: &[usize] = if leftpad { &starts } else { &zero };
                let want = reference::kv_cache_sinks_f64(
                    &p,
                    &f64s(&q),
                    &f64s(&kc),
                    &f64s(&vc),
                    st,
                    &counts,
                    with_sinks.then_some(&s64[..]),
                );
                let mut cache = if is_paged {
                    KvCache::paged(&dkp, &dvp, &dl, &dtable, pages)
                } else {
                    KvCache::contiguous(&dk, &dv, &dl)
                };
                if secret {
                    cache = cache.secret();
                }
                if leftpad {
                    cache = cache.leftpad(&dst);
                }
                if with_sinks {
                    cache = cache.sinks(&dsink);
                }
                let mut dout = ctx.upload(&vec![poison::<half::f16>(); p.q_len()]).unwrap();
                let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
                let what = format!(
                    "seed {s}: d{d} sq{sq} causal {causal} window {:?} softcap {softcap} secret {secret} paged {is_paged} leftpad {leftpad} sinks {with_sinks}",
                    window.to_flash_attn()
                );
                ctx.attention_kv_cache(&p, &dq, &cache, &mut dout, Some(&mut dlse))
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let out = f64s(&ctx.download(&dout).unwrap());
                let lse: Vec<f32> = ctx.download(&dlse).unwrap();
                check(&what, dtype, &out, &lse, &want);
            }
        }
    }
}

/// Chunked prefill over a contiguous cache with a window, a softcap and sinks: each chunk's
/// window aligned to its sequence's count, against the reference of the compact pack.
#[test]
fn kv_chunked_prefill_with_window_softcap_sinks_matches_reference() {
    let Some(ctx) = gpu("kv_chunked_prefill_with_window_softcap_sinks_matches_reference") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (d, hq, hkv) = (128, 8, 2);
    let cap = 1024;
    let counts = [117usize, 1000, 17, 1024];
    let chunks = [100usize, 1000, 17, 1];
    let (row_q, row_k) = (hq * d, hkv * d);
    for (causal, window, cap_s, with_sinks) in [
        (true, w(128, -1), 5.0f32, true),
        (false, w(64, 16), 0.0, true),
        (true, w(-1, -1), 3.0, false),
    ] {
        let p = AttentionParams {
            batch: counts.len(),
            seqlen_q: *chunks.iter().max().unwrap(),
            seqlen_k: cap,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
            dtype: DType::Bf16,
            causal,
            ..AttentionParams::new(1, 1, 1, d)
        }
        .layout(Layout::Bshd)
        .window(window)
        .softcap(cap_s);
        let kc: Vec<half::bf16> = randn(&mut rng, counts.len() * cap * row_k);
        let vc: Vec<half::bf16> = randn(&mut rng, counts.len() * cap * row_k);
        let cu_q = prefix(&chunks);
        let total_q = *cu_q.last().unwrap() as usize;
        let q: Vec<half::bf16> = randn(&mut rng, total_q * row_q);
        let sinks = sinks_for(&mut rng, hq);
        let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
        let (dq, dk, dv) = (
            ctx.upload(&q).unwrap(),
            ctx.upload(&kc).unwrap(),
            ctx.upload(&vc).unwrap(),
        );
        let dlens = ctx
            .upload(&counts.iter().map(|&c| c as i32).collect::<Vec<_>>())
            .unwrap();
        let dcu_q = ctx.upload(&cu_q).unwrap();
        let dsinks = ctx.upload(&sinks).unwrap();
        let mut cache = KvCache::contiguous(&dk, &dv, &dlens);
        if with_sinks {
            cache = cache.sinks(&dsinks);
        }
        let mut dout = ctx.upload(&vec![poison::<half::bf16>(); q.len()]).unwrap();
        let mut dlse = ctx.upload(&vec![f32::NAN; hq * total_q]).unwrap();
        let what = format!(
            "seed {s}: causal {causal} window {:?} softcap {cap_s} sinks {with_sinks}",
            window.to_flash_attn()
        );
        ctx.attention_kv_chunked(&p, &dq, &cache, &dcu_q, &mut dout, Some(&mut dlse))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let cu_k = prefix(&counts);
        let (mut kp, mut vp) = (Vec::new(), Vec::new());
        for (b, &c) in counts.iter().enumerate() {
            kp.extend_from_slice(&kc[b * cap * row_k..(b * cap + c) * row_k]);
            vp.extend_from_slice(&vc[b * cap * row_k..(b * cap + c) * row_k]);
        }
        let pp = AttentionParams {
            seqlen_k: *counts.iter().max().unwrap(),
            ..p.clone()
        };
        let want = reference::varlen_sinks_f64(
            &pp,
            &cu_q,
            &cu_k,
            &f64s(&q),
            &f64s(&kp),
            &f64s(&vp),
            with_sinks.then_some(&s64[..]),
        );
        let out = f64s(&ctx.download(&dout).unwrap());
        let lse: Vec<f32> = ctx.download(&dlse).unwrap();
        check(&what, DType::Bf16, &out, &lse, &want);
    }
}

/// What is still refused, and the sinks' length on the varlen entry points: typed errors before
/// any launch.
#[test]
fn feature_paths_refuse_what_they_do_not_take() {
    let Some(ctx) = gpu("feature_paths_refuse_what_they_do_not_take") else {
        return;
    };
    // Softcap over a prefill-consistent KV cache, and with secret-length prefill.
    let p = AttentionParams::new(2, 4, 1, 64).seqlen_k(64).softcap(5.0);
    let q = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    let kv = ctx.alloc::<half::f16>(p.kv_len()).unwrap();
    let mut out = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    let lens = ctx.upload(&[3i32, 5]).unwrap();
    let cache = KvCache::contiguous(&kv, &kv, &lens).prefill_consistent();
    match ctx.attention_kv_cache(&p, &q, &cache, &mut out, None) {
        Err(flashcore::Error::InvalidArgument { arg: "softcap", .. }) => {}
        other => panic!("softcap, prefill-consistent: expected InvalidArgument, got {other:?}"),
    }
    let ps = AttentionParams::new(1, 2, 64, 64).softcap(5.0);
    let qs = ctx.alloc::<half::f16>(ps.q_len()).unwrap();
    let mut outs = ctx.alloc::<half::f16>(ps.q_len()).unwrap();
    let one = ctx.upload(&[64i32]).unwrap();
    match ctx.attention_secret_len(&ps, &qs, &qs, &qs, &mut outs, None, &one) {
        Err(flashcore::Error::InvalidArgument { arg: "softcap", .. }) => {}
        other => panic!("softcap, secret-length prefill: expected InvalidArgument, got {other:?}"),
    }
    // Varlen: one sink short, on both entry points.
    let pv = AttentionParams::new(2, 4, 32, 64).seqlen_k(32);
    let qv = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let mut ov = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let cu = [0i32, 32, 64];
    let dcu = ctx.upload(&cu).unwrap();
    let short = ctx.alloc::<f32>(3).unwrap();
    let r = ctx.attention_varlen_device_with_sinks(
        &pv,
        &qv,
        &qv,
        &qv,
        [&dcu, &dcu],
        [None, None],
        Some(&short),
        &mut ov,
        None,
    );
    assert!(
        matches!(
            r,
            Err(flashcore::Error::InvalidArgument { arg: "sinks", .. })
        ),
        "device list, 3 sinks for 4 heads: {r:?}"
    );
    let r = ctx.attention_varlen_host_with_sinks(
        &pv,
        &qv,
        &qv,
        &qv,
        [&cu, &cu],
        Some(&short),
        &mut ov,
        None,
    );
    assert!(
        matches!(
            r,
            Err(flashcore::Error::InvalidArgument { arg: "sinks", .. })
        ),
        "host list, 3 sinks for 4 heads: {r:?}"
    );
}
