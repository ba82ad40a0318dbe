// Runs packs/kernels/gemm_fp8.cu (the FP8 decode GEMVs gemv_fp8[_w8][_f32out], dequant_fp8_bf16,
// quant_fp8_act) on the CPU (emu.h) against references written from the E4M3 definition (fp8_ref.h),
// and, with fp8_wgmma_emu.cpp, gemm_fp8_wgmma.cu:
//   codec       kfp8::e4m3_f32 == the definition for all 256 codes (0x7F / 0xFF NaN); the GEMV's
//               bf16 fragments (e4m3x4_bf16) hold every finite code exactly, in the documented
//               slots, NaN codes as ±480; the satfinite conversion stand-in (c10's algorithm after a
//               clamp) == a search for the nearest code, ties to even, on every f32 midpoint and
//               boundary of the format and 200,000 random floats
//   dequant     dequant_fp8_bf16 == bf16(f32(w) · s) bit for bit (NaN codes → NaN) at a row offset,
//               scale rows and columns crossing 128, guard rows untouched
//   gemv        4- and 8-warp families, random finite codes and block scales, bf16 x: f32out within
//               (K/16 + 16)·2^-22·Σ|x·w·s| of fp64 (+ bias); bf16 out == bf16(f32out) bit for bit;
//               M = 1, 3, 8, 11 with ldy / col0 (nothing else written); batch invariance (a row's bits
//               for M = 1, 3, 8 and in the second pass of M = 11); N = 144 crosses a scale row;
//               a fused q/k/v row buffer from three launches
//   quant       quant_fp8_act == the reference (absmax, max(·, 1e-10)/448, IEEE division, nearest
//               code) bit for bit, an all-zero group included; xs laid out [K/128][M]
// Checks indexing, fragments and arithmetic order; mma.sync / wgmma are emu.h's / fp8_wgmma_emu.h's
// (sums in double, rounded once), so the GPU's bits are fp8_verify.py's business.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "fp8_ref.h"
#include "../../gemm_fp8.cu"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

using namespace fp8ref;
int run_wgmma_cases();  // fp8_wgmma_emu.cpp

