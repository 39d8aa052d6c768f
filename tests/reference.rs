//! The float64 reference against a direct transcription of the formula, known closed-form
//! cases, the contract's masking semantics, and the comparison helpers.

use flashcore::attention::{AttentionParams, Layout};
use flashcore::reference::{self, attention_f64, check_close, rel_l2};
use rand::{Rng, SeedableRng};

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn uniform(r: &mut impl Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| r.random_range(-1.0..1.0)).collect()
}

/// Element index written out from the layout's definition (independent of `Layout::strides`).
fn idx(
    l: Layout,
    dims: (usize, usize, usize, usize),
    b: usize,
    s: usize,
    h: usize,
    d: usize,
) -> usize {
    let (_, ns, nh, nd) = dims;
    match l {
        Layout::Bshd => ((b * ns + s) * nh + h) * nd + d,
        Layout::Bhsd => ((b * nh + h) * ns + s) * nd + d,
    }
}

fn params(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttentionParams {
    AttentionParams {
        heads_kv: hkv,
        ..AttentionParams::new(b, hq, sq, d).seqlen_k(sk)
    }
}

/// softmax(scale·QKᵀ + mask)V straight from the definition: exp without max subtraction (fine
/// for the small scores used here), mask `j <= i + Sk − Sq` in signed arithmetic.
fn naive(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (b_, sq, sk, hq, hkv, d_) = (
        p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
    );
    let qd = (b_, sq, hq, d_);
    let kd = (b_, sk, hkv, d_);
    let scale = p.softmax_scale() as f64;
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; b_ * hq * sq];
    for b in 0..b_ {
        for h in 0..hq {
            let hk = h * hkv / hq;
            for i in 0..sq {
                let allowed =
                    |j: usize| !p.causal || (j as i64) <= i as i64 + sk as i64 - sq as i64;
                let mut e = vec![0.0; sk];
                for j in (0..sk).filter(|&j| allowed(j)) {
                    let dot: f64 = (0..d_)
                        .map(|d| {
                            q[idx(p.layout, qd, b, i, h, d)] * k[idx(p.layout, kd, b, j, hk, d)]
                        })
                        .sum();
                    e[j] = (scale * dot).exp();
                }
                let z: f64 = e.iter().sum();
                lse[(b * hq + h) * sq + i] = z.ln(); // ln 0 = −inf for a fully masked row
                for d in 0..d_ {
                    let acc: f64 = (0..sk)
                        .map(|j| e[j] * v[idx(p.layout, kd, b, j, hk, d)])
                        .sum();
                    out[idx(p.layout, qd, b, i, h, d)] = if z > 0.0 { acc / z } else { 0.0 };
                }
            }
        }
    }
    (out, lse)
}

fn check_against_naive(p: &AttentionParams, seed: u64) {
    let mut r = rng(seed);
    let q = uniform(&mut r, p.q_len());
    let k = uniform(&mut r, p.kv_len());
    let v = uniform(&mut r, p.kv_len());
    let got = attention_f64(p, &q, &k, &v);
    let (out, lse) = naive(p, &q, &k, &v);
    check_close("out", &got.out, &out, 1e-12).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    check_close("lse", &got.lse, &lse, 1e-12).unwrap_or_else(|e| panic!("{p:?}: {e}"));
}

#[test]
fn matches_naive_formula_on_random_shapes() {
    let mut r = rng(7);
    for case in 0..200 {
        let hkv = r.random_range(1..=3);
        let mut p = params(
            r.random_range(1..=2),
            r.random_range(1..=9),
            r.random_range(1..=9),
            hkv * r.random_range(1..=3),
            hkv,
            [1, 3, 8, 64][r.random_range(0..4)],
        );
        p.layout = if r.random() {
            Layout::Bshd
        } else {
            Layout::Bhsd
        };
        p.causal = r.random();
        if r.random() {
            p.scale = Some(r.random_range(0.05..1.5));
        }
        check_against_naive(&p, case);
    }
}

