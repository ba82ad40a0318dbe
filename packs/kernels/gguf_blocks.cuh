//! GGUF (ggml) quant blocks on the device: block layouts, the exact dequantization of gguf-py /
//! crates/kern-weights/src/dequant.rs (for the dequant_* kernels of gemv_gguf.cu), and the bit
//! helpers the GGUF GEMVs build tensor-core fragments with. Not a kernel file: included by
//! gemv_gguf.cu. Under KERN_HOST_EMU (packs/kernels/verify/host_emu) the inline PTX below comes
//! from host_emu/gguf_emu.h instead.
//!
//! Block layouts (shared/notes/gguf.md §2; offsets in bytes, f16 = IEEE half, little-endian):
//!   Q4_0  32 el / 18 B: d f16 @0, qs[16] @2           x[j] = d·(lo(qs[j]) − 8), x[j+16] = d·(hi(qs[j]) − 8)
//!   Q4_1  32 el / 20 B: d @0, m @2, qs[16] @4         x = d·q + m
//!   Q5_0  32 el / 22 B: d @0, qh u32 @2, qs[16] @6    q = nibble | bit(qh, e) << 4;  x = d·(q − 16)
//!   Q5_1  32 el / 24 B: d @0, m @2, qh @4, qs @8      x = d·q + m
//!   Q8_0  32 el / 34 B: d @0, qs i8[32] @2            x = q·d
//!   Q2_K 256 el / 84 B: scales[16] @0, qs[64] @16, d @80, dmin @82
//!   Q3_K 256 el / 110 B: hmask[32] @0, qs[64] @32, scales[12] @96, d @108
//!   Q4_K 256 el / 144 B: d @0, dmin @2, scales[12] @4, qs[128] @16
//!   Q5_K 256 el / 176 B: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
//!   Q6_K 256 el / 210 B: ql[128] @0, qh[64] @128, scales i8[16] @192, d @208
//!
//! Exactness (the dequant_* kernels must equal kern-weights' CPU dequantization bit for bit):
//! every f32 operation is the one dequant.rs / gguf-py evaluates, in the same order, with
//! __fmul_rn / __fadd_rn / __fsub_rn (nvcc never contracts those into an FMA); f16 → f32 is
//! numpy's exact widening (NaN payload and signaling bit kept); a NaN result gets the bits an x86
//! SSE unit gives it (a NaN operand quieted, the first one if both are NaN; an invalid operation,
//! inf·0 or inf − inf, the "indefinite" 0xFFC00000), where the GPU would give its canonical NaN;
//! f32 → bf16 is the `half` crate's: round to nearest even, a NaN → (bits >> 16) | 0x40.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace kgguf {

typedef __nv_bfloat16 bf16;

