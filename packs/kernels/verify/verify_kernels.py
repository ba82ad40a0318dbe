#!/usr/bin/env python3
"""Verify the qwen3 pack's kernels (cubins) against PyTorch references on a GPU.

    python3 packs/kernels/verify/verify_kernels.py [CUBIN_DIR] [--only GROUP,...] [--quick]
                                                [--no-timing] [--deadline SECONDS]

CUBIN_DIR defaults to build/packs (made by packs/kernels/build.sh). Needs python3 with torch,
cupy (cupy-cuda13x) and numpy, and one GPU. kern itself is not involved: each cubin is loaded with
cupy.RawModule(path=...) and launched exactly the way the manifest describes (grid/block formulas
of packs/kernels/KERNELS.md), with typed scalars (np.int32 / np.float32) and raw device pointers.

Every GROUP runs in its own subprocess, so a kernel that faults (and poisons its CUDA context)
cannot stop the others; inside a group every case has its own try/except and traceback.
Outputs are poisoned with NaN (or -7 for integer outputs) before each launch, and guard rows /
untouched parts of the KV pool are checked to still hold the poison.

Tolerance for bf16 outputs: max_abs_err(kern vs fp64 reference) <= 1.5 * max_abs_err(PyTorch bf16
implementation of the same op vs the same reference) + 2^-7 * max|reference| (one bf16 ulp at the largest magnitude). Index outputs and
pure copies must match exactly. Sampling: determinism, never a token outside the top-k / top-p
set, and chi-square goodness of fit (p-value > 1e-3).

--mock runs the harness on the CPU with PyTorch stand-ins for the kernels (a self-test of this
script, used where there is no GPU); --quick shrinks the shapes.
--deadline (default 540 s) bounds the whole run (the GPU machine allows 600 s per command): a
group that would start after it is reported as FAIL (not run); a group is killed after 300 s.
Exit status: 0 when every case passed, 1 otherwise.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback

GROUPS = ["rowwise", "kv_write", "qk_norm_rope", "attention", "attention_decode", "attention_prefill", "argmax", "sample", "timing"]

MODULE_OF = {
    "embedding": "rowwise", "rms_norm": "rowwise", "add_rms_norm": "rowwise", "swiglu": "rowwise",
    "gather_last": "rowwise", "qk_norm_rope": "rope", "kv_write": "rope",
    "attention_d128": "attention", "attention_d64": "attention", "argmax": "sampling", "sample": "sampling",
    "attention_decode_d128": "attention_decode", "attention_decode_d64": "attention_decode",
    "attention_combine_d128": "attention_decode", "attention_combine_d64": "attention_decode",
}

# attention_prefill.cu (tensor-core prefill attention, `kern pack --prefill-attention tc`)
MODULE_OF.update({"attention_prefill_d128": "attention_prefill", "attention_prefill_d64": "attention_prefill"})
# Llama / Gemma 3 (2026-12-03): head_dim 256, Gemma's zero-centred norms, GeGLU, the fp32-residual embedding
MODULE_OF.update({"attention_d256": "attention", "attention_decode_d256": "attention_decode",
                  "attention_combine_d256": "attention_decode", "rms_norm_off": "rowwise", "add_rms_norm_off": "rowwise",
                  "rms_norm_f32_off": "rowwise", "add_rms_norm_f32_off": "rowwise", "geglu_tanh": "rowwise",
                  "embedding_f32": "rowwise"})

# Dynamic shared memory of the head_dim-256 attention entries: their shared-memory struct is above
# the 48 KiB a kernel may declare statically (KERN_SMEM, common.cuh), so every launch must give at
# least sizeof(AttSmem<256>) / sizeof(DecSmem<256>) bytes (a launch with less traps). The host
# emulation static_asserts these numbers (packs/kernels/verify/host_emu). Other D: 0 (static).
ATT_SMEM_D256 = 86032   # attention_d256
DEC_SMEM_D256 = 83984   # attention_decode_d256 (attention_combine_d256: static, 0)


def att_smem(D):
    return ATT_SMEM_D256 if D == 256 else 0


def dec_smem(D):
    return DEC_SMEM_D256 if D == 256 else 0

EPS = 1e-6
THETA = 1e6


def cdiv(a, b):
    return (a + b - 1) // b


# ============================================================================ orchestration
def parse_args(argv):
    opts = {"dir": "build/packs", "only": None, "mock": False, "quick": False, "timing": True,
            "json": None, "child": None, "deadline": 540.0}
    rest = list(argv)
    pos = []
    while rest:
        a = rest.pop(0)
        if a == "--only":
            opts["only"] = rest.pop(0).split(",")
        elif a == "--mock":
            opts["mock"] = True
        elif a == "--quick":
            opts["quick"] = True
        elif a == "--no-timing":
            opts["timing"] = False
        elif a == "--json":
            opts["json"] = rest.pop(0)
        elif a == "--deadline":
            opts["deadline"] = float(rest.pop(0))
        elif a == "--child":
            opts["child"] = rest.pop(0)
        elif a in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        elif a.startswith("--"):
            sys.exit(f"verify_kernels: unknown option {a}")
        else:
            pos.append(a)
    if pos:
        opts["dir"] = pos[0]
    return opts


def fmt_num(x):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x != x:
        return "nan"
    if x == 0:
        return "0"
    return f"{x:.3e}"


def print_table(rows):
    heads = ["kernel", "shape", "max_abs_err", "rel_err", "torch_bf16_err", "tol", "status", "note"]
    cells = [[r.get("kernel", "?"), r.get("shape", ""), fmt_num(r.get("err")), fmt_num(r.get("rel")),
              fmt_num(r.get("terr")), fmt_num(r.get("tol")), r.get("status", "?"), r.get("note", "")]
             for r in rows]
    widths = [max(len(h), *(len(str(c[i])) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    widths[-1] = min(widths[-1], 80)
    line = "  ".join(h.ljust(w) for h, w in zip(heads, widths))
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(str(v)[:80].ljust(w) for v, w in zip(c, widths)))


def main_parent(opts):
    groups = opts["only"] or GROUPS
    if not opts["timing"] and opts["only"] is None:
        groups = [g for g in groups if g != "timing"]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        sys.exit(f"verify_kernels: unknown group(s) {unknown}; groups: {GROUPS}")
    print(f"verify_kernels: cubins from {os.path.abspath(opts['dir'])}; groups {groups}"
          f"{' (MOCK: harness self-test on CPU)' if opts['mock'] else ''}", flush=True)
    sums = os.path.join(opts["dir"], "SHA256SUMS")
    if os.path.exists(sums):
        with open(sums) as fh:
            for line in fh:
                if ".cubin" in line and not line.split()[-1].startswith("gemm"):
                    print("  " + line.strip())
    rows = []
    t_all = time.time()
    for g in groups:
        left = opts["deadline"] - (time.time() - t_all)
        if left < 20:
            rows.append({"kernel": g, "shape": "(group)", "status": "FAIL",
                         "note": f"not run: the {opts['deadline']:.0f} s deadline was reached"})
            continue
        fd, jpath = tempfile.mkstemp(suffix=".json", prefix=f"verify_{g}_")
        os.close(fd)
        cmd = [sys.executable, os.path.abspath(__file__), opts["dir"], "--child", g, "--json", jpath]
        if opts["mock"]:
            cmd.append("--mock")
        if opts["quick"]:
            cmd.append("--quick")
        print(f"\n===== group {g} =====", flush=True)
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, timeout=left if opts["mock"] else min(300.0, left))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        got = []
        try:
            with open(jpath) as fh:
                got = json.load(fh)
        except Exception:
            got = []
        finally:
            try:
                os.unlink(jpath)
            except OSError:
                pass
        rows.extend(got)
        if rc != 0:
            rows.append({"kernel": g, "shape": "(group)", "status": "FAIL",
                         "note": f"group process ended with {rc} after {len(got)} case(s) (see its log above)"})
        print(f"===== group {g}: {len(got)} case(s), rc={rc}, {time.time() - t0:.1f} s", flush=True)
    print("\n\n========== SUMMARY ==========")
    print_table(rows)
    nfail = sum(1 for r in rows if r.get("status") == "FAIL")
    npass = sum(1 for r in rows if r.get("status") == "PASS")
    print(f"\n{npass} passed, {nfail} failed  ({time.time() - t_all:.1f} s)")
    return 1 if nfail else 0


# ============================================================================ child: setup
torch = None
np = None
DEV = None
BF = None


class P:  # device pointer argument
    def __init__(self, t):
        self.t = t


class I32:
    def __init__(self, v):
        self.v = int(v)


class F32:
    def __init__(self, v):
        self.v = float(v)


class NULL:  # a null pointer argument (qk_norm_rope's inv_freq without a table)
    t = None


class Kernels:
    def __init__(self, cubin_dir, mock):
        self.dir = cubin_dir
        self.mock = mock
        self.mods = {}
        self.fns = {}
        self.smem_set = {}

    def fn(self, name):
        if name in self.fns:
            return self.fns[name]
        import cupy
        stem = MODULE_OF[name]
        if stem not in self.mods:
            path = os.path.join(self.dir, f"{stem}.sm_90a.cubin")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} missing (run packs/kernels/build.sh)")
            self.mods[stem] = cupy.RawModule(path=path)
        self.fns[name] = self.mods[stem].get_function(name)
        return self.fns[name]

    def fn_smem(self, name, smem):
        """The function, its dynamic shared memory limit raised to `smem` when that is above the
        default 48 KiB (as kern's runtime does for a manifest's `shared`)."""
        f = self.fn(name)
        if smem > 48 * 1024 and self.smem_set.get(name, 0) < smem:
            f.max_dynamic_shared_size_bytes = int(smem)
            self.smem_set[name] = smem
        return f

    @staticmethod
    def conv_args(args):
        conv = []
        for a in args:
            if isinstance(a, P):
                assert a.t.is_cuda and a.t.is_contiguous()
                conv.append(np.uint64(a.t.data_ptr()))
            elif isinstance(a, NULL):
                conv.append(np.uint64(0))
            elif isinstance(a, I32):
                conv.append(np.int32(a.v))
            elif isinstance(a, F32):
                conv.append(np.float32(a.v))
            else:
                raise TypeError(a)
        return tuple(conv)

    def launch(self, name, grid, block, args, smem=0):
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        assert all(g >= 1 for g in grid), f"{name}: empty grid {grid}"
        if self.mock:
            vals = [a.t if isinstance(a, (P, NULL)) else a.v for a in args]
            MOCKS[name](grid, block, *vals)
            return
        conv = self.conv_args(args)
        f = self.fn_smem(name, smem)
        torch.cuda.synchronize()
        f(grid, block, conv, shared_mem=smem)
        torch.cuda.synchronize()

    def timed(self, name, grid, block, args, iters=20, smem=0):
        """Average µs per launch (GPU only)."""
        if self.mock:
            return None
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        conv = self.conv_args(args)
        f = self.fn_smem(name, smem)
        for _ in range(3):
            f(grid, block, conv, shared_mem=smem)
        torch.cuda.synchronize()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(iters):
            f(grid, block, conv, shared_mem=smem)
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1000.0 / iters


class Results:
    def __init__(self, json_path=None):
        self.rows = []
        self.json_path = json_path

    def add(self, **kw):
        self.rows.append(kw)
        if self.json_path:  # rewritten after every case: a killed group keeps what it finished
            with open(self.json_path, "w") as fh:
                json.dump(self.rows, fh)
        print(f"  [{kw.get('status')}] {kw.get('kernel')} {kw.get('shape', '')}: err={fmt_num(kw.get('err'))} "
              f"torch_bf16_err={fmt_num(kw.get('terr'))} tol={fmt_num(kw.get('tol'))} {kw.get('note', '')}",
              flush=True)

    def case(self, kernel, shape, fn):
        """Run one case; an exception is a FAIL with its traceback, never the end of the group."""
        try:
            fn()
        except Exception as e:
            traceback.print_exc()
            self.add(kernel=kernel, shape=shape, status="FAIL", note=f"exception: {type(e).__name__}: {e}"[:200])


def nanfull(shape, dtype=None):
    return torch.full(shape, float("nan"), dtype=dtype or BF, device=DEV)


def bits_equal(a, b):
    if a.shape != b.shape:
        return False
    if a.dtype == BF:
        return torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))
    return torch.equal(a, b)


def close(R, kernel, shape, out, ref, tbf=None, exact=None, note=""):
    """Compare a bf16/fp32 output with an fp64 reference (and a torch bf16 implementation)."""
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
        bm = f"bit-identical to torch bf16: {100.0 * float(same.double().mean()):.2f}%"
    tol = (1.5 * terr if terr is not None else 0.0) + 2.0 ** -7 * scale
    ok = nan_bad == 0 and err <= tol
    notes = [n for n in [note, bm] if n]
    if nan_bad:
        notes.append(f"{nan_bad} non-finite outputs")
    if exact is not None:
        if not bits_equal(out, exact):
            ok = False
            mism = int((out.double() != exact.double()).sum())
            notes.append(f"NOT bit-exact: {mism} elements differ")
        else:
            notes.append("bit-exact")
    R.add(kernel=kernel, shape=shape, err=err, rel=(err / scale if scale else 0.0), terr=terr, tol=tol,
          status="PASS" if ok else "FAIL", note="; ".join(notes))
    return ok


def guard_nan(R, kernel, shape, t, what="guard rows"):
    if t.numel() == 0:
        return True
    ok = bool(torch.isnan(t.double()).all())
    if not ok:
        R.add(kernel=kernel, shape=shape, status="FAIL", note=f"{what} were written ({int((~torch.isnan(t.double())).sum())} elements)")
    return ok


def check_rows_past(R, kname, shape, out, n, T):
    """An attention output's rows n..T-1 (padded tokens) must be zero, rows from T (past
    num_tokens, NaN-poisoned) untouched: a "(padded rows)" result when there are padded rows,
    a FAIL when rows past T were written."""
    pad = out[n:T]
    if pad.numel():
        okp = bool((pad.double() == 0).all())
        R.add(kernel=kname + "(padded rows)", shape=shape, status="PASS" if okp else "FAIL",
              note="padded token rows are zero" if okp else "padded token rows not zeroed")
    guard_nan(R, kname, shape, out[T:], "row past num_tokens")


def gen(seed):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randn(shape, seed, scale=1.0, dtype=None):
    t = torch.randn(shape, generator=gen(seed), dtype=torch.float32) * scale
    return t.to(DEV).to(dtype or BF)


# ============================================================================ references
def hf_rmsnorm(x, w, eps=EPS):
    """transformers Qwen3RMSNorm.forward on bf16 tensors."""
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(x.dtype)


def ref_rmsnorm(x64, w, eps=EPS):
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def hf_inv_freq(D, theta=THETA):
    # transformers _compute_default_rope_parameters (computed on the CPU at model init)
    return 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).to(dtype=torch.float) / D))


def hf_cos_sin(pos, D, theta=THETA):
    inv = hf_inv_freq(D, theta).to(DEV)
    freqs = pos.to(DEV).float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(BF), emb.sin().to(BF)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def ref_cos_sin64(pos, D, theta=THETA):
    inv = hf_inv_freq(D, theta).double().to(DEV)
    ang = pos.to(DEV).double()[:, None] * inv[None, :]
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def pool_view(pool, layers, page_tokens, kvh, D):
    return pool.view(-1, layers, 2, page_tokens, kvh, D)


# ---- Gemma 3 / Llama references (2026-12-03)
def gemma_rmsnorm(x, w, off=1.0, eps=EPS):
    """transformers Gemma3RMSNorm.forward: (x.float() * rsqrt(mean(x²) + eps)) * (off + w.float()) in
    fp32, cast to bf16 once (off = 1: Hugging Face weights; 0: GGUF weights, the 1 already added)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (off + w.float())).to(BF)


def ref_rmsnorm_off(x64, w, off=1.0, eps=EPS):
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * (off + w.double())


def kern_inv_freq(D, theta=THETA):
    """qk_norm_rope's computed inverse frequencies exactly: 1 / fp32(pow(theta, fp32(2i) / fp32(D))), the
    pow in double (KERNELS.md). An `inv_freq` table holding these must give the computed path's bits."""
    out = []
    for i in range(D // 2):
        e = np.float32(2 * i) / np.float32(D)
        p = np.float32(math.pow(float(np.float32(theta)), float(e)))
        out.append(np.float32(1.0) / p)
    return torch.tensor(np.array(out, dtype=np.float32))


def llama3_inv_freq(D, theta=500000.0, factor=8.0, low=1.0, high=4.0, original=8192):
    """transformers _compute_llama3_parameters (fp32, on the CPU): Llama 3.1's scaled frequencies."""
    inv = hf_inv_freq(D, theta)
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, inv_l)


