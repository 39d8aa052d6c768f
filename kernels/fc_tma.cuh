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

// 4-D tile store from shared memory (same coordinates as tma_load_4d), in the thread's bulk
// group; rows outside the tensor are not written.
FC_DEVICE void tma_store_4d(const TensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
FC_DEVICE void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// The thread's bulk groups have read their shared memory (it may be overwritten).
FC_DEVICE void bulk_wait_group_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// The thread's bulk groups are complete (their global writes performed).
FC_DEVICE void bulk_wait_group() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Plain bulk copy of `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned),
// completing on an mbarrier like the tile loads.
FC_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}
