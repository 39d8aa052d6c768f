"""flashcore as a Hugging Face ``transformers`` attention backend.

    import flashcore.hf
    flashcore.hf.register()                       # returns the name: "fcore"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fcore")

The name is "fcore", not "flashcore": transformers (5.x) treats every implementation name that
contains "flash" as a flash-attn kernel to fetch from its hub, so "flashcore" cannot be used.

Masks are built as for "sdpa" (transformers' ``sdpa_mask``), which leaves them out when plain
causal or full attention is exact; models whose own code adds the mask to its scores instead of
calling an attention function (Bloom, ...: they support neither "sdpa" nor attention backends)
get the additive mask they have under "eager" (``build_mask``). flashcore serves a call only
when it understands every argument the model passed: no mask, no dropout, fp16/bf16, a head dim
in ``flashcore.SUPPORTED_HEAD_DIMS`` (training too), an sm_90 GPU, and keyword arguments from an allow-list at
values that change nothing flashcore computes — ``position_ids``, ``use_cache``,
``output_hidden_states``, ``output_router_logits``, ``num_items_in_batch``,
``encoder_hidden_states`` (any value), ``position_bias`` (None), ``output_attentions`` (false);
and, computed by flashcore itself, ``sliding_window`` (a window of W keys is flash-attn's
window_size (W − 1, 0); its mask, when it is exactly the window — ``window_of`` — is computed from
the window), ``softcap`` (Gemma 2) and ``s_aux`` (gpt-oss's learnable sinks, one logit per query
head). Served calls run with SDPA's semantics (causal top-left aligned when Sq ≠ Sk; a window's
mask is bottom-right, as transformers builds it). A call with a mask is served too when it is a decode step
(Sq <= 16) whose mask says "key j is visible from each sequence's first key on" (and causal
bottom-right): every step of a batched, left-padded ``generate()``, and sliding windows in decode,
look like that. ``leftpad_of`` finds the first keys (one host read per mask tensor; never under
torch.compile) and the KV-cache kernel masks the keys before them (``cache_leftpad``). A call with
Sq == Sk and a padding mask — a forward pass or generate()'s prefill over a left- or right-padded
batch: each real query row sees the keys of its sequence's real tokens (causal: up to itself) —
is served by varlen (``padded_prefill_of``: one host read per mask tensor, to check the mask's
form, a causal sliding window on top included; the starts and counts are computed on the
device): the padded batch runs as a pack with ``seqused_q``/``seqused_k``, rows of padding come
out zero — under grad too (varlen's backward, python/flashcore/varlen_autograd.py; every head
dim, with a window, softcap and sinks and the sinks' gradient). Sinks and a softcap are served on
both mask paths (gpt-oss and Gemma 2 batches, prefill, generate and training). Every other call goes to a path that
computes it:

- transformers' SDPA function where SDPA expresses the call: a mask (padding, or a window mask
  with padding in it), dropout, ``position_bias``, another dtype, head dim, device or GPU;
- the model's own eager attention where it does not: any such call that also has sinks, a
  softcap or an unmasked window (SDPA computes none of them), ``output_attentions``, and any
  keyword argument not on the allow-list (a future transformers' too). That is the
  module-level ``eager_attention_forward`` of the module that defines the attention layer's class;
  the boolean mask is made additive (0 / the dtype's lowest value, as transformers' ``eager_mask``)
  and a causal mask built where the mask builder left it out. With no eager function to be found
  it raises rather than compute something else.

``stats`` counts calls per path ("flashcore"; "fallback" = "sdpa" + "eager"), ``reasons`` counts
why calls fell back; ``fallback_reason`` and ``fallback_path`` give them for one call.
"""

import inspect
import sys
import weakref

import torch

from . import _checks
from .api import top_left

NAME = "fcore"

stats = {"flashcore": 0, "fallback": 0, "sdpa": 0, "eager": 0}
reasons = {}

