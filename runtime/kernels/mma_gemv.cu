// y[M, N] = x[M, K] @ w[N, K]^T for 2 <= M <= 16 decode rows: bf16 in and out, fp32 sums.
// Compiled at run time by NVRTC (mma_gemv.py), one build per set of the macros below.
//
// At 2-16 rows a linear is one pass over its weight, and what sets its time is how many of the
// weight's bytes are in flight, as in the batch-1 GEMV: cuBLAS's and Triton's GEMM tiles stream a
// small matrix at 33-50% of copy bandwidth there (docs/performance.md, rounds 16 and 20). Here each
// warp streams 16 rows of w (GATED: 16 of the gate and the 16 matching of the up) over its share of
// K through a ring of STAGES slots in shared memory (cp.async), so the bytes in flight are bounded by
// shared memory, not registers. With LINES (the engine's default since round 31) a slot holds the rows
// as contiguous segments, each warp-wide copy whole 128-byte lines, and each lane reads its fragments'
// pieces past a __syncwarp; without it each lane copies exactly the 16-byte pieces that make its own
// mma.sync A fragments, 8 rows' half lines a copy, and reads back only what it copied. Both give the
// same products in the same order; whole lines streamed the large weights faster (round 31).
// The decode rows are the B fragment (n = 8 rows a tile), so the tensor cores do the products that
// the CUDA cores could not keep up with at 8 rows (round 18). On the 1.24B Llama, in the step's chain
// under PDL, it beats cuBLAS on q|k|v, o_proj and down_proj (round 22), and its gated build beats cuBLAS
// with the SiLU-mul on gate_up_proj (round 31). The plain build does not beat cuBLAS on the large
// weights, whose thousands of short blocks each pay a ramp and a closing barrier, nor the small-M Triton
// kernel on the LM head: mma_gemv.MAX_WEIGHT keeps plain builds to the small ones, and
// GATED_MAX_WEIGHT lets the gated one take gate_up_proj.
//
// The k order: lane (g, c) = (lane / 4, lane % 4) loads w[row][k0 + 8c, k0 + 8c + 8) and
// x[r][k0 + 8c, ...) of each 32-wide chunk. mma h (0, 1) takes words 2h and 2h + 1 of both as its k
// slots {2c, 2c + 1} and {2c + 8, 2c + 9}, so every slot pairs the same k in A and B, and the sum is
// w . x with its k's in another (fixed) order.
//
// The warps of a block split K; their partial sums meet in shared memory and one warp adds them in
// warp order, so the result does not depend on timing (deterministic). The ring's first STAGES
// slots are requested before griddepcontrol.wait: under programmatic dependent launch the weight
// stream starts while the kernel that writes x still runs. Without that attribute the wait returns
// at once.

#ifndef ROW_TILES
#define ROW_TILES 1  // 8-row tiles of x: 1 for M <= 8, 2 for M <= 16
#endif
#ifndef GATED
#define GATED 0  // w holds 2N rows, gate then up; y = silu(gate) * up
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef UNROLL
#define UNROLL 2  // 32-wide chunks of K in a slot of the ring
#endif
#ifndef STAGES
#define STAGES 4  // slots of the ring: chunks in flight a warp = STAGES * UNROLL
#endif
#ifndef LINES
#define LINES 0  // the ring filled a row segment a lane group: whole 128-byte lines a copy (see below)
#endif
#ifndef ROPE
#define ROPE 0  // q|k|v with RoPE and the KV-cache write in the epilogue (heads of HEAD_DIM, see below)
#endif
#if ROPE && (GATED || !defined(HEAD_DIM) || HEAD_DIM % 16)
#error "ROPE needs HEAD_DIM, a multiple of 16, and no GATED"
#endif

#define SETS (GATED ? 2 : 1)
#define LOADS (2 * SETS)  // w rows a lane copies: g and g + 8 of each set
#define VALUES (SETS * ROW_TILES * 4)
#define SLOT_BYTES (UNROLL * LOADS * 32 * 16)
#if LINES
// LINES: a slot is the group's 16 * SETS rows, each a segment of UNROLL * 64 contiguous bytes; a warp-wide
// copy covers 32 / ROW_LANES whole segments (4 rows of 128 bytes at UNROLL 2), not 8 rows' halves of a
// line, and a lane reads its fragment pieces from the pieces other lanes copied (so a __syncwarp). A
// row's pieces sit at piece ^ SWIZZLE(row): rows 2p and 2p + 1, which a quarter-warp reads together, then
// take different banks.
#define COPIES (UNROLL * LOADS)
#define ROW_LANES (4 * UNROLL)
#define SEGMENT_BYTES (UNROLL * 64)
#define SWIZZLE(row) (UNROLL >= 2 ? ((row) & 1) << 2 : 0)
#if 32 % ROW_LANES
#error "LINES needs UNROLL 1, 2, 4 or 8"
#endif
#endif

