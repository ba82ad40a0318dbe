// Runs packs/kernels/moe.cu on the CPU (emu.h: CTAs of fibers, ldmatrix / mma.sync emulated)
// against references written as transformers computes a Qwen3MoeSparseMoeBlock:
//   topk     moe_topk vs PyTorch's warp softmax (lanes, per-lane sums, butterfly) in fp32 and
//            torch.topk's order (larger first, ties to the lower index): ids and weights
//            BIT-IDENTICAL, with and without norm_topk_prob, E from 4 to 512, k up to 32, rows
//            of tied logits, a NaN row (valid distinct ids); and vs fp64 (weights within bf16)
//   route    moe_route vs a stable counting sort: offsets, permutation and inverse exactly
//            (every (token, slot) pair once, grouped by expert, pair order within an expert),
//            skewed routings (every token to the same experts), several 1024-pair chunks
//   gemm     moe_gemm_s and moe_gemm_l (the manifest's worst-case grids: idle CTAs exit) vs fp64,
//            every row written, s and l bit-identical, a row's bits the same in a step of any
//            size (batch invariance), k and n tails, an expert with several tiles
//   fused    moe_topk_route (one launch, steps of few tokens) = moe_topk then moe_route, bit for bit
//   f32      moe_topk_f32 / moe_topk_route_f32 (fp32 logits: `--router-logits f32`): bf16-valued
//            fp32 logits give the bf16 entries' bits; general fp32 logits match the reference on
//            the fp32 values, and they pick other experts than their bf16 rounding where the
//            rounding ties or swaps two logits at the k-th place
//   combine  moe_combine vs the fp32 ascending-expert sum and, flag 1, transformers' bf16
//            index_add_ order, bit for bit
//   block    the whole chain (topk, route, gate-up, rowwise swiglu, down, combine) vs an fp64
//            per-token loop over the token's experts
// Checks indexing, control flow and arithmetic order, not GPU timing (mma.sync, expf are host
// stand-ins; the GPU checks are scripts/gpu/moe.sh).
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "moe_emu.h"
#include "../../moe.cu"

#include <algorithm>
#include <random>
#include <string>

extern "C" void swiglu(kern::bf16* out, const kern::bf16* gate_up, int n, int inter);

namespace {

using kern::bf16;
uint16_t bf(float v) { return __float2bfloat16_rn(v).x; }
float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
float rbf(float v) { return fb(bf(v)); }
const uint16_t BF_NAN = 0x7fc1;
std::mt19937 rng(2026);
float normal(float s) { return std::normal_distribution<float>(0.f, s)(rng); }
bf16* B(std::vector<uint16_t>& v) { return reinterpret_cast<bf16*>(v.data()); }

int fails = 0, passes = 0;
void report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passes : fails)++;
}

// ------------------------------------------------------------------ references
// PyTorch's softmax_warp_forward over one row (F.softmax(x, dim=-1, dtype=torch.float), E <= 1024).
std::vector<float> torch_softmax(const std::vector<float>& x) {
    const int E = (int)x.size();
    int P = 1;
    while (P < E) P <<= 1;
    const int WS = P < 32 ? P : 32, IT = P / WS;
    std::vector<std::vector<float>> el(WS, std::vector<float>(IT));
    std::vector<float> mx(WS), sum(WS, 0.f);
    for (int l = 0; l < WS; ++l) {
        for (int it = 0; it < IT; ++it) el[l][it] = it * WS + l < E ? x[it * WS + l] : -INFINITY;
        mx[l] = el[l][0];
        for (int it = 1; it < IT; ++it) mx[l] = mx[l] > el[l][it] ? mx[l] : el[l][it];
    }
    for (int off = WS / 2; off > 0; off /= 2) {
        std::vector<float> nm(WS);
        for (int l = 0; l < WS; ++l) nm[l] = mx[l] < mx[l ^ off] ? mx[l ^ off] : mx[l];
        mx = nm;
    }
    for (int l = 0; l < WS; ++l)
        for (int it = 0; it < IT; ++it) {
            el[l][it] = std::exp(el[l][it] - mx[l]);
            sum[l] += el[l][it];
        }
    for (int off = WS / 2; off > 0; off /= 2) {
        std::vector<float> ns(WS);
        for (int l = 0; l < WS; ++l) ns[l] = sum[l] + sum[l ^ off];
        sum = ns;
    }
    std::vector<float> p(E);
    for (int i = 0; i < E; ++i) p[i] = el[i % WS][i / WS] / sum[i % WS];
    return p;
}

