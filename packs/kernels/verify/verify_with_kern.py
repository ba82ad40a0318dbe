#!/usr/bin/env python3
"""Prove the qwen3 pack's kernels through kern itself: one single-op manifest per case, run with
`kern run`, compared with PyTorch (issue 5).

    python3 packs/kernels/verify/verify_with_kern.py [CUBIN_DIR] [--kern PATH] [--only G,...]
        [--check-only] [--list] [--keep DIR] [--ref-device cuda|cpu] [--timeout S] [--deadline S]

CUBIN_DIR defaults to build/packs (packs/kernels/build.sh), --kern to .carry/kern
(scripts/gpu/prepare-carry.sh). On the GPU machine (python3 + torch + numpy; no cupy) every case:
  1. writes a single-op manifest (schema "4.1") into its own temporary directory: the cubin copied
     next to model.json with its sha256, vars whose max is the case's size (tokens / seqs / pages),
     buffers with role `input` (what the test fills; also the in-place `inout` ones: residual,
     qkv, KV pool, which are read back) and `output` (what the test reads), one op whose params
     are exactly the kernel's, one launch with block / grid / shared as packs/kernels/KERNELS.md
     states them (expressions over the vars), and a program of one call;
  2. writes the inputs as .npy (bf16 buffers as float32 holding bf16 values, so kern's
     round-to-nearest conversion is exact; ints as int32, seeds as uint64), runs
     `kern run model.json --input ... --output ... --sync-each`, reads the outputs back (bf16
     arrive as float32 and are converted back to bf16 exactly) and compares them with the same
     references as verify_kernels.py (its functions are imported from it).
Poison: output buffers have guard rows past what the kernel may write (`tokens + 2` rows, ...) and
are filled with NaN (-7 for integer outputs) through `--input` before the run (kern fills any
buffer it is given, and zero-fills the others); the KV pool starts NaN. Guard rows and the untouched
part of the pool must still hold the poison afterwards.

Tolerance (bf16 outputs): max_abs_err(kern vs fp64 reference) <= 1.5 * torch_bf16_err (the error of
PyTorch's bf16 implementation of the same op against the same reference) + 2^-7 * max|reference|.
GEMMs with fp32 output: 1.5 * (torch fp32 error, TF32 off) + 2^-13 * max|reference| (a bf16-rounded
output would fail it). Copies and index outputs must be exact. Sampling: same (seed, position) ->
same ids across two kern runs, never a token outside the top-k / top-p set, chi-square p-value >
1e-3 on V = 16 with 4,096 sequences (different seeds, or one seed and consecutive positions) in
one launch.

--check-only (no GPU, no torch, no numpy): writes every manifest and runs `kern check` on it, so CI
can see that each single-op manifest agrees with the cubins (parameter layouts, launch bounds,
shared memory, hashes). --list prints the cases. --keep DIR keeps every case directory (manifest,
inputs, outputs) under DIR. --only takes group names (rowwise, kv_write, qk_norm_rope, attention,
attention_decode, attention_prefill, argmax, sample, gemm, fused) or substrings of kernel names.

Each case runs in its own kern process; a failing case (kern error: its stderr is printed) never
stops the others. The final table: kernel, case, max_abs_err, torch_bf16_err, tol, PASS/FAIL.
Exit status 1 on any FAIL. GEMM cases are SKIPped (not failed) while their cubins are absent.
"""
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from kern_harness import (KernError, KernRunner, Results, SingleOp, kern_check,  # noqa: E402
                          print_table)

EPS = 1e-6
THETA = 1e6


def cdiv(a, b):
    return (a + b - 1) // b


def B(name):
    return {"buf": name}


def VAR(name):
    return {"var": name}


def I32(v):
    return {"i32": int(v)}


def F32(v):
    return {"f32": float(v)}


# ============================================================================ kernel signatures
# Exactly the extern "C" parameters of packs/kernels/KERNELS.md (and gemm_*.cu), in order.
def _sig(spec):
    return [tuple(p.split(":", 1)) for p in spec.split()]


SIG = {
    "embedding": _sig("out:out_buffer<bf16> table:in_buffer<bf16> ids:in_buffer<i32> n:i32 hidden:i32 vocab:i32 scale:f32"),
    "embedding_f32": _sig("out:out_buffer<f32> table:in_buffer<bf16> ids:in_buffer<i32> n:i32 hidden:i32 vocab:i32 "
                          "scale:f32"),
    "rms_norm": _sig("out:out_buffer<bf16> x:in_buffer<bf16> w:in_buffer<bf16> n:i32 hidden:i32 eps:f32"),
    "add_rms_norm": _sig("out:out_buffer<bf16> residual:inout_buffer<bf16> x:in_buffer<bf16> w:in_buffer<bf16> "
                         "n:i32 hidden:i32 eps:f32"),
    "rms_norm_off": _sig("out:out_buffer<bf16> x:in_buffer<bf16> w:in_buffer<bf16> n:i32 hidden:i32 eps:f32 off:f32"),
    "add_rms_norm_off": _sig("out:out_buffer<bf16> residual:inout_buffer<bf16> x:in_buffer<bf16> w:in_buffer<bf16> "
                             "n:i32 hidden:i32 eps:f32 off:f32"),
    "rms_norm_f32_off": _sig("out:out_buffer<bf16> x:in_buffer<f32> w:in_buffer<bf16> n:i32 hidden:i32 eps:f32 off:f32"),
    "add_rms_norm_f32_off": _sig("out:out_buffer<bf16> residual:inout_buffer<f32> x:in_buffer<bf16> w:in_buffer<bf16> "
                                 "n:i32 hidden:i32 eps:f32 off:f32"),
    "swiglu": _sig("out:out_buffer<bf16> gate_up:in_buffer<bf16> n:i32 inter:i32"),
    "geglu_tanh": _sig("out:out_buffer<bf16> gate_up:in_buffer<bf16> n:i32 inter:i32"),
    "gather_last": _sig("out:out_buffer<bf16> x:in_buffer<bf16> last_token:in_buffer<i32> seqs:i32 tokens:i32 hidden:i32"),
    "qk_norm_rope": _sig("qkv:inout_buffer<bf16> kv_base:inout_buffer<bf16> q_norm_w:in_buffer<bf16> "
                         "k_norm_w:in_buffer<bf16> qkv_bias:in_buffer<bf16> positions:in_buffer<i32> "
                         "slot_mapping:in_buffer<i32> n:i32 num_heads:i32 kv_heads:i32 head_dim:i32 layer:i32 "
                         "num_layers:i32 page_tokens:i32 theta:f32 eps:f32 flags:i32 inv_freq:ptr cos_scale:f32 "
                         "norm_offset:f32"),
    "kv_write": _sig("kv_base:inout_buffer<bf16> qkv:in_buffer<bf16> slot_mapping:in_buffer<i32> n:i32 num_heads:i32 "
                     "kv_heads:i32 head_dim:i32 layer:i32 num_layers:i32 page_tokens:i32"),
    "attention": _sig("out:out_buffer<bf16> q:in_buffer<bf16> kv_base:in_buffer<bf16> block_tables:in_buffer<i32> "
                      "seq_lens:in_buffer<i32> query_start:in_buffer<i32> num_seqs:i32 num_tokens:i32 max_pages:i32 "
                      "q_stride:i32 num_heads:i32 kv_heads:i32 layer:i32 num_layers:i32 page_tokens:i32 scale:f32 "
                      "window:i32"),
    "attention_decode": _sig("partial:out_buffer<f32> q:in_buffer<bf16> kv_base:in_buffer<bf16> "
                             "block_tables:in_buffer<i32> seq_lens:in_buffer<i32> query_start:in_buffer<i32> "
                             "num_seqs:i32 num_tokens:i32 max_pages:i32 q_stride:i32 num_heads:i32 kv_heads:i32 "
                             "layer:i32 num_layers:i32 page_tokens:i32 scale:f32 min_chunk:i32 max_chunks:i32 "
                             "window:i32"),
    "attention_combine": _sig("out:out_buffer<bf16> partial:in_buffer<f32> num_tokens:i32 num_heads:i32"),
    "argmax": _sig("out:out_buffer<i32> logits:in_buffer<f32> seqs:i32 vocab:i32"),
    "sample": _sig("out:out_buffer<i32> logits:in_buffer<f32> temperature:in_buffer<f32> top_k:in_buffer<i32> "
                   "top_p:in_buffer<f32> seeds:in_buffer<u64> rng_pos:in_buffer<i32> seqs:i32 vocab:i32"),
}
for _k, _v in SIG.items():
    SIG[_k] = [(n, t.replace("_", " ")) for n, t in _v]
# qk_norm_rope with an inv_freq table (the null version above: `ptr` bound to {"null": true})
SIG["qk_norm_rope_table"] = [(n, "in buffer<f32>" if n == "inv_freq" else t) for n, t in SIG["qk_norm_rope"]]

# Dynamic shared memory of the head_dim-256 attention entries (their shared-memory structs are above
# the 48 KiB of static shared memory: KERNELS.md; verify_kernels.py and the host emulation hold the
# same numbers). Other head dims: 0.
ATT_SMEM_D256 = 86032   # attention_d256: sizeof(AttSmem<256>)
DEC_SMEM_D256 = 83984   # attention_decode_d256: sizeof(DecSmem<256>)


def att_shared(D):
    return ATT_SMEM_D256 if D == 256 else 0


def dec_shared(D):
    return DEC_SMEM_D256 if D == 256 else 0


def NULLP():
    return {"null": True}


def gemm_sig(bias, f32out):
    return [("x", "in buffer<bf16>"), ("W", "in buffer<bf16>"), ("bias", "in buffer<bf16>" if bias else "ptr"),
            ("y", f"out buffer<{'f32' if f32out else 'bf16'}>"), ("M", "i32"), ("N", "i32"), ("K", "i32")]


# name -> (cubin stem, kind, BN for wgmma, fp32 out)
GEMM_ENTRIES = {
    "gemv_bf16": ("gemm_skinny", "skinny", None, False),
    "gemv_bf16_f32out": ("gemm_skinny", "skinny", None, True),
    "gemm_bf16_m16": ("gemm_skinny", "skinny", None, False),
    "gemm_bf16_m16_f32out": ("gemm_skinny", "skinny", None, True),
    "gemm_bf16_m32": ("gemm_skinny", "skinny", None, False),
    "gemm_bf16_m32_f32out": ("gemm_skinny", "skinny", None, True),
    "gemm_bf16_m64": ("gemm_skinny", "skinny", None, False),
    "gemm_bf16_m64_f32out": ("gemm_skinny", "skinny", None, True),
    "gemm_bf16_w16": ("gemm_wide", "wide", None, False),
    "gemm_bf16_w32_f32out": ("gemm_wide", "wide", None, True),
    "gemm_bf16_w64": ("gemm_wide", "wide", None, False),
    "gemm_bf16_w64_f32out": ("gemm_wide", "wide", None, True),
    "gemm_bf16": ("gemm_bf16", "mma", None, False),
    "gemm_bf16_f32out": ("gemm_bf16", "mma", None, True),
    "gemm_bf16_wgmma": ("gemm_wgmma", "wgmma", 256, False),
    "gemm_bf16_wgmma_f32out": ("gemm_wgmma", "wgmma", 256, True),
    "gemm_bf16_wgmma_n128": ("gemm_wgmma", "wgmma", 128, False),
    "gemm_bf16_wgmma_n128_f32out": ("gemm_wgmma", "wgmma", 128, True),
    "gemm_bf16_wgmma_nofence": ("gemm_wgmma", "wgmma", 256, False),
}


class Case:
    def __init__(self, group, kernel, shape, op, run):
        self.group, self.kernel, self.shape, self.op, self.run = group, kernel, shape, op, run


