// TMA (cp.async.bulk.tensor): tiles of Q, K, V from global to shared memory, 128-byte swizzled,
// completing on an mbarrier. Out-of-range rows are filled with zeros by the hardware.
#pragma once
#include "fc_common.cuh"

FC_DEVICE void tma_prefetch_desc(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// 4-D tile load; coordinates innermost first: (dim, seq, head, batch).
FC_DEVICE void tma_load_4d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_u32(dst)),
        "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

// Plain bulk copy of `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned),
// completing on an mbarrier like the tile loads.
FC_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
