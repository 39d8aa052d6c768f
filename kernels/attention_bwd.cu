// flashcore backward attention for sm_90a: dQ, dK, dV from Q, K, V, O, dO and the forward's LSE.
//
// Three launches, in order, on one stream:
//   flashcore_bwd_preprocess (fc_bwd_preprocess.cuh) — per query row D = rowsum(dO ∘ O) and the
//       LSE in base 2, into a padded fp32 workspace (one pass: also zeroes the turn counters);
//   two passes (FC_ONEPASS=0): flashcore_bwd_dkdv (fc_bwd_dkdv.cuh) — one CTA per (key block,
//       K/V head, batch): dK, dV; flashcore_bwd_dq (fc_bwd_dq.cuh) — one CTA per (query tile,
//       query head, batch): dQ. Every gradient element is summed by one CTA in an order fixed by
//       the shapes: no atomics;
//   one pass (FC_ONEPASS=1): flashcore_bwd_onepass — the dK/dV kernel plus each tile's dQ
//       partial, added to an fp32 accumulator in an order fixed by the shapes (turn counters,
//       fc_bwd_onepass.cuh); flashcore_bwd_dq_convert — that accumulator to dQ;
//   with learnable sinks, after the preprocess: flashcore_bwd_dsink (fc_bwd_sink.cuh),
//       the sinks' gradient from the workspace, one CTA per head.
// Either way bitwise deterministic, and a sequence's bits do not depend on the batch it is in.
// The GEMM kernels are warp-specialised like the forward: warpgroup 0 is the producer (one thread
// issues TMA loads into an mbarrier ring), warpgroups 1 and 2 compute on wgmma.
// Data-oblivious: loop bounds, branches and addresses depend only on shapes and block indices;
// masks are selects (DESIGN.md §1).
//
// Compile-time configuration (NVRTC -D, BwdVariant::options): FC_HEAD_DIM (64|96|128|256; the one
// pass: 64|128), FC_BF16 (0|1), FC_CAUSAL (0|1), the streamed tile heights and ring depths
// FC_KV_BM, FC_KV_STAGES, FC_Q_BN, FC_Q_STAGES, FC_PINGPONG (0|1, fc_bwd_config.cuh), and issue
// 24's FC_WINDOW, FC_SOFTCAP (0|1, fc_bwd_mask.cuh; two-pass only). FC_BWD_LEAKY_CONTROL is the
// audit's planted-leak build, never shipped. FC_VARLEN (0|1, two passes, every head dim, with or
// without window and softcap): packed sequences with cu_seqlens — the grids' z is the sequence,
// each CTA reads its sequence's rows (fc_bwd_varlen.cuh; windows aligned to its own lengths),
// clears the rows its tiles read past them, and one past the sequence's blocks exits at once.
#include "fc_bwd_config.cuh"
#include "fc_bwd_preprocess.cuh"
#include "fc_bwd_dkdv.cuh"
#include "fc_bwd_dq.cuh"
#include "fc_bwd_onepass.cuh"
#include "fc_bwd_sink.cuh"

// Rows of the padded workspace, one warp each: grid (sq_pad / 8, heads_q, batch).
extern "C" __global__ void __launch_bounds__(256) flashcore_bwd_preprocess(const __grid_constant__ BwdParams p) {
    bwd_preprocess_row(p, blockIdx.x * 8 + threadIdx.x / 32, blockIdx.y, blockIdx.z);
}

// Learnable sinks' gradient (fc_bwd_sink.cuh), after the preprocess: grid (heads_q), launched
// only when the call has sinks.
extern "C" __global__ void __launch_bounds__(bw::DSINK_THREADS) flashcore_bwd_dsink(const __grid_constant__ BwdParams p) {
    bwd_dsink_head(p, blockIdx.x);
}

// Shared memory of the GEMM kernels, 1024-byte aligned for the 128-byte swizzle (the host adds
// the slack).
template <typename S>
FC_DEVICE S& bwd_shared() {
    extern __shared__ uint8_t smem_raw[];
    const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    return *reinterpret_cast<S*>(smem_raw + pad);
}

