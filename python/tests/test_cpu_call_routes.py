"""Dense and varlen forward calls launch the same native calls and raise the same errors, whatever
the route (the one-pass path, the checked path in eager mode, the custom op), over a corpus of
calls: causal, windows, softcaps, sinks, scales, both layouts, GQA, secret lengths, return_lse,
strided inputs, flash-attn's and SDPA's entry points, and bad arguments of every kind. Each
case's record (native calls with addresses named by the tensors they fall in, output shapes, or
the error's type and message) is pinned by a digest taken before the call path was restructured.
No GPU: CPU tensors pose as device 0's and every native call is recorded instead of run."""

import hashlib
import inspect

import pytest
import torch

import flashcore
from flashcore import _launch, api, ops, varlen
from test_cpu_kvcache_routes import Recorder

BF, F16, I32 = torch.bfloat16, torch.float16, torch.int32


def _varlen_signature(device, stream, dtype, shape, causal, scale, q, k, v, out, totals, lse, meta, workspace,
                      window=(-1, -1), softcap=0.0, sinks=0):
    """`_native.attention_varlen`'s signature (python/src/lib.rs)."""


def _meta(t):
    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return t


@pytest.fixture
def rec(monkeypatch):
    scratch = torch.zeros(1 << 22, dtype=torch.uint8)
    r = Recorder(scratch)
    real_check = flashcore._checks.check_tensor

    def check_tensor(name, t):  # CPU tensors pass the checked path's device rule
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = _meta(t)
            if t.dim() != 4 or t.dtype not in flashcore._checks.SUPPORTED_DTYPES:
                real_check(name, t)
            return
        real_check(name, t)

    real_vcheck = varlen._check

    def vcheck(*a):  # ... and varlen's, as meta tensors (errors then name "meta" as the device)
        return real_vcheck(*[_meta(x) for x in a])

    vsig = inspect.signature(_varlen_signature)

    def attention_varlen(*a, **kw):
        b = vsig.bind(*a, **kw)
        b.apply_defaults()
        d = dict(b.arguments)
        for key in ("q", "k", "v", "out"):
            d[key] = (r.name(d[key][0]), tuple(d[key][1]))
        for key in ("lse", "workspace", "sinks"):
            d[key] = r.name(d[key])
        d["meta"] = tuple(r.name(p) for p in d["meta"])
        d["window"] = tuple(d["window"])
        d["varlen"] = True
        r.calls.append(d)

    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(flashcore._checks, "check_tensor", check_tensor)
    monkeypatch.setattr(varlen, "_check", vcheck)
    monkeypatch.setattr(_launch, "current_stream", lambda index: 1234)
    monkeypatch.setattr(varlen, "current_stream", lambda index: 1234)
    monkeypatch.setattr(_launch, "_workspace", lambda n, dev, stream: scratch)
    monkeypatch.setattr(_launch._native, "attention", r)
    monkeypatch.setattr(varlen._native, "attention_varlen", attention_varlen)
    return r


def _t(*shape, dtype=BF, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _dense(b=2, sq=16, sk=24, hq=4, hkv=2, d=64, dtype=BF, bhsd=False):
    if bhsd:
        return dict(q=_t(b, hq, sq, d, dtype=dtype), k=_t(b, hkv, sk, d, dtype=dtype, seed=1),
                    v=_t(b, hkv, sk, d, dtype=dtype, seed=2))
    return dict(q=_t(b, sq, hq, d, dtype=dtype), k=_t(b, sk, hkv, d, dtype=dtype, seed=1),
                v=_t(b, sk, hkv, d, dtype=dtype, seed=2))


def _packed(lens_q=(5, 0, 9), lens_k=(7, 3, 9), hq=4, hkv=2, d=64):
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=I32)
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=I32)
    return dict(q=_t(int(cq[-1]), hq, d), k=_t(int(ck[-1]), hkv, d, seed=1), v=_t(int(ck[-1]), hkv, d, seed=2),
                cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max(lens_q, default=0),
                max_seqlen_k=max(lens_k, default=0))


