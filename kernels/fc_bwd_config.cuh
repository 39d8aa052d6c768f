// The backward kernels' compile-time configuration, their shared parameter block and the small
// helpers only they need. Values come from NVRTC -D options (BwdVariant::options in
// src/kernels/backward.rs), so host and device agree by construction. Independent of the
// forward's fc_config.cuh: the two kernels evolve separately.
#pragma once
#include "fc_common.cuh"
#include "fc_mbarrier.cuh"
#include "fc_wgmma.cuh"
#include "fc_wgmma_keys.cuh"

#if !defined(FC_HEAD_DIM) || !defined(FC_BF16) || !defined(FC_CAUSAL) || !defined(FC_KV_BM) || \
    !defined(FC_KV_STAGES) || !defined(FC_Q_BN) || !defined(FC_Q_STAGES)
#error "the backward variant's defines are missing (see BwdVariant::options)"
#endif

// FC_ONEPASS: 1 = the one-pass kernels (fc_bwd_onepass.cuh), 0 = the two-pass ones.
#ifndef FC_ONEPASS
#define FC_ONEPASS 0
#endif

// FC_BWD_CORE (one pass only; PERF_NOTES, "the one pass's core"): 0 = the first tile schedule;
// 1 = dQ's GEMM issued without first draining dV += Pᵀ dO (Pᵀ's fragments stay live until one
// wait after dK's issue covers dV and dQ); 2 = 1 plus dSᵀ to shared memory with stmatrix (four
// 8×8 tiles per instruction) instead of 32-bit scalar stores; 3 = 2 plus a 2-stage (Q, dO) ring
// whose freed 32 KiB hold a second fp32 dQ buffer, so the consumers run up to two tiles ahead of
// the dQ writer's turn chain instead of one (bw::DQ_BUFS); 4 = 3 with the dQ writer pipelined:
// one writer warp per buffer, each serial over its own tiles (tile m+1's reduction is issued
// while tile m's completes), and each consumer warpgroup's 16 KiB piece on its own full/empty
// barriers and bulk operation (bw::DQ_WRITERS, bw::DQ_SPLIT). The host's default: 3.
// Schedules only: every build computes the same values in the same order (the same bits).
#ifndef FC_BWD_CORE
#define FC_BWD_CORE 0
#endif
#if FC_BWD_CORE && !FC_ONEPASS
#error "FC_BWD_CORE is a one-pass schedule"
#endif

// FC_BWD_WIDE (80-row query tiles only; PERF_NOTES, "Backward 80-row one pass at 24/240
// registers"): 1 = a 24/240 register split, which leaves the consumers room for dPᵀ issued beside
// Sᵀ and dQᵀ's GEMM issued before dK's wait (at 232 ptxas serialized the wgmmas with both). The
// same values in the same order: the same bits as the 232-register build.
#ifndef FC_BWD_WIDE
#define FC_BWD_WIDE 0
#endif

// FC_BWD_LEAKY_CONTROL (never shipped; tests/audit_backward.rs builds it to show the audit of
// these kernels is not vacuous): 1 = each kernel reads memory at an address taken from a secret
// (the preprocess from its dot product, the GEMM kernels from a wgmma accumulator).
#ifndef FC_BWD_LEAKY_CONTROL
#define FC_BWD_LEAKY_CONTROL 0
#endif

