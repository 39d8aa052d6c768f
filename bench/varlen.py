#!/usr/bin/env python3
"""Varlen prefill side by side: flashcore's ``flash_attn_varlen_func`` (the work list
built on the device), SDPA (flash and cuDNN backends) on the same sequences padded to a dense batch (what a
framework without varlen runs: the padding is computed), FlashAttention-4's
``flash_attn.cute.flash_attn_varlen_func`` where it imports, and flashcore's dense
``flash_attn_func`` at the same total tokens and mean length ("flashcore-dense": the reference of
the issue's goal, varlen TFLOP/s >= 95% of dense; its TFLOP/s count its own dense shape).

Length mixes, seeded (``--seed``; SplitMix64, the generator ``flashcore bench --suite varlen`` uses,
so both list the same sequences row for row; ``--print-mixes`` prints them): "uniform" (lengths uniform in [1, 4096]), "skewed" (two long
sequences of a quarter of the tokens each, the rest in sequences uniform in [1, 256]), "equal"
(sequences of 4096); each filled to 16k and 64k tokens (the last sequence cut to fit). D 64 and
128 with H = 2048 / D (as the fa3 suite), bf16, causal and not, Sq = Sk per sequence.

Each call is timed by CUDA-graph replay of ``--graph-calls`` calls divided by that count (median of
``--reps`` replays; inputs captured once, so L2 may hold part of them at 16k tokens), and
flashcore's also eagerly between device events (host work included). TFLOP/s count the real
tokens only (4·H·Sq·Sk·D per sequence, halved when causal), for every implementation.

    python3 bench/varlen.py --json varlen.json
"""

import argparse
import itertools
import json
import math
import random
import sys


MIXES = ("uniform", "skewed", "equal")
M64 = (1 << 64) - 1


class SplitMix64:
    """SplitMix64, as src/bench/varlen.rs draws the lengths (the Rust suite's rows are these)."""

    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def int(self, lo, hi):
        return lo + self.next() % (hi - lo + 1)


