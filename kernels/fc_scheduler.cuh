// Which query tiles a CTA computes, and which K/V blocks each tile visits. Everything here is a
// function of public shapes and block indices only (DESIGN.md §1): no atomics, no data.
//
// Persistent grid: CTA b takes work units b, b + gridDim.x, b + 2·gridDim.x, … A unit is one
// query tile, or — causal, when there is more than one wave of tiles — the pair (heavy, light) =
// (m_blocks−1−j, j) of one (batch, head), whose key ranges add up to about the same length for
// every j, so a static round-robin keeps the SMs evenly loaded. Units are numbered head-major
// within a batch, so the CTAs running at any moment share K/V in L2 (PERF_NOTES step 5).
// The order never changes what a tile computes: output bits stay batch-invariant.
#pragma once
#include "fc_config.cuh"
#include "fc_mbarrier.cuh"

#if FC_VARLEN
// The varlen work list, written before each launch (src/attention/launch/varlen.rs: a
// stream-ordered copy from the host's list, or from the device-built one of
// fc_varlen_build.cuh). Entry 0 is the launch's header — x: how many work items follow (at most
// VARLEN_ITEMS); entries 1.. are the items, one int4 per query tile — (first query token of the
// tile, query rows of the sequence from there on, the sequence's first key token, its key
// count). Public metadata derived from cu_seqlens, in constant memory: read at a public index
// (the unit), it is public to the audit by construction, and no register ever holds a pointer
// to it. The host launches for a bound on the item count (it need not know the count itself:
// no synchronisation), and units past the header's count end the walk.
constexpr int VARLEN_SLOTS = 4096;  // int4 entries: 64 KiB, all of constant memory
constexpr int VARLEN_ITEMS = VARLEN_SLOTS - 1;
__constant__ int4 fc_varlen_work[VARLEN_SLOTS];
#endif

struct Tile {
    int m_block, head, batch;
    int split;  // decode mode: which share of the key range (fc_decode.cuh); else 0
#if FC_VARLEN
    // The tile as a sequence of its own (public work-list values): its first query token, the
    // sequence's query rows from there on (bottom-right causal alignment only needs those), the
    // sequence's first key token and key count. m_block and batch are 0.
    int q_start, len_q, k_start, len_k;
#endif
};

// Query rows of the tile's sequence: Sq, or a varlen sequence's own count.
FC_DEVICE int tile_seqlen_q(const Params& p, const Tile& t) {
#if FC_VARLEN
    return t.len_q;
#else
    return p.seqlen_q;
#endif
}

// Query positions per tile: BM, or in decode mode BM / pack (each position's `pack` heads are
// rows of the same tile).
FC_DEVICE int qrows_per_tile(const Params& p) { return FC_DECODE ? cfg::BM / p.pack : cfg::BM; }

// The K/V blocks one CTA visits: [begin, begin + count), and the first of them (relative) that
// needs element masks. Public: shapes, block indices and the cluster rank only.
struct KvRange {
    int begin, count, first_masked;
    int lead;  // blocks masked by a window's left edge, visited last (kv_block)
};

// Builds that may take their units in the dynamic order (FC_DYN_ORDER: causal dense prefill
// builds the host's table picks — Variant::dynamic_order; the host passes a counter only for
// shapes with more tile pairs than SMs and at least 8 query tiles per head).
#ifndef FC_DYN_ORDER
#define FC_DYN_ORDER 0
#endif
static_assert(!FC_DYN_ORDER || (!FC_DECODE && !FC_VARLEN && FC_SPLIT == 1), "dense prefill only");
constexpr bool kDynamicOrder = FC_DYN_ORDER != 0;

// Tile coordinates by fast_div, except in the d256 softcap builds: there the multipliers' live
// registers beside the 128-register O made ptxas spill (the audit's gate), where the integer
// divisions did not.
constexpr bool kFastTileDiv = !(cfg::D > 128 && FC_SOFTCAP);

// Only dense causal builds pair tiles (the host's Schedule; varlen units are one tile): one tile
// per unit elsewhere, known at compile time, so no tile count stays live across the tile's loop
// (the d256 80-key builds and the varlen TMA-store builds spilled it). Not in the dense d256
// softcap builds, whose register assignment spilled with the shorter code.
constexpr bool kOneTilePerUnit = FC_DECODE || FC_VARLEN || (!FC_CAUSAL && !(cfg::D > 128 && FC_SOFTCAP));

struct Scheduler {
    const Params& p;