def rope_cos_sin(pos, inv, cos_scale=1.0):
    """cos / sin [n, D/2] of positions `pos` for the fp32 inverse frequencies `inv`, as transformers
    computes them (freqs = pos.float() * inv in fp32; cos() * attention_scaling in fp32; .to(bf16)),
    and the fp64 ones."""
    inv = inv.to(DEV).float()
    fr = pos.to(DEV).float()[:, None] * inv[None, :]
    ang = pos.to(DEV).double()[:, None] * inv.double()[None, :]
    return ((fr.cos() * cos_scale).to(BF), (fr.sin() * cos_scale).to(BF), ang.cos() * cos_scale,
            ang.sin() * cos_scale)


def apply_rope(x, c, s, adjacent=False):
    """x [n, H, D] rotated with c, s [n, D/2]: neox (x * cat(c, c) + rotate_half(x) * cat(s, s)) or, with
    `adjacent`, the pairs (2i, 2i + 1) by angle i. In x's dtype: on bf16 every product and the sum are
    rounded, as transformers' apply_rotary_pos_emb on bf16 tensors."""
    if adjacent:
        cc, ss = c.repeat_interleave(2, dim=-1)[:, None, :], s.repeat_interleave(2, dim=-1)[:, None, :]
        rot = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        cc, ss = torch.cat((c, c), dim=-1)[:, None, :], torch.cat((s, s), dim=-1)[:, None, :]
        rot = rotate_half(x)
    return x * cc + rot * ss


def gguf_permute(t, D):
    """llama.cpp's convert_hf_to_gguf permutation of q / k rows, per head of D: element 2i + j of the
    GGUF head is element i + j * D/2 of the Hugging Face head (t [..., D])."""
    half = D // 2
    return torch.stack((t[..., :half], t[..., half:]), dim=-1).flatten(-2)


def qkr_refs(qkv0, n, Hq, Hkv, D, flags, qn, kn, bias, pos, inv=None, cos_scale=1.0, off=0.0, theta=THETA):
    """qk_norm_rope's outputs for the step, as transformers computes them (bf16 ops) and in fp64:
    (q, k, v, q64, k64) with q [n, Hq, D], k / v [n, Hkv, D]. flags: 1 the q / k norm (Qwen3RMSNorm, or
    with 4 Gemma3RMSNorm with offset `off`), 2 the QKV bias, 8 adjacent pairs; inv: the fp32 inverse
    frequencies (None: the kernel's computed ones from theta); cos_scale: YaRN's attention factor."""
    x = qkv0.view(n, Hq + 2 * Hkv, D)
    if flags & 2:
        x = x + bias.view(Hq + 2 * Hkv, D)  # bf16 add
    q, k, v = x[:, :Hq], x[:, Hq:Hq + Hkv], x[:, Hq + Hkv:]
    q64, k64 = q.double(), k.double()
    if flags & 1:
        if flags & 4:
            q, k = gemma_rmsnorm(q, qn, off), gemma_rmsnorm(k, kn, off)
            q64, k64 = ref_rmsnorm_off(q64, qn, off), ref_rmsnorm_off(k64, kn, off)
        else:
            q, k = hf_rmsnorm(q, qn), hf_rmsnorm(k, kn)
            q64, k64 = ref_rmsnorm(q64, qn), ref_rmsnorm(k64, kn)
    if inv is None:
        inv = hf_inv_freq(D, theta)
    c, s_, c64, s64 = rope_cos_sin(pos, inv, cos_scale)
    adj = bool(flags & 8)
    return (apply_rope(q, c, s_, adj), apply_rope(k, c, s_, adj), v, apply_rope(q64, c64, s64, adj),
            apply_rope(k64, c64, s64, adj))


# ============================================================================ group: rowwise
def g_rowwise(K, R, quick):
    # ---- embedding
    for (V, H, n) in ([(1000, 1000, 7), (1000, 1024, 300), (4000, 2560, 64), (3, 1024, 1)] if not quick else
                      [(100, 1000, 7), (100, 1024, 9)]):
        shape = f"V={V} H={H} n={n}"

        def run(V=V, H=H, n=n, shape=shape):
            table = randn((V, H), 1)
            ids = torch.randint(0, V, (n,), generator=gen(2), dtype=torch.int32)
            if n >= 3:
                ids[0], ids[1], ids[2] = -1, V, V + 7
            ids = ids.to(DEV)
            out = nanfull((n + 2, H))
            K.launch("embedding", (n,), (128,), [P(out), P(table), P(ids), I32(n), I32(H), I32(V), F32(1.0)])
            valid = (ids >= 0) & (ids < V)
            ref = torch.zeros((n, H), dtype=BF, device=DEV)
            ref[valid] = table[ids[valid].long()]
            ok = guard_nan(R, "embedding", shape, out[n:])
            if ok:
                close(R, "embedding", shape, out[:n], ref, exact=ref, note="ids -1/V/V+7 -> zeros" if n >= 3 else "")
        R.case("embedding", shape, run)

    # ---- rms_norm / add_rms_norm
    cases = [(1000, 7), (1024, 1), (1024, 300), (2560, 64), (4096, 7), (10000, 3)] if not quick else [(1000, 3), (1024, 2)]
    for (H, n) in cases:
        shape = f"H={H} n={n}"

        def run(H=H, n=n, shape=shape):
            x = randn((n, H), 3, 2.0)
            w = (1 + 0.1 * torch.randn(H, generator=gen(4))).to(DEV).to(BF)
            out = nanfull((n + 2, H))
            K.launch("rms_norm", (n,), (128,), [P(out), P(x), P(w), I32(n), I32(H), F32(EPS)])
            if guard_nan(R, "rms_norm", shape, out[n:]):
                close(R, "rms_norm", shape, out[:n], ref_rmsnorm(x.double(), w), tbf=hf_rmsnorm(x, w))
        R.case("rms_norm", shape, run)

        def run2(H=H, n=n, shape=shape):
            res = randn((n, H), 5, 2.0)
            x = randn((n, H), 6, 0.7)
            w = (1 + 0.1 * torch.randn(H, generator=gen(7))).to(DEV).to(BF)
            resbuf = nanfull((n + 2, H))
            resbuf[:n] = res
            out = nanfull((n + 2, H))
            K.launch("add_rms_norm", (n,), (128,), [P(out), P(resbuf), P(x), P(w), I32(n), I32(H), F32(EPS)])
            new_res = res + x  # transformers: residual + hidden_states, in bf16
            ok = guard_nan(R, "add_rms_norm", shape, out[n:]) and guard_nan(R, "add_rms_norm", shape, resbuf[n:], "residual guard rows")
            if not bits_equal(resbuf[:n], new_res):
                R.add(kernel="add_rms_norm(residual)", shape=shape, status="FAIL",
                      note=f"residual != bf16(residual + x): {int((resbuf[:n].double() != new_res.double()).sum())} differ")
                ok = False
            else:
                R.add(kernel="add_rms_norm(residual)", shape=shape, err=0.0, status="PASS", note="bit-exact bf16 add")
            if ok:
                close(R, "add_rms_norm", shape, out[:n], ref_rmsnorm(res.double() + x.double(), w),
                      tbf=hf_rmsnorm(new_res, w))
        R.case("add_rms_norm", shape, run2)

    # ---- swiglu
    for (I, n) in ([(1000, 7), (3072, 1), (3072, 300), (9728, 7)] if not quick else [(1000, 3), (24, 2)]):
        shape = f"I={I} n={n}"

        def run(I=I, n=n, shape=shape):
            gu = randn((n, 2 * I), 8, 2.0)
            out = nanfull((n + 2, I))
            K.launch("swiglu", (n,), (256,), [P(out), P(gu), I32(n), I32(I)])
            g, u = gu[:, :I], gu[:, I:]
            ref = torch.nn.functional.silu(g.double()) * u.double()
            tbf = torch.nn.functional.silu(g) * u
            if guard_nan(R, "swiglu", shape, out[n:]):
                close(R, "swiglu", shape, out[:n], ref, tbf=tbf)
        R.case("swiglu", shape, run)

    # ---- gather_last
    for (T, H, S) in ([(300, 1024, 5), (7, 1000, 3), (1, 2560, 1)] if not quick else [(9, 1000, 3)]):
        shape = f"tokens={T} H={H} seqs={S}"

        def run(T=T, H=H, S=S, shape=shape):
            x = randn((T, H), 9)
            last = torch.randint(0, T, (S,), generator=gen(10), dtype=torch.int32)
            if S >= 3:
                last[1], last[2] = -1, T
            last = last.to(DEV)
            out = nanfull((S + 2, H))
            K.launch("gather_last", (S,), (128,), [P(out), P(x), P(last), I32(S), I32(T), I32(H)])
            valid = (last >= 0) & (last < T)
            ref = torch.zeros((S, H), dtype=BF, device=DEV)
            ref[valid] = x[last[valid].long()]
            if guard_nan(R, "gather_last", shape, out[S:]):
                close(R, "gather_last", shape, out[:S], ref, exact=ref, note="index -1/tokens -> zeros" if S >= 3 else "")
        R.case("gather_last", shape, run)


    rowwise_new_cases(K, R, quick)


def rowwise_new_cases(K, R, quick):
    """The entries of 2026-12-03 (Gemma 3): the scaled embedding (and embedding_f32), the zero-centred
    norms (*_off), geglu_tanh."""
    # ---- embedding / embedding_f32 with a scale: Gemma3TextScaledWordEmbedding, embed(ids) *
    # embed_scale.to(bf16) (scale = bf16(sqrt(hidden))): one bf16 multiply; scale 1: a copy
    for (V, H, n, scale) in ([(1000, 1152, 7, None), (4000, 2560, 64, None), (1000, 1003, 5, 3.0), (1000, 1024, 9, 1.0)]
                             if not quick else [(100, 1152, 7, None), (100, 1024, 3, 1.0)]):
        sc = float(torch.tensor(math.sqrt(H)).to(BF).float()) if scale is None else scale
        shape = f"V={V} H={H} n={n} scale={sc:g}"

        def run_emb(V=V, H=H, n=n, sc=sc, shape=shape):
            table = randn((V, H), 11)
            ids = torch.randint(0, V, (n,), generator=gen(12), dtype=torch.int32)
            if n >= 3:
                ids[0], ids[1] = -1, V
            ids = ids.to(DEV)
            out = nanfull((n + 2, H))
            outf = nanfull((n + 2, H), torch.float32)
            K.launch("embedding", (n,), (128,), [P(out), P(table), P(ids), I32(n), I32(H), I32(V), F32(sc)])
            K.launch("embedding_f32", (n,), (128,), [P(outf), P(table), P(ids), I32(n), I32(H), I32(V), F32(sc)])
            valid = (ids >= 0) & (ids < V)
            ref = torch.zeros((n, H), dtype=BF, device=DEV)
            ref[valid] = table[ids[valid].long()] * torch.tensor(sc, dtype=BF, device=DEV)  # bf16 * bf16 scalar
            if guard_nan(R, "embedding", shape, out[n:]):
                close(R, "embedding", shape, out[:n], ref, exact=ref,
                      note=("a copy" if sc == 1.0 else "bf16(row * scale)") + ("; ids -1/V -> zeros" if n >= 3 else ""))
            if guard_nan(R, "embedding_f32", shape, outf[n:]):
                close(R, "embedding_f32", shape, outf[:n], ref.double(), exact=ref.float(),
                      note="float(bf16(row * scale))" if sc != 1.0 else "float(row): a copy")
        R.case("embedding", shape, run_emb)

    # ---- Gemma3RMSNorm entries: bf16 rows (rms_norm_off, add_rms_norm_off) and the fp32 residual
    # (rms_norm_f32_off, add_rms_norm_f32_off); off 1 with zero-centred weights (Hugging Face), off 0
    # with w = 1 + w_hf (GGUF)
    cases = [(1152, 7, 1.0), (2560, 64, 1.0), (1003, 3, 0.0), (10000, 3, 1.0), (3840, 300, 1.0)] if not quick else \
        [(1152, 3, 1.0), (1003, 2, 0.0)]
    for (H, n, off) in cases:
        for f32 in (False, True):
            for add in (False, True):
                kname = ("add_" if add else "") + "rms_norm" + ("_f32" if f32 else "") + "_off"
                shape = f"H={H} n={n} off={off:g}"

                def run_off(H=H, n=n, off=off, f32=f32, add=add, kname=kname, shape=shape):
                    wz = 0.3 * torch.randn(H, generator=gen(14))
                    w = (wz if off == 1.0 else 1.0 + wz).to(DEV).to(BF)
                    dt = torch.float32 if f32 else BF
                    out = nanfull((n + 2, H))
                    if add:
                        res = randn((n, H), 15, 2.0, dtype=dt)
                        x = randn((n, H), 16, 0.7)
                        resbuf = nanfull((n + 2, H), dt)
                        resbuf[:n] = res
                        K.launch(kname, (n,), (128,), [P(out), P(resbuf), P(x), P(w), I32(n), I32(H), F32(EPS), F32(off)])
                        new_res = res + x if not f32 else res + x.float()  # bf16 add / exact fp32 add
                        ok = guard_nan(R, kname, shape, resbuf[n:], "residual guard rows")
                        same = bits_equal(resbuf[:n], new_res)
                        R.add(kernel=kname + "(residual)", shape=shape, err=0.0 if same else None,
                              status="PASS" if same else "FAIL",
                              note=("bit-exact " + ("fp32" if f32 else "bf16") + " add, in place") if same else
                              f"residual != residual + x: {int((resbuf[:n].double() != new_res.double()).sum())} differ")
                        src, src64 = new_res, res.double() + x.double()
                        if not ok or not same:
                            return
                    else:
                        x = randn((n, H), 17, 2.0, dtype=dt)
                        K.launch(kname, (n,), (128,), [P(out), P(x), P(w), I32(n), I32(H), F32(EPS), F32(off)])
                        src, src64 = x, x.double()
                    if guard_nan(R, kname, shape, out[n:]):
                        close(R, kname, shape, out[:n], ref_rmsnorm_off(src64, w, off), tbf=gemma_rmsnorm(src, w, off),
                              note="Gemma3RMSNorm bf16((x*r)*(off+w))")
                R.case(kname, shape, run_off)

    # ---- geglu_tanh: bf16(bf16(gelu_tanh(gate)) * up), transformers' gelu_pytorch_tanh MLP
    for (I, n) in ([(6912, 7), (10240, 3), (1000, 300), (37, 5)] if not quick else [(1000, 3), (37, 2)]):
        shape = f"I={I} n={n}"

        def run_geglu(I=I, n=n, shape=shape):
            gu = randn((n, 2 * I), 18, 2.0)
            out = nanfull((n + 2, I))
            K.launch("geglu_tanh", (n,), (256,), [P(out), P(gu), I32(n), I32(I)])
            g, u = gu[:, :I], gu[:, I:]
            ref = torch.nn.functional.gelu(g.double(), approximate="tanh") * u.double()
            tbf = torch.nn.functional.gelu(g, approximate="tanh") * u
            if guard_nan(R, "geglu_tanh", shape, out[n:]):
                close(R, "geglu_tanh", shape, out[:n], ref, tbf=tbf)
        R.case("geglu_tanh", shape, run_geglu)


# ============================================================================ group: kv_write
def make_slots(n, page_tokens, num_pages, seed, invalid=()):
    g = gen(seed)
    perm = torch.randperm(num_pages * page_tokens, generator=g)[:n].to(torch.int32)
    for i in invalid:
        if i < n:
            perm[i] = -1
    return perm


