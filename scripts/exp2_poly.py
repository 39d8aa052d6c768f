#!/usr/bin/env python3
"""Fits and checks the polynomial of issue 25 lead (d), 2^f on [0, 1) with p(0) = 1 exactly (the kernel
header kernels/fc_exp2_fma.cuh of commit b371bef; measured slower and reverted:
PERF_NOTES "Branch exp2fma").

Relative-error minimax by Lawson's iteratively reweighted least squares on a dense grid, then the
coefficients rounded to fp32 and the whole fp32 path simulated: every f the kernel can reach is a
multiple of 2^-24 in [0, 1) (f = x - floor(x), exact for x <= -1; fl(x + 1) for -1 < x < 0), so
all 2^24 of them are checked, Horner with one rounding per FFMA (fma emulated in float64: the
product of two fp32 is exact there). Also checks the exponent assembly on edge inputs.
Usage: python exp2_poly.py   (numpy)
"""
import numpy as np

F32 = np.float32
MAGIC = F32(12582912.0)  # 1.5 * 2^23


def fit(deg, iters=200):
    f = np.linspace(0.0, 1.0, 20001)
    # p(f) = 1 + f * (c1 + c2 f + ...): basis f^k, k = 1..deg, target 2^f - 1, relative weight.
    A = np.stack([f**k for k in range(1, deg + 1)], axis=1)
    y = 2.0**f - 1.0
    w = np.ones_like(f)
    for _ in range(iters):
        W = w / 2.0**f
        c, *_ = np.linalg.lstsq(A * W[:, None], y * W, rcond=None)
        err = np.abs((1.0 + A @ c) / 2.0**f - 1.0)
        w = w * (err + 1e-300) ** 0.5
        w /= w.sum()
    return [F32(v) for v in c]


def horner32(c, f):
    """1 + f*(c1 + f*(c2 + ...)) as the kernel evaluates it: fma(acc, f, c_k), last fma(acc, f, 1)."""
    acc = np.full_like(f, c[-1], dtype=np.float32)
    for ck in list(c[:-1])[::-1] + [F32(1.0)]:
        acc = (acc.astype(np.float64) * f.astype(np.float64) + np.float64(ck)).astype(np.float32)
    return acc


def emulate(c, x):
    """The kernel's path on fp32 inputs x (any value, -inf included)."""
    x = np.maximum(x.astype(np.float32), F32(-127.0))  # fmaxf: NaN-free for x = -inf
    # add.rm: floor(x) in the low mantissa bits of t (exact: |x| <= 127 << 2^22).
    t = (np.floor(x.astype(np.float64)) + np.float64(MAGIC)).astype(np.float32)
    xi = t - MAGIC
    f = x - xi
    p = horner32(c, f)
    bits = (t.view(np.int32).astype(np.int64) << 23) + p.view(np.int32).astype(np.int64)
    return (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


for deg in (3, 4):
    c = fit(deg)
    f = (np.arange(2**24, dtype=np.float64) * 2.0**-24).astype(np.float32)
    p = horner32(c, f)
    rel = np.abs(p.astype(np.float64) / 2.0 ** f.astype(np.float64) - 1.0)
    print(f"degree {deg}: c1..c{deg} = " + ", ".join(f"{v.item():.9e}f" for v in c) + f"  (fp32 hex "
          + ", ".join(hex(v.view(np.uint32).item()) for v in c) + ")")
    print(f"  max rel error over all 2^24 reachable f: {rel.max():.3e} = 2^{np.log2(rel.max()):.2f}"
          f"; p >= 1: {bool((p >= 1).all())}; p(0) = {p[0]}; max p = {p.max()}")
    edges = np.array([-np.inf, -3e38, -1e30, -1000, -127.5, -127, -126.999, -126.5, -126, -125.3,
                      -100.25, -1, -0.5, -1e-7, -1e-30, -0.0, 0.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    xs = np.concatenate([edges, (-rng.random(2**22) * 140).astype(np.float32),
                         (-rng.random(2**20)).astype(np.float32)])
    r = emulate(c, xs)
    exact = 2.0 ** xs.astype(np.float64)
    ok = np.isfinite(r).all() and (r >= 0).all()
    normal = xs > -126
    relx = np.abs(r[normal] / exact[normal] - 1.0).max()
    absx = np.abs(r[~normal].astype(np.float64) - exact[~normal]).max()
    print(f"  pipeline: finite and >= 0: {ok}; exactly 0 for x <= -127: "
          f"{bool((r[xs <= -127] == 0).all())}; max rel error (x > -126): "
          f"{relx:.3e}; max abs error (x <= -126): {absx:.3e}")
    print("  x = +0:", emulate(c, np.array([0.0], np.float32))[0])
    print("  edges:", dict(zip(edges.tolist(), emulate(c, edges).tolist())))
