// 2^x on the FP32 and integer pipes, for a fixed, public subset of each row's exponentials
// (issue 25 lead (d)): Hopper's MUFU evaluates 16 ex2/clk/SM, the FMA pipe 128 FFMA/clk/SM, so a
// block's softmax can hand part of its exponentials to the wider pipe (PERF_NOTES, branch exp2fma).
// Branch-free and data-oblivious: which scores take this path is a function of their position in
// the accumulator fragment alone (fc_softmax.cuh), never of their values.
#pragma once
#include "fc_common.cuh"

// FC_EXP2_FMA = K: the score pair index q = 2·(i/4) + i%2 of accumulator element i (its column
// group and column parity) takes this path when q % K == K − 1, i.e. 1/K of every row's scores.
// 0: every exponential on MUFU (the default; the host passes the define only when K ≠ 0).
#ifndef FC_EXP2_FMA
#define FC_EXP2_FMA 0
#endif
static_assert(FC_EXP2_FMA == 0 || FC_EXP2_FMA == 2 || FC_EXP2_FMA == 4 || FC_EXP2_FMA == 8 ||
                  FC_EXP2_FMA == 16,
              "FC_EXP2_FMA: 0 (off) or 1/K of the scores, K in {2, 4, 8, 16}");

// Whether accumulator pair q (see above) takes the polynomial path. A compile-time fact of the
// unrolled loop index.
FC_DEVICE constexpr bool exp2_on_fma(int q) { return FC_EXP2_FMA != 0 && q % FC_EXP2_FMA == FC_EXP2_FMA - 1; }

// 2^x for x ≤ 0 (a score minus its row max, scaled; −inf for masked scores).
// - Clamp at −127 (FMNMX, ALU pipe): −inf and every x ≤ −127 give exactly 0 below, and no NaN
//   can arise from −inf − −inf. 2^−127 is far below anything a row whose maximum is 2^0 = 1
//   can resolve, and MUFU's ex2.approx.ftz flushes these to 0 too.
// - Range reduction: t = fl_down(x + 1.5·2^23) keeps floor(x) in t's low mantissa bits (exact:
//   |x| ≤ 127 ≪ 2^22); f = x − floor(x) ∈ [0, 1) is exact (Sterbenz) for x ≤ −1, and rounds
//   only where x + 1 does for −1 < x < 0.
// - 2^f by Horner, p(f) = 1 + f·(c1 + f·(c2 + …)) with c_k > 0, so p(0) = 1 exactly (the row's
//   maximum gives exactly 1, as on MUFU) and p(f) ≥ 1 for f ≥ 0. Coefficients: relative-error
//   minimax fits rounded to fp32 (scripts/exp2_poly.py, which also checks every reachable f):
//   degree 3 (bf16 P, rounded to 2^−9) max relative error 8.6e-5 = 2^−13.5; degree 4 (fp16 P,
//   2^−12) 3.0e-6 = 2^−18.4.
// - 2^floor(x) by integer addition into the exponent field:
//   bits(t) << 23 is floor(x)·2^23 modulo 2^32 (the constant's own bits shift out). With
//   p ∈ [1, 2] and floor(x) ≥ −127 the sum's exponent field is ≥ 0, so the result is a
//   non-negative finite float: 0 at x = −127 (p = 1), a subnormal below 2^−126, else normal.
FC_DEVICE float exp2_fma(float x) {
    const float xc = fmaxf(x, -127.0f);
    const float t = __fadd_rd(xc, 12582912.0f);
    const float f = xc - (t - 12582912.0f);
#if FC_BF16
    float p = fmaf(7.706519961e-02f, f, 2.276470065e-01f);
#else
    float p = fmaf(1.342651900e-02f, f, 5.224274099e-02f);
    p = fmaf(p, f, 2.412800789e-01f);
#endif
#if FC_BF16
    p = fmaf(p, f, 6.951163411e-01f);
#else
    p = fmaf(p, f, 6.930448413e-01f);
#endif
    p = fmaf(p, f, 1.0f);
    // ptxas makes shift + add one IMAD by 2^23 (FMA pipe) or one LEA (ALU), its choice: one
    // issue slot either way (a PTX shl + add.s32 block gets the same treatment).
    const int e = static_cast<int>(static_cast<unsigned>(__float_as_int(t)) << 23);
    return __int_as_float(e + __float_as_int(p));
}
