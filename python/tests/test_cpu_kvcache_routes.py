"""Every route a ``flash_attn_with_kvcache`` decode call can take — the one-pass path, the checked
path in eager mode, the custom op (what torch.compile and CUDA graphs see) — launches the same
native call, leaves the same cache contents, and raises the same error, over a corpus of calls
(contiguous and paged caches, new rows or none, left padding, secret counts, the prefill-consistent
mode, windows, softcaps, sinks, caches not readable in place, and bad arguments of every kind).
No GPU: CPU tensors pose as device 0's and every native call is recorded instead of run."""

import hashlib
import inspect

import pytest
import torch

import flashcore
from flashcore import _launch, kvcache
from test_cpu_decode_fast import as_attention

BF = torch.bfloat16


def _native_signature(device, stream, dtype, shape, causal, scale, q, k, v, out, lse=0, lengths=0, workspace=0,
                      kv_lengths=0, kv_secret=False, block_table=0, page_size=0, num_pages=0,
                      kv_prefill_consistent=False, kv_starts=0, window=(-1, -1), softcap=0.0, sinks=0, append=None, tile_counter=0):
    """`_native.attention`'s signature (python/src/lib.rs)."""


class Recorder:
    """Native calls with each address named by the input tensor it falls in ("fresh" for a new
    output), so calls from different routes compare."""

    def __init__(self, scratch):
        self.scratch, self.named, self.calls = scratch, {}, []
        self.sig = inspect.signature(_native_signature)

    def name(self, p):
        if p == 0:
            return 0
        for n, t in list(self.named.items()) + [("scratch", self.scratch)]:
            base = t.untyped_storage().data_ptr()
            if base <= p < base + t.untyped_storage().nbytes():
                return f"{n}+{p - base}"
        return "fresh"

    def __call__(self, *a, **kw):
        b = self.sig.bind(*a, **kw)
        b.apply_defaults()
        d = dict(b.arguments)
        for key in ("q", "k", "v", "out"):
            d[key] = (self.name(d[key][0]), tuple(d[key][1]))
        for key in ("lse", "lengths", "workspace", "kv_lengths", "block_table", "kv_starts", "sinks"):
            d[key] = self.name(d[key])
        if d["append"] is not None:
            kd, vd, rows, cnt = d["append"]
            d["append"] = ((self.name(kd[0]), tuple(kd[1])), (self.name(vd[0]), tuple(vd[1])), rows, self.name(cnt))
        d["window"] = tuple(d["window"])
        # The dynamic tile order's counter (long causal prefill only): recorded when passed, so
        # the records of every other call keep their pinned form.
        if d["tile_counter"] == 0:
            del d["tile_counter"]
        else:
            d["tile_counter"] = "counter"
        self.calls.append(d)


@pytest.fixture
def recorder(monkeypatch):
    scratch = torch.zeros(1 << 22, dtype=torch.uint8)
    rec = Recorder(scratch)
    real_check = flashcore._checks.check_tensor

    def check_tensor(name, t):  # CPU tensors pass the checked path's device rule
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = torch.empty(t.shape, dtype=t.dtype, device="meta")
            if t.dim() != 4 or t.dtype not in flashcore._checks.SUPPORTED_DTYPES:
                real_check(name, t)
            return
        real_check(name, t)

    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    # ... and as CUDA tensors to every other rule (the fused append's readiness of new rows).
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(flashcore._checks, "check_tensor", check_tensor)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(_launch, "_workspace", lambda n, dev, stream: scratch)
    monkeypatch.setattr(_launch._native, "attention", rec)
    monkeypatch.setattr(_launch._native, "attention_kv", as_attention(rec))
    return rec