namespace {

typedef void (*GemvBf16)(const __nv_bfloat16*, const unsigned char*, const float*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int, int, int);
typedef void (*GemvF32)(const __nv_bfloat16*, const unsigned char*, const float*, const __nv_bfloat16*, float*, int, int, int, int, int);
int g_warps = 4;

// ------------------------------------------------------------------ codec
void codec() {
  size_t bad = 0;
  for (unsigned c = 0; c < 256; ++c) {
    const double r = ref_e4m3(c);
    const float k = kfp8::e4m3_f32(c);
    const bool ok = std::isnan(r) ? (std::isnan(k) && std::signbit(k) == ((c & 0x80) != 0)) : ((double)k == r && std::signbit(k) == ((c & 0x80) != 0));
    bad += !ok;
  }
  const bool known = kfp8::e4m3_f32(0x7E) == 448.0f && kfp8::e4m3_f32(0xFE) == -448.0f && kfp8::e4m3_f32(0x01) == std::ldexp(1.0f, -9) &&
                     kfp8::e4m3_f32(0x08) == std::ldexp(1.0f, -6) && kfp8::e4m3_f32(0x38) == 1.0f && kfp8::e4m3_f32(0x07) == 7.0f / 512 &&
                     std::isnan(kfp8::e4m3_f32(0x7F)) && std::isnan(kfp8::e4m3_f32(0xFF)) && std::signbit(kfp8::e4m3_f32(0x80));
  report(bad == 0 && known, fmt("e4m3_f32 == the E4M3 definition for all 256 codes (448, 2^-9, 2^-6, 1, -0, NaN 0x7F/0xFF)%s",
                                bad ? fmt(": %zu codes differ", bad).c_str() : ""));
  // The GEMV's fragments: word [b0 b1 b2 b3] → odd (b1, b3), even (b0, b2), each exact in bf16.
  bad = 0;
  for (unsigned c = 0; c < 256; ++c) {
    const uint32_t q = c | ((c ^ 0x80u) << 8) | (((c + 1) & 0xffu) << 16) | (((c + 7) & 0xffu) << 24);
    uint32_t odd, even;
    kfp8::e4m3x4_bf16(q, odd, even);
    const unsigned bytes[4] = {c, c ^ 0x80u, (c + 1) & 0xffu, (c + 7) & 0xffu};
    const uint16_t got[4] = {(uint16_t)even, (uint16_t)odd, (uint16_t)(even >> 16), (uint16_t)(odd >> 16)};
    for (int i = 0; i < 4; ++i) {
      double want = ref_e4m3(bytes[i]);
      if (std::isnan(want)) want = (bytes[i] & 0x80) ? -480.0 : 480.0;  // documented: NaN codes read as ±480
      const float g = bf16f(got[i]);
      bad += !((double)g == want && std::signbit(g) == ((bytes[i] & 0x80) != 0));
    }
  }
  report(bad == 0, fmt("e4m3x4_bf16: every code exact in bf16 (odd = bytes 1, 3; even = 0, 2), NaN codes as +-480%s", bad ? fmt(": %zu differ", bad).c_str() : ""));
  // The satfinite conversion stand-in vs the search: every boundary and midpoint of the format.
  std::vector<float> probe = {0.0f, -0.0f, 448.0f, 449.0f, 464.0f, 464.5f, 479.9f, 480.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 1e-30f, -1e-30f};
  for (unsigned c = 0; c < 0x7E; ++c) {
    const double a = ref_e4m3(c), b = ref_e4m3(c + 1), mid = (a + b) / 2;
    for (double v : {a, b, mid}) {
      const float f = (float)v;
      for (float g : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e9f)}) probe.push_back(g), probe.push_back(-g);
    }
  }
  std::uniform_real_distribution<double> ex(-14.0, 10.0);
  for (int i = 0; i < 200000; ++i) probe.push_back((float)((rng()() & 1 ? -1 : 1) * std::exp2(ex(rng()))));
  bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < probe.size(); ++i) {
    const uint32_t got = kfp8::e4m3x2_sat(probe[i], -probe[i]);
    if ((got & 0xff) != ref_encode(probe[i]) || (got >> 8) != ref_encode(-probe[i])) bad++ == 0 && (first = i, true);
  }
  report(bad == 0, fmt("e4m3x2_sat (cvt.rn.satfinite stand-in) == nearest code, ties to even, saturating: %zu floats%s", probe.size(),
                       bad ? fmt(": %zu differ, first %.9g -> %02x, want %02x", bad, probe[first], kfp8::e4m3x2_sat(probe[first], 0) & 0xff, ref_encode(probe[first])).c_str() : ""));
}

// ------------------------------------------------------------------ matrices
struct Mat {
  int N, K;
  Buf<uint8_t> W;
  Buf<float> S;
  std::vector<double> w;  // w[n, k] · s, exact in double
  Mat(int n, int k, bool with_nan = false) : N(n), K(k), W((size_t)n * k), S((size_t)((n + 127) / 128) * ((k + 127) / 128)) {
    for (size_t i = 0; i < W.n; ++i) W[i] = with_nan && rng()() % 97 == 0 ? (rng()() & 1 ? 0x7F : 0xFF) : rand_code();
    for (size_t i = 0; i < S.n; ++i) S[i] = rand_scale();
    w.resize(W.n);
    const int nkb = (k + 127) / 128;
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < k; ++c) w[(size_t)r * k + c] = ref_e4m3(W[(size_t)r * k + c]) * (double)S[(size_t)(r / 128) * nkb + c / 128];
  }
  float scale(int r, int c) const { return S[(size_t)(r / 128) * ((K + 127) / 128) + c / 128]; }
};

