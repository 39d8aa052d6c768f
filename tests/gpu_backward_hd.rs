//! GPU correctness of the backward at head dims 96 (Phi-3) and 256 (Gemma 2/3): dQ, dK, dV
//! against the float64 reference gradients at odd shapes (S = 1, 17, 1000; Sq ≠ Sk; causal with
//! Sq > Sk; GQA 4:1 and MQA; both layouts), both dtypes; bitwise
//! run-to-run and batch invariance. Fresh random inputs each run (the seed is printed;
//! FLASHCORE_SEED replays it); outputs are poisoned with NaN before each launch. Skips visibly
//! without a GPU; fails under FLASHCORE_REQUIRE_GPU=1. The d64/d128 sweep is tests/gpu_backward.rs.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, Layout};
use flashcore::reference;

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// One case with fresh inputs: each gradient's relative L2 against the reference, or why not.
fn check_case<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    rng: &mut impl rand::Rng,
) -> Result<[f64; 3], String> {
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    let d_o: Vec<T> = randn(rng, p.q_len());
    let g = backward(ctx, p, &q, &k, &v, &d_o);
    let want = reference::attention_backward_f64(p, &f64s(&q), &f64s(&k), &f64s(&v), &f64s(&d_o));
    let tol = tolerance(p.dtype);
    let mut errs = [0.0; 3];
    for (i, (name, got, want)) in [
        ("dq", &g.dq, &want.dq),
        ("dk", &g.dk, &want.dk),
        ("dv", &g.dv, &want.dv),
    ]
    .into_iter()
    .enumerate()
    {
        let got = f64s(got);
        if let Some(j) = got.iter().position(|x| !x.is_finite()) {
            return Err(format!("{p:?}: {name}[{j}] = {} (not finite)", got[j]));
        }
        errs[i] = reference::rel_l2(&got, want);
        if errs[i] > tol {
            return Err(format!(
                "{p:?}: {name} relative L2 {:.3e} > {tol:.0e}",
                errs[i]
            ));
        }
    }
    // dQ rows of fully masked queries (causal, Sq > Sk) are exactly zero.
    if p.causal && p.seqlen_q > p.seqlen_k {
        let st = p.layout.strides(p.seqlen_q, p.heads_q, p.head_dim);
        for b in 0..p.batch {
            for h in 0..p.heads_q {
                for i in 0..p.seqlen_q - p.seqlen_k {
                    let start = b * st[0] + i * st[1] + h * st[2];
                    if let Some(j) = (start..start + p.head_dim).find(|&j| g.dq[j].to_f64() != 0.0)
                    {
                        return Err(format!("{p:?}: dq[{j}] of a fully masked row is not 0"));
                    }
                }
            }
        }
    }
    Ok(errs)
}

/// (batch, heads_q, heads_kv, seqlen_q, seqlen_k, causal, layout).
fn shapes() -> Vec<(usize, usize, usize, usize, usize, bool, Layout)> {
    use Layout::*;
    vec![
        (1, 2, 2, 1, 1, false, Bshd),
        (1, 2, 2, 1, 1, true, Bshd),
        (2, 2, 2, 17, 17, false, Bshd),
        (2, 2, 2, 17, 17, true, Bhsd),
        (1, 2, 2, 1000, 1000, false, Bshd),
        (1, 2, 2, 1000, 1000, true, Bshd),
        (1, 2, 2, 100, 300, false, Bshd),
        (1, 2, 2, 100, 300, true, Bshd),
        (1, 2, 2, 300, 100, true, Bshd), // Sq > Sk: the first 200 rows are fully masked
        (1, 2, 2, 1, 200, true, Bshd),
        (2, 8, 2, 257, 257, false, Bshd), // GQA 4:1
        (1, 8, 2, 200, 333, true, Bhsd),  // GQA 4:1, causal, Sq ≠ Sk
        (1, 4, 1, 257, 257, true, Bshd),  // MQA
        (1, 4, 1, 130, 70, false, Bshd),  // MQA, Sq ≠ Sk
    ]
}

