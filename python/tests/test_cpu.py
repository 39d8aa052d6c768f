"""Tests that need no GPU: the package imports, the ops are registered, every validation error is
raised with a message that says what to change, and fake tensors propagate shapes (CUDA tensors
are made under FakeTensorMode, which needs no device)."""

import copy
import ctypes.util
import inspect
import os
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import flashcore
from flashcore import _launch, _native

F16 = torch.float16


@pytest.fixture
def fake():
    with FakeTensorMode() as mode:
        yield mode


def cuda(*shape, dtype=F16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


# --- the package ---------------------------------------------------------------------------


def test_op_is_registered_with_its_schema():
    schema = str(torch.ops.flashcore.attention.default._schema)
    assert schema.startswith("flashcore::attention(Tensor q, Tensor k, Tensor v, bool causal, float? scale")
    assert "-> (Tensor, Tensor)" in schema
    # The package's head dims are the native variant table's (no list of its own), sorted; every
    # backward head dim has a forward.
    assert flashcore.SUPPORTED_HEAD_DIMS == tuple(_native.SUPPORTED_HEAD_DIMS)
    assert flashcore.BACKWARD_HEAD_DIMS == tuple(_native.BACKWARD_HEAD_DIMS)
    assert list(flashcore.SUPPORTED_HEAD_DIMS) == sorted(set(flashcore.SUPPORTED_HEAD_DIMS))
    assert set(flashcore.BACKWARD_HEAD_DIMS) <= set(flashcore.SUPPORTED_HEAD_DIMS)
    assert 80 not in flashcore.SUPPORTED_HEAD_DIMS  # the unsupported dim the tests use


def test_nvrtc_from_the_torch_wheel_is_found():
    # PyPI's CUDA torch wheels bring nvidia-cuda-nvrtc; flashcore points the Rust side at it.
    root = flashcore._env.nvrtc_wheel_root()
    if root is None:
        pytest.skip("no nvidia-cuda-nvrtc wheel installed")
    assert os.environ["FLASHCORE_CUDA_TOOLS"]
    assert list((root / "lib").glob("libnvrtc.so.*"))


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is present")
def test_no_driver_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="no CUDA driver"):
        _native.device_info(0)


def test_sdpa_backend_registered_not_activated():
    if not flashcore.sdpa_backend.available():
        pytest.skip("this torch has no register_flash_attention_impl")
    assert "flashcore" in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() is None


# --- validation in Python (fake CUDA tensors) ----------------------------------------------


def test_cpu_tensors_are_rejected():
    q = torch.zeros(1, 8, 2, 64, dtype=F16)
    with pytest.raises(ValueError, match=r"`q` is on cpu.*\.cuda\(\)"):
        flashcore.attention(q, q, q)
    with pytest.raises(ValueError, match="is on cpu"):
        flashcore.scaled_dot_product_attention(q, q, q)


def test_not_a_tensor(fake):
    q = cuda(1, 8, 2, 64)
    with pytest.raises(TypeError, match="`k` must be a torch.Tensor"):
        flashcore.attention(q, [1, 2], q)


@pytest.mark.parametrize(
    "make, exc, message",
    [
        (lambda: (cuda(1, 8, 2, 64, dtype=torch.float32),) * 3, TypeError, "float32.*half"),
        (lambda: (cuda(1, 8, 2, 64), cuda(1, 8, 2, 64, dtype=torch.bfloat16), cuda(1, 8, 2, 64)), TypeError, "one dtype"),
        (lambda: (cuda(8, 2, 64),) * 3, ValueError, "must be 4-D"),
        (lambda: (cuda(1, 8, 2, 80),) * 3, ValueError, "head dim 80 is not supported"),
        (lambda: (cuda(1, 8, 6, 64), cuda(1, 8, 4, 64), cuda(1, 8, 4, 64)), ValueError, "multiple of the key/value heads"),
        (lambda: (cuda(1, 8, 2, 64), cuda(2, 8, 2, 64), cuda(2, 8, 2, 64)), ValueError, "batch"),
        (lambda: (cuda(1, 8, 2, 64), cuda(1, 8, 2, 128), cuda(1, 8, 2, 128)), ValueError, "head dim"),
        (lambda: (cuda(1, 8, 2, 64), cuda(1, 8, 2, 64), cuda(1, 9, 2, 64)), ValueError, "v must have k's shape"),
        (lambda: (cuda(1, 0, 2, 64),) * 3, ValueError, "zero-sized"),
    ],
)
def test_bad_inputs(fake, make, exc, message):
    q, k, v = make()
    with pytest.raises(exc, match=message):
        flashcore.attention(q, k, v)


def test_mixed_devices(fake):
    # A fake cuda:1 tensor initialises the real device 1 wherever CUDA is available.
    if torch.cuda.is_available() and torch.cuda.device_count() < 2:
        pytest.skip("a fake second device needs no CUDA or two GPUs")
    q = cuda(1, 8, 2, 64)
    k = torch.empty(1, 8, 2, 64, dtype=F16, device="cuda:1")
    with pytest.raises(ValueError, match="one device"):
        flashcore.attention(q, k, k)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scale(fake, scale):
    q = cuda(1, 8, 2, 64)
    with pytest.raises(ValueError, match="scale must be positive and finite"):
        flashcore.attention(q, q, q, scale=scale)


def test_bad_layout(fake):
    q = cuda(1, 8, 2, 64)
    with pytest.raises(ValueError, match="layout must be"):
        flashcore.attention(q, q, q, layout="sbhd")


