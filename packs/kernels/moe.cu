// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Mixture-of-experts kernels (issue 26; transformers' Qwen3MoeSparseMoeBlock): packs/src/moe.rs
// writes the calls, packs/kernels/KERNELS.md ("Mixture of experts") has the contracts, docs/moe.md
// the design. One MoE layer, after the router's logits GEMM (the dense GEMM kernels, N = E):
//
//   moe_topk     one warp per token: softmax in fp32 over the E bf16 logits exactly as PyTorch's
//                persistent warp softmax computes it, the top k (larger first, ties to the lower
//                index, as torch.topk), optional renormalization, weights rounded to bf16
//   moe_topk_route  both in one launch (one CTA) for steps of few tokens
//   moe_route    one CTA: per-expert counts, offsets [E+1] and the permutation of the tokens·k
//                (token, slot) pairs grouped by expert, stable (pair order within an expert), so
//                the layout never depends on thread timing
//   moe_gemm_s   grouped GEMM y[r] = A[r] · W[e(r)]ᵀ over the expert-sorted rows, tiles of 16 rows
//   moe_gemm_l   the same with tiles of 64 rows × 128 columns (prefill); both chain the same
//                mma.sync m16n8k16 over k in the same order for every output element, so a row's
//                bits do not depend on the tile, the step size or its place in the expert's range
//   moe_gemm_w   the same on wgmma, tiles of 128 rows × 128 columns (prefill on Hopper): the same
//                k16 steps in the same order, which wgmma rounds as mma.sync does: the same bits
//   moe_combine  out[t] = Σ_j w_j · y[pos(t, j)] over the token's k experts in ascending expert
//                id, fp32, rounded once (or, flag 1, transformers' bf16 index_add_ order exactly)
//
// Grids are sized by the manifest for the worst routing (idle CTAs exit after reading the
// offsets); nothing is decided on the host, so one CUDA graph per bucket serves every routing.
#include "common.cuh"
#ifndef KERN_HOST_EMU
#include "gemm_wgmma_ops.cuh"  // wgmma.mma_async m64n128k16 (moe_gemm_w)
#endif

using namespace kern;

#define MOE_MAX_EXPERTS 512
#define MOE_MAX_TOPK 32
#define MOE_ROUTE_THREADS 1024
#define MOE_BK 64  // k elements per pipeline stage of the grouped GEMMs (one 128-byte row)

// ------------------------------------------------------------------ warp-collective PTX
// On the GPU inline PTX; under KERN_HOST_EMU (packs/kernels/verify/host_emu/emu.h) the emulations.
#ifdef KERN_HOST_EMU
static void moe_ldsm_x4(uint32_t (&r)[4], const void* p) { kern_emu_ldmatrix_x4(r, p, false); }
static void moe_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { kern_emu_mma_m16n8k16_bf16(d, a, b0, b1); }
static void moe_cp_async16(void* smem, const void* gmem, bool valid) { kern_emu_cp_async16(smem, gmem, valid ? 16 : 0); }
static void moe_cp_commit() {}
template <int N>
static void moe_cp_wait() {}
#else
static __device__ __forceinline__ void moe_ldsm_x4(uint32_t (&r)[4], const void* p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
// d += a (16x16, row) * b (16x8, col), bf16 inputs, fp32 accumulate (in place)
static __device__ __forceinline__ void moe_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 16-byte global -> shared copy; invalid: 16 zero bytes, nothing read (src must still be a
// valid address: callers pass a clamped one).
static __device__ __forceinline__ void moe_cp_async16(void* smem, const void* gmem, bool valid) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
static __device__ __forceinline__ void moe_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void moe_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

// ================================================================== router: softmax, top-k
// torch.topk's order: a larger value first; equal values: the lower index first; NaN above all.
static __device__ __forceinline__ bool moe_better(float v, int i, float bv, int bi) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bi);
    return v > bv || (v == bv && i < bi);
}

