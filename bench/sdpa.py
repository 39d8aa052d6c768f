#!/usr/bin/env python3
"""PyTorch SDPA and FlashAttention-4 side by side with `flashcore bench`.

Times torch.nn.functional.scaled_dot_product_attention with each backend (flash, cuDNN,
efficient; torch.nn.attention.sdpa_kernel) and, when `flash_attn.cute` imports (the
`flash-attn-4` package; scripts/prepare-fa4.sh installs it on the GPU machine), FlashAttention-4's
`flash_attn.cute.flash_attn_func` on the same shapes and suites, with the same method
(random inputs uploaded once and rotated over buffer sets whose inputs exceed 2x L2, warm-up,
per-call device events, CUDA-graph replay of N calls divided by N) and the same statistics, and
writes the same JSON schema as flashcore (docs/bench-json.md), with `implementation` set to
"sdpa-flash", "sdpa-cudnn", "sdpa-efficient" or "fa4". A backend that fails on a shape is recorded as
skipped with the reason. `--backends flashcore-torch` also times the `flashcore` Python package's op
(`flashcore.attention`, records named "flashcore-torch"): the kernels on the path PyTorch users take.

    python3 bench/sdpa.py --suite seed --json sdpa.json
    python3 bench/sdpa.py --heads 16 --seqlen 4096 --headdim 128 --causal --dtype bf16
    python3 bench/sdpa.py --suite backward --backward --json sdpa-bwd.json
    python3 bench/sdpa.py --heads 16 --heads-kv 8 --seqlen 8192 --headdim 256 --causal --window 4095,0

`--window LEFT,RIGHT` (ad-hoc shapes; flash-attn's `window_size`, -1 unbounded, bottom-right
aligned as flashcore's) gives FA4 and flashcore-torch their native windows and SDPA's cuDNN and
efficient backends the same window as a boolean mask (SDPA's flash backend takes no mask: skipped
with the reason). FLOPs still count the whole (or causal) matrix, as `flashcore bench`: compare times.

`--backward` times, per backend, the backward alone (`torch.autograd.grad` of one forward's output,
kept with `retain_graph`, against a random dO: the backward kernels and autograd's bookkeeping)
and a forward then backward, eager calls bracketed by device events (no graph replay), as
`flashcore bench --backward` does; records carry `"pass": "backward"` / `"forward+backward"` and
FLOPs 2.5x / 3.5x the forward's.

The pure parts (statistics, shapes, argument parsing, records) need no torch:
`python3 bench/sdpa.py --self-test` prints them as JSON (the Rust tests compare them with
flashcore's), `--print-shapes` lists the shapes a command line selects.
"""

import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import subprocess
import sys

SCHEMA = "flashcore-bench"
VERSION = 1
BACKENDS = ("flash", "cudnn", "efficient", "fa4", "flashcore-torch")
# FlashAttention-4 is not part of PyTorch: it is timed only when asked for or when it imports.
SDPA_BACKENDS = ("flash", "cudnn", "efficient")
DTYPES = ("f16", "bf16")
LAYOUTS = ("bshd", "bhsd")

# Defaults shared with `flashcore bench` (src/bench/timing.rs TimingConfig::default).
DEFAULT_WARMUP = 20
DEFAULT_REPS = 200
DEFAULT_GRAPH_CALLS = 20
DEFAULT_GRAPH_REPS = 50
CHUNK = 64
MEM_FRACTION = 0.8
DEFAULT_SEED = 0x5EED


# ----------------------------------------------------------------------------------------------
# Statistics: identical to src/bench/stats.rs.

def percentile(sorted_xs, p):
    """p-th percentile (0..100) of ascending samples, linear interpolation between closest ranks
    (Hyndman-Fan type 7, numpy's default): rank h = (n-1)*p/100."""
    if not sorted_xs or not (0.0 <= p <= 100.0):
        return None
    h = (len(sorted_xs) - 1) * p / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (h - lo) * (sorted_xs[hi] - sorted_xs[lo])


