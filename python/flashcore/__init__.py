"""flashcore for PyTorch: data-oblivious fused attention for NVIDIA Hopper (sm_90a), with kernels
compiled at run time by NVRTC (no nvcc). Differentiable: the three entry points below train
(flashcore.autograd: a bitwise deterministic, batch-invariant backward).

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)            # [B, S, H, D], flash-attn layout
    out = flashcore.flash_attn_func(q, k, v, causal=True)      # flash-attn's signature
    out = flashcore.scaled_dot_product_attention(q, k, v)      # SDPA's signature, [B, H, S, D]

Also: ``torch.nn.attention.activate_flash_attention_impl("flashcore")`` (torch ≥ 2.10) and
``flashcore.hf.register()`` for transformers. Each call is the custom op
``torch.ops.flashcore.attention`` (torch.compile and CUDA graphs see an opaque op), its backward
``torch.ops.flashcore.attention_backward``.
"""

from . import _env

_env.setup()

from . import _native  # noqa: E402
from . import ops, autograd, sdpa_backend  # noqa: E402
from .api import attention, flash_attn_func, prepare, scaled_dot_product_attention  # noqa: E402
from . import kvcache  # noqa: E402
from .kvcache import flash_attn_with_kvcache  # noqa: E402
from . import varlen  # noqa: E402
from . import varlen_autograd  # noqa: E402,F401
from .varlen import flash_attn_varlen_func  # noqa: E402
# The head dims the kernels are built at (forward; with a backward), read from the native variant
# table that also generates docs/support.md.
from ._checks import BACKWARD_HEAD_DIMS, SUPPORTED_HEAD_DIMS  # noqa: E402

sdpa_backend.register()  # known to torch's registry; activated only by the user

__version__ = "0.1.0"
__all__ = ["attention", "flash_attn_func", "flash_attn_with_kvcache", "flash_attn_varlen_func", "varlen", "scaled_dot_product_attention", "prepare", "ops", "autograd", "sdpa_backend", "kvcache",
           "SUPPORTED_HEAD_DIMS", "BACKWARD_HEAD_DIMS"]
