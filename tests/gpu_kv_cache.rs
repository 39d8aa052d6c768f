//! KV-cache decode on the GPU (flash-attn's `flash_attn_with_kvcache` semantics): contiguous and
//! paged caches, public and secret key counts, against the float64 reference per sequence; the
//! bits of a sequence independent of its neighbours, of the batch size, of where its pages live
//! and of the cache's capacity; the append; every bad metadata input an error before launch.
//! Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, KvCache, Layout, Pages};
use rand::seq::SliceRandom;
use rand::Rng;

#[allow(clippy::too_many_arguments)]
fn params(
    dtype: DType,
    d: usize,
    causal: bool,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    cap: usize,
) -> AttentionParams {
    let mut p = AttentionParams::new(b, hq, sq, d)
        .seqlen_k(cap)
        .dtype(dtype)
        .layout(Layout::Bshd)
        .causal(causal);
    p.heads_kv = hkv;
    p
}

/// A cache's contents as the caller lays them out: contiguous `[B, cap, Hkv, D]`, or a pool of
/// shuffled pages (plus spare pages no sequence uses) with its block table.
struct Layouted<T> {
    k: Vec<T>,
    v: Vec<T>,
    table: Option<(Vec<i32>, Pages)>,
}

/// Lays out the contiguous caches `kc`, `vc` (`[B, cap, Hkv, D]`) with `page` rows per page
/// (0: contiguous), pages in a random order inside a pool with `spare` extra pages of noise.
fn layout<T: Element>(
    rng: &mut impl Rng,
    p: &AttentionParams,
    kc: &[T],
    vc: &[T],
    page: usize,
    spare: usize,
) -> Layouted<T> {
    if page == 0 {
        return Layouted {
            k: kc.to_vec(),
            v: vc.to_vec(),
            table: None,
        };
    }
    let row = p.heads_kv * p.head_dim;
    let slots = p.seqlen_k / page;
    let num_pages = p.batch * slots + spare;
    let mut order: Vec<usize> = (0..num_pages).collect();
    order.shuffle(rng);
    let mut k: Vec<T> = randn(rng, num_pages * page * row);
    let mut v: Vec<T> = randn(rng, num_pages * page * row);
    let mut table = vec![0i32; p.batch * slots];
    for b in 0..p.batch {
        for s in 0..slots {
            let pg = order[b * slots + s];
            table[b * slots + s] = pg as i32;
            let src = (b * p.seqlen_k + s * page) * row;
            let dst = pg * page * row;
            k[dst..dst + page * row].copy_from_slice(&kc[src..src + page * row]);
            v[dst..dst + page * row].copy_from_slice(&vc[src..src + page * row]);
        }
    }
    Layouted {
        k,
        v,
        table: Some((
            table,
            Pages {
                page_size: page,
                num_pages,
            },
        )),
    }
}

/// One KV-cache call; returns (out, lse).
fn run<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    c: &Layouted<T>,
    counts: &[usize],
    secret: bool,
) -> flashcore::Result<(Vec<T>, Vec<f32>)> {
    run_mode(ctx, p, q, c, counts, None, secret, false)
}

/// [`run`], optionally with left padding (each sequence's first key) and in the
/// prefill-consistent mode.
#[allow(clippy::too_many_arguments)]
fn run_mode<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    c: &Layouted<T>,
    counts: &[usize],
    starts: Option<&[usize]>,
    secret: bool,
    consistent: bool,
) -> flashcore::Result<(Vec<T>, Vec<f32>)> {
    let dq = ctx.upload(q)?;
    let (dk, dv) = (ctx.upload(&c.k)?, ctx.upload(&c.v)?);
    let dl = ctx.upload(&counts.iter().map(|&n| n as i32).collect::<Vec<_>>())?;
    let dt = match &c.table {
        Some((t, _)) => Some(ctx.upload(t)?),
        None => None,
    };
    let mut cache = match (&dt, &c.table) {
        (Some(dt), Some((_, pg))) => KvCache::paged(&dk, &dv, &dl, dt, *pg),
        _ => KvCache::contiguous(&dk, &dv, &dl),
    };
    if secret {
        cache = cache.secret();
    }
    if consistent {
        cache = cache.prefill_consistent();
    }
    let ds = match starts {
        Some(st) => Some(ctx.upload(&st.iter().map(|&n| n as i32).collect::<Vec<_>>())?),
        None => None,
    };
    if let Some(ds) = &ds {
        cache = cache.leftpad(ds);
    }
    let mut dout = ctx.upload(&vec![poison::<T>(); p.q_len()])?;
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()])?;
    ctx.attention_kv_cache(p, &dq, &cache, &mut dout, Some(&mut dlse))?;
    Ok((ctx.download(&dout)?, ctx.download(&dlse)?))
}

