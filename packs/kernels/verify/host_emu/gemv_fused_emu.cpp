// Runs packs/kernels/gemm_skinny.cu's fused decode GEMVs (gemv_bf16_rms and _pf,
// gemv_bf16_add, gemv_bf16_swiglu_add, gemv_bf16_swiglu) on the CPU (emu.h, emu_math.h) against the unfused sequence of the same
// run's kernels — rowwise.cu's rms_norm_f32 / add_rms_norm_f32 / swiglu (rowwise_emu.cpp) and
// gemv_bf16 — and requires every output BIT-IDENTICAL: y, the residual, and the side outputs h /
// act, for M = 1..8 and passes of more than 8 rows, odd N, K not a multiple of a block's
// stride, K below 512 (warps without a chunk), with and without a bias; rows past M and guard
// rows must stay untouched. Also: the fused program's final norm (rms_norm_f32 of the residual
// the last fused add left) equals add_rms_norm_f32's. Checks the fused kernels' logic (tiles,
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
    std::printf("gemv_fused_emu: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
