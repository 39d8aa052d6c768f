//! A small Llama with random weights (no download), run three ways on one GPU:
//!
//! 1. `candle_transformers::models::llama::Llama`, candle's own model and attention (it upcasts
//!    to f32 for a matmul-softmax; it has no attention hook, only a cfg-gated
//!    `candle-flash-attn` call);
//! 2. the same model written out below (RMSNorm, RoPE, GQA, causal, SwiGLU MLP, weights loaded
//!    under the same names), with that same matmul-softmax attention;
//! 3. model 2 with `flashcore_candle::flash_attn` as its attention.
//!
//! Prints the time of a prefill forward for each and the max difference of the logits (last
//! position against model 1, every position between 2 and 3).
//!
//! `cargo run --release -p flashcore-candle --features cuda --example llama [-- SEQ [BATCH]]`

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{embedding, linear_no_bias, rms_norm, Embedding, Linear, RmsNorm, VarBuilder};
use candle_transformers::models::llama as ct;
use std::collections::HashMap;
use std::time::Instant;

#[derive(Clone, Copy, PartialEq)]
enum Attn {
    Candle,
    Flashcore,
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    norm1: RmsNorm,
    norm2: RmsNorm,
}

struct SmallLlama {
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    head: Linear,
    cos: Tensor,
    sin: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl SmallLlama {
    fn load(vb: VarBuilder, cfg: &ct::Config) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.hidden_size / cfg.num_attention_heads);
        let kv = hd * cfg.num_key_value_heads;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let vb = vb.pp(format!("model.layers.{i}"));
                let a = vb.pp("self_attn");
                let m = vb.pp("mlp");
                Ok(Layer {
                    q: linear_no_bias(h, h, a.pp("q_proj"))?,
                    k: linear_no_bias(h, kv, a.pp("k_proj"))?,
                    v: linear_no_bias(h, kv, a.pp("v_proj"))?,
                    o: linear_no_bias(h, h, a.pp("o_proj"))?,
                    gate: linear_no_bias(h, cfg.intermediate_size, m.pp("gate_proj"))?,
                    up: linear_no_bias(h, cfg.intermediate_size, m.pp("up_proj"))?,
                    down: linear_no_bias(cfg.intermediate_size, h, m.pp("down_proj"))?,
                    norm1: rms_norm(h, cfg.rms_norm_eps, vb.pp("input_layernorm"))?,
                    norm2: rms_norm(h, cfg.rms_norm_eps, vb.pp("post_attention_layernorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // RoPE tables as Llama computes them: theta_i = rope_theta^(-2i/d), angle = pos · theta.
        let inv: Vec<f32> = (0..hd)
            .step_by(2)
            .map(|i| 1.0 / cfg.rope_theta.powf(i as f32 / hd as f32))
            .collect();
        let dev = vb.device();
        let pos = Tensor::arange(0, cfg.max_position_embeddings as u32, dev)?
            .to_dtype(DType::F32)?
            .reshape((cfg.max_position_embeddings, 1))?;
        let angles = pos.matmul(&Tensor::new(inv.as_slice(), dev)?.reshape((1, hd / 2))?)?;
        Ok(SmallLlama {
            embed: embedding(cfg.vocab_size, h, vb.pp("model.embed_tokens"))?,
            layers,
            norm: rms_norm(h, cfg.rms_norm_eps, vb.pp("model.norm"))?,
            head: linear_no_bias(h, cfg.vocab_size, vb.pp("lm_head"))?,
            cos: angles.cos()?.to_dtype(vb.dtype())?,
            sin: angles.sin()?.to_dtype(vb.dtype())?,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: hd,
        })
    }

    /// Logits of every position, `[b, s, vocab]`.
    fn forward(&self, tokens: &Tensor, attn: Attn) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let (cos, sin) = (self.cos.narrow(0, 0, s)?, self.sin.narrow(0, 0, s)?);
        let mut x = self.embed.forward(tokens)?;
        for l in &self.layers {
            let r = x.clone();
            let y = l.norm1.forward(&x)?;
            // [b, s, h·d] -> [b, h, s, d] for RoPE (candle's rope wants heads before positions).
            let split = |t: Tensor, heads: usize| {
                t.reshape((b, s, heads, self.head_dim))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let q = split(l.q.forward(&y)?, self.heads)?;
            let k = split(l.k.forward(&y)?, self.kv_heads)?;
            let v = split(l.v.forward(&y)?, self.kv_heads)?;
            let q = candle_nn::rotary_emb::rope(&q, &cos, &sin)?;
            let k = candle_nn::rotary_emb::rope(&k, &cos, &sin)?;
            let scale = 1.0 / (self.head_dim as f32).sqrt();
            let o = match attn {
                // [b, h, s, d] viewed as [b, s, h, d]: read in place, no copy.
                Attn::Flashcore => flashcore_candle::flash_attn(
                    &q.transpose(1, 2)?,
                    &k.transpose(1, 2)?,
                    &v.transpose(1, 2)?,
                    scale,
                    true,
                )?,
                // Llama's (candle-transformers') attention: K/V heads repeated, f32 matmuls,
                // causal mask, softmax.
                Attn::Candle => flashcore_candle::naive::matmul_softmax_attention(
                    &q.transpose(1, 2)?,
                    &k.transpose(1, 2)?,
                    &v.transpose(1, 2)?,
                    scale,
                    true,
                    DType::F32,
                )?,
            };
            let o = o.reshape((b, s, self.heads * self.head_dim))?;
            x = (l.o.forward(&o)? + r)?;
            let r = x.clone();
            let y = l.norm2.forward(&x)?;
            let m = (candle_nn::ops::silu(&l.gate.forward(&y)?)? * l.up.forward(&y)?)?;
            x = (l.down.forward(&m)? + r)?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }
}

/// Random weights under Llama's names, N(0, std) on the CPU, for `VarBuilder::from_tensors`.
fn random_weights(cfg: &ct::Config) -> Result<HashMap<String, Tensor>> {
    let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
    let kv = h / cfg.num_attention_heads * cfg.num_key_value_heads;
    let cpu = Device::Cpu;
    let mut w = HashMap::new();
    let mut put = |name: String, shape: (usize, usize), std: f64| -> Result<()> {
        w.insert(name, Tensor::randn(0f32, std as f32, shape, &cpu)?);
        Ok(())
    };
    put("model.embed_tokens.weight".into(), (cfg.vocab_size, h), 1.0)?;
    put("lm_head.weight".into(), (cfg.vocab_size, h), 0.02)?;
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        // Projections scaled so activations stay O(1) through the layers.
        let s = 1.0 / (h as f64).sqrt();
        put(format!("{p}.self_attn.q_proj.weight"), (h, h), 2.0 * s)?;
        put(format!("{p}.self_attn.k_proj.weight"), (kv, h), 2.0 * s)?;
        put(format!("{p}.self_attn.v_proj.weight"), (kv, h), s)?;
        put(format!("{p}.self_attn.o_proj.weight"), (h, h), s)?;
        put(format!("{p}.mlp.gate_proj.weight"), (i, h), s)?;
        put(format!("{p}.mlp.up_proj.weight"), (i, h), s)?;
        put(
            format!("{p}.mlp.down_proj.weight"),
            (h, i),
            1.0 / (i as f64).sqrt(),
        )?;
    }
    let ones = Tensor::ones(h, DType::F32, &cpu)?;
    for l in 0..cfg.num_hidden_layers {
        for n in ["input_layernorm", "post_attention_layernorm"] {
            w.insert(format!("model.layers.{l}.{n}.weight"), ones.clone());
        }
    }
    w.insert("model.norm.weight".into(), ones);
    Ok(w)
}

/// Mean wall time of `f` over `iters` runs after 2 warm-up runs, synchronised on `dev`.
fn time<T>(dev: &Device, iters: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, T)> {
    for _ in 0..2 {
        f()?;
    }
    dev.synchronize()?;
    let t = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        last = Some(f()?);
    }
    dev.synchronize()?;
    Ok((
        t.elapsed().as_secs_f64() * 1e3 / iters as f64,
        last.unwrap(),
    ))
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(D::Minus1)?
        .to_scalar()
}

fn max_abs(a: &Tensor) -> Result<f32> {
    a.to_dtype(DType::F32)?
        .abs()?
        .flatten_all()?
        .max(D::Minus1)?
        .to_scalar()
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let seq = args.first().copied().unwrap_or(2048);
    let batch = args.get(1).copied().unwrap_or(1);
    let dev = Device::new_cuda(0)?;
    let dtype = DType::BF16;
    let cfg = ct::Config {
        hidden_size: 2048,
        intermediate_size: 5632,
        vocab_size: 8192,
        num_hidden_layers: 4,
        num_attention_heads: 16,
        num_key_value_heads: 4,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: seq.max(4096),
        tie_word_embeddings: false,
    };
    println!(
        "small Llama: {} layers, hidden {}, {} heads / {} KV heads (head dim {}), vocab {}, {dtype:?}; prefill batch {batch} x {seq} tokens",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.hidden_size / cfg.num_attention_heads,
        cfg.vocab_size
    );
    let weights = random_weights(&cfg)?;
    let vb = VarBuilder::from_tensors(weights, dtype, &dev);
    let reference = ct::Llama::load(vb.clone(), &cfg)?;
    let ours = SmallLlama::load(vb, &cfg)?;
    let ids: Vec<u32> = (0..batch * seq)
        .map(|i| ((i as u64 * 2654435761) % cfg.vocab_size as u64) as u32)
        .collect();
    let tokens = Tensor::from_vec(ids, (batch, seq), &dev)?;

    let iters = 5;
    let (t_ct, logits_ct) = time(&dev, iters, || {
        let mut cache = ct::Cache::new(false, dtype, &cfg, &dev)?;
        reference.forward(&tokens, 0, &mut cache)
    })?;
    let (t_candle, logits_candle) = time(&dev, iters, || ours.forward(&tokens, Attn::Candle))?;
    let (t_fc, logits_fc) = time(&dev, iters, || ours.forward(&tokens, Attn::Flashcore))?;
    let last = |l: &Tensor| l.narrow(1, seq - 1, 1)?.squeeze(1);
    println!("forward time (mean of {iters}, after 2 warm-up runs):");
    println!("  candle-transformers Llama (its attention) {t_ct:8.2} ms");
    println!("  this Llama, candle attention              {t_candle:8.2} ms");
    println!("  this Llama, flashcore attention           {t_fc:8.2} ms");
    println!(
        "max |logit| (candle-transformers, last position): {:.3}",
        max_abs(&logits_ct)?
    );
    println!("max |difference| of logits:");
    println!(
        "  this Llama (candle attention) vs candle-transformers, last position: {:.4}",
        max_abs_diff(&last(&logits_candle)?, &logits_ct)?
    );
    println!(
        "  this Llama (flashcore) vs candle-transformers, last position:        {:.4}",
        max_abs_diff(&last(&logits_fc)?, &logits_ct)?
    );
    println!(
        "  flashcore vs candle attention, every position:                       {:.4}",
        max_abs_diff(&logits_fc, &logits_candle)?
    );
    let (a, b) = (
        logits_fc.to_dtype(DType::F32)?,
        logits_candle.to_dtype(DType::F32)?,
    );
    let rel = ((&a - &b)?.sqr()?.sum_all()?.sqrt()? / b.sqr()?.sum_all()?.sqrt()?)?;
    println!(
        "relative L2 difference of all logits, flashcore vs candle attention: {:.2e}",
        rel.to_scalar::<f32>()?
    );
    Ok(())
}
