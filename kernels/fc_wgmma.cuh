// wgmma: warpgroup matrix multiply-accumulate (HGMMA in SASS). Shared-memory operands are
// described by 64-bit descriptors over 128-byte-swizzled tiles laid out as [D/64][rows][64].
#pragma once
#include "fc_common.cuh"
#include "fc_wgmma_ops.cuh"

// Descriptor of a 128B-swizzled shared tile. `lbo`: byte distance between 64-element chunks
// along the contiguous (MN-major) dimension; `sbo`: byte distance between 8-row groups.
FC_DEVICE uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    uint64_t d = 0;
    d |= (uint64_t)((smem_addr & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62;  // 128-byte swizzle
    return d;
}

// The same with the 64-byte swizzle (32-element rows: d96's tiles, fc_config.cuh).
FC_DEVICE uint64_t wgmma_desc_sw64(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    return (wgmma_desc_sw128(smem_addr, lbo, sbo) & ~((uint64_t)3 << 62)) | ((uint64_t)2 << 62);
}

// The descriptor for a tile whose swizzled rows are `ROW_BYTES` long (128 or 64).
template <int ROW_BYTES>
FC_DEVICE uint64_t wgmma_desc_rows(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    static_assert(ROW_BYTES == 128 || ROW_BYTES == 64, "128- or 64-byte swizzle");
    return ROW_BYTES == 128 ? wgmma_desc_sw128(smem_addr, lbo, sbo) : wgmma_desc_sw64(smem_addr, lbo, sbo);
}

// `desc` moved `bytes` further into shared memory: the start-address field (bits 0–13, the
// address / 16) plus bytes / 16, on the low word only. Exact while the moved address stays below
// 256 KiB (every shared-memory address of a CTA on sm_90: at most 228 KiB), so the field never
// carries into the next. With `bytes` a constant this is one 32-bit add per k-step, where
// rebuilding the descriptor from the address masks and shifts it again each time.
FC_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) {
    const uint32_t lo = (uint32_t)desc + (bytes >> 4);
    return (desc & 0xFFFFFFFF00000000ull) | lo;
}

FC_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FC_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
FC_DEVICE void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int N>
FC_DEVICE void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The same for 16-bit A fragments read asynchronously by an in-flight wgmma: fencing them after
// the wait keeps the compiler from reusing their registers while the tensor cores still read them.
template <int K>
FC_DEVICE void fence_frags(uint32_t (&r)[K][4]) {
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(r[k][i])::"memory");
}

// Dispatch on element type (FC_BF16) and N for the two products of attention.
template <int N>
struct Mma;
template <>
struct Mma<64> {
    FC_DEVICE static void ss(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_ss_m64n64k16_bf16(d, a, b, scale_d);
#else
        wgmma_ss_m64n64k16_f16(d, a, b, scale_d);
#endif
    }
    FC_DEVICE static void rs_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_rs_m64n64k16_bf16_tb(d, a, b, scale_d);
#else
        wgmma_rs_m64n64k16_f16_tb(d, a, b, scale_d);
#endif
    }
};
template <>
struct Mma<128> {
    FC_DEVICE static void ss(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_ss_m64n128k16_bf16(d, a, b, scale_d);
#else
        wgmma_ss_m64n128k16_f16(d, a, b, scale_d);
#endif
    }
    FC_DEVICE static void rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_rs_m64n128k16_bf16_tb(d, a, b, scale_d);
#else
        wgmma_rs_m64n128k16_f16_tb(d, a, b, scale_d);
#endif
    }
};

// O += P V at head dims 96 and 256: N is the head dim, so only the RS form exists.
template <>
struct Mma<96> {
    FC_DEVICE static void rs_tb(float (&d)[48], const uint32_t (&a)[4], uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_rs_m64n96k16_bf16_tb(d, a, b, scale_d);
#else
        wgmma_rs_m64n96k16_f16_tb(d, a, b, scale_d);
#endif
    }
};
template <>
struct Mma<256> {
    FC_DEVICE static void rs_tb(float (&d)[128], const uint32_t (&a)[4], uint64_t b, int scale_d) {
#if FC_BF16
        wgmma_rs_m64n256k16_bf16_tb(d, a, b, scale_d);
#else
        wgmma_rs_m64n256k16_f16_tb(d, a, b, scale_d);
#endif
    }
};

FC_DEVICE uint32_t pack_elem2(float lo, float hi) {
#if FC_BF16
    return pack_bf16x2(lo, hi);
#else
    return pack_f16x2(lo, hi);
#endif
}
