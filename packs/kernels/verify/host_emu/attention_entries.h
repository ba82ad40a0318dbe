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
// One piece of an invariance schedule's step: rows start .. start+count-1 of sequence seq (its
// keys 0 .. start+count-1).
struct InvariancePiece {
    int seq, start, count;
};

// One step's inputs built from its pieces (InvariancePool::step): block tables, sequence lengths,
// query starts and the qkv rows (q only; k and v come from the pool).
struct InvarianceStep {
    int Sb, T;
    std::vector<int> bt, sl, qs;
    std::vector<uint16_t> qkv;
};

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
    // A step of these pieces, in order; `pad`: one more sequence with no tokens and one more token
    // (the decode kernels' padding); qkv rows not written hold `fill`.
    InvarianceStep step(const std::vector<InvariancePiece>& pieces, int pt, int Hq, int D, bool pad, uint16_t fill) const {
        InvarianceStep st;
        int n = 0;
        for (const auto& pc : pieces) n += pc.count;
        st.Sb = (int)pieces.size() + (pad ? 1 : 0);
        st.T = n + (pad ? 1 : 0);
        st.bt.assign((size_t)st.Sb * max_pages, -1);
        st.qs = {0};
        st.qkv.assign((size_t)st.T * q_stride, fill);
        int t = 0;
        for (size_t i = 0; i < pieces.size(); ++i) {
            const InvariancePiece& pc = pieces[i];
            for (int j = 0; j < (pc.start + pc.count + pt - 1) / pt; ++j) st.bt[i * max_pages + j] = pages[pc.seq][j];
            st.sl.push_back(pc.start + pc.count);
            st.qs.push_back(st.qs.back() + pc.count);
            for (int r = 0; r < pc.count; ++r, ++t)
                std::copy_n(&Q[pc.seq][(size_t)(pc.start + r) * Hq * D], Hq * D, &st.qkv[(size_t)t * q_stride]);
        }
        if (pad) {
            st.qs.push_back(st.qs.back());
            st.sl.push_back(0);
        }
        return st;
    }
};
