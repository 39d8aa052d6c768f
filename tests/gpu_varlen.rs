//! Varlen prefill (issue 22) on the GPU: packed sequences of mixed lengths against the f64
//! reference per sequence, Sq ≠ Sk per sequence, empty sequences, GQA, causal and not, and the
//! bits of a sequence independent of its neighbours and of its place in the pack. Skips visibly
//! without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.

mod common;

use common::{gpu, poison, randn, rng_from, seed, tolerance, upload_qkv};
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::reference;

fn prefix(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
}

/// Runs one pack (host inputs), returns (O, LSE) as the kernel wrote them over poisoned buffers.
fn run<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    cu_q: &[i32],
    cu_k: &[i32],
    q: &[T],
    k: &[T],
    v: &[T],
) -> (Vec<T>, Vec<f32>) {
    let (dq, dk, dv) = upload_qkv(ctx, q, k, v);
    let (dcq, dck) = (ctx.upload(cu_q).unwrap(), ctx.upload(cu_k).unwrap());
    let total_q = *cu_q.last().unwrap() as usize;
    let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; p.heads_q * total_q]).unwrap();
    ctx.attention_varlen(p, &dq, &dk, &dv, &dcq, &dck, &mut dout, Some(&mut dlse))
        .unwrap_or_else(|e| panic!("{p:?} {cu_q:?} {cu_k:?}: {e}"));
    (ctx.download(&dout).unwrap(), ctx.download(&dlse).unwrap())
}

fn params(
    dtype: DType,
    hq: usize,
    hk: usize,
    d: usize,
    causal: bool,
    lq: &[usize],
    lk: &[usize],
) -> AttentionParams {
    AttentionParams {
        batch: lq.len(),
        seqlen_q: lq.iter().copied().max().unwrap().max(1),
        seqlen_k: lk.iter().copied().max().unwrap().max(1),
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype,
        causal,
        ..AttentionParams::new(1, 1, 1, d)
    }
}

fn check_pack<T: Element>(ctx: &Context, p: &AttentionParams, lq: &[usize], lk: &[usize], s: u64) {
    let mut rng = rng_from(s);
    let (cu_q, cu_k) = (prefix(lq), prefix(lk));
    let (tq, tk) = (
        *cu_q.last().unwrap() as usize,
        *cu_k.last().unwrap() as usize,
    );
    let q: Vec<T> = randn(&mut rng, tq * p.heads_q * p.head_dim);
    let k: Vec<T> = randn(&mut rng, tk * p.heads_kv * p.head_dim);
    let v: Vec<T> = randn(&mut rng, tk * p.heads_kv * p.head_dim);
    let (out, lse) = run(ctx, p, &cu_q, &cu_k, &q, &k, &v);
    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let want = reference::varlen_f64(p, &cu_q, &cu_k, &f(&q), &f(&k), &f(&v));
    let got = f(&out);
    let ctxs = format!("seed {s} {p:?} lq {lq:?} lk {lk:?}");
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{ctxs}: non-finite (unwritten) output"
    );
    // Per sequence, so that one short sequence's error is not hidden by a long one.
    let row = p.heads_q * p.head_dim;
    for b in 0..lq.len() {
        let (a, e) = (cu_q[b] as usize * row, cu_q[b + 1] as usize * row);
        if a == e {
            continue;
        }
        let err = reference::rel_l2(&got[a..e], &want.out[a..e]);
        let all_zero = want.out[a..e].iter().all(|&x| x == 0.0);
        if all_zero {
            assert!(
                got[a..e].iter().all(|&x| x == 0.0),
                "{ctxs}: sequence {b} must be zero"
            );
        } else {
            assert!(
                err <= tolerance(p.dtype),
                "{ctxs}: sequence {b} rel L2 {err:.3e}"
            );
        }
    }
    let (mut gl, mut wl) = (Vec::new(), Vec::new());
    for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
        if w == f64::NEG_INFINITY {
            assert_eq!(g, f32::NEG_INFINITY, "{ctxs}: lse[{i}] must be -inf");
        } else {
            assert!(g.is_finite(), "{ctxs}: lse[{i}] = {g}");
            gl.push(g as f64);
            wl.push(w);
        }
    }
    if !gl.is_empty() {
        let e = reference::rel_l2(&gl, &wl);
        assert!(e <= 1e-3, "{ctxs}: LSE rel L2 {e:.3e}");
    }
    eprintln!("ok {ctxs}");
}

#[test]
fn mixed_lengths_match_the_reference() {
    let Some(ctx) = gpu("mixed_lengths_match_the_reference") else {
        return;
    };
    let s = seed();
    // Lengths 1, 17, 128, 129, 4097 with an empty sequence and Sq ≠ Sk per sequence (keys
    // shorter, longer, none).
    let lq = [1, 17, 0, 128, 129, 4097, 5, 3];
    let lk = [1, 40, 7, 128, 300, 4097, 0, 1];
    for causal in [false, true] {
        check_pack::<half::f16>(
            &ctx,
            &params(DType::F16, 4, 2, 64, causal, &lq, &lk),
            &lq,
            &lk,
            s,
        );
    }
    let lq = [1, 17, 128, 129, 700, 0, 200];
    let lk = [3, 17, 64, 129, 650, 5, 256];
    for causal in [false, true] {
        check_pack::<half::bf16>(
            &ctx,
            &params(DType::Bf16, 4, 1, 128, causal, &lq, &lk),
            &lq,
            &lk,
            s + 1,
        );
    }
    check_pack::<half::f16>(
        &ctx,
        &params(DType::F16, 2, 2, 128, true, &[4097, 1], &[4097, 1]),
        &[4097, 1],
        &[4097, 1],
        s + 2,
    );
}

