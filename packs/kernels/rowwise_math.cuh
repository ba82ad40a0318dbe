// The arithmetic of rowwise.cu's RMSNorms (the fp32-residual rms_norm_f32 / add_rms_norm_f32 and
// their _off forms, vector path; the bf16 rows' sum of squares), its Gemma sandwich-norm update and
// its SwiGLU / GeGLU, as device functions shared with the fused GEMVs of gemm_skinny.cu
// (gemv_bf16_rms(_off), gemv_bf16_postnorm_rms, gemv_bf16_swiglu_add, gemv_bf16_geglu(_add):
// GEMM.md, "Fused decode GEMVs"), which must produce the same bits. Not a kernel file: included by rowwise.cu and gemm_skinny.cu.
//
// Where a compiler could contract a multiply and an add differently at two call sites, the
// order is written out (__fmaf_rn: PTX fma.rn, never split or re-fused) as nvcc 13.0.88 had
// chosen it for rowwise.cu before these functions moved here; the remaining plain products
// feed only a rounding or an fma's addend, which neither NVVM nor ptxas contract. rowwise's
// cubins are byte-identical to before. silu_bf16 keeps the library expf and the IEEE division;
// its one contraction (expf's final scale multiply fused with the `1 +`: an fma.rn in the PTX)
// is made by NVVM on the inlined expression, the same at every call site (GEMM.md).
#pragma once

#include "common.cuh"

namespace kern {

// ----------------------------------------------------------------------------- RMSNorm (fp32 rows)
// One 4-float chunk of a row added to a thread's sum of squares: ss + (((y·y + x·x) + z·z) + w·w)
// with the three inner adds fused (fma.rn); the product y·y feeds only an fma's addend and the
// outer add adds no product, so neither compiler can contract them differently. A thread of rowwise's 128 adds its chunks c = tid,
// tid + 128, ... in increasing c; the block then adds the 128 partial sums with block_sum
// (common.cuh): warp_sum per warp, then warp_sum of the 4 warp sums (lanes 0..3, zeros above).
__device__ __forceinline__ float rms_acc4(float ss, float4 v) {
    return ss + __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.x, v.x, v.y * v.y)));
}

// One 8-value bf16 chunk (16 bytes) of a row added to a thread's sum of squares, as rms_row's
// vector path (the bf16 rows of rms_norm / rms_norm_off / add_rms_norm*) adds it: for each pair
// (x, y) of the chunk in order, ss + fma(x, x, y·y) — the contraction nvcc 13.0.88 had chosen for
// `ss += a.x * a.x + a.y * a.y` (PTX: mul.f32, fma.rn.f32, add.f32), written out so the fused
// GEMVs' post-norm prologue (gemv_bf16_postnorm_rms) gets the same sum.
__device__ __forceinline__ float rms_acc8(float ss, uint4 v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 a = unpack2(w[k]);
        ss = ss + __fmaf_rn(a.x, a.x, a.y * a.y);
    }
    return ss;
}

// rstd of a row from its sum of squares: rsqrt(ss · (1 / hidden) + eps), the multiply-add fused.
__device__ __forceinline__ float rms_rstd(float ss, int hidden, float eps) {
    return rsqrtf(__fmaf_rn(__frcp_rn((float)hidden), ss, eps));
}

// Four normalized outputs packed as bf16: bf16(w · bf16(v · r)) (transformers' Qwen3RMSNorm
// rounding: the normalized value is rounded to bf16 before the weight multiplies it). Products
// feed only roundings: nothing to contract.
__device__ __forceinline__ uint2 rms_scale4(float4 v, float r, uint2 w4) {
    const float2 g0 = unpack2(w4.x), g1 = unpack2(w4.y);
    uint2 o;
    o.x = pack2(g0.x * rb(v.x * r), g0.y * rb(v.y * r));
    o.y = pack2(g1.x * rb(v.z * r), g1.y * rb(v.w * r));
    return o;
}