/// `x` (`[B, cap, Hkv, D]`) with every row outside sequence b's keys [starts[b], counts[b])
/// set to NaN, +Inf or −Inf (by row).
fn poison_unused<T: Element>(
    p: &AttentionParams,
    x: &[T],
    starts: &[usize],
    counts: &[usize],
) -> Vec<T> {
    let row = p.heads_kv * p.head_dim;
    let bad = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
    let mut y = x.to_vec();
    for b in 0..p.batch {
        for r in (0..p.seqlen_k).filter(|&r| r < starts[b] || r >= counts[b]) {
            let at = (b * p.seqlen_k + r) * row;
            y[at..at + row].fill(T::from_f64(bad[r % 3]));
        }
    }
    y
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Every mode against the reference, sequence by sequence: empty, short, odd, full caches.
fn modes_match_reference<T: Element>(name: &str, dtype: DType, head_dims: &[usize]) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 3072; // a whole number of 16-, 64- and 256-row pages
    let counts = [0usize, 7, 1999, 3072, 129, 2048];
    let starts = [0usize, 3, 1000, 3000, 129, 17];
    let tol = tolerance(dtype);
    for &d in head_dims {
        for (sq, causal, hq, hkv) in [(1, false, 8, 2), (4, true, 8, 1), (3, false, 4, 4)] {
            let p = params(dtype, d, causal, counts.len(), hq, hkv, sq, cap);
            let q: Vec<T> = randn(&mut rng, p.q_len());
            let kc: Vec<T> = randn(&mut rng, p.kv_len());
            let vc: Vec<T> = randn(&mut rng, p.kv_len());
            // Left padding (flash-attn's cache_leftpad): keys before each start are masked; a
            // start at the count leaves no key.
            for starts in [None, Some(&starts[..])] {
                let zero = [0usize; 6];
                let st: &[usize] = starts.unwrap_or(&zero);
                // Rows outside each sequence's [start, count) are unused cache (torch.empty's, a
                // freed page's): their NaN and ±Inf bits must not reach the output.
                let (kc, vc) = (
                    poison_unused(&p, &kc, st, &counts),
                    poison_unused(&p, &vc, st, &counts),
                );
                let r = flashcore::reference::kv_cache_leftpad_f64(
                    &p,
                    &f64s(&q),
                    &f64s(&kc),
                    &f64s(&vc),
                    st,
                    &counts,
                );
                let mut first: Option<Vec<u64>> = None;
                for (page, secret) in [(0, false), (0, true), (16, false), (64, true), (256, false)]
                {
                    let c = layout(&mut rng, &p, &kc, &vc, page, 3);
                    let (out, lse) =
                        run_mode(&ctx, &p, &q, &c, &counts, starts, secret, false).unwrap();
                    let row = p.seqlen_q * p.heads_q * p.head_dim;
                    let per = p.heads_q * p.seqlen_q;
                    for (b, &len) in counts.iter().enumerate() {
                        let got = f64s(&out[b * row..(b + 1) * row]);
                        let got_lse = &lse[b * per..(b + 1) * per];
                        let what = format!("seed {s}: d{d} sq{sq} causal {causal} page {page} secret {secret} sequence {b} (keys {}..{len})", st[b]);
                        assert!(
                            got.iter().all(|x| x.is_finite()),
                            "{what}: non-finite output"
                        );
                        if len == st[b] {
                            assert!(
                                got.iter().all(|&x| x == 0.0),
                                "{what}: an empty cache gives O = 0"
                            );
                            assert!(
                                got_lse.iter().all(|&x| x == f32::NEG_INFINITY),
                                "{what}: LSE −inf"
                            );
                            continue;
                        }
                        let err =
                            flashcore::reference::rel_l2(&got, &r.out[b * row..(b + 1) * row]);
                        assert!(err <= tol, "{what}: err {err:.3e}");
                        let gl: Vec<f64> = got_lse.iter().map(|&x| x as f64).collect();
                        let lerr =
                            flashcore::reference::rel_l2(&gl, &r.lse[b * per..(b + 1) * per]);
                        assert!(lerr <= 1e-3, "{what}: LSE err {lerr:.3e}");
                    }
                    // Public counts: the bits do not depend on where the pages live.
                    if !secret {
                        match &first {
                            None => first = Some(bits(&out)),
                            Some(f) => assert_eq!(
                                f,
                                &bits(&out),
                                "seed {s}: d{d} page {page}: bits depend on the cache's layout"
                            ),
                        }
                    }
                    eprintln!("ok kv {name} d{d} sq{sq} causal {causal} page {page:3} secret {secret} leftpad {}", starts.is_some());
                }
            }
        }
    }
}