void case_dequant(int N, int K, int row0) {
  Mat A(N, K, true);
  const size_t rows = (size_t)row0 + N + 2;
  Buf<uint16_t> dst(rows * K);
  for (size_t i = 0; i < dst.n; ++i) dst[i] = 0x7fc1;
  emu_launch({(unsigned)(((long long)N * K / 8 + 255) / 256), 1, 1}, 256,
             [&] { dequant_fp8_bf16(A.W.p, A.S.p, reinterpret_cast<__nv_bfloat16*>(dst.p), N, K, row0); });
  size_t bad = 0, nan = 0, first = 0;
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < K; ++c) {
      const bool inside = r >= (size_t)row0 && r < (size_t)row0 + N;
      const uint16_t got = dst[r * K + c];
      bool ok;
      if (!inside) {
        ok = got == 0x7fc1;
      } else {
        const size_t i = (r - row0) * K + c;
        const double v = ref_e4m3(A.W[i]);
        if (std::isnan(v)) {
          ok = (got & 0x7fffu) > 0x7f80u;
          ++nan;
        } else {
          ok = got == to_bf16((float)v * A.scale((int)(r - row0), c));  // one f32 product, one rounding
        }
      }
      if (!ok && bad++ == 0) first = r * K + c;
    }
  report(bad == 0, fmt("dequant_fp8_bf16 %d x %d at row %d == bf16(f32(w) * s), %zu NaN codes -> NaN, guard rows untouched%s", N, K, row0, nan,
                       bad ? fmt(": %zu differ, first row %zu col %zu (%04x)", bad, first / K, first % K, dst[first]).c_str() : ""));
}

const uint16_t POISON = 0x7fc1;
const uint32_t POISON32 = 0x7fc00123u;

void launch(const Mat& A, const Buf<uint16_t>& x, const Buf<uint16_t>* bias, int M, int ldy, int col0, Buf<uint16_t>* yb, Buf<float>* yf) {
  const auto* xp = reinterpret_cast<const __nv_bfloat16*>(x.p);
  const auto* bp = bias ? reinterpret_cast<const __nv_bfloat16*>(bias->p) : nullptr;
  const uint3_ grid{(unsigned)((A.N + 15) / 16), 1, 1};
  const GemvBf16 fb = g_warps == 8 ? gemv_fp8_w8 : gemv_fp8;
  const GemvF32 ff = g_warps == 8 ? gemv_fp8_w8_f32out : gemv_fp8_f32out;
  if (yb) emu_launch(grid, 32 * g_warps, [&] { fb(xp, A.W.p, A.S.p, bp, reinterpret_cast<__nv_bfloat16*>(yb->p), M, A.N, A.K, ldy, col0); });
  if (yf) emu_launch(grid, 32 * g_warps, [&] { ff(xp, A.W.p, A.S.p, bp, yf->p, M, A.N, A.K, ldy, col0); });
}

double worst_ratio = 0.0;
std::string check_gemv(const Mat& A, const Buf<uint16_t>& x, const Buf<uint16_t>* bias, int M, int ldy, int col0, const Buf<uint16_t>& yb,
                       const Buf<float>& yf) {
  const int N = A.N, K = A.K;
  const double tol_rel = (K / 16.0 + 16.0) * std::ldexp(1.0, -22);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < K; ++k) {
        const double t = bf16f(x[(size_t)m * K + k]) * A.w[(size_t)n * K + k];
        ref += t;
        mag += std::fabs(t);
      }
      if (bias) ref += bf16f((*bias)[n]), mag += std::fabs(bf16f((*bias)[n]));
      const size_t at = (size_t)m * ldy + col0 + n;
      const double err = std::fabs((double)yf[at] - ref), tol = tol_rel * mag + 1e-30;
      worst_ratio = std::max(worst_ratio, err / tol);
      if (!(err <= tol)) return fmt("row %d col %d: f32 %.9g, fp64 %.9g (err %.3g > tol %.3g)", m, n, yf[at], ref, err, tol);
      if (yb[at] != to_bf16(yf[at])) return fmt("row %d col %d: bf16 %04x != bf16(f32out %.9g)", m, n, yb[at], yf[at]);
    }
  return "";
}
bool untouched_outside(const Buf<uint16_t>& yb, const Buf<float>& yf, size_t rows, int ldy, int M, int col0, int N) {
  for (size_t r = 0; r < rows; ++r)
    for (int c = 0; c < ldy; ++c) {
      if ((int)r < M && c >= col0 && c < col0 + N) continue;
      if (yb[r * ldy + c] != POISON || fbits(yf[r * ldy + c]) != POISON32) return false;
    }
  return true;
}
std::unique_ptr<Buf<uint16_t>> rand_x(int M, int K) {
  auto x = std::make_unique<Buf<uint16_t>>((size_t)M * K);
  for (size_t i = 0; i < x->n; ++i) (*x)[i] = rand_bf16(1.0);
  return x;
}
void poison(Buf<uint16_t>& b, Buf<float>& f) {
  for (size_t i = 0; i < b.n; ++i) b[i] = POISON;
  for (size_t i = 0; i < f.n; ++i) f[i] = bitsf(POISON32);
}

