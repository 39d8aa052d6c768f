// Planted leaks, second set: memory-side and latency-side sinks that the first corpus does not
// reach — local-memory spills, ldmatrix / cp.async / TMA with secret coordinates, barrier counts
// and ids, nanosleep, integer and floating slow paths, float→int indices, early exits in loops,
// __noinline__ calls, indirect branches, min/max/SEL/PRMT bounds, predicated stores, constant
// indices. Every kernel must be flagged (tests/audit_corpus.rs); SECURITY.md says why.

// A local array indexed by a public loop variable lives in local memory (STL/LDL): a secret
// written there and read back drives a branch.
extern "C" __global__ void leak_local_roundtrip(float* o, const float* a, const float* b, int k) {
    float buf[32];
    int i = threadIdx.x;
#pragma unroll 1
    for (int j = 0; j < 32; ++j) buf[j] = a[i * 32 + j];
    float acc = 0.f;
    if (buf[k & 31] > 0.f) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    o[i] = acc;
}

// ldmatrix at a secret row address.
extern "C" __global__ void leak_ldmatrix_addr(unsigned* o, const int* a) {
    __shared__ __align__(16) unsigned short s[64 * 8];
    int i = threadIdx.x;
    for (int j = i; j < 64 * 8; j += blockDim.x) s[j] = (unsigned short)j;
    __syncthreads();
    int row = a[i] & 63;
    unsigned addr = (unsigned)__cvta_generic_to_shared(&s[row * 8]);
    unsigned r0;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r0) : "r"(addr));
    o[i] = r0;
}

// cp.async (LDGSTS) from a secret global address.
extern "C" __global__ void leak_cp_async_addr(float* o, const float* a, const int* idx) {
    __shared__ __align__(16) float s[128];
    int i = threadIdx.x;
    const float* src = a + (idx[i] & 1023);
    unsigned dst = (unsigned)__cvta_generic_to_shared(&s[i]);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src));
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    o[i] = s[i];
}

// A TMA tile load whose coordinate is secret.
extern "C" __global__ void leak_tma_coord(const __grid_constant__ unsigned long long tmap[16],
                                          float* o, const int* a) {
    __shared__ __align__(128) float tile[32 * 32];
    __shared__ __align__(8) unsigned long long bar;
    int i = threadIdx.x;
    unsigned sbar = (unsigned)__cvta_generic_to_shared(&bar);
    if (i == 0) asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(sbar));
    __syncthreads();
    int x = a[0] & 255;
    if (i == 0) {
        unsigned dst = (unsigned)__cvta_generic_to_shared(tile);
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], 4096;" :: "r"(sbar));
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
            " [%0], [%1, {%2, %3}], [%4];"
            :: "r"(dst), "l"(tmap), "r"(x), "r"(0), "r"(sbar) : "memory");
    }
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], 0; @!p bra W; }"
        :: "r"(sbar));
    o[i] = tile[i];
}

// bar.sync with a secret thread count.
extern "C" __global__ void leak_bar_count(float* o, const int* a) {
    int i = threadIdx.x;
    int n = (a[0] & 3) * 32 + 32;
    asm volatile("bar.sync 1, %0;" :: "r"(n));
    o[i] = 1.f;
}

// A named barrier whose id is secret.
extern "C" __global__ void leak_bar_id(float* o, const int* a) {
    int i = threadIdx.x;
    int id = (a[0] & 3) + 1;
    asm volatile("bar.sync %0, 128;" :: "r"(id));
    o[i] = 1.f;
}

// A barrier reached only when a secret holds (divergent __syncthreads).
extern "C" __global__ void leak_bar_divergent(float* o, const float* a) {
    int i = threadIdx.x;
    if (a[i] > 0.f) __syncthreads();
    o[i] = 1.f;
}

// nanosleep for a secret duration.
extern "C" __global__ void leak_nanosleep(float* o, const unsigned* a) {
    int i = threadIdx.x;
    __nanosleep(a[i] & 1023u);
    o[i] = 1.f;
}

// A shuffle whose member mask is secret: ptxas emits `WARPSYNC Rmask` before it (a plain
// `__syncwarp(mask)` in converged code is dropped as a no-op).
extern "C" __global__ void leak_warpsync_mask(float* o, const unsigned* a, const float* b) {
    int i = threadIdx.x;
    unsigned m = a[0] | 1u;
    float v = b[i];
    if (i & 1) v = __shfl_sync(m, v, 0);
    o[i] = v;
}

// 64-bit integer modulo of a secret (compiler slow-path routine).
extern "C" __global__ void leak_rem64(long long* o, const long long* a, long long d) {
    int i = threadIdx.x;
    o[i] = a[i] % d;
}

