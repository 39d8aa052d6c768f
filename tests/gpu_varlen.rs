//! Varlen prefill on the GPU: packed sequences of mixed lengths against the f64
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

/// Head dims 96 and 256: mixed packs at d96 (fp16, GQA) and d256 (bf16), causal and not.
#[test]
fn head_dims_96_256_match_the_reference() {
    let Some(ctx) = gpu("head_dims_96_256_match_the_reference") else {
        return;
    };
    let s = seed();
    let lq = [1, 17, 0, 128, 129, 1000, 5];
    let lk = [1, 40, 7, 128, 300, 1000, 0];
    for causal in [false, true] {
        check_pack::<half::f16>(
            &ctx,
            &params(DType::F16, 4, 2, 96, causal, &lq, &lk),
            &lq,
            &lk,
            s,
        );
        check_pack::<half::bf16>(
            &ctx,
            &params(DType::Bf16, 2, 2, 256, causal, &lq, &lk),
            &lq,
            &lk,
            s + 1,
        );
    }
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

/// The device-built work list holds exactly the host's items, sequence by sequence (heaviest
/// first, each sequence's tiles together), split into
/// launches of at most VARLEN_CAPACITY with the right headers.
#[test]
fn device_work_list_matches_the_host_list() {
    use flashcore::attention::launch::varlen::{work_list, VARLEN_CAPACITY};
    let Some(ctx) = gpu("device_work_list_matches_the_host_list") else {
        return;
    };
    let n = 5000;
    let long_q: Vec<usize> = (0..n).map(|i| 1 + i % 7).collect();
    let long_k: Vec<usize> = (0..n).map(|i| 1 + i % 11).collect();
    let packs: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (
            vec![1, 17, 0, 128, 129, 4097, 5, 3],
            vec![1, 40, 7, 128, 300, 4097, 0, 1],
        ),
        (vec![700, 0, 200, 129], vec![650, 5, 256, 1]),
        (long_q, long_k),
    ];
    for (lq, lk) in packs {
        for causal in [false, true] {
            let p = params(DType::F16, 2, 2, 64, causal, &lq, &lk);
            let (cu_q, cu_k) = (prefix(&lq), prefix(&lk));
            let totals = [
                *cu_q.last().unwrap() as usize,
                *cu_k.last().unwrap() as usize,
            ];
            let (dq, dk) = (ctx.upload(&cu_q).unwrap(), ctx.upload(&cu_k).unwrap());
            let chunks = ctx
                .varlen_device_work_list(&p, &dq, &dk, None, totals)
                .unwrap();
            let host = work_list(&cu_q, &cu_k, 128, 128, causal);
            // Every launch but the last full, the last holding the rest; later launches may be
            // empty (the bound counts tiles the sequences do not have).
            let mut left = host.len();
            for c in &chunks {
                assert_eq!(c.len(), left.min(VARLEN_CAPACITY), "causal {causal}");
                left -= c.len();
            }
            let dev: Vec<_> = chunks.concat();
            let blocks = |it: &flashcore::attention::launch::varlen::WorkItem| {
                let keys = it.len_k as i64;
                let n = (keys + 127) / 128;
                if !causal {
                    return n;
                }
                let last = 128.min(it.rows as i64) - 1;
                let vis = keys.min(last + keys - it.rows as i64 + 1);
                if vis <= 0 {
                    0
                } else {
                    n.min((vis + 127) / 128)
                }
            };
            // Sequence by sequence (a sequence: its key start and query end), each once, its
            // tiles last query block first; the sequences by their first tile's weight, heaviest
            // first (ties in any order).
            let mut runs: Vec<((i32, i32), i64)> = Vec::new();
            for (i, it) in dev.iter().enumerate() {
                let seq = (it.k_start, it.q_start + it.rows);
                if i > 0 && runs.last().unwrap().0 == seq {
                    assert!(
                        dev[i - 1].rows < it.rows,
                        "causal {causal}: a sequence's tiles out of order"
                    );
                } else {
                    assert!(
                        runs.iter().all(|r| r.0 != seq),
                        "causal {causal}: a sequence's tiles split"
                    );
                    runs.push((seq, blocks(it)));
                }
            }
            assert!(
                runs.windows(2).all(|p| p[0].1 >= p[1].1),
                "causal {causal}: sequences not heaviest first"
            );
            let key = |it: &flashcore::attention::launch::varlen::WorkItem| it.fields();
            let mut a: Vec<_> = dev.iter().map(key).collect();
            let mut b: Vec<_> = host.iter().map(key).collect();
            a.sort();
            b.sort();
            assert_eq!(a, b, "causal {causal}: device and host items differ");
        }
    }
}

