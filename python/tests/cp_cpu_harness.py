"""Runs examples/context_parallel.py on CPU ranks (gloo) for test_cpu_cp.py: a plumbing check of
the example (sharding, torch's ring, unsharding, the comparisons, the training step, the call
counts) without GPUs. SDPA's CPU kernels are not ops CP rings, so this supplies CPU kernels for
``aten::_scaled_dot_product_flash_attention`` and its backward (float64 math; the backward from
the LSE it is given, as a ring's local backward must) and points F.scaled_dot_product_attention at
that op. While flashcore's backend is active they count in its stats as flashcore's CUDA kernels would."""

import importlib.util
import json
import math
import os
import pathlib
import sys

import torch
import torch.nn.functional as F

import flashcore


def _active():
    return torch.nn.attention.current_flash_attention_impl() == "flashcore"


def _expand(q, k, v):
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), rep


def _scores(q, k, is_causal, scale):
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return s


def flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if _active():
        flashcore.sdpa_backend.stats["flashcore"] += 1
    k, v, _ = _expand(query.double(), key.double(), value.double())
    s = _scores(query.double(), k, is_causal, scale)
    lse = torch.logsumexp(s, -1)
    out = (torch.softmax(s, -1) @ v).to(query.dtype)
    # As flashcore's backend: no cum_seq tensors, a 2-element RNG state, a 0-dim `unused`.
    return (out, lse.float(), None, None, query.shape[2], key.shape[2], torch.zeros(2, dtype=torch.int64),
            torch.zeros((), dtype=torch.int64), torch.empty(0, dtype=query.dtype))


def flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, philox_seed, philox_offset, *, scale=None):
    if _active():
        flashcore.sdpa_backend.stats["backward"] += 1
    q, do, o = query.double(), grad_out.double(), out.double()
    k, v, rep = _expand(q, key.double(), value.double())
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(_scores(q, k, is_causal, scale) - logsumexp.double().unsqueeze(-1))  # the given (global) LSE
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    dq, dk = (ds @ k) * sc, (ds.transpose(-1, -2) @ q) * sc
    b, hkv, sk, d = key.shape
    if rep > 1:
        dk, dv = (g.view(b, hkv, rep, sk, d).sum(2) for g in (dk, dv))
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    assert attn_mask is None and dropout_p == 0.0
    # As SDPA's C++ front end calls it: the keyword-only scale only when one is given.
    kw = {} if scale is None else {"scale": scale}
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal, **kw)[0]


def worker(rank, world, port, argv, out):
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    lib = torch.library.Library("aten", "IMPL", "CPU")  # noqa: TOR901
    lib.impl("_scaled_dot_product_flash_attention", flash_forward, "CPU")
    lib.impl("_scaled_dot_product_flash_attention_backward", flash_backward, "CPU")
    # CP re-binds F.<fn.__name__> to its wrapper: the stand-in keeps SDPA's name.
    F.scaled_dot_product_attention = scaled_dot_product_attention
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "context_parallel.py"
    spec = importlib.util.spec_from_file_location("cp_example", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    res = ex.main(argv)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    # Leave without the interpreter's teardown: on a 2-core CI machine a rank aborted there
    # ("terminate called without an active exception", SIGABRT) after its work was done, from a
    # runtime thread (gloo / the CPU profiler) destroyed while still joinable.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