#[test]
fn matches_naive_formula_on_mask_edge_shapes() {
    // Both layouts, causal and not, Sq < Sk, Sq = Sk, Sq > Sk (fully masked rows), with GQA.
    for layout in [Layout::Bshd, Layout::Bhsd] {
        for causal in [false, true] {
            for (sq, sk) in [(3, 11), (7, 7), (11, 3), (1, 5), (5, 1), (16, 9)] {
                let p = params(2, sq, sk, 6, 2, 8).layout(layout).causal(causal);
                check_against_naive(&p, (sq * 100 + sk) as u64);
            }
        }
    }
}

#[test]
fn single_key_gives_that_v_row_and_scaled_dot_lse() {
    let p = params(1, 4, 1, 2, 2, 3).scale(0.7);
    let mut r = rng(1);
    let (q, k, v) = (
        uniform(&mut r, p.q_len()),
        uniform(&mut r, p.kv_len()),
        uniform(&mut r, p.kv_len()),
    );
    let got = attention_f64(&p, &q, &k, &v);
    for h in 0..2 {
        for i in 0..4 {
            let o = &got.out[(i * 2 + h) * 3..][..3];
            assert_eq!(o, &v[h * 3..][..3], "row {i} head {h}");
            let dot: f64 = (0..3).map(|d| q[(i * 2 + h) * 3 + d] * k[h * 3 + d]).sum();
            let want = 0.7f32 as f64 * dot;
            assert!(
                (got.lse[h * 4 + i] - want).abs() <= 1e-15,
                "lse {} vs {want}",
                got.lse[h * 4 + i]
            );
        }
    }
}

#[test]
fn uniform_scores_give_mean_of_v_rows() {
    let (sk, d) = (5, 4);
    let p = params(1, 3, sk, 1, 1, d);
    let q = vec![0.0; p.q_len()]; // every score 0
    let mut r = rng(2);
    let (k, v) = (uniform(&mut r, p.kv_len()), uniform(&mut r, p.kv_len()));
    let got = attention_f64(&p, &q, &k, &v);
    for i in 0..3 {
        for c in 0..d {
            let mean = (0..sk).map(|j| v[j * d + c]).sum::<f64>() / sk as f64;
            assert!((got.out[i * d + c] - mean).abs() < 1e-15);
        }
        assert!((got.lse[i] - (sk as f64).ln()).abs() < 1e-15);
    }
}

#[test]
fn causal_row_zero_sees_only_key_zero() {
    for layout in [Layout::Bshd, Layout::Bhsd] {
        let p = params(2, 6, 6, 3, 3, 4).layout(layout).causal(true);
        let mut r = rng(3);
        let (q, k, v) = (
            uniform(&mut r, p.q_len()),
            uniform(&mut r, p.kv_len()),
            uniform(&mut r, p.kv_len()),
        );
        let got = attention_f64(&p, &q, &k, &v);
        let dims = (2, 6, 3, 4);
        for b in 0..2 {
            for h in 0..3 {
                for d in 0..4 {
                    let at = idx(layout, dims, b, 0, h, d);
                    assert_eq!(got.out[at], v[idx(layout, dims, b, 0, h, d)]);
                }
                // Row 1 must differ from v[0]: it sees two keys.
                assert_ne!(
                    got.out[idx(layout, dims, b, 1, h, 0)],
                    v[idx(layout, dims, b, 0, h, 0)]
                );
            }
        }
    }
}

#[test]
fn fully_masked_rows_give_zero_and_neg_inf() {
    // Causal, Sq = 7 > Sk = 3: rows 0..4 see nothing, row 4 sees key 0, row 6 all three keys.
    for layout in [Layout::Bshd, Layout::Bhsd] {
        let p = params(1, 7, 3, 2, 1, 4).layout(layout).causal(true);
        let mut r = rng(4);
        let (q, k, v) = (
            uniform(&mut r, p.q_len()),
            uniform(&mut r, p.kv_len()),
            uniform(&mut r, p.kv_len()),
        );
        let got = attention_f64(&p, &q, &k, &v);
        let (qd, kd) = ((1, 7, 2, 4), (1, 3, 1, 4));
        for h in 0..2 {
            for i in 0..7 {
                let row: Vec<f64> = (0..4)
                    .map(|d| got.out[idx(layout, qd, 0, i, h, d)])
                    .collect();
                let l = got.lse[h * 7 + i];
                if i < 4 {
                    assert_eq!(row, vec![0.0; 4], "row {i} must be zero");
                    assert_eq!(l, f64::NEG_INFINITY, "row {i} lse");
                } else {
                    assert!(l.is_finite(), "row {i} lse {l}");
                }
            }
            let row4: Vec<f64> = (0..4)
                .map(|d| got.out[idx(layout, qd, 0, 4, h, d)])
                .collect();
            let v0: Vec<f64> = (0..4).map(|d| v[idx(layout, kd, 0, 0, 0, d)]).collect();
            assert_eq!(row4, v0, "first unmasked row sees only key 0");
        }
    }
}

