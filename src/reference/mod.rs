//! CPU float64 attention: the oracle every correctness test compares against (docs/design.md §1).
//!
//! `O = softmax(scale · Q Kᵀ + mask) V` per (batch, query head), with the contract's semantics:
//! grouped-query attention (query head `h` reads kv head `h / (Hq / Hkv)`), causal masking
//! aligned bottom-right (query `i` sees key `j` iff `j <= i + Sk − Sq`), and a fully masked row
//! giving `O = 0` and `LSE = −inf`. Everything is computed in f64 with the row maximum
//! subtracted before exponentiating, so large scores neither overflow nor lose the small terms.

use crate::spec::AttentionParams;
use rayon::prelude::*;

mod backward;
mod kv_cache;
mod varlen;
pub use backward::{
    attention_backward_f64, attention_backward_f64_given_o, attention_backward_f64_sinks,
    dsink_from_o_f64, RefGrads,
};
pub use kv_cache::{kv_cache_f64, kv_cache_leftpad_f64, kv_cache_sinks_f64};
pub use varlen::{
    varlen_backward_f64, varlen_backward_f64_given_o, varlen_backward_f64_sinks, varlen_f64,
    varlen_sinks_f64,
};

/// Output of [`attention_f64`].
#[derive(Debug, Clone, PartialEq)]
pub struct RefOutput {
    /// O, in the layout of `q` (`p.layout`, shape of `q`).
    pub out: Vec<f64>,
    /// Log-sum-exp of the scaled, masked scores, natural log, laid out `[B, Hq, Sq]`;
    /// `−inf` for a fully masked row.
    pub lse: Vec<f64>,
}

/// Number of keys query row `i` may see: all `sk` without a mask; with the causal mask aligned
/// bottom-right, keys `0 ..= i + sk − sq` (none when `i + sk < sq`).
pub fn visible_keys(causal: bool, i: usize, seqlen_q: usize, seqlen_k: usize) -> usize {
    if causal {
        (i + seqlen_k + 1).saturating_sub(seqlen_q).min(seqlen_k)
    } else {
        seqlen_k
    }
}

/// Attention in float64 over `q`, `k`, `v` stored contiguously in `p.layout`
/// (`q`: `[B, Sq, Hq, D]` or `[B, Hq, Sq, D]`; `k`, `v`: same with `Sk`, `Hkv`).
/// Uses `p.softmax_scale()` (the f32 value the kernels use, widened exactly), `p.causal` and
/// `p.layout`; ignores `p.dtype`. Parallel over (batch, head) with rayon.
///
/// Unlike the kernels it accepts any head dimension and `Sk = 0` (every row then fully masked).
///
/// # Panics
/// If a slice's length does not match the shape, or `heads_kv` is 0 or does not divide
/// `heads_q` (a test bug, not an input error: callers with user input run
/// [`check_params`](crate::attention::validate::check_params) first).
pub fn attention_f64(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64]) -> RefOutput {
    attention_f64_sinks(p, q, k, v, None)
}

/// [`attention_f64`] with the window, softcap and sinks: `p.window` (query `i` sees key `j` iff
/// [`AttentionParams::sees`]), `p.softcap` (scores `cap · tanh(scale · q·k / cap)`), and
/// learnable `sinks` (one logit per query head: `exp(sink)` joins each row's denominator with no
/// value row, so a row that sees no key gets O = 0 and LSE = sink).
pub fn attention_f64_sinks(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sinks: Option<&[f64]>,
) -> RefOutput {
    check_inputs(p, q, k, v);
    if let Some(s) = sinks {
        assert_eq!(s.len(), p.heads_q, "reference: one sink per query head");
    }
    let (sq, sk, hq, d) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.head_dim);
    let group = p.heads_q / p.heads_kv;
    let qs = p.layout.strides(sq, hq, d);
    let ks = p.layout.strides(sk, p.heads_kv, d);
    let scale = p.softmax_scale() as f64;

    // One task per (batch, query head): its [Sq, D] output block and its Sq LSE values.
    let blocks: Vec<(Vec<f64>, Vec<f64>)> = (0..p.batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let hk = h / group;
            let key = |j: usize| b * ks[0] + j * ks[1] + hk * ks[2];
            let mut o = vec![0.0f64; sq * d];
            let mut lse = vec![f64::NEG_INFINITY; sq];
            let sink = sinks.map(|s| s[h]);
            let cap = p.softcap as f64;
            let mut s: Vec<(usize, f64)> = Vec::with_capacity(sk);
            for i in 0..sq {
                s.clear();
                let qrow = &q[b * qs[0] + i * qs[1] + h * qs[2]..][..d];
                for j in (0..sk).filter(|&j| p.sees(i, j)) {
                    let krow = &k[key(j)..][..d];
                    let x = scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>();
                    s.push((j, if cap > 0.0 { cap * (x / cap).tanh() } else { x }));
                }
                let m = s
                    .iter()
                    .map(|&(_, x)| x)
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // fully masked, no sink: O row stays 0, LSE stays −inf
                }
                let orow = &mut o[i * d..][..d];
                let mut l = sink.map_or(0.0, |z| (z - m).exp());
                for &(j, sj) in &s {
                    let w = (sj - m).exp();
                    l += w;
                    for (oc, vc) in orow.iter_mut().zip(&v[key(j)..][..d]) {
                        *oc += w * vc;
                    }
                }
                // l >= 1 (the maximum contributes exp(0)), so the division is safe.
                orow.iter_mut().for_each(|x| *x /= l);
                lse[i] = m + l.ln();
            }
            (o, lse)
        })
        .collect();

    let mut out = vec![0.0f64; p.q_len()];
    let mut lse = Vec::with_capacity(p.lse_len());
    for (bh, (o, l)) in blocks.into_iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
        for i in 0..sq {
            let at = b * qs[0] + i * qs[1] + h * qs[2];
            out[at..at + d].copy_from_slice(&o[i * d..][..d]);
        }
        lse.extend(l);
    }
    RefOutput { out, lse }
}

