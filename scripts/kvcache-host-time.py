#!/usr/bin/env python3
"""Host time of one decode step: ``flashcore.flash_attn_with_kvcache`` with new k/v (appended in
the same call) against ``torch.nn.functional.scaled_dot_product_attention`` on the same cache, in
one process on one GPU (run on the GPU machine).

Host time is the CPU time to enqueue a call: each sample times a burst of calls issued back to
back after a synchronisation, short enough that the launch queue never fills (so the GPU never
holds the CPU back), then synchronises outside the timed region. The median over samples is
reported per call, with the checked path's (the one-pass decode path turned off) and the
Python-only share (the native call replaced by a no-op) and the share before the launch (the
native call's conversion and checks, `_native.validate`) beside it, and the same without new k/v.

    python scripts/kvcache-host-time.py                    # B=1, 32/8 heads, d128, 8k cache, bf16
    python scripts/kvcache-host-time.py --batch 8 --cache 4096 --heads 32 8 --dim 128 --rotate 1
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashcore
from flashcore import _launch, kvcache


def per_call_us(fn, burst, samples):
    """Median host time of one call of `fn`, in µs."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        t1 = time.perf_counter()
        times.append((t1 - t0) / burst * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def stubbed(fn, mode, args):
    """`per_call_us` of `fn` with the native launch functions replaced: by a no-op ("python"), or
    by `_native.validate` of the same call ("checks": the argument conversion and the checks,
    without the context, plan or driver; `validate` takes `attention`'s full signature, so a few
    more conversions than `attention_kv`'s). Builds without `attention_kv` (before issue 42's
    host-time work) launch through `attention` alone."""
    native = _launch._native
    saved = {name: getattr(native, name) for name in ("attention", "attention_kv") if hasattr(native, name)}
    if mode == "python":
        stubs = {"attention": lambda *a, **kw: None, "attention_kv": lambda *a: None}
    else:
        stubs = {"attention": lambda dev, stream, *a, **kw: native.validate(*a, **kw),
                 "attention_kv": lambda dev, stream, *a: native.validate(*a[:9], 0, *a[9:11], append=a[11])}
    for name in saved:
        setattr(native, name, stubs[name])
    try:
        return per_call_us(fn, args.burst, args.samples)
    finally:
        for name, f in saved.items():
            setattr(native, name, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=8192, help="cache capacity (rows per sequence)")
    ap.add_argument("--heads", type=int, nargs=2, default=(32, 8), metavar=("HQ", "HKV"))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--burst", type=int, default=100, help="calls per timed sample (keep the launch queue short)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--rotate", type=int, default=2,
                    help="q (and new k/v) buffers used in turn, as a decode loop's fresh tensors (1: always the same)")
    args = ap.parse_args()

    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    b, s, (hq, hkv), d = args.batch, args.cache, args.heads, args.dim
    dev = torch.device("cuda")
    n = max(1, args.rotate)
    qs = [torch.randn(b, 1, hq, d, dtype=dt, device=dev) for _ in range(n)]
    kc = torch.randn(b, s, hkv, d, dtype=dt, device=dev)
    vc = torch.randn(b, s, hkv, d, dtype=dt, device=dev)
    ks = [torch.randn(b, 1, hkv, d, dtype=dt, device=dev) for _ in range(n)]
    vs = [torch.randn(b, 1, hkv, d, dtype=dt, device=dev) for _ in range(n)]
    lens = torch.full((b,), s - 1, dtype=torch.int32, device=dev)
    # SDPA's layout [B, H, S, D], contiguous, over the same number of keys.
    sdpa_q = [q.transpose(1, 2).contiguous() for q in qs]
    sdpa_k = kc.transpose(1, 2).contiguous()
    sdpa_v = vc.transpose(1, 2).contiguous()
    turn = [0]

    def step():
        turn[0] = (turn[0] + 1) % n
        return turn[0]

    def fc():
        i = step()
        flashcore.flash_attn_with_kvcache(qs[i], kc, vc, ks[i], vs[i], cache_seqlens=lens)

    def fc_no_append():
        flashcore.flash_attn_with_kvcache(qs[step()], kc, vc, cache_seqlens=lens)

    def sdpa():
        F.scaled_dot_product_attention(sdpa_q[step()], sdpa_k, sdpa_v, enable_gqa=True)

    with torch.inference_mode():
        fc()  # compiles and loads the kernels
        rows = [("sdpa", per_call_us(sdpa, args.burst, args.samples)),
                ("flashcore", per_call_us(fc, args.burst, args.samples))]
        one_pass = kvcache.decode
        kvcache.decode = lambda *a: None
        try:
            rows.append(("flashcore, every check (one pass off)", per_call_us(fc, args.burst, args.samples)))
        finally:
            kvcache.decode = one_pass
        rows.append(("flashcore without new k/v", per_call_us(fc_no_append, args.burst, args.samples)))
        rows.append(("flashcore without new k/v, Python only", stubbed(fc_no_append, "python", args)))
        rows.append(("flashcore, Python only (no native call)", stubbed(fc, "python", args)))
        rows.append(("flashcore, no launch (native checks only)", stubbed(fc, "checks", args)))

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: decode B={b} cache={s} Hq={hq} Hkv={hkv} "
          f"D={d} {args.dtype}, new k/v of 1 row, {n} q buffer(s) in turn; median of {args.samples} bursts of "
          f"{args.burst} calls")
    base = rows[0][1]
    for name, us in rows:
        print(f"{name:42s} {us:7.2f} µs/call  {us / base:5.2f}x sdpa")


if __name__ == "__main__":
    main()
