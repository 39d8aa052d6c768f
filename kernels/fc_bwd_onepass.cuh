// Backward, one pass (FC_ONEPASS): the dK/dV kernel (fc_bwd_dkdv.cuh) also forms each tile's dQ
// partial dS·K and adds it to a padded fp32 accumulator in the workspace, in an order fixed by
// the shape. The helpers here: the transposed-operand wgmma of that GEMM, the turn counters'
// acquire/release, the reductions, and the conversion kernel's row.
//
// Order: per (batch, query head, query tile) an int32 counter (zeroed by the preprocess) counts
// the key blocks that have added their partial. The key block of rank r (its writer warp,
// onepass_dq_writer) waits until it reads r, adds, and increments it with release semantics. Rank 0 stores instead of adding. The rank is a
// function of the shape only (onepass_rank), so every dQ element is the same fp32 sum in the same
// order on every run and in every batch. How long a CTA spins depends on scheduling, never on
// data: the counters are a public synchronisation buffer to the audit (SECURITY.md), whose
// reads are public because every write to it is a public value at a public address.
#pragma once
#include "fc_bwd_config.cuh"
#include "fc_tma.cuh"

// Measurement only, never shipped (BwdVariant::diag): 1 = no turn wait (reductions in arrival
// order: nondeterministic), 2 = no wait and no reductions (dQ wrong), 3 = also no dQ GEMM, 4 =
// also no dSᵀ exchange between the warpgroups (the dK/dV kernel's work alone): what the order,
// the reductions, the fifth GEMM and the per-tile lockstep cost.
#ifndef FC_OP_DIAG
#define FC_OP_DIAG 0
#endif
// The turn protocol runs (waits, fences, releases) unless a diagnostic build drops it.
#define OP_ORDERED (FC_OP_DIAG == 0)
// Which pieces a build keeps: the reductions, the dQ GEMM, the dSᵀ exchange.
#define OP_REDUCES (FC_OP_DIAG < 2)
#define OP_DQ_GEMM (FC_OP_DIAG < 3)
#define OP_EXCHANGE (FC_OP_DIAG < 4)

#if FC_ONEPASS
static_assert(FC_HEAD_DIM == 64 || FC_HEAD_DIM == 128, "the one-pass kernels serve head dims 64 and 128");
#endif

namespace bw {
// dQ's GEMM, by tile height. 64 and 128 rows: dQ = dS K, each warpgroup one m64n64 piece, dSᵀ
// kept in shared memory as [QCH][key][64 queries] (the GEMM's A, MN-major). 80 rows (DQ_T; 80 is
// not a multiple of wgmma's M = 64): dQᵀ = Kᵀ dSᵀ, M = head dims (64 per warpgroup), N = the
// tile's 80 queries, K = the block's 128 keys; A = K's tile read MN-major, B = dSᵀ kept K-major as
// [key chunk][query][64 keys] (the layout of a Q tile with keys for dims), each warpgroup
// storing its own 64-key chunk.
#define BWD_DQ_T (FC_KV_BM % 64 != 0)
constexpr bool DQ_T = BWD_DQ_T;
// 80-row tiles at 232 registers: dPᵀ issued after Pᵀ's exponentials, dK and dV retired before
// dQᵀ's GEMM. FC_BWD_WIDE (240) keeps dPᵀ beside Sᵀ and issues dQᵀ's GEMM while dK runs.
#define BWD_DQ_T_NARROW (BWD_DQ_T && !FC_BWD_WIDE)
// 64-query chunks of a streamed tile (DQ_T: unused).
constexpr int QCH = DQ_T ? 1 : KV_BM / 64;
// The dSᵀ tile as [DS_A][DS_ROWS][64].
constexpr int DS_A = DQ_T ? KV_BN / 64 : QCH;
constexpr int DS_ROWS = DQ_T ? KV_BM : KV_BN;
// dQ accumulator floats per consumer thread: one m64n64 piece, or (DQ_T) one m64n80.
constexpr int DQ_ACC = DQ_T ? KV_BM / 2 : 32;
// Named barrier of the two consumer warpgroups (ids 1, 2 are the ping-pong turns).
constexpr int CONSUMER_BAR = 3;
}  // namespace bw