# ============================================================================ comparisons (torch)
class Ctx:
    """What a case's run function gets: torch, numpy, verify_kernels (vk), the device, results, kern."""

    def __init__(self, torch, np, vk, dev, R, runner):
        self.torch, self.np, self.vk, self.dev, self.R, self.runner = torch, np, vk, dev, R, runner
        self.BF = torch.bfloat16

    def kern(self, op, inputs, outputs, tag="run"):
        return self.runner.run(op, inputs, outputs, tag=tag)

    def close(self, kernel, shape, out, ref, tbf=None, exact=None, note="", frac=2.0 ** -7, tname="torch bf16"):
        """verify_kernels.close with the absolute part of the tolerance as a parameter."""
        torch = self.torch
        o = out.double()
        r = ref.double()
        finite = torch.isfinite(r)
        nan_bad = int((~torch.isfinite(o) & finite).sum())
        d = (o - r).abs()
        d = torch.where(finite, d, torch.zeros_like(d))
        d = torch.nan_to_num(d, nan=float("inf"))
        err = float(d.max()) if d.numel() else 0.0
        scale = float(r[finite].abs().max()) if bool(finite.any()) else 0.0
        terr = None
        bm = ""
        if tbf is not None:
            td = (tbf.double() - r).abs()
            td = torch.where(finite, td, torch.zeros_like(td))
            terr = float(td.max()) if td.numel() else 0.0
            same = (out.double() == tbf.double()) | (torch.isnan(out.double()) & torch.isnan(tbf.double()))
            bm = f"bit-identical to {tname}: {100.0 * float(same.double().mean()):.2f}%"
        tol = (1.5 * terr if terr is not None else 0.0) + frac * scale
        ok = nan_bad == 0 and err <= tol
        notes = [n for n in [note, bm] if n]
        if nan_bad:
            notes.append(f"{nan_bad} non-finite outputs")
        if exact is not None:
            if not self.vk.bits_equal(out, exact):
                ok = False
                notes.append(f"NOT bit-exact: {int((out.double() != exact.double()).sum())} elements differ")
            else:
                notes.append("bit-exact")
        if self.runner.last_gpu_ms is not None:
            notes.append(f"gpu {self.runner.last_gpu_ms:.3f} ms")
        self.R.add(kernel=kernel, shape=shape, err=err, terr=terr, tol=tol, status="PASS" if ok else "FAIL",
                   note="; ".join(notes))
        return ok

    def guard_nan(self, kernel, shape, t, what="guard rows"):
        if t.numel() == 0:
            return True
        ok = bool(self.torch.isnan(t.double()).all())
        if not ok:
            self.R.add(kernel=kernel, shape=shape, status="FAIL",
                       note=f"{what} were written ({int((~self.torch.isnan(t.double())).sum())} elements)")
        return ok


# ============================================================================ cases: rowwise
def rowwise_cases():
    cases = []

    def embedding(V, H, n):
        shape = f"V={V} H={H} n={n}"
        op = SingleOp(f"single-op embedding {shape}", "rowwise", "embedding", SIG["embedding"], {"tokens": n},
                      grid=["tokens", 1, 1], block=[128, 1, 1])
        op.buf("table", "bf16", [V, H], "input").buf("ids", "i32", ["tokens"], "input")
        op.buf("out", "bf16", ["tokens + 2", H], "output")
        op.bind(out=B("out"), table=B("table"), ids=B("ids"), n=VAR("tokens"), hidden=I32(H), vocab=I32(V), scale=F32(1.0))

        def run(X):
            torch, vk = X.torch, X.vk
            table = vk.randn((V, H), 1)
            ids = torch.randint(0, V, (n,), generator=vk.gen(2), dtype=torch.int32)
            if n >= 3:
                ids[0], ids[1], ids[2] = -1, V, V + 7
            ids = ids.to(X.dev)
            out = X.kern(op, {"table": table, "ids": ids}, ["out"])["out"]
            valid = (ids >= 0) & (ids < V)
            ref = torch.zeros((n, H), dtype=X.BF, device=X.dev)
            ref[valid] = table[ids[valid].long()]
            if X.guard_nan("embedding", shape, out[n:]):
                X.close("embedding", shape, out[:n], ref, exact=ref, note="ids -1/V/V+7 -> zeros" if n >= 3 else "")
        cases.append(Case("rowwise", "embedding", shape, op, run))

    for V, H, n in [(1000, 1000, 7), (1000, 1024, 300), (4000, 2560, 64), (3, 1024, 1)]:
        embedding(V, H, n)

    def rms_norm(H, n):
        shape = f"H={H} n={n}"
        op = SingleOp(f"single-op rms_norm {shape}", "rowwise", "rms_norm", SIG["rms_norm"], {"tokens": n},
                      grid=["tokens", 1, 1], block=[128, 1, 1])
        op.buf("x", "bf16", ["tokens", H], "input").buf("w", "bf16", [H], "input")
        op.buf("out", "bf16", ["tokens + 2", H], "output")
        op.bind(out=B("out"), x=B("x"), w=B("w"), n=VAR("tokens"), hidden=I32(H), eps=F32(EPS))

        def run(X):
            torch, vk = X.torch, X.vk
            x = vk.randn((n, H), 3, 2.0)
            w = (1 + 0.1 * torch.randn(H, generator=vk.gen(4))).to(X.dev).to(X.BF)
            out = X.kern(op, {"x": x, "w": w}, ["out"])["out"]
            if X.guard_nan("rms_norm", shape, out[n:]):
                X.close("rms_norm", shape, out[:n], vk.ref_rmsnorm(x.double(), w), tbf=vk.hf_rmsnorm(x, w))
        cases.append(Case("rowwise", "rms_norm", shape, op, run))

    def add_rms_norm(H, n):
        shape = f"H={H} n={n}"
        op = SingleOp(f"single-op add_rms_norm {shape}", "rowwise", "add_rms_norm", SIG["add_rms_norm"],
                      {"tokens": n}, grid=["tokens", 1, 1], block=[128, 1, 1])
        op.buf("residual", "bf16", ["tokens + 2", H], "input").buf("x", "bf16", ["tokens", H], "input")
        op.buf("w", "bf16", [H], "input").buf("out", "bf16", ["tokens + 2", H], "output")
        op.bind(out=B("out"), residual=B("residual"), x=B("x"), w=B("w"), n=VAR("tokens"), hidden=I32(H),
                eps=F32(EPS))

        def run(X):
            torch, vk = X.torch, X.vk
            res = vk.randn((n, H), 5, 2.0)
            x = vk.randn((n, H), 6, 0.7)
            w = (1 + 0.1 * torch.randn(H, generator=vk.gen(7))).to(X.dev).to(X.BF)
            resbuf = vk.nanfull((n + 2, H))
            resbuf[:n] = res
            got = X.kern(op, {"residual": resbuf, "x": x, "w": w}, ["out", "residual"])
            out, resout = got["out"], got["residual"]
            new_res = res + x  # transformers: residual + hidden_states, in bf16
            ok = X.guard_nan("add_rms_norm", shape, out[n:]) and \
                X.guard_nan("add_rms_norm", shape, resout[n:], "residual guard rows")
            if not vk.bits_equal(resout[:n], new_res):
                X.R.add(kernel="add_rms_norm(residual)", shape=shape, status="FAIL",
                        note=f"residual != bf16(residual + x): {int((resout[:n].double() != new_res.double()).sum())} differ")
                ok = False
            else:
                X.R.add(kernel="add_rms_norm(residual)", shape=shape, err=0.0, status="PASS", note="bit-exact bf16 add, in place")
            if ok:
                X.close("add_rms_norm", shape, out[:n], vk.ref_rmsnorm(res.double() + x.double(), w),
                        tbf=vk.hf_rmsnorm(new_res, w))
        cases.append(Case("rowwise", "add_rms_norm", shape, op, run))

    for H, n in [(1000, 7), (1024, 1), (1024, 300), (2560, 64), (4096, 7), (10000, 3)]:
        rms_norm(H, n)
    for H, n in [(1000, 7), (1024, 1), (2560, 64), (10000, 3)]:
        add_rms_norm(H, n)

    def swiglu(I, n):
        shape = f"I={I} n={n}"
        op = SingleOp(f"single-op swiglu {shape}", "rowwise", "swiglu", SIG["swiglu"], {"tokens": n},
                      grid=["tokens", 1, 1], block=[256, 1, 1])
        op.buf("gate_up", "bf16", ["tokens", 2 * I], "input").buf("out", "bf16", ["tokens + 2", I], "output")
        op.bind(out=B("out"), gate_up=B("gate_up"), n=VAR("tokens"), inter=I32(I))

        def run(X):
            torch, vk = X.torch, X.vk
            gu = vk.randn((n, 2 * I), 8, 2.0)
            out = X.kern(op, {"gate_up": gu}, ["out"])["out"]
            g, u = gu[:, :I], gu[:, I:]
            ref = torch.nn.functional.silu(g.double()) * u.double()
            tbf = torch.nn.functional.silu(g) * u
            if X.guard_nan("swiglu", shape, out[n:]):
                X.close("swiglu", shape, out[:n], ref, tbf=tbf)
        cases.append(Case("rowwise", "swiglu", shape, op, run))

    for I, n in [(1000, 7), (3072, 1), (3072, 300), (9728, 7)]:
        swiglu(I, n)

    def gather_last(T, H, S):
        shape = f"tokens={T} H={H} seqs={S}"
        op = SingleOp(f"single-op gather_last {shape}", "rowwise", "gather_last", SIG["gather_last"],
                      {"tokens": T, "seqs": S}, grid=["seqs", 1, 1], block=[128, 1, 1])
        op.buf("x", "bf16", ["tokens", H], "input").buf("last_token", "i32", ["seqs"], "input")
        op.buf("out", "bf16", ["seqs + 2", H], "output")
        op.bind(out=B("out"), x=B("x"), last_token=B("last_token"), seqs=VAR("seqs"), tokens=VAR("tokens"),
                hidden=I32(H))

        def run(X):
            torch, vk = X.torch, X.vk
            x = vk.randn((T, H), 9)
            last = torch.randint(0, T, (S,), generator=vk.gen(10), dtype=torch.int32)
            if S >= 3:
                last[1], last[2] = -1, T
            last = last.to(X.dev)
            out = X.kern(op, {"x": x, "last_token": last}, ["out"])["out"]
            valid = (last >= 0) & (last < T)
            ref = torch.zeros((S, H), dtype=X.BF, device=X.dev)
            ref[valid] = x[last[valid].long()]
            if X.guard_nan("gather_last", shape, out[S:]):
                X.close("gather_last", shape, out[:S], ref, exact=ref, note="index -1/tokens -> zeros" if S >= 3 else "")
        cases.append(Case("rowwise", "gather_last", shape, op, run))

    for T, H, S in [(300, 1024, 5), (7, 1000, 3), (1, 2560, 1)]:
        gather_last(T, H, S)
    return cases + rowwise_new_cases()


