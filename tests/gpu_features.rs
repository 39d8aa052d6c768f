//! GPU correctness of the window, softcap and sink features against the float64 reference: sliding windows
//! (`window_size`, with whole key blocks skipped), softcap, learnable sinks, and their
//! combinations with causal masks, GQA, Sq ≠ Sk and odd lengths (S = 1, 17, 1000: decode, split
//! and plain tiles). NaN-free on rows whose window holds no key (O = 0, LSE = −inf, or the sink
//! with one), deterministic and batch-invariant. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, Window};
use flashcore::reference;
use rand::Rng;

/// One launch with optional sinks; O, LSE and the reference's verdict.
fn run_features<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    sinks: Option<&[f32]>,
) -> Result<(Vec<T>, Vec<f32>, f64), String> {
    let e = |e: flashcore::Error| format!("{p:?}: {e}");
    let (dq, dk, dv) = upload_qkv(ctx, q, k, v);
    let mut dout = ctx.upload(&vec![poison::<T>(); p.q_len()]).map_err(e)?;
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).map_err(e)?;
    match sinks {
        Some(s) => {
            let ds = ctx.upload(s).map_err(e)?;
            ctx.attention_with_sinks(p, &dq, &dk, &dv, &mut dout, Some(&mut dlse), &ds)
                .map_err(e)?
        }
        None => ctx
            .attention(p, &dq, &dk, &dv, &mut dout, Some(&mut dlse))
            .map_err(e)?,
    }
    let out: Vec<T> = ctx.download(&dout).map_err(e)?;
    let lse: Vec<f32> = ctx.download(&dlse).map_err(e)?;

    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let s64: Option<Vec<f64>> = sinks.map(|s| s.iter().map(|&x| x as f64).collect());
    let want = reference::attention_f64_sinks(p, &f(q), &f(k), &f(v), s64.as_deref());
    let got = f(&out);
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!("{p:?}: non-finite output at {i}: {}", got[i]));
    }
    let out_err = reference::rel_l2(&got, &want.out);
    let (mut gl, mut wl) = (Vec::new(), Vec::new());
    for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
        if w == f64::NEG_INFINITY {
            if g != f32::NEG_INFINITY {
                return Err(format!(
                    "{p:?}: lse[{i}] = {g}, a row with no key and no sink gives -inf"
                ));
            }
        } else if !g.is_finite() {
            return Err(format!("{p:?}: lse[{i}] = {g} (want {w})"));
        } else {
            gl.push(g as f64);
            wl.push(w);
        }
    }
    // Rows that see no key: O must be exactly 0 (with or without a sink).
    let hq = p.heads_q;
    let strides = p.layout.strides(p.seqlen_q, hq, p.head_dim);
    for b in 0..p.batch {
        for h in 0..hq {
            for i in 0..p.seqlen_q {
                if (0..p.seqlen_k).any(|j| p.sees(i, j)) {
                    continue;
                }
                let at = b * strides[0] + i * strides[1] + h * strides[2];
                if got[at..at + p.head_dim].iter().any(|&x| x != 0.0) {
                    return Err(format!("{p:?}: row {i} sees no key but O is not 0"));
                }
            }
        }
    }
    let lse_err = if wl.is_empty() {
        0.0
    } else {
        reference::rel_l2(&gl, &wl)
    };
    let tol = tolerance(p.dtype);
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(out_err <= tol) {
        return Err(format!(
            "{p:?} sinks {}: output rel L2 {out_err:.3e} > {tol:.0e}",
            sinks.is_some()
        ));
    }
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(lse_err <= 1e-3) {
        return Err(format!(
            "{p:?} sinks {}: LSE rel L2 {lse_err:.3e} > 1e-3",
            sinks.is_some()
        ));
    }
    Ok((out, lse, out_err))
}

fn sinks_for(rng: &mut impl Rng, heads: usize) -> Vec<f32> {
    (0..heads).map(|_| rng.random_range(-3.0f32..3.0)).collect()
}

