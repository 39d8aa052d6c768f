// Clean patterns: every kernel here must audit with zero findings (tests/audit_corpus.rs).
// Secrets are the contents of global memory; shapes (n, stride) are public parameters.

__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
__device__ __forceinline__ float rcp(float x) { float y; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

// A loop bounded by a public parameter over secret data.
extern "C" __global__ void clean_public_loop(float* o, const float* a, int n) {
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < n; ++k) acc = acc * 0.5f + a[k * 32 + threadIdx.x];
    o[threadIdx.x] = acc;
}

// Masking by select: secret comparisons only feed SEL/FSEL/FMNMX.
extern "C" __global__ void clean_select_mask(float* o, const float* a, const int* b) {
    int i = threadIdx.x;
    float x = a[i];
    int y = b[i];
    float m = x > 0.f ? x : 0.f;
    int z = y > 7 ? y : -y;
    o[i] = fmaxf(m, -1.f) + (float)z;
}

// Row max and row sum by FMNMX and butterfly shuffles.
extern "C" __global__ void clean_shuffle_reduce(float* o, const float* a) {
    int i = threadIdx.x;
    float m = a[i], s = a[i];
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, w));
        s += __shfl_xor_sync(0xffffffffu, s, w);
    }
    o[i] = m + s;
}

// exp2 softmax over a public-length row: MUFU.EX2, FMNMX, rcp.approx, fully masked rows guarded
// by selects ((-inf) - (-inf) would be NaN).
extern "C" __global__ void clean_exp2_softmax(float* o, const float* s, int n, float scale_log2) {
    const float NEG_INF = __int_as_float(0xff800000);
    int lane = threadIdx.x & 31;
    float m = NEG_INF;
#pragma unroll 1
    for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j] * scale_log2);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, w));
    float m_safe = m == NEG_INF ? 0.f : m;
    float l = 0.f;
#pragma unroll 1
    for (int j = lane; j < n; j += 32) l += ex2(s[j] * scale_log2 - m_safe);
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) l += __shfl_xor_sync(0xffffffffu, l, w);
    float inv = l == 0.f ? 0.f : rcp(l);
#pragma unroll 1
    for (int j = lane; j < n; j += 32) o[j] = ex2(s[j] * scale_log2 - m_safe) * inv;
}

// Secret data staged through shared memory at public addresses, read back at public addresses.
extern "C" __global__ void clean_smem_staging(float* o, const float* a) {
    __shared__ float s[256];
    int i = threadIdx.x;
    s[i] = a[i];
    __syncthreads();
    float v = s[255 - i];
    o[i] = v > 0.f ? v : 0.f;
}

// 32-bit integer division and modulo by a public divisor: inline, fixed latency.
extern "C" __global__ void clean_int_div_public(int* o, const int* a, int d) {
    int i = threadIdx.x;
    o[i] = a[i] * 3 + (i / d) + (i % d);
}

// The same packed word as leaks.cu's leak_packed_pred_branch: the secret bit only feeds a
// select, the branch reads a public bit of the same register (bit-precise taint).
extern "C" __global__ void clean_packed_pred_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    float x = a[i];
    unsigned flags = 0;
    if (x > 0.f) flags |= 1u << 30;        // secret
    if ((i & 31) == 0) flags |= 1u << 28;  // public
    if (i < 64) flags |= 1u << 3;          // public
    asm volatile("mov.b32 %0, %0;" : "+r"(flags));
    float acc = (flags & (1u << 30)) ? x : 0.f;
    if (flags & (1u << 28)) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}
