#!/usr/bin/env python3
"""CPU model (numpy only, no GPU) of the index arithmetic of the qwen3 GEMM kernels.

It replays, thread by thread, what gemm_skinny.cu, gemm_bf16.cu and gemm_wgmma.cu compute —
which global element each lane loads, where it lands in shared memory (swizzle), what
ldmatrix / mma.m16n8k16 / wgmma see, and where the epilogue stores — using the fragment
layouts of the PTX ISA, and compares with x·Wᵀ+bias. It catches indexing slips (wrong lane
role, swizzle mismatch, K permutation, tail masks); it cannot catch a misreading of the
hardware semantics it models, which only gemm_verify.py on the GPU can.

usage: python3 packs/qwen3/tests/gemm_emulate.py     (prints PASS/FAIL per case; ~1 min)
"""
import sys

import numpy as np


def cdiv(a, b):
    return (a + b - 1) // b


def mma16816(afr, bfr, acc):
    """afr[32][4][2], bfr[32][2][2] (register = pair of bf16 values, low half first), acc[32][4]."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        A[g, 2 * q:2 * q + 2] = afr[lane][0]
        A[g + 8, 2 * q:2 * q + 2] = afr[lane][1]
        A[g, 2 * q + 8:2 * q + 10] = afr[lane][2]
        A[g + 8, 2 * q + 8:2 * q + 10] = afr[lane][3]
        B[2 * q:2 * q + 2, g] = bfr[lane][0]
        B[2 * q + 8:2 * q + 10, g] = bfr[lane][1]
    C = A @ B
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        acc[lane] += [C[g, 2 * q], C[g, 2 * q + 1], C[g + 8, 2 * q], C[g + 8, 2 * q + 1]]


def vec16(arr, row, k, ok):
    """16-byte load of 8 bf16 -> 4 registers of 2 values."""
    if not ok:
        return np.zeros((4, 2))
    return arr[row, k:k + 8].reshape(4, 2)


# ------------------------------------------------------------------------------ gemm_skinny.cu
def skinny(x, W, bias, M, N, K, MT, U):
    y = np.full((M, N), np.nan)
    for blk in range(cdiv(N, 16)):
        n0 = blk * 16
        for m0 in range(0, M, 8 * MT):
            red = np.zeros((8, MT * 4, 32))
            for warp in range(8):
                acc = np.zeros((MT, 32, 4))
                kb = warp * 64
                while kb < K:
                    for u in range(U):
                        wa = np.zeros((32, 2, 4, 2))
                        wb = np.zeros((32, 2, 4, 2))
                        xv = np.zeros((MT, 32, 2, 4, 2))
                        for lane in range(32):
                            g, q = lane >> 2, lane & 3
                            for h in range(2):
                                k = kb + u * 512 + h * 32
                                kv = k + q * 8 < K
                                wa[lane, h] = vec16(W, n0 + g, k + q * 8, kv and n0 + g < N)
                                wb[lane, h] = vec16(W, n0 + g + 8, k + q * 8, kv and n0 + g + 8 < N)
                                for t in range(MT):
                                    tok = m0 + 8 * t + g
                                    xv[t, lane, h] = vec16(x, tok, k + q * 8, tok < M and k + q * 8 < K)
                        for h in range(2):
                            for t in range(MT):
                                for j in range(2):
                                    afr = [[wa[l, h, 2 * j], wb[l, h, 2 * j], wa[l, h, 2 * j + 1], wb[l, h, 2 * j + 1]]
                                           for l in range(32)]
                                    bfr = [[xv[t, l, h, 2 * j], xv[t, l, h, 2 * j + 1]] for l in range(32)]
                                    mma16816(afr, bfr, acc[t])
                    kb += 512 * U
                for t in range(MT):
                    for i in range(4):
                        red[warp, t * 4 + i, :] = acc[t, :, i]
            for idx in range(MT * 4 * 32):
                ti, ln = idx >> 5, idx & 31
                s = red[:, ti, ln].sum()
                t, i = ti >> 2, ti & 3
                row = n0 + (ln >> 2) + (8 if i & 2 else 0)
                tok = m0 + 8 * t + 2 * (ln & 3) + (i & 1)
                if row < N and tok < M:
                    y[tok, row] = s + (bias[row] if bias is not None else 0.0)
    return y


# ------------------------------------------------------------------------------ shared memory
def swz(row, chunk):
    return row * 128 + ((chunk ^ (row & 7)) << 4)


class Smem:
    """Byte-addressed shared memory holding bf16 values (stored per 2-byte slot)."""

    def __init__(self, nbytes):
        self.v = np.full(nbytes // 2, np.nan)

    def store16(self, addr, vals8):
        assert addr % 16 == 0
        self.v[addr // 2:addr // 2 + 8] = vals8

    def load(self, addr, n):
        assert addr % 2 == 0
        return self.v[addr // 2:addr // 2 + n]


def load_tile(sm, base, src, r0, rows_total, K, k0, nrows):
    """The cp.async loader of gemm_bf16.cu / gemm_wgmma.cu: 256 threads, chunk lc of rows lr+32i."""
    for tid in range(256):
        lc, lr = tid & 7, tid >> 3
        for i in range(nrows // 32):
            r = lr + 32 * i
            ok = (k0 + lc * 8 < K) and (r0 + r < rows_total)
            vals = src[r0 + r, k0 + lc * 8:k0 + lc * 8 + 8] if ok else np.zeros(8)
            sm.store16(base + swz(lr, lc) + i * 32 * 128, vals)


def ldmatrix_x4(sm, addrs):
    """addrs[32]: lane l gives row l%8 of matrix l//8. Returns regs[32][4] (pairs)."""
    mats = [[sm.load(addrs[8 * j + r], 8) for r in range(8)] for j in range(4)]
    out = []
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        out.append([mats[j][g][2 * q:2 * q + 2] for j in range(4)])
    return out


