"""The one-pass decode step of ``flash_attn_with_kvcache`` (a contiguous cache, with or without
new rows: ``_launch.decode``) launches exactly what the checked path launches, declines whatever
it does not serve, and raises the checked path's errors. No GPU: CPU tensors pose as device 0's and
every native call is recorded instead of run."""

import inspect

import pytest
import torch

import flashcore
from flashcore import _launch, kvcache

F16, BF16 = torch.float16, torch.bfloat16


def _native_signature(device, stream, dtype, shape, causal, scale, q, k, v, out, lse=0, lengths=0, workspace=0,
                      kv_lengths=0, kv_secret=False, block_table=0, page_size=0, num_pages=0,
                      kv_prefill_consistent=False, kv_starts=0, window=(-1, -1), softcap=0.0, sinks=0, append=None, tile_counter=0):
    """`_native.attention`'s signature (python/src/lib.rs), to compare calls however they pass
    their arguments."""


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    sig = inspect.signature(_native_signature)

    def record(*a, **kw):
        bound = sig.bind(*a, **kw)
        bound.apply_defaults()
        calls.append(dict(bound.arguments))

    real_check = flashcore._checks.check_tensor

    def check_tensor(name, t):  # CPU tensors pass as CUDA ones (the checked path's rules)
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = torch.empty(t.shape, dtype=t.dtype, device="meta")
            if t.dim() != 4 or t.dtype not in flashcore._checks.SUPPORTED_DTYPES:
                real_check(name, t)
            return
        real_check(name, t)

    scratch = torch.zeros(1 << 22, dtype=torch.uint8)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # every other device rule
    monkeypatch.setattr(flashcore._checks, "check_tensor", check_tensor)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(_launch, "_workspace", lambda n, dev, stream: scratch)
    monkeypatch.setattr(_launch._native, "attention", record)
    monkeypatch.setattr(_launch._native, "attention_kv", as_attention(record))
    return calls


def as_attention(record):
    """`_native.attention_kv` recorded as the `_native.attention` call it stands for (python/src/lib.rs:
    every argument it does not take at its default)."""

    def attention_kv(device, stream, dtype, shape, causal, scale, q, k, v, out, lse, workspace, kv_lengths, append):
        record(device, stream, dtype, shape, causal, scale, q, k, v, out, lse, workspace=workspace,
               kv_lengths=kv_lengths, append=append)

    return attention_kv


def test_recorded_signatures_are_the_native_ones():
    """The recorders above stand for the built module's functions: same parameters, same order."""
    names = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    assert names(_launch._native.attention) == names(_native_signature)
    assert names(_launch._native.attention_kv) == names(as_attention(None))
    # attention_kv's parameters are attention's, less those a plain KV-cache call leaves at default.
    assert set(names(_native_signature)) - set(names(as_attention(None))) == {
        "lengths", "kv_secret", "block_table", "page_size", "num_pages", "kv_prefill_consistent", "kv_starts",
        "window", "softcap", "sinks", "tile_counter"}


def _checked_only(monkeypatch):
    monkeypatch.setattr(kvcache, "decode", lambda *a: None)


def _comparable(call):
    # Everything but the fresh output and LSE buffers' addresses must agree.
    c = dict(call)
    c["out"] = c["out"][1]
    c["lse"] = c["lse"] != 0
    return c


