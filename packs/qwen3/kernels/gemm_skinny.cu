//! Skinny GEMM for decode: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) with few rows of x
//! (M = 1..64). Bandwidth-bound: every byte of W is read exactly once per pass.
//!
//! Design (swap-AB on tensor cores). A 16-row block of W (16 outputs) is owned by one CTA, or
//! by a thread-block cluster of C CTAs that split its K. The P = WARPS·C warps of the block
//! ("virtual warps" v = rank·WARPS + warp) split K in 64-wide chunks: v takes chunks v, v+P,
//! v+2P, ... so the block streams its 16 rows contiguously. Each warp multiplies its 16 W rows
//! (the m16 side of mma.m16n8k16) by 8 tokens of x (the n8 side), MT such n-tiles per pass.
//! W is loaded straight from global memory into the A-fragment registers with 16-byte
//! streaming loads: the reduction over K does not care about the order of k, so each lane's 16
//! contiguous bytes (8 k values) are used as its k-slots of two consecutive MMAs, and x is
//! loaded with the same permutation into the B fragments. The warps' partial sums meet in
//! shared memory (sum over warps 0..WARPS-1 in order); with C > 1 the cluster's CTAs then add
//! the C per-CTA partials in rank order 0..C-1 through distributed shared memory (mapa +
//! ld.shared::cluster between two cluster barriers). No split-K workspace, no atomics.
//!
//! Determinism across entries: the reduction order of one output element depends only on
//! (WARPS, C, K) — never on MT, U or M (each warp adds exactly its in-range chunks, in
//! increasing k, whatever U is; each MMA output element depends only on its own row, token
//! and accumulator). So for one (N, K) the manifest must use ONE (WARPS, C) for
//! all M ranges; then speculative verification (M = k+1) reproduces plain decoding bit for bit.
//!
//! Entries (M rows per pass; larger M loops over passes and re-reads W, correct but slow):
//!   cluster family, 4 warps, block [128, 1, 1], grid [ceil(N/16)·C, 1, 1], C ∈ {1, 2, 4}:
//!   gemv_bf16_cC / gemv_bf16_cC_f32out            M ≤ 8 per pass   (MT = 1)
//!   gemm_bf16_m16_cC / gemm_bf16_m16_cC_f32out    M ≤ 16 per pass  (MT = 2)
//!   gemm_bf16_m32_cC / gemm_bf16_m32_cC_f32out    M ≤ 32 per pass  (MT = 4)
//!   gemm_bf16_m64_cC / gemm_bf16_m64_cC_f32out    M ≤ 64 per pass  (MT = 8)
//!   original family, 8 warps, one CTA per block, block [256, 1, 1], grid [ceil(N/16), 1, 1]:
//!   gemv_bf16, gemm_bf16_m16, gemm_bf16_m32, gemm_bf16_m64 (+ _f32out), gemv_bf16_pf
//!   (as gemv_bf16, plus an L2 bulk prefetch; experimental). Kept for A/B timing.
//! Dynamic shared = 0. Requires K % 8 == 0 and 16-byte aligned x and W; any M, N.
#include "gemm_common.cuh"

#include <type_traits>

using namespace kgemm;

namespace {

constexpr int kRows = 16;    // W rows (outputs) per block
constexpr int kChunk = 64;   // K elements per warp per sub-step

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Full cluster barrier; release/acquire orders the shared-memory writes before it (own CTA's
// and the other CTAs') with the reads after it.
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Read one float of CTA `rank`'s shared memory at the address `p` has in this CTA.
__device__ __forceinline__ float ld_dsmem_f32(const float* p, uint32_t rank) {
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(p)), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// f(std::integral_constant<int, I>) for I = B .. E-1, in order (compile-time loop index).
template <int B, int E, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (B < E) {
    f(std::integral_constant<int, B>{});
    static_for<B + 1, E>(f);
  }
}

// As ld_stream_16 / ld_cached_16 (gemm_common.cuh), at a compile-time byte offset from `p`:
// the offset goes into the instruction's immediate, so all loads of a sub-step group share
// one address register per row. With a register pair per load (what the plain helpers gave)
// the 16 weight + 8 activation loads of a gemv group need ~48 address registers and, at the
// 128-register cap, ptxas issued 5 of the weight loads only after the first MMA — i.e. one
// DRAM latency later.
template <int OFF>
__device__ __forceinline__ uint4 ld_stream_16_at(const void* p, bool pred) {
  uint4 v;
  asm("{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4+%6];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)), "n"(OFF));
  return v;
}
template <int OFF>
__device__ __forceinline__ uint4 ld_cached_16_at(const void* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4+%6];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)), "n"(OFF)
      : "memory");
  return v;
}

