//! GPU correctness of the window, softcap and sink features in the backward (two-pass kernels): sliding windows
//! (both sides, left-only, right-only, with causal, GQA, Sq ≠ Sk, rows that see no key),
//! softcap (± causal, GQA) and learnable sinks (with dsink), alone and combined, against the
//! float64 reference gradients (`attention_backward_f64_sinks`; dsink's from the O the backward
//! read), both dtypes and every head dim; bitwise run-to-run determinism (dsink
//! included); bad sink buffers rejected before launch.
//! Fresh random inputs each run (the seed is printed; FLASHCORE_SEED replays it); outputs are
//! poisoned with NaN before each launch. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, Layout, Window};
use flashcore::reference;

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Element ranges of dQ rows whose query sees no key, and of dK/dV rows whose key no query sees:
/// their gradients must be exactly zero.
fn dead_rows(p: &AttentionParams) -> (Vec<usize>, Vec<usize>) {
    let qs = p.layout.strides(p.seqlen_q, p.heads_q, p.head_dim);
    let ks = p.layout.strides(p.seqlen_k, p.heads_kv, p.head_dim);
    let (mut q_dead, mut k_dead) = (Vec::new(), Vec::new());
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            for i in (0..p.seqlen_q).filter(|&i| (0..p.seqlen_k).all(|j| !p.sees(i, j))) {
                let at = b * qs[0] + i * qs[1] + h * qs[2];
                q_dead.extend(at..at + p.head_dim);
            }
        }
        for h in 0..p.heads_kv {
            for j in (0..p.seqlen_k).filter(|&j| (0..p.seqlen_q).all(|i| !p.sees(i, j))) {
                let at = b * ks[0] + j * ks[1] + h * ks[2];
                k_dead.extend(at..at + p.head_dim);
            }
        }
    }
    (q_dead, k_dead)
}

/// One case with fresh inputs (q, k scaled by `sharpen` so a softcap saturates): each gradient's
/// relative L2 against the reference (dsink's too), or why it failed.
fn check_case<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    with_sinks: bool,
    sharpen: f64,
    rng: &mut rand::rngs::StdRng,
) -> Result<[f64; 4], String> {
    use rand::Rng;
    let sharp = |x: Vec<T>| -> Vec<T> {
        x.iter()
            .map(|v| T::from_f64(v.to_f64() * sharpen))
            .collect()
    };
    let q: Vec<T> = sharp(randn(rng, p.q_len()));
    let k: Vec<T> = sharp(randn(rng, p.kv_len()));
    let v: Vec<T> = randn(rng, p.kv_len());
    let d_o: Vec<T> = randn(rng, p.q_len());
    let sinks: Option<Vec<f32>> = with_sinks.then(|| {
        (0..p.heads_q)
            .map(|_| rng.random_range(-1.0..2.0))
            .collect()
    });
    let g = backward_with_sinks(ctx, p, [&q, &k, &v, &d_o], sinks.as_deref());
    let s64: Option<Vec<f64>> = sinks
        .as_ref()
        .map(|s| s.iter().map(|&x| x as f64).collect());
    let (want, _) = reference::attention_backward_f64_sinks(
        p,
        &f64s(&q),
        &f64s(&k),
        &f64s(&v),
        &f64s(&d_o),
        s64.as_deref(),
    );
    // dsink's oracle takes D = rowsum(dO ∘ O) from the O the backward read (dtype-rounded), not
    // the exact O: dsink is a per-head sum of mixed-sign terms whose cancellation amplifies O's
    // rounding past the dtype's bound on its own (tests/dsink_rounding.rs replays a bf16 case:
    // 1.06e-2 from rounding O alone). The gradients keep the exact oracle.
    let want_dsink = match &s64 {
        Some(s) => reference::dsink_from_o_f64(
            p,
            &f64s(&g.o),
            &g.lse.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            &f64s(&d_o),
            s,
        ),
        None => Vec::new(),
    };
    let tol = tolerance(p.dtype);
    let (q_dead, k_dead) = dead_rows(p);
    let dsink: Vec<f64> = g.dsink.iter().map(|&x| x as f64).collect();
    let mut errs = [0.0; 4];
    for (i, (name, got, want, dead)) in [
        ("dq", f64s(&g.dq), &want.dq, &q_dead),
        ("dk", f64s(&g.dk), &want.dk, &k_dead),
        ("dv", f64s(&g.dv), &want.dv, &k_dead),
        ("dsink", dsink, &want_dsink, &Vec::new()),
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(j) = got.iter().position(|x| !x.is_finite()) {
            return Err(format!("{p:?}: {name}[{j}] = {} (not finite)", got[j]));
        }
        if let Some(&j) = dead.iter().find(|&&j| got[j] != 0.0) {
            return Err(format!(
                "{p:?}: {name}[{j}] = {}, its row sees nothing (want 0)",
                got[j]
            ));
        }
        if got.is_empty() && want.is_empty() {
            continue;
        }
        errs[i] = reference::rel_l2(&got, want);
        if errs[i] > tol {
            return Err(format!(
                "{p:?} sinks {with_sinks}: {name} relative L2 {:.3e} > {tol:.0e}",
                errs[i]
            ));
        }
    }
    Ok(errs)
}

