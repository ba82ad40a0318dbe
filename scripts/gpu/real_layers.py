#!/usr/bin/env python3
"""Where kern's error on the real model comes from, layer by layer (issue 14's open parity).

real_model.py found kern's last-position logits, at a few decode steps of two of its eight
prompts, above the rule (1.5 x bf16's error against fp32 + 0.01), while kern's error over all
steps is below transformers-bf16's. This script localizes it on prefill: for each chosen prompt
and each decoder layer L it runs kern's own manifest cut right after call `l{L+1}.input_norm`
(or, in the fused decode program `kern pack --decode-fusion on` writes, `l{L}.down_proj_qkv`: layer L's
residual add, its next norm and QKV) (so the buffers hold layer L's attention output `o`, MLP
output `mlp` and the residual stream `x` after the layer) through `kern run`, and compares each with transformers' fp32 (ref32) and
bf16 values of the same tensors (forward hooks on `self_attn` and `mlp`, and
`output_hidden_states`):

    e_kern = max |kern - ref32|,  e_bf16 = max |bf16 - ref32|,  ratio = e_kern / e_bf16

over the prompt's tokens. A layer where kern's ratio jumps names the op to look at; a ratio
near 1 everywhere means kern computes like transformers' bf16 and the per-step logits rule is
what is noisy. The last layer's residual is not compared (kern fuses it into the final norm).

Run on the GPU machine after scripts/gpu/real_model.sh has set up the wheels and the GGUF:

    python3 scripts/gpu/real_layers.py --gguf /tmp/qwen2.5-coder-0.5b-q4km.gguf
        [--kern .carry/kern] [--kernels build/packs] [--prompts 3,6,0] [--work DIR]

Prompts are real_model.py's (0-3 chats, 4-7 code); the default takes the two that failed
(3: the Chinese chat, 6: the numpy completion) and one that passed. Prints one table per prompt
(layer, then e_kern / e_bf16 / ratio for o, mlp and x) and the worst layers last; with $OUT
set writes $OUT/real_layers.json. Exit 0 unless something could not run (it judges nothing).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402
import real_model  # noqa: E402
from parity import log  # noqa: E402

TENSORS = ("o", "mlp", "x")


def cut_manifest(model_json, layer, out):
    """The manifest with its program cut after `l{layer+1}.input_norm` (the fused decode
    program: after `l{layer}.down_proj_qkv`): o, mlp and x then hold layer `layer`'s attention
    output, MLP output and residual stream."""
    m = json.load(open(model_json))
    calls = m["program"]["calls"]
    labels = (f"l{layer + 1}.input_norm", f"l{layer}.down_proj_qkv")
    idx = next((i for i, c in enumerate(calls) if c.get("label") in labels), None)
    if idx is None:
        raise ValueError(f"{model_json}: no call `{labels[0]}` or `{labels[1]}`")
    m["program"]["calls"] = calls[: idx + 1]
    m.pop("programs", None)
    m.pop("speculative", None)
    with open(out, "w") as f:
        json.dump(m, f)


def hf_layers(model, ids, device):
    """Per layer: (attention output, MLP output, residual after the layer) as float64 [T, H]."""
    import torch
    caught = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def attn_hook(_m, _inp, out, i=i):
            caught[("o", i)] = (out[0] if isinstance(out, tuple) else out)[0].double().cpu()
        def mlp_hook(_m, _inp, out, i=i):
            caught[("mlp", i)] = out[0].double().cpu()
        hooks.append(layer.self_attn.register_forward_hook(attn_hook))
        hooks.append(layer.mlp.register_forward_hook(mlp_hook))
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids], device=device), output_hidden_states=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    n = len(model.model.layers)
    # hidden_states[l + 1] is the residual after layer l (the last one is after the final norm).
    res = {("x", l): out.hidden_states[l + 1][0].double().cpu() for l in range(n - 1)}
    return {**caught, **res}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--kern", default=".carry/kern")
    ap.add_argument("--kernels", default="build/packs")
    ap.add_argument("--prompts", default="3,6,0", help="indices into real_model.py's prompts (0-3 chats, 4-7 code)")
    ap.add_argument("--work", default="/tmp/kern-real-layers")
    ap.add_argument("--pack-arg", action="append", default=[], help="extra `kern pack` argument (repeatable), e.g. --pack-arg=--decode-attention --pack-arg=plain")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    os.makedirs(a.work, exist_ok=True)
    model_dir = os.path.join(a.work, "model")
    kern = parity.Kern(a.kern, a.timeout, os.path.join(a.work, "logs"))
    parity.torch_setup(a.device)
    if not os.path.exists(os.path.join(model_dir, "model.json")):
        kern("pack", ["pack", "--gguf", a.gguf, "-o", model_dir, "--kernels", a.kernels, "--max-tokens", 256, "--max-seqs", 8, "--max-context", 1024] + a.pack_arg)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(a.gguf), gguf_file=os.path.basename(a.gguf))
    texts = [("chat", q) for q in real_model.CHATS] + [("code", c) for c in real_model.CODE]
    chosen = [int(i) for i in a.prompts.split(",")]
    prompts = {}
    for i in chosen:
        kind, text = texts[i]
        if kind == "chat":
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            if len(ids) and isinstance(ids[0], (list, tuple)):
                ids = ids[0]
        else:
            ids = tok(text, add_special_tokens=False)["input_ids"]
        prompts[i] = [int(x) for x in ids]

    model_json = os.path.join(model_dir, "model.json")
    layers = json.load(open(os.path.join(model_dir, "config.json")))["num_hidden_layers"] if os.path.exists(os.path.join(model_dir, "config.json")) else None
    kern_vals = {}
    t0 = time.time()
    for i, ids in prompts.items():
        inputs = parity.step_inputs(model_json, os.path.join(a.work, f"in-{i}"), ids)
        n_layers = layers or sum(1 for c in json.load(open(model_json))["program"]["calls"] if c.get("op") in ("o_proj", "o_proj_norm_gate_up"))
        for l in range(n_layers - 1):
            cut = os.path.join(model_dir, f"model.cut{l}.json")
            cut_manifest(model_json, l, cut)
            od = os.path.join(a.work, f"out-{i}-{l}")
            os.makedirs(od, exist_ok=True)
            kern(f"run-{i}-{l}", ["run", cut, "--weights", model_dir, "--set", f"tokens={len(ids)}", "--set", "seqs=1", *inputs,
                                  "--output", "o", "--output", "mlp", "--output", "x", "--out-dir", od])
            for t in TENSORS:
                kern_vals[(i, t, l)] = np.load(os.path.join(od, f"{t}.npy")).astype(np.float64)[: len(ids)]
    log(f"kern: {len(kern_vals) // len(TENSORS)} cut runs in {time.time() - t0:.0f} s")

    refs = {}
    for dtype, name in ((torch.float32, "ref32"), (torch.bfloat16, "bf16")):
        m, _ = real_model.load_gguf_model(a.gguf, dtype, a.device)
        for i, ids in prompts.items():
            refs[(name, i)] = hf_layers(m, ids, a.device)
        del m
        parity.free_cuda()

    report, worst = {}, []
    for i, ids in prompts.items():
        kind, text = texts[i]
        rows = []
        print(f"\nprompt {i} ({kind}: {text.splitlines()[0][:50]!r}, {len(ids)} tokens)")
        print(f"{'layer':>5} " + " ".join(f"{t + ' e_kern':>12} {t + ' e_bf16':>12} {'ratio':>6}" for t in TENSORS))
        for l in range(len({k[2] for k in kern_vals if k[0] == i})):
            row = {"layer": l}
            cells = []
            for t in TENSORS:
                r32 = refs[("ref32", i)][(t, l)].numpy()
                rbf = refs[("bf16", i)][(t, l)].numpy()
                kv = kern_vals[(i, t, l)]
                if kv.shape != r32.shape:
                    raise ValueError(f"prompt {i} layer {l} {t}: kern {kv.shape} vs transformers {r32.shape}")
                ek, eb = float(np.abs(kv - r32).max()), float(np.abs(rbf - r32).max())
                ratio = ek / eb if eb > 0 else float("inf")
                row[t] = {"e_kern": ek, "e_bf16": eb, "ratio": ratio}
                cells.append(f"{ek:12.4g} {eb:12.4g} {ratio:6.2f}")
                worst.append((ratio, i, l, t, ek, eb))
            rows.append(row)
            print(f"{l:>5} " + " ".join(cells))
        report[i] = {"label": f"{kind}: {text}", "tokens": len(ids), "layers": rows}
    worst.sort(reverse=True)
    print("\nworst kern/bf16 error ratios (prompt, layer, tensor):")
    for ratio, i, l, t, ek, eb in worst[:10]:
        print(f"  {ratio:6.2f}  prompt {i} layer {l:>2} {t:<4} e_kern {ek:.4g} e_bf16 {eb:.4g}")
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "real_layers.json"), "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
