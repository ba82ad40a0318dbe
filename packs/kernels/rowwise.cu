// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Row-wise kernels of the packs: embedding, RMSNorm (plain and fused with the residual add),
// SwiGLU, last-position gather. One CTA per row; 16-byte vector loads when the row length is a
// multiple of 8 elements and the pointers are 16-byte aligned, a scalar path otherwise.
//
// Built WITHOUT --use_fast_math: expf, division and rsqrtf must be the same functions PyTorch's
// CUDA kernels call, so that results match transformers' bf16 rounding order bit for bit where
// the reduction order allows. See KERNELS.md for grids, semantics and padded-row behaviour.
#include "rowwise_math.cuh"  // common.cuh + the RMSNorm / SwiGLU arithmetic the fused GEMVs share

using namespace kern;

#define ROW_THREADS 128
#define ROW_CACHE 8  // 16-byte chunks cached in registers per thread: rows up to 128*8*8 = 8192

static __device__ __forceinline__ bool aligned16(const void* p) {
    return ((uintptr_t)p & 15u) == 0;
}

// ----------------------------------------------------------------------------- embedding
// out[t, :] = bf16(table[ids[t], :] * scale); ids outside [0, vocab) give a row of zeros.
// scale 1 copies the row; Gemma scales the embedding by bf16(sqrt(hidden)) in bf16
// (Gemma3TextScaledWordEmbedding: `embed(ids) * embed_scale.to(weight.dtype)`).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
embedding(bf16* __restrict__ out, const bf16* __restrict__ table, const int* __restrict__ ids,
          int n, int hidden, int vocab, float scale) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int id = ids[t];
    const bool valid = id >= 0 && id < vocab;
    bf16* o = out + (size_t)t * hidden;
    const bf16* src = table + (size_t)(valid ? id : 0) * hidden;
    if (scale != 1.0f) {
        for (int i = threadIdx.x; i < hidden; i += ROW_THREADS) o[i] = valid ? b(f(src[i]) * scale) : b(0.f);
        return;
    }
    if ((hidden & 7) == 0 && aligned16(out) && aligned16(table)) {
        const int nc = hidden >> 3;
        for (int c = threadIdx.x; c < nc; c += ROW_THREADS) {
            uint4 v = valid ? __ldg(reinterpret_cast<const uint4*>(src) + c) : make_uint4(0, 0, 0, 0);
            reinterpret_cast<uint4*>(o)[c] = v;
        }
    } else {
        for (int i = threadIdx.x; i < hidden; i += ROW_THREADS) o[i] = valid ? src[i] : b(0.f);
    }
}