# Keyword arguments transformers (5.x) passes to attention functions that have no bearing on the
# attention result, checked against transformers' sources: `position_ids` (RoPE is applied before
# the call; packed sequences come as a mask, which the mask builder makes from the position ids;
# SDPA and eager attention ignore them too, only flash-attn's varlen path reads them),
# `use_cache`, `output_hidden_states`, `output_router_logits` (output flags of the model,
# consumed elsewhere), `num_items_in_batch` (loss normalisation), `encoder_hidden_states` (BERT
# and its kin pass it down; cross-attention computes K and V from it before the call, and no
# attention function of transformers, nor any model's eager one, reads it).
_INERT = frozenset(
    {"position_ids", "use_cache", "output_hidden_states", "output_router_logits", "num_items_in_batch",
     "encoder_hidden_states"}
)

# Keyword arguments that flashcore implements for some values only (checked in fallback_reason).
_CONDITIONAL = frozenset({"sliding_window", "softcap", "s_aux", "position_bias", "output_attentions"})

_ALLOWED = _INERT | _CONDITIONAL

# Reasons SDPA's function computes exactly; every other reason goes to the model's eager attention.
_SDPA_REASONS = frozenset(
    {
        "attention_mask", "dropout", "position_bias", "device", "dtype", "head_dim", "heads", "empty", "gpu",
        "scaling",
    }
)


def _gpu_ok(device):
    return torch.cuda.get_device_capability(device) == (9, 0)


def _nonzero(x):
    """Whether a softcap value asks for capping (flash-attn and transformers' flash path: 0 = off;
    anything that is not a plain number counts as a request)."""
    if x is None:
        return False
    return not isinstance(x, (int, float)) or x != 0


def fallback_reason(query, key, value, attention_mask, dropout=0.0, scaling=None, kwargs=None, mask_served=False):
    """Why flashcore does not serve this call (a short string), or None when it does. Reasons that
    SDPA cannot express (an argument flashcore does not implement) come first. `mask_served`: the
    mask is one flashcore computes (``leftpad_of`` found its first keys)."""
    kwargs = kwargs or {}
    for name in kwargs:
        if name not in _ALLOWED:
            return f"unknown argument {name!r}"
    # flashcore computes attention sinks (s_aux, gpt-oss: one logit per query head),
    # a softcap (Gemma 2) and sliding windows itself (dense calls, padded prefills, decode steps).
    # A call with one of them that flashcore does not serve for another reason goes to the
    # model's eager attention (SDPA computes none of them), so their reasons come first then.
    feature = _feature_reason(query, key, attention_mask, kwargs, mask_served)
    if feature is not None:
        return feature
    if kwargs.get("output_attentions"):
        return "output_attentions"
    reason = _base_reason(query, key, value, attention_mask, dropout, scaling, kwargs, mask_served)
    if reason is not None and _features_asked(kwargs, attention_mask, key):
        return "s_aux" if kwargs.get("s_aux") is not None else "softcap" if _nonzero(kwargs.get("softcap")) else "sliding_window"
    return reason


def _features_asked(kwargs, attention_mask, key):
    """Whether the call asks for something only flashcore or the model's eager attention computes:
    sinks, a softcap, or a window shorter than the keys that no mask carries."""
    window = kwargs.get("sliding_window")
    unmasked_window = window is not None and attention_mask is None and key.shape[2] > window
    return kwargs.get("s_aux") is not None or _nonzero(kwargs.get("softcap")) or unmasked_window


