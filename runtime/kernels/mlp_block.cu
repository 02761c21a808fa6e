// A decoder layer's second half for 1-8 (ROW_TILES 2: 16) decode rows in one persistent launch:
//
//   o        = attn @ wo^T                      phase 0: wo [H, Q]
//   summed   = o + residual                     (written to residual_out: the layer's new residual)
//   act      = silu(gate) * up of rms_norm(summed) @ wgu^T    phase 1: wgu [2I, H], gate rows then up
//   out      = act @ wd^T                       phase 2: wd [H, I]
//
// Compiled at run time by NVRTC (mlp_block.py). Why one launch: at these rows each linear is one pass
// over its weight, and the five launches it replaces (o_proj, the norm, gate_up, the SiLU-mul,
// down_proj) each pay a ramp while their first bytes arrive and a tail while their last blocks finish
// (docs/performance.md, rounds 21, 25 and 29: neither an L2 prefetch nor a norm in a prologue removed
// it). Here one block an SM streams every weight of the three phases through one ring that never
// drains: the requests for the next phase's weights go out while this phase's last products run, since
// weights depend on nothing the phase computes. Only the activations wait, on a grid barrier between
// phases (all blocks are resident: one block an SM, grid = SM count).
//
// Each warp streams 16 rows of a weight (the gated phase: 16 of the gate and the 16 matching of the up)
// over its share of K into its slots of the ring (cp.async), as mma_gemv.cu does: with LINES whole lines a
// copy, without it each lane (g, c) copying exactly the 16-byte pieces of its own mma.sync A fragments.
// The decode rows' pieces (the B fragments) are per lane in either, in the same slot and the same commit
// group, so they are as far ahead as the weights.
// A slot is 8 weight pieces a lane (4 chunks of 32 columns by 2 rows, or in the gated phase 2 chunks by 4
// rows) and 4 x pieces a row tile. The loop runs one body with the slot an index: round 30's first build
// kept x in registers, which needs the loop unrolled over the slots, and its 165 KB of code ran the H100's
// instruction cache dry (bench/mlp_block.py: the deeper the ring, the slower). The warps' partial sums of a tile meet in
// shared memory and warp 0 adds them in warp order, so no result depends on timing or on the rows beside
// it (deterministic).
//
// The norm: phase 0's tiles write each row's sum of squares over their 16 columns; after the barrier every
// block adds the tiles' sums in tile order. Phase 1's B fragments are summed * norm weight (rounded to
// bf16), and 1/rms scales the products in the epilogue: the same value as the norm applied first, rounded
// in another place.
//
// Needs (mlp_block.fits): every warp's share of K whole groups (Q and I multiples of 128 a warp, H of 64),
// contiguous rows, no o_proj bias.

#ifndef ROW_TILES
#define ROW_TILES 1  // 8-row tiles of the decode rows: 1 for M <= 8, 2 for M <= 16
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef STAGES
#define STAGES 4  // slots of a warp's ring
#endif
#ifndef LINES
#define LINES 0  // the weights copied whole lines a warp-wide copy (see request)
#endif
#define PIECES 8  // 16-byte weight pieces a lane copies into a slot
#define X_PIECES (4 * ROW_TILES)  // and its x pieces: 4 chunks (gated: 2) of each row tile
#define SLOT_BYTES ((PIECES + X_PIECES) * 32 * 16)
#define PHASES 3
#if WARPS < 8
#error "the 1/rms sums take 256 threads"
#endif

#include "ptx.cuh"

