"""Packed variable-length batches with flash-attn's conventions: ``flash_attn_varlen_func``.

Q is ``[total_q, Hq, D]``, K and V ``[total_k, Hkv, D]``: the sequences of a batch laid end to
end, sequence b owning tokens ``cu_seqlens[b] .. cu_seqlens[b + 1]`` (int32 ``[B + 1]`` prefix
sums on the device; public metadata, docs/design.md §1). The kernel's work list — one item per
128-row query tile, sequence by sequence, heaviest sequence first — is built on the device from ``cu_seqlens`` (and
``seqused_k``) on the caller's stream: no host synchronisation, so the call runs inside CUDA
graphs and ``torch.compile(fullgraph=True)``. The custom op is ``torch.ops.flashcore.attention_varlen``.

The ``cu_seqlens`` values are not checked on the host (that would need a synchronisation):
values that are not the pack's prefix sums, or sequences longer than ``max_seqlen_q`` /
``max_seqlen_k``, give wrong rows — never an access outside the tensors (the device clamps every
offset into the pack). ``check_cu_seqlens`` checks them on demand (it reads them: a sync).

``secret_lengths=`` (self-attention packs) keeps each sequence's true length within its public
slot secret: the slots are gathered into a dense padded batch and the dense secret-length kernel
runs over it (``_secret_len_varlen``; docs/security.md, "Varlen with secret lengths").

Each CUDA stream gets its own instance of the varlen kernel (the work list lives in the module's
constant memory), loaded on the stream's first call. A first call inside a CUDA graph capture
loads it there (``torch.cuda.graph``'s capture stream is its own stream; this worked in the GPU
tests, driver 580 / CUDA 13); ``prepare`` loads it beforehand for a given stream, so a capture
never depends on that.
"""

from typing import Optional, Tuple

import torch

from . import _checks, _native
from ._launch import _DTYPES, current_stream