    // Units of this CTA: first, step, end (split mode: one unit per cluster).
    FC_DEVICE int first_unit() const { return cfg::SPLIT > 1 ? (int)blockIdx.x / cfg::SPLIT : (int)blockIdx.x; }
    FC_DEVICE int unit_step() const { return cfg::SPLIT > 1 ? p.num_units : (int)gridDim.x; }
    // One past the last unit: p.num_units, or in varlen builds the units of the header's item
    // count (public) when fewer — the host's bound may exceed the items the device built.
    FC_DEVICE int end_unit() const {
#if FC_VARLEN
        return min(p.num_units, max(0, min(VARLEN_ITEMS, fc_varlen_work[0].x)) * p.heads_q);
#else
        return p.num_units;
#endif
    }

    FC_DEVICE int tiles_in_unit(int unit) const {
        if (kOneTilePerUnit || !p.pair_tiles) return 1;
        const int j = kFastTileDiv ? unit - fast_div(unit, p.units_per_head_mul, p.units_per_head_shift) * p.units_per_head
                                   : unit % p.units_per_head;
        return (p.num_m_blocks - 1 - j) == j ? 1 : 2;  // odd tile count: the middle tile is alone
    }

    // Tile `k` (0 or 1) of `unit`. Causal tiles come heaviest first (the last query blocks see the
    // most keys).
    FC_DEVICE Tile tile(int unit, int k) const {
        Tile t;
        t.split = 0;
#if FC_DECODE
        // Decode: unit = split · (tiles) + (batch · packs + pack) · m_blocks + m_block,
        // split-major, so the CTAs running at once read the same key range of neighbouring heads
        // and sequences (in [B, S, H, D] K/V, neighbouring heads' rows share DRAM pages).
        // Unit-major order (a tile's splits side by side) read 17% more from DRAM at d64
        // (PERF_NOTES step 20).
        const int tiles = p.num_units / p.num_splits;
        t.split = unit / tiles;
        int r = unit % tiles;
        t.m_block = r % p.num_m_blocks;
        r /= p.num_m_blocks;
        const int packs = p.heads_q / p.pack;
        t.head = (r % packs) * p.pack;  // the pack's first query head
        t.batch = r / packs;
        return t;
#endif
#if FC_VARLEN
        // Varlen: unit = item · heads + head; item i is entry 1 + i of the work list (sequence
        // by sequence, heaviest first; entry 0 is the header).
        const int per_head = fast_div(unit, p.heads_q_mul, p.heads_q_shift);
        const int item = 1 + per_head;
        t.head = unit - per_head * p.heads_q;
        t.batch = 0;
        t.m_block = 0;
        const int4 w = fc_varlen_work[item];
        t.q_start = w.x;
        t.len_q = w.y;
        t.k_start = w.z;
        t.len_k = w.w;
        return t;
#endif
        if (kDynamicOrder && p.section_heads != 0) {  // the dynamic order (public: a parameter)
            // Sections of section_heads (batch, head) pairs; inside one, tiles heaviest first
            // (the last query block first), the section's heads side by side: the CTAs running
            // at once share a few heads' K/V in L2, and the light tiles come last.
            const int sec_units = p.section_heads * p.num_m_blocks;
            const int sec = fast_div(unit, p.section_units_mul, p.section_units_shift);
            const int r = unit - sec * sec_units;
            const int rank = fast_div(r, p.section_heads_mul, p.section_heads_shift);
            const int hb = sec * p.section_heads + (r - rank * p.section_heads);
            t.m_block = p.num_m_blocks - 1 - rank;
            t.batch = fast_div(hb, p.heads_q_mul, p.heads_q_shift);
            t.head = hb - t.batch * p.heads_q;
            return t;
        }
        // Multiply-high and shift (fast_div), not integer divisions: every warp runs this per tile.
        if constexpr (!kFastTileDiv) {
            const int hb = unit / p.units_per_head;
            t.head = hb % p.heads_q;
            t.batch = hb / p.heads_q;
            const int j = unit % p.units_per_head;
            t.m_block = p.pair_tiles ? (k == 0 ? p.num_m_blocks - 1 - j : j) : (FC_CAUSAL ? p.num_m_blocks - 1 - j : j);
            return t;
        }
        const int hb = fast_div(unit, p.units_per_head_mul, p.units_per_head_shift);
        const int j = unit - hb * p.units_per_head;
        t.batch = fast_div(hb, p.heads_q_mul, p.heads_q_shift);
        t.head = hb - t.batch * p.heads_q;
        if (p.pair_tiles) {
            t.m_block = k == 0 ? p.num_m_blocks - 1 - j : j;
        } else {
            t.m_block = FC_CAUSAL ? p.num_m_blocks - 1 - j : j;
        }
        return t;
    }
};

