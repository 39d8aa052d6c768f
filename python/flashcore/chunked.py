"""Chunked prefill over a KV cache: more than 16 new query positions per sequence attending to a
cache plus themselves — what a serving engine runs when a long prompt is split into chunks or a
cached prefix is reused. ``flash_attn_with_kvcache`` comes here when q holds more positions than
the decode kernels take, or when q is packed with ``cu_seqlens_q`` (FlashAttention-3's names).

The cache is read in place by the varlen kernel: a contiguous cache ``[B, S_cache, Hkv, D]`` is a
pack whose sequence b starts at token ``b · (batch stride / row stride)``, so ``cu_seqlens_k`` is
that arithmetic series (plus each left padding) and ``seqused_k`` each sequence's key count after
the append. Nothing is synchronised with the host: the call runs inside CUDA graphs and
``torch.compile``. A paged cache is read through the block table by the varlen kernel's paged
build (``torch.ops.flashcore.chunked_paged``; any page size, no copy) where that is the faster
read: pages of 64 rows or more, and every page size at head dims up to 64. Shorter pages at larger
head dims are first gathered into one contiguous copy of the batch's pages (one torch indexing
launch, ~``B · capacity`` rows of K and V): there the kernel's row-by-row gather measured slower
than the copy. ``FLASHCORE_PAGED_PREFILL=kernel`` or ``gather`` (read on every call) picks one
read for every call. Both give the same bits.

New rows (``k``, ``v``) are written into the cache with torch indexing before the attention:
dense ``[B, n, Hkv, D]`` at rows ``cache_seqlens[b] ..`` of each sequence, or packed
``[total_new, Hkv, D]`` with ``cu_seqlens_k_new`` (default: ``cu_seqlens_q``). As in flash-attn,
rows past the capacity are the caller's error: they are not written, and no write leaves the
cache. The returned counts still add every new row (the caller's to keep within the capacity;
the attention clamps them to it).

Causal masks are bottom-right aligned to each sequence's key count, so a chunk's rows get the
rows of a one-shot causal prefill of the whole sequence (within the fp64-judged bounds; the GPU
tests also check the bits against ``flash_attn_varlen_func`` over the whole sequence).
"""

import os
from typing import Optional, Tuple

import torch

from . import _checks, _native, varlen
from ._launch import _DTYPES, current_stream


def _rows_per_batch(cache):
    """A contiguous-row cache's batch stride in rows (the pack offset of sequence b is b times
    this), or None when its batch stride is not a whole number of rows."""
    sb, ss = cache.stride(0), cache.stride(1)
    if cache.shape[0] == 1:
        return cache.shape[1]
    if ss <= 0 or sb % ss or sb // ss < cache.shape[1]:
        return None
    return sb // ss


def _pack_view(cache, rows):
    """The cache ``[B, S_cache, Hkv, D]`` as a pack ``[(B − 1) · rows + S_cache, Hkv, D]`` over
    the same memory (no copy)."""
    b, s, h, d = cache.shape
    total = (b - 1) * rows + s
    return cache.as_strided((total, h, d), (cache.stride(1), cache.stride(2), cache.stride(3)))


# The in-kernel read's rule (H200, bench/chunked_pages.py, time ÷ the contiguous cache's): pages
# of 64 and 256 rows 1.04–1.08 against the copy's 1.03–1.31; at d128 pages of 1 and 16 rows
# 1.27–2.15 against 1.02–1.27; at d64 every page size 0.97–1.39 against 2.29–2.40.
_KERNEL_MIN_PAGE = 64
_KERNEL_ANY_PAGE_MAX_DIM = 64


def _paged_in_kernel(page_size, head_dim):
    """Whether the kernel reads the pages through the table (True) or a contiguous copy is
    gathered first: ``FLASHCORE_PAGED_PREFILL=kernel|gather`` (read on every call), else the
    measured rule. Either read gives the same bits."""
    mode = os.environ.get("FLASHCORE_PAGED_PREFILL", "").strip()
    if mode in ("kernel", "gather"):
        return mode == "kernel"
    return page_size >= _KERNEL_MIN_PAGE or head_dim <= _KERNEL_ANY_PAGE_MAX_DIM


def _pool_readable(t):
    """A page pool ``[num_pages, page, Hkv, D]`` TMA can read in place (head dim contiguous,
    16-byte aligned, strides of whole 16-byte units)."""
    st = t.stride()
    ok = (st[3] == 1 or t.shape[3] <= 1) and t.data_ptr() % 16 == 0
    return ok and all(t.shape[i] <= 1 or (st[i] > 0 and st[i] % 8 == 0) for i in (0, 1, 2))