LENS = torch.tensor([16, 5], dtype=I32)
SINK = torch.linspace(-1, 1, 4)


def A(**kw):
    return ("attention", kw)


def F(**kw):
    return ("flash_attn_func", kw)


def S(**kw):
    return ("sdpa", kw)


def O(*a):
    return ("op", a)


def V(**kw):
    return ("varlen", kw)


def VO(*a):
    return ("varlen_op", a)


CASES = [
    ("plain", {}, A()),
    ("causal", {}, A(causal=True)),
    ("lse", {}, A(return_lse=True)),
    ("causal lse scale", {}, A(causal=True, return_lse=True, scale=0.3)),
    ("scale int", {}, A(scale=1)),
    ("bhsd", dict(bhsd=True), A(layout="bhsd", causal=True, return_lse=True)),
    ("mha f16", dict(hkv=4, dtype=F16), A(causal=True)),
    ("d128", dict(d=128), A()),
    ("decode", dict(sq=1), A(causal=True, return_lse=True)),
    ("decode bhsd", dict(sq=2, bhsd=True), A(layout="bhsd")),
    ("strided", dict(sq=16), A(_qview="slice")),
    ("transposed", dict(sq=16, sk=16, hq=2, hkv=2), A(_qview="transpose")),
    ("secret", dict(sk=16), A(secret_lengths=LENS, causal=True)),
    ("secret lse", dict(sk=16), A(secret_lengths=LENS, return_lse=True)),
    ("window", {}, A(window_size=(8, 0))),
    ("window list", {}, A(window_size=[4, 4], causal=True, return_lse=True)),
    ("softcap", {}, A(softcap=30.0, return_lse=True)),
    ("sinks", {}, A(learnable_sink=SINK)),
    ("sinks bf16", {}, A(learnable_sink=SINK.to(BF), causal=True)),
    ("all feats bhsd", dict(bhsd=True), A(layout="bhsd", window_size=(3, 2), softcap=5.0, learnable_sink=SINK,
                                           scale=0.2, return_lse=True)),
    ("e feats secret", dict(sk=16), A(secret_lengths=LENS, softcap=2.0)),
    ("grad", {}, A(causal=True, _grad=True)),
    ("grad feats", {}, A(window_size=(4, 0), _grad=True)),
    ("e layout", {}, A(layout="sbhd")),
    ("e scale neg", {}, A(scale=-1.0)),
    ("e scale str", {}, A(scale="x")),
    ("e head dim", dict(d=80), A()),
    ("e fp32", dict(dtype=torch.float32), A()),
    ("e groups", dict(hq=3, hkv=2), A()),
    ("e lens shape", dict(sk=16), A(secret_lengths=torch.tensor([1, 2, 3], dtype=I32))),
    ("e lens sk", {}, A(secret_lengths=LENS)),
    ("e lens dtype", dict(sk=16), A(secret_lengths=LENS.long())),
    ("e window", {}, A(window_size=(1, 2, 3))),
    ("e sink shape", {}, A(learnable_sink=torch.zeros(3))),
    ("e secret grad", dict(sk=16), A(secret_lengths=LENS, _grad=True)),
    ("e secret window", dict(sk=16), A(secret_lengths=LENS, window_size=(2, 0))),
    ("e k dtype", {}, A(_kdtype=F16)),
    ("fa plain", {}, F(causal=True)),
    ("fa feats", {}, F(window_size=(5, 1), softcap=3.0, learnable_sink=SINK, return_lse=True, softmax_scale=0.5)),
    ("fa det", {}, F(deterministic=True)),
    ("e fa dropout", {}, F(dropout_p=0.1)),
    ("e fa alibi", {}, F(alibi_slopes=torch.zeros(4))),
    ("e fa probs", {}, F(return_attn_probs=True)),
    ("sdpa", dict(bhsd=True, hkv=4), S()),
    ("sdpa causal sq>sk", dict(bhsd=True, sq=24, sk=16), S(is_causal=True, enable_gqa=True)),
    ("sdpa causal sq<sk", dict(bhsd=True), S(is_causal=True, enable_gqa=True, scale=0.4)),
    ("sdpa square", dict(bhsd=True, sq=24, sk=24, hkv=4), S(is_causal=True)),
    ("e sdpa gqa", dict(bhsd=True), S()),
    ("e sdpa mask", dict(bhsd=True, hkv=4), S(attn_mask=torch.zeros(1))),
    ("e sdpa dropout", dict(bhsd=True, hkv=4), S(dropout_p=0.5)),
    ("op", {}, O(True, None, False, True, None)),
    ("op no lse", {}, O(False, 0.25, False, False, None)),
    ("op feats", {}, O(True, None, False, True, None, 4, 0, 10.0, SINK)),
    ("op secret", dict(sk=16), O(True, None, False, False, LENS)),
    ("e op scale", {}, O(True, 0.0, False, True, None)),
    ("e op window", {}, O(True, None, False, True, None, -2, 0, 0.0, None)),
]