/// A window from flash-attn's (left, right).
fn w(left: i64, right: i64) -> Window {
    Window::from_flash_attn(left, right)
}

fn sweep<T: Element>(ctx: &Context, dtype: DType, seed: u64, head_dims: &[usize]) -> Vec<String> {
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    // (B, Hq, Hkv, Sq, Sk, causal, window, softcap, sinks)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(usize, usize, usize, usize, usize, bool, Window, f32, bool)> = vec![
        // Windows alone, both sides, one side, zero width; block skipping over long keys.
        (1, 2, 2, 1000, 1000, false, w(100, 50), 0.0, false),
        (1, 2, 2, 1000, 1000, false, w(-1, 30), 0.0, false),
        (1, 2, 2, 1000, 1000, false, w(200, -1), 0.0, false),
        (1, 2, 2, 17, 17, false, w(0, 0), 0.0, false),
        (2, 2, 1, 2048, 2048, false, w(300, 300), 0.0, false),
        (1, 2, 2, 4100, 4300, true, w(512, 0), 0.0, false),
        // Causal + window + GQA + softcap, Sq ≠ Sk both ways.
        (2, 4, 2, 1000, 1000, true, w(128, -1), 50.0, false),
        (1, 4, 2, 77, 500, true, w(64, 0), 30.0, false),
        (1, 4, 1, 300, 77, true, w(20, 0), 20.0, false),
        (1, 4, 2, 1, 300, true, w(50, 0), 50.0, false),
        (2, 8, 2, 1, 3000, false, w(700, 0), 0.0, true),
        (1, 2, 2, 17, 17, true, w(3, 0), 5.0, true),
        // Softcap alone (small caps bite), plain and split tiles.
        (1, 2, 2, 1000, 1000, false, w(-1, -1), 5.0, false),
        (1, 2, 2, 64, 1000, true, w(-1, -1), 10.0, false),
        (1, 3, 3, 2048, 2048, true, w(-1, -1), 50.0, false),
        // Sinks alone, with a window, with everything.
        (1, 4, 4, 1000, 1000, false, w(-1, -1), 0.0, true),
        (2, 4, 2, 500, 700, true, w(-1, -1), 0.0, true),
        (1, 4, 2, 1000, 1000, true, w(127, 0), 0.0, true),
        (1, 8, 2, 2048, 2048, true, w(128, 0), 30.0, true),
        // Rows whose window holds no key (bottom-right aligned, Sq > Sk): O = 0, LSE −inf or
        // the sink.
        (1, 2, 2, 300, 20, false, w(5, 5), 0.0, false),
        (1, 2, 2, 300, 20, false, w(5, 5), 0.0, true),
        (1, 2, 1, 1000, 100, true, w(10, 0), 50.0, true),
        (1, 2, 2, 16, 100, false, w(2, -1), 0.0, true),
    ];
    for &head_dim in head_dims {
        for &(b, hq, hkv, sq, sk, causal, window, cap, with_sinks) in &cases {
            let mut p = AttentionParams::new(b, hq, sq, head_dim)
                .seqlen_k(sk)
                .dtype(dtype)
                .causal(causal)
                .window(window)
                .softcap(cap);
            p.heads_kv = hkv;
            let q: Vec<T> = randn(&mut rng, p.q_len());
            let k: Vec<T> = randn(&mut rng, p.kv_len());
            let v: Vec<T> = randn(&mut rng, p.kv_len());
            let sinks = with_sinks.then(|| sinks_for(&mut rng, hq));
            match run_features(ctx, &p, &q, &k, &v, sinks.as_deref()) {
                Ok((_, _, err)) => eprintln!(
                    "ok {} d{head_dim} B{b} H{hq}/{hkv} Sq{sq} Sk{sk} causal {causal} window {:?} cap {cap} sinks {with_sinks}: err {err:.2e}",
                    dtype.name(),
                    window.to_flash_attn()
                ),
                Err(e) => failures.push(e),
            }
        }
    }
    failures
}

