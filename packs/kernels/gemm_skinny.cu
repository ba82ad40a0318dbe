//! Skinny GEMM for decode: y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias[N]) with few rows of x
//! (M = 1..64). Bandwidth-bound: every byte of W is read exactly once per pass.
//!
//! Design (swap-AB on tensor cores). A 16-row block of W (16 outputs) is owned by one CTA, or
//! by a thread-block cluster of C CTAs that split its K. The P = WARPS·C warps of the block
//! ("virtual warps" v = rank·WARPS + warp) split K in 64-wide chunks: v takes chunks v, v+P,
//! v+2P, ... so the block streams its 16 rows contiguously. Each warp multiplies its 16 W rows
//! (the m16 side of mma.m16n8k16) by 8 tokens of x (the n8 side), MT such n-tiles per pass.
//! W is loaded straight from global memory into the A-fragment registers with 16-byte
//! streaming loads: the reduction over K does not care about the order of k, so each lane's 16
//! contiguous bytes (8 k values) are used as its k-slots of two consecutive MMAs, and x is
//! loaded with the same permutation into the B fragments. The warps' partial sums meet in
//! shared memory (sum over warps 0..WARPS-1 in order); with C > 1 the cluster's CTAs then add
//! the C per-CTA partials in rank order 0..C-1 through distributed shared memory (mapa +
//! ld.shared::cluster between two cluster barriers). No split-K workspace, no atomics.
//!
//! Determinism across entries: the reduction order of one output element depends only on
//! (WARPS, C, K) — never on MT, U or M (each warp adds exactly its in-range chunks, in
//! increasing k, whatever U is; each MMA output element depends only on its own row, token
//! and accumulator). So for one (N, K) the manifest must use ONE (WARPS, C) for
//! all M ranges; then speculative verification (M = k+1) reproduces plain decoding bit for bit.
//!
//! Entries (M rows per pass; larger M loops over passes and re-reads W, correct but slow):
//!   cluster family, 4 warps, block [128, 1, 1], grid [ceil(N/16)·C, 1, 1], C ∈ {1, 2, 4}:
//!   gemv_bf16_cC / gemv_bf16_cC_f32out            M ≤ 8 per pass   (MT = 1)
//!   gemm_bf16_m16_cC / gemm_bf16_m16_cC_f32out    M ≤ 16 per pass  (MT = 2)
//!   gemm_bf16_m32_cC / gemm_bf16_m32_cC_f32out    M ≤ 32 per pass  (MT = 4)
//!   gemm_bf16_m64_cC / gemm_bf16_m64_cC_f32out    M ≤ 64 per pass  (MT = 8)
//!   original family, 8 warps, one CTA per block, block [256, 1, 1], grid [ceil(N/16), 1, 1]:
//!   gemv_bf16, gemm_bf16_m16, gemm_bf16_m32, gemm_bf16_m64 (+ _f32out), gemv_bf16_pf
//!   (as gemv_bf16, plus an L2 bulk prefetch; experimental). Kept for A/B timing.
//!   fused decode GEMVs (8-warp gemv_bf16 with another x operand / epilogue, same bits; end of
//!   file): gemv_bf16_rms (+ _pf), gemv_bf16_add, gemv_bf16_swiglu_add, gemv_bf16_swiglu.
//! Dynamic shared = 0. Requires K % 8 == 0 and 16-byte aligned x and W; any M, N.
#include "gemm_common.cuh"
#ifndef KERN_HOST_EMU
#include "gemm_cluster.cuh"
#endif
#include "rowwise_math.cuh"  // the fused entries' x operand: rowwise.cu's RMSNorm / SwiGLU arithmetic

#include <type_traits>

using namespace kgemm;

namespace {

constexpr int kRows = 16;    // W rows (outputs) per block
constexpr int kChunk = 64;   // K elements per warp per sub-step

// cluster_ctarank, cluster_sync_all, ld_dsmem_f32: gemm_cluster.cuh (included above; under
// KERN_HOST_EMU, gemm_skinny_emu.h below)

// f(std::integral_constant<int, I>) for I = B .. E-1, in order (compile-time loop index).
template <int B, int E, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  if constexpr (B < E) {
    f(std::integral_constant<int, B>{});
    static_for<B + 1, E>(f);
  }
}

#ifndef KERN_HOST_EMU
// As ld_stream_16 / ld_cached_16 (gemm_common.cuh), at a compile-time byte offset from `p`:
// the offset goes into the instruction's immediate, so all loads of a sub-step group share
// one address register per row. With a register pair per load (what the plain helpers gave)
// the 16 weight + 8 activation loads of a gemv group need ~48 address registers and, at the
// 128-register cap, ptxas issued 5 of the weight loads only after the first MMA — i.e. one
// DRAM latency later.
template <int OFF>
__device__ __forceinline__ uint4 ld_stream_16_at(const void* p, bool pred) {
  uint4 v;
  asm("{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4+%6];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)), "n"(OFF));
  return v;
}
template <int OFF>
__device__ __forceinline__ uint4 ld_cached_16_at(const void* p, bool pred) {
  uint4 v;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " setp.ne.b32 p, %5, 0;\n"
      " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
      " @p ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4+%6];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(pred)), "n"(OFF)
      : "memory");
  return v;
}
#else  // packs/kernels/verify/host_emu: these helpers on the CPU (cubins unaffected)
#include "gemm_skinny_emu.h"
#endif