VCASES = [
    ("v plain", {}, V()),
    ("v causal lse", {}, V(causal=True, return_lse=True)),
    ("v probs", {}, V(return_attn_probs=True, softmax_scale=0.3)),
    ("v mha", dict(hkv=4), V(causal=True)),
    ("v window", {}, V(window_size=(3, 0), return_lse=True)),
    ("v softcap sinks", {}, V(softcap=4.0, learnable_sink=SINK, causal=True)),
    ("v seqused", {}, V(seqused_k=torch.tensor([2, 1, 9], dtype=I32), seqused_q=torch.tensor([5, 0, 3], dtype=I32),
                        return_lse=True)),
    ("v empty", dict(lens_q=(), lens_k=()), V(return_lse=True, _nocall=True)),
    ("v grad", {}, V(causal=True, _grad=True)),
    ("v secret", dict(lens_q=(4, 6), lens_k=(4, 6)), V(_secret=torch.tensor([3, 6], dtype=I32), causal=True,
                                                        return_lse=True)),
    ("e v dropout", {}, V(dropout_p=0.1)),
    ("e v alibi", {}, V(alibi_slopes=torch.zeros(4))),
    ("e v table", {}, V(block_table=torch.zeros(3, 1, dtype=I32))),
    ("e v cu dtype", {}, V(_cu_long=True)),
    ("e v max", {}, V(max_seqlen_q=-1)),
    ("e v head dim", dict(d=80), V()),
    ("e v seqused shape", {}, V(seqused_k=torch.tensor([2, 1], dtype=I32))),
    ("e v window", {}, V(window_size=(1,))),
    ("e v secret window", dict(lens_q=(4, 6), lens_k=(4, 6)), V(_secret=torch.tensor([3, 6], dtype=I32),
                                                                  softcap=1.0)),
    ("e v secret grad", dict(lens_q=(4, 6), lens_k=(4, 6)), V(_secret=torch.tensor([3, 6], dtype=I32), _grad=True)),
    ("v op", {}, VO(True, None, True, None)),
    ("v op feats", {}, VO(False, 0.5, False, None, 2, 2, 1.5, SINK)),
    ("e v op scale", {}, VO(False, -0.5, False, None)),
]


