"""Training: the backward of ``torch.ops.flashcore.attention``.

``torch.library.register_autograd`` gives the forward op a backward that saves q, k, v, the output
and the log-sum-exp, and calls ``torch.ops.flashcore.attention_backward`` — a custom op of its own
(opaque to ``torch.compile``, with a fake implementation), which runs flashcore's Rust backward
(``ExternalContext::attention_backward``: three kernels, bitwise deterministic, batch-invariant)
on torch's current stream. dK and dV of grouped-query attention are summed over each group.

The log-sum-exp output is not differentiable (it comes back with ``requires_grad=False``): a loss
that uses it gets no gradient through it. Secret lengths have no backward (a clear error).

A call with a sliding window, a softcap or learnable sinks runs
``torch.ops.flashcore.attention_backward_features`` instead (the same kernels' window and softcap
builds), which also returns the sinks' gradient (fp32 [Hq]; empty without sinks): the sinks
tensor may require grad.
"""

from typing import Optional, Tuple

import torch

from . import _checks, ops
from ._launch import dense, launch_backward


def _layout(bhsd):
    return "bhsd" if bhsd else "bshd"


def _grads_like(q, k):
    # Contiguous in the call's layout: the shapes are already in its index order.
    c = torch.contiguous_format
    return torch.empty_like(q, memory_format=c), torch.empty_like(k, memory_format=c), torch.empty_like(k, memory_format=c)


@torch.library.custom_op("flashcore::attention_backward", mutates_args=())
def attention_backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: Optional[float],
    bhsd: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``torch.ops.flashcore.attention(q, k, v, causal, scale, bhsd, ...)`` from its
    output `out`, its log-sum-exp `lse` and the output gradient `grad_out`; contiguous, in the
    inputs' layout and dtype."""
    _checks.check_backward(grad_out, q, k, v, out, lse, _layout(bhsd))
    scale = _checks.check_scale(scale)
    dq, dk, dv = _grads_like(q, k)
    launch_backward(dense(grad_out), q, k, v, dense(out), lse.contiguous(), dq, dk, dv, causal, scale, bhsd=bhsd)
    return dq, dk, dv


@attention_backward_op.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, causal, scale, bhsd):
    _checks.check_backward(grad_out, q, k, v, out, lse, _layout(bhsd))
    _checks.check_scale(scale)
    return _grads_like(q, k)


@torch.library.custom_op("flashcore::attention_backward_features", mutates_args=())
def attention_backward_features_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: Optional[float],
    bhsd: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    sinks: Optional[torch.Tensor],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsink) of ``torch.ops.flashcore.attention(q, k, v, causal, scale, bhsd, ...,
    window_left, window_right, softcap, sinks)``: as ``attention_backward``, plus the sinks'
    gradient dsink (fp32 [Hq]; empty when `sinks` is None)."""
    shape = _checks.check_backward(grad_out, q, k, v, out, lse, _layout(bhsd))
    scale = _checks.check_scale(scale)
    window, softcap, sinks = _checks.check_features((window_left, window_right), softcap, sinks, q, shape[3])
    dq, dk, dv = _grads_like(q, k)
    dsink = _dsink_like(sinks, q)
    launch_backward(dense(grad_out), q, k, v, dense(out), lse.contiguous(), dq, dk, dv, causal, scale, bhsd=bhsd,
                    window=window, softcap=softcap, sinks=sinks, dsink=dsink)
    return dq, dk, dv, dsink


def _dsink_like(sinks, q):
    return torch.empty((0,) if sinks is None else sinks.shape, dtype=torch.float32, device=q.device)


@attention_backward_features_op.register_fake
def _attention_backward_features_fake(grad_out, q, k, v, out, lse, causal, scale, bhsd, window_left, window_right,
                                      softcap, sinks):
    shape = _checks.check_backward(grad_out, q, k, v, out, lse, _layout(bhsd))
    _checks.check_scale(scale)
    _checks.check_features((window_left, window_right), softcap, sinks, q, shape[3])
    return _grads_like(q, k) + (_dsink_like(sinks, q),)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, bhsd, return_lse, lengths = inputs[:8]
    extra = inputs[8:]  # window_left, window_right, softcap, sinks, when given
    extra = tuple(extra) + (-1, -1, 0.0, None)[len(extra):]
    ctx.window, ctx.softcap = (extra[0], extra[1]), extra[2]
    sinks = extra[3]
    ctx.features = ctx.window != (-1, -1) or ctx.softcap != 0.0 or sinks is not None
    ctx.n_inputs = len(inputs)
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.causal, ctx.scale, ctx.bhsd = causal, scale, bhsd
    ctx.secret_lengths = lengths is not None


def _backward(ctx, grad_out, grad_lse):
    if ctx.secret_lengths:
        raise RuntimeError(
            "flashcore: secret_lengths has no backward pass: train on unpadded sequences, or compute "
            "this call under torch.no_grad()"
        )
    q, k, v, out, lse, sinks = ctx.saved_tensors
    want = ctx.needs_input_grad
    if ctx.features:
        dq, dk, dv, dsink = attention_backward_features_op(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale,
                                                           ctx.bhsd, ctx.window[0], ctx.window[1], ctx.softcap, sinks)
        grads = [dq if want[0] else None, dk if want[1] else None, dv if want[2] else None]
        grads += [None] * (ctx.n_inputs - 3)
        if ctx.n_inputs > 11 and sinks is not None and want[11]:
            grads[11] = dsink
        return tuple(grads)
    dq, dk, dv = attention_backward_op(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.bhsd)
    return (dq if want[0] else None, dk if want[1] else None, dv if want[2] else None) + (None,) * (ctx.n_inputs - 3)


ops.attention_op.register_autograd(_backward, setup_context=_setup_context)
