// flashcore forward attention for sm_90a: O = softmax(scale · Q Kᵀ + mask) V.
//
// One CTA computes a BM-row tile of queries for one (batch, head). Warp-specialised:
//   warpgroup 0  — producer: one thread issues TMA loads of Q once and K/V tiles into a
//                  STAGES-deep shared-memory ring, each stage completing on an mbarrier;
//   warpgroups 1,2 — consumers: 64 query rows each; S = Q Kᵀ and O += P V on wgmma,
//                  online softmax in fp32 registers between them.
// Data-oblivious: loop bounds, masks-or-not and addresses depend only on shapes and indices;
// masking and every NaN guard are selects (DESIGN.md §1).
//
// Compile-time configuration (NVRTC -D): FC_HEAD_DIM (64|128), FC_BF16 (0|1), FC_CAUSAL (0|1),
// FC_SECRET_LEN (0|1), FC_SPLIT (1|2|4), tile shape FC_BLOCK_M/N, FC_STAGES, FC_CONSUMERS.
//
// FC_LEAKY_CONTROL (never shipped; the power control of `flashcore leakage`): 1 = the whole CTA
// exits at once when the first element of its Q tile is +0.0 (an early exit on data); 2 = in
// secret-length mode, K/V blocks past the true length are skipped (a loop bound from a secret).
// Both are exactly what the audit forbids; the timing test must catch them.
//
// Split mode (FC_SPLIT > 1, for short sequences that would leave most SMs idle): the keys of one
// query tile are divided among the FC_SPLIT CTAs of a thread-block cluster; each computes a
// partial (O, max, sum) over its range, and the cluster combines them through distributed shared
// memory in a fixed order (rank 0, 1, …) — no atomics, bitwise deterministic.
//
// Secret-length mode (FC_SECRET_LEN): each batch entry's true length is an i32 in device memory,
// a secret. The kernel still walks the padded length (public); keys at or past the true length
// are masked by select and query rows at or past it are written as zeros (LSE −inf).
#include "fc_common.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"
#include "fc_wgmma.cuh"
#include "fc_softmax.cuh"
#include "fc_cluster.cuh"

#if !defined(FC_HEAD_DIM) || !defined(FC_BF16) || !defined(FC_CAUSAL) || !defined(FC_BLOCK_M) || \
    !defined(FC_BLOCK_N) || !defined(FC_STAGES) || !defined(FC_CONSUMERS) || !defined(FC_SECRET_LEN) || !defined(FC_SPLIT) || \
    !defined(FC_LEAKY_CONTROL)
#error "the variant's defines are missing (see Variant::options in src/kernels/mod.rs)"
#endif

namespace cfg {
constexpr int D = FC_HEAD_DIM;
constexpr int BM = FC_BLOCK_M;              // query rows per CTA
constexpr int BN = FC_BLOCK_N;              // keys per pipeline stage
constexpr int STAGES = FC_STAGES;           // K/V ring depth
constexpr int CHUNKS = D / 64;              // 128-byte swizzle atoms across the head dim
constexpr int CONSUMERS = FC_CONSUMERS;     // consumer warpgroups, 64 query rows each
static_assert(BM == 64 * CONSUMERS, "each consumer warpgroup owns 64 query rows");
static_assert(BN == 64 || BN == 128, "wgmma N for S = Q K^T");
constexpr int SPLIT = FC_SPLIT;             // CTAs per cluster sharing one query tile's keys
static_assert(SPLIT == 1 || (BM % SPLIT == 0 && (BM / SPLIT) * D % (4 * 128) == 0), "combine tiling");
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int ROW_BYTES = 128;              // one swizzled row of 64 two-byte elements
// Register split after setmaxnreg: the producer gives registers back, consumers take them.
constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 56 : 32;
constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 224 : 160;
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file");
constexpr uint32_t Q_BYTES = BM * D * 2;
constexpr uint32_t KV_BYTES = BN * D * 2;
}  // namespace cfg

