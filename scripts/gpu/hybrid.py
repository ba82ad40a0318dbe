#!/usr/bin/env python3
"""The Gated DeltaNet hybrids (issue 30: qwen3_next, qwen3_5) on the GPU: random-weight parity
against transformers' pure-torch path, and the prefix cache through their per-sequence state.

    python3 scripts/gpu/hybrid.py parity [--kern .carry/kern] [--kernels build/packs]
        [--shapes qwen3.5-small,qwen3.5-small-d256,qwen3-next-small,qwen3-next-small-d256]
        [--lengths 5,70,300] [--steps 32] [--pack-arg=--gdn-state --pack-arg=bf16] [...parity.py flags]
    python3 scripts/gpu/hybrid.py prefix [--kern .carry/kern] [--kernels build/packs]
        [--shapes qwen3.5-small,qwen3-next-small] [--steps 32]
    python3 scripts/gpu/hybrid.py selftest          # CPU only: the manifest check on a packed
                                                      # manifest (needs --kern), the argument plumbing

parity: scripts/gpu/parity.py's whole pipeline per shape (kern random-weights + kern pack; kern
generate greedy of all prompts in one batch with --dump; transformers fp32 and bf16 teacher-forced
on kern's tokens; the rule max|kern - fp32| <= 1.5 max|bf16 - fp32| + 0.01 at every step of every
sequence; transformers' own bf16 greedy tokens compared with kern's; 16-token chunked prefill and a
one-chunk run against the batch run), with three changes for the hybrids:
  * transformers' GDN layers are forced onto the pure-torch path (torch_causal_conv1d_update /
    torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule / the torch RMSNormGated): fla
    and causal-conv1d are unset in modeling_qwen3_next / modeling_qwen3_5 before loading;
  * the weight spot check reads the first GDN layer's A_log and in-projection as well;
  * the manifest check (parity.py's "rope" column) is this file's hybrid_check: per layer the kind
    (GDN calls iff transformers' layer_types says linear_attention), per attention layer the rotated
    dims (qk_norm_rope_gated's rot_dim = 2 · len(rotary_emb.inv_freq)), its frequencies
    (1 / theta^(2i / rot_dim) in fp32 as the kernel computes them, within 2 ulp of transformers'),
    attention_scaling 1, the score scale = self_attn.scaling, the q/k norm's offset 1 and eps; the
    GDN state's bytes_per_seq = KERNELS.md's formula for the config and the state dtype.
For the sparse-MoE shapes (qwen3-next-*), parity.py's routing diagnostic comes along: forward hooks
on every `mlp.gate` keep, per layer and position, the fp32 router's top-k margin (k-th minus
(k+1)-th logit; a near-tie when below 2^-7 of the row's largest |logit|) and the fp32 / bf16 top-k
sets; the worst step and every failing step of each sequence get a note ("seq0 step 7 (ratio 1.026,
FAILS the rule): router margin ... at layer 5 (bf16 picks other experts: yes)") and the row a
`routing` entry. It explains a step; the verdict stays the rule's.
Default prompts 5, 70, 300 tokens (a decode-sized row, one crossing a 64-token chunk and the 16-token
pages, one crossing the pack's 256-token step) and 32 greedy steps.

prefix: per shape, random weights + kern pack (--max-seqs 4), then `kern generate` of 10 prompts
(4 copies of a 300-token prompt A, 3 of a 70-token prompt B, A's first 200 tokens + 40 others, B + 30
others, and one unrelated 50-token prompt), greedy, --ignore-eos, --dump, with the prefix cache (the
default) and with --no-prefix-cache, whole and with --chunk 16. The cached runs must report prompt
tokens from the cache (snapshots of the GDN state restored at page boundaries: copies admitted after
the first wave finished), and every run of every prompt must give the uncached whole run's tokens and
logits: prefill cut elsewhere is another fp32 reassociation (not bit-identical), so "the same" is
judged against the noise floor the uncached runs show among themselves (judge_prefix: tol = max(0.05,
4 × floor); a token split only at a near-tie). A snapshot restored into the wrong slot, of the wrong
length or not at all gives another state: logits off by their own size from the first token.

$OUT (when set) gets hybrid-parity.json / .txt (parity.py's files, renamed), hybrid-prefix.json and
the kern logs. Exit status 1 when a check fails, 2 on bad arguments.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import parity  # noqa: E402  (scripts/gpu/parity.py: the pipeline this file reuses)

DEFAULT_SHAPES = "qwen3.5-small,qwen3.5-small-d256,qwen3-next-small,qwen3-next-small-d256"
PREFIX_SHAPES = "qwen3.5-small,qwen3-next-small"
KW, D = 4, 128


def log(*a):
    print(*a, flush=True)


# ============================================================================ transformers' side
def force_torch_gdn():
    """Unsets fla / causal-conv1d in the hybrids' modeling modules, so their GDN layers take the
    pure-torch functions (what KERNELS.md's kernels were written against). Returns what it did."""
    done = []
    for mod in ("transformers.models.qwen3_next.modeling_qwen3_next", "transformers.models.qwen3_5.modeling_qwen3_5"):
        try:
            m = __import__(mod, fromlist=["x"])
        except Exception as e:  # noqa: BLE001 -- an older transformers without the model
            done.append(f"{mod.rsplit('.', 1)[-1]}: not importable ({type(e).__name__})")
            continue
        for name in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "FusedRMSNormGated"):
            f = getattr(m, name, None)
            # Only what came from fla / causal-conv1d: modeling_qwen3_5 defines its own torch
            # causal_conv1d_* under these names (hub kernels with a torch fallback), which stay.
            src = getattr(f, "__module__", "") or ""
            if f is not None and (src.startswith("fla") or src.startswith("causal_conv1d")):
                setattr(m, name, None)
                done.append(f"{mod.rsplit('.', 1)[-1]}.{name} = None (was {src})")
        if hasattr(m, "is_fast_path_available"):
            m.is_fast_path_available = False
    return done


