//! Wide skinny GEMM for small batches: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) with M = 9..64
//! rows per pass, BIT-IDENTICAL to the 8-warp skinny family of gemm_skinny.cu (gemv_bf16,
//! gemm_bf16_m16/m32/m64): a row's bits do not depend on which of these entries computed it, so
//! a speculative verify step (M = k+1 rows per sequence) reproduces plain decoding exactly.
//!
//! Why. The 8-warp `gemm_bf16_m64` gives each CTA 16 W rows and has its 8 warps split K, so
//! every CTA streams all 64 rows of x for its 16 rows of W: x traffic from L2 is 4× the weight
//! bytes, and batch-64 projections ran at 0.5–1.1 TB/s. Here a thread-block cluster of 8 CTAs
//! owns a 64-row block of W (4 m16 tiles) and all the step's tokens: x is read once per 64 W rows
//! (x traffic = the weight bytes), and the CTA count is ceil(N/64)·8 (4B o_proj: 320 CTAs).
//!
//! Same reduction order as the 8-warp family. There, warp v (0..7) of a CTA adds the 64-wide
//! chunks v, v+8, v+16, … of K that start below K, in increasing k, each chunk as two 32-wide
//! halves, each half as two mma.m16n8k16 whose k-slots {2q,2q+1 | 2q+8,2q+9} hold physical k
//! {8q+4j+0,1 | 8q+4j+2,3} (lane q's 16 contiguous bytes); then the CTA adds the 8 warp partials
//! in order 0..7 from 0.0f, then the bias. Here CTA rank v of the cluster plays warp v: it adds
//! exactly the same chunks with exactly the same MMAs (the operands come from shared memory with
//! 16-byte loads of the same 8 contiguous k values, not ldmatrix), for the whole 64 × 8·NT tile
//! (its 4 warps split the tile, not K); then every output element is the sum of the 8 CTA
//! partials in rank order 0..7 from 0.0f (read through distributed shared memory), plus the bias.
//! An MMA's output element depends only on its own W row, x row and accumulator, so tiling the
//! outputs differently changes nothing.
//!
//! Pipeline: per chunk a CTA copies W[64 rows, 64 k] (8 KB) and x[8·NT tokens, 64 k] into a
//! stage with cp.async (16 B per copy, zero-fill beyond N, M and K), 3 stages; rows of 128 B
//! with the 16-byte chunk index XOR (row & 1)·4, so the 8 lanes of a 16-byte-load phase (rows
//! g = 2p, 2p+1, chunks 4h + q) hit all 32 banks. Warp w computes m16 tiles 2(w&1), 2(w&1)+1 and
//! n8 tiles (w>>1)·NT/2 … +NT/2-1. After the last chunk the partials go to shared memory (over
//! the stages), a cluster barrier publishes them, and the cluster's 8·128 threads split the
//! outputs: each adds the 8 partials of its elements in rank order, adds the bias and stores.
//! A second cluster barrier keeps the partials alive until every reader is done.
//!
//! Entries (block [128, 1, 1], grid [ceil(N/64)·8, 1, 1], clusters of 8 CTAs (__cluster_dims__),
//! static shared 30 / 36 / 48 KB, dynamic 0):
//!   gemm_bf16_w16 / _f32out   16 tokens per pass (NT = 2), for M 9..16
//!   gemm_bf16_w32 / _f32out   32 tokens per pass (NT = 4), for M 17..32
//!   gemm_bf16_w64 / _f32out   64 tokens per pass (NT = 8), for M 33..64
//! Any M (larger M loops over passes, re-reading W), any N, K % 8 == 0, x and W 16-byte aligned.
//! PDL: the first stages' weight copies are issued before griddepcontrol.wait, x after it;
//! launch_dependents after the last pass's main loop.
#include "gemm_cluster.cuh"

using namespace kgemm;

