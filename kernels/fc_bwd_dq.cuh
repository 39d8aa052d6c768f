// Backward, dQ: a CTA owns Q_BM query rows of one (batch, query head) and keeps their dQ in fp32
// registers while it streams the Q_BN-key (K, V) blocks they can see, in key order — a fixed
// order: no atomics, no partials, bitwise deterministic and independent of the batch.
// Per block, with the queries as rows (64 per consumer warpgroup):
//   S = Q Kᵀ, dP = dO Vᵀ                        (wgmma, both operands in shared memory)
//   P = exp2(S·c − LSE₂), dS = P ∘ (dP − D)       (fp32 registers; masks by select)
//   dQ += dS K                                    (wgmma, A from registers)
// and dQ is scaled by the softmax scale at the end. S and dP are recomputed here rather than
// shared with the dK/dV kernel (see PERF_NOTES.md, backward).
#pragma once
#include "fc_bwd_config.cuh"
#include "fc_bwd_varlen.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"
#include "fc_wgmma.cuh"
#include "fc_bwd_mask.cuh"

struct DqShared {
    uint16_t q[bw::CHUNKS][bw::Q_BM][bw::SW_ELEMS];
    uint16_t d_o[bw::CHUNKS][bw::Q_BM][bw::SW_ELEMS];
    uint16_t k[bw::Q_STAGES][bw::CHUNKS][bw::Q_BN][bw::SW_ELEMS];
    uint16_t v[bw::Q_STAGES][bw::CHUNKS][bw::Q_BN][bw::SW_ELEMS];
    uint64_t q_full;
    uint64_t full[bw::Q_STAGES], empty[bw::Q_STAGES];
};

// Key blocks the tile visits: [0, count). Causal (bottom-right): the tile's last row sees keys up
// to row + Sk − Sq; blocks past that are skipped by index (public). 0: every row fully masked.
FC_DEVICE int dq_key_blocks(const BwdParams& p, const BwdSeq& sq, int m_block) {
#if FC_CAUSAL
    const int last_key = m_block * bw::Q_BM + bw::Q_BM - 1 + sq.len_k - sq.len_q;
    return last_key < 0 ? 0 : min(bwd_q_n_blocks(p, sq), last_key / bw::Q_BN + 1);
#else
    (void)m_block;
    return bwd_q_n_blocks(p, sq);
#endif
}

// The key blocks [first, first + count) the tile visits: window builds skip the blocks wholly
// outside the window on either side (fc_bwd_mask.cuh), by index. count 0: every row masked.
FC_DEVICE int dq_key_range(const BwdParams& p, const BwdSeq& sq, int m_block, int& first) {
#if FC_WINDOW
    int end;
    bwd_window_key_blocks(p, bwd_seq_shift(p, sq), m_block, bw::Q_BM, bw::Q_BN, bwd_q_n_blocks(p, sq), first, end);
    return end - first;
#else
    first = 0;
    return dq_key_blocks(p, sq, m_block);
#endif
}

FC_DEVICE void dq_producer(const BwdParams& p, DqShared& s, int m_block, int head, int batch) {
    using namespace bw;
    const BwdSeq sq = bwd_seq(p, batch);
    int first;
    const int count = dq_key_range(p, sq, m_block, first);
    if (count == 0) return;
    tma_prefetch_desc(&p.q_map);
    tma_prefetch_desc(&p.k_map);
    tma_prefetch_desc(&p.v_map);
    tma_prefetch_desc(&p.do_map);
    mbar_arrive_expect_tx(&s.q_full, 2u * Q_BM * D * 2);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        tma_load_4d(&s.q[c][0][0], &p.q_map, &s.q_full, c * SW_ELEMS, sq.q0 + m_block * Q_BM, head, sq.tb);
        tma_load_4d(&s.d_o[c][0][0], &p.do_map, &s.q_full, c * SW_ELEMS, sq.q0 + m_block * Q_BM, head, sq.tb);
    }
    const int kv_head = head / p.group;
    for (int it = 0; it < count; ++it) {
        const int st = bwd_stage<Q_STAGES>(it);
        mbar_wait(&s.empty[st], bwd_phase<Q_STAGES>(it) ^ 1);
        mbar_arrive_expect_tx(&s.full[st], 2u * Q_BN * D * 2);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            tma_load_4d(&s.k[st][c][0][0], &p.k_map, &s.full[st], c * SW_ELEMS, sq.k0 + (first + it) * Q_BN, kv_head, sq.tb);
            tma_load_4d(&s.v[st][c][0][0], &p.v_map, &s.full[st], c * SW_ELEMS, sq.k0 + (first + it) * Q_BN, kv_head, sq.tb);
        }
    }
}

