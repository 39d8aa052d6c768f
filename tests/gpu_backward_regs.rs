//! GPU check of the 24/240-register build of the d128 non-causal one pass on 80-row query tiles
//! (`FLASHCORE_BWD_REGS=240`): at shapes that take the 80-row build, its dQ, dK, dV match the
//! float64 reference within the suite's tolerances and are bitwise those of the default
//! (40/232-register) 80-row build, which does the same arithmetic in the same order.
//! Runs only with `FLASHCORE_BWD_REGS=240` set (it prints NOT RUN otherwise). Skips visibly
//! without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.
//!
//! The knob is read on every call, so the default build is reached by clearing it for a moment:
//! this file holds a single test, so nothing else in its process reads the environment meanwhile.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::reference;

const KNOB: &str = "FLASHCORE_BWD_REGS";

/// One shape: the knob's build against the reference, then against the default build's bits.
fn check<T: Element>(ctx: &Context, p: &AttentionParams, rng: &mut impl rand::Rng) -> Vec<String> {
    let mut failures = Vec::new();
    let wide = ctx.plan_backward(p).unwrap().variant();
    if !wide.wide() {
        return vec![format!(
            "{p:?}: {KNOB}=240 runs {}, not the 24/240 build (another backward knob set?)",
            wide.name()
        )];
    }
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    let d_o: Vec<T> = randn(rng, p.q_len());
    let got = backward(ctx, p, &q, &k, &v, &d_o);
    let f64s = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let want = reference::attention_backward_f64(p, &f64s(&q), &f64s(&k), &f64s(&v), &f64s(&d_o));
    let tol = tolerance(p.dtype);
    for (name, g, w) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let g = f64s(g);
        if let Some(j) = g.iter().position(|x| !x.is_finite()) {
            failures.push(format!("{p:?} {}: {name}[{j}] = {}", wide.name(), g[j]));
            continue;
        }
        let err = reference::rel_l2(&g, w);
        eprintln!(
            "{} {name}: relative L2 {err:.3e} (tolerance {tol:.0e})",
            wide.name()
        );
        if err > tol {
            failures.push(format!(
                "{p:?} {}: {name} relative L2 {err:.3e} > {tol:.0e}",
                wide.name()
            ));
        }
    }
    // The default build on the same inputs: same values in the same order, so the same bits.
    let saved = std::env::var_os(KNOB);
    std::env::remove_var(KNOB);
    let narrow = ctx.plan_backward(p).unwrap().variant();
    let base = backward(ctx, p, &q, &k, &v, &d_o);
    if let Some(s) = saved {
        std::env::set_var(KNOB, s);
    }
    if !narrow.rows80() || narrow.wide() {
        failures.push(format!(
            "{p:?}: without {KNOB} the call runs {}",
            narrow.name()
        ));
    }
    for (name, a, b) in [
        ("dq", &got.dq, &base.dq),
        ("dk", &got.dk, &base.dk),
        ("dv", &got.dv, &base.dv),
    ] {
        if bits(a) != bits(b) {
            let n = bits(a)
                .iter()
                .zip(bits(b))
                .filter(|(x, y)| **x != *y)
                .count();
            failures.push(format!(
                "{p:?}: {name} of {} differs from {} in {n} of {} elements",
                wide.name(),
                narrow.name(),
                a.len()
            ));
        }
    }
    failures
}

#[test]
fn regs_240_build_matches_reference_and_default_bits() {
    if std::env::var(KNOB).as_deref().map(str::trim) != Ok("240") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN regs_240_build_matches_reference_and_default_bits (set {KNOB}=240)"
        );
        return;
    }
    let Some(ctx) = gpu("regs_240_build_matches_reference_and_default_bits") else {
        return;
    };
    let seed = seed();
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    // d128 non-causal at min(Sq, Sk) ≥ 2048: the 80-row one pass. 2048 rows end in a partial
    // 80-row tile; the GQA shape walks two query heads per key block and a ragged last key block.
    let mha = AttentionParams::new(2, 4, 2048, 128);
    let mut gqa = AttentionParams::new(1, 4, 2300, 128);
    gqa.heads_kv = 2;
    for p in [mha, gqa] {
        failures.extend(check::<half::bf16>(
            &ctx,
            &p.clone().dtype(DType::Bf16),
            &mut rng,
        ));
        failures.extend(check::<half::f16>(
            &ctx,
            &p.clone().dtype(DType::F16),
            &mut rng,
        ));
    }
    assert_no_failures(seed, &failures);
}
