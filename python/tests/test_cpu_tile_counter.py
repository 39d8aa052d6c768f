"""Long causal prefill at d64, d96 and d128 passes the dynamic tile order's counter; nothing else
does. The counter is kept per (device, stream) and reused, zeroed once, outside a CUDA graph
capture, and fresh per call while one is captured. No GPU: CPU tensors pose as device 0's and
native calls are recorded."""

import pytest
import torch

import flashcore
from flashcore import _launch
from test_cpu_call_routes import _dense, rec  # noqa: F401 (the fixture)

COUNTER = torch.zeros(16, dtype=torch.int32)


@pytest.fixture
def counter(monkeypatch):
    taken = []

    def tile_counter(dev, stream):
        taken.append((dev, stream))
        return COUNTER.data_ptr()

    monkeypatch.setattr(_launch, "_tile_counter", tile_counter)
    return taken


@pytest.mark.parametrize(
    "sq, causal, d, passed",
    [(1024, True, 64, True), (2048, True, 64, True), (1000, True, 64, False), (1024, False, 64, False),
     (16, True, 64, False), (2048, True, 128, True), (1024, True, 96, True), (2048, False, 128, False),
     (1000, True, 128, False), (2048, True, 256, False)],
)
def test_only_long_causal_prefill_of_the_dynamic_head_dims_passes_a_counter(rec, counter, sq, causal, d, passed):  # noqa: F811
    a = _dense(b=1, sq=sq, sk=sq, hq=2, hkv=2, d=d)
    flashcore.flash_attn_func(a["q"], a["k"], a["v"], causal=causal)
    assert len(rec.calls) == 1
    assert ("tile_counter" in rec.calls[0]) == passed, rec.calls[0].keys()
    assert counter == ([(0, 1234)] if passed else [])


def test_the_counter_is_kept_per_stream_and_fresh_while_capturing(monkeypatch):
    made = []

    def zeros(n, dtype=None, device=None):
        t = torch.full((n,), 0, dtype=dtype)
        made.append(t)
        return t

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(_launch, "_counters", {})
    monkeypatch.setattr(_launch, "_counter_words", {})
    monkeypatch.setattr(torch, "zeros", zeros)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: Props())
    monkeypatch.setattr(_launch, "_capturing", lambda: False)
    a = _launch._tile_counter(0, 11)
    assert _launch._tile_counter(0, 11) == a and len(made) == 1, "kept per stream"
    assert made[0].numel() == _launch._native.tile_counter_words(132) == 2 + 2 * 132
    assert made[0].dtype == torch.int32 and not made[0].any(), "zero"
    assert _launch._tile_counter(0, 12) != a and len(made) == 2, "another stream, another counter"
    monkeypatch.setattr(_launch, "_capturing", lambda: True)
    c1, c2 = _launch._tile_counter(0, 11), _launch._tile_counter(0, 11)
    assert len(made) == 4 and c1 != a and c2 != a, "fresh per call while capturing"
    assert set(_launch._counters) == {(0, 11), (0, 12)}, "none kept from a capture"