/// The oracles' argument checks (a mismatch is a test bug: see [`attention_f64`]'s panics).
fn check_inputs(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64]) {
    assert_eq!(
        q.len(),
        p.q_len(),
        "reference: q length does not match {p:?}"
    );
    assert_eq!(
        k.len(),
        p.kv_len(),
        "reference: k length does not match {p:?}"
    );
    assert_eq!(
        v.len(),
        p.kv_len(),
        "reference: v length does not match {p:?}"
    );
    assert!(
        p.heads_kv > 0 && p.heads_q % p.heads_kv == 0,
        "reference: heads_q ({}) must be a multiple of heads_kv ({})",
        p.heads_q,
        p.heads_kv
    );
}

/// Widens f16 values to f64 (exactly).
pub fn f16_to_f64(x: &[half::f16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Widens bf16 values to f64 (exactly).
pub fn bf16_to_f64(x: &[half::bf16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Widens f32 values to f64 (exactly).
pub fn f32_to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Relative L2 error ‖a − b‖ / ‖b‖ of `a` (the result under test) against `b` (the reference).
///
/// Returns `+inf` if the lengths differ or any element of `a` or `b` is NaN (so a NaN never
/// passes a `<= tol` check), and the absolute error ‖a − b‖ when ‖b‖ = 0. Meant for finite
/// data; [`check_close`] also handles infinite reference entries such as a masked row's LSE.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() || a.iter().chain(b).any(|x| x.is_nan()) {
        return f64::INFINITY;
    }
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt();
    let norm = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    let r = if norm == 0.0 { diff } else { diff / norm };
    if r.is_nan() {
        f64::INFINITY
    } else {
        r
    }
}

/// Checks `got` against the reference `want`: same length, no NaN in `got`, every infinite
/// entry of `want` (a fully masked row's `−inf` LSE) matched exactly, and the relative L2 error
/// over the remaining entries at most `tol`. On failure, the message names `name`, the error
/// and the worst element.
pub fn check_close(name: &str, got: &[f64], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{name}: {} elements, reference has {}",
            got.len(),
            want.len()
        ));
    }
    if let Some(i) = got.iter().position(|x| x.is_nan()) {
        return Err(format!(
            "{name}: NaN at element {i} (reference {})",
            want[i]
        ));
    }
    let mut finite = Vec::with_capacity(got.len());
    for (i, (&x, &y)) in got.iter().zip(want).enumerate() {
        if y.is_infinite() || x.is_infinite() {
            if x != y {
                return Err(format!("{name}: element {i} is {x}, reference {y}"));
            }
        } else {
            finite.push(i);
        }
    }
    let pick = |v: &[f64]| finite.iter().map(|&i| v[i]).collect::<Vec<f64>>();
    let err = rel_l2(&pick(got), &pick(want));
    if err <= tol {
        return Ok(());
    }
    let i = finite
        .iter()
        .copied()
        .max_by(|&a, &b| {
            (got[a] - want[a])
                .abs()
                .total_cmp(&(got[b] - want[b]).abs())
        })
        .unwrap_or(0);
    Err(format!(
        "{name}: relative L2 error {err:.3e} > {tol:.1e} (largest difference at element {i}: {} vs reference {})",
        got[i], want[i]
    ))
}
