"""From torch tensors to a launch: device pointers, element strides and torch's current stream go
to Rust (``flashcore._native``), which launches in the device's primary context — torch's."""

import functools

import torch

from . import _checks, _native

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_DECODE_MAX_SEQLEN_Q = _native.DECODE_MAX_SEQLEN_Q


def tma_ready(t):
    """Whether TMA can read `t` (index order [B, S, H, D]) in place: contiguous last dim, a
    16-byte-aligned base, and 16-byte multiples as the other strides (of dims longer than 1)."""
    shape, stride = t.shape, t.stride()
    if stride[3] != 1 and shape[3] > 1:
        return False
    if t.data_ptr() % 16 != 0:
        return False
    for dim in range(3):
        if shape[dim] > 1 and (stride[dim] <= 0 or stride[dim] % 8 != 0):
            return False
    return True


def readable(t):
    """`t` itself when TMA can read it in place, else a contiguous copy."""
    return t if tma_ready(t) else t.contiguous()


def _stream_object(index):
    return torch.cuda.current_stream(index).cuda_stream


# torch's current CUDA stream on device `index`, as the integer handle: what torch.compile's
# generated code calls (no Stream object, no Python frame), where this torch build has it.
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_object


def _desc(t):
    st = t.stride()
    return (t.data_ptr(), (st[0], st[1], st[2]))


def _out_desc(t, bhsd):
    """`_desc` of `t` read in [B, S, H, D] index order (`bhsd`: `t` is [B, H, S, D])."""
    st = t.stride()
    return (t.data_ptr(), (st[0], st[2], st[1]) if bhsd else (st[0], st[1], st[2]))


def _in_desc(t, bhsd):
    """(tensor, `_desc`) of an input read in [B, S, H, D] index order (`bhsd`: `t` is
    [B, H, S, D]; its dims 1 and 2 are swapped here without making a view). The tensor is `t`
    when TMA can read it in place, else a contiguous copy, which the caller keeps alive until
    the launch is enqueued."""
    st = t.stride()
    ptr = t.data_ptr()
    b, s, h = (st[0], st[2], st[1]) if bhsd else (st[0], st[1], st[2])
    # Positive multiples of 16 bytes (2-byte dtypes) and a contiguous head dim: what `tma_ready`
    # accepts whatever the extents are (its fast accept; the rest takes the exact rule).
    if st[3] == 1 and ptr % 16 == 0 and b > 0 and s > 0 and h > 0 and not (b % 8 or s % 8 or h % 8):
        return t, (ptr, (b, s, h))
    t = readable(t.transpose(1, 2) if bhsd else t)
    return t, _desc(t)


# Decode workspaces kept per (device, stream). A call's split partials are written by its first
# launch and read by its second, both on the call's stream, and the next call on that stream
# starts after both have finished: one buffer per stream serves every eager call there, with no
# allocation per call. While a CUDA graph is captured, each call takes a fresh buffer from torch's
# allocator instead (the graph's private pool: its replays may run on other streams, concurrently
# with eager calls).
_workspaces = {}


def _workspace(n, dev, stream):
    """A device buffer of at least `n` bytes for one call on `stream` of device `dev`."""
    w = _workspaces.get((dev, stream))
    capturing = _capturing()
    if w is not None and w.numel() >= n and not capturing:
        return w
    w = torch.empty(n, dtype=torch.uint8, device=torch.device("cuda", dev))
    if not capturing:
        _workspaces[(dev, stream)] = w  # the one it replaces is freed in stream order
    return w


# Tile counters of the dynamic order (causal prefill takes its tiles heaviest first from one),
# kept per (device, stream): zero, and left zero by every launch, so one per stream serves every
# eager call there. While a CUDA graph is captured, each call takes a fresh zeroed one from
# torch's allocator (the zeroing is captured with it).
_counters = {}
_counter_words = {}


def _tile_counter(dev, stream):
    """The address of a tile counter for one call on `stream` of device `dev`."""
    capturing = _capturing()
    c = None if capturing else _counters.get((dev, stream))
    if c is None:
        words = _counter_words.get(dev)
        if words is None:
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            words = _counter_words[dev] = _native.tile_counter_words(sms)
        c = torch.zeros(words, dtype=torch.int32, device=torch.device("cuda", dev))
        if not capturing:
            _counters[(dev, stream)] = c
    return c.data_ptr()


