// Runs packs/kernels/attention_decode.cu on the CPU (emu.h) against an fp64 reference, with
// attention.cu's attention_dD run the same way on the same inputs and checked against the same
// reference: decode and verify rows, padded tokens and sequences, prefill chunks (mixed steps),
// several chunk limits and grid z sizes, head dims 64, 128 and 256, and sliding windows (none, a
// window shorter than the context, window 1, a window longer than the context) over contexts that
// cross several 32-key tiles and the window's edge; rows that take one chunk must be
// bit-identical to attention_dD's. Window 1: every output is the row's own V, exactly; a window
// longer than every context: every output and scratch bit is the no-window run's. Then batch
// invariance: the same rows in steps of 1, 3, 8 and 64 rows, at several grid z sizes and as verify
// rows must be bit-identical (run_invariance), with and without a window.
// And attention_dD's per-row invariance across schedules (run_dd_row_invariance: one prefill chunk,
// other cuts, behind other sequences, one-token rows in mixed steps; D 128 / 256, G 1 / 2 / 4 / 8,
// windows; a negative control), the evidence for running attention_dD at every step size.
// Checks the logic (token lookup, chunking, window start, scratch layout, combine), not GPU behaviour.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "../../attention_decode.cu"
#include "attention_entries.h"  // attention.cu's entries (attention_emu.cpp)

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

// The shared memory of attention_decode_dD (sizeof(DecSmem<D>), as ptxas reports it for D = 64 and
// 128): at D = 256 the launch's dynamic shared memory, so the manifest's `shared` for
// attention_decode_d256 must be at least 83984 bytes (KERNELS.md and the GPU harnesses).
static_assert(sizeof(DecSmem<64>) == 22544 && sizeof(DecSmem<128>) == 43024,
              "attention_decode_dD's static shared memory changed: update KERNELS.md");
static_assert(sizeof(DecSmem<256>) == 83984,
              "attention_decode_d256's dynamic shared memory changed: update KERNELS.md and the GPU harnesses' `shared`");

