// CUDA-on-the-CPU shim for running a kernel source's logic on the host (force-included before
// it): one std::thread per CUDA thread of a CTA, CTAs one after another; __syncthreads is a
// barrier over the CTA, warp shuffles / ballots / __syncwarp exchange through a per-warp buffer
// between two warp barriers (so every lane of the warp must take part, as the kernels here
// do: full masks only); __shared__ variables are function statics (one CTA at a time); cp.async
// is a synchronous copy (kern_emu_cp_async16). Not a simulator of timing or memory ordering:
// it checks indexing, control flow and arithmetic.
#pragma once
#define KERN_HOST_EMU 1
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint3_ {
    unsigned x = 0, y = 0, z = 0;
};
struct uint4 {
    uint32_t x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

inline thread_local uint3_ threadIdx;
inline uint3_ blockIdx, gridDim, blockDim;

struct EmuCta {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<uint32_t> xbuf;  // 32 words per warp
};
inline EmuCta* g_cta = nullptr;

inline void __syncthreads() { g_cta->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { g_cta->warps[threadIdx.x / 32]->arrive_and_wait(); }
[[noreturn]] inline void __trap() {
    std::fprintf(stderr, "emu: __trap() in block (%u,%u,%u) thread %u\n", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
    std::abort();
}
// Every lane publishes a word, then reads lane `src(lane)`'s.
template <class T, class F>
inline T emu_exchange(T v, F src) {
    static_assert(sizeof(T) == 4);
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    g_cta->xbuf[w * 32 + l] = u;
    g_cta->warps[w]->arrive_and_wait();
    const int s = src((int)l);
    uint32_t r = g_cta->xbuf[w * 32 + ((s >= 0 && s < 32) ? s : l)];
    g_cta->warps[w]->arrive_and_wait();
    T out;
    std::memcpy(&out, &r, 4);
    return out;
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) { return emu_exchange(v, [o](int l) { return l ^ o; }); }
template <class T>
inline T __shfl_up_sync(unsigned, T v, int o) { return emu_exchange(v, [o](int l) { return l >= o ? l - o : l; }); }
template <class T>
inline T __shfl_sync(unsigned, T v, int s) { return emu_exchange(v, [s](int) { return s; }); }
inline unsigned __ballot_sync(unsigned, int pred) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_cta->xbuf[w * 32 + l] = pred ? 1u : 0u;
    g_cta->warps[w]->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= g_cta->xbuf[w * 32 + i] << i;
    g_cta->warps[w]->arrive_and_wait();
    return r;
}
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }
inline void kern_emu_cp_async16(void* smem, const void* gmem, int src_bytes) {
    std::memset(smem, 0, 16);
    if (src_bytes > 0) std::memcpy(smem, gmem, (size_t)src_bytes);
}

// Runs `kernel()` (a lambda calling the entry with its arguments) over grid x block.
inline void emu_launch(uint3_ grid, unsigned threads, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = uint3_{threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = uint3_{x, y, z};
                EmuCta cta;
                cta.block = std::make_unique<std::barrier<>>((std::ptrdiff_t)threads);
                for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                    cta.warps.push_back(std::make_unique<std::barrier<>>((std::ptrdiff_t)std::min(32u, threads - 32 * w)));
                cta.xbuf.assign(32 * cta.warps.size(), 0);
                g_cta = &cta;
                std::vector<std::thread> ts;
                ts.reserve(threads);
                for (unsigned t = 0; t < threads; ++t)
                    ts.emplace_back([t, &kernel] {
                        threadIdx = uint3_{t, 0, 0};
                        kernel();
                    });
                for (auto& th : ts) th.join();
                g_cta = nullptr;
            }
}