def _run(rec, kind, shape, kw):
    args = kw if isinstance(kw, tuple) else ()
    kw = {} if isinstance(kw, tuple) else dict(kw)
    kw.pop("_nocall", None)
    if kind in ("varlen", "varlen_op"):
        t = _packed(**shape)
        if kw.pop("_cu_long", False):
            t["cu_seqlens_q"] = t["cu_seqlens_q"].long()
    else:
        t = _dense(**shape)
        view = kw.pop("_qview", None)
        if view == "slice":
            t["q"] = torch.cat([t["q"], t["q"]], dim=-1)[..., :t["q"].shape[-1]]
        elif view == "transpose":
            t["q"] = t["q"].transpose(1, 2).contiguous().transpose(1, 2)
        if "_kdtype" in kw:
            t["k"] = t["k"].to(kw.pop("_kdtype"))
    if kw.pop("_grad", False):
        t["q"].requires_grad_()
    rec.named = {n: x for n, x in list(t.items()) + list(kw.items()) if isinstance(x, torch.Tensor)}
    rec.named["sink"], rec.named["lens"] = SINK, LENS
    rec.calls = []
    q, k, v = t.pop("q"), t.pop("k"), t.pop("v")
    try:
        if kind == "attention":
            r = flashcore.attention(q, k, v, **kw)
        elif kind == "flash_attn_func":
            r = flashcore.flash_attn_func(q, k, v, **kw)
        elif kind == "sdpa":
            r = flashcore.scaled_dot_product_attention(q, k, v, **kw)
        elif kind == "op":
            r = torch.ops.flashcore.attention(q, k, v, *args)
        elif kind == "varlen":
            secret = kw.pop("_secret", None)
            if secret is not None:
                t["cu_seqlens_k"] = t["cu_seqlens_q"]
                rec.named["cu_seqlens_k"] = t["cu_seqlens_q"]
                kw["secret_lengths"] = secret
                rec.named["secret"] = secret
            r = flashcore.flash_attn_varlen_func(q, k, v, **t, **kw)
        else:
            r = torch.ops.flashcore.attention_varlen(q, k, v, t["cu_seqlens_q"], t["cu_seqlens_k"], None,
                                                      t["max_seqlen_q"], t["max_seqlen_k"], *args)
    except Exception as e:  # noqa: BLE001
        return {"error": (type(e).__name__, str(e)), "calls": rec.calls}
    rs = (r,) if isinstance(r, torch.Tensor) else tuple(r)
    shapes = [None if x is None else (tuple(x.shape), str(x.dtype), x.stride()) for x in rs]
    return {"result": shapes, "calls": rec.calls}


def _routes(rec, monkeypatch, kind, shape, kw):
    runs = [_run(rec, kind, shape, kw)]
    with monkeypatch.context() as m:
        m.setattr(api, "_fast", lambda *a, **k: None)
        m.setattr(_launch, "fast", lambda *a, **k: None)
        runs.append(_run(rec, kind, shape, kw))
        m.setattr(ops, "eager", lambda *t: False)  # through the dispatcher
        runs.append(_run(rec, kind, shape, kw))
    return runs


def _digest(runs):
    return hashlib.sha256(repr(runs).encode()).hexdigest()[:16]