// IEEE (round-to-nearest) reciprocal of a secret: MUFU.RCP with a slow-path fix-up.
extern "C" __global__ void leak_ieee_rcp(float* o, const float* a) {
    int i = threadIdx.x;
    o[i] = __frcp_rn(a[i]);
}

// Double-precision division of secrets (slow path for hard operands).
extern "C" __global__ void leak_ieee_ddiv(double* o, const double* a, const double* b) {
    int i = threadIdx.x;
    o[i] = a[i] / b[i];
}

// Double-precision sqrt of a secret.
extern "C" __global__ void leak_ieee_dsqrt(double* o, const double* a) {
    int i = threadIdx.x;
    o[i] = sqrt(a[i]);
}

// A float converted to an int (F2I) used as a table index.
extern "C" __global__ void leak_f2i_index(float* o, const float* a, const float* table) {
    int i = threadIdx.x;
    int k = (int)(a[i] * 16.f);
    o[i] = table[k & 255];
}

// An early return inside a loop, on a secret.
extern "C" __global__ void leak_exit_in_loop(float* o, const float* a, int n) {
    int i = threadIdx.x;
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < n; ++k) {
        float x = a[k * 32 + i];
        if (x < 0.f) return;
        acc += x;
    }
    o[i] = acc;
}

// A break out of a loop on a secret (the trip count becomes secret).
extern "C" __global__ void leak_break_in_loop(float* o, const float* a, int n) {
    int i = threadIdx.x;
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < n; ++k) {
        float x = a[k * 32 + i];
        if (x < 0.f) break;
        acc += x;
    }
    o[i] = acc;
}

// A __noinline__ callee branches on its (secret) argument: the argument arrives in an ABI
// register, the branch is inside the callee.
__device__ __noinline__ float callee_branches(float x, const float* b) {
    float acc = 0.f;
    if (x > 0.f) {
#pragma unroll 1
        for (int j = 0; j < 16; ++j) acc = acc * 0.5f + b[j];
    }
    return acc;
}
extern "C" __global__ void leak_noinline_arg_branch(float* o, const float* a, const float* b) {
    int i = threadIdx.x;
    o[i] = callee_branches(a[i], b);
}

// A __noinline__ callee returns a secret (in the ABI return register) that the caller uses as
// an address.
__device__ __noinline__ int callee_loads(const int* a, int i) { return a[i] & 255; }
extern "C" __global__ void leak_noinline_return_index(float* o, const int* a, const float* t) {
    int i = threadIdx.x;
    o[i] = t[callee_loads(a, i)];
}

// A secret kept live across a __noinline__ call (in a call-saved register, or saved on the
// stack by the callee) and used as an address after the call returns.
__device__ __noinline__ float callee_busy(const float* b, int i) {
    float x = b[i], y = b[i + 1], z = b[i + 2], w = b[i + 3];
    return x * y + z * w;
}
extern "C" __global__ void leak_noinline_saved_reg(float* o, const int* a, const float* b,
                                                   const float* t) {
    int i = threadIdx.x;
    int k = a[i] & 255;
    float r = callee_busy(b, i);
    o[i] = r + t[k];
}

// A call through a function pointer chosen by a secret (indirect CALL through a register).
__device__ __noinline__ float f_even(float x) { return x * 2.f; }
__device__ __noinline__ float f_odd(float x) { return x + 3.f; }
extern "C" __global__ void leak_indirect_call(float* o, const int* a, const float* b) {
    int i = threadIdx.x;
    float (*volatile fp)(float) = (a[i] & 1) ? f_odd : f_even;
    o[i] = fp(b[i]);
}

// An indirect branch through a jump table indexed by a secret (BRX). NVRTC lowers C switches
// to compare-and-branch trees, so the jump table is written in PTX (`brx.idx`).
extern "C" __global__ void leak_switch_brx(float* o, const int* a) {
    int i = threadIdx.x;
    int k = a[i] & 1;
    float r;
    asm volatile("{\n\t.reg .u32 idx;\n\tmov.u32 idx, %1;\n"
                 "\tts: .branchtargets L0, L1;\n"
                 "\tbrx.idx idx, ts;\n"
                 "L0:\n\tmov.f32 %0, 0f3F800000;\n\tbra.uni Ld;\n"
                 "L1:\n\tmov.f32 %0, 0f40000000;\n\tbra.uni Ld;\n"
                 "Ld:\n}" : "=f"(r) : "r"(k));
    o[i] = r;
}

// min() of a public bound and a secret as a loop bound.
extern "C" __global__ void leak_min_bound(float* o, const int* a, const float* b, int n) {
    int i = threadIdx.x;
    int hi = min(n, a[i]);
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < hi; ++k) acc = acc * 0.5f + b[k];
    o[i] = acc;
}

