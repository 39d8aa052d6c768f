//! CPU float64 gradients of attention (the oracle for the backward kernels):
//! given `dO`, the gradients dQ, dK, dV of `O = softmax(scale · Q Kᵀ + mask) V` with the
//! forward's semantics (GQA: a K/V head's gradient sums over its query heads; causal masks
//! aligned bottom-right; a fully masked row contributes nothing).
//!
//! Per (batch, query head) and row i, with P the row's probabilities:
//! dV_j += P_ij dO_i,  dP_ij = dO_i · V_j,  dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik),
//! dQ_i = scale Σ_j dS_ij K_j,  dK_j += scale dS_ij Q_i.
//!
//! The window masks by [`AttentionParams::sees`]; a softcap's logit
//! `cap · tanh(x / cap)` (x = scale · q·k) multiplies dS by `1 − tanh²(x / cap)`; learnable sinks
//! join each row's denominator (P_sink = exp(sink − LSE)) with no value row, and their gradient
//! is `dsink[h] = −Σ_{b,i} P_sink · Σ_j P_ij dP_ij` ([`attention_backward_f64_sinks`]).

use crate::spec::AttentionParams;
use rayon::prelude::*;

/// Gradients of [`super::attention_f64`], each in the layout of the tensor it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct RefGrads {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

/// dQ, dK, dV for `q`, `k`, `v` and the output gradient `d_o` (shape of `q`), all contiguous in
/// `p.layout`. Parallel over (batch, query head); each K/V head's gradient is summed over its
/// query heads in head order (deterministic).
///
/// # Panics
/// As [`super::attention_f64`], and if `d_o` does not have `q`'s length.
pub fn attention_backward_f64(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> RefGrads {
    attention_backward_f64_sinks(p, q, k, v, d_o, None).0
}

/// [`attention_backward_f64`] with the window, softcap and sinks: `p.window`, `p.softcap`, and learnable
/// `sinks` (one logit per query head, as [`super::attention_f64_sinks`]). Returns the gradients
/// and dsink (one per query head, summed over batch and rows in order; empty without sinks).
///
/// # Panics
/// As [`attention_backward_f64`], and if `sinks` does not hold one value per query head.
pub fn attention_backward_f64_sinks(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sinks: Option<&[f64]>,
) -> (RefGrads, Vec<f64>) {
    attention_backward_f64_given_o(p, q, k, v, d_o, sinks, None)
}

/// [`attention_backward_f64_sinks`] with each row's D = Σ_j P_ij dP_ij taken as dO_i · O_i from
/// a given `o` (shape of `q`) when `o` is `Some`: the backward kernels' D, computed from the
/// dtype-rounded O they read. Equal to the exact gradients when `o` is the exact output; with a
/// rounded one it is the oracle of what a flash backward can reach from its inputs where
/// dP − D cancels (a row that sees few keys beside a sink: dP − D = dP · P_sink; dsink, a sum of
/// mixed-sign terms), which amplifies O's rounding (tests/dsink_rounding.rs).
pub fn attention_backward_f64_given_o(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sinks: Option<&[f64]>,
    o: Option<&[f64]>,
) -> (RefGrads, Vec<f64>) {
    super::check_inputs(p, q, k, v);
    if let Some(o) = o {
        assert_eq!(
            o.len(),
            p.q_len(),
            "reference: o length does not match {p:?}"
        );
    }
    if let Some(s) = sinks {
        assert_eq!(s.len(), p.heads_q, "reference: one sink per query head");
    }
    assert_eq!(
        d_o.len(),
        p.q_len(),
        "reference: dO length does not match {p:?}"
    );
    let (sq, sk, hq, d) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.head_dim);
    let group = hq / p.heads_kv;
    let qs = p.layout.strides(sq, hq, d);
    let ks = p.layout.strides(sk, p.heads_kv, d);
    let scale = p.softmax_scale() as f64;

    let cap = p.softcap as f64;
    // Per (batch, query head): its dQ block [Sq, D], its contributions to dK, dV [Sk, D], and
    // its dsink contribution.
    type Block = (Vec<f64>, Vec<f64>, Vec<f64>, f64);
    let blocks: Vec<Block> = (0..p.batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let hk = h / group;
            let key = |j: usize| b * ks[0] + j * ks[1] + hk * ks[2];
            let row = |i: usize| b * qs[0] + i * qs[1] + h * qs[2];
            let (mut dq, mut dk, mut dv) =
                (vec![0.0; sq * d], vec![0.0; sk * d], vec![0.0; sk * d]);
            let (mut pr, mut dp) = (vec![0.0f64; sk], vec![0.0f64; sk]);
            // The softcap's derivative factor 1 − tanh²(x / cap) per visible key (1 without).
            let mut dcap = vec![1.0f64; sk];
            let mut keys: Vec<usize> = Vec::with_capacity(sk);
            let sink = sinks.map(|s| s[h]);
            let mut dsink = 0.0;
            for i in 0..sq {
                keys.clear();
                keys.extend((0..sk).filter(|&j| p.sees(i, j)));
                let n = keys.len();
                let (qrow, dorow) = (&q[row(i)..][..d], &d_o[row(i)..][..d]);
                for (x, &j) in keys.iter().enumerate() {
                    let s = scale
                        * qrow
                            .iter()
                            .zip(&k[key(j)..][..d])
                            .map(|(a, b)| a * b)
                            .sum::<f64>();
                    if cap > 0.0 {
                        let t = (s / cap).tanh();
                        pr[x] = cap * t;
                        dcap[x] = 1.0 - t * t;
                    } else {
                        pr[x] = s;
                    }
                }
                let m = pr[..n]
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // no key and no sink: nothing flows back
                }
                let mut l = sink.map_or(0.0, |z| (z - m).exp());
                for x in &mut pr[..n] {
                    *x = (*x - m).exp();
                    l += *x;
                }
                pr[..n].iter_mut().for_each(|x| *x /= l);
                let mut dot = 0.0; // Σ_j P_ij dP_ij (= dO_i · O_i)
                for (x, &j) in keys.iter().enumerate() {
                    dp[x] = dorow
                        .iter()
                        .zip(&v[key(j)..][..d])
                        .map(|(a, b)| a * b)
                        .sum::<f64>();
                    dot += pr[x] * dp[x];
                }
                if let Some(o) = o {
                    dot = dorow
                        .iter()
                        .zip(&o[row(i)..][..d])
                        .map(|(a, b)| a * b)
                        .sum();
                }
                if let Some(z) = sink {
                    dsink -= (z - m).exp() / l * dot;
                }
                for (x, &j) in keys.iter().enumerate() {
                    let ds = pr[x] * (dp[x] - dot) * dcap[x];
                    let (krow, dvrow) = (&k[key(j)..][..d], &mut dv[j * d..][..d]);
                    for (y, g) in dvrow.iter_mut().zip(dorow) {
                        *y += pr[x] * g;
                    }
                    for (y, kc) in dq[i * d..][..d].iter_mut().zip(krow) {
                        *y += scale * ds * kc;
                    }
                    for (y, qc) in dk[j * d..][..d].iter_mut().zip(qrow) {
                        *y += scale * ds * qc;
                    }
                }
            }
            (dq, dk, dv, dsink)
        })
        .collect();

    let mut g = RefGrads {
        dq: vec![0.0; p.q_len()],
        dk: vec![0.0; p.kv_len()],
        dv: vec![0.0; p.kv_len()],
    };
    let mut dsink = vec![0.0; if sinks.is_some() { hq } else { 0 }];
    for (bh, (dq, dk, dv, ds)) in blocks.into_iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
        if let Some(x) = dsink.get_mut(h) {
            *x += ds;
        }
        let hk = h / group;
        for i in 0..sq {
            let at = b * qs[0] + i * qs[1] + h * qs[2];
            g.dq[at..at + d].copy_from_slice(&dq[i * d..][..d]);
        }
        for j in 0..sk {
            let at = b * ks[0] + j * ks[1] + hk * ks[2];
            for c in 0..d {
                g.dk[at + c] += dk[j * d + c];
                g.dv[at + c] += dv[j * d + c];
            }
        }
    }
    (g, dsink)
}

