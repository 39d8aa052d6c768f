// flashcore forward attention for sm_90a: O = softmax(scale · Q Kᵀ + mask) V.
//
// A persistent grid: each CTA loops over BM-row query tiles of (batch, head) pairs in an order
// fixed by the shapes (fc_scheduler.cuh). Warp-specialised:
//   warpgroup 0  — producer (fc_producer.cuh): one thread issues TMA loads of each tile's Q and
//                  of K/V blocks into a STAGES-deep shared-memory ring that runs on across
//                  tiles, each stage completing on an mbarrier;
//   warpgroups 1.. — consumers (fc_consumer.cuh): 64 query rows each; S = Q Kᵀ and O += P V on
//                  wgmma, online softmax (fc_softmax.cuh) in fp32 registers between them, then
//                  the epilogue (fc_epilogue.cuh).
// Data-oblivious: loop bounds, masks-or-not and addresses depend only on shapes and indices;
// masking and every NaN guard are selects (DESIGN.md §1).
//
// Compile-time configuration (NVRTC -D): FC_HEAD_DIM (64|128), FC_BF16 (0|1), FC_CAUSAL (0|1),
// FC_SECRET_LEN (0|1), FC_SPLIT (1|2|4), tile shape FC_BLOCK_M/N, FC_STAGES, FC_CONSUMERS;
// FC_VARLEN (0|1): packed variable-length sequences from a public work list (fc_scheduler.cuh),
// built by the host or by this module's flashcore_varlen_build (fc_varlen_build.cuh);
// FC_SOFTCAP (0|1): softcap the scores (fc_consumer.cuh), its own builds — a runtime branch
// would duplicate the main loop in every build (spills at 192 rows).
//
// FC_LEAKY_CONTROL (never shipped; the power control of `flashcore leakage`): 1 = the whole CTA
// exits at once when the first element of its first Q tile is +0.0 (an early exit on data); 2 = in
// secret-length mode, K/V blocks past the true length are skipped (a loop bound from a secret).
// Both are exactly what the audit forbids; the timing test must catch them.
//
// Split mode (FC_SPLIT > 1, for short sequences that would leave most SMs idle): the keys of one
// query tile are divided among the FC_SPLIT CTAs of a thread-block cluster; each computes a
// partial (O, max, sum) over its range, and the cluster combines them through distributed shared
// memory in a fixed order (rank 0, 1, …) — no atomics, bitwise deterministic.
//
// Secret-length mode (FC_SECRET_LEN): each batch entry's true length is an i32 in device memory,
// a secret. The kernel still walks the padded length (public); keys at or past the true length
// are masked by select and query rows at or past it are written as zeros (LSE −inf). With
// FC_DECODE the i32 is instead the sequence's key count in a KV cache (fc_decode.cuh): every
// query row is real, and a causal mask is aligned to the count.
#include "fc_config.cuh"
#include "fc_scheduler.cuh"
#include "fc_producer.cuh"
#include "fc_consumer.cuh"
#include "fc_epilogue.cuh"
#include "fc_instrument.cuh"
#if FC_DECODE
#include "fc_decode.cuh"
#endif
#if FC_KV_CACHE
#include "fc_kv_append.cuh"
#endif
#if FC_VARLEN
#include "fc_varlen_build.cuh"  // the device-built work list's kernel
#endif

