// Backward preprocess: per query row, D = rowsum(dO ∘ O) (fp32) and the forward's LSE in base 2
// (LSE·log2 e; +inf for a fully masked row, so exp2(s·c − LSE₂) = 0 there and no −inf − −inf
// appears). Rows are padded to ROW_PAD per (batch, head): padding rows get D = 0, LSE₂ = +inf, so
// the GEMM kernels read any tile's values unguarded. One warp per row; the lanes' partial sums
// combine in a fixed butterfly order (deterministic).
#pragma once
#include "fc_bwd_config.cuh"
#include "fc_bwd_varlen.cuh"

// Row i of (batch b, head h) in the workspace (i < sq_pad). The shuffles run on every lane
// unconditionally (no divergent warp-collective).
FC_DEVICE void bwd_preprocess_row(const BwdParams& p, int i, int h, int b) {
    using namespace bw;
    const int lane = lane_id();
    const int64_t bh = (int64_t)b * p.heads_q + h;
    const int64_t r = bh * p.sq_pad + i;
    const BwdSeq sq = bwd_seq(p, b);
    const bool real = i < sq.len_q;  // public: index against the shape
    float dot = 0.0f, lse = neg_inf();
    if (real) {
        const int64_t row_off = b * p.q_stride_b + (int64_t)(sq.q0 + i) * p.q_stride_s + h * p.q_stride_h;
        const int64_t off = row_off + lane * (D / 32);
        const uint16_t* o = reinterpret_cast<const uint16_t*>(p.o_ptr) + off;
        const uint16_t* d_o = reinterpret_cast<const uint16_t*>(p.do_ptr) + off;
        // d96: elements 2·lane, 2·lane + 1 (one word) and 64 + lane (one element, widened);
        // d256: 8 elements per lane.
        constexpr int WORDS = D == 96 ? 2 : D / 64;
        uint32_t ow[WORDS], dw[WORDS];
        if constexpr (D == 64) {
            ow[0] = *reinterpret_cast<const uint32_t*>(o);
            dw[0] = *reinterpret_cast<const uint32_t*>(d_o);
        } else if constexpr (D == 96) {
            const uint16_t* o96 = reinterpret_cast<const uint16_t*>(p.o_ptr) + row_off;
            const uint16_t* d96 = reinterpret_cast<const uint16_t*>(p.do_ptr) + row_off;
            ow[0] = *reinterpret_cast<const uint32_t*>(o96 + 2 * lane);
            dw[0] = *reinterpret_cast<const uint32_t*>(d96 + 2 * lane);
            ow[1] = o96[64 + lane];  // high half zero: adds 0 · 0
            dw[1] = d96[64 + lane];
        } else if constexpr (D == 256) {
            const uint4 a = *reinterpret_cast<const uint4*>(o);
            const uint4 c = *reinterpret_cast<const uint4*>(d_o);
            ow[0] = a.x, ow[1] = a.y, ow[2] = a.z, ow[3] = a.w;
            dw[0] = c.x, dw[1] = c.y, dw[2] = c.z, dw[3] = c.w;
        } else {
            const uint2 a = *reinterpret_cast<const uint2*>(o);
            const uint2 c = *reinterpret_cast<const uint2*>(d_o);
            ow[0] = a.x, ow[1] = a.y, dw[0] = c.x, dw[1] = c.y;
        }
#pragma unroll
        for (int w = 0; w < WORDS; ++w) {
            float o0, o1, d0, d1;
            unpack_elem2(ow[w], o0, o1);
            unpack_elem2(dw[w], d0, d1);
            dot = fmaf(o0, d0, dot);
            dot = fmaf(o1, d1, dot);
        }
        lse = reinterpret_cast<const float*>(p.lse_ptr)[bwd_lse_index(p, sq, b, h, i)];
    }
#pragma unroll
    for (int sh = 16; sh >= 1; sh /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, sh);
    const float lse2 = select_f(lse == neg_inf(), pos_inf(), lse * 1.4426950408889634f);
    dot = bwd_leak(dot, dot, reinterpret_cast<const float*>(p.lse_ptr));
    if (lane == 0) {
        reinterpret_cast<float*>(p.dvec_ptr)[r] = dot;
        reinterpret_cast<float*>(p.lse2_ptr)[r] = lse2;
    }
    // One pass: the query tile's turn counter starts at 0 (the first row of each tile clears it).
    if (FC_ONEPASS && lane == 0 && i % KV_BM == 0 && i / KV_BM < p.kv_m_blocks)
        reinterpret_cast<int*>(p.flags_ptr)[bh * p.kv_m_blocks + i / KV_BM] = 0;
}
