#!/usr/bin/env python3
"""The GPU-free share of a decode step's host time, measured on any machine: the Python
layer of ``flashcore.flash_attn_with_kvcache`` with new k/v (B=1, 8k cache, 32/8 heads, d128,
bf16 by default, as scripts/kvcache-host-time.py), on CPU tensors posing as device 0's, with the
native call replaced by a no-op ("python") or by `_native.validate` of the same call — the
argument conversion and the checks, not the context, plan or driver ("checks").

CPU numbers only: a GPU machine adds torch's CUDA allocator (the output), the capture check and the
driver, and runs Python at its own speed. Compare builds on one machine, in one sitting:

    PYTHONPATH=<site of build A> python scripts/kvcache-host-time-cpu.py
    PYTHONPATH=<site of build B> python scripts/kvcache-host-time-cpu.py
"""

import argparse
import statistics
import time

import torch

import flashcore
from flashcore import _launch


def per_call_us(fn, burst, samples):
    for _ in range(burst):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(burst):
            fn()
        times.append((time.perf_counter_ns() - t0) / burst / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=8192)
    ap.add_argument("--heads", type=int, nargs=2, default=(32, 8), metavar=("HQ", "HKV"))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--rotate", type=int, default=2, help="q (and new k/v) buffers used in turn")
    args = ap.parse_args()

    b, s, (hq, hkv), d = args.batch, args.cache, args.heads, args.dim
    dt = torch.bfloat16
    scratch = torch.zeros(1 << 22, dtype=torch.uint8)
    torch.Tensor.get_device = lambda self: 0  # CPU tensors pose as device 0's
    _launch.current_stream = lambda index: 1234
    _launch._workspace = lambda n, dev, stream: scratch
    native = _launch._native
    n = max(1, args.rotate)
    qs = [torch.randn(b, 1, hq, d).to(dt) for _ in range(n)]
    kc, vc = torch.randn(b, s, hkv, d).to(dt), torch.randn(b, s, hkv, d).to(dt)
    ks = [torch.randn(b, 1, hkv, d).to(dt) for _ in range(n)]
    vs = [torch.randn(b, 1, hkv, d).to(dt) for _ in range(n)]
    lens = torch.full((b,), s - 1, dtype=torch.int32)
    turn = [0]

    def step():
        turn[0] = (turn[0] + 1) % n
        return turn[0]

    def fc():
        i = step()
        flashcore.flash_attn_with_kvcache(qs[i], kc, vc, ks[i], vs[i], cache_seqlens=lens)

    def fc_no_append():
        flashcore.flash_attn_with_kvcache(qs[step()], kc, vc, cache_seqlens=lens)

    validate = native.validate
    stubs = {
        "python": (lambda *a, **kw: None, lambda *a: None),
        "checks": (lambda dev, stream, *a, **kw: validate(*a, **kw),
                   lambda dev, stream, *a: validate(*a[:9], 0, *a[9:11], append=a[11])),
    }
    print(f"# CPU only ({torch.__version__}): B={b} cache={s} Hq={hq} Hkv={hkv} D={d} bf16, {n} q buffer(s) in "
          f"turn; median of {args.samples} bursts of {args.burst} calls")
    with torch.inference_mode():
        for mode, (attention, attention_kv) in stubs.items():
            native.attention = attention
            if hasattr(native, "attention_kv"):
                native.attention_kv = attention_kv
            for name, fn in (("with new k/v", fc), ("without new k/v", fc_no_append)):
                print(f"{mode:7s} {name:16s} {per_call_us(fn, args.burst, args.samples):6.2f} µs/call")


if __name__ == "__main__":
    main()
