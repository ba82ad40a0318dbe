//! Thread-block cluster helpers shared by the packs' cluster GEMMs (gemm_skinny.cu's `_cC`
//! family, gemm_wide.cu): the CTA's rank in its cluster, a full cluster barrier, and a read of
//! another CTA's shared memory (distributed shared memory). Inline PTX only.
#pragma once
#include "gemm_common.cuh"

namespace kgemm {

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

}  // namespace kgemm