__device__ __forceinline__ uint4 load_constant(const u16* p) {  // the norm weight: never written
    uint4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// 16 bytes of x, or zeros (nothing read) for a row past M.
__device__ __forceinline__ void copy_x(u32 dst, const u16* src, bool live) { copy_weight(dst, src, live ? 16 : 0); }

// Two bf16 products of a word of x and a word of the norm weight, each rounded to bf16, packed.
__device__ __forceinline__ u32 scale_pair(u32 x, u32 w) {
    const float lo = __uint_as_float(x << 16) * __uint_as_float(w << 16);
    const float hi = __uint_as_float(x & 0xffff0000u) * __uint_as_float(w & 0xffff0000u);
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

struct Dims {
    int M, Q, H, I;
};

__device__ __forceinline__ int tiles_of(const Dims& d, int p) { return (p == 1 ? d.I : d.H) / 16; }
__device__ __forceinline__ int k_of(const Dims& d, int p) { return p == 0 ? d.Q : p == 1 ? d.H : d.I; }
// Chunks of 32 columns a warp streams of each tile, and groups (slots) they make: 4 chunks a slot, 2 gated.
__device__ __forceinline__ int groups_of(const Dims& d, int p) { return k_of(d, p) / 32 / WARPS / (p == 1 ? 2 : 4); }

// Where a block is in its stream: phase p (PHASES: done), the tile, the group of this warp's share of it.
// The same in every warp of the block.
struct Cursor {
    int p, tile, group;
};

__device__ __forceinline__ void skip_empty(Cursor& c, const Dims& d) {
    while (c.p < PHASES && c.tile >= tiles_of(d, c.p)) {
        ++c.p;
        c.tile = blockIdx.x;
    }
}

__device__ __forceinline__ Cursor first(const Dims& d) {
    Cursor c{0, (int)blockIdx.x, 0};
    skip_empty(c, d);
    return c;
}

__device__ __forceinline__ void advance(Cursor& c, const Dims& d) {
    if (++c.group < groups_of(d, c.p)) return;
    c.group = 0;
    c.tile += gridDim.x;
    skip_empty(c, d);
}

// First column of the group's first chunk that lane (g, c) reads.
__device__ __forceinline__ int column(const Cursor& cur, const Dims& d, int warp, int c) {
    const int per = k_of(d, cur.p) / 32 / WARPS;  // chunks a warp
    return (warp * per + cur.group * (cur.p == 1 ? 2 : 4)) * 32 + 8 * c;
}

// Where the x pieces of a group start: decode row 8t + g of attn (phase 0), summed (1) or act (2), at the
// lane's columns of chunk 0.
__device__ __forceinline__ const u16* x_row(const Cursor& cur, const Dims& d, const u16* attn, const u16* summed,
                                            const u16* act, int t, int g, int k) {
    const u16* base = cur.p == 0 ? attn : cur.p == 1 ? summed : act;
    return base + (long long)(8 * t + g) * k_of(d, cur.p) + k;
}

// The group's weight pieces into the lane's slot, and with `with_x` its x pieces (chunk u of row tile t at
// piece PIECES + u * ROW_TILES + t): one commit group a call, empty past the end, so the count
// cp.async.wait_group keeps is the same in every lane and every step.
__device__ __forceinline__ void request(u32 slot, const Cursor& cur, const Dims& d, const u16* wo, const u16* wgu,
                                        const u16* wd, const u16* attn, const u16* summed, const u16* act,
                                        bool with_x, int warp, int g, int c) {
    if (cur.p < PHASES) {
        const int k = column(cur, d, warp, c);
        const int chunks = cur.p == 1 ? 2 : 4;
#if LINES
        // The slot's weights as rows of contiguous bytes, a warp-wide copy covering whole 128-byte lines (2
        // rows of 256 bytes, or in the gated phase 4 of 128), not 8 rows' half lines. A lane's fragment
        // pieces then come from other lanes' copies (multiply's __syncwarp). Piece q of a row sits at
        // q ^ 4 * (row & 1): rows g and g + 1, which a quarter-warp reads together, take different banks.
        const int lane = 4 * g + c, k0 = column(cur, d, warp, 0);
        const u32 wslot = slot - lane * 16;
        if (cur.p == 1) {  // 32 rows of 128 bytes: the gate's 16, then the up's
            const int piece = lane & 7, kk = k0 + (piece >> 2) * 32 + 8 * (piece & 3);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int row = 4 * i + (lane >> 3);
                const long long w_row = cur.tile * 16 + (row & 15) + (long long)(row >> 4) * d.I;
                copy_weight(wslot + row * 128 + ((piece ^ ((row & 1) << 2)) * 16), wgu + w_row * d.H + kk);
            }
        } else {  // 16 rows of 256 bytes
            const int K = k_of(d, cur.p), piece = lane & 15, kk = k0 + (piece >> 2) * 32 + 8 * (piece & 3);
            const u16* base = (cur.p == 0 ? wo : wd) + (long long)cur.tile * 16 * K + kk;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int row = 2 * i + (lane >> 4);
                copy_weight(wslot + row * 256 + ((piece ^ ((row & 1) << 2)) * 16), base + row * (long long)K);
            }
        }
#else
        const int n = cur.tile * 16 + g;
        if (cur.p == 1) {
            const u16* base = wgu + (long long)n * d.H + k;
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int r = 0; r < 4; ++r)  // gate g, gate g + 8, up g, up g + 8
                    copy_weight(slot + (u * 4 + r) * 512, base + ((r & 1) * 8 + (r >> 1) * d.I) * (long long)d.H + u * 32);
        } else {
            const int K = k_of(d, cur.p);
            const u16* base = (cur.p == 0 ? wo : wd) + (long long)n * K + k;
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int r = 0; r < 2; ++r) copy_weight(slot + (u * 2 + r) * 512, base + r * 8 * (long long)K + u * 32);
        }