// torch.topk's order (ties: the lower index; NaN first), then transformers' renormalization and
// cast to bf16.
void ref_topk(const std::vector<float>& p, int K, bool norm, int* ids, float* w) {
    std::vector<int> idx(p.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = (int)i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
        const bool an = p[a] != p[a], bn = p[b] != p[b];
        if (an || bn) return an && !bn;
        return p[a] > p[b];
    });
    float s = 0.f;
    for (int j = 0; j < K; ++j) s += p[idx[j]];
    for (int j = 0; j < K; ++j) {
        ids[j] = idx[j];
        w[j] = rbf(norm ? p[idx[j]] / s : p[idx[j]]);
    }
}

void run_topk(std::vector<uint16_t>& logits, int n, int E, int K, bool norm, std::vector<int>& ids, std::vector<float>& w) {
    ids.assign((size_t)n * K, -7);
    w.assign((size_t)n * K, -7.f);
    emu_launch({(unsigned)((n + 3) / 4), 1, 1}, 128, [&] { moe_topk(B(logits), ids.data(), w.data(), n, E, K, norm ? 1 : 0); });
}

void test_topk(int E, int K, bool norm, bool ties) {
    const int n = 9;
    std::vector<uint16_t> logits((size_t)n * E);
    for (auto& v : logits) v = bf(ties ? std::round(normal(2.f) * 4.f) / 4.f : normal(1.f));
    std::vector<int> ids;
    std::vector<float> w;
    run_topk(logits, n, E, K, norm, ids, w);
    bool exact = true, close = true;
    int fp64_swaps = 0;
    for (int t = 0; t < n; ++t) {
        std::vector<float> x(E);
        for (int i = 0; i < E; ++i) x[i] = fb(logits[(size_t)t * E + i]);
        std::vector<int> rid(K);
        std::vector<float> rw(K);
        ref_topk(torch_softmax(x), K, norm, rid.data(), rw.data());
        for (int j = 0; j < K; ++j) exact &= ids[(size_t)t * K + j] == rid[j] && w[(size_t)t * K + j] == rw[j];
        // fp64: the same experts unless two probabilities tie in fp32 but not in fp64
        double mx = -1e300, s = 0;
        for (float v : x) mx = std::max(mx, (double)v);
        std::vector<double> p(E);
        for (int i = 0; i < E; ++i) s += p[i] = std::exp((double)x[i] - mx);
        double sk = 0;
        for (int j = 0; j < K; ++j) sk += p[rid[j]] / s;
        for (int j = 0; j < K; ++j) {
            const double want = norm ? p[rid[j]] / s / sk : p[rid[j]] / s;
            close &= std::fabs(w[(size_t)t * K + j] - want) <= std::ldexp(std::fabs(want), -8) + 1e-7;
            if (j + 1 < K && p[rid[j]] < p[rid[j + 1]]) ++fp64_swaps;
        }
    }
    char m[160];
    std::snprintf(m, sizeof m, "topk E=%d k=%d norm=%d%s: ids and weights bit-identical to the PyTorch-order reference, within bf16 of fp64 (%d fp64 order swaps)",
                  E, K, (int)norm, ties ? " tied logits" : "", fp64_swaps);
    report(exact && close, m);
}

