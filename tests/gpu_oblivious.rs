//! GPU tests of the properties that make the data-oblivious contract useful: secret-length mode,
//! bitwise determinism (run to run, across streams, across batches) and NaN-safety on adversarial
//! finite inputs. Skip visibly without a GPU; fail under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::reference;

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Reference for secret-length mode (bshd): per batch entry, attention over its first `len`
/// positions; rows at or past `len` are zero with LSE −inf.
fn secret_len_reference(
    p: &AttentionParams,
    lens: &[i32],
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (s, h, d) = (p.seqlen_q, p.heads_q, p.head_dim);
    let mut out = vec![0.0; p.q_len()];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len()];
    for b in 0..p.batch {
        let len = lens[b].clamp(0, s as i32) as usize;
        if len == 0 {
            continue;
        }
        let sub = AttentionParams {
            batch: 1,
            seqlen_q: len,
            seqlen_k: len,
            ..p.clone()
        };
        let take = |x: &[f64]| x[b * s * h * d..(b * s + len) * h * d].to_vec();
        let r = reference::attention_f64(&sub, &take(q), &take(k), &take(v));
        out[b * s * h * d..(b * s + len) * h * d].copy_from_slice(&r.out);
        for hh in 0..h {
            for i in 0..len {
                lse[(b * h + hh) * s + i] = r.lse[hh * len + i];
            }
        }
    }
    (out, lse)
}

#[test]
fn secret_length_mode_matches_truncated_reference() {
    let Some(ctx) = gpu("secret_length_mode_matches_truncated_reference") else {
        return;
    };
    let seed = seed();
    let mut rng = rng_from(seed);
    for head_dim in [64, 128] {
        for causal in [false, true] {
            for s in [300usize, 1500] {
                let p = AttentionParams::new(4, 2, s, head_dim).causal(causal);
                let lens = [s as i32 / 3, 0, s as i32, 1];
                let q: Vec<half::f16> = randn(&mut rng, p.q_len());
                let k: Vec<half::f16> = randn(&mut rng, p.kv_len());
                let v: Vec<half::f16> = randn(&mut rng, p.kv_len());
                let (dq, dk, dv) = (
                    ctx.upload(&q).unwrap(),
                    ctx.upload(&k).unwrap(),
                    ctx.upload(&v).unwrap(),
                );
                let mut dout = ctx.upload(&vec![poison::<half::f16>(); p.q_len()]).unwrap();
                let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
                let dlens = ctx.upload(&lens).unwrap();
                ctx.attention_secret_len(&p, &dq, &dk, &dv, &mut dout, Some(&mut dlse), &dlens)
                    .unwrap();
                let out = f64s(&ctx.download(&dout).unwrap());
                let lse: Vec<f64> = ctx
                    .download(&dlse)
                    .unwrap()
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                let (want, want_lse) =
                    secret_len_reference(&p, &lens, &f64s(&q), &f64s(&k), &f64s(&v));
                reference::check_close("out", &out, &want, 2e-3)
                    .unwrap_or_else(|e| panic!("seed {seed} {p:?} lens {lens:?}: {e}"));
                reference::check_close("lse", &lse, &want_lse, 1e-3)
                    .unwrap_or_else(|e| panic!("seed {seed} {p:?} lens {lens:?}: {e}"));
                // Rows past the true length must be exactly zero, not merely small.
                let (h, d) = (p.heads_q, p.head_dim);
                assert!(
                    out[s * h * d..2 * s * h * d].iter().all(|&x| x == 0.0),
                    "length-0 sequence must be all zeros"
                );
            }
        }
    }
}

#[test]
fn secret_length_rejects_bad_arguments() {
    let Some(ctx) = gpu("secret_length_rejects_bad_arguments") else {
        return;
    };
    let p = AttentionParams::new(2, 2, 64, 64);
    let x = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    let mut o = ctx.alloc::<half::f16>(p.q_len()).unwrap();
    let wrong_count = ctx.upload(&[5i32]).unwrap();
    match ctx.attention_secret_len(&p, &x, &x, &x, &mut o, None, &wrong_count) {
        Err(flashcore::Error::InvalidArgument { arg: "lengths", .. }) => {}
        other => panic!("expected InvalidArgument(lengths), got {other:?}"),
    }
    let lens = ctx.upload(&[5i32, 6]).unwrap();
    let unequal = p.clone().seqlen_k(65);
    let kx = ctx.alloc::<half::f16>(unequal.kv_len()).unwrap();
    match ctx.attention_secret_len(&unequal, &x, &kx, &kx, &mut o, None, &lens) {
        Err(flashcore::Error::InvalidArgument {
            arg: "seqlen_k", ..
        }) => {}
        other => panic!("expected InvalidArgument(seqlen_k), got {other:?}"),
    }
}

