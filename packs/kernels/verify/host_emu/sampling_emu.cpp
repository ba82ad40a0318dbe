// sampling.cu's `sample_masked` on the CPU (emu.h): a constrained row never gets a token its
// token mask forbids, greedy or sampled (temperature, top-k, top-p), and picks exactly what
// `sample` picks when the forbidden logits are -inf (greedy: always; sampled: whenever top-k
// keeps no more tokens than the mask allows — the same keys, weights and draws); a free row
// (mask_rows = -1) is bit-identical to `sample`. Masks from one allowed token to all of them,
// NaN and -inf logits among the allowed, odd vocabularies (the scalar argmax path), tokens past
// the mask's words.
//
//   bash packs/kernels/verify/host_emu/run.sh
#include "sampling_emu.h"
#include "../../sampling.cu"

#include <cstdio>
#include <random>
#include <vector>

namespace {

std::mt19937 rng(2027);

struct Case {
    int V;
    float T;
    int k;
    float p;
};

int fails = 0, checks = 0;

void check(bool ok, const char* what, int row, const Case& c) {
    ++checks;
    if (!ok) {
        ++fails;
        std::printf("FAIL %s: row %d V=%d T=%g k=%d p=%g\n", what, row, c.V, c.T, c.k, c.p);
    }
}

void run_case(const Case& c) {
    const int S = 6, V = c.V, W = (V + 31) / 32 + 1;  // one spare word: tokens past V never sampled
    std::vector<float> logits((size_t)S * V), masked((size_t)S * V);
    std::normal_distribution<float> nd(0.f, 3.f);
    for (auto& x : logits) x = nd(rng);
    std::vector<unsigned> mask((size_t)S * W, 0);
    std::vector<int> rows(S);
    std::vector<int> allowed(S, 0);
    for (int s = 0; s < S; ++s) {
        rows[s] = s == S - 1 ? -1 : S - 2 - s;  // reversed order: row s uses mask row S-2-s; the last is free
        const int r = rows[s];
        const int density = s % 4;  // one token, three, half, all
        for (int t = 0; t < V; ++t) {
            bool on = density == 0 ? t == (int)(rng() % V) && allowed[s] == 0
                    : density == 1 ? rng() % (V / 3 + 1) == 0 || (allowed[s] < 3 && t >= V - 3)
                    : density == 2 ? rng() % 2 == 0
                                   : true;
            if (r >= 0 && on) {
                mask[(size_t)r * W + t / 32] |= 1u << (t % 32);
                ++allowed[s];
            }
        }
        if (r >= 0 && allowed[s] == 0) {
            mask[(size_t)r * W] |= 1u;
            allowed[s] = 1;
        }
        if (s == 2 && r >= 0) {  // an allowed NaN wins the argmax, an allowed -inf never
            for (int t = 0; t < V; ++t)
                if ((mask[(size_t)r * W + t / 32] >> (t % 32)) & 1u) {
                    logits[(size_t)s * V + t] = c.T == 0.f ? NAN : -INFINITY;
                    break;
                }
        }
    }
    for (int s = 0; s < S; ++s)
        for (int t = 0; t < V; ++t) {
            const int r = rows[s];
            const bool ok = r < 0 || ((mask[(size_t)r * W + t / 32] >> (t % 32)) & 1u);
            masked[(size_t)s * V + t] = ok ? logits[(size_t)s * V + t] : -INFINITY;
        }
    std::vector<float> temp(S, c.T), topp(S, c.p);
    std::vector<int> topk(S, c.k), pos(S);
    std::vector<unsigned long long> seeds(S);
    for (int s = 0; s < S; ++s) pos[s] = 17 + 3 * s, seeds[s] = 0x9e3779b97f4a7c15ull * (s + 1);
    std::vector<int> got(S, -7), ref(S, -7), free_ref(S, -7);
    emu_launch(uint3_{(unsigned)S, 1, 1}, SAMPLE_THREADS, [&] { sample_masked(got.data(), logits.data(), temp.data(), topk.data(), topp.data(), seeds.data(), pos.data(), mask.data(), rows.data(), W, S, V); });
    emu_launch(uint3_{(unsigned)S, 1, 1}, SAMPLE_THREADS, [&] { sample(ref.data(), masked.data(), temp.data(), topk.data(), topp.data(), seeds.data(), pos.data(), S, V); });
    emu_launch(uint3_{(unsigned)S, 1, 1}, SAMPLE_THREADS, [&] { sample(free_ref.data(), logits.data(), temp.data(), topk.data(), topp.data(), seeds.data(), pos.data(), S, V); });
    for (int s = 0; s < S; ++s) {
        const int r = rows[s], t = got[s];
        if (r < 0) {
            check(t == free_ref[s], "a free row equals `sample`", s, c);
            continue;
        }
        const bool ok = t >= 0 && t < V && ((mask[(size_t)r * W + t / 32] >> (t % 32)) & 1u);
        check(ok, "the token is allowed", s, c);
        const bool same_set = c.T == 0.f || c.k == 0 || c.k <= allowed[s];
        if (same_set && !(s == 2 && c.T > 0.f)) check(t == ref[s], "equals `sample` with forbidden logits at -inf", s, c);
    }
}

}  // namespace

int main() {
    const int vocabs[] = {257, 512, 1000};
    const Case shapes[] = {{0, 0.f, 0, 1.f}, {0, 0.7f, 0, 1.f}, {0, 1.0f, 5, 1.f}, {0, 1.3f, 0, 0.8f}, {0, 0.9f, 40, 0.9f}};
    for (int V : vocabs)
        for (Case c : shapes) {
            c.V = V;
            run_case(c);
        }
    std::printf("sampling.cu sample_masked: %d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
