// Runs packs/kernels/gemm_skinny.cu's fused decode GEMVs (gemv_bf16_rms and _pf,
// gemv_bf16_add, gemv_bf16_swiglu_add, gemv_bf16_swiglu; for Gemma 3's block gemv_bf16_rms_off,
// gemv_bf16_postnorm_rms and _pf, gemv_bf16_geglu(_add)) and rowwise.cu's
// postnorm_add_rms_norm_f32_off on the CPU (emu.h, emu_math.h) against the unfused sequence of the
// same run's kernels — rowwise.cu's rms_norm_f32 / add_rms_norm_f32 / swiglu, rms_norm_f32_off /
// rms_norm_off / add_rms_norm_f32_off / geglu_tanh (rowwise_emu.cpp) and gemv_bf16 — and requires
// every output BIT-IDENTICAL: y, the residual (x_out for the sandwich entries, x_in untouched),
// and the side outputs h / act, for M = 1..8 and passes of more than 8 rows, odd N, K not a
// multiple of a block's stride, K below 512 (warps without a chunk), with and without a bias,
// offsets 1 and 0, Gemma-3-4B's K (2560, 10240); rows past M and guard rows must stay
// untouched. Also: the fused program's final norm (rms_norm_f32 of the residual the last fused add
// left) equals add_rms_norm_f32's; whole sandwich blocks (gate-up, down, next QKV) with the
// residual ping-ponged between two buffers equal the unfused program's, at 1..8 tokens (fused
// GEMVs) and above (postnorm_add_rms_norm_f32_off). Checks the fused kernels' logic (tiles,
// passes, reduction order, stores), not the GPU's arithmetic (mma.sync, expf and rsqrtf are
// host stand-ins here; the GPU check is packs/kernels/verify/fused_verify.py).
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "../../gemm_skinny.cu"

#include <cstdlib>
#include <random>
#include <string>

using kern::bf16;

extern "C" void rms_norm_f32(bf16* out, const float* x, const bf16* w, int n, int hidden, float eps);
extern "C" void add_rms_norm_f32(bf16* out, float* residual, const bf16* x, const bf16* w, int n, int hidden, float eps);
extern "C" void swiglu(bf16* out, const bf16* gate_up, int n, int inter);
extern "C" void geglu_tanh(bf16* out, const bf16* gate_up, int n, int inter);
extern "C" void rms_norm_off(bf16* out, const bf16* x, const bf16* w, int n, int hidden, float eps, float off);
extern "C" void rms_norm_f32_off(bf16* out, const float* x, const bf16* w, int n, int hidden, float eps, float off);
extern "C" void add_rms_norm_f32_off(bf16* out, float* residual, const bf16* x, const bf16* w, int n, int hidden, float eps,
                                     float off);
extern "C" void postnorm_add_rms_norm_f32_off(bf16* out, float* x_out, const float* x_in, const bf16* o, const bf16* w_post,
                                              const bf16* w_pre, int n, int hidden, float eps, float off);

namespace {

const float EPS = 1e-6f;
const uint16_t BF_NAN = 0x7fc1;  // a payload no kernel writes

template <class T>
struct Buf {  // 64-byte aligned, like device allocations (the kernels' vector paths need 16)
    T* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t n_) : n(n_) { p = static_cast<T*>(std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64)); }
    Buf(const Buf& o) : Buf(o.n) { std::memcpy(p, o.p, n * sizeof(T)); }
    ~Buf() { std::free(p); }
    T& operator[](size_t i) { return p[i]; }
    bool same(const Buf& o) const { return std::memcmp(p, o.p, n * sizeof(T)) == 0; }
};
typedef Buf<uint16_t> B16;
bf16* B(B16& b) { return reinterpret_cast<bf16*>(b.p); }
uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }

std::mt19937 rng(12345);
float normal(float s) { return std::normal_distribution<float>(0.f, s)(rng); }
void fill_bf(B16& b, float s) {
    for (size_t i = 0; i < b.n; ++i) b[i] = bf(normal(s));
}
void fill_nan(B16& b) {
    for (size_t i = 0; i < b.n; ++i) b[i] = BF_NAN;
}