def test_secret_lengths_rules(fake):
    q = cuda(2, 8, 2, 64)
    with pytest.raises(TypeError, match="int32"):
        flashcore.attention(q, q, q, secret_lengths=torch.zeros(2, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        flashcore.attention(q, q, q, secret_lengths=torch.zeros(3, dtype=torch.int32, device="cuda"))
    k = cuda(2, 9, 2, 64)
    with pytest.raises(ValueError, match="seqlen_q == seqlen_k"):
        flashcore.attention(q, k, k, secret_lengths=torch.zeros(2, dtype=torch.int32, device="cuda"))


def test_secret_lengths_and_kvcache_refuse_autograd(fake):
    q = cuda(2, 8, 2, 64).requires_grad_()
    k = cuda(2, 8, 2, 64)
    lens = torch.full((2,), 8, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="secret_lengths has no backward"):
        flashcore.attention(q, k, k, secret_lengths=lens)
    with pytest.raises(RuntimeError, match="flash_attn_with_kvcache has no backward"):
        flashcore.flash_attn_with_kvcache(q[:, :1], k, k, cache_seqlens=3)
    with torch.no_grad():
        flashcore.attention(q, k, k, secret_lengths=lens)  # fine without autograd
        flashcore.flash_attn_with_kvcache(q[:, :1], k, k, cache_seqlens=3)


def test_flash_attn_func_rejects_what_it_does_not_do(fake):
    q = cuda(1, 8, 2, 64)
    for kwargs, message in [
        (dict(dropout_p=0.1), "dropout"),
        (dict(alibi_slopes=torch.zeros(2, device="cuda")), "alibi"),
        (dict(return_attn_probs=True), "return_lse"),
        # The arguments are implemented; their bad values are refused.
        (dict(window_size=(-2, 0)), "window_size"),
        (dict(window_size=(1, 2, 3)), "window_size"),
        (dict(softcap=-1.0), "softcap"),
        (dict(softcap=float("nan")), "softcap"),
        (dict(learnable_sink=torch.zeros(3, device="cuda")), "learnable_sink"),
    ]:
        with pytest.raises(ValueError, match=message):
            flashcore.flash_attn_func(q, q, q, **kwargs)


# flash-attn 2's flash_attn_func (flash_attn/flash_attn_interface.py, 2.6-2.8): its parameters in order
# with their defaults. flashcore's must be the same, each one implemented or refused.
FLASH_ATTN_FUNC = [
    ("q", None), ("k", None), ("v", None), ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
    ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
    ("return_attn_probs", False),
]


def test_flash_attn_func_takes_flash_attns_arguments_and_drops_none(mock_launch):
    params = inspect.signature(flashcore.flash_attn_func).parameters
    positional = [(n, None if p.default is inspect.Parameter.empty else p.default)
                  for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == FLASH_ATTN_FUNC
    extra = [n for n, p in params.items() if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert extra == ["return_lse", "learnable_sink"]  # flashcore's own and FA4's, keyword-only
    q = torch.zeros(1, 8, 2, 64, dtype=F16)
    # Implemented: softmax_scale and causal reach the launch (shape, causal, scale are args 3-5);
    # deterministic changes nothing (flashcore is always bitwise deterministic).
    flashcore.flash_attn_func(q, q, q)
    flashcore.flash_attn_func(q, q, q, 0.0, 0.5, True)  # positionally, as flash-attn orders them
    flashcore.flash_attn_func(q, q, q, deterministic=True)
    assert [c[4:6] for c in mock_launch] == [(False, None), (True, 0.5), (False, None)]
    _same_launch(mock_launch[0], mock_launch[2])
    # The window, the softcap and the sinks reach the launch as keywords (only there).
    sinks = torch.zeros(2)
    flashcore.flash_attn_func(q, q, q, causal=True, window_size=(16, 0), softcap=30.0, learnable_sink=sinks)
    kw = dict(x for x in mock_launch[-1] if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str))
    assert kw["window"] == (16, 0) and kw["softcap"] == 30.0 and kw["sinks"] == sinks.data_ptr()
    flashcore.flash_attn_func(q, q, q, window_size=[-1, -1], softcap=0.0)
    _same_launch(mock_launch[0], mock_launch[-1])
    # The rest: every value but the default raises (test_flash_attn_func_rejects_what_it_does_not_do).
    handled = {"q", "k", "v", "softmax_scale", "causal", "deterministic", "window_size", "softcap"}
    refused = {"dropout_p", "alibi_slopes", "return_attn_probs"}
    assert handled | refused == {n for n, _ in FLASH_ATTN_FUNC} and not handled & refused


def test_sdpa_backend_handles_every_argument_of_the_aten_op(monkeypatch):
    # The hook replaces aten::_scaled_dot_product_flash_attention: a torch that adds an argument
    # to that op must fail here until _flash_forward handles it.
    schema = torch.ops.aten._scaled_dot_product_flash_attention.default._schema
    params = inspect.signature(flashcore.sdpa_backend._flash_forward).parameters
    assert [a.name for a in schema.arguments] == list(params)
    for a in schema.arguments:
        p = params[a.name]
        assert a.kwarg_only == (p.kind is inspect.Parameter.KEYWORD_ONLY), a.name
        assert a.has_default_value() == (p.default is not inspect.Parameter.empty), a.name
        if a.has_default_value():
            assert a.default_value == p.default, a.name
    # dropout_p: not flashcore's, so the call takes the fallback, which applies it.
    meta = torch.empty(1, 2, 8, 64, dtype=F16, device="meta")
    assert flashcore.sdpa_backend._fallback_reason(meta, meta, meta, 0.1) == "dropout"
    # return_debug_mask: refused.
    q = torch.zeros(1, 2, 8, 64, dtype=F16)
    with pytest.raises(RuntimeError, match="return_debug_mask"):
        flashcore.sdpa_backend._flash_forward(q, q, q, 0.0, False, True)
    # is_causal and scale: passed to the launch.
    launches = []
    monkeypatch.setattr(flashcore.sdpa_backend, "_fallback_reason", lambda *a: None)
    monkeypatch.setattr(flashcore.sdpa_backend, "launch", lambda call, out, lse: launches.append(call))
    flashcore.sdpa_backend._flash_forward(q, q, q, 0.0, True, False, scale=0.25)
    flashcore.sdpa_backend._flash_forward(q, q, q)
    assert [(c.causal, c.scale) for c in launches] == [(True, 0.25), (False, None)]
    assert all(c.bhsd for c in launches)  # SDPA's [B, H, S, D] tensors


def test_sdpa_rejects_what_it_does_not_do(fake):
    q = cuda(1, 2, 8, 64)
    with pytest.raises(ValueError, match="attn_mask is not supported"):
        flashcore.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool, device="cuda"))
    with pytest.raises(ValueError, match="dropout"):
        flashcore.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    k = cuda(1, 1, 8, 64)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashcore.scaled_dot_product_attention(q, k, k)


# --- fake-tensor shape propagation ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fake_shapes_bshd_gqa(fake, dtype):
    q, k = cuda(2, 100, 8, 128, dtype=dtype), cuda(2, 130, 2, 128, dtype=dtype)
    out, lse = flashcore.attention(q, k, k, causal=True, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    out = flashcore.flash_attn_func(q, k, k, causal=True)
    assert out.shape == q.shape


def test_fake_shapes_sdpa_non_square_causal(fake):
    # Top-left causal is built from slices and a concatenation: shapes must still come out right.
    for sq, sk in [(100, 130), (130, 100), (64, 64)]:
        q, k = cuda(1, 4, sq, 64), cuda(1, 4, sk, 64)
        out = flashcore.scaled_dot_product_attention(q, k, k, is_causal=True)
        assert out.shape == (1, 4, sq, 64)


def test_fake_shapes_strided_views(fake):
    x = cuda(2, 50, 4, 64)  # bshd memory, viewed as bhsd
    out = flashcore.scaled_dot_product_attention(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2))
    assert out.shape == (2, 4, 50, 64) and out.is_contiguous()


def test_op_traces_as_one_opaque_node(fake):
    q = cuda(1, 64, 4, 64)
    graph = make_fx(lambda a: flashcore.attention(a, a, a, causal=True))(q)
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "flashcore" in str(n.target)]
    assert len(calls) == 1 and str(calls[0].target) == "flashcore.attention.default"


