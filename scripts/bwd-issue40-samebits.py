#!/usr/bin/env python3
"""Whether two safetensors files hold the same tensors bit for bit (names, dtypes, shapes, bytes),
ignoring the header's order and metadata. Exit 0 when they do. Usage: samebits.py A B"""
import json, struct, sys

def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in h.items()}

a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
print(("same bits: " if not bad else "DIFFERENT: ") + (", ".join(bad) if bad else ", ".join(sorted(a))))
sys.exit(1 if bad else 0)
