"""Decoding over a KV cache with flash-attn's conventions: ``flash_attn_with_kvcache``.

The cache is caller-owned, contiguous ``[B, S_cache, Hkv, D]`` (paged caches and ``block_table``
are not supported yet). New keys/values are written into the cache in place at each sequence's
``cache_seqlens`` (torch indexing on the device: no host synchronisation), then the custom op
``torch.ops.flashcore.attention_kvcache`` runs over the cache's whole capacity with each
sequence's key count masked by select — the counts are kept secret from timing (DESIGN.md §1,
secret-length mode), at the cost of reading the full capacity.
"""

from typing import Optional, Tuple

import torch

from . import _checks, _native, ops
from ._launch import fast, launch, prepare_kv

MAX_SEQLEN_Q = _native.DECODE_MAX_SEQLEN_Q  # query positions per sequence (16)


def append_kv(k_cache, v_cache, k, v, cache_seqlens):
    """Writes `k`, `v` ([B, n, Hkv, D]) into the caches at rows cache_seqlens[b] .. + n of each
    sequence b, in place (index_put_ on the caches' device; rows past the capacity are the
    caller's error, as in flash-attn). Returns the key counts after the append, int32 [B]."""
    b, n, h, d = k.shape
    # One scatter along the sequence dim per cache (index [B, n, Hkv, D], expanded: no copy):
    # the rows index_put_ would write, at a third of its host time (~4 launches per call, not 9).
    pos = cache_seqlens.to(torch.long)
    pos = pos.view(b, 1, 1, 1) if n == 1 else pos.view(b, 1, 1, 1) + torch.arange(n, device=k.device).view(1, n, 1, 1)
    index = pos.expand(b, n, h, d)
    k_cache.scatter_(1, index, k)
    v_cache.scatter_(1, index, v)
    return (cache_seqlens + n).to(torch.int32)


def _outputs(q, return_lse):
    b, sq, hq, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    return out, lse


def _check(q, k_cache, v_cache, seqlens_k):
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k_cache, v_cache, "bshd")
    if sq > MAX_SEQLEN_Q:
        raise ValueError(
            f"flashcore: flash_attn_with_kvcache takes at most {MAX_SEQLEN_Q} query positions per "
            f"sequence, got {sq} (use flash_attn_func for prefill)"
        )
    if not isinstance(seqlens_k, torch.Tensor) or seqlens_k.dtype != torch.int32:
        raise TypeError("flashcore: the key counts must be an int32 tensor")
    if tuple(seqlens_k.shape) != (b,) or seqlens_k.device != q.device:
        raise ValueError(
            f"flashcore: cache_seqlens must have shape ({b},) on {q.device}, got "
            f"{tuple(seqlens_k.shape)} on {seqlens_k.device}"
        )
    return b, sq, sk, hq, hkv, d


