// CUDA-on-the-CPU shim for running a kernel source's logic on the host (force-included before
// it): the threads of a CTA are fibers (user-mode contexts: one stack each, switched by hand on
// x86-64, by swapcontext elsewhere) run by one OS thread, CTAs one after another. A fiber runs
// until it waits at a barrier: __syncthreads waits for the CTA's threads, __syncwarp and the warp
// collectives (shuffles / ballots, ldmatrix / mma below) for the warp's, exchanging values through
// a per-warp buffer between two warp barriers (so every lane of the warp must take part, as the
// kernels here do: full masks only). The scheduler resumes the waiting fibers in an order that
// changes every pass (a fixed pseudo-random sequence: runs are deterministic, and a missing
// barrier between a write and another thread's read shows up under some order); a pass in which
// no fiber can move is a deadlock (a barrier some threads never reach) and aborts.
// __shared__ variables are function statics (one CTA at a time); cp.async is a synchronous copy
// (kern_emu_cp_async16). Not a simulator of timing or memory ordering: it checks indexing,
// control flow and arithmetic. (Until 2026-12-03 every CUDA thread was a std::thread with
// std::barrier: the same semantics, but thread creation and futex waits dominated the run time.)
#pragma once
#define KERN_HOST_EMU 1
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

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

// The running fiber's thread index (set by the scheduler before it resumes a fiber).
inline uint3_ threadIdx;
inline uint3_ blockIdx, gridDim, blockDim;

// ------------------------------------------------------------------ fibers
#if defined(__x86_64__)
// kern_emu_switch(&save_sp, load_sp): saves the callee-saved registers, MXCSR and the x87 control
// word on the current stack, stores its pointer in *save_sp, and resumes the context saved at
// load_sp. Weak: emu.h is included by several translation units of one program.
extern "C" void kern_emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .weak kern_emu_switch
    .type kern_emu_switch, @function
kern_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kern_emu_switch, .-kern_emu_switch
)");
#endif