int fails = 0, passes = 0;
void report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passes : fails)++;
}
// First differing element of two bf16 buffers, for the message.
std::string diff16(const B16& a, const B16& b, int cols) {
    for (size_t i = 0; i < a.n; ++i)
        if (a.p[i] != b.p[i]) {
            char m[128];
            std::snprintf(m, sizeof m, " (first difference at row %zu col %zu: %04x vs %04x)", i / cols, i % cols, a.p[i], b.p[i]);
            return m;
        }
    return "";
}

void gemv(const B16& x, const B16& W, const B16* bias, B16& y, int M, int N, int K) {
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16(reinterpret_cast<const bf16*>(x.p), reinterpret_cast<const bf16*>(W.p),
                  bias ? reinterpret_cast<const bf16*>(bias->p) : nullptr, reinterpret_cast<bf16*>(y.p), M, N, K);
    });
}

// qkv / gate_up: h = rms_norm_f32(res)·w; y = h·Wᵀ (+bias)  vs  gemv_bf16_rms
void case_rms(int M, int N, int K, bool with_bias) {
    const int R = M + 2;  // two guard rows
    Buf<float> res((size_t)R * K);
    for (size_t i = 0; i < res.n; ++i) res[i] = normal(i % 7 == 0 ? 30.f : 1.f);
    B16 nw(K), W((size_t)N * K), bias(N);
    fill_bf(nw, 1.f);
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    B16 h1((size_t)R * K), y1((size_t)R * N), h2((size_t)R * K), y2((size_t)R * N);
    fill_nan(h1), fill_nan(y1), fill_nan(h2), fill_nan(y2);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_f32(B(h1), res.p, B(nw), M, K, EPS); });
    gemv(h1, W, with_bias ? &bias : nullptr, y1, M, N, K);
    const Buf<float> res0 = res;
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_rms(res.p, B(nw), B(h2), B(W), with_bias ? B(bias) : nullptr, B(y2), M, N, K, EPS);
    });
    char what[160];
    std::snprintf(what, sizeof what, "gemv_bf16_rms M=%d N=%d K=%d%s", M, N, K, with_bias ? " bias" : "");
    report(y1.same(y2), std::string(what) + ": y == rms_norm_f32 -> gemv_bf16" + diff16(y1, y2, N));
    report(h1.same(h2), std::string(what) + ": h == rms_norm_f32's (guard rows untouched)" + diff16(h1, h2, K));
    report(res.same(res0), std::string(what) + ": the residual is only read");
    // gemv_bf16_rms_pf: the same kernel with an L2 prefetch of W (a no-op here)
    B16 h3((size_t)R * K), y3((size_t)R * N);
    fill_nan(h3), fill_nan(y3);
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_rms_pf(res.p, B(nw), B(h3), B(W), with_bias ? B(bias) : nullptr, B(y3), M, N, K, EPS);
    });
    report(y1.same(y3) && h1.same(h3), std::string(what) + ": gemv_bf16_rms_pf's y and h too" + diff16(y1, y3, N));
}

// o_proj: y = x·Wᵀ; res += y (add_rms_norm_f32's update)  vs  gemv_bf16_add
void case_add(int M, int N, int K, bool with_bias) {
    const int R = M + 2;
    B16 x((size_t)R * K), W((size_t)N * K), bias(N), nw(N);
    fill_bf(x, 1.f);
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    fill_bf(nw, 1.f);
    Buf<float> res((size_t)R * N);
    for (size_t i = 0; i < res.n; ++i) res[i] = normal(3.f);
    Buf<float> res1 = res, res2 = res;
    B16 y1((size_t)R * N), y2((size_t)R * N), hn((size_t)R * N);
    fill_nan(y1), fill_nan(y2), fill_nan(hn);
    gemv(x, W, with_bias ? &bias : nullptr, y1, M, N, K);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32(B(hn), res1.p, B(y1), B(nw), M, N, EPS); });
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_add(B(x), B(W), with_bias ? B(bias) : nullptr, B(y2), res2.p, M, N, K);
    });
    char what[160];
    std::snprintf(what, sizeof what, "gemv_bf16_add M=%d N=%d K=%d%s", M, N, K, with_bias ? " bias" : "");
    report(y1.same(y2), std::string(what) + ": y == gemv_bf16's" + diff16(y1, y2, N));
    report(res1.same(res2), std::string(what) + ": residual == add_rms_norm_f32's update (guard rows untouched)");
}

