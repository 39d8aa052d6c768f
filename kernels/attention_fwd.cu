// Placeholder forward kernel; the wgmma + TMA kernel replaces it.
#include "fc_common.cuh"
extern "C" __global__ void flashcore_attention_fwd(float* o) { o[threadIdx.x] = 0.0f; }
