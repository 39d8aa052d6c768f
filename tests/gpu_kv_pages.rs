//! Paged KV caches of any page size on the GPU (flash-attn's semantics: SGLang's 1, vLLM's 16,
//! and sizes that are no power of two). Pages that are powers of two of at least 16 rows load as
//! TMA boxes; every other size is gathered row by row (kernels/fc_producer.cuh). For each page
//! size: the float64 reference, the bits of the same cache stored contiguously (whatever the
//! page size, the load path or where the pages live, with every unused row and page poisoned
//! with NaN and ±Inf), a sequence's bits among other neighbours and other physical pages, the
//! append into pages of 1 and 7 rows, and bad page sizes and tables as errors before any launch.
//! Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, KvCache, Layout, Pages};
use rand::seq::SliceRandom;
use rand::Rng;

/// Divisible by every page size below: 1, 7, 16, 48, 64, 256 (so they share one split size).
const CAP: usize = 5376;
const PAGES: [usize; 6] = [1, 7, 16, 48, 64, 256];

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

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

const BAD: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// `x` (`[B, cap, Hkv, D]`) with every row at or past sequence b's count set to NaN, +Inf or
/// −Inf (by row).
fn poison_unused<T: Element>(p: &AttentionParams, x: &[T], counts: &[usize]) -> Vec<T> {
    let row = p.heads_kv * p.head_dim;
    let mut y = x.to_vec();
    for (b, &n) in counts.iter().enumerate() {
        for r in n..p.seqlen_k {
            let at = (b * p.seqlen_k + r) * row;
            y[at..at + row].fill(T::from_f64(BAD[r % 3]));
        }
    }
    y
}

/// The caches `kc`, `vc` (`[B, cap, Hkv, D]`) as pools of `page`-row pages in a random order,
/// with `spare` more pages no sequence uses, poisoned; and the block table.
fn paged<T: Element>(
    rng: &mut impl Rng,
    p: &AttentionParams,
    kc: &[T],
    vc: &[T],
    page: usize,
    spare: usize,
) -> (Vec<T>, Vec<T>, Vec<i32>, Pages) {
    let row = p.heads_kv * p.head_dim;
    let slots = p.seqlen_k / page;
    let num_pages = p.batch * slots + spare;
    let mut order: Vec<usize> = (0..num_pages).collect();
    order.shuffle(rng);
    let poison = |i: usize| T::from_f64(BAD[i % 3]);
    let mut k: Vec<T> = (0..num_pages * page * row).map(poison).collect();
    let mut v = k.clone();
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
    (
        k,
        v,
        table,
        Pages {
            page_size: page,
            num_pages,
        },
    )
}

/// One KV-cache call (no append), paged when `table` is given; returns (out, lse).
#[allow(clippy::too_many_arguments)]
fn run<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    table: Option<(&[i32], Pages)>,
    counts: &[usize],
    secret: bool,
) -> flashcore::Result<(Vec<T>, Vec<f32>)> {
    let dq = ctx.upload(q)?;
    let (dk, dv) = (ctx.upload(k)?, ctx.upload(v)?);
    let dl = ctx.upload(&counts.iter().map(|&n| n as i32).collect::<Vec<_>>())?;
    let dt = match table {
        Some((t, _)) => Some(ctx.upload(t)?),
        None => None,
    };
    let mut cache = match (&dt, table) {
        (Some(dt), Some((_, pg))) => KvCache::paged(&dk, &dv, &dl, dt, pg),
        _ => KvCache::contiguous(&dk, &dv, &dl),
    };
    if secret {
        cache = cache.secret();
    }
    let mut dout = ctx.upload(&vec![poison::<T>(); p.q_len()])?;
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()])?;
    ctx.attention_kv_cache(p, &dq, &cache, &mut dout, Some(&mut dlse))?;
    Ok((ctx.download(&dout)?, ctx.download(&dlse)?))
}

