//! Shared by the test files: device acquisition that skips visibly (or fails under
//! FLASHCORE_REQUIRE_GPU=1), random inputs, poisoned outputs, checks against the f64 reference,
//! and running the `flashcore` binary.
#![allow(dead_code)]

use cudarc::driver::CudaSlice;
use flashcore::attention::{AttentionParams, Context, DType, Element};
use flashcore::reference;
use rand::{Rng, SeedableRng};

/// The GPU context, or `None` after printing why the test is skipped.
pub fn gpu(test: &str) -> Option<Context> {
    match Context::new(0) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("FLASHCORE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("{test}: FLASHCORE_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            // Written to the stderr stream itself, past libtest's capture, so that it shows.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: no usable GPU ({e}); set FLASHCORE_REQUIRE_GPU=1 to make this a failure"
            );
            None
        }
    }
}

/// A fresh seed per call (printed, so a failure can be replayed with FLASHCORE_SEED).
pub fn seed() -> u64 {
    if let Ok(s) = std::env::var("FLASHCORE_SEED") {
        return s.parse().expect("FLASHCORE_SEED must be an integer");
    }
    rand::rng().random()
}

/// Fails with every case's message and the seed that replays them, unless `failures` is empty.
pub fn assert_no_failures(seed: u64, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "seed {seed}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `one`'s shape with `batch` sequences: random inputs, except that sequence `at` holds `q`, `k`,
/// `v` (a sequence's elements are contiguous in the batch-major layouts these tests use). For the
/// batch-invariance checks: that sequence's output bits must match `one`'s.
pub fn batch_around<T: Element>(
    rng: &mut impl Rng,
    one: &AttentionParams,
    batch: usize,
    at: usize,
    q: &[T],
    k: &[T],
    v: &[T],
) -> (AttentionParams, Vec<T>, Vec<T>, Vec<T>) {
    let p = AttentionParams {
        batch,
        ..one.clone()
    };
    let mut qs: Vec<T> = randn(rng, p.q_len());
    let mut ks: Vec<T> = randn(rng, p.kv_len());
    let mut vs: Vec<T> = randn(rng, p.kv_len());
    qs[at * q.len()..(at + 1) * q.len()].copy_from_slice(q);
    ks[at * k.len()..(at + 1) * k.len()].copy_from_slice(k);
    vs[at * v.len()..(at + 1) * v.len()].copy_from_slice(v);
    (p, qs, ks, vs)
}

/// Standard-normal values (Box–Muller), rounded to the element type.
pub fn randn<T: Element>(rng: &mut impl Rng, n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(1e-300);
            let u2: f64 = rng.random();
            T::from_f64((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos())
        })
        .collect()
}

/// NaN in the element type: written over outputs before a launch so unwritten elements show.
pub fn poison<T: Element>() -> T {
    T::from_f64(f64::NAN)
}

pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

pub struct Outcome<T> {
    pub out: Vec<T>,
    pub lse: Vec<f32>,
    pub out_err: f64,
    pub lse_err: f64,
}

/// Runs one case on the GPU with fresh random inputs and checks O and LSE against the reference.
pub fn run_case<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    rng: &mut impl Rng,
) -> Result<Outcome<T>, String> {
    let q: Vec<T> = randn(rng, p.q_len());
    let k: Vec<T> = randn(rng, p.kv_len());
    let v: Vec<T> = randn(rng, p.kv_len());
    run_inputs(ctx, p, &q, &k, &v)
}

/// Q, K and V copied to the device (panics on a device error).
pub fn upload_qkv<T: Element>(
    ctx: &Context,
    q: &[T],
    k: &[T],
    v: &[T],
) -> (CudaSlice<T>, CudaSlice<T>, CudaSlice<T>) {
    (
        ctx.upload(q).unwrap(),
        ctx.upload(k).unwrap(),
        ctx.upload(v).unwrap(),
    )
}

/// Runs once on the given inputs (poisoned outputs) and returns O and LSE, unchecked.
pub fn launch_unchecked<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
) -> (Vec<T>, Vec<f32>) {
    let (dq, dk, dv) = upload_qkv(ctx, q, k, v);
    let mut dout = ctx.upload(&vec![poison::<T>(); p.q_len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    ctx.attention(p, &dq, &dk, &dv, &mut dout, Some(&mut dlse))
        .unwrap();
    (ctx.download(&dout).unwrap(), ctx.download(&dlse).unwrap())
}

pub fn run_inputs<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<Outcome<T>, String> {
    let e = |e: flashcore::Error| format!("{p:?}: {e}");
    let (dq, dk, dv) = (
        ctx.upload(q).map_err(e)?,
        ctx.upload(k).map_err(e)?,
        ctx.upload(v).map_err(e)?,
    );
    let mut dout = ctx.upload(&vec![poison::<T>(); p.q_len()]).map_err(e)?;
    let mut dlse = ctx.upload(&vec![f32::NAN; p.lse_len()]).map_err(e)?;
    ctx.attention(p, &dq, &dk, &dv, &mut dout, Some(&mut dlse))
        .map_err(e)?;
    let out: Vec<T> = ctx.download(&dout).map_err(e)?;
    let lse: Vec<f32> = ctx.download(&dlse).map_err(e)?;

    let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let want = reference::attention_f64(p, &f(q), &f(k), &f(v));
    let got = f(&out);
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "{p:?}: non-finite output at element {i}: {}",
            got[i]
        ));
    }
    let out_err = reference::rel_l2(&got, &want.out);
    // LSE: fully masked rows must be exactly −inf; the rest compared by relative L2.
    let mut got_l = Vec::new();
    let mut want_l = Vec::new();
    for (i, (&g, &w)) in lse.iter().zip(&want.lse).enumerate() {
        if w == f64::NEG_INFINITY {
            if g != f32::NEG_INFINITY {
                return Err(format!(
                    "{p:?}: lse[{i}] = {g}, fully masked row must give -inf"
                ));
            }
        } else {
            if !g.is_finite() {
                return Err(format!("{p:?}: lse[{i}] = {g} (want {w})"));
            }
            got_l.push(g as f64);
            want_l.push(w);
        }
    }
    let lse_err = if want_l.is_empty() {
        0.0
    } else {
        reference::rel_l2(&got_l, &want_l)
    };
    let tol = tolerance(p.dtype);
    // `!(err <= tol)` on purpose: a NaN error must fail, and `err > tol` would let it pass.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(out_err <= tol) {
        return Err(format!(
            "{p:?}: output relative L2 error {out_err:.3e} > {tol:.0e}"
        ));
    }
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(lse_err <= 1e-3) {
        return Err(format!("{p:?}: LSE relative L2 error {lse_err:.3e} > 1e-3"));
    }
    Ok(Outcome {
        out,
        lse,
        out_err,
        lse_err,
    })
}

