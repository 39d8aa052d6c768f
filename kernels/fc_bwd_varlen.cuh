// The sequence a backward CTA works on (varlen, FC_VARLEN): in a dense build the
// call's shape; in a varlen build sequence `b` of the pack, from cu_seqlens_q / cu_seqlens_k (and
// seqused_k) in device memory — public metadata (DESIGN.md §1), declared public to the audit
// (BwdVariant::declared). Offsets are clamped into the pack and lengths to max_seqlen (the grid
// and the workspace's padding are sized by it), so any values are memory-safe; values outside the
// contract only give that sequence wrong gradients, as in the forward.
#pragma once
#include "fc_bwd_config.cuh"

#ifndef FC_VARLEN
#define FC_VARLEN 0
#endif
static_assert(!(FC_VARLEN && FC_ONEPASS), "varlen: the two-pass kernels only");

struct BwdSeq {
    int q0, k0;        // the sequence's first packed query / key row (0 dense)
    int tb;            // the tensor maps' batch coordinate (the batch dense; 0: one packed batch)
    int len_q, len_k;  // query rows (seqused_q applied); keys the queries see (seqused_k applied)
    int k_rows;        // key rows whose dK, dV are stored (keys past seqused_k get zeros)
};

FC_DEVICE BwdSeq bwd_seq(const BwdParams& p, int b) {
    BwdSeq s;
#if FC_VARLEN
    const int* cu_q = reinterpret_cast<const int*>(p.cu_q_ptr);
    const int* cu_k = reinterpret_cast<const int*>(p.cu_k_ptr);
    const int q0 = max(0, min(p.vl_total_q, cu_q[b]));
    const int q1 = max(q0, min(p.vl_total_q, cu_q[b + 1]));
    const int k0 = max(0, min(p.vl_total_k, cu_k[b]));
    const int k1 = max(k0, min(p.vl_total_k, cu_k[b + 1]));
    s.q0 = q0;
    s.k0 = k0;
    s.tb = 0;
    s.k_rows = min(k1 - k0, p.seqlen_k);  // seqlen_q, seqlen_k: max_seqlen_q, max_seqlen_k
    // seqused_q / seqused_k: a prefix of the sequence's queries / keys. Without one the host
    // points the pointer at cu_seqlens + 1, whose entry b (≥ the sequence's count) leaves the
    // count as it is: no branch on the pointer (a conditional load defeats the audit's proof
    // that the loads read the public buffers).
    s.len_q = max(0, min(min(q1 - q0, p.seqlen_q), reinterpret_cast<const int*>(p.used_q_ptr)[b]));
    s.len_k = max(0, min(s.k_rows, reinterpret_cast<const int*>(p.used_k_ptr)[b]));
#else
    s.q0 = 0;
    s.k0 = 0;
    s.tb = b;
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
    s.k_rows = p.seqlen_k;
#endif
    return s;
}

// The sequence of this CTA (blockIdx.z) read afresh: varlen window builds call it per tile, so
// the compiler reloads its lengths (L1 hits) after the loop's barriers instead of holding them
// across the loop beside the gradient accumulators (held, they spilled: PERF_NOTES, bwdcombo).
FC_DEVICE BwdSeq bwd_seq_fresh(const BwdParams& p) {
    int z;
    asm volatile("mov.u32 %0, %%ctaid.z;" : "=r"(z));
    return bwd_seq(p, z);
}

// Sk − Sq of the sequence (dense: the call's, read from the parameters where it is used).
FC_DEVICE int bwd_seq_shift(const BwdParams& p, const BwdSeq& s) {
    return FC_VARLEN ? s.len_k - s.len_q : p.seqlen_k - p.seqlen_q;
}

// The forward's LSE of query row i of (b, h): dense [B, Hq, Sq]; varlen [Hq, total_q].
FC_DEVICE int64_t bwd_lse_index(const BwdParams& p, const BwdSeq& s, int b, int h, int i) {
#if FC_VARLEN
    (void)b;
    return (int64_t)h * p.vl_total_q + s.q0 + i;
#else
    (void)s;
    return ((int64_t)b * p.heads_q + h) * p.seqlen_q + i;
#endif
}

// Query tiles of the dK/dV kernel (KV_BM rows) and key blocks of the dQ kernel (Q_BN keys) of
// the sequence: the params' counts in a dense build.
FC_DEVICE int bwd_kv_m_blocks(const BwdParams& p, const BwdSeq& s) {
    return FC_VARLEN ? (s.len_q + bw::KV_BM - 1) / bw::KV_BM : p.kv_m_blocks;
}
FC_DEVICE int bwd_q_n_blocks(const BwdParams& p, const BwdSeq& s) {
    return FC_VARLEN ? (s.len_k + bw::Q_BN - 1) / bw::Q_BN : p.q_n_blocks;
}

// Varlen: rows [live, ROWS) of streamed [CHUNKS][ROWS][SW_ELEMS] tiles in shared memory hold the
// next sequence's tokens (or this sequence's past seqused_q / seqused_k). Inf or NaN there would
// reach this sequence's gradients through the GEMMs (a P or dS of 0 does not cancel them:
// 0 · Inf = NaN), so each consumer warpgroup writes zeros over those rows of both tiles before its
// GEMMs read the stage (the swizzle permutes 16-byte units inside a row: a row stays whole). The
// other warpgroup may read the stage meanwhile: it sees the same bits either way, and the
// producer refills it only after both released it. A tile that does not cross the end is left
// alone — a branch on public lengths (cu_seqlens). Dense builds: nothing (TMA zero-fills rows
// past the end).
template <int ROWS>
FC_DEVICE void bwd_clear_dead_rows(uint16_t* a, uint16_t* b, int live, int wg) {
#if FC_VARLEN
    using namespace bw;
    if (live >= ROWS) return;
    constexpr int VEC_PER_ROW = ROW_BYTES / 16;
    constexpr int VECS = CHUNKS * ROWS * VEC_PER_ROW;
    const uint32_t zero[4] = {0u, 0u, 0u, 0u};
    const uint32_t base_a = smem_u32(a), base_b = smem_u32(b);
#pragma unroll 1
    for (int i = threadIdx.x % 128; i < VECS; i += 128) {
        if ((i / VEC_PER_ROW) % ROWS >= live) {
            st_shared_v4(base_a + 16 * i, zero);
            st_shared_v4(base_b + 16 * i, zero);
        }
    }
    fence_proxy_async_smem();  // the generic stores, before the async proxy's reads
    named_bar_sync(4 + wg, 128);  // barriers 4, 5: free in two-pass builds (varlen has no one pass)
#else
    (void)a;
    (void)b;
    (void)live;
    (void)wg;
#endif
}

// A gradient row that must be exactly zero (a key past seqused_k): stored as zeros, not as the
// accumulator times 0 (the accumulator may hold NaN from the sequence's own unused key rows).
template <int N>
FC_DEVICE void bwd_store_zero_row(uint16_t* out) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) *reinterpret_cast<uint32_t*>(out + 8 * j) = 0u;
}