void case_gemv(int N, int K, bool with_bias) {
  Mat A(N, K);
  auto x = rand_x(11, K);
  Buf<uint16_t> bias(N);
  for (int n = 0; n < N; ++n) bias[n] = rand_bf16(0.5);
  const Buf<uint16_t>* bp = with_bias ? &bias : nullptr;
  const int ldy = N + 7, col0 = 3;
  std::map<int, std::vector<uint16_t>> rb;
  std::map<int, std::vector<uint32_t>> rf;
  std::string why;
  for (int M : {1, 3, 8, 11}) {
    Buf<uint16_t> yb((size_t)(M + 1) * ldy);
    Buf<float> yf((size_t)(M + 1) * ldy);
    poison(yb, yf);
    launch(A, *x, bp, M, ldy, col0, &yb, &yf);
    std::string w = check_gemv(A, *x, bp, M, ldy, col0, yb, yf);
    if (w.empty() && !untouched_outside(yb, yf, M + 1, ldy, M, col0, N)) w = "wrote outside rows < M / columns col0 .. col0+N-1";
    if (!w.empty() && why.empty()) why = fmt("M=%d: %s", M, w.c_str());
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        rb[M].push_back(yb[(size_t)m * ldy + col0 + n]);
        rf[M].push_back(fbits(yf[(size_t)m * ldy + col0 + n]));
      }
  }
  report(why.empty(), fmt("gemv_fp8%s (+_f32out) N=%d K=%d%s M=1,3,8,11 ldy=%d col0=%d vs fp64%s%s", g_warps == 8 ? "_w8" : "", N, K,
                          with_bias ? " +bias" : "", ldy, col0, why.empty() ? "" : ": ", why.c_str()));
  bool same = true;
  for (int M : {3, 8, 11})
    for (int i = 0; i < 3 * N; ++i) same &= rb[M][i] == rb[3][i] && rf[M][i] == rf[3][i];
  for (int i = 0; i < N; ++i) same &= rf[1][i] == rf[8][i] && rb[1][i] == rb[8][i];
  {  // rows 8..10 of M = 11 (the second pass) == an M = 3 launch on those rows
    Buf<uint16_t> x3((size_t)3 * K);
    std::memcpy(x3.p, x->p + (size_t)8 * K, (size_t)3 * K * 2);
    Buf<uint16_t> yb((size_t)3 * N);
    Buf<float> yf((size_t)3 * N);
    launch(A, x3, bp, 3, N, 0, &yb, &yf);
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < N; ++n)
        same &= yb[(size_t)m * N + n] == rb[11][(size_t)(8 + m) * N + n] && fbits(yf[(size_t)m * N + n]) == rf[11][(size_t)(8 + m) * N + n];
  }
  report(same, fmt("gemv_fp8%s N=%d K=%d batch invariance: row bits equal for M = 1, 3, 8, 11 (second pass)", g_warps == 8 ? "_w8" : "", N, K));
}