/// Every page size against the float64 reference and against the contiguous cache's bits, for
/// public and secret counts; decode (Sq = 1) and Sq = 4 (causal), GQA and MQA.
fn pages_match<T: Element>(name: &str, dtype: DType, head_dims: &[usize], secret_pages: &[usize]) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let counts = [0usize, 1, 7, 1000, CAP, 333];
    let tol = tolerance(dtype);
    for &d in head_dims {
        for (sq, causal, hq, hkv) in [(1, false, 8, 2), (4, true, 8, 1), (4, false, 4, 4)] {
            let p = params(dtype, d, causal, counts.len(), hq, hkv, sq, CAP);
            let q: Vec<T> = randn(&mut rng, p.q_len());
            let kc = poison_unused(&p, &randn::<T>(&mut rng, p.kv_len()), &counts);
            let vc = poison_unused(&p, &randn::<T>(&mut rng, p.kv_len()), &counts);
            let zero = [0usize; 6];
            let r = flashcore::reference::kv_cache_leftpad_f64(
                &p,
                &f64s(&q),
                &f64s(&kc),
                &f64s(&vc),
                &zero,
                &counts,
            );
            for secret in [false, true] {
                let (want, _) = run(&ctx, &p, &q, &kc, &vc, None, &counts, secret).unwrap();
                let pages: &[usize] = if secret { secret_pages } else { &PAGES };
                for &page in pages {
                    let (k, v, t, pg) = paged(&mut rng, &p, &kc, &vc, page, 3);
                    let (out, lse) =
                        run(&ctx, &p, &q, &k, &v, Some((&t, pg)), &counts, secret).unwrap();
                    let what = format!(
                        "seed {s}: d{d} sq{sq} causal {causal} hq{hq} hkv{hkv} page {page} ({}) secret {secret}",
                        if pg.tma_boxes() { "TMA" } else { "gathered" }
                    );
                    assert!(
                        bits(&out) == bits(&want),
                        "{what}: bits differ from the contiguous cache's"
                    );
                    let row = p.seqlen_q * p.heads_q * p.head_dim;
                    let per = p.heads_q * p.seqlen_q;
                    for (b, &n) in counts.iter().enumerate() {
                        let got = f64s(&out[b * row..(b + 1) * row]);
                        assert!(
                            got.iter().all(|x| x.is_finite()),
                            "{what}: sequence {b}: non-finite output"
                        );
                        let got_lse = &lse[b * per..(b + 1) * per];
                        if n == 0 {
                            assert!(got.iter().all(|&x| x == 0.0), "{what}: empty cache: O = 0");
                            assert!(
                                got_lse.iter().all(|&x| x == f32::NEG_INFINITY),
                                "{what}: empty cache: LSE −inf"
                            );
                            continue;
                        }
                        let err =
                            flashcore::reference::rel_l2(&got, &r.out[b * row..(b + 1) * row]);
                        assert!(err <= tol, "{what}: sequence {b}: err {err:.3e}");
                        // Causal rows that see no key (Sq > the count): LSE −inf, like the
                        // reference's; the others within tolerance.
                        let want_lse = &r.lse[b * per..(b + 1) * per];
                        let (mut gl, mut wl) = (Vec::new(), Vec::new());
                        for (&g, &w) in got_lse.iter().zip(want_lse) {
                            if w == f64::NEG_INFINITY {
                                assert!(
                                    g == f32::NEG_INFINITY,
                                    "{what}: sequence {b}: LSE {g}, want −inf"
                                );
                            } else {
                                gl.push(g as f64);
                                wl.push(w);
                            }
                        }
                        let lerr = flashcore::reference::rel_l2(&gl, &wl);
                        assert!(lerr <= 1e-3, "{what}: sequence {b}: LSE err {lerr:.3e}");
                    }
                    eprintln!("ok {what}");
                }
            }
        }
    }
}

#[test]
fn any_page_size_bf16_d128_matches_reference_and_contiguous_bits() {
    pages_match::<half::bf16>(
        "any_page_size_bf16_d128_matches_reference_and_contiguous_bits",
        DType::Bf16,
        &[128],
        &[1, 7, 64],
    );
}

