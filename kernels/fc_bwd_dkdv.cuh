// Backward, dK and dV: a CTA owns KV_BN keys of one (batch, K/V head) and keeps their dK, dV in
// fp32 registers while it streams every KV_BM-row (Q, dO) tile that can see them: the group's
// query heads in head order, then query tiles in order — a fixed order, so the GQA sum and every
// other sum are bitwise deterministic and depend on nothing but this sequence.
// Per tile, with the keys as rows (64 per consumer warpgroup; d256: the same 64 for both, each
// owning half the head dim of dK and dV — HSPLIT, fc_bwd_config.cuh):
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ                      (wgmma, both operands in shared memory)
//   Pᵀ = exp2(Sᵀ·c − LSE₂), dSᵀ = Pᵀ ∘ (dPᵀ − D)  (fp32 registers; masks by select)
//   dV += Pᵀ dO, dK += dSᵀ Q                      (wgmma, A from registers)
// and dK is scaled by the softmax scale at the end.
// One pass (DQ = true, FC_ONEPASS): also dQ_partial = dS K per tile, added to the workspace's
// accumulator on this key block's turn (fc_bwd_onepass.cuh).
#pragma once
#include "fc_bwd_config.cuh"
#include "fc_bwd_varlen.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"
#include "fc_wgmma.cuh"
#include "fc_bwd_onepass.cuh"
#include "fc_bwd_mask.cuh"

// bwd_opaque (fc_bwd_config.cuh), also in varlen softcap builds: there a K/V descriptor held
// across the loop spilled at d128 (1 LDL / 1 STL); rebuilt per tile instead.
FC_DEVICE uint32_t dkdv_opaque(uint32_t x) {
#if FC_VARLEN && FC_SOFTCAP
    asm volatile("" : "+r"(x));
    return x;
#else
    return bwd_opaque(x);
#endif
}

// LSE₂ and D staged in shared memory with each (Q, dO) stage (FC_STAGE_STATS=1, the host's rule:
// BwdVariant::stage_stats) or read from the workspace where they are used (0: the d64 one pass,
// which has no shared memory left).
#ifndef FC_STAGE_STATS
#define FC_STAGE_STATS 1
#endif
constexpr int STAT_STAGES = FC_STAGE_STATS ? bw::KV_STAGES : 1;

// The producer warpgroup's tile loops: kept rolled in one-pass builds (see dkdv_producer).
#if FC_ONEPASS
#define BWD_PRODUCER_LOOP _Pragma("unroll 1")
#else
#define BWD_PRODUCER_LOOP
#endif

// A tile's LSE₂ and D at one thread's query columns (+ j): the staged rows through 32-bit shared
// addresses (generic pointers held beside dK, dV, Sᵀ and dPᵀ spilled the d128 one pass), or the
// padded workspace.
struct TileStats {
#if FC_STAGE_STATS
    uint32_t lse2, dvec;
    FC_DEVICE float lse(int j) const {
        float v;
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(lse2 + 4 * j));
        return v;
    }
    FC_DEVICE static float2 pair(uint32_t a) {
        float2 v;
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(a));
        return v;
    }
    FC_DEVICE float2 lse_pair(int j) const { return pair(lse2 + 4 * j); }
    FC_DEVICE float2 d_pair(int j) const { return pair(dvec + 4 * j); }
#else
    const float* lse2;
    const float* dvec;
    FC_DEVICE float lse(int j) const { return lse2[j]; }
    FC_DEVICE float2 lse_pair(int j) const { return *reinterpret_cast<const float2*>(lse2 + j); }
    FC_DEVICE float2 d_pair(int j) const { return *reinterpret_cast<const float2*>(dvec + j); }
#endif
};

struct DkdvShared {
    uint16_t k[bw::CHUNKS][bw::KV_BN][bw::SW_ELEMS];
    uint16_t v[bw::CHUNKS][bw::KV_BN][bw::SW_ELEMS];
    uint16_t q[bw::KV_STAGES][bw::CHUNKS][bw::KV_BM][bw::SW_ELEMS];
    uint16_t d_o[bw::KV_STAGES][bw::CHUNKS][bw::KV_BM][bw::SW_ELEMS];
    // Each ring stage's LSE₂ and D rows, loaded with its Q and dO: read from global memory where
    // they are used, their latency stood between Sᵀ and Pᵀ every tile (PERF_NOTES, `bwdlse`).
    float lse2[STAT_STAGES][bw::KV_BM];
    float dvec[STAT_STAGES][bw::KV_BM];
    uint64_t kv_full;
    uint64_t full[bw::KV_STAGES], empty[bw::KV_STAGES];
};

