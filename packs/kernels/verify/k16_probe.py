#!/usr/bin/env python3
"""Does one Hopper wgmma k16 step round like one mma.sync m16n8k16 step? (docs/batch-invariance.md,
option (d): a wgmma prefill GEMM in the GEMV family's K order is bit-identical to the GEMV family
only if it does.)

usage: python3 packs/kernels/verify/k16_probe.py [CUBIN_DIR] [--trials T] [--cases a,b] [--seed S]
       python3 packs/kernels/verify/k16_probe.py --selftest      # CPU only: no GPU, no cupy

CUBIN_DIR (default build/packs) must hold k16_probe.sm_90a.cubin (packs/kernels/build.sh builds
it from packs/kernels/verify/k16_probe.cu). Needs numpy and cupy (loads the cubin with
cupy.RawModule, as gemm_verify.py does).

Per case and per K (16: one k16 step; 64: four chained k16 steps into the same accumulator), T
wgmma trials are generated: A [T, 64, K], B [T, 8, K] (bf16 values), C [T, 64, 8] (fp32).
k16_wgmma computes D = C + A·Bᵀ for the whole 64-row tile (one warpgroup); k16_mma_sync computes
the same for each 16-row block (rows 16w..16w+15 with the same B and C rows) as its own trial
(one warp). A "trial" below is one 16 x 8 output block: 4 per wgmma tile (rows 0..15 are the
block the brief asks for, rows 16..63 are compared too). A trial differs when any of its 128
fp32 outputs differs in any bit (two NaNs count as equal; a NaN against a number differs).
max ulp is the largest distance in fp32 ulps (0 with a difference = a signed zero).

Also printed, as information: how many trials each kernel differs from the model
"per k16 step, fp32(acc + exact Σ of the 16 products)" (computed in float64), and a sanity
check that both kernels compute C + A·Bᵀ at all (a wrong descriptor or fragment layout shows up
as SANITY FAIL and the result reads INVALID instead of YES/NO).

Output ends with
  k16 rounding: mma.sync == wgmma: YES/NO (n of N trials differ)       (K = 16, every case)
  k64 chain:    mma.sync == wgmma: YES/NO (n of N trials differ)       (K = 64, every case)
Exit status 0 when the probe ran and was sane (whatever the answer), 1 otherwise.
"""
import argparse
import os
import sys

import numpy as np

STEM = "k16_probe"
ENTRIES = {1: ("k16_mma_sync", "k16_wgmma"), 4: ("k16_mma_sync_k64", "k16_wgmma_k64")}
KSTEPS = (1, 4)
POISON = np.uint32(0xFFBADBAD)  # a NaN pattern no kernel writes: marks outputs left unwritten
SANITY_CASES = ("normal", "zero_c", "c_large")  # cases where both kernels must be close to C + A·Bᵀ


# ----------------------------------------------------------------------------------- bf16
def bf16_bits(x):
    """float32 array -> uint16 bf16 patterns, round to nearest even (NaN stays a quiet NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    r = np.where(nan, ((u >> 16) | 0x40).astype(np.uint32), r)
    return (r & 0xFFFF).astype(np.uint16)


def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def quant(x):
    """Round float32 values to the nearest bf16 value (returned as float32)."""
    return bf16_to_f32(bf16_bits(np.asarray(x, dtype=np.float32)))


# ----------------------------------------------------------------------------------- comparison
def ordered(x):
    """fp32 bit patterns on a line where neighbours are 1 apart (+0 and -0 both 0)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(b < 0, -(2 ** 31) - b, b)


def compare(x, y):
    """Element-wise comparison of two fp32 arrays of one shape.

    Returns (differ, ulp, nan_mismatch, nan_payload): differ = bits differ, except that two NaNs
    are equal; ulp = distance in fp32 ulps (int64; 2**40 where exactly one is NaN, 0 where both
    are); nan_mismatch = exactly one is NaN; nan_payload = both NaN with different bits."""
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    assert x.shape == y.shape, (x.shape, y.shape)
    xn, yn = np.isnan(x), np.isnan(y)
    bits_differ = x.view(np.uint32) != y.view(np.uint32)
    both_nan = xn & yn
    nan_mismatch = xn ^ yn
    differ = bits_differ & ~both_nan
    ulp = np.abs(ordered(x) - ordered(y))
    ulp = np.where(both_nan, 0, np.where(nan_mismatch, 2 ** 40, ulp))
    return differ, ulp, nan_mismatch, bits_differ & both_nan


