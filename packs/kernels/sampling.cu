// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Token selection of the packs: greedy argmax, and seeded temperature / top-k / top-p
// sampling. One CTA of 512 threads per sequence; the logits row is read from global memory
// (L2-resident) in a few passes, never sorted.
//
// Sampling algorithm (per sequence; x = logits / temperature, fp32 division like PyTorch):
//   1. argmax of the logits (torch.argmax semantics: NaN wins, ties -> lowest index); m = x[argmax].
//   2. top-k (0 < k < vocab): the k-th largest x by a 4-pass radix select over order-preserving
//      32-bit keys (256-bin count histograms, warp-aggregated shared atomics). Kept: key >= kth
//      (ties with the k-th value are all kept).
//   3. weights w_i = round(exp(x_i - m) * 2^40) as unsigned 64-bit fixed point (so every sum
//      is exact and independent of summation order: results are deterministic).
//   4. sample by inverse CDF in token order over the kept set: u = Philox4x32-10(key = seed,
//      counter = (position, round, 0, 0)); target = floor(u64 * Z / 2^64).
//   5. top-p (0 < p < 1) by rejection (as FlashInfer does): the drawn token i is accepted if the
//      mass of kept tokens with x_j > x_i is < p * Z_k (Z_k = mass of the top-k set); otherwise
//      every token with x <= x_i is outside the top-p set as well, and the draw is repeated over
//      the tokens with x > x_i (next round). Accepted draws are distributed exactly as the
//      renormalized top-p set. At most 64 rounds, then the argmax (always in the set).
// temperature < 1e-5 (or NaN) -> greedy (the argmax of step 1).
//
// Token mask (`sample_masked`; step ABI `token_mask` + `mask_rows`, docs/step-abi.md): row s with
// mask_rows[s] = r >= 0 may only choose tokens whose bit is set in token_mask[r * mask_words ..]
// (bit t % 32 of word t / 32; tokens past mask_words * 32 never). Every step above runs over the
// allowed tokens only — as if forbidden logits were -inf: the argmax is the best allowed token
// (an allowed NaN still wins), top-k / top-p select among the allowed, the weights of forbidden
// tokens are 0. mask_rows[s] = -1 (a free row, and every padded row) costs one load and runs the
// unmasked code path, so `sample` and `sample_masked` agree bit for bit on free rows. A row whose
// mask allows nothing falls back to token 0 (the engine never sends one).
//
// Built WITHOUT --use_fast_math (expf and the division must be exact library functions).
#include "common.cuh"

using namespace kern;

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_MAX_ROUNDS 64

// ----------------------------------------------------------------------------- token mask
// A row's allowed tokens: `w` null = every token.
struct RowMask {
    const unsigned* w;
    int words;
    __device__ __forceinline__ bool ok(int i) const {
        return w == nullptr || ((i >> 5) < words && ((__ldg(w + (i >> 5)) >> (i & 31)) & 1u));
    }
};

// ----------------------------------------------------------------------------- argmax helpers
static __device__ __forceinline__ bool better(float a, int ia, float b, int ib) {
    const bool an = isnan(a), bn = isnan(b);
    if (an || bn) return (an && bn) ? ia < ib : an;
    return a > b || (a == b && ia < ib);
}

// Block-wide argmax of row[0..V) over the tokens `m` allows; every thread gets the result.
static __device__ int block_argmax(const float* __restrict__ row, int V, float* sv, int* si, RowMask m = RowMask{nullptr, 0}) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    const int tid = threadIdx.x, nt = blockDim.x;
    if ((V & 3) == 0 && ((uintptr_t)row & 15u) == 0) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        for (int c = tid; c < (V >> 2); c += nt) {
            const float4 v = r4[c];
            const int i = c * 4;
            if (m.ok(i) && better(v.x, i, bv, bi)) bv = v.x, bi = i;
            if (m.ok(i + 1) && better(v.y, i + 1, bv, bi)) bv = v.y, bi = i + 1;
            if (m.ok(i + 2) && better(v.z, i + 2, bv, bi)) bv = v.z, bi = i + 2;
            if (m.ok(i + 3) && better(v.w, i + 3, bv, bi)) bv = v.w, bi = i + 3;
        }
    } else {
        for (int i = tid; i < V; i += nt) {
            const float v = row[i];
            if (m.ok(i) && better(v, i, bv, bi)) bv = v, bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int lane = tid & 31, warp = tid >> 5, nw = (nt + 31) >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (bi < 0 || bi >= V) bi = 0;  // V == 0 or an all-padding row: never an out-of-range id
    return bi;
}

// out[s] = argmax(logits[s, :])   (torch.argmax: first index of the maximum, NaN counts as max)
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
argmax(int* __restrict__ out, const float* __restrict__ logits, int seqs, int vocab) {
    KERN_PDL_WAIT();
    __shared__ float sv[32];
    __shared__ int si[32];
    const int s = blockIdx.x;
    if (s >= seqs) return;
    const int r = block_argmax(logits + (size_t)s * vocab, vocab, sv, si);
    if (threadIdx.x == 0) out[s] = r;
}

// ----------------------------------------------------------------------------- RNG
// Philox4x32-10 (Salmon et al. 2011; the Random123 / cuRAND constants).
static __device__ __forceinline__ uint4 philox4x32_10(uint4 ctr, uint2 key) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            key.x += W0;
            key.y += W1;
        }
        const uint32_t hi0 = __umulhi(M0, ctr.x), lo0 = M0 * ctr.x;
        const uint32_t hi1 = __umulhi(M1, ctr.z), lo1 = M1 * ctr.z;
        ctr = make_uint4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    }
    return ctr;
}