// Phase 1 of UU sub-steps of one warp at k = kb (pa = wA + kb, pb = wB + kb, krem = K - kb - 8q):
// all weight loads in flight at once (4·UU loads of 16 B per lane). wA / wB already include
// this lane's + 8q; the offsets (u·kStride + 32h)·2 bytes are compile-time constants, so they
// become the loads' immediates (one address register per row).
template <int UU, int kStride>
__device__ __forceinline__ void skinny_load(uint4 (&wa)[UU][2], uint4 (&wb)[UU][2], const bf16* pa,
                                            const bf16* pb, int krem, bool vA, bool vB) {
  static_for<0, 2 * UU>([&](auto i) {
    constexpr int u = decltype(i)::value / 2, h = decltype(i)::value % 2, off = u * kStride + h * 32;
    const bool kv = off < krem;  // K % 8 == 0: a 16-byte chunk is all in or all out
    wa[u][h] = ld_stream_16_at<off * 2>(pa, kv && vA);
    wb[u][h] = ld_stream_16_at<off * 2>(pb, kv && vB);
  });
}

// ---- The x operand. A policy gives the 16 bytes (8 k values) of x that lane (g, q) feeds into
// its B fragments for token `tok` at k = kb + q·8 + OFF (OFF = u·kStride + 32h, a compile-time
// constant), zeros when !(tok < M && kv). `pass_begin` runs once per pass of 8·MT tokens (all
// threads, after pdl_wait) and `group` once per sub-step group of a warp (after its weight loads
// are issued, before its MMAs). Only how x is obtained differs between policies: the MMAs, their
// order and the reduction are the same for every entry.

// x read from memory (every entry but the fused ones).
struct XLoad {
  const bf16* __restrict__ x;
  __device__ __forceinline__ void pass_begin(int, int, int) {}
  template <int UU, int kStride>
  __device__ __forceinline__ void group(int, int, int, int) {}
  template <int U_, int H_, int OFF>
  __device__ __forceinline__ uint4 get(int tok, int kb, int q, int M, int K, bool kv) const {
    return ld_cached_16_at<OFF * 2>(x + (long long)tok * K + kb + q * 8, tok < M && kv);
  }
};

// Phase 2: per sub-step and 32-wide half, the activations (L1/L2 hits after the first CTA)
// and the MMAs. Loading x per half keeps MT·4 registers of x live, not MT·8.
template <int MT, int UU, int kStride, class XS>
__device__ __forceinline__ void skinny_mma(float (&acc)[MT][4], const uint4 (&wa)[UU][2], const uint4 (&wb)[UU][2],
                                           const XS& xs, int kb, int m0, int M, int K, int g, int q) {
  const int krem = K - kb - q * 8;
  static_for<0, UU>([&](auto ui) {
    constexpr int u = decltype(ui)::value;
    static_for<0, 2>([&](auto hi) {
      constexpr int h = decltype(hi)::value, off = u * kStride + h * 32;
      const bool kv = off < krem;
      uint4 xv[MT];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int tok = m0 + 8 * t + g;
        xv[t] = xs.template get<u, h, off>(tok, kb, q, M, K, kv);
      }
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        // k-slots {2q,2q+1 | 2q+8,2q+9} of MMA j hold physical k {8q+4j+0,1 | 8q+4j+2,3}.
        mma_16816(acc[t], wa[u][h].x, wb[u][h].x, wa[u][h].y, wb[u][h].y, xv[t].x, xv[t].y);
        mma_16816(acc[t], wa[u][h].z, wb[u][h].z, wa[u][h].w, wb[u][h].w, xv[t].z, xv[t].w);
      }
    });
  });
}

// UU sub-steps of one warp starting at k = kb: 16 rows × 64 k each, W straight into the A
// fragments, x (MT n-tiles of 8 tokens from m0) into the B fragments.
template <int MT, int UU, int kStride, class XS>
__device__ __forceinline__ void skinny_steps(float (&acc)[MT][4], XS& xs,
                                             const bf16* __restrict__ wA, const bf16* __restrict__ wB,
                                             bool vA, bool vB, int kb, int m0, int M, int K, int g, int q) {
  uint4 wa[UU][2], wb[UU][2];
  skinny_load<UU, kStride>(wa, wb, wA + kb, wB + kb, K - kb - q * 8, vA, vB);
  xs.template group<UU, kStride>(kb, m0, M, K);
  skinny_mma<MT, UU, kStride>(acc, wa, wb, xs, kb, m0, M, K, g, q);
}

// ---- The epilogue: what becomes of an output element v = Σ + bias at y[idx], idx = tok·N + row.
struct EpStore {  // every entry but the fused ones
  template <typename OutT>
  __device__ __forceinline__ void operator()(OutT* y, long long idx, float v) const { store1(y, idx, v); }
};

// ---- The fused decode GEMVs' policies (GEMM.md, "Fused decode GEMVs"). One pass is 8 tokens
// (MT = 1); every value they produce is bit-identical to what the unfused kernels of rowwise.cu
// write (the arithmetic is shared: rowwise_math.cuh).

// Residual epilogue (gemv_bf16_add, gemv_bf16_swiglu_add): y = bf16(v) as always, and the fp32
// residual row gets it added, res += float(y) — add_rms_norm_f32's residual update (an fp32
// add of the bf16 value), made where y is produced. N = the residual's row length.
struct EpAddRes {
  float* __restrict__ res;
  __device__ __forceinline__ void operator()(bf16* y, long long idx, float v) const {
    const bf16 o = __float2bfloat16_rn(v);
    y[idx] = o;
    res[idx] = res[idx] + __bfloat162float(o);
  }
};

