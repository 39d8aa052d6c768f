// A consumer warpgroup: 64 query rows of the tile. S = Q Kᵀ and O += P V on wgmma, the online
// softmax in fp32 registers between them, software-pipelined inside the warpgroup: while the
// tensor cores compute O += P_{j−1} V_{j−1}, the warpgroup already runs the softmax of S_j
// (FA3's intra-warpgroup overlap). Every wait and branch depends on block indices only.
#pragma once
#include "fc_scheduler.cuh"
#include "fc_mbarrier.cuh"
#include "fc_wgmma.cuh"
#include "fc_wgmma_keys.cuh"
#include "fc_softmax.cuh"
#include "fc_instrument.cuh"

// Two schedule choices that cost registers, per build. The turn chain across tiles
// (Consumer::pass_turn): at d256 with varlen or softcap fields beside the 128-register O it
// spilled (PERF_NOTES, fwd39), so those builds re-seed the chain at each tile. The second masked
// loop for tiles without a lower bound (mainloop): not in secret-length or decode builds (their
// lower bound is secret or always present), nor in softcap or d256 builds (it spilled there).
constexpr bool kTurnChain = !(cfg::D > 128 && (FC_VARLEN || FC_SOFTCAP));
constexpr bool kMaskSplit = !FC_SECRET_LEN && !FC_DECODE && !FC_SOFTCAP && cfg::D <= 128;
// Builds whose epilogue may stage O in the tile's own Q rows and store it with TMA
// (fc_epilogue.cuh): prefill tiles (dense or varlen) with two Q buffers (the next tile's Q
// loads into the other one, so this one can wait for the store) and 128-byte rows. At runtime
// p.o_tma decides (O 16-byte aligned); the tile then keeps its Q buffer until the store has read
// it. Not in varlen softcap builds: at d128 the staging spilled there.
constexpr bool kStoreTma =
    !FC_DECODE && !(FC_VARLEN && FC_SOFTCAP) && cfg::SPLIT == 1 && cfg::QBUF == 2 && cfg::SW_ELEMS == 64;

// One consumer warpgroup's view of one tile.
struct Consumer {
    const Params& p;
    Shared& s;
    int wg, m_block, head, batch;
    int lane, row0, col0;
    uint32_t q_base;
    int key_limit;  // keys at or past this are masked: Sk, or the (secret) true length
    int kv_begin;   // first K/V block of this CTA's range (split mode, a window's left edge), else 0
    int kv_lead;    // blocks masked by a window's left edge, visited last (kv_block)
    int kv_count;   // blocks in the range
    int g0;         // ring position of this tile's first K/V block
    int key_start;  // KV-cache builds: keys before this are masked (left padding), else 0
#if FC_VARLEN
    int seqlen_q;   // the tile's sequence's query count (rows at or past it are not stored)
    int q_start;    // its first token in packed Q / O
#endif

    // S = Q Kᵀ over the head dim, 16 at a time (32 bytes inside a swizzled row; STEPS per row).
    FC_DEVICE void issue_qk(float (&sacc)[cfg::BN / 2], int stage) const {
        using namespace cfg;
        constexpr int STEPS = SW_ELEMS / 16;
        const uint32_t k_base = smem_u32(&s.k[stage][0][0][0]);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            const uint32_t kin = (kk % STEPS) * 32;
            const uint64_t da =
                wgmma_desc_rows<ROW_BYTES>(q_base + (kk / STEPS) * (BM * ROW_BYTES) + kin, 16, GROUP_BYTES);
            const uint64_t db =
                wgmma_desc_rows<ROW_BYTES>(k_base + (kk / STEPS) * (BN * ROW_BYTES) + kin, 16, GROUP_BYTES);
            Mma<BN>::ss(sacc, da, db, kk > 0);
        }
    }

    // O += P V; V is [keys][dim] in shared memory, i.e. B with the N (dim) index contiguous.
    FC_DEVICE void issue_pv(float (&o)[cfg::D / 2], const uint32_t (&pf)[cfg::BN / 16][4], int stage) const {
        using namespace cfg;
        const uint32_t v_base = smem_u32(&s.v[stage][0][0][0]);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            // MN-major: LBO steps to the next swizzle atom along the head dim, SBO to the next 8 keys.
            const uint64_t db = wgmma_desc_rows<ROW_BYTES>(v_base + kk * 16 * ROW_BYTES, BN * ROW_BYTES, GROUP_BYTES);
            Mma<D>::rs_tb(o, pf[kk], db, 1);
        }
    }

