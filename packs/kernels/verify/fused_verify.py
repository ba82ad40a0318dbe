#!/usr/bin/env python3
"""GPU check of the fused decode GEMVs (gemm_skinny.cu: gemv_bf16_rms, gemv_bf16_add,
gemv_bf16_swiglu_add, gemv_bf16_swiglu, and the experimental gemv_bf16_rms_pf; packs/kernels/GEMM.md,
"Fused decode GEMVs"): every output
must be BIT-IDENTICAL to the unfused sequence of the pack's own kernels, and the fused sequence's
time is printed beside the unfused one's.

usage: python3 packs/kernels/verify/fused_verify.py [CUBIN_DIR] [--no-timing] [--only qwen|sandwich]

CUBIN_DIR (default build/packs) must hold rowwise.sm_90a.cubin and gemm_skinny.sm_90a.cubin
(packs/kernels/build.sh); a missing file or entry is a FAIL. Needs torch and cupy (as
gemm_verify.py). ~1 minute on an H200.

The cases are the four groups the fused decode program (kern_packs::fused) launches for
steps of 1..8 tokens, against what the unfused program launches for the same work:
  qkv        rms_norm_f32 -> gemv_bf16                          vs gemv_bf16_rms
             (layer 0's input norm + QKV; also the gate-up shape)
  o+gate_up  gemv_bf16 -> add_rms_norm_f32 -> gemv_bf16          vs gemv_bf16_add -> gemv_bf16_rms
  down+qkv   swiglu -> gemv_bf16 -> add_rms_norm_f32 -> gemv_bf16 vs gemv_bf16_swiglu_add -> gemv_bf16_rms
  down       swiglu -> gemv_bf16                                vs gemv_bf16_swiglu (the last layer)
compared element for element as bits: every output the op has (h, qkv / o, the fp32 residual, h,
gate_up / act, mlp, ...), for M = 1..8 and the Qwen3 0.6B / 4B / 8B shapes, Qwen2.5-0.5B's, and odd
ones (N not a multiple of 16, K not a multiple of 512, K < 512, a QKV bias); outputs are NaN-poisoned
with a guard row past M, which must stay untouched (the residual's guard row keeps its values). A
long-row case (K = 32768, 64 rows in 8 launches) makes an rstd that differs in its last bit visible
(~1 flipped bf16 value per row), and the SwiGLU gates cover large magnitudes (exp overflow), tiny
values and zeros. One PASS/FAIL line per case; the timing table last (median of back-to-back runs
behind a GPU sleep, weights rotated through >= 256 MB of copies so L2 cannot serve them); exit 1 on
any failure.

Sandwich-norm blocks (issue 24, Gemma 3: four (off + w) norms, GeGLU-tanh; `--only sandwich` runs
only these), the groups the fused program launches for them:
  qkv0       rms_norm_f32_off -> gemv_bf16                       vs gemv_bf16_rms_off (layer 0)
  o+gate_up  gemv_bf16 -> rms_norm_off -> add_rms_norm_f32_off -> gemv_bf16
                                                 vs gemv_bf16 -> gemv_bf16_postnorm_rms (and _pf),
                                                    and postnorm_add_rms_norm_f32_off (steps > 8)
  down+qkv   geglu_tanh -> gemv_bf16 -> rms_norm_off -> add_rms_norm_f32_off -> gemv_bf16
                                                 vs gemv_bf16_geglu -> gemv_bf16_postnorm_rms
  down       geglu_tanh -> gemv_bf16 (-> add_rms_norm_f32's residual update)
                                                 vs gemv_bf16_geglu (gemv_bf16_geglu_add)
The unfused chain updates the residual in place; the fused entries read x_in and write x_out (another
buffer), which must equal the chain's residual bit for bit while x_in stays as it was. Shapes: Gemma 3
270M / 1B / 4B / 12B and odd ones, offsets 1 (Hugging Face) and 0 (GGUF), M = 1..8, long rows
(K = 32768); GeGLU gates over large magnitudes (tanh saturated), tiny values and zeros. Timing: per
layer o+gate_up and down+qkv, 9 launches unfused vs 4 fused (the O GEMV in both).
"""
import argparse
import math
import os
import sys
import time

EPS = 1e-6
GUARD_ROWS = 1

# name -> (H, I, qkv N, attention size (the O projection's K), bias?)
SHAPES = [
    ("qwen3-0.6b", 1024, 3072, 4096, 2048, False),
    ("qwen3-4b", 2560, 9728, 6144, 4096, False),
    ("qwen3-8b", 4096, 12288, 6144, 4096, False),
    ("qwen2.5-0.5b", 896, 4864, 1152, 896, True),
    ("odd-a", 1000, 520, 72, 264, True),
    ("odd-b", 64, 8, 24, 136, False),
    ("odd-c", 520, 1544, 40, 1032, True),
]
TIMED = ["qwen3-0.6b", "qwen3-4b", "qwen3-8b"]