def trial_summary(d_mma, d_wg):
    """d_* [T, 64, 8] fp32 -> dict: trials (16x8 blocks) differing, in all and in rows 0..15."""
    differ, ulp, nanm, nanp = compare(d_mma, d_wg)
    T = d_mma.shape[0]
    blk = differ.reshape(T, 4, 16, 8).any(axis=(2, 3))
    return dict(trials=int(blk.size), differ=int(blk.sum()), trials0=int(T), differ0=int(blk[:, 0].sum()),
                elems=int(differ.sum()), max_ulp=int(ulp[differ].max()) if differ.any() else 0,
                nan_mismatch=int(nanm.sum()), nan_payload=int(nanp.sum()))


# ----------------------------------------------------------------------------------- model
def step_model(A, B, C, ksteps):
    """Per k16 step: acc = fp32(acc + exact Σ of the step's 16 products) (float64 sums)."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    acc = C.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(ksteps):
            sl = slice(16 * s, 16 * s + 16)
            p = np.einsum("trk,tnk->trn", A64[:, :, sl], B64[:, :, sl])
            acc = (acc.astype(np.float64) + p).astype(np.float32)
    return acc


def sanity_bad(A, B, C, D):
    """Elements of D far from C + A·Bᵀ: |D - ref| > 1e-3 (|C| + Σ|a b|) + 2^-100 where that
    bound is finite and below 1e37 (the overflow cases are not judged)."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = C.astype(np.float64) + np.einsum("trk,tnk->trn", A64, B64)
        mag = np.abs(C.astype(np.float64)) + np.einsum("trk,tnk->trn", np.abs(A64), np.abs(B64))
        judged = np.isfinite(mag) & (mag < 1e37)
        bad = judged & ~(np.abs(D.astype(np.float64) - ref) <= 1e-3 * mag + 2.0 ** -100)
    return int(bad.sum())


# ----------------------------------------------------------------------------------- trials
def _pow2(rng, lo, hi, shape):
    return np.ldexp(1.0, rng.integers(lo, hi + 1, size=shape)).astype(np.float64)


def _sign(rng, shape):
    return np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def gen_normal(rng, T, K):
    return rng.standard_normal((T, 64, K)), rng.standard_normal((T, 8, K)), rng.standard_normal((T, 64, 8))


def gen_zero_c(rng, T, K):
    A, B, _ = gen_normal(rng, T, K)
    return A, B, np.zeros((T, 64, 8))


def gen_magnitudes(rng, T, K):
    """Products of wildly different magnitudes (2^-60 .. 2^60) in one sum."""
    A = rng.standard_normal((T, 64, K)) * _pow2(rng, -30, 30, (T, 64, K))
    B = rng.standard_normal((T, 8, K)) * _pow2(rng, -30, 30, (T, 8, K))
    C = rng.standard_normal((T, 64, 8)) * _pow2(rng, -30, 30, (T, 64, 8))
    return A, B, C


def gen_cancel(rng, T, K):
    """a·b + (-a)·b + tiny: two big products cancel exactly (k positions p1 != p2 anywhere in K,
    per trial), the other products are 2^-12 .. 2^-32 of them (a sequential fp32 sum loses some
    or all of them next to the big one); C zero or tiny."""
    A = rng.standard_normal((T, 64, K)) * 2.0 ** -8
    B = rng.standard_normal((T, 8, K))
    C = rng.standard_normal((T, 64, 8)) * 2.0 ** -8 * (rng.random((T, 1, 1)) < 0.5)
    for t in range(T):
        p1, p2 = rng.choice(K, size=2, replace=False)
        big = quant(rng.standard_normal(64) * 2.0 ** rng.integers(4, 25)).astype(np.float64)
        A[t, :, p1], A[t, :, p2] = big, -big
        B[t, :, p2] = B[t, :, p1] = quant(rng.standard_normal(8))
    return A, B, C


def gen_c_cancel(rng, T, K):
    """C = -(one big product), exactly, plus small products: C + a·b = 0 before the rest."""
    A = rng.standard_normal((T, 64, K)) * 2.0 ** -6
    B = rng.standard_normal((T, 8, K))
    C = np.zeros((T, 64, 8))
    for t in range(T):
        p = rng.integers(K)
        A[t, :, p] = quant(rng.standard_normal(64) * 2.0 ** 12)
        B[t, :, p] = quant(rng.standard_normal(8) * 2.0 ** 3)
        C[t] = -np.outer(A[t, :, p], B[t, :, p])  # bf16 x bf16 is exact in fp32
    return A, B, C


