#!/usr/bin/env python3
"""The varlen backward beside the dense backward at the same total tokens:
``torch.ops.flashcore.attention_varlen_backward`` on bench/varlen.py's length mixes ("uniform",
"skewed", "equal"; 16k tokens by default) and ``torch.ops.flashcore.attention_backward`` on
flashcore-dense's shape for the same mix (nb sequences of the mean length; for "equal" the very
same sequences). bf16, H = 2048 / D, Sq = Sk per sequence, causal and not. Each call is timed
between CUDA events (median of ``--reps`` after warm-up), the three kernels of one backward
together. TFLOP/s count the real tokens: 2.5 × the forward's 4·H·Sq·Sk·D per sequence (halved
when causal).

    python3 bench/varlen_backward.py --json varlen_backward.json
"""

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen import dense_shape, flops, mix  # noqa: E402

import flashcore  # noqa: E402,F401


def timed(fn, reps):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--mixes", nargs="+", default=["uniform", "skewed", "equal"])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    dt = torch.bfloat16
    for total in args.tokens:
        for d in args.dims:
            h = 2048 // d
            for name in args.mixes:
                lens = mix(name, total, args.seed)
                for causal in (False, True):
                    g = torch.Generator(device="cuda").manual_seed(1)
                    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).to(dt)  # noqa: E731
                    q, k, v, do = (rnd(total, h, d) for _ in range(4))
                    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32,
                                      device="cuda")
                    mx = max(lens)
                    out, lse = torch.ops.flashcore.attention_varlen(q, k, v, cu, cu, None, mx, mx, causal, None, True,
                                                                    None)
                    vl = timed(lambda: torch.ops.flashcore.attention_varlen_backward(
                        do, q, k, v, out, lse, cu, cu, None, None, mx, mx, causal, None), args.reps)
                    nb, s = dense_shape(lens, total)
                    dq_, dk_, dv_, ddo = (rnd(nb, s, h, d) for _ in range(4))
                    dout, dlse = torch.ops.flashcore.attention(dq_, dk_, dv_, causal, None, False, True, None)
                    dn = timed(lambda: torch.ops.flashcore.attention_backward(ddo, dq_, dk_, dv_, dout, dlse, causal,
                                                                              None, False), args.reps)
                    f_vl = 2.5 * flops(lens, h, d, causal)
                    f_dn = 2.5 * flops([s] * nb, h, d, causal)
                    row = dict(tokens=total, d=d, heads=h, mix=name, causal=causal, seqs=len(lens), max_seqlen=mx,
                               varlen_ms=vl, varlen_tflops=f_vl / vl / 1e9, dense_shape=[nb, s], dense_ms=dn,
                               dense_tflops=f_dn / dn / 1e9)
                    row["varlen_over_dense_tflops"] = row["varlen_tflops"] / row["dense_tflops"]
                    rows.append(row)
                    print(f"{total:6d} d{d:<3d} {name:8s} {'causal' if causal else 'full  '} B={len(lens):3d} "
                          f"varlen {vl:8.3f} ms {row['varlen_tflops']:6.1f} TF/s | dense {nb}x{s} {dn:8.3f} ms "
                          f"{row['dense_tflops']:6.1f} TF/s | ratio {row['varlen_over_dense_tflops']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(0), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