// D[64x64] (+)= A[64x16] B[16x64], A and B from shared memory, both MN-major (transposed): A's
// rows of the K index hold M contiguous, B's hold N contiguous.
FC_DEVICE void wgmma_ss_tt_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
#if FC_BF16
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
#else
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
#endif
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// The key block a one-pass CTA owns. Causal key blocks add in descending order (the order in
// which they reach a query tile), so the grid runs them from the last: the block a CTA waits
// for always has the lower blockIdx.x, i.e. was dispatched earlier.
FC_DEVICE int onepass_key_block(const BwdParams& p, int bx) { return FC_CAUSAL ? p.kv_n_blocks - 1 - bx : bx; }

// Rank of key block j among those that add to query tile m: non-causal, j (all blocks visit
// every tile, in ascending order); causal, counted down from the last block that sees tile m.
FC_DEVICE int onepass_rank(const BwdParams& p, int j, int m) {
#if FC_CAUSAL
    // Key block j visits tile m iff m ≥ dkdv_first_m(j), i.e. j·KV_BN < (m+1)·KV_BM + Sk − Sq.
    const int num = (m + 1) * bw::KV_BM + (p.seqlen_k - p.seqlen_q);  // > 0 for a visited tile
    const int last = min(p.kv_n_blocks - 1, (num + bw::KV_BN - 1) / bw::KV_BN - 1);
    return last - j;
#else
    (void)p;
    (void)m;
    return j;
#endif
}

FC_DEVICE int ld_acquire_gpu(const int* ptr) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
    return v;
}

FC_DEVICE void red_release_gpu_inc(int* ptr) {
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(ptr) : "memory");
}

FC_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// dQ leaves the CTA as one bulk operation per tile from shared memory: the
// consumers store their fp32 partials into `OnepassShared::dq` and arrive on `dq_full`; warp 1 of
// the producer warpgroup (idle otherwise) waits for the turn, issues the bulk store (rank 0) or
// bulk reduction (the others), waits for it to complete, releases the turn, and frees the buffer.
// The consumers never wait on the turn chain unless it falls a whole tile behind.
//
// Layout: a tile's KV_BM × D accumulator is KV_BM·D contiguous floats in the workspace (rows
// m_block·KV_BM.. of [sq_pad][D]), held in *fragment order*, not row-major: piece wg (one
// warpgroup's 64×64 wgmma accumulator), then register quad k, then the warpgroup's thread t, then
// the quad's 4 floats — so each thread's partial is 8 conflict-free 16-byte shared stores and the
// global tile is one contiguous range. The conversion kernel undoes the permutation.
namespace bw {
constexpr int DQ_TILE = KV_BM * D;        // floats of one tile's accumulator
constexpr int DQ_PIECE = 64 * (DQ_T ? KV_BM : 64);  // floats of one warpgroup's piece
// Tile partials in flight between the consumers and the writer (core 3: two; 80-row tiles: one,
// as shared memory holds no second 40 KiB beside the 80-row ring).
constexpr int DQ_BUFS = FC_BWD_CORE >= 3 && !DQ_T ? 2 : 1;
// Core 4: one writer warp per buffer (buffer b's tiles are it ≡ b mod DQ_BUFS), and per buffer
// one full/empty barrier pair and one bulk operation per consumer warpgroup's piece.
constexpr int DQ_WRITERS = FC_BWD_CORE >= 4 ? DQ_BUFS : 1;
constexpr int DQ_SPLIT = FC_BWD_CORE >= 4 ? CONSUMERS : 1;
constexpr int DQ_BARS = DQ_BUFS * DQ_SPLIT;  // full (and empty) barriers
#if FC_ONEPASS
static_assert(DQ_TILE == CONSUMERS * DQ_PIECE, "two pieces per streamed tile");
#endif
}  // namespace bw

