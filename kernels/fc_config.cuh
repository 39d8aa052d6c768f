// The forward kernel's compile-time configuration, its parameter block and its shared memory.
// Every header of the forward kernel includes this one; the values come from NVRTC -D options
// (Variant::options in src/kernels/mod.rs), so host and device agree by construction.
#pragma once
#include "fc_common.cuh"

#if !defined(FC_HEAD_DIM) || !defined(FC_BF16) || !defined(FC_CAUSAL) || !defined(FC_BLOCK_M) || \
    !defined(FC_BLOCK_N) || !defined(FC_STAGES) || !defined(FC_CONSUMERS) || !defined(FC_SECRET_LEN) || !defined(FC_SPLIT) || \
    !defined(FC_LEAKY_CONTROL)
#error "the variant's defines are missing (see Variant::options in src/kernels/mod.rs)"
#endif
// Decode mode (fc_decode.cuh): GQA-packed rows and a key range split over CTAs. Prefill builds
// do not pass the define.
#ifndef FC_DECODE
#define FC_DECODE 0
#endif
// KV-cache builds of decode mode (fc_decode.cuh): FC_KV_PUBLIC reads each sequence's key count
// from lens_ptr as public metadata (FC_SECRET_LEN: as a secret); FC_PAGED reads K/V pages
// through a block table (fc_producer.cuh), in decode builds and in varlen builds (chunked
// prefill over a paged cache). Other builds do not pass them.
#ifndef FC_KV_PUBLIC
#define FC_KV_PUBLIC 0
#endif
#ifndef FC_PAGED
#define FC_PAGED 0
#endif
static_assert(!FC_KV_PUBLIC || FC_DECODE, "KV-cache builds are decode builds");
// Every KV-cache build (key counts public or secret): these also take per-sequence first keys
// (flash-attn's cache_leftpad) in starts_ptr.
#define FC_KV_CACHE (FC_DECODE && (FC_KV_PUBLIC || FC_SECRET_LEN))
// Variable-length prefill: Q, K, V packed as [total tokens, heads, dim] (maps with a
// batch extent of 1); the host's work list in __constant__ memory (public metadata, DESIGN.md
// §1) gives each query tile its token offsets and counts (fc_scheduler.cuh). Other builds do not
// pass the define.
#ifndef FC_VARLEN
#define FC_VARLEN 0
#endif
static_assert(!FC_PAGED || FC_DECODE || FC_VARLEN, "paged caches: decode or varlen builds");
// Softcap builds: the scores go through softcap_out · tanh(s · softcap_in) before the
// softmax. Plain 128-row prefill tiles, varlen tiles and KV-cache decode (public or secret
// counts); other builds do not pass the define (no secret-length prefill, no cluster split, no
// 192-row tiles: they spill with it).
#ifndef FC_SOFTCAP
#define FC_SOFTCAP 0
#endif
static_assert(!FC_SOFTCAP || FC_KV_CACHE || FC_VARLEN || (!FC_DECODE && !FC_SECRET_LEN),
              "softcap: plain prefill, varlen or KV-cache builds");
static_assert(!FC_SOFTCAP || (FC_BLOCK_M <= 128 && FC_SPLIT == 1), "softcap: at most 128-row tiles, no split");
static_assert(!FC_VARLEN || (!FC_DECODE && !FC_SECRET_LEN && FC_SPLIT == 1), "varlen: plain prefill tiles");
static_assert(!(FC_KV_PUBLIC && FC_SECRET_LEN), "key counts are either public or secret");

