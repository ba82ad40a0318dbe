// Runs packs/kernels/rope.cu's qk_norm_rope on the CPU (emu.h, emu_math.h) against references
// written out element by element in transformers' order of bf16 roundings, at head_dim 64, 128 and
// 256:
//   * the computed inverse frequencies vs an `inv_freq` table holding the same fp32 values: every
//     output bit identical (q in qkv, k and v in the cache), with flags 0..3;
//   * a table of other frequencies (llama3-style scaled) and `cos_scale` (YaRN's attention
//     factor): cos / sin = bf16(cosf(pos * inv) * cos_scale), bit-exact against the reference;
//   * QKR_ADJACENT on q / k rows permuted as llama.cpp's converter permutes them (GGUF row 2i =
//     HF row i, 2i + 1 = HF row i + D/2 within each head; bias and norm weights permuted alike): the
//     output equals, element for element after the permutation, neox rotation of the HF rows;
//   * QKR_NORM_F32 (Gemma3RMSNorm: bf16((x * r) * (norm_offset + w)) in fp32) with norm_offset 1
//     and 0 against that formula, and against an fp64 reference; flag 4 without flag 1 is no norm;
//   * no KV write for slot -1; the pool's other slots and the k / v columns of qkv untouched.
// The references take the per-head sum of squares in the kernel's order (each lane its E = D/32
// elements, then the xor butterfly over the 32 lanes), so they are bit-exact where the kernel is
// right; rsqrtf, cosf and sinf are the host's in both (emu_math.h), not the GPU's.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "head_io_ref.h"
#include "../../rope.cu"

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

struct Shape {
    int Hq, Hkv, D, pt, n;
};

// One launch's inputs and outputs.
struct Run {
    std::vector<uint16_t> qkv, pool;
};

struct Inputs {
    Shape s;
    int layers = 2, layer = 1, num_pages = 0;
    std::vector<uint16_t> qkv, qn, kn, bias;
    std::vector<int> pos, slots;
};

Inputs make_inputs(Shape s, unsigned seed, int maxpos, bool exact_sums) {
    Inputs in;
    in.s = s;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int W = (s.Hq + 2 * s.Hkv) * s.D;
    in.qkv.resize((size_t)s.n * W);
    // exact_sums: multiples of 1/8 up to 31/8, so every sum of squares is exact in fp32 in any order
    for (auto& x : in.qkv)
        x = exact_sums ? bf((float)((int)(rng() % 63) - 31) / 8.f) : bf(1.5f * nd(rng));
    for (int i = 0; i < s.D; ++i) {
        in.qn.push_back(bf(1.f + 0.2f * nd(rng)));
        in.kn.push_back(bf(1.f + 0.2f * nd(rng)));
    }
    for (int i = 0; i < W; ++i) in.bias.push_back(bf(0.5f * nd(rng)));
    in.num_pages = (s.n + s.pt - 1) / s.pt + 2;
    std::vector<int> perm(in.num_pages * s.pt);
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = (int)i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < s.n; ++t) {
        in.pos.push_back(t == 0 ? maxpos - 1 : (int)(rng() % maxpos));
        in.slots.push_back(t == 2 ? -1 : perm[t]);  // token 2: a padded token (no KV write)
    }
    return in;
}

size_t pool_elems(const Inputs& in) { return (size_t)in.num_pages * in.s.pt * in.layers * 2 * in.s.Hkv * in.s.D; }

// qk_norm_rope as the manifest launches it: grid [n, ceil((Hq + 2 Hkv) / 8)], block 256.
Run launch(const Inputs& in, const std::vector<uint16_t>& qkv0, int flags, const float* inv_freq, float cos_scale,
           float norm_offset, const std::vector<uint16_t>* qn = nullptr, const std::vector<uint16_t>* kn = nullptr,
           const std::vector<uint16_t>* bias = nullptr, float theta = 1e6f) {
    const Shape& s = in.s;
    Run r;
    r.qkv = qkv0;
    r.pool.assign(pool_elems(in), BF_NAN);
    const auto* QN = reinterpret_cast<const bf16*>((qn ? *qn : in.qn).data());
    const auto* KN = reinterpret_cast<const bf16*>((kn ? *kn : in.kn).data());
    const auto* BI = reinterpret_cast<const bf16*>((bias ? *bias : in.bias).data());
    emu_launch(uint3_{(unsigned)s.n, (unsigned)((s.Hq + 2 * s.Hkv + 7) / 8), 1}, 256, [&] {
        qk_norm_rope(reinterpret_cast<bf16*>(r.qkv.data()), reinterpret_cast<bf16*>(r.pool.data()), QN, KN, BI,
                     in.pos.data(), in.slots.data(), s.n, s.Hq, s.Hkv, s.D, in.layer, in.layers, s.pt, theta, EPS, flags,
                     inv_freq, cos_scale, norm_offset);
    });
    return r;
}