#[test]
fn any_page_size_f16_d64_matches_reference_and_contiguous_bits() {
    pages_match::<half::f16>(
        "any_page_size_f16_d64_matches_reference_and_contiguous_bits",
        DType::F16,
        &[64],
        &[1, 48],
    );
}

/// d96 (64-byte swizzle, 12 pieces per row) and d256 (64-key blocks, 32 pieces per row).
#[test]
fn any_page_size_d96_d256_match_reference_and_contiguous_bits() {
    let name = "any_page_size_d96_d256_match_reference_and_contiguous_bits";
    pages_match::<half::f16>(name, DType::F16, &[96], &[7]);
    pages_match::<half::bf16>(name, DType::Bf16, &[256], &[1]);
}

/// One sequence alone and among 4 and 23 others of random lengths, in pools of 1-, 7- and
/// 48-row pages shuffled differently each time (and contiguous): the same bits.
#[test]
fn gathered_pages_are_batch_invariant() {
    let Some(ctx) = gpu("gathered_pages_are_batch_invariant") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (d, hq, hkv, sq, len) = (128, 32, 8, 1, 3001);
    for causal in [false, true] {
        let mut seen: Option<Vec<u64>> = None;
        for (batch, page) in [(1, 0), (5, 1), (24, 7), (1, 7), (5, 48), (24, 1)] {
            let p = params(DType::Bf16, d, causal, batch, hq, hkv, sq, CAP);
            let mut q: Vec<half::bf16> = randn(&mut rng, p.q_len());
            let mut kc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            let mut vc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            let at = batch / 2;
            let mut rng0 = rng_from(s ^ 0x5eed);
            let q0: Vec<half::bf16> = randn(&mut rng0, sq * hq * d);
            let k0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
            let v0: Vec<half::bf16> = randn(&mut rng0, len * hkv * d);
            let qrow = sq * hq * d;
            q[at * qrow..(at + 1) * qrow].copy_from_slice(&q0);
            let krow = CAP * hkv * d;
            kc[at * krow..at * krow + k0.len()].copy_from_slice(&k0);
            vc[at * krow..at * krow + v0.len()].copy_from_slice(&v0);
            let counts: Vec<usize> = (0..batch)
                .map(|b| {
                    if b == at {
                        len
                    } else {
                        rng.random_range(0..=CAP)
                    }
                })
                .collect();
            let (kc, vc) = (
                poison_unused(&p, &kc, &counts),
                poison_unused(&p, &vc, &counts),
            );
            let (out, _) = if page == 0 {
                run(&ctx, &p, &q, &kc, &vc, None, &counts, false).unwrap()
            } else {
                let (k, v, t, pg) = paged(&mut rng, &p, &kc, &vc, page, 5);
                run(&ctx, &p, &q, &k, &v, Some((&t, pg)), &counts, false).unwrap()
            };
            let mine = bits(&out[at * qrow..(at + 1) * qrow]);
            match &seen {
                None => seen = Some(mine),
                Some(f) => assert!(
                    f == &mine,
                    "seed {s}: causal {causal} batch {batch} page {page}: the sequence's bits changed"
                ),
            }
            eprintln!("ok batch-invariant causal {causal} batch {batch} page {page}");
        }
    }
}

