#!/usr/bin/env bash
# The read roof (a read-only reduction over a large tensor) and the copy rate, graph-timed; then
# ncu of flashcore's and cuDNN's decode kernels at B=8, Sk=32k, 32/8, d128 bf16.
set -u
cd "$(dirname "$0")"
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
W=/tmp/roof; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version,clocks.max.mem --format=csv,noheader
cat > /tmp/roof.py <<'PY'
import torch
def graph_time(fn, calls=20, reps=15):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / calls)
    ts.sort(); return ts[len(ts) // 2]
for mb in (256, 1024, 4096):
    n = mb * 2**20 // 4
    xs = [torch.randn(n, device='cuda') for _ in range(2)]
    out = torch.empty((), device='cuda'); i = [0]
    def rd():
        torch.sum(xs[i[0] % 2], dim=0, out=out); i[0] += 1
    t = graph_time(rd)
    y = torch.empty_like(xs[0])
    tc = graph_time(lambda: y.copy_(xs[0]))
    print(f"{mb} MiB: read (sum) {t:.1f} us = {mb*2**20/t/1e6:.2f} TB/s; copy {tc:.1f} us = {2*mb*2**20/tc/1e6:.2f} TB/s (read+write)")
    del xs, y
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q = torch.randn(8, 32, 1, 128, device='cuda', dtype=torch.bfloat16)
k, v = (torch.randn(8, 8, 32768, 128, device='cuda', dtype=torch.bfloat16) for _ in range(2))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    t = graph_time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
print(f"cuDNN decode 8,32/8,32k,128: {t:.1f} us = {2*k.numel()*2/t/1e6:.2f} TB/s")
PY
python3 /tmp/roof.py 2>&1 | tee $W/roof.txt
true
NCU="/usr/local/cuda/bin/ncu --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
true
cat > /tmp/cd.py <<'PY'
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
q = torch.randn(8, 32, 1, 128, device='cuda', dtype=torch.bfloat16)
k, v = (torch.randn(8, 8, 32768, 128, device='cuda', dtype=torch.bfloat16) for _ in range(2))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(8): F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
PY
timeout 120 $NCU -k regex:"sdpa|fmha|flash|cudnn|attn" --launch-skip 4 --launch-count 2 python3 /tmp/cd.py > $W/ncu-cudnn-decode.txt 2>&1
tar czf $OUT/roof.tgz -C /tmp roof
grep -h -E "^  [a-z_]|Duration|DRAM Throughput|dram__|Registers Per|Block Size|Grid Size|Achieved Occ|Dynamic Shared" $W/ncu-*.txt | grep -v "^  ==" | head -60