def rowwise_new_cases():
    """The entries of 2026-12-03 (Gemma 3): the scaled embedding and embedding_f32, the zero-centred
    norms (*_off: Gemma3RMSNorm), geglu_tanh."""
    cases = []

    def embedding(kname, V, H, n, scale):
        f32 = kname == "embedding_f32"
        shape = f"V={V} H={H} n={n} scale={scale:g}"
        op = SingleOp(f"single-op {kname} {shape}", "rowwise", kname, SIG[kname], {"tokens": n},
                      grid=["tokens", 1, 1], block=[128, 1, 1])
        op.buf("table", "bf16", [V, H], "input").buf("ids", "i32", ["tokens"], "input")
        op.buf("out", "f32" if f32 else "bf16", ["tokens + 2", H], "output")
        op.bind(out=B("out"), table=B("table"), ids=B("ids"), n=VAR("tokens"), hidden=I32(H), vocab=I32(V),
                scale=F32(scale))

        def run(X):
            torch, vk = X.torch, X.vk
            table = vk.randn((V, H), 11)
            ids = torch.randint(0, V, (n,), generator=vk.gen(12), dtype=torch.int32)
            ids[0], ids[1] = -1, V
            ids = ids.to(X.dev)
            out = X.kern(op, {"table": table, "ids": ids}, ["out"])["out"]
            valid = (ids >= 0) & (ids < V)
            ref = torch.zeros((n, H), dtype=X.BF, device=X.dev)
            ref[valid] = table[ids[valid].long()] * torch.tensor(scale, dtype=X.BF, device=X.dev)  # one bf16 multiply
            if f32:
                ref = ref.float()
            if X.guard_nan(kname, shape, out[n:]):
                X.close(kname, shape, out[:n], ref.double(), exact=ref,
                        note=("a copy" if scale == 1.0 else "bf16(row * scale)") + "; ids -1/V -> zeros")
        cases.append(Case("rowwise", kname, shape, op, run))

    s1152, s2560 = 34.0, 50.5  # bf16(sqrt(1152)), bf16(sqrt(2560)): Gemma3TextScaledWordEmbedding's embed_scale
    for kname, V, H, n, scale in [("embedding", 1000, 1152, 7, s1152), ("embedding", 4000, 2560, 64, s2560),
                                  ("embedding_f32", 1000, 1152, 7, s1152), ("embedding_f32", 1000, 1024, 9, 1.0)]:
        embedding(kname, V, H, n, scale)

    def norm_off(kname, H, n, off):
        f32, add = "_f32" in kname, kname.startswith("add_")
        dt = "f32" if f32 else "bf16"
        shape = f"H={H} n={n} off={off:g}"
        op = SingleOp(f"single-op {kname} {shape}", "rowwise", kname, SIG[kname], {"tokens": n},
                      grid=["tokens", 1, 1], block=[128, 1, 1])
        if add:
            op.buf("residual", dt, ["tokens + 2", H], "input").buf("x", "bf16", ["tokens", H], "input")
        else:
            op.buf("x", dt, ["tokens", H], "input")
        op.buf("w", "bf16", [H], "input").buf("out", "bf16", ["tokens + 2", H], "output")
        binds = dict(out=B("out"), x=B("x"), w=B("w"), n=VAR("tokens"), hidden=I32(H), eps=F32(EPS), off=F32(off))
        if add:
            binds["residual"] = B("residual")
        op.bind(**binds)

        def run(X):
            torch, vk = X.torch, X.vk
            wz = 0.3 * torch.randn(H, generator=vk.gen(14))
            w = (wz if off == 1.0 else 1.0 + wz).to(X.dev).to(X.BF)
            tdt = torch.float32 if f32 else X.BF
            if add:
                res = vk.randn((n, H), 15, 2.0, dtype=tdt)
                x = vk.randn((n, H), 16, 0.7)
                resbuf = vk.nanfull((n + 2, H), tdt)
                resbuf[:n] = res
                got = X.kern(op, {"residual": resbuf, "x": x, "w": w}, ["out", "residual"])
                out, resout = got["out"], got["residual"]
                new_res = res + x if not f32 else res + x.float()
                ok = X.guard_nan(kname, shape, resout[n:], "residual guard rows")
                same = vk.bits_equal(resout[:n], new_res)
                X.R.add(kernel=kname + "(residual)", shape=shape, err=0.0 if same else None,
                        status="PASS" if same else "FAIL",
                        note=("bit-exact " + ("fp32" if f32 else "bf16") + " add, in place") if same else
                        f"residual != residual + x: {int((resout[:n].double() != new_res.double()).sum())} differ")
                if not (ok and same):
                    return
                src, src64 = new_res, res.double() + x.double()
            else:
                x = vk.randn((n, H), 17, 2.0, dtype=tdt)
                out = X.kern(op, {"x": x, "w": w}, ["out"])["out"]
                src, src64 = x, x.double()
            if X.guard_nan(kname, shape, out[n:]):
                X.close(kname, shape, out[:n], vk.ref_rmsnorm_off(src64, w, off), tbf=vk.gemma_rmsnorm(src, w, off),
                        note="Gemma3RMSNorm bf16((x*r)*(off+w))")
        cases.append(Case("rowwise", kname, shape, op, run))

    for kname in ("rms_norm_off", "add_rms_norm_off", "rms_norm_f32_off", "add_rms_norm_f32_off"):
        for H, n, off in [(1152, 7, 1.0), (2560, 64, 1.0), (1003, 3, 0.0), (10000, 3, 1.0)]:
            norm_off(kname, H, n, off)

    def geglu(I, n):
        shape = f"I={I} n={n}"
        op = SingleOp(f"single-op geglu_tanh {shape}", "rowwise", "geglu_tanh", SIG["geglu_tanh"], {"tokens": n},
                      grid=["tokens", 1, 1], block=[256, 1, 1])
        op.buf("gate_up", "bf16", ["tokens", 2 * I], "input").buf("out", "bf16", ["tokens + 2", I], "output")
        op.bind(out=B("out"), gate_up=B("gate_up"), n=VAR("tokens"), inter=I32(I))

        def run(X):
            torch, vk = X.torch, X.vk
            gu = vk.randn((n, 2 * I), 18, 2.0)
            out = X.kern(op, {"gate_up": gu}, ["out"])["out"]
            g, u = gu[:, :I], gu[:, I:]
            ref = torch.nn.functional.gelu(g.double(), approximate="tanh") * u.double()
            tbf = torch.nn.functional.gelu(g, approximate="tanh") * u
            if X.guard_nan("geglu_tanh", shape, out[n:]):
                X.close("geglu_tanh", shape, out[:n], ref, tbf=tbf)
        cases.append(Case("rowwise", "geglu_tanh", shape, op, run))

    for I, n in [(6912, 7), (10240, 3), (1000, 300), (37, 5)]:
        geglu(I, n)
    return cases


# ============================================================================ cases: kv_write, qk_norm_rope
def kv_write_cases():
    cases = []
    layers, layer = 3, 1
    for Hq, Hkv, D, pt, n in [(16, 8, 128, 16, 7), (16, 8, 128, 64, 300), (14, 2, 64, 16, 300), (32, 8, 128, 16, 1)]:
        shape = f"Hq={Hq} Hkv={Hkv} D={D} page={pt} n={n}"
        num_pages = cdiv(n, pt) + 3
        W = (Hq + 2 * Hkv) * D
        P = num_pages * pt * layers * 2 * Hkv * D
        op = SingleOp(f"single-op kv_write {shape}", "rope", "kv_write", SIG["kv_write"], {"tokens": n},
                      grid=["tokens", 1, 1], block=[128, 1, 1])
        op.buf("kv_pool", "bf16", [P], "input").buf("qkv", "bf16", ["tokens", W], "input")
        op.buf("slot_mapping", "i32", ["tokens"], "input")
        op.bind(kv_base=B("kv_pool"), qkv=B("qkv"), slot_mapping=B("slot_mapping"), n=VAR("tokens"),
                num_heads=I32(Hq), kv_heads=I32(Hkv), head_dim=I32(D), layer=I32(layer), num_layers=I32(layers),
                page_tokens=I32(pt))

        def run(X, Hq=Hq, Hkv=Hkv, D=D, pt=pt, n=n, shape=shape, op=op, num_pages=num_pages):
            vk = X.vk
            qkv = vk.randn((n, (Hq + 2 * Hkv) * D), 11)
            slots = vk.make_slots(n, pt, num_pages, 12, invalid=(1,)).to(X.dev)
            pool0 = vk.nanfull((num_pages * pt * layers * 2 * Hkv * D,))
            pool = X.kern(op, {"kv_pool": pool0, "qkv": qkv, "slot_mapping": slots}, ["kv_pool"])["kv_pool"]
            pv = vk.pool_view(pool, layers, pt, Hkv, D)
            valid = slots >= 0
            s = slots[valid].long()
            kref = qkv[valid][:, Hq * D:(Hq + Hkv) * D].reshape(-1, Hkv, D)
            vref = qkv[valid][:, (Hq + Hkv) * D:].reshape(-1, Hkv, D)
            kgot = pv[:, layer, 0].reshape(-1, Hkv, D)[s]
            vgot = pv[:, layer, 1].reshape(-1, Hkv, D)[s]
            written = int((~X.torch.isnan(pool.double())).sum())
            expect = int(valid.sum()) * 2 * Hkv * D
            exact = vk.bits_equal(kgot, kref) and vk.bits_equal(vgot, vref)
            ok = exact and written == expect
            X.R.add(kernel="kv_write", shape=shape, err=0.0 if ok else None, status="PASS" if ok else "FAIL",
                    note=f"k/v bit-exact={exact}; {written} pool elements written, expected {expect} (slot -1 skipped)")
        cases.append(Case("kv_write", "kv_write", shape, op, run))
    return cases