// The query tiles a key block visits per query head: [first, kv_m_blocks). Causal (bottom-right):
// query i sees key j iff i ≥ j − (Sk − Sq), so tiles wholly above the block's first key are
// skipped — by index, public.
FC_DEVICE int dkdv_first_m(const BwdParams& p, const BwdSeq& sq, int n_block) {
#if FC_CAUSAL
    const int first_row = max(0, n_block * bw::KV_BN - (sq.len_k - sq.len_q));
    return min(first_row / bw::KV_BM, bwd_kv_m_blocks(p, sq));
#else
    (void)p;
    (void)sq;
    (void)n_block;
    return 0;
#endif
}

// The query tiles [first, end) a key block visits per query head: window builds skip the tiles
// wholly outside the window on either side (fc_bwd_mask.cuh), by index.
FC_DEVICE void dkdv_m_range(const BwdParams& p, const BwdSeq& sq, int n_block, int& first, int& end) {
#if FC_WINDOW
    bwd_window_query_tiles(p, bwd_seq_shift(p, sq), n_block, bw::KV_BN, bw::KV_BM, bwd_kv_m_blocks(p, sq), first, end);
#else
    first = dkdv_first_m(p, sq, n_block);
    end = bwd_kv_m_blocks(p, sq);
#endif
}

// A tile's LSE₂ and D rows into stage `st`, completing on its `full` barrier (sq_pad is a
// multiple of KV_BM, so both sources are 16-byte aligned).
FC_DEVICE void dkdv_stats_load(const BwdParams& p, DkdvShared& s, int st, int batch, int head, int m_block) {
    using namespace bw;
    const int64_t ws_row = ((int64_t)batch * p.heads_q + head) * p.sq_pad + m_block * KV_BM;
    bulk_load(&s.lse2[st][0], reinterpret_cast<const float*>(p.lse2_ptr) + ws_row, KV_BM * 4, &s.full[st]);
    bulk_load(&s.dvec[st][0], reinterpret_cast<const float*>(p.dvec_ptr) + ws_row, KV_BM * 4, &s.full[st]);
}

FC_DEVICE void dkdv_producer(const BwdParams& p, DkdvShared& s, int n_block, int kv_head, int batch) {
    using namespace bw;
    tma_prefetch_desc(&p.q_map);
    tma_prefetch_desc(&p.k_map);
    tma_prefetch_desc(&p.v_map);
    tma_prefetch_desc(&p.do_map);
    const BwdSeq sq = bwd_seq(p, batch);
    mbar_arrive_expect_tx(&s.kv_full, 2u * KV_BN * D * 2);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
        tma_load_4d(&s.k[c][0][0], &p.k_map, &s.kv_full, c * SW_ELEMS, sq.k0 + n_block * KV_BN, kv_head, sq.tb);
        tma_load_4d(&s.v[c][0][0], &p.v_map, &s.kv_full, c * SW_ELEMS, sq.k0 + n_block * KV_BN, kv_head, sq.tb);
    }
    int first_m, end_m;
    dkdv_m_range(p, sq, n_block, first_m, end_m);
    const int per_head = end_m - first_m;
    const int total = per_head * p.group;
    // Not unrolled in one-pass builds: with a 2-stage ring (core 3) ptxas unrolled this loop by 4
    // and the per-copy addresses spilled the producer's 40 registers (two-pass SASS unchanged).
    BWD_PRODUCER_LOOP
    for (int it = 0; it < total; ++it) {
        const int head = kv_head * p.group + it / per_head;
        const int m_block = first_m + it % per_head;
        const int row = sq.q0 + m_block * KV_BM;
        const int st = (int)bwd_opaque(bwd_stage<KV_STAGES>(it));  // d256: no per-stage addresses held
        mbar_wait(&s.empty[st], bwd_phase<KV_STAGES>(it) ^ 1);
        mbar_arrive_expect_tx(&s.full[st], 2u * KV_BM * D * 2 + (FC_STAGE_STATS ? 2u * KV_BM * 4 : 0u));
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            tma_load_4d(&s.q[st][c][0][0], &p.q_map, &s.full[st], c * SW_ELEMS, row, head, sq.tb);
            tma_load_4d(&s.d_o[st][c][0][0], &p.do_map, &s.full[st], c * SW_ELEMS, row, head, sq.tb);
        }
        if constexpr (FC_STAGE_STATS && !FC_ONEPASS) dkdv_stats_load(p, s, st, batch, head, m_block);
    }
}

