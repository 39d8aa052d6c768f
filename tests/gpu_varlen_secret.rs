//! Secret lengths with varlen (`Context::attention_varlen_secret_len`) on the GPU:
//! public slots, secret true lengths. Each sequence against the f64 reference of its true
//! length (odd lengths, 0, 1, 17, 129, slots longer than lengths, `max_seqlen` past the longest
//! slot), rows past a length exactly 0 (LSE −inf), and the bits of a sequence independent of
//! its neighbours' lengths and of what its slot holds past its length. Skips visibly without a
//! GPU; fails under FLASHCORE_REQUIRE_GPU=1.

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

fn params(
    dtype: DType,
    hq: usize,
    hk: usize,
    d: usize,
    causal: bool,
    slots: &[usize],
    max: usize,
) -> AttentionParams {
    let mut p = AttentionParams::new(slots.len(), hq, max, d)
        .dtype(dtype)
        .causal(causal);
    p.heads_kv = hk;
    p
}

/// One call over poisoned outputs: (O, LSE).
fn run<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    cu: &[i32],
    lens: &[i32],
    q: &[T],
    k: &[T],
    v: &[T],
) -> (Vec<T>, Vec<f32>) {
    let (dq, dk, dv) = upload_qkv(ctx, q, k, v);
    let dcu = ctx.upload(cu).unwrap();
    let dlens = ctx.upload(lens).unwrap();
    let total = *cu.last().unwrap() as usize;
    let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; p.heads_q * total]).unwrap();
    ctx.attention_varlen_secret_len(p, &dq, &dk, &dv, &dcu, &dlens, &mut dout, Some(&mut dlse))
        .unwrap_or_else(|e| panic!("{p:?} {cu:?} {lens:?}: {e}"));
    (ctx.download(&dout).unwrap(), ctx.download(&dlse).unwrap())
}

/// Checks one call's output against the f64 reference of each sequence's first `lens[b]`
/// tokens: rows past the length exactly 0 with LSE −inf, the rest within the tolerance.
#[allow(clippy::too_many_arguments)]
fn check<T: Element>(
    p: &AttentionParams,
    cu: &[i32],
    lens: &[i32],
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    lse: &[f32],
    what: &str,
) {
    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (qf, kf, vf, got) = (f(q), f(k), f(v), f(out));
    let (hq, hk, d) = (p.heads_q, p.heads_kv, p.head_dim);
    let total = *cu.last().unwrap() as usize;
    assert!(
        got.iter().all(|x| x.is_finite()),
        "{what}: non-finite (unwritten) output"
    );
    let (mut gl, mut wl) = (Vec::new(), Vec::new());
    for b in 0..lens.len() {
        let (s0, s1) = (cu[b] as usize, cu[b + 1] as usize);
        let l = lens[b] as usize;
        assert!(l <= s1 - s0, "test bug: length past its slot");
        // Rows past the length: exactly zero, LSE −inf.
        assert!(
            got[(s0 + l) * hq * d..s1 * hq * d]
                .iter()
                .all(|&x| x == 0.0),
            "{what}: sequence {b}: rows {l}.. of its slot must be 0"
        );
        for h in 0..hq {
            for i in s0 + l..s1 {
                assert_eq!(
                    lse[h * total + i],
                    f32::NEG_INFINITY,
                    "{what}: lse[{h}, {i}]"
                );
            }
        }
        if l == 0 {
            continue;
        }
        let sp = AttentionParams {
            batch: 1,
            seqlen_q: l,
            seqlen_k: l,
            ..p.clone()
        };
        let r = reference::attention_f64(
            &sp,
            &qf[s0 * hq * d..(s0 + l) * hq * d],
            &kf[s0 * hk * d..(s0 + l) * hk * d],
            &vf[s0 * hk * d..(s0 + l) * hk * d],
        );
        let err = reference::rel_l2(&got[s0 * hq * d..(s0 + l) * hq * d], &r.out);
        assert!(
            err <= tolerance(p.dtype),
            "{what}: sequence {b} (slot {}, length {l}) rel L2 {err:.3e}",
            s1 - s0
        );
        for h in 0..hq {
            for i in 0..l {
                let g = lse[h * total + s0 + i];
                assert!(g.is_finite(), "{what}: lse[{h}, {}] = {g}", s0 + i);
                gl.push(g as f64);
                wl.push(r.lse[h * l + i]);
            }
        }
    }
    if !gl.is_empty() {
        let e = reference::rel_l2(&gl, &wl);
        assert!(e <= 1e-3, "{what}: LSE rel L2 {e:.3e}");
    }
    eprintln!("ok {what}");
}

