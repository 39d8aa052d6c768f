"""flash_attn_varlen_func on the GPU: packed sequences against a float64 reference per
sequence, seqused_k, torch.compile(fullgraph=True), CUDA graph capture (with cu_seqlens changed
between replays: the work list is built on the device), opcheck, two streams at once, errors.
Skips visibly without a usable GPU; FLASHCORE_REQUIRE_GPU=1 turns the skips into failures."""

import math

import pytest
import torch

import flashcore
import gpu_gate


pytestmark = gpu_gate.skip_without_gpu

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")


def pack(lq, lk, hq, hkv, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lq), hq, d, device="cuda", generator=g).to(dtype)
    k = torch.randn(sum(lk), hkv, d, device="cuda", generator=g).to(dtype)
    v = torch.randn(sum(lk), hkv, d, device="cuda", generator=g).to(dtype)
    return q, k, v


def reference(q, k, v, lq, lk, causal, used=None):
    """float64 per sequence: (out [total_q, Hq, D], lse [Hq, total_q])."""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        n = sk if used is None else used[b]
        qs = q[q0:q0 + sq].double().transpose(0, 1)  # [H, S, D]
        ks = k[k0:k0 + n].double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        vs = v[k0:k0 + n].double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        if sq and n:
            s = qs @ ks.transpose(-1, -2) / math.sqrt(d)
            if causal:
                i = torch.arange(sq, device=q.device)[:, None]
                j = torch.arange(n, device=q.device)[None, :]
                s = s.masked_fill(~(j <= i + (n - sq)), float("-inf"))
            lse[:, q0:q0 + sq] = torch.logsumexp(s, -1)
            out[q0:q0 + sq] = (torch.softmax(s, -1).nan_to_num(0.0) @ vs).transpose(0, 1)
        q0 += sq
        k0 += sk
    return out, lse


def check(out, lse, want, want_lse, lq, dtype):
    assert torch.isfinite(out).all()
    q0 = 0
    for b, sq in enumerate(lq):
        w, g = want[q0:q0 + sq], out[q0:q0 + sq].double()
        if sq:
            if (w == 0).all():
                assert (g == 0).all(), f"sequence {b} must be zero"
            else:
                err = ((g - w).norm() / w.norm()).item()
                assert err <= TOL[dtype], f"sequence {b}: rel L2 {err:.3e}"
        q0 += sq
    if lse is not None:
        inf = torch.isinf(want_lse)
        assert torch.equal(torch.isinf(lse), inf)
        assert torch.allclose(lse[~inf].double(), want_lse[~inf], rtol=1e-4, atol=1e-4)


MIXED = ([1, 17, 0, 128, 129, 4097, 5, 3], [1, 40, 7, 128, 300, 4097, 0, 1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (4, 1, 128)])
def test_varlen_matches_float64(dtype, causal, hq, hkv, d):
    lq, lk = MIXED
    q, k, v = pack(lq, lk, hq, hkv, d, dtype)
    out, lse, none = flashcore.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=causal,
                                                      return_attn_probs=True)
    assert none is None and lse.shape == (hq, sum(lq)) and lse.dtype == torch.float32
    want, want_lse = reference(q, k, v, lq, lk, causal)
    check(out, lse, want, want_lse, lq, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_seqused_k(causal):
    lq, lk = [1, 17, 128, 129, 300, 0, 4], [5, 40, 128, 300, 4097, 3, 9]
    used = [5, 0, 100, 129, 1000, 2, 9]
    q, k, v = pack(lq, lk, 4, 2, 64, torch.float16, 1)
    su = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = flashcore.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=causal,
                                                seqused_k=su, return_lse=True)
    want, want_lse = reference(q, k, v, lq, lk, causal, used)
    check(out, lse, want, want_lse, lq, torch.float16)


def test_torch_compile_fullgraph_same_bits():
    lq, lk = MIXED
    q, k, v = pack(lq, lk, 4, 2, 128, torch.bfloat16, 2)
    cq, ck = cu(lq), cu(lk)
    eager = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=True)
    fn = torch.compile(lambda a, b, c, x, y: flashcore.flash_attn_varlen_func(a, b, c, x, y, 4097, 4097, causal=True),
                       fullgraph=True)
    assert torch.equal(fn(q, k, v, cq, ck), eager)


def test_cuda_graph_replay_follows_cu_seqlens():
    """Captured once; the lengths change between replays (same totals and bounds): the replay
    builds the new work list on the device."""
    lq, lk = [100, 28, 300, 0, 84], [90, 200, 33, 7, 182]
    lq2, lk2 = [0, 256, 1, 200, 55], [512, 0, 0, 0, 0]
    q, k, v = pack(lq, lk, 4, 2, 64, torch.float16, 3)
    cq, ck = cu(lq), cu(lk)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch's docs do
        flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 512, 512, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 512, 512, causal=True)
    for lens_q, lens_k in ((lq, lk), (lq2, lk2), (lq, lk)):
        cq.copy_(cu(lens_q))
        ck.copy_(cu(lens_k))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        eager = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 512, 512, causal=True)
        assert torch.equal(out, eager), (lens_q, lens_k)
        want, _ = reference(q, k, v, lens_q, lens_k, True)
        check(out, None, want, None, lens_q, torch.float16)