// logits [n, E] bf16 -> ids [n, K] i32 (descending probability), w [n, K] f32 (bf16 values).
// flags bit 0: norm_topk_prob. grid [ceil(n / 4)], block [128]: one warp per token.
// The `_f32` entries read fp32 logits (the router GEMM's `_f32out`: `kern pack --router-logits
// f32`): the same code after the load, so bf16-valued fp32 logits give the bf16 entries' bits.
//
// The softmax is PyTorch's softmax_warp_forward (F.softmax(x, dtype=float) over a row of E <= 1024
// takes it): with P = next_pow2(E), lane l holds the elements it·32 + l (it < P / 32; for E <= 32
// the sub-warp of P lanes, element l), the max and the per-lane sums of expf(x - max) in it order,
// a butterfly sum over lanes (xor 16, 8, 4, 2, 1: the offsets above P / 2 add exact zeros here),
// and p = e / sum. Every operation is PyTorch's, so the probabilities are bit-identical.
// One token's routing by one warp (every lane calls it).
static __device__ __forceinline__ float moe_logit(bf16 x) { return f(x); }
static __device__ __forceinline__ float moe_logit(float x) { return x; }
template <typename L>
__device__ __forceinline__ void moe_topk_warp(const L* __restrict__ logits, int* __restrict__ ids, float* __restrict__ w, int t, int E,
                                              int K, int flags, int lane) {
    constexpr int IT = MOE_MAX_EXPERTS / 32;
    const L* row = logits + (size_t)t * E;
    float v[IT];
    float mx = -INFINITY;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
        const int i = it * 32 + lane;
        v[it] = i < E ? moe_logit(row[i]) : -INFINITY;
        mx = mx > v[it] ? mx : v[it];  // PyTorch's `(a > b) ? a : b`
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float b2 = __shfl_xor_sync(0xffffffffu, mx, o);
        mx = mx > b2 ? mx : b2;
    }
    float sum = 0.f;
#pragma unroll
    for (int it = 0; it < IT; ++it) {
        if (it * 32 >= E) break;
        v[it] = expf(v[it] - mx);  // exp(-inf) = 0 for the padding
        sum += v[it];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    sum = __shfl_sync(0xffffffffu, sum, 0);
#pragma unroll
    for (int it = 0; it < IT; ++it) v[it] = v[it] / sum;

    // K rounds of a warp argmax; lane j keeps round j's winner.
    uint32_t taken = 0;  // bit it: element it·32 + lane is selected
    float my_v = 0.f;
    int my_i = 0;
    for (int j = 0; j < K; ++j) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int i = it * 32 + lane;
            if (i < E && !((taken >> it) & 1u) && moe_better(v[it], i, bv, bi)) bv = v[it], bi = i;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (moe_better(ov, oi, bv, bi)) bv = ov, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == j) my_v = bv, my_i = bi;
    }
    // transformers: `routing_weights /= routing_weights.sum(-1)` in fp32 (summed here in the
    // sorted order), then `.to(bf16)`.
    float wj = my_v;
    if (flags & 1) {
        float s = 0.f;
        for (int j = 0; j < K; ++j) s += __shfl_sync(0xffffffffu, my_v, j);
        wj = my_v / s;
    }
    if (lane < K) {
        ids[(size_t)t * K + lane] = my_i;
        w[(size_t)t * K + lane] = rb(wj);
    }
}

template <typename L>
__device__ __forceinline__ void moe_topk_impl(const L* __restrict__ logits, int* __restrict__ ids, float* __restrict__ w, int n, int E, int K, int flags) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (E < 1 || E > MOE_MAX_EXPERTS || K < 1 || K > MOE_MAX_TOPK || K > E) __trap();
    if (t >= n) return;  // warp-uniform
    moe_topk_warp(logits, ids, w, t, E, K, flags, threadIdx.x & 31);
}
extern "C" __global__ void __launch_bounds__(128)
moe_topk(const bf16* __restrict__ logits, int* __restrict__ ids, float* __restrict__ w, int n, int E, int K, int flags) {
    moe_topk_impl(logits, ids, w, n, E, K, flags);
}
extern "C" __global__ void __launch_bounds__(128)
moe_topk_f32(const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ w, int n, int E, int K, int flags) {
    moe_topk_impl(logits, ids, w, n, E, K, flags);
}