#include "ptx.cuh"

// Slot `slot` of the lane's ring: UNROLL chunks from `chunk` on, each of its LOADS rows; chunks at or
// past `hi`, rows past N and k past K become zeros. One commit group a slot, empty or not, so the
// count that cp.async.wait_group keeps stays the same in every lane and every iteration.
__device__ __forceinline__ void request(u32 slot, const u16* const (&rows)[LOADS], const bool (&live)[LOADS],
                                        int chunk, int hi, int K, int c, const u16* any) {
    if (chunk < hi) {  // the same in every lane of the warp
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = (chunk + u) * 32;
            const bool in = chunk + u < hi && k + 8 * c < K;
#pragma unroll
            for (int r = 0; r < LOADS; ++r) {
                const bool on = in && live[r];
                copy_weight(slot + (u * LOADS + r) * 512, on ? rows[r] + k : any, on ? 16 : 0);
            }
        }
    }
    asm volatile("cp.async.commit_group;");
}

#if LINES
// The LINES slot: copy i of lane l takes piece (u, cq) of row `rows[i]`'s segment, whole lines a warp.
__device__ __forceinline__ void request_lines(u32 slot, const u16* const (&rows)[COPIES], const bool (&live)[COPIES],
                                              const u32 (&at)[COPIES], int chunk, int hi, int K, int u, int cq,
                                              const u16* any) {
    if (chunk < hi) {  // the same in every lane of the warp
        const int k = (chunk + u) * 32 + 8 * cq;
        const bool in = chunk + u < hi && k < K;
#pragma unroll
        for (int i = 0; i < COPIES; ++i) {
            const bool on = in && live[i];
            copy_weight(slot + at[i], on ? rows[i] + k : any, on ? 16 : 0);
        }
    }
    asm volatile("cp.async.commit_group;");
}
#endif

// The decode rows' pieces for UNROLL chunks from `chunk` on: the B fragments; zeros past M, K or hi.
__device__ __forceinline__ void load_x(uint4 (&dst)[UNROLL][ROW_TILES], const u16* const (&xrow)[ROW_TILES],
                                       const bool (&xlive)[ROW_TILES], int chunk, int hi, int K, int c) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int k = (chunk + u) * 32;
        const bool in = chunk + u < hi && k + 8 * c < K;
#pragma unroll
        for (int t = 0; t < ROW_TILES; ++t) dst[u][t] = in && xlive[t] ? load_rows(xrow[t] + k) : make_uint4(0, 0, 0, 0);
    }
}

#if ROPE
#define HALF (HEAD_DIM / 2)
// Output row of block blockIdx.x's pair g, its first (hi 0) or second (hi 1) half.
__device__ __forceinline__ int feature(int g, int hi) {
    const int head = blockIdx.x / (HEAD_DIM / 16), i = (blockIdx.x % (HEAD_DIM / 16)) * 8 + g;
    return head * HEAD_DIM + i + hi * HALF;
}

