//! flashcore's Hopper attention kernels as candle ops, with `candle-flash-attn`'s signatures and
//! `[batch, seq, heads, head_dim]` layout: swap `use candle_flash_attn::...` for
//! `use flashcore_candle::...`.
//!
//! - fp16 / bf16 CUDA tensors of an sm_90 GPU (H100/H200), head dim 64 or 128, GQA/MQA (K/V with
//!   fewer heads than Q, a divisor of them), causal masks bottom-right aligned when Sq ≠ Sk.
//! - The kernels run on the tensors' device in its primary context (the one candle uses) and on
//!   candle's stream for that device; kernels are compiled at run time by NVRTC (no nvcc).
//! - Inputs are read in place wherever TMA can address them (16-byte aligned start and strides,
//!   contiguous head dim): views from `narrow`, `transpose` or a fused QKV projection are not
//!   copied. Other layouts (a broadcast, an odd offset) are copied once to a contiguous tensor.
//! - What flashcore does not do (ALiBi, head dims flashcore does not build, f32) is a candle error naming the
//!   argument, raised before anything is launched.
//!
//! The argument checks need no GPU and no `cuda` feature; without the `cuda` feature (candle's
//! CUDA backend) every call ends in an error, since candle then has no CUDA tensors.

mod check;
#[cfg(feature = "cuda")]
mod cuda;
pub mod naive;

pub use check::{needs_copy, DenseSpec, KvCacheSpec, VarlenSpec};

use candle_core::{Result, Tensor};

/// Flash attention: `softmax(softmax_scale · Q Kᵀ + mask) V`.
///
/// `q`: `[batch, seqlen_q, heads_q, head_dim]`; `k`, `v`: `[batch, seqlen_k, heads_kv,
/// head_dim]` with `heads_q` a multiple of `heads_kv`. Returns `[batch, seqlen_q, heads_q,
/// head_dim]` in q's dtype. `causal` masks bottom-right aligned (flash-attn ≥ 2.1).
pub fn flash_attn(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let right = causal.then_some(0);
    dense(q, k, v, softmax_scale, None, right, 0.0)
}

/// [`flash_attn`] with a sliding window: query `i` (aligned to `i + seqlen_k − seqlen_q`) sees
/// keys `i − left ..= i + right`; `None` is unbounded; `right = Some(0)` is causal.
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    dense(
        q,
        k,
        v,
        softmax_scale,
        window_size_left,
        window_size_right,
        0.0,
    )
}

/// ALiBi is not implemented by flashcore: always an error (kept so that code written for
/// `candle-flash-attn` compiles and says why it cannot run).
pub fn flash_attn_alibi(
    _q: &Tensor,
    _k: &Tensor,
    _v: &Tensor,
    _alibi_slopes: &Tensor,
    _softmax_scale: f32,
    _causal: bool,
) -> Result<Tensor> {
    Err(check::unsupported_alibi())
}

/// [`flash_attn_windowed`] with a logit softcap (`softcap · tanh(scores / softcap)`, Gemma 2;
/// 0 is off). `alibi_slopes` must be `None` (flashcore has no ALiBi).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    if alibi_slopes.is_some() {
        return Err(check::unsupported_alibi());
    }
    dense(
        q,
        k,
        v,
        softmax_scale,
        window_size_left,
        window_size_right,
        softcap,
    )
}

fn dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    left: Option<usize>,
    right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let spec = DenseSpec::new(q, k, v, scale, left, right, softcap)?;
    let [q, k, v] = [q, k, v].map(check::tma_ready);
    let (q, k, v) = (q?, k?, v?);
    spec.validate(&q, &k, &v)?;
    check::on_cuda(&[("q", &q), ("k", &k), ("v", &v)])?;
    run_dense(spec, &q, &k, &v)
}

#[cfg(feature = "cuda")]
fn run_dense(spec: DenseSpec, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    q.apply_op3_no_bwd(k, v, &cuda::Dense(spec))
}

#[cfg(not(feature = "cuda"))]
fn run_dense(_: DenseSpec, _: &Tensor, _: &Tensor, _: &Tensor) -> Result<Tensor> {
    Err(check::no_cuda_feature())
}

