// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Gated DeltaNet (Qwen3-Next / Qwen3.5 linear-attention layers; issue 30): the causal depthwise
// conv1d over the concatenated q/k/v projection, the gated delta rule (chunked form for prefill,
// recurrent form for decode, q/k L2 norm and the gates fused in) and the gated RMSNorm.
//
// Semantics: transformers' pure-torch path of modeling_qwen3_next.py (torch_causal_conv1d_update,
// torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule, Qwen3NextRMSNormGated), with the
// q/k L2 norm in fp32 as FLA's kernels do it (use_qk_l2norm_in_kernel). bf16 activations, fp32
// arithmetic; the recurrent state is fp32 (`_f32` entries) or bf16 (`_bf16`), per sequence in the
// `bytes_per_seq` state, at the row's `seq_slots` entry. A row whose first token has position 0
// starts from a zero state (the engine never initializes a slot); a row with slot -1 or no
// tokens touches nothing.
//
// Per-sequence slot layout (bytes), GDN layer l of num_layers (conv_dim = 2*Hk*D + Hv*D, D = 128):
//   slot base = state + slot * bytes_per_seq,   bytes_per_seq = num_layers * layer_bytes
//   layer_bytes = conv_bytes + rec_bytes,  conv_bytes = (KW-1) * conv_dim * 2,
//   rec_bytes = Hv * D * D * (4 for _f32 | 2 for _bf16)
//   layer l: [conv state: (KW-1) rows of conv_dim bf16, oldest input first]
//            [recurrent state S: Hv x D (k) x D (v), row-major (S[h][dk][dv])]
// See KERNELS.md ("Gated DeltaNet") for grids, blocks and shared memory.
//
// Built WITHOUT --use_fast_math (expf / log1pf / rsqrtf are the library functions).
#include "common.cuh"

using namespace kern;

#define GDN_KW 4            // conv kernel width (Qwen3-Next / Qwen3.5: 4)
#define GDN_C 64            // chunk length of the chunked form
#define GDN_CHUNK_THREADS 256
#define GDN_CONV_THREADS 128  // gdn_conv: 8 channels per thread (1024 per CTA); gdn_conv_state: 2 (256)
#define GDN_CONV_TOKENS 16    // tokens per CTA of gdn_conv
#define GDN_NORM_THREADS 256  // 8 warps, one (token, head) each

