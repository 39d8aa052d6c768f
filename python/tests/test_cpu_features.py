"""The window, softcap and sink features (window_size, softcap, learnable_sink) on the KV-cache, chunked-prefill and
varlen entry points, without a GPU: every error path, the ops' schemas and fake shapes (so
torch.compile sees them), one opaque node per call when traced, and flashcore.hf's analysis of
padded sliding-window masks and its routing of featured calls over masks."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import flashcore
import flashcore.hf as fh
from flashcore import varlen

F16 = torch.float16


@pytest.fixture
def fake():
    with FakeTensorMode() as mode:
        yield mode


def cuda(*shape, dtype=F16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def _cu(vals):
    return torch.tensor(vals, dtype=torch.int32, device="cuda")


def _sinks_made(kwargs):
    """A learnable_sink given as a shape (tuple), made a CUDA tensor now (under fake mode)."""
    sink = kwargs.get("learnable_sink")
    if isinstance(sink, tuple):
        return dict(kwargs, learnable_sink=torch.zeros(*sink, device="cuda"))
    return kwargs


def test_schemas_take_the_features():
    for op in (torch.ops.flashcore.attention_kvcache, torch.ops.flashcore.attention_kvcache_append,
               torch.ops.flashcore.attention_varlen):
        names = [a.name for a in op.default._schema.arguments]
        assert names[-4:] == ["window_left", "window_right", "softcap", "sinks"], names


# --- flash_attn_with_kvcache ------------------------------------------------------------------


def test_kvcache_features_fake_shapes(fake):
    q, kc = cuda(2, 1, 8, 64), cuda(2, 100, 2, 64)
    sinks = torch.zeros(8, device="cuda", dtype=torch.bfloat16)  # any float dtype: taken as fp32
    out, lse = flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=7, causal=True, window_size=(16, 0),
                                                 softcap=30.0, learnable_sink=sinks, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 1)
    k = cuda(2, 1, 2, 64)
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    out = flashcore.flash_attn_with_kvcache(q, kc, kc, k, k, cache_seqlens=lens, window_size=(5, 3), softcap=2.0,
                                            secret_lengths=True)
    assert out.shape == q.shape
    # Chunked prefill (more than 16 positions): through varlen with the same features.
    q32 = cuda(2, 32, 8, 64)
    out = flashcore.flash_attn_with_kvcache(q32, kc, kc, cache_seqlens=lens + 40, causal=True, window_size=(8, -1),
                                            softcap=5.0, learnable_sink=torch.zeros(8, device="cuda"))
    assert out.shape == q32.shape


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(window_size=(-2, 0)), ValueError, "window_size entries"),
        (dict(window_size=(1, 2, 3)), ValueError, "a pair"),
        (dict(window_size=(1.5, 0)), TypeError, "must be ints"),
        (dict(softcap=-1.0), ValueError, "softcap must be 0"),
        (dict(softcap=float("nan")), ValueError, "softcap must be 0"),
        (dict(softcap="50"), TypeError, "softcap must be a number"),
        (dict(learnable_sink=[0.0] * 8), TypeError, "learnable_sink must be a torch.Tensor"),
        (dict(learnable_sink=(4,)), ValueError, "one logit per query head"),
        (dict(window_size=(16, 0), num_splits=1), ValueError, "num_splits=1"),
        (dict(softcap=30.0, num_splits=1), ValueError, "num_splits=1"),
    ],
)
def test_kvcache_bad_features(fake, kwargs, exc, message):
    q, kc = cuda(2, 1, 8, 64), cuda(2, 100, 2, 64)
    kwargs = _sinks_made(kwargs)
    with pytest.raises(exc, match=message):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, **kwargs)


def test_kvcache_bad_features_in_chunked_prefill(fake):
    q, kc = cuda(2, 32, 8, 64), cuda(2, 100, 2, 64)
    with pytest.raises(ValueError, match="one logit per query head"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=40, learnable_sink=torch.zeros(3, device="cuda"))
    with pytest.raises(ValueError, match="softcap must be 0"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=40, softcap=-2.0)


def test_kvcache_sink_that_requires_grad_is_refused():
    q, kc = torch.empty(2, 1, 8, 64, dtype=F16), torch.empty(2, 100, 2, 64, dtype=F16)
    with pytest.raises(RuntimeError, match="requires grad"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, learnable_sink=torch.zeros(8, requires_grad=True))


def test_kvcache_op_fakes_check_the_features(fake):
    q, kc = cuda(2, 1, 8, 64), cuda(2, 100, 2, 64)
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    op = torch.ops.flashcore.attention_kvcache
    out, _ = op(q, kc, kc, lens, None, True, None, False, False, False, None, 16, 0, 30.0, None)
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="softcap must be 0"):
        op(q, kc, kc, lens, None, True, None, False, False, False, None, -1, -1, -3.0, None)
    with pytest.raises(ValueError, match="num_splits=1"):
        op(q, kc, kc, lens, None, True, None, False, False, True, None, 16, 0, 0.0, None)
    with pytest.raises(ValueError, match="learnable_sink must be float32"):
        op(q, kc, kc, lens, None, True, None, False, False, False, None, -1, -1, 0.0, torch.zeros(8, device="cuda"
                                                                                               ).half())


def test_kvcache_call_traces_as_one_opaque_node(fake):
    q, kc = cuda(2, 1, 8, 64), cuda(2, 100, 2, 64)
    lens = torch.full((2,), 7, dtype=torch.int32, device="cuda")
    sinks = torch.zeros(8, device="cuda")

    def f(q, kc, lens, sinks):
        return flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, causal=True, window_size=(16, 0),
                                                 softcap=30.0, learnable_sink=sinks)

    graph = make_fx(f)(q, kc, lens, sinks)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "flashcore" in str(n.target)]
    assert [str(c.target) for c in calls] == ["flashcore.attention_kvcache.default"]
    assert list(calls[0].args[-4:-1]) == [16, 0, 30.0]


# --- flash_attn_varlen_func ------------------------------------------------------------------


def _pack(tq=8, tk=10, hq=4, hkv=2, d=64):
    return cuda(tq, hq, d), cuda(tk, hkv, d), cuda(tk, hkv, d)


def test_varlen_features_fake_shapes_and_one_node(fake):
    q, k, v = _pack()
    cq, ck = _cu([0, 3, 8]), _cu([0, 4, 10])
    sinks = torch.zeros(4, device="cuda")
    out, lse = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 5, 6, causal=True, window_size=(2, 0), softcap=3.0,
                                                learnable_sink=sinks, return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, 8)

    def f(q, k, v, cq, ck, sinks):
        return flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 5, 6, window_size=(2, 1), softcap=3.0,
                                                learnable_sink=sinks)

    graph = make_fx(f)(q, k, v, cq, ck, sinks)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "flashcore" in str(n.target)]
    assert [str(c.target) for c in calls] == ["flashcore.attention_varlen.default"]
    assert list(calls[0].args[-4:-1]) == [2, 1, 3.0]


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(window_size=(-3, -1)), ValueError, "window_size entries"),
        (dict(window_size=5), ValueError, "a pair"),
        (dict(softcap=-0.5), ValueError, "softcap must be 0"),
        (dict(softcap=None), TypeError, "softcap must be a number"),
        (dict(learnable_sink=(2,)), ValueError, "one logit per query head"),
        (dict(learnable_sink=(4, 1)), ValueError, "one logit per query head"),
    ],
)
def test_varlen_bad_features(fake, kwargs, exc, message):
    q, k, v = _pack()
    kwargs = _sinks_made(kwargs)
    with pytest.raises(exc, match=message):
        flashcore.flash_attn_varlen_func(q, k, v, _cu([0, 3, 8]), _cu([0, 4, 10]), 5, 6, **kwargs)


def test_varlen_sink_that_requires_grad_reaches_the_op():
    # Branch bwdcombo: the varlen backward takes sinks; the call gets past the grad checks to the
    # op's device check (CPU tensors here).
    q = torch.empty(8, 4, 64, dtype=F16)
    k = torch.empty(10, 2, 64, dtype=F16)
    cq = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        flashcore.flash_attn_varlen_func(q, k, k, cq, cq, 5, 6, learnable_sink=torch.zeros(4, requires_grad=True))


def test_varlen_op_fake_checks_the_features(fake):
    q, k, v = _pack()
    cq, ck = _cu([0, 3, 8]), _cu([0, 4, 10])
    with pytest.raises(ValueError, match="window_size entries"):
        torch.ops.flashcore.attention_varlen(q, k, v, cq, ck, None, 5, 6, False, None, False, None, -5, 0, 0.0, None)


def test_rust_validate_varlen_checks_the_features():
    shape = (2, 5, 6, 4, 2, 64)
    t = (0x10000, (0, 4 * 64, 64))
    tk = (0x20000, (0, 2 * 64, 64))
    meta = (0x30000, 0x30100, 0, 0)
    args = ("f16", shape, False, None, t, tk, tk, (0x40000, (0, 4 * 64, 64)), (8, 10), 0, meta, 0x50000)
    flashcore._native.validate_varlen(*args, window=(3, 0), softcap=2.0, sinks=0x60000)
    with pytest.raises(ValueError, match="sinks"):
        flashcore._native.validate_varlen(*args, sinks=0x60002)
    with pytest.raises(ValueError, match="softcap"):
        flashcore._native.validate_varlen(*args, softcap=-1.0)
    with pytest.raises(ValueError, match="window_size"):
        flashcore._native.validate_varlen(*args, window=(-4, 0))


def test_rust_validate_varlen_checks_a_paged_cache():
    """The paged cache behind a varlen call (chunked prefill read in the kernel): pools
    [num_pages, page, Hkv, D], max_seqlen_k the capacity, total_k = batch · capacity."""
    shape = (2, 5, 64, 4, 2, 64)  # capacity 64: four 16-row pages per sequence
    t = (0x10000, (0, 4 * 64, 64))
    pool = (0x20000, (16 * 2 * 64, 2 * 64, 64))
    meta = (0x30000, 0x30100, 0x30200, 0)
    args = ("f16", shape, False, None, t, pool, pool, (0x40000, (0, 4 * 64, 64)), (8, 128), 0, meta, 0x50000)
    flashcore._native.validate_varlen(*args, pages=(0x60000, 16, 9, False))
    with pytest.raises(ValueError, match="total_k"):
        flashcore._native.validate_varlen(*args[:8], (8, 100), *args[9:], pages=(0x60000, 16, 9, False))
    with pytest.raises(ValueError, match="block_table"):
        flashcore._native.validate_varlen(*args, pages=(0x60002, 16, 9, False))
    with pytest.raises(ValueError, match="seqlen_k"):
        flashcore._native.validate_varlen(*args, pages=(0x60000, 7, 9, False))
    with pytest.raises(ValueError, match="num_pages"):
        flashcore._native.validate_varlen(*args, pages=(0x60000, 16, 0, False))


# --- flashcore.hf ----------------------------------------------------------------------------


def _padded_window_mask(lens, s, window, side="left"):
    m = torch.zeros(len(lens), 1, s, s, dtype=torch.bool)
    rows, cols = torch.arange(s)[:, None], torch.arange(s)[None, :]
    for b, n in enumerate(lens):
        lo, hi = (s - n, s) if side == "left" else (0, n)
        vis = (cols >= lo) & (cols < hi) & (cols <= rows) & (rows - cols < window)
        if side == "left":
            vis = vis & (rows >= lo)
        m[b, 0] = vis
    return m


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_sliding_window_masks_are_recognised(side):
    s, lens, w = 24, [24, 13, 1], 6
    m = _padded_window_mask(lens, s, w, side)
    q = torch.empty(3, 4, s, 64)
    start, used, causal, windowed = fh.padded_prefill_of(m, q, q, w)
    assert used.tolist() == lens and causal and windowed
    assert start.tolist() == ([s - n for n in lens] if side == "left" else [0, 0, 0])
    # Without the window, or with another one, the mask is not recognised.
    assert fh.padded_prefill_of(m, q, q) is None
    assert fh.padded_prefill_of(m, q, q, w + 1) is None
    # A window wider than every sequence changes nothing: plain causal padding.
    wide = _padded_window_mask(lens, s, 100, side)
    assert fh.padded_prefill_of(wide, q, q, 100)[2:] == (True, False)


@pytest.fixture
def gpu(monkeypatch):
    monkeypatch.setattr(fh, "_gpu_ok", lambda device: True)
    with FakeTensorMode():
        yield


def test_features_over_a_served_mask_are_served(gpu):
    # A decode step or padded prefill whose mask flashcore computes (mask_served) is served with
    # sinks and a softcap: the KV-cache and varlen kernels take them.
    q = cuda(2, 4, 1, 64, dtype=torch.bfloat16)
    k = cuda(2, 2, 40, 64, dtype=torch.bfloat16)
    mask = torch.ones(2, 1, 1, 40, dtype=torch.bool, device="cuda")
    kw = dict(s_aux=torch.zeros(4, device="cuda"), softcap=50.0, sliding_window=16)
    assert fh.fallback_reason(q, k, k, mask, 0.0, 0.125, kw, mask_served=True) is None
    # Without the mask being served, their reason still comes first (the model's eager attention).
    assert fh.fallback_reason(q, k, k, mask, 0.0, 0.125, kw) == "s_aux"
    bad = dict(kw, s_aux=torch.zeros(3, device="cuda"))
    assert fh.fallback_reason(q, k, k, mask, 0.0, 0.125, bad, mask_served=True) == "s_aux"


def test_dynamo_fullgraph_traces_featured_calls():
    # torch.compile(fullgraph=True) over fake CUDA tensors (no GPU): a featured and a plain decode
    # step, a featured varlen call and a featured chunked prefill become flashcore ops in one graph
    # with no break (an `is` on the feature tuple broke it once: found on the H100).
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = []

    def backend(gm, example):
        graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "flashcore" in str(n.target)])
        return gm  # runs the ops' fake implementations

    def step(qd, kc, vc, lens, sinks, q, k, v, cq, ck):
        o = flashcore.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True, window_size=(64, -1),
                                              softcap=30.0, learnable_sink=sinks)
        p = flashcore.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, causal=True)
        a = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 200, 300, causal=True, window_size=(32, -1),
                                             softcap=5.0, learnable_sink=sinks)
        c = flashcore.flash_attn_with_kvcache(q.view(1, -1, 8, 64)[:, :40], kc[:1], vc[:1], cache_seqlens=lens[:1],
                                              causal=True, window_size=(8, -1), softcap=2.0, learnable_sink=sinks)
        return o, p, a, c

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = (cuda(2, 1, 8, 64), cuda(2, 512, 2, 64), cuda(2, 512, 2, 64), cuda(2, dtype=torch.int32),
                cuda(8, dtype=torch.float32), cuda(282, 8, 64), cuda(489, 2, 64), cuda(489, 2, 64),
                cuda(4, dtype=torch.int32), cuda(4, dtype=torch.int32))
        torch.compile(step, fullgraph=True, backend=backend)(*args)
    assert graphs == [["flashcore.attention_kvcache.default", "flashcore.attention_kvcache.default",
                       "flashcore.attention_varlen.default", "flashcore.attention_varlen.default"]]