def g_kv_write(K, R, quick):
    cfgs = [(16, 8, 128, 16, 7), (16, 8, 128, 64, 300), (14, 2, 64, 16, 300), (32, 8, 128, 16, 1)]
    if quick:
        cfgs = [(4, 2, 64, 16, 5), (2, 1, 128, 4, 3)]
    layers, layer = 3, 1
    for (Hq, Hkv, D, pt, n) in cfgs:
        shape = f"Hq={Hq} Hkv={Hkv} D={D} page={pt} n={n}"

        def run(Hq=Hq, Hkv=Hkv, D=D, pt=pt, n=n, shape=shape):
            num_pages = cdiv(n, pt) + 3
            qkv = randn((n, (Hq + 2 * Hkv) * D), 11)
            slots = make_slots(n, pt, num_pages, 12, invalid=(1,)).to(DEV)
            pool = nanfull((num_pages * pt * layers * 2 * Hkv * D,))
            K.launch("kv_write", (n,), (128,), [P(pool), P(qkv), P(slots), I32(n), I32(Hq), I32(Hkv), I32(D),
                                                 I32(layer), I32(layers), I32(pt)])
            pv = pool_view(pool, layers, pt, Hkv, D)
            valid = slots >= 0
            s = slots[valid].long()
            kref = qkv[valid][:, Hq * D:(Hq + Hkv) * D].reshape(-1, Hkv, D)
            vref = qkv[valid][:, (Hq + Hkv) * D:].reshape(-1, Hkv, D)
            kgot = pv[:, layer, 0].reshape(-1, Hkv, D)[s]
            vgot = pv[:, layer, 1].reshape(-1, Hkv, D)[s]
            written = int((~torch.isnan(pool.double())).sum())
            expect = int(valid.sum()) * 2 * Hkv * D
            ok = bits_equal(kgot, kref) and bits_equal(vgot, vref) and written == expect
            R.add(kernel="kv_write", shape=shape, err=0.0 if ok else None, status="PASS" if ok else "FAIL",
                  note=f"k/v bit-exact={bits_equal(kgot, kref) and bits_equal(vgot, vref)}; "
                       f"{written} pool elements written, expected {expect} (slot -1 skipped)")
        R.case("kv_write", shape, run)


# ============================================================================ group: qk_norm_rope
def qkr_inputs(n, Hq, Hkv, D, pt, maxpos, layers, seed=21):
    """One qk_norm_rope step's inputs (the seeds of the original cases): qkv, q / k norm weights
    (1 + 0.2 N), bias, positions (the first one maxpos - 1), slots (token 2 padded: -1), a NaN pool."""
    W = (Hq + 2 * Hkv) * D
    num_pages = cdiv(n, pt) + 2
    pos = torch.randint(0, maxpos, (n,), generator=gen(seed + 4), dtype=torch.int32)
    pos[0] = maxpos - 1
    return dict(qkv=randn((n, W), seed, 1.5), qn=(1 + 0.2 * torch.randn(D, generator=gen(seed + 1))).to(DEV).to(BF),
                kn=(1 + 0.2 * torch.randn(D, generator=gen(seed + 2))).to(DEV).to(BF), bias=randn((W,), seed + 3, 0.5),
                pos=pos.to(DEV), slots=make_slots(n, pt, num_pages, seed + 5, invalid=(2,)).to(DEV),
                pool=nanfull((num_pages * pt * layers * 2 * Hkv * D,)))


def qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags, inv=None, cos_scale=1.0, off=0.0, theta=THETA, qkv=None,
               qn=None, kn=None, bias=None):
    """qk_norm_rope on a copy of the case's qkv / pool (grid [n, ceil((Hq + 2 Hkv) / 8)], block 256);
    inv: an fp32 table on the device, or None (null: computed from theta). Returns (qkv, pool)."""
    q = (c["qkv"] if qkv is None else qkv).clone()
    pool = c["pool"].clone()
    K.launch("qk_norm_rope", (n, cdiv(Hq + 2 * Hkv, 8)), (256,),
             [P(q), P(pool), P(c["qn"] if qn is None else qn), P(c["kn"] if kn is None else kn),
              P(c["bias"] if bias is None else bias), P(c["pos"]), P(c["slots"]), I32(n), I32(Hq), I32(Hkv), I32(D),
              I32(layer), I32(layers), I32(pt), F32(theta), F32(EPS), I32(flags),
              NULL() if inv is None else P(inv.to(DEV).float().contiguous()), F32(cos_scale), F32(off)])
    return q, pool


def qkr_check(R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, flags, refs, close_fn=None):
    """The launch's q (in place in qkv), k and v (in the cache at the valid slots) against refs =
    qkr_refs(...); the k / v columns of qkv unchanged; nothing else of the pool written."""
    close_fn = close_fn or (lambda *a, **k: close(R, *a, **k))
    qt, kt, v, q64, k64 = refs
    got = qkv.view(n, Hq + 2 * Hkv, D)
    close_fn("qk_norm_rope(q)", shape, got[:, :Hq], q64, tbf=qt)
    if not bits_equal(got[:, Hq:], c["qkv"].view(n, Hq + 2 * Hkv, D)[:, Hq:]):
        R.add(kernel="qk_norm_rope(k,v in qkv)", shape=shape, status="FAIL", note="k/v columns of qkv were modified")
    pv = pool_view(pool, layers, pt, Hkv, D)
    valid = c["slots"] >= 0
    s = c["slots"][valid].long()
    kgot = pv[:, layer, 0].reshape(-1, Hkv, D)[s]
    vgot = pv[:, layer, 1].reshape(-1, Hkv, D)[s]
    close_fn("qk_norm_rope(k->cache)", shape, kgot, k64[valid], tbf=kt[valid])
    close_fn("qk_norm_rope(v->cache)", shape, vgot, v[valid].double(), exact=v[valid],
             note="v copied" + (" + bias" if flags & 2 else ""))
    written = int((~torch.isnan(pool.double())).sum())
    expect = int(valid.sum()) * 2 * Hkv * D
    R.add(kernel="qk_norm_rope(pool)", shape=shape, status="PASS" if written == expect else "FAIL",
          note=f"{written} pool elements written, expected {expect} (slot -1 skipped)")


def g_qk_norm_rope(K, R, quick):
    cfgs = [  # Hq, Hkv, D, page_tokens, n, flags, max position
        (16, 8, 128, 16, 7, 1, 100), (32, 8, 128, 64, 300, 1, 40000), (16, 8, 128, 16, 1, 1, 5),
        (14, 2, 64, 16, 64, 2, 30000), (14, 2, 64, 64, 7, 0, 1000), (8, 4, 128, 16, 33, 3, 20000),
        (8, 4, 256, 16, 33, 1, 30000),  # head_dim 256 with Qwen3's norm
    ]
    if quick:
        cfgs = [(4, 2, 64, 16, 5, 1, 100), (4, 2, 128, 4, 3, 3, 30000)]
    layers, layer = 2, 1
    for (Hq, Hkv, D, pt, n, flags, maxpos) in cfgs:
        shape = f"Hq={Hq} Hkv={Hkv} D={D} page={pt} n={n} flags={flags} pos<{maxpos}"

        def run(Hq=Hq, Hkv=Hkv, D=D, pt=pt, n=n, flags=flags, maxpos=maxpos, shape=shape):
            c = qkr_inputs(n, Hq, Hkv, D, pt, maxpos, layers)
            qkv, pool = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags)
            refs = qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"])
            qkr_check(R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, flags, refs)
        R.case("qk_norm_rope", shape, run)
    qk_norm_rope_new_cases(K, R, quick, layers, layer)


def qk_norm_rope_new_cases(K, R, quick, layers, layer):
    """The parameters of 2026-12-03 (Llama, Gemma 3): the inv_freq table, cos_scale, QKR_ADJACENT and
    QKR_NORM_F32 (with norm_offset)."""
    # (1) a table holding the kernel's computed frequencies: the null path's bits, flags 0..3, D 64/128/256
    for (Hq, Hkv, D, flags) in ([(16, 8, 128, 3), (14, 2, 64, 2), (8, 4, 256, 1), (8, 4, 256, 0)] if not quick else
                                [(4, 2, 128, 3)]):
        shape = f"inv_freq table == computed: Hq={Hq} Hkv={Hkv} D={D} flags={flags}"

        def run_table(Hq=Hq, Hkv=Hkv, D=D, flags=flags, shape=shape):
            n, pt = 33, 16
            c = qkr_inputs(n, Hq, Hkv, D, pt, 40000, layers, seed=31)
            a = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags)
            b = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags, inv=kern_inv_freq(D))
            same = bits_equal(a[0], b[0]) and bits_equal(a[1].nan_to_num(0.0), b[1].nan_to_num(0.0)) and \
                bool((torch.isnan(a[1]) == torch.isnan(b[1])).all())
            R.add(kernel="qk_norm_rope(inv_freq table)", shape=shape, status="PASS" if same or K.mock else "FAIL",
                  note="q, k, v bit-identical to the null (computed) path" if same else
                  "NOT bit-identical to the null (computed) path")
            # and the table against transformers (its inv_freq computed by torch on the CPU)
            refs = qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"], inv=kern_inv_freq(D))
            qkr_check(R, shape, c, b[0], b[1], n, Hq, Hkv, D, pt, layer, layers, flags, refs)
        R.case("qk_norm_rope", shape, run_table)

    # (2) Llama 3.1's scaled frequencies as a table, and YaRN's attention factor as cos_scale
    for (Hq, Hkv, D, flags, cos_scale) in ([(32, 8, 128, 0, 1.0), (32, 8, 128, 2, 1.2079441), (14, 2, 64, 0, 0.9)]
                                           if not quick else [(4, 2, 128, 0, 1.2079441)]):
        shape = f"llama3-scaled inv_freq table, cos_scale {cos_scale}: Hq={Hq} Hkv={Hkv} D={D} flags={flags}"

        def run_scaled(Hq=Hq, Hkv=Hkv, D=D, flags=flags, cos_scale=cos_scale, shape=shape):
            n, pt = 64, 16
            c = qkr_inputs(n, Hq, Hkv, D, pt, 100000, layers, seed=41)
            inv = llama3_inv_freq(D)
            qkv, pool = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags, inv=inv, cos_scale=cos_scale)
            refs = qkr_refs(c["qkv"], n, Hq, Hkv, D, flags, c["qn"], c["kn"], c["bias"], c["pos"], inv=inv,
                            cos_scale=cos_scale)
            qkr_check(R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, flags, refs)
        R.case("qk_norm_rope", shape, run_scaled)

    # (3) adjacent pairs on llama.cpp's permuted q / k rows (GGUF llama): element for element the
    # neox result of the Hugging Face rows, permuted (bit-exact without the norm, whose sum's order
    # follows the element order)
    for (Hq, Hkv, D, flags) in ([(32, 8, 128, 0), (32, 8, 128, 2), (14, 2, 64, 0), (8, 4, 256, 0), (16, 8, 128, 1)]
                                if not quick else [(4, 2, 128, 2)]):
        shape = f"QKR_ADJACENT on GGUF-permuted rows: Hq={Hq} Hkv={Hkv} D={D} flags={flags | 8}"

        def run_adj(Hq=Hq, Hkv=Hkv, D=D, flags=flags, shape=shape):
            n, pt = 33, 16
            H = Hq + 2 * Hkv
            c = qkr_inputs(n, Hq, Hkv, D, pt, 40000, layers, seed=51)
            x = c["qkv"].view(n, H, D)
            xp = torch.cat([gguf_permute(x[:, :Hq + Hkv], D), x[:, Hq + Hkv:]], dim=1).reshape(n, H * D).contiguous()
            b = c["bias"].view(H, D)
            bp = torch.cat([gguf_permute(b[:Hq + Hkv], D), b[Hq + Hkv:]], dim=0).reshape(-1).contiguous()
            qnp, knp = gguf_permute(c["qn"], D).contiguous(), gguf_permute(c["kn"], D).contiguous()
            hf = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags)
            gg = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, flags | 8, qkv=xp, qn=qnp, kn=knp, bias=bp)
            pv_hf = pool_view(hf[1], layers, pt, Hkv, D)
            pv_gg = pool_view(gg[1], layers, pt, Hkv, D)
            q_same = bits_equal(gg[0].view(n, H, D)[:, :Hq], gguf_permute(hf[0].view(n, H, D)[:, :Hq], D).contiguous())
            valid = c["slots"] >= 0
            s_ = c["slots"][valid].long()
            k_hf = pv_hf[:, layer, 0].reshape(-1, Hkv, D)[s_]
            k_gg = pv_gg[:, layer, 0].reshape(-1, Hkv, D)[s_]
            k_same = bits_equal(k_gg, gguf_permute(k_hf, D).contiguous())
            v_same = bits_equal(pv_gg[:, layer, 1].reshape(-1, Hkv, D)[s_], pv_hf[:, layer, 1].reshape(-1, Hkv, D)[s_])
            exact = not (flags & 1)
            ok = (q_same and k_same and v_same) or not exact or K.mock
            R.add(kernel="qk_norm_rope(adjacent == permuted neox)", shape=shape, status="PASS" if ok else "FAIL",
                  note=f"q {'==' if q_same else '!='}, k {'==' if k_same else '!='}, v {'==' if v_same else '!='} "
                       f"the neox run on the HF rows, permuted" + ("" if exact else " (with the norm: not required)"))
            # and the adjacent run against its own reference
            refs = qkr_refs(xp, n, Hq, Hkv, D, flags | 8, qnp, knp, bp, c["pos"])
            cp = dict(c, qkv=xp)
            qkr_check(R, shape, cp, gg[0], gg[1], n, Hq, Hkv, D, pt, layer, layers, flags | 8, refs)
        R.case("qk_norm_rope", shape, run_adj)

    # (4) Gemma 3's q / k norm: bf16((x * r) * (norm_offset + w)) in fp32 (QKR_NORM | QKR_NORM_F32),
    # Hugging Face weights (offset 1, zero-centred w) and GGUF weights (offset 0, w = 1 + w_hf), global and
    # local theta; Gemma 3 4B / 1B / 27B heads
    for (Hq, Hkv, D, off, theta) in ([(8, 4, 256, 1.0, 1e6), (8, 4, 256, 1.0, 1e4), (4, 1, 256, 0.0, 1e6),
                                      (32, 16, 128, 1.0, 1e6)] if not quick else [(4, 1, 256, 1.0, 1e6)]):
        shape = f"Gemma q/k norm (flags 5) norm_offset {off:g} theta {theta:g}: Hq={Hq} Hkv={Hkv} D={D}"

        def run_gemma(Hq=Hq, Hkv=Hkv, D=D, off=off, theta=theta, shape=shape):
            n, pt = 64, 16
            c = qkr_inputs(n, Hq, Hkv, D, pt, 32768, layers, seed=61)
            if off == 1.0:  # zero-centred Hugging Face weights
                c["qn"] = (0.3 * torch.randn(D, generator=gen(62))).to(DEV).to(BF)
                c["kn"] = (0.3 * torch.randn(D, generator=gen(63))).to(DEV).to(BF)
            qkv, pool = qkr_launch(K, c, n, Hq, Hkv, D, pt, layer, layers, 5, off=off, theta=theta)
            refs = qkr_refs(c["qkv"], n, Hq, Hkv, D, 5, c["qn"], c["kn"], c["bias"], c["pos"], off=off, theta=theta)
            qkr_check(R, shape, c, qkv, pool, n, Hq, Hkv, D, pt, layer, layers, 5, refs)
        R.case("qk_norm_rope", shape, run_gemma)


