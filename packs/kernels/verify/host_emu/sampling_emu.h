// The warp collectives, atomics and intrinsics sampling.cu uses beyond emu.h's (which exchanges
// 4-byte words only): 64-bit shuffles as two 32-bit exchanges, __shfl_down_sync,
// __match_any_sync, shared-memory atomicAdd, and the integer / float intrinsics.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __shfl_down_sync(unsigned, T v, int o) { return emu_exchange(v, [o](int l) { return l + o < 32 ? l + o : l; }); }

// 64-bit values: the two halves exchanged with the same source lane.
template <class F>
inline unsigned long long emu_exchange64(unsigned long long v, F src) {
    const uint32_t lo = emu_exchange((uint32_t)v, src), hi = emu_exchange((uint32_t)(v >> 32), src);
    return ((unsigned long long)hi << 32) | lo;
}
inline unsigned long long __shfl_xor_sync(unsigned, unsigned long long v, int o) { return emu_exchange64(v, [o](int l) { return l ^ o; }); }
inline unsigned long long __shfl_up_sync(unsigned, unsigned long long v, int o) { return emu_exchange64(v, [o](int l) { return l >= o ? l - o : l; }); }
inline unsigned long long __shfl_down_sync(unsigned, unsigned long long v, int o) { return emu_exchange64(v, [o](int l) { return l + o < 32 ? l + o : l; }); }
inline unsigned long long __shfl_sync(unsigned, unsigned long long v, int s) { return emu_exchange64(v, [s](int) { return s; }); }

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
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t)(((uint64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) { return (unsigned long long)(((unsigned __int128)a * b) >> 64); }
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline unsigned long long __float2ull_rn(float f) { return (unsigned long long)std::nearbyint((double)f); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
using std::isnan;