/// (batch, hq, hkv, sq, sk, causal, window (left, right), softcap, sinks, layout)
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
    (i64, i64),
    f32,
    bool,
    Layout,
);

fn cases() -> Vec<Case> {
    use Layout::*;
    vec![
        // Windows.
        (1, 2, 2, 1, 1, false, (0, 0), 0.0, false, Bshd), // S = 1
        (2, 2, 2, 17, 17, true, (5, -1), 0.0, false, Bhsd), // S = 17, causal + left
        (1, 2, 2, 1000, 1000, true, (256, -1), 0.0, false, Bshd), // skips key blocks / query tiles
        (1, 2, 2, 1000, 1000, false, (100, 300), 0.0, false, Bshd), // both sides
        (1, 4, 1, 300, 700, false, (-1, 50), 0.0, false, Bshd), // right-only, MQA, Sq < Sk
        (1, 2, 2, 700, 300, false, (64, -1), 0.0, false, Bshd), // left-only, Sq > Sk
        (1, 2, 2, 300, 100, false, (20, 10), 0.0, false, Bshd), // rows 0..190 see no key
        (1, 8, 2, 333, 200, true, (64, -1), 0.0, false, Bhsd), // causal + GQA, Sq > Sk
        // Softcap.
        (2, 2, 2, 257, 257, false, (-1, -1), 3.0, false, Bshd),
        (1, 8, 2, 200, 333, true, (-1, -1), 2.0, false, Bhsd), // causal, GQA, Sq < Sk
        (1, 8, 2, 500, 500, true, (128, -1), 2.5, false, Bshd), // + window
        // Sinks.
        (1, 2, 2, 17, 17, false, (-1, -1), 0.0, true, Bshd),
        (2, 4, 2, 300, 300, true, (64, -1), 0.0, true, Bshd), // + window + causal + GQA
        (1, 2, 2, 300, 100, false, (20, 10), 0.0, true, Bshd), // rows that see only the sink
        (1, 4, 2, 257, 300, false, (50, 30), 2.0, true, Bhsd), // everything
    ]
}

