//! The f64 oracle of varlen attention: each sequence of a packed batch on its own,
//! through [`attention_f64`] with batch 1.

use super::{attention_f64_sinks, RefOutput};
use crate::spec::{AttentionParams, Layout};

/// Varlen attention in f64: `q` is `[total_q, Hq, D]`, `k`, `v` `[total_k, Hkv, D]`, sequence `b`
/// owning tokens `cu_q[b]..cu_q[b+1]` and `cu_k[b]..cu_k[b+1]`. Uses `p`'s heads, head dim, scale
/// and causal flag (bottom-right per sequence); ignores its batch, lengths and layout. Returns O
/// packed like `q` and the LSE as `[Hq, total_q]`.
pub fn varlen_f64(
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> RefOutput {
    varlen_sinks_f64(p, cu_q, cu_k, q, k, v, None)
}

/// [`varlen_f64`] with the window, softcap and sinks: `p.window` and `p.softcap` per sequence (its own
/// counts, bottom-right aligned) and learnable `sinks` (one logit per query head; a sequence
/// with no key gets O = 0 and LSE = the sink), as [`super::attention_f64_sinks`].
pub fn varlen_sinks_f64(
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    sinks: Option<&[f64]>,
) -> RefOutput {
    let (hq, hk, d) = (p.heads_q, p.heads_kv, p.head_dim);
    let total_q = *cu_q.last().unwrap_or(&0) as usize;
    let mut out = vec![0.0; total_q * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; hq * total_q];
    for b in 0..cu_q.len().saturating_sub(1) {
        let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
        let (k0, k1) = (cu_k[b] as usize, cu_k[b + 1] as usize);
        if q1 == q0 {
            continue;
        }
        let sp = AttentionParams {
            batch: 1,
            seqlen_q: q1 - q0,
            seqlen_k: k1 - k0,
            layout: Layout::Bshd,
            ..p.clone()
        };
        let r = attention_f64_sinks(
            &sp,
            &q[q0 * hq * d..q1 * hq * d],
            &k[k0 * hk * d..k1 * hk * d],
            &v[k0 * hk * d..k1 * hk * d],
            sinks,
        );
        out[q0 * hq * d..q1 * hq * d].copy_from_slice(&r.out);
        for h in 0..hq {
            for i in 0..q1 - q0 {
                lse[h * total_q + q0 + i] = r.lse[h * (q1 - q0) + i];
            }
        }
    }
    RefOutput { out, lse }
}

/// Gradients of [`varlen_f64`] given `d_o` (q's packed shape): per sequence, the
/// dense [`super::attention_backward_f64`] over its own rows. `used` = (k, q): sequence b's
/// queries saw its first `used_k[b]` keys only (`seqused_k`), and only its first `used_q[b]`
/// queries count (`seqused_q`); its other keys and queries get zero gradients.
#[allow(clippy::too_many_arguments)]
pub fn varlen_backward_f64(
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    used: [Option<&[i32]>; 2],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> super::RefGrads {
    varlen_backward_f64_sinks(p, cu_q, cu_k, used, q, k, v, d_o, None).0
}

/// [`varlen_backward_f64`] with the window, softcap and sinks, as [`varlen_sinks_f64`]: `p.window` and
/// `p.softcap` per sequence (its own counts, bottom-right aligned) and learnable `sinks`. Returns
/// the gradients and dsink (one per query head, summed over the sequences in order; empty
/// without sinks).
#[allow(clippy::too_many_arguments)]
pub fn varlen_backward_f64_sinks(
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    used: [Option<&[i32]>; 2],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sinks: Option<&[f64]>,
) -> (super::RefGrads, Vec<f64>) {
    varlen_backward_f64_given_o(p, cu_q, cu_k, used, q, k, v, d_o, sinks, None)
}

/// [`varlen_backward_f64_sinks`] with each row's D from a given packed `o` (q's shape; only the
/// rows of used queries are read), as [`super::attention_backward_f64_given_o`].
#[allow(clippy::too_many_arguments)]
pub fn varlen_backward_f64_given_o(
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    [used_k, used_q]: [Option<&[i32]>; 2],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
    sinks: Option<&[f64]>,
    o: Option<&[f64]>,
) -> (super::RefGrads, Vec<f64>) {
    let (hq, hk, d) = (p.heads_q, p.heads_kv, p.head_dim);
    let mut dsink = vec![0.0; if sinks.is_some() { hq } else { 0 }];
    let mut g = super::RefGrads {
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
    };
    for b in 0..cu_q.len().saturating_sub(1) {
        let q0 = cu_q[b] as usize;
        let mut q1 = cu_q[b + 1] as usize;
        if let Some(u) = used_q {
            q1 = q1.min(q0 + u[b].max(0) as usize);
        }
        let k0 = cu_k[b] as usize;
        let mut k1 = cu_k[b + 1] as usize;
        if let Some(u) = used_k {
            k1 = k1.min(k0 + u[b].max(0) as usize);
        }
        let sp = AttentionParams {
            batch: 1,
            seqlen_q: q1 - q0,
            seqlen_k: k1 - k0,
            layout: Layout::Bshd,
            ..p.clone()
        };
        let (qr, kr) = (q0 * hq * d..q1 * hq * d, k0 * hk * d..k1 * hk * d);
        let (r, ds) = super::attention_backward_f64_given_o(
            &sp,
            &q[qr.clone()],
            &k[kr.clone()],
            &v[kr.clone()],
            &d_o[qr.clone()],
            sinks,
            o.map(|o| &o[qr.clone()]),
        );
        g.dq[qr].copy_from_slice(&r.dq);
        g.dk[kr.clone()].copy_from_slice(&r.dk);
        g.dv[kr].copy_from_slice(&r.dv);
        for (a, b) in dsink.iter_mut().zip(ds) {
            *a += b;
        }
    }
    (g, dsink)
}