def qkr_op(tag, Hq, Hkv, D, pt, n, flags, table=False, cos_scale=1.0, off=0.0, theta=THETA, layers=2, layer=1):
    """A qk_norm_rope single-op manifest: grid [tokens, ceil((Hq + 2 Hkv) / 8)], block 256; inv_freq a
    `ptr` bound to null, or (table) an `in buffer<f32>` of D/2 floats."""
    W = (Hq + 2 * Hkv) * D
    num_pages = cdiv(n, pt) + 2
    P = num_pages * pt * layers * 2 * Hkv * D
    op = SingleOp(f"single-op qk_norm_rope {tag}", "rope", "qk_norm_rope",
                  SIG["qk_norm_rope_table" if table else "qk_norm_rope"], {"tokens": n},
                  grid=["tokens", cdiv(Hq + 2 * Hkv, 8), 1], block=[256, 1, 1])
    op.buf("qkv", "bf16", ["tokens", W], "input").buf("kv_pool", "bf16", [P], "input")
    op.buf("q_norm_w", "bf16", [D], "input").buf("k_norm_w", "bf16", [D], "input")
    op.buf("qkv_bias", "bf16", [W], "input").buf("positions", "i32", ["tokens"], "input")
    op.buf("slot_mapping", "i32", ["tokens"], "input")
    if table:
        op.buf("inv_freq", "f32", [D // 2], "input")
    op.bind(qkv=B("qkv"), kv_base=B("kv_pool"), q_norm_w=B("q_norm_w"), k_norm_w=B("k_norm_w"),
            qkv_bias=B("qkv_bias"), positions=B("positions"), slot_mapping=B("slot_mapping"), n=VAR("tokens"),
            num_heads=I32(Hq), kv_heads=I32(Hkv), head_dim=I32(D), layer=I32(layer), num_layers=I32(layers),
            page_tokens=I32(pt), theta=F32(theta), eps=F32(EPS), flags=I32(flags),
            inv_freq=B("inv_freq") if table else NULLP(), cos_scale=F32(cos_scale), norm_offset=F32(off))
    return op


def qkr_run(X, op, c, inv=None, qkv=None, qn=None, kn=None, bias=None, tag="run"):
    """Runs a qkr_op on the inputs of vk.qkr_inputs (the pool starts NaN); returns (qkv, pool)."""
    ins = {"qkv": c["qkv"] if qkv is None else qkv, "kv_pool": c["pool"], "q_norm_w": c["qn"] if qn is None else qn,
           "k_norm_w": c["kn"] if kn is None else kn, "qkv_bias": c["bias"] if bias is None else bias,
           "positions": c["pos"], "slot_mapping": c["slots"]}
    if inv is not None:
        ins["inv_freq"] = inv.float()
    got = X.kern(op, ins, ["qkv", "kv_pool"], tag=tag)
    return got["qkv"], got["kv_pool"]


def side_op(X, op, sub):
    """Writes a second manifest for a case (beside the case's own, in a subdirectory) and returns it."""
    op.write(os.path.join(X.case_dir, sub), X.runner.cubin_dir)
    return op


def qk_norm_rope_cases():
    cases = []
    layers, layer = 2, 1
    cfgs = [  # Hq, Hkv, D, page_tokens, n, flags, max position
        (16, 8, 128, 16, 7, 1, 100), (32, 8, 128, 64, 300, 1, 40000), (16, 8, 128, 16, 1, 1, 5),
        (14, 2, 64, 16, 64, 2, 30000), (14, 2, 64, 64, 7, 0, 1000), (8, 4, 128, 16, 33, 3, 20000),
        (8, 4, 256, 16, 33, 1, 30000),
    ]
    for Hq, Hkv, D, pt, n, flags, maxpos in cfgs:
        shape = f"Hq={Hq} Hkv={Hkv} D={D} page={pt} n={n} flags={flags} pos<{maxpos}"
        op = qkr_op(shape, Hq, Hkv, D, pt, n, flags)

        def run(X, Hq=Hq, Hkv=Hkv, D=D, pt=pt, n=n, flags=flags, maxpos=maxpos, shape=shape, op=op):
            vk = X.vk
            c = vk.qkr_inputs(n, Hq, Hkv, D, pt, maxpos, layers)
            qkv, pool = qkr_run(X, op, c)
            refs = vk.qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"])
            vk.qkr_check(X.R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, flags, refs, close_fn=X.close)
        cases.append(Case("qk_norm_rope", "qk_norm_rope", shape, op, run))

    # the parameters of 2026-12-03 (Llama, Gemma 3). (1) An inv_freq table holding the kernel's computed
    # frequencies gives the null (computed) path's bits, and matches transformers.
    for Hq, Hkv, D, flags in [(16, 8, 128, 3), (14, 2, 64, 2), (8, 4, 256, 1)]:
        n, pt = 33, 16
        shape = f"inv_freq table == computed: Hq={Hq} Hkv={Hkv} D={D} flags={flags}"
        op = qkr_op(shape, Hq, Hkv, D, pt, n, flags, table=True)

        def run_table(X, Hq=Hq, Hkv=Hkv, D=D, flags=flags, shape=shape, op=op, n=n, pt=pt):
            vk = X.vk
            c = vk.qkr_inputs(n, Hq, Hkv, D, pt, 40000, layers, seed=31)
            b = qkr_run(X, op, c, inv=vk.kern_inv_freq(D), tag="table")
            op0 = side_op(X, qkr_op(shape + " (null)", Hq, Hkv, D, pt, n, flags), "null")
            a = qkr_run(X, op0, c, tag="null")
            same = vk.bits_equal(a[0], b[0]) and vk.bits_equal(a[1].nan_to_num(0.0), b[1].nan_to_num(0.0)) and \
                bool((X.torch.isnan(a[1]) == X.torch.isnan(b[1])).all())
            X.R.add(kernel="qk_norm_rope(inv_freq table)", shape=shape, status="PASS" if same else "FAIL",
                    note="q, k, v bit-identical to the null (computed) path" if same else
                    "NOT bit-identical to the null (computed) path")
            refs = vk.qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"], inv=vk.kern_inv_freq(D))
            vk.qkr_check(X.R, shape, c, b[0], b[1], n, Hq, Hkv, D, pt, layer, layers, flags, refs, close_fn=X.close)
        cases.append(Case("qk_norm_rope", "qk_norm_rope", shape, op, run_table))

    # (2) Llama 3.1's scaled frequencies as the table, YaRN's attention factor as cos_scale
    for Hq, Hkv, D, flags, cos_scale in [(32, 8, 128, 0, 1.0), (32, 8, 128, 2, 1.2079441)]:
        n, pt = 64, 16
        shape = f"llama3-scaled inv_freq table, cos_scale {cos_scale}: Hq={Hq} Hkv={Hkv} D={D} flags={flags}"
        op = qkr_op(shape, Hq, Hkv, D, pt, n, flags, table=True, cos_scale=cos_scale)

        def run_scaled(X, Hq=Hq, Hkv=Hkv, D=D, flags=flags, cos_scale=cos_scale, shape=shape, op=op, n=n, pt=pt):
            vk = X.vk
            c = vk.qkr_inputs(n, Hq, Hkv, D, pt, 100000, layers, seed=41)
            inv = vk.llama3_inv_freq(D)
            qkv, pool = qkr_run(X, op, c, inv=inv)
            refs = vk.qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"], inv=inv,
                               cos_scale=cos_scale)
            vk.qkr_check(X.R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, flags, refs, close_fn=X.close)
        cases.append(Case("qk_norm_rope", "qk_norm_rope", shape, op, run_scaled))

    # (3) QKR_ADJACENT on llama.cpp's permuted q / k rows: element for element the neox run on the
    # Hugging Face rows, permuted (bit-exact without the norm)
    for Hq, Hkv, D, flags in [(32, 8, 128, 0), (8, 4, 256, 2)]:
        n, pt = 33, 16
        shape = f"QKR_ADJACENT on GGUF-permuted rows: Hq={Hq} Hkv={Hkv} D={D} flags={flags | 8}"
        op = qkr_op(shape, Hq, Hkv, D, pt, n, flags | 8)

        def run_adj(X, Hq=Hq, Hkv=Hkv, D=D, flags=flags, shape=shape, op=op, n=n, pt=pt):
            vk, torch = X.vk, X.torch
            H = Hq + 2 * Hkv
            c = vk.qkr_inputs(n, Hq, Hkv, D, pt, 40000, layers, seed=51)
            x = c["qkv"].view(n, H, D)
            xp = torch.cat([vk.gguf_permute(x[:, :Hq + Hkv], D), x[:, Hq + Hkv:]], dim=1).reshape(n, H * D).contiguous()
            bb = c["bias"].view(H, D)
            bp = torch.cat([vk.gguf_permute(bb[:Hq + Hkv], D), bb[Hq + Hkv:]], dim=0).reshape(-1).contiguous()
            qnp, knp = vk.gguf_permute(c["qn"], D).contiguous(), vk.gguf_permute(c["kn"], D).contiguous()
            gg = qkr_run(X, op, c, qkv=xp, qn=qnp, kn=knp, bias=bp, tag="adjacent")
            hf = qkr_run(X, side_op(X, qkr_op(shape + " (neox)", Hq, Hkv, D, pt, n, flags), "neox"), c, tag="neox")
            pv_hf, pv_gg = vk.pool_view(hf[1], layers, pt, Hkv, D), vk.pool_view(gg[1], layers, pt, Hkv, D)
            valid = c["slots"] >= 0
            s_ = c["slots"][valid].long()
            q_same = vk.bits_equal(gg[0].view(n, H, D)[:, :Hq], vk.gguf_permute(hf[0].view(n, H, D)[:, :Hq], D).contiguous())
            k_same = vk.bits_equal(pv_gg[:, layer, 0].reshape(-1, Hkv, D)[s_],
                                   vk.gguf_permute(pv_hf[:, layer, 0].reshape(-1, Hkv, D)[s_], D).contiguous())
            v_same = vk.bits_equal(pv_gg[:, layer, 1].reshape(-1, Hkv, D)[s_], pv_hf[:, layer, 1].reshape(-1, Hkv, D)[s_])
            X.R.add(kernel="qk_norm_rope(adjacent == permuted neox)", shape=shape,
                    status="PASS" if q_same and k_same and v_same else "FAIL",
                    note=f"q {'==' if q_same else '!='}, k {'==' if k_same else '!='}, v {'==' if v_same else '!='} the "
                         f"neox run on the HF rows, permuted")
            refs = vk.qkr_refs(xp, n, Hq, Hkv, D, flags | 8, qnp, knp, bp, c["pos"])
            vk.qkr_check(X.R, shape, dict(c, qkv=xp), gg[0], gg[1], n, Hq, Hkv, D, pt, layer, layers, flags | 8, refs,
                         close_fn=X.close)
        cases.append(Case("qk_norm_rope", "qk_norm_rope", shape, op, run_adj))

    # (4) Gemma 3's q / k norm (flags 5: QKR_NORM | QKR_NORM_F32), offsets 1 (HF) and 0 (GGUF)
    for Hq, Hkv, D, off, theta in [(8, 4, 256, 1.0, 1e6), (4, 1, 256, 0.0, 1e4)]:
        n, pt = 64, 16
        shape = f"Gemma q/k norm (flags 5) norm_offset {off:g} theta {theta:g}: Hq={Hq} Hkv={Hkv} D={D}"
        op = qkr_op(shape, Hq, Hkv, D, pt, n, 5, off=off, theta=theta)

        def run_gemma(X, Hq=Hq, Hkv=Hkv, D=D, off=off, theta=theta, shape=shape, op=op, n=n, pt=pt):
            vk, torch = X.vk, X.torch
            c = vk.qkr_inputs(n, Hq, Hkv, D, pt, 32768, layers, seed=61)
            if off == 1.0:  # zero-centred Hugging Face weights
                c["qn"] = (0.3 * torch.randn(D, generator=vk.gen(62))).to(X.dev).to(X.BF)
                c["kn"] = (0.3 * torch.randn(D, generator=vk.gen(63))).to(X.dev).to(X.BF)
            qkv, pool = qkr_run(X, op, c)
            refs = vk.qkr_refs(c["qkv"], n, Hq, Hkv, D, 5, c["qn"], c["kn"], c["bias"], c["pos"], off=off, theta=theta)
            vk.qkr_check(X.R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, 5, refs, close_fn=X.close)
        cases.append(Case("qk_norm_rope", "qk_norm_rope", shape, op, run_gemma))
    return cases


# ============================================================================ cases: attention
def attention_cases():
    cases = []
    mixed = [(100, 37), (499, 1), (0, 300), (0, 1), (63, 1), (15, 17), (1000, 64), (31, 33)]
    rng = random.Random(77)
    decode64 = [(rng.randrange(0, 300), 1) for _ in range(64)]
    specs = [
        # name, Hq, Hkv, D, page_tokens, spec, pad_tokens, pad_seqs, (layers, layer), grid_x_override
        ("0.6B heads, page 16, mixed+pad", 16, 8, 128, 16, mixed, 5, 2, (2, 1), None),
        ("4B heads, page 64, mixed+pad", 32, 8, 128, 64, mixed, 3, 1, (2, 1), None),
        ("Qwen2.5-0.5B heads G=7, page 16, mixed+pad", 14, 2, 64, 16, mixed, 4, 2, (2, 1), None),
        ("G=1 D=128, page 64", 8, 8, 128, 64, [(0, 7), (200, 1), (64, 64)], 0, 0, (2, 1), None),
        ("G=16 D=64, page 16", 16, 1, 64, 16, [(5, 3), (300, 1), (0, 40)], 1, 0, (2, 1), None),
        ("decode batch 64, page 16, layer 0/1", 32, 8, 128, 16, decode64, 0, 0, (1, 0), None),
        ("1 decode token ctx 1, padded", 16, 8, 128, 16, [(0, 1)], 7, 3, (2, 1), None),
        ("long prefill chunks over cache, page 64", 32, 8, 128, 64, [(1500, 700), (0, 513)], 0, 0, (2, 1), None),
        ("page 64, prefill chunks + decode + pad", 16, 8, 64, 64, [(130, 70), (0, 1), (64, 1), (700, 129)], 2, 1,
         (2, 1), None),
        ("grid.x=1 (grid-stride loop)", 8, 2, 128, 16, [(40, 20), (0, 9), (7, 1)], 0, 0, (2, 1), 1),
        # head_dim 256 (Gemma 3; 86032 bytes of dynamic shared memory) and sliding windows (last field)
        ("Gemma3-4B heads G=2 D=256, page 16, mixed+pad", 8, 4, 256, 16, mixed, 5, 2, (2, 1), None),
        ("Gemma3-4B heads, window 1024", 8, 4, 256, 16, [(1500, 700), (0, 1100), (2000, 1)], 0, 0, (2, 1), None, 1024),
        ("Gemma3-1B heads G=4 D=256, window 512, grid.x=3", 4, 1, 256, 16, mixed, 3, 1, (2, 1), 3, 512),
        ("0.6B heads, window 100, page 64", 16, 8, 128, 64, mixed, 5, 2, (2, 1), None, 100),
        ("Qwen2.5-0.5B heads G=7 D=64, window 45", 14, 2, 64, 16, mixed, 4, 2, (2, 1), None, 45),
        ("window 1, G=4 D=128", 32, 8, 128, 16, mixed, 0, 0, (2, 1), None, 1),
        ("window 4096 > every context, G=2 D=64", 4, 2, 64, 16, mixed, 1, 1, (2, 1), None, 4096),
    ]
    for ci, (name, Hq, Hkv, D, pt, spec, pad_t, pad_s, (layers, layer), gx, *rest) in enumerate(specs):
        window = rest[0] if rest else 0
        S = len(spec)
        ctxs = [c + n for c, n in spec]
        pages_per = [cdiv(c, pt) for c in ctxs]
        max_pages = max(pages_per) + 1
        total_pages = sum(pages_per) + 3
        Sb, n_tok = S + pad_s, sum(n for _, n in spec)
        Tb = n_tok + pad_t
        G = Hq // Hkv
        BQ = 32 // G
        kname = f"attention_d{D}"
        shape = f"{name}: Hq={Hq} Hkv={Hkv} seqs={S}+{pad_s} tok={n_tok}+{pad_t} pages={max_pages}"
        P = total_pages * pt * layers * 2 * Hkv * D
        op = att_op(kname, "attention", name, Hq, Hkv, D, pt, layers, layer, Tb, Sb, max_pages, P,
                    f"ceil(tokens/{BQ}) + seqs" if gx is None else gx, window)

        def run(X, Hq=Hq, Hkv=Hkv, D=D, pt=pt, spec=spec, pad_t=pad_t, pad_s=pad_s, ci=ci, shape=shape,
                kname=kname, op=op, layers=layers, layer=layer, sizes=(Sb, Tb, max_pages), window=window, gx=gx, BQ=BQ,
                P=P):
            vk = X.vk
            c = vk.build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=31 + ci)
            assert (c["Sb"], c["Tb"], c["max_pages"]) == sizes, ((c["Sb"], c["Tb"], c["max_pages"]), sizes)
            scale = D ** -0.5
            out = att_run(X, op, c)
            ref, tbf = vk.attention_refs(c, Hq, Hkv, D, scale, window)
            n = c["n_tok"]
            X.close(kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf,
                    note="fp32 softmax/PV vs SDPA" + (f", window {window}" if window else ""))
            vk.check_rows_past(X.R, kname, shape, out, n, c["Tb"])
            rerun = (lambda w: att_run(X, side_op(X, att_op(kname, "attention", f"{shape} window {w}", Hq, Hkv, D, pt, layers,
                                                             layer, sizes[1], sizes[0], sizes[2], P,
                                                             f"ceil(tokens/{BQ}) + seqs" if gx is None else gx, w),
                                                  f"window{w}"), c, tag=f"w{w}"))
            vk.window_extra_checks(X.R, NOT_MOCK, kname, shape, out, c, Hq, Hkv, D, window, rerun)
        cases.append(Case("attention", kname, shape, op, run))
    return cases


