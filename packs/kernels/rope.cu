// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Attention prologue of the packs: per-head q/k RMSNorm (Qwen3) or QKV bias (Qwen2), neox
// rotary embedding, and the paged KV-cache write, fused in one kernel; plus a standalone KV write.
//
// Built WITHOUT --use_fast_math: cosf/sinf/rsqrtf and the fp32 divisions must be the accurate
// library functions that PyTorch's CUDA kernels call (rotary arguments reach ~4e4 rad).
// Layout of the KV pool: see common.cuh / KERNELS.md.
#include "head_io.cuh"

using namespace kern;

#define ROPE_WARPS 8

// Flags of qk_norm_rope.
#define QKR_NORM 1  // per-head RMSNorm of q and k heads with q_norm_w / k_norm_w (Qwen3)
#define QKR_BIAS 2  // add qkv_bias[(Hq + 2 Hkv) * D] to q, k and v first (Qwen2), rounding to bf16
// With QKR_NORM: the norm as Gemma3RMSNorm computes it, bf16(x * r * (norm_offset + w)) in fp32
// (norm_offset 1 for Hugging Face weights, 0 for GGUF files whose converter added the 1), instead
// of Qwen3RMSNorm's bf16(w * bf16(x * r)).
#define QKR_NORM_F32 4
// Rotate adjacent pairs (2i, 2i + 1) with frequency i instead of the halves (i, i + D/2): the
// q / k rows of a GGUF `llama` file are permuted by llama.cpp's converter so that its pairs are
// adjacent; rotating them so gives, element for element, what neox rotation gives the
// Hugging Face rows (attention's dot products do not depend on the order of head dims).
#define QKR_ADJACENT 8

// One warp processes one head of one token; lane holds elements [lane*E, lane*E + E) of the
// head (D = 32*E), so rotate_half's partner of element d lives in lane ^ 16.
template <int E>
static __device__ __forceinline__ void qkr_head(bf16* __restrict__ qkv, bf16* __restrict__ kv_base,
                                                const bf16* __restrict__ q_norm_w,
                                                const bf16* __restrict__ k_norm_w,
                                                const bf16* __restrict__ qkv_bias, const float* cs,
                                                const float* sn, int t, int hh, int slot, int num_heads,
                                                int kv_heads, int layer, int num_layers, int page_tokens,
                                                float eps, int flags, float norm_offset) {
    constexpr int D = 32 * E;
    constexpr int HALF = D / 2;
    const int lane = threadIdx.x & 31;
    const int total = num_heads + 2 * kv_heads;
    const bf16* src = qkv + (size_t)t * total * D + (size_t)hh * D + lane * E;
    float x[E];
    load_e<E>(src, x);
    if (flags & QKR_BIAS) {
        float bv[E];
        load_e<E>(qkv_bias + (size_t)hh * D + lane * E, bv);
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = rb(x[j] + bv[j]);
    }
    const bool is_q = hh < num_heads;
    const bool is_k = !is_q && hh < num_heads + kv_heads;
    if (is_q || is_k) {
        if (flags & QKR_NORM)
            head_rms_norm<E>(x, is_q ? q_norm_w : k_norm_w, lane, eps, (flags & QKR_NORM_F32) != 0, norm_offset);
        // neox rotary: out = x*cos + rotate_half(x)*sin, every product and the sum rounded to bf16
        // (transformers apply_rotary_pos_emb on bf16 tensors with bf16 cos/sin).
        float y[E];
        if (flags & QKR_ADJACENT) {
#pragma unroll
            for (int j = 0; j < E; j += 2) {
                const int i = (lane * E + j) >> 1;
                y[j] = rb(rb(x[j] * cs[i]) + rb(-x[j + 1] * sn[i]));
                y[j + 1] = rb(rb(x[j + 1] * cs[i]) + rb(x[j] * sn[i]));
            }
        } else {
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const float p = __shfl_xor_sync(0xffffffffu, x[j], 16);
                const float rot = lane < 16 ? -p : p;
                const int i = (lane * E + j) & (HALF - 1);
                y[j] = rb(rb(x[j] * cs[i]) + rb(rot * sn[i]));
            }
        }
        if (is_q) {
            store_e<E>(qkv + (size_t)t * total * D + (size_t)hh * D + lane * E, y);
            return;
        }
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = y[j];
    }
    kv_store_head<E>(kv_base, x, slot, is_k ? hh - num_heads : hh - num_heads - kv_heads, is_k, lane, layer, num_layers,
                     page_tokens, kv_heads);
}

