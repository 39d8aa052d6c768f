"""Training: the backward of ``torch.ops.flashcore.attention``.

``torch.library.register_autograd`` gives the forward op a backward that saves q, k, v, the output
and the log-sum-exp, and calls ``torch.ops.flashcore.attention_backward`` — a custom op of its own
(opaque to ``torch.compile``, with a fake implementation), which runs flashcore's Rust backward
(``ExternalContext::attention_backward``: three kernels, bitwise deterministic, batch-invariant)
on torch's current stream. dK and dV of grouped-query attention are summed over each group.

The log-sum-exp output is not differentiable (it comes back with ``requires_grad=False``): a loss
that uses it gets no gradient through it. Secret lengths have no backward (a clear error).
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


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, bhsd, return_lse, lengths = inputs[:8]
    extra = inputs[8:]  # window_left, window_right, softcap, sinks (issue 24), when given
    ctx.features = bool(extra) and (tuple(extra[:2]) != (-1, -1) or (len(extra) > 2 and extra[2] != 0.0)
                                    or (len(extra) > 3 and extra[3] is not None))
    ctx.n_inputs = len(inputs)
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.bhsd = causal, scale, bhsd
    ctx.secret_lengths = lengths is not None


def _backward(ctx, grad_out, grad_lse):
    if ctx.secret_lengths:
        raise RuntimeError(
            "flashcore: secret_lengths has no backward pass: train on unpadded sequences, or compute "
            "this call under torch.no_grad()"
        )
    if ctx.features:
        raise RuntimeError(
            "flashcore: window_size, softcap and learnable_sink have no backward pass yet: call it under "
            "torch.no_grad() or torch.inference_mode(), or .detach() the inputs"
        )
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.bhsd)
    want = ctx.needs_input_grad
    return (dq if want[0] else None, dk if want[1] else None, dv if want[2] else None) + (None,) * (ctx.n_inputs - 3)


ops.attention_op.register_autograd(_backward, setup_context=_setup_context)
