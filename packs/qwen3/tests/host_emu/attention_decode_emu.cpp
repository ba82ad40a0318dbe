// Runs packs/qwen3/kernels/attention_decode.cu on the CPU (emu.h) against an fp64 reference:
// decode and verify rows, padded tokens and sequences, several split counts and both head dims;
// rows that take one split must be bit-identical to attention.cu's attention_dD (run the same way).
// Checks the logic (token lookup, chunking, scratch layout, combine), not GPU behaviour.
//
//   bash packs/qwen3/tests/host_emu/run.sh
#include "../../kernels/attention_decode.cu"

// attention_emu.cpp: attention.cu's entries (another translation unit).
extern "C" void attention_d128(kern::bf16*, const kern::bf16*, const kern::bf16*, const int*, const int*, const int*, int,
                               int, int, int, int, int, int, int, int, float);
extern "C" void attention_d64(kern::bf16*, const kern::bf16*, const kern::bf16*, const int*, const int*, const int*, int,
                              int, int, int, int, int, int, int, int, float);

#include <algorithm>
#include <random>
#include <string>

static uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }
static float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
static const uint16_t BF_NAN = 0x7fc0;

struct Case {
    std::string name;
    int Hq, Hkv, D, pt;
    std::vector<int> groups;                 // context of each sequence (its pages and K/V)
    std::vector<std::pair<int, int>> rows;   // (group, ctx): a one-token row
    int pad_t, pad_s, S, min_chunk;
    std::vector<std::pair<int, int>> prefill;  // optional: (cached, new) sequences instead of rows
};

static int cdiv(int a, int b) { return (a + b - 1) / b; }