# Sandwich blocks: name -> (H, I, qkv N, attention size, bias?, norm offset)
SANDWICH_SHAPES = [
    ("gemma-3-270m", 640, 2048, 1536, 1024, False, 1.0),
    ("gemma-3-1b", 1152, 6912, 1536, 1024, False, 1.0),
    ("gemma-3-4b", 2560, 10240, 4096, 2048, False, 1.0),
    ("gemma-3-12b", 3840, 15360, 8192, 4096, False, 1.0),
    ("gemma-3-1b-gguf", 1152, 6912, 1536, 1024, False, 0.0),
    ("odd-a", 1000, 520, 72, 264, True, 1.0),
    ("odd-c", 520, 1544, 40, 1032, True, 0.0),
]
SANDWICH_TIMED = ["gemma-3-1b", "gemma-3-4b", "gemma-3-12b"]

ENTRIES = {
    "rowwise": ["rms_norm_f32", "add_rms_norm_f32", "swiglu", "rms_norm_f32_off", "rms_norm_off", "add_rms_norm_f32_off",
                "geglu_tanh", "postnorm_add_rms_norm_f32_off"],
    "gemm_skinny": ["gemv_bf16", "gemv_bf16_rms", "gemv_bf16_rms_pf", "gemv_bf16_add", "gemv_bf16_swiglu_add",
                    "gemv_bf16_swiglu", "gemv_bf16_rms_off", "gemv_bf16_postnorm_rms", "gemv_bf16_postnorm_rms_pf",
                    "gemv_bf16_geglu_add", "gemv_bf16_geglu"],
}


def cdiv(a, b):
    return (a + b - 1) // b


class K:
    """The cubins' entries, launched on torch's current stream through cupy."""

    def __init__(self, cubin_dir):
        import cupy
        import numpy as np
        import torch
        self.cupy, self.np, self.torch = cupy, np, torch
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        self.fns, self.missing = {}, []
        for stem, names in ENTRIES.items():
            path = os.path.join(cubin_dir, stem + ".sm_90a.cubin")
            if not os.path.exists(path):
                self.missing += [f"{stem}: no file {path}"]
                continue
            mod = cupy.RawModule(path=path)
            for n in names:
                try:
                    self.fns[n] = mod.get_function(n)
                except Exception as e:  # noqa: BLE001
                    self.missing.append(f"{stem}.{n}: {e!r}")

    def p(self, t):
        return self.np.uint64(0 if t is None else t.data_ptr())

    def i(self, v):
        return self.np.int32(v)

    def launch(self, name, grid, block, args):
        with self.stream:
            self.fns[name]((grid, 1, 1), (block, 1, 1), args)

    # the unfused kernels (rowwise.cu, gemv_bf16) and the fused GEMVs, as the manifest launches them
    def rms_norm(self, h, res, w, M, H):
        self.launch("rms_norm_f32", M, 128, (self.p(h), self.p(res), self.p(w), self.i(M), self.i(H), self.np.float32(EPS)))

    def add_rms_norm(self, h, res, x, w, M, H):
        self.launch("add_rms_norm_f32", M, 128,
                    (self.p(h), self.p(res), self.p(x), self.p(w), self.i(M), self.i(H), self.np.float32(EPS)))

    def swiglu(self, act, gu, M, I):
        self.launch("swiglu", M, 256, (self.p(act), self.p(gu), self.i(M), self.i(I)))

    def gemv(self, x, W, b, y, M, N, Kd):
        self.launch("gemv_bf16", cdiv(N, 16), 256, (self.p(x), self.p(W), self.p(b), self.p(y), self.i(M), self.i(N), self.i(Kd)))

    def gemv_rms(self, res, w, h, W, b, y, M, N, Kd, entry="gemv_bf16_rms"):
        self.launch(entry, cdiv(N, 16), 256, (self.p(res), self.p(w), self.p(h), self.p(W), self.p(b), self.p(y),
                                              self.i(M), self.i(N), self.i(Kd), self.np.float32(EPS)))

    def gemv_add(self, x, W, b, y, res, M, N, Kd):
        self.launch("gemv_bf16_add", cdiv(N, 16), 256,
                    (self.p(x), self.p(W), self.p(b), self.p(y), self.p(res), self.i(M), self.i(N), self.i(Kd)))

    def gemv_swiglu_add(self, gu, act, W, b, y, res, M, N, Kd):
        self.launch("gemv_bf16_swiglu_add", cdiv(N, 16), 256,
                    (self.p(gu), self.p(act), self.p(W), self.p(b), self.p(y), self.p(res), self.i(M), self.i(N), self.i(Kd)))

    def gemv_swiglu(self, gu, act, W, b, y, M, N, Kd):
        self.launch("gemv_bf16_swiglu", cdiv(N, 16), 256,
                    (self.p(gu), self.p(act), self.p(W), self.p(b), self.p(y), self.i(M), self.i(N), self.i(Kd)))

    # sandwich blocks ((off + w) norms, GeGLU)
    def f(self, v):
        return self.np.float32(v)

    def rms_norm_f32_off(self, h, res, w, M, H, off):
        self.launch("rms_norm_f32_off", M, 128, (self.p(h), self.p(res), self.p(w), self.i(M), self.i(H), self.f(EPS), self.f(off)))

    def rms_norm_off(self, out, x, w, M, H, off):
        self.launch("rms_norm_off", M, 128, (self.p(out), self.p(x), self.p(w), self.i(M), self.i(H), self.f(EPS), self.f(off)))

    def add_rms_norm_off(self, h, res, x, w, M, H, off):
        self.launch("add_rms_norm_f32_off", M, 128,
                    (self.p(h), self.p(res), self.p(x), self.p(w), self.i(M), self.i(H), self.f(EPS), self.f(off)))

    def geglu(self, act, gu, M, I):
        self.launch("geglu_tanh", M, 256, (self.p(act), self.p(gu), self.i(M), self.i(I)))

    def postnorm_row(self, h, x_out, x_in, o, wp, wn, M, H, off):
        self.launch("postnorm_add_rms_norm_f32_off", M, 128, (self.p(h), self.p(x_out), self.p(x_in), self.p(o), self.p(wp), self.p(wn),
                                                               self.i(M), self.i(H), self.f(EPS), self.f(off)))

    def gemv_rms_off(self, res, w, h, W, b, y, M, N, Kd, off):
        self.launch("gemv_bf16_rms_off", cdiv(N, 16), 256, (self.p(res), self.p(w), self.p(h), self.p(W), self.p(b), self.p(y),
                                                              self.i(M), self.i(N), self.i(Kd), self.f(EPS), self.f(off)))

    def gemv_postnorm(self, x_in, o, wp, x_out, wn, h, W, b, y, M, N, Kd, off, entry="gemv_bf16_postnorm_rms"):
        self.launch(entry, cdiv(N, 16), 256, (self.p(x_in), self.p(o), self.p(wp), self.p(x_out), self.p(wn), self.p(h), self.p(W),
                                              self.p(b), self.p(y), self.i(M), self.i(N), self.i(Kd), self.f(EPS), self.f(off)))

    def gemv_geglu(self, gu, act, W, b, y, M, N, Kd):
        self.launch("gemv_bf16_geglu", cdiv(N, 16), 256,
                    (self.p(gu), self.p(act), self.p(W), self.p(b), self.p(y), self.i(M), self.i(N), self.i(Kd)))

    def gemv_geglu_add(self, gu, act, W, b, y, res, M, N, Kd):
        self.launch("gemv_bf16_geglu_add", cdiv(N, 16), 256,
                    (self.p(gu), self.p(act), self.p(W), self.p(b), self.p(y), self.p(res), self.i(M), self.i(N), self.i(Kd)))


