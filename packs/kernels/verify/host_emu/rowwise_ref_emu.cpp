// Runs packs/kernels/rowwise.cu's entries on the CPU (emu.h, emu_math.h) against references
// written as transformers computes them:
//   * rms_norm_off / add_rms_norm_off / rms_norm_f32_off / add_rms_norm_f32_off against
//     Gemma3RMSNorm: bf16((x.float() * rsqrt(mean(x²) + eps)) * (off + w.float())), off 1 (Hugging
//     Face weights) and 0 (GGUF, whose converter added the 1), the residual updates (bf16 add / fp32
//     add) bit-exact;
//   * geglu_tanh against PyTorch's tanh-GELU formula in fp32 (bf16(bf16(gelu_tanh(g)) * u)) and
//     against fp64;
//   * embedding / embedding_f32 with a scale (Gemma3TextScaledWordEmbedding: bf16(row * scale),
//     scale = bf16(sqrt(hidden))) and with scale 1 (a copy, as before the parameter existed);
//   * the unchanged entries (rms_norm, add_rms_norm, rms_norm_f32, add_rms_norm_f32: Qwen3RMSNorm's
//     bf16(w * bf16(x * r)); swiglu) against their references.
// Every row path is taken: the 16-byte vector path, the scalar path (a row length that is not a
// multiple of 8 / 4), rows longer than the register cache (8,192 bf16). Where the sum of squares
// is exact in fp32 (multiples of 1/8, a power-of-two row length: every summation order and the
// fused or unfused mean + eps agree) the norms must be BIT-IDENTICAL to the fp32 reference; with
// random data and other lengths (only the order of the fp32 sum differs) every element within one
// bf16 unit of it and at least 99% identical. Rows past n and guard elements stay untouched.
// rsqrtf / expf / tanhf are the host's here (emu_math.h), the same in kernel and reference.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "../../rowwise.cu"

#include <algorithm>
#include <random>
#include <string>

namespace {

using kern::bf16;
uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }
float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
float rbf(float f) { return fb(bf(f)); }
const uint16_t BF_NAN = 0x7fc1;  // a payload no kernel writes
const float EPS = 1e-6f;

int fails = 0, passes = 0;
void report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passes : fails)++;
}

template <class T>
struct Buf {  // 64-byte aligned, like device allocations (the kernels' vector paths need 16)
    T* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t n_, T fill) : n(n_) {
        p = static_cast<T*>(std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64));
        std::fill(p, p + n, fill);
    }
    Buf(const Buf& o) : n(o.n) {
        p = static_cast<T*>(std::aligned_alloc(64, ((n * sizeof(T) + 63) / 64) * 64));
        std::memcpy(p, o.p, n * sizeof(T));
    }
    ~Buf() { std::free(p); }
    T& operator[](size_t i) { return p[i]; }
    const T& operator[](size_t i) const { return p[i]; }
};
typedef Buf<uint16_t> B16;
bf16* B(B16& b) { return reinterpret_cast<bf16*>(b.p); }

std::mt19937 rng(2026);
float normal(float s) { return std::normal_distribution<float>(0.f, s)(rng); }
// exact: multiples of 1/8 up to 31/8 (sums of squares of up to 16,384 of them are exact in fp32)
float sample(bool exact, float s) { return exact ? (float)((int)(rng() % 63) - 31) / 8.f : normal(s); }

// Distance of two bf16 values in units of the last place (same sign; NaN: huge).
int ulps(uint16_t a, uint16_t b) {
    if ((a & 0x7fff) > 0x7f80 || (b & 0x7fff) > 0x7f80) return 1 << 20;
    auto key = [](uint16_t u) { return (u & 0x8000) ? -(int)(u & 0x7fff) : (int)(u & 0x7fff); };
    return std::abs(key(a) - key(b));
}

struct Cmp {
    size_t n = 0, same = 0;
    int worst = 0;
    void add(uint16_t got, uint16_t want) {
        ++n;
        same += got == want;
        worst = std::max(worst, ulps(got, want));
    }
    // bit-exact where required, else within one bf16 unit and >= 99% identical
    bool ok(bool exact) const { return exact ? same == n : (worst <= 1 && same >= n * 99 / 100); }
    std::string str() const {
        char m[128];
        std::snprintf(m, sizeof m, "%.3f%% bit-identical, max %d bf16 unit%s apart", 100.0 * same / std::max<size_t>(1, n),
                      worst, worst == 1 ? "" : "s");
        return m;
    }
};