# What torch.cuda.is_current_stream_capturing calls, without its Python frame.
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def _dims(q, k, bhsd):
    """(B, Sq, Sk, Hq, Hkv, D) of q and k, both [B, S, H, D] or (`bhsd`) [B, H, S, D]."""
    if bhsd:
        b, hq, sq, d = q.shape
        return b, sq, k.shape[2], hq, k.shape[1], d
    b, sq, hq, d = q.shape
    return b, sq, k.shape[1], hq, k.shape[2], d


def _scratch(n, batch, dev, stream, append):
    """(workspace address, counts address) of one call: `n` bytes of decode workspace and, for a
    fused KV-cache append, room for the int32 [B] counts after it (16-byte aligned), in one
    buffer per stream (`_workspace`). Zeros where nothing is needed."""
    counts_at = (n + 15) // 16 * 16
    total = counts_at + 4 * batch if append else n
    if not total:
        return 0, 0
    ptr = _workspace(total, dev, stream).data_ptr()
    return (ptr if n else 0), (ptr + counts_at if append else 0)


class Call:
    """One checked dense forward call, built once where its arguments are checked and read by
    `launch`: q, k, v (all [B, S, H, D], or all [B, H, S, D] with `bhsd`, any strides), `causal`
    and `return_lse` (bools), `scale` (checked, or None for 1/sqrt(D)), `lengths` (int32 [B] or
    None: secret-length prefill), `window` flash-attn's (left, right) (−1 unbounded), `softcap`
    (0 off), `sinks` (fp32 contiguous [Hq] or None). (KV-cache calls: `kvcache.KvCall`.)"""

    __slots__ = ("q", "k", "v", "causal", "scale", "bhsd", "return_lse", "lengths", "window", "softcap", "sinks")

    def __init__(self, q, k, v, causal, scale, bhsd, return_lse, lengths, window=(-1, -1), softcap=0.0, sinks=None):
        self.q, self.k, self.v = q, k, v
        self.causal, self.scale, self.bhsd, self.return_lse, self.lengths = causal, scale, bhsd, return_lse, lengths
        self.window, self.softcap, self.sinks = window, softcap, sinks

    def bhs(self):
        """(batch, heads_q, seqlen_q) of q."""
        s = self.q.shape
        return (s[0], s[1], s[2]) if self.bhsd else (s[0], s[2], s[1])


# Calls that may take the dynamic tile order (the library's rule: causal, d64, d96 or d128, at
# least 8 query tiles of 128 rows): only they pass a counter (a capture zeroes a fresh one per
# call). The library ignores it where the build it picks has no dynamic order.
_DYNAMIC_MIN_SEQLEN_Q = 1024
_DYNAMIC_HEAD_DIMS = frozenset({64, 96, 128})


def launch(call, out, lse):
    """O = attention of a checked dense call (`Call`) into `out`, in q's index order ([B, S, H, D],
    or [B, H, S, D] with `call.bhsd`), any strides; inputs that TMA cannot read in place are
    copied. `lse` is an fp32 contiguous [B, Hq, Sq] tensor or None. (KV-cache calls:
    `launch_kv`.)"""
    bhsd, lengths = call.bhsd, call.lengths
    b, sq, sk, hq, hkv, d = _dims(call.q, call.k, bhsd)
    q, qd = _in_desc(call.q, bhsd)
    k, kd = _in_desc(call.k, bhsd)
    v, vd = _in_desc(call.v, bhsd)
    dev = q.get_device()
    stream = current_stream(dev)
    dtype = _DTYPES[q.dtype]
    shape = (b, sq, sk, hq, hkv, d)
    causal = bool(call.causal)
    n = 0
    if sq <= _DECODE_MAX_SEQLEN_Q and lengths is None:
        # Decode mode's split partials (most decode shapes need some; prefill never does).
        n = _workspace_bytes(dtype, shape, causal, False)
    ws, _ = _scratch(n, b, dev, stream, False)
    extra = _features(call.window, call.softcap, call.sinks)
    if causal and sq >= _DYNAMIC_MIN_SEQLEN_Q and d in _DYNAMIC_HEAD_DIMS:
        # Long causal prefill may take the dynamic tile order (the library decides by the shape).
        extra["tile_counter"] = _tile_counter(dev, stream)
    _native.attention(
        dev,
        stream,
        dtype,
        shape,
        causal,
        call.scale,
        qd,
        kd,
        vd,
        _out_desc(out, bhsd),
        lse.data_ptr() if lse is not None else 0,
        lengths.data_ptr() if lengths is not None else 0,
        ws,
        0,
        **extra,
    )