namespace bw {
constexpr int D = FC_HEAD_DIM;
static_assert(D == 64 || D == 96 || D == 128 || D == 256, "head dims 64, 96, 128, 256");
// Shared tiles are [CHUNKS][rows][SW_ELEMS]: 64-element (128-byte swizzled) rows where the head
// dim is a multiple of 64, 32-element (64-byte swizzled) rows at d96 — the forward's layout
// (fc_config.cuh) and the host's tensor-map boxes (tensor_map::swizzle_elems).
constexpr int SW_ELEMS = D % 64 == 0 ? 64 : 32;
constexpr int CHUNKS = D / SW_ELEMS;  // swizzle atoms across the head dim
constexpr int ROW_BYTES = SW_ELEMS * 2;  // one swizzled row of two-byte elements
constexpr int GROUP_BYTES = 8 * ROW_BYTES;  // one 8-row swizzle atom (the descriptors' stride)
constexpr int K_STEPS = SW_ELEMS / 16;  // k16 steps per swizzled row
// d256 (HSPLIT = 2): dK and dV of 64 keys × 256 dims would take 256 fp32 registers per thread,
// so both consumer warpgroups work on the same 64 keys, each owning half the head dim of dK and
// dV (both compute the tile's Sᵀ and dPᵀ: PERF_NOTES, "the backward at head dims 96 and 256"). DWG = dims per warpgroup.
constexpr int HSPLIT = D > 128 ? 2 : 1;
constexpr int DWG = D / HSPLIT;
constexpr int CONSUMERS = 2;         // consumer warpgroups, 64 rows each
constexpr int THREADS = 128 * (1 + CONSUMERS);
// setmaxnreg split: 128·40 + 256·232 = 64512, what launch_bounds(384, 1) gives the block (at 24
// the producer's address arithmetic spills: FA3/FA4's 24/240 left the one pass's producer
// warpgroup with 37 LDL/STL, while its consumers fit core 1's schedule in 232 with none —
// PERF_NOTES, "the one pass's core").
// FC_BWD_WIDE: 24/240 (80-row tiles only), the same 64512: there the producer warpgroup's
// roles, their loops kept rolled, fit 24 registers without a spill.
constexpr int PRODUCER_REGS = FC_BWD_WIDE ? 24 : 40;
constexpr int CONSUMER_REGS = FC_BWD_WIDE ? 240 : 232;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 384 * 168, "the block's registers");
// dK/dV kernel: a CTA owns KV_BN keys (64 per consumer) and streams KV_BM-row Q/dO tiles.
// dQ kernel: a CTA owns Q_BM query rows (64 per consumer) and streams Q_BN-key K/V tiles.
// The streamed tile heights and ring depths come from the host (BwdVariant::tiles).
constexpr int KV_BN = 128 / HSPLIT;
constexpr int KV_BM = FC_KV_BM;
constexpr int KV_STAGES = FC_KV_STAGES;
constexpr int Q_BM = 128;
constexpr int Q_BN = FC_Q_BN;
constexpr int Q_STAGES = FC_Q_STAGES;
static_assert((KV_BM == 64 || KV_BM == 128 || KV_BM == 80) && (Q_BN == 64 || Q_BN == 128), "wgmma N of the score GEMMs");
// 80-row query tiles (wgmma N = 80 for the score GEMMs; dQ computed transposed, as 80 is not a
// multiple of wgmma's M = 64: fc_bwd_onepass.cuh): the one pass at d128 without a causal mask, in
// schedule 3 with one dQ buffer (BwdVariant::tiles; shared memory holds no second one).
static_assert(KV_BM != 80 || (FC_ONEPASS && D == 128 && !FC_CAUSAL && FC_BWD_CORE == 3),
              "80-row query tiles: the d128 non-causal one pass, schedule 3");
static_assert(!FC_BWD_WIDE || KV_BM == 80, "the 24/240 split is an 80-row-tile build");
// Rows of the preprocess workspace per (batch, head) are padded to a multiple of this, so every
// tile of either kernel reads its LSE/D values without a bounds check: 128, or lcm(128, 80) = 640
// with 80-row tiles (the host's BwdVariant::row_pad).
constexpr int ROW_PAD = KV_BM == 80 ? 640 : 128;
static_assert(KV_BN * HSPLIT == 64 * CONSUMERS && Q_BM == 64 * CONSUMERS, "64 rows per consumer warpgroup");
static_assert(ROW_PAD % KV_BM == 0 && ROW_PAD % Q_BM == 0, "padding covers every query tile");
}  // namespace bw