#[test]
fn large_scores_neither_overflow_nor_lose_precision() {
    // Scores 1000 and 1000 − ln 3: a naive exp overflows; the weights must be 3/4 and 1/4.
    let p = params(1, 1, 2, 1, 1, 1).scale(1.0);
    let q = vec![1.0];
    let k = vec![1000.0, 1000.0 - 3f64.ln()];
    let v = vec![4.0, 8.0];
    let got = attention_f64(&p, &q, &k, &v);
    assert!((got.out[0] - 5.0).abs() < 1e-12, "{}", got.out[0]);
    assert!(
        (got.lse[0] - (1000.0 + (4.0f64 / 3.0).ln())).abs() < 1e-12,
        "{}",
        got.lse[0]
    );
}

#[test]
fn gqa_query_heads_read_their_kv_group() {
    // Hq = 4, Hkv = 2, one key: query head h must output v of kv head h / 2.
    let p = params(1, 2, 1, 4, 2, 2);
    let q = vec![0.5; p.q_len()];
    let k = vec![1.0; p.kv_len()];
    let v = vec![10.0, 11.0, 20.0, 21.0]; // [B=1, S=1, Hkv=2, D=2]
    let got = attention_f64(&p, &q, &k, &v);
    for i in 0..2 {
        for h in 0..4 {
            let o = &got.out[(i * 4 + h) * 2..][..2];
            assert_eq!(o, &v[(h / 2) * 2..][..2], "row {i} head {h}");
        }
    }
}

#[test]
fn layouts_agree_up_to_transposition() {
    let dims_q = (2, 5, 4, 8);
    let dims_k = (2, 7, 2, 8);
    let p = params(2, 5, 7, 4, 2, 8).causal(true);
    let mut r = rng(5);
    let (q, k, v) = (
        uniform(&mut r, p.q_len()),
        uniform(&mut r, p.kv_len()),
        uniform(&mut r, p.kv_len()),
    );
    let to_bhsd = |x: &[f64], (nb, ns, nh, nd): (usize, usize, usize, usize)| {
        let mut y = vec![0.0; x.len()];
        for b in 0..nb {
            for s in 0..ns {
                for h in 0..nh {
                    for d in 0..nd {
                        y[idx(Layout::Bhsd, (nb, ns, nh, nd), b, s, h, d)] =
                            x[idx(Layout::Bshd, (nb, ns, nh, nd), b, s, h, d)];
                    }
                }
            }
        }
        y
    };
    let a = attention_f64(&p, &q, &k, &v);
    let b = attention_f64(
        &p.clone().layout(Layout::Bhsd),
        &to_bhsd(&q, dims_q),
        &to_bhsd(&k, dims_k),
        &to_bhsd(&v, dims_k),
    );
    assert_eq!(to_bhsd(&a.out, dims_q), b.out);
    assert_eq!(a.lse, b.lse);
}

#[test]
fn rel_l2_detects_nan_and_wrong_answers() {
    let want = vec![1.0, -2.0, 3.0];
    assert_eq!(rel_l2(&want, &want), 0.0);
    assert_eq!(rel_l2(&[1.0, f64::NAN, 3.0], &want), f64::INFINITY);
    assert_eq!(rel_l2(&[1.0, 2.0], &want), f64::INFINITY, "length mismatch");
    assert_eq!(rel_l2(&[1.0, f64::INFINITY, 3.0], &want), f64::INFINITY);
    let wrong = rel_l2(&[1.0, 2.0, 3.0], &want); // ‖(0,4,0)‖ / ‖(1,−2,3)‖
    assert!((wrong - 4.0 / 14f64.sqrt()).abs() < 1e-15, "{wrong}");
    // NaN must fail a `<= tol` check, even against an all-zero reference.
    assert_eq!(rel_l2(&[f64::NAN], &[0.0]), f64::INFINITY);
    // ‖b‖ = 0: the absolute error.
    assert_eq!(rel_l2(&[0.0, 0.0], &[0.0, 0.0]), 0.0);
    assert_eq!(rel_l2(&[3.0, 4.0], &[0.0, 0.0]), 5.0);
}

