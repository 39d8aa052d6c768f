"""From torch tensors to a launch: device pointers, element strides and torch's current stream go
to Rust (``flashcore._native``), which launches in the device's primary context — torch's."""

import functools

import torch

from . import _native

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


def current_stream(index):
    """torch's current CUDA stream on device `index`, as the integer handle."""
    if _raw_stream is not None:
        return _raw_stream(index)  # what torch.compile's generated code calls: no Stream object
    return torch.cuda.current_stream(index).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _desc(t):
    st = t.stride()
    return (t.data_ptr(), (st[0], st[1], st[2]))


def launch(q, k, v, out, lse, lengths, causal, scale, kv_lengths=None, kv_secret=False, block_table=None):
    """O = attention(q, k, v) into `out`. All four tensors are views in [B, S, H, D] index order
    (any strides; inputs that TMA cannot read in place are copied); `lse` is an fp32 contiguous
    [B, Hq, Sq] tensor or None; `lengths` int32 [B] or None (secret-length prefill);
    `kv_lengths` int32 [B] or None (KV-cache mode: each sequence's key count in k, v; public
    metadata unless `kv_secret`). `block_table` int32 [B, max_pages] (contiguous) or None: k, v
    are then page pools [num_pages, page_size, Hkv, D] and the capacity is max_pages·page_size."""
    q, k, v = readable(q), readable(k), readable(v)
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    page_size = num_pages = 0
    if block_table is not None:
        page_size, num_pages = k.shape[1], k.shape[0]
        sk = block_table.shape[1] * page_size
    dev = q.device
    stream = current_stream(dev.index)
    shape = (b, sq, sk, hq, hkv, d)
    workspace = None
    if sq <= _DECODE_MAX_SEQLEN_Q and lengths is None:
        # Decode mode's split partials: scratch from torch's allocator on this stream (reused
        # only by work ordered after this call).
        n = _workspace_bytes(_DTYPES[q.dtype], shape, bool(causal), kv_lengths is not None)
        if n:
            workspace = torch.empty(n, dtype=torch.uint8, device=dev)
    _native.attention(
        dev.index,
        stream,
        _DTYPES[q.dtype],
        shape,
        bool(causal),
        scale,
        _desc(q),
        _desc(k),
        _desc(v),
        _desc(out),
        lse.data_ptr() if lse is not None else 0,
        lengths.data_ptr() if lengths is not None else 0,
        workspace.data_ptr() if workspace is not None else 0,
        kv_lengths.data_ptr() if kv_lengths is not None else 0,
        kv_secret=bool(kv_secret),
        block_table=block_table.data_ptr() if block_table is not None else 0,
        page_size=page_size,
        num_pages=num_pages,
    )


@functools.lru_cache(maxsize=1024)
def _workspace_bytes(dtype, shape, causal, kv_lengths):
    """The decode workspace size of a shape, asked of Rust once per shape (a pure function)."""
    return _native.workspace_bytes(dtype, shape, causal, kv_lengths=kv_lengths)


def prepare_kv(device, dtype, shape, causal, scale, secret=False, pages=(0, 0)):
    _native.prepare(torch.device(device).index or 0, _DTYPES[dtype], shape, bool(causal), scale, kv_lengths=True,
                    kv_secret=bool(secret), page_size=pages[0], num_pages=pages[1])


def prepare(device, dtype, shape, causal, scale, secret_lengths=False):
    _native.prepare(torch.device(device).index or 0, _DTYPES[dtype], shape, bool(causal), scale, secret_lengths)