static uint16_t bf(float f) { return __float2bfloat16_rn(f).x; }
static float fb(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
static const uint16_t BF_NAN = 0x7fc0;

static int cdiv(int a, int b) { return (a + b - 1) / b; }

// attention_decode_dD (grid [T, Hkv, Z], block 128) and attention_combine_dD (grid [T, Hq], block D).
static void emu_decode(int D, float* partial, const kern::bf16* q, const kern::bf16* kv, const int* bt, const int* sl,
                       const int* qs, int Sb, int T, int max_pages, int q_stride, int Hq, int Hkv, int layer, int layers,
                       int pt, float scale, int min_chunk, int max_chunks, int window, int Z) {
    emu_launch(uint3_{(unsigned)T, (unsigned)Hkv, (unsigned)Z}, 128, [&] {
        if (D == 256)
            attention_decode_d256(partial, q, kv, bt, sl, qs, Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt, scale,
                                  min_chunk, max_chunks, window);
        else if (D == 128)
            attention_decode_d128(partial, q, kv, bt, sl, qs, Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt, scale,
                                  min_chunk, max_chunks, window);
        else
            attention_decode_d64(partial, q, kv, bt, sl, qs, Sb, T, max_pages, q_stride, Hq, Hkv, layer, layers, pt, scale,
                                 min_chunk, max_chunks, window);
    });
}
static void emu_combine(int D, kern::bf16* out, const float* partial, int T, int Hq) {
    emu_launch(uint3_{(unsigned)T, (unsigned)Hq, 1}, (unsigned)D, [&] {
        if (D == 256)
            attention_combine_d256(out, partial, T, Hq);
        else if (D == 128)
            attention_combine_d128(out, partial, T, Hq);
        else
            attention_combine_d64(out, partial, T, Hq);
    });
}

// The first key a row with causal limit `lim` (keys 0 .. lim-1) sees under the sliding window
// `window` (<= 0: none): transformers' sliding mask keeps kv_idx > q_idx - window.
static int first_key(int lim, int window) { return window > 0 ? std::max(0, lim - window) : 0; }

// A row's chunking (attention_decode.cu): the chunks cover [kb, kmax), kb = the first visible key
// rounded down to 32.
struct Chunking {
    int kb, chunk, n;
};
static Chunking dec_chunks(int kmax, int max_chunks, int min_chunk, int window) {
    if (kmax <= 0) return {0, 32, 0};
    const int kb = first_key(kmax, window) / 32 * 32;
    const int mc = std::max(32, cdiv(min_chunk, 32) * 32);
    const int chunk = std::max(mc, cdiv(cdiv(kmax - kb, max_chunks), 32) * 32);
    return {kb, chunk, cdiv(kmax - kb, chunk)};
}

struct Case {
    std::string name;
    int Hq, Hkv, D, pt;
    std::vector<int> groups;                 // context of each sequence (its pages and K/V)
    std::vector<std::pair<int, int>> rows;   // (group, ctx): a one-token row
    int pad_t, pad_s, S, min_chunk;            // S: the grid's z size
    std::vector<std::pair<int, int>> prefill;  // optional: (cached, new) sequences instead of rows
    int max_chunks = 0;                        // the kernel's max_chunks; 0: S
    int window = 0;                            // the sliding window (<= 0: none)
    bool need_blind = false;                   // the case must reach rows with no visible key in
                                               // their first key tile and several first key tiles
};

// Coverage of the sliding window in attention_dD's tiling (32 / G tokens per query tile, 32 keys
// per key tile), counted from the step's shape as the kernel cuts it: query tiles whose first key
// tile kt0 is above 0 (key tiles below the window skipped), sequences whose query tiles start at
// different kt0, and rows with no visible key in their tile's first loaded key tile (their
// softmax state must stay NaN-free through it).
struct WindowCoverage {
    int tiles_kt0 = 0, seqs_multi_kt0 = 0, blind_rows = 0, kb_rows = 0;
};

static bool run_case(const Case& c, unsigned seed) {
    const int layers = 2, layer = 1, Hq = c.Hq, Hkv = c.Hkv, D = c.D, pt = c.pt, G = Hq / Hkv, W = c.window;
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
    const int MC = c.max_chunks ? c.max_chunks : c.S;
    const size_t nP = (size_t)cdiv(T, 4) * 4 + (size_t)MC * T * Hq * (D + 4);
    const float scale = 1.0f / std::sqrt((float)D);
    auto* qp = reinterpret_cast<const kern::bf16*>(qkv.data());
    auto* kvp = reinterpret_cast<const kern::bf16*>(pool.data());
    // the split path (+ 1 NaN guard row, 64 NaN floats past the scratch) and attention_dD on the
    // same inputs, with the case's window
    auto run = [&](int window, std::vector<float>& partial, std::vector<uint16_t>& out, std::vector<uint16_t>& att) {
        partial.assign(nP + 64, NAN);
        out.assign((size_t)(T + 1) * Hq * D, BF_NAN);
        att.assign((size_t)(T + 1) * Hq * D, BF_NAN);
        emu_decode(D, partial.data(), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, max_pages, q_stride, Hq, Hkv, layer,
                   layers, pt, scale, c.min_chunk, MC, window, c.S);
        emu_combine(D, reinterpret_cast<kern::bf16*>(out.data()), partial.data(), T, Hq);
        emu_attention(D, reinterpret_cast<kern::bf16*>(att.data()), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T,
                      max_pages, q_stride, Hq, Hkv, layer, layers, pt, scale, window);
    };
    std::vector<float> partial;
    std::vector<uint16_t> out, att;
    run(W, partial, out, att);
    // a window longer than every context changes nothing: the no-window run's bits, scratch included
    int longer_diff = -1;
    if (W > 0 && W >= *std::max_element(gctx.begin(), gctx.end())) {
        std::vector<float> p0;
        std::vector<uint16_t> o0, a0;
        run(0, p0, o0, a0);
        longer_diff = (int)(o0 != out) + (int)(a0 != att) +
                      (int)(std::memcmp(p0.data(), partial.data(), p0.size() * sizeof(float)) != 0);
    }
    int single_rows = 0, single_diff = 0, exact_v_diff = 0;
    // reference (fp64) and checks
    double err = 0, err_att = 0, mx = 0;
    int bad_hdr = 0, bad_pad = 0, bad_guard = 0, nonfinite = 0, max_act = 0;
    WindowCoverage cov;
    const int BQ = 32 / G;
    int t = 0;
    for (int s = 0; s < S; ++s) {
        const Seq& q = seqs[s];
        std::set<int> kt0s;
        for (int t0 = 0; t0 < q.n_new; t0 += BQ) {  // attention_dD's query tiles of this sequence
            const int base_lim = q.ctx - q.n_new + t0 + 1;
            const int kt0 = first_key(base_lim, W) / 32;
            kt0s.insert(kt0);
            cov.tiles_kt0 += kt0 > 0;
            for (int tl = 0; tl < std::min(BQ, q.n_new - t0); ++tl)
                cov.blind_rows += first_key(base_lim + tl, W) >= (kt0 + 1) * 32;
        }
        cov.seqs_multi_kt0 += kt0s.size() > 1;
        for (int i = 0; i < q.n_new; ++i, ++t) {
            const int kmax = q.ctx - q.n_new + i + 1, lo = first_key(kmax, W);
            const Chunking ch = dec_chunks(kmax, MC, c.min_chunk, W);
            cov.kb_rows += ch.kb > 0;
            max_act = std::max(max_act, ch.n);
            if (partial[t] != (float)ch.n) ++bad_hdr;
            if (ch.n == 1) {
                ++single_rows;
                for (int e = 0; e < Hq * D; ++e) single_diff += out[(size_t)t * Hq * D + e] != att[(size_t)t * Hq * D + e];
            }
            for (int h = 0; h < Hq; ++h) {
                const int kh = h / G;
                std::vector<double> sc(kmax - lo);
                double m = -1e300;
                for (int j = lo; j < kmax; ++j) {
                    double d = 0;
                    for (int e = 0; e < D; ++e)
                        d += (double)fb(qkv[(size_t)t * q_stride + (size_t)h * D + e]) * K[q.group][(size_t)j * row + kh * D + e];
                    sc[j - lo] = d * scale;
                    m = std::max(m, sc[j - lo]);
                }
                double L = 0;
                for (auto& x : sc) L += (x = std::exp(x - m));
                for (int e = 0; e < D; ++e) {
                    double o = 0;
                    for (int j = lo; j < kmax; ++j) o += sc[j - lo] * V[q.group][(size_t)j * row + kh * D + e];
                    o /= L;
                    const size_t idx = ((size_t)t * Hq + h) * D + e;
                    const float got = fb(out[idx]), got_att = fb(att[idx]);
                    if (!std::isfinite(got) || !std::isfinite(got_att)) ++nonfinite;
                    err = std::max(err, std::fabs(got - o));
                    err_att = std::max(err_att, std::fabs(got_att - o));
                    mx = std::max(mx, std::fabs(o));
                    if (W == 1) {  // one visible key (the row's own): its V, exactly
                        const float v = V[q.group][(size_t)(kmax - 1) * row + kh * D + e];
                        exact_v_diff += got != v || got_att != v;
                    }
                }
            }
        }
    }
    for (; t < T; ++t) {
        if (partial[t] != 0.f) ++bad_hdr;
        for (int e = 0; e < Hq * D; ++e) {
            const size_t idx = (size_t)t * Hq * D + e;
            bad_pad += (out[idx] != 0 && out[idx] != 0x8000) + (att[idx] != 0 && att[idx] != 0x8000);
        }
    }
    for (int e = 0; e < Hq * D; ++e) bad_guard += out[(size_t)T * Hq * D + e] != BF_NAN;
    for (int e = 0; e < Hq * D; ++e) bad_guard += att[(size_t)T * Hq * D + e] != BF_NAN;
    for (size_t e = nP; e < partial.size(); ++e) bad_guard += !std::isnan(partial[e]);
    const double tol = std::ldexp(mx, -7);
    const bool cov_ok = !c.need_blind || (cov.blind_rows > 0 && cov.seqs_multi_kt0 > 0);
    const bool ok = err <= tol && err_att <= tol && !bad_hdr && !bad_pad && !bad_guard && !nonfinite && !single_diff &&
                    !exact_v_diff && longer_diff <= 0 && cov_ok;
    char wbuf[256] = "";
    if (W > 0)
        std::snprintf(wbuf, sizeof wbuf,
                      " | window %d: %d rows' chunks start above key 0; attention_d%d: %d query tiles skip key tiles, %d "
                      "sequences with several first key tiles, %d rows with no visible key in their first key tile%s%s%s",
                      W, cov.kb_rows, D, cov.tiles_kt0, cov.seqs_multi_kt0, cov.blind_rows,
                      W == 1 ? (exact_v_diff ? ", outputs NOT the row's own V" : ", outputs == the row's own V exactly") : "",
                      longer_diff < 0 ? "" : (longer_diff ? ", NOT bit-identical to no window" : ", bit-identical to no window (outputs and scratch)"),
                      cov_ok ? "" : " (COVERAGE MISSING)");
    std::printf("[%s] %s: Hq=%d Hkv=%d D=%d page %d rows %d+%d Z=%d max_chunks %d min_chunk %d: max err %.3e (attention_d%d "
                "%.3e; tol %.3e), up to %d chunks, %d single-chunk rows %s attention_d%d%s%s%s%s%s\n",
                ok ? "PASS" : "FAIL", c.name.c_str(), Hq, Hkv, D, pt, n_tok, c.pad_t, c.S, MC, c.min_chunk, err, D, err_att, tol,
                max_act, single_rows, single_diff ? "NOT bit-identical to" : "bit-identical to", D,
                bad_hdr ? ", BAD HEADER" : "", bad_pad ? ", padded rows not zero" : "", bad_guard ? ", GUARD WRITTEN" : "",
                nonfinite ? ", NON-FINITE" : "", wbuf);
    return ok;
}

// ---- batch invariance: the same rows (same sequence KV, same position, same query) computed in
// decode steps of 1, 3, 8 and 64 rows, with several grid z sizes, and as k + 1 consecutive
// one-token rows of one sequence (a verify step), must give BIT-IDENTICAL outputs (with a sliding
// window too: a row's chunks start at its window's first key rounded down to 32, the row's alone).
struct InvFixture {
    int Hq, Hkv, D, pt, max_chunks, min_chunk, window;
    int layers = 2, layer = 1, max_pages = 0;
    std::vector<int> gctx;                 // each group's KV length
    std::vector<std::vector<int>> gpages;  // each group's pages
    std::vector<uint16_t> pool;
};

static InvFixture inv_fixture(int Hq, int Hkv, int D, int pt, int max_chunks, int window, std::vector<int> gctx,
                              unsigned seed) {
    InvFixture f{Hq, Hkv, D, pt, max_chunks, 64, window};
    f.gctx = gctx;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    int total = 2;
    for (int x : gctx) {
        f.max_pages = std::max(f.max_pages, cdiv(x, pt) + 1);
        total += cdiv(x, pt);
    }
    std::vector<int> perm(total);
    for (int i = 0; i < total; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    int it = 0;
    for (int x : gctx) {
        f.gpages.emplace_back(perm.begin() + it, perm.begin() + it + cdiv(x, pt));
        it += cdiv(x, pt);
    }
    const size_t row = (size_t)Hkv * D, page_elems = (size_t)pt * f.layers * 2 * row;
    f.pool.assign((size_t)total * page_elems, BF_NAN);
    for (size_t g = 0; g < gctx.size(); ++g)
        for (int p = 0; p < gctx[g]; ++p)
            for (int kv = 0; kv < 2; ++kv)
                for (size_t e = 0; e < row; ++e)
                    f.pool[(size_t)f.gpages[g][p / pt] * page_elems + ((size_t)(f.layer * 2 + kv) * pt + p % pt) * row + e] =
                        bf(nd(rng));
    return f;
}

// A row: sequence group g's token at position ctx - 1 (ctx visible keys); its query depends on
// (g, ctx) only.
struct InvRow {
    int g, ctx;
};

// One decode step over `seqs` (each a list of one-token rows sharing the group's block-table row:
// one row is a decode row, k + 1 consecutive rows a verify step's), plus pad_t padded tokens and
// pad_s padded sequences, with grid z = Z. Returns per row, in order, its output (Hq * D bf16)
// followed by its scratch records in chunk order ({o, m, l} of every head, as 16-bit halves of
// the fp32 bits; the header's chunk count first): the records must be bit-identical too, which
// catches a chunking that depends on the step even where the bf16 output happens to round the
// same. `bad` counts scratch guard writes and non-zero padded rows.
static std::vector<std::vector<uint16_t>> inv_step(const InvFixture& f, const std::vector<InvRow>& rows, int pad_t, int pad_s,
                                                   int Z, int& bad) {
    const int Hq = f.Hq, Hkv = f.Hkv, D = f.D, q_stride = (Hq + 2 * Hkv) * D;
    const int n = (int)rows.size(), T = n + pad_t, Sb = n + pad_s;
    std::vector<int> bt((size_t)Sb * f.max_pages, -1), qs{0}, sl;
    std::vector<uint16_t> qkv((size_t)T * q_stride, BF_NAN);  // k and v parts are never read
    for (int i = 0; i < n; ++i) {
        const InvRow& r = rows[i];
        for (size_t j = 0; j < f.gpages[r.g].size(); ++j) bt[(size_t)i * f.max_pages + j] = f.gpages[r.g][j];
        qs.push_back(i + 1);
        sl.push_back(r.ctx);
        std::mt19937 rng(1000003u * (unsigned)r.g + (unsigned)r.ctx);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (int e = 0; e < Hq * D; ++e) qkv[(size_t)i * q_stride + e] = bf(nd(rng));
    }
    for (int i = 0; i < pad_s; ++i) {
        qs.push_back(n);
        sl.push_back(0);
    }
    for (int t = n; t < T; ++t)
        for (int e = 0; e < Hq * D; ++e) qkv[(size_t)t * q_stride + e] = bf(1.f);
    const size_t nP = (size_t)cdiv(T, 4) * 4 + (size_t)f.max_chunks * T * Hq * (D + 4);
    std::vector<float> partial(nP + 64, NAN);
    std::vector<uint16_t> out((size_t)T * Hq * D, BF_NAN);
    const float scale = 1.0f / std::sqrt((float)D);
    auto* qp = reinterpret_cast<const kern::bf16*>(qkv.data());
    auto* kvp = reinterpret_cast<const kern::bf16*>(f.pool.data());
    emu_decode(D, partial.data(), qp, kvp, bt.data(), sl.data(), qs.data(), Sb, T, f.max_pages, q_stride, Hq, Hkv, f.layer,
               f.layers, f.pt, scale, f.min_chunk, f.max_chunks, f.window, Z);
    emu_combine(D, reinterpret_cast<kern::bf16*>(out.data()), partial.data(), T, Hq);
    for (size_t e = nP; e < partial.size(); ++e) bad += !std::isnan(partial[e]);
    for (size_t e = (size_t)n * Hq * D; e < out.size(); ++e) bad += out[e] != 0 && out[e] != 0x8000;
    std::vector<std::vector<uint16_t>> res;
    auto push32 = [](std::vector<uint16_t>& v, float x) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        v.push_back((uint16_t)(u & 0xffff));
        v.push_back((uint16_t)(u >> 16));
    };
    for (int i = 0; i < n; ++i) {
        std::vector<uint16_t> r(out.begin() + (size_t)i * Hq * D, out.begin() + (size_t)(i + 1) * Hq * D);
        const int nc = (int)partial[i];
        push32(r, partial[i]);
        for (int c = 0; c < nc; ++c)
            for (int h = 0; h < Hq; ++h)
                for (int e = 0; e < D + 2; ++e) push32(r, partial[dec_record(T, Hq, D, c, i, h) + e]);
        res.push_back(std::move(r));
    }
    return res;
}

// The manifest's grid z for a step of `seqs` rows of a model with `hkv_model` kv heads
// (packs: decode_splits); the fixtures below run fewer kv heads than the model whose
// grid they mimic, to keep the emulation short.
static int inv_grid_z(int seqs, int hkv_model, int max_chunks) {
    return std::max(1, std::min(max_chunks, cdiv(264, seqs * hkv_model)));
}

static bool run_invariance(const char* name, int Hq, int Hkv, int D, int max_chunks, int hkv_model, std::vector<int> ctxs,
                           unsigned seed, int window = 0) {
    // group 0: a 4096-token sequence; group 1: a short one for filler rows
    const InvFixture f = inv_fixture(Hq, Hkv, D, 16, max_chunks, window, {4096, 96}, seed);
    auto Zs = [&](int seqs) { return inv_grid_z(seqs, hkv_model, max_chunks); };
    std::vector<InvRow> rows;
    for (int c : ctxs) rows.push_back({0, c});
    // (g, ctx) -> the row's output the first time it was computed; every later one must equal it
    std::map<std::pair<int, int>, std::vector<uint16_t>> ref;
    int diff_rows = 0, compared = 0, bad = 0, steps = 0;
    auto step = [&](const std::vector<InvRow>& s, int pad_t, int pad_s, int Z) {
        ++steps;
        const auto got = inv_step(f, s, pad_t, pad_s, Z, bad);
        for (size_t i = 0; i < s.size(); ++i) {
            auto [it, fresh] = ref.try_emplace({s[i].g, s[i].ctx}, got[i]);
            if (fresh) continue;
            ++compared;
            if (it->second != got[i]) {
                if (diff_rows < 4)
                    std::printf("    differs: group %d ctx %d in a step of %zu rows, grid z %d\n", s[i].g, s[i].ctx, s.size(), Z);
                ++diff_rows;
            }
        }
    };
    // steps of 1 at batch 1's grid z (every chunk its own CTA), then two at z = 1
    for (auto& r : rows) step({r}, 0, 0, Zs(1));
    step({rows.back()}, 0, 0, 1);
    step({rows[rows.size() / 2]}, 0, 0, 1);
    // steps of 3 (+ a padded token and a padded sequence), at the manifest's z
    for (size_t i = 0; i < rows.size(); i += 3) {
        std::vector<InvRow> s(rows.begin() + i, rows.begin() + std::min(rows.size(), i + 3));
        step(s, 1, 1, Zs(3));
    }
    // steps of 8 (rows in another order), at the manifest's z and at others
    for (int Z : {Zs(8), 2, 7, max_chunks}) {
        std::vector<InvRow> s;
        for (size_t i = 0; i < 8; ++i) s.push_back(rows[(i * 5 + Z) % rows.size()]);
        std::sort(s.begin(), s.end(), [](const InvRow& a, const InvRow& b) { return a.ctx < b.ctx; });
        s.erase(std::unique(s.begin(), s.end(), [](const InvRow& a, const InvRow& b) { return a.ctx == b.ctx; }), s.end());
        std::reverse(s.begin(), s.end());
        step(s, 0, 0, Z);
    }
    // a step of 64 rows: every row above between short filler rows of group 1, at the manifest's
    // z and at z = 1
    {
        std::vector<InvRow> s;
        std::mt19937 rng(seed + 1);
        size_t next = 0;
        while (s.size() < 64) {
            if (next < rows.size() && (rng() % 4 == 0 || 64 - s.size() <= rows.size() - next))
                s.push_back(rows[next++]);
            else
                s.push_back({1, 1 + (int)(rng() % 96)});
        }
        step(s, 0, 0, Zs(64));
        step(s, 0, 0, 1);
    }
    // verify steps: k + 1 consecutive one-token rows of one sequence (one block-table row,
    // consecutive seq_lens); their rows again as decode rows of steps of 1; then a step of two
    // sequences' verify rows, a decode row and padding
    for (auto [k, last] : {std::pair{4, 65}, {3, 65}, {4, 2049}, {4, 4096}, {3, 4096}}) {
        std::vector<InvRow> s;
        for (int i = 0; i <= k; ++i) s.push_back({0, last - k + i});
        step(s, 0, 0, Zs((int)s.size()));
    }
    for (int c : {62, 2047, 4093}) step({{0, c}}, 0, 0, Zs(1));
    {
        std::vector<InvRow> s;
        for (int i = 0; i < 5; ++i) s.push_back({0, 4092 + i});
        for (int i = 0; i < 5; ++i) s.push_back({1, 92 + i});
        s.push_back({0, rows[rows.size() / 2].ctx});
        step(s, 2, 1, Zs((int)s.size()));
    }
    const bool ok = diff_rows == 0 && bad == 0 && compared > 0;
    std::printf("[%s] batch invariance, %s: Hq=%d Hkv=%d D=%d max_chunks %d window %d: %d steps of 1 to 64 rows, %d rows "
                "compared with their first result (output and chunk records), %d not bit-identical%s\n",
                ok ? "PASS" : "FAIL", name, Hq, Hkv, D, max_chunks, window, steps, compared, diff_rows,
                bad ? ", GUARD WRITTEN or padded rows not zero" : "");
    return ok;
}

// ---- attention_dD per-row invariance across schedules (docs/batch-invariance.md: a batch-invariant
// pack of the hybrids runs attention_dD for every attention step, decode rows included). Sequences
// with fixed K / V / Q per position; the same query rows computed under several schedules (one
// prefill chunk; the prompt cut at 1, 17, 64 and page-unaligned places; behind other sequences in
// the same varlen step; the last rows as one-token rows in mixed steps beside other sequences'
// prefill chunks; every row a one-token row; a grid smaller than the work) must give
// bit-identical outputs. attention_dD's query tiles are 32 / G tokens of a sequence's new tokens,
// so a row's tile, its place in the tile, the tile's first / last key tile and its warp slot all
// change with the cut: fully masked key tiles must add exact zeros with a rescale of exactly 1.
// The negative control scales the scores of later schedules by 1 + 2^-12: it must differ.
using DDPiece = InvariancePiece;
using DDSchedule = std::vector<std::vector<DDPiece>>;  // steps

static bool run_dd_row_invariance(const char* name, int Hq, int Hkv, int D, int window, const std::vector<int>& lens,
                                  const std::vector<DDSchedule>& schedules, unsigned seed, bool control = false) {
    const int layers = 2, layer = 1, pt = 16, S = (int)lens.size();
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    InvariancePool ip(rng, nd, lens, Hq, Hkv, D, layers, layer, pt);
    const int max_pages = ip.max_pages, q_stride = ip.q_stride;
    const float scale = 1.0f / std::sqrt((float)D);
    std::vector<std::vector<std::vector<uint16_t>>> first(S);  // (seq, pos) -> bits of its first result
    for (int s = 0; s < S; ++s) first[s].resize(lens[s]);
    long rows = 0, differ = 0, elems_differ = 0;
    int steps = 0, bad = 0;
    for (size_t si = 0; si < schedules.size(); ++si) {
        const float sc_step = control && si > 0 ? scale * (1.0f + 0x1p-12f) : scale;
        for (const auto& step : schedules[si]) {
            ++steps;
            // + a padded sequence (no tokens) and a padded token (the last row, n)
            const InvarianceStep in = ip.step(step, pt, Hq, D, true, bf(1.f));
            const int Sb = in.Sb, T = in.T, n = T - 1;
            const std::vector<int>&bt = in.bt, &sl = in.sl, &qs = in.qs;
            int t = 0;
            std::vector<uint16_t> out((size_t)T * Hq * D, BF_NAN);
            // odd schedules: a grid of 3 CTAs per kv head (grid-stride over the work items)
            emu_attention(D, reinterpret_cast<kern::bf16*>(out.data()), reinterpret_cast<const kern::bf16*>(in.qkv.data()),
                          reinterpret_cast<const kern::bf16*>(ip.pool.data()), bt.data(), sl.data(), qs.data(), Sb, T, max_pages,
                          q_stride, Hq, Hkv, layer, layers, pt, sc_step, window, si % 2 ? 3u : 0u);
            for (int e = 0; e < Hq * D; ++e) bad += out[(size_t)n * Hq * D + e] != 0 && out[(size_t)n * Hq * D + e] != 0x8000;
            t = 0;
            for (const DDPiece& pc : step)
                for (int r = 0; r < pc.count; ++r, ++t) {
                    std::vector<uint16_t> got(out.begin() + (size_t)t * Hq * D, out.begin() + (size_t)(t + 1) * Hq * D);
                    for (uint16_t u : got) bad += !std::isfinite(fb(u));
                    auto& f = first[pc.seq][pc.start + r];
                    if (f.empty()) {
                        f = std::move(got);
                        continue;
                    }
                    ++rows;
                    if (f != got) {
                        if (!control && differ < 4)
                            std::printf("    differs: schedule %zu, seq %d row %d (piece %d+%d of a %zu-piece step)\n", si, pc.seq,
                                        pc.start + r, pc.start, pc.count, step.size());
                        ++differ;
                        for (int e = 0; e < Hq * D; ++e) elems_differ += f[e] != got[e];
                    }
                }
        }
    }
    const bool ok = bad == 0 && (control ? differ > 0 : rows > 0 && differ == 0);
    std::printf("[%s] attention_d%d per-row invariance%s, %s: Hq=%d Hkv=%d (G=%d) D=%d window %d: %zu schedules, %d steps, %ld rows "
                "recomputed, %ld not bit-identical to their first result (%ld elements)%s\n",
                ok ? "PASS" : "FAIL", D, control ? " (negative control: scores scaled by 1 + 2^-12 must differ)" : "", name, Hq, Hkv,
                Hq / Hkv, D, window, schedules.size(), steps, rows, differ, elems_differ,
                bad ? ", NON-FINITE output or padded token not zero" : "");
    return ok;
}

// Schedules for sequences 0 (a tokens) and 1 (b tokens) with sequence 2 (c tokens) as filler.
static std::vector<DDSchedule> dd_schedules(int a, int b, int c) {
    std::vector<DDSchedule> sc;
    sc.push_back({{{0, 0, a}}, {{1, 0, b}}});  // each prompt in one chunk, alone
    for (int cut : {1, 17, 64})                  // cut + rest (both sequences in each step)
        sc.push_back({{{0, 0, cut}, {1, 0, cut}}, {{1, cut, b - cut}, {0, cut, a - cut}}});
    // page-unaligned cuts (page 16), different for the two sequences, several steps
    sc.push_back({{{0, 0, 37}}, {{0, 37, 63}, {1, 0, 23}}, {{1, 23, 48}, {0, 100, 63}}, {{0, 163, a - 163}, {1, 71, b - 71}}});
    // behind other sequences in one varlen step (the filler first, then 1, then 0)
    sc.push_back({{{2, 0, c}, {1, 0, b}, {0, 0, a}}});
    // the last rows as one-token rows in mixed steps beside other sequences' prefill chunks
    {
        DDSchedule s = {{{0, 0, a - 6}, {1, 0, b - 5}}};
        for (int k = 0; k < 6; ++k) {
            std::vector<DDPiece> st = {{2, (7 * k) % (c - 9), 9}, {0, a - 6 + k, 1}};
            if (k < 5) st.insert(st.begin() + (k % 2), DDPiece{1, b - 5 + k, 1});
            s.push_back(st);
        }
        sc.push_back(s);
    }
    // one-token rows (decode-like steps: sequence 0 and 1 side by side, 1 first) for the first 40
    // positions and the last 20, the middle as one chunk each
    {
        DDSchedule s;
        auto ones = [&](int p0, int p1, int q0, int q1) {
            for (int k = 0; k < std::max(p1 - p0, q1 - q0); ++k) {
                std::vector<DDPiece> st;
                if (q0 + k < q1) st.push_back({1, q0 + k, 1});
                if (p0 + k < p1) st.push_back({0, p0 + k, 1});
                s.push_back(st);
            }
        };
        ones(0, 40, 0, 40);
        s.push_back({{0, 40, a - 60}, {1, 40, b - 60}});
        ones(a - 20, a, b - 20, b);
        sc.push_back(s);
    }
    // odd chunk sizes (5, 11, 29 tokens, cycled)
    {
        DDSchedule s;
        const int sz[3] = {5, 11, 29};
        int pa = 0, pb = 0, k = 0;
        while (pa < a || pb < b) {
            std::vector<DDPiece> st;
            if (pb < b) {
                const int m = std::min(sz[(k + 1) % 3], b - pb);
                st.push_back({1, pb, m});
                pb += m;
            }
            if (pa < a) {
                const int m = std::min(sz[k % 3], a - pa);
                st.push_back({0, pa, m});
                pa += m;
            }
            s.push_back(st);
            ++k;
        }
        sc.push_back(s);
    }
    return sc;
}

static int dd_row_invariance_all() {
    const std::vector<int> lens = {200, 100, 50};
    const auto sc = dd_schedules(200, 100, 50);
    const std::vector<DDSchedule> sc_control(sc.begin(), sc.begin() + 4);
    int fails = 0;
    fails += !run_dd_row_invariance("G=1 D=128", 2, 2, 128, 0, lens, sc, 21);
    fails += !run_dd_row_invariance("G=4 D=128", 4, 1, 128, 0, lens, sc, 22);
    fails += !run_dd_row_invariance("G=8 D=128", 8, 1, 128, 0, lens, sc, 23);
    fails += !run_dd_row_invariance("G=4 D=128, window 37", 4, 1, 128, 37, lens, sc, 24);
    fails += !run_dd_row_invariance("G=1 D=256", 1, 1, 256, 0, lens, sc, 25);
    fails += !run_dd_row_invariance("G=4 D=256", 4, 1, 256, 0, lens, sc, 26);
    fails += !run_dd_row_invariance("G=8 D=256", 8, 1, 256, 0, lens, sc, 27);
    fails += !run_dd_row_invariance("G=2 D=256, window 100", 4, 2, 256, 100, lens, sc, 28);
    fails += !run_dd_row_invariance("G=4 D=128", 4, 1, 128, 0, lens, sc_control, 22, true);
    return fails;
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
        // grid z below max_chunks: CTAs loop over chunks z, z + Z, ...
        {"Z=1 max_chunks 33 (one CTA streams all chunks)", 8, 2, 128, 16, {4096, 255, 65}, plain({4096, 255, 65}), 1, 1, 1, 64, {}, 33},
        {"Z=5 max_chunks 33, 4B-like group", 16, 4, 128, 16, {1000, 3000}, plain({1000, 3000}), 0, 0, 5, 64, {}, 33},
        {"Z=3 max_chunks 64 verify rows, D=64", 14, 2, 64, 16, {700}, {{0, 696}, {0, 697}, {0, 698}, {0, 699}, {0, 700}}, 1, 1, 3, 64, {}, 64},
        {"Z=40 > max_chunks 7", 8, 2, 64, 16, {500, 33}, plain({500, 33}), 0, 0, 40, 32, {}, 7},
        // head_dim 256 (Gemma 3: attention_d256, attention_decode_d256 / combine_d256), no window
        {"D=256 b=3 ctx 1/255/2000 + pad, Gemma3-4B-like G=2", 4, 2, 256, 16, {1, 255, 2000}, plain({1, 255, 2000}), 1, 1, 33, 64, {}, 33},
        {"D=256 G=4 mixed prefill/decode step", 8, 2, 256, 16, {}, {}, 2, 1, 3, 64, {{30, 40}, {0, 1}, {100, 1}}, 33},
        // sliding windows (the last fields: max_chunks, window, must reach rows with no visible key
        // in their first key tile): decode rows around the window's edge ...
        {"window 100: rows across key tiles and the window edge, D=128 G=2", 4, 2, 128, 16, {300},
         {{0, 1}, {0, 31}, {0, 32}, {0, 33}, {0, 99}, {0, 100}, {0, 101}, {0, 131}, {0, 132}, {0, 133}, {0, 164}, {0, 299}, {0, 300}},
         1, 1, 3, 64, {}, 33, 100},
        {"window 1 (a row sees itself), D=64 G=4", 8, 2, 64, 16, {500}, {{0, 1}, {0, 2}, {0, 33}, {0, 64}, {0, 65}, {0, 500}}, 1, 0, 4,
         64, {}, 64, 1},
        {"window 5000 > every context, D=256 G=2", 4, 2, 256, 16, {1, 100, 1000}, plain({1, 100, 1000}), 0, 1, 5, 64, {}, 33, 5000},
        {"window 37 (its edge inside key tiles), D=256 G=2", 4, 2, 256, 16, {1000},
         {{0, 36}, {0, 37}, {0, 38}, {0, 69}, {0, 70}, {0, 71}, {0, 1000}}, 0, 0, 4, 64, {}, 33, 37},
        {"window 200, Z=1 < chunks (one CTA streams them from the window's tile)", 8, 2, 128, 16, {1000, 3000},
         plain({1000, 3000}), 0, 0, 1, 64, {}, 33, 200},
        {"window 1024 (Gemma 3), max_chunks 64, D=256 G=2, Z=16", 4, 2, 256, 16, {1023, 1024, 1025, 3000},
         plain({1023, 1024, 1025, 3000}), 0, 0, 16, 64, {}, 64, 1024},
        // ... and prefill chunks (attention_dD's first key tile kt0 per query tile, rows with no visible
        // key in it; the split path on every token of the step)
        {"mixed step, window 50, D=128 G=2 (16 tokens per query tile)", 4, 2, 128, 16, {}, {}, 3, 2, 4, 64,
         {{200, 70}, {0, 40}, {31, 1}, {500, 1}, {10, 33}}, 33, 50, true},
        {"mixed step, window 20, D=64 G=1 (32 tokens per query tile)", 2, 2, 64, 16, {}, {}, 1, 1, 2, 64,
         {{100, 65}, {7, 30}, {0, 1}}, 64, 20, true},
        {"mixed step, window 45, D=256 G=4 (8 tokens per query tile)", 8, 2, 256, 16, {}, {}, 2, 0, 3, 64,
         {{120, 40}, {0, 50}, {60, 1}}, 33, 45, true},
        {"mixed step, window 1, D=128 G=8", 8, 1, 128, 16, {}, {}, 0, 1, 2, 64, {{40, 20}, {0, 9}, {5, 1}}, 33, 1},
        {"mixed step, window 400 > every context, D=64 G=2", 4, 2, 64, 16, {}, {}, 1, 0, 3, 64, {{200, 70}, {0, 40}}, 64, 400},
    };
    int fails = 0, n = 0;
    for (auto& c : cases) {
        fails += !run_case(c, 1234 + n);
        ++n;
    }
    // Qwen3-4B's chunking and grids (8 kv heads: max_chunks 33) at G = 4, D = 128, and
    // Qwen2.5-0.5B's (2 kv heads: max_chunks 64) at G = 7, D = 64, each on one kv head (the
    // emulation's time goes by CTAs)
    fails += !run_invariance("4B-like chunking, D=128 G=4", 4, 1, 128, 33, 8, {1, 33, 64, 65, 255, 1000, 2049, 4000, 4096}, 77);
    fails += !run_invariance("0.5B-like chunking, D=64 G=7", 7, 1, 64, 64, 2, {1, 65, 300, 2049, 4096}, 78);
    // with a sliding window: rows on both sides of its edge (their chunks start at the window's
    // first key rounded down to 32), Qwen3-4B's chunking at D = 128 and Gemma 3 4B's (4 kv heads:
    // max_chunks 64, window 1024) at D = 256
    fails += !run_invariance("window 100, 4B-like chunking, D=128 G=4", 4, 1, 128, 33, 8,
                             {1, 99, 100, 101, 132, 133, 1000, 2049, 4096}, 79, 100);
    fails += !run_invariance("window 1024, Gemma3-4B-like chunking, D=256 G=2", 2, 1, 256, 64, 4,
                             {1, 1023, 1024, 1025, 1056, 1057, 2049, 4096}, 80, 1024);
    n += 4;
    // attention_dD per-row invariance across schedules (9 checks, the last a negative control)
    fails += dd_row_invariance_all();
    n += 9;
    std::printf("%d passed, %d failed\n", n - fails, fails);
    return fails ? 1 : 0;
}