// A select between two public bounds on a secret condition, as a loop bound.
extern "C" __global__ void leak_sel_bound(float* o, const float* a, const float* b, int n, int m) {
    int i = threadIdx.x;
    int hi = a[i] > 0.f ? n : m;
    float acc = 0.f;
#pragma unroll 1
    for (int k = 0; k < hi; ++k) acc = acc * 0.5f + b[k];
    o[i] = acc;
}

// A byte of a secret extracted with PRMT (__byte_perm) used as an address.
extern "C" __global__ void leak_prmt_index(float* o, const unsigned* a, const float* table) {
    int i = threadIdx.x;
    unsigned k = __byte_perm(a[i], 0u, 0x4441u);
    o[i] = table[k];
}

// A shared-memory store at a public address, predicated on a secret (the store happens or not:
// shared-memory traffic and bank conflicts depend on the secret).
extern "C" __global__ void leak_pred_sts(float* o, const float* a) {
    __shared__ float s[256];
    int i = threadIdx.x;
    s[i] = 0.f;
    __syncthreads();
    if (a[i] > 0.f) s[(i * 7) & 255] = 1.f;
    __syncthreads();
    o[i] = s[i];
}

// __constant__ memory indexed by a secret.
__constant__ float ctable[256];
extern "C" __global__ void leak_const_index(float* o, const int* a) {
    int i = threadIdx.x;
    o[i] = ctable[a[i] & 255];
}

// printf of a secret: vprintf is code outside the kernel whose running time depends on what it
// formats (the number of digits).
extern "C" __global__ void leak_printf_secret(const float* a) {
    printf("%f\n", a[threadIdx.x]);
}

// malloc of a secret size: the allocator's work depends on the size.
extern "C" __global__ void leak_malloc_size(float* o, const int* a) {
    float* p = (float*)malloc(a[threadIdx.x] & 255);
    o[threadIdx.x] = p ? 1.f : 0.f;
    free(p);
}

// A trap taken on a secret (the kernel aborts or not).
extern "C" __global__ void leak_trap(float* o, const float* a) {
    if (a[threadIdx.x] < 0.f) __trap();
    o[threadIdx.x] = 1.f;
}

// A texture fetch at a secret coordinate.
extern "C" __global__ void leak_tex_coord(float* o, unsigned long long tex, const int* a) {
    o[threadIdx.x] = tex1Dfetch<float>(tex, a[threadIdx.x]);
}

// A bulk copy (cp.async.bulk, UBLKCP) of a secret number of bytes: the traffic is secret (and
// so is the mbarrier's expected transaction count).
extern "C" __global__ void leak_bulk_copy_size(float* o, const float* a, const int* n) {
    __shared__ __align__(128) float tile[1024];
    __shared__ __align__(8) unsigned long long bar;
    int i = threadIdx.x;
    unsigned sbar = (unsigned)__cvta_generic_to_shared(&bar);
    if (i == 0) asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(sbar));
    __syncthreads();
    unsigned bytes = ((unsigned)n[0] & 15u) * 16u + 16u;
    if (i == 0) {
        unsigned dst = (unsigned)__cvta_generic_to_shared(tile);
        asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(sbar), "r"(bytes));
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
            :: "r"(dst), "l"(a), "r"(bytes), "r"(sbar) : "memory");
    }
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared.b64 p, [%0], 0; @!p bra W; }"
        :: "r"(sbar));
    o[i] = tile[i];
}

// Distributed shared memory: a load from the shared memory of the cluster CTA whose rank is
// secret (mapa with a secret rank).
extern "C" __global__ void __cluster_dims__(2, 1, 1) leak_dsmem_rank(float* o, const int* a) {
    __shared__ float s[32];
    int i = threadIdx.x;
    s[i & 31] = (float)i;
    asm volatile("barrier.cluster.arrive; barrier.cluster.wait;");
    unsigned local = (unsigned)__cvta_generic_to_shared(&s[i & 31]);
    unsigned remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(a[0] & 1));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote));
    o[i] = v;
    asm volatile("barrier.cluster.arrive; barrier.cluster.wait;");
}

// One thread spins on a shared flag that another warp sets only when a secret holds: the spin's
// length (and whether it ends) follows the secret.
extern "C" __global__ void leak_smem_flag_spin(float* o, const float* a) {
    __shared__ volatile int flag;
    int i = threadIdx.x;
    if (i == 0) flag = 0;
    __syncthreads();
    if (i == 32 && a[0] > 0.f) flag = 1;
    if (i == 0) {
        while (flag == 0) {
        }
    }
    o[i] = 1.f;
}
