#!/usr/bin/env python3
"""Parity of `kern generate` against Hugging Face transformers on the same random weights.

Run on the GPU machine from the repository root, with prebuilt binaries (the GPU machine has no
cargo) — python3 with torch, transformers 5.x, numpy, safetensors:

    python3 scripts/gpu/parity.py [--kern .carry/kern] [--kernels build/packs]
        [--shapes qwen3-0.6b,qwen2.5-0.5b,qwen3-4b] [--steps 64] [--timeout 300]
    python3 scripts/gpu/parity.py --shapes smollm2-135m,llama-3.2-1b,gemma-3-1b-sw48,mistral-7b-v0.1-sw64
    python3 scripts/gpu/parity.py --shapes gemma-3-1b:sliding_window=32:layers=8   # an ad hoc shape
    python3 scripts/gpu/parity.py --layers 2 --steps 8      # quick smoke run (shrunk models)
    python3 scripts/gpu/parity.py --list                    # the presets and cases
    python3 scripts/gpu/parity.py --selftest                # the comparison logic, CPU + numpy only

A shape is one of: a preset of `kern random-weights` (packs/src/config.rs PRESETS, read from
that file: every family's real widths), a case of CASES below (a preset with config overrides
such as a short sliding window, a layer count, its own prompts / steps / context), or
PRESET:key=value:... (keys layers, steps, lengths (a/b/c), attn, max_context, pack_max_tokens;
any other key is a config.json override, its value JSON). --layers / --steps / --lengths on the
command line override every shape's own.

Per shape (real layer counts unless the shape or --layers says otherwise):
  1. `kern random-weights` (--preset P, or --config with the shape's config: the preset's with
     its overrides and layer count) --seed S and `kern pack` (--max-tokens 256 --max-seqs 8
     --max-context 1024 unless the shape says otherwise) into --work (default
     /tmp/kern-parity), deleted afterwards unless --keep.
  2. Prompts of seeded random token ids in [0, min(vocab, 151643)) (151643: Qwen's ordinary
     vocabulary, no special tokens; every id of a smaller vocabulary), lengths --lengths
     (5,37,120,251) or the shape's own.
  3. `kern generate` of all prompts as one batch: greedy, --steps tokens, --ignore-eos, --dump →
     kern's tokens and, per step, the last-position logits the token was chosen from.
  4. transformers (attention: --attn or the shape's, default "sdpa", the library's default) in
     float32 (ref32) and in bfloat16, each loaded from the same directory, teacher-forced on
     prompt + kern's tokens (one forward per sequence, no cache): rows at positions
     len(prompt)-1+j. Per step j: e_kern = max|kern_j - ref32_j|, e_bf16 = max|bf16_j - ref32_j|,
     bound = 1.5 e_bf16 + 0.01; PASS iff e_kern <= bound at every step of every sequence.
     fp32 matmuls run in full fp32 (TF32 off); bf16 runs with PyTorch's defaults.
     Sparse-MoE models (a module whose class name contains "SparseMoe" with a `gate`): forward
     hooks on each gate keep, per MoE layer and position, the fp32 router's top-k margin (k-th
     minus (k+1)-th router logit; a near-tie when below TIE_REL = 2^-7 of the row's largest
     |logit|, i.e. within bf16's resolution) and the fp32 and bf16 top-k sets. The row gets
     `routing` (near-tie steps, bf16 flips, the worst and every failing step with its smallest
     margin, layer, and whether bf16's set differs there) and notes; the verdict is the rule's.
     Dense models: no hooks, no `routing` key.
  5. transformers bf16 greedy with its own KV cache (model.generate, do_sample=False,
     eos_token_id=None so it neither stops nor masks EOS — as kern's --ignore-eos; pad id 0),
     one prompt at a time: the token streams must be equal for all steps or, at the first split
     j, |ref32_j[kern tok] - ref32_j[hf tok]| <= bound_j (ref32_j is the logits of the common
     prefix). The vLLM rule (each token in the other side's top 5) is reported alongside.
  6. Chunked prefill: `kern generate --chunk 16 --max-tokens 4` (same batch) against step 3's
     rows 0..3 (while the token prefixes agree), and the longest prompt alone in one chunk
     (`--max-tokens 4`, no --chunk; when it fits one step) against both: max |diff| <= bound of
     that step. With a sliding window shorter than the prompts, the chunks cross the window.
  7. The manifest against the fp32 model (scripts/gpu/families.py rope_check): per layer, the
     RoPE frequencies kern uses (the manifest's table `rope.inv_freq`, or theta^(-2i/d) as the
     kernel computes it when there is none, e.g. Gemma 3's local layers) equal transformers'
     rotary_emb inv_freq of the layer's type (to 1 ulp; the count of inexact ones is shown), the
     cos/sin factor equals its attention_scaling, the attention score scale equals
     self_attn.scaling, and the layer's sliding window equals transformers'.
  Also checked: kern's logits are finite, shaped [steps, vocab], and each chosen token holds
  its row's maximum (the dump is what the token was chosen from).

Prints one summary row per shape and a final table; when $OUT is set, writes every number to
$OUT/parity.json (after each shape), the final table to $OUT/parity.txt and every kern call's
command line, stdout and stderr to $OUT/parity-logs/ (PARITY_JSON / PARITY_TXT / PARITY_LOGS
rename them). The "chunked max diff" column is the largest of: chunk-16 run vs the batch run,
lone one-chunk run vs both. Exit status 1 if any shape FAILs (a failing shape does not stop the
others), 2 on bad arguments.

Dry run without a GPU (plumbing only): scripts/gpu/parity_fake_kern.py stands in for kern.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback

REL, ABS = 1.5, 0.01  # kern's error bound: REL * e_bf16 + ABS
PROMPT_ID_MAX = 151643  # Qwen's ordinary vocabulary (no special tokens); smaller vocabularies: all ids
PAD_ID = 0  # transformers' generate pad id: valid in every vocabulary (one prompt at a time: never used)
TOPK = 5  # vLLM's check_logprobs_close
DEFAULT_SHAPES = "qwen3-0.6b,qwen2.5-0.5b,qwen3-4b"  # the 8 GB one last
DEFAULT_LENGTHS = (5, 37, 120, 251)
DEFAULT_STEPS = 64
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Cases: a preset with what the preset alone does not exercise. `config` overrides config.json
# keys (never a tensor's shape), `layers` cuts the decoder (real widths, fewer layers: the 7B /
# 8B shapes in a device call's time), the rest replaces the run's defaults for this shape.
CASES = {
    "gemma-3-1b-sw48": dict(
        preset="gemma-3-1b", config={"sliding_window": 48},
        why="Gemma 3 1B, a 48-token window on its 5-of-6 local layers: prompts 120 / 251 and 64 steps go well past it, 16-token chunks cross it"),
    "gemma-3-4b-sw96": dict(
        preset="gemma-3-4b", layers=12, config={"sliding_window": 96},
        why="Gemma 3 4B widths (linear-8 RoPE on the global layers 5 and 11, head_dim 256), a 96-token window, 12 of 34 layers"),
    "gemma-3-4b": dict(preset="gemma-3-4b", why="Gemma 3 4B as it is (window 1024: not reached by these prompts)"),
    "mistral-7b-v0.1-sw64": dict(
        preset="mistral-7b-v0.1", layers=8, config={"sliding_window": 64},
        why="Mistral 7B v0.1 widths with a 64-token window on every layer (its 4096 shortened), 8 of 32 layers"),
    "mistral-7b-l8": dict(preset="mistral-7b", layers=8, why="Mistral 7B v0.3 widths (no window, vocab 32768), 8 of 32 layers"),
    "llama-3.1-8b-l8": dict(preset="llama-3.1-8b", layers=8, why="Llama 3.1 8B widths (llama3 RoPE factor 8, untied), 8 of 32 layers"),
    "llama-3.2-1b-long": dict(
        preset="llama-3.2-1b", lengths=[8300, 40], steps=32, max_context=8448,
        why="Llama 3.2 1B (llama3 RoPE factor 32, original context 8192): positions up to 8331, past the smooth band's longest wavelength (8192)"),
}
SHAPE_KEYS = {"layers": int, "steps": int, "lengths": lambda v: [int(x) for x in str(v).replace(",", "/").split("/") if x],
              "attn": str, "max_context": int, "pack_max_tokens": int}


def read_presets(path=None):
    """The PRESETS of packs/src/config.rs (what `kern random-weights --preset` writes): name ->
    the config.json values, read from the Rust source so the two never drift apart."""
    path = path or os.path.join(REPO, "packs", "src", "config.rs")
    with open(path) as f:
        text = f.read()
    out = {}
    for m in re.finditer(r'\(\s*"([^"]+)"\s*,\s*r#"(\{.*?\})"#\s*\)', text, re.S):
        out[m.group(1)] = json.loads(m.group(2))
    if not out:
        raise ValueError(f"{path}: no PRESETS entries found")
    return out


def parse_shape(spec, presets):
    """A shape spec -> {name, preset, config (overrides), layers, steps, lengths, attn,
    max_context, pack_max_tokens, why}; None where the run's defaults apply."""
    spec = spec.strip()
    shape = {"name": spec, "config": {}, "why": ""}
    if spec in CASES:
        c = dict(CASES[spec])
        shape["preset"] = c.pop("preset")
        shape["config"] = dict(c.pop("config", {}))
        shape["why"] = c.pop("why", "")
        shape.update(c)
    else:
        head, *kvs = spec.split(":")
        shape["preset"] = head
        for kv in kvs:
            if "=" not in kv:
                raise ValueError(f"shape {spec!r}: `{kv}` is not key=value")
            k, v = kv.split("=", 1)
            if k in SHAPE_KEYS:
                shape[k] = SHAPE_KEYS[k](v)
            else:
                try:
                    shape["config"][k] = json.loads(v)
                except ValueError:
                    shape["config"][k] = v
    if shape["preset"] not in presets:
        raise ValueError(f"shape {spec!r}: no preset {shape['preset']!r} (presets: {', '.join(presets)}; cases: {', '.join(CASES)})")
    for k in SHAPE_KEYS:
        shape.setdefault(k, None)
    return shape


def shape_config(shape, presets, layers=None):
    """The config.json values random-weights writes for the shape: the preset's, the overrides,
    the layer count (None: the shape's own, else the real one)."""
    cfg = json.loads(json.dumps(presets[shape["preset"]]))
    cfg.update(shape["config"])
    n = layers or shape.get("layers")
    if n:
        cfg["num_hidden_layers"] = int(n)
        if "layer_types" in cfg and "layer_types" not in shape["config"]:
            del cfg["layer_types"]  # the family's rule gives them for the new count
    return cfg


# config.json keys transformers 5.x's strict configs type as int (a JSON 256.0 is refused:
# "Field 'query_pre_attn_scalar' expected int, got float").
HF_INT_KEYS = ("query_pre_attn_scalar", "sliding_window", "head_dim", "max_position_embeddings", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size", "vocab_size",
               "sliding_window_pattern")