namespace gdn {

template <int D, class ST>
struct Layout {
    int conv_dim;
    size_t conv_bytes, rec_bytes, layer_bytes, seq_bytes;
    __device__ __forceinline__ Layout(int hk, int hv, int num_layers) {
        conv_dim = (2 * hk + hv) * D;
        conv_bytes = (size_t)(GDN_KW - 1) * (size_t)conv_dim * 2;
        rec_bytes = (size_t)hv * D * D * sizeof(ST);
        layer_bytes = conv_bytes + rec_bytes;
        seq_bytes = layer_bytes * (size_t)num_layers;
    }
    __device__ __forceinline__ unsigned char* layer_base(unsigned char* state, int slot, int layer) const {
        return state + (size_t)slot * seq_bytes + (size_t)layer * layer_bytes;
    }
    __device__ __forceinline__ bf16* conv(unsigned char* state, int slot, int layer) const {
        return reinterpret_cast<bf16*>(layer_base(state, slot, layer));
    }
    __device__ __forceinline__ ST* rec(unsigned char* state, int slot, int layer, int h) const {
        return reinterpret_cast<ST*>(layer_base(state, slot, layer) + conv_bytes) + (size_t)h * D * D;
    }
};

__device__ __forceinline__ float ld_state(const float* p) { return *p; }
__device__ __forceinline__ float ld_state(const bf16* p) { return f(*p); }
__device__ __forceinline__ void st_state(float* p, float v) { *p = v; }
__device__ __forceinline__ void st_state(bf16* p, float v) { *p = b(v); }

// torch: F.softplus(x) (beta 1, threshold 20) in fp32.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
// g = -exp(A_log) * softplus(a + dt_bias) (fp32); beta = bf16(sigmoid(b)) (torch's bf16 sigmoid).
__device__ __forceinline__ float gate_g(float a, float A_log, float dt_bias) {
    return -expf(A_log) * softplus(a + dt_bias);
}
__device__ __forceinline__ float gate_beta(float bb) { return rb(1.f / (1.f + expf(-bb))); }

// The row (sequence) of token t: the largest s < seqs with query_start[s] <= t, or -1 when t is
// past query_start[seqs] (a padded token).
__device__ __forceinline__ int row_of(const int* query_start, int seqs, int t) {
    if (seqs <= 0 || t < query_start[0] || t >= query_start[seqs]) return -1;
    int lo = 0, hi = seqs;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (query_start[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ------------------------------------------------------------------ causal conv1d (+ SiLU)
// y[t, c] = bf16(silu(bf16(sum_j w[c, j] * in[t - (KW-1) + j, c]))) where `in` is the row's
// inputs preceded by its conv state (zeros when the row starts at position 0). The conv state is
// read only; gdn_conv_state writes it afterwards. A thread takes 8 channels (16-byte loads) over
// GDN_CONV_TOKENS consecutive tokens of the step, keeping the last KW-1 inputs in registers (one
// load per token; the window is refilled at a row's first token and at the tile's first token).
__device__ __forceinline__ void load8(float (&v)[8], const bf16* p) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const float2 a = unpack2(u.x), b2 = unpack2(u.y), c = unpack2(u.z), d = unpack2(u.w);
    v[0] = a.x, v[1] = a.y, v[2] = b2.x, v[3] = b2.y, v[4] = c.x, v[5] = c.y, v[6] = d.x, v[7] = d.y;
}

template <int D, class ST>
__device__ __forceinline__ void conv_impl(bf16* __restrict__ y, const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          unsigned char* state, const int* __restrict__ query_start,
                                          const int* __restrict__ positions, const int* __restrict__ seq_slots,
                                          int seqs, int tokens, int ld_x, int ld_y, int hk, int hv, int layer,
                                          int num_layers) {
    const Layout<D, ST> L(hk, hv, num_layers);
    const int c = (blockIdx.x * GDN_CONV_THREADS + threadIdx.x) * 8;
    if (c >= L.conv_dim) return;
    float wt[GDN_KW][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < GDN_KW; ++j) wt[j][i] = f(w[(size_t)(c + i) * GDN_KW + j]);
    const int t0 = blockIdx.y * GDN_CONV_TOKENS;
    if (t0 >= tokens) return;
    const int end = query_start[seqs];
    int s = row_of(query_start, seqs, t0);
    uint4 xr[GDN_CONV_TOKENS];  // the tile's inputs, all loads issued before any is used
#pragma unroll
    for (int u = 0; u < GDN_CONV_TOKENS; ++u) {
        const int t = t0 + u;
        xr[u] = t < end ? *reinterpret_cast<const uint4*>(x + (size_t)t * ld_x + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    float win[GDN_KW - 1][8];  // inputs t-3, t-2, t-1
    int have = -1;             // the row whose window is loaded
#pragma unroll
    for (int u = 0; u < GDN_CONV_TOKENS; ++u) {
        const int t = t0 + u;
        if (t >= tokens) break;
        uint4* yp = reinterpret_cast<uint4*>(y + (size_t)t * ld_y + c);
        if (t >= end || s < 0) {  // padded token: zeros
            *yp = make_uint4(0u, 0u, 0u, 0u);
            continue;
        }
        while (t >= query_start[s + 1]) ++s;  // next non-empty row (t < end: terminates)
        const int slot = seq_slots[s];
        if (slot < 0) {
            *yp = make_uint4(0u, 0u, 0u, 0u);
            continue;
        }
        const int a = query_start[s];
        if (have != s) {  // (re)fill the window: inputs t-3 .. t-1 from x, the conv state or zeros
            const bool fresh = positions[a] == 0;
            const bf16* cs = L.conv(state, slot, layer);
#pragma unroll
            for (int j = 0; j < GDN_KW - 1; ++j) {
                const int idx = t - (GDN_KW - 1) + j;
                if (idx >= a) load8(win[j], x + (size_t)idx * ld_x + c);
                else if (fresh) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) win[j][i] = 0.f;
                } else {
                    load8(win[j], cs + (size_t)((GDN_KW - 1) - (a - idx)) * L.conv_dim + c);
                }
            }
            have = s;
        }
        float cur[8];
        {
            const float2 p0 = unpack2(xr[u].x), p1 = unpack2(xr[u].y), p2 = unpack2(xr[u].z), p3 = unpack2(xr[u].w);
            cur[0] = p0.x, cur[1] = p0.y, cur[2] = p1.x, cur[3] = p1.y, cur[4] = p2.x, cur[5] = p2.y, cur[6] = p3.x, cur[7] = p3.y;
        }
        float out[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < GDN_KW - 1; ++j) acc = fmaf(wt[j][i], win[j][i], acc);
            acc = fmaf(wt[GDN_KW - 1][i], cur[i], acc);
            out[i] = silu(rb(acc));
        }
        *yp = make_uint4(pack2(out[0], out[1]), pack2(out[2], out[3]), pack2(out[4], out[5]), pack2(out[6], out[7]));
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
            for (int j = 0; j < GDN_KW - 2; ++j) win[j][i] = win[j + 1][i];
            win[GDN_KW - 2][i] = cur[i];
        }
    }
}

// New conv state of each row: the last KW-1 inputs of [old state | row inputs].
template <int D, class ST>
__device__ __forceinline__ void conv_state_impl(const bf16* __restrict__ x, unsigned char* state,
                                                const int* __restrict__ query_start, const int* __restrict__ positions,
                                                const int* __restrict__ seq_slots, int seqs, int ld_x, int hk, int hv,
                                                int layer, int num_layers) {
    const Layout<D, ST> L(hk, hv, num_layers);
    const int c = (blockIdx.x * GDN_CONV_THREADS + threadIdx.x) * 2;  // 256 channels per CTA
    const int s = blockIdx.y;
    if (c >= L.conv_dim || s >= seqs) return;
    const int slot = seq_slots[s];
    const int a = query_start[s], n = query_start[s + 1] - a;
    if (slot < 0 || n <= 0) return;
    const bool fresh = positions[a] == 0;
    bf16* cs = L.conv(state, slot, layer);
    uint32_t old[GDN_KW - 1], nw[GDN_KW - 1];
#pragma unroll
    for (int j = 0; j < GDN_KW - 1; ++j)
        old[j] = fresh ? 0u : *reinterpret_cast<const uint32_t*>(cs + (size_t)j * L.conv_dim + c);
#pragma unroll
    for (int j = 0; j < GDN_KW - 1; ++j) {
        const int m = n + j;  // index in [old (KW-1) | inputs (n)]
        nw[j] = m < GDN_KW - 1 ? old[m] : *reinterpret_cast<const uint32_t*>(x + (size_t)(a + m - (GDN_KW - 1)) * ld_x + c);
    }
#pragma unroll
    for (int j = 0; j < GDN_KW - 1; ++j) *reinterpret_cast<uint32_t*>(cs + (size_t)j * L.conv_dim + c) = nw[j];
}

// ------------------------------------------------------------------ gated delta rule, chunked
// One CTA per (row, v-head, slice of BV value columns). The columns of S are independent in the
// recurrence, so a CTA keeps only S[:, slice] (fp32, shared memory) and walks the row's chunks of
// 64 tokens in order. Per chunk (gc = cumsum of g within the chunk, Γ[i][j] = exp(gc_i - gc_j)):
//   M = strict_lower(diag(β) K Kᵀ ∘ Γ)           P = lower(Q Kᵀ ∘ Γ)  (with the diagonal)
//   W = (I + M)⁻¹ diag(β e^gc) K                  U = (I + M)⁻¹ diag(β) V     (forward substitution)
//   V' = U - W S        O = diag(e^gc) Q S + P V'        S = e^gc_last S + (diag(e^(gc_last - gc)) K)ᵀ V'
// which is torch_chunk_gated_delta_rule's algebra. CUDA cores, fp32 throughout.
// GDN_TC (default 0): the chunk's products (steps 2, 4, 5, 6) on tensor cores as 3xTF32 — checked
// on the H200 (gdn_verify.py 30/30) but not faster (3.63 ms vs 3.44 ms for an 8192-token prompt):
// the products are not what bounds the kernel (most likely the latency of one 8-warp CTA per SM,
// 165 KB of shared memory, and the serial forward substitution). The mma:
// mma.sync m16n8k8 tf32 with each fp32 operand split into a tf32 high part and a tf32 low part,
// d += a_lo·b_hi + a_hi·b_lo + a_hi·b_hi: about fp32 accuracy (the a_lo·b_lo term, ~2^-22
// relative, is dropped; the accumulation is the tensor cores' fp32). GDN_TC 0: CUDA-core FMAs.
#ifndef GDN_TC
#define GDN_TC 0
#endif
// Fragments (PTX ISA, m16n8k8 .tf32; g = lane / 4, t = lane % 4): A 16x8 row-major a0 (g, t),
// a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B 8x8 (k x n) b0 (t, g), b1 (t+4, g); C/D 16x8 c0, c1
// (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
#ifdef KERN_HOST_EMU
// Host emulation: the warp's operands through emu.h's per-warp slots; products and sums in double,
// rounded to fp32 once (checks the fragment indexing, not the tensor cores' rounding).
__device__ inline void mma3_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    EmuTcSlot& me = g_emu_tc[w][l];
    for (int i = 0; i < 4; ++i) std::memcpy(&me.a[i], &a[i], 4);
    for (int i = 0; i < 2; ++i) std::memcpy(&me.b[i], &b[i], 4);
    g_cta->warps[w]->arrive_and_wait();
    auto A = [&](int row, int k) {
        float v;
        std::memcpy(&v, &g_emu_tc[w][4 * (row % 8) + k % 4].a[(row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)], 4);
        return v;
    };
    auto B = [&](int k, int n) {
        float v;
        std::memcpy(&v, &g_emu_tc[w][4 * n + k % 4].b[k >= 4 ? 1 : 0], 4);
        return v;
    };
    const int g = l / 4, t = l % 4;
    float res[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        double acc = d[e];
        for (int k = 0; k < 8; ++k) acc += (double)A(row, k) * (double)B(k, col);
        res[e] = (float)acc;
    }
    g_cta->warps[w]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}
