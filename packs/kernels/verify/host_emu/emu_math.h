// CUDA math intrinsics the row-wise and GEMV sources use, for the host emulation (emu.h): the
// correctly rounded ones exactly (fmaf, IEEE division), rsqrtf / expf as the host computes
// them (not the GPU's bits, but the same in every kernel of a run, which is what the emulated
// comparisons of fused and unfused kernels need).
#pragma once
#include <cmath>
#include <cstdint>
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
