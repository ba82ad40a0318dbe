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