// qkv [n, (num_heads + 2 kv_heads) * head_dim], in place for q; k and v go to the KV cache.
extern "C" __global__ void __launch_bounds__(ROPE_WARPS * 32)
qk_norm_rope(bf16* __restrict__ qkv, bf16* __restrict__ kv_base, const bf16* __restrict__ q_norm_w,
             const bf16* __restrict__ k_norm_w, const bf16* __restrict__ qkv_bias,
             const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n, int num_heads,
             int kv_heads, int head_dim, int layer, int num_layers, int page_tokens, float theta, float eps,
             int flags, const float* __restrict__ inv_freq, float cos_scale, float norm_offset) {
    KERN_PDL_WAIT();
    __shared__ float cs[128], sn[128];
    const int t = blockIdx.x;
    if (t >= n) return;
    const int half = head_dim >> 1;
    // cos/sin of this token's position, as transformers' default rotary embedding computes them:
    //   inv_freq = 1.0 / (theta ** (arange(0, D, 2).float() / D))     (fp32, on the host)
    //   freqs = position.float() * inv_freq (fp32); cos/sin in fp32, then cast to bf16.
    // powf is taken as the correctly rounded double pow rounded to fp32 (glibc's powf is within
    // 1 ulp of that; the difference flips a bf16 cos/sin only in rare ties).
    // A scaled RoPE (llama3, linear, YaRN: transformers' rope_utils) gives its fp32 inverse
    // frequencies as the table `inv_freq` (the manifest writes them), and YaRN's attention
    // factor as cos_scale (cos and sin are multiplied by it in fp32 before the cast to bf16;
    // 1 otherwise, which changes nothing).
    if (threadIdx.x < half && half <= 128) {
        const int i = threadIdx.x;
        float inv;
        if (inv_freq != nullptr) {
            inv = inv_freq[i];
        } else {
            const float e = (float)(2 * i) / (float)head_dim;
            const float p = (float)pow((double)theta, (double)e);
            inv = 1.0f / p;
        }
        const float fr = (float)positions[t] * inv;
        cs[i] = rb(cosf(fr) * cos_scale);
        sn[i] = rb(sinf(fr) * cos_scale);
    }
    __syncthreads();
    const int hh = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
    if (hh >= num_heads + 2 * kv_heads) return;
    const int slot = slot_mapping[t];
    switch (head_dim) {
        case 64:
            qkr_head<2>(qkv, kv_base, q_norm_w, k_norm_w, qkv_bias, cs, sn, t, hh, slot, num_heads, kv_heads,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        case 128:
            qkr_head<4>(qkv, kv_base, q_norm_w, k_norm_w, qkv_bias, cs, sn, t, hh, slot, num_heads, kv_heads,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        case 256:
            qkr_head<8>(qkv, kv_base, q_norm_w, k_norm_w, qkv_bias, cs, sn, t, hh, slot, num_heads, kv_heads,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        default:
            __trap();  // unsupported head_dim: fail loudly rather than compute garbage
    }
}

// Standalone KV write: k and v of token t are read from the fused qkv row
// ([q: num_heads*D | k: kv_heads*D | v: kv_heads*D]) and copied to the cache slot slot_mapping[t].
// slot < 0: nothing is written (padded tokens).
extern "C" __global__ void __launch_bounds__(128)
kv_write(bf16* __restrict__ kv_base, const bf16* __restrict__ qkv, const int* __restrict__ slot_mapping, int n,
         int num_heads, int kv_heads, int head_dim, int layer, int num_layers, int page_tokens) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int slot = slot_mapping[t];
    if (slot < 0) return;
    const long long page = slot / page_tokens;
    const int off = slot - (int)(page * page_tokens);
    const size_t stride = (size_t)(num_heads + 2 * kv_heads) * head_dim;
    const bf16* src = qkv + (size_t)t * stride + (size_t)num_heads * head_dim;  // k then v
    const int per = kv_heads * head_dim;                                        // elements of k (or v)
    bf16* dk = kv_base + kv_offset(page, off, layer, 0, num_layers, page_tokens, kv_heads, head_dim);
    bf16* dv = kv_base + kv_offset(page, off, layer, 1, num_layers, page_tokens, kv_heads, head_dim);
    if ((per & 7) == 0 && (((uintptr_t)qkv | (uintptr_t)kv_base) & 15u) == 0 && (stride & 7) == 0 &&
        (num_heads * head_dim & 7) == 0) {
        const int nc = per >> 3;
        for (int c = threadIdx.x; c < 2 * nc; c += blockDim.x) {
            const uint4 v = reinterpret_cast<const uint4*>(src)[c];
            if (c < nc)
                reinterpret_cast<uint4*>(dk)[c] = v;
            else
                reinterpret_cast<uint4*>(dv)[c - nc] = v;
        }
    } else {
        for (int i = threadIdx.x; i < 2 * per; i += blockDim.x) {
            if (i < per)
                dk[i] = src[i];
            else
                dv[i - per] = src[i];
        }
    }
}