def stats(samples):
    """min/median/mean/p95/p99/max/stddev (ddof 1) of samples; None if empty or not finite."""
    if not samples or any(not math.isfinite(x) for x in samples):
        return None
    s = sorted(float(x) for x in samples)
    n = len(s)
    # Plain left-to-right sums over the sorted samples, as Rust's iter().sum() does: same bits.
    mean = sum(s) / n
    sd = math.sqrt(sum((x - mean) * (x - mean) for x in s) / (n - 1)) if n > 1 else 0.0
    return {
        "n": n,
        "min": s[0],
        "median": percentile(s, 50.0),
        "mean": mean,
        "p95": percentile(s, 95.0),
        "p99": percentile(s, 99.0),
        "max": s[-1],
        "stddev": sd,
    }


def tflops(flops, time_us):
    return flops / (time_us * 1e-6) / 1e12 if time_us > 0 else None


PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}


def flop_count(shape, pass_="forward"):
    """flash-attn's count: 4*B*Hq*Sq*Sk*D, halved for causal with Sq == Sk; times 2.5 for the
    backward, 3.5 for forward+backward (src/bench/record.rs Pass::flop_factor)."""
    f = 4.0 * shape["batch"] * shape["heads_q"] * shape["seqlen_q"] * shape["seqlen_k"] * shape["head_dim"]
    if shape["causal"] and shape["seqlen_q"] == shape["seqlen_k"]:
        f /= 2.0
    return f * PASS_FLOPS[pass_]


# ----------------------------------------------------------------------------------------------
# Shapes: identical to src/bench/suites.rs.

def make_shape(b, h, s, d, causal, layout="bshd", heads_kv=None, seqlen_k=None):
    return {
        "batch": b,
        "heads_q": h,
        "heads_kv": h if heads_kv is None else heads_kv,
        "seqlen_q": s,
        "seqlen_k": s if seqlen_k is None else seqlen_k,
        "head_dim": d,
        "causal": bool(causal),
        "layout": layout,
    }


SEED_SHAPES = [
    (1, 8, 512, 64, False),
    (1, 8, 512, 64, True),
    (1, 16, 1024, 64, True),
    (16, 16, 2048, 64, False),
    (16, 16, 2048, 64, True),
    (2, 16, 8192, 128, False),
    (2, 16, 8192, 128, True),
    (1, 16, 16384, 128, False),
]


def seed_suite(layout="bshd"):
    return [(dt, make_shape(b, h, s, d, c, layout)) for dt in DTYPES for (b, h, s, d, c) in SEED_SHAPES]


