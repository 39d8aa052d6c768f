"""flashcore as an SDPA flash-attention implementation, through the registry PyTorch offers SDPA
backend providers (``torch.nn.attention.register_flash_attention_impl``, torch ≥ 2.10; FA4 uses
the same hook). Registered on import, never activated: after

    torch.nn.attention.activate_flash_attention_impl("flashcore")

every ``F.scaled_dot_product_attention`` call that PyTorch sends to its flash backend runs on
flashcore (``restore_flash_attention_impl()`` undoes it). Calls flashcore cannot serve — a head
dim outside ``flashcore.SUPPORTED_HEAD_DIMS``, dropout, or a GPU that is not sm_90 — run on PyTorch's memory-efficient
kernel instead (exact semantics kept; counted in ``stats``). Never a wrong result.

Training: the hook also serves the op's backward (``aten::_scaled_dot_product_flash_attention_backward``)
with flashcore's (``flashcore.autograd``'s kernels: bitwise deterministic, GQA sums); a call whose
forward fell back gets its gradients from an fp32 recomputation (``_fallback_backward``), except dropout, whose mask cannot be recomputed here: its backward raises.
"""

import torch

from . import _checks
from ._launch import Call, dense, fast, launch, launch_backward

NAME = "flashcore"

# How many calls each path took since activation (tests read it; cheap to keep).
stats = {"flashcore": 0, "fallback": 0, "backward": 0, "fallback_backward": 0}


class _Handle:
    def __init__(self, library):
        self.library = library

    def remove(self):
        # Dropping the Library object unregisters its kernels from the dispatcher.
        self.library = None


def _fallback_reason(query, key, value, dropout_p):
    if dropout_p != 0.0:
        return "dropout"
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "rank"
    if query.dtype not in _checks.SUPPORTED_DTYPES or len({query.dtype, key.dtype, value.dtype}) != 1:
        return "dtype"
    d = query.shape[-1]
    if d not in _checks.SUPPORTED_HEAD_DIMS or key.shape[-1] != d or value.shape[-1] != d:
        return "head dim"
    if query.shape[1] % key.shape[1] != 0 or key.shape != value.shape:
        return "heads"
    if min(query.shape) == 0 or min(key.shape) == 0:
        return "empty"
    if _capability(query.get_device()) != (9, 0):
        return "device"
    return None


_capabilities = {}


def _capability(index):
    """torch.cuda.get_device_capability, asked once per device (a few µs per call)."""
    cap = _capabilities.get(index)
    if cap is None:
        cap = _capabilities[index] = torch.cuda.get_device_capability(index)
    return cap


def _fallback(query, key, value, dropout_p, is_causal, scale):
    if is_causal and query.shape[2] != key.shape[2]:
        # The efficient kernel aligns a non-square causal mask top-left, flash bottom-right.
        raise RuntimeError(
            "flashcore SDPA backend: this call needs a fallback, and causal attention with "
            "seqlen_q != seqlen_k has no exact one here; restore_flash_attention_impl() to use PyTorch's"
        )
    if query.shape[1] != key.shape[1]:
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, True, dropout_p, is_causal, scale=scale
    )
    return out, lse[:, :, : query.shape[2]].contiguous()