#[test]
fn check_close_rejects_nan_and_reports_the_error() {
    let want = vec![1.0, 2.0, f64::NEG_INFINITY];
    check_close("lse", &[1.0, 2.0 + 1e-9, f64::NEG_INFINITY], &want, 1e-6).unwrap();
    let e = check_close("lse", &[1.0, f64::NAN, f64::NEG_INFINITY], &want, 1.0).unwrap_err();
    assert!(
        e.contains("lse") && e.contains("NaN") && e.contains("element 1"),
        "{e}"
    );
    let e = check_close("out", &[1.0, 2.5, f64::NEG_INFINITY], &want, 1e-3).unwrap_err();
    assert!(
        e.contains("out") && e.contains("relative L2 error") && e.contains("element 1"),
        "{e}"
    );
    let e = check_close("lse", &[1.0, 2.0, -5.0], &want, 1.0).unwrap_err();
    assert!(e.contains("element 2") && e.contains("inf"), "{e}");
    let e = check_close("lse", &[1.0, 2.0, f64::NEG_INFINITY, 0.0], &want, 1.0).unwrap_err();
    assert!(e.contains("4 elements"), "{e}");
}

#[test]
fn conversions_are_exact() {
    let h = [
        half::f16::from_f32(0.333),
        half::f16::MAX,
        half::f16::NEG_INFINITY,
    ];
    assert_eq!(
        reference::f16_to_f64(&h),
        vec![
            half::f16::from_f32(0.333).to_f32() as f64,
            65504.0,
            f64::NEG_INFINITY
        ]
    );
    let b = [half::bf16::from_f32(-1.5), half::bf16::from_f32(3.0e38)];
    assert_eq!(
        reference::bf16_to_f64(&b),
        vec![-1.5, half::bf16::from_f32(3.0e38).to_f32() as f64]
    );
    assert_eq!(reference::f32_to_f64(&[0.1f32]), vec![0.1f32 as f64]);
}

// --- backward --------------------------------------------------------------------------------

