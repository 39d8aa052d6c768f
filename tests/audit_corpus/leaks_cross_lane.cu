// Planted leaks through cross-lane and cross-thread flows: warp votes, ballots, match, reduce,
// shuffles (secret data and secret lane), barrier reductions, shared memory written by other
// threads, atomics' returned values. Every kernel here must be flagged (tests/audit_corpus.rs
// asserts the rule, the sink instruction and the SASS instruction that carries the flow).
// Secrets are the contents of global memory; SECURITY.md says why each one is a leak.

// A warp vote on secret data, then a branch on the vote.
extern "C" __global__ void leak_vote_any_branch(const float* x, float* y, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = (i < n) ? x[i] : 0.f, acc = v;
    if (__any_sync(0xffffffffu, v > 100.f))
        for (int j = 0; j < iters; ++j) acc = __sinf(acc) * v + (float)j;
    if (i < n) y[i] = acc;
}

// `__all_sync` of a secret predicate drives a loop (uniform vote, uniform branch).
extern "C" __global__ void leak_vote_all_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float acc = 0.f;
    if (__all_sync(0xffffffffu, a[i] > 0.f)) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// A ballot of secret predicates used as an address (population count of the ballot).
extern "C" __global__ void leak_ballot_index(float* o, const float* a, const float* table) {
    int i = threadIdx.x;
    unsigned m = __ballot_sync(0xffffffffu, a[i] > 0.f);
    o[i] = table[__popc(m)];
}

// `__match_any_sync` on secret values: the set of lanes holding the same value is secret.
extern "C" __global__ void leak_match_any_index(float* o, const int* a, const float* table) {
    int i = threadIdx.x;
    unsigned m = __match_any_sync(0xffffffffu, a[i]);
    o[i] = table[__popc(m)];
}

// `__match_all_sync` on secret values: whether all lanes agree is secret, then a branch.
extern "C" __global__ void leak_match_all_branch(float* o, const int* a, const float* b) {
    int i = threadIdx.x;
    int pred = 0;
    unsigned m = __match_all_sync(0xffffffffu, a[i], &pred);
    float acc = (float)m;
    if (pred) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// `__reduce_add_sync` (REDUX into a uniform register) of secret integers used as an address.
extern "C" __global__ void leak_redux_sum_index(float* o, const unsigned* a, const float* table) {
    int i = threadIdx.x;
    unsigned s = __reduce_add_sync(0xffffffffu, a[i] & 15u);
    o[i] = table[s];
}

// `__reduce_max_sync` of secret integers as a loop bound.
extern "C" __global__ void leak_redux_max_loop(float* o, const unsigned* a, const float* b) {
    int i = threadIdx.x;
    unsigned n = __reduce_max_sync(0xffffffffu, a[i] & 63u);
    float acc = 0.f;
#pragma unroll 1
    for (unsigned j = 0; j < n; ++j) acc = acc * 0.5f + b[j];
    o[i] = acc;
}

// A shuffle of secret data; the received value is used as an address.
extern "C" __global__ void leak_shfl_data_index(float* o, const int* a, const float* table) {
    int i = threadIdx.x;
    int v = __shfl_xor_sync(0xffffffffu, a[i], 1);
    o[i] = table[v & 255];
}

// A shuffle of public data from a secret lane: the value received tells the secret lane index.
extern "C" __global__ void leak_shfl_secret_lane(float* o, const int* a, const float* table) {
    int i = threadIdx.x;
    int lane = a[i] & 31;
    int v = __shfl_sync(0xffffffffu, i * 4, lane);
    o[i] = table[v];
}

// `__syncthreads_count` of a secret predicate (BAR.RED.POPC), then a branch on the count.
extern "C" __global__ void leak_bar_red_popc(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    int c = __syncthreads_count(a[i] > 0.f);
    float acc = 0.f;
    if (c > 7) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// `__syncthreads_or` of a secret predicate (BAR.RED.OR), then a branch.
extern "C" __global__ void leak_bar_red_or(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float acc = 0.f;
    if (__syncthreads_or(a[i] > 0.f)) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// Shared memory across threads: warp 1 stores a secret *after* (in program order) the code where
// warp 0 loads it; warp 0 branches on what it read. Only a flow-insensitive view of shared memory
// sees this: along warp 0's own path no secret store precedes the load.
extern "C" __global__ void leak_smem_cross_warp(float* o, const float* a, const float* b) {
    __shared__ float s[64];
    int i = threadIdx.x;
    float acc = 0.f;
    if (i < 32) {
        __syncthreads();
        if (s[i + 32] > 0.f) {
#pragma unroll 1
            for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
        }
    }
    if (i >= 32) {
        s[i] = a[i];
        __syncthreads();
    }
    o[i] = acc;
}

// The value an atomic returns from global memory is secret (memory contents and the order of
// other threads' updates): used as an address.
extern "C" __global__ void leak_atomic_return_index(float* o, int* counter, const float* a) {
    int i = threadIdx.x;
    int slot = atomicAdd(counter, 1);
    o[slot & 1023] = a[i];
}

// A shared-memory atomic whose operand is secret returns a secret: used as an address.
extern "C" __global__ void leak_shared_atomic_return(float* o, const int* a, const float* table) {
    __shared__ int acc;
    int i = threadIdx.x;
    if (i == 0) acc = 0;
    __syncthreads();
    int old = atomicAdd(&acc, a[i] & 7);
    o[i] = table[old & 255];
}

// A compare-and-swap spin on a secret word: the retry loop's trip count is secret.
extern "C" __global__ void leak_atomic_cas_loop(int* word, const int* a, float* o) {
    int i = threadIdx.x;
    int want = a[i];
    int old = *word, assumed;
    do {
        assumed = old;
        old = atomicCAS(word, assumed, assumed + want);
    } while (assumed != old);
    o[i] = (float)old;
}