@torch.library.custom_op("flashcore::chunked_paged", mutates_args=())
def chunked_paged_op(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: torch.Tensor,
    max_seqlen_q: int,
    causal: bool,
    scale: Optional[float],
    return_lse: bool,
    left_padded: bool,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed queries q ``[total_q, Hq, D]`` over a paged cache read in the kernel: pools
    ``[num_pages, page, Hkv, D]`` behind `block_table` (int32 ``[B, max_pages]``, contiguous).
    The pack's keys are virtual rows (sequence b's key j is row ``b · capacity + j``, capacity =
    ``max_pages · page``): `cu_seqlens_k` holds ``b · capacity`` plus each sequence's first key,
    `seqused_k` its key count; `left_padded` when some first key is past ``b · capacity`` (the
    kernel then gathers rows). Returns (out, lse ``[Hq, total_q]``, empty unless `return_lse`)."""
    out, lse = varlen._outputs(q, return_lse)
    b = cu_seqlens_q.shape[0] - 1
    if q.shape[0] == 0 or b == 0:
        return out, lse
    q = varlen._readable(q)
    kp = k_pool if _pool_readable(k_pool) else k_pool.contiguous()
    vp = v_pool if _pool_readable(v_pool) else v_pool.contiguous()
    page, hkv, d = kp.shape[1], kp.shape[2], kp.shape[3]
    capacity = block_table.shape[1] * page
    dev = q.get_device()
    dtype = _DTYPES[q.dtype]
    shape = varlen._shape(b, max_seqlen_q, capacity, q.shape[1], hkv, d)
    n = _native.varlen_workspace_bytes(dtype, shape, bool(causal))
    ws = torch.empty(max(n, 16), dtype=torch.uint8, device=q.device)
    feats = varlen._feature_kwargs((window_left, window_right), softcap, sinks)
    _native.attention_varlen(
        dev, current_stream(dev), dtype, shape, bool(causal), scale,
        varlen._desc(q), (kp.data_ptr(), tuple(kp.stride()[:3])), (vp.data_ptr(), tuple(vp.stride()[:3])),
        varlen._desc(out), (q.shape[0], b * capacity), lse.data_ptr() if return_lse else 0,
        (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), seqused_k.data_ptr(), 0),
        ws.data_ptr(),
        pages=(block_table.data_ptr(), page, kp.shape[0], bool(left_padded)),
        **feats,
    )
    return out, lse


@chunked_paged_op.register_fake
def _chunked_paged_fake(q, k_pool, v_pool, block_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, causal,
                        scale, return_lse, left_padded, window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    return varlen._outputs(q, return_lse)


def _gathered(cache, block_table):
    """A paged pool ``[num_pages, page, Hkv, D]`` read through `block_table` ``[B, max_pages]``
    as one contiguous cache ``[B, max_pages · page, Hkv, D]`` (a copy; entries are clamped into
    the pool, as the decode kernels clamp them)."""
    idx = block_table.long().clamp(0, cache.shape[0] - 1)
    b, pages = idx.shape
    return cache[idx].reshape(b, pages * cache.shape[1], cache.shape[2], cache.shape[3])


def _new_rows(k, cu_new, b):
    """(sequence of each new row, the sequence's first new row, the row's offset inside the
    sequence's new rows, new rows per sequence) of packed rows ``[total_new, ...]`` laid out by
    `cu_new` (int32 ``[B + 1]``). Rows outside ``cu_new[0] .. cu_new[B]`` get offsets that no
    sequence has (they are not written)."""
    t = torch.arange(k.shape[0], device=k.device, dtype=torch.int32)
    seq = torch.searchsorted(cu_new[1:], t, right=True).clamp_(max=max(b - 1, 0)).long()
    first = cu_new.long()[seq]
    return seq, first, t.long() - first, (cu_new[1:] - cu_new[:-1]).long()


def _targets(cache, block_table, seq, first, within, added, seqlens, capacity):
    """Where each new row goes — (index tensors into the cache, the new row each target takes,
    whether the target keeps its own value) — for rows of sequences `seq` (whose new rows start
    at row `first` and number `added`) at offsets `within` past each count. A row at or past
    `capacity`, or outside its sequence's new rows, is not written: it is aimed at the
    sequence's last row with the value that row gets anyway (the new row written there, or its
    old value when none is), so duplicate targets always carry equal values."""
    count = seqlens.long()[seq]
    n = added[seq]
    pos = count + within
    ok = (within >= 0) & (within < n) & (pos < capacity)
    last = capacity - 1 - count  # the offset of the new row that lands on the last row
    writer = (last >= 0) & (last < n)
    src = torch.where(ok, first + within, first + last.clamp(min=0))
    keep = ~ok & ~writer
    src = torch.where(keep, 0, src)
    pos = torch.where(ok, pos, capacity - 1)
    if block_table is not None:
        page = cache.shape[1]
        idx = (block_table.long()[seq, pos // page].clamp(0, cache.shape[0] - 1), pos % page)
    else:
        idx = (seq, pos)
    return idx, src, keep


def _write(cache, target, rows):
    idx, src, keep = target
    cache.index_put_(idx, torch.where(keep[:, None, None], cache[idx], rows[src]))


def append(k_cache, v_cache, k, v, seqlens, block_table, cu_new, capacity):
    """Writes the new rows into the caches; returns the key counts after the append (int32 [B])."""
    b = seqlens.shape[0]
    if cu_new is None:  # dense [B, n, Hkv, D]
        n = k.shape[1]
        seq = torch.arange(b, device=k.device).repeat_interleave(n)
        first = seq * n
        within = torch.arange(n, device=k.device).repeat(b)
        added = torch.full((b,), n, dtype=torch.long, device=k.device)
        k, v = k.reshape(b * n, *k.shape[2:]), v.reshape(b * n, *v.shape[2:])
    else:
        seq, first, within, added = _new_rows(k, cu_new, b)
    target = _targets(k_cache, block_table, seq, first, within, added, seqlens, capacity)
    _write(k_cache, target, k)
    _write(v_cache, target, v)
    return (seqlens + added).to(torch.int32)


def _check_packed_new(name, t, cache, cu_new):
    if t.dim() != 3 or t.shape[1:] != cache.shape[2:] or t.dtype != cache.dtype or t.device != cache.device:
        raise ValueError(
            f"flashcore: with cu_seqlens_k_new, `{name}` must be [total_new, Hkv, D] = "
            f"[total_new, {cache.shape[2]}, {cache.shape[3]}] of {cache.dtype}, got {tuple(t.shape)} of {t.dtype}"
        )
    varlen._check_meta("cu_seqlens_k_new", cu_new, None, cache.device)


def attention(q, k_cache, v_cache, k, v, seqlens, block_table, leftpad, cu_seqlens_q, max_seqlen_q,
              cu_seqlens_k_new, causal, softmax_scale, return_lse, feats=((-1, -1), 0.0, None)):
    """The chunked-prefill call of ``flash_attn_with_kvcache`` (the counts' type, dense new rows
    and the `feats` = (window, softcap, fp32 sinks or None) checked there): returns (out,
    lse) in its layouts — q ``[B, Sq, Hq, D]`` → out of that shape and lse fp32 ``[B, Hq, Sq]``;
    packed q ``[total_q, Hq, D]`` → out ``[total_q, Hq, D]`` and lse ``[Hq, total_q]``
    (flash-attn's varlen layout); lse None unless asked. A window is aligned to each sequence's
    key count (its chunk's rows are the last of those keys), as in a one-shot prefill."""
    packed = cu_seqlens_q is not None
    if packed:
        if q.dim() != 3:
            raise ValueError(f"flashcore: with cu_seqlens_q, q must be [total_q, Hq, D], got shape {tuple(q.shape)}")
        varlen._check_meta("cu_seqlens_q", cu_seqlens_q, None, q.device)
        b = cu_seqlens_q.shape[0] - 1
        if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
            raise ValueError(f"flashcore: with cu_seqlens_q, max_seqlen_q must be a non-negative int, got {max_seqlen_q!r}")
        q_pack, cu_q, max_q = q, cu_seqlens_q, max_seqlen_q
    else:
        if q.dim() != 4:
            raise ValueError(f"flashcore: q must be [B, Sq, Hq, D], got shape {tuple(q.shape)}")
        b, sq = q.shape[0], q.shape[1]
        q_pack = q.reshape(b * sq, q.shape[2], q.shape[3])
        cu_q = torch.arange(b + 1, device=q.device, dtype=torch.int32) * sq
        max_q = sq
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"flashcore: k_cache and v_cache must be [B, S_cache, Hkv, D] (or page pools) of one shape, got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if block_table is not None:
        _checks.check_block_table(block_table, b, k_cache, q.device)
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != b:
            raise ValueError(f"flashcore: k_cache holds {k_cache.shape[0]} sequences, q {b}")
        capacity = k_cache.shape[1]
    if tuple(seqlens.shape) != (b,) or seqlens.device != q.device:
        raise ValueError(
            f"flashcore: cache_seqlens must have shape ({b},) on {q.device}, got {tuple(seqlens.shape)} on {seqlens.device}"
        )
    if leftpad is not None and (leftpad.dtype != torch.int32 or tuple(leftpad.shape) != (b,) or leftpad.device != q.device):
        raise ValueError(f"flashcore: cache_leftpad must be int32 of shape ({b},) on {q.device}")
    if k is not None:
        if cu_seqlens_k_new is None and packed:
            cu_seqlens_k_new = cu_seqlens_q  # FA3's default: as many new keys as queries
        if cu_seqlens_k_new is not None:
            _check_packed_new("k", k, k_cache, cu_seqlens_k_new)
            _check_packed_new("v", v, v_cache, cu_seqlens_k_new)
            if v.shape != k.shape:
                raise ValueError(f"flashcore: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
            if cu_seqlens_k_new.shape[0] != b + 1:
                raise ValueError(f"flashcore: cu_seqlens_k_new must have shape ({b + 1},), got {tuple(cu_seqlens_k_new.shape)}")
        counts = append(k_cache, v_cache, k, v, seqlens, block_table, cu_seqlens_k_new, capacity)
    elif cu_seqlens_k_new is not None:
        raise ValueError("flashcore: cu_seqlens_k_new given without new k, v")
    else:
        counts = seqlens
    if block_table is not None and _paged_in_kernel(k_cache.shape[1], k_cache.shape[3]):
        out, lse = _paged(q_pack, k_cache, v_cache, block_table, counts, leftpad, cu_q, max_q, capacity, causal,
                          softmax_scale, return_lse, feats)
    else:
        out, lse = _contiguous(q_pack, k_cache, v_cache, block_table, counts, leftpad, cu_q, max_q, capacity, causal,
                               softmax_scale, return_lse, feats)
    if packed:
        return out, lse
    out = out.view(q.shape)
    if lse is not None:
        lse = lse.view(q.shape[2], b, q.shape[1]).permute(1, 0, 2).contiguous()
    return out, lse


def _starts(b, rows, counts, leftpad, capacity, device):
    """(cu_seqlens_k, seqused_k) of the cache as a pack whose sequence b starts at row
    ``b · rows``: each first key (left padding) added, each count clamped to the capacity."""
    cu_k = torch.arange(b + 1, device=device, dtype=torch.int32) * rows
    used = counts.clamp(0, capacity)
    if leftpad is not None:
        start = torch.minimum(leftpad.clamp(min=0), used)
        cu_k = cu_k + torch.cat([start, start.new_zeros(1)])
        used = used - start
    return cu_k, used.to(torch.int32)


def _paged(q_pack, k_cache, v_cache, block_table, counts, leftpad, cu_q, max_q, capacity, causal, softmax_scale,
           return_lse, feats):
    """The pages read by the kernel through the table (no copy)."""
    b = cu_q.shape[0] - 1
    cu_k, used = _starts(b, capacity, counts, leftpad, capacity, q_pack.device)
    window, softcap, sinks = feats
    out, lse = chunked_paged_op(
        q_pack, k_cache, v_cache, block_table.contiguous(), cu_q, cu_k, used, max_q, bool(causal), softmax_scale,
        bool(return_lse), leftpad is not None, window[0], window[1], softcap, sinks,
    )
    return out, (lse if return_lse else None)


def _contiguous(q_pack, k_cache, v_cache, block_table, counts, leftpad, cu_q, max_q, capacity, causal, softmax_scale,
                return_lse, feats):
    """The cache read as a contiguous pack in place (a paged cache gathered into one first)."""
    b = cu_q.shape[0] - 1
    kc, vc = (k_cache, v_cache) if block_table is None else (_gathered(k_cache, block_table), _gathered(v_cache, block_table))
    rows = _rows_per_batch(kc)
    if rows is None or _rows_per_batch(vc) != rows:
        kc, vc = kc.contiguous(), vc.contiguous()
        rows = capacity
    cu_k, used = _starts(b, rows, counts, leftpad, capacity, q_pack.device)
    r = varlen.flash_attn_varlen_func(
        q_pack, _pack_view(kc, rows), _pack_view(vc, rows), cu_q, cu_k, max_q, capacity,
        softmax_scale=softmax_scale, causal=causal, seqused_k=used, return_lse=bool(return_lse),
        window_size=feats[0], softcap=feats[1], learnable_sink=feats[2],
    )
    return r if return_lse else (r, None)

