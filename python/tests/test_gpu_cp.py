"""GPU tests of flashcore under PyTorch's context parallelism (flashcore.context_parallel):

- world size 1, a real NCCL process group (FileStore): `context_parallel` with flashcore's flash
  backend gives the bits of the same call without CP (forward and gradients), and fp64's values;
- world sizes 2 and 4 on one GPU: torch's own ring functions (`_templated_ring_attention` and its
  backward) run rank by rank in threads, their collectives replaced by in-process exchanges, so
  every local call CP makes (square causal, non-causal Sq != Sk, the strided second half of the
  query shard, backward with the merged output and LSE) runs on flashcore; merged results against
  float64.

Skip visibly without an sm_90 GPU; FLASHCORE_REQUIRE_GPU=1 turns the skips into failures."""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)  # multicast stays off (before NCCL starts)

import math  # noqa: E402
import queue  # noqa: E402
import threading  # noqa: E402
import types  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashcore  # noqa: E402
import flashcore.context_parallel as fcp  # noqa: E402
import gpu_gate  # noqa: E402

pytestmark = [gpu_gate.skip_without_gpu,
              pytest.mark.skipif(not fcp.available(), reason="SKIPPED: torch has no flash registry / context_parallel")]

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
aten = torch.ops.aten


def rel_l2(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda").to(dtype)


def reference(q, k, v, causal):
    """float64 SDPA (causal top-left, Sq = Sk) on [B, H, S, D]; returns (out, lse)."""
    q, k, v = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def poison(*ts):
    for t in ts:
        t.fill_(float("nan"))


# --- world size 1: the real context_parallel over a one-rank NCCL group ----------------------------


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path_factory.mktemp("cp") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        yield init_device_mesh("cuda", (1,))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def load_balance(request):
    from torch.distributed.tensor.experimental._attention import _cp_options

    old = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = request.param
    yield request.param
    _cp_options.enable_load_balance = old


@pytest.mark.parametrize("load_balance, causal", [(True, True), (False, True), (False, False)],
                         indirect=["load_balance"])
@pytest.mark.parametrize("gqa", [True, False])
@pytest.mark.parametrize("seq", [1000, 2048])
def test_world_size_1_matches_flashcore_without_cp(mesh, load_balance, causal, gqa, seq):
    from torch.distributed.tensor.experimental import context_parallel

    torch.manual_seed(seq + 2 * gqa + causal)
    hkv = 2 if gqa else 8
    q, k, v = randn(2, 8, seq, 128), randn(2, hkv, seq, 128), randn(2, hkv, seq, 128)
    original = F.scaled_dot_product_attention
    with fcp.local_attention() as plain:  # the same hook, no CP
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    plain.require(forward=1)
    bufs = [q.clone(), k.clone(), v.clone()]
    with fcp.local_attention() as calls, context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
        assert F.scaled_dot_product_attention is not original  # CP's patched SDPA
        got = F.scaled_dot_product_attention(*bufs, is_causal=causal, enable_gqa=gqa)
    assert F.scaled_dot_product_attention is original
    calls.require(forward=fcp.local_calls(1, causal, load_balance))
    assert torch.equal(got, want)  # one local call; the merge's fp32 round trip is exact
    ref, _ = reference(q, k, v, causal)
    assert not got.isnan().any() and rel_l2(got, ref) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("gqa", [True, False])
def test_world_size_1_gradients_match_flashcore_without_cp(mesh, gqa):
    from torch.distributed.tensor.experimental import context_parallel

    torch.manual_seed(7 + gqa)
    hkv = 2 if gqa else 8
    q, k, v = randn(1, 8, 1024, 128), randn(1, hkv, 1024, 128), randn(1, hkv, 1024, 128)
    do = randn(1, 8, 1024, 128)

    def grads(bufs, grad):
        leaves = [t.detach().requires_grad_() for t in bufs]
        F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=gqa).backward(grad)
        return [t.grad for t in leaves]

    with fcp.local_attention() as plain:
        want = grads([q, k, v], do)
    plain.require(forward=1, backward=1)
    bufs = [q.clone(), k.clone(), v.clone(), do.clone()]
    with fcp.local_attention() as calls, context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * 4):
        got = grads(bufs[:3], bufs[3])
    calls.require(forward=1, backward=1)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference(*leaves, True)[0].backward(do.double())
    for g, t in zip(got, leaves):
        assert not g.isnan().any() and rel_l2(g, t.grad) <= TOL[torch.bfloat16]


# --- world sizes 2 and 4 on one GPU: torch's ring functions, rank by rank ---------------------------


class _Ring:
    """In-process stand-in for CP's collectives: one thread per rank, one running at a time (a lock
    released only while a rank waits for its neighbour's gradients), so call counts stay exact."""

    def __init__(self, world, kv):
        self.world, self.kv = world, kv  # kv[r]: rank r's flattened (K, V), what all-gather returns
        self.inbox = [queue.Queue() for _ in range(world)]
        self.lock = threading.Lock()
        self.local = threading.local()

    def rotater(self, pg, seq_dim, method=None):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp

        return _Rotater(self, (method or cp._cp_options.rotate_method) == cp._RotateMethod.ALL_TO_ALL)

    def run(self, fn):
        results, errors = [None] * self.world, []

        def body(r):
            self.local.rank = r
            with self.lock:
                try:
                    results[r] = fn(r)
                except BaseException as e:  # reported by the main thread
                    errors.append(e)

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