void test_topk_nan() {
    const int n = 4, E = 64, K = 8;
    std::vector<uint16_t> logits((size_t)n * E);
    for (auto& v : logits) v = bf(normal(1.f));
    logits[5] = BF_NAN;
    std::vector<int> ids;
    std::vector<float> w;
    run_topk(logits, n, E, K, true, ids, w);
    bool ok = true;
    for (int t = 0; t < n; ++t) {
        std::vector<int> seen(E, 0);
        for (int j = 0; j < K; ++j) {
            const int id = ids[(size_t)t * K + j];
            ok &= id >= 0 && id < E && !seen[id]++;
        }
    }
    report(ok, "topk: a NaN logit still gives k distinct ids in [0, E) (they index the experts' weights)");
}

// ------------------------------------------------------------------ routing
struct Route {
    std::vector<int> offsets, sorted, pos;
};
Route run_route(std::vector<int>& ids, int n, int E, int K) {
    Route r;
    r.offsets.assign(E + 1, -7);
    r.sorted.assign((size_t)n * K, -7);
    r.pos.assign((size_t)n * K, -7);
    emu_launch({1, 1, 1}, MOE_ROUTE_THREADS, [&] { moe_route(ids.data(), r.offsets.data(), r.sorted.data(), r.pos.data(), n, E, K); });
    return r;
}

std::vector<int> random_ids(int n, int E, int K, bool skew) {
    std::vector<int> ids((size_t)n * K);
    for (int t = 0; t < n; ++t) {
        std::vector<int> perm(E);
        for (int i = 0; i < E; ++i) perm[i] = i;
        if (!skew) std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < K; ++j) ids[(size_t)t * K + j] = perm[j];
    }
    return ids;
}

void test_route(int n, int E, int K, bool skew) {
    std::vector<int> ids = random_ids(n, E, K, skew);
    Route r = run_route(ids, n, E, K);
    // the stable counting sort
    const int P = n * K;
    std::vector<int> off(E + 1, 0), sorted(P), pos(P);
    for (int p = 0; p < P; ++p) off[ids[p] + 1]++;
    for (int e = 0; e < E; ++e) off[e + 1] += off[e];
    std::vector<int> next(off.begin(), off.end() - 1);
    for (int p = 0; p < P; ++p) sorted[pos[p] = next[ids[p]]++] = p;
    std::vector<int> seen(P, 0);
    bool perm = true;
    for (int q = 0; q < P; ++q) perm &= r.sorted[q] >= 0 && r.sorted[q] < P && !seen[r.sorted[q]]++ && r.pos[r.sorted[q]] == q;
    char m[160];
    std::snprintf(m, sizeof m, "route n=%d E=%d k=%d%s: a permutation of the %d pairs, grouped by expert, stable, equal to the counting sort", n, E, K,
                  skew ? " (every token to experts 0..k-1)" : "", P);
    report(perm && r.offsets == off && r.sorted == sorted && r.pos == pos, m);
}

void test_fused(int n, int E, int K, bool norm) {
    std::vector<uint16_t> logits((size_t)n * E);
    for (auto& v : logits) v = bf(std::round(normal(2.f) * 8.f) / 8.f);  // ties too
    std::vector<int> ids;
    std::vector<float> w;
    run_topk(logits, n, E, K, norm, ids, w);
    Route r = run_route(ids, n, E, K);
    std::vector<int> fids((size_t)n * K, -7), off(E + 1, -7), sorted((size_t)n * K, -7), pos((size_t)n * K, -7);
    std::vector<float> fw((size_t)n * K, -7.f);
    emu_launch({1, 1, 1}, MOE_ROUTE_THREADS, [&] {
        moe_topk_route(B(logits), fids.data(), fw.data(), off.data(), sorted.data(), pos.data(), n, E, K, norm ? 1 : 0);
    });
    char m[160];
    std::snprintf(m, sizeof m, "fused n=%d E=%d k=%d norm=%d: moe_topk_route = moe_topk + moe_route, every output bit for bit", n, E, K, (int)norm);
    report(fids == ids && fw == w && off == r.offsets && sorted == r.sorted && pos == r.pos, m);
}