namespace {

constexpr int kWideRows = 64;   // W rows (outputs) per cluster
constexpr int kWideChunk = 64;  // K elements per chunk
constexpr int kWideSplit = 8;   // CTAs per cluster = warps of the 8-warp skinny family
constexpr int kWideThreads = 128;

__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
// Byte offset of the 16-byte piece `ch` (0..7) of row `row` in a stage tile of 128-byte rows.
__device__ __forceinline__ uint32_t wide_swz(int row, int ch) {
  return static_cast<uint32_t>(row * 128 + ((ch ^ ((row & 1) << 2)) << 4));
}

// 16-byte global -> shared copy of a weight piece with an L2 prefetch of the surrounding 256
// bytes (the cluster's neighbour CTA reads the next 128 bytes of the row); zero-fill when !valid.
__device__ __forceinline__ void cp_async_16_l2_256(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}

// STAGES: pipeline depth (3: 48 KB static shared at NT = 8; more need dynamic shared, see the
// entries). PF: weight copies with the L2::256B prefetch hint.
template <int NT, int STAGES, bool PF, typename OutT>
__device__ __forceinline__ void wide_gemm(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                          const bf16* __restrict__ bias, OutT* __restrict__ y, int M, int N,
                                          int K, unsigned char* smem) {
  constexpr int kWideStages = STAGES;
  constexpr int kTok = 8 * NT;                       // tokens per pass
  constexpr int kWBytes = kWideRows * kWideChunk * 2;  // 8 KB
  constexpr int kXBytes = kTok * kWideChunk * 2;
  constexpr int kStage = kWBytes + kXBytes;
  constexpr int kNH = NT / 2;                        // n8 tiles per warp
  constexpr int kTile = kWideRows * kTok;            // outputs per pass = floats of one partial
  static_assert(kTile * 4 <= kWideStages * kStage, "partials must fit over the stages");
  float* red = reinterpret_cast<float*>(smem);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rank = static_cast<int>(cluster_ctarank());  // == blockIdx.x % 8
  const int n0 = (blockIdx.x / kWideSplit) * kWideRows;
  const int kchunks = (K + kWideChunk - 1) / kWideChunk;
  const int cnt = rank < kchunks ? (kchunks - 1 - rank) / kWideSplit + 1 : 0;  // this CTA's chunks
  const uint32_t sbase = smem_u32(smem);
  const int mp = warp & 1, ng = warp >> 1;

  auto load_w = [&](int stage, int c) {
    const uint32_t dst = sbase + stage * kStage;
#pragma unroll
    for (int j = 0; j < kWBytes / 16 / kWideThreads; ++j) {
      const int e = j * kWideThreads + tid, row = e >> 3, ch = e & 7;
      const int k = c * kWideChunk + ch * 8;
      const bool ok = n0 + row < N && k < K;
      if constexpr (PF)
        cp_async_16_l2_256(dst + wide_swz(row, ch), ok ? W + (long long)(n0 + row) * K + k : W, ok);
      else
        cp_async_16(dst + wide_swz(row, ch), ok ? W + (long long)(n0 + row) * K + k : W, ok);
    }
  };
  auto load_x = [&](int stage, int c, int m0) {
    const uint32_t dst = sbase + stage * kStage + kWBytes;
#pragma unroll
    for (int j = 0; j < kXBytes / 16 / kWideThreads; ++j) {
      const int e = j * kWideThreads + tid, tok = e >> 3, ch = e & 7;
      const int k = c * kWideChunk + ch * 8;
      const bool ok = m0 + tok < M && k < K;
      cp_async_16(dst + wide_swz(tok, ch), ok ? x + (long long)(m0 + tok) * K + k : x, ok);
    }
  };

  bool waited = false;
  for (int m0 = 0; m0 < M; m0 += kTok) {
    float acc[2][kNH][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int t = 0; t < kNH; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.0f;

    // Prologue: the weights of the first stages may stream before the previous kernel is done.
#pragma unroll
    for (int s = 0; s < kWideStages - 1; ++s)
      if (s < cnt) load_w(s, rank + kWideSplit * s);
    if (!waited) {
      pdl_wait();
      waited = true;
    }
#pragma unroll
    for (int s = 0; s < kWideStages - 1; ++s) {
      if (s < cnt) load_x(s, rank + kWideSplit * s, m0);
      cp_async_commit();
    }

    for (int it = 0; it < cnt; ++it) {
      cp_async_wait<kWideStages - 2>();
      __syncthreads();  // stage it is in; every warp is done with stage it-1
      {
        const int nx = it + kWideStages - 1, st = nx % kWideStages;
        if (nx < cnt) {
          load_w(st, rank + kWideSplit * nx);
          load_x(st, rank + kWideSplit * nx, m0);
        }
        cp_async_commit();
      }
      const uint32_t sW = sbase + (it % kWideStages) * kStage, sX = sW + kWBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 wa[2], wb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int ra = 16 * (2 * mp + i) + g;
          wa[i] = lds128(sW + wide_swz(ra, 4 * h + q));
          wb[i] = lds128(sW + wide_swz(ra + 8, 4 * h + q));
        }
#pragma unroll
        for (int t = 0; t < kNH; ++t) {
          const uint4 xv = lds128(sX + wide_swz(8 * (ng * kNH + t) + g, 4 * h + q));
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            // Exactly skinny_mma's pair: k-slots of MMA j hold physical k 8q+4j+{0,1 | 2,3}.
            mma_16816(acc[i][t], wa[i].x, wb[i].x, wa[i].y, wb[i].y, xv.x, xv.y);
            mma_16816(acc[i][t], wa[i].z, wb[i].z, wa[i].w, wb[i].w, xv.z, xv.w);
          }
        }
      }
    }
    if (m0 + kTok >= M) pdl_launch_dependents();
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: the partials go over them

