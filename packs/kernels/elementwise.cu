// KERN_PDL_VARIANT (packs/kernels/build.sh also builds it with -DKERN_PDL: KERN_PDL_WAIT() first in every kernel)
// Elementwise kernels of the packs. `add_inplace` is the residual add of `add_rms_norm` as a
// kernel of its own, for manifests that run the add and the norm as two launches (the split
// variant `kern test` is proven with: add_inplace + rms_norm == add_rms_norm, bit for bit).
//
// Built WITHOUT --use_fast_math (see KERNELS.md).
#include "common.cuh"

using namespace kern;

#define EW_THREADS 256

// residual[t, i] = bf16(residual[t, i] + x[t, i]) for t < n: the fp32 sum of two bf16 values
// rounded once to bf16, exactly add_rms_norm's residual update (transformers' bf16 add).
// grid [tokens, 1, 1], block [256, 1, 1], shared 0. Rows t >= n are not touched.
extern "C" __global__ void __launch_bounds__(EW_THREADS)
add_inplace(bf16* __restrict__ residual, const bf16* __restrict__ x, int n, int hidden) {
    KERN_PDL_WAIT();
    const int t = blockIdx.x;
    if (t >= n) return;
    bf16* r = residual + (size_t)t * hidden;
    const bf16* v = x + (size_t)t * hidden;
    for (int i = threadIdx.x; i < hidden; i += EW_THREADS) r[i] = b(f(r[i]) + f(v[i]));
}