# --- the Rust-side checks (no GPU: validate() only) -----------------------------------------

SHAPE = (1, 8, 8, 2, 2, 64)  # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
BSHD = (8 * 2 * 64, 2 * 64, 64)


def _t(ptr, strides=BSHD):
    return (ptr, strides)


def test_rust_validate_accepts_a_good_call():
    _native.validate("f16", SHAPE, False, None, _t(0x1000), _t(0x2000), _t(0x3000), _t(0x4000))


@pytest.mark.parametrize(
    "q, out, message",
    [
        (_t(0x1008), _t(0x4000), "not 16-byte aligned"),
        (_t(0x1000, (1024, 132, 64)), _t(0x4000), "seq stride 132"),
        (_t(0x1000, (1024, 0, 64)), _t(0x4000), "positive"),
        (_t(0x1000), _t(0x4000, (1024, 64, 64)), "overlap itself"),
        (_t(0), _t(0x4000), "null"),
    ],
)
def test_rust_validate_rejects(q, out, message):
    with pytest.raises(ValueError, match=message):
        _native.validate("f16", SHAPE, False, None, q, _t(0x2000), _t(0x3000), out)


def test_rust_validate_rejects_bad_dtype_and_shape():
    with pytest.raises(ValueError, match="unknown dtype"):
        _native.validate("f32", SHAPE, False, None, _t(0x1000), _t(0x2000), _t(0x3000), _t(0x4000))
    with pytest.raises(ValueError, match="head_dim"):
        _native.validate("f16", (1, 8, 8, 2, 2, 80), False, None, _t(0x1000), _t(0x2000), _t(0x3000), _t(0x4000))


def test_rust_validate_checks_the_fused_append():
    # A KV-cache decode call (Sq = 1 over a cache of 8) appending one row per sequence.
    shape = (1, 1, 8, 2, 2, 64)
    new = (0x5000, (128, 128, 64))

    def call(append, kv_lengths=0x6000):
        _native.validate("f16", shape, False, None, _t(0x1000), _t(0x2000), _t(0x3000), _t(0x4000),
                         kv_lengths=kv_lengths, append=append)

    call((new, new, 1, 0x7000))
    with pytest.raises(ValueError, match="needs KV-cache key counts"):
        call((new, new, 1, 0x7000), kv_lengths=0)
    with pytest.raises(ValueError, match="at least 1 and at most the cache capacity"):
        call((new, new, 0, 0x7000))
    with pytest.raises(ValueError, match="at least 1 and at most the cache capacity"):
        call((new, new, 9, 0x7000))
    with pytest.raises(ValueError, match="16-byte aligned"):
        call(((0x5008, (128, 128, 64)), new, 1, 0x7000))
    with pytest.raises(ValueError, match="stride"):
        call((new, (0x5000, (128, 4, 64)), 1, 0x7000))
    with pytest.raises(ValueError, match="counts buffer"):
        call((new, new, 1, 0x6000))  # the input counts themselves
    with pytest.raises(ValueError, match="counts buffer"):
        call((new, new, 1, 0x7002))


def test_kvcache_append_op_declares_the_caches_mutated():
    schema = str(torch.ops.flashcore.attention_kvcache_append.default._schema)
    assert "Tensor(a1!) k_cache" in schema and "Tensor(a2!) v_cache" in schema, schema


# --- which views are read in place (CPU tensors: only strides and addresses matter) ---------


def test_tma_ready_views():
    x = torch.zeros(2, 16, 4, 64, dtype=F16)
    assert _launch.tma_ready(x)
    assert _launch.tma_ready(x.transpose(1, 2).transpose(1, 2))
    assert _launch.tma_ready(x[:, 3:])  # offset of 3 rows: still 16-byte aligned
    assert _launch.tma_ready(x[:, :, :1].expand(2, 16, 4, 64)) is False  # broadcast: stride 0
    odd = torch.zeros(2, 16, 4, 72, dtype=F16)[..., 4:68]  # base 8 bytes off alignment
    assert not _launch.tma_ready(odd)
    y = _launch.readable(odd)
    assert _launch.tma_ready(y) and torch.equal(y, odd)
    assert _launch.readable(x) is x


# --- transformers registration (runs on CPU through the SDPA fallback) ----------------------


def test_hf_register_and_cpu_fallback_matches_sdpa():
    transformers = pytest.importorskip("transformers")
    import flashcore.hf

    name = flashcore.hf.register()
    assert name == "fcore" and name in transformers.AttentionInterface._global_mapping
    with pytest.raises(ValueError, match="containing 'flash'"):
        flashcore.hf.register("flashcore")
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    # A copy of the config: from_config records the implementation in the config it is given.
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=name).eval()
    assert ref.config._attn_implementation == "sdpa"
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 128, (2, 16))
    before = flashcore.hf.stats["fallback"]
    with torch.no_grad():
        want, got = ref(ids).logits, model(ids).logits
    assert flashcore.hf.stats["fallback"] == before + 2  # one per layer: CPU is not flashcore's
    assert torch.equal(want, got)


# --- the eager fast path launches exactly what the op launches -------------------------------