def _feature_reason(query, key, attention_mask, kwargs, mask_served):
    """Why flashcore cannot take this call's sinks, softcap or window as given (a reason), else
    None. Served: s_aux a float tensor [Hq]; softcap a positive finite number; sliding_window a
    positive int — on every path: dense, a padded batch's prefill (varlen) and a decode step
    over its mask's first keys (`mask_served`, the KV-cache kernel)."""
    s_aux = kwargs.get("s_aux")
    if s_aux is not None:
        if (not isinstance(s_aux, torch.Tensor) or not s_aux.is_floating_point() or s_aux.dim() != 1
                or query.dim() != 4 or s_aux.shape[0] != query.shape[1] or s_aux.device != query.device):
            return "s_aux"
    softcap = kwargs.get("softcap")
    if _nonzero(softcap):
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (0 < softcap < float("inf")):
            return "softcap"
    # transformers' windows: key j is visible to query i when i - j < window (masking_utils'
    # sliding_window_overlay): flash-attn's window_size (window - 1, 0) with causal. With Sk <=
    # window every key is inside it and the window changes nothing. Beyond that the mask carries
    # it (transformers' sliding-window mask builder never leaves such a mask out); flashcore serves
    # such a mask when it is exactly the window (``window_of``), and a call without one by the
    # window itself.
    window = kwargs.get("sliding_window")
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            return "sliding_window"
    # Training: the window/softcap backward builds exist at every head dim.
    return None


def _base_reason(query, key, value, attention_mask, dropout, scaling, kwargs, mask_served):
    if kwargs.get("position_bias") is not None:
        return "position_bias"
    if attention_mask is not None and not mask_served:
        return "attention_mask"
    if dropout != 0.0:
        return "dropout"
    if query.device.type != "cuda" or not (query.device == key.device == value.device):
        return "device"
    if query.dtype not in _checks.SUPPORTED_DTYPES or len({query.dtype, key.dtype, value.dtype}) != 1:
        return "dtype"
    if query.dim() != 4 or key.dim() != 4 or tuple(key.shape) != tuple(value.shape):
        return "heads"
    d = query.shape[-1]
    if d not in _checks.SUPPORTED_HEAD_DIMS or key.shape[-1] != d:
        return "head_dim"
    if d not in _checks.BACKWARD_HEAD_DIMS and _checks.needs_grad(query, key, value):
        return "head_dim"  # a forward-only head dim (none at present): training goes to SDPA
    if query.shape[0] != key.shape[0] or query.shape[1] % key.shape[1] != 0:
        return "heads"
    if min(query.shape) == 0 or min(key.shape) == 0:
        return "empty"
    try:
        _checks.check_scale(scaling)
    except (TypeError, ValueError):
        return "scaling"
    if not _gpu_ok(query.device):
        return "gpu"
    return None


# Masks leftpad_of has analysed: id -> (weak reference, version, result). transformers builds one
# mask per forward (per layer type) and hands the same tensor to every layer, so the host read
# below happens once per forward, not once per layer.
_LEFTPAD = {}


def _per_mask(cache, mask, analyse, extra=()):
    """`analyse(mask)`, computed once per mask tensor (and `extra` key) and kept in `cache` while
    the tensor lives unchanged (same object, same version counter); at every call for inference
    tensors, which have no version counter to notice an in-place change by. At most 16 entries."""
    if mask.is_inference():
        return analyse(mask)
    key = (id(mask),) + tuple(extra)
    hit = cache.get(key)
    if hit is not None and hit[0]() is mask and hit[1] == mask._version:
        return hit[2]
    found = analyse(mask)
    if len(cache) >= 16:
        cache.clear()
    cache[key] = (weakref.ref(mask), mask._version, found)
    return found


def leftpad_of(mask, query, key):
    """For a decode call (Sq <= 16) whose boolean mask [B or 1, 1, Sq, Sk] is exactly "query i
    sees key j iff j >= start[b]" — and, causal, "j <= Sk - Sq + i" — returns (start int32 [B],
    causal); else None. That is the mask of every step of a batched left-padded generate (and a
    sliding window shows the same way: its first visible key). Reads the mask on the host once per
    mask tensor (at every call for inference tensors, which have no version counter: generate()
    runs under no_grad, not inference_mode); never under torch.compile or with fake tensors (None: the call falls back)."""
    from .kvcache import MAX_SEQLEN_Q
    from .ops import eager

    b, sq, sk = query.shape[0], query.shape[2], key.shape[2]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4:
        return None
    if mask.shape[0] not in (1, b) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (sq, sk):
        return None
    if sq > MAX_SEQLEN_Q or mask.device != query.device or not eager(mask):
        return None
    found = _per_mask(_LEFTPAD, mask, _analyse)
    if found is None:
        return None
    start, causal = found
    return start.expand(b).contiguous(), causal