# ============================================================================ group: attention
def build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, pad_tokens, pad_seqs, seed):
    """spec: list of (cached, new). Returns a dict with every buffer of the step ABI."""
    S = len(spec)
    ctxs = [c + n for c, n in spec]
    pages_per = [cdiv(c, pt) for c in ctxs]
    max_pages = max(pages_per) + 1
    total_pages = sum(pages_per) + 3
    perm = torch.randperm(total_pages, generator=gen(seed)).tolist()
    Sb = S + pad_seqs
    bt = torch.full((Sb, max_pages), -1, dtype=torch.int32)
    it = iter(perm)
    for i, np_ in enumerate(pages_per):
        for j in range(np_):
            bt[i, j] = next(it)
    n_tok = sum(n for _, n in spec)
    Tb = n_tok + pad_tokens
    qs = [0]
    for _, n in spec:
        qs.append(qs[-1] + n)
    qs += [qs[-1]] * pad_seqs
    seq_lens = ctxs + [0] * pad_seqs
    pool = nanfull((total_pages * pt * layers * 2 * Hkv * D,))
    pv = pool_view(pool, layers, pt, Hkv, D)
    kview, vview = pv[:, layer, 0], pv[:, layer, 1]
    Ks, Vs = [], []
    for i, c in enumerate(ctxs):
        kk = randn((c, Hkv, D), seed * 100 + 2 * i + 1)
        vv = randn((c, Hkv, D), seed * 100 + 2 * i + 2)
        p = torch.arange(c)
        pages = bt[i, (p // pt)].long().to(DEV)
        offs = (p % pt).to(DEV)
        kview[pages, offs] = kk
        vview[pages, offs] = vv
        Ks.append(kk)
        Vs.append(vv)
    qkv = randn((Tb, (Hq + 2 * Hkv) * D), seed * 100 + 99)
    return dict(S=S, Sb=Sb, Tb=Tb, n_tok=n_tok, max_pages=max_pages, pool=pool, qkv=qkv,
                bt=bt.to(DEV), qs=torch.tensor(qs, dtype=torch.int32, device=DEV),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV), Ks=Ks, Vs=Vs, spec=spec)


def attention_refs(c, Hq, Hkv, D, scale, window=0):
    """fp64 and torch-bf16 (SDPA) attention of the step; window > 0: the sliding window (a query at
    position p sees keys p - window + 1 .. p: transformers' sliding mask keeps kv_idx > q_idx - window)."""
    G = Hq // Hkv
    ref = torch.zeros((c["n_tok"], Hq, D), dtype=torch.float64, device=DEV)
    tbf = torch.zeros((c["n_tok"], Hq, D), dtype=BF, device=DEV)
    q_all = c["qkv"][:, :Hq * D].reshape(c["Tb"], Hq, D)
    t0 = 0
    for i, (cached, n) in enumerate(c["spec"]):
        ctx = cached + n
        q = q_all[t0:t0 + n]                              # [n, Hq, D]
        k = c["Ks"][i].repeat_interleave(G, dim=1)        # [ctx, Hq, D]
        v = c["Vs"][i].repeat_interleave(G, dim=1)
        qpos = (cached + torch.arange(n, device=DEV))[:, None]
        mask = torch.arange(ctx, device=DEV)[None, :] <= qpos  # [n, ctx]
        if window > 0:
            mask &= torch.arange(ctx, device=DEV)[None, :] > qpos - window
        s = torch.einsum("nhd,chd->hnc", q.double(), k.double()) * scale
        s = s.masked_fill(~mask[None], float("-inf"))
        p = torch.softmax(s, dim=-1)
        ref[t0:t0 + n] = torch.einsum("hnc,chd->nhd", p, v.double())
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask[None, None], scale=scale)
        tbf[t0:t0 + n] = o[0].transpose(0, 1)
        t0 += n
    return ref, tbf


def att_args(c, out, Hq, Hkv, D, pt, layers, layer, window=0):
    """The arguments of attention_dD and attention_prefill_dD (KERN_ATT_ARGS) for case c."""
    return [P(out), P(c["qkv"]), P(c["pool"]), P(c["bt"]), P(c["seq_lens"]), P(c["qs"]), I32(c["Sb"]),
            I32(c["Tb"]), I32(c["max_pages"]), I32((Hq + 2 * Hkv) * D), I32(Hq), I32(Hkv), I32(layer),
            I32(layers), I32(pt), F32(D ** -0.5), I32(window)]


def att_launch(K, c, out, Hq, Hkv, D, pt, layers, layer, window=0, grid_x=None):
    """attention_dD as the manifest launches it: grid [ceil(tokens / (32 / G)) + seqs, Hkv], block 128,
    dynamic shared memory ATT_SMEM_D256 at D = 256."""
    G = Hq // Hkv
    gx = grid_x or cdiv(c["Tb"], 32 // G) + c["Sb"]
    K.launch(f"attention_d{D}", (gx, Hkv), (128,), att_args(c, out, Hq, Hkv, D, pt, layers, layer, window),
             smem=att_smem(D))


def v_of_own_key(c, Hq, Hkv, D):
    """[n_tok, Hq, D]: each row's V at its own position (the exact output of a window of 1)."""
    G = Hq // Hkv
    rows = []
    for i, (cached, n) in enumerate(c["spec"]):
        rows.append(c["Vs"][i][cached:cached + n].repeat_interleave(G, dim=1))
    return torch.cat(rows)


def window_extra_checks(R, K, kname, shape, out, c, Hq, Hkv, D, window, rerun):
    """Window 1: every output is the row's own V, exactly. A window at least every context: the
    no-window run's bits (rerun(0) returns that run's output)."""
    n = c["n_tok"]
    if window == 1:
        same = bits_equal(out[:n].view(n, Hq, D), v_of_own_key(c, Hq, Hkv, D))
        R.add(kernel=kname + "(window 1)", shape=shape, status="PASS" if same or K.mock else "FAIL",
              note="every output == the row's own V, exactly" if same else "outputs are NOT the rows' own V")
    elif window > 0 and window >= max(cached + m for cached, m in c["spec"]):
        same = bits_equal(out[:n], rerun(0)[:n])
        R.add(kernel=kname + f"(window {window} >= context)", shape=shape, status="PASS" if same else "FAIL",
              note="bit-identical to the run without a window" if same else "NOT bit-identical to no window")


def g_attention(K, R, quick):
    layers, layer = 2, 1
    mixed = [(100, 37), (499, 1), (0, 300), (0, 1), (63, 1), (15, 17), (1000, 64), (31, 33)]
    cases = [
        # name, Hq, Hkv, D, page_tokens, spec, pad_tokens, pad_seqs
        ("qwen3-0.6B heads, page 16", 16, 8, 128, 16, mixed, 5, 2),
        ("qwen3-4B heads, page 64", 32, 8, 128, 64, mixed, 3, 1),
        ("qwen2.5-0.5B heads (G=7, D=64), page 16", 14, 2, 64, 16, mixed, 4, 2),
        ("G=1 D=128, page 64", 8, 8, 128, 64, [(0, 7), (200, 1), (64, 64)], 0, 0),
        ("G=16 D=64, page 16", 16, 1, 64, 16, [(5, 3), (300, 1), (0, 40)], 1, 0),
        ("decode batch 64, page 16", 32, 8, 128, 16,
         [(int(c), 1) for c in torch.randint(0, 2000, (64,), generator=gen(77))], 0, 0),
        ("one decode token, ctx 1", 16, 8, 128, 16, [(0, 1)], 7, 3),
        ("long prefill chunk over cache, page 64", 32, 8, 128, 64, [(1500, 700), (0, 513)], 0, 0),
    ]
    # head_dim 256 (Gemma 3) and sliding windows (the last field): windows shorter than the
    # contexts (the tiles below a window skipped; rows with no visible key in their first key tile),
    # 1 (every output the row's own V), longer than every context (the no-window bits)
    cases += [
        ("Gemma3-4B heads (G=2, D=256), page 16", 8, 4, 256, 16, mixed, 5, 2, 0),
        ("Gemma3-4B heads, window 1024 (its local layers)", 8, 4, 256, 16, [(1500, 700), (0, 1100), (2000, 1), (1023, 1)],
         0, 0, 1024),
        ("Gemma3-1B heads (G=4, D=256), window 512", 4, 1, 256, 16, mixed, 3, 1, 512),
        ("0.6B heads, window 100, page 16", 16, 8, 128, 16, mixed, 5, 2, 100),
        ("G=1 D=128 (32 tokens per tile), window 20, page 64", 8, 8, 128, 64, [(0, 70), (200, 1), (64, 129)], 0, 0, 20),
        ("Qwen2.5-0.5B heads G=7 D=64, window 45", 14, 2, 64, 16, mixed, 4, 2, 45),
        ("window 1, G=4 D=64", 8, 2, 64, 16, mixed, 0, 0, 1),
        ("window 1, G=2 D=256", 8, 4, 256, 16, [(30, 40), (0, 1)], 0, 0, 1),
        ("window 4096 > every context, 4B heads", 32, 8, 128, 16, mixed, 3, 1, 4096),
    ]
    if quick:
        cases = [("quick mixed", 4, 2, 64, 4, [(5, 3), (9, 1), (0, 6)], 2, 1),
                 ("quick G=1", 2, 2, 128, 8, [(0, 5), (10, 1)], 0, 0),
                 ("quick D=256 window 5", 4, 2, 256, 16, [(20, 13), (0, 3)], 1, 0, 5)]
    for ci, (name, Hq, Hkv, D, pt, spec, pad_t, pad_s, *rest) in enumerate(cases):
        window = rest[0] if rest else 0
        shape = f"{name}: Hq={Hq} Hkv={Hkv} D={D} seqs={len(spec)}+{pad_s} tokens={sum(n for _, n in spec)}+{pad_t}"
        kname = f"attention_d{D}"

        def run(Hq=Hq, Hkv=Hkv, D=D, pt=pt, spec=spec, pad_t=pad_t, pad_s=pad_s, ci=ci, shape=shape, kname=kname,
                window=window):
            c = build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=31 + ci)
            G = Hq // Hkv
            BQ = 32 // G
            scale = D ** -0.5
            out = nanfull((c["Tb"] + 1, Hq * D))  # + 1 guard row
            assert cdiv(c["Tb"], BQ) + c["Sb"] >= 1
            att_launch(K, c, out, Hq, Hkv, D, pt, layers, layer, window)
            ref, tbf = attention_refs(c, Hq, Hkv, D, scale, window)
            n = c["n_tok"]
            close(R, kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf, note=f"window {window}" if window else "")
            check_rows_past(R, kname, shape, out, n, c["Tb"])

            def rerun(w):
                o = nanfull((c["Tb"] + 1, Hq * D))
                att_launch(K, c, o, Hq, Hkv, D, pt, layers, layer, w)
                return o
            window_extra_checks(R, K, kname, shape, out, c, Hq, Hkv, D, window, rerun)
        R.case(kname, shape, run)

    # grid-stride robustness: a grid smaller than the work still covers every tile
    def run_small_grid():
        Hq, Hkv, D, pt = 8, 2, 128, 16
        spec = [(40, 20), (0, 9), (7, 1)]
        c = build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, 0, 0, seed=90)
        out = nanfull((c["Tb"], Hq * D))
        att_launch(K, c, out, Hq, Hkv, D, pt, layers, layer, 0, grid_x=1)
        ref, tbf = attention_refs(c, Hq, Hkv, D, D ** -0.5)
        close(R, "attention_d128", "grid.x=1 (grid-stride loop)", out.view(-1, Hq, D), ref, tbf=tbf)
    R.case("attention_d128", "grid.x=1", run_small_grid)


# ============================================================================ group: attention_decode
# Split-KV decode attention (attention_decode.cu): attention_decode_dD (grid [tokens, Hkv, Z]) then
# attention_combine_dD (grid [tokens, Hq], block [D]). A row's chunking is fixed by the row and two
# constants (min_chunk, max_chunks: batch invariance); the grid's z size Z only spreads the chunks
# over CTAs (CTA z takes chunks z, z + Z, ...). Z, max_chunks and the minimum chunk are the
# manifest's (packs: decode_splits, decode_max_chunks); the same numbers here.
DEC_TARGET_CTAS = 264   # max_chunks: a batch-1 row on about 2 CTAs per SM of the H200's 132 SMs
DEC_GRID_CTAS = 2048    # the CTAs a step's grid aims at (Z)
DEC_MAX_SPLITS = 64     # the generator's cap (the kernel accepts up to 128)
DEC_MIN_CHUNK = 64      # keys per chunk at least (rounded up to 32 by the kernel)
DEC_CTX = [1, 15, 16, 17, 255, 1000, 4096]


def dec_max_chunks(Hkv):
    """The manifest's max_chunks (a constant of the model): batch 1's grid z."""
    return max(1, min(DEC_MAX_SPLITS, cdiv(DEC_TARGET_CTAS, Hkv)))


def dec_splits(seqs, Hkv):
    """The manifest's grid z for a decode step: min(max_chunks, ceil(2048 / (seqs * Hkv)))."""
    return max(1, min(dec_max_chunks(Hkv), cdiv(DEC_GRID_CTAS, seqs * Hkv)))


def dec_chunking(kmax, max_chunks, min_chunk, window=0):
    """(chunk, n_chunks) of a token with kmax visible keys: attention_decode.cu's rule. With a sliding
    window the chunks cover [kb, kmax), kb = the window's first key (kmax - window) rounded down to 32."""
    if kmax <= 0:
        return 32, 0
    kb = max(0, kmax - window) // 32 * 32 if window > 0 else 0
    mc = max(32, cdiv(min_chunk, 32) * 32)
    chunk = max(mc, cdiv(cdiv(kmax - kb, max_chunks), 32) * 32)
    return chunk, cdiv(kmax - kb, chunk)


def dec_partial_floats(T, max_chunks, Hq, D):
    """Floats of the scratch: the header (T rounded up to 4) and max_chunks * T * Hq records of D + 4."""
    return cdiv(T, 4) * 4 + max_chunks * T * Hq * (D + 4)


def dec_token_kmax(qs, seq_lens, num_seqs, T):
    """Visible keys of every token row (0 for padded tokens), from query_start and seq_lens."""
    qs = [int(x) for x in qs.tolist()]
    sl = [int(x) for x in seq_lens.tolist()]
    out = [0] * T
    for s in range(num_seqs):
        n = qs[s + 1] - qs[s]
        for i in range(n):
            out[qs[s] + i] = max(0, sl[s] - n + i + 1)
    return out


def build_decode_case(groups, rows, Hq, Hkv, D, pt, layers, layer, pad_tokens, pad_seqs, seed, qscale=1.0):
    """One-token rows over shared sequences. groups: context length of each sequence (its pages and
    K/V); rows: (group, ctx) with 1 <= ctx <= groups[group]: a row is a one-token "sequence" with
    the group's whole block-table row and seq_lens = ctx (a decode row when ctx = groups[group];
    speculative verify rows are consecutive ctx of one group). Keys of the group past a row's ctx
    hold real data (the later drafts), so a row that read past its ctx would be wrong; slots past
    a group's context hold NaN. Returns build_attention_case's dict (spec = [(ctx - 1, 1)] per row)."""
    pages_per = [cdiv(c, pt) for c in groups]
    max_pages = max(pages_per) + 1
    total_pages = sum(pages_per) + 3
    perm = torch.randperm(total_pages, generator=gen(seed)).tolist()
    it = iter(perm)
    gpages = [[next(it) for _ in range(n)] for n in pages_per]
    S = len(rows)
    Sb = S + pad_seqs
    bt = torch.full((Sb, max_pages), -1, dtype=torch.int32)
    for i, (g, ctx) in enumerate(rows):
        assert 1 <= ctx <= groups[g], (g, ctx, groups[g])
        for j, p in enumerate(gpages[g]):
            bt[i, j] = p
    pool = nanfull((total_pages * pt * layers * 2 * Hkv * D,))
    pv = pool_view(pool, layers, pt, Hkv, D)
    kview, vview = pv[:, layer, 0], pv[:, layer, 1]
    gK, gV = [], []
    for g, c in enumerate(groups):
        kk = randn((c, Hkv, D), seed * 100 + 2 * g + 1)
        vv = randn((c, Hkv, D), seed * 100 + 2 * g + 2)
        p = torch.arange(c)
        pages = torch.tensor(gpages[g], dtype=torch.long)[p // pt].to(DEV)
        offs = (p % pt).to(DEV)
        kview[pages, offs] = kk
        vview[pages, offs] = vv
        gK.append(kk)
        gV.append(vv)
    Tb = S + pad_tokens
    qkv = randn((Tb, (Hq + 2 * Hkv) * D), seed * 100 + 99, scale=qscale)
    qs = list(range(S + 1)) + [S] * pad_seqs
    seq_lens = [ctx for _, ctx in rows] + [0] * pad_seqs
    return dict(S=S, Sb=Sb, Tb=Tb, n_tok=S, max_pages=max_pages, pool=pool, qkv=qkv,
                bt=bt.to(DEV), qs=torch.tensor(qs, dtype=torch.int32, device=DEV),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV),
                Ks=[gK[g][:ctx] for g, ctx in rows], Vs=[gV[g][:ctx] for g, ctx in rows],
                spec=[(ctx - 1, 1) for _, ctx in rows])