/// A pack of more tiles than one launch's work list holds (several launches).
#[test]
fn many_short_sequences_span_several_launches() {
    let Some(ctx) = gpu("many_short_sequences_span_several_launches") else {
        return;
    };
    let n = 5000;
    let lq: Vec<usize> = (0..n).map(|i| 1 + i % 7).collect();
    let lk: Vec<usize> = (0..n).map(|i| 1 + i % 11).collect();
    check_pack::<half::f16>(
        &ctx,
        &params(DType::F16, 2, 2, 64, true, &lq, &lk),
        &lq,
        &lk,
        seed(),
    );
}

/// The bits of one sequence's rows (O and LSE) do not depend on its neighbours or its place.
#[test]
fn neighbours_do_not_change_a_sequences_bits() {
    let Some(ctx) = gpu("neighbours_do_not_change_a_sequences_bits") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (dtype_bf16, d, causal) in [(false, 64, true), (true, 128, false), (false, 128, true)] {
        let (hq, hk) = (4, 2);
        let (sq, sk) = (300, 333);
        let row_q = hq * d;
        let row_k = hk * d;
        macro_rules! case {
            ($t:ty, $dt:expr) => {{
                let q: Vec<$t> = randn(&mut rng, sq * row_q);
                let k: Vec<$t> = randn(&mut rng, sk * row_k);
                let v: Vec<$t> = randn(&mut rng, sk * row_k);
                // Alone.
                let p1 = params($dt, hq, hk, d, causal, &[sq], &[sk]);
                let (o1, l1) = run(&ctx, &p1, &prefix(&[sq]), &prefix(&[sk]), &q, &k, &v);
                // Between random neighbours, at two different offsets.
                for (before, after) in [
                    ((77usize, 90usize), (5usize, 1000usize)),
                    ((1000, 3), (129, 64)),
                ] {
                    let lq = [before.0, sq, after.0];
                    let lk = [before.1, sk, after.1];
                    let nq: Vec<$t> = randn(&mut rng, before.0 * row_q);
                    let nk: Vec<$t> = randn(&mut rng, before.1 * row_k);
                    let mq: Vec<$t> = randn(&mut rng, after.0 * row_q);
                    let mk: Vec<$t> = randn(&mut rng, after.1 * row_k);
                    let pq = [nq.clone(), q.clone(), mq.clone()].concat();
                    let pk = [nk.clone(), k.clone(), mk.clone()].concat();
                    let pv = [nk.clone(), v.clone(), mk.clone()].concat();
                    let p = params($dt, hq, hk, d, causal, &lq, &lk);
                    let (o, l) = run(&ctx, &p, &prefix(&lq), &prefix(&lk), &pq, &pk, &pv);
                    let a = before.0 * row_q;
                    let bits =
                        |x: &[$t]| x.iter().map(|e| e.to_f64().to_bits()).collect::<Vec<u64>>();
                    assert_eq!(
                        bits(&o[a..a + sq * row_q]),
                        bits(&o1),
                        "seed {s}: O bits changed with neighbours {lq:?}/{lk:?}"
                    );
                    let total = lq.iter().sum::<usize>();
                    for h in 0..hq {
                        for i in 0..sq {
                            assert_eq!(
                                l[h * total + before.0 + i].to_bits(),
                                l1[h * sq + i].to_bits(),
                                "seed {s}: LSE bits changed (head {h}, row {i})"
                            );
                        }
                    }
                }
            }};
        }
        if dtype_bf16 {
            case!(half::bf16, DType::Bf16);
        } else {
            case!(half::f16, DType::F16);
        }
    }
}

/// Bad metadata is a typed error naming the argument, before any launch.
#[test]
fn bad_cu_seqlens_are_refused() {
    let Some(ctx) = gpu("bad_cu_seqlens_are_refused") else {
        return;
    };
    // max_seqlen 8: each bad array below breaks exactly the rule named beside it.
    let p = params(DType::F16, 2, 2, 64, false, &[8, 8], &[8, 8]);
    let x = ctx.upload(&vec![half::f16::ZERO; 8 * 2 * 64]).unwrap();
    let mut out = ctx.upload(&vec![half::f16::ZERO; 8 * 2 * 64]).unwrap();
    let good = ctx.upload(&[0i32, 4, 8]).unwrap();
    for (bad, why) in [
        (vec![0i32, 5, 4], "non-decreasing"),
        (vec![0, 4, 7], "last entry"),
        (vec![0, 8], "batch + 1"),
        (vec![2, 4, 8], "start at 0"),
    ] {
        let dbad = ctx.upload(&bad).unwrap();
        let e = ctx
            .attention_varlen(&p, &x, &x, &x, &dbad, &good, &mut out, None)
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("cu_seqlens_q") && msg.contains(why),
            "{bad:?}: {msg}"
        );
        let e = ctx
            .attention_varlen(&p, &x, &x, &x, &good, &dbad, &mut out, None)
            .unwrap_err();
        assert!(e.to_string().contains("cu_seqlens_k"), "{bad:?}: {e}");
    }
}