def launch_kv(call, scale, out, lse):
    """The one native call of a checked KV-cache call (`kvcache.KvCall`: q, caches, counts, block
    table, left padding, flags, features, new rows) into `out` (`lse`: fp32 contiguous [B, Hq, Sq]
    or None), with `scale` checked. Caches and q are in [B, S, H, D] index order (a paged cache:
    pools [num_pages, page_size, Hkv, D], capacity max_pages · page_size), copied where TMA cannot
    read them in place. With `call.new` = (k, v) rows [B, n, Hkv, D], one launch writes them into
    the caches at each count before the attention reads count + n keys: the caches must then be
    readable in place (the caller's check; new rows the append cannot read as they are are
    copied here)."""
    q, k_cache, table = call.q, call.k_cache, call.block_table
    b, sq, sk, hq, hkv, d = _dims(q, k_cache, False)
    page_size = num_pages = 0
    if table is not None:
        page_size, num_pages = k_cache.shape[1], k_cache.shape[0]
        sk = table.shape[1] * page_size
    new = call.new
    if new is not None and not _append_ready(new[0], new[1], k_cache, q.get_device()):
        new = (new[0].contiguous(), new[1].contiguous())
    q, qd = _in_desc(q, False)
    k, kd = _in_desc(k_cache, False)
    v, vd = _in_desc(call.v_cache, False)
    dev = q.get_device()
    stream = current_stream(dev)
    dtype = _DTYPES[q.dtype]
    shape = (b, sq, sk, hq, hkv, d)
    causal, secret, consistent = bool(call.causal), bool(call.secret), bool(call.prefill_consistent)
    # The split partials of decode mode (none in the prefill-consistent mode).
    n = _workspace_bytes(dtype, shape, causal, True, consistent)
    ws, counts_after = _scratch(n, b, dev, stream, new is not None)
    window, softcap, sinks = call.feats
    leftpad = call.leftpad
    # Every argument positionally, in the native signature's order.
    _native.attention(
        dev, stream, dtype, shape, causal, scale, qd, kd, vd, _out_desc(out, False),
        lse.data_ptr() if lse is not None else 0, 0, ws, call.counts.data_ptr(), secret,
        table.data_ptr() if table is not None else 0, page_size, num_pages, consistent,
        leftpad.data_ptr() if leftpad is not None else 0, tuple(window), float(softcap),
        sinks.data_ptr() if sinks is not None else 0,
        None if new is None else (_desc(new[0]), _desc(new[1]), new[0].shape[1], counts_after),
    )


def _features(window, softcap, sinks):
    """The window, softcap and sinks keywords of a launch, only where they differ from the defaults."""
    extra = {}
    if window != (-1, -1):
        extra["window"] = window
    if softcap:
        extra["softcap"] = float(softcap)
    if sinks is not None:
        extra["sinks"] = sinks.data_ptr()
    return extra


@functools.lru_cache(maxsize=1024)
def _workspace_bytes(dtype, shape, causal, kv_lengths, prefill_consistent=False):
    """The decode workspace size of a shape, asked of Rust once per shape (a pure function)."""
    return _native.workspace_bytes(dtype, shape, causal, kv_lengths=kv_lengths,
                                   kv_prefill_consistent=prefill_consistent)


def dense(t):
    """`t` itself when contiguous with a 16-byte-aligned base (what the backward reads O and dO
    as), else a contiguous copy."""
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