// The one pass's stats loader (an idle producer warp's lane 0): the same walk as the producer,
// issuing only the LSE₂/D copies of each stage. Their bytes are in the producer's expect_tx, so
// the stage's phase cannot complete without them; a copy that lands before the producer's
// arrive leaves the transaction count below zero until then, as a peer's multicast load does.
// (In the producer's own loop the two copies spilled the one pass's 40-register region.)
FC_DEVICE void dkdv_stats_loader(const BwdParams& p, DkdvShared& s, int n_block, int kv_head, int batch) {
    using namespace bw;
    const BwdSeq sq = bwd_seq(p, batch);
    int first_m, end_m;
    dkdv_m_range(p, sq, n_block, first_m, end_m);
    const int per_head = end_m - first_m;
    const int total = per_head * p.group;
    BWD_PRODUCER_LOOP  // as the producer's loop
    for (int it = 0; it < total; ++it) {
        const int st = bwd_stage<KV_STAGES>(it);
        mbar_wait(&s.empty[st], bwd_phase<KV_STAGES>(it) ^ 1);
        dkdv_stats_load(p, s, st, batch, kv_head * p.group + it / per_head, first_m + it % per_head);
    }
}

// One pass: dSᵀ of the last two tiles ([DS_A][DS_ROWS][64] each: [QCH][KV_BN][64], 80-row tiles
// [key chunk][KV_BM][64]), the tile's fp32 dQ partial (fragment order, fc_bwd_onepass.cuh) and its
// full/empty barriers, beside DkdvShared.
struct OnepassShared {
    uint16_t ds[2][bw::DS_A][bw::DS_ROWS][64];
    float dq[bw::DQ_BUFS][bw::DQ_TILE];
    DkdvShared kv;
    uint64_t dq_full[bw::DQ_BARS], dq_empty[bw::DQ_BARS];  // per buffer (core 4: per piece)
};

// The one-pass block around `s` (a constant offset: nothing more held across the loop; the size
// check shows the members are unpadded, so `kv` sits right after `ds` and `dq`).
constexpr int ONEPASS_KV_OFFSET = 2 * bw::DS_A * bw::DS_ROWS * 64 * 2 + bw::DQ_BUFS * bw::DQ_TILE * 4;
static_assert(sizeof(OnepassShared) == ONEPASS_KV_OFFSET + sizeof(DkdvShared) + 16 * bw::DQ_BARS,
              "OnepassShared is unpadded");
// Opaque: addresses derived from it are rebuilt where used, not hoisted out of the loop (spills).
FC_DEVICE OnepassShared& onepass_of(DkdvShared& s) {
    uint8_t* base = reinterpret_cast<uint8_t*>(&s);
    asm volatile("" : "+l"(base));
    return *reinterpret_cast<OnepassShared*>(base - ONEPASS_KV_OFFSET);
}

