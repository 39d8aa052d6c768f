"""GPU: flashcore's forward launched as a programmatic dependent right after
PyTorch kernels that write its inputs — cuBLAS GEMMs projecting Q, K, V, then an elementwise
kernel on Q as its immediate predecessor — eagerly and replayed from a CUDA graph (where the
launch attribute becomes a programmatic edge). The attention waits (`griddepcontrol.wait`) before
its first global read; a missing wait would read the buffers before the projections fill them."""

import pytest
import torch

import flashcore
import gpu_gate
from test_gpu import TOL, reference, rel_l2

pytestmark = gpu_gate.skip_without_gpu


def _project(x, wq, wk, wv, b, s, h, d):
    k = (x @ wk).view(b, s, h, d)
    v = (x @ wv).view(b, s, h, d)
    q = (x @ wq).view(b, s, h, d).mul_(0.5)  # the attention's immediate predecessor writes Q
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 512, 8, 64, False), (2, 1000, 4, 128, True)])
@pytest.mark.parametrize("graph", [False, True])
def test_projections_then_attention(dtype, shape, graph):
    b, s, h, d, causal = shape
    width = 1024
    x = torch.randn(b * s, width, device="cuda").to(dtype)
    wq, wk, wv = (torch.randn(width, h * d, device="cuda").div(width**0.5).to(dtype) for _ in range(3))

    def step():
        q, k, v = _project(x, wq, wk, wv, b, s, h, d)
        return q, k, v, flashcore.attention(q, k, v, causal=causal)

    if not graph:
        for _ in range(3):
            x.copy_(torch.randn_like(x))
            q, k, v, out = step()
            torch.cuda.synchronize()
            assert torch.isfinite(out).all()
            assert rel_l2(out, reference(q, k, v, causal)[0]) < TOL[dtype]
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (cuBLAS workspaces, the kernel's load) before capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        q, k, v, out = step()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()
        assert rel_l2(out, reference(q, k, v, causal)[0]) < TOL[dtype]
