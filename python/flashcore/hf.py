"""flashcore as a Hugging Face ``transformers`` attention backend.

    import flashcore.hf
    flashcore.hf.register()                       # returns the name: "fcore"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fcore")

The name is "fcore", not "flashcore": transformers (5.x) treats every implementation name that
contains "flash" as a flash-attn kernel to fetch from its hub, so "flashcore" cannot be used.

Masks are built as for "sdpa" (transformers' ``sdpa_mask``), which leaves them out when plain
causal or full attention is exact. Those calls — fp16/bf16, head dim 64/128, on an sm_90 GPU —
run on flashcore, with SDPA's semantics (causal top-left aligned when Sq ≠ Sk). Everything else
(a padding or sliding-window mask, dropout, softcap, other head dims or dtypes) runs on
transformers' own SDPA path, so results stay right; ``stats`` counts both.
"""

import torch

from . import _checks
from .api import top_left

NAME = "fcore"

stats = {"flashcore": 0, "fallback": 0}


def _supported(query, key, value, attention_mask, dropout, kwargs):
    if attention_mask is not None or dropout != 0.0:
        return False
    if kwargs.get("softcap") or kwargs.get("sliding_window") or kwargs.get("position_bias") is not None:
        return False
    if kwargs.get("output_attentions", False):
        return False
    if query.device.type != "cuda" or query.dtype not in _checks.SUPPORTED_DTYPES:
        return False
    if len({query.dtype, key.dtype, value.dtype}) != 1:
        return False
    d = query.shape[-1]
    if d not in _checks.SUPPORTED_HEAD_DIMS or key.shape[-1] != d or value.shape[-1] != d:
        return False
    if query.shape[1] % key.shape[1] != 0:
        return False
    return torch.cuda.get_device_capability(query.device) == (9, 0)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: [B, H, S, D] in, ([B, S, H, D] out, None)."""
    if not _supported(query, key, value, attention_mask, dropout, kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        stats["fallback"] += 1
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    stats["flashcore"] += 1
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' SDPA path: a single query token attends to every key.
    causal = bool(is_causal) and query.shape[2] > 1
    # transformers hands [B, H, S, D] views and wants [B, S, H, D] back: run in flashcore's bshd
    # layout on the transposed views (read in place), so the output needs no transposing copy.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    _checks.split_shape(q, k, v, "bshd")
    _checks.check_no_grad(q, k, v)
    return top_left(q, k, v, causal, _checks.check_scale(scaling), bhsd=False), None


def register(name=NAME):
    """Registers `name` with transformers' AttentionInterface (and its mask builder, as for
    "sdpa"); returns it, for ``attn_implementation=``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if "flash" in name:
        raise ValueError(
            f"flashcore: transformers takes any attention name containing 'flash' ({name!r}) for a "
            "flash-attn kernel to download; register under another name (the default is 'fcore')"
        )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