#endif
        if (with_x) {
#pragma unroll
            for (int t = 0; t < ROW_TILES; ++t) {
                const u16* row = x_row(cur, d, attn, summed, act, t, g, k);
                const bool live = 8 * t + g < d.M;
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (u < chunks) copy_x(slot + (PIECES + u * ROW_TILES + t) * 512, live ? row + u * 32 : wo, live);
            }
        }
    }
    asm volatile("cp.async.commit_group;");
}

// A requested group's x pieces, copied now: its weights went out before x was written (before the barrier
// or the wait for the kernels before). Only this lane reads them back, so no barrier.
__device__ __forceinline__ void fill_x(u32 slot, const Cursor& cur, const Dims& d, const u16* attn, const u16* summed,
                                       const u16* act, int warp, int g, int c) {
    const int k = column(cur, d, warp, c);
    const int chunks = cur.p == 1 ? 2 : 4;
#pragma unroll
    for (int t = 0; t < ROW_TILES; ++t) {
        const u16* row = x_row(cur, d, attn, summed, act, t, g, k);
        const bool live = 8 * t + g < d.M;
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = live && u < chunks ? load_rows(row + u * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (u < chunks) store_shared(slot + (PIECES + u * ROW_TILES + t) * 512, v[u]);
    }
}

// The group's products: the slot's weight pieces against its x pieces, into acc[set][row tile]. Phase 1's x
// is summed: times the norm weight here, each product rounded to bf16.
__device__ __forceinline__ void multiply(float (&acc)[2][ROW_TILES][4], u32 slot, const Cursor& cur, const Dims& d,
                                         const u16* norm_w, int warp, int g, int c) {
    uint4 w[PIECES];
#if LINES
    // w[u * 2 + r]: chunk u of row g + 8r; gated w[u * 4 + r]: of gate g, gate g + 8, up g, up g + 8.
    __syncwarp();  // the pieces came from every lane's copies
    const u32 wslot = slot - (4 * g + c) * 16;
    const int swizzle = (g & 1) << 2;
    if (cur.p == 1) {
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
            const int u = i >> 2, r = i & 3, row = (r >> 1) * 16 + (r & 1) * 8 + g;
            w[i] = load_shared(wslot + row * 128 + (((4 * u + c) ^ swizzle) * 16));
        }
    } else {
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
            const int u = i >> 1, row = g + 8 * (i & 1);
            w[i] = load_shared(wslot + row * 256 + (((4 * u + c) ^ swizzle) * 16));
        }
    }
#else
#pragma unroll
    for (int i = 0; i < PIECES; ++i) w[i] = load_shared(slot + i * 512);
#endif
    if (cur.p == 1) {
        const int k = column(cur, d, warp, c);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const uint4 nw = load_constant(norm_w + k + u * 32);
#pragma unroll
            for (int t = 0; t < ROW_TILES; ++t) {
                const uint4 x = load_shared(slot + (PIECES + u * ROW_TILES + t) * 512);
                const uint4 b = make_uint4(scale_pair(x.x, nw.x), scale_pair(x.y, nw.y), scale_pair(x.z, nw.z),
                                           scale_pair(x.w, nw.w));
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const uint4 lo = w[u * 4 + 2 * s], hi = w[u * 4 + 2 * s + 1];
                    mma(acc[s][t], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
                    mma(acc[s][t], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
                }
            }
        }
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int t = 0; t < ROW_TILES; ++t) {
                const uint4 lo = w[u * 2], hi = w[u * 2 + 1];
                const uint4 b = load_shared(slot + (PIECES + u * ROW_TILES + t) * 512);
                mma(acc[0][t], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
                mma(acc[0][t], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
            }
    }
}

// Named barriers 1-4 (0 is __syncthreads'): FULL + b, warp 0 waits until every warp has written tile sums
// buffer b; FREE + b, a warp waits until warp 0 has read it. Each counts the whole block.
#define FULL 1
#define FREE 3

__device__ __forceinline__ void named_arrive(int id) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(WARPS * 32) : "memory");
}

