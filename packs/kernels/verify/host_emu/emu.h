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

// ==================================================================== tensor-core warp collectives
// (attention_prefill.cu) ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with the PTX ISA's fragment layouts; every
// lane of the warp must call them together (as on the GPU). Each publishes its operands in a
// per-warp slot of g_emu_tc (CTAs run one at a time), then computes its own results.
//   ldmatrix: lanes 8i..8i+7 give the row addresses of matrix i (8 rows of 8 b16); register i of
//     lane l holds matrix i's row l/4, elements 2(l%4), 2(l%4)+1 (.trans: column l/4, rows 2(l%4),
//     2(l%4)+1), the lower element in the low half.
//   mma: g = l/4, t = l%4. A (16x16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
//     B (16x8, k x n): b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C/D (16x8 fp32): d0,d1 (g, 2t..2t+1),
//     d2,d3 (g+8, 2t..2t+1). Products of bf16 are exact; the sum runs in double and is rounded to
//     fp32 once (the hardware's fp32 accumulation order differs: not bit-exact to the GPU).
struct EmuTcSlot {
    const unsigned char* addr;
    uint32_t a[4], b[2];
};
inline EmuTcSlot g_emu_tc[32][32];  // [warp][lane], up to 1024 threads per CTA

inline void kern_emu_ldmatrix_x4(uint32_t (&r)[4], const void* p, bool trans) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_emu_tc[w][l].addr = static_cast<const unsigned char*>(p);
    g_cta->warps[w]->arrive_and_wait();
    for (int i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        if (!trans) {
            const unsigned char* row = g_emu_tc[w][8 * i + l / 4].addr;
            std::memcpy(&lo, row + 4 * (l % 4), 2);
            std::memcpy(&hi, row + 4 * (l % 4) + 2, 2);
        } else {
            std::memcpy(&lo, g_emu_tc[w][8 * i + 2 * (l % 4)].addr + 2 * (l / 4), 2);
            std::memcpy(&hi, g_emu_tc[w][8 * i + 2 * (l % 4) + 1].addr + 2 * (l / 4), 2);
        }
        r[i] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    g_cta->warps[w]->arrive_and_wait();
}

inline float kern_emu_bf16_half(uint32_t w, int hi) {
    const uint32_t u = hi ? (w & 0xffff0000u) : (w << 16);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline void kern_emu_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    EmuTcSlot& me = g_emu_tc[w][l];
    for (int i = 0; i < 4; ++i) me.a[i] = a[i];
    me.b[0] = b0;
    me.b[1] = b1;
    g_cta->warps[w]->arrive_and_wait();
    // A[row][k], B[k][n] read back from the owners' fragments
    auto A = [&](int row, int k) {
        const int g = row % 8, t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return kern_emu_bf16_half(g_emu_tc[w][4 * g + t].a[reg], k & 1);
    };
    auto B = [&](int k, int n) {
        const int t = (k % 8) / 2, reg = k >= 8 ? 1 : 0;
        return kern_emu_bf16_half(g_emu_tc[w][4 * n + t].b[reg], k & 1);
    };
    const int g = l / 4, t = l % 4;
    float res[4];
    for (int e = 0; e < 4; ++e) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        double acc = d[e];
        for (int k = 0; k < 16; ++k) acc += (double)A(row, k) * (double)B(k, col);
        res[e] = (float)acc;
    }
    g_cta->warps[w]->arrive_and_wait();
    for (int e = 0; e < 4; ++e) d[e] = res[e];
}