// down_proj: act = swiglu(gate_up); y = act·Wᵀ; res += y  vs  gemv_bf16_swiglu_add (and without
// the add, gemv_bf16_swiglu); then rms_norm_f32 of the fused residual vs add_rms_norm_f32 of (res, y).
void case_swiglu(int M, int N, int K, bool with_bias) {
    const int R = M + 2;
    B16 gu((size_t)R * 2 * K), W((size_t)N * K), bias(N), nw(N);
    for (size_t i = 0; i < gu.n; ++i) {  // SiLU over a wide range: large |x|, tiny, zeros
        const int c = (int)(rng() % 16);
        gu[i] = bf(c == 0 ? normal(40.f) : c == 1 ? normal(1e-3f) : c == 2 ? 0.f : normal(2.f));
    }
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    fill_bf(nw, 1.f);
    Buf<float> res((size_t)R * N);
    for (size_t i = 0; i < res.n; ++i) res[i] = normal(3.f);
    Buf<float> res1 = res, res2 = res;
    B16 a1((size_t)R * K), a2((size_t)R * K), y1((size_t)R * N), y2((size_t)R * N), hn1((size_t)R * N), hn2((size_t)R * N);
    fill_nan(a1), fill_nan(a2), fill_nan(y1), fill_nan(y2), fill_nan(hn1), fill_nan(hn2);
    emu_launch({(unsigned)M, 1, 1}, 256, [&] { swiglu(B(a1), B(gu), M, K); });
    gemv(a1, W, with_bias ? &bias : nullptr, y1, M, N, K);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32(B(hn1), res1.p, B(y1), B(nw), M, N, EPS); });
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_swiglu_add(B(gu), B(a2), B(W), with_bias ? B(bias) : nullptr, B(y2), res2.p, M, N, K);
    });
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_f32(B(hn2), res2.p, B(nw), M, N, EPS); });
    B16 a3((size_t)R * K), y3((size_t)R * N);
    fill_nan(a3), fill_nan(y3);
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_swiglu(B(gu), B(a3), B(W), with_bias ? B(bias) : nullptr, B(y3), M, N, K);
    });
    char what[160];
    std::snprintf(what, sizeof what, "gemv_bf16_swiglu_add M=%d N=%d K=%d%s", M, N, K, with_bias ? " bias" : "");
    report(a1.same(a2), std::string(what) + ": act == swiglu's (guard rows untouched)" + diff16(a1, a2, K));
    report(y1.same(y2), std::string(what) + ": y == swiglu -> gemv_bf16" + diff16(y1, y2, N));
    report(res1.same(res2), std::string(what) + ": residual == add_rms_norm_f32's update");
    report(hn1.same(hn2), std::string(what) + ": rms_norm_f32(fused residual) == add_rms_norm_f32's h" + diff16(hn1, hn2, N));
    report(a1.same(a3) && y1.same(y3), std::string(what) + ": gemv_bf16_swiglu's act and y == swiglu -> gemv_bf16" + diff16(y1, y3, N));
}

