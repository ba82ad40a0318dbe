#!/usr/bin/env python3
"""Variant manifests of a Qwen pack manifest for `kern test` (scripts/gpu/difftest.sh).

    python3 scripts/gpu/difftest_variants.py MODEL_DIR [--kernels build/packs]
        [--split-layer 5] [--bad-layer 7] [--bad-eps 1.0] [--eps-layer 7 [18 …]] [--eps 1e-2 1e-3]

Reads MODEL_DIR/model.json (written by `kern pack`) and writes next to it, so module paths and
the default weights stay the same:

  model.self.json      the manifest unchanged (case a: a manifest against itself)
  model.split.json     layer S's fused residual add + RMSNorm (`lS.input_norm`, op add_rms_norm)
                       done by two kernels: `lS.residual_add` (new op residual_add, kernel
                       elementwise.cu:add_inplace) then `lS.input_norm` (op rms_norm) (case b)
  model.bad-eps.json   layer L's input norm (`lL.input_norm`) through a copy of add_rms_norm
                       whose epsilon is --bad-eps instead of the config's (case c: kern test must
                       stop at exactly that call)
  model.gemm.json      the decoder's four projections (qkv_proj, o_proj, gate_up_proj,
                       down_proj) on the general mma.sync GEMM `gemm_bf16` (gemm_bf16.cu) for
                       every M, instead of the GEMV / skinny / wgmma launches chosen by M (case d)
  model.l<L>.eps<E>.json  for each --eps-layer L (default 7) and --eps E (default 1e-2 and 1e-3;
                       e.g. model.l7.eps1e-2.json, model.l7.eps1e-3.json): layer L's post-attention norm
                       (`lL.post_attention_norm`, op add_rms_norm) through a copy of the op
                       (`add_rms_norm_eps1em2`, …) whose epsilon is E instead of the config's —
                       within a few ulps per element, but every row shrunk alike: the bias the
                       statistics of `kern test` must name (issue 28)

and copies the cubins the variants add (elementwise, gemm_bf16) from --kernels into MODEL_DIR.
Standard library only. Prints one line per file; exits 1 with the reason when the manifest is
not the pack's (a call or op it edits is missing).
"""
import argparse
import copy
import hashlib
import json
import pathlib
import shutil
import sys


