#!/usr/bin/env python3
"""Eager per-call host time of flashcore's Python entry points beside
``F.scaled_dot_product_attention`` on the same shapes, in one process ("host overhead").

Host time = how long the Python call takes to return. Each repeat times `--calls` back-to-back
calls with ``time.perf_counter`` (each call's result kept alive during the next, as in a model's
layer loop, so a fresh output lands at a new address), after a ``torch.cuda.synchronize()``
outside the timed region; the calls per repeat are few enough (≤ ~1000 launches queued) that the
launch queue never blocks, even when the GPU is slower than the host. Reported: the median over
`--repeats` repeats of the per-call mean (and the min). The GPU work is not timed here.

    python3 bench/host_overhead.py [--out bench/results/FILE.json] [--profile]
    python3 bench/host_overhead.py --compare before.json after.json   # a side-by-side table

Shapes: "tiny" prefill (B1 S128 H8 D64 f16), "decode-tiny" (q [1,1,8,64] over a [1,128,8,64]
cache, f16) and "decode" (q [1,1,32,128] over a [1,8192,8,128] cache, bf16, GQA 32/8).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

SHAPES = {
    # name: (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype)
    "tiny": (1, 128, 128, 8, 8, 64, "float16"),
    "decode-tiny": (1, 1, 128, 8, 8, 64, "float16"),
    "decode": (1, 1, 8192, 32, 8, 128, "bfloat16"),
}


def host_us(fn, calls, repeats, warmup):
    import torch

    r = None
    for _ in range(warmup):
        r = fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn()  # the last result stays alive while the next call runs
        t1 = time.perf_counter()
        samples.append((t1 - t0) * 1e6 / calls)
    del r
    torch.cuda.synchronize()
    return samples


def entries(shape, fc, F, torch):
    """(name, thunk or None, reason) for every entry point at this shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, sq, sk, hq, hkv, d, dt = shape
    dtype = getattr(torch, dt)
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=g)

    q, k, v = rnd(b, sq, hq, d), rnd(b, sk, hkv, d), rnd(b, sk, hkv, d)
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # SDPA's own layout
    gqa = hq != hkv
    out = []
    out.append(("flashcore.attention", lambda: fc.attention(q, k, v)))
    out.append(("flashcore.flash_attn_func", lambda: fc.flash_attn_func(q, k, v)))
    out.append(("flashcore.scaled_dot_product_attention",
                lambda: fc.scaled_dot_product_attention(qh, kh, vh, enable_gqa=gqa)))
    if sq <= 16:
        kc, vc = rnd(b, sk, hkv, d), rnd(b, sk, hkv, d)
        lens = torch.full((b,), sk - 8, dtype=torch.int32, device="cuda")
        kn, vn = rnd(b, 1, hkv, d), rnd(b, 1, hkv, d)
        out.append(("flashcore.flash_attn_with_kvcache",
                    lambda: fc.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)))
        out.append(("flashcore.flash_attn_with_kvcache +k/v",
                    lambda: fc.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=lens)))

    def sdpa(backend):
        def thunk():
            return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=gqa)

        if backend is None:
            return thunk
        return ("ctx", backend, thunk)

    out.append(("F.sdpa (default)", sdpa(None)))
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        out.append((f"F.sdpa ({name})", ("ctx", be, sdpa(None))))
    if hasattr(torch.nn.attention, "activate_flash_attention_impl"):
        out.append(("SDPA hook: flashcore as flash impl", ("hook", SDPBackend.FLASH_ATTENTION, sdpa(None))))
    return out, (q, k, v, qh, kh, vh)


def run_entry(kind, torch, calls, repeats, warmup):
    from torch.nn.attention import sdpa_kernel

    if callable(kind):
        return host_us(kind, calls, repeats, warmup)
    tag, backend, thunk = kind
    if tag == "ctx":
        with sdpa_kernel(backend):
            return host_us(thunk, calls, repeats, warmup)
    torch.nn.attention.activate_flash_attention_impl("flashcore")
    try:
        with sdpa_kernel(backend):
            import flashcore

            before = flashcore.sdpa_backend.stats["flashcore"]
            s = host_us(thunk, calls, repeats, warmup)
            if flashcore.sdpa_backend.stats["flashcore"] == before:
                raise RuntimeError("the hook served no call on flashcore")
            return s
    finally:
        torch.nn.attention.restore_flash_attention_impl()


def sanity(fc, F, torch, tensors, shape):
    """flashcore's answer beside SDPA's math backend (float32), so a fast path that skips work
    it must do shows here."""
    q, k, v, qh, kh, vh = tensors
    gqa = shape[3] != shape[4]
    ref = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(), enable_gqa=gqa).transpose(1, 2)
    got = fc.attention(q, k, v).float()
    err = ((got - ref).norm() / ref.norm()).item()
    got2 = fc.scaled_dot_product_attention(qh, kh, vh, enable_gqa=gqa).transpose(1, 2).float()
    err2 = ((got2 - ref).norm() / ref.norm()).item()
    errs = {"attention": err, "scaled_dot_product_attention": err2}
    if shape[1] <= 16:
        got3 = fc.flash_attn_with_kvcache(q, k, v, cache_seqlens=shape[2]).float()
        errs["flash_attn_with_kvcache"] = ((got3 - ref).norm() / ref.norm()).item()
    for name, e in errs.items():
        if not e < 2e-2:
            raise SystemExit(f"sanity: {name} rel. error {e:.3g} against SDPA math at {shape}")
    return errs