NOT_MOCK = type("NotMock", (), {"mock": False})()


def att_op(kname, stem, name, Hq, Hkv, D, pt, layers, layer, Tb, Sb, max_pages, P, grid_x, window):
    """A single-op manifest of attention_dD (stem attention) or attention_prefill_dD (stem attention_prefill):
    KERN_ATT_ARGS bound to the step's buffers; shared = 86032 for attention_d256 (dynamic), else 0."""
    op = SingleOp(f"single-op {kname} {name}", stem, kname, SIG["attention"],
                  {"tokens": Tb, "seqs": Sb, "pages": max_pages}, grid=[grid_x, Hkv, 1], block=[128, 1, 1],
                  shared=att_shared(D) if stem == "attention" else 0)
    op.buf("qkv", "bf16", ["tokens", (Hq + 2 * Hkv) * D], "input").buf("kv_pool", "bf16", [P], "input")
    op.buf("block_tables", "i32", ["seqs", "pages"], "input").buf("seq_lens", "i32", ["seqs"], "input")
    op.buf("query_start", "i32", ["seqs + 1"], "input").buf("out", "bf16", ["tokens + 1", Hq * D], "output")
    op.bind(out=B("out"), q=B("qkv"), kv_base=B("kv_pool"), block_tables=B("block_tables"),
            seq_lens=B("seq_lens"), query_start=B("query_start"), num_seqs=VAR("seqs"), num_tokens=VAR("tokens"),
            max_pages=VAR("pages"), q_stride=I32((Hq + 2 * Hkv) * D), num_heads=I32(Hq), kv_heads=I32(Hkv),
            layer=I32(layer), num_layers=I32(layers), page_tokens=I32(pt), scale=F32(D ** -0.5), window=I32(window))
    return op


def att_run(X, op, c, tag="run"):
    return X.kern(op, {"qkv": c["qkv"], "kv_pool": c["pool"], "block_tables": c["bt"], "seq_lens": c["seq_lens"],
                       "query_start": c["qs"]}, ["out"], tag=tag)["out"]


# ============================================================================ cases: attention_decode
# The split-KV decode path as the generated manifest runs it: one op of two launches of the module
# attention_decode (attention_decode_dD, then attention_combine_dD reading the first's scratch).
# The grid's z is the manifest's expression of `seqs` (occupancy only); the chunking is fixed by the
# row and the model's max_chunks (batch 1's z), so the results do not depend on z.
DEC_TARGET_CTAS, DEC_GRID_CTAS, DEC_MAX_SPLITS, DEC_MIN_CHUNK = 264, 2048, 64, 64  # the generator's (and verify_kernels.py's)


class TwoLaunchOp(SingleOp):
    """A SingleOp whose op runs a second entry of the same module after the first. The op's params
    are the first kernel's followed by the second kernel's that the first lacks (matched by name);
    each launch passes its own kernel's params by name."""

    def __init__(self, model, stem, entry, sig, vars, grid, block, entry2, sig2, grid2, block2, shared=0):
        first = dict(sig)
        extra = [(n, t) for n, t in sig2 if n not in first]
        super().__init__(model, stem, entry, list(sig) + extra, vars, grid, block, shared)
        self.sig1 = list(sig)
        self.entry2, self.sig2, self.grid2, self.block2 = entry2, list(sig2), list(grid2), list(block2)

    def to_json(self, sha256):
        j = super().to_json(sha256)
        names = [n for n, _ in self.sig]
        launches = j["ops"][self.entry]["impl"]["launches"]
        launches[0]["params"] = [t for _, t in self.sig1]
        launches[0]["args"] = [{"param": i} for i in range(len(self.sig1))]
        launches.append({"label": self.entry2, "module": self.stem, "entry": self.entry2,
                         "params": [t for _, t in self.sig2], "block": self.block2, "grid": self.grid2,
                         "args": [{"param": names.index(n)} for n, _ in self.sig2]})
        return j


def attention_decode_cases():
    cases = []
    ctx7 = [1, 15, 16, 17, 255, 1000, 4096]
    specs = [
        # name, Hq, Hkv, D, page_tokens, groups (contexts), rows (group, ctx), pad_tokens, pad_seqs,
        # grid z (None: the manifest's expression)
        ("4B heads b=1 ctx 4096", 32, 8, 128, 16, [4096], [(0, 4096)], 0, 0, None),
        ("0.6B heads b=3 ctx 1/17/1000 +pad", 16, 8, 128, 16, [1, 17, 1000], [(0, 1), (1, 17), (2, 1000)], 1, 1,
         None),
        ("G=4 D=64 b=64, every context", 8, 2, 64, 16, [ctx7[i % 7] for i in range(64)],
         [(i, ctx7[i % 7]) for i in range(64)], 0, 0, None),
        ("Qwen2.5-0.5B heads G=7 D=64 b=1 ctx 255", 14, 2, 64, 16, [255], [(0, 255)], 0, 0, None),
        ("verify rows k=4 + decode, page 64, 4B heads", 32, 8, 128, 64, [1005, 300],
         [(0, 1001 + j) for j in range(5)] + [(1, 300)], 2, 2, None),
        ("Z=128 > max_chunks, G=2 D=128, ctx 4096/15", 16, 8, 128, 16, [4096, 15], [(0, 4096), (1, 15)], 0, 0, 128),
        ("Z=1 (CTAs loop over chunks), 4B heads, ctx 4096/1000/15", 32, 8, 128, 16, [4096, 1000, 15],
         [(0, 4096), (1, 1000), (2, 15)], 0, 0, 1),
        # head_dim 256 (Gemma 3: 83984 bytes of dynamic shared memory for the split kernel, combine block
        # 256) and sliding windows (the last field): rows on both sides of the window's edge, verify rows
        # whose windows start in different key tiles, window 1, a window longer than every context
        ("Gemma3-4B heads G=2 D=256 b=3 ctx 1/1000/4096 +pad", 8, 4, 256, 16, [1, 1000, 4096],
         [(0, 1), (1, 1000), (2, 4096)], 1, 1, None),
        ("Gemma3-4B heads, window 1024, ctx 1023/1024/1025/1057/4096", 8, 4, 256, 16, [1023, 1024, 1025, 1057, 4096],
         [(0, 1023), (1, 1024), (2, 1025), (3, 1057), (4, 4096)], 0, 0, None, 1024),
        ("Gemma3-1B heads G=4 D=256, window 512, Z=1", 4, 1, 256, 16, [600, 4096], [(0, 600), (1, 4096)], 0, 0, 1, 512),
        ("verify rows across the window's key tile, window 1000, 4B heads", 32, 8, 128, 16, [1040],
         [(0, 1030 + j) for j in range(5)], 1, 1, None, 1000),
        ("window 1, G=4 D=64, ctx 1/33/4096", 8, 2, 64, 16, [1, 33, 4096], [(0, 1), (1, 33), (2, 4096)], 0, 0, None, 1),
        ("window 8192 > every context, 0.6B heads", 16, 8, 128, 16, [1, 1000, 4096], [(0, 1), (1, 1000), (2, 4096)], 0, 0,
         None, 8192),
    ]
    for ci, (name, Hq, Hkv, D, pt, groups, rows, pad_t, pad_s, splits, *rest) in enumerate(specs):
        window = rest[0] if rest else 0
        layers, layer = 2, 1
        pages_per = [cdiv(c, pt) for c in groups]
        max_pages = max(pages_per) + 1
        total_pages = sum(pages_per) + 3
        Sb, Tb = len(rows) + pad_s, len(rows) + pad_t
        MC = max(1, min(DEC_MAX_SPLITS, cdiv(DEC_TARGET_CTAS, Hkv)))  # the manifest's decode_max_chunks
        S = max(1, min(MC, cdiv(DEC_GRID_CTAS, Sb * Hkv))) if splits is None else splits
        nP = cdiv(Tb, 4) * 4 + MC * Tb * Hq * (D + 4)
        kname = f"attention_decode_d{D}"
        shape = f"{name}: Hq={Hq} Hkv={Hkv} rows={len(rows)}+{pad_t} Z={S} max_chunks={MC}"
        P = total_pages * pt * layers * 2 * Hkv * D
        op = dec_op(kname, name, Hq, Hkv, D, pt, layers, layer, Tb, Sb, max_pages, P, MC, nP, splits, window)

        def run(X, Hq=Hq, Hkv=Hkv, D=D, pt=pt, groups=groups, rows=rows, pad_t=pad_t, pad_s=pad_s, ci=ci,
                shape=shape, kname=kname, op=op, layers=layers, layer=layer, sizes=(Sb, Tb, max_pages), MC=MC, nP=nP,
                window=window, splits=splits, P=P, name=name):
            vk = X.vk
            c = vk.build_decode_case(groups, rows, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=400 + ci)
            assert (c["Sb"], c["Tb"], c["max_pages"]) == sizes, ((c["Sb"], c["Tb"], c["max_pages"]), sizes)
            out, partial = dec_run(X, op, c)
            ref, tbf = vk.attention_refs(c, Hq, Hkv, D, D ** -0.5, window)
            n, T = c["n_tok"], c["Tb"]
            X.close(kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf,
                    note="split-KV + combine vs SDPA" + (f", window {window}" if window else ""))
            vk.check_rows_past(X.R, kname, shape, out, n, T)
            X.guard_nan(kname, shape, partial[nP:], "scratch past its size")
            kmax = vk.dec_token_kmax(c["qs"].cpu(), c["seq_lens"].cpu(), c["Sb"], T)
            act = [float(vk.dec_chunking(k, MC, DEC_MIN_CHUNK, window)[1]) for k in kmax]
            hdr = [float(x) for x in partial[:T].cpu().tolist()]
            X.R.add(kernel=kname + "(header)", shape=shape, status="PASS" if hdr == act else "FAIL",
                    note=f"chunks per token {sorted(set(act))}" if hdr == act else f"header {hdr[:8]} != {act[:8]}")
            rerun = (lambda w: dec_run(X, side_op(X, dec_op(kname, f"{name} window {w}", Hq, Hkv, D, pt, layers, layer,
                                                            sizes[1], sizes[0], sizes[2], P, MC, nP, splits, w),
                                                  f"window{w}"), c, tag=f"w{w}")[0])
            vk.window_extra_checks(X.R, NOT_MOCK, kname, shape, out, c, Hq, Hkv, D, window, rerun)
        cases.append(Case("attention_decode", kname, shape, op, run))
    return cases


def dec_op(kname, name, Hq, Hkv, D, pt, layers, layer, Tb, Sb, max_pages, P, MC, nP, splits, window):
    """The split decode op as the manifest writes it: attention_decode_dD (grid [tokens, Hkv, Z], block 128,
    shared 83984 at D = 256) then attention_combine_dD (grid [tokens, Hq], block D) on the scratch."""
    S_expr = f"min({MC}, cdiv({DEC_GRID_CTAS}, seqs * {Hkv}))" if splits is None else splits
    op = TwoLaunchOp(f"single-op {kname} {name}", "attention_decode", kname, SIG["attention_decode"],
                     {"tokens": Tb, "seqs": Sb, "pages": max_pages}, grid=["tokens", Hkv, S_expr],
                     block=[128, 1, 1], entry2=f"attention_combine_d{D}", sig2=SIG["attention_combine"],
                     grid2=["tokens", Hq, 1], block2=[D, 1, 1], shared=dec_shared(D))
    op.buf("qkv", "bf16", ["tokens", (Hq + 2 * Hkv) * D], "input").buf("kv_pool", "bf16", [P], "input")
    op.buf("block_tables", "i32", ["seqs", "pages"], "input").buf("seq_lens", "i32", ["seqs"], "input")
    op.buf("query_start", "i32", ["seqs + 1"], "input").buf("out", "bf16", ["tokens + 1", Hq * D], "output")
    op.buf("partial", "f32", [nP + 64], "output")
    op.bind(partial=B("partial"), q=B("qkv"), kv_base=B("kv_pool"), block_tables=B("block_tables"),
            seq_lens=B("seq_lens"), query_start=B("query_start"), num_seqs=VAR("seqs"), num_tokens=VAR("tokens"),
            max_pages=VAR("pages"), q_stride=I32((Hq + 2 * Hkv) * D), num_heads=I32(Hq), kv_heads=I32(Hkv),
            layer=I32(layer), num_layers=I32(layers), page_tokens=I32(pt), scale=F32(D ** -0.5),
            min_chunk=I32(DEC_MIN_CHUNK), max_chunks=I32(MC), window=I32(window), out=B("out"))
    return op