// ----------------------------------------------------------------------------- RMSNorm
// transformers Qwen3RMSNorm:  h = x.float(); var = mean(h^2); h = h * rsqrt(var + eps);
//                             return weight * h.to(bf16)          (product rounded to bf16)
// With ADD (fused residual): residual = bf16(residual + x) first (transformers' bf16 add), and
// the norm is taken of the new residual, which is also written back.
// OFF: the zero-centred weight of Gemma3RMSNorm, bf16((v · r) · (off + w)) in fp32, in place of
// bf16(w · bf16(v · r)).
template <bool ADD, bool OFF = false>
__device__ __forceinline__ void rms_row(bf16* __restrict__ out, bf16* __restrict__ res,
                                               const bf16* __restrict__ x, const bf16* __restrict__ w,
                                               int hidden, float eps, float off = 0.f) {
    __shared__ float scratch[32];
    const int tid = threadIdx.x;
    // The row is taken from `src` (x for the plain norm, the updated residual for the fused one).
    const bool vec = (hidden & 7) == 0 && aligned16(out) && aligned16(x) && aligned16(w) &&
                     (!ADD || aligned16(res));
    float ss = 0.f;
    if (vec) {
        const int nc = hidden >> 3;
        uint4 cache[ROW_CACHE];
#pragma unroll
        for (int i = 0; i < ROW_CACHE; ++i) {
            const int c = tid + i * ROW_THREADS;
            if (c < nc) {
                uint4 v = reinterpret_cast<const uint4*>(x)[c];
                if (ADD) {
                    uint4 r = reinterpret_cast<const uint4*>(res)[c];
                    const uint32_t* vw = reinterpret_cast<const uint32_t*>(&v);
                    const uint32_t* rw = reinterpret_cast<const uint32_t*>(&r);
                    uint4 s;
                    uint32_t* sw = reinterpret_cast<uint32_t*>(&s);
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        float2 a = unpack2(vw[k]), bb = unpack2(rw[k]);
                        sw[k] = pack2(bb.x + a.x, bb.y + a.y);
                    }
                    reinterpret_cast<uint4*>(res)[c] = s;
                    v = s;
                }
                cache[i] = v;
                ss = rms_acc8(ss, v);  // rowwise_math.cuh (shared with gemv_bf16_postnorm_rms)
            }
        }
        // Rows longer than ROW_THREADS * ROW_CACHE * 8 elements: the rest is re-read in pass 2
        // (each thread re-reads only what it wrote itself, so no barrier is needed for that).
        for (int c = tid + ROW_CACHE * ROW_THREADS; c < nc; c += ROW_THREADS) {
            uint4 v = reinterpret_cast<const uint4*>(x)[c];
            if (ADD) {
                uint4 r = reinterpret_cast<const uint4*>(res)[c];
                const uint32_t* vw = reinterpret_cast<const uint32_t*>(&v);
                const uint32_t* rw = reinterpret_cast<const uint32_t*>(&r);
                uint4 s;
                uint32_t* sw = reinterpret_cast<uint32_t*>(&s);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    float2 a = unpack2(vw[k]), bb = unpack2(rw[k]);
                    sw[k] = pack2(bb.x + a.x, bb.y + a.y);
                }
                reinterpret_cast<uint4*>(res)[c] = s;
                v = s;
            }
            ss = rms_acc8(ss, v);
        }
        ss = block_sum(ss, scratch);
        const float r = rms_rstd(ss, hidden, eps);
#pragma unroll
        for (int i = 0; i < ROW_CACHE; ++i) {
            const int c = tid + i * ROW_THREADS;
            if (c < nc) {
                uint4 wv = __ldg(reinterpret_cast<const uint4*>(w) + c);
                const uint32_t* vw = reinterpret_cast<const uint32_t*>(&cache[i]);
                const uint32_t* ww = reinterpret_cast<const uint32_t*>(&wv);
                uint4 o;
                uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    float2 a = unpack2(vw[k]), g = unpack2(ww[k]);
                    ow[k] = OFF ? pack2((a.x * r) * (off + g.x), (a.y * r) * (off + g.y)) : pack2(g.x * rb(a.x * r), g.y * rb(a.y * r));
                }
                reinterpret_cast<uint4*>(out)[c] = o;
            }
        }
        const bf16* src = ADD ? res : x;
        for (int c = tid + ROW_CACHE * ROW_THREADS; c < nc; c += ROW_THREADS) {
            uint4 v = reinterpret_cast<const uint4*>(src)[c];
            uint4 wv = __ldg(reinterpret_cast<const uint4*>(w) + c);
            const uint32_t* vw = reinterpret_cast<const uint32_t*>(&v);
            const uint32_t* ww = reinterpret_cast<const uint32_t*>(&wv);
            uint4 o;
            uint32_t* ow = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 a = unpack2(vw[k]), g = unpack2(ww[k]);
                ow[k] = OFF ? pack2((a.x * r) * (off + g.x), (a.y * r) * (off + g.y)) : pack2(g.x * rb(a.x * r), g.y * rb(a.y * r));
            }
            reinterpret_cast<uint4*>(out)[c] = o;
        }
    } else {
        // Scalar path (any hidden, any alignment). Pass 2 re-reads what the same thread wrote.
        for (int i = tid; i < hidden; i += ROW_THREADS) {
            float v = f(x[i]);
            if (ADD) {
                v = rb(f(res[i]) + v);
                res[i] = b(v);
            }
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
        const float r = rsqrtf(ss * (1.0f / (float)hidden) + eps);
        const bf16* src = ADD ? res : x;
        for (int i = tid; i < hidden; i += ROW_THREADS)
            out[i] = OFF ? b((f(src[i]) * r) * (off + f(w[i]))) : b(f(w[i]) * rb(f(src[i]) * r));
    }
}

