// Backward, learnable sinks (gpt-oss): the forward's LSE already includes each head's exp(sink),
// so dQ, dK and dV need nothing more; the sink's own gradient is
//   dsink[h] = −Σ_{b,i} exp(sink[h] − LSE[b,h,i]) · D[b,h,i],  D = rowsum(dO ∘ O),
// read from the preprocess's workspace (LSE₂ = LSE·log2 e, +inf on padding rows where D = 0, so
// they add exp2(−inf)·0 = 0). One CTA per head sums its rows in a fixed order — each thread a
// fixed strided set, then a fixed butterfly and the warps in order — so the result is bitwise
// deterministic. The sink is secret: arithmetic only; addresses come from indices.
#pragma once
#include "fc_bwd_config.cuh"

namespace bw {
constexpr int DSINK_THREADS = 256;
}

FC_DEVICE void bwd_dsink_head(const BwdParams& p, int h) {
    using namespace bw;
    __shared__ float warp_sum[DSINK_THREADS / 32];
    const float sink2 = reinterpret_cast<const float*>(p.sinks_ptr)[h] * 1.4426950408889634f;
    const float* lse2 = reinterpret_cast<const float*>(p.lse2_ptr);
    const float* dvec = reinterpret_cast<const float*>(p.dvec_ptr);
    float acc = 0.0f;
    for (int b = 0; b < p.batch; ++b) {
        const int64_t base = ((int64_t)b * p.heads_q + h) * p.sq_pad;
        for (int i = threadIdx.x; i < p.sq_pad; i += DSINK_THREADS)
            acc = fmaf(fast_exp2(sink2 - lse2[base + i]), dvec[base + i], acc);
    }
#pragma unroll
    for (int sh = 16; sh >= 1; sh /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, sh);
    acc = bwd_leak(acc, acc, lse2);
    if (lane_id() == 0) warp_sum[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < DSINK_THREADS / 32; ++w) total += warp_sum[w];
        reinterpret_cast<float*>(p.dsink_ptr)[h] = -total;
    }
}