def fa3_suite(layout="bshd"):
    out = []
    for dt in DTYPES:
        for d in (64, 128, 256):
            for causal in (False, True):
                for s in (512, 1024, 2048, 4096, 8192, 16384):
                    out.append((dt, make_shape(16384 // s, 2048 // d, s, d, causal, layout)))
    return out


DECODE_SHAPES = [
    (32, 8, 128, [(1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (32, 4096), (32, 16384), (128, 1024), (128, 4096)]),
    (8, 1, 128, [(1, 131072), (8, 32768), (32, 8192), (128, 2048)]),
    (16, 16, 64, [(1, 32768), (8, 8192), (64, 1024), (128, 4096)]),
]


def decode_suite(layout="bshd"):
    out = []
    for sq, causal in ((1, False), (4, True)):
        for hq, hkv, d, shapes in DECODE_SHAPES:
            for b, sk in shapes:
                out.append(("bf16", make_shape(b, hq, sq, d, causal, layout, heads_kv=hkv, seqlen_k=sk)))
    return out


BACKWARD_SHAPES = [
    (2, 16, 8192, 128, False),
    (2, 16, 8192, 128, True),
    (8, 16, 2048, 128, False),
    (8, 32, 2048, 64, False),
    (2, 32, 8192, 64, True),
    (32, 16, 512, 128, True),
]


def backward_suite(layout="bshd"):
    """The training shapes, bf16 (for --backward)."""
    return [("bf16", make_shape(b, h, s, d, c, layout)) for (b, h, s, d, c) in BACKWARD_SHAPES]


SUITES = {"seed": seed_suite, "fa3": fa3_suite, "decode": decode_suite, "backward": backward_suite}


def label(shape):
    heads = str(shape["heads_q"]) if shape["heads_q"] == shape["heads_kv"] else "%d/%d" % (shape["heads_q"], shape["heads_kv"])
    seq = str(shape["seqlen_q"]) if shape["seqlen_q"] == shape["seqlen_k"] else "%d/%d" % (shape["seqlen_q"], shape["seqlen_k"])
    win = " window %d,%d" % tuple(shape["window"]) if shape.get("window") else ""
    return "b%d h%s s%s d%d%s%s" % (shape["batch"], heads, seq, shape["head_dim"], " causal" if shape["causal"] else "", win)


# ----------------------------------------------------------------------------------------------
# Rotation: identical to src/bench/timing.rs.

def sets_needed(l2_bytes, input_bytes, set_bytes, max_total_bytes):
    want = 2 if input_bytes == 0 else max(2, -(-2 * l2_bytes // input_bytes))
    fit = max_total_bytes // set_bytes if set_bytes else want
    return int(min(want, fit))


def graph_schedules(sets, calls):
    sets, calls = max(sets, 1), max(calls, 1)
    return [[(g * calls + i) % sets for i in range(calls)] for g in range(-(-sets // calls))]


def set_bytes(shape, elem=2, backward=False):
    """(bytes one call reads, bytes one buffer set holds); `backward`: the backward's (q, k, v,
    o, dO and the fp32 LSE read; dq, dk, dv written), as src/bench/backward.rs counts them."""
    q = shape["batch"] * shape["seqlen_q"] * shape["heads_q"] * shape["head_dim"]
    kv = shape["batch"] * shape["seqlen_k"] * shape["heads_kv"] * shape["head_dim"]
    if backward:
        inputs = (3 * q + 2 * kv) * elem + 4 * shape["batch"] * shape["heads_q"] * shape["seqlen_q"]
        return inputs, inputs + (q + 2 * kv) * elem
    inputs = (q + 2 * kv) * elem
    return inputs, inputs + q * elem


# ----------------------------------------------------------------------------------------------
# Environment.

def parse_smi_line(line):
    """`1980 MHz, 2619 MHz, 580.95.05` -> ({"sm_mhz", "mem_mhz"}, driver) or None."""
    f = [x.strip() for x in line.split(",")]
    if len(f) < 3:
        return None

    def mhz(s):
        try:
            v = float(s[:-3].strip() if s.endswith("MHz") else s)
            return v if math.isfinite(v) else None
        except ValueError:
            return None

    driver = f[2] if f[2] and not f[2].startswith("[") else None
    return {"sm_mhz": mhz(f[0]), "mem_mhz": mhz(f[1])}, driver


def query_smi(device):
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,driver_version", "--format=csv,noheader", "--id=%d" % device],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    for line in out.stdout.splitlines():
        r = parse_smi_line(line)
        if r:
            return r
    return None


def is_commit(s):
    """7 to 64 hex digits (`git rev-parse HEAD` prints `HEAD` when it cannot resolve it)."""
    return 7 <= len(s) <= 64 and all(c in "0123456789abcdefABCDEF" for c in s)


def git_commit():
    c = os.environ.get("FLASHCORE_GIT_COMMIT", "").strip()
    if is_commit(c):
        return c
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        if out.returncode == 0 and is_commit(out.stdout.strip()):
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def cuda_driver_version():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return v.value
    except OSError:
        pass
    return None


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ----------------------------------------------------------------------------------------------
# Arguments: the same flags as `flashcore bench` for shapes and timing.

def build_parser():
    p = argparse.ArgumentParser(description="Time PyTorch SDPA backends like `flashcore bench`.")
    p.add_argument("--suite", choices=sorted(SUITES))
    p.add_argument("--batch", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--heads-kv", type=int)
    p.add_argument("--seqlen", type=int)
    p.add_argument("--seqlen-k", type=int)
    p.add_argument("--headdim", type=int)
    p.add_argument("--dtype", type=parse_dtype)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--window", type=parse_window, metavar="LEFT,RIGHT",
                   help="ad-hoc shape: sliding window (flash-attn's window_size, -1 unbounded)")
    p.add_argument("--layout", choices=LAYOUTS, default="bshd")
    p.add_argument("--reps", type=positive, default=DEFAULT_REPS)
    p.add_argument("--warmup", type=nonnegative, default=DEFAULT_WARMUP)
    p.add_argument("--graph-calls", type=positive, default=DEFAULT_GRAPH_CALLS)
    p.add_argument("--graph-reps", type=positive, default=DEFAULT_GRAPH_REPS)
    p.add_argument("--mode", choices=("event", "graph", "both"), default="both")
    p.add_argument("--json", metavar="FILE.json")
    p.add_argument("--device", type=nonnegative, default=0)
    p.add_argument("--seed", type=nonnegative, default=DEFAULT_SEED)
    p.add_argument("--backends", type=parse_backends, default=None,
                   help="comma-separated subset of flash,cudnn,efficient,fa4,flashcore-torch (default: the "
                        "SDPA three, plus fa4 when flash_attn.cute imports; flashcore-torch times the "
                        "flashcore Python package's op, the path PyTorch users take)")
    p.add_argument("--backward", action="store_true",
                   help="time the backward and forward+backward (eager, device events) instead of the forward")
    p.add_argument("--self-test", action="store_true", help="print the pure computations as JSON and exit")
    p.add_argument("--print-shapes", action="store_true", help="print the selected shapes as JSON and exit")
    return p


def parse_dtype(s):
    t = s.lower()
    if t in ("f16", "fp16", "float16", "half"):
        return "f16"
    if t in ("bf16", "bfloat16"):
        return "bf16"
    raise argparse.ArgumentTypeError("unknown dtype `%s` (expected f16 or bf16)" % s)


def parse_window(s):
    try:
        left, right = (int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected LEFT,RIGHT (two integers, -1 unbounded), got `%s`" % s) from None
    if left < -1 or right < -1:
        raise argparse.ArgumentTypeError("window sizes are >= -1 (-1 unbounded), got `%s`" % s)
    return (left, right)


def positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return v


def nonnegative(s):
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError("must be non-negative")
    return v


def parse_backends(s):
    names = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in names if x not in BACKENDS]
    if bad or not names:
        raise argparse.ArgumentTypeError("unknown backend(s) %s (choose from %s)" % (bad, ",".join(BACKENDS)))
    return names


def select_shapes(args):
    """[(dtype, shape)] the arguments ask for, or raises ValueError (a usage error)."""
    # With --suite, --headdim (like --dtype) keeps that head dim's shapes.
    adhoc = any(v is not None for v in (args.batch, args.heads, args.heads_kv, args.seqlen, args.seqlen_k)) or args.causal
    adhoc = adhoc or (args.headdim is not None and not args.suite) or args.window is not None
    if args.suite and adhoc:
        raise ValueError("give either --suite or an ad-hoc shape (--heads, --seqlen, --headdim, ...), not both")
    if args.suite:
        out = [(dt, s) for dt, s in SUITES[args.suite](args.layout)
               if args.dtype in (None, dt) and args.headdim in (None, s["head_dim"])]
        if not out:
            raise ValueError("the suite has no shapes of that dtype and head dim")
        return out
    if adhoc:
        if args.heads is None or args.seqlen is None or args.headdim is None:
            raise ValueError("an ad-hoc shape needs --heads, --seqlen and --headdim (--batch defaults to 1)")
        shape = make_shape(args.batch or 1, args.heads, args.seqlen, args.headdim, args.causal,
                           args.layout, args.heads_kv, args.seqlen_k)
        if args.window is not None and args.window != (-1, -1):
            shape["window"] = list(args.window)
        return [(args.dtype or "f16", shape)]
    raise ValueError("nothing to do: give --suite or an ad-hoc shape")


def modes_of(args):
    if args.backward:
        return ["event"]  # autograd calls are timed eagerly (main() refuses --mode graph)
    return {"event": ["event"], "graph": ["graph"], "both": ["event", "graph"]}[args.mode]


def passes_of(args):
    return ["backward", "forward+backward"] if args.backward else ["forward"]


def make_record(impl, suite, dtype, shape, mode, samples, reason, method, env, pass_="forward"):
    """One schema record (docs/bench-json.md); samples in microseconds, or reason when skipped."""
    f = flop_count(shape, pass_)
    st = stats(samples) if samples is not None else None
    if st is None and reason is None:
        reason = "no finite samples"
    return {
        "implementation": impl,
        "suite": suite,
        "shape": dict(shape),
        "dtype": dtype,
        "mode": mode,
        "pass": pass_,
        "status": "ok" if st is not None else "skipped",
        "skip_reason": None if st is not None else reason,
        "flops": f,
        "time_us": st,
        "tflops": tflops(f, st["median"]) if st is not None else None,
        "method": method,
        "env": env,
    }


def impl_name(backend):
    """The `implementation` field of a backend's records."""
    return backend if backend in ("fa4", "flashcore-torch") else "sdpa-" + backend


def fa4_available():
    try:
        from flash_attn.cute import flash_attn_func  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 (not installed, or broken)
        return False


def bench_file(records):
    return {"schema": SCHEMA, "version": VERSION, "records": records}


def self_test():
    samples = [12.0, 3.0, 1.0, 5.0, 2.0, 4.0]
    return {
        "stats": stats(samples),
        "percentiles": [percentile(sorted(samples), p) for p in (0, 25, 50, 95, 99, 100)],
        "stats_1000": stats([float(i) for i in range(1, 1001)]),
        "seed": [[dt, s] for dt, s in seed_suite()],
        "fa3": [[dt, s] for dt, s in fa3_suite()],
        "decode": [[dt, s] for dt, s in decode_suite()],
        "backward": [[dt, s] for dt, s in backward_suite()],
        "labels": [label(s) for _, s in seed_suite()],
        "sets_needed": [sets_needed(50 << 20, 3 * 512 * 8 * 64 * 2, 4 * 512 * 8 * 64 * 2, 1 << 40),
                        sets_needed(50 << 20, 300 << 20, 400 << 20, 1 << 40)],
        "schedules": graph_schedules(5, 2),
        "smi": parse_smi_line("1980 MHz, 2619 MHz, 580.95.05"),
        "impl_names": [impl_name(b) for b in BACKENDS],
        "record": make_record("sdpa-flash", "seed", "f16", make_shape(1, 8, 512, 64, True), "graph",
                              samples, None, None, {"gpu": None, "date": "2026-11-22T00:00:00Z"}),
        "backward_record": make_record("sdpa-cudnn", "backward", "bf16", make_shape(2, 16, 8192, 128, False),
                                       "event", samples, None, None, {"gpu": None, "date": "2026-11-22T00:00:00Z"},
                                       "backward"),
        "backward_set_bytes": set_bytes(make_shape(2, 8, 100, 64, False, heads_kv=2, seqlen_k=300), backward=True),
    }


# ----------------------------------------------------------------------------------------------
# The GPU part.

def short_reason(e):
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else type(e).__name__
    return "%s: %s" % (type(e).__name__, first[:300])


class Runner:
    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.torch, self.F, self.sdpa_kernel = torch, F, sdpa_kernel
        self.backend_enum = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                             "efficient": SDPBackend.EFFICIENT_ATTENTION}
        self.args = args
        if args.backends is None:
            args.backends = list(SDPA_BACKENDS) + (["fa4"] if fa4_available() else [])
        self.dev = torch.device("cuda", args.device)
        torch.cuda.set_device(self.dev)
        props = torch.cuda.get_device_properties(self.dev)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (50 << 20)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * CHUNK)]
        smi = query_smi(args.device)
        self.env0 = {
            "gpu": torch.cuda.get_device_name(self.dev),
            "driver_version": smi[1] if smi else None,
            "cuda_driver_version": cuda_driver_version(),
            "clocks_start": None,
            "clocks_end": None,
            "git_commit": git_commit(),
            "date": now_utc(),
            "software": {"torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()),
                         "cuda": str(torch.version.cuda)},
        }
        if "fa4" in args.backends:
            try:
                from importlib.metadata import version
                self.env0["software"]["flash_attn_4"] = version("flash-attn-4")
            except Exception:  # noqa: BLE001
                pass
        if "flashcore-torch" in args.backends:
            try:
                import flashcore
                self.env0["software"]["flashcore"] = flashcore.__version__
            except Exception:  # noqa: BLE001 (not installed: its records are skipped with the reason)
                pass

    def make_sets(self, dtype, shape, nsets):
        """Random inputs in [-1, 1) generated on the host and uploaded once, as SDPA views."""
        torch = self.torch
        tdt = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        b, hq, hkv, d = shape["batch"], shape["heads_q"], shape["heads_kv"], shape["head_dim"]
        sq, sk = shape["seqlen_q"], shape["seqlen_k"]
        gen = torch.Generator().manual_seed(self.args.seed)
        sets = []
        for _ in range(nsets):
            def rnd(s, h):
                dims = (b, s, h, d) if shape["layout"] == "bshd" else (b, h, s, d)
                t = (torch.rand(dims, generator=gen, dtype=torch.float32) * 2 - 1).to(tdt).to(self.dev)
                return t.transpose(1, 2) if shape["layout"] == "bshd" else t
            sets.append((rnd(sq, hq), rnd(sk, hkv), rnd(sk, hkv)))
        torch.cuda.synchronize()
        return sets

    def window_mask(self, shape):
        """The shape's window (with its causal right edge) as SDPA's boolean mask [Sq, Sk], True =
        attend: query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right."""
        torch = self.torch
        sq, sk = shape["seqlen_q"], shape["seqlen_k"]
        left, right = shape["window"]
        if shape["causal"]:
            right = 0
        rel = (torch.arange(sk, device=self.dev)[None, :] - torch.arange(sq, device=self.dev)[:, None]) - (sk - sq)
        ok = torch.ones(sq, sk, dtype=torch.bool, device=self.dev)
        if left >= 0:
            ok &= rel >= -left
        if right >= 0:
            ok &= rel <= right
        return ok

    def call_fn(self, shape, sets):
        F, torch = self.F, self.torch
        gqa = shape["heads_q"] != shape["heads_kv"]
        kwargs = {"enable_gqa": True} if gqa else {}
        if shape.get("window"):
            mask = self.window_mask(shape)
            return lambda i: F.scaled_dot_product_attention(*sets[i], attn_mask=mask, **kwargs)
        if shape["causal"] and shape["seqlen_q"] != shape["seqlen_k"]:
            # flashcore's causal mask is bottom-right aligned when Sq != Sk.
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(shape["seqlen_q"], shape["seqlen_k"])
            return lambda i: F.scaled_dot_product_attention(*sets[i], attn_mask=mask, **kwargs)
        causal = shape["causal"]
        return lambda i: F.scaled_dot_product_attention(*sets[i], is_causal=causal, **kwargs)

    def fa4_fn(self, shape, sets):
        """FlashAttention-4 on the same buffers: it takes [B, S, H, D] views (the transposes undo
        the SDPA views; for bshd they are the contiguous tensors themselves). GQA is native, and its
        causal mask is bottom-right aligned when Sq != Sk, as flashcore's."""
        from flash_attn.cute import flash_attn_func
        causal = shape["causal"]
        views = [tuple(t.transpose(1, 2) for t in s) for s in sets]
        if shape.get("window"):
            window = tuple(None if w < 0 else w for w in shape["window"])  # FA4: None = unbounded
            return lambda i: flash_attn_func(*views[i], causal=causal, window_size=window)
        return lambda i: flash_attn_func(*views[i], causal=causal)

    def flashcore_fn(self, shape, sets):
        """The `flashcore` package's op (`flashcore.attention`) on the same buffers, in the shape's
        layout (the SDPA views of bshd tensors are transposed back to the contiguous tensors).
        Causal is bottom-right aligned when Sq != Sk, as in `flashcore bench`."""
        import flashcore
        causal, layout = shape["causal"], shape["layout"]
        views = [tuple(t.transpose(1, 2) for t in s) for s in sets] if layout == "bshd" else sets
        window = tuple(shape.get("window") or (-1, -1))
        return lambda i: flashcore.attention(*views[i], causal=causal, layout=layout, window_size=window)

    def time_per_call(self, fn, nsets):
        torch, a = self.torch, self.args
        nxt = 0
        for _ in range(max(a.warmup, nsets)):
            fn(nxt % nsets)
            nxt += 1
        torch.cuda.synchronize()
        out = []
        while len(out) < a.reps:
            n = min(CHUNK, a.reps - len(out))
            for i in range(n):
                self.events[2 * i].record()
                fn(nxt % nsets)
                self.events[2 * i + 1].record()
                nxt += 1
            torch.cuda.synchronize()
            out.extend(self.events[2 * i].elapsed_time(self.events[2 * i + 1]) * 1e3 for i in range(n))
        return out

    def time_graph(self, fn, nsets):
        torch, a = self.torch, self.args
        schedules = graph_schedules(nsets, a.graph_calls)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream before capture, as PyTorch asks
            for i in range(min(nsets, 3)):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graphs = []
        for sched in schedules:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for s in sched:
                    fn(s)
            graphs.append(g)
        for g in graphs:
            g.replay()
        nxt = 0
        for _ in range(-(-a.warmup // a.graph_calls)):
            graphs[nxt % len(graphs)].replay()
            nxt += 1
        torch.cuda.synchronize()
        out = []
        while len(out) < a.graph_reps:
            n = min(CHUNK, a.graph_reps - len(out))
            for i in range(n):
                self.events[2 * i].record()
                graphs[nxt % len(graphs)].replay()
                self.events[2 * i + 1].record()
                nxt += 1
            torch.cuda.synchronize()
            out.extend(self.events[2 * i].elapsed_time(self.events[2 * i + 1]) * 1e3 / a.graph_calls for i in range(n))
        del graphs
        return out

    def grad_fns(self, fwd, gsets):
        """(backward, forward+backward) callables for a forward `fwd(i)` on the grad-requiring
        inputs `gsets[i]`: the first differentiates one kept output of each set (retain_graph),
        the second runs the forward and its backward. dO is random, one per set."""
        torch = self.torch

        def out_of(i):
            o = fwd(i)
            return o[0] if isinstance(o, tuple) else o

        outs = [out_of(i) for i in range(len(gsets))]
        gen = torch.Generator(device=self.dev).manual_seed(self.args.seed + 1)
        dos = [torch.rand(o.shape, generator=gen, device=self.dev, dtype=torch.float32).to(o.dtype) * 2 - 1
               for o in outs]
        backward = lambda i: torch.autograd.grad(outs[i], gsets[i], dos[i], retain_graph=True)  # noqa: E731
        both = lambda i: torch.autograd.grad(out_of(i), gsets[i], dos[i])  # noqa: E731
        return backward, both

    def backend_fn(self, b, shape, sets):
        """(a function making the context manager each use runs in, forward callable on `sets`)
        of backend `b`; raises when it cannot be made (FA4 or flashcore not installed)."""
        if b == "fa4":
            return contextlib.nullcontext, self.fa4_fn(shape, sets)
        if b == "flashcore-torch":
            return contextlib.nullcontext, self.flashcore_fn(shape, sets)
        kind = self.backend_enum[b]
        return (lambda: self.sdpa_kernel(kind)), self.call_fn(shape, sets)

    def run_shape(self, dtype, shape):
        torch, a = self.torch, self.args
        env = dict(self.env0, date=now_utc())
        modes, passes = modes_of(a), passes_of(a)
        records = []
        inputs, total = set_bytes(shape, backward=a.backward)
        free = torch.cuda.mem_get_info(self.dev)[0]
        nsets = sets_needed(self.l2, inputs, total, int(free * MEM_FRACTION))

        def skip_all(reason):
            return [make_record(impl_name(b), a.suite, dtype, shape, m, None, reason, None, env, p)
                    for b in a.backends for p in passes for m in modes]

        if nsets == 0:
            return skip_all("one buffer set (%d bytes) does not fit in free device memory" % total)
        try:
            sets = self.make_sets(dtype, shape, nsets)
            if a.backward:
                sets = [tuple(t.detach().requires_grad_() for t in s) for s in sets]
        except Exception as e:  # noqa: BLE001 (out of memory and the like)
            torch.cuda.empty_cache()
            return skip_all(short_reason(e))
        smi = query_smi(a.device)
        env["clocks_start"] = smi[0] if smi else None
        for b in a.backends:
            fns, make_ctx = {}, contextlib.nullcontext
            try:
                make_ctx, fn0 = self.backend_fn(b, shape, sets)
            except Exception as e:  # noqa: BLE001 (not installed)
                ok, why = False, short_reason(e)
            else:
                with make_ctx():
                    try:  # does this backend take this shape at all? (FA4 compiles here, untimed)
                        if a.backward:
                            fns["backward"], fns["forward+backward"] = self.grad_fns(fn0, sets)
                            fns["backward"](0)
                        else:
                            fns["forward"] = fn0
                            fn0(0)
                        torch.cuda.synchronize()
                        ok, why = True, None
                    except Exception as e:  # noqa: BLE001
                        ok, why = False, short_reason(e)
            with make_ctx():
                for p in passes:
                    for m in modes:
                        method = {"warmup": max(a.warmup, nsets) if m == "event" else a.warmup,
                                  "reps": a.reps if m == "event" else a.graph_reps,
                                  "graph_calls": a.graph_calls if m == "graph" else None,
                                  "buffer_sets": nsets, "input_bytes_per_set": inputs, "l2_bytes": self.l2}
                        samples, reason = None, why
                        if ok:
                            try:
                                samples = (self.time_per_call if m == "event" else self.time_graph)(fns[p], nsets)
                            except Exception as e:  # noqa: BLE001
                                reason = short_reason(e)
                                torch.cuda.synchronize()
                        records.append(make_record(impl_name(b), a.suite, dtype, shape, m, samples, reason,
                                                   method if samples is not None else None, env, p))
            del fns
        smi = query_smi(a.device)
        for r in records:
            r["env"] = dict(r["env"], clocks_end=smi[0] if smi else None)
        del sets
        torch.cuda.empty_cache()
        return records


def format_results(records):
    lines = ["%-15s %-5s %-28s %-9s %10s %10s %10s %10s %8s" % (
        "implementation", "dtype", "shape", "mode", "median_us", "min_us", "p95_us", "p99_us", "TFLOPS")]
    tags = {"forward": "", "backward": " bwd", "forward+backward": " f+b"}
    for r in records:
        mode = r["mode"] + tags[r.get("pass", "forward")]
        head = "%-15s %-5s %-28s %-9s" % (r["implementation"], r["dtype"], label(r["shape"]), mode)
        t = r["time_us"]
        if r["status"] == "ok" and t:
            lines.append("%s %10.2f %10.2f %10.2f %10.2f %8.1f" % (head, t["median"], t["min"], t["p95"], t["p99"], r["tflops"]))
        else:
            lines.append("%s skipped: %s" % (head, r["skip_reason"]))
    return "\n".join(lines)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.self_test:
        print(json.dumps(self_test(), indent=1, allow_nan=False))
        return 0
    if args.backward and args.mode == "graph":
        parser.error("--backward times eager calls: use --mode event (or leave --mode out)")
    try:
        shapes = select_shapes(args)
    except ValueError as e:
        parser.error(str(e))  # exits 2
    if args.print_shapes:
        print(json.dumps([[dt, s] for dt, s in shapes], indent=1))
        return 0
    try:
        runner = Runner(args)
    except Exception as e:  # noqa: BLE001 (no torch, no GPU)
        print("sdpa.py: error: %s" % short_reason(e), file=sys.stderr)
        return 1
    records = []
    for i, (dt, shape) in enumerate(shapes):
        recs = runner.run_shape(dt, shape)
        records.extend(recs)
        summary = ", ".join("%s/%s%s %s" % (r["implementation"].replace("sdpa-", ""), r["mode"],
                                            "" if r["pass"] == "forward" else "/" + r["pass"],
                                          "%.2f us" % r["time_us"]["median"] if r["status"] == "ok" else "skipped")
                            for r in recs)
        print("[%d/%d] %s %s: %s" % (i + 1, len(shapes), dt, label(shape), summary), file=sys.stderr, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(bench_file(records), f, indent=1, allow_nan=False)
            f.write("\n")
    print(format_results(records))
    return 0 if any(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