// The norm of one fp32 row (values exact as given): r = rsqrt(sum(v²) * (1 / hidden) + eps), the
// sum in fp32 (sequential: the kernel's block order differs, which matters only where sums are
// inexact), then out = Gemma3RMSNorm's bf16((v * r) * (off + w)) or Qwen3RMSNorm's
// bf16(w * bf16(v * r)).
std::vector<uint16_t> ref_norm(const std::vector<float>& v, const uint16_t* w, bool gemma, float off) {
    float ss = 0.f;
    for (float x : v) ss += x * x;
    const float r = rsqrtf(ss * (1.0f / (float)v.size()) + EPS);
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = gemma ? bf((v[i] * r) * (off + fb(w[i]))) : bf(fb(w[i]) * rbf(v[i] * r));
    return o;
}

// ---- the RMSNorm entries: plain / fused add, bf16 / fp32 rows, with or without the offset
void case_norm(int H, int n, bool exact, bool f32, bool add, bool gemma, float off) {
    const int G = 2;  // guard rows
    Buf<float> xf((size_t)(n + G) * H, NAN), resf((size_t)(n + G) * H, NAN);
    B16 x((size_t)(n + G) * H, BF_NAN), res((size_t)(n + G) * H, BF_NAN), w(H, 0), out((size_t)(n + G) * H, BF_NAN);
    for (int i = 0; i < H; ++i) w[i] = gemma ? bf(normal(0.3f)) : bf(1.f + normal(0.1f));  // Gemma's weights are zero-centred
    for (size_t i = 0; i < (size_t)n * H; ++i) {
        if (f32) {
            if (add) {
                resf[i] = exact ? sample(true, 0) : normal(2.f);
                x[i] = bf(sample(exact, 0.7f));
            } else {
                xf[i] = exact ? sample(true, 0) : normal(2.f);
            }
        } else {
            x[i] = bf(sample(exact, add ? 0.7f : 2.f));
            if (add) res[i] = bf(sample(exact, 2.f));
        }
    }
    // exact sums with a fused add: keep the new residual a multiple of 1/8 up to 31/8 too
    if (exact && add)
        for (size_t i = 0; i < (size_t)n * H; ++i) {
            const float xv = fb(x[i]);
            if (f32) resf[i] = std::clamp(resf[i] + xv, -31.f / 8, 31.f / 8) - xv;
            else res[i] = bf(std::clamp(fb(res[i]) + xv, -31.f / 8, 31.f / 8) - xv);
        }
    const B16 res0 = res;
    const Buf<float> resf0 = resf;
    emu_launch(uint3_{(unsigned)n, 1, 1}, 128, [&] {
        if (!f32 && !add && !gemma) rms_norm(B(out), B(x), B(w), n, H, EPS);
        if (!f32 && !add && gemma) rms_norm_off(B(out), B(x), B(w), n, H, EPS, off);
        if (!f32 && add && !gemma) add_rms_norm(B(out), B(res), B(x), B(w), n, H, EPS);
        if (!f32 && add && gemma) add_rms_norm_off(B(out), B(res), B(x), B(w), n, H, EPS, off);
        if (f32 && !add && !gemma) rms_norm_f32(B(out), xf.p, B(w), n, H, EPS);
        if (f32 && !add && gemma) rms_norm_f32_off(B(out), xf.p, B(w), n, H, EPS, off);
        if (f32 && add && !gemma) add_rms_norm_f32(B(out), resf.p, B(x), B(w), n, H, EPS);
        if (f32 && add && gemma) add_rms_norm_f32_off(B(out), resf.p, B(x), B(w), n, H, EPS, off);
    });
    Cmp c;
    size_t bad_res = 0, guard = 0;
    for (int t = 0; t < n; ++t) {
        std::vector<float> v(H);
        for (int i = 0; i < H; ++i) {
            const size_t k = (size_t)t * H + i;
            if (!add) {
                v[i] = f32 ? xf[k] : fb(x[k]);
            } else if (f32) {  // fp32 residual: res + float(x), exact fp32 add, written back
                v[i] = resf0[k] + fb(x[k]);
                bad_res += std::memcmp(&v[i], &resf[k], 4) != 0;
            } else {  // transformers' bf16 add: residual = bf16(residual + x), written back
                v[i] = rbf(fb(res0[k]) + fb(x[k]));
                bad_res += bf(v[i]) != res[k];
            }
        }
        const std::vector<uint16_t> want = ref_norm(v, w.p, gemma, off);
        for (int i = 0; i < H; ++i) c.add(out[(size_t)t * H + i], want[i]);
    }
    for (size_t k = (size_t)n * H; k < (size_t)(n + G) * H; ++k) {
        guard += out[k] != BF_NAN;
        if (add) guard += f32 ? !std::isnan(resf[k]) : res[k] != BF_NAN;
    }
    const bool pow2 = (H & (H - 1)) == 0;
    const bool must_exact = exact && pow2;
    const bool vec = f32 ? (H % 4 == 0) : (H % 8 == 0);
    char m[320];
    std::snprintf(m, sizeof m, "%s%s%s H=%d n=%d (%s path%s, %s data%s): %s vs %s%s%s%s", add ? "add_" : "", "rms_norm",
                  std::string(std::string(f32 ? "_f32" : "") + (gemma ? "_off" : "")).c_str(), H, n, vec ? "vector" : "scalar",
                  !f32 && H > 8192 ? ", rows past the register cache re-read" : "", exact ? "exact-sum" : "random",
                  gemma ? (off == 1.f ? ", off 1" : ", off 0") : "", c.str().c_str(),
                  gemma ? "Gemma3RMSNorm bf16((x*r)*(off+w))" : "Qwen3RMSNorm bf16(w*bf16(x*r))",
                  must_exact ? " (must be bit-exact)" : "", add ? (bad_res ? "; RESIDUAL WRONG" : "; residual update bit-exact") : "",
                  guard ? "; GUARD ROWS WRITTEN" : "");
    report(c.ok(must_exact) && !bad_res && !guard, m);
}

