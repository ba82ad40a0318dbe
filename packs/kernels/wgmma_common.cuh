// The wgmma helpers gemm_wgmma.cu, gemm_fp8_wgmma.cu and verify/k16_probe.cu share: the
// 128-byte-swizzled shared tile address, its matrix descriptor, the wgmma fences / commit / wait
// and the accumulator fence. Under KERN_HOST_EMU only `swz` is defined here: the emulations
// (verify/host_emu/fp8_wgmma_emu.h) bring their own descriptor and no-op fences.
#pragma once
#include <stdint.h>

namespace kgemm {

// Byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile (chunk c of row r
// stored at chunk c ^ (r & 7); 8-row groups of 1024 bytes).
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

#ifndef KERN_HOST_EMU
// Shared-memory matrix descriptor: K-major operand, 128-byte swizzle, 8-row groups 1024 bytes
// apart (stride byte offset); the leading byte offset is unused for swizzled K-major layouts.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
template <int NR>
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < NR; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

}  // namespace kgemm
