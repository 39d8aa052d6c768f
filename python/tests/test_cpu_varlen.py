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
    # Varlen trains through a window, softcap and sinks too, at every head dim: these calls pass the grad checks and stop at the op's device check (CPU here).
    with pytest.raises(ValueError, match="CUDA"):
        flashcore.flash_attn_varlen_func(q.clone().requires_grad_(), k, v, cq, ck, 5, 6, causal=True,
                                         window_size=(2, 0), softcap=5.0)
    for d in (96, 256):
        with pytest.raises(ValueError, match="CUDA"):
            qd, kd = _pack(d=d, device="cpu")[:2]
            flashcore.flash_attn_varlen_func(qd.requires_grad_(), kd, kd, cq, ck, 5, 6)


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


def test_secret_lengths_checks_name_the_argument():
    """flash_attn_varlen_func(..., secret_lengths=): every refusal before any device work."""
    q, k, v = _pack(tq=8, tk=8)
    cu = _cu([0, 3, 8])
    lens = _cu([1, 5])
    f = flashcore.flash_attn_varlen_func
    assert varlen._check_secret_len(q, k, v, cu, cu, 5, 5, None, None, lens) == 2
    with pytest.raises(ValueError, match="same cu_seqlens tensor"):
        f(q, k, v, cu, _cu([0, 3, 8]), 5, 5, secret_lengths=lens)
    with pytest.raises(ValueError, match="max_seqlen_q == max_seqlen_k"):
        f(q, k, v, cu, cu, 5, 6, secret_lengths=lens)
    for kw in ({"seqused_k": _cu([1, 2])}, {"seqused_q": _cu([1, 2])}):
        with pytest.raises(ValueError, match="cannot be combined with " + next(iter(kw))):
            f(q, k, v, cu, cu, 5, 5, secret_lengths=lens, **kw)
    k10, v10 = _pack(tq=8, tk=10)[1:]
    with pytest.raises(ValueError, match="k holds 10 tokens"):
        f(q, k10, v10, cu, cu, 5, 5, secret_lengths=lens)
    with pytest.raises(TypeError, match="secret_lengths.*int32"):
        f(q, k, v, cu, cu, 5, 5, secret_lengths=lens.long())
    with pytest.raises(ValueError, match=r"secret_lengths.*shape \(2,\)"):
        f(q, k, v, cu, cu, 5, 5, secret_lengths=_cu([1, 2, 3]))
    with pytest.raises(TypeError, match="secret_lengths.*torch.Tensor"):
        f(q, k, v, cu, cu, 5, 5, secret_lengths=[1, 5])
    with pytest.raises(ValueError, match="secret_lengths.*on cpu"):
        f(q, k, v, cu, cu, 5, 5, secret_lengths=_cu([1, 5], "cpu"))
    with pytest.raises(ValueError, match="head dim 80"):
        qd, kd, vd = _pack(tq=8, tk=8, d=80)
        f(qd, kd, vd, cu, cu, 5, 5, secret_lengths=lens)
    for kw in ({"window_size": (2, 2)}, {"softcap": 30.0}, {"learnable_sink": torch.zeros(q.shape[1], device=q.device)}):
        with pytest.raises(ValueError, match="not supported with secret_lengths"):
            f(q, k, v, cu, cu, 5, 5, secret_lengths=lens, **kw)
    qc, kc, vc = _pack(tq=8, tk=8, device="cpu")
    with pytest.raises(RuntimeError, match="requires grad"):
        f(qc.float().requires_grad_(), kc, vc, _cu([0, 3, 8], "cpu"), _cu([0, 3, 8], "cpu"), 5, 5,
          secret_lengths=_cu([1, 5], "cpu"))


@pytest.mark.parametrize("slots,lens,s", [([33, 7, 60], [33, 2, 59], 60), ([1, 0, 0, 17, 5, 0], [1, 0, 0, 3, 5, 0], 20)])
def test_secret_lengths_gather_and_scatter(monkeypatch, slots, lens, s):
    """The slots' gather into the dense batch and the rows' way back, on the CPU, with a dense
    call that is exact (an elementwise max of q, k, v on rows below each length, zero past it):
    every row of a sequence lands where it came from, rows past a length read 0 / -inf, with
    empty slots and max_seqlen past the longest slot."""
    import flashcore.api

    def dense(q, k, v, *, causal, scale, layout, return_lse, secret_lengths):
        m = torch.arange(q.shape[1])[None, :, None, None] < secret_lengths.long()[:, None, None, None]
        o = torch.where(m, torch.maximum(torch.maximum(q, k), v), torch.zeros((), dtype=q.dtype))
        lse = torch.where(m[..., 0].transpose(1, 2), q[..., 0].float().transpose(1, 2), float("-inf"))
        return (o, lse) if return_lse else o

    monkeypatch.setattr(flashcore.api, "attention", dense)
    monkeypatch.setattr(varlen, "_check_secret_len", lambda q, k, v, cu, *a: cu.shape[0] - 1)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(sum(slots), 2, 64, generator=g).half() for _ in range(3))
    cu = _cu([0] + torch.tensor(slots).cumsum(0).tolist(), "cpu")
    out, lse = varlen._secret_len_varlen(q, k, v, cu, cu, s, s, None, None, _cu(lens, "cpu"), True, None, True)
    want = torch.maximum(torch.maximum(q, k), v)
    s0 = 0
    for n, l in zip(slots, lens):
        assert torch.equal(out[s0:s0 + l], want[s0:s0 + l])
        assert (out[s0 + l:s0 + n] == 0).all()
        assert torch.equal(lse[:, s0:s0 + l], q[s0:s0 + l, :, 0].float().T)
        assert torch.isneginf(lse[:, s0 + l:s0 + n]).all()
        s0 += n
