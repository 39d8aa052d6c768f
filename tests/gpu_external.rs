//! The caller-owned-memory API (`attention::external`) on the GPU: strided inputs and outputs
//! give the same bits as contiguous ones, and padding around a strided output is never written.

mod common;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use flashcore::attention::external::{DeviceTensor, ExternalCall, ExternalContext, Strides};
use flashcore::attention::{AttentionParams, Layout};
use half::f16;

/// Copies a contiguous bshd tensor into rows of `d + pad` elements (padding set to `fill`).
fn padded(x: &[f16], rows: usize, d: usize, pad: usize, fill: f16) -> Vec<f16> {
    let mut out = vec![fill; rows * (d + pad)];
    for r in 0..rows {
        out[r * (d + pad)..r * (d + pad) + d].copy_from_slice(&x[r * d..(r + 1) * d]);
    }
    out
}

#[test]
fn strided_inputs_and_output_match_contiguous_bits() {
    let Some(ctx) = common::gpu("strided_inputs_and_output_match_contiguous_bits") else {
        return;
    };
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    let seed = common::seed();
    eprintln!("seed {seed}");
    let mut rng = common::rng_from(seed);
    for causal in [false, true] {
        let p = AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 4, 100, 64)
                .seqlen_k(130)
                .causal(causal)
        };
        let (q, k, v): (Vec<f16>, Vec<f16>, Vec<f16>) = (
            common::randn(&mut rng, p.q_len()),
            common::randn(&mut rng, p.kv_len()),
            common::randn(&mut rng, p.kv_len()),
        );
        let (want, _) = common::launch_unchecked(&ctx, &p, &q, &k, &v);

        // Every row padded by 64 elements of NaN: read through strides, never touched.
        let (d, pad) = (p.head_dim, 64);
        let nan = common::poison::<f16>();
        let q_rows = p.batch * p.seqlen_q * p.heads_q;
        let kv_rows = p.batch * p.seqlen_k * p.heads_kv;
        let dq = ctx.upload(&padded(&q, q_rows, d, pad, nan)).unwrap();
        let dk = ctx.upload(&padded(&k, kv_rows, d, pad, nan)).unwrap();
        let dv = ctx.upload(&padded(&v, kv_rows, d, pad, nan)).unwrap();
        let mut dout = ctx.upload(&vec![nan; q_rows * (d + pad)]).unwrap();
        let st = |s: usize, h: usize| Strides {
            batch: (s * h * (d + pad)) as i64,
            seq: (h * (d + pad)) as i64,
            head: (d + pad) as i64,
        };
        let stream = ctx.stream();
        let (qp, _g1) = dq.device_ptr(stream);
        let (kp, _g2) = dk.device_ptr(stream);
        let (vp, _g3) = dv.device_ptr(stream);
        let (op, _g4) = dout.device_ptr_mut(stream);
        let t = |ptr, strides| DeviceTensor { ptr, strides };
        let call = ExternalCall::new(
            p.clone(),
            t(qp, st(p.seqlen_q, p.heads_q)),
            t(kp, st(p.seqlen_k, p.heads_kv)),
            t(vp, st(p.seqlen_k, p.heads_kv)),
            t(op, st(p.seqlen_q, p.heads_q)),
        );
        // SAFETY: the buffers cover every element the strides reach and live past the sync.
        unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
        drop((_g1, _g2, _g3, _g4));
        let got = ctx.download(&dout).unwrap();
        for r in 0..q_rows {
            let row = &got[r * (d + pad)..(r + 1) * (d + pad)];
            let want_row = &want[r * d..(r + 1) * d];
            assert!(
                row[..d]
                    .iter()
                    .zip(want_row)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "causal={causal}: row {r} differs from the contiguous launch"
            );
            assert!(
                row[d..].iter().all(|x| x.to_bits() == nan.to_bits()),
                "causal={causal}: padding of row {r} was written"
            );
        }
    }
}

