// The producer: one thread of warpgroup 0 streams every tile of this CTA through TMA — Q into
// its buffer (once the consumers' last Q Kᵀ of the previous tile is done), K and V into the
// STAGES-deep ring. The ring runs on across tiles, so the next tile's first K/V blocks load
// while the consumers finish this one (the point of the persistent grid). Paged builds enter
// with the whole warpgroup (PRODUCER_THREADS): pages of any other size than a power of two of
// at least 16 rows are gathered by all 128 threads; otherwise threads 1–127 leave at once.
#pragma once
#include "fc_scheduler.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"

#if FC_PAGED
// A paged KV cache (decode, and varlen for chunked prefill): K and V are pools of pages; a K/V
// block of BN keys is one TMA box of box_rows = min(page size, BN) rows per page it spans, each
// page looked up in the block table (public metadata, DESIGN.md §1) and clamped into the pool,
// so no entry can address outside it. Boxes land 16-row aligned, so the 128-byte swizzle
// matches a whole-block load's.
//
// Varlen builds address a virtual pack: sequence b's key j is row b · capacity + j, capacity a
// whole number of pages, and the table ([B][pages per sequence], row-major) is read as one row of
// B · pages-per-sequence entries (table_stride), so virtual row r's page is entry r / page_size —
// table[b][j / page_size]. The work list's key start is b · capacity plus the sequence's first
// key; the host takes TMA boxes only where every such start is a whole number of boxes (no left
// padding), else the gather below, which takes any row.
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

// Pages of any other size (1, 7, 48, 100, …): the producer warpgroup's 128 threads copy each
// key's row in 16-byte pieces with cp.async into the layout a TMA load gives (the same 64- or
// 128-byte swizzle, applied to the shared address as the hardware does), so the consumers read
// either alike. Key `key`'s page is table[key / page_size] (the slot clamped into the table's row,
// the entry into the pool, as above) and its row key mod page_size, in [0, page_size) whatever
// the clamp: every address stays inside the pool. Only public values reach an address: the
// table's entries, indices, strides and pointers.
#ifndef FC_ROW_GATHER
#define FC_ROW_GATHER 0
#endif
constexpr int GATHER_BAR = 15;                        // named barrier of the producer warpgroup
constexpr int ROW_PIECES = cfg::D / 8;                // 16-byte pieces in one key's row
constexpr int ATOM_PIECES = cfg::ROW_BYTES / 16;      // pieces per swizzled row (8 or 4)
constexpr uint32_t SWIZZLE = cfg::ROW_BYTES / 16 - 1;  // 128-byte swizzle: 7; 64-byte: 3
constexpr int GATHER_STEPS = cfg::BN * ROW_PIECES / 128;
// Copies in flight per thread before the loop goes round: four, or one in the d256 varlen
// builds, whose producer keeps 40 registers beside two 232-register consumers (unrolled, the
// loop's addresses spilled).
constexpr int GATHER_UNROLL = FC_VARLEN && cfg::D > 128 ? 1 : 4;
static_assert(cfg::BN * ROW_PIECES % 128 == 0, "whole gather steps");

FC_DEVICE void cp_async_16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// Arrive on `bar` once this thread's earlier cp.async copies have landed. The arrival is counted
// ahead (pending count + 1 now, − 1 on completion), so the barrier's one expected arrival stays
// the producer's plain arrive (gather_kv_block).
FC_DEVICE void cp_async_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Key `key`'s row in the pool: table[key / page_size] (slot clamped into the table's row, entry
// into the pool) and row key mod page_size of that page, at `base` (the pool at this KV head).
FC_DEVICE const uint16_t* paged_row(const uint16_t* base, const int64_t (&stride)[3], const int32_t* table,
                                    const Params& p, int key) {
    const int q = page_div(key, p.page_mul, p.page_div_shift);
    const int in_page = key - q * p.page_size;
    const int page = min(max(table[min(q, p.table_stride - 1)], 0), p.num_pages - 1);
    return base + page * stride[0] + in_page * stride[1];
}

// The row-major gather (builds with FC_ROW_GATHER, a measurement build for now:
// `FLASHCORE_GATHER=rows`): ROW_THREADS threads per key row, each copying
// every ROW_THREADS-th 16-byte piece of it, so one table lookup and one 64-bit source address
// serve ROW_COPIES copies (the piece-per-thread loop pays both for every copy: ~50 instructions
// per 16 bytes at d128). A warp's copies of one instruction still read 64 contiguous bytes of
// each of its 8 rows.
constexpr int ROW_THREADS = 4;
constexpr int ROW_COPIES = ROW_PIECES / ROW_THREADS;  // d64 2, d96 3, d128 4, d256 8
constexpr int ROWS_PER_PASS = 128 / ROW_THREADS;
constexpr int PASS_UNROLL = GATHER_UNROLL == 1 ? 1 : 2;
static_assert(ROW_PIECES % ROW_THREADS == 0, "whole pieces per thread");