def _inputs(rec, b=2, sq=1, hq=8, hkv=2, d=128, cap=64, n=1, pad=0, paged=False, qkv=False, q_strides=None):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).to(BF)

    q = r(b, sq, hq, d)
    if q_strides is not None:  # q's own elements under other strides (those of its extent-1 dims)
        q = q.as_strided(q.shape, q_strides)
    new = dict(k=r(b, n, hkv, d), v=r(b, n, hkv, d))
    if qkv:  # q and the new rows as views of one fused projection [B, Sq, Hq + 2·Hkv, D]
        fused = r(b, sq, hq + 2 * hkv, d)
        q, new = fused[:, :, :hq], dict(k=fused[:, :, hq:hq + hkv], v=fused[:, :, hq + hkv:])
    if paged:
        kc, vc = r(8, 16, hkv, d), r(8, 16, hkv, d)
    else:  # `pad`: rows of d + pad elements, so that a cache may not be readable in place
        kc, vc = r(b, cap, hkv, d + pad)[..., :d], r(b, cap, hkv, d + pad)[..., :d]
    t = dict(q=q, kc=kc, vc=vc, k=new["k"], v=new["v"], lens=torch.tensor([3, 7][:b], dtype=torch.int32),
             table=torch.tensor([[5, 1, 7, 0], [2, 6, 3, 4]][:b], dtype=torch.int32),
             leftpad=torch.tensor([1, 2][:b], dtype=torch.int32), sink=torch.zeros(hq, dtype=BF))
    rec.named.clear()
    rec.named.update(t)
    return t


Z = torch.zeros
I32 = torch.int32
CASES = [
    ("plain", {}, dict(cache_seqlens="lens")),
    ("plain causal lse", {}, dict(cache_seqlens="lens", causal=True, return_softmax_lse=True)),
    ("append", {}, dict(k="k", v="v", cache_seqlens="lens", softmax_scale=0.3)),
    ("append causal lse", {}, dict(k="k", v="v", cache_seqlens="lens", causal=True, return_softmax_lse=True)),
    ("append 3 rows", dict(sq=3, n=3), dict(k="k", v="v", cache_seqlens="lens", causal=True)),
    ("split capacity", dict(cap=8192), dict(k="k", v="v", cache_seqlens="lens", causal=True)),
    ("mha d64", dict(hq=4, hkv=4, d=64), dict(k="k", v="v", cache_seqlens="lens")),
    ("counts int", {}, dict(cache_seqlens=5)),
    ("counts none", {}, {}),
    ("append counts int", {}, dict(k="k", v="v", cache_seqlens=5)),
    ("paged", dict(paged=True), dict(cache_seqlens="lens", block_table="table", causal=True)),
    ("paged append", dict(paged=True), dict(k="k", v="v", cache_seqlens="lens", block_table="table",
                                            return_softmax_lse=True)),
    ("paged full", dict(paged=True), dict(block_table="table")),
    ("leftpad", {}, dict(cache_seqlens="lens", cache_leftpad="leftpad")),
    ("leftpad append", {}, dict(k="k", v="v", cache_seqlens="lens", cache_leftpad="leftpad")),
    ("secret", {}, dict(cache_seqlens="lens", secret_lengths=True)),
    ("secret append", {}, dict(k="k", v="v", cache_seqlens="lens", secret_lengths=True)),
    ("prefill-consistent", {}, dict(cache_seqlens="lens", num_splits=1, causal=True)),
    ("prefill-consistent append", {}, dict(k="k", v="v", cache_seqlens="lens", num_splits=1, causal=True)),
    ("window", {}, dict(cache_seqlens="lens", window_size=(4, 0))),
    ("window list append", {}, dict(k="k", v="v", cache_seqlens="lens", window_size=[4, 0], causal=True)),
    ("no window as a list", {}, dict(k="k", v="v", cache_seqlens="lens", window_size=[-1, -1])),
    ("no window as a new tuple", {}, dict(k="k", v="v", cache_seqlens="lens", window_size=tuple([-1, -1]))),
    ("fused projection", dict(qkv=True, sq=2, n=2), dict(k="k", v="v", cache_seqlens="lens", causal=True)),
    ("fused projection lse", dict(qkv=True), dict(k="k", v="v", cache_seqlens="lens", return_softmax_lse=True)),
    ("q extent-1 strides", dict(b=1, q_strides=(8 * 999, 8 * 777, 128, 1)), dict(k="k", v="v", cache_seqlens="lens")),
    ("q extent-1 strides plain", dict(b=1, q_strides=(8 * 999, 8 * 777, 128, 1)), dict(cache_seqlens="lens")),
    ("q strides b1 contiguous", dict(b=1), dict(k="k", v="v", cache_seqlens="lens", causal=True)),
    ("softcap", {}, dict(k="k", v="v", cache_seqlens="lens", softcap=2.0)),
    ("sink bf16", {}, dict(k="k", v="v", cache_seqlens="lens", learnable_sink="sink")),
    ("caches not in place", dict(pad=4), dict(cache_seqlens="lens")),
    ("caches not in place append", dict(pad=4), dict(k="k", v="v", cache_seqlens="lens")),
    ("e scale", {}, dict(k="k", v="v", cache_seqlens="lens", softmax_scale=-1.0)),
    ("e scale inf", {}, dict(cache_seqlens="lens", softmax_scale=float("inf"))),
    ("e splits", {}, dict(cache_seqlens="lens", num_splits=2)),
    ("e splits bool", {}, dict(cache_seqlens="lens", num_splits=True)),
    ("e softcap bool", {}, dict(cache_seqlens="lens", softcap=False)),
    ("e softcap negative", {}, dict(cache_seqlens="lens", softcap=-1.0)),
    ("e window float", {}, dict(cache_seqlens="lens", window_size=(-1.0, -1))),
    ("e window below -1", {}, dict(cache_seqlens="lens", window_size=(-2, 0))),
    ("e window not a pair", {}, dict(cache_seqlens="lens", window_size=3)),
    ("e counts shape", {}, dict(cache_seqlens=Z(3, dtype=I32))),
    ("e counts dtype", {}, dict(cache_seqlens=Z(2, dtype=torch.int64))),
    ("e counts list", {}, dict(cache_seqlens=[1, 2])),
    ("e new heads", {}, dict(k=Z(2, 1, 4, 128, dtype=BF), v=Z(2, 1, 4, 128, dtype=BF), cache_seqlens="lens")),
    ("e v shape", {}, dict(k="k", v=Z(2, 2, 2, 128, dtype=BF), cache_seqlens="lens")),
    ("e k dtype", {}, dict(k=Z(2, 1, 2, 128, dtype=torch.float16), v="v", cache_seqlens="lens")),
    ("e v only", {}, dict(v="v", cache_seqlens="lens")),
    ("e append without counts", {}, dict(k="k", v="v")),
    ("e rotary", {}, dict(cache_seqlens="lens", rotary_cos=Z(1))),
    ("e leftpad dtype", {}, dict(cache_seqlens="lens", cache_leftpad=Z(2))),
    ("e leftpad shape", {}, dict(cache_seqlens="lens", cache_leftpad=Z(3, dtype=I32))),
    ("e table dtype", {}, dict(cache_seqlens="lens", block_table=Z(2, 4, dtype=torch.int64))),
    ("e table shape", {}, dict(cache_seqlens="lens", block_table=Z(1, 4, dtype=I32))),
    ("e sink shape", {}, dict(cache_seqlens="lens", learnable_sink=Z(4))),
    ("e prefill-consistent window", {}, dict(cache_seqlens="lens", num_splits=1, window_size=(3, 0))),
    ("e max_seqlen_q alone", {}, dict(cache_seqlens="lens", max_seqlen_q=1)),
    ("e head dim", dict(d=80), dict(cache_seqlens="lens")),
    ("e heads", dict(hq=6, hkv=4), dict(cache_seqlens="lens")),
]


