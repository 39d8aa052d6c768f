// Public buffers (docs/design.md §1, "Metadata"): kernels that read a paged KV cache's block
// table and cache_seqlens from device memory. tests/audit_public.rs audits each with and without
// the metadata pointer declared public (`--public-param`) and asserts the verdict it states here.
// Everything else global memory holds (K, what K's bytes say) stays secret.

// (a) Paged gather. Clean with block_table public: the page index is public metadata, so K's
// address is public. Without the declaration: rule 2 at the K load (its address comes from a
// secret, the block-table entry).
extern "C" __global__ void pb_paged_gather(const int* block_table, const float* k, float* out,
                                           int max_pages, int page_size, int stride, int n) {
    int b = blockIdx.y;
    float acc = 0.f;
#pragma unroll 1
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int page = block_table[b * max_pages + j / page_size];
        acc += k[(long long)(page * page_size + j % page_size) * stride];
    }
    out[b * blockDim.x + threadIdx.x] = acc;
}

// (b) The page index derived from K's data: rule 2 at the K load even with block_table public
// (block_table itself is read, publicly, for the output's offset).
extern "C" __global__ void pb_page_from_k(const int* block_table, const float* k, float* out,
                                          int max_pages, int page_size, int stride, int n) {
    int b = blockIdx.y;
    const unsigned char* kbytes = reinterpret_cast<const unsigned char*>(k);
    float acc = 0.f;
#pragma unroll 1
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int page = kbytes[j] & 0xff;
        acc += k[(long long)(page * page_size + j % page_size) * stride];
    }
    out[b * blockDim.x + threadIdx.x] = acc + block_table[b];
}

// (c) A loop bound from cache_seqlens[b]: clean with cache_seqlens public; rule 1 at the loop's
// branches without.
extern "C" __global__ void pb_seqlen_loop(const int* cache_seqlens, const float* k, float* out,
                                          int stride) {
    int b = blockIdx.x;
    int len = cache_seqlens[b];
    float acc = 0.f;
#pragma unroll 1
    for (int j = threadIdx.x; j < len; j += blockDim.x) acc += k[(long long)b * stride + j];
    out[b * blockDim.x + threadIdx.x] = acc;
}

// (d) A public base with a secret offset: rule 2 at the block-table load, and the value it
// loads stays secret: rule 1 at the loop it bounds.
extern "C" __global__ void pb_secret_offset(const int* block_table, const int* k, float* out) {
    int idx = k[threadIdx.x] & 63;
    int v = block_table[idx];
    float acc = 0.f;
#pragma unroll 1
    for (int i = 0; i < v; ++i) acc += i * 0.5f;
    out[threadIdx.x] = acc;
}

// (e1) A pointer that is block_table on some lanes and K on others (a select, here predicated
// constant-bank loads): the load through it is secret, rule 1 at the loop it bounds.
extern "C" __global__ void pb_select_mixed(const int* block_table, const int* k, float* out) {
    const int* p = (threadIdx.x & 1) ? block_table : k;
    int v = p[threadIdx.x];
    float acc = 0.f;
#pragma unroll 1
    for (int i = 0; i < v; ++i) acc += i * 0.5f;
    out[threadIdx.x] = acc;
}

// (e2) The same through a branch merge: each side runs a loop, so the pointer reaches the load
// through two paths of the CFG.
extern "C" __global__ void pb_merge_mixed(const int* block_table, const int* k, float* out, int flag) {
    const int* p;
    if (threadIdx.x < flag) {
        p = block_table + 4;
#pragma unroll 1
        for (int i = 0; i < flag; ++i) out[1024 + i * 32 + threadIdx.x] = 1.f;
    } else {
        p = k + 8;
#pragma unroll 1
        for (int i = 0; i < 2 * flag; ++i) out[4096 + i * 32 + threadIdx.x] = 2.f;
    }
    int v = p[threadIdx.x];
    float acc = 0.f;
#pragma unroll 1
    for (int i = 0; i < v; ++i) acc += i * 0.5f;
    out[threadIdx.x] = acc;
}

// (e3) The control for (e2): both sides point into block_table (at different offsets), so the
// load is public and the kernel clean (NVRTC merges the two offsets rather than the pointers;
// the pointer-level merge is unit-tested in src/audit/provenance.rs).
extern "C" __global__ void pb_merge_same(const int* block_table, const int* k, float* out, int flag) {
    const int* p;
    if (threadIdx.x < flag) {
        p = block_table + 4;
#pragma unroll 1
        for (int i = 0; i < flag; ++i) out[1024 + i * 32 + threadIdx.x] = k[i];
    } else {
        p = block_table + 8;
#pragma unroll 1
        for (int i = 0; i < 2 * flag; ++i) out[4096 + i * 32 + threadIdx.x] = 2.f;
    }
    int v = p[threadIdx.x];
    float acc = 0.f;
#pragma unroll 1
    for (int i = 0; i < v; ++i) acc += i * 0.5f;
    out[threadIdx.x] = acc;
}

