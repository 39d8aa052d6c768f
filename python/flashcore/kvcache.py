"""Decoding over a KV cache with flash-attn's conventions: ``flash_attn_with_kvcache``.

The cache is caller-owned: contiguous ``[B, S_cache, Hkv, D]``, or paged — pools of
``[num_pages, page_size, Hkv, D]`` read through ``block_table`` (int32 ``[B, max_pages]``), as
vLLM and flash-attn lay them out. New keys/values are written into the cache in place at each
sequence's ``cache_seqlens`` by a small kernel launched in the same native call as the attention
(``torch.ops.flashcore.attention_kvcache_append``, which declares the caches mutated; torch
indexing where a cache cannot be read in place), then the attention
(``torch.ops.flashcore.attention_kvcache`` without new rows) runs over each sequence's keys. The
counts and the block table are public metadata (docs/design.md §1): the walk ends at each count.
With ``secret_lengths=True`` the counts stay secret from timing instead — the kernel walks the
whole capacity and masks by select, at the cost of reading it all.
"""

from typing import Optional, Tuple

import torch

from . import _checks, _native, chunked, ops
from ._launch import decode, launch_kv, prepare_kv

MAX_SEQLEN_Q = _native.DECODE_MAX_SEQLEN_Q  # query positions per sequence (16)
NO_FEATURES = ((-1, -1), 0.0, None)  # (window_size, softcap, sinks) when none is asked
NO_WINDOW = (-1, -1)
_Tensor = torch.Tensor


class KvCall:
    """One KV-cache call as every layer below the entry point takes it, built once: q
    [B, Sq, Hq, D]; the caches (or page pools with `block_table`); `new` = (k, v) rows to append
    first, or None; `counts` int32 [B] (each sequence's cached rows before the append);
    `leftpad` int32 [B] or None; `causal`, `return_lse`, `secret` (counts kept secret),
    `prefill_consistent` (no key splits) as bools; `scale` as given; `feats` (window, softcap,
    sinks) as `_checks.check_features` returns them."""

    __slots__ = ("q", "k_cache", "v_cache", "new", "counts", "block_table", "leftpad", "causal", "scale",
                 "return_lse", "secret", "prefill_consistent", "feats")

    def __init__(self, q, k_cache, v_cache, new, counts, block_table, leftpad, causal, scale, return_lse,
                 secret=False, prefill_consistent=False, feats=NO_FEATURES):
        self.q, self.k_cache, self.v_cache, self.new, self.counts = q, k_cache, v_cache, new, counts
        self.block_table, self.leftpad, self.causal, self.scale = block_table, leftpad, causal, scale
        self.return_lse, self.secret, self.prefill_consistent, self.feats = (return_lse, secret, prefill_consistent,
                                                                             feats)

    def plain(self):
        """Whether `_launch.decode` may serve it: no table, left padding, secret counts, split
        choice or features."""
        return (self.block_table is None and self.leftpad is None and not self.secret and not self.prefill_consistent
                and _plain(self.feats))

    def op_args(self):
        """The custom ops' arguments after (q, k_cache, v_cache[, k, v])."""
        (wl, wr), cap, sinks = self.feats
        return (self.counts, self.block_table, self.causal, self.scale, self.return_lse, self.secret,
                self.prefill_consistent, self.leftpad, wl, wr, cap, sinks)