@pytest.fixture
def mock_launch(monkeypatch):
    """CPU tensors accepted as if on a GPU, and every launch recorded instead of run."""
    calls = []
    real_check = flashcore._checks.check_tensor

    def check_tensor(name, t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = torch.empty(t.shape, dtype=t.dtype, device="meta")
            if t.dim() != 4 or t.dtype not in flashcore._checks.SUPPORTED_DTYPES:
                real_check(name, t)
            return
        real_check(name, t)

    monkeypatch.setattr(flashcore._checks, "check_tensor", check_tensor)
    monkeypatch.setattr(flashcore._launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(flashcore._launch._native, "attention", lambda *a, **kw: calls.append(a + tuple(sorted(kw.items()))))
    return calls


def _same_launch(a, b):
    # Everything but the fresh output and LSE buffers' addresses must agree.
    assert a[:9] == b[:9]
    assert a[9][1] == b[9][1] and (a[10] == 0) == (b[10] == 0) and a[11] == b[11]


def test_eager_fast_path_matches_the_op(mock_launch, monkeypatch):
    q = torch.zeros(2, 64, 4, 64, dtype=F16)
    kv = torch.zeros(2, 96, 2, 64, dtype=F16)
    assert flashcore.ops.eager(q, kv, kv, None)  # plain tensors, no mode: the fast path
    out, lse = flashcore.attention(q, kv, kv, causal=True, return_lse=True)
    torch.ops.flashcore.attention(q, kv, kv, True, None, False, True, None)
    assert len(mock_launch) == 2
    _same_launch(*mock_launch)
    assert out.shape == q.shape and lse.shape == (2, 4, 64)
    # SDPA layout, strided views, top-left causal with Sq > Sk (two launches each way).
    qt, kt = q.transpose(1, 2), kv[:, :48].transpose(1, 2)
    mock_launch.clear()
    flashcore.scaled_dot_product_attention(qt, kt, kt, is_causal=True, enable_gqa=True)
    fast = list(mock_launch)
    mock_launch.clear()
    monkeypatch.setattr(flashcore.ops, "eager", lambda *t: False)  # force the dispatcher
    flashcore.scaled_dot_product_attention(qt, kt, kt, is_causal=True, enable_gqa=True)
    assert len(fast) == len(mock_launch) == 2
    for a, b in zip(fast, mock_launch):
        _same_launch(a, b)


def test_eager_path_not_taken_when_tracing(fake, monkeypatch):
    def boom(*a):
        raise AssertionError("the fast path ran under a dispatch mode")

    monkeypatch.setattr(flashcore.ops, "run", boom)
    q = cuda(1, 64, 4, 64)
    out = flashcore.attention(q, q, q)  # FakeTensorMode: through the op and its fake impl
    assert out.shape == q.shape
    assert not flashcore.ops.eager(q)
    assert flashcore.ops.eager(torch.zeros(1)) is False  # a mode is active here


@pytest.mark.parametrize("sq, sk", [(64, 64), (40, 96), (96, 40)])
def test_top_left_launches_the_same_in_both_layouts(mock_launch, sq, sk):
    # transformers' path runs bshd on transposed views; SDPA's runs bhsd: same inputs, same kernels.
    q = torch.zeros(2, sq, 4, 64, dtype=F16)
    kv = torch.zeros(2, sk, 2, 64, dtype=F16)
    out = flashcore.api.top_left(q, kv, kv, True, None, bhsd=False)
    bshd = list(mock_launch)
    mock_launch.clear()
    flashcore.api.top_left(q.transpose(1, 2), kv.transpose(1, 2), kv.transpose(1, 2), True, None, bhsd=True)
    assert len(bshd) == len(mock_launch) == (2 if sq > sk else 1)
    for a, b in zip(bshd, mock_launch):
        assert a[:9] == b[:9]  # device, stream, dtype, shape, causal, scale, q, k, v
    assert out.shape == q.shape and out.is_contiguous()


# --- decode mode's workspace (no GPU needed to size it) -------------------------------------


def test_decode_workspace_size():
    # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    split = _native.workspace_bytes("bf16", (1, 1, 8192, 32, 8, 128), False)
    assert split == 32 * 8 * (128 + 2) * 4  # 32 rows, 8 splits of 8 blocks, D outputs + (max, sum) each
    assert _native.workspace_bytes("bf16", (3, 1, 8192, 32, 8, 128), False) == 3 * split
    assert _native.workspace_bytes("f16", (1, 1, 100, 8, 8, 64), False) == 0  # one split
    assert _native.workspace_bytes("f16", (1, _native.DECODE_MAX_SEQLEN_Q + 1, 8192, 8, 8, 64), False) == 0
    assert _native.workspace_bytes("f16", (1, 1, 8192, 8, 8, 64), False, secret_lengths=True) == 0
    with pytest.raises(ValueError):
        _native.workspace_bytes("f32", (1, 1, 8192, 8, 8, 64), False)


# --- KV cache (flash_attn_with_kvcache) ------------------------------------------------------


def test_append_kv_writes_each_sequence_at_its_length():
    from flashcore.kvcache import append_kv

    kc, vc = torch.randn(3, 10, 2, 8), torch.randn(3, 10, 2, 8)
    k, v = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2, 8)
    want_k, want_v = kc.clone(), vc.clone()
    lens = torch.tensor([0, 5, 8], dtype=torch.int32)
    for b, n in enumerate(lens.tolist()):
        want_k[b, n:n + 2], want_v[b, n:n + 2] = k[b], v[b]
    after = append_kv(kc, vc, k, v, lens)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert after.dtype == torch.int32 and after.tolist() == [2, 7, 10]
    # One new row per sequence (decode's case, its own branch).
    k1, v1 = torch.randn(3, 1, 2, 8), torch.randn(3, 1, 2, 8)
    for b, n in enumerate(after.tolist()[:2]):
        want_k[b, n], want_v[b, n] = k1[b, 0], v1[b, 0]
    want_k[2, 0], want_v[2, 0] = k1[2, 0], v1[2, 0]
    after = append_kv(kc, vc, k1, v1, torch.tensor([2, 7, 0], dtype=torch.int32))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and after.tolist() == [3, 8, 1]


def test_append_kv_paged_writes_through_the_block_table():
    from flashcore.kvcache import append_kv

    pool_k, pool_v = torch.randn(6, 4, 2, 8), torch.randn(6, 4, 2, 8)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)  # 2 sequences, 3 pages of 4 rows
    k, v = torch.randn(2, 3, 2, 8), torch.randn(2, 3, 2, 8)
    lens = torch.tensor([3, 8], dtype=torch.int32)  # sequence 0 crosses from page 5 into page 0
    want_k, want_v = pool_k.clone(), pool_v.clone()
    for b, n in enumerate(lens.tolist()):
        for i in range(3):
            r = n + i
            page = table[b, r // 4].item()
            want_k[page, r % 4], want_v[page, r % 4] = k[b, i], v[b, i]
    after = append_kv(pool_k, pool_v, k, v, lens, table)
    assert torch.equal(pool_k, want_k) and torch.equal(pool_v, want_v)
    assert after.tolist() == [6, 11]


def test_kvcache_paged_fake_shapes_and_bad_tables(fake):
    q = cuda(2, 1, 8, 64, dtype=torch.bfloat16)
    pool = cuda(10, 16, 2, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    out = flashcore.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=20, block_table=table)
    assert out.shape == q.shape
    with pytest.raises(TypeError, match="int32"):
        flashcore.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=3, block_table=table.long())
    with pytest.raises(ValueError, match=r"\[B, max_pages\]"):
        flashcore.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=3, block_table=table[:1])
    # Any page size of at least one row (SGLang's 1, odd sizes, non-powers of two).
    for page in (1, 7, 24, 48):
        odd = cuda(10, page, 2, 64, dtype=torch.bfloat16)
        out = flashcore.flash_attn_with_kvcache(q, odd, odd, cache_seqlens=3, block_table=table)
        assert out.shape == q.shape
    empty = cuda(10, 0, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="page size must be at least 1 row"):
        flashcore.flash_attn_with_kvcache(q, empty, empty, cache_seqlens=0, block_table=table)


