// Runs packs/kernels/attention_prefill.cu (the tensor-core prefill attention) on the CPU
// (emu.h, with its ldmatrix / mma.sync emulations) against an fp64 reference and against
// attention.cu's attention_dD run the same way: prefill from empty, chunks over cached context,
// decode rows mixed with prefill chunks, padded tokens and sequences, a -1 page inside a context,
// G in {1, 2, 4, 7, 8, 16}, both head dims, page 16, grids smaller than the work; and sliding
// windows (window 1: every output is the row's own V exactly; a window longer than every context:
// the no-window run's bits; windows whose edges skip key tiles (kt0), leave warps without a
// visible key in a tile (`active`), need masking where no causal limit crosses the tile (`diag`),
// and rows without a visible key in their first key tile); and per-row invariance: the same rows
// under five schedules (one chunk, other cuts, behind other sequences, as one-token rows in mixed
// steps, 16-token chunks) bit-identical, with a negative control that must differ.
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
    int window = 0;  // the sliding window (<= 0: none)
    bool need_cov = false;  // the case must reach every window path counted below
};

// The first key a row with causal limit `lim` sees under the sliding window (<= 0: none).
int first_key(int lim, int window) { return window > 0 ? std::max(0, lim - window) : 0; }

// The window's paths in attention_prefill's tiling (64 / G tokens per query tile, 16 rows per
// warp, 64 keys per key tile), counted from the step's shape as the kernel cuts it.
struct Coverage {
    int tiles_kt0 = 0;        // query tiles whose first key tile is above 0 (tiles skipped)
    int idle_warps = 0;       // (warp, key tile) pairs below the causal limit but wholly below the
                              // window for the warp's rows: not `active`
    int window_masks = 0;     // (warp, key tile) pairs masked only for the window's start (`diag`)
    int blind_rows = 0;       // rows with no visible key in their query tile's first key tile
};
Coverage coverage(const std::vector<std::pair<int, int>>& spec, int G, int W) {
    Coverage cv;
    const int BQ = 64 / G, Wd = W > 0 ? W : (1 << 30);
    for (auto [cached, n] : spec)
        for (int t0 = 0; t0 < n; t0 += BQ) {
            const int nq = std::min(BQ, n - t0), R = nq * G, base_lim = cached + t0 + 1, kmax = base_lim + nq - 1;
            const int kt0 = first_key(base_lim, W) / 64, ntiles = cdiv(kmax, 64);
            cv.tiles_kt0 += kt0 > 0;
            for (int r = 0; r < R; ++r) cv.blind_rows += first_key(base_lim + r / G, W) >= (kt0 + 1) * 64;
            for (int w = 0; w * 16 < R; ++w) {
                const int w_lo = base_lim + w * 16 / G, w_hi = base_lim + std::min(w * 16 + 15, R - 1) / G;
                for (int kt = kt0; kt < ntiles; ++kt) {
                    const int kb = kt * 64;
                    const bool active = kb < w_hi && kb + 64 > w_lo - Wd;
                    cv.idle_warps += kb < w_hi && !active;
                    cv.window_masks += active && !(kb + 64 > w_lo) && kb < w_hi - Wd;
                }
            }
        }
    return cv;
}

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

    const int W = c.window;
    const int BQ = 64 / G;
    const unsigned gx = c.grid_x ? (unsigned)c.grid_x : (unsigned)(cdiv(T, BQ) + Sb);
    // attention_prefill_dD (+ 1 NaN guard row) and attention_dD on the same inputs
    auto run = [&](int window, std::vector<uint16_t>& out, std::vector<uint16_t>& att) {
        out.assign((size_t)(T + 1) * Hq * D, BF_NAN);
        att.assign((size_t)T * Hq * D, BF_NAN);
        auto* op = reinterpret_cast<kern::bf16*>(out.data());
        emu_launch(uint3_{gx, (unsigned)Hkv, 1}, 128, [&] {
            if (D == 128)
                attention_prefill_d128(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv,
                                       layer, layers, pt, scale, window);
            else
                attention_prefill_d64(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv,
                                      layer, layers, pt, scale, window);
        });
        emu_attention(D, reinterpret_cast<kern::bf16*>(att.data()), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T,
                      max_pages, q_stride, Hq, Hkv, layer, layers, pt, scale, window);
    };
    std::vector<uint16_t> out, att;
    run(W, out, att);
    // a window longer than every context changes nothing: the no-window run's bits
    int longer_diff = -1;
    if (W > 0 && W >= *std::max_element(ctx.begin(), ctx.end())) {
        std::vector<uint16_t> o0, a0;
        run(0, o0, a0);
        longer_diff = (int)(o0 != out) + (int)(a0 != att);
    }
    // fp64 reference and checks
    double err = 0, err_att = 0, diff = 0, mx = 0;
    int bad_pad = 0, bad_guard = 0, nonfinite = 0, exact_v_diff = 0;
    int t = 0;
    for (int s = 0; s < S; ++s) {
        const int cached = c.spec[s].first, n = c.spec[s].second;
        for (int i = 0; i < n; ++i, ++t) {
            const int kmax = cached + i + 1, lo = first_key(kmax, W);
            for (int h = 0; h < Hq; ++h) {
                const int kh = h / G;
                std::vector<double> sc(kmax - lo);
                double m = -1e300;
                for (int j = lo; j < kmax; ++j) {
                    double d = 0;
                    for (int e = 0; e < D; ++e)
                        d += (double)fb(qkv[(size_t)t * q_stride + (size_t)h * D + e]) * K[s][(size_t)j * row + kh * D + e];
                    sc[j - lo] = d * scale;
                    m = std::max(m, sc[j - lo]);
                }
                double L = 0;
                for (auto& x : sc) L += (x = std::exp(x - m));
                for (int e = 0; e < D; ++e) {
                    double o = 0;
                    for (int j = lo; j < kmax; ++j) o += sc[j - lo] * V[s][(size_t)j * row + kh * D + e];
                    o /= L;
                    const size_t idx = ((size_t)t * Hq + h) * D + e;
                    const float got = fb(out[idx]), ref_att = fb(att[idx]);
                    if (!std::isfinite(got) || !std::isfinite(ref_att)) ++nonfinite;
                    err = std::max(err, std::fabs(got - o));
                    err_att = std::max(err_att, std::fabs(ref_att - o));
                    diff = std::max(diff, (double)std::fabs(got - ref_att));
                    mx = std::max(mx, std::fabs(o));
                    if (W == 1) {  // one visible key (the row's own): its V, exactly
                        const float v = V[s][(size_t)(kmax - 1) * row + kh * D + e];
                        exact_v_diff += got != v || ref_att != v;
                    }
                }
            }
        }
    }
    for (; t < T; ++t)
        for (int e = 0; e < Hq * D; ++e) bad_pad += out[(size_t)t * Hq * D + e] != 0 && out[(size_t)t * Hq * D + e] != 0x8000;
    for (int e = 0; e < Hq * D; ++e) bad_guard += out[(size_t)T * Hq * D + e] != BF_NAN;
    const double tol = std::ldexp(mx, -7);
    const Coverage cv = coverage(c.spec, G, W);
    const bool cov_ok = !c.need_cov || (cv.tiles_kt0 && cv.idle_warps && cv.window_masks && cv.blind_rows);
    const bool ok = err <= tol && err_att <= tol && diff <= tol && !bad_pad && !bad_guard && !nonfinite && !exact_v_diff &&
                    longer_diff <= 0 && cov_ok;
    char wbuf[320] = "";
    if (W > 0)
        std::snprintf(wbuf, sizeof wbuf,
                      " | window %d: %d query tiles skip key tiles, %d (warp, key tile) pairs idle below the window, %d masked for the "
                      "window alone, %d rows with no visible key in their first key tile%s%s%s",
                      W, cv.tiles_kt0, cv.idle_warps, cv.window_masks, cv.blind_rows,
                      W == 1 ? (exact_v_diff ? ", outputs NOT the row's own V" : ", outputs == the row's own V exactly") : "",
                      longer_diff < 0 ? "" : (longer_diff ? ", NOT bit-identical to no window" : ", bit-identical to no window"),
                      cov_ok ? "" : " (COVERAGE MISSING)");
    std::printf("[%s] %s: Hq=%d Hkv=%d (G=%d) D=%d page %d seqs %d+%d tokens %d+%d grid.x %u: max err %.3e "
                "(attention_d%d %.3e; |tc - simt| %.3e; tol %.3e)%s%s%s%s\n",
                ok ? "PASS" : "FAIL", c.name.c_str(), Hq, Hkv, G, D, pt, S, c.pad_s, n_tok, c.pad_t, gx, err, D, err_att, diff,
                tol, bad_pad ? ", padded rows not zero" : "", bad_guard ? ", GUARD WRITTEN" : "",
                nonfinite ? ", NON-FINITE" : "", wbuf);
    return ok;
}