def append_kv(k_cache, v_cache, k, v, cache_seqlens, block_table=None):
    """Writes `k`, `v` ([B, n, Hkv, D]) into the caches at rows cache_seqlens[b] .. + n of each
    sequence b, in place (index_put_ on the caches' device; rows past the capacity are the
    caller's error, as in flash-attn). Paged: row r of sequence b goes to page
    block_table[b, r // page_size], row r % page_size. Returns the key counts after the append,
    int32 [B]."""
    b, n, h, d = k.shape
    if block_table is not None:
        pos = cache_seqlens.to(torch.long)[:, None] + torch.arange(n, device=k.device)[None, :]
        page = k_cache.shape[1]
        rows = block_table.to(torch.long).gather(1, pos // page)
        k_cache.index_put_((rows, pos % page), k)
        v_cache.index_put_((rows, pos % page), v)
        return (cache_seqlens + n).to(torch.int32)
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


def _check_leftpad(q, leftpad):
    """cache_leftpad: None or int32 [B] on q's device (its values are the caller's to keep within
    [0, cache_seqlens], as in flash-attn; the kernel clamps them into the cache)."""
    if leftpad is None:
        return
    if not isinstance(leftpad, torch.Tensor) or leftpad.dtype != torch.int32:
        raise TypeError("flashcore: cache_leftpad must be an int32 tensor")
    if tuple(leftpad.shape) != (q.shape[0],) or leftpad.device != q.device or not leftpad.is_contiguous():
        raise ValueError(
            f"flashcore: cache_leftpad must be contiguous, of shape ({q.shape[0]},) on {q.device}, got "
            f"{tuple(leftpad.shape)} on {leftpad.device}"
        )


def _check(q, k_cache, v_cache, seqlens_k, block_table):
    if block_table is not None:
        # Paged: the pools' first two dims are (pages, page rows); check the rest as a cache of
        # the batch's shape, then the table.
        _checks.check_block_table(block_table, q.shape[0], k_cache, q.device)
        page = k_cache.shape[1]
        view = k_cache[:1].expand(q.shape[0], *k_cache.shape[1:])
        b, sq, _, hq, hkv, d = _checks.split_shape(q, view, view, "bshd")
        if tuple(v_cache.shape) != tuple(k_cache.shape) or v_cache.dtype != k_cache.dtype:
            raise ValueError(f"flashcore: v_cache must have k_cache's shape {tuple(k_cache.shape)}")
        sk = block_table.shape[1] * page
        if not block_table.is_contiguous():
            raise ValueError("flashcore: block_table must be contiguous")
    else:
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


def _checked_outputs(q, k_cache, v_cache, seqlens_k, block_table, leftpad, return_lse, feats=NO_FEATURES,
                     prefill_consistent=False):
    """The ops' checks (shapes, counts, table, left padding, window, softcap and sinks), then their
    (out, lse) tensors."""
    _check(q, k_cache, v_cache, seqlens_k, block_table)
    _check_leftpad(q, leftpad)
    _check_feats(q, feats, prefill_consistent)
    return _outputs(q, return_lse)


def _check_feats(q, feats, prefill_consistent):
    """The window, softcap and sinks of a decode call (`_checks.check_features`); the prefill-consistent
    mode takes none of windows and softcap yet (its bits would no longer be the prefill's)."""
    window, softcap, sinks = _checks.check_features(feats[0], feats[1], feats[2], q, q.shape[-2])
    if prefill_consistent and (window != (-1, -1) or softcap):
        raise ValueError("flashcore: window_size and softcap are not supported with num_splits=1 (the "
                         "prefill-consistent mode) yet")
    return window, softcap, sinks


def _plain(feats):
    """Whether checked features ask for nothing (the one-pass fast path then serves the call)."""
    return tuple(feats[0]) == (-1, -1) and not feats[1] and feats[2] is None


@torch.library.custom_op("flashcore::attention_kvcache", mutates_args=())
def attention_kvcache_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqlens_k: torch.Tensor,
    block_table: Optional[torch.Tensor],
    causal: bool,
    scale: Optional[float],
    return_lse: bool,
    secret_lengths: bool,
    prefill_consistent: bool,
    cache_leftpad: Optional[torch.Tensor],
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Sq, Hq, D] over the first seqlens_k[b] rows of each sequence's cache
    ([B, S_cache, Hkv, D], or pages through `block_table`); q's positions are the last Sq of
    those keys (causal: bottom-right aligned to each count). Returns (out, lse); lse fp32
    [B, Hq, Sq], empty unless asked. `cache_leftpad`: each sequence's first key (keys before it
    are masked). A sliding window (flash-attn's window_size, −1 unbounded; aligned to
    each count), a softcap (0 off), learnable sinks (fp32 [Hq], or None)."""
    call = KvCall(q, k_cache, v_cache, None, seqlens_k, block_table, cache_leftpad, causal, scale, return_lse,
                  secret_lengths, prefill_consistent, ((window_left, window_right), softcap, sinks))
    return _execute(call, op=True)


@torch.library.custom_op("flashcore::attention_kvcache_append", mutates_args=("k_cache", "v_cache"))
def attention_kvcache_append_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqlens_k: torch.Tensor,
    block_table: Optional[torch.Tensor],
    causal: bool,
    scale: Optional[float],
    return_lse: bool,
    secret_lengths: bool,
    prefill_consistent: bool,
    cache_leftpad: Optional[torch.Tensor],
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """`attention_kvcache` after writing k, v ([B, n, Hkv, D]) into the caches at rows
    seqlens_k[b] .. + n (in place: the caches are declared mutated); the attention reads
    seqlens_k[b] + n keys. `seqlens_k` itself is not changed."""
    call = KvCall(q, k_cache, v_cache, (k, v), seqlens_k, block_table, cache_leftpad, causal, scale, return_lse,
                  secret_lengths, prefill_consistent, ((window_left, window_right), softcap, sinks))
    return _execute(call, op=True)


@attention_kvcache_append_op.register_fake
def _attention_kvcache_append_fake(q, k_cache, v_cache, k, v, seqlens_k, block_table, causal, scale, return_lse,
                                   secret_lengths, prefill_consistent, cache_leftpad, window_left=-1, window_right=-1,
                                   softcap=0.0, sinks=None):
    return _checked_outputs(q, k_cache, v_cache, seqlens_k, block_table, cache_leftpad, return_lse,
                            ((window_left, window_right), softcap, sinks), prefill_consistent)


def _in_place(t):
    """Whether TMA reads the cache `t` where it is (the fused append writes it there): a
    contiguous head dim, 16-byte aligned base and positive strides of 16-byte multiples."""
    st = t.stride()
    return st[3] == 1 and t.data_ptr() % 16 == 0 and all(x > 0 and x % 8 == 0 for x in st[:3])


def _execute(call, op):
    """The checked path of a KV-cache call (the ops' body, or the eager call's): every rule, the
    outputs, the append by torch indexing where the caches cannot be written in place, then the
    one launch (`_launch.launch_kv`). Returns (out, lse): the op's lse is empty unless asked, the
    eager call's None."""
    q = call.q
    _check(q, call.k_cache, call.v_cache, call.counts, call.block_table)
    _check_leftpad(q, call.leftpad)
    if op:
        _check_feats(q, call.feats, call.prefill_consistent)
        out, lse = _outputs(q, call.return_lse)
    else:
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if call.return_lse else None
    scale = _checks.check_scale(call.scale)
    if call.new is not None and not (_in_place(call.k_cache) and _in_place(call.v_cache)):
        counts = append_kv(call.k_cache, call.v_cache, call.new[0], call.new[1], call.counts, call.block_table)
        call = KvCall(q, call.k_cache, call.v_cache, None, counts, call.block_table, call.leftpad, call.causal,
                      call.scale, call.return_lse, call.secret, call.prefill_consistent, call.feats)
    launch_kv(call, scale, out, lse if call.return_lse else None)
    return out, lse


