//! The varlen backward on the GPU: dQ, dK, dV of packed sequences of mixed
//! lengths (1, 17, 128, 129, 1000, 4097; empty sequences — no queries, no keys; Sq ≠ Sk per
//! sequence, causal rows fully masked) against the float64 reference per sequence, causal and
//! not, GQA and MQA, f16 and bf16, every head dim; windows (aligned to
//! each sequence's own lengths), softcap and learnable sinks (dsink summed over the pack);
//! `seqused_k`; a sequence's gradient bits independent of its neighbours and of its place in the
//! pack, Inf/NaN in its neighbours included; bitwise run to run; bad `cu_seqlens` and buffers
//! refused before launch (outputs untouched). Fresh random inputs (the
//! seed is printed; FLASHCORE_SEED replays it), outputs poisoned with NaN before each launch.
//! Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.

mod common;

use common::{gpu, poison, randn, rng_from, seed, tolerance};
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::error::Error;
use flashcore::reference;

fn prefix(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
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
        seqlen_q: lq.iter().copied().max().unwrap_or(0).max(1),
        seqlen_k: lk.iter().copied().max().unwrap_or(0).max(1),
        heads_q: hq,
        heads_kv: hk,
        head_dim: d,
        dtype,
        causal,
        ..AttentionParams::new(1, 1, 1, d)
    }
}

/// One pack's host inputs.
struct Pack<T> {
    p: AttentionParams,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    used_k: Option<Vec<i32>>,
    used_q: Option<Vec<i32>>,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    d_o: Vec<T>,
    /// Learnable sinks (fp32 [heads_q]) of the forward and the backward; None: none.
    sinks: Option<Vec<f32>>,
}

impl<T: Element> Pack<T> {
    fn random(p: AttentionParams, lq: &[usize], lk: &[usize], rng: &mut impl rand::Rng) -> Pack<T> {
        let (cu_q, cu_k) = (prefix(lq), prefix(lk));
        let (tq, tk) = (lq.iter().sum::<usize>(), lk.iter().sum::<usize>());
        let (rq, rk) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
        Pack {
            q: randn(rng, tq * rq),
            k: randn(rng, tk * rk),
            v: randn(rng, tk * rk),
            d_o: randn(rng, tq * rq),
            p,
            cu_q,
            cu_k,
            used_k: None,
            used_q: None,
            sinks: None,
        }
    }
}

type Grads<T> = [Vec<T>; 3];

/// Makes a good pack's metadata bad.
type Breaker = Box<dyn Fn(&mut Pack<half::f16>)>;

/// Forward (O, LSE) then the varlen backward over poisoned gradients.
fn backward<T: Element>(ctx: &Context, pk: &Pack<T>) -> Result<Grads<T>, Error> {
    backward_full(ctx, pk).map(|r| r.grads)
}

/// What one forward + backward gave: the gradients, dsink (empty without sinks), and the O and
/// LSE the backward read.
struct Run<T> {
    grads: Grads<T>,
    dsink: Vec<f32>,
    o: Vec<T>,
    lse: Vec<f32>,
}

