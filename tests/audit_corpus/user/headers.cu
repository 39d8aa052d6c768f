// `flashcore audit --source` on a kernel file as users write them: toolkit headers (fp16, bf16,
// cooperative groups, libcu++ barrier), C++ kernels, parameter names. Used by tests/audit_user.rs.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cuda/barrier>

namespace cg = cooperative_groups;

// Clean: fp16 in, scaled, max with a select, fp16 out; one block-wide sync.
__global__ void scale_half(const __half* __restrict__ x, __half* __restrict__ out, float scale,
                           int n) {
    cg::thread_block block = cg::this_thread_block();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? __half2float(x[i]) * scale : 0.f;
    block.sync();
    v = fmaxf(v, 0.f);
    if (i < n) out[i] = __float2half(v);
}

// Clean unless PLANT_LEAK is defined: bf16 → f32 sum, written by a select; with PLANT_LEAK the
// store is skipped for negative sums (a branch on the secret).
__global__ void sum_bf16(const __nv_bfloat16* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = __bfloat162float(x[2 * i]);
    float b = __bfloat162float(x[2 * i + 1]);
    float s = a + b;
#ifdef PLANT_LEAK
    if (s < 0.f) return;  // PLANTED-LEAK-LINE
#endif
    out[i] = s;
}

// Leaky: the loop trip count is the secret length (given by name: --secret-param len).
__global__ void prefix_len(const float* __restrict__ x, float* out, int len) {
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < len; ++k) acc += x[k * 32 + threadIdx.x];
    out[threadIdx.x] = acc;
}

// Leaky: a branch on a bf16 value read from global memory (secret by default).
__global__ void relu_branch(const __nv_bfloat16* x, float* out) {
    float v = __bfloat162float(x[threadIdx.x]);
    if (v > 0.f) {  // BRANCH-LEAK-LINE
        out[threadIdx.x] = v;
    }
}

// Clean: a libcu++ block barrier in shared memory (arrive/wait on public counts).
__global__ void barrier_copy(const float* x, float* out) {
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    __shared__ float tile[128];
    if (threadIdx.x == 0) init(&bar, blockDim.x);
    __syncthreads();
    tile[threadIdx.x] = x[threadIdx.x];
    bar.arrive_and_wait();
    out[threadIdx.x] = tile[127 - threadIdx.x];
}
