"""Chunked prefill over a KV cache by cache layout: a contiguous cache, a paged one gathered into a
contiguous copy first (``FLASHCORE_PAGED_PREFILL=gather``), and the same pages read in the varlen
kernel through the block table (``=kernel``), page sizes 1, 16, 64, 256. bf16, packed chunks
of new queries (``cu_seqlens_q``) over caches that already hold the chunk's keys (no append:
what is timed is the attention and, on the gathered path, its gather). CUDA-graph replay
(``kvcache_pages.timed``: 20 calls per sample, median of 15); the layouts alternate shape by
shape. Also checks that every layout gives the contiguous cache's bits. A benchmark, not a test.
Usage: python3 bench/chunked_pages.py [--out FILE.json]"""
import json
import os
import sys

import torch

import flashcore
from kvcache_pages import timed

# (sequences, cache rows each (capacity), keys each after the chunk, chunk queries each, Hq, Hkv, D)
SHAPES = [
    (8, 8192, 4096, 512, 32, 8, 128),
    (4, 16384, 16384, 2048, 32, 8, 128),
    (16, 4096, 2048, 256, 16, 16, 64),
]
PAGES = (1, 16, 64, 256)


def knob(value):
    if value is None:
        os.environ.pop("FLASHCORE_PAGED_PREFILL", None)
    else:
        os.environ["FLASHCORE_PAGED_PREFILL"] = value


def main():
    rows = []
    dt = torch.bfloat16
    for b, cap, count, chunk, hq, hkv, d in SHAPES:
        kc = torch.randn(b, cap, hkv, d, dtype=dt, device="cuda")
        vc = torch.randn_like(kc)
        q = torch.randn(b * chunk, hq, d, dtype=dt, device="cuda")
        cu = torch.arange(b + 1, dtype=torch.int32, device="cuda") * chunk
        lens = torch.full((b,), count, dtype=torch.int32, device="cuda")
        kw = dict(cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=chunk, causal=True)
        res = {"shape": [b, cap, count, chunk, hq, hkv, d]}
        knob(None)
        want = flashcore.flash_attn_with_kvcache(q, kc, vc, **kw)
        res["contiguous"] = timed(lambda: flashcore.flash_attn_with_kvcache(q, kc, vc, **kw))
        same = {}
        for page in PAGES:
            slots = cap // page
            perm = torch.randperm(b * slots, device="cuda").to(torch.int32)
            table = perm.view(b, slots).contiguous()
            pk = torch.empty(b * slots, page, hkv, d, dtype=dt, device="cuda")
            pv = torch.empty_like(pk)
            pk[table.long()] = kc.view(b, slots, page, hkv, d)
            pv[table.long()] = vc.view(b, slots, page, hkv, d)
            for name, value in ((f"gathered{page}", "gather"), (f"kernel{page}", "kernel")):
                knob(value)
                out = flashcore.flash_attn_with_kvcache(q, pk, pv, block_table=table, **kw)
                same[name] = bool(torch.equal(out, want))
                res[name] = timed(lambda: flashcore.flash_attn_with_kvcache(q, pk, pv, block_table=table, **kw))
            del pk, pv
        knob(None)
        res["same_bits"] = same
        rows.append(res)
        cols = ["contiguous"] + [f"{w}{p}" for p in PAGES for w in ("gathered", "kernel")]
        print(f"B={b} cap={cap} keys={count} chunk={chunk} {hq}/{hkv} d{d}: "
              + "  ".join(f"{c} {res[c]:.1f}us ({res[c] / res['contiguous']:.3f})" for c in cols)
              + f"  same bits: {all(same.values())}", flush=True)
    if "--out" in sys.argv:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows},
                  open(sys.argv[sys.argv.index("--out") + 1], "w"), indent=1)


if __name__ == "__main__":
    main()