// Must match `BwdKernelParams` in src/attention/backward.rs byte for byte. One block serves all
// three kernels; the host fills the tensor maps with each kernel's box heights.
struct BwdParams {
    TensorMap q_map, k_map, v_map, do_map;  // 4-D maps over (dim, seq, head, batch)
    uint64_t o_ptr, do_ptr, lse_ptr;         // preprocess inputs (O, dO: Q's strides; LSE fp32 [B, Hq, Sq])
    uint64_t dq_ptr, dk_ptr, dv_ptr;         // outputs (dQ: Q's strides; dK, dV: K's strides)
    uint64_t lse2_ptr, dvec_ptr;             // workspace fp32 [B·Hq][sq_pad]: LSE·log2(e) (+inf masked), rowsum(dO∘O)
    int64_t q_stride_b, q_stride_s, q_stride_h;  // elements
    int64_t k_stride_b, k_stride_s, k_stride_h;
    int32_t batch, seqlen_q, seqlen_k, heads_q;
    int32_t group, sq_pad;                   // group = Hq / Hkv; sq_pad = Sq rounded up to bw::ROW_PAD
    float scale_log2, scale;                 // softmax scale · log2(e), softmax scale
    int32_t kv_m_blocks;                     // ceil(Sq / KV_BM)
    int32_t q_n_blocks;                      // ceil(Sk / Q_BN)
    // One pass (FC_ONEPASS, fc_bwd_onepass.cuh): the fp32 dQ accumulator [B·Hq][sq_pad][D] and the
    // turn counters [B·Hq][kv_m_blocks] in the workspace; key blocks ceil(Sk / KV_BN).
    uint64_t dq_acc_ptr, flags_ptr;
    int32_t kv_n_blocks;
    // Windows and softcap (fc_bwd_mask.cuh): the window's sides (unbounded: Sq + Sk, host-clamped) and the
    // softcap's factors (as the forward's: softcap_in = scale / cap, softcap_out = cap / scale).
    int32_t window_left, window_right;
    float softcap_in, softcap_out;
    int32_t pad0;
    // Learnable sinks: fp32 [Hq] logits (secret) and their gradient fp32 [Hq] (the dsink kernel);
    // 0 when the call has none.
    uint64_t sinks_ptr, dsink_ptr;
    // Varlen (FC_VARLEN, fc_bwd_varlen.cuh): the pack's query and key tokens, and the public
    // metadata — cu_seqlens_q / cu_seqlens_k (i32 [batch + 1]), seqused_k / seqused_q (i32 [batch];
    // without one the host passes cu_seqlens + 1, which bounds nothing).
    int32_t vl_total_q, vl_total_k;
    uint64_t cu_q_ptr, cu_k_ptr, used_k_ptr, used_q_ptr;
    // To 768 bytes: the host's CUtensorMap is 128-byte aligned (CUDA 13 headers), so its copy of
    // this block is a multiple of 128 bytes long.
    int32_t reserved[2];
};
static_assert(sizeof(BwdParams) == 768, "BwdKernelParams in src/attention/backward.rs is 768 bytes");

FC_DEVICE float pos_inf() { return __int_as_float(0x7f800000); }

// A packed pair of 16-bit elements → two floats (lo, hi).
FC_DEVICE void unpack_elem2(uint32_t x, float& lo, float& hi) {
#if FC_BF16
    lo = __int_as_float(x << 16);
    hi = __int_as_float(x & 0xffff0000u);
#else
    asm("{\n.reg .f16 a, b;\nmov.b32 {a, b}, %2;\ncvt.f32.f16 %0, a;\ncvt.f32.f16 %1, b;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(x));
#endif
}

// fp32 accumulator tile (m64nN wgmma layout) → 16-bit A fragments for a following GEMM whose K
// dimension is the tile's N: k-slice kk is accumulator columns 16kk..16kk+15.
template <int N>
FC_DEVICE void acc_to_frags(const float (&acc)[N / 2], uint32_t (&f)[N / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) f[kk][r] = pack_elem2(acc[8 * kk + 2 * r], acc[8 * kk + 2 * r + 1]);
}

// Stores row half `h` of an m64nN accumulator times `mul` at `out` (the row's first element plus
// this thread's column).
template <int N>
FC_DEVICE void bwd_store_row(uint16_t* out, const float (&acc)[N / 2], int h, float mul) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_elem2(acc[4 * j + 2 * h] * mul, acc[4 * j + 2 * h + 1] * mul);
}

