// Runs packs/kernels/gated.cu on the CPU (emu.h, emu_math.h) against references written out in
// transformers' order of bf16 roundings:
//   * qk_norm_rope_gated (Qwen3NextAttention's prologue): q rows read from [q | gate] per head, the
//     (1 + w) q / k norm in fp32 (Qwen3NextRMSNorm), RoPE on the first rot_dim dims only (rotate_half
//     of q[..., :rot_dim], q[..., rot_dim:] passed through), inv_i = 1 / theta^(2i / rot_dim); q to its
//     own buffer, k and v to the paged cache (slot -1: no write; other slots and layers untouched),
//     bit for bit, at head_dim 64 / 128 / 256 and rot_dim D/4 (partial_rotary_factor 0.25), D/2, D;
//   * with rot_dim = D it equals rope.cu's qk_norm_rope (flags 1|4) on the same heads laid out as
//     [q | k | v] rows, bit for bit (the same kernel math, another row layout);
//   * negative controls: full rotary where the kernel rotates a quarter, and the gate half read as q,
//     must differ;
//   * attn_output_gate: bf16(attn · bf16(sigmoid(gate))), the gate from the q projection's rows;
//   * gdn_split_proj: Qwen3-Next's per-key-head groups (transformers' fix_query_key_value_ordering,
//     written out as view / split / cat) and Qwen3.5's concatenation, exact copies;
//   * shared_expert_gate_add: the gate's dot product in the kernel's summation order, then
//     bf16(out + bf16(bf16(sigmoid(bf16(logit))) · shared)), bit for bit; padded rows untouched.
//
//   bash packs/kernels/verify/host_emu/run.sh   (entry `gated`; ~5 s)
#include "emu_math.h"
#include "head_io_ref.h"
#include "../../rope.cu"
#include "../../gated.cu"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

namespace {

using kern::bf16;
uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }
float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
float rbf(float f) { return fb(bf(f)); }
const uint16_t BF_NAN = 0x7fc1;
const float EPS = 1e-6f;

int fails = 0, passes = 0;
void report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passes : fails)++;
}

// The per-head sum of squares in the kernel's order: each lane its E elements, then the butterfly.
float head_rsqrt(const std::vector<float>& x) {
    const int D = (int)x.size();
    return rsqrtf(head_sum_squares(x.data(), D) * (1.0f / (float)D) + EPS);
}

// transformers: Qwen3NextRMSNorm (fp32, (1 + w), rounded once), then apply_rotary_pos_emb with
// rotary_dim = rot (cos / sin bf16 of fp32 angles).
std::vector<float> ref_head(std::vector<float> x, const uint16_t* w, bool rotate, float pos, int rot, float theta, float off) {
    const int D = (int)x.size(), half = rot / 2;
    if (!rotate) return x;
    const float r = head_rsqrt(x);
    for (int d = 0; d < D; ++d) x[d] = rbf((x[d] * r) * (off + fb(w[d])));
    std::vector<float> y = x;
    for (int d = 0; d < rot; ++d) {
        const int i = d % half;
        const float inv = 1.0f / (float)std::pow((double)theta, (double)((float)(2 * i) / (float)rot));
        const float fr = pos * inv;
        const float c = rbf(std::cos(fr)), s = rbf(std::sin(fr));
        const float rt = d < half ? -x[d + half] : x[d - half];
        y[d] = rbf(rbf(x[d] * c) + rbf(rt * s));
    }
    return y;
}

struct Case {
    int Hq, Hkv, D, rot, pt, n;
};