#else
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma3_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    uint32_t ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        ah[i] = to_tf32(a[i]);
        al[i] = to_tf32(a[i] - __uint_as_float(ah[i]));
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        bh[i] = to_tf32(b[i]);
        bl[i] = to_tf32(b[i] - __uint_as_float(bh[i]));
    }
    mma_tf32(d, al, bh[0], bh[1]);
    mma_tf32(d, ah, bl[0], bl[1]);
    mma_tf32(d, ah, bh[0], bh[1]);
}
#endif

template <int D, int BV>
struct ChunkSmem {
    float Q[GDN_C][D + 4];   // l2-normalized q * D^-0.5
    float K[GDN_C][D + 4];   // l2-normalized k
    float W[GDN_C][D + 4];
    float S[D][BV + 4];
    float V[GDN_C][BV + 4];  // v -> U -> V'
    float M[GDN_C][GDN_C + 4];  // rows 16-byte aligned (float4 reads in step 3)
    float P[GDN_C][GDN_C + 4];
    float g[GDN_C], gc[GDN_C], beta[GDN_C], eg[GDN_C], ek[GDN_C];  // eg = e^gc, ek = e^(gc_last - gc)
};

template <int D, int BV, class ST>
__device__ __forceinline__ void chunk_impl(bf16* __restrict__ o, const bf16* __restrict__ y, const bf16* __restrict__ bb,
                                           const bf16* __restrict__ aa, const float* __restrict__ A_log,
                                           const float* __restrict__ dt_bias, unsigned char* state,
                                           const int* __restrict__ query_start, const int* __restrict__ positions,
                                           const int* __restrict__ seq_slots, int seqs, int ld_y, int ld_ab, int ld_o,
                                           int hk, int hv, int layer, int num_layers) {
    static_assert(D % 32 == 0 && BV % 32 == 0 && D % BV == 0, "tiling");
    static_assert(D + BV <= GDN_CHUNK_THREADS && (GDN_C * BV) % (4 * GDN_CHUNK_THREADS) == 0 &&
                      (D * BV) % (4 * GDN_CHUNK_THREADS) == 0 && (GDN_C / 4) * (GDN_C / 4 + 1) / 2 <= GDN_CHUNK_THREADS,
                  "tiling");
    constexpr int NT = GDN_CHUNK_THREADS, C = GDN_C;
    using Smem = ChunkSmem<D, BV>;
    KERN_SMEM(Smem, sm);
    const int s = blockIdx.x, h = blockIdx.y, v0 = blockIdx.z * BV;
    if (s >= seqs) return;
    const int slot = seq_slots[s];
    const int a = query_start[s], n = query_start[s + 1] - a;
    if (slot < 0 || n <= 0) return;
    const Layout<D, ST> L(hk, hv, num_layers);
    const int kh = h / (hv / hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float scale = 1.f / sqrtf((float)D);
    const float Al = A_log[h], dtb = dt_bias[h];
    ST* Sg = L.rec(state, slot, layer, h);
    const bool fresh = positions[a] == 0;
    for (int i = tid; i < D * BV; i += NT) {
        const int d = i / BV, e = i % BV;
        sm.S[d][e] = fresh ? 0.f : ld_state(Sg + (size_t)d * D + v0 + e);
    }
    const int qcol = kh * D, kcol = hk * D + kh * D, vcol = 2 * hk * D + h * D + v0;

    for (int c0 = 0; c0 < n; c0 += C) {
        const int Lc = min(C, n - c0);
        __syncthreads();  // S written (load / previous chunk), previous chunk's reads done
        // 1. load: q, k, the v slice as fp32 (16-byte loads, all issued before any is used), gates;
        //    then the l2 norms from shared memory (q also scaled by D^-0.5)
        {
            constexpr int QV = D / 8, VV = BV / 8, PER = 2 * QV + VV;  // 16-byte vectors per token
            constexpr int ITEMS = C * PER, ITER = (ITEMS + NT - 1) / NT;
            uint4 raw[ITER];
#pragma unroll
            for (int n = 0; n < ITER; ++n) {
                const int item = tid + n * NT, i = item / PER, part = item % PER;
                raw[n] = make_uint4(0u, 0u, 0u, 0u);
                if (item < ITEMS && i < Lc) {
                    const bf16* row = y + (size_t)(a + c0 + i) * ld_y;
                    const int col = part < QV ? qcol + part * 8 : part < 2 * QV ? kcol + (part - QV) * 8 : vcol + (part - 2 * QV) * 8;
                    raw[n] = *reinterpret_cast<const uint4*>(row + col);
                }
            }
            float gi = 0.f, bi = 0.f;
            if (tid < C && tid < Lc) {
                const size_t t = (size_t)(a + c0 + tid);
                gi = gate_g(f(aa[t * ld_ab + h]), Al, dtb);
                bi = gate_beta(f(bb[t * ld_ab + h]));
            }
#pragma unroll
            for (int n = 0; n < ITER; ++n) {
                const int item = tid + n * NT, i = item / PER, part = item % PER;
                if (item < ITEMS) {
                    float* dst = part < QV ? &sm.Q[i][part * 8] : part < 2 * QV ? &sm.K[i][(part - QV) * 8] : &sm.V[i][(part - 2 * QV) * 8];
                    const float2 p0 = unpack2(raw[n].x), p1 = unpack2(raw[n].y), p2 = unpack2(raw[n].z), p3 = unpack2(raw[n].w);
                    *reinterpret_cast<float4*>(dst) = make_float4(p0.x, p0.y, p1.x, p1.y);
                    *reinterpret_cast<float4*>(dst + 4) = make_float4(p2.x, p2.y, p3.x, p3.y);
                }
            }
            if (tid < C) {
                sm.g[tid] = gi;
                sm.beta[tid] = bi;
            }
        }
        __syncthreads();
        if (warp == 0) {  // inclusive scan of g: lane l sums tokens 2l, 2l+1, then a shuffle scan
            const float g0 = sm.g[2 * lane], g1 = sm.g[2 * lane + 1];
            float sum = g0 + g1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float up = __shfl_up_sync(0xffffffffu, sum, o);
                if (lane >= o) sum += up;
            }
            const float last = __shfl_sync(0xffffffffu, sum, 31);
            sm.gc[2 * lane + 1] = sum;
            sm.gc[2 * lane] = sum - g1;
            sm.eg[2 * lane + 1] = expf(sum);
            sm.eg[2 * lane] = expf(sum - g1);
            sm.ek[2 * lane + 1] = expf(last - sum);
            sm.ek[2 * lane] = expf(last - (sum - g1));
        }
        for (int i = warp; i < C; i += NT / 32) {  // l2 norms (rows past Lc are zeros and stay zeros)
            float qv[D / 32], kv[D / 32], sq = 0.f, sk = 0.f;
#pragma unroll
            for (int r = 0; r < D / 32; ++r) {
                qv[r] = sm.Q[i][lane + 32 * r];
                kv[r] = sm.K[i][lane + 32 * r];
                sq = fmaf(qv[r], qv[r], sq);
                sk = fmaf(kv[r], kv[r], sk);
            }
            sq = warp_sum(sq);
            sk = warp_sum(sk);
            const float rq = rsqrtf(sq + 1e-6f), rk = rsqrtf(sk + 1e-6f);
#pragma unroll
            for (int r = 0; r < D / 32; ++r) {
                sm.Q[i][lane + 32 * r] = qv[r] * rq * scale;
                sm.K[i][lane + 32 * r] = kv[r] * rk;
            }
        }
        __syncthreads();
#if GDN_TC
        // 2. M and P on tensor cores: the 20 (16-row, 8-column) tiles on and below the diagonal
        //    (m-tile mt, n-tile nt <= 2 mt + 1), both products per tile sharing the B fragments
        for (int pr = warp; pr < 20; pr += NT / 32) {
            const int mt = pr < 2 ? 0 : pr < 6 ? 1 : pr < 12 ? 2 : 3;
            const int nt = pr - (mt == 0 ? 0 : mt == 1 ? 2 : mt == 2 ? 6 : 12);
            const int m0 = mt * 16, n0 = nt * 8, g = lane >> 2, t = lane & 3;
            float cm[4] = {}, cp[4] = {};
            for (int d = 0; d < D; d += 8) {
                const float ak[4] = {sm.K[m0 + g][d + t], sm.K[m0 + g + 8][d + t], sm.K[m0 + g][d + t + 4], sm.K[m0 + g + 8][d + t + 4]};
                const float aq[4] = {sm.Q[m0 + g][d + t], sm.Q[m0 + g + 8][d + t], sm.Q[m0 + g][d + t + 4], sm.Q[m0 + g + 8][d + t + 4]};
                const float bk[2] = {sm.K[n0 + g][d + t], sm.K[n0 + g][d + t + 4]};
                mma3_tf32(cm, ak, bk);
                mma3_tf32(cp, aq, bk);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + g + (e >= 2 ? 8 : 0), j = n0 + 2 * t + (e & 1);
                const float dec = j <= i ? expf(sm.gc[i] - sm.gc[j]) : 0.f;
                sm.M[i][j] = j < i ? sm.beta[i] * cm[e] * dec : 0.f;
                sm.P[i][j] = cp[e] * dec;
            }
        }
#else
        // 2. (CUDA cores) M and P on and below the diagonal: 4 x 4 blocks (bi, bj <= bi), one per thread (136 of
        //    the 256 threads); the blocks above are never read (steps 3 and 5 stop at the diagonal)
        if (tid < (C / 4) * (C / 4 + 1) / 2) {
            int bi = (int)((sqrtf(8.f * (float)tid + 1.f) - 1.f) * 0.5f);
            while ((bi + 1) * (bi + 2) / 2 <= tid) ++bi;
            while (bi * (bi + 1) / 2 > tid) --bi;
            const int bj = tid - bi * (bi + 1) / 2;
            float m[4][4] = {}, p[4][4] = {};
            for (int d = 0; d < D; d += 4) {
                float4 qi[4], ki[4], kj[4];
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    qi[r] = *reinterpret_cast<const float4*>(&sm.Q[bi * 4 + r][d]);
                    ki[r] = *reinterpret_cast<const float4*>(&sm.K[bi * 4 + r][d]);
                    kj[r] = *reinterpret_cast<const float4*>(&sm.K[bj * 4 + r][d]);
                }
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int cc = 0; cc < 4; ++cc) {
                        m[r][cc] = fmaf(ki[r].x, kj[cc].x, m[r][cc]);
                        m[r][cc] = fmaf(ki[r].y, kj[cc].y, m[r][cc]);
                        m[r][cc] = fmaf(ki[r].z, kj[cc].z, m[r][cc]);
                        m[r][cc] = fmaf(ki[r].w, kj[cc].w, m[r][cc]);
                        p[r][cc] = fmaf(qi[r].x, kj[cc].x, p[r][cc]);
                        p[r][cc] = fmaf(qi[r].y, kj[cc].y, p[r][cc]);
                        p[r][cc] = fmaf(qi[r].z, kj[cc].z, p[r][cc]);
                        p[r][cc] = fmaf(qi[r].w, kj[cc].w, p[r][cc]);
                    }
            }
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) {
                    const int i = bi * 4 + r, j = bj * 4 + cc;
                    const float dec = j <= i ? expf(sm.gc[i] - sm.gc[j]) : 0.f;
                    sm.M[i][j] = j < i ? sm.beta[i] * m[r][cc] * dec : 0.f;
                    sm.P[i][j] = p[r][cc] * dec;
                }
        }
