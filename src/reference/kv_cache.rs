//! The float64 oracle of KV-cache attention (flash-attn's `flash_attn_with_kvcache` after its
//! append): sequence b's keys are the first `counts[b]` rows of its cache, its Sq queries the last
//! positions of those keys (a causal mask aligned bottom-right to the count); a sequence with no
//! key gives O = 0 and LSE = −inf.

use super::RefOutput;
use crate::spec::AttentionParams;

/// `q` `[B, Sq, Hq, D]`, caches `[B, capacity = p.seqlen_k, Hkv, D]`, both bshd.
///
/// # Panics
/// If a length does not match the shape or a count exceeds the capacity (test bugs).
pub fn kv_cache_f64(
    p: &AttentionParams,
    q: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    counts: &[usize],
) -> RefOutput {
    kv_cache_leftpad_f64(p, q, k_cache, v_cache, &vec![0; counts.len()], counts)
}

/// [`kv_cache_f64`] with left padding (flash-attn's `cache_leftpad`): sequence b's keys are rows
/// `starts[b]..counts[b]` of its cache (none when the start is at or past the count).
pub fn kv_cache_leftpad_f64(
    p: &AttentionParams,
    q: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    starts: &[usize],
    counts: &[usize],
) -> RefOutput {
    kv_cache_sinks_f64(p, q, k_cache, v_cache, starts, counts, None)
}

/// [`kv_cache_leftpad_f64`] with learnable sinks (one logit per query head, see
/// [`super::attention_f64_sinks`]); `p.window` and `p.softcap` apply as in the dense reference
/// (positions bottom-right aligned to each sequence's count). A sequence with no key gets O = 0
/// and LSE = its head's sink (−inf without sinks).
pub fn kv_cache_sinks_f64(
    p: &AttentionParams,
    q: &[f64],
    k_cache: &[f64],
    v_cache: &[f64],
    starts: &[usize],
    counts: &[usize],
    sinks: Option<&[f64]>,
) -> RefOutput {
    assert_eq!(counts.len(), p.batch, "reference: one count per sequence");
    assert_eq!(starts.len(), p.batch, "reference: one start per sequence");
    let (row_q, row_k) = (p.seqlen_q * p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    let mut out = Vec::with_capacity(p.q_len());
    let mut lse = Vec::with_capacity(p.lse_len());
    for (b, (&n, &start)) in counts.iter().zip(starts).enumerate() {
        assert!(
            n <= p.seqlen_k,
            "reference: count {n} past the capacity {}",
            p.seqlen_k
        );
        let start = start.min(n);
        if n == start {
            out.extend(std::iter::repeat_n(0.0, row_q));
            for h in 0..p.heads_q {
                let z = sinks.map_or(f64::NEG_INFINITY, |s| s[h]);
                lse.extend(std::iter::repeat_n(z, p.seqlen_q));
            }
            continue;
        }
        let one = AttentionParams {
            batch: 1,
            seqlen_k: n - start,
            ..p.clone()
        };
        let base = (b * p.seqlen_k + start) * row_k;
        let r = super::attention_f64_sinks(
            &one,
            &q[b * row_q..(b + 1) * row_q],
            &k_cache[base..base + (n - start) * row_k],
            &v_cache[base..base + (n - start) * row_k],
            sinks,
        );
        out.extend(r.out);
        lse.extend(r.lse);
    }
    RefOutput { out, lse }
}