def gdn_path(model):
    """Which GDN implementation each part of the first GDN layer runs (for the log)."""
    inner = model.model if hasattr(model, "model") else model
    for layer in inner.layers:
        la = getattr(layer, "linear_attn", None)
        if la is None:
            continue
        out = {"norm": type(la.norm).__name__}
        for k in ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "recurrent_gated_delta_rule"):
            f = getattr(la, k, None)
            out[k] = getattr(f, "__name__", str(f)) if f is not None else None
        return out
    return {}




def load_hf(model_dir, dtype, device, attn):
    """parity.load_hf with the GDN layers on the torch path, Qwen3.5's text class when the Auto
    mapping lacks it, and the spot check on tensors a hybrid has."""
    import torch
    force_torch_gdn()
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    t = time.time()
    try:
        model, dt = _orig_load_hf_spot(model_dir, dtype, device, attn)
    except (ValueError, KeyError) as e:
        if cfg.get("model_type") != "qwen3_5_text":
            raise
        log(f"  AutoModelForCausalLM refused qwen3_5_text ({e}); loading Qwen3_5ForCausalLM directly")
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM
        model, info = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn, output_loading_info=True)
        missing = set(info.get("missing_keys") or ()) - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
        if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
            raise RuntimeError(f"transformers did not load the checkpoint cleanly: {info}")
        model = model.to(device).eval()
        dt = time.time() - t
    first_gdn = next(i for i, k in enumerate(cfg["layer_types"]) if k == "linear_attention")
    p = f"model.layers.{first_gdn}.linear_attn"
    proj = "in_proj_qkvz" if cfg["model_type"] == "qwen3_next" else "in_proj_qkv"
    for name in ("model.norm.weight", f"{p}.A_log", f"{p}.{proj}.weight", f"{p}.conv1d.weight"):
        want = parity.read_tensor(model_dir, name).to(device=device)
        got = model.get_parameter(name).detach()
        if not torch.equal(got, want.to(got.dtype)):
            raise RuntimeError(f"transformers' {name} differs from the safetensors file")
    log(f"  transformers GDN path ({dtype}): {json.dumps(gdn_path(model))}")
    return model, dt