def _case(b=2, sq=1, hq=8, hkv=2, d=128, cap=64, n=1, dtype=BF16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    kc = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    vc = torch.randn(b, cap, hkv, d, generator=g).to(dtype)
    k = torch.randn(b, n, hkv, d, generator=g).to(dtype)
    v = torch.randn(b, n, hkv, d, generator=g).to(dtype)
    lens = torch.tensor([3, cap - n][:b] + [0] * max(0, b - 2), dtype=torch.int32)
    return q, kc, vc, k, v, lens


def _call(*args, **kwargs):
    """(whether the one-pass path served the call before any argument check, its result)."""
    checked = []
    real = kvcache._run

    def spy(call):
        checked.append(call)
        return real(call)

    kvcache._run = spy
    try:
        r = flashcore.flash_attn_with_kvcache(*args, **kwargs)
    finally:
        kvcache._run = real
    return not checked, r


def _served(recorded, *args, **kwargs):
    return _call(*args, **kwargs)[0]


@pytest.mark.parametrize("shape", [dict(), dict(sq=4, n=4), dict(hq=4, hkv=4, d=64, dtype=F16), dict(b=1, cap=8192)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lse", [False, True])
@pytest.mark.parametrize("scale", [None, 0.5])
@pytest.mark.parametrize("append", [True, False])
def test_one_pass_launches_what_the_checked_path_launches(recorded, monkeypatch, shape, causal, lse, scale, append):
    q, kc, vc, k, v, lens = _case(**shape)
    if not append:
        k = v = None
    kw = dict(cache_seqlens=lens, causal=causal, softmax_scale=scale, return_softmax_lse=lse)
    served, r = _call(q, kc, vc, k, v, **kw)
    assert served and len(recorded) == 1
    fast = recorded.pop()
    assert (fast["append"] is not None) == append and fast["kv_lengths"] == lens.data_ptr()
    _checked_only(monkeypatch)
    r2 = flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    assert len(recorded) == 1
    assert _comparable(fast) == _comparable(recorded[0])
    if lse:
        assert r[0].shape == r2[0].shape == q.shape and r[1].shape == r2[1].shape == (q.shape[0], q.shape[2],
                                                                                      q.shape[1])
    else:
        assert r.shape == r2.shape == q.shape and r.is_contiguous()




def _fused(b=2, sq=1, hq=8, hkv=2, d=128, cap=64):
    """q and one new row as views of one fused projection [B, Sq, Hq + 2·Hkv, D] (not contiguous,
    read in place), over caches of `cap` rows."""
    q, kc, vc, _, _, lens = _case(b=b, sq=sq, hq=hq, hkv=hkv, d=d, cap=cap, n=sq)
    fused = torch.randn(b, sq, hq + 2 * hkv, d).to(q.dtype)
    return fused[:, :, :hq], kc, vc, fused[:, :, hq:hq + hkv], fused[:, :, hq + hkv:], lens


@pytest.mark.parametrize("layout", ["fused", "extent-1 strides", "b1"])
@pytest.mark.parametrize("append", [True, False])
def test_one_pass_serves_views_as_the_checked_path_does(recorded, monkeypatch, layout, append):
    """q (and new rows) as views the kernels read in place: served in one pass, with the launch
    the checked path makes, a contiguous output of the same strides, and the views' own
    addresses and strides."""
    if layout == "fused":
        q, kc, vc, k, v, lens = _fused(sq=2)
    else:
        q, kc, vc, k, v, lens = _case(b=1)
        if layout == "extent-1 strides":  # B = Sq = 1: those dims' strides are any
            q = q.as_strided(q.shape, (8 * 999, 8 * 777, q.shape[3], 1))
    if not append:
        k = v = None
    served, r = _call(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
    assert served and len(recorded) == 1
    fast = recorded.pop()
    assert fast["q"] == (q.data_ptr(), q.stride()[:3])
    if append:
        assert fast["append"][:3] == ((k.data_ptr(), k.stride()[:3]), (v.data_ptr(), v.stride()[:3]), k.shape[1])
    _checked_only(monkeypatch)
    r2 = flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
    assert _comparable(fast) == _comparable(recorded.pop())
    assert r.stride() == r2.stride() == torch.empty(q.shape).stride() and fast["out"][1] == r.stride()[:3]


def test_one_pass_declines_under_a_dispatch_mode(recorded):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, kc, vc, k, v, lens = _case()
    with Passthrough():
        assert flashcore._launch.decode(q, kc, vc, (k, v), lens, False, None, False) is None
    assert not recorded
    assert flashcore._launch.decode(q, kc, vc, (k, v), lens, False, None, False) is not None


def test_what_the_one_pass_path_declines(recorded):
    q, kc, vc, k, v, lens = _case()
    assert _served(recorded, q, kc, vc, k, v, cache_seqlens=lens)
    # Strided new rows (head dim not contiguous) are copied by the checked path.
    kt = torch.empty(k.shape[:3] + (k.shape[3] * 2,), dtype=k.dtype)[..., ::2]
    kt.copy_(k)
    assert not _served(recorded, q, kc, vc, kt, v, cache_seqlens=lens)
    # Anything asked beyond the plain step.
    for kw in [dict(window_size=(4, 0)), dict(softcap=1.0), dict(num_splits=1), dict(secret_lengths=True),
               dict(cache_leftpad=torch.zeros(2, dtype=torch.int32)), dict(window_size=[-1, -1])]:
        assert not _served(recorded, q, kc, vc, k, v, cache_seqlens=lens, **kw), kw
    # Counts as an int are made a tensor by the checked path.
    assert not _served(recorded, q, kc, vc, k, v, cache_seqlens=3)
    # Grad needed: the checked path refuses it.
    with pytest.raises(RuntimeError, match="no backward pass"):
        flashcore.flash_attn_with_kvcache(q.clone().requires_grad_(), kc, vc, k, v, cache_seqlens=lens)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(softmax_scale=-1.0), ValueError, "scale must be positive"),
        (dict(softmax_scale=float("nan")), ValueError, "scale must be positive"),
        (dict(num_splits=True), ValueError, "num_splits must be 0"),
        (dict(softcap=False), TypeError, "softcap must be a number"),
        (dict(window_size=(-1.0, -1)), TypeError, "window_size entries must be ints"),
        (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), ValueError, "cache_seqlens must have shape"),
        (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), TypeError, "cache_seqlens must be an int"),
        (dict(k=torch.zeros(2, 1, 4, 128, dtype=BF16)), ValueError, "`k` must be"),
        (dict(v=torch.zeros(2, 2, 2, 128, dtype=BF16)), ValueError, "`v` must be"),
        (dict(v=None), ValueError, "give both k and v"),
    ],
)
def test_errors_are_the_checked_paths(recorded, monkeypatch, change, error, message):
    q, kc, vc, k, v, lens = _case()
    kw = dict(k=k, v=v, cache_seqlens=lens)
    kw.update(change)
    with pytest.raises(error, match=message) as fast:
        flashcore.flash_attn_with_kvcache(q, kc, vc, **kw)
    _checked_only(monkeypatch)
    with pytest.raises(error) as checked:
        flashcore.flash_attn_with_kvcache(q, kc, vc, **kw)
    assert str(fast.value) == str(checked.value)
    assert not recorded