@attention_kvcache_op.register_fake
def _attention_kvcache_fake(q, k_cache, v_cache, seqlens_k, block_table, causal, scale, return_lse, secret_lengths,
                            prefill_consistent, cache_leftpad, window_left=-1, window_right=-1, softcap=0.0,
                            sinks=None):
    return _checked_outputs(q, k_cache, v_cache, seqlens_k, block_table, cache_leftpad, return_lse,
                            ((window_left, window_right), softcap, sinks), prefill_consistent)


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
    window_size=NO_WINDOW,  # (-1, -1): the same object each call that leaves it out
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    secret_lengths=False,
    cu_seqlens_q=None,
    max_seqlen_q=None,
    cu_seqlens_k_new=None,
    learnable_sink=None,
):
    """flash-attn's ``flash_attn_with_kvcache`` on [B, S, H, D] tensors (inference).

    `k_cache`, `v_cache`: [B, S_cache, Hkv, D], contiguous enough for TMA; or with `block_table`
    (int32 [B, max_pages]) page pools [num_pages, page_size, Hkv, D], any page_size ≥ 1
    (capacity max_pages · page_size; SGLang's 1 and vLLM's 16 alike, with the same output bits
    as the contiguous cache). `k`, `v` (optional,
    [B, n, Hkv, D]): written into the caches in place at rows ``cache_seqlens[b] ..`` (the caller
    keeps n within the capacity). `cache_seqlens`: int or int32 [B] (None: the caches are full).
    Attention then runs over the first ``cache_seqlens[b] + n`` rows; with `causal`, q's Sq
    positions are the last ones of those keys.
    `window_size=(left, right)` (−1 unbounded; `causal` sets right = 0): query i of
    Sq, aligned bottom-right to each sequence's key count, sees the keys within `left` before and
    `right` after its position; `softcap` (scores softcap · tanh(scale · q·k / softcap), Gemma 2);
    `learnable_sink` (FA4's name; ``[Hq]``, any float dtype, taken as fp32: one logit per query
    head joins each row's softmax denominator, gpt-oss). In every cache kind (public or secret
    counts, contiguous or paged, left padding) and in chunked prefill; not in the
    prefill-consistent mode (``num_splits=1``) for windows and softcap (ValueError).
    flash-attn arguments flashcore does not implement (rotary embedding, `cache_batch_idx`,
    ALiBi) raise ValueError. `cache_leftpad` (int32 [B]): sequence b's keys
    are rows ``cache_leftpad[b] .. cache_seqlens[b] + n`` (left padding: the rows before are
    masked, still read; new k/v still go at ``cache_seqlens[b]``). `num_splits`: 0 (the default)
    splits each sequence's keys over work units of a size fixed by the capacity (batch-invariant
    bits); 1 does not split, and then each query row gets exactly the bits of the same row of a
    causal prefill over the same keys (``flash_attn_func(..., causal=True)`` on the whole
    sequence: the prefill-consistent mode, for RL rollouts that must match the training
    forward), slower where splits would have filled the GPU; other counts raise ValueError (a
    count chosen per call would make bits depend on it). The counts and the table are public
    metadata: values past the capacity or pages outside the pool are the caller's error, as in
    flash-attn (the kernel clamps them, so no access leaves the cache). `secret_lengths=True`
    (flashcore's own) keeps the counts secret from timing: the kernel walks the full capacity.
    Returns `out`, or ``(out, softmax_lse)`` with `return_softmax_lse`.

    Chunked prefill (``flashcore.chunked``): q with more than 16 positions per sequence, or q
    packed ``[total_q, Hq, D]`` with ``cu_seqlens_q`` (int32 ``[B + 1]``) and ``max_seqlen_q``
    (FlashAttention-3's names; new `k`, `v` then packed ``[total_new, Hkv, D]`` by
    ``cu_seqlens_k_new``, default ``cu_seqlens_q``), runs the varlen prefill kernel over the cache
    in place (a paged cache read through the block table by the kernel, or for short pages at head
    dims above 64 gathered into a copy first: the same bits; ``flashcore.chunked``); causal rows
    are those of a one-shot causal prefill of each whole sequence. Packed calls return lse ``[Hq, total_q]``. `secret_lengths` is not
    offered there yet (ValueError).
    """
    # The common decode step — a contiguous cache, an int32 tensor of counts, new rows or none,
    # nothing else asked — in one pass (`_launch.decode`); anything else, or a broken rule, goes
    # the checked way below, which raises that rule's own error.
    if ((k is None) == (v is None) and type(cache_seqlens) is _Tensor and block_table is None
            and cache_leftpad is None and rotary_cos is None and rotary_sin is None and cache_batch_idx is None
            and alibi_slopes is None and learnable_sink is None and not secret_lengths and cu_seqlens_q is None
            and max_seqlen_q is None and cu_seqlens_k_new is None and type(num_splits) is int and num_splits == 0
            and (type(softcap) is float or type(softcap) is int) and softcap == 0
            and (window_size is NO_WINDOW or (type(window_size) is tuple and window_size == NO_WINDOW
                                              and type(window_size[0]) is int and type(window_size[1]) is int))):
        r = decode(q, k_cache, v_cache, None if k is None else (k, v), cache_seqlens, bool(causal), softmax_scale,
                   bool(return_softmax_lse))
        if r is not None:
            return r if return_softmax_lse else r[0]
    unsupported = {
        "rotary_cos": rotary_cos is not None,
        "rotary_sin": rotary_sin is not None,
        "cache_batch_idx": cache_batch_idx is not None,
        "alibi_slopes": alibi_slopes is not None,
    }
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"flashcore: flash_attn_with_kvcache does not support {name} yet")
    if isinstance(num_splits, bool) or num_splits not in (0, 1):
        raise ValueError(
            f"flashcore: num_splits must be 0 (splits fixed by the capacity) or 1 (no split: the "
            f"prefill-consistent mode), got {num_splits!r}"
        )
    if (k is None) != (v is None):
        raise ValueError("flashcore: give both k and v to append, or neither")
    sink_t = learnable_sink if isinstance(learnable_sink, torch.Tensor) else None
    _checks.check_no_grad("flash_attn_with_kvcache", q, k_cache, v_cache, sink_t)
    if not isinstance(q, torch.Tensor) or q.dim() < 3:
        raise ValueError("flashcore: q must be [B, Sq, Hq, D], or [total_q, Hq, D] with cu_seqlens_q")
    feats = _check_feats(q, _checks.features(window_size, softcap, learnable_sink, q, q.shape[-2]), num_splits == 1)
    chunk = cu_seqlens_q is not None or (isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[1] > MAX_SEQLEN_Q)
    if chunk:
        return _chunked_prefill(q, k_cache, v_cache, k, v, cache_seqlens, cache_leftpad, block_table, softmax_scale,
                                causal, return_softmax_lse, secret_lengths, cu_seqlens_q, max_seqlen_q,
                                cu_seqlens_k_new, feats)
    if max_seqlen_q is not None or cu_seqlens_k_new is not None:
        raise ValueError("flashcore: max_seqlen_q and cu_seqlens_k_new go with cu_seqlens_q (a packed q)")
    b = q.shape[0]
    seqlens = _counts(cache_seqlens, b, k_cache, block_table, k is not None, q.device)
    if k is not None:
        _check_new_rows(k, v, k_cache, v_cache, b)
    call = KvCall(q, k_cache, v_cache, None if k is None else (k, v), seqlens, block_table, cache_leftpad,
                  bool(causal), softmax_scale, bool(return_softmax_lse), bool(secret_lengths), num_splits == 1, feats)
    out, lse = _run(call)
    return (out, lse) if return_softmax_lse else out