def _orig_load_hf_spot(model_dir, dtype, device, attn):
    """parity.load_hf minus its spot check of layer 0's q_proj (layer 0 of a hybrid is GDN)."""
    from transformers import AutoModelForCausalLM
    t = time.time()
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn, output_loading_info=True)
    missing = set(info.get("missing_keys") or ()) - ({"lm_head.weight"} if model.config.tie_word_embeddings else set())
    if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise RuntimeError(f"transformers did not load the checkpoint cleanly: {info}")
    return model.to(device).eval(), time.time() - t


# ============================================================================ the manifest check
def kernel_inv_freq(theta, rot):
    """qk_norm_rope_gated's frequencies: 1 / fp32(pow(theta, fp32(2i) / fp32(rot)))."""
    import numpy as np
    e = (np.arange(0, rot, 2, dtype=np.float32) / np.float32(rot)).astype(np.float64)
    return (np.float32(1.0) / np.power(float(theta), e).astype(np.float32)).astype(np.float32)


def bytes_per_seq(cfg, state_bytes):
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    conv = (2 * hk + hv) * D
    n = sum(1 for k in cfg["layer_types"] if k == "linear_attention")
    return n * ((KW - 1) * conv * 2 + hv * D * D * state_bytes)


def manifest_args(m, op, entry):
    for l in m["ops"][op]["impl"]["launches"]:
        if l["entry"] == entry:
            return l["args"]
    raise KeyError(f"op {op} has no launch of {entry}")


def hybrid_check(model_json, model):
    """kern's manifest against the transformers model (see the module doc). parity.py calls it as
    families.rope_check(path, families.hf_layers(model)); hf_layers is the identity here."""
    import numpy as np
    with open(model_json) as f:
        m = json.load(f)
    cfg = model.config
    problems = []
    inner = model.model if hasattr(model, "model") else model
    labels = [c.get("label", "") for c in m["program"]["calls"]]
    kinds = list(cfg.layer_types)
    for l, k in enumerate(kinds):
        gdn = f"l{l}.gdn_rule" in labels
        attn = f"l{l}.attention" in labels
        if gdn != (k == "linear_attention") or attn != (k == "full_attention"):
            problems.append(f"layer {l}: transformers {k}, kern has gdn_rule {gdn} attention {attn}")
    rope = manifest_args(m, "qk_norm_rope", "qk_norm_rope_gated")
    # [q, qkv, ptr, qn, kn, pos, slots, n, Hq, Hkv, D, rot, layer, num_layers, page, theta, eps, flags, off]
    rot, theta, eps, flags, off = rope[11]["i32"], rope[15]["f32"], rope[16]["f32"], rope[17]["i32"], rope[18]["f32"]
    inv = inner.rotary_emb.inv_freq.detach().float().cpu().numpy()
    inexact, max_ulp = 0, 0
    if 2 * len(inv) != rot:
        problems.append(f"rotated dims: kern {rot}, transformers {2 * len(inv)} (head_dim {cfg.head_dim}, partial_rotary_factor)")
    else:
        kinv = kernel_inv_freq(theta, rot)
        u = np.abs(kinv.view(np.int32).astype(np.int64) - inv.astype(np.float32).view(np.int32).astype(np.int64))
        max_ulp, inexact = int(u.max()), int((u > 0).sum())
        # (the kernel rounds the double pow; torch's / numpy's fp32 powf may be 1-2 ulp off it, which
        # flips a bf16 cos / sin only in rare ties; a wrong rotary dim or base is far off)
        if max_ulp > 2:
            problems.append(f"RoPE frequencies {max_ulp} ulp from transformers'")
    if float(inner.rotary_emb.attention_scaling) != 1.0:
        problems.append(f"attention_scaling {inner.rotary_emb.attention_scaling}: kern's gated RoPE has no cos/sin factor")
    if flags != 5 or off != 1.0:
        problems.append(f"q/k norm flags {flags} offset {off}: (1 + w) in fp32 is flags 5, offset 1")
    if abs(eps - cfg.rms_norm_eps) > 1e-12:
        problems.append(f"q/k norm eps {eps} vs {cfg.rms_norm_eps}")
    attn_args = None
    for l in m["ops"]["attention"]["impl"]["launches"]:
        attn_args = l["args"]
        break
    scale = next(a["f32"] for a in attn_args if isinstance(a, dict) and "f32" in a)
    for l, layer in enumerate(inner.layers):
        sa = getattr(layer, "self_attn", None)
        if sa is not None and abs(float(sa.scaling) - scale) > 1e-7 * abs(scale):
            problems.append(f"layer {l}: score scale kern {scale}, transformers {sa.scaling}")
    st = m["states"].get("gdn", {})
    sb = 2 if any(l["entry"].endswith("_bf16") for l in m["ops"]["gdn_rule"]["impl"]["launches"]) else 4
    want = bytes_per_seq(json.load(open(os.path.join(os.path.dirname(model_json), "config.json"))), sb)
    if st.get("bytes_per_seq") != want or st.get("snapshot") is not True:
        problems.append(f"gdn state {st}: want bytes_per_seq {want} with snapshot true")
    n_attn = sum(1 for k in kinds if k == "full_attention")
    kvb = n_attn * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    if m["states"]["kv"]["bytes_per_token"] != kvb:
        problems.append(f"kv bytes_per_token {m['states']['kv']['bytes_per_token']}, want {kvb} ({n_attn} attention layers)")
    return {"pass": not problems, "problems": problems, "inexact": inexact, "max_ulp": max_ulp, "layers": len(kinds),
            "kinds": {"rot_dim": rot, "theta": theta, "gdn_layers": len(kinds) - n_attn, "attn_layers": n_attn, "state_bytes": sb}}