#ifndef KERN_HOST_EMU
__device__ __forceinline__ float u2f(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t f2u(float f) { return __float_as_uint(f); }
// PRMT (byte permute): result byte i = byte ((s >> 4i) & 7) of {b, a} (a = bytes 0..3).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }
// The 32 bits of (hi:lo) >> sh (sh < 32).
__device__ __forceinline__ uint32_t fshr(uint32_t lo, uint32_t hi, uint32_t sh) { return __funnelshift_r(lo, hi, sh); }
// d = a·b + c on two bf16 lanes, one rounding (the GEMVs use it only where the result is exact).
__device__ __forceinline__ uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// f16 → f32 in one instruction (exact for every finite value and ±inf; the GEMVs' scales).
__device__ __forceinline__ float h2f(uint32_t h) {
  float f;
  const unsigned short hs = static_cast<unsigned short>(h);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
  return f;
}
__device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }
// 16-byte global → shared copy (cp.async.cg: L2 only, the weights are read once; L2 fetches
// 256-byte granules, as gemm_skinny's weight loads ask). The destination is a shared-window
// address (saddr of the array once, then integer offsets: no address conversion per copy).
typedef uint32_t saddr_t;
__device__ __forceinline__ saddr_t saddr(void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp16(saddr_t s, const void* gmem) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#else
#include "gguf_emu.h"
#endif

// ------------------------------------------------------------------ exact scalar helpers

__device__ __forceinline__ bool is_nan(float f) { return (f2u(f) & 0x7fffffffu) > 0x7f800000u; }

// IEEE half bits → f32 exactly as numpy's astype(float32): finite values and ±inf exactly (a
// subnormal half becomes a normal f32 by the exact product with 2^112), a NaN keeps its payload
// and its quiet bit. Integer and exact operations only, so the GPU and the host agree.
__device__ __forceinline__ float h2f_exact(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  if ((h & 0x7c00u) == 0x7c00u) return u2f(sign | 0x7f800000u | ((h & 0x03ffu) << 13));
  const float mag = fmul(u2f((h & 0x7fffu) << 13), 0x1p112f);
  return u2f(f2u(mag) | sign);
}

// The NaN an x86 SSE unit produces for a ∘ b when the result is NaN.
__device__ __forceinline__ float x86_nan(float a, float b) {
  if (is_nan(a)) return u2f(f2u(a) | 0x00400000u);
  if (is_nan(b)) return u2f(f2u(b) | 0x00400000u);
  return u2f(0xffc00000u);
}
__device__ __forceinline__ float xmul(float a, float b) {
  const float r = fmul(a, b);
  return is_nan(r) ? x86_nan(a, b) : r;
}
__device__ __forceinline__ float xadd(float a, float b) {
  const float r = fadd(a, b);
  return is_nan(r) ? x86_nan(a, b) : r;
}
__device__ __forceinline__ float xsub(float a, float b) {
  const float r = fsub(a, b);
  return is_nan(r) ? x86_nan(a, b) : r;
}

// f32 → bf16 bits as the `half` crate's bf16::from_f32 (kern-weights' write to bf16).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  const uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu;
  return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// ------------------------------------------------------------------ block types
// BE elements per block, BB bytes per block; deq8(blk, e0, o): elements e0 .. e0+7 of the block
// (e0 % 8 == 0) as dequant.rs computes them. `blk` is a global pointer (byte loads: blocks are
// only 2-byte aligned).

__device__ __forceinline__ uint32_t ld_u16(const uint8_t* p) { return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8; }
__device__ __forceinline__ float ld_half(const uint8_t* p) { return h2f_exact(ld_u16(p)); }

struct DqQ8_0 {
  static constexpr int BE = 32, BB = 34;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = xmul(static_cast<float>(static_cast<int8_t>(b[2 + e0 + i])), d);
  }
};

struct DqQ4_0 {
  static constexpr int BE = 32, BB = 18;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b);
    const int hi = e0 >= 16, j0 = e0 & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = hi ? b[2 + j0 + i] >> 4 : b[2 + j0 + i] & 15;
      o[i] = xmul(d, static_cast<float>(q - 8));
    }
  }
};

struct DqQ4_1 {
  static constexpr int BE = 32, BB = 20;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b), m = ld_half(b + 2);
    const int hi = e0 >= 16, j0 = e0 & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = hi ? b[4 + j0 + i] >> 4 : b[4 + j0 + i] & 15;
      o[i] = xadd(xmul(d, static_cast<float>(q)), m);
    }
  }
};

__device__ __forceinline__ uint32_t ld_u32b(const uint8_t* p) { return ld_u16(p) | ld_u16(p + 2) << 16; }

struct DqQ5_0 {
  static constexpr int BE = 32, BB = 22;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b);
    const uint32_t qh = ld_u32b(b + 2);
    const int hi = e0 >= 16, j0 = e0 & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nib = hi ? b[6 + j0 + i] >> 4 : b[6 + j0 + i] & 15;
      const int q = nib | static_cast<int>((qh >> (e0 + i)) & 1u) << 4;
      o[i] = xmul(d, static_cast<float>(q - 16));
    }
  }
};

struct DqQ5_1 {
  static constexpr int BE = 32, BB = 24;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b), m = ld_half(b + 2);
    const uint32_t qh = ld_u32b(b + 4);
    const int hi = e0 >= 16, j0 = e0 & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nib = hi ? b[8 + j0 + i] >> 4 : b[8 + j0 + i] & 15;
      const int q = nib | static_cast<int>((qh >> (e0 + i)) & 1u) << 4;
      o[i] = xadd(xmul(d, static_cast<float>(q)), m);
    }
  }
};