def hf_config_fixups(model_dir):
    """Rewrites whole-number floats of HF_INT_KEYS in model_dir/config.json as ints (kern reads
    either). Returns what it changed, e.g. ["query_pre_attn_scalar 256.0 -> 256"]: reported with
    the shape, since a config.json transformers refuses is a finding about kern's writer."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    changed = []
    for k in HF_INT_KEYS:
        v = cfg.get(k)
        if isinstance(v, float) and v.is_integer():
            cfg[k] = int(v)
            changed.append(f"{k} {v!r} -> {int(v)}")
    if changed:
        write_json(path, cfg)
    return changed


def prompt_id_max(vocab):
    """Prompt ids are drawn from [0, this): Qwen's ordinary tokens, or a smaller vocabulary's all."""
    return min(int(vocab), PROMPT_ID_MAX)


def log(*a):
    print(*a, flush=True)


# ============================================================================ comparison logic
# Pure numpy: everything below up to the GPU part is what --selftest checks.

def bound_of(e_bf16):
    return REL * e_bf16 + ABS


def step_errors(kern, ref32, bf16):
    """kern, ref32, bf16: [n, vocab] arrays, row j = the logits of step j. Per step: e_kern,
    e_bf16, bound, ratio = e_kern / bound; the rule holds at step j iff ratio <= 1."""
    import numpy as np
    kern, ref32, bf16 = (np.asarray(x, dtype=np.float64) for x in (kern, ref32, bf16))
    if not (kern.shape == ref32.shape == bf16.shape) or kern.ndim != 2:
        raise ValueError(f"shapes differ: kern {kern.shape}, ref32 {ref32.shape}, bf16 {bf16.shape}")
    e_kern = np.abs(kern - ref32).max(axis=1)
    e_bf16 = np.abs(bf16 - ref32).max(axis=1)
    e_kern = np.where(np.isfinite(e_kern), e_kern, np.inf)  # NaN anywhere in a row fails it
    b = bound_of(e_bf16)
    ratio = e_kern / b
    return {"e_kern": e_kern, "e_bf16": e_bf16, "bound": b, "ratio": ratio}


def first_split(a, b):
    """First index where two token lists differ over their common length, else None."""
    for j, (x, y) in enumerate(zip(a, b)):
        if int(x) != int(y):
            return j
    return None


def greedy_check(kern_toks, hf_toks, ref32, bound, kern_logits=None, hf_topk=None):
    """Greedy streams: equal for all steps, or at the first split j the two tokens' ref32
    logits within bound[j]. ref32 rows come from the kern prefix, valid at j because the
    prefixes agree before j. kern_logits / hf_topk (per step, the HF top-k ids) add the vLLM
    top-k report (informational)."""
    import numpy as np
    n = len(kern_toks)
    r = {"steps": n, "hf_steps": len(hf_toks)}
    j = first_split(kern_toks, hf_toks)
    if j is None:
        r["first_split"] = None
        r["pass"] = len(hf_toks) >= n
        if len(hf_toks) < n:
            r["why"] = f"transformers made only {len(hf_toks)} of {n} tokens"
        return r
    k, h = int(kern_toks[j]), int(hf_toks[j])
    gap = abs(float(ref32[j][k]) - float(ref32[j][h]))
    r.update(first_split=j, kern_tok=k, hf_tok=h, ref32_kern=float(ref32[j][k]), ref32_hf=float(ref32[j][h]),
             gap=gap, bound=float(bound[j]))
    r["pass"] = bool(gap <= bound[j])
    if kern_logits is not None and hf_topk is not None and j < len(hf_topk):
        kt = np.argsort(-np.asarray(kern_logits[j], dtype=np.float64), kind="stable")[:TOPK]
        r["topk_mutual"] = bool(h in set(int(x) for x in kt) and k in set(int(x) for x in hf_topk[j]))
    return r


def chunk_check(base_logits, base_toks, other_logits, other_toks, ref32, bound):
    """Another kern run of the same sequence (chunked prefill, or alone in one chunk) against a
    base run: rows compared while the token prefixes agree (row j needs tokens 0..j-1 equal);
    where the tokens split, the rule of greedy_check with ref32 (rows from the base run's
    tokens). bound: per-step bound of the base sequence."""
    import numpy as np
    n = min(len(base_toks), len(other_toks), len(base_logits), len(other_logits))
    j_split = first_split(base_toks[:n], other_toks[:n])
    rows = n if j_split is None else j_split + 1  # row j_split itself still shares the prefix
    diffs, ratios = [], []
    for j in range(rows):
        d = float(np.abs(np.asarray(other_logits[j], np.float64) - np.asarray(base_logits[j], np.float64)).max())
        d = d if np.isfinite(d) else float("inf")
        diffs.append(d)
        ratios.append(d / float(bound[j]))
    r = {"rows": rows, "diff": diffs, "max_diff": max(diffs) if diffs else 0.0,
         "max_ratio": max(ratios) if ratios else 0.0, "tokens_equal": j_split is None, "first_split": j_split}
    ok = all(x <= 1.0 for x in ratios)
    if j_split is not None:
        a, b = int(base_toks[j_split]), int(other_toks[j_split])
        gap = abs(float(ref32[j_split][a]) - float(ref32[j_split][b]))
        r["split_gap"], r["split_bound"] = gap, float(bound[j_split])
        ok = ok and gap <= bound[j_split]
    r["pass"] = bool(ok)
    return r


def own_argmax_check(logits, toks):
    """Each chosen token must hold its row's maximum (ties allowed): the dumped row is what the
    token was chosen from. Returns ok, worst shortfall max(row) - row[tok], and finiteness."""
    import numpy as np
    worst, bad = 0.0, []
    finite = bool(np.isfinite(logits).all())
    for j, t in enumerate(toks):
        row = np.asarray(logits[j])
        short = float(row.max() - row[int(t)])
        if not np.isfinite(short) or short > 0:
            bad.append(j)
            worst = max(worst, short if np.isfinite(short) else float("inf"))
    return {"ok": not bad and finite, "finite": finite, "bad_steps": bad[:10], "worst_shortfall": worst}


def evaluate_sequence(prompt, run1, run_chunked, ref32, bf16, hf_toks, hf_topk=None, run_single=None):
    """All checks of one sequence. run1 / run_chunked / run_single: (tokens, logits) of kern's
    batch run, its chunked run and (for one sequence) the run of this prompt alone."""
    toks, logits = run1
    se = step_errors(logits, ref32, bf16)
    j_worst = int(se["ratio"].argmax())
    r = {
        "prompt_len": len(prompt),
        "steps": len(toks),
        "e_kern": [float(x) for x in se["e_kern"]],
        "e_bf16": [float(x) for x in se["e_bf16"]],
        "ratio": [float(x) for x in se["ratio"]],
        "max_ratio": float(se["ratio"].max()),
        "worst_step": j_worst,
        "max_e_kern": float(se["e_kern"].max()),
        "max_e_bf16": float(se["e_bf16"].max()),
        "mean_e_kern": float(se["e_kern"].mean()),
        "mean_e_bf16": float(se["e_bf16"].mean()),
    }
    r["logits_pass"] = bool((se["ratio"] <= 1.0).all())
    r["own_argmax"] = own_argmax_check(logits, toks)
    if isinstance(hf_toks, str):  # transformers' generate failed: its error
        r["greedy"] = {"pass": False, "first_split": None, "error": hf_toks}
    else:
        r["greedy"] = greedy_check(toks, hf_toks, ref32, se["bound"], kern_logits=logits, hf_topk=hf_topk)
    if isinstance(run_chunked, str):  # the chunked kern run failed: its error
        r["own_argmax_chunked"] = {"ok": False, "finite": None, "bad_steps": [], "error": run_chunked}
        r["chunked"] = {"pass": False, "rows": 0, "max_diff": None, "max_ratio": None, "tokens_equal": False,
                        "first_split": None, "error": run_chunked}
    else:
        ctoks, clogits = run_chunked
        r["own_argmax_chunked"] = own_argmax_check(clogits, ctoks)
        r["chunked"] = chunk_check(logits, toks, clogits, ctoks, ref32, se["bound"])
    ok = [r["logits_pass"], r["own_argmax"]["ok"], r["greedy"]["pass"], r["own_argmax_chunked"]["ok"], r["chunked"]["pass"]]
    if isinstance(run_single, str):
        r["single"] = {"pass": False, "max_diff": None, "max_ratio": None, "first_split": None, "error": run_single}
        ok.append(False)
    elif run_single is not None:
        stoks, slogits = run_single
        r["own_argmax_single"] = own_argmax_check(slogits, stoks)
        r["single"] = chunk_check(logits, toks, slogits, stoks, ref32, se["bound"])
        ok += [r["single"]["pass"], r["own_argmax_single"]["ok"]]
        if not isinstance(run_chunked, str):
            # one chunk vs chunks of 16: the claim "several chunks give the logits of one"
            r["single_vs_chunked"] = chunk_check(slogits, stoks, clogits, ctoks, ref32, se["bound"])
            ok.append(r["single_vs_chunked"]["pass"])
    r["pass"] = all(ok)
    return r


def summarize_shape(shape, prompts, seqs, rates, extra=None):
    """One summary row (a dict) from the per-sequence results."""
    worst = max(seqs, key=lambda s: s["max_ratio"])
    greedy = []
    for s in seqs:
        g = s["greedy"]
        greedy.append("err" if "error" in g else "=" if g["first_split"] is None and g["pass"] else
                      ("short" if g["first_split"] is None else f"@{g['first_split']}{'ok' if g['pass'] else 'BAD'}"))
    chunk_diffs = [s["chunked"]["max_diff"] for s in seqs]
    for s in seqs:
        for k in ("single", "single_vs_chunked"):
            if k in s:
                chunk_diffs.append(s[k]["max_diff"])
    chunk_max = None if any(d is None for d in chunk_diffs) else max(chunk_diffs)
    row = {
        "shape": shape,
        "prompts": "/".join(str(len(p)) for p in prompts),
        "steps": min(s["steps"] for s in seqs),
        "worst_ratio": worst["max_ratio"],
        "worst_at": f"seq{seqs.index(worst)} step {worst['worst_step']}",
        "max_e_kern": max(s["max_e_kern"] for s in seqs),
        "max_e_bf16": max(s["max_e_bf16"] for s in seqs),
        "greedy": ",".join(greedy),
        "chunked_max_diff": chunk_max,
        "chunked_tokens_equal": all(s["chunked"]["tokens_equal"] for s in seqs),
        "rope": None,
        "decode_tok_s": rates.get("decode"),
        "prefill_tok_s": rates.get("prefill"),
        "pass": all(s["pass"] for s in seqs),
    }
    fails = []
    for i, s in enumerate(seqs):
        for k in ("logits_pass",):
            if not s[k]:
                fails.append(f"seq{i}: e_kern > bound (worst ratio {s['max_ratio']:.3f} at step {s['worst_step']})")
        for k in ("own_argmax", "own_argmax_chunked", "own_argmax_single"):
            if k in s and not s[k]["ok"] and "error" not in s[k]:
                fails.append(f"seq{i}: {k}: finite={s[k]['finite']} bad steps {s[k]['bad_steps']}")
        if not s["greedy"]["pass"]:
            fails.append(f"seq{i}: greedy {json.dumps(s['greedy'])}")
        for k in ("chunked", "single", "single_vs_chunked"):
            if k in s and not s[k]["pass"]:
                c = s[k]
                if "error" in c:
                    fails.append(f"seq{i}: {k}: {c['error']}")
                else:
                    fails.append(f"seq{i}: {k}: max diff {c['max_diff']:.4g} (ratio {c['max_ratio']:.3f}), first split {c['first_split']}")
    row["failures"] = fails
    routing, notes = routing_summary(seqs)
    if routing is not None:  # a sparse-MoE model: why a step is off, never a change of the verdict
        row["routing"] = routing
        row["notes"] = notes
    forced, fnotes = forced_summary(seqs)
    if forced is not None:  # its own verdict beside the rule's (which stands)
        row["forced_routing"] = forced
        row["notes"] = row.get("notes", []) + fnotes
    if extra:
        row.update(extra)
    if row.get("forced_routing_error"):
        row["notes"] = row.get("notes", []) + [f"forced routing not run: {row['forced_routing_error']}"]
    rc = row.get("rope_check")
    if rc is not None:
        row["rope"] = rope_cell(rc)
        if not rc.get("pass"):
            row["pass"] = False
            row["failures"] = fails + [f"manifest vs transformers: {p}" for p in (rc.get("problems") or ["failed"])[:4]]
    return row


def rope_cell(rc):
    """The table cell of a manifest check (families.rope_check): ok, ok with the count of
    frequencies 1 ulp off, FAIL, or the error."""
    if rc.get("error"):
        return "err"
    if not rc.get("pass"):
        return "FAIL"
    n = rc.get("inexact", 0)
    return "ok" if not n else f"ok ({n} 1ulp)"


# ============================================================================ MoE routing diagnostic
# Explains, never judges: for a shape whose transformers model has sparse-MoE blocks, which
# experts the fp32 and bf16 references route each position to, and how close the fp32 router was
# to choosing others. A near-tie in the fp32 router is a discontinuity: kern and the bf16
# reference may each land on either side of it, and the logits after it differ by an expert's
# output, not by rounding. The verdict stays the rule's (a failing step FAILs); this only says,
# at the worst and at every failing step, whether such a discontinuity sits at that position.
#
# Per MoE layer and position (batch row), from the fp32 router logits l (before the softmax, which
# is monotonic, so the top-k set on l is the top-k set on the probabilities):
#   margin     = l_(k) - l_(k+1), the k-th largest minus the (k+1)-th (inf when k = num experts);
#   rel margin = margin / max_e |l_e| (the row's largest |router logit|);
#   near-tie   iff rel margin < TIE_REL = 2^-7: the two logits are within about one bf16 ulp of
#              the row's scale (bf16 keeps 8 significant bits: its spacing is 2^-7 relative at
#              most), so bf16 rounding of the logits or of the hidden state feeding them can swap
#              them — "tied within bf16" in issue 26's words;
#   bf16 flip  iff the bf16 reference's top-k SET differs from fp32's (order within it ignored);
#              taken from the router's own chosen indices where it returns them (transformers 5's
#              TopKRouter), else torch.topk of the fp32 softmax as transformers 4's block does.
# Only margins, scales and top-k sets are kept (float32 [T] and int16 [T, k] per layer), never
# the [T, experts] logits.
TIE_REL = 2.0 ** -7


def router_stats(logits, k, chosen=None):
    """One MoE layer of one sequence: logits [T, E] router logits (rows = positions) -> margin
    float32 [T] (k-th largest - (k+1)-th), scale float32 [T] (max |logit| of the row), topk
    int16 [T, k] (the chosen set, sorted ascending). chosen: [T, k] indices the model picked
    (its own tie-breaking) or None: the k largest logits (stable: the lower index wins a tie)."""
    import numpy as np
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 2:
        x = x.reshape(-1, x.shape[-1])
    t, e = x.shape
    k = int(k)
    if not 0 < k <= e:
        raise ValueError(f"top-k {k} with {e} experts")
    order = np.argsort(-x, axis=1, kind="stable")
    srt = np.take_along_axis(x, order, axis=1)
    margin = srt[:, k - 1] - srt[:, k] if k < e else np.full(t, np.inf)
    scale = np.abs(x).max(axis=1) if e else np.zeros(t)
    top = order[:, :k] if chosen is None else np.asarray(chosen).reshape(t, k)
    return {"margin": margin.astype(np.float32), "scale": scale.astype(np.float32),
            "topk": np.sort(top, axis=1).astype(np.int16)}


def rel_margin(st):
    """margin / scale of router_stats, inf where undefined (a zero row, NaN)."""
    import numpy as np
    m = np.asarray(st["margin"], np.float64)
    s = np.asarray(st["scale"], np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s > 0, m / np.where(s > 0, s, 1.0), np.where(m > 0, np.inf, 0.0))
    return np.where(np.isnan(r), np.inf, r)


def routing_sequence(r32, r16, prompt_len, ratio):
    """One sequence's routing: r32 / r16 {layer: router_stats} of the fp32 / bf16 references
    (r16 None: not captured), rows = positions 0..T-1 of prompt + generated[:-1]; ratio: the
    rule's per-step e_kern / bound (step j <-> position prompt_len - 1 + j). Per step: the
    smallest relative margin over the MoE layers at that position, its layer and absolute margin,
    whether bf16's set differs from fp32's at that layer and at any layer; over all positions:
    near-tie positions and bf16 flips. Plain Python values (JSON-ready)."""
    import numpy as np
    layers = sorted(r32)
    if not layers:
        return None
    t = len(r32[layers[0]]["margin"])
    n = len(ratio)
    pos = prompt_len - 1 + np.arange(n)
    if n and pos[-1] >= t:
        raise ValueError(f"routing of {t} positions, steps need position {pos[-1]}")
    rel = np.stack([rel_margin(r32[l]) for l in layers])                     # [L, T]
    mar = np.stack([np.asarray(r32[l]["margin"], np.float64) for l in layers])
    tie = rel < TIE_REL
    flip = None
    if r16:
        common = [l for l in layers if l in r16]
        if common != layers or any(len(r16[l]["topk"]) != t for l in layers):
            raise ValueError(f"bf16 routing of layers {sorted(r16)} / positions differs from fp32's ({layers}, {t})")
        flip = np.stack([(np.asarray(r32[l]["topk"]) != np.asarray(r16[l]["topk"])).any(axis=1) for l in layers])
    li = rel[:, pos].argmin(axis=0) if n else np.zeros(0, int)               # [n]: the layer of the min
    steps = []
    for j in range(n):
        p, a = int(pos[j]), int(li[j])
        s = {"step": j, "position": p, "ratio": float(ratio[j]), "min_rel_margin": float(rel[a, p]),
             "min_margin": float(mar[a, p]), "layer": int(layers[a]), "near_tie": bool(tie[a, p]),
             "near_tie_layers": [int(layers[q]) for q in np.nonzero(tie[:, p])[0]]}
        if flip is not None:
            s["bf16_routing_differs"] = bool(flip[a, p])
            s["bf16_differs_layers"] = [int(layers[q]) for q in np.nonzero(flip[:, p])[0]]
        else:
            s["bf16_routing_differs"] = None
        steps.append(s)
    return {"layers": [int(l) for l in layers], "top_k": int(np.asarray(r32[layers[0]]["topk"]).shape[1]),
            "positions": t, "steps": steps,
            "near_tie_steps": [s["step"] for s in steps if s["near_tie"]],
            "near_tie_positions": int(tie.any(axis=0).sum()),
            "near_tie_layer_positions": int(tie.sum()),
            "bf16_routing_flips": None if flip is None else int(flip.sum()),
            "bf16_flip_positions": None if flip is None else int(flip.any(axis=0).sum()),
            "bf16_flip_steps": None if flip is None else [j for j in range(n) if flip[:, pos[j]].any()]}


def routing_note(i, s):
    """The printed line of one step, e.g. "seq0 step 7 (ratio 1.026, FAILS the rule): router
    margin 3.1e-04 (rel 2.0e-04 < 2^-7: near-tie) at layer 5 (bf16 picks other experts: yes)"."""
    yn = {True: "yes", False: "no", None: "not captured"}[s["bf16_routing_differs"]]
    other = [l for l in (s.get("bf16_differs_layers") or []) if l != s["layer"]]
    return (f"seq{i} step {s['step']} (ratio {s['ratio']:.3f}{', FAILS the rule' if s['ratio'] > 1.0 else ''}): "
            f"router margin {s['min_margin']:.1e} (rel {s['min_rel_margin']:.1e}"
            f"{' < 2^-7: near-tie' if s['near_tie'] else ''}) at layer {s['layer']} "
            f"(bf16 picks other experts: {yn}{'; bf16 also differs at layers ' + ','.join(map(str, other)) if other else ''})")