// The kernel's inverse frequencies: 1 / fp32(pow(theta, fp32(2i) / fp32(D))) (KERNELS.md).
std::vector<float> computed_inv_freq(int D, float theta) {
    std::vector<float> inv(D / 2);
    for (int i = 0; i < D / 2; ++i) inv[i] = 1.0f / (float)std::pow((double)theta, (double)((float)(2 * i) / (float)D));
    return inv;
}

// fp32 / bf16 reference of one token's head (x: D values, already as fp32 bf16 values) in
// transformers' order: bias add (bf16), the head's RMSNorm (Qwen3RMSNorm: bf16(w * bf16(x * r));
// Gemma3RMSNorm: bf16((x * r) * (off + w))), then neox (or adjacent-pair) rotation with bf16 cos /
// sin: bf16(bf16(x * cos) + bf16(rot * sin)).
std::vector<float> ref_head(std::vector<float> x, const float* b, const uint16_t* w, bool rotate, int flags,
                            const std::vector<float>& inv, float pos, float cos_scale, float off) {
    const int D = (int)x.size(), half = D / 2;
    if (flags & 2)
        for (int d = 0; d < D; ++d) x[d] = rbf(x[d] + b[d]);
    if (!rotate) return x;  // v: bias only
    if (flags & 1) {
        // the kernel's order: each lane its E elements, then the butterfly (head_io_ref.h)
        const float r = rsqrtf(head_sum_squares(x.data(), D) * (1.0f / (float)D) + EPS);
        for (int d = 0; d < D; ++d)
            x[d] = (flags & 4) ? rbf((x[d] * r) * (off + fb(w[d]))) : rbf(fb(w[d]) * rbf(x[d] * r));
    }
    std::vector<float> cs(half), sn(half), y(D);
    for (int i = 0; i < half; ++i) {
        const float fr = pos * inv[i];
        cs[i] = rbf(std::cos(fr) * cos_scale);
        sn[i] = rbf(std::sin(fr) * cos_scale);
    }
    if (flags & 8) {
        for (int i = 0; i < half; ++i) {
            y[2 * i] = rbf(rbf(x[2 * i] * cs[i]) + rbf(-x[2 * i + 1] * sn[i]));
            y[2 * i + 1] = rbf(rbf(x[2 * i + 1] * cs[i]) + rbf(x[2 * i] * sn[i]));
        }
    } else {
        for (int d = 0; d < D; ++d) {
            const int i = d % half;
            const float rot = d < half ? -x[d + half] : x[d - half];
            y[d] = rbf(rbf(x[d] * cs[i]) + rbf(rot * sn[i]));
        }
    }
    return y;
}