// Every tile of this CTA, for one consumer warpgroup.
FC_DEVICE void consumer(const Params& p, Shared& s, int wg) {
    using namespace cfg;
    const Scheduler sched{p};
    const int warp = warp_id_in_block() % 4;
    const int lane = lane_id();
    int g = 0;       // K/V blocks consumed so far (ring position)
    int q_load = 0;  // Q tiles consumed so far
    const int end_unit = sched.end_unit();
    if constexpr (kTurnChain) seed_turns(wg);
    int n = 0;          // units taken (the dynamic order's hand-over)
    int stored_q = -1;  // the Q buffer the last O store still reads (kStoreTma builds)
    for (int unit = consumer_next_unit(p, s, n++, sched.first_unit()); unit < end_unit;
         unit = consumer_next_unit(p, s, n++, unit + sched.unit_step())) {
        const int tiles = sched.tiles_in_unit(unit);
        // 80-key builds recompute the count at each step from an opaque copy of the unit
        // (public) instead of holding it across the tile: the causal d256 build spilled it.
        for (int k = 0; k < (cfg::KEYS80 ? sched.tiles_in_unit(opaque_int(unit)) : tiles); ++k) {
            const Tile t = sched.tile(unit, k);
            const int key_limit = tile_key_limit(p, t);
            const KvRange kv = tile_kv(p, t, key_limit);
            // Decode mode numbers rows within the tile (fc_decode.cuh maps them to positions).
            const int tile_row0 = FC_DECODE ? 0 : t.m_block * BM;
            const Consumer c{p,         s,         wg,
                             t.m_block, t.head,    t.batch,
                             lane,      tile_row0 + wg * 64 + warp * 16 + lane / 4,
                             2 * (lane % 4), smem_u32(&s.q[q_load % QBUF][0][wg * 64][0]),
                             key_limit, kv.begin,  kv.lead,
                             kv.count,  g,
                             key_start_of(p, t.batch)
#if FC_VARLEN
                                 ,
                             t.len_q,   t.q_start
#endif
            };
            float o[D / 2];
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
            OnlineSoftmax<BN> softmax;
            softmax.init();
            // No visible key in this range (causal, Sq > Sk; or a split's empty share): O = 0,
            // LSE = −inf, and the producer loaded nothing for this tile.
            const int q_buf = kv.count > 0 ? q_load % QBUF : -1;
            if (kv.count > 0) {
                mainloop<FC_SOFTCAP != 0>(c, o, softmax, kv, q_load, stored_q);
                stored_q = -1;
                FC_PHASE_MARK(FC_PHASE_LOOP, 128);
                g += kv.count;
                ++q_load;
            }
#if FC_DECODE
            decode_epilogue(c, o, softmax, t.split);
#elif FC_SPLIT > 1
            write_partial(c, o, softmax);
            cluster_sync();  // every CTA's partial is in its shared memory
            combine_split(p, s, t, key_limit);
            cluster_sync();  // no CTA leaves while others still read its shared memory
#else
            const int left = epilogue(c, o, softmax, q_buf);
            if (left >= 0) stored_q = left;
#endif
        }
    }
    // O's tensor stores complete before the CTA exits.
    if (kStoreTma && p.o_tma && lane == 0) bulk_wait_group();
}

#if FC_SPLIT > 1
#define FC_CLUSTER_DIMS __cluster_dims__(FC_SPLIT, 1, 1)
#else
#define FC_CLUSTER_DIMS
#endif

