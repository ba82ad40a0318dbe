//! Skinny GEMM for decode: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) with few rows of x
//! (M = 1..64). Bandwidth-bound: every byte of W is read exactly once per pass.
//!
//! Design (swap-AB on tensor cores). A CTA owns 16 rows of W (16 outputs) and all of K; its
//! 8 warps split K (warp w takes the 64-wide K chunks w, w+8, w+16, ..., so the CTA streams
//! 16 rows × 1 KB contiguous at a time). Each warp multiplies its 16 W rows (the m16 side of
//! mma.m16n8k16) by 8 tokens of x (the n8 side), MT such n-tiles per pass. W is loaded
//! straight from global memory into the A-fragment registers with 16-byte streaming loads:
//! the reduction over K does not care about the order of k, so each lane's 16 contiguous
//! bytes (8 k values) are used as its k-slots of two consecutive MMAs, and x is loaded with
//! the same permutation into the B fragments. The 8 warps' partial sums meet in shared
//! memory at the end. No W staging in shared memory, no split-K workspace.
//!
//! Entries (M rows per pass; larger M loops over passes and re-reads W, correct but slow):
//!   gemv_bf16 / gemv_bf16_f32out            M ≤ 8 per pass   (MT = 1)
//!   gemm_bf16_m16 / gemm_bf16_m16_f32out    M ≤ 16 per pass  (MT = 2)
//!   gemm_bf16_m32 / gemm_bf16_m32_f32out    M ≤ 32 per pass  (MT = 4)
//!   gemm_bf16_m64 / gemm_bf16_m64_f32out    M ≤ 64 per pass  (MT = 8)
//!   gemv_bf16_pf                            as gemv_bf16, plus an L2 bulk prefetch (experimental)
//! Launch: grid = [ceil(N/16), 1, 1], block = [256, 1, 1], dynamic shared = 0.
//! Requires K % 8 == 0 and 16-byte aligned x and W (16-byte vector loads); any M, N.
#include "gemm_common.cuh"

using namespace kgemm;

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 16;    // W rows (outputs) per CTA
constexpr int kChunk = 64;   // K elements per warp per sub-step
constexpr int kStride = kWarps * kChunk;  // K advance of one sub-step of the whole CTA

template <int MT, int U, bool PREFETCH, typename OutT>
__device__ __forceinline__ void skinny_gemm(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                            const bf16* __restrict__ bias, OutT* __restrict__ y, int M,
                                            int N, int K) {
  __shared__ float red[kWarps * MT * 4 * 32];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int n0 = blockIdx.x * kRows;
  const bool vA = n0 + g < N, vB = n0 + g + 8 < N;
  // Rows beyond N are never loaded; their pointer is clamped to row 0 so it stays in bounds.
  const bf16* wA = W + (long long)(vA ? n0 + g : 0) * K + q * 8;
  const bf16* wB = W + (long long)(vB ? n0 + g + 8 : 0) * K + q * 8;

  if (PREFETCH && threadIdx.x < kRows && n0 + threadIdx.x < N)
    prefetch_l2_bulk(W + (long long)(n0 + threadIdx.x) * K, static_cast<uint32_t>(K) * 2u);
  pdl_wait();
  for (int m0 = 0; m0 < M; m0 += 8 * MT) {
    float acc[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

    for (int kb = warp * kChunk; kb < K; kb += kStride * U) {
      // Phase 1: all weight loads of U sub-steps in flight at once (4·U loads of 16 B per lane).
      uint4 wa[U][2], wb[U][2];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int k = kb + u * kStride + h * 32;  // this lane's 8 values start at k + 8q
          const bool kv = k + q * 8 < K;            // K % 8 == 0: a 16-byte chunk is all in or all out
          wa[u][h] = ld_stream_16(wA + k, kv && vA);
          wb[u][h] = ld_stream_16(wB + k, kv && vB);
        }
      // Phase 2: per sub-step and 32-wide half, the activations (L1/L2 hits after the first
      // CTA) and the MMAs. Loading x per half keeps MT·4 registers of x live, not MT·8.
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int k = kb + u * kStride + h * 32 + q * 8;
          uint4 xv[MT];
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            const int tok = m0 + 8 * t + g;
            xv[t] = ld_cached_16(x + (long long)tok * K + k, tok < M && k < K);
          }
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            // k-slots {2q,2q+1 | 2q+8,2q+9} of MMA j hold physical k {8q+4j+0,1 | 8q+4j+2,3}.
            mma_16816(acc[t], wa[u][h].x, wb[u][h].x, wa[u][h].y, wb[u][h].y, xv[t].x, xv[t].y);
            mma_16816(acc[t], wa[u][h].z, wb[u][h].z, wa[u][h].w, wb[u][h].w, xv[t].z, xv[t].w);
          }
        }
    }
    if (m0 + 8 * MT >= M) pdl_launch_dependents();

    // Cross-warp reduction. acc[t][i]: row n0 + g + 8·(i>>1), token m0 + 8t + 2q + (i&1).
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * MT * 4 + t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < MT * 4 * 32; idx += kThreads) {
      const int ti = idx >> 5, ln = idx & 31;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[(w * MT * 4 + ti) * 32 + ln];
      const int t = ti >> 2, i = ti & 3;
      const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
      const int tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1);
      if (row < N && tok < M) store1(y, (long long)tok * N + row, s + bias_at(bias, row));
    }
    __syncthreads();  // `red` is reused by the next pass
  }
}

}  // namespace

// MINB (CTAs per SM the register budget must allow) also tells ptxas how many registers it
// may use: without it ptxas schedules for ~64 registers and issues the weight loads one pair at
// a time (seen in SASS), which starves the memory pipe.
// PF: first stream the CTA's 16 weight rows into L2 with bulk prefetches (issued before
// griddepcontrol.wait, so under PDL they overlap the previous kernel's tail).
#define KGEMM_SKINNY_ENTRY(NAME, MT, U, MINB, PF, OUT)                                              \
  extern "C" __global__ void __launch_bounds__(kThreads, MINB)                                     \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<MT, U, PF, OUT>(x, W, bias, y, M, N, K);                                                \
  }

KGEMM_SKINNY_ENTRY(gemv_bf16, 1, 4, 2, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemv_bf16_f32out, 1, 4, 2, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m16, 2, 4, 2, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m16_f32out, 2, 4, 2, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m32, 4, 4, 1, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m32_f32out, 4, 4, 1, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m64, 8, 2, 1, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m64_f32out, 8, 2, 1, false, float)
KGEMM_SKINNY_ENTRY(gemv_bf16_pf, 1, 4, 2, true, __nv_bfloat16)  // experimental, see GEMM.md
