// Decode mode (FC_DECODE): few query positions over a long key range — generation steps and
// speculative verification. Two changes to the prefill kernel make it fast there:
//   GQA packing — the `pack` query heads that share a K/V head are rows of one 64-row tile
//     (position-major: row r is position r >> pack_shift, head r & (pack − 1)), so K/V are
//     streamed once per pack instead of once per query head;
//   split-KV — each tile's key range is cut into splits of `split_blocks` K/V blocks, one work
//     unit each, so one sequence fills the GPU. The split size is a function of Sk alone
//     (src/attention/decode.rs), never of the batch or the SM count: a sequence's bits do not
//     depend on its neighbours.
// KV-cache mode (with FC_SECRET_LEN): each sequence's key count (cache length after the append)
// is an i32 in device memory, kept secret: the kernel walks the cache's capacity Sk (public),
// masks keys at or past the count by select, and aligns a causal mask to the count.
// Each unit writes an unnormalised partial (O, max, sum) to a global workspace; a second kernel
// (flashcore_decode_combine) merges a row's partials in split order — no atomics, bitwise
// deterministic. With one split the unit writes the final output directly.
#pragma once
#include "fc_epilogue.cuh"

// Row `r` of the tile (0..63): its query position and head, and whether it is a real row.
struct PackedRow {
    int pos, head;
    bool valid;
};

FC_DEVICE PackedRow packed_row(const Params& p, int m_block, int first_head, int r) {
    PackedRow row;
    row.pos = m_block * qrows_per_tile(p) + (r >> p.pack_shift);
    row.head = first_head + (r & (p.pack - 1));
    row.valid = row.pos < p.seqlen_q;
    return row;
}

// Index of (batch, head, position) among the B·Hq·Sq output rows (the LSE's layout).
FC_DEVICE int64_t lse_row(const Params& p, int batch, int head, int pos) {
    return ((int64_t)batch * p.heads_q + head) * p.seqlen_q + pos;
}

FC_DEVICE void decode_epilogue(const Consumer& c, const float (&o)[cfg::D / 2], const OnlineSoftmax<cfg::BN>& softmax,
                               int split) {
    using namespace cfg;
    const Params& p = c.p;
    float total[2];
    softmax.finish(total);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const PackedRow row = packed_row(p, c.m_block, c.head, c.row0 + 8 * h);
        if (!row.valid) continue;  // public: a padding row of the last tile
        const int64_t lrow = lse_row(p, c.batch, row.head, row.pos);
        if (p.num_splits == 1) {
            const RowNorm n = row_norm(p.sinks_ptr, row.head, p.scale_log2, p.scale, softmax.row_max[h], total[h], true);
            store_row(reinterpret_cast<uint16_t*>(p.o_ptr) + c.batch * p.o_stride_b + (int64_t)row.pos * p.o_stride_s +
                          row.head * p.o_stride_h + c.col0,
                      o, h, n.inv);
            if (p.lse_ptr != 0 && (c.lane % 4) == 0) reinterpret_cast<float*>(p.lse_ptr)[lrow] = n.lse;
        } else {
            const int64_t entry = lrow * p.num_splits + split;
            float* part = reinterpret_cast<float*>(p.ws_o_ptr) + entry * D + c.col0;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                *reinterpret_cast<float2*>(part + 8 * j) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
            }
            if ((c.lane % 4) == 0) {
                *reinterpret_cast<float2*>(reinterpret_cast<float*>(p.ws_ml_ptr) + 2 * entry) =
                    make_float2(softmax.row_max[h], total[h]);
            }
        }
    }
}

// The combine kernel's parameters. Must match `CombineParams` in src/attention/decode.rs.
struct CombineParams {
    uint64_t o_ptr, lse_ptr, ws_o_ptr, ws_ml_ptr;
    int64_t o_stride_b, o_stride_s, o_stride_h;
    int32_t batch, heads_q, seqlen_q, num_splits;
    float scale_log2, scale;
    uint64_t sinks_ptr;  // fp32 [Hq] learnable sinks (secret), or 0 (Params::sinks_ptr)
};

// Thread `idx` merges four columns of one output row over every split, in split order.
FC_DEVICE void combine_row(const CombineParams& c, int idx) {
    using namespace cfg;
    constexpr int QUADS = D / 4;
    const int row = idx / QUADS;
    const int col = (idx % QUADS) * 4;
    const int pos = row % c.seqlen_q;
    const int head = (row / c.seqlen_q) % c.heads_q;
    const int batch = row / (c.seqlen_q * c.heads_q);
    const float2* ml = reinterpret_cast<const float2*>(c.ws_ml_ptr) + (int64_t)row * c.num_splits;
    const float4* part = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(c.ws_o_ptr) +
                                                         (int64_t)row * c.num_splits * D + col);
    float m_all = neg_inf();
    for (int q = 0; q < c.num_splits; ++q) m_all = fmaxf(m_all, ml[q].x);
    const float m_use = select_f(m_all == neg_inf(), 0.0f, m_all);
    float l = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
    for (int q = 0; q < c.num_splits; ++q) {  // fixed order: deterministic
        const float2 mq = ml[q];
        const float w = fast_exp2((mq.x - m_use) * c.scale_log2);
        l += mq.y * w;
        const float4 v = part[(int64_t)q * (D / 4)];
        o0 += v.x * w;
        o1 += v.y * w;
        o2 += v.z * w;
        o3 += v.w * w;
    }
    const RowNorm n = row_norm(c.sinks_ptr, head, c.scale_log2, c.scale, m_all, l, true);
    const float inv = n.inv;
    uint16_t* out = reinterpret_cast<uint16_t*>(c.o_ptr) + batch * c.o_stride_b + (int64_t)pos * c.o_stride_s +
                    head * c.o_stride_h + col;
    uint2 packed;
    packed.x = pack_elem2(o0 * inv, o1 * inv);
    packed.y = pack_elem2(o2 * inv, o3 * inv);
    *reinterpret_cast<uint2*>(out) = packed;
    if (c.lse_ptr != 0 && col == 0) {
        reinterpret_cast<float*>(c.lse_ptr)[row] = n.lse;
    }
}
