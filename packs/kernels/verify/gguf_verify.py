#!/usr/bin/env python3
"""GPU check and timing of gemv_gguf.cu: the GGUF-native decode GEMVs gemv_<t> (4 warps) and
gemv_<t>_w8 (8 warps), with their _f32out twins, and the dequant_<t>_bf16 kernels (KERNELS.md,
"GGUF-native GEMVs and dequantization"), t = q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k.

usage: python3 packs/kernels/verify/gguf_verify.py [CUBIN_DIR] [--no-timing] [--quick]
                                                   [--types q4_k,q6_k,...] [--timing-types ...]
       python3 packs/kernels/verify/gguf_verify.py --selftest     # CPU only: the numpy reference

CUBIN_DIR (default build/packs) must hold gemv_gguf.sm_90a.cubin (packs/kernels/build.sh); a
missing file or entry is a FAIL. Needs torch, cupy and numpy (as gemm_verify.py). Checks, one
PASS/FAIL line each:
  known answers  dequant_<t>_bf16 on scripts/gen-gguf-quants.py's blocks (random and edge blocks:
                 every f16 special in every scale field, NaN payloads) equals bf16 of gguf-py's own
                 float32 dequantization bit for bit (the `half` crate's rounding, NaN -> bits>>16 | 0x40),
                 written at a row offset with guard rows untouched. The data dir is
                 $KERN_TEST_DATA/gguf-quants (default build/test-data/gguf-quants); missing data is
                 SKIPPED unless KERN_REQUIRE_TEST_DATA=1 (then a FAIL).
  dequant        random blocks (finite scales) at Qwen shapes: bits equal bf16 of the numpy
                 reference (this file's, written from gguf-py's quants.py; --selftest compares it
                 with gguf-py where the gguf package is importable, and with the known answers).
  gemv           f32out within (K/16 + 16)·2^-22 · Σ|x|·(|d·sc·q| + |min|) of an fp64 reference
                 (x · dequantized W, + bias), for M = 1, 3, 8, 11; the bf16 entry equals
                 bf16(f32out) bit for bit; batch invariance (a row's bits alone, at M = 8 and in
                 the second pass of M = 11 are the same); a fused qkv row buffer written by three
                 GEMVs of different types through ldy / col0; NaN-poisoned outputs with a guard
                 row: nothing outside the block written changes.
The timing table last (unless --no-timing): every GEMV family at the Qwen3-4B shapes (q 4096 x
2560, k/v 1024 x 2560, o 2560 x 4096, gate/up 9728 x 2560, down 2560 x 9728, and the tied LM head
151936 x 2560 with f32 out), M = 1 and 8: median µs of 50 launches (CUDA events, back to back
behind a GPU sleep, weights rotated through >= 256 MB of copies so L2 cannot serve them), the
quantized bytes, GB/s and the fraction of the 4.8 TB/s floor; a bf16 torch.matmul (cuBLAS) of the
same shape for comparison; the dequant kernels' GB/s; and a GEMV-only estimate of a Qwen3-4B
Q4_K_M decode step (llama.cpp's Q4_K_M layout: Q6_K attn_v / ffn_down on the "more bits" layers,
Q6_K LM head). Exit status 1 on any FAIL.
"""
import argparse
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

# name -> (ggml name, elements per block, bytes per block, elements per GEMV unit, unit alignment, f16 fields)
TYPES = {
    "q4_0": ("Q4_0", 32, 18, 128, 2, [0]),
    "q4_1": ("Q4_1", 32, 20, 128, 4, [0, 2]),
    "q5_0": ("Q5_0", 32, 22, 128, 2, [0]),
    "q5_1": ("Q5_1", 32, 24, 128, 8, [0, 2]),
    "q8_0": ("Q8_0", 32, 34, 128, 2, [0]),
    "q2_k": ("Q2_K", 256, 84, 256, 4, [80, 82]),
    "q3_k": ("Q3_K", 256, 110, 256, 2, [108]),
    "q4_k": ("Q4_K", 256, 144, 256, 16, [0, 2]),
    "q5_k": ("Q5_K", 256, 176, 256, 16, [0, 2]),
    "q6_k": ("Q6_K", 256, 210, 256, 2, [208]),
}
FLOOR_BW = 4.8e12  # H200 HBM3e, the "floor of the quantized bytes"
POISON16 = 0x7FC1
POISON32 = 0x7FC00123