def _analyse(mask):
    m = mask[:, 0]
    sq, sk = m.shape[1], m.shape[2]
    last = m[:, -1, :]
    start = torch.where(last.any(-1), last.int().argmax(-1), torch.full_like(last[:, 0], sk, dtype=torch.long))
    j = torch.arange(sk, device=m.device)
    after = j[None, None, :] >= start[:, None, None]
    i = torch.arange(sq, device=m.device)[:, None]
    diagonal = (j[None, :] <= i + (sk - sq))[None]
    for causal, want in ((True, after & diagonal), (False, after.expand_as(m))):
        if torch.equal(m, want):  # the host read
            return start.to(torch.int32), causal and sq > 1
    return None


# Masks padded_prefill_of has analysed, as _LEFTPAD.
_PADDED = {}


def padded_prefill_of(mask, query, key, window=None):
    """For a call with Sq == Sk (a forward pass or generate()'s prefill over a padded batch) whose
    boolean mask [B or 1, 1, S, S] says, on every real query row i of sequence b, "key j is
    visible iff start[b] <= j < end[b]" — and, causal, "j <= i" — returns (start int32 [B], end −
    start int32 [B], causal, windowed); else None. Left and right padding both look like that (rows
    of padding are not looked at: flashcore writes zeros there). With `window` (transformers'
    sliding window, an int), a causal mask may also be that window — "i − j < window" on top
    (windowed True: flashcore computes it as window_size (window − 1, 0) within each sequence).
    One host read per mask tensor (the comparisons fetched together), cached as for
    ``leftpad_of``; never under torch.compile or with fake tensors (None: the call falls back)."""
    from .ops import eager

    b, sq, sk = query.shape[0], query.shape[2], key.shape[2]
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 or sq != sk:
        return None
    if mask.shape[0] not in (1, b) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (sq, sk):
        return None
    if mask.device != query.device or not eager(mask):
        return None
    found = _per_mask(_PADDED, mask, lambda m: _analyse_padded(m, window), (window,))
    if found is None:
        return None
    start, used, causal, windowed = found
    return start.expand(b).contiguous(), used.expand(b).contiguous(), causal, windowed


def _analyse_padded(mask, window=None):
    m = mask[:, 0]
    s = m.shape[-1]
    seen = m.any(1)  # keys any row sees
    has = seen.any(-1)
    start = torch.where(has, seen.int().argmax(-1), torch.zeros_like(has, dtype=torch.long))
    end = torch.where(has, s - seen.flip(-1).int().argmax(-1), torch.zeros_like(has, dtype=torch.long))
    j = torch.arange(s, device=m.device)
    keys = (j[None, None, :] >= start[:, None, None]) & (j[None, None, :] < end[:, None, None])
    rows = (j[None, :, None] >= start[:, None, None]) & (j[None, :, None] < end[:, None, None])
    diagonal = (j[None, :] <= j[:, None])[None]
    causal_ok = ((m == (keys & diagonal)) | ~rows).all()
    full_ok = ((m == keys) | ~rows).all()
    checks = [causal_ok, full_ok]
    if window is not None:
        band = (j[None, :] > j[:, None] - window)[None]  # transformers' i − j < window
        checks.append(((m == (keys & diagonal & band)) | ~rows).all())
    found = torch.stack(checks).tolist()  # the host read
    causal, full = found[0], found[1]
    windowed = window is not None and found[2] and not causal
    if not (causal or full or windowed):
        return None
    return start.to(torch.int32), (end - start).to(torch.int32), (bool(causal) or windowed) and s > 1, windowed