#endif
        // 3. W = (I + M)⁻¹ diag(β e^gc) K and U = (I + M)⁻¹ diag(β) V by forward substitution, one
        //    column per thread (no barrier: a thread reads only its own column and M), in blocks of
        //    16 rows: the rows before the block as a product with 16 independent sums, then the
        //    block's own 16-row substitution in registers
        __syncthreads();
        if (tid < D + BV) {
            const bool isw = tid < D;
            const int col = isw ? tid : tid - D;
            float* X = isw ? &sm.W[0][col] : &sm.V[0][col];
            const int ld = isw ? D + 4 : BV + 4;
            for (int r0 = 0; r0 < C; r0 += 16) {
                float acc[16];
#pragma unroll
                for (int r = 0; r < 16; ++r) {
                    const int i = r0 + r;
                    acc[r] = isw ? sm.beta[i] * sm.eg[i] * sm.K[i][col] : sm.beta[i] * X[i * ld];
                }
                for (int j = 0; j < r0; j += 4) {
                    const float x0 = X[j * ld], x1 = X[(j + 1) * ld], x2 = X[(j + 2) * ld], x3 = X[(j + 3) * ld];
#pragma unroll
                    for (int r = 0; r < 16; ++r) {
                        const float4 mm = *reinterpret_cast<const float4*>(&sm.M[r0 + r][j]);
                        acc[r] = fmaf(-mm.x, x0, acc[r]);
                        acc[r] = fmaf(-mm.y, x1, acc[r]);
                        acc[r] = fmaf(-mm.z, x2, acc[r]);
                        acc[r] = fmaf(-mm.w, x3, acc[r]);
                    }
                }
#pragma unroll
                for (int r = 1; r < 16; ++r)
#pragma unroll
                    for (int jj = 0; jj < r; ++jj) acc[r] = fmaf(-sm.M[r0 + r][r0 + jj], acc[jj], acc[r]);
#pragma unroll
                for (int r = 0; r < 16; ++r) X[(r0 + r) * ld] = acc[r];
            }
        }
        __syncthreads();
