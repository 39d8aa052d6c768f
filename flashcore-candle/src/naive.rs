//! candle's own attention, as models built on candle compute it without a fused kernel: two
//! batched matmuls and a softmax, with K/V heads repeated for GQA and an additive causal mask.
//! The baseline of the tests, the benchmark and the example; runs on any candle device.

use candle_core::{DType, Result, Tensor};

/// `softmax(scale · Q Kᵀ + mask) V` on `[b, s, h, d]` tensors, computed in `compute` (e.g. f32,
/// as candle-transformers' Llama does, or the inputs' own dtype), returned in q's dtype.
/// `causal` masks bottom-right aligned (key j visible to query i iff j ≤ i + sk − sq); a row
/// with no visible key (sq > sk) comes out NaN, as a softmax over nothing does.
pub fn matmul_softmax_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
    compute: DType,
) -> Result<Tensor> {
    let (b, sq, hq, d) = q.dims4()?;
    let (_, sk, hkv, _) = k.dims4()?;
    let group = hq / hkv;
    let heads_first = |t: &Tensor| t.to_dtype(compute)?.transpose(1, 2)?.contiguous();
    let repeat = |t: Tensor| -> Result<Tensor> {
        if group == 1 {
            return Ok(t);
        }
        t.unsqueeze(2)?
            .expand((b, hkv, group, sk, d))?
            .reshape((b, hq, sk, d))
    };
    let qh = heads_first(q)?;
    let kh = repeat(heads_first(k)?)?;
    let vh = repeat(heads_first(v)?)?;
    let mut scores = (qh.matmul(&kh.t()?)? * softmax_scale as f64)?;
    if causal {
        let mask: Vec<f32> = (0..sq)
            .flat_map(|i| {
                (0..sk).map(move |j| {
                    if j + sq > i + sk {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (sq, sk), q.device())?.to_dtype(compute)?;
        scores = scores.broadcast_add(&mask)?;
    }
    let p = candle_nn::ops::softmax_last_dim(&scores)?;
    p.matmul(&vh)?.transpose(1, 2)?.to_dtype(q.dtype())
}