def _flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention on CUDA, served by flashcore."""
    if return_debug_mask:
        raise RuntimeError("flashcore SDPA backend: return_debug_mask is not supported")
    if dropout_p == 0.0 and query.is_cuda and query.is_contiguous() and _capability(query.get_device()) == (9, 0):
        # The common call in one pass (_launch.fast; it declines everything else). The output
        # of a contiguous query is contiguous, as PyTorch's kernel gives it.
        r = fast(query, key, value, bool(is_causal), scale, True, True)
        if r is not None:
            stats["flashcore"] += 1
            rng_state, unused, debug = _placeholders(query)
            return r[0], r[1], None, None, query.shape[2], key.shape[2], rng_state, unused, debug
    b, hq, sq, d = query.shape
    reason = _fallback_reason(query, key, value, dropout_p)
    if reason is None:
        stats["flashcore"] += 1
        # The output has the query's memory layout, as PyTorch's own kernel (and its meta function) give.
        out = torch.empty_like(query)
        lse = torch.empty((b, hq, sq), dtype=torch.float32, device=query.device)
        launch(Call(query, key, value, is_causal, _checks.check_scale(scale), True, True, None), out, lse)
    else:
        stats["fallback"] += 1
        out, lse = _fallback(query, key, value, dropout_p, is_causal, scale)
        out = torch.empty_like(query).copy_(out)
    rng_state, unused, debug = _placeholders(query)
    return out, lse, None, None, sq, key.shape[2], rng_state, unused, debug


_debug_masks = {}


def _placeholders(query):
    """The op's RNG state, `unused` and debug-mask outputs. Without dropout nothing reads them
    (the meta function gives only their shapes): the first two are left unfilled (no fill
    launches per call), and the empty debug mask — no storage to share — is one per (device,
    dtype)."""
    dev = query.device
    debug = _debug_masks.get((dev, query.dtype))
    if debug is None:
        debug = _debug_masks[(dev, query.dtype)] = torch.empty(0, dtype=query.dtype, device=dev)
    return (torch.empty((2,), dtype=torch.uint64, device=dev), torch.empty((), dtype=torch.uint64, device=dev),
            debug)


def _flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                    is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward on CUDA: flashcore's backward where
    `_flash_forward` ran flashcore, `_fallback_backward` where it fell back (dropout raises)."""
    reason = _fallback_reason(query, key, value, dropout_p)
    if reason == "dropout":
        raise RuntimeError(
            "flashcore SDPA backend: no backward for a call with dropout (its forward ran PyTorch's "
            "kernel, whose dropout mask is not kept): restore_flash_attention_impl() to train with dropout"
        )
    if reason is None and query.shape[-1] not in _checks.BACKWARD_HEAD_DIMS:
        reason = "head dim"  # a head dim with a forward and no backward kernels (none at present)
    if reason is not None:
        stats["fallback_backward"] += 1
        return _fallback_backward(grad_out, query, key, value, is_causal, scale)
    stats["backward"] += 1
    return _backward(grad_out, query, key, value, out, logsumexp, bool(is_causal), _checks.check_scale(scale))


def _backward(grad_out, query, key, value, out, lse, causal, scale):
    """flashcore's backward on [B, H, S, D] tensors; the gradients get their input's strides (as
    PyTorch's kernel and meta function give them). Tensors that are [B, S, H, D] in memory (the
    transposed views models make) are read and written in that layout, with no copies."""
    lse = lse.contiguous()
    if not query.is_contiguous() and all(t.transpose(1, 2).is_contiguous() for t in (query, key, value, out)):
        grads = [torch.empty_like(t) for t in (query, key, value)]  # [B, S, H, D] memory, as the inputs
        t = [x.transpose(1, 2) for x in (grad_out, query, key, value, out)] + [g.transpose(1, 2) for g in grads]
        launch_backward(dense(t[0]), t[1], t[2], t[3], dense(t[4]), lse, t[5], t[6], t[7], causal, scale, bhsd=False)
        return tuple(grads)
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (query, key, value))
    launch_backward(dense(grad_out), query, key, value, dense(out), lse, dq, dk, dv, causal, scale, bhsd=True)
    return tuple(g if g.stride() == t.stride() else torch.empty_like(t).copy_(g)
                 for g, t in ((dq, query), (dk, key), (dv, value)))


def _fallback_backward(grad_out, query, key, value, is_causal, scale):
    """The gradients of SDPA (no dropout, causal top-left) recomputed in fp32 (fp64 for fp64
    inputs) from q, k, v: for calls whose forward `_fallback` served. Memory O(Sq·Sk) per head, as
    PyTorch's math backend."""
    b, hq, sq, d = query.shape
    hkv, sk = key.shape[1], key.shape[2]
    rep = hq // hkv
    acc = torch.promote_types(query.dtype, torch.float32)
    q, k, v, do = (t.to(acc) for t in (query, key, value, grad_out))
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = scale if scale is not None else d ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * s
    if is_causal:
        visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, v.transpose(-1, -2))
    ds = p * (dp - (p * dp).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-1, -2), q) * s
    if rep > 1:
        dk, dv = (g.view(b, hkv, rep, sk, d).sum(dim=2) for g in (dk, dv))
    return tuple(torch.empty_like(t).copy_(g) for g, t in ((dq, query), (dk, key), (dv, value)))


def _register():
    lib = torch.library.Library("aten", "IMPL", "CUDA")  # noqa: TOR901
    lib.impl("_scaled_dot_product_flash_attention", _flash_forward, "CUDA")
    lib.impl("_scaled_dot_product_flash_attention_backward", _flash_backward, "CUDA")
    return _Handle(lib)


def available():
    """Whether this torch has the SDPA flash-implementation registry."""
    return hasattr(torch.nn.attention, "register_flash_attention_impl")


def register():
    """Makes "flashcore" known to torch's registry (does not activate it). Idempotent."""
    if not available():
        return False
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=_register)
    return True
