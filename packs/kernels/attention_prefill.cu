// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Tensor-core prefill attention (FlashAttention-2 style): causal GQA over the paged KV cache for a
// varlen batch, with EXACTLY the parameters and semantics of attention.cu's attention_dD
// (packs/kernels/KERNELS.md, "attention" and "attention_prefill"); the manifest uses it for steps
// with tokens > seqs under `kern pack --prefill-attention tc`.
//
// Work item = (sequence, query tile, kv head), grid.y = kv head; a CTA loops
// `for work = blockIdx.x; ; work += gridDim.x` over the (sequence, tile) items of a scan over
// query_start (every warp runs the scan itself: no shared slot, no extra barrier). Within a
// sequence the tiles are taken LAST first (the tiles with the most keys start first: causal load
// balance). A CTA is 4 warps; each warp owns 16 query rows, 64 rows per CTA, token-major with the
// G = num_heads / kv_heads query heads of the kv head together: row = token_in_tile * G + head,
// so a tile holds BQ = floor(64 / G) tokens (G <= 16) and each K/V tile serves all G heads.
//
// Per tile of 64 keys (FA2's single-buffer K / V pipeline: K[j+1] loads during softmax + P.V of
// tile j, V[j] loads during S = Q.K[j]^T; Q is loaded once per item, through the V buffer, into
// registers):
//   S = Q K^T     mma.sync.m16n8k16 bf16 -> fp32; Q and K fragments by ldmatrix.x4
//   online softmax in fp32 (exp2f of s * scale * log2e - m, the library exp2f: the pack is built
//                 without --use_fast_math); causal masking only on tiles that cross a row's limit
//   P -> bf16 in registers (as FlashAttention does), O += P V with V fragments by ldmatrix.x4.trans
// Shared memory (static): K and V tiles [64][D] bf16, chunk c of row j at chunk c ^ (j & 7)
// (XOR swizzle: cp.async writes and ldmatrix reads are conflict-free): 32 KB (D = 128) / 16 KB.
// Keys at or beyond the tile's last row's limit are zero-filled (and masked), tiles beyond it
// are not loaded, pages that are -1 (or beyond max_pages) read as zeros.
//
// Numerics (vs an fp64 reference): S and O accumulate in fp32 (tensor-core fp32 accumulation);
// P enters P.V as two bf16 operands, hi = bf16(p) and lo = bf16(p - hi) (~16 bits of p, two
// MMAs per V fragment), and the row sum l adds the fp32 p. The first version rounded P to bf16
// once (as FlashAttention and torch's bf16 SDPA do): within verify_kernels.py's attention
// tolerance, but the real-model parity rule (scripts/gpu/real_model.sh) then failed one prompt of
// 8. With hi + lo the host emulation's error equals attention_dD's; the tolerances (1.5 x
// torch-bf16 error + 2^-7 x max|ref| on the GPU, 2^-7 x max|ref| against fp64 in the emulation)
// apply unchanged.
#include "common.cuh"
#include "attention_common.cuh"

using namespace kern;

#define APF_THREADS 128
#define APF_WARPS 4
#define APF_ROWS 64  // query rows (token x head-in-group) per CTA: 16 per warp
#define APF_KT 64    // keys per tile

