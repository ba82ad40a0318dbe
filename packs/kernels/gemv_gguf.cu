//! GGUF-native decode GEMVs and dequantization (issue 25, item 2(b)): the weights stay in the
//! file's ggml blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and are
//! dequantized in registers against bf16 activations — no activation quantization (llama.cpp's
//! mmvq rounds x to Q8_1 first), so the result carries only the weights' own precision.
//!
//!   gemv_<t> / gemv_<t>_f32out:  y[m, col0 + n] (row stride ldy) = Σ_k x[m, k]·deq(W)[n, k] (+ bias[n])
//!   dequant_<t>_bf16:            dst[row0 + n, k] = bf16(deq(W)[n, k])   (bit-exact with kern-weights)
//!
//! Layout: W is an [N, K] matrix as the GGUF file stores it (row n = K / block_elems consecutive
//! blocks; HF's [out, in] row-major order, blocks along K). Block formats: gguf_blocks.cuh.
//!
//! GEMV design. A CTA owns 16 rows of W (n0 .. n0+15) and all of K; its 4 warps split K in
//! "units" (one 256-element super-block for the K-quants, four 32-element blocks for the others):
//! warp w takes units w, w+4, w+8, ... Each warp streams its units' bytes for the 16 rows into a
//! private 3-stage shared-memory ring with 16-byte cp.async copies of the aligned 16-byte granules
//! that cover each row's unit (blocks of 18, 22, 34, 110 or 210 bytes are only 2-byte aligned),
//! two units in flight while it computes the third. The product runs on the tensor cores:
//! mma.m16n8k16 with the 16 W rows as A (m16) and up to 8 tokens of x as B (n8). The A fragments
//! are the blocks' small integers q (0..63, or the int8 of Q8_0), exact in bf16, built from the
//! packed bits with byte permutes and one exact bf16x2 subtraction; the order of k inside an MMA
//! is free (the same permutation is used for x), so each lane takes contiguous bytes of its two
//! rows. One MMA (or two) covers one scale group of 16 or 32 elements; its fresh fp32 accumulator
//! is scaled on the CUDA cores per row: for the K-quants Σ_group sc·(Σ x·q) per super-block, then
//! d·that − dmin·(Σ_group m·Σx) (the mins' term is a second MMA whose A is the group's 6-bit min
//! broadcast, so it needs no Σx); for the 32-element types acc += d·(Σ x·q) (+ m·Σx, Σx from an
//! MMA with A = 1). Products are exact, sums are fp32 (tensor-core accumulation, then FFMA).
//! The warps' partials meet in shared memory and are added in warp order 0..3.
//!
//! Determinism / batch invariance: every output element is the same function of its W row, its
//! x row and K whatever M is (each MMA output depends only on its own row and token; the scale
//! FFMAs, the unit order of a warp and the warp order of the reduction are fixed), so a row has
//! the same bits in a step of 1 token and in a step of 8. M > 8 runs passes of 8 tokens and
//! re-reads W for each pass (correct; ~M/8 times the bytes).
//!
//! Launch: grid [ceil(N/16), 1, 1], block [128, 1, 1], shared 0 (static, < 48 KB). Requirements:
//! K % 256 == 0 for the K-quants, K % 32 == 0 for the others; x, y and W 16-byte aligned (W: the
//! start of the tensor; its rows need not be); any M >= 0, any N. The copies read the 16-byte
//! granules that hold W's bytes (never a byte on another page). dequant_*: grid
//! [ceil(N*K/2048), 1, 1], block [256, 1, 1]; dst 16-byte aligned, K % 8 == 0 (any K that is
//! a multiple of the block size). Documentation: KERNELS.md, "GGUF-native GEMVs and dequantization".
#include "common.cuh"  // KERN_SMEM
#include "gemm_common.cuh"
#include "gguf_blocks.cuh"

#include <type_traits>

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kRows = 16;  // W rows per CTA (the MMA's m16)

constexpr uint32_t kOne2 = 0x3F803F80u;  // bf16x2 (1, 1)