// The expected outputs of a launch: q rows of qkv (k / v columns unchanged) and the pool (NaN
// except the written slots).
Run reference(const Inputs& in, const std::vector<uint16_t>& qkv0, int flags, const std::vector<float>& inv,
              float cos_scale, float off, const std::vector<uint16_t>* qn = nullptr, const std::vector<uint16_t>* kn = nullptr,
              const std::vector<uint16_t>* bias = nullptr) {
    const Shape& s = in.s;
    const int H = s.Hq + 2 * s.Hkv, D = s.D;
    Run r;
    r.qkv = qkv0;
    r.pool.assign(pool_elems(in), BF_NAN);
    const auto& QN = qn ? *qn : in.qn;
    const auto& KN = kn ? *kn : in.kn;
    const auto& BI = bias ? *bias : in.bias;
    std::vector<float> bfl(BI.size());
    for (size_t i = 0; i < BI.size(); ++i) bfl[i] = fb(BI[i]);
    for (int t = 0; t < s.n; ++t)
        for (int h = 0; h < H; ++h) {
            std::vector<float> x(D);
            for (int d = 0; d < D; ++d) x[d] = fb(qkv0[((size_t)t * H + h) * D + d]);
            const bool is_q = h < s.Hq, is_k = !is_q && h < s.Hq + s.Hkv;
            const std::vector<float> y =
                ref_head(x, bfl.data() + (size_t)h * D, (is_q ? QN : KN).data(), is_q || is_k, flags, inv,
                         (float)in.pos[t], cos_scale, off);
            if (is_q) {
                for (int d = 0; d < D; ++d) r.qkv[((size_t)t * H + h) * D + d] = bf(y[d]);
                continue;
            }
            const int slot = in.slots[t];
            if (slot < 0) continue;
            const int kvh = is_k ? h - s.Hq : h - s.Hq - s.Hkv;
            const size_t row = (size_t)s.Hkv * D, page_elems = (size_t)s.pt * in.layers * 2 * row;
            const size_t base = (size_t)(slot / s.pt) * page_elems +
                                ((size_t)(in.layer * 2 + (is_k ? 0 : 1)) * s.pt + slot % s.pt) * row + (size_t)kvh * D;
            for (int d = 0; d < D; ++d) r.pool[base + d] = bf(y[d]);
        }
    return r;
}

std::string cmp(const Run& got, const Run& want) {
    size_t dq = 0, dp = 0;
    for (size_t i = 0; i < got.qkv.size(); ++i) dq += got.qkv[i] != want.qkv[i];
    for (size_t i = 0; i < got.pool.size(); ++i) dp += got.pool[i] != want.pool[i];
    if (!dq && !dp) return "";
    char m[160];
    std::snprintf(m, sizeof m, " (%zu qkv and %zu pool elements differ)", dq, dp);
    return m;
}

std::string shape_str(const Shape& s) {
    char m[96];
    std::snprintf(m, sizeof m, "Hq=%d Hkv=%d D=%d page %d n=%d", s.Hq, s.Hkv, s.D, s.pt, s.n);
    return m;
}

// ---- the inv_freq table holding the computed values changes no bit; other tables and cos_scale
void case_table(Shape s, int flags, unsigned seed) {
    const Inputs in = make_inputs(s, seed, 40000, false);
    const std::vector<float> inv = computed_inv_freq(s.D, 1e6f);
    const Run a = launch(in, in.qkv, flags, nullptr, 1.0f, 0.f);
    const Run b = launch(in, in.qkv, flags, inv.data(), 1.0f, 0.f);
    const std::string d = cmp(b, a);
    report(d.empty(), "qk_norm_rope " + shape_str(s) + " flags " + std::to_string(flags) +
                          ": inv_freq table of the computed values == computed path, bit for bit" + d);
    const Run want = reference(in, in.qkv, flags, inv, 1.0f, 0.f);
    const std::string e = cmp(a, want);
    report(e.empty(), "qk_norm_rope " + shape_str(s) + " flags " + std::to_string(flags) +
                          ": == transformers-order reference (bias, Qwen3 norm, neox rotary; slot -1 not written)" + e);
}

void case_scaled(Shape s, float cos_scale, unsigned seed) {
    const Inputs in = make_inputs(s, seed, 40000, false);
    // llama3-style scaling (transformers' _compute_llama3_parameters, factor 8, original context 8192,
    // low / high frequency factors 1 / 4), in fp32 as a manifest would write the table
    std::vector<float> inv = computed_inv_freq(s.D, 5e5f);
    for (auto& f : inv) {
        const double wavelen = 2 * M_PI / f, low = 8192.0 / 1.0, high = 8192.0 / 4.0;
        if (wavelen > low) {
            f = f / 8.0f;
        } else if (wavelen >= high) {
            const float smooth = (float)((8192.0 / wavelen - 1.0) / (4.0 - 1.0));
            f = (1 - smooth) * f / 8.0f + smooth * f;
        }
    }
    for (int flags : {0, 2}) {
        const Run got = launch(in, in.qkv, flags, inv.data(), cos_scale, 0.f);
        const Run want = reference(in, in.qkv, flags, inv, cos_scale, 0.f);
        const std::string e = cmp(got, want);
        char m[160];
        std::snprintf(m, sizeof m, ": llama3-scaled inv_freq table, cos_scale %.4f, flags %d == reference", cos_scale, flags);
        report(e.empty(), "qk_norm_rope " + shape_str(s) + m + e);
    }
}

