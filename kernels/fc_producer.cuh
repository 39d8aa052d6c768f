// The producer: one thread of warpgroup 0 streams every tile of this CTA through TMA — Q into
// its buffer (once the consumers' last Q Kᵀ of the previous tile is done), K and V into the
// STAGES-deep ring. The ring runs on across tiles, so the next tile's first K/V blocks load
// while the consumers finish this one (the point of the persistent grid).
#pragma once
#include "fc_scheduler.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"

#if FC_PAGED
// A paged KV cache (decode mode): K and V are pools of pages; a K/V block of BN keys is one TMA
// box of box_rows = min(page size, BN) rows per page it spans, each page looked up in the block
// table (public metadata, DESIGN.md §1) and clamped into the pool, so no entry can address
// outside it. Boxes land 16-row aligned, so the 128-byte swizzle matches a whole-block load's.
constexpr int MAX_BOXES = cfg::BN / 16;  // the smallest page is 16 rows

struct BlockPages {
    int page[MAX_BOXES];  // the pool index of each box
};

// Every entry is read (slots clamped into the table's row), used or not: unconditional loads
// from the table's own pointer, which the audit proves public.
FC_DEVICE BlockPages block_pages(const Params& p, int batch, int key_row) {
    BlockPages bp;
    const int32_t* table = reinterpret_cast<const int32_t*>(p.table_ptr) + (int64_t)batch * p.table_stride;
#pragma unroll
    for (int i = 0; i < MAX_BOXES; ++i) {
        const int slot = min((key_row + i * p.box_rows) >> p.page_shift, p.table_stride - 1);
        bp.page[i] = min(max(table[slot], 0), p.num_pages - 1);
    }
    return bp;
}

FC_DEVICE void load_kv_block(uint16_t (&dst)[cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS], const TensorMap* map, uint64_t* bar,
                             const Params& p, const BlockPages& bp, int key_row, int kv_head) {
    const int row_mask = (1 << p.page_shift) - 1;
#pragma unroll
    for (int i = 0; i < MAX_BOXES; ++i) {
        if (i * p.box_rows < cfg::BN) {
            const int row = (key_row + i * p.box_rows) & row_mask;  // the row inside its page
#pragma unroll
            for (int c = 0; c < cfg::CHUNKS; ++c) {
                tma_load_4d(&dst[c][i * p.box_rows][0], map, bar, c * cfg::SW_ELEMS, row, kv_head, bp.page[i]);
            }
        }
    }
}
#endif

FC_DEVICE void producer(const Params& p, Shared& s) {
    const Scheduler sched{p};
    tma_prefetch_desc(&p.q_map);
    tma_prefetch_desc(&p.k_map);
    tma_prefetch_desc(&p.v_map);
    int g = 0;       // K/V blocks streamed so far (ring position)
    int q_load = 0;  // Q tiles loaded so far
    const int end_unit = sched.end_unit();
    int n = 0;  // units taken (the dynamic order's hand-over)
    for (int unit = producer_next_unit(p, s, n++, sched.first_unit(), end_unit); unit < end_unit;
         unit = producer_next_unit(p, s, n++, unit + sched.unit_step(), end_unit)) {
        const int tiles = sched.tiles_in_unit(unit);
        for (int k = 0; k < tiles; ++k) {
            const Tile t = sched.tile(unit, k);
            const KvRange kv = tile_kv(p, t, tile_key_limit(p, t));
            if (kv.count == 0) continue;  // fully masked tile: consumers write zeros without Q
            const int kv_head = t.head / p.group;
            const int qb = q_load % cfg::QBUF;
            mbar_wait(&s.q_empty[qb], ((q_load / cfg::QBUF) & 1) ^ 1);
            mbar_arrive_expect_tx(&s.q_full[qb], cfg::Q_BYTES);
#pragma unroll
            for (int c = 0; c < cfg::CHUNKS; ++c) {
#if FC_DECODE
                // The packed map's dims are (dim, head, seq, batch): a box of `pack` heads by
                // BM / pack query positions fills the tile's 64 rows, position-major.
                tma_load_4d(&s.q[qb][c][0][0], &p.q_map, &s.q_full[qb], c * cfg::SW_ELEMS, t.head, t.m_block * qrows_per_tile(p), t.batch);
#elif FC_VARLEN
                // The sequence's tile inside the pack; rows past its end (the next sequence's,
                // or past the pack: zeros) are computed and never stored.
                tma_load_4d(&s.q[qb][c][0][0], &p.q_map, &s.q_full[qb], c * cfg::SW_ELEMS, t.q_start + t.m_block * cfg::BM, t.head, 0);
#else
                tma_load_4d(&s.q[qb][c][0][0], &p.q_map, &s.q_full[qb], c * cfg::SW_ELEMS, t.m_block * cfg::BM, t.head, t.batch);
#endif
            }
            ++q_load;
            for (int it = 0; it < kv.count; ++it, ++g) {
                const int stage = ring_stage(g);
                const uint32_t phase = ring_phase(g);
                const int key_row = kv_block(kv, it) * cfg::BN;
#if FC_PAGED
                const BlockPages bp = block_pages(p, t.batch, key_row);
                mbar_wait(&s.k_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.k_full[stage], cfg::KV_BYTES);
                load_kv_block(s.k[stage], &p.k_map, &s.k_full[stage], p, bp, key_row, kv_head);
                mbar_wait(&s.v_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.v_full[stage], cfg::KV_BYTES);
                load_kv_block(s.v[stage], &p.v_map, &s.v_full[stage], p, bp, key_row, kv_head);
#else
#if FC_VARLEN
                // Keys of the sequence from its first token; those past its count (the next
                // sequence's) are masked by select like a partial last block's.
                const int kv_row = t.k_start + key_row;
#else
                const int kv_row = key_row;
#endif
                mbar_wait(&s.k_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.k_full[stage], cfg::KV_BYTES);
#pragma unroll
                for (int c = 0; c < cfg::CHUNKS; ++c) {
                    tma_load_4d(&s.k[stage][c][0][0], &p.k_map, &s.k_full[stage], c * cfg::SW_ELEMS, kv_row, kv_head, t.batch);
                }
                mbar_wait(&s.v_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.v_full[stage], cfg::KV_BYTES);
#pragma unroll
                for (int c = 0; c < cfg::CHUNKS; ++c) {
                    tma_load_4d(&s.v[stage][c][0][0], &p.v_map, &s.v_full[stage], c * cfg::SW_ELEMS, kv_row, kv_head, t.batch);
                }
#endif
            }
        }
    }
}
