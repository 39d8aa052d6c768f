// Rule 1 with `--secret-param 2`: a secret kernel parameter (a true sequence length) used as a
// loop bound. Audited with parameter ordinal 2 declared secret.
extern "C" __global__ void leak_secret_param_loop(float* o, const float* a, int secret_len) {
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < secret_len; ++k) acc += a[k * 32 + threadIdx.x];
    o[threadIdx.x] = acc;
}