#if FC_DECODE
    // Decode mode: the query position of this thread's row half h (rows are position-major,
    // `pack` heads per position; row0 is the row within the tile).
    FC_DEVICE int qpos(int h) const { return m_block * qrows_per_tile(p) + ((row0 + 8 * h) >> p.pack_shift); }
#endif

    // The K/V block of main-loop step `it` (fc_scheduler.cuh's kv_block).
    FC_DEVICE int block_of(int it) const {
        if (!kLeftSkip) return kv_begin + it;
        int rel = it + kv_lead;
        rel = rel >= kv_count ? rel - kv_count : rel;
        return kv_begin + rel;
    }

    // Softcap on raw scores (p.softcap_in/out fold the softmax scale in): the logit becomes
    // cap · tanh(scale · s / cap) while the softmax keeps working in raw-score units.
    FC_DEVICE void softcap(float (&sacc)[cfg::BN / 2]) const {
#pragma unroll
        for (int i = 0; i < cfg::BN / 2; ++i) sacc[i] = p.softcap_out * fast_tanh(sacc[i] * p.softcap_in);
    }

    // Whether any row's visible keys start after key 0 (a window's left edge, a KV cache's left
    // padding): public. Without one, the mask needs only each row's upper bound.
    FC_DEVICE bool has_lower_bound() const {
        bool lower = p.window_left < p.seqlen_k;  // unbounded windows come as Sq + Sk
#if FC_KV_CACHE
        lower = lower || p.starts_ptr != 0;
#endif
        return lower;
    }

    // Out-of-range keys and keys outside the window (causal: right of the diagonal) become −inf,
    // by select. kLower = false: the caller knows has_lower_bound() is false, so each score is
    // one compare against its row's upper bound.
    template <bool kLower = true>
    FC_DEVICE void mask(float (&sacc)[cfg::BN / 2], int n_block) const {
        using namespace cfg;
        // Relative to this thread's first key: keys [0, limit) are in range, and row half h sees
        // keys [diag_h − left, diag_h + right] (its position bottom-right aligned to the keys).
        const int key_base = n_block * BN + col0;
        const int limit = key_limit - key_base;
#if FC_KV_CACHE
        const int start = key_start - key_base;
#endif
#if FC_DECODE
        // The queries are the last Sq positions of the visible keys: bottom-right aligned to
        // the sequence's own key count (KV-cache mode: its length, secret), else to Sk.
        const int diag_h[2] = {qpos(0) + key_limit - p.seqlen_q - key_base,
                               qpos(1) + key_limit - p.seqlen_q - key_base};
#elif FC_VARLEN
        // Bottom-right aligned per sequence: its own key and query counts.
        const int diag_h[2] = {row0 + key_limit - seqlen_q - key_base, row0 + 8 + key_limit - seqlen_q - key_base};
#else
        const int diag_h[2] = {row0 + p.seqlen_k - p.seqlen_q - key_base, row0 + 8 + p.seqlen_k - p.seqlen_q - key_base};
#endif
#if FC_DECODE
        // Decode builds keep the window test as compare, subtract and unsigned compare: with the
        // interval form below, ptxas's register reuse cost the paged causal d64 builds the
        // audit's proof that the block table is read through public offsets (fail-safe findings).
        // Inside the window iff 0 <= key − lo <= width (width = left + right < 2^31, both clamped
        // by the host).
        const int lo_d[2] = {diag_h[0] - p.window_left, diag_h[1] - p.window_left};
        const uint32_t width = (uint32_t)(p.window_left + window_right_of(p));
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int key = 8 * (i / 4) + (i % 2);
            const int h = (i / 2) % 2;
            bool visible = key < limit && (uint32_t)(key - lo_d[h]) <= width;
#if FC_KV_CACHE
            visible = visible && key >= start;
#endif
            sacc[i] = select_f(visible, sacc[i], neg_inf());
        }