def _check_meta(name, t, n, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashcore: `{name}` must be an int32 torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"flashcore: `{name}` must be int32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"flashcore: `{name}` is on {t.device}, q on {device}")
    if t.dim() != 1 or (n is not None and t.shape[0] != n):
        want = f"({n},)" if n is not None else "1-D"
        raise ValueError(f"flashcore: `{name}` must have shape {want}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"flashcore: `{name}` must be contiguous")


def _check(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, seqused_q=None):
    """Shapes, dtypes and devices (no value of a device tensor is read). Returns (B, Hq, Hkv, D)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashcore: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"flashcore: `{name}` must be [total, heads, head_dim], got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"flashcore: `{name}` must be float16 or bfloat16, got {t.dtype}")
        if t.device.type != "cuda" and t.device.type != "meta":
            raise ValueError(f"flashcore: `{name}` must be a CUDA tensor, got {t.device}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"flashcore: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"flashcore: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"flashcore: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    _, hq, d = q.shape
    _, hkv, dk = k.shape
    if dk != d:
        raise ValueError(f"flashcore: q has head dim {d} but k has {dk}")
    if d not in _native.SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"flashcore: head dim {d} is not supported "
            f"(supported: {', '.join(map(str, _native.SUPPORTED_HEAD_DIMS))})"
        )
    if hq == 0 or hkv == 0 or hq % hkv:
        raise ValueError(f"flashcore: heads_q ({hq}) must be a positive multiple of heads_kv ({hkv})")
    _check_meta("cu_seqlens_q", cu_q, None, q.device)
    b = cu_q.shape[0] - 1
    if b < 0:
        raise ValueError("flashcore: `cu_seqlens_q` needs batch + 1 >= 1 entries")
    _check_meta("cu_seqlens_k", cu_k, b + 1, q.device)
    if seqused_k is not None:
        _check_meta("seqused_k", seqused_k, b, q.device)
    if seqused_q is not None:
        _check_meta("seqused_q", seqused_q, b, q.device)
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"flashcore: `{name}` must be a non-negative int, got {m!r}")
    if max_q == 0 and q.shape[0] > 0:
        raise ValueError("flashcore: max_seqlen_q is 0 but q holds tokens")
    return b, hq, hkv, d


def _outputs(q, return_lse, uncovered=False):
    """(out, lse). `uncovered`: rows may belong to no sequence (seqused_q): those read 0 / −inf."""
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    if uncovered:
        out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)
    else:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return out, lse


def _desc(t):
    st = t.stride()
    return (t.data_ptr(), (0, st[0], st[1]))


def _readable(t):
    """`t`, or a contiguous copy where TMA cannot read it (head dim not contiguous, 16-byte rule)."""
    st = t.stride()
    ok = (st[2] == 1 or t.shape[2] <= 1) and t.data_ptr() % 16 == 0
    ok = ok and all(t.shape[i] <= 1 or (st[i] > 0 and st[i] % 8 == 0) for i in (0, 1))
    return t if ok else t.contiguous()


def _shape(b, max_q, max_k, hq, hkv, d):
    # The kernels take sizes of at least 1; max_seqlen_k only bounds the contract (an empty pack
    # of keys is fine).
    return (b, max(max_q, 1), max(max_k, 1), hq, hkv, d)


class VarlenCall:
    """One checked varlen forward call, built once where its arguments are checked and read by
    `_run`: packed q, k, v; the pack's metadata `cu_q`, `cu_k`, `seqused_k`, `seqused_q`, `max_q`,
    `max_k`; `causal`, `scale` (checked, or None), `return_lse`; `window`, `softcap`, `sinks` as
    `_checks.check_features` returns them; `dims` (B, Hq, Hkv, D) as `_check` returns them."""

    __slots__ = ("q", "k", "v", "cu_q", "cu_k", "seqused_k", "seqused_q", "max_q", "max_k", "causal", "scale",
                 "return_lse", "window", "softcap", "sinks", "dims")

    def __init__(self, q, k, v, cu_q, cu_k, seqused_k, seqused_q, max_q, max_k, causal, scale, return_lse, window,
                 softcap, sinks, dims):
        self.q, self.k, self.v = q, k, v
        self.cu_q, self.cu_k, self.seqused_k, self.seqused_q, self.max_q, self.max_k = (
            cu_q, cu_k, seqused_k, seqused_q, max_q, max_k)
        self.causal, self.scale, self.return_lse = causal, scale, return_lse
        self.window, self.softcap, self.sinks, self.dims = window, softcap, sinks, dims


def _feature_kwargs(window, softcap, sinks):
    """The native varlen call's keyword arguments for a window, a softcap and sinks (only those
    given: the defaults mean none)."""
    feats = {}
    if tuple(window) != (-1, -1):
        feats["window"] = tuple(window)
    if softcap:
        feats["softcap"] = softcap
    if sinks is not None:
        feats["sinks"] = sinks.data_ptr()
    return feats


def _run(call):
    """The op's body on a checked call (`VarlenCall`): its outputs, and the one native call.
    Returns (out, lse)."""
    b, hq, hkv, d = call.dims
    q, k, v = call.q, call.k, call.v
    window, softcap, sinks, seqused_k, seqused_q = call.window, call.softcap, call.sinks, call.seqused_k, call.seqused_q
    out, lse = _outputs(q, call.return_lse, seqused_q is not None)
    if q.shape[0] == 0 or b == 0:
        return out, lse
    q, k, v = _readable(q), _readable(k), _readable(v)
    dev = q.get_device()
    stream = current_stream(dev)
    dtype = _DTYPES[q.dtype]
    shape = _shape(b, call.max_q, call.max_k, hq, hkv, d)
    causal = bool(call.causal)
    n = _native.varlen_workspace_bytes(dtype, shape, causal)
    feats = _feature_kwargs(window, softcap, sinks)
    ws = torch.empty(max(n, 16), dtype=torch.uint8, device=q.device)
    k_ptr = k.data_ptr() if k.numel() else ws.data_ptr()  # no key anywhere: never read
    v_ptr = v.data_ptr() if v.numel() else ws.data_ptr()
    _native.attention_varlen(
        dev, stream, dtype, shape, causal, call.scale,
        _desc(q), (k_ptr, _desc(k)[1]), (v_ptr, _desc(v)[1]), _desc(out),
        (q.shape[0], k.shape[0]), lse.data_ptr() if call.return_lse else 0,
        (call.cu_q.data_ptr(), call.cu_k.data_ptr(), seqused_k.data_ptr() if seqused_k is not None else 0,
         seqused_q.data_ptr() if seqused_q is not None else 0),
        ws.data_ptr(),
        **feats,
    )
    return out, lse


@torch.library.custom_op("flashcore::attention_varlen", mutates_args=())
def attention_varlen_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: Optional[float],
    return_lse: bool,
    seqused_q: Optional[torch.Tensor],
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Varlen attention of packed q [total_q, Hq, D] over k, v [total_k, Hkv, D]. Returns
    (out [total_q, Hq, D], lse fp32 [Hq, total_q], empty unless `return_lse`). With `seqused_q`,
    rows that belong to no sequence's used queries read 0 (lse −inf). A sliding window
    (flash-attn's window_size, −1 unbounded; per sequence, bottom-right aligned to its counts), a
    softcap (0 off) and learnable sinks (fp32 [Hq], or None)."""
    scale = _checks.check_scale(scale)
    dims = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    window, softcap, sinks = _checks.check_features((window_left, window_right), softcap, sinks, q, dims[1])
    return _run(VarlenCall(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q, max_seqlen_q, max_seqlen_k,
                           causal, scale, return_lse, window, softcap, sinks, dims))


@attention_varlen_op.register_fake
def _attention_varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, scale,
                           return_lse, seqused_q, window_left=-1, window_right=-1, softcap=0.0, sinks=None):
    _, hq, _, _ = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    _checks.check_scale(scale)
    _checks.check_features((window_left, window_right), softcap, sinks, q, hq)
    return _outputs(q, return_lse)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_k=None,
    seqused_q=None,
    return_lse=False,
    learnable_sink=None,
    secret_lengths=None,
):
    """flash-attn's ``flash_attn_varlen_func`` (inference): q ``[total_q, Hq, D]``, k and v
    ``[total_k, Hkv, D]`` (GQA: Hq a multiple of Hkv), float16 or bfloat16, D in ``flashcore.SUPPORTED_HEAD_DIMS``;
    ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 ``[B + 1]`` on q's device; ``max_seqlen_q`` /
    ``max_seqlen_k`` Python ints bounding every sequence (the launch count derives from
    ``B · ceil(max_seqlen_q / 128)``). ``causal`` is bottom-right aligned per sequence (query i of
    a sequence of Sq queries over Sk keys sees keys j ≤ i + Sk − Sq), as in flash-attn ≥ 2.1.
    ``seqused_k`` (int32 ``[B]``): sequence b attends to its first ``seqused_k[b]`` keys only;
    ``seqused_q`` (int32 ``[B]``, as flash-attn 3's): only its first ``seqused_q[b]`` queries are
    computed, and every row of q no sequence uses reads 0 in `out` (−inf in the LSE) — a padded
    batch ``[B, S, H, D]`` runs as the pack ``[B·S, H, D]`` with ``cu_seqlens = b·S + first
    real token`` and ``seqused = real tokens``, with no unpadding copy.
    Empty sequences are fine (no keys: O = 0, LSE = −inf). Returns `out`; with
    `return_attn_probs` ``(out, softmax_lse, None)``, with `return_lse` ``(out, softmax_lse)``;
    ``softmax_lse`` is fp32 ``[Hq, total_q]``. Per sequence: `window_size=(left,
    right)` (−1 unbounded; `causal` sets right = 0): query i of a sequence of Sq queries over Sk
    keys sees key j iff i + Sk − Sq − left ≤ j ≤ i + Sk − Sq + right, whole key blocks outside
    skipped; `softcap` (scores softcap · tanh(scale · q·k / softcap)); `learnable_sink` (FA4's
    name; ``[Hq]``, any float dtype, taken as fp32: one logit per query head joins each row's
    softmax denominator, gpt-oss). Not supported (ValueError): dropout, ALiBi, a block table;
    Training (``varlen_autograd``): gradients flow to q, k, v (every head dim;
    with ``seqused_k`` / ``seqused_q``, a window, softcap and sinks too — the sink's
    gradient summed over the pack), with no host synchronisation; ``secret_lengths`` under grad
    raises RuntimeError (no backward for it yet). `deterministic` is
    accepted: flashcore is bitwise deterministic, and each sequence's bits (outputs and gradients)
    do not depend on its neighbours in the pack.

    ``secret_lengths`` (int32 ``[B]`` on q's device): **secret true lengths inside public slots**
    (docs/security.md). The pack is self-attention: pass the same tensor as ``cu_seqlens_q`` and
    ``cu_seqlens_k`` (its slots, public) and ``max_seqlen_q == max_seqlen_k`` (the slot bound);
    sequence b is the first ``secret_lengths[b]`` tokens of its slot ``cu_seqlens[b] ..
    cu_seqlens[b + 1]``, for queries and keys alike (0 ≤ length ≤ slot size; causal: query i sees
    keys 0..i of its sequence). Rows of `out` from a sequence's length to its slot's end read 0
    (LSE −inf). The slots are gathered into a dense ``[B, max_seqlen, H, D]`` batch (zeros past
    each slot), the dense secret-length kernel runs over it, and the slots' rows are gathered
    back: time depends on B, ``max_seqlen``, the slots, heads and dims, never on the lengths
    (they are read by the kernel only, through selects). Not with ``seqused_k`` / ``seqused_q``.
    A length past its slot (outside the contract) gives that sequence wrong rows (its keys past
    the slot are the zero padding), no access outside the tensors.
    """
    unsupported = {
        "dropout_p": dropout_p != 0.0,
        "alibi_slopes": alibi_slopes is not None,
        "block_table": block_table is not None,
    }
    for name, given in unsupported.items():
        if given:
            raise ValueError(f"flashcore: flash_attn_varlen_func does not support {name} yet")
    sink_t = learnable_sink if isinstance(learnable_sink, torch.Tensor) else None
    grad = _checks.needs_grad(q, k, v, sink_t)
    if secret_lengths is not None:
        _checks.check_no_grad("flash_attn_varlen_func with secret_lengths", q, k, v, sink_t)
    if grad and secret_lengths is None:
        # The sink's gradient flows back through its fp32 conversion (not detached).
        window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
        window, softcap, sinks = _checks.check_features(window, softcap, _checks.sinks_f32_grad(learnable_sink), q,
                                                        q.shape[-2])
    else:
        window, softcap, sinks = _checks.features(window_size, softcap, learnable_sink, q, q.shape[-2])
    want_lse = bool(return_attn_probs) or bool(return_lse)
    if grad:
        _checks.check_varlen_backward_head_dim(q.shape[-1])
    if secret_lengths is not None:
        if window != (-1, -1) or softcap != 0.0 or sinks is not None:
            raise ValueError("flashcore: window_size, softcap and learnable_sink are not supported with "
                             "secret_lengths yet")
        out, lse = _secret_len_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                      seqused_q, secret_lengths, bool(causal), softmax_scale, want_lse)
        if return_attn_probs:
            return out, lse, None
        return (out, lse) if return_lse else out
    # The backward needs the LSE: computed whenever autograd records the call.
    out, lse = attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                   bool(causal), softmax_scale, want_lse or grad, seqused_q, window[0], window[1],
                                   softcap, sinks)
    if return_attn_probs:
        return out, lse, None
    return (out, lse) if return_lse else out


