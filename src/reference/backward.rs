//! CPU float64 gradients of attention (the oracle for the backward kernels, issue 23):
//! given `dO`, the gradients dQ, dK, dV of `O = softmax(scale · Q Kᵀ + mask) V` with the
//! forward's semantics (GQA: a K/V head's gradient sums over its query heads; causal masks
//! aligned bottom-right; a fully masked row contributes nothing).
//!
//! Per (batch, query head) and row i, with P the row's probabilities:
//! dV_j += P_ij dO_i,  dP_ij = dO_i · V_j,  dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik),
//! dQ_i = scale Σ_j dS_ij K_j,  dK_j += scale dS_ij Q_i.

use super::visible_keys;
use crate::attention::AttentionParams;
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
    super::check_inputs(p, q, k, v);
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

    // Per (batch, query head): its dQ block [Sq, D] and its contributions to dK, dV [Sk, D].
    let blocks: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = (0..p.batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let hk = h / group;
            let key = |j: usize| b * ks[0] + j * ks[1] + hk * ks[2];
            let row = |i: usize| b * qs[0] + i * qs[1] + h * qs[2];
            let (mut dq, mut dk, mut dv) =
                (vec![0.0; sq * d], vec![0.0; sk * d], vec![0.0; sk * d]);
            let (mut pr, mut dp) = (vec![0.0f64; sk], vec![0.0f64; sk]);
            for i in 0..sq {
                let n = visible_keys(p.causal, i, sq, sk);
                if n == 0 {
                    continue;
                }
                let (qrow, dorow) = (&q[row(i)..][..d], &d_o[row(i)..][..d]);
                for j in 0..n {
                    pr[j] = scale
                        * qrow
                            .iter()
                            .zip(&k[key(j)..][..d])
                            .map(|(a, b)| a * b)
                            .sum::<f64>();
                }
                let m = pr[..n].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut l = 0.0;
                for x in &mut pr[..n] {
                    *x = (*x - m).exp();
                    l += *x;
                }
                pr[..n].iter_mut().for_each(|x| *x /= l);
                let mut dot = 0.0; // Σ_j P_ij dP_ij (= dO_i · O_i)
                for j in 0..n {
                    dp[j] = dorow
                        .iter()
                        .zip(&v[key(j)..][..d])
                        .map(|(a, b)| a * b)
                        .sum::<f64>();
                    dot += pr[j] * dp[j];
                }
                for j in 0..n {
                    let ds = pr[j] * (dp[j] - dot);
                    let (krow, dvrow) = (&k[key(j)..][..d], &mut dv[j * d..][..d]);
                    for (x, g) in dvrow.iter_mut().zip(dorow) {
                        *x += pr[j] * g;
                    }
                    for (x, kc) in dq[i * d..][..d].iter_mut().zip(krow) {
                        *x += scale * ds * kc;
                    }
                    for (x, qc) in dk[j * d..][..d].iter_mut().zip(qrow) {
                        *x += scale * ds * qc;
                    }
                }
            }
            (dq, dk, dv)
        })
        .collect();

    let mut g = RefGrads {
        dq: vec![0.0; p.q_len()],
        dk: vec![0.0; p.kv_len()],
        dv: vec![0.0; p.kv_len()],
    };
    for (bh, (dq, dk, dv)) in blocks.into_iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
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
    g
}
