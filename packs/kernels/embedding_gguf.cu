// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Embedding lookups from a table kept in its GGUF blocks (issue 25): the row of each token id is
// dequantized as kern-weights dequantizes it (gguf_blocks.cuh's deq8: dequant.rs's arithmetic,
// bit for bit), rounded to bf16 — exactly the value a dequantized-to-bf16 pack holds — then
// scaled like rowwise.cu's `embedding` / `embedding_f32` (bf16(row · scale); scale 1 for most
// models, bf16(sqrt(hidden)) for Gemma). So a GGUF-native pack's embedding equals the
// dequantized pack's bit for bit, and the table costs the file's bytes on the GPU.
//
//   embedding_<t>(bf16* out, const uint8_t* W, const int* ids, int n, int hidden, int vocab, float scale)
//   embedding_<t>_f32(float* out, ...)            the fp32 residual stream's
// grid [n], block [128], shared 0. W: [vocab, hidden] in blocks (row = hidden / block_elems
// blocks); hidden a multiple of the block size; ids outside [0, vocab) give a row of zeros.
#include "common.cuh"
#include "gguf_blocks.cuh"

using namespace kern;

namespace {

template <class D, typename OUT>
__device__ __forceinline__ void embed_row(OUT* __restrict__ out, const uint8_t* __restrict__ W,
                                          const int* __restrict__ ids, int n, int hidden, int vocab, float scale) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    const int id = ids[t];
    const bool valid = id >= 0 && id < vocab;
    OUT* o = out + (size_t)t * hidden;
    const uint8_t* row = W + (size_t)(valid ? id : 0) * (size_t)(hidden / D::BE) * D::BB;
    for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
        float v[8];
        if (valid) {
            D::deq8(row + (size_t)(c / D::BE) * D::BB, c % D::BE, v);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            // bf16(deq) as the dequantized pack stores it, then the embedding's scale rounded to
            // bf16 as rowwise.cu's embedding does (rb of a bf16 value is itself for scale 1).
            const float w = valid ? __uint_as_float(kgguf::bf16_bits(v[i]) << 16) : 0.f;
            const float y = valid ? rb(w * scale) : 0.f;
            if constexpr (sizeof(OUT) == 4) {
                o[c + i] = y;
            } else {
                o[c + i] = b(y);
            }
        }
    }
}

}  // namespace

#define KGGUF_EMBED(NAME, D)                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        embedding_##NAME(bf16* __restrict__ out, const unsigned char* __restrict__ W,                      \
                         const int* __restrict__ ids, int n, int hidden, int vocab, float scale) {         \
        embed_row<kgguf::D, bf16>(out, W, ids, n, hidden, vocab, scale);                                   \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                                     \
        embedding_##NAME##_f32(float* __restrict__ out, const unsigned char* __restrict__ W,               \
                               const int* __restrict__ ids, int n, int hidden, int vocab, float scale) {   \
        embed_row<kgguf::D, float>(out, W, ids, n, hidden, vocab, scale);                                  \
    }

KGGUF_EMBED(q4_0, DqQ4_0)
KGGUF_EMBED(q4_1, DqQ4_1)
KGGUF_EMBED(q5_0, DqQ5_0)
KGGUF_EMBED(q5_1, DqQ5_1)
KGGUF_EMBED(q8_0, DqQ8_0)
KGGUF_EMBED(q2_k, DqQ2_K)
KGGUF_EMBED(q3_k, DqQ3_K)
KGGUF_EMBED(q4_k, DqQ4_K)
KGGUF_EMBED(q5_k, DqQ5_K)
KGGUF_EMBED(q6_k, DqQ6_K)
