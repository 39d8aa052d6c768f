//! GPU: the forward kernel as a programmatic dependent launch. A kernel
//! that writes Q, K and V runs just before the attention in the same stream; the attention must
//! see its writes. Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.
//!
//! Why these tests can fail: the attention is launched with programmatic stream serialization,
//! so it may be scheduled as soon as every CTA of the kernel before it has executed
//! `griddepcontrol.launch_dependents` — which the producer here does first, before spinning for
//! 2 ms and only then copying the inputs into place (an eager GEMM epilogue behaves the same
//! way), and which a flashcore forward does right after its own wait. Q, K and V (or the first
//! call's O) hold NaN until then. Only the attention's `griddepcontrol.wait` before its first
//! global read keeps it from loading that NaN, which would reach every output row.

mod common;
use common::*;
use cudarc::driver::{sys, CudaFunction, CudaSlice, DevicePtr};
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::reference;

/// Waits `ns` nanoseconds after letting its dependents launch, then copies three buffers.
const PRODUCER: &str = r#"
extern "C" __global__ void pdl_producer(const unsigned short* s0, unsigned short* d0, unsigned long long n0,
                                        const unsigned short* s1, unsigned short* d1, unsigned long long n1,
                                        const unsigned short* s2, unsigned short* d2, unsigned long long n2,
                                        unsigned long long ns) {
    asm volatile("griddepcontrol.launch_dependents;");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n0; i += step) d0[i] = s0[i];
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n1; i += step) d1[i] = s1[i];
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += step) d2[i] = s2[i];
}
"#;

const SPIN_NS: u64 = 2_000_000;

fn producer(ctx: &Context) -> CudaFunction {
    let cubin = flashcore::jit::compile_cached(
        "pdl_producer",
        PRODUCER,
        &[],
        &flashcore::jit::base_options(),
    )
    .expect("compile the producer");
    let module = ctx
        .cuda()
        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
        .expect("load the producer");
    module
        .load_function("pdl_producer")
        .expect("producer symbol")
}

/// Enqueues the producer: `dst[i] ← src[i]` for the three pairs, after the wait.
fn launch_producer<T: Element>(
    ctx: &Context,
    f: &CudaFunction,
    pairs: [(&CudaSlice<T>, &CudaSlice<T>); 3],
) {
    let s = ctx.stream();
    let mut vals: Vec<u64> = Vec::new();
    for (src, dst) in pairs {
        vals.push(src.device_ptr(s).0);
        vals.push(dst.device_ptr(s).0);
        vals.push(src.len() as u64);
    }
    vals.push(SPIN_NS);
    let mut args: Vec<*mut std::ffi::c_void> = vals
        .iter_mut()
        .map(|v| v as *mut u64 as *mut std::ffi::c_void)
        .collect();
    unsafe {
        cudarc::driver::result::launch_kernel(
            f.cu_function(),
            (8, 1, 1),
            (256, 1, 1),
            0,
            s.cu_stream(),
            &mut args,
        )
        .expect("launch the producer");
    }
}

/// O and LSE against the f64 reference (NaN rejected, fully masked rows' LSE exactly −inf).
fn check<T: Element>(
    p: &AttentionParams,
    [q, k, v]: [&[T]; 3],
    out: &[T],
    lse: &[f32],
) -> Result<(), String> {
    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let want = reference::attention_f64(p, &f(q), &f(k), &f(v));
    let got = f(out);
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!("{p:?}: non-finite output at {i}: {}", got[i]));
    }
    let err = reference::rel_l2(&got, &want.out);
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(err <= tolerance(p.dtype)) {
        return Err(format!("{p:?}: output relative L2 error {err:.3e}"));
    }
    let (mut g, mut w) = (Vec::new(), Vec::new());
    for (i, (&a, &b)) in lse.iter().zip(&want.lse).enumerate() {
        if b == f64::NEG_INFINITY {
            if a != f32::NEG_INFINITY {
                return Err(format!("{p:?}: lse[{i}] = {a}, want -inf"));
            }
        } else {
            g.push(a as f64);
            w.push(b);
        }
    }
    let lerr = if w.is_empty() {
        0.0
    } else {
        reference::rel_l2(&g, &w)
    };
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(lerr <= 1e-3) {
        return Err(format!("{p:?}: LSE relative L2 error {lerr:.3e}"));
    }
    eprintln!("ok {p:?}: err {err:.2e} lse {lerr:.2e}");
    Ok(())
}