struct EmuFiber {
    unsigned tid = 0;
    bool done = false;
    unsigned char* stack = nullptr;  // lowest usable byte (a guard page lies below)
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

struct EmuSched {
    std::vector<EmuFiber> fibers;
    EmuFiber* cur = nullptr;
#if defined(__x86_64__)
    void* main_sp = nullptr;
#else
    ucontext_t main_uc;
#endif
    const std::function<void()>* kernel = nullptr;
    uint64_t progress = 0;  // barrier arrivals and fiber ends: a pass without any is a deadlock
    uint32_t rng = 0x9e3779b9u;
    size_t stack_bytes = 0;
};
inline EmuSched* g_sched = nullptr;

inline void emu_yield() {  // from a fiber back to the scheduler
    EmuFiber* f = g_sched->cur;
#if defined(__x86_64__)
    kern_emu_switch(&f->sp, g_sched->main_sp);
#else
    swapcontext(&f->uc, &g_sched->main_uc);
#endif
}

extern "C" inline void kern_emu_fiber_main() {
    EmuFiber* f = g_sched->cur;
    (*g_sched->kernel)();
    f->done = true;
    ++g_sched->progress;
    for (;;) emu_yield();  // never resumed again
}

// A barrier over `expected` fibers: the last to arrive releases the others (a new generation).
struct EmuBarrier {
    int expected = 0, arrived = 0;
    unsigned gen = 0;
    explicit EmuBarrier(int n) : expected(n) {}
    void arrive_and_wait() {
        ++g_sched->progress;
        if (++arrived == expected) {
            arrived = 0;
            ++gen;
            return;
        }
        const unsigned g = gen;
        while (gen == g) emu_yield();
    }
};

struct EmuCta {
    std::unique_ptr<EmuBarrier> block;
    std::vector<std::unique_ptr<EmuBarrier>> warps;
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

// Runs `kernel()` (a lambda calling the entry with its arguments) over grid x block: for each CTA,
// `threads` fibers (one stack each, reused from CTA to CTA) until all have returned.
inline void emu_launch(uint3_ grid, unsigned threads, const std::function<void()>& kernel) {
    gridDim = grid;
    blockDim = uint3_{threads, 1, 1};
    const size_t page = 4096, stack_bytes = 512 * 1024;  // + a PROT_NONE guard page below each stack
    EmuSched sched;
    sched.kernel = &kernel;
    sched.stack_bytes = stack_bytes;
    sched.fibers.resize(threads);
    unsigned char* arena = static_cast<unsigned char*>(
        mmap(nullptr, (size_t)threads * (stack_bytes + page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (arena == MAP_FAILED) {
        std::fprintf(stderr, "emu: mmap of %u fiber stacks failed\n", threads);
        std::abort();
    }
    for (unsigned t = 0; t < threads; ++t) {
        unsigned char* base = arena + (size_t)t * (stack_bytes + page);
        mprotect(base, page, PROT_NONE);
        sched.fibers[t].stack = base + page;
        sched.fibers[t].tid = t;
    }
    EmuSched* prev = g_sched;
    g_sched = &sched;
    std::vector<unsigned> order(threads);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = uint3_{x, y, z};
                EmuCta cta;
                cta.block = std::make_unique<EmuBarrier>((int)threads);
                for (unsigned w = 0; w < (threads + 31) / 32; ++w)
                    cta.warps.push_back(std::make_unique<EmuBarrier>((int)std::min(32u, threads - 32 * w)));
                cta.xbuf.assign(32 * cta.warps.size(), 0);
                g_cta = &cta;
                for (auto& f : sched.fibers) {
                    f.done = false;
#if defined(__x86_64__)
                    // a fresh context: kern_emu_switch "returns" into kern_emu_fiber_main with the
                    // stack aligned as after a call (rsp = 8 mod 16), default MXCSR and x87 control word
                    uint64_t* top = reinterpret_cast<uint64_t*>(f.stack + stack_bytes);
                    top[-1] = 0;                                                      // fake return address
                    top[-2] = reinterpret_cast<uint64_t>(&kern_emu_fiber_main);        // ret target
                    for (int r = 3; r <= 8; ++r) top[-r] = 0;                          // rbp rbx r12 r13 r14 r15
                    top[-9] = (uint64_t)0x1f80u | ((uint64_t)0x037fu << 32);           // MXCSR, x87 CW
                    f.sp = &top[-9];
#else
                    getcontext(&f.uc);
                    f.uc.uc_stack.ss_sp = f.stack;
                    f.uc.uc_stack.ss_size = stack_bytes;
                    f.uc.uc_link = nullptr;
                    makecontext(&f.uc, (void (*)())kern_emu_fiber_main, 0);
#endif
                }
                unsigned live = threads;
                for (unsigned t = 0; t < threads; ++t) order[t] = t;
                while (live > 0) {
                    const uint64_t before = sched.progress;
                    // this pass's order: a Fisher-Yates shuffle by a fixed xorshift sequence
                    for (unsigned i = threads; i > 1; --i) {
                        sched.rng ^= sched.rng << 13;
                        sched.rng ^= sched.rng >> 17;
                        sched.rng ^= sched.rng << 5;
                        const unsigned j = sched.rng % i;
                        const unsigned tmp = order[i - 1];
                        order[i - 1] = order[j];
                        order[j] = tmp;
                    }
                    for (unsigned i = 0; i < threads; ++i) {
                        EmuFiber& f = sched.fibers[order[i]];
                        if (f.done) continue;
                        sched.cur = &f;
                        threadIdx = uint3_{f.tid, 0, 0};
#if defined(__x86_64__)
                        kern_emu_switch(&sched.main_sp, f.sp);
#else
                        swapcontext(&sched.main_uc, &f.uc);
#endif
                        if (f.done) --live;
                    }
                    if (live > 0 && sched.progress == before) {
                        std::fprintf(stderr, "emu: deadlock in block (%u,%u,%u): %u threads wait at barriers the others never reach\n",
                                     x, y, z, live);
                        std::abort();
                    }
                }
                g_cta = nullptr;
            }
    g_sched = prev;
    munmap(arena, (size_t)threads * (stack_bytes + page));
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