// A fused q/k/v row buffer from three launches (per-part weights whose N is not a multiple of 128).
void case_fused(int Nq, int Nkv, int K) {
  Mat q(Nq, K), k(Nkv, K), v(Nkv, K);
  const int M = 5, ldy = Nq + 2 * Nkv;
  auto x = rand_x(M, K);
  Buf<uint16_t> yb((size_t)(M + 1) * ldy);
  Buf<float> yf((size_t)(M + 1) * ldy);
  poison(yb, yf);
  launch(q, *x, nullptr, M, ldy, 0, &yb, &yf);
  launch(k, *x, nullptr, M, ldy, Nq, &yb, &yf);
  launch(v, *x, nullptr, M, ldy, Nq + Nkv, &yb, &yf);
  std::string why = check_gemv(q, *x, nullptr, M, ldy, 0, yb, yf);
  if (why.empty()) why = check_gemv(k, *x, nullptr, M, ldy, Nq, yb, yf);
  if (why.empty()) why = check_gemv(v, *x, nullptr, M, ldy, Nq + Nkv, yb, yf);
  if (why.empty() && !untouched_outside(yb, yf, M + 1, ldy, M, 0, ldy)) why = "the guard row was written";
  report(why.empty(), fmt("fused qkv row buffer (%d warps): q [%d], k [%d], v [%d], K=%d, M=%d (col0 0/%d/%d)%s%s", g_warps, Nq, Nkv, Nkv, K, M, Nq,
                          Nq + Nkv, why.empty() ? "" : ": ", why.c_str()));
}

void case_quant(int M, int K) {
  auto x = rand_x(M, K);
  const int G = K / 128;
  for (int k = 0; k < 128; ++k) (*x)[(size_t)1 % M * K + 128 * (G - 1) + k] = (k & 1) ? 0x8000 : 0;  // an all-zero group (±0)
  (*x)[5] = to_bf16(3.0e4f);                                                                    // a large value
  Buf<uint8_t> xq((size_t)M * K);
  Buf<float> xs((size_t)M * G);
  std::memset(xq.p, 0xAB, xq.n);
  emu_launch({(unsigned)(((long long)M * K / 1024 + ((long long)M * K % 1024 ? 1 : 0))), 1, 1}, 256,
             [&] { quant_fp8_act(reinterpret_cast<const __nv_bfloat16*>(x->p), xq.p, xs.p, M, K); });
  size_t bad = 0;
  std::string first;
  for (int m = 0; m < M; ++m)
    for (int g = 0; g < G; ++g) {
      float amax = 0.0f;
      for (int k = 0; k < 128; ++k) amax = std::max(amax, std::fabs(bf16f((*x)[(size_t)m * K + 128 * g + k])));
      const float s = std::max(amax, 1e-10f) / 448.0f;
      if (fbits(xs[(size_t)g * M + m]) != fbits(s) && bad++ == 0) first = fmt("xs[%d, %d] %.9g, want %.9g", g, m, xs[(size_t)g * M + m], s);
      for (int k = 0; k < 128; ++k) {
        const size_t i = (size_t)m * K + 128 * g + k;
        const uint8_t want = ref_encode(bf16f((*x)[i]) / s);
        if (xq[i] != want && bad++ == 0) first = fmt("xq[%d, %d] %02x, want %02x", m, 128 * g + k, xq[i], want);
      }
    }
  report(bad == 0, fmt("quant_fp8_act M=%d K=%d == absmax/448 groups, nearest e4m3 (zero group, 3e4 outlier), xs [K/128][M]%s%s", M, K,
                       bad ? ": " : "", first.c_str()));
}

}  // namespace

int main() {
  const auto t0 = std::chrono::steady_clock::now();
  codec();
  case_dequant(5, 256, 2);
  case_dequant(136, 392, 1);  // scale rows and columns past 128; K % 128 != 0 (a partial scale block)
  case_quant(3, 384);
  case_quant(10, 128);
  // GEMVs: K of 5 and 13 blocks (4 warps: warps 0 of the first take two; the register prefetch
  // across blocks), 9 and 25 (8 warps); N = 40 (a partial CTA), 144 (the second scale row).
  for (int warps : {4, 8}) {
    g_warps = warps;
    case_gemv(40, 128 * (warps == 8 ? 9 : 5), true);
    case_gemv(144, 128 * (warps == 8 ? 25 : 13), false);
    case_fused(64, 24, 256);
  }
  const int wg = run_wgmma_cases();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fp8: %d passed, %d failed (worst GEMV error / tolerance %.3g) in %.1f s\n", passes, fails, worst_ratio, secs);
  return fails || wg ? 1 : 0;
}