def _counts(cache_seqlens, b, k_cache, block_table, appending, device):
    """`cache_seqlens` as the int32 [B] counts: None (full caches: the capacity; not when new rows
    are appended), an int for every sequence, or the int32 tensor itself."""
    if cache_seqlens is None:
        if appending:
            raise ValueError("flashcore: appending k/v needs cache_seqlens (where to write)")
        s_cache = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
        return torch.full((b,), s_cache, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, int):
        return torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError("flashcore: cache_seqlens must be an int or an int32 tensor")
    return cache_seqlens


def _check_new_rows(k, v, k_cache, v_cache, b):
    """New rows `k`, `v` as [B, n, Hkv, D]: the caches' dtype, device and trailing dims, v of k's shape."""
    for name, t, c in (("k", k, k_cache), ("v", v, v_cache)):
        if (t.dim() != 4 or t.shape[0] != b or t.shape[2:] != c.shape[2:] or t.dtype != c.dtype
                or t.device != c.device or t.shape != k.shape):
            raise ValueError(
                f"flashcore: `{name}` must be [B, n, Hkv, D] = [{b}, n, {c.shape[2]}, {c.shape[3]}] "
                f"of {c.dtype} (k's shape for v), got {tuple(t.shape)} of {t.dtype}"
            )


