"""The public functions: flashcore's own, flash-attn's and PyTorch SDPA's conventions."""

import torch

from . import _checks
from ._launch import Call
from ._launch import fast as _fast
from ._launch import prepare as _prepare
from . import ops


def _call(call):
    """The op on a checked call (`_launch.Call`, no window, softcap or sinks): straight to its body
    in plain eager mode, through the dispatcher (torch.ops.flashcore.attention) whenever torch is
    tracing or faking tensors or autograd records the call — then with the log-sum-exp, which the
    backward needs."""
    q, k, v, lengths = call.q, call.k, call.v, call.lengths
    if _checks.needs_grad(q, k, v):
        _checks.check_backward_head_dim(q.shape[-1])
        if lengths is not None:
            raise RuntimeError(
                "flashcore: secret_lengths has no backward pass: call it under torch.no_grad() or "
                "torch.inference_mode(), or .detach() the inputs"
            )
        return ops.attention_op(q, k, v, call.causal, call.scale, call.bhsd, True, lengths)
    if ops.eager(q, k, v, lengths):
        return ops.run(call)
    return ops.attention_op(q, k, v, call.causal, call.scale, call.bhsd, call.return_lse, lengths)


def attention(q, k, v, *, causal=False, scale=None, layout="bshd", return_lse=False, secret_lengths=None,
              window_size=(-1, -1), softcap=0.0, learnable_sink=None):
    """Fused attention ``softmax(scale · q kᵀ + mask) v``, fp16/bf16, a head dim in
    ``flashcore.SUPPORTED_HEAD_DIMS`` (differentiable at every one).

    `layout` "bshd" (flash-attn: [B, S, H, D], the default) or "bhsd" (SDPA: [B, H, S, D]). K and
    V may have fewer heads than Q (grouped-query attention: Hq a multiple of Hkv) and another
    sequence length; causal masking is then bottom-right aligned (flash-attn's convention).
    `scale` defaults to 1/sqrt(D). `secret_lengths` (int32 [B] on the device, needs Sq == Sk):
    each sequence's true length, kept secret — the kernel runs over the padded length, rows past
    the length come out 0. Strided inputs are read in place where TMA can address them, copied
    otherwise. Returns `out` (contiguous, in `layout`), or `(out, lse)` with lse fp32 [B, Hq, Sq]
    (natural log) when `return_lse`.

    Differentiable: with an input that requires grad (under grad mode) the call records its
    backward (flashcore.autograd: dq, dk, dv, GQA sums, bitwise deterministic); lse is not
    differentiable. `secret_lengths` has no backward (RuntimeError).

    Dense calls: `window_size` (left, right) sliding window (−1 unbounded; causal
    means right = 0), `softcap` (0 off), `learnable_sink` [Hq] sinks — see `flash_attn_func`.
    Differentiable at every head dim (the sink too, when it requires grad).
    """
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
    if window != (-1, -1) or softcap != 0.0 or learnable_sink is not None:
        return _attention_features(q, k, v, causal, scale, layout, return_lse, secret_lengths, window, softcap,
                                   learnable_sink)
    if secret_lengths is None and (layout == "bshd" or layout == "bhsd"):
        r = _fast(q, k, v, bool(causal), scale, layout == "bhsd", bool(return_lse))
        if r is not None:  # plain eager call, served in one pass (_launch.fast)
            return r if return_lse else r[0]
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, layout)
    scale = _checks.check_scale(scale)
    _checks.check_lengths(secret_lengths, q, b, sq, sk)
    out, lse = _call(Call(q, k, v, bool(causal), scale, layout == "bhsd", bool(return_lse), secret_lengths))
    return (out, lse) if return_lse else out


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    return_lse=False,
    learnable_sink=None,
):
    """flash-attn's ``flash_attn_func`` on [B, S, H, D] tensors, as a drop-in (differentiable, as
    `attention`).

    `window_size=(left, right)` (−1 unbounded; `causal` sets right = 0, as flash-attn does):
    query i, aligned bottom-right to the keys, sees key j iff i − left ≤ j ≤ i + right; whole key
    blocks outside the window are skipped. `softcap`: scores become softcap · tanh(scale · q·k /
    softcap) (Gemma 2). `learnable_sink` (FA4's name; [Hq], any float dtype, taken as fp32): one
    logit per query head joining every row's softmax denominator with no value row (gpt-oss).
    These three are differentiable at every head dim (the sink's gradient too, when it requires
    grad). What flash-attn offers and flashcore does not (dropout, ALiBi, attention
    probabilities) raises ``ValueError``; `deterministic` is accepted (flashcore is always bitwise
    deterministic). Returns `out`, or `(out, lse)` when `return_lse`.
    """
    if dropout_p != 0.0:
        raise ValueError(f"flashcore: dropout_p={dropout_p} is not supported (use 0.0)")
    if alibi_slopes is not None:
        raise ValueError("flashcore: alibi_slopes is not supported")
    if return_attn_probs:
        raise ValueError("flashcore: return_attn_probs is not supported (use return_lse=True for the log-sum-exp)")
    window = tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size
    if window == (-1, -1) and softcap == 0.0 and learnable_sink is None:
        r = _fast(q, k, v, bool(causal), softmax_scale, False, bool(return_lse))
        if r is not None:  # plain eager call, served in one pass (_launch.fast)
            return r if return_lse else r[0]
        return attention(q, k, v, causal=causal, scale=softmax_scale, layout="bshd", return_lse=return_lse)
    return attention(q, k, v, causal=causal, scale=softmax_scale, layout="bshd", return_lse=return_lse,
                     window_size=window, softcap=softcap, learnable_sink=learnable_sink)


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """``torch.nn.functional.scaled_dot_product_attention`` on [B, H, S, D] tensors.

    Same semantics as PyTorch's, including causal masking with Sq ≠ Sk (top-left aligned, as
    SDPA's math and memory-efficient backends do). A mask, dropout, a head dim other than 64 or
    128, or fp32 raise ``ValueError``/``TypeError``: it never falls back silently. Strided views
    (e.g. ``x.transpose(1, 2)`` of a [B, S, H, D] tensor) are read in place where TMA can address
    them, copied otherwise. Returns a contiguous [B, H, Sq, D] tensor. Differentiable, as
    `attention` (GQA: key/value gradients summed over each group).
    """
    if attn_mask is not None:
        raise ValueError(
            "flashcore: attn_mask is not supported (flashcore computes unmasked or causal attention): "
            "use is_causal=True, or torch's own scaled_dot_product_attention for arbitrary masks"
        )
    if dropout_p != 0.0:
        raise ValueError(f"flashcore: dropout_p={dropout_p} is not supported (use 0.0)")
    r = _fast(query, key, value, bool(is_causal), scale, True, False, gqa=enable_gqa, top_left=True)
    if r is not None:  # plain eager call, served in one pass (_launch.fast)
        return r[0]
    b, sq, sk, hq, hkv, d = _checks.split_shape(query, key, value, "bhsd")
    if hq != hkv and not enable_gqa:
        raise ValueError(
            f"flashcore: query has {hq} heads and key {hkv}: pass enable_gqa=True for grouped-query attention"
        )
    scale = _checks.check_scale(scale)
    return top_left(query, key, value, bool(is_causal), scale, bhsd=True)