// out[t] = rmsnorm(x[t]) * w
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm(bf16* __restrict__ out, const bf16* __restrict__ x, const bf16* __restrict__ w, int n, int hidden,
         float eps) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row<false>(out + (size_t)t * hidden, nullptr, x + (size_t)t * hidden, w, hidden, eps);
}

// residual[t] = bf16(residual[t] + x[t]); out[t] = rmsnorm(residual[t]) * w
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
add_rms_norm(bf16* __restrict__ out, bf16* __restrict__ residual, const bf16* __restrict__ x,
             const bf16* __restrict__ w, int n, int hidden, float eps) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row<true>(out + (size_t)t * hidden, residual + (size_t)t * hidden, x + (size_t)t * hidden, w, hidden,
                  eps);
}

// Gemma's zero-centred norms (Gemma3RMSNorm), bf16 rows: out[t] = bf16(rmsnorm(x[t]) * (off + w))
// in fp32 — Gemma 3's post-attention and post-feedforward norms of a bf16 activation.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm_off(bf16* __restrict__ out, const bf16* __restrict__ x, const bf16* __restrict__ w, int n, int hidden,
             float eps, float off) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row<false, true>(out + (size_t)t * hidden, nullptr, x + (size_t)t * hidden, w, hidden, eps, off);
}

// residual[t] = bf16(residual[t] + x[t]); out[t] = bf16(rmsnorm(residual[t]) * (off + w))
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
add_rms_norm_off(bf16* __restrict__ out, bf16* __restrict__ residual, const bf16* __restrict__ x,
                 const bf16* __restrict__ w, int n, int hidden, float eps, float off) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row<true, true>(out + (size_t)t * hidden, residual + (size_t)t * hidden, x + (size_t)t * hidden, w,
                        hidden, eps, off);
}

// ----------------------------------------------------------------------------- SwiGLU
// gate_up[t] = [gate (inter) | up (inter)];  out[t, i] = bf16( bf16(silu(gate)) * up )
// transformers: down_proj(act_fn(gate_proj(x)) * up_proj(x)); F.silu on bf16 computes
// x / (1 + exp(-x)) in fp32 and rounds once; the product is a second bf16 op (silu_bf16 and
// swiglu2 in rowwise_math.cuh, shared with gemm_skinny.cu's gemv_bf16_swiglu_add).

extern "C" __global__ void __launch_bounds__(ROW_THREADS * 2)
swiglu(bf16* __restrict__ out, const bf16* __restrict__ gate_up, int n, int inter) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const bf16* g = gate_up + (size_t)t * 2 * inter;
    const bf16* u = g + inter;
    bf16* o = out + (size_t)t * inter;
    if ((inter & 7) == 0 && aligned16(gate_up) && aligned16(out)) {
        const int nc = inter >> 3;
        for (int c = threadIdx.x; c < nc; c += ROW_THREADS * 2) {
            uint4 gv = reinterpret_cast<const uint4*>(g)[c];
            uint4 uv = reinterpret_cast<const uint4*>(u)[c];
            const uint32_t* gw = reinterpret_cast<const uint32_t*>(&gv);
            const uint32_t* uw = reinterpret_cast<const uint32_t*>(&uv);
            uint4 ov;
            uint32_t* ow = reinterpret_cast<uint32_t*>(&ov);
#pragma unroll
            for (int k = 0; k < 4; ++k) ow[k] = swiglu2(gw[k], uw[k]);
            reinterpret_cast<uint4*>(o)[c] = ov;
        }
    } else {
        for (int i = threadIdx.x; i < inter; i += ROW_THREADS * 2) o[i] = b(silu_bf16(f(g[i])) * f(u[i]));
    }
}

// ----------------------------------------------------------------------------- GeGLU (tanh)
// gate_up[t] = [gate (inter) | up (inter)];  out[t, i] = bf16( bf16(gelu_tanh(gate)) * up )
// (transformers' Gemma MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)) with
// act_fn = gelu_pytorch_tanh; two bf16 ops, as SwiGLU).
extern "C" __global__ void __launch_bounds__(ROW_THREADS * 2)
geglu_tanh(bf16* __restrict__ out, const bf16* __restrict__ gate_up, int n, int inter) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const bf16* g = gate_up + (size_t)t * 2 * inter;
    const bf16* u = g + inter;
    bf16* o = out + (size_t)t * inter;
    for (int i = threadIdx.x; i < inter; i += ROW_THREADS * 2) o[i] = b(__fmul_rn(gelu_tanh_bf16(f(g[i])), f(u[i])));
}