#[test]
fn kv_cache_f16_matches_reference() {
    modes_match_reference::<half::f16>("kv_cache_f16_matches_reference", DType::F16, &[64, 128]);
}

#[test]
fn kv_cache_bf16_matches_reference() {
    modes_match_reference::<half::bf16>("kv_cache_bf16_matches_reference", DType::Bf16, &[64, 128]);
}

/// Head dims 96 and 256 over every KV-cache mode (contiguous and paged, public and secret
/// counts, left padding): d96 in fp16, d256 in bf16.
#[test]
fn kv_cache_head_dims_96_256_match_reference() {
    let name = "kv_cache_head_dims_96_256_match_reference";
    modes_match_reference::<half::f16>(name, DType::F16, &[96]);
    modes_match_reference::<half::bf16>(name, DType::Bf16, &[256]);
}

/// One sequence alone, among 6 and among 63 other sequences of other lengths, in paged caches
/// whose pages are shuffled differently each time, and in contiguous caches: the same bits. The
/// split size comes from the capacity (Sk), so the capacities here share one (8 blocks per split,
/// capacities up to 16384); its bits then also equal plain decode over exactly its keys
/// (`Context::attention`, Sk = 5000, the same split size).
#[test]
fn kv_cache_is_batch_invariant() {
    let Some(ctx) = gpu("kv_cache_is_batch_invariant") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (d, hq, hkv, sq, len) = (128, 32, 8, 1, 5000);
    for causal in [false, true] {
        let mut seen: Option<Vec<u64>> = None;
        for (batch, cap, page) in [
            (1, 5120, 64),
            (7, 6144, 16),
            (64, 6144, 256),
            (1, 5000, 0),
            (7, 5120, 0),
        ] {
            let p = params(DType::Bf16, d, causal, batch, hq, hkv, sq, cap);
            let mut q: Vec<half::bf16> = randn(&mut rng, p.q_len());
            let mut kc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            let mut vc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            // The sequence under test sits at a batch position that changes with the batch.
            let at = batch / 2;
            let mut rng0 = rng_from(s ^ 0x5eed);
            let q0: Vec<half::bf16> = randn(&mut rng0, sq * hq * d);
            let k0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
            let v0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
            let qrow = sq * hq * d;
            q[at * qrow..(at + 1) * qrow].copy_from_slice(&q0);
            let krow = cap * hkv * d;
            kc[at * krow..at * krow + k0.len()].copy_from_slice(&k0);
            vc[at * krow..at * krow + v0.len()].copy_from_slice(&v0);
            let counts: Vec<usize> = (0..batch)
                .map(|b| {
                    if b == at {
                        len
                    } else {
                        rng.random_range(0..=cap)
                    }
                })
                .collect();
            let c = layout(&mut rng, &p, &kc, &vc, page, 5);
            let (out, _) = run(&ctx, &p, &q, &c, &counts, false).unwrap();
            let mine = bits(&out[at * qrow..(at + 1) * qrow]);
            match &seen {
                None => seen = Some(mine),
                Some(first) => assert_eq!(
                    first, &mine,
                    "seed {s}: causal {causal} batch {batch} cap {cap} page {page}: bits moved"
                ),
            }
        }
        // Plain decode over exactly the sequence's keys: the same bits.
        let p = params(DType::Bf16, d, causal, 1, hq, hkv, sq, len);
        let mut rng0 = rng_from(s ^ 0x5eed);
        let q0: Vec<half::bf16> = randn(&mut rng0, sq * hq * d);
        let k0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
        let v0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
        let (dq, dk, dv) = (
            ctx.upload(&q0).unwrap(),
            ctx.upload(&k0).unwrap(),
            ctx.upload(&v0).unwrap(),
        );
        let mut dout = ctx
            .upload(&vec![poison::<half::bf16>(); p.q_len()])
            .unwrap();
        ctx.attention(&p, &dq, &dk, &dv, &mut dout, None).unwrap();
        assert_eq!(
            seen.as_ref().unwrap(),
            &bits(&ctx.download(&dout).unwrap()),
            "seed {s}: causal {causal}: the cache path differs from plain decode"
        );
        eprintln!("ok batch invariance causal {causal}");
    }
}