def _padded_prefill(query, key, value, padded, scaling, features):
    """A padded batch's forward through varlen: [B, H, S, D] views in, [B, S, H, D] out (padding
    rows zero). The batch runs as the pack [B·S, H, D], sequence b from b·S + start[b] for its
    used tokens (seqused_q = seqused_k): no unpadding, no host read. `features`: (window_size,
    softcap, fp32 sinks or None), checked."""
    from .varlen import attention_varlen_op

    start, used, causal, _ = padded
    (wl, wr), softcap, sinks = features
    b, s = query.shape[0], query.shape[2]
    q, k, v = (t.transpose(1, 2).reshape(b * s, t.shape[1], t.shape[3]) for t in (query, key, value))
    base = torch.arange(b + 1, dtype=torch.int32, device=query.device) * s
    cu = torch.cat([base[:b] + start, base[b:]])
    # Under grad the forward keeps its LSE for the backward (python/flashcore/varlen_autograd.py).
    grad = _checks.needs_grad(query, key, value, sinks)
    out, _ = attention_varlen_op(q, k, v, cu, cu, used, s, s, causal, scaling, grad, used, wl, wr, softcap, sinks)
    return out.view(b, s, query.shape[1], query.shape[3])


# Masks window_of has analysed, keyed by (id, Sq, Sk, window), as _LEFTPAD.
_WINDOW = {}


def window_of(mask, query, key, window):
    """Whether a boolean mask [B or 1, 1, Sq, Sk] is exactly transformers' causal sliding window of
    `window` with no padding: query i (position Sk − Sq + i) sees key j iff
    i + Sk − Sq − window < j <= i + Sk − Sq. Then flashcore computes it as causal attention with
    window_size (window − 1, 0). One host read per mask tensor, as ``leftpad_of``; never under
    torch.compile or with fake tensors (False: the call falls back)."""
    from .ops import eager

    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4 or not eager(mask):
        return False
    sq, sk = query.shape[2], key.shape[2]
    if mask.shape[0] not in (1, query.shape[0]) or mask.shape[1] != 1 or tuple(mask.shape[2:]) != (sq, sk):
        return False
    if mask.device != query.device:
        return False
    def analyse(m):
        i = torch.arange(sq, device=m.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=m.device)[None, :]
        want = (j <= i) & (j > i - window)
        return bool(torch.equal(m[:, 0], want[None].expand(m.shape[0], sq, sk)))  # the host read

    return _per_mask(_WINDOW, mask, analyse, (sq, sk, window))


def fallback_path(reason):
    """"sdpa" or "eager": where a call that flashcore does not serve for `reason` runs."""
    return "sdpa" if reason in _SDPA_REASONS else "eager"


def eager_function(module):
    """The model's own eager attention: ``eager_attention_forward`` of the Python module that defines
    the attention layer's class (or a base class), as transformers' modeling files call it."""
    for cls in type(module).__mro__:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if callable(fn):
            return fn
    raise NotImplementedError(
        f"flashcore.hf: this call needs the model's eager attention (it passes arguments that neither "
        f"flashcore nor SDPA computes), but no `eager_attention_forward` was found beside "
        f"{type(module).__qualname__} (module {type(module).__module__}); use attn_implementation='eager'"
    )


def eager_mask(attention_mask, query, key, causal):
    """The additive float mask eager attention adds to its scores, from what "fcore"'s mask builder
    (``sdpa_mask``) gave: a boolean mask (True = attend) becomes 0 / the dtype's lowest value (as
    transformers' ``eager_mask`` makes it); None with a causal call of Sq > 1 is the top-left causal
    mask the SDPA path would apply through is_causal (the builder leaves it out only where that is
    exact); otherwise None (full attention). Float masks are already additive."""
    if attention_mask is None:
        if not causal:
            return None
        sq, sk = query.shape[2], key.shape[2]
        visible = torch.ones(sq, sk, dtype=torch.bool, device=query.device).tril()
        attention_mask = visible[None, None]
    if attention_mask.dtype == torch.bool:
        low = torch.finfo(query.dtype).min
        zero = torch.zeros((), dtype=query.dtype, device=attention_mask.device)
        return torch.where(attention_mask, zero, low)
    return attention_mask


