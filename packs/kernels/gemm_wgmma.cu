//! Hopper (sm_90a) GEMM for prefill-sized M: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]),
//! bf16 inputs, fp32 accumulation in registers, bf16 or fp32 output.
//!
//! Warpgroup MMA (wgmma.mma_async m64nBNk16, both operands from shared memory). The tiles are
//! brought in by cp.async (16-byte copies by every thread), not TMA: a TMA tensor map is a
//! host-built 128-byte struct, and kern's kernel parameters are pointers and scalars only.
//! Shared tiles use the 128-byte swizzle that wgmma's descriptors understand (16-byte chunk c of
//! row r stored at chunk c ^ (r & 7); each 8-row group is 1024 bytes; stage bases 1024-aligned).
//!
//! CTA = 2 warpgroups (256 threads); tile 128 (M) × BN (N) × 64 (K); warpgroup w computes rows
//! 64w..64w+63 × all BN columns (BN/2 fp32 accumulators per thread). Pipeline of STAGES shared
//! buffers; at step kt every thread waits for its copies of tile kt, fences them into the async
//! proxy, meets the others at a barrier, issues the copies of tile kt+STAGES-2 (that buffer's
//! last reader, wgmma kt-2, is known complete), then issues the 4 wgmmas of tile kt and waits
//! until at most one wgmma group (this one) is in flight. Tensor cores therefore always have
//! the next group queued while the previous finishes.
//!
//! Entries (grid = [ceil(M/128), ceil(N/BN), 1], block = [256, 1, 1]):
//!   gemm_bf16_wgmma, gemm_bf16_wgmma_f32out            BN = 256, 4 stages, shared 197632 B
//!   gemm_bf16_wgmma_n128, gemm_bf16_wgmma_n128_f32out  BN = 128, 6 stages, shared 197632 B
//!   gemm_bf16_wgmma_gv, gemm_bf16_wgmma_gv_f32out      BN = 128, 6 stages, shared 197632 B:
//!     the GEMV family's arithmetic (below, "GEMV order"), for `kern pack --batch-invariant`
//!
//! GEMV order (the `_gv` entries). gemm_skinny.cu's 8-warp family (and gemm_wide.cu, same bits)
//! gives output (m, n) these roundings: warp v = 0..7 sums the 64-wide K chunks c = v, v+8, ... in
//! increasing c, each chunk as four mma.sync k16 steps whose k sets are {32h + 8q + 4j + 0..3 :
//! q = 0..3} for (h, j) = (0,0), (0,1), (1,0), (1,1) (its lanes' 16-byte loads feed two MMAs each);
//! then s = 0, s += p_v for v = 0..7, and y = s + bias (bias 0 when absent). On the H200 one wgmma
//! k16 step rounds exactly as one mma.sync m16n8k16 step with the same 16 k values
//! (verify/k16_probe: 0 of 81,920 trials differ, alone and chained), so a wgmma kernel gets those
//! bits if it (a) visits the chunks in that order, v-major, into a fresh accumulator per v, added
//! into a second one at each v's end, and (b) stores each chunk's k values so that its four k16
//! steps (consecutive 32-byte pieces of a swizzled row) hold the GEMV's k sets: the tile is
//! loaded with 8-byte cp.async copies, true 8-byte unit 8h + 2q + j (h, j in 0..1, q in 0..3)
//! stored as unit 8h + 4j + q. A row's result then depends on nothing but the row — not on M,
//! not on the tile it falls in — and equals the decode GEMV's. BN = 128 only (two accumulator
//! sets of 64 registers).
//! Requires K % 8 == 0 and 16-byte aligned x, W; any M, N (tails are zero-filled / masked).
#include "gemm_common.cuh"
#include "gemm_wgmma_ops.cuh"
#include "wgmma_common.cuh"

using namespace kgemm;

namespace {

constexpr int BM = 128, BK = 64, THREADS = 256, GROUP_M = 16;

__device__ __forceinline__ void tile_coords(int& tm, int& tn) {
  const int tiles_m = gridDim.x, tiles_n = gridDim.y;
  const int lin = blockIdx.y * tiles_m + blockIdx.x;
  const int per_group = GROUP_M * tiles_n;
  const int first_m = (lin / per_group) * GROUP_M;
  const int gm = min(tiles_m - first_m, GROUP_M);
  const int in_group = lin % per_group;
  tm = first_m + in_group % gm;
  tn = in_group / gm;
}

template <int BN>
struct Cfg {
  static constexpr int STAGES = BN == 256 ? 4 : 6;
  static constexpr int A_BYTES = BM * BK * 2;
  static constexpr int B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024;  // + slack to align the base to 1024
  static constexpr int NACC = BN / 2;                       // fp32 accumulators per thread
  static constexpr int B_ROWS_PER_THREAD = BN / 32;
};
static_assert(Cfg<256>::SMEM == 197632 && Cfg<128>::SMEM == 197632, "GEMM.md documents 197632 bytes");

template <int BN>
__device__ __forceinline__ void wgmma_tile(float* acc, uint64_t da, uint64_t db) {
  if constexpr (BN == 256)
    wgmma_m64n256k16(acc, da, db);
  else
    wgmma_m64n128k16(acc, da, db);
}

// 8-byte cp.async (zero-filled when !valid); .ca: the 8-byte form has no .cg.
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_size) : "memory");
}