__device__ __forceinline__ void named_sync(int id) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(WARPS * 32) : "memory");
}

// Every block of the grid has arrived. `arrivals` only grows (64 bits: it never wraps), each launch adding
// two barriers' worth of the grid, so one counter serves every launch and graph replay.
__device__ __forceinline__ void grid_barrier(u64* arrivals) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const u64 old = atomicAdd(arrivals, 1ull);
        const u64 target = (old / gridDim.x + 1) * gridDim.x;
        u64 now;
        do {
            asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(now) : "l"(arrivals) : "memory");
        } while (now < target);
        __threadfence();
    }
    __syncthreads();
}

#define VALUES (2 * ROW_TILES * 4)

#ifndef STAMPS
#define STAMPS 0  // bench/mlp_block.py: each block's clock at 7 points (start, waited, barriers in and out, end)
#endif
#if STAMPS
#define STAMP(i)                                                                   \
    if (threadIdx.x == 0) {                                                        \
        u64 t;                                                                     \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                      \
        stamps[blockIdx.x * 7 + (i)] = t;                                          \
    }
#else
#define STAMP(i)
#endif

extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
mlp_block(const u16* __restrict__ attn, const u16* __restrict__ wo, const u16* __restrict__ residual,
          const u16* __restrict__ norm_w, const u16* __restrict__ wgu, const u16* __restrict__ wd,
          u16* __restrict__ summed, u16* __restrict__ act, u16* __restrict__ out, float* __restrict__ squares,
          u64* __restrict__ arrivals, int M, int Q, int H, int I, float eps
#if STAMPS
          , u64* __restrict__ stamps
#endif
) {
    // [WARPS][STAGES] slots: PIECES * 512 bytes of weights (LINES: rows of contiguous segments, see request;
    // otherwise [PIECES][32 lanes]), then [X_PIECES][32 lanes] of x.
    extern __shared__ uint4 ring[];
    __shared__ float partial[2][WARPS][VALUES][32];  // a tile's sums by warp, two tiles in turn
    __shared__ float inv_rms[16];
    const Dims d{M, Q, H, I};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const u32 mine = shared_address(ring) + warp * (STAGES * SLOT_BYTES) + lane * 16;

    STAMP(0);
    Cursor ahead = first(d);  // the next group to request
    for (int s = 0; s < STAGES; ++s) {  // weights only: x comes from the kernels before
        request(mine + s * SLOT_BYTES, ahead, d, wo, wgu, wd, attn, summed, act, false, warp, g, c);
        advance(ahead, d);
    }
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // attn and residual come from the kernels before
#endif
    STAMP(1);
    Cursor at = first(d);  // the next group to multiply
    int ready = -1;        // the phase whose x can be read: -1 until the first pending fill
    int slot_index = 0;    // at's slot
    float acc[2][ROW_TILES][4] = {};
    // The next grid barrier: every block's phase `ready` is written. Past the last one every block is
    // resident, so the kernels after this one may launch.
    auto cross_barrier = [&]() {
        STAMP(2 + 2 * ready);
        grid_barrier(arrivals);
        ++ready;
        STAMP(1 + 2 * ready);
#if __CUDA_ARCH__ >= 900
        if (ready == PHASES - 1) asm volatile("griddepcontrol.launch_dependents;");
#endif
    };
    int parity = 0, tiles_done = 0;
#pragma unroll 1
    while (at.p < PHASES) {
        if (at.p != ready) {  // the block's first group of a phase: its x after the barrier(s)
            if (ready < 0) ready = 0;
            while (ready < at.p) {
                cross_barrier();
                if (ready == 1) {  // 1 / rms of each row: phase 0's tile sums, added in tile order
                    const int i = threadIdx.x, m = i & 15, part = i >> 4, tiles = H / 16, per = (tiles + 15) / 16;
                    float* sums = reinterpret_cast<float*>(partial);  // free: no tile is open
                    if (i < 256) {
                        float a = 0.0f;
                        for (int t = part * per; t < min(tiles, part * per + per); ++t) a += __ldcg(squares + t * 16 + m);
                        sums[part * 16 + m] = a;
                    }
                    __syncthreads();
                    if (i < 16) {
                        float a = 0.0f;
                        for (int q = 0; q < 16; ++q) a += sums[q * 16 + i];
                        inv_rms[i] = rsqrtf(a / H + eps);
                    }
                    __syncthreads();
                }
            }
            Cursor t = at;
            for (int s = 0; s < STAGES; ++s) {  // the requested groups of this phase
                if (t.p == ready) fill_x(mine + ((slot_index + s) % STAGES) * SLOT_BYTES, t, d, attn, summed, act, warp, g, c);
                advance(t, d);
            }
        }
        const u32 slot = mine + slot_index * SLOT_BYTES;
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 1));
        multiply(acc, slot, at, d, norm_w, warp, g, c);
        // The slot is read (its values are in the products): refill it STAGES groups ahead.
