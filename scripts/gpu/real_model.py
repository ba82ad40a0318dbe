#!/usr/bin/env python3
"""Parity of `kern generate` with a real model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (GGUF).

Run on the GPU machine from the repository root (scripts/gpu/real_model.sh sets it up):

    python3 scripts/gpu/real_model.py --gguf /tmp/qwen2.5-coder-0.5b-q4km.gguf [--kern .carry/kern]
        [--kernels build/packs] [--steps 64] [--work /tmp/kern-real]

The reference is transformers loading the same GGUF (`from_pretrained(dir, gguf_file=...)`,
which dequantizes with the `gguf` package to float32 — bit-identical to kern's dequantizer —
then casts), so kern and the reference hold the same weights:
  0. `kern pack --gguf` into --work/model (manifest, cubins, tokenizer from the GGUF metadata).
  1. Weights: transformers' fp32 `q_proj`, `down_proj` (Q6_K/Q4_K), `embed_tokens` (Q5_0) and
     `lm_head` (Q8_0) rows equal `kern extract` (float32) bit for bit, and the bf16 model's equal
     `kern extract --raw` (kern's load-time bf16).
  2. Eight real prompts, token ids from transformers' GGUF tokenizer: four chats (through the
     GGUF's chat template, generation prompt added) and four code completions.
  3. `kern generate` of all eight as one batch: greedy, --steps tokens, --ignore-eos, --dump.
  4. transformers fp32 (ref32) and bf16, teacher-forced on prompt + kern's tokens: per step
     e_kern = max|kern - ref32| <= 1.5 · max|bf16 - ref32| + 0.01 (the random-weight rule of
     parity.py); transformers bf16 greedy (its own KV cache): equal streams, or at the first
     split both tokens' ref32 logits within the bound.
  5. The greedy texts side by side; the France question must mention Paris (kern's own text
     path too: `kern generate --chat --prompt "What is the capital of France?"`).
Prints load time and decode speed; with $OUT set writes $OUT/real_model.json and
$OUT/real_model.txt. Exit 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402  (the comparison logic, the kern runner, transformers helpers)
from parity import log  # noqa: E402

CHATS = [
    "What is the capital of France?",
    "Write a Python function that returns True when a number is prime.",
    "Explain in two sentences what a hash map is.",
    "用一句话解释什么是递归。",
]
CODE = [
    "def fibonacci(n):\n",
    "#include <stdio.h>\n\nint main(void) {\n",
    "import numpy as np\n\n\ndef softmax(x: np.ndarray) -> np.ndarray:\n",
    "// Reverse a string in Rust\nfn reverse(s: &str) -> String {\n",
]
# (kern GGUF tensor, transformers parameter, rows to compare or None for all)
WEIGHTS = [
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", None),
    ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias", None),
    ("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", None),
    ("blk.5.ffn_down.weight", "model.layers.5.mlp.down_proj.weight", None),
    ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight", None),
    ("token_embd.weight", "model.embed_tokens.weight", 4096),
    ("output.weight", "lm_head.weight", 4096),
    ("output_norm.weight", "model.norm.weight", None),
]


def load_gguf_model(gguf, dtype, device):
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM
    t = time.time()
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf), dtype=dtype)
    return m.to(device).eval(), time.time() - t


def check_weights(kern, model, work, raw):
    """kern extract (f32, or bf16 bits with raw) vs the model's parameters, bit for bit."""
    import numpy as np
    import torch
    res = []
    for gname, hname, rows in WEIGHTS:
        out = os.path.join(work, f"w-{gname}-{'bf16' if raw else 'f32'}.npy")
        kern(f"extract-{gname}{'-raw' if raw else ''}", ["extract", kern.model_dir, "--tensor", gname, "-o", out] + (["--raw"] if raw else []))
        k = np.load(out)
        p = model.get_parameter(hname).detach()
        if raw:
            h = p.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
        else:
            h = p.float().cpu().numpy().view(np.uint32)
            k = k.view(np.uint32)
        if rows:
            k, h = k[:rows], h[:rows]
        same = k.shape == h.shape and bool((k == h).all())
        n_bad = None if k.shape != h.shape else int((k != h).sum())
        res.append({"tensor": gname, "param": hname, "shape": list(k.shape), "hf_shape": list(h.shape), "bit_exact": same, "differing": n_bad})
        log(f"  {'ok  ' if same else 'DIFF'} {gname} → {hname} {list(k.shape)}{'' if same else f' ({n_bad} differ)'}")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--kern", default=".carry/kern")
    ap.add_argument("--kernels", default="build/packs")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--work", default="/tmp/kern-real")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pack-arg", action="append", default=[], help="extra `kern pack` argument (repeatable), e.g. --pack-arg=--residual --pack-arg=f32")
    a = ap.parse_args(argv)
    out_dir = os.environ.get("OUT")
    report = {"gguf": a.gguf, "steps": a.steps}
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    model_dir = os.path.join(a.work, "model")
    kern = parity.Kern(a.kern, a.timeout, os.path.join(a.work, "logs"), os.path.join(out_dir, "real-model-logs") if out_dir else None)
    kern.model_dir = model_dir
    report["env"] = parity.torch_setup(a.device)
    ok = True

    log("== 0. kern pack --gguf")
    kern("pack", ["pack", "--gguf", a.gguf, "-o", model_dir, "--kernels", a.kernels, "--max-tokens", 256, "--max-seqs", 8, "--max-context", 1024, *a.pack_arg], show_tail=2)

    import numpy as np
    import torch
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(a.gguf), gguf_file=os.path.basename(a.gguf))
    prompts, labels = [], []
    for q in CHATS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if len(ids) and isinstance(ids[0], (list, tuple)):
            ids = ids[0]
        prompts.append([int(x) for x in ids])
        labels.append(f"chat: {q}")
    for c in CODE:
        prompts.append([int(x) for x in tok(c, add_special_tokens=False)["input_ids"]])
        labels.append(f"code: {c.splitlines()[0]}")
    report["prompt_lengths"] = [len(p) for p in prompts]

    log("== 3. kern generate (8 prompts, one batch, greedy)")
    dump = os.path.join(a.work, "dump")
    err, dt = kern("generate", parity.gen_args(model_dir, prompts, a.steps, dump), show_tail=1)
    report["kern_rates"] = parity.parse_rates(err)
    load_line = [l for l in err.splitlines() if l.startswith("loaded ")]
    report["kern_load"] = load_line[0] if load_line else None
    vocab = 151936
    ktoks, klogits = parity.read_dump(dump, prompts, a.steps, vocab)

    log("== 1. weights: transformers fp32 vs kern extract (f32)")
    m32, t32 = load_gguf_model(a.gguf, torch.float32, a.device)
    report["hf_load_fp32_s"] = round(t32, 1)
    report["weights_f32"] = check_weights(kern, m32, a.work, raw=False)
    log("== 4a. ref32 teacher-forced")
    ref32 = parity.teacher_forced(m32, prompts, ktoks, a.device)
    del m32
    parity.free_cuda()
    mbf, tbf = load_gguf_model(a.gguf, torch.bfloat16, a.device)
    report["hf_load_bf16_s"] = round(tbf, 1)
    log("== 1b. weights: transformers bf16 vs kern extract --raw (kern's load-time bf16)")
    report["weights_bf16"] = check_weights(kern, mbf, a.work, raw=True)
    log("== 4b. bf16 teacher-forced, transformers greedy")
    bf16 = parity.teacher_forced(mbf, prompts, ktoks, a.device)
    try:
        htoks, htopk, _ = parity.hf_greedy(mbf, prompts, a.steps, a.device)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        htoks, htopk = [f"transformers generate: {e}"] * len(prompts), [None] * len(prompts)
    del mbf
    parity.free_cuda()
    ok &= all(w["bit_exact"] for w in report["weights_f32"] + report["weights_bf16"])

    log("== 5. results")
    seqs, lines = [], []
    for i, (p, lab) in enumerate(zip(prompts, labels)):
        se = parity.step_errors(klogits[i], ref32[i], bf16[i])
        g = parity.greedy_check(ktoks[i], htoks[i], ref32[i], se["bound"], kern_logits=klogits[i], hf_topk=htopk[i]) if not isinstance(htoks[i], str) else {"pass": False, "error": htoks[i]}
        s = {"label": lab, "prompt_len": len(p), "max_ratio": float(se["ratio"].max()), "max_e_kern": float(se["e_kern"].max()),
             "max_e_bf16": float(se["e_bf16"].max()), "logits_pass": bool((se["ratio"] <= 1).all()), "greedy": g,
             "kern_text": tok.decode(ktoks[i], skip_special_tokens=False),
             "hf_text": tok.decode(htoks[i], skip_special_tokens=False) if not isinstance(htoks[i], str) else htoks[i],
             # Per step, to see where the rule is exceeded (bf16's own error at that step vs kern's).
             "e_kern": [float(x) for x in se["e_kern"]], "e_bf16": [float(x) for x in se["e_bf16"]]}
        s["pass"] = s["logits_pass"] and g["pass"]
        ok &= s["pass"]
        seqs.append(s)
        split = g.get("first_split")
        lines.append(f"[{'PASS' if s['pass'] else 'FAIL'}] {lab!r}: prompt {len(p)} tokens, worst e_kern/bound {s['max_ratio']:.3f} "
                     f"(e_kern {s['max_e_kern']:.4f}, e_bf16 {s['max_e_bf16']:.4f}), greedy {'identical' if split is None and g['pass'] else f'split at {split}'}")
        lines.append(f"    kern: {s['kern_text'][:300]!r}")
        lines.append(f"    hf  : {s['hf_text'][:300]!r}")
    france = seqs[0]["kern_text"]
    report["france_ok"] = "Paris" in france
    ok &= report["france_ok"]

    log("== 5b. kern's own text path: --chat --prompt")
    err, _ = kern("chat-france", ["generate", "--model", model_dir, "--chat", "--prompt", CHATS[0], "--max-tokens", 32, "--temperature", "0"], show_tail=3)
    report["kern_chat_stderr_tail"] = err.strip().splitlines()[-3:]
    chat_out = open(os.path.join(kern.logdir, "chat-france.log")).read()
    report["kern_chat_paris"] = "Paris" in chat_out.split("--- stdout", 1)[-1]
    ok &= report["kern_chat_paris"]

    report["sequences"] = seqs
    report["pass"] = bool(ok)
    w_ok = all(w["bit_exact"] for w in report["weights_f32"] + report["weights_bf16"])
    summary = [
        f"real model: {a.gguf}",
        f"weights bit-exact with transformers (f32 and bf16, {len(WEIGHTS)} tensors each): {'yes' if w_ok else 'NO'}",
        f"kern: {report['kern_load']}",
        f"kern rates: {report['kern_rates']}",
        f"France answer (kern, batch greedy): {france[:120]!r} → {'ok' if report['france_ok'] else 'WRONG'}",
        f"France answer (kern --chat --prompt): {'mentions Paris' if report['kern_chat_paris'] else 'WRONG'}",
        *lines,
        f"OVERALL: {'PASS' if ok else 'FAIL'}",
    ]
    text = "\n".join(summary)
    print(text)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "real_model.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(out_dir, "real_model.txt"), "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