// ================================================================== permutation
// ids [n, K] -> offsets [E+1] (exclusive prefix of the per-expert counts; offsets[E] = n·K),
// sorted [n·K] (the pair p = t·K + j at each expert-grouped position), pos [n·K] (its inverse).
// Within an expert the pairs keep their order p (a stable counting sort), computed in chunks of
// 1024 pairs: a pair's position is its expert's running count, plus the pairs of its expert in
// lower warps of the chunk (per-warp counts in shared memory, scanned per expert), plus those in
// lower lanes of its warp (__match_any_sync). grid [1], block [1024]. An id outside [0, E) (never
// written by moe_topk) is taken as expert 0, so nothing is indexed out of bounds.
// `ids` is not __restrict__: moe_topk_route writes it earlier in the same kernel, so it must not
// be read through the non-coherent (read-only) cache.
__device__ __forceinline__ void moe_route_block(const int* ids, int* __restrict__ offsets, int* __restrict__ sorted,
                                                int* __restrict__ pos, int n, int E, int K) {
    __shared__ int run[MOE_MAX_EXPERTS];   // counts, then each expert's next position
    __shared__ int tot[MOE_MAX_EXPERTS];   // this chunk's pairs per expert
    __shared__ unsigned short wc[32 * MOE_MAX_EXPERTS];  // [warp][expert]: count, then exclusive prefix
    if (E < 1 || E > MOE_MAX_EXPERTS) __trap();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int P = n * K;
    auto expert = [&](int p) {
        const int e = ids[p];
        return (e >= 0 && e < E) ? e : 0;
    };
    for (int e = tid; e < E; e += MOE_ROUTE_THREADS) run[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += MOE_ROUTE_THREADS) atomicAdd(&run[expert(p)], 1);  // counts: order-free
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the counts, 32 experts at a time
        int carry = 0;
        for (int b0 = 0; b0 < E; b0 += 32) {
            const int e = b0 + lane;
            const int c = e < E ? run[e] : 0;
            int incl = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += u;
            }
            if (e < E) {
                run[e] = carry + incl - c;
                offsets[e] = carry + incl - c;
            }
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) offsets[E] = carry;
    }
    __syncthreads();
    for (int base = 0; base < P; base += MOE_ROUTE_THREADS) {
        for (int i = tid; i < 32 * E; i += MOE_ROUTE_THREADS) wc[i] = 0;
        __syncthreads();
        const int p = base + tid;
        const bool valid = p < P;
        const int e = valid ? expert(p) : -1;
        const unsigned peers = __match_any_sync(0xffffffffu, e);
        const int lower = __popc(peers & ((1u << lane) - 1u));
        if (valid && lower == 0) wc[warp * E + e] = (unsigned short)__popc(peers);
        __syncthreads();
        for (int x = tid; x < E; x += MOE_ROUTE_THREADS) {
            int acc = 0;
            for (int w2 = 0; w2 < 32; ++w2) {
                const int c = wc[w2 * E + x];
                wc[w2 * E + x] = (unsigned short)acc;
                acc += c;
            }
            tot[x] = acc;
        }
        __syncthreads();
        if (valid) {
            const int q = run[e] + wc[warp * E + e] + lower;
            sorted[q] = p;
            pos[p] = q;
        }
        __syncthreads();
        for (int x = tid; x < E; x += MOE_ROUTE_THREADS) run[x] += tot[x];
        // (the next chunk's first barrier orders these updates before its reads)
    }
}

extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
moe_route(const int* __restrict__ ids, int* __restrict__ offsets, int* __restrict__ sorted, int* __restrict__ pos, int n, int E,
          int K) {
    KERN_PDL_WAIT();
    moe_route_block(ids, offsets, sorted, pos, n, E, K);
}

// moe_topk then moe_route in one launch, for steps of few tokens (the manifest: at most 64): the
// 32 warps of the CTA route tokens w, w + 32, ... with moe_topk's code, then the CTA permutes them
// with moe_route's — the same outputs bit for bit, one launch fewer per MoE layer. grid [1],
// block [1024].
template <typename L>
__device__ __forceinline__ void moe_topk_route_impl(const L* __restrict__ logits, int* ids, float* __restrict__ w, int* __restrict__ offsets,
                                                    int* __restrict__ sorted, int* __restrict__ pos, int n, int E, int K, int flags) {
    KERN_PDL_WAIT();
    if (E < 1 || E > MOE_MAX_EXPERTS || K < 1 || K > MOE_MAX_TOPK || K > E) __trap();
    for (int t = threadIdx.x >> 5; t < n; t += MOE_ROUTE_THREADS / 32) moe_topk_warp(logits, ids, w, t, E, K, flags, threadIdx.x & 31);
    __syncthreads();  // the ids in global memory, visible to the whole CTA
    moe_route_block(ids, offsets, sorted, pos, n, E, K);
}
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
moe_topk_route(const bf16* __restrict__ logits, int* ids, float* __restrict__ w, int* __restrict__ offsets,
               int* __restrict__ sorted, int* __restrict__ pos, int n, int E, int K, int flags) {
    moe_topk_route_impl(logits, ids, w, offsets, sorted, pos, n, E, K, flags);
}
extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)
moe_topk_route_f32(const float* __restrict__ logits, int* ids, float* __restrict__ w, int* __restrict__ offsets,
                   int* __restrict__ sorted, int* __restrict__ pos, int n, int E, int K, int flags) {
    moe_topk_route_impl(logits, ids, w, offsets, sorted, pos, n, E, K, flags);
}