def test_kvcache_op_fake_shapes_and_append(fake):
    q = cuda(2, 1, 8, 64, dtype=torch.bfloat16)
    kc, vc = cuda(2, 100, 2, 64, dtype=torch.bfloat16), cuda(2, 100, 2, 64, dtype=torch.bfloat16)
    k, v = cuda(2, 1, 2, 64, dtype=torch.bfloat16), cuda(2, 1, 2, 64, dtype=torch.bfloat16)
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    out, lse = flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True,
                                                 return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 1) and lse.dtype == torch.float32
    assert flashcore.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=7).shape == q.shape


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rotary_cos=torch.zeros(1), rotary_sin=torch.zeros(1)), "rotary_cos"),
        (dict(alibi_slopes=torch.zeros(8)), "alibi_slopes"),
    ],
)
def test_kvcache_unsupported_arguments_raise(fake, kwargs, message):
    q = cuda(1, 1, 8, 64)
    kc = cuda(1, 100, 8, 64)
    with pytest.raises(ValueError, match=message):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, **kwargs)


def test_kvcache_bad_inputs(fake):
    q, kc = cuda(2, 1, 8, 64), cuda(2, 100, 8, 64)
    with pytest.raises(ValueError, match="both k and v"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, k=cuda(2, 1, 8, 64), cache_seqlens=3)
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, k=cuda(2, 1, 8, 64), v=cuda(2, 1, 8, 64))
    with pytest.raises(TypeError, match="int32"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.zeros(2, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="shape"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="`k` must be"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, k=cuda(2, 1, 4, 64), v=cuda(2, 1, 4, 64), cache_seqlens=3)
    with pytest.raises(TypeError, match="cache_leftpad must be an int32"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, cache_leftpad=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match="cache_leftpad must be contiguous, of shape"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3,
                                          cache_leftpad=torch.zeros(3, dtype=torch.int32, device="cuda"))
    for n in (2, -1, True):
        with pytest.raises(ValueError, match="num_splits must be 0"):
            flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=3, num_splits=n)


def test_kvcache_prefill_consistent_mode_needs_no_workspace(fake):
    # num_splits=1 (the prefill-consistent mode) runs one unit per tile: no split partials.
    shape = (2, 1, 8192, 32, 8, 128)
    assert flashcore._native.workspace_bytes("bf16", shape, False, kv_lengths=True) > 0
    assert flashcore._native.workspace_bytes("bf16", shape, False, kv_lengths=True, kv_prefill_consistent=True) == 0
    q, kc = cuda(2, 1, 32, 128, dtype=torch.bfloat16), cuda(2, 8192, 8, 128, dtype=torch.bfloat16)
    assert flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=7, num_splits=1).shape == q.shape


# --- the one-pass eager path (_launch.fast) launches what the checked path launches ----------