def routing_summary(seqs, max_steps=40):
    """The shape row's `routing` (None when no sequence has routing: a dense model) and its notes:
    the counts over all positions, the near-tie steps per sequence, and per sequence the worst step
    and every failing step (ratio > 1) with its smallest router margin. Explanation only: the
    verdict is untouched."""
    rs = [(i, s["routing"]) for i, s in enumerate(seqs) if s.get("routing")]
    if not rs:
        return None, []
    flips = [r["bf16_routing_flips"] for _, r in rs]
    out = {"tie_rule": "fp32 router logits: (k-th largest - (k+1)-th) < 2^-7 * max|router logit| of the row",
           "tie_rel": TIE_REL, "top_k": rs[0][1]["top_k"], "moe_layers": rs[0][1]["layers"],
           "positions": sum(r["positions"] for _, r in rs),
           "layer_positions": sum(r["positions"] * len(r["layers"]) for _, r in rs),
           "near_tie_positions": sum(r["near_tie_positions"] for _, r in rs),
           "near_tie_steps": {f"seq{i}": r["near_tie_steps"] for i, r in rs},
           "bf16_routing_flips": None if None in flips else sum(flips),
           "bf16_flip_positions": None if None in flips else sum(r["bf16_flip_positions"] for _, r in rs),
           "bf16_flip_steps": {f"seq{i}": r["bf16_flip_steps"] for i, r in rs},
           "worst_steps": [], "failing_steps": [], "n_failing_steps": 0}
    keys = ("step", "ratio", "min_margin", "min_rel_margin", "layer", "near_tie", "bf16_routing_differs", "bf16_differs_layers")
    fail_notes, worst_notes = [], []
    for i, r in rs:
        steps = r["steps"]
        if not steps:
            continue
        w = max(steps, key=lambda s: s["ratio"])
        out["worst_steps"].append(dict({"seq": i}, **{k: w.get(k) for k in keys}))
        for s in steps:
            if s["ratio"] > 1.0:
                out["n_failing_steps"] += 1
                if len(out["failing_steps"]) < max_steps:
                    out["failing_steps"].append(dict({"seq": i}, **{k: s.get(k) for k in keys}))
                fail_notes.append(routing_note(i, s))
        if w["ratio"] <= 1.0:
            worst_notes.append(routing_note(i, w) + " [worst step]")
    n_lp = out["layer_positions"]
    head = (f"routing (top-{out['top_k']}, MoE layers {','.join(map(str, out['moe_layers']))}): fp32 near-ties (rel margin < 2^-7) "
            f"at {out['near_tie_positions']} of {out['positions']} positions; bf16 top-k set differs from fp32's at "
            f"{'?' if out['bf16_routing_flips'] is None else out['bf16_routing_flips']} of {n_lp} layer-positions "
            f"(explains, does not excuse: the rule's verdict stands)")
    return out, [head] + fail_notes + worst_notes


def fmt(x, spec=".4f"):
    if x is None:
        return "?"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


TABLE_COLS = [("shape", 20), ("layers", 6), ("prompts", 14), ("steps", 5), ("worst e/bound", 13), ("max e_kern", 10),
              ("max e_bf16", 10), ("greedy (split@)", 22), ("chunked max diff", 16), ("rope/scale/window", 17),
              ("decode tok/s", 12), ("result", 6)]


def layers_cell(row):
    """Layers run, "8/32" when the shape was cut."""
    n, real = row.get("layers"), row.get("real_layers")
    if n is None:
        return "-"
    return f"{n}/{real}" if real and real != n else str(n)


def table_line(row, shape_width=None):
    if row.get("error"):
        cells = [row["shape"], layers_cell(row), "-", "-", "-", "-", "-", "-", "-", "-", "-", "FAIL"]
    else:
        cells = [row["shape"], layers_cell(row), row["prompts"], str(row["steps"]), fmt(row["worst_ratio"], ".3f"),
                 fmt(row["max_e_kern"]), fmt(row["max_e_bf16"]), row["greedy"],
                 fmt(row["chunked_max_diff"], ".3g"), row.get("rope") or "-", fmt(row["decode_tok_s"], ".1f"),
                 "PASS" if row["pass"] else "FAIL"]
    widths = [shape_width or TABLE_COLS[0][1]] + [w for _, w in TABLE_COLS[1:]]
    return " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))


def format_table(rows):
    w0 = max([TABLE_COLS[0][1]] + [len(r["shape"]) for r in rows])
    head = " | ".join(n.ljust(w0 if i == 0 else w) for i, (n, w) in enumerate(TABLE_COLS))
    out = [head, "-" * len(head)]
    out += [table_line(r, w0) for r in rows]
    for r in rows:
        if r.get("error"):
            out.append(f"  {r['shape']}: ERROR {r['error']}")
        for f in r.get("failures", [])[:8]:
            out.append(f"  {r['shape']}: {f}")
        for nt in r.get("notes", [])[:10]:
            out.append(f"  {r['shape']}: note: {nt}")
    return "\n".join(out)


# ============================================================================ kern's side
_RATE = re.compile(r"([0-9][0-9,_]*(?:\.[0-9]+)?)\s*(k?)\s*tok(?:en)?s?\s*/\s*s", re.I)


def parse_rates(text):
    """{'prefill': tok/s, 'decode': tok/s} from kern's stderr: each 'N tok/s' (or tokens/s,
    k tok/s) belongs to the nearest 'prefill' / 'decode' before it on its line."""
    rates = {}
    for line in text.splitlines():
        low = line.lower()
        for m in _RATE.finditer(line):
            before = low[:m.start()]
            kw = max(("prefill", "decode"), key=lambda k: before.rfind(k))
            if before.rfind(kw) < 0:
                continue
            v = float(m.group(1).replace(",", "").replace("_", ""))
            rates[kw] = v * (1000.0 if m.group(2) else 1.0)
    return rates


def read_dump(dump_dir, prompts, steps, vocab):
    """kern's --dump: (tokens per sequence, logits [steps, vocab] float32 per sequence),
    checked against the prompts it was given and the step count."""
    import numpy as np
    with open(os.path.join(dump_dir, "tokens.json")) as f:
        t = json.load(f)
    got_prompts = [[int(x) for x in p] for p in t["prompts"]]
    if got_prompts != [list(map(int, p)) for p in prompts]:
        raise ValueError(f"{dump_dir}/tokens.json: prompts differ from the ones given "
                         f"(lengths {[len(p) for p in got_prompts]} vs {[len(p) for p in prompts]})")
    outs = [[int(x) for x in o] for o in t["outputs"]]
    if len(outs) != len(prompts):
        raise ValueError(f"{dump_dir}/tokens.json: {len(outs)} outputs for {len(prompts)} prompts")
    logits = []
    for i, o in enumerate(outs):
        if len(o) != steps:
            raise ValueError(f"{dump_dir}: sequence {i} generated {len(o)} tokens, expected {steps} (--ignore-eos)")
        a = np.load(os.path.join(dump_dir, f"seq{i}.logits.npy"))
        if a.shape != (steps, vocab):
            raise ValueError(f"{dump_dir}/seq{i}.logits.npy: shape {a.shape}, expected {(steps, vocab)}")
        logits.append(np.asarray(a, dtype=np.float32))
    return outs, logits


class Kern:
    def __init__(self, exe, timeout, logdir, outlogdir=None):
        self.exe, self.timeout, self.logdir, self.outlogdir = exe, timeout, logdir, outlogdir

    def __call__(self, name, argv, show_tail=0):
        cmd = [self.exe] + [str(a) for a in argv]
        shown = " ".join(c if len(c) <= 60 else f"{c[:40]}...({c.count(',') + 1} ids)" for c in cmd)
        log(f"  $ {shown}")
        t = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired as e:
            self._save(name, cmd, (e.stdout or b""), (e.stderr or b""), "timeout")
            raise RuntimeError(f"kern {argv[0]} ({name}) ran past --timeout {self.timeout} s")
        dt = time.time() - t
        self._save(name, cmd, p.stdout, p.stderr, p.returncode)
        if p.returncode != 0:
            tail = "\n".join((p.stderr or "").strip().splitlines()[-15:])
            raise RuntimeError(f"kern {argv[0]} ({name}) exited {p.returncode} after {dt:.1f} s:\n{tail}")
        if show_tail:
            for line in (p.stderr or "").strip().splitlines()[-show_tail:]:
                log(f"    | {line[:200]}")
        log(f"    ({dt:.1f} s)")
        return p.stderr or "", dt

    def _save(self, name, cmd, out, err, rc):
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        text = f"$ {' '.join(cmd)}\nexit: {rc}\n--- stdout\n{out}\n--- stderr\n{err}\n"
        for d in (self.logdir, self.outlogdir):
            if d:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, f"{safe_name(name)}.log"), "w") as f:
                    f.write(text)


def step_inputs(model_json, out, ids):
    """One sequence, a prefill of `ids` on pages 0.. in order (per-sequence state slot 0), as
    .npy files for `kern run`; returns its --input arguments (only buffers the manifest has)."""
    import math
    import numpy as np
    m = json.load(open(model_json))
    pages = m["vars"]["pages"]["max"]
    pt = m["states"]["kv"].get("page_tokens", 16)
    n, used = len(ids), math.ceil(len(ids) / pt)
    if used > pages:
        raise ValueError(f"the prompt needs {used} pages, the manifest has {pages}")
    pos = np.arange(n, dtype=np.int32)
    arrays = {
        "token_ids": np.array(ids, np.int32), "positions": pos, "seq_lens": np.array([n], np.int32),
        "query_start": np.array([0, n], np.int32), "slot_mapping": pos.copy(),
        "block_tables": np.array([[p if p < used else -1 for p in range(pages)]], np.int32),
        "last_token": np.array([n - 1], np.int32), "temperature": np.zeros(1, np.float32),
        "top_k": np.zeros(1, np.int32), "top_p": np.ones(1, np.float32), "seeds": np.zeros(1, np.uint64),
        "mask_rows": np.full(1, -1, np.int32), "seq_slots": np.zeros(1, np.int32),
    }
    os.makedirs(out, exist_ok=True)
    args = []
    for key, v in arrays.items():
        if key in m["buffers"]:
            p = os.path.join(out, key + ".npy")
            np.save(p, v)
            args += ["--input", f"{key}={p}"]
    return args


def cut_after(model_json, label, out):
    """The manifest with its program cut after the call `label` (no other programs, no draft)."""
    m = json.load(open(model_json))
    calls = m["program"]["calls"]
    idx = next(i for i, c in enumerate(calls) if c.get("label") == label)
    m["program"]["calls"] = calls[: idx + 1]
    m.pop("programs", None)
    m.pop("speculative", None)
    with open(out, "w") as f:
        json.dump(m, f)


def moe_select_labels(model_json):
    """{MoE layer index: the label of its `lL.moe_select` call} of a manifest ({} when dense)."""
    calls = json.load(open(model_json))["program"]["calls"]
    return {int(c["label"][1:].split(".")[0]): c["label"] for c in calls if c.get("label", "").endswith(".moe_select")}


ROUTE_WHY = ("kern's experts are read back by one prefill of prompt + tokens; they are the experts its "
             "generate run chose only when every row's bits are the same at any step size")


def route_pack(kern, name, model_dir, route_dir, kernels, max_tokens, max_context, pack_args):
    """The manifest kern_routing runs: the model packed again into route_dir (weights stay in
    model_dir) for one sequence of up to max_tokens tokens in one step. The model's own manifest
    must declare batch_invariant (kern pack --batch-invariant), else ValueError."""
    if not json.load(open(os.path.join(model_dir, "model.json"))).get("batch_invariant"):
        raise ValueError(f"--forced-routing needs --pack-arg --batch-invariant ({ROUTE_WHY})")
    os.makedirs(route_dir, exist_ok=True)
    kern(f"{name}.route-pack", ["pack", "--config", os.path.join(model_dir, "config.json"), "-o", route_dir,
                                "--kernels", kernels, "--max-tokens", max_tokens, "--max-seqs", 1,
                                "--max-context", max_context] + list(pack_args))
    return os.path.join(route_dir, "model.json")