#else
        // Row half h sees keys [lo_h, hi_h): the window's edges (left, right ≤ Sq + Sk, clamped
        // by the host, so no sum overflows) and the range's end folded into one interval per row,
        // so each score costs two compares against constants (one without a lower bound).
        int lo_h[2], hi_h[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            lo_h[h] = diag_h[h] - p.window_left;
            hi_h[h] = min(limit, diag_h[h] + window_right_of(p) + 1);
        }
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
            const int key = 8 * (i / 4) + (i % 2);
            const int h = (i / 2) % 2;
            const bool visible = (!kLower || key >= lo_h[h]) && key < hi_h[h];
            sacc[i] = select_f(visible, sacc[i], neg_inf());
        }
#endif
    }

#if FC_KV_CACHE || FC_VARLEN
    // V rows of keys outside [key_start, key_limit) hold whatever the buffer holds there: a KV
    // cache's unused rows may be uninitialised (NaN or Inf bits), and P = 0 does not cancel them
    // (0 · NaN = NaN in P V). So they become zeros in shared memory before this warpgroup's P V
    // reads the stage. With public counts only a block that crosses the count does it (a branch
    // on public values), or every block when left padding is given (starts are masked by select,
    // never branched on); with secret counts every block, every row by select. Addresses depend
    // on the block only. Each consumer warpgroup clears the rows itself: a concurrent reader
    // sees the same bits either way, and the stage is refilled only after every warpgroup
    // released it.
    FC_DEVICE void clear_dead_v(int stage, int n_block) const {
        using namespace cfg;
        const int lo = n_block * BN;
#if !FC_SECRET_LEN
        bool crosses = lo + BN > key_limit;
#if FC_KV_CACHE
        crosses = crosses || p.starts_ptr != 0;
#endif
        if (!crosses) return;
#endif
        constexpr int VEC_PER_ROW = ROW_BYTES / 16;
        constexpr int VECS = CHUNKS * BN * VEC_PER_ROW;
        static_assert(VECS % 128 == 0, "whole vectors per thread");
        const uint32_t base = smem_u32(&s.v[stage][0][0][0]);
        const int t = threadIdx.x % 128;
        // The unrolling is chosen per build kind by the audit: with the other choices ptxas's
        // register assignment around the epilogue's LSE store lost the audit's provenance of the
        // metadata buffers (block table, counts) — fail-safe findings, though no address derives
        // from them here — or spilled (d256 varlen). Loop for public counts, 4 for secret counts
        // with a softcap, in full for other secret-count and varlen builds.
#if FC_SECRET_LEN && FC_SOFTCAP
#pragma unroll 4
#elif FC_SECRET_LEN || FC_VARLEN
#pragma unroll
#else
#pragma unroll 1
#endif
        for (int k = 0; k < VECS / 128; ++k) {
            const int i = t + 128 * k;
            const int key = lo + (i / VEC_PER_ROW) % BN;
            const bool live = key < key_limit && key >= key_start;
            // Every row is loaded and stored back (asm volatile: the compiler may not turn the
            // store of a live row's own bits into a store guarded by the secret `live`).
            uint32_t v[4];
            ld_shared_v4(base + 16 * i, v);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = live ? v[j] : 0u;
            st_shared_v4(base + 16 * i, v);
        }
        fence_proxy_async_smem();  // the generic stores, before the async proxy's reads
        named_bar_sync(1 + CONSUMERS + wg, 128);
    }
#else
    FC_DEVICE void clear_dead_v(int, int) const {}