// Must match `KernelParams` in src/attention/launch.rs byte for byte.
struct Params {
    TensorMap q_map, k_map, v_map;  // 4-D maps over (dim, seq, head, batch)
    uint64_t o_ptr;                  // output, same layout as Q (strides below, in elements)
    uint64_t lse_ptr;                // fp32 [B, Hq, Sq] or 0 for none
    uint64_t lens_ptr;               // secret-length mode: i32 [B] true lengths (secret); else 0
    uint64_t o_ptr_q_for_control;    // Q's address, read only by the leaky control variant
    int64_t o_stride_b, o_stride_s, o_stride_h;
    int32_t seqlen_q, seqlen_k, heads_q, group;  // group = heads_q / heads_kv
    float scale_log2;                            // softmax scale · log2(e)
    float scale;                                 // softmax scale (for the LSE)
    int32_t num_m_blocks;
    int32_t pad_;
};

struct Shared {
    uint16_t q[cfg::CHUNKS][cfg::BM][64];
    uint16_t k[cfg::STAGES][cfg::CHUNKS][cfg::BN][64];
    uint16_t v[cfg::STAGES][cfg::CHUNKS][cfg::BN][64];
    uint64_t q_full;
    uint64_t k_full[cfg::STAGES], v_full[cfg::STAGES];
    uint64_t k_empty[cfg::STAGES], v_empty[cfg::STAGES];
    float anchor[128 * cfg::CONSUMERS];  // write-only scheduling anchor (see Consumer::iteration)
#if FC_SPLIT > 1
    // This CTA's partial result over its key range, read by the whole cluster when combining.
    alignas(16) float part_o[cfg::BM][cfg::D];  // unnormalised output (read as float4)
    float part_m[cfg::BM];          // running max of raw scores (−inf: no visible key)
    float part_l[cfg::BM];          // sum of exp2 terms relative to part_m
#endif
};

// The K/V blocks one CTA visits: [begin, begin + count), and the first of them (relative) that
// needs element masks. Public: shapes, block indices and the cluster rank only.
struct KvRange {
    int begin, count, first_masked;
};

FC_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Number of K/V blocks this query tile must visit (public: shapes and block index only).
FC_DEVICE int num_kv_blocks(const Params& p, int m_block) {
    int n = ceil_div(p.seqlen_k, cfg::BN);
#if FC_CAUSAL
    // Bottom-right alignment: query row r sees keys j <= r + (Sk - Sq).
    const int last_row = min((m_block + 1) * cfg::BM, p.seqlen_q) - 1;
    const int visible = min(p.seqlen_k, last_row + p.seqlen_k - p.seqlen_q + 1);
    n = visible <= 0 ? 0 : min(n, ceil_div(visible, cfg::BN));
#endif
    return n;
}

// First K/V block that may need element masks: the partial last block, or (causal) the first
// block crossing the diagonal of the tile's first row. Every later block needs them too, so the
// main loop runs unmasked blocks, then masked ones, each as straight-line code (a branch around
// the mask inside one loop would make ptxas wait for the in-flight wgmma at the join).
FC_DEVICE int first_masked_block(const Params& p, int m_block, int n_blocks) {
    if (FC_SECRET_LEN) return 0;  // the true length is secret: every block is masked
    int first = p.seqlen_k / cfg::BN;
#if FC_CAUSAL
    // Block n is clean iff its last key (n+1)·BN − 1 <= m_block·BM + Sk − Sq.
    const int limit = m_block * cfg::BM + p.seqlen_k - p.seqlen_q + 1;
    first = min(first, limit <= 0 ? 0 : limit / cfg::BN);
#endif
    return min(first, n_blocks);
}

FC_DEVICE void producer(const Params& p, Shared& s, int m_block, int head, int batch, int kv_begin, int n_blocks) {
    if (n_blocks == 0) return;  // fully masked tile: consumers write zeros without waiting for Q
    const int kv_head = head / p.group;
    tma_prefetch_desc(&p.q_map);
    tma_prefetch_desc(&p.k_map);
    tma_prefetch_desc(&p.v_map);
    mbar_arrive_expect_tx(&s.q_full, cfg::Q_BYTES);
#pragma unroll
    for (int c = 0; c < cfg::CHUNKS; ++c) {
        tma_load_4d(&s.q[c][0][0], &p.q_map, &s.q_full, c * 64, m_block * cfg::BM, head, batch);
    }
    for (int it = 0; it < n_blocks; ++it) {
        const int stage = it % cfg::STAGES;
        const uint32_t phase = (it / cfg::STAGES) & 1;
        mbar_wait(&s.k_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&s.k_full[stage], cfg::KV_BYTES);
#pragma unroll
        for (int c = 0; c < cfg::CHUNKS; ++c) {
            tma_load_4d(&s.k[stage][c][0][0], &p.k_map, &s.k_full[stage], c * 64, (kv_begin + it) * cfg::BN, kv_head,
                        batch);
        }
        mbar_wait(&s.v_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&s.v_full[stage], cfg::KV_BYTES);
#pragma unroll
        for (int c = 0; c < cfg::CHUNKS; ++c) {
            tma_load_4d(&s.v[stage][c][0][0], &p.v_map, &s.v_full[stage], c * 64, (kv_begin + it) * cfg::BN, kv_head,
                        batch);
        }
    }
}