#if GDN_TC
        static_assert(BV == 32, "GDN_TC tiling: 8 warps, 4 m-tiles x 4 n-tiles of V' and O, 8 m-tiles of S");
        const int g = lane >> 2, t = lane & 3;
        // 4. V' = U - W S and O = diag(e^gc) Q S (old S): warp = m-tile (warp & 3) x n-tiles 2 (warp >> 2) + {0, 1}
        const int m0 = (warp & 3) * 16, nb = (warp >> 2) * 16;
        float vs[2][4] = {}, oc[2][4] = {};
        for (int d = 0; d < D; d += 8) {
            const float aw[4] = {sm.W[m0 + g][d + t], sm.W[m0 + g + 8][d + t], sm.W[m0 + g][d + t + 4], sm.W[m0 + g + 8][d + t + 4]};
            const float aq[4] = {sm.Q[m0 + g][d + t], sm.Q[m0 + g + 8][d + t], sm.Q[m0 + g][d + t + 4], sm.Q[m0 + g + 8][d + t + 4]};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float bs[2] = {sm.S[d + t][nb + 8 * j + g], sm.S[d + t + 4][nb + 8 * j + g]};
                mma3_tf32(vs[j], aw, bs);
                mma3_tf32(oc[j], aq, bs);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + g + (e >= 2 ? 8 : 0), col = nb + 8 * j + 2 * t + (e & 1);
                sm.V[i][col] -= vs[j][e];
                oc[j][e] *= sm.eg[i];
            }
        __syncthreads();
        // 5. O += P V' (k up to the m-tile's last row: P is written there, zeros above the diagonal)
        for (int k0 = 0; k0 < m0 + 16 && k0 < Lc; k0 += 8) {
            const float ap[4] = {sm.P[m0 + g][k0 + t], sm.P[m0 + g + 8][k0 + t], sm.P[m0 + g][k0 + t + 4], sm.P[m0 + g + 8][k0 + t + 4]};
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const float bv[2] = {sm.V[k0 + t][nb + 8 * j + g], sm.V[k0 + t + 4][nb + 8 * j + g]};
                mma3_tf32(oc[j], ap, bv);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int i = m0 + g + 8 * hh;
                if (i < Lc) {
                    bf16* orow = o + (size_t)(a + c0 + i) * ld_o + h * D + v0 + nb + 8 * j + 2 * t;
                    *reinterpret_cast<uint32_t*>(orow) = pack2(oc[j][2 * hh], oc[j][2 * hh + 1]);
                }
            }
        // 6. S = e^gc_last S + (diag(e^(gc_last - gc)) K)ᵀ V': warp = m-tile (16 rows of S), 4 n-tiles
        for (int s0 = warp * 16; s0 < D; s0 += NT / 2) {
            const float egl = sm.eg[C - 1];
            float sc[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[j][e] = egl * sm.S[s0 + g + (e >= 2 ? 8 : 0)][8 * j + 2 * t + (e & 1)];
            for (int k0 = 0; k0 < Lc; k0 += 8) {
                const float e0 = sm.ek[k0 + t], e1 = sm.ek[k0 + t + 4];
                const float ak[4] = {sm.K[k0 + t][s0 + g] * e0, sm.K[k0 + t][s0 + g + 8] * e0, sm.K[k0 + t + 4][s0 + g] * e1,
                                     sm.K[k0 + t + 4][s0 + g + 8] * e1};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float bv[2] = {sm.V[k0 + t][8 * j + g], sm.V[k0 + t + 4][8 * j + g]};
                    mma3_tf32(sc[j], ak, bv);
                }
            }
            // every warp has finished reading S (step 4 ended at a barrier); each element of S is
            // read and written here by its owner only
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) sm.S[s0 + g + (e >= 2 ? 8 : 0)][8 * j + 2 * t + (e & 1)] = sc[j][e];
        }