// ================================================================== grouped expert GEMM
// y[r, :] = A[r, :] · W[e]ᵀ for the expert-sorted rows r in [offsets[e], offsets[e+1]), W [E, N, K]
// row-major (nn.Linear per expert), A's row r = x[sorted[r] / topk] (gather != 0: the tokens' h)
// or x[r] (the sorted act); y [n·topk, N] bf16. Requires K % 8 == 0, N % 8 == 0, 16-byte aligned
// x, W and y.
//
// blockIdx.x = a tile of BM rows of one expert: each CTA scans the offsets (one warp, 32 experts
// per step) into per-expert tile counts ceil(count / BM), finds its expert and exits when the
// routing has fewer tiles than the grid (the manifest sizes it for the worst case); blockIdx.y =
// BN output columns. 4 warps (WARPS_M × WARPS_N), STAGES-deep cp.async pipeline of 64-wide k
// blocks; shared rows of 128 bytes with the 16-byte chunk c of row r at c ^ (r & 7) (conflict-free
// cp.async and ldmatrix); fragments by ldmatrix.x4; mma.sync m16n8k16 bf16 → fp32, one
// accumulator per output, k ascending: the same chain for every tile shape, hence the same bits.
template <int BM, int BN, int WARPS_M, int STAGES>
struct MoeGemmSmem {
    bf16 a[STAGES][BM * MOE_BK];
    bf16 b[STAGES][BN * MOE_BK];
    int tile_end[MOE_MAX_EXPERTS];
    int arow[BM];
};

