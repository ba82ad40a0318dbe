// Runs packs/kernels/attention_prefill.cu (the tensor-core prefill attention) on the CPU
// (emu.h, with its ldmatrix / mma.sync emulations) against an fp64 reference and against
// attention.cu's attention_dD run the same way: prefill from empty, chunks over cached context,
// decode rows mixed with prefill chunks, padded tokens and sequences, a -1 page inside a context,
// G in {1, 2, 4, 7, 8, 16}, both head dims, page 16, grids smaller than the work.
// Checks the logic (fragment layouts, swizzle, masking, tiling, work mapping), not GPU timing.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "../../attention_prefill.cu"

#include "attention_entries.h"  // attention.cu's entries (attention_emu.cpp)

#include <algorithm>
#include <random>
#include <string>

namespace {

uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }
float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
const uint16_t BF_NAN = 0x7fc0;
int cdiv(int a, int b) { return (a + b - 1) / b; }

struct Case {
    std::string name;
    int Hq, Hkv, D, pt;
    std::vector<std::pair<int, int>> spec;  // (cached, new) per sequence
    int pad_t, pad_s;
    int grid_x;      // 0: the manifest's ceil(tokens / BQ) + seqs
    bool hole;       // sequence 0's second page is -1 (its keys read as zeros)
};

bool run_case(const Case& c, unsigned seed) {
    const int layers = 2, layer = 1, Hq = c.Hq, Hkv = c.Hkv, D = c.D, pt = c.pt, G = Hq / Hkv;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int S = (int)c.spec.size(), Sb = S + c.pad_s;
    std::vector<int> ctx, pages_per;
    for (auto [cached, n] : c.spec) {
        ctx.push_back(cached + n);
        pages_per.push_back(cdiv(cached + n, pt));
    }
    const int max_pages = *std::max_element(pages_per.begin(), pages_per.end()) + 1;
    int total_pages = 3;
    for (int p : pages_per) total_pages += p;
    std::vector<int> perm(total_pages);
    for (int i = 0; i < total_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> bt((size_t)Sb * max_pages, -1);
    int it = 0;
    for (int s = 0; s < S; ++s)
        for (int j = 0; j < pages_per[s]; ++j) bt[(size_t)s * max_pages + j] = perm[it++];
    const size_t row = (size_t)Hkv * D, page_elems = (size_t)pt * layers * 2 * row;
    std::vector<uint16_t> pool((size_t)total_pages * page_elems, BF_NAN);
    std::vector<std::vector<float>> K(S), V(S);
    for (int s = 0; s < S; ++s) {
        K[s].resize((size_t)ctx[s] * row);
        V[s].resize((size_t)ctx[s] * row);
        for (int p = 0; p < ctx[s]; ++p)
            for (size_t e = 0; e < row; ++e) {
                const uint16_t kb = bf(nd(rng)), vb = bf(nd(rng));
                K[s][p * row + e] = fb(kb);
                V[s][p * row + e] = fb(vb);
                const size_t page = bt[(size_t)s * max_pages + p / pt], off = p % pt;
                pool[page * page_elems + ((size_t)(layer * 2 + 0) * pt + off) * row + e] = kb;
                pool[page * page_elems + ((size_t)(layer * 2 + 1) * pt + off) * row + e] = vb;
            }
    }
    if (c.hole) {  // the kernels read a -1 page as zeros: so does the reference
        bt[1] = -1;
        for (int p = pt; p < std::min(2 * pt, ctx[0]); ++p)
            for (size_t e = 0; e < row; ++e) K[0][p * row + e] = V[0][p * row + e] = 0.f;
    }
    int n_tok = 0;
    std::vector<int> qs{0}, sl;
    for (int s = 0; s < S; ++s) {
        n_tok += c.spec[s].second;
        qs.push_back(qs.back() + c.spec[s].second);
        sl.push_back(ctx[s]);
    }
    for (int i = 0; i < c.pad_s; ++i) {
        qs.push_back(qs.back());
        sl.push_back(0);
    }
    const int T = n_tok + c.pad_t;
    const int q_stride = (Hq + 2 * Hkv) * D;
    std::vector<uint16_t> qkv((size_t)T * q_stride);
    for (auto& x : qkv) x = bf(nd(rng));
    const float scale = 1.0f / std::sqrt((float)D);
    auto* qp = reinterpret_cast<const kern::bf16*>(qkv.data());
    auto* kvp = reinterpret_cast<const kern::bf16*>(pool.data());

    // attention_prefill_dD (+ 1 NaN guard row)
    std::vector<uint16_t> out((size_t)(T + 1) * Hq * D, BF_NAN);
    auto* op = reinterpret_cast<kern::bf16*>(out.data());
    const int BQ = 64 / G;
    const unsigned gx = c.grid_x ? (unsigned)c.grid_x : (unsigned)(cdiv(T, BQ) + Sb);
    emu_launch(uint3_{gx, (unsigned)Hkv, 1}, 128, [&] {
        if (D == 128)
            attention_prefill_d128(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer,
                                   layers, pt, scale, 0);
        else
            attention_prefill_d64(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer,
                                  layers, pt, scale, 0);
    });
    // attention_dD on the same inputs
    std::vector<uint16_t> att((size_t)T * Hq * D, BF_NAN);
    auto* ap = reinterpret_cast<kern::bf16*>(att.data());
    emu_launch(uint3_{(unsigned)(cdiv(T, 32 / G) + Sb), (unsigned)Hkv, 1}, 128, [&] {
        if (D == 128)
            attention_d128(ap, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                           scale, 0);
        else
            attention_d64(ap, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                          scale, 0);
    });
    // fp64 reference and checks
    double err = 0, err_att = 0, diff = 0, mx = 0;
    int bad_pad = 0, bad_guard = 0, nonfinite = 0;
    int t = 0;
    for (int s = 0; s < S; ++s) {
        const int cached = c.spec[s].first, n = c.spec[s].second;
        for (int i = 0; i < n; ++i, ++t) {
            const int kmax = cached + i + 1;
            for (int h = 0; h < Hq; ++h) {
                const int kh = h / G;
                std::vector<double> sc(kmax);
                double m = -1e300;
                for (int j = 0; j < kmax; ++j) {
                    double d = 0;
                    for (int e = 0; e < D; ++e)
                        d += (double)fb(qkv[(size_t)t * q_stride + (size_t)h * D + e]) * K[s][(size_t)j * row + kh * D + e];
                    sc[j] = d * scale;
                    m = std::max(m, sc[j]);
                }
                double L = 0;
                for (auto& x : sc) L += (x = std::exp(x - m));
                for (int e = 0; e < D; ++e) {
                    double o = 0;
                    for (int j = 0; j < kmax; ++j) o += sc[j] * V[s][(size_t)j * row + kh * D + e];
                    o /= L;
                    const size_t idx = ((size_t)t * Hq + h) * D + e;
                    const float got = fb(out[idx]), ref_att = fb(att[idx]);
                    if (!std::isfinite(got)) ++nonfinite;
                    err = std::max(err, std::fabs(got - o));
                    err_att = std::max(err_att, std::fabs(ref_att - o));
                    diff = std::max(diff, (double)std::fabs(got - ref_att));
                    mx = std::max(mx, std::fabs(o));
                }
            }
        }
    }
    for (; t < T; ++t)
        for (int e = 0; e < Hq * D; ++e) bad_pad += out[(size_t)t * Hq * D + e] != 0 && out[(size_t)t * Hq * D + e] != 0x8000;
    for (int e = 0; e < Hq * D; ++e) bad_guard += out[(size_t)T * Hq * D + e] != BF_NAN;
    const double tol = std::ldexp(mx, -7);
    const bool ok = err <= tol && diff <= tol && !bad_pad && !bad_guard && !nonfinite;
    std::printf("[%s] %s: Hq=%d Hkv=%d (G=%d) D=%d page %d seqs %d+%d tokens %d+%d grid.x %u: max err %.3e "
                "(attention_d%d %.3e; |tc - simt| %.3e; tol %.3e)%s%s%s\n",
                ok ? "PASS" : "FAIL", c.name.c_str(), Hq, Hkv, G, D, pt, S, c.pad_s, n_tok, c.pad_t, gx, err, D, err_att, diff,
                tol, bad_pad ? ", padded rows not zero" : "", bad_guard ? ", GUARD WRITTEN" : "",
                nonfinite ? ", NON-FINITE" : "");
    return ok;
}

}  // namespace

