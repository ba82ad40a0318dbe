// Runs packs/kernels/gdn.cu (Gated DeltaNet: causal conv1d, chunked and recurrent gated delta
// rule, gated RMSNorm) on the CPU (emu.h) against fp64 references written from transformers'
// torch_causal_conv1d_update / torch_recurrent_gated_delta_rule / Qwen3NextRMSNormGated:
//   conv       gdn_conv + gdn_conv_state over varlen steps (rows of several sequences, slots
//              permuted, a padded row with slot -1, padded tokens): y vs fp64 (one bf16 unit),
//              y of a sequence split into chunks across steps BIT-IDENTICAL to one whole-row
//              step (conv state continuation), the conv state = the last KW-1 inputs exactly
//   delta      sequences prefilled in pieces (1, 63, 64, 65, 300 ... tokens, several rows per
//              step) then decoded token by token, three ways: chunked prefill + recurrent
//              decode, all recurrent, all chunked; each output vs an fp64 recurrence over the
//              whole sequence, the final recurrent states vs fp64 and against each other
//              (prefill-then-decode vs all-recurrent), fp32 and bf16 states; D = 64 (two
//              value-column slices per CTA) through the templates and D = 128 through the
//              extern "C" entries; a slot's other layer and other slots untouched
//   norm       gdn_norm_gated vs the transformers order of bf16 roundings (one bf16 unit)
//   invariance the same sequence cut at 1 / 16 / 64 / 100, as one-token steps, beside other
//              sequences: conv + conv state + gdn_recurrent_f32 + gated norm outputs and final
//              states bit-identical (the batch-invariant pack's chain); bf16 state as a negative
//              control; gdn_chunk_f32 vs recurrent (information)
//   negative   a state reset in the middle of a sequence (position 0 given to a later chunk) and a
//              stale slot are caught by the same checks (they must FAIL), so the checks can fail
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "emu_math.h"
#include "../../gdn.cu"

#include <algorithm>
#include <random>
#include <string>

namespace {

uint16_t bfbits(float x) { return __float2bfloat16_rn(x).x; }
float bfval(uint16_t u) { return __bfloat162float(__nv_bfloat16{u}); }
float rbf(float x) { return bfval(bfbits(x)); }

int fails = 0, passes = 0;
void report(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    (ok ? passes : fails)++;
}

struct Shape {
    int hk, hv, D;
    int conv_dim() const { return (2 * hk + hv) * D; }
};

// One sequence's inputs: raw projection rows (conv_dim channels) and the b / a gates.
struct Seq {
    int len;
    std::vector<uint16_t> x;   // [len][conv_dim]
    std::vector<uint16_t> ab;  // [len][2 hv]: b | a
};

struct Model {
    Shape sh;
    std::vector<uint16_t> w;       // conv weight [conv_dim][KW]
    std::vector<float> A_log, dt_bias;
    std::vector<uint16_t> nw;      // norm weight [D]
    std::vector<Seq> seqs;
};

Model make_model(Shape sh, const std::vector<int>& lens, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    Model m;
    m.sh = sh;
    const int C = sh.conv_dim();
    m.w.resize((size_t)C * GDN_KW);
    for (auto& v : m.w) v = bfbits(nd(rng) * 0.5f);
    for (int h = 0; h < sh.hv; ++h) {
        // even heads decay fast (A in (0.07, 2.2): a chunk's exp(gc) reaches ~1e-30), odd heads
        // slowly (A in (1e-3, 0.03)): the state carries hundreds of tokens
        m.A_log.push_back(h % 2 == 0 ? std::log(0.5f + 15.5f * ud(rng)) - 2.f : std::log(0.5f + 15.5f * ud(rng)) - 6.3f);
        m.dt_bias.push_back(rbf(nd(rng) * 0.5f));
    }
    for (int i = 0; i < sh.D; ++i) m.nw.push_back(bfbits(1.f + 0.3f * nd(rng)));
    for (int L : lens) {
        Seq s;
        s.len = L;
        s.x.resize((size_t)L * C);
        for (auto& v : s.x) v = bfbits(nd(rng));
        s.ab.resize((size_t)L * 2 * sh.hv);
        for (int t = 0; t < L; ++t)
            for (int h = 0; h < sh.hv; ++h) {
                s.ab[(size_t)t * 2 * sh.hv + h] = bfbits(nd(rng) * 1.5f);             // b
                s.ab[(size_t)t * 2 * sh.hv + sh.hv + h] = bfbits(nd(rng) * 2.f - 1.f);  // a
            }
        m.seqs.push_back(std::move(s));
    }
    return m;
}

// ------------------------------------------------------------------ fp64 references
// y[t][c] = bf16(silu(bf16(conv))) over the whole sequence from a zero state.
std::vector<double> ref_conv(const Model& m, int si) {
    const Seq& s = m.seqs[si];
    const int C = m.sh.conv_dim();
    std::vector<double> y((size_t)s.len * C);
    for (int t = 0; t < s.len; ++t)
        for (int c = 0; c < C; ++c) {
            double acc = 0;
            for (int j = 0; j < GDN_KW; ++j) {
                const int idx = t - (GDN_KW - 1) + j;
                if (idx >= 0) acc += (double)bfval(m.w[(size_t)c * GDN_KW + j]) * bfval(s.x[(size_t)idx * C + c]);
            }
            const float r = rbf((float)acc);
            y[(size_t)t * C + c] = rbf((float)(r / (1.0 + std::exp(-(double)r))));
        }
    return y;
}

// The recurrence in fp64 on the given conv output y (bf16 values), from a zero state:
// o[t][h*D + e] and the final state S[h][dk][dv].
void ref_delta(const Model& m, int si, const std::vector<uint16_t>& y, std::vector<double>& o, std::vector<double>& S) {
    const Shape& sh = m.sh;
    const int D = sh.D, C = sh.conv_dim(), len = m.seqs[si].len, rep = sh.hv / sh.hk;
    o.assign((size_t)len * sh.hv * D, 0.0);
    S.assign((size_t)sh.hv * D * D, 0.0);
    const double scale = 1.0 / std::sqrt((double)D);
    for (int t = 0; t < len; ++t)
        for (int h = 0; h < sh.hv; ++h) {
            const int kh = h / rep;
            std::vector<double> q(D), k(D), v(D);
            double sq = 0, sk = 0;
            for (int d = 0; d < D; ++d) {
                q[d] = bfval(y[(size_t)t * C + kh * D + d]);
                k[d] = bfval(y[(size_t)t * C + sh.hk * D + kh * D + d]);
                v[d] = bfval(y[(size_t)t * C + 2 * sh.hk * D + h * D + d]);
                sq += q[d] * q[d];
                sk += k[d] * k[d];
            }
            for (int d = 0; d < D; ++d) {
                q[d] *= scale / std::sqrt(sq + 1e-6);
                k[d] /= std::sqrt(sk + 1e-6);
            }
            const uint16_t* ab = &m.seqs[si].ab[(size_t)t * 2 * sh.hv];
            const double av = bfval(ab[sh.hv + h]) + (double)m.dt_bias[h];
            const double sp = av > 20 ? av : std::log1p(std::exp(av));
            const double g = -std::exp((double)m.A_log[h]) * sp;
            const double beta = rbf((float)(1.0 / (1.0 + std::exp(-(double)bfval(ab[h])))));
            double* Sh = &S[(size_t)h * D * D];
            const double eg = std::exp(g);
            for (int i = 0; i < D * D; ++i) Sh[i] *= eg;
            for (int e = 0; e < D; ++e) {
                double kv = 0;
                for (int d = 0; d < D; ++d) kv += Sh[(size_t)d * D + e] * k[d];
                const double delta = (v[e] - kv) * beta;
                double out = 0;
                for (int d = 0; d < D; ++d) {
                    Sh[(size_t)d * D + e] += k[d] * delta;
                    out += Sh[(size_t)d * D + e] * q[d];
                }
                o[(size_t)t * sh.hv * D + h * D + e] = out;
            }
        }
}

// ------------------------------------------------------------------ running the kernels
enum Kind { CHUNK, RECURRENT };

template <int D, class ST>
struct Runner {
    const Model& m;
    int num_layers = 2, layer = 1, nslots;
    size_t seq_bytes, layer_bytes, conv_bytes;
    std::vector<unsigned char> state;
    std::vector<int> slot_of;  // sequence -> slot
    // results per sequence
    std::vector<std::vector<uint16_t>> y, o, nout;
    bool use_entries = false;  // D == 128: call the extern "C" entries