FC_DEVICE void gather_rows(uint16_t (&dst)[cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS], const uint16_t* base,
                           const int64_t (&stride)[3], const int32_t* table, const Params& p, int key_row,
                           int tid) {
    static_assert(cfg::BN % ROWS_PER_PASS == 0, "whole passes per block");
    static_assert(ATOM_PIECES % ROW_THREADS == 0, "a thread's pieces keep their place in a swizzle atom");
    constexpr uint32_t CHUNK_BYTES = cfg::BN * cfg::SW_ELEMS * 2;
    const int lane_piece = tid % ROW_THREADS;
#pragma unroll PASS_UNROLL
    for (int n = 0; n < cfg::BN / ROWS_PER_PASS; ++n) {
        const int r = tid / ROW_THREADS + ROWS_PER_PASS * n;  // the block's row (a key)
        const uint16_t* src = paged_row(base, stride, table, p, key_row + r) + lane_piece * 8;
        // TMA's swizzle (address bits [4, 7) ^= bits [7, 10)) is the row's: the row starts on a
        // 128-byte line and a piece moves within it, so the XOR is computed once per row, and a
        // piece ROW_THREADS · c further (disjoint bits from lane_piece's) XORs in a constant.
        const uint32_t row_addr = smem_u32(&dst[0][r][0]);
        const uint32_t lane_off = (uint32_t)(lane_piece * 16) ^ (((row_addr >> 7) & SWIZZLE) << 4);
#pragma unroll
        for (int c = 0; c < ROW_COPIES; ++c) {
            const uint32_t chunk = ROW_THREADS * c / ATOM_PIECES;
            const uint32_t step = (ROW_THREADS * c % ATOM_PIECES) * 16;
            cp_async_16(row_addr + chunk * CHUNK_BYTES + (lane_off ^ step), src + ROW_THREADS * 8 * c);
        }
    }
}

// The piece-per-thread gather (the shipped builds): thread tid copies pieces tid, tid + 128, …
// of the block's rows (consecutive threads: consecutive pieces of one row).
FC_DEVICE void gather_pieces(uint16_t (&dst)[cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS], const uint16_t* base,
                             const int64_t (&stride)[3], const int32_t* table, const Params& p, int key_row,
                             int tid) {
#pragma unroll GATHER_UNROLL
    for (int n = 0; n < GATHER_STEPS; ++n) {
        const int i = tid + 128 * n;
        const int r = i / ROW_PIECES;  // the block's row (a key); consecutive threads: one row
        const int piece = i % ROW_PIECES;
        const uint16_t* src = paged_row(base, stride, table, p, key_row + r) + piece * 8;
        uint32_t d = smem_u32(&dst[piece / ATOM_PIECES][r][0]) + (piece % ATOM_PIECES) * 16;
        d ^= ((d >> 7) & SWIZZLE) << 4;  // TMA's swizzle: address bits [4, 7) ^= bits [7, 10)
        cp_async_16(d, src);
    }
}

// One K or V block of BN keys gathered by the 128 producer threads (`tid`), completing `bar`'s
// phase once every copy has landed: each thread's completion is tracked by the barrier, then
// (after all 128 have registered theirs) thread 0 gives the phase's one expected arrival.
FC_DEVICE void gather_kv_block(uint16_t (&dst)[cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS], uint64_t pool,
                               const int64_t (&stride)[3], uint64_t* bar, const Params& p, int batch,
                               int key_row, int kv_head, int tid) {
    const int32_t* table = reinterpret_cast<const int32_t*>(p.table_ptr) + (int64_t)batch * p.table_stride;
    const uint16_t* base = reinterpret_cast<const uint16_t*>(pool) + kv_head * stride[2];
#if FC_ROW_GATHER
    gather_rows(dst, base, stride, table, p, key_row, tid);
#else
    gather_pieces(dst, base, stride, table, p, key_row, tid);
#endif
    cp_async_arrive(bar);
    named_bar_sync(GATHER_BAR, 128);  // every thread's copies are tracked by the barrier
    if (tid == 0) mbar_arrive(bar);
}
#endif

// Threads of warpgroup 0 that enter the producer (attention_fwd.cu).
constexpr int PRODUCER_THREADS = FC_PAGED ? 128 : 1;
// The dynamic order's tickets are taken by the producer: one thread, one ticket per unit.
static_assert(!kDynamicOrder || PRODUCER_THREADS == 1, "one thread takes the tickets");

FC_DEVICE void producer(const Params& p, Shared& s) {
#if FC_PAGED
    const int tid = threadIdx.x;  // 0 to 127
    if (!p.gather && tid != 0) return;  // TMA boxes: one thread issues everything
    const bool lead = tid == 0;
#else
    constexpr bool lead = true;
#endif
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
            if (lead) {
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
            }
            ++q_load;
            for (int it = 0; it < kv.count; ++it, ++g) {
                const int stage = ring_stage(g);
                const uint32_t phase = ring_phase(g);
                const int key_row = kv_block(kv, it) * cfg::BN;
#if FC_PAGED
#if FC_VARLEN
                const int page_row = t.k_start + key_row;  // the virtual pack's row (t.batch is 0)
#else
                const int page_row = key_row;
#endif
                if (p.gather) {
                    mbar_wait(&s.k_empty[stage], phase ^ 1);
                    gather_kv_block(s.k[stage], p.k_ptr, p.k_stride, &s.k_full[stage], p, t.batch, page_row, kv_head, tid);
                    mbar_wait(&s.v_empty[stage], phase ^ 1);
                    gather_kv_block(s.v[stage], p.v_ptr, p.v_stride, &s.v_full[stage], p, t.batch, page_row, kv_head, tid);
                    continue;
                }
                const BlockPages bp = block_pages(p, t.batch, page_row);
                mbar_wait(&s.k_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.k_full[stage], cfg::KV_BYTES);
                load_kv_block(s.k[stage], &p.k_map, &s.k_full[stage], p, bp, page_row, kv_head);
                mbar_wait(&s.v_empty[stage], phase ^ 1);
                mbar_arrive_expect_tx(&s.v_full[stage], cfg::KV_BYTES);
                load_kv_block(s.v[stage], &p.v_map, &s.v_full[stage], p, bp, page_row, kv_head);
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