def dec_run(X, op, c, tag="run"):
    res = X.kern(op, {"qkv": c["qkv"], "kv_pool": c["pool"], "block_tables": c["bt"], "seq_lens": c["seq_lens"],
                      "query_start": c["qs"]}, ["out", "partial"], tag=tag)
    return res["out"], res["partial"]


# ============================================================================ cases: argmax, sample
def argmax_cases():
    cases = []
    S = 6
    for V in [16, 1000, 151936, 151937]:
        shape = f"seqs={S} V={V}"
        op = SingleOp(f"single-op argmax {shape}", "sampling", "argmax", SIG["argmax"], {"seqs": S},
                      grid=["seqs", 1, 1], block=[512, 1, 1])
        op.buf("logits", "f32", ["seqs", V], "input").buf("out", "i32", ["seqs + 1"], "output")
        op.bind(out=B("out"), logits=B("logits"), seqs=VAR("seqs"), vocab=I32(V))

        def run(X, V=V, shape=shape, op=op):
            torch, vk = X.torch, X.vk
            x = (torch.randn((S, V), generator=vk.gen(41)) * 3).to(X.dev)
            x[1, 5] = 100.0
            x[1, V - 1] = 100.0           # tie -> lowest index
            x[2] = float("-inf")          # all -inf -> 0
            x[3, min(9, V - 1)] = float("nan")
            x[3, V - 1] = float("nan")    # NaN wins, first NaN
            x[4] = 0.5                    # constant row -> 0
            out = X.kern(op, {"logits": x}, ["out"])["out"]
            want = vk.argmax_ref(x)
            got = out[:S].tolist()
            ok = got == want and int(out[S]) == -7
            X.R.add(kernel="argmax", shape=shape, status="PASS" if ok else "FAIL", err=0.0 if ok else None,
                    note=f"got {got} want {want}" + ("" if int(out[S]) == -7 else " guard written"))
        cases.append(Case("argmax", "argmax", shape, op, run))
    return cases


def sample_op(S, V, tag):
    op = SingleOp(f"single-op sample {tag} seqs={S} V={V}", "sampling", "sample", SIG["sample"], {"seqs": S},
                  grid=["seqs", 1, 1], block=[512, 1, 1])
    op.buf("logits", "f32", ["seqs", V], "input").buf("temperature", "f32", ["seqs"], "input")
    op.buf("top_k", "i32", ["seqs"], "input").buf("top_p", "f32", ["seqs"], "input")
    op.buf("seeds", "u64", ["seqs"], "input").buf("rng_pos", "i32", ["seqs"], "input")
    op.buf("out", "i32", ["seqs + 1"], "output")
    op.bind(out=B("out"), logits=B("logits"), temperature=B("temperature"), top_k=B("top_k"), top_p=B("top_p"),
            seeds=B("seeds"), rng_pos=B("rng_pos"), seqs=VAR("seqs"), vocab=I32(V))
    return op


def sample_cases():
    cases = []

    def launch(X, op, logits, T, k, p, seeds, pos, tag="run"):
        S = logits.shape[0]
        out = X.kern(op, {"logits": logits, "temperature": T, "top_k": k, "top_p": p, "seeds": seeds,
                          "rng_pos": pos}, ["out"], tag=tag)["out"]
        assert int(out[S]) == -7, "guard element written"
        return out[:S]

    def full(X, S, v, dtype):
        return X.torch.full((S,), v, dtype=dtype, device=X.dev)

    # ---- greedy (temperature 0) == argmax
    S, V = 8, 151936
    op = sample_op(S, V, "greedy")

    def greedy(X, op=op, S=S, V=V):
        torch, vk = X.torch, X.vk
        x = (torch.randn((S, V), generator=vk.gen(51)) * 4).to(X.dev)
        got = launch(X, op, x, full(X, S, 0.0, torch.float32), full(X, S, 50, torch.int32),
                     full(X, S, 0.9, torch.float32), torch.arange(S, dtype=torch.int64, device=X.dev),
                     full(X, S, 3, torch.int32)).tolist()
        want = vk.argmax_ref(x)
        X.R.add(kernel="sample(greedy)", shape=f"seqs={S} V={V} T=0", status="PASS" if got == want else "FAIL",
                err=0.0 if got == want else None, note=f"== argmax: {got == want}")
    cases.append(Case("sample", "sample(greedy)", f"seqs={S} V={V} T=0", op, greedy))

    # ---- determinism: two kern runs (two processes) with the same (seed, position) -> same ids
    S, V = 64, 151936
    op = sample_op(S, V, "determinism")

    def determinism(X, op=op, S=S, V=V):
        torch, vk = X.torch, X.vk
        x = (torch.randn((S, V), generator=vk.gen(52)) * 2).to(X.dev)
        T, k, p = full(X, S, 0.9, torch.float32), full(X, S, 40, torch.int32), full(X, S, 0.95, torch.float32)
        seeds = torch.arange(S, dtype=torch.int64, device=X.dev) * 7919 + 11
        pos = full(X, S, 17, torch.int32)
        a = launch(X, op, x, T, k, p, seeds, pos, tag="a")
        b = launch(X, op, x, T, k, p, seeds, pos, tag="b")
        c = launch(X, op, x, T, k, p, seeds, pos + 1, tag="c")
        ok = torch.equal(a, b)
        ndiff = int((a != c).sum())
        inrange = bool(((a >= 0) & (a < V)).all())
        X.R.add(kernel="sample(determinism)", shape=f"seqs={S} V={V} T=0.9 k=40 p=0.95",
                status="PASS" if ok and ndiff > 0 and inrange else "FAIL",
                note=f"2 kern runs, same (seed,pos) -> same ids: {ok}; position+1 changed {ndiff}/{S} draws")
    cases.append(Case("sample", "sample(determinism)", f"seqs={S} V={V}", op, determinism))

    # ---- top-k / top-p respected (never a token outside the allowed set)
    Vr, Sr = 20000, 1024
    for T, k, p, tag in [(1.0, 5, 1.0, "top-k"), (0.8, 0, 0.6, "top-p"), (1.2, 50, 0.8, "top-k+top-p"),
                         (0.5, 1, 1.0, "top-k=1"), (2.0, 0, 0.05, "top-p tiny")]:
        op = sample_op(Sr, Vr, tag)
        shape = f"V={Vr} T={T} k={k} p={p} draws={Sr}"

        def respected(X, op=op, T=T, k=k, p=p, tag=tag, seed=60 + k, shape=shape):
            torch, vk = X.torch, X.vk
            row = torch.randn((Vr,), generator=vk.gen(seed)) * 2.5
            x = row[None, :].repeat(Sr, 1).to(X.dev)
            got = launch(X, op, x, full(X, Sr, T, torch.float32), full(X, Sr, k, torch.int32),
                         full(X, Sr, p, torch.float32), torch.arange(Sr, dtype=torch.int64, device=X.dev) + 1000 * seed,
                         full(X, Sr, 5, torch.int32))
            _, strict, loose = vk.sample_sets(row, T, k, p)
            g = got.cpu().long()
            inrange = bool(((g >= 0) & (g < Vr)).all())
            outside = int((~loose[g.clamp(0, Vr - 1)]).sum()) if inrange else Sr
            distinct = len(set(g.tolist()))
            ok = inrange and outside == 0 and (distinct > 1 or int(strict.sum()) <= 1)
            X.R.add(kernel=f"sample({tag})", shape=shape, status="PASS" if ok else "FAIL", err=float(outside),
                    note=f"{outside} draws outside the allowed set of {int(loose.sum())}; {distinct} distinct")
        cases.append(Case("sample", f"sample({tag})", shape, op, respected))

    # ---- chi-square goodness of fit, V = 16, 4096 sequences in one launch
    def chi2_case(X, op, row, T, k, p, S, tag, vary, shape):
        torch, vk = X.torch, X.vk
        V = row.numel()
        x = row[None, :].repeat(S, 1).to(X.dev)
        if vary == "seed":
            seeds = torch.arange(S, dtype=torch.int64, device=X.dev) + 12345
            pos = full(X, S, 7, torch.int32)
        else:  # one request, consecutive positions
            seeds = full(X, S, 987654321987, torch.int64)
            pos = torch.arange(S, dtype=torch.int32, device=X.dev)
        got = launch(X, op, x, full(X, S, T, torch.float32), full(X, S, k, torch.int32), full(X, S, p, torch.float32),
                     seeds, pos)
        w, _, _ = vk.sample_sets(row, T, k, p, slack=0)
        g = got.cpu().long()
        if not bool(((g >= 0) & (g < V)).all()):
            X.R.add(kernel=f"sample(chi2 {tag})", shape=shape, status="FAIL", note="id out of range")
            return
        counts = torch.bincount(g, minlength=V).double()
        support = w > 0
        outside = int(counts[~support].sum())
        exp = w * S
        small = support & (exp < 5)  # merge bins with expected count < 5 into one
        obs_b = counts[support & ~small].tolist()
        exp_b = exp[support & ~small].tolist()
        if bool(small.any()):
            obs_b.append(float(counts[small].sum()))
            exp_b.append(float(exp[small].sum()))
        chi2 = sum((o - e) ** 2 / e for o, e in zip(obs_b, exp_b) if e > 0)
        df = max(1, len(obs_b) - 1)
        pval = vk.chi2_sf(chi2, df)
        ok = outside == 0 and pval > 1e-3
        X.R.add(kernel=f"sample(chi2 {tag})", shape=shape, status="PASS" if ok else "FAIL", err=float(outside),
                note=f"chi2={chi2:.2f} df={df} p-value={pval:.4f} (> 1e-3); {outside} draws outside support of "
                     f"{int(support.sum())}")

    N = 4096
    for T, k, p, tag, vary in [(1.0, 0, 1.0, "plain", "seed"), (0.7, 10, 0.9, "T+k+p", "seed"),
                               (1.3, 0, 0.7, "top-p", "seed"), (1.0, 6, 1.0, "top-k", "position"),
                               (0.9, 0, 1.0, "plain", "position")]:
        op = sample_op(N, 16, f"chi2 {tag} {vary}")
        shape = f"V=16 T={T} k={k} p={p} seqs={N} (one launch) vary={vary}"

        def chi2(X, op=op, T=T, k=k, p=p, tag=tag, vary=vary, shape=shape):
            r16 = X.torch.randn((16,), generator=X.vk.gen(70)) * 1.5
            chi2_case(X, op, r16, T, k, p, N, tag, vary, shape)
        cases.append(Case("sample", f"sample(chi2 {tag})", shape, op, chi2))

    # large vocabulary: 16 likely tokens spread over the row, the rest ~0
    Vb, Sb = 151936, 512
    op = sample_op(Sb, Vb, "chi2 sparse")
    shape = f"V={Vb} sparse T=1 p=0.95 seqs={Sb}"

    def big_vocab(X, op=op, shape=shape):
        torch, vk = X.torch, X.vk
        row = torch.full((Vb,), -40.0)
        idx = torch.linspace(3, Vb - 2, 16).long()
        row[idx] = torch.randn((16,), generator=vk.gen(71)) * 1.2
        chi2_case(X, op, row, 1.0, 0, 0.95, Sb, "V=151936 sparse", "seed", shape)
    cases.append(Case("sample", "sample(chi2 V=151936 sparse)", shape, op, big_vocab))

    # padded / garbage rows must not hang, fault, or return an out-of-range id
    S, V = 6, 1000
    op = sample_op(S, V, "garbage")

    def garbage(X, op=op, S=S, V=V):
        torch, vk = X.torch, X.vk
        x = torch.randn((S, V), generator=vk.gen(80)).to(X.dev)
        x[0] = float("nan")
        x[1] = float("inf")
        x[2] = float("-inf")
        vec = lambda vals, dt: torch.tensor(vals, dtype=dt, device=X.dev)  # noqa: E731
        T = vec([1.0, 1.0, 1.0, float("nan"), -3.0, 1e-30], torch.float32)
        k = vec([0, 5, -4, 7, 0, 2_000_000_000], torch.int32)
        p = vec([0.5, float("nan"), 2.0, -1.0, 0.0, 1.0], torch.float32)
        got = launch(X, op, x, T, k, p, torch.arange(S, dtype=torch.int64, device=X.dev), full(X, S, 1, torch.int32)).tolist()
        ok = all(0 <= g < V for g in got)
        X.R.add(kernel="sample(garbage rows)", shape=f"seqs={S} V={V}", status="PASS" if ok else "FAIL",
                note=f"ids {got} (NaN/inf logits, NaN/negative T, bad k/p)")
    cases.append(Case("sample", "sample(garbage rows)", f"seqs={S} V={V}", op, garbage))
    return cases