// Shared-memory reads at a byte offset from the CTA's array (offsets keep the state space known).
__device__ __forceinline__ uint32_t lds16(const uint8_t* sm, int off) { return *reinterpret_cast<const uint16_t*>(sm + off); }
__device__ __forceinline__ uint32_t lds32(const uint8_t* sm, int off) { return *reinterpret_cast<const uint32_t*>(sm + off); }
__device__ __forceinline__ uint2 lds64(const uint8_t* sm, int off) { return *reinterpret_cast<const uint2*>(sm + off); }
__device__ __forceinline__ uint4 lds128(const uint8_t* sm, int off) { return *reinterpret_cast<const uint4*>(sm + off); }
// Activations: plain read-only loads (ld.global.nc), which the compiler may schedule freely inside
// a unit (griddepcontrol.wait, a memory clobber, keeps them after the producer). The lanes of a
// token >= M read row 0 of x (always valid): their MMA column is garbage that is never stored
// (an MMA output element depends only on its own row and column).
__device__ __forceinline__ uint4 ldx16(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint2 ldx8(const bf16* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
// 4-byte words at 2-byte aligned offsets: Ua u = ua(off) once for a block (or row), then
// ldu(sm, u, c) is the word at off + c for c % 4 == 0 — two aligned words and a funnel shift by 0
// or 16 bits, the addresses u.base + c with c mostly a compile-time constant.
struct Ua {
  int base;     // off rounded down to 4
  uint32_t sh;  // (off & 2) · 8
};
__device__ __forceinline__ Ua ua(int off) { return Ua{off & ~3, static_cast<uint32_t>(off & 2) * 8u}; }
__device__ __forceinline__ uint32_t ldu(const uint8_t* sm, Ua u, int c) {
  return kgguf::fshr(lds32(sm, u.base + c), lds32(sm, u.base + c + 4), u.sh);
}

// Four bytes v (each < 128) → two bf16x2 A-fragment registers (b0 − OFF, b1 − OFF), (b2 − OFF,
// b3 − OFF), exactly: the permute makes bf16 128 + b (0x43 is the high byte of 128.0; b fits the
// 7-bit mantissa), the bf16 FMA subtracts 128 + OFF (exact: small integers).
template <int OFF>
__device__ __forceinline__ void cvt4(uint32_t v, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t neg = (0xC300u | OFF) * 0x00010001u;  // bf16x2 -(128 + OFF)
  lo = kgguf::bf2_fma(kgguf::prmt(v, 0x43434343u, 0x4140u), kOne2, neg);
  hi = kgguf::bf2_fma(kgguf::prmt(v, 0x43434343u, 0x4342u), kOne2, neg);
}
// Byte J of w (an unsigned 8-bit value) as an exact float, minus BIAS: the permute builds the
// float 2^23 + byte, one FADD removes 2^23 + BIAS.
template <int J, int BIAS>
__device__ __forceinline__ float bytef(uint32_t w) {
  return kgguf::u2f(kgguf::prmt(w, 0x4B000000u, 0x7540u | J)) - (8388608.0f + static_cast<float>(BIAS));
}
// Byte J of w (< 128) broadcast as a bf16x2 pair (the min fragments).
template <int J>
__device__ __forceinline__ uint32_t bcast(uint32_t w) {
  return kgguf::bf2_fma(kgguf::prmt(w, 0x43434343u, 0x4040u | (J << 8) | J), kOne2, 0xC300C300u);
}
// Four int8 in v → two bf16x2 registers (exact: |q| <= 128), through exact floats.
__device__ __forceinline__ void cvt_i8x4(uint32_t v, uint32_t& lo, uint32_t& hi) {
  const uint32_t u = v ^ 0x80808080u;  // q + 128
  const float f0 = bytef<0, 128>(u), f1 = bytef<1, 128>(u), f2 = bytef<2, 128>(u), f3 = bytef<3, 128>(u);
  lo = kgguf::prmt(kgguf::f2u(f0), kgguf::f2u(f1), 0x7632u);  // the high halves: bf16(q), exact
  hi = kgguf::prmt(kgguf::f2u(f2), kgguf::f2u(f3), 0x7632u);
}
// Bit i of the 4-bit value b → bit 4 of byte i (spread without carries: the four shifted copies
// of b do not overlap).
__device__ __forceinline__ uint32_t spread4(uint32_t b) { return ((b & 15u) * 0x02040810u) & 0x10101010u; }

// f(std::integral_constant<int, I>) for I = B .. E-1, in order (a compile-time loop index).
template <int B, int E, typename F>
__device__ __forceinline__ void sfor(F&& f) {
  if constexpr (B < E) {
    f(std::integral_constant<int, B>{});
    sfor<B + 1, E>(f);
  }
}

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  kgemm::mma_16816(c, a0, a1, a2, a3, b0, b1);
}
// c = A·B (a fresh accumulator: C is zero, no register moves).
__device__ __forceinline__ void mma0(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                     uint32_t b1) {
#ifndef KERN_HOST_EMU
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
#else
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  kgemm::mma_16816(c, a0, a1, a2, a3, b0, b1);
#endif
}

// ------------------------------------------------------------------ per-type unit code
// T::unit(acc, sm, oA, oB, nb, xr, t): one unit of lane (g = lane/4, t = lane%4): rows g
// (bytes at sm + oA) and g + 8 (sm + oB), x of token g at xr (the unit's first element; for a
// token >= M any valid row: that MMA column is never stored). acc[0], acc[1]: row g, tokens 2t, 2t+1; acc[2], acc[3]: row g+8. nb = blocks in the unit
// (< UE/BE only in the last unit of a 32-element type). In every MMA, lane t's k-slots
// {2t, 2t+1 | 2t+8, 2t+9} hold the elements named at its fragments below.
// ALIGN: the alignment of a unit's first byte (W 16-byte aligned).


// acc += d·blk − dmin·cmin per row (the K-quants with mins); dd = a block's (d | dmin << 16).
__device__ __forceinline__ void finish_dmin(float (&acc)[4], const float (&blk)[4], const float (&cmin)[4], uint32_t ddA,
                                            uint32_t ddB) {
  const float dA = kgguf::h2f(ddA & 0xffffu), mA = kgguf::h2f(ddA >> 16);
  const float dB = kgguf::h2f(ddB & 0xffffu), mB = kgguf::h2f(ddB >> 16);
  acc[0] = fmaf(-mA, cmin[0], fmaf(dA, blk[0], acc[0]));
  acc[1] = fmaf(-mA, cmin[1], fmaf(dA, blk[1], acc[1]));
  acc[2] = fmaf(-mB, cmin[2], fmaf(dB, blk[2], acc[2]));
  acc[3] = fmaf(-mB, cmin[3], fmaf(dB, blk[3], acc[3]));
}
// acc += d·c per row.
__device__ __forceinline__ void scale_add(float (&acc)[4], const float (&c)[4], float dA, float dB) {
  acc[0] = fmaf(dA, c[0], acc[0]);
  acc[1] = fmaf(dA, c[1], acc[1]);
  acc[2] = fmaf(dB, c[2], acc[2]);
  acc[3] = fmaf(dB, c[3], acc[3]);
}

// The 6-bit scales and mins of a Q4_K / Q5_K super-block from its 16-byte header h (d, dmin,
// scales[12]): sc[0] holds sub-blocks 0..3 (one per byte), sc[1] 4..7; likewise mn.
__device__ __forceinline__ void kscales(const uint4& h, uint32_t (&sc)[2], uint32_t (&mn)[2]) {
  sc[0] = h.y & 0x3F3F3F3Fu;
  mn[0] = h.z & 0x3F3F3F3Fu;
  sc[1] = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
  mn[1] = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
}

// Q4_K / Q5_K: 8 groups j of 32 (6-bit scale sc_j and min m_j); element l of group j is the
// nibble j%2 of qs[32·(j/2) + l] (+ bit j of qh[l] as bit 4 for Q5_K). Lane t takes l = 8t .. 8t+7:
// MMA 1 elements 8t..8t+3, MMA 2 8t+4..8t+7; x = 16 bytes at element 32j + 8t.
template <bool Q5>
struct GK45 {
  static constexpr int BE = 256, BB = Q5 ? 176 : 144, UE = 256, ALIGN = 16;
  static constexpr int QS = Q5 ? 48 : 16;
  template <int J>
  __device__ static __forceinline__ uint32_t hbit(uint32_t w) {  // bit J of each byte → bit 4
    if constexpr (J <= 4) return (w << (4 - J)) & 0x10101010u;
    else return (w >> (J - 4)) & 0x10101010u;
  }
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int, const bf16* xr, int t) {
    const bf16* const xq = xr + 8 * t;  // this lane's x (token g) at the unit's first element
    const uint4 hA = lds128(sm, oA), hB = lds128(sm, oB);
    uint32_t scA[2], mnA[2], scB[2], mnB[2];
    kscales(hA, scA, mnA);
    kscales(hB, scB, mnB);
    uint2 qhA = make_uint2(0, 0), qhB = make_uint2(0, 0);
    if constexpr (Q5) {
      qhA = lds64(sm, oA + 16 + 8 * t);
      qhB = lds64(sm, oB + 16 + 8 * t);
    }
    float blk[4] = {0.f, 0.f, 0.f, 0.f}, cmin[4] = {0.f, 0.f, 0.f, 0.f};
    sfor<0, 8>([&](auto jc) {
      constexpr int j = decltype(jc)::value, c = j / 2, sh = 4 * (j % 2);
      const uint2 qA = lds64(sm, oA + QS + 32 * c + 8 * t), qB = lds64(sm, oB + QS + 32 * c + 8 * t);
      const uint4 xv = ldx16(xq + 32 * j);
      uint32_t vA0 = (qA.x >> sh) & 0x0F0F0F0Fu, vA1 = (qA.y >> sh) & 0x0F0F0F0Fu;
      uint32_t vB0 = (qB.x >> sh) & 0x0F0F0F0Fu, vB1 = (qB.y >> sh) & 0x0F0F0F0Fu;
      if constexpr (Q5) {
        vA0 |= hbit<j>(qhA.x);
        vA1 |= hbit<j>(qhA.y);
        vB0 |= hbit<j>(qhB.x);
        vB1 |= hbit<j>(qhB.y);
      }
      uint32_t a0, a1, a2, a3, b0, b1, b2, b3;
      cvt4<0>(vA0, a0, a2);
      cvt4<0>(vB0, a1, a3);
      cvt4<0>(vA1, b0, b2);
      cvt4<0>(vB1, b1, b3);
      float cq[4];
      mma0(cq, a0, a1, a2, a3, xv.x, xv.y);
      mma(cq, b0, b1, b2, b3, xv.z, xv.w);
      const float sa = bytef<j % 4, 0>(scA[j / 4]), sb = bytef<j % 4, 0>(scB[j / 4]);
      blk[0] = fmaf(sa, cq[0], blk[0]);
      blk[1] = fmaf(sa, cq[1], blk[1]);
      blk[2] = fmaf(sb, cq[2], blk[2]);
      blk[3] = fmaf(sb, cq[3], blk[3]);
      const uint32_t ma = bcast<j % 4>(mnA[j / 4]), mb = bcast<j % 4>(mnB[j / 4]);
      mma(cmin, ma, mb, ma, mb, xv.x, xv.y);
      mma(cmin, ma, mb, ma, mb, xv.z, xv.w);
    });
    finish_dmin(acc, blk, cmin, hA.x, hB.x);
  }
};
typedef GK45<false> GQ4_K;
typedef GK45<true> GQ5_K;

