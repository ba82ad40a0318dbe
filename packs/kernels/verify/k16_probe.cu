//! k16 rounding probe (docs/batch-invariance.md, option (d)): does one Hopper wgmma k16 step
//! round like one mma.sync m16n8k16 step? A verification tool, not a pack kernel: build.sh
//! compiles it to build/packs/k16_probe.sm_90a.cubin; packs/kernels/verify/k16_probe.py drives it.
//!
//! Every entry computes, per trial t (one CTA per trial), D = C + A·Bᵀ in KSTEPS k16 steps that
//! accumulate into the same fp32 registers in increasing k (step s covers k = 16s..16s+15):
//!   A [T][R][K] bf16 row-major (K = 16·KSTEPS), B [T][8][K] bf16 (W-style: n rows of K, i.e.
//!   the .col operand), C, D [T][R][8] fp32 row-major; R = 16 (mma.sync) or 64 (wgmma).
//!
//!   k16_mma_sync, k16_mma_sync_k64    one warp:       mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
//!                                     grid [T, 1, 1], block [32, 1, 1], R = 16, K = 16 / 64
//!   k16_wgmma, k16_wgmma_k64          one warpgroup:  wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16
//!                                     grid [T, 1, 1], block [128, 1, 1], R = 64, K = 16 / 64
//!
//! The wgmma operands come from shared memory in the exact layout gemm_wgmma.cu uses: K-major,
//! 128-byte rows of 64 k, 16-byte chunk c of row r stored at chunk c ^ (r & 7), 8-row groups
//! 1024 bytes apart, tile bases 1024-aligned, descriptor sw128_desc (wgmma_common.cuh), k16 step s at
//! byte offset 32·s along the swizzled row. For K = 16 the tile is still 64 k wide; only k
//! 0..15 are filled (the rest is zero and never read). The accumulator registers are loaded
//! with C before the first wgmma (scale-d = 1 throughout), so D = C + Σ steps as in mma.sync.
//! Accumulator layout of m64n8 (warp wq of the warpgroup owns rows 16wq..16wq+15) equals
//! mma.sync's C/D layout per warp: d[0..1] = (row g, cols 2q, 2q+1), d[2..3] = (row g+8, same).
//!
//! Parameters are pointers and one int (T); entries do nothing for blockIdx.x >= T.
#include <stdint.h>

#include "../gemm_common.cuh"   // smem_u32, mma_16816 (the GEMV family's mma.sync)
#include "../wgmma_common.cuh"  // swz, sw128_desc, wgmma fences (gemm_wgmma.cu's)

using namespace kgemm;

namespace {

// Two bf16 (as raw 16-bit patterns) into one register: lower k in the low half.
__device__ __forceinline__ uint32_t pack2(const uint16_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 16);
}