/// The host-built and the device-built lists give the same bits.
#[test]
fn host_and_device_lists_give_the_same_bits() {
    let Some(ctx) = gpu("host_and_device_lists_give_the_same_bits") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let lq = [1, 17, 0, 128, 129, 1000, 5, 3];
    let lk = [1, 40, 7, 128, 300, 999, 0, 1];
    let (cu_q, cu_k) = (prefix(&lq), prefix(&lk));
    let p = params(DType::Bf16, 4, 2, 128, true, &lq, &lk);
    let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
    let q: Vec<half::bf16> = randn(&mut rng, tq * 4 * 128);
    let k: Vec<half::bf16> = randn(&mut rng, tk * 2 * 128);
    let v: Vec<half::bf16> = randn(&mut rng, tk * 2 * 128);
    let (o1, l1) = run(&ctx, &p, &cu_q, &cu_k, &q, &k, &v);
    let (dq, dk, dv) = upload_qkv(&ctx, &q, &k, &v);
    let mut dout = ctx.upload(&vec![poison::<half::bf16>(); q.len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; 4 * tq]).unwrap();
    ctx.attention_varlen_host(&p, &dq, &dk, &dv, &cu_q, &cu_k, &mut dout, Some(&mut dlse))
        .unwrap();
    let o2 = ctx.download(&dout).unwrap();
    let l2 = ctx.download(&dlse).unwrap();
    let bits = |x: &[half::bf16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    assert_eq!(bits(&o1), bits(&o2), "seed {s}");
    let fb = |x: &[f32]| x.iter().map(|e| e.to_bits()).collect::<Vec<u32>>();
    assert_eq!(fb(&l1), fb(&l2), "seed {s}");
}

/// seqused_k: each sequence attends to a prefix of its keys, against the f64 reference of the
/// pack of those prefixes.
#[test]
fn seqused_k_matches_the_reference() {
    let Some(ctx) = gpu("seqused_k_matches_the_reference") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let lq = [1, 17, 128, 129, 300, 0, 4];
    let lk = [5, 40, 128, 300, 4097, 3, 9];
    let used = [5i32, 0, 100, 129, 1000, 2, 9];
    let (hq, hk, d) = (4, 2, 64);
    for causal in [false, true] {
        let p = params(DType::F16, hq, hk, d, causal, &lq, &lk);
        let (cu_q, cu_k) = (prefix(&lq), prefix(&lk));
        let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
        let q: Vec<half::f16> = randn(&mut rng, tq * hq * d);
        let k: Vec<half::f16> = randn(&mut rng, tk * hk * d);
        let v: Vec<half::f16> = randn(&mut rng, tk * hk * d);
        let (dq, dk, dv) = upload_qkv(&ctx, &q, &k, &v);
        let (dcq, dck) = (ctx.upload(&cu_q).unwrap(), ctx.upload(&cu_k).unwrap());
        let dused = ctx.upload(&used).unwrap();
        let mut dout = ctx.upload(&vec![poison::<half::f16>(); q.len()]).unwrap();
        let mut dlse = ctx.upload(&vec![f32::NAN; hq * tq]).unwrap();
        ctx.attention_varlen_device(
            &p,
            &dq,
            &dk,
            &dv,
            &dcq,
            &dck,
            Some(&dused),
            None,
            &mut dout,
            Some(&mut dlse),
        )
        .unwrap();
        let got: Vec<f64> = ctx
            .download(&dout)
            .unwrap()
            .iter()
            .map(|x| x.to_f64())
            .collect();
        let lse = ctx.download(&dlse).unwrap();
        // The reference's pack: each sequence's first used keys.
        let row_k = hk * d;
        let (mut rk, mut rv) = (Vec::new(), Vec::new());
        for b in 0..lk.len() {
            let a = cu_k[b] as usize * row_k;
            let e = a + used[b] as usize * row_k;
            rk.extend(k[a..e].iter().map(|x| x.to_f64()));
            rv.extend(v[a..e].iter().map(|x| x.to_f64()));
        }
        let ulen: Vec<usize> = used.iter().map(|&u| u as usize).collect();
        let rp = params(DType::F16, hq, hk, d, causal, &lq, &ulen);
        let fq: Vec<f64> = q.iter().map(|x| x.to_f64()).collect();
        let want = reference::varlen_f64(&rp, &cu_q, &prefix(&ulen), &fq, &rk, &rv);
        let row = hq * d;
        for b in 0..lq.len() {
            let (a, e) = (cu_q[b] as usize * row, cu_q[b + 1] as usize * row);
            if a == e {
                continue;
            }
            assert!(got[a..e].iter().all(|x| x.is_finite()), "seed {s}: seq {b}");
            if want.out[a..e].iter().all(|&x| x == 0.0) {
                assert!(
                    got[a..e].iter().all(|&x| x == 0.0),
                    "seed {s}: seq {b} zero"
                );
            } else {
                let err = reference::rel_l2(&got[a..e], &want.out[a..e]);
                assert!(
                    err <= tolerance(DType::F16),
                    "seed {s} causal {causal} seq {b}: {err:.3e}"
                );
            }
        }
        for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
            if w == f64::NEG_INFINITY {
                assert_eq!(g, f32::NEG_INFINITY, "seed {s}: lse[{i}]");
            } else {
                assert!(
                    ((g as f64) - w).abs() <= 1e-3 * w.abs().max(1.0),
                    "seed {s}: lse[{i}] {g} vs {w}"
                );
            }
        }
    }
}