// Q6_K: 16 groups j of 16 (int8 scale); group j = 8n + 2tq + h holds elements l = 16h .. 16h+15
// of quarter tq of half n: low nibbles of ql[64n + 32(tq%2) + l] (high nibbles for tq >= 2), bits
// 2tq of qh[32n + l]. Lane t: l = 16h + 4t .. +3, one MMA per group; x = 8 bytes at 16j + 4t.
// Blocks are 2-byte aligned: every word is read with ldu.
struct GQ6_K {
  static constexpr int BE = 256, BB = 210, UE = 256, ALIGN = 2;
  template <int TQ>
  __device__ static __forceinline__ uint32_t q6(uint32_t w0, uint32_t w1, uint32_t q) {  // the 4 values + 0 (0..63)
    if constexpr (TQ == 0) return (w0 & 0x0F0F0F0Fu) | ((q << 4) & 0x30303030u);
    else if constexpr (TQ == 1) return (w1 & 0x0F0F0F0Fu) | ((q << 2) & 0x30303030u);
    else if constexpr (TQ == 2) return ((w0 >> 4) & 0x0F0F0F0Fu) | (q & 0x30303030u);
    else return ((w1 >> 4) & 0x0F0F0F0Fu) | ((q >> 2) & 0x30303030u);
  }
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int, const bf16* xr, int t) {
    const bf16* const xq = xr + 4 * t;  // this lane's x (token g) at the unit's first element
    const Ua uA = ua(oA), uB = ua(oB);
    uint32_t sA[4], sB[4];  // int8 scales + 128, four per word
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sA[i] = ldu(sm, uA, 192 + 4 * i) ^ 0x80808080u;
      sB[i] = ldu(sm, uB, 192 + 4 * i) ^ 0x80808080u;
    }
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    sfor<0, 4>([&](auto nhc) {
      constexpr int n = decltype(nhc)::value / 2, h = decltype(nhc)::value % 2;
      constexpr int o = 64 * n + 16 * h;
      const uint32_t w0A = ldu(sm, uA, o + 4 * t), w1A = ldu(sm, uA, o + 32 + 4 * t);
      const uint32_t qA = ldu(sm, uA, 128 + 32 * n + 16 * h + 4 * t);
      const uint32_t w0B = ldu(sm, uB, o + 4 * t), w1B = ldu(sm, uB, o + 32 + 4 * t);
      const uint32_t qB = ldu(sm, uB, 128 + 32 * n + 16 * h + 4 * t);
      sfor<0, 4>([&](auto tqc) {
        constexpr int tq = decltype(tqc)::value, j = 8 * n + 2 * tq + h;
        const uint2 xv = ldx8(xq + 16 * j);
        uint32_t a0, a1, a2, a3;
        cvt4<32>(q6<tq>(w0A, w1A, qA), a0, a2);
        cvt4<32>(q6<tq>(w0B, w1B, qB), a1, a3);
        float cq[4];
        mma0(cq, a0, a1, a2, a3, xv.x, xv.y);
        const float sa = bytef<j % 4, 128>(sA[j / 4]), sb = bytef<j % 4, 128>(sB[j / 4]);
        blk[0] = fmaf(sa, cq[0], blk[0]);
        blk[1] = fmaf(sa, cq[1], blk[1]);
        blk[2] = fmaf(sb, cq[2], blk[2]);
        blk[3] = fmaf(sb, cq[3], blk[3]);
      });
    });
    scale_add(acc, blk, kgguf::h2f(lds16(sm, oA + 208)), kgguf::h2f(lds16(sm, oB + 208)));
  }
};

