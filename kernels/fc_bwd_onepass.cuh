// Backward, one pass (FC_ONEPASS): the dK/dV kernel (fc_bwd_dkdv.cuh) also forms each tile's dQ
// partial dS·K and adds it to a padded fp32 accumulator in the workspace, in an order fixed by
// the shape. The helpers here: the transposed-operand wgmma of that GEMM, the turn counters'
// acquire/release, the reductions, and the conversion kernel's row.
//
// Order: per (batch, query head, query tile) an int32 counter (zeroed by the preprocess) counts
// the key blocks that have added their partial. The key block of rank r waits until it reads r,
// adds, and increments it with release semantics. Rank 0 stores instead of adding. The rank is a
// function of the shape only (onepass_rank), so every dQ element is the same fp32 sum in the same
// order on every run and in every batch. How long a CTA spins depends on scheduling, never on
// data: the counters are a public synchronisation buffer to the audit (SECURITY.md), whose
// reads are public because every write to it is a public value at a public address.
#pragma once
#include "fc_bwd_config.cuh"

// Measurement only, never shipped (BwdVariant::diag): 1 = no turn wait (reductions in arrival
// order: nondeterministic), 2 = no wait and no reductions (dQ wrong), 3 = also no dQ GEMM, 4 =
// also no dSᵀ exchange between the warpgroups (the dK/dV kernel's work alone): what the order,
// the reductions, the fifth GEMM and the per-tile lockstep cost.
#ifndef FC_OP_DIAG
#define FC_OP_DIAG 0
#endif
// The turn protocol runs (waits, fences, releases) unless a diagnostic build drops it.
#define OP_ORDERED (FC_OP_DIAG == 0)

#if FC_ONEPASS
static_assert(FC_HEAD_DIM == 64 || FC_HEAD_DIM == 128, "the one-pass kernels serve head dims 64 and 128");
#endif

namespace bw {
// 64-query chunks of a streamed tile: dSᵀ is kept in shared memory as [chunk][key][64 queries].
constexpr int QCH = KV_BM / 64;
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

FC_DEVICE void red_add_f32x2(float* ptr, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(ptr), "f"(a), "f"(b) : "memory");
}

FC_DEVICE void st_f32x2(float* ptr, float a, float b) {
    asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(ptr), "f"(a), "f"(b) : "memory");
}

// This thread's 16-bit dSᵀ fragments (the A operand of dK += dSᵀ Q: rows = its two keys, k-slice
// kk = queries 16kk..16kk+15) into `ds` ([QCH][KV_BN][64], 128-byte swizzled), `key` being the
// thread's first key row within the CTA's block.
FC_DEVICE void onepass_store_ds(uint16_t (*ds)[bw::KV_BN][64], const uint32_t (&sf)[bw::KV_BM / 16][4], int key,
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

// dQ conversion: row i of (batch b, head h) = accumulator · scale in the input dtype, or zeros
// for a query tile no key block visits (causal, Sq > Sk: never written). One warp per row.
FC_DEVICE void bwd_dq_convert_row(const BwdParams& p, int i, int h, int b) {
    using namespace bw;
    if (i >= p.seqlen_q) return;  // public: index against the shape
    const int lane = lane_id();
    const int64_t bh = (int64_t)b * p.heads_q + h;
    const float* acc = reinterpret_cast<const float*>(p.dq_acc_ptr) + (bh * p.sq_pad + i) * D + lane * (D / 32);
#if FC_CAUSAL
    const int first_row = max(0, -(p.seqlen_k - p.seqlen_q));
    const bool visited = i / KV_BM >= first_row / KV_BM;
#else
    const bool visited = true;
#endif
    float v[D / 32];
    if constexpr (D == 64) {
        const float2 a = *reinterpret_cast<const float2*>(acc);
        v[0] = a.x, v[1] = a.y;
    } else {
        const float4 a = *reinterpret_cast<const float4*>(acc);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
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
