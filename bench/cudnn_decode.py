"""cuDNN's decode through SDPA, for ncu (scripts/device-pending.sh): bf16, one query position,
GQA by `enable_gqa`, eight calls.  Usage: python3 bench/cudnn_decode.py B HQ HKV SK D"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

b, hq, hkv, sk, d = (int(x) for x in sys.argv[1:6])
q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(8):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