// Q2_K: 16 groups j = 8n + 2s + h of 16 (4-bit scale and min in scales[j]); element l = 16h .. 16h+15
// is bits 2s of qs[32n + l]. Lane t: l = 16h + 4t .. +3; x = 8 bytes at 16j + 4t.
struct GQ2_K {
  static constexpr int BE = 256, BB = 84, UE = 256, ALIGN = 4;
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int, const bf16* xr, int t) {
    const bf16* const xq = xr + 4 * t;  // this lane's x (token g) at the unit's first element
    uint32_t scA[4], mnA[4], scB[4], mnB[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t a = lds32(sm, oA + 4 * i), b = lds32(sm, oB + 4 * i);
      scA[i] = a & 0x0F0F0F0Fu;
      mnA[i] = (a >> 4) & 0x0F0F0F0Fu;
      scB[i] = b & 0x0F0F0F0Fu;
      mnB[i] = (b >> 4) & 0x0F0F0F0Fu;
    }
    float blk[4] = {0.f, 0.f, 0.f, 0.f}, cmin[4] = {0.f, 0.f, 0.f, 0.f};
    sfor<0, 4>([&](auto nhc) {
      constexpr int n = decltype(nhc)::value / 2, h = decltype(nhc)::value % 2;
      const uint32_t wA = lds32(sm, oA + 16 + 32 * n + 16 * h + 4 * t), wB = lds32(sm, oB + 16 + 32 * n + 16 * h + 4 * t);
      sfor<0, 4>([&](auto sc_) {
        constexpr int s = decltype(sc_)::value, j = 8 * n + 2 * s + h;
        const uint2 xv = ldx8(xq + 16 * j);
        uint32_t a0, a1, a2, a3;
        cvt4<0>((wA >> (2 * s)) & 0x03030303u, a0, a2);
        cvt4<0>((wB >> (2 * s)) & 0x03030303u, a1, a3);
        float cq[4];
        mma0(cq, a0, a1, a2, a3, xv.x, xv.y);
        const float sa = bytef<j % 4, 0>(scA[j / 4]), sb = bytef<j % 4, 0>(scB[j / 4]);
        blk[0] = fmaf(sa, cq[0], blk[0]);
        blk[1] = fmaf(sa, cq[1], blk[1]);
        blk[2] = fmaf(sb, cq[2], blk[2]);
        blk[3] = fmaf(sb, cq[3], blk[3]);
        const uint32_t ma = bcast<j % 4>(mnA[j / 4]), mb = bcast<j % 4>(mnB[j / 4]);
        mma(cmin, ma, mb, ma, mb, xv.x, xv.y);
      });
    });
    finish_dmin(acc, blk, cmin, lds32(sm, oA + 80), lds32(sm, oB + 80));
  }
};