/// The producer writes Q, K, V; the attention reads them, eagerly (`graph` false) or replayed
/// from a captured graph, where the launch attribute becomes a programmatic edge.
fn producer_case<T: Element>(
    ctx: &Context,
    f: &CudaFunction,
    p: &AttentionParams,
    rng: &mut impl rand::Rng,
    graph: bool,
) -> Result<(), String> {
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    let (sq, sk, sv) = upload_qkv(ctx, &q, &k, &v);
    let nan_q = vec![poison::<T>(); p.q_len()];
    let nan_kv = vec![poison::<T>(); p.kv_len()];
    let (mut dq, mut dk, mut dv) = upload_qkv(ctx, &nan_q, &nan_kv, &nan_kv);
    let mut out = ctx.upload(&vec![poison::<T>(); p.q_len()]).unwrap();
    let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    // Compile and load the attention's kernel now, so nothing but the launch follows the
    // producer (the output is poisoned again below).
    let mut o0 = ctx.alloc::<T>(p.q_len()).unwrap();
    ctx.attention(p, &sq, &sk, &sv, &mut o0, None)
        .map_err(|e| e.to_string())?;
    ctx.synchronize().unwrap();
    ctx.copy_to_device(&vec![poison::<T>(); p.q_len()], &mut out)
        .unwrap();
    let s = ctx.stream().clone();
    if graph {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .unwrap();
        launch_producer(ctx, f, [(&sq, &dq), (&sk, &dk), (&sv, &dv)]);
        let r = ctx.attention(p, &dq, &dk, &dv, &mut out, Some(&mut lse));
        let g = s.end_capture(sys::CUgraphInstantiate_flags(0)).unwrap();
        r.map_err(|e| e.to_string())?;
        let g = g.expect("a captured graph");
        // Replayed twice, the inputs poisoned before each replay.
        for _ in 0..2 {
            ctx.copy_to_device(&nan_q, &mut dq).unwrap();
            ctx.copy_to_device(&nan_kv, &mut dk).unwrap();
            ctx.copy_to_device(&nan_kv, &mut dv).unwrap();
            ctx.copy_to_device(&vec![poison::<T>(); p.q_len()], &mut out)
                .unwrap();
            ctx.synchronize().unwrap();
            g.launch().unwrap();
            ctx.synchronize().unwrap();
            check(
                p,
                [&q, &k, &v],
                &ctx.download(&out).unwrap(),
                &ctx.download(&lse).unwrap(),
            )?;
        }
        Ok(())
    } else {
        launch_producer(ctx, f, [(&sq, &dq), (&sk, &dk), (&sv, &dv)]);
        ctx.attention(p, &dq, &dk, &dv, &mut out, Some(&mut lse))
            .map_err(|e| e.to_string())?;
        ctx.synchronize().unwrap();
        check(
            p,
            [&q, &k, &v],
            &ctx.download(&out).unwrap(),
            &ctx.download(&lse).unwrap(),
        )
    }
}

fn shapes(dtype: DType) -> Vec<AttentionParams> {
    let mut out = Vec::new();
    for (b, h, sq, sk, d, causal) in [
        (1, 8, 512, 512, 64, false), // the latency shape: 64-row tiles
        (1, 4, 1000, 1000, 64, true),
        (2, 3, 17, 300, 128, false),
        (1, 2, 300, 77, 128, true), // Sq > Sk: fully masked rows
        (1, 2, 129, 700, 256, true),
    ] {
        out.push(
            AttentionParams::new(b, h, sq, d)
                .seqlen_k(sk)
                .dtype(dtype)
                .causal(causal),
        );
    }
    out
}