#endif

    // P (fp32 accumulators) → 16-bit A fragments: k-slice kk is accumulator columns 16kk..16kk+15.
    FC_DEVICE static void to_fragments(const float (&sacc)[cfg::BN / 2], uint32_t (&pf)[cfg::BN / 16][4]) {
#pragma unroll
        for (int kk = 0; kk < cfg::BN / 16; ++kk) {
#pragma unroll
            for (int r = 0; r < 4; ++r) pf[kk][r] = pack_elem2(sacc[8 * kk + 2 * r], sacc[8 * kk + 2 * r + 1]);
        }
    }

    // Ping-pong between the consumer warpgroups: a warpgroup issues its GEMMs only on its turn and
    // then hands the turn over, so its softmax runs while the other's GEMMs occupy the tensor
    // cores. Turns go round-robin 0, 1, …, CONSUMERS−1; barrier 1+w is warpgroup w's turn. The
    // chain runs on across tiles (seeded once per CTA, seed_turns): every warpgroup takes one
    // turn per K/V block of the tile, the same count for all of them, so the last warpgroup's
    // final turn of a tile hands warpgroup 0 the first turn of the next. Warpgroup 0 then starts
    // the next tile's Q Kᵀ while the others still finish this tile's softmax and epilogue,
    // instead of waiting for the last one's epilogue. The turn count depends on block counts only.
    // Builds with kTurnChain false re-seed the chain at each tile instead (the last warpgroup's
    // final hand-over of a tile is dropped).
    // A single consumer warpgroup (light short-sequence tiles) has no one to take turns with.
    FC_DEVICE void wait_turn() const {
        if constexpr (cfg::CONSUMERS > 1) named_bar_sync(1 + wg, 256);
    }
    FC_DEVICE void pass_turn(bool last) const {
        // With the chain, after the CTA's last tile the final hand-over has no taker: a bar.arrive
        // that nothing waits for, harmless at exit.
        if constexpr (cfg::CONSUMERS > 1) {
            if (kTurnChain || !(wg == cfg::CONSUMERS - 1 && last)) named_bar_arrive(1 + (wg + 1) % cfg::CONSUMERS, 256);
        }
    }

    FC_DEVICE void release(uint64_t* bar) const {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    }

    // The Q buffer the previous tile's O left through (kStoreTma builds; −1: none): released once
    // that TMA store has read it. Called after this tile's first Q Kᵀ is issued, so the store's
    // read overlaps the tile boundary instead of holding the warp in the epilogue; the producer
    // needs the buffer only for the tile after this one.
    FC_DEVICE void release_stored_q(int buf) const {
        if (buf < 0) return;  // public: the previous tile's path
        if (lane == 0) bulk_wait_group_read();
        release(&s.q_empty[buf]);
    }

    // One main-loop step for block `it`: issue S_it = Q K_itᵀ and O += P_{it-1} V_{it-1}; run the
    // softmax of S_it while the PV GEMM is still on the tensor cores; then rescale O.
    // kMask: 0 no mask, 1 the row's upper bound only (no lower bound: has_lower_bound() is
    // false), 2 both bounds.
    template <int kMask, bool kCap>
    FC_DEVICE void iteration(int it, int n_blocks, float (&sacc)[cfg::BN / 2], uint32_t (&pf)[cfg::BN / 16][4],
                             float (&o)[cfg::D / 2], OnlineSoftmax<cfg::BN>& softmax) const {
        using namespace cfg;
        const int stage = ring_stage(g0 + it);
        const uint32_t phase = ring_phase(g0 + it);
        const int prev = ring_stage(g0 + it - 1);
        const uint32_t prev_phase = ring_phase(g0 + it - 1);

        mbar_wait(&s.k_full[stage], phase);
        mbar_wait(&s.v_full[prev], prev_phase);
        clear_dead_v(prev, block_of(it - 1));
        wait_turn();
        wgmma_fence();
        issue_qk(sacc, stage);
        wgmma_commit();
        issue_pv(o, pf, prev);
        wgmma_commit();
        pass_turn(it == n_blocks - 1);

        wgmma_wait<1>();  // S_it is ready; P_{it-1} V_{it-1} may still run
        fence_regs(sacc);
        FC_FLOOR_SCORES(sacc, g0 + it);  // floor control only (fc_instrument.cuh)
        release(&s.k_empty[stage]);
        if constexpr (kCap) softcap(sacc);
        if constexpr (kMask != 0) mask<kMask == 2>(sacc, block_of(it));
        float alpha[2];
        softmax.step(sacc, p.scale_log2, alpha);
        fence_regs(sacc);
        // Anchor: a shared-memory store of the softmax's last result. The wait below is ordered
        // after it, so ptxas cannot schedule the wait (and stall on the PV GEMM) before the
        // softmax — which is what lets the softmax overlap the PV GEMM.
        asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(&s.anchor[threadIdx.x - 128])), "f"(softmax.row_sum[1])
                     : "memory");

        wgmma_wait<0>();
        fence_regs(o);
        fence_frags(pf);
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i / 2) % 2];
        to_fragments(sacc, pf);
        // Released only now: an mbarrier arrive right after the wait is a memory operation that
        // ptxas schedules early, dragging the wait (and so the PV GEMM's completion) in front of
        // the softmax above and serialising the two.
        release(&s.v_empty[prev]);
    }
};