# ============================================================================ cases: GEMM
GEMM_CASES = [  # entry, M, N, K, bias   (N, K not multiples of the tiles; K % 8 == 0 is required)
    ("gemv_bf16", 1, 1000, 1000, False), ("gemv_bf16", 1, 72, 2560, True), ("gemv_bf16", 7, 1000, 1000, True),
    ("gemv_bf16_f32out", 1, 1000, 1000, True), ("gemv_bf16_f32out", 7, 1000, 264, False),
    ("gemm_bf16_m16", 7, 1000, 1000, False), ("gemm_bf16_m16_f32out", 7, 1000, 1000, True),
    ("gemm_bf16_m32", 64, 1000, 264, True), ("gemm_bf16_m32_f32out", 7, 72, 1000, False),
    ("gemm_bf16_m64", 64, 1000, 1000, True), ("gemm_bf16_m64_f32out", 64, 1000, 1000, False),
    ("gemm_bf16_m64", 300, 1000, 264, False),
    ("gemm_bf16_w16", 13, 1000, 1000, True), ("gemm_bf16_w32_f32out", 20, 72, 2560, False),
    ("gemm_bf16_w64", 64, 1000, 1000, True), ("gemm_bf16_w64_f32out", 40, 1000, 1000, False),
    ("gemm_bf16_w64", 300, 1000, 264, False),
    ("gemm_bf16", 1, 1000, 1000, True), ("gemm_bf16", 7, 72, 2560, False), ("gemm_bf16", 64, 1000, 1000, False),
    ("gemm_bf16", 300, 1000, 1000, True), ("gemm_bf16_f32out", 300, 1000, 1000, False),
    ("gemm_bf16_f32out", 1, 1000, 2560, True),
    ("gemm_bf16_wgmma", 300, 1000, 1000, True), ("gemm_bf16_wgmma", 64, 1000, 1000, False),
    ("gemm_bf16_wgmma", 7, 72, 2560, False), ("gemm_bf16_wgmma_f32out", 300, 1000, 1000, False),
    ("gemm_bf16_wgmma_f32out", 1, 1000, 1000, True), ("gemm_bf16_wgmma_n128", 300, 1000, 1000, False),
    ("gemm_bf16_wgmma_n128_f32out", 64, 1000, 1000, True), ("gemm_bf16_wgmma_nofence", 300, 1000, 1000, True),
]


def gemm_cases():
    cases = []
    for ci, (entry, M, N, K, bias) in enumerate(GEMM_CASES):
        stem, kind, BN, f32 = GEMM_ENTRIES[entry]
        shape = f"M={M} N={N} K={K} bias={'yes' if bias else 'no'}{' fp32 out' if f32 else ''}"
        block = 256
        if kind == "skinny":   # grid = [ceil(N/16), 1, 1], block 256, no dynamic shared memory
            grid, shared = [cdiv(N, 16), 1, 1], 0
        elif kind == "wide":   # grid = [ceil(N/64)*8, 1, 1] (clusters of 8), block 128, static shared only
            grid, shared, block = [cdiv(N, 64) * 8, 1, 1], 0, 128
        elif kind == "mma":    # grid = [ceil(M/128), ceil(N/128), 1], block 256, 98304 B dynamic shared
            grid, shared = ["ceil(tokens/128)", cdiv(N, 128), 1], 98304
        else:                  # grid = [ceil(M/128), ceil(N/BN), 1], block 256, 197632 B dynamic shared
            grid, shared = ["ceil(tokens/128)", cdiv(N, BN), 1], 197632
        op = SingleOp(f"single-op {entry} {shape}", stem, entry, gemm_sig(bias, f32), {"tokens": M},
                      grid=grid, block=[block, 1, 1], shared=shared)
        op.buf("x", "bf16", ["tokens", K], "input").buf("W", "bf16", [N, K], "input")
        if bias:
            op.buf("bias", "bf16", [N], "input")
        op.buf("y", "f32" if f32 else "bf16", ["tokens + 1", N], "output")
        op.bind(x=B("x"), W=B("W"), bias=B("bias") if bias else {"null": True}, y=B("y"), M=VAR("tokens"),
                N=I32(N), K=I32(K))

        def run(X, entry=entry, M=M, N=N, K=K, bias=bias, f32=f32, shape=shape, op=op, ci=ci):
            torch, vk = X.torch, X.vk
            g = vk.gen(500 + ci)
            x = torch.randn(M, K, generator=g).to(X.dev).to(X.BF)
            W = (torch.randn(N, K, generator=g) * 0.02).to(X.dev).to(X.BF)
            b = (torch.randn(N, generator=g) * 0.1).to(X.dev).to(X.BF) if bias else None
            ins = {"x": x, "W": W}
            if bias:
                ins["bias"] = b
            y = X.kern(op, ins, ["y"])["y"]
            ref = x.double() @ W.double().t()
            if bias:
                ref = ref + b.double()
            if f32:
                tref = torch.nn.functional.linear(x.float(), W.float(), b.float() if bias else None)
                ok = X.guard_nan(entry, shape, y[M:], "row past M")
                if ok:
                    X.close(entry, shape, y[:M], ref, tbf=tref, frac=2.0 ** -13, tname="torch fp32",
                            note="tol 1.5*torch_fp32_err + 2^-13 max|ref|")
            else:
                tbf = torch.nn.functional.linear(x, W, b)
                if X.guard_nan(entry, shape, y[M:], "row past M"):
                    X.close(entry, shape, y[:M], ref, tbf=tbf)
        cases.append(Case("gemm", entry, shape, op, run))
    return cases


# ============================================================================ cases: attention_prefill
# The tensor-core prefill attention (attention_prefill.cu, `kern pack --prefill-attention tc`):
# attention_dD's signature and semantics, grid ceil(tokens / (64 // G)) + seqs.
def attention_prefill_cases():
    cases = []
    mixed = [(100, 37), (499, 1), (0, 300), (0, 1), (63, 1), (15, 17), (1000, 64), (31, 33)]
    specs = [
        # name, Hq, Hkv, D, page_tokens, spec, pad_tokens, pad_seqs
        ("4B heads, page 16, mixed+pad", 32, 8, 128, 16, mixed, 3, 1),
        ("Qwen2.5-0.5B heads G=7, page 16, mixed+pad", 14, 2, 64, 16, mixed, 4, 2),
        ("G=1 D=128, page 64", 8, 8, 128, 64, [(0, 7), (200, 1), (64, 129)], 0, 0),
        # sliding windows (the last field; head_dim 64 / 128 only)
        ("window 100, 4B heads, page 16", 32, 8, 128, 16, mixed, 3, 1, 100),
        ("window 20, G=1 D=64 (64 tokens per tile)", 1, 1, 64, 16, [(170, 130), (3, 20), (0, 300)], 0, 0, 20),
        ("window 130, Qwen2.5-0.5B heads G=7 D=64", 14, 2, 64, 16, [(300, 90), (5, 40)], 3, 1, 130),
        ("window 1, G=4 D=128", 32, 8, 128, 16, mixed, 0, 0, 1),
        ("window 8192 > every context, G=2 D=64", 4, 2, 64, 16, mixed, 1, 1, 8192),
    ]
    layers, layer = 2, 1
    for ci, (name, Hq, Hkv, D, pt, spec, pad_t, pad_s, *rest) in enumerate(specs):
        window = rest[0] if rest else 0
        S = len(spec)
        pages_per = [cdiv(c + n, pt) for c, n in spec]
        max_pages = max(pages_per) + 1
        Sb, n_tok = S + pad_s, sum(n for _, n in spec)
        Tb = n_tok + pad_t
        BQ = 64 // (Hq // Hkv)
        kname = f"attention_prefill_d{D}"
        shape = f"{name}: Hq={Hq} Hkv={Hkv} seqs={S}+{pad_s} tok={n_tok}+{pad_t} pages={max_pages}"
        P = (sum(pages_per) + 3) * pt * layers * 2 * Hkv * D
        op = att_op(kname, "attention_prefill", name, Hq, Hkv, D, pt, layers, layer, Tb, Sb, max_pages, P,
                    f"ceil(tokens/{BQ}) + seqs", window)

        def run(X, Hq=Hq, Hkv=Hkv, D=D, pt=pt, spec=spec, pad_t=pad_t, pad_s=pad_s, ci=ci, shape=shape,
                kname=kname, op=op, sizes=(Sb, Tb, max_pages), window=window, P=P, BQ=BQ, name=name):
            vk = X.vk
            c = vk.build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=631 + ci)
            assert (c["Sb"], c["Tb"], c["max_pages"]) == sizes, ((c["Sb"], c["Tb"], c["max_pages"]), sizes)
            out = att_run(X, op, c)
            ref, tbf = vk.attention_refs(c, Hq, Hkv, D, D ** -0.5, window)
            n = c["n_tok"]
            X.close(kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf,
                    note="tensor cores, P as bf16 hi + lo, vs SDPA" + (f", window {window}" if window else ""))
            vk.check_rows_past(X.R, kname, shape, out, n, c["Tb"])
            rerun = (lambda w: att_run(X, side_op(X, att_op(kname, "attention_prefill", f"{name} window {w}", Hq, Hkv, D,
                                                             pt, layers, layer, sizes[1], sizes[0], sizes[2], P,
                                                             f"ceil(tokens/{BQ}) + seqs", w), f"window{w}"), c,
                                       tag=f"w{w}"))
            vk.window_extra_checks(X.R, NOT_MOCK, kname, shape, out, c, Hq, Hkv, D, window, rerun)
        cases.append(Case("attention_prefill", kname, shape, op, run))
    return cases


# ============================================================================ cases: fused decode GEMVs
# gemm_skinny.cu's fused entries (GEMM.md, "Fused decode GEMVs"): gemv_bf16's grid and block, run
# through kern against fp64 references of the unfused math; the side outputs (h, act) against the
# row-wise references, the residual update bit-exact (res + float(y), fp32). Bit identity with the
# unfused kernels themselves is packs/kernels/verify/fused_verify.py's (cupy, on the GPU).
FUSED_SIG = {
    "gemv_bf16_rms": _sig("res:in_buffer<f32> norm_w:in_buffer<bf16> h:out_buffer<bf16> W:in_buffer<bf16> bias:ptr "
                          "y:out_buffer<bf16> M:i32 N:i32 K:i32 eps:f32"),
    "gemv_bf16_add": _sig("x:in_buffer<bf16> W:in_buffer<bf16> bias:ptr y:out_buffer<bf16> res:inout_buffer<f32> "
                          "M:i32 N:i32 K:i32"),
    "gemv_bf16_swiglu_add": _sig("gate_up:in_buffer<bf16> act:out_buffer<bf16> W:in_buffer<bf16> bias:ptr "
                                 "y:out_buffer<bf16> res:inout_buffer<f32> M:i32 N:i32 K:i32"),
    "gemv_bf16_swiglu": _sig("gate_up:in_buffer<bf16> act:out_buffer<bf16> W:in_buffer<bf16> bias:ptr "
                             "y:out_buffer<bf16> M:i32 N:i32 K:i32"),
}
FUSED_SIG["gemv_bf16_rms_pf"] = FUSED_SIG["gemv_bf16_rms"]
for _k, _v in FUSED_SIG.items():
    FUSED_SIG[_k] = [(n, t.replace("_", " ")) for n, t in _v]

# entry, M, N, K: the Qwen3-0.6B shapes (qkv N 4096 K 1024, o N 1024 K 2048, down N 1024 K 3072) and odd ones
FUSED_CASES = [
    ("gemv_bf16_rms", 1, 4096, 1024), ("gemv_bf16_rms", 7, 72, 1000), ("gemv_bf16_rms", 8, 6144, 1024),
    ("gemv_bf16_rms_pf", 2, 4096, 1024),
    ("gemv_bf16_add", 1, 1024, 2048), ("gemv_bf16_add", 5, 1000, 264),
    ("gemv_bf16_swiglu_add", 1, 1024, 3072), ("gemv_bf16_swiglu_add", 8, 40, 520),
    ("gemv_bf16_swiglu", 3, 1024, 3072), ("gemv_bf16_swiglu", 2, 24, 136),
]


