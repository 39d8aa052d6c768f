// Clean: warp-specialised TMA producer + wgmma consumer, mbarrier waits, setmaxnreg,
// named barriers, exp2 softmax over the accumulators with FMNMX/SHFL reductions.
typedef unsigned int u32;
typedef unsigned long long u64;
struct __align__(64) TMap { u64 o[16]; };

__device__ __forceinline__ u32 sa(const void* p) {
    u32 r;
    asm volatile("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 phase) {
    asm volatile("{\n.reg .pred done;\nW_%=:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n@!done bra W_%=;\n}\n" ::"r"(bar), "r"(phase) : "memory");
}
__device__ __forceinline__ float ex2(float x) { float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }

extern "C" __global__ void __launch_bounds__(384, 1)
clean_tma_wgmma(const __grid_constant__ TMap tq, float* out, int n_blocks) {
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 full[2], empty[2];
    int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(&full[s])), "r"(1));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(&empty[s])), "r"(256));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            for (int b = 0; b < n_blocks; ++b) {
                int s = b & 1;
                if (b >= 2) mbar_wait(sa(&empty[s]), ((b / 2) - 1) & 1);
                asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&full[s])), "r"(16384) : "memory");
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
                    ::"r"(sa(smem + s * 16384)), "l"(&tq), "r"(sa(&full[s])), "r"(0), "r"(b * 64) : "memory");
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        float d[32];
        for (int i = 0; i < 32; ++i) d[i] = 0.f;
        float m = -1e30f, l = 0.f;
        for (int b = 0; b < n_blocks; ++b) {
            int s = b & 1;
            mbar_wait(sa(&full[s]), (b / 2) & 1);
            u64 da = (u64)((sa(smem + s * 16384) & 0x3FFFF) >> 4) | (1ull << 62);
            u64 db = da + 512;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            asm volatile(
                "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                : "l"(da), "l"(db), "r"(0));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
            float mx = m;
            for (int i = 0; i < 32; ++i) mx = fmaxf(mx, d[i]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            float corr = ex2(m - mx);
            l *= corr;
            for (int i = 0; i < 32; ++i) { d[i] = ex2(d[i] - mx); l += d[i]; }
            m = mx;
            asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(sa(&empty[s])) : "memory");
            asm volatile("bar.sync 1, 256;" ::: "memory");
        }
        float acc = l;
        for (int i = 0; i < 32; ++i) acc += d[i];
        out[threadIdx.x] = acc;
    }
}