// The fused x operands are computed, not loaded: each value costs arithmetic (SiLU ~20
// instructions) and every CTA needs all of x. So a warp computes each value it needs once,
// spread over its 32 lanes, into a warp-private tile in shared memory, and its MMA phase reads
// the B fragments from the tile. XTile::group (after the group's weight loads are issued):
// lane l takes the 16-byte piece of x at k = kb + (l >> 3)·kStride + (l & 7)·8 (sub-step
// l >> 3 < UU, 8 k values) for every token of the pass, P::TB tokens' loads in flight at once.
// Tokens >= M read as zeros (get), k >= K is zeros in the tile. The computed x is also an
// output of the op (h, act): a piece of the 64-chunk c is stored to P::out by the CTA
// c % gridDim.x (each CTA computes all of x; the stores are spread over the grid).
// P (the piece) supplies the arithmetic: P::column (what every token's piece at k shares),
// P::load (one token's inputs), P::make (the 8 values), P::store (the owning CTA's stores of a
// piece: the 8 values to P::out, and whatever else the op writes there, e.g. the new residual)
// and P::pass_begin (per pass, all threads, after pdl_wait: P's own preparation).
template <class P>
struct XTile {
  static constexpr int kRow = 4 * kChunk + 32;  // tile row: U <= 4 sub-steps, + 64 bytes (no bank conflicts)
  static constexpr int TB = P::TB;              // tokens whose loads are in flight at once
  P p;
  bf16* tile;                                   // this warp's [8][kRow] tile in shared memory
  __device__ __forceinline__ void pass_begin(int m0, int M, int K) { p.pass_begin(m0, M, K); }
  template <int UU, int kStride>
  __device__ __forceinline__ void group(int kb, int m0, int M, int K) {
    const int lane = threadIdx.x & 31, u = lane >> 3, j = lane & 7;
    const int k = kb + u * kStride + j * 8;
    const bool kv = u < UU && k < K;
    __syncwarp();  // the previous group's reads of the tile are done
    if (u < UU) {
      const bool own = kv && (k >> 6) % gridDim.x == blockIdx.x;
      const typename P::Col col = p.column(k, kv);
#pragma unroll 1
      for (int t0 = 0; t0 < 8; t0 += TB) {
        if (m0 + t0 < M) {  // warp-uniform
          typename P::In in[TB];
#pragma unroll
          for (int i = 0; i < TB; ++i) in[i] = p.load(m0 + t0 + i, k, K, kv && m0 + t0 + i < M);
#pragma unroll
          for (int i = 0; i < TB; ++i) {
            const int tok = m0 + t0 + i;
            if (tok < M) {
              const uint4 o = kv ? p.make(in[i], col, t0 + i) : make_uint4(0, 0, 0, 0);
              *reinterpret_cast<uint4*>(tile + (t0 + i) * kRow + u * kChunk + j * 8) = o;
              if (own) p.store(tok, k, K, o, in[i], col, t0 + i);
            }
          }
        }
      }
    }
    __syncwarp();  // the tile is written
  }
  template <int U_, int H_, int OFF>
  __device__ __forceinline__ uint4 get(int tok, int, int q, int M, int, bool) const {
    const int g = (threadIdx.x & 31) >> 2;
    return tok < M ? *reinterpret_cast<const uint4*>(tile + g * kRow + U_ * kChunk + H_ * 32 + q * 8)
                   : make_uint4(0, 0, 0, 0);
  }
};

