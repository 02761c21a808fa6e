// The inline PTX that mma_gemv.cu and mlp_block.cu share: global and shared loads, cp.async copies, the
// bf16 mma.sync, bf16 rounding. NVRTC finds it through nvrtc.kernel's --include-path, nvcc beside the file.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

// Written by this launch or the kernel before it: read from L2 (after the wait), never through the
// non-coherent path, which may hold lines from before the writer wrote them.
__device__ __forceinline__ uint4 load_rows(const u16* p) {
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// 16 bytes into shared memory, past L1.
__device__ __forceinline__ void copy_weight(u32 dst, const u16* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

// The same, where `bytes` 0 writes zeros and reads nothing.
__device__ __forceinline__ void copy_weight(u32 dst, const u16* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void store_shared(u32 dst, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

__device__ __forceinline__ uint4 load_shared(u32 src) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src));
    return v;
}

__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// d += a . b on the tensor cores: a the 16 x 16 bf16 A fragment, b the 16 x 8 B fragment, fp32 sums.
__device__ __forceinline__ void mma(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
