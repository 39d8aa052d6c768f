// Measurement builds of the forward kernel for `flashcore leakage` (issue 13). Never shipped:
// every macro here compiles to nothing unless its define is set, so shipped variants are
// unchanged instruction for instruction.
//
// FC_CYCLE_TIMER=1 — the cycle timer. Each CTA writes one record of public values (the SM's own
// clock, the global nanosecond timer, the SM id) to `fc_timer_buf[fc_timer_slot · gridDim.x +
// blockIdx.x]`: thread 0 at the start of the kernel body, lane 0 of each consumer warp after the
// warp's last store. Both locations are `__constant__` words the host sets before each launch
// (constant bank 3: public to the audit), every address is public, and no secret reaches a
// stored value, so the instrumented build audits clean like the shipped one.
//
// FC_FLOOR_CONTROL=1 — the hardware floor. The mask and the softmax see a public pattern
// instead of the scores (written over them as soon as the Q Kᵀ GEMM has delivered them): the TMA loads, both GEMMs (S = Q Kᵀ over the real Q, K; O += P V over the real V), the
// rescale, the epilogue and every address and wait are the shipped kernel's, but no secret flows
// into the softmax (no max, exponential or sum of a secret; P is public). What is left of a
// fixed-vs-random difference in its timing comes from the data moving through memory and the
// tensor cores — the hardware's floor under any kernel that reads these inputs.
#pragma once
#include "fc_common.cuh"

#ifndef FC_CYCLE_TIMER
#define FC_CYCLE_TIMER 0
#endif
#ifndef FC_FLOOR_CONTROL
#define FC_FLOOR_CONTROL 0
#endif

#if FC_CYCLE_TIMER
// Layout of one CTA's record (u64 words); the host reads the same layout (src/leakage/cycles.rs).
#define FC_TIMER_WORDS 32
#define FC_TIMER_START_CLOCK 0
#define FC_TIMER_START_NS 1
#define FC_TIMER_SMID 2
#define FC_TIMER_STOP_CLOCK 4  // + consumer warp index (up to 12 warps)
#define FC_TIMER_STOP_NS 16    // + consumer warp index

__constant__ uint64_t fc_timer_buf;   // device address of the records (public)
__constant__ uint32_t fc_timer_slot;  // this launch's index in the buffer (public)

FC_DEVICE uint64_t fc_clock64() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}
FC_DEVICE uint64_t fc_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}
FC_DEVICE uint32_t fc_smid() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
FC_DEVICE uint64_t* fc_timer_record() {
    return reinterpret_cast<uint64_t*>(fc_timer_buf) +
           ((uint64_t)fc_timer_slot * gridDim.x + blockIdx.x) * FC_TIMER_WORDS;
}
FC_DEVICE void fc_timer_start() {
    if (threadIdx.x == 0) {
        const uint64_t clk = fc_clock64();
        const uint64_t ns = fc_globaltimer();
        uint64_t* r = fc_timer_record();
        r[FC_TIMER_START_CLOCK] = clk;
        r[FC_TIMER_START_NS] = ns;
        r[FC_TIMER_SMID] = fc_smid();
    }
}
// Called by every consumer thread after its last store; lane 0 of each warp writes.
FC_DEVICE void fc_timer_stop() {
    const uint64_t clk = fc_clock64();
    const uint64_t ns = fc_globaltimer();
    if (threadIdx.x % 32 == 0) {
        const int w = (int)(threadIdx.x / 32) - 4;  // consumer warps follow the producer's 4
        uint64_t* r = fc_timer_record();
        r[FC_TIMER_STOP_CLOCK + w] = clk;
        r[FC_TIMER_STOP_NS + w] = ns;
    }
}
#define FC_TIMER_START() fc_timer_start()
#define FC_TIMER_STOP() fc_timer_stop()
#else
#define FC_TIMER_START() ((void)0)
#define FC_TIMER_STOP() ((void)0)
#endif

#if FC_FLOOR_CONTROL
// Overwrites one thread's M scores with a public pattern (a function of the thread and element
// index only), so the mask and the softmax do the shipped amount of select/max/exp2/sum work on
// values that carry no secret. Every element gets a distinct value, so ptxas cannot merge the
// exponentials of equal ones; the asm keeps the writes from being folded into constants.
// The scores themselves are XOR-folded into one word stored to a dead-end shared cell at a
// public address: without a use, ptxas would drop the Q Kᵀ GEMM, and the floor must run it.
__shared__ uint32_t fc_floor_sink;
template <int M>
FC_DEVICE void fc_floor_scores(float (&s)[M]) {
    uint32_t fold = 0;
#pragma unroll
    for (int i = 0; i < M; ++i) fold ^= __float_as_uint(s[i]);
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(smem_u32(&fc_floor_sink)), "r"(fold) : "memory");
    const float base = (float)(threadIdx.x & 7) * 0.125f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
        asm volatile("add.f32 %0, %1, %2;" : "=f"(s[i]) : "f"(base), "f"((float)i * 0.0625f));
    }
}
#define FC_FLOOR_SCORES(s) fc_floor_scores(s)
#else
#define FC_FLOOR_SCORES(s) ((void)0)
#endif
