// Online softmax over one warpgroup's 64-row score tile (wgmma accumulator layout: each thread
// holds 2 rows — lane/4 and lane/4+8 of its warp's 16 — and N/4 columns of each).
// Always rescales; masking and the fully-masked-row guard are selects, never branches.
//
// Two forms of the exponent, chosen at compile time (FC_EXP_FFMA, on for bf16):
//  * two-op (f16): p = 2^((s − m)·c). (s − m) is exact near the max and ≤ 0, so p ≤ 1 and the
//    row's largest p is 1 for any finite scores; l and O are relative to m·c.
//  * one FFMA (bf16): p = 2^(fma(s, c_r, −R)) with per-row constants (c_r, R) chosen by select:
//      normal |m·c| < 2^30: c_r = c, R = m·c rounded toward +∞. Every p ≤ 1, and the row's
//        largest p ≥ 2^−ulp(R) > 2^−64 — a normal bf16 P, so nothing underflows. The rounding of
//        R is one factor common to every p of the row: it cancels in O / l.
//      huge |m·c| ≥ 2^30: c_r = 2^(31 − exponent(m)), R = m·c_r, both exact. Two distinct fp32
//        scores there differ by at least |m|·2^−25, so every score that is not a tie with the
//        max has a true weight below 2^−32 (beneath what a bf16 output holds, even summed over
//        2^20 keys); at c_r such scores get p ≤ 2^−128 (0), the ties p = 1 exactly.
//    Between key blocks, α = 2^(R_old − R_new) when c_r is unchanged (both p's are then powers of
//    the same temperature) and 0 when it changed — only when the max moved into or within the
//    huge regime, where the old keys' true weights are below 2^−32 too. l and O are relative to
//    the row's reference ref2() (log2 units at the true temperature c); the PERF_NOTES section
//    "The exponent in one FFMA" has the whole argument. f16 keeps the two-op form: its P holds
//    no value below 2^−24, so the 2^−64 floor above would underflow there.
#pragma once
#include "fc_common.cuh"

#ifndef FC_EXP_FFMA
#define FC_EXP_FFMA FC_BF16
#endif

// Accumulator element i of an m64nN tile: column 8*(i/4) + 2*(lane%4) + (i%2), row half (i/2)%2.
template <int N>
struct OnlineSoftmax {
    float row_max[2];  // running max of raw scores (−inf until a visible key is seen)
    float row_sum[2];  // this thread's partial sum of exp2 terms; quad-reduced at the end
#if FC_EXP_FFMA
    float ref[2];   // R: the exponent's reference (−inf until a visible key is seen)
    float temp[2];  // c_r: the exponent's temperature (c, or a power of two in the huge regime)
#endif

    FC_DEVICE void init(float scale_log2) {
        row_max[0] = row_max[1] = neg_inf();
        row_sum[0] = row_sum[1] = 0.0f;
#if FC_EXP_FFMA
        ref[0] = ref[1] = neg_inf();
        temp[0] = temp[1] = scale_log2;
#endif
    }

