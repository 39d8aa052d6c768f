// Writing a tile's result: normalise O by the softmax sum, store it (rows past Sq are not
// stored) and the log-sum-exp. Split mode parks an unnormalised partial per CTA and combines the
// cluster's partials through distributed shared memory in a fixed order (rank 0, 1, …): no
// atomics, bitwise deterministic. Fully masked rows get O = 0 and LSE = −inf by select.
#pragma once
#include "fc_consumer.cuh"
#include "fc_cluster.cuh"
#include "fc_tma.cuh"

FC_DEVICE float lse_of(float m_raw, float total, float scale) {
    const float m = select_f(m_raw == neg_inf(), 0.0f, m_raw);
    return m * scale + fast_log2(total) * 0.69314718055994530942f;
}

// A row's normalisation: the factor for its unnormalised O (relative to its raw max `m_raw`,
// −inf for a row with no visible key) and its LSE. `ok` false zeroes the row (secret-length
// padding rows), by select. With learnable sinks (`sinks` ≠ 0, fp32 [Hq], secret: arithmetic
// only) the head's sink logit adds exp(sink) to the denominator and no value row (gpt-oss): the
// row is rebased on max(scaled max, sink), so a row with no visible key gets O = 0, LSE = sink.
struct RowNorm {
    float inv, lse;
};
FC_DEVICE RowNorm row_norm(uint64_t sinks, int head, float scale_log2, float scale, float m_raw, float total,
                           bool ok) {
    RowNorm r;
    if (sinks == 0) {  // a public parameter
        const bool any = total > 0.0f && ok;
        r.inv = select_f(any, fast_rcp(total), 0.0f);
        r.lse = select_f(any, lse_of(m_raw, total, scale), neg_inf());
    } else {
        // In log2 units: the row's scaled max (−inf for no key) and the sink; rebase on the larger.
        const float sink2 = reinterpret_cast<const float*>(sinks)[head] * 1.44269504088896341f;
        const float mc = m_raw * scale_log2;
        const float big = fmaxf(mc, sink2);
        const float base = select_f(big == neg_inf(), 0.0f, big);
        const float w = fast_exp2(mc - base);  // the row's terms, rebased (0 for no key)
        const float den = total * w + fast_exp2(sink2 - base);
        const bool any = den > 0.0f && ok;
        r.inv = select_f(any, w * fast_rcp(den), 0.0f);
        r.lse = select_f(any, (base + fast_log2(den)) * 0.69314718055994530942f, neg_inf());
    }
    return r;
}

// Stores row half `h` of this thread's accumulator, scaled by `inv`, at `out` (the row's first
// element plus this thread's column).
FC_DEVICE void store_row(uint16_t* out, const float (&o)[cfg::D / 2], int h, float inv) {
#pragma unroll
    for (int j = 0; j < cfg::D / 8; ++j) {
        const uint32_t packed = pack_elem2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(out + 8 * j) = packed;
    }
}

// The four lanes of a quad hold one row's columns in pairs (lane c: columns 8j + 2c, +1 of each
// 8-column chunk j). A 4×4 transpose of the packed words of chunks 4g .. 4g+3 gives lane c the
// whole 16-byte chunk 4g + c: two butterfly exchanges (xor 1, then xor 2), selects on the lane.
FC_DEVICE void quad_transpose(uint32_t (&a)[4], int c) {
    const bool odd = (c & 1) != 0;
#pragma unroll
    for (int k = 0; k < 4; k += 2) {
        const uint32_t r = __shfl_xor_sync(0xffffffffu, odd ? a[k] : a[k + 1], 1);
        a[k] = odd ? r : a[k];
        a[k + 1] = odd ? a[k + 1] : r;
    }
    const bool hi = (c & 2) != 0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const uint32_t r = __shfl_xor_sync(0xffffffffu, hi ? a[k] : a[k + 2], 2);
        a[k] = hi ? r : a[k];
        a[k + 2] = hi ? a[k + 2] : r;
    }
}

