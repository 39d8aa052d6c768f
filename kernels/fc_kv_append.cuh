// KV-cache builds: the append of a decode step's new keys and values, as a launch of its own just
// before the attention on the same stream — flash-attn's `flash_attn_with_kvcache(k=, v=)`: row i
// of sequence b's new K/V goes to cache row cache_seqlens[b] + i, then the attention reads
// cache_seqlens[b] + n keys. One native call does both, so a framework pays one call's host time
// instead of a chain of indexing launches.
//
// The counts and the block table are public metadata here in every KV-cache kind (DESIGN.md §1,
// SECURITY.md): the rows written are addressed by them. The values moved (K, V) are secret and
// reach no address or branch. Rows past the capacity are dropped (the caller's error, as in
// flash-attn; the Rust and Python entry points document it), never written out of bounds.
#pragma once
#include "fc_common.cuh"

// Must match `AppendParams` in src/abi.rs.
struct AppendParams {
    uint64_t k_new, v_new;      // [B, rows, Hkv, D] by the strides below (elements)
    uint64_t k_cache, v_cache;  // [B, capacity, Hkv, D], or pools [pages, page size, Hkv, D]
    uint64_t seqlens_ptr;       // i32 [B]: rows each sequence holds before the append (public)
    uint64_t table_ptr;         // i32 [B][table_stride] page indices (public); 0: contiguous
    uint64_t counts_ptr;        // i32 [B] written: seqlens + rows, what the attention reads
    int64_t k_new_stride[3], v_new_stride[3];      // (batch, seq, head)
    int64_t k_cache_stride[3], v_cache_stride[3];  // (batch or page, row, head)
    int32_t batch, rows, heads_kv, head_dim;
    int32_t capacity, page_size, table_stride, num_pages;
    uint32_t page_mul;  // page_div(r, page_mul, page_div_shift) = r / page_size (any page size)
    int32_t page_div_shift;
};

constexpr int APPEND_THREADS = 256;

// Thread t copies 16 bytes (8 elements) of one (batch, new row, head) row of K and of V. Indices
// are 32-bit (the host checks that B · rows · Hkv · D / 8 fits). Every thread also rewrites the
// count of sequence min(t, B − 1): the same value from many threads, but no guard around the
// load and store (a guarded load of the counts would leave its register half the counts' pointer
// to the audit's provenance analysis).
FC_DEVICE void append_rows(const AppendParams& p) {
    const int t = (int)(blockIdx.x * APPEND_THREADS + threadIdx.x);
    const int chunks = p.head_dim / 8;
    const int row_id = t / chunks;
    const int col = (t % chunks) * 8;
    const int32_t* seqlens = reinterpret_cast<const int32_t*>(p.seqlens_ptr);
    const int bt = min(t, p.batch - 1);
    reinterpret_cast<int32_t*>(p.counts_ptr)[bt] = seqlens[bt] + p.rows;
    if (row_id >= p.batch * p.rows * p.heads_kv) return;  // public: the grid's tail
    const int h = row_id % p.heads_kv;
    const int i = (row_id / p.heads_kv) % p.rows;
    const int b = row_id / (p.heads_kv * p.rows);
    const int r = seqlens[b] + i;
    if (r < 0 || r >= p.capacity) return;  // public metadata: a row past the cache is dropped
    int64_t slot = b, row = r;
    if (p.table_ptr != 0) {
        const int32_t* table = reinterpret_cast<const int32_t*>(p.table_ptr);
        const int q = page_div(r, p.page_mul, p.page_div_shift);  // r < capacity: q < table_stride
        slot = min(max(table[b * p.table_stride + q], 0), p.num_pages - 1);
        row = r - q * p.page_size;
    }
    const uint16_t* kn = reinterpret_cast<const uint16_t*>(p.k_new) + b * p.k_new_stride[0] +
                         i * p.k_new_stride[1] + h * p.k_new_stride[2] + col;
    const uint16_t* vn = reinterpret_cast<const uint16_t*>(p.v_new) + b * p.v_new_stride[0] +
                         i * p.v_new_stride[1] + h * p.v_new_stride[2] + col;
    uint16_t* kc = reinterpret_cast<uint16_t*>(p.k_cache) + slot * p.k_cache_stride[0] + row * p.k_cache_stride[1] +
                   h * p.k_cache_stride[2] + col;
    uint16_t* vc = reinterpret_cast<uint16_t*>(p.v_cache) + slot * p.v_cache_stride[0] + row * p.v_cache_stride[1] +
                   h * p.v_cache_stride[2] + col;
    *reinterpret_cast<uint4*>(kc) = *reinterpret_cast<const uint4*>(kn);
    *reinterpret_cast<uint4*>(vc) = *reinterpret_cast<const uint4*>(vn);
}
