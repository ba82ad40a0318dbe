// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Causal GQA attention over the paged KV cache for a varlen batch (prefill chunks and decode
// tokens mixed), flash-attention style: online softmax in fp32, no [tokens, context] matrix.
//
// Work item = (sequence, query tile of BQ new tokens, kv head). A CTA of 4 warps holds the
// BQ * G query rows of the tile (G = num_heads / kv_heads query heads share one kv head; rows are
// token-major: row = token_in_tile * G + head_in_group, at most 32 rows, so BQ = 32 / G) and
// streams the sequence's keys 0 .. (context of the tile's last token) - 1 through shared memory
// in tiles of 32 keys (cp.async, 2 stages, zero-filled beyond the context or on a -1 page).
// Within a warp, lane j computes the scores of key j for the warp's rows (rows w, w+4, ...); the
// P.V product gives each lane D/32 output dims. SIMT fp32 (no tensor cores): correct and
// memory-friendly; tensor-core tiles and split-KV decode are the performance issue's job.
//
// Built WITHOUT --use_fast_math (exp2f as the library function; no flush-to-zero).
#include "common.cuh"
#include "attention_common.cuh"

using namespace kern;

#define ATT_THREADS 128
#define ATT_WARPS 4
#define ATT_ROWS 32  // query rows (token x head-in-group) per CTA
#define ATT_RPW 8    // rows per warp
#define ATT_KT 32    // keys per smem tile (one per lane)



// The kernel's shared memory: 45 KB at D = 128 (static), 84 KB at D = 256 (dynamic: the
// manifest's `shared` must be at least sizeof(AttSmem<256>) = 86032 bytes: kern-packs' ATT_SMEM_D256).
template <int D>
struct AttSmem {
    __align__(16) bf16 Qs[ATT_ROWS][D];
    __align__(16) bf16 Ks[2][ATT_KT][D];  // chunk c of key row j stored at chunk c ^ (j & 7)
    __align__(16) bf16 Vs[2][ATT_KT][D];
    __align__(16) float Ps[ATT_WARPS][ATT_RPW][ATT_KT];
    int s_item[2];
};