// store_row with 16-byte stores: a quarter of the store instructions and whole 32-byte sectors
// per lane pair, where the 4-byte stores wrote half-sectors of eight rows each (PERF_NOTES,
// the epilogue was a fifth to a third of a short tile). `row_out` is the row's
// first element, 16-byte aligned; every lane of the warp calls it (the shuffles), and `store`
// (public: the row is inside Sq) decides the write.
FC_DEVICE void store_row_vec(uint16_t* row_out, const float (&o)[cfg::D / 2], int h, float inv, int quad_lane,
                             bool store) {
#pragma unroll
    for (int g = 0; g < cfg::D / 32; ++g) {
        uint32_t a[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 4 * g + k;
            a[k] = pack_elem2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
        }
        quad_transpose(a, quad_lane);
        if (store) *reinterpret_cast<uint4*>(row_out + 8 * (4 * g + quad_lane)) = make_uint4(a[0], a[1], a[2], a[3]);
    }
}

// The TMA-store path (kStoreTma builds, p.o_tma): this warp's 16 rows of O, normalised and
// packed, go into its own 16 rows of the tile's Q buffer (Q is dead: every Q Kᵀ is complete) with
// `stmatrix`, in the 128-byte-swizzled layout a TMA load of Q writes, and one lane stores them
// through o_map (rows past Sq are not written: the map's bounds). It does not wait for the store:
// the next tile's main loop releases the Q buffer once the store has read it
// (Consumer::release_stored_q). Fewer instructions than the stores from registers (no quad
// transposes, no per-row addresses), and the global writes complete asynchronously.
FC_DEVICE void store_o_tma(const Consumer& c, const float (&o)[cfg::D / 2], const float (&inv)[2]) {
    using namespace cfg;
    const Params& p = c.p;
    const int lane = c.lane;
    const int warp_row = c.row0 - lane / 4 - (FC_DECODE ? 0 : c.m_block * BM);  // the warp's first row in the tile
    const uint32_t rows = c.q_base + (warp_row - c.wg * 64) * ROW_BYTES;  // its first row, chunk 0
    // stmatrix .x4 of 16 columns: matrices (rows 0–7, 8–15) × (columns 8j, 8j + 8); lane l gives
    // the address of row l % 8 of matrix l / 8. Its 16-byte unit sits at (unit ^ row % 8).
    const int mat = lane / 8;
    const int r = (mat % 2) * 8 + lane % 8;
#pragma unroll
    for (int jj = 0; jj < D / 16; ++jj) {
        const int j = 2 * jj;
        uint32_t v[4];
        v[0] = pack_elem2(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]);
        v[1] = pack_elem2(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]);
        v[2] = pack_elem2(o[4 * j + 4] * inv[0], o[4 * j + 5] * inv[0]);
        v[3] = pack_elem2(o[4 * j + 6] * inv[1], o[4 * j + 7] * inv[1]);
        const int blk = j + mat / 2;  // the 8-column block this lane addresses
        const uint32_t addr = rows + (blk / 8) * (BM * ROW_BYTES) + r * ROW_BYTES + ((blk % 8) ^ (r % 8)) * 16;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]),
                     "r"(v[1]), "r"(v[2]), "r"(v[3])
                     : "memory");
    }
    fence_proxy_async_smem();  // the generic stores, before the async proxy's reads
    __syncwarp();
    if (lane == 0) {
#if FC_VARLEN
        const int row = c.q_start + c.m_block * BM + warp_row;  // the pack's row (map: batch extent 1)
#else
        const int row = c.m_block * BM + warp_row;
#endif
#pragma unroll
        for (int ch = 0; ch < CHUNKS; ++ch) {
            tma_store_4d(&p.o_map, rows + ch * (BM * ROW_BYTES), ch * SW_ELEMS, row, c.head, c.batch);
        }
        bulk_commit_group();
    }
}

