//! Chunked prefill over a KV cache on the GPU (`Context::attention_kv_chunked`):
//! packed chunks of new queries over a contiguous cache against the float64 reference per
//! sequence, the bits of the same rows run as a compact varlen pack; over a paged cache of
//! every page size class (1, 7, 16, 48, 64, 256 rows: gathered or TMA boxes), shuffled pages
//! and poisoned unused rows and pages, the contiguous cache's bits; and the cache kinds and
//! geometries the path refuses. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;

use common::{gpu, poison, randn, rng_from, seed, tolerance};
use flashcore::attention::{AttentionParams, Context, DType, Element, KvCache, Layout, Pages};
use flashcore::reference;
use rand::seq::SliceRandom;

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

fn bits<T: Element>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

/// A chunked call's parameters: one sequence per chunk, the longest chunk as `seqlen_q`, the
/// cache's capacity as `seqlen_k`.
fn chunk_params(
    chunks: &[usize],
    cap: usize,
    [hq, hkv, d]: [usize; 3],
    dtype: DType,
    causal: bool,
) -> AttentionParams {
    AttentionParams {
        batch: chunks.len(),
        seqlen_q: *chunks.iter().max().unwrap(),
        seqlen_k: cap,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        causal,
        ..AttentionParams::new(1, 1, 1, d)
    }
    .layout(Layout::Bshd)
}

fn chunk_case<T: Element>(
    ctx: &Context,
    dtype: DType,
    d: usize,
    hq: usize,
    hkv: usize,
    causal: bool,
) {
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 1024;
    let counts = [117usize, 1000, 17, 1024]; // keys per sequence after the append
    let chunks = [100usize, 1000, 17, 1]; // its newest positions are the queries
    let row_k = hkv * d;
    let row_q = hq * d;
    let p = chunk_params(&chunks, cap, [hq, hkv, d], dtype, causal);
    let kc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    let vc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    let cu_q = prefix(&chunks);
    let total_q = *cu_q.last().unwrap() as usize;
    let q: Vec<T> = randn(&mut rng, total_q * row_q);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&kc).unwrap(),
        ctx.upload(&vc).unwrap(),
    );
    let lens: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
    let dlens = ctx.upload(&lens).unwrap();
    let dcu_q = ctx.upload(&cu_q).unwrap();
    let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; hq * total_q]).unwrap();
    let cache = KvCache::contiguous(&dk, &dv, &dlens);
    ctx.attention_kv_chunked(&p, &dq, &cache, &dcu_q, &mut dout, Some(&mut dlse))
        .unwrap_or_else(|e| panic!("seed {s} {p:?}: {e}"));
    let out = ctx.download(&dout).unwrap();
    // The same sequences as a compact pack: sequence b's keys are its cache's first counts[b] rows.
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
    let want = reference::varlen_f64(&pp, &cu_q, &cu_k, &f64s(&q), &f64s(&kp), &f64s(&vp));
    let got = f64s(&out);
    assert!(
        got.iter().all(|x| x.is_finite()),
        "seed {s}: non-finite output"
    );
    for b in 0..counts.len() {
        let (a, e) = (cu_q[b] as usize * row_q, cu_q[b + 1] as usize * row_q);
        let err = reference::rel_l2(&got[a..e], &want.out[a..e]);
        assert!(
            err <= tolerance(dtype),
            "seed {s} {p:?}: sequence {b} rel L2 {err:.3e}"
        );
    }
    let lse = ctx.download(&dlse).unwrap();
    assert!(
        lse.iter().all(|x| x.is_finite()),
        "seed {s}: non-finite LSE"
    );
    // The compact pack through the plain varlen call: the same bits.
    let (dkp, dvp, dcu_k) = (
        ctx.upload(&kp).unwrap(),
        ctx.upload(&vp).unwrap(),
        ctx.upload(&cu_k).unwrap(),
    );
    let mut dout2 = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    ctx.attention_varlen(&pp, &dq, &dkp, &dvp, &dcu_q, &dcu_k, &mut dout2, None)
        .unwrap();
    assert_eq!(
        bits(&out),
        bits(&ctx.download(&dout2).unwrap()),
        "seed {s} {p:?}: chunked rows differ in bits from the compact varlen pack"
    );
    eprintln!("ok seed {s} {p:?}");
}

/// Divisible by every page size below: 1, 7, 16, 48, 64, 256.
const PAGED_CAP: usize = 5376;
const PAGES: [usize; 6] = [1, 7, 16, 48, 64, 256];
const BAD: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// A `[B, cap, Hkv, D]` cache as a pool of `page`-row pages: slot s of the flattened block
/// table goes to page `order[s]`; the pages no slot names are poisoned (NaN, ±Inf).
fn to_pages<T: Element>(
    x: &[T],
    [b, cap, row]: [usize; 3],
    page: usize,
    order: &[usize],
) -> Vec<T> {
    let slots = cap / page;
    let mut pool: Vec<T> = (0..order.len() * page * row)
        .map(|i| T::from_f64(BAD[i % 3]))
        .collect();
    for s in 0..b * slots {
        let dst = order[s] * page * row;
        pool[dst..dst + page * row].copy_from_slice(&x[s * page * row..(s + 1) * page * row]);
    }
    pool
}

