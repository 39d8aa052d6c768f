"""flashcore as the local attention kernel of PyTorch's context parallelism
(``torch.distributed.tensor.experimental.context_parallel``, ring attention over NCCL).

How torch 2.11's CP reaches flashcore: inside ``context_parallel(mesh, ...)``,
``F.scaled_dot_product_attention`` is patched to wrap q, k, v as DTensors sharded on the sequence;
SDPA picks its backend as usual and emits ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention``,
which DTensor hands to CP's ring (``_templated_ring_attention``). The ring calls the *same aten op*
on plain local CUDA tensors once per KV shard and merges the outputs with their LSE ([B, H, Sq]
fp32, natural log: the flash op's layout, which flashcore's backend returns). Those local calls go
through the dispatcher, so a flash implementation activated with
``torch.nn.attention.activate_flash_attention_impl("flashcore")`` (``flashcore.sdpa_backend``)
serves them, forward and backward (``_scaled_dot_product_flash_attention_backward``). What CP
sends it: square causal calls (its own shard), non-causal calls with Sq != Sk (half a KV shard, or
the second half of the query shard: a strided view), and backward calls with the merged output and
LSE. No new kernel or communication is needed; the glue is choosing the flash backend and proving
where the calls ran:

    with flashcore.context_parallel.local_attention() as calls:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    calls.require(forward=flashcore.context_parallel.local_calls(world_size))

Without the flash backend selected, SDPA may pick cuDNN or the memory-efficient kernel, whose ops
CP also rings, and flashcore would not see the calls: ``local_attention`` restricts SDPA to the
flash backend for its duration.
"""

import contextlib

import torch

from . import sdpa_backend

_KEYS = ("flashcore", "fallback", "backward", "fallback_backward")


def available():
    """Whether this torch has both the SDPA flash-implementation registry and context parallelism."""
    if not sdpa_backend.available():
        return False
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError:
        return False
    return True


def local_calls(world_size, causal=True, load_balance=True, rank=0):
    """How many local attention calls torch's CP ring makes on `rank` for one SDPA call (the
    backward makes as many): every KV shard is used once, except causal without load balancing,
    where shards of later ranks are skipped."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError("world_size must be a positive int, got %r" % (world_size,))
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError("rank must be in [0, %d), got %r" % (world_size, rank))
    if load_balance and not causal:
        # torch's ring raises "Load balancing requires `is_causal=True`" for this combination.
        raise ValueError("torch's context parallelism load-balances causal attention only: "
                         "set _cp_options.enable_load_balance = False for non-causal calls")
    if causal and not load_balance:
        return rank + 1
    return world_size


class Calls:
    """The SDPA-backend calls made since `local_attention` was entered (deltas of
    ``flashcore.sdpa_backend.stats``): ``served`` forward calls run on flashcore, ``fallback``
    forward calls on PyTorch's kernel, ``backward`` / ``fallback_backward`` likewise."""

    def __init__(self):
        self._start = {k: sdpa_backend.stats[k] for k in _KEYS}

    def _delta(self, key):
        return sdpa_backend.stats[key] - self._start[key]

    @property
    def served(self):
        return self._delta("flashcore")

    @property
    def fallback(self):
        return self._delta("fallback")

    @property
    def backward(self):
        return self._delta("backward")

    @property
    def fallback_backward(self):
        return self._delta("fallback_backward")

    def require(self, forward=None, backward=None):
        """Raises RuntimeError unless every call ran on flashcore and (where given) the counts are
        exactly `forward` and `backward`: the proof that CP's local calls did not run elsewhere."""
        if self.fallback or self.fallback_backward:
            raise RuntimeError("flashcore context parallelism: %d forward and %d backward local calls "
                               "fell back to PyTorch's kernel" % (self.fallback, self.fallback_backward))
        if forward is not None and self.served != forward:
            raise RuntimeError("flashcore context parallelism: expected %d local forward calls on "
                               "flashcore, saw %d" % (forward, self.served))
        if backward is not None and self.backward != backward:
            raise RuntimeError("flashcore context parallelism: expected %d local backward calls on "
                               "flashcore, saw %d" % (backward, self.backward))

    def __repr__(self):
        return "Calls(served=%d, fallback=%d, backward=%d, fallback_backward=%d)" % (
            self.served, self.fallback, self.backward, self.fallback_backward)


@contextlib.contextmanager
def local_attention():
    """Activates flashcore's SDPA flash backend and restricts SDPA to the flash backend, so that the
    local calls of torch's context parallelism run on flashcore; yields a `Calls` counter. On exit
    the flash implementation active before (PyTorch's own or another registered one) is restored."""
    if not available():
        raise RuntimeError("flashcore context parallelism needs torch >= 2.10 (SDPA's "
                           "register_flash_attention_impl and torch.distributed.tensor.experimental."
                           "context_parallel); this torch is %s" % torch.__version__)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa_backend.register()
    previous = torch.nn.attention.current_flash_attention_impl()
    torch.nn.attention.activate_flash_attention_impl(sdpa_backend.NAME)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            yield Calls()
    finally:
        if previous is None:
            torch.nn.attention.restore_flash_attention_impl()
        elif previous != sdpa_backend.NAME:
            torch.nn.attention.activate_flash_attention_impl(previous)