fn sweep_test<T: Element>(name: &str, dtype: DType, head_dims: &[usize]) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let failures = sweep::<T>(&ctx, dtype, s, head_dims);
    assert_no_failures(s, &failures);
}

#[test]
fn f16_windows_softcap_sinks_match_reference() {
    sweep_test::<half::f16>(
        "f16_windows_softcap_sinks_match_reference",
        DType::F16,
        &[64, 128],
    );
}

#[test]
fn bf16_windows_softcap_sinks_match_reference() {
    sweep_test::<half::bf16>(
        "bf16_windows_softcap_sinks_match_reference",
        DType::Bf16,
        &[64, 128],
    );
}

/// The same combinations at head dims 96 (Phi-3) and 256 (Gemma 2: softcap 50,
/// windows of 4096 on alternating layers).
#[test]
fn f16_head_dims_96_256_windows_softcap_sinks_match_reference() {
    sweep_test::<half::f16>(
        "f16_head_dims_96_256_windows_softcap_sinks_match_reference",
        DType::F16,
        &[96, 256],
    );
}

#[test]
fn bf16_head_dims_96_256_windows_softcap_sinks_match_reference() {
    sweep_test::<half::bf16>(
        "bf16_head_dims_96_256_windows_softcap_sinks_match_reference",
        DType::Bf16,
        &[96, 256],
    );
}

/// Scores far past the fp16 range's comfort (large inputs, large scale), softcap and sinks on
/// rows that see one key or none: finite everywhere, O = 0 and the right LSE where nothing is
/// visible.
#[test]
fn adversarial_inputs_stay_finite() {
    let Some(ctx) = gpu("adversarial_inputs_stay_finite") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (window, cap) in [(w(0, 0), 0.0f32), (w(1, 0), 50.0), (w(3, 3), 0.0)] {
        let p = AttentionParams::new(1, 2, 200, 64)
            .seqlen_k(40)
            .window(window)
            .softcap(cap)
            .scale(4.0);
        let big = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<half::f16> {
            (0..n)
                .map(|_| half::f16::from_f32(rng.random_range(-200.0f32..200.0)))
                .collect()
        };
        let (q, k, v) = (
            big(&mut rng, p.q_len()),
            big(&mut rng, p.kv_len()),
            randn(&mut rng, p.kv_len()),
        );
        // Sinks far above and below every score.
        for sinks in [None, Some(vec![1e4f32, -1e4]), Some(vec![-80.0f32, 80.0])] {
            let (out, lse) = {
                let (dq, dk, dv) = upload_qkv(&ctx, &q, &k, &v);
                let mut dout = ctx.upload(&vec![poison::<half::f16>(); p.q_len()]).unwrap();
                let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
                match &sinks {
                    Some(sv) => {
                        let ds = ctx.upload(sv).unwrap();
                        ctx.attention_with_sinks(&p, &dq, &dk, &dv, &mut dout, Some(&mut dlse), &ds)
                            .unwrap()
                    }
                    None => ctx
                        .attention(&p, &dq, &dk, &dv, &mut dout, Some(&mut dlse))
                        .unwrap(),
                }
                (ctx.download(&dout).unwrap(), ctx.download(&dlse).unwrap())
            };
            assert!(
                out.iter().all(|x: &half::f16| x.is_finite()),
                "seed {s}: non-finite output, window {window:?} cap {cap} sinks {sinks:?}"
            );
            for h in 0..2 {
                for i in 0..p.seqlen_q {
                    let l = lse[h * p.seqlen_q + i];
                    let sees = (0..p.seqlen_k).any(|j| p.sees(i, j));
                    match (&sinks, sees) {
                        (None, false) => assert_eq!(l, f32::NEG_INFINITY, "seed {s}: row {i}"),
                        (Some(sv), false) => {
                            assert_eq!(l, sv[h], "seed {s}: row {i}: LSE = the sink")
                        }
                        _ => assert!(l.is_finite(), "seed {s}: row {i} lse {l}"),
                    }
                }
            }
        }
    }
}

