//! Decode mode on the GPU (few query positions, long key ranges: GQA packing + split-KV +
//! combine): every element against the float64 reference at odd shapes, bitwise batch
//! invariance, bitwise run-to-run determinism. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use cudarc::driver::{DevicePtr, DevicePtrMut};
use flashcore::attention::decode::{self, DecodeSchedule};
use flashcore::attention::external::{DeviceTensor, ExternalCall, ExternalContext, Strides};
use flashcore::attention::launch::Lengths;
use flashcore::attention::{AttentionParams, Context, DType, Element, Layout};
use flashcore::kernels::Variant;

/// (batch, heads_q, heads_kv, seqlen_q, seqlen_k): GQA 4:1 and 8:1, MQA, MHA, a group that no
/// power of two > 1 divides (pack 1), Sk not a multiple of the block or split size, Sq > Sk.
const SHAPES: [(usize, usize, usize, usize, usize); 11] = [
    (1, 32, 8, 1, 8191),
    (2, 8, 1, 1, 3000),
    (3, 8, 1, 4, 1000),
    (2, 4, 4, 1, 17),
    (1, 6, 2, 3, 777),
    (2, 16, 2, 16, 129),
    (1, 8, 2, 4, 4097),
    (1, 4, 1, 16, 5),
    (2, 2, 1, 1, 1),
    (1, 64, 1, 2, 300),
    (1, 8, 8, 5, 20000),
];

fn params(
    dtype: DType,
    d: usize,
    causal: bool,
    layout: Layout,
    s: (usize, usize, usize, usize, usize),
) -> AttentionParams {
    let (b, hq, hkv, sq, sk) = s;
    let mut p = AttentionParams::new(b, hq, sq, d)
        .seqlen_k(sk)
        .dtype(dtype)
        .layout(layout)
        .causal(causal);
    p.heads_kv = hkv;
    p
}