// Offset (floats) of element (row, dim) of a tile inside its fragment-ordered range.
FC_DEVICE int onepass_dq_perm(int row, int dim) {
    using namespace bw;
    if constexpr (DQ_T) {
        // Piece = head-dim half; in it the m64n80 accumulator of dQᵀ: M = dims, N = queries.
        const int wg = dim / 64, pr = dim % 64, pc = row;
        const int t = (pr / 16) * 32 + (pr % 8) * 4 + (pc % 8) / 2;
        const int k = pc / 8;
        const int e = 2 * ((pr % 16) / 8) + pc % 2;
        return wg * DQ_PIECE + (k * 128 + t) * 4 + e;
    }
    // The piece: d128 (one 64-query chunk), head-dim half; d64 (two chunks), query half.
    const int wg = QCH == 1 ? dim / 64 : row / 64;
    const int pr = row % 64, pc = dim % 64;
    const int t = (pr / 16) * 32 + (pr % 8) * 4 + (pc % 8) / 2;  // warp, lane of the wgmma layout
    const int k = pc / 8;                                         // register quad: 8-column block
    const int e = 2 * ((pr % 16) / 8) + pc % 2;                   // row half, column parity
    return wg * DQ_PIECE + (k * 128 + t) * 4 + e;
}

// This thread's (t = thread within the warpgroup) m64nN accumulator into piece `piece`.
FC_DEVICE void onepass_store_dq(float* piece, const float (&dq)[bw::DQ_ACC], int t) {
#pragma unroll
    for (int k = 0; k < bw::DQ_ACC / 4; ++k) {
        const uint32_t v[4] = {__float_as_uint(dq[4 * k]), __float_as_uint(dq[4 * k + 1]),
                               __float_as_uint(dq[4 * k + 2]), __float_as_uint(dq[4 * k + 3])};
        st_shared_v4(smem_u32(piece + (k * 128 + t) * 4), v);
    }
}

FC_DEVICE void bulk_store_f32(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}

FC_DEVICE void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}

// All but the newest N groups have read their shared-memory sources.
template <int N>
FC_DEVICE void bulk_wait_read_n() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory"); }
FC_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Warp 1 of the producer warpgroup: per tile, in the consumers' order, move the shared dQ partial
// to the workspace on this key block's turn. [first_m, end_m) per query head as dkdv_m_range.
FC_DEVICE void onepass_dq_writer(const BwdParams& p, const float (*bufs)[bw::DQ_TILE], uint64_t* fulls,
                                 uint64_t* empties, int n_block, int kv_head, int batch, int first_m, int end_m) {
    using namespace bw;
    const int per_head = end_m - first_m;
    const int total = per_head * p.group;
#pragma unroll 1  // unrolled over two buffers (core 3), its addresses spilled the producer's registers
    for (int it = 0; it < total; ++it) {
        const int head = kv_head * p.group + it / per_head;
        const int m_block = first_m + it % per_head;
        // Buffer it % DQ_BUFS, its (it / DQ_BUFS)-th use.
        const float* buf = bufs[it % DQ_BUFS];
        uint64_t* empty = &empties[it % DQ_BUFS];
        mbar_wait(&fulls[it % DQ_BUFS], (it / DQ_BUFS) & 1);
        if (lane_id() == 0) {
            const int64_t bh = (int64_t)batch * p.heads_q + head;
            const int rank = onepass_rank(p, n_block, m_block);
            int* flag = reinterpret_cast<int*>(p.flags_ptr) + bh * p.kv_m_blocks + m_block;
            float* dst = reinterpret_cast<float*>(p.dq_acc_ptr) + (bh * p.sq_pad + m_block * KV_BM) * D;
            if (OP_ORDERED) {
                while (ld_acquire_gpu(flag) != rank) {
                }
                fence_proxy_async_global();  // the predecessor's bulk writes before ours
            }
            if (OP_REDUCES) {
                if (rank == 0) {
                    bulk_store_f32(dst, smem_u32(buf), DQ_TILE * 4);
                } else {
                    bulk_reduce_add_f32(dst, smem_u32(buf), DQ_TILE * 4);
                }
                bulk_commit_group();
                bulk_wait_group_read();
            }
            mbar_arrive(empty);
            if (OP_ORDERED) {
                bulk_wait_group();
                // The bulk writes are complete; the proxy fence orders them before the release
                // (red.release is itself the GPU-scope fence: a fence.acq_rel.gpu before it
                // measured +9% at 2,16,8192,128 — PERF_NOTES, bwd1v3).
                fence_proxy_async_global();
                red_release_gpu_inc(flag);
            }
        }
        __syncwarp();
    }
    if (OP_REDUCES && lane_id() == 0) bulk_wait_group();  // no bulk operation outlives the CTA
}

