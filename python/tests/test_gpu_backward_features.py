"""Training through the window, softcap and sink features: sliding windows, softcap and learnable
sinks in the backward. flash_attn_func's gradients (dq, dk, dv and the sink's) against float64
autograd of a reference with the same features; bitwise run-to-run determinism; the backward op's
opcheck; what is still refused; and a training step of scaled-down Mistral (window), Gemma 2 (head
dim 128: softcap, alternating window) and gpt-oss (sinks, window 128, head dim 64) models through
the "fcore" backend with zero fallbacks, against an fp32 eager model, within hf_models.BOUND of
transformers' own backends."""

import math

import pytest
import torch

import flashcore
import gpu_gate

pytestmark = gpu_gate.skip_without_gpu

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_l2(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def reference(q, k, v, causal, window, softcap, sinks):
    """float64 attention on [B, S, H, D] (window bottom-right aligned, softcap, sinks), written so
    that autograd gives no NaN for rows that see nothing (their gradient is 0)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    hq, hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    sq, sk = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=q.device)[None, :]
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, hq, 1, 1).expand(q.shape[0], hq, sq, 1)], -1)
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True)
    p = e / torch.where(den > 0, den, torch.ones_like(den))
    if sinks is not None:
        p = p[..., :-1]
    return (p @ v).transpose(1, 2)


CASES = [
    # (b, sq, sk, hq, hkv, causal, window, softcap, sinks)
    (2, 300, 300, 4, 2, True, (64, 0), 0.0, False),  # Mistral-like
    (1, 257, 400, 4, 4, False, (50, 30), 3.0, True),  # everything, Sq < Sk
    (1, 300, 77, 4, 2, True, (20, -1), 5.0, True),  # Sq > Sk: rows that see only the sink
    (1, 17, 17, 2, 2, False, (-1, -1), 2.0, False),  # softcap alone
    (1, 1000, 1000, 8, 2, True, (127, 0), 0.0, True),  # gpt-oss' sliding layer
    (1, 1, 200, 2, 1, False, (-1, 40), 0.0, False),  # S = 1, right-only
]


def _inputs(b, sq, sk, hq, hkv, d, dtype, with_sinks, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    q = (r(b, sq, hq, d) * 1.5).to(dtype)
    k = (r(b, sk, hkv, d) * 1.5).to(dtype)
    v = r(b, sk, hkv, d).to(dtype)
    do = r(b, sq, hq, d).to(dtype)
    # A model keeps its sinks in its own dtype (gpt-oss: bf16); the gradient comes back in it.
    sinks = (r(hq) * 1.5).to(torch.bfloat16) if with_sinks else None
    return q, k, v, do, sinks


def _flashcore_grads(q, k, v, do, sinks, causal, window, softcap):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    s = sinks.clone().requires_grad_() if sinks is not None else None
    out = flashcore.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap, learnable_sink=s)
    out.backward(do)
    return [t.grad for t in leaves] + ([s.grad] if s is not None else [])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", flashcore._checks.FEATURE_BACKWARD_HEAD_DIMS)
@pytest.mark.parametrize("case", CASES)
def test_feature_gradients_match_float64_autograd(case, d, dtype):
    b, sq, sk, hq, hkv, causal, window, softcap, with_sinks = case
    q, k, v, do, sinks = _inputs(b, sq, sk, hq, hkv, d, dtype, with_sinks, sq + sk + d)
    got = _flashcore_grads(q, k, v, do, sinks, causal, window, softcap)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s64 = sinks.detach().double().requires_grad_() if sinks is not None else None
    reference(*leaves, causal, window, softcap, s64).backward(do.double())
    want = [t.grad for t in leaves] + ([s64.grad] if s64 is not None else [])
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        assert g is not None and torch.isfinite(g).all(), name
        if name == "dsink":
            assert g.dtype == torch.bfloat16  # the sink's own dtype
        # dsink comes back rounded to the sink's bf16: bf16's tolerance for it.
        tol = TOL[torch.bfloat16] if name == "dsink" else TOL[dtype]
        assert rel_l2(g, w) <= tol, (name, rel_l2(g, w))


def test_feature_gradients_are_bitwise_deterministic():
    q, k, v, do, sinks = _inputs(2, 700, 700, 8, 2, 128, torch.bfloat16, True, 7)
    first = _flashcore_grads(q, k, v, do, sinks, True, (200, 0), 20.0)
    for _ in range(2):
        again = _flashcore_grads(q, k, v, do, sinks, True, (200, 0), 20.0)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_backward_features_op_opcheck():
    q = torch.randn(2, 200, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(4, device="cuda")
    out, lse = torch.ops.flashcore.attention(q, k, k, True, None, False, True, None, 64, 0, 20.0, sinks)
    torch.library.opcheck(torch.ops.flashcore.attention_backward_features.default,
                          (torch.randn_like(out), q, k, k, out, lse, True, None, False, 64, 0, 20.0, sinks),
                          test_utils=("test_schema", "test_faketensor"))
    dq, dk, dv, dsink = torch.ops.flashcore.attention_backward_features(
        torch.randn_like(out), q, k, k, out, lse, True, None, False, 64, 0, 20.0, None)
    assert dsink.numel() == 0 and dq.shape == q.shape and dk.shape == k.shape


def test_what_the_feature_backward_still_refuses():
    # Features with secret lengths stay refused (forward and backward).
    q64 = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises((RuntimeError, ValueError), match="secret_lengths"):
        flashcore.attention(q64.clone().requires_grad_(), q64, q64, window_size=(8, 0),
                            secret_lengths=torch.full((1,), 64, dtype=torch.int32, device="cuda"))


# --- HF models: a training step through "fcore" ----------------------------------------------


def _training_configs():
    import transformers as tf

    c = dict(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    return {
        "mistral": tf.MistralConfig(**c, sliding_window=16),
        # Gemma 2 at head dim 128: layers sliding / full, softcap 10 (so that it bends at these scores)
        "gemma2_d128": tf.Gemma2Config(
            **c, head_dim=128, query_pre_attn_scalar=128, sliding_window=16, attn_logit_softcapping=10.0
        ),
        # gpt-oss: sinks on both layers, a window of 128 on the sliding one (shorter than the 256 tokens)
        "gpt_oss": tf.GptOssConfig(**c, head_dim=64, sliding_window=128, num_local_experts=2, num_experts_per_tok=2),
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", ["mistral", "gemma2_d128", "gpt_oss"])
def test_hf_training_step_with_features(family, dtype):
    """Loss and every parameter gradient (gpt-oss' sinks included) of one training step through
    "fcore", against an fp32 eager model on the same sharpened weights: within hf_models.BOUND of
    transformers' best backend, every attention call served by flashcore (no fallback)."""
    pytest.importorskip("transformers")
    import flashcore.hf
    import hf_models

    fallback_before = flashcore.hf.stats["fallback"]
    errors, served = hf_models.compare_training(family, "cuda", dtype, seq=256, cfg=_training_configs()[family])
    fcore = errors.pop("fcore")
    print(f"hf training {family} {dtype}: fcore loss {fcore[0]:.2e} grads {fcore[1]:.2e}; others {errors}")
    assert served == 2  # both layers' forwards (and so their backwards) ran on flashcore
    best_grad = min(e[1] for e in errors.values())
    assert fcore[1] <= hf_models.BOUND * best_grad, (fcore, errors)
    worst_loss = max(e[0] for e in errors.values())
    assert fcore[0] <= max(hf_models.BOUND * worst_loss, 1e-3), (fcore, errors)
    # The other backends never go through flashcore.hf: every fallback would be fcore's.
    assert flashcore.hf.stats["fallback"] == fallback_before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", ["mistral", "gemma2_d128", "gpt_oss"])
def test_hf_padded_training_step_with_features(family, dtype):
    """The same models on a padded batch (one row right-padded, one left-padded): each layer's
    mask is padding with its causal window on top, served by varlen's backward with the window,
    softcap and sinks (no fallback to SDPA); loss and every parameter gradient (the sinks' too)
    against the fp32 eager model within hf_models.BOUND of transformers' best backend."""
    pytest.importorskip("transformers")
    import flashcore.hf
    import hf_models

    fallback_before = flashcore.hf.stats["fallback"]
    errors, served = hf_models.compare_training(family, "cuda", dtype, seq=256, padded=True,
                                                cfg=_training_configs()[family])
    fcore = errors.pop("fcore")
    print(f"hf padded training {family} {dtype}: fcore loss {fcore[0]:.2e} grads {fcore[1]:.2e}; others {errors}")
    assert served == 2 and flashcore.hf.stats["fallback"] == fallback_before  # no call fell back
    best_grad = min(e[1] for e in errors.values())
    assert fcore[1] <= hf_models.BOUND * best_grad, (fcore, errors)
    worst_loss = max(e[0] for e in errors.values())
    assert fcore[0] <= max(hf_models.BOUND * worst_loss, 1e-3), (fcore, errors)