// Element e of a 256-block in the Q2_K / Q3_K / Q6_K "16-groups": n = e/128, s = (e%128)/32,
// l = e%32 (the 8 elements of one deq8 call share n, s and the 16-group e/16).
struct DqQ2_K {
  static constexpr int BE = 256, BB = 84;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b + 80), dmin = ld_half(b + 82);
    const int c = b[e0 >> 4];
    const float dl = xmul(d, static_cast<float>(c & 15)), ml = xmul(dmin, static_cast<float>(c >> 4));
    const int n = e0 >> 7, s = (e0 & 127) >> 5, l0 = e0 & 31;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (b[16 + 32 * n + l0 + i] >> (2 * s)) & 3;
      o[i] = xsub(xmul(dl, static_cast<float>(q)), ml);
    }
  }
};

struct DqQ3_K {
  static constexpr int BE = 256, BB = 110;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b + 108);
    const uint8_t* sb = b + 96;
    const int g = e0 >> 4;
    const int lo = g < 8 ? (sb[g] & 15) : (sb[g - 8] >> 4);
    const int hi = (sb[8 + (g & 3)] >> (2 * (g >> 2))) & 3;
    const int sc = static_cast<int>(static_cast<int8_t>(static_cast<uint8_t>(lo | hi << 4))) - 32;
    const float dl = xmul(d, static_cast<float>(sc));
    const int n = e0 >> 7, s = (e0 & 127) >> 5, l0 = e0 & 31;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int l = l0 + i;
      int q = (b[32 + 32 * n + l] >> (2 * s)) & 3;
      if (((b[l] >> (4 * n + s)) & 1) == 0) q -= 4;
      o[i] = xmul(dl, static_cast<float>(q));
    }
  }
};

// ggml's get_scale_min_k4 for sub-block k of the 12 scale bytes s.
__device__ __forceinline__ void scale_min_k4(const uint8_t* s, int k, int& sc, int& m) {
  if (k < 4) {
    sc = s[k] & 63;
    m = s[k + 4] & 63;
  } else {
    sc = (s[k + 4] & 15) | (s[k - 4] >> 6) << 4;
    m = (s[k + 4] >> 4) | (s[k] >> 6) << 4;
  }
}

struct DqQ4_K {
  static constexpr int BE = 256, BB = 144;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b), dmin = ld_half(b + 2);
    const int k = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    scale_min_k4(b + 4, k, sc, m);
    const float dl = xmul(d, static_cast<float>(sc)), ml = xmul(dmin, static_cast<float>(m));
    const int shift = 4 * (k & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = (b[16 + 32 * (k >> 1) + l0 + i] >> shift) & 15;
      o[i] = xsub(xmul(dl, static_cast<float>(q)), ml);
    }
  }
};

struct DqQ5_K {
  static constexpr int BE = 256, BB = 176;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b), dmin = ld_half(b + 2);
    const int k = e0 >> 5, l0 = e0 & 31;
    int sc, m;
    scale_min_k4(b + 4, k, sc, m);
    const float dl = xmul(d, static_cast<float>(sc)), ml = xmul(dmin, static_cast<float>(m));
    const int shift = 4 * (k & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int l = l0 + i;
      const int q = ((b[48 + 32 * (k >> 1) + l] >> shift) & 15) | ((b[16 + l] >> k) & 1) << 4;
      o[i] = xsub(xmul(dl, static_cast<float>(q)), ml);
    }
  }
};

struct DqQ6_K {
  static constexpr int BE = 256, BB = 210;
  __device__ static void deq8(const uint8_t* b, int e0, float* o) {
    const float d = ld_half(b + 208);
    const float dl = xmul(d, static_cast<float>(static_cast<int8_t>(b[192 + (e0 >> 4)])));
    const int n = e0 >> 7, t = (e0 & 127) >> 5, l0 = e0 & 31;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int l = l0 + i;
      const int low = b[64 * n + 32 * (t & 1) + l];
      const int low4 = t < 2 ? (low & 15) : (low >> 4);
      const int hi2 = (b[128 + 32 * n + l] >> (2 * t)) & 3;
      o[i] = xmul(dl, static_cast<float>((low4 | hi2 << 4) - 32));
    }
  }
};

}  // namespace kgguf