// ---- adjacent pairs on llama.cpp's permuted rows == neox on the HF rows, element for element
void case_adjacent(Shape s, int flags, unsigned seed) {
    const Inputs in = make_inputs(s, seed, 30000, true);
    const int H = s.Hq + 2 * s.Hkv, D = s.D, half = D / 2;
    // GGUF element 2i + j of a q / k head holds HF element i + j * D/2 (convert_hf_to_gguf's permute)
    auto perm_head = [&](const uint16_t* src, uint16_t* dst) {
        for (int i = 0; i < half; ++i) {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[i + half];
        }
    };
    std::vector<uint16_t> qkv_p = in.qkv, bias_p = in.bias, qn_p(D), kn_p(D);
    for (int t = 0; t < s.n; ++t)
        for (int h = 0; h < s.Hq + s.Hkv; ++h) perm_head(&in.qkv[((size_t)t * H + h) * D], &qkv_p[((size_t)t * H + h) * D]);
    for (int h = 0; h < s.Hq + s.Hkv; ++h) perm_head(&in.bias[(size_t)h * D], &bias_p[(size_t)h * D]);
    perm_head(in.qn.data(), qn_p.data());
    perm_head(in.kn.data(), kn_p.data());
    const Run hf = launch(in, in.qkv, flags, nullptr, 1.0f, 1.0f);
    const Run gg = launch(in, qkv_p, flags | 8, nullptr, 1.0f, 1.0f, &qn_p, &kn_p, &bias_p);
    // permute the HF run's q and k outputs (qkv and cache) and compare
    Run want = hf;
    for (int t = 0; t < s.n; ++t)
        for (int h = 0; h < H; ++h) {
            uint16_t* dst = &want.qkv[((size_t)t * H + h) * D];
            if (h < s.Hq) perm_head(&hf.qkv[((size_t)t * H + h) * D], dst);
            else std::memcpy(dst, &qkv_p[((size_t)t * H + h) * D], (size_t)D * 2);  // k / v columns: the input's
        }
    const size_t row = (size_t)s.Hkv * D;
    for (size_t p = 0; p < want.pool.size(); p += D) {
        // k planes of the layer: every D-element head row of a k plane is permuted
        const size_t page_elems = (size_t)s.pt * in.layers * 2 * row, in_page = p % page_elems;
        const size_t plane = in_page / ((size_t)s.pt * row);  // layer * 2 + kv
        if (plane == (size_t)in.layer * 2 && hf.pool[p] != BF_NAN) perm_head(&hf.pool[p], &want.pool[p]);
    }
    const std::string e = cmp(gg, want);
    report(e.empty(), "qk_norm_rope " + shape_str(s) + " flags " + std::to_string(flags | 8) +
                          ": QKR_ADJACENT on permuted (GGUF) rows == neox on the HF rows, element for element" + e);
    // and against the reference directly
    const Run ref = reference(in, qkv_p, flags | 8, computed_inv_freq(D, 1e6f), 1.0f, 1.0f, &qn_p, &kn_p, &bias_p);
    const std::string f = cmp(gg, ref);
    report(f.empty(), "qk_norm_rope " + shape_str(s) + " flags " + std::to_string(flags | 8) + ": == adjacent-pair reference" + f);
}

