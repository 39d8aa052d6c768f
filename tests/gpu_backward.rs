//! GPU correctness of the backward pass: dQ, dK, dV against the float64 reference
//! gradients at odd shapes (S = 1, 17, 1000; Sq ≠ Sk; causal with Sq > Sk, whose first rows are
//! fully masked; GQA 4:1 and MQA; both layouts), both dtypes and head dims; bitwise run-to-run
//! and batch invariance; bad input rejected before launch. Fresh random inputs each run (the seed
//! is printed; FLASHCORE_SEED replays it); outputs are poisoned with NaN before each launch.
//! Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.
//! `FLASHCORE_BWD_BENCH=1` adds a timing report (backward_throughput_report).

mod common;
use common::*;
use flashcore::attention::{AttentionParams, Context, DType, Element, Layout};
use flashcore::reference;

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// One case with fresh inputs: each gradient's relative L2 against the reference, or why it failed.
fn check_case<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    rng: &mut impl rand::Rng,
) -> Result<[f64; 3], String> {
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    let d_o: Vec<T> = randn(rng, p.q_len());
    let g = backward(ctx, p, &q, &k, &v, &d_o);
    let want = reference::attention_backward_f64(p, &f64s(&q), &f64s(&k), &f64s(&v), &f64s(&d_o));
    let tol = tolerance(p.dtype);
    let mut errs = [0.0; 3];
    for (i, (name, got, want)) in [
        ("dq", &g.dq, &want.dq),
        ("dk", &g.dk, &want.dk),
        ("dv", &g.dv, &want.dv),
    ]
    .into_iter()
    .enumerate()
    {
        let got = f64s(got);
        if let Some(j) = got.iter().position(|x| !x.is_finite()) {
            return Err(format!("{p:?}: {name}[{j}] = {} (not finite)", got[j]));
        }
        // dQ rows of fully masked queries (causal, Sq > Sk) must be exactly zero.
        if name == "dq" {
            if let Some(j) = masked_rows(p)
                .into_iter()
                .flatten()
                .find(|&j| got[j] != 0.0)
            {
                return Err(format!(
                    "{p:?}: dq[{j}] = {}, its query row is fully masked (want 0)",
                    got[j]
                ));
            }
        }
        errs[i] = reference::rel_l2(&got, want);
        if errs[i] > tol {
            return Err(format!(
                "{p:?}: {name} relative L2 {:.3e} > {tol:.0e}",
                errs[i]
            ));
        }
    }
    Ok(errs)
}

/// Element indices of dQ rows whose query sees no key (bottom-right causal mask, Sq > Sk).
fn masked_rows(p: &AttentionParams) -> Vec<Vec<usize>> {
    let st = p.layout.strides(p.seqlen_q, p.heads_q, p.head_dim);
    let mut rows = Vec::new();
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            for i in 0..p.seqlen_q {
                if p.causal && i + p.seqlen_k < p.seqlen_q {
                    let start = b * st[0] + i * st[1] + h * st[2];
                    rows.push((start..start + p.head_dim).collect());
                }
            }
        }
    }
    rows
}

/// The shapes of the sweep: (batch, heads_q, heads_kv, seqlen_q, seqlen_k, causal, layout).
fn shapes() -> Vec<(usize, usize, usize, usize, usize, bool, Layout)> {
    use Layout::*;
    vec![
        (1, 2, 2, 1, 1, false, Bshd),
        (1, 2, 2, 1, 1, true, Bshd),
        (2, 2, 2, 17, 17, false, Bshd),
        (2, 2, 2, 17, 17, true, Bhsd),
        (1, 2, 2, 1000, 1000, false, Bshd),
        (1, 2, 2, 1000, 1000, true, Bshd),
        (1, 2, 2, 100, 300, false, Bshd),
        (1, 2, 2, 100, 300, true, Bshd),
        (1, 2, 2, 300, 100, true, Bshd), // Sq > Sk: the first 200 rows are fully masked
        (1, 2, 2, 1, 200, true, Bshd),
        (2, 8, 2, 257, 257, false, Bshd), // GQA 4:1
        (1, 8, 2, 200, 333, true, Bhsd),  // GQA 4:1, causal, Sq ≠ Sk
        (1, 4, 1, 257, 257, true, Bshd),  // MQA
        (1, 4, 1, 130, 70, false, Bshd),  // MQA, Sq ≠ Sk
    ]
}