// ---- (off + w) norms, sandwich norms, GeGLU (Gemma 3's block).
// Gemma's norm weights are zero-centred: small values around 0, the offset adds the 1.
void fill_w0(B16& b) {
    for (size_t i = 0; i < b.n; ++i) b[i] = bf(normal(0.3f));
}
// A residual with outlier features (Gemma's residual stream grows large).
void fill_res(Buf<float>& r, float s) {
    for (size_t i = 0; i < r.n; ++i) r[i] = normal(i % 7 == 0 ? 30.f * s : s);
}
bool same32(const Buf<float>& a, const Buf<float>& b) { return std::memcmp(a.p, b.p, a.n * sizeof(float)) == 0; }
std::string tag(const char* entry, int M, int N, int K, bool bias, float off) {
    char w[200];
    std::snprintf(w, sizeof w, "%s M=%d N=%d K=%d off=%g%s", entry, M, N, K, off, bias ? " bias" : "");
    return w;
}

// layer 0's QKV: h = rms_norm_f32_off(res); y = h·Wᵀ  vs  gemv_bf16_rms_off
void case_rms_off(int M, int N, int K, bool with_bias, float off) {
    const int R = M + 2;
    Buf<float> res((size_t)R * K);
    fill_res(res, 1.f);
    B16 nw(K), W((size_t)N * K), bias(N);
    fill_w0(nw);
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    B16 h1((size_t)R * K), y1((size_t)R * N), h2((size_t)R * K), y2((size_t)R * N);
    fill_nan(h1), fill_nan(y1), fill_nan(h2), fill_nan(y2);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_f32_off(B(h1), res.p, B(nw), M, K, EPS, off); });
    gemv(h1, W, with_bias ? &bias : nullptr, y1, M, N, K);
    const Buf<float> res0 = res;
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_rms_off(res.p, B(nw), B(h2), B(W), with_bias ? B(bias) : nullptr, B(y2), M, N, K, EPS, off);
    });
    const std::string what = tag("gemv_bf16_rms_off", M, N, K, with_bias, off);
    report(y1.same(y2), what + ": y == rms_norm_f32_off -> gemv_bf16" + diff16(y1, y2, N));
    report(h1.same(h2), what + ": h == rms_norm_f32_off's (guard rows untouched)" + diff16(h1, h2, K));
    report(res.same(res0), what + ": the residual is only read");
}

