//! FP8 (block-scaled E4M3) weights, issue 25 item 2(a): decode GEMVs, the dequantization the
//! prefill path runs before the bf16 wgmma GEMM, and the per-token-group activation quantization
//! of the W8A8 prefill GEMM (gemm_fp8_wgmma.cu).
//!
//!   gemv_fp8[_w8][_f32out]:  y[m, col0 + n] (rows of ldy) = Σ_kb Ws[n/128, kb] · (Σ_{k in block kb} x[m, k]·W[n, k]) (+ bias[n])
//!   dequant_fp8_bf16:        dst[row0 + n, k] = bf16(f32(W[n, k]) · Ws[n/128, k/128])   (PyTorch's (w.float() * s).bfloat16())
//!   quant_fp8_act:           per row m and 128-group g: s = max(absmax(x[m, 128g ..]), 1e-10) / 448,
//!                            xq[m, k] = e4m3(clamp(x[m, k] / s, ±448)), xs[g, m] = s   (vLLM's per_token_group_quant_fp8)
//!
//! Layout (gemm_fp8_common.cuh): W e4m3 [N, K] row-major, Ws f32 [ceil(N/128), ceil(K/128)] — the
//! Hugging Face fine-grained FP8 checkpoint's `weight` and `weight_scale_inv`, loaded unchanged.
//!
//! GEMV design. Weight-only: x stays bf16 (no activation quantization), so batch 1 reads one byte
//! per weight plus the scales. A CTA owns 16 rows of W (n0 .. n0+15; one 128-row scale block) and
//! all of K; its WARPS warps split K in 128-wide blocks (the scale blocks): warp w takes blocks w,
//! w + WARPS, … in increasing order. Per block a lane (g = lane/4, t = lane%4) loads 16 bytes of rows
//! g and g + 8 at k = 16t and at 64 + 16t (four 16-byte streaming loads: every warp load reads 64
//! contiguous bytes of each of 8 rows), the next block's four loads in flight while it computes.
//! The product runs on the tensor cores: mma.m16n8k16 bf16 with A = the 16 rows (e4m3 → bf16 is
//! exact: e4m3x4_bf16) and B = up to 8 tokens of x. The order of k inside an MMA is free (x is
//! permuted the same way), so MMA j of a 64-byte half takes each lane's bytes 4j .. 4j+3 (k =
//! 16t + 4j + {1, 3} in the slots of a0/a1, {0, 2} in those of a2/a3). The 8 MMAs of a block go
//! into a fresh fp32 accumulator, which is then scaled once per row on the CUDA cores:
//! acc += Ws[n/128, kb] · blk (one FFMA per output and block). The warps' partials meet in shared
//! memory and are added in warp order 0 .. WARPS-1, then the bias.
//!
//! Determinism / batch invariance: every output is the same function of (its W row, its x row,
//! K, WARPS) whatever M is — an MMA output depends only on its own row and token, each warp adds
//! its blocks in increasing k, the scale FFMA is per element, the warp order of the reduction is
//! fixed — so a row has the same bits in a step of 1 token and of 64. M > 8 runs passes of 8
//! tokens and re-reads W each pass (≈ ceil(M/8)× the bytes).
//!
//! Launch: gemv_fp8*: grid [ceil(N/16), 1, 1], block [32·WARPS, 1, 1] (128; 256 for _w8), shared 0
//! (static, 2 KB / 4 KB). Requirements: K % 128 == 0; x, W 16-byte aligned (rows then are);
//! any N >= 1, M >= 0; bias may be NULL. dequant_fp8_bf16: grid [ceil(N·K/2048)], block [256];
//! K % 8 == 0, dst 16-byte aligned. quant_fp8_act: grid [ceil(M·K/1024)], block [256]; K % 128 == 0.
//! Documentation: KERNELS.md, "FP8 weights".
#include "gemm_common.cuh"
#include "gemm_fp8_common.cuh"

