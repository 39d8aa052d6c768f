// Measurement builds of the forward kernel for `flashcore leakage`. Never shipped:
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
// instead of the scores (written over them as soon as the Q Kᵀ GEMM has delivered them): the
// TMA loads, both GEMMs (S = Q Kᵀ over the real Q, K; O += P V over the real V), the rescale,
// the epilogue and every address and wait are the shipped kernel's, but no secret flows into
// the softmax (no max, exponential or sum of a secret; P is public). The audit still sees a
// structural flow (it cannot know that `fc_floor_zero` is 0), which reaches no sink. What is
// left of a fixed-vs-random difference in its timing comes from the data moving through memory
// and the tensor cores — the hardware's floor under any kernel that reads these inputs.
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
// The phase marks' running sums over a CTA's tiles (see fc_phase): [0] the last mark's clock,
// [1] the first tile's start, [2..4] Σ Q wait, Σ first scores, Σ main loop, [5] tiles begun.
__shared__ uint64_t fc_phase_state[6];

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
        // Before the block-wide barrier that precedes every phase mark.
        for (int i = 1; i < 6; ++i) fc_phase_state[i] = 0;
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
// Phase marks (the per-phase breakdown read by `flashcore bench --phases`): the SM clock when the
// block's barriers are initialised (thread 0); then, for the first consumer thread, each tile's
// begin, its Q tile's arrival, its first scores and its last P V. A persistent CTA walks many
// tiles, so the Q, S0 and LOOP words hold running sums laid end to end from the first tile's
// begin: Q = begin₀ + Σ Q wait, S0 = Q + Σ first scores, LOOP = S0 + Σ main loop. The span from
// LOOP to the CTA's stop is then Σ epilogue (each tile's last P V to the next tile's begin), and
// the BEGIN word counts the tiles. With one tile these are the plain marks. Public values only.
#define FC_PHASE_INIT 3
#define FC_PHASE_Q 28
#define FC_PHASE_S0 29
#define FC_PHASE_LOOP 30
#define FC_PHASE_BEGIN 31
FC_DEVICE void fc_phase(int word, int thread) {
    if ((int)threadIdx.x != thread) return;
    const uint64_t now = fc_clock64();
    uint64_t* r = fc_timer_record();
    uint64_t* st = fc_phase_state;
    if (word == FC_PHASE_INIT) {
        r[word] = now;
        return;
    }
    if (word == FC_PHASE_BEGIN) {
        // The first tile's begin, without a branch: the audit counts shared memory as secret, so
        // a test of st[5] may not guard a store (fc_timer_start zeroed st[1..5]).
        const uint64_t first = 0ull - (uint64_t)(st[5] == 0);
        st[1] |= now & first;
        st[5] += 1;
        r[FC_PHASE_BEGIN] = st[5];
    } else {
        st[2 + (word - FC_PHASE_Q)] += now - st[0];
        r[FC_PHASE_Q] = st[1] + st[2];
        r[FC_PHASE_S0] = st[1] + st[2] + st[3];
        r[FC_PHASE_LOOP] = st[1] + st[2] + st[3] + st[4];
    }
    st[0] = now;
}
#define FC_TIMER_START() fc_timer_start()
#define FC_TIMER_STOP() fc_timer_stop()
#define FC_PHASE_MARK(word, thread) fc_phase(word, thread)
#else
#define FC_TIMER_START() ((void)0)
#define FC_TIMER_STOP() ((void)0)
#define FC_PHASE_MARK(word, thread) ((void)0)
#endif

#if FC_FLOOR_CONTROL
// Overwrites one thread's M scores with a public pattern (a function of the thread, the element
// and the ring position `g` of the K/V block only), so the mask and the softmax do the shipped
// amount of select/max/exp2/sum work on values that carry no secret. Every element gets a
// distinct value, so ptxas cannot merge the exponentials of equal ones, and the pattern moves
// with `g`, so it cannot be hoisted out of the main loop.
// Each score is ANDed with `fc_floor_zero` (a constant-bank word that is 0, which ptxas cannot
// know) and added: the result is exactly the pattern, yet the Q Kᵀ GEMM's output has a use, so
// ptxas keeps the GEMM — and each register is rewritten in place, with no longer live ranges
// than the shipped kernel's (no spills).
__constant__ uint32_t fc_floor_zero = 0;
template <int M>
FC_DEVICE void fc_floor_scores(float (&s)[M], int g) {
    const float base = (float)(threadIdx.x & 7) * 0.125f + (float)(g & 15) * 0.0078125f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
        asm volatile(
            "{\n.reg .b32 t;\n.reg .f32 z;\n"
            "mov.b32 t, %0;\n"
            "and.b32 t, t, %1;\n"
            "mov.b32 z, t;\n"
            "add.rn.f32 %0, %2, %3;\n"
            "add.f32 %0, %0, z;\n}\n"
            : "+f"(s[i])
            : "r"(fc_floor_zero), "f"(base), "f"((float)i * 0.0625f));
    }
}
#define FC_FLOOR_SCORES(s, g) fc_floor_scores(s, g)
#else
#define FC_FLOOR_SCORES(s, g) ((void)0)
#endif
