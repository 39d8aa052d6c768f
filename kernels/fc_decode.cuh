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
    int32_t groups;  // split groups per row: a power of two ≤ 8 and ≤ num_splits (the host's rule)
    uint64_t sinks_ptr;  // fp32 [Hq] learnable sinks (secret), or 0 (Params::sinks_ptr)
};

// One output row is merged by D/4 · groups threads: thread (g, quad) owns four columns and
// splits g, g + groups, g + 2·groups, … in that order; the groups' sums are then added in group
// order through shared memory. Every step is fixed by num_splits (a function of Sk) alone, so
// the bits are deterministic and batch-invariant, and a row with many splits (one sequence over
// a long cache) is merged by up to 8 times as many threads as one per column quad would give.
// The CTA holds COMBINE_THREADS / (D/4 · groups) whole rows (the host keeps D/4 · groups ≤
// COMBINE_THREADS); `row` past the last is public and only skips loads and stores (every thread
// reaches the barriers).
constexpr int COMBINE_THREADS = 256;

FC_DEVICE void combine_rows(const CombineParams& c) {
    using namespace cfg;
    constexpr int QUADS = D / 4;
    __shared__ float4 red_o[COMBINE_THREADS];
    __shared__ float2 red_ml[COMBINE_THREADS];  // (group max, then group sum)
    const int groups = c.groups;
    const int per_row = QUADS * groups;
    const int t = (int)threadIdx.x;
    const int base = t - t % per_row;  // this row's first thread in the CTA
    const int g = (t % per_row) / QUADS;
    const int quad = t % QUADS;
    const int col = quad * 4;
    const int rows = c.batch * c.heads_q * c.seqlen_q;
    // d96's 24 quads per group do not divide the CTA: the threads past its whole rows idle
    // (public: the head dim and the split count).
    const int rows_per_cta = COMBINE_THREADS / per_row;
    const bool in_cta = t < rows_per_cta * per_row;
    const int row = (int)blockIdx.x * rows_per_cta + t / per_row;
    const bool live = in_cta && row < rows;
    const int64_t first = (int64_t)min(row, rows - 1) * c.num_splits;
    const float2* ml = reinterpret_cast<const float2*>(c.ws_ml_ptr) + first;
    const float4* part = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(c.ws_o_ptr) + first * D + col);

    // The row's max over every split: each group's, then across groups.
    float m_g = neg_inf();
    if (live) {
        for (int q = g; q < c.num_splits; q += groups) m_g = fmaxf(m_g, ml[q].x);
    }
    red_ml[t].x = m_g;
    __syncthreads();
    float m_all = neg_inf();
    if (in_cta) {
        for (int j = 0; j < groups; ++j) m_all = fmaxf(m_all, red_ml[base + j * QUADS + quad].x);
    }
    const float m_use = select_f(m_all == neg_inf(), 0.0f, m_all);

    float l = 0.0f;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (live) {
#pragma unroll 4
        for (int q = g; q < c.num_splits; q += groups) {  // fixed order: deterministic
            const float2 mq = ml[q];
            const float w = fast_exp2((mq.x - m_use) * c.scale_log2);
            l += mq.y * w;
            const float4 v = part[(int64_t)q * (D / 4)];
            o.x += v.x * w;
            o.y += v.y * w;
            o.z += v.z * w;
            o.w += v.w * w;
        }
    }
    __syncthreads();  // every thread has read red_ml's maxima
    red_o[t] = o;
    red_ml[t].y = l;
    __syncthreads();
    if (!live || g != 0) return;
    l = 0.0f;
    o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < groups; ++j) {  // group order: deterministic
        const int u = base + j * QUADS + quad;
        const float4 v = red_o[u];
        l += red_ml[u].y;
        o.x += v.x;
        o.y += v.y;
        o.z += v.z;
        o.w += v.w;
    }
    const int pos = row % c.seqlen_q;
    const int head = (row / c.seqlen_q) % c.heads_q;
    const int batch = row / (c.seqlen_q * c.heads_q);
    const RowNorm n = row_norm(c.sinks_ptr, head, c.scale_log2, c.scale, m_all, l, true);
    const float inv = n.inv;
    uint16_t* out = reinterpret_cast<uint16_t*>(c.o_ptr) + batch * c.o_stride_b + (int64_t)pos * c.o_stride_s +
                    head * c.o_stride_h + col;
    uint2 packed;
    packed.x = pack_elem2(o.x * inv, o.y * inv);
    packed.y = pack_elem2(o.z * inv, o.w * inv);
    *reinterpret_cast<uint2*>(out) = packed;
    if (c.lse_ptr != 0 && col == 0) {
        reinterpret_cast<float*>(c.lse_ptr)[row] = n.lse;
    }
}
