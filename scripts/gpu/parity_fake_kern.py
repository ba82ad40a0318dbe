#!/usr/bin/env python3
"""A stand-in for the kern binary, for dry runs of scripts/gpu/parity.py without a GPU.

Only for checking parity.py and real_model.py themselves (their plumbing, file formats and
step alignment), never as evidence about kern. `random-weights`, `pack`, `extract` and `inspect`
are passed to a real kern binary (PARITY_FAKE_REAL_KERN, default target/release/kern: none needs a
GPU); `generate` follows kern's contract with transformers in float32 on the CPU plus a small
deterministic noise on the logits (PARITY_FAKE_NOISE, default 1e-3; set it large, e.g. 1, to see
parity.py FAIL; PARITY_FAKE_FAIL_CHUNK=1 makes runs with --chunk fail). A model directory that
holds a GGUF file (kern pack --gguf) is loaded from it (cached as safetensors under
PARITY_FAKE_CACHE, default /tmp/fake-kern-cache); text prompts are tokenized with the directory's
tokenizer.json / tokenizer_config.json through transformers (--chat: its chat template):

  generate --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) [...] [--chat] --max-tokens N
           --temperature 0 [--ignore-eos] --dump OUTDIR [--chunk C]

writes OUTDIR/tokens.json {"prompts": [...], "outputs": [...]} and OUTDIR/seq{i}.logits.npy
(float32 [N, vocab], row j = the logits token j was chosen from), and prints timings to stderr.
Run it with a python that has torch, transformers and numpy (e.g. put that venv first on PATH).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import zlib


def real_kern(argv):
    exe = os.environ.get("PARITY_FAKE_REAL_KERN", "target/release/kern")
    return subprocess.call([exe] + argv)


def generate(argv):
    ap = argparse.ArgumentParser(prog="fake-kern generate")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", action="append", default=[])
    ap.add_argument("--prompt", action="append", default=[])
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--dump")
    ap.add_argument("--chunk", type=int)
    a = ap.parse_args(argv)
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
    assert a.temperature == 0.0, "fake kern: greedy only"
    if a.chunk and os.environ.get("PARITY_FAKE_FAIL_CHUNK"):
        print("error: fake failure of a chunked run (PARITY_FAKE_FAIL_CHUNK)", file=sys.stderr)
        return 1
    if not os.path.exists(os.path.join(a.model, "model.json")):
        print(f"error: {a.model}/model.json missing (run kern pack)", file=sys.stderr)
        return 1
    noise = float(os.environ.get("PARITY_FAKE_NOISE", "1e-3"))
    t0 = time.time()
    ggufs = sorted(f for f in os.listdir(a.model) if f.endswith(".gguf"))
    if ggufs:
        src = os.path.realpath(os.path.join(a.model, ggufs[0]))
        cache = os.path.join(os.environ.get("PARITY_FAKE_CACHE", "/tmp/fake-kern-cache"), f"{zlib.crc32(src.encode()):08x}-{os.path.getsize(src)}")
        if os.path.exists(os.path.join(cache, "model.pt")):
            cfg, sd = torch.load(os.path.join(cache, "model.pt"), weights_only=False)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
            model.load_state_dict(sd, strict=False)
            model = model.eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src), dtype=torch.float32,
                                                         attn_implementation="sdpa").eval()
            os.makedirs(cache, exist_ok=True)
            torch.save((model.config, model.state_dict()), os.path.join(cache, "model.pt"))
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    t_load = time.time() - t0
    prompts = [[int(x) for x in p.split(",")] for p in a.prompt_ids]
    if a.prompt:
        import shutil
        import tempfile
        from transformers import AutoTokenizer
        # The tokenizer files alone: AutoTokenizer would also read the directory's config.json.
        tdir = tempfile.mkdtemp()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.model, f), tdir)
        tok = AutoTokenizer.from_pretrained(tdir)
        for text in a.prompt:
            if a.chat:
                ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            else:
                ids = tok(text, add_special_tokens=False)["input_ids"]
            prompts.append([int(x) for x in ids])
    if not prompts:
        print("error: give --prompt-ids or --prompt", file=sys.stderr)
        return 2
    chunk = a.chunk or 256
    outputs, rows = [], []
    t_pre = t_dec = 0.0
    n_pre = n_dec = 0
    with torch.inference_mode():
        for p in prompts:
            key = zlib.crc32(json.dumps(p).encode())
            t = time.time()
            past = None
            for s in range(0, len(p), chunk):  # chunked prefill through the cache
                out = model(input_ids=torch.tensor([p[s:s + chunk]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            t_pre += time.time() - t
            n_pre += len(p)
            toks, lg = [], []
            t = time.time()
            for j in range(a.max_tokens):
                if j > 0:
                    out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=past, use_cache=True)
                    past = out.past_key_values
                row = out.logits[0, -1].float().numpy().copy()
                rng = np.random.default_rng([key, j])  # same prefix+step -> same noise (chunked == one chunk)
                row += noise * rng.standard_normal(row.shape[0]).astype(np.float32)
                toks.append(int(row.argmax()))
                lg.append(row)
            t_dec += time.time() - t
            n_dec += a.max_tokens
            outputs.append(toks)
            rows.append(np.stack(lg).astype(np.float32))
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
        with open(os.path.join(a.dump, "tokens.json"), "w") as f:
            json.dump({"prompts": prompts, "outputs": outputs}, f)
        for i, r in enumerate(rows):
            np.save(os.path.join(a.dump, f"seq{i}.logits.npy"), r)
    print(f"fake-kern: loaded {a.model} in {t_load:.2f} s", file=sys.stderr)
    print(f"fake-kern: prefill {n_pre} tokens in {t_pre:.2f} s ({n_pre / max(t_pre, 1e-9):.1f} tok/s), "
          f"decode {n_dec} tokens in {t_dec:.2f} s ({n_dec / max(t_dec, 1e-9):.1f} tok/s)", file=sys.stderr)
    for i, o in enumerate(outputs):
        print(f"seq {i}: {o[:8]}...")
    return 0


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "generate":
        return generate(rest)
    if cmd in ("random-weights", "pack", "extract", "inspect"):
        return real_kern([cmd] + rest)
    print(f"fake-kern: unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