    // This CTA's partial; element (i, t, e) of lane l: row n0 + 16(2mp+i) + g + 8(e>>1),
    // token m0 + 8(ng·NT/2 + t) + 2q + (e&1).
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int t = 0; t < kNH; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[((((warp * 2 + i) * kNH + t) * 4 + e) << 5) + lane] = acc[i][t][e];
    cluster_sync_all();  // all 8 partials visible cluster-wide

    for (int idx = rank * kWideThreads + tid; idx < kTile; idx += kWideSplit * kWideThreads) {
      const int ln = idx & 31;
      int r = idx >> 5;
      const int e = r & 3;
      r >>= 2;
      const int t = r % kNH;
      r /= kNH;
      const int i = r & 1, w = r >> 1;
      const int row = n0 + 16 * (2 * (w & 1) + i) + (ln >> 2) + ((e & 2) ? 8 : 0);
      const int tok = m0 + 8 * ((w >> 1) * kNH + t) + 2 * (ln & 3) + (e & 1);
      if (row < N && tok < M) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < kWideSplit; ++c) s += ld_dsmem_f32(&red[idx], static_cast<uint32_t>(c));
        store1(y, (long long)tok * N + row, s + bias_at(bias, row));
      }
    }
    // No CTA overwrites its partials (next pass) or exits while another may still read them;
    // every remote read above fed a store issued before this point (relaxed arrive suffices).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
  }
}

}  // namespace

// 3 stages, static shared memory (30 / 36 / 48 KB): the manifest's entries.
#define KGEMM_WIDE_ENTRY(NAME, NT, OUT)                                                             \
  extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(128, 4)                   \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    __shared__ __align__(128) unsigned char smem[3 * (8192 + NT * 1024)];                           \
    wide_gemm<NT, 3, false, OUT>(x, W, bias, y, M, N, K, smem);                                     \
  }
// Experimental timing variants (gemm_verify.py): deeper pipelines in dynamic shared memory
// (STAGES · (8 + NT) KB; the launch must pass that size) and the L2::256B weight prefetch.
#define KGEMM_WIDE_DYN(NAME, NT, STAGES, PF, MINB)                                                  \
  extern "C" __global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(128, MINB)                \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, __nv_bfloat16* y, \
           int M, int N, int K) {                                                                   \
    extern __shared__ __align__(128) unsigned char dsmem[];                                         \
    wide_gemm<NT, STAGES, PF, __nv_bfloat16>(x, W, bias, y, M, N, K, dsmem);                        \
  }

KGEMM_WIDE_ENTRY(gemm_bf16_w16, 2, __nv_bfloat16)
KGEMM_WIDE_ENTRY(gemm_bf16_w16_f32out, 2, float)
KGEMM_WIDE_ENTRY(gemm_bf16_w32, 4, __nv_bfloat16)
KGEMM_WIDE_ENTRY(gemm_bf16_w32_f32out, 4, float)
KGEMM_WIDE_ENTRY(gemm_bf16_w64, 8, __nv_bfloat16)
KGEMM_WIDE_ENTRY(gemm_bf16_w64_f32out, 8, float)
KGEMM_WIDE_DYN(gemm_bf16_w64_pf, 8, 3, true, 4)    // 49152 bytes dynamic
KGEMM_WIDE_DYN(gemm_bf16_w64_s4, 8, 4, true, 3)    // 65536
KGEMM_WIDE_DYN(gemm_bf16_w64_s6, 8, 6, true, 2)    // 98304
KGEMM_WIDE_DYN(gemm_bf16_w32_s6, 4, 6, true, 3)    // 73728