__device__ __forceinline__ uint4 ldg16(const void* p, bool ok) {
  return ok ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// x = rms_norm_f32(res)·w (gemv_bf16_rms; K = hidden). pass_begin computes each token row's
// rstd exactly as rms_row_f32's vector path: 128 threads per row (thread v adds the float4
// chunks v, v + 128, … with rms_acc4), warp_sum, then warp_sum of the 4 warp sums in lanes 0..3
// (block_sum's order for 128 threads), rms_rstd; the CTA's two halves take the rows t ≡ 0 and
// 1 (mod 2). A piece is rms_scale4 of the row's 8 fp32 values with the weight's 8 (column).
// OFF (gemv_bf16_rms_off): the zero-centred weight of rms_norm_f32_off, rms_scale4_off with `off`.
template <bool OFF>
struct PieceRmsT {
  static constexpr int TB = 2;  // 3 or 4 spill (60 / 172 bytes at the 128-register cap)
  struct In { uint4 a, b; };
  typedef uint4 Col;
  bf16* __restrict__ out;          // [M, K] the normalized rows (h)
  const float* __restrict__ res;   // [M, K] fp32 residual rows
  const bf16* __restrict__ nw;     // [K] norm weight
  float eps;
  const float* rstd;               // shared [8]: the pass's rstd per token (pass_begin)
  float off;                       // OFF: the weight's offset (1: Hugging Face weights)
  __device__ __forceinline__ void pass_begin(int m0, int M, int K) {
    __shared__ float wsum[8][4];
    __shared__ float rs[8];
    const int tid = threadIdx.x, half = tid >> 7, vt = tid & 127, lane = tid & 31;
    const int nc = K >> 2;
    // This thread's rows t = 2j + half (j = 0..3): their chunks' loads are issued together, each
    // row's sum still adds its chunks in increasing c (rows past M add zeros, unused).
    const float4* row[4];
    bool ok[4];
    float ss[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ok[j] = m0 + 2 * j + half < M;
      row[j] = reinterpret_cast<const float4*>(res + (long long)(ok[j] ? m0 + 2 * j + half : 0) * K);
      ss[j] = 0.f;
    }
    for (int c = vt; c < nc; c += 128) {
      float4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = ok[j] ? __ldg(row[j] + c) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int j = 0; j < 4; ++j) ss[j] = kern::rms_acc4(ss[j], v[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (ok[j]) {  // warp-uniform
        const float s = kern::warp_sum(ss[j]);
        if (lane == 0) wsum[2 * j + half][vt >> 5] = s;
      }
    }
    __syncthreads();
    const int t = tid >> 5;  // warp t finishes row t
    if (m0 + t < M) {
      const float v = kern::warp_sum(lane < 4 ? wsum[t][lane] : 0.f);
      if (lane == 0) rs[t] = kern::rms_rstd(v, K, eps);
    }
    __syncthreads();
    rstd = rs;
  }
  __device__ __forceinline__ Col column(int k, bool ok) const { return ldg16(nw + k, ok); }
  __device__ __forceinline__ In load(int tok, int k, int K, bool ok) const {
    const float* p = res + (long long)tok * K + k;
    return In{ldg16(p, ok), ldg16(p + 4, ok)};
  }
  __device__ __forceinline__ uint4 make(const In& in, Col w, int t) const {
    const float r = rstd[t];
    const float4 a = make_float4(__uint_as_float(in.a.x), __uint_as_float(in.a.y), __uint_as_float(in.a.z), __uint_as_float(in.a.w));
    const float4 b = make_float4(__uint_as_float(in.b.x), __uint_as_float(in.b.y), __uint_as_float(in.b.z), __uint_as_float(in.b.w));
    const uint2 lo = OFF ? kern::rms_scale4_off(a, r, make_uint2(w.x, w.y), off) : kern::rms_scale4(a, r, make_uint2(w.x, w.y));
    const uint2 hi = OFF ? kern::rms_scale4_off(b, r, make_uint2(w.z, w.w), off) : kern::rms_scale4(b, r, make_uint2(w.z, w.w));
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
  __device__ __forceinline__ void store(int tok, int k, int K, uint4 o, const In&, Col, int) const {
    *reinterpret_cast<uint4*>(out + (long long)tok * K + k) = o;
  }
};
typedef PieceRmsT<false> PieceRms;

// Gemma's sandwich norms (gemv_bf16_postnorm_rms; K = hidden): the op's x is
//   x_out = x_in + bf16(rmsnorm(o)·(off + w_post))   (rms_norm_off of the bf16 projection output o,
//                                                     added to the fp32 residual as
//                                                     add_rms_norm_f32_off adds it)
//   x     = bf16(rmsnorm(x_out)·(off + w_pre))       (add_rms_norm_f32_off's norm)
// pass_begin computes both rstds of each token row exactly as the two row-wise kernels do, in
// two rounds over the CTA (the halves take rows t = 0 / 1 mod 2, 128 threads a row, as PieceRms):
// o's rstd from 16-byte bf16 chunks v, v + 128, … with rms_acc8 (rms_row's vector path), then
// x_out's from float4 chunks v, v + 128, … — x_out recomputed from x_in, o and w_post with
// postnorm_add4 — with rms_acc4 (rms_row_f32's); each sum then warp_sum, and warp_sum of the 4 warp
// sums in lanes 0..3, and rms_rstd. A piece is postnorm_add4 then rms_scale4_off of its 8 values;
// the owning CTA also stores its 8 values of x_out (store). Every CTA reads x_in while the owners
// write x_out, so x_out must not be x_in (the fused program ping-pongs the residual between two
// buffers). Needs K % 8 == 0 (gemv_bf16 does too), so both row-wise kernels take their vector path.
struct PiecePostRms {
  static constexpr int TB = 1;  // 2 spilled (180 bytes at the 128-register cap)
  struct In { uint4 a, b, o; };      // x_in's 8 floats, o's 8 bf16
  struct Col { uint4 wp, wn; };      // w_post's and w_pre's 8 bf16
  bf16* __restrict__ out;            // [M, K] the normalized rows (h)
  float* x_out;                      // [M, K] the new fp32 residual rows
  const float* __restrict__ x_in;    // [M, K] the fp32 residual rows
  const bf16* __restrict__ o;        // [M, K] the projection's output (bf16)
  const bf16* __restrict__ wpost;    // [K] the post-norm's weight
  const bf16* __restrict__ wpre;     // [K] the pre-norm's weight
  float eps, off;
  const float* ro;                   // shared [8]: the pass's rstd of o per token (pass_begin)
  const float* rx;                   // shared [8]: the pass's rstd of x_out per token
  __device__ __forceinline__ void pass_begin(int m0, int M, int K) {
    __shared__ float wsum[8][4];
    __shared__ float rs_o[8], rs_x[8];
    const int tid = threadIdx.x, half = tid >> 7, vt = tid & 127, lane = tid & 31, t = tid >> 5;
    bool ok[4];
    long long rowoff[4];
    float ss[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ok[j] = m0 + 2 * j + half < M;
      rowoff[j] = (long long)(ok[j] ? m0 + 2 * j + half : 0) * K;
      ss[j] = 0.f;
    }
    // Round 1: o's sums of squares (bf16 chunks of 8).
    for (int c = vt; c < (K >> 3); c += 128) {
      uint4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = ok[j] ? __ldg(reinterpret_cast<const uint4*>(o + rowoff[j]) + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) ss[j] = kern::rms_acc8(ss[j], v[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (ok[j]) {  // warp-uniform
        const float s = kern::warp_sum(ss[j]);
        if (lane == 0) wsum[2 * j + half][vt >> 5] = s;
      }
    }
    __syncthreads();
    if (m0 + t < M) {
      const float v = kern::warp_sum(lane < 4 ? wsum[t][lane] : 0.f);
      if (lane == 0) rs_o[t] = kern::rms_rstd(v, K, eps);
    }
    __syncthreads();
    // Round 2: x_out's sums of squares (fp32 chunks of 4).
    float r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      r[j] = ok[j] ? rs_o[2 * j + half] : 0.f;
      ss[j] = 0.f;
    }
    for (int c = vt; c < (K >> 2); c += 128) {
      const uint2 wp = __ldg(reinterpret_cast<const uint2*>(wpost) + c);
      float4 xv[4];
      uint2 ov[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xv[j] = ok[j] ? __ldg(reinterpret_cast<const float4*>(x_in + rowoff[j]) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        ov[j] = ok[j] ? __ldg(reinterpret_cast<const uint2*>(o + rowoff[j]) + c) : make_uint2(0u, 0u);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) ss[j] = kern::rms_acc4(ss[j], kern::postnorm_add4(xv[j], ov[j], r[j], wp, off));
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (ok[j]) {
        const float s = kern::warp_sum(ss[j]);
        if (lane == 0) wsum[2 * j + half][vt >> 5] = s;
      }
    }
    __syncthreads();
    if (m0 + t < M) {
      const float v = kern::warp_sum(lane < 4 ? wsum[t][lane] : 0.f);
      if (lane == 0) rs_x[t] = kern::rms_rstd(v, K, eps);
    }
    __syncthreads();
    ro = rs_o;
    rx = rs_x;
  }
  __device__ __forceinline__ Col column(int k, bool ok) const { return Col{ldg16(wpost + k, ok), ldg16(wpre + k, ok)}; }
  __device__ __forceinline__ In load(int tok, int k, int K, bool ok) const {
    const float* p = x_in + (long long)tok * K + k;
    return In{ldg16(p, ok), ldg16(p + 4, ok), ldg16(o + (long long)tok * K + k, ok)};
  }
  // x_out's 8 values of the piece (postnorm_add4 of its two halves).
  __device__ __forceinline__ void residual(const In& in, const Col& w, int t, float4& lo, float4& hi) const {
    const float r = ro[t];
    lo = kern::postnorm_add4(make_float4(__uint_as_float(in.a.x), __uint_as_float(in.a.y), __uint_as_float(in.a.z), __uint_as_float(in.a.w)),
                             make_uint2(in.o.x, in.o.y), r, make_uint2(w.wp.x, w.wp.y), off);
    hi = kern::postnorm_add4(make_float4(__uint_as_float(in.b.x), __uint_as_float(in.b.y), __uint_as_float(in.b.z), __uint_as_float(in.b.w)),
                             make_uint2(in.o.z, in.o.w), r, make_uint2(w.wp.z, w.wp.w), off);
  }
  __device__ __forceinline__ uint4 make(const In& in, Col w, int t) const {
    float4 lo, hi;
    residual(in, w, t, lo, hi);
    const float r = rx[t];
    const uint2 a = kern::rms_scale4_off(lo, r, make_uint2(w.wn.x, w.wn.y), off);
    const uint2 b = kern::rms_scale4_off(hi, r, make_uint2(w.wn.z, w.wn.w), off);
    return make_uint4(a.x, a.y, b.x, b.y);
  }
  __device__ __forceinline__ void store(int tok, int k, int K, uint4 h, const In& in, Col w, int t) const {
    *reinterpret_cast<uint4*>(out + (long long)tok * K + k) = h;
    float4 lo, hi;
    residual(in, w, t, lo, hi);
    float4* x = reinterpret_cast<float4*>(x_out + (long long)tok * K + k);
    x[0] = lo;
    x[1] = hi;
  }
};

// x = swiglu(gate_up) (gemv_bf16_swiglu_add; gate_up [M, 2K] = [gate | up]): bf16(silu_bf16(gate)
// · up), rowwise.cu's swiglu (swiglu2); GELU (gemv_bf16_geglu(_add)): bf16(gelu_tanh_bf16(gate) ·
// up), rowwise.cu's geglu_tanh (geglu2).
template <bool GELU>
struct PieceGlu {
  static constexpr int TB = 2;  // SiLU's arithmetic dominates the group's time
  struct In { uint4 g, u; };
  struct Col {};
  bf16* __restrict__ out;          // [M, K] the activations (act)
  const bf16* __restrict__ gu;
  __device__ __forceinline__ void pass_begin(int, int, int) {}
  __device__ __forceinline__ Col column(int, bool) const { return Col{}; }
  __device__ __forceinline__ In load(int tok, int k, int K, bool ok) const {
    const bf16* p = gu + (long long)tok * 2 * K + k;
    return In{ldg16(p, ok), ldg16(p + K, ok)};
  }
  __device__ __forceinline__ uint4 make(const In& in, Col, int) const {
    if (GELU)
      return make_uint4(kern::geglu2(in.g.x, in.u.x), kern::geglu2(in.g.y, in.u.y), kern::geglu2(in.g.z, in.u.z),
                        kern::geglu2(in.g.w, in.u.w));
    return make_uint4(kern::swiglu2(in.g.x, in.u.x), kern::swiglu2(in.g.y, in.u.y), kern::swiglu2(in.g.z, in.u.z),
                      kern::swiglu2(in.g.w, in.u.w));
  }
  __device__ __forceinline__ void store(int tok, int k, int K, uint4 o, const In&, Col, int) const {
    *reinterpret_cast<uint4*>(out + (long long)tok * K + k) = o;
  }
};
typedef PieceGlu<false> PieceSwiglu;
typedef PieceGlu<true> PieceGeglu;

// XS: the x operand policy (XLoad: x from memory); EP: the epilogue (EpStore: y = v).
template <int WARPS, int C, int MT, int U, bool PREFETCH, typename OutT, class XS, class EP>
__device__ __forceinline__ void skinny_gemm(XS xs, const bf16* __restrict__ W, const bf16* __restrict__ bias,
                                            OutT* __restrict__ y, int M, int N, int K, EP ep) {
  constexpr int kThreads = WARPS * 32;
  constexpr int kStride = WARPS * C * kChunk;  // K advance of one sub-step of the whole block
  constexpr int kTile = MT * 4 * 32;           // accumulators of one warp (= of one CTA after reduction)
  __shared__ float red[WARPS * kTile];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, q = lane & 3;
  const int rank = C > 1 ? static_cast<int>(cluster_ctarank()) : 0;  // == blockIdx.x % C
  const int n0 = (blockIdx.x / C) * kRows;
  const int kfirst = (rank * WARPS + warp) * kChunk;  // this (virtual) warp's first chunk
  const bool vA = n0 + g < N, vB = n0 + g + 8 < N;
  // Rows beyond N are never loaded; their pointer is clamped to row 0 so it stays in bounds.
  const bf16* wA = W + (long long)(vA ? n0 + g : 0) * K + q * 8;
  const bf16* wB = W + (long long)(vB ? n0 + g + 8 : 0) * K + q * 8;

  if (PREFETCH && threadIdx.x < kRows && n0 + threadIdx.x < N)
    prefetch_l2_bulk(W + (long long)(n0 + threadIdx.x) * K, static_cast<uint32_t>(K) * 2u);
  pdl_wait();
  for (int m0 = 0; m0 < M; m0 += 8 * MT) {
    xs.pass_begin(m0, M, K);
    float acc[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;

    // Only sub-steps that start below K are executed, whatever U is: full groups of U, then
    // the remainder as a group of 2 and/or 1. So every entry adds exactly the same sequence
    // of MMAs (same rounding) — U may differ between entries of a family.
    int kb = kfirst;
    for (; kb + (U - 1) * kStride < K; kb += U * kStride)
      skinny_steps<MT, U, kStride>(acc, xs, wA, wB, vA, vB, kb, m0, M, K, g, q);
    if (U > 2 && kb + kStride < K) {
      skinny_steps<MT, 2, kStride>(acc, xs, wA, wB, vA, vB, kb, m0, M, K, g, q);
      kb += 2 * kStride;
    }
    if (U > 1 && kb < K) skinny_steps<MT, 1, kStride>(acc, xs, wA, wB, vA, vB, kb, m0, M, K, g, q);
    if (m0 + 8 * MT >= M) pdl_launch_dependents();

    // Cross-warp reduction. acc[t][i]: row n0 + g + 8·(i>>1), token m0 + 8t + 2q + (i&1).
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * MT * 4 + t * 4 + i) * 32 + lane] = acc[t][i];
    __syncthreads();
    if constexpr (C == 1) {
      for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
        const int ti = idx >> 5, ln = idx & 31;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += red[w * kTile + idx];
        const int t = ti >> 2, i = ti & 3;
        const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
        const int tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1);
        if (row < N && tok < M) ep(y, (long long)tok * N + row, s + bias_at(bias, row));
      }
      __syncthreads();  // `red` is reused by the next pass
    } else {
      // Per-CTA partial into red[0 .. kTile) (in place: element idx of warp 0's slot is read
      // and written only by the thread that owns idx).
      for (int idx = threadIdx.x; idx < kTile; idx += kThreads) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += red[w * kTile + idx];
        red[idx] = s;
      }
      cluster_sync_all();  // every CTA's partial is visible cluster-wide
      // The cluster's C·kThreads threads share the outputs; each adds the C partials in rank
      // order 0..C-1 (the same order whichever CTA does it).
      for (int idx = rank * kThreads + threadIdx.x; idx < kTile; idx += C * kThreads) {
        const int ti = idx >> 5, ln = idx & 31;
        const int t = ti >> 2, i = ti & 3;
        const int row = n0 + (ln >> 2) + ((i & 2) ? 8 : 0);
        const int tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1);
        if (row < N && tok < M) {
          float s = 0.0f;
#pragma unroll
          for (int r = 0; r < C; ++r) s += ld_dsmem_f32(&red[idx], static_cast<uint32_t>(r));
          ep(y, (long long)tok * N + row, s + bias_at(bias, row));
        }
      }
      // No CTA reuses `red` or exits while another may still read it. Every remote read above
      // feeds a store issued before this point, so it has returned: a relaxed arrive suffices
      // (a release would make every thread wait for its y stores first); the wait acquires.
      asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
    }
  }
}

}  // namespace

