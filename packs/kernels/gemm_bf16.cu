//! General tensor-core GEMM (mma.sync, works on any sm_80+ part; built here for sm_90a):
//! y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]), bf16 inputs, fp32 accumulation, bf16 or fp32 out.
//!
//! CTA tile 128 (M) × 128 (N) × 64 (K), 8 warps as 2 (M) × 4 (N), warp tile 64 × 32.
//! 3-stage cp.async pipeline (16-byte copies, zero-filled outside M/N/K), shared tiles stored
//! as 128-byte rows with the 16-byte chunks XOR-swizzled by (row & 7) so that both the cp.async
//! writes and the ldmatrix reads are bank-conflict free. 96 KB of shared memory and ≤ 128
//! registers per thread: two CTAs per SM.
//!
//! CTAs are numbered M-fastest inside groups of 16 M-tiles, so a wave of CTAs shares a band of
//! x (L2-resident) and reads each weight tile from DRAM about once per 2048 rows of x.
//!
//! Entries: gemm_bf16 (bf16 out), gemm_bf16_f32out (fp32 out).
//! Launch: grid = [ceil(M/128), ceil(N/128), 1], block = [256, 1, 1], dynamic shared = 98304.
//! Requires K % 8 == 0 and 16-byte aligned x, W; any M, N (tails are masked).
#include "gemm_common.cuh"

using namespace kgemm;

namespace {

constexpr int BM = 128, BN = 128, BK = 64, STAGES = 3, THREADS = 256;
constexpr int A_STAGE_BYTES = BM * BK * 2;  // 16 KB
constexpr int B_STAGE_BYTES = BN * BK * 2;  // 16 KB
static_assert(STAGES * (A_STAGE_BYTES + B_STAGE_BYTES) == 98304, "GEMM.md documents 98304 bytes");
constexpr int GROUP_M = 16;

// Byte offset of the 16-byte chunk `chunk` (0..7) of tile row `row` (rows are 128 bytes).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Grouped rasterization over a [tiles_m, tiles_n] = [gridDim.x, gridDim.y] grid.
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

template <typename OutT>
__device__ __forceinline__ void gemm_mma(const bf16* __restrict__ x, const bf16* __restrict__ W,
                                         const bf16* __restrict__ bias, OutT* __restrict__ y, int M, int N,
                                         int K) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sA = smem_u32(smem);
  const uint32_t sB = sA + STAGES * A_STAGE_BYTES;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 2, wn = warp & 3;
  int tm, tn;
  tile_coords(tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;

  // Loader: thread copies chunk `lc` of rows lr, lr+32, lr+64, lr+96 of both tiles. One base
  // pointer per operand (rows 32 apart are 32·K elements apart) keeps the register count
  // under the 128 that two CTAs per SM allow; out-of-range rows are zero-filled and their
  // (never dereferenced) address is replaced by the operand's base pointer.
  const int lc = tid & 7, lr = tid >> 3;
  const bf16* a_base = x + (long long)(m0 + lr) * K + lc * 8;
  const bf16* b_base = W + (long long)(n0 + lr) * K + lc * 8;
  const long long row_step = 32LL * K;
  const int a_rows = M - (m0 + lr), b_rows = N - (n0 + lr);  // row i valid iff 32·i < rows
  const uint32_t dst0 = swz(lr, lc);  // (lr + 32i) & 7 == lr & 7: row i adds i·32·128 bytes

  const int ktiles = (K + BK - 1) / BK;
  auto load_tile = [&](int kt, int s) {
    const int k0 = kt * BK;
    const bool k_ok = k0 + lc * 8 < K;
    const uint32_t da = sA + s * A_STAGE_BYTES + dst0, db = sB + s * B_STAGE_BYTES + dst0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool a_ok = k_ok && 32 * i < a_rows, b_ok = k_ok && 32 * i < b_rows;
      cp_async_16(da + i * 32 * 128, a_ok ? a_base + i * row_step + k0 : x, a_ok);
      cp_async_16(db + i * 32 * 128, b_ok ? b_base + i * row_step + k0 : W, b_ok);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  pdl_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_tile(s, s);
    cp_async_commit();
  }

  // ldmatrix lane roles. A (x4): rows +0..15 by lane&15, k-chunk +lane>>4.
  // B (x4): n rows +0..7 | +8..15 by lane>>4, k-chunk +((lane>>3)&1).
  const int a_row = wm * 64 + (lane & 15), a_ch = lane >> 4;
  const int b_row = wn * 32 + (lane & 7) + ((lane >> 4) << 3), b_ch = (lane >> 3) & 1;

  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt visible to all; everyone is done reading tile kt-1's stage
    {
      const int nk = kt + STAGES - 1;
      if (nk < ktiles) load_tile(nk, nk % STAGES);
      cp_async_commit();
    }
    const int s = kt % STAGES;
    const uint32_t tA = sA + s * A_STAGE_BYTES, tB = sB + s * B_STAGE_BYTES;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[4][4], bfr[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = a_row + i * 16;
        ldmatrix_x4(af[i][0], af[i][1], af[i][2], af[i][3], tA + swz(r, kk * 2 + a_ch));
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int r = b_row + p * 16;
        ldmatrix_x4(bfr[2 * p][0], bfr[2 * p][1], bfr[2 * p + 1][0], bfr[2 * p + 1][1],
                    tB + swz(r, kk * 2 + b_ch));
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma_16816(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bfr[j][0], bfr[j][1]);
    }
  }
  cp_async_wait<0>();
  pdl_launch_dependents();

  // Epilogue: acc[i][j] = rows (g, g+8) of m16 tile i, cols (2q, 2q+1) of n8 tile j.
  const int g = lane >> 2, q = lane & 3;
  const bool vec = (N & 1) == 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = n0 + wn * 32 + j * 8 + 2 * q;
    const bool ok0 = col < N, ok1 = col + 1 < N;
    const float b0 = ok0 ? bias_at(bias, col) : 0.0f, b1 = ok1 ? bias_at(bias, col + 1) : 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * 64 + i * 16 + g + 8 * h;
        if (row < M)
          store2(y, (long long)row * N + col, acc[i][j][2 * h] + b0, acc[i][j][2 * h + 1] + b1, ok0, ok1, vec);
      }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 2)
    gemm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, __nv_bfloat16* y,
              int M, int N, int K) {
  gemm_mma<__nv_bfloat16>(x, W, bias, y, M, N, K);
}

extern "C" __global__ void __launch_bounds__(THREADS, 2)
    gemm_bf16_f32out(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, float* y,
                     int M, int N, int K) {
  gemm_mma<float>(x, W, bias, y, M, N, K);
}