def _chunked_prefill(q, k_cache, v_cache, k, v, cache_seqlens, leftpad, block_table, scale, causal, return_lse,
                     secret, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new, feats=NO_FEATURES):
    """flash_attn_with_kvcache's chunked-prefill path (`chunked.attention`), after the argument
    types: the counts as an int32 tensor, `secret_lengths` refused."""
    if secret:
        raise ValueError("flashcore: secret_lengths is not offered with chunked prefill (more than "
                         f"{MAX_SEQLEN_Q} query positions, or cu_seqlens_q) yet")
    b = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    seqlens = _counts(cache_seqlens, b, k_cache, block_table, k is not None, q.device)
    if k is not None and cu_seqlens_q is None and cu_seqlens_k_new is None:
        _check_new_rows(k, v, k_cache, v_cache, b)  # dense new rows (packed ones: chunked checks them)
    out, lse = chunked.attention(q, k_cache, v_cache, k, v, seqlens, block_table, leftpad, cu_seqlens_q, max_seqlen_q,
                                 cu_seqlens_k_new, bool(causal), scale, bool(return_lse), feats)
    return (out, lse) if return_lse else out


def _run(call):
    """(out, lse) of a call whose arguments are checked, lse None unless asked: in one pass where
    it is plain (`_launch.decode`); else the op's body directly in plain eager mode (skipping the
    dispatcher's ~20 µs, as `api._call` does); else, whenever torch is tracing or faking tensors,
    through torch.ops.flashcore.attention_kvcache[_append] (the append's op declares the caches
    mutated)."""
    if call.plain():
        r = decode(call.q, call.k_cache, call.v_cache, call.new, call.counts, call.causal, call.scale, call.return_lse)
        if r is not None:
            return r
    k, v = (None, None) if call.new is None else call.new
    if ops.eager(call.q, call.k_cache, call.v_cache, k, v, call.counts, call.block_table, call.leftpad,
                 call.feats[2]):
        return _execute(call, op=False)
    if call.new is None:
        out, lse = attention_kvcache_op(call.q, call.k_cache, call.v_cache, *call.op_args())
    else:
        out, lse = attention_kvcache_append_op(call.q, call.k_cache, call.v_cache, k, v, *call.op_args())
    return out, (lse if call.return_lse else None)