/// Chunked prefill over a paged cache: for every page size, the bits of the same cache stored
/// contiguously (pages shuffled, three spare pages, rows past each count and the spare pages
/// poisoned), and the float64 reference.
#[allow(clippy::too_many_arguments)]
fn paged_case<T: Element>(
    ctx: &Context,
    dtype: DType,
    d: usize,
    hq: usize,
    hkv: usize,
    causal: bool,
    softcap: f32,
) {
    let s = seed();
    let mut rng = rng_from(s);
    let cap = PAGED_CAP;
    let counts = [117usize, 1000, 17, cap, 0];
    let chunks = [100usize, 1000, 17, 1, 0];
    let row_k = hkv * d;
    let row_q = hq * d;
    let p = chunk_params(&chunks, cap, [hq, hkv, d], dtype, causal).softcap(softcap);
    let mut kc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    let mut vc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    for (b, &n) in counts.iter().enumerate() {
        for r in n..cap {
            let at = (b * cap + r) * row_k;
            kc[at..at + row_k].fill(T::from_f64(BAD[r % 3]));
            vc[at..at + row_k].fill(T::from_f64(BAD[(r + 1) % 3]));
        }
    }
    let cu_q = prefix(&chunks);
    let total_q = *cu_q.last().unwrap() as usize;
    let q: Vec<T> = randn(&mut rng, total_q * row_q);
    let dq = ctx.upload(&q).unwrap();
    let dlens = ctx
        .upload(&counts.iter().map(|&c| c as i32).collect::<Vec<_>>())
        .unwrap();
    let dcu_q = ctx.upload(&cu_q).unwrap();
    let run = |cache: &KvCache<'_, T>| {
        let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
        let mut dlse = ctx.upload(&vec![f32::NAN; hq * total_q]).unwrap();
        ctx.attention_kv_chunked(&p, &dq, cache, &dcu_q, &mut dout, Some(&mut dlse))
            .unwrap_or_else(|e| panic!("seed {s} {p:?}: {e}"));
        (ctx.download(&dout).unwrap(), ctx.download(&dlse).unwrap())
    };
    let (dk, dv) = (ctx.upload(&kc).unwrap(), ctx.upload(&vc).unwrap());
    let (want, want_lse) = run(&KvCache::contiguous(&dk, &dv, &dlens));
    // The float64 reference over each sequence's first counts[b] keys.
    let cu_k = prefix(&counts);
    let (mut kp, mut vp) = (Vec::new(), Vec::new());
    for (b, &c) in counts.iter().enumerate() {
        kp.extend_from_slice(&kc[b * cap * row_k..(b * cap + c) * row_k]);
        vp.extend_from_slice(&vc[b * cap * row_k..(b * cap + c) * row_k]);
    }
    let pp = AttentionParams {
        seqlen_k: cap,
        ..p.clone()
    };
    let r = reference::varlen_f64(&pp, &cu_q, &cu_k, &f64s(&q), &f64s(&kp), &f64s(&vp));
    for &page in &PAGES {
        let slots = cap / page;
        let num_pages = counts.len() * slots + 3;
        let mut order: Vec<usize> = (0..num_pages).collect();
        order.shuffle(&mut rng);
        let geom = [counts.len(), cap, row_k];
        let kpool = to_pages(&kc, geom, page, &order);
        let vpool = to_pages(&vc, geom, page, &order);
        let table: Vec<i32> = order[..counts.len() * slots]
            .iter()
            .map(|&i| i as i32)
            .collect();
        let pages = Pages {
            page_size: page,
            num_pages,
        };
        let (dkp, dvp, dt) = (
            ctx.upload(&kpool).unwrap(),
            ctx.upload(&vpool).unwrap(),
            ctx.upload(&table).unwrap(),
        );
        let (out, lse) = run(&KvCache::paged(&dkp, &dvp, &dlens, &dt, pages));
        let what = format!(
            "seed {s}: {dtype:?} d{d} hq{hq} hkv{hkv} causal {causal} softcap {softcap} page {page} ({})",
            if pages.tma_boxes() { "TMA" } else { "gathered" }
        );
        assert!(
            bits(&out) == bits(&want),
            "{what}: bits differ from the contiguous cache's"
        );
        assert!(
            lse.iter()
                .zip(&want_lse)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: LSE bits differ from the contiguous cache's"
        );
        let got = f64s(&out);
        assert!(
            got.iter().all(|x| x.is_finite()),
            "{what}: non-finite output"
        );
        for b in 0..counts.len() {
            let (a, e) = (cu_q[b] as usize * row_q, cu_q[b + 1] as usize * row_q);
            if a == e {
                continue;
            }
            let err = reference::rel_l2(&got[a..e], &r.out[a..e]);
            assert!(
                err <= tolerance(dtype),
                "{what}: sequence {b} rel L2 {err:.3e}"
            );
        }
        eprintln!("ok {what}");
    }
}