def install_hooks():
    parity.load_hf = load_hf
    fam = types.ModuleType("families")
    fam.rope_check = hybrid_check
    fam.hf_layers = lambda model: model
    sys.modules["families"] = fam


# ============================================================================ prefix cache
def prefix_prompts(seed, id_max):
    import numpy as np
    rng = np.random.default_rng(seed)
    r = lambda n: [int(x) for x in rng.integers(0, id_max, size=n)]  # noqa: E731
    a, b = r(300), r(70)
    prompts = [a, b, a, a[:200] + r(40), b, a, b + r(30), b, r(50), a]
    return prompts


def first_split(a, b):
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)


def pair_diff(toks_a, lg_a, toks_b, lg_b):
    """Two runs of one prompt: the largest |logit difference| over the rows both computed from the
    same prefix (through the first split, whose row still shares it), and at the first split the
    gap in run a's row between the two tokens chosen (a near-tie when small)."""
    import numpy as np
    j = first_split(toks_a, toks_b)
    rows = min(len(toks_a), len(toks_b)) if j is None else j + 1
    d = float(np.max(np.abs(np.asarray(lg_a[:rows], np.float64) - np.asarray(lg_b[:rows], np.float64)))) if rows else 0.0
    gap = None if j is None else float(abs(lg_a[j][toks_a[j]] - lg_a[j][toks_b[j]]))
    return {"split": j, "max_diff": d, "gap": gap}


PREFIX_FLOOR, PREFIX_K, PREFIX_CAP = 0.05, 4.0, 0.5