template <int BM, int BN, int WARPS_M, int STAGES>
__device__ __forceinline__ void moe_gemm_impl(const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ y,
                                              const int* __restrict__ offsets, const int* __restrict__ sorted, int n, int N,
                                              int K, int E, int topk, int gather) {
    constexpr int WARPS_N = 4 / WARPS_M;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
    constexpr int MI = WM / 16, NI = WN / 8;             // m16 / n8 tiles per warp
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile of whole m16 x n16 blocks");
    typedef MoeGemmSmem<BM, BN, WARPS_M, STAGES> Smem;
    KERN_SMEM(Smem, sm);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (E < 1 || E > MOE_MAX_EXPERTS) __trap();

    // ---- this CTA's expert and rows
    if (warp == 0) {
        int carry = 0;
        for (int b0 = 0; b0 < E; b0 += 32) {
            const int e = b0 + lane;
            const int c = e < E ? offsets[e + 1] - offsets[e] : 0;
            int incl = (c + BM - 1) / BM;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += u;
            }
            if (e < E) sm.tile_end[e] = carry + incl;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    const int tile = blockIdx.x;
    if (tile >= sm.tile_end[E - 1]) return;  // CTA-uniform: more CTAs than this routing's tiles
    int lo = 0, hi = E - 1;                  // the first expert whose tiles end past `tile`
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (sm.tile_end[mid] > tile) hi = mid;
        else lo = mid + 1;
    }
    const int e = lo;
    const int first_tile = e > 0 ? sm.tile_end[e - 1] : 0;
    const int row0 = offsets[e] + (tile - first_tile) * BM;
    const int rows = min(BM, offsets[e + 1] - row0);
    const int n0 = blockIdx.y * BN;
    for (int i = tid; i < BM; i += 128) sm.arow[i] = i < rows ? (gather ? sorted[row0 + i] / topk : row0 + i) : -1;
    __syncthreads();

    const bf16* We = W + (size_t)e * N * K;
    const int nk = (K + MOE_BK - 1) / MOE_BK;
    auto sw = [](int r, int c) { return r * MOE_BK + ((c ^ (r & 7)) << 3); };
    auto load = [&](int stage, int kb) {
        const int k0 = kb * MOE_BK;
#pragma unroll
        for (int i = 0; i < (BM * 8 + 127) / 128; ++i) {
            const int q = tid + i * 128;
            if (BM * 8 % 128 == 0 || q < BM * 8) {
                const int r = q >> 3, c = q & 7;
                const int src = sm.arow[r];
                const bool ok = src >= 0 && k0 + c * 8 < K;
                moe_cp_async16(&sm.a[stage][sw(r, c)], ok ? x + (size_t)src * K + k0 + c * 8 : x, ok);
            }
        }
#pragma unroll
        for (int i = 0; i < BN * 8 / 128; ++i) {
            const int q = tid + i * 128;
            const int r = q >> 3, c = q & 7;
            const bool ok = n0 + r < N && k0 + c * 8 < K;
            moe_cp_async16(&sm.b[stage][sw(r, c)], ok ? We + (size_t)(n0 + r) * K + k0 + c * 8 : We, ok);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) load(s, s);
        moe_cp_commit();
    }
    const int wm0 = (warp % WARPS_M) * WM, wn0 = (warp / WARPS_M) * WN;
    for (int kb = 0; kb < nk; ++kb) {
        moe_cp_wait<STAGES - 2>();  // block kb landed (this thread's copies) ...
        __syncthreads();            // ... everyone's; and every warp is done with block kb - 1
        const int nxt = kb + STAGES - 1;
        if (nxt < nk) load(nxt % STAGES, nxt);
        moe_cp_commit();
        const bf16* As = sm.a[kb % STAGES];
        const bf16* Bs = sm.b[kb % STAGES];
#pragma unroll
        for (int ks = 0; ks < MOE_BK / 16; ++ks) {
            uint32_t af[MI][4];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                const int r = wm0 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                moe_ldsm_x4(af[mi], As + sw(r, ks * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int np = 0; np < NI / 2; ++np) {  // two n8 tiles per ldmatrix.x4
                uint32_t bfr[4];
                const int r = wn0 + np * 16 + (lane & 7) + (lane >> 4) * 8;
                moe_ldsm_x4(bfr, Bs + sw(r, ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
                for (int mi = 0; mi < MI; ++mi) {
                    moe_mma(acc[mi][2 * np], af[mi], bfr[0], bfr[1]);
                    moe_mma(acc[mi][2 * np + 1], af[mi], bfr[2], bfr[3]);
                }
            }
        }
    }
    moe_cp_wait<0>();

    // ---- store: lane (g, t) holds rows g, g + 8 and columns 2t, 2t + 1 of each (m16, n8) tile
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            const int col = n0 + wn0 + ni * 8 + 2 * t4;
            if (col >= N) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm0 + mi * 16 + g + 8 * h;
                if (r < rows)
                    *reinterpret_cast<__nv_bfloat162*>(y + (size_t)(row0 + r) * N + col) =
                        __floats2bfloat162_rn(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
}

// Decode and batched decode (steps of at most 64 tokens): 16-row tiles, 64 columns per CTA (4
// warps side by side), 4 stages; static shared memory (41 KB).
extern "C" __global__ void __launch_bounds__(128)
moe_gemm_s(const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ y, const int* __restrict__ offsets,
           const int* __restrict__ sorted, int n, int N, int K, int E, int topk, int gather) {
    KERN_PDL_WAIT();
    moe_gemm_impl<16, 64, 1, 4>(x, W, y, offsets, sorted, n, N, K, E, topk, gather);
}

// Prefill: 64-row tiles, 128 columns per CTA (2 × 2 warps of 32 × 64), 3 stages; dynamic shared
// memory (the manifest's `shared`: 73728 bytes for the stages + 2 KB of tile ends, see KERNELS.md).
extern "C" __global__ void __launch_bounds__(128)
moe_gemm_l(const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ y, const int* __restrict__ offsets,
           const int* __restrict__ sorted, int n, int N, int K, int E, int topk, int gather) {
    KERN_PDL_WAIT();
    moe_gemm_impl<64, 128, 2, 3>(x, W, y, offsets, sorted, n, N, K, E, topk, gather);
}

// ================================================================== grouped GEMM on wgmma
// moe_gemm_w: the prefill grouped GEMM on Hopper's warpgroup MMA. The same contract, the same
// expert-sorted rows and the same worst-case grid rule as moe_gemm_s / moe_gemm_l, with tiles of
// 128 rows × 128 columns: 2 warpgroups (256 threads), warpgroup w computing rows 64w .. 64w+63
// with wgmma.mma_async m64n128k16 (both operands from shared memory, 128-byte swizzle: 16-byte
// chunk c of row r at c ^ (r & 7) — moe_gemm_impl's own layout, so the loader is the same),
// MOE_W_STAGES-deep cp.async pipeline of 64-wide k blocks.
//
// Bits: each output is one fp32 accumulator fed k16 steps of 16 consecutive k in ascending k —
// the chain moe_gemm_s / moe_gemm_l run with mma.sync m16n8k16 — and one wgmma k16 step rounds
// as one mma.sync step on the same 16 k (packs/kernels/verify/k16_probe: 0 of 81,920 trials
// differ on the H200). So a row's bits equal moe_gemm_s's, whatever the tile.
#define MOE_W_BM 128
#define MOE_W_BN 128
#define MOE_W_STAGES 4
#define MOE_W_TILE_BYTES (128 * MOE_BK * 2)                             // one operand tile of a stage
#define MOE_W_SMEM_BYTES (MOE_W_STAGES * 2 * MOE_W_TILE_BYTES + MOE_MAX_EXPERTS * 4 + MOE_W_BM * 4)

#ifdef KERN_HOST_EMU
// The PTX ISA's wgmma m64n128k16 (bf16 in, fp32 accumulate, K-major operands from shared memory
// with the 128-byte swizzle, scale-d 1), for thread threadIdx.x % 128 of the warpgroup, decoded from
// the tile bases (1024-aligned) as the descriptors would give them, not from the loader: element
// (r, k) of a tile is at byte a = (r / 8)·1024 + (r % 8)·128 + 2k, stored at a ^ (((a >> 7) & 7) << 4).
// One k16 step: fp32(d + the 16 products summed in double), as emu.h's mma.sync.
static uint16_t moe_w_elem(const bf16* tile, int r, int k) {
    const uint32_t a = (uint32_t)(r / 8) * 1024u + (uint32_t)(r % 8) * 128u + (uint32_t)k * 2u;
    const uint32_t p = a ^ (((a >> 7) & 7u) << 4);
    uint16_t v;
    std::memcpy(&v, reinterpret_cast<const unsigned char*>(tile) + p, 2);
    return v;
}
static void moe_w_k16(float* d, const bf16* As, const bf16* Bs, int kk) {
    const int t = threadIdx.x & 127, w = t / 32, lane = t & 31, g = lane / 4, q = lane % 4;
    for (int j = 0; j < MOE_W_BN / 8; ++j)
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * w + g + ((i & 2) ? 8 : 0), c = 8 * j + 2 * q + (i & 1);
            double acc = d[4 * j + i];
            for (int k = 0; k < 16; ++k)
                acc += (double)kern_emu_bf16_half(moe_w_elem(As, r, 16 * kk + k), 0) * (double)kern_emu_bf16_half(moe_w_elem(Bs, c, 16 * kk + k), 0);
            d[4 * j + i] = (float)acc;
        }
}
static void moe_w_fence() {}
static void moe_w_commit() {}
template <int N>
static void moe_w_wait() {}
#else
static __device__ __forceinline__ uint64_t moe_w_desc(const void* p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((s & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
static __device__ __forceinline__ void moe_w_k16(float* d, const bf16* As, const bf16* Bs, int kk) {
    kgemm::wgmma_m64n128k16(d, moe_w_desc(reinterpret_cast<const unsigned char*>(As) + kk * 32),
                            moe_w_desc(reinterpret_cast<const unsigned char*>(Bs) + kk * 32));
}
static __device__ __forceinline__ void moe_w_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void moe_w_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void moe_w_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
#endif
// Keeps the compiler from moving accumulator reads / writes across wgmma issue and wait points.
template <int NR>
static __device__ __forceinline__ void moe_w_fence_acc(float* d) {
#ifndef KERN_HOST_EMU
#pragma unroll
    for (int i = 0; i < NR; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}

// grid [worst-case 128-row tiles, ceil(N / 128)], block [256], dynamic shared MOE_W_SMEM_BYTES +
// 1024 (the stage tiles are aligned to 1024 bytes inside it, as the 128-byte swizzle needs).
extern "C" __global__ void __launch_bounds__(256, 1)
moe_gemm_w(const bf16* __restrict__ x, const bf16* __restrict__ W, bf16* __restrict__ y, const int* __restrict__ offsets,
           const int* __restrict__ sorted, int n, int N, int K, int E, int topk, int gather) {
    KERN_PDL_WAIT();
#ifdef KERN_HOST_EMU
    alignas(1024) static unsigned char smem_emu[MOE_W_SMEM_BYTES];
    unsigned char* base = smem_emu;
#else
    extern __shared__ __align__(16) unsigned char moe_w_dyn_smem_[];
    {
        uint32_t dyn;
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < MOE_W_SMEM_BYTES + 1024) __trap();
    }
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(moe_w_dyn_smem_);
    unsigned char* base = moe_w_dyn_smem_ + ((1024u - (s0 & 1023u)) & 1023u);
#endif
    bf16* sa = reinterpret_cast<bf16*>(base);                                    // [STAGES][128 * 64]
    bf16* sb = reinterpret_cast<bf16*>(base + MOE_W_STAGES * MOE_W_TILE_BYTES);  // [STAGES][128 * 64]
    int* tile_end = reinterpret_cast<int*>(base + 2 * MOE_W_STAGES * MOE_W_TILE_BYTES);
    int* arow = tile_end + MOE_MAX_EXPERTS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
    if (E < 1 || E > MOE_MAX_EXPERTS) __trap();

    // ---- this CTA's expert and rows (moe_gemm_impl's scan, 128-row tiles)
    if (warp == 0) {
        int carry = 0;
        for (int b0 = 0; b0 < E; b0 += 32) {
            const int e = b0 + lane;
            const int c = e < E ? offsets[e + 1] - offsets[e] : 0;
            int incl = (c + MOE_W_BM - 1) / MOE_W_BM;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += u;
            }
            if (e < E) tile_end[e] = carry + incl;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    const int tile = blockIdx.x;
    if (tile >= tile_end[E - 1]) return;  // CTA-uniform
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (tile_end[mid] > tile) hi = mid;
        else lo = mid + 1;
    }
    const int e = lo;
    const int first_tile = e > 0 ? tile_end[e - 1] : 0;
    const int row0 = offsets[e] + (tile - first_tile) * MOE_W_BM;
    const int rows = min(MOE_W_BM, offsets[e + 1] - row0);
    const int n0 = blockIdx.y * MOE_W_BN;
    for (int i = tid; i < MOE_W_BM; i += 256) arow[i] = i < rows ? (gather ? sorted[row0 + i] / topk : row0 + i) : -1;
    __syncthreads();

    const bf16* We = W + (size_t)e * N * K;
    const int nk = (K + MOE_BK - 1) / MOE_BK;
    auto sw = [](int r, int c) { return r * MOE_BK + ((c ^ (r & 7)) << 3); };
    // 128 rows × 8 chunks of 16 bytes per operand: 4 copies of each per thread.
    auto load = [&](int stage, int kb) {
        const int k0 = kb * MOE_BK;
        bf16* As = sa + stage * (MOE_W_BM * MOE_BK);
        bf16* Bs = sb + stage * (MOE_W_BN * MOE_BK);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int q = tid + i * 256, r = q >> 3, c = q & 7;
            const int src = arow[r];
            const bool ok = src >= 0 && k0 + c * 8 < K;
            moe_cp_async16(&As[sw(r, c)], ok ? x + (size_t)src * K + k0 + c * 8 : x, ok);
            const bool okb = n0 + r < N && k0 + c * 8 < K;
            moe_cp_async16(&Bs[sw(r, c)], okb ? We + (size_t)(n0 + r) * K + k0 + c * 8 : We, okb);
        }
    };

    float acc[MOE_W_BN / 2];
#pragma unroll
    for (int i = 0; i < MOE_W_BN / 2; ++i) acc[i] = 0.f;

#pragma unroll
    for (int s = 0; s < MOE_W_STAGES - 2; ++s) {
        if (s < nk) load(s, s);
        moe_cp_commit();
    }
    for (int kb = 0; kb < nk; ++kb) {
        moe_cp_wait<MOE_W_STAGES - 3>();  // this thread's copies of block kb have landed
#ifndef KERN_HOST_EMU
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... visible to wgmma
#endif
        __syncthreads();  // everyone's; wgmma kb - 2 done in both warpgroups (it waited below)
        {
            const int nxt = kb + MOE_W_STAGES - 2;
            if (nxt < nk) load(nxt % MOE_W_STAGES, nxt);
            moe_cp_commit();
        }
        const bf16* As = sa + (kb % MOE_W_STAGES) * (MOE_W_BM * MOE_BK) + wg * 64 * MOE_BK;
        const bf16* Bs = sb + (kb % MOE_W_STAGES) * (MOE_W_BN * MOE_BK);
        moe_w_fence_acc<MOE_W_BN / 2>(acc);
        moe_w_fence();
#pragma unroll
        for (int kk = 0; kk < MOE_BK / 16; ++kk) moe_w_k16(acc, As, Bs, kk);
        moe_w_commit();
        moe_w_wait<1>();
        moe_w_fence_acc<MOE_W_BN / 2>(acc);
    }
    moe_w_wait<0>();
    moe_w_fence_acc<MOE_W_BN / 2>(acc);
    moe_cp_wait<0>();

    // ---- store: warp wq of the warpgroup owns rows 16wq .. 16wq+15; acc[4j + {0,1}] = (row g,
    // cols 8j + 2q + {0,1}), acc[4j + {2,3}] = (row g + 8, same cols)
    const int g = lane >> 2, q4 = lane & 3, wq = warp & 3;
#pragma unroll
    for (int j = 0; j < MOE_W_BN / 8; ++j) {
        const int col = n0 + 8 * j + 2 * q4;
        if (col >= N) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = wg * 64 + wq * 16 + g + 8 * h;
            if (r < rows)
                *reinterpret_cast<__nv_bfloat162*>(y + (size_t)(row0 + r) * N + col) =
                    __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    }
}

// ================================================================== combine
// out[t, :] = Σ_j w[t, j] · y[pos[t·K + j], :] over the token's K experts taken in ascending
// expert id (transformers' index_add_ visits the experts in that order). flags bit 0 clear: the
// products (exact in fp32: bf16 × bf16) summed in fp32 and rounded once; set: transformers' bf16
// arithmetic exactly, out = bf16(... bf16(bf16(w·y) + bf16(w·y)) ...). grid [n], block [256].
extern "C" __global__ void __launch_bounds__(256)
moe_combine(bf16* __restrict__ out, const bf16* __restrict__ y, const int* __restrict__ ids, const float* __restrict__ w,
            const int* __restrict__ pos, int n, int H, int K, int flags) {
    KERN_PDL_WAIT();
    __shared__ int s_pos[MOE_MAX_TOPK];
    __shared__ float s_w[MOE_MAX_TOPK];
    const int t = blockIdx.x, tid = threadIdx.x;
    if (K < 1 || K > MOE_MAX_TOPK) __trap();
    if (t >= n) return;
    if (tid < K) {  // rank of slot tid by (expert id, slot): ids of one token are distinct
        const int id = ids[(size_t)t * K + tid];
        int rank = 0;
        for (int j = 0; j < K; ++j) {
            const int o = ids[(size_t)t * K + j];
            rank += o < id || (o == id && j < tid);
        }
        s_pos[rank] = pos[(size_t)t * K + tid];
        s_w[rank] = w[(size_t)t * K + tid];
    }
    __syncthreads();
    const bool exact_hf = flags & 1;
    bf16* o = out + (size_t)t * H;
    if ((H & 7) == 0) {
        for (int c = tid; c < H / 8; c += 256) {
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            for (int j = 0; j < K; ++j) {
                const uint4 v = *reinterpret_cast<const uint4*>(y + (size_t)s_pos[j] * H + c * 8);
                const uint32_t* vw = reinterpret_cast<const uint32_t*>(&v);
                const float wj = s_w[j];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const float2 yy = unpack2(vw[q]);
                    if (exact_hf) {
                        acc[2 * q] = rb(__fadd_rn(acc[2 * q], rb(__fmul_rn(wj, yy.x))));
                        acc[2 * q + 1] = rb(__fadd_rn(acc[2 * q + 1], rb(__fmul_rn(wj, yy.y))));
                    } else {
                        acc[2 * q] = __fadd_rn(acc[2 * q], __fmul_rn(wj, yy.x));
                        acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1], __fmul_rn(wj, yy.y));
                    }
                }
            }
            uint4 ov;
            uint32_t* ow = reinterpret_cast<uint32_t*>(&ov);
#pragma unroll
            for (int q = 0; q < 4; ++q) ow[q] = pack2(acc[2 * q], acc[2 * q + 1]);
            *reinterpret_cast<uint4*>(o + c * 8) = ov;
        }
    } else {
        for (int c = tid; c < H; c += 256) {
            float acc = 0.f;
            for (int j = 0; j < K; ++j) {
                const float yy = f(y[(size_t)s_pos[j] * H + c]);
                acc = exact_hf ? rb(__fadd_rn(acc, rb(__fmul_rn(s_w[j], yy)))) : __fadd_rn(acc, __fmul_rn(s_w[j], yy));
            }
            o[c] = b(acc);
        }
    }
}
