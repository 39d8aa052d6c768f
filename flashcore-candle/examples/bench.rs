//! flashcore through candle (`flashcore_candle::flash_attn`) against candle's matmul-softmax
//! attention, on `flashcore bench`'s seed shapes ([b, s, h, d] tensors, Hq = Hkv): per call, the
//! device time between CUDA events recorded on candle's stream around the op (output allocation
//! and launch included, as a candle user calls it), median of the timed calls after warm-up.
//! Prints a table and, with `--json FILE`, writes the records.
//!
//! `cargo run --release -p flashcore-candle --features cuda --example bench [-- --reps N]`

use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::{DType, Device, Result, Tensor};
use flashcore::attention::{DType as FcDType, Layout};
use flashcore_candle::naive::matmul_softmax_attention;
use std::io::Write;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median device time in µs of one call of `f(set)`, as `flashcore bench`'s per-call mode
/// times: each call between its own pair of events on candle's stream, calls enqueued in chunks
/// (outputs kept until the chunk's synchronisation, as an app that does not synchronise between
/// layers), input sets rotated so that a call's inputs are not in L2 from the call before.
fn time(
    dev: &Device,
    warmup: usize,
    reps: usize,
    sets: usize,
    f: &dyn Fn(usize) -> Result<Tensor>,
) -> Result<f64> {
    const CHUNK: usize = 16;
    let stream = dev.as_cuda_device()?.cuda_stream();
    let w = |e| candle_core::Error::Msg(format!("{e:?}"));
    for i in 0..warmup.max(sets) {
        f(i % sets)?;
    }
    stream.synchronize().map_err(w)?;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = Vec::with_capacity(reps);
    let mut i = 0;
    while times.len() < reps {
        let mut pending = Vec::new();
        for _ in 0..CHUNK.min(reps - times.len()) {
            let start = stream.record_event(flags).map_err(w)?;
            let out = f(i % sets)?;
            let end = stream.record_event(flags).map_err(w)?;
            pending.push((start, end, out));
            i += 1;
        }
        stream.synchronize().map_err(w)?;
        for (start, end, _) in &pending {
            times.push(start.elapsed_ms(end).map_err(w)? as f64 * 1e3);
        }
    }
    Ok(median(times))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let reps: usize = opt("--reps").map_or(30, |s| s.parse().expect("--reps N"));
    let warmup: usize = opt("--warmup").map_or(5, |s| s.parse().expect("--warmup N"));
    let naive_on = !args.iter().any(|a| a == "--no-naive");
    let dev = Device::new_cuda(0)?;
    println!(
        "{:>5} {:>3} {:>6} {:>4} {:>6} {:>5} | {:>12} {:>7} | {:>12} {:>7} | {:>7}",
        "B",
        "H",
        "S",
        "D",
        "causal",
        "dtype",
        "fc-candle µs",
        "TFLOPS",
        "candle µs",
        "TFLOPS",
        "speedup"
    );
    let mut records = Vec::new();
    for p in flashcore::bench::suites::seed(Layout::Bshd) {
        let dt = match p.dtype {
            FcDType::F16 => DType::F16,
            FcDType::Bf16 => DType::BF16,
        };
        let shape = (p.batch, p.seqlen_q, p.heads_q, p.head_dim);
        // As many input sets as `flashcore bench` rotates over (50 MB L2, 24 GB at most).
        let qkv_bytes = 3 * p.q_len() as u64 * 2;
        let sets = flashcore::bench::timing::sets_needed(
            50 << 20,
            qkv_bytes,
            4 * p.q_len() as u64 * 2,
            24 << 30,
        )
        .max(1);
        let mut inputs = Vec::with_capacity(sets);
        for _ in 0..sets {
            let r = || Tensor::randn(0f32, 1.0, shape, &dev)?.to_dtype(dt);
            inputs.push((r()?, r()?, r()?));
        }
        let scale = p.softmax_scale();
        let fc = time(&dev, warmup, reps, sets, &|s| {
            let (q, k, v) = &inputs[s];
            flashcore_candle::flash_attn(q, k, v, scale, p.causal)
        })
        .map_err(|e| {
            println!("  flashcore-candle failed at this shape: {e}");
            e
        })?;
        // candle's attention in the inputs' dtype (f16/bf16 matmuls and softmax): its fastest
        // unfused form. It fails where its kernels cannot index the score matrix (S = 16384:
        // 2^32 scores); that is printed, not fatal.
        let naive = if naive_on {
            let (q, k, v) = &inputs[0];
            match time(&dev, warmup.min(2), reps.min(10), 1, &|_| {
                matmul_softmax_attention(q, k, v, scale, p.causal, dt)
            }) {
                Ok(t) => Some(t),
                Err(e) => {
                    println!("  candle attention failed at this shape: {e}");
                    dev.synchronize().ok();
                    None
                }
            }
        } else {
            None
        };
        let tf = |us: f64| p.flops() / (us * 1e-6) / 1e12;
        println!(
            "{:>5} {:>3} {:>6} {:>4} {:>6} {:>5} | {:>12.1} {:>7.1} | {:>12} {:>7} | {:>7}",
            p.batch,
            p.heads_q,
            p.seqlen_q,
            p.head_dim,
            p.causal,
            p.dtype.name(),
            fc,
            tf(fc),
            naive.map_or("-".into(), |n| format!("{n:.1}")),
            naive.map_or("-".into(), |n| format!("{:.1}", tf(n))),
            naive.map_or("-".into(), |n| format!("{:.2}x", n / fc)),
        );
        records.push(format!(
            "{{\"batch\":{},\"heads\":{},\"seqlen\":{},\"head_dim\":{},\"causal\":{},\"dtype\":\"{}\",\"flashcore_candle_us\":{fc:.3},\"candle_matmul_softmax_us\":{}}}",
            p.batch,
            p.heads_q,
            p.seqlen_q,
            p.head_dim,
            p.causal,
            p.dtype.name(),
            naive.map_or("null".into(), |n| format!("{n:.3}"))
        ));
    }
    if let Some(path) = opt("--json") {
        let mut f = std::fs::File::create(&path)?;
        writeln!(f, "[\n{}\n]", records.join(",\n"))?;
    }
    Ok(())
}