// ----------------------------------------------------------------------------- sampling helpers
static __device__ __forceinline__ uint32_t fkey(float x) {  // order-preserving float -> u32
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ unsigned long long fixw(float e) {  // weight in [0,1] -> 2^40 fixed point
    return __float2ull_rn(e * 1099511627776.0f);
}

// Warp 0: hist[256] (counts); find the largest bin b with
// above + sum_{b' >= b} hist[b'] >= target. Returns b; *above_out = above + sum_{b' > b}.
static __device__ int find_bin(const unsigned int* hist, unsigned long long above,
                               unsigned long long target, unsigned long long* above_out) {
    const int lane = threadIdx.x & 31;
    unsigned long long h[8], loc = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        h[k] = hist[lane * 8 + k];
        loc += h[k];
    }
    // suffix sums over lanes: suf = sum of loc over lanes >= lane
    unsigned long long suf = loc;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long v = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += v;
    }
    // S(b) for the lane's bins, from the top one down
    unsigned long long S = above + suf - loc;  // mass above this lane's bins
    int cand = -1;
    unsigned long long cand_above = 0;
#pragma unroll
    for (int k = 7; k >= 0; --k) {
        const unsigned long long above_b = S;  // above + sum_{b' > b}
        S += h[k];
        if (cand < 0 && S >= target) {
            cand = lane * 8 + k;
            cand_above = above_b;
        }
    }
    const unsigned ball = __ballot_sync(0xffffffffu, cand >= 0);
    if (ball == 0) {  // cannot happen when the invariant holds; keep everything matched so far
        *above_out = above;
        return 0;
    }
    const int src = 31 - __clz(ball);  // highest lane with a candidate holds the largest b
    const int b = __shfl_sync(0xffffffffu, cand, src);
    *above_out = __shfl_sync(0xffffffffu, cand_above, src);
    return b;
}