// Q3_K: 16 groups as Q2_K; q = bits 2s of qs[32n + l] − 4 unless bit 4n+s of hmask[l] is set;
// 6-bit signed scales (−32) packed in 12 bytes. Lane t: l = 16h + 4t .. +3. 2-byte aligned.
struct GQ3_K {
  static constexpr int BE = 256, BB = 110, UE = 256, ALIGN = 2;
  __device__ static __forceinline__ void scales(const uint8_t* sm, Ua u, uint32_t (&sw)[4]) {
    const uint32_t b0 = ldu(sm, u, 96), b1 = ldu(sm, u, 100), b2 = ldu(sm, u, 104);
    sw[0] = (b0 & 0x0F0F0F0Fu) | ((b2 << 4) & 0x30303030u);         // groups 0..3
    sw[1] = (b1 & 0x0F0F0F0Fu) | ((b2 << 2) & 0x30303030u);         // 4..7
    sw[2] = ((b0 >> 4) & 0x0F0F0F0Fu) | (b2 & 0x30303030u);         // 8..11
    sw[3] = ((b1 >> 4) & 0x0F0F0F0Fu) | ((b2 >> 2) & 0x30303030u);  // 12..15
  }
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int, const bf16* xr, int t) {
    const bf16* const xq = xr + 4 * t;  // this lane's x (token g) at the unit's first element
    const Ua uA = ua(oA), uB = ua(oB);
    uint32_t swA[4], swB[4];
    scales(sm, uA, swA);
    scales(sm, uB, swB);
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
    sfor<0, 4>([&](auto nhc) {
      constexpr int n = decltype(nhc)::value / 2, h = decltype(nhc)::value % 2;
      const uint32_t wA = ldu(sm, uA, 32 + 32 * n + 16 * h + 4 * t), wB = ldu(sm, uB, 32 + 32 * n + 16 * h + 4 * t);
      const uint32_t mA = ldu(sm, uA, 16 * h + 4 * t), mB = ldu(sm, uB, 16 * h + 4 * t);
      sfor<0, 4>([&](auto sc_) {
        constexpr int s = decltype(sc_)::value, j = 8 * n + 2 * s + h;
        const uint2 xv = ldx8(xq + 16 * j);
        uint32_t a0, a1, a2, a3;  // q + 4 = bits + 4·hmask bit (0..7)
        cvt4<4>(((wA >> (2 * s)) & 0x03030303u) | (((mA >> (4 * n + s)) & 0x01010101u) << 2), a0, a2);
        cvt4<4>(((wB >> (2 * s)) & 0x03030303u) | (((mB >> (4 * n + s)) & 0x01010101u) << 2), a1, a3);
        float cq[4];
        mma0(cq, a0, a1, a2, a3, xv.x, xv.y);
        const float sa = bytef<j % 4, 32>(swA[j / 4]), sb = bytef<j % 4, 32>(swB[j / 4]);
        blk[0] = fmaf(sa, cq[0], blk[0]);
        blk[1] = fmaf(sa, cq[1], blk[1]);
        blk[2] = fmaf(sb, cq[2], blk[2]);
        blk[3] = fmaf(sb, cq[3], blk[3]);
      });
    });
    scale_add(acc, blk, kgguf::h2f(lds16(sm, oA + 108)), kgguf::h2f(lds16(sm, oB + 108)));
  }
};

