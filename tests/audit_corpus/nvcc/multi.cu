// A small multi-kernel file with host code (which NVRTC cannot compile: build with nvcc).
// multi.fatbin beside it is `nvcc -fatbin` of this file (README.md has the command); it is what
// tests/audit_user.rs audits with --cubin on machines without nvcc, and
// scripts/audit-nvcc-device.sh rebuilds it with nvcc and compares with NVRTC's verdicts.
#include <cuda_fp16.h>

#ifndef NO_HOST_CODE
#include <cstdio>
#endif

// Clean: fp16 in, scaled, clamped by a select, f32 out.
extern "C" __global__ void clean_scale(const __half* x, float* out, float scale, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? __half2float(x[i]) * scale : 0.f;
    if (i < n) out[i] = fminf(v, 1.f);
}

// Leaky: a branch on a value read from global memory.
extern "C" __global__ void leak_branch(const __half* x, float* out) {
    float v = __half2float(x[threadIdx.x]);
    if (v > 0.f) {  // LEAK-LINE
        out[threadIdx.x] = v;
    }
}

// Clean unless its length parameter is declared secret (--secret-param len or 2).
extern "C" __global__ void sum_len(const float* x, float* out, int len) {
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < len; ++k) acc += x[k * 32 + threadIdx.x];
    out[threadIdx.x] = acc;
}

#ifndef NO_HOST_CODE
int main() {
    float* out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    leak_branch<<<1, 32>>>(nullptr, out);
    printf("%d\n", (int)cudaDeviceSynchronize());
    return 0;
}
#endif