// The sandwich prologue (gate-up after O, the next QKV after down): K = hidden.
//   unfused: rms_norm_off(o_n, o, w_post); add_rms_norm_f32_off(h, x, o_n, w_pre) (x in place); y = h·Wᵀ
//   fused:   gemv_bf16_postnorm_rms(x_in, o, w_post, x_out, w_pre, h, W, bias, y)  (and _pf)
//   rowwise: postnorm_add_rms_norm_f32_off(h, x_out, x_in, o, w_post, w_pre) into another buffer and
//            in place, the launch of steps above 8 tokens
void case_postnorm(int M, int N, int K, bool with_bias, float off, float o_scale = 1.f) {
    const int R = M + 2;
    Buf<float> x((size_t)R * K);
    fill_res(x, 3.f);
    B16 o((size_t)R * K), wp(K), wn(K), W((size_t)N * K), bias(N);
    fill_bf(o, o_scale);
    fill_w0(wp);
    fill_w0(wn);
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    // unfused
    Buf<float> x1 = x;
    B16 on((size_t)R * K), h1((size_t)R * K), y1((size_t)R * N);
    fill_nan(on), fill_nan(h1), fill_nan(y1);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_off(B(on), B(o), B(wp), M, K, EPS, off); });
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32_off(B(h1), x1.p, B(on), B(wn), M, K, EPS, off); });
    gemv(h1, W, with_bias ? &bias : nullptr, y1, M, N, K);
    // fused GEMV: x_out starts as NaN except the guard rows, which must stay as they are
    const std::string what = tag("gemv_bf16_postnorm_rms", M, N, K, with_bias, off);
    for (const char* entry : {"gemv_bf16_postnorm_rms", "gemv_bf16_postnorm_rms_pf"}) {
        const bool pf = entry[std::strlen(entry) - 1] == 'f';
        Buf<float> xin = x, xout = x;
        for (size_t i = 0; i < (size_t)M * K; ++i) xout[i] = std::nanf("");
        B16 h2((size_t)R * K), y2((size_t)R * N);
        fill_nan(h2), fill_nan(y2);
        emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
            (pf ? gemv_bf16_postnorm_rms_pf : gemv_bf16_postnorm_rms)(xin.p, B(o), B(wp), xout.p, B(wn), B(h2), B(W),
                                                                      with_bias ? B(bias) : nullptr, B(y2), M, N, K, EPS, off);
        });
        const std::string w = pf ? what + " (_pf)" : what;
        report(y1.same(y2), w + ": y == rms_norm_off -> add_rms_norm_f32_off -> gemv_bf16" + diff16(y1, y2, N));
        report(h1.same(h2), w + ": h == add_rms_norm_f32_off's (guard rows untouched)" + diff16(h1, h2, K));
        report(same32(x1, xout), w + ": x_out == add_rms_norm_f32_off's residual (guard rows untouched)");
        report(same32(x, xin), w + ": x_in is only read");
    }
    // the row-wise launch of larger steps, into another buffer and in place
    {
        Buf<float> xin = x, xout = x;
        for (size_t i = 0; i < (size_t)M * K; ++i) xout[i] = std::nanf("");
        B16 h3((size_t)R * K);
        fill_nan(h3);
        emu_launch({(unsigned)M, 1, 1}, 128, [&] {
            postnorm_add_rms_norm_f32_off(B(h3), xout.p, xin.p, B(o), B(wp), B(wn), M, K, EPS, off);
        });
        const std::string w = tag("postnorm_add_rms_norm_f32_off", M, 0, K, false, off);
        report(h1.same(h3) && same32(x1, xout) && same32(x, xin),
               w + ": h, x_out == rms_norm_off -> add_rms_norm_f32_off (x_in only read)" + diff16(h1, h3, K));
        Buf<float> xi = x;
        B16 h4((size_t)R * K);
        fill_nan(h4);
        emu_launch({(unsigned)M, 1, 1}, 128, [&] {
            postnorm_add_rms_norm_f32_off(B(h4), xi.p, xi.p, B(o), B(wp), B(wn), M, K, EPS, off);
        });
        report(h1.same(h4) && same32(x1, xi), w + ": in place (x_out == x_in) too" + diff16(h1, h4, K));
    }
}

// The row-wise entry alone at row lengths whose halves take the scalar paths (K % 8 == 4: the
// bf16 norm scalar, the fp32 one vector; K odd: both scalar), and long rows (past ROW_CACHE).
void case_postnorm_rowwise(int M, int K, float off) {
    const int R = M + 1;
    Buf<float> x((size_t)R * K);
    fill_res(x, 3.f);
    B16 o((size_t)R * K), wp(K), wn(K);
    fill_bf(o, 1.f);
    fill_w0(wp);
    fill_w0(wn);
    Buf<float> x1 = x;
    B16 on((size_t)R * K), h1((size_t)R * K), h2((size_t)R * K);
    fill_nan(on), fill_nan(h1), fill_nan(h2);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_off(B(on), B(o), B(wp), M, K, EPS, off); });
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32_off(B(h1), x1.p, B(on), B(wn), M, K, EPS, off); });
    Buf<float> xin = x, xout = x;
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { postnorm_add_rms_norm_f32_off(B(h2), xout.p, xin.p, B(o), B(wp), B(wn), M, K, EPS, off); });
    report(h1.same(h2) && same32(x1, xout) && same32(x, xin),
           tag("postnorm_add_rms_norm_f32_off", M, 0, K, false, off) + ": h, x_out == rms_norm_off -> add_rms_norm_f32_off" +
               diff16(h1, h2, K));
}