def dec_launch(K, c, Hq, Hkv, D, pt, layers, layer, S, min_chunk, max_chunks, guard=64, window=0):
    """attention_decode_dD (grid z = S; DEC_SMEM_D256 bytes of dynamic shared memory at D = 256) +
    attention_combine_dD (block D) on case c. Returns (out [Tb + 1, Hq*D] with a NaN guard row, partial
    with `guard` NaN floats past its size)."""
    T = c["Tb"]
    partial = nanfull((dec_partial_floats(T, max_chunks, Hq, D) + guard,), torch.float32)
    out = nanfull((T + 1, Hq * D))
    K.launch(f"attention_decode_d{D}", (T, Hkv, S), (128,),
             [P(partial), P(c["qkv"]), P(c["pool"]), P(c["bt"]), P(c["seq_lens"]), P(c["qs"]), I32(c["Sb"]),
              I32(T), I32(c["max_pages"]), I32((Hq + 2 * Hkv) * D), I32(Hq), I32(Hkv), I32(layer), I32(layers),
              I32(pt), F32(D ** -0.5), I32(min_chunk), I32(max_chunks), I32(window)], smem=dec_smem(D))
    K.launch(f"attention_combine_d{D}", (T, Hq), (D,), [P(out), P(partial), I32(T), I32(Hq)])
    return out, partial


def dec_check(K, R, shape, c, Hq, Hkv, D, pt, layers, layer, S, min_chunk, max_chunks, exact_single=True, window=0):
    """Runs the split path on case c (grid z = S) and checks: the fp64 reference (the attention
    tolerance), zeros on padded rows, the guard row, the scratch's header (chunks per token) and
    guard, and against attention_dD on the same inputs: rows of one chunk bit-identical. With a
    sliding window: the same, the chunks starting at the window's tile (dec_chunking); window 1:
    every output the row's own V exactly; a window at least every context: the no-window bits."""
    kname = f"attention_decode_d{D}"
    scale = D ** -0.5
    T, n = c["Tb"], c["n_tok"]
    out, partial = dec_launch(K, c, Hq, Hkv, D, pt, layers, layer, S, min_chunk, max_chunks, window=window)
    kmax = dec_token_kmax(c["qs"].cpu(), c["seq_lens"].cpu(), c["Sb"], T)
    act = [dec_chunking(k, max_chunks, min_chunk, window)[1] for k in kmax]
    ref, tbf = attention_refs(c, Hq, Hkv, D, scale, window)
    nsplit = sorted(set(act[:n]))
    close(R, kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf,
          note=f"Z={S} max_chunks={max_chunks} min_chunk={min_chunk} chunks {nsplit[0]}..{nsplit[-1]}"
               + (f" window {window}" if window else ""))
    window_extra_checks(R, K, kname, shape, out, c, Hq, Hkv, D, window,
                        lambda w: dec_launch(K, c, Hq, Hkv, D, pt, layers, layer, S, min_chunk, max_chunks, window=w)[0])
    check_rows_past(R, kname, shape, out, n, T)
    guard_nan(R, kname, shape, partial[dec_partial_floats(T, max_chunks, Hq, D):], "scratch past its size")
    hdr = [float(x) for x in partial[:T].cpu().tolist()]
    okh = hdr == [float(a) for a in act]
    R.add(kernel=kname + "(header)", shape=shape, status="PASS" if okh else "FAIL",
          note="chunks per token as expected" if okh else f"header {hdr[:8]}... expected {act[:8]}...")
    # the same inputs through attention_dD
    att = nanfull((T, Hq * D))
    att_launch(K, c, att, Hq, Hkv, D, pt, layers, layer, window)
    diff = float((out[:T].double() - att.double()).abs().nan_to_num(nan=float("inf")).max()) if T else 0.0
    single = [t for t in range(n) if act[t] == 1]
    note = f"max |split - attention_d{D}| = {diff:.3e}; {len(single)}/{n} rows single-split"
    ok = True
    if exact_single and single and not K.mock:
        idx = torch.tensor(single, device=out.device)
        same = bits_equal(out[idx], att[idx])
        ok = same
        note += "; single-split rows bit-identical" if same else "; single-split rows NOT bit-identical"
    R.add(kernel=kname + f"(vs attention_d{D})", shape=shape, status="PASS" if ok else "FAIL", note=note)


def g_attention_decode(K, R, quick):
    layers, layer = 2, 1
    heads = [  # name, Hq, Hkv, D
        ("0.6B heads G=2 D=128", 16, 8, 128),
        ("4B heads G=4 D=128", 32, 8, 128),
        ("G=2 D=64", 4, 2, 64),
        ("G=4 D=64", 8, 2, 64),
    ]
    cases = []  # (name, Hq, Hkv, D, pt, groups, rows, pad_t, pad_s, S, min_chunk, qscale)

    def plain(ctxs):
        return list(ctxs), [(i, c) for i, c in enumerate(ctxs)]

    if quick:
        for hname, Hq, Hkv, D in heads[1:3]:
            for ctxs in ([1], [17], [1000], [15, 255, 64]):
                g, r = plain(ctxs)
                cases.append((f"{hname} ctx {ctxs}", Hq, Hkv, D, 16, g, r, 1, 1, dec_splits(len(r), Hkv),
                              DEC_MIN_CHUNK, 1.0))
    else:
        for hname, Hq, Hkv, D in heads:
            for ctx in DEC_CTX:  # batch 1 (a bucket of 1: no padding)
                g, r = plain([ctx])
                cases.append((f"{hname} b=1 ctx {ctx}", Hq, Hkv, D, 16, g, r, 0, 0, dec_splits(1, Hkv),
                              DEC_MIN_CHUNK, 1.0))
            for ctxs in ([1, 255, 4096], [15, 1000, 17], [16, 16, 4096]):  # batch 3 (bucket 4: one padded row)
                g, r = plain(ctxs)
                cases.append((f"{hname} b=3 ctx {ctxs} +pad", Hq, Hkv, D, 16, g, r, 1, 1, dec_splits(4, Hkv),
                              DEC_MIN_CHUNK, 1.0))
            g, r = plain([DEC_CTX[i % len(DEC_CTX)] for i in range(64)])  # batch 64, every context
            cases.append((f"{hname} b=64 ctx {DEC_CTX} cycled", Hq, Hkv, D, 16, g, r, 0, 0, dec_splits(64, Hkv),
                          DEC_MIN_CHUNK, 1.0))
        # speculative verify rows: k + 1 rows of one sequence (one block-table row, consecutive
        # seq_lens), beside plain decode rows, padded to a bucket
        for Hq, Hkv, D, pt in [(32, 8, 128, 16), (16, 8, 128, 64), (4, 2, 64, 16)]:
            groups = [1005, 300, 40]
            rows = [(0, 1001 + j) for j in range(5)] + [(1, 300)] + [(2, 36 + j) for j in range(5)]
            cases.append((f"verify rows (k=4, two sequences) + decode, page {pt}", Hq, Hkv, D, pt, groups, rows, 5, 5,
                          dec_splits(16, Hkv), DEC_MIN_CHUNK, 1.0))
        # verify rows crossing a page and a chunk boundary, batch-1 split count
        rows = [(0, 4090 + j) for j in range(7)]
        cases.append(("verify rows ctx 4090..4096, G=4 D=128", 32, 8, 128, 16, [4096], rows, 1, 1,
                      dec_splits(8, 8), DEC_MIN_CHUNK, 1.0))
        # split counts and chunk sizes
        g, r = plain([1, 33, 4096])
        cases.append(("max_chunks 1 (no split: bit-identical to attention_d128)", 32, 8, 128, 16, g, r, 0, 0, 1,
                      DEC_MIN_CHUNK, 1.0, 1))
        cases.append(("max_chunks 128 min_chunk 32 (1-key..32-key chunks)", 32, 8, 128, 16, g, r, 0, 0, 128, 32, 1.0, 128))
        cases.append(("max_chunks 7 min_chunk 256, page 64", 16, 8, 128, 64, g, r, 2, 0, 7, 256, 1.0, 7))
        cases.append(("max_chunks 64 min_chunk 1 (rounded to 32), D=64", 8, 2, 64, 16, g, r, 0, 0, 64, 1, 1.0, 64))
        # grid z below (CTAs loop over chunks z, z + Z, ...) and above max_chunks (idle CTAs)
        cases.append(("Z=1 < max_chunks 33: one CTA streams all chunks", 32, 8, 128, 16, g, r, 1, 1, 1,
                      DEC_MIN_CHUNK, 1.0))
        cases.append(("Z=5 < max_chunks 64, D=64", 8, 2, 64, 16, g, r, 0, 0, 5, DEC_MIN_CHUNK, 1.0))
        cases.append(("Z=100 > max_chunks 33", 32, 8, 128, 16, g, r, 0, 0, 100, DEC_MIN_CHUNK, 1.0))
        # sharp softmax: large scores, so the splits' maxima differ widely
        g, r = plain([4096, 1000])
        cases.append(("sharp softmax (q x 8), 4B heads", 32, 8, 128, 16, g, r, 0, 0, dec_splits(2, 8), DEC_MIN_CHUNK, 8.0))
        cases.append(("sharp softmax (q x 8), G=4 D=64", 8, 2, 64, 16, g, r, 0, 0, dec_splits(2, 2), DEC_MIN_CHUNK, 8.0))
        # other group sizes the kernel accepts (G <= 16)
        g, r = plain([1000, 17, 4096])
        cases.append(("Qwen2.5-0.5B heads G=7 D=64", 14, 2, 64, 16, g, r, 1, 1, dec_splits(4, 2), DEC_MIN_CHUNK, 1.0))
        cases.append(("G=16 D=64", 16, 1, 64, 16, g, r, 0, 0, dec_splits(3, 1), DEC_MIN_CHUNK, 1.0))
        cases.append(("G=1 D=128", 8, 8, 128, 64, g, r, 0, 0, dec_splits(3, 8), DEC_MIN_CHUNK, 1.0))
        cases.append(("G=8 D=128 (Qwen3-32B heads)", 64, 8, 128, 16, g, r, 0, 0, dec_splits(3, 8), DEC_MIN_CHUNK, 1.0))
    # head_dim 256 (Gemma 3: 4B heads 8/4, 1B heads 4/1) and sliding windows (the last field; the one
    # before it a max_chunks override or None): rows on both sides of the window's edge, verify rows
    # whose windows start in different key tiles, a grid z below the chunks, window 1, a window
    # longer than every context
    g, r = plain([1, 255, 1000, 4096])
    cases.append(("Gemma3-4B heads G=2 D=256", 8, 4, 256, 16, g, r, 1, 1, dec_splits(5, 4), DEC_MIN_CHUNK, 1.0))
    if not quick:
        g, r = plain([1, 1023, 1024, 1025, 1057, 4096])
        cases.append(("Gemma3-4B heads, window 1024", 8, 4, 256, 16, g, r, 0, 0, dec_splits(6, 4), DEC_MIN_CHUNK, 1.0,
                      None, 1024))
        cases.append(("Gemma3-1B heads G=4 D=256, window 512, Z=1", 4, 1, 256, 16, g, r, 1, 1, 1, DEC_MIN_CHUNK, 1.0,
                      None, 512))
        g, r = plain([1, 31, 32, 33, 99, 100, 101, 132, 133, 1000, 4096])
        cases.append(("4B heads, window 100", 32, 8, 128, 16, g, r, 1, 1, dec_splits(12, 8), DEC_MIN_CHUNK, 1.0, None, 100))
        cases.append(("G=4 D=64, window 1", 8, 2, 64, 16, g, r, 0, 0, dec_splits(11, 2), DEC_MIN_CHUNK, 1.0, None, 1))
        cases.append(("0.6B heads, window 8192 > every context", 16, 8, 128, 16, g, r, 0, 0, dec_splits(11, 8),
                      DEC_MIN_CHUNK, 1.0, None, 8192))
        cases.append(("verify rows across the window's key tile, window 1000, 4B heads", 32, 8, 128, 16, [1040],
                      [(0, 1030 + j) for j in range(5)], 1, 1, dec_splits(8, 8), DEC_MIN_CHUNK, 1.0, None, 1000))
        cases.append(("sharp softmax (q x 8), window 300, Gemma3-4B heads", 8, 4, 256, 16, [4096, 1000],
                      [(0, 4096), (1, 1000)], 0, 0, dec_splits(2, 4), DEC_MIN_CHUNK, 8.0, None, 300))
    else:
        g, r = plain([1, 33, 1000])
        cases.append(("quick D=256 window 100", 4, 2, 256, 16, g, r, 1, 1, dec_splits(4, 2), DEC_MIN_CHUNK, 1.0, None, 100))

    for ci, (name, Hq, Hkv, D, pt, groups, rows, pad_t, pad_s, S, mc, qscale, *rest) in enumerate(cases):
        # S: the grid's z; max_chunks: the manifest's (the model's) unless the case names one
        MC = rest[0] if rest and rest[0] else dec_max_chunks(Hkv)
        window = rest[1] if len(rest) > 1 else 0
        shape = (f"{name}: Hq={Hq} Hkv={Hkv} D={D} page {pt} rows={len(rows)}+{pad_t} Z={S} max_chunks={MC}"
                 + (f" window={window}" if window else ""))

        def run(Hq=Hq, Hkv=Hkv, D=D, pt=pt, groups=groups, rows=rows, pad_t=pad_t, pad_s=pad_s, S=S, mc=mc,
                qscale=qscale, ci=ci, shape=shape, MC=MC, window=window):
            c = build_decode_case(groups, rows, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=200 + ci,
                                  qscale=qscale)
            dec_check(K, R, shape, c, Hq, Hkv, D, pt, layers, layer, S, mc, MC, window=window)
        R.case(f"attention_decode_d{D}", shape, run)

    # any step is correct on the split path (the manifest uses it for one-token rows only): prefill
    # chunks over cached context, decode tokens, padded tokens and sequences
    mixed = [(100, 37), (499, 1), (0, 300), (0, 1), (63, 1), (15, 17), (1000, 64), (31, 33)]
    if quick:
        mixed = [(5, 3), (9, 1), (0, 6)]
    for ci, (name, Hq, Hkv, D, pt, S, window) in enumerate([
            ("mixed prefill/decode step, 4B heads", 32, 8, 128, 16, 8, 0),
            ("mixed prefill/decode step, G=7 D=64", 14, 2, 64, 64, 3, 0),
            ("mixed prefill/decode step, Gemma3-4B heads D=256, window 64", 8, 4, 256, 16, 4, 64)]):
        shape = f"{name}: S={S}"

        def run_mixed(Hq=Hq, Hkv=Hkv, D=D, pt=pt, S=S, ci=ci, shape=shape, window=window):
            c = build_attention_case(mixed, Hq, Hkv, D, pt, layers, layer, 3, 2, seed=300 + ci)
            dec_check(K, R, shape, c, Hq, Hkv, D, pt, layers, layer, S, DEC_MIN_CHUNK, dec_max_chunks(Hkv), window=window)
        R.case(f"attention_decode_d{D}", shape, run_mixed)

    # batch invariance: the same rows in steps of different sizes and grid z must be bit-identical
    inv = [("4B heads G=4 D=128", 32, 8, 128, 0), ("Qwen2.5-0.5B heads G=7 D=64", 14, 2, 64, 0),
           ("Gemma3-4B heads G=2 D=256, window 1024", 8, 4, 256, 1024), ("4B heads G=4 D=128, window 100", 32, 8, 128, 100)]
    for ci, (hname, Hq, Hkv, D, window) in enumerate(inv[:1] if quick else inv):
        shape = f"batch invariance, {hname}: steps of 1/3/8/64 rows, verify rows, Z 1..max_chunks"

        def run_inv(Hq=Hq, Hkv=Hkv, D=D, ci=ci, shape=shape, window=window):
            dec_invariance(K, R, shape, Hq, Hkv, D, layers, layer, seed=500 + ci, quick=quick, window=window)
        R.case(f"attention_decode_d{D}", shape, run_inv)