FC_DEVICE void dq_consumer(const BwdParams& p, DqShared& s, int wg, int m_block, int head, int batch) {
    using namespace bw;
    const int warp = warp_id_in_block() % 4;
    const int lane = lane_id();
    const int row0 = m_block * Q_BM + wg * 64 + warp * 16 + lane / 4;  // row half h: row0 + 8h
    const int col0 = 2 * (lane % 4);

    float dq[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;

    const BwdSeq sq = bwd_seq(p, batch);
    int first;
    const int count = dq_key_range(p, sq, m_block, first);
    const int64_t ws_row = ((int64_t)batch * p.heads_q + head) * p.sq_pad + row0;
    const float* lse2_p = reinterpret_cast<const float*>(p.lse2_ptr) + ws_row;
    const float* dvec_p = reinterpret_cast<const float*>(p.dvec_ptr) + ws_row;
    const float lse2[2] = {lse2_p[0], lse2_p[8]};
    const float dvec[2] = {dvec_p[0], dvec_p[8]};
    const uint32_t q_base = smem_u32(&s.q[0][wg * 64][0]);
    const uint32_t do_base = smem_u32(&s.d_o[0][wg * 64][0]);
    if (count > 0) mbar_wait(&s.q_full, 0);
    const Turns turns{wg, count};
    turns.start();

    for (int it = 0; it < count; ++it) {
#if FC_VARLEN && FC_WINDOW
        // Varlen windows: the sequence's lengths read afresh per tile (fc_bwd_varlen.cuh).
        const BwdSeq sqi = bwd_seq_fresh(p);
#else
        const BwdSeq& sqi = sq;
#endif
        const int st = bwd_stage<Q_STAGES>(it);
        const uint32_t k_base = smem_u32(&s.k[st][0][0][0]);
        const uint32_t v_base = smem_u32(&s.v[st][0][0][0]);
        mbar_wait(&s.full[st], bwd_phase<Q_STAGES>(it));
        // Varlen: keys past the sequence's (seqused_k applied) become zeros (fc_bwd_varlen.cuh).
        bwd_clear_dead_rows<Q_BN>(&s.k[st][0][0][0], &s.v[st][0][0][0], sqi.len_k - (first + it) * Q_BN, wg);
        float sacc[Q_BN / 2], dpacc[Q_BN / 2];
        turns.wait(it);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            Mma<Q_BN>::ss(sacc, bwd_desc_k(bwd_opaque(q_base), Q_BM, kk), bwd_desc_k(k_base, Q_BN, kk), kk > 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            Mma<Q_BN>::ss(dpacc, bwd_desc_k(bwd_opaque(do_base), Q_BM, kk), bwd_desc_k(v_base, Q_BN, kk), kk > 0);
        }
        wgmma_commit();
        turns.pass(it);
        // S is ready while dP may still run: P's exponentials overlap that GEMM.
        wgmma_wait<1>();
        fence_regs(sacc);

        // Keys past Sk are masked; causal: key − query ≤ Sk − Sq. Relative to this thread's
        // first (query, key) pair.
        const int key_first = (first + it) * Q_BN + col0;
        const int limit = sqi.len_k - key_first;
        const int rel = key_first - row0 - (sqi.len_k - sqi.len_q);
#if FC_SOFTCAP
        const float cap_log2 = p.softcap_out * p.scale_log2;
#endif
#pragma unroll
        for (int i = 0; i < Q_BN / 2; ++i) {
            const int h = (i / 2) % 2;
            const int kof = 8 * (i / 4) + (i % 2);
            bool visible = kof < limit;
#if FC_WINDOW
            visible = visible && bwd_in_window(p, -(rel + kof - 8 * h));
#elif FC_CAUSAL
            visible = visible && (rel + kof - 8 * h <= 0);
#else
            (void)rel;
#endif
#if FC_SOFTCAP
            // P from the capped logit, times (1 − t²): all dS needs (dQ has no P V).
            const float t = bwd_softcap_t(p, sacc[i]);
            const float prob = select_f(visible, fast_exp2(fmaf(t, cap_log2, -lse2[h])), 0.0f);
            sacc[i] = bwd_softcap_grad(prob, t);
#else
            sacc[i] = select_f(visible, fast_exp2(fmaf(sacc[i], p.scale_log2, -lse2[h])), 0.0f);
#endif
        }
        wgmma_wait<0>();
        fence_regs(dpacc);
#pragma unroll
        for (int i = 0; i < Q_BN / 2; ++i) dpacc[i] = sacc[i] * (dpacc[i] - dvec[(i / 2) % 2]);
        uint32_t sf[Q_BN / 16][4];
        acc_to_frags<Q_BN>(dpacc, sf);

        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < Q_BN / 16; ++kk) {
            Mma<D>::rs_tb(dq, sf[kk], bwd_desc_t(k_base, Q_BN, kk), 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(dq);
        fence_frags(sf);
        bwd_release(&s.empty[st]);
    }

    dq[0] = bwd_leak(dq[0], dq[1], reinterpret_cast<const float*>(p.lse2_ptr));
    // Rows past Sq are not stored (public); a fully masked row keeps dQ = 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        if (row < sq.len_q) {
            const int64_t off = batch * p.q_stride_b + (int64_t)(sq.q0 + row) * p.q_stride_s + head * p.q_stride_h + col0;
            bwd_store_row<D>(reinterpret_cast<uint16_t*>(p.dq_ptr) + off, dq, h, p.scale);
        }
    }
}