// ---- per-row invariance (issue 29, docs/batch-invariance.md; the batch-invariant design relies on it): a row's output must not depend on
// how its sequence's prompt is cut into chunks, where the row sits in its query tile, or which
// other sequences share the step. Sequences with fixed K / V / Q per position; the same rows
// computed under several schedules (one chunk; chunks cut at other places; behind other
// sequences; as one-token rows in steps with prefill chunks) must be bit-identical.
using Piece = InvariancePiece;

bool run_invariance(const char* name, int Hq, int Hkv, int D, int window, const std::vector<int>& lens,
                    const std::vector<std::vector<std::vector<Piece>>>& schedules, unsigned seed, bool control = false) {
    const int layers = 1, layer = 0, pt = 16, G = Hq / Hkv, S = (int)lens.size();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    InvariancePool ip(rng, nd, lens, Hq, Hkv, D, layers, layer, pt);
    const int max_pages = ip.max_pages, q_stride = ip.q_stride;
    const float scale = 1.0f / std::sqrt((float)D);
    // (seq, pos) -> the row's Hq·D output bits, from the first schedule that computed it
    std::vector<std::vector<std::vector<uint16_t>>> first(S);
    for (int s = 0; s < S; ++s) first[s].resize(lens[s]);
    int rows = 0, differ = 0, steps = 0;
    for (size_t si = 0; si < schedules.size(); ++si) {
        // The negative control: later schedules scale the scores by 1 + 2^-12 (one ulp of the
        // scale is absorbed by its product with log2 e), which the check must see.
        const float sc_step = control && si > 0 ? scale * (1.0f + 0x1p-12f) : scale;
        for (const auto& step : schedules[si]) {
            ++steps;
            const InvarianceStep in = ip.step(step, pt, Hq, D, false, 0);
            const int Sb = in.Sb, T = in.T;
            const std::vector<int>&bt = in.bt, &sl = in.sl, &qs = in.qs;
            int t = 0;
            std::vector<uint16_t> out((size_t)T * Hq * D, BF_NAN);
            const unsigned gx = (unsigned)(cdiv(T, 64 / G) + Sb);
            auto* op = reinterpret_cast<kern::bf16*>(out.data());
            auto* qp = reinterpret_cast<const kern::bf16*>(in.qkv.data());
            auto* kvp = reinterpret_cast<const kern::bf16*>(ip.pool.data());
            emu_launch(uint3_{gx, (unsigned)Hkv, 1}, 128, [&] {
                if (D == 128)
                    attention_prefill_d128(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv,
                                           layer, layers, pt, sc_step, window);
                else
                    attention_prefill_d64(op, qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv,
                                          layer, layers, pt, sc_step, window);
            });
            t = 0;
            for (const Piece& pc : step)
                for (int r = 0; r < pc.count; ++r, ++t) {
                    std::vector<uint16_t> got(out.begin() + (size_t)t * Hq * D, out.begin() + (size_t)(t + 1) * Hq * D);
                    auto& f = first[pc.seq][pc.start + r];
                    if (f.empty()) {
                        f = got;
                    } else {
                        ++rows;
                        differ += f != got;
                    }
                }
        }
    }
    const bool ok = control ? differ > 0 : rows > 0 && differ == 0;
    std::printf("[%s] per-row invariance%s, %s: Hq=%d Hkv=%d D=%d window %d: %zu schedules, %d steps, %d rows recomputed, %d "
                "not bit-identical to their first result\n",
                ok ? "PASS" : "FAIL", control ? " (negative control: scores scaled by 1 + 2^-12 must differ)" : "", name, Hq, Hkv, D, window,
                schedules.size(), steps, rows, differ);
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
        // sliding windows (last fields: window, must reach every window path of the tiling)
        {"window 50, chunks over cache + decode, G=2 D=128", 4, 2, 128, 16, {{200, 100}, {0, 70}, {31, 1}}, 2, 1, 0, false, 50, true},
        {"window 20, G=1 D=64 (64 tokens per query tile)", 1, 1, 64, 16, {{170, 130}, {3, 20}}, 0, 0, 0, false, 20, true},
        {"window 130, G=7 D=64, chunk over 300 cached keys + pad", 14, 2, 64, 16, {{300, 90}, {5, 40}}, 3, 1, 0, false, 130, true},
        {"window 64 (one key tile), G=8 D=128", 8, 1, 128, 16, {{100, 40}, {0, 65}}, 0, 0, 0, false, 64},
        {"window 1 (a row sees itself), G=4 D=128", 8, 2, 128, 16, {{70, 50}, {0, 20}, {9, 1}}, 1, 0, 0, false, 1},
        {"window 100 > every context, G=2 D=64", 4, 2, 64, 16, {{10, 60}, {0, 30}}, 1, 1, 0, false, 100},
        {"window 40, grid.x = 1, a -1 page at the window's start", 8, 2, 64, 16, {{60, 50}, {0, 9}}, 2, 1, 1, true, 40},
    };
    int fails = 0, n = 0;
    for (auto& c : cases) {
        fails += !run_case(c, 4321 + n);
        ++n;
    }
    // Two sequences (300 and 140 tokens) and a third that only fills steps. Schedules: each prompt
    // in one chunk alone; cut at 64, 100, 237 (and 17, 90); behind the other sequence; the last
    // rows as one-token rows inside steps that carry another sequence's chunk (a decode row in a
    // mixed step); everything in 16-token chunks.
    auto schedules_for = [](int a, int b) {
        std::vector<std::vector<std::vector<Piece>>> sc;
        sc.push_back({{{0, 0, a}}, {{1, 0, b}}});
        sc.push_back({{{0, 0, 64}}, {{0, 64, 36}, {1, 0, 17}}, {{1, 17, 73}, {0, 100, 137}}, {{0, 237, a - 237}, {1, 90, b - 90}}});
        sc.push_back({{{2, 0, 50}, {1, 0, b}, {0, 0, a}}});
        std::vector<std::vector<Piece>> mixed = {{{0, 0, a - 4}, {1, 0, b - 3}}};
        for (int k = 0; k < 4; ++k) {
            std::vector<Piece> st = {{2, 10 * k, 10}, {0, a - 4 + k, 1}};
            if (k < 3) st.push_back({1, b - 3 + k, 1});
            mixed.push_back(st);
        }
        sc.push_back(mixed);
        std::vector<std::vector<Piece>> small;
        for (int p = 0; p < std::max(a, b); p += 16) {
            std::vector<Piece> st;
            if (p < a) st.push_back({0, p, std::min(16, a - p)});
            if (p < b) st.push_back({1, p, std::min(16, b - p)});
            small.push_back(st);
        }
        sc.push_back(small);
        return sc;
    };
    const std::vector<int> lens = {300, 140, 50};
    int inv_fails = 0;
    inv_fails += !run_invariance("G=4 D=128", 8, 2, 128, 0, lens, schedules_for(300, 140), 11);
    inv_fails += !run_invariance("G=7 D=64", 14, 2, 64, 0, lens, schedules_for(300, 140), 12);
    inv_fails += !run_invariance("G=1 D=128, window 100", 2, 2, 128, 100, lens, schedules_for(300, 140), 13);
    inv_fails += !run_invariance("G=16 D=64", 16, 1, 64, 0, lens, schedules_for(300, 140), 14);
    inv_fails += !run_invariance("G=4 D=128", 8, 2, 128, 0, lens, schedules_for(300, 140), 11, true);
    fails += inv_fails;
    n += 5;
    std::printf("%d passed, %d failed\n", n - fails, fails);
    return fails ? 1 : 0;
}