template <bool DQ>
FC_DEVICE void dkdv_consumer(const BwdParams& p, DkdvShared& s, uint16_t (*ds)[bw::DS_A][bw::DS_ROWS][64], int wg,
                             int n_block, int kv_head, int batch) {
    using namespace bw;
    const int warp = warp_id_in_block() % 4;
    const int lane = lane_id();
    // This thread's two key rows (row halves h = 0, 1 are 8 apart) and first query column.
    // HSPLIT: both warpgroups own the same 64 keys and head-dim half wg of their dK, dV.
    const int key_wg = HSPLIT == 1 ? wg : 0;
    const uint32_t dim_off = (HSPLIT == 1 ? 0 : wg) * (DWG / SW_ELEMS) * (KV_BM * ROW_BYTES);
    const int key0 = n_block * KV_BN + key_wg * 64 + warp * 16 + lane / 4;
    const int col0 = 2 * (lane % 4);
    const BwdSeq sq = bwd_seq(p, batch);
#if !(FC_VARLEN && FC_WINDOW)
    const bool key_in[2] = {key0 < sq.len_k, key0 + 8 < sq.len_k};
#endif

    float dk[DWG / 2], dv[DWG / 2];
#pragma unroll
    for (int i = 0; i < DWG / 2; ++i) dk[i] = dv[i] = 0.0f;

    const uint32_t k_base = smem_u32(&s.k[0][key_wg * 64][0]);
    const uint32_t v_base = smem_u32(&s.v[0][key_wg * 64][0]);
    int first_m, end_m;
    dkdv_m_range(p, sq, n_block, first_m, end_m);
    const int per_head = end_m - first_m;
    const int total = per_head * p.group;
    mbar_wait(&s.kv_full, 0);
    const Turns turns{wg, total};
    turns.start();
    (void)ds;

    for (int it = 0; it < total; ++it) {
#if FC_VARLEN && FC_WINDOW
        // Varlen windows: the sequence's lengths read afresh per tile (fc_bwd_varlen.cuh).
        const BwdSeq sqi = bwd_seq_fresh(p);
        const bool key_in[2] = {key0 < sqi.len_k, key0 + 8 < sqi.len_k};
#else
        const BwdSeq& sqi = sq;
#endif
#if FC_WINDOW
        // The range again from a fresh read of the block index (two passes: n_block is
        // blockIdx.x): held across the loop beside dK and dV it spilled at d128.
        int first_t, end_t;
        dkdv_m_range(p, sqi, bwd_block_x(), first_t, end_t);
        const int head = kv_head * p.group + it / (end_t - first_t);
        const int m_block = first_t + it % (end_t - first_t);
#else
        const int head = kv_head * p.group + it / per_head;
        const int m_block = first_m + it % per_head;
#endif
        const int st = bwd_stage<KV_STAGES>(it);
        const uint32_t q_base = smem_u32(&s.q[st][0][0][0]);
        const uint32_t do_base = smem_u32(&s.d_o[st][0][0][0]);

        // This tile's LSE₂ and D for the thread's query columns, from the stage (the producer's
        // bulk copies) or the padded workspace: read where they are used, as holding all 32
        // beside dK, dV, Sᵀ and dPᵀ would spill at d128.
#if FC_STAGE_STATS
        const TileStats stats{smem_u32(&s.lse2[st][col0]), smem_u32(&s.dvec[st][col0])};
        (void)head;
#else
        const int64_t ws_row = ((int64_t)batch * p.heads_q + head) * p.sq_pad + m_block * KV_BM + col0;
        const TileStats stats{reinterpret_cast<const float*>(p.lse2_ptr) + ws_row,
                              reinterpret_cast<const float*>(p.dvec_ptr) + ws_row};
#endif

        mbar_wait(&s.full[st], bwd_phase<KV_STAGES>(it));
        // Varlen: rows past the sequence's queries become zeros (fc_bwd_varlen.cuh).
        bwd_clear_dead_rows<KV_BM>(&s.q[st][0][0][0], &s.d_o[st][0][0][0], sqi.len_q - m_block * KV_BM, wg);
        float sacc[KV_BM / 2], dpacc[KV_BM / 2];
        turns.wait(it);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            Mma<KV_BM>::ss(sacc, bwd_desc_k(dkdv_opaque(k_base), KV_BN, kk), bwd_desc_k(bwd_opaque(q_base), KV_BM, kk), kk > 0);
        }
        wgmma_commit();
#if BWD_DQ_T_NARROW
        // 80-row tiles: dPᵀ is issued after Pᵀ's exponentials (below), not beside Sᵀ: dK, dV and
        // both m64n80 accumulators in flight at once left ptxas too few registers (it serialized
        // every wgmma of the kernel).
        turns.pass(it);
        wgmma_wait<0>();
#else
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            Mma<KV_BM>::ss(dpacc, bwd_desc_k(dkdv_opaque(v_base), KV_BN, kk), bwd_desc_k(bwd_opaque(do_base), KV_BM, kk), kk > 0);
        }
        wgmma_commit();
        turns.pass(it);
        // Sᵀ is ready while dPᵀ may still run: Pᵀ's exponentials overlap that GEMM, and dSᵀ
        // overlaps dV += Pᵀ dO.
        wgmma_wait<1>();
