// Helpers of the qwen3 pack's attention kernels (attention.cu, attention_decode.cu): the
// cp.async copies of K/V tiles (synchronous copies under KERN_HOST_EMU, the CPU emulation of
// packs/qwen3/tests/host_emu) and the bf16x8 unpack. Header-only, static inline: including it
// adds no code to a module that does not use it.
#pragma once
#include "common.cuh"

namespace kern {

#ifdef KERN_HOST_EMU  // packs/qwen3/tests/host_emu: this file's logic run on the CPU (synchronous copies)
static void cp_async16(void* smem, const void* gmem, int src_bytes) { kern_emu_cp_async16(smem, gmem, src_bytes); }
static void cp_async_commit() {}
template <int N>
static void cp_async_wait() {}
#else
static __device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

static __device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float2 a = unpack2(w[k]);
        x[2 * k] = a.x;
        x[2 * k + 1] = a.y;
    }
}

}  // namespace kern