def die(msg):
    print(f"difftest_variants.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def add_module(m, model_dir, kernels, stem):
    src = kernels / f"{stem}.sm_90a.cubin"
    if not src.exists():
        die(f"{src} is missing: build the pack's kernels (bash packs/kernels/build.sh) or pass --kernels")
    dst = model_dir / src.name
    if src.resolve() != dst.resolve():
        shutil.copyfile(src, dst)
    m["modules"][stem] = {"source": src.name, "sha256": hashlib.sha256(dst.read_bytes()).hexdigest()}


def call_index(m, label):
    for i, c in enumerate(m["program"]["calls"]):
        if c["label"] == label:
            return i
    die(f"no call `{label}` in program.calls: not a manifest written by `kern pack` for the Qwen pack")


def const(arg, key):
    if not isinstance(arg, dict) or key not in arg:
        die(f"expected a {key} constant, found {arg!r}")
    return arg[key]


def split(base, model_dir, kernels, layer):
    m = copy.deepcopy(base)
    i = call_index(m, f"l{layer}.input_norm")
    call = m["program"]["calls"][i]
    if call["op"] != "add_rms_norm":
        die(f"call l{layer}.input_norm runs op {call['op']}, expected add_rms_norm")
    h, x, mlp, w, n = call["args"]
    hidden = const(m["ops"]["rms_norm"]["impl"]["launches"][0]["args"][4], "i32")
    add_module(m, model_dir, kernels, "elementwise")
    m["ops"]["residual_add"] = {
        "params": ["inout buffer<bf16>", "in buffer<bf16>", "i32"],
        "impl": {"launches": [{
            "module": "elementwise", "entry": "add_inplace",
            "params": ["inout buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
            "block": [256], "grid": ["tokens"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"i32": hidden}]}]},
    }
    m["program"]["calls"][i:i + 1] = [
        {"label": f"l{layer}.residual_add", "op": "residual_add", "args": [x, mlp, n]},
        {"label": f"l{layer}.input_norm", "op": "rms_norm", "args": [h, x, w, n]},
    ]
    return m


def bad_eps(base, layer, eps):
    m = copy.deepcopy(base)
    i = call_index(m, f"l{layer}.input_norm")
    call = m["program"]["calls"][i]
    if call["op"] != "add_rms_norm":
        die(f"call l{layer}.input_norm runs op {call['op']}, expected add_rms_norm")
    op = copy.deepcopy(m["ops"]["add_rms_norm"])
    good = const(op["impl"]["launches"][0]["args"][6], "f32")
    op["impl"]["launches"][0]["args"][6] = {"f32": eps}
    m["ops"]["add_rms_norm_bad_eps"] = op
    call["op"] = "add_rms_norm_bad_eps"
    return m, good


def eps_variant(base, layer, eps):
    """Layer `layer`'s post-attention add + RMSNorm with epsilon `eps`."""
    m = copy.deepcopy(base)
    label = f"l{layer}.post_attention_norm"
    call = m["program"]["calls"][call_index(m, label)]
    if call["op"] != "add_rms_norm":
        die(f"call {label} runs op {call['op']}, expected add_rms_norm (pack with --residual bf16 and --decode-fusion off)")
    op = copy.deepcopy(m["ops"]["add_rms_norm"])
    good = const(op["impl"]["launches"][0]["args"][6], "f32")
    op["impl"]["launches"][0]["args"][6] = {"f32": eps}
    name = "add_rms_norm_eps" + eps_tag(eps).replace("-", "m").replace(".", "p")
    m["ops"][name] = op
    call["op"] = name
    return m, good, name


def eps_tag(eps):
    """1e-2 for 0.01: the file name's spelling of an epsilon."""
    mantissa, exp = f"{eps:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exp)}"


def gemm(base, model_dir, kernels):
    m = copy.deepcopy(base)
    add_module(m, model_dir, kernels, "gemm_bf16")
    for name in ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]:
        if name not in m["ops"]:
            die(f"no op `{name}` in ops")
        first = m["ops"][name]["impl"]["launches"][0]
        n = const(first["args"][5], "i32")
        m["ops"][name]["impl"]["launches"] = [{
            "module": "gemm_bf16", "entry": "gemm_bf16",
            "params": first["params"],
            "block": [256], "grid": ["ceil(tokens/128)", f"ceil({n}/128)"], "shared": 98304,
            "args": first["args"],
        }]
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=pathlib.Path)
    ap.add_argument("--kernels", type=pathlib.Path, default=pathlib.Path("build/packs"))
    ap.add_argument("--split-layer", type=int, default=5)
    ap.add_argument("--bad-layer", type=int, default=7)
    ap.add_argument("--bad-eps", type=float, default=1.0)
    ap.add_argument("--eps-layer", type=int, nargs="+", default=[7])
    ap.add_argument("--eps", type=float, nargs="*", default=[1e-2, 1e-3])
    a = ap.parse_args()
    src = a.model_dir / "model.json"
    if not src.exists():
        die(f"{src} does not exist: run `kern pack` first")
    base = json.loads(src.read_text())
    if "program" not in base or "ops" not in base:
        die(f"{src}: no program / ops")

    def write(name, m):
        p = a.model_dir / name
        p.write_text(json.dumps(m, indent=2) + "\n")
        return p

    print(f"{write('model.self.json', base)}: the pack's manifest, unchanged")
    print(f"{write('model.split.json', split(base, a.model_dir, a.kernels, a.split_layer))}: "
          f"l{a.split_layer}.input_norm split into residual_add + rms_norm")
    m, good = bad_eps(base, a.bad_layer, a.bad_eps)
    print(f"{write('model.bad-eps.json', m)}: l{a.bad_layer}.input_norm with epsilon {a.bad_eps} (the model's is {good})")
    print(f"{write('model.gemm.json', gemm(base, a.model_dir, a.kernels))}: qkv/o/gate_up/down projections on gemm_bf16 for every M")
    for layer in a.eps_layer:
        for eps in a.eps:
            m, good, name = eps_variant(base, layer, eps)
            print(f"{write(f'model.l{layer}.eps{eps_tag(eps)}.json', m)}: l{layer}.post_attention_norm with epsilon {eps} (op {name}; the model's is {good})")


if __name__ == "__main__":
    main()