fn sweep<T: Element>(ctx: &Context, dtype: DType, seed: u64, head_dims: &[usize]) -> Vec<String> {
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    for &d in head_dims {
        for causal in [false, true] {
            for (i, &shape) in SHAPES.iter().enumerate() {
                // Both layouts, alternating over the shapes (each layout sees every feature).
                let layout = if (i + causal as usize) % 2 == 0 {
                    Layout::Bshd
                } else {
                    Layout::Bhsd
                };
                let p = params(dtype, d, causal, layout, shape);
                assert!(
                    decode::variant_for(&p, Lengths::None).is_some(),
                    "{p:?} should run in decode mode"
                );
                let splits = DecodeSchedule::new(
                    &p,
                    &Variant::decode(dtype, d, causal).tile(),
                    132,
                    Lengths::None,
                )
                .unwrap()
                .num_splits;
                match run_case::<T>(ctx, &p, &mut rng) {
                    Ok(o) => eprintln!(
                        "ok {} d{d} {} {:?} splits {splits:3}  err {:.2e}  lse {:.2e}",
                        dtype.name(),
                        if causal { "causal" } else { "full  " },
                        shape,
                        o.out_err,
                        o.lse_err
                    ),
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    failures
}

fn sweep_test<T: Element>(name: &str, dtype: DType, head_dims: &[usize]) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let failures = sweep::<T>(&ctx, dtype, s, head_dims);
    assert_no_failures(s, &failures);
}

#[test]
fn decode_f16_matches_reference() {
    sweep_test::<half::f16>("decode_f16_matches_reference", DType::F16, &[64, 128]);
}

#[test]
fn decode_bf16_matches_reference() {
    sweep_test::<half::bf16>("decode_bf16_matches_reference", DType::Bf16, &[64, 128]);
}

/// Head dims 96 and 256 in decode mode (d256: two 64-key stages; the combine's rows of 24 and
/// 64 column quads).
#[test]
fn decode_head_dims_96_256_match_reference() {
    sweep_test::<half::f16>(
        "decode_head_dims_96_256_match_reference",
        DType::F16,
        &[96, 256],
    );
    sweep_test::<half::bf16>(
        "decode_head_dims_96_256_match_reference",
        DType::Bf16,
        &[96, 256],
    );
}

/// One sequence's output rows out of a batched [B, Sq, Hq, D] output.
fn rows_of<T: Copy>(out: &[T], p: &AttentionParams, b: usize) -> Vec<T> {
    let n = p.seqlen_q * p.heads_q * p.head_dim;
    out[b * n..(b + 1) * n].to_vec()
}

#[test]
fn decode_is_batch_invariant_and_deterministic() {
    let Some(ctx) = gpu("decode_is_batch_invariant_and_deterministic") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (sq, causal) in [(1, false), (4, true)] {
        let one = params(DType::Bf16, 128, causal, Layout::Bshd, (1, 32, 8, sq, 4099));
        let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let (alone, alone_lse) = launch_unchecked(&ctx, &one, &q, &k, &v);
        let (again, again_lse) = launch_unchecked(&ctx, &one, &q, &k, &v);
        assert_eq!(
            bits(&alone),
            bits(&again),
            "seed {s}: output bits differ run to run"
        );
        assert_eq!(
            alone_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "seed {s}: LSE bits differ run to run"
        );
        // The same sequence at another position of batches of 7 and 64, among random neighbours.
        for (batch, at) in [(7, 3), (64, 63)] {
            let (p, qb, kb, vb) = batch_around(&mut rng, &one, batch, at, &q, &k, &v);
            let (out, lse) = launch_unchecked(&ctx, &p, &qb, &kb, &vb);
            assert_eq!(
                bits(&rows_of(&out, &p, at)),
                bits(&alone),
                "seed {s}: sequence's output bits changed in a batch of {batch}"
            );
            let per = one.heads_q * one.seqlen_q;
            assert_eq!(
                lse[at * per..(at + 1) * per]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                alone_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "seed {s}: LSE bits changed in a batch of {batch}"
            );
        }
    }
}

/// The framework path: a split decode call needs the caller's workspace (a typed error before
/// any launch without one) and gives the bits of `Context::attention` with it.
#[test]
fn external_decode_needs_a_workspace_and_matches_context_bits() {
    let Some(ctx) = gpu("external_decode_needs_a_workspace_and_matches_context_bits") else {
        return;
    };
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    let mut rng = rng_from(seed());
    let p = params(DType::F16, 128, false, Layout::Bshd, (2, 16, 4, 1, 5000));
    let bytes = decode::workspace_bytes(&p, Lengths::None);
    assert!(bytes > 0, "5000 keys split");
    let q: Vec<half::f16> = randn(&mut rng, p.q_len());
    let k: Vec<half::f16> = randn(&mut rng, p.kv_len());
    let v: Vec<half::f16> = randn(&mut rng, p.kv_len());
    let (want, _) = launch_unchecked(&ctx, &p, &q, &k, &v);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&k).unwrap(),
        ctx.upload(&v).unwrap(),
    );
    let mut dout = ctx.upload(&vec![poison::<half::f16>(); p.q_len()]).unwrap();
    let ws = ctx.alloc::<u8>(bytes).unwrap();
    let stream = ctx.stream();
    let (qp, _g1) = dq.device_ptr(stream);
    let (kp, _g2) = dk.device_ptr(stream);
    let (vp, _g3) = dv.device_ptr(stream);
    let (wp, _g5) = ws.device_ptr(stream);
    let (op, _g4) = dout.device_ptr_mut(stream);
    let st = |s: usize, h: usize| Strides::contiguous(Layout::Bshd, s, h, p.head_dim);
    let t = |ptr, strides| DeviceTensor { ptr, strides };
    let call = ExternalCall::new(
        p.clone(),
        t(qp, st(p.seqlen_q, p.heads_q)),
        t(kp, st(p.seqlen_k, p.heads_kv)),
        t(vp, st(p.seqlen_k, p.heads_kv)),
        t(op, st(p.seqlen_q, p.heads_q)),
    );
    // SAFETY: the buffers cover the call's shape and live past the download below.
    match unsafe { ext.attention(&call, stream.cu_stream()) } {
        Err(flashcore::Error::InvalidArgument {
            arg: "workspace", ..
        }) => {}
        other => panic!("expected InvalidArgument for workspace, got {other:?}"),
    }
    unsafe { ext.attention(&call.clone().workspace(wp), stream.cu_stream()) }.unwrap();
    drop((_g1, _g2, _g3, _g4, _g5));
    let got = ctx.download(&dout).unwrap();
    assert_eq!(
        bits(&got),
        bits(&want),
        "external decode differs from Context::attention"
    );
}

/// A Rust-API plan captured into a CUDA graph replays (its workspace is allocated with the plan,
/// not inside the capture, where it would become a node that forbids a second launch), with the
/// bits of a direct launch.
#[test]
fn decode_plan_replays_in_a_cuda_graph() {
    let Some(ctx) = gpu("decode_plan_replays_in_a_cuda_graph") else {
        return;
    };
    use cudarc::driver::sys;
    let mut rng = rng_from(seed());
    let p = params(DType::Bf16, 64, true, Layout::Bshd, (1, 16, 16, 2, 9000));
    assert!(decode::workspace_bytes(&p, Lengths::None) > 0);
    let q: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let k: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let v: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let (want, _) = launch_unchecked(&ctx, &p, &q, &k, &v);
    let plan = ctx.plan(&p).unwrap();
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&k).unwrap(),
        ctx.upload(&v).unwrap(),
    );
    let mut dout = ctx
        .upload(&vec![poison::<half::bf16>(); p.q_len()])
        .unwrap();
    let stream = ctx.stream();
    {
        let (qp, _g1) = dq.device_ptr(stream);
        let (kp, _g2) = dk.device_ptr(stream);
        let (vp, _g3) = dv.device_ptr(stream);
        let (op, _g4) = dout.device_ptr_mut(stream);
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        // SAFETY: buffers of the plan's shape, alive until the replays below are synchronised.
        unsafe { plan.launch_raw(qp, kp, vp, op, 0) }.unwrap();
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("a captured graph");
        for _ in 0..3 {
            graph.launch().unwrap();
        }
        stream.synchronize().unwrap();
    }
    let got = ctx.download(&dout).unwrap();
    assert_eq!(
        bits(&got),
        bits(&want),
        "graph replay differs from a direct launch"
    );
}
