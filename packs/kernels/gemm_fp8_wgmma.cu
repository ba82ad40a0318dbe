//! W8A8 FP8 GEMM for prefill (issue 25 item 2(a), DeepSeek-V3 / DeepGEMM's block scaling), sm_90a:
//!   y[M, N] = Σ_kb xs[kb, m] · Ws[n/128, kb] · (Σ_{k in block kb} xq[m, k] · W[n, k])  (+ bias[n])
//! with xq / xs the per-token-group (1 × 128) e4m3 quantization of the bf16 activations that
//! quant_fp8_act (gemm_fp8.cu) writes just before, and W / Ws the checkpoint's e4m3 weights and
//! 128 × 128 block scales (gemm_fp8_common.cuh). Output bf16 or fp32.
//!
//! Warpgroup MMA (wgmma.mma_async m64n128k32 e4m3·e4m3 → f32, both operands from shared memory,
//! K-major). Tiles by cp.async (16-byte copies by every thread, as gemm_wgmma.cu: kern's kernel
//! parameters are pointers and scalars, no TMA descriptors) into 128-byte-swizzled rows: one row
//! of a tile is 128 e4m3 = one scale block of K, so the shared layout, the descriptors and the
//! 32-byte descriptor step per k32 MMA are exactly gemm_wgmma.cu's (bf16 rows of 64).
//! CTA = 2 warpgroups (256 threads), tile 128 (M) × 128 (N) × 128 (K), 6 stages (32 KB each).
//!
//! Promotion (DeepGEMM's scheme; the FP8 tensor cores keep ~14 bits in their accumulator): every
//! 128-wide K block goes into a fresh register accumulator (4 wgmmas, the first with scale-d = 0),
//! and once it is complete the CUDA cores add it into the fp32 result:
//!   fin += (xs[kb, m] · Ws[n0/128, kb]) · blk          (one FFMA per output and K block)
//! Step kb: every thread waits for its copies of tile kb, fences them into the async proxy, meets
//! the others at a barrier, issues the copies of tile kb + 4 (its buffer's last reader, tile
//! kb - 2, is complete), issues tile kb's 4 wgmmas, loads the two scales, waits for the wgmmas
//! (wait_group 0) and promotes. The tensor cores idle during the promotion and the barrier: two
//! alternating block accumulators (issue kb + 1, wait_group 1, promote kb) would hide it, but
//! ptxas (13.0) then serializes every wgmma (C7514: accumulator registers read while a wgmma is in
//! flight), so the overlap needs warpgroups that are not in lockstep — a producer warp with
//! mbarriers and two ping-ponging consumer warpgroups (DeepGEMM, CUTLASS) — the next step.
//!
//! Deterministic (fixed order: the wgmma sums of a block, then the blocks in increasing k) and
//! batch-invariant in M: a row's result does not depend on the other rows of the step.
//!
//! Entries (grid = [ceil(M/128), ceil(N/128), 1], block = [256, 1, 1], shared 197632 B dynamic):
//!   gemm_fp8_wgmma(xq, xs, W, Ws, bias, y, M, N, K)          bf16 y
//!   gemm_fp8_wgmma_f32out(same)                              fp32 y
//! Requires K % 128 == 0, xq and W 16-byte aligned, xs laid out [K/128][M] (quant_fp8_act's, with
//! the same M); any M, N (tails zero-filled / masked). Documentation: KERNELS.md, "FP8 weights".
#include "gemm_common.cuh"
#include "gemm_fp8_common.cuh"
#include "wgmma_common.cuh"

using namespace kgemm;