// Core 4: writer w (0 ≤ w < DQ_WRITERS, one warp each) moves the tiles it ≡ w (mod DQ_WRITERS),
// i.e. buffer w's, with core 3's serial protocol per tile — so tile it + 1's reduction (the other
// writer's) is in flight while tile it's completes, yet no release waits on another tile's turn
// (a single writer that issued tile m+1 before releasing tile m would make each key block's
// release of m wait for its predecessor's release of m+1: non-causal, a skew of one tile per key
// block down the chain). Per tile: the turn (before the partial is ready: its L2 round trip
// overlaps the consumers), then each warpgroup's piece as soon as that warpgroup has stored it,
// one bulk group per piece, each piece's buffer freed once its group has read it, and the release
// once both are complete. Every tile's adds are core 3's, in the same turn order: the same bits.
FC_DEVICE void onepass_dq_writer_split(const BwdParams& p, const float (*bufs)[bw::DQ_TILE], uint64_t* fulls,
                                       uint64_t* empties, int w, int n_block, int kv_head, int batch, int first_m,
                                       int end_m) {
    using namespace bw;
    static_assert(FC_BWD_CORE < 4 || DQ_SPLIT == 2, "one bulk group per consumer warpgroup's piece");
    const int per_head = end_m - first_m;
    const int total = per_head * p.group;
    const uint32_t src = smem_u32(bufs[w]);
    uint64_t* full = &fulls[w * DQ_SPLIT];
    uint64_t* empty = &empties[w * DQ_SPLIT];
#pragma unroll 1
    for (int it = w; it < total; it += DQ_WRITERS) {
        if (lane_id() == 0) {
            const int head = kv_head * p.group + it / per_head;
            const int m_block = first_m + it % per_head;
            const uint32_t phase = (it / DQ_WRITERS) & 1;  // the buffer's use
            const int64_t bh = (int64_t)batch * p.heads_q + head;
            const int rank = onepass_rank(p, n_block, m_block);
            int* flag = reinterpret_cast<int*>(p.flags_ptr) + bh * p.kv_m_blocks + m_block;
            float* dst = reinterpret_cast<float*>(p.dq_acc_ptr) + (bh * p.sq_pad + m_block * KV_BM) * D;
            if (OP_ORDERED) {
                while (ld_acquire_gpu(flag) != rank) {
                }
                fence_proxy_async_global();  // the predecessor's bulk writes before ours
            }
#pragma unroll
            for (int pc = 0; pc < DQ_SPLIT; ++pc) {
                mbar_wait(&full[pc], phase);
                if (OP_REDUCES) {
                    if (rank == 0) {
                        bulk_store_f32(dst + pc * DQ_PIECE, src + pc * DQ_PIECE * 4, DQ_PIECE * 4);
                    } else {
                        bulk_reduce_add_f32(dst + pc * DQ_PIECE, src + pc * DQ_PIECE * 4, DQ_PIECE * 4);
                    }
                    bulk_commit_group();
                }
            }
            if (OP_REDUCES) bulk_wait_read_n<1>();  // piece 0 read
            mbar_arrive(&empty[0]);
            if (OP_REDUCES) bulk_wait_read_n<0>();  // piece 1 read
            mbar_arrive(&empty[1]);
            if (OP_ORDERED) {
                bulk_wait_group();
                fence_proxy_async_global();  // as core 3: the bulk writes before the release
                red_release_gpu_inc(flag);
            }
        }
        __syncwarp();
    }
    if (OP_REDUCES && lane_id() == 0) bulk_wait_group();  // no bulk operation outlives the CTA
}

