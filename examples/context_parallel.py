"""Long-sequence causal attention across GPUs with PyTorch's context parallelism (ring attention
over NCCL, round-robin "head-tail" load balancing), the local attention run by flashcore and,
for comparison, by SDPA's default backend.

    torchrun --nproc-per-node 2 examples/context_parallel.py --seq 131072
    torchrun --nproc-per-node 2 examples/context_parallel.py --seq 131072 --train

Shapes: batch 1, 32 query heads, 8 KV heads (GQA), head dim 128, bf16, causal. GQA is kept
(SDPA's enable_gqa=True: its flash op takes Hq != Hkv, and CP's ring passes the 8-head K/V
around, 4x less traffic than repeating them); --gqa repeat repeats K/V to 32 heads first.

Prints, per path: median time of one attention call per rank (CUDA events; the slowest rank's
median), the max |difference| against the single-GPU result (flashcore on one GPU, whole
sequence) and the error against float64 on sampled query rows (every rank's shard contributes).
flashcore's path also proves where its local calls ran (flashcore.context_parallel.Calls).

NCCL/NVSHMEM multicast (NVLink SHARP) stays off: set below before any CUDA or NCCL init; on
shared hosts multicast can take the GPUs out of service.
"""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_name] = _value  # before torch touches CUDA or NCCL

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def sampled_reference(q, k, v, rows, scale=None):
    """float64 causal attention (top-left, Sq = Sk) for the query positions `rows` only: q [B, Hq,
    S, D], k/v [B, Hkv, S, D] -> [B, Hq, len(rows), D]. One KV head group at a time, so it fits
    beside 512k-token inputs."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    rows = rows.to(q.device)
    out = torch.empty(b, hq, rows.numel(), d, dtype=torch.float64, device=q.device)
    visible = torch.arange(s, device=q.device)[None, :] <= rows[:, None]  # [R, S]
    for h in range(hkv):
        kh, vh = k[:, h].double(), v[:, h].double()  # [B, S, D]
        qh = q[:, h * g:(h + 1) * g, rows].double()  # [B, g, R, D]
        sc = torch.einsum("bgrd,bsd->bgrs", qh, kh) * scale
        sc = sc.masked_fill(~visible, float("-inf"))
        out[:, h * g:(h + 1) * g] = torch.einsum("bgrs,bsd->bgrd", torch.softmax(sc, dim=-1), vh)
        del sc
    return out


def rel_l2(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def sample_rows(seq, n):
    """`n` query positions spread over the sequence, the first and the last included."""
    return torch.unique(torch.linspace(0, seq - 1, n).round().long())


def median_ms(fn, iters, warmup, cuda=True, barrier=True):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if barrier:  # all ranks start together (not for rank 0's one-GPU run)
            dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def slowest(ms, device):
    t = torch.tensor([ms], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def local_ops(fn):
    """The aten SDPA ops one call ran (names and counts, from the CPU profiler): which backend SDPA
    picked and how many local calls the ring made."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages() if "scaled_dot_product" in e.key}