def mix(name, total, seed):
    r = SplitMix64(seed * 1_000_003 + total * 7 + MIXES.index(name))
    lens = []
    if name == "uniform":
        while sum(lens) < total:
            lens.append(r.int(1, 4096))
    elif name == "skewed":
        lens = [total // 4, total // 4]
        while sum(lens) < total:
            lens.append(r.int(1, 256))
    else:
        lens = [4096] * (-(-total // 4096))
    lens[-1] -= sum(lens) - total
    return [n for n in lens if n > 0]


def dense_shape(lens, total):
    """flashcore-dense's shape: nb sequences of the mean length (src/bench/varlen.rs, Case::dense)."""
    b = len(lens)
    mean = max(1, (2 * total + b) // (2 * b))  # round half up, in integers
    return max(1, (2 * total + mean) // (2 * mean)), mean


def flops(lens, heads, d, causal):
    return sum(4.0 * heads * n * n * d / (2.0 if causal else 1.0) for n in lens)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--mixes", nargs="+", default=["uniform", "skewed", "equal"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--graph-calls", type=int, default=10)
    p.add_argument("--seed", type=int, default=0x5EED)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--print-mixes", action="store_true",
                   help="print each mix's lengths and dense shape as JSON and exit (no GPU needed)")
    args = p.parse_args()
    if args.print_mixes:
        out = {}
        for total in args.tokens:
            for name in args.mixes:
                lens = mix(name, total, args.seed)
                out[f"{name}/{total}"] = {"lens": lens, "dense": list(dense_shape(lens, total))}
        print(json.dumps(out))
        return

    import torch
    import torch.nn.functional as F

    import flashcore

    try:
        from flash_attn.cute import flash_attn_varlen_func as fa4_varlen
    except Exception as e:  # not installed, or not for this GPU
        fa4_varlen = None
        print(f"fa4: not timed ({type(e).__name__}: {e})", file=sys.stderr)

    dev = torch.device("cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def graph_us(fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.graph_calls):
                fn()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        t = []
        for _ in range(args.reps):
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            t.append(start.elapsed_time(end) * 1e3 / args.graph_calls)
        del g
        return sorted(t)[len(t) // 2]

    def eager_us(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = []
        for _ in range(args.reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            t.append(start.elapsed_time(end) * 1e3)
        return sorted(t)[len(t) // 2]

    records = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashcore varlen bench", flush=True)
    print(f"{'mix':8} {'tokens':>6} {'B':>4} {'D':>3} {'causal':6} {'impl':14} {'us':>9} {'TFLOP/s':>8}")
    for total in args.tokens:
        for name in args.mixes:
            lens = mix(name, total, args.seed)
            cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
            maxlen = max(lens)
            for d in args.headdims:
                h = 2048 // d
                g = torch.Generator(device=dev).manual_seed(args.seed)
                q, k, v = (torch.randn(total, h, d, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
                # The padded batch SDPA runs: [B, H, maxlen, D] (not when the padding would be more
                # than 8x the tokens: the skewed mixes).
                padded = len(lens) * maxlen <= 8 * total
                pad = [torch.randn(len(lens), h, maxlen, d, device=dev, generator=g, dtype=torch.bfloat16)
                       for _ in range(3)] if padded else None
                # Dense flashcore at the same total tokens and mean length (the 95% goal
                # compares the varlen call's useful TFLOP/s with this one's), its own buffers.
                nb, mean = dense_shape(lens, total)
                dq, dk, dv = (torch.randn(nb, mean, h, d, device=dev, generator=g, dtype=torch.bfloat16)
                              for _ in range(3))
                for causal in (False, True):
                    f = flops(lens, h, d, causal)
                    impls = {
                        "flashcore": lambda: flashcore.flash_attn_varlen_func(q, k, v, cu, cu, maxlen, maxlen,
                                                                             causal=causal),
                    }
                    if padded:
                        impls["sdpa-padded"] = lambda: F.scaled_dot_product_attention(*pad, is_causal=causal)
                    impls["flashcore-dense"] = lambda: flashcore.flash_attn_func(dq, dk, dv, causal=causal)
                    if padded:
                        impls["sdpa-cudnn-padded"] = lambda: F.scaled_dot_product_attention(*pad, is_causal=causal)
                    if fa4_varlen is not None:
                        impls["fa4"] = lambda: fa4_varlen(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                                          max_seqlen_q=maxlen, max_seqlen_k=maxlen, causal=causal)
                    for impl, fn in impls.items():
                        rows = []
                        try:
                            if impl.startswith("sdpa"):
                                backend = (torch.nn.attention.SDPBackend.CUDNN_ATTENTION if "cudnn" in impl
                                           else torch.nn.attention.SDPBackend.FLASH_ATTENTION)
                                with torch.nn.attention.sdpa_kernel(backend):
                                    rows.append(("graph", graph_us(fn)))
                            else:
                                rows.append(("graph", graph_us(fn)))
                            if impl == "flashcore":
                                rows.append(("eager", eager_us(fn)))
                        except Exception as e:
                            print(f"{name:8} {total:6} {len(lens):4} {d:3} {str(causal):6} {impl:14} skipped: "
                                  f"{type(e).__name__}: {str(e)[:120]}", flush=True)
                            continue
                        for mode, us in rows:
                            fi = flops([mean] * nb, h, d, causal) if impl == "flashcore-dense" else f
                            tf = fi / (us * 1e-6) / 1e12
                            label = impl if mode == "graph" else impl + " eager"
                            print(f"{name:8} {total:6} {len(lens):4} {d:3} {str(causal):6} {label:14} {us:9.1f} "
                                  f"{tf:8.1f}", flush=True)
                            records.append(dict(mix=name, tokens=total, batch=len(lens), max_len=maxlen,
                                                head_dim=d, heads=h, causal=causal, implementation=impl,
                                                mode=mode, median_us=us, tflops=tf, seed=args.seed))
                del pad, q, k, v, dq, dk, dv
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records},
                      fh, indent=1)


if __name__ == "__main__":
    main()