// Warp 0's end of a q|k|v block: each decode row's pair rounded as the projection rounds it, rotated
// and rounded as qkv_rope_cache_kernel rounds it (each product, then their sum), then q stored, or k
// rotated and v as it is written into the paged cache at the row's slot.
__device__ __forceinline__ void rope_epilogue(const float (&partial)[WARPS][VALUES][32], int g, int c, int M,
                                              const u16* bias, u16* q, const long long* positions,
                                              const long long* slots, const float* cos_table,
                                              const float* sin_table, int stride_table, u16* k_cache,
                                              u16* v_cache, int heads, int kv_heads) {
    const int lo = feature(g, 0);
    const int head = lo / HEAD_DIM, i = lo % HEAD_DIM;
    const int lane = g * 4 + c;
#pragma unroll
    for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            // C fragment: elements p and 2 + p of lane (g, c) are rows g and g + 8 (the pair's halves) of
            // decode row 2c + p.
            const int m = 8 * t + 2 * c + p;
            float sum_lo = 0.0f, sum_hi = 0.0f;
            for (int v = 0; v < WARPS; ++v) {
                sum_lo += partial[v][t * 4 + p][lane];
                sum_hi += partial[v][t * 4 + 2 + p][lane];
            }
            if (m >= M) continue;
#if HAS_BIAS
            sum_lo += bf16_to_f32(bias[lo]);
            sum_hi += bf16_to_f32(bias[lo + HALF]);
#endif
            const float a = round_bf16(sum_lo), b = round_bf16(sum_hi);
            if (head >= heads + kv_heads) {  // v: written as projected
                u16* dst = v_cache + slots[m] * kv_heads * HEAD_DIM + (lo - (heads + kv_heads) * HEAD_DIM);
                dst[0] = f32_to_bf16(a);
                dst[HALF] = f32_to_bf16(b);
                continue;
            }
            const long long row = positions[m] * stride_table;
            const float c_lo = round_bf16(cos_table[row + i]), c_hi = round_bf16(cos_table[row + i + HALF]);
            const float s_lo = round_bf16(sin_table[row + i]), s_hi = round_bf16(sin_table[row + i + HALF]);
            const u16 out_lo = f32_to_bf16(round_bf16(a * c_lo) + round_bf16(-b * s_lo));
            const u16 out_hi = f32_to_bf16(round_bf16(b * c_hi) + round_bf16(a * s_hi));
            u16* dst = head < heads ? q + (long long)m * heads * HEAD_DIM + lo
                                    : k_cache + slots[m] * kv_heads * HEAD_DIM + (lo - heads * HEAD_DIM);
            dst[0] = out_lo;
            dst[HALF] = out_hi;
        }
}
#endif

extern "C" __global__ void __launch_bounds__(WARPS * 32)
mma_gemv(const u16* __restrict__ x, const u16* __restrict__ w, const u16* __restrict__ bias, u16* __restrict__ y,
         int M, int N, int K, int stride_x, int stride_w, int stride_y
#if ROPE
         , const long long* __restrict__ positions, const long long* __restrict__ slots,
         const float* __restrict__ cos_table, const float* __restrict__ sin_table, int stride_table,
         u16* __restrict__ k_cache, u16* __restrict__ v_cache, int heads, int kv_heads
#endif
) {
    // [WARPS][STAGES] slots of SLOT_BYTES: LINES, [16 * SETS rows][SEGMENT_BYTES] (pieces swizzled);
    // otherwise [UNROLL][LOADS][32 lanes] of 16 bytes.
    extern __shared__ uint4 ring[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    [[maybe_unused]] const int n0 = blockIdx.x * 16;  // ROPE: feature() instead
    const int chunks = (K + 31) / 32;
    const int per = (chunks + WARPS - 1) / WARPS;
    const int lo = warp * per, hi = min(chunks, lo + per);
    const int groups = hi > lo ? (hi - lo + UNROLL - 1) / UNROLL : 0;

#if LINES
    // Copy i of this lane: row (i * 32 + lane) / ROW_LANES of the slot, piece lane % ROW_LANES of its segment.
    const int piece = lane % ROW_LANES, pu = piece / 4, pc = piece % 4;
    const u16* rows[COPIES];
    bool live[COPIES];
    u32 at[COPIES];
#pragma unroll
    for (int i = 0; i < COPIES; ++i) {
        const int slot_row = (i * 32 + lane) / ROW_LANES, set = slot_row / 16, gr = slot_row % 8, h = (slot_row / 8) % 2;
#if ROPE
        const int n = feature(gr, h);
#else
        const int n = n0 + gr + 8 * h;
#endif
        live[i] = n < N;
        rows[i] = w + (long long)(n + set * N) * stride_w;
        at[i] = slot_row * SEGMENT_BYTES + ((piece ^ SWIZZLE(slot_row)) * 16);
    }
    const u32 mine = shared_address(ring) + warp * (STAGES * SLOT_BYTES);
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
        request_lines(mine + s * SLOT_BYTES, rows, live, at, lo + s * UNROLL, hi, K, pu, pc, w);
#else
    const u16* rows[LOADS];
    bool live[LOADS];
#pragma unroll
    for (int r = 0; r < LOADS; ++r) {
#if ROPE
        // A block's 16 rows are 8 pairs (i, i + HEAD_DIM / 2) of one head, the halves RoPE rotates into
        // each other: lane (g, c) ends with both of pair g for its decode rows.
        const int n = feature(g, r & 1);
#else
        const int n = n0 + g + 8 * (r & 1);
#endif
        live[r] = n < N;
        rows[r] = w + (long long)(n + (r >> 1) * N) * stride_w + 8 * c;
    }
    const u32 mine = shared_address(ring) + warp * (STAGES * SLOT_BYTES) + lane * 16;
#pragma unroll
    for (int s = 0; s < STAGES; ++s) request(mine + s * SLOT_BYTES, rows, live, lo + s * UNROLL, hi, K, c, w);
#endif
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif

    const u16* xrow[ROW_TILES];
    bool xlive[ROW_TILES];
#pragma unroll
    for (int t = 0; t < ROW_TILES; ++t) {
        const int r = 8 * t + g;
        xlive[t] = r < M;
        xrow[t] = x + (long long)r * stride_x + 8 * c;
    }
    float acc[SETS][ROW_TILES][4] = {};
    // x as far ahead as w: a register ring beside the shared one, indexed by the same (unrolled) slot,
    // so no group waits on a trip to L2 for x that the ring already made for w.
    uint4 xv[STAGES][UNROLL][ROW_TILES];
#pragma unroll
    for (int s = 0; s < STAGES; ++s) load_x(xv[s], xrow, xlive, lo + s * UNROLL, hi, K, c);
    for (int i0 = 0; i0 < groups; i0 += STAGES) {
#pragma unroll
        for (int j = 0; j < STAGES; ++j) {
            const int i = i0 + j;
            if (i >= groups) break;  // the same in every lane of the warp
            const int base = lo + i * UNROLL;
            asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1));
            const u32 slot = mine + j * SLOT_BYTES;
            uint4 wv[UNROLL][LOADS];
#if LINES
            __syncwarp();  // the slot's pieces came from every lane's copies
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int r = 0; r < LOADS; ++r) {
                    const int slot_row = 16 * (r >> 1) + 8 * (r & 1) + g;
                    wv[u][r] = load_shared(slot + slot_row * SEGMENT_BYTES + (((4 * u + c) ^ SWIZZLE(g)) * 16));
                }
#else
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int r = 0; r < LOADS; ++r) wv[u][r] = load_shared(slot + (u * LOADS + r) * 512);
#endif
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
                    for (int s = 0; s < SETS; ++s) {
                        const uint4 lo8 = wv[u][2 * s], hi8 = wv[u][2 * s + 1], b = xv[j][u][t];
                        mma(acc[s][t], lo8.x, hi8.x, lo8.y, hi8.y, b.x, b.y);
                        mma(acc[s][t], lo8.z, hi8.z, lo8.w, hi8.w, b.z, b.w);
                    }
            // Both slots are read (their values went into the products above): refill them STAGES
            // groups ahead.