#if FC_ONEPASS
// One pass: dK, dV and dQ partials in one kernel (fc_bwd_onepass.cuh), then the dQ conversion.
extern "C" __global__ void __launch_bounds__(bw::THREADS, 1) flashcore_bwd_onepass(const __grid_constant__ BwdParams p) {
    OnepassShared& s = bwd_shared<OnepassShared>();
    const int n_block = onepass_key_block(p, blockIdx.x);
    if (threadIdx.x == 0) {
        mbar_init(&s.kv.kv_full, 1);
#pragma unroll
        for (int i = 0; i < bw::KV_STAGES; ++i) {
            mbar_init(&s.kv.full[i], 1);
            mbar_init(&s.kv.empty[i], bw::CONSUMERS * 4);
        }
#pragma unroll
        for (int b = 0; b < bw::DQ_BARS; ++b) {
            mbar_init(&s.dq_full[b], bw::CONSUMERS / bw::DQ_SPLIT * 4);
            mbar_init(&s.dq_empty[b], 1);
        }
        fence_barrier_init();
    }
    __syncthreads();
    const int warp = warp_id_in_block();
    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(bw::PRODUCER_REGS));
        if (threadIdx.x == 0) {
            dkdv_producer(p, s.kv, n_block, blockIdx.y, blockIdx.z);
        } else if (warp == 1 || (bw::DQ_WRITERS > 1 && warp == 3)) {
            // The dQ writer (fc_bwd_onepass.cuh), over the consumers' tile sequence; core 4:
            // warps 1 and 3, one per buffer.
            int first_m, end_m;
            dkdv_m_range(p, bwd_seq(p, blockIdx.z), n_block, first_m, end_m);
            if constexpr (bw::DQ_WRITERS > 1) {
                onepass_dq_writer_split(p, s.dq, s.dq_full, s.dq_empty, warp / 2, n_block, blockIdx.y, blockIdx.z,
                                        first_m, end_m);
            } else {
                onepass_dq_writer(p, s.dq, s.dq_full, s.dq_empty, n_block, blockIdx.y, blockIdx.z, first_m, end_m);
            }
        } else if (FC_STAGE_STATS && threadIdx.x == 64) {
            dkdv_stats_loader(p, s.kv, n_block, blockIdx.y, blockIdx.z);
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(bw::CONSUMER_REGS));
        dkdv_consumer<true>(p, s.kv, s.ds, warp / 4 - 1, n_block, blockIdx.y, blockIdx.z);
    }
}

// Rows of the padded workspace, one warp each: grid (sq_pad / 8, heads_q, batch).
extern "C" __global__ void __launch_bounds__(256) flashcore_bwd_dq_convert(const __grid_constant__ BwdParams p) {
    bwd_dq_convert_row(p, blockIdx.x * 8 + threadIdx.x / 32, blockIdx.y, blockIdx.z);
}
#else

// Each role stays inside its own branch to the end: code after a join would be compiled for the
// producer's reduced register budget.
extern "C" __global__ void __launch_bounds__(bw::THREADS, 1) flashcore_bwd_dkdv(const __grid_constant__ BwdParams p) {
#if FC_VARLEN
    // A key block past its sequence's keys has nothing to store (public: cu_seqlens).
    if ((int)blockIdx.x * bw::KV_BN >= bwd_seq(p, blockIdx.z).k_rows) return;
#endif
    DkdvShared& s = bwd_shared<DkdvShared>();
    if (threadIdx.x == 0) {
        mbar_init(&s.kv_full, 1);
#pragma unroll
        for (int i = 0; i < bw::KV_STAGES; ++i) {
            mbar_init(&s.full[i], 1);
            mbar_init(&s.empty[i], bw::CONSUMERS * 4);
        }
        fence_barrier_init();
    }
    __syncthreads();
    const int warp = warp_id_in_block();
    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(bw::PRODUCER_REGS));
        if (threadIdx.x == 0) dkdv_producer(p, s, blockIdx.x, blockIdx.y, blockIdx.z);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(bw::CONSUMER_REGS));
        dkdv_consumer<false>(p, s, nullptr, warp / 4 - 1, blockIdx.x, blockIdx.y, blockIdx.z);
    }
}

extern "C" __global__ void __launch_bounds__(bw::THREADS, 1) flashcore_bwd_dq(const __grid_constant__ BwdParams p) {
    DqShared& s = bwd_shared<DqShared>();
    // Causal: the last query tiles see the most keys; launching them first shortens the tail.
    // Which CTA computes a tile never changes what it computes.
    const int m_block = FC_CAUSAL ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
#if FC_VARLEN
    // A query tile past its sequence's queries has nothing to store (public: cu_seqlens).
    if (m_block * bw::Q_BM >= bwd_seq(p, blockIdx.z).len_q) return;
#endif
    if (threadIdx.x == 0) {
        mbar_init(&s.q_full, 1);
#pragma unroll
        for (int i = 0; i < bw::Q_STAGES; ++i) {
            mbar_init(&s.full[i], 1);
            mbar_init(&s.empty[i], bw::CONSUMERS * 4);
        }
        fence_barrier_init();
    }
    __syncthreads();
    const int warp = warp_id_in_block();
    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(bw::PRODUCER_REGS));
        if (threadIdx.x == 0) dq_producer(p, s, m_block, blockIdx.y, blockIdx.z);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(bw::CONSUMER_REGS));
        dq_consumer(p, s, warp / 4 - 1, m_block, blockIdx.y, blockIdx.z);
    }
}
#endif  // FC_ONEPASS