/// dsink from a given output `o` (shape of `q`) and LSE (`[B, Hq, Sq]`, natural log): per head
/// `−Σ_{b,i} exp(sink − LSE_bi) · (dO_bi · O_bi)`, as the backward kernels compute it from their
/// inputs. With the exact O and LSE it equals [`attention_backward_f64_sinks`]'s dsink; with the
/// dtype-rounded O a kernel reads it is the oracle of the dsink that kernel can reach (dsink's
/// cancellation amplifies O's rounding: tests/dsink_rounding.rs).
pub fn dsink_from_o_f64(
    p: &AttentionParams,
    o: &[f64],
    lse: &[f64],
    d_o: &[f64],
    sinks: &[f64],
) -> Vec<f64> {
    assert_eq!(
        o.len(),
        p.q_len(),
        "reference: o length does not match {p:?}"
    );
    assert_eq!(
        d_o.len(),
        p.q_len(),
        "reference: dO length does not match {p:?}"
    );
    assert_eq!(
        lse.len(),
        p.lse_len(),
        "reference: lse length does not match {p:?}"
    );
    assert_eq!(sinks.len(), p.heads_q, "reference: one sink per query head");
    let (sq, hq, d) = (p.seqlen_q, p.heads_q, p.head_dim);
    let qs = p.layout.strides(sq, hq, d);
    let mut dsink = vec![0.0; hq];
    for (h, out) in dsink.iter_mut().enumerate() {
        for b in 0..p.batch {
            for i in 0..sq {
                let l = lse[(b * hq + h) * sq + i];
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let at = b * qs[0] + i * qs[1] + h * qs[2];
                let dot: f64 = o[at..at + d]
                    .iter()
                    .zip(&d_o[at..at + d])
                    .map(|(a, b)| a * b)
                    .sum();
                *out -= (sinks[h] - l).exp() * dot;
            }
        }
    }
    dsink
}