    // The max of row half h over this block and the running max. A four-way tree of named
    // partials (max is exact: any order gives the same bits) instead of one dependent chain.
    FC_DEVICE float block_max(const float (&s)[N / 2], int h) const {
        static_assert(N >= 32, "four pairs of columns at least");
        float m0 = fmaxf(row_max[h], fmaxf(s[2 * h], s[2 * h + 1]));
        float m1 = fmaxf(s[4 + 2 * h], s[4 + 2 * h + 1]);
        float m2 = fmaxf(s[8 + 2 * h], s[8 + 2 * h + 1]);
        float m3 = fmaxf(s[12 + 2 * h], s[12 + 2 * h + 1]);
#pragma unroll
        for (int j = 4; j < N / 8; ++j) {
            const float v = fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]);
            if (j % 4 == 0) m0 = fmaxf(m0, v);
            if (j % 4 == 1) m1 = fmaxf(m1, v);
            if (j % 4 == 2) m2 = fmaxf(m2, v);
            if (j % 4 == 3) m3 = fmaxf(m3, v);
        }
        float mx = fmaxf(fmaxf(m0, m1), fmaxf(m2, m3));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        return mx;
    }

    // Turns scores `s` into unnormalised probabilities in place; returns the factor by which
    // earlier output rows must be scaled. `scale_log2` = softmax scale · log2(e) > 0.
    FC_DEVICE void step(float (&s)[N / 2], float scale_log2, float (&alpha)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mx = block_max(s, h);
            // A row with no visible key so far keeps max −inf; 0 in its place keeps
            // (−inf) − (−inf) = NaN out, and exp2(−inf) = 0 gives p = 0, alpha = 0.
            const float m_use = select_f(mx == neg_inf(), 0.0f, mx);
#if FC_EXP_FFMA
            const bool huge = fabsf(m_use * scale_log2) >= 1073741824.0f;  // 2^30
            // 2^(31 − e) for m's unbiased exponent e: the bits (158 − e_biased) << 23, clamped to
            // 2^127 (reached only for scales above 2^125, which the host refuses).
            const float c_huge =
                __uint_as_float(min(0x8E800000u - (__float_as_uint(m_use) & 0x7F800000u), 0x7F000000u));
            const float t = select_f(huge, c_huge, scale_log2);
            const float r = select_f(huge, m_use * c_huge, __fmul_ru(m_use, scale_log2));
            // Same temperature: the ratio of references; a new one: the old terms are negligible.
            // A row with no key before has ref −inf: alpha = 0.
            alpha[h] = fast_exp2(select_f(t == temp[h], ref[h] - r, neg_inf()));
            ref[h] = select_f(mx == neg_inf(), neg_inf(), r);
            temp[h] = t;
            row_max[h] = mx;
            const float neg_r = -r;
            // Two partial sums (even and odd columns): half as long a chain of dependent adds.
            float sum_e[2];
#pragma unroll
            for (int j = 0; j < N / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = fast_exp2(fmaf(s[4 * j + 2 * h + e], t, neg_r));
                    s[4 * j + 2 * h + e] = p;
                    sum_e[e] = j == 0 ? p : sum_e[e] + p;
                }
            }
            const float sum = sum_e[0] + sum_e[1];
#else
            // (s − m)·c, not fma(s, c, −m·c): the latter carries the rounding of m·c into every
            // exponent (ulp(m·c), hundreds of units for large scores: exps overflow). (s − m) is
            // ≤ 0 and finite for any finite scale, so no inf − inf either.
            alpha[h] = fast_exp2((row_max[h] - m_use) * scale_log2);
            row_max[h] = mx;
            float sum = 0.0f;  // 0 + p is p exactly: ptxas drops the first add
#pragma unroll
            for (int j = 0; j < N / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = fast_exp2((s[4 * j + 2 * h + e] - m_use) * scale_log2);
                    s[4 * j + 2 * h + e] = p;
                    sum = (j == 0 && e == 0) ? p : sum + p;
                }
            }
#endif
            row_sum[h] = row_sum[h] * alpha[h] + sum;
        }
    }

    // Full row sums (the quad of threads sharing a row combined), in a fixed order.
    FC_DEVICE void finish(float (&total)[2]) const {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float t = row_sum[h];
            t += __shfl_xor_sync(0xffffffffu, t, 1);
            t += __shfl_xor_sync(0xffffffffu, t, 2);
            total[h] = t;
        }
    }

#if FC_EXP_FFMA
    // The reference that row half h's sum and output are relative to, in log2 units at the true
    // temperature c = `scale_log2`: R in the normal regime, m·c in the huge one (where the sum
    // counts the ties with the max). −inf for a row with no visible key.
    FC_DEVICE float ref2(int h, float scale_log2) const {
        return select_f(temp[h] == scale_log2, ref[h], row_max[h] * scale_log2);
    }
#endif

    // The factor that makes row half h's (sum, output) relative to m·c (what a split's partial
    // carries to a combine): 2^(R − m·c) in the normal regime, 1 otherwise.
    FC_DEVICE float to_max_factor(int h, float scale_log2) const {
#if FC_EXP_FFMA
        const float m_use = select_f(row_max[h] == neg_inf(), 0.0f, row_max[h]);
        const float r = select_f(row_max[h] == neg_inf(), 0.0f, ref[h]);
        return fast_exp2(select_f(temp[h] == scale_log2, fmaf(-m_use, scale_log2, r), 0.0f));
#else
        (void)h;
        (void)scale_log2;
        return 1.0f;
#endif
    }
};