// down_proj of a GeGLU MLP: act = geglu_tanh(gate_up); y = act·Wᵀ  vs  gemv_bf16_geglu; and with the
// residual add, vs gemv_bf16_geglu_add (+ add_rms_norm_f32's residual update).
void case_geglu(int M, int N, int K, bool with_bias) {
    const int R = M + 2;
    B16 gu((size_t)R * 2 * K), W((size_t)N * K), bias(N), nw(N);
    for (size_t i = 0; i < gu.n; ++i) {  // GELU over a wide range: tanh saturated, tiny, zeros, negatives
        const int c = (int)(rng() % 16);
        gu[i] = bf(c == 0 ? normal(40.f) : c == 1 ? normal(1e-3f) : c == 2 ? 0.f : c == 3 ? -std::fabs(normal(6.f)) : normal(2.f));
    }
    fill_bf(W, 0.05f);
    fill_bf(bias, 0.5f);
    fill_bf(nw, 1.f);
    Buf<float> res((size_t)R * N);
    for (size_t i = 0; i < res.n; ++i) res[i] = normal(3.f);
    Buf<float> res1 = res, res2 = res;
    B16 a1((size_t)R * K), y1((size_t)R * N), hn((size_t)R * N);
    fill_nan(a1), fill_nan(y1), fill_nan(hn);
    emu_launch({(unsigned)M, 1, 1}, 256, [&] { geglu_tanh(B(a1), B(gu), M, K); });
    gemv(a1, W, with_bias ? &bias : nullptr, y1, M, N, K);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32(B(hn), res1.p, B(y1), B(nw), M, N, EPS); });
    B16 a2((size_t)R * K), y2((size_t)R * N), a3((size_t)R * K), y3((size_t)R * N);
    fill_nan(a2), fill_nan(y2), fill_nan(a3), fill_nan(y3);
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_geglu(B(gu), B(a2), B(W), with_bias ? B(bias) : nullptr, B(y2), M, N, K);
    });
    emu_launch({(unsigned)((N + 15) / 16), 1, 1}, 256, [&] {
        gemv_bf16_geglu_add(B(gu), B(a3), B(W), with_bias ? B(bias) : nullptr, B(y3), res2.p, M, N, K);
    });
    const std::string what = tag("gemv_bf16_geglu", M, N, K, with_bias, 0.f);
    report(a1.same(a2), what + ": act == geglu_tanh's (guard rows untouched)" + diff16(a1, a2, K));
    report(y1.same(y2), what + ": y == geglu_tanh -> gemv_bf16" + diff16(y1, y2, N));
    report(a1.same(a3) && y1.same(y3), what + " (_add): act and y == geglu_tanh -> gemv_bf16" + diff16(y1, y3, N));
    report(res1.same(res2), what + " (_add): residual == add_rms_norm_f32's update");
}