fn producer_test<T: Element>(name: &str, dtype: DType, graph: bool) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let f = producer(&ctx);
    let s = seed();
    let mut rng = rng_from(s);
    let failures: Vec<String> = shapes(dtype)
        .iter()
        .filter_map(|p| producer_case::<T>(&ctx, &f, p, &mut rng, graph).err())
        .collect();
    assert_no_failures(s, &failures);
}

#[test]
fn f16_attention_sees_a_producers_writes() {
    producer_test::<half::f16>("f16_attention_sees_a_producers_writes", DType::F16, false);
}

#[test]
fn bf16_attention_sees_a_producers_writes() {
    producer_test::<half::bf16>("bf16_attention_sees_a_producers_writes", DType::Bf16, false);
}

#[test]
fn f16_attention_sees_a_producers_writes_in_a_graph() {
    producer_test::<half::f16>(
        "f16_attention_sees_a_producers_writes_in_a_graph",
        DType::F16,
        true,
    );
}

#[test]
fn bf16_attention_sees_a_producers_writes_in_a_graph() {
    producer_test::<half::bf16>(
        "bf16_attention_sees_a_producers_writes_in_a_graph",
        DType::Bf16,
        true,
    );
}

/// Two flashcore calls back to back, the second reading the first's O as its Q: the first is
/// long (32k keys over 4 CTAs, a few hundred µs) and signals its dependents at its start, so
/// the second is scheduled long before the first's O exists.
#[test]
fn a_second_call_reads_the_first_calls_output() {
    let Some(ctx) = gpu("a_second_call_reads_the_first_calls_output") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    type T = half::f16;
    let p1 = AttentionParams::new(1, 2, 128, 64)
        .seqlen_k(32768)
        .dtype(DType::F16);
    let p2 = AttentionParams::new(1, 2, 128, 64)
        .seqlen_k(300)
        .dtype(DType::F16)
        .causal(true);
    let q1: Vec<T> = randn(&mut rng, p1.q_len());
    let k1: Vec<T> = randn(&mut rng, p1.kv_len());
    let v1: Vec<T> = randn(&mut rng, p1.kv_len());
    let k2: Vec<T> = randn(&mut rng, p2.kv_len());
    let v2: Vec<T> = randn(&mut rng, p2.kv_len());
    let (dq1, dk1, dv1) = upload_qkv(&ctx, &q1, &k1, &v1);
    let (dk2, dv2) = (ctx.upload(&k2).unwrap(), ctx.upload(&v2).unwrap());
    let mut o1 = ctx.upload(&vec![poison::<T>(); p1.q_len()]).unwrap();
    let mut l1 = ctx.upload(&vec![f32::NAN; p1.lse_len()]).unwrap();
    let mut o2 = ctx.upload(&vec![poison::<T>(); p2.q_len()]).unwrap();
    let mut l2 = ctx.upload(&vec![f32::NAN; p2.lse_len()]).unwrap();
    // Both kernels compiled and loaded before the timed pair (their outputs poisoned again).
    ctx.attention(&p1, &dq1, &dk1, &dv1, &mut o1, None).unwrap();
    ctx.attention(&p2, &dq1, &dk2, &dv2, &mut o2, None).unwrap();
    ctx.synchronize().unwrap();
    ctx.copy_to_device(&vec![poison::<T>(); p1.q_len()], &mut o1)
        .unwrap();
    ctx.copy_to_device(&vec![poison::<T>(); p2.q_len()], &mut o2)
        .unwrap();
    ctx.synchronize().unwrap();
    ctx.attention(&p1, &dq1, &dk1, &dv1, &mut o1, Some(&mut l1))
        .unwrap();
    ctx.attention(&p2, &o1, &dk2, &dv2, &mut o2, Some(&mut l2))
        .unwrap();
    ctx.synchronize().unwrap();
    let out1: Vec<T> = ctx.download(&o1).unwrap();
    let r1 = check(&p1, [&q1, &k1, &v1], &out1, &ctx.download(&l1).unwrap());
    let r2 = check(
        &p2,
        [&out1, &k2, &v2],
        &ctx.download(&o2).unwrap(),
        &ctx.download(&l2).unwrap(),
    );
    assert!(r1.is_ok() && r2.is_ok(), "seed {s}: {r1:?} {r2:?}");
}
