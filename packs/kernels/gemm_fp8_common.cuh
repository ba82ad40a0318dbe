//! FP8 E4M3 helpers shared by gemm_fp8.cu (decode GEMVs, dequantization, activation quantization)
//! and gemm_fp8_wgmma.cu (the W8A8 prefill GEMM). Not a kernel file. Under KERN_HOST_EMU
//! (packs/kernels/verify/host_emu) the few PTX instructions below have plain C++ stand-ins with
//! the same results.
//!
//! E4M3 ("e4m3fn", torch.float8_e4m3fn, __nv_fp8_e4m3): 1 sign bit, 4 exponent bits (bias 7),
//! 3 mantissa bits, no infinities; S.1111.111 is NaN (0x7F, 0xFF); exponent 0 is subnormal
//! (m · 2^-9); the largest finite value is ±448 (S.1111.110).
//!
//! The weight layout every FP8 kernel here reads is the Hugging Face fine-grained FP8 layout
//! (DeepSeek-V3, Qwen3-*-FP8): W e4m3 [N, K] row-major (nn.Linear's [out, in]) and
//! Ws f32 [ceil(N/128), ceil(K/128)] (`weight_scale_inv`), value(n, k) = W[n, k] · Ws[n/128, k/128].
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace kfp8 {

constexpr int kBlock = 128;  // the scale block: 128 × 128 weights; 1 × 128 activations

__host__ __device__ __forceinline__ float bits_f32(uint32_t u) {
#ifdef KERN_HOST_EMU
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#else
  return __uint_as_float(u);
#endif
}
__host__ __device__ __forceinline__ uint32_t f32_bits(float f) {
#ifdef KERN_HOST_EMU
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#else
  return __float_as_uint(f);
#endif
}

// f32 → bf16 (round to nearest even; cvt.rn.bf16.f32), as bits.
__host__ __device__ __forceinline__ uint32_t bf16_bits(float f) {
#ifdef KERN_HOST_EMU
  return __float2bfloat16_rn(f).x;
#else
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#endif
}

// One e4m3 byte (the low 8 bits of b) as an exact f32; NaN codes give a quiet NaN of their sign.
__host__ __device__ __forceinline__ float e4m3_f32(uint32_t b) {
  const uint32_t s = (b & 0x80u) << 24, em = b & 0x7Fu;
  if (em == 0x7Fu) return bits_f32(s | 0x7FC00000u);
  if (em < 8u) return bits_f32(s | f32_bits(static_cast<float>(em) * 0x1p-9f));  // 0 and subnormals: m·2^-9
  return bits_f32(s | ((em + (120u << 3)) << 20));  // exponent e + 120, mantissa m in the top 3 bits
}

// Four e4m3 bytes q = [b0 b1 b2 b3] → two bf16x2 registers holding exactly their values:
// odd = (b1 | b3 << 16), even = (b0 | b2 << 16). Each byte's sign goes to bit 15 of its half and
// its 7 exponent+mantissa bits to bits 10..4 (a bf16 whose value is the byte's · 2^-120, subnormal
// codes included), then one exact bf16x2 multiply by 2^120 (vLLM's fp8-Marlin conversion).
// NaN codes (S.1111.111) come out as ±480: the GEMVs treat them as finite (KERNELS.md).
__device__ __forceinline__ uint32_t bf2_mul_2p120(uint32_t v);
__device__ __forceinline__ void e4m3x4_bf16(uint32_t q, uint32_t& odd, uint32_t& even) {
  const uint32_t o = (q & 0x80008000u) | ((q & 0x7F007F00u) >> 4);
  const uint32_t q8 = q << 8;
  const uint32_t e = (q8 & 0x80008000u) | ((q8 & 0x7F007F00u) >> 4);
  odd = bf2_mul_2p120(o);
  even = bf2_mul_2p120(e);
}

#ifndef KERN_HOST_EMU
// a · (2^120, 2^120) + (-0, -0) on two bf16 lanes: exact (a power of two; -0 keeps the sign of 0).
__device__ __forceinline__ uint32_t bf2_mul_2p120(uint32_t v) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(v), "r"(0x7B807B80u), "r"(0x80008000u));
  return d;
}
// Two f32 → two e4m3 (round to nearest even, saturating to ±448; NaN stays NaN): lo in bits 0..7.
__device__ __forceinline__ uint32_t e4m3x2_sat(float lo, float hi) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}
#else
// The host stand-ins (host_emu/fp8_emu.h): the same values, computed in plain C++.
#include "fp8_emu.h"
#endif

}  // namespace kfp8
