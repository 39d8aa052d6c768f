"""flash_attn_varlen_func(..., secret_lengths=) on the GPU: public slots, secret true
lengths. Against a float64 reference of each sequence's true length (0, 1, 17, 129, odd ones,
slots longer than lengths), rows past a length exactly 0 (LSE -inf), the bits of a sequence
independent of its neighbours' lengths and of its slot past its length, torch.compile and a CUDA
graph replayed with other lengths. Skips visibly without a usable GPU; FLASHCORE_REQUIRE_GPU=1
turns the skips into failures."""

import pytest
import torch

import flashcore
import gpu_gate
from test_gpu_varlen import TOL, cu, pack, reference

pytestmark = gpu_gate.skip_without_gpu


def expected(q, k, v, slots, lens, causal):
    """The reference of each slot's first lens[b] tokens, zeros / -inf past them."""
    hq = q.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    s0 = 0
    for n, l in zip(slots, lens):
        if l:
            o, ls = reference(q[s0:s0 + l], k[s0:s0 + l], v[s0:s0 + l], [l], [l], causal)
            out[s0:s0 + l], lse[:, s0:s0 + l] = o, ls
        s0 += n
    return out, lse


def check(out, lse, want, want_lse, slots, lens, dtype):
    assert torch.isfinite(out).all()
    s0 = 0
    for b, (n, l) in enumerate(zip(slots, lens)):
        assert (out[s0 + l:s0 + n] == 0).all(), f"sequence {b}: rows past its length must be 0"
        assert torch.isneginf(lse[:, s0 + l:s0 + n]).all(), f"sequence {b}: lse past its length must be -inf"
        if l:
            g, w = out[s0:s0 + l].double(), want[s0:s0 + l]
            err = ((g - w).norm() / w.norm()).item()
            assert err <= TOL[dtype], f"sequence {b} (slot {n}, length {l}): rel L2 {err:.3e}"
            assert torch.allclose(lse[:, s0:s0 + l].double(), want_lse[:, s0:s0 + l], rtol=1e-4, atol=1e-4)
        s0 += n


SLOTS = [1, 17, 40, 129, 300, 0, 200, 5, 1]
LENS = [1, 17, 1, 129, 129, 0, 17, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (4, 1, 128), (2, 2, 96)])
def test_secret_lengths_match_float64(dtype, causal, hq, hkv, d):
    q, k, v = pack(SLOTS, SLOTS, hq, hkv, d, dtype, seed=7)
    c = cu(SLOTS)
    lens = torch.tensor(LENS, dtype=torch.int32, device="cuda")
    out, lse = flashcore.flash_attn_varlen_func(q, k, v, c, c, 301, 301, causal=causal, secret_lengths=lens,
                                                return_lse=True)
    want, want_lse = expected(q, k, v, SLOTS, LENS, causal)
    check(out, lse, want, want_lse, SLOTS, LENS, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_bits_depend_on_the_own_length_only(causal):
    slots = [129, 200, 17, 64]
    q, k, v = pack(slots, slots, 4, 2, 128, torch.bfloat16, seed=3)
    c = cu(slots)
    runs = [[100, 200, 17, 1], [100, 0, 1, 64], [100, 129, 16, 33]]
    first = []
    for lens in runs:
        t = torch.tensor(lens, dtype=torch.int32, device="cuda")
        out, lse = flashcore.flash_attn_varlen_func(q, k, v, c, c, 200, 200, causal=causal, secret_lengths=t,
                                                    return_lse=True)
        want, want_lse = expected(q, k, v, slots, lens, causal)
        check(out, lse, want, want_lse, slots, lens, torch.bfloat16)
        first.append((out[:100].clone(), lse[:, :100].clone()))
    for o, l in first[1:]:
        assert torch.equal(o.view(torch.int16), first[0][0].view(torch.int16))
        assert torch.equal(l, first[0][1])
    # Other keys and values in sequence 0's slot past its length: the same bits.
    k2, v2 = k.clone(), v.clone()
    k2[100:129] = -3 * k2[100:129] + 1
    v2[100:129] = 5 * v2[100:129] - 2
    out = flashcore.flash_attn_varlen_func(q, k2, v2, c, c, 200, 200, causal=causal,
                                           secret_lengths=torch.tensor(runs[0], dtype=torch.int32, device="cuda"))
    assert torch.equal(out[:100].view(torch.int16), first[0][0].view(torch.int16))


def test_empty_pack_and_compile_and_graph():
    # An empty pack: nothing to compute.
    q = torch.empty(0, 2, 64, dtype=torch.float16, device="cuda")
    c0 = torch.zeros(3, dtype=torch.int32, device="cuda")
    out = flashcore.flash_attn_varlen_func(q, q, q, c0, c0, 4, 4, secret_lengths=torch.zeros(2, dtype=torch.int32,
                                                                                             device="cuda"))
    assert out.shape == (0, 2, 64)
    slots = [33, 7, 60]
    q, k, v = pack(slots, slots, 2, 2, 64, torch.float16, seed=5)
    c = cu(slots)
    lens = torch.tensor([33, 2, 59], dtype=torch.int32, device="cuda")

    def f(q, k, v, c, lens):
        return flashcore.flash_attn_varlen_func(q, k, v, c, c, 60, 60, causal=True, secret_lengths=lens)

    eager = f(q, k, v, c, lens)
    compiled = torch.compile(f, fullgraph=True)(q, k, v, c, lens)
    want, want_lse = expected(q, k, v, slots, [33, 2, 59], True)
    s0 = 0
    for n, l in zip(slots, [33, 2, 59]):
        assert (compiled[s0 + l:s0 + n] == 0).all()
        w = want[s0:s0 + l]
        err = ((compiled[s0:s0 + l].double() - w).norm() / w.norm()).item()
        assert err <= TOL[torch.float16], f"compiled: slot at {s0}: rel L2 {err:.3e}"
        s0 += n
    assert torch.equal(eager, compiled)
    # A CUDA graph captured once, replayed with other secret lengths.
    static_lens = lens.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(q, k, v, c, static_lens)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = f(q, k, v, c, static_lens)
    for new in ([1, 7, 0], [33, 0, 60]):
        static_lens.copy_(torch.tensor(new, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        want, want_lse = expected(q, k, v, slots, new, True)
        s0 = 0
        for n, l in zip(slots, new):
            assert (graphed[s0 + l:s0 + n] == 0).all()
            if l:
                w = want[s0:s0 + l]
                err = ((graphed[s0:s0 + l].double() - w).norm() / w.norm()).item()
                assert err <= TOL[torch.float16], f"graph replay, lengths {new}: rel L2 {err:.3e}"
            s0 += n
