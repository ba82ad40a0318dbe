// gemm_common.cuh's inline-PTX helpers on the CPU (included there, inside namespace kgemm, when
// KERN_HOST_EMU is defined: packs/kernels/verify/host_emu). mma.sync is emu.h's emulation (fp32
// accumulation in double, rounded once: not the GPU's bits, but the same for every entry, so
// an emulated fused GEMV must equal the emulated unfused sequence bit for bit).
inline uint32_t smem_u32(const void* p) { return (uint32_t)(uintptr_t)p; }
inline void cp_async_16(uint32_t, const void*, bool) { __trap(); }  // not used by gemm_skinny.cu
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
inline void mma_16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  float d[4] = {c[0], c[1], c[2], c[3]};
  const uint32_t a[4] = {a0, a1, a2, a3};
  kern_emu_mma_m16n8k16_bf16(d, a, b0, b1);
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}
inline uint4 ld_stream_16(const void* p, bool pred) {
  return pred ? *static_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}
inline uint4 ld_cached_16(const void* p, bool pred) {
  return pred ? *static_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}
inline void prefetch_l2_bulk(const void*, uint32_t) {}
inline void pdl_wait() {}
inline void pdl_launch_dependents() {}
