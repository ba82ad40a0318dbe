// gguf_blocks.cuh's inline PTX and intrinsics on the CPU (included there, inside namespace
// kgguf, when KERN_HOST_EMU is defined: packs/kernels/verify/host_emu). Standard headers come
// from emu.h (force-included first), so this file includes none.
//   prmt        PRMT / __byte_perm in its default mode (selector nibbles 0..7)
//   fshr        __funnelshift_r
//   bf2_fma     fma.rn.bf16x2 computed in double and rounded to bf16 once (through f32): exact
//               wherever the GEMVs use it (small integers), not a general model of the instruction
//   h2f         cvt.f32.f16: the exact widening (the GPU's NaN bits may differ; the GEMVs never
//               see a NaN scale in the checks)
//   cp16 / cp_commit / cp_wait   cp.async as a synchronous 16-byte copy
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}
inline uint32_t fshr(uint32_t lo, uint32_t hi, uint32_t sh) {
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
}
inline uint32_t bf2_fma_half(uint32_t a, uint32_t b, uint32_t c) {
  const double r = static_cast<double>(u2f(a << 16)) * static_cast<double>(u2f(b << 16)) + static_cast<double>(u2f(c << 16));
  return __float2bfloat16_rn(static_cast<float>(r)).x;
}
inline uint32_t bf2_fma(uint32_t a, uint32_t b, uint32_t c) {
  return bf2_fma_half(a & 0xffffu, b & 0xffffu, c & 0xffffu) | bf2_fma_half(a >> 16, b >> 16, c >> 16) << 16;
}
inline float h2f(uint32_t h) {
  h &= 0xffffu;
  const uint32_t sign = (h & 0x8000u) << 16;
  if ((h & 0x7c00u) == 0x7c00u) return u2f(sign | 0x7f800000u | ((h & 0x03ffu) << 13));
  return u2f(f2u(u2f((h & 0x7fffu) << 13) * 0x1p112f) | sign);
}
// The GPU's IEEE f32 mul / add / sub: correctly rounded, and a NaN result is the canonical
// 0x7FFFFFFF whatever the operands (where the host's SSE unit would propagate a payload), so
// that the emulation exercises gguf_blocks.cuh's x86 NaN model as the GPU does.
inline float gpu_nan(float r) { return r != r ? u2f(0x7fffffffu) : r; }
inline float fmul(float a, float b) { return gpu_nan(a * b); }
inline float fadd(float a, float b) { return gpu_nan(a + b); }
inline float fsub(float a, float b) { return gpu_nan(a - b); }
typedef uint8_t* saddr_t;  // the device's shared-window address: here a pointer
inline saddr_t saddr(void* p) { return static_cast<uint8_t*>(p); }
inline void cp16(saddr_t smem, const void* gmem) { std::memcpy(smem, gmem, 16); }
inline void cp_commit() {}
template <int N>
inline void cp_wait() {}