// One thread's ticket: an increment that wraps at 2^31 − 1 (never reached: a launch takes
// fewer tickets). Not an add: ptxas turns an add of a constant (or an increment without a wrap)
// into a warp-aggregated atomic whose result goes round the warp by a shuffle, which the audit's
// provenance analysis cannot tell from the pointer the same register held on other lanes.
FC_DEVICE uint32_t atom_ticket(uint64_t addr) {
    uint32_t r;
    asm volatile("atom.global.inc.u32 %0, [%1], %2;" : "=r"(r) : "l"(addr), "r"(0x7fffffffu) : "memory");
    return r;
}
// The same on the second word (the CTAs done), addressed as an offset of the counter's pointer.
FC_DEVICE uint32_t atom_ticket_done(uint64_t addr) {
    uint32_t r;
    asm volatile("atom.global.inc.u32 %0, [%1+4], %2;" : "=r"(r) : "l"(addr), "r"(0x7fffffffu) : "memory");
    return r;
}
FC_DEVICE void atom_exch_u32(uint64_t addr, uint32_t v) {
    uint32_t r;
    asm volatile("atom.global.exch.b32 %0, [%1], %2;" : "=r"(r) : "l"(addr), "r"(v) : "memory");
}

// The dynamic order's hand-over (p.section_heads != 0; causal prefill, no cluster split). The
// producer thread takes each next unit from the launch's counter (an atomic add: which CTA gets
// which tile depends on timing only, never on data, and a tile's bits never depend on its CTA)
// and hands it to the consumer warps through a two-slot ring in shared memory; the unit past the
// end ends everyone's walk. In the static order each role computes its units itself.
// This CTA's hand-over slot `slot` (0, 1) in the counter's buffer, after its two words: global
// memory the audit proves public (written only with tickets, at addresses from the block index),
// where a slot in shared memory would be read as secret (the audit keeps shared memory as one
// cell, and O and the scores pass through it).
FC_DEVICE uint64_t unit_slot_addr(const Params& p, int slot) {
    return p.tile_counter + 8 + (uint64_t)(2 * blockIdx.x + slot) * 4;
}

FC_DEVICE int producer_next_unit(const Params& p, Shared& s, int n, int static_unit, int end_unit) {
    if (!kDynamicOrder || p.section_heads == 0) return static_unit;
    const int u = (int)atom_ticket(p.tile_counter);
    const int slot = n % 2;
    mbar_wait(&s.unit_empty[slot], ((n / 2) & 1) ^ 1);
    asm volatile("st.relaxed.cta.global.u32 [%0], %1;" ::"l"(unit_slot_addr(p, slot)), "r"(u) : "memory");
    mbar_arrive(&s.unit_full[slot]);  // release: the slot's store before the consumers' reads
    // This CTA's last ticket: the launch's last CTA to get here leaves the counter zero for the
    // next launch on it (every CTA has taken its last ticket by then).
    if (u >= end_unit && atom_ticket_done(p.tile_counter) == gridDim.x - 1) {
        atom_exch_u32(p.tile_counter, 0u);
        atom_exch_u32(p.tile_counter + 4, 0u);
    }
    return u;
}

FC_DEVICE int consumer_next_unit(const Params& p, Shared& s, int n, int static_unit) {
    if (!kDynamicOrder || p.section_heads == 0) return static_unit;
    const int slot = n % 2;
    mbar_wait(&s.unit_full[slot], (n / 2) & 1);
    int u;
    asm volatile("ld.relaxed.cta.global.u32 %0, [%1];" : "=r"(u) : "l"(unit_slot_addr(p, slot)) : "memory");
    __syncwarp();
    if (lane_id() == 0) mbar_arrive(&s.unit_empty[slot]);
    return u;
}

// Rows of query tile `m_block` (positions in decode mode): [first, last], clamped to Sq.
FC_DEVICE int tile_first_row(const Params& p, int m_block) { return m_block * qrows_per_tile(p); }
FC_DEVICE int tile_last_row(const Params& p, int m_block, int seqlen_q) {
    return min((m_block + 1) * qrows_per_tile(p), seqlen_q) - 1;
}