pub fn rng_from(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Runs the `flashcore` binary with `args`: (exit code, stdout, stderr).
pub fn flashcore(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashcore"))
        .args(args)
        .output()
        .expect("run flashcore");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One `flashcore attn` run's exit code and output.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `flashcore attn` with `args`, asserting it did not panic. `FLASHCORE_BIN` overrides the
/// binary (for running a test binary on a machine where the build directory does not exist).
pub fn flashcore_attn(args: &[&str]) -> Run {
    let bin = std::env::var("FLASHCORE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_flashcore").to_string());
    let o = std::process::Command::new(bin)
        .arg("attn")
        .args(args)
        .output()
        .expect("spawn flashcore");
    let run = Run {
        code: o.status.code().expect("flashcore killed by a signal"),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "flashcore panicked:\n{}",
        run.stderr
    );
    run
}

/// `n` values uniform in [-2, 2) as a file tensor's data of `dtype`.
pub fn randn_data(r: &mut impl Rng, n: usize, dtype: DType) -> flashcore::tensor_io::TensorData {
    use flashcore::tensor_io::TensorData;
    let x = (0..n).map(|_| r.random_range(-2.0f32..2.0));
    match dtype {
        DType::F16 => TensorData::F16(x.map(half::f16::from_f32).collect()),
        DType::Bf16 => TensorData::Bf16(x.map(half::bf16::from_f32).collect()),
    }
}

/// The exact bits of a result, element by element (for bitwise comparisons).
pub fn bits<T: Element>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

/// The gradients of one backward call, downloaded (dsink empty without sinks), and the
/// forward's O and LSE the backward read.
pub struct Grads<T> {
    pub dq: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
    pub dsink: Vec<f32>,
    pub o: Vec<T>,
    pub lse: Vec<f32>,
}

/// Forward (for O and LSE) then backward on the given inputs, every output poisoned first.
pub fn backward<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    d_o: &[T],
) -> Grads<T> {
    backward_with_sinks(ctx, p, [q, k, v, d_o], None)
}

/// [`backward`], with learnable sinks in the forward and the backward when given (dsink then
/// downloaded).
pub fn backward_with_sinks<T: Element>(
    ctx: &Context,
    p: &AttentionParams,
    [q, k, v, d_o]: [&[T]; 4],
    sinks: Option<&[f32]>,
) -> Grads<T> {
    let up = |x: &[T]| ctx.upload(x).unwrap();
    let (q_, k_, v_, do_) = (up(q), up(k), up(v), up(d_o));
    let mut o = up(&vec![poison::<T>(); p.q_len()]);
    let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
    let sinks_ = sinks.map(|s| ctx.upload(s).unwrap());
    match &sinks_ {
        Some(s) => ctx.attention_with_sinks(p, &q_, &k_, &v_, &mut o, Some(&mut lse), s),
        None => ctx.attention(p, &q_, &k_, &v_, &mut o, Some(&mut lse)),
    }
    .unwrap_or_else(|e| panic!("{p:?}: forward: {e}"));
    let mut gq = up(&vec![poison::<T>(); p.q_len()]);
    let mut gk = up(&vec![poison::<T>(); p.kv_len()]);
    let mut gv = up(&vec![poison::<T>(); p.kv_len()]);
    let mut gs = ctx.upload(&vec![f32::NAN; p.heads_q]).unwrap();
    match &sinks_ {
        Some(s) => ctx.attention_backward_with_sinks(
            p,
            &q_,
            &k_,
            &v_,
            &o,
            Some(&lse),
            &do_,
            s,
            &mut gq,
            &mut gk,
            &mut gv,
            &mut gs,
        ),
        None => ctx.attention_backward(
            p,
            &q_,
            &k_,
            &v_,
            &o,
            Some(&lse),
            &do_,
            &mut gq,
            &mut gk,
            &mut gv,
        ),
    }
    .unwrap_or_else(|e| panic!("{p:?}: backward: {e}"));
    Grads {
        dq: ctx.download(&gq).unwrap(),
        dk: ctx.download(&gk).unwrap(),
        dv: ctx.download(&gv).unwrap(),
        dsink: if sinks.is_some() {
            ctx.download(&gs).unwrap()
        } else {
            Vec::new()
        },
        o: ctx.download(&o).unwrap(),
        lse: ctx.download(&lse).unwrap(),
    }
}