fn sweep<T: Element>(name: &str, dtype: DType) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let seed = seed();
    eprintln!("{name}: seed {seed}");
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    let mut worst = [0.0f64; 3];
    let mut cases = 0;
    for d in [64, 128] {
        for &(b, hq, hkv, sq, sk, causal, layout) in &shapes() {
            let mut p = AttentionParams::new(b, hq, sq, d)
                .seqlen_k(sk)
                .causal(causal)
                .dtype(dtype)
                .layout(layout);
            p.heads_kv = hkv;
            cases += 1;
            match check_case::<T>(&ctx, &p, &mut rng) {
                Ok(e) => {
                    for i in 0..3 {
                        worst[i] = worst[i].max(e[i]);
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    eprintln!(
        "{name}: {cases} cases, {} failed; worst relative L2 dq {:.2e} dk {:.2e} dv {:.2e}",
        failures.len(),
        worst[0],
        worst[1],
        worst[2]
    );
    assert!(
        failures.is_empty(),
        "seed {seed}:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn f16_gradients_match_reference() {
    sweep::<half::f16>("f16_gradients_match_reference", DType::F16);
}

#[test]
fn bf16_gradients_match_reference() {
    sweep::<half::bf16>("bf16_gradients_match_reference", DType::Bf16);
}

#[test]
fn custom_scale_gradients_match_reference() {
    let Some(ctx) = gpu("custom_scale_gradients_match_reference") else {
        return;
    };
    let seed = seed();
    let mut rng = rng_from(seed);
    let p = AttentionParams::new(1, 2, 150, 64)
        .causal(true)
        .scale(0.3)
        .dtype(DType::F16);
    check_case::<half::f16>(&ctx, &p, &mut rng).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

#[test]
fn gradient_bits_are_identical_run_to_run() {
    let Some(ctx) = gpu("gradient_bits_are_identical_run_to_run") else {
        return;
    };
    let mut rng = rng_from(seed());
    let mut p = AttentionParams::new(2, 8, 1500, 128)
        .causal(true)
        .dtype(DType::Bf16);
    p.heads_kv = 2;
    let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let k: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let v: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let d_o: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let first = backward(&ctx, &p, &q, &k, &v, &d_o);
    for _ in 0..3 {
        let again = backward(&ctx, &p, &q, &k, &v, &d_o);
        assert!(
            same_bits(&first.dq, &again.dq),
            "dq bits differ between runs"
        );
        assert!(
            same_bits(&first.dk, &again.dk),
            "dk bits differ between runs"
        );
        assert!(
            same_bits(&first.dv, &again.dv),
            "dv bits differ between runs"
        );
    }
}

/// One sequence alone and as the middle entry of a batch of three with other neighbours: its
/// gradients' bits are the same (bshd: a sequence is a contiguous slice of every tensor).
#[test]
fn gradient_bits_are_batch_invariant() {
    let Some(ctx) = gpu("gradient_bits_are_batch_invariant") else {
        return;
    };
    let mut rng = rng_from(seed());
    for (d, causal, hq, hkv, sq, sk) in [(128, false, 4, 4, 700, 700), (64, true, 8, 2, 513, 300)] {
        let mut one = AttentionParams::new(1, hq, sq, d)
            .seqlen_k(sk)
            .causal(causal)
            .dtype(DType::F16);
        one.heads_kv = hkv;
        let mut three = one.clone();
        three.batch = 3;
        let inputs = |n: usize, rng: &mut rand::rngs::StdRng| -> Vec<half::f16> { randn(rng, n) };
        let (q1, k1, v1, o1) = (
            inputs(one.q_len(), &mut rng),
            inputs(one.kv_len(), &mut rng),
            inputs(one.kv_len(), &mut rng),
            inputs(one.q_len(), &mut rng),
        );
        let alone = backward(&ctx, &one, &q1, &k1, &v1, &o1);
        // Neighbours: fresh random sequences before and after.
        let embed = |x: &[half::f16], rng: &mut rand::rngs::StdRng| {
            let mut all = inputs(x.len(), rng);
            all.extend_from_slice(x);
            all.extend(inputs(x.len(), rng));
            all
        };
        let (q3, k3, v3, o3) = (
            embed(&q1, &mut rng),
            embed(&k1, &mut rng),
            embed(&v1, &mut rng),
            embed(&o1, &mut rng),
        );
        let batch = backward(&ctx, &three, &q3, &k3, &v3, &o3);
        let mid = |x: &[half::f16], n: usize| x[n..2 * n].to_vec();
        assert!(
            same_bits(&alone.dq, &mid(&batch.dq, one.q_len())),
            "dq bits depend on the batch ({one:?})"
        );
        assert!(
            same_bits(&alone.dk, &mid(&batch.dk, one.kv_len())),
            "dk bits depend on the batch ({one:?})"
        );
        assert!(
            same_bits(&alone.dv, &mid(&batch.dv, one.kv_len())),
            "dv bits depend on the batch ({one:?})"
        );
    }
}

#[test]
fn bad_backward_input_is_rejected_before_launch() {
    let Some(ctx) = gpu("bad_backward_input_is_rejected_before_launch") else {
        return;
    };
    let p = AttentionParams::new(1, 2, 64, 64).dtype(DType::F16);
    let z = |n: usize| ctx.alloc::<half::f16>(n).unwrap();
    let (q, k, v, o) = (z(p.q_len()), z(p.kv_len()), z(p.kv_len()), z(p.q_len()));
    let lse = ctx.alloc::<f32>(p.lse_len()).unwrap();
    let (mut dq, mut dk, mut dv) = (z(p.q_len()), z(p.kv_len()), z(p.kv_len()));
    // dO of the wrong shape.
    let short = z(p.q_len() - 64);
    let e = ctx
        .attention_backward(
            &p,
            &q,
            &k,
            &v,
            &o,
            Some(&lse),
            &short,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("d_o"), "{e}");
    // dO of the wrong dtype.
    let bf = ctx.alloc::<half::bf16>(p.q_len()).unwrap();
    let e = ctx
        .attention_backward(
            &p,
            &q,
            &k,
            &v,
            &o,
            Some(&lse),
            &bf,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("d_o") && e.contains("bf16"), "{e}");
    // No LSE.
    let d_o = z(p.q_len());
    let e = ctx
        .attention_backward(&p, &q, &k, &v, &o, None, &d_o, &mut dq, &mut dk, &mut dv)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lse") && e.contains("log-sum-exp"), "{e}");
    // Nothing was written: the outputs are still zero.
    let got: Vec<half::f16> = ctx.download(&dq).unwrap();
    assert!(got.iter().all(|x| x.to_f64() == 0.0));
}

/// The one backward entry point, `Context::run_backward`, on a `BackwardCall` gives the bits of
/// `attention_backward` (a shorthand for it), and refuses before any launch what has no backward:
/// sinks without their gradient buffer, secret lengths, KV caches.
#[test]
fn run_backward_is_what_the_methods_run() {
    use flashcore::attention::{BackwardCall, Call, Grads, Keys, KvCache};
    let Some(ctx) = gpu("run_backward_is_what_the_methods_run") else {
        return;
    };
    let mut rng = rng_from(seed());
    let mut p = AttentionParams::new(2, 4, 300, 64)
        .causal(true)
        .dtype(DType::Bf16);
    p.heads_kv = 2;
    let up = |x: &[half::bf16]| ctx.upload(x).unwrap();
    let q = up(&randn(&mut rng, p.q_len()));
    let k = up(&randn(&mut rng, p.kv_len()));
    let v = up(&randn(&mut rng, p.kv_len()));
    let d_o = up(&randn(&mut rng, p.q_len()));
    let mut o = ctx.alloc::<half::bf16>(p.q_len()).unwrap();
    let mut lse = ctx.alloc::<f32>(p.lse_len()).unwrap();
    ctx.attention(&p, &q, &k, &v, &mut o, Some(&mut lse))
        .unwrap();
    let grads = |ctx: &Context| {
        let z = |n| ctx.alloc::<half::bf16>(n).unwrap();
        (z(p.q_len()), z(p.kv_len()), z(p.kv_len()))
    };
    let (mut dq, mut dk, mut dv) = grads(&ctx);
    ctx.attention_backward(
        &p,
        &q,
        &k,
        &v,
        &o,
        Some(&lse),
        &d_o,
        &mut dq,
        &mut dk,
        &mut dv,
    )
    .unwrap();
    let (mut dq2, mut dk2, mut dv2) = grads(&ctx);
    let dense = Call::new(&p, &q, Keys::Dense { k: &k, v: &v });
    let call = BackwardCall::new(dense, &o, Some(&lse), &d_o);
    ctx.run_backward(&call, Grads::new(&mut dq2, &mut dk2, &mut dv2))
        .unwrap();
    for (a, b, name) in [(&dq, &dq2, "dq"), (&dk, &dk2, "dk"), (&dv, &dv2, "dv")] {
        let (a, b): (Vec<half::bf16>, Vec<half::bf16>) =
            (ctx.download(a).unwrap(), ctx.download(b).unwrap());
        assert!(same_bits(&a, &b), "{name}: run_backward differs");
    }
    // Refusals, each before any launch (the outputs stay zero).
    let (mut dq3, mut dk3, mut dv3) = grads(&ctx);
    let sinks = ctx.alloc::<f32>(p.heads_q).unwrap();
    let lengths = ctx.upload(&[300i32, 200]).unwrap();
    let cache = KvCache::contiguous(&k, &v, &lengths);
    let cases = [
        (dense.sinks(&sinks), "dsink"),
        (
            Call::new(
                &p,
                &q,
                Keys::SecretLen {
                    k: &k,
                    v: &v,
                    lengths: &lengths,
                },
            ),
            "secret lengths",
        ),
        (Call::new(&p, &q, Keys::KvCache(cache)), "KV cache"),
    ];
    for (forward, want) in cases {
        let call = BackwardCall::new(forward, &o, Some(&lse), &d_o);
        let e = ctx
            .run_backward(&call, Grads::new(&mut dq3, &mut dk3, &mut dv3))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
    let got: Vec<half::bf16> = ctx.download(&dq3).unwrap();
    assert!(got.iter().all(|x| x.to_f64() == 0.0));
}

/// Timing report (not a gate): FLASHCORE_BWD_BENCH=1. Median of 10 backward calls on one plan,
/// synchronised wall time, FLOPs 2.5 × the forward's (flash-attn's count).
#[test]
fn backward_throughput_report() {
    if std::env::var("FLASHCORE_BWD_BENCH").as_deref() != Ok("1") {
        return;
    }
    let Some(ctx) = gpu("backward_throughput_report") else {
        return;
    };
    let mut rng = rng_from(1);
    for (b, h, s, d, causal) in [
        (2, 16, 8192, 128, false),
        (2, 16, 8192, 128, true),
        (8, 16, 2048, 128, false),
        (8, 32, 2048, 64, false),
        (2, 32, 8192, 64, true),
        (32, 16, 512, 128, true),
    ] {
        let p = AttentionParams::new(b, h, s, d)
            .causal(causal)
            .dtype(DType::Bf16);
        let up = |n: usize, rng: &mut rand::rngs::StdRng| {
            ctx.upload(&randn::<half::bf16>(rng, n)).unwrap()
        };
        let (q, k, v, d_o) = (
            up(p.q_len(), &mut rng),
            up(p.kv_len(), &mut rng),
            up(p.kv_len(), &mut rng),
            up(p.q_len(), &mut rng),
        );
        let mut o = ctx.alloc::<half::bf16>(p.q_len()).unwrap();
        let mut lse = ctx.alloc::<f32>(p.lse_len()).unwrap();
        ctx.attention(&p, &q, &k, &v, &mut o, Some(&mut lse))
            .unwrap();
        let (mut dq, mut dk, mut dv) = (
            ctx.alloc::<half::bf16>(p.q_len()).unwrap(),
            ctx.alloc::<half::bf16>(p.kv_len()).unwrap(),
            ctx.alloc::<half::bf16>(p.kv_len()).unwrap(),
        );
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let plan = ctx.plan_backward(&p).unwrap();
        let s_ = ctx.stream().clone();
        let ptrs = flashcore::attention::backward::BackwardPtrs {
            q: q.device_ptr(&s_).0,
            k: k.device_ptr(&s_).0,
            v: v.device_ptr(&s_).0,
            o: o.device_ptr(&s_).0,
            lse: lse.device_ptr(&s_).0,
            d_o: d_o.device_ptr(&s_).0,
            dq: dq.device_ptr_mut(&s_).0,
            dk: dk.device_ptr_mut(&s_).0,
            dv: dv.device_ptr_mut(&s_).0,
            sinks: 0,
            dsink: 0,
        };
        // Median of 10 synchronised launches (after 2 warm-ups) of the chosen kernels.
        let time = |which: [bool; 3]| {
            let mut times = Vec::new();
            for i in 0..12 {
                ctx.synchronize().unwrap();
                let t = std::time::Instant::now();
                // SAFETY: the buffers above have the plan's shape and outlive the synchronisation.
                unsafe { plan.launch_kernels(&ptrs, which).unwrap() };
                ctx.synchronize().unwrap();
                if i >= 2 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            times[times.len() / 2]
        };
        let t = time([true; 3]);
        let (pre, dkdv, dq) = (
            time([true, false, false]),
            time([false, true, false]),
            time([false, false, true]),
        );
        let flops = 2.5 * p.flops();
        eprintln!(
            "BENCH bwd {b},{h},{s},{d}{}: {:.3} ms, {:.0} TFLOPS (preprocess {:.3} ms, dK/dV {:.3} ms, dQ {:.3} ms)",
            if causal { " causal" } else { "" },
            t * 1e3,
            flops / t / 1e12,
            pre * 1e3,
            dkdv * 1e3,
            dq * 1e3
        );
    }
}

/// The external entry point (caller's stream and workspace, strided Q): the same bits as
/// `Context::attention_backward` on a contiguous copy of Q.
#[test]
fn external_backward_with_strided_q_matches_the_context_bits() {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    use flashcore::attention::backward::workspace_bytes;
    use flashcore::attention::backward_external::ExternalBackwardCall;
    use flashcore::attention::external::{DeviceTensor, ExternalContext, Strides};
    if gpu("external_backward_with_strided_q_matches_the_context_bits").is_none() {
        return;
    }
    let ext = ExternalContext::new(0).unwrap();
    let ctx = ext.context();
    let mut rng = rng_from(seed());
    let mut p = AttentionParams::new(2, 4, 300, 64)
        .seqlen_k(200)
        .causal(true)
        .dtype(DType::Bf16);
    p.heads_kv = 2;
    let (s, h, d) = (p.seqlen_q, p.heads_q, p.head_dim);
    let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let k: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let v: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let d_o: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let want = backward(ctx, &p, &q, &k, &v, &d_o);
    // Q as the first half of a [B, S, 2, H, D] buffer (seq stride 2·H·D), the rest garbage.
    let mut wide: Vec<half::bf16> = randn(&mut rng, 2 * p.q_len());
    for (row, chunk) in q.chunks(h * d).enumerate() {
        wide[row * 2 * h * d..row * 2 * h * d + h * d].copy_from_slice(chunk);
    }
    let up = |x: &[half::bf16]| ctx.upload(x).unwrap();
    let (qw, kd, vd, ddo, qc) = (up(&wide), up(&k), up(&v), up(&d_o), up(&q));
    let mut o = ctx.alloc::<half::bf16>(p.q_len()).unwrap();
    let mut lse = ctx.alloc::<f32>(p.lse_len()).unwrap();
    ctx.attention(&p, &qc, &kd, &vd, &mut o, Some(&mut lse))
        .unwrap();
    let mut dq = up(&vec![poison::<half::bf16>(); p.q_len()]);
    let mut dk = up(&vec![poison::<half::bf16>(); p.kv_len()]);
    let mut dv = up(&vec![poison::<half::bf16>(); p.kv_len()]);
    let mut ws = ctx.alloc::<u8>(workspace_bytes(&p)).unwrap();
    let st = ctx.stream().clone();
    let kv = Strides::contiguous(p.layout, p.seqlen_k, p.heads_kv, d);
    let call = ExternalBackwardCall {
        params: p.clone(),
        q: DeviceTensor {
            ptr: qw.device_ptr(&st).0,
            strides: Strides {
                batch: (s * 2 * h * d) as i64,
                seq: (2 * h * d) as i64,
                head: d as i64,
            },
        },
        k: DeviceTensor {
            ptr: kd.device_ptr(&st).0,
            strides: kv,
        },
        v: DeviceTensor {
            ptr: vd.device_ptr(&st).0,
            strides: kv,
        },
        o: o.device_ptr(&st).0,
        lse: lse.device_ptr(&st).0,
        d_o: ddo.device_ptr(&st).0,
        dq: dq.device_ptr_mut(&st).0,
        dk: dk.device_ptr_mut(&st).0,
        dv: dv.device_ptr_mut(&st).0,
        workspace: ws.device_ptr_mut(&st).0,
        sinks: 0,
        dsink: 0,
    };
    // SAFETY: every buffer above is live, sized for its shape and strides, and outlives the
    // synchronisation below.
    unsafe { ext.attention_backward(&call, st.cu_stream()).unwrap() };
    ctx.synchronize().unwrap();
    let got_dq: Vec<half::bf16> = ctx.download(&dq).unwrap();
    let got_dk: Vec<half::bf16> = ctx.download(&dk).unwrap();
    let got_dv: Vec<half::bf16> = ctx.download(&dv).unwrap();
    assert!(
        same_bits(&got_dq, &want.dq),
        "dq differs from the Context path"
    );
    assert!(
        same_bits(&got_dk, &want.dk),
        "dk differs from the Context path"
    );
    assert!(
        same_bits(&got_dv, &want.dv),
        "dv differs from the Context path"
    );
}