// fp32 logits (the router GEMM's _f32out): the same code after the load.
void test_topk_f32(int n, int E, int K, bool norm) {
    // (a) bf16-valued fp32 logits: the bf16 entries' outputs bit for bit, both entries.
    std::vector<uint16_t> lb((size_t)n * E);
    for (auto& v : lb) v = bf(std::round(normal(2.f) * 8.f) / 8.f);  // ties too
    std::vector<float> lf(lb.size());
    for (size_t i = 0; i < lb.size(); ++i) lf[i] = fb(lb[i]);
    std::vector<int> ids;
    std::vector<float> w;
    run_topk(lb, n, E, K, norm, ids, w);
    std::vector<int> ids32((size_t)n * K, -7);
    std::vector<float> w32((size_t)n * K, -7.f);
    emu_launch({(unsigned)((n + 3) / 4), 1, 1}, 128, [&] { moe_topk_f32(lf.data(), ids32.data(), w32.data(), n, E, K, norm ? 1 : 0); });
    Route r = run_route(ids, n, E, K);
    std::vector<int> fids((size_t)n * K, -7), off(E + 1, -7), sorted((size_t)n * K, -7), pos((size_t)n * K, -7);
    std::vector<float> fw((size_t)n * K, -7.f);
    emu_launch({1, 1, 1}, MOE_ROUTE_THREADS, [&] {
        moe_topk_route_f32(lf.data(), fids.data(), fw.data(), off.data(), sorted.data(), pos.data(), n, E, K, norm ? 1 : 0);
    });
    char m[200];
    std::snprintf(m, sizeof m, "f32 n=%d E=%d k=%d norm=%d: bf16-valued fp32 logits give moe_topk's and moe_topk_route's bits (both _f32 entries)", n, E, K, (int)norm);
    report(ids32 == ids && w32 == w && fids == ids && fw == w && off == r.offsets && sorted == r.sorted && pos == r.pos, m);

    // (b) general fp32 logits: the reference on the fp32 values, and other experts than the bf16
    // rounding picks on some tokens (the reason for the option).
    std::vector<float> g((size_t)n * E);
    for (auto& v : g) v = normal(0.05f);  // a random router: logits close together
    std::vector<int> gid((size_t)n * K, -7);
    std::vector<float> gw((size_t)n * K, -7.f);
    emu_launch({(unsigned)((n + 3) / 4), 1, 1}, 128, [&] { moe_topk_f32(g.data(), gid.data(), gw.data(), n, E, K, norm ? 1 : 0); });
    std::vector<uint16_t> gb(g.size());
    for (size_t i = 0; i < g.size(); ++i) gb[i] = bf(g[i]);
    std::vector<int> bid;
    std::vector<float> bw;
    run_topk(gb, n, E, K, norm, bid, bw);
    bool exact = true;
    int other = 0;
    for (int t = 0; t < n; ++t) {
        std::vector<float> x(g.begin() + (size_t)t * E, g.begin() + (size_t)(t + 1) * E);
        std::vector<int> rid(K);
        std::vector<float> rw(K);
        ref_topk(torch_softmax(x), K, norm, rid.data(), rw.data());
        std::vector<int> a(K), b(K);
        for (int j = 0; j < K; ++j) {
            exact &= gid[(size_t)t * K + j] == rid[j] && gw[(size_t)t * K + j] == rw[j];
            a[j] = gid[(size_t)t * K + j];
            b[j] = bid[(size_t)t * K + j];
        }
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        other += a != b;
    }
    std::snprintf(m, sizeof m, "f32 n=%d E=%d k=%d norm=%d: fp32 logits bit-identical to the reference on their values; %d of %d tokens route otherwise than their bf16 rounding",
                  n, E, K, (int)norm, other, n);
    report(exact && other > 0, m);
}