/// The prefill-consistent mode: a decode step over a cache of t keys gives exactly the bits of
/// rows t − Sq … t − 1 of the causal prefill of the whole sequence — for every sequence of a
/// batch at its own t, contiguous or paged, public or secret counts, one query or four, GQA and
/// MQA.
fn prefill_consistent<T: Element>(name: &str, dtype: DType, d: usize, hq: usize, hkv: usize) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (total, cap) = (1000, 1280);
    let pre = params(dtype, d, true, 1, hq, hkv, total, total);
    let q: Vec<T> = randn(&mut rng, pre.q_len());
    let k: Vec<T> = randn(&mut rng, pre.kv_len());
    let v: Vec<T> = randn(&mut rng, pre.kv_len());
    // The prefill, checked against the float64 reference (poisoned output, no NaN).
    let pre_out = run_inputs(&ctx, &pre, &q, &k, &v).unwrap_or_else(|e| panic!("seed {s}: {e}"));
    let prefill = bits(&pre_out.out);
    let (qrow, krow) = (hq * d, hkv * d);
    for sq in [1, 4] {
        // Each sequence of the batch is the same sequence at its own step t.
        let steps = [4, 17, 128, 129, 513, total];
        let b = steps.len();
        let p = params(dtype, d, true, b, hq, hkv, sq, cap);
        let mut qd = Vec::with_capacity(p.q_len());
        let mut kc: Vec<T> = randn(&mut rng, p.kv_len());
        let mut vc: Vec<T> = randn(&mut rng, p.kv_len());
        for (i, &t) in steps.iter().enumerate() {
            qd.extend_from_slice(&q[(t - sq) * qrow..t * qrow]);
            kc[i * cap * krow..i * cap * krow + total * krow].copy_from_slice(&k);
            vc[i * cap * krow..i * cap * krow + total * krow].copy_from_slice(&v);
        }
        for page in [0, 64] {
            let c = layout(&mut rng, &p, &kc, &vc, page, 3);
            for secret in [false, true] {
                let (out, _) = run_mode(&ctx, &p, &qd, &c, &steps, None, secret, true).unwrap();
                for (i, &t) in steps.iter().enumerate() {
                    assert_eq!(
                        bits(&out[i * sq * qrow..(i + 1) * sq * qrow]),
                        prefill[(t - sq) * qrow..t * qrow],
                        "seed {s}: Sq {sq} t {t} page {page} secret {secret}: not the prefill's bits"
                    );
                }
            }
        }
    }
    eprintln!("ok prefill-consistent {dtype:?} d{d} {hq}/{hkv}");
}

#[test]
fn kv_cache_prefill_consistent_f16_d64() {
    prefill_consistent::<half::f16>("kv_cache_prefill_consistent_f16_d64", DType::F16, 64, 8, 8);
}

#[test]
fn kv_cache_prefill_consistent_bf16_d128_gqa() {
    prefill_consistent::<half::bf16>(
        "kv_cache_prefill_consistent_bf16_d128_gqa",
        DType::Bf16,
        128,
        32,
        8,
    );
}