// The 32-element types: a unit is 4 blocks (nb of them valid); per block acc += d·(Σ x·q)
// (+ m·Σx). Lane t, Q8_0: elements 8t .. 8t+7 (x 16 bytes at 32b + 8t); Q4_*/Q5_*: qs[4t .. 4t+3],
// whose low nibbles are elements 4t .. 4t+3 (MMA 1, x 8 bytes at 32b + 4t) and high nibbles
// 16 + 4t .. (MMA 2, x at 32b + 16 + 4t).
struct GQ8_0 {
  static constexpr int BE = 32, BB = 34, UE = 128, ALIGN = 2;
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int nb, const bf16* xr, int t) {
    const bf16* const xq = xr + 8 * t;  // this lane's x (token g) at the unit's first element
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      if (b < nb) {  // warp-uniform
        const int pa = oA + 34 * b, pb = oB + 34 * b;
        const uint4 xv = ldx16(xq + 32 * b);
        uint32_t a0, a1, a2, a3, b0, b1, b2, b3;
        const Ua qa = ua(pa + 2), qb = ua(pb + 2);  // qs
        cvt_i8x4(ldu(sm, qa, 8 * t), a0, a2);
        cvt_i8x4(ldu(sm, qb, 8 * t), a1, a3);
        cvt_i8x4(ldu(sm, qa, 8 * t + 4), b0, b2);
        cvt_i8x4(ldu(sm, qb, 8 * t + 4), b1, b3);
        float cq[4];
        mma0(cq, a0, a1, a2, a3, xv.x, xv.y);
        mma(cq, b0, b1, b2, b3, xv.z, xv.w);
        scale_add(acc, cq, kgguf::h2f(lds16(sm, pa)), kgguf::h2f(lds16(sm, pb)));
      }
    }
  }
};

// Q4_0 (Q5 = false, MIN = false), Q4_1 (false, true), Q5_0 (true, false), Q5_1 (true, true).
template <bool Q5, bool MIN>
struct G32 {
  static constexpr int BE = 32, BB = 18 + (Q5 ? 4 : 0) + (MIN ? 2 : 0), UE = 128;
  static constexpr int ALIGN = MIN ? (Q5 ? 8 : 4) : 2;
  static constexpr int QH = MIN ? 4 : 2, QS = QH + (Q5 ? 4 : 0);  // byte offsets of qh, qs
  static constexpr int OFF = MIN ? 0 : (Q5 ? 16 : 8);            // q − OFF
  // The word at c (c % 4 == 0) past byte QH of a block, u = ua(block + QH) (4-aligned when ALIGN >= 4).
  __device__ static __forceinline__ uint32_t ldw(const uint8_t* sm, Ua u, int c) {
    if constexpr (ALIGN >= 4) return lds32(sm, u.base + c);
    else return ldu(sm, u, c);
  }
  __device__ static void unit(float (&acc)[4], const uint8_t* sm, int oA, int oB, int nb, const bf16* xr, int t) {
    const bf16* const xq = xr + 4 * t;  // this lane's x (token g) at the unit's first element
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      if (b < nb) {  // warp-uniform
        const int pa = oA + BB * b, pb = oB + BB * b;
        const uint2 x0 = ldx8(xq + 32 * b), x1 = ldx8(xq + 32 * b + 16);
        const Ua ua_ = ua(pa + QH), ub_ = ua(pb + QH);
        const uint32_t wA = ldw(sm, ua_, QS - QH + 4 * t), wB = ldw(sm, ub_, QS - QH + 4 * t);
        uint32_t loA = wA & 0x0F0F0F0Fu, hiA = (wA >> 4) & 0x0F0F0F0Fu;
        uint32_t loB = wB & 0x0F0F0F0Fu, hiB = (wB >> 4) & 0x0F0F0F0Fu;
        if constexpr (Q5) {
          const uint32_t hA = ldw(sm, ua_, 0), hB = ldw(sm, ub_, 0);
          loA |= spread4(hA >> (4 * t));
          hiA |= spread4(hA >> (16 + 4 * t));
          loB |= spread4(hB >> (4 * t));
          hiB |= spread4(hB >> (16 + 4 * t));
        }
        uint32_t a0, a1, a2, a3, b0, b1, b2, b3;
        cvt4<OFF>(loA, a0, a2);
        cvt4<OFF>(loB, a1, a3);
        cvt4<OFF>(hiA, b0, b2);
        cvt4<OFF>(hiB, b1, b3);
        float cq[4];
        mma0(cq, a0, a1, a2, a3, x0.x, x0.y);
        mma(cq, b0, b1, b2, b3, x1.x, x1.y);
        if constexpr (MIN) {
          const uint32_t dmA = lds32(sm, pa), dmB = lds32(sm, pb);  // d | m << 16
          float sx[4];  // Σx per token (A = 1)
          mma0(sx, kOne2, kOne2, kOne2, kOne2, x0.x, x0.y);
          mma(sx, kOne2, kOne2, kOne2, kOne2, x1.x, x1.y);
          scale_add(acc, cq, kgguf::h2f(dmA & 0xffffu), kgguf::h2f(dmB & 0xffffu));
          scale_add(acc, sx, kgguf::h2f(dmA >> 16), kgguf::h2f(dmB >> 16));
        } else {
          scale_add(acc, cq, kgguf::h2f(lds16(sm, pa)), kgguf::h2f(lds16(sm, pb)));
        }
      }
    }
  }
};
typedef G32<false, false> GQ4_0;
typedef G32<false, true> GQ4_1;
typedef G32<true, false> GQ5_0;
typedef G32<true, true> GQ5_1;