def kern_routing(kern, name, route_json, model_dir, seq_ids):
    """Per sequence, {MoE layer: kern's expert ids int [T, k]} at every position of seq_ids[i]
    (prompt + generated[:-1]): one `kern run` of the manifest cut after each `lL.moe_select`,
    the sequence in one step, output moe_ids."""
    import numpy as np
    labels = moe_select_labels(route_json)
    if not labels:
        raise ValueError(f"{route_json}: no moe_select call (not a MoE manifest)")
    work = os.path.dirname(route_json)
    out = []
    for i, ids in enumerate(seq_ids):
        inputs = step_inputs(route_json, os.path.join(work, f"in-{i}"), ids)
        got = {}
        for layer, label in sorted(labels.items()):
            cut = os.path.join(work, f"model.cut-{layer}.json")
            if not os.path.exists(cut):
                cut_after(route_json, label, cut)
            od = os.path.join(work, f"out-{i}-{layer}")
            kern(f"{name}.route-{i}-{layer}", ["run", cut, "--weights", model_dir, "--set", f"tokens={len(ids)}",
                                               "--set", "seqs=1", *inputs, "--output", "moe_ids", "--out-dir", od])
            got[layer] = np.load(os.path.join(od, "moe_ids.npy"))[: len(ids)].astype(np.int64)
        out.append(got)
    return out


def forced_sequence(logits, ref32f, bf16f, routes, r32):
    """The rule against both references routed to kern's experts, for one sequence: per-step
    ratios, worst, pass; and how kern's expert sets compare with the fp32 reference's own choice
    (r32: {layer: router_stats} of the unforced fp32 run, or None): positions and layer-positions
    where they differ, and how many of those the fp32 router had not nearly tied."""
    import numpy as np
    se = step_errors(logits, ref32f, bf16f)
    j = int(se["ratio"].argmax())
    r = {"ratio": [float(x) for x in se["ratio"]], "max_ratio": float(se["ratio"].max()), "worst_step": j,
         "max_e_kern": float(se["e_kern"].max()), "max_e_bf16": float(se["e_bf16"].max()),
         "pass": bool((se["ratio"] <= 1.0).all())}
    if r32:
        diff = untied = 0
        for layer, ids in routes.items():
            if layer not in r32:
                continue
            mine = np.sort(np.asarray(ids), axis=1)
            theirs = np.asarray(r32[layer]["topk"], np.int64)
            d = (mine[: len(theirs)] != theirs).any(axis=1)
            diff += int(d.sum())
            untied += int((d & (rel_margin(r32[layer])[: len(d)] >= TIE_REL)).sum())
        r["kern_vs_fp32_sets_differ"] = diff
        r["kern_vs_fp32_differ_untied"] = untied
    return r


def forced_summary(seqs):
    """The shape row's `forced_routing` and its note (None, [] when no sequence has one)."""
    fs = [(i, s["forced"]) for i, s in enumerate(seqs) if s.get("forced")]
    if not fs:
        return None, []
    worst_i, worst = max(fs, key=lambda x: x[1]["max_ratio"])
    out = {"pass": all(f["pass"] for _, f in fs), "worst_ratio": worst["max_ratio"],
           "worst_at": f"seq{worst_i} step {worst['worst_step']}",
           "kern_vs_fp32_sets_differ": sum(f.get("kern_vs_fp32_sets_differ", 0) for _, f in fs),
           "kern_vs_fp32_differ_untied": sum(f.get("kern_vs_fp32_differ_untied", 0) for _, f in fs)}
    note = (f"forced routing (fp32 and bf16 references routed to kern's experts): worst ratio {out['worst_ratio']:.3f} "
            f"at {out['worst_at']}: {'PASS' if out['pass'] else 'FAIL'}; kern's expert set differs from the fp32 "
            f"reference's own at {out['kern_vs_fp32_sets_differ']} layer-positions, {out['kern_vs_fp32_differ_untied']} "
            f"of them not near-tied in fp32")
    return out, [note]


def make_prompts(lengths, seed, id_max=PROMPT_ID_MAX):
    import numpy as np
    rng = np.random.default_rng(seed)
    return [[int(x) for x in rng.integers(0, id_max, size=n)] for n in lengths]


def gen_args(model_dir, prompts, steps, dump, chunk=None, extra=()):
    a = ["generate", "--model", model_dir]
    for p in prompts:
        a += ["--prompt-ids", ",".join(map(str, p))]
    a += ["--max-tokens", steps, "--temperature", "0", "--ignore-eos", "--dump", dump]
    if chunk:
        a += ["--chunk", chunk]
    return a + list(extra)


# ============================================================================ transformers' side
def torch_setup(device):
    import torch
    try:
        torch.set_float32_matmul_precision("highest")  # ref32 is real fp32: no TF32
    except Exception as e:  # noqa: BLE001
        log(f"  (set_float32_matmul_precision: {e})")
    info = {"torch": torch.__version__, "device": device}
    try:
        import transformers
        info["transformers"] = transformers.__version__
        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
        info["fp32_matmul_precision"] = torch.get_float32_matmul_precision()
        info["bf16_reduced_precision_reduction"] = bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    return info


def load_hf(model_dir, dtype, device, attn):
    """AutoModelForCausalLM from the directory kern also loads; refuses missing or unexpected
    weights (a randomly initialized tensor would make the whole comparison meaningless) and
    spot-checks two tensors against the safetensors files."""
    import torch
    from transformers import AutoModelForCausalLM
    t = time.time()
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn,
                                                       output_loading_info=True)
    missing = set(info.get("missing_keys") or ()) - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise RuntimeError(f"transformers did not load the checkpoint cleanly: {info}")
    model = model.to(device).eval()
    for name in ("model.norm.weight", "model.layers.0.self_attn.q_proj.weight"):
        want = read_tensor(model_dir, name).to(device=device, dtype=dtype)
        got = model.get_parameter(name)
        if not torch.equal(got.detach(), want):
            raise RuntimeError(f"transformers' {name} differs from the safetensors file")
    return model, time.time() - t


def read_tensor(model_dir, name):
    from safetensors import safe_open
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            fname = json.load(f)["weight_map"][name]
    else:
        fname = "model.safetensors"
    with safe_open(os.path.join(model_dir, fname), framework="pt") as f:
        return f.get_tensor(name)


def moe_blocks(model):
    """The model's sparse-MoE blocks: [(layer index, module name, gate module, top_k)] for every
    module whose class name contains "SparseMoe" with a `gate` holding a 2-D weight [experts,
    hidden] (Qwen2/3-MoE, Qwen3-Next, Mixtral; transformers 4's nn.Linear gate or 5's TopKRouter);
    top_k from the block, its gate, else the config's num_experts_per_tok. Empty: a dense model."""
    cfg = getattr(model, "config", None)
    get_text = getattr(cfg, "get_text_config", None)
    tcfg = get_text() if callable(get_text) else cfg
    k_cfg = getattr(tcfg, "num_experts_per_tok", None) or getattr(cfg, "num_experts_per_tok", None)
    out = []
    for name, mod in model.named_modules():
        if "SparseMoe" not in type(mod).__name__:
            continue
        gate = getattr(mod, "gate", None)
        w = getattr(gate, "weight", None)
        if gate is None or w is None or len(getattr(w, "shape", ())) != 2:
            continue
        k = getattr(mod, "top_k", None) or getattr(gate, "top_k", None) or k_cfg
        if not k:
            continue
        m = re.search(r"(?:^|\.)layers\.(\d+)(?:\.|$)", name)
        out.append((int(m.group(1)) if m else len(out), name, gate, int(k)))
    return out


class GateHooks:
    """Forward hooks on every MoE gate of moe_blocks(model) while the context is entered; a
    subclass gives `_hook(layer, k)` and `_reset()` (run on exit)."""

    def __init__(self, model):
        self.blocks = moe_blocks(model)
        self.handles = []

    @staticmethod
    def gate_logits(mod, args, kwargs):
        """The router logits a gate computes from its input: F.linear(h, W) in the model's dtype."""
        import torch.nn.functional as F
        w = mod.weight
        h = args[0] if args else next(iter(kwargs.values()))
        return F.linear(h.reshape(-1, w.shape[1]), w, getattr(mod, "bias", None))

    def __enter__(self):
        for layer, _, gate, k in self.blocks:
            self.handles.append(gate.register_forward_hook(self._hook(layer, k), with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []
        self._reset()


class RoutingCapture(GateHooks):
    """Forward hooks on every MoE gate of moe_blocks(model) while a sequence runs: per layer,
    router_stats of the router logits (F.linear of the gate's input and weight, in the model's
    dtype, as transformers computes them; or the gate's output where the gate is a plain Linear)
    and the experts the model chose (the router's returned indices, else torch.topk of the fp32
    softmax as transformers 4's block does). Only the stats leave the GPU's [T, experts] logits."""

    def __init__(self, model):
        super().__init__(model)
        self.current, self.errors = None, []

    def _reset(self):
        self.current = None

    def _hook(self, layer, k):
        def hook(mod, args, kwargs, output):
            if self.current is None:
                return
            try:
                self._capture(layer, k, mod, args, kwargs, output)
            except Exception as e:  # noqa: BLE001 -- a diagnostic never breaks the forward it watches
                self.errors.append(f"layer {layer}: {type(e).__name__}: {e}"[:300])
        return hook

    def _capture(self, layer, k, mod, args, kwargs, output):
        import torch
        if isinstance(mod, torch.nn.Linear) and isinstance(output, torch.Tensor):  # the logits themselves
            logits = output.reshape(-1, mod.weight.shape[0])
        else:
            logits = self.gate_logits(mod, args, kwargs)
        chosen = None
        if isinstance(output, (tuple, list)):
            for x in output:
                if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.shape[-1] == k \
                        and x.numel() == logits.shape[0] * k:
                    chosen = x.reshape(-1, k)
        if chosen is None:
            chosen = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), k, dim=-1).indices
        self.current[layer] = router_stats(logits.float().cpu().numpy(), k, chosen.cpu().numpy())


class ForcedRouting(GateHooks):
    """Forward hooks on every MoE gate of moe_blocks(model) that route each position to given
    experts: the gate's returned indices [T, k] are replaced by the forced ones and its returned
    weights by the model's own probabilities of those experts (softmax in fp32 of the router
    logits F.linear(h, W) in the model's dtype, renormalised over the k when the gate's or the
    config's norm_topk_prob says so, cast to the weights' dtype) — what transformers 5's
    TopKRouter computes for its own top-k, for another set. Everything after the router runs
    unchanged. Needs a gate that returns its indices (transformers 5); a transformers 4 Linear
    gate raises. set(routes, T) before each forward, done() after it: every hook must have fired
    once with T positions."""

    def __init__(self, model):
        super().__init__(model)
        if not self.blocks:
            raise ValueError("forced routing: the model has no sparse-MoE block")
        cfg = getattr(model, "config", None)
        get_text = getattr(cfg, "get_text_config", None)
        tcfg = get_text() if callable(get_text) else cfg
        self.norm_cfg = bool(getattr(tcfg, "norm_topk_prob", False))
        self.routes, self.t, self.fired = None, None, set()

    def _reset(self):
        self.routes = None

    def set(self, routes, t):
        missing = [l for l, _, _, _ in self.blocks if l not in routes]
        if missing:
            raise ValueError(f"forced routing: no expert ids for MoE layers {missing}")
        self.routes, self.t, self.fired = routes, t, set()

    def done(self):
        want = {l for l, _, _, _ in self.blocks}
        if self.fired != want:
            raise RuntimeError(f"forced routing: hooks fired at layers {sorted(self.fired)}, MoE layers {sorted(want)}")
        self.routes = None

    def _hook(self, layer, k):
        def hook(mod, args, kwargs, output):
            return self._force(layer, k, mod, args, kwargs, output)
        return hook

    def _force(self, layer, k, mod, args, kwargs, output):
        import torch
        if self.routes is None:
            return None
        if not isinstance(output, (tuple, list)):
            raise RuntimeError(f"forced routing: layer {layer}'s gate {type(mod).__name__} returns no indices "
                               "(transformers 4's Linear gate); needs transformers 5")
        out = list(output)
        i_idx = [j for j, x in enumerate(out) if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.shape[-1] == k]
        i_w = [j for j, x in enumerate(out) if isinstance(x, torch.Tensor) and x.is_floating_point() and x.shape[-1] == k]
        if len(i_idx) != 1 or len(i_w) != 1:
            raise RuntimeError(f"forced routing: layer {layer}'s gate output {[tuple(getattr(x, 'shape', ())) for x in out]}: "
                               f"cannot tell its indices and weights [T, {k}] apart")
        idx, wts = out[i_idx[0]], out[i_w[0]]
        forced = torch.as_tensor(self.routes[layer], device=idx.device).to(idx.dtype).reshape(-1, k)
        if forced.shape[0] != idx.reshape(-1, k).shape[0] or forced.shape[0] != self.t:
            raise RuntimeError(f"forced routing: layer {layer}: {forced.shape[0]} forced rows, the gate routed "
                               f"{idx.reshape(-1, k).shape[0]} positions of {self.t}")
        probs = torch.softmax(self.gate_logits(mod, args, kwargs), dim=-1, dtype=torch.float)
        top = probs.gather(1, forced.long())
        norm = getattr(mod, "norm_topk_prob", None)
        if norm is None:
            norm = self.norm_cfg
        if norm:
            top = top / top.sum(dim=-1, keepdim=True)
        out[i_idx[0]] = forced.reshape(idx.shape)
        out[i_w[0]] = top.to(wts.dtype).reshape(wts.shape)
        self.fired.add(layer)
        return type(output)(out) if isinstance(output, tuple) else out