/// Bitwise identical output run to run, and each sequence's bits the same alone as in a batch.
#[test]
fn features_are_deterministic_and_batch_invariant() {
    let Some(ctx) = gpu("features_are_deterministic_and_batch_invariant") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (d, sq) in [(64, 1000), (128, 1500), (128, 3)] {
        let one = AttentionParams::new(1, 4, sq, d)
            .causal(true)
            .window(w(200, 0))
            .softcap(40.0)
            .dtype(DType::Bf16);
        let batch = AttentionParams {
            batch: 3,
            ..one.clone()
        };
        let q: Vec<half::bf16> = randn(&mut rng, batch.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, batch.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, batch.kv_len());
        let sinks = sinks_for(&mut rng, 4);
        let (all, all_lse, _) = run_features(&ctx, &batch, &q, &k, &v, Some(&sinks)).unwrap();
        let (again, again_lse, _) = run_features(&ctx, &batch, &q, &k, &v, Some(&sinks)).unwrap();
        assert!(
            all.iter()
                .zip(&again)
                .all(|(a, b)| a.to_bits() == b.to_bits())
                && all_lse
                    .iter()
                    .zip(&again_lse)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
            "seed {s}: bits differ between runs"
        );
        let (nq, nk) = (one.q_len(), one.kv_len());
        for b in 0..3 {
            let (o1, l1, _) = run_features(
                &ctx,
                &one,
                &q[b * nq..][..nq],
                &k[b * nk..][..nk],
                &v[b * nk..][..nk],
                Some(&sinks),
            )
            .unwrap();
            assert!(
                o1.iter()
                    .zip(&all[b * nq..])
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "seed {s}: d{d} Sq {sq}: sequence {b}'s output bits depend on its batch"
            );
            let nl = one.lse_len();
            assert!(
                l1.iter()
                    .zip(&all_lse[b * nl..])
                    .all(|(a, c)| a.to_bits() == c.to_bits()),
                "seed {s}: sequence {b}'s LSE bits depend on its batch"
            );
        }
    }
}

/// Bad values are typed errors before any launch.
#[test]
fn bad_feature_arguments_are_rejected() {
    let Some(ctx) = gpu("bad_feature_arguments_are_rejected") else {
        return;
    };
    let p = AttentionParams::new(1, 2, 64, 64);
    let q = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    let mut out = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    for cap in [-1.0f32, f32::NAN, f32::INFINITY] {
        match ctx.attention(&p.clone().softcap(cap), &q, &q, &q, &mut out, None) {
            Err(flashcore::Error::InvalidArgument { arg: "softcap", .. }) => {}
            other => panic!("softcap {cap}: expected InvalidArgument, got {other:?}"),
        }
    }
    // Not yet: windows with secret-length prefill, softcap over a KV cache.
    let lens = ctx.upload(&[64i32]).unwrap();
    let windowed = p.clone().window(w(8, 0));
    match ctx.attention_secret_len(&windowed, &q, &q, &q, &mut out, None, &lens) {
        Err(flashcore::Error::InvalidArgument { arg: "window", .. }) => {}
        other => panic!("window with secret lengths: expected InvalidArgument, got {other:?}"),
    }
    let short = ctx.alloc::<f32>(1).unwrap();
    match ctx.attention_with_sinks(&p, &q, &q, &q, &mut out, None, &short) {
        Err(flashcore::Error::InvalidArgument { arg: "sinks", .. }) => {}
        other => panic!("one sink for two heads: expected InvalidArgument, got {other:?}"),
    }
}

