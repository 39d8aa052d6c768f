#!/usr/bin/env python3
"""Writes examples/small.safetensors: q, k, v of shape [1, 128, 2, 64] (bshd), fp16, standard
normal values from a fixed seed. Only the standard library is needed."""
import json, random, struct, pathlib

B, S, H, D = 1, 128, 2, 64
rng = random.Random(20261122)
tensors = {}
for name in ("q", "k", "v"):
    vals = [rng.gauss(0.0, 1.0) for _ in range(B * S * H * D)]
    tensors[name] = struct.pack(f"<{len(vals)}e", *vals)
header, offset = {}, 0
for name, data in tensors.items():
    header[name] = {"dtype": "F16", "shape": [B, S, H, D], "data_offsets": [offset, offset + len(data)]}
    offset += len(data)
raw = json.dumps(header, separators=(",", ":")).encode()
raw += b" " * ((8 - len(raw) % 8) % 8)
out = pathlib.Path(__file__).resolve().parent.parent / "examples" / "small.safetensors"
out.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values()))
print(f"wrote {out}")