// GEMV order: the chunk at position `pos` of the visiting order (v-major: chunks v, v+8, ... for
// v = 0..7) of `ktiles` chunks, and whether it is the last of its v.
__device__ __forceinline__ int gv_chunk(int pos, int ktiles, bool& last) {
  const int full = ktiles >> 3, rem = ktiles & 7;  // v < rem has full + 1 chunks, the rest full
  int v, i, n;
  if (pos < rem * (full + 1)) {
    n = full + 1;
    v = pos / n;
    i = pos % n;
  } else {
    const int p2 = pos - rem * (full + 1);
    n = full;
    v = rem + p2 / n;
    i = p2 % n;
  }
  last = i == n - 1;
  return v + 8 * i;
}

template <int BN, bool PROXY_FENCE, typename OutT, bool GV = false>
__device__ __forceinline__ void gemm_wgmma(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                           const bf16* __restrict__ bias, OutT* __restrict__ y, int M, int N,
                                           int K) {
  static_assert(!GV || BN == 128, "GEMV order: BN = 128 (two accumulator sets)");
  using C = Cfg<BN>;
  constexpr int STAGES = C::STAGES;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
  int tm, tn;
  tile_coords(tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;

  // Loader: chunk lc of rows lr + 32i (A: 4 rows, B: BN/32 rows) per thread and stage.
  const int lc = tid & 7, lr = tid >> 3;
  const bf16* a_base = x + (long long)(m0 + lr) * K + lc * 8;
  const bf16* b_base = W + (long long)(n0 + lr) * K + lc * 8;
  const long long row_step = 32LL * K;
  const int a_rows = M - (m0 + lr), b_rows = N - (n0 + lr);
  const uint32_t dst0 = swz(lr, lc);

  const int ktiles = (K + BK - 1) / BK;
  // GV: this thread's 16-byte chunk lc (true units 2lc, 2lc + 1 = 8h + 2q + j) goes to stored
  // units 8h + q and 8h + 4 + q; rows lr + 32i keep lr & 7, so one pair of offsets serves all.
  const int gv_h = lc >> 2, gv_q = lc & 3;
  const int gv_u0 = 8 * gv_h + gv_q, gv_u1 = gv_u0 + 4;
  const uint32_t gv_d0 = swz(lr, gv_u0 >> 1) + (gv_u0 & 1) * 8, gv_d1 = swz(lr, gv_u1 >> 1) + (gv_u1 & 1) * 8;
  auto load_tile = [&](int kt, int s) {
    const int k0 = kt * BK;
    const bool k_ok = k0 + lc * 8 < K;
    const uint32_t sb0 = sbase + s * C::STAGE_BYTES;
    if constexpr (GV) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = k_ok && 32 * i < a_rows;
        const bf16* src = ok ? a_base + i * row_step + k0 : x;
        cp_async_8(sb0 + gv_d0 + i * 32 * 128, src, ok);
        cp_async_8(sb0 + gv_d1 + i * 32 * 128, ok ? src + 4 : x, ok);
      }
#pragma unroll
      for (int i = 0; i < C::B_ROWS_PER_THREAD; ++i) {
        const bool ok = k_ok && 32 * i < b_rows;
        const bf16* src = ok ? b_base + i * row_step + k0 : W;
        cp_async_8(sb0 + C::A_BYTES + gv_d0 + i * 32 * 128, src, ok);
        cp_async_8(sb0 + C::A_BYTES + gv_d1 + i * 32 * 128, ok ? src + 4 : W, ok);
      }
    } else {
      const uint32_t da = sb0 + dst0;
      const uint32_t db = da + C::A_BYTES;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = k_ok && 32 * i < a_rows;
        cp_async_16(da + i * 32 * 128, ok ? a_base + i * row_step + k0 : x, ok);
      }
#pragma unroll
      for (int i = 0; i < C::B_ROWS_PER_THREAD; ++i) {
        const bool ok = k_ok && 32 * i < b_rows;
        cp_async_16(db + i * 32 * 128, ok ? b_base + i * row_step + k0 : W, ok);
      }
    }
  };
  // The chunk loaded at visiting position pos (GV: v-major order; else pos itself).
  auto chunk_at = [&](int pos) {
    bool last;
    return GV ? gv_chunk(pos, ktiles, last) : pos;
  };

  float acc[C::NACC];
  float sum[GV ? C::NACC : 1];  // GV: s = 0, s += p_v at the end of each v