// ---- geglu_tanh: bf16(bf16(gelu_tanh(g)) * u), PyTorch's formula in fp32
float torch_gelu_tanh(float x) {  // GeluCUDAKernelImpl, approximate="tanh", opmath fp32
    const float kBeta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5);
    const float kKappa = 0.044715f;
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.0f + std::tanh(inner));
}
void case_geglu(int I, int n) {
    B16 gu((size_t)n * 2 * I, 0), out((size_t)(n + 2) * I, BF_NAN);
    for (size_t i = 0; i < gu.n; ++i) gu[i] = bf(normal(2.f));
    gu[0] = bf(0.f);  // edge values: 0, a large negative and a large positive gate
    if (I > 2) {
        gu[1] = bf(-12.f);
        gu[2] = bf(12.f);
    }
    emu_launch(uint3_{(unsigned)n, 1, 1}, 256, [&] { geglu_tanh(B(out), B(gu), n, I); });
    Cmp c;
    double err64 = 0;
    size_t guard = 0;
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < I; ++i) {
            const float g = fb(gu[(size_t)t * 2 * I + i]), u = fb(gu[(size_t)t * 2 * I + I + i]);
            const uint16_t got = out[(size_t)t * I + i];
            c.add(got, bf(rbf(torch_gelu_tanh(g)) * u));
            const double gd = g, ref = 0.5 * gd * (1 + std::tanh(std::sqrt(2 / M_PI) * (gd + 0.044715 * gd * gd * gd))) * u;
            err64 = std::max(err64, std::fabs(fb(got) - ref) / std::max(std::fabs(ref), 1e-3));
        }
    for (size_t k = (size_t)n * I; k < out.n; ++k) guard += out[k] != BF_NAN;
    char m[256];
    std::snprintf(m, sizeof m, "geglu_tanh I=%d n=%d: %s vs PyTorch's fp32 formula (must be bit-exact); fp64 rel err %.2e (<= 2^-7)%s",
                  I, n, c.str().c_str(), err64, guard ? "; GUARD ROWS WRITTEN" : "");
    report(c.ok(true) && err64 <= 1.0 / 128 && !guard, m);
}

void case_swiglu(int I, int n) {  // unchanged: bf16(bf16(silu(g)) * u)
    B16 gu((size_t)n * 2 * I, 0), out((size_t)(n + 2) * I, BF_NAN);
    for (size_t i = 0; i < gu.n; ++i) gu[i] = bf(normal(2.f));
    emu_launch(uint3_{(unsigned)n, 1, 1}, 256, [&] { swiglu(B(out), B(gu), n, I); });
    Cmp c;
    size_t guard = 0;
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < I; ++i) {
            const float g = fb(gu[(size_t)t * 2 * I + i]), u = fb(gu[(size_t)t * 2 * I + I + i]);
            c.add(out[(size_t)t * I + i], bf(rbf(g / (1.0f + std::exp(-g))) * u));
        }
    for (size_t k = (size_t)n * I; k < out.n; ++k) guard += out[k] != BF_NAN;
    report(c.ok(true) && !guard, "swiglu I=" + std::to_string(I) + " n=" + std::to_string(n) + " (unchanged): " + c.str() +
                                     " vs bf16(bf16(silu(g))*u) (must be bit-exact)" + (guard ? "; GUARD ROWS WRITTEN" : ""));
}