#else
        // 4. (CUDA cores) V' = U - W S and O = diag(e^gc) Q S (old S): TR rows x 4 columns per thread
        constexpr int TR = C * BV / (4 * NT), SR = D * BV / (4 * NT);
        const int ti = tid / (BV / 4), tj = tid % (BV / 4);
        float acc[TR][4] = {};
        {
            float vs[TR][4] = {};
            for (int d = 0; d < D; d += 4) {
                float4 sv[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) sv[u] = *reinterpret_cast<const float4*>(&sm.S[d + u][tj * 4]);
#pragma unroll
                for (int r = 0; r < TR; ++r) {
                    const float4 w4 = *reinterpret_cast<const float4*>(&sm.W[ti * TR + r][d]);
                    const float4 q4 = *reinterpret_cast<const float4*>(&sm.Q[ti * TR + r][d]);
                    const float wv[4] = {w4.x, w4.y, w4.z, w4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        vs[r][0] = fmaf(wv[u], sv[u].x, vs[r][0]);
                        vs[r][1] = fmaf(wv[u], sv[u].y, vs[r][1]);
                        vs[r][2] = fmaf(wv[u], sv[u].z, vs[r][2]);
                        vs[r][3] = fmaf(wv[u], sv[u].w, vs[r][3]);
                        acc[r][0] = fmaf(qv[u], sv[u].x, acc[r][0]);
                        acc[r][1] = fmaf(qv[u], sv[u].y, acc[r][1]);
                        acc[r][2] = fmaf(qv[u], sv[u].z, acc[r][2]);
                        acc[r][3] = fmaf(qv[u], sv[u].w, acc[r][3]);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < TR; ++r) {
                const int i = ti * TR + r;
                const float eg = sm.eg[i];
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) {
                    sm.V[i][tj * 4 + cc] -= vs[r][cc];
                    acc[r][cc] *= eg;
                }
            }
        }
        __syncthreads();
        // 5. O += P V' (P is lower triangular: j up to the tile's last row), written out
        {
            const int jend = min(ti * TR + TR, Lc);
            for (int j = 0; j < jend; ++j) {
                const float4 vv = *reinterpret_cast<const float4*>(&sm.V[j][tj * 4]);
#pragma unroll
                for (int r = 0; r < TR; ++r) {
                    const float pv = sm.P[ti * TR + r][j];
                    acc[r][0] = fmaf(pv, vv.x, acc[r][0]);
                    acc[r][1] = fmaf(pv, vv.y, acc[r][1]);
                    acc[r][2] = fmaf(pv, vv.z, acc[r][2]);
                    acc[r][3] = fmaf(pv, vv.w, acc[r][3]);
                }
            }
#pragma unroll
            for (int r = 0; r < TR; ++r) {
                const int i = ti * TR + r;
                if (i < Lc) {
                    bf16* orow = o + (size_t)(a + c0 + i) * ld_o + h * D + v0 + tj * 4;
                    *reinterpret_cast<uint2*>(orow) = make_uint2(pack2(acc[r][0], acc[r][1]), pack2(acc[r][2], acc[r][3]));
                }
            }
        }
        // 6. S = e^gc_last S + sum_i (e^(gc_last - gc_i) k_i) ⊗ V'_i: SR rows x 4 columns per thread
        {
            const int si = tid / (BV / 4), sj = tid % (BV / 4);
            float up[SR][4] = {};
            for (int i = 0; i < Lc; ++i) {
                const float ek = sm.ek[i];
                const float4 vv = *reinterpret_cast<const float4*>(&sm.V[i][sj * 4]);
#pragma unroll
                for (int r = 0; r < SR; ++r) {
                    const float kv = sm.K[i][si * SR + r] * ek;
                    up[r][0] = fmaf(kv, vv.x, up[r][0]);
                    up[r][1] = fmaf(kv, vv.y, up[r][1]);
                    up[r][2] = fmaf(kv, vv.z, up[r][2]);
                    up[r][3] = fmaf(kv, vv.w, up[r][3]);
                }
            }
            const float eg = sm.eg[C - 1];
            // every thread has finished reading S (step 4 ended at a barrier); each element of S is
            // read and written here by its owner only
#pragma unroll
            for (int r = 0; r < SR; ++r)
#pragma unroll
                for (int cc = 0; cc < 4; ++cc) {
                    float& sv = sm.S[si * SR + r][sj * 4 + cc];
                    sv = fmaf(eg, sv, up[r][cc]);
                }
        }
#endif
    }
    __syncthreads();
    for (int i = tid; i < D * BV; i += NT) {
        const int d = i / BV, e = i % BV;
        st_state(Sg + (size_t)d * D + v0 + e, sm.S[d][e]);
    }
}