// ------------------------------------------------------------------ grouped GEMM
// y[P, N] for expert-sorted rows; `large`: moe_gemm_l, else moe_gemm_s; `wg`: moe_gemm_w (128-row
// tiles on the emulated wgmma, 256 threads); the manifest's grid.
std::vector<uint16_t> run_gemm(bool large, std::vector<uint16_t>& x, std::vector<uint16_t>& W, Route& r, int n, int N, int K, int E, int topk,
                               bool gather, bool wg = false) {
    const int P = n * topk, tile = wg ? MOE_W_BM : large ? 64 : 16, bn = wg ? MOE_W_BN : large ? 128 : 64;
    std::vector<uint16_t> y((size_t)P * N, BF_NAN);
    const unsigned gx = (unsigned)(P / tile + std::min(E, P)), gy = (unsigned)((N + bn - 1) / bn);
    emu_launch({gx, gy, 1}, wg ? 256 : 128, [&] {
        if (wg)
            moe_gemm_w(B(x), B(W), B(y), r.offsets.data(), r.sorted.data(), n, N, K, E, topk, gather ? 1 : 0);
        else if (large)
            moe_gemm_l(B(x), B(W), B(y), r.offsets.data(), r.sorted.data(), n, N, K, E, topk, gather ? 1 : 0);
        else
            moe_gemm_s(B(x), B(W), B(y), r.offsets.data(), r.sorted.data(), n, N, K, E, topk, gather ? 1 : 0);
    });
    return y;
}

// max |y - ref| / (2^-8 |ref| + K·2^-23·Σ|a w| + 1e-6) over the rows: <= 1 passes; NaN (a row
// never written) fails.
double gemm_err(const std::vector<uint16_t>& y, const std::vector<uint16_t>& x, const std::vector<uint16_t>& W, const Route& r, const std::vector<int>& ids,
                int P, int N, int K, int topk, bool gather) {
    double worst = 0;
    for (int q = 0; q < P; ++q) {
        const int p = r.sorted[q], e = ids[p];
        const int src = gather ? p / topk : q;
        for (int c = 0; c < N; ++c) {
            double s = 0, a = 0;
            for (int k = 0; k < K; ++k) {
                const double t = (double)fb(x[(size_t)src * K + k]) * fb(W[((size_t)e * N + c) * K + k]);
                s += t;
                a += std::fabs(t);
            }
            const double got = fb(y[(size_t)q * N + c]);
            if (got != got) return 1e30;
            worst = std::max(worst, std::fabs(got - s) / (std::ldexp(std::fabs(s), -8) + K * 1.2e-7 * a + 1e-6));
        }
    }
    return worst;
}

void test_gemm(int n, int E, int topk, int N, int K, bool gather, bool skew) {
    std::vector<int> ids = random_ids(n, E, topk, skew);
    Route r = run_route(ids, n, E, topk);
    const int P = n * topk, rows = gather ? n : P;
    std::vector<uint16_t> x((size_t)rows * K), W((size_t)E * N * K);
    for (auto& v : x) v = bf(normal(1.f));
    for (auto& v : W) v = bf(normal(0.05f));
    auto ys = run_gemm(false, x, W, r, n, N, K, E, topk, gather);
    auto yl = run_gemm(true, x, W, r, n, N, K, E, topk, gather);
    auto yw = run_gemm(true, x, W, r, n, N, K, E, topk, gather, true);
    const double es = gemm_err(ys, x, W, r, ids, P, N, K, topk, gather), el = gemm_err(yl, x, W, r, ids, P, N, K, topk, gather);
    const double ew = gemm_err(yw, x, W, r, ids, P, N, K, topk, gather);
    // batch invariance: the first m tokens alone give their pairs' rows the same bits
    const int m = std::max(1, n / 3);
    std::vector<int> ids_m(ids.begin(), ids.begin() + (size_t)m * topk);
    Route rm = run_route(ids_m, m, E, topk);
    std::vector<uint16_t> xm(x);
    if (!gather) {  // the sorted act of the smaller step: the same rows, in its own order
        for (int q = 0; q < m * topk; ++q)
            std::copy_n(&x[(size_t)r.pos[rm.sorted[q]] * K], K, &xm[(size_t)q * K]);
    }
    auto ym = run_gemm(false, xm, W, rm, m, N, K, E, topk, gather);
    bool inv = true;
    for (int p = 0; p < m * topk; ++p) inv &= std::equal(&ym[(size_t)rm.pos[p] * N], &ym[(size_t)rm.pos[p] * N + N], &yl[(size_t)r.pos[p] * N]);
    char msg[260];
    std::snprintf(msg, sizeof msg, "gemm n=%d E=%d k=%d N=%d K=%d gather=%d%s: err/bound s %.3f l %.3f w %.3f, s = l = w bit-identical %s, %d-token step's rows identical %s",
                  n, E, topk, N, K, (int)gather, skew ? " skewed" : "", es, el, ew, ys == yl && ys == yw ? "yes" : "NO", m, inv ? "yes" : "NO");
    report(es <= 1 && el <= 1 && ew <= 1 && ys == yl && ys == yw && inv, msg);
}