// ------------------------------------------------------------------ warp-collective PTX
// On the GPU inline PTX; under KERN_HOST_EMU (packs/kernels/verify/host_emu/emu.h) the emulations.
#ifdef KERN_HOST_EMU
static void apf_ldsm_x4(uint32_t (&r)[4], const void* p) { kern_emu_ldmatrix_x4(r, p, false); }
static void apf_ldsm_x4_t(uint32_t (&r)[4], const void* p) { kern_emu_ldmatrix_x4(r, p, true); }
static void apf_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    kern_emu_mma_m16n8k16_bf16(d, a, b0, b1);
}
#else
static __device__ __forceinline__ void apf_ldsm_x4(uint32_t (&r)[4], const void* p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
static __device__ __forceinline__ void apf_ldsm_x4_t(uint32_t (&r)[4], const void* p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
// d += a (16x16, row) * b (16x8, col), bf16 inputs, fp32 accumulate (in place)
static __device__ __forceinline__ void apf_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

template <int D>
__device__ __forceinline__ void attention_prefill_impl(
    bf16* __restrict__ out, const bf16* __restrict__ q, const bf16* __restrict__ kv_base,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, const int* __restrict__ query_start,
    int num_seqs, int num_tokens, int max_pages, int q_stride, int num_heads, int kv_heads, int layer,
    int num_layers, int page_tokens, float scale, int window) {
    static_assert(D == 64 || D == 128, "head_dim 64 or 128");
    const int W = att_window(window);
    constexpr int CH = D / 8;    // 16-byte chunks per row
    constexpr int KS = D / 16;   // k-steps of S = Q K^T (Q fragments per warp)
    constexpr int NO = D / 8;    // n-tiles of O
    constexpr int NS = APF_KT / 8;  // n-tiles of S
    __shared__ __align__(128) bf16 Ks[APF_KT * D];
    __shared__ __align__(128) bf16 Vs[APF_KT * D];  // also the Q staging buffer (APF_ROWS == APF_KT)
    static_assert(APF_ROWS == APF_KT, "Q is staged through the V buffer");

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;  // mma fragment coordinates
    const int kvh = blockIdx.y;
    if (kv_heads <= 0 || num_heads % kv_heads != 0) __trap();
    const int G = num_heads / kv_heads;
    if (G > 16) __trap();
    const int BQ = APF_ROWS / G;
    const float scale_log2 = scale * 1.4426950408889634f;

    // swizzled element offset of (row, chunk) in a [64][D] tile
    auto sw = [](int r, int c) { return r * D + ((c ^ (r & 7)) << 3); };

    for (int work = blockIdx.x;; work += gridDim.x) {
        // ---- map work -> (sequence, query tile): every warp scans query_start (same result)
        int seq, tile, tiles;
        find_query_tile(query_start, num_seqs, BQ, work, lane, seq, tile, tiles);
        tile = tiles - 1 - tile;  // within a sequence, the last tile (most keys) first
        if (seq < 0) break;  // no more work for this CTA (the same for every warp)
        __syncthreads();     // the previous item's reads of Ks / Vs are done

        const int q0 = query_start[seq];
        const int n_new = query_start[seq + 1] - q0;
        const int ctx = seq_lens[seq];
        const int t0 = tile * BQ;                   // first new token of the tile (within the sequence)
        const int nq = min(BQ, n_new - t0);         // tokens in this tile
        const int R = nq * G;                       // valid rows
        const int base_lim = ctx - n_new + t0 + 1;  // keys visible to the tile's first token
        const int kmax = base_lim + nq - 1;         // keys visible to the tile's last token
        const int ntiles = kmax > 0 ? (kmax + APF_KT - 1) / APF_KT : 0;
        // A sliding window: the tile's first row sees keys from base_lim - W on (every other row
        // from later), so the key tiles below that are skipped (kt0 = 0 without a window).
        const int kt0 = base_lim - W > 0 ? (base_lim - W) / APF_KT : 0;
        const int* bt = block_tables + (size_t)seq * max_pages;

        // this warp's rows [w*16, w*16+16): key limits of its first and last valid row
        const int wr0 = warp * 16;
        const bool wvalid = wr0 < R;
        const int w_lo = base_lim + (wvalid ? wr0 / G : 0);
        const int w_hi = base_lim + (wvalid ? (min(wr0 + 15, R - 1)) / G : 0);
        // this thread's two rows (gid, gid + 8): limits (0 for an invalid row: fully masked)
        const int r0 = wr0 + gid, r1 = r0 + 8;
        const int lim0 = r0 < R ? base_lim + r0 / G : 0;
        const int lim1 = r1 < R ? base_lim + r1 / G : 0;

        // ---- tile loaders (cp.async, zero-fill for keys >= kmax or -1 / out-of-table pages)
        auto issue = [&](bf16* dst, int kv, int kt) {
#pragma unroll
            for (int i = 0; i < (APF_KT * CH) / APF_THREADS; ++i) {
                const int qd = tid + i * APF_THREADS;
                const int jl = qd / CH, c = qd % CH;
                const int key = kt * APF_KT + jl;
                int off;
                const int page = kv_page(bt, key, kmax, max_pages, page_tokens, off);
                const bf16* src = kv_base;
                if (page >= 0)
                    src = kv_base + kv_offset(page, off, layer, kv, num_layers, page_tokens, kv_heads, D) +
                          (size_t)kvh * D + c * 8;
                cp_async16(dst + sw(jl, c), src, page >= 0 ? 16 : 0);
            }
            cp_async_commit();
        };

        // ---- Q tile -> Vs (rows >= R zero), K tile 0 -> Ks
#pragma unroll
        for (int i = 0; i < (APF_ROWS * CH) / APF_THREADS; ++i) {
            const int qd = tid + i * APF_THREADS;
            const int r = qd / CH, c = qd % CH;
            const bf16* src = q;
            if (r < R) {
                const int tl = r / G, g = r - tl * G;
                src = q + (size_t)(q0 + t0 + tl) * q_stride + (size_t)(kvh * G + g) * D + c * 8;
            }
            cp_async16(Vs + sw(r, c), src, r < R ? 16 : 0);
        }
        cp_async_commit();
        if (ntiles > kt0) issue(Ks, 0, kt0);
        cp_async_wait<0>();
        __syncthreads();

        // Q fragments (A operand, 16 x D per warp) to registers
        uint32_t qf[KS][4];
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            const int r = wr0 + (lane & 7) + ((lane >> 3) & 1) * 8;
            const int c = ks * 2 + (lane >> 4);
            apf_ldsm_x4(qf[ks], Vs + sw(r, c));
        }

        float o[NO][4];
#pragma unroll
        for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // per row (gid, gid+8), log2 domain

        for (int kt = kt0; kt < ntiles; ++kt) {
            cp_async_wait<0>();  // K[kt] landed
            __syncthreads();     // ... for every thread; every warp is done with Vs (Q or V[kt-1])
            issue(Vs, 1, kt);    // V[kt] loads during S = Q K^T

            const int kbase = kt * APF_KT;
            // warp-uniform: any visible key here (below the last row's limit, and not wholly
            // below the first row's window)
            const bool active = wvalid && kbase < w_hi && kbase + APF_KT > w_lo - W;
            float s[NS][4];
            if (active) {
#pragma unroll
                for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
                    for (int np = 0; np < NS / 2; ++np) {  // two n-tiles (16 keys) per ldmatrix.x4
                        uint32_t kf[4];
                        const int r = np * 16 + (lane & 7) + (lane >> 4) * 8;
                        const int c = ks * 2 + ((lane >> 3) & 1);
                        apf_ldsm_x4(kf, Ks + sw(r, c));
                        apf_mma(s[2 * np], qf[ks], kf[0], kf[1]);
                        apf_mma(s[2 * np + 1], qf[ks], kf[2], kf[3]);
                    }
                }
            }

            cp_async_wait<0>();  // V[kt] landed
            __syncthreads();     // ... for every thread; every warp is done with Ks
            if (kt + 1 < ntiles) issue(Ks, 0, kt + 1);  // K[kt+1] loads during softmax + P.V

            if (active) {
                // scale to the log2 domain, mask (only tiles crossing a row's limit or the
                // start of a row's window), row max
                const bool diag = kbase + APF_KT > w_lo || kbase < w_hi - W;
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int n = 0; n < NS; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float v = s[n][e] * scale_log2;
                        if (diag) {
                            const int key = kbase + n * 8 + tig * 2 + (e & 1);
                            const int lim = e < 2 ? lim0 : lim1;
                            if (key >= lim || key < lim - W) v = -INFINITY;
                        }
                        s[n][e] = v;
                    }
                    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
                // a row with no visible key so far keeps m = -inf: exponentiate against 0 (p = 0)
                const float b0 = mn0 == -INFINITY ? 0.f : mn0, b1 = mn1 == -INFINITY ? 0.f : mn1;
                const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);  // exp2f(-inf) = 0 at the start
                m0 = mn0;
                m1 = mn1;
                l0 *= a0;
                l1 *= a1;
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    o[n][0] *= a0;
                    o[n][1] *= a0;
                    o[n][2] *= a1;
                    o[n][3] *= a1;
                }
                // P as two bf16 A operands, hi = bf16(p) and lo = bf16(p - hi) (~16 bits of p
                // instead of 8: the real-model parity rule failed one prompt of 8 with P in bf16
                // alone), and O += hi V + lo V, 16 keys per k-step. l sums the fp32 weights.
#pragma unroll
                for (int kk = 0; kk < APF_KT / 16; ++kk) {
                    uint32_t pf[4], pl[4];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float* sv = s[2 * kk + h];
                        const float e0 = exp2f(sv[0] - b0), e1 = exp2f(sv[1] - b0);
                        const float e2 = exp2f(sv[2] - b1), e3 = exp2f(sv[3] - b1);
                        const uint32_t w01 = pack2(e0, e1);
                        const uint32_t w23 = pack2(e2, e3);
                        const float2 p01 = unpack2(w01), p23 = unpack2(w23);
                        l0 += e0 + e1;
                        l1 += e2 + e3;
                        pf[2 * h] = w01;      // a0 / a2: row gid
                        pf[2 * h + 1] = w23;  // a1 / a3: row gid + 8
                        pl[2 * h] = pack2(e0 - p01.x, e1 - p01.y);
                        pl[2 * h + 1] = pack2(e2 - p23.x, e3 - p23.y);
                    }
#pragma unroll
                    for (int np = 0; np < NO / 2; ++np) {  // two d n-tiles per ldmatrix.x4.trans
                        uint32_t vf[4];
                        const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                        const int c = np * 2 + (lane >> 4);
                        apf_ldsm_x4_t(vf, Vs + sw(r, c));
                        apf_mma(o[2 * np], pf, vf[0], vf[1]);
                        apf_mma(o[2 * np + 1], pf, vf[2], vf[3]);
                        apf_mma(o[2 * np], pl, vf[0], vf[1]);
                        apf_mma(o[2 * np + 1], pl, vf[2], vf[3]);
                    }
                }
            }
        }

        // ---- normalize and store (row sums over the quad)
        l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
        l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
        l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
        const float inv0 = l0 > 0.f ? 1.0f / l0 : 0.f, inv1 = l1 > 0.f ? 1.0f / l1 : 0.f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = h ? r1 : r0;
            if (r < R) {
                const float inv = h ? inv1 : inv0;
                const int tl = r / G, g = r - tl * G;
                bf16* dst = out + (size_t)(q0 + t0 + tl) * num_heads * D + (size_t)(kvh * G + g) * D + tig * 2;
#pragma unroll
                for (int n = 0; n < NO; ++n)
                    *reinterpret_cast<uint32_t*>(dst + n * 8) = pack2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
            }
        }
    }

    zero_padded_rows<D>(out, query_start, num_seqs, num_tokens, num_heads, kvh, G, tid, APF_THREADS);
}

extern "C" __global__ void __launch_bounds__(APF_THREADS) attention_prefill_d128(KERN_ATT_ARGS) {
    KERN_PDL_WAIT();
    attention_prefill_impl<128>(KERN_ATT_PASS);
}
extern "C" __global__ void __launch_bounds__(APF_THREADS) attention_prefill_d64(KERN_ATT_ARGS) {
    KERN_PDL_WAIT();
    attention_prefill_impl<64>(KERN_ATT_PASS);
}