// (f) flashcore's shape: one __grid_constant__ struct parameter with the secret-data pointer and
// the metadata pointers as fields, aligned to 64 bytes as flashcore's Params (its TensorMaps) is,
// so that it starts at c[0x0][0x240], not 0x210. Clean with the block_table and seqlens fields
// (byte offsets 8 and 16) declared public; rule 1 (loop bound) and rule 2 (K's address)
// without; declaring only block_table leaves the seqlens loop bound secret.
struct __align__(64) DecodeParams {
    const float* k;          // offset 0: secret data
    const int* block_table;  // offset 8: public metadata
    const int* seqlens;      // offset 16: public metadata
    float* out;              // offset 24
    long long stride;        // offset 32
    int max_pages, page_size;
};
extern "C" __global__ void pb_struct_fields(const __grid_constant__ DecodeParams p) {
    int b = blockIdx.y;
    int len = p.seqlens[b];
    float acc = 0.f;
#pragma unroll 1
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        int page = p.block_table[b * p.max_pages + j / p.page_size];
        acc += p.k[(page * p.page_size + j % p.page_size) * p.stride];
    }
    p.out[b * blockDim.x + threadIdx.x] = acc;
}

// (g) A kernel that writes its block table: the buffer is not metadata, so its reads stay
// secret even when declared public: rule 2 at the K load.
extern "C" __global__ void pb_writes_table(int* block_table, const float* k, float* out,
                                           int stride) {
    int b = blockIdx.x;
    int page = block_table[b];
    block_table[b + 1] = (int)k[b];
    out[b] = k[(long long)page * stride];
}

// (h) Reads under a bound check in an unrolled loop, 64-bit strides and a vector load of four
// block-table entries: clean with both metadata pointers public.
extern "C" __global__ void pb_guarded_unrolled(const int* block_table, const int* cache_seqlens,
                                               const float* k, float* out, long long stride_page,
                                               long long stride_tok, int max_pages, int page_size,
                                               int n) {
    int b = blockIdx.x;
    int len = cache_seqlens[b];
    const int* row = block_table + (long long)b * max_pages;
    int4 first = reinterpret_cast<const int4*>(row)[0];
    float acc = k[first.x * stride_page] + k[first.y * stride_page] + k[first.z * stride_page] +
                k[first.w * stride_page];
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int page = 0;
        if (j < len) page = __ldg(row + j / page_size);
        acc += k[page * stride_page + (j % page_size) * stride_tok];
    }
    out[b * blockDim.x + threadIdx.x] = acc;
}

// (i) A predicated read (`@!P0 LDG`): its address is seen under its guard; clean with
// block_table public.
extern "C" __global__ void pb_predicated_read(const int* block_table, const float* k, float* out,
                                              int n, long long stride) {
    int j = threadIdx.x;
    int page = 0;
    if (j < n) page = block_table[blockIdx.x * n + j];
    out[blockIdx.x * blockDim.x + j] = k[page * stride];
}

// (j) A KV-cache append, the shape of kernels/fc_kv_append.cuh: row i of sequence b's new K goes
// to cache row cache_seqlens[b] + i (rows past the capacity dropped). Clean with cache_seqlens
// public; without, the store's address (and the drop's branch) come from a secret.
extern "C" __global__ void pb_append_rows(const int* cache_seqlens, const float* k_new, float* k_cache,
                                          int rows, int capacity, int width) {
    int b = blockIdx.x, i = threadIdx.y, c = threadIdx.x;
    int r = cache_seqlens[b] + i;
    if (r >= capacity) return;
    k_cache[((long long)b * capacity + r) * width + c] = k_new[((long long)b * rows + i) * width + c];
}

// (k) The same append with the row taken from the new K's data: rule 2 at the store even with
// cache_seqlens public.
extern "C" __global__ void pb_append_row_from_k(const int* cache_seqlens, const int* k_new, int* k_cache,
                                                int rows, int capacity, int width) {
    int b = blockIdx.x, i = threadIdx.y, c = threadIdx.x;
    int v = k_new[((long long)b * rows + i) * width + c];
    int r = min(max(cache_seqlens[b] + (v & 7), 0), capacity - 1);
    k_cache[((long long)b * capacity + r) * width + c] = v;
}

// (l) Turn counters (the one-pass backward's dQ order, kernels/fc_bwd_onepass.cuh): CTA (rank,
// tile) waits until turns[tile] == rank, adds its part, and hands the tile on. The kernel writes
// `turns`, but only public values (+1) at public addresses, so its reads stay public: clean with
// turns public; without, rule 1 at the spin loop's branch.
__device__ int pb_ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ void pb_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
extern "C" __global__ void pb_turn_counter(int* turns, const float* part, float* acc, int n) {
    int tile = blockIdx.y, rank = blockIdx.x;
    if (threadIdx.x == 0)
        while (pb_ld_acquire(turns + tile) != rank) {
        }
    __syncthreads();
    long long i = (long long)tile * blockDim.x + threadIdx.x;
    acc[i] += part[(long long)rank * n + i];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) pb_release_add(turns + tile, 1);
}

