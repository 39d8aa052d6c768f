"""Chunked prefill over a KV cache on the GPU: flash_attn_with_kvcache with more than 16
new positions per sequence, dense or packed with cu_seqlens_q, over contiguous and paged caches,
against a float64 reference per sequence; the cache contents after the append; a prompt prefilled
chunk by chunk against the one-shot prefill (bits); the pages read in the kernel against the
gathered copy (bits); left padding; torch.compile and CUDA graphs.
Skips visibly without a usable GPU; FLASHCORE_REQUIRE_GPU=1 turns the skips into failures."""

import math

import pytest
import torch

import flashcore
import gpu_gate

pytestmark = gpu_gate.skip_without_gpu

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_l2(got, want):
    assert not torch.isnan(got).any(), "NaN in the output"
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-300)).item()


def ref_rows(q, k, v, causal, scale=None, start=0):
    """float64 attention of q [Sq, Hq, D] over k, v [Sk, Hkv, D] (keys before `start` masked),
    causal bottom-right aligned: query i sees keys j <= i + Sk - Sq."""
    sq, hq, d = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    qh = q.double().transpose(0, 1)
    kh = k.double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
    vh = v.double().transpose(0, 1).repeat_interleave(hq // hkv, 0)
    s = qh @ kh.transpose(1, 2) * scale
    j = torch.arange(sk, device=q.device)
    mask = (j[None, :] < start).expand(sq, sk)
    if causal:
        i = torch.arange(sq, device=q.device)
        mask = mask | (j[None, :] > i[:, None] + sk - sq)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vh).transpose(0, 1)


def paged(cache, page, gen):
    """A contiguous cache [B, cap, H, D] as a shuffled page pool and its block table."""
    b, cap, h, d = cache.shape
    n = b * cap // page
    perm = torch.randperm(n, generator=gen, device="cpu").to(cache.device)
    pool = torch.empty(n, page, h, d, dtype=cache.dtype, device=cache.device)
    pool[perm] = cache.reshape(n, page, h, d)
    return pool, perm.view(b, cap // page).to(torch.int32)


def unpage(pool, table):
    b, pages = table.shape
    return pool[table.long()].reshape(b, pages * pool.shape[1], pool.shape[2], pool.shape[3])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["dense", "packed", "paged-packed"])