static bool run_case(const Case& c, unsigned seed) {
    const int layers = 2, layer = 1, Hq = c.Hq, Hkv = c.Hkv, D = c.D, pt = c.pt, G = Hq / Hkv;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    // sequences: from rows (one token each, sharing a group's pages) or prefill specs
    struct Seq { int group, ctx, n_new; };
    std::vector<int> gctx = c.groups;
    std::vector<Seq> seqs;
    if (c.prefill.empty()) {
        for (auto [g, ctx] : c.rows) seqs.push_back({g, ctx, 1});
    } else {
        gctx.clear();
        for (size_t i = 0; i < c.prefill.size(); ++i) {
            gctx.push_back(c.prefill[i].first + c.prefill[i].second);
            seqs.push_back({(int)i, gctx.back(), c.prefill[i].second});
        }
    }
    std::vector<int> pages_per;
    for (int x : gctx) pages_per.push_back(cdiv(x, pt));
    const int max_pages = *std::max_element(pages_per.begin(), pages_per.end()) + 1;
    int total_pages = 3;
    for (int p : pages_per) total_pages += p;
    std::vector<int> perm(total_pages);
    for (int i = 0; i < total_pages; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<std::vector<int>> gpages;
    int it = 0;
    for (int p : pages_per) {
        gpages.emplace_back(perm.begin() + it, perm.begin() + it + p);
        it += p;
    }
    const size_t row = (size_t)Hkv * D, page_elems = (size_t)pt * layers * 2 * row;
    std::vector<uint16_t> pool((size_t)total_pages * page_elems, BF_NAN);
    std::vector<std::vector<float>> K(gctx.size()), V(gctx.size());
    for (size_t g = 0; g < gctx.size(); ++g) {
        K[g].resize((size_t)gctx[g] * row);
        V[g].resize((size_t)gctx[g] * row);
        for (int p = 0; p < gctx[g]; ++p)
            for (size_t e = 0; e < row; ++e) {
                const uint16_t kb = bf(nd(rng)), vb = bf(nd(rng));
                K[g][p * row + e] = fb(kb);
                V[g][p * row + e] = fb(vb);
                const size_t page = gpages[g][p / pt], off = p % pt;
                pool[page * page_elems + ((size_t)(layer * 2 + 0) * pt + off) * row + e] = kb;
                pool[page * page_elems + ((size_t)(layer * 2 + 1) * pt + off) * row + e] = vb;
            }
    }
    const int S = (int)seqs.size(), Sb = S + c.pad_s;
    int n_tok = 0;
    for (auto& s : seqs) n_tok += s.n_new;
    const int T = n_tok + c.pad_t;
    std::vector<int> bt((size_t)Sb * max_pages, -1), qs, sl;
    qs.push_back(0);
    for (int i = 0; i < S; ++i) {
        for (size_t j = 0; j < gpages[seqs[i].group].size(); ++j) bt[(size_t)i * max_pages + j] = gpages[seqs[i].group][j];
        qs.push_back(qs.back() + seqs[i].n_new);
        sl.push_back(seqs[i].ctx);
    }
    for (int i = 0; i < c.pad_s; ++i) {
        qs.push_back(qs.back());
        sl.push_back(0);
    }
    const int q_stride = (Hq + 2 * Hkv) * D;
    std::vector<uint16_t> qkv((size_t)T * q_stride);
    for (auto& x : qkv) x = bf(nd(rng));
    const size_t nP = (size_t)cdiv(T, 4) * 4 + (size_t)c.S * T * Hq * (D + 4);
    std::vector<float> partial(nP + 64, NAN);
    std::vector<uint16_t> out((size_t)(T + 1) * Hq * D, BF_NAN);
    const float scale = 1.0f / std::sqrt((float)D);
    auto* qp = reinterpret_cast<const kern::bf16*>(qkv.data());
    auto* kvp = reinterpret_cast<const kern::bf16*>(pool.data());
    auto* op = reinterpret_cast<kern::bf16*>(out.data());
    emu_launch(uint3_{(unsigned)T, (unsigned)Hkv, (unsigned)c.S}, 128, [&] {
        if (D == 128)
            attention_decode_d128(partial.data(), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq,
                                  Hkv, layer, layers, pt, scale, c.min_chunk);
        else
            attention_decode_d64(partial.data(), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq,
                                 Hkv, layer, layers, pt, scale, c.min_chunk);
    });
    emu_launch(uint3_{(unsigned)T, (unsigned)Hq, 1}, (unsigned)D, [&] {
        if (D == 128)
            attention_combine_d128(op, partial.data(), T, Hq);
        else
            attention_combine_d64(op, partial.data(), T, Hq);
    });
    // attention_dD on the same inputs: rows of one split must be bit-identical to it
    std::vector<uint16_t> att((size_t)T * Hq * D, BF_NAN);
    auto* ap = reinterpret_cast<kern::bf16*>(att.data());
    emu_launch(uint3_{(unsigned)(cdiv(T, 32 / G) + Sb), (unsigned)Hkv, 1}, 128, [&] {
        if (D == 128)
            attention_d128(ap, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                           scale);
        else
            attention_d64(ap, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                          scale);
    });
    int single_rows = 0, single_diff = 0;
    // reference (fp64) and checks
    double err = 0, mx = 0;
    int bad_hdr = 0, bad_pad = 0, bad_guard = 0, nonfinite = 0, max_act = 0;
    int t = 0;
    for (int s = 0; s < S; ++s) {
        const Seq& q = seqs[s];
        for (int i = 0; i < q.n_new; ++i, ++t) {
            const int kmax = q.ctx - q.n_new + i + 1;
            const int mc = std::max(32, cdiv(c.min_chunk, 32) * 32);
            const int chunk = std::max(mc, cdiv(cdiv(kmax, c.S), 32) * 32);
            const int act = cdiv(kmax, chunk);
            max_act = std::max(max_act, act);
            if (partial[t] != (float)act) ++bad_hdr;
            if (act == 1) {
                ++single_rows;
                for (int e = 0; e < Hq * D; ++e) single_diff += out[(size_t)t * Hq * D + e] != att[(size_t)t * Hq * D + e];
            }
            for (int h = 0; h < Hq; ++h) {
                const int kh = h / G;
                std::vector<double> sc(kmax);
                double m = -1e300;
                for (int j = 0; j < kmax; ++j) {
                    double d = 0;
                    for (int e = 0; e < D; ++e)
                        d += (double)fb(qkv[(size_t)t * q_stride + (size_t)h * D + e]) * K[q.group][(size_t)j * row + kh * D + e];
                    sc[j] = d * scale;
                    m = std::max(m, sc[j]);
                }
                double L = 0;
                for (auto& x : sc) L += (x = std::exp(x - m));
                for (int e = 0; e < D; ++e) {
                    double o = 0;
                    for (int j = 0; j < kmax; ++j) o += sc[j] * V[q.group][(size_t)j * row + kh * D + e];
                    o /= L;
                    const float got = fb(out[((size_t)t * Hq + h) * D + e]);
                    if (!std::isfinite(got)) ++nonfinite;
                    err = std::max(err, std::fabs(got - o));
                    mx = std::max(mx, std::fabs(o));
                }
            }
        }
    }
    for (; t < T; ++t) {
        if (partial[t] != 0.f) ++bad_hdr;
        for (int e = 0; e < Hq * D; ++e) bad_pad += out[(size_t)t * Hq * D + e] != 0 && out[(size_t)t * Hq * D + e] != 0x8000;
    }
    for (int e = 0; e < Hq * D; ++e) bad_guard += out[(size_t)T * Hq * D + e] != BF_NAN;
    for (size_t e = nP; e < partial.size(); ++e) bad_guard += !std::isnan(partial[e]);
    const double tol = std::ldexp(mx, -7);
    const bool ok = err <= tol && !bad_hdr && !bad_pad && !bad_guard && !nonfinite && !single_diff;
    std::printf("[%s] %s: Hq=%d Hkv=%d D=%d page %d rows %d+%d S=%d min_chunk %d: max err %.3e (tol %.3e), up to %d active "
                "splits, %d single-split rows %s attention_d%d%s%s%s%s\n",
                ok ? "PASS" : "FAIL", c.name.c_str(), Hq, Hkv, D, pt, n_tok, c.pad_t, c.S, c.min_chunk, err, tol, max_act,
                single_rows, single_diff ? "NOT bit-identical to" : "bit-identical to", D,
                bad_hdr ? ", BAD HEADER" : "", bad_pad ? ", padded rows not zero" : "", bad_guard ? ", GUARD WRITTEN" : "",
                nonfinite ? ", NON-FINITE" : "");
    return ok;
}

int main() {
    auto plain = [](std::vector<int> ctx) {
        std::vector<std::pair<int, int>> r;
        for (size_t i = 0; i < ctx.size(); ++i) r.push_back({(int)i, ctx[i]});
        return r;
    };
    std::vector<Case> cases = {
        {"b=1 ctx 1", 8, 2, 128, 16, {1}, plain({1}), 0, 0, 64, 64},
        {"b=1 ctx 17", 4, 2, 64, 16, {17}, plain({17}), 0, 0, 64, 64},
        {"b=1 ctx 1000, 4B-like group", 16, 4, 128, 16, {1000}, plain({1000}), 0, 0, 33, 64},
        {"b=3 ctx 15/16/255 + pad", 8, 2, 64, 16, {15, 16, 255}, plain({15, 16, 255}), 1, 1, 11, 64},
        {"verify rows 5 + decode + pad, page 64", 8, 2, 128, 64, {300, 40}, {{0, 296}, {0, 297}, {0, 298}, {0, 299}, {0, 300}, {1, 40}}, 2, 2, 7, 32},
        {"S=1", 4, 2, 128, 16, {200, 1}, plain({200, 1}), 0, 0, 1, 64},
        {"S=128 min_chunk 1", 4, 2, 64, 16, {4096}, plain({4096}), 0, 0, 128, 1},
        {"G=7 D=64", 14, 2, 64, 16, {129, 64}, plain({129, 64}), 0, 0, 5, 64},
        {"G=16 D=128", 16, 1, 128, 16, {100}, plain({100}), 0, 0, 3, 32},
        {"G=1 D=128", 2, 2, 128, 16, {77}, plain({77}), 1, 0, 2, 32},
        {"mixed prefill/decode step", 8, 2, 64, 16, {}, {}, 3, 2, 4, 32, {{10, 5}, {0, 1}, {40, 1}, {0, 9}}},
    };
    int fails = 0, n = 0;
    for (auto& c : cases) {
        fails += !run_case(c, 1234 + n);
        ++n;
    }
    std::printf("%d passed, %d failed\n", n - fails, fails);
    return fails ? 1 : 0;
}