// ------------------------------------------------------------------ gated delta rule, recurrent
// One CTA of D threads per (row, v-head, half of the value columns: blockIdx.z); threads 2c and
// 2c+1 keep column e = z·D/2 + c of S, rows [0, D/2) and [D/2, D) (D/2 fp32 registers each), and
// walk the row's tokens (one for a decode row):
//   S *= e^g;  kv = Sᵀk;  δ = β (v - kv);  S += k ⊗ δ;  o = Sᵀq   (torch_recurrent_gated_delta_rule)
template <int D, class ST>
__device__ __forceinline__ void recurrent_impl(bf16* __restrict__ o, const bf16* __restrict__ y,
                                               const bf16* __restrict__ bb, const bf16* __restrict__ aa,
                                               const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                               unsigned char* state, const int* __restrict__ query_start,
                                               const int* __restrict__ positions, const int* __restrict__ seq_slots,
                                               int seqs, int ld_y, int ld_ab, int ld_o, int hk, int hv, int layer,
                                               int num_layers) {
    constexpr int H2 = D / 2;
    __shared__ float qs[D], ks[D], red[2][D / 32];
    const int s = blockIdx.x, h = blockIdx.y;
    if (s >= seqs) return;
    const int slot = seq_slots[s];
    const int a = query_start[s], n = query_start[s + 1] - a;
    if (slot < 0 || n <= 0) return;
    const Layout<D, ST> L(hk, hv, num_layers);
    const int kh = h / (hv / hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int e = blockIdx.z * (D / 2) + (tid >> 1), d0 = (tid & 1) * H2;
    const float scale = 1.f / sqrtf((float)D);
    const float Al = A_log[h], dtb = dt_bias[h];
    ST* Sg = L.rec(state, slot, layer, h);
    const bool fresh = positions[a] == 0;
    float S[H2];
#pragma unroll
    for (int d = 0; d < H2; ++d) S[d] = fresh ? 0.f : ld_state(Sg + (size_t)(d0 + d) * D + e);
    const int qcol = kh * D, kcol = hk * D + kh * D, vcol = 2 * hk * D + h * D;
    for (int t = a; t < a + n; ++t) {
        const bf16* row = y + (size_t)t * ld_y;
        float q = 0.f, k = 0.f;
        __syncthreads();  // the previous token's reads of qs / ks / red are done
        if (tid < D) {  // warps 0 .. D/32-1: the l2 norms
            q = f(row[qcol + tid]);
            k = f(row[kcol + tid]);
            const float sq = warp_sum(q * q), sk = warp_sum(k * k);
            if (lane == 0) {
                red[0][warp] = sq;
                red[1][warp] = sk;
            }
        }
        const float v = f(row[vcol + e]);
        const float g = gate_g(f(aa[(size_t)t * ld_ab + h]), Al, dtb);
        const float beta = gate_beta(f(bb[(size_t)t * ld_ab + h]));
        __syncthreads();
        if (tid < D) {
            float tq = 0.f, tk = 0.f;
#pragma unroll
            for (int w = 0; w < D / 32; ++w) {
                tq += red[0][w];
                tk += red[1][w];
            }
            qs[tid] = q * rsqrtf(tq + 1e-6f) * scale;
            ks[tid] = k * rsqrtf(tk + 1e-6f);
        }
        __syncthreads();
        const float eg = expf(g);
        float kv = 0.f;
#pragma unroll
        for (int d = 0; d < H2; ++d) {
            S[d] *= eg;
            kv = fmaf(S[d], ks[d0 + d], kv);
        }
        kv += __shfl_xor_sync(0xffffffffu, kv, 1);
        const float delta = (v - kv) * beta;
        float out = 0.f;
#pragma unroll
        for (int d = 0; d < H2; ++d) {
            S[d] = fmaf(ks[d0 + d], delta, S[d]);
            out = fmaf(S[d], qs[d0 + d], out);
        }
        out += __shfl_xor_sync(0xffffffffu, out, 1);
        if ((tid & 1) == 0) o[(size_t)t * ld_o + h * D + e] = b(out);
    }
#pragma unroll
    for (int d = 0; d < H2; ++d) st_state(Sg + (size_t)(d0 + d) * D + e, S[d]);
}

// ------------------------------------------------------------------ gated RMSNorm
// out = bf16(float(bf16(w * bf16(x * rsqrt(mean(x²) + eps)))) * silu(z))   (Qwen3NextRMSNormGated)
template <int D>
__device__ __forceinline__ void norm_gated_impl(bf16* out, const bf16* x, const bf16* __restrict__ z,
                                                const bf16* __restrict__ w, int n, int heads, int ld_x, int ld_z,
                                                int ld_out, float eps) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x, h = blockIdx.y * (GDN_NORM_THREADS / 32) + warp;
    if (t >= n || h >= heads) return;
    const bf16* xr = x + (size_t)t * ld_x + h * D;
    const bf16* zr = z + (size_t)t * ld_z + h * D;
    float v[D / 32], ss = 0.f;
#pragma unroll
    for (int r = 0; r < D / 32; ++r) {
        v[r] = f(xr[lane + 32 * r]);
        ss = fmaf(v[r], v[r], ss);
    }
    ss = warp_sum(ss);
    const float rs = rsqrtf(ss * (1.f / (float)D) + eps);
    bf16* orow = out + (size_t)t * ld_out + h * D;
#pragma unroll
    for (int r = 0; r < D / 32; ++r) {
        const int i = lane + 32 * r;
        const float hn = rb(f(w[i]) * rb(v[r] * rs));
        orow[i] = b(hn * silu(f(zr[i])));
    }
}

}  // namespace gdn