@pytest.mark.parametrize("causal, hq, hkv, d", [(True, 8, 2, 128), (False, 4, 4, 64), (True, 8, 1, 64)])
def test_chunked_prefill_matches_float64(dtype, layout, causal, hq, hkv, d):
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    b, cap = 3, 1024
    counts = [0, 17, 700]
    new = [100, 100, 100] if layout == "dense" else [1, 300, 33]
    cache_k = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    cache_v = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    before_k, before_v = cache_k.clone(), cache_v.clone()
    seqlens = torch.tensor(counts, dtype=torch.int32, device="cuda")
    kw = dict(cache_seqlens=seqlens, causal=causal, return_softmax_lse=True)
    if layout == "dense":
        q = torch.randn(b, 100, hq, d, device="cuda", generator=gen).to(dtype)
        k = torch.randn(b, 100, hkv, d, device="cuda", generator=gen).to(dtype)
        v = torch.randn(b, 100, hkv, d, device="cuda", generator=gen).to(dtype)
    else:
        q = torch.randn(sum(new), hq, d, device="cuda", generator=gen).to(dtype)
        k = torch.randn(sum(new), hkv, d, device="cuda", generator=gen).to(dtype)
        v = torch.randn(sum(new), hkv, d, device="cuda", generator=gen).to(dtype)
        cu = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        kw.update(cu_seqlens_q=cu, max_seqlen_q=max(new))
    kc, vc = cache_k, cache_v
    if layout == "paged-packed":
        kc, table = paged(cache_k, 64, torch.Generator().manual_seed(7))
        vc, _ = paged(cache_v, 64, torch.Generator().manual_seed(7))  # the same pages as K's
        kw["block_table"] = table
    out, lse = flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    assert torch.equal(seqlens.cpu(), torch.tensor(counts, dtype=torch.int32)), "cache_seqlens itself is not changed"
    after_k, after_v = (kc, vc) if layout != "paged-packed" else (unpage(kc, table), unpage(vc, table))
    t = 0
    for i in range(b):
        c, n = counts[i], new[i]
        kn = k[i] if layout == "dense" else k[t:t + n]
        vn = v[i] if layout == "dense" else v[t:t + n]
        # The append: the new rows at c .., every other row as it was.
        assert torch.equal(after_k[i, c:c + n], kn) and torch.equal(after_v[i, c:c + n], vn)
        assert torch.equal(after_k[i, :c], before_k[i, :c]) and torch.equal(after_k[i, c + n:], before_k[i, c + n:])
        assert torch.equal(after_v[i, c + n:], before_v[i, c + n:])
        qi = q[i] if layout == "dense" else q[t:t + n]
        oi = out[i] if layout == "dense" else out[t:t + n]
        want = ref_rows(qi, after_k[i, :c + n], after_v[i, :c + n], causal)
        assert rel_l2(oi, want) <= TOL[dtype], (i, rel_l2(oi, want))
        li = lse[i] if layout == "dense" else lse[:, t:t + n]
        assert torch.isfinite(li).all()
        t += n


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page", [0, 16, 128])
def test_chunk_by_chunk_prefill_gives_the_one_shot_bits(dtype, page):
    """A 1000-token prompt prefilled in chunks of 300, 17, 683 over an empty cache gives, row by
    row, the bits of the one-shot causal varlen prefill of the whole prompt, and matches the
    dense causal prefill within the bounds."""
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    hq, hkv, d, total, cap = 16, 4, 128, 1000, 1024
    q = torch.randn(total, hq, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(total, hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(total, hkv, d, device="cuda", generator=gen).to(dtype)
    # Rows not yet written hold other values; the attention masks them.
    kc = torch.randn(1, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    vc = torch.randn(1, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    kw = {}
    if page:
        kc, table = paged(kc, page, torch.Generator().manual_seed(3))
        vc, _ = paged(vc, page, torch.Generator().manual_seed(3))
        kw["block_table"] = table
    outs, done = [], 0
    for n in (300, 17, 683):
        seqlens = torch.tensor([done], dtype=torch.int32, device="cuda")
        o = flashcore.flash_attn_with_kvcache(q[None, done:done + n], kc, vc, k[None, done:done + n],
                                              v[None, done:done + n], cache_seqlens=seqlens, causal=True, **kw)
        outs.append(o[0])
        done += n
    chunked = torch.cat(outs)
    cu = torch.tensor([0, total], dtype=torch.int32, device="cuda")
    one_shot = flashcore.flash_attn_varlen_func(q, k, v, cu, cu, total, total, causal=True)
    assert torch.equal(chunked, one_shot), "chunked rows differ in bits from the one-shot varlen prefill"
    dense = flashcore.flash_attn_func(q[None], k[None], v[None], causal=True)[0]
    want = ref_rows(q, k, v, True)
    assert rel_l2(chunked, want) <= TOL[dtype] and rel_l2(dense, want) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page", [1, 7, 16, 48, 64, 256])
@pytest.mark.parametrize("leftpad", [False, True])
def test_paged_chunked_prefill_read_in_the_kernel_gives_the_gathered_bits(dtype, page, leftpad, monkeypatch):
    """FLASHCORE_PAGED_PREFILL=kernel (the varlen kernel reads the pages through the table: TMA
    boxes or, for other page sizes and with left padding, a row gather) against =gather (the
    pages gathered into a contiguous copy first): the same output and LSE bits, the same cache
    after the append; rows past each count hold NaN."""
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    b, cap, hq, hkv, d = 3, 5376, 8, 2, 128  # 5376: a whole number of every page size
    counts, new = [0, 17, 3000], [1, 300, 33]
    cache_k = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    cache_v = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    for i in range(b):
        cache_k[i, counts[i] + new[i]:] = float("nan")
        cache_v[i, counts[i] + new[i]:] = float("nan")
    q = torch.randn(sum(new), hq, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(sum(new), hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(sum(new), hkv, d, device="cuda", generator=gen).to(dtype)
    cu = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    kc, table = paged(cache_k, page, torch.Generator().manual_seed(11))
    vc, _ = paged(cache_v, page, torch.Generator().manual_seed(11))
    kw = dict(cache_seqlens=torch.tensor(counts, dtype=torch.int32, device="cuda"), causal=True,
              cu_seqlens_q=cu, max_seqlen_q=max(new), block_table=table, return_softmax_lse=True)
    if leftpad:
        kw["cache_leftpad"] = torch.tensor([0, 5, 1001], dtype=torch.int32, device="cuda")
    runs = []
    for mode in ("gather", "kernel"):
        monkeypatch.setenv("FLASHCORE_PAGED_PREFILL", mode)
        kp, vp = kc.clone(), vc.clone()
        out, lse = flashcore.flash_attn_with_kvcache(q, kp, vp, k, v, **kw)
        runs.append((out, lse, kp, vp))
    (og, lg, kg, vg), (ok, lk, kk, vk) = runs
    # Bitwise (the unused rows hold NaN, which torch.equal never calls equal).
    same_k = torch.equal(kg.view(torch.int16), kk.view(torch.int16))
    assert same_k and torch.equal(vg.view(torch.int16), vk.view(torch.int16)), "the append differs"
    assert not torch.isnan(ok).any()
    assert torch.equal(ok, og), "out bits differ from the gathered path's"
    assert torch.equal(lk, lg), "LSE bits differ from the gathered path's"


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_chunked_prefill_left_padding(dtype):
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    b, cap, hq, hkv, d, n = 2, 512, 8, 2, 64, 40
    kc = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    vc = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    q = torch.randn(b, n, hq, d, device="cuda", generator=gen).to(dtype)
    counts, pads = [100, 300], [7, 250]
    seqlens = torch.tensor(counts, dtype=torch.int32, device="cuda")
    pad = torch.tensor(pads, dtype=torch.int32, device="cuda")
    out = flashcore.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, cache_leftpad=pad, causal=True)
    for i in range(b):
        want = ref_rows(q[i], kc[i, :counts[i]], vc[i, :counts[i]], True, start=pads[i])
        assert rel_l2(out[i], want) <= TOL[dtype]


def test_chunked_prefill_under_compile_and_graphs_same_bits():
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    dtype, b, cap, hq, hkv, d = torch.bfloat16, 2, 1024, 8, 2, 128
    kc0 = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    vc0 = torch.randn(b, cap, hkv, d, device="cuda", generator=gen).to(dtype)
    q = torch.randn(b, 64, hq, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, 64, hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, 64, hkv, d, device="cuda", generator=gen).to(dtype)
    seqlens = torch.tensor([5, 900], dtype=torch.int32, device="cuda")

    def step(q, kc, vc, k, v, seqlens):
        return flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True)

    kc, vc = kc0.clone(), vc0.clone()
    eager = step(q, kc, vc, k, v, seqlens)
    kc2, vc2 = kc0.clone(), vc0.clone()
    compiled = torch.compile(step, fullgraph=True)(q, kc2, vc2, k, v, seqlens)
    assert torch.equal(eager, compiled) and torch.equal(kc, kc2) and torch.equal(vc, vc2)
    kc3, vc3 = kc0.clone(), vc0.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(q, kc3, vc3, k, v, seqlens)  # warm-up on the capture's side stream (loads the kernel)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed = step(q, kc3, vc3, k, v, seqlens)
    kc3.copy_(kc0)
    vc3.copy_(vc0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, graphed) and torch.equal(kc, kc3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sq", [1, 4, 40])
@pytest.mark.parametrize("page", [0, 16, 128])
@pytest.mark.parametrize("secret", [False, True])
def test_unused_cache_rows_holding_nan_and_inf_do_not_reach_the_output(dtype, sq, page, secret):
    """A cache whose unused rows (past each count, inside the capacity) hold NaN and ±Inf bits —
    torch.empty's or a freed page's — gives the reference output: the kernels multiply those V
    rows by P = 0, so they must never reach P V (0 · NaN = NaN). Decode (Sq ≤ 16) and chunked
    prefill (Sq = 40), contiguous and paged, public and secret counts."""
    if secret and sq > 16:
        pytest.skip("chunked prefill takes no secret lengths")
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    b, cap, hq, hkv, d = 4, 512, 8, 2, 128
    counts = [0, 1, 200, cap - sq]
    bad = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype, device="cuda")
    fill = bad[torch.arange(cap, device="cuda") % 3][None, :, None, None].expand(b, cap, hkv, d)
    kc, vc = fill.clone(), fill.clone()
    for i, n in enumerate(counts):
        kc[i, :n] = torch.randn(n, hkv, d, device="cuda", generator=gen).to(dtype)
        vc[i, :n] = torch.randn(n, hkv, d, device="cuda", generator=gen).to(dtype)
    q = torch.randn(b, sq, hq, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(b, sq, hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(b, sq, hkv, d, device="cuda", generator=gen).to(dtype)
    seqlens = torch.tensor(counts, dtype=torch.int32, device="cuda")
    kw = dict(cache_seqlens=seqlens, causal=True)
    if secret:
        kw["secret_lengths"] = True
    kp, vp = kc, vc
    if page:
        kp, table = paged(kc, page, torch.Generator().manual_seed(5))
        vp, _ = paged(vc, page, torch.Generator().manual_seed(5))
        kw["block_table"] = table
    out = flashcore.flash_attn_with_kvcache(q, kp, vp, k, v, **kw)
    assert torch.isfinite(out).all(), "non-finite output from unused cache rows"
    after_k, after_v = (kp, vp) if not page else (unpage(kp, table), unpage(vp, table))
    for i, n in enumerate(counts):
        want = ref_rows(q[i], after_k[i, :n + sq], after_v[i, :n + sq], True)
        assert rel_l2(out[i], want) <= TOL[dtype], (i, rel_l2(out[i], want))
