// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Gated attention and the other small pieces of the Gated DeltaNet hybrids (issue 30: Qwen3-Next,
// Qwen3.5), each one row-wise launch:
//   * qk_norm_rope_gated: the attention prologue for a q projection that writes [q | gate] per head
//     (transformers' Qwen3NextAttention: q_proj(x).view(..., heads, 2·D).chunk(2)), with per-head
//     (1 + w) q / k norms and PARTIAL rotary (the first rot_dim dims of a head, neox halves of
//     rot_dim; partial_rotary_factor 0.25): q goes to its own buffer, k and v to the paged KV cache;
//   * attn_output_gate: attn · sigmoid(gate) (in place, the gate read from the q projection's rows);
//   * gdn_split_proj: the GDN projection GEMM's output split into q|k|v, z, b and a (Qwen3-Next's
//     per-key-head groups regrouped: transformers' fix_query_key_value_ordering);
//   * shared_expert_gate_add: out += sigmoid(x · w_gate) · shared (Qwen3-Next's shared expert).
// rope.cu's qk_norm_rope is unchanged (it rotates whole heads of [q | k | v] rows).
//
// Built WITHOUT --use_fast_math: cosf / sinf / expf / rsqrtf are the library functions PyTorch calls.
#include "head_io.cuh"

using namespace kern;

#define GROPE_WARPS 8
// Flags of qk_norm_rope_gated (the same bits as rope.cu's qk_norm_rope where they overlap).
#define GQR_NORM 1      // per-head RMSNorm of q and k heads
#define GQR_NORM_F32 4  // ... as bf16((x · r) · (norm_offset + w)) in fp32 (Qwen3NextRMSNorm), else bf16(w · bf16(x · r))

// One warp per head of one token; lane holds elements [lane·E, lane·E + E) (D = 32·E). The rotated
// dims d < rot_dim pair with d ± rot_dim/2, which live in lane ^ ((rot_dim/2) / E).
template <int E>
static __device__ __forceinline__ void gqr_head(bf16* __restrict__ q_out, const bf16* __restrict__ qkv,
                                                bf16* __restrict__ kv_base, const bf16* __restrict__ q_norm_w,
                                                const bf16* __restrict__ k_norm_w, const float* cs, const float* sn,
                                                int t, int hh, int slot, int num_heads, int kv_heads, int rot_dim,
                                                int layer, int num_layers, int page_tokens, float eps, int flags,
                                                float norm_offset) {
    constexpr int D = 32 * E;
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)(2 * num_heads + 2 * kv_heads) * D;
    const bool is_q = hh < num_heads;
    const bool is_k = !is_q && hh < num_heads + kv_heads;
    // q head h at h·2D (its gate follows it); k head j at 2·Hq·D + j·D; v head j after the k heads.
    const size_t col = is_q ? (size_t)hh * 2 * D : (size_t)2 * num_heads * D + (size_t)(hh - num_heads) * D;
    float x[E];
    load_e<E>(qkv + (size_t)t * row + col + lane * E, x);
    if (is_q || is_k) {
        if (flags & GQR_NORM)
            head_rms_norm<E>(x, is_q ? q_norm_w : k_norm_w, lane, eps, (flags & GQR_NORM_F32) != 0, norm_offset);
        // transformers' apply_rotary_pos_emb with rotary_dim = cos.shape[-1]: the first rot_dim dims
        // rotate (q_rot·cos + rotate_half(q_rot)·sin, every product and the sum rounded to bf16), the
        // rest pass through.
        const int half = rot_dim >> 1;
        const int lanes = half / E;  // a power of two (checked by the launcher: else trap)
        float y[E];
#pragma unroll
        for (int j = 0; j < E; ++j) {
            const float p = __shfl_xor_sync(0xffffffffu, x[j], lanes);
            const int d = lane * E + j;
            if (d < rot_dim) {
                const int i = d < half ? d : d - half;
                const float rot = d < half ? -p : p;
                y[j] = rb(rb(x[j] * cs[i]) + rb(rot * sn[i]));
            } else {
                y[j] = x[j];
            }
        }
        if (is_q) {
            store_e<E>(q_out + (size_t)t * num_heads * D + (size_t)hh * D + lane * E, y);
            return;
        }
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = y[j];
    }
    kv_store_head<E>(kv_base, x, slot, is_k ? hh - num_heads : hh - num_heads - kv_heads, is_k, lane, layer, num_layers,
                     page_tokens, kv_heads);
}