// ================================================================== entries (D = 128)
#define GDN_D 128
#define GDN_BV 32  // value columns per gdn_chunk CTA (grid z = D / GDN_BV = 4)

#define GDN_STATE_ENTRIES(SUF, ST)                                                                                     \
    extern "C" __global__ void __launch_bounds__(GDN_CONV_THREADS, 3)                                                  \
        gdn_conv_##SUF(bf16* y, const bf16* x, const bf16* w, unsigned char* state, const int* query_start,           \
                       const int* positions, const int* seq_slots, int seqs, int tokens, int ld_x, int ld_y,            \
                       int num_k_heads, int num_v_heads, int layer, int num_layers) {                                  \
        KERN_PDL_WAIT();                                                                                               \
        gdn::conv_impl<GDN_D, ST>(y, x, w, state, query_start, positions, seq_slots, seqs, tokens, ld_x, ld_y,        \
                                  num_k_heads, num_v_heads, layer, num_layers);                                        \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GDN_CONV_THREADS)                                                     \
        gdn_conv_state_##SUF(const bf16* x, unsigned char* state, const int* query_start, const int* positions,       \
                             const int* seq_slots, int seqs, int ld_x, int num_k_heads, int num_v_heads, int layer,     \
                             int num_layers) {                                                                         \
        KERN_PDL_WAIT();                                                                                               \
        gdn::conv_state_impl<GDN_D, ST>(x, state, query_start, positions, seq_slots, seqs, ld_x, num_k_heads,         \
                                        num_v_heads, layer, num_layers);                                               \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS, 1)                                                 \
        gdn_chunk_##SUF(bf16* o, const bf16* y, const bf16* b, const bf16* a, const float* A_log,                     \
                        const float* dt_bias, unsigned char* state, const int* query_start, const int* positions,       \
                        const int* seq_slots, int seqs, int ld_y, int ld_ab, int ld_o, int num_k_heads,                 \
                        int num_v_heads, int layer, int num_layers) {                                                  \
        KERN_PDL_WAIT();                                                                                               \
        gdn::chunk_impl<GDN_D, GDN_BV, ST>(o, y, b, a, A_log, dt_bias, state, query_start, positions, seq_slots,     \
                                           seqs, ld_y, ld_ab, ld_o, num_k_heads, num_v_heads, layer, num_layers);      \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GDN_D)                                                                \
        gdn_recurrent_##SUF(bf16* o, const bf16* y, const bf16* b, const bf16* a, const float* A_log,                 \
                            const float* dt_bias, unsigned char* state, const int* query_start, const int* positions,   \
                            const int* seq_slots, int seqs, int ld_y, int ld_ab, int ld_o, int num_k_heads,             \
                            int num_v_heads, int layer, int num_layers) {                                              \
        KERN_PDL_WAIT();                                                                                               \
        gdn::recurrent_impl<GDN_D, ST>(o, y, b, a, A_log, dt_bias, state, query_start, positions, seq_slots, seqs,   \
                                       ld_y, ld_ab, ld_o, num_k_heads, num_v_heads, layer, num_layers);                \
    }

GDN_STATE_ENTRIES(f32, float)
GDN_STATE_ENTRIES(bf16, bf16)

extern "C" __global__ void __launch_bounds__(GDN_NORM_THREADS)
gdn_norm_gated(bf16* out, const bf16* x, const bf16* z, const bf16* w, int n, int heads, int ld_x, int ld_z, int ld_out,
               float eps) {
    KERN_PDL_WAIT();
    gdn::norm_gated_impl<GDN_D>(out, x, z, w, n, heads, ld_x, ld_z, ld_out, eps);
}