// ------------------------------------------------------------------ combine and the whole block
std::vector<uint16_t> run_combine(std::vector<uint16_t>& y, std::vector<int>& ids, std::vector<float>& w, Route& r, int n, int H, int K, int flags) {
    std::vector<uint16_t> out((size_t)n * H, BF_NAN);
    emu_launch({(unsigned)n, 1, 1}, 256, [&] { moe_combine(B(out), B(y), ids.data(), w.data(), r.pos.data(), n, H, K, flags); });
    return out;
}

void test_combine(int n, int E, int K, int H) {
    std::vector<int> ids = random_ids(n, E, K, false);
    Route r = run_route(ids, n, E, K);
    std::vector<float> w((size_t)n * K);
    for (auto& v : w) v = rbf(std::fabs(normal(0.3f)));
    std::vector<uint16_t> y((size_t)n * K * H);
    for (auto& v : y) v = bf(normal(1.f));
    auto o32 = run_combine(y, ids, w, r, n, H, K, 0), ohf = run_combine(y, ids, w, r, n, H, K, 1);
    bool ok32 = true, okhf = true;
    for (int t = 0; t < n; ++t) {
        std::vector<int> slot(K);
        for (int j = 0; j < K; ++j) slot[j] = j;
        std::sort(slot.begin(), slot.end(), [&](int a, int b2) { return ids[(size_t)t * K + a] < ids[(size_t)t * K + b2]; });
        for (int c = 0; c < H; ++c) {
            float a32 = 0.f, ahf = 0.f;  // transformers: final.index_add_(bf16(y * bf16(w))), experts ascending
            for (int j : slot) {
                const float yy = fb(y[(size_t)r.pos[(size_t)t * K + j] * H + c]), ww = w[(size_t)t * K + j];
                a32 += ww * yy;
                ahf = rbf(ahf + rbf(ww * yy));
            }
            ok32 &= o32[(size_t)t * H + c] == bf(a32);
            okhf &= ohf[(size_t)t * H + c] == bf(ahf);
        }
    }
    char m[160];
    std::snprintf(m, sizeof m, "combine n=%d k=%d H=%d: fp32 ascending-expert sum %s, transformers' bf16 index_add_ order (flag 1) %s", n, K, H,
                  ok32 ? "bit-identical" : "DIFFERS", okhf ? "bit-identical" : "DIFFERS");
    report(ok32 && okhf, m);
}