void case_rope(Case c, unsigned seed, float theta) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int W = (2 * c.Hq + 2 * c.Hkv) * c.D, layers = 3, layer = 1;
    std::vector<uint16_t> qkv((size_t)c.n * W), qn(c.D), kn(c.D);
    for (auto& x : qkv) x = bf(1.5f * nd(rng));
    for (int i = 0; i < c.D; ++i) {
        qn[i] = bf(0.2f * nd(rng));  // zero-centred weights: the 1 is the kernel's norm_offset
        kn[i] = bf(0.2f * nd(rng));
    }
    const int pages = (c.n + c.pt - 1) / c.pt + 2;
    std::vector<int> perm(pages * c.pt), pos(c.n), slots(c.n);
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = (int)i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < c.n; ++t) {
        pos[t] = t == 0 ? 40000 : (int)(rng() % 5000);
        slots[t] = t == 1 ? -1 : perm[t];
    }
    const size_t pool_n = (size_t)pages * c.pt * layers * 2 * c.Hkv * c.D;
    std::vector<uint16_t> q(c.n * c.Hq * c.D, BF_NAN), pool(pool_n, BF_NAN);
    const std::vector<uint16_t> qkv0 = qkv;
    emu_launch(uint3_{(unsigned)c.n, (unsigned)((c.Hq + 2 * c.Hkv + 7) / 8), 1}, 256, [&] {
        qk_norm_rope_gated(reinterpret_cast<bf16*>(q.data()), reinterpret_cast<const bf16*>(qkv.data()), reinterpret_cast<bf16*>(pool.data()),
                           reinterpret_cast<const bf16*>(qn.data()), reinterpret_cast<const bf16*>(kn.data()), pos.data(), slots.data(), c.n,
                           c.Hq, c.Hkv, c.D, c.rot, layer, layers, c.pt, theta, EPS, GQR_NORM | GQR_NORM_F32, 1.0f);
    });
    // reference
    std::vector<uint16_t> wq(q.size(), BF_NAN), wpool(pool_n, BF_NAN), wfull(q.size(), BF_NAN), wgate(q.size(), BF_NAN);
    for (int t = 0; t < c.n; ++t)
        for (int h = 0; h < c.Hq + 2 * c.Hkv; ++h) {
            const bool is_q = h < c.Hq, is_k = !is_q && h < c.Hq + c.Hkv;
            const size_t col = is_q ? (size_t)h * 2 * c.D : (size_t)2 * c.Hq * c.D + (size_t)(h - c.Hq) * c.D;
            std::vector<float> x(c.D), g(c.D);
            for (int d = 0; d < c.D; ++d) x[d] = fb(qkv0[(size_t)t * W + col + d]);
            const std::vector<float> y = ref_head(x, (is_q ? qn : kn).data(), is_q || is_k, (float)pos[t], c.rot, theta, 1.0f);
            if (is_q) {
                const std::vector<float> full = ref_head(x, qn.data(), true, (float)pos[t], c.D, theta, 1.0f);
                for (int d = 0; d < c.D; ++d) g[d] = fb(qkv0[(size_t)t * W + col + c.D + d]);
                const std::vector<float> yg = ref_head(g, qn.data(), true, (float)pos[t], c.rot, theta, 1.0f);
                for (int d = 0; d < c.D; ++d) {
                    wq[((size_t)t * c.Hq + h) * c.D + d] = bf(y[d]);
                    wfull[((size_t)t * c.Hq + h) * c.D + d] = bf(full[d]);
                    wgate[((size_t)t * c.Hq + h) * c.D + d] = bf(yg[d]);
                }
                continue;
            }
            if (slots[t] < 0) continue;
            const int kvh = is_k ? h - c.Hq : h - c.Hq - c.Hkv;
            const size_t row = (size_t)c.Hkv * c.D, page_elems = (size_t)c.pt * layers * 2 * row;
            const size_t base = (size_t)(slots[t] / c.pt) * page_elems + ((size_t)(layer * 2 + (is_k ? 0 : 1)) * c.pt + slots[t] % c.pt) * row + (size_t)kvh * c.D;
            for (int d = 0; d < c.D; ++d) wpool[base + d] = bf(y[d]);
        }
    const std::string tag = "D " + std::to_string(c.D) + " rot " + std::to_string(c.rot) + " Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv);
    report(q == wq, "qk_norm_rope_gated q (norm, partial RoPE) bit-exact, " + tag);
    report(pool == wpool, "qk_norm_rope_gated k / v cache (slot -1 and other layers untouched) bit-exact, " + tag);
    report(qkv == qkv0, "qk_norm_rope_gated leaves the projection rows (the gate) unchanged, " + tag);
    if (c.rot < c.D) report(q != wfull, "negative control: full rotary differs from the partial kernel, " + tag);
    report(q != wgate, "negative control: the gate half read as q differs, " + tag);
    if (c.rot == c.D) {
        // rope.cu's qk_norm_rope on [q | k | v] rows of the same heads: the same bits.
        const int W2 = (c.Hq + 2 * c.Hkv) * c.D;
        std::vector<uint16_t> qkv2((size_t)c.n * W2), pool2(pool_n, BF_NAN);
        for (int t = 0; t < c.n; ++t) {
            for (int h = 0; h < c.Hq; ++h)
                std::memcpy(&qkv2[(size_t)t * W2 + (size_t)h * c.D], &qkv0[(size_t)t * W + (size_t)h * 2 * c.D], c.D * 2);
            std::memcpy(&qkv2[(size_t)t * W2 + (size_t)c.Hq * c.D], &qkv0[(size_t)t * W + (size_t)2 * c.Hq * c.D], (size_t)2 * c.Hkv * c.D * 2);
        }
        emu_launch(uint3_{(unsigned)c.n, (unsigned)((c.Hq + 2 * c.Hkv + 7) / 8), 1}, 256, [&] {
            qk_norm_rope(reinterpret_cast<bf16*>(qkv2.data()), reinterpret_cast<bf16*>(pool2.data()), reinterpret_cast<const bf16*>(qn.data()),
                         reinterpret_cast<const bf16*>(kn.data()), reinterpret_cast<const bf16*>(qn.data()), pos.data(), slots.data(), c.n, c.Hq,
                         c.Hkv, c.D, layer, layers, c.pt, theta, EPS, 1 | 4, nullptr, 1.0f, 1.0f);
        });
        bool same = pool2 == pool;
        for (int t = 0; t < c.n; ++t)
            same = same && std::memcmp(&qkv2[(size_t)t * W2], &q[(size_t)t * c.Hq * c.D], (size_t)c.Hq * c.D * 2) == 0;
        report(same, "rot_dim = head_dim equals rope.cu's qk_norm_rope (flags 1|4) bit for bit, " + tag);
    }
}

