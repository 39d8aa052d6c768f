#!/usr/bin/env python3
"""Random bf16 q, k, v, do safetensors for scripts/bwd-issue40-device.sh (standard library only):
B 2, Sq = Sk = 1000 (partial tiles), Hq 4, Hkv 2 (GQA), head dims 64 and 128, bshd."""
import array, json, random, struct, sys

def bf16_bits(n, sd, rnd):
    out = array.array("H")
    for _ in range(n):
        u = struct.unpack("<I", struct.pack("<f", rnd.gauss(0.0, sd)))[0]
        out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)  # nearest even
    return out.tobytes()

def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, b) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)

rnd = random.Random(40)
for d in (64, 128):
    qs, ks = (2, 1000, 4, d), (2, 1000, 2, d)
    t = {}
    for n, s in (("q", qs), ("k", ks), ("v", ks), ("do", qs)):
        t[n] = (s, bf16_bits(s[0] * s[1] * s[2] * s[3], 1.5 if n in ("q", "k") else 1.0, rnd))
    write(f"{sys.argv[1]}/in_d{d}.safetensors", t)