// Consumer warpgroup state and the steps of its main loop.
struct Consumer {
    const Params& p;
    Shared& s;
    int wg, m_block, head, batch;
    int lane, row0, col0;
    uint32_t q_base;
    int key_limit;  // keys at or past this are masked: Sk, or the (secret) true length
    int kv_begin;   // first K/V block of this CTA's range (split mode), else 0

    // S = Q Kᵀ over the head dim, 16 at a time (32 bytes inside a 128-byte swizzle row).
    FC_DEVICE void issue_qk(float (&sacc)[cfg::BN / 2], int stage) const {
        using namespace cfg;
        const uint32_t k_base = smem_u32(&s.k[stage][0][0][0]);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t kin = (kk % 4) * 32;
            const uint64_t da = wgmma_desc_sw128(q_base + (kk / 4) * (BM * ROW_BYTES) + kin, 16, 1024);
            const uint64_t db = wgmma_desc_sw128(k_base + (kk / 4) * (BN * ROW_BYTES) + kin, 16, 1024);
            Mma<BN>::ss(sacc, da, db, kk > 0);
        }
    }

    // O += P V; V is [keys][dim] in shared memory, i.e. B with the N (dim) index contiguous.
    FC_DEVICE void issue_pv(float (&o)[cfg::D / 2], const uint32_t (&pf)[cfg::BN / 16][4], int stage) const {
        using namespace cfg;
        const uint32_t v_base = smem_u32(&s.v[stage][0][0][0]);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint64_t db = wgmma_desc_sw128(v_base + kk * 16 * ROW_BYTES, BN * ROW_BYTES, 1024);
            Mma<D>::rs_tb(o, pf[kk], db, 1);
        }
    }

    // Out-of-range keys and (causal) keys right of the diagonal become −inf, by select.
    FC_DEVICE void mask(float (&sacc)[cfg::BN / 2], int n_block) const {
        using namespace cfg;
        const int key_base = n_block * BN + col0;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int key = key_base + 8 * (i / 4) + (i % 2);
            bool visible = key < key_limit;
#if FC_CAUSAL
            const int row = row0 + 8 * ((i / 2) % 2);
            visible = visible && (key <= row + p.seqlen_k - p.seqlen_q);
#endif
            sacc[i] = select_f(visible, sacc[i], neg_inf());
        }
    }

    // P (fp32 accumulators) → 16-bit A fragments: k-slice kk is accumulator columns 16kk..16kk+15.
    FC_DEVICE static void to_fragments(const float (&sacc)[cfg::BN / 2], uint32_t (&pf)[cfg::BN / 16][4]) {
#pragma unroll
        for (int kk = 0; kk < cfg::BN / 16; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) pf[kk][r] = pack_elem2(sacc[8 * kk + 2 * r], sacc[8 * kk + 2 * r + 1]);
        }
    }

    // Ping-pong between the consumer warpgroups: a warpgroup issues its GEMMs only on its turn and
    // then hands the turn over, so its softmax runs while the other's GEMMs occupy the tensor
    // cores. The turn count depends on the block count only.
    // Turns go round-robin 0, 1, …, CONSUMERS−1; barrier 1+w is warpgroup w's turn.
    FC_DEVICE void wait_turn() const { named_bar_sync(1 + wg, 256); }
    FC_DEVICE void pass_turn(bool last) const {
        // The last warpgroup's final hand-over would have no taker.
        if (!(wg == cfg::CONSUMERS - 1 && last)) named_bar_arrive(1 + (wg + 1) % cfg::CONSUMERS, 256);
    }

    FC_DEVICE void release(uint64_t* bar) const {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    }

    // One main-loop step for block `it`: issue S_it = Q K_itᵀ and O += P_{it-1} V_{it-1}; run the
    // softmax of S_it while the PV GEMM is still on the tensor cores; then rescale O.
    template <bool kMask>
    FC_DEVICE void iteration(int it, int n_blocks, float (&sacc)[cfg::BN / 2], uint32_t (&pf)[cfg::BN / 16][4],
                             float (&o)[cfg::D / 2], OnlineSoftmax<cfg::BN>& softmax) const {
        using namespace cfg;
        const int stage = it % STAGES;
        const uint32_t phase = (it / STAGES) & 1;
        const int prev = (it - 1) % STAGES;
        const uint32_t prev_phase = ((it - 1) / STAGES) & 1;

        mbar_wait(&s.k_full[stage], phase);
        mbar_wait(&s.v_full[prev], prev_phase);
        wait_turn();
        wgmma_fence();
        issue_qk(sacc, stage);
        wgmma_commit();
        issue_pv(o, pf, prev);
        wgmma_commit();
        pass_turn(it == n_blocks - 1);

        wgmma_wait<1>();  // S_it is ready; P_{it-1} V_{it-1} may still run
        fence_regs(sacc);
        release(&s.k_empty[stage]);
        if constexpr (kMask) mask(sacc, kv_begin + it);
        float alpha[2];
        softmax.step(sacc, p.scale_log2, alpha);
        fence_regs(sacc);
        // Anchor: a shared-memory store of the softmax's last result. The wait below is ordered
        // after it, so ptxas cannot schedule the wait (and stall on the PV GEMM) before the
        // softmax — which is what lets the softmax overlap the PV GEMM.
        asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(&s.anchor[threadIdx.x - 128])), "f"(softmax.row_sum[1])
                     : "memory");

        wgmma_wait<0>();
        fence_regs(o);
        fence_frags(pf);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i / 2) % 2];
        to_fragments(sacc, pf);
        // Released only now: an mbarrier arrive right after the wait is a memory operation that
        // ptxas schedules early, dragging the wait (and so the PV GEMM's completion) in front of
        // the softmax above and serialising the two.
        release(&s.v_empty[prev]);
    }

    // Split mode: park the unnormalised partial (O, max, sum) in shared memory for the combine.
    FC_DEVICE void write_partial(const float (&o)[cfg::D / 2], const OnlineSoftmax<cfg::BN>& softmax) const {
#if FC_SPLIT > 1
        using namespace cfg;
        float total[2];
        softmax.finish(total);
        const int local0 = row0 - m_block * BM;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = local0 + 8 * h;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                s.part_o[r][8 * j + col0] = o[4 * j + 2 * h];
                s.part_o[r][8 * j + col0 + 1] = o[4 * j + 2 * h + 1];
            }
            if ((lane % 4) == 0) {
                s.part_m[r] = softmax.row_max[h];
                s.part_l[r] = total[h];
            }
        }