/// KV caches (decode, Sq ≤ 16): windows (masked by select, bottom-right aligned to each
/// sequence's count) and sinks, with public and secret counts and left padding, against the
/// reference sequence by sequence; empty sequences give O = 0 and LSE = the sink.
#[test]
fn kv_cache_windows_and_sinks_match_reference() {
    use flashcore::attention::KvCache;
    let Some(ctx) = gpu("kv_cache_windows_and_sinks_match_reference") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 2048;
    let counts = [0usize, 7, 1999, 2048, 129];
    let starts = [0usize, 3, 1000, 17, 129];
    for d in [64, 128] {
        for (sq, causal, hq, hkv, window) in [
            (1, true, 8, 2, w(127, 0)),
            (4, true, 8, 1, w(300, -1)),
            (3, false, 4, 4, w(50, 2)),
        ] {
            let mut p = AttentionParams::new(counts.len(), hq, sq, d)
                .seqlen_k(cap)
                .dtype(DType::F16)
                .causal(causal)
                .window(window);
            p.heads_kv = hkv;
            let q: Vec<half::f16> = randn(&mut rng, p.q_len());
            let kc: Vec<half::f16> = randn(&mut rng, p.kv_len());
            let vc: Vec<half::f16> = randn(&mut rng, p.kv_len());
            let sinks = sinks_for(&mut rng, hq);
            let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
            let f = |x: &[half::f16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
            for (secret, leftpad, with_sinks) in [
                (false, false, true),
                (true, false, true),
                (false, true, false),
                (true, true, true),
            ] {
                let zero = [0usize; 5];
                let st: &[usize] = if leftpad { &starts } else { &zero };
                let want = reference::kv_cache_sinks_f64(
                    &p,
                    &f(&q),
                    &f(&kc),
                    &f(&vc),
                    st,
                    &counts,
                    with_sinks.then_some(&s64[..]),
                );
                let dq = ctx.upload(&q).unwrap();
                let (dk, dv) = (ctx.upload(&kc).unwrap(), ctx.upload(&vc).unwrap());
                let dl = ctx
                    .upload(&counts.iter().map(|&n| n as i32).collect::<Vec<_>>())
                    .unwrap();
                let ds = ctx
                    .upload(&st.iter().map(|&n| n as i32).collect::<Vec<_>>())
                    .unwrap();
                let dsink = ctx.upload(&sinks).unwrap();
                let mut cache = KvCache::contiguous(&dk, &dv, &dl);
                if secret {
                    cache = cache.secret();
                }
                if leftpad {
                    cache = cache.leftpad(&ds);
                }
                if with_sinks {
                    cache = cache.sinks(&dsink);
                }
                let mut dout = ctx.upload(&vec![poison::<half::f16>(); p.q_len()]).unwrap();
                let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
                ctx.attention_kv_cache(&p, &dq, &cache, &mut dout, Some(&mut dlse))
                    .unwrap_or_else(|e| panic!("seed {s}: {p:?}: {e}"));
                let out = f(&ctx.download(&dout).unwrap());
                let lse: Vec<f32> = ctx.download(&dlse).unwrap();
                let what = format!("seed {s}: d{d} sq{sq} causal {causal} window {:?} secret {secret} leftpad {leftpad} sinks {with_sinks}", window.to_flash_attn());
                assert!(
                    out.iter().all(|x| x.is_finite()),
                    "{what}: non-finite output"
                );
                let err = reference::rel_l2(&out, &want.out);
                assert!(
                    err <= tolerance(DType::F16),
                    "{what}: output rel L2 {err:.3e}"
                );
                for (i, (&g, &wl)) in lse.iter().zip(&want.lse).enumerate() {
                    if wl == f64::NEG_INFINITY {
                        assert_eq!(g, f32::NEG_INFINITY, "{what}: lse[{i}]");
                    } else {
                        assert!(
                            ((g as f64) - wl).abs() <= 1e-3 * wl.abs().max(1.0),
                            "{what}: lse[{i}] {g} vs {wl}"
                        );
                    }
                }
            }
        }
    }
}
