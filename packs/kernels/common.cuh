// Shared device helpers for the packs' kernels (not a kernel file: included by the .cu files).
//
// Conventions (see packs/kernels/KERNELS.md):
//   * bf16 storage, fp32 arithmetic; every rounding to bf16 is written out explicitly so that the
//     order of roundings matches what PyTorch/transformers does in bf16.
//   * 64-bit offsets wherever an index can exceed 2^31 elements (KV pool, vocab x seqs).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

// Programmatic Dependent Launch (`kern pack --pdl`): every kernel of a module built with
// -DKERN_PDL (packs/kernels/build.sh: `<stem>.pdl.sm_90a.cubin`, for sources marked
// `// KERN_PDL_VARIANT`) first waits for the kernel before it in the stream to complete
// (griddepcontrol.wait), so it may be launched while that kernel finishes, and then lets the
// kernel after it launch (griddepcontrol.launch_dependents: that one's blocks become resident
// and wait in their turn — it cannot read this kernel's results early, its own wait sees to
// that). Without KERN_PDL the macro is empty and the cubin is the ordinary one, byte for byte.
#if defined(KERN_PDL) && !defined(KERN_HOST_EMU)
#define KERN_PDL_WAIT()                                                \
    do {                                                               \
        asm volatile("griddepcontrol.wait;\n" ::: "memory");              \
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); \
    } while (0)
#else
#define KERN_PDL_WAIT() \
    do {                 \
    } while (0)
#endif

// A kernel's shared memory as one struct `T`, bound to the reference `name`: static shared
// memory when it fits the 48 KiB a kernel may declare statically, else the launch's dynamic
// shared memory (the manifest's `shared` bytes; the runtime raises the function's limit). A
// launch with less dynamic memory than the struct needs traps instead of overrunning it. The
// host emulation (packs/kernels/verify/host_emu) gives every kernel one static struct.
#ifdef KERN_HOST_EMU
#define KERN_SMEM(T, name)       \
    static T name##_storage_;    \
    T& name = name##_storage_
#else
#define KERN_SMEM(T, name)                                                                        \
    extern __shared__ __align__(16) unsigned char kern_dyn_smem_[];                               \
    __shared__ __align__(16) unsigned char name##_static_[sizeof(T) <= 48 * 1024 ? sizeof(T) : 16]; \
    T& name = *reinterpret_cast<T*>(sizeof(T) <= 48 * 1024 ? name##_static_ : kern_dyn_smem_);      \
    if (sizeof(T) > 48 * 1024) {                                                                   \
        uint32_t dyn_;                                                                             \
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_));                            \
        if (dyn_ < sizeof(T)) __trap();                                                           \
    }
#endif

namespace kern {

typedef __nv_bfloat16 bf16;

// bf16 <-> fp32. bf16 -> fp32 is exact; fp32 -> bf16 rounds to nearest even (like PyTorch).
__device__ __forceinline__ float f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ bf16 b(float x) { return __float2bfloat16_rn(x); }
// Round an fp32 value to bf16 precision and return it as fp32 (a "bf16 op" in fp32 registers).
__device__ __forceinline__ float rb(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Unpack / pack 2 bf16 held in a 32-bit word (low half = lower address).
__device__ __forceinline__ float2 unpack2(uint32_t w) {
    float2 r;
    r.x = __uint_as_float(w << 16);
    r.y = __uint_as_float(w & 0xffff0000u);
    return r;
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low address)
    return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide fp32 sum; every thread gets the result. `scratch` holds >= 32 floats.
// Deterministic: fixed reduction tree for a fixed blockDim.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = (lane < nwarps) ? scratch[lane] : 0.f;
    return warp_sum(t);
}

// ------------------------------------------------------------------ paged KV cache
// Pool layout (bf16 elements). Page p starts at element p * page_elems, where
//   page_elems = page_tokens * num_layers * 2 * kv_heads * head_dim
// (= page_tokens * bytes_per_token / 2). Inside a page:
//   [layer][k=0|v=1][offset_in_page][kv_head][head_dim]
// A slot is page * page_tokens + offset_in_page (the step ABI's slot_mapping).
__device__ __forceinline__ size_t kv_offset(long long page, int off, int layer, int kv, int num_layers,
                                            int page_tokens, int kv_heads, int head_dim) {
    const size_t row = (size_t)kv_heads * (size_t)head_dim;            // one token of one (layer, k|v)
    const size_t page_elems = (size_t)page_tokens * (size_t)num_layers * 2 * row;
    return (size_t)page * page_elems + ((size_t)(layer * 2 + kv) * (size_t)page_tokens + (size_t)off) * row;
}

}  // namespace kern