    Runner(const Model& mm, unsigned seed) : m(mm) {
        const Shape& sh = m.sh;
        conv_bytes = (size_t)(GDN_KW - 1) * sh.conv_dim() * 2;
        layer_bytes = conv_bytes + (size_t)sh.hv * D * D * sizeof(ST);
        seq_bytes = layer_bytes * num_layers;
        const int ns = (int)m.seqs.size();
        nslots = ns + 2;
        state.resize(seq_bytes * nslots);
        std::mt19937 rng(seed);
        for (auto& c : state) c = (unsigned char)(rng() | 0x41);  // garbage: must never be read at position 0
        // Reversed (a permutation of 1..ns: distinct for any ns, never 0 or ns+1). It was
        // (3i + 1) % (ns + 2), which gives two sequences one slot when 3 divides ns + 2 (ns = 4).
        for (int i = 0; i < ns; ++i) slot_of.push_back(ns - i);
        y.resize(ns);
        o.resize(ns);
        nout.resize(ns);
        for (int i = 0; i < ns; ++i) {
            y[i].assign((size_t)m.seqs[i].len * sh.conv_dim(), 0xffff);
            o[i].assign((size_t)m.seqs[i].len * sh.hv * D, 0xffff);
            nout[i].assign((size_t)m.seqs[i].len * sh.hv * D, 0xffff);
        }
    }