#if LINES
            __syncwarp();  // every lane's reads of the slot are done
            request_lines(slot, rows, live, at, base + STAGES * UNROLL, hi, K, pu, pc, w);
#else
            request(slot, rows, live, base + STAGES * UNROLL, hi, K, c, w);
#endif
            load_x(xv[j], xrow, xlive, base + STAGES * UNROLL, hi, K, c);
        }
    }
    asm volatile("cp.async.wait_all;");

    // [warp][value][lane]: a warp's 32 lanes write 32 consecutive words (no bank conflicts).
    __shared__ float partial[WARPS][VALUES][32];
#pragma unroll
    for (int s = 0; s < SETS; ++s)
#pragma unroll
        for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) partial[warp][(s * ROW_TILES + t) * 4 + e][lane] = acc[s][t][e];
    __syncthreads();
    if (warp != 0) return;
#if ROPE
    rope_epilogue(partial, g, c, M, bias, y, positions, slots, cos_table, sin_table, stride_table, k_cache,
                  v_cache, heads, kv_heads);
#else
#pragma unroll
    for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            // C fragment: element e of lane (g, c) is output row g (+8 for e >= 2), decode row 2c (+1 if odd).
            const int n = n0 + g + 8 * (e >> 1), m = 8 * t + 2 * c + (e & 1);
            float sum[SETS];
#pragma unroll
            for (int s = 0; s < SETS; ++s) {
                sum[s] = 0.0f;
                for (int v = 0; v < WARPS; ++v) sum[s] += partial[v][(s * ROW_TILES + t) * 4 + e][lane];
            }
            if (n >= N || m >= M) continue;
            float out = sum[0];
#if HAS_BIAS
            out += bf16_to_f32(bias[n]);
#endif
#if GATED
            // Rounded as the GEMV's gated epilogue and the silu_mul kernel round it.
            const float gate = round_bf16(out);
            const float act = round_bf16(gate / (1.0f + __expf(-gate)));
            out = act * round_bf16(sum[1]);
#endif
            y[(long long)m * stride_y + n] = f32_to_bf16(out);
        }
#endif
}
