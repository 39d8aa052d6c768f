// Clean with `--secret-param 2`: the true length is a secret kernel parameter; the loop runs
// over the public padded length S_MAX and the length only feeds selects.
#define S_MAX 512
extern "C" __global__ void clean_secret_len(float* o, const float* s, int secret_len) {
    const float NEG_INF = __int_as_float(0xff800000);
    int lane = threadIdx.x & 31;
    float m = NEG_INF, acc = 0.f;
#pragma unroll 1
    for (int j = lane; j < S_MAX; j += 32) {
        float x = s[j];
        float xm = j < secret_len ? x : NEG_INF;
        m = fmaxf(m, xm);
        acc += j < secret_len ? x : 0.f;
    }
    o[threadIdx.x] = m + acc;
}