/// cu_seqlens that break the contract on the no-sync path (not checked there) give no fault:
/// the builder clamps every offset into the pack.
#[test]
fn garbage_cu_seqlens_stay_inside_the_pack() {
    let Some(ctx) = gpu("garbage_cu_seqlens_stay_inside_the_pack") else {
        return;
    };
    let p = params(DType::F16, 2, 2, 64, true, &[8, 8], &[8, 8]);
    let x = ctx.upload(&vec![half::f16::ONE; 16 * 2 * 64]).unwrap();
    let mut out = ctx.upload(&vec![half::f16::ZERO; 16 * 2 * 64]).unwrap();
    for bad in [
        vec![0i32, 1_000_000, -5],
        vec![-100, 3, 2],
        vec![i32::MAX, i32::MIN, 16],
    ] {
        let d = ctx.upload(&bad).unwrap();
        ctx.attention_varlen_device(&p, &x, &x, &x, &d, &d, None, None, &mut out, None)
            .unwrap();
        ctx.synchronize().unwrap();
    }
}

/// A padded batch run as a pack with seqused_q = seqused_k (the HF path): each sequence's real
/// tokens from `b·S + start[b]`, rows no sequence uses left as they were; every real row equals
/// the dense pack of the real tokens, bit for bit.
#[test]
fn padded_batch_through_seqused_q_matches_the_dense_pack() {
    let Some(ctx) = gpu("padded_batch_through_seqused_q_matches_the_dense_pack") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (b, sl, hq, hk, d) = (3usize, 300usize, 4usize, 2usize, 64usize);
    let starts = [0usize, 37, 299];
    let used = [300usize, 263, 1];
    for causal in [false, true] {
        let q: Vec<half::f16> = randn(&mut rng, b * sl * hq * d);
        let k: Vec<half::f16> = randn(&mut rng, b * sl * hk * d);
        let v: Vec<half::f16> = randn(&mut rng, b * sl * hk * d);
        let mut cu: Vec<i32> = (0..b).map(|i| (i * sl + starts[i]) as i32).collect();
        cu.push((b * sl) as i32);
        let u: Vec<i32> = used.iter().map(|&x| x as i32).collect();
        let p = params(DType::F16, hq, hk, d, causal, &[sl; 3], &[sl; 3]);
        let (dq, dk, dv) = upload_qkv(&ctx, &q, &k, &v);
        let (dcu, du) = (ctx.upload(&cu).unwrap(), ctx.upload(&u).unwrap());
        let mut dout = ctx.upload(&vec![poison::<half::f16>(); q.len()]).unwrap();
        ctx.attention_varlen_device(
            &p,
            &dq,
            &dk,
            &dv,
            &dcu,
            &dcu,
            Some(&du),
            Some(&du),
            &mut dout,
            None,
        )
        .unwrap();
        let got = ctx.download(&dout).unwrap();
        // The dense pack of the real tokens.
        let (row_q, row_k) = (hq * d, hk * d);
        let take = |x: &[half::f16], row: usize| -> Vec<half::f16> {
            (0..b)
                .flat_map(|i| {
                    let a = (i * sl + starts[i]) * row;
                    x[a..a + used[i] * row].to_vec()
                })
                .collect()
        };
        let (pq, pk, pv) = (take(&q, row_q), take(&k, row_k), take(&v, row_k));
        let cu_d = prefix(&used);
        let (want, _) = run(
            &ctx,
            &params(DType::F16, hq, hk, d, causal, &used, &used),
            &cu_d,
            &cu_d,
            &pq,
            &pk,
            &pv,
        );
        let bits = |x: &[half::f16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
        assert_eq!(
            bits(&take(&got, row_q)),
            bits(&want),
            "seed {s} causal {causal}"
        );
        // Rows of padding were not written.
        for i in 0..b {
            for r in (0..starts[i]).chain(starts[i] + used[i]..sl) {
                let a = (i * sl + r) * row_q;
                assert!(got[a..a + row_q]
                    .iter()
                    .all(|x| x.to_bits() == poison::<half::f16>().to_bits()));
            }
        }
    }
}

/// Sequences without keys on the no-sync path give O = 0, LSE = −inf: through the kernel (keys in
/// the buffer, none in any sequence), and without a launch when the pack holds no key at all.
#[test]
fn packs_without_keys_give_zeros() {
    let Some(ctx) = gpu("packs_without_keys_give_zeros") else {
        return;
    };
    let p = params(DType::F16, 2, 2, 64, true, &[3, 4], &[1, 1]);
    let q = ctx.upload(&vec![half::f16::ONE; 7 * 2 * 64]).unwrap();
    let one_row = ctx.upload(&vec![half::f16::ONE; 2 * 64]).unwrap();
    let (cq, ck) = (
        ctx.upload(&[0i32, 3, 7]).unwrap(),
        ctx.upload(&[0i32, 0, 0]).unwrap(),
    );
    let check = |kv: &cudarc::driver::CudaSlice<half::f16>, what: &str| {
        let mut out = ctx
            .upload(&vec![poison::<half::f16>(); 7 * 2 * 64])
            .unwrap();
        let mut lse = ctx.upload(&[f32::NAN; 2 * 7]).unwrap();
        ctx.attention_varlen_device(
            &p,
            &q,
            kv,
            kv,
            &cq,
            &ck,
            None,
            None,
            &mut out,
            Some(&mut lse),
        )
        .unwrap();
        assert!(
            ctx.download(&out)
                .unwrap()
                .iter()
                .all(|x| x.to_f64() == 0.0),
            "{what}: O"
        );
        assert!(
            ctx.download(&lse)
                .unwrap()
                .iter()
                .all(|&x| x == f32::NEG_INFINITY),
            "{what}: LSE"
        );
    };
    check(&one_row, "no key in any sequence");
    match ctx.alloc::<half::f16>(0) {
        Ok(empty) => check(&empty, "no key in the pack"),
        Err(e) => eprintln!("no zero-length buffer on this driver ({e}): that case not run"),
    }
}