namespace cfg {
constexpr int D = FC_HEAD_DIM;
constexpr int BM = FC_BLOCK_M;              // query rows per tile
constexpr int BN = FC_BLOCK_N;              // keys per pipeline stage
constexpr int STAGES = FC_STAGES;           // K/V ring depth
// Shared tiles are [CHUNKS][rows][SW_ELEMS]: 64-element (128-byte) swizzled rows where the head
// dim is a multiple of 64; d96 (an odd multiple of 32) uses 32-element (64-byte) rows with the
// 64-byte swizzle, so no padding columns are loaded or multiplied. The host's tensor
// maps use the same box and swizzle (src/attention/tensor_map.rs).
static_assert(D == 64 || D == 96 || D == 128 || D == 256, "head dims 64, 96, 128, 256");
constexpr int SW_ELEMS = D % 64 == 0 ? 64 : 32;
constexpr int CHUNKS = D / SW_ELEMS;        // swizzle atoms across the head dim
constexpr int CONSUMERS = FC_CONSUMERS;     // consumer warpgroups, 64 query rows each
// Q buffers: decode mode double-buffers Q, so the producer loads the next work unit's Q (and
// then its K/V) while this unit's last Q Kᵀ is still to come — its units are short. Prefill
// tiles double-buffer it where shared memory allows (FC_QBUF=2, the host's rule: Tile in
// src/kernels/mod.rs): with one buffer the producer stops at the next tile's Q until this
// tile's last Q Kᵀ, so neither that Q nor the next tile's first K/V stages can load ahead.
#ifndef FC_QBUF
#define FC_QBUF (FC_DECODE ? 2 : 1)
#endif
constexpr int QBUF = FC_QBUF;
static_assert(QBUF == 1 || QBUF == 2, "one or two Q buffers");
static_assert(BM == 64 * CONSUMERS, "each consumer warpgroup owns 64 query rows");
// 176 keys: FA3's d128 non-causal tile (fewer, longer key blocks per row; PERF_NOTES, fwdperf).
// 80 keys: the d256 prefill tile of FA3 and FA4 (an S GEMM reading less shared memory per FLOP
// than 64 keys; its 40-register S fits beside the 128-register O at 240 registers).
static_assert(BN == 64 || BN == 128 || (BN == 176 && D == 128 && CONSUMERS <= 2 && !FC_CAUSAL && !FC_DECODE) ||
                  (BN == 80 && D == 256 && CONSUMERS <= 2 && !FC_DECODE),
              "wgmma N for S = Q K^T");
constexpr int SPLIT = FC_SPLIT;             // CTAs per cluster sharing one query tile's keys
static_assert(SPLIT == 1 || (BM % SPLIT == 0 && (BM / SPLIT) * D % (4 * 128) == 0), "combine tiling");
static_assert(!FC_DECODE || (BM == 64 && SPLIT == 1), "decode: one 64-row consumer, no cluster");
constexpr int THREADS = 128 * (1 + CONSUMERS);
constexpr int ROW_BYTES = SW_ELEMS * 2;     // one swizzled row of two-byte elements
constexpr int GROUP_BYTES = 8 * ROW_BYTES;  // one 8-row swizzle atom (the descriptors' stride)
// Register split after setmaxnreg: the producer gives registers back, consumers take them.
// d256's two consumers hold a 128-register O accumulator each (PERF_NOTES): they take
// 232, the producer keeps 40.
// d256 varlen softcap builds (a tile's sequence fields and the tanh beside the 128-register O)
// take 240 and leave the producer 24 (its one TMA-issuing thread needs no more; FA3 splits
// 24/240 too): at 232, ptxas parked an mbarrier address under a lane predicate it recomputed
// in between, which the audit cannot prove public. Not the paged ones: their 128-thread
// producer (the gather) spilled at 24, and at 232/40 they audit clean.
constexpr bool WIDE_CONSUMERS = D > 128 && CONSUMERS == 2 && FC_VARLEN && FC_SOFTCAP && !FC_PAGED;
// 176-key tiles hold an 88-register S and 44 of P beside the 64 of O: 240/24 as well.
constexpr bool LONG_KEYS = BN == 176;
// d256 on 80-key blocks: S 40 + P 20 beside the 128 of O; at 232 ptxas spilled (PERF_NOTES).
constexpr bool KEYS80 = BN == 80;
// Both take the 240/24 split.
constexpr bool SPLIT_240 = LONG_KEYS || KEYS80;
constexpr int PRODUCER_REGS =
    SPLIT_240 ? 24 : CONSUMERS <= 2 ? (D > 128 && CONSUMERS == 2 ? (WIDE_CONSUMERS ? 24 : 40) : 56) : 32;
constexpr int CONSUMER_REGS =
    SPLIT_240 ? 240 : CONSUMERS == 1 ? 240 : CONSUMERS == 2 ? (D > 128 ? (WIDE_CONSUMERS ? 240 : 232) : 224) : 160;  // 1: light 64-row tiles
static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file");
constexpr uint32_t Q_BYTES = BM * D * 2;
constexpr uint32_t KV_BYTES = BN * D * 2;
}  // namespace cfg