class _NoCounter:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def log(rank, msg):
    if rank == 0:
        print("[cp] " + msg, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=131072)
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--gqa", choices=("native", "repeat"), default="native")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rows", type=int, default=64, help="query rows checked against float64")
    p.add_argument("--train", action="store_true", help="also time forward + backward (a training step's attention)")
    p.add_argument("--paths", default="flashcore,sdpa",
                   help="flashcore: CP on flashcore; sdpa: CP on SDPA's default backend")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: gloo, a plumbing check for the test suite (which supplies a CPU flash op)")
    p.add_argument("--json", default=None, help="rank 0 appends its results here (one JSON line)")
    args = p.parse_args(argv)

    import flashcore.context_parallel as fcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    mesh = init_device_mesh(args.device, (world,))
    if args.seq % (2 * world):
        raise SystemExit("--seq must be a multiple of 2 x world size (round-robin load balancing)")

    torch.manual_seed(0)  # the same full tensors on every rank
    dt = getattr(torch, args.dtype)
    q = torch.randn(1, args.hq, args.seq, args.dim, device=dev, dtype=dt)
    k = torch.randn(1, args.hkv, args.seq, args.dim, device=dev, dtype=dt)
    v = torch.randn(1, args.hkv, args.seq, args.dim, device=dev, dtype=dt)
    gqa = args.hq != args.hkv and args.gqa == "native"
    if args.hq != args.hkv and not gqa:
        k, v = (t.repeat_interleave(args.hq // args.hkv, dim=1) for t in (k, v))
    grad = torch.randn(q.shape, device=dev, dtype=dt) if args.train else None
    rows = sample_rows(args.seq, args.rows)
    res = {"world": world, "seq": args.seq, "hq": args.hq, "hkv": args.hkv, "d": args.dim, "gqa": args.gqa,
           "dtype": args.dtype, "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
           "torch": str(torch.__version__)}
    paths = args.paths.split(",")

    def attn(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=gqa)

    def timed(fn):
        return median_ms(fn, args.iters, args.warmup, cuda)

    # One GPU, whole sequence (rank 0, flashcore): the result CP is compared with, the time it speeds up.
    single = ref = single_grads = None
    if rank == 0:
        with fcp.local_attention() as calls:
            single = attn(q, k, v)
            if world > 1:
                res["single_flashcore_ms"] = median_ms(lambda: attn(q, k, v), args.iters, args.warmup, cuda, False)
            if args.train:
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                attn(*leaves).backward(grad)
                single_grads = [t.grad.clone() for t in leaves]
                if world > 1:
                    res["single_train_flashcore_ms"] = median_ms(lambda: attn(*leaves).backward(grad), args.iters,
                                                                 args.warmup, cuda, False)
                del leaves
        calls.require()  # none fell back
        ref = sampled_reference(q, k, v, rows)
        res["single_vs_fp64_max_abs"] = (single[:, :, rows].double() - ref).abs().max().item()
        res["single_vs_fp64_rel_l2"] = rel_l2(single[:, :, rows], ref)
        log(rank, "one GPU done: %s" % {k_: v_ for k_, v_ in res.items() if k_.startswith("single")})
    dist.barrier()

    for path in paths:
        bufs = [q.clone(), k.clone(), v.clone()]
        counter = fcp.local_attention() if path == "flashcore" else _NoCounter()
        with counter as calls, context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2],
                                                no_restore_buffers=set(bufs)):
            out = attn(*bufs)
            ops = local_ops(lambda: attn(*bufs))
            ms = timed(lambda: attn(*bufs))
        if calls is not None:
            calls.require(forward=fcp.local_calls(world) * (2 + args.iters + args.warmup))  # all on flashcore
            res[path + "_calls"] = repr(calls)
        full = context_parallel_unshard(mesh, [out], [2])[0]
        res[path + "_cp_ms"] = slowest(ms, dev)
        res[path + "_ops"] = ops
        if rank == 0:
            res[path + "_cp_vs_single_max_abs"] = (full.float() - single.float()).abs().max().item()
            res[path + "_cp_vs_fp64_max_abs"] = (full[:, :, rows].double() - ref).abs().max().item()
            res[path + "_cp_vs_fp64_rel_l2"] = rel_l2(full[:, :, rows], ref)
        del out, full, bufs
        log(rank, "%s forward done: %.2f ms" % (path, res[path + "_cp_ms"]))

        if args.train:
            bufs = [q.clone(), k.clone(), v.clone(), grad.clone()]
            counter = fcp.local_attention() if path == "flashcore" else _NoCounter()
            with counter as calls, context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4,
                                                    no_restore_buffers=set(bufs)):
                leaves = [t.detach().requires_grad_() for t in bufs[:3]]
                attn(*leaves).backward(bufs[3])
                grads = [t.grad.clone() for t in leaves]
                ms = timed(lambda: attn(*leaves).backward(bufs[3]))
            if calls is not None:
                n = fcp.local_calls(world) * (1 + args.iters + args.warmup)
                calls.require(forward=n, backward=n)
                res[path + "_train_calls"] = repr(calls)
            res[path + "_cp_train_ms"] = slowest(ms, dev)
            full = context_parallel_unshard(mesh, grads, [2, 2, 2])
            if rank == 0:
                for name, g, s in zip("qkv", full, single_grads):
                    res[path + "_cp_d%s_vs_single_max_abs" % name] = (g.float() - s.float()).abs().max().item()
                    res[path + "_cp_d%s_vs_single_rel_l2" % name] = rel_l2(g, s)
            del leaves, grads, full, bufs
            log(rank, "%s forward+backward done: %.2f ms" % (path, res[path + "_cp_train_ms"]))

    if rank == 0:
        for path in paths:
            for kind in ("", "train_"):
                one, cp = res.get("single_%sflashcore_ms" % kind), res.get("%s_cp_%sms" % (path, kind))
                if one and cp:
                    res["%s_%sspeedup_vs_one_gpu" % (path, kind)] = one / cp
        for kind in ("", "train_"):
            if "flashcore_cp_%sms" % kind in res and "sdpa_cp_%sms" % kind in res:
                ratio = res["flashcore_cp_%sms" % kind] / res["sdpa_cp_%sms" % kind]
                res["flashcore_over_sdpa_cp_%stime" % kind] = ratio
        print(json.dumps(res, indent=1), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    t0 = time.time()
    main()
    print("wall %.1f s" % (time.time() - t0), flush=True)