def judge_prefix(prompts, runs):
    """runs: label -> {"tokens", "logits", "cached"}. Different prefill cuts of one prompt are
    different fp32 reassociations (the chunked delta rule, attention), not bit-identical, so the
    cached runs are held to the noise floor the uncached runs themselves show: the largest logit
    difference between "no cache" and "no cache, 16-token chunks", and between copies of one
    prompt inside "no cache" (admitted in other steps, so cut elsewhere). tol = max(0.05, 4 ×
    that); every run of every prompt must stay within tol of "no cache" through its first split,
    and a split must be a near-tie (gap <= tol). A wrong, missing or misplaced snapshot restores
    another state: differences of the logits' own size from the first generated token. A noise
    floor above 0.5 is itself a failure (the chunked runs disagree: parity's chunked check says
    where)."""
    base = runs["no cache"]
    noise = []
    for i in range(len(prompts)):
        other = runs["no cache, 16-token chunks"]
        noise.append(pair_diff(base["tokens"][i], base["logits"][i], other["tokens"][i], other["logits"][i])["max_diff"])
        for j in range(i):
            if prompts[j] == prompts[i]:
                noise.append(pair_diff(base["tokens"][i], base["logits"][i], base["tokens"][j], base["logits"][j])["max_diff"])
    floor = max(noise) if noise else 0.0
    tol = max(PREFIX_FLOOR, PREFIX_K * floor)
    problems, worst = [], {}
    if floor > PREFIX_CAP:
        problems.append(f"noise floor {floor:.4f} > {PREFIX_CAP}: uncached runs that cut the prompts differently disagree")
    for label, r in runs.items():
        w = {"max_diff": 0.0, "splits": 0, "tokens_equal": 0}
        for i in range(len(prompts)):
            p = pair_diff(r["tokens"][i], r["logits"][i], base["tokens"][i], base["logits"][i])
            w["max_diff"] = max(w["max_diff"], p["max_diff"])
            w["tokens_equal"] += p["split"] is None
            if p["split"] is not None:
                w["splits"] += 1
            if p["max_diff"] > tol:
                problems.append(f"{label}: prompt {i} ({len(prompts[i])} tokens): logits {p['max_diff']:.4f} from the uncached run's (tol {tol:.4f})")
            elif p["split"] is not None and p["gap"] > tol:
                problems.append(f"{label}: prompt {i}: tokens split at step {p['split']} with a logit gap {p['gap']:.4f} > tol {tol:.4f}")
        want_cached = not label.startswith("no cache")
        if r["cached"] is None:
            problems.append(f"{label}: no 'prefix cache N of M' line in kern's stderr")
        elif (r["cached"] > 0) != want_cached:
            problems.append(f"{label}: {r['cached']} prompt tokens from the cache (expected {'some' if want_cached else 'none'})")
        worst[label] = w
    return {"noise_floor": floor, "tol": tol, "runs": worst, "problems": problems}


