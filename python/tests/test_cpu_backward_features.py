"""Training through the window, softcap and sink features without a GPU: the feature backward op's
schema, the autograd wiring (window, softcap, sinks and the sinks' gradient reach the native
backward; dq, dk, dv and dsink come back with the right shapes and dtypes), the native
validation of the sinks' buffers, the feature backward at head dims 96 and 256, and what is still
refused."""

import pytest
import torch

import flashcore
from flashcore import _launch, _native

F16 = torch.float16
SHAPE = (1, 8, 8, 2, 2, 64)  # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
BSHD = (8 * 2 * 64, 2 * 64, 64)


@pytest.fixture
def mock_launches(monkeypatch):
    """CPU tensors accepted as if on a GPU; forward and backward launches recorded, not run."""
    calls = {"fwd": [], "bwd": []}
    real_check = flashcore._checks.check_tensor

    def check_tensor(name, t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            if t.dim() != 4 or t.dtype not in flashcore._checks.SUPPORTED_DTYPES:
                real_check(name, torch.empty(t.shape, dtype=t.dtype, device="meta"))
            return
        real_check(name, t)

    monkeypatch.setattr(flashcore._checks, "check_tensor", check_tensor)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(_launch._native, "attention", lambda *a, **kw: calls["fwd"].append((a, kw)))
    monkeypatch.setattr(_launch._native, "attention_backward", lambda *a, **kw: calls["bwd"].append((a, kw)))
    monkeypatch.setattr(_launch, "_backward_workspace_bytes", lambda dtype, shape, causal: 16)
    return calls


def test_feature_backward_op_is_registered_with_its_schema():
    schema = str(torch.ops.flashcore.attention_backward_features.default._schema)
    assert schema.startswith("flashcore::attention_backward_features(Tensor grad_out, Tensor q, Tensor k, Tensor v, "
                             "Tensor out, Tensor lse, bool causal, float? scale, bool bhsd, SymInt window_left, "
                             "SymInt window_right, float softcap, Tensor? sinks)")
    assert schema.endswith("-> (Tensor, Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("with_sinks", [False, True])
def test_window_softcap_and_sinks_reach_the_native_backward(mock_launches, with_sinks):
    q = torch.randn(2, 40, 8, 64).to(F16).requires_grad_()
    k = torch.randn(2, 72, 2, 64).to(F16).requires_grad_()
    v = torch.randn(2, 72, 2, 64).to(F16).requires_grad_()
    sinks = torch.randn(8, dtype=torch.bfloat16).requires_grad_() if with_sinks else None
    out = flashcore.flash_attn_func(q, k, v, causal=True, window_size=(16, 0), softcap=5.0, learnable_sink=sinks)
    ((fwd, fwd_kw),) = mock_launches["fwd"]
    assert fwd[10] != 0  # the LSE is computed for the backward
    out.backward(torch.randn(out.shape).to(F16))
    ((bwd, kw),) = mock_launches["bwd"]
    assert bwd[3] == (2, 40, 72, 8, 2, 64) and bwd[4] is True
    assert kw["window"] == (16, 0) and kw["softcap"] == 5.0
    assert (kw["sinks"] != 0) == with_sinks and (kw["dsink"] != 0) == with_sinks
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    if with_sinks:
        assert kw["sinks"] == fwd_kw["sinks"]  # the forward's fp32 copy of the sinks
        assert sinks.grad is not None and sinks.grad.shape == (8,) and sinks.grad.dtype == torch.bfloat16


def test_plain_calls_keep_the_plain_backward(mock_launches):
    q = torch.randn(1, 16, 2, 64).to(F16).requires_grad_()
    flashcore.flash_attn_func(q, q, q, window_size=(-1, -1), softcap=0.0).sum().backward()
    ((bwd, kw),) = mock_launches["bwd"]
    assert kw == {}  # no feature keywords: the plain kernels


@pytest.mark.parametrize("d", [96, 256])
def test_feature_backward_at_head_dims_96_and_256(mock_launches, d):
    """Branch bwdcombo: the window/softcap backward builds exist at every head dim."""
    q = torch.randn(1, 16, 2, d).to(F16).requires_grad_()
    out = flashcore.flash_attn_func(q, q, q, causal=True, window_size=(4, 0), softcap=30.0)
    out.backward(torch.randn(out.shape).to(F16))
    ((bwd, kw),) = mock_launches["bwd"]
    assert bwd[3] == (1, 16, 16, 2, 2, d)
    assert kw["window"] == (4, 0) and kw["softcap"] == 30.0
    assert q.grad.shape == q.shape


def test_feature_backward_refuses_secret_lengths(mock_launches):
    q = torch.randn(1, 16, 2, 64).to(F16).requires_grad_()
    with pytest.raises(RuntimeError, match="secret_lengths has no backward"):
        flashcore.attention(q, q, q, window_size=(4, 0), secret_lengths=torch.full((1,), 16, dtype=torch.int32))
    assert not mock_launches["fwd"]


def _t(ptr, strides=BSHD):
    return (ptr, strides)


def test_rust_validate_backward_with_features():
    good = (0x4000, 0x5000, 0x6000, 0x7000, 0x8000, 0x9000, 0xa000)
    args = ("f16", SHAPE, True, None, False, _t(0x1000), _t(0x2000), _t(0x3000), good)
    _native.validate_attention_backward(*args, window=(4, 0), softcap=3.0, sinks=0xb000, dsink=0xc000)
    with pytest.raises(ValueError, match="dsink"):
        _native.validate_attention_backward(*args, sinks=0xb000)
    with pytest.raises(ValueError, match="sinks"):
        _native.validate_attention_backward(*args, dsink=0xc000)
    with pytest.raises(ValueError, match="sinks"):
        _native.validate_attention_backward(*args, sinks=0xb002, dsink=0xc000)
    with pytest.raises(ValueError, match="window_size"):
        _native.validate_attention_backward(*args, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap"):
        _native.validate_attention_backward(*args, softcap=-1.0)


def test_varlen_feature_backward_op_is_registered_with_its_schema():
    """Branch bwdcombo: varlen training through a window, softcap and sinks has its own op."""
    schema = str(torch.ops.flashcore.attention_varlen_backward_features.default._schema)
    assert schema.startswith("flashcore::attention_varlen_backward_features(Tensor grad_out, Tensor q, Tensor k, "
                             "Tensor v, Tensor out, Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                             "Tensor? seqused_k, Tensor? seqused_q, SymInt max_seqlen_q, SymInt max_seqlen_k, "
                             "bool causal, float? scale, SymInt window_left, SymInt window_right, float softcap, "
                             "Tensor? sinks)"), schema
    assert schema.endswith("-> (Tensor, Tensor, Tensor, Tensor)")

