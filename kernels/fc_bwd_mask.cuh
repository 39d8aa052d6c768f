// Backward sliding windows and softcap (two-pass kernels only, dense and varlen): which query tiles a key
// block visits and which key blocks a query tile visits (skipped by index: public), the
// per-element window test (a select), and the softcap's logit and derivative.
//
// Window (the forward's semantics, fc_scheduler.cuh): query row i, bottom-right aligned to the
// keys (pos = i + Sk − Sq), sees key j iff pos − left ≤ j ≤ pos + right. Causal builds take
// right = 0. The host clamps an unbounded side to Sq + Sk (at most 2^29), so the i32 sums below
// cannot overflow and left + right < 2^31.
//
// Softcap: the forward's logit is cap·tanh(s·scale/cap) on the raw score s, computed as
// softcap_out·tanh(s·softcap_in) in raw-score units. With t = tanh(s·softcap_in), the logit's
// derivative in s is scale·(1 − t²); the kernels fold (1 − t²) into dS and keep the final
// multiplication by the softmax scale.
#pragma once
#include "fc_bwd_config.cuh"

#ifndef FC_WINDOW
#define FC_WINDOW 0
#endif
#ifndef FC_SOFTCAP
#define FC_SOFTCAP 0
#endif
static_assert(!(FC_ONEPASS && (FC_WINDOW || FC_SOFTCAP)), "windows and softcap: two-pass kernels only");

// The window's right side: 0 for causal builds.
FC_DEVICE int bwd_window_right(const BwdParams& p) { return FC_CAUSAL ? 0 : p.window_right; }

// Whether pos − key = d lies in the window: −right ≤ d ≤ left, as one unsigned compare.
FC_DEVICE bool bwd_in_window(const BwdParams& p, int d) {
    const int right = bwd_window_right(p);
    return (uint32_t)(d + right) <= (uint32_t)(p.window_left + right);
}

// The same test with the tile's part hoisted: base = rel + right once per tile, then per element
// one add of a constant and one unsigned compare (the per-element form kept the window's sides
// live in registers beside dK, dV: it spilled in the varlen window builds of the dK/dV kernel).
struct BwdWindowTest {
    int base;
    uint32_t width;
    FC_DEVICE bool operator()(int off) const { return (uint32_t)(base + off) <= width; }
};
FC_DEVICE BwdWindowTest bwd_window_test(const BwdParams& p, int rel) {
    const int right = bwd_window_right(p);
    return BwdWindowTest{rel + right, (uint32_t)(p.window_left + right)};
}

// Query tiles [first, end) of height `bm` that can see key block `n_block` (keys
// [n·bn, (n+1)·bn)): rows from n·bn − right − (Sk − Sq) to (n+1)·bn − 1 + left − (Sk − Sq).
// shift = Sk − Sq of the sequence (varlen: its own lengths, so its window is bottom-right
// aligned to them, as the forward's).
FC_DEVICE void bwd_window_query_tiles(const BwdParams& p, int shift, int n_block, int bn, int bm, int m_blocks,
                                      int& first, int& end) {
    const int lo = n_block * bn - bwd_window_right(p) - shift;
    const int hi = n_block * bn + bn - 1 + p.window_left - shift;
    first = min(max(lo, 0) / bm, m_blocks);
    end = hi < 0 ? 0 : min(m_blocks, hi / bm + 1);
    end = max(end, first);
}

// Key blocks [first, end) of width `bn` that rows [m·bm, (m+1)·bm) of query tile `m_block` can
// see: keys from m·bm + (Sk − Sq) − left to (m+1)·bm − 1 + (Sk − Sq) + right.
FC_DEVICE void bwd_window_key_blocks(const BwdParams& p, int shift, int m_block, int bm, int bn, int n_blocks,
                                     int& first, int& end) {
    const int lo = m_block * bm + shift - p.window_left;
    const int hi = m_block * bm + bm - 1 + shift + bwd_window_right(p);
    first = min(max(lo, 0) / bn, n_blocks);
    end = hi < 0 ? 0 : min(n_blocks, hi / bn + 1);
    end = max(end, first);
}

// blockIdx.x, read so the compiler cannot keep values derived from it live across a loop.
FC_DEVICE int bwd_block_x() {
    int x;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
    return x;
}

// Softcap: the base-2 exponent of P for raw score s is t·(softcap_out·scale_log2) − LSE₂ with
// t = tanh(s·softcap_in) (the forward's fast_tanh: exp2 and a reciprocal, fixed latency).
FC_DEVICE float bwd_softcap_t(const BwdParams& p, float s) { return fast_tanh(s * p.softcap_in); }
// P·(1 − t²): P times the derivative of the capped logit (less the scale).
FC_DEVICE float bwd_softcap_grad(float prob, float t) { return fmaf(-prob * t, t, prob); }
// The same from P alone (the dK/dV kernel keeps only the 16-bit P: holding t or P·(1 − t²) too
// spilled at d128): t = (log2 P + LSE₂) / cap_log2, clamped to [−1, 1] (P = 0 gives −inf, a
// padding row NaN: either way the product is 0). P's 16-bit rounding ε moves t by about
// ε·ln 2 / cap (cap = 50, bf16: 4e-5), below dS's own 16-bit rounding.
FC_DEVICE float bwd_softcap_grad_from_p(float prob, float l2, float cap_log2) {
    const float t = fminf(fmaxf((fast_log2(prob) + l2) * fast_rcp(cap_log2), -1.0f), 1.0f);
    return bwd_softcap_grad(prob, t);
}
