// Helpers of the packs's attention kernels (attention.cu, attention_decode.cu): the
// cp.async copies of K/V tiles (synchronous copies under KERN_HOST_EMU, the CPU emulation of
// packs/kernels/verify/host_emu) and the bf16x8 unpack. Header-only, static inline: including it
// adds no code to a module that does not use it.
#pragma once
#include "common.cuh"

namespace kern {

#ifdef KERN_HOST_EMU  // packs/kernels/verify/host_emu: this file's logic run on the CPU (synchronous copies)
static void cp_async16(void* smem, const void* gmem, int src_bytes) { kern_emu_cp_async16(smem, gmem, src_bytes); }
static void cp_async_commit() {}
template <int N>
static void cp_async_wait() {}
#else
static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

static __device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float2 a = unpack2(w[k]);
        x[2 * k] = a.x;
        x[2 * k + 1] = a.y;
    }
}

// The page holding position `key` of a sequence (block table `bt`) and the offset in it, or -1
// when key >= lim or the page is -1 / beyond the table (the tile loaders zero-fill those).
static __device__ __forceinline__ int kv_page(const int* bt, int key, int lim, int max_pages, int page_tokens, int& off) {
    int page = -1;
    off = 0;
    if (key < lim) {
        const int pidx = key / page_tokens;
        off = key - pidx * page_tokens;
        if (pidx < max_pages) page = bt[pidx];
    }
    return page;
}

// The work item `work` of a varlen step cut into query tiles of BQ tokens per sequence: a
// warp-wide scan over query_start (sequences in order, tiles in order within a sequence). Every
// lane returns the same (seq, tile, tiles of that sequence); seq = -1 when `work` is past the last.
static __device__ __forceinline__ void find_query_tile(const int* __restrict__ query_start, int num_seqs, int BQ,
                                                       int work, int lane, int& seq, int& tile, int& tiles) {
    int cum = 0;
    seq = -1;
    tile = 0;
    tiles = 0;
    for (int base = 0; base < num_seqs; base += 32) {
        const int s = base + lane;
        int nt = 0;
        if (s < num_seqs) {
            const int nn = query_start[s + 1] - query_start[s];
            nt = nn > 0 ? (nn + BQ - 1) / BQ : 0;
        }
        int incl = nt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, s < num_seqs && cum + incl > work);
        if (hit) {
            const int first = __ffs(hit) - 1;
            const int incl_f = __shfl_sync(0xffffffffu, incl, first);
            tiles = __shfl_sync(0xffffffffu, nt, first);
            seq = base + first;
            tile = work - (cum + incl_f - tiles);
            return;
        }
        cum += __shfl_sync(0xffffffffu, incl, 31);
    }
}

// One 32-key tile of the SIMT attention kernels (attention.cu, attention_decode.cu), after the
// scores: the online-softmax update of this warp's rows (row i of the warp is query row
// warp + WARPS * i; rows >= `rows` are skipped; key `key` of this lane counts for row i when
// visible(i, key): key < the row's causal limit and, with a sliding window, key >= limit - window),
// then o += P . V with this lane's D/32 output dims. P goes through the warp's slice of shared
// memory `Pw`; `Vt` is the tile's V rows (chunk c of row j at chunk c ^ (j & 7)).
// A row with no visible key yet (a tile wholly below its window) keeps m = -inf, l = 0, o = 0:
// its rescale factor is taken as 1 and its weights as 0, never exp2f(-inf - -inf) = NaN. When m is
// finite these are exactly exp2f(m - mn) and exp2f(sc - mn), so rows without a window are
// computed as before, bit for bit.
template <int D, int RPW, int WARPS, int KT, typename Visible>
static __device__ __forceinline__ void softmax_pv_tile(const float (&s)[RPW], float (&m)[RPW], float (&l)[RPW],
                                                       float (&o)[RPW][D / 32], float (*Pw)[KT],
                                                       const bf16 (*Vt)[D], int lane, int warp, int rows, int key,
                                                       float scale_log2, Visible visible) {
    constexpr int DPL = D / 32;  // output dims per lane
    __syncwarp();
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
        if (warp + WARPS * i < rows) {
            const float sc = visible(i, key) ? s[i] * scale_log2 : -INFINITY;
            const float mn = fmaxf(m[i], warp_max(sc));
            const bool none = mn == -INFINITY;  // no visible key for this row yet
            const float alpha = none ? 1.f : exp2f(m[i] - mn);
            const float p = none ? 0.f : exp2f(sc - mn);
            m[i] = mn;
            l[i] = l[i] * alpha + p;
#pragma unroll
            for (int d = 0; d < DPL; ++d) o[i][d] *= alpha;
            Pw[i][lane] = p;
        }
    }
    __syncwarp();
    // o += P . V ; this lane's dims are [lane*DPL, lane*DPL + DPL)
    const int vc = (lane * DPL) / 8, vw = (lane * DPL) % 8;