def gen_c_large(rng, T, K):
    """C ~ 2^24 (ulp 2), products ~ 1: how C + (small sum) rounds."""
    A, B, _ = gen_normal(rng, T, K)
    C = rng.standard_normal((T, 64, 8)) * 2.0 ** 24
    return A, B, C


def gen_ties(rng, T, K):
    """C = ±(1 + m·2^-23), one product of ±{0.5, 0.75, 1, 1.25, 1.5, 2.25}·2^-24 (around half
    an ulp of C) at a random k, every other product 0: round-to-nearest-even vs truncation."""
    A = np.zeros((T, 64, K))
    B = np.zeros((T, 8, K))
    m = rng.integers(0, 2 ** 23, size=(T, 64, 8))
    C = _sign(rng, (T, 64, 8)) * (1.0 + m * 2.0 ** -23)
    for t in range(T):
        p = rng.integers(K)
        A[t, :, p] = _sign(rng, 64) * rng.choice([0.5, 0.75, 1.0, 1.25], size=64) * 2.0 ** -12
        B[t, :, p] = rng.choice([1.0, 1.5, 1.25], size=8) * 2.0 ** -12
    return A, B, C


def gen_many_small(rng, T, K):
    """C = ±(1 + m·2^-23), every product ~2^-26 (a quarter ulp of C): a sequential fp32 sum
    drops each, an exact sum keeps their total (~16 · 2^-26 = 2 ulp per step)."""
    m = rng.integers(0, 2 ** 23, size=(T, 64, 8))
    C = _sign(rng, (T, 64, 8)) * (1.0 + m * 2.0 ** -23)
    A = (1.0 + rng.integers(0, 128, size=(T, 64, K)) / 128.0) * 2.0 ** -13
    A = A * np.where(rng.random((T, 64, K)) < 0.2, -1.0, 1.0)
    B = (1.0 + rng.integers(0, 128, size=(T, 8, K)) / 128.0) * 2.0 ** -14
    return A, B, C


def gen_subnormal(rng, T, K):
    """fp32-subnormal products (2^-64·2^-70 ...), bf16-subnormal inputs (< 2^-126), subnormal C."""
    A = rng.standard_normal((T, 64, K)) * _pow2(rng, -72, -60, (T, 64, K))
    B = rng.standard_normal((T, 8, K)) * _pow2(rng, -72, -60, (T, 8, K))
    # a quarter of the inputs bf16 subnormals times O(1) partners
    sub_a = rng.random((T, 64, K)) < 0.25
    A = np.where(sub_a, rng.integers(1, 128, size=(T, 64, K)) * 2.0 ** -133 * _sign(rng, (T, 64, K)), A)
    sub_b = rng.random((T, 8, K)) < 0.25
    B = np.where(sub_b, rng.standard_normal((T, 8, K)), B)
    C = rng.integers(-(2 ** 23) + 1, 2 ** 23, size=(T, 64, 8)) * 2.0 ** -149  # fp32 subnormals (and 0)
    C = np.where(rng.random((T, 64, 8)) < 0.5, C, 0.0)
    return A, B, C


def gen_overflow(rng, T, K):
    """Values near bf16's max (3.39e38): products around 2^124..2^128 with mixed signs, so that
    whether and where the sum overflows depends on the order (about half the outputs do); C near
    ±FLT_MAX for a quarter of the outputs."""
    A = _sign(rng, (T, 64, K)) * (1.0 + rng.integers(0, 128, size=(T, 64, K)) / 128.0) * 2.0 ** 62
    B = _sign(rng, (T, 8, K)) * (1.0 + rng.integers(0, 128, size=(T, 8, K)) / 128.0) * 2.0 ** 62
    near_max = rng.random((T, 64, K)) < 0.03
    A = np.where(near_max, _sign(rng, (T, 64, K)) * (2.0 - 2.0 ** -7) * 2.0 ** 127, A)
    B = np.where(rng.random((T, 8, K)) < 0.3, _sign(rng, (T, 8, K)) * 2.0 ** rng.integers(-2, 1, size=(T, 8, K)), B)
    C = np.where(rng.random((T, 64, 8)) < 0.25, _sign(rng, (T, 64, 8)) * np.float64(np.finfo(np.float32).max)
                 * (1.0 - rng.integers(0, 2 ** 10, size=(T, 64, 8)) * 2.0 ** -24), 0.0)
    return A, B, C


