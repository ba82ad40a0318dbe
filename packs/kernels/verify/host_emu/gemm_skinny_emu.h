// gemm_skinny.cu's inline-PTX helpers on the CPU (included there when KERN_HOST_EMU is defined:
// packs/kernels/verify/host_emu). The cluster entries are not built under emulation; their helpers
// only have to exist for the template's C > 1 branch.
inline uint32_t cluster_ctarank() { return 0; }
inline void cluster_sync_all() { __trap(); }
inline float ld_dsmem_f32(const float*, uint32_t) { __trap(); }
template <int OFF>
inline uint4 ld_stream_16_at(const void* p, bool pred) {
  return pred ? *reinterpret_cast<const uint4*>(static_cast<const char*>(p) + OFF) : make_uint4(0, 0, 0, 0);
}
template <int OFF>
inline uint4 ld_cached_16_at(const void* p, bool pred) {
  return pred ? *reinterpret_cast<const uint4*>(static_cast<const char*>(p) + OFF) : make_uint4(0, 0, 0, 0);
}
