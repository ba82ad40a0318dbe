// References and harness pieces shared by fp8_emu.cpp and fp8_wgmma_emu.cpp (the emulation of
// gemm_fp8.cu and gemm_fp8_wgmma.cu), written from the E4M3 definition, independent of the
// kernels' code:
//   ref_e4m3(b)      the value of an e4m3fn byte: S.EEEE.MMM, bias 7; E = 0: M·2^-9; S.1111.111: NaN
//   ref_encode(f)    f32 → e4m3fn by search: the nearest of the 253 finite codes' values (ties to
//                    the even code), |f| beyond 448 saturating to ±448, NaN → 0x7F (the
//                    satfinite conversion, and PyTorch's `x.clamp(-448, 448).to(torch.float8_e4m3fn)`)
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

namespace fp8ref {

inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// f32 → bf16 bits, round to nearest even (the GPU's cvt.rn.bf16.f32 for finite values).
inline uint16_t to_bf16(float f) {
  const uint32_t x = fbits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16f(uint16_t b) { return bitsf((uint32_t)b << 16); }

inline double ref_e4m3(unsigned b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double s = (b & 0x80) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::nan("");
  if (e == 0) return s * m / 512.0;
  return s * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}
inline uint8_t ref_encode(float f) {
  if (std::isnan(f)) return 0x7F;
  const bool neg = std::signbit(f);
  const double a = std::fabs((double)f);
  if (a >= 448.0) return (uint8_t)((neg ? 0x80 : 0) | 0x7E);
  int best = 0;
  double bd = a;
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(ref_e4m3(c) - a);
    if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) bd = d, best = c;
  }
  return (uint8_t)((neg ? 0x80 : 0) | best);
}

template <class T>
struct Buf {  // 256-byte aligned, like device allocations
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t n_) : n(n_) { p = static_cast<T*>(std::aligned_alloc(256, ((n * sizeof(T) + 255) / 256) * 256 + 256)); }
  Buf(const Buf&) = delete;
  ~Buf() { std::free(p); }
  T& operator[](size_t i) { return p[i]; }
  const T& operator[](size_t i) const { return p[i]; }
};

inline int fails = 0, passes = 0;
inline void report(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? passes : fails)++;
}
inline std::string fmt(const char* f, ...) {
  char b[768];
  va_list a;
  va_start(a, f);
  std::vsnprintf(b, sizeof b, f, a);
  va_end(a);
  return b;
}
inline std::mt19937_64& rng() {
  static std::mt19937_64 r(20261204);
  return r;
}
// A random finite e4m3 byte (every code but the two NaNs), all exponents equally likely.
inline uint8_t rand_code() {
  for (;;) {
    const uint8_t c = (uint8_t)rng()();
    if ((c & 0x7F) != 0x7F) return c;
  }
}
// A block scale like a checkpoint's: absmax / 448 for weights of magnitude ~0.02..0.2.
inline float rand_scale() { return std::ldexp(1.0f + (float)(rng()() % 1024) / 1024.0f, -13 + (int)(rng()() % 4)); }
inline uint16_t rand_bf16(double sd) {
  std::normal_distribution<double> nd(0.0, sd);
  return to_bf16((float)nd(rng()));
}

}  // namespace fp8ref