CASES = {
    "normal": gen_normal,
    "zero_c": gen_zero_c,
    "magnitudes": gen_magnitudes,
    "cancel": gen_cancel,
    "c_cancel": gen_c_cancel,
    "c_large": gen_c_large,
    "ties": gen_ties,
    "many_small": gen_many_small,
    "subnormal": gen_subnormal,
    "overflow": gen_overflow,
}


def make_trials(case, T, ksteps, seed):
    """-> A [T, 64, K] float32 (bf16 values), B [T, 8, K] float32 (bf16 values), C [T, 64, 8]
    float32, K = 16 * ksteps. Deterministic in (case, T, ksteps, seed)."""
    K = 16 * ksteps
    rng = np.random.default_rng([seed, ksteps, sorted(CASES).index(case)])
    with np.errstate(over="ignore"):
        A, B, C = CASES[case](rng, T, K)
        A = quant(np.asarray(A, dtype=np.float64).astype(np.float32))
        B = quant(np.asarray(B, dtype=np.float64).astype(np.float32))
        C = np.asarray(C, dtype=np.float64).astype(np.float32)
    return np.ascontiguousarray(A), np.ascontiguousarray(B), np.ascontiguousarray(C)


def mma_inputs(A, B, C):
    """The mma.sync trials of a wgmma tile: block w = rows 16w..16w+15 with the same B.
    -> A [4T, 16, K], B [4T, 8, K], C [4T, 16, 8]."""
    T, _, K = A.shape
    return (A.reshape(T * 4, 16, K), np.repeat(B, 4, axis=0), C.reshape(T * 4, 16, 8))


# ----------------------------------------------------------------------------------- CPU replay
# Lane-by-lane replay of k16_probe.cu's index arithmetic under the PTX ISA's fragment layouts and
# the shared-memory operand model of gemm_emulate.py (which gemm_wgmma.cu passes on the GPU):
# catches slips in the probe's loads, swizzle, descriptor offsets and stores, not a misreading of
# the hardware (only the GPU run's sanity check can).
def _swz(row, chunk):
    return row * 128 + ((chunk ^ (row & 7)) << 4)


def emulate_mma_sync(A, B, C, ksteps):
    """A [T, 16, K], B [T, 8, K], C [T, 16, 8] -> D as k16_mma_sync(_k64) computes it (float64)."""
    T, K = A.shape[0], 16 * ksteps
    D = np.full((T, 16, 8), np.nan)
    for t in range(T):
        a, b, c = A[t].reshape(-1), B[t].reshape(-1), C[t].reshape(-1)
        acc = np.zeros((32, 4))
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            acc[lane] = [c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]]
        for s in range(ksteps):
            Am, Bm = np.full((16, 16), np.nan), np.full((16, 8), np.nan)  # what the fragments hold
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                k0 = 16 * s + 2 * q
                regs = [a[g * K + k0:g * K + k0 + 2], a[(g + 8) * K + k0:(g + 8) * K + k0 + 2],
                        a[g * K + k0 + 8:g * K + k0 + 10], a[(g + 8) * K + k0 + 8:(g + 8) * K + k0 + 10]]
                Am[g, 2 * q:2 * q + 2], Am[g + 8, 2 * q:2 * q + 2] = regs[0], regs[1]
                Am[g, 2 * q + 8:2 * q + 10], Am[g + 8, 2 * q + 8:2 * q + 10] = regs[2], regs[3]
                Bm[2 * q:2 * q + 2, g] = b[g * K + k0:g * K + k0 + 2]
                Bm[2 * q + 8:2 * q + 10, g] = b[g * K + k0 + 8:g * K + k0 + 10]
            P = Am @ Bm
            for lane in range(32):
                g, q = lane >> 2, lane & 3
                acc[lane] += [P[g, 2 * q], P[g, 2 * q + 1], P[g + 8, 2 * q], P[g + 8, 2 * q + 1]]
        d = D[t].reshape(-1)
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            d[g * 8 + 2 * q], d[g * 8 + 2 * q + 1] = acc[lane, 0], acc[lane, 1]
            d[(g + 8) * 8 + 2 * q], d[(g + 8) * 8 + 2 * q + 1] = acc[lane, 2], acc[lane, 3]
    return D