fn case<T: Element>(ctx: &Context, p: &AttentionParams, slots: &[usize], lens: &[i32], s: u64) {
    let mut rng = rng_from(s);
    let cu = prefix(slots);
    let total = *cu.last().unwrap() as usize;
    let q: Vec<T> = randn(&mut rng, total * p.heads_q * p.head_dim);
    let k: Vec<T> = randn(&mut rng, total * p.heads_kv * p.head_dim);
    let v: Vec<T> = randn(&mut rng, total * p.heads_kv * p.head_dim);
    let (out, lse) = run(ctx, p, &cu, lens, &q, &k, &v);
    let what = format!("seed {s} {p:?} slots {slots:?} lengths {lens:?}");
    check(p, &cu, lens, &q, &k, &v, &out, &lse, &what);
}

#[test]
fn secret_lengths_in_slots_match_the_reference() {
    let Some(ctx) = gpu("secret_lengths_in_slots_match_the_reference") else {
        return;
    };
    let s = seed();
    // Lengths 0, 1, 17, 129 and odd ones, slots longer than their lengths, an empty slot, a slot
    // filled to the end, max_seqlen past the longest slot.
    let slots = [1, 17, 40, 129, 300, 0, 200, 5, 1];
    let lens = [1, 17, 1, 129, 129, 0, 17, 0, 0];
    for causal in [false, true] {
        case::<half::f16>(
            &ctx,
            &params(DType::F16, 4, 2, 64, causal, &slots, 301),
            &slots,
            &lens,
            s,
        );
        case::<half::bf16>(
            &ctx,
            &params(DType::Bf16, 4, 1, 128, causal, &slots, 300),
            &slots,
            &lens,
            s + 1,
        );
    }
    // Other head dims, one long odd sequence among short ones.
    let slots = [1000, 3, 77];
    let lens = [999, 2, 33];
    for causal in [false, true] {
        case::<half::f16>(
            &ctx,
            &params(DType::F16, 2, 2, 96, causal, &slots, 1000),
            &slots,
            &lens,
            s + 2,
        );
        case::<half::bf16>(
            &ctx,
            &params(DType::Bf16, 2, 2, 256, causal, &slots, 1000),
            &slots,
            &lens,
            s + 3,
        );
    }
    // Slots of one token (the padded batch's length 1).
    let slots = [1, 1, 1];
    let lens = [1, 0, 1];
    case::<half::f16>(
        &ctx,
        &params(DType::F16, 2, 2, 64, true, &slots, 1),
        &slots,
        &lens,
        s + 4,
    );
}