#[test]
fn kv_chunked_prefill_over_pages_gets_the_contiguous_bits() {
    let Some(ctx) = gpu("kv_chunked_prefill_over_pages_gets_the_contiguous_bits") else {
        return;
    };
    paged_case::<half::bf16>(&ctx, DType::Bf16, 128, 16, 4, true, 0.0);
    paged_case::<half::f16>(&ctx, DType::F16, 64, 8, 8, false, 0.0);
    paged_case::<half::bf16>(&ctx, DType::Bf16, 96, 8, 2, true, 0.0);
    paged_case::<half::f16>(&ctx, DType::F16, 256, 8, 1, true, 30.0);
    paged_case::<half::bf16>(&ctx, DType::Bf16, 256, 4, 4, false, 0.0);
}

#[test]
fn kv_chunked_prefill_matches_reference_and_varlen_bits() {
    let Some(ctx) = gpu("kv_chunked_prefill_matches_reference_and_varlen_bits") else {
        return;
    };
    chunk_case::<half::bf16>(&ctx, DType::Bf16, 128, 16, 4, true);
    chunk_case::<half::f16>(&ctx, DType::F16, 64, 8, 8, false);
    chunk_case::<half::f16>(&ctx, DType::F16, 128, 8, 1, true);
}

#[test]
fn kv_chunked_prefill_refuses_what_it_does_not_take() {
    let Some(ctx) = gpu("kv_chunked_prefill_refuses_what_it_does_not_take") else {
        return;
    };
    let p = AttentionParams::new(2, 4, 32, 64)
        .seqlen_k(64)
        .layout(Layout::Bshd);
    let kv = ctx.alloc::<half::f16>(p.kv_len()).unwrap();
    let q = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let mut out = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let lens = ctx.upload(&[3i32, 5]).unwrap();
    let cu = ctx.upload(&[0i32, 32, 64]).unwrap();
    let table = ctx.upload(&[0i32, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let sinks = ctx.alloc::<f32>(3).unwrap(); // one short of a sink per query head
    let pages = Pages {
        page_size: 16,
        num_pages: 8,
    };
    let base = KvCache::contiguous(&kv, &kv, &lens);
    let pool = ctx.alloc::<half::f16>(8 * 16 * 4 * 64).unwrap();
    let short_pool = ctx.alloc::<half::f16>(7 * 16 * 4 * 64).unwrap();
    let short_table = ctx.upload(&[0i32, 1, 2]).unwrap();
    let pages7 = Pages {
        page_size: 7,
        num_pages: 8,
    };
    let no_pages = Pages {
        page_size: 16,
        num_pages: 0,
    };
    let cases: [(KvCache<'_, half::f16>, &str); 10] = [
        (base.secret(), "secret_lengths"),
        (base.leftpad(&lens), "leftpad"),
        (base.prefill_consistent(), "prefill_consistent"),
        // Sinks are taken, but one per query head.
        (base.sinks(&sinks), "sinks"),
        // Paged caches are taken; their geometry is checked before any launch.
        (
            KvCache::paged(&short_pool, &pool, &lens, &table, pages),
            "k",
        ),
        (
            KvCache::paged(&pool, &short_pool, &lens, &table, pages),
            "v",
        ),
        (
            KvCache::paged(&pool, &pool, &lens, &short_table, pages),
            "block_table",
        ),
        // A capacity of 64 rows is no whole number of 7-row pages.
        (
            KvCache::paged(&pool, &pool, &lens, &table, pages7),
            "seqlen_k",
        ),
        (
            KvCache::paged(&pool, &pool, &lens, &table, no_pages),
            "num_pages",
        ),
        (
            KvCache::paged(&pool, &pool, &lens, &table, pages).secret(),
            "secret_lengths",
        ),
    ];
    for (cache, want) in cases {
        match ctx.attention_kv_chunked(&p, &q, &cache, &cu, &mut out, None) {
            Err(flashcore::Error::InvalidArgument { arg, .. }) if arg == want => {}
            other => panic!("{want}: expected InvalidArgument, got {other:?}"),
        }
    }
    let short = ctx.upload(&[3i32]).unwrap();
    match ctx.attention_kv_chunked(
        &p,
        &q,
        &KvCache::contiguous(&kv, &kv, &short),
        &cu,
        &mut out,
        None,
    ) {
        Err(flashcore::Error::InvalidArgument {
            arg: "seqlens_k", ..
        }) => {}
        other => panic!("one count for two sequences: expected InvalidArgument, got {other:?}"),
    }
    match ctx.attention_kv_chunked(
        &p.clone().layout(Layout::Bhsd),
        &q,
        &base,
        &cu,
        &mut out,
        None,
    ) {
        Err(flashcore::Error::InvalidArgument { arg: "layout", .. }) => {}
        other => panic!("bhsd: expected InvalidArgument, got {other:?}"),
    }
}