// Two whole sandwich blocks' MLP halves and the next QKV, as the fused program runs them with the
// residual ping-ponged (x_a -> x_b -> x_a), vs the unfused program on one residual buffer:
//   unfused  o_n = post(o); x += o_n; h = pre(x); gu = h·Wguᵀ; act = geglu(gu); mlp = act·Wdᵀ;
//            m_n = post_ff(mlp); x += m_n; h = in'(x); qkv = h·Wqkvᵀ
//   fused    gemv_bf16_postnorm_rms(x_a -> x_b) (gate-up), gemv_bf16_geglu (down),
//            gemv_bf16_postnorm_rms(x_b -> x_a) (QKV)
// Above 8 tokens (M > 8) the fused program's row-wise launches: postnorm_add_rms_norm_f32_off, the
// GEMVs as plain gemv_bf16, geglu_tanh.
void case_block(int M, int H, int I, int QKV, float off) {
    const int R = M + 1;
    Buf<float> x((size_t)R * H);
    fill_res(x, 3.f);
    B16 o((size_t)R * H), wpa(H), wpf(H), wff(H), win(H), Wgu((size_t)2 * I * H), Wd((size_t)H * I), Wq((size_t)QKV * H);
    fill_bf(o, 2.f);
    fill_w0(wpa), fill_w0(wpf), fill_w0(wff), fill_w0(win);
    fill_bf(Wgu, 0.05f);
    fill_bf(Wd, 0.05f);
    fill_bf(Wq, 0.05f);
    // unfused, x in place
    Buf<float> x1 = x;
    B16 on((size_t)R * H), h1((size_t)R * H), gu1((size_t)R * 2 * I), a1((size_t)R * I), m1((size_t)R * H), mn((size_t)R * H),
        q1((size_t)R * QKV);
    fill_nan(on), fill_nan(h1), fill_nan(gu1), fill_nan(a1), fill_nan(m1), fill_nan(mn), fill_nan(q1);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_off(B(on), B(o), B(wpa), M, H, EPS, off); });
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32_off(B(h1), x1.p, B(on), B(wpf), M, H, EPS, off); });
    gemv(h1, Wgu, nullptr, gu1, M, 2 * I, H);
    emu_launch({(unsigned)M, 1, 1}, 256, [&] { geglu_tanh(B(a1), B(gu1), M, I); });
    gemv(a1, Wd, nullptr, m1, M, H, I);
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { rms_norm_off(B(mn), B(m1), B(wff), M, H, EPS, off); });
    emu_launch({(unsigned)M, 1, 1}, 128, [&] { add_rms_norm_f32_off(B(h1), x1.p, B(mn), B(win), M, H, EPS, off); });
    gemv(h1, Wq, nullptr, q1, M, QKV, H);
    // fused, x_a -> x_b -> x_a
    Buf<float> xa = x, xb = x;
    B16 h2((size_t)R * H), gu2((size_t)R * 2 * I), a2((size_t)R * I), m2((size_t)R * H), q2((size_t)R * QKV);
    fill_nan(h2), fill_nan(gu2), fill_nan(a2), fill_nan(m2), fill_nan(q2);
    const unsigned g = [](int n) { return (unsigned)((n + 15) / 16); }(2 * I);
    if (M <= 8) {
        emu_launch({g, 1, 1}, 256, [&] { gemv_bf16_postnorm_rms(xa.p, B(o), B(wpa), xb.p, B(wpf), B(h2), B(Wgu), nullptr, B(gu2), M, 2 * I, H, EPS, off); });
        emu_launch({(unsigned)((H + 15) / 16), 1, 1}, 256, [&] { gemv_bf16_geglu(B(gu2), B(a2), B(Wd), nullptr, B(m2), M, H, I); });
        emu_launch({(unsigned)((QKV + 15) / 16), 1, 1}, 256, [&] {
            gemv_bf16_postnorm_rms(xb.p, B(m2), B(wff), xa.p, B(win), B(h2), B(Wq), nullptr, B(q2), M, QKV, H, EPS, off);
        });
    } else {
        emu_launch({(unsigned)M, 1, 1}, 128, [&] { postnorm_add_rms_norm_f32_off(B(h2), xb.p, xa.p, B(o), B(wpa), B(wpf), M, H, EPS, off); });
        gemv(h2, Wgu, nullptr, gu2, M, 2 * I, H);
        emu_launch({(unsigned)M, 1, 1}, 256, [&] { geglu_tanh(B(a2), B(gu2), M, I); });
        gemv(a2, Wd, nullptr, m2, M, H, I);
        emu_launch({(unsigned)M, 1, 1}, 128, [&] { postnorm_add_rms_norm_f32_off(B(h2), xa.p, xb.p, B(m2), B(wff), B(win), M, H, EPS, off); });
        gemv(h2, Wq, nullptr, q2, M, QKV, H);
    }
    char what[200];
    std::snprintf(what, sizeof what, "sandwich block M=%d H=%d I=%d QKV=%d off=%g (%s)", M, H, I, QKV, off,
                  M <= 8 ? "fused GEMVs" : "row-wise launches");
    report(gu1.same(gu2) && a1.same(a2) && m1.same(m2), std::string(what) + ": gate_up, act, mlp == unfused" + diff16(m1, m2, H));
    report(q1.same(q2) && h1.same(h2), std::string(what) + ": the next QKV and h == unfused" + diff16(q1, q2, QKV));
    report(same32(x1, xa), std::string(what) + ": the residual after the block (x_a) == unfused x");
}

}  // namespace

