"""The torch custom op behind every entry point: ``torch.ops.flashcore.attention``. It is opaque
to ``torch.compile`` and CUDA graphs, with a fake implementation that gives the output shapes."""

from typing import Optional, Tuple

import torch

from . import _checks
from ._launch import launch


def _layout(bhsd):
    return "bhsd" if bhsd else "bshd"


def _outputs(q, return_lse, hq, sq, b):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous in q's layout
    lse_shape = (b, hq, sq) if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    return out, lse


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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (out, lse): out contiguous in the input layout, lse fp32 [B, Hq, Sq] (empty
    unless `return_lse`)."""
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, _layout(bhsd))
    scale = _checks.check_scale(scale)
    _checks.check_lengths(lengths, q, b, sq, sk)
    out, lse = _outputs(q, return_lse, hq, sq, b)
    if bhsd:
        qv, kv, vv, ov = (t.transpose(1, 2) for t in (q, k, v, out))
    else:
        qv, kv, vv, ov = q, k, v, out
    launch(qv, kv, vv, ov, lse if return_lse else None, lengths, causal, scale)
    return out, lse


@attention_op.register_fake
def _attention_fake(q, k, v, causal, scale, bhsd, return_lse, lengths):
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, _layout(bhsd))
    _checks.check_scale(scale)
    _checks.check_lengths(lengths, q, b, sq, sk)
    return _outputs(q, return_lse, hq, sq, b)