def teacher_forced(model, prompts, gen_toks, device, routing=None, force=None):
    """Rows [n, vocab] float32 per sequence: the logits at positions len(prompt)-1+j, j < n,
    of one forward over prompt + gen[:n-1] (no cache), i.e. the logits that choose gen[j].
    routing: a list, or None; a list gets one {layer: router_stats} per sequence (every position
    of the forward) when the model has sparse-MoE blocks, and stays empty otherwise.
    force: None, or per sequence {MoE layer: expert ids [T, k]} (kern_routing): every MoE block
    routes position t to those experts (ForcedRouting) instead of its own top-k."""
    import contextlib
    import torch
    rows = []
    cap = RoutingCapture(model) if routing is not None else None
    if cap is not None and not cap.blocks:
        cap = None
    fr = ForcedRouting(model) if force is not None else None
    with torch.inference_mode(), (cap if cap is not None else contextlib.nullcontext()), \
            (fr if fr is not None else contextlib.nullcontext()):
        for i, (p, g) in enumerate(zip(prompts, gen_toks)):
            n = len(g)
            ids = torch.tensor([list(p) + list(g[:n - 1])], device=device)
            if fr is not None:
                fr.set(force[i], ids.shape[1])
            if cap is not None:
                cap.current = {}
            try:  # the last n positions only: a long prompt's full [len, vocab] fp32 logits are GBs
                logits = model(input_ids=ids, use_cache=False, logits_to_keep=n).logits
            except TypeError:
                logits = model(input_ids=ids, use_cache=False).logits
            assert logits.shape[1] in (n, len(p) + n - 1), logits.shape
            rows.append(logits[0, -n:].float().cpu().numpy())
            del logits
            if fr is not None:
                fr.done()
            if cap is not None:  # an incomplete capture drops this sequence's diagnostic, never the run
                got = cap.current
                if cap.errors or len(got) != len(cap.blocks) or any(len(st["margin"]) != ids.shape[1] for st in got.values()):
                    log(f"  routing capture incomplete (diagnostic dropped for this sequence): {len(got)} of "
                        f"{len(cap.blocks)} MoE layers, positions {sorted(set(len(st['margin']) for st in got.values()))} "
                        f"for {ids.shape[1]} tokens {cap.errors[:2]}")
                    got = None
                    cap.errors = []
                routing.append(got)
    return rows


def hf_greedy(model, prompts, steps, device):
    """transformers' own greedy generation with its KV cache, one prompt at a time. EOS is
    neither a stop nor masked (eos_token_id=None), as kern's --ignore-eos. Also returns, per
    step, the top-k ids of transformers' raw logits, and whether each token is their argmax."""
    import torch
    gc = model.generation_config
    gc.eos_token_id = None
    gc.pad_token_id = PAD_ID
    toks, topk, consistent = [], [], True
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p], device=device)
            o = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps,
                               output_logits=True, return_dict_in_generate=True)
            t = [int(x) for x in o.sequences[0, len(p):].tolist()]
            tk = [[int(x) for x in torch.topk(l[0].float(), TOPK).indices.tolist()] for l in o.logits]
            am = [int(l[0].float().argmax()) for l in o.logits]
            consistent = consistent and am[:len(t)] == t
            toks.append(t)
            topk.append(tk)
            del o
    return toks, topk, consistent


def free_cuda():
    import gc
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


def hf_side(model_dir, prompts, kern_toks, steps, device, attn, force=None):
    """ref32 rows, bf16 rows, HF bf16 greedy tokens + top-k, the manifest check (RoPE, scales,
    windows) against the fp32 model, and timings. One model on the GPU at a time (fp32 first),
    freed before returning. force (kern_routing's expert ids per sequence): also ref32f / bf16f,
    both references routed to kern's experts (ForcedRouting)."""
    import torch
    out = {}
    m, t = load_hf(model_dir, torch.float32, device, attn)
    out["attn_implementation"] = m.config._attn_implementation
    out["rope"] = str(getattr(m.config, "rope_parameters", None))
    out["load_fp32_s"] = round(t, 2)
    try:
        import families
        out["rope_check"] = families.rope_check(os.path.join(model_dir, "model.json"), families.hf_layers(m))
    except Exception as e:  # noqa: BLE001 -- reported in the row as an error
        traceback.print_exc()
        out["rope_check"] = {"pass": False, "error": f"{type(e).__name__}: {e}"[:300], "problems": [f"{type(e).__name__}: {e}"[:300]]}
    t = time.time()
    blocks = moe_blocks(m)
    if blocks:
        log(f"  routing diagnostic: {len(blocks)} sparse-MoE blocks ({type(m.get_submodule(blocks[0][1])).__name__}, "
            f"gate {type(blocks[0][2]).__name__}, top-{blocks[0][3]}) at layers {[b[0] for b in blocks]}")
    out["routing32"] = [] if blocks else None
    out["ref32"] = teacher_forced(m, prompts, kern_toks, device, routing=out["routing32"])
    out["fp32_forward_s"] = round(time.time() - t, 2)
    if force is not None:
        try:
            out["ref32f"] = teacher_forced(m, prompts, kern_toks, device, force=force)
        except Exception as e:  # noqa: BLE001 -- the forced check fails alone; the rule's rows stand
            traceback.print_exc()
            out["forced_error"] = f"fp32 forced forward: {type(e).__name__}: {e}"[:400]
            force = None
    del m
    free_cuda()
    m, t = load_hf(model_dir, torch.bfloat16, device, attn)
    out["load_bf16_s"] = round(t, 2)
    t = time.time()
    out["routing16"] = [] if blocks else None
    out["bf16"] = teacher_forced(m, prompts, kern_toks, device, routing=out["routing16"])
    out["bf16_forward_s"] = round(time.time() - t, 2)
    if force is not None:
        try:
            out["bf16f"] = teacher_forced(m, prompts, kern_toks, device, force=force)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            out["forced_error"] = f"bf16 forced forward: {type(e).__name__}: {e}"[:400]
            out.pop("ref32f", None)
    t = time.time()
    try:
        out["hf_toks"], out["hf_topk"], out["hf_argmax_consistent"] = hf_greedy(m, prompts, steps, device)
    except Exception as e:  # noqa: BLE001 -- the logits parity still stands; greedy FAILs with this
        traceback.print_exc()
        out["hf_toks"], out["hf_topk"], out["hf_argmax_consistent"] = f"transformers generate: {type(e).__name__}: {e}"[:400], None, True
    out["hf_generate_s"] = round(time.time() - t, 2)
    del m
    free_cuda()
    return out