def launch_backward(d_o, q, k, v, out, lse, dq, dk, dv, causal, scale, bhsd=False, window=(-1, -1), softcap=0.0,
                    sinks=None, dsink=None):
    """dq, dk, dv (fresh contiguous tensors of q's and k's shapes) of attention(q, k, v) from the
    forward's `out` and `lse` and the output gradient `d_o`, on torch's current stream. q, k, v
    have any strides (copied where TMA cannot read them); `d_o` and `out` are dense (`dense`), in
    q's layout (`bhsd`: [B, H, S, D], else [B, S, H, D]); `lse` fp32 contiguous [B, Hq, Sq]. GQA:
    dk, dv are summed over the query heads of each K/V head. The scratch comes from torch's
    allocator on the same stream. The forward's `window` (flash-attn's (left, right)),
    `softcap` and `sinks` (fp32 contiguous [Hq] or None); with sinks, their gradient goes to
    `dsink` (fp32 contiguous [Hq])."""
    b, sq, sk, hq, hkv, d = _dims(q, k, bhsd)
    q, qd = _in_desc(q, bhsd)
    k, kd = _in_desc(k, bhsd)
    v, vd = _in_desc(v, bhsd)
    dev = q.get_device()
    dtype = _DTYPES[q.dtype]
    shape = (b, sq, sk, hq, hkv, d)
    ws = torch.empty(_backward_workspace_bytes(dtype, shape, bool(causal)), dtype=torch.uint8, device=q.device)
    buffers = (out.data_ptr(), lse.data_ptr(), d_o.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
               ws.data_ptr())
    if window == (-1, -1) and softcap == 0.0 and sinks is None:
        _native.attention_backward(dev, current_stream(dev), dtype, shape, bool(causal), scale, bool(bhsd), qd, kd, vd,
                                   buffers)
        return
    _native.attention_backward(dev, current_stream(dev), dtype, shape, bool(causal), scale, bool(bhsd), qd, kd, vd,
                               buffers, window=tuple(window), softcap=float(softcap),
                               sinks=0 if sinks is None else sinks.data_ptr(),
                               dsink=0 if sinks is None else dsink.data_ptr())


@functools.lru_cache(maxsize=1024)
def _backward_workspace_bytes(dtype, shape, causal):
    return _native.backward_workspace_bytes(dtype, shape, causal)


def prepare_kv(device, dtype, shape, causal, scale, secret=False, pages=(0, 0), prefill_consistent=False,
               softcap=0.0):
    _native.prepare(torch.device(device).index or 0, _DTYPES[dtype], shape, bool(causal), scale, kv_lengths=True,
                    kv_secret=bool(secret), page_size=pages[0], num_pages=pages[1],
                    kv_prefill_consistent=bool(prefill_consistent), softcap=float(softcap))


def prepare(device, dtype, shape, causal, scale, secret_lengths=False):
    _native.prepare(torch.device(device).index or 0, _DTYPES[dtype], shape, bool(causal), scale, secret_lengths)


_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_dispatch_mode = torch.utils._python_dispatch._get_current_dispatch_mode
# The dispatch-mode stack's depth: nonzero exactly when `_dispatch_mode()` is not None (one C call).
_dispatch_depth = torch._C._len_torch_dispatch_stack
_CONTIGUOUS = torch.contiguous_format
_F32 = torch.float32
_I32 = torch.int32


def _append_ready(k_new, v_new, cache, dev):
    """Whether new K/V rows can go to the fused append as they are: plain CUDA tensors of the
    cache's dtype on its device, [B, n, Hkv, D] like it, with strides the 16-byte copies read."""
    for t in (k_new, v_new):
        if type(t) is not _Tensor or t.dtype is not cache.dtype or not t.is_cuda or t.get_device() != dev:
            return False
        s = t.shape
        if len(s) != 4 or s[0] != cache.shape[0] or s[1] < 1 or s[2] != cache.shape[2] or s[3] != cache.shape[3]:
            return False
        st = t.stride()
        if st[3] != 1 or t.data_ptr() % 16 or any(x <= 0 or x % 8 for x in st[:3]):
            return False
    return True