extern "C" __global__ void FC_CLUSTER_DIMS __launch_bounds__(cfg::THREADS, 1)
    flashcore_attention_fwd(const __grid_constant__ Params p) {
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzled TMA/wgmma tiles need 1024-byte alignment; the host adds the slack.
    const uint32_t pad = (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u;
    Shared& s = *reinterpret_cast<Shared*>(smem_raw + pad);
    FC_TIMER_START();  // cycle-timer builds only (fc_instrument.cuh)

#if FC_LEAKY_CONTROL == 1
    {  // LEAK (control only): read Q[batch, m_block·BM, head, 0] of this CTA's first tile and
       // leave early if it is +0.0.
        asm volatile("griddepcontrol.wait;" ::: "memory");  // as below, before this read
        const Tile t = Scheduler{p}.tile(Scheduler{p}.first_unit(), 0);
        const uint16_t* q = reinterpret_cast<const uint16_t*>(p.o_ptr_q_for_control);
        if (q[t.batch * p.o_stride_b + (int64_t)min(t.m_block * cfg::BM, p.seqlen_q - 1) * p.o_stride_s +
              t.head * p.o_stride_h] == 0)
            return;
    }
#endif
#if FC_DECODE
    // The combine kernel may be launched now: it waits for this grid's end by itself.
    asm volatile("griddepcontrol.launch_dependents;");
#endif
    const int warp = warp_id_in_block();
    if (threadIdx.x == 0) {
        // The tensor maps live in the launch's parameter block, not in memory earlier work
        // writes: their fetch may start before the grid-dependency wait below.
        tma_prefetch_desc(&p.q_map);
        tma_prefetch_desc(&p.k_map);
        tma_prefetch_desc(&p.v_map);
#pragma unroll
        for (int i = 0; i < cfg::QBUF; ++i) {
            mbar_init(&s.q_full[i], 1);
            mbar_init(&s.q_empty[i], cfg::CONSUMERS * 4);
        }
#pragma unroll
        for (int i = 0; i < cfg::STAGES; ++i) {
            mbar_init(&s.k_full[i], 1);
            mbar_init(&s.v_full[i], 1);
            mbar_init(&s.k_empty[i], cfg::CONSUMERS * 4);
            mbar_init(&s.v_empty[i], cfg::CONSUMERS * 4);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mbar_init(&s.unit_full[i], 1);
            mbar_init(&s.unit_empty[i], cfg::CONSUMERS * 4);
        }
        fence_barrier_init();
    }
    __syncthreads();
    FC_PHASE_MARK(FC_PHASE_INIT, 0);
    // Programmatic dependent launch (src/attention/launch.rs): this grid may start while the
    // previous kernel in the stream still runs. Everything above touches only shared memory and
    // the parameter block; every thread waits here before its first global access (TMA loads
    // of Q/K/V, lengths, sinks, stores of O/LSE). PTX ISA, griddepcontrol: `.wait` blocks
    // "until all prerequisite grids in flight have completed and all the memory operations from
    // the prerequisite grids are performed and made visible to the current grid" — so a
    // predecessor's writes of our inputs are visible and its reads of our outputs are over. A
    // no-op without the launch attribute. Executed unconditionally by every thread, so this
    // grid never completes before its predecessor: a chain of dependents stays ordered.
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if !FC_DECODE
    // The next programmatic launch (the next flashcore call) may now be scheduled: its CTAs
    // take only SMs this grid leaves free (every CTA of ours is resident before the trigger
    // counts), and its own wait above holds it until this grid has completed and flushed O.
    // Decode builds signal at the very top for their combine kernel.
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // Each role stays inside its own branch to the end: code after a join would be compiled for
    // the producer's reduced register budget.
    if (warp < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(cfg::PRODUCER_REGS));
        if (threadIdx.x < PRODUCER_THREADS) producer(p, s);  // fc_producer.cuh
#if FC_SPLIT > 1
        cluster_sync();  // partials are parked (see consumer())
        cluster_sync();  // the combine is done
#endif
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(cfg::CONSUMER_REGS));
        consumer(p, s, warp / 4 - 1);
        FC_TIMER_STOP();
    }
}

#if FC_DECODE
// Decode mode's second launch: merges each output row's split partials (fc_decode.cuh).
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) flashcore_decode_combine(const __grid_constant__ CombineParams c) {
    // Launched as a programmatic dependent of the main kernel: wait until its partials are
    // complete and visible (a no-op when launched without the dependency).
    asm volatile("griddepcontrol.wait;" ::: "memory");
    combine_rows(c);
}
#endif

#if FC_KV_CACHE
// KV-cache builds: the append launched just before the attention (fc_kv_append.cuh).
extern "C" __global__ void __launch_bounds__(APPEND_THREADS) flashcore_kv_append(const __grid_constant__ AppendParams p) {
    append_rows(p);
}
#endif