void test_block(int n, int E, int K, int H, int I, bool norm) {
    std::vector<uint16_t> h((size_t)n * H), Wr((size_t)E * H), Wgu((size_t)E * 2 * I * H), Wd((size_t)E * H * I);
    for (auto& v : h) v = bf(normal(1.f));
    for (auto& v : Wr) v = bf(normal(0.1f));
    for (auto& v : Wgu) v = bf(normal(0.08f));
    for (auto& v : Wd) v = bf(normal(0.08f));
    // the router's logits as the bf16 GEMM writes them (fp64 here, rounded once)
    std::vector<uint16_t> logits((size_t)n * E);
    for (int t = 0; t < n; ++t)
        for (int e = 0; e < E; ++e) {
            double s = 0;
            for (int k = 0; k < H; ++k) s += (double)fb(h[(size_t)t * H + k]) * fb(Wr[(size_t)e * H + k]);
            logits[(size_t)t * E + e] = bf((float)s);
        }
    std::vector<int> ids;
    std::vector<float> w;
    run_topk(logits, n, E, K, norm, ids, w);
    Route r = run_route(ids, n, E, K);
    auto gu = run_gemm(n > 64, h, Wgu, r, n, 2 * I, H, E, K, true);
    std::vector<uint16_t> act((size_t)n * K * I, BF_NAN);
    emu_launch({(unsigned)(n * K), 1, 1}, 256, [&] { swiglu(B(act), B(gu), n * K, I); });
    auto y = run_gemm(n > 64, act, Wd, r, n, H, I, E, K, false);
    auto out = run_combine(y, ids, w, r, n, H, K, 0);
    // fp64 per token over its experts, rounding where transformers' bf16 forward rounds
    double err = 0, mx = 0;
    for (int t = 0; t < n; ++t) {
        std::vector<double> o(H, 0.0);
        for (int j = 0; j < K; ++j) {
            const int e = ids[(size_t)t * K + j];
            std::vector<float> a(I);
            for (int i = 0; i < I; ++i) {
                double g = 0, u = 0;
                for (int k = 0; k < H; ++k) {
                    const double x = fb(h[(size_t)t * H + k]);
                    g += x * fb(Wgu[((size_t)e * 2 * I + i) * H + k]);
                    u += x * fb(Wgu[((size_t)e * 2 * I + I + i) * H + k]);
                }
                const float gb = rbf((float)g);
                a[i] = rbf(rbf(gb / (1.f + std::exp(-gb))) * rbf((float)u));
            }
            for (int c = 0; c < H; ++c) {
                double d = 0;
                for (int i = 0; i < I; ++i) d += (double)a[i] * fb(Wd[((size_t)e * H + c) * I + i]);
                o[c] += (double)w[(size_t)t * K + j] * rbf((float)d);
            }
        }
        for (int c = 0; c < H; ++c) {
            const double got = fb(out[(size_t)t * H + c]);
            err = std::max(err, got == got ? std::fabs(got - o[c]) : 1e30);
            mx = std::max(mx, std::fabs(o[c]));
        }
    }
    char m[200];
    std::snprintf(m, sizeof m, "block n=%d E=%d k=%d H=%d I=%d norm=%d (%s): max err %.3e vs fp64 per-token experts, max |ref| %.3f (bound 2^-7 max|ref|)", n,
                  E, K, H, I, (int)norm, n > 64 ? "moe_gemm_l" : "moe_gemm_s", err, mx);
    report(err <= std::ldexp(mx, -7), m);
}

}  // namespace

int main() {
    for (int E : {4, 16, 60, 128, 512})
        for (int K : {1, 4, 8, 32}) {
            if (K > E) continue;
            test_topk(E, K, K % 8 == 0, false);
            if (E == 128 || E == 16) test_topk(E, K, true, true);
        }
    test_topk_nan();
    test_route(3, 8, 2, false);
    test_route(300, 128, 8, false);  // 2400 pairs: three chunks of 1024
    test_route(200, 128, 8, true);
    test_route(130, 512, 8, false);
    test_route(70, 5, 5, false);  // every expert of every token
    test_fused(1, 128, 8, true);
    test_fused(64, 128, 8, true);  // two tokens per warp
    test_fused(45, 60, 4, false);
    test_topk_f32(64, 128, 8, true);
    test_topk_f32(200, 512, 10, true);  // Qwen3-Next: 512 experts, top-10
    test_topk_f32(45, 60, 4, false);
    test_gemm(1, 6, 2, 80, 200, true, false);
    test_gemm(5, 6, 2, 80, 200, true, false);
    test_gemm(37, 6, 3, 200, 40, false, false);
    test_gemm(70, 6, 2, 80, 200, true, true);   // one expert holds every token: several tiles
    test_gemm(90, 8, 2, 136, 72, false, false);
    test_gemm(150, 6, 2, 136, 200, true, true);  // one expert, 150 rows: two 128-row tiles of moe_gemm_w
    test_combine(6, 16, 4, 200);
    test_combine(3, 128, 8, 36);  // H % 8 != 0: the scalar path
    test_block(3, 16, 4, 64, 32, true);
    test_block(70, 8, 2, 64, 32, false);
    std::printf("%d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
