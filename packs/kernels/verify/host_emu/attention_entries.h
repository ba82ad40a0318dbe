// attention.cu's entries (attention_d64 / attention_d128 / attention_d256), declared for the
// emulations that run them from another translation unit (attention_emu.cpp defines them).
// attention_emu.cpp includes this header after attention.cu, so a declaration that no longer
// matches the kernel's parameter list is a compile error there, never a silent ABI mismatch.
#pragma once
#define KERN_EMU_ATT_DECL(NAME)                                                                                     \
    extern "C" void NAME(kern::bf16* out, const kern::bf16* q, const kern::bf16* kv_base, const int* block_tables,  \
                         const int* seq_lens, const int* query_start, int num_seqs, int num_tokens, int max_pages,  \
                         int q_stride, int num_heads, int kv_heads, int layer, int num_layers, int page_tokens,    \
                         float scale, int window)
KERN_EMU_ATT_DECL(attention_d64);
KERN_EMU_ATT_DECL(attention_d128);
KERN_EMU_ATT_DECL(attention_d256);
#undef KERN_EMU_ATT_DECL

// attention_dD for D = 64, 128 or 256 (grid [ceil(tokens / (32 / G)) + seqs, Hkv], block 128, run by
// emu_launch as the manifest launches it).
inline void emu_attention(int D, kern::bf16* out, const kern::bf16* q, const kern::bf16* kv, const int* bt,
                          const int* sl, const int* qs, int num_seqs, int num_tokens, int max_pages, int q_stride,
                          int Hq, int Hkv, int layer, int layers, int pt, float scale, int window,
                          unsigned grid_x = 0) {
    const int G = Hq / Hkv;
    const unsigned gx = grid_x ? grid_x : (unsigned)((num_tokens + 32 / G - 1) / (32 / G) + num_seqs);
    emu_launch(uint3_{gx, (unsigned)Hkv, 1}, 128, [&] {
        if (D == 256)
            attention_d256(out, q, kv, bt, sl, qs, num_seqs, num_tokens, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                           scale, window);
        else if (D == 128)
            attention_d128(out, q, kv, bt, sl, qs, num_seqs, num_tokens, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                           scale, window);
        else
            attention_d64(out, q, kv, bt, sl, qs, num_seqs, num_tokens, max_pages, q_stride, Hq, Hkv, layer, layers, pt,
                          scale, window);
    });
}

// The paged KV pool and the queries of the per-row invariance checks (attention_prefill_emu.cpp,
// attention_decode_emu.cpp): each sequence's pages numbered in order, then shuffled; K and V of
// `layer` (of `layers`) filled for every position, everything else NaN; Q [pos][Hq·D]. Draws from
// `rng` in a fixed order (the shuffle, then per sequence its Q and its K/V).
#include <algorithm>
#include <random>
#include <vector>
struct InvariancePool {
    size_t row, page_elems;
    int max_pages = 0, total_pages = 0, q_stride;
    std::vector<std::vector<int>> pages;
    std::vector<uint16_t> pool;
    std::vector<std::vector<uint16_t>> Q;
    InvariancePool(std::mt19937& rng, std::normal_distribution<float>& nd, const std::vector<int>& lens, int Hq, int Hkv, int D,
                   int layers, int layer, int pt)
        : row((size_t)Hkv * D), page_elems((size_t)pt * layers * 2 * row), q_stride((Hq + 2 * Hkv) * D), pages(lens.size()), Q(lens.size()) {
        const int S = (int)lens.size();
        for (int s = 0; s < S; ++s) {
            const int np = (lens[s] + pt - 1) / pt;
            max_pages = std::max(max_pages, np);
            for (int j = 0; j < np; ++j) pages[s].push_back(total_pages++);
        }
        std::vector<int> perm(total_pages);
        for (int i = 0; i < total_pages; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (auto& ps : pages)
            for (int& p : ps) p = perm[p];
        pool.assign((size_t)total_pages * page_elems, 0x7fc0);  // bf16 NaN
        for (int s = 0; s < S; ++s) {
            Q[s].resize((size_t)lens[s] * Hq * D);
            for (auto& x : Q[s]) x = __float2bfloat16_rn(nd(rng)).x;
            for (int p = 0; p < lens[s]; ++p)
                for (int kv = 0; kv < 2; ++kv)
                    for (size_t e = 0; e < row; ++e)
                        pool[pages[s][p / pt] * page_elems + ((size_t)(layer * 2 + kv) * pt + p % pt) * row + e] = __float2bfloat16_rn(nd(rng)).x;
        }
    }
};