// ---- embedding / embedding_f32 with a scale
void case_embedding(int V, int H, int n, float scale) {
    B16 table((size_t)V * H, 0), out((size_t)(n + 2) * H, BF_NAN);
    Buf<float> outf((size_t)(n + 2) * H, NAN);
    for (size_t i = 0; i < table.n; ++i) table[i] = bf(normal(1.f));
    std::vector<int> ids(n);
    for (int t = 0; t < n; ++t) ids[t] = (int)(rng() % V);
    if (n >= 3) {
        ids[0] = -1;
        ids[1] = V;
    }
    emu_launch(uint3_{(unsigned)n, 1, 1}, 128, [&] {
        embedding(B(out), B(table), ids.data(), n, H, V, scale);
        embedding_f32(outf.p, B(table), ids.data(), n, H, V, scale);
    });
    size_t bad = 0, badf = 0, guard = 0, nonid = 0;
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < H; ++i) {
            const bool valid = ids[t] >= 0 && ids[t] < V;
            const uint16_t src = valid ? table[(size_t)ids[t] * H + i] : 0;
            // transformers: embed(ids) * embed_scale.to(bf16), one bf16 multiply; scale 1: the row itself
            const uint16_t want = !valid ? 0 : scale == 1.0f ? src : bf(fb(src) * scale);
            const size_t k = (size_t)t * H + i;
            const float wantf = fb(want);
            bad += out[k] != want;
            badf += std::memcmp(&outf[k], &wantf, 4) != 0;
            nonid += scale != 1.0f && out[k] != src;
        }
    for (size_t k = (size_t)n * H; k < out.n; ++k) guard += out[k] != BF_NAN || !std::isnan(outf[k]);
    char m[300];
    std::snprintf(m, sizeof m, "embedding / embedding_f32 V=%d H=%d n=%d scale %g (%s): %s%s%s%s", V, H, n, scale,
                  scale == 1.0f ? (H % 8 == 0 ? "a copy, vector path" : "a copy, scalar path") : "bf16(row * scale)",
                  bad ? "embedding WRONG" : "embedding bit-exact", badf ? ", embedding_f32 WRONG" : ", embedding_f32 == float(embedding) bit-exact",
                  n >= 3 ? ", ids -1 / V -> zeros" : "", guard ? "; GUARD ROWS WRITTEN" : "");
    report(!bad && !badf && !guard && (scale == 1.0f || nonid > 0), m);
}

}  // namespace

int main() {
    // Gemma 3's norms (the *_off entries), offsets 1 (HF) and 0 (GGUF), hidden 1152 (1B), 2560 (4B),
    // powers of two (exact), a length with no vector path, rows past the register cache
    for (bool f32 : {false, true})
        for (bool add : {false, true}) {
            case_norm(1024, 5, true, f32, add, true, 1.0f);
            case_norm(16384, 2, true, f32, add, true, 1.0f);
            case_norm(2560, 7, false, f32, add, true, 1.0f);
            case_norm(1152, 3, false, f32, add, true, 0.0f);
            case_norm(1003, 3, false, f32, add, true, 1.0f);
            case_norm(10000, 2, false, f32, add, true, 1.0f);
        }
    // the unchanged Qwen3RMSNorm entries
    for (bool f32 : {false, true})
        for (bool add : {false, true}) {
            case_norm(4096, 3, true, f32, add, false, 0.f);
            case_norm(1000, 3, false, f32, add, false, 0.f);
        }
    for (auto [I, n] : {std::pair{6912, 3}, {1000, 2}, {37, 5}}) case_geglu(I, n);
    for (auto [I, n] : {std::pair{3072, 2}, {37, 3}}) case_swiglu(I, n);
    // Gemma: scale = bf16(sqrt(hidden)) (1152: 33.94 -> 34.0; 2560: 50.596 -> 50.5); scale 1: a copy
    case_embedding(300, 1152, 7, fb(bf(std::sqrt(1152.f))));
    case_embedding(300, 2560, 4, fb(bf(std::sqrt(2560.f))));
    case_embedding(300, 1003, 4, 3.0f);
    case_embedding(300, 1024, 7, 1.0f);
    case_embedding(300, 1003, 4, 1.0f);
    std::printf("rowwise_ref_emu: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