// ----------------------------------------------------------------------------- gather_last
// out[s, :] = x[last_token[s], :]; an index outside [0, tokens) gives a row of zeros.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
gather_last(bf16* __restrict__ out, const bf16* __restrict__ x, const int* __restrict__ last_token, int seqs,
            int tokens, int hidden) {
    KERN_PDL_WAIT();
    const int s = blockIdx.x;
    if (s >= seqs) return;
    const int t = last_token[s];
    const bool valid = t >= 0 && t < tokens;
    const bf16* src = x + (size_t)(valid ? t : 0) * hidden;
    bf16* o = out + (size_t)s * hidden;
    if ((hidden & 7) == 0 && aligned16(out) && aligned16(x)) {
        const int nc = hidden >> 3;
        for (int c = threadIdx.x; c < nc; c += ROW_THREADS) {
            uint4 v = valid ? reinterpret_cast<const uint4*>(src)[c] : make_uint4(0, 0, 0, 0);
            reinterpret_cast<uint4*>(o)[c] = v;
        }
    } else {
        for (int i = threadIdx.x; i < hidden; i += ROW_THREADS) o[i] = valid ? src[i] : b(0.f);
    }
}

// ----------------------------------------------------------------------------- fp32 residual
// `kern pack --residual f32`: the residual stream (x, x_last) is kept in fp32, as llama.cpp keeps
// its activations, instead of transformers' bf16. The residual adds are then exact fp32 adds
// (no rounding to bf16 after every layer); only the norms' outputs, the GEMMs' inputs, are bf16,
// rounded exactly as the bf16 kernels above round them (bf16(w * bf16(v * r))). Row-wise like
// the rest: one CTA per row, 16-byte fp32 / 8-byte bf16 vector loads when the row length is a
// multiple of 4 and the pointers allow, a scalar path otherwise.

static __device__ __forceinline__ bool aligned8(const void* p) {
    return ((uintptr_t)p & 7u) == 0;
}

// out[t, :] = float(bf16(table[ids[t], :] * scale)); ids outside [0, vocab) give a row of zeros.
// (scale as in `embedding`: 1 for most models, bf16(sqrt(hidden)) for Gemma; the product is
// rounded to bf16 as transformers' bf16 multiply rounds it, and rb of a bf16 value is itself.)
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
embedding_f32(float* __restrict__ out, const bf16* __restrict__ table, const int* __restrict__ ids, int n,
              int hidden, int vocab, float scale) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int id = ids[t];
    const bool valid = id >= 0 && id < vocab;
    float* o = out + (size_t)t * hidden;
    const bf16* src = table + (size_t)(valid ? id : 0) * hidden;
    for (int i = threadIdx.x; i < hidden; i += ROW_THREADS) o[i] = valid ? rb(f(src[i]) * scale) : 0.f;
}