template <int D>
__device__ __forceinline__ void attention_impl(
    bf16* __restrict__ out, const bf16* __restrict__ q, const bf16* __restrict__ kv_base,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, const int* __restrict__ query_start,
    int num_seqs, int num_tokens, int max_pages, int q_stride, int num_heads, int kv_heads, int layer,
    int num_layers, int page_tokens, float scale, int window) {
    constexpr int CH = D / 8;     // 16-byte chunks per head row
    constexpr int DPL = D / 32;   // output dims per lane
    KERN_SMEM(AttSmem<D>, sm);
    auto& Qs = sm.Qs;
    auto& Ks = sm.Ks;
    auto& Vs = sm.Vs;
    auto& Ps = sm.Ps;
    auto& s_item = sm.s_item;
    const int W = att_window(window);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y;
    if (kv_heads <= 0 || num_heads % kv_heads != 0) __trap();
    const int G = num_heads / kv_heads;
    if (G > ATT_ROWS) __trap();
    const int BQ = ATT_ROWS / G;
    const float scale_log2 = scale * 1.4426950408889634f;

    for (int work = blockIdx.x;; work += gridDim.x) {
        // ---- map work -> (sequence, query tile) with a warp-wide scan over query_start
        __syncthreads();  // previous item's smem reads are done before anything is overwritten
        if (warp == 0) {
            int seq, tile, tiles;
            find_query_tile(query_start, num_seqs, BQ, work, lane, seq, tile, tiles);
            if (lane == 0) {
                s_item[0] = seq;
                s_item[1] = tile;
            }
        }
        __syncthreads();
        const int seq = s_item[0];
        if (seq < 0) break;  // no more work for this CTA
        const int tile = s_item[1];

        const int q0 = query_start[seq];
        const int n_new = query_start[seq + 1] - q0;
        const int ctx = seq_lens[seq];
        const int t0 = tile * BQ;                // first new token of the tile (within the sequence)
        const int nq = min(BQ, n_new - t0);      // tokens in this tile
        const int R = nq * G;                    // valid rows
        const int base_lim = ctx - n_new + t0 + 1;  // keys visible to the tile's first token
        const int kmax = base_lim + nq - 1;      // keys visible to the tile's last token
        const int ntiles = kmax > 0 ? (kmax + ATT_KT - 1) / ATT_KT : 0;
        // With a sliding window the tile's first token sees keys from base_lim - W on: the key
        // tiles below that are skipped (without a window kt0 = 0).
        const int kt0 = base_lim - W > 0 ? (base_lim - W) / ATT_KT : 0;
        const int* bt = block_tables + (size_t)seq * max_pages;

        // ---- K/V tile loader (cp.async, zero-fill for keys >= kmax or pages that are -1/out of table)
        auto issue = [&](int stage, int kt) {
#pragma unroll
            for (int i = 0; i < (ATT_KT * CH) / ATT_THREADS; ++i) {
                const int qd = tid + i * ATT_THREADS;
                const int jl = qd / CH, c = qd % CH;
                const int key = kt * ATT_KT + jl;
                int off;
                const int page = kv_page(bt, key, kmax, max_pages, page_tokens, off);
                const bf16* srck = kv_base;
                const bf16* srcv = kv_base;
                if (page >= 0) {
                    const size_t ko = kv_offset(page, off, layer, 0, num_layers, page_tokens, kv_heads, D) +
                                      (size_t)kvh * D + c * 8;
                    const size_t vo = kv_offset(page, off, layer, 1, num_layers, page_tokens, kv_heads, D) +
                                      (size_t)kvh * D + c * 8;
                    srck = kv_base + ko;
                    srcv = kv_base + vo;
                }
                const int pc = (c ^ (jl & 7)) * 8;
                cp_async16(&Ks[stage][jl][pc], srck, page >= 0 ? 16 : 0);
                cp_async16(&Vs[stage][jl][pc], srcv, page >= 0 ? 16 : 0);
            }
            cp_async_commit();
        };

        if (ntiles > kt0) issue(kt0 & 1, kt0);

        // ---- Q tile -> smem (rows >= R are zero)
        for (int qd = tid; qd < ATT_ROWS * CH; qd += ATT_THREADS) {
            const int r = qd / CH, c = qd % CH;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < R) {
                const int tl = r / G, g = r - (r / G) * G;
                const bf16* src =
                    q + (size_t)(q0 + t0 + tl) * q_stride + (size_t)(kvh * G + g) * D + c * 8;
                v = *reinterpret_cast<const uint4*>(src);
            }
            *reinterpret_cast<uint4*>(&Qs[r][c * 8]) = v;
        }

        float o[ATT_RPW][DPL];
        float m[ATT_RPW], l[ATT_RPW];
        int lim[ATT_RPW];
#pragma unroll
        for (int i = 0; i < ATT_RPW; ++i) {
            m[i] = -INFINITY;
            l[i] = 0.f;
            const int r = warp + ATT_WARPS * i;
            lim[i] = base_lim + (r < R ? r / G : 0);
#pragma unroll
            for (int d = 0; d < DPL; ++d) o[i][d] = 0.f;
        }

        for (int kt = kt0; kt < ntiles; ++kt) {
            const int st = kt & 1;
            if (kt + 1 < ntiles) {
                issue(st ^ 1, kt + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();

            // scores of key (kt*32 + lane) for this warp's rows
            float s[ATT_RPW];
#pragma unroll
            for (int i = 0; i < ATT_RPW; ++i) s[i] = 0.f;
#pragma unroll
            for (int c = 0; c < CH; ++c) {
                float kx[8];
                unpack8(*reinterpret_cast<const uint4*>(&Ks[st][lane][(c ^ (lane & 7)) * 8]), kx);
#pragma unroll
                for (int i = 0; i < ATT_RPW; ++i) {
                    if (warp + ATT_WARPS * i < R) {
                        float qx[8];
                        unpack8(*reinterpret_cast<const uint4*>(&Qs[warp + ATT_WARPS * i][c * 8]), qx);
#pragma unroll
                        for (int e = 0; e < 8; ++e) s[i] = fmaf(qx[e], kx[e], s[i]);
                    }
                }
            }
            softmax_pv_tile<D, ATT_RPW, ATT_WARPS, ATT_KT>(s, m, l, o, Ps[warp], Vs[st], lane, warp, R, kt * ATT_KT + lane,
                                                        scale_log2, [&](int i, int key) { return key < lim[i] && key >= lim[i] - W; });
            __syncthreads();  // the stage read here is overwritten by the next iteration's issue
        }

        // ---- normalize and store
#pragma unroll
        for (int i = 0; i < ATT_RPW; ++i) {
            const int r = warp + ATT_WARPS * i;
            if (r < R) {
                const float lt = warp_sum(l[i]);
                const float inv = 1.0f / lt;
                const int tl = r / G, g = r - (r / G) * G;
                bf16* dst = out + (size_t)(q0 + t0 + tl) * num_heads * D + (size_t)(kvh * G + g) * D + lane * DPL;
                if constexpr (DPL == 8) {
                    uint4 w4;
                    w4.x = pack2(o[i][0] * inv, o[i][1] * inv);
                    w4.y = pack2(o[i][2] * inv, o[i][3] * inv);
                    w4.z = pack2(o[i][4] * inv, o[i][5] * inv);
                    w4.w = pack2(o[i][6] * inv, o[i][7] * inv);
                    *reinterpret_cast<uint4*>(dst) = w4;
                } else if constexpr (DPL == 4) {
                    uint2 w2;
                    w2.x = pack2(o[i][0] * inv, o[i][1] * inv);
                    w2.y = pack2(o[i][2] * inv, o[i][3] * inv);
                    *reinterpret_cast<uint2*>(dst) = w2;
                } else {
                    *reinterpret_cast<uint32_t*>(dst) = pack2(o[i][0] * inv, o[i][1] * inv);
                }
            }
        }
    }

    zero_padded_rows<D>(out, query_start, num_seqs, num_tokens, num_heads, kvh, G, tid, ATT_THREADS);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_d128(KERN_ATT_ARGS) {
    KERN_PDL_WAIT();
    attention_impl<128>(KERN_ATT_PASS);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_d64(KERN_ATT_ARGS) {
    KERN_PDL_WAIT();
    attention_impl<64>(KERN_ATT_PASS);
}
// head_dim 256 (Gemma 3): the same kernel with 84 KB of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attention_d256(KERN_ATT_ARGS) {
    KERN_PDL_WAIT();
    attention_impl<256>(KERN_ATT_PASS);
}