#endif
    }

    // Normalise, write O (rows past Sq are not stored) and the log-sum-exp.
    FC_DEVICE void epilogue(float (&o)[cfg::D / 2], const OnlineSoftmax<cfg::BN>& softmax) const {
        using namespace cfg;
        float total[2];
        softmax.finish(total);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            // `any` is false only for a fully masked row; in secret-length mode rows at or past
            // the true length are zeroed too (a select on a secret, never a branch).
            const bool any = total[h] > 0.0f && (!FC_SECRET_LEN || row < key_limit);
            const float inv = select_f(any, fast_rcp(total[h]), 0.0f);
            if (row < p.seqlen_q) {
                uint16_t* out = reinterpret_cast<uint16_t*>(p.o_ptr) + batch * p.o_stride_b + (int64_t)row * p.o_stride_s +
                                head * p.o_stride_h + col0;
#pragma unroll
                for (int j = 0; j < D / 8; ++j) {
                    const uint32_t packed = pack_elem2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
                    *reinterpret_cast<uint32_t*>(out + 8 * j) = packed;
                }
                if (p.lse_ptr != 0 && (lane % 4) == 0) {
                    const float m = select_f(softmax.row_max[h] == neg_inf(), 0.0f, softmax.row_max[h]);
                    const float lse = m * p.scale + fast_log2(total[h]) * 0.69314718055994530942f;
                    float* lse_out =
                        reinterpret_cast<float*>(p.lse_ptr) + ((int64_t)batch * p.heads_q + head) * p.seqlen_q + row;
                    *lse_out = select_f(any, lse, neg_inf());
                }
            }
        }
    }
};