// One row. ADD: res = res + x (fp32, written back), then the norm of res. Plain: the norm of src.
// Pass 2 re-reads only the elements the same thread wrote in pass 1: no barrier needed for that.
template <bool ADD, bool OFF = false>
__device__ __forceinline__ void rms_row_f32(bf16* __restrict__ out, float* res, const float* src,
                                            const bf16* __restrict__ x, const bf16* __restrict__ w, int hidden,
                                            float eps, float off = 0.f) {
    __shared__ float scratch[32];
    const int tid = threadIdx.x;
    const float* row = ADD ? res : src;
    float ss = 0.f;
    const bool vec = (hidden & 3) == 0 && aligned16(row) && aligned8(w) && aligned8(out) && (!ADD || aligned8(x));
    if (vec) {
        const int nc = hidden >> 2;
        for (int c = tid; c < nc; c += ROW_THREADS) {
            float4 v = reinterpret_cast<const float4*>(row)[c];
            if (ADD) {
                const uint2 xv = reinterpret_cast<const uint2*>(x)[c];
                const float2 a = unpack2(xv.x), bb = unpack2(xv.y);
                v.x += a.x;
                v.y += a.y;
                v.z += bb.x;
                v.w += bb.y;
                reinterpret_cast<float4*>(res)[c] = v;
            }
            ss = rms_acc4(ss, v);
        }
        // rms_acc4, block_sum's order, rms_rstd and rms_scale4 are what gemv_bf16_rms
        // (gemm_skinny.cu) reproduces for its x operand (rowwise_math.cuh).
        ss = block_sum(ss, scratch);
        const float r = rms_rstd(ss, hidden, eps);
        for (int c = tid; c < nc; c += ROW_THREADS) {
            const float4 v = reinterpret_cast<const float4*>(row)[c];
            const uint2 wv = __ldg(reinterpret_cast<const uint2*>(w) + c);
            reinterpret_cast<uint2*>(out)[c] = OFF ? rms_scale4_off(v, r, wv, off) : rms_scale4(v, r, wv);
        }
    } else {
        for (int i = tid; i < hidden; i += ROW_THREADS) {
            float v = row[i];
            if (ADD) {
                v += f(x[i]);
                res[i] = v;
            }
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
        const float r = rsqrtf(ss * (1.0f / (float)hidden) + eps);
        for (int i = tid; i < hidden; i += ROW_THREADS)
            out[i] = OFF ? b((row[i] * r) * (off + f(w[i]))) : b(f(w[i]) * rb(row[i] * r));
    }
}

// out[t] = rmsnorm(x[t]) * w, x fp32
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm_f32(bf16* __restrict__ out, const float* __restrict__ x, const bf16* __restrict__ w, int n, int hidden,
             float eps) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row_f32<false>(out + (size_t)t * hidden, nullptr, x + (size_t)t * hidden, nullptr, w, hidden, eps);
}

// residual[t] += x[t] (fp32); out[t] = rmsnorm(residual[t]) * w
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
add_rms_norm_f32(bf16* __restrict__ out, float* __restrict__ residual, const bf16* __restrict__ x,
                 const bf16* __restrict__ w, int n, int hidden, float eps) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row_f32<true>(out + (size_t)t * hidden, residual + (size_t)t * hidden, nullptr, x + (size_t)t * hidden, w,
                      hidden, eps);
}

// Gemma's zero-centred norms on the fp32 residual: out[t] = bf16(rmsnorm(x[t]) * (off + w)).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_norm_f32_off(bf16* __restrict__ out, const float* __restrict__ x, const bf16* __restrict__ w, int n,
                 int hidden, float eps, float off) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row_f32<false, true>(out + (size_t)t * hidden, nullptr, x + (size_t)t * hidden, nullptr, w, hidden, eps,
                             off);
}

// residual[t] += x[t] (fp32); out[t] = bf16(rmsnorm(residual[t]) * (off + w))
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
add_rms_norm_f32_off(bf16* __restrict__ out, float* __restrict__ residual, const bf16* __restrict__ x,
                     const bf16* __restrict__ w, int n, int hidden, float eps, float off) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    rms_row_f32<true, true>(out + (size_t)t * hidden, residual + (size_t)t * hidden, nullptr,
                            x + (size_t)t * hidden, w, hidden, eps, off);
}

