// gemm_fp8_common.cuh's PTX on the CPU (included there, inside namespace kfp8, when KERN_HOST_EMU
// is defined: packs/kernels/verify/host_emu). Standard headers come from emu.h (force-included).
//   bf2_mul_2p120  fma.rn.bf16x2(v, 2^120, -0): computed in double, rounded to bf16 once (exact for
//                  every input the GEMVs give it: bf16 values of 4 significant bits)
//   e4m3x2_sat     cvt.rn.satfinite.e4m3x2.f32: c10's fp8e4m3fn_from_fp32_value (round to nearest
//                  even, subnormals by the magic-number addition) after a clamp to ±448; NaN → 0x7F
//                  with the input's sign
inline uint32_t bf2_mul_2p120_half(uint32_t h) {
  float f;
  const uint32_t u = h << 16;
  std::memcpy(&f, &u, 4);
  const double r = static_cast<double>(f) * 0x1p120 + (-0.0);
  return __float2bfloat16_rn(static_cast<float>(r)).x;
}
inline uint32_t bf2_mul_2p120(uint32_t v) { return bf2_mul_2p120_half(v & 0xffffu) | bf2_mul_2p120_half(v >> 16) << 16; }

inline uint32_t e4m3_sat_one(float f) {
  uint32_t fb;
  std::memcpy(&fb, &f, 4);
  const uint32_t sign = fb & 0x80000000u;
  if ((fb & 0x7fffffffu) > 0x7f800000u) return 0x7Fu | (sign >> 24);
  float a;
  uint32_t ab = fb ^ sign;
  std::memcpy(&a, &ab, 4);
  if (a > 448.0f) a = 448.0f;
  std::memcpy(&ab, &a, 4);
  uint32_t r;
  if (ab < (121u << 23)) {  // below 2^-6: subnormal range, RNE by adding 2^(141-127)
    const uint32_t denorm = 141u << 23;
    float d, s;
    std::memcpy(&d, &denorm, 4);
    s = a + d;
    uint32_t sb;
    std::memcpy(&sb, &s, 4);
    r = sb - denorm;
  } else {
    const uint32_t odd = (ab >> 20) & 1u;
    ab += ((uint32_t)(7 - 127) << 23) + 0x7FFFFu;
    ab += odd;
    r = ab >> 20;
  }
  return (r & 0x7Fu) | (sign >> 24);
}
inline uint32_t e4m3x2_sat(float lo, float hi) { return e4m3_sat_one(lo) | e4m3_sat_one(hi) << 8; }