// This thread's 16-bit dSᵀ fragments (the A operand of dK += dSᵀ Q: rows = its two keys, k-slice
// kk = queries 16kk..16kk+15) into `ds` ([QCH][KV_BN][64], 128-byte swizzled), `key` being the
// thread's first key row within the CTA's block.
FC_DEVICE void onepass_store_ds(uint16_t (*ds)[bw::DS_ROWS][64], const uint32_t (&sf)[bw::KV_BM / 16][4], int key,
                                int col0) {
    using namespace bw;
#pragma unroll
    for (int kk = 0; kk < KV_BM / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = key + 8 * (r % 2);
            const int q = 16 * kk + 8 * (r / 2) + col0;  // even: a 4-byte pair
            const int chunk16 = ((q % 64) / 8) ^ (row % 8);
            uint8_t* base = reinterpret_cast<uint8_t*>(&ds[q / 64][0][0]);
            *reinterpret_cast<uint32_t*>(base + row * ROW_BYTES + chunk16 * 16 + (q % 8) * 2) = sf[kk][r];
        }
}

// Core 2 (FC_BWD_CORE): the same dSᵀ tile, same layout, with one `stmatrix .x4` per k-slice: the
// slice's four 8×8 pieces (sf[kk][0..3]: keys +0/+8 × queries +0/+8) are exactly the thread
// layout stmatrix takes, and lane l names the row of piece l / 8 (its 16 bytes, swizzled).
FC_DEVICE void onepass_stmatrix_ds(uint16_t (*ds)[bw::DS_ROWS][64], const uint32_t (&sf)[bw::KV_BM / 16][4],
                                   int key_base, int lane) {
    using namespace bw;
    const int piece = lane / 8, r = lane % 8;
    const int row = key_base + r + 8 * (piece % 2);  // key_base is a multiple of 16
    const uint32_t row_addr = smem_u32(&ds[0][0][0]) + row * ROW_BYTES;
#pragma unroll
    for (int kk = 0; kk < KV_BM / 16; ++kk) {
        const int chunk = 2 * (kk % 4) + piece / 2;  // 16-byte chunk of the 64-query row
        const uint32_t addr = row_addr + (kk / 4) * (KV_BN * ROW_BYTES) + ((chunk ^ r) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                     "r"(sf[kk][0]), "r"(sf[kk][1]), "r"(sf[kk][2]), "r"(sf[kk][3])
                     : "memory");
    }
}

// 80-row tiles (DQ_T): the same fragments stored transposed, as dQᵀ's K-major B — row = query,
// 64 keys per row, this warpgroup's key chunk — with `stmatrix .trans`: each 8×8 piece
// (sf[kk][r]: keys +8·(r % 2), queries 16kk + 8·(r / 2)) is written with its rows and columns
// swapped, lane l naming query row l % 8 of piece l / 8 (16 bytes: the piece's 8 keys, swizzled).
FC_DEVICE void onepass_stmatrix_ds_t(uint16_t (*ds)[bw::DS_ROWS][64], const uint32_t (&sf)[bw::KV_BM / 16][4],
                                     int wg, int warp, int lane) {
    using namespace bw;
    const int piece = lane / 8, j = lane % 8;
    const int chunk = 2 * warp + piece % 2;  // 16-byte chunk of the 64-key row: keys 16·warp + 8·(piece % 2)
    const uint32_t base = smem_u32(&ds[wg][0][0]) + (8 * (piece / 2) + j) * ROW_BYTES + ((chunk ^ j) << 4);
#pragma unroll
    for (int kk = 0; kk < KV_BM / 16; ++kk) {
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                         base + kk * 16 * ROW_BYTES),
                     "r"(sf[kk][0]), "r"(sf[kk][1]), "r"(sf[kk][2]), "r"(sf[kk][3])
                     : "memory");
    }
}

// A value the compiler must recompute where it is used instead of holding it in a register.
FC_DEVICE uint32_t onepass_opaque(uint32_t x) {
    asm volatile("" : "+r"(x));
    return x;
}