/// Flash attention over a packed batch of sequences of different lengths.
///
/// `q`: `[total_q, heads_q, head_dim]`, `k`, `v`: `[total_k, heads_kv, head_dim]`;
/// `seqlens_q`, `seqlens_k`: u32 (or i32) `[batch + 1]` cumulative lengths on the same device
/// (`0, len_0, len_0 + len_1, ...`); `max_seqlen_q`, `max_seqlen_k`: the longest sequence of
/// each. Returns `[total_q, heads_q, head_dim]`. The lengths stay on the device (no host
/// synchronisation): the work list is built there.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let spec = VarlenSpec::new(
        q,
        k,
        v,
        seqlens_q,
        seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        causal,
    )?;
    let [q, k, v] = [q, k, v].map(check::tma_ready);
    let (q, k, v) = (q?, k?, v?);
    let (sq, sk) = (seqlens_q.contiguous()?, seqlens_k.contiguous()?);
    spec.validate(&q, &k, &v)?;
    check::on_cuda(&[
        ("q", &q),
        ("k", &k),
        ("v", &v),
        ("seqlens_q", &sq),
        ("seqlens_k", &sk),
    ])?;
    run_varlen(spec, &q, &k, &v, sq, sk)
}

#[cfg(feature = "cuda")]
fn run_varlen(
    spec: VarlenSpec,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: Tensor,
    seqlens_k: Tensor,
) -> Result<Tensor> {
    q.apply_op3_no_bwd(
        k,
        v,
        &cuda::Varlen {
            spec,
            seqlens_q,
            seqlens_k,
        },
    )
}

#[cfg(not(feature = "cuda"))]
fn run_varlen(
    _: VarlenSpec,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: Tensor,
    _: Tensor,
) -> Result<Tensor> {
    Err(check::no_cuda_feature())
}

/// Attention over a KV cache (flash-attn's `flash_attn_with_kvcache`): a decode or
/// speculative-verification step of at most 16 query positions per sequence.
///
/// - `q`: `[batch, seqlen_q ≤ 16, heads_q, head_dim]`.
/// - `k_cache`, `v_cache`: `[batch, capacity, heads_kv, head_dim]`; or, with `block_table`
///   (u32/i32 `[batch, pages_per_seq]`), page pools `[num_pages, page_size, heads_kv,
///   head_dim]` (any page_size ≥ 1; capacity = pages_per_seq · page_size). They are
///   read (and written, with `k`/`v`) in place, so their layout must already suit TMA.
/// - `k`, `v`: optional new rows `[batch, n, heads_kv, head_dim]`, written **in place** into the
///   caches at rows `cache_seqlens[b] ..` before the attention (rows past the capacity are
///   dropped); both or neither.
/// - `cache_seqlens`: u32/i32 `[batch]` keys already in each cache. Sequence b attends to its
///   first `cache_seqlens[b] + n` keys; with `causal`, its queries are the last of those.
///
/// The counts and the block table are public metadata (they drive addresses); the K/V values
/// never do. Returns `[batch, seqlen_q, heads_q, head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k: Option<&Tensor>,
    v: Option<&Tensor>,
    cache_seqlens: &Tensor,
    block_table: Option<&Tensor>,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let spec = KvCacheSpec::new(
        q,
        k_cache,
        v_cache,
        (k, v),
        cache_seqlens,
        block_table,
        softmax_scale,
        causal,
    )?;
    let q = check::tma_ready(q)?;
    let new = match (k, v) {
        (Some(k), Some(v)) => Some((check::tma_ready(k)?, check::tma_ready(v)?)),
        _ => None,
    };
    let seqlens = cache_seqlens.contiguous()?;
    let table = block_table.map(Tensor::contiguous).transpose()?;
    spec.validate(&q, k_cache, v_cache, new.as_ref().map(|(k, v)| (k, v)))?;
    let mut all = vec![
        ("q", &q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("cache_seqlens", &seqlens),
    ];
    if let Some((k, v)) = &new {
        all.extend([("k", k), ("v", v)]);
    }
    if let Some(t) = &table {
        all.push(("block_table", t));
    }
    check::on_cuda(&all)?;
    run_kvcache(spec, &q, k_cache, v_cache, new, seqlens, table)
}

#[cfg(feature = "cuda")]
fn run_kvcache(
    spec: KvCacheSpec,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    new: Option<(Tensor, Tensor)>,
    cache_seqlens: Tensor,
    block_table: Option<Tensor>,
) -> Result<Tensor> {
    q.apply_op3_no_bwd(
        k_cache,
        v_cache,
        &cuda::KvCacheOp {
            spec,
            new,
            cache_seqlens,
            block_table,
        },
    )
}

#[cfg(not(feature = "cuda"))]
fn run_kvcache(
    _: KvCacheSpec,
    _: &Tensor,
    _: &Tensor,
    _: &Tensor,
    _: Option<(Tensor, Tensor)>,
    _: Tensor,
    _: Option<Tensor>,
) -> Result<Tensor> {
    Err(check::no_cuda_feature())
}

/// Testing aid: while on, every output is filled with NaN on the device before the kernel
/// writes it, so that an element the kernel fails to write shows as NaN.
#[doc(hidden)]
pub fn poison_outputs(on: bool) {
    check::POISON.store(on, std::sync::atomic::Ordering::Relaxed);
}
