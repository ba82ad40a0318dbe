#!/usr/bin/env python3
"""Correctness and speed of the qwen3 pack's GEMM / GEMV cubins on one GPU (H200).

usage: python3 packs/kernels/verify/gemm_verify.py [CUBIN_DIR] [--quick] [--no-bench] [--inline] [--invariance]

CUBIN_DIR defaults to build/packs and must hold gemm_bf16.sm_90a.cubin,
gemm_wgmma.sm_90a.cubin and gemm_skinny.sm_90a.cubin (built by packs/kernels/build.sh).

Each cubin is tested in its own worker process (a kernel that faults poisons the CUDA context;
this way it takes down only its own cubin's remaining cases). A worker prints `RESULT {json}`
lines; the parent prints the tables at the end and exits non-zero on any FAIL, crash or missing
entry. --inline runs the workers in-process (debugging).

Correctness: y = x·Wᵀ (+bias) against torch fp32 (x.float() @ W.float().T), x ~ N(0,1),
W ~ N(0,0.02), bias ~ N(0,0.1); outputs are poisoned with NaN and fenced by sentinel guards
before and after, which must survive (no out-of-bounds writes). Checks: no NaN, relative
Frobenius error ≤ 4e-3 (bf16 out) / 1e-4 (fp32 out), and an element-wise bound. torch's own
bf16 result (cuBLAS) is measured against the same reference for comparison.

Bit identity (skinny kernels): per family (8-warp; cluster C = 1, 2, 4) and output type, the rows
that gemv / m16 / m32 / m64 compute for different M must be bit-identical (speculative decoding
verifies with whichever entry fits and must reproduce plain decoding), and repeat runs too.

M-invariance (wgmma; `--invariance` runs only this, the default full run includes it, --quick
skips it): for the Qwen3-4B projection shapes, gemm_bf16_wgmma(_n128)(_f32out) must give a row the
same bits whatever M (1 .. 8192, x = the first M rows of one matrix) and wherever the row sits in
its 128-row tile (permuted runs); a repeat run too. Information only: the same rows against
gemm_bf16_w64 (the GEMV family; expected to differ, other K order) and _n128 against 256-wide.

Speed: CUDA events around back-to-back launches queued behind a GPU sleep (so Python launch
overhead does not leave gaps), median of 50 repetitions, rotating across ≥4 weight copies
(≥ 256 MB in all) so the 60 MB L2 cannot serve repeated weight reads. The last table is decode
GB/s for the Qwen3 0.6B/4B/8B projection shapes and LM heads: the 8-warp entry, each split C,
and the C the split rule would pick (skinny_split; the manifest uses the 8-warp family, GEMM.md), vs the 4.24 TB/s copy rate and vs torch.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback

COPY_BW = 4.24e12     # H200 device-to-device copy, bytes/s (read + write), measured
BF16_PEAK = 790e12    # H200 dense bf16 GEMM measured with cuBLAS, FLOP/s


def cdiv(a, b):
    return (a + b - 1) // b


# name -> (cubin stem, grid(M, N), block, dynamic shared bytes, fp32 out?, rows per pass or None)
ENTRIES = {
    "gemm_bf16":                   ("gemm_bf16",   lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 98304, False, None),
    "gemm_bf16_f32out":            ("gemm_bf16",   lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 98304, True, None),
    "gemm_bf16_wgmma":             ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 256), 1), 256, 197632, False, None),
    "gemm_bf16_wgmma_f32out":      ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 256), 1), 256, 197632, True, None),
    "gemm_bf16_wgmma_n128":        ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 197632, False, None),
    "gemm_bf16_wgmma_n128_f32out": ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 197632, True, None),
    "gemm_bf16_wgmma_nofence":     ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 256), 1), 256, 197632, False, None),
    "gemm_bf16_wgmma_gv":          ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 197632, False, None),
    "gemm_bf16_wgmma_gv_f32out":   ("gemm_wgmma",  lambda M, N: (cdiv(M, 128), cdiv(N, 128), 1), 256, 197632, True, None),
    "gemv_bf16":                   ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, False, 8),
    "gemv_bf16_f32out":            ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, True, 8),
    "gemv_bf16_pf":                ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, False, 8),
    "gemm_bf16_m16":               ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, False, 16),
    "gemm_bf16_m16_f32out":        ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, True, 16),
    "gemm_bf16_m32":               ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, False, 32),
    "gemm_bf16_m32_f32out":        ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, True, 32),
    "gemm_bf16_m64":               ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, False, 64),
    "gemm_bf16_m64_f32out":        ("gemm_skinny", lambda M, N: (cdiv(N, 16), 1, 1), 256, 0, True, 64),
}
# Cluster family of gemm_skinny.cu: 4 warps per CTA, C CTAs (one cluster) per 16-row block.
SKINNY_BASE = [("gemv_bf16", 8), ("gemm_bf16_m16", 16), ("gemm_bf16_m32", 32), ("gemm_bf16_m64", 64)]
SPLITS = (1, 2, 4)
for _c in SPLITS:
    for _base, _rows in SKINNY_BASE:
        for _f32 in (False, True):
            ENTRIES[f"{_base}_c{_c}" + ("_f32out" if _f32 else "")] = (
                "gemm_skinny", lambda M, N, c=_c: (cdiv(N, 16) * c, 1, 1), 128, 0, _f32, _rows)
# gemm_wide.cu: clusters of 8 CTAs of 4 warps per 64 W rows, bit-identical to the 8-warp family.
WIDE = [("gemm_bf16_w16", 16), ("gemm_bf16_w32", 32), ("gemm_bf16_w64", 64)]
for _base, _rows in WIDE:
    for _f32 in (False, True):
        ENTRIES[_base + ("_f32out" if _f32 else "")] = (
            "gemm_wide", lambda M, N: (cdiv(N, 64) * 8, 1, 1), 128, 0, _f32, _rows)
# Timing variants (bf16 out only): deeper pipelines in dynamic shared memory, L2::256B prefetch.
for _name, _rows, _smem in [("gemm_bf16_w64_pf", 64, 49152), ("gemm_bf16_w64_s4", 64, 65536),
                            ("gemm_bf16_w64_s6", 64, 98304), ("gemm_bf16_w32_s6", 32, 73728)]:
    ENTRIES[_name] = ("gemm_wide", lambda M, N: (cdiv(N, 64) * 8, 1, 1), 128, _smem, False, _rows)
# The worker of a stem also loads these stems' entries (the identity check compares across files).
EXTRA_STEMS = {"gemm_skinny": ["gemm_wide"]}


def skinny_split(N, K):
    """C (CTAs per 16-row block) the cluster family would use for a shape (the manifest uses the
    8-warp family: packs/kernels/GEMM.md, "The cluster family"). Double C while the grid is under 384 CTAs (~3 per SM of
    132), the doubled grid still fits one wave of 4 CTAs per SM (528), and every CTA keeps
    >= 256 k (one 64-chunk per warp)."""
    blocks, c = cdiv(N, 16), 1
    while c < 4 and blocks * c < 384 and blocks * 2 * c <= 528 and K >= 2 * c * 256:
        c *= 2
    return c


def skinny_entry(base, N, K, f32=False):
    return f"{base}_c{skinny_split(N, K)}" + ("_f32out" if f32 else "")


STEMS = ["gemm_skinny", "gemm_bf16", "gemm_wgmma"]

M_LIST = [1, 2, 3, 7, 8, 16, 33, 64, 100, 257, 2048]
N_LIST = [8, 72, 1000, 6144]
K_LIST = [8, 64, 1000, 2560]

# Decode (bandwidth) shapes (N, K) of the Qwen models: projections, then the LM heads (f32 out).
DECODE_SHAPES = [
    ("0.6B qkv", 4096, 1024), ("0.6B o", 1024, 2048), ("0.6B gate_up", 6144, 1024), ("0.6B down", 1024, 3072),
    ("4B qkv", 6144, 2560), ("4B o", 2560, 4096), ("4B gate_up", 19456, 2560), ("4B down", 2560, 9728),
    ("8B qkv", 6144, 4096), ("8B o", 4096, 4096), ("8B gate_up", 24576, 4096), ("8B down", 4096, 12288),
    ("0.6B lm_head", 151936, 1024), ("4B lm_head", 151936, 2560), ("8B lm_head", 151936, 4096),
]
# Bit identity across the skinny entries of one family: (N, K) cases.
IDENT_SHAPES = [(1000, 1000), (72, 2560), (1024, 2048), (2560, 9728), (4096, 1024)]
PREFILL_SHAPES = [(6144, 2560), (19456, 2560), (2560, 9728), (2560, 4096)]
# M-invariance of the wgmma entries (docs/batch-invariance.md): Qwen3-4B projections (label, N, K,
# bias?), the M values, and the permuted / repeated runs (label, M, how row i of the run's x is chosen).
INV_SHAPES = [("4B qkv", 6144, 2560, True), ("4B o", 2560, 4096, False), ("4B gate_up", 19456, 2560, False),
              ("4B down", 2560, 9728, False)]
INV_MS = [1, 2, 7, 64, 65, 127, 128, 129, 300, 1000, 4096, 8192]
INV_PERMS = [("M=128 reversed", 128, "reverse"), ("M=129 rolled by 64", 129, "roll64"),
             ("M=300 reversed", 300, "reverse"), ("M=1000 rolled by 1", 1000, "roll1"),
             ("M=8192 random permutation", 8192, "random"), ("M=8192 repeat", 8192, "identity")]
INV_ENTRIES = ["gemm_bf16_wgmma", "gemm_bf16_wgmma_f32out", "gemm_bf16_wgmma_n128", "gemm_bf16_wgmma_n128_f32out",
               "gemm_bf16_wgmma_gv", "gemm_bf16_wgmma_gv_f32out"]
# The `_gv` entries (GEMV order, gemm_wgmma.cu) must give the GEMV family's bits: every row equal
# to gemm_bf16_w64's (the 8-warp family's, same bits) — on the INV_SHAPES' first INV_W64_ROWS rows
# and on these (N, K, bias?) with short and ragged K (fewer than 8 chunks, a partial chunk) at GV_MS.
GV_SHAPES = [(1000, 1000, True), (72, 2560, False), (520, 64, False), (4096, 1024, False), (136, 200, True)]
GV_MS = [1, 8, 64, 65, 130, 300]
INV_W64_ROWS = 1024  # rows compared (information) against gemm_bf16_w64, the GEMV family's 64-row entry


def emit(kind, **kw):
    kw["kind"] = kind
    print("RESULT " + json.dumps(kw), flush=True)


# ----------------------------------------------------------------------------------- worker
class Worker:
    def __init__(self, cubin_dir, stem, quick, bench):
        import numpy as np
        import torch
        import cupy
        self.np, self.torch, self.cupy = np, torch, cupy
        self.quick, self.do_bench = quick, bench
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        self.dev = torch.device("cuda:0")
        torch.cuda.set_device(0)
        print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cupy {cupy.__version__}, "
              f"numpy {np.__version__}", flush=True)
        self.stream = torch.cuda.current_stream()
        self.cstream = cupy.cuda.ExternalStream(self.stream.cuda_stream)
        self.stem = stem
        self.fns = {}
        for st in [stem] + EXTRA_STEMS.get(stem, []):
            self.load(cubin_dir, st)

    def load(self, cubin_dir, stem):
        cupy = self.cupy
        path = os.path.join(cubin_dir, stem + ".sm_90a.cubin")
        if not os.path.exists(path):
            emit("missing", stem=stem, entry=None, error="no file " + path)
            return
        mod = cupy.RawModule(path=path)
        for name, (s, _, _, smem, _, _) in ENTRIES.items():
            if s != stem:
                continue
            try:
                f = mod.get_function(name)
                if smem > 48 * 1024:
                    try:
                        f.max_dynamic_shared_size_bytes = smem
                    except AttributeError:
                        # older cupy: set the attribute through the driver
                        cupy.cuda.driver.funcSetAttribute(
                            f.kernel.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
                self.fns[name] = f
                try:
                    attrs = f.attributes
                    emit("attrs", entry=name, regs=attrs.get("num_regs"), local=attrs.get("local_size_bytes"),
                         max_threads=attrs.get("max_threads_per_block"))
                except Exception:
                    pass
            except Exception as e:  # noqa: BLE001 - report and continue
                emit("missing", stem=stem, entry=name, error=repr(e))

    # -- launch
    def ptr(self, t):
        return self.np.uint64(0 if t is None else t.data_ptr())

    def launch(self, name, x, W, bias, y, M, N, K):
        _, grid, block, smem, _, _ = ENTRIES[name]
        np = self.np
        with self.cstream:
            self.fns[name](grid(M, N), (block, 1, 1),
                           (self.ptr(x), self.ptr(W), self.ptr(bias), self.ptr(y),
                            np.int32(M), np.int32(N), np.int32(K)),
                           shared_mem=smem)

    # -- correctness
    def correctness(self):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(1234)
        names = list(self.fns)
        if not names:
            return
        ms, ns, ks = (M_LIST, N_LIST, K_LIST) if not self.quick else ([1, 7, 33, 257], [72, 1000], [64, 1000])
        case_id = 0
        GUARD = 256  # elements of sentinel before and after each output (keeps 16-byte alignment)
        SENT = 12288.0  # exactly representable in bf16 (12345 is not: it rounds to 12352)
        for M in ms:
            for N in ns:
                for K in ks:
                    for use_bias in (False, True) if (M, N, K) in {(33, 1000, 1000), (1, 72, 64)} else \
                            ((case_id % 2) == 1,):
                        case_id += 1
                        x = torch.randn(M, K, generator=g, device=self.dev).to(torch.bfloat16)
                        W = (torch.randn(N, K, generator=g, device=self.dev) * 0.02).to(torch.bfloat16)
                        b = (torch.randn(N, generator=g, device=self.dev) * 0.1).to(torch.bfloat16) if use_bias else None
                        ref = x.float() @ W.float().t()
                        if b is not None:
                            ref += b.float()
                        ref_rms = ref.pow(2).mean().sqrt().item()
                        ref_norm = ref.norm().item()
                        tb = torch.nn.functional.linear(x, W, b).float()
                        torch_err = (tb - ref).norm().item() / ref_norm
                        for name in names:
                            _, _, _, _, f32, rows = ENTRIES[name]
                            case = dict(entry=name, M=M, N=N, K=K, bias=use_bias)
                            try:
                                dt = torch.float32 if f32 else torch.bfloat16
                                buf = torch.full((M * N + 2 * GUARD,), SENT, dtype=dt, device=self.dev)
                                buf[GUARD:GUARD + M * N] = float("nan")
                                y = buf[GUARD:GUARD + M * N].view(M, N)
                                self.launch(name, x, W, b, y, M, N, K)
                                torch.cuda.synchronize()
                                yf = y.float()
                                nan = int(torch.isnan(yf).sum().item())
                                guard_ok = bool((buf[:GUARD].float() == SENT).all().item()
                                                and (buf[GUARD + M * N:].float() == SENT).all().item())
                                diff = (yf - ref)
                                rel = float("inf") if nan else diff.norm().item() / ref_norm
                                tol_rel, tol_el = (1e-4, 1e-4) if f32 else (4e-3, 1.5e-2)
                                el_bad = 0 if nan else int((diff.abs() > tol_el * (ref.abs() + ref_rms)).sum().item())
                                ok = nan == 0 and guard_ok and rel <= tol_rel and el_bad == 0
                                emit("check", ok=ok, rel=rel, torch_rel=torch_err, nan=nan, guard_ok=guard_ok,
                                     el_bad=el_bad, **case)
                            except Exception as e:  # noqa: BLE001
                                emit("check", ok=False, rel=None, torch_rel=torch_err, error=repr(e), **case)
                                if "illegal" in repr(e).lower() or "launch failure" in repr(e).lower():
                                    raise

    # -- bit identity across the skinny entries of one family (speculative decoding's contract)
    def identity(self):
        """Each family (8-warp, or cluster C = 1/2/4) must give the same bits for a row whichever
        entry (gemv / m16 / m32 / m64) and whichever M computes it, and the same bits run to run."""
        torch = self.torch
        if self.stem != "gemm_skinny":
            return
        g = torch.Generator(device=self.dev)
        g.manual_seed(4321)
        shapes = IDENT_SHAPES if not self.quick else IDENT_SHAPES[:2]
        runs = [("gemv_bf16", 1), ("gemv_bf16", 1), ("gemv_bf16", 3), ("gemv_bf16", 8), ("gemm_bf16_m16", 13),
                ("gemm_bf16_m16", 16), ("gemm_bf16_m32", 20), ("gemm_bf16_m32", 32), ("gemm_bf16_m64", 40),
                ("gemm_bf16_m64", 64)]
        # the wide entries (gemm_wide.cu) belong to the 8-warp family: same bits by construction
        wide_runs = [("gemm_bf16_w16", 13), ("gemm_bf16_w16", 16), ("gemm_bf16_w32", 20), ("gemm_bf16_w32", 32),
                     ("gemm_bf16_w64", 40), ("gemm_bf16_w64", 64)]
        for fam in [""] + [f"_c{c}" for c in SPLITS]:
            for f32 in (False, True):
                sfx = fam + ("_f32out" if f32 else "")
                fam_runs = runs if fam else runs[:-1] + wide_runs + runs[-1:]
                if any(base + sfx not in self.fns for base, _ in fam_runs):
                    emit("ident", family=sfx or "8warp", N=0, K=0, ok=False,
                         detail=["entries missing: " + ", ".join(b + sfx for b, _ in fam_runs if b + sfx not in self.fns)])
                    continue
                for ci, (N, K) in enumerate(shapes):
                    x = torch.randn(64, K, generator=g, device=self.dev).to(torch.bfloat16)
                    W = (torch.randn(N, K, generator=g, device=self.dev) * 0.02).to(torch.bfloat16)
                    b = (torch.randn(N, generator=g, device=self.dev) * 0.1).to(torch.bfloat16) if ci % 2 else None
                    dt, it = (torch.float32, torch.int32) if f32 else (torch.bfloat16, torch.int16)
                    outs = []
                    try:
                        for base, M in fam_runs:
                            y = torch.full((M, N), float("nan"), dtype=dt, device=self.dev)
                            self.launch(base + sfx, x[:M].contiguous(), W, b, y, M, N, K)
                            outs.append((f"{base}{sfx} M={M}", y))
                        torch.cuda.synchronize()
                        ref = outs[-1][1].view(it)
                        bad = []
                        for name, y in outs[:-1]:
                            diff = int((y.view(it) != ref[:y.shape[0]]).sum().item())
                            if diff:
                                bad.append(f"{name}: {diff} elements differ")
                        nan = int(torch.isnan(ref.view(dt).float()).sum().item())
                        if nan:
                            bad.append(f"{nan} NaN in the reference")
                        emit("ident", family=sfx or "8warp", N=N, K=K, ok=not bad, detail=bad[:4])
                    except Exception as e:  # noqa: BLE001
                        emit("ident", family=sfx or "8warp", N=N, K=K, ok=False, detail=[repr(e)])
                        if "illegal" in repr(e).lower():
                            raise

    # -- M-invariance of the wgmma entries (docs/batch-invariance.md, issue 29 item 4)
    def invariance(self):
        """For fixed W and the rows of one fixed 8192-row x, a row's output bits from
        gemm_bf16_wgmma(_n128)(_f32out) must not depend on M or on the row's position in its
        128-row tile. Runs M in INV_MS (x = the first M rows) and INV_PERMS (rows permuted,
        repeated), compares every row with the M = 8192 run. Information only: the same rows
        from gemm_bf16_w64(_f32out) (expected to differ: other K order) and _n128 vs 256-wide."""
        torch, np = self.torch, self.np
        if self.stem != "gemm_wgmma":
            return
        self.inv_fns = {}
        path = os.path.join(getattr(self, "cubin_dir", "build/packs"), "gemm_wide.sm_90a.cubin")
        if os.path.exists(path):
            mod = self.cupy.RawModule(path=path)
            for name in ("gemm_bf16_w64", "gemm_bf16_w64_f32out"):
                try:
                    self.inv_fns[name] = mod.get_function(name)
                except Exception as e:  # noqa: BLE001
                    emit("inv_info", what=name, detail="not loaded: " + repr(e))
        else:
            emit("inv_info", what="gemm_bf16_w64", detail="no file " + path)
        g = torch.Generator(device=self.dev)
        g.manual_seed(2929)
        gp = np.random.default_rng(2929)
        Mmax = max(INV_MS)

        def src_rows(M, how):
            if how == "reverse":
                return np.arange(M)[::-1].copy()
            if how.startswith("roll"):
                return np.roll(np.arange(M), int(how[4:]))
            if how == "random":
                return gp.permutation(M)
            return np.arange(M)

        def ordered(y, f32):  # bit patterns on a line where neighbouring values are 1 apart
            if f32:
                b = y.view(torch.int32).to(torch.int64)
                return torch.where(b < 0, -(2 ** 31) - b, b)
            b = y.view(torch.int16).to(torch.int32)
            return torch.where(b < 0, -32768 - b, b)

        def row_diff(a, b, f32):
            it = torch.int32 if f32 else torch.int16
            ne = a.view(it) != b.view(it)
            ulp = (ordered(a, f32) - ordered(b, f32)).abs()
            return (int(ne.any(dim=1).sum().item()), int(ne.sum().item()),
                    int(ulp[ne].max().item()) if bool(ne.any().item()) else 0)

        for label, N, K, use_bias in INV_SHAPES:
            x = torch.randn(Mmax, K, generator=g, device=self.dev).to(torch.bfloat16)
            W = (torch.randn(N, K, generator=g, device=self.dev) * 0.02).to(torch.bfloat16)
            b = (torch.randn(N, generator=g, device=self.dev) * 0.1).to(torch.bfloat16) if use_bias else None
            chk = x[:256].float() @ W.float().t() + (b.float() if b is not None else 0.0)
            refs = {}
            for name in INV_ENTRIES:
                f32 = ENTRIES[name][4]
                case = dict(entry=name, shape=label, N=N, K=K, bias=use_bias)
                if name not in self.fns:
                    emit("inv", ok=False, rows=0, differ=0, detail=["entry missing"], **case)
                    continue
                dt = torch.float32 if f32 else torch.bfloat16
                try:
                    def run(M, src=None):
                        xs = x[:M] if src is None else x[torch.as_tensor(src, device=self.dev)].contiguous()
                        y = torch.full((M, N), float("nan"), dtype=dt, device=self.dev)
                        self.launch(name, xs, W, b, y, M, N, K)
                        return y
                    ref = run(Mmax)
                    torch.cuda.synchronize()
                    nan = int(torch.isnan(ref.float()).sum().item())
                    rel = (ref[:256].float() - chk).norm().item() / chk.norm().item()
                    tol = 1e-4 if f32 else 4e-3
                    rows = differ = 0
                    detail = []
                    if nan or not rel <= tol:
                        detail.append(f"M={Mmax} run wrong: {nan} NaN, rel err {rel:.2e} > {tol:.0e}")
                    runs = [(f"M={M}", M, None) for M in INV_MS if M != Mmax] + \
                           [(lab, M, src_rows(M, how)) for lab, M, how in INV_PERMS]
                    for lab, M, src in runs:
                        y = run(M, src)
                        want = ref[:M] if src is None else ref[torch.as_tensor(src, device=self.dev)]
                        nrow, nel, mulp = row_diff(y, want, f32)
                        rows += M
                        differ += nrow
                        if nrow:
                            detail.append(f"{lab}: {nrow} rows ({nel} elements, max {mulp} ulp) differ")
                        del y
                    emit("inv", ok=not detail, rows=rows, differ=differ, rel=rel, detail=detail[:6], **case)
                    refs[name] = ref
                except Exception as e:  # noqa: BLE001
                    emit("inv", ok=False, rows=0, differ=0, detail=[repr(e)], **case)
                    if "illegal" in repr(e).lower() or "launch failure" in repr(e).lower():
                        raise
            # information: the GEMV family's 64-row entry, and the 128-wide vs 256-wide tiles
            R = INV_W64_ROWS
            for f32 in (False, True):
                sfx = "_f32out" if f32 else ""
                w64 = "gemm_bf16_w64" + sfx
                y64 = None
                if w64 in self.inv_fns:
                    dt = torch.float32 if f32 else torch.bfloat16
                    y64 = torch.full((R, N), float("nan"), dtype=dt, device=self.dev)
                    grid = ENTRIES[w64][1]
                    with self.cstream:
                        self.inv_fns[w64](grid(R, N), (ENTRIES[w64][2], 1, 1),
                                          (self.ptr(x), self.ptr(W), self.ptr(b), self.ptr(y64),
                                           np.int32(R), np.int32(N), np.int32(K)), shared_mem=ENTRIES[w64][3])
                    torch.cuda.synchronize()
                for wg in ("gemm_bf16_wgmma" + sfx, "gemm_bf16_wgmma_n128" + sfx):
                    if y64 is not None and wg in refs:
                        nrow, nel, mulp = row_diff(refs[wg][:R], y64, f32)
                        emit("inv_info", what=f"{wg} vs {w64}", shape=label, N=N, K=K, rows=R, differ=nrow,
                             elems=nel, total=R * N, max_ulp=mulp)
                gv = "gemm_bf16_wgmma_gv" + sfx
                if gv in refs:  # required: the GEMV order's claim
                    case = dict(entry=f"{gv} == {w64}", shape=label, N=N, K=K, bias=use_bias)
                    if y64 is None:
                        emit("inv", ok=False, rows=0, differ=0, detail=[f"{w64} not run"], **case)
                    else:
                        nrow, nel, mulp = row_diff(refs[gv][:R], y64, f32)
                        emit("inv", ok=nrow == 0, rows=R, differ=nrow,
                             detail=[] if nrow == 0 else [f"{nrow} rows ({nel} elements, max {mulp} ulp) differ"], **case)
                a, c = "gemm_bf16_wgmma" + sfx, "gemm_bf16_wgmma_n128" + sfx
                if a in refs and c in refs:
                    nrow, nel, mulp = row_diff(refs[a], refs[c], f32)
                    emit("inv_info", what=f"{a} vs {c}", shape=label, N=N, K=K, rows=Mmax, differ=nrow,
                         elems=nel, total=Mmax * N, max_ulp=mulp)
                del y64
            del refs, x, W, b
            torch.cuda.empty_cache()
        self.gv_identity(row_diff)

    def gv_identity(self, row_diff):
        """gemm_bf16_wgmma_gv(_f32out) == gemm_bf16_w64(_f32out), every row, on GV_SHAPES x GV_MS
        (short K: fewer chunks than the GEMV's 8 warps; K % 64 != 0: a partial chunk; biases)."""
        torch, np = self.torch, self.np
        g = torch.Generator(device=self.dev)
        g.manual_seed(4242)
        for N, K, use_bias in GV_SHAPES:
            x = torch.randn(max(GV_MS), K, generator=g, device=self.dev).to(torch.bfloat16)
            W = (torch.randn(N, K, generator=g, device=self.dev) * 0.05).to(torch.bfloat16)
            b = (torch.randn(N, generator=g, device=self.dev) * 0.1).to(torch.bfloat16) if use_bias else None
            for f32 in (False, True):
                sfx = "_f32out" if f32 else ""
                gv, w64 = "gemm_bf16_wgmma_gv" + sfx, "gemm_bf16_w64" + sfx
                case = dict(entry=f"{gv} == {w64}", shape=f"{N}x{K}", N=N, K=K, bias=use_bias)
                if gv not in self.fns or w64 not in self.inv_fns:
                    emit("inv", ok=False, rows=0, differ=0, detail=["entry missing"], **case)
                    continue
                dt = torch.float32 if f32 else torch.bfloat16
                rows = differ = 0
                detail = []
                for M in GV_MS:
                    ya = torch.full((M, N), float("nan"), dtype=dt, device=self.dev)
                    yb = torch.full((M, N), float("nan"), dtype=dt, device=self.dev)
                    self.launch(gv, x[:M], W, b, ya, M, N, K)
                    with self.cstream:
                        self.inv_fns[w64](ENTRIES[w64][1](M, N), (ENTRIES[w64][2], 1, 1),
                                          (self.ptr(x), self.ptr(W), self.ptr(b), self.ptr(yb),
                                           np.int32(M), np.int32(N), np.int32(K)), shared_mem=ENTRIES[w64][3])
                    torch.cuda.synchronize()
                    nrow, nel, mulp = row_diff(ya, yb, f32)
                    rows += M
                    differ += nrow
                    if nrow:
                        detail.append(f"M={M}: {nrow} rows ({nel} elements, max {mulp} ulp) differ")
                    if bool(torch.isnan(ya.float()).any().item()):
                        detail.append(f"M={M}: NaN in {gv}'s output")
                emit("inv", ok=not detail, rows=rows, differ=differ, detail=detail[:6], **case)
            del x, W, b

    # -- timing
    def timed(self, launches, reps=50):
        """Median per-launch time (s) of `launches` (callables) run back to back."""
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
        sleep_cycles = int(max(host * 3.0 + 100e-6, 200e-6) * 2.0e9)  # GPU runs ahead of Python
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

    def weights(self, N, K, g):
        torch = self.torch
        per = N * K * 2
        copies = min(16, max(4, cdiv(256 << 20, per)))
        return [(torch.randn(N, K, generator=g, device=self.dev) * 0.02).to(torch.bfloat16) for _ in range(copies)]

    def bench_one(self, names, M, N, K, g, ceiling_kind, label=None):
        torch = self.torch
        names = [n for n in names if n in self.fns]
        if not names:
            return
        Ws = self.weights(N, K, g)
        x = torch.randn(M, K, generator=g, device=self.dev).to(torch.bfloat16)
        ys = {False: torch.empty(M, N, dtype=torch.bfloat16, device=self.dev),
              True: torch.empty(M, N, dtype=torch.float32, device=self.dev)}
        yt = torch.empty(M, N, dtype=torch.bfloat16, device=self.dev)
        t_torch = self.timed([lambda W=W: torch.matmul(x, W.t(), out=yt) for W in Ws])
        wbytes = N * K * 2
        flops = 2.0 * M * N * K
        for name in names:
            f32 = ENTRIES[name][4]
            try:
                t = self.timed([lambda W=W, name=name: self.launch(name, x, W, None, ys[f32], M, N, K) for W in Ws])
                emit("bench", entry=name, M=M, N=N, K=K, t=t, t_torch=t_torch, wbytes=wbytes, flops=flops,
                     ceiling=ceiling_kind, label=label)
            except Exception as e:  # noqa: BLE001
                emit("bench", entry=name, M=M, N=N, K=K, t=None, t_torch=t_torch, error=repr(e), ceiling=ceiling_kind)
                if "illegal" in repr(e).lower():
                    raise
        del Ws
        torch.cuda.empty_cache()

    def bench(self):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(99)
        dec = DECODE_SHAPES
        pre = PREFILL_SHAPES if not self.quick else PREFILL_SHAPES[:1]
        if self.stem == "gemm_skinny":
            if self.quick:
                dec = [d for d in DECODE_SHAPES if d[0] in ("0.6B o", "4B down", "4B lm_head")]
            if self.shapes:
                dec = [d for d in DECODE_SHAPES if d[0] in self.shapes]
            for (label, N, K) in dec:
                f32 = N == 151936
                sfx = "_f32out" if f32 else ""
                for M in (1, 8):
                    if self.ms and M not in self.ms:
                        continue
                    names = [f"gemv_bf16{sfx}"] + [f"gemv_bf16_c{c}{sfx}" for c in SPLITS] + \
                            ([] if f32 else ["gemv_bf16_pf"])
                    self.bench_one(names, M, N, K, g, "bw", label=label)
                for M, base in ((16, "gemm_bf16_m16"), (32, "gemm_bf16_m32"), (64, "gemm_bf16_m64")):
                    if self.ms and M not in self.ms:
                        continue
                    wide = {16: "gemm_bf16_w16", 32: "gemm_bf16_w32", 64: "gemm_bf16_w64"}[M]
                    var = [] if f32 else {32: ["gemm_bf16_w32_s6"],
                                          64: ["gemm_bf16_w64_pf", "gemm_bf16_w64_s4", "gemm_bf16_w64_s6"]}.get(M, [])
                    self.bench_one([base + sfx, wide + sfx, skinny_entry(base, N, K, f32)] + var, M, N, K, g, "bw",
                                   label=label)
        elif self.stem == "gemm_bf16":
            for (N, K) in PREFILL_SHAPES[:3]:
                for M in (16, 64):
                    self.bench_one(["gemm_bf16"], M, N, K, g, "bw")
            for (N, K) in pre:
                for M in (512, 2048):
                    self.bench_one(["gemm_bf16"], M, N, K, g, "flops")
        elif self.stem == "gemm_wgmma":
            for (N, K) in PREFILL_SHAPES[:3]:
                self.bench_one(["gemm_bf16_wgmma_n128"], 64, N, K, g, "bw")
            for (N, K) in pre:
                for M in (512, 2048) if not self.quick else (2048,):
                    self.bench_one(["gemm_bf16_wgmma", "gemm_bf16_wgmma_n128", "gemm_bf16_wgmma_nofence"],
                                   M, N, K, g, "flops")
            if not self.quick:
                self.bench_one(["gemm_bf16_wgmma", "gemm_bf16_wgmma_n128"], 8192, 6144, 2560, g, "flops")


def worker_main(args):
    print(f"BEGIN worker {args.stem}", flush=True)
    w = Worker(args.dir, args.stem, args.quick, not args.no_bench)
    w.shapes = [x for x in args.shapes.split(",") if x] if args.shapes else None
    w.ms = [int(x) for x in args.ms.split(",") if x] if args.ms else None
    w.cubin_dir = args.dir
    try:
        if not args.invariance:
            w.correctness()
            w.identity()
        if args.invariance or not args.quick:
            w.invariance()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        emit("crash", stem=args.stem, phase="correctness")
        sys.stdout.flush()
        os._exit(3)
    if not args.no_bench and not args.invariance:
        try:
            w.bench()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            emit("crash", stem=args.stem, phase="bench")
            sys.stdout.flush()
            os._exit(4)
    print(f"END worker {args.stem}", flush=True)


# ----------------------------------------------------------------------------------- parent
def run_workers(args):
    results, logs = [], []
    stems = args.stems.split(",") if args.stems else (["gemm_wgmma"] if args.invariance else STEMS)
    for stem in stems:
        cmd = [sys.executable, os.path.abspath(__file__), args.dir, "--worker", "--stem", stem]
        if args.invariance:
            cmd.append("--invariance")
        if args.quick:
            cmd.append("--quick")
        if args.no_bench:
            cmd.append("--no-bench")
        if args.shapes:
            cmd += ["--shapes", args.shapes]
        if args.ms:
            cmd += ["--ms", args.ms]
        print(f"--- worker {stem}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=args.timeout)
            out, rc = p.stdout, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        last = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                results.append(r)
                if r["kind"] in ("check", "bench"):
                    last = r
                if r["kind"] == "check" and not r["ok"]:
                    print("  FAIL " + json.dumps(r), flush=True)
            else:
                logs.append(f"[{stem}] {line}")
                print(f"  {line}", flush=True)
        print(f"--- worker {stem}: exit {rc} after {time.time() - t0:.1f}s", flush=True)
        if rc != 0:
            results.append(dict(kind="crash", stem=stem, phase=f"exit {rc}",
                                last=last and {k: last.get(k) for k in ("entry", "M", "N", "K", "bias")}))
    return results


def report(results):
    bad = False
    print("\n================ SUMMARY ================")
    for r in results:
        if r["kind"] in ("missing", "crash"):
            bad = True
            print("!!", r["kind"].upper(), json.dumps(r))
    attrs = {r["entry"]: r for r in results if r["kind"] == "attrs"}
    checks = [r for r in results if r["kind"] == "check"]
    print("\n-- correctness (rel = |y-ref|/|ref| vs fp32 reference; torch = cuBLAS bf16 on the same data)")
    print(f"{'entry':30s} {'regs':>4s} {'lmem':>4s} {'cases':>5s} {'fail':>4s} {'max rel':>9s} {'mean rel':>9s} "
          f"{'mean torch':>10s}  worst case")
    for name in ENTRIES:
        cs = [c for c in checks if c["entry"] == name]
        if not cs:
            continue
        fails = [c for c in cs if not c["ok"]]
        bad |= bool(fails)
        rels = [c["rel"] for c in cs if c.get("rel") is not None]
        trel = [c["torch_rel"] for c in cs if c.get("torch_rel") is not None]
        worst = max(cs, key=lambda c: (not c["ok"], c.get("rel") or 0.0))
        a = attrs.get(name, {})
        print(f"{name:30s} {str(a.get('regs', '?')):>4s} {str(a.get('local', '?')):>4s} {len(cs):5d} {len(fails):4d} "
              f"{max(rels) if rels else float('nan'):9.2e} {sum(rels) / max(len(rels), 1):9.2e} "
              f"{sum(trel) / max(len(trel), 1):10.2e}  "
              f"M={worst['M']} N={worst['N']} K={worst['K']} bias={worst['bias']}"
              + ("" if worst["ok"] else "  FAIL " + json.dumps({k: worst.get(k) for k in
                                                               ("rel", "nan", "guard_ok", "el_bad", "error")})))
    idents = [r for r in results if r["kind"] == "ident"]
    if idents:
        print("\n-- bit identity of a row across gemv / m16 / m32 / m64 (and run to run), per family")
        for r in idents:
            bad |= not r["ok"]
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['family']:14s} N={r['N']:6d} K={r['K']:6d} "
                  + ("" if r["ok"] else "; ".join(r["detail"])))
    elif any(r["kind"] == "check" and r["entry"].startswith("gemv") for r in results):
        bad = True
        print("!! no bit-identity results")
    benches = [r for r in results if r["kind"] == "bench"]
    if benches:
        print("\n-- speed (median of 50, weights rotated across >=256 MB; bw = weight bytes / time vs 4.24 TB/s;"
              " flops vs 790 TFLOP/s)")
        print(f"{'entry':28s} {'M':>5s} {'N':>6s} {'K':>6s} {'us':>9s} {'metric':>12s} {'%ceil':>6s} "
              f"{'torch us':>9s} {'torch metric':>12s} {'vs torch':>8s}")
        for r in benches:
            if r.get("t") is None:
                bad = True
                print(f"{r['entry']:28s} {r['M']:5d} {r['N']:6d} {r['K']:6d}  ERROR {r.get('error')}")
                continue
            t, tt = r["t"], r["t_torch"]
            if r["ceiling"] == "bw":
                m, mt = r["wbytes"] / t, r["wbytes"] / tt
                ms, mts, pc = f"{m / 1e9:8.0f} GB/s", f"{mt / 1e9:8.0f} GB/s", m / COPY_BW * 100
            else:
                m, mt = r["flops"] / t, r["flops"] / tt
                ms, mts, pc = f"{m / 1e12:6.0f} TFLOP/s", f"{mt / 1e12:6.0f} TFLOP/s", m / BF16_PEAK * 100
            print(f"{r['entry']:28s} {r['M']:5d} {r['N']:6d} {r['K']:6d} {t * 1e6:9.2f} {ms:>12s} {pc:5.0f}% "
                  f"{tt * 1e6:9.2f} {mts:>12s} {tt / t:7.2f}x")
    decode_table(benches)
    bad |= invariance_table(results)
    print("\nRESULT:", "FAIL" if bad else "PASS")
    return 1 if bad else 0