class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on cuda:0, so _launch.fast takes it (with _Tensor patched)."""

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0


@pytest.fixture
def fast_mock(monkeypatch):
    calls = []
    monkeypatch.setattr(_launch, "_Tensor", _OnGpu)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(_launch._native, "attention", lambda *a: calls.append(a))

    def attention_kv(*a):  # recorded as the `_native.attention` call it stands for, positionally
        calls.append(a[:11] + (0,) + a[11:13] + (False, 0, 0, 0, False, 0, (-1, -1), 0.0, 0) + a[13:])

    monkeypatch.setattr(_launch._native, "attention_kv", attention_kv)
    monkeypatch.setattr(_launch, "_workspace", lambda n, dev, stream: torch.empty(n, dtype=torch.uint8))
    return calls


def _gpu(*shape, dtype=F16):
    return torch.randn(*shape).to(dtype).as_subclass(_OnGpu)


@pytest.mark.parametrize("bhsd", [False, True])
@pytest.mark.parametrize("sq, sk, hq, hkv", [(64, 96, 4, 2), (1, 8192, 32, 8), (3, 100, 8, 8)])
def test_fast_path_launches_what_the_checked_path_does(fast_mock, bhsd, sq, sk, hq, hkv):
    def mk(s, h):
        return _gpu(2, h, s, 64) if bhsd else _gpu(2, s, h, 64)

    q, k, v = mk(sq, hq), mk(sk, hkv), mk(sk, hkv)
    with torch.no_grad():
        out, lse = _launch.fast(q, k, v, True, 0.5, bhsd, True)
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (2, hq, sq)
    # The checked path's launch on the same tensors: identical but for the fresh buffers.
    out2 = torch.empty(q.shape, dtype=q.dtype)
    lse2 = torch.empty(2, hq, sq, dtype=torch.float32)
    _launch.launch(_launch.Call(q, k, v, True, 0.5, bhsd, True, None), out2, lse2)
    a, b = fast_mock
    assert a[:9] == b[:9] and a[9][1] == b[9][1] and a[11] == b[11] == 0 and a[13] == b[13] == 0
    assert (a[12] == 0) == (b[12] == 0)  # a workspace exactly when the checked path gives one
    assert (a[12] != 0) == (_native.workspace_bytes("f16", a[3], True) > 0)
    # A KV-cache call (`_launch.decode`): its key counts reach the launch.
    fast_mock.clear()
    if sq <= 16 and not bhsd:
        lens = torch.full((2,), 5, dtype=torch.int32).as_subclass(_OnGpu)
        _launch.decode(q, k, v, None, lens, False, None, False)
        assert fast_mock[0][13] == lens.data_ptr() and fast_mock[0][5] is None


def test_fast_path_declines_what_it_does_not_serve(fast_mock):
    def decode(q, kv, lens):
        return _launch.decode(q, kv, kv, None, lens, False, None, False)

    q, kv = _gpu(1, 64, 4, 64), _gpu(1, 64, 2, 64)
    lens = torch.full((1,), 5, dtype=torch.int32).as_subclass(_OnGpu)
    with torch.no_grad():
        declined = [
            _launch.fast(q.as_subclass(torch.Tensor), kv, kv, False, None, False, False),  # not on a GPU
            _launch.fast(q.float(), kv, kv, False, None, False, False),  # dtype
            _launch.fast(q, kv.bfloat16(), kv.bfloat16(), False, None, False, False),  # mixed dtypes
            _launch.fast(q, kv, kv, False, None, False, False, gqa=False),  # GQA not allowed
            _launch.fast(q, kv[:, :32], kv[:, :32], True, None, False, False, top_left=True),  # Sq ≠ Sk causal
            _launch.fast(q, kv[..., :32], kv[..., :32], False, None, False, False),  # head dim 32
            _launch.fast(q, kv[:, :, :, ::2].repeat(1, 1, 1, 2)[:, :, :1].expand(1, 64, 2, 64), kv, False, None,
                         False, False),  # broadcast (stride 0)
            _launch.fast(_gpu(1, 64, 4, 68)[..., :64], kv, kv, False, None, False, False),  # 136-byte rows
            decode(q, kv, lens.long()),  # int64 counts
            decode(q, kv, lens),  # Sq 64 > 16 for a KV cache
            decode(q[:1, :1], kv, torch.ones(2, dtype=torch.int32).as_subclass(_OnGpu)),  # counts' shape
        ]
    assert declined == [None] * len(declined) and not fast_mock
    g = q.clone().requires_grad_()
    assert _launch.fast(g, kv, kv, False, None, False, False) is None  # grad mode and an input needing grad
    with pytest.raises(ValueError, match="scale must be positive"):  # the checked path's error, same point
        with torch.no_grad():
            _launch.fast(q, kv, kv, False, -1.0, False, False)
    assert not fast_mock


# --- autograd (flashcore.autograd): wiring, shapes, errors — no GPU ---------------------------


def test_backward_op_is_registered_with_its_schema():
    schema = str(torch.ops.flashcore.attention_backward.default._schema)
    assert schema.startswith("flashcore::attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
                             "Tensor lse, bool causal, float? scale, bool bhsd)")
    assert schema.endswith("-> (Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_shapes_every_entry_point(mock_backward, dtype):
    # Real autograd on CPU tensors whose launches are recorded. GQA 4:1 and Sq ≠ Sk: dq has q's
    # shape, dk and dv k's (summed over each group).
    def leaves(*shapes):
        return [torch.zeros(*s, dtype=dtype).requires_grad_() for s in shapes]

    q, k, v = leaves((2, 100, 8, 128), (2, 130, 2, 128), (2, 130, 2, 128))
    out = flashcore.attention(q, k, v, causal=True)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert q.grad.dtype == dtype and len(mock_backward) == 1
    q, k, v = leaves((2, 64, 8, 64), (2, 64, 8, 64), (2, 64, 8, 64))
    out, lse = flashcore.flash_attn_func(q, k, v, return_lse=True)
    assert not lse.requires_grad  # the log-sum-exp is not differentiable
    out.sum().backward()
    assert q.grad.shape == q.shape and len(mock_backward) == 2
    # SDPA's layout, top-left causal with Sq > Sk (two calls: head and tail) and Sq < Sk (one).
    for sq, sk, calls in [(100, 60, 2), (60, 100, 1)]:
        mock_backward.clear()
        q, k, v = leaves((1, 4, sq, 64), (1, 2, sk, 64), (1, 2, sk, 64))
        flashcore.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
        assert len(mock_backward) == calls and all(c[6] for c in mock_backward)  # bhsd launches


def test_fake_backward_op_shapes(fake):
    q, k = cuda(2, 100, 8, 128), cuda(2, 130, 2, 128)
    lse = torch.empty(2, 8, 100, device="cuda")
    dq, dk, dv = torch.ops.flashcore.attention_backward(q, q, k, k, q, lse, True, None, False)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape and dq.is_contiguous() and dk.is_contiguous()
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # bhsd views of bshd memory: contiguous gradients
    dq, dk, dv = torch.ops.flashcore.attention_backward(qt, qt, kt, kt, qt, lse, True, 0.1, True)
    assert dq.shape == qt.shape and dk.shape == kt.shape and dq.is_contiguous()


def test_only_grad_of_inputs_that_need_it(mock_backward):
    q = torch.zeros(1, 64, 4, 64, dtype=F16).requires_grad_()
    k, v = torch.zeros(1, 64, 4, 64, dtype=F16), torch.zeros(1, 64, 4, 64, dtype=F16)
    flashcore.attention(q, k, v).sum().backward()
    assert q.grad is not None and k.grad is None and v.grad is None


@pytest.mark.parametrize(
    "change, exc, message",
    [
        (dict(grad_out=lambda q: cuda(1, 64, 4, 32)), ValueError, "`grad_out` must have q's shape"),
        (dict(grad_out=lambda q: cuda(1, 64, 4, 64, dtype=torch.bfloat16)), TypeError, "`grad_out` has dtype"),
        (dict(out=lambda q: cuda(1, 63, 4, 64)), ValueError, "`out` must have q's shape"),
        (dict(lse=lambda q: torch.empty(0, device="cuda")), RuntimeError, "log-sum-exp"),
        (dict(lse=lambda q: torch.empty(1, 4, 65, device="cuda")), ValueError, r"`lse` must be float32 of shape \(1, 4, 64\)"),
        (dict(lse=lambda q: torch.empty(1, 4, 64, device="cuda", dtype=F16)), ValueError, "`lse` must be float32"),
        (dict(k=lambda q: cuda(1, 64, 3, 64)), ValueError, "multiple of the key/value heads"),
        (dict(scale=lambda q: -1.0), ValueError, "scale must be positive"),
    ],
)
def test_backward_op_rejects_bad_input(fake, change, exc, message):
    q = cuda(1, 64, 4, 64)
    args = dict(grad_out=q, q=q, k=q, v=q, out=q, lse=torch.empty(1, 4, 64, device="cuda"), scale=None)
    args.update({name: make(q) for name, make in change.items()})
    if "k" in change:
        args["v"] = args["k"]
    with pytest.raises(exc, match=message):
        torch.ops.flashcore.attention_backward(args["grad_out"], args["q"], args["k"], args["v"], args["out"],
                                               args["lse"], False, args["scale"], False)


def test_backward_of_a_forward_without_lse_says_what_to_do(mock_backward):
    # The op called directly with return_lse=False under autograd: its backward has no LSE.
    q = torch.zeros(1, 64, 4, 64, dtype=F16).requires_grad_()
    out, _ = torch.ops.flashcore.attention(q, q, q, False, None, False, False, None)
    with pytest.raises(RuntimeError, match="log-sum-exp"):
        out.sum().backward()
    assert not mock_backward


def test_eager_path_not_taken_under_autograd():
    q = torch.zeros(1, 8, 2, 64, dtype=F16)
    assert flashcore.ops.eager(q, q, q, None)
    g = q.clone().requires_grad_()
    assert not flashcore.ops.eager(g, q, q, None)
    with torch.no_grad():
        assert flashcore.ops.eager(g, q, q, None)


@pytest.fixture
def mock_backward(mock_launch, monkeypatch):
    """mock_launch, and every backward launch recorded (its arguments) instead of run."""
    calls = []
    monkeypatch.setattr(_launch._native, "attention_backward", lambda *a: calls.append(a))
    return calls


@pytest.mark.parametrize("bhsd", [False, True])
def test_backward_launch_gets_the_forwards_out_and_lse(mock_launch, mock_backward, bhsd):
    layout = "bhsd" if bhsd else "bshd"
    shape_q, shape_k = ((2, 8, 40, 64), (2, 2, 72, 64)) if bhsd else ((2, 40, 8, 64), (2, 72, 2, 64))
    q = torch.randn(shape_q).to(F16).requires_grad_()
    k = torch.randn(shape_k).to(F16).requires_grad_()
    v = torch.randn(shape_k).to(F16).requires_grad_()
    out = flashcore.attention(q, k, v, causal=True, scale=0.3, layout=layout)
    (fwd,) = mock_launch
    assert fwd[10] != 0  # the LSE is computed: autograd needs it, though return_lse is False
    grad = torch.randn(out.shape).to(F16).transpose(0, 1).contiguous().transpose(0, 1)  # not contiguous
    out.backward(grad)
    (bwd,) = mock_backward
    dev, stream, dtype, shape, causal, scale, is_bhsd, qd, kd, vd, buffers = bwd
    assert (stream, dtype, shape, causal, scale, is_bhsd) == (1234, "f16", (2, 40, 72, 8, 2, 64), True, 0.3, bhsd)
    assert (qd, kd, vd) == fwd[6:9]  # q, k, v as the forward read them
    o_ptr, lse_ptr, do_ptr, dq_ptr, dk_ptr, dv_ptr, ws_ptr = buffers
    assert o_ptr == out.data_ptr() == fwd[9][0] and lse_ptr == fwd[10]
    assert do_ptr != grad.data_ptr()  # a contiguous copy of the strided gradient
    assert (dq_ptr, dk_ptr, dv_ptr) == (q.grad.data_ptr(), k.grad.data_ptr(), v.grad.data_ptr())
    assert ws_ptr != 0
    assert q.grad.is_contiguous() and k.grad.shape == k.shape


def test_backward_of_secret_lengths_called_through_the_op(mock_launch, mock_backward):
    q = torch.zeros(2, 8, 2, 64, dtype=F16).requires_grad_()
    lens = torch.full((2,), 8, dtype=torch.int32)
    out, _ = torch.ops.flashcore.attention(q, q, q, False, None, False, True, lens)
    with pytest.raises(RuntimeError, match="secret_lengths has no backward"):
        out.sum().backward()
    assert not mock_backward


def test_opcheck_forward_and_backward_ops(mock_launch, monkeypatch):
    # The launches replaced by deterministic stand-ins on CPU tensors: opcheck's schema, fake,
    # autograd-registration and AOT-dispatch tests see the ops as on a GPU.
    def launch(call, out, lse):
        out.copy_(call.q * 0.5)
        if lse is not None:
            lse.fill_(1.0)

    def backward(d_o, q, k, v, out, lse, dq, dk, dv, causal, scale, bhsd=False):
        dq.copy_(d_o * 2)
        dk.fill_(0.25)
        dv.fill_(-0.5)

    monkeypatch.setattr(flashcore.ops, "launch", launch)
    monkeypatch.setattr(flashcore.autograd, "launch_backward", backward)
    q = torch.randn(2, 16, 4, 64).to(F16).requires_grad_()
    kv = torch.randn(2, 24, 2, 64).to(F16).requires_grad_()
    torch.library.opcheck(torch.ops.flashcore.attention.default, (q, kv, kv, True, None, False, True, None))
    g = torch.randn(2, 16, 4, 64).to(F16)
    lse = torch.zeros(2, 4, 16)
    # The backward op has no backward of its own (no double backward): plain inputs.
    q, kv = q.detach(), kv.detach()
    torch.library.opcheck(torch.ops.flashcore.attention_backward.default, (g, q, kv, kv, g, lse, True, 0.5, False))


def test_rust_validate_backward():
    # (o, lse, d_o, dq, dk, dv, workspace)
    good = (0x4000, 0x5000, 0x6000, 0x7000, 0x8000, 0x9000, 0xa000)
    args = ("f16", SHAPE, True, None, False, _t(0x1000), _t(0x2000), _t(0x3000))
    _native.validate_attention_backward(*args, good)
    with pytest.raises(ValueError, match="log-sum-exp"):
        _native.validate_attention_backward(*args, good[:1] + (0,) + good[2:])
    for i, name in enumerate(["o", "lse", "d_o", "dq", "dk", "dv", "workspace"]):
        if name == "lse":
            continue
        bad = good[:i] + (good[i] + 8,) + good[i + 1:]
        with pytest.raises(ValueError, match=f"`?{name}`?.*aligned"):
            _native.validate_attention_backward(*args, bad)
    with pytest.raises(ValueError, match="seq stride 132"):
        _native.validate_attention_backward("f16", SHAPE, True, None, False, _t(0x1000, (1024, 132, 64)),
                                            _t(0x2000), _t(0x3000), good)
    with pytest.raises(ValueError, match="heads_kv"):
        _native.validate_attention_backward("f16", (1, 8, 8, 2, 3, 64), True, None, False, _t(0x1000), _t(0x2000),
                                            _t(0x3000), good)
    # Sq padded to 128 rows; the LSE in base 2 and D, fp32 each.
    assert _native.backward_workspace_bytes("bf16", (3, 200, 50, 8, 2, 128)) == 2 * 3 * 8 * 256 * 4
    assert _native.backward_workspace_bytes("bf16", (3, 200, 50, 8, 2, 64), True) == 2 * 3 * 8 * 256 * 4
    # d128 causal runs the one-pass kernel by default: also dQ's fp32 accumulator (D floats per padded
    # row) and an int32 turn counter per (sequence, head, 64-row query tile), padded to 16 bytes.
    if os.environ.get("FLASHCORE_BWD_ONEPASS") is None:
        assert _native.backward_workspace_bytes("bf16", (3, 200, 50, 8, 2, 128), True) == (
            2 * 3 * 8 * 256 * 4 + 3 * 8 * 256 * 128 * 4 + 3 * 8 * 4 * 4)


# --- the SDPA backend's backward (no GPU: its fallback math and its routing) -----------------


def test_sdpa_backward_hook_handles_every_argument_of_the_aten_op():
    schema = torch.ops.aten._scaled_dot_product_flash_attention_backward.default._schema
    params = inspect.signature(flashcore.sdpa_backend._flash_backward).parameters
    assert [a.name for a in schema.arguments] == list(params)
    for a in schema.arguments:
        p = params[a.name]
        assert a.kwarg_only == (p.kind is inspect.Parameter.KEYWORD_ONLY), a.name
        if a.has_default_value():
            assert a.default_value == p.default, a.name


def test_sdpa_backward_refuses_dropout():
    q = torch.zeros(1, 2, 8, 64, dtype=F16)
    with pytest.raises(RuntimeError, match="dropout"):
        flashcore.sdpa_backend._flash_backward(q, q, q, q, q, torch.zeros(1, 2, 8), None, None, 8, 8, 0.1, False,
                                               None, None)


@pytest.mark.parametrize("hq, hkv, sq, sk, causal, scale", [(4, 2, 33, 33, True, None), (2, 2, 17, 40, False, 0.3),
                                                            (3, 1, 20, 9, False, None)])
def test_sdpa_fallback_backward_matches_autograd(hq, hkv, sq, sk, causal, scale):
    torch.manual_seed(0)
    q, k, v, g = (torch.randn(2, h, s, 64, dtype=torch.float64) for h, s in ((hq, sq), (hkv, sk), (hkv, sk), (hq, sq)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F_sdpa(*leaves, is_causal=causal, scale=scale, enable_gqa=hq != hkv)
    want = torch.autograd.grad(out, leaves, g)
    got = flashcore.sdpa_backend._fallback_backward(g, q, k, v, causal, scale)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    # A planted error must show: the scale dropped.
    bad = flashcore.sdpa_backend._fallback_backward(g, q, k, v, causal, 1.7)
    assert not torch.allclose(bad[0], want[0], rtol=1e-3)


def F_sdpa(*args, **kwargs):
    return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)


def test_sdpa_backward_reads_bshd_memory_in_place(monkeypatch):
    calls = []
    monkeypatch.setattr(flashcore.sdpa_backend, "launch_backward", lambda *a, **kw: calls.append((a, kw)))
    lse = torch.zeros(2, 4, 16)
    # [B, S, H, D] memory viewed as [B, H, S, D] (what models hand SDPA): no copies, bshd launch.
    q, kv, o, g = (torch.zeros(2, 16, h, 64, dtype=F16).transpose(1, 2) for h in (4, 2, 4, 4))
    dq, dk, dv = flashcore.sdpa_backend._backward(g, q, kv, kv, o, lse, True, None)
    (args, kw), = calls
    assert kw == {"bhsd": False}
    assert args[0].data_ptr() == g.data_ptr() and args[1].data_ptr() == q.data_ptr()
    assert (dq.stride(), dk.stride(), dv.stride()) == (q.stride(), kv.stride(), kv.stride())
    assert args[6].data_ptr() == dq.data_ptr() and args[6].is_contiguous()
    # Contiguous [B, H, S, D]: the bhsd launch, gradients contiguous.
    calls.clear()
    q, kv, o = (torch.zeros(2, h, 16, 64, dtype=F16) for h in (4, 2, 4))
    dq, dk, dv = flashcore.sdpa_backend._backward(o, q, kv, kv, o, lse, False, 0.5)
    (args, kw), = calls
    assert kw == {"bhsd": True} and args[-2:] == (False, 0.5)
    assert dq.is_contiguous() and dk.shape == kv.shape


def test_backward_head_dim_rule_names_the_served_dims():
    # Every forward head dim has a backward; others are refused with the list.
    from flashcore import _checks

    assert _checks.BACKWARD_HEAD_DIMS == flashcore.BACKWARD_HEAD_DIMS == flashcore.SUPPORTED_HEAD_DIMS
    for d in _checks.BACKWARD_HEAD_DIMS:
        _checks.check_backward_head_dim(d)
    listed = re.escape(", ".join(map(str, flashcore.BACKWARD_HEAD_DIMS)))
    with pytest.raises(RuntimeError, match=f"head dim 80 has no backward pass.*{listed}"):
        _checks.check_backward_head_dim(80)