// Phase 1 of UU sub-steps of one warp at k = kb (pa = wA + kb, pb = wB + kb, krem = K - kb - 8q):
// all weight loads in flight at once (4·UU loads of 16 B per lane). wA / wB already include
// this lane's + 8q; the offsets (u·kStride + 32h)·2 bytes are compile-time constants, so they
// become the loads' immediates (one address register per row).
template <int UU, int kStride>
__device__ __forceinline__ void skinny_load(uint4 (&wa)[UU][2], uint4 (&wb)[UU][2], const bf16* pa,
                                            const bf16* pb, int krem, bool vA, bool vB) {
  static_for<0, 2 * UU>([&](auto i) {
    constexpr int u = decltype(i)::value / 2, h = decltype(i)::value % 2, off = u * kStride + h * 32;
    const bool kv = off < krem;  // K % 8 == 0: a 16-byte chunk is all in or all out
    wa[u][h] = ld_stream_16_at<off * 2>(pa, kv && vA);
    wb[u][h] = ld_stream_16_at<off * 2>(pb, kv && vB);
  });
}

// Phase 2: per sub-step and 32-wide half, the activations (L1/L2 hits after the first CTA)
// and the MMAs. Loading x per half keeps MT·4 registers of x live, not MT·8.
template <int MT, int UU, int kStride>
__device__ __forceinline__ void skinny_mma(float (&acc)[MT][4], const uint4 (&wa)[UU][2], const uint4 (&wb)[UU][2],
                                           const bf16* __restrict__ x, int kb, int m0, int M, int K, int g, int q) {
  const int krem = K - kb - q * 8;
  static_for<0, UU>([&](auto ui) {
    constexpr int u = decltype(ui)::value;
    static_for<0, 2>([&](auto hi) {
      constexpr int h = decltype(hi)::value, off = u * kStride + h * 32;
      const bool kv = off < krem;
      uint4 xv[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int tok = m0 + 8 * t + g;
        xv[t] = ld_cached_16_at<off * 2>(x + (long long)tok * K + kb + q * 8, tok < M && kv);
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        // k-slots {2q,2q+1 | 2q+8,2q+9} of MMA j hold physical k {8q+4j+0,1 | 8q+4j+2,3}.
        mma_16816(acc[t], wa[u][h].x, wb[u][h].x, wa[u][h].y, wb[u][h].y, xv[t].x, xv[t].y);
        mma_16816(acc[t], wa[u][h].z, wb[u][h].z, wa[u][h].w, wb[u][h].w, xv[t].z, xv[t].w);
      }
    });
  });
}

// UU sub-steps of one warp starting at k = kb: 16 rows × 64 k each, W straight into the A
// fragments, x (MT n-tiles of 8 tokens from m0) into the B fragments.
template <int MT, int UU, int kStride>
__device__ __forceinline__ void skinny_steps(float (&acc)[MT][4], const bf16* __restrict__ x,
                                             const bf16* __restrict__ wA, const bf16* __restrict__ wB,
                                             bool vA, bool vB, int kb, int m0, int M, int K, int g, int q) {
  uint4 wa[UU][2], wb[UU][2];
  skinny_load<UU, kStride>(wa, wb, wA + kb, wB + kb, K - kb - q * 8, vA, vB);
  skinny_mma<MT, UU, kStride>(acc, wa, wb, x, kb, m0, M, K, g, q);
}