def invariance_table(results):
    """The M-invariance section; returns whether anything failed."""
    invs = [r for r in results if r["kind"] == "inv"]
    infos = [r for r in results if r["kind"] == "inv_info"]
    if not invs and not infos:
        return False
    bad = False
    print(f"\n-- M-invariance of the wgmma entries: each row's bits vs the M={max(INV_MS)} run, for M in "
          f"{INV_MS} (x = the first M rows of one {max(INV_MS)}-row matrix) and the permuted / repeated runs "
          f"({'; '.join(p[0] for p in INV_PERMS)}); rows = rows compared, differ = rows with any bit different "
          f"(expected 0)")
    print(f"{'':4s} {'entry':52s} {'shape':11s} {'N':>6s} {'K':>6s} {'rows':>7s} {'differ':>7s} {'rel err':>9s}")
    for r in invs:
        bad |= not r["ok"]
        rel = r.get("rel")
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['entry']:52s} {r['shape']:11s} {r['N']:6d} {r['K']:6d} "
              f"{r['rows']:7d} {r['differ']:7d} {rel if rel is not None else float('nan'):9.2e}"
              + ("" if r["ok"] else "  " + "; ".join(r["detail"])))
    if infos:
        print(f"\n-- information: the same rows from other entries (wgmma vs gemm_bf16_w64 expected to differ: "
              f"other K order; first {INV_W64_ROWS} rows)")
        for r in infos:
            if "differ" not in r:
                print(f"     {r['what']}: {r.get('detail')}")
                continue
            same = "bit-identical" if r["differ"] == 0 else "differ"
            print(f"     {r['what']:50s} {r['shape']:11s} {r['differ']:5d} of {r['rows']:5d} rows {same:13s} "
                  f"({r['elems']} of {r['total']} elements, {r['elems'] / max(r['total'], 1) * 100:.1f}%), "
                  f"max {r['max_ulp']} ulp")
    return bad