def profile(fc, torch, calls, repeats, warmup):
    """Where a call's host time goes: its pieces timed alone (what exists in this version)."""
    from flashcore import _checks, _launch, _native, ops

    res = {}
    for sname in ("tiny", "decode"):
        b, sq, sk, hq, hkv, d, dt = SHAPES[sname]
        dtype = getattr(torch, dt)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        outs = [torch.empty_like(q), torch.empty_like(q)]
        tag = "f16" if dtype == torch.float16 else "bf16"
        shape = (b, sq, sk, hq, hkv, d)
        dev = q.device.index
        stream = torch.cuda.current_stream().cuda_stream
        ws_n = _native.workspace_bytes(tag, shape, False)
        ws = torch.empty(max(ws_n, 16), dtype=torch.uint8, device="cuda")

        def desc(t):
            st = t.stride()
            return (t.data_ptr(), (st[0], st[1], st[2]))

        qd, kd, vd = desc(q), desc(k), desc(v)
        od = [desc(o) for o in outs]
        wsp = ws.data_ptr() if ws_n else 0
        i = [0]

        def native_fixed():
            _native.attention(dev, stream, tag, shape, False, None, qd, kd, vd, od[0], 0, 0, wsp, 0)

        def native_alternating():
            i[0] ^= 1
            _native.attention(dev, stream, tag, shape, False, None, qd, kd, vd, od[i[0]], 0, 0, wsp, 0)

        pieces = {
            "torch.empty_like(q)": lambda: torch.empty_like(q),
            "torch.empty_like(q, contiguous_format)": lambda: torch.empty_like(q, memory_format=torch.contiguous_format),
            "torch.empty(q.shape, dtype, device)": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
            "torch.empty(workspace uint8)": lambda: torch.empty(max(ws_n, 16), dtype=torch.uint8, device="cuda"),
            "_checks.split_shape": lambda: _checks.split_shape(q, k, v, "bshd"),
            "ops.eager": lambda: ops.eager(q, k, v, None),
            "_launch.readable x3": lambda: (_launch.readable(q), _launch.readable(k), _launch.readable(v)),
            "_launch.current_stream": lambda: _launch.current_stream(dev),
            "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
            "_native.attention (same out)": native_fixed,
            "_native.attention (alternating out)": native_alternating,
        }
        for name, fn in pieces.items():
            s = host_us(fn, calls, max(repeats // 2, 5), warmup)
            res[f"{sname}: {name}"] = statistics.median(s)
            print(f"  profile {sname:12s} {name:45s} {statistics.median(s):7.2f} µs", flush=True)
    return res


def compare(paths):
    runs = [json.load(open(p)) for p in paths]
    labels = [r.get("label") or os.path.basename(p) for r, p in zip(runs, paths)]
    keys = []
    for r in runs:
        for rec in r["records"]:
            key = (rec["shape"], rec["entry"])
            if key not in keys:
                keys.append(key)
    print("shape        entry                                      " + "  ".join(f"{l[:14]:>14s}" for l in labels))
    for key in keys:
        cells = []
        for r in runs:
            m = {(x["shape"], x["entry"]): x for x in r["records"]}.get(key)
            cells.append(f"{m['median_us']:14.2f}" if m and m.get("median_us") is not None else f"{'-':>14s}")
        print(f"{key[0]:12s} {key[1]:42s} " + "  ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=64, help="calls per timed repeat")
    ap.add_argument("--repeats", type=int, default=80, help="timed repeats (median reported)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--grad-mode", choices=("plain", "no_grad", "inference"), default="plain",
                    help="plain: as a script runs by default (inputs need no grad)")
    ap.add_argument("--profile", action="store_true", help="also time the pieces of a call")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", help="write the raw records (JSON) here")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="print earlier runs side by side and exit")
    args = ap.parse_args()
    if args.compare:
        compare(args.compare)
        return

    import torch
    import torch.nn.functional as F

    import flashcore as fc

    ctx = {"plain": None, "no_grad": torch.no_grad, "inference": torch.inference_mode}[args.grad_mode]
    records, sanity_errs = [], {}
    if ctx is not None:
        ctx().__enter__()
    for sname in args.shapes.split(","):
        shape = SHAPES[sname]
        ents, tensors = entries(shape, fc, F, torch)
        sanity_errs[sname] = sanity(fc, F, torch, tensors, shape)
        ref = None
        for name, kind in ents:
            rec = {"shape": sname, "entry": name, "calls": args.calls, "repeats": args.repeats}
            try:
                s = run_entry(kind, torch, args.calls, args.repeats, args.warmup)
                rec.update(median_us=statistics.median(s), min_us=min(s), max_us=max(s), samples_us=s)
            except Exception as e:  # a backend that cannot serve this shape: say so, go on
                rec.update(median_us=None, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            if name == "F.sdpa (default)":
                ref = rec.get("median_us")
            records.append(rec)
            torch.cuda.synchronize()
        print(f"\n{sname} {shape} (median host µs per call; ÷ F.sdpa default)")
        for rec in records:
            if rec["shape"] != sname:
                continue
            if rec["median_us"] is None:
                print(f"  {rec['entry']:42s}        -   ({rec['error']})")
            else:
                ratio = f"{rec['median_us'] / ref:5.2f}" if ref else "  -  "
                print(f"  {rec['entry']:42s} {rec['median_us']:8.2f}  min {rec['min_us']:7.2f}  {ratio}")
        print(f"  sanity (rel. error vs SDPA math fp32): {sanity_errs[sname]}", flush=True)
    prof = profile(fc, torch, args.calls, args.repeats, args.warmup) if args.profile else None
    meta = {
        "label": args.label,
        "flashcore_file": fc.__file__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "python": platform.python_version(),
        "grad_mode": args.grad_mode,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv,
    }
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({**meta, "records": records, "sanity": sanity_errs, "profile": prof}, f, indent=1)


if __name__ == "__main__":
    main()