namespace {

typedef __nv_bfloat16 bf16;
constexpr int kRows = 16;  // W rows per CTA (the MMA's m16)

__device__ __forceinline__ void mma0(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
#ifndef KERN_HOST_EMU
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
#else
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  kgemm::mma_16816(c, a0, a1, a2, a3, b0, b1);
#endif
}
__device__ __forceinline__ uint4 ldx16(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifndef KERN_HOST_EMU
  return __byte_perm(a, b, s);
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
#endif
}

// The 4 MMAs of one 16-byte chunk: wa / wb = 16 weight bytes of rows g / g + 8 (k = c + 0..15 for
// this lane), xa, xb = x[c .. c+7], x[c+8 .. c+15] of token g. MMA j: A from word j of each row,
// B from x words 2j, 2j+1 in the same permutation (odd k's in b0, even k's in b1).
template <bool FIRST>
__device__ __forceinline__ void chunk(float (&c)[4], const uint4& wa, const uint4& wb, const uint4& xa, const uint4& xb) {
  const uint32_t qa[4] = {wa.x, wa.y, wa.z, wa.w}, qb[4] = {wb.x, wb.y, wb.z, wb.w};
  const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a0, a1, a2, a3;
    kfp8::e4m3x4_bf16(qa[j], a0, a2);  // row g: (k1, k3) → a0, (k0, k2) → a2
    kfp8::e4m3x4_bf16(qb[j], a1, a3);  // row g + 8
    const uint32_t b0 = prmt(xw[2 * j], xw[2 * j + 1], 0x7632u);  // (x1, x3)
    const uint32_t b1 = prmt(xw[2 * j], xw[2 * j + 1], 0x5410u);  // (x0, x2)
    if (FIRST && j == 0) mma0(c, a0, a1, a2, a3, b0, b1);
    else kgemm::mma_16816(c, a0, a1, a2, a3, b0, b1);
  }
}

struct WBlock {  // one 128-wide block of rows g, g + 8 for this lane
  uint4 a0, a1, b0, b1;
};

template <int WARPS, typename OutT>
__device__ __forceinline__ void gemv_fp8_impl(const bf16* __restrict__ x, const uint8_t* __restrict__ W,
                                         const float* __restrict__ Ws, const bf16* __restrict__ bias,
                                         OutT* __restrict__ y, int M, int N, int K, int ldy, int col0) {
  __shared__ __align__(16) float red[WARPS * 4 * 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * kRows;
  const int nkb = K / kfp8::kBlock;                       // scale blocks per row (K % 128 == 0)
  const float* const srow = Ws + static_cast<long long>(n0 / kfp8::kBlock) * nkb;  // this CTA's scale row
  const bool okA = n0 + g < N, okB = n0 + g + 8 < N;
  const uint8_t* const rA = W + static_cast<long long>(okA ? n0 + g : 0) * K + 16 * t;
  const uint8_t* const rB = W + static_cast<long long>(okB ? n0 + g + 8 : 0) * K + 16 * t;
  auto load = [&](int kb, WBlock& w) {
    const long long o = static_cast<long long>(kb) * kfp8::kBlock;
    w.a0 = kgemm::ld_stream_16(rA + o, okA);
    w.a1 = kgemm::ld_stream_16(rA + o + 64, okA);
    w.b0 = kgemm::ld_stream_16(rB + o, okB);
    w.b1 = kgemm::ld_stream_16(rB + o + 64, okB);
  };

  for (int m0 = 0; m0 < M; m0 += 8) {
    WBlock nxt;
    if (warp < nkb) load(warp, nxt);  // weights before the wait: they are not the previous kernel's output
    if (m0 == 0) kgemm::pdl_wait();
    const int tok = m0 + g;
    const bf16* const xr = x + static_cast<long long>(tok < M ? tok : 0) * K + 16 * t;  // rows >= M: any valid row
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int kb = warp; kb < nkb; kb += WARPS) {
      const WBlock cur = nxt;
      if (kb + WARPS < nkb) load(kb + WARPS, nxt);
      const bf16* const xk = xr + static_cast<long long>(kb) * kfp8::kBlock;
      const float s = __ldg(srow + kb);
      float blk[4];
      chunk<true>(blk, cur.a0, cur.b0, ldx16(xk), ldx16(xk + 8));
      chunk<false>(blk, cur.a1, cur.b1, ldx16(xk + 64), ldx16(xk + 72));
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] = fmaf(s, blk[i], acc[i]);
    }
    if (m0 + 8 >= M) kgemm::pdl_launch_dependents();
    // acc[0], acc[1]: row g, tokens 2t, 2t+1; acc[2], acc[3]: row g + 8. Warps meet in order.
#pragma unroll
    for (int i = 0; i < 4; ++i) red[(warp * 4 + i) * 32 + lane] = acc[i];
    __syncthreads();
    if (threadIdx.x < 128) {
      const int idx = threadIdx.x, i = idx >> 5, ln = idx & 31;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) sum += red[(w * 4 + i) * 32 + ln];
      const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
      const int tk = m0 + 2 * (ln & 3) + (i & 1);
      if (row < N && tk < M) kgemm::store1(y, static_cast<long long>(tk) * ldy + col0 + row, sum + kgemm::bias_at(bias, row));
    }
    __syncthreads();
  }
}