def _digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _run_case(rec, shape, kwargs):
    rec.calls.clear()
    t = _inputs(rec, **shape)
    kw = {k: (t[v] if isinstance(v, str) else v) for k, v in kwargs.items()}
    result = {}
    try:
        with torch.inference_mode():
            r = flashcore.flash_attn_with_kvcache(t["q"], t["kc"], t["vc"], **kw)
        out = r if isinstance(r, torch.Tensor) else r[0]
        result["out"] = (tuple(out.shape), out.dtype, out.stride())
        result["lse"] = None if isinstance(r, torch.Tensor) else tuple(r[1].shape)
        result["caches"] = (_digest(t["kc"]), _digest(t["vc"]))
    except Exception as e:  # noqa: BLE001 — the error itself is what is compared
        result["error"] = (type(e), str(e))
    result["calls"] = list(rec.calls)
    return result


@pytest.mark.parametrize("label, shape, kwargs", CASES, ids=[c[0] for c in CASES])
def test_every_route_launches_the_same(recorder, monkeypatch, label, shape, kwargs):
    one_pass = _run_case(recorder, shape, kwargs)
    monkeypatch.setattr(kvcache, "decode", lambda *a: None)
    checked = _run_case(recorder, shape, kwargs)
    monkeypatch.setattr(flashcore.ops, "eager", lambda *t: False)
    op = _run_case(recorder, shape, kwargs)
    assert one_pass == checked == op
    assert ("error" in one_pass) == label.startswith("e "), one_pass.get("error")
    assert len(one_pass["calls"]) == (0 if label.startswith("e ") else 1)