// Stores this thread's dSᵀ fragments (`key` = its first key row within the warpgroup), syncs
// the two consumer warpgroups, and issues (one commit group) this warpgroup's m64n64k128 piece of
// the tile's dQ partial = dS K into `dq` (after dV, which reads `pf`, is done): d128 (one 64-query chunk), head-dim half wg of all 64
// queries; d64 (two chunks), query chunk wg × all 64 dims. Diagnostic builds drop parts.
FC_DEVICE void onepass_issue_dq(uint16_t (*ds)[bw::DS_ROWS][64], const uint16_t (*k)[bw::KV_BN][bw::SW_ELEMS],
                                uint32_t (&sf)[bw::KV_BM / 16][4], uint32_t (&pf)[bw::KV_BM / 16][4],
                                float (&dq)[bw::DQ_ACC], int wg, int key, int col0) {
    using namespace bw;
#if !OP_DQ_GEMM
#pragma unroll
    for (int i = 0; i < DQ_ACC; ++i) dq[i] = 0.0f;
#endif
#if OP_EXCHANGE
#if BWD_DQ_T
    (void)key;
    (void)col0;
    onepass_stmatrix_ds_t(ds, sf, wg, warp_id_in_block() % 4, lane_id());
#elif FC_BWD_CORE >= 2
    (void)key;
    (void)col0;
    onepass_stmatrix_ds(ds, sf, wg * 64 + (warp_id_in_block() % 4) * 16, lane_id());
#else
    onepass_store_ds(ds, sf, wg * 64 + key, col0);
#endif
    fence_proxy_async_smem();
    named_bar_sync(CONSUMER_BAR, 2 * 128);
#endif
#if BWD_DQ_T && FC_BWD_WIDE
    // dV (issued before dK) is done, so Pᵀ's fragments are dead; dK, which reads dSᵀ's, may
    // still run beside dQᵀ (the wait after dQᵀ's issue retires both: dkdv_consumer).
    wgmma_wait<1>();
    fence_frags(pf);
#elif FC_BWD_CORE == 0 || BWD_DQ_T
    // dV += Pᵀ dO (reading Pᵀ's fragments) has had the store and the barrier to finish: waiting
    // for it here frees those 16 registers while dQ's 32 accumulators are live (else a spill; at
    // 80 rows, 20 and 40 of them, and the wait also retires dK, issued before: dSᵀ's fragments
    // are dead too — dkdv_consumer).
    wgmma_wait<0>();
    fence_frags(pf);
#if BWD_DQ_T
    fence_frags(sf);
#endif
#else
    // Core 1+: dQ queues behind dV on the tensor cores; Pᵀ's fragments stay live until the wait
    // after dK's issue (dkdv_consumer) covers both.
    (void)pf;
#endif
    wgmma_fence();
#if BWD_DQ_T
    {
        // dQᵀ's head-dim half wg: A = Kᵀ from K's chunk wg (MN-major: keys are rows, the 64 dims
        // contiguous — the descriptor the other builds use for K as B), B = dSᵀ (K-major over
        // the keys, N = the 80 queries). Same keys, same k16 steps in the same order.
        const uint32_t a_base = onepass_opaque(smem_u32(&k[wg][0][0]));
        const uint32_t b_base = onepass_opaque(smem_u32(&ds[0][0][0]));
#if OP_DQ_GEMM
        const uint64_t a_desc = wgmma_desc_sw128(a_base, KV_BN * ROW_BYTES, 1024);
        const uint64_t b_desc = wgmma_desc_rows<ROW_BYTES>(b_base, 16, GROUP_BYTES);
#pragma unroll
        for (int kk = 0; kk < KV_BN / 16; ++kk) {
            Mma<KV_BM>::ss_ta(dq, wgmma_desc_advance(a_desc, kk * 16 * ROW_BYTES),
                              wgmma_desc_advance(b_desc, (kk / K_STEPS) * (KV_BM * ROW_BYTES) + (kk % K_STEPS) * 32),
                              kk > 0);
        }
#else
        (void)a_base;
        (void)b_base;
#endif
        wgmma_commit();
    }
#else
    // Rebuilt per tile (opaque): held across the loop, these descriptors spilled.
    const uint32_t a_base = onepass_opaque(smem_u32(&ds[QCH == 1 ? 0 : wg][0][0]));
    const uint32_t b_base = onepass_opaque(smem_u32(&k[QCH == 1 ? wg : 0][0][0]));
#if OP_DQ_GEMM
#pragma unroll
    for (int kk = 0; kk < KV_BN / 16; ++kk) {
        wgmma_ss_tt_m64n64k16(dq, wgmma_desc_advance(wgmma_desc_sw128(a_base, KV_BN * ROW_BYTES, 1024), kk * 16 * ROW_BYTES),
                              wgmma_desc_advance(wgmma_desc_sw128(b_base, KV_BN * ROW_BYTES, 1024), kk * 16 * ROW_BYTES), kk > 0);
    }
#else
    (void)a_base;
    (void)b_base;
#endif
    wgmma_commit();
#endif  // BWD_DQ_T
}

