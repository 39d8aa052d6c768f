// Planted leaks: every kernel here must be flagged by `flashcore audit` with the rule named in
// its comment (tests/audit_corpus.rs asserts it). Secrets are the contents of global memory.
// Each leak is written so the compiler cannot remove it (results are stored).

// Rule 1: branch on data (a data-dependent loop-free branch around real work).
extern "C" __global__ void leak_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float x = a[i], acc = 0.f;
    if (x > 0.f) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * x + b[j];
    }
    o[i] = acc;
}

// Rule 1: early exit on data.
extern "C" __global__ void leak_early_exit(float* o, const float* a) {
    int i = threadIdx.x;
    if (a[i] == 0.f) return;
    o[i] = 1.f;
}

// Rule 1: loop trip count from data.
extern "C" __global__ void leak_loop_trip(float* o, const int* a, const float* b) {
    int i = threadIdx.x;
    int n = a[i];
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < n; ++k) acc += b[k];
    o[i] = acc;
}

// Rule 2: load predicated on data (no branch, a guarded LDG).
extern "C" __global__ void leak_pred_load(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float v = 0.f;
    if (a[i] > 0.f) v = b[i];
    o[i] = v;
}

// Rule 2: store predicated on data.
extern "C" __global__ void leak_pred_store(float* o, float* o2, const float* a) {
    int i = threadIdx.x;
    float x = a[i];
    if (x > 0.f) o[i] = x;
    o2[i] = 2.f;
}

// Rule 2: global address from data.
extern "C" __global__ void leak_global_addr(float* o, const int* a, const float* table) {
    int i = threadIdx.x;
    o[i] = table[a[i] & 1023];
}

// Rule 2: shared-memory address from data.
extern "C" __global__ void leak_shared_addr(float* o, const int* a) {
    __shared__ float s[256];
    int i = threadIdx.x;
    s[i] = (float)i;
    __syncthreads();
    o[i] = s[a[i] & 255];
}

// Rule 2: atomic at a data-dependent address.
extern "C" __global__ void leak_atomic_addr(float* hist, const int* a) {
    atomicAdd(&hist[a[threadIdx.x] & 255], 1.f);
}

// Rule 3: IEEE division of secret values.
extern "C" __global__ void leak_ieee_div(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    o[i] = a[i] / b[i];
}

// Rule 3: IEEE sqrt of secret values.
extern "C" __global__ void leak_ieee_sqrt(float* o, const float* a) {
    int i = threadIdx.x;
    o[i] = sqrtf(a[i]);
}

// Rule 3: 64-bit integer division of a secret.
extern "C" __global__ void leak_div64(long long* o, const long long* a, long long d) {
    int i = threadIdx.x;
    o[i] = a[i] / d;
}

// Rule 1: warp vote on data driving a branch.
extern "C" __global__ void leak_vote_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    unsigned m = __ballot_sync(0xffffffffu, a[i] > 0.f);
    float acc = 0.f;
    if (m & 1u) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// Rule 1: secret data round-tripped through shared memory, then branched on.
extern "C" __global__ void leak_smem_roundtrip(float* o, const float* a, const float* b) {
    __shared__ float s[256];
    int i = threadIdx.x;
    s[i] = a[i];
    __syncthreads();
    float acc = 0.f;
    if (s[(i + 1) & 255] > 0.f) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// Rule 1: a secret predicate packed into one bit of a register beside public flags (the shape
// ptxas produces under register pressure), then that bit extracted and branched on. The
// `asm volatile` identity keeps the compiler from folding the extraction back into the compare,
// so the SASS really builds the word (SEL/VIADD) and really extracts a bit (LOP3.LUT P / R2P).
extern "C" __global__ void leak_packed_pred_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float x = a[i];
    unsigned flags = 0;
    if (x > 0.f) flags |= 1u << 30;        // secret
    if ((i & 31) == 0) flags |= 1u << 28;  // public
    if (i < 64) flags |= 1u << 3;          // public
    asm volatile("mov.b32 %0, %0;" : "+r"(flags));
    float acc = 0.f;
    if (flags & (1u << 30)) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * x + b[j];
    }
    o[i] = acc;
}