/// The append into pools of 1- and 7-row pages: each sequence's new rows land in the pages its
/// table names (across page boundaries), nothing else changes; the attention after it has the
/// bits of the same append into a contiguous cache.
#[test]
fn append_into_pages_of_1_and_7_rows() {
    let Some(ctx) = gpu("append_into_pages_of_1_and_7_rows") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 70; // 70 pages of 1 row, 10 of 7
    let p = params(DType::F16, 64, true, 3, 8, 2, 3, cap);
    let row = p.heads_kv * p.head_dim;
    let lens = [0usize, 6, 60];
    let counts: Vec<usize> = lens.iter().map(|&l| l + p.seqlen_q).collect();
    let kc: Vec<half::f16> = randn(&mut rng, p.kv_len());
    let vc: Vec<half::f16> = randn(&mut rng, p.kv_len());
    let kn: Vec<half::f16> = randn(&mut rng, p.batch * p.seqlen_q * row);
    let vn: Vec<half::f16> = randn(&mut rng, p.batch * p.seqlen_q * row);
    let q: Vec<half::f16> = randn(&mut rng, p.q_len());
    // The contiguous reference: append, then attend.
    let (mut dk, mut dv) = (ctx.upload(&kc).unwrap(), ctx.upload(&vc).unwrap());
    let (dkn, dvn) = (ctx.upload(&kn).unwrap(), ctx.upload(&vn).unwrap());
    ctx.append_kv(&p, &mut dk, &dkn, &lens, None).unwrap();
    ctx.append_kv(&p, &mut dv, &dvn, &lens, None).unwrap();
    let (kc2, vc2) = (ctx.download(&dk).unwrap(), ctx.download(&dv).unwrap());
    let (want, _) = run(&ctx, &p, &q, &kc2, &vc2, None, &counts, false).unwrap();
    for page in [1usize, 7] {
        let (k, v, t, pg) = paged(&mut rng, &p, &kc, &vc, page, 4);
        let (mut dpk, mut dpv) = (ctx.upload(&k).unwrap(), ctx.upload(&v).unwrap());
        ctx.append_kv(&p, &mut dpk, &dkn, &lens, Some((&t, pg)))
            .unwrap();
        ctx.append_kv(&p, &mut dpv, &dvn, &lens, Some((&t, pg)))
            .unwrap();
        let (gk, gv) = (ctx.download(&dpk).unwrap(), ctx.download(&dpv).unwrap());
        let mut wk = k.clone();
        let mut wv = v.clone();
        for (b, &len) in lens.iter().enumerate() {
            for i in 0..p.seqlen_q {
                let r = len + i;
                let dst = (t[b * (cap / page) + r / page] as usize * page + r % page) * row;
                let src = (b * p.seqlen_q + i) * row;
                wk[dst..dst + row].copy_from_slice(&kn[src..src + row]);
                wv[dst..dst + row].copy_from_slice(&vn[src..src + row]);
            }
        }
        assert!(bits(&gk) == bits(&wk), "seed {s}: page {page}: K append");
        assert!(bits(&gv) == bits(&wv), "seed {s}: page {page}: V append");
        let (out, _) = run(&ctx, &p, &q, &gk, &gv, Some((&t, pg)), &counts, false).unwrap();
        assert!(
            bits(&out) == bits(&want),
            "seed {s}: page {page}: attention after the append differs from the contiguous cache's"
        );
        eprintln!("ok append page {page}");
    }
}

/// A page of no row, a capacity that is not a whole number of pages, and a used table entry
/// outside the pool: each an InvalidArgument naming it, before anything is launched (the
/// poisoned output stays as it was).
#[test]
fn bad_page_sizes_and_tables_are_errors_before_launch() {
    let Some(ctx) = gpu("bad_page_sizes_and_tables_are_errors_before_launch") else {
        return;
    };
    let mut rng = rng_from(seed());
    let p = params(DType::Bf16, 128, false, 2, 8, 2, 1, 49);
    let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let pool: Vec<half::bf16> = randn(&mut rng, 16 * 7 * p.heads_kv * p.head_dim);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&pool).unwrap(),
        ctx.upload(&pool).unwrap(),
    );
    let dl = ctx.upload(&[20i32, 49]).unwrap();
    type Case = (
        usize,
        usize,
        Vec<i32>,
        AttentionParams,
        &'static str,
        &'static str,
    );
    let cases: [Case; 4] = [
        (0, 16, vec![0; 14], p.clone(), "page_size", "at least 1 row"),
        (
            7,
            16,
            vec![0; 14],
            params(DType::Bf16, 128, false, 2, 8, 2, 1, 50),
            "seqlen_k",
            "not a multiple of 7",
        ),
        (
            7,
            16,
            // Sequence 0's third page (rows 14–20, its keys end at 20): past the pool.
            vec![0, 1, 16, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
            p.clone(),
            "block_table",
            "",
        ),
        (
            7,
            16,
            // Sequence 1's last page (it holds 49 keys): negative.
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1],
            p.clone(),
            "block_table",
            "",
        ),
    ];
    for (page, num_pages, table, pp, want_arg, want_rule) in cases {
        let dt = ctx.upload(&table).unwrap();
        let cache = KvCache::paged(
            &dk,
            &dv,
            &dl,
            &dt,
            Pages {
                page_size: page,
                num_pages,
            },
        );
        let mut dout = ctx
            .upload(&vec![poison::<half::bf16>(); pp.q_len()])
            .unwrap();
        match ctx.attention_kv_cache(&pp, &dq, &cache, &mut dout, None) {
            Err(flashcore::Error::InvalidArgument { arg, rule }) => {
                assert_eq!(arg, want_arg, "page {page}: {rule}");
                assert!(rule.contains(want_rule), "page {page}: {rule}");
            }
            other => panic!("page {page}: expected InvalidArgument for {want_arg}, got {other:?}"),
        }
        let out = ctx.download(&dout).unwrap();
        assert!(
            bits(&out) == bits(&vec![poison::<half::bf16>(); pp.q_len()]),
            "page {page}: a refused call wrote its output"
        );
    }
}