#[test]
fn contiguous_external_call_matches_context_attention() {
    let Some(ctx) = common::gpu("contiguous_external_call_matches_context_attention") else {
        return;
    };
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    let mut rng = common::rng_from(common::seed());
    let p = AttentionParams::new(1, 8, 512, 128).layout(Layout::Bhsd);
    let (q, k, v): (Vec<f16>, Vec<f16>, Vec<f16>) = (
        common::randn(&mut rng, p.q_len()),
        common::randn(&mut rng, p.kv_len()),
        common::randn(&mut rng, p.kv_len()),
    );
    let (want, want_lse) = common::launch_unchecked(&ctx, &p, &q, &k, &v);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&k).unwrap(),
        ctx.upload(&v).unwrap(),
    );
    let mut dout = ctx.alloc::<f16>(p.q_len()).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    let s = Strides::contiguous(Layout::Bhsd, 512, 8, 128);
    let stream = ctx.stream();
    let (qp, _g1) = dq.device_ptr(stream);
    let (kp, _g2) = dk.device_ptr(stream);
    let (vp, _g3) = dv.device_ptr(stream);
    let (op, _g4) = dout.device_ptr_mut(stream);
    let (lp, _g5) = dlse.device_ptr_mut(stream);
    let t = |ptr| DeviceTensor { ptr, strides: s };
    let call = ExternalCall::new(p.clone(), t(qp), t(kp), t(vp), t(op)).lse(lp);
    // SAFETY: contiguous buffers of the call's shape, alive past the sync below.
    unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
    drop((_g1, _g2, _g3, _g4, _g5));
    let got = ctx.download(&dout).unwrap();
    let got_lse = ctx.download(&dlse).unwrap();
    assert!(got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(got_lse
        .iter()
        .zip(&want_lse)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn invalid_call_is_rejected_before_launch() {
    let Some(_ctx) = common::gpu("invalid_call_is_rejected_before_launch") else {
        return;
    };
    let ext = ExternalContext::new(0).unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let s = Strides::contiguous(Layout::Bshd, 8, 2, 64);
    let t = |ptr| DeviceTensor { ptr, strides: s };
    // Misaligned q: the typed error comes from validation; nothing is launched.
    let call = ExternalCall::new(p, t(0x1008), t(0x2000), t(0x3000), t(0x4000));
    // SAFETY: validation rejects the call before any pointer is used.
    let err = unsafe { ext.attention(&call, std::ptr::null_mut()) }.unwrap_err();
    assert!(err.to_string().contains("`q`"), "{err}");
}

/// Creating an external context, preparing a shape and launching leave the thread's current
/// CUDA context as the caller had it (none here): the CUDA runtime — torch — reads its current
/// device from it (found on a 2-GPU machine: a call on cuda:1 left device 1 current).
#[test]
fn the_callers_current_context_is_left_alone() {
    use cudarc::driver::result::ctx;
    let Some(own) = common::gpu("the_callers_current_context_is_left_alone") else {
        return;
    };
    let p = AttentionParams::new(1, 2, 64, 64);
    let (dq, mut dout) = (
        own.upload(&vec![f16::from_f32(0.5); p.q_len()]).unwrap(),
        own.alloc::<f16>(p.q_len()).unwrap(),
    );
    own.synchronize().unwrap();
    // SAFETY: null unbinds the thread's context.
    unsafe { ctx::set_current(std::ptr::null_mut()) }.unwrap();
    let ext = ExternalContext::new(0).expect("a GPU that Context::new accepts");
    assert_eq!(
        ctx::get_current().unwrap(),
        None,
        "ExternalContext::new bound a context"
    );
    ext.prepare(&p, false).unwrap();
    assert_eq!(ctx::get_current().unwrap(), None, "prepare bound a context");
    let s = Strides::contiguous(Layout::Bshd, 64, 2, 64);
    {
        let stream = own.stream();
        let (qp, _g1) = dq.device_ptr(stream);
        let (op, _g2) = dout.device_ptr_mut(stream);
        // cudarc's pointer access binds its own context: unbind again before the call.
        unsafe { ctx::set_current(std::ptr::null_mut()) }.unwrap();
        let t = |ptr| DeviceTensor { ptr, strides: s };
        let call = ExternalCall::new(p.clone(), t(qp), t(qp), t(qp), t(op));
        // SAFETY: buffers of the call's shape on device 0, alive past the sync below.
        unsafe { ext.attention(&call, stream.cu_stream()) }.unwrap();
        assert_eq!(
            ctx::get_current().unwrap(),
            None,
            "attention bound a context"
        );
    }
    own.synchronize().unwrap();
    let out = own.download(&dout).unwrap();
    assert!(
        out.iter().all(|x| (x.to_f32() - 0.5).abs() < 1e-3),
        "attention of constant V"
    );
}
