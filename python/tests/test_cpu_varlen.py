"""flash_attn_varlen_func's checks and flashcore.hf's padded-mask analysis, without a GPU."""

import pytest
import torch

import flashcore
import flashcore.hf
from flashcore import varlen


def _pack(tq=8, tk=10, hq=4, hkv=2, d=64, device="meta"):
    return (torch.empty(tq, hq, d, dtype=torch.float16, device=device),
            torch.empty(tk, hkv, d, dtype=torch.float16, device=device),
            torch.empty(tk, hkv, d, dtype=torch.float16, device=device))


def _cu(vals, device="meta"):
    return torch.tensor(vals, dtype=torch.int32).to(device)


def test_shape_checks_name_the_argument():
    q, k, v = _pack()
    cq, ck = _cu([0, 3, 8]), _cu([0, 4, 10])
    assert varlen._check(q, k, v, cq, ck, None, 5, 6) == (2, 4, 2, 64)
    with pytest.raises(TypeError, match="cu_seqlens_q.*int32"):
        varlen._check(q, k, v, cq.long(), ck, None, 5, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k.*shape"):
        varlen._check(q, k, v, cq, ck[:2], None, 5, 6)
    with pytest.raises(ValueError, match="seqused_q"):
        varlen._check(q, k, v, cq, ck, None, 5, 6, _cu([1, 2, 3]))
    with pytest.raises(ValueError, match="heads_q"):
        varlen._check(q[:, :3], k, v, cq, ck, None, 5, 6)
    with pytest.raises(ValueError, match="head dim 80"):
        varlen._check(*_pack(d=80), cq, ck, None, 5, 6)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        varlen._check(q, k, v, cq, ck, None, 5, True)
    with pytest.raises(ValueError, match="CUDA"):
        varlen._check(*_pack(device="cpu"), _cu([0, 3, 8], "cpu"), _cu([0, 4, 10], "cpu"), None, 5, 6)


def test_unsupported_arguments_and_grad_raise():
    q, k, v = _pack(device="cpu")
    cq, ck = _cu([0, 3, 8], "cpu"), _cu([0, 4, 10], "cpu")
    for kw in ({"dropout_p": 0.1}, {"alibi_slopes": torch.zeros(4)}, {"block_table": cq}):
        with pytest.raises(ValueError, match="does not support"):
            flashcore.flash_attn_varlen_func(q, k, v, cq, ck, 5, 6, **kw)
    with pytest.raises(RuntimeError, match="requires grad"):
        flashcore.flash_attn_varlen_func(q.float().requires_grad_(), k, v, cq, ck, 5, 6)


def test_check_cu_seqlens():
    varlen.check_cu_seqlens(_cu([0, 3, 8], "cpu"), 8, 5)
    for bad, why in (([0, 5, 3], "non-decreasing"), ([0, 3, 7], "ends at 7"), ([1, 3, 8], "start at 0"),
                     ([0, 1, 8], "more than 5")):
        with pytest.raises(ValueError, match=why):
            varlen.check_cu_seqlens(_cu(bad, "cpu"), 8, 5)


def _mask(lens, s, side, causal):
    b = len(lens)
    m = torch.zeros(b, 1, s, s, dtype=torch.bool)
    for i, n in enumerate(lens):
        lo, hi = (s - n, s) if side == "left" else (0, n)
        rows = torch.arange(s)[:, None]
        cols = torch.arange(s)[None, :]
        vis = ((cols >= lo) & (cols < hi)).expand(s, s)
        if causal:
            vis = vis & (cols <= rows)
        if side == "left":
            vis = vis & (rows >= lo)  # transformers' left-padding rows of padding see nothing
        m[i, 0] = vis
    return m


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("causal", [True, False])
def test_padded_masks_are_recognised(side, causal):
    s, lens = 20, [20, 13, 1]
    m = _mask(lens, s, side, causal)
    q = torch.empty(3, 4, s, 64)
    start, used, c, windowed = flashcore.hf.padded_prefill_of(m, q, q)
    assert used.tolist() == lens and c == causal and not windowed
    assert start.tolist() == ([s - n for n in lens] if side == "left" else [0, 0, 0])


def test_other_masks_are_not():
    s = 20
    q = torch.empty(2, 4, s, 64)
    rows, cols = torch.arange(s)[:, None], torch.arange(s)[None, :]
    window = ((cols <= rows) & (cols > rows - 8)).expand(2, 1, s, s)
    assert flashcore.hf.padded_prefill_of(window, q, q) is None
    holes = _mask([20, 10], s, "right", True)
    holes[0, 0, 15:, 3] = False
    assert flashcore.hf.padded_prefill_of(holes, q, q) is None
    kv = torch.empty(2, 4, s + 1, 64)
    assert flashcore.hf.padded_prefill_of(_mask([20, 10], s, "right", True), q, kv) is None
