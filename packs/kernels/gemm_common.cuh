//! Shared device helpers for the packs' GEMM / GEMV kernels (gemm_*.cu):
//! cp.async, ldmatrix, mma.sync m16n8k16 bf16, streaming loads, PDL controls and the
//! output store that writes either bf16 or fp32. Only inline PTX; no CUTLASS, no CuTe.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace kgemm {

typedef __nv_bfloat16 bf16;

#ifndef KERN_HOST_EMU
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; `valid == false` zero-fills the 16 bytes and reads nothing
// (the source pointer must still be a valid address, callers pass a clamped one).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D += A * B, m16n8k16, A row-major (16x16 bf16, 4 regs), B "col" (16x8 bf16, 2 regs), fp32 acc.
__device__ __forceinline__ void mma_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read exactly once per launch: stream them past L1 (no_allocate) and ask L2 for
// 256-byte prefetch granules, so the activations and outputs keep the caches. The predicate
// lives inside the asm (zeros when false) so that the loads stay straight-line code: written
// as `c ? load : 0` the compiler makes one branch per load and then issues them one by one.
__device__ __forceinline__ uint4 ld_stream_16(const void* p, bool pred) {
  uint4 v;
  asm("{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}
// Activations are re-read by many CTAs: ordinary read-only cached load (L1 + L2). Volatile
// with a "memory" clobber so that it stays after pdl_wait() (the producer of x is the previous
// kernel); the weight loads above may float above pdl_wait, which is what we want.
__device__ __forceinline__ uint4 ld_cached_16(const void* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred))
      : "memory");
  return v;
}

// Bulk prefetch of `bytes` (multiple of 16) contiguous global bytes into L2 by the copy engine:
// one instruction per weight row, no registers held while the bytes are in flight.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

// Programmatic dependent launch. Both are no-ops when the launch did not use the PDL
// attribute. `wait` blocks until the previous grid in the stream has completed and its
// memory is visible, so issuing `launch_dependents` early can never expose stale data.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
#else  // packs/kernels/verify/host_emu: the helpers above on the CPU (cubins unaffected)
#include "gemm_common_emu.h"
#endif

__device__ __forceinline__ float bias_at(const bf16* bias, int col) {
  return bias != nullptr ? __bfloat162float(bias[col]) : 0.0f;
}

// Store two adjacent outputs (row, col) and (row, col+1) of a row-major [M, N] matrix.
// col is even. `vec` (N even) allows one 4- or 8-byte store; else element-wise with bounds.
__device__ __forceinline__ void store2(bf16* y, long long idx, float v0, float v1, bool ok0, bool ok1,
                                       bool vec) {
  if (vec && ok1) {
    *reinterpret_cast<__nv_bfloat162*>(y + idx) = __floats2bfloat162_rn(v0, v1);
  } else {
    if (ok0) y[idx] = __float2bfloat16_rn(v0);
    if (ok1) y[idx + 1] = __float2bfloat16_rn(v1);
  }
}
__device__ __forceinline__ void store2(float* y, long long idx, float v0, float v1, bool ok0, bool ok1,
                                       bool vec) {
  if (vec && ok1) {
    *reinterpret_cast<float2*>(y + idx) = make_float2(v0, v1);
  } else {
    if (ok0) y[idx] = v0;
    if (ok1) y[idx + 1] = v1;
  }
}
__device__ __forceinline__ void store1(bf16* y, long long idx, float v) { y[idx] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store1(float* y, long long idx, float v) { y[idx] = v; }

}  // namespace kgemm
