"""Training through varlen: the backward of ``torch.ops.flashcore.attention_varlen``.

``torch.library.register_autograd`` gives the varlen op a backward that saves q, k, v, the output,
the log-sum-exp and the pack's metadata, and calls ``torch.ops.flashcore.attention_varlen_backward``
— a custom op of its own (opaque to ``torch.compile``, with a fake implementation) running
flashcore's Rust varlen backward (``ExternalContext::attention_varlen_backward``: the dense
backward's two-pass kernels, each CTA reading its sequence from ``cu_seqlens`` on the device) on
torch's current stream. No host synchronisation: the ``cu_seqlens`` values are never read on the
host. Bitwise deterministic; a sequence's gradient bits do not depend on its neighbours in the pack.

The backward needs the LSE: ``flash_attn_varlen_func`` asks the forward for it whenever autograd
records the call; a direct call of the op with ``return_lse=False`` has no backward (a clear
error). ``seqused_k`` and ``seqused_q`` train (dQ rows of no sequence's used queries are 0). Issue
24's sliding windows (each aligned to its sequence's own lengths), softcap and learnable sinks
train through ``torch.ops.flashcore.attention_varlen_backward_features`` (the sinks' gradient
summed over every sequence's rows). No backward for ``secret_lengths`` (refused up front by
``flash_attn_varlen_func``).
"""

from typing import Optional, Tuple

import torch

from . import _checks, _native
from ._launch import _DTYPES, current_stream
from .varlen import _check, _desc, _readable, _shape, attention_varlen_op


def _check_grads_in(grad_out, q, out, lse, hq):
    total = q.shape[0]
    for name, t in (("grad_out", grad_out), ("out", out)):
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"flashcore: `{name}` must match q ({tuple(q.shape)}, {q.dtype}), got "
                             f"{tuple(t.shape)}, {t.dtype} on {t.device}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (hq, total) or lse.device != q.device:
        raise ValueError(f"flashcore: the varlen backward needs the forward's LSE, float32 [{hq}, {total}]: got "
                         f"{tuple(lse.shape)}, {lse.dtype} (run the forward with return_lse=True)")


def _grads(q, k, zero_q, zero_k):
    # With seqused_q / seqused_k, rows past a sequence's used tokens may lie past max_seqlen of
    # its cu_seqlens range (the HF backend's pack of a padded batch): the kernels, bounded by
    # max_seqlen, never reach them, and their gradient is 0.
    c = torch.contiguous_format
    new = lambda t, z: torch.zeros_like(t, memory_format=c) if z else torch.empty_like(t, memory_format=c)  # noqa: E731
    return new(q, zero_q), new(k, zero_k), new(k, zero_k)


@torch.library.custom_op("flashcore::attention_varlen_backward", mutates_args=())
def attention_varlen_backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: Optional[torch.Tensor],
    seqused_q: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: Optional[float],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``torch.ops.flashcore.attention_varlen`` (same arguments) from its output,
    its LSE fp32 [Hq, total_q] and the output gradient; contiguous packed, the inputs' dtype."""
    b, hq, _, d = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    _checks.check_varlen_backward_head_dim(d)
    _check_grads_in(grad_out, q, out, lse, hq)
    scale = _checks.check_scale(scale)
    dq, dk, dv = _grads(q, k, seqused_q is not None, seqused_k is not None)
    if q.shape[0] == 0 or k.shape[0] == 0 or b == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    q, k, v = _readable(q), _readable(k), _readable(v)
    dev = q.get_device()
    dtype = _DTYPES[q.dtype]
    shape = _shape(b, max_seqlen_q, max_seqlen_k, hq, k.shape[1], d)
    ws = torch.empty(max(_native.varlen_backward_workspace_bytes(dtype, shape, bool(causal)), 16), dtype=torch.uint8,
                     device=q.device)
    grad_out, out, lse = grad_out.contiguous(), out.contiguous(), lse.contiguous()
    _native.attention_varlen_backward(
        dev, current_stream(dev), dtype, shape, bool(causal), scale, _desc(q), _desc(k), _desc(v),
        (q.shape[0], k.shape[0]),
        (out.data_ptr(), lse.data_ptr(), grad_out.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
         ws.data_ptr()),
        (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), seqused_k.data_ptr() if seqused_k is not None else 0,
         seqused_q.data_ptr() if seqused_q is not None else 0),
    )
    return dq, dk, dv


@attention_varlen_backward_op.register_fake
def _attention_varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q,
                                    max_seqlen_q, max_seqlen_k, causal, scale):
    _, hq, _, d = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    _checks.check_varlen_backward_head_dim(d)
    _check_grads_in(grad_out, q, out, lse, hq)
    _checks.check_scale(scale)
    return _grads(q, k, False, False)