def _check_secret_len(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, seqused_q, lengths):
    """The public checks of a secret-length varlen call (no device value is read). Returns B."""
    for name, t in (("seqused_k", seqused_k), ("seqused_q", seqused_q)):
        if t is not None:
            raise ValueError(f"flashcore: secret_lengths cannot be combined with {name} (a public length)")
    if cu_k is not cu_q:
        raise ValueError("flashcore: secret_lengths is self-attention: pass the same cu_seqlens tensor as "
                         "cu_seqlens_q and cu_seqlens_k")
    if max_q != max_k:
        raise ValueError(f"flashcore: secret_lengths needs max_seqlen_q == max_seqlen_k (the slot bound), "
                         f"got {max_q} and {max_k}")
    b, _, _, _ = _check(q, k, v, cu_q, cu_k, None, max_q, max_k)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"flashcore: secret_lengths is self-attention: k holds {k.shape[0]} tokens, "
                         f"q {q.shape[0]}")
    _check_meta("secret_lengths", lengths, b, q.device)
    return b


def _secret_len_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, seqused_q, lengths, causal, scale, want_lse):
    """Secret lengths in public slots: gather the slots into a dense padded batch (addresses from
    cu_seqlens only), run the dense secret-length call, gather the slots' rows back."""
    from .api import attention

    b = _check_secret_len(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, seqused_q, lengths)
    total, hq, d = q.shape
    out, lse = _outputs(q, want_lse)
    if total == 0 or b == 0:
        return out, lse
    s = max_q
    dev = q.device
    starts = cu_q[:-1].long()
    sizes = (cu_q[1:] - cu_q[:-1]).long()
    pos = torch.arange(s, device=dev)
    inside = pos[None, :] < sizes[:, None]  # [B, S]: rows of the dense batch that a slot fills
    src = (starts[:, None] + pos[None, :]).clamp_(0, total - 1).flatten()

    def pad(t):
        g = t.index_select(0, src).view(b, s, t.shape[1], d)
        return torch.where(inside[:, :, None, None], g, torch.zeros((), dtype=t.dtype, device=dev))

    r = attention(pad(q), pad(k), pad(v), causal=causal, scale=scale, layout="bshd", return_lse=want_lse,
                  secret_lengths=lengths)
    dense_out, dense_lse = r if want_lse else (r, None)
    # Each packed row's place in the dense batch: its slot b (how many slot ends lie at or before
    # it: a 1 at each end, summed up to the row) and its position in the slot. (No searchsorted
    # over a slice of cu_seqlens: inductor's GPU lowering of searchsorted reads a sliced boundaries
    # tensor from its base, and the compiled call gave zero rows on the H100.)
    ends = torch.zeros(total + 1, dtype=torch.int64, device=dev)
    ends.index_add_(0, cu_q[1:].long().clamp(0, total), torch.ones(b, dtype=torch.int64, device=dev))
    seq = ends[:total].cumsum(0).clamp_(0, b - 1)
    at = torch.arange(total, device=dev) - starts[seq]
    ok = (at >= 0) & (at < s)  # always, for cu_seqlens within the contract
    flat = seq * s + at.clamp(0, s - 1)
    out = dense_out.reshape(b * s, hq, d).index_select(0, flat)
    out = torch.where(ok[:, None, None], out, torch.zeros((), dtype=out.dtype, device=dev))
    if want_lse:
        lse = dense_lse.permute(1, 0, 2).reshape(hq, b * s).index_select(1, flat)
        lse = torch.where(ok[None, :], lse, torch.full((), float("-inf"), device=dev))
    return out, lse


