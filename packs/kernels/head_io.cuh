// One attention head held by one warp, E = D / 32 elements a lane: vector loads and stores of a
// lane's slice, the per-head RMSNorm of q / k heads, and the paged KV-cache write. Shared by
// rope.cu (qk_norm_rope) and gated.cu (qk_norm_rope_gated), so both norm and store a head the
// same way, bit for bit.
#pragma once
#include "common.cuh"

namespace kern {

template <int E>
struct HeadVec;  // E bf16 values as one vector access
template <>
struct HeadVec<2> { typedef uint32_t T; };
template <>
struct HeadVec<4> { typedef uint2 T; };
template <>
struct HeadVec<8> { typedef uint4 T; };

template <int E>
static __device__ __forceinline__ void load_e(const bf16* p, float (&x)[E]) {
    typename HeadVec<E>::T v = *reinterpret_cast<const typename HeadVec<E>::T*>(p);
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
    for (int k = 0; k < E / 2; ++k) {
        float2 a = unpack2(w[k]);
        x[2 * k] = a.x;
        x[2 * k + 1] = a.y;
    }
}

template <int E>
static __device__ __forceinline__ void store_e(bf16* p, const float (&x)[E]) {
    typename HeadVec<E>::T v;
    uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int k = 0; k < E / 2; ++k) w[k] = pack2(x[2 * k], x[2 * k + 1]);
    *reinterpret_cast<typename HeadVec<E>::T*>(p) = v;
}

// The head's RMSNorm with weight w (the lane's slice at w + lane·E): Gemma3RMSNorm's
// bf16((x · r) · (norm_offset + w)) in fp32 when f32_form, else Qwen3RMSNorm's bf16(w · bf16(x · r)).
template <int E>
static __device__ __forceinline__ void head_rms_norm(float (&x)[E], const bf16* w, int lane, float eps, bool f32_form,
                                                     float norm_offset) {
    constexpr int D = 32 * E;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < E; ++j) ss += x[j] * x[j];
    ss = warp_sum(ss);
    const float r = rsqrtf(ss * (1.0f / (float)D) + eps);
    float wv[E];
    load_e<E>(w + lane * E, wv);
    if (f32_form) {
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = rb((x[j] * r) * (norm_offset + wv[j]));
    } else {
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = rb(wv[j] * rb(x[j] * r));
    }
}

// The lane's slice of kv head kvh (k when is_k, else v) into the paged cache at `slot` (< 0: no write).
template <int E>
static __device__ __forceinline__ void kv_store_head(bf16* kv_base, const float (&x)[E], int slot, int kvh, bool is_k,
                                                     int lane, int layer, int num_layers, int page_tokens,
                                                     int kv_heads) {
    constexpr int D = 32 * E;
    if (slot < 0) return;
    const long long page = slot / page_tokens;
    const int off = slot - (int)(page * page_tokens);
    bf16* dst = kv_base + kv_offset(page, off, layer, is_k ? 0 : 1, num_layers, page_tokens, kv_heads, D) +
                (size_t)kvh * D + lane * E;
    store_e<E>(dst, x);
}

}  // namespace kern
