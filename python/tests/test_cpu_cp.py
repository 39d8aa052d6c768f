"""CPU tests of flashcore.context_parallel (the glue that sends torch's context-parallel local
SDPA calls to flashcore) and of the example's float64 checker: no GPU needed."""

import importlib.util
import json
import math
import pathlib

import pytest
import torch

import flashcore
import flashcore.context_parallel as fcp

needs_registry = pytest.mark.skipif(not fcp.available(),
                                    reason="SKIPPED: torch has no flash registry / context_parallel")


def test_available_on_the_pinned_torch():
    # scripts/python-tests.sh pins torch 2.11, which has both hooks: the glue must not go missing there.
    if torch.__version__.startswith("2.11"):
        assert fcp.available()


@pytest.mark.parametrize("world, causal, load_balance, rank, want", [
    (1, True, True, 0, 1), (2, True, True, 1, 2), (4, True, True, 0, 4), (4, True, False, 0, 1),
    (4, True, False, 3, 4), (4, False, False, 2, 4), (3, False, False, 0, 3)])
def test_local_calls(world, causal, load_balance, rank, want):
    assert fcp.local_calls(world, causal, load_balance, rank) == want


@pytest.mark.parametrize("args, match", [
    ((0,), "world_size"), ((2.0,), "world_size"), ((2, True, True, 2), "rank"), ((2, True, True, -1), "rank"),
    ((2, False, True), "load-balances causal attention only")])
def test_local_calls_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        fcp.local_calls(*args)


@needs_registry
def test_local_attention_activates_then_restores():
    from torch.backends.cuda import flash_sdp_enabled, mem_efficient_sdp_enabled

    assert torch.nn.attention.current_flash_attention_impl() is None
    with fcp.local_attention() as calls:
        assert torch.nn.attention.current_flash_attention_impl() == "flashcore"
        assert flash_sdp_enabled() and not mem_efficient_sdp_enabled()  # SDPA limited to its flash backend
        assert repr(calls) == "Calls(served=0, fallback=0, backward=0, fallback_backward=0)"
        calls.require(forward=0, backward=0)
    assert torch.nn.attention.current_flash_attention_impl() is None
    assert mem_efficient_sdp_enabled()
    with pytest.raises(KeyError):  # restored on an exception too
        with fcp.local_attention():
            raise KeyError("x")
    assert torch.nn.attention.current_flash_attention_impl() is None


@needs_registry
def test_local_attention_restores_another_active_impl(monkeypatch):
    registry = torch.nn.attention._registry
    monkeypatch.setitem(registry._FLASH_ATTENTION_IMPLS, "other", lambda: None)
    torch.nn.attention.activate_flash_attention_impl("other")  # returns no handle: nothing recorded
    monkeypatch.setattr(registry, "_FLASH_ATTENTION_ACTIVE", ("other", None))
    activated = []
    real = torch.nn.attention.activate_flash_attention_impl
    monkeypatch.setattr(torch.nn.attention, "activate_flash_attention_impl", lambda n: (activated.append(n), real(n)))
    with fcp.local_attention():
        assert torch.nn.attention.current_flash_attention_impl() == "flashcore"
    assert activated == ["flashcore", "other"]
    torch.nn.attention.restore_flash_attention_impl()


@needs_registry
@pytest.mark.parametrize("key, match", [
    ("fallback", "fell back"), ("fallback_backward", "fell back"),
    ("flashcore", "expected 2 local forward"), ("backward", "expected 2 local backward")])
def test_require_rejects_fallbacks_and_wrong_counts(key, match):
    want = {"flashcore": {"forward": 2}, "backward": {"forward": 0, "backward": 2}}.get(key, {})
    with fcp.local_attention() as calls:
        flashcore.sdpa_backend.stats[key] += 1  # as a local call that took that path would
        try:
            with pytest.raises(RuntimeError, match=match):
                calls.require(**want)
        finally:
            flashcore.sdpa_backend.stats[key] -= 1