def prefix_shape(name, a, kern, presets):
    d = os.path.join(a.work, "prefix-" + parity.safe_name(name))
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    model = os.path.join(d, "model")
    try:
        kern(f"{name}.random-weights", ["random-weights", "--preset", name, "-o", model, "--seed", a.seed])
        kern(f"{name}.pack", ["pack", "--config", os.path.join(model, "config.json"), "-o", model, "--kernels", a.kernels,
                              "--max-tokens", 256, "--max-seqs", 4, "--max-context", 1024] + a.pack_arg)
        cfg = json.load(open(os.path.join(model, "config.json")))
        vocab = int(cfg["vocab_size"])
        prompts = prefix_prompts(a.seed, parity.prompt_id_max(vocab))
        runs = {}
        for label, extra in [("no cache", ["--no-prefix-cache"]), ("no cache, 16-token chunks", ["--no-prefix-cache", "--chunk", "16"]),
                             ("cache", []), ("cache, 16-token chunks", ["--chunk", "16"])]:
            dump = os.path.join(d, parity.safe_name(label))
            err, _ = kern(f"{name}.prefix.{parity.safe_name(label)}", parity.gen_args(model, prompts, a.steps, dump, extra=extra + a.kern_arg), show_tail=2)
            toks, logits = parity.read_dump(dump, prompts, a.steps, vocab)
            mm = re.search(r"prefix cache (\d+) of (\d+)", err)
            runs[label] = {"tokens": toks, "logits": logits, "cached": int(mm.group(1)) if mm else None, "prompt_tokens": int(mm.group(2)) if mm else None}
        j = judge_prefix(prompts, runs)
        # Bit for bit: in the cached runs, each later copy of a prompt (a hit, restored from its
        # snapshot) against the prompt's first copy (the miss that took the snapshot, its prefill
        # cut at the same page boundary). Reported, not judged: a GEMM whose kernel is chosen by
        # the step's row count can still differ in the last bits (issue 29's batch invariance).
        exact = {}
        for label in ("cache", "cache, 16-token chunks"):
            same = total = 0
            for i in range(len(prompts)):
                first = next(k for k in range(i + 1) if prompts[k] == prompts[i])
                if first == i:
                    continue
                total += 1
                r = runs[label]
                same += r["tokens"][i] == r["tokens"][first] and all(
                    list(map(float, x)) == list(map(float, y)) for x, y in zip(r["logits"][i], r["logits"][first]))
            exact[label] = f"{same} of {total}"
        row_exact = exact
        row = {"shape": name, "pass": not j["problems"], "problems": j["problems"], "noise_floor": j["noise_floor"], "tol": j["tol"],
               "repeats_bit_identical": row_exact,
               "runs": j["runs"], "cached": {k: v["cached"] for k, v in runs.items()}, "prompt_tokens": runs["cache"]["prompt_tokens"],
               "prompts": [len(p) for p in prompts], "steps": a.steps}
        log(f"  {name}: {'PASS' if row['pass'] else 'FAIL'}: cached prompt tokens {row['cached']} of {row['prompt_tokens']}; "
            f"noise floor {j['noise_floor']:.4g}, tol {j['tol']:.4g}; per run (max logit diff vs uncached, prompts with equal tokens): "
            + ", ".join(f"{k}: {v['max_diff']:.4g} / {v['tokens_equal']}" for k, v in j["runs"].items())
            + "; repeated prompts bit-identical to their first copy: " + ", ".join(f"{k} {v}" for k, v in row_exact.items())
            + "".join(f"\n    {p}" for p in j["problems"]))
        return row
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)


