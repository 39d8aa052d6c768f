"""KV-cache decode time by cache layout (contiguous, paged 16/64/256, secret counts), bf16, Sq=1,
CUDA-graph replay of 20 calls per sample, caches rotated past L2. Prints a table; a benchmark, not
a test. Usage: python3 bench/kvcache_pages.py [--out FILE.json]"""
import json
import sys

import torch

import flashcore

SHAPES = [(1, 8192, 32, 8, 128), (32, 4096, 32, 8, 128), (8, 32768, 32, 8, 128), (64, 1024, 16, 16, 64)]


def timed(fn, reps=20, samples=15):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    rows = []
    for b, sk, hq, hkv, d in SHAPES:
        dt = torch.bfloat16
        q = torch.randn(b, 1, hq, d, dtype=dt, device="cuda")
        kc = torch.randn(b, sk, hkv, d, dtype=dt, device="cuda")
        vc = torch.randn_like(kc)
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * b * sk * hkv * d * 2
        res = {"shape": [b, sk, hq, hkv, d], "kv_mb": kv_bytes / 1e6}
        flashcore.kvcache.prepare(q, kc)
        res["contiguous"] = timed(lambda: flashcore.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens))
        flashcore.kvcache.prepare(q, kc, secret_lengths=True)
        res["secret"] = timed(lambda: flashcore.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, secret_lengths=True))
        for page in (16, 64, 256):
            slots = sk // page
            perm = torch.randperm(b * slots, device="cuda").to(torch.int32)
            table = perm.view(b, slots).contiguous()
            pk = torch.empty(b * slots, page, hkv, d, dtype=dt, device="cuda")
            pv = torch.empty_like(pk)
            pk[table.long()] = kc.view(b, slots, page, hkv, d)
            pv[table.long()] = vc.view(b, slots, page, hkv, d)
            flashcore.kvcache.prepare(q, pk, block_table=table)
            res[f"paged{page}"] = timed(
                lambda: flashcore.flash_attn_with_kvcache(q, pk, pv, cache_seqlens=lens, block_table=table))
            del pk, pv
        qs = q.transpose(1, 2)
        ks, vs = kc.transpose(1, 2), vc.transpose(1, 2)
        try:
            res["sdpa"] = timed(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        except Exception as e:  # noqa: BLE001
            res["sdpa"] = None
        rows.append(res)
        cols = ["contiguous", "secret", "paged16", "paged64", "paged256", "sdpa"]
        print(f"B={b} Sk={sk} {hq}/{hkv} d{d} ({res['kv_mb']:.0f} MB): "
              + "  ".join(f"{c} {res[c]:.1f}us ({res['kv_mb'] / res[c]:.2f} TB/s)" if res[c] else f"{c} -" for c in cols),
              flush=True)
    if "--out" in sys.argv:
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[sys.argv.index("--out") + 1], "w"),
                  indent=1)


if __name__ == "__main__":
    main()