@torch.library.custom_op("flashcore::attention_varlen_backward_features", mutates_args=())
def attention_varlen_backward_features_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_k: Optional[torch.Tensor],
    seqused_q: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    scale: Optional[float],
    window_left: int,
    window_right: int,
    softcap: float,
    sinks: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) of ``torch.ops.flashcore.attention_varlen`` with its window,
    softcap and sinks: as ``attention_varlen_backward``, plus the sinks' gradient (fp32 [Hq], summed
    over every sequence's rows; empty when `sinks` is None)."""
    b, hq, _, d = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    _checks.check_varlen_backward_head_dim(d)
    _check_grads_in(grad_out, q, out, lse, hq)
    scale = _checks.check_scale(scale)
    window, softcap, sinks = _checks.check_features((window_left, window_right), softcap, sinks, q, hq)
    dq, dk, dv = _grads(q, k, seqused_q is not None, seqused_k is not None)
    dsink = _dsink_like(sinks, q)
    if q.shape[0] == 0 or k.shape[0] == 0 or b == 0:
        # No row sees a key: O = 0 everywhere, so dsink = 0 too.
        return dq.zero_(), dk.zero_(), dv.zero_(), dsink.zero_()
    q, k, v = _readable(q), _readable(k), _readable(v)
    dev = q.get_device()
    dtype = _DTYPES[q.dtype]
    shape = _shape(b, max_seqlen_q, max_seqlen_k, hq, k.shape[1], d)
    ws = torch.empty(max(_native.varlen_backward_workspace_bytes(dtype, shape, bool(causal)), 16), dtype=torch.uint8,
                     device=q.device)
    grad_out, out, lse = grad_out.contiguous(), out.contiguous(), lse.contiguous()
    _native.attention_varlen_backward(
        dev, current_stream(dev), dtype, shape, bool(causal), scale, _desc(q), _desc(k), _desc(v),
        (q.shape[0], k.shape[0]),
        (out.data_ptr(), lse.data_ptr(), grad_out.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
         ws.data_ptr()),
        (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), seqused_k.data_ptr() if seqused_k is not None else 0,
         seqused_q.data_ptr() if seqused_q is not None else 0),
        window=window, softcap=softcap, sinks=sinks.data_ptr() if sinks is not None else 0,
        dsink=dsink.data_ptr() if sinks is not None else 0,
    )
    return dq, dk, dv, dsink


def _dsink_like(sinks, q):
    return torch.empty((0,) if sinks is None else sinks.shape, dtype=torch.float32, device=q.device)


@attention_varlen_backward_features_op.register_fake
def _attention_varlen_backward_features_fake(grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                             seqused_q, max_seqlen_q, max_seqlen_k, causal, scale, window_left,
                                             window_right, softcap, sinks):
    _, hq, _, d = _check(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, seqused_q)
    _checks.check_varlen_backward_head_dim(d)
    _check_grads_in(grad_out, q, out, lse, hq)
    _checks.check_scale(scale)
    _checks.check_features((window_left, window_right), softcap, sinks, q, hq)
    return _grads(q, k, False, False) + (_dsink_like(sinks, q),)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, return_lse, seqused_q = inputs[:12]
    extra = tuple(inputs[12:]) + (-1, -1, 0.0, None)[len(inputs[12:]):]  # window, softcap, sinks
    ctx.window, ctx.softcap = (extra[0], extra[1]), extra[2]
    sinks = extra[3]
    ctx.features = ctx.window != (-1, -1) or ctx.softcap != 0.0 or sinks is not None
    ctx.n_inputs = len(inputs)
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, seqused_q, sinks)
    ctx.max_q, ctx.max_k, ctx.causal, ctx.scale, ctx.return_lse = max_q, max_k, causal, scale, return_lse


def _backward(ctx, grad_out, grad_lse):
    if not ctx.return_lse:
        raise RuntimeError(
            "flashcore: torch.ops.flashcore.attention_varlen ran with return_lse=False, and its backward needs the "
            "LSE: pass return_lse=True when training (flash_attn_varlen_func does)"
        )
    q, k, v, out, lse, cu_q, cu_k, seqused_k, seqused_q, sinks = ctx.saved_tensors
    want = ctx.needs_input_grad
    if ctx.features:
        dq, dk, dv, dsink = attention_varlen_backward_features_op(
            grad_out, q, k, v, out, lse, cu_q, cu_k, seqused_k, seqused_q, ctx.max_q, ctx.max_k, ctx.causal,
            ctx.scale, ctx.window[0], ctx.window[1], ctx.softcap, sinks)
        grads = [dq if want[0] else None, dk if want[1] else None, dv if want[2] else None]
        grads += [None] * (ctx.n_inputs - 3)
        if ctx.n_inputs > 15 and sinks is not None and want[15]:
            grads[15] = dsink
        return tuple(grads)
    dq, dk, dv = attention_varlen_backward_op(grad_out, q, k, v, out, lse, cu_q, cu_k, seqused_k, seqused_q,
                                              ctx.max_q, ctx.max_k, ctx.causal, ctx.scale)
    return (dq if want[0] else None, dk if want[1] else None, dv if want[2] else None) + (None,) * (ctx.n_inputs - 3)


attention_varlen_op.register_autograd(_backward, setup_context=_setup_context)