def _attention_kvcache(q, k_cache, v_cache, seqlens, block_table, causal, scale, return_lse, secret,
                       prefill_consistent=False, leftpad=None, feats=NO_FEATURES):
    """A checked call without new rows (the transformers integration's left-padded prefill)."""
    return _run(KvCall(q, k_cache, v_cache, None, seqlens, block_table, leftpad, causal, scale, return_lse, secret,
                       prefill_consistent, feats))


def prepare(q, k_cache, *, causal=False, softmax_scale=None, block_table=None, secret_lengths=False, num_splits=0,
            softcap=0.0):
    """Loads the kernel of a KV-cache call of this shape (before capturing a CUDA graph); a
    `softcap` > 0 loads the softcap build its calls use (windows and sinks need no other)."""
    seqlens = torch.zeros(q.shape[0], dtype=torch.int32, device=q.device)
    b, sq, sk, hq, hkv, d = _check(q, k_cache, k_cache, seqlens, block_table)
    pages = (k_cache.shape[1], k_cache.shape[0]) if block_table is not None else (0, 0)
    prepare_kv(q.device, q.dtype, (b, sq, sk, hq, hkv, d), causal, _checks.check_scale(softmax_scale),
               secret=bool(secret_lengths), pages=pages, prefill_consistent=num_splits == 1, softcap=softcap)