// Must match `KernelParams` in src/attention/launch.rs byte for byte.
struct Params {
    TensorMap q_map, k_map, v_map;  // 4-D maps over (dim, seq, head, batch)
    uint64_t o_ptr;                  // output, same layout as Q (strides below, in elements)
    uint64_t lse_ptr;                // fp32 [B, Hq, Sq] or 0 for none
    uint64_t lens_ptr;               // secret-length mode: i32 [B] true lengths (secret); else 0
    uint64_t o_ptr_q_for_control;    // Q's address, read only by the leaky control variant
    int64_t o_stride_b, o_stride_s, o_stride_h;
    int32_t seqlen_q, seqlen_k, heads_q, group;  // group = heads_q / heads_kv
    float scale_log2;                            // softmax scale · log2(e)
    float scale;                                 // softmax scale (for the LSE)
    int32_t num_m_blocks;                        // query tiles per (batch, head)
    int32_t units_per_head;                      // work units per (batch, head): see fc_scheduler.cuh
    int32_t num_units;                           // units_per_head · heads · batch
    int32_t pair_tiles;                          // 1: a causal unit pairs a heavy and a light tile
    // Decode mode only (fc_decode.cuh); zero otherwise. Appended so the fields above keep their
    // offsets (and the prefill variants their code).
    uint64_t ws_o_ptr;       // fp32 partial outputs [B·Hq·Sq rows][num_splits][D]
    uint64_t ws_ml_ptr;      // fp32 partial (max, sum) [B·Hq·Sq rows][num_splits][2]
    int32_t pack;            // query heads packed into one tile's rows (a power of two dividing group)
    int32_t pack_shift;      // log2(pack)
    int32_t split_blocks;    // K/V blocks per split (a function of Sk alone)
    int32_t num_splits;      // splits per row: ceil(key blocks / split_blocks)
    // Paged KV caches (FC_PAGED, fc_producer.cuh): the block table is public metadata
    // (allocator state, DESIGN.md §1), and so are FC_KV_PUBLIC's key counts in lens_ptr.
    uint64_t table_ptr;      // paged cache: i32 [B][table_stride] page indices; 0: contiguous K/V
    int32_t table_stride;    // the table's row length (pages per sequence; varlen: B · that, one row)
    int32_t num_pages;       // pages in the pool (entries are clamped into it)
    int32_t page_shift;      // log2(page size)
    int32_t box_rows;        // rows per K/V TMA box: min(page size, BN), or BN when contiguous
    // KV-cache builds (FC_KV_CACHE): i32 [B] first key of each sequence (left padding: keys
    // before it are masked by select, never skipped), as public or secret as the counts; 0: none.
    uint64_t starts_ptr;
    // Sliding windows, softcap, sinks. Window edges, softcap: public; sinks: secret.
    uint64_t sinks_ptr;      // fp32 [Hq] learnable sink logits (gpt-oss): one more term in each row's
                             // softmax denominator, no value row; 0: none. Read by arithmetic only.
    int32_t window_left;     // query row r (bottom-right aligned) sees keys [r' − left, r' + right],
    int32_t window_right;    // r' = r + keys − Sq; unbounded sides come as Sq + Sk (host-clamped)
    float softcap_in;        // softcap: s ← softcap_out · tanh(s · softcap_in) on raw scores, with
    float softcap_out;       // softcap_in = scale / cap, softcap_out = cap / scale; 0: no softcap
    // The scheduler's divisions by units_per_head and heads_q (fast_div, host-computed; public).
    uint32_t units_per_head_mul;
    int32_t units_per_head_shift;
    uint32_t heads_q_mul;
    int32_t heads_q_shift;
    // 1: O leaves through o_map (fc_epilogue.cuh's TMA-store path: builds with kStoreTma, O
    // 16-byte aligned), 0: through 16- or 4-byte stores from registers. Public.
    int32_t o_tma;
    TensorMap o_map;  // O's 4-D map (dim, seq, head, batch), box SW_ELEMS × 16 rows (one warp's)
    // The dynamic order (fc_scheduler.cuh, causal prefill): u32 [2 + 2 · gridDim] (next unit, CTAs
    // done — zero at launch and left zero by the launch — then each CTA's two hand-over slots);
    // public state. Only an atomic's address: the order
    // is chosen by section_heads, so no value derives from the pointer.
    uint64_t tile_counter;
    int32_t section_heads;        // (batch, head) pairs per section of the dynamic order; 0: static
    uint32_t section_heads_mul;   // fast_div by section_heads
    int32_t section_heads_shift;
    uint32_t section_units_mul;   // fast_div by section_heads · num_m_blocks
    int32_t section_units_shift;
    // Paged caches of any page size (FC_PAGED, fc_producer.cuh): pages that are a power of two of
    // at least 16 rows load as TMA boxes (page_shift, box_rows above; gather = 0); any other
    // page size is gathered row by row with cp.async (gather = 1) from the pools' addresses and
    // element strides. All public metadata; zero in other builds.
    int32_t page_size;       // rows per page
    uint32_t page_mul;       // page_div(n, page_mul, page_div_shift) = n / page_size
    int32_t page_div_shift;
    int32_t gather;          // 1: cp.async gather; 0: TMA boxes
    uint64_t k_ptr, v_ptr;   // the pools [num_pages, page_size, Hkv, D]
    int64_t k_stride[3];     // (page, row, head), in elements
    int64_t v_stride[3];
};

struct Shared {
    uint16_t q[cfg::QBUF][cfg::CHUNKS][cfg::BM][cfg::SW_ELEMS];
    uint16_t k[cfg::STAGES][cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS];
    uint16_t v[cfg::STAGES][cfg::CHUNKS][cfg::BN][cfg::SW_ELEMS];
    uint64_t q_full[cfg::QBUF], q_empty[cfg::QBUF];
    uint64_t k_full[cfg::STAGES], v_full[cfg::STAGES];
    uint64_t k_empty[cfg::STAGES], v_empty[cfg::STAGES];
    uint64_t unit_full[2], unit_empty[2];  // the dynamic order's hand-over (fc_scheduler.cuh)
    float anchor[128 * cfg::CONSUMERS];  // write-only scheduling anchor (see Consumer::iteration)
#if FC_SPLIT > 1
    // This CTA's partial result over its key range, read by the whole cluster when combining.
    alignas(16) float part_o[cfg::BM][cfg::D];  // unnormalised output (read as float4)
    float part_m[cfg::BM];          // running max of raw scores (−inf: no visible key)
    float part_l[cfg::BM];          // sum of exp2 terms relative to part_m
#endif
};

FC_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }
