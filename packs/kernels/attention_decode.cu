// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Split-KV ("flash-decoding") paged GQA attention for rows of ONE query token (decode rows and
// speculative-verify rows), in two launches:
//
//   attention_decode_dD   grid [tokens, Hkv, Z], block [128]
//       CTA (t, kvh, z) takes token t's G = Hq / Hkv query heads of kv head `kvh` (the whole GQA
//       group: every K/V element it loads serves G heads) over the chunks z, z + Z, z + 2Z, ...
//       of the token's keys, and writes per chunk and head an fp32 record {o (unnormalized, D
//       floats), m (running max, log2 domain), l (sum of exp2)} into `partial`. CTA (t, 0, 0)
//       also writes the token's number of chunks into the header of `partial`.
//   attention_combine_dD  grid [tokens, Hq], block [D]
//       merges the chunks of (t, h) in chunk order: M = max m_c, w_c = exp2(m_c - M),
//       out = bf16(sum_c w_c o_c / sum_c w_c l_c), in the layout attention_dD writes.
//
// Any token of any step is handled correctly (the token's sequence is looked up in query_start,
// its causal limit is seq_lens - n_new + i + 1), so the choice between this path and
// attention_dD (attention.cu) is a performance choice only: the manifest uses this one when
// tokens <= seqs (every row one token).
//
// Batch invariance: a token's chunking depends on the token alone. With kmax visible keys,
//   chunk = max(round_up(min_chunk, 32), round_up(ceil(kmax / max_chunks), 32))
// keys (min_chunk and max_chunks are constants of the manifest), so the token has
// n = ceil(kmax / chunk) <= max_chunks chunks, chunk c holding keys [c*chunk, min(c*chunk+chunk, kmax)).
// Z = gridDim.z only decides which CTA computes which chunk (for occupancy: the manifest picks it
// from the step's size); every chunk is computed from scratch by one CTA in the same fp32 order
// and gets its own record, and the combine reduces the n records in a fixed order. So a token's
// output bits depend on its query, its keys and values and kmax only: never on the step's other
// rows, its token count or Z (a decode row and the same row in a verify step are bit-identical).
// Chunks start at multiples of 32 keys, so the key tiles (32 keys, one per lane) and the order of
// every fp32 operation inside a chunk are exactly attention_dD's: a token whose keys fit in one
// chunk gets a result bit-identical to attention_dD's (the combine of one chunk is o * (1/l)).
// A CTA with several chunks streams their tiles through one cp.async pipeline (no refill between
// chunks), resetting (m, l, o) at each chunk's first tile and writing the record after its last.
//
// Scratch layout (`partial`, fp32), T = num_tokens, Hq = num_heads:
//   [0, T4)                       header: float(n) of token t at [t]; T4 = round_up(T, 4)
//   T4 + ((c*T + t)*Hq + h)*(D+4) record of (chunk c, token t, head h):
//                                 [0, D) o, [D] m, [D+1] l, [D+2..D+3] unused (16-byte records)
// The buffer must hold T4 + max_chunks * T * Hq * (D + 4) floats (KERNELS.md: the generator sizes it).
//
// Inner loop (per 32-key tile, as attention.cu): K/V tiles via cp.async (2 stages, XOR-swizzled,
// zero-filled beyond the chunk or on a -1 page); q of the group in shared memory as fp32; warp w
// owns heads w, w+4, w+8, w+12; lane j scores key j; P.V gives each lane D/32 output dims.
//
// Built WITHOUT --use_fast_math (exp2f as the library function; no flush-to-zero).
#include "common.cuh"
#include "attention_common.cuh"

using namespace kern;

#define DEC_THREADS 128
#define DEC_WARPS 4
#define DEC_ROWS 16  // query heads per kv head (G) at most
#define DEC_RPW 4    // heads per warp
#define DEC_KT 32    // keys per smem tile (one per lane)
#define DEC_MAX_SPLITS 128  // max_chunks at most



// First float of the record of (chunk c, token t, head h).
static __device__ __forceinline__ size_t dec_record(int num_tokens, int num_heads, int D, int c, int t, int h) {
    const size_t hdr = ((size_t)num_tokens + 3) & ~(size_t)3;
    return hdr + (((size_t)c * (size_t)num_tokens + (size_t)t) * (size_t)num_heads + (size_t)h) * (size_t)(D + 4);
}

// The kernel's shared memory: 42 KB at D = 128 (static), 82 KB at D = 256 (dynamic: the
// manifest's `shared` must be at least sizeof(DecSmem<256>)).
template <int D>
struct DecSmem {
    __align__(16) float Qs[DEC_ROWS][D];
    __align__(16) bf16 Ks[2][DEC_KT][D];  // chunk c of key row j stored at chunk c ^ (j & 7)
    __align__(16) bf16 Vs[2][DEC_KT][D];
    __align__(16) float Ps[DEC_WARPS][DEC_RPW][DEC_KT];
    int s_info[4];  // seq, kmax, chunk, first key of chunk 0
};

template <int D>
__device__ __forceinline__ void decode_impl(
    float* __restrict__ partial, const bf16* __restrict__ q, const bf16* __restrict__ kv_base,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens, const int* __restrict__ query_start,
    int num_seqs, int num_tokens, int max_pages, int q_stride, int num_heads, int kv_heads, int layer,
    int num_layers, int page_tokens, float scale, int min_chunk, int max_chunks, int window) {
    constexpr int CH = D / 8;    // 16-byte chunks per head row
    constexpr int DPL = D / 32;  // output dims per lane
    KERN_SMEM(DecSmem<D>, sm);
    auto& Qs = sm.Qs;
    auto& Ks = sm.Ks;
    auto& Vs = sm.Vs;
    auto& Ps = sm.Ps;
    auto& s_info = sm.s_info;
    const int W = att_window(window);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
    const int Z = gridDim.z;  // which CTA computes which chunk only: never the chunking (see above)
    if (kv_heads <= 0 || num_heads % kv_heads != 0 || (int)gridDim.y != kv_heads) __trap();
    const int G = num_heads / kv_heads;
    if (G > DEC_ROWS || max_chunks < 1 || max_chunks > DEC_MAX_SPLITS) __trap();
    if (t >= num_tokens) return;  // uniform over the CTA
    const float scale_log2 = scale * 1.4426950408889634f;

    // ---- token -> (sequence, visible keys). query_start is nondecreasing; tokens at or past
    // query_start[num_seqs] are padding (no sequence: no keys, zeros in the output).
    if (warp == 0) {
        int seq = -1;
        const int qend = query_start[num_seqs];
        if (t < qend) {
            bool found = false;
            if (t < num_seqs) {  // decode rows: token t is sequence t's only token
                const int a = query_start[t], b = query_start[t + 1];
                if (a <= t && t < b) {
                    seq = t;
                    found = true;
                }
            }
            for (int base = 0; !found && base <= num_seqs; base += 32) {
                const int s = base + lane;
                const int v = s <= num_seqs ? query_start[s] : 0x7fffffff;
                const unsigned hit = __ballot_sync(0xffffffffu, v > t);
                if (hit) {  // the first entry past t closes t's sequence
                    seq = base + __ffs(hit) - 2;
                    found = true;
                }
            }
        }
        int kmax = 0, chunk = DEC_KT, kb = 0;
        if (seq >= 0) {
            const int q0 = query_start[seq];
            const int n_new = query_start[seq + 1] - q0;
            kmax = seq_lens[seq] - n_new + (t - q0) + 1;  // keys 0 .. kmax-1 are visible
            if (kmax < 0) kmax = 0;
            // With a sliding window only keys kmax - W .. kmax - 1 are visible: the chunks cover
            // [kb, kmax) from kb = that start rounded down to a multiple of 32 (kb = 0 without a
            // window), so the chunking is still the row's alone.
            kb = kmax - W > 0 ? (kmax - W) / DEC_KT * DEC_KT : 0;
            const int mc = max(DEC_KT, (min_chunk + DEC_KT - 1) / DEC_KT * DEC_KT);
            const int per = (kmax - kb + max_chunks - 1) / max_chunks;
            chunk = max(mc, (per + DEC_KT - 1) / DEC_KT * DEC_KT);
        }
        if (lane == 0) {
            s_info[0] = seq;
            s_info[1] = kmax;
            s_info[2] = chunk;
            s_info[3] = kb;
        }
    }
    __syncthreads();
    const int seq = s_info[0];
    const int kmax = s_info[1];
    const int chunk = s_info[2];
    const int kb = s_info[3];
    const int klo = kmax - W;  // the row's first visible key (negative: every key from 0)
    const int n_chunks = (seq >= 0 && kmax > kb) ? (kmax - kb + chunk - 1) / chunk : 0;
    if (kvh == 0 && z == 0 && tid == 0) partial[t] = (float)n_chunks;  // the combine's header
    if (z >= n_chunks) return;  // uniform

    // This CTA's chunks: z, z + Z, ..., streamed as one sequence of tiles. Every chunk but the
    // token's last has tpc tiles; the last chunk (if it is this CTA's) may have fewer.
    const int tpc = chunk / DEC_KT;
    const int mine = (n_chunks - 1 - z) / Z + 1;
    const int c_last = z + (mine - 1) * Z;
    const int ntiles = (mine - 1) * tpc + (min(chunk, kmax - kb - c_last * chunk) + DEC_KT - 1) / DEC_KT;
    const int* bt = block_tables + (size_t)seq * max_pages;

    // ---- K/V tile loader (cp.async, zero-fill for keys >= k_end or pages that are -1/out of table):
    // tile kt of this CTA is tile (kt % tpc) of chunk z + (kt / tpc) * Z.
    auto issue = [&](int stage, int kt) {
        const int ci = kt / tpc;
        const int kc = kb + (z + ci * Z) * chunk;
        const int kbase = kc + (kt - ci * tpc) * DEC_KT;
        const int kend = min(kc + chunk, kmax);
#pragma unroll
        for (int i = 0; i < (DEC_KT * CH) / DEC_THREADS; ++i) {
            const int qd = tid + i * DEC_THREADS;
            const int jl = qd / CH, c = qd % CH;
            const int key = kbase + jl;
            int off;
            const int page = kv_page(bt, key, kend, max_pages, page_tokens, off);
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

    issue(0, 0);

    // ---- the group's q rows -> smem as fp32 (rows >= G are zero)
    for (int qd = tid; qd < DEC_ROWS * CH; qd += DEC_THREADS) {
        const int r = qd / CH, c = qd % CH;
        float x[8];
        if (r < G) {
            const bf16* src = q + (size_t)t * q_stride + (size_t)(kvh * G + r) * D + c * 8;
            unpack8(*reinterpret_cast<const uint4*>(src), x);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) x[e] = 0.f;
        }
        *reinterpret_cast<float4*>(&Qs[r][c * 8]) = make_float4(x[0], x[1], x[2], x[3]);
        *reinterpret_cast<float4*>(&Qs[r][c * 8 + 4]) = make_float4(x[4], x[5], x[6], x[7]);
    }

    float o[DEC_RPW][DPL];
    float m[DEC_RPW], l[DEC_RPW];

    int ci = 0, j = 0;  // tile kt is tile j of this CTA's chunk ci (chunk z + ci * Z)
    for (int kt = 0; kt < ntiles; ++kt) {
        const int st = kt & 1;
        const int kc = kb + (z + ci * Z) * chunk;  // the chunk's first key (a multiple of 32)
        const int k_end = min(kc + chunk, kmax);
        if (j == 0) {  // a chunk starts: its own online softmax
#pragma unroll
            for (int i = 0; i < DEC_RPW; ++i) {
                m[i] = -INFINITY;
                l[i] = 0.f;
#pragma unroll
                for (int d = 0; d < DPL; ++d) o[i][d] = 0.f;
            }
        }
        if (kt + 1 < ntiles) {
            issue(st ^ 1, kt + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // (first tile: also orders the Qs stores above)

        // scores of key (kc + j*32 + lane) for this warp's heads
        float s[DEC_RPW];
#pragma unroll
        for (int i = 0; i < DEC_RPW; ++i) s[i] = 0.f;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            float kx[8];
            unpack8(*reinterpret_cast<const uint4*>(&Ks[st][lane][(c ^ (lane & 7)) * 8]), kx);
#pragma unroll
            for (int i = 0; i < DEC_RPW; ++i) {
                if (warp + DEC_WARPS * i < G) {
                    const float4 qa = *reinterpret_cast<const float4*>(&Qs[warp + DEC_WARPS * i][c * 8]);
                    const float4 qb = *reinterpret_cast<const float4*>(&Qs[warp + DEC_WARPS * i][c * 8 + 4]);
                    const float qx[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                    for (int e = 0; e < 8; ++e) s[i] = fmaf(qx[e], kx[e], s[i]);
                }
            }
        }
        softmax_pv_tile<D, DEC_RPW, DEC_WARPS, DEC_KT>(s, m, l, o, Ps[warp], Vs[st], lane, warp, G, kc + j * DEC_KT + lane,
                                                        scale_log2, [&](int, int key) { return key < k_end && key >= klo; });
        if (kc + (j + 1) * DEC_KT >= k_end) {
            // ---- the chunk's last tile: its record per head (unnormalized o, m, l)
#pragma unroll
            for (int i = 0; i < DEC_RPW; ++i) {
                const int r = warp + DEC_WARPS * i;
                if (r < G) {
                    const float lt = warp_sum(l[i]);
                    float* rec = partial + dec_record(num_tokens, num_heads, D, z + ci * Z, t, kvh * G + r);
                    if constexpr (DPL == 8) {
                        *reinterpret_cast<float4*>(rec + lane * 8) = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
                        *reinterpret_cast<float4*>(rec + lane * 8 + 4) = make_float4(o[i][4], o[i][5], o[i][6], o[i][7]);
                    } else if constexpr (DPL == 4) {
                        *reinterpret_cast<float4*>(rec + lane * 4) = make_float4(o[i][0], o[i][1], o[i][2], o[i][3]);
                    } else {
                        *reinterpret_cast<float2*>(rec + lane * 2) = make_float2(o[i][0], o[i][1]);
                    }
                    if (lane == 0) {
                        rec[D] = m[i];
                        rec[D + 1] = lt;
                    }
                }
            }
            ++ci;
            j = 0;
        } else {
            ++j;
        }
        __syncthreads();  // the stage read here is overwritten by the next iteration's issue
    }
}

template <int D>
__device__ __forceinline__ void combine_impl(bf16* __restrict__ out, const float* __restrict__ partial,
                                             int num_tokens, int num_heads) {
    __shared__ float s_m[DEC_MAX_SPLITS];
    __shared__ float s_w[DEC_MAX_SPLITS];
    __shared__ float s_inv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = blockIdx.x, h = blockIdx.y;
    if (t >= num_tokens || h >= num_heads) return;
    int n = (int)partial[t];
    n = n < 0 ? 0 : (n > DEC_MAX_SPLITS ? DEC_MAX_SPLITS : n);
    bf16* dst = out + ((size_t)t * num_heads + h) * D;
    if (n == 0) {  // padded token (or no visible key): zeros, like attention_dD
        for (int d = tid; d < D; d += blockDim.x) dst[d] = b(0.f);
        return;
    }
    const float* rec0 = partial + dec_record(num_tokens, num_heads, D, 0, t, h);
    const size_t rstride = (size_t)num_tokens * num_heads * (D + 4);  // chunk sp -> sp+1
    for (int sp = tid; sp < n; sp += blockDim.x) {
        s_m[sp] = rec0[sp * rstride + D];
        s_w[sp] = rec0[sp * rstride + D + 1];  // l, replaced by the weight below
    }
    __syncthreads();
    if (warp == 0) {
        float mx = -INFINITY;
        for (int sp = lane; sp < n; sp += 32) mx = fmaxf(mx, s_m[sp]);
        mx = warp_max(mx);
        float L = 0.f;
        for (int sp = lane; sp < n; sp += 32) {
            const float w = exp2f(s_m[sp] - mx);
            L += s_w[sp] * w;
            s_w[sp] = w;
        }
        L = warp_sum(L);
        if (lane == 0) s_inv = 1.0f / L;
    }
    __syncthreads();
    const float inv = s_inv;
    for (int d = tid; d < D; d += blockDim.x) {
        float acc = 0.f;
        const float* p = rec0 + d;
#pragma unroll 4
        for (int sp = 0; sp < n; ++sp) acc = fmaf(p[sp * rstride], s_w[sp], acc);
        dst[d] = b(acc * inv);
    }
}

#define DEC_ARGS                                                                                              \
    float *__restrict__ partial, const bf16 *__restrict__ q, const bf16 *__restrict__ kv_base,              \
        const int *__restrict__ block_tables, const int *__restrict__ seq_lens,                              \
        const int *__restrict__ query_start, int num_seqs, int num_tokens, int max_pages, int q_stride,      \
        int num_heads, int kv_heads, int layer, int num_layers, int page_tokens, float scale, int min_chunk, int max_chunks, \
        int window
#define DEC_PASS                                                                                              \
    partial, q, kv_base, block_tables, seq_lens, query_start, num_seqs, num_tokens, max_pages, q_stride,     \
        num_heads, kv_heads, layer, num_layers, page_tokens, scale, min_chunk, max_chunks, window

extern "C" __global__ void __launch_bounds__(DEC_THREADS) attention_decode_d128(DEC_ARGS) {
    KERN_PDL_WAIT();
    decode_impl<128>(DEC_PASS);
}
extern "C" __global__ void __launch_bounds__(DEC_THREADS) attention_decode_d64(DEC_ARGS) {
    KERN_PDL_WAIT();
    decode_impl<64>(DEC_PASS);
}
// head_dim 256 (Gemma 3): 82 KB of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(DEC_THREADS) attention_decode_d256(DEC_ARGS) {
    KERN_PDL_WAIT();
    decode_impl<256>(DEC_PASS);
}
extern "C" __global__ void __launch_bounds__(256) attention_combine_d256(bf16* __restrict__ out,
                                                                        const float* __restrict__ partial,
                                                                        int num_tokens, int num_heads) {
    KERN_PDL_WAIT();
    combine_impl<256>(out, partial, num_tokens, num_heads);
}
extern "C" __global__ void __launch_bounds__(128) attention_combine_d128(bf16* __restrict__ out,
                                                                        const float* __restrict__ partial,
                                                                        int num_tokens, int num_heads) {
    KERN_PDL_WAIT();
    combine_impl<128>(out, partial, num_tokens, num_heads);
}
extern "C" __global__ void __launch_bounds__(64) attention_combine_d64(bf16* __restrict__ out,
                                                                      const float* __restrict__ partial,
                                                                      int num_tokens, int num_heads) {
    KERN_PDL_WAIT();
    combine_impl<64>(out, partial, num_tokens, num_heads);
}