def fused_cases():
    cases = []
    for ci, (entry, M, N, K) in enumerate(FUSED_CASES):
        shape = f"M={M} N={N} K={K}"
        op = SingleOp(f"single-op {entry} {shape}", "gemm_skinny", entry, FUSED_SIG[entry], {"tokens": M},
                      grid=[cdiv(N, 16), 1, 1], block=[256, 1, 1])
        op.buf("W", "bf16", [N, K], "input").buf("y", "bf16", ["tokens + 1", N], "output")
        rms, swi, add = entry.startswith("gemv_bf16_rms"), "swiglu" in entry, entry.endswith("_add")
        if rms:
            op.buf("res", "f32", ["tokens", K], "input").buf("norm_w", "bf16", [K], "input")
            op.buf("h", "bf16", ["tokens + 1", K], "output")
            op.bind(res=B("res"), norm_w=B("norm_w"), h=B("h"), W=B("W"), bias={"null": True}, y=B("y"),
                    M=VAR("tokens"), N=I32(N), K=I32(K), eps=F32(EPS))
        elif swi:
            op.buf("gate_up", "bf16", ["tokens", 2 * K], "input").buf("act", "bf16", ["tokens + 1", K], "output")
            binds = dict(gate_up=B("gate_up"), act=B("act"), W=B("W"), bias={"null": True}, y=B("y"), M=VAR("tokens"),
                         N=I32(N), K=I32(K))
            if add:
                op.buf("res", "f32", ["tokens + 1", N], "input")
                binds["res"] = B("res")
            op.bind(**binds)
        else:
            op.buf("x", "bf16", ["tokens", K], "input").buf("res", "f32", ["tokens + 1", N], "input")
            op.bind(x=B("x"), W=B("W"), bias={"null": True}, y=B("y"), res=B("res"), M=VAR("tokens"), N=I32(N), K=I32(K))

        def run(X, entry=entry, M=M, N=N, K=K, shape=shape, op=op, ci=ci, rms=rms, swi=swi, add=add):
            torch, vk = X.torch, X.vk
            g = vk.gen(700 + ci)
            W = (torch.randn(N, K, generator=g) * 0.02).to(X.dev).to(X.BF)
            ins, outs = {"W": W}, ["y"]
            if rms:
                res = (torch.randn(M, K, generator=g) * 2.0).to(X.dev)
                w = (1 + 0.1 * torch.randn(K, generator=g)).to(X.dev).to(X.BF)
                ins.update(res=res, norm_w=w)
                outs.append("h")
                href = vk.ref_rmsnorm(res.double(), w)
                # torch's rms_norm_f32: normalized in fp32, rounded to bf16, times the bf16 weight
                xin = w * (res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + EPS)).to(X.BF)
                htorch = xin
            elif swi:
                gu = vk.randn((M, 2 * K), 900 + ci, 2.0)
                ins["gate_up"] = gu
                outs.append("act")
                gg, uu = gu[:, :K], gu[:, K:]
                aref = torch.nn.functional.silu(gg.double()) * uu.double()
                xin = (torch.nn.functional.silu(gg) * uu).to(X.BF)
            else:
                xin = torch.randn(M, K, generator=g).to(X.dev).to(X.BF)
                ins["x"] = xin
            if add:
                res0 = vk.nanfull((M + 1, N), torch.float32)
                res0[:M] = (torch.randn(M, N, generator=g) * 3.0).to(X.dev)
                ins["res"] = res0
                outs.append("res")
            got = X.kern(op, ins, outs)
            y = got["y"]
            X.guard_nan(entry, shape, y[M:], "row past M")
            if rms:
                X.guard_nan(entry + "(h)", shape, got["h"][M:], "row past M")
                X.close(entry + "(h)", shape, got["h"][:M], href, tbf=htorch)
                xin = got["h"][:M]  # the GEMM's x is exactly the h it wrote (fused_verify.py proves the bits)
            if swi:
                X.guard_nan(entry + "(act)", shape, got["act"][M:], "row past M")
                X.close(entry + "(act)", shape, got["act"][:M], aref, tbf=xin)
                xin = got["act"][:M]
            ref = xin.double() @ W.double().t()
            X.close(entry, shape, y[:M], ref, tbf=torch.nn.functional.linear(xin, W))
            if add:
                r = got["res"]
                want = res0[:M] + y[:M].float()
                exact = vk.bits_equal(r[:M], want) and bool(torch.isnan(r[M:]).all())
                X.R.add(kernel=entry + "(residual)", shape=shape, err=0.0, status="PASS" if exact else "FAIL",
                        note="res + float(y), fp32, bit-exact; guard row untouched" if exact else
                        f"residual != res + float(y): {int((r[:M] != want).sum())} differ, or the guard row was written")
        cases.append(Case("fused", entry, shape, op, run))
    return cases


GROUPS = ["rowwise", "kv_write", "qk_norm_rope", "attention", "attention_decode", "attention_prefill", "argmax", "sample",
          "gemm", "fused"]


def all_cases():
    return (rowwise_cases() + kv_write_cases() + qk_norm_rope_cases() + attention_cases() + attention_decode_cases()
            + attention_prefill_cases()
            + argmax_cases() + sample_cases() + gemm_cases() + fused_cases())


# ============================================================================ main
def parse_args(argv):
    o = {"dir": "build/packs", "kern": ".carry/kern", "check_only": False, "list": False, "only": None,
         "keep": None, "ref_device": None, "timeout": 180.0, "deadline": 540.0}
    rest, pos = list(argv), []
    while rest:
        a = rest.pop(0)
        if a == "--kern":
            o["kern"] = rest.pop(0)
        elif a == "--check-only":
            o["check_only"] = True
        elif a == "--list":
            o["list"] = True
        elif a == "--only":
            o["only"] = [s for s in rest.pop(0).split(",") if s]
        elif a == "--keep":
            o["keep"] = rest.pop(0)
        elif a == "--ref-device":
            o["ref_device"] = rest.pop(0)
        elif a == "--timeout":
            o["timeout"] = float(rest.pop(0))
        elif a == "--deadline":
            o["deadline"] = float(rest.pop(0))
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a.startswith("--"):
            sys.exit(f"verify_with_kern: unknown option {a} (see --help)")
        else:
            pos.append(a)
    if pos:
        o["dir"] = pos[0]
    return o


def select(cases, only):
    if not only:
        return cases
    return [c for c in cases if any(s == c.group or s in c.kernel for s in only)]


def case_dir(root, i, c):
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in f"{i:03d}_{c.kernel}")
    return os.path.join(root, safe)


def cubin_present(cubin_dir, stem):
    return os.path.exists(os.path.join(cubin_dir, f"{stem}.sm_90a.cubin"))


def main_check(o, cases, root):
    R = Results()
    for i, c in enumerate(cases):
        if c.group == "gemm" and not cubin_present(o["dir"], c.op.stem):
            R.add(kernel=c.kernel, shape=c.shape, status="SKIP", note=f"{c.op.stem}.sm_90a.cubin not built")
            continue
        try:
            path = c.op.write(case_dir(root, i, c), o["dir"])
            ok, first, warnings, text = kern_check(o["kern"], path)
            if not ok:
                print(text)
            note = first.replace(path + ": ", "") if ok else \
                " | ".join(ln.replace(path + ": ", "") for ln in text.splitlines() if ln.strip())[:400]
            if warnings:
                note += f" | {len(warnings)} warning(s): " + " | ".join(warnings)[:300]
            R.add(kernel=c.kernel, shape=c.shape, status="PASS" if ok and not warnings else ("WARN" if ok else "FAIL"),
                  note=note)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            R.add(kernel=c.kernel, shape=c.shape, status="FAIL", note=f"{type(e).__name__}: {e}"[:300])
    print("\n========== kern check: single-op manifests ==========")
    print_table(R.rows, heads=("kernel", "case", "status", "kern check"), keys=("kernel", "shape", "status", "note"),
                widths_max=(30, 80, 6, 120))
    npass, nfail, nwarn, nskip = R.count("PASS"), R.count("FAIL"), R.count("WARN"), R.count("SKIP")
    print(f"\n{npass} passed, {nfail} failed" + (f", {nskip} skipped" if nskip else "")
          + (f" ({nwarn} with warnings)" if nwarn else ""))
    return 1 if nfail or nwarn else 0


def main_run(o, cases, root):
    import numpy as np
    import torch
    import verify_kernels as vk
    dev = o["ref_device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    vk.torch, vk.np, vk.DEV, vk.BF = torch, np, dev, torch.bfloat16
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible to torch"
    print(f"  torch {torch.__version__}, numpy {np.__version__}, references on {dev} ({gpu})", flush=True)
    R = Results()
    runner = KernRunner(o["kern"], o["dir"], o["timeout"], torch, np, dev)
    X = Ctx(torch, np, vk, dev, R, runner)
    t_all = time.time()
    for i, c in enumerate(cases):
        if c.group == "gemm" and not cubin_present(o["dir"], c.op.stem):
            R.add(kernel=c.kernel, shape=c.shape, status="SKIP", note=f"{c.op.stem}.sm_90a.cubin not built")
            continue
        if time.time() - t_all > o["deadline"]:
            R.add(kernel=c.kernel, shape=c.shape, status="FAIL", note=f"not run: the {o['deadline']:.0f} s deadline passed")
            continue
        print(f"\n--- [{i + 1}/{len(cases)}] {c.kernel}: {c.shape}", flush=True)
        d = case_dir(root, i, c)
        X.case_dir = d  # a case writes any further manifest of its own beneath it (side_op)
        before = len(R.rows)
        t0 = time.time()
        try:
            c.op.write(d, o["dir"])
            runner.last_gpu_ms = None
            c.run(X)
            if len(R.rows) == before:
                R.add(kernel=c.kernel, shape=c.shape, status="FAIL", note="the case reported nothing")
        except KernError as e:
            print(f"  {e.what} failed (exit {e.rc}): {' '.join(e.cmd)}\n  ---- kern stderr ----\n{e.stderr.rstrip()}\n"
                  f"  ---------------------", flush=True)
            last = [ln for ln in e.stderr.strip().splitlines() if ln.strip()]
            R.add(kernel=c.kernel, shape=c.shape, status="FAIL",
                  note=f"{e.what} exit {e.rc}: {last[-1] if last else ''}"[:300])
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            R.add(kernel=c.kernel, shape=c.shape, status="FAIL", note=f"exception: {type(e).__name__}: {e}"[:300])
        finally:
            if not o["keep"]:
                shutil.rmtree(d, ignore_errors=True)
        print(f"    ({time.time() - t0:.1f} s)", flush=True)
    print("\n\n========== SUMMARY: kernels through `kern run`, single-op manifests ==========")
    print_table(R.rows)
    npass, nfail, nskip = R.count("PASS"), R.count("FAIL"), R.count("SKIP")
    print(f"\n{runner.runs} kern runs ({runner.wall:.1f} s in kern), {time.time() - t_all:.1f} s in all")
    print(f"{npass} passed, {nfail} failed" + (f", {nskip} skipped" if nskip else ""))
    return 1 if nfail else 0


def main(argv):
    o = parse_args(argv)
    cases = select(all_cases(), o["only"])
    if not cases:
        sys.exit(f"verify_with_kern: --only {o['only']} selects no case (groups: {', '.join(GROUPS)})")
    if o["list"]:
        for i, c in enumerate(cases):
            print(f"{i + 1:3d}  {c.group:13s} {c.kernel:28s} {c.shape}")
        print(f"{len(cases)} cases")
        return 0
    if not os.path.exists(o["kern"]):
        sys.exit(f"verify_with_kern: no kern binary at {o['kern']} (--kern PATH; scripts/gpu/prepare-carry.sh "
                 f"builds .carry/kern, `cargo build -p kern` target/debug/kern)")
    o["kern"] = os.path.abspath(o["kern"])
    o["dir"] = os.path.abspath(o["dir"])
    if not os.path.isdir(o["dir"]):
        sys.exit(f"verify_with_kern: no cubin directory {o['dir']} (run packs/kernels/build.sh)")
    print(f"verify_with_kern: kern {o['kern']}, cubins {o['dir']}, {len(cases)} cases"
          f"{' (check only)' if o['check_only'] else ''}", flush=True)
    sums = os.path.join(o["dir"], "SHA256SUMS")
    if os.path.exists(sums):
        with open(sums) as fh:
            for line in fh:
                if ".cubin" in line:
                    print("  " + line.strip())
    if o["keep"]:
        root = os.path.abspath(o["keep"])
        os.makedirs(root, exist_ok=True)
    else:
        root = tempfile.mkdtemp(prefix="kern_verify_")
    try:
        return main_check(o, cases, root) if o["check_only"] else main_run(o, cases, root)
    finally:
        if not o["keep"]:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
