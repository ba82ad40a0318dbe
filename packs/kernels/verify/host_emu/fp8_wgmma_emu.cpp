// gemm_fp8_wgmma.cu (the W8A8 prefill GEMM) on the CPU, with fp8_wgmma_emu.h's wgmma: part of the
// `fp8` host emulation (fp8_emu.cpp has main). Random e4m3 activations and weights with random
// per-token-group and 128 × 128 block scales:
//   f32out within (4·K/128 + 8)·2^-23·Σ|xs·ws·xq·w| of the fp64 Σ_kb xs·ws·Σ xq·w (+ bias); bf16 out ==
//   bf16(f32out) bit for bit; M and N tails (partial tiles), K of 5 and 9 blocks (9 > 6 stages: the
//   ring wraps); nothing outside [M, N] written; a row's bits do not depend on M (batch invariance).
// What this checks: the loader's swizzle against the descriptors as the PTX ISA defines them, the
// accumulator fragment layout, the promotion's scale indexing and the pipeline's stage indexing.
// What it cannot: the GPU's FP8 accumulation bits and the asynchronous proxy (fp8_verify.py).
#include "emu_math.h"
#include "fp8_ref.h"
#include "../../gemm_fp8_wgmma.cu"

#include <algorithm>
#include <memory>
#include <vector>

using namespace fp8ref;

namespace {

struct Case {
  int M, N, K;
  Buf<uint8_t> xq, W;
  Buf<float> xs, Ws;
  Buf<uint16_t> bias;
  Case(int m, int n, int k)
      : M(m), N(n), K(k), xq((size_t)m * k), W((size_t)n * k), xs((size_t)m * (k / 128)), Ws((size_t)((n + 127) / 128) * (k / 128)), bias(n) {
    for (size_t i = 0; i < xq.n; ++i) xq[i] = rand_code();
    for (size_t i = 0; i < W.n; ++i) W[i] = rand_code();
    for (size_t i = 0; i < xs.n; ++i) xs[i] = rand_scale() * 64.0f;
    for (size_t i = 0; i < Ws.n; ++i) Ws[i] = rand_scale();
    for (int i = 0; i < n; ++i) bias[i] = rand_bf16(0.5);
  }
};

void run(const Case& c, int M, bool with_bias, Buf<uint16_t>& yb, Buf<float>& yf) {
  const uint3_ grid{(unsigned)((M + 127) / 128), (unsigned)((c.N + 127) / 128), 1};
  const auto* bp = with_bias ? reinterpret_cast<const __nv_bfloat16*>(c.bias.p) : nullptr;
  emu_launch(grid, 256, [&] { gemm_fp8_wgmma(c.xq.p, c.xs.p, c.W.p, c.Ws.p, bp, reinterpret_cast<__nv_bfloat16*>(yb.p), M, c.N, c.K); });
  emu_launch(grid, 256, [&] { gemm_fp8_wgmma_f32out(c.xq.p, c.xs.p, c.W.p, c.Ws.p, bp, yf.p, M, c.N, c.K); });
}

bool case_gemm(int M, int N, int K, bool with_bias) {
  Case c(M, N, K);
  const int nkb = K / 128;
  Buf<uint16_t> yb((size_t)(M + 1) * N);
  Buf<float> yf((size_t)(M + 1) * N);
  for (size_t i = 0; i < yb.n; ++i) yb[i] = 0x7fc1, yf[i] = bitsf(0x7fc00123u);
  run(c, M, with_bias, yb, yf);
  std::string why;
  double worst = 0.0;
  const double tol_rel = (4.0 * nkb + 8.0) * std::ldexp(1.0, -23);
  for (int m = 0; m < M && why.empty(); ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int kb = 0; kb < nkb; ++kb) {
        const double s = (double)c.xs[(size_t)kb * M + m] * (double)c.Ws[(size_t)(n / 128) * nkb + kb];
        for (int k = 128 * kb; k < 128 * kb + 128; ++k) {
          const double t = ref_e4m3(c.xq[(size_t)m * K + k]) * ref_e4m3(c.W[(size_t)n * K + k]) * s;
          ref += t;
          mag += std::fabs(t);
        }
      }
      if (with_bias) ref += bf16f(c.bias[n]), mag += std::fabs(bf16f(c.bias[n]));
      const size_t at = (size_t)m * N + n;
      const double err = std::fabs((double)yf[at] - ref), tol = tol_rel * mag + 1e-30;
      worst = std::max(worst, err / tol);
      if (!(err <= tol)) {
        why = fmt("row %d col %d: f32 %.9g, fp64 %.9g (err %.3g > tol %.3g)", m, n, yf[at], ref, err, tol);
        break;
      }
      if (yb[at] != to_bf16(yf[at])) {
        why = fmt("row %d col %d: bf16 %04x != bf16(f32out)", m, n, yb[at]);
        break;
      }
    }
  for (size_t i = (size_t)M * N; i < yb.n && why.empty(); ++i)
    if (yb[i] != 0x7fc1 || fbits(yf[i]) != 0x7fc00123u) why = "wrote past row M";
  report(why.empty(), fmt("gemm_fp8_wgmma (+_f32out) M=%d N=%d K=%d%s vs fp64 (worst err/tol %.3g)%s%s", M, N, K, with_bias ? " +bias" : "", worst,
                          why.empty() ? "" : ": ", why.c_str()));
  // Batch invariance: the first 70 rows alone (M = 70) have the same bits. xs is [K/128][M], so
  // the smaller launch gets its own copy of the scales for its rows.
  if (M > 70) {
    const int M2 = 70;
    Case d(M2, N, K);
    std::memcpy(d.xq.p, c.xq.p, (size_t)M2 * K);
    std::memcpy(d.W.p, c.W.p, c.W.n);
    std::memcpy(d.Ws.p, c.Ws.p, c.Ws.n * 4);
    std::memcpy(d.bias.p, c.bias.p, c.bias.n * 2);
    for (int kb = 0; kb < nkb; ++kb)
      for (int m = 0; m < M2; ++m) d.xs[(size_t)kb * M2 + m] = c.xs[(size_t)kb * M + m];
    Buf<uint16_t> yb2((size_t)M2 * N);
    Buf<float> yf2((size_t)M2 * N);
    run(d, M2, with_bias, yb2, yf2);
    bool same = true;
    for (size_t i = 0; i < (size_t)M2 * N; ++i) same &= yb2[i] == yb[i] && fbits(yf2[i]) == fbits(yf[i]);
    report(same, fmt("gemm_fp8_wgmma M=%d vs M=%d: the first rows' bits are equal (batch invariance)", M, M2));
  }
  return why.empty();
}

}  // namespace

int run_wgmma_cases() {
  case_gemm(200, 136, 128 * 5, true);   // two M tiles (the second partial), two N tiles (the second 8 wide)
  case_gemm(130, 256, 128 * 9, false);  // the 6-stage ring wraps
  return 0;
}