// WARPS: warps per CTA. C: CTAs per 16-row block (cluster size; the kernel entry must carry
// __cluster_dims__(C, 1, 1) when C > 1). MT: 8-token n-tiles per pass. U: sub-steps in flight.
template <int WARPS, int C, int MT, int U, bool PREFETCH, typename OutT>
__device__ __forceinline__ void skinny_gemm(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                            const bf16* __restrict__ bias, OutT* __restrict__ y, int M,
                                            int N, int K) {
  constexpr int kThreads = WARPS * 32;
  constexpr int kStride = WARPS * C * kChunk;  // K advance of one sub-step of the whole block
  constexpr int kTile = MT * 4 * 32;           // accumulators of one warp (= of one CTA after reduction)
  __shared__ float red[WARPS * kTile];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rank = C > 1 ? static_cast<int>(cluster_ctarank()) : 0;  // == blockIdx.x % C
  const int n0 = (blockIdx.x / C) * kRows;
  const int kfirst = (rank * WARPS + warp) * kChunk;  // this (virtual) warp's first chunk
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

    // Only sub-steps that start below K are executed, whatever U is: full groups of U, then
    // the remainder as a group of 2 and/or 1. So every entry adds exactly the same sequence
    // of MMAs (same rounding) — U may differ between entries of a family.
    int kb = kfirst;
    for (; kb + (U - 1) * kStride < K; kb += U * kStride)
      skinny_steps<MT, U, kStride>(acc, x, wA, wB, vA, vB, kb, m0, M, K, g, q);
    if (U > 2 && kb + kStride < K) {
      skinny_steps<MT, 2, kStride>(acc, x, wA, wB, vA, vB, kb, m0, M, K, g, q);
      kb += 2 * kStride;
    }
    if (U > 1 && kb < K) skinny_steps<MT, 1, kStride>(acc, x, wA, wB, vA, vB, kb, m0, M, K, g, q);
    if (m0 + 8 * MT >= M) pdl_launch_dependents();

    // Cross-warp reduction. acc[t][i]: row n0 + g + 8·(i>>1), token m0 + 8t + 2q + (i&1).
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * MT * 4 + t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    if constexpr (C == 1) {
      for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
        const int ti = idx >> 5, ln = idx & 31;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += red[w * kTile + idx];
        const int t = ti >> 2, i = ti & 3;
        const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
        const int tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1);
        if (row < N && tok < M) store1(y, (long long)tok * N + row, s + bias_at(bias, row));
      }
      __syncthreads();  // `red` is reused by the next pass
    } else {
      // Per-CTA partial into red[0 .. kTile) (in place: element idx of warp 0's slot is read
      // and written only by the thread that owns idx).
      for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += red[w * kTile + idx];
        red[idx] = s;
      }
      cluster_sync_all();  // every CTA's partial is visible cluster-wide
      // The cluster's C·kThreads threads share the outputs; each adds the C partials in rank
      // order 0..C-1 (the same order whichever CTA does it).
      for (int idx = rank * kThreads + threadIdx.x; idx < kTile; idx += C * kThreads) {
        const int ti = idx >> 5, ln = idx & 31;
        const int t = ti >> 2, i = ti & 3;
        const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
        const int tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1);
        if (row < N && tok < M) {
          float s = 0.0f;
#pragma unroll
          for (int r = 0; r < C; ++r) s += ld_dsmem_f32(&red[idx], static_cast<uint32_t>(r));
          store1(y, (long long)tok * N + row, s + bias_at(bias, row));
        }
      }
      // No CTA reuses `red` or exits while another may still read it. Every remote read above
      // feeds a store issued before this point, so it has returned: a relaxed arrive suffices
      // (a release would make every thread wait for its y stores first); the wait acquires.
      asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
    }
  }
}

}  // namespace

// MINB (CTAs per SM the register budget must allow) also tells ptxas how many registers it
// may use: without it ptxas schedules for ~64 registers and issues the weight loads one pair at
// a time (seen in SASS), which starves the memory pipe.
// PF: first stream the CTA's 16 weight rows into L2 with bulk prefetches (issued before
// griddepcontrol.wait, so under PDL they overlap the previous kernel's tail).
#define KGEMM_SKINNY_ENTRY(NAME, MT, U, MINB, PF, OUT)                                              \
  extern "C" __global__ void __launch_bounds__(256, MINB)                                          \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<8, 1, MT, U, PF, OUT>(x, W, bias, y, M, N, K);                                      \
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

// Cluster family: 4 warps (128 threads) per CTA, C CTAs per 16-row block in one cluster.
// C = 1 has no cluster attribute. MINB 4 (MT ≤ 2) caps registers at 128, as the 8-warp
// entries' MINB 2; MINB 2 for MT 4 / 8 (≤ 255 registers). MT 2 with C > 1 gets MINB 3
// (≤ 168 registers): at 128 the cluster epilogue spilled 4 bytes. U = 4, or 2 for MT 8 (registers);
// the K loop's tail handling keeps the MMA sequence independent of U.
#define KGEMM_SKINNY_C1(NAME, MT, U, MINB, OUT)                                                    \
  extern "C" __global__ void __launch_bounds__(128, MINB)                                          \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<4, 1, MT, U, false, OUT>(x, W, bias, y, M, N, K);                                   \
  }
#define KGEMM_SKINNY_CL(NAME, C, MT, U, MINB, OUT)                                                 \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(128, (MT == 2 ? 3 : MINB)) \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<4, C, MT, U, false, OUT>(x, W, bias, y, M, N, K);                                   \
  }
#define KGEMM_SKINNY_FAMILY(CL, SFX, ...)                                                          \
  CL(gemv_bf16_##SFX, __VA_ARGS__ 1, 4, 4, __nv_bfloat16)                                          \
  CL(gemv_bf16_##SFX##_f32out, __VA_ARGS__ 1, 4, 4, float)                                         \
  CL(gemm_bf16_m16_##SFX, __VA_ARGS__ 2, 4, 4, __nv_bfloat16)                                      \
  CL(gemm_bf16_m16_##SFX##_f32out, __VA_ARGS__ 2, 4, 4, float)                                     \
  CL(gemm_bf16_m32_##SFX, __VA_ARGS__ 4, 4, 2, __nv_bfloat16)                                      \
  CL(gemm_bf16_m32_##SFX##_f32out, __VA_ARGS__ 4, 4, 2, float)                                     \
  CL(gemm_bf16_m64_##SFX, __VA_ARGS__ 8, 2, 2, __nv_bfloat16)                                      \
  CL(gemm_bf16_m64_##SFX##_f32out, __VA_ARGS__ 8, 2, 2, float)

KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_C1, c1, )
KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_CL, c2, 2, )
KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_CL, c4, 4, )