// ----------------------------------------------------------------------------- sandwich norms
// Gemma 3's post-norm, residual add and the next pre-norm of a block with four norms, in one
// launch (the fused decode program's steps above 8 tokens, kern_packs::fused): per row t
//   o_n      = bf16(rmsnorm(o[t]) · (off + w_post))        rms_norm_off of the bf16 row o[t]
//   x_out[t] = x_in[t] + float(o_n)                        fp32
//   out[t]   = bf16(rmsnorm(x_out[t]) · (off + w_pre))     add_rms_norm_f32_off's norm
// Bit-identical to rms_norm_off(o_n, o, w_post) then add_rms_norm_f32_off(out, x, o_n, w_pre)
// with x_in = x before and x_out = x after: each half takes its kernel's vector path exactly when
// that kernel would (the bf16 half for hidden % 8 == 0, the fp32 half for hidden % 4 == 0; every
// pointer aligned, as the manifest's buffers are) with the same arithmetic (rowwise_math.cuh:
// rms_acc8, rms_rstd, postnorm_add4, rms_acc4, rms_scale4_off), its scalar path otherwise. x_out
// may be x_in (in place: a thread reads x_in only at the elements it then writes) or another
// buffer (the fused program ping-pongs the residual, as gemv_bf16_postnorm_rms needs it).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
postnorm_add_rms_norm_f32_off(bf16* __restrict__ out, float* x_out, const float* x_in, const bf16* __restrict__ o,
                              const bf16* __restrict__ w_post, const bf16* __restrict__ w_pre, int n, int hidden,
                              float eps, float off) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    __shared__ float scratch[32];
    const int tid = threadIdx.x;
    const size_t row = (size_t)t * hidden;
    o += row;
    x_in += row;
    x_out += row;
    out += row;
    // 1. rstd of the bf16 row o, as rms_row<false, true> (rms_norm_off) sums it.
    float ss = 0.f;
    if ((hidden & 7) == 0 && aligned16(o) && aligned16(w_post)) {
        const int nc = hidden >> 3;
        for (int c = tid; c < nc; c += ROW_THREADS) ss = rms_acc8(ss, reinterpret_cast<const uint4*>(o)[c]);
        ss = block_sum(ss, scratch);
    } else {
        for (int i = tid; i < hidden; i += ROW_THREADS) {
            const float v = f(o[i]);
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
    }
    // (rms_row's vector path: rms_rstd; its scalar path writes the same expression out, and nvcc
    // contracts both to rcp.rn, fma.rn, rsqrt.)
    const float ro = (hidden & 7) == 0 && aligned16(o) && aligned16(w_post) ? rms_rstd(ss, hidden, eps)
                                                                            : rsqrtf(ss * (1.0f / (float)hidden) + eps);
    // 2. x_out = x_in + o_n and its rstd, as rms_row_f32<true, true> (add_rms_norm_f32_off); 3. out.
    ss = 0.f;
    if ((hidden & 3) == 0 && aligned16(x_in) && aligned16(x_out) && aligned8(o) && aligned8(w_post) && aligned8(w_pre) &&
        aligned8(out)) {
        const int nc = hidden >> 2;
        for (int c = tid; c < nc; c += ROW_THREADS) {
            const float4 v = postnorm_add4(reinterpret_cast<const float4*>(x_in)[c], reinterpret_cast<const uint2*>(o)[c], ro,
                                           __ldg(reinterpret_cast<const uint2*>(w_post) + c), off);
            reinterpret_cast<float4*>(x_out)[c] = v;
            ss = rms_acc4(ss, v);
        }
        ss = block_sum(ss, scratch);
        const float r = rms_rstd(ss, hidden, eps);
        for (int c = tid; c < nc; c += ROW_THREADS) {
            const float4 v = reinterpret_cast<const float4*>(x_out)[c];
            const uint2 wv = __ldg(reinterpret_cast<const uint2*>(w_pre) + c);
            reinterpret_cast<uint2*>(out)[c] = rms_scale4_off(v, r, wv, off);
        }
    } else {
        for (int i = tid; i < hidden; i += ROW_THREADS) {
            const float v = x_in[i] + rb((f(o[i]) * ro) * (off + f(w_post[i])));
            x_out[i] = v;
            ss += v * v;
        }
        ss = block_sum(ss, scratch);
        const float r = rsqrtf(ss * (1.0f / (float)hidden) + eps);
        for (int i = tid; i < hidden; i += ROW_THREADS) out[i] = b((x_out[i] * r) * (off + f(w_pre[i])));
    }
}

// out[s, :] = x[last_token[s], :] (fp32 rows); an index outside [0, tokens) gives zeros.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
gather_last_f32(float* __restrict__ out, const float* __restrict__ x, const int* __restrict__ last_token, int seqs,
                int tokens, int hidden) {
    KERN_PDL_WAIT();
    const int s = blockIdx.x;
    if (s >= seqs) return;
    const int t = last_token[s];
    const bool valid = t >= 0 && t < tokens;
    const float* src = x + (size_t)(valid ? t : 0) * hidden;
    float* o = out + (size_t)s * hidden;
    for (int i = threadIdx.x; i < hidden; i += ROW_THREADS) o[i] = valid ? src[i] : 0.f;
}