def decode_table(benches):
    """GB/s of weight bytes per shape: the 8-warp entry, each split C, the one the manifest picks."""
    rows = {}
    for r in benches:
        if r.get("label") is None or r.get("t") is None:
            continue
        key = (r["label"], r["N"], r["K"], r["M"])
        rows.setdefault(key, {})[r["entry"]] = r
    if not rows:
        return
    print(f"\n-- decode GB/s (weight bytes / time; copy ceiling {COPY_BW / 1e12:.2f} TB/s); chosen = the C the split rule "
          f"skinny_split(N, K) would pick (the manifest uses the 8-warp family)")
    print(f"{'shape':14s} {'N':>6s} {'K':>6s} {'M':>3s} {'8-warp':>7s} {'wide':>7s} {'C=1':>7s} {'C=2':>7s} {'C=4':>7s} "
          f"{'chosen':>9s} {'%copy':>6s} {'torch':>7s} {'vs torch':>8s}")
    for (label, N, K, M), es in rows.items():
        any_r = next(iter(es.values()))
        f32 = N == 151936
        sfx = "_f32out" if f32 else ""
        base = {1: "gemv_bf16", 8: "gemv_bf16", 16: "gemm_bf16_m16", 32: "gemm_bf16_m32", 64: "gemm_bf16_m64"}.get(M)
        if base is None:
            continue

        def gbs(name):
            r = es.get(name)
            return None if r is None else r["wbytes"] / r["t"] / 1e9

        def cell(v):
            return f"{v:7.0f}" if v is not None else f"{'-':>7s}"
        c = skinny_split(N, K)
        chosen = gbs(f"{base}_c{c}{sfx}")
        torch_gbs = any_r["wbytes"] / any_r["t_torch"] / 1e9
        wide = {16: "gemm_bf16_w16", 32: "gemm_bf16_w32", 64: "gemm_bf16_w64"}.get(M)
        print(f"{label:14s} {N:6d} {K:6d} {M:3d} {cell(gbs(base + sfx))} {cell(gbs(wide + sfx) if wide else None)} "
              f"{cell(gbs(f'{base}_c1{sfx}'))} "
              f"{cell(gbs(f'{base}_c2{sfx}'))} {cell(gbs(f'{base}_c4{sfx}'))} "
              f"{('C=%d ' % c) + (f'{chosen:4.0f}' if chosen else '   -'):>9s} "
              f"{(chosen or 0) / (COPY_BW / 1e9) * 100:5.0f}% {torch_gbs:7.0f} "
              f"{(chosen or 0) / torch_gbs:7.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default="build/packs")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--inline", action="store_true", help="run the workers in this process")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per worker (one per cubin)")
    ap.add_argument("--stems", default=None, help="comma list of cubin stems to test (default: all)")
    ap.add_argument("--shapes", default=None, help="comma list of decode shape labels to time, e.g. '4B o,4B down'")
    ap.add_argument("--ms", default=None, help="comma list of M values to time among 1,8,16,32,64")
    ap.add_argument("--invariance", action="store_true",
                    help="only the M-invariance check of the wgmma entries (also part of the default full run)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stem", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args)
        return 0
    if args.inline:
        import io
        import contextlib
        results = []
        for stem in STEMS:
            args.stem = stem
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    worker_main(args)
            except SystemExit:
                pass
            for line in buf.getvalue().splitlines():
                if line.startswith("RESULT "):
                    results.append(json.loads(line[7:]))
                else:
                    print(line)
        return report(results)
    results = run_workers(args)
    if args.invariance and not any(r["kind"] == "inv" for r in results):
        results.append(dict(kind="missing", stem="gemm_wgmma", entry=None, error="no M-invariance results"))
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
