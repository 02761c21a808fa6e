// Pull up to RANGES byte ranges of global memory into L2, front to back: a hint, with no result.
// Compiled at run time by NVRTC (l2_prefetch.py) for sm_90 and newer.
//
// A decode step leaves HBM idle while attention, the norms and RoPE run (short contexts read little
// KV), then streams the next projection's weight from a cold start. This kernel runs beside them on a
// side branch of the step's graph and asks the copy engine of each SM (cp.async.bulk.prefetch) for the
// weights read next. It holds no shared memory and one warp a block, so it finds room beside the step's
// kernels, and it ends once the requests are issued: nothing waits on it.
//
// Lane l of the grid takes pieces l, l + lanes, ... of each range in turn, so the front of every range
// is asked for first, as the linears read it.

#ifndef PIECE
#define PIECE 4096  // bytes a request; a multiple of 16
#endif
#define RANGES 4

typedef unsigned long long u64;

extern "C" __global__ void __launch_bounds__(32) l2_prefetch(
    const char* a0, u64 n0, const char* a1, u64 n1, const char* a2, u64 n2, const char* a3, u64 n3) {
    const char* bases[RANGES] = {a0, a1, a2, a3};
    const u64 sizes[RANGES] = {n0, n1, n2, n3};
    const u64 lane = (u64)blockIdx.x * 32 + threadIdx.x;
    const u64 lanes = (u64)gridDim.x * 32;
#pragma unroll
    for (int r = 0; r < RANGES; ++r) {
        for (u64 at = lane * PIECE; at < sizes[r]; at += lanes * PIECE) {
            // sizes are multiples of 16 (l2_prefetch.plan), so every request is too
            const unsigned bytes = (unsigned)(sizes[r] - at < PIECE ? sizes[r] - at : PIECE);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(bases[r] + at), "r"(bytes) : "memory");
        }
    }
}
