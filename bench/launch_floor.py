"""The launch floor of graph replay on this GPU: one tiny kernel per call (a one-element add),
captured `calls` times in a CUDA graph and replayed, timed with events exactly as bench/sdpa.py
times attention (median per call). No attention kernel can finish a call in less."""
import statistics
import sys

import torch

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
x = torch.zeros(1, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        x.add_(1)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(calls):
        x.add_(1)
for _ in range(10):
    g.replay()
times = []
for _ in range(reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    times.append(a.elapsed_time(b) * 1000 / calls)
print(f"launch floor ({torch.cuda.get_device_name()}): graph of {calls} one-element kernels, "
      f"median {statistics.median(times):.2f} µs per call, min {min(times):.2f}")
