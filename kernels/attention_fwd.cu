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
// Compile-time configuration (NVRTC -D): FC_HEAD_DIM (64|128), FC_BF16 (0|1), FC_CAUSAL (0|1).
#include "fc_common.cuh"
#include "fc_mbarrier.cuh"
#include "fc_tma.cuh"
#include "fc_wgmma.cuh"
#include "fc_softmax.cuh"

#if !defined(FC_HEAD_DIM) || !defined(FC_BF16) || !defined(FC_CAUSAL) || !defined(FC_BLOCK_M) || \
    !defined(FC_BLOCK_N) || !defined(FC_STAGES) || !defined(FC_CONSUMERS)
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
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int ROW_BYTES = 128;              // one swizzled row of 64 two-byte elements
// Register split after setmaxnreg: the producer gives registers back, consumers take them.
constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 40 : 24;
constexpr int CONSUMER_REGS = CONSUMERS == 2 ? 232 : 160;
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file");
constexpr uint32_t Q_BYTES = BM * D * 2;
constexpr uint32_t KV_BYTES = BN * D * 2;
}  // namespace cfg

// Must match `KernelParams` in src/attention/launch.rs byte for byte.
struct Params {
    TensorMap q_map, k_map, v_map;  // 4-D maps over (dim, seq, head, batch)
    uint64_t o_ptr;                  // output, same layout as Q (strides below, in elements)
    uint64_t lse_ptr;                // fp32 [B, Hq, Sq] or 0 for none
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

// Whether block n needs element masks: a partial last block, or (causal) one that crosses the
// diagonal of the tile's first row. Depends on indices only.
FC_DEVICE bool block_needs_mask(const Params& p, int m_block, int n_block) {
    bool partial = (n_block + 1) * cfg::BN > p.seqlen_k;
#if FC_CAUSAL
    const int first_row_limit = m_block * cfg::BM + p.seqlen_k - p.seqlen_q;
    partial = partial || ((n_block + 1) * cfg::BN - 1 > first_row_limit);
#endif
    return partial;
}

FC_DEVICE void producer(const Params& p, Shared& s, int m_block, int head, int batch, int n_blocks) {
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
            tma_load_4d(&s.k[stage][c][0][0], &p.k_map, &s.k_full[stage], c * 64, it * cfg::BN, kv_head, batch);
        }
        mbar_wait(&s.v_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&s.v_full[stage], cfg::KV_BYTES);
#pragma unroll
        for (int c = 0; c < cfg::CHUNKS; ++c) {
            tma_load_4d(&s.v[stage][c][0][0], &p.v_map, &s.v_full[stage], c * 64, it * cfg::BN, kv_head, batch);
        }
    }
}

FC_DEVICE void consumer(const Params& p, Shared& s, int wg, int m_block, int head, int batch, int n_blocks) {
    using namespace cfg;
    const int warp = warp_id_in_block() % 4;
    const int lane = lane_id();
    // This thread's two query rows (global index) and its first column within a block.
    const int row0 = m_block * BM + wg * 64 + warp * 16 + lane / 4;
    const int col0 = 2 * (lane % 4);

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    OnlineSoftmax<BN> softmax;
    softmax.init();

    const uint32_t q_base = smem_u32(&s.q[0][wg * 64][0]);
    mbar_wait(&s.q_full, 0);

    for (int it = 0; it < n_blocks; ++it) {
        const int stage = it % STAGES;
        const uint32_t phase = (it / STAGES) & 1;

        // S = Q Kᵀ over the head dim, 16 at a time (32 bytes inside a 128-byte swizzle row).
        float sacc[BN / 2];
        const uint32_t k_base = smem_u32(&s.k[stage][0][0][0]);
        mbar_wait(&s.k_full[stage], phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t kin = (kk % 4) * 32;  // byte offset of this k-slice inside the swizzle row
            const uint64_t da = wgmma_desc_sw128(q_base + (kk / 4) * (BM * ROW_BYTES) + kin, 16, 1024);
            const uint64_t db = wgmma_desc_sw128(k_base + (kk / 4) * (BN * ROW_BYTES) + kin, 16, 1024);
            Mma<BN>::ss(sacc, da, db, kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sacc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&s.k_empty[stage]);

        // Mask out-of-range keys and (causal) keys right of the diagonal, by select.
        if (block_needs_mask(p, m_block, it)) {
            const int key_base = it * BN + col0;
#pragma unroll
            for (int i = 0; i < BN / 2; ++i) {
                const int key = key_base + 8 * (i / 4) + (i % 2);
                bool visible = key < p.seqlen_k;
#if FC_CAUSAL
                const int row = row0 + 8 * ((i / 2) % 2);
                visible = visible && (key <= row + p.seqlen_k - p.seqlen_q);
#endif
                sacc[i] = select_f(visible, sacc[i], neg_inf());
            }
        }

        float alpha[2];
        softmax.step(sacc, p.scale_log2, alpha);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i / 2) % 2];

        // P (fp32 accumulators) → 16-bit A fragments: k-slice kk is accumulator columns 16kk..16kk+15.
        uint32_t pf[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            pf[kk][0] = pack_elem2(sacc[8 * kk + 0], sacc[8 * kk + 1]);
            pf[kk][1] = pack_elem2(sacc[8 * kk + 2], sacc[8 * kk + 3]);
            pf[kk][2] = pack_elem2(sacc[8 * kk + 4], sacc[8 * kk + 5]);
            pf[kk][3] = pack_elem2(sacc[8 * kk + 6], sacc[8 * kk + 7]);
        }

        // O += P V; V is [keys][dim] in shared memory, i.e. B with the N (dim) index contiguous.
        const uint32_t v_base = smem_u32(&s.v[stage][0][0][0]);
        mbar_wait(&s.v_full[stage], phase);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const uint64_t db = wgmma_desc_sw128(v_base + kk * 16 * ROW_BYTES, BN * ROW_BYTES, 1024);
            Mma<D>::rs_tb(o, pf[kk], db, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(o);
        __syncwarp();
        if (lane == 0) mbar_arrive(&s.v_empty[stage]);
    }

    // Epilogue: normalise, write O (rows past Sq are not stored) and the log-sum-exp.
    float total[2];
    softmax.finish(total);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + 8 * h;
        const bool any = total[h] > 0.0f;  // false only for a fully masked row
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
                float* lse_out = reinterpret_cast<float*>(p.lse_ptr) + ((int64_t)batch * p.heads_q + head) * p.seqlen_q + row;
                *lse_out = select_f(any, lse, neg_inf());
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(cfg::THREADS, 1) flashcore_attention_fwd(const __grid_constant__ Params p) {
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzled TMA/wgmma tiles need 1024-byte alignment; the host adds the slack.
    const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    Shared& s = *reinterpret_cast<Shared*>(smem_raw + pad);

    // Heaviest causal tiles first: the last query blocks see the most keys.
    const int m_block = FC_CAUSAL ? (p.num_m_blocks - 1 - (int)blockIdx.x) : (int)blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int n_blocks = num_kv_blocks(p, m_block);

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

    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(cfg::PRODUCER_REGS));
        if (threadIdx.x == 0) producer(p, s, m_block, head, batch, n_blocks);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(cfg::CONSUMER_REGS));
        consumer(p, s, warp / 4 - 1, m_block, head, batch, n_blocks);
    }
}