def fast(q, k, v, causal, scale, bhsd, return_lse, gqa=True, top_left=False):
    """The whole eager call in one pass, for the common case: returns (out, lse) — lse None
    unless `return_lse` — after launching, or None, having done nothing, when anything is not
    plain (a tensor subclass or mode, torch.compile tracing, grad needed, a shape or dtype rule
    broken, strides TMA cannot read in place, Hq ≠ Hkv without `gqa`, a
    non-square causal call under SDPA's `top_left` convention). The caller then takes the
    checked path, which raises each rule's own error or copies what it must. Every call this
    serves, the checked path would serve with the same launch (each attribute is read once here:
    host time, not semantics). `causal` and `return_lse` are bools. (KV-cache calls: `decode`.)"""
    if type(q) is not _Tensor or type(k) is not _Tensor or type(v) is not _Tensor:
        return None
    dt = q.dtype
    tag = _DTYPES.get(dt)
    if tag is None or k.dtype is not dt or v.dtype is not dt or not (q.is_cuda and k.is_cuda and v.is_cuda):
        return None
    dev = q.get_device()
    if k.get_device() != dev or v.get_device() != dev:
        return None
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    if _is_compiling() or _dispatch_mode() is not None:
        return None
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:
        return None
    if bhsd:
        b, hq, sq, d = qs
        bk, hkv, sk, dk = ks
    else:
        b, sq, hq, d = qs
        bk, sk, hkv, dk = ks
    if bk != b or dk != d or (d != 64 and d != 128 and d != 96 and d != 256) or not (b and sq and sk and hq and hkv) or hq % hkv:
        return None
    if (hq != hkv and not gqa) or (top_left and causal and sq != sk):
        return None
    # Strides as [B, S, H, D]: positive multiples of 16 bytes, a contiguous head dim, 16-byte
    # aligned bases (what TMA reads in place; anything else takes the checked path's copy).
    qt, kt, vt = q.stride(), k.stride(), v.stride()
    if qt[3] != 1 or kt[3] != 1 or vt[3] != 1:
        return None
    if bhsd:
        qd = (q.data_ptr(), (qt[0], qt[2], qt[1]))
        kd = (k.data_ptr(), (kt[0], kt[2], kt[1]))
        vd = (v.data_ptr(), (vt[0], vt[2], vt[1]))
    else:
        qd = (q.data_ptr(), (qt[0], qt[1], qt[2]))
        kd = (k.data_ptr(), (kt[0], kt[1], kt[2]))
        vd = (v.data_ptr(), (vt[0], vt[1], vt[2]))
    for ptr, (x, y, z) in (qd, kd, vd):
        if ptr % 16 or x <= 0 or y <= 0 or z <= 0 or x % 8 or y % 8 or z % 8:
            return None
    if scale is not None:
        scale = _checks.check_scale(scale)  # raises what the checked path would, at this point
    out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    lse = torch.empty((b, hq, sq), dtype=_F32, device=out.device) if return_lse else None
    stream = current_stream(dev)
    shape = (b, sq, sk, hq, hkv, d)
    n = _workspace_bytes(tag, shape, causal, False) if sq <= _DECODE_MAX_SEQLEN_Q else 0
    ws, _ = _scratch(n, b, dev, stream, False)
    ot = out.stride()
    o_desc = (out.data_ptr(), (ot[0], ot[2], ot[1]) if bhsd else (ot[0], ot[1], ot[2]))
    o_lse = lse.data_ptr() if lse is not None else 0
    if causal and sq >= _DYNAMIC_MIN_SEQLEN_Q and d in _DYNAMIC_HEAD_DIMS:  # as `launch`
        _native.attention(dev, stream, tag, shape, causal, scale, qd, kd, vd, o_desc, o_lse, 0, ws, 0,
                          tile_counter=_tile_counter(dev, stream))
    else:
        _native.attention(dev, stream, tag, shape, causal, scale, qd, kd, vd, o_desc, o_lse, 0, ws, 0)
    return out, lse


_HEAD_DIMS = _checks.SUPPORTED_HEAD_DIMS