// The window's right edge: 0 for causal builds (causal is right = 0), else the public runtime
// value (Sq + Sk when unbounded, so it never clips).
FC_DEVICE int window_right_of(const Params& p) { return FC_CAUSAL ? 0 : p.window_right; }

// One past the last K/V block query tile `m_block` must visit when `keys` keys are walked (Sk;
// in decode mode with public KV-cache counts, the sequence's count). Public: shapes, block index,
// window sizes and public counts only. Bottom-right alignment: row r sees keys up to
// r + (keys − Sq) + right.
FC_DEVICE int num_kv_blocks(const Params& p, int m_block, int keys, int seqlen_q) {
    int n = ceil_div(keys, cfg::BN);
    const int visible = min(keys, tile_last_row(p, m_block, seqlen_q) + keys - seqlen_q + 1 + window_right_of(p));
    n = visible <= 0 ? 0 : min(n, ceil_div(visible, cfg::BN));
    return n;
}

// Whether the window's left edge may skip blocks: it is aligned to the key count, so not when
// that count is secret (decode with secret lengths) or lives in device memory (KV-cache builds:
// a start derived from a count would reach the block-table offsets, which the audit cannot
// prove public). Those builds mask the left edge by select only.
constexpr bool kLeftSkip = !(FC_DECODE && (FC_SECRET_LEN || FC_KV_CACHE));

// The first K/V block any row of the tile sees through the window's left edge (row r sees keys
// from r + keys − Sq − left on): 0 without a window. Public, as num_kv_blocks.
FC_DEVICE int window_first_block(const Params& p, int m_block, int keys, int seqlen_q) {
    if (!kLeftSkip) return 0;
    const int lo = tile_first_row(p, m_block) + keys - seqlen_q - p.window_left;
    return lo <= 0 ? 0 : lo / cfg::BN;
}

// The first K/V block that every row of the tile sees whole through the left edge (the last
// row's edge is the tightest); blocks before it need element masks.
FC_DEVICE int window_clean_block(const Params& p, int m_block, int keys, int seqlen_q) {
    const int lo = tile_last_row(p, m_block, seqlen_q) + keys - seqlen_q - p.window_left;
    return lo <= 0 ? 0 : ceil_div(lo, cfg::BN);
}

// First K/V block that may need element masks on the right: the partial last block, or the first
// block crossing the right edge (causal: the diagonal) of the tile's first row. Every later block
// needs them too, so the main loop runs unmasked blocks, then masked ones, each as straight-line
// code (a branch around the mask inside one loop would make ptxas wait for the in-flight wgmma at
// the join).
FC_DEVICE int first_masked_block(const Params& p, int m_block, int n_blocks, int keys, int seqlen_q) {
    if (FC_SECRET_LEN) return 0;  // the true length is secret: every block is masked
    if (FC_KV_CACHE && p.starts_ptr != 0) return 0;  // left padding: masked wherever it ends
    if (!kLeftSkip && p.window_left < p.seqlen_k) return 0;  // a left edge masked by select only
    int first = keys / cfg::BN;
    // Block n is clean iff its last key (n+1)·BN − 1 <= first row + keys − Sq + right.
    const int limit = tile_first_row(p, m_block) + keys - seqlen_q + 1 + window_right_of(p);
    first = min(first, limit <= 0 ? 0 : limit / cfg::BN);
    return min(first, n_blocks);
}

// Keys at or past this are masked: Sk, or in secret-length mode the batch entry's true length,
// clamped with min/max (ALU selects) so any stored value is safe and nothing branches on it. In
// decode mode with public KV-cache counts (FC_KV_PUBLIC), the sequence's key count, public
// metadata: it also bounds the walk (kv_range).
FC_DEVICE int key_limit_of(const Params& p, int batch) {
    int key_limit = p.seqlen_k;
#if FC_SECRET_LEN || FC_KV_PUBLIC
    key_limit = max(0, min(p.seqlen_k, reinterpret_cast<const int32_t*>(p.lens_ptr)[batch]));
#endif
    return key_limit;
}

// key_limit_of for tile `t`: a varlen tile's sequence's key count (public), else by batch.
FC_DEVICE int tile_key_limit(const Params& p, const Tile& t) {
#if FC_VARLEN
    return t.len_k;
#else
    return key_limit_of(p, t.batch);
#endif
}