// One thread per 8 consecutive elements of a row: one 8-byte load, one 16-byte store.
__device__ __forceinline__ void dequant_fp8(const uint8_t* __restrict__ W, const float* __restrict__ Ws, bf16* __restrict__ dst,
                                            int N, int K, int row0) {
  kgemm::pdl_wait();  // dst may still be read by the kernel before (a scratch matrix)
  const long long total = static_cast<long long>(N) * K / 8;
  const long long tid = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (tid < total) {
    const long long e = tid * 8, n = e / K;
    const int c = static_cast<int>(e - n * K);
    const int nkb = (K + kfp8::kBlock - 1) / kfp8::kBlock;
    const float s = Ws[(n / kfp8::kBlock) * nkb + c / kfp8::kBlock];
    const uint2 q = *reinterpret_cast<const uint2*>(W + e);
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t byte = ((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xffu;
      h[i] = kfp8::bf16_bits(kfp8::e4m3_f32(byte) * s);  // one f32 product, then one rounding
    }
    uint4 v;
    v.x = h[0] | h[1] << 16;
    v.y = h[2] | h[3] << 16;
    v.z = h[4] | h[5] << 16;
    v.w = h[6] | h[7] << 16;
    *reinterpret_cast<uint4*>(dst + (static_cast<long long>(row0) + n) * K + c) = v;
  }
  kgemm::pdl_launch_dependents();
}

// One warp per (row m, 128-group): 4 elements per lane, absmax by butterfly, IEEE division.
__device__ __forceinline__ void quant_act(const bf16* __restrict__ x, uint8_t* __restrict__ xq, float* __restrict__ xs, int M,
                                          int K) {
  kgemm::pdl_wait();
  const int groups = K / kfp8::kBlock;
  const long long gw = static_cast<long long>(blockIdx.x) * 8 + (threadIdx.x >> 5);  // (row, group) of this warp
  const int lane = threadIdx.x & 31;
  if (gw < static_cast<long long>(M) * groups) {  // warp-uniform
    const long long m = gw / groups;
    const int gi = static_cast<int>(gw - m * groups);
    const long long at = m * K + static_cast<long long>(gi) * kfp8::kBlock + 4 * lane;
    const uint2 v = *reinterpret_cast<const uint2*>(x + at);
    float f[4];
    f[0] = kfp8::bits_f32(v.x << 16);
    f[1] = kfp8::bits_f32(v.x & 0xffff0000u);
    f[2] = kfp8::bits_f32(v.y << 16);
    f[3] = kfp8::bits_f32(v.y & 0xffff0000u);
    float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = fmaxf(amax, 1e-10f) / 448.0f;
    const uint32_t lo = kfp8::e4m3x2_sat(f[0] / s, f[1] / s), hi = kfp8::e4m3x2_sat(f[2] / s, f[3] / s);
    *reinterpret_cast<uint32_t*>(xq + at) = lo | hi << 16;
    if (lane == 0) xs[static_cast<long long>(gi) * M + m] = s;
  }
  kgemm::pdl_launch_dependents();
}

}  // namespace

// ------------------------------------------------------------------ entries
// gemv_fp8[_f32out](x, W, Ws, bias, y, M, N, K, ldy, col0): 4 warps, grid [ceil(N/16)], block [128].
// gemv_fp8_w8[_f32out](same): 8 warps (for narrow N), grid [ceil(N/16)], block [256]; other bits
//   than the 4-warp family (one family per projection for every step size).
// dequant_fp8_bf16(W, Ws, dst, N, K, row0): grid [ceil(N*K/2048)], block [256].
// quant_fp8_act(x, xq, xs, M, K): grid [ceil(M*K/1024)], block [256].
#define KFP8_GEMV(NAME, WARPS, MINB, OUT)                                                                          \
  extern "C" __global__ void __launch_bounds__(32 * WARPS, MINB)                                                    \
      NAME(const __nv_bfloat16* x, const unsigned char* W, const float* Ws, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K, int ldy, int col0) {                                                                       \
    gemv_fp8_impl<WARPS, OUT>(x, W, Ws, bias, y, M, N, K, ldy, col0);                                                    \
  }
KFP8_GEMV(gemv_fp8, 4, 4, __nv_bfloat16)
KFP8_GEMV(gemv_fp8_f32out, 4, 4, float)
KFP8_GEMV(gemv_fp8_w8, 8, 2, __nv_bfloat16)
KFP8_GEMV(gemv_fp8_w8_f32out, 8, 2, float)

extern "C" __global__ void __launch_bounds__(256)
    dequant_fp8_bf16(const unsigned char* W, const float* Ws, __nv_bfloat16* dst, int N, int K, int row0) {
  dequant_fp8(W, Ws, dst, N, K, row0);
}

extern "C" __global__ void __launch_bounds__(256)
    quant_fp8_act(const __nv_bfloat16* x, unsigned char* xq, float* xs, int M, int K) {
  quant_act(x, xq, xs, M, K);
}
