// What moe.cu uses beyond emu.h and emu_math.h on the CPU (packs/kernels/verify/host_emu):
// __match_any_sync, shared-memory atomicAdd on int, __popc.
#pragma once
#include "emu_math.h"

// Lanes holding the same value as this one.
inline unsigned __match_any_sync(unsigned, int v) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_cta->xbuf[w * 32 + l] = (uint32_t)v;
    g_cta->warps[w]->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (g_cta->xbuf[w * 32 + i] == (uint32_t)v ? 1u : 0u) << i;
    g_cta->warps[w]->arrive_and_wait();
    return r;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