int main() {
    // (M, N, K): one pass (M <= 8) and two (M > 8); N odd and below 16; K a multiple of 8 but
    // not of 512 (a partial group), K < 512 (warps without a chunk), K = 8.
    for (auto [M, N, K, b] : {std::tuple{1, 40, 1024, false}, {3, 72, 1000, true}, {8, 33, 2560, false}, {5, 16, 64, false},
                              {11, 24, 520, true}, {4, 24, 8, false}, {2, 7, 1032, false}, {6, 48, 3072, false},
                              // long rows: an rstd one ulp off flips some of the 8 x 64K rounded values
                              {8, 16, 65536, false}, {32, 16, 65536, false}})
        case_rms(M, N, K, b);
    for (auto [M, N, K, b] : {std::tuple{1, 40, 1024, false}, {7, 72, 1000, true}, {8, 100, 2048, false}, {13, 40, 264, false},
                              {2, 9, 64, true}})
        case_add(M, N, K, b);
    for (auto [M, N, K, b] : {std::tuple{1, 40, 3072, false}, {4, 56, 1000, true}, {8, 24, 520, false}, {9, 16, 136, false},
                              {2, 8, 8, false}, {6, 33, 1544, false}})
        case_swiglu(M, N, K, b);
    // Gemma 3 (off + w) norms, sandwich norms, GeGLU. Gemma-3-4B's rows (hidden 2560, intermediate
    // 10240) with fewer output rows N (the x operand's arithmetic and the stores depend on K, M and
    // the grid, not on N beyond the grid), all M = 1..8; small and odd shapes; offsets 1 (Hugging
    // Face weights) and 0 (GGUF's, with the 1 added).
    for (int M = 1; M <= 8; ++M) {
        case_rms_off(M, 48, 2560, M == 3, 1.f);
        // N = 1280: 80 CTAs, each of the 40 64-chunks of K stored by its own CTA; N = 72: 5 CTAs, 8 each
        case_postnorm(M, M == 8 ? 1280 : 72, 2560, M == 5, 1.f);
        case_geglu(M, M == 1 ? 640 : 40, 10240, M == 2);
    }
    for (auto [M, N, K, b] : {std::tuple{3, 40, 1000, true}, {11, 24, 520, false}, {2, 7, 8, false}, {4, 33, 1032, true}})
        case_rms_off(M, N, K, b, 0.f);
    for (auto [M, N, K, b, sc] : {std::tuple{1, 40, 1024, false, 1.f}, {3, 72, 1000, true, 1e-3f}, {11, 24, 520, false, 1.f},
                                  {2, 9, 8, false, 1.f}, {6, 48, 3072, false, 60.f}, {8, 16, 640, true, 1.f}, {16, 16, 1152, false, 1.f}})
        case_postnorm(M, N, K, b, M % 2 ? 1.f : 0.f, sc);
    case_postnorm(8, 16, 65536, false, 1.f);  // long rows: an rstd one ulp off flips some of the 8 x 64K values
    for (auto [M, K] : {std::pair{3, 1004}, {2, 1001}, {5, 12}, {2, 10248}, {1, 2560}}) case_postnorm_rowwise(M, K, 1.f);
    for (auto [M, N, K, b] : {std::tuple{3, 72, 1000, true}, {9, 16, 136, false}, {2, 8, 8, false}, {6, 33, 1544, false}})
        case_geglu(M, N, K, b);
    for (int M : {1, 5, 8, 9}) case_block(M, 640, 2048, 1024, 1.f);  // Gemma-3-270M's rows (QKV 4 x 256)
    case_block(3, 1152, 6912, 1536, 0.f);                            // Gemma-3-1B's, GGUF's offset
    std::printf("gemv_fused_emu: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