namespace {

constexpr int BM = 128, BN = 128, BK = 128, THREADS = 256, STAGES = 6, GROUP_M = 16;
constexpr int A_BYTES = BM * BK, B_BYTES = BN * BK, STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int SMEM = STAGES * STAGE_BYTES + 1024;  // + slack to align the base to 1024
constexpr int NACC = BN / 2;                       // fp32 accumulators per thread and accumulator set
static_assert(SMEM == 197632, "KERNELS.md documents 197632 bytes");

#ifndef KERN_HOST_EMU
// swz, sw128_desc, the wgmma fences and fence_acc: wgmma_common.cuh.
__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool valid) { cp_async_16(dst, src, valid); }
__device__ __forceinline__ void cp_commit() { cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_wait() { cp_async_wait<N>(); }
// D (+)= A · B, m64n128k32, f32 += e4m3 · e4m3, A and B from 128-byte-swizzled K-major shared
// tiles; scale_d = 0: D = A · B (a fresh accumulator).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#else
#include "fp8_wgmma_emu.h"
#endif

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
__device__ __forceinline__ void gemm_fp8(const uint8_t* __restrict__ xq, const float* __restrict__ xs,
                                         const uint8_t* __restrict__ W, const float* __restrict__ Ws,
                                         const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ y, int M, int N, int K) {
#ifndef KERN_HOST_EMU
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sbase = (smem_u32(smem_raw) + 1023u) & ~1023u;
#else
  const uint32_t sbase = 0;  // offsets into the emulation's shared arena
#endif
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, wq = (tid >> 5) & 3;
  int tm, tn;
  tile_coords(tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int nkb = K / BK;

  // Loader: 16-byte chunk lc of rows lr + 32i (i < 4) of the A and B tiles, per thread and stage.
  const int lc = tid & 7, lr = tid >> 3;
  const uint8_t* a_base = xq + static_cast<long long>(m0 + lr) * K + lc * 16;
  const uint8_t* b_base = W + static_cast<long long>(n0 + lr) * K + lc * 16;
  const long long row_step = 32LL * K;
  const int a_rows = M - (m0 + lr), b_rows = N - (n0 + lr);
  const uint32_t dst0 = swz(lr, lc);
  auto load_tile = [&](int kt, int s) {
    const int k0 = kt * BK;
    const uint32_t da = sbase + s * STAGE_BYTES + dst0;
    const uint32_t db = da + A_BYTES;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = 32 * i < a_rows;
      cp16(da + i * 32 * 128, ok ? a_base + i * row_step + k0 : xq, ok);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool ok = 32 * i < b_rows;
      cp16(db + i * 32 * 128, ok ? b_base + i * row_step + k0 : W, ok);
    }
  };

  // This thread's output rows (accumulator layout below) and the CTA's scale row of Ws.
  const int g = lane >> 2, q = lane & 3;
  const int row0 = m0 + wg * 64 + wq * 16 + g;
  const bool r0ok = row0 < M, r1ok = row0 + 8 < M;
  const float* const ws_row = Ws + static_cast<long long>(n0 / BK) * nkb;

  float acc[NACC], fin[NACC];
#pragma unroll
  for (int i = 0; i < NACC; ++i) fin[i] = 0.0f;

  pdl_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < nkb) load_tile(s, s);
    cp_commit();
  }
  // Step kt: copies of tile kt landed and visible to the async proxy, next copies issued.
  auto stage_in = [&](int kt) {
    cp_wait<STAGES - 3>();
    fence_proxy_async();
    __syncthreads();
    const int nk = kt + STAGES - 2;
    if (nk < nkb) load_tile(nk, nk % STAGES);
    cp_commit();
  };
  auto issue = [&](float* acc, int kt) {
    const uint32_t sa = sbase + (kt % STAGES) * STAGE_BYTES + wg * 64 * 128;
    const uint32_t sb = sbase + (kt % STAGES) * STAGE_BYTES + A_BYTES;
    fence_acc<NACC>(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 32; ++kk)  // k32 step = 32 bytes along the swizzled row
      wgmma_m64n128k32_e4m3(acc, sw128_desc(sa + kk * 32), sw128_desc(sb + kk * 32), kk > 0);
    wgmma_commit();
  };
  // fin += (xs · Ws) · acc for tile kt (complete); the scales were loaded before the wait.
  auto promote = [&](float* acc, float s0, float s1) {
    fence_acc<NACC>(acc);
#pragma unroll
    for (int j = 0; j < NACC / 4; ++j) {
      fin[4 * j] = fmaf(s0, acc[4 * j], fin[4 * j]);
      fin[4 * j + 1] = fmaf(s0, acc[4 * j + 1], fin[4 * j + 1]);
      fin[4 * j + 2] = fmaf(s1, acc[4 * j + 2], fin[4 * j + 2]);
      fin[4 * j + 3] = fmaf(s1, acc[4 * j + 3], fin[4 * j + 3]);
    }
  };
  auto scales = [&](int kt, float& s0, float& s1) {
    const float sb = __ldg(ws_row + kt);
    const float* xk = xs + static_cast<long long>(kt) * M;
    s0 = (r0ok ? __ldg(xk + row0) : 0.0f) * sb;
    s1 = (r1ok ? __ldg(xk + row0 + 8) : 0.0f) * sb;
  };

  for (int kt = 0; kt < nkb; ++kt) {
    stage_in(kt);
    issue(acc, kt);
    float s0, s1;
    scales(kt, s0, s1);  // global loads in flight while the tensor cores run
    wgmma_wait<0>();     // tile kt complete (see the header: why not wait<1>)
    promote(acc, s0, s1);
  }
  cp_wait<0>();
  pdl_launch_dependents();

  // Accumulator layout (per warpgroup, m64n128): warp wq owns rows 16wq..16wq+15; fin[4j+{0,1}]
  // is (row g, cols 8j+2q+{0,1}), fin[4j+{2,3}] is (row g+8, same cols).
  const bool vec = (N & 1) == 0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = n0 + j * 8 + 2 * q;
    const bool ok0 = col < N, ok1 = col + 1 < N;
    const float b0 = ok0 ? bias_at(bias, col) : 0.0f, b1 = ok1 ? bias_at(bias, col + 1) : 0.0f;
    if (r0ok) store2(y, static_cast<long long>(row0) * N + col, fin[4 * j] + b0, fin[4 * j + 1] + b1, ok0, ok1, vec);
    if (r1ok) store2(y, static_cast<long long>(row0 + 8) * N + col, fin[4 * j + 2] + b0, fin[4 * j + 3] + b1, ok0, ok1, vec);
  }
}

}  // namespace

#define KFP8_WGMMA_ENTRY(NAME, OUT)                                                                                     \
  extern "C" __global__ void __launch_bounds__(THREADS, 1)                                                             \
      NAME(const unsigned char* xq, const float* xs, const unsigned char* W, const float* Ws, const __nv_bfloat16* bias, \
           OUT* y, int M, int N, int K) {                                                                              \
    gemm_fp8<OUT>(xq, xs, W, Ws, bias, y, M, N, K);                                                                    \
  }

KFP8_WGMMA_ENTRY(gemm_fp8_wgmma, __nv_bfloat16)
KFP8_WGMMA_ENTRY(gemm_fp8_wgmma_f32out, float)