@needs_registry
def test_require_accepts_exact_counts():
    with fcp.local_attention() as calls:
        flashcore.sdpa_backend.stats["flashcore"] += 3
        flashcore.sdpa_backend.stats["backward"] += 3
        try:
            assert (calls.served, calls.backward, calls.fallback) == (3, 3, 0)
            calls.require(forward=3, backward=3)
            calls.require()
        finally:
            flashcore.sdpa_backend.stats["flashcore"] -= 3
            flashcore.sdpa_backend.stats["backward"] -= 3


def test_local_attention_without_the_registry_raises(monkeypatch):
    monkeypatch.setattr(flashcore.sdpa_backend, "available", lambda: False)
    assert not fcp.available()
    with pytest.raises(RuntimeError, match="needs torch >= 2.10"):
        with fcp.local_attention():
            pass


def _example():
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "context_parallel.py"
    spec = importlib.util.spec_from_file_location("cp_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_turns_multicast_off():
    _example()
    import os

    assert (os.environ["NCCL_NVLS_ENABLE"], os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
            os.environ["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")


@pytest.mark.parametrize("hkv", [1, 2, 4])
def test_example_sampled_reference_matches_full_float64(hkv):
    ex = _example()
    torch.manual_seed(hkv)
    q, k, v = torch.randn(2, 4, 37, 16), torch.randn(2, hkv, 37, 16), torch.randn(2, hkv, 37, 16)
    rows = ex.sample_rows(37, 9)
    assert rows[0] == 0 and rows[-1] == 36 and len(rows) == 9
    got = ex.sampled_reference(q, k, v, rows)
    kk, vv = (t.double().repeat_interleave(4 // hkv, 1) for t in (k, v))
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(16)
    s = s.masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), float("-inf"))
    want = (torch.softmax(s, -1) @ vv)[:, :, rows]
    assert got.dtype == torch.float64 and (got - want).abs().max().item() < 1e-12


@needs_registry
@pytest.mark.parametrize("world, gqa", [(2, "native"), (3, "repeat")])
def test_example_end_to_end_on_cpu_ranks(tmp_path, world, gqa):
    """examples/context_parallel.py on `world` CPU ranks (gloo) with a CPU flash op
    (cp_cpu_harness): torch's ring with load balancing, CP's results against one rank's, the
    training step's gradients, the call counts the example requires; the flashcore path and the
    SDPA path give the same numbers here (the same CPU op serves both)."""
    import socket

    import torch.multiprocessing as mp

    import cp_cpu_harness

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "res.json"
    argv = ["--device", "cpu", "--dtype", "float32", "--seq", str(24 * world), "--hq", "4", "--hkv", "2",
            "--dim", "16", "--iters", "2", "--warmup", "1", "--rows", "7", "--train", "--gqa", gqa]
    mp.spawn(cp_cpu_harness.worker, args=(world, port, argv, str(out)), nprocs=world, join=True)
    res = json.loads(out.read_text())
    assert res["world"] == world and res["single_vs_fp64_max_abs"] < 1e-5
    for path in ("flashcore", "sdpa"):
        assert res[path + "_cp_vs_single_max_abs"] < 1e-5, res
        assert res[path + "_cp_vs_fp64_max_abs"] < 1e-5, res
        for name in "qkv":
            assert res[path + "_cp_d%s_vs_single_rel_l2" % name] < 1e-5, res
        assert res[path + "_ops"]["aten::_scaled_dot_product_flash_attention"] >= world
    n = fcp.local_calls(world) * (2 + 2 + 1)
    assert res["flashcore_calls"] == "Calls(served=%d, fallback=0, backward=0, fallback_backward=0)" % n
    t = fcp.local_calls(world) * (1 + 2 + 1)
    assert res["flashcore_train_calls"] == "Calls(served=%d, fallback=0, backward=%d, fallback_backward=0)" % (t, t)