#[test]
fn kv_cache_prefill_consistent_f16_d128_mqa() {
    prefill_consistent::<half::f16>(
        "kv_cache_prefill_consistent_f16_d128_mqa",
        DType::F16,
        128,
        8,
        1,
    );
}

/// The append writes each sequence's new rows at its length — across page boundaries in a paged
/// pool — and nothing else; bad inputs are errors before anything is written or launched.
#[test]
fn kv_cache_append_and_bad_inputs() {
    let Some(ctx) = gpu("kv_cache_append_and_bad_inputs") else {
        return;
    };
    let mut rng = rng_from(seed());
    let p = params(DType::F16, 64, true, 2, 4, 2, 2, 64);
    let row = p.heads_kv * p.head_dim;
    // Contiguous.
    let cache: Vec<half::f16> = randn(&mut rng, p.kv_len());
    let new: Vec<half::f16> = randn(&mut rng, 2 * 2 * row);
    let mut dc = ctx.upload(&cache).unwrap();
    let dn = ctx.upload(&new).unwrap();
    ctx.append_kv(&p, &mut dc, &dn, &[10, 62], None).unwrap();
    let mut want = cache.clone();
    for (b, len) in [(0usize, 10usize), (1, 62)] {
        let dst = (b * p.seqlen_k + len) * row;
        want[dst..dst + 2 * row].copy_from_slice(&new[b * 2 * row..(b + 1) * 2 * row]);
    }
    assert_eq!(
        bits(&ctx.download(&dc).unwrap()),
        bits(&want),
        "append wrote the wrong rows"
    );
    match ctx.append_kv(&p, &mut dc, &dn, &[10, 63], None) {
        Err(flashcore::Error::InvalidArgument {
            arg: "cache_seqlens",
            ..
        }) => {}
        other => panic!("expected InvalidArgument for cache_seqlens, got {other:?}"),
    }
    // A length that wraps around with the new rows, and a shape without rows: errors, no panic.
    match ctx.append_kv(&p, &mut dc, &dn, &[10, usize::MAX], None) {
        Err(flashcore::Error::InvalidArgument {
            arg: "cache_seqlens",
            ..
        }) => {}
        other => panic!("expected InvalidArgument for cache_seqlens, got {other:?}"),
    }
    let empty = flashcore::attention::AttentionParams {
        batch: 0,
        ..p.clone()
    };
    match ctx.append_kv(&empty, &mut dc, &dn, &[], None) {
        Err(flashcore::Error::InvalidArgument { arg: "params", .. }) => {}
        other => panic!("expected InvalidArgument for params, got {other:?}"),
    }
    assert_eq!(
        bits(&ctx.download(&dc).unwrap()),
        bits(&want),
        "a refused append wrote"
    );
    // Paged: 16-row pages, sequence 0 appends across a page boundary (rows 15, 16).
    let pages = Pages {
        page_size: 16,
        num_pages: 9,
    };
    let table = vec![3, 0, 7, 1, 8, 2, 5, 4]; // [2, 4]
    let pool: Vec<half::f16> = randn(&mut rng, pages.num_pages * 16 * row);
    let mut dpool = ctx.upload(&pool).unwrap();
    ctx.append_kv(&p, &mut dpool, &dn, &[15, 40], Some((&table, pages)))
        .unwrap();
    let mut want = pool.clone();
    for (b, len) in [(0usize, 15usize), (1, 40)] {
        for i in 0..2 {
            let r = len + i;
            let pg = table[b * 4 + r / 16] as usize;
            let dst = (pg * 16 + r % 16) * row;
            let src = (b * 2 + i) * row;
            want[dst..dst + row].copy_from_slice(&new[src..src + row]);
        }
    }
    assert_eq!(
        bits(&ctx.download(&dpool).unwrap()),
        bits(&want),
        "paged append wrote the wrong rows"
    );
    // A page outside the pool: refused before any write.
    let bad_table = vec![3, 0, 7, 1, 8, 9, 5, 4];
    match ctx.append_kv(&p, &mut dpool, &dn, &[15, 18], Some((&bad_table, pages))) {
        Err(flashcore::Error::InvalidArgument {
            arg: "block_table", ..
        }) => {}
        other => panic!("expected InvalidArgument for block_table, got {other:?}"),
    }
    assert_eq!(
        bits(&ctx.download(&dpool).unwrap()),
        bits(&want),
        "a refused append wrote"
    );

    // Attention: every bad metadata input is an InvalidArgument naming it.
    let q: Vec<half::f16> = randn(&mut rng, p.q_len());
    let contiguous = Layouted {
        k: want.clone(),
        v: want.clone(),
        table: None,
    };
    let paged = |t: Vec<i32>, pg: Pages| Layouted {
        k: pool.clone(),
        v: pool.clone(),
        table: Some((t, pg)),
    };
    let expect = |r: flashcore::Result<(Vec<half::f16>, Vec<f32>)>, arg: &str| match r {
        Err(flashcore::Error::InvalidArgument { arg: a, .. }) if a == arg => {}
        other => panic!(
            "expected InvalidArgument for {arg}, got {:?}",
            other.map(|_| ())
        ),
    };
    let _ = contiguous;
    let cont = Layouted {
        k: cache.clone(),
        v: cache.clone(),
        table: None,
    };
    expect(run(&ctx, &p, &q, &cont, &[1], false), "seqlens_k"); // one count for two sequences
    expect(run(&ctx, &p, &q, &cont, &[1, 65], false), "seqlens_k"); // past the capacity
                                                                    // Left padding: one start per sequence, each within [0, its public count].
    let leftpad = |starts: &[usize], secret| {
        run_mode(&ctx, &p, &q, &cont, &[5, 9], Some(starts), secret, false)
    };
    expect(leftpad(&[0], false), "cache_leftpad");
    expect(leftpad(&[6, 0], false), "cache_leftpad");
    assert!(
        leftpad(&[6, 0], true).is_ok(),
        "secret counts: starts are clamped on the device"
    );
    assert!(
        leftpad(&[5, 9], false).is_ok(),
        "a start at the count leaves no key"
    );
    expect(
        run(
            &ctx,
            &p,
            &q,
            &paged(bad_table.clone(), pages),
            &[20, 20],
            false,
        ),
        "block_table",
    );
    expect(
        run(&ctx, &p, &q, &paged(vec![0; 6], pages), &[20, 20], false),
        "block_table",
    ); // table too short
    expect(
        run(
            &ctx,
            &p,
            &q,
            &paged(
                table.clone(),
                Pages {
                    page_size: 24,
                    num_pages: 6,
                },
            ),
            &[20, 20],
            false,
        ),
        "seqlen_k",
    ); // a capacity of 64 is no whole number of 24-row pages
    expect(
        run(
            &ctx,
            &p,
            &q,
            &paged(
                table.clone(),
                Pages {
                    page_size: 0,
                    num_pages: 18,
                },
            ),
            &[20, 20],
            false,
        ),
        "page_size",
    );
    expect(
        run(
            &ctx,
            &p,
            &q,
            &paged(
                table.clone(),
                Pages {
                    page_size: 8,
                    num_pages: 18,
                },
            ),
            &[20, 20],
            false,
        ),
        "block_table",
    ); // 8-row pages need 8 entries per sequence: the table is too short
       // Secret counts: the table is walked whole, so every entry must be inside the pool.
    expect(
        run(
            &ctx,
            &p,
            &q,
            &paged(vec![3, 0, 7, 1, 8, 2, 5, -1], pages),
            &[20, 20],
            true,
        ),
        "block_table",
    );
    // The same table is fine with public counts that never reach the bad slot.
    run(
        &ctx,
        &p,
        &q,
        &paged(vec![3, 0, 7, 1, 8, 2, 5, -1], pages),
        &[20, 20],
        false,
    )
    .unwrap();
    let long = AttentionParams {
        seqlen_q: 17,
        ..p.clone()
    };
    let q17: Vec<half::f16> = randn(&mut rng, long.q_len());
    expect(run(&ctx, &long, &q17, &cont, &[1, 2], false), "seqlen_q");
}