fn sweep<T: Element>(name: &str, dtype: DType, d: usize) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let seed = seed();
    eprintln!("{name}: seed {seed}");
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    let mut worst = [0.0f64; 3];
    let cases = shapes();
    for &(b, hq, hkv, sq, sk, causal, layout) in &cases {
        let mut p = AttentionParams::new(b, hq, sq, d)
            .seqlen_k(sk)
            .causal(causal)
            .dtype(dtype)
            .layout(layout);
        p.heads_kv = hkv;
        match check_case::<T>(&ctx, &p, &mut rng) {
            Ok(e) => {
                for i in 0..3 {
                    worst[i] = worst[i].max(e[i]);
                }
            }
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "{name}: {} cases, {} failed; worst relative L2 dq {:.2e} dk {:.2e} dv {:.2e}",
        cases.len(),
        failures.len(),
        worst[0],
        worst[1],
        worst[2]
    );
    assert!(
        failures.is_empty(),
        "seed {seed}:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn d96_f16_gradients_match_reference() {
    sweep::<half::f16>("d96_f16_gradients_match_reference", DType::F16, 96);
}

#[test]
fn d96_bf16_gradients_match_reference() {
    sweep::<half::bf16>("d96_bf16_gradients_match_reference", DType::Bf16, 96);
}

#[test]
fn d256_f16_gradients_match_reference() {
    sweep::<half::f16>("d256_f16_gradients_match_reference", DType::F16, 256);
}

#[test]
fn d256_bf16_gradients_match_reference() {
    sweep::<half::bf16>("d256_bf16_gradients_match_reference", DType::Bf16, 256);
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// Run-to-run: the same inputs give the same bits (GQA, causal, several tiles per CTA).
fn bits_run_to_run<T: Element>(
    ctx: &Context,
    d: usize,
    dtype: DType,
    rng: &mut rand::rngs::StdRng,
) {
    let mut p = AttentionParams::new(2, 8, 1100, d)
        .causal(true)
        .dtype(dtype);
    p.heads_kv = 2;
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    let d_o: Vec<T> = randn(rng, p.q_len());
    let first = backward(ctx, &p, &q, &k, &v, &d_o);
    for _ in 0..2 {
        let again = backward(ctx, &p, &q, &k, &v, &d_o);
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
    }
}

#[test]
fn d96_d256_gradient_bits_are_identical_run_to_run() {
    let Some(ctx) = gpu("d96_d256_gradient_bits_are_identical_run_to_run") else {
        return;
    };
    let mut rng = rng_from(seed());
    bits_run_to_run::<half::bf16>(&ctx, 96, DType::Bf16, &mut rng);
    bits_run_to_run::<half::f16>(&ctx, 256, DType::F16, &mut rng);
}

/// One sequence alone and as the middle of a batch of three: the same gradient bits.
#[test]
fn d96_d256_gradient_bits_are_batch_invariant() {
    let Some(ctx) = gpu("d96_d256_gradient_bits_are_batch_invariant") else {
        return;
    };
    let mut rng = rng_from(seed());
    for (d, causal, hq, hkv, sq, sk) in [(96, true, 8, 2, 513, 300), (256, false, 4, 1, 300, 450)] {
        let mut one = AttentionParams::new(1, hq, sq, d)
            .seqlen_k(sk)
            .causal(causal)
            .dtype(DType::F16);
        one.heads_kv = hkv;
        let mut three = one.clone();
        three.batch = 3;
        let inputs = |n: usize, rng: &mut rand::rngs::StdRng| -> Vec<half::f16> { randn(rng, n) };
        let (q1, k1, v1, o1) = (
            inputs(one.q_len(), &mut rng),
            inputs(one.kv_len(), &mut rng),
            inputs(one.kv_len(), &mut rng),
            inputs(one.q_len(), &mut rng),
        );
        let alone = backward(&ctx, &one, &q1, &k1, &v1, &o1);
        let embed = |x: &[half::f16], rng: &mut rand::rngs::StdRng| {
            let mut all = inputs(x.len(), rng);
            all.extend_from_slice(x);
            all.extend(inputs(x.len(), rng));
            all
        };
        let (q3, k3, v3, o3) = (
            embed(&q1, &mut rng),
            embed(&k1, &mut rng),
            embed(&v1, &mut rng),
            embed(&o1, &mut rng),
        );
        let batch = backward(&ctx, &three, &q3, &k3, &v3, &o3);
        let mid = |x: &[half::f16], n: usize| x[n..2 * n].to_vec();
        assert!(
            same_bits(&alone.dq, &mid(&batch.dq, one.q_len())),
            "dq bits depend on the batch ({one:?})"
        );
        assert!(
            same_bits(&alone.dk, &mid(&batch.dk, one.kv_len())),
            "dk bits depend on the batch ({one:?})"
        );
        assert!(
            same_bits(&alone.dv, &mid(&batch.dv, one.kv_len())),
            "dv bits depend on the batch ({one:?})"
        );
    }
}