fn run_raw(
    ctx: &Context,
    p: &AttentionParams,
    q: &[half::bf16],
    k: &[half::bf16],
    v: &[half::bf16],
) -> Vec<u16> {
    let (dq, dk, dv) = upload_qkv(ctx, q, k, v);
    let mut dout = ctx
        .upload(&vec![poison::<half::bf16>(); p.q_len()])
        .unwrap();
    ctx.attention(p, &dq, &dk, &dv, &mut dout, None).unwrap();
    ctx.download(&dout)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn bitwise_identical_over_100_launches_and_across_streams() {
    let Some(ctx) = gpu("bitwise_identical_over_100_launches_and_across_streams") else {
        return;
    };
    let mut rng = rng_from(seed());
    for p in [
        AttentionParams::new(2, 4, 1500, 64)
            .causal(true)
            .dtype(DType::Bf16),
        AttentionParams::new(1, 8, 2048, 64).dtype(DType::Bf16),
        AttentionParams::new(1, 4, 777, 128).dtype(DType::Bf16),
    ] {
        let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, p.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, p.kv_len());
        let (dq, dk, dv) = (
            ctx.upload(&q).unwrap(),
            ctx.upload(&k).unwrap(),
            ctx.upload(&v).unwrap(),
        );
        let mut dout = ctx.alloc::<half::bf16>(p.q_len()).unwrap();
        ctx.attention(&p, &dq, &dk, &dv, &mut dout, None).unwrap();
        let first: Vec<u16> = ctx
            .download(&dout)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        for i in 0..100 {
            ctx.attention(&p, &dq, &dk, &dv, &mut dout, None).unwrap();
            let again: Vec<u16> = ctx
                .download(&dout)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert!(first == again, "{p:?}: output bits changed on launch {i}");
        }
        // A second context has its own stream.
        let other = Context::new(0).unwrap();
        assert!(
            first == run_raw(&other, &p, &q, &k, &v),
            "{p:?}: output bits differ across streams"
        );
    }
}

#[test]
fn a_sequence_has_the_same_bits_in_any_batch() {
    let Some(ctx) = gpu("a_sequence_has_the_same_bits_in_any_batch") else {
        return;
    };
    let mut rng = rng_from(seed());
    for (s, d, causal) in [
        (333usize, 64usize, false),
        (1024, 64, false),
        (2048, 64, false),
        (600, 128, true),
    ] {
        let one = AttentionParams::new(1, 4, s, d)
            .causal(causal)
            .dtype(DType::Bf16);
        let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let alone = run_raw(&ctx, &one, &q, &k, &v);
        for (batch, at) in [(3usize, 1usize), (8, 5), (64, 63)] {
            let (p, qs, ks, vs) = batch_around(&mut rng, &one, batch, at, &q, &k, &v);
            let n = one.q_len();
            let all = run_raw(&ctx, &p, &qs, &ks, &vs);
            assert!(
                alone == all[at * n..(at + 1) * n],
                "S={s} D={d}: bits differ alone vs at {at} in a batch of {batch}"
            );
        }
    }
}

/// Fills every element with `f(i)` in the element type.
fn filled<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

#[test]
fn adversarial_finite_inputs_give_finite_correct_outputs() {
    let Some(ctx) = gpu("adversarial_finite_inputs_give_finite_correct_outputs") else {
        return;
    };
    let mut rng = rng_from(seed());
    let max16 = 65504.0;
    for (d, causal) in [(64usize, false), (128, true)] {
        let p = AttentionParams::new(1, 2, 300, d).causal(causal);
        let n = p.q_len();
        let randv: Vec<half::f16> = randn(&mut rng, n);
        let cases: Vec<(&str, Vec<half::f16>, Vec<half::f16>, AttentionParams)> = vec![
            (
                "near-max random q and k",
                filled(n, |i| ((i * 7919 % 1000) as f64 / 500.0 - 1.0) * 30000.0),
                filled(n, |i| ((i * 104729 % 997) as f64 / 498.5 - 1.0) * 30000.0),
                p.clone(),
            ),
            (
                "all-equal scores",
                filled(n, |_| 1.0),
                filled(n, |_| 1.0),
                p.clone(),
            ),
            (
                "huge scale",
                randn(&mut rng, n),
                randn(&mut rng, n),
                p.clone().scale(1e30),
            ),
            (
                "tiny values",
                filled(n, |i| if i % 2 == 0 { 6e-8 } else { -6e-8 }),
                randn(&mut rng, n),
                p.clone(),
            ),
        ];
        for (name, q, k, params) in cases {
            let o =
                run_inputs(&ctx, &params, &q, &k, &randv).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                o.out.iter().all(|x| x.to_f64().is_finite()),
                "{name}: non-finite output"
            );
        }
    }
    // Exactly ±max finite everywhere: every score is a multiple of 65504², so ties decide the
    // answer and it is ill-conditioned; what must hold is no NaN and no Inf.
    for (d, causal) in [(64usize, false), (128, true)] {
        let p = AttentionParams::new(1, 2, 300, d).causal(causal);
        let n = p.q_len();
        let q: Vec<half::f16> = filled(n, |i| if i % 3 == 0 { max16 } else { -max16 });
        let k: Vec<half::f16> = filled(n, |i| if i % 5 == 0 { -max16 } else { max16 });
        let v: Vec<half::f16> = filled(n, |i| if i % 7 == 0 { -max16 } else { max16 });
        let (out, lse) = launch_unchecked(&ctx, &p, &q, &k, &v);
        assert!(
            out.iter().all(|x| x.to_f64().is_finite()),
            "±max: non-finite output"
        );
        assert!(lse.iter().all(|x| x.is_finite()), "±max: non-finite LSE");
    }
    // Fully masked rows: causal with Sq > Sk leaves the first Sq − Sk rows without keys.
    let p = AttentionParams::new(1, 2, 200, 64)
        .seqlen_k(50)
        .causal(true);
    let o = run_case::<half::f16>(&ctx, &p, &mut rng).unwrap();
    for h in 0..2 {
        for i in 0..150 {
            assert_eq!(
                o.lse[h * 200 + i],
                f32::NEG_INFINITY,
                "fully masked row {i} must have LSE -inf"
            );
            assert!(
                (0..64).all(|c| o.out[(i * 2 + h) * 64 + c].to_f64() == 0.0),
                "fully masked row {i} must be zero"
            );
        }
    }
}