fn backward_full<T: Element>(ctx: &Context, pk: &Pack<T>) -> Result<Run<T>, Error> {
    let p = &pk.p;
    let up = |x: &[T]| ctx.upload(x).unwrap();
    let (q, k, v, d_o) = (up(&pk.q), up(&pk.k), up(&pk.v), up(&pk.d_o));
    let (cq, ck) = (ctx.upload(&pk.cu_q).unwrap(), ctx.upload(&pk.cu_k).unwrap());
    let used = pk.used_k.as_ref().map(|u| ctx.upload(u).unwrap());
    let used_q = pk.used_q.as_ref().map(|u| ctx.upload(u).unwrap());
    let tq = pk.q.len() / (p.heads_q * p.head_dim);
    let mut o = up(&vec![poison::<T>(); pk.q.len()]);
    let mut lse = ctx.upload(&vec![f32::NAN; p.heads_q * tq]).unwrap();
    let sinks = pk.sinks.as_ref().map(|s| ctx.upload(s).unwrap());
    ctx.attention_varlen_device_with_sinks(
        p,
        &q,
        &k,
        &v,
        [&cq, &ck],
        [used.as_ref(), used_q.as_ref()],
        sinks.as_ref(),
        &mut o,
        Some(&mut lse),
    )?;
    let mut dq = up(&vec![poison::<T>(); pk.q.len()]);
    let mut dk = up(&vec![poison::<T>(); pk.k.len()]);
    let mut dv = up(&vec![poison::<T>(); pk.k.len()]);
    let mut dsink = ctx.upload(&vec![f32::NAN; p.heads_q]).unwrap();
    match &sinks {
        Some(s) => ctx.attention_varlen_backward_with_sinks(
            p,
            &q,
            &k,
            &v,
            &cq,
            &ck,
            [used.as_ref(), used_q.as_ref()],
            &o,
            &lse,
            &d_o,
            s,
            &mut dq,
            &mut dk,
            &mut dv,
            &mut dsink,
        )?,
        None => ctx.attention_varlen_backward(
            p,
            &q,
            &k,
            &v,
            &cq,
            &ck,
            [used.as_ref(), used_q.as_ref()],
            &o,
            &lse,
            &d_o,
            &mut dq,
            &mut dk,
            &mut dv,
        )?,
    }
    Ok(Run {
        grads: [
            ctx.download(&dq).unwrap(),
            ctx.download(&dk).unwrap(),
            ctx.download(&dv).unwrap(),
        ],
        dsink: if sinks.is_some() {
            ctx.download(&dsink).unwrap()
        } else {
            Vec::new()
        },
        o: ctx.download(&o).unwrap(),
        lse: ctx.download(&lse).unwrap(),
    })
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Checks one pack's gradients against the reference: every element finite, each gradient's
/// relative L2 over the pack and per sequence (where the reference is not ~0) within the
/// dtype's bound, exact zeros where the reference is exactly zero. Returns the worst errors.
fn check<T: Element>(ctx: &Context, pk: &Pack<T>, what: &str) -> [f64; 3] {
    let p = &pk.p;
    let run = backward_full(ctx, pk).unwrap_or_else(|e| panic!("{what}: {e}"));
    let g = &run.grads;
    let s64: Option<Vec<f64>> = pk
        .sinks
        .as_ref()
        .map(|s| s.iter().map(|&x| x as f64).collect());
    let (want, _) = reference::varlen_backward_f64_sinks(
        p,
        &pk.cu_q,
        &pk.cu_k,
        [pk.used_k.as_deref(), pk.used_q.as_deref()],
        &f64s(&pk.q),
        &f64s(&pk.k),
        &f64s(&pk.v),
        &f64s(&pk.d_o),
        s64.as_deref(),
    );
    // Per sequence, the oracle with each row's D from the O the backward read (dtype-rounded):
    // where dP − D cancels — a row that sees few keys beside a sink has dP − D = dP · P_sink — O's
    // rounding is amplified past the dtype's bound in every flash backward (a 1×1 bf16 sequence
    // with a sink measured 2.2e-2 against the exact oracle). The whole pack's error is checked
    // against the exact oracle.
    let (want_o, _) = reference::varlen_backward_f64_given_o(
        p,
        &pk.cu_q,
        &pk.cu_k,
        [pk.used_k.as_deref(), pk.used_q.as_deref()],
        &f64s(&pk.q),
        &f64s(&pk.k),
        &f64s(&pk.v),
        &f64s(&pk.d_o),
        s64.as_deref(),
        Some(&f64s(&run.o)),
    );
    let tol = tolerance(p.dtype);
    if let Some(s) = &s64 {
        // dsink against the oracle from the O and LSE the backward read (dtype-rounded O: see
        // tests/dsink_rounding.rs), every packed row in order.
        let (hq, d) = (p.heads_q, p.head_dim);
        let tq = pk.q.len() / (hq * d);
        let (o, d_o) = (f64s(&run.o), f64s(&pk.d_o));
        let want_dsink: Vec<f64> = (0..hq)
            .map(|h| {
                -(0..tq)
                    .map(|t| {
                        let at = (t * hq + h) * d;
                        let dot: f64 = (0..d).map(|c| o[at + c] * d_o[at + c]).sum();
                        (s[h] - run.lse[h * tq + t] as f64).exp() * dot
                    })
                    .sum::<f64>()
            })
            .collect();
        let got: Vec<f64> = run.dsink.iter().map(|&x| x as f64).collect();
        assert!(
            got.iter().all(|x| x.is_finite()),
            "{what}: dsink {got:?} not finite"
        );
        let e = reference::rel_l2(&got, &want_dsink);
        assert!(e <= tol, "{what}: dsink relative L2 {e:.3e} > {tol:.0e}");
    }
    let mut worst = [0.0f64; 3];
    for (i, (name, got, want, want_o, cu, row)) in [
        (
            "dq",
            &g[0],
            &want.dq,
            &want_o.dq,
            &pk.cu_q,
            p.heads_q * p.head_dim,
        ),
        (
            "dk",
            &g[1],
            &want.dk,
            &want_o.dk,
            &pk.cu_k,
            p.heads_kv * p.head_dim,
        ),
        (
            "dv",
            &g[2],
            &want.dv,
            &want_o.dv,
            &pk.cu_k,
            p.heads_kv * p.head_dim,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let mut got = f64s(got);
        if let (0, Some(u)) = (i, &pk.used_q) {
            // dQ rows past a sequence's seqused_q are not written: still the poison; compared
            // as the reference's zeros from here on.
            for b in 0..u.len() {
                let first = (pk.cu_q[b] + u[b].max(0)).min(pk.cu_q[b + 1]) as usize;
                for x in &mut got[first * row..pk.cu_q[b + 1] as usize * row] {
                    assert!(x.is_nan(), "{what}: dq row past seqused_q was written");
                    *x = 0.0;
                }
            }
        }
        if let Some(j) = got.iter().position(|x| !x.is_finite()) {
            panic!(
                "{what}: {name}[{j}] = {} (not finite: unwritten or NaN)",
                got[j]
            );
        }
        if !got.is_empty() && want.iter().any(|&x| x != 0.0) {
            let e = reference::rel_l2(&got, want);
            assert!(
                e <= tol,
                "{what}: {name} relative L2 over the pack {e:.3e} > {tol:.0e}"
            );
            worst[i] = worst[i].max(e);
        }
        for b in 0..cu.len() - 1 {
            let (a, e) = (cu[b] as usize * row, cu[b + 1] as usize * row);
            let (gs, ws) = (&got[a..e], &want_o[a..e]);
            // Structurally zero (the sequence has no used query or no used key): exactly zero
            // here. (A row that sees one key has dQ = 0 only up to rounding.)
            let (uq, uk) = used_counts(pk, b);
            if uq == 0 || uk == 0 {
                if let Some(j) = gs.iter().position(|&x| x != 0.0) {
                    panic!(
                        "{what}: {name} sequence {b} element {j} = {}, want 0",
                        gs[j]
                    );
                }
            }
            if i > 0 {
                // Keys past seqused_k: dK = dV = 0 exactly.
                let past = &gs[(uk * row).min(gs.len())..];
                assert!(
                    past.iter().all(|&x| x == 0.0),
                    "{what}: {name} sequence {b}: a key past seqused_k has a gradient"
                );
            }
            let rms = (ws.iter().map(|x| x * x).sum::<f64>() / ws.len().max(1) as f64).sqrt();
            if rms > 1e-2 {
                let err = reference::rel_l2(gs, ws);
                assert!(
                    err <= tol,
                    "{what}: {name} sequence {b} ({uq} queries, {uk} keys) relative L2 {err:.3e} > {tol:.0e}"
                );
                worst[i] = worst[i].max(err);
            }
        }
    }
    worst
}

/// Sequence b's used queries and keys (seqused applied).
fn used_counts<T>(pk: &Pack<T>, b: usize) -> (usize, usize) {
    let lq = (pk.cu_q[b + 1] - pk.cu_q[b]) as usize;
    let lk = (pk.cu_k[b + 1] - pk.cu_k[b]) as usize;
    let uq = pk
        .used_q
        .as_ref()
        .map_or(lq, |u| lq.min(u[b].max(0) as usize));
    let uk = pk
        .used_k
        .as_ref()
        .map_or(lk, |u| lk.min(u[b].max(0) as usize));
    (uq, uk)
}

fn sweep<T: Element>(test: &str, dtype: DType) {
    let Some(ctx) = gpu(test) else {
        return;
    };
    let s = seed();
    eprintln!("{test}: seed {s}");
    let mut rng = rng_from(s);
    // Lengths 1, 17, 128, 129, 1000 mixed with an empty sequence of each kind, Sq ≠ Sk per
    // sequence (keys shorter — causal rows fully masked — longer, none).
    let lq = [1, 17, 128, 129, 1000, 0, 17, 5, 200];
    let lk = [1, 17, 128, 129, 1000, 40, 0, 300, 50];
    let mut cases = 0;
    let mut worst = [0.0f64; 3];
    for d in flashcore::spec::SUPPORTED_HEAD_DIMS {
        for causal in [false, true] {
            // GQA 2:1 everywhere; MQA and plain multi-head once per head dim.
            let heads: &[(usize, usize)] = if causal {
                &[(4, 2), (4, 1)]
            } else {
                &[(4, 2), (2, 2)]
            };
            for &(hq, hk) in heads {
                let p = params(dtype, hq, hk, d, causal, &lq, &lk);
                let pk = Pack::<T>::random(p, &lq, &lk, &mut rng);
                let w = check(
                    &ctx,
                    &pk,
                    &format!("seed {s} d{d} causal {causal} heads {hq}/{hk}"),
                );
                for i in 0..3 {
                    worst[i] = worst[i].max(w[i]);
                }
                cases += 1;
            }
        }
    }
    // One long sequence (4097: several tiles plus one row) beside a short one.
    let (lq, lk) = ([4097, 17], [4097, 33]);
    let (d, causal) = if dtype == DType::F16 {
        (64, true)
    } else {
        (128, false)
    };
    let p = params(dtype, 4, 2, d, causal, &lq, &lk);
    let pk = Pack::<T>::random(p, &lq, &lk, &mut rng);
    check(&ctx, &pk, &format!("seed {s} long d{d} causal {causal}"));
    cases += 1;
    eprintln!(
        "{test}: {cases} packs passed; worst relative L2 dq {:.2e} dk {:.2e} dv {:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn f16_varlen_gradients_match_reference() {
    sweep::<half::f16>("f16_varlen_gradients_match_reference", DType::F16);
}

#[test]
fn bf16_varlen_gradients_match_reference() {
    sweep::<half::bf16>("bf16_varlen_gradients_match_reference", DType::Bf16);
}

#[test]
fn seqused_k_gradients_match_reference() {
    let Some(ctx) = gpu("seqused_k_gradients_match_reference") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let (lq, lk) = ([100, 17, 129], [300, 50, 129]);
    for causal in [false, true] {
        let p = params(DType::F16, 4, 2, 64, causal, &lq, &lk);
        let mut pk = Pack::<half::f16>::random(p, &lq, &lk, &mut rng);
        // Fewer keys, none, all: keys past the used count get dK = dV = 0 exactly (checked).
        pk.used_k = Some(vec![200, 0, 129]);
        check(&ctx, &pk, &format!("seed {s} seqused_k causal {causal}"));
    }
}

#[test]
fn seqused_q_gradients_match_reference() {
    let Some(ctx) = gpu("seqused_q_gradients_match_reference") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    // A padded batch as the HF backend runs it: sequence b owns slot b of S tokens and uses its
    // first `used` queries and keys.
    let (lq, lk) = ([130, 130, 130], [130, 130, 130]);
    for causal in [false, true] {
        let p = params(DType::Bf16, 4, 2, 128, causal, &lq, &lk);
        let mut pk = Pack::<half::bf16>::random(p, &lq, &lk, &mut rng);
        pk.used_k = Some(vec![130, 17, 1]);
        pk.used_q = Some(vec![130, 17, 1]);
        check(&ctx, &pk, &format!("seed {s} seqused_q causal {causal}"));
    }
}

/// The bits of one sequence's gradients do not depend on its neighbours or its place in the
/// pack, and a pack's gradients are bitwise the same run to run.
#[test]
fn neighbours_and_reruns_do_not_change_the_bits() {
    let Some(ctx) = gpu("neighbours_and_reruns_do_not_change_the_bits") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for causal in [false, true] {
        same_bits::<half::f16>(&ctx, DType::F16, 64, causal, &mut rng, s);
        same_bits::<half::f16>(&ctx, DType::F16, 128, causal, &mut rng, s);
        same_bits::<half::bf16>(&ctx, DType::Bf16, 128, causal, &mut rng, s);
    }
}

fn same_bits<T: Element>(
    ctx: &Context,
    dtype: DType,
    d: usize,
    causal: bool,
    rng: &mut impl rand::Rng,
    s: u64,
) {
    let (xq, xk) = (129usize, 200usize);
    let alone = Pack::<T>::random(
        params(dtype, 4, 2, d, causal, &[xq], &[xk]),
        &[xq],
        &[xk],
        rng,
    );
    // The same sequence third in a pack, between random neighbours.
    let (lq, lk) = ([17, 1000, xq, 1], [5, 1000, xk, 64]);
    let mut pk = Pack::<T>::random(params(dtype, 4, 2, d, causal, &lq, &lk), &lq, &lk, rng);
    let (rq, rk) = (4 * d, 2 * d);
    let (q0, k0) = (pk.cu_q[2] as usize * rq, pk.cu_k[2] as usize * rk);
    pk.q[q0..q0 + xq * rq].copy_from_slice(&alone.q);
    pk.d_o[q0..q0 + xq * rq].copy_from_slice(&alone.d_o);
    pk.k[k0..k0 + xk * rk].copy_from_slice(&alone.k);
    pk.v[k0..k0 + xk * rk].copy_from_slice(&alone.v);
    let bits = |x: &[T]| x.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<u64>>();
    let a = backward(ctx, &alone).unwrap();
    let b = backward(ctx, &pk).unwrap();
    let what = format!("seed {s} {dtype:?} d{d} causal {causal}");
    assert!(
        a.iter().flatten().all(|x| x.to_f64().is_finite()),
        "{what}: unwritten"
    );
    assert!(
        a[0].iter().any(|x| x.to_f64() != 0.0),
        "{what}: dQ all zero"
    );
    assert_eq!(
        bits(&a[0]),
        bits(&b[0][q0..q0 + xq * rq]),
        "{what}: dQ bits changed with neighbours"
    );
    assert_eq!(
        bits(&a[1]),
        bits(&b[1][k0..k0 + xk * rk]),
        "{what}: dK bits changed with neighbours"
    );
    assert_eq!(
        bits(&a[2]),
        bits(&b[2][k0..k0 + xk * rk]),
        "{what}: dV bits changed with neighbours"
    );
    let again = backward(ctx, &pk).unwrap();
    for i in 0..3 {
        assert_eq!(
            bits(&b[i]),
            bits(&again[i]),
            "{what}: gradient {i} differs run to run"
        );
    }
}

/// Every rule is checked before launch: the error names the argument and the gradients keep
/// their poison.
#[test]
fn bad_cu_seqlens_and_buffers_are_refused_before_launch() {
    let Some(ctx) = gpu("bad_cu_seqlens_and_buffers_are_refused_before_launch") else {
        return;
    };
    let mut rng = rng_from(seed());
    let (lq, lk) = ([3usize, 5], [4usize, 6]);
    let good = Pack::<half::f16>::random(
        params(DType::F16, 2, 2, 64, false, &lq, &lk),
        &lq,
        &lk,
        &mut rng,
    );
    let arg = |r: Result<Grads<half::f16>, Error>| match r {
        Err(Error::InvalidArgument { arg, .. }) => arg,
        Err(e) => panic!("not an invalid argument: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let cases: Vec<(&str, Breaker)> = vec![
        ("cu_seqlens_q", Box::new(|pk| pk.cu_q = vec![0, 3, 7])), // not ending at the total 8
        ("cu_seqlens_k", Box::new(|pk| pk.cu_k = vec![0, 7, 10])), // 7 > max_seqlen_k 6
        ("cu_seqlens_q", Box::new(|pk| pk.cu_q = vec![0, 3])),    // batch + 1 entries wanted
        ("cu_seqlens_k", Box::new(|pk| pk.cu_k = vec![1, 4, 10])), // not starting at 0
    ];
    for (want, bad) in cases {
        let mut pk = Pack {
            p: good.p.clone(),
            cu_q: good.cu_q.clone(),
            cu_k: good.cu_k.clone(),
            used_k: None,
            used_q: None,
            q: good.q.clone(),
            k: good.k.clone(),
            v: good.v.clone(),
            d_o: good.d_o.clone(),
            sinks: None,
        };
        bad(&mut pk);
        // The forward checks nothing of the values on its device path: call the backward alone.
        assert_eq!(arg(backward_only(&ctx, &pk, 0)), want, "{want}");
    }
    // Wrong buffer lengths: lse, d_o, dq.
    for (which, want) in [(1, "lse"), (2, "d_o"), (3, "dq")] {
        assert_eq!(arg(backward_only(&ctx, &good, which)), want);
    }
    // The backward's shape rules apply to varlen too: a head dim with no backward.
    let mut pk = Pack {
        p: good.p.clone(),
        cu_q: good.cu_q.clone(),
        cu_k: good.cu_k.clone(),
        used_k: None,
        used_q: None,
        q: good.q.clone(),
        k: good.k.clone(),
        v: good.v.clone(),
        d_o: good.d_o.clone(),
        sinks: None,
    };
    pk.p.head_dim = 80;
    assert_eq!(arg(backward_only(&ctx, &pk, 0)), "head_dim");
}

/// The backward alone on the pack (O and LSE random: only the checks matter), with buffer
/// `shorten` (1 lse, 2 d_o, 3 dq) one element short; checks the gradients stayed poisoned.
fn backward_only(
    ctx: &Context,
    pk: &Pack<half::f16>,
    shorten: usize,
) -> Result<Grads<half::f16>, Error> {
    let p = &pk.p;
    let up = |x: &[half::f16]| ctx.upload(x).unwrap();
    let cut = |n: usize, i: usize| if shorten == i { n - 1 } else { n };
    let (q, k, v) = (up(&pk.q), up(&pk.k), up(&pk.v));
    let d_o = up(&pk.d_o[..cut(pk.d_o.len(), 2)]);
    let tq = pk.q.len() / (p.heads_q * p.head_dim);
    let (cq, ck) = (ctx.upload(&pk.cu_q).unwrap(), ctx.upload(&pk.cu_k).unwrap());
    let o = up(&pk.q);
    let lse = ctx.upload(&vec![0.0f32; cut(p.heads_q * tq, 1)]).unwrap();
    let mut dq = up(&vec![poison::<half::f16>(); cut(pk.q.len(), 3)]);
    let mut dk = up(&vec![poison::<half::f16>(); pk.k.len()]);
    let mut dv = up(&vec![poison::<half::f16>(); pk.k.len()]);
    let r = ctx.attention_varlen_backward(
        p,
        &q,
        &k,
        &v,
        &cq,
        &ck,
        [None, None],
        &o,
        &lse,
        &d_o,
        &mut dq,
        &mut dk,
        &mut dv,
    );
    if r.is_err() {
        for t in [&dq, &dk, &dv] {
            assert!(
                ctx.download(t).unwrap().iter().all(|x| x.is_nan()),
                "a refused call wrote a gradient"
            );
        }
    }
    r.map(|()| {
        [
            ctx.download(&dq).unwrap(),
            ctx.download(&dk).unwrap(),
            ctx.download(&dv).unwrap(),
        ]
    })
}

/// The window, softcap and sink features in the varlen backward: windows (both sides, left-only with causal,
/// right-only), softcap and learnable sinks, alone and combined, at every head dim, against the
/// float64 reference per sequence (each window bottom-right aligned to the sequence's own
/// lengths; rows that see no key), dsink against the oracle from the O the backward read.
#[test]
fn varlen_feature_gradients_match_reference() {
    let Some(ctx) = gpu("varlen_feature_gradients_match_reference") else {
        return;
    };
    let s = seed();
    eprintln!("varlen_feature_gradients_match_reference: seed {s}");
    let mut rng = rng_from(s);
    // Sq ≠ Sk per sequence (either way), an empty one of each kind, lengths across tiles.
    let lq = [1, 17, 300, 129, 0, 200, 5];
    let lk = [1, 17, 100, 300, 40, 200, 0];
    // (head dim, causal, window (left, right), softcap, sinks, hq, hkv)
    type Case = (usize, bool, (i64, i64), f32, bool, usize, usize);
    let cases: [Case; 8] = [
        (64, false, (20, 10), 0.0, false, 4, 2), // both sides: rows that see no key
        (96, true, (64, -1), 0.0, true, 4, 2),   // causal + left + sinks
        (128, false, (-1, -1), 3.0, false, 4, 1), // softcap, MQA
        (256, true, (100, -1), 2.5, true, 4, 2), // everything at d256
        (128, false, (50, 30), 2.0, true, 2, 2), // everything, non-causal
        (96, false, (-1, 50), 0.0, false, 4, 2), // right-only
        (256, false, (-1, -1), 0.0, true, 4, 1), // sinks only
        (64, true, (-1, -1), 2.0, true, 4, 2),   // softcap + sinks, causal
    ];
    let mut n = 0;
    for dtype in [DType::F16, DType::Bf16] {
        for &(d, causal, (wl, wr), cap, with_sinks, hq, hk) in &cases {
            let p = params(dtype, hq, hk, d, causal, &lq, &lk)
                .window(flashcore::attention::Window::from_flash_attn(wl, wr))
                .softcap(cap);
            let what = format!(
                "seed {s} {dtype:?} d{d} causal {causal} window ({wl}, {wr}) softcap {cap} sinks {with_sinks}"
            );
            let w = match dtype {
                DType::F16 => {
                    feature_case::<half::f16>(&ctx, p, &lq, &lk, with_sinks, &mut rng, &what)
                }
                DType::Bf16 => {
                    feature_case::<half::bf16>(&ctx, p, &lq, &lk, with_sinks, &mut rng, &what)
                }
            };
            eprintln!(
                "{what}: worst relative L2 dq {:.2e} dk {:.2e} dv {:.2e}",
                w[0], w[1], w[2]
            );
            n += 1;
        }
    }
    eprintln!("varlen_feature_gradients_match_reference: {n} packs passed");
}

fn feature_case<T: Element>(
    ctx: &Context,
    p: AttentionParams,
    lq: &[usize],
    lk: &[usize],
    with_sinks: bool,
    rng: &mut rand::rngs::StdRng,
    what: &str,
) -> [f64; 3] {
    use rand::Rng;
    let mut pk = Pack::<T>::random(p, lq, lk, rng);
    // Sharpened q, k: scores of a few units, so the softcap's tanh bends.
    let sharp = |x: &[T]| -> Vec<T> { x.iter().map(|v| T::from_f64(v.to_f64() * 1.8)).collect() };
    pk.q = sharp(&pk.q);
    pk.k = sharp(&pk.k);
    if with_sinks {
        pk.sinks = Some(
            (0..pk.p.heads_q)
                .map(|_| rng.random_range(-1.0..2.0))
                .collect(),
        );
    }
    check(ctx, &pk, what)
}

/// Inf and NaN in a sequence's neighbours (their Q, K, V, dO; hence NaN in their O and LSE) do
/// not reach its gradients: the bits equal those of the sequence alone and are finite. Tiles
/// that cross the sequence's end read the neighbour's rows (dK/dV kernel: Q, dO; dQ kernel: K,
/// V); they are zeroed before the GEMMs (0 · Inf would be NaN). Also the sequence's own keys past
/// seqused_k holding NaN: the used keys' gradients keep their bits, the others get exact zeros.
#[test]
fn nonfinite_neighbours_do_not_reach_a_sequence() {
    let Some(ctx) = gpu("nonfinite_neighbours_do_not_reach_a_sequence") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (d, causal, window, cap) in [
        (64, false, (-1, -1), 0.0),
        (96, true, (-1, -1), 0.0),
        (128, false, (40, 20), 0.0),
        (256, true, (100, -1), 2.5),
    ] {
        nonfinite::<half::f16>(&ctx, DType::F16, d, causal, window, cap, &mut rng, s);
        nonfinite::<half::bf16>(&ctx, DType::Bf16, d, causal, window, cap, &mut rng, s);
    }
}

/// ±Inf and NaN in turn.
fn nonfinite_fill<T: Element>(x: &mut [T]) {
    for (i, v) in x.iter_mut().enumerate() {
        *v = T::from_f64([f64::INFINITY, f64::NAN, f64::NEG_INFINITY][i % 3]);
    }
}

#[allow(clippy::too_many_arguments)]
fn nonfinite<T: Element>(
    ctx: &Context,
    dtype: DType,
    d: usize,
    causal: bool,
    (wl, wr): (i64, i64),
    cap: f32,
    rng: &mut rand::rngs::StdRng,
    s: u64,
) {
    let what = format!("seed {s} {dtype:?} d{d} causal {causal} window ({wl}, {wr}) softcap {cap}");
    let feat = |p: AttentionParams| {
        p.window(flashcore::attention::Window::from_flash_attn(wl, wr))
            .softcap(cap)
    };
    // 129 queries, 200 keys: both cross a tile end into the next sequence.
    let (xq, xk) = (129usize, 200usize);
    let alone = Pack::<T>::random(
        feat(params(dtype, 4, 2, d, causal, &[xq], &[xk])),
        &[xq],
        &[xk],
        rng,
    );
    let (lq, lk) = ([70, xq, 300], [90, xk, 260]);
    let mut pk = Pack::<T>::random(
        feat(params(dtype, 4, 2, d, causal, &lq, &lk)),
        &lq,
        &lk,
        rng,
    );
    let (rq, rk) = (4 * d, 2 * d);
    let (q0, k0) = (pk.cu_q[1] as usize * rq, pk.cu_k[1] as usize * rk);
    let (q1, k1) = (q0 + xq * rq, k0 + xk * rk);
    for x in [&mut pk.q, &mut pk.d_o] {
        nonfinite_fill(&mut x[..q0]);
        nonfinite_fill(&mut x[q1..]);
    }
    for x in [&mut pk.k, &mut pk.v] {
        nonfinite_fill(&mut x[..k0]);
        nonfinite_fill(&mut x[k1..]);
    }
    pk.q[q0..q1].copy_from_slice(&alone.q);
    pk.d_o[q0..q1].copy_from_slice(&alone.d_o);
    pk.k[k0..k1].copy_from_slice(&alone.k);
    pk.v[k0..k1].copy_from_slice(&alone.v);
    let bits = |x: &[T]| x.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<u64>>();
    let a = backward(ctx, &alone).unwrap();
    let b = backward(ctx, &pk).unwrap();
    assert!(
        a.iter().flatten().all(|x| x.to_f64().is_finite()),
        "{what}: the sequence alone has a non-finite gradient"
    );
    for (i, (name, lo, hi)) in [("dQ", q0, q1), ("dK", k0, k1), ("dV", k0, k1)]
        .into_iter()
        .enumerate()
    {
        let got = &b[i][lo..hi];
        assert!(
            got.iter().all(|x| x.to_f64().is_finite()),
            "{what}: {name} not finite beside Inf/NaN neighbours"
        );
        assert_eq!(
            bits(&a[i]),
            bits(got),
            "{what}: {name} bits changed beside Inf/NaN neighbours"
        );
    }
    // The sequence's own keys past seqused_k hold Inf/NaN: same bits as with finite ones there.
    let used = 150usize;
    let mut finite = Pack::<T>::random(alone.p.clone(), &[xq], &[xk], rng);
    finite.q.copy_from_slice(&alone.q);
    finite.d_o.copy_from_slice(&alone.d_o);
    finite.k.copy_from_slice(&alone.k);
    finite.v.copy_from_slice(&alone.v);
    finite.used_k = Some(vec![used as i32]);
    let mut dirty = Pack::<T>::random(alone.p.clone(), &[xq], &[xk], rng);
    dirty.q.copy_from_slice(&alone.q);
    dirty.d_o.copy_from_slice(&alone.d_o);
    dirty.k.copy_from_slice(&alone.k);
    dirty.v.copy_from_slice(&alone.v);
    nonfinite_fill(&mut dirty.k[used * rk..]);
    nonfinite_fill(&mut dirty.v[used * rk..]);
    dirty.used_k = Some(vec![used as i32]);
    let f = backward(ctx, &finite).unwrap();
    let g = backward(ctx, &dirty).unwrap();
    for i in 0..3 {
        assert!(
            g[i].iter().all(|x| x.to_f64().is_finite()),
            "{what}: gradient {i} not finite with Inf/NaN keys past seqused_k"
        );
        assert_eq!(
            bits(&f[i]),
            bits(&g[i]),
            "{what}: gradient {i} bits changed by keys past seqused_k"
        );
    }
    assert!(
        g[1][used * rk..]
            .iter()
            .chain(&g[2][used * rk..])
            .all(|x| x.to_f64() == 0.0),
        "{what}: a key past seqused_k has a gradient"
    );
}