void case_gate(int n, int heads, int D, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int ld = (2 * heads + 2) * D;  // [q | gate] per head, then one k and one v head
    std::vector<uint16_t> attn((size_t)n * heads * D), src((size_t)n * ld);
    for (auto& x : attn) x = bf(2.f * nd(rng));
    for (auto& x : src) x = bf(4.f * nd(rng));
    std::vector<uint16_t> want = attn;
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h)
            for (int j = 0; j < D; ++j) {
                const float g = fb(src[(size_t)t * ld + (size_t)h * 2 * D + D + j]);
                const float s = rbf(1.0f / (1.0f + std::exp(-g)));
                uint16_t& a = want[((size_t)t * heads + h) * D + j];
                a = bf(fb(a) * s);
            }
    const int real = n - 1;  // the last row is a padded token: untouched
    for (int j = 0; j < heads * D; ++j) want[(size_t)real * heads * D + j] = attn[(size_t)real * heads * D + j];
    emu_launch(uint3_{(unsigned)n, 1, 1}, 256, [&] {
        attn_output_gate(reinterpret_cast<bf16*>(attn.data()), reinterpret_cast<const bf16*>(src.data()), real, heads, D, ld);
    });
    report(attn == want, "attn_output_gate bf16(attn * bf16(sigmoid(gate))) bit-exact, padded row untouched, heads " + std::to_string(heads) + " D " + std::to_string(D));
}

void case_split(int hk, int hv, bool grouped, unsigned seed) {
    const int D = 128, r = hv / hk, conv = (2 * hk + hv) * D, vd = hv * D, W = conv + vd + 2 * hv, n = 3;
    std::mt19937 rng(seed);
    std::vector<uint16_t> in((size_t)n * W);
    for (auto& x : in) x = (uint16_t)(rng() & 0x7fff);
    // The source columns as transformers reads them.
    std::vector<int> q, k, v, z, b, a;
    if (!grouped) {
        for (int c = 0; c < W; ++c) (c < hk * D ? q : c < 2 * hk * D ? k : c < conv ? v : c < conv + vd ? z : c < conv + vd + hv ? b : a).push_back(c);
    } else {
        const int gw = 2 * D + 2 * r * D;  // mixed_qkvz.view(hk, gw).split([D, D, rD, rD])
        for (int g = 0; g < hk; ++g) {
            for (int e = 0; e < D; ++e) q.push_back(g * gw + e);
            for (int e = 0; e < D; ++e) k.push_back(g * gw + D + e);
            for (int e = 0; e < r * D; ++e) v.push_back(g * gw + 2 * D + e);
            for (int e = 0; e < r * D; ++e) z.push_back(g * gw + 2 * D + r * D + e);
        }
        for (int g = 0; g < hk; ++g) {  // mixed_ba.view(hk, 2r).split([r, r]), after in_proj_qkvz
            for (int e = 0; e < r; ++e) b.push_back(hk * gw + g * 2 * r + e);
            for (int e = 0; e < r; ++e) a.push_back(hk * gw + g * 2 * r + r + e);
        }
    }
    std::vector<int> qkvc = q;
    qkvc.insert(qkvc.end(), k.begin(), k.end());
    qkvc.insert(qkvc.end(), v.begin(), v.end());
    std::vector<uint16_t> oq((size_t)n * conv, BF_NAN), oz((size_t)n * vd, BF_NAN), ob((size_t)n * hv, BF_NAN), oa((size_t)n * hv, BF_NAN);
    emu_launch(uint3_{(unsigned)n, 1, 1}, 256, [&] {
        gdn_split_proj(reinterpret_cast<bf16*>(oq.data()), reinterpret_cast<bf16*>(oz.data()), reinterpret_cast<bf16*>(ob.data()), reinterpret_cast<bf16*>(oa.data()),
                       reinterpret_cast<const bf16*>(in.data()), n - 1, W, hk, hv, D, grouped ? 1 : 0);
    });
    bool ok = true;
    for (int t = 0; t < n; ++t) {
        auto chk = [&](const std::vector<uint16_t>& o, const std::vector<int>& cols) {
            for (size_t c = 0; c < cols.size(); ++c) ok = ok && o[(size_t)t * cols.size() + c] == (t < n - 1 ? in[(size_t)t * W + cols[c]] : BF_NAN);
        };
        chk(oq, qkvc);
        chk(oz, z);
        chk(ob, b);
        chk(oa, a);
    }
    report(ok, std::string("gdn_split_proj ") + (grouped ? "grouped (Qwen3-Next)" : "concatenated (Qwen3.5)") + " exact, Hk " + std::to_string(hk) + " Hv " + std::to_string(hv) + ", padded row untouched");
}