// ------------------------------------------------------------------ the GEMV
template <class T, int WARPS, int NST>
struct Geo {
  static constexpr int UBLK = T::UE / T::BE;                 // blocks per unit
  static constexpr int UB = UBLK * T::BB;                    // bytes per (full) unit
  static constexpr int P0 = (16 - T::ALIGN + UB + 15) / 16;  // granules covering a unit at the worst offset
  static constexpr int PIECES = P0 | 1;                      // odd: the 8 rows of a load phase hit distinct banks
  static constexpr int SROW = 16 * PIECES;                   // bytes per row in a stage
  static constexpr int STAGE = kRows * SROW;
  static constexpr int RING = NST * STAGE;                   // one warp's ring
  static constexpr int SMEM = WARPS * RING + 16;             // + 16: ldu may read one word past a row
  static_assert(RING >= 4 * 32 * 4, "a warp's ring holds its reduction slice");
};
template <int BYTES>
struct SmemBytes {
  uint8_t b[BYTES];
};

template <class T, int WARPS, int NST, typename OutT>
__device__ __forceinline__ void gemv_gguf(const bf16* __restrict__ x, const uint8_t* __restrict__ W,
                                          const bf16* __restrict__ bias, OutT* __restrict__ y, int M, int N, int K,
                                          int ldy, int col0) {
  typedef Geo<T, WARPS, NST> G;
  KERN_SMEM(SmemBytes<G::SMEM>, smem_);  // static when it fits 48 KB, else the launch's dynamic shared memory
  uint8_t* const sm = smem_.b;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * kRows;
  const int nblk = K / T::BE;                                    // blocks per row
  const long long rowB = static_cast<long long>(nblk) * T::BB;  // bytes per row
  const int nU = (nblk + G::UBLK - 1) / G::UBLK;                 // units per row
  const int ring = warp * G::RING;                               // this warp's ring

  // The copies: lanes 2r, 2r+1 take row r's granules (even / odd), so one copy instruction moves
  // 32 contiguous bytes of each of the 16 rows.
  const int cr = lane >> 1, ci = lane & 1;
  const bool crow_ok = n0 + cr < N;
  const uint8_t* const crow = W + static_cast<long long>(crow_ok ? n0 + cr : 0) * rowB;
  const kgguf::saddr_t cdst = kgguf::saddr(sm) + (ring + cr * G::SROW);  // row cr in stage 0
  auto issue = [&](int u, int st) {  // unit u of the 16 rows (those < N) into stage st
    if (!crow_ok) return;
    const uint8_t* s = crow + static_cast<long long>(u) * G::UB;
    const uint8_t* e = s + min(G::UBLK, nblk - u * G::UBLK) * T::BB;
    const uint8_t* a = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(s) & ~static_cast<uintptr_t>(15));
    const kgguf::saddr_t d = cdst + st * G::STAGE;
#pragma unroll
    for (int i = ci; i < G::PIECES; i += 2)
      if (a + 16 * i < e) kgguf::cp16(d + 16 * i, a + 16 * i);
  };
  // Where rows g and g + 8 of unit u start in stage st: their byte offset mod 16 is kept.
  const int offA = static_cast<int>(reinterpret_cast<uintptr_t>(W + static_cast<long long>(n0 + g) * rowB) & 15);
  const int offB = static_cast<int>(reinterpret_cast<uintptr_t>(W + static_cast<long long>(n0 + g + 8) * rowB) & 15);

  for (int m0 = 0; m0 < M; m0 += 8) {
#pragma unroll
    for (int s = 0; s < NST - 1; ++s) {
      const int u = warp + s * WARPS;
      if (u < nU) issue(u, s);
      kgguf::cp_commit();
    }
    if (m0 == 0) kgemm::pdl_wait();  // x is the previous kernel's output; W is not
    const int tok = m0 + g;
    const bf16* xrow = x + static_cast<long long>(tok < M ? tok : 0) * K;  // rows >= M: any valid row
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int i = 0;; ++i) {
      const int u = warp + i * WARPS;
      if (u >= nU) break;
      const int un = u + (NST - 1) * WARPS;
      if (un < nU) issue(un, (i + NST - 1) % NST);
      kgguf::cp_commit();
      kgguf::cp_wait<NST - 1>();  // unit u has landed (this lane's copies) ...
      __syncwarp();               // ... and every lane's
      const int st = ring + (i % NST) * G::STAGE, uo = u * G::UB;
      T::unit(acc, sm, st + g * G::SROW + ((offA + uo) & 15), st + (g + 8) * G::SROW + ((offB + uo) & 15),
              min(G::UBLK, nblk - u * G::UBLK), xrow + static_cast<long long>(u) * T::UE, t);
      __syncwarp();  // the stage is read before it is refilled
    }
    if (m0 + 8 >= M) kgemm::pdl_launch_dependents();

    // Cross-warp reduction: warp w's partials (acc[i] of lane l at i·32 + l) in the first 2 KB of
    // its own ring (its copies are all complete), then the CTA adds warps 0 .. WARPS-1 in order.
    float* mine = reinterpret_cast<float*>(sm + ring);