def emulate_wgmma(A, B, C, ksteps, raw=0x2A0):
    """A [T, 64, K], B [T, 8, K], C [T, 64, 8] -> D as k16_wgmma(_k64) computes it (float64);
    raw = the shared address of smem_raw (the kernel rounds it up to 1024)."""
    T, K = A.shape[0], 16 * ksteps
    sa = (raw + 1023) & ~1023
    sb = sa + 64 * 128
    D = np.full((T, 64, 8), np.nan)

    def operand(sm, start, rows):  # gemm_emulate.wgmma_operand, SBO = 1024
        out = np.zeros((rows, 16))
        for r in range(rows):
            for k in range(16):
                ad = start + (r // 8) * 1024 + (r % 8) * 128 + 2 * k
                ad ^= ((ad >> 7) & 7) << 4
                out[r, k] = sm[ad // 2]
        return out

    for t in range(T):
        a, b, c = A[t].reshape(-1), B[t].reshape(-1), C[t].reshape(-1)
        sm = np.full((sb + 8 * 128) // 2, np.nan)  # 2-byte cells by shared address
        for i in range(64 * 8):
            r, ch = i >> 3, i & 7
            v = a[r * K + ch * 8:r * K + ch * 8 + 8] if ch * 8 < K else np.zeros(8)
            sm[(sa + _swz(r, ch)) // 2:(sa + _swz(r, ch)) // 2 + 8] = v
        for i in range(8 * 8):
            r, ch = i >> 3, i & 7
            v = b[r * K + ch * 8:r * K + ch * 8 + 8] if ch * 8 < K else np.zeros(8)
            sm[(sb + _swz(r, ch)) // 2:(sb + _swz(r, ch)) // 2 + 8] = v
        acc = np.zeros((128, 4))
        for tid in range(128):
            wq, lane = tid >> 5, tid & 31
            g, q = lane >> 2, lane & 3
            row0 = wq * 16 + g
            acc[tid] = [c[row0 * 8 + 2 * q], c[row0 * 8 + 2 * q + 1], c[(row0 + 8) * 8 + 2 * q],
                        c[(row0 + 8) * 8 + 2 * q + 1]]
        for s in range(ksteps):
            P = operand(sm, sa + 32 * s, 64) @ operand(sm, sb + 32 * s, 8).T  # 64 x 8
            for tid in range(128):
                w, lane = tid >> 5, tid & 31
                g, q = lane >> 2, lane & 3
                for i in range(4):  # m64nN accumulator layout (gemm_emulate.gemm_wgmma, N = 8)
                    acc[tid, i] += P[16 * w + g + 8 * ((i >> 1) & 1), 2 * q + (i & 1)]
        d = D[t].reshape(-1)
        for tid in range(128):
            wq, lane = tid >> 5, tid & 31
            g, q = lane >> 2, lane & 3
            row0 = wq * 16 + g
            d[row0 * 8 + 2 * q], d[row0 * 8 + 2 * q + 1] = acc[tid, 0], acc[tid, 1]
            d[(row0 + 8) * 8 + 2 * q], d[(row0 + 8) * 8 + 2 * q + 1] = acc[tid, 2], acc[tid, 3]
    return D


# ----------------------------------------------------------------------------------- GPU run
def run_gpu(args):
    import cupy
    path = os.path.join(args.dir, STEM + ".sm_90a.cubin")
    if not os.path.exists(path):
        print(f"no file {path}: run bash packs/kernels/build.sh", file=sys.stderr)
        return 1
    print(f"device {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}, "
          f"numpy {np.__version__}; cubin {path}", flush=True)
    mod = cupy.RawModule(path=path)
    cases = args.cases.split(",") if args.cases else list(CASES)
    T = args.trials
    print(f"{T} wgmma tiles (= {4 * T} trials of 16 x 8) per case and K\n")
    hdr = (f"{'case':12s} {'K':>3s} {'trials':>7s} {'differ':>7s} {'rows0-15':>9s} {'elems':>8s} {'max ulp':>11s} "
           f"{'nan-mis':>7s} {'mma!=model':>10s} {'wg!=model':>9s} {'sanity':>10s}")
    totals = {k: [0, 0] for k in KSTEPS}
    insane = []
    for ksteps in KSTEPS:
        f_mma, f_wg = (mod.get_function(n) for n in ENTRIES[ksteps])
        print(hdr)
        for case in cases:
            A, B, C = make_trials(case, T, ksteps, args.seed)
            Am, Bm, Cm = mma_inputs(A, B, C)
            dA, dB, dC = cupy.asarray(bf16_bits(A)), cupy.asarray(bf16_bits(B)), cupy.asarray(C)
            dAm, dBm, dCm = cupy.asarray(bf16_bits(Am)), cupy.asarray(bf16_bits(Bm)), cupy.asarray(Cm)
            dDm = cupy.full((4 * T, 16, 8), POISON, dtype=cupy.uint32)
            dDw = cupy.full((T, 64, 8), POISON, dtype=cupy.uint32)
            f_mma((4 * T, 1, 1), (32, 1, 1), (dAm, dBm, dCm, dDm, np.int32(4 * T)))
            f_wg((T, 1, 1), (128, 1, 1), (dA, dB, dC, dDw, np.int32(T)))
            cupy.cuda.runtime.deviceSynchronize()
            um, uw = dDm.get().reshape(T, 64, 8), dDw.get()
            unwritten = int((um == POISON).sum() + (uw == POISON).sum())
            dm, dw = um.view(np.float32), uw.view(np.float32)
            s = trial_summary(dm, dw)
            model = step_model(A, B, C, ksteps)
            m_mma = trial_summary(dm, model)["differ"]
            m_wg = trial_summary(dw, model)["differ"]
            bad_m, bad_w = sanity_bad(A, B, C, dm), sanity_bad(A, B, C, dw)
            sane = unwritten == 0 and (case not in SANITY_CASES or (bad_m == 0 and bad_w == 0))
            if not sane:
                insane.append(f"{case} K={16 * ksteps}: unwritten {unwritten}, far from C+A·Bt: "
                              f"mma.sync {bad_m}, wgmma {bad_w}")
            totals[ksteps][0] += s["differ"]
            totals[ksteps][1] += s["trials"]
            ulp = s["max_ulp"]
            ulp_s = "nan-vs-num" if ulp >= 2 ** 40 else str(ulp)
            print(f"{case:12s} {16 * ksteps:3d} {s['trials']:7d} {s['differ']:7d} {s['differ0']:9d} {s['elems']:8d} "
                  f"{ulp_s:>11s} {s['nan_mismatch']:7d} {m_mma:10d} {m_wg:9d} "
                  f"{'ok' if sane else 'FAIL':>4s} {bad_m}/{bad_w}", flush=True)
        print()
    print("columns: differ = trials (16x8 blocks, all 64 rows) whose mma.sync and wgmma outputs differ in any bit;"
          " rows0-15 = of the wgmma tiles' first blocks only; elems = differing outputs; max ulp over those"
          " (0 = signed zero); nan-mis = NaN on one side only; X!=model = trials differing from"
          " fp32(acc + exact step sum) per k16 step; sanity = elements far from C + A·Bt (mma.sync/wgmma),"
          " judged on " + ", ".join(SANITY_CASES) + "\n")
    for msg in insane:
        print("SANITY FAIL: " + msg + " (wrong fragment layout or descriptor?)")

    def verdict(k):
        n, N = totals[k]
        if insane:
            return f"INVALID (sanity failed; {n} of {N} trials differ)"
        return f"{'YES' if n == 0 else 'NO'} ({n} of {N} trials differ)"
    print(f"k16 rounding: mma.sync == wgmma: {verdict(1)}")
    print(f"k64 chain:    mma.sync == wgmma: {verdict(4)}")
    return 1 if insane else 0


# ----------------------------------------------------------------------------------- selftest
def selftest():
    fails = []

    def check(name, cond):
        print(f"{'ok  ' if cond else 'FAIL'} {name}")
        if not cond:
            fails.append(name)

    # argument parsing
    a = parse_args([])
    check("defaults: build/packs, 2048 tiles, all cases", (a.dir, a.trials, a.cases, a.selftest) ==
          ("build/packs", 2048, None, False))
    a = parse_args(["/x", "--trials", "16", "--cases", "normal,ties", "--seed", "3"])
    check("options parsed", (a.dir, a.trials, a.cases, a.seed) == ("/x", 16, "normal,ties", 3))
    for bad in (["--cases", "normal,nope"], ["--trials", "0"]):
        try:
            import contextlib
            import io
            with contextlib.redirect_stderr(io.StringIO()):
                parse_args(bad)
            check(f"rejects {bad}", False)
        except SystemExit:
            check(f"rejects {bad}", True)

    # bf16 rounding
    f = np.array([1.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.0, np.inf, np.finfo(np.float32).max, 0.0, -0.0,
                  2.0 ** -133], dtype=np.float32)
    check("bf16_bits: RNE, ties to even, overflow to inf, signed zero, subnormal",
          bf16_bits(f).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0x7F80, 0, 0x8000, 0x0001])
    check("bf16_bits: NaN stays NaN", bool(np.isnan(bf16_to_f32(bf16_bits(np.array([np.nan], np.float32))))[0]))
    check("quant is idempotent", np.array_equal(quant(quant(f)), quant(f)))

    # trial generators
    for case in CASES:
        for ks in KSTEPS:
            K = 16 * ks
            A, B, C = make_trials(case, 8, ks, 1)
            ok = (A.shape, B.shape, C.shape) == ((8, 64, K), (8, 8, K), (8, 64, 8))
            ok &= A.dtype == B.dtype == C.dtype == np.float32
            ok &= A.flags.c_contiguous and B.flags.c_contiguous and C.flags.c_contiguous
            ok &= not (np.isnan(A).any() or np.isnan(B).any() or np.isnan(C).any())
            ok &= np.array_equal(quant(A), A) and np.array_equal(quant(B), B)  # bf16 values
            if case != "overflow":
                ok &= bool(np.isfinite(A).all() and np.isfinite(B).all() and np.isfinite(C).all())
            A2, B2, C2 = make_trials(case, 8, ks, 1)
            ok &= np.array_equal(A, A2) and np.array_equal(B, B2) and np.array_equal(C, C2)
            Am, Bm, Cm = mma_inputs(A, B, C)
            ok &= (Am.shape, Bm.shape, Cm.shape) == ((32, 16, K), (32, 8, K), (32, 16, 8))
            ok &= np.array_equal(Am[4 * 3 + 2], A[3, 32:48]) and np.array_equal(Bm[4 * 3 + 2], B[3])
            ok &= np.array_equal(Cm[4 * 3 + 2], C[3, 32:48])
            ok &= bf16_bits(A).dtype == np.uint16 and bf16_bits(A).shape == A.shape
            check(f"generator {case} K={K}: shapes, dtypes, bf16 values, deterministic, mma view", bool(ok))
    A, B, C = make_trials("cancel", 8, 4, 2)
    P = A.astype(np.float64)[:, :, None, :] * B.astype(np.float64)[:, None, :, :]  # [T, 64, 8, K]
    big = np.abs(P) > 2.0 ** 4
    ok = all(big[t].any(axis=(0, 1)).sum() == 2 and P[t][:, :, big[t].any(axis=(0, 1))].sum(axis=2).max() == 0
             for t in range(8))
    check("cancel: two big products per trial cancel exactly", bool(ok))
    A, B, C = make_trials("c_cancel", 8, 1, 2)
    P = A.astype(np.float64)[:, :, None, :] * B.astype(np.float64)[:, None, :, :]
    check("c_cancel: C + (the big product) == 0 exactly",
          bool(all((C[t] + P[t][:, :, np.argmax(np.abs(P[t]).sum(axis=(0, 1)))] == 0).all() for t in range(8))))
    A, B, C = make_trials("subnormal", 8, 1, 2)
    tiny = np.finfo(np.float32).tiny
    check("subnormal: subnormal inputs and C present",
          bool(((np.abs(A) < tiny) & (A != 0)).any() and ((np.abs(C) < tiny) & (C != 0)).any()))
    A, B, C = make_trials("overflow", 8, 1, 2)
    check("overflow: inputs near bf16 max", bool(np.abs(A).max() >= 3.3e38))

    # comparison
    x = np.linspace(-3, 3, 2 * 64 * 8, dtype=np.float32).reshape(2, 64, 8)
    s = trial_summary(x, x.copy())
    check("compare: equal -> 0 of 8 trials, max ulp 0",
          (s["differ"], s["trials"], s["max_ulp"], s["differ0"], s["trials0"]) == (0, 8, 0, 0, 2))
    y = x.copy()
    y[1, 20, 3] = np.nextafter(y[1, 20, 3], np.float32(np.inf))
    s = trial_summary(x, y)
    check("compare: one element one ulp up -> 1 trial (block 1 of tile 1), max ulp 1, rows0-15 none",
          (s["differ"], s["elems"], s["max_ulp"], s["differ0"]) == (1, 1, 1, 0))
    y = x.copy()
    y[0, 3, 0] = np.nextafter(np.nextafter(y[0, 3, 0], np.float32(-np.inf)), np.float32(-np.inf))
    check("compare: two ulps down in rows 0..15", (trial_summary(x, y)["differ0"], trial_summary(x, y)["max_ulp"]) == (1, 2))
    n1 = np.array([0x7FC00000], np.uint32).view(np.float32)
    n2 = np.array([0xFFBADBAD], np.uint32).view(np.float32)
    d, u, nm, npay = compare(n1, n2)
    check("compare: NaN vs NaN (other payload) is equal, noted as payload", (d[0], u[0], nm[0], npay[0]) ==
          (False, 0, False, True))
    d, u, nm, _ = compare(n1, np.float32([1.0]))
    check("compare: NaN vs number differs, nan_mismatch", (bool(d[0]), int(u[0]) >= 2 ** 40, bool(nm[0])) ==
          (True, True, True))
    d, u, _, _ = compare(np.float32([0.0, np.inf, 1.0, -1.0]),
                         np.float32([-0.0, np.finfo(np.float32).max, -1.0, np.nextafter(np.float32(-1), 0)]))
    check("compare: +0/-0 differ at 0 ulp; inf/FLT_MAX 1 ulp; 1/-1 far; -1 and its neighbour 1 ulp",
          d.tolist() == [True, True, True, True] and u[0] == 0 and u[1] == 1 and u[2] == 2 * 0x3F800000 and u[3] == 1)

    # replay of the kernels' index arithmetic: small integers, so every sum is exact
    for ks in KSTEPS:
        K = 16 * ks
        r = np.random.default_rng(7)
        A = r.integers(-8, 9, size=(2, 64, K)).astype(np.float64)
        B = r.integers(-8, 9, size=(2, 8, K)).astype(np.float64)
        C = r.integers(-64, 65, size=(2, 64, 8)).astype(np.float64)
        ref = C + np.einsum("trk,tnk->trn", A, B)
        Am, Bm, Cm = mma_inputs(A, B, C)
        dm = emulate_mma_sync(Am, Bm, Cm, ks).reshape(2, 64, 8)
        dw = emulate_wgmma(A, B, C, ks)
        check(f"replay K={K}: k16_mma_sync lanes compute C + A·Bt", bool(np.array_equal(dm, ref)))
        check(f"replay K={K}: k16_wgmma fill / swizzle / descriptors / accumulators compute C + A·Bt",
              bool(np.array_equal(dw, ref)))
        check(f"replay K={K}: wgmma with smem_raw already 1024-aligned",
              bool(np.array_equal(emulate_wgmma(A[:1], B[:1], C[:1], ks, raw=0x400), ref[:1])))

    # model and sanity on hand-made inputs
    A = np.ones((1, 64, 16), np.float32)
    B = np.ones((1, 8, 16), np.float32)
    C = np.full((1, 64, 8), 0.5, np.float32)
    check("model: 16 ones + 0.5 = 16.5", bool((step_model(A, B, C, 1) == 16.5).all()))
    check("model K=64 chained: 64.5", bool((step_model(np.ones((1, 64, 64), np.float32), np.ones((1, 8, 64), np.float32),
                                                       C, 4) == 64.5).all()))
    C = np.ones((1, 64, 8), np.float32)
    A = np.zeros((1, 64, 16), np.float32)
    A[0, :, :] = 2.0 ** -13
    B = np.full((1, 8, 16), 2.0 ** -13, np.float32)  # 16 products of 2^-26 = 2^-22 on 1.0
    check("model: exact step sum keeps 16 quarter-ulp products (1 + 2^-22)",
          bool((step_model(A, B, C, 1) == np.float32(1 + 2.0 ** -22)).all()))
    D = step_model(A, B, C, 1)
    check("sanity: model passes", sanity_bad(A, B, C, D) == 0)
    D2 = D.copy()
    D2[0, 5, 5] = 7.0
    check("sanity: a wrong element is caught", sanity_bad(A, B, C, D2) == 1)

    print("\nselftest:", "FAIL (" + ", ".join(fails) + ")" if fails else "PASS")
    return 1 if fails else 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description="wgmma k16 vs mma.sync m16n8k16 rounding probe")
    ap.add_argument("dir", nargs="?", default="build/packs", help="directory with k16_probe.sm_90a.cubin")
    ap.add_argument("--trials", type=int, default=2048, help="wgmma tiles per case and K (4 trials each)")
    ap.add_argument("--cases", default=None, help="comma list of cases (default all): " + ",".join(CASES))
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--selftest", action="store_true", help="CPU-only self test (no GPU)")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be >= 1")
    if args.cases:
        unknown = [c for c in args.cases.split(",") if c not in CASES]
        if unknown:
            ap.error(f"unknown cases {unknown}; known: {','.join(CASES)}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.selftest:
        return selftest()
    return run_gpu(args)


if __name__ == "__main__":
    sys.exit(main())