/// L = Σ O ∘ dO, whose gradient is what `attention_backward_f64` returns.
fn loss(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> f64 {
    reference::attention_f64(p, q, k, v)
        .out
        .iter()
        .zip(d_o)
        .map(|(a, b)| a * b)
        .sum()
}

/// Every analytic gradient entry (all of dV, and a spread of dQ, dK entries) against central
/// differences of the loss: the backward oracle is itself checked.
#[test]
fn backward_matches_finite_differences() {
    let cases = [
        // (batch, hq, hkv, sq, sk, d, causal, layout)
        (2, 4, 1, 5, 7, 8, true, Layout::Bshd), // MQA, Sq < Sk
        (1, 4, 2, 7, 3, 8, true, Layout::Bhsd), // GQA 2:1, Sq > Sk: fully masked rows
        (1, 2, 2, 1, 1, 16, false, Layout::Bshd), // S = 1
        (2, 2, 2, 6, 6, 8, false, Layout::Bhsd),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xbac4);
    for (b, hq, hkv, sq, sk, d, causal, layout) in cases {
        let mut p = AttentionParams::new(b, hq, sq, d)
            .seqlen_k(sk)
            .causal(causal)
            .layout(layout);
        p.heads_kv = hkv;
        let r = |n: usize, rng: &mut rand::rngs::StdRng| {
            (0..n)
                .map(|_| rng.random_range(-1.5..1.5))
                .collect::<Vec<f64>>()
        };
        let (q, k, v, d_o) = (
            r(p.q_len(), &mut rng),
            r(p.kv_len(), &mut rng),
            r(p.kv_len(), &mut rng),
            r(p.q_len(), &mut rng),
        );
        let g = reference::attention_backward_f64(&p, &q, &k, &v, &d_o);
        let eps = 1e-6;
        let fd = |which: usize, i: usize| {
            let mut x = [q.clone(), k.clone(), v.clone()];
            x[which][i] += eps;
            let up = loss(&p, &x[0], &x[1], &x[2], &d_o);
            x[which][i] -= 2.0 * eps;
            let down = loss(&p, &x[0], &x[1], &x[2], &d_o);
            (up - down) / (2.0 * eps)
        };
        for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
            for i in (0..grad.len()).step_by(3) {
                let want = fd(which, i);
                assert!(
                    (grad[i] - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{p:?}: gradient {which} entry {i}: analytic {} vs finite difference {want}",
                    grad[i]
                );
            }
        }
        if causal && sq > sk {
            // Query rows that see no key have zero dQ (here: bhsd, rows 0 .. sq − sk).
            for h in 0..hq {
                for i in 0..sq - sk {
                    let at = (h * sq + i) * d;
                    assert!(
                        g.dq[at..at + d].iter().all(|&x| x == 0.0),
                        "masked row {i} has a gradient"
                    );
                }
            }
        }
    }
}

/// Windows, softcap and sinks in the backward oracle: windows (left-only, right-only, a window some rows see no key
/// through), softcap and sinks, alone and combined, against central differences of
/// L = Σ O ∘ dO through the forward oracle with the same features — dQ, dK, dV and dsink.
#[test]
fn backward_features_match_finite_differences() {
    use flashcore::attention::Window;
    let cases = [
        // (hq, hkv, sq, sk, causal, window (left, right), softcap, sinks)
        (2, 1, 6, 9, false, (2, 1), 0.0, false), // Sq < Sk, both sides
        (2, 2, 7, 4, true, (1, -1), 0.0, false), // causal + left, rows with no key
        (2, 2, 5, 5, false, (-1, 0), 0.0, false), // right-only (= causal)
        (2, 2, 5, 5, false, (0, -1), 0.0, false), // left 0: keys at and after the diagonal
        (4, 2, 6, 6, false, (-1, -1), 2.5, false), // softcap, GQA
        (4, 2, 6, 8, true, (2, -1), 1.5, false), // window + causal + GQA + softcap
        (2, 2, 5, 5, false, (-1, -1), 0.0, true), // sinks
        (2, 1, 7, 4, true, (1, -1), 0.0, true),  // sinks + window: a row may see only its sink
        (2, 2, 6, 6, false, (3, 3), 2.0, true),  // everything
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x24b);
    for (hq, hkv, sq, sk, causal, (wl, wr), cap, with_sinks) in cases {
        let mut p = AttentionParams::new(2, hq, sq, 8)
            .seqlen_k(sk)
            .causal(causal)
            .window(Window::from_flash_attn(wl, wr))
            .softcap(cap);
        p.heads_kv = hkv;
        let r = |n: usize, rng: &mut rand::rngs::StdRng| {
            (0..n)
                .map(|_| rng.random_range(-1.5..1.5))
                .collect::<Vec<f64>>()
        };
        let (q, k, v, d_o) = (
            r(p.q_len(), &mut rng),
            r(p.kv_len(), &mut rng),
            r(p.kv_len(), &mut rng),
            r(p.q_len(), &mut rng),
        );
        let sinks = with_sinks.then(|| r(hq, &mut rng));
        let (g, dsink) =
            reference::attention_backward_f64_sinks(&p, &q, &k, &v, &d_o, sinks.as_deref());
        assert_eq!(dsink.len(), if with_sinks { hq } else { 0 });
        let loss = |x: &[Vec<f64>; 4]| -> f64 {
            let s = with_sinks.then_some(&x[3][..]);
            reference::attention_f64_sinks(&p, &x[0], &x[1], &x[2], s)
                .out
                .iter()
                .zip(&d_o)
                .map(|(a, b)| a * b)
                .sum()
        };
        let eps = 1e-6;
        let base = [q, k, v, sinks.clone().unwrap_or_default()];
        let fd = |which: usize, i: usize| {
            let mut x = base.clone();
            x[which][i] += eps;
            let up = loss(&x);
            x[which][i] -= 2.0 * eps;
            let down = loss(&x);
            (up - down) / (2.0 * eps)
        };
        for (which, grad) in [(0, &g.dq), (1, &g.dk), (2, &g.dv), (3, &dsink)] {
            for i in (0..grad.len()).step_by(if which == 3 { 1 } else { 2 }) {
                let want = fd(which, i);
                assert!(
                    (grad[i] - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "{p:?}: gradient {which} entry {i}: analytic {} vs finite difference {want}",
                    grad[i]
                );
            }
        }
    }
}

/// The window, softcap and sink features straight from their definitions: a window in signed arithmetic
/// (flash-attn's bottom-right alignment, causal forcing right = 0), the softcap, and a sink
/// added to the denominator (exp without max subtraction: small scores).
fn naive_features(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sinks: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    let (b_, sq, sk, hq, hkv, d_) = (
        p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim,
    );
    let qd = (b_, sq, hq, d_);
    let kd = (b_, sk, hkv, d_);
    let scale = p.softmax_scale() as f64;
    let (left, right) = p.window.to_flash_attn();
    let right = if p.causal { 0 } else { right };
    let cap = p.softcap as f64;
    let mut out = vec![0.0; q.len()];
    let mut lse = vec![0.0; b_ * hq * sq];
    for b in 0..b_ {
        for h in 0..hq {
            let hk = h * hkv / hq;
            for i in 0..sq {
                let pos = i as i64 + sk as i64 - sq as i64;
                let allowed = |j: usize| {
                    let j = j as i64;
                    (left < 0 || j >= pos - left) && (right < 0 || j <= pos + right)
                };
                let mut e = vec![0.0; sk];
                for j in (0..sk).filter(|&j| allowed(j)) {
                    let dot: f64 = (0..d_)
                        .map(|d| {
                            q[idx(p.layout, qd, b, i, h, d)] * k[idx(p.layout, kd, b, j, hk, d)]
                        })
                        .sum();
                    let x = scale * dot;
                    e[j] = if cap > 0.0 { cap * (x / cap).tanh() } else { x }.exp();
                }
                let z: f64 = e.iter().sum::<f64>() + sinks.map_or(0.0, |s| s[h].exp());
                lse[(b * hq + h) * sq + i] = z.ln();
                for d in 0..d_ {
                    let acc: f64 = (0..sk)
                        .map(|j| e[j] * v[idx(p.layout, kd, b, j, hk, d)])
                        .sum();
                    out[idx(p.layout, qd, b, i, h, d)] = if z > 0.0 { acc / z } else { 0.0 };
                }
            }
        }
    }
    (out, lse)
}

#[test]
fn windows_softcap_and_sinks_match_their_definitions() {
    use flashcore::attention::Window;
    let mut r = rng(24);
    for (sq, sk, causal, (l, rt), cap, with_sinks) in [
        (9, 9, true, (2, -1), 0.0, false),
        (9, 9, false, (1, 3), 0.0, false),
        (5, 12, true, (4, 0), 2.0, true),
        (12, 5, false, (0, 0), 0.0, true), // rows that see no key: O = 0, LSE = the sink
        (12, 5, true, (-1, -1), 3.0, false),
        (7, 7, false, (-1, 2), 0.0, true),
    ] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            let mut p = params(2, sq, sk, 4, 2, 8).layout(layout).causal(causal);
            p.window = Window::from_flash_attn(l, rt);
            p.softcap = cap;
            let q = uniform(&mut r, p.q_len());
            let k = uniform(&mut r, p.kv_len());
            let v = uniform(&mut r, p.kv_len());
            let sinks: Option<Vec<f64>> = with_sinks.then(|| uniform(&mut r, 4));
            let got = reference::attention_f64_sinks(&p, &q, &k, &v, sinks.as_deref());
            let (out, lse) = naive_features(&p, &q, &k, &v, sinks.as_deref());
            check_close("out", &got.out, &out, 1e-12).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            check_close("lse", &got.lse, &lse, 1e-12).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        }
    }
    // No window, no cap, no sinks: the plain reference, bit for bit.
    let p = params(1, 6, 6, 2, 2, 8).causal(true);
    let (q, k, v) = (
        uniform(&mut r, p.q_len()),
        uniform(&mut r, p.kv_len()),
        uniform(&mut r, p.kv_len()),
    );
    assert_eq!(
        reference::attention_f64_sinks(&p, &q, &k, &v, None),
        attention_f64(&p, &q, &k, &v)
    );
}