def _eager_forward(module, query, key, value, attention_mask, dropout, scaling, causal, kwargs):
    fn = eager_function(module)
    mask = eager_mask(attention_mask, query, key, causal)
    args = (module, query, key, value, mask)
    kw = dict(kwargs, dropout=dropout, scaling=scaling)
    try:
        inspect.signature(fn).bind(*args, **kw)
    except TypeError as e:
        raise NotImplementedError(
            f"flashcore.hf: the eager attention of {type(module).__qualname__} does not take this call's "
            f"arguments ({sorted(kw)}): {e}; use attn_implementation='eager'"
        ) from None
    return fn(*args, **kw)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: [B, H, S, D] in, ([B, S, H, D] out, weights)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' SDPA path: a single query token attends to every key.
    causal = bool(is_causal) and query.shape[2] > 1
    reason = fallback_reason(query, key, value, attention_mask, dropout, scaling, kwargs)
    leftpad = padded = None
    windowed = False
    window = kwargs.get("sliding_window")
    if (reason is not None and attention_mask is not None and isinstance(window, int) and not isinstance(window, bool)
            and window > 0 and window_of(attention_mask, query, key, window)):
        # The mask is the causal window itself: flashcore computes it from the window when it
        # serves the same call without the mask; otherwise the call keeps its reason (and mask).
        if fallback_reason(query, key, value, None, dropout, scaling, kwargs) is None:
            windowed, reason = True, None
    # A mask with sinks, a softcap or a window beside it (their reason comes first): analysed as
    # a plain mask when the call is served once the mask is (gpt-oss, Gemma 2 batches).
    featured = (attention_mask is not None and reason in ("s_aux", "softcap", "sliding_window")
                and fallback_reason(query, key, value, attention_mask, dropout, scaling, kwargs, mask_served=True) is None)
    if reason == "attention_mask" or featured:
        # A decode step of a padded batch: served over the keys from each sequence's first.
        leftpad = leftpad_of(attention_mask, query, key)
        grad = _checks.needs_grad(query, key, value, kwargs.get("s_aux"))
        if leftpad is None and (not grad or query.shape[-1] in _checks.VARLEN_BACKWARD_HEAD_DIMS):
            # A forward pass or prefill of a padded batch (left or right), its sliding window too:
            # served through varlen. Training too (varlen's backward, every head dim,
            # with the window, softcap and sinks — the sinks' gradient included).
            w = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
            padded = padded_prefill_of(attention_mask, query, key, w)
        if leftpad is not None or padded is not None:
            reason = fallback_reason(query, key, value, attention_mask, dropout, scaling, kwargs, mask_served=True)
    if reason is None and leftpad is None and not windowed and causal and query.shape[2] != key.shape[2]:
        # Sinks, a softcap or a window on a causal call of Sq != Sk without a mask: SDPA's top-left
        # alignment, which flashcore's features do not take yet.
        if _served_features(kwargs, key, False) is not None:
            reason = "s_aux" if kwargs.get("s_aux") is not None else "softcap" if _nonzero(kwargs.get("softcap")) else "sliding_window"
    if reason is not None:
        path = fallback_path(reason)
        stats["fallback"] += 1
        stats[path] += 1
        reasons[reason] = reasons.get(reason, 0) + 1
        if path == "eager":
            return _eager_forward(module, query, key, value, attention_mask, dropout, scaling, causal, kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    stats["flashcore"] += 1
    # transformers hands [B, H, S, D] views and wants [B, S, H, D] back: run in flashcore's bshd
    # layout on the transposed views (read in place), so the output needs no transposing copy.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    _checks.split_shape(q, k, v, "bshd")
    if leftpad is not None:
        from .kvcache import _attention_kvcache

        start, causal = leftpad
        ends = torch.full_like(start, key.shape[2])
        # The mask's first keys carry a window (and the padding); sinks and a softcap come along.
        feats = _mask_features(kwargs, q, (-1, -1))
        out, _ = _attention_kvcache(q, k, v, ends, None, causal, scaling, False, False, False, start, feats)
        return out, None
    if padded is not None:
        window_size = (window - 1, 0) if padded[3] else (-1, -1)
        feats = _mask_features(kwargs, q, window_size, grad=_checks.needs_grad(query, key, value, kwargs.get("s_aux")))
        return _padded_prefill(query, key, value, padded, _checks.check_scale(scaling), feats), None
    features = _served_features(kwargs, key, windowed)
    if features is not None:
        from .api import attention

        window_size, softcap, sinks = features
        # A window mask is bottom-right aligned (positions Sk − Sq + i); without a mask the call is
        # square or has one query (where both alignments agree) or is not causal.
        return attention(q, k, v, causal=causal or windowed, scale=_checks.check_scale(scaling), layout="bshd",
                         window_size=window_size, softcap=softcap, learnable_sink=sinks), None
    return top_left(q, k, v, causal, _checks.check_scale(scaling), bhsd=False), None


def _mask_features(kwargs, q, window_size, grad=False):
    """(window_size, softcap, fp32 sinks or None) of a call served over its mask (a padded
    prefill or decode step), checked as the KV-cache and varlen ops take them. `grad`: autograd
    records the call, so the sinks' fp32 copy keeps its link to the model's parameter."""
    softcap = kwargs.get("softcap")
    softcap = float(softcap) if _nonzero(softcap) else 0.0
    if grad:
        return _checks.check_features(window_size, softcap, _checks.sinks_f32_grad(kwargs.get("s_aux")), q, q.shape[-2])
    return _checks.features(window_size, softcap, kwargs.get("s_aux"), q, q.shape[-2])


def _served_features(kwargs, key, windowed):
    """flashcore's (window_size, softcap, learnable_sink) for a served call, or None when the call
    has none of them (then it runs as before)."""
    window = kwargs.get("sliding_window")
    wsize = (-1, -1)
    if window is not None and (windowed or key.shape[2] > window):
        wsize = (window - 1, 0)
    softcap = kwargs.get("softcap")
    softcap = float(softcap) if _nonzero(softcap) else 0.0
    sinks = kwargs.get("s_aux")
    if wsize == (-1, -1) and softcap == 0.0 and sinks is None:
        return None
    return wsize, softcap, sinks


_SDPA_MASKS = {}


def _takes_sdpa_masks(config):
    """Whether models of `config`'s type run attention through transformers' attention functions
    (they support "sdpa" or attention backends), so that "sdpa"'s masks are what they want."""
    kind = getattr(config, "model_type", None)
    if kind not in _SDPA_MASKS:
        import transformers
        from transformers.models.auto import modeling_auto as auto

        names = auto.MODEL_MAPPING_NAMES.get(kind) or auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind)
        takes = True  # a model type transformers does not know (remote code): as for "sdpa"
        if names:
            try:
                cls = getattr(transformers, names if isinstance(names, str) else names[0])
                takes = bool(cls._supports_sdpa or cls._supports_attention_backend)
            except (AttributeError, ImportError):
                pass
        _SDPA_MASKS[kind] = takes
    return _SDPA_MASKS[kind]


def build_mask(*args, config=None, **kwargs):
    """"fcore"'s mask builder: transformers' ``sdpa_mask``, as for "sdpa" (a boolean mask, or None
    where plain causal or full attention is exact). transformers lets any model pick a registered
    attention name, also one whose own attention code never calls an attention function and adds
    the mask to its scores itself (Bloom, GPT-J, ...: models that support neither "sdpa" nor
    attention backends); those get ``eager_mask``, the additive mask they have under "eager"."""
    from transformers.masking_utils import eager_mask as additive_mask, sdpa_mask

    if config is not None and not _takes_sdpa_masks(config):
        return additive_mask(*args, config=config, **kwargs)
    return sdpa_mask(*args, config=config, **kwargs)


def register(name=NAME):
    """Registers `name` with transformers' AttentionInterface and its mask builder
    (``build_mask``); returns it, for ``attn_implementation=``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if "flash" in name:
        raise ValueError(
            f"flashcore: transformers takes any attention name containing 'flash' ({name!r}) for a "
            "flash-attn kernel to download; register under another name (the default is 'fcore')"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, build_mask)
    return name