# ------------------------------------------------------------------------------ gemm_bf16.cu
def tile_coords(bx, by, gx, gy, group=16):
    lin = by * gx + bx
    per = group * gy
    first = (lin // per) * group
    gm = min(gx - first, group)
    ing = lin % per
    return first + ing % gm, ing // gm


def gemm_mma(x, W, bias, M, N, K):
    y = np.full((M, N), np.nan)
    gx, gy = cdiv(M, 128), cdiv(N, 128)
    seen = set()
    for by in range(gy):
        for bx in range(gx):
            tm, tn = tile_coords(bx, by, gx, gy)
            assert (tm, tn) not in seen and tm < gx and tn < gy
            seen.add((tm, tn))
            m0, n0 = tm * 128, tn * 128
            acc = np.zeros((8, 4, 4, 32, 4))  # warp, i, j, lane, r
            for kt in range(cdiv(K, 64)):
                sm = Smem(32768)
                load_tile(sm, 0, x, m0, M, K, kt * 64, 128)
                load_tile(sm, 16384, W, n0, N, K, kt * 64, 128)
                for warp in range(8):
                    wm, wn = warp >> 2, warp & 3
                    for kk in range(4):
                        af = []
                        for i in range(4):
                            addrs = []
                            for lane in range(32):
                                r = wm * 64 + (lane & 15) + i * 16
                                addrs.append(swz(r, kk * 2 + (lane >> 4)))
                            af.append(ldmatrix_x4(sm, addrs))
                        bf = [None] * 4
                        for p in range(2):
                            addrs = []
                            for lane in range(32):
                                r = wn * 32 + (lane & 7) + ((lane >> 4) << 3) + p * 16
                                addrs.append(16384 + swz(r, kk * 2 + ((lane >> 3) & 1)))
                            regs = ldmatrix_x4(sm, addrs)
                            bf[2 * p] = [[regs[l][0], regs[l][1]] for l in range(32)]
                            bf[2 * p + 1] = [[regs[l][2], regs[l][3]] for l in range(32)]
                        for i in range(4):
                            for j in range(4):
                                mma16816(af[i], bf[j], acc[warp, i, j])
            for warp in range(8):
                wm, wn = warp >> 2, warp & 3
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    for j in range(4):
                        col = n0 + wn * 32 + j * 8 + 2 * q
                        for i in range(4):
                            for h in range(2):
                                row = m0 + wm * 64 + i * 16 + g + 8 * h
                                for e in range(2):
                                    if row < M and col + e < N:
                                        y[row, col + e] = acc[warp, i, j, lane, 2 * h + e] + (
                                            bias[col + e] if bias is not None else 0.0)
    return y


# ------------------------------------------------------------------------------ gemm_wgmma.cu
def wgmma_operand(sm, start, rows, sbo=1024):
    """Model of a K-major, 128B-swizzled smem operand of `rows` x k16 at descriptor address
    `start`: element (r, k) sits at start + (r//8)*SBO + (r%8)*128 + 2k, then byte-address bits
    [4:6] ^= bits [7:9]."""
    out = np.zeros((rows, 16))
    for r in range(rows):
        for k in range(16):
            a = start + (r // 8) * sbo + (r % 8) * 128 + 2 * k
            a ^= ((a >> 7) & 7) << 4
            out[r, k] = sm.v[a // 2]
    return out


def gemm_wgmma(x, W, bias, M, N, K, BN):
    y = np.full((M, N), np.nan)
    gx, gy = cdiv(M, 128), cdiv(N, BN)
    A_BYTES = 128 * 64 * 2
    for by in range(gy):
        for bx in range(gx):
            tm, tn = tile_coords(bx, by, gx, gy)
            m0, n0 = tm * 128, tn * BN
            acc = np.zeros((2, 128, BN // 2))  # warpgroup, thread, register
            for kt in range(cdiv(K, 64)):
                sm = Smem(A_BYTES + BN * 128)
                load_tile(sm, 0, x, m0, M, K, kt * 64, 128)
                load_tile(sm, A_BYTES, W, n0, N, K, kt * 64, BN)
                for wg in range(2):
                    for kk in range(4):
                        A = wgmma_operand(sm, wg * 64 * 128 + kk * 32, 64)
                        B = wgmma_operand(sm, A_BYTES + kk * 32, BN)
                        D = A @ B.T  # 64 x BN
                        for t in range(128):
                            w, lane = t >> 5, t & 31
                            g, q = lane >> 2, lane & 3
                            for i in range(BN // 2):
                                row = 16 * w + g + 8 * ((i >> 1) & 1)
                                col = 8 * (i >> 2) + 2 * q + (i & 1)
                                acc[wg, t, i] += D[row, col]
            for wg in range(2):
                for t in range(128):
                    wq, lane = t >> 5, t & 31
                    g, q = lane >> 2, lane & 3
                    row0 = m0 + wg * 64 + wq * 16 + g
                    for j in range(BN // 8):
                        col = n0 + j * 8 + 2 * q
                        for h in range(2):
                            for e in range(2):
                                row = row0 + 8 * h
                                if row < M and col + e < N:
                                    y[row, col + e] = acc[wg, t, 4 * j + 2 * h + e] + (
                                        bias[col + e] if bias is not None else 0.0)
    return y


def main():
    rng = np.random.default_rng(0)
    fails = 0

    def check(name, y, x, W, bias):
        nonlocal fails
        ref = x @ W.T + (bias if bias is not None else 0.0)
        err = np.nanmax(np.abs(y - ref)) if not np.isnan(y).any() else float("inf")
        ok = err < 1e-9 * max(1.0, np.abs(ref).max())
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name} M={x.shape[0]} N={W.shape[0]} K={x.shape[1]} "
              f"bias={bias is not None} maxerr={err:.2e} nan={int(np.isnan(y).sum())}", flush=True)

    for (M, N, K) in [(1, 24, 136), (3, 40, 1000), (8, 16, 64), (13, 33, 520), (70, 17, 8)]:
        x, W = rng.standard_normal((M, K)), rng.standard_normal((N, K))
        b = rng.standard_normal(N)
        for MT, U in ((1, 4), (2, 4), (8, 4)):
            check(f"skinny MT={MT}", skinny(x, W, b if M % 2 else None, M, N, K, MT, U), x, W, b if M % 2 else None)
    for (M, N, K) in [(130, 136, 72), (5, 200, 1000), (257, 129, 136)]:
        x, W = rng.standard_normal((M, K)), rng.standard_normal((N, K))
        b = rng.standard_normal(N)
        check("gemm_bf16", gemm_mma(x, W, b, M, N, K), x, W, b)
    for (M, N, K, BN) in [(130, 264, 72, 256), (5, 136, 136, 128), (200, 40, 1000, 256)]:
        x, W = rng.standard_normal((M, K)), rng.standard_normal((N, K))
        b = rng.standard_normal(N)
        check(f"gemm_wgmma BN={BN}", gemm_wgmma(x, W, None, M, N, K, BN), x, W, None)
    print("RESULT:", "FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