// `q_buf`: the Q buffer this tile loaded (kStoreTma builds), −1 when it loaded none (a fully
// masked tile). Returns the Q buffer O went out through, still to be released once its store has
// read it (Consumer::release_stored_q), or −1.
FC_DEVICE int epilogue(const Consumer& c, const float (&o)[cfg::D / 2], const OnlineSoftmax<cfg::BN>& softmax,
                       int q_buf) {
    using namespace cfg;
    const Params& p = c.p;
    float total[2];
    softmax.finish(total);
#if FC_VARLEN
    // Rows of this sequence only (never the next one's), at its offset in the pack.
    const int rows_q = c.seqlen_q;
    const int row_base = c.q_start;
#else
    const int rows_q = p.seqlen_q;
    const int row_base = 0;
#endif
    // 16-byte stores need 16-byte aligned rows: a public property of the output's address and
    // strides (the API allows 4-byte aligned outputs, which keep the 4-byte stores). Not in
    // 176-key builds: at 240 registers the transpose spills there (long sequences only, where the
    // epilogue is a small share of a tile).
    const bool vec = !LONG_KEYS && ((p.o_ptr | (uint64_t)(p.o_stride_b | p.o_stride_s | p.o_stride_h) << 1) & 15) == 0;
    // The tile's O may leave through its Q buffer (public: the build, O's alignment, the walk's
    // length); then every warp releases that buffer in the next tile. In varlen tiles a warp
    // whose 16 rows run past its sequence (into the next one's) stores from registers instead
    // (public: the sequence's length).
    const bool tile_tma = kStoreTma && p.o_tma && q_buf >= 0;
    bool warp_tma = tile_tma;
#if FC_VARLEN
    // The same for every lane (row0 − lane/4 is the warp's first row); a vote makes that visible
    // to the compiler, so the store's __syncwarp stays a plain warp barrier.
    warp_tma = warp_tma && __all_sync(0xffffffffu, c.row0 - c.lane / 4 + 16 <= rows_q);
#endif
    if (warp_tma) {
        float inv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = c.row0 + 8 * h;
            const RowNorm n = row_norm(p.sinks_ptr, c.head, p.scale_log2, p.scale, softmax.row_max[h], total[h],
                                       !FC_SECRET_LEN || row < c.key_limit);
            inv[h] = n.inv;
            if (row < rows_q && p.lse_ptr != 0 && (c.lane % 4) == 0) {
                float* lse_out = reinterpret_cast<float*>(p.lse_ptr) +
                                 ((int64_t)c.batch * p.heads_q + c.head) * p.seqlen_q + row_base + row;
                *lse_out = n.lse;
            }
        }
        store_o_tma(c, o, inv);
        return q_buf;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = c.row0 + 8 * h;
        // `any` is false only for a fully masked row; in secret-length mode rows at or past
        // the true length are zeroed too (a select on a secret, never a branch).
        const RowNorm n = row_norm(p.sinks_ptr, c.head, p.scale_log2, p.scale, softmax.row_max[h], total[h],
                                   !FC_SECRET_LEN || row < c.key_limit);
        uint16_t* const row_out = reinterpret_cast<uint16_t*>(p.o_ptr) + c.batch * p.o_stride_b +
                                  (int64_t)(row_base + row) * p.o_stride_s + c.head * p.o_stride_h;
        if (vec) store_row_vec(row_out, o, h, n.inv, c.lane % 4, row < rows_q);
        if (row < rows_q) {
            if (!vec) store_row(row_out + c.col0, o, h, n.inv);
            if (p.lse_ptr != 0 && (c.lane % 4) == 0) {
                // Varlen: [Hq, total tokens] (seqlen_q is the pack's total), flash-attn's layout.
                float* lse_out = reinterpret_cast<float*>(p.lse_ptr) +
                                 ((int64_t)c.batch * p.heads_q + c.head) * p.seqlen_q + row_base + row;
                *lse_out = n.lse;
            }
        }
    }
    return tile_tma ? q_buf : -1;
}