// m64n8k16, f32 += bf16 * bf16, A and B from shared-memory descriptors, both K-major,
// scale-d = 1 (accumulate), scale-a = scale-b = 1 (the form of gemm_wgmma_ops.cuh).
__device__ __forceinline__ void wgmma_m64n8k16(float* d, uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

template <int KSTEPS>
__device__ __forceinline__ void probe_mma_sync(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
                                               const float* __restrict__ C, float* __restrict__ D, int T) {
  constexpr int K = 16 * KSTEPS;
  const int t = blockIdx.x;
  if (t >= T) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const uint16_t* a = A + (long long)t * 16 * K;
  const uint16_t* b = B + (long long)t * 8 * K;
  const float* c = C + (long long)t * 16 * 8;
  float* d = D + (long long)t * 16 * 8;
  float acc[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
#pragma unroll
  for (int s = 0; s < KSTEPS; ++s) {
    const int k0 = 16 * s + 2 * q;
    // A fragment (row-major 16x16): a0 (row g, k 2q..), a1 (row g+8, k 2q..),
    // a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..); B fragment (.col 16x8): b0 (k 2q.., col g),
    // b1 (k 2q+8.., col g).
    const uint32_t a0 = pack2(a + g * K + k0), a1 = pack2(a + (g + 8) * K + k0);
    const uint32_t a2 = pack2(a + g * K + k0 + 8), a3 = pack2(a + (g + 8) * K + k0 + 8);
    const uint32_t b0 = pack2(b + g * K + k0), b1 = pack2(b + g * K + k0 + 8);
    mma_16816(acc, a0, a1, a2, a3, b0, b1);
  }
  d[g * 8 + 2 * q] = acc[0];
  d[g * 8 + 2 * q + 1] = acc[1];
  d[(g + 8) * 8 + 2 * q] = acc[2];
  d[(g + 8) * 8 + 2 * q + 1] = acc[3];
}

constexpr int WG_A_BYTES = 64 * 128;  // 64 rows x 64 k bf16, swizzled
constexpr int WG_B_BYTES = 8 * 128;   // 8 rows x 64 k bf16, swizzled

template <int KSTEPS>
__device__ __forceinline__ void probe_wgmma(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
                                            const float* __restrict__ C, float* __restrict__ D, int T) {
  constexpr int K = 16 * KSTEPS;
  static_assert(K <= 64, "one 128-byte swizzled row holds 64 k");
  __shared__ __align__(1024) uint8_t smem_raw[1024 + WG_A_BYTES + WG_B_BYTES];
  const int t = blockIdx.x;
  if (t >= T) return;
  const int tid = threadIdx.x;
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t sa = (raw + 1023u) & ~1023u;  // 1024-aligned, as gemm_wgmma.cu's stage bases
  const uint32_t sb = sa + WG_A_BYTES;         // also 1024-aligned
  uint8_t* pa = smem_raw + (sa - raw);
  uint8_t* pb = pa + WG_A_BYTES;
  const uint16_t* a = A + (long long)t * 64 * K;
  const uint16_t* b = B + (long long)t * 8 * K;

  // Fill: 16-byte chunk ch (k = 8ch..8ch+7) of row r at swz(r, ch); chunks at k >= K are zero.
  for (int i = tid; i < 64 * 8; i += 128) {
    const int r = i >> 3, ch = i & 7;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ch * 8 < K) v = *reinterpret_cast<const uint4*>(a + r * K + ch * 8);
    *reinterpret_cast<uint4*>(pa + swz(r, ch)) = v;
  }
  for (int i = tid; i < 8 * 8; i += 128) {
    const int r = i >> 3, ch = i & 7;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (ch * 8 < K) v = *reinterpret_cast<const uint4*>(b + r * K + ch * 8);
    *reinterpret_cast<uint4*>(pb + swz(r, ch)) = v;
  }
  fence_proxy_async();  // generic-proxy stores -> visible to wgmma's async proxy
  __syncthreads();

  const int wq = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
  const int row0 = wq * 16 + g;
  const float* c = C + (long long)t * 64 * 8;
  float* d = D + (long long)t * 64 * 8;
  float acc[4] = {c[row0 * 8 + 2 * q], c[row0 * 8 + 2 * q + 1], c[(row0 + 8) * 8 + 2 * q],
                  c[(row0 + 8) * 8 + 2 * q + 1]};
  fence_acc<4>(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < KSTEPS; ++s)  // k16 step = 32 bytes along the swizzled row
    wgmma_m64n8k16(acc, sw128_desc(sa + s * 32), sw128_desc(sb + s * 32));
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc<4>(acc);
  d[row0 * 8 + 2 * q] = acc[0];
  d[row0 * 8 + 2 * q + 1] = acc[1];
  d[(row0 + 8) * 8 + 2 * q] = acc[2];
  d[(row0 + 8) * 8 + 2 * q + 1] = acc[3];
}

}  // namespace

extern "C" __global__ void __launch_bounds__(32) k16_mma_sync(const uint16_t* A, const uint16_t* B, const float* C,
                                                              float* D, int T) {
  probe_mma_sync<1>(A, B, C, D, T);
}
extern "C" __global__ void __launch_bounds__(32) k16_mma_sync_k64(const uint16_t* A, const uint16_t* B,
                                                                  const float* C, float* D, int T) {
  probe_mma_sync<4>(A, B, C, D, T);
}
extern "C" __global__ void __launch_bounds__(128) k16_wgmma(const uint16_t* A, const uint16_t* B, const float* C,
                                                           float* D, int T) {
  probe_wgmma<1>(A, B, C, D, T);
}
extern "C" __global__ void __launch_bounds__(128) k16_wgmma_k64(const uint16_t* A, const uint16_t* B, const float* C,
                                                               float* D, int T) {
  probe_wgmma<4>(A, B, C, D, T);
}