class Run:
    def __init__(self, k):
        self.k, self.torch = k, k.torch
        self.dev = self.torch.device("cuda:0")
        self.g = self.torch.Generator(device=self.dev)
        self.g.manual_seed(2026)
        self.fails, self.passes, self.timing = 0, 0, []

    def report(self, ok, what, detail=""):
        print(f"{'PASS' if ok else 'FAIL'} {what}{(': ' + detail) if detail else ''}", flush=True)
        if ok:
            self.passes += 1
        else:
            self.fails += 1

    # -- data
    def randn(self, *shape, scale=1.0):
        return self.torch.randn(*shape, generator=self.g, device=self.dev) * scale

    def bf(self, *shape, scale=1.0):
        return self.randn(*shape, scale=scale).to(self.torch.bfloat16)

    def residual(self, rows, H):
        r = self.randn(rows, H, scale=2.0)
        spikes = self.torch.rand(rows, H, generator=self.g, device=self.dev) < 0.01  # outlier features
        return self.torch.where(spikes, r * 30.0, r).contiguous()

    def gate_up(self, rows, I):
        torch = self.torch
        gu = self.randn(rows, 2 * I, scale=2.0)
        kind = torch.randint(0, 16, (rows, 2 * I), generator=self.g, device=self.dev)
        gu = torch.where(kind == 0, gu * 40.0, gu)   # exp(-g) over- and underflows
        gu = torch.where(kind == 1, gu * 1e-3, gu)   # tiny
        gu = torch.where(kind == 2, torch.zeros_like(gu), gu)
        return gu.to(torch.bfloat16).contiguous()

    def out(self, M, N, dtype=None):
        """[M + GUARD_ROWS, N] filled with NaN (the guard rows must stay NaN)."""
        torch = self.torch
        return torch.full((M + GUARD_ROWS, N), float("nan"), dtype=dtype or torch.bfloat16, device=self.dev)

    # -- comparison
    def same(self, a, b, M, guard_nan=True):
        """Bits of rows [0, M) equal; rows past M of b untouched (NaN) — a is the unfused output."""
        torch = self.torch
        it = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        va, vb = a[:M].contiguous().view(it), b[:M].contiguous().view(it)
        diff = int((va != vb).sum().item())
        if diff:
            idx = int((va != vb).flatten().nonzero()[0].item())
            r, c = divmod(idx, a.shape[1])
            mask = 0xffff if it == torch.int16 else 0xffffffff
            return f"{diff} of {va.numel()} differ (first at row {r} col {c}: {int(va.flatten()[idx]) & mask:#x} vs "\
                   f"{int(vb.flatten()[idx]) & mask:#x})"
        if guard_nan and not bool(torch.isnan(b[M:].float()).all().item()):
            return "a guard row past M was written"
        return ""

    def same_res(self, a, b, M, before):
        """fp32 residual rows [0, M) bit-equal, guard rows as they were."""
        torch = self.torch
        d = self.same(a, b, M, guard_nan=False)
        if d:
            return d
        if not bool((b[M:].view(torch.int32) == before[M:].view(torch.int32)).all().item()):
            return "a residual guard row was written"
        return ""

    def check(self, what, pairs):
        bad = [f"{n}: {d}" for n, d in pairs if d]
        self.report(not bad, what, "; ".join(bad))

    # -- the four groups (weights: one set per shape, from weights())
    def weights(self, sh):
        name, H, I, QKV, A, bias = sh
        return dict(w=self.bf(H), qkv=self.bf(QKV, H, scale=0.05), b=self.bf(QKV, scale=0.5) if bias else None,
                    gu=self.bf(2 * I, H, scale=0.05), gu_b=self.bf(2 * I, scale=0.5) if bias else None,
                    o=self.bf(H, A, scale=0.05), d=self.bf(H, I, scale=0.05))

    def case_qkv(self, sh, Wt, M, tag="qkv"):
        name, H, I, QKV, A, bias = sh
        torch, k = self.torch, self.k
        res = self.residual(M + GUARD_ROWS, H)
        res0 = res.clone()
        w, W, b = Wt["w"], (Wt["qkv"] if tag == "qkv" else Wt["gu"]), (Wt["b"] if tag == "qkv" else Wt["gu_b"])
        N = W.shape[0]
        h1, y1, h2, y2, h3, y3 = (self.out(M, n) for n in (H, N, H, N, H, N))
        k.rms_norm(h1, res, w, M, H)
        k.gemv(h1, W, b, y1, M, N, H)
        k.gemv_rms(res, w, h2, W, b, y2, M, N, H)
        k.gemv_rms(res, w, h3, W, b, y3, M, N, H, entry="gemv_bf16_rms_pf")
        torch.cuda.synchronize()
        self.check(f"{name} {tag} M={M} (N={N} K={H}): gemv_bf16_rms (and _pf) == rms_norm_f32 -> gemv_bf16",
                   [("h", self.same(h1, h2, M)), (tag, self.same(y1, y2, M)), ("h (_pf)", self.same(h1, h3, M)),
                    (f"{tag} (_pf)", self.same(y1, y3, M)),
                    ("residual", "" if torch.equal(res.view(torch.int32), res0.view(torch.int32)) else "the residual was written")])

    def case_o_gate_up(self, sh, Wt, M):
        name, H, I, QKV, A, bias = sh
        torch, k = self.torch, self.k
        attn = self.bf(M + GUARD_ROWS, A)
        Wo, w, Wgu = Wt["o"], Wt["w"], Wt["gu"]
        res = self.residual(M + GUARD_ROWS, H)
        r1, r2 = res.clone(), res.clone()
        o1, h1, gu1 = self.out(M, H), self.out(M, H), self.out(M, 2 * I)
        o2, h2, gu2 = self.out(M, H), self.out(M, H), self.out(M, 2 * I)
        k.gemv(attn, Wo, None, o1, M, H, A)
        k.add_rms_norm(h1, r1, o1, w, M, H)
        k.gemv(h1, Wgu, None, gu1, M, 2 * I, H)
        k.gemv_add(attn, Wo, None, o2, r2, M, H, A)
        k.gemv_rms(r2, w, h2, Wgu, None, gu2, M, 2 * I, H)
        torch.cuda.synchronize()
        self.check(f"{name} o+gate_up M={M}: gemv_bf16_add -> gemv_bf16_rms == gemv_bf16 -> add_rms_norm_f32 -> gemv_bf16",
                   [("o", self.same(o1, o2, M)), ("residual", self.same_res(r1, r2, M, res)), ("h", self.same(h1, h2, M)),
                    ("gate_up", self.same(gu1, gu2, M))])

    def case_down_qkv(self, sh, Wt, M, last=False):
        name, H, I, QKV, A, bias = sh
        torch, k = self.torch, self.k
        gu = self.gate_up(M + GUARD_ROWS, I)
        Wd, w, Wq, b = Wt["d"], Wt["w"], Wt["qkv"], Wt["b"]
        res = self.residual(M + GUARD_ROWS, H)
        r1, r2 = res.clone(), res.clone()
        a1, m1, h1, q1 = self.out(M, I), self.out(M, H), self.out(M, H), self.out(M, QKV)
        a2, m2, h2, q2 = self.out(M, I), self.out(M, H), self.out(M, H), self.out(M, QKV)
        k.swiglu(a1, gu, M, I)
        k.gemv(a1, Wd, None, m1, M, H, I)
        if last:
            k.gemv_swiglu(gu, a2, Wd, None, m2, M, H, I)
            torch.cuda.synchronize()
            self.check(f"{name} down (last layer) M={M}: gemv_bf16_swiglu == swiglu -> gemv_bf16",
                       [("act", self.same(a1, a2, M)), ("mlp", self.same(m1, m2, M))])
            return
        k.add_rms_norm(h1, r1, m1, w, M, H)
        k.gemv(h1, Wq, b, q1, M, QKV, H)
        k.gemv_swiglu_add(gu, a2, Wd, None, m2, r2, M, H, I)
        k.gemv_rms(r2, w, h2, Wq, b, q2, M, QKV, H)
        torch.cuda.synchronize()
        self.check(f"{name} down+qkv M={M}: gemv_bf16_swiglu_add -> gemv_bf16_rms == swiglu -> gemv_bf16 -> add_rms_norm_f32 -> gemv_bf16",
                   [("act", self.same(a1, a2, M)), ("mlp", self.same(m1, m2, M)), ("residual", self.same_res(r1, r2, M, res)),
                    ("h", self.same(h1, h2, M)), ("qkv", self.same(q1, q2, M))])

    def correctness(self):
        for sh in SHAPES:
            name = sh[0]
            Wt = self.weights(sh)
            for M in range(1, 9):
                for what, f in (("qkv", lambda: self.case_qkv(sh, Wt, M)),
                                ("gate_up", lambda: self.case_qkv(sh, Wt, M, "gate_up")),
                                ("o+gate_up", lambda: self.case_o_gate_up(sh, Wt, M)),
                                ("down+qkv", lambda: self.case_down_qkv(sh, Wt, M)),
                                ("down", lambda: self.case_down_qkv(sh, Wt, M, last=True))):
                    if what == "gate_up" and M not in (1, 8):
                        continue
                    try:
                        f()
                    except Exception as e:  # noqa: BLE001
                        self.report(False, f"{name} {what} M={M}", repr(e))
                        if "illegal" in repr(e).lower() or "launch failure" in repr(e).lower():
                            raise
            del Wt
        # Long rows: an rstd one ulp off flips ~1 of 32768 bf16 values per row: 64 rows.
        long = ("long-rows", 32768, 64, 48, 64, False)
        Wt = self.weights(long)
        for _ in range(8):
            self.case_qkv(long, Wt, 8)

    # -- timing
    def timed(self, groups, reps=25):
        """Median time (s) of one group (a list of launch callables), groups[r % len] run back to
        back behind a GPU sleep."""
        torch = self.torch
        per = 8
        for f in groups[0]:
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for j in range(per):
            for f in groups[j % len(groups)]:
                f()
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        sleep = int(max(host * 3.0 + 100e-6, 300e-6) * 2.0e9)
        st = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        en = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            torch.cuda._sleep(sleep)
            st[r].record()
            for j in range(per):
                for f in groups[(r * per + j) % len(groups)]:
                    f()
            en[r].record()
        torch.cuda.synchronize()
        ts = sorted(a.elapsed_time(b) * 1e-3 / per for a, b in zip(st, en))
        return ts[len(ts) // 2]

    def bench(self):
        torch, k = self.torch, self.k
        for sh in SHAPES:
            name, H, I, QKV, A, bias = sh
            if name not in TIMED:
                continue
            per_layer = (QKV * H + H * A + 2 * I * H + H * I) * 2
            copies = max(2, min(8, cdiv(256 << 20, per_layer)))
            Ws = [dict(qkv=self.bf(QKV, H, scale=0.05), o=self.bf(H, A, scale=0.05), gu=self.bf(2 * I, H, scale=0.05),
                       d=self.bf(H, I, scale=0.05)) for _ in range(copies)]
            w = self.bf(H)
            for M in (1, 4, 8):
                res = self.residual(M, H)
                attn, gu = self.bf(M, A), self.gate_up(M, I)
                h, qkv, o, gu_o, act, mlp = (torch.empty(M, n, dtype=torch.bfloat16, device=self.dev) for n in (H, QKV, H, 2 * I, I, H))
                # The residual grows with every add in the loop: reset it now and then is not
                # needed for timing (finite values stay finite over a few hundred adds).
                groups = {
                    "qkv (input norm + QKV)": (
                        [[lambda W=W: k.rms_norm(h, res, w, M, H), lambda W=W: k.gemv(h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws],
                        [[lambda W=W: k.gemv_rms(res, w, h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws]),
                    "qkv with gemv_bf16_rms_pf": (
                        [[lambda W=W: k.rms_norm(h, res, w, M, H), lambda W=W: k.gemv(h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws],
                        [[lambda W=W: k.gemv_rms(res, w, h, W["qkv"], None, qkv, M, QKV, H, entry="gemv_bf16_rms_pf")] for W in Ws]),
                    "o+gate_up": (
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A), lambda W=W: k.add_rms_norm(h, res, o, w, M, H),
                          lambda W=W: k.gemv(h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws],
                        [[lambda W=W: k.gemv_add(attn, W["o"], None, o, res, M, H, A),
                          lambda W=W: k.gemv_rms(res, w, h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws]),
                    "down+qkv": (
                        [[lambda W=W: k.swiglu(act, gu, M, I), lambda W=W: k.gemv(act, W["d"], None, mlp, M, H, I),
                          lambda W=W: k.add_rms_norm(h, res, mlp, w, M, H), lambda W=W: k.gemv(h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws],
                        [[lambda W=W: k.gemv_swiglu_add(gu, act, W["d"], None, mlp, res, M, H, I),
                          lambda W=W: k.gemv_rms(res, w, h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws]),
                    "down (last layer)": (
                        [[lambda W=W: k.swiglu(act, gu, M, I), lambda W=W: k.gemv(act, W["d"], None, mlp, M, H, I)] for W in Ws],
                        [[lambda W=W: k.gemv_swiglu(gu, act, W["d"], None, mlp, M, H, I)] for W in Ws]),
                }
                layer_u = layer_f = 0.0
                for g, (unf, fus) in groups.items():
                    tu, tf = self.timed(unf), self.timed(fus)
                    res.copy_(self.residual(M, H))
                    self.timing.append((name, M, g, len(unf[0]), len(fus[0]), tu, tf))
                    if g in ("o+gate_up", "down+qkv"):
                        layer_u += tu
                        layer_f += tf
                self.timing.append((name, M, "per layer (o+gate_up, down+qkv)", 7, 4, layer_u, layer_f))
            del Ws
            torch.cuda.empty_cache()

    # -- sandwich blocks (Gemma 3)
    def norm_w0(self, H):
        """A zero-centred norm weight (small values around 0; the offset adds the 1)."""
        return self.bf(H, scale=0.3)

    def sandwich_weights(self, sh):
        name, H, I, QKV, A, bias, off = sh
        return dict(wi=self.norm_w0(H), wpa=self.norm_w0(H), wpf=self.norm_w0(H), wff=self.norm_w0(H),
                    qkv=self.bf(QKV, H, scale=0.05), b=self.bf(QKV, scale=0.5) if bias else None,
                    gu=self.bf(2 * I, H, scale=0.05), o=self.bf(H, A, scale=0.05), d=self.bf(H, I, scale=0.05))

    def unchanged(self, a, before):
        t = self.torch
        return "" if t.equal(a.view(t.int32), before.view(t.int32)) else "x_in was written"

    def case_sw_qkv0(self, sh, Wt, M):
        name, H, I, QKV, A, bias, off = sh
        torch, k = self.torch, self.k
        res = self.residual(M + GUARD_ROWS, H)
        res0 = res.clone()
        h1, y1, h2, y2 = self.out(M, H), self.out(M, QKV), self.out(M, H), self.out(M, QKV)
        k.rms_norm_f32_off(h1, res, Wt["wi"], M, H, off)
        k.gemv(h1, Wt["qkv"], Wt["b"], y1, M, QKV, H)
        k.gemv_rms_off(res, Wt["wi"], h2, Wt["qkv"], Wt["b"], y2, M, QKV, H, off)
        torch.cuda.synchronize()
        self.check(f"{name} qkv0 M={M} off={off}: gemv_bf16_rms_off == rms_norm_f32_off -> gemv_bf16",
                   [("h", self.same(h1, h2, M)), ("qkv", self.same(y1, y2, M)), ("residual", self.unchanged(res, res0))])

    def case_sw_o_gate_up(self, sh, Wt, M):
        name, H, I, QKV, A, bias, off = sh
        torch, k = self.torch, self.k
        attn = self.bf(M + GUARD_ROWS, A)
        x = self.residual(M + GUARD_ROWS, H)
        x1 = x.clone()
        o1, on, h1, gu1 = self.out(M, H), self.out(M, H), self.out(M, H), self.out(M, 2 * I)
        k.gemv(attn, Wt["o"], None, o1, M, H, A)
        k.rms_norm_off(on, o1, Wt["wpa"], M, H, off)
        k.add_rms_norm_off(h1, x1, on, Wt["wpf"], M, H, off)
        k.gemv(h1, Wt["gu"], None, gu1, M, 2 * I, H)
        outs = []
        for entry in ("gemv_bf16_postnorm_rms", "gemv_bf16_postnorm_rms_pf"):
            xin, xout = x.clone(), x.clone()
            xout[:M] = float("nan")
            o2, h2, gu2 = self.out(M, H), self.out(M, H), self.out(M, 2 * I)
            k.gemv(attn, Wt["o"], None, o2, M, H, A)
            k.gemv_postnorm(xin, o2, Wt["wpa"], xout, Wt["wpf"], h2, Wt["gu"], None, gu2, M, 2 * I, H, off, entry=entry)
            outs.append((entry, xin, xout, o2, h2, gu2))
        # the row-wise launch of larger steps (another buffer), on the same o
        xin3, xout3, h3 = x.clone(), x.clone(), self.out(M, H)
        xout3[:M] = float("nan")
        k.postnorm_row(h3, xout3, xin3, o1, Wt["wpa"], Wt["wpf"], M, H, off)
        torch.cuda.synchronize()
        for entry, xin, xout, o2, h2, gu2 in outs:
            self.check(f"{name} o+gate_up M={M} off={off}: gemv_bf16 -> {entry} == gemv_bf16 -> rms_norm_off -> add_rms_norm_f32_off -> gemv_bf16",
                       [("o", self.same(o1, o2, M)), ("x_out", self.same_res(x1, xout, M, x)), ("x_in", self.unchanged(xin, x)),
                        ("h", self.same(h1, h2, M)), ("gate_up", self.same(gu1, gu2, M))])
        self.check(f"{name} postnorm_add_rms_norm_f32_off M={M} off={off}: == rms_norm_off -> add_rms_norm_f32_off",
                   [("x_out", self.same_res(x1, xout3, M, x)), ("x_in", self.unchanged(xin3, x)), ("h", self.same(h1, h3, M))])

    def case_sw_down_qkv(self, sh, Wt, M, last=False):
        name, H, I, QKV, A, bias, off = sh
        torch, k = self.torch, self.k
        gu = self.gate_up(M + GUARD_ROWS, I)
        x = self.residual(M + GUARD_ROWS, H)
        x1 = x.clone()
        a1, m1, mn, h1, q1 = self.out(M, I), self.out(M, H), self.out(M, H), self.out(M, H), self.out(M, QKV)
        k.geglu(a1, gu, M, I)
        k.gemv(a1, Wt["d"], None, m1, M, H, I)
        if last:
            a2, m2, a3, m3, hn = self.out(M, I), self.out(M, H), self.out(M, I), self.out(M, H), self.out(M, H)
            r1, r3 = x.clone(), x.clone()
            k.add_rms_norm(hn, r1, m1, Wt["wi"], M, H)
            k.gemv_geglu(gu, a2, Wt["d"], None, m2, M, H, I)
            k.gemv_geglu_add(gu, a3, Wt["d"], None, m3, r3, M, H, I)
            torch.cuda.synchronize()
            self.check(f"{name} down (last layer) M={M}: gemv_bf16_geglu (and _add) == geglu_tanh -> gemv_bf16 (-> residual add)",
                       [("act", self.same(a1, a2, M)), ("mlp", self.same(m1, m2, M)), ("act (_add)", self.same(a1, a3, M)),
                        ("mlp (_add)", self.same(m1, m3, M)), ("residual (_add)", self.same_res(r1, r3, M, x))])
            return
        k.rms_norm_off(mn, m1, Wt["wff"], M, H, off)
        k.add_rms_norm_off(h1, x1, mn, Wt["wi"], M, H, off)
        k.gemv(h1, Wt["qkv"], Wt["b"], q1, M, QKV, H)
        xin, xout = x.clone(), x.clone()
        xout[:M] = float("nan")
        a2, m2, h2, q2 = self.out(M, I), self.out(M, H), self.out(M, H), self.out(M, QKV)
        k.gemv_geglu(gu, a2, Wt["d"], None, m2, M, H, I)
        k.gemv_postnorm(xin, m2, Wt["wff"], xout, Wt["wi"], h2, Wt["qkv"], Wt["b"], q2, M, QKV, H, off)
        torch.cuda.synchronize()
        self.check(f"{name} down+qkv M={M} off={off}: gemv_bf16_geglu -> gemv_bf16_postnorm_rms == geglu_tanh -> gemv_bf16 -> "
                   "rms_norm_off -> add_rms_norm_f32_off -> gemv_bf16",
                   [("act", self.same(a1, a2, M)), ("mlp", self.same(m1, m2, M)), ("x_out", self.same_res(x1, xout, M, x)),
                    ("x_in", self.unchanged(xin, x)), ("h", self.same(h1, h2, M)), ("qkv", self.same(q1, q2, M))])

    def sandwich_correctness(self):
        for sh in SANDWICH_SHAPES:
            name = sh[0]
            Wt = self.sandwich_weights(sh)
            for M in range(1, 9):
                for what, f in (("qkv0", lambda: self.case_sw_qkv0(sh, Wt, M)),
                                ("o+gate_up", lambda: self.case_sw_o_gate_up(sh, Wt, M)),
                                ("down+qkv", lambda: self.case_sw_down_qkv(sh, Wt, M)),
                                ("down", lambda: self.case_sw_down_qkv(sh, Wt, M, last=True))):
                    try:
                        f()
                    except Exception as e:  # noqa: BLE001
                        self.report(False, f"{name} {what} M={M}", repr(e))
                        if "illegal" in repr(e).lower() or "launch failure" in repr(e).lower():
                            raise
            del Wt
        # Long rows: an rstd (of o or of x_out) one ulp off flips ~1 of 32768 bf16 values per row.
        long = ("long-rows", 32768, 64, 48, 64, False, 1.0)
        Wt = self.sandwich_weights(long)
        for _ in range(8):
            self.case_sw_o_gate_up(long, Wt, 8)

    def sandwich_bench(self):
        torch, k = self.torch, self.k
        for sh in SANDWICH_SHAPES:
            name, H, I, QKV, A, bias, off = sh
            if name not in SANDWICH_TIMED:
                continue
            per_layer = (QKV * H + H * A + 2 * I * H + H * I) * 2
            copies = max(2, min(8, cdiv(256 << 20, per_layer)))
            Ws = [dict(qkv=self.bf(QKV, H, scale=0.05), o=self.bf(H, A, scale=0.05), gu=self.bf(2 * I, H, scale=0.05),
                       d=self.bf(H, I, scale=0.05)) for _ in range(copies)]
            wa, wb = self.norm_w0(H), self.norm_w0(H)
            for M in (1, 2, 4, 8):
                x, x2 = self.residual(M, H), self.residual(M, H)
                attn, gu = self.bf(M, A), self.gate_up(M, I)
                h, qkv, o, on, gu_o, act, mlp = (torch.empty(M, n, dtype=torch.bfloat16, device=self.dev) for n in (H, QKV, H, H, 2 * I, I, H))
                groups = {
                    "o+gate_up (sandwich)": (
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A), lambda W=W: k.rms_norm_off(on, o, wa, M, H, off),
                          lambda W=W: k.add_rms_norm_off(h, x, on, wb, M, H, off), lambda W=W: k.gemv(h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws],
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A),
                          lambda W=W: k.gemv_postnorm(x, o, wa, x2, wb, h, W["gu"], None, gu_o, M, 2 * I, H, off)] for W in Ws]),
                    "o+gate_up with _pf": (
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A), lambda W=W: k.rms_norm_off(on, o, wa, M, H, off),
                          lambda W=W: k.add_rms_norm_off(h, x, on, wb, M, H, off), lambda W=W: k.gemv(h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws],
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A),
                          lambda W=W: k.gemv_postnorm(x, o, wa, x2, wb, h, W["gu"], None, gu_o, M, 2 * I, H, off,
                                                      entry="gemv_bf16_postnorm_rms_pf")] for W in Ws]),
                    "post-norm pair vs the row-wise entry": (
                        [[lambda: k.rms_norm_off(on, o, wa, M, H, off), lambda: k.add_rms_norm_off(h, x, on, wb, M, H, off)]],
                        [[lambda: k.postnorm_row(h, x2, x, o, wa, wb, M, H, off)]]),
                    "o+gate_up, the row-wise entry": (
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A), lambda W=W: k.rms_norm_off(on, o, wa, M, H, off),
                          lambda W=W: k.add_rms_norm_off(h, x, on, wb, M, H, off), lambda W=W: k.gemv(h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws],
                        [[lambda W=W: k.gemv(attn, W["o"], None, o, M, H, A), lambda W=W: k.postnorm_row(h, x2, x, o, wa, wb, M, H, off),
                          lambda W=W: k.gemv(h, W["gu"], None, gu_o, M, 2 * I, H)] for W in Ws]),
                    "down (GeGLU)": (
                        [[lambda W=W: k.geglu(act, gu, M, I), lambda W=W: k.gemv(act, W["d"], None, mlp, M, H, I)] for W in Ws],
                        [[lambda W=W: k.gemv_geglu(gu, act, W["d"], None, mlp, M, H, I)] for W in Ws]),
                    "post-norm pair + qkv": (
                        [[lambda W=W: k.rms_norm_off(on, mlp, wa, M, H, off), lambda W=W: k.add_rms_norm_off(h, x, on, wb, M, H, off),
                          lambda W=W: k.gemv(h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws],
                        [[lambda W=W: k.gemv_postnorm(x2, mlp, wa, x, wb, h, W["qkv"], None, qkv, M, QKV, H, off)] for W in Ws]),
                    "down+qkv (sandwich)": (
                        [[lambda W=W: k.geglu(act, gu, M, I), lambda W=W: k.gemv(act, W["d"], None, mlp, M, H, I),
                          lambda W=W: k.rms_norm_off(on, mlp, wa, M, H, off), lambda W=W: k.add_rms_norm_off(h, x, on, wb, M, H, off),
                          lambda W=W: k.gemv(h, W["qkv"], None, qkv, M, QKV, H)] for W in Ws],
                        [[lambda W=W: k.gemv_geglu(gu, act, W["d"], None, mlp, M, H, I),
                          lambda W=W: k.gemv_postnorm(x2, mlp, wa, x, wb, h, W["qkv"], None, qkv, M, QKV, H, off)] for W in Ws]),
                }
                layer_u = layer_f = 0.0
                for g, (unf, fus) in groups.items():
                    tu, tf = self.timed(unf), self.timed(fus)
                    x.copy_(self.residual(M, H))
                    self.timing.append((name, M, g, len(unf[0]), len(fus[0]), tu, tf))
                    if g in ("o+gate_up (sandwich)", "down+qkv (sandwich)"):
                        layer_u += tu
                        layer_f += tf
                self.timing.append((name, M, "per layer (o+gate_up, down+qkv)", 9, 4, layer_u, layer_f))
            del Ws
            torch.cuda.empty_cache()

    def table(self):
        print("\nfused vs unfused, µs per group (back-to-back launches, median; weights rotated through >= 256 MB)")
        print(f"{'shape':<12} {'M':>2}  {'group':<34} {'launches':>9} {'unfused':>9} {'fused':>9} {'saved':>8}")
        for name, M, g, nu, nf, tu, tf in self.timing:
            print(f"{name:<12} {M:>2}  {g:<34} {nu:>4} -> {nf:<2} {tu * 1e6:9.2f} {tf * 1e6:9.2f} {(tu - tf) * 1e6:8.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", default="build/packs")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--only", choices=["qwen", "sandwich"], help="only the Qwen / Llama groups, or only the sandwich-norm (Gemma 3) ones")
    a = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("FAIL no CUDA device", flush=True)
        return 1
    torch.cuda.set_device(0)
    k = K(a.dir)
    if k.missing:
        for m in k.missing:
            print(f"FAIL missing cubin entry: {m}", flush=True)
        print(f"fused_verify: {len(k.missing)} entries missing in {a.dir}: build it with packs/kernels/build.sh", flush=True)
        return 1
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cupy {k.cupy.__version__}, cubins {a.dir}", flush=True)
    r = Run(k)
    t0 = time.time()
    qwen, sandwich = a.only in (None, "qwen"), a.only in (None, "sandwich")
    try:
        if qwen:
            r.correctness()
        if sandwich:
            r.sandwich_correctness()
    except Exception as e:  # noqa: BLE001 - a fault poisons the context: report and stop
        r.report(False, "correctness run aborted", repr(e))
        print(f"fused_verify: {r.passes} passed, {r.fails} failed (aborted)", flush=True)
        return 1
    if not a.no_timing:
        try:
            if qwen:
                r.bench()
            if sandwich:
                r.sandwich_bench()
        except Exception as e:  # noqa: BLE001
            r.report(False, "timing run aborted", repr(e))
    print(f"\nfused_verify: {r.passes} passed, {r.fails} failed ({time.time() - t0:.0f} s)", flush=True)
    if r.timing:
        r.table()
    return 1 if r.fails else 0


if __name__ == "__main__":
    sys.exit(main())
