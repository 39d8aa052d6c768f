// Row sums of P on the tensor cores (FC_TC_SUM builds; PERF_NOTES, branch fwdperf). The softmax's
// denominator Σ_k P[r][k] is P times a column of ones: one wgmma m64n8k16 per 16 keys, with A =
// the P fragments the P V GEMM reads and B = a constant all-ones tile in shared memory, replaces an
// FP32 add per score. Every element of the m64n8 accumulator then holds its row's whole sum (the
// wgmma reduces over the warpgroup's fragments), so no quad shuffle is needed either. It sums the
// 16-bit P that P V multiplies, and it is rescaled by α together with O.
#pragma once
#include "fc_config.cuh"
#include "fc_wgmma.cuh"

#if FC_TC_SUM
// The ones tile: 16-bit 1.0 in every element of Shared::ones. Every thread writes its share and
// fences for the async proxy before the block-wide barrier that precedes any wgmma.
FC_DEVICE void fill_ones(Shared& s) {
    constexpr uint32_t kOnePair = FC_BF16 ? 0x3F803F80u : 0x3C003C00u;
    uint32_t* w = reinterpret_cast<uint32_t*>(&s.ones[0]);
    for (int i = threadIdx.x; i < 256; i += cfg::THREADS) w[i] = kOnePair;
    fence_proxy_async_smem();
}

// B = 16 keys × 8 columns, K-major without swizzle: 8×8 core matrices, the second one 128 bytes
// on (LBO), SBO unused at N = 8. All addresses stay inside the 1 KiB tile, and every element is
// 1, so the layout cannot change the result.
FC_DEVICE uint64_t ones_desc(const Shared& s) {
    const uint32_t a = smem_u32(&s.ones[0]);
    uint64_t d = 0;
    d |= (uint64_t)((a & 0x3FFFF) >> 4);
    d |= (uint64_t)(128 >> 4) << 16;
    d |= (uint64_t)(256 >> 4) << 32;
    return d;  // layout type 0: no swizzle
}

// l[0..3] += P[64×16] · ones[16×8] (A from registers).
FC_DEVICE void wgmma_rowsum_k16(float (&l)[4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
#if FC_BF16
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
#else
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 "
#endif
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(l[0]), "+f"(l[1]), "+f"(l[2]), "+f"(l[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// Σ over a block's keys of this warpgroup's P fragments, into l (issued beside the P V GEMM, in
// its commit group).
FC_DEVICE void issue_rowsum(float (&l)[4], const uint32_t (&pf)[cfg::BN / 16][4], const Shared& s) {
    const uint64_t db = ones_desc(s);
#pragma unroll
    for (int kk = 0; kk < cfg::BN / 16; ++kk) wgmma_rowsum_k16(l, pf[kk], db);
}
#endif
