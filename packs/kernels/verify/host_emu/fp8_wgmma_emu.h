// gemm_fp8_wgmma.cu's PTX on the CPU (included there, inside its anonymous namespace, when
// KERN_HOST_EMU is defined). Shared memory is one 1024-aligned arena; a "shared address" is an
// offset into it (the kernel's base is 0 under emulation).
//   cp16 / cp_commit / cp_wait     cp.async.cg 16 bytes as a synchronous copy (zero-fill when !valid)
//   sw128_desc                     the same 64-bit shared-memory descriptor as on the GPU (start
//                                  address >> 4 in bits 0..13, LBO 1, SBO 1024 >> 4 in bits 32..45,
//                                  swizzle mode 1 = 128-byte in bits 62..63)
//   wgmma_m64n128k32_e4m3          the PTX ISA's wgmma semantics, decoded from the descriptors (not
//                                  from the kernel's loader): row r, K byte c of a K-major operand is
//                                  at a = start + (r / 8)·SBO + (r % 8)·128 + c, stored at
//                                  a ^ (((a >> 7) & 7) << 4) (the 128-byte swizzle); D fragment of
//                                  thread t of the warpgroup: warp w = t / 32 owns rows 16w .. 16w+15,
//                                  d[4j + {0,1}] = (row 16w + g, cols 8j + 2q + {0,1}), d[4j + {2,3}] =
//                                  (row + 8, same cols), g = lane / 4, q = lane % 4. Products of e4m3
//                                  are exact; the 32-term sum (plus D when scale-d) runs in double
//                                  and is rounded to fp32 once (the GPU's FP8 accumulation keeps
//                                  fewer bits: gemm_fp8_wgmma's promotion every 128 K bounds that).
//                                  Computed at issue (the kernel waits before it reads D).
//   fences, commit, wait           no-ops (the emulation computes synchronously)
alignas(1024) inline unsigned char kfp8_emu_smem[197632];

inline uint64_t sw128_desc(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}
inline void fence_proxy_async() {}
template <int NR>
inline void fence_acc(float*) {}
inline void cp16(uint32_t dst, const void* src, bool valid) {
  if (dst + 16 > sizeof(kfp8_emu_smem)) __trap();
  if (valid) std::memcpy(kfp8_emu_smem + dst, src, 16);
  else std::memset(kfp8_emu_smem + dst, 0, 16);
}
inline void cp_commit() {}
template <int N>
inline void cp_wait() {}

// e4m3 → double from the format's definition (independent of gemm_fp8_common.cuh).
inline double emu_e4m3(unsigned b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double s = (b & 0x80) ? -1.0 : 1.0;
  if (e == 15 && m == 7) return std::nan("");
  return e == 0 ? s * std::ldexp(m, -9) : s * std::ldexp(8 + m, e - 10);
}
// Byte c (0..31) of K-major operand row r, from a descriptor.
inline unsigned emu_desc_byte(uint64_t desc, int r, int c) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  if ((desc >> 62) != 1) __trap();  // only the 128-byte swizzle is modelled
  const uint32_t a = start + static_cast<uint32_t>(r / 8) * sbo + static_cast<uint32_t>(r % 8) * 128 + static_cast<uint32_t>(c);
  const uint32_t p = a ^ (((a >> 7) & 7u) << 4);
  if (p >= sizeof(kfp8_emu_smem)) __trap();
  return kfp8_emu_smem[p];
}
inline void wgmma_m64n128k32_e4m3(float* d, uint64_t da, uint64_t db, int scale_d) {
  const int t = threadIdx.x & 127, w = t / 32, lane = t & 31, g = lane / 4, q = lane % 4;
  for (int j = 0; j < 16; ++j)
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * w + g + ((i & 2) ? 8 : 0), c = 8 * j + 2 * q + (i & 1);
      double s = scale_d ? static_cast<double>(d[4 * j + i]) : 0.0;
      for (int k = 0; k < 32; ++k) s += emu_e4m3(emu_desc_byte(da, r, k)) * emu_e4m3(emu_desc_byte(db, c, k));
      d[4 * j + i] = static_cast<float>(s);
    }
}