// ---- Gemma's fp32 (off + w) q / k norm
void case_norm_f32(Shape s, float off, bool exact_sums, unsigned seed, float theta) {
    const Inputs in = make_inputs(s, seed, 20000, exact_sums);
    const std::vector<float> inv = computed_inv_freq(s.D, theta);
    const int flags = 1 | 4;
    const Run got = launch(in, in.qkv, flags, nullptr, 1.0f, off, nullptr, nullptr, nullptr, theta);
    const Run want = reference(in, in.qkv, flags, inv, 1.0f, off);
    const std::string e = cmp(got, want);
    char m[200];
    std::snprintf(m, sizeof m, " flags 5 norm_offset %.0f theta %.0e%s: == fp32 Gemma3RMSNorm reference, bit for bit", off, theta,
                  exact_sums ? " (exact sums)" : "");
    report(e.empty(), "qk_norm_rope " + shape_str(s) + m + e);
    // fp64: the normed, rotated q against the exact math (two bf16 roundings of the norm and three of
    // the rotation: within 2^-6 of each head's largest value)
    const int H = s.Hq + 2 * s.Hkv, D = s.D, half = D / 2;
    double worst = 0;
    for (int t = 0; t < s.n; ++t)
        for (int h = 0; h < s.Hq; ++h) {
            std::vector<double> x(D), y(D);
            double ss = 0;
            for (int d = 0; d < D; ++d) ss += (x[d] = fb(in.qkv[((size_t)t * H + h) * D + d])) * x[d];
            const double r = 1.0 / std::sqrt(ss / D + EPS);
            for (int d = 0; d < D; ++d) x[d] = x[d] * r * (off + fb(in.qn[d]));
            double mxh = 0, eh = 0;
            for (int d = 0; d < D; ++d) {
                const int i = d % half;
                const double ang = (double)in.pos[t] * (double)inv[i];
                y[d] = x[d] * std::cos(ang) + (d < half ? -x[d + half] : x[d - half]) * std::sin(ang);
                mxh = std::max(mxh, std::fabs(y[d]));
                eh = std::max(eh, std::fabs(y[d] - (double)fb(got.qkv[((size_t)t * H + h) * D + d])));
            }
            worst = std::max(worst, eh / mxh);
        }
    std::snprintf(m, sizeof m, " flags 5 norm_offset %.0f: q vs fp64 max err / max|ref| per head %.2e (<= 2^-6)", off, worst);
    report(worst <= 1.0 / 64, "qk_norm_rope " + shape_str(s) + m);
    // the flag matters (Qwen3's rounding differs somewhere), and flag 4 alone is no norm
    const Run q3 = launch(in, in.qkv, 1, nullptr, 1.0f, off, nullptr, nullptr, nullptr, theta);
    const Run none = launch(in, in.qkv, 0, nullptr, 1.0f, off, nullptr, nullptr, nullptr, theta);
    const Run f4 = launch(in, in.qkv, 4, nullptr, 1.0f, off, nullptr, nullptr, nullptr, theta);
    const bool f4_none = cmp(f4, none).empty(), differ = !cmp(q3, got).empty();
    report(f4_none && differ, "qk_norm_rope " + shape_str(s) + ": flag 4 without flag 1 == no norm" +
                                  (f4_none ? "" : " (NOT)") + "; flags 5 != flags 1" + (differ ? "" : " (NOT: identical)"));
}

}  // namespace

int main() {
    // inv_freq table == computed path, and the reference (bias, Qwen3 norm, neox), every head dim
    unsigned seed = 100;
    for (Shape s : {Shape{4, 2, 64, 16, 9}, Shape{8, 2, 128, 16, 7}, Shape{4, 2, 256, 16, 5}})
        for (int flags : {0, 1, 2, 3}) case_table(s, flags, seed++);
    // scaled frequencies (llama3) and YaRN's cos/sin factor
    case_scaled(Shape{8, 2, 128, 16, 7}, 1.0f, seed++);
    case_scaled(Shape{8, 2, 128, 16, 7}, 1.2079441f, seed++);  // YaRN factor 8: 0.1 ln 8 + 1
    case_scaled(Shape{4, 2, 64, 64, 5}, 0.5f, seed++);
    // adjacent pairs (GGUF llama) with and without bias / norm (exact sums: the norm's sum does not
    // depend on the element order the permutation changes)
    for (Shape s : {Shape{8, 2, 128, 16, 7}, Shape{4, 2, 64, 16, 5}, Shape{4, 2, 256, 16, 4}})
        for (int flags : {0, 2, 1}) case_adjacent(s, flags, seed++);
    // Gemma 3's q / k norm (head_dim 256: 1B / 4B / 12B; 128: 27B), HF weights (offset 1) and GGUF
    // weights (offset 0), local and global theta
    case_norm_f32(Shape{8, 4, 256, 16, 6}, 1.0f, false, seed++, 1e4f);
    case_norm_f32(Shape{8, 4, 256, 16, 6}, 1.0f, true, seed++, 1e6f);
    case_norm_f32(Shape{4, 1, 256, 16, 5}, 0.0f, false, seed++, 1e6f);
    case_norm_f32(Shape{8, 4, 128, 16, 5}, 1.0f, false, seed++, 1e6f);
    std::printf("rope_emu: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