class _Rotater:
    def __init__(self, ring, to_next):
        self.ring, self.to_next, self.sent = ring, to_next, 0

    def exchange_buffers(self, buf):
        r, w = self.ring.local.rank, self.ring.world
        if self.to_next:  # all-to-all: this rank's buffer goes to rank + 1
            self.ring.inbox[(r + 1) % w].put(buf)
        self.sent += 1

    def next_buffer(self):
        r, w = self.ring.local.rank, self.ring.world
        if not self.to_next:  # all-gather: after i exchanges, rank - i's K/V
            return self.ring.kv[(r - self.sent) % w]
        self.ring.lock.release()
        try:
            return self.ring.inbox[r].get(timeout=120)
        finally:
            self.ring.lock.acquire()


def _shard_index(seq, world, rank, load_balance):
    """The sequence positions rank `rank` holds: chunks r and 2W-1-r of 2W (head-tail), or chunk r of W."""
    if load_balance:
        c = seq // (2 * world)
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(seq - (rank + 1) * c, seq - rank * c)])
    c = seq // world
    return torch.arange(rank * c, (rank + 1) * c)


@pytest.fixture
def fake_dist(monkeypatch):
    """torch's ring module with dist.get_rank / get_world_size answering per thread."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    def install(ring):
        monkeypatch.setattr(cp, "dist", types.SimpleNamespace(
            ProcessGroup=object, get_rank=lambda g=None: ring.local.rank, get_world_size=lambda g=None: ring.world))
        monkeypatch.setattr(cp, "_create_rotater", ring.rotater)
        return cp

    return install


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("load_balance, causal", [(True, True), (False, True), (False, False)],
                         indirect=["load_balance"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ring_forward_and_backward_on_flashcore(fake_dist, world, load_balance, causal, dtype):
    torch.manual_seed(world * 10 + causal + load_balance)
    b, hq, hkv, seq, d = 1, 8, 2, 1040 if world == 2 else 1008, 128  # local chunks of 260 / 126 rows
    q, k, v, do = randn(b, hq, seq, d, dtype=dtype), randn(b, hkv, seq, d, dtype=dtype), \
        randn(b, hkv, seq, d, dtype=dtype), randn(b, hq, seq, d, dtype=dtype)
    idx = [_shard_index(seq, world, r, load_balance).cuda() for r in range(world)]
    shard = [[t[:, :, i].contiguous() for t in (q, k, v, do)] for i in idx]
    ring = _Ring(world, [torch.cat([s[1].flatten(), s[2].flatten()]) for s in shard])
    cp = fake_dist(ring)

    with fcp.local_attention() as calls:
        fwd = ring.run(lambda r: cp._templated_ring_attention(
            object(), 2, aten._scaled_dot_product_flash_attention, query=shard[r][0], key=shard[r][1],
            value=shard[r][2], is_causal=causal, dropout_p=0.0, scale=None))
        bwd = ring.run(lambda r: cp._templated_ring_attention_backward(
            object(), 2, aten._scaled_dot_product_flash_attention_backward.default, grad_out=shard[r][3],
            grad_out_name="grad_out", query=shard[r][0], key=shard[r][1], value=shard[r][2], out=fwd[r][0],
            logsumexp=fwd[r][1], is_causal=causal, cum_seq_q=None, cum_seq_k=None, max_q=0, max_k=0,
            dropout_p=0.0, philox_seed=None, philox_offset=None, scale=None))
    n = sum(fcp.local_calls(world, causal, load_balance, r) for r in range(world))
    calls.require(forward=n, backward=n)  # every local call of every rank ran on flashcore

    out, lse = torch.empty_like(q), torch.empty(b, hq, seq, device="cuda")
    grads = [torch.empty_like(t) for t in (q, k, v)]
    poison(out, lse, *grads)
    for r, i in enumerate(idx):
        out[:, :, i], lse[:, :, i] = fwd[r][0], fwd[r][1]
        for g, part in zip(grads, bwd[r][:3]):
            g[:, :, i] = part
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = reference(*leaves, causal)
    ref.backward(do.double())
    assert not out.isnan().any() and rel_l2(out, ref) <= TOL[dtype]
    assert not lse.isnan().any() and (lse.double() - ref_lse).abs().max().item() <= 1e-3
    for g, t in zip(grads, leaves):
        assert not g.isnan().any() and rel_l2(g, t.grad) <= TOL[dtype], rel_l2(g, t.grad)


def test_ring_local_calls_without_flashcore_activated_are_not_counted(fake_dist):
    """The proof cannot be faked by torch's own kernel: outside local_attention the ring runs on
    PyTorch's flash kernel and flashcore's counters do not move."""
    world, seq = 2, 512
    q, k, v = randn(1, 4, seq, 128), randn(1, 4, seq, 128), randn(1, 4, seq, 128)
    idx = [_shard_index(seq, world, r, True).cuda() for r in range(world)]
    shard = [[t[:, :, i].contiguous() for t in (q, k, v)] for i in idx]
    ring = _Ring(world, [torch.cat([s[1].flatten(), s[2].flatten()]) for s in shard])
    cp = fake_dist(ring)
    before = dict(flashcore.sdpa_backend.stats)
    fwd = ring.run(lambda r: cp._templated_ring_attention(
        object(), 2, aten._scaled_dot_product_flash_attention, query=shard[r][0], key=shard[r][1],
        value=shard[r][2], is_causal=True, dropout_p=0.0, scale=None))
    assert flashcore.sdpa_backend.stats == before
    out = torch.empty_like(q)
    for r, i in enumerate(idx):
        out[:, :, i] = fwd[r][0]
    assert rel_l2(out, reference(q, k, v, True)[0]) <= TOL[torch.bfloat16]