// MINB (CTAs per SM the register budget must allow) also tells ptxas how many registers it
// may use: without it ptxas schedules for ~64 registers and issues the weight loads one pair at
// a time (seen in SASS), which starves the memory pipe.
// PF: first stream the CTA's 16 weight rows into L2 with bulk prefetches (issued before
// griddepcontrol.wait, so under PDL they overlap the previous kernel's tail).
#define KGEMM_SKINNY_ENTRY(NAME, MT, U, MINB, PF, OUT)                                              \
  extern "C" __global__ void __launch_bounds__(256, MINB)                                          \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<8, 1, MT, U, PF, OUT>(XLoad{x}, W, bias, y, M, N, K, EpStore{});                     \
  }

KGEMM_SKINNY_ENTRY(gemv_bf16, 1, 4, 2, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemv_bf16_f32out, 1, 4, 2, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m16, 2, 4, 2, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m16_f32out, 2, 4, 2, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m32, 4, 4, 1, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m32_f32out, 4, 4, 1, false, float)
KGEMM_SKINNY_ENTRY(gemm_bf16_m64, 8, 2, 1, false, __nv_bfloat16)
KGEMM_SKINNY_ENTRY(gemm_bf16_m64_f32out, 8, 2, 1, false, float)
KGEMM_SKINNY_ENTRY(gemv_bf16_pf, 1, 4, 2, true, __nv_bfloat16)  // experimental, see GEMM.md