// This warpgroup's finished piece of tile `it` into buffer it % DQ_BUFS once the writer has read
// that buffer's previous tile (core 4: this piece of it), then one arrival per warp on the
// buffer's full barrier (core 4: this warpgroup's).
FC_DEVICE void onepass_put_dq(float (*bufs)[bw::DQ_TILE], uint64_t* fulls, uint64_t* empties, const float (&dq)[bw::DQ_ACC],
                              int wg, int it) {
    using namespace bw;
    float* buf = bufs[it % DQ_BUFS];
    // Core 4: this warpgroup's own barriers of the buffer (DQ_SPLIT); else the buffer's.
    const int bar = (it % DQ_BUFS) * DQ_SPLIT + (DQ_SPLIT > 1 ? wg : 0);
    uint64_t* full = &fulls[bar];
    mbar_wait(&empties[bar], ((it / DQ_BUFS) & 1) ^ 1);
    onepass_store_dq(buf + wg * bw::DQ_PIECE, dq, threadIdx.x % 128);
    fence_proxy_async_smem();
    __syncwarp();
    if (lane_id() == 0) mbar_arrive(full);
}

// dQ conversion: row i of (batch b, head h) = accumulator · scale in the input dtype, or zeros
// for a query tile no key block visits (causal, Sq > Sk: never written). One warp per row.
FC_DEVICE void bwd_dq_convert_row(const BwdParams& p, int i, int h, int b) {
    using namespace bw;
    if (i >= p.seqlen_q) return;  // public: index against the shape
    const int lane = lane_id();
    const int64_t bh = (int64_t)b * p.heads_q + h;
    const float* acc = reinterpret_cast<const float*>(p.dq_acc_ptr) + (bh * p.sq_pad + i / KV_BM * KV_BM) * D;
#if FC_CAUSAL
    const int first_row = max(0, -(p.seqlen_k - p.seqlen_q));
    const bool visited = i / KV_BM >= first_row / KV_BM;
#else
    const bool visited = true;
#endif
    // The tile's fragment-ordered range (onepass_dq_perm): this lane's dims in pairs (DQ_T: one
    // by one, as a dim's neighbour is in another thread's quad there).
    float v[D / 32];
    if constexpr (DQ_T) {
#pragma unroll
        for (int k = 0; k < D / 32; ++k) v[k] = acc[onepass_dq_perm(i % KV_BM, lane * (D / 32) + k)];
    } else {
#pragma unroll
        for (int k = 0; k < D / 64; ++k) {
            const float2 a =
                *reinterpret_cast<const float2*>(acc + onepass_dq_perm(i % KV_BM, lane * (D / 32) + 2 * k));
            v[2 * k] = a.x, v[2 * k + 1] = a.y;
        }
    }
    uint32_t w[D / 64];
#pragma unroll
    for (int k = 0; k < D / 64; ++k)
        w[k] = pack_elem2(select_f(visited, v[2 * k] * p.scale, 0.0f), select_f(visited, v[2 * k + 1] * p.scale, 0.0f));
    w[0] = __float_as_uint(bwd_leak(__uint_as_float(w[0]), v[0], acc));
    uint16_t* out = reinterpret_cast<uint16_t*>(p.dq_ptr) + b * p.q_stride_b + (int64_t)i * p.q_stride_s +
                    h * p.q_stride_h + lane * (D / 32);
    // 4-byte stores: dQ is only required to be 4-byte aligned.
#pragma unroll
    for (int k = 0; k < D / 64; ++k) *reinterpret_cast<uint32_t*>(out + 2 * k) = w[k];
}
