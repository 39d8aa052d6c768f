// Online softmax over one warpgroup's 64-row score tile (wgmma accumulator layout: each thread
// holds 2 rows — lane/4 and lane/4+8 of its warp's 16 — and N/4 columns of each).
// Always rescales; masking and the fully-masked-row guard are selects, never branches.
#pragma once
#include "fc_common.cuh"

// Accumulator element i of an m64nN tile: column 8*(i/4) + 2*(lane%4) + (i%2), row half (i/2)%2.
template <int N>
struct OnlineSoftmax {
    float row_max[2];  // running max of raw scores (−inf until a visible key is seen)
    float row_sum[2];  // this thread's partial sum of exp2 terms; quad-reduced at the end

    FC_DEVICE void init() {
        row_max[0] = row_max[1] = neg_inf();
        row_sum[0] = row_sum[1] = 0.0f;
    }

    // Turns scores `s` into unnormalised probabilities in place; returns the factor by which
    // earlier output rows must be scaled. `scale_log2` = softmax scale · log2(e) > 0.
    FC_DEVICE void step(float (&s)[N / 2], float scale_log2, float (&alpha)[2]) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < N / 8; ++j) {
                mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // A row with no visible key so far keeps max −inf; subtracting 0 instead keeps
            // (−inf) − (−inf) = NaN out, and exp2(−inf) = 0 gives p = 0, alpha = 0.
            const float m_use = select_f(mx == neg_inf(), 0.0f, mx);
            // (s − m)·c, not fma(s, c, −m·c): the latter carries the rounding of m·c into every
            // exponent (ulp(m·c), hundreds of units for large scores: exps overflow). (s − m) is
            // ≤ 0 and finite for any finite scale, so no inf − inf either.
            alpha[h] = fast_exp2((row_max[h] - m_use) * scale_log2);
            row_max[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < N / 8; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = fast_exp2((s[4 * j + 2 * h + e] - m_use) * scale_log2);
                    s[4 * j + 2 * h + e] = p;
                    sum += p;
                }
            }
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
};