// Four normalized outputs packed as bf16 with a zero-centred weight: bf16((v · r) · (off + w)) in
// fp32 (transformers' Gemma3RMSNorm: `(x̂ * (1.0 + weight.float())).type_as(x)`; off = 1 for
// Hugging Face weights, 0 for GGUF files whose converter added the 1 to the weight).
__device__ __forceinline__ uint2 rms_scale4_off(float4 v, float r, uint2 w4, float off) {
    const float2 g0 = unpack2(w4.x), g1 = unpack2(w4.y);
    uint2 o;
    o.x = pack2((v.x * r) * (off + g0.x), (v.y * r) * (off + g0.y));
    o.y = pack2((v.z * r) * (off + g1.x), (v.w * r) * (off + g1.y));
    return o;
}

// Gemma's sandwich-norm residual update for four values (postnorm_add_rms_norm_f32_off and the
// prologue of gemv_bf16_postnorm_rms): the post-norm of the bf16 projection output o with its rstd
// r_o, rounded to bf16 as rms_norm_off writes it, bf16((o · r_o) · (off + w_post)), then added to
// the fp32 residual as add_rms_norm_f32_off adds its bf16 input: x_in + float(that).
__device__ __forceinline__ float4 postnorm_add4(float4 x, uint2 o4, float r, uint2 w4, float off) {
    const float2 o0 = unpack2(o4.x), o1 = unpack2(o4.y);
    const float2 g0 = unpack2(w4.x), g1 = unpack2(w4.y);
    const float2 n0 = unpack2(pack2((o0.x * r) * (off + g0.x), (o0.y * r) * (off + g0.y)));
    const float2 n1 = unpack2(pack2((o1.x * r) * (off + g1.x), (o1.y * r) * (off + g1.y)));
    x.x += n0.x;
    x.y += n0.y;
    x.z += n1.x;
    x.w += n1.y;
    return x;
}

// ----------------------------------------------------------------------------- GeGLU (tanh)
// F.gelu(x, approximate="tanh") on a bf16 value, as PyTorch's CUDA kernel computes it in fp32
// (GeluCUDAKernelImpl: kBeta = sqrt(2) * 2/sqrt(pi) * 0.5, kKappa = 0.044715,
// 0.5 * x * (1 + tanh(kBeta * (x + kKappa * x³)))), rounded once to bf16 (returned as fp32).
__device__ __forceinline__ float gelu_tanh_bf16(float x) {
    const float kBeta = (float)(1.4142135623730951 * 1.1283791670955126 * 0.5);
    const float kKappa = 0.044715f;
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return rb(0.5f * x * (1.0f + tanhf(inner)));
}

// Two GeGLU outputs packed as bf16: bf16(gelu_tanh_bf16(gate) · up) (rowwise.cu's geglu_tanh
// per value; the fused down GEMVs gemv_bf16_geglu(_add) of gemm_skinny.cu).
__device__ __forceinline__ uint32_t geglu2(uint32_t gate2, uint32_t up2) {
    const float2 a = unpack2(gate2), u = unpack2(up2);
    return pack2(__fmul_rn(gelu_tanh_bf16(a.x), u.x), __fmul_rn(gelu_tanh_bf16(a.y), u.y));
}

// ----------------------------------------------------------------------------- SwiGLU
// F.silu on a bf16 value: x / (1 + exp(-x)) in fp32, rounded once to bf16 (returned as fp32).
__device__ __forceinline__ float silu_bf16(float g) { return rb(g / (1.0f + expf(-g))); }

// Two SwiGLU outputs packed as bf16: bf16(silu_bf16(gate) · up) (transformers:
// act_fn(gate_proj(x)) * up_proj(x), two bf16 ops).
__device__ __forceinline__ uint32_t swiglu2(uint32_t gate2, uint32_t up2) {
    const float2 a = unpack2(gate2), u = unpack2(up2);
    return pack2(__fmul_rn(silu_bf16(a.x), u.x), __fmul_rn(silu_bf16(a.y), u.y));
}

}  // namespace kern
