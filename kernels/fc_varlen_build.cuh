// The varlen work list built on the device: from cu_seqlens_q / cu_seqlens_k (and
// seqused_k, seqused_q) in device memory, with no host synchronisation, so a varlen call can be captured in
// a CUDA graph. One CTA counting-sorts the pack's sequences by the key blocks their heaviest
// query tile visits, heaviest first, each sequence's tiles consecutive (last query block first), into `chunks` chunks of VARLEN_SLOTS int4s — each the image of the forward
// kernel's __constant__ work list for one launch (header, then items; fc_scheduler.cuh) — which
// the host then copies, stream-ordered, into the symbol before each launch.
//
// Everything read here is public metadata (DESIGN.md §1: cu_seqlens, seqused_k/q), declared public
// to the audit; counts and cursors live in shared memory, so no pointer into a buffer the kernel
// writes is ever read. Any values are memory-safe: offsets are clamped into the packed tensors
// (a sequence past max_seqlen_q keeps only its first tiles' rows — the caller's contract, as in
// flash-attn). Within one weight the order of tiles is the order shared-memory atomics resolve
// in; it decides which CTA computes a tile, never what the tile computes.
#pragma once
#include "fc_config.cuh"
#include "fc_scheduler.cuh"

namespace varlen_build {
constexpr int THREADS = 1024;
constexpr int BUCKETS = 4096;  // weights told apart; heavier tiles share the last bucket
static_assert(BUCKETS % THREADS == 0, "each thread scans whole buckets");
}  // namespace varlen_build

// A sequence of the pack, clamped into the packed tensors.
struct VarlenSeq {
    int q0, len_q, k0, len_k;
};

FC_DEVICE VarlenSeq varlen_seq(const int* cu_q, const int* cu_k, const int* used_q, const int* used_k, int b, int total_q,
                               int total_k) {
    VarlenSeq s;
    const int q0 = max(0, min(total_q, cu_q[b]));
    const int q1 = max(q0, min(total_q, cu_q[b + 1]));
    const int k0 = max(0, min(total_k, cu_k[b]));
    const int k1 = max(k0, min(total_k, cu_k[b + 1]));
    s.q0 = q0;
    s.len_q = q1 - q0;
    s.k0 = k0;
    s.len_k = k1 - k0;
    // seqused_q / seqused_k: a prefix of the sequence's queries / keys (a padded batch's real tokens).
    if (used_q != nullptr) s.len_q = max(0, min(s.len_q, used_q[b]));
    if (used_k != nullptr) s.len_k = max(0, min(s.len_k, used_k[b]));
    return s;
}

// Key blocks a tile of `rows` remaining query rows over `keys` keys visits (num_kv_blocks of the
// tile as a sequence of its own; the host's `kv_blocks`), as a bucket.
FC_DEVICE int varlen_weight(int rows, int keys) {
    int n = ceil_div(keys, cfg::BN);
#if FC_CAUSAL
    const int last_row = min(cfg::BM, rows) - 1;
    const int visible = min(keys, last_row + keys - rows + 1);
    n = visible <= 0 ? 0 : min(n, ceil_div(visible, cfg::BN));
#endif
    return min(n, varlen_build::BUCKETS - 1);
}

// Query tiles of a sequence: those with rows, at most tiles_per_seq (the launch bound).
FC_DEVICE int varlen_tiles(const VarlenSeq& q, int tiles_per_seq) { return min(tiles_per_seq, ceil_div(q.len_q, cfg::BM)); }

// Slots are (sequence b, tile m) for m < tiles_per_seq = ceil(max_seqlen_q / BM); a slot is a
// work item when the sequence has query rows there. `out` holds `chunks` lists of VARLEN_SLOTS
// int4s, chunks · VARLEN_ITEMS ≥ batch · tiles_per_seq (the host's bound).
extern "C" __global__ void __launch_bounds__(varlen_build::THREADS, 1)
    flashcore_varlen_build(const int* cu_q, const int* cu_k, const int* used_k, const int* used_q, int4* out, int batch,
                           int tiles_per_seq, int total_q, int total_k, int chunks) {
    using namespace varlen_build;
    __shared__ int next[BUCKETS];  // items per weight, then the next position of each weight
    __shared__ int part[THREADS];
    const int tid = (int)threadIdx.x;
    for (int i = tid; i < BUCKETS; i += THREADS) next[i] = 0;
    __syncthreads();
    // A sequence's tiles take consecutive places (its K/V shared in L2 by the CTAs running them),
    // sorted as a group by its heaviest (last) tile's weight.
    for (int b = tid; b < batch; b += THREADS) {
        const VarlenSeq q = varlen_seq(cu_q, cu_k, used_q, used_k, b, total_q, total_k);
        const int tiles = varlen_tiles(q, tiles_per_seq);
        if (tiles > 0) atomicAdd(&next[varlen_weight(q.len_q - (tiles - 1) * cfg::BM, q.len_k)], tiles);
    }
    __syncthreads();
    // Exclusive scan from the heaviest bucket down: thread t owns BUCKETS / THREADS consecutive
    // buckets of that order.
    constexpr int PER = BUCKETS / THREADS;
    int mine[PER];
    int sum = 0;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        mine[j] = sum;
        sum += next[BUCKETS - 1 - (tid * PER + j)];
    }
    // Block-wide inclusive scan of the threads' sums through shared memory (Hillis–Steele; no
    // shuffles, so every step is plain convergent code).
    part[tid] = sum;
    __syncthreads();
    for (int d = 1; d < THREADS; d *= 2) {
        const int add = tid >= d ? part[tid - d] : 0;
        __syncthreads();
        part[tid] += add;
        __syncthreads();
    }
    const int base = part[tid] - sum;
    const int total = part[THREADS - 1];
#pragma unroll
    for (int j = 0; j < PER; ++j) next[BUCKETS - 1 - (tid * PER + j)] = base + mine[j];
    __syncthreads();
    // Each launch's header: how many of its items exist.
    for (int c = tid; c < chunks; c += THREADS) {
        out[(int64_t)c * VARLEN_SLOTS] = make_int4(max(0, min(VARLEN_ITEMS, total - c * VARLEN_ITEMS)), 0, 0, 0);
    }
    for (int b = tid; b < batch; b += THREADS) {
        const VarlenSeq q = varlen_seq(cu_q, cu_k, used_q, used_k, b, total_q, total_k);
        const int tiles = varlen_tiles(q, tiles_per_seq);
        if (tiles == 0) continue;
        const int pos0 = atomicAdd(&next[varlen_weight(q.len_q - (tiles - 1) * cfg::BM, q.len_k)], tiles);
        for (int j = 0; j < tiles; ++j) {  // the last query block first
            const int row0 = (tiles - 1 - j) * cfg::BM, pos = pos0 + j;
            out[(int64_t)(pos / VARLEN_ITEMS) * VARLEN_SLOTS + 1 + pos % VARLEN_ITEMS] =
                make_int4(q.q0 + row0, q.len_q - row0, q.k0, q.len_k);
        }
    }
}