#if LINES
        __syncwarp();  // by every lane
#endif
        request(slot, ahead, d, wo, wgu, wd, attn, summed, act, ahead.p == ready, warp, g, c);
        advance(ahead, d);
        {
            if (at.group == groups_of(d, at.p) - 1) {  // the tile's last group: its epilogue
                const int p = at.p, n0 = at.tile * 16;
                // Named barriers, not __syncthreads: a warp hands its sums over and streams on; only warp 0,
                // which adds them, waits for all, and a warp waits only to reuse a buffer warp 0 has not read.
                if (warp != 0 && tiles_done >= 2) named_sync(FREE + parity);
#pragma unroll
                for (int s = 0; s < 2; ++s)
#pragma unroll
                    for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            partial[parity][warp][(s * ROW_TILES + t) * 4 + e][lane] = acc[s][t][e];
                            acc[s][t][e] = 0.0f;
                        }
                if (warp != 0) named_arrive(FULL + parity);
                if (warp == 0) {
                    named_sync(FULL + parity);
                    // The residual's values first, all loads in flight at once: one trip to L2, not one
                    // an element.
                    u16 res[ROW_TILES][4];
#pragma unroll
                    for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int n = n0 + g + 8 * (e >> 1), m = 8 * t + 2 * c + (e & 1);
                            res[t][e] = p == 0 && m < M ? __ldcg(residual + (long long)m * H + n) : (u16)0;
                        }
                    float squared[ROW_TILES][2] = {};
#pragma unroll
                    for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            // C fragment: element e of lane (g, c) is output row g (+8 for e >= 2), decode
                            // row 2c (+1 if e is odd).
                            const int n = n0 + g + 8 * (e >> 1), m = 8 * t + 2 * c + (e & 1);
                            float sum[2] = {0.0f, 0.0f};
#pragma unroll
                            for (int s = 0; s < 2; ++s)
                                for (int v = 0; v < WARPS; ++v) sum[s] += partial[parity][v][(s * ROW_TILES + t) * 4 + e][lane];
                            if (m >= M) continue;
                            if (p == 0) {  // rounded as o_proj and the add before the norm round it
                                const float h = round_bf16(round_bf16(sum[0]) + bf16_to_f32(res[t][e]));
                                summed[(long long)m * H + n] = f32_to_bf16(h);
                                squared[t][e & 1] += h * h;
                            } else if (p == 1) {  // rounded as the gated epilogues round it
                                const float r = inv_rms[m];
                                const float gate = round_bf16(sum[0] * r);
                                const float silu = round_bf16(gate / (1.0f + __expf(-gate)));
                                act[(long long)m * I + n] = f32_to_bf16(silu * round_bf16(sum[1] * r));
                            } else {
                                out[(long long)m * H + n] = f32_to_bf16(sum[0]);
                            }
                        }
                    if (p == 0) {  // the tile's squares by decode row, over its 16 columns: lanes g = 0..7 added
#pragma unroll
                        for (int t = 0; t < ROW_TILES; ++t)
#pragma unroll
                            for (int q = 0; q < 2; ++q) {
                                float v = squared[t][q];
                                v += __shfl_xor_sync(0xffffffffu, v, 4);
                                v += __shfl_xor_sync(0xffffffffu, v, 8);
                                v += __shfl_xor_sync(0xffffffffu, v, 16);
                                if (g == 0) squares[at.tile * 16 + 8 * t + 2 * c + q] = v;
                            }
                    }
                    named_arrive(FREE + parity);  // the buffer is read
                }
                parity ^= 1;
                ++tiles_done;
            }
            advance(at, d);
            slot_index = slot_index + 1 == STAGES ? 0 : slot_index + 1;
        }
    }
    // A block with no tile in the last phases still takes their barriers.
    if (ready < 0) ready = 0;
    while (ready < PHASES - 1) {
        cross_barrier();
    }
    asm volatile("cp.async.wait_all;");
    STAMP(6);
}