    // One step: rows (sequence, first token, count); `reset` gives position 0 to a row's first
    // token whatever its true position (the negative control).
    struct Row {
        int seq, start, count;
        bool reset = false;
    };
    void step(const std::vector<Row>& rows, Kind kind) {
        const Shape& sh = m.sh;
        const int C = sh.conv_dim(), ld_x = C + 8, ld_y = C + 16, ld_ab = 2 * sh.hv + 2, ld_o = sh.hv * D + 8;
        std::vector<int> qs{0}, pos, slots;
        for (const Row& r : rows) {
            for (int i = 0; i < r.count; ++i) pos.push_back(r.reset && i == 0 ? 0 : r.start + i);
            qs.push_back(qs.back() + r.count);
            slots.push_back(slot_of[r.seq]);
        }
        // a padded row (no tokens, slot -1) and two padded tokens past query_start[seqs]
        qs.push_back(qs.back());
        slots.push_back(-1);
        const int seqs = (int)slots.size(), real = qs.back(), tokens = real + 2;
        pos.resize(tokens, 0);
        std::vector<uint16_t> x((size_t)tokens * ld_x, bfbits(7.f)), ab((size_t)tokens * ld_ab, bfbits(0.5f));
        int t = 0;
        for (const Row& r : rows)
            for (int i = 0; i < r.count; ++i, ++t) {
                const Seq& s = m.seqs[r.seq];
                std::memcpy(&x[(size_t)t * ld_x], &s.x[(size_t)(r.start + i) * C], (size_t)C * 2);
                std::memcpy(&ab[(size_t)t * ld_ab], &s.ab[(size_t)(r.start + i) * 2 * sh.hv], (size_t)2 * sh.hv * 2);
            }
        std::vector<uint16_t> yb((size_t)tokens * ld_y, 0x7fc1), ob((size_t)tokens * ld_o, 0x7fc1), nb = ob;
        bf16* Y = reinterpret_cast<bf16*>(yb.data());
        const bf16* X = reinterpret_cast<const bf16*>(x.data());
        const bf16* W = reinterpret_cast<const bf16*>(m.w.data());
        const bf16* Bp = reinterpret_cast<const bf16*>(ab.data());
        const bf16* Ap = Bp + sh.hv;
        bf16* O = reinterpret_cast<bf16*>(ob.data());
        unsigned char* st = state.data();
        const int L = layer, NL = num_layers, hk = sh.hk, hv = sh.hv;
        const unsigned cx = (unsigned)((C + 8 * GDN_CONV_THREADS - 1) / (8 * GDN_CONV_THREADS));
        const unsigned sx = (unsigned)((C + 2 * GDN_CONV_THREADS - 1) / (2 * GDN_CONV_THREADS));
        emu_launch(uint3_{cx, (unsigned)((tokens + GDN_CONV_TOKENS - 1) / GDN_CONV_TOKENS), 1}, GDN_CONV_THREADS, [&] {
            if (use_entries) {
                if constexpr (std::is_same_v<ST, float>)
                    gdn_conv_f32(Y, X, W, st, qs.data(), pos.data(), slots.data(), seqs, tokens, ld_x, ld_y, hk, hv, L, NL);
                else
                    gdn_conv_bf16(Y, X, W, st, qs.data(), pos.data(), slots.data(), seqs, tokens, ld_x, ld_y, hk, hv, L, NL);
            } else {
                gdn::conv_impl<D, ST>(Y, X, W, st, qs.data(), pos.data(), slots.data(), seqs, tokens, ld_x, ld_y, hk, hv, L, NL);
            }
        });
        emu_launch(uint3_{sx, (unsigned)seqs, 1}, GDN_CONV_THREADS, [&] {
            if (use_entries) {
                if constexpr (std::is_same_v<ST, float>)
                    gdn_conv_state_f32(X, st, qs.data(), pos.data(), slots.data(), seqs, ld_x, hk, hv, L, NL);
                else
                    gdn_conv_state_bf16(X, st, qs.data(), pos.data(), slots.data(), seqs, ld_x, hk, hv, L, NL);
            } else {
                gdn::conv_state_impl<D, ST>(X, st, qs.data(), pos.data(), slots.data(), seqs, ld_x, hk, hv, L, NL);
            }
        });
        constexpr int BV = D >= 128 ? GDN_BV : D / 2;
        if (kind == CHUNK) {
            emu_launch(uint3_{(unsigned)seqs, (unsigned)hv, (unsigned)(D / BV)}, GDN_CHUNK_THREADS, [&] {
                if (use_entries) {
                    if constexpr (std::is_same_v<ST, float>)
                        gdn_chunk_f32(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(), slots.data(),
                                      seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                    else
                        gdn_chunk_bf16(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(), slots.data(),
                                       seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                } else {
                    gdn::chunk_impl<D, BV, ST>(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(),
                                               slots.data(), seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                }
            });
        } else {
            emu_launch(uint3_{(unsigned)seqs, (unsigned)hv, 2}, D, [&] {
                if (use_entries) {
                    if constexpr (std::is_same_v<ST, float>)
                        gdn_recurrent_f32(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(),
                                          slots.data(), seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                    else
                        gdn_recurrent_bf16(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(),
                                           slots.data(), seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                } else {
                    gdn::recurrent_impl<D, ST>(O, Y, Bp, Ap, m.A_log.data(), m.dt_bias.data(), st, qs.data(), pos.data(),
                                               slots.data(), seqs, ld_y, ld_ab, ld_o, hk, hv, L, NL);
                }
            });
        }
        // gated norm with z = the conv input's first hv*D channels (any bf16 values will do)
        bf16* N = reinterpret_cast<bf16*>(nb.data());
        emu_launch(uint3_{(unsigned)tokens, (unsigned)((hv + 7) / 8), 1}, GDN_NORM_THREADS, [&] {
            if constexpr (D == 128)
                gdn_norm_gated(N, O, X, reinterpret_cast<const bf16*>(m.nw.data()), tokens, hv, ld_o, ld_x, ld_o, 1e-6f);
            else
                gdn::norm_gated_impl<D>(N, O, X, reinterpret_cast<const bf16*>(m.nw.data()), tokens, hv, ld_o, ld_x, ld_o, 1e-6f);
        });
        // padded tokens: y zeros; o / norm untouched there (checked by the caller through `pad_ok`)
        for (int tt = real; tt < tokens; ++tt) {
            for (int c = 0; c < C; ++c) pad_ok &= yb[(size_t)tt * ld_y + c] == 0;
            for (int c = 0; c < hv * D; ++c) pad_ok &= ob[(size_t)tt * ld_o + c] == 0x7fc1;
        }
        t = 0;
        for (const Row& r : rows)
            for (int i = 0; i < r.count; ++i, ++t) {
                std::memcpy(&y[r.seq][(size_t)(r.start + i) * C], &yb[(size_t)t * ld_y], (size_t)C * 2);
                std::memcpy(&o[r.seq][(size_t)(r.start + i) * hv * D], &ob[(size_t)t * ld_o], (size_t)hv * D * 2);
                std::memcpy(&nout[r.seq][(size_t)(r.start + i) * hv * D], &nb[(size_t)t * ld_o], (size_t)hv * D * 2);
                for (int c = hv * D; c < ld_o; ++c) pad_ok &= ob[(size_t)t * ld_o + c] == 0x7fc1;
            }
    }
    bool pad_ok = true;

    double rec_state(int seq, int h, int dk, int dv) const {
        const unsigned char* base = state.data() + (size_t)slot_of[seq] * seq_bytes + (size_t)layer * layer_bytes + conv_bytes;
        const ST* p = reinterpret_cast<const ST*>(base) + ((size_t)h * D + dk) * D + dv;
        if constexpr (std::is_same_v<ST, float>) return *p;
        else return bfval(reinterpret_cast<const uint16_t*>(p)[0]);
    }
    uint16_t conv_state(int seq, int j, int c) const {
        const unsigned char* base = state.data() + (size_t)slot_of[seq] * seq_bytes + (size_t)layer * layer_bytes;
        return reinterpret_cast<const uint16_t*>(base)[(size_t)j * m.sh.conv_dim() + c];
    }
};

// Schedules: each sequence's prefill cut into `pieces` (cycled), several sequences per step,
// then `decode` one-token steps for all of them at once.
template <int D, class ST>
void run_schedule(Runner<D, ST>& r, const std::vector<int>& prefill_lens, const std::vector<int>& pieces, Kind pre,
                  Kind dec, int reset_seq = -1) {
    const int ns = (int)prefill_lens.size();
    std::vector<int> done(ns, 0);
    int pi = 0;
    bool any = true;
    while (any) {
        any = false;
        std::vector<typename Runner<D, ST>::Row> rows;
        for (int s = 0; s < ns; ++s) {
            if (done[s] >= prefill_lens[s]) continue;
            const int n = std::min(pieces[pi++ % pieces.size()], prefill_lens[s] - done[s]);
            typename Runner<D, ST>::Row row{s, done[s], n};
            row.reset = s == reset_seq && done[s] > 0;
            rows.push_back(row);
            done[s] += n;
            any = true;
        }
        if (any) r.step(rows, pre);
    }
    int more = 1;
    while (more) {
        more = 0;
        std::vector<typename Runner<D, ST>::Row> rows;
        for (int s = 0; s < ns; ++s)
            if (done[s] < r.m.seqs[s].len) {
                rows.push_back({s, done[s], 1});
                done[s]++;
                more = 1;
            }
        if (more) r.step(rows, dec);
    }
}

struct Err {
    double worst = 0;  // max over elements of |k - r| / (rel |r| + abs_scale)
    bool nan = false;
};
// |k - r| <= rel * |r| + atol_frac * max|r|, reported as the worst ratio (pass: <= 1).
Err compare(const std::vector<double>& k, const std::vector<double>& r, double rel, double atol_frac) {
    double mx = 0;
    for (double v : r) mx = std::max(mx, std::fabs(v));
    Err e;
    for (size_t i = 0; i < k.size(); ++i) {
        if (!std::isfinite(k[i])) {
            e.nan = true;
            continue;
        }
        const double tol = rel * std::fabs(r[i]) + atol_frac * mx + 1e-30;
        e.worst = std::max(e.worst, std::fabs(k[i] - r[i]) / tol);
    }
    return e;
}
std::vector<double> as_double(const std::vector<uint16_t>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = bfval(v[i]);
    return d;
}
std::string fmt(const Err& e) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "worst %.3f of tol%s", e.worst, e.nan ? ", NaN" : "");
    return buf;
}

// All checks of one schedule against the fp64 references; returns whether everything passed.
template <int D, class ST>
bool check(const Runner<D, ST>& r, const std::string& tag, bool print, double o_rel, double o_abs, double s_rel, double s_abs) {
    const Model& m = r.m;
    const Shape& sh = m.sh;
    const int C = sh.conv_dim();
    bool all = r.pad_ok;
    Err ey, eo, es;
    bool conv_state_exact = true;
    for (int s = 0; s < (int)m.seqs.size(); ++s) {
        const auto yr = ref_conv(m, s);
        const Err e = compare(as_double(r.y[s]), yr, 1.0 / 128, 0);
        ey.worst = std::max(ey.worst, e.worst);
        ey.nan |= e.nan;
        std::vector<double> o_ref, S_ref;
        ref_delta(m, s, r.y[s], o_ref, S_ref);
        const Err e2 = compare(as_double(r.o[s]), o_ref, o_rel, o_abs);
        eo.worst = std::max(eo.worst, e2.worst);
        eo.nan |= e2.nan;
        std::vector<double> Sk(S_ref.size());
        for (int h = 0; h < sh.hv; ++h)
            for (int dk = 0; dk < D; ++dk)
                for (int dv = 0; dv < D; ++dv) Sk[((size_t)h * D + dk) * D + dv] = r.rec_state(s, h, dk, dv);
        const Err e3 = compare(Sk, S_ref, s_rel, s_abs);
        es.worst = std::max(es.worst, e3.worst);
        es.nan |= e3.nan;
        const int len = m.seqs[s].len;
        for (int j = 0; j < GDN_KW - 1; ++j)
            for (int c = 0; c < C; ++c) {
                const int idx = len - (GDN_KW - 1) + j;
                const uint16_t want = idx >= 0 ? m.seqs[s].x[(size_t)idx * C + c] : 0;
                conv_state_exact &= r.conv_state(s, j, c) == want;
            }
    }
    const bool oky = ey.worst <= 1 && !ey.nan, oko = eo.worst <= 1 && !eo.nan, oks = es.worst <= 1 && !es.nan;
    all = all && oky && oko && oks && conv_state_exact;
    if (print) {
        report(oky, tag + ": conv output vs fp64 within one bf16 unit (" + fmt(ey) + ")");
        report(conv_state_exact, tag + ": conv state = the last KW-1 inputs, exactly");
        report(oko, tag + ": delta-rule output vs fp64 recurrence (" + fmt(eo) + ")");
        report(oks, tag + ": final recurrent state vs fp64 (" + fmt(es) + ")");
        report(r.pad_ok, tag + ": padded tokens: y zeros, o untouched; o's columns past Hv*D untouched");
    }
    return all;
}

template <int D, class ST>
void suite(Shape sh, const std::vector<int>& lens, const std::vector<int>& prefill, const std::vector<int>& pieces,
           const std::string& name, bool entries, double o_rel, double o_abs, double s_rel, double s_abs) {
    const Model m = make_model(sh, lens, 1234u + (unsigned)D);
    Runner<D, ST> a(m, 5), b(m, 6), c(m, 7);
    a.use_entries = b.use_entries = c.use_entries = entries;
    run_schedule(a, prefill, pieces, CHUNK, RECURRENT);
    run_schedule(b, prefill, pieces, RECURRENT, RECURRENT);
    run_schedule(c, prefill, pieces, CHUNK, CHUNK);
    check(a, name + " chunked prefill + recurrent decode", true, o_rel, o_abs, s_rel, s_abs);
    check(b, name + " all recurrent", true, o_rel, o_abs, s_rel, s_abs);
    check(c, name + " all chunked", true, o_rel, o_abs, s_rel, s_abs);
    // conv continuation: the same y bit for bit however the sequence was cut (a: pieces; d: one
    // whole row per sequence in one step)
    Runner<D, ST> d(m, 8);
    d.use_entries = entries;
    std::vector<int> whole = prefill;
    run_schedule(d, whole, {1 << 30}, CHUNK, RECURRENT);
    bool same_y = true;
    for (size_t s = 0; s < lens.size(); ++s) same_y &= a.y[s] == d.y[s] && a.y[s] == b.y[s] && a.y[s] == c.y[s];
    report(same_y, name + ": conv output bit-identical for a sequence cut into chunks across steps and in one row");
    // prefill-then-decode vs all-recurrent: states and outputs against each other
    std::vector<double> sa, sb, oa, ob;
    for (size_t s = 0; s < lens.size(); ++s) {
        for (int h = 0; h < sh.hv; ++h)
            for (int dk = 0; dk < D; ++dk)
                for (int dv = 0; dv < D; ++dv) {
                    sa.push_back(a.rec_state((int)s, h, dk, dv));
                    sb.push_back(b.rec_state((int)s, h, dk, dv));
                }
        const auto x = as_double(a.o[s]), y = as_double(b.o[s]);
        oa.insert(oa.end(), x.begin(), x.end());
        ob.insert(ob.end(), y.begin(), y.end());
    }
    const Err es = compare(sa, sb, 2 * s_rel, 2 * s_abs), eo = compare(oa, ob, 2 * o_rel, 2 * o_abs);
    report(es.worst <= 1 && !es.nan, name + ": states after chunked prefill + decode = all-recurrent states (" + fmt(es) + ")");
    report(eo.worst <= 1 && !eo.nan, name + ": outputs chunked prefill + decode = all-recurrent outputs (" + fmt(eo) + ")");
    // the other layer of every used slot and the unused slots are untouched
    bool untouched = true;
    {
        Runner<D, ST> fresh(m, 5);  // same garbage as `a`
        std::vector<bool> used(a.nslots, false);
        for (int s : a.slot_of) used[s] = true;
        for (int sl = 0; sl < a.nslots; ++sl)
            for (size_t i = 0; i < a.seq_bytes; ++i) {
                const bool in_layer = i >= a.layer_bytes * a.layer && i < a.layer_bytes * (a.layer + 1);
                if (!used[sl] || !in_layer) untouched &= a.state[(size_t)sl * a.seq_bytes + i] == fresh.state[(size_t)sl * a.seq_bytes + i];
            }
    }
    report(untouched, name + ": other layers of the slots and unused slots untouched");
    // gated norm vs transformers' order of roundings, computed in fp32 on the host (z = the conv
    // input's first channels): bit-identical but for the sum of squares' order (an intermediate
    // bf16 rounding may flip), so: >= 99% identical, none more than 2 bf16 units apart
    {
        long same = 0, total = 0;
        int worst_units = 0;
        bool nan = false;
        for (size_t s = 0; s < lens.size(); ++s) {
            const int len = m.seqs[s].len, C = sh.conv_dim();
            for (int t = 0; t < len; ++t)
                for (int h = 0; h < sh.hv; ++h) {
                    double ss = 0;
                    for (int e = 0; e < D; ++e) {
                        const double v = bfval(a.o[s][((size_t)t * sh.hv + h) * D + e]);
                        ss += v * v;
                    }
                    const float rs = 1.f / std::sqrt((float)ss * (1.f / (float)D) + 1e-6f);
                    for (int e = 0; e < D; ++e) {
                        const float v = bfval(a.o[s][((size_t)t * sh.hv + h) * D + e]);
                        const float z = bfval(m.seqs[s].x[(size_t)t * C + h * D + e]);
                        const float hn = rbf(bfval(m.nw[e]) * rbf(v * rs));
                        const uint16_t want = bfbits(hn * (z / (1.f + std::exp(-z))));
                        const uint16_t got = a.nout[s][((size_t)t * sh.hv + h) * D + e];
                        nan |= !std::isfinite(bfval(got));
                        same += got == want;
                        ++total;
                        // units apart (same sign: the bit patterns are ordered)
                        const int units = (got ^ want) & 0x8000 ? 99 : std::abs((int)got - (int)want);
                        if (!(bfval(got) == 0 && bfval(want) == 0)) worst_units = std::max(worst_units, units);
                    }
                }
        }
        char buf[160];
        std::snprintf(buf, sizeof buf, ": gdn_norm_gated vs transformers' rounding order: %.2f%% bit-identical, worst %d bf16 units",
                      100.0 * same / std::max(1L, total), worst_units);
        report(!nan && same >= 0.99 * total && worst_units <= 2, name + buf);
    }
    // negative controls: the same checks must fail for a mid-sequence reset and for a stale slot
    {
        Runner<D, ST> e(m, 9);
        e.use_entries = entries;
        run_schedule(e, prefill, pieces, CHUNK, RECURRENT, (int)prefill.size() - 1);
        report(!check(e, name + " (reset)", false, o_rel, o_abs, s_rel, s_abs),
               name + ": negative control: a state reset mid-sequence is caught");
        Runner<D, ST> f(m, 10);
        f.use_entries = entries;
        // two sequences' slots swapped after the run: each state is checked against the other's
        run_schedule(f, prefill, pieces, CHUNK, CHUNK);
        std::swap(f.slot_of[0], f.slot_of[1]);
        report(!check(f, name + " (slots swapped)", false, o_rel, o_abs, s_rel, s_abs),
               name + ": negative control: states read from the wrong slots are caught");
    }
}


// ------------------------------------------------------------------ invariance across cuts
// docs/batch-invariance.md: a batch-invariant pack of the hybrids runs gdn_conv_* +
// gdn_conv_state_* and gdn_recurrent_f32 at EVERY step (prefill chunks too), so a sequence's bits
// must not depend on how its prompt is cut into steps or on what else is in the step. The same
// sequences (150, 40, 77, 9 tokens) run through conv + conv state + recurrent rule + gated norm
// (the extern "C" entries, D = 128, Hk 2, Hv 4) under several schedules: the prompt as one step,
// two steps cut at 1 / 16 / 64 / 100, 150 one-token steps, beside other sequences (not first in
// the step, so its tokens sit elsewhere in gdn_conv's 16-token tiles), its last rows as one-token
// rows beside other sequences' prefill chunks, odd pieces. Every token's conv output, rule
// output and norm output and the final conv state and recurrent state bytes must be bit-identical
// to the one-step run. Negative control: the bf16 state (gdn_recurrent_bf16: rounded to bf16 at
// the end of each step) must differ between cuttings. Information only: gdn_chunk_f32 vs
// gdn_recurrent_f32, and gdn_chunk_f32 across cuts.
using InvRow = Runner<128, float>::Row;
using InvSched = std::vector<std::vector<InvRow>>;

struct InvResult {
    std::vector<std::vector<uint16_t>> y, o, nout;    // per sequence, every token
    std::vector<std::vector<unsigned char>> conv, rec;  // per sequence: the layer's final state bytes
    std::vector<bool> complete;                        // the schedule ran the whole sequence
};

template <class ST>
InvResult inv_run(const Model& m, const InvSched& sched, Kind kind) {
    Runner<128, ST> r(m, 5);
    r.use_entries = true;
    const int ns = (int)m.seqs.size();
    // distinct slots, permuted (Runner's (3i + 1) mod (ns + 2) repeats slots at ns = 4)
    for (int i = 0; i < ns; ++i) r.slot_of[i] = (ns - i) % r.nslots;
    for (int i = 0; i < ns; ++i)
        for (int j = 0; j < i; ++j)
            if (r.slot_of[i] == r.slot_of[j]) std::printf("    (harness error: two sequences share a slot)\n");
    std::vector<int> done(ns, 0);
    bool order_ok = true;
    for (const auto& step : sched) {
        std::vector<typename Runner<128, ST>::Row> rows;
        for (const InvRow& x : step) {
            order_ok &= x.start == done[x.seq];
            done[x.seq] += x.count;
            rows.push_back({x.seq, x.start, x.count});
        }
        r.step(rows, kind);
    }
    if (!order_ok) std::printf("    (schedule error: a piece does not continue its sequence)\n");
    InvResult res;
    res.y = r.y;
    res.o = r.o;
    res.nout = r.nout;
    for (int s = 0; s < ns; ++s) {
        res.complete.push_back(order_ok && done[s] == m.seqs[s].len);
        const unsigned char* base = r.state.data() + (size_t)r.slot_of[s] * r.seq_bytes + (size_t)r.layer * r.layer_bytes;
        res.conv.emplace_back(base, base + r.conv_bytes);
        res.rec.emplace_back(base + r.conv_bytes, base + r.layer_bytes);
    }
    return res;
}

// Differences between two runs for the sequences both completed: elements (16-bit for bf16 data,
// ST-sized for the recurrent state) and bits.
struct InvDiff {
    long y = 0, o = 0, nout = 0, conv = 0, rec = 0, rec_bits = 0, o_bits = 0, compared_seqs = 0;
    long rec_elems = 0, o_elems = 0;
    bool all_same() const { return !y && !o && !nout && !conv && !rec; }
};
template <class ST>
InvDiff inv_diff(const InvResult& a, const InvResult& b) {
    InvDiff d;
    auto cnt16 = [](const std::vector<uint16_t>& x, const std::vector<uint16_t>& y, long* bits) {
        long n = 0;
        for (size_t i = 0; i < x.size(); ++i)
            if (x[i] != y[i]) {
                ++n;
                if (bits) *bits += __builtin_popcount((unsigned)(x[i] ^ y[i]));
            }
        return n;
    };
    for (size_t s = 0; s < a.y.size(); ++s) {
        if (!a.complete[s] || !b.complete[s]) continue;
        ++d.compared_seqs;
        d.y += cnt16(a.y[s], b.y[s], nullptr);
        d.o += cnt16(a.o[s], b.o[s], &d.o_bits);
        d.o_elems += (long)a.o[s].size();
        d.nout += cnt16(a.nout[s], b.nout[s], nullptr);
        for (size_t i = 0; i < a.conv[s].size(); ++i) d.conv += a.conv[s][i] != b.conv[s][i];
        const size_t n = a.rec[s].size() / sizeof(ST);
        d.rec_elems += (long)n;
        for (size_t i = 0; i < n; ++i) {
            uint32_t u = 0, v = 0;
            std::memcpy(&u, a.rec[s].data() + i * sizeof(ST), sizeof(ST));
            std::memcpy(&v, b.rec[s].data() + i * sizeof(ST), sizeof(ST));
            if (u != v) {
                ++d.rec;
                d.rec_bits += __builtin_popcount(u ^ v);
            }
        }
    }
    return d;
}
std::string inv_fmt(const InvDiff& d) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%ld sequences compared; differing: conv out %ld, rule out %ld of %ld (%ld bits), norm out %ld, conv state "
                  "bytes %ld, recurrent state %ld of %ld elements (%ld bits)",
                  d.compared_seqs, d.y, d.o, d.o_elems, d.o_bits, d.nout, d.conv, d.rec, d.rec_elems, d.rec_bits);
    return buf;
}

void cut_invariance() {
    const Shape sh{2, 4, 128};
    const int L0 = 150;
    const Model m = make_model(sh, {L0, 40, 77, 9}, 4242u);
    std::vector<std::pair<std::string, InvSched>> sc;
    sc.push_back({"one step", {{{0, 0, L0}}}});
    for (int c : {1, 16, 64, 100})
        sc.push_back({"cut at " + std::to_string(c), {{{0, 0, c}}, {{0, c, L0 - c}}}});
    {
        InvSched s;
        for (int p = 0; p < L0; ++p) s.push_back({{0, p, 1}});
        sc.push_back({"150 one-token steps", s});
    }
    sc.push_back({"beside other sequences (3rd of 3 rows, then 3rd of 3)",
                  {{{1, 0, 40}, {2, 0, 30}, {0, 0, 100}}, {{2, 30, 47}, {3, 0, 9}, {0, 100, L0 - 100}}}});
    {
        InvSched s = {{{1, 0, 21}, {0, 0, L0 - 13}}};
        for (int k = 0; k < 13; ++k) {
            std::vector<InvRow> st = {{2, 5 * k, 5}};
            if (k < 9) st.insert(st.begin() + (k % 2), InvRow{3, k, 1});
            st.insert(st.begin() + (k % 3 == 0 ? 0 : 1), InvRow{0, L0 - 13 + k, 1});
            if (k == 0) st.push_back({1, 21, 19});
            s.push_back(st);
        }
        sc.push_back({"last 13 rows as one-token rows beside prefill chunks", s});
    }
    {
        InvSched s;
        int p = 0, k = 0;
        for (int n : {7, 33, 1, 1, 50, 58}) {
            std::vector<InvRow> st;
            if (k == 1) st.push_back({1, 0, 40});
            if (k == 2) st.push_back({3, 0, 9});
            st.push_back({0, p, n});
            if (k == 3) st.push_back({2, 0, 77});
            s.push_back(st);
            p += n;
            ++k;
        }
        sc.push_back({"pieces 7 33 1 1 50 58 beside other rows", s});
    }
    // fp32 state, gdn_recurrent_f32 at every step: bit-identical to the one-step run
    std::vector<InvResult> f32;
    for (auto& [name, s] : sc) f32.push_back(inv_run<float>(m, s, RECURRENT));
    for (size_t i = 1; i < sc.size(); ++i) {
        const InvDiff d = inv_diff<float>(f32[0], f32[i]);
        report(d.all_same() && d.compared_seqs > 0,
               "invariance across cuts, fp32 state, gdn_recurrent_f32 at every step: " + sc[i].first +
                   " vs one step: every token's conv / rule / norm output and the final conv and recurrent state bit-identical (" +
                   inv_fmt(d) + ")");
    }
    // the neighbours too: every schedule that completed them against the first that did
    {
        InvDiff tot;
        for (size_t i = 1; i < sc.size(); ++i)
            for (size_t j = 0; j < i; ++j) {
                InvResult a = f32[j], b = f32[i];
                a.complete[0] = false;  // sequence 0 is checked above
                const InvDiff d = inv_diff<float>(a, b);
                tot.compared_seqs += d.compared_seqs;
                tot.y += d.y, tot.o += d.o, tot.nout += d.nout, tot.conv += d.conv, tot.rec += d.rec;
                tot.o_elems += d.o_elems, tot.rec_elems += d.rec_elems, tot.o_bits += d.o_bits, tot.rec_bits += d.rec_bits;
            }
        report(tot.all_same() && tot.compared_seqs > 0,
               "invariance across cuts, fp32 state: the neighbour sequences (40, 77, 9 tokens) across every pair of schedules "
               "that completed them (" + inv_fmt(tot) + ")");
    }
    // negative control: the bf16 state is rounded at the end of every step, so cuts change bits
    {
        const std::vector<size_t> which = {0, 2, 3, 5};  // one step, cut at 16, cut at 64, one-token steps
        std::vector<InvResult> b16;
        for (size_t i : which) b16.push_back(inv_run<bf16>(m, sc[i].second, RECURRENT));
        bool differs = true;
        std::string msg;
        for (size_t k = 1; k < which.size(); ++k) {
            const InvDiff d = inv_diff<bf16>(b16[0], b16[k]);
            differs &= d.rec > 0;
            msg += "\n      " + sc[which[k]].first + " vs one step: " + inv_fmt(d);
        }
        report(differs, "negative control: bf16 state (gdn_recurrent_bf16) differs between cuttings (recurrent state in each)" + msg);
    }
    // information only: the chunked kernel vs the recurrent one, and the chunked kernel across cuts
    {
        const InvResult c_one = inv_run<float>(m, sc[0].second, CHUNK);
        const InvResult c_64 = inv_run<float>(m, sc[3].second, CHUNK);
        const InvResult c_100 = inv_run<float>(m, sc[4].second, CHUNK);
        std::printf("INFO gdn_chunk_f32 vs gdn_recurrent_f32, one step: %s\n", inv_fmt(inv_diff<float>(f32[0], c_one)).c_str());
        std::printf("INFO gdn_chunk_f32 cut at 64 vs gdn_chunk_f32 one step: %s\n", inv_fmt(inv_diff<float>(c_one, c_64)).c_str());
        std::printf("INFO gdn_chunk_f32 cut at 100 vs gdn_chunk_f32 one step: %s\n", inv_fmt(inv_diff<float>(c_one, c_100)).c_str());
    }
}
}  // namespace

int main() {
    static_assert(sizeof(gdn::ChunkSmem<128, GDN_BV>) == 165120, "gdn_chunk_* dynamic shared memory (KERNELS.md)");
    // D = 64, BV = 32 (two column slices per CTA), 2 k-heads, 4 v-heads (GQA 2): prompt lengths 1,
    // 63, 64, 65, 300 (+ decode), cut into pieces of several sizes
    {
        const Shape sh{2, 4, 64};
        const std::vector<int> prefill{1, 63, 64, 65, 300};
        std::vector<int> lens;
        for (int p : prefill) lens.push_back(p + 5);
        suite<64, float>(sh, lens, prefill, {64, 1, 63, 65, 100, 7}, "D64 f32", false, 1.0 / 64, 2e-3, 1e-4, 1e-5);
        suite<64, bf16>(sh, lens, prefill, {64, 1, 63, 65, 100, 7}, "D64 bf16-state", false, 1.0 / 16, 2e-2, 1.0 / 64, 1e-2);
    }
    // D = 128 through the extern "C" entries (1 k-head, 2 v-heads: Qwen3-Next's grouping)
    {
        const Shape sh{1, 2, 128};
        const std::vector<int> prefill{1, 65, 130};
        std::vector<int> lens;
        for (int p : prefill) lens.push_back(p + 3);
        suite<128, float>(sh, lens, prefill, {64, 3, 100}, "D128 f32 entries", true, 1.0 / 64, 2e-3, 1e-4, 1e-5);
        suite<128, bf16>(sh, lens, prefill, {64, 3, 100}, "D128 bf16-state entries", true, 1.0 / 16, 2e-2, 1.0 / 64, 1e-2);
    }
#if !GDN_TC  // the recurrent and conv kernels do not depend on GDN_TC: run once, in the pack's build
    cut_invariance();
#endif
    std::printf("gdn: %d passed, %d failed\n", passes, fails);
    return fails ? 1 : 0;
}
