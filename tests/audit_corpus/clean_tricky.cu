// Clean but tricky: each kernel looks like one of the leaks (a vote, a shuffle, a ballot, a
// barrier count, a division, a call, a conversion, a predicated store, min/max, local memory)
// but only public values reach a branch, an address, a barrier or a slow path. Every kernel must
// audit with zero findings (tests/audit_corpus.rs); SECURITY.md says why each one is clean.

// A vote on a public predicate (i < n) drives a branch.
extern "C" __global__ void clean_vote_public(float* o, const float* a, int n) {
    int i = threadIdx.x;
    float x = a[i], acc = x;
    if (__any_sync(0xffffffffu, i >= n)) {
#pragma unroll 1
        for (int j = 0; j < 8; ++j) acc = acc * x + 1.f;
    }
    o[i] = acc;
}

// A ballot of public predicates used as an address.
extern "C" __global__ void clean_ballot_public_index(float* o, const float* a, int n) {
    int i = threadIdx.x;
    unsigned m = __ballot_sync(0xffffffffu, (i & 3) == 0 || i >= n);
    o[i] = a[__popc(m)] * 2.f;
}

// A shuffle of a public index from a public lane, used as an address (secret data is loaded
// through it, never shuffled).
extern "C" __global__ void clean_shuffle_public_index(float* o, const float* a) {
    int i = threadIdx.x;
    int base = __shfl_sync(0xffffffffu, i * 4, (i + 3) & 31);
    o[i] = a[base & 1023];
}

// `__syncthreads_count` of a public predicate as a loop bound.
extern "C" __global__ void clean_bar_count_public(float* o, const float* a, int n) {
    int i = threadIdx.x;
    int c = __syncthreads_count(i < n);
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < c; ++k) acc = acc * 0.5f + a[k];
    o[i] = acc;
}

// 32-bit integer division and modulo of secrets: inline, branch-free, fixed latency (no call).
extern "C" __global__ void clean_int_div_secret(int* o, const int* a, const int* b) {
    int i = threadIdx.x;
    int x = a[i], y = b[i] | 1;
    o[i] = x / y + x % y;
}

// Fast approximate division and reciprocal square root of secrets (MUFU, no slow path).
extern "C" __global__ void clean_fast_div_rsqrt(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    o[i] = __fdividef(a[i], b[i]) + rsqrtf(fabsf(a[i]) + 1.f);
}

// A public float converted to an int and used as an address.
extern "C" __global__ void clean_f2i_public_index(float* o, const float* a, float scale) {
    int i = threadIdx.x;
    int k = (int)((float)i * scale);
    o[i] = a[k & 1023];
}

// A store predicated on a public bound (the usual tail guard).
extern "C" __global__ void clean_pred_store_public(float* o, const float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float x = a[i & 1023] * 3.f;
    if (i < n) o[i] = x;
}

// min/max and selects of secrets feeding only arithmetic; the loop bound is min of publics.
extern "C" __global__ void clean_minmax_arith(float* o, const int* a, int n, int m) {
    int i = threadIdx.x;
    int v = a[i];
    int c = min(max(v, -8), 8) + (v > 3 ? 1 : 0);
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < min(n, m); ++k) acc = acc * 0.5f + (float)(c * k);
    o[i] = acc;
}

// A __noinline__ callee computing on secrets without branches; its result is only stored.
__device__ __noinline__ float callee_mix(float x, float y) { return fmaxf(x, y) * 0.5f + x * y; }
extern "C" __global__ void clean_noinline_arith(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    o[i] = callee_mix(a[i], b[i]);
}

// A byte permute (PRMT) of secrets into a value that is only stored; the address is public.
extern "C" __global__ void clean_prmt_data(unsigned* o, const unsigned* a) {
    int i = threadIdx.x;
    o[i] = __byte_perm(a[i], a[i + 1], 0x5140);
}

// ELECT picks a leader lane (public: it depends on the active mask only) that does the store.
extern "C" __global__ void clean_elect_leader(float* o, const float* a) {
    int i = threadIdx.x;
    float x = a[i];
    unsigned is_leader;
    asm volatile("{ .reg .pred p; elect.sync _|p, 0xffffffff; selp.u32 %0, 1, 0, p; }"
                 : "=r"(is_leader));
    if (is_leader) o[i >> 5] = x;
}
