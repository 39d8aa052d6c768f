"""The torch custom op behind every entry point: ``torch.ops.flashcore.attention``. It is opaque
to ``torch.compile`` and CUDA graphs, with a fake implementation that gives the output shapes;
its backward is registered in ``flashcore.autograd``."""

from typing import Optional, Tuple

import torch

from . import _checks
from ._launch import Call, launch


def _layout(bhsd):
    return "bhsd" if bhsd else "bshd"


def _outputs(q, return_lse, hq, sq, b):
    # Contiguous in q's layout (empty_like with an explicit format: ~1 µs less than empty(shape)).
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if return_lse else None
    return out, lse


def _no_lse(q):
    return torch.empty((0,), dtype=torch.float32, device=q.device)


@torch.library.custom_op("flashcore::attention", mutates_args=())
def attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: Optional[float],
    bhsd: bool,
    return_lse: bool,
    lengths: Optional[torch.Tensor],
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse): out contiguous in the input layout, lse fp32 [B, Hq, Sq] (empty
    unless `return_lse`). A sliding window (flash-attn's window_size, −1 unbounded),
    a softcap (0 off) and learnable sinks (fp32 [Hq], or None)."""
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, _layout(bhsd))
    scale = _checks.check_scale(scale)
    _checks.check_lengths(lengths, q, b, sq, sk)
    window, softcap, sinks = _checks.check_features((window_left, window_right), softcap, sinks, q, hq, lengths)
    out, lse = run(Call(q, k, v, causal, scale, bhsd, return_lse, lengths, window, softcap, sinks))
    return out, lse if return_lse else _no_lse(q)


def run(call):
    """The op's body on a checked call (`_launch.Call`). Returns (out, lse), lse None unless
    `call.return_lse`."""
    b, hq, sq = call.bhs()
    out, lse = _outputs(call.q, call.return_lse, hq, sq, b)
    launch(call, out, lse)
    return out, lse


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, bhsd, return_lse, lengths, window_left=-1, window_right=-1,
                    softcap=0.0, sinks=None):
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, _layout(bhsd))
    _checks.check_scale(scale)
    _checks.check_lengths(lengths, q, b, sq, sk)
    _checks.check_features((window_left, window_right), softcap, sinks, q, hq, lengths)
    out, lse = _outputs(q, return_lse, hq, sq, b)
    return out, lse if return_lse else _no_lse(q)


def eager(*tensors):
    """Whether a call may run `run` directly, skipping the dispatcher (~20 µs of host time): plain
    tensors, none of which autograd must record (grad mode off, or no input requiring grad), not
    under torch.compile, no dispatch mode (fake tensors, make_fx, functionalisation) active.
    Anything else goes through the op, which such machinery needs to see (autograd: the op's
    backward, flashcore.autograd)."""
    for t in tensors:
        if type(t) is not _Tensor and t is not None:
            return False
    if _grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return False
    if _is_compiling():
        return False
    return _dispatch_mode() is None


_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_dispatch_mode = torch.utils._python_dispatch._get_current_dispatch_mode
