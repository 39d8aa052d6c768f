"""Argument checks shared by every entry point. They run before any launch (and at trace time
under ``torch.compile``, on fake tensors), so each mistake is a Python exception that says what
to change: ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong value or shape,
``RuntimeError`` for a request flashcore cannot serve (autograd of an inference-only entry point,
a backward without the forward's log-sum-exp)."""

import math

import torch

from . import _native

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
# Head dims, from the library's variant table (docs/support.md): the forward's, the backward's,
# the varlen backward's (the bwd_*_varlen builds).
SUPPORTED_HEAD_DIMS = tuple(_native.SUPPORTED_HEAD_DIMS)
BACKWARD_HEAD_DIMS = tuple(_native.BACKWARD_HEAD_DIMS)
VARLEN_BACKWARD_HEAD_DIMS = tuple(_native.VARLEN_BACKWARD_HEAD_DIMS)


def check_varlen_backward_head_dim(d):
    if d not in VARLEN_BACKWARD_HEAD_DIMS:
        raise RuntimeError(
            f"flashcore: head dim {d} has no varlen backward pass yet (varlen gradients: head dims "
            f"{', '.join(map(str, VARLEN_BACKWARD_HEAD_DIMS))}): call it under torch.no_grad() or "
            "torch.inference_mode(), or .detach() the inputs"
        )


# Head dims whose backward takes a sliding window or a softcap (the bwd_*_window[_softcap] builds).
FEATURE_BACKWARD_HEAD_DIMS = tuple(_native.FEATURE_BACKWARD_HEAD_DIMS)


def check_feature_backward_head_dim(d, window, softcap):
    """Refuses a gradient through a window or softcap at a head dim without those backward builds."""
    if d not in FEATURE_BACKWARD_HEAD_DIMS and (tuple(window) != (-1, -1) or softcap):
        raise RuntimeError(
            f"flashcore: head dim {d} has no backward pass with window_size or softcap (gradients with "
            f"them: head dims {', '.join(map(str, FEATURE_BACKWARD_HEAD_DIMS))}): call it under "
            "torch.no_grad() or torch.inference_mode(), or .detach() the inputs"
        )


def check_backward_head_dim(d):
    if d not in BACKWARD_HEAD_DIMS:
        raise RuntimeError(
            f"flashcore: head dim {d} has no backward pass (gradients: head dims {', '.join(map(str, BACKWARD_HEAD_DIMS))}): "
            "call it under torch.no_grad() or torch.inference_mode(), or .detach() the inputs"
        )
LAYOUTS = ("bshd", "bhsd")


def check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashcore: `{name}` must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(
            f"flashcore: `{name}` is on {t.device}; flashcore runs on CUDA tensors (move it with .cuda())"
        )
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"flashcore: `{name}` has dtype {t.dtype}; supported are torch.float16 and torch.bfloat16 "
            f"(convert with .half() or .bfloat16())"
        )
    if t.dim() != 4:
        raise ValueError(f"flashcore: `{name}` must be 4-D, got shape {tuple(t.shape)}")


def needs_grad(*tensors):
    """Whether autograd will record a call on these tensors (grad mode on, an input requiring grad)."""
    return torch.is_grad_enabled() and _any_requires_grad(tensors)


def check_no_grad(what, *tensors):
    """Refuses autograd for `what`, an entry point with no backward pass."""
    if needs_grad(*tensors):
        raise RuntimeError(
            f"flashcore: an input requires grad, but {what} has no backward pass (inference only): "
            "call it under torch.no_grad() or torch.inference_mode(), or .detach() the inputs"
        )


def _any_requires_grad(tensors):
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