static __device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One sequence's token (a CTA per row); `m` restricts it to the allowed tokens.
static __device__ __forceinline__ void sample_row(int* __restrict__ out, const float* __restrict__ logits, const float* __restrict__ temperature,
                                  const int* __restrict__ top_k, const float* __restrict__ top_p, const unsigned long long* __restrict__ seeds,
                                  const int* __restrict__ rng_pos, int seqs, int vocab, RowMask m) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long wsum[SAMPLE_WARPS];
    __shared__ unsigned long long s_ull[2];
    __shared__ int s_int[2];

    const int s = blockIdx.x;
    if (s >= seqs) return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int V = vocab;
    const float* row = logits + (size_t)s * V;

    const int amax = block_argmax(row, V, sv, si, m);
    const float T = temperature[s];
    if (!(T >= 1e-5f)) {  // greedy (also for NaN / negative temperatures)
        if (tid == 0) out[s] = amax;
        return;
    }
    const float mx = row[amax] / T;
    const int K = top_k[s];
    const float P = top_p[s];

    // ---- top-k threshold (radix select of the K-th largest key)
    uint32_t kth = 0;  // keep key >= kth
    if (K > 0 && K < V) {
        uint32_t prefix = 0, mask = 0;
        unsigned long long above = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += SAMPLE_THREADS) hist[i] = 0;
            __syncthreads();
            for (int base = 0; base < V; base += SAMPLE_THREADS) {  // warp-uniform trip count
                const int i = base + tid;
                int bin = 256;
                if (i < V && m.ok(i)) {
                    const uint32_t key = fkey(row[i] / T);
                    if ((key & mask) == prefix) bin = (key >> shift) & 255;
                }
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned int)__popc(peers));
            }
            __syncthreads();
            if (warp == 0) {
                unsigned long long na;
                const int bsel = find_bin(hist, above, (unsigned long long)K, &na);
                if (lane == 0) {
                    s_int[0] = bsel;
                    s_ull[0] = na;
                }
            }
            __syncthreads();
            prefix |= (uint32_t)s_int[0] << shift;
            mask |= 0xffu << shift;
            above = s_ull[0];
        }
        kth = prefix;
    }

    const bool use_p = P > 0.f && P < 1.f;
    const unsigned long long seed = seeds[s];
    const uint2 key2 = make_uint2((uint32_t)seed, (uint32_t)(seed >> 32));
    const uint32_t pos = (uint32_t)rng_pos[s];
    const int seg = (V + SAMPLE_WARPS - 1) / SAMPLE_WARPS;  // contiguous token range of each warp
    const int s0 = min(V, warp * seg), s1 = min(V, s0 + seg);

    uint32_t lower = kth;  // this round samples among key >= lower
    double p_target = 0.0;
    int result = amax;
    for (int round = 0; round < SAMPLE_MAX_ROUNDS; ++round) {
        // ---- per-warp masses of the allowed set, then the total
        unsigned long long acc = 0;
        for (int i = s0 + lane; i < s1; i += 32) {
            const float x = row[i] / T;
            if (fkey(x) >= lower && m.ok(i)) acc += fixw(expf(x - mx));
        }
        acc = warp_sum_u64(acc);
        __syncthreads();
        if (lane == 0) wsum[warp] = acc;
        __syncthreads();
        if (tid == 0) {
            unsigned long long Z = 0;
            for (int w = 0; w < SAMPLE_WARPS; ++w) Z += wsum[w];
            int wsel = -1;
            unsigned long long t_local = 0;
            if (Z > 0) {
                const uint4 r = philox4x32_10(make_uint4(pos, (uint32_t)round, 0u, 0u), key2);
                const unsigned long long u = ((unsigned long long)r.x << 32) | r.y;
                const unsigned long long target = __umul64hi(u, Z);  // uniform in [0, Z)
                unsigned long long c = 0;
                for (int w = 0; w < SAMPLE_WARPS; ++w) {
                    if (target < c + wsum[w]) {
                        wsel = w;
                        t_local = target - c;
                        break;
                    }
                    c += wsum[w];
                }
            }
            if (round == 0) s_ull[1] = Z;  // Z_k: mass of the top-k set
            s_int[0] = wsel;
            s_ull[0] = t_local;
            s_int[1] = -1;
        }
        __syncthreads();
        const int wsel = s_int[0];
        if (wsel < 0) break;  // empty mass (all weights 0: inf/NaN logits) -> argmax
        if (round == 0) p_target = (double)P * (double)s_ull[1];
        // ---- the selected warp walks its range in token order to the crossing token
        if (warp == wsel) {
            const unsigned long long t = s_ull[0];
            unsigned long long c = 0;
            int tok = -1;
            for (int base = s0; base < s1; base += 32) {
                const int i = base + lane;
                unsigned long long w = 0;
                if (i < s1 && m.ok(i)) {
                    const float x = row[i] / T;
                    if (fkey(x) >= lower) w = fixw(expf(x - mx));
                }
                unsigned long long incl = w;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += v;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, w > 0 && c + incl > t);
                if (hit) {
                    tok = base + __ffs(hit) - 1;
                    break;
                }
                c += __shfl_sync(0xffffffffu, incl, 31);
            }
            if (lane == 0) s_int[1] = tok;
        }
        __syncthreads();
        const int tok = s_int[1];
        if (tok < 0) break;  // cannot happen (exact integer sums); argmax as a safe answer
        if (!use_p) {
            result = tok;
            break;
        }
        // ---- top-p check: mass of top-k-kept tokens strictly above the drawn one
        const uint32_t ktok = fkey(row[tok] / T);
        unsigned long long ab = 0;
        for (int i = tid; i < V; i += SAMPLE_THREADS) {
            const float x = row[i] / T;
            const uint32_t kx = fkey(x);
            if (kx >= kth && kx > ktok && m.ok(i)) ab += fixw(expf(x - mx));
        }
        ab = warp_sum_u64(ab);
        __syncthreads();
        if (lane == 0) wsum[warp] = ab;
        __syncthreads();
        unsigned long long above = 0;
        for (int w = 0; w < SAMPLE_WARPS; ++w) above += wsum[w];  // same order in every thread
        if ((double)above < p_target) {
            result = tok;
            break;
        }
        if (ktok == 0xffffffffu) break;
        lower = ktok + 1;  // every token with x <= x_tok is outside the top-p set
    }
    if (tid == 0) out[s] = (result >= 0 && result < V) ? result : 0;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample(int* __restrict__ out, const float* __restrict__ logits, const float* __restrict__ temperature,
       const int* __restrict__ top_k, const float* __restrict__ top_p, const unsigned long long* __restrict__ seeds,
       const int* __restrict__ rng_pos, int seqs, int vocab) {
    KERN_PDL_WAIT();
    sample_row(out, logits, temperature, top_k, top_p, seeds, rng_pos, seqs, vocab, RowMask{nullptr, 0});
}

// `sample` restricted by the step's token mask: token_mask [mask rows, mask_words] u32,
// mask_rows [seqs] i32 (the token_mask row of each sequence, -1: free).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_masked(int* __restrict__ out, const float* __restrict__ logits, const float* __restrict__ temperature,
              const int* __restrict__ top_k, const float* __restrict__ top_p, const unsigned long long* __restrict__ seeds,
              const int* __restrict__ rng_pos, const unsigned* __restrict__ token_mask, const int* __restrict__ mask_rows,
              int mask_words, int seqs, int vocab) {
    KERN_PDL_WAIT();
    const int s = blockIdx.x;
    if (s >= seqs) return;
    const int r = mask_rows[s];
    const RowMask m = r < 0 ? RowMask{nullptr, 0} : RowMask{token_mask + (size_t)r * mask_words, mask_words};
    sample_row(out, logits, temperature, top_k, top_p, seeds, rng_pos, seqs, vocab, m);
}