// Gives warpgroup 0 the first turn: once per CTA with the chain across tiles (before the first
// tile), else at the start of every tile (mainloop).
FC_DEVICE void seed_turns(int wg) {
    if (cfg::CONSUMERS > 1 && wg == cfg::CONSUMERS - 1) named_bar_arrive(1, 256);
}

// The tile's main loop: block 0 (S, softmax), then unmasked and masked blocks, then the last
// P V. `q_load` counts the Q tiles this CTA loaded before this one (the q_full parity);
// `stored_q`: the Q buffer the previous tile's O store still holds (−1: none). kCap: softcap the
// scores (FC_SOFTCAP builds).
template <bool kCap>
FC_DEVICE void mainloop(const Consumer& c, float (&o)[cfg::D / 2], OnlineSoftmax<cfg::BN>& softmax, KvRange kv,
                        int q_load, int stored_q) {
    using namespace cfg;
    const int n_blocks = kv.count;
    const int wg = c.wg;
    Shared& s = c.s;
    const Params& p = c.p;
    FC_PHASE_MARK(FC_PHASE_BEGIN, 128);
    mbar_wait(&s.q_full[q_load % QBUF], (q_load / QBUF) & 1);
    FC_PHASE_MARK(FC_PHASE_Q, 128);

    float sacc[BN / 2];
    uint32_t pf[BN / 16][4];
    float alpha[2];  // block 0: O is still zero, nothing to rescale

    // Block 0: S, softmax, fragments.
    if constexpr (!kTurnChain) seed_turns(wg);
    const int stage0 = ring_stage(c.g0);
    mbar_wait(&s.k_full[stage0], ring_phase(c.g0));
    c.wait_turn();
    wgmma_fence();
    c.issue_qk(sacc, stage0);
    wgmma_commit();
    c.pass_turn(n_blocks == 1);
    if constexpr (kStoreTma) c.release_stored_q(stored_q);
    wgmma_wait<0>();
    fence_regs(sacc);
    FC_PHASE_MARK(FC_PHASE_S0, 128);
    FC_FLOOR_SCORES(sacc, c.g0);  // floor control only (fc_instrument.cuh)
    c.release(&s.k_empty[stage0]);
    if constexpr (kCap) c.softcap(sacc);
    if (kv.first_masked == 0) c.mask(sacc, c.block_of(0));
    softmax.step(sacc, p.scale_log2, alpha);
    Consumer::to_fragments(sacc, pf);

    const int first_masked = kv.first_masked;
    int it = 1;
    for (; it < first_masked; ++it) c.iteration<0, kCap>(it, n_blocks, sacc, pf, o, softmax);
    // A public choice between two straight-line loops (no branch inside one: ptxas would wait for
    // the in-flight wgmma at the join). Builds whose lower bound is secret or always present
    // (secret lengths, decode's KV-cache builds) keep one loop.
    if (kMaskSplit && !c.has_lower_bound()) {
        for (; it < n_blocks; ++it) c.iteration<1, kCap>(it, n_blocks, sacc, pf, o, softmax);
    } else {
        for (; it < n_blocks; ++it) c.iteration<2, kCap>(it, n_blocks, sacc, pf, o, softmax);
    }

    // Every Q Kᵀ of this tile is complete (the last iteration waited for all GEMMs): the producer
    // may load the next tile's Q while this warpgroup finishes the last P V and the epilogue —
    // unless the epilogue stages O in these rows (it releases them itself).
    if (!(kStoreTma && p.o_tma)) c.release(&s.q_empty[q_load % QBUF]);

    const int last = ring_stage(c.g0 + n_blocks - 1);
    mbar_wait(&s.v_full[last], ring_phase(c.g0 + n_blocks - 1));
    c.clear_dead_v(last, c.block_of(n_blocks - 1));
    wgmma_fence();
    c.issue_pv(o, pf, last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    c.release(&s.v_empty[last]);
}