def check_backward(grad_out, q, k, v, out, lse, layout):
    """The rules of one backward call (`torch.ops.flashcore.attention_backward`): q, k, v by the
    forward's rules; `grad_out` and `out` of q's shape, dtype and device; `lse` the forward's
    log-sum-exp, fp32 [B, Hq, Sq]. Returns the split shape."""
    shape = split_shape(q, k, v, layout)
    b, sq, sk, hq, hkv, d = shape
    check_backward_head_dim(d)
    for name, t in (("grad_out", grad_out), ("out", out)):
        check_tensor(name, t)
        if tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"flashcore: `{name}` must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"flashcore: `{name}` has dtype {t.dtype}, q {q.dtype}: they must match")
        if t.device != q.device:
            raise ValueError(f"flashcore: `{name}` is on {t.device}, q on {q.device}")
    if not isinstance(lse, torch.Tensor) or lse.numel() == 0:
        raise RuntimeError(
            "flashcore: the backward needs the forward's log-sum-exp, and this forward ran without it "
            "(call flashcore with an input that requires grad under grad mode, or with return_lse=True)"
        )
    if lse.dtype != torch.float32 or tuple(lse.shape) != (b, hq, sq) or lse.device != q.device:
        raise ValueError(
            f"flashcore: `lse` must be float32 of shape {(b, hq, sq)} on {q.device}, "
            f"got {lse.dtype} {tuple(lse.shape)} on {lse.device}"
        )
    return shape


def split_shape(q, k, v, layout):
    """(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) after every shape rule."""
    shape = _valid_shape(q, k, v, layout)
    if shape is not None:
        return shape
    return _split_shape_checked(q, k, v, layout)


_Tensor = torch.Tensor


def _valid_shape(q, k, v, layout):
    """The fast accept of `split_shape` (host time: ~1 µs instead of ~5): the split shape when
    q, k, v are plain CUDA tensors that meet every rule, None for anything else — which then goes
    through `_split_shape_checked`, the rules one by one with their messages. Every call this
    accepts, `_split_shape_checked` accepts with the same result."""
    if type(q) is not _Tensor or type(k) is not _Tensor or type(v) is not _Tensor:
        return None  # subclasses (fake tensors, parameters, ...): the full checks
    dt = q.dtype
    if not (q.is_cuda and k.is_cuda and v.is_cuda and k.dtype is dt and v.dtype is dt):
        return None
    if dt is not torch.float16 and dt is not torch.bfloat16:
        return None
    dev = q.get_device()
    if k.get_device() != dev or v.get_device() != dev:
        return None
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:
        return None
    if layout == "bshd":
        b, sq, hq, d = qs
        bk, sk, hkv, dk = ks
    elif layout == "bhsd":
        b, hq, sq, d = qs
        bk, hkv, sk, dk = ks
    else:
        return None
    if bk != b or dk != d or d not in SUPPORTED_HEAD_DIMS:
        return None
    if not (b and sq and sk and hq and hkv) or hq % hkv != 0:
        return None
    return b, sq, sk, hq, hkv, d


def _split_shape_checked(q, k, v, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"flashcore: layout must be 'bshd' or 'bhsd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flashcore: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"flashcore: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if layout == "bshd":
        (b, sq, hq, d), (bk, sk, hkv, dk) = q.shape, k.shape
    else:
        (b, hq, sq, d), (bk, hkv, sk, dk) = q.shape, k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"flashcore: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if bk != b:
        raise ValueError(f"flashcore: q has batch {b} but k has {bk}")
    if dk != d:
        raise ValueError(f"flashcore: q has head dim {d} but k has {dk}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"flashcore: head dim {d} is not supported (supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))})"
        )
    for name, n in (("batch", b), ("seqlen_q", sq), ("seqlen_k", sk), ("heads_q", hq), ("heads_kv", hkv)):
        if n == 0:
            raise ValueError(f"flashcore: {name} is 0; zero-sized dimensions are not supported")
    if hq % hkv != 0:
        raise ValueError(
            f"flashcore: the number of query heads ({hq}) must be a multiple of the key/value heads ({hkv})"
        )
    return b, sq, sk, hq, hkv, d


def check_scale(scale):
    if scale is None:
        return None
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0.0:
        raise ValueError(f"flashcore: scale must be positive and finite, got {scale}")
    return scale