@torch.library.custom_op("flashcore::attention_kvcache", mutates_args=())
def attention_kvcache_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    causal: bool,
    scale: Optional[float],
    return_lse: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Sq, Hq, D] over the first seqlens_k[b] rows of each sequence's cache
    [B, S_cache, Hkv, D]; q's positions are the last Sq of those keys (causal: bottom-right
    aligned to each count). Returns (out, lse); lse fp32 [B, Hq, Sq], empty unless asked."""
    _check(q, k_cache, v_cache, seqlens_k)
    out, lse = _outputs(q, return_lse)
    launch(q, k_cache, v_cache, out, lse if return_lse else None, None, causal, _checks.check_scale(scale),
           kv_lengths=seqlens_k)
    return out, lse


@attention_kvcache_op.register_fake
def _attention_kvcache_fake(q, k_cache, v_cache, seqlens_k, causal, scale, return_lse):
    _check(q, k_cache, v_cache, seqlens_k)
    return _outputs(q, return_lse)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """flash-attn's ``flash_attn_with_kvcache`` on [B, S, H, D] tensors (inference).

    `k_cache`, `v_cache`: [B, S_cache, Hkv, D], contiguous enough for TMA. `k`, `v` (optional,
    [B, n, Hkv, D]): written into the caches in place at rows ``cache_seqlens[b] ..`` (the caller
    keeps n within the capacity). `cache_seqlens`: int or int32 [B] (None: the caches are full).
    Attention then runs over the first ``cache_seqlens[b] + n`` rows; with `causal`, q's Sq
    positions are the last ones of those keys. At most 16 query positions per sequence.
    flash-attn arguments flashcore does not implement (rotary embedding, `cache_batch_idx`,
    `cache_leftpad`, `block_table` — paged caches —, windows, softcap, ALiBi) raise ValueError;
    `num_splits` is ignored (the split is fixed by the key length, for batch invariance).
    Returns `out`, or ``(out, softmax_lse)`` with `return_softmax_lse`.
    """
    unsupported = {
        "rotary_cos": rotary_cos is not None,
        "rotary_sin": rotary_sin is not None,
        "cache_batch_idx": cache_batch_idx is not None,
        "cache_leftpad": cache_leftpad is not None,
        "block_table": block_table is not None,
        "window_size": tuple(window_size) != (-1, -1),
        "softcap": softcap != 0.0,
        "alibi_slopes": alibi_slopes is not None,
    }
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"flashcore: flash_attn_with_kvcache does not support {name} yet")
    if (k is None) != (v is None):
        raise ValueError("flashcore: give both k and v to append, or neither")
    _checks.check_no_grad(q, k_cache, v_cache)
    b, s_cache = k_cache.shape[0], k_cache.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("flashcore: appending k/v needs cache_seqlens (where to write)")
        seqlens = torch.full((b,), s_cache, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        seqlens = cache_seqlens
        if not isinstance(seqlens, torch.Tensor) or seqlens.dtype != torch.int32:
            raise TypeError("flashcore: cache_seqlens must be an int or an int32 tensor")
    if k is not None:
        for name, t, c in (("k", k, k_cache), ("v", v, v_cache)):
            if t.dim() != 4 or t.shape[0] != b or t.shape[2:] != c.shape[2:] or t.dtype != c.dtype:
                raise ValueError(
                    f"flashcore: `{name}` must be [B, n, Hkv, D] = [{b}, n, {c.shape[2]}, {c.shape[3]}] "
                    f"of {c.dtype}, got {tuple(t.shape)} of {t.dtype}"
                )
        seqlens = append_kv(k_cache, v_cache, k, v, seqlens)
    out, lse = _attention_kvcache(q, k_cache, v_cache, seqlens, bool(causal), softmax_scale,
                                  bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out


def _attention_kvcache(q, k_cache, v_cache, seqlens, causal, scale, return_lse):
    """The op on these arguments: its body directly in plain eager mode (skipping the
    dispatcher's ~20 µs, as `api._call` does; lse None unless asked), through
    torch.ops.flashcore.attention_kvcache whenever torch is tracing or faking tensors."""
    r = fast(q, k_cache, v_cache, causal, scale, False, return_lse, kv_lengths=seqlens)
    if r is not None:  # plain eager call, served in one pass (_launch.fast)
        return r
    if ops.eager(q, k_cache, v_cache, seqlens):
        _check(q, k_cache, v_cache, seqlens)
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if return_lse else None
        launch(q, k_cache, v_cache, out, lse, None, causal, _checks.check_scale(scale), kv_lengths=seqlens)
        return out, lse
    return attention_kvcache_op(q, k_cache, v_cache, seqlens, causal, scale, return_lse)


def prepare(q, k_cache, *, causal=False, softmax_scale=None):
    """Loads the kernel of a KV-cache call of this shape (before capturing a CUDA graph)."""
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k_cache, k_cache, "bshd")
    prepare_kv(q.device, q.dtype, (b, sq, sk, hq, hkv, d), causal, _checks.check_scale(softmax_scale))
