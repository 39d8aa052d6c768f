#!/usr/bin/env python3
"""Checks `flashcore attn` against torch.nn.functional.scaled_dot_product_attention on files that
PyTorch writes. Runs on the GPU machine (PyTorch + safetensors). For each case: random q, k, v
(torch), saved with safetensors; `flashcore attn` on that file; the output compared with SDPA in
float64 by relative L2 error (fp16 <= 2e-3, bf16 <= 1e-2). Exit 1 on any failure.

usage: check-attn-vs-torch.py PATH/TO/flashcore [WORKDIR]"""
import subprocess, sys, tempfile, os
import torch
import torch.nn.functional as F
from safetensors.torch import save_file, load_file

BIN = sys.argv[1]
WORK = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}

cases = []
for dtype in (torch.float16, torch.bfloat16):
    for d in (64, 128):
        for causal in (False, True):
            for layout in ("bshd", "bhsd"):
                cases.append((dtype, 2, 4, 2, 333, 333, d, causal, layout, None))
cases += [
    (torch.float16, 1, 8, 8, 1, 1000, 64, True, "bshd", None),     # Sq < Sk, bottom-right causal
    (torch.bfloat16, 1, 8, 2, 700, 700, 128, True, "bhsd", 0.07),  # GQA, custom scale
    (torch.float16, 3, 2, 2, 1025, 17, 64, False, "bshd", None),   # Sq > Sk
]

failures = 0
torch.manual_seed(0)
for i, (dtype, b, hq, hkv, sq, sk, d, causal, layout, scale) in enumerate(cases):
    q = torch.randn(b, hq, sq, d, dtype=dtype, device="cuda")
    k = torch.randn(b, hkv, sk, d, dtype=dtype, device="cuda")
    v = torch.randn(b, hkv, sk, d, dtype=dtype, device="cuda")
    # PyTorch's causal mask is top-left aligned; flash-attn (and flashcore) align bottom-right.
    mask = None
    if causal:
        mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(diagonal=sk - sq)
    rep = hq // hkv
    ref = F.scaled_dot_product_attention(
        q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1),
        attn_mask=mask, scale=scale)
    if causal and sq > sk:
        ref = torch.nan_to_num(ref, nan=0.0)  # fully masked rows: flashcore defines O = 0
    to_file = (lambda t: t.transpose(1, 2).contiguous()) if layout == "bshd" else (lambda t: t.contiguous())
    inp = os.path.join(WORK, f"in{i}.safetensors")
    out = os.path.join(WORK, f"out{i}.safetensors")
    save_file({"q": to_file(q).cpu(), "k": to_file(k).cpu(), "v": to_file(v).cpu()}, inp)
    cmd = [BIN, "attn", "--input", inp, "--output", out, "--layout", layout]
    if causal:
        cmd.append("--causal")
    if scale is not None:
        cmd += ["--scale", str(scale)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL case {i}: flashcore exited {r.returncode}: {r.stderr.strip()}")
        failures += 1
        continue
    got = load_file(out)["out"]
    same_dtype = got.dtype == dtype  # the GPU path writes the input dtype
    if layout == "bshd":
        got = got.transpose(1, 2)
    got = got.double().cuda()
    err = ((got - ref).norm() / ref.norm()).item()
    ok = err <= TOL[dtype] and not torch.isnan(got).any().item() and same_dtype
    print(f"{'ok  ' if ok else 'FAIL'} {str(dtype):15} B{b} Hq{hq} Hkv{hkv} Sq{sq:5} Sk{sk:5} D{d:3} "
          f"{'causal' if causal else 'full  '} {layout} scale={scale}: rel L2 {err:.2e}")
    failures += 0 if ok else 1
print(f"{len(cases) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