/// The output bits of a sequence depend on its own tokens and length only: the same pack run
/// with other lengths for its neighbours, and with other values in its slot past its length,
/// gives its rows bit for bit; and each run is the reference of its own lengths.
#[test]
fn bits_depend_on_the_own_length_only() {
    let Some(ctx) = gpu("bits_depend_on_the_own_length_only") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    let slots = [129usize, 200, 17, 64];
    let cu = prefix(&slots);
    let total = *cu.last().unwrap() as usize;
    for causal in [false, true] {
        let p = params(DType::Bf16, 4, 2, 128, causal, &slots, 200);
        let (hq, hk, d) = (p.heads_q, p.heads_kv, p.head_dim);
        let q: Vec<half::bf16> = randn(&mut rng, total * hq * d);
        let mut k: Vec<half::bf16> = randn(&mut rng, total * hk * d);
        let mut v: Vec<half::bf16> = randn(&mut rng, total * hk * d);
        let runs: [[i32; 4]; 3] = [[100, 200, 17, 1], [100, 0, 1, 64], [100, 129, 16, 33]];
        let mut firsts = Vec::new();
        for lens in runs {
            let (out, lse) = run(&ctx, &p, &cu, &lens, &q, &k, &v);
            check(
                &p,
                &cu,
                &lens,
                &q,
                &k,
                &v,
                &out,
                &lse,
                &format!("seed {s} causal {causal} lengths {lens:?}"),
            );
            firsts.push((out[..100 * hq * d].to_vec(), lse.clone()));
        }
        // Sequence 0 (length 100 in every run): its rows and its LSE, bit for bit.
        let lse0 = |l: &[f32]| -> Vec<u32> {
            (0..hq)
                .flat_map(|h| (0..100).map(move |i| (h, i)))
                .map(|(h, i)| l[h * total + i].to_bits())
                .collect()
        };
        for r in &firsts[1..] {
            assert!(
                r.0.iter()
                    .zip(&firsts[0].0)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "seed {s} causal {causal}: sequence 0's bits changed with its neighbours' lengths"
            );
            assert_eq!(
                lse0(&r.1),
                lse0(&firsts[0].1),
                "seed {s}: sequence 0's LSE bits"
            );
        }
        // Other values in sequence 0's slot past its length (keys and values 100..129): the same bits.
        for t in 100..129 {
            for x in &mut k[t * hk * d..(t + 1) * hk * d] {
                *x = half::bf16::from_f64(-x.to_f64() * 3.0 + 1.0);
            }
            for x in &mut v[t * hk * d..(t + 1) * hk * d] {
                *x = half::bf16::from_f64(x.to_f64() * 5.0 - 2.0);
            }
        }
        let (out, lse) = run(&ctx, &p, &cu, &runs[0], &q, &k, &v);
        assert!(
            out[..100 * hq * d]
                .iter()
                .zip(&firsts[0].0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "seed {s} causal {causal}: sequence 0's bits depend on its slot past its length"
        );
        assert_eq!(lse0(&lse), lse0(&firsts[0].1));
    }
}

/// A call with the wrong number of lengths, or keys that are not the queries' pack, is an error
/// before any launch (the checks themselves are unit-tested in src/attention/varlen_secret.rs).
#[test]
fn bad_calls_fail_before_launch() {
    let Some(ctx) = gpu("bad_calls_fail_before_launch") else {
        return;
    };
    let p = params(DType::F16, 2, 2, 64, false, &[3, 5], 5);
    let row = 2 * 64;
    let q = ctx.upload(&vec![half::f16::ZERO; 8 * row]).unwrap();
    let k7 = ctx.upload(&vec![half::f16::ZERO; 7 * row]).unwrap();
    let cu = ctx.upload(&[0i32, 3, 8]).unwrap();
    let lens1 = ctx.upload(&[1i32]).unwrap();
    let lens2 = ctx.upload(&[1i32, 2]).unwrap();
    let mut out = ctx.upload(&vec![poison::<half::f16>(); 8 * row]).unwrap();
    let e = ctx
        .attention_varlen_secret_len(&p, &q, &q, &q, &cu, &lens1, &mut out, None)
        .unwrap_err();
    assert!(e.to_string().contains("lengths"), "{e}");
    let e = ctx
        .attention_varlen_secret_len(&p, &q, &k7, &k7, &cu, &lens2, &mut out, None)
        .unwrap_err();
    assert!(e.to_string().contains("self-attention"), "{e}");
    // Nothing was written.
    assert!(ctx.download(&out).unwrap().iter().all(|x| x.is_nan()));
}