fn sweep<T: Element>(name: &str, dtype: DType) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let seed = seed();
    eprintln!("{name}: seed {seed}");
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    let mut worst = [0.0f64; 4];
    let mut n = 0;
    for d in flashcore::spec::SUPPORTED_HEAD_DIMS {
        for &(b, hq, hkv, sq, sk, causal, (wl, wr), cap, sinks, layout) in &cases() {
            let mut p = AttentionParams::new(b, hq, sq, d)
                .seqlen_k(sk)
                .causal(causal)
                .window(Window::from_flash_attn(wl, wr))
                .softcap(cap)
                .dtype(dtype)
                .layout(layout);
            p.heads_kv = hkv;
            n += 1;
            // Sharpened q, k: scores of a few units, so the softcap's tanh bends.
            match check_case::<T>(&ctx, &p, sinks, 1.8, &mut rng) {
                Ok(e) => (0..4).for_each(|i| worst[i] = worst[i].max(e[i])),
                Err(e) => failures.push(e),
            }
        }
    }
    eprintln!(
        "{name}: {n} cases, {} failed; worst relative L2 dq {:.2e} dk {:.2e} dv {:.2e} dsink {:.2e}",
        failures.len(),
        worst[0],
        worst[1],
        worst[2],
        worst[3]
    );
    assert!(
        failures.is_empty(),
        "seed {seed}:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn f16_feature_gradients_match_reference() {
    sweep::<half::f16>("f16_feature_gradients_match_reference", DType::F16);
}

#[test]
fn bf16_feature_gradients_match_reference() {
    sweep::<half::bf16>("bf16_feature_gradients_match_reference", DType::Bf16);
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// Window + causal + GQA + softcap + sinks, four runs: every gradient's bits, dsink's included,
/// are the same.
#[test]
fn feature_gradient_bits_are_identical_run_to_run() {
    let Some(ctx) = gpu("feature_gradient_bits_are_identical_run_to_run") else {
        return;
    };
    let mut rng = rng_from(seed());
    for d in flashcore::spec::SUPPORTED_HEAD_DIMS {
        let mut p = AttentionParams::new(2, 8, 1500, d)
            .causal(true)
            .window(Window::from_flash_attn(300, -1))
            .softcap(3.0)
            .dtype(DType::Bf16);
        p.heads_kv = 2;
        let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, p.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, p.kv_len());
        let d_o: Vec<half::bf16> = randn(&mut rng, p.q_len());
        let sinks: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 0.5).collect();
        let first = backward_with_sinks(&ctx, &p, [&q, &k, &v, &d_o], Some(&sinks));
        for _ in 0..3 {
            let again = backward_with_sinks(&ctx, &p, [&q, &k, &v, &d_o], Some(&sinks));
            assert!(
                same_bits(&first.dq, &again.dq),
                "d{d}: dq bits differ between runs"
            );
            assert!(
                same_bits(&first.dk, &again.dk),
                "d{d}: dk bits differ between runs"
            );
            assert!(
                same_bits(&first.dv, &again.dv),
                "d{d}: dv bits differ between runs"
            );
            assert!(
                first
                    .dsink
                    .iter()
                    .zip(&again.dsink)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "d{d}: dsink bits differ between runs"
            );
        }
    }
}

#[test]
fn bad_sink_buffers_are_rejected_before_launch() {
    let Some(ctx) = gpu("bad_sink_buffers_are_rejected_before_launch") else {
        return;
    };
    let p = AttentionParams::new(1, 2, 64, 64).dtype(DType::F16);
    let z = |n: usize| ctx.alloc::<half::f16>(n).unwrap();
    let (q, k, v, o, d_o) = (
        z(p.q_len()),
        z(p.kv_len()),
        z(p.kv_len()),
        z(p.q_len()),
        z(p.q_len()),
    );
    let lse = ctx.alloc::<f32>(p.lse_len()).unwrap();
    let (mut dq, mut dk, mut dv) = (z(p.q_len()), z(p.kv_len()), z(p.kv_len()));
    for (ns, nd, arg) in [(3, 2, "sinks"), (2, 1, "dsink")] {
        let sinks = ctx.alloc::<f32>(ns).unwrap();
        let mut dsink = ctx.alloc::<f32>(nd).unwrap();
        let e = ctx
            .attention_backward_with_sinks(
                &p,
                &q,
                &k,
                &v,
                &o,
                Some(&lse),
                &d_o,
                &sinks,
                &mut dq,
                &mut dk,
                &mut dv,
                &mut dsink,
            )
            .unwrap_err();
        match e {
            flashcore::Error::InvalidArgument { arg: a, .. } => assert_eq!(a, arg, "{e}"),
            other => panic!("expected an invalid-argument error, got {other:?}"),
        }
    }
}