def test_opcheck():
    lq, lk = [3, 130, 0], [5, 129, 4]
    q, k, v = pack(lq, lk, 4, 2, 64, torch.float16, 4)
    su = torch.tensor([5, 100, 0], dtype=torch.int32, device="cuda")
    op = torch.ops.flashcore.attention_varlen.default
    torch.library.opcheck(op, (q, k, v, cu(lq), cu(lk), None, 130, 129, True, None, True, None))
    torch.library.opcheck(op, (q, k, v, cu(lq), cu(lk), su, 130, 129, False, 0.3, False, None))
    sq_used = torch.tensor([2, 130, 0], dtype=torch.int32, device="cuda")
    torch.library.opcheck(op, (q, k, v, cu(lq), cu(lk), None, 130, 129, True, None, True, sq_used))


def test_two_streams_at_once():
    """Each stream has its own work list: calls interleaved on two streams stay correct."""
    packs = [([700, 3, 129], [64, 900, 129]), ([1, 1, 1, 1000], [1000, 2, 3, 1])]
    data = []
    for i, (lq, lk) in enumerate(packs):
        q, k, v = pack(lq, lk, 4, 4, 64, torch.float16, 10 + i)
        want = flashcore.flash_attn_varlen_func(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=True)
        data.append((q, k, v, cu(lq), cu(lk), max(lq), max(lk), want))
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[], []]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                q, k, v, cq, ck, mq, mk, _ = data[i]
                outs[i].append(flashcore.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True))
    torch.cuda.synchronize()
    for i in range(2):
        for o in outs[i]:
            assert torch.equal(o, data[i][-1])


def test_empty_and_keyless_packs():
    q, k, v = pack([0, 0], [0, 5], 2, 2, 64, torch.float16)
    out = flashcore.flash_attn_varlen_func(q, k, v, cu([0, 0]), cu([0, 5]), 0, 5)
    assert out.shape == (0, 2, 64)
    q, k, v = pack([3, 4], [0, 0], 2, 2, 64, torch.float16)
    out, lse = flashcore.flash_attn_varlen_func(q, k, v, cu([3, 4]), cu([0, 0]), 4, 0, return_lse=True)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()


def test_errors_before_launch():
    lq, lk = [3, 5], [4, 6]
    q, k, v = pack(lq, lk, 2, 2, 64, torch.float16)
    cq, ck = cu(lq), cu(lk)
    f = flashcore.flash_attn_varlen_func
    with pytest.raises(TypeError, match="cu_seqlens_q.*int32"):
        f(q, k, v, cq.long(), ck, 5, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k.*cpu"):
        f(q, k, v, cq, ck.cpu(), 5, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k.*shape"):
        f(q, k, v, cq, ck[:2], 5, 6)
    with pytest.raises(ValueError, match="seqused_k"):
        f(q, k, v, cq, ck, 5, 6, seqused_k=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="dropout"):
        f(q, k, v, cq, ck, 5, 6, dropout_p=0.1)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        f(q, k, v, cq, ck, -1, 6)
    # Varlen trains: autograd records the call instead of refusing it
    # (test_gpu_varlen_backward.py checks the gradients).
    assert f(q.clone().requires_grad_(), k, v, cq, ck, 5, 6).requires_grad
    check_cu = flashcore.varlen.check_cu_seqlens
    check_cu(cq, 8, 5)
    for bad, why in (([0, 5, 3], "non-decreasing"), ([0, 3, 7], "ends at 7"), ([1, 3, 8], "start at 0"),
                     ([0, 1, 8], "more than 5")):
        with pytest.raises(ValueError, match=why):
            check_cu(torch.tensor(bad, dtype=torch.int32), 8, 5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("side", ["left", "right"])
def test_hf_padded_forward_served_by_varlen(side, dtype):
    """A forward pass over a padded batch: every layer on flashcore (varlen), no fallback; logits at
    the real tokens as close to an fp32 eager model on the same (sharpened) weights as "sdpa"'s."""
    pytest.importorskip("transformers")
    import flashcore.hf
    import hf_models

    name = flashcore.hf.register()
    cfg = hf_models.configs()["llama"]
    torch.manual_seed(0)
    ref = hf_models.build("llama", "eager", cfg, device="cuda")
    state = ref.state_dict()
    n = 150
    ids = torch.randint(3, hf_models.VOCAB, (3, n), device="cuda")
    mask = torch.ones_like(ids)
    pads = [0, 37, 140]
    for b, p in enumerate(pads):
        if p:
            if side == "left":
                mask[b, :p] = 0
            else:
                mask[b, n - p:] = 0
    ids = ids.masked_fill(mask == 0, cfg.pad_token_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    with torch.no_grad():
        want = ref(ids, attention_mask=mask, position_ids=pos).logits.float()[real]
    errors = {}
    for impl in ("sdpa", name):
        model = hf_models.build("llama", impl, cfg, state, dtype, "cuda")
        stats = dict(flashcore.hf.stats)
        with torch.no_grad():
            got = model(ids, attention_mask=mask, position_ids=pos).logits.float()[real]
        errors[impl] = hf_models.rel_l2(got, want)
        if impl == name:
            assert flashcore.hf.stats["fallback"] == stats["fallback"], flashcore.hf.reasons
            assert flashcore.hf.stats["flashcore"] - stats["flashcore"] == cfg.num_hidden_layers
    print(f"hf padded ({side}) forward {dtype}: {errors}")
    assert errors[name] <= hf_models.BOUND * errors["sdpa"], errors


def test_prepare_then_capture_on_that_stream():
    lq, lk = [5, 200, 77], [9, 180, 77]
    q, k, v = pack(lq, lk, 4, 4, 128, torch.bfloat16, 21)
    cq, ck = cu(lq), cu(lk)
    s = torch.cuda.Stream()
    flashcore.varlen.prepare(q, k, cq, 200, 180, causal=False, stream=s)
    eager = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 200, 180)
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        out = flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 200, 180)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