def prefix_main(argv):
    ap = argparse.ArgumentParser(prog="hybrid.py prefix")
    ap.add_argument("--kern", default=".carry/kern")
    ap.add_argument("--kernels", default="build/packs")
    ap.add_argument("--shapes", default=PREFIX_SHAPES)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--work", default="/tmp/kern-hybrid")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--budget", type=int, default=0, help="start no new shape after this many seconds (0: no limit)")
    ap.add_argument("--pack-arg", action="append", default=[])
    ap.add_argument("--kern-arg", action="append", default=[])
    a = ap.parse_args(argv)
    if not os.access(a.kern, os.X_OK):
        print(f"hybrid.py prefix: --kern {a.kern}: not an executable file", file=sys.stderr)
        return 2
    presets = parity.read_presets()
    names = [s for s in a.shapes.split(",") if s]
    for n in names:
        if n not in presets:
            print(f"hybrid.py prefix: no preset {n}", file=sys.stderr)
            return 2
    out = os.environ.get("OUT")
    kern = parity.Kern(a.kern, a.timeout, os.path.join(a.work, "logs"), os.path.join(out, "hybrid-logs") if out else None)
    t0 = time.time()
    rows = []
    for n in names:
        log(f"\n== prefix {n}")
        if a.budget and time.time() - t0 > a.budget:
            rows.append({"shape": n, "pass": False, "error": "not started (--budget)"})
            continue
        try:
            rows.append(prefix_shape(n, a, kern, presets))
        except Exception as e:  # noqa: BLE001
            msg = " / ".join(x.strip() for x in str(e).splitlines() if x.strip())[:400]
            log(f"  {n}: FAIL {type(e).__name__}: {msg}")
            rows.append({"shape": n, "pass": False, "error": f"{type(e).__name__}: {msg}"})
        if out:
            os.makedirs(out, exist_ok=True)
            parity.write_json(os.path.join(out, "hybrid-prefix.json"), {"shapes": rows, "elapsed_s": round(time.time() - t0, 1)})
    ok = all(r["pass"] for r in rows)
    log("\n== prefix cache of the hybrids (same prompts, cached vs uncached, whole and 16-token chunks)")
    for r in rows:
        log(f"  {r['shape']:24s} {'PASS' if r['pass'] else 'FAIL'}  {r.get('cached', r.get('error', ''))}")
    log(f"hybrid prefix: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


# ============================================================================ entry
def parity_main(argv):
    install_hooks()
    out = os.environ.get("OUT")
    if out:
        os.environ.setdefault("PARITY_JSON", os.path.join(out, "hybrid-parity.json"))
        os.environ.setdefault("PARITY_TXT", os.path.join(out, "hybrid-parity.txt"))
        os.environ.setdefault("PARITY_LOGS", os.path.join(out, "hybrid-logs"))
    have = " ".join(argv)
    extra = []
    if "--shapes" not in have:
        extra += ["--shapes", DEFAULT_SHAPES]
    if "--lengths" not in have:
        extra += ["--lengths", "5,70,300"]
    if "--steps" not in have:
        extra += ["--steps", "32"]
    if "--work" not in have:
        extra += ["--work", "/tmp/kern-hybrid"]
    log(f"hybrid parity: torch GDN path: {force_torch_gdn()}")
    return parity.main(extra + list(argv))


def selftest(argv):
    """CPU checks: parity.py's MoE routing diagnostic (margins, near-ties, bf16 flips, the row's
    `routing` and notes, no entry for a dense model); the prompts of the prefix run share what they should; the manifest check passes
    on a packed manifest against a stand-in model with transformers' numbers, and fails on a wrong
    rotary dim / layer kind (needs --kern to pack; skipped without it)."""
    ap = argparse.ArgumentParser(prog="hybrid.py selftest")
    ap.add_argument("--kern", default=".carry/kern")
    ap.add_argument("--kernels", default="build/packs")
    a = ap.parse_args(argv)
    fails = 0

    def check(name, cond):
        nonlocal fails
        print(f"{'PASS' if cond else 'FAIL'} {name}")
        fails += not cond

    parity.routing_selftest(check)  # the MoE routing diagnostic of the parity rows (numpy only)
    p = prefix_prompts(3, 1000)
    check("prefix prompts: 4 copies of A (300), 3 of B (70), A[:200] + 40, B + 30", [len(x) for x in p] == [300, 70, 300, 240, 70, 300, 100, 70, 50, 300]
          and p[0] == p[2] == p[5] == p[9] and p[1] == p[4] == p[7] and p[3][:200] == p[0][:200] and p[6][:70] == p[1])
    import numpy as np
    rng = np.random.default_rng(0)
    V, S = 50, 6
    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]

    def run(noise, cached, bad=None, flip=None):
        lg = [base_lg[i] + noise * rng.standard_normal((S, V)).astype(np.float32) for i in range(3)]
        if bad is not None:
            lg[bad] = lg[bad] + rng.standard_normal((S, V)).astype(np.float32)
        toks = [[int(np.argmax(r)) for r in x] for x in lg]
        if flip is not None:
            toks[flip][2] = (toks[flip][2] + 1) % V
        return {"tokens": toks, "logits": lg, "cached": cached}

    base_lg = [rng.standard_normal((S, V)).astype(np.float32) * 3 for _ in range(3)]
    base_lg[2] = base_lg[0]
    good = {"no cache": run(0.0, 0), "no cache, 16-token chunks": run(0.004, 0), "cache": run(0.004, 3), "cache, 16-token chunks": run(0.004, 3)}
    j = judge_prefix(prompts, good)
    check(f"judge_prefix: small differences pass ({j['problems']}, tol {j['tol']:.3f})", not j["problems"])
    j = judge_prefix(prompts, dict(good, cache=run(0.004, 3, bad=1)))
    check("judge_prefix: a wrong state (logits off by their own size) fails", any("prompt 1" in p for p in j["problems"]))
    j = judge_prefix(prompts, dict(good, cache=run(0.004, 0)))
    check("judge_prefix: a cached run without cached tokens fails", any("from the cache" in p for p in j["problems"]))
    j = judge_prefix(prompts, dict(good, cache=run(0.004, 3, flip=0)))
    check("judge_prefix: a split that is no near-tie fails", any("split" in p for p in j["problems"]))
    if not os.access(a.kern, os.X_OK):
        print(f"(manifest check selftest skipped: no kern at {a.kern})")
        return 1 if fails else 0
    import numpy as np
    for preset in ("qwen3.5-small", "qwen3-next-small-d256"):
        d = tempfile.mkdtemp()
        cfgd = parity.read_presets()[preset]
        open(os.path.join(d, "config.json"), "w").write(json.dumps(cfgd))
        r = subprocess.run([a.kern, "pack", "--config", os.path.join(d, "config.json"), "-o", d, "--kernels", a.kernels], capture_output=True, text=True)
        if r.returncode != 0:
            check(f"{preset}: kern pack ({r.stderr[-300:]})", False)
            continue
        n = cfgd["num_hidden_layers"]
        k = cfgd.get("full_attention_interval", 4)
        kinds = ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(n)]
        open(os.path.join(d, "config.json"), "w").write(json.dumps(dict(cfgd, layer_types=kinds)))
        hd = cfgd["head_dim"]
        rot = int(hd * cfgd["partial_rotary_factor"])
        # transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in fp32
        e = np.arange(0, rot, 2, dtype=np.int64).astype(np.float32) / np.float32(rot)
        inv = np.float32(1.0) / np.power(np.float32(cfgd["rope_theta"]), e, dtype=np.float32)

        def fake(kinds, inv):
            class T:  # a tensor-like with detach().float().cpu().numpy()
                def __init__(s, x): s.x = x
                def detach(s): return s
                def float(s): return s
                def cpu(s): return s
                def numpy(s): return s.x
            layers = [types.SimpleNamespace(self_attn=types.SimpleNamespace(scaling=hd ** -0.5)) if t == "full_attention" else types.SimpleNamespace() for t in kinds]
            inner = types.SimpleNamespace(layers=layers, rotary_emb=types.SimpleNamespace(inv_freq=T(inv), attention_scaling=1.0))
            c = types.SimpleNamespace(layer_types=kinds, head_dim=hd, rms_norm_eps=1e-6, num_key_value_heads=cfgd["num_key_value_heads"])
            return types.SimpleNamespace(model=inner, config=c)

        rc = hybrid_check(os.path.join(d, "model.json"), fake(kinds, inv))
        check(f"{preset}: manifest check passes ({rc['problems']}, {rc['inexact']} inexact)", rc["pass"])
        rc = hybrid_check(os.path.join(d, "model.json"), fake(kinds, inv[: len(inv) // 2]))
        check(f"{preset}: a wrong rotary dim fails", not rc["pass"])
        swapped = list(reversed(kinds))
        rc = hybrid_check(os.path.join(d, "model.json"), fake(swapped, inv))
        check(f"{preset}: wrong layer kinds fail", not rc["pass"] or swapped == kinds)
        shutil.rmtree(d, ignore_errors=True)
    print(f"hybrid.py selftest: {'PASS' if not fails else 'FAIL'}")
    return 1 if fails else 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "parity":
        return parity_main(rest)
    if cmd == "prefix":
        return prefix_main(rest)
    if cmd == "selftest":
        return selftest(rest)
    print(f"hybrid.py: unknown command {cmd} (parity, prefix, selftest)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