int main() {
    const std::vector<std::pair<int, int>> mixed = {{10, 5}, {0, 1}, {40, 1}, {0, 9}, {70, 20}};
    std::vector<Case> cases = {
        {"prefill from empty, 4B-like group", 16, 4, 128, 16, {{0, 100}}, 0, 0, 0, false},
        {"chunk over cached context", 8, 2, 128, 16, {{70, 40}}, 0, 0, 0, false},
        {"mixed prefill/decode + padding", 8, 2, 64, 16, mixed, 3, 2, 0, false},
        {"G=1 D=128, 2 tiles of 64 tokens", 2, 2, 128, 16, {{0, 70}, {5, 1}}, 1, 0, 0, false},
        {"G=2 D=64", 4, 2, 64, 16, {{33, 31}, {0, 2}}, 0, 1, 0, false},
        {"G=7 D=64 (Qwen2.5-0.5B)", 14, 2, 64, 16, {{0, 23}, {17, 9}, {100, 1}}, 2, 0, 0, false},
        {"G=8 D=128", 8, 1, 128, 16, {{20, 19}, {0, 1}}, 0, 0, 0, false},
        {"G=16 D=128", 16, 1, 128, 16, {{3, 13}, {60, 2}}, 1, 1, 0, false},
        {"G=16 D=64", 16, 1, 64, 16, {{0, 9}}, 0, 0, 0, false},
        {"-1 page inside the context", 8, 2, 128, 16, {{30, 20}, {0, 3}}, 0, 0, 0, true},
        {"grid.x = 1 (grid-stride loop)", 8, 2, 64, 16, {{40, 20}, {0, 9}, {7, 1}}, 2, 1, 1, false},
        {"grid.x = 2, G=7", 14, 2, 64, 16, {{0, 30}, {12, 4}}, 0, 0, 2, false},
        {"long chunk over 200 cached keys (5 key tiles)", 4, 1, 64, 16, {{200, 80}}, 0, 0, 0, false},
        {"G=1 over 10 cached keys (warps skip key tiles)", 1, 1, 128, 16, {{10, 128}}, 0, 0, 0, false},
        {"G=16 D=128 over 130 cached keys", 16, 1, 128, 16, {{130, 6}, {0, 1}}, 0, 0, 0, false},
    };
    int fails = 0, n = 0;
    for (auto& c : cases) {
        fails += !run_case(c, 4321 + n);
        ++n;
    }
    std::printf("%d passed, %d failed\n", n - fails, fails);
    return fails ? 1 : 0;
}
