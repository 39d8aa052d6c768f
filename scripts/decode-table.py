#!/usr/bin/env python3
"""Markdown table of a decode side-by-side (docs/journal/benchmarks.md): flashcore's records beside
bench/sdpa.py's, with the K/V bytes each call reads, flashcore's KV bandwidth, the ratio to the
best other implementation and, where flashcore is above 0.91x, the bandwidth 0.91x would take.

    python3 scripts/decode-table.py flashcore.json sdpa.json [--copy-rate 3.0]
"""
import argparse
import json

NAMES = {"sdpa-flash": "FA2 (SDPA flash)", "sdpa-cudnn": "cuDNN (SDPA)", "fa4": "FA4"}


def key(r):
    s = r["shape"]
    return (r["dtype"], s["batch"], s["heads_q"], s["heads_kv"], s["seqlen_q"], s["seqlen_k"], s["head_dim"],
            s["causal"], r["mode"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("others")
    ap.add_argument("--copy-rate", type=float, default=3.0, help="measured copy rate, TB/s")
    a = ap.parse_args()
    ours = [r for r in json.load(open(a.ours))["records"] if r["status"] == "ok"]
    others = {}
    for r in json.load(open(a.others))["records"]:
        if r["status"] == "ok":
            others.setdefault(key(r), {})[r["implementation"]] = r["time_us"]["median"]
    print("| shape (bf16) | K/V read | flashcore | KV TB/s | " + " | ".join(NAMES.values())
          + " | flashcore ÷ best other | TB/s for 0.91× |")
    print("|---" * (6 + len(NAMES)) + "|")
    n = le1 = le91 = 0
    worst = 0.0
    for r in ours:
        s = r["shape"]
        kv = 2 * s["batch"] * s["seqlen_k"] * s["heads_kv"] * s["head_dim"] * 2
        t = r["time_us"]["median"]
        o = others.get(key(r), {})
        best = min(o.values()) if o else float("nan")
        ratio = t / best
        n += 1
        le1 += ratio <= 1.0
        le91 += ratio <= 0.91
        worst = max(worst, ratio)
        need = ""
        if ratio > 0.91:
            bw = kv / (0.91 * best * 1e-6) / 1e12
            need = f"{bw:.2f}" + (" (> copy rate)" if bw > a.copy_rate else "")
        shape = (f"b{s['batch']} h{s['heads_q']}/{s['heads_kv']} s{s['seqlen_q']}/{s['seqlen_k']} d{s['head_dim']}"
                 + (" causal" if s["causal"] else ""))
        cols = " | ".join(f"{o[k]:.1f}" if k in o else "–" for k in NAMES)
        print(f"| {shape} | {kv / 1e6:.0f} MB | {t:.1f} µs | {kv / (t * 1e-6) / 1e12:.2f} | {cols} | {ratio:.2f} | {need} |")
    print(f"\n{n} shapes: at or under 1.0x {le1}, at or under 0.91x {le91}, worst {worst:.2f}x")


if __name__ == "__main__":
    main()