#endif
        fence_regs(sacc);

        // Causal: query − key ≥ Sq − Sk; relative to this thread's first (key, query) pair.
        const int rel = m_block * KV_BM + col0 - key0 - (sqi.len_q - sqi.len_k);
#if FC_SOFTCAP
        const float cap_log2 = p.softcap_out * p.scale_log2;
#endif
#if FC_WINDOW && FC_VARLEN
        // Varlen: the hoisted test (fc_bwd_mask.cuh); dense builds keep the per-element form
        // (hoisted, the causal d128 softcap build spilled).
        const BwdWindowTest win = bwd_window_test(p, rel);
#endif
#pragma unroll
        for (int i = 0; i < KV_BM / 2; ++i) {
            const int h = (i / 2) % 2;
            const int off = 8 * (i / 4) + (i % 2) - 8 * h;  // (query − key) − rel
            bool visible = key_in[h];
#if FC_WINDOW && FC_VARLEN
            visible = visible && win(off);
#elif FC_WINDOW
            visible = visible && bwd_in_window(p, rel + off);
#elif FC_CAUSAL
            visible = visible && (rel + off >= 0);
#else
            (void)off;
            (void)rel;
#endif
            const float l2 = stats.lse(8 * (i / 4) + (i % 2));
#if FC_SOFTCAP
            // Pᵀ from the capped logit (t = tanh(s·softcap_in); the exponent is t·cap_log2).
            sacc[i] = select_f(visible, fast_exp2(fmaf(bwd_softcap_t(p, sacc[i]), cap_log2, -l2)), 0.0f);
#else
            sacc[i] = select_f(visible, fast_exp2(fmaf(sacc[i], p.scale_log2, -l2)), 0.0f);
#endif
        }
        uint32_t pf[KV_BM / 16][4], sf[KV_BM / 16][4];
        acc_to_frags<KV_BM>(sacc, pf);
        wgmma_fence();
#if BWD_DQ_T_NARROW
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            Mma<KV_BM>::ss(dpacc, bwd_desc_k(dkdv_opaque(v_base), KV_BN, kk), bwd_desc_k(bwd_opaque(do_base), KV_BM, kk), kk > 0);
        }
        wgmma_commit();
#endif
#pragma unroll
        for (int kk = 0; kk < KV_BM / 16; ++kk) {
            Mma<DWG>::rs_tb(dv, pf[kk], bwd_desc_t(do_base + dim_off, KV_BM, kk), 1);
        }
        wgmma_commit();

        wgmma_wait<1>();  // dPᵀ is ready; dV += Pᵀ dO may still run
        fence_regs(dpacc);
        // dSᵀ = Pᵀ ∘ (dPᵀ − D) with Pᵀ as the 16-bit fragments dV used: holding the fp32 Pᵀ too
        // would spill (dK, dV, dPᵀ and the fragments already take ~200 registers at d128).
#pragma unroll
        for (int kk = 0; kk < KV_BM / 16; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                float p0, p1;
                unpack_elem2(pf[kk][r], p0, p1);
                const int i = 8 * kk + 2 * r;
                const float2 dd = stats.d_pair(8 * (i / 4));
#if FC_SOFTCAP
                // Softcap: Pᵀ·(1 − t²), t recovered from the 16-bit Pᵀ (fc_bwd_mask.cuh).
                const float2 ll = stats.lse_pair(8 * (i / 4));
                p0 = bwd_softcap_grad_from_p(p0, ll.x, cap_log2);
                p1 = bwd_softcap_grad_from_p(p1, ll.y, cap_log2);
#endif
                dpacc[i] = p0 * (dpacc[i] - dd.x);
                dpacc[i + 1] = p1 * (dpacc[i + 1] - dd.y);
            }
        }
        acc_to_frags<KV_BM>(dpacc, sf);
        // One pass (the order of FA3's sm90 backward): dSᵀ to shared memory for both warpgroups
        // and this warpgroup's 64×64 piece of the tile's dQ partial issued before dK += dSᵀ Q;
        // once dQ is done its partial goes to shared memory while dK runs, and the writer warp
        // takes it to the workspace on this key block's turn (fc_bwd_onepass.cuh).
        float dq[DQ ? DQ_ACC : 1];