def decode(q, k_cache, v_cache, new, counts, causal, scale, return_lse):
    """A plain KV-cache call (a contiguous cache with public counts and none of the extras: no
    table, left padding, window, softcap, sinks or split choice; the caller has seen to those),
    with or without `new` = (k, v) rows, in one pass: each tensor's metadata is read once, and one
    native call appends the new rows at each sequence's count (if given) and attends. `counts`
    are int32 [B] (before the append); `causal` and `return_lse` are bools. (Its arguments are
    `kvcache.KvCall`'s fields, passed as they are: building the description costs more host time
    than the rest of this call's Python.)
    Returns (out, lse) — lse None unless asked — or None, having done nothing, when anything is
    not plain or breaks a rule: the caller then takes the checked path, which raises that rule's
    own error or copies what it must. Every call served here, the checked path serves with the
    same launch."""
    # Host time is the point here: each tensor's metadata is read once, with no Python
    # frame per tensor, and nothing is computed that the native call does not take.
    t = _Tensor
    if type(q) is not t or type(k_cache) is not t or type(v_cache) is not t or type(counts) is not t:
        return None
    dev = q.get_device()
    if dev < 0 or counts.get_device() != dev or k_cache.get_device() != dev or v_cache.get_device() != dev:
        return None
    dt = q.dtype
    tag = _DTYPES.get(dt)
    if tag is None or k_cache.dtype is not dt or v_cache.dtype is not dt or counts.dtype is not _I32:
        return None
    if _grad_enabled() and (q.requires_grad or k_cache.requires_grad or v_cache.requires_grad):
        return None
    if _is_compiling() or _dispatch_depth():  # a dispatch mode on the stack: the checked path
        return None
    cs = k_cache.shape
    if v_cache.shape != cs:
        return None
    try:
        b, sq, hq, d = q.shape
        cb, sk, hkv, cd = cs
    except ValueError:  # not 4-D
        return None
    if cb != b or cd != d or counts.shape != (b,) or d not in _HEAD_DIMS:
        return None
    if not (b and sq and sk and hq and hkv) or hq % hkv or sq > _DECODE_MAX_SEQLEN_Q:
        return None
    # What TMA (and the append's 16-byte copies) read in place: a contiguous head dim, a 16-byte
    # aligned base, positive (batch, seq, head) strides of 16-byte multiples.
    q0, q1, q2, q3 = q.stride()
    k0, k1, k2, k3 = k_cache.stride()
    v0, v1, v2, v3 = v_cache.stride()
    qp, kp, vp = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr()
    if q3 != 1 or k3 != 1 or v3 != 1 or (qp | kp | vp) & 15:
        return None
    if (q0 <= 0 or q1 <= 0 or q2 <= 0 or k0 <= 0 or k1 <= 0 or k2 <= 0 or v0 <= 0 or v1 <= 0 or v2 <= 0
            or (q0 | q1 | q2 | k0 | k1 | k2 | v0 | v1 | v2) & 7):
        return None
    append = None
    if new is not None:
        k, v = new
        if type(k) is not t or type(v) is not t or k.dtype is not dt or v.dtype is not dt:
            return None
        ks = k.shape
        if v.shape != ks:
            return None
        try:
            kb, rows, kh, kd = ks
        except ValueError:  # not 4-D
            return None
        if kb != b or kh != hkv or kd != d or not rows or k.get_device() != dev or v.get_device() != dev:
            return None
        a0, a1, a2, a3 = k.stride()
        c0, c1, c2, c3 = v.stride()
        nkp, nvp = k.data_ptr(), v.data_ptr()
        if a3 != 1 or c3 != 1 or (nkp | nvp) & 15:
            return None
        if a0 <= 0 or a1 <= 0 or a2 <= 0 or c0 <= 0 or c1 <= 0 or c2 <= 0 or (a0 | a1 | a2 | c0 | c1 | c2) & 7:
            return None
        append = ((nkp, (a0, a1, a2)), (nvp, (c0, c1, c2)), rows)
    if scale is not None:
        scale = _checks.check_scale(scale)  # raises what the checked path would, at this point
    # The output is contiguous [B, Sq, Hq, D] (every extent >= 1): strides (Sq·Hq·D, Hq·D, D, 1).
    row = hq * d
    ob = sq * row
    # A q of exactly those strides is dense, so empty_like's default (preserve) format gives them
    # too, without the keyword's parsing.
    out = torch.empty_like(q) if q0 == ob and q1 == row and q2 == d else torch.empty_like(q, memory_format=_CONTIGUOUS)
    lse = torch.empty((b, hq, sq), dtype=_F32, device=out.device) if return_lse else None
    stream = current_stream(dev)
    shape = (b, sq, sk, hq, hkv, d)
    # `_scratch`, inlined: the split partials, then (appending) the int32 [B] counts after them.
    n = _workspace_bytes(tag, shape, causal, True)
    if append is None:
        ws = _workspace(n, dev, stream).data_ptr() if n else 0
    else:
        counts_at = (n + 15) // 16 * 16
        ptr = _workspace(counts_at + 4 * b, dev, stream).data_ptr()
        ws = ptr if n else 0
        append = append + (ptr + counts_at,)
    # `_native.attention` with only the arguments a plain KV-cache call sets (the others at their
    # defaults), positionally: no keyword dictionary, ten fewer conversions.
    _native.attention_kv(dev, stream, tag, shape, causal, scale, (qp, (q0, q1, q2)), (kp, (k0, k1, k2)),
                         (vp, (v0, v1, v2)), (out.data_ptr(), (ob, row, d)), 0 if lse is None else lse.data_ptr(),
                         ws, counts.data_ptr(), append)
    return out, lse