def dec_invariance(K, R, shape, Hq, Hkv, D, layers, layer, seed, quick=False, window=0):
    """Speculative decoding's promise on the split path: a row (its sequence's KV, its position, its
    query) gets the same bits in a decode step of 1, 3, 8 or 64 rows, at any grid z, and as one of
    the k + 1 rows of a verify step. One case holds every row (a 4096-token sequence read at many
    positions, verify rows among them, short filler rows of a second sequence); each step takes a
    subset of its rows (their q, block-table row and seq_lens) in some order, with padding. Besides
    the bf16 output, each row's scratch records ({o, m, l} per chunk and head, and the chunk count)
    must be bit-identical: they catch a step-dependent chunking even where the output rounds alike.
    With a sliding window (rows on both sides of its edge): the chunks start at the window's first
    key rounded down to 32, the row's alone, so the same holds."""
    pt, MC = 16, dec_max_chunks(Hkv)
    ctxs = [1, 2, 31, 32, 33, 63, 64, 65, 100, 129, 255, 256, 1000, 2048, 2049, 2111, 4000] + list(range(4090, 4097))
    if window:  # the window's edge instead of some short contexts (the indices of the steps below stay)
        ctxs[1:8] = [window - 1, window, window + 1, window + 31, window + 32, window + 33, window + 34]
    rows = [(0, x) for x in ctxs]
    rows += [(1, 1 + (7 * i) % 96) for i in range(64 - len(rows))]
    c = build_decode_case([4096, 96], rows, Hq, Hkv, D, pt, layers, layer, 0, 0, seed)
    N = len(rows)

    def step(idx, Z, pad_t=0, pad_s=0):
        n = len(idx)
        it = torch.tensor(idx, dtype=torch.long, device=c["qkv"].device)
        qkv = torch.cat([c["qkv"][it], nanfull((pad_t, c["qkv"].shape[1]))]) if pad_t else c["qkv"][it].clone()
        bt = torch.cat([c["bt"][it], torch.full((pad_s, c["max_pages"]), -1, dtype=torch.int32, device=c["bt"].device)])
        sl = torch.cat([c["seq_lens"][it], torch.zeros(pad_s, dtype=torch.int32, device=c["bt"].device)])
        qs = torch.tensor(list(range(n + 1)) + [n] * pad_s, dtype=torch.int32, device=c["bt"].device)
        sub = dict(Sb=n + pad_s, Tb=n + pad_t, max_pages=c["max_pages"], pool=c["pool"], qkv=qkv, bt=bt, seq_lens=sl, qs=qs)
        T = n + pad_t
        out, partial = dec_launch(K, sub, Hq, Hkv, D, pt, layers, layer, Z, DEC_MIN_CHUNK, MC, window=window)
        h4 = cdiv(T, 4) * 4
        recs = partial[h4:h4 + MC * T * Hq * (D + 4)].view(MC, T, Hq, D + 4)
        cnt = [int(x) for x in partial[:n].tolist()]
        return out[:n], [(cnt[j], recs[:max(0, min(MC, cnt[j])), j, :, :D + 2]) for j in range(n)]

    ref, ref_recs = step(list(range(N)), dec_splits(N, Hkv))  # all 64 rows, the manifest's z for 64
    # the reference itself is right (fp64 SDPA), so the bit comparisons below compare right answers
    want, tbf = attention_refs(c, Hq, Hkv, D, D ** -0.5, window)
    close(R, f"attention_decode_d{D}", shape + " (64-row reference)", ref.view(N, Hq, D), want, tbf=tbf)
    steps = [(list(range(N)), 1)]                                          # 64 rows, z = 1
    steps += [([i], dec_splits(1, Hkv)) for i in range(0 if not quick else 10, len(ctxs))]  # steps of 1
    steps += [([i], 1) for i in (0, 16, 23)]
    steps += [(list(range(i, min(N, i + 3))), dec_splits(4, Hkv), 1, 1) for i in range(0, N, 3)]  # 3 + padding
    for Z in sorted({dec_splits(8, Hkv), 2, 7, MC}):                      # 8 rows, reversed, several z
        steps.append((list(range(16, 8, -1)) if Z % 2 else list(range(24, 16, -1)), Z))
    # verify steps: k + 1 consecutive positions of one sequence (k = 4: 4092..4096; k = 3:
    # 4093..4096 beside filler rows and a decode row), and the positions 63..65 / 32..33
    steps += [([19, 20, 21, 22, 23], dec_splits(5, Hkv)), ([20, 21, 22, 23, 30, 31, 40, 12], dec_splits(8, Hkv), 2, 1),
              ([5, 6, 7], dec_splits(3, Hkv)), ([3, 4], dec_splits(2, Hkv))]
    bad, worst = 0, ""
    for st in steps:
        idx, Z = st[0], st[1]
        pad = st[2:] if len(st) > 2 else (0, 0)
        got, recs = step(idx, Z, *pad)
        for j, i in enumerate(idx):
            same_recs = recs[j][0] == ref_recs[i][0] and bits_equal(recs[j][1], ref_recs[i][1])
            if not bits_equal(got[j], ref[i]) or not same_recs:
                bad += 1
                worst = worst or f"row {i} (ctx {rows[i][1]}) in a step of {len(idx)} rows, z {Z}"
    ok = bad == 0 or K.mock
    R.add(kernel=f"attention_decode_d{D}(batch invariance)", shape=shape, status="PASS" if ok else "FAIL",
          note=f"{len(steps)} steps, {sum(len(s[0]) for s in steps)} rows (output and chunk records) bit-identical to "
               f"the 64-row step's" if bad == 0
          else f"{bad} rows differ from the 64-row step's, first: {worst}")


# ============================================================================ group: argmax
def argmax_ref(x):
    a = x.detach().cpu().double().numpy()
    outs = []
    for row in a:
        nanpos = np.flatnonzero(np.isnan(row))
        outs.append(int(nanpos[0]) if len(nanpos) else int(np.argmax(row)))
    return outs


def g_argmax(K, R, quick):
    for V in ([16, 1000, 151936, 151937] if not quick else [16, 1001]):
        shape = f"seqs=6 V={V}"

        def run(V=V, shape=shape):
            S = 6
            x = (torch.randn((S, V), generator=gen(41)) * 3).to(DEV)
            x[1, 5] = 100.0
            x[1, V - 1] = 100.0           # tie -> lowest index
            x[2] = float("-inf")          # all -inf -> 0
            x[3, min(9, V - 1)] = float("nan")
            x[3, V - 1] = float("nan")    # NaN wins, first NaN
            x[4] = 0.5                    # constant row -> 0
            out = torch.full((S + 1,), -7, dtype=torch.int32, device=DEV)
            K.launch("argmax", (S,), (512,), [P(out), P(x), I32(S), I32(V)])
            want = argmax_ref(x)
            got = out[:S].tolist()
            ok = got == want and int(out[S]) == -7
            R.add(kernel="argmax", shape=shape, status="PASS" if ok else "FAIL", err=0.0 if ok else None,
                  note=f"got {got} want {want}" + ("" if int(out[S]) == -7 else " guard written"))
        R.case("argmax", shape, run)


# ============================================================================ group: sample
def chi2_sf(x, df):
    """P(chi2_df >= x) = Q(df/2, x/2), regularized upper incomplete gamma (Numerical Recipes)."""
    a, xx = df / 2.0, x / 2.0
    if xx <= 0:
        return 1.0
    lg = math.lgamma(a)
    if xx < a + 1:
        ap, s, d = a, 1.0 / a, 1.0 / a
        for _ in range(10000):
            ap += 1
            d *= xx / ap
            s += d
            if abs(d) < abs(s) * 1e-15:
                break
        return max(0.0, 1.0 - s * math.exp(-xx + a * math.log(xx) - lg))
    b = xx + 1 - a
    c = 1e300
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = d if abs(d) > 1e-300 else 1e-300
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-xx + a * math.log(xx) - lg) * h


def sample_sets(row, T, k, p, slack=1e-6):
    """fp64 model of the sampling definition. Returns (probs over the final set, strict set, loose set)."""
    x = (row.float().cpu() / np.float32(T)).double()   # fp32 division like the kernel, then fp64
    V = x.numel()
    keep = torch.ones(V, dtype=torch.bool)
    if 0 < k < V:
        kth = torch.sort(x, descending=True).values[k - 1]
        keep &= x >= kth
    w = torch.exp(x - x.max()) * keep
    w = w / w.sum()
    strict, loose = keep.clone(), keep.clone()
    if 0 < p < 1:
        order = torch.argsort(x, descending=True, stable=True)
        xs = x[order]
        ws = w[order]
        # mass strictly above each token: cumulative mass of tokens with larger x
        cum_excl = torch.cumsum(ws, 0) - ws
        # ties: every token of a group of equal x gets the mass strictly above the group
        first = torch.searchsorted(-xs, -xs, right=False)
        above = torch.zeros(V, dtype=torch.float64)
        above[order] = cum_excl[first]
        strict = keep & (above < p - slack)
        loose = keep & (above < p + slack)
        keepp = keep & (above < p)
        w = w * keepp
        w = w / w.sum()
    return w, strict, loose


def g_sample(K, R, quick):
    def launch(logits, T, k, p, seeds, pos):
        S, V = logits.shape
        out = torch.full((S + 1,), -7, dtype=torch.int32, device=DEV)
        K.launch("sample", (S,), (512,),
                 [P(out), P(logits), P(T), P(k), P(p), P(seeds), P(pos), I32(S), I32(V)])
        assert int(out[S]) == -7, "guard element written"
        return out[:S]

    def vec(vals, dtype):
        return torch.tensor(vals, dtype=dtype, device=DEV)

    def full(S, v, dtype):
        return torch.full((S,), v, dtype=dtype, device=DEV)

    # ---- greedy (temperature 0) == argmax
    def greedy():
        S, V = 8, (151936 if not quick else 1000)
        x = (torch.randn((S, V), generator=gen(51)) * 4).to(DEV)
        got = launch(x, full(S, 0.0, torch.float32), full(S, 50, torch.int32), full(S, 0.9, torch.float32),
                     torch.arange(S, dtype=torch.int64, device=DEV), full(S, 3, torch.int32)).tolist()
        want = argmax_ref(x)
        R.add(kernel="sample(greedy)", shape=f"seqs={S} V={V} T=0", status="PASS" if got == want else "FAIL",
              err=0.0 if got == want else None, note=f"== argmax: {got == want}")
    R.case("sample(greedy)", "", greedy)

    # ---- determinism
    def determinism():
        S, V = 256, (151936 if not quick else 1000)
        x = (torch.randn((S, V), generator=gen(52)) * 2).to(DEV)
        T, k, p = full(S, 0.9, torch.float32), full(S, 40, torch.int32), full(S, 0.95, torch.float32)
        seeds = (torch.arange(S, dtype=torch.int64, device=DEV) * 7919 + 11)
        pos = full(S, 17, torch.int32)
        a = launch(x, T, k, p, seeds, pos)
        b = launch(x, T, k, p, seeds, pos)
        c = launch(x, T, k, p, seeds, pos + 1)
        ok = torch.equal(a, b)
        ndiff = int((a != c).sum())
        R.add(kernel="sample(determinism)", shape=f"seqs={S} V={V}", status="PASS" if ok and ndiff > 0 else "FAIL",
              note=f"same (seed,pos) -> same ids: {ok}; position+1 changed {ndiff}/{S} draws")
    R.case("sample(determinism)", "", determinism)

    # ---- top-k / top-p respected (never a token outside the allowed set)
    def respected(V, T, k, p, S, tag, seed):
        row = (torch.randn((V,), generator=gen(seed)) * 2.5)
        x = row[None, :].repeat(S, 1).to(DEV)
        got = launch(x, full(S, T, torch.float32), full(S, k, torch.int32), full(S, p, torch.float32),
                     torch.arange(S, dtype=torch.int64, device=DEV) + 1000 * seed, full(S, 5, torch.int32))
        _, strict, loose = sample_sets(row, T, k, p)
        g = got.cpu().long()
        inrange = bool(((g >= 0) & (g < V)).all())
        outside = int((~loose[g.clamp(0, V - 1)]).sum()) if inrange else S
        distinct = len(set(g.tolist()))
        ok = inrange and outside == 0 and (distinct > 1 or int(strict.sum()) <= 1)
        R.add(kernel=f"sample({tag})", shape=f"V={V} T={T} k={k} p={p} draws={S}", status="PASS" if ok else "FAIL",
              err=float(outside), note=f"{outside} draws outside the allowed set of {int(loose.sum())}; {distinct} distinct")
    Vr = 1000 if quick else 50000
    Sr = 512 if quick else 4096
    for (T, k, p, tag) in [(1.0, 5, 1.0, "top-k"), (0.8, 0, 0.6, "top-p"), (1.2, 50, 0.8, "top-k+top-p"),
                           (0.5, 1, 1.0, "top-k=1"), (2.0, 0, 0.05, "top-p tiny")]:
        R.case(f"sample({tag})", "", lambda T=T, k=k, p=p, tag=tag: respected(Vr, T, k, p, Sr, tag, 60 + k))

    # ---- chi-square goodness of fit
    def chi2_case(row, T, k, p, S, tag, vary="seed"):
        V = row.numel()
        x = row[None, :].repeat(S, 1).to(DEV)
        if vary == "seed":
            seeds = torch.arange(S, dtype=torch.int64, device=DEV) + 12345
            pos = full(S, 7, torch.int32)
        else:  # one request, consecutive positions
            seeds = full(S, 987654321987, torch.int64)
            pos = torch.arange(S, dtype=torch.int32, device=DEV)
        got = launch(x, full(S, T, torch.float32), full(S, k, torch.int32), full(S, p, torch.float32), seeds, pos)
        w, _, _ = sample_sets(row, T, k, p, slack=0)
        g = got.cpu().long()
        if not bool(((g >= 0) & (g < V)).all()):
            R.add(kernel=f"sample(chi2 {tag})", shape=f"V={V}", status="FAIL", note="id out of range")
            return
        counts = torch.bincount(g, minlength=V).double()
        support = w > 0
        outside = int(counts[~support].sum())
        exp = w * S
        # merge bins with expected count < 5 into one
        small = support & (exp < 5)
        obs_b = counts[support & ~small].tolist()
        exp_b = exp[support & ~small].tolist()
        if bool(small.any()):
            obs_b.append(float(counts[small].sum()))
            exp_b.append(float(exp[small].sum()))
        chi2 = sum((o - e) ** 2 / e for o, e in zip(obs_b, exp_b) if e > 0)
        df = max(1, len(obs_b) - 1)
        pval = chi2_sf(chi2, df)
        ok = outside == 0 and pval > 1e-3
        R.add(kernel=f"sample(chi2 {tag})", shape=f"V={V} T={T} k={k} p={p} draws={S} vary={vary}",
              status="PASS" if ok else "FAIL", err=float(outside),
              note=f"chi2={chi2:.2f} df={df} p-value={pval:.4f}; {outside} draws outside support of {int(support.sum())}")

    N = 2000 if quick else 20000
    r16 = torch.randn((16,), generator=gen(70)) * 1.5
    for (T, k, p, tag, vary) in [(1.0, 0, 1.0, "plain", "seed"), (0.7, 10, 0.9, "T+k+p", "seed"),
                                 (1.3, 0, 0.7, "top-p", "seed"), (1.0, 6, 1.0, "top-k", "position"),
                                 (0.9, 0, 1.0, "plain", "position")]:
        R.case(f"sample(chi2 {tag})", "", lambda T=T, k=k, p=p, tag=tag, vary=vary: chi2_case(r16, T, k, p, N, tag, vary))

    # large vocabulary: 16 likely tokens spread over the row (different warp segments), the rest ~0
    def big_vocab():
        V = 151936 if not quick else 4096
        S = 2000 if not quick else 300
        row = torch.full((V,), -40.0)
        idx = torch.linspace(3, V - 2, 16).long()
        row[idx] = torch.randn((16,), generator=gen(71)) * 1.2
        chi2_case(row, 1.0, 0, 0.95, S, "V=151936 sparse" if not quick else "sparse")
    R.case("sample(chi2 big vocab)", "", big_vocab)

    # padded / garbage rows must not hang, fault, or return an out-of-range id
    def garbage():
        S, V = 6, 1000
        x = (torch.randn((S, V), generator=gen(80))).to(DEV)
        x[0] = float("nan")
        x[1] = float("inf")
        x[2] = float("-inf")
        T = vec([1.0, 1.0, 1.0, float("nan"), -3.0, 1e-30], torch.float32)
        k = vec([0, 5, -4, 7, 0, 2_000_000_000], torch.int32)
        p = vec([0.5, float("nan"), 2.0, -1.0, 0.0, 1.0], torch.float32)
        got = launch(x, T, k, p, torch.arange(S, dtype=torch.int64, device=DEV), full(S, 1, torch.int32)).tolist()
        ok = all(0 <= g < V for g in got)
        R.add(kernel="sample(garbage rows)", shape=f"seqs={S} V={V}", status="PASS" if ok else "FAIL",
              note=f"ids {got} (NaN/inf logits, NaN/negative T, bad k/p)")
    R.case("sample(garbage rows)", "", garbage)