#pragma unroll
    for (int i = 0; i < 4; ++i) mine[i * 32 + lane] = acc[i];
    __syncthreads();
    if (threadIdx.x < 128) {
      const int idx = threadIdx.x, i = idx >> 5, ln = idx & 31;  // 4 values × 32 lanes
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) s += reinterpret_cast<const float*>(sm + w * G::RING)[idx];
      const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
      const int tk = m0 + 2 * (ln & 3) + (i & 1);
      if (row < N && tk < M) kgemm::store1(y, static_cast<long long>(tk) * ldy + col0 + row, s + kgemm::bias_at(bias, row));
    }
    __syncthreads();  // the rings are refilled by the next pass
  }
}

// ------------------------------------------------------------------ dequantization
// One thread per 8 consecutive elements of a row (one 16-byte store); D::deq8 is dequant.rs's
// arithmetic (gguf_blocks.cuh).
template <class D>
__device__ __forceinline__ void dequant_bf16(const uint8_t* __restrict__ W, bf16* __restrict__ dst, int N, int K, int row0) {
  kgemm::pdl_wait();  // dst may still be read by the kernel before (a scratch matrix)
  const long long total = static_cast<long long>(N) * K / 8;
  const long long tid = static_cast<long long>(blockIdx.x) * 256 + threadIdx.x;
  if (tid < total) {
    const long long e = tid * 8, n = e / K;
    const int c = static_cast<int>(e - n * K);
    const uint8_t* blk = W + n * (static_cast<long long>(K / D::BE) * D::BB) + static_cast<long long>(c / D::BE) * D::BB;
    float o[8];
    D::deq8(blk, c % D::BE, o);
    uint4 v;
    v.x = kgguf::bf16_bits(o[0]) | kgguf::bf16_bits(o[1]) << 16;
    v.y = kgguf::bf16_bits(o[2]) | kgguf::bf16_bits(o[3]) << 16;
    v.z = kgguf::bf16_bits(o[4]) | kgguf::bf16_bits(o[5]) << 16;
    v.w = kgguf::bf16_bits(o[6]) | kgguf::bf16_bits(o[7]) << 16;
    *reinterpret_cast<uint4*>(dst + (static_cast<long long>(row0) + n) * K + c) = v;
  }
  kgemm::pdl_launch_dependents();
}

}  // namespace

// ------------------------------------------------------------------ entries
// gemv_<t>[_f32out](x, W, bias, y, M, N, K, ldy, col0): 4 warps, grid [ceil(N/16)], block [128],
//   shared 0 (static, <= 46 KB).
// gemv_<t>_w8[_f32out](same): 8 warps split K (twice the warps per 16 rows: for narrow N, where
//   ceil(N/16) CTAs do not fill the GPU), grid [ceil(N/16)], block [256], shared = the dynamic
//   bytes KERNELS.md lists (0 where the ring fits 48 KB statically). Other bits than gemv_<t>.
// dequant_<t>_bf16(W, dst, N, K, row0): grid [ceil(N*K/2048)], block [256], shared 0.
#define KGGUF_GEMV(NAME, G, WARPS, MINB, OUT)                                                                 \
  extern "C" __global__ void __launch_bounds__(32 * WARPS, MINB)                                              \
      NAME(const __nv_bfloat16* x, const unsigned char* W, const __nv_bfloat16* bias, OUT* y, int M, int N, int K, \
           int ldy, int col0) {                                                                               \
    gemv_gguf<G, WARPS, 3, OUT>(x, W, bias, y, M, N, K, ldy, col0);                                           \
  }
#define KGGUF_ENTRIES(NAME, G, D)                                                                   \
  KGGUF_GEMV(gemv_##NAME, G, 4, 4, __nv_bfloat16)                                                   \
  KGGUF_GEMV(gemv_##NAME##_f32out, G, 4, 4, float)                                                  \
  KGGUF_GEMV(gemv_##NAME##_w8, G, 8, 2, __nv_bfloat16)                                              \
  KGGUF_GEMV(gemv_##NAME##_w8_f32out, G, 8, 2, float)                                               \
  extern "C" __global__ void __launch_bounds__(256)                                                 \
      dequant_##NAME##_bf16(const unsigned char* W, __nv_bfloat16* dst, int N, int K, int row0) {   \
    dequant_bf16<kgguf::D>(W, dst, N, K, row0);                                                     \
  }

KGGUF_ENTRIES(q4_0, GQ4_0, DqQ4_0)
KGGUF_ENTRIES(q4_1, GQ4_1, DqQ4_1)
KGGUF_ENTRIES(q5_0, GQ5_0, DqQ5_0)
KGGUF_ENTRIES(q5_1, GQ5_1, DqQ5_1)
KGGUF_ENTRIES(q8_0, GQ8_0, DqQ8_0)
KGGUF_ENTRIES(q2_k, GQ2_K, DqQ2_K)
KGGUF_ENTRIES(q3_k, GQ3_K, DqQ3_K)
KGGUF_ENTRIES(q4_k, GQ4_K, DqQ4_K)
KGGUF_ENTRIES(q5_k, GQ5_K, DqQ5_K)
KGGUF_ENTRIES(q6_k, GQ6_K, DqQ6_K)
