"""Helpers of verify_with_kern.py: single-op manifests, `kern check` / `kern run`, results table.

Standard library only at import time (the `--check-only` mode runs where there is no torch and
no numpy); numpy and torch are imported by KernRunner when a case actually runs on the GPU.

A SingleOp is one manifest (schema 4.1) with one module (the cubin, copied next to model.json
with its sha256), one op whose parameters are exactly the kernel's (every launch argument is
`{"param": i}`), one launch (block / grid / shared as packs/kernels/KERNELS.md states them, as
expressions over the vars) and a program of one call that binds buffers, vars and constants.

Buffer roles (see docs/manifest.md):
  input   the test fills it (`--input BUF=file.npy`); kernel parameters that the kernel updates in
          place (`inout`: add_rms_norm's residual, qk_norm_rope's qkv, the KV pool) are also
          input buffers, and are read back with `--output`.
  output  the test reads it (`--output BUF=file.npy`). Outputs are POISONED before the run:
          KernRunner fills every output buffer the case does not fill itself with NaN (floats)
          or -7 (integers) through `--input` (`kern run` fills any buffer it is given, whatever
          its role, and zero-fills the rest), and output buffers are declared with guard rows
          past what the kernel may write (`"tokens + 2"` rows, ...). "Every element written" and
          "nothing written past the end" checks then see NaN / -7 where the kernel did not write.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

SCHEMA_VERSION = "4.1"

INT_DTYPES = {"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool"}
FLOAT_DTYPES = {"bf16", "f16", "f32", "f64"}


# ============================================================================ expressions
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


def eval_expr(e, env):
    """Evaluate a manifest expression (int or string over vars) like kern does: integer
    arithmetic, / and % floor, ceil(a/b) and cdiv(a, b) ceiling division, min, max."""
    if isinstance(e, int):
        return e
    toks = []
    for num, name, ch in _TOKEN.findall(str(e)):
        if num:
            toks.append(("n", int(num)))
        elif name:
            toks.append(("id", name))
        elif ch.strip():
            toks.append(("op", ch))
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else ("end", None)

    def take(kind=None, val=None):
        t = peek()
        if (kind and t[0] != kind) or (val is not None and t[1] != val):
            raise ValueError(f"expression {e!r}: unexpected {t[1]!r}")
        pos[0] += 1
        return t

    def expr():
        v = term()
        while peek() in (("op", "+"), ("op", "-")):
            op = take()[1]
            r = term()
            v = v + r if op == "+" else v - r
        return v

    def term(ceil_div=False):
        v = unary()
        while peek() in (("op", "*"), ("op", "/"), ("op", "%")):
            op = take()[1]
            r = unary()
            if op == "*":
                v = v * r
            elif op == "/":
                v = -((-v) // r) if ceil_div else v // r
            else:
                v = v % r
        return v

    def unary():
        if peek() == ("op", "-"):
            take()
            return -unary()
        return atom()

    def atom():
        t = take()
        if t[0] == "n":
            return t[1]
        if t == ("op", "("):
            v = expr()
            take("op", ")")
            return v
        if t[0] == "id":
            if peek() == ("op", "("):
                take()
                if t[1] == "ceil":
                    v = term(ceil_div=True)
                    take("op", ")")
                    return v
                args = [expr()]
                while peek() == ("op", ","):
                    take()
                    args.append(expr())
                take("op", ")")
                if t[1] == "cdiv":
                    return -((-args[0]) // args[1])
                if t[1] == "min":
                    return min(args)
                if t[1] == "max":
                    return max(args)
                raise ValueError(f"expression {e!r}: unknown function {t[1]}")
            if t[1] not in env:
                raise ValueError(f"expression {e!r}: unknown var {t[1]}")
            return env[t[1]]
        raise ValueError(f"expression {e!r}: unexpected {t[1]!r}")

    v = expr()
    if pos[0] != len(toks):
        raise ValueError(f"expression {e!r}: trailing {peek()[1]!r}")
    return v


# ============================================================================ single-op manifest
class SingleOp:
    """One kernel entry as a complete manifest.

    sig: the kernel's parameters in order, as (name, manifest type) pairs, e.g.
         [("out", "out buffer<bf16>"), ("x", "in buffer<bf16>"), ("n", "i32"), ("eps", "f32")]
    """

    def __init__(self, model, stem, entry, sig, vars, grid, block, shared=0):
        self.model = model
        self.stem = stem
        self.entry = entry
        self.sig = list(sig)
        self.vars = dict(vars)           # name -> max (the case's size: kern runs at the max)
        self.grid = list(grid)
        self.block = list(block)
        self.shared = shared
        self.buffers = {}                # name -> {"dtype", "shape", "role"}; declaration order kept
        self.binds = {}                  # kernel param name -> call binding
        self.dir = None                  # where model.json was written

    def buf(self, name, dtype, shape, role):
        assert role in ("input", "output"), role
        self.buffers[name] = {"dtype": dtype, "shape": list(shape), "role": role}
        return self

    def bind(self, **kw):
        for k, v in kw.items():
            if k not in [n for n, _ in self.sig]:
                raise KeyError(f"{self.entry}: no kernel parameter {k}")
            self.binds[k] = v
        return self

    def env(self):
        return dict(self.vars)

    def shape(self, name):
        return [eval_expr(d, self.env()) for d in self.buffers[name]["shape"]]

    def numel(self, name):
        n = 1
        for d in self.shape(name):
            n *= d
        return n

    def to_json(self, sha256):
        missing = [n for n, _ in self.sig if n not in self.binds]
        if missing:
            raise ValueError(f"{self.entry}: parameters not bound: {missing}")
        types = [t for _, t in self.sig]
        launch = {
            "label": self.entry,
            "module": self.stem,
            "entry": self.entry,
            "params": types,
            "block": self.block,
            "grid": self.grid,
        }
        if self.shared:
            launch["shared"] = self.shared
        launch["args"] = [{"param": i} for i in range(len(types))]
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "vars": {k: {"max": int(v)} for k, v in self.vars.items()},
            "buffers": self.buffers,
            "modules": {self.stem: {"source": f"{self.stem}.sm_90a.cubin", "sha256": sha256}},
            "ops": {self.entry: {"params": types, "impl": {"launches": [launch]}}},
            "program": {"calls": [{"label": self.entry, "op": self.entry,
                                   "args": [self.binds[n] for n, _ in self.sig]}]},
        }

    def write(self, directory, cubin_dir):
        """Write model.json and a copy of the cubin into `directory`; returns the manifest path."""
        os.makedirs(directory, exist_ok=True)
        src = os.path.join(cubin_dir, f"{self.stem}.sm_90a.cubin")
        if not os.path.exists(src):
            raise FileNotFoundError(f"{src} is missing (run packs/kernels/build.sh)")
        dst = os.path.join(directory, f"{self.stem}.sm_90a.cubin")
        shutil.copyfile(src, dst)
        with open(dst, "rb") as fh:
            sha = hashlib.sha256(fh.read()).hexdigest()
        path = os.path.join(directory, "model.json")
        with open(path, "w") as fh:
            json.dump(self.to_json(sha), fh, indent=1)
            fh.write("\n")
        self.dir = directory
        return path


# ============================================================================ kern processes
class KernError(Exception):
    def __init__(self, what, cmd, rc, stderr):
        super().__init__(f"{what} failed (exit {rc})")
        self.what, self.cmd, self.rc, self.stderr = what, cmd, rc, stderr


def kern_check(kern, manifest, timeout=120):
    """Runs `kern check`; returns (ok, summary, warnings, text)."""
    p = subprocess.run([kern, "check", manifest], capture_output=True, text=True, timeout=timeout)
    text = (p.stdout + p.stderr).strip()
    warnings = [ln.strip() for ln in text.splitlines() if "warning" in ln.lower()]
    first = text.splitlines()[0] if text else ""
    return p.returncode == 0, first, warnings, text


class KernRunner:
    """Runs single-op manifests with `kern run` and moves tensors in and out as .npy files."""

    def __init__(self, kern, cubin_dir, timeout, torch, np, dev):
        self.kern = kern
        self.cubin_dir = cubin_dir
        self.timeout = timeout
        self.torch, self.np, self.dev = torch, np, dev
        self.runs = 0
        self.wall = 0.0
        self.last_gpu_ms = None

    def _to_numpy(self, t, dtype, name):
        np, torch = self.np, self.torch
        if isinstance(t, np.ndarray):
            a = t
        else:
            if t.dtype == torch.bfloat16:
                t = t.float()  # exact: every bf16 is a float32
            a = t.detach().cpu().contiguous().numpy()
        if dtype in ("bf16", "f16", "f32", "f64"):
            a = a.astype(np.float32 if dtype != "f64" else np.float64)
        elif dtype == "u64":
            a = a.astype(np.uint64)
        elif dtype == "i64":
            a = a.astype(np.int64)
        elif dtype in ("i32", "u32", "i16", "u16", "i8", "u8"):
            a = a.astype(np.int64 if dtype == "u32" else np.int32)
        else:
            raise TypeError(f"{name}: dtype {dtype} not handled")
        return np.ascontiguousarray(a)

    def run(self, op, inputs, outputs, tag="run", poison=True):
        """inputs: buffer -> tensor/ndarray; outputs: buffer names. Output buffers the case does not
        fill are poisoned (NaN / -7). Returns buffer -> torch tensor on the reference device
        (bf16 buffers as bfloat16, f32 as float32, integers as int32/int64)."""
        np, torch = self.np, self.torch
        assert op.dir, "write the manifest first"
        args = [self.kern, "run", os.path.join(op.dir, "model.json"), "--sync-each"]
        feed = dict(inputs)
        if poison:
            for name in outputs:
                if name not in feed:
                    dt = op.buffers[name]["dtype"]
                    n = op.numel(name)
                    feed[name] = np.full((n,), np.nan, dtype=np.float32) if dt in FLOAT_DTYPES else \
                        np.full((n,), -7, dtype=np.int32)
        for name, t in feed.items():
            dt = op.buffers[name]["dtype"]
            a = self._to_numpy(t, dt, name)
            if a.size != op.numel(name):
                raise ValueError(f"input {name}: {a.size} elements, the buffer has {op.numel(name)} "
                                 f"(shape {op.shape(name)})")
            path = os.path.join(op.dir, f"in_{name}.npy")
            np.save(path, a)
            args += ["--input", f"{name}={path}"]
        outpaths = {}
        for name in outputs:
            outpaths[name] = os.path.join(op.dir, f"out_{tag}_{name}.npy")
            args += ["--output", f"{name}={outpaths[name]}"]
        t0 = time.time()
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise KernError("kern run", args, "timeout", err + f"\n(killed after {self.timeout} s)")
        finally:
            self.wall += time.time() - t0
            self.runs += 1
        if p.returncode != 0:
            raise KernError("kern run", args, p.returncode, p.stderr + p.stdout)
        m = re.search(r"GPU time ([0-9.]+) ms", p.stderr)
        self.last_gpu_ms = float(m.group(1)) if m else None
        res = {}
        for name, path in outpaths.items():
            a = np.load(path)
            t = torch.from_numpy(np.ascontiguousarray(a))
            dt = op.buffers[name]["dtype"]
            if dt == "bf16":
                t = t.to(torch.bfloat16)  # exact: kern wrote the bf16 values as float32
            t = t.reshape(op.shape(name)).to(self.dev)
            res[name] = t
        return res


# ============================================================================ results
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


class Results:
    def __init__(self):
        self.rows = []

    def add(self, **kw):
        kw.setdefault("status", "?")
        self.rows.append(kw)
        print(f"  [{kw.get('status')}] {kw.get('kernel')} | {kw.get('shape', '')}: err={fmt_num(kw.get('err'))} "
              f"torch_err={fmt_num(kw.get('terr'))} tol={fmt_num(kw.get('tol'))} {kw.get('note', '')}",
              flush=True)

    def count(self, status):
        return sum(1 for r in self.rows if r.get("status") == status)


def print_table(rows, heads=("kernel", "case", "max_abs_err", "torch_bf16_err", "tol", "status", "note"),
                keys=("kernel", "shape", "err", "terr", "tol", "status", "note"), widths_max=(30, 92, 11, 14, 11, 6, 100)):
    cells = [[fmt_num(r.get(k)) if k in ("err", "terr", "tol") else str(r.get(k, "") or "") for k in keys]
             for r in rows]
    widths = [min(mx, max([len(h)] + [len(c[i]) for c in cells])) for i, (h, mx) in enumerate(zip(heads, widths_max))]
    line = "  ".join(h.ljust(w) for h, w in zip(heads, widths))
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(v[:w].ljust(w) if i < len(c) - 1 else v[:w] for i, (v, w) in enumerate(zip(c, widths))))
    sys.stdout.flush()