# ============================================================================ one shape
def shape_settings(shape, a):
    """The run's settings for one shape: the command line's explicit values, else the shape's,
    else the defaults; the context and step sizes checked against the prompts."""
    st = {
        "steps": a.steps or shape.get("steps") or DEFAULT_STEPS,
        "lengths": list(a.lengths_list or shape.get("lengths") or DEFAULT_LENGTHS),
        "attn": a.attn or shape.get("attn") or "sdpa",
        "pack_max_tokens": a.pack_max_tokens or shape.get("pack_max_tokens") or 256,
        "layers": a.layers or shape.get("layers"),
    }
    need = max(st["lengths"]) + st["steps"]
    mc = a.max_context or shape.get("max_context")
    st["max_context"] = mc or max(1024, -(-need // 256) * 256)
    if len(st["lengths"]) > a.max_seqs or min(st["lengths"]) < 1:
        raise ValueError(f"prompt lengths {st['lengths']}: 1..{a.max_seqs} positive lengths (--max-seqs)")
    if need > st["max_context"]:
        raise ValueError(f"longest prompt {max(st['lengths'])} + {st['steps']} steps > max context {st['max_context']}")
    if st["steps"] < 1:
        raise ValueError("steps must be positive")
    return st


def run_shape(shape, a, kern, shape_dir, presets):
    t0 = time.time()
    name = shape["name"]
    st = shape_settings(shape, a)
    steps = st["steps"]
    model_dir = os.path.join(shape_dir, "model")
    shutil.rmtree(shape_dir, ignore_errors=True)
    os.makedirs(shape_dir)
    real_layers = presets[shape["preset"]]["num_hidden_layers"]
    if shape["config"] or st["layers"]:
        # The preset's config with the shape's overrides and layer count, through --config
        # (random-weights' own --layers keeps the preset's per-layer lists, e.g. Gemma's).
        src = os.path.join(shape_dir, "src-config.json")
        write_json(src, shape_config(shape, presets, st["layers"]))
        kern(f"{name}.random-weights", ["random-weights", "--config", src, "-o", model_dir, "--seed", a.seed])
    else:
        kern(f"{name}.random-weights", ["random-weights", "--preset", shape["preset"], "-o", model_dir, "--seed", a.seed])
    kern(f"{name}.pack", ["pack", "--config", os.path.join(model_dir, "config.json"), "-o", model_dir,
                          "--kernels", a.kernels, "--max-tokens", st["pack_max_tokens"], "--max-seqs", a.max_seqs,
                          "--max-context", st["max_context"]] + a.pack_arg)
    route_json, routes, route_err = None, None, None
    if a.forced_routing:  # packed now: hf_config_fixups below rewrites config.json for transformers
        try:
            route_json = route_pack(kern, name, model_dir, os.path.join(shape_dir, "route"), a.kernels,
                                    max(st["lengths"]) + steps, st["max_context"], a.pack_arg)
        except Exception as e:  # noqa: BLE001 -- the forced check fails alone, the rule's checks still run
            route_err = f"{type(e).__name__}: {e}"[:400]
            log(f"  forced routing: {route_err}")
    fixups = hf_config_fixups(model_dir)
    if fixups:
        log(f"  config.json as kern wrote it is refused by transformers' strict config; rewritten: {', '.join(fixups)}")
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    vocab = int(cfg["vocab_size"])
    prompts = make_prompts(st["lengths"], a.seed, prompt_id_max(vocab))
    log(f"  {name}: {shape['why'] or shape['preset']}; layers {cfg.get('num_hidden_layers')} of {real_layers}, "
        f"sliding_window {cfg.get('sliding_window')}, rope {cfg.get('rope_scaling') or cfg.get('rope_parameters')}, "
        f"prompts {st['lengths']} ids < {prompt_id_max(vocab)}, {steps} steps, max context {st['max_context']}")
    t_prep = time.time() - t0

    d1, d2, d3 = (os.path.join(shape_dir, x) for x in ("dump", "dump-chunk16", "dump-single"))
    err1, _ = kern(f"{name}.generate", gen_args(model_dir, prompts, steps, d1, extra=a.kern_arg), show_tail=6)
    rates = parse_rates(err1)
    run1 = read_dump(d1, prompts, steps, vocab)
    n2 = min(4, steps)

    def side_run(name, ps, d, chunk=None, tail=0):
        """A chunked-prefill run; its failure fails the chunked check, not the whole shape."""
        try:
            kern(f"{shape['name']}.{name}", gen_args(model_dir, ps, n2, d, chunk=chunk, extra=a.kern_arg), show_tail=tail)
            return read_dump(d, ps, n2, vocab)
        except Exception as e:  # noqa: BLE001
            msg = " / ".join(x.strip() for x in str(e).splitlines() if x.strip())[:400]
            log(f"  {name} FAILED: {type(e).__name__}: {msg}")
            return f"{type(e).__name__}: {msg}"

    run2 = side_run("generate-chunk16", prompts, d2, chunk=16, tail=3)
    i_long = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    single = None
    if len(prompts[i_long]) <= st["pack_max_tokens"]:
        single = side_run("generate-single", [prompts[i_long]], d3)
    t_kern = time.time() - t0 - t_prep
    log(f"  kern tokens (first 8 of each): {[o[:8] for o in run1[0]]}")

    if route_json is not None:
        try:
            routes = kern_routing(kern, name, route_json, model_dir, [list(p) + list(g[:len(g) - 1]) for p, g in zip(prompts, run1[0])])
        except Exception as e:  # noqa: BLE001
            route_err = f"{type(e).__name__}: {' / '.join(x.strip() for x in str(e).splitlines() if x.strip())}"[:400]
            log(f"  forced routing: kern's experts not read: {route_err}")
    t = time.time()
    hf = hf_side(model_dir, prompts, run1[0], steps, a.device, st["attn"], force=routes)
    t_hf = time.time() - t
    log(f"  transformers: attn={hf['attn_implementation']} rope={hf['rope']} load fp32 {hf['load_fp32_s']} s, "
        f"bf16 {hf['load_bf16_s']} s; generate {hf['hf_generate_s']} s")

    seqs = []
    for i, p in enumerate(prompts):
        s1 = None
        if single is not None and i == i_long:
            s1 = single if isinstance(single, str) else (single[0][0], single[1][0])
        r2 = run2 if isinstance(run2, str) else (run2[0][i], run2[1][i])
        hf_t = hf["hf_toks"] if isinstance(hf["hf_toks"], str) else hf["hf_toks"][i]
        hf_k = None if isinstance(hf["hf_toks"], str) else hf["hf_topk"][i]
        r = evaluate_sequence(p, (run1[0][i], run1[1][i]), r2, hf["ref32"][i], hf["bf16"][i], hf_t, hf_k, run_single=s1)
        r["kern_tokens"] = run1[0][i]
        r["hf_tokens"] = hf_t
        if hf.get("routing32") and hf["routing32"][i]:  # a sparse-MoE model: the routing diagnostic (explains, never judges)
            r16 = hf["routing16"][i] if hf.get("routing16") else None
            try:
                r["routing"] = routing_sequence(hf["routing32"][i], r16, len(p), r["ratio"])
            except Exception as e:  # noqa: BLE001 -- the diagnostic never changes the verdict, nor stops it
                log(f"  seq{i}: routing diagnostic failed: {type(e).__name__}: {e}")
        if routes is not None and "bf16f" in hf:
            r["forced"] = forced_sequence(run1[1][i], hf["ref32f"][i], hf["bf16f"][i], routes[i],
                                          hf["routing32"][i] if hf.get("routing32") else None)
        seqs.append(r)
        g = r["greedy"]
        split = g["error"] if "error" in g else "none" if g["first_split"] is None else f"step {g['first_split']} (gap {g['gap']:.4f} vs bound {g['bound']:.4f}, top{TOPK} mutual {g.get('topk_mutual')})"
        log(f"  seq{i} len {len(p):4d}: max e_kern {r['max_e_kern']:.4f}  max e_bf16 {r['max_e_bf16']:.4f}  "
            f"mean {r['mean_e_kern']:.4f}/{r['mean_e_bf16']:.4f}  worst ratio {r['max_ratio']:.3f} @ step {r['worst_step']}  "
            f"greedy split: {split}  chunked diff {fmt(r['chunked']['max_diff'], '.3g')}"
            + (f"  single-chunk diff {fmt(r['single']['max_diff'], '.3g')} / vs chunked "
               f"{fmt(r.get('single_vs_chunked', {}).get('max_diff'), '.3g')}" if "single" in r else "")
            + ("" if r["pass"] else "  FAIL"))
        if r.get("routing"):
            rt = r["routing"]
            w = rt["steps"][r["worst_step"]]
            log(f"    routing: {routing_note(i, w)}; near-tie steps {rt['near_tie_steps']}, "
                f"bf16 flips at {rt['bf16_flip_positions']} of {rt['positions']} positions (steps {rt['bf16_flip_steps']})")
    extra = {"timings_s": {"prepare": round(t_prep, 1), "kern": round(t_kern, 1), "transformers": round(t_hf, 1),
                           "total": round(time.time() - t0, 1)},
             "hf": {k: v for k, v in hf.items() if k not in ("ref32", "bf16", "hf_toks", "hf_topk", "rope_check", "routing32", "routing16", "ref32f", "bf16f", "forced_error")},
             "rope_check": hf.get("rope_check"),
             "kern_stderr_tail": err1.strip().splitlines()[-10:], "layers": cfg.get("num_hidden_layers"),
             "real_layers": real_layers, "preset": shape["preset"], "overrides": shape["config"], "why": shape["why"],
             "settings": st, "sliding_window": cfg.get("sliding_window"), "prompt_ids": prompts, "config_fixups": fixups,
             "seqs": seqs}
    route_err = route_err or hf.get("forced_error")
    if route_err is not None:
        extra["forced_routing_error"] = route_err
    if not hf["hf_argmax_consistent"]:
        log("  note: a transformers greedy token is not the argmax of its raw logits (a logits processor acted)")
    del hf
    free_cuda()
    return summarize_shape(name, prompts, seqs, rates, extra)


class NotStarted(Exception):
    """A shape not started (time budget): it FAILs, without a traceback."""


def run_all(shapes, one):
    """Runs one(shape) for every shape; an exception fails that shape only."""
    rows = []
    for s in shapes:
        log(f"\n== {s}")
        t = time.time()
        try:
            row = one(s)
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, NotStarted):
                traceback.print_exc()
            sys.stdout.flush()
            msg = " / ".join(x.strip() for x in str(e).splitlines() if x.strip())
            row = {"shape": s, "pass": False, "error": f"{type(e).__name__}: {msg[:400]}"}
        row.setdefault("timings_s", {})["wall"] = round(time.time() - t, 1)
        log(table_line(row) if not row.get("error") else f"{s}: FAIL ({row['error']})")
        rows.append(row)
        yield rows


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def safe_name(name):
    """A shape name as a file name (ad hoc specs hold ':' and '=')."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def list_shapes(presets):
    lines = ["presets (packs/src/config.rs):"]
    for n, c in presets.items():
        lines.append(f"  {n:<22} {c['model_type']:<12} hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, vocab {c['vocab_size']}"
                     + (f", window {c['sliding_window']}" if c.get("sliding_window") else "")
                     + (f", rope {c['rope_scaling'].get('rope_type')}" if c.get("rope_scaling") else ""))
    lines.append("cases:")
    for n, c in CASES.items():
        lines.append(f"  {n:<22} {c['why']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--kern", default=".carry/kern", help="the kern binary (default .carry/kern)")
    ap.add_argument("--kernels", default="build/packs", help="the pack's built kernels, for kern pack")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help="comma-separated presets, cases or PRESET:key=value:... specs (--list shows them)")
    ap.add_argument("--steps", type=int, default=None, help=f"greedy tokens per sequence (default: the shape's, else {DEFAULT_STEPS})")
    ap.add_argument("--lengths", default=None,
                    help=f"prompt lengths, comma-separated (default: the shape's, else {','.join(map(str, DEFAULT_LENGTHS))})")
    ap.add_argument("--seed", type=int, default=1, help="weights and prompts seed")
    ap.add_argument("--layers", type=int, default=int(os.environ.get("PARITY_LAYERS", "0")) or None,
                    help="override every shape's layer count (smoke runs; env PARITY_LAYERS); default: the shape's, else the real count")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per kern call (default 300)")
    ap.add_argument("--attn", default=None, choices=["sdpa", "eager"], help="transformers' attention (default: the shape's, else sdpa)")
    ap.add_argument("--device", default="cuda", help="torch device for transformers (default cuda)")
    ap.add_argument("--work", default="/tmp/kern-parity", help="weights, manifests and dumps (not $OUT)")
    ap.add_argument("--keep", action="store_true", help="keep the weights and dumps under --work")
    ap.add_argument("--budget", type=int, default=480,
                    help="start no new shape after this many seconds (0: no limit; default 480, for a 10-minute device call)")
    ap.add_argument("--pack-arg", action="append", default=[],
                    help="extra argument for `kern pack` (repeatable, e.g. --pack-arg=--tp --pack-arg=2)")
    ap.add_argument("--kern-arg", action="append", default=[],
                    help="extra argument for every `kern generate` (repeatable, e.g. --kern-arg=--gpu-mem --kern-arg=40GiB)")
    ap.add_argument("--forced-routing", action="store_true",
                    help="MoE models: also score kern against both references routed to kern's own experts "
                         "(read back by kern run; needs --pack-arg --batch-invariant)")
    ap.add_argument("--pack-max-tokens", type=int, default=None, help="kern pack --max-tokens (default: the shape's, else 256)")
    ap.add_argument("--max-seqs", type=int, default=8)
    ap.add_argument("--max-context", type=int, default=None,
                    help="kern pack --max-context (default: the shape's, else the prompts + steps rounded up, at least 1024)")
    ap.add_argument("--list", action="store_true", help="list the presets and cases, then exit")
    ap.add_argument("--selftest", action="store_true", help="check the comparison logic on synthetic data (CPU, numpy)")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    presets = read_presets()
    if a.list:
        print(list_shapes(presets))
        return 0

    names = [s.strip() for s in a.shapes.split(",") if s.strip()]
    problems = []
    shapes = {}
    for n in names:
        try:
            shapes[n] = parse_shape(n, presets)
        except ValueError as e:
            problems.append(str(e))
    try:
        a.lengths_list = [int(x) for x in a.lengths.split(",") if x.strip()] if a.lengths else None
    except ValueError:
        problems.append(f"--lengths {a.lengths!r}: comma-separated integers")
        a.lengths_list = None
    if not os.path.isfile(a.kern) or not os.access(a.kern, os.X_OK):
        problems.append(f"--kern {a.kern}: not an executable file")
    if not os.path.isdir(a.kernels):
        problems.append(f"--kernels {a.kernels}: no such directory")
    for n, sh in shapes.items():
        try:
            shape_settings(sh, a)
        except ValueError as e:
            problems.append(f"{n}: {e}")
    if problems:
        for p in problems:
            print(f"parity.py: {p}", file=sys.stderr)
        return 2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out_dir = os.environ.get("OUT")
    json_out = os.environ.get("PARITY_JSON") or (os.path.join(out_dir, "parity.json") if out_dir else None)
    txt_out = os.environ.get("PARITY_TXT") or (os.path.join(out_dir, "parity.txt") if out_dir else None)
    logs_out = os.environ.get("PARITY_LOGS") or (os.path.join(out_dir, "parity-logs") if out_dir else None)
    t_start = time.time()
    env = torch_setup(a.device)
    env.update(kern=os.path.abspath(a.kern), kernels=a.kernels, attn=a.attn or "per shape (sdpa)", seed=a.seed,
               steps=a.steps or "per shape", lengths=a.lengths_list or "per shape", layers=a.layers or "per shape",
               rule=f"e_kern <= {REL} * e_bf16 + {ABS}")
    log(f"parity: {json.dumps(env)}")
    kern = Kern(a.kern, a.timeout, os.path.join(a.work, "logs"), logs_out)

    def one(name):
        if a.budget and time.time() - t_start > a.budget:
            raise NotStarted(f"not started: {time.time() - t_start:.0f} s elapsed > --budget {a.budget} s "
                             f"(run it alone: --shapes {name})")
        d = os.path.join(a.work, safe_name(name))
        try:
            return run_shape(shapes[name], a, kern, d, presets)
        finally:
            free_cuda()
            if not a.keep:
                shutil.rmtree(d, ignore_errors=True)

    rows = []
    for rows in run_all(names, one):
        if json_out:
            os.makedirs(os.path.dirname(os.path.abspath(json_out)), exist_ok=True)
            write_json(json_out, {"env": env, "shapes": rows, "elapsed_s": round(time.time() - t_start, 1)})
    ok = all(r["pass"] for r in rows) and len(rows) == len(names)
    summary = (f"== parity of kern generate vs transformers ({env.get('transformers', '?')}, attn {a.attn or 'sdpa'}, "
               f"{env.get('gpu', a.device)}), rule e_kern <= {REL} e_bf16 + {ABS}, "
               f"{time.time() - t_start:.0f} s\n{format_table(rows)}\n\nparity: {'PASS' if ok else 'FAIL'}")
    log("\n" + summary + (f" (numbers in {json_out})" if json_out else ""))
    if txt_out:
        with open(txt_out, "w") as f:
            f.write(summary + "\n")
    return 0 if ok else 1


def forced_selftest(check):
    """forced_sequence / forced_summary on synthetic rows (numpy only): the rule against the
    routed-to-kern references, and the count of kern's sets that differ from fp32's own choice,
    split by whether fp32 had nearly tied them; moe_select_labels, cut_after and step_inputs on a
    hand-made manifest; route_pack refuses a manifest without batch_invariant."""
    import tempfile
    import numpy as np
    steps, vocab = 3, 5
    ref = np.zeros((steps, vocab))
    bf = ref.copy()
    bf[:, 0] = 0.1                      # e_bf16 0.1 -> bound 0.16 at every step
    kl = ref.copy()
    kl[0, 1], kl[2, 2] = 0.15, 0.2      # step 0 within, step 2 over (ratio 1.25)
    lg = np.array([[5.0, 4.0, 1.0, 0.0], [5.0, 4.0, 4.0 - 2.0 ** -9, 0.0], [5.0, 1.0, 0.0, -1.0]])  # row 1: 2nd/3rd nearly tied
    r32 = {2: router_stats(lg, 2)}       # fp32's sets {0,1} at every position
    routes = {2: np.array([[1, 0], [0, 2], [3, 0]])}  # kern: same at 0, the tied one at 1, an untied one at 2
    f = forced_sequence(kl, ref, bf, routes, r32)
    check("forced: the rule against the routed references", not f["pass"] and f["worst_step"] == 2
          and abs(f["max_ratio"] - 1.25) < 1e-9 and abs(f["ratio"][0] - 0.9375) < 1e-9)
    check("forced: kern's sets vs fp32's own: 2 differ, 1 not near-tied",
          f["kern_vs_fp32_sets_differ"] == 2 and f["kern_vs_fp32_differ_untied"] == 1)
    kl[2, 2] = 0.0
    ok = forced_sequence(kl, ref, bf, routes, None)
    check("forced: within the bound passes; no fp32 routing, no counts", ok["pass"] and "kern_vs_fp32_sets_differ" not in ok)
    out, notes = forced_summary([{"forced": f}, {}, {"forced": ok}])
    check("forced: the summary takes the worst sequence and fails with it",
          out["pass"] is False and out["worst_at"] == "seq0 step 2" and out["kern_vs_fp32_sets_differ"] == 2
          and len(notes) == 1 and "FAIL" in notes[0] and "1 of them not near-tied" in notes[0])
    check("forced: no forced sequence, no summary", forced_summary([{}, {}]) == (None, []))
    with tempfile.TemporaryDirectory() as d:
        m = {"vars": {"pages": {"max": 4}}, "states": {"kv": {"page_tokens": 16}},
             "buffers": {"token_ids": {}, "positions": {}, "seq_slots": {}, "block_tables": {}},
             "program": {"calls": [{"label": "embed"}, {"label": "l0.moe_select"}, {"label": "l0.experts"},
                                   {"label": "l3.moe_select"}, {"label": "l3.experts"}]},
             "programs": {"decode": {}}, "speculative": {}}
        mj = os.path.join(d, "model.json")
        write_json(mj, m)
        check("forced: moe_select labels by layer", moe_select_labels(mj) == {0: "l0.moe_select", 3: "l3.moe_select"})
        cut = os.path.join(d, "cut.json")
        cut_after(mj, "l3.moe_select", cut)
        c = json.load(open(cut))
        check("forced: the cut ends at the label, no other programs", [x["label"] for x in c["program"]["calls"]][-1] == "l3.moe_select"
              and len(c["program"]["calls"]) == 4 and "programs" not in c and "speculative" not in c)
        args = step_inputs(mj, os.path.join(d, "in"), list(range(20)))
        given = sorted(x.split("=")[0] for x in args if x != "--input")
        bt = np.load(os.path.join(d, "in", "block_tables.npy"))
        check("forced: step inputs only for the manifest's buffers, slot 0, two pages",
              given == ["block_tables", "positions", "seq_slots", "token_ids"] and bt.tolist() == [[0, 1, -1, -1]]
              and np.load(os.path.join(d, "in", "seq_slots.npy")).tolist() == [0])
        try:
            step_inputs(mj, os.path.join(d, "in2"), list(range(65)))
            check("forced: a prompt past the pages refused", False)
        except ValueError:
            check("forced: a prompt past the pages refused", True)
        try:
            route_pack(lambda *x, **y: None, "s", d, os.path.join(d, "route"), "k", 10, 64, [])
            check("forced: a pack without batch_invariant refused", False)
        except ValueError as e:
            check("forced: a pack without batch_invariant refused", "--batch-invariant" in str(e))


def routing_selftest(check):
    """The MoE routing diagnostic on hand-made router logits (numpy only): margins, near-ties at
    2^-7 of the row's scale, bf16 top-k set flips, the per-step report, the shape row's `routing`
    and notes, the unchanged verdict, no routing for a dense model, and moe_blocks on stand-in
    modules. check(name, cond) records one check."""
    import types
    import numpy as np
    # router_stats: margin = k-th - (k+1)-th largest, scale = max |logit|, the set sorted
    st = router_stats(np.array([[3.0, 1.0, 2.0, 0.5], [-4.0, 1.0, 1.0, 0.0]]), 2)
    check("routing: margin k-th minus (k+1)-th", np.allclose(st["margin"], [1.0, 1.0]) and np.allclose(st["scale"], [3.0, 4.0]))
    check("routing: top-k set sorted", st["topk"].tolist() == [[0, 2], [1, 2]] and st["topk"].dtype == np.int16)
    st = router_stats(np.array([[1.0, 1.0, 1.0, 0.0]]), 2)
    check("routing: an exact tie has margin 0, the lower index wins", st["margin"][0] == 0.0 and st["topk"].tolist() == [[0, 1]])
    st = router_stats(np.array([[1.0, 1.0, 1.0, 0.0]]), 2, chosen=np.array([[2, 0]]))
    check("routing: the model's own chosen indices are the set", st["topk"].tolist() == [[0, 2]])
    check("routing: k = experts has no (k+1)-th: margin inf", np.isinf(router_stats(np.ones((2, 3)), 3)["margin"]).all())
    check("routing: [1, T, E] logits are rows", router_stats(np.zeros((1, 5, 4)), 1)["margin"].shape == (5,))
    try:
        router_stats(np.ones((2, 3)), 4)
        check("routing: top-k > experts refused", False)
    except ValueError:
        check("routing: top-k > experts refused", True)
    # the tie tolerance: 2^-7 of the row's largest |logit|
    near = router_stats(np.array([[8.0, 8.0 - 8 * 2.0 ** -8, -1.0]]), 1)
    far = router_stats(np.array([[8.0, 8.0 - 8 * 2.0 ** -6, -1.0]]), 1)
    edge = router_stats(np.array([[8.0, 8.0 - 8 * 2.0 ** -7, -1.0]]), 1)
    check("routing: rel margin 2^-8 is a near-tie, 2^-6 is not, 2^-7 itself is not",
          rel_margin(near)[0] < TIE_REL <= rel_margin(edge)[0] and rel_margin(far)[0] > TIE_REL)
    check("routing: an all-zero row is all tied", rel_margin(router_stats(np.zeros((1, 4)), 2))[0] == 0.0)

    # one sequence: prompt 3 tokens, 4 steps -> positions 0..5, step j at position 2 + j
    rng = np.random.default_rng(5)
    t, e, k = 6, 8, 2
    base = {l: np.stack([rng.permutation(e).astype(np.float64) for _ in range(t)]) for l in (1, 3)}  # margins 1, scale 7
    lg32 = {l: x.copy() for l, x in base.items()}
    lg16 = {l: x.copy() for l, x in base.items()}
    # layer 3, position 4 (step 2): the 2nd and 3rd experts 1e-3 apart in fp32, swapped in bf16
    a, b = np.argsort(-lg32[3][4])[1:3]
    lg32[3][4, b] = lg32[3][4, a] - 1e-3
    lg16[3][4, b] = lg16[3][4, a] + 1e-3
    # layer 1, position 0 (prompt): bf16 picks another expert (no near-tie in fp32): a flip, no step
    c, d = np.argsort(-lg16[1][0])[1:3]
    lg16[1][0, d] = lg16[1][0, c] + 0.5
    r32 = {l: router_stats(x, k) for l, x in lg32.items()}
    r16 = {l: router_stats(x, k) for l, x in lg16.items()}
    ratio = [0.3125, 0.625, 1.25, 0.125]
    rs = routing_sequence(r32, r16, 3, ratio)
    s2 = rs["steps"][2]
    check("routing: the failing step's position, min-margin layer, near-tie, bf16 flip",
          s2["position"] == 4 and s2["layer"] == 3 and s2["near_tie"] and s2["bf16_routing_differs"] is True
          and abs(s2["min_margin"] - 1e-3) < 1e-9 and s2["bf16_differs_layers"] == [3])
    check("routing: other steps: margin 1 of 7, no tie, no flip", all(
        not s["near_tie"] and s["bf16_routing_differs"] is False and abs(s["min_rel_margin"] - 1 / 7) < 1e-6
        for j, s in enumerate(rs["steps"]) if j != 2))
    check("routing: counts over all positions (the prompt's flip included)",
          rs["near_tie_steps"] == [2] and rs["near_tie_positions"] == 1 and rs["bf16_routing_flips"] == 2
          and rs["bf16_flip_positions"] == 2 and rs["bf16_flip_steps"] == [2] and rs["layers"] == [1, 3]
          and rs["top_k"] == 2 and rs["positions"] == 6)
    rs_no16 = routing_sequence(r32, None, 3, ratio)
    check("routing: bf16 not captured -> None, not 'no'", rs_no16["steps"][2]["bf16_routing_differs"] is None
          and rs_no16["bf16_routing_flips"] is None and "not captured" in routing_note(0, rs_no16["steps"][2]))
    try:
        routing_sequence(r32, r16, 4, ratio)  # step 3 would need position 6 of 6
        check("routing: too few positions refused", False)
    except ValueError:
        check("routing: too few positions refused", True)

    # the shape row: the rule's verdict unchanged, routing explains the failing step; a dense model has none
    v = 16
    ref = np.zeros((4, v), np.float32)
    bf = ref.copy()
    bf[:, 0] = 0.1                               # e_bf16 0.1 -> bound 0.16
    kern = ref.copy()
    kern[np.arange(4), 3] = [0.05, 0.1, 0.2, 0.02]  # ratios 0.3125, 0.625, 1.25, 0.125
    toks = [int(x) for x in kern.argmax(axis=1)]

    def seq(kl):
        return evaluate_sequence([1, 2, 3], (toks, kl), (toks, kl), ref, bf, toks)

    failing, passing = seq(kern), seq(kern * 0.5)
    check("routing: the hand-made ratios", np.allclose(failing["ratio"], ratio) and not failing["logits_pass"] and passing["logits_pass"])
    dense = summarize_shape("dense", [[1, 2, 3]] * 2, [seq(kern), seq(kern * 0.5)], {})
    check("routing: a dense model's row has no routing entry and no notes",
          "routing" not in dense and "notes" not in dense and "note:" not in format_table([dense]))
    failing["routing"] = rs
    passing["routing"] = routing_sequence(r32, r16, 3, passing["ratio"])
    row = summarize_shape("moe", [[1, 2, 3]] * 2, [failing, passing], {})
    rt = row.get("routing") or {}
    check("routing: the verdict stays the rule's (FAIL), failures unchanged",
          row["pass"] is False and row["failures"] == dense["failures"] and row["worst_ratio"] == dense["worst_ratio"])
    check("routing: the row's failing steps", rt.get("failing_steps") == [
        {"seq": 0, "step": 2, "ratio": 1.25, "min_margin": s2["min_margin"], "min_rel_margin": s2["min_rel_margin"], "layer": 3,
         "near_tie": True, "bf16_routing_differs": True, "bf16_differs_layers": [3]}] and rt.get("n_failing_steps") == 1)
    check("routing: the row's counts", rt.get("bf16_routing_flips") == 4 and rt.get("near_tie_positions") == 2
          and rt.get("near_tie_steps") == {"seq0": [2], "seq1": [2]} and rt.get("positions") == 12 and rt.get("layer_positions") == 24
          and [w["step"] for w in rt.get("worst_steps", [])] == [2, 2])
    notes = row.get("notes") or []
    table = format_table([row])
    check("routing: the failing step's note", any(n.startswith("seq0 step 2 (ratio 1.250, FAILS the rule): router margin 1.0e-03 (rel 1.4e-04 < 2^-7: near-tie)")
                                                  and "near-tie" in n and "at layer 3" in n and "bf16 picks other experts: yes" in n for n in notes))
    check("routing: a passing sequence's worst step is noted as such, not as a failure",
          any(n.startswith("seq1 step 2 (ratio 0.625)") and n.endswith("[worst step]") for n in notes)
          and not any(n.startswith("seq1") and "FAILS" in n for n in notes))
    check("routing: notes printed in the table", "moe: note: seq0 step 2" in table and "moe: note: routing (top-2" in table)
    check("routing: the row is plain JSON", json.loads(json.dumps(rt)) == rt)
    ok_row = summarize_shape("moe-ok", [[1, 2, 3]], [passing], {})
    check("routing: flips and near-ties do not fail a passing shape", ok_row["pass"] is True and ok_row["routing"]["bf16_routing_flips"] == 2)

    # moe_blocks on stand-in modules (duck-typed: no torch)
    class Qwen3NextSparseMoeBlock:
        def __init__(self, top_k=None, gate_k=None):
            self.gate = types.SimpleNamespace(weight=np.zeros((8, 16)), top_k=gate_k)
            self.top_k = top_k

    class Qwen3NextMLP:
        gate_proj = types.SimpleNamespace(weight=np.zeros((32, 16)))

    class Qwen3NextTopKRouter:
        weight = np.zeros((8, 16))

    def model(mods, k=2):
        return types.SimpleNamespace(config=types.SimpleNamespace(num_experts_per_tok=k), named_modules=lambda: iter(mods))

    mods = [("model", object()), ("model.layers.0.mlp", Qwen3NextSparseMoeBlock(gate_k=2)), ("model.layers.0.mlp.gate", Qwen3NextTopKRouter()),
            ("model.layers.1.mlp", Qwen3NextMLP()), ("model.layers.12.mlp", Qwen3NextSparseMoeBlock(top_k=4))]
    got = [(l, n, kk) for l, n, _, kk in moe_blocks(model(mods))]
    check("routing: moe_blocks finds the sparse-MoE blocks, their layers and top-k",
          got == [(0, "model.layers.0.mlp", 2), (12, "model.layers.12.mlp", 4)])
    check("routing: top-k from the config when the block has none",
          [b[3] for b in moe_blocks(model([("model.layers.3.mlp", Qwen3NextSparseMoeBlock())], k=3))] == [3])
    check("routing: a dense model has no MoE blocks", moe_blocks(model(mods[:1] + mods[3:4])) == [])


# ============================================================================ selftest
def selftest():
    """The comparison logic on synthetic numpy arrays: no torch, no GPU, no kern."""
    import tempfile
    import numpy as np
    rng = np.random.default_rng(0)
    n_ok = n_bad = 0

    def check(name, cond):
        nonlocal n_ok, n_bad
        if cond:
            n_ok += 1
        else:
            n_bad += 1
            print(f"selftest FAIL: {name}")

    V, N = 1000, 8
    ref = rng.standard_normal((N, V)).astype(np.float32)
    bf = ref + rng.uniform(-0.03, 0.03, (N, V)).astype(np.float32)
    kern = ref + rng.uniform(-0.02, 0.02, (N, V)).astype(np.float32)

    # step errors and the bound
    se = step_errors(kern, ref, bf)
    check("errors are per step", se["e_kern"].shape == (N,))
    check("small kern error passes", (se["ratio"] <= 1).all())
    want = np.abs(kern.astype(np.float64) - ref).max(axis=1)
    check("e_kern is max abs over vocab", np.allclose(se["e_kern"], want))
    check("bound is 1.5 e_bf16 + 0.01", np.allclose(se["bound"], 1.5 * np.abs(bf.astype(np.float64) - ref).max(axis=1) + 0.01))
    k2 = kern.copy()
    k2[5, 17] += 1.0
    se2 = step_errors(k2, ref, bf)
    check("one bad logit fails its step only", (se2["ratio"] > 1).tolist() == [j == 5 for j in range(N)])
    # exact boundary: e_kern == bound passes, just above fails (values exact in float64)
    r0 = np.zeros((1, 4))
    b0 = np.array([[0.0, 0.25, 0.0, 0.0]])
    check("at the bound passes", step_errors(np.array([[0.385, 0, 0, 0]]), r0, b0)["ratio"][0] <= 1.0)
    check("above the bound fails", step_errors(np.array([[0.3851, 0, 0, 0]]), r0, b0)["ratio"][0] > 1.0)
    check("zero bf16 error leaves 0.01", step_errors(np.array([[0.0099, 0, 0, 0]]), r0, r0)["ratio"][0] <= 1.0
          and step_errors(np.array([[0.0101, 0, 0, 0]]), r0, r0)["ratio"][0] > 1.0)
    kn = kern.copy()
    kn[2, 3] = np.nan
    check("NaN fails", step_errors(kn, ref, bf)["ratio"][2] == np.inf)
    try:
        step_errors(kern[:, :10], ref, bf)
        check("shape mismatch raises", False)
    except ValueError:
        check("shape mismatch raises", True)

    # the MoE routing diagnostic (explains a step, never changes the verdict)
    routing_selftest(check)
    forced_selftest(check)

    # greedy
    toks = [int(x) for x in kern.argmax(axis=1)]
    g = greedy_check(toks, list(toks), ref, se["bound"])
    check("equal streams pass", g["pass"] and g["first_split"] is None)
    g = greedy_check(toks, toks[:5], ref, se["bound"])
    check("short hf stream fails", not g["pass"] and g["first_split"] is None)
    # a split where the two tokens' ref32 logits are close
    ref_s = ref.copy()
    alt = (toks[3] + 1) % V
    ref_s[3, alt] = ref_s[3, toks[3]] - 0.005
    hf = toks[:3] + [alt] + [7] * (N - 4)
    g = greedy_check(toks, hf, ref_s, se["bound"])
    check("close split passes", g["pass"] and g["first_split"] == 3 and abs(g["gap"] - 0.005) < 1e-6)
    ref_s[3, alt] = ref_s[3, toks[3]] - 0.5
    g = greedy_check(toks, hf, ref_s, se["bound"])
    check("far split fails", not g["pass"] and g["first_split"] == 3)
    # top-k report
    kl = kern.copy()
    kl[3, alt] = kl[3, toks[3]] - 1e-3
    hf_topk = [[t] + [0, 1, 2, 4] for t in hf]
    hf_topk[3] = [alt, toks[3], 0, 1, 2]
    g = greedy_check(toks, hf, ref_s, se["bound"], kern_logits=kl, hf_topk=hf_topk)
    check("top-k mutual reported", g.get("topk_mutual") is True)

    # chunked: identical run, tiny diff, token split
    c = chunk_check(kern[:4], toks[:4], kern[:4].copy(), toks[:4], ref, se["bound"])
    check("identical chunked run: diff 0, pass", c["pass"] and c["max_diff"] == 0.0 and c["tokens_equal"] and c["rows"] == 4)
    k3 = kern[:4].copy()
    k3[1] += 1e-4
    c = chunk_check(kern[:4], toks[:4], k3, toks[:4], ref, se["bound"])
    check("tiny chunked diff passes", c["pass"] and abs(c["max_diff"] - 1e-4) < 1e-6)
    k3[2, 0] += 5.0
    c = chunk_check(kern[:4], toks[:4], k3, toks[:4], ref, se["bound"])
    check("large chunked diff fails", not c["pass"])
    t3 = toks[:4]
    t3b = t3[:1] + [(t3[1] + 1) % V] + [0, 0]
    big = kern[:4].copy()
    big[2:] += 10.0  # rows after the split are not comparable and must be ignored
    ref_c = ref.copy()
    ref_c[1, t3b[1]] = ref_c[1, t3[1]]  # the split tokens tie in ref32
    c = chunk_check(kern[:4], t3, big, t3b, ref_c, se["bound"])
    check("rows after a token split are not compared", c["pass"] and c["rows"] == 2 and c["first_split"] == 1)
    ref_c[1, t3b[1]] = ref_c[1, t3[1]] - 1.0
    c = chunk_check(kern[:4], t3, big, t3b, ref_c, se["bound"])
    check("chunked token split far apart in ref32 fails", not c["pass"])

    # own argmax
    check("own argmax ok", own_argmax_check(kern, toks)["ok"])
    tie = kern.copy()
    tie[0, 999] = tie[0, toks[0]]
    check("ties are fine", own_argmax_check(tie, toks)["ok"])
    wrong = list(toks)
    wrong[6] = (wrong[6] + 1) % V
    o = own_argmax_check(kern, wrong)
    check("a token that is not the row max fails", not o["ok"] and o["bad_steps"] == [6])
    check("NaN logits fail own argmax", not own_argmax_check(kn, toks)["ok"])

    # rates from kern's stderr
    check("rates: one line", parse_rates("prefill 413 tokens in 0.03 s (13766.7 tok/s), decode 256 tokens in 0.5 s (512.0 tok/s)")
          == {"prefill": 13766.7, "decode": 512.0})
    check("rates: separate lines, tokens/s, commas", parse_rates("load 1.2 s\nprefill: 12,345 tokens/s\ndecode: 1,234.5 tokens/s (4 seqs)\n")
          == {"prefill": 12345.0, "decode": 1234.5})
    check("rates: k tok/s", parse_rates("decode 64 steps x 4 seqs: 2.5 k tok/s") == {"decode": 2500.0})
    check("rates: none", parse_rates("no numbers here 5 tok/s") == {})

    # prompts
    p = make_prompts([5, 37, 120, 251], 1)
    check("prompts: lengths, range, seeded", [len(x) for x in p] == [5, 37, 120, 251]
          and all(0 <= t < PROMPT_ID_MAX for x in p for t in x) and p == make_prompts([5, 37, 120, 251], 1)
          and p != make_prompts([5, 37, 120, 251], 2))
    a = gen_args("M", [[1, 2], [3]], 64, "D", chunk=16)
    check("generate argv", a == ["generate", "--model", "M", "--prompt-ids", "1,2", "--prompt-ids", "3", "--max-tokens", 64,
                                 "--temperature", "0", "--ignore-eos", "--dump", "D", "--chunk", 16])

    # every family's vocabulary: prompt ids and the pad id valid
    for v in (151936, 128256, 49152, 32768, 32000, 262144, 262208):
        ps = make_prompts([300], 3, prompt_id_max(v))
        check(f"prompt ids < vocab {v}", all(0 <= t < v for t in ps[0]) and PAD_ID < v)
    check("Qwen keeps its ordinary range", prompt_id_max(151936) == 151643 and prompt_id_max(32000) == 32000)
    check("Qwen prompts unchanged by the generalization", make_prompts([5], 1, prompt_id_max(151936)) == make_prompts([5], 1))

    # shapes: presets from packs/src/config.rs, cases, ad hoc specs
    presets = read_presets()
    check("presets read from packs/src/config.rs", {"qwen3-0.6b", "llama-3.2-1b", "llama-3.1-8b", "smollm2-135m", "mistral-7b",
                                                    "mistral-7b-v0.1", "gemma-3-270m", "gemma-3-1b", "gemma-3-4b"} <= set(presets)
          and presets["gemma-3-4b"]["vocab_size"] == 262208)
    check("every case names a preset", all(c["preset"] in presets for c in CASES.values()))
    sh = parse_shape("gemma-3-1b-sw48", presets)
    cfg = shape_config(sh, presets)
    check("case: overrides, real layers", cfg["sliding_window"] == 48 and cfg["num_hidden_layers"] == 26 and sh["preset"] == "gemma-3-1b")
    sh = parse_shape("mistral-7b-v0.1-sw64", presets)
    cfg = shape_config(sh, presets)
    check("case: 8 of 32 layers at full width", cfg["num_hidden_layers"] == 8 and cfg["hidden_size"] == 4096 and cfg["sliding_window"] == 64)
    check("--layers overrides a case's", shape_config(sh, presets, 2)["num_hidden_layers"] == 2)
    sh = parse_shape("gemma-3-4b:sliding_window=32:layers=6:lengths=5/300:steps=8:rope_scaling=null", presets)
    cfg = shape_config(sh, presets)
    check("ad hoc spec", sh["layers"] == 6 and sh["lengths"] == [5, 300] and sh["steps"] == 8 and cfg["sliding_window"] == 32
          and cfg["rope_scaling"] is None and cfg["num_hidden_layers"] == 6)
    c2 = shape_config({"preset": "gemma-3-1b", "config": {"layer_types": ["full_attention"] * 26}}, presets)
    check("layer_types of the preset dropped when the count changes", "layer_types" not in shape_config(
        {"preset": "gemma-3-1b", "config": {}}, {"gemma-3-1b": dict(presets["gemma-3-1b"], layer_types=["x"] * 26)}, 4)
          and c2["layer_types"][0] == "full_attention")
    for bad in ("no-such-preset", "gemma-3-1b:oops"):
        try:
            parse_shape(bad, presets)
            check(f"bad spec {bad!r} refused", False)
        except ValueError:
            check(f"bad spec {bad!r} refused", True)

    class A:
        steps = lengths_list = attn = pack_max_tokens = layers = max_context = None
        max_seqs = 8
    st = shape_settings(parse_shape("llama-3.2-1b-long", presets), A)
    check("long case: its lengths, steps and context", st["lengths"] == [8300, 40] and st["steps"] == 32 and st["max_context"] == 8448)
    st = shape_settings(parse_shape("qwen3-0.6b", presets), A)
    check("defaults", st["lengths"] == list(DEFAULT_LENGTHS) and st["steps"] == DEFAULT_STEPS and st["max_context"] == 1024 and st["attn"] == "sdpa")
    A.lengths_list, A.steps = [2000], 64
    check("the context grows with the prompts", shape_settings(parse_shape("qwen3-0.6b", presets), A)["max_context"] == 2304)
    A.max_context = 1024
    try:
        shape_settings(parse_shape("qwen3-0.6b", presets), A)
        check("a context too short is refused", False)
    except ValueError:
        check("a context too short is refused", True)

    # end to end through the files kern writes: a passing and a failing shape, and an exception
    with tempfile.TemporaryDirectory() as tmp:
        prompts = [[int(x) for x in rng.integers(0, PROMPT_ID_MAX, n)] for n in (5, 37, 120, 251)]
        steps, vocab = 6, 500

        def fake_model(i, s):
            r = np.random.default_rng([i, s])
            return r.standard_normal((steps, vocab)).astype(np.float32)

        def write_dump(d, logits_list, n, ps, bad_prompt=False):
            os.makedirs(d)
            outs = [[int(x) for x in l[:n].argmax(axis=1)] for l in logits_list]
            pp = [list(x) for x in ps]
            if bad_prompt:
                pp[0] = pp[0][:-1]
            with open(os.path.join(d, "tokens.json"), "w") as f:
                json.dump({"prompts": pp, "outputs": outs}, f)
            for i, l in enumerate(logits_list):
                np.save(os.path.join(d, f"seq{i}.logits.npy"), l[:n])
            return outs

        def shape_result(name, kern_noise, seed):
            refs = [fake_model(i, seed) for i in range(4)]
            r2 = np.random.default_rng(seed + 100)
            bf16s = [x + r2.uniform(-0.02, 0.02, x.shape).astype(np.float32) for x in refs]
            kerns = [x + r2.uniform(-kern_noise, kern_noise, x.shape).astype(np.float32) for x in refs]
            d1, d2 = os.path.join(tmp, name, "d1"), os.path.join(tmp, name, "d2")
            write_dump(d1, kerns, steps, prompts)
            write_dump(d2, [k + 1e-6 for k in kerns], 4, prompts)
            run1 = read_dump(d1, prompts, steps, vocab)
            run2 = read_dump(d2, prompts, 4, vocab)
            seqs = []
            for i in range(4):
                seqs.append(evaluate_sequence(prompts[i], (run1[0][i], run1[1][i]), (run2[0][i], run2[1][i]), refs[i],
                                              bf16s[i], run1[0][i], hf_topk=None,
                                              run_single=(run2[0][i], run2[1][i]) if i == 3 else None))
            return summarize_shape(name, prompts, seqs, parse_rates("decode 100.0 tok/s"))

        # a failed chunked run / transformers generate fails those checks, the logits parity stands
        refs = [fake_model(0, 9)]
        rr = evaluate_sequence(prompts[0], (list(refs[0].argmax(axis=1)), refs[0]), "RuntimeError: boom", refs[0],
                               refs[0] + 0.01, "transformers generate: TypeError: x", None, run_single="RuntimeError: boom2")
        ss = summarize_shape("errs", prompts[:1], [rr], {})
        check("side-run errors fail with their messages", rr["logits_pass"] and not rr["pass"] and ss["greedy"] == "err"
              and ss["chunked_max_diff"] is None and any("boom2" in f for f in ss["failures"])
              and any("TypeError" in f for f in ss["failures"]) and "?" in table_line(ss))

        good = shape_result("good", 0.01, 1)
        bad = shape_result("bad", 0.2, 2)
        check("good shape passes", good["pass"] and good["worst_ratio"] <= 1 and good["greedy"] == "=,=,=,=")
        check("chunked diff ~1e-6", 0 < good["chunked_max_diff"] < 1e-5 and good["chunked_tokens_equal"])
        check("bad shape fails with reasons", not bad["pass"] and bad["worst_ratio"] > 1 and bad["failures"])
        check("decode rate in row", good["decode_tok_s"] == 100.0)
        # the manifest check joins the row: a failing one fails the shape
        rc_ok = {"pass": True, "inexact": 2, "problems": []}
        rc_bad = {"pass": False, "inexact": 0, "problems": ["layer 3: sliding window 512 in kern, None in transformers"]}
        seqs_ok = [evaluate_sequence(prompts[0], (list(fake_model(0, 1).argmax(axis=1)), fake_model(0, 1)), (list(fake_model(0, 1).argmax(axis=1))[:4], fake_model(0, 1)[:4]),
                                     fake_model(0, 1), fake_model(0, 1) + 0.01, list(fake_model(0, 1).argmax(axis=1)))]
        r1 = summarize_shape("r1", prompts[:1], seqs_ok, {}, {"rope_check": rc_ok, "layers": 8, "real_layers": 32})
        r2 = summarize_shape("r2", prompts[:1], seqs_ok, {}, {"rope_check": rc_bad})
        check("rope ok (with 1-ulp count) keeps the pass", r1["pass"] and r1["rope"] == "ok (2 1ulp)" and "8/32" in table_line(r1))
        check("rope failure fails the shape with its reason", not r2["pass"] and r2["rope"] == "FAIL" and any("sliding window" in f for f in r2["failures"]))
        # dump validation
        d = os.path.join(tmp, "badprompt")
        write_dump(d, [fake_model(i, 3) for i in range(4)], steps, prompts, bad_prompt=True)
        try:
            read_dump(d, prompts, steps, vocab)
            check("prompt mismatch is caught", False)
        except ValueError:
            check("prompt mismatch is caught", True)
        d = os.path.join(tmp, "short")
        write_dump(d, [fake_model(i, 3) for i in range(4)], steps - 1, prompts)
        try:
            read_dump(d, prompts, steps, vocab)
            check("short output is caught", False)
        except ValueError:
            check("short output is caught", True)
        try:
            read_dump(os.path.join(tmp, "good", "d1"), prompts, steps, vocab + 1)
            check("vocab mismatch is caught", False)
        except ValueError:
            check("vocab mismatch is caught", True)

        def one(s):
            if s == "boom":
                raise RuntimeError("kern generate (x) exited 1 after 0.1 s:\nerror: something")
            return good if s == "good" else bad

        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rows = list(run_all(["good", "boom", "bad"], one))[-1]
        check("an exception fails one shape, the others run", [r["shape"] for r in rows] == ["good", "boom", "bad"]
              and [r["pass"] for r in rows] == [True, False, False] and "RuntimeError" in rows[1]["error"]
              and "error: something" in rows[1]["error"] and "Traceback" in buf.getvalue())
        buf2 = io.StringIO()
        with contextlib.redirect_stdout(buf2), contextlib.redirect_stderr(buf2):
            rows2 = list(run_all(["late"], lambda s: (_ for _ in ()).throw(NotStarted("not started: budget"))))[-1]
        check("a shape past the budget fails without a traceback", not rows2[0]["pass"] and "Traceback" not in buf2.getvalue())
        table = format_table(rows)
        check("table has every shape and verdict", table.count("PASS") == 1 and table.count("FAIL") >= 2 and "boom" in table)
        jp = os.path.join(tmp, "parity.json")
        write_json(jp, {"shapes": rows})
        with open(jp) as f:
            back = json.load(f)
        check("json round trip", back["shapes"][0]["worst_ratio"] == good["worst_ratio"]
              and back["shapes"][1]["error"] == rows[1]["error"])
        print(table)
        # config.json fixups: whole-number floats transformers types as int
        md = os.path.join(tmp, "fix")
        os.makedirs(md)
        write_json(os.path.join(md, "config.json"), {"query_pre_attn_scalar": 256.0, "rms_norm_eps": 1e-6, "sliding_window": 48})
        fx = hf_config_fixups(md)
        with open(os.path.join(md, "config.json")) as f:
            back = json.load(f)
        check("config fixups", fx == ["query_pre_attn_scalar 256.0 -> 256"] and back["query_pre_attn_scalar"] == 256
              and isinstance(back["query_pre_attn_scalar"], int) and back["rms_norm_eps"] == 1e-6 and hf_config_fixups(md) == [])
    print(f"selftest: {n_ok} passed, {n_bad} failed")
    return 0 if n_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