void case_shared(int n, int hidden, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> out((size_t)n * hidden), sh((size_t)n * hidden), x((size_t)n * hidden), w(hidden);
    for (auto& v : out) v = bf(nd(rng));
    for (auto& v : sh) v = bf(nd(rng));
    for (auto& v : x) v = bf(nd(rng));
    for (auto& v : w) v = bf(0.05f * nd(rng));
    std::vector<uint16_t> want = out;
    const int real = n - 1;
    for (int t = 0; t < real; ++t) {
        // The kernel's order: each of 256 threads its strided columns, then block_sum (warp
        // butterflies, then the 8 warp sums through one more butterfly).
        float th[256];
        for (int i = 0; i < 256; ++i) {
            float acc = 0.f;
            for (int c = i; c < hidden; c += 256) acc += fb(x[(size_t)t * hidden + c]) * fb(w[c]);
            th[i] = acc;
        }
        float ws[32] = {0};
        for (int wp = 0; wp < 8; ++wp) {
            float lane[32];
            for (int l = 0; l < 32; ++l) lane[l] = th[wp * 32 + l];
            for (int o = 16; o > 0; o >>= 1) {
                float nx[32];
                for (int l = 0; l < 32; ++l) nx[l] = lane[l] + lane[l ^ o];
                std::memcpy(lane, nx, sizeof lane);
            }
            ws[wp] = lane[0];
        }
        for (int o = 16; o > 0; o >>= 1) {
            float nx[32];
            for (int l = 0; l < 32; ++l) nx[l] = ws[l] + ws[l ^ o];
            std::memcpy(ws, nx, sizeof ws);
        }
        const float s = rbf(1.0f / (1.0f + std::exp(-rbf(ws[0]))));
        for (int c = 0; c < hidden; ++c) {
            uint16_t& o = want[(size_t)t * hidden + c];
            o = bf(fb(o) + rbf(s * fb(sh[(size_t)t * hidden + c])));
        }
    }
    emu_launch(uint3_{(unsigned)n, 1, 1}, 256, [&] {
        shared_expert_gate_add(reinterpret_cast<bf16*>(out.data()), reinterpret_cast<const bf16*>(sh.data()), reinterpret_cast<const bf16*>(x.data()),
                               reinterpret_cast<const bf16*>(w.data()), real, hidden);
    });
    report(out == want, "shared_expert_gate_add bit-exact in the kernel's summation order, padded row untouched, hidden " + std::to_string(hidden));
}

}  // namespace

int main() {
    unsigned seed = 300;
    for (Case c : {Case{4, 2, 128, 32, 16, 7}, Case{8, 2, 128, 32, 16, 5}, Case{4, 2, 256, 64, 16, 5}, Case{16, 2, 256, 64, 16, 3},
                   Case{4, 2, 64, 16, 16, 5}, Case{4, 1, 128, 64, 16, 5}, Case{4, 2, 128, 128, 16, 5}, Case{4, 2, 256, 256, 16, 4},
                   Case{4, 2, 64, 64, 64, 5}})
        case_rope(c, seed++, c.D == 256 ? 1e7f : 1e6f);
    case_gate(5, 4, 128, seed++);
    case_gate(3, 16, 256, seed++);
    for (auto [hk, hv] : {std::pair{4, 8}, std::pair{2, 4}, std::pair{1, 3}, std::pair{16, 32}, std::pair{2, 2}})
        for (bool g : {true, false}) case_split(hk, hv, g, seed++);
    case_shared(4, 1024, seed++);
    case_shared(3, 2048, seed++);
    case_shared(3, 200, seed++);
    std::printf("gated_emu: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