// (m) The same with the increment derived from the data: the counter is no longer public, so
// even declared public its reads are secret: rule 1 at the spin loop's branch.
extern "C" __global__ void pb_turn_counter_secret(int* turns, const float* part, float* acc, int n) {
    int tile = blockIdx.y, rank = blockIdx.x;
    if (threadIdx.x == 0)
        while (pb_ld_acquire(turns + tile) != rank) {
        }
    __syncthreads();
    long long i = (long long)tile * blockDim.x + threadIdx.x;
    float x = part[(long long)rank * n + i];
    acc[i] += x;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) pb_release_add(turns + tile, 1 + (__float_as_int(x) & 1));
}

// The tile counter's ticket, as the forward kernel takes it: one `atom` from one thread (the
// compiler's warp-aggregated atomicAdd hands the result round the warp with a shuffle, which
// the provenance analysis reads flow-insensitively).
__device__ unsigned pb_ticket(unsigned* p, unsigned v) {
    unsigned r;
    asm volatile("atom.global.inc.u32 %0, [%1], %2;" : "=r"(r) : "l"(p), "r"(v) : "memory");
    return r;
}

// (n) A tile counter (the forward's dynamic order, kernels/fc_scheduler.cuh): each CTA takes
// tickets with an atomic add until one is past the end, computes that tile at addresses built
// from the ticket, and the last CTA to finish sets the counter back to zero. Written only with
// public values at public addresses, so the tickets are public: clean with `counter` public;
// without, the tickets are secret (rule 1 at the loop's branch, rule 2 at the addresses).
extern "C" __global__ void pb_tile_counter(unsigned* counter, const float* in, float* out, int tiles) {
    __shared__ int ticket;
    for (;;) {
        if (threadIdx.x == 0) ticket = (int)pb_ticket(counter, 0x7fffffffu);
        __syncthreads();
        const int t = ticket;
        __syncthreads();
        if (t >= tiles) break;
        out[(long long)t * blockDim.x + threadIdx.x] = in[(long long)t * blockDim.x + threadIdx.x] * 2.0f;
    }
    if (threadIdx.x == 0 && pb_ticket(counter + 1, 0x7fffffffu) == gridDim.x - 1) {
        atomicExch(counter, 0u);
        atomicExch(counter + 1, 0u);
    }
}

// (o) The same with an increment derived from the data: the counter is no longer public, so
// even declared public its tickets are secret.
extern "C" __global__ void pb_tile_counter_secret(unsigned* counter, const float* in, float* out, int tiles) {
    __shared__ int ticket;
    for (;;) {
        if (threadIdx.x == 0) ticket = (int)pb_ticket(counter, 0x7ffffffeu | (__float_as_uint(in[0]) & 1u));
        __syncthreads();
        const int t = ticket;
        __syncthreads();
        if (t >= tiles) break;
        out[(long long)t * blockDim.x + threadIdx.x] = in[(long long)t * blockDim.x + threadIdx.x] * 2.0f;
    }
}

// (p) The tile counter of (n), with its pointer also stored, as data, into another buffer (`log`):
// global memory then holds a value derived from the counter's pointer, as it does in the forward
// kernel where an output written from a shuffle may carry another lane's copy of the pointer.
// A ticket reads only the counter, which holds only what is written through its pointer (the
// tickets themselves and zeros): still public, and the tile's addresses are no writes of the
// counter. Clean with `counter` public.
extern "C" __global__ void pb_tile_counter_pointer_elsewhere(unsigned* counter, const float* in, float* out,
                                                             unsigned long long* log, int tiles) {
    __shared__ int ticket;
    if (blockIdx.x == 0 && threadIdx.x == 0) log[0] = (unsigned long long)counter;
    for (;;) {
        if (threadIdx.x == 0) ticket = (int)pb_ticket(counter, 0x7fffffffu);
        __syncthreads();
        const int t = ticket;
        __syncthreads();
        if (t >= tiles) break;
        out[(long long)t * blockDim.x + threadIdx.x] = in[(long long)t * blockDim.x + threadIdx.x] * 2.0f;
    }
}

// (q) The same pointer stored into the counter's own buffer (a slot after its two words): a
// ticket may then be that pointer, the output stores at addresses built from the tickets may
// write the counter, and they store data: the counter is not public, declared or not.
extern "C" __global__ void pb_tile_counter_pointer_inside(unsigned* counter, const float* in, float* out,
                                                          int tiles) {
    __shared__ int ticket;
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *reinterpret_cast<unsigned long long*>(counter + 2) = (unsigned long long)counter;
    for (;;) {
        if (threadIdx.x == 0) ticket = (int)pb_ticket(counter, 0x7fffffffu);
        __syncthreads();
        const int t = ticket;
        __syncthreads();
        if (t >= tiles) break;
        out[(long long)t * blockDim.x + threadIdx.x] = in[(long long)t * blockDim.x + threadIdx.x] * 2.0f;
    }
}