#pragma unroll 2
    for (int jj = 0; jj < KT; jj += 4) {
        float vx[4][DPL];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = jj + u;
            const bf16* vp = &Vt[j][((vc ^ (j & 7)) * 8) + vw];
            if constexpr (DPL == 8) {
                float x8[8];
                unpack8(*reinterpret_cast<const uint4*>(vp), x8);
#pragma unroll
                for (int e = 0; e < 8; ++e) vx[u][e] = x8[e];
            } else if constexpr (DPL == 4) {
                const uint2 w2 = *reinterpret_cast<const uint2*>(vp);
                const float2 a = unpack2(w2.x), bb = unpack2(w2.y);
                vx[u][0] = a.x;
                vx[u][1] = a.y;
                vx[u][2] = bb.x;
                vx[u][3] = bb.y;
            } else {
                static_assert(DPL == 2, "head_dim 64, 128 or 256");
                const float2 a = unpack2(*reinterpret_cast<const uint32_t*>(vp));
                vx[u][0] = a.x;
                vx[u][1] = a.y;
            }
        }
#pragma unroll
        for (int i = 0; i < RPW; ++i) {
            if (warp + WARPS * i < rows) {
                const float4 p4 = *reinterpret_cast<const float4*>(&Pw[i][jj]);
                const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int d = 0; d < DPL; ++d) o[i][d] = fmaf(pv[u], vx[u][d], o[i][d]);
            }
        }
    }
}

// The parameters of every varlen attention entry (attention.cu's attention_dD and
// attention_prefill.cu's attention_prefill_dD take exactly these), and how an entry passes them on.
#define KERN_ATT_ARGS                                                                                         \
    bf16 *__restrict__ out, const bf16 *__restrict__ q, const bf16 *__restrict__ kv_base,                   \
        const int *__restrict__ block_tables, const int *__restrict__ seq_lens,                              \
        const int *__restrict__ query_start, int num_seqs, int num_tokens, int max_pages, int q_stride,      \
        int num_heads, int kv_heads, int layer, int num_layers, int page_tokens, float scale, int window
#define KERN_ATT_PASS                                                                                         \
    out, q, kv_base, block_tables, seq_lens, query_start, num_seqs, num_tokens, max_pages, q_stride,         \
        num_heads, kv_heads, layer, num_layers, page_tokens, scale, window

// The sliding window of an attention entry's `window` argument: a query at position p sees keys
// p - window + 1 .. p (transformers' sliding mask keeps kv_idx > q_idx - window); window <= 0 is
// no window. As a distance to subtract from a row's causal limit: 2^30 for none, so that
// `key < limit - att_window(window)` is never true without a window (limits stay far below 2^30).
static __device__ __forceinline__ int att_window(int window) { return window > 0 ? window : (1 << 30); }

// Padded tokens (rows query_start[num_seqs] .. num_tokens-1): zeros for kv head kvh's G query
// heads, so that the output never holds stale data. Every CTA of the (x, kvh) grid row takes the
// tokens blockIdx.x, blockIdx.x + gridDim.x, ...; `threads` threads per CTA.
template <int D>
static __device__ __forceinline__ void zero_padded_rows(bf16* __restrict__ out, const int* __restrict__ query_start,
                                                        int num_seqs, int num_tokens, int num_heads, int kvh, int G,
                                                        int tid, int threads) {
    constexpr int CH = D / 8;  // 16-byte chunks per head row
    int qend = query_start[num_seqs];
    if (qend < 0) qend = 0;
    for (int t = qend + blockIdx.x; t < num_tokens; t += gridDim.x) {
        bf16* dst = out + (size_t)t * num_heads * D + (size_t)kvh * G * D;
        for (int c = tid; c < G * CH; c += threads) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
    }
}

}  // namespace kern
