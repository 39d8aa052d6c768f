"""Training through flash_attn_varlen_func on the GPU: gradients of packed
sequences of mixed lengths (empty ones too, Sq != Sk, GQA, causal and not, seqused_k/seqused_q,
every head dim; windows, softcap and learnable sinks) against float64 autograd per
sequence; bitwise run to run and independent of the neighbours;
torch.compile(fullgraph=True) as an opaque op; no host synchronisation; refusals; and an HF
Llama training step on a padded batch through "fcore" (served by varlen, no fallback) against
transformers' own backends. Skips visibly without a usable GPU; FLASHCORE_REQUIRE_GPU=1 turns the skips into failures."""

import math

import pytest
import torch

import flashcore
import gpu_gate
from flashcore import flash_attn_varlen_func

pytestmark = gpu_gate.skip_without_gpu

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")


def leaves(lq, lk, hq, hkv, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda n, h: torch.randn(n, h, d, device="cuda", generator=g).to(dtype).requires_grad_()  # noqa: E731
    q, k, v = mk(sum(lq), hq), mk(sum(lk), hkv), mk(sum(lk), hkv)
    d_o = torch.randn(sum(lq), hq, d, device="cuda", generator=g).to(dtype)
    return q, k, v, d_o


def reference_grads(q, k, v, d_o, lq, lk, causal, used_k=None, used_q=None):
    """float64 autograd per sequence: (dq, dk, dv), zero where no sequence uses a row."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    loss = torch.zeros((), dtype=torch.float64, device=q.device)
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        n = sk if used_k is None else min(sk, used_k[b])
        m = sq if used_q is None else min(sq, used_q[b])
        if m and n:
            qs = q64[q0:q0 + m].transpose(0, 1)
            ks = k64[k0:k0 + n].transpose(0, 1).repeat_interleave(hq // hkv, 0)
            vs = v64[k0:k0 + n].transpose(0, 1).repeat_interleave(hq // hkv, 0)
            s = qs @ ks.transpose(-1, -2) / math.sqrt(d)
            if causal:
                i = torch.arange(m, device=q.device)[:, None]
                j = torch.arange(n, device=q.device)[None, :]
                s = s.masked_fill(~(j <= i + (n - m)), float("-inf"))
            p = torch.softmax(s, -1).nan_to_num(0.0)
            o = (p @ vs).transpose(0, 1)
            loss = loss + (o * d_o[q0:q0 + m].double()).sum()
        q0 += sq
        k0 += sk
    if loss.requires_grad:
        loss.backward()
    return tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in (q64, k64, v64))


def grads(q, k, v, d_o, cq, ck, mq, mk, causal, **kw):
    for t in (q, k, v):
        t.grad = None
    out = flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=causal, **kw)
    out.backward(d_o)
    return q.grad.clone(), k.grad.clone(), v.grad.clone()


def rel(got, want):
    n = want.norm()
    return ((got.double() - want).norm() / n).item() if n > 0 else got.double().norm().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", flashcore._checks.VARLEN_BACKWARD_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients_match_float64(dtype, d, causal):
    lq = [1, 17, 128, 129, 1000, 0, 17, 5, 200]
    lk = [1, 17, 128, 129, 1000, 40, 0, 300, 50]
    q, k, v, d_o = leaves(lq, lk, 4, 2, d, dtype, seed=d + causal)
    got = grads(q, k, v, d_o, cu(lq), cu(lk), max(lq), max(lk), causal)
    want = reference_grads(q, k, v, d_o, lq, lk, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        assert g.dtype == dtype and g.shape == w.shape
        e = rel(g, w)
        assert e <= TOL[dtype], (name, e)
    # A sequence with no key: dQ exactly 0; one with no query: dK = dV = 0.
    assert (got[0][sum(lq[:6]):sum(lq[:7])] == 0).all()
    assert (got[1][sum(lk[:5]):sum(lk[:6])] == 0).all() and (got[2][sum(lk[:5]):sum(lk[:6])] == 0).all()


def test_seqused_gradients_match_float64():
    """A padded batch as the HF backend runs it: slot b of S tokens, its first used[b] real."""
    s, used = 130, [130, 17, 1]
    lq = lk = [s, s, s]
    for causal in (False, True):
        q, k, v, d_o = leaves(lq, lk, 4, 2, 64, torch.bfloat16, seed=7)
        u = torch.tensor(used, dtype=torch.int32, device="cuda")
        got = grads(q, k, v, d_o, cu(lq), cu(lk), s, s, causal, seqused_k=u, seqused_q=u)
        want = reference_grads(q, k, v, d_o, lq, lk, causal, used, used)
        for g, w in zip(got, want):
            assert torch.isfinite(g).all()
            assert rel(g, w) <= TOL[torch.bfloat16]
        # Rows past each sequence's used tokens: exactly 0.
        for b in range(3):
            for g in got:
                assert (g[b * s + used[b]:(b + 1) * s] == 0).all()


def test_bits_are_independent_of_neighbours_and_reruns():
    d, dtype = 128, torch.float16
    x = leaves([129], [200], 4, 2, d, dtype, seed=3)
    for causal in (False, True):
        alone = grads(*x, cu([129]), cu([200]), 129, 200, causal)
        lq, lk = [17, 1000, 129, 1], [5, 1000, 200, 64]
        q, k, v, d_o = leaves(lq, lk, 4, 2, d, dtype, seed=4)
        with torch.no_grad():
            q[1017:1146] = x[0]
            k[1005:1205] = x[1]
            v[1005:1205] = x[2]
            d_o[1017:1146] = x[3]
        packed = grads(q, k, v, d_o, cu(lq), cu(lk), 1000, 1000, causal)
        again = grads(q, k, v, d_o, cu(lq), cu(lk), 1000, 1000, causal)
        assert torch.equal(alone[0], packed[0][1017:1146])
        assert torch.equal(alone[1], packed[1][1005:1205]) and torch.equal(alone[2], packed[2][1005:1205])
        for a, b in zip(packed, again):
            assert torch.equal(a, b)


def test_backward_runs_without_host_sync_and_under_compile():
    lq, lk = [17, 300, 64], [40, 300, 1]
    q, k, v, d_o = leaves(lq, lk, 4, 2, 64, torch.bfloat16, seed=5)
    cq, ck = cu(lq), cu(lk)
    eager = grads(q, k, v, d_o, cq, ck, 300, 300, True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = grads(q, k, v, d_o, cq, ck, 300, 300, True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(eager, again):
        assert torch.equal(a, b)

    @torch.compile(fullgraph=True)
    def step(q, k, v, d_o):
        out = flash_attn_varlen_func(q, k, v, cq, ck, 300, 300, causal=True)
        return (out.float() * d_o.float()).sum()

    for t in (q, k, v):
        t.grad = None
    step(q, k, v, d_o).backward()
    for a, b in zip(eager, (q.grad, k.grad, v.grad)):
        assert torch.equal(a, b)


def test_opcheck_of_the_backward_op():
    lq, lk = [5, 33], [7, 20]
    q, k, v, d_o = leaves(lq, lk, 2, 1, 64, torch.float16, seed=6)
    out, lse = torch.ops.flashcore.attention_varlen(q.detach(), k.detach(), v.detach(), cu(lq), cu(lk), None, 33, 20,
                                                    True, None, True, None)
    torch.library.opcheck(torch.ops.flashcore.attention_varlen_backward,
                          (d_o, q.detach(), k.detach(), v.detach(), out, lse, cu(lq), cu(lk), None, None, 33, 20, True,
                           None))


def test_what_has_no_backward_is_refused():
    lq = lk = [16, 9]
    q, k, v, d_o = leaves(lq, lk, 2, 2, 64, torch.float16, seed=8)
    c = cu(lq)
    with pytest.raises(RuntimeError, match="requires grad, but flash_attn_varlen_func with secret_lengths"):
        flash_attn_varlen_func(q, k, v, c, c, 16, 16, secret_lengths=torch.tensor([3, 9], dtype=torch.int32,
                                                                                    device="cuda"))
    # The op itself without the LSE: its backward says what to pass.
    out, _ = torch.ops.flashcore.attention_varlen(q, k, v, c, c, None, 16, 16, False, None, False, None)
    with pytest.raises(RuntimeError, match="return_lse=True"):
        out.backward(d_o)



def feature_reference(q, k, v, d_o, lq, lk, causal, window, softcap, sinks):
    """float64 autograd per sequence with the window, softcap and sink features (each window bottom-right aligned to
    the sequence's own lengths; sinks join every row's denominator): (dq, dk, dv, dsink)."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s64 = sinks.detach().double().requires_grad_() if sinks is not None else None
    loss = torch.zeros((), dtype=torch.float64, device=q.device)
    q0 = k0 = 0
    for sq, sk in zip(lq, lk):
        if sq:
            qs = q64[q0:q0 + sq].transpose(0, 1)
            ks = k64[k0:k0 + sk].transpose(0, 1).repeat_interleave(hq // hkv, 0)
            vs = v64[k0:k0 + sk].transpose(0, 1).repeat_interleave(hq // hkv, 0)
            s = qs @ ks.transpose(-1, -2) / math.sqrt(d)
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
            if s64 is not None:
                s = torch.cat([s, s64.view(hq, 1, 1).expand(hq, sq, 1)], -1)
            m = s.detach().amax(-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            den = e.sum(-1, keepdim=True)
            p = e / torch.where(den > 0, den, torch.ones_like(den))
            if s64 is not None:
                p = p[..., :-1]
            o = (p @ vs).transpose(0, 1)
            loss = loss + (o * d_o[q0:q0 + sq].double()).sum()
        q0 += sq
        k0 += sk
    loss.backward()
    out = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (q64, k64, v64)]
    return out + ([s64.grad] if s64 is not None else [])


VARLEN_FEATURE_CASES = [
    # (d, causal, window, softcap, sinks)
    (64, True, (64, 0), 0.0, False),  # Mistral-like
    (96, False, (50, 30), 3.0, True),  # everything, both sides
    (128, True, (20, -1), 5.0, True),  # rows that see only the sink (Sq > Sk)
    (256, False, (-1, -1), 2.0, False),  # softcap alone
    (256, True, (127, 0), 0.0, True),  # gpt-oss' sliding layer
    (96, False, (-1, 40), 0.0, False),  # right-only
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", VARLEN_FEATURE_CASES)
def test_varlen_feature_gradients_match_float64(case, dtype):
    """Branch bwdcombo: windows, softcap and sinks through the varlen backward, the sink's
    gradient (summed over the pack) back in its own dtype."""
    d, causal, window, softcap, with_sinks = case
    lq, lk = [1, 17, 300, 129, 0, 200], [1, 17, 77, 300, 40, 200]
    q, k, v, d_o = leaves(lq, lk, 4, 2, d, dtype, seed=d + int(causal))
    with torch.no_grad():
        q.mul_(1.5)
        k.mul_(1.5)
    sinks = (torch.randn(4, device="cuda") * 1.5).to(torch.bfloat16).requires_grad_() if with_sinks else None
    for t in (q, k, v):
        t.grad = None
    out = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=causal, window_size=window,
                                 softcap=softcap, learnable_sink=sinks)
    out.backward(d_o)
    got = [q.grad, k.grad, v.grad] + ([sinks.grad] if with_sinks else [])
    want = feature_reference(q, k, v, d_o, lq, lk, causal, window, softcap, sinks)
    for name, g, w in zip(("dq", "dk", "dv", "dsink"), got, want):
        assert g is not None and torch.isfinite(g).all(), name
        if name == "dsink":
            assert g.dtype == torch.bfloat16
        # dsink: bf16's tolerance (its own dtype; the kernel reads the dtype-rounded O).
        tol = TOL[torch.bfloat16] if name == "dsink" else TOL[dtype]
        assert rel(g, w) <= tol, (name, rel(g, w))


def test_varlen_feature_bits_are_deterministic_and_opcheck():
    lq, lk = [129, 300, 17], [200, 300, 40]
    q, k, v, d_o = leaves(lq, lk, 4, 2, 128, torch.bfloat16, seed=9)
    sinks = torch.randn(4, device="cuda", requires_grad=True)

    def run():
        for t in (q, k, v, sinks):
            t.grad = None
        out = flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), 300, 300, causal=True, window_size=(100, 0),
                                     softcap=20.0, learnable_sink=sinks)
        out.backward(d_o)
        return [t.grad.clone() for t in (q, k, v, sinks)]

    first = run()
    assert all(torch.equal(a, b) for a, b in zip(first, run()))
    out, lse = torch.ops.flashcore.attention_varlen(q.detach(), k.detach(), v.detach(), cu(lq), cu(lk), None, 300,
                                                    300, True, None, True, None, 100, 0, 20.0, sinks.detach())
    torch.library.opcheck(torch.ops.flashcore.attention_varlen_backward_features,
                          (d_o, q.detach(), k.detach(), v.detach(), out, lse, cu(lq), cu(lk), None, None, 300, 300,
                           True, None, 100, 0, 20.0, sinks.detach()),
                          test_utils=("test_schema", "test_faketensor"))



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [(64, (15, 0), 10.0, True), (128, (15, 0), 0.0, False), (64, (127, 0), 0.0, True)])
def test_padded_pack_feature_gradients_match_float64(case, dtype):
    """A padded batch with the window, softcap and sink features as the HF backend packs it: slot b of S rows, its
    sequence from row b·S + start[b] (left padding), used[b] tokens (seqused_q = seqused_k), a
    causal window, softcap and sinks; every used row's gradients against float64, all other rows 0."""
    d, window, softcap, with_sinks = case
    s, start, used = 100, [0, 20, 0, 37], [100, 80, 63, 1]
    b = len(start)
    q, k, v, d_o = leaves([b * s], [b * s], 4, 2, d, dtype, seed=11 + d)
    with torch.no_grad():
        q.mul_(2.0)
        k.mul_(2.0)
    sinks = (torch.randn(4, device="cuda") * 1.5).to(torch.bfloat16).requires_grad_() if with_sinks else None
    offsets = [i * s + start[i] for i in range(b)]
    c = torch.tensor(offsets + [b * s], dtype=torch.int32, device="cuda")
    u = torch.tensor(used, dtype=torch.int32, device="cuda")
    out = flash_attn_varlen_func(q, k, v, c, c, s, s, causal=True, window_size=window, softcap=softcap,
                                 learnable_sink=sinks, seqused_q=u, seqused_k=u)
    out.backward(d_o)
    rows = torch.cat([torch.arange(o, o + n, device="cuda") for o, n in zip(offsets, used)])
    want = feature_reference(q[rows], k[rows], v[rows], d_o[rows], used, used, True, window, softcap, sinks)
    got = [q.grad, k.grad, v.grad]
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        assert rel(g[rows], w) <= TOL[dtype], (name, rel(g[rows], w))
        rest = torch.ones(b * s, dtype=torch.bool, device="cuda")
        rest[rows] = False
        assert (g[rest] == 0).all(), name
    if with_sinks:
        assert rel(sinks.grad, want[3]) <= TOL[torch.bfloat16], rel(sinks.grad, want[3])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hf_padded_training_step_matches_sdpa(dtype):
    """A Llama (GQA 4/2, sharpened q/k) training step on a padded batch (one row right-padded, one
    left-padded) through "fcore": every attention call served by varlen (no fallback), loss and
    parameter gradients against an fp32 eager model within hf_models.BOUND of the best backend's error."""
    pytest.importorskip("transformers")
    import flashcore.hf
    import hf_models

    fallback = flashcore.hf.stats["fallback"]
    errors, served = hf_models.compare_training("llama", "cuda", dtype, seq=128, padded=True)
    fcore = errors.pop("fcore")
    print(f"hf padded training llama {dtype}: fcore loss {fcore[0]:.2e} grads {fcore[1]:.2e}; others {errors}")
    assert served == 2 and flashcore.hf.stats["fallback"] == fallback  # no call fell back
    # Within BOUND of transformers' best backend (the loss leaves out predictions made at padding
    # positions, whose outputs are each backend's own convention: hf_models._loss_and_grads).
    assert fcore[1] <= hf_models.BOUND * min(e[1] for e in errors.values()), (fcore, errors)
    worst_loss = max(e[0] for e in errors.values())
    assert fcore[0] <= max(hf_models.BOUND * worst_loss, 1e-3), (fcore, errors)