// qkv [n, (2·Hq + 2·Hkv)·D] = [Hq × (q D | gate D) | Hkv × k D | Hkv × v D] (read only);
// q_out [n, Hq·D]; k (normed, rotated) and v go to the KV cache of `layer` at slot_mapping[t]
// (slot < 0: no write). grid [n, ceil((Hq + 2·Hkv)/8)], block 256.
// cos_i / sin_i = bf16(cosf / sinf(float(pos) · inv_i)), inv_i = 1 / theta^(2i / rot_dim) (fp32, the
// power as the double pow rounded to fp32), i < rot_dim / 2: transformers' default RoPE with
// dim = int(head_dim · partial_rotary_factor).
extern "C" __global__ void __launch_bounds__(GROPE_WARPS * 32)
qk_norm_rope_gated(bf16* __restrict__ q_out, const bf16* __restrict__ qkv, bf16* __restrict__ kv_base,
                   const bf16* __restrict__ q_norm_w, const bf16* __restrict__ k_norm_w,
                   const int* __restrict__ positions, const int* __restrict__ slot_mapping, int n, int num_heads,
                   int kv_heads, int head_dim, int rot_dim, int layer, int num_layers, int page_tokens, float theta,
                   float eps, int flags, float norm_offset) {
    KERN_PDL_WAIT();
    __shared__ float cs[128], sn[128];
    const int t = blockIdx.x;
    if (t >= n) return;
    const int E = head_dim / 32;
    const int half = rot_dim >> 1;
    // rot_dim: even, at most head_dim, rot_dim/2 a multiple of E with a power-of-two lane distance.
    if (rot_dim < 2 * E || rot_dim > head_dim || (rot_dim & 1) || half % E || ((half / E) & (half / E - 1))) __trap();
    if (threadIdx.x < half) {
        const int i = threadIdx.x;
        const float e = (float)(2 * i) / (float)rot_dim;
        const float p = (float)pow((double)theta, (double)e);
        const float inv = 1.0f / p;
        const float fr = (float)positions[t] * inv;
        cs[i] = rb(cosf(fr));
        sn[i] = rb(sinf(fr));
    }
    __syncthreads();
    const int hh = blockIdx.y * GROPE_WARPS + (threadIdx.x >> 5);
    if (hh >= num_heads + 2 * kv_heads) return;
    const int slot = slot_mapping[t];
    switch (head_dim) {
        case 64:
            gqr_head<2>(q_out, qkv, kv_base, q_norm_w, k_norm_w, cs, sn, t, hh, slot, num_heads, kv_heads, rot_dim,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        case 128:
            gqr_head<4>(q_out, qkv, kv_base, q_norm_w, k_norm_w, cs, sn, t, hh, slot, num_heads, kv_heads, rot_dim,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        case 256:
            gqr_head<8>(q_out, qkv, kv_base, q_norm_w, k_norm_w, cs, sn, t, hh, slot, num_heads, kv_heads, rot_dim,
                        layer, num_layers, page_tokens, eps, flags, norm_offset);
            break;
        default:
            __trap();
    }
}

// PyTorch's sigmoid on a bf16 tensor: 1 / (1 + exp(-x)) in fp32, rounded to bf16.
static __device__ __forceinline__ float sigmoid_bf16(float x) { return rb(1.0f / (1.0f + expf(-x))); }

// attn [n, heads·D] in place: attn[t, h·D + j] = bf16(attn · bf16(sigmoid(gate))), gate =
// gate_src[t·ld_gate + h·2·D + D + j] (the q projection's rows: the gate half of head h).
// transformers: attn_output * torch.sigmoid(gate), both bf16. grid [n], block 256.
extern "C" __global__ void __launch_bounds__(256)
attn_output_gate(bf16* __restrict__ attn, const bf16* __restrict__ gate_src, int n, int heads, int head_dim,
                 int ld_gate) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int w = heads * head_dim;
    bf16* a = attn + (size_t)t * w;
    const bf16* g = gate_src + (size_t)t * ld_gate;
    for (int c = threadIdx.x; c < w; c += blockDim.x) {
        const int h = c / head_dim, j = c - h * head_dim;
        const float s = sigmoid_bf16(f(g[(size_t)h * 2 * head_dim + head_dim + j]));
        a[c] = b(f(a[c]) * s);
    }
}

// The Gated DeltaNet projection's output split into the buffers the GDN kernels read: in [n, ld_in]
// → qkv [n, conv_dim] = [all q (Hk·D) | all k (Hk·D) | all v (Hv·D)], z [n, Hv·D], b, a [n, Hv].
// grouped = 0 (Qwen3.5: the weight is [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a], so the
// columns are already in that order); grouped = 1 (Qwen3-Next: [in_proj_qkvz | in_proj_ba], each
// grouped per key head as transformers' fix_query_key_value_ordering reads them: [q (D), k (D),
// v (r·D), z (r·D)] × Hk, then [b (r), a (r)] × Hk, r = Hv / Hk). grid [n], block 256. An exact copy
// (packs/src/gdn.rs's split_source is the same map).
extern "C" __global__ void __launch_bounds__(256)
gdn_split_proj(bf16* __restrict__ qkv, bf16* __restrict__ z, bf16* __restrict__ bo, bf16* __restrict__ ao,
               const bf16* __restrict__ in, int n, int ld_in, int num_k_heads, int num_v_heads, int head_dim,
               int grouped) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int D = head_dim, hk = num_k_heads, hv = num_v_heads;
    const int kd = hk * D, conv = (2 * hk + hv) * D, vd = hv * D, r = hv / hk;
    const int gw = 2 * D + 2 * r * D;
    const bf16* src = in + (size_t)t * ld_in;
    const int total = conv + vd + 2 * hv;
    for (int c = threadIdx.x; c < total; c += blockDim.x) {
        int s;  // the source column
        if (!grouped) {
            s = c;
        } else if (c < kd) {
            s = (c / D) * gw + c % D;
        } else if (c < 2 * kd) {
            s = ((c - kd) / D) * gw + D + (c - kd) % D;
        } else if (c < conv) {
            s = ((c - 2 * kd) / (r * D)) * gw + 2 * D + (c - 2 * kd) % (r * D);
        } else if (c < conv + vd) {
            s = ((c - conv) / (r * D)) * gw + 2 * D + r * D + (c - conv) % (r * D);
        } else {
            const int cb = c - conv - vd;  // 0 .. 2·hv: b then a
            const int part = cb < hv ? 0 : 1, e = cb - part * hv;
            s = hk * gw + (e / r) * 2 * r + part * r + e % r;
        }
        const bf16 v = src[s];
        if (c < conv)
            qkv[(size_t)t * conv + c] = v;
        else if (c < conv + vd)
            z[(size_t)t * vd + (c - conv)] = v;
        else if (c < conv + vd + hv)
            bo[(size_t)t * hv + (c - conv - vd)] = v;
        else
            ao[(size_t)t * hv + (c - conv - vd - hv)] = v;
    }
}

// Qwen3-Next's shared expert: out[t] = bf16(out[t] + bf16(bf16(sigmoid(bf16(x[t] · w))) · shared[t]))
// (transformers: F.sigmoid(shared_expert_gate(x)) * shared_expert(x), then expert_output + that, all
// bf16). x, shared, out [n, hidden]; w [hidden]. grid [n], block 256. The dot product is summed in
// fp32 in a fixed order (per thread, then the block tree).
extern "C" __global__ void __launch_bounds__(256)
shared_expert_gate_add(bf16* __restrict__ out, const bf16* __restrict__ shared, const bf16* __restrict__ x,
                       const bf16* __restrict__ w, int n, int hidden) {
    KERN_PDL_WAIT();
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    if (t >= n) return;
    const bf16* xr = x + (size_t)t * hidden;
    float acc = 0.f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) acc += f(xr[c]) * f(w[c]);
    const float logit = rb(block_sum(acc, scratch));
    const float s = sigmoid_bf16(logit);
    bf16* o = out + (size_t)t * hidden;
    const bf16* sh = shared + (size_t)t * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = b(f(o[c]) + rb(s * f(sh[c])));
}