def check_lengths(lengths, q, batch, sq, sk):
    if lengths is None:
        return
    if not isinstance(lengths, torch.Tensor):
        raise TypeError("flashcore: secret_lengths must be a torch.Tensor of int32")
    if lengths.dtype != torch.int32:
        raise TypeError(f"flashcore: secret_lengths must be int32, got {lengths.dtype}")
    if lengths.device != q.device:
        raise ValueError(f"flashcore: secret_lengths is on {lengths.device}, q on {q.device}")
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"flashcore: secret_lengths must have shape ({batch},), got {tuple(lengths.shape)}")
    if sq != sk:
        raise ValueError(
            f"flashcore: secret_lengths needs seqlen_q == seqlen_k (the padded length), got {sq} and {sk}"
        )


def check_features(window, softcap, sinks, q, hq, lengths=None):
    """The window, softcap and sinks arguments: `window` flash-attn's (left, right) window_size, each −1 (unbounded)
    or ≥ 0; `softcap` 0 (off) or positive and finite; `sinks` None or fp32 contiguous [Hq] on q's
    device (learnable attention sinks, gpt-oss). Not with secret-length prefill (`lengths`).
    Returns (window as a tuple of ints, softcap as a float, sinks)."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"flashcore: window_size must be a pair (left, right), got {window!r}") from None
    for side in (left, right):
        if isinstance(side, bool) or not isinstance(side, int):
            raise TypeError(f"flashcore: window_size entries must be ints (-1 = unbounded), got {window!r}")
        if side < -1:
            raise ValueError(f"flashcore: window_size entries are -1 (unbounded) or >= 0, got {window!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"flashcore: softcap must be a number, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"flashcore: softcap must be 0 (off) or positive and finite, got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"flashcore: learnable_sink must be a torch.Tensor, got {type(sinks).__name__}")
        if sinks.dtype != torch.float32 or tuple(sinks.shape) != (hq,) or sinks.device != q.device:
            raise ValueError(
                f"flashcore: learnable_sink must be float32 [{hq}] (one logit per query head) on {q.device}, "
                f"got {sinks.dtype} {tuple(sinks.shape)} on {sinks.device}"
            )
        if not sinks.is_contiguous():
            raise ValueError("flashcore: learnable_sink must be contiguous")
    features = (left, right) != (-1, -1) or softcap != 0 or sinks is not None
    if features and lengths is not None:
        raise ValueError("flashcore: window_size, softcap and learnable_sink are not supported with secret_lengths yet")
    return (int(left), int(right)), float(softcap), sinks


def features(window_size, softcap, learnable_sink, q, hq):
    """The public entry points' window, softcap and sink arguments as the ops take them:
    window_size as a tuple, the sink as fp32 contiguous, all checked (`check_features`). Returns
    (window, softcap, sinks)."""
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
    return check_features(window, softcap, sinks_f32(learnable_sink), q, hq)


def sinks_f32(sinks):
    """A learnable_sink as the op takes it: float32 and contiguous (a model keeps it in its own
    dtype, e.g. bf16). Non-tensors pass through for check_features to refuse."""
    if isinstance(sinks, torch.Tensor) and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
        return sinks.detach().float().contiguous()
    return sinks


def sinks_f32_grad(sinks):
    """A learnable_sink as the op takes it when autograd records the call: float32 and contiguous
    like `sinks_f32`, but not detached, so the sink's gradient flows back through the conversion
    (a bf16 model parameter gets a bf16 gradient)."""
    if isinstance(sinks, torch.Tensor) and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
        return sinks.float().contiguous()
    return sinks


def check_block_table(block_table, b, pool, device):
    """A paged KV cache's block table: int32 ``[B, max_pages]`` on `device`, over a pool
    ``[num_pages, page_size, Hkv, D]`` with pages of any size of at least one row (powers of two
    of at least 16 rows load as TMA boxes, other sizes are gathered row by row: the same bits)."""
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError("flashcore: block_table must be an int32 tensor")
    if block_table.dim() != 2 or block_table.shape[0] != b or block_table.device != device:
        raise ValueError(
            f"flashcore: block_table must be [B, max_pages] = [{b}, max_pages] on {device}, "
            f"got {tuple(block_table.shape)} on {block_table.device}"
        )
    page = pool.shape[1] if pool.dim() == 4 else 0
    if page < 1 or page >= 2**31:
        raise ValueError(f"flashcore: the page size must be at least 1 row and below 2^31, got {page}")
