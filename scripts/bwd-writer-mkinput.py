#!/usr/bin/env python3
"""Random bf16 q, k, v, do in one safetensors file for `flashcore attn --grad` (bshd).
Usage: bwd-writer-mkinput.py OUT.safetensors B S HQ HKV D [SEED]
torch (with numpy) when importable, else the standard library (slower: ~1.5 s per million
elements). q, k ~ N(0, 1.5²), v, do ~ N(0, 1); the same bits for the same arguments and backend."""
import array, json, random, struct, sys

path, b, s, hq, hkv, d = sys.argv[1], *map(int, sys.argv[2:7])
seed = int(sys.argv[7]) if len(sys.argv) > 7 else 40
shapes = {"q": (b, s, hq, d), "k": (b, s, hkv, d), "v": (b, s, hkv, d), "do": (b, s, hq, d)}
sds = {"q": 1.5, "k": 1.5, "v": 1.0, "do": 1.0}

def n_of(shape):
    n = 1
    for x in shape:
        n *= x
    return n

try:
    import torch
    g = torch.Generator().manual_seed(seed)
    blobs = {k: (torch.randn(n_of(sh), generator=g) * sds[k]).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
             for k, sh in shapes.items()}
except Exception:  # no torch or numpy: the standard library
    rnd = random.Random(seed)
    blobs = {}
    for k, sh in shapes.items():
        out = array.array("H")
        for _ in range(n_of(sh)):
            u = struct.unpack("<I", struct.pack("<f", rnd.gauss(0.0, sds[k])))[0]
            out.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)  # nearest even
        blobs[k] = out.tobytes()

header, off = {}, 0
for k, sh in shapes.items():
    header[k] = {"dtype": "BF16", "shape": list(sh), "data_offsets": [off, off + len(blobs[k])]}
    off += len(blobs[k])
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for k in shapes:
        f.write(blobs[k])