PINNED = {
    'plain': '96b3fbf5fd95201b',
    'causal': '49b0a9593dfe0d72',
    'lse': '1e620c348a967e5f',
    'causal lse scale': 'ee24288f772f2aba',
    'scale int': '1588429d24f9ce53',
    'bhsd': '5a89811137089271',
    'mha f16': '6b610bf19bd0f8a1',
    'd128': '5205511aab04f1f9',
    'decode': 'd7d42ea155b2facb',
    'decode bhsd': '2986fc0e2bfff754',
    'strided': '3eb74138c09e9ff2',
    'transposed': 'f400f09add9ef9ef',
    'secret': '1b35965215f31044',
    'secret lse': '151784f906ead02f',
    'window': '7a5db47e40ee5617',
    'window list': 'a608904fc2aaf04d',
    'softcap': '4ad84bdd0e6e4f26',
    'sinks': '388e879b7f2a28b0',
    'sinks bf16': 'e947dbb99a347e95',
    'all feats bhsd': '40b30eaa74a9a54a',
    'e feats secret': '6a487e0ff7d5b2b4',
    'grad': 'ec7e278f64903a09',
    'grad feats': 'ee793455e97a3888',
    'e layout': '5593a080470c664f',
    'e scale neg': '9ada10637fbfdf60',
    'e scale str': '89304d8ddaf44856',
    'e head dim': '5e0807eccc6d885c',
    'e fp32': 'abb529bf5de82484',
    'e groups': 'fbe8677ca4d27e1f',
    'e lens shape': 'cfbbb4ab29669ad0',
    'e lens sk': 'bcb7531342336ae8',
    'e lens dtype': '51da4375ad657b39',
    'e window': '598e746e9b2c08a3',
    'e sink shape': '4e7425e6bc2f6396',
    'e secret grad': '4d3dc309e9d5d0a8',
    'e secret window': '6a487e0ff7d5b2b4',
    'e k dtype': 'f435b72617162672',
    'fa plain': '49b0a9593dfe0d72',
    'fa feats': '37beb62507eaf0d5',
    'fa det': '96b3fbf5fd95201b',
    'e fa dropout': '234f2fb47e452794',
    'e fa alibi': '179a3847c064f8e4',
    'e fa probs': '742f035a90125ec9',
    'sdpa': '11b2f7ed6f4e3d2f',
    'sdpa causal sq>sk': 'd4e726c1ab14c5d9',
    'sdpa causal sq<sk': '5c5ab46eea0d6462',
    'sdpa square': 'a97f6e97ca5ddb25',
    'e sdpa gqa': 'a2da3d20c9819f91',
    'e sdpa mask': 'c64408877eb74d38',
    'e sdpa dropout': '0afeb4561dece67b',
    'op': '9dedfd7e0d7968d8',
    'op no lse': '0396dd3ed0bd4b95',
    'op feats': '05844dd9604fb932',
    'op secret': '0f9541d34a2503d4',
    'e op scale': '4eed81c324d3c4d6',
    'e op window': 'e3397017cf49cff5',
    'v plain': 'bb0cb4c197ac73f5',
    'v causal lse': '80bd598f9b02636b',
    'v probs': '5bb0ac8c66437c75',
    'v mha': 'ce47518b21ebc042',
    'v window': '764b7d9fb568e13d',
    'v softcap sinks': 'cd39a28a9c446901',
    'v seqused': '9c275acc3709d0b2',
    'v empty': 'd17f76d469f9df33',
    'v grad': '4fe92fc66d5ea24d',
    'v secret': '70cd8f4ce1123722',
    'e v dropout': '228d6b544da60884',
    'e v alibi': 'd31100b3a0fdf13a',
    'e v table': '16d565e659a0a31c',
    'e v cu dtype': '72b4882eb68257ea',
    'e v max': '094d7baf8211ac43',
    'e v head dim': '5e0807eccc6d885c',
    'e v seqused shape': '75f843b39d516346',
    'e v window': 'd43b258010c8fae8',
    'e v secret window': '6a487e0ff7d5b2b4',
    'e v secret grad': 'f13f14bacff240a9',
    'v op': '80bd598f9b02636b',
    'v op feats': 'bc05166c8b8facd4',
    'e v op scale': '1ac4ff0acb51e123',
}


@pytest.mark.parametrize("label, shape, call", CASES + VCASES, ids=[c[0] for c in CASES + VCASES])
def test_every_call_launches_as_pinned(rec, monkeypatch, label, shape, call):
    runs = _routes(rec, monkeypatch, call[0], shape, call[1])
    # Every route: the same native calls, results and errors.
    assert runs[1] == runs[0] and runs[2] == runs[0], label
    if label.startswith("e "):
        assert "error" in runs[0], runs[0]
    else:
        launches = not (isinstance(call[1], dict) and "_nocall" in call[1])
        assert "result" in runs[0] and bool(runs[0]["calls"]) == launches, runs[0]
    assert _digest(runs[0]) == PINNED[label], (label, _digest(runs[0]), runs[0])