// Cluster family: 4 warps (128 threads) per CTA, C CTAs per 16-row block in one cluster.
// C = 1 has no cluster attribute. MINB 4 (MT ≤ 2) caps registers at 128, as the 8-warp
// entries' MINB 2; MINB 2 for MT 4 / 8 (≤ 255 registers). MT 2 with C > 1 gets MINB 3
// (≤ 168 registers): at 128 the cluster epilogue spilled 4 bytes. U = 4, or 2 for MT 8 (registers);
// the K loop's tail handling keeps the MMA sequence independent of U.
#define KGEMM_SKINNY_C1(NAME, MT, U, MINB, OUT)                                                    \
  extern "C" __global__ void __launch_bounds__(128, MINB)                                          \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<4, 1, MT, U, false, OUT>(XLoad{x}, W, bias, y, M, N, K, EpStore{});                  \
  }
#define KGEMM_SKINNY_CL(NAME, C, MT, U, MINB, OUT)                                                 \
  extern "C" __global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(128, (MT == 2 ? 3 : MINB)) \
      NAME(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, OUT* y, int M, \
           int N, int K) {                                                                          \
    skinny_gemm<4, C, MT, U, false, OUT>(XLoad{x}, W, bias, y, M, N, K, EpStore{});                  \
  }
#define KGEMM_SKINNY_FAMILY(CL, SFX, ...)                                                          \
  CL(gemv_bf16_##SFX, __VA_ARGS__ 1, 4, 4, __nv_bfloat16)                                          \
  CL(gemv_bf16_##SFX##_f32out, __VA_ARGS__ 1, 4, 4, float)                                         \
  CL(gemm_bf16_m16_##SFX, __VA_ARGS__ 2, 4, 4, __nv_bfloat16)                                      \
  CL(gemm_bf16_m16_##SFX##_f32out, __VA_ARGS__ 2, 4, 4, float)                                     \
  CL(gemm_bf16_m32_##SFX, __VA_ARGS__ 4, 4, 2, __nv_bfloat16)                                      \
  CL(gemm_bf16_m32_##SFX##_f32out, __VA_ARGS__ 4, 4, 2, float)                                     \
  CL(gemm_bf16_m64_##SFX, __VA_ARGS__ 8, 2, 2, __nv_bfloat16)                                      \
  CL(gemm_bf16_m64_##SFX##_f32out, __VA_ARGS__ 8, 2, 2, float)

#ifndef KERN_HOST_EMU  // the host emulation runs the 8-warp and fused entries only (no clusters)
KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_C1, c1, )
KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_CL, c2, 2, )
KGEMM_SKINNY_FAMILY(KGEMM_SKINNY_CL, c4, 4, )
#endif

// ---- Fused decode GEMVs (GEMM.md, "Fused decode GEMVs"): gemv_bf16's CTA (8 warps, 16 rows,
// grid [ceil(N/16)], block [256]) and reduction, so every output element has gemv_bf16's bits
// for the same x; only how x is obtained and what the epilogue does differ. For M <= 8 (one
// pass; any M is correct). K % 8 == 0, pointers 16-byte aligned, as for gemv_bf16.
//   gemv_bf16_rms:         x = rms_norm_f32(res)·norm_w (K = hidden), also written to h.
//                          (gemv_bf16_rms_pf: the same with an L2 prefetch of W; experimental.)
//   gemv_bf16_add:         y = x·Wᵀ (+bias); res[t, n] += float(y[t, n]) (N = hidden).
//   gemv_bf16_swiglu_add:  x = swiglu(gate_up) ([M, 2K]), also written to act; y and res as
//                          gemv_bf16_add.
//   gemv_bf16_swiglu:      x as gemv_bf16_swiglu_add; y = x·Wᵀ (+bias) (the last layer's down
//                          projection, whose residual add the final norm makes).
#define KGEMM_GEMV_RMS(NAME, PF)                                                                               \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                        \
      NAME(const float* res, const __nv_bfloat16* norm_w, __nv_bfloat16* h, const __nv_bfloat16* W,            \
           const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K, float eps) {                        \
    __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceRms>::kRow]; /* one [8][kRow] tile per warp */        \
    skinny_gemm<8, 1, 1, 4, PF, bf16>(XTile<PieceRms>{PieceRms{h, res, norm_w, eps, nullptr}, tile[threadIdx.x >> 5]}, \
                                      W, bias, y, M, N, K, EpStore{});                                         \
  }
KGEMM_GEMV_RMS(gemv_bf16_rms, false)
// As gemv_bf16_rms, plus gemv_bf16_pf's L2 bulk prefetch of the CTA's 16 weight rows before
// griddepcontrol.wait and the norm prologue (which holds back the first weight loads):
// experimental, for fused_verify.py's timing; the manifest uses gemv_bf16_rms.
KGEMM_GEMV_RMS(gemv_bf16_rms_pf, true)
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_add(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, __nv_bfloat16* y,
                  float* res, int M, int N, int K) {
  skinny_gemm<8, 1, 1, 4, false, bf16>(XLoad{x}, W, bias, y, M, N, K, EpAddRes{res});
}
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_swiglu_add(const __nv_bfloat16* gate_up, __nv_bfloat16* act, const __nv_bfloat16* W,
                         const __nv_bfloat16* bias, __nv_bfloat16* y, float* res, int M, int N, int K) {
  __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceSwiglu>::kRow];  // one [8][kRow] tile per warp
  skinny_gemm<8, 1, 1, 4, false, bf16>(XTile<PieceSwiglu>{PieceSwiglu{act, gate_up}, tile[threadIdx.x >> 5]}, W, bias,
                                       y, M, N, K, EpAddRes{res});
}
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_swiglu(const __nv_bfloat16* gate_up, __nv_bfloat16* act, const __nv_bfloat16* W,
                     const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K) {
  __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceSwiglu>::kRow];  // one [8][kRow] tile per warp
  skinny_gemm<8, 1, 1, 4, false, bf16>(XTile<PieceSwiglu>{PieceSwiglu{act, gate_up}, tile[threadIdx.x >> 5]}, W, bias,
                                       y, M, N, K, EpStore{});
}

// ---- The fused GEMVs of blocks with zero-centred (off + w) norms, four norms per block
// (sandwich: Gemma 3) and GeGLU-tanh MLPs (GEMM.md, "Fused decode GEMVs"; same CTA, reduction
// and rules as above):
//   gemv_bf16_rms_off:       x = rms_norm_f32_off(res)·(off + norm_w), also written to h.
//   gemv_bf16_postnorm_rms:  x_out = x_in + rms_norm_off(o)·(off + w_post) (fp32, written by the
//                            CTAs owning each piece; x_out != x_in), x = rmsnorm(x_out)·(off + w_pre),
//                            also written to h: rms_norm_off then add_rms_norm_f32_off, then the GEMV.
//                            (gemv_bf16_postnorm_rms_pf: plus the L2 prefetch of W; experimental.)
//   gemv_bf16_geglu_add:     x = geglu_tanh(gate_up), also written to act; y, res as gemv_bf16_add.
//   gemv_bf16_geglu:         x as gemv_bf16_geglu_add; y as gemv_bf16 (a sandwich block's down
//                            projection: its post-norm comes before the residual add).
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_rms_off(const float* res, const __nv_bfloat16* norm_w, __nv_bfloat16* h, const __nv_bfloat16* W,
                      const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K, float eps, float off) {
  __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceRmsT<true>>::kRow];  // one [8][kRow] tile per warp
  skinny_gemm<8, 1, 1, 4, false, bf16>(
      XTile<PieceRmsT<true>>{PieceRmsT<true>{h, res, norm_w, eps, nullptr, off}, tile[threadIdx.x >> 5]}, W, bias, y, M, N,
      K, EpStore{});
}
#define KGEMM_GEMV_POSTNORM_RMS(NAME, PF)                                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2)                                                        \
      NAME(const float* x_in, const __nv_bfloat16* o, const __nv_bfloat16* w_post, float* x_out,               \
           const __nv_bfloat16* w_pre, __nv_bfloat16* h, const __nv_bfloat16* W, const __nv_bfloat16* bias,      \
           __nv_bfloat16* y, int M, int N, int K, float eps, float off) {                                      \
    __shared__ __align__(16) bf16 tile[8][8 * XTile<PiecePostRms>::kRow]; /* one [8][kRow] tile per warp */    \
    skinny_gemm<8, 1, 1, 4, PF, bf16>(                                                                         \
        XTile<PiecePostRms>{PiecePostRms{h, x_out, x_in, o, w_post, w_pre, eps, off, nullptr, nullptr},         \
                            tile[threadIdx.x >> 5]},                                                           \
        W, bias, y, M, N, K, EpStore{});                                                                       \
  }
KGEMM_GEMV_POSTNORM_RMS(gemv_bf16_postnorm_rms, false)
KGEMM_GEMV_POSTNORM_RMS(gemv_bf16_postnorm_rms_pf, true)  // experimental, timed by fused_verify.py
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_geglu_add(const __nv_bfloat16* gate_up, __nv_bfloat16* act, const __nv_bfloat16* W,
                        const __nv_bfloat16* bias, __nv_bfloat16* y, float* res, int M, int N, int K) {
  __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceGeglu>::kRow];  // one [8][kRow] tile per warp
  skinny_gemm<8, 1, 1, 4, false, bf16>(XTile<PieceGeglu>{PieceGeglu{act, gate_up}, tile[threadIdx.x >> 5]}, W, bias, y,
                                       M, N, K, EpAddRes{res});
}
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_bf16_geglu(const __nv_bfloat16* gate_up, __nv_bfloat16* act, const __nv_bfloat16* W,
                    const __nv_bfloat16* bias, __nv_bfloat16* y, int M, int N, int K) {
  __shared__ __align__(16) bf16 tile[8][8 * XTile<PieceGeglu>::kRow];  // one [8][kRow] tile per warp
  skinny_gemm<8, 1, 1, 4, false, bf16>(XTile<PieceGeglu>{PieceGeglu{act, gate_up}, tile[threadIdx.x >> 5]}, W, bias, y,
                                       M, N, K, EpStore{});
}