// The first key of the batch entry's range (KV-cache builds with starts_ptr: flash-attn's
// cache_leftpad, clamped into [0, Sk]); keys before it are masked by select. 0 otherwise. It
// never shapes the walk: the blocks before it are read and masked, so neither a secret start nor
// a public one reaches a loop bound or an address.
FC_DEVICE int key_start_of(const Params& p, int batch) {
#if FC_KV_CACHE
    if (p.starts_ptr != 0) {
        return max(0, min(p.seqlen_k, reinterpret_cast<const int32_t*>(p.starts_ptr)[batch]));
    }
#endif
    return 0;
}

// This CTA's share of a tile's K/V blocks: all of them, or its split's (a cluster rank's share,
// or in decode mode blocks [split · split_blocks, (split + 1) · split_blocks)). `key_limit` is
// key_limit_of's value; only public counts shape the range.
FC_DEVICE KvRange kv_range(const Params& p, Tile t, int key_limit) {
    const int m_block = t.m_block;
#if FC_KV_PUBLIC || FC_VARLEN
    const int keys = key_limit;  // public: the walk ends at the sequence's own count
#else
    const int keys = p.seqlen_k;
#endif
    const int seqlen_q = tile_seqlen_q(p, t);
    const int n_total = num_kv_blocks(p, m_block, keys, seqlen_q);
#if FC_DECODE
    const int split_rank = t.split;
    // Splits of split_blocks blocks, a function of Sk (a KV cache's capacity) alone: the host's
    // rule. Public counts only end the walk early, so a sequence's bits do not depend on its
    // batch, its neighbours or where its pages live. (Splitting a public count by its own size
    // would feed the metadata into the block-table offsets, which the audit cannot prove.)
    const int per_split = p.split_blocks;
#else
    const int split_rank = cfg::SPLIT > 1 ? (int)blockIdx.x % cfg::SPLIT : 0;
#endif
    // The window's left edge (0 without one): blocks before it are never visited.
    const int n_lo = kLeftSkip ? min(n_total, window_first_block(p, m_block, keys, seqlen_q)) : 0;
    KvRange kv;
#if FC_DECODE
    // The split's first block whatever the count (an empty split has count 0): its K/V
    // addresses — a paged cache's block-table offsets — then never derive from the counts. A
    // window's left edge only moves it in builds whose key count is a parameter (kLeftSkip).
    const int split_first = split_rank * per_split;
    kv.begin = kLeftSkip ? max(split_first, n_lo) : split_first;
    kv.count = max(0, min(n_total, split_first + per_split) - kv.begin);
#else
    const int per_split = ceil_div(n_total - n_lo, cfg::SPLIT);  // the cluster shares the window's blocks
    kv.begin = min(n_total, n_lo + split_rank * per_split);
    kv.count = min(n_total, kv.begin + per_split) - kv.begin;
#endif
    // Visiting order: the clean blocks and those masked on the right first, then the blocks
    // masked by the window's left edge (`lead` of them, rotated to the end), so the masked ones
    // form one run and the main loop keeps its two straight-line loops.
    const int lead = kLeftSkip ? max(0, min(kv.count, window_clean_block(p, m_block, keys, seqlen_q) - kv.begin)) : 0;
    const int right_masked = max(lead, min(kv.count, first_masked_block(p, m_block, n_total, keys, seqlen_q) - kv.begin));
    kv.lead = lead;
    kv.first_masked = right_masked - lead;
    return kv;
}

// The K/V block visited at step `it` of a range (see kv_range's visiting order).
FC_DEVICE int kv_block(const KvRange& kv, int it) {
    if (!kLeftSkip) return kv.begin + it;  // never rotated (lead 0): no count in the index
    int rel = it + kv.lead;
    rel = rel >= kv.count ? rel - kv.count : rel;
    return kv.begin + rel;
}

// The K/V range a tile's producer and consumers agree on. FC_LEAKY_CONTROL == 2 (never shipped;
// the timing test's control) walks only the blocks below the secret true length: a loop bound
// from a secret, exactly what the audit forbids.
FC_DEVICE KvRange tile_kv(const Params& p, Tile t, int key_limit) {
    KvRange kv = kv_range(p, t, key_limit);
#if FC_LEAKY_CONTROL == 2
    kv.count = min(kv.count, ceil_div(key_limit, cfg::BN));
    kv.first_masked = min(kv.first_masked, kv.count);
    kv.lead = 0;
#endif
    return kv;
}

// Stage and parity of the `g`-th K/V block this CTA streams (counted across all its tiles).
FC_DEVICE int ring_stage(int g) { return g % cfg::STAGES; }
FC_DEVICE uint32_t ring_phase(int g) { return (g / cfg::STAGES) & 1; }
