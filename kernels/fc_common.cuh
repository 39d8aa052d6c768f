// Basic types and helpers shared by every kernel header. No CUDA toolkit headers: NVRTC gets
// these sources in memory, so the kernels build anywhere libnvrtc does.
#pragma once

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;

#define FC_DEVICE __device__ __forceinline__

// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-byte aligned.
struct __align__(64) TensorMap {
    uint64_t opaque[16];
};

// Shared-memory address (the 32-bit window the async proxy and mbarriers use).
FC_DEVICE uint32_t smem_u32(const void* p) {
    uint32_t r;
    asm volatile("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(r) : "l"(p));
    return r;
}

// n / d for 0 <= n, d < 2^31 by a multiply and a shift the host computed for d (a page size:
// public): `mul` = floor(2^32 · (2^shift − d) / d) + 1 with shift = ceil(log2 d) (`page_divisor`
// in src/attention/launch.rs, which tests the identity). A fixed sequence: no slow path.
FC_DEVICE int page_div(int n, uint32_t mul, int shift) {
    return (int)((__umulhi((uint32_t)n, mul) + (uint32_t)n) >> shift);
}

// A value the compiler must recompute where it is used rather than hold in a register.
FC_DEVICE int opaque_int(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

FC_DEVICE float neg_inf() { return __int_as_float(0xff800000); }

// 2^x on the SFU (MUFU.EX2): fixed latency, no data-dependent path; exp2(-inf) = 0.
FC_DEVICE float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// log2(x) on the SFU (MUFU.LG2).
FC_DEVICE float fast_log2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 1/x on the SFU (MUFU.RCP): the approximate instruction, never the IEEE slow path.
FC_DEVICE float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) = 1 − 2 / (2^(2x·log2 e) + 1): two SFU ops (MUFU.EX2, MUFU.RCP), fixed latency, no
// branch; saturates to ±1 (ex2 gives inf or 0, rcp.approx(inf) = 0). Its absolute error is a few
// ulp of 1, where tanh.approx.f32's 2^-11 relative error would move a softcapped logit of 50 by
// 0.02.
FC_DEVICE float fast_tanh(float x) {
    const float e = fast_exp2(x * 2.88539008177792681f);
    return fmaf(-2.0f, fast_rcp(e + 1.0f), 1.0f);
}

// Branch-free select, written so the compiler keeps it a SEL/FSEL.
FC_DEVICE float select_f(bool c, float a, float b) { return c ? a : b; }

// Two floats → one packed 16-bit pair (lo in the low half), round to nearest.
FC_DEVICE uint32_t pack_f16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FC_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Named barriers (ids 1..15; 0 is __syncthreads): `sync` waits for `count` threads to arrive,
// `arrive` signals without waiting. Used to order the two consumer warpgroups' GEMM issue.
FC_DEVICE void named_bar_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
FC_DEVICE void named_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// Generic-proxy shared-memory writes made visible to the async proxy (wgmma and TMA operands).
FC_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// 16-byte shared-memory accesses the compiler keeps exactly as written (no store elided or
// guarded by a predicate it derived from the stored value).
FC_DEVICE void ld_shared_v4(uint32_t addr, uint32_t (&v)[4]) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr)
                 : "memory");
}
FC_DEVICE void st_shared_v4(uint32_t addr, const uint32_t (&v)[4]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}

// Hardware thread/warp indices, uniform per warp where it matters.
// n / d for 0 <= n < 2^31 from the host's multiplier and shift for d (mul = 0: d = 1): a
// multiply-high and a shift where an integer division is a ~20-instruction sequence.
FC_DEVICE int fast_div(int n, uint32_t mul, int shift) {
    return mul == 0 ? n : (int)(__umulhi((uint32_t)n, mul) >> shift);
}

FC_DEVICE int warp_id_in_block() { return threadIdx.x / 32; }
FC_DEVICE int lane_id() { return threadIdx.x % 32; }