/// Speed of one decode shape (bf16, B = 8, 32/8 heads, D 128, Sq 1, 7168 cached keys each) over
/// a contiguous cache and pools of 64-, 7- and 1-row pages: microseconds per call over 500
/// back-to-back launches of one plan (stream-ordered, no graph, no host checks). Ignored by
/// default (a measurement, not a check): `cargo test --release --test gpu_kv_pages -- --ignored
/// --nocapture page_size_speed`.
#[test]
#[ignore]
fn page_size_speed() {
    use cudarc::driver::DevicePtr;
    let Some(ctx) = gpu("page_size_speed") else {
        return;
    };
    let mut rng = rng_from(7);
    let cap = 7168;
    let p = params(DType::Bf16, 128, false, 8, 32, 8, 1, cap);
    let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let kc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let vc: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let counts = vec![cap; p.batch];
    let dq = ctx.upload(&q).unwrap();
    let dl = ctx
        .upload(&counts.iter().map(|&n| n as i32).collect::<Vec<_>>())
        .unwrap();
    let dout = ctx
        .upload(&vec![poison::<half::bf16>(); p.q_len()])
        .unwrap();
    for page in [0usize, 64, 7, 1] {
        let (k, v, t, pages) = if page == 0 {
            (kc.clone(), vc.clone(), vec![0i32], None)
        } else {
            let (k, v, t, pg) = paged(&mut rng, &p, &kc, &vc, page, 0);
            (k, v, t, Some(pg))
        };
        let (dk, dv, dt) = (
            ctx.upload(&k).unwrap(),
            ctx.upload(&v).unwrap(),
            ctx.upload(&t).unwrap(),
        );
        let plan = ctx.plan_kv_cache(&p, false, pages).unwrap();
        let s = ctx.stream();
        let ptr = |x: u64| x;
        let (qp, _a) = dq.device_ptr(s);
        let (kp, _b) = dk.device_ptr(s);
        let (vp, _c) = dv.device_ptr(s);
        let (op, _d) = dout.device_ptr(s);
        let (lp, _e) = dl.device_ptr(s);
        let (tp, _f) = dt.device_ptr(s);
        let table = if pages.is_some() { ptr(tp) } else { 0 };
        let launch = || unsafe {
            plan.launch_raw_kv_cache(qp, kp, vp, op, 0, lp, table, 0)
                .unwrap()
        };
        for _ in 0..50 {
            launch();
        }
        ctx.synchronize().unwrap();
        let n = 500;
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            launch();
        }
        ctx.synchronize().unwrap();
        let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
        let bytes = 2.0 * p.kv_len() as f64 * 2.0;
        eprintln!(
            "speed page {page:3} ({}): {us:.2} us/call, {:.2} TB/s of K/V",
            match pages {
                None => "contiguous",
                Some(pg) if pg.tma_boxes() => "TMA boxes",
                Some(_) => "gathered",
            },
            bytes / (us * 1e-6) / 1e12
        );
    }
}