def top_left(q, k, v, causal, scale, bhsd):
    """Attention with SDPA's causal convention on checked arguments: the mask is top-left
    aligned (query i sees keys 0..i), where flashcore's own is bottom-right."""
    seq = 2 if bhsd else 1
    sq, sk = q.shape[seq], k.shape[seq]
    if not causal or sq == sk:
        return _call(Call(q, k, v, causal, scale, bhsd, False, None))[0]
    if sq < sk:
        # Keys past Sq are invisible to every query: the square causal problem on the first Sq keys.
        return _call(Call(q, k.narrow(seq, 0, sq), v.narrow(seq, 0, sq), True, scale, bhsd, False, None))[0]
    # Sq > Sk: queries 0..Sk-1 form the square causal problem; queries from Sk on see every key.
    head = _call(Call(q.narrow(seq, 0, sk), k, v, True, scale, bhsd, False, None))[0]
    tail = _call(Call(q.narrow(seq, sk, sq - sk), k, v, False, scale, bhsd, False, None))[0]
    return torch.cat([head, tail], dim=seq)


def prepare(q, k, *, causal=False, scale=None, layout="bshd", secret_lengths=False):
    """Compiles and loads the kernel for these shapes without launching (the first call of a shape
    compiles with NVRTC, ~1 s, then hits the disk cache). Do it before capturing a CUDA graph."""
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, k, layout)
    _prepare(q.device, q.dtype, (b, sq, sk, hq, hkv, d), causal, _checks.check_scale(scale), secret_lengths)


def _attention_features(q, k, v, causal, scale, layout, return_lse, lengths, window, softcap, sinks):
    """`attention` with a window, a softcap or sinks: checked here, then the op (directly in plain
    eager mode, through the dispatcher otherwise; always through it when autograd records the
    call, with the log-sum-exp its backward needs)."""
    b, sq, sk, hq, hkv, d = _checks.split_shape(q, k, v, layout)
    scale = _checks.check_scale(scale)
    _checks.check_lengths(lengths, q, b, sq, sk)
    if _checks.needs_grad(q, k, v, sinks if isinstance(sinks, torch.Tensor) else None):
        _checks.check_backward_head_dim(d)
        if lengths is not None:
            raise RuntimeError(
                "flashcore: secret_lengths has no backward pass: call it under torch.no_grad() or "
                "torch.inference_mode(), or .detach() the inputs"
            )
        sinks = _checks.sinks_f32_grad(sinks)
        window, softcap, sinks = _checks.check_features(window, softcap, sinks, q, hq, lengths)
        _checks.check_feature_backward_head_dim(d, window, softcap)
        out, lse = ops.attention_op(q, k, v, bool(causal), scale, layout == "bhsd", True, lengths, window[0],
                                    window[1], softcap, sinks)
        return (out, lse) if return_lse else out
    sinks = _checks.sinks_f32(sinks)
    window, softcap, sinks = _checks.check_features(window, softcap, sinks, q, hq, lengths)
    call = Call(q, k, v, bool(causal), scale, layout == "bhsd", bool(return_lse), lengths, window, softcap, sinks)
    if ops.eager(q, k, v, lengths, sinks):
        out, lse = ops.run(call)
    else:
        out, lse = ops.attention_op(q, k, v, call.causal, scale, call.bhsd, call.return_lse, lengths, window[0],
                                    window[1], softcap, sinks)
    return (out, lse) if return_lse else out