# ============================================================================ group: timing (info)
def g_timing(K, R, quick):
    if K.mock:
        R.add(kernel="timing", shape="", status="INFO", note="skipped in mock mode")
        return
    layers, layer = 36, 10

    def att(name, Hq, Hkv, spec, pt=16):
        c = build_attention_case(spec, Hq, Hkv, 128, pt, layers, layer, 0, 0, seed=5)
        out = nanfull((c["Tb"], Hq * 128))
        G = Hq // Hkv
        us = K.timed("attention_d128", (cdiv(c["Tb"], 32 // G) + c["Sb"], Hkv), (128,),
                     att_args(c, out, Hq, Hkv, 128, pt, layers, layer))
        R.add(kernel="attention_d128", shape=name, status="INFO", note=f"{us:.1f} us")

    R.case("timing", "attention", lambda: att("decode b=1 ctx=4096 (4B heads)", 32, 8, [(4095, 1)]))
    R.case("timing", "attention", lambda: att("decode b=64 ctx=1024 (4B heads)", 32, 8, [(1023, 1)] * 64))
    R.case("timing", "attention", lambda: att("prefill 2048 (4B heads)", 32, 8, [(0, 2048)]))

    def dec(name, Hq, Hkv, ctxs, pt=16, D=128, Z=None, window=0):
        """The split path (decode + combine) beside attention_dD on the same decode step."""
        c = build_decode_case(list(ctxs), [(i, x) for i, x in enumerate(ctxs)], Hq, Hkv, D, pt, layers, layer,
                              0, 0, seed=6)
        T = c["Tb"]
        S, MC = dec_splits(T, Hkv) if Z is None else Z, dec_max_chunks(Hkv)
        partial = nanfull((dec_partial_floats(T, MC, Hq, D),), torch.float32)
        out = nanfull((T, Hq * D))
        common = [P(c["qkv"]), P(c["pool"]), P(c["bt"]), P(c["seq_lens"]), P(c["qs"]), I32(c["Sb"]), I32(T),
                  I32(c["max_pages"]), I32((Hq + 2 * Hkv) * D), I32(Hq), I32(Hkv), I32(layer), I32(layers), I32(pt),
                  F32(D ** -0.5)]
        us_d = K.timed(f"attention_decode_d{D}", (T, Hkv, S), (128,),
                       [P(partial)] + common + [I32(DEC_MIN_CHUNK), I32(MC), I32(window)], smem=dec_smem(D))
        us_c = K.timed(f"attention_combine_d{D}", (T, Hq), (D,), [P(out), P(partial), I32(T), I32(Hq)])
        us_a = K.timed(f"attention_d{D}", (cdiv(T, 32 // (Hq // Hkv)) + c["Sb"], Hkv), (128,),
                       [P(out)] + common + [I32(window)], smem=att_smem(D))
        kv_bytes = sum(min(x, window) if window else x for x in ctxs) * Hkv * D * 2 * 2
        R.add(kernel=f"attention_decode_d{D}", shape=name, status="INFO",
              note=f"split {us_d:.1f} + combine {us_c:.1f} us (Z={S}, max_chunks {MC}{f', window {window}' if window else ''})"
                   f" vs attention_d{D} {us_a:.1f} us; "
                   f"KV {kv_bytes / 1e6:.2f} MB = {kv_bytes / 4.26e6:.1f} us at 4.26 TB/s")

    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=4096 (4B heads)", 32, 8, [4096]))
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=1000 (0.6B heads)", 16, 8, [1000]))
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=32768 (4B heads)", 32, 8, [32768]))
    R.case("timing", "attention_decode", lambda: dec("decode b=3 ctx=4096 (4B heads)", 32, 8, [4096] * 3))
    R.case("timing", "attention_decode", lambda: dec("decode b=64 ctx=1024 (4B heads)", 32, 8, [1024] * 64))
    R.case("timing", "attention_decode", lambda: dec("decode b=64 ctx=256 (4B heads)", 32, 8, [256] * 64))
    R.case("timing", "attention_decode", lambda: dec("decode b=64 ctx=256 (4B heads), Z=1", 32, 8, [256] * 64, Z=1))
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=256 (4B heads)", 32, 8, [256]))
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=4096 (Qwen2.5-0.5B heads)", 14, 2, [4096],
                                                     D=64))
    # head_dim 256 (Gemma 3 4B heads 8/4): a global layer and a local one (window 1024)
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=4096 (Gemma3-4B heads, D=256)", 8, 4, [4096], D=256))
    R.case("timing", "attention_decode", lambda: dec("decode b=1 ctx=32768 (Gemma3-4B heads, D=256, window 1024)", 8, 4,
                                                     [32768], D=256, window=1024))
    R.case("timing", "attention_decode", lambda: dec("decode b=64 ctx=1024 (Gemma3-4B heads, D=256)", 8, 4, [1024] * 64,
                                                     D=256))

    def norm(n, H):
        x = randn((n, H), 1)
        w = randn((H,), 2)
        out = nanfull((n, H))
        us = K.timed("rms_norm", (n,), (128,), [P(out), P(x), P(w), I32(n), I32(H), F32(EPS)])
        R.add(kernel="rms_norm", shape=f"n={n} H={H}", status="INFO", note=f"{us:.1f} us")
    R.case("timing", "rms_norm", lambda: norm(1, 2560))
    R.case("timing", "rms_norm", lambda: norm(2048, 2560))

    def rope(n):
        Hq, Hkv, D, pt = 32, 8, 128, 16
        qkv = randn((n, (Hq + 2 * Hkv) * D), 3)
        pool = nanfull((cdiv(n, pt) * pt * layers * 2 * Hkv * D,))
        w = randn((D,), 4)
        pos = torch.arange(n, dtype=torch.int32, device=DEV)
        us = K.timed("qk_norm_rope", (n, cdiv(Hq + 2 * Hkv, 8)), (256,),
                     [P(qkv), P(pool), P(w), P(w), P(w), P(pos), P(pos), I32(n), I32(Hq), I32(Hkv), I32(D),
                      I32(layer), I32(layers), I32(pt), F32(THETA), F32(EPS), I32(1), NULL(), F32(1.0), F32(0.0)])
        R.add(kernel="qk_norm_rope", shape=f"n={n} (4B heads)", status="INFO", note=f"{us:.1f} us")
    R.case("timing", "qk_norm_rope", lambda: rope(1))
    R.case("timing", "qk_norm_rope", lambda: rope(2048))

    def samp(S, T, k, p):
        V = 151936
        x = (torch.randn((S, V), generator=gen(9)) * 3).to(DEV)
        out = torch.zeros((S,), dtype=torch.int32, device=DEV)
        f = lambda v, dt: torch.full((S,), v, dtype=dt, device=DEV)
        us = K.timed("sample", (S,), (512,), [P(out), P(x), P(f(T, torch.float32)), P(f(k, torch.int32)),
                                               P(f(p, torch.float32)), P(torch.arange(S, dtype=torch.int64, device=DEV)),
                                               P(f(1, torch.int32)), I32(S), I32(V)], iters=10)
        R.add(kernel="sample", shape=f"seqs={S} V={V} T={T} k={k} p={p}", status="INFO", note=f"{us:.1f} us")
    R.case("timing", "sample", lambda: samp(1, 0.0, 0, 1.0))
    R.case("timing", "sample", lambda: samp(1, 0.8, 0, 1.0))
    R.case("timing", "sample", lambda: samp(1, 0.8, 50, 0.9))
    R.case("timing", "sample", lambda: samp(1, 0.8, 0, 0.9))
    R.case("timing", "sample", lambda: samp(64, 0.8, 50, 0.9))


GROUP_FNS = {"rowwise": g_rowwise, "kv_write": g_kv_write, "qk_norm_rope": g_qk_norm_rope,
             "attention": g_attention, "attention_decode": g_attention_decode, "argmax": g_argmax,
             "sample": g_sample, "timing": g_timing}


# ============================================================================ group: attention_prefill
# Tensor-core prefill attention (attention_prefill.cu): attention_dD's parameters and semantics,
# grid [ceil(tokens / (64 // G)) + seqs, Hkv], block 128 (the manifest's, --prefill-attention tc).
# The manifest launches it for steps with tokens > seqs only, but it is correct for any step, so
# the attention group's cases (decode rows, padding, G = 1..16, both head dims) run here too.
# Same reference and tolerance as attention_dD (P enters P.V as bf16 hi + lo, ~16 bits; see the
# kernel's header). Also: the difference to attention_dD on the same inputs, and the 8,192-token
# single-sequence prefill timing (TFLOP/s with causal FLOPs 4 * D * Hq * sum_i (i + 1)).
def prefill_tc_args(c, out, Hq, Hkv, D, pt, layers, layer, window=0):
    return att_args(c, out, Hq, Hkv, D, pt, layers, layer, window)


def g_attention_prefill(K, R, quick):
    layers, layer = 2, 1
    mixed = [(100, 37), (499, 1), (0, 300), (0, 1), (63, 1), (15, 17), (1000, 64), (31, 33)]
    cases = [
        # name, Hq, Hkv, D, page_tokens, spec, pad_tokens, pad_seqs, grid.x (0: the manifest's)
        ("qwen3-0.6B heads, page 16", 16, 8, 128, 16, mixed, 5, 2, 0),
        ("qwen3-4B heads, page 16", 32, 8, 128, 16, mixed, 3, 1, 0),
        ("qwen3-4B heads, page 64", 32, 8, 128, 64, mixed, 0, 0, 0),
        ("qwen2.5-0.5B heads (G=7, D=64), page 16", 14, 2, 64, 16, mixed, 4, 2, 0),
        ("G=1 D=128, page 16", 8, 8, 128, 16, [(0, 7), (200, 1), (64, 64), (0, 129)], 0, 0, 0),
        ("G=2 D=64, page 16", 4, 2, 64, 16, [(0, 100), (37, 27)], 1, 1, 0),
        ("G=16 D=64, page 16", 16, 1, 64, 16, [(5, 3), (300, 1), (0, 40)], 1, 0, 0),
        ("G=16 D=128, page 16", 16, 1, 128, 16, [(0, 70), (9, 9)], 0, 0, 0),
        ("prefill 2048 from empty (4B heads)", 32, 8, 128, 16, [(0, 2048)], 0, 0, 0),
        ("long prefill chunk over cache, page 64", 32, 8, 128, 64, [(1500, 700), (0, 513)], 0, 0, 0),
        ("grid.x = 1 (grid-stride loop)", 8, 2, 128, 16, [(40, 20), (0, 9), (7, 1)], 2, 1, 1),
        ("grid.x = 3, G=7", 14, 2, 64, 16, [(0, 90), (12, 4)], 0, 0, 3),
    ]
    # sliding windows (the last field; head_dim 64 / 128 only: no tensor-core prefill for 256):
    # windows whose edges skip key tiles (kt0), leave warps without a visible key in a tile, need
    # masking where no causal limit crosses the tile; window 1; a window longer than every context
    cases += [
        ("window 100, 4B heads, page 16", 32, 8, 128, 16, mixed, 3, 1, 0, 100),
        ("window 20, G=1 D=64 (64 tokens per tile)", 1, 1, 64, 16, [(170, 130), (3, 20), (0, 300)], 0, 0, 0, 20),
        ("window 130, Qwen2.5-0.5B heads G=7 D=64", 14, 2, 64, 16, [(300, 90), (5, 40)] + mixed, 3, 1, 0, 130),
        ("window 64 (one key tile), G=8 D=128", 8, 1, 128, 16, [(100, 40), (0, 65)], 0, 0, 0, 64),
        ("window 4096 (Mistral-like) over a 2048 prefill + chunk", 32, 8, 128, 16, [(0, 2048), (3000, 1500)], 0, 0, 0, 4096),
        ("window 1, G=4 D=128", 32, 8, 128, 16, mixed, 0, 0, 0, 1),
        ("window 8192 > every context, G=2 D=64", 4, 2, 64, 16, mixed, 1, 1, 0, 8192),
        ("window 40, grid.x = 1", 8, 2, 64, 16, [(60, 50), (0, 9)], 2, 1, 1, 40),
    ]
    if quick:
        cases = [("quick mixed", 4, 2, 64, 16, [(5, 3), (9, 1), (0, 70)], 2, 1, 0),
                 ("quick G=1", 2, 2, 128, 16, [(0, 5), (10, 1)], 0, 0, 0),
                 ("quick window 20", 4, 2, 64, 16, [(70, 60), (0, 3)], 0, 0, 0, 20)]
    for ci, (name, Hq, Hkv, D, pt, spec, pad_t, pad_s, gx, *rest) in enumerate(cases):
        window = rest[0] if rest else 0
        shape = (f"{name}: Hq={Hq} Hkv={Hkv} D={D} seqs={len(spec)}+{pad_s} tokens={sum(n for _, n in spec)}+{pad_t}"
                 + (f" window={window}" if window else ""))
        kname = f"attention_prefill_d{D}"

        def run(Hq=Hq, Hkv=Hkv, D=D, pt=pt, spec=spec, pad_t=pad_t, pad_s=pad_s, gx=gx, ci=ci, shape=shape, kname=kname,
                window=window):
            c = build_attention_case(spec, Hq, Hkv, D, pt, layers, layer, pad_t, pad_s, seed=531 + ci)
            G = Hq // Hkv
            grid = (gx or cdiv(c["Tb"], 64 // G) + c["Sb"], Hkv)

            def tc(w):
                o = nanfull((c["Tb"] + 1, Hq * D))  # + 1 guard row
                K.launch(kname, grid, (128,), prefill_tc_args(c, o, Hq, Hkv, D, pt, layers, layer, w))
                return o
            out = tc(window)
            simt = nanfull((c["Tb"], Hq * D))
            att_launch(K, c, simt, Hq, Hkv, D, pt, layers, layer, window)
            ref, tbf = attention_refs(c, Hq, Hkv, D, D ** -0.5, window)
            n = c["n_tok"]
            diff = float((out[:n].double() - simt[:n].double()).abs().max()) if n else 0.0
            close(R, kname, shape, out[:n].view(n, Hq, D), ref, tbf=tbf,
                  note=f"max |tc - attention_d{D}| = {diff:.3e}")
            check_rows_past(R, kname, shape, out, n, c["Tb"])
            window_extra_checks(R, K, kname, shape, out, c, Hq, Hkv, D, window, tc)
        R.case(kname, shape, run)

    if K.mock or quick:
        return

    def timing(name, Hq, Hkv, D, n, window=0):
        c = build_attention_case([(0, n)], Hq, Hkv, D, 16, layers, layer, 0, 0, seed=7)
        G = Hq // Hkv
        out = nanfull((c["Tb"], Hq * D))
        args = prefill_tc_args(c, out, Hq, Hkv, D, 16, layers, layer, window)
        flops = 4.0 * D * Hq * sum(min(i + 1, window) if window else i + 1 for i in range(n))
        us_tc = K.timed(f"attention_prefill_d{D}", (cdiv(n, 64 // G) + 1, Hkv), (128,), args, iters=10)
        us_simt = K.timed(f"attention_d{D}", (cdiv(n, 32 // G) + 1, Hkv), (128,), args, iters=3)
        R.add(kernel=f"attention_prefill_d{D}", shape=name, status="INFO",
              note=f"tc {us_tc / 1000:.3f} ms ({flops / us_tc / 1e6:.1f} TFLOP/s) vs attention_d{D} "
                   f"{us_simt / 1000:.3f} ms ({flops / us_simt / 1e6:.1f} TFLOP/s): {us_simt / us_tc:.1f}x")
    R.case("attention_prefill_d128", "timing", lambda: timing("prefill 8192 from empty (Qwen3-4B heads 32/8, D=128)", 32, 8, 128, 8192))
    R.case("attention_prefill_d128", "timing", lambda: timing("prefill 8192 from empty (Qwen3-0.6B heads 16/8, D=128)", 16, 8, 128, 8192))
    R.case("attention_prefill_d64", "timing", lambda: timing("prefill 8192 from empty (Qwen2.5-0.5B heads 14/2, D=64)", 14, 2, 64, 8192))
    R.case("attention_prefill_d128", "timing", lambda: timing("prefill 8192 from empty, window 1024 (Gemma3-27B heads 32/16, D=128)",
                                                              32, 16, 128, 8192, window=1024))

    def timing256(name, Hq, Hkv, n, window):  # head_dim 256 has only the SIMT attention_d256
        c = build_attention_case([(0, n)], Hq, Hkv, 256, 16, layers, layer, 0, 0, seed=8)
        out = nanfull((c["Tb"], Hq * 256))
        us = K.timed("attention_d256", (cdiv(n, 32 // (Hq // Hkv)) + 1, Hkv), (128,),
                     att_args(c, out, Hq, Hkv, 256, 16, layers, layer, window), iters=3, smem=ATT_SMEM_D256)
        R.add(kernel="attention_d256", shape=name, status="INFO", note=f"{us / 1000:.3f} ms")
    R.case("attention_d256", "timing", lambda: timing256("prefill 4096 from empty (Gemma3-4B heads 8/4)", 8, 4, 4096, 0))
    R.case("attention_d256", "timing", lambda: timing256("prefill 4096 from empty, window 1024 (Gemma3-4B heads 8/4)", 8, 4,
                                                         4096, 1024))


GROUP_FNS["attention_prefill"] = g_attention_prefill


# ============================================================================ mock kernels (CPU self-test)
def _flat(t):
    return t.view(-1)


def _m_embedding(grid, block, out, table, ids, n, H, V, scale):
    o = _flat(out)
    for t in range(n):
        i = int(ids[t])
        row = table.view(-1)[i * H:(i + 1) * H]
        if scale != 1.0:
            row = (row.float() * scale).to(BF)
        o[t * H:(t + 1) * H] = row if 0 <= i < V else 0


def _m_embedding_f32(grid, block, out, table, ids, n, H, V, scale):
    o = _flat(out)
    for t in range(n):
        i = int(ids[t])
        row = (table.view(-1)[i * H:(i + 1) * H].float() * scale).to(BF).float()
        o[t * H:(t + 1) * H] = row if 0 <= i < V else 0


def _m_rms_off(out, x, w, H, eps, off):
    h = x.float()
    r = torch.rsqrt(h.pow(2).sum() * (1.0 / H) + eps)
    out.copy_(((h * r) * (off + w.float())).to(BF))


def _m_rms_norm_off(grid, block, out, x, w, n, H, eps, off):
    for t in range(n):
        _m_rms_off(_flat(out)[t * H:(t + 1) * H], _flat(x)[t * H:(t + 1) * H], w, H, eps, off)


def _m_add_rms_norm_off(grid, block, out, res, x, w, n, H, eps, off):
    for t in range(n):
        r = _flat(res)[t * H:(t + 1) * H]
        if r.dtype == BF:
            r.copy_((r.float() + _flat(x)[t * H:(t + 1) * H].float()).to(BF))
        else:
            r.copy_(r + _flat(x)[t * H:(t + 1) * H].float())
        _m_rms_off(_flat(out)[t * H:(t + 1) * H], r, w, H, eps, off)


def _m_geglu_tanh(grid, block, out, gu, n, I):
    for t in range(n):
        g = _flat(gu)[t * 2 * I:t * 2 * I + I].float()
        u = _flat(gu)[t * 2 * I + I:(t + 1) * 2 * I].float()
        a = torch.nn.functional.gelu(g, approximate="tanh").to(BF).float()
        _flat(out)[t * I:(t + 1) * I] = (a * u).to(BF)


def _m_rms(out, x, w, H, eps):
    h = x.float()
    r = torch.rsqrt(h.pow(2).sum() * (1.0 / H) + eps)
    out.copy_((w.float() * (h * r).to(BF).float()).to(BF))


def _m_rms_norm(grid, block, out, x, w, n, H, eps):
    for t in range(n):
        _m_rms(_flat(out)[t * H:(t + 1) * H], _flat(x)[t * H:(t + 1) * H], w, H, eps)


def _m_add_rms_norm(grid, block, out, res, x, w, n, H, eps):
    for t in range(n):
        r = _flat(res)[t * H:(t + 1) * H]
        r.copy_((r.float() + _flat(x)[t * H:(t + 1) * H].float()).to(BF))
        _m_rms(_flat(out)[t * H:(t + 1) * H], r, w, H, eps)


def _m_swiglu(grid, block, out, gu, n, I):
    for t in range(n):
        g = _flat(gu)[t * 2 * I:t * 2 * I + I].float()
        u = _flat(gu)[t * 2 * I + I:(t + 1) * 2 * I].float()
        s = (g / (1 + torch.exp(-g))).to(BF).float()
        _flat(out)[t * I:(t + 1) * I] = (s * u).to(BF)


def _m_gather_last(grid, block, out, x, last, S, T, H):
    for s in range(S):
        i = int(last[s])
        _flat(out)[s * H:(s + 1) * H] = _flat(x)[i * H:(i + 1) * H] if 0 <= i < T else 0


def _m_kv_off(page, off, layer, kv, L, pt, Hkv, D):
    row = Hkv * D
    return page * pt * L * 2 * row + ((layer * 2 + kv) * pt + off) * row


def _m_kv_write(grid, block, pool, qkv, slots, n, Hq, Hkv, D, layer, L, pt):
    W = (Hq + 2 * Hkv) * D
    for t in range(n):
        s = int(slots[t])
        if s < 0:
            continue
        src = _flat(qkv)[t * W + Hq * D:(t + 1) * W]
        for kv in range(2):
            o = _m_kv_off(s // pt, s % pt, layer, kv, L, pt, Hkv, D)
            _flat(pool)[o:o + Hkv * D] = src[kv * Hkv * D:(kv + 1) * Hkv * D]


def _m_qk_norm_rope(grid, block, qkv, pool, qn, kn, bias, pos, slots, n, Hq, Hkv, D, layer, L, pt, theta, eps, flags,
                    inv_freq=None, cos_scale=1.0, off=0.0):
    W = (Hq + 2 * Hkv) * D
    half = D // 2
    i = torch.arange(half)
    e = (2 * i).float() / D
    inv = 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float64), e.double()).float()
    if inv_freq is not None:
        inv = inv_freq.float().cpu()
    for t in range(n):
        x = _flat(qkv)[t * W:(t + 1) * W].view(Hq + 2 * Hkv, D)
        xf = x.float()
        if flags & 2:
            xf = (xf + bias.view(Hq + 2 * Hkv, D).float()).to(BF).float()
        fr = float(pos[t]) * inv
        cs = (torch.cos(fr) * cos_scale).to(BF).float()
        sn = (torch.sin(fr) * cos_scale).to(BF).float()
        if flags & 8:
            cs, sn = cs.repeat_interleave(2), sn.repeat_interleave(2)
        else:
            cs = torch.cat((cs, cs))
            sn = torch.cat((sn, sn))
        y = xf.clone()
        qk = xf[:Hq + Hkv]
        if flags & 1:
            r = torch.rsqrt(qk.pow(2).sum(-1, keepdim=True) * (1.0 / D) + eps)
            wts = torch.cat((qn.float()[None].expand(Hq, D), kn.float()[None].expand(Hkv, D)))
            if flags & 4:
                qk = ((qk * r) * (off + wts)).to(BF).float()
            else:
                qk = (wts * (qk * r).to(BF).float()).to(BF).float()
        if flags & 8:
            rot = torch.stack((-qk[:, 1::2], qk[:, 0::2]), dim=-1).flatten(-2)
        else:
            rot = torch.cat((-qk[:, half:], qk[:, :half]), dim=-1)
        y[:Hq + Hkv] = ((qk * cs).to(BF).float() + (rot * sn).to(BF).float()).to(BF).float()
        x[:Hq] = y[:Hq].to(BF)
        s = int(slots[t])
        if s >= 0:
            for kv in range(2):
                o = _m_kv_off(s // pt, s % pt, layer, kv, L, pt, Hkv, D)
                _flat(pool)[o:o + Hkv * D] = y[Hq + kv * Hkv:Hq + (kv + 1) * Hkv].reshape(-1).to(BF)


def _m_attention(grid, block, out, q, pool, bt, seq_lens, qs, S, T, max_pages, q_stride, Hq, Hkv, layer, L, pt, scale, window,
                 D):
    G = Hq // Hkv
    for s in range(S):
        q0, q1, ctx = int(qs[s]), int(qs[s + 1]), int(seq_lens[s])
        n = q1 - q0
        if n <= 0:
            continue
        ks, vs = [], []
        for j in range(ctx):
            page = int(bt.view(-1)[s * max_pages + j // pt])
            ko = _m_kv_off(page, j % pt, layer, 0, L, pt, Hkv, D)
            vo = _m_kv_off(page, j % pt, layer, 1, L, pt, Hkv, D)
            ks.append(_flat(pool)[ko:ko + Hkv * D].view(Hkv, D).float())
            vs.append(_flat(pool)[vo:vo + Hkv * D].view(Hkv, D).float())
        k = torch.stack(ks).repeat_interleave(G, dim=1)
        v = torch.stack(vs).repeat_interleave(G, dim=1)
        for i in range(n):
            t = q0 + i
            qq = _flat(q)[t * q_stride:t * q_stride + Hq * D].view(Hq, D).float()
            lim = ctx - n + i + 1
            lo = max(0, lim - window) if window > 0 else 0
            sc = torch.einsum("hd,chd->hc", qq, k[lo:lim]) * scale
            p = torch.softmax(sc, -1)
            _flat(out)[t * Hq * D:(t + 1) * Hq * D] = torch.einsum("hc,chd->hd", p, v[lo:lim]).reshape(-1).to(BF)
    qend = int(qs[S])
    for t in range(qend, T):
        _flat(out)[t * Hq * D:(t + 1) * Hq * D] = 0


def _m_attention_decode(grid, block, partial, q, pool, bt, seq_lens, qs, S, T, max_pages, q_stride, Hq, Hkv,
                        layer, L, pt, scale, min_chunk, max_chunks, window, D):
    """attention_decode.cu's algorithm: per token, chunk and head, the record (o unnormalized, m in
    the log2 domain, l) and the header of chunks (the grid's z changes nothing)."""
    G = Hq // Hkv
    hdr = cdiv(T, 4) * 4
    kmax = dec_token_kmax(qs, seq_lens, S, T)
    pf = _flat(partial)
    row_of = {}
    qsl = [int(x) for x in qs.tolist()]
    for s in range(S):
        for t in range(qsl[s], qsl[s + 1]):
            row_of[t] = s
    for t in range(T):
        chunk, act = dec_chunking(kmax[t], max_chunks, min_chunk, window)
        klo = max(0, kmax[t] - window) if window > 0 else 0
        kb = klo // 32 * 32
        pf[t] = float(act)
        if act == 0:
            continue
        s = row_of[t]
        ks, vs = [], []
        for j in range(kmax[t]):
            page = int(bt.view(-1)[s * max_pages + j // pt])
            ks.append(_flat(pool)[_m_kv_off(page, j % pt, layer, 0, L, pt, Hkv, D):][:Hkv * D].view(Hkv, D).float())
            vs.append(_flat(pool)[_m_kv_off(page, j % pt, layer, 1, L, pt, Hkv, D):][:Hkv * D].view(Hkv, D).float())
        k = torch.stack(ks).repeat_interleave(G, dim=1)   # [keys, Hq, D]
        v = torch.stack(vs).repeat_interleave(G, dim=1)
        qq = _flat(q)[t * q_stride:t * q_stride + Hq * D].view(Hq, D).float()
        for sp in range(act):
            k0, k1 = max(klo, kb + sp * chunk), min(kb + sp * chunk + chunk, kmax[t])
            sc = torch.einsum("hd,chd->hc", qq, k[k0:k1]) * (scale * 1.4426950408889634)
            m = sc.max(-1).values
            p = torch.exp2(sc - m[:, None])
            o = torch.einsum("hc,chd->hd", p, v[k0:k1])
            for h in range(Hq):
                r = hdr + ((sp * T + t) * Hq + h) * (D + 4)
                pf[r:r + D] = o[h]
                pf[r + D] = m[h]
                pf[r + D + 1] = p[h].sum()


def _m_attention_combine(grid, block, out, partial, T, Hq, D):
    hdr = cdiv(T, 4) * 4
    pf = _flat(partial)
    for t in range(T):
        n = int(pf[t])
        for h in range(Hq):
            dst = _flat(out)[(t * Hq + h) * D:(t * Hq + h + 1) * D]
            if n <= 0:
                dst[:] = 0
                continue
            recs = [hdr + ((sp * T + t) * Hq + h) * (D + 4) for sp in range(n)]
            ms = torch.stack([pf[r + D] for r in recs])
            w = torch.exp2(ms - ms.max())
            lsum = sum(float(pf[r + D + 1]) * float(w[i]) for i, r in enumerate(recs))
            acc = sum(pf[r:r + D] * w[i] for i, r in enumerate(recs))
            dst[:] = (acc * (1.0 / lsum)).to(BF)


def _m_argmax(grid, block, out, x, S, V):
    for s, a in enumerate(argmax_ref(x.view(-1)[:S * V].view(S, V))):
        out[s] = a


_SAMPLE_CACHE = {}


def _m_sample(grid, block, out, x, T, k, p, seeds, pos, S, V):
    xs = x.view(-1)[:S * V].view(S, V)
    am = argmax_ref(xs)
    for s in range(S):
        t = float(T[s])
        if not (t >= 1e-5):
            out[s] = am[s]
            continue
        if not bool(torch.isfinite(xs[s]).all()):
            out[s] = am[s]
            continue
        kk, pp = int(k[s]), float(p[s])
        pp = pp if 0 < pp < 1 else 1.0
        key = (t, kk, pp, hash(xs[s].numpy().tobytes()))
        if key not in _SAMPLE_CACHE:
            _SAMPLE_CACHE[key] = sample_sets(xs[s], t, kk, pp, slack=0)[0]
        w = _SAMPLE_CACHE[key]
        if not bool(torch.isfinite(w).all()) or float(w.sum()) <= 0:
            out[s] = am[s]
            continue
        g = torch.Generator().manual_seed((int(seeds[s]) * 1000003 + int(pos[s])) % (2 ** 63))
        out[s] = int(torch.multinomial(w.float(), 1, generator=g))


MOCKS = {
    "embedding": _m_embedding, "rms_norm": _m_rms_norm, "add_rms_norm": _m_add_rms_norm, "swiglu": _m_swiglu,
    "gather_last": _m_gather_last, "kv_write": _m_kv_write, "qk_norm_rope": _m_qk_norm_rope,
    "attention_d128": lambda *a: _m_attention(*a, D=128), "attention_d64": lambda *a: _m_attention(*a, D=64),
    "argmax": _m_argmax, "sample": _m_sample,
    "attention_decode_d128": lambda *a: _m_attention_decode(*a, D=128),
    "attention_decode_d64": lambda *a: _m_attention_decode(*a, D=64),
    "attention_combine_d128": lambda *a: _m_attention_combine(*a, D=128),
    "attention_combine_d64": lambda *a: _m_attention_combine(*a, D=64),
    "attention_d256": lambda *a: _m_attention(*a, D=256),
    "attention_decode_d256": lambda *a: _m_attention_decode(*a, D=256),
    "attention_combine_d256": lambda *a: _m_attention_combine(*a, D=256),
    "embedding_f32": _m_embedding_f32, "rms_norm_off": _m_rms_norm_off, "add_rms_norm_off": _m_add_rms_norm_off,
    "rms_norm_f32_off": _m_rms_norm_off, "add_rms_norm_f32_off": _m_add_rms_norm_off, "geglu_tanh": _m_geglu_tanh,
}


# attention_prefill_dD: attention_dD's semantics (the grid changes nothing)
MOCKS.update({"attention_prefill_d128": lambda *a: _m_attention(*a, D=128),
              "attention_prefill_d64": lambda *a: _m_attention(*a, D=64)})


# ============================================================================ child main
def main_child(opts):
    global torch, np, DEV, BF
    import numpy
    import torch as _torch
    torch, np = _torch, numpy
    BF = torch.bfloat16
    R = Results(opts["json"])
    group = opts["child"]
    try:
        if opts["mock"]:
            DEV = "cpu"
            torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        else:
            DEV = "cuda"
            import cupy
            assert torch.cuda.is_available(), "torch sees no GPU"
            name = torch.cuda.get_device_name(0)
            print(f"  torch {torch.__version__}, cupy {cupy.__version__}, numpy {np.__version__}, GPU {name}", flush=True)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        K = Kernels(opts["dir"], opts["mock"])
        GROUP_FNS[group](K, R, opts["quick"])
    except Exception as e:
        traceback.print_exc()
        R.add(kernel=group, shape="(setup)", status="FAIL", note=f"{type(e).__name__}: {e}"[:200])
    if opts["json"]:
        with open(opts["json"], "w") as fh:
            json.dump(R.rows, fh)
    return 0


if __name__ == "__main__":
    o = parse_args(sys.argv[1:])
    if o["child"]:
        sys.exit(main_child(o))
    sys.exit(main_parent(o))
