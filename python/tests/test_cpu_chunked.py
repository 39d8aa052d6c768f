"""Chunked prefill over a KV cache (flashcore.chunked) without a GPU: the append's
semantics on CPU tensors (dense, packed, paged, rows past the capacity), the shapes the path
returns under FakeTensorMode, and every argument error."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashcore
from flashcore import chunked

BF16 = torch.bfloat16


@pytest.fixture
def fake():
    with FakeTensorMode() as mode:
        yield mode


def cuda(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="cuda")


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


# --- the append ------------------------------------------------------------------------------


def test_append_dense_rows_at_each_count():
    kc, vc = torch.randn(3, 40, 2, 8), torch.randn(3, 40, 2, 8)
    k, v = torch.randn(3, 20, 2, 8), torch.randn(3, 20, 2, 8)
    want_k, want_v = kc.clone(), vc.clone()
    lens = i32([0, 5, 20])
    for b, n in enumerate(lens.tolist()):
        want_k[b, n:n + 20], want_v[b, n:n + 20] = k[b], v[b]
    after = chunked.append(kc, vc, k, v, lens, None, None, 40)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert after.dtype == torch.int32 and after.tolist() == [20, 25, 40]


def test_append_packed_rows_by_cu_seqlens():
    kc, vc = torch.randn(3, 30, 1, 4), torch.randn(3, 30, 1, 4)
    new = [17, 0, 5]
    cu = i32([0, 17, 17, 22])
    k, v = torch.randn(22, 1, 4), torch.randn(22, 1, 4)
    lens = i32([3, 9, 25])
    want_k, want_v = kc.clone(), vc.clone()
    t = 0
    for b, n in enumerate(new):
        c = lens[b].item()
        want_k[b, c:c + n], want_v[b, c:c + n] = k[t:t + n], v[t:t + n]
        t += n
    after = chunked.append(kc, vc, k, v, lens, None, cu, 30)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert after.tolist() == [20, 9, 30]


def test_append_paged_through_the_table():
    pool_k, pool_v = torch.randn(8, 16, 2, 4), torch.randn(8, 16, 2, 4)
    table = i32([[7, 2, 5], [0, 6, 1]])  # 2 sequences of 3 pages of 16 rows
    cu = i32([0, 20, 40])
    k, v = torch.randn(40, 2, 4), torch.randn(40, 2, 4)
    lens = i32([10, 0])  # sequence 0 runs from page 7 into page 2 and page 5
    want_k, want_v = pool_k.clone(), pool_v.clone()
    for b in range(2):
        for i in range(20):
            r = lens[b].item() + i
            page = table[b, r // 16].item()
            want_k[page, r % 16], want_v[page, r % 16] = k[20 * b + i], v[20 * b + i]
    after = chunked.append(pool_k, pool_v, k, v, lens, table, cu, 48)
    assert torch.equal(pool_k, want_k) and torch.equal(pool_v, want_v)
    assert after.tolist() == [30, 20]


def test_append_drops_rows_past_the_capacity():
    kc, vc = torch.randn(2, 10, 1, 4), torch.randn(2, 10, 1, 4)
    k, v = torch.randn(2, 4, 1, 4), torch.randn(2, 4, 1, 4)
    want_k = kc.clone()
    want_k[0, 8:10] = k[0, :2]  # rows 10 and 11 of sequence 0 do not exist: not written
    want_k[1, 0:4] = k[1]
    chunked.append(kc, vc, k, v, i32([8, 0]), None, None, 10)
    assert torch.equal(kc, want_k)
    # A full sequence (no new row fits: its last row keeps its value) and packed rows past
    # cu_seqlens_k_new's end (no sequence's: not written).
    cu = i32([0, 3, 5])
    kp, vp = torch.randn(7, 1, 4), torch.randn(7, 1, 4)
    want_k[1, 4:6] = kp[3:5]
    after = chunked.append(kc, vc, kp, vp, i32([10, 4]), None, cu, 10)
    assert torch.equal(kc, want_k) and after.tolist() == [13, 6]


# --- shapes under fake tensors ---------------------------------------------------------------


def test_dense_chunk_shapes(fake):
    q = cuda(2, 100, 8, 64)
    kc, vc = cuda(2, 512, 2, 64), cuda(2, 512, 2, 64)
    k, v = cuda(2, 100, 2, 64), cuda(2, 100, 2, 64)
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    out, lse = flashcore.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True,
                                                 return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
    # 17 positions: one past the decode kernels' limit.
    assert flashcore.flash_attn_with_kvcache(cuda(2, 17, 8, 64), kc, vc, cache_seqlens=3).shape == (2, 17, 8, 64)


def _packed_paged_chunk(page):
    """A packed chunked call over a pool of `page`-row pages: its output shapes."""
    q = cuda(300, 16, 128)
    pool = cuda(40, page, 4, 128)
    table = torch.zeros(3, 8, dtype=torch.int32, device="cuda")
    cu = torch.zeros(4, dtype=torch.int32, device="cuda")
    lens = torch.zeros(3, dtype=torch.int32, device="cuda")
    k = cuda(300, 4, 128)
    out, lse = flashcore.flash_attn_with_kvcache(q, pool, pool, k, k, cache_seqlens=lens, block_table=table,
                                                 cu_seqlens_q=cu, max_seqlen_q=200, causal=True,
                                                 return_softmax_lse=True, cache_leftpad=lens)
    assert out.shape == q.shape and lse.shape == (16, 300)
    return pool, table, lens


def test_packed_and_paged_chunk_shapes(fake):
    _packed_paged_chunk(64)


def test_paged_chunk_read_in_the_kernel_copies_nothing(fake, monkeypatch):
    """With FLASHCORE_PAGED_PREFILL=kernel the pages go to the kernel through the block table
    (torch.ops.flashcore.chunked_paged): no gathered copy, the same output shapes."""
    monkeypatch.setenv("FLASHCORE_PAGED_PREFILL", "kernel")

    def no_gather(*_):
        raise AssertionError("the pool was gathered into a copy")

    monkeypatch.setattr(chunked, "_gathered", no_gather)
    pool, table, lens = _packed_paged_chunk(7)  # 7-row pages: the kernel gathers rows itself
    dense = flashcore.flash_attn_with_kvcache(cuda(3, 40, 16, 128), pool, pool, cache_seqlens=lens,
                                              block_table=table, causal=True)
    assert dense.shape == (3, 40, 16, 128)


def test_paged_read_rule_and_its_knob(monkeypatch):
    """Unset, the kernel reads pages of 64 rows or more, and any page at head dims up to 64;
    shorter pages at larger heads are gathered. FLASHCORE_PAGED_PREFILL forces either read."""
    monkeypatch.delenv("FLASHCORE_PAGED_PREFILL", raising=False)
    assert chunked._paged_in_kernel(64, 128) and chunked._paged_in_kernel(256, 256)
    assert chunked._paged_in_kernel(1, 64) and chunked._paged_in_kernel(16, 64)
    assert not chunked._paged_in_kernel(16, 128) and not chunked._paged_in_kernel(1, 256)
    monkeypatch.setenv("FLASHCORE_PAGED_PREFILL", "kernel")
    assert chunked._paged_in_kernel(1, 128)
    monkeypatch.setenv("FLASHCORE_PAGED_PREFILL", " gather ")
    assert not chunked._paged_in_kernel(256, 64)
    monkeypatch.setenv("FLASHCORE_PAGED_PREFILL", "other")
    assert not chunked._paged_in_kernel(16, 128) and chunked._paged_in_kernel(64, 128)


def test_paged_chunk_of_short_pages_at_d128_is_gathered(fake, monkeypatch):
    """The default rule at head dim 128 and 7-row pages: the pool is gathered into a copy."""
    monkeypatch.delenv("FLASHCORE_PAGED_PREFILL", raising=False)
    seen = []
    real = chunked._gathered

    def spy(cache, table):
        seen.append(cache.shape)
        return real(cache, table)

    monkeypatch.setattr(chunked, "_gathered", spy)
    _packed_paged_chunk(7)
    assert seen, "the 7-row pool at d128 was not gathered"


# --- errors ----------------------------------------------------------------------------------


def test_chunk_errors(fake):
    q, kc = cuda(2, 20, 8, 64), cuda(2, 100, 8, 64)
    lens = torch.zeros(2, dtype=torch.int32, device="cuda")
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    packed = cuda(40, 8, 64)
    with pytest.raises(ValueError, match="secret_lengths is not offered with chunked prefill"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, secret_lengths=True)
    with pytest.raises(ValueError, match="go with cu_seqlens_q"):
        flashcore.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=lens, max_seqlen_q=1)
    with pytest.raises(ValueError, match="cu_seqlens_k_new given without new k"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=20,
                                          cu_seqlens_k_new=cu)
    with pytest.raises(ValueError, match="q must be \\[total_q, Hq, D\\]"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=20)
    with pytest.raises(ValueError, match="max_seqlen_q must be a non-negative int"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=None)
    with pytest.raises(TypeError, match="cu_seqlens_q` must be int32"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, cache_seqlens=lens, cu_seqlens_q=cu.long(), max_seqlen_q=20)
    with pytest.raises(ValueError, match="k_cache holds 2 sequences, q 3"):
        flashcore.flash_attn_with_kvcache(cuda(3, 20, 8, 64), kc, kc, cache_seqlens=3)
    with pytest.raises(ValueError, match="k_cache and v_cache must be"):
        flashcore.flash_attn_with_kvcache(q, kc, cuda(2, 99, 8, 64), cache_seqlens=lens)
    with pytest.raises(ValueError, match="cache_seqlens must have shape \\(2,\\)"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="cache_seqlens must be an int or an int32 tensor"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens.long())
    with pytest.raises(ValueError, match="needs cache_seqlens"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cuda(2, 20, 8, 64), cuda(2, 20, 8, 64))
    with pytest.raises(ValueError, match="`k` must be \\[B, n, Hkv, D\\]"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cuda(3, 20, 8, 64), cuda(3, 20, 8, 64), cache_seqlens=lens)
    with pytest.raises(ValueError, match="`v` must be \\[B, n, Hkv, D\\]"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cuda(2, 20, 8, 64), cuda(2, 20, 8, 64, dtype=torch.float16),
                                          cache_seqlens=lens)
    with pytest.raises(ValueError, match="cache_leftpad must be int32 of shape"):
        flashcore.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, cache_leftpad=lens.long())
    with pytest.raises(ValueError, match="`k` must be \\[total_new, Hkv, D\\]"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, cuda(40, 4, 64), cuda(40, 4, 64), cache_seqlens=lens,
                                          cu_seqlens_q=cu, max_seqlen_q=20)
    with pytest.raises(ValueError, match="v must have k's shape"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, packed, packed[:39], cache_seqlens=lens, cu_seqlens_q=cu,
                                          max_seqlen_q=20)
    with pytest.raises(ValueError, match="cu_seqlens_k_new must have shape \\(3,\\)"):
        flashcore.flash_attn_with_kvcache(packed, kc, kc, packed, packed, cache_seqlens=lens, cu_seqlens_q=cu,
                                          max_seqlen_q=20, cu_seqlens_k_new=torch.zeros(4, dtype=torch.int32,
                                                                                        device="cuda"))
    table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="block_table must be an int32"):
        flashcore.flash_attn_with_kvcache(q, cuda(8, 16, 8, 64), cuda(8, 16, 8, 64), cache_seqlens=lens,
                                          block_table=table.long())
    with pytest.raises(ValueError, match="block_table must be \\[B, max_pages\\]"):
        flashcore.flash_attn_with_kvcache(q, cuda(8, 16, 8, 64), cuda(8, 16, 8, 64), cache_seqlens=lens,
                                          block_table=table[:1])
    with pytest.raises(ValueError, match="page size must be at least 1 row"):
        flashcore.flash_attn_with_kvcache(q, cuda(8, 0, 8, 64), cuda(8, 0, 8, 64), cache_seqlens=lens,
                                          block_table=table)
