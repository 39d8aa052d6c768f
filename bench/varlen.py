#!/usr/bin/env python3
"""Varlen prefill (issue 22) side by side: flashcore's ``flash_attn_varlen_func`` (the work list
built on the device), SDPA (flash and cuDNN backends) on the same sequences padded to a dense batch (what a
framework without varlen runs: the padding is computed), FlashAttention-4's
``flash_attn.cute.flash_attn_varlen_func`` where it imports, and flashcore's dense
``flash_attn_func`` at the same total tokens and mean length ("flashcore-dense": the reference of
the issue's goal, varlen TFLOP/s >= 95% of dense; its TFLOP/s count its own dense shape).

Length mixes, seeded (``--seed``): "uniform" (lengths uniform in [1, 4096]), "skewed" (two long
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
import json
import math
import random
import sys


def mix(name, total, seed):
    r = random.Random(f"{name}/{total}/{seed}")
    lens = []
    if name == "uniform":
        while sum(lens) < total:
            lens.append(r.randint(1, 4096))
    elif name == "skewed":
        lens = [total // 4, total // 4]
        while sum(lens) < total:
            lens.append(r.randint(1, 256))
    elif name == "equal":
        lens = [4096] * (-(-total // 4096))
    else:
        raise ValueError(name)
    lens[-1] -= sum(lens) - total
    return [n for n in lens if n > 0]


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
    args = p.parse_args()

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
            cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32, device=dev)
            maxlen = max(lens)
            for d in args.headdims:
                h = 2048 // d
                g = torch.Generator(device=dev).manual_seed(args.seed)
                q, k, v = (torch.randn(total, h, d, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(3))
                # The padded batch SDPA runs: [B, H, maxlen, D] (not when the padding would be more
                # than 8x the tokens: the skewed mixes).
                padded = len(lens) * maxlen <= 8 * total
                pad = [torch.zeros(len(lens), h, maxlen, d, device=dev, dtype=torch.bfloat16)
                       for _ in range(3)] if padded else None
                for causal in (False, True):
                    f = flops(lens, h, d, causal)
                    impls = {
                        "flashcore": lambda: flashcore.flash_attn_varlen_func(q, k, v, cu, cu, maxlen, maxlen,
                                                                             causal=causal),
                    }
                    if padded:
                        impls["sdpa-padded"] = lambda: F.scaled_dot_product_attention(*pad, is_causal=causal)
                    # Dense flashcore at the same total tokens and mean length (the 95%
                    # goal compares the varlen call's useful TFLOP/s with this one's).
                    mean = max(1, round(total / len(lens)))
                    nb = max(1, round(total / mean))
                    dense_q = q[: nb * mean].view(nb, mean, h, d) if nb * mean <= total else None
                    if dense_q is not None:
                        dk, dv = k[: nb * mean].view(nb, mean, h, d), v[: nb * mean].view(nb, mean, h, d)
                        impls["flashcore-dense"] = lambda: flashcore.flash_attn_func(dense_q, dk, dv, causal=causal)
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
                del pad, q, k, v
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records},
                      fh, indent=1)


if __name__ == "__main__":
    main()