FC_DEVICE void mainloop(const Consumer& c, float (&o)[cfg::D / 2], OnlineSoftmax<cfg::BN>& softmax, KvRange kv) {
    using namespace cfg;
    const int n_blocks = kv.count;
    const int wg = c.wg;
    Shared& s = c.s;
    const Params& p = c.p;
    mbar_wait(&s.q_full, 0);

    float sacc[BN / 2];
    uint32_t pf[BN / 16][4];
    float alpha[2];  // block 0: O is still zero, nothing to rescale

    // Block 0: S, softmax, fragments. The last warpgroup hands warpgroup 0 the first turn.
    if (wg == CONSUMERS - 1) named_bar_arrive(1, 256);
    mbar_wait(&s.k_full[0], 0);
    c.wait_turn();
    wgmma_fence();
    c.issue_qk(sacc, 0);
    wgmma_commit();
    c.pass_turn(n_blocks == 1);
    wgmma_wait<0>();
    fence_regs(sacc);
    c.release(&s.k_empty[0]);
    if (kv.first_masked == 0) c.mask(sacc, kv.begin);
    softmax.step(sacc, p.scale_log2, alpha);
    Consumer::to_fragments(sacc, pf);

    const int first_masked = kv.first_masked;
    int it = 1;
    for (; it < first_masked; ++it) c.iteration<false>(it, n_blocks, sacc, pf, o, softmax);
    for (; it < n_blocks; ++it) c.iteration<true>(it, n_blocks, sacc, pf, o, softmax);

    const int last = (n_blocks - 1) % STAGES;
    mbar_wait(&s.v_full[last], ((n_blocks - 1) / STAGES) & 1);
    wgmma_fence();
    c.issue_pv(o, pf, last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    c.release(&s.v_empty[last]);
}

// Main loop, software-pipelined inside the warpgroup: while the tensor cores compute
// O += P_{j-1} V_{j-1}, this warpgroup already runs the softmax of S_j (FA3's intra-warpgroup
// overlap). Every wait and branch depends on the block index only.
FC_DEVICE void consumer(const Params& p, Shared& s, int wg, int m_block, int head, int batch, KvRange kv,
                        int key_limit) {
    using namespace cfg;
    const int warp = warp_id_in_block() % 4;
    const int lane = lane_id();
    const int n_blocks = kv.count;
    Consumer c{p,
               s,
               wg,
               m_block,
               head,
               batch,
               lane,
               m_block * BM + wg * 64 + warp * 16 + lane / 4,
               2 * (lane % 4),
               smem_u32(&s.q[0][wg * 64][0]),
               key_limit,
               kv.begin};

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    OnlineSoftmax<BN> softmax;
    softmax.init();
    // No visible key in this range (causal, Sq > Sk; or a split's empty share): O = 0, LSE = −inf.
    if (n_blocks > 0) mainloop(c, o, softmax, kv);
    if (SPLIT > 1) {
        c.write_partial(o, softmax);
    } else {
        c.epilogue(o, softmax);
    }
}

// Split mode: after the cluster barrier, CTA `rank` combines rows [rank·BM/SPLIT, …) of the
// query tile from every CTA's partial, in rank order, normalises, and writes O and the LSE.
FC_DEVICE void combine_split(const Params& p, Shared& s, int m_block, int head, int batch, int key_limit) {
#if FC_SPLIT > 1
    using namespace cfg;
    constexpr int ROWS = BM / SPLIT;
    constexpr int THREADS_C = 128 * CONSUMERS;
    const int t = threadIdx.x - 128;
    const uint32_t rank = cluster_rank();
#pragma unroll
    for (int e = 4 * t; e < ROWS * D; e += 4 * THREADS_C) {
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
        const int row = m_block * BM + r;
        const bool any = l > 0.0f && (!FC_SECRET_LEN || row < key_limit);
        const float inv = select_f(any, fast_rcp(l), 0.0f);
        if (row < p.seqlen_q) {
            uint16_t* out = reinterpret_cast<uint16_t*>(p.o_ptr) + batch * p.o_stride_b + (int64_t)row * p.o_stride_s +
                            head * p.o_stride_h + col;
            uint2 packed;
            packed.x = pack_elem2(o0 * inv, o1 * inv);
            packed.y = pack_elem2(o2 * inv, o3 * inv);
            *reinterpret_cast<uint2*>(out) = packed;
            if (p.lse_ptr != 0 && col == 0) {
                const float lse = m_use * p.scale + fast_log2(l) * 0.69314718055994530942f;
                float* lse_out = reinterpret_cast<float*>(p.lse_ptr) + ((int64_t)batch * p.heads_q + head) * p.seqlen_q + row;
                *lse_out = select_f(any, lse, neg_inf());
            }
        }
    }
#endif
}

#if FC_SPLIT > 1
#define FC_CLUSTER_DIMS __cluster_dims__(FC_SPLIT, 1, 1)
#else
#define FC_CLUSTER_DIMS
#endif

extern "C" __global__ void FC_CLUSTER_DIMS __launch_bounds__(cfg::THREADS, 1)
    flashcore_attention_fwd(const __grid_constant__ Params p) {
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzled TMA/wgmma tiles need 1024-byte alignment; the host adds the slack.
    const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    Shared& s = *reinterpret_cast<Shared*>(smem_raw + pad);

    // Split mode: the SPLIT CTAs of a cluster (consecutive along x) share one query tile.
    const int tile_x = (int)blockIdx.x / cfg::SPLIT;
    const int split_rank = (int)blockIdx.x % cfg::SPLIT;
    // Heaviest causal tiles first: the last query blocks see the most keys.
    const int m_block = FC_CAUSAL ? (p.num_m_blocks - 1 - tile_x) : tile_x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;

    // This CTA's share of the K/V blocks (all of them unless split).
    const int n_total = num_kv_blocks(p, m_block);
    const int per_split = ceil_div(n_total, cfg::SPLIT);
    KvRange kv;
    kv.begin = min(n_total, split_rank * per_split);
    kv.count = min(n_total, kv.begin + per_split) - kv.begin;
    kv.first_masked = max(0, min(kv.count, first_masked_block(p, m_block, n_total) - kv.begin));

    int key_limit = p.seqlen_k;
#if FC_SECRET_LEN
    // Clamped with min/max (ALU selects), so any stored value is safe and nothing branches on it.
    key_limit = max(0, min(p.seqlen_k, reinterpret_cast<const int32_t*>(p.lens_ptr)[batch]));
#endif
#if FC_LEAKY_CONTROL == 1
    {  // LEAK (control only): read Q[batch, m_block·BM, head, 0] and leave early if it is +0.0.
        const uint16_t* q = reinterpret_cast<const uint16_t*>(p.o_ptr_q_for_control);
        if (q[batch * p.o_stride_b + (int64_t)min(m_block * cfg::BM, p.seqlen_q - 1) * p.o_stride_s + head * p.o_stride_h] == 0)
            return;
    }
#elif FC_LEAKY_CONTROL == 2
    // LEAK (control only): walk only the blocks below the secret true length.
    kv.count = min(kv.count, ceil_div(key_limit, cfg::BN));
    kv.first_masked = min(kv.first_masked, kv.count);
#endif
    const int warp = warp_id_in_block();
    if (threadIdx.x == 0) {
        mbar_init(&s.q_full, 1);
#pragma unroll
        for (int i = 0; i < cfg::STAGES; ++i) {
            mbar_init(&s.k_full[i], 1);
            mbar_init(&s.v_full[i], 1);
            mbar_init(&s.k_empty[i], cfg::CONSUMERS * 4);
            mbar_init(&s.v_empty[i], cfg::CONSUMERS * 4);
        }
        fence_barrier_init();
    }
    __syncthreads();

    // Each role stays inside its own branch to the end: code after a join would be compiled for
    // the producer's reduced register budget.
    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(cfg::PRODUCER_REGS));
        if (threadIdx.x == 0) producer(p, s, m_block, head, batch, kv.begin, kv.count);
#if FC_SPLIT > 1
        cluster_sync();  // partials are parked (see below)
        cluster_sync();  // the combine is done
#endif
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(cfg::CONSUMER_REGS));
        consumer(p, s, warp / 4 - 1, m_block, head, batch, kv, key_limit);
#if FC_SPLIT > 1
        cluster_sync();  // every CTA's partial is in its shared memory
        combine_split(p, s, m_block, head, batch, key_limit);
        cluster_sync();  // no CTA leaves while others still read its shared memory
#endif
    }
}