// The stage and parity of ring slot g.
template <int STAGES>
FC_DEVICE int bwd_stage(int g) { return g % STAGES; }
template <int STAGES>
FC_DEVICE uint32_t bwd_phase(int g) { return (g / STAGES) & 1; }

// Ping-pong between the two consumer warpgroups (FC_PINGPONG): a warpgroup issues its score
// GEMMs only on its turn and then hands the turn over, so one's exponentials run while the
// other's GEMMs occupy the tensor cores instead of both waiting on the same stage in lockstep.
// Named barrier 1 + w is warpgroup w's turn; the turn count depends on block counts only.
#ifndef FC_PINGPONG
#define FC_PINGPONG 0
#endif
struct Turns {
    int wg, count;  // this warpgroup, turns per warpgroup (the same for both)
    // Warpgroup 1 hands warpgroup 0 the first turn.
    FC_DEVICE void start() const {
        if (FC_PINGPONG && wg == 1 && count > 0) named_bar_arrive(1, 2 * 128);
    }
    FC_DEVICE void wait(int) const {
        if (FC_PINGPONG) named_bar_sync(1 + wg, 2 * 128);
    }
    // Warpgroup 1's last hand-over would have no taker.
    FC_DEVICE void pass(int it) const {
        if (FC_PINGPONG && !(wg == 1 && it == count - 1)) named_bar_arrive(1 + (wg ^ 1), 2 * 128);
    }
};

// The leaky control's planted leak: a load at an address taken from `secret`, folded into `x`
// so it is not dead code. A no-op unless FC_BWD_LEAKY_CONTROL.
FC_DEVICE float bwd_leak(float x, float secret, const float* base) {
#if FC_BWD_LEAKY_CONTROL
    return x + base[__float_as_int(secret) & 7];  // LEAK (control only)
#else
    (void)secret;
    (void)base;
    return x;
#endif
}

// The descriptor of a K-major operand's k16 step kk in a [CHUNKS][rows][SW_ELEMS] tile (the
// score GEMMs' A and B): chunk kk / K_STEPS, 32 bytes per step inside the swizzled row.
// The tile's descriptor is built once and each step advances it (wgmma_desc_advance).
FC_DEVICE uint64_t bwd_desc_k(uint32_t base, int rows, int kk) {
    using namespace bw;
    const uint32_t off = (kk / K_STEPS) * (rows * ROW_BYTES) + (kk % K_STEPS) * 32;
    return wgmma_desc_advance(wgmma_desc_rows<ROW_BYTES>(base, 16, GROUP_BYTES), off);
}

// The descriptor of an MN-major B operand's k16 step kk (rows kk·16.. of a [CHUNKS][rows]
// [SW_ELEMS] tile, N across the chunks): the dK, dV and dQ GEMMs' transposed B.
FC_DEVICE uint64_t bwd_desc_t(uint32_t base, int rows, int kk) {
    using namespace bw;
    return wgmma_desc_advance(wgmma_desc_rows<ROW_BYTES>(base, rows * ROW_BYTES, GROUP_BYTES), kk * 16 * ROW_BYTES);
}

// At d256 the 64-bit descriptors of a tile that stays put for the whole loop (the dK/dV kernel's
// K, V; the dQ kernel's Q, dO: 16 k-steps each) would be hoisted out of it and held in registers
// the accumulators need (spills). Hiding the base address inside the loop makes them be rebuilt
// per tile (a few integer ops). The same with 80-row tiles, whose score accumulators (2 × 40) and
// dK, dV leave no registers for them (ptxas serialized the wgmmas). The identity elsewhere (their
// code is unchanged).
FC_DEVICE uint32_t bwd_opaque(uint32_t x) {
    if constexpr (bw::D > 128 || bw::KV_BM == 80) asm volatile("" : "+r"(x));
    return x;
}

FC_DEVICE void bwd_release(uint64_t* bar) {
    __syncwarp();
    if (lane_id() == 0) mbar_arrive(bar);
}