// Split mode: park the unnormalised partial (O, max, sum) in shared memory for the combine.
FC_DEVICE void write_partial(const Consumer& c, const float (&o)[cfg::D / 2], const OnlineSoftmax<cfg::BN>& softmax) {
#if FC_SPLIT > 1
    using namespace cfg;
    Shared& s = c.s;
    float total[2];
    softmax.finish(total);
    const int local0 = c.row0 - c.m_block * BM;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = local0 + 8 * h;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            s.part_o[r][8 * j + c.col0] = o[4 * j + 2 * h];
            s.part_o[r][8 * j + c.col0 + 1] = o[4 * j + 2 * h + 1];
        }
        if ((c.lane % 4) == 0) {
            s.part_m[r] = softmax.row_max[h];
            s.part_l[r] = total[h];
        }
    }
#endif
}

// Split mode: after the cluster barrier, CTA `rank` combines rows [rank·BM/SPLIT, …) of the
// query tile from every CTA's partial, in rank order, normalises, and writes O and the LSE.
FC_DEVICE void combine_split(const Params& p, Shared& s, Tile t, int key_limit) {
#if FC_SPLIT > 1
    using namespace cfg;
    constexpr int ROWS = BM / SPLIT;
    constexpr int THREADS_C = 128 * CONSUMERS;
    const int tid = threadIdx.x - 128;
    const uint32_t rank = cluster_rank();
#pragma unroll
    for (int e = 4 * tid; e < ROWS * D; e += 4 * THREADS_C) {
        const int r = rank * ROWS + e / D;
        const int col = e % D;
        float m_s[SPLIT];
        float m_all = neg_inf();
#pragma unroll
        for (int q = 0; q < SPLIT; ++q) {
            m_s[q] = cluster_load_f32(cluster_map(smem_u32(&s.part_m[r]), q));
            m_all = fmaxf(m_all, m_s[q]);
        }
        const float m_use = select_f(m_all == neg_inf(), 0.0f, m_all);
        float l = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
#pragma unroll
        for (int q = 0; q < SPLIT; ++q) {  // fixed order: deterministic
            const float w = fast_exp2((m_s[q] - m_use) * p.scale_log2);
            l += cluster_load_f32(cluster_map(smem_u32(&s.part_l[r]), q)) * w;
            const float4 v = cluster_load_f32x4(cluster_map(smem_u32(&s.part_o[r][col]), q));
            o0 += v.x * w;
            o1 += v.y * w;
            o2 += v.z * w;
            o3 += v.w * w;
        }
        const int row = t.m_block * BM + r;
        // m_all, not m_use: they differ only for a row with no key, whose partials are all 0.
        const RowNorm n = row_norm(p.sinks_ptr, t.head, p.scale_log2, p.scale, m_all, l,
                                   !FC_SECRET_LEN || row < key_limit);
        const float inv = n.inv;
        if (row < p.seqlen_q) {
            uint16_t* out = reinterpret_cast<uint16_t*>(p.o_ptr) + t.batch * p.o_stride_b + (int64_t)row * p.o_stride_s +
                            t.head * p.o_stride_h + col;
            uint2 packed;
            packed.x = pack_elem2(o0 * inv, o1 * inv);
            packed.y = pack_elem2(o2 * inv, o3 * inv);
            *reinterpret_cast<uint2*>(out) = packed;
            if (p.lse_ptr != 0 && col == 0) {
                float* lse_out = reinterpret_cast<float*>(p.lse_ptr) + ((int64_t)t.batch * p.heads_q + t.head) * p.seqlen_q + row;
                *lse_out = n.lse;
            }
        }
    }
#endif
}