def cdiv(a, b):
    return (a + b - 1) // b


def smem_bytes(t, warps, stages=3):
    """gemv_gguf.cu's Geo<T, WARPS, 3>::SMEM and the dynamic bytes a launch must pass."""
    _, be, bb, ue, align, _ = TYPES[t]
    ub = (ue // be) * bb
    pieces = ((16 - align + ub + 15) // 16) | 1
    total = warps * stages * 16 * 16 * pieces + 16
    return total, (total if total > 48 * 1024 else 0)


# ------------------------------------------------------------------ numpy reference (quants.py's formulas)
def _np():
    import numpy as np
    return np


def _half(b, off):
    np = _np()
    return b[:, off:off + 2].copy().view("<f2").astype(np.float32)  # (nb, 1), numpy's exact widening


def ref_dequant(t, blocks):
    """blocks: uint8 (nb, bb) -> (values float32 (nb, be), mag float32 (nb, be)): gguf-py's float32
    arithmetic in its order; mag = |first term| + |second term| of x = a ± b (the GEMV error bound)."""
    np = _np()
    name, be, bb, _, _, _ = TYPES[t]
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, bb)
    f32 = np.float32
    with np.errstate(all="ignore"):
        if t in ("q4_0", "q4_1", "q5_0", "q5_1"):
            m1, q5 = t.endswith("1"), t.startswith("q5")
            d = _half(b, 0)
            qh_off = 4 if m1 else 2
            qs = b[:, qh_off + (4 if q5 else 0):][:, :16]
            q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int16)
            if q5:
                qh = b[:, qh_off:qh_off + 4].copy().view("<u4")
                q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16) << 4)
            if m1:
                a = d * q.astype(f32)
                m = _half(b, 2)
                return a + m, np.abs(a) + np.abs(m)
            v = d * (q - (16 if q5 else 8)).astype(f32)
            return v, np.abs(v)
        if t == "q8_0":
            v = b[:, 2:34].copy().view(np.int8).astype(f32) * _half(b, 0)
            return v, np.abs(v)
        e = np.arange(256)
        j = e // 16
        idx2 = 32 * (e // 128) + e % 32          # Q2_K / Q3_K / Q6_K: qs byte within a 128-half
        sh2 = 2 * ((e % 128) // 32)
        if t == "q2_k":
            sc, qs = b[:, :16], b[:, 16:80]
            dl = _half(b, 80) * (sc & 15).astype(f32)
            ml = _half(b, 82) * (sc >> 4).astype(f32)
            a = dl[:, j] * ((qs[:, idx2] >> sh2) & 3).astype(f32)
            return a - ml[:, j], np.abs(a) + np.abs(ml[:, j])
        if t == "q3_k":
            hm, qs, sc = b[:, :32], b[:, 32:96], b[:, 96:108]
            jj = np.arange(16)
            ls = (sc[:, jj % 8] >> (4 * (jj // 8))) & 15
            hs = (sc[:, 8 + jj % 4] >> (2 * (jj // 4))) & 3
            s = ((ls | (hs << 4)).astype(np.int16) - 32).astype(f32)
            dl = _half(b, 108) * s
            ql = ((qs[:, idx2] >> sh2) & 3).astype(np.int16)
            h = ((hm[:, e % 32] >> (e // 32)) & 1).astype(np.int16)
            v = dl[:, j] * (ql - 4 * (1 - h)).astype(f32)
            return v, np.abs(v)
        if t in ("q4_k", "q5_k"):
            s = b[:, 4:16]
            sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 2) & 48)], axis=1)
            mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 2) & 48)], axis=1)
            dl = _half(b, 0) * sc.astype(f32)
            dm = _half(b, 2) * mn.astype(f32)
            k, l = e // 32, e % 32
            qs = b[:, 48:176] if t == "q5_k" else b[:, 16:144]
            q = ((qs[:, 32 * (k // 2) + l] >> (4 * (k % 2))) & 15).astype(np.int16)
            if t == "q5_k":
                q |= (((b[:, 16:48][:, l] >> k) & 1).astype(np.int16) << 4)
            a = dl[:, k] * q.astype(f32)
            return a - dm[:, k], np.abs(a) + np.abs(dm[:, k])
        if t == "q6_k":
            ql, qh = b[:, :128], b[:, 128:192]
            dl = _half(b, 208) * b[:, 192:208].copy().view(np.int8).astype(f32)
            half, r = e // 128, e % 128
            lo = (ql[:, 64 * half + r % 64] >> (4 * (r // 64))) & 15
            hi = (qh[:, 32 * half + r % 32] >> (2 * (r // 32))) & 3
            q = (lo | (hi << 4)).astype(np.int16) - 32
            v = dl[:, j] * q.astype(f32)
            return v, np.abs(v)
    raise ValueError(t)


def bf16_bits(v):
    """float32 array -> uint16 bf16 bits, the `half` crate's rounding (NaN -> bits >> 16 | 0x40)."""
    np = _np()
    u = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = np.where(nan, (u >> 16) | 0x40, r)
    return (r & 0xFFFF).astype(np.uint16)


def rand_blocks(t, nblocks, rng):
    """Random bytes with finite, moderate f16 fields (d ~ 2^-9 .. 2^-6; mins of either sign)."""
    np = _np()
    name, be, bb, _, _, halves = TYPES[t]
    b = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
    for i, off in enumerate(halves):
        neg = (i == 1 and name[1] in "45") or (i == 0 and be == 32 and not name.endswith("1"))
        e = rng.integers(-9, -5, size=nblocks)
        mant = rng.integers(0, 1024, size=nblocks)
        sign = (rng.integers(0, 2, size=nblocks) * 0x8000) if neg else 0
        h = (sign | ((e + 15) << 10) | mant).astype("<u2")
        b[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    return b


def test_data_dir():
    base = os.environ.get("KERN_TEST_DATA") or os.path.join(REPO, "build", "test-data")
    return os.path.join(base, "gguf-quants")


def read_gguf_tensors(path):
    """Minimal GGUF reader: {name: (dims, ggml type, raw bytes)}."""
    data = open(path, "rb").read()
    pos = 0

    def get(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = get("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(ty):
        nonlocal pos
        if ty == 8:
            string()
        elif ty == 9:
            et, n = get("I"), get("Q")
            for _ in range(n):
                skip(et)
        else:
            pos += sizes[ty]

    if get("I") != 0x46554747:
        raise ValueError("not a GGUF file")
    get("I")
    nt, nkv = get("Q"), get("Q")
    align = 32
    for _ in range(nkv):
        key, ty = string(), get("I")
        if key == "general.alignment" and ty == 4:
            align = get("I")
        else:
            skip(ty)
    infos = []
    for _ in range(nt):
        name = string()
        nd = get("I")
        dims = [get("Q") for _ in range(nd)]
        infos.append((name, dims, get("I"), get("Q")))
    start = cdiv(pos, align) * align
    out = {}
    for name, dims, ty, off in infos:
        out[name] = (dims, ty, start + off)
    return out, data


def known_answer_sets():
    """[(t, blocks (rows, bytes), npy float32 (rows, cols))] from gen-gguf-quants' output, or None."""
    np = _np()
    d = test_data_dir()
    if not os.path.exists(os.path.join(d, "quants.gguf")):
        return None
    tensors, data = read_gguf_tensors(os.path.join(d, "quants.gguf"))
    out = []
    for t, (name, be, bb, _, _, _) in TYPES.items():
        dims, _, off = tensors[name]
        cols, rows = dims[0], dims[1]
        nbytes = rows * cols // be * bb
        raw = np.frombuffer(data, dtype=np.uint8, count=nbytes, offset=off).reshape(rows, cols // be * bb)
        ref = np.load(os.path.join(d, name + ".npy"))
        out.append((t, raw, ref))
    return out


def selftest():
    """CPU: this file's reference vs gguf-py (when importable) on random blocks, and vs the known answers."""
    np = _np()
    rng = np.random.default_rng(7)
    fails = 0
    try:
        import gguf
        from gguf import GGMLQuantizationType as Q
    except Exception as e:  # noqa: BLE001
        gguf = None
        print(f"SKIPPED gguf-py comparison: {e!r}")
    for t in TYPES:
        raw = rng.integers(0, 256, size=(257, TYPES[t][2]), dtype=np.uint8)
        raw = np.concatenate([raw, rand_blocks(t, 64, rng)])
        v, _ = ref_dequant(t, raw)
        if gguf is not None:
            with np.errstate(all="ignore"):
                g = gguf.quants.dequantize(raw.reshape(-1), Q[TYPES[t][0]]).reshape(v.shape)
            ok = np.array_equal(v.view(np.uint32), g.view(np.uint32))
            print(f"{'PASS' if ok else 'FAIL'} reference {t} == gguf-py dequantize (f32 bits, {len(raw)} blocks)")
            fails += not ok
    sets = known_answer_sets()
    if sets is None:
        print(f"SKIPPED known answers: no {test_data_dir()}/quants.gguf")
    else:
        for t, raw, ref in sets:
            v, _ = ref_dequant(t, raw.reshape(-1, TYPES[t][2]))
            ok = np.array_equal(v.reshape(ref.shape).view(np.uint32), ref.view(np.uint32))
            print(f"{'PASS' if ok else 'FAIL'} reference {t} == gen-gguf-quants' {TYPES[t][0]}.npy (f32 bits)")
            fails += not ok
    return fails


# ------------------------------------------------------------------ GPU harness
class Harness:
    def __init__(self, cubin_dir, args):
        import cupy
        import numpy as np
        import torch
        self.cupy, self.np, self.torch, self.args = cupy, np, torch, args
        self.dev = torch.device("cuda")
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        self.fails = self.passes = self.skips = 0
        self.fns, self.missing = {}, []
        path = os.path.join(cubin_dir, "gemv_gguf.sm_90a.cubin")
        if not os.path.exists(path):
            self.missing.append(f"no file {path}")
            return
        mod = cupy.RawModule(path=path)
        for t in TYPES:
            for fam, warps in (("", 4), ("_w8", 8)):
                for out in ("", "_f32out"):
                    name = f"gemv_{t}{fam}{out}"
                    try:
                        f = mod.get_function(name)
                        dyn = smem_bytes(t, warps)[1]
                        if dyn:
                            try:
                                f.max_dynamic_shared_size_bytes = dyn
                            except AttributeError:  # older cupy (as gemm_verify.py)
                                cupy.cuda.driver.funcSetAttribute(
                                    f.kernel.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dyn)
                        self.fns[name] = (f, warps, dyn)
                    except Exception as e:  # noqa: BLE001
                        self.missing.append(f"{name}: {e!r}")
            name = f"dequant_{t}_bf16"
            try:
                self.fns[name] = (mod.get_function(name), 8, 0)
            except Exception as e:  # noqa: BLE001
                self.missing.append(f"{name}: {e!r}")

    def report(self, ok, what):
        print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
        if ok:
            self.passes += 1
        else:
            self.fails += 1

    def p(self, t):
        return self.np.uint64(0 if t is None else t.data_ptr())

    def i(self, v):
        return self.np.int32(v)

    def gemv(self, t, fam, f32, x, W, bias, y, M, N, K, ldy, col0):
        name = f"gemv_{t}{fam}{'_f32out' if f32 else ''}"
        f, warps, dyn = self.fns[name]
        with self.stream:
            f((cdiv(N, 16), 1, 1), (32 * warps, 1, 1),
              (self.p(x), self.p(W), self.p(bias), self.p(y), self.i(M), self.i(N), self.i(K), self.i(ldy), self.i(col0)),
              shared_mem=dyn)

    def dequant(self, t, W, dst, N, K, row0):
        f = self.fns[f"dequant_{t}_bf16"][0]
        with self.stream:
            f((cdiv(N * K, 2048), 1, 1), (256, 1, 1), (self.p(W), self.p(dst), self.i(N), self.i(K), self.i(row0)))

    # -- data
    def weights(self, t, N, K, rng):
        """(W on the device as uint8 [N, bytes per row], dequantized float32 [N, K], mag [N, K]) (numpy)."""
        np, torch = self.np, self.torch
        _, be, bb, _, _, _ = TYPES[t]
        raw = rand_blocks(t, N * K // be, rng)
        v, mag = ref_dequant(t, raw)
        Wd = torch.from_numpy(raw.reshape(N, K // be * bb)).to(self.dev)
        return Wd, v.reshape(N, K), mag.reshape(N, K)

    def xrows(self, M, K, gen):
        return torch_randn(self.torch, (M, K), gen, self.dev).to(self.torch.bfloat16)

    # -- checks
    def check_known_answers(self):
        np, torch = self.np, self.torch
        sets = known_answer_sets()
        if sets is None:
            msg = f"{test_data_dir()}/quants.gguf is missing: run scripts/gen-gguf-quants.py"
            if os.environ.get("KERN_REQUIRE_TEST_DATA"):
                self.report(False, "known answers: " + msg)
            else:
                print("SKIPPED known answers: " + msg)
                self.skips += 1
            return
        for t, raw, ref in sets:
            N, K = ref.shape
            W = torch.from_numpy(np.ascontiguousarray(raw)).to(self.dev)
            dst = torch.full((N + 5, K), POISON16, dtype=torch.int16, device=self.dev)
            self.dequant(t, W, dst, N, K, 3)
            torch.cuda.synchronize()
            got = dst.cpu().numpy().view(np.uint16)
            want = np.full((N + 5, K), POISON16, np.uint16)
            want[3:3 + N] = bf16_bits(ref)
            bad = int((got != want).sum())
            nan = int(np.isnan(ref).sum())
            self.report(bad == 0, f"known answers dequant_{t}_bf16 == bf16(gguf-py) {N} x {K} at row 3 ({nan} NaN values)"
                        + (f": {bad} differ" if bad else ""))

    def check_dequant(self, t, N, K, rng):
        np, torch = self.np, self.torch
        W, v, _ = self.weights(t, N, K, rng)
        dst = torch.full((N + 3, K), POISON16, dtype=torch.int16, device=self.dev)
        self.dequant(t, W, dst, N, K, 1)
        torch.cuda.synchronize()
        got = dst.cpu().numpy().view(np.uint16)
        want = np.full((N + 3, K), POISON16, np.uint16)
        want[1:1 + N] = bf16_bits(v)
        bad = int((got != want).sum())
        self.report(bad == 0, f"dequant_{t}_bf16 {N} x {K} at row 1 == bf16(reference)" + (f": {bad} differ" if bad else ""))

    def run_gemv(self, t, fam, x, W, bias, M, N, K, ldy, col0, yb=None, yf=None):
        torch = self.torch
        if yb is None:
            yb = torch.full((M + 1, ldy), POISON16, dtype=torch.int16, device=self.dev)
            yf = torch.full((M + 1, ldy), POISON32, dtype=torch.int32, device=self.dev)
        self.gemv(t, fam, False, x, W, bias, yb, M, N, K, ldy, col0)
        self.gemv(t, fam, True, x, W, bias, yf, M, N, K, ldy, col0)
        return yb, yf

    def compare(self, x, v, mag, bias, yb, yf, M, N, K, col0):
        """'' or why: f32 within tolerance of fp64, bf16 == bf16(f32)."""
        torch = self.torch
        xd = x[:M].double()
        Wd = torch.from_numpy(v).to(self.dev).double()
        Md = torch.from_numpy(mag).to(self.dev).double()
        ref = xd @ Wd.t()
        bound = xd.abs() @ Md.t()
        if bias is not None:
            ref += bias.double()
            bound += bias.double().abs()
        tol = (K / 16.0 + 16.0) * 2.0 ** -22 * bound + 1e-30
        f = yf[:M, col0:col0 + N].view(torch.float32).double()
        err = (f - ref).abs()
        ratio = float((err / tol).max().item())
        self.worst = max(getattr(self, "worst", 0.0), ratio)
        if not ratio <= 1.0 or bool(torch.isnan(f).any()):
            i = int((err / tol).argmax().item())
            m, n = divmod(i, N)
            return f"f32 out of tolerance: row {m} col {n}: {f[m, n].item():.9g} vs fp64 {ref[m, n].item():.9g} (err/tol {ratio:.3g})"
        b16 = yb[:M, col0:col0 + N]
        round_f = yf[:M, col0:col0 + N].view(torch.float32).to(torch.bfloat16).view(torch.int16)
        nb = int((b16 != round_f).sum().item())
        if nb:
            return f"{nb} bf16 outputs differ from bf16(f32out)"
        return ""

    def untouched(self, yb, yf, M, col0, N):
        torch = self.torch
        mb = torch.ones_like(yb, dtype=torch.bool)
        mb[:M, col0:col0 + N] = False
        return bool((yb[mb] == POISON16).all().item()) and bool((yf[mb] == POISON32).all().item())

    def check_gemv(self, t, fam, N, K, wts, gen, with_bias):
        torch = self.torch
        W, v, mag = wts
        x = self.xrows(11, K, gen)
        bias = (torch_randn(torch, (N,), gen, self.dev) * 0.5).to(torch.bfloat16) if with_bias else None
        ldy, col0 = N + 5, 2
        why, rows = "", {}
        for M in (1, 3, 8, 11):
            yb, yf = self.run_gemv(t, fam, x, W, bias, M, N, K, ldy, col0)
            torch.cuda.synchronize()
            w = self.compare(x, v, mag, bias, yb, yf, M, N, K, col0)
            if not w and not self.untouched(yb, yf, M, col0, N):
                w = "wrote outside rows < M / columns col0 .. col0+N-1"
            if w and not why:
                why = f"M={M}: {w}"
            rows[M] = (yb[:M, col0:col0 + N].clone(), yf[:M, col0:col0 + N].clone())
        self.report(not why, f"gemv_{t}{fam} (+_f32out) N={N} K={K}{' +bias' if with_bias else ''} M=1,3,8,11 vs fp64"
                    + (f": {why}" if why else ""))
        same = True
        for M in (3, 8, 11):
            same &= bool(torch.equal(rows[M][0][:3], rows[3][0])) and bool(torch.equal(rows[M][1][:3], rows[3][1]))
        same &= bool(torch.equal(rows[1][0], rows[8][0][:1])) and bool(torch.equal(rows[1][1], rows[8][1][:1]))
        yb, yf = self.run_gemv(t, fam, x[8:11].contiguous(), W, bias, 3, N, K, N, 0)
        same &= bool(torch.equal(yb[:3], rows[11][0][8:11])) and bool(torch.equal(yf[:3], rows[11][1][8:11]))
        yb, yf = self.run_gemv(t, fam, x[5:6].contiguous(), W, bias, 1, N, K, N, 0)
        same &= bool(torch.equal(yb[:1], rows[8][0][5:6])) and bool(torch.equal(yf[:1], rows[8][1][5:6]))
        torch.cuda.synchronize()
        self.report(same, f"gemv_{t}{fam} N={N} K={K} batch invariance: a row's bits alone, at M = 3, 8 and in pass 2 of M = 11")

    def check_fused(self, tq, tv, Nq, Nkv, K, rng, gen, fam=""):
        torch = self.torch
        q, k, vv = self.weights(tq, Nq, K, rng), self.weights(tq, Nkv, K, rng), self.weights(tv, Nkv, K, rng)
        M, ldy = 5, Nq + 2 * Nkv
        x = self.xrows(M, K, gen)
        yb = torch.full((M + 1, ldy), POISON16, dtype=torch.int16, device=self.dev)
        yf = torch.full((M + 1, ldy), POISON32, dtype=torch.int32, device=self.dev)
        for (t, (W, _, _), n, c0) in ((tq, q, Nq, 0), (tq, k, Nkv, Nq), (tv, vv, Nkv, Nq + Nkv)):
            self.run_gemv(t, fam, x, W, None, M, n, K, ldy, c0, yb, yf)
        torch.cuda.synchronize()
        why = ""
        for (_, v, mag), n, c0 in ((q, Nq, 0), (k, Nkv, Nq), (vv, Nkv, Nq + Nkv)):
            why = why or self.compare(x, v, mag, None, yb, yf, M, n, K, c0)
        if not why and not self.untouched(yb, yf, M, 0, ldy):
            why = "the guard row was written"
        self.report(not why, f"fused qkv row buffer{fam}: q {tq} [{Nq}], k {tq} [{Nkv}], v {tv} [{Nkv}], K={K}, M={M}"
                    + (f": {why}" if why else ""))

    def checks(self):
        np, torch = self.np, self.torch
        rng = np.random.default_rng(2026)
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(1234)
        self.check_known_answers()
        types = self.args.types
        for t in types:
            be = TYPES[t][1]
            self.check_dequant(t, 1024, 2560, rng)
            self.check_dequant(t, 37, 4864 if be == 256 else 896, rng)
        for t in types:
            be = TYPES[t][1]
            if be == 256:
                shapes = [(1024, 2560, True), (2560, 9728, False), (77, 4864, True)]  # 4864: an odd count of super-blocks
            else:
                shapes = [(1024, 2560, True), (896, 4864, False), (77, 896 + 32 * 3, True)]  # a partial last unit
            if self.args.quick:
                shapes = shapes[:1] + shapes[2:]
            for N, K, b in shapes:
                wts = self.weights(t, N, K, rng)
                for fam in ("", "_w8"):
                    self.check_gemv(t, fam, N, K, wts, gen, b)
                del wts
        for fam in ("", "_w8"):
            self.check_fused("q4_k", "q6_k", 4096, 1024, 2560, rng, gen, fam)
            self.check_fused("q5_0", "q8_0", 896, 128, 896, rng, gen, fam)

    # -- timing
    def timed(self, launches, reps=50):
        torch = self.torch
        for _ in range(3):
            for f in launches:
                f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f in launches:
            f()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        sleep_cycles = int(max(host * 3.0 + 100e-6, 200e-6) * 2.0e9)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            torch.cuda._sleep(sleep_cycles)
            starts[r].record()
            for f in launches:
                f()
            ends[r].record()
        torch.cuda.synchronize()
        ts = sorted(s.elapsed_time(e) * 1e-3 / len(launches) for s, e in zip(starts, ends))
        return ts[len(ts) // 2]

    def bench(self):
        np, torch = self.np, self.torch
        rng = np.random.default_rng(5)
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(5)
        shapes = [("q", 4096, 2560), ("k/v", 1024, 2560), ("o", 2560, 4096), ("gate/up", 9728, 2560),
                  ("down", 2560, 9728), ("lm_head", 151936, 2560)]
        if self.args.quick:
            shapes = [s for s in shapes if s[0] in ("k/v", "gate/up", "down")]
        print("\n-- GEMV timing, Qwen3-4B shapes (median of 50 back-to-back launches behind a GPU sleep, weights rotated "
              "through >= 256 MB; GB/s = quantized bytes / time; %floor = (bytes / 4.8 TB/s) / time)")
        print(f"{'entry':24s} {'shape':8s} {'N':>6s} {'K':>5s} {'M':>2s} {'MB':>7s} {'us':>8s} {'GB/s':>6s} {'%floor':>6s}")
        best = {}  # (t, shape, M) -> best µs over the families
        for t in self.args.timing_types:
            _, be, bb, _, _, _ = TYPES[t]
            for label, N, K in shapes:
                f32 = label == "lm_head"
                nbytes = N * K // be * bb
                copies = max(1, min(16, cdiv(256 << 20, nbytes)))
                Ws = [torch.from_numpy(rand_blocks(t, N * K // be, rng).reshape(N, -1)).to(self.dev) for _ in range(copies)]
                for M in (1, 8):
                    x = self.xrows(M, K, gen)
                    y = torch.empty(M, N, dtype=torch.float32 if f32 else torch.bfloat16, device=self.dev)
                    for fam in ("", "_w8"):
                        name = f"gemv_{t}{fam}{'_f32out' if f32 else ''}"
                        try:
                            us = self.timed([lambda W=W, fam=fam: self.gemv(t, fam, f32, x, W, None, y, M, N, K, N, 0)
                                             for W in Ws]) * 1e6
                        except Exception as e:  # noqa: BLE001
                            print(f"{name:24s} {label:8s} {N:6d} {K:5d} {M:2d} ERROR {e!r}")
                            if "illegal" in repr(e).lower():
                                raise
                            continue
                        gbs = nbytes / us * 1e-3
                        floor_us = nbytes / FLOOR_BW * 1e6
                        print(f"{name:24s} {label:8s} {N:6d} {K:5d} {M:2d} {nbytes / 1e6:7.2f} {us:8.2f} {gbs:6.0f} "
                              f"{100 * floor_us / us:6.1f}", flush=True)
                        key = (t, label, M)
                        best[key] = min(best.get(key, 1e30), us)
                del Ws
                torch.cuda.empty_cache()
        # bf16 (the dequantized path) for comparison
        print(f"\n{'torch.matmul bf16':24s} {'shape':8s} {'N':>6s} {'K':>5s} {'M':>2s} {'MB':>7s} {'us':>8s} {'GB/s':>6s} {'%floor':>6s}")
        for label, N, K in shapes:
            nbytes = N * K * 2
            copies = max(1, min(16, cdiv(256 << 20, nbytes)))
            Ws = [torch.empty(N, K, dtype=torch.bfloat16, device=self.dev).normal_(0, 0.02, generator=gen) for _ in range(copies)]
            for M in (1, 8):
                x = self.xrows(M, K, gen)
                y = torch.empty(M, N, dtype=torch.bfloat16, device=self.dev)
                us = self.timed([lambda W=W: torch.matmul(x, W.t(), out=y) for W in Ws]) * 1e6
                print(f"{'':24s} {label:8s} {N:6d} {K:5d} {M:2d} {nbytes / 1e6:7.2f} {us:8.2f} {nbytes / us * 1e-3:6.0f} "
                      f"{100 * nbytes / FLOOR_BW * 1e6 / us:6.1f}", flush=True)
            del Ws
            torch.cuda.empty_cache()
        # dequantization
        print(f"\n{'dequant (bytes read + written)':32s} {'N':>6s} {'K':>5s} {'us':>8s} {'GB/s':>6s}")
        for t in self.args.timing_types:
            _, be, bb, _, _, _ = TYPES[t]
            N, K = 9728, 2560
            W = torch.from_numpy(rand_blocks(t, N * K // be, rng).reshape(N, -1)).to(self.dev)
            dst = torch.empty(N, K, dtype=torch.bfloat16, device=self.dev)
            us = self.timed([lambda: self.dequant(t, W, dst, N, K, 0)]) * 1e6
            nbytes = N * K // be * bb + N * K * 2
            print(f"dequant_{t}_bf16{'':16s} {N:6d} {K:5d} {us:8.2f} {nbytes / us * 1e-3:6.0f}", flush=True)
            del W, dst
        # a Qwen3-4B Q4_K_M decode step, GEMVs only (36 layers; llama.cpp's Q4_K_M: attn_v and ffn_down
        # in Q6_K on layers i < n/8, i >= 7n/8 and (i - n/8) % 3 == 2, the rest Q4_K; LM head Q6_K)
        if all((t, s, M) in best for t in ("q4_k", "q6_k") for s in ("q", "k/v", "o", "gate/up", "down", "lm_head")
               for M in (1, 8)):
            n = 36
            more = [i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2 for i in range(n)]
            for M in (1, 8):
                tot, byt = 0.0, 0
                for i in range(n):
                    vt = "q6_k" if more[i] else "q4_k"
                    for label, N, K, tt in (("q", 4096, 2560, "q4_k"), ("k/v", 1024, 2560, "q4_k"), ("k/v", 1024, 2560, vt),
                                            ("o", 2560, 4096, "q4_k"), ("gate/up", 9728, 2560, "q4_k"),
                                            ("gate/up", 9728, 2560, "q4_k"), ("down", 2560, 9728, vt)):
                        tot += best[(tt, label, M)]
                        byt += N * K // TYPES[tt][1] * TYPES[tt][2]
                tot += best[("q6_k", "lm_head", M)]
                byt += 151936 * 2560 // 256 * 210
                print(f"\nQwen3-4B Q4_K_M decode step, GEMVs only, M={M} ({sum(more)} of {n} layers with Q6_K v/down, best "
                      f"family per shape): {tot / 1e3:.3f} ms for {byt / 1e9:.3f} GB; floor {byt / FLOOR_BW * 1e3:.3f} ms "
                      f"= {100 * byt / FLOOR_BW * 1e6 / tot:.1f}% of it (issue target: <= 1.2 ms for the whole step)")


def torch_randn(torch, shape, gen, dev):
    return torch.randn(*shape, generator=gen, device=dev)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cubin_dir", nargs="?", default=os.path.join(REPO, "build", "packs"))
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--types", default=",".join(TYPES), help="types to check (default all)")
    ap.add_argument("--timing-types", default="q4_k,q6_k,q8_0,q5_0", help="types to time (default q4_k,q6_k,q8_0,q5_0)")
    ap.add_argument("--selftest", action="store_true", help="CPU only: the numpy reference vs gguf-py and the known answers")
    args = ap.parse_args()
    args.types = [t for t in args.types.split(",") if t]
    args.timing_types = [t for t in args.timing_types.split(",") if t]
    for t in args.types + args.timing_types:
        if t not in TYPES:
            sys.exit(f"unknown type {t} (types: {', '.join(TYPES)})")
    if args.selftest:
        sys.exit(1 if selftest() else 0)
    h = Harness(args.cubin_dir, args)
    for m in h.missing:
        h.report(False, f"missing: {m}")
    if not h.missing:
        h.checks()
        print(f"worst GEMV error / tolerance: {getattr(h, 'worst', 0.0):.3g}")
        if not args.no_timing:
            h.bench()
    print(f"\ngguf_verify: {h.passes} passed, {h.fails} failed, {h.skips} skipped")
    sys.exit(1 if h.fails else 0)


if __name__ == "__main__":
    main()