def check_cu_seqlens(cu_seqlens, total, max_seqlen, name="cu_seqlens"):
    """Checks a ``cu_seqlens`` tensor's values (starts at 0, non-decreasing, ends at `total`, no
    sequence longer than `max_seqlen`): reads it to the host, a synchronisation — for debugging
    and tests, never in the hot path."""
    c = cu_seqlens.tolist()
    if not c or c[0] != 0:
        raise ValueError(f"flashcore: `{name}` must start at 0")
    for i in range(1, len(c)):
        if c[i] < c[i - 1]:
            raise ValueError(f"flashcore: `{name}` must be non-decreasing: entry {i} is {c[i]} after {c[i - 1]}")
        if c[i] - c[i - 1] > max_seqlen:
            raise ValueError(f"flashcore: `{name}`: sequence {i - 1} has {c[i] - c[i - 1]} tokens, more than {max_seqlen}")
    if c[-1] != total:
        raise ValueError(f"flashcore: `{name}` ends at {c[-1]}, the packed tensor holds {total} tokens")


def prepare(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, *, causal=False, stream=None, softcap=0.0):
    """Loads the varlen kernel of this shape for `stream` (default: the current stream) without
    launching: before capturing a CUDA graph on a stream that has not run a varlen call. A
    `softcap` > 0 loads the softcap build its calls use (windows and sinks need no other)."""
    dev = q.get_device()
    s = current_stream(dev) if stream is None else stream.cuda_stream
    b = cu_seqlens_q.shape[0] - 1
    shape = _shape(b, max_seqlen_q, max_seqlen_k, q.shape[1], k.shape[1], q.shape[2])
    _native.prepare_varlen(dev, s, _DTYPES[q.dtype], shape, bool(causal), float(softcap))