#pragma unroll
  for (int i = 0; i < C::NACC; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < (GV ? C::NACC : 1); ++i) sum[i] = 0.0f;

  pdl_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < ktiles) load_tile(chunk_at(s), s);
    cp_async_commit();
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 3>();            // this thread's copies of tile kt have landed
    if (PROXY_FENCE) fence_proxy_async();  // ... and are visible to the async proxy (wgmma)
    __syncthreads();              // everyone's copies of tile kt; wgmma kt-2 done in both warpgroups
    {
      const int nk = kt + STAGES - 2;
      if (nk < ktiles) load_tile(chunk_at(nk), nk % STAGES);
      cp_async_commit();
    }
    const uint32_t sa = sbase + (kt % STAGES) * C::STAGE_BYTES + wg * 64 * 128;
    const uint32_t sb = sbase + (kt % STAGES) * C::STAGE_BYTES + C::A_BYTES;
    fence_acc<C::NACC>(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk)  // k16 step = 32 bytes along the swizzled row
      wgmma_tile<BN>(acc, sw128_desc(sa + kk * 32), sw128_desc(sb + kk * 32));
    wgmma_commit();
    bool v_end = false;
    if constexpr (GV) gv_chunk(kt, ktiles, v_end);
    if (v_end) {  // GV: p_v complete: s += p_v, and a fresh accumulator for v + 1
      wgmma_wait<0>();
      fence_acc<C::NACC>(acc);
#pragma unroll
      for (int i = 0; i < (GV ? C::NACC : 1); ++i) {
        sum[i] += acc[i];
        acc[i] = 0.0f;
      }
    } else {
      wgmma_wait<1>();
    }
    fence_acc<C::NACC>(acc);
  }
  wgmma_wait<0>();
  fence_acc<C::NACC>(acc);
  cp_async_wait<0>();
  pdl_launch_dependents();
  if constexpr (GV) {
    // Fewer than 8 chunks: the GEMV's warps without a chunk add +0 (which turns a -0 into +0).
    if (ktiles < 8) {
#pragma unroll
      for (int i = 0; i < C::NACC; ++i) sum[i] += 0.0f;
    }
#pragma unroll
    for (int i = 0; i < C::NACC; ++i) acc[i] = sum[i];
  }

  // Accumulator layout (per warpgroup, m64nBN): warp wq owns rows 16wq..16wq+15; acc[4j+{0,1}]
  // is (row g, cols 8j+2q+{0,1}), acc[4j+{2,3}] is (row g+8, same cols).
  const int g = lane >> 2, q = lane & 3;
  const int row0 = m0 + wg * 64 + wq * 16 + g;
  const bool vec = (N & 1) == 0;
  const bool r0ok = row0 < M, r1ok = row0 + 8 < M;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + j * 8 + 2 * q;
    const bool ok0 = col < N, ok1 = col + 1 < N;
    const float b0 = ok0 ? bias_at(bias, col) : 0.0f, b1 = ok1 ? bias_at(bias, col + 1) : 0.0f;
    if (r0ok) store2(y, (long long)row0 * N + col, acc[4 * j] + b0, acc[4 * j + 1] + b1, ok0, ok1, vec);
    if (r1ok)
      store2(y, (long long)(row0 + 8) * N + col, acc[4 * j + 2] + b0, acc[4 * j + 3] + b1, ok0, ok1, vec);
  }
}

}  // namespace

// cp.async writes shared memory through the generic proxy and wgmma reads it through the async
// proxy; the PTX memory model asks for fence.proxy.async between the two. CUTLASS's cp.async
// + GMMA mainloops (sm90_mma_multistage_gmma_ss*) omit it. The fence lowers to
// MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S once per k-tile; `_nofence` is the experimental variant
// without it, kept so that a timing run can tell whether the membar costs anything.
#define KGEMM_WGMMA_ENTRY(NAME, BN, FENCE, OUT)                                                    \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                        \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                         \
    gemm_wgmma<BN, FENCE, OUT>(x, W, bias, y, M, N, K);                                                   \
  }

KGEMM_WGMMA_ENTRY(gemm_bf16_wgmma, 256, true, __nv_bfloat16)
KGEMM_WGMMA_ENTRY(gemm_bf16_wgmma_f32out, 256, true, float)
KGEMM_WGMMA_ENTRY(gemm_bf16_wgmma_n128, 128, true, __nv_bfloat16)
KGEMM_WGMMA_ENTRY(gemm_bf16_wgmma_n128_f32out, 128, true, float)
KGEMM_WGMMA_ENTRY(gemm_bf16_wgmma_nofence, 256, false, __nv_bfloat16)

// GEMV order (header): a row's bits equal the decode GEMV family's at any M.
#define KGEMM_WGMMA_GV_ENTRY(NAME, OUT)                                                           \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                        \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                         \
    gemm_wgmma<128, true, OUT, true>(x, W, bias, y, M, N, K);                                      \
  }

KGEMM_WGMMA_GV_ENTRY(gemm_bf16_wgmma_gv, __nv_bfloat16)
KGEMM_WGMMA_GV_ENTRY(gemm_bf16_wgmma_gv_f32out, float)