#if BWD_DQ_T
        // 80-row tiles: dK += dSᵀ Q is issued first and retired (with dV) before dQᵀ's GEMM, so
        // dSᵀ's fragments are dead while dQᵀ's 40 accumulators are live: with both, ptxas
        // serialized every wgmma of the kernel (insufficient registers). dSᵀ's store to shared
        // memory and the warpgroups' barrier overlap dK. FC_BWD_WIDE (240 registers): only dV is
        // retired first, and dQᵀ's GEMM runs beside dK.
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KV_BM / 16; ++kk) {
            Mma<DWG>::rs_tb(dk, sf[kk], bwd_desc_t(q_base + dim_off, KV_BM, kk), 1);
        }
        wgmma_commit();
        static_assert(DQ, "80-row tiles are one-pass only");
        onepass_issue_dq(onepass_of(s).ds[it & 1], s.k, sf, pf, dq, wg, warp * 16 + lane / 4, col0);
        wgmma_wait<0>();
        fence_regs(dq);
#if FC_BWD_WIDE
        fence_frags(sf);  // dK read them until this wait
#endif
        {
            OnepassShared& o = onepass_of(s);
            onepass_put_dq(o.dq, o.dq_full, o.dq_empty, dq, wg, it);
        }
        fence_regs(dv);
        fence_regs(dk);
#else
        if constexpr (DQ) onepass_issue_dq(onepass_of(s).ds[it & 1], s.k, sf, pf, dq, wg, warp * 16 + lane / 4, col0);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KV_BM / 16; ++kk) {
            Mma<DWG>::rs_tb(dk, sf[kk], bwd_desc_t(q_base + dim_off, KV_BM, kk), 1);
        }
        wgmma_commit();
        if constexpr (DQ) {
            wgmma_wait<1>();  // dQ is done (core 1+: and dV, issued before it); dK may still run
            fence_regs(dq);
#if FC_BWD_CORE >= 1
            fence_regs(dv);
            fence_frags(pf);
#endif
            OnepassShared& o = onepass_of(s);
            onepass_put_dq(o.dq, o.dq_full, o.dq_empty, dq, wg, it);
            wgmma_wait<0>();
            fence_regs(dv);
            fence_regs(dk);
            fence_frags(sf);
        } else {
            (void)dq;
            wgmma_wait<0>();
            fence_regs(dv);
            fence_regs(dk);
            fence_frags(pf);
            fence_frags(sf);
        }
#endif  // BWD_DQ_T
        bwd_release(&s.empty[st]);
    }
    dk[0] = bwd_leak(dk[0], dv[0], reinterpret_cast<const float*>(p.lse2_ptr));
#if FC_VARLEN && FC_WINDOW
    const BwdSeq sqe = bwd_seq_fresh(p);  // not held across the loop (fc_bwd_varlen.cuh)
#else
    const BwdSeq& sqe = sq;
#endif
    // Keys past Sk are not stored (public); a key no query sees keeps dK = dV = 0.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key < sqe.k_rows) {
            const int64_t off = batch * p.k_stride_b + (int64_t)(sqe.k0 + key) * p.k_stride_s + kv_head * p.k_stride_h +
                                col0 + (HSPLIT == 1 ? 0 : wg * DWG);
#if FC_VARLEN
            // A key past seqused_k: zeros (its rows of dK, dV may hold NaN from its own K, V).
            if (key >= sqe.len_k) {
                bwd_store_zero_row<DWG>(reinterpret_cast<uint16_t*>(p.dk_ptr) + off);
                bwd_store_zero_row<DWG>(reinterpret_cast<uint16_t*>(p.dv_ptr) + off);
                continue;
            }
#endif
            bwd_store_row<DWG>(reinterpret_cast<uint16_t*>(p.dk_ptr) + off, dk, h, p.scale);
            bwd_store_row<DWG>(reinterpret_cast<uint16_t*>(p.dv_ptr) + off, dv, h, 1.0f);
        }
    }
}
