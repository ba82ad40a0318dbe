#!/usr/bin/env python3
"""Helpers of scripts/gpu/families.sh (issue 24: Llama, Mistral, Gemma 3 beside Qwen).

  families.py rope [--kern K] [--kernels build/packs] [--work DIR] [--json FILE]
        The manifest's RoPE, scales and windows against transformers, for configs that need no
        weights: `kern pack --config` of each (llama3 factors 8 and 32, linear 8 on Gemma 3 4B's
        global layers with its unscaled local ones, YaRN with and without mscale, plain RoPE,
        a Mistral window), and transformers' rotary embedding built on the CPU from the same
        config.json (the model itself on the meta device, for its attention modules). CPU only.
  families.py summary RESULTS_DIR [--out FILE] [--json FILE]
        One short table (section, check, numbers, PASS/FAIL) from what the sections wrote.
  families.py selftest
        The pure logic (manifest reading, the comparison, the table) on synthetic data.

The check itself (rope_check) is also run by parity.py and real_model.py on the models they load:
per layer, kern's frequencies — the manifest's table (`rope.inv_freq`, `from.values`) when the
RoPE is scaled, else theta^(-2i/d) as the kernel computes it (the correctly rounded double power
rounded to fp32, then 1/x in fp32: packs/src/rope.rs default_inv) — equal the layer type's
inv_freq of transformers' rotary embedding to 1 ulp (the count of frequencies not bit-exact is
reported), the cos/sin factor equals its attention_scaling, the attention score scale equals the
layer's self_attn.scaling and the layer's sliding window equals transformers'.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REL_TOL = 1e-6  # scales: kern holds fp32, transformers a Python float


# ============================================================================ the manifest side
def manifest_layers(model_json):
    """Per decoder layer of the manifest's program: RoPE base, table (a list of fp32 values or
    None: computed by the kernel), cos/sin factor, attention score scale and sliding window
    (None for none)."""
    with open(model_json) as f:
        m = json.load(f)
    buffers, ops = m["buffers"], m["ops"]
    prog = m["program"]
    calls = prog["calls"] if isinstance(prog, dict) else prog
    by_label = {c.get("label"): c for c in calls}
    out = []
    l = 0
    while f"l{l}.qk_norm_rope" in by_label:
        rope = by_label[f"l{l}.qk_norm_rope"]["args"]
        att = by_label.get(f"l{l}.attention")
        if att is None:
            raise ValueError(f"{model_json}: layer {l} has a RoPE call but no `l{l}.attention` call")
        if len(rope) < 12 or "f32" not in rope[9] or "f32" not in rope[11]:
            raise ValueError(f"{model_json}: l{l}.qk_norm_rope's args 9..11 are not (theta f32, table, cos_scale f32): {rope[9:12]}")
        table = None
        if "buf" in rope[10]:
            b = buffers[rope[10]["buf"]]
            table = {"buffer": rope[10]["buf"], "values": b["from"]["values"]}
        window = att["args"][-1].get("i32")
        scales = set()
        for launch in ops[att["op"]]["impl"]["launches"]:
            if launch["entry"].startswith("attention_") and "combine" not in launch["entry"]:
                scales.update(x["f32"] for x in launch["args"] if isinstance(x, dict) and "f32" in x)
        if len(scales) != 1:
            raise ValueError(f"{model_json}: op {att['op']} has attention scales {sorted(scales)}, expected one")
        out.append({"theta": rope[9]["f32"], "table": table, "cos_scale": rope[11]["f32"], "scale": scales.pop(),
                    "window": window or None})
        l += 1
    if not out:
        raise ValueError(f"{model_json}: no `l0.qk_norm_rope` call in the program")
    return out


def kernel_inv_freq(theta, d):
    """theta^(-2i/d) as the RoPE kernel computes it without a table (packs/src/rope.rs
    default_inv): e = fp32(2i) / fp32(d), p = fp32(theta ** double(e)), 1 / p in fp32."""
    import numpy as np
    out = np.empty(d // 2, dtype=np.float32)
    for i in range(d // 2):
        e = np.float32(2 * i) / np.float32(d)
        p = np.float32(math.pow(float(theta), float(e)))
        out[i] = np.float32(1.0) / p
    return out


def ulps(a, b):
    """Per element, how many fp32 steps apart two positive fp32 arrays are."""
    import numpy as np
    a = np.ascontiguousarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
    b = np.ascontiguousarray(b, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.abs(a - b)


def close(a, b, tol=REL_TOL):
    return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))


# ============================================================================ transformers' side
def hf_layers(model, rotary=None):
    """Per decoder layer as transformers runs it: the inv_freq of the layer's rotary embedding
    (Gemma 3: `{layer_type}_inv_freq`), its attention_scaling, self_attn.scaling and the layer's
    sliding window. `rotary`: a rotary embedding built apart (for a model on the meta device)."""
    cfg = model.config
    inner = model.model if hasattr(model, "model") else model
    if hasattr(inner, "language_model"):
        inner = inner.language_model
    rot = rotary if rotary is not None else inner.rotary_emb
    ltypes = getattr(cfg, "layer_types", None)
    out = []
    for l, layer in enumerate(inner.layers):
        attn = layer.self_attn
        lt = getattr(attn, "layer_type", None) or (ltypes[l] if ltypes else None)
        if lt is not None and hasattr(rot, f"{lt}_inv_freq"):
            inv, sc = getattr(rot, f"{lt}_inv_freq"), getattr(rot, f"{lt}_attention_scaling")
        else:
            inv, sc = rot.inv_freq, rot.attention_scaling
        if hasattr(attn, "sliding_window"):
            w = attn.sliding_window
        elif getattr(cfg, "model_type", "") == "mistral":  # MistralAttention passes config.sliding_window
            w = getattr(cfg, "sliding_window", None)
        else:
            w = None
        out.append({"layer_type": lt, "inv_freq": inv.detach().float().cpu().numpy(), "cos_scale": float(sc),
                    "scale": float(attn.scaling), "window": int(w) if w else None})
    return out


# ============================================================================ the check
def rope_check(model_json, hf):
    """kern's manifest (model.json) against `hf` (hf_layers): per layer, frequencies within 1 ulp,
    cos/sin factor, score scale and window equal. Returns {pass, layers, kinds, inexact, max_ulp,
    problems, ...}; `kinds` describes each distinct RoPE (one per layer type)."""
    import numpy as np
    kl = manifest_layers(model_json)
    problems = []
    if len(kl) != len(hf):
        problems.append(f"{len(kl)} layers in the manifest, {len(hf)} in transformers")
    kinds = {}
    max_ulp = 0
    for l, (k, h) in enumerate(zip(kl, hf)):
        d = 2 * len(h["inv_freq"])
        if k["table"] is not None:
            kinv = np.asarray(k["table"]["values"], dtype=np.float64).astype(np.float32)
            src = f"table {k['table']['buffer']}"
        else:
            kinv = kernel_inv_freq(k["theta"], d)
            src = f"computed, theta {k['theta']:g}"
        key = (src, h.get("layer_type"))
        if kinv.shape != h["inv_freq"].shape:
            problems.append(f"layer {l}: {kinv.shape[0]} frequencies in kern, {h['inv_freq'].shape[0]} in transformers")
            continue
        u = ulps(kinv, h["inv_freq"])
        mu = int(u.max()) if u.size else 0
        max_ulp = max(max_ulp, mu)
        if key not in kinds:
            kinds[key] = {"kern": src, "hf_layer_type": h.get("layer_type"), "layers": [], "max_ulp": mu,
                          "inexact": int((u > 0).sum()), "n": int(u.size), "cos_scale": [k["cos_scale"], h["cos_scale"]],
                          "first_values": [float(x) for x in kinv[:3]], "last_value": float(kinv[-1])}
        kinds[key]["layers"].append(l)
        if mu > 1:
            j = int(u.argmax())
            problems.append(f"layer {l} ({src}): frequency {j} is {mu} ulp from transformers' ({kinv[j]!r} vs {h['inv_freq'][j]!r})")
        if not close(k["cos_scale"], h["cos_scale"]):
            problems.append(f"layer {l}: cos/sin factor {k['cos_scale']} in kern, attention_scaling {h['cos_scale']} in transformers")
        if not close(k["scale"], h["scale"]):
            problems.append(f"layer {l}: attention scale {k['scale']} in kern, {h['scale']} in transformers")
        if (k["window"] or None) != (h["window"] or None):
            problems.append(f"layer {l}: sliding window {k['window']} in kern, {h['window']} in transformers")
    kinds_list = list(kinds.values())
    return {"pass": not problems, "layers": len(kl), "kinds": kinds_list, "inexact": sum(x["inexact"] for x in kinds_list),
            "max_ulp": max_ulp, "windows": sorted({str(k["window"]) for k in kl}), "scale": sorted({k["scale"] for k in kl}),
            "problems": problems[:20]}


def rope_summary(rc):
    """One line: each RoPE kind's source, ulps and factors."""
    if rc.get("error"):
        return f"error: {rc['error']}"
    parts = []
    for k in rc["kinds"]:
        exact = "bit-exact" if k["inexact"] == 0 else f"{k['inexact']}/{k['n']} at {k['max_ulp']} ulp"
        parts.append(f"{k['hf_layer_type'] or 'all'}: {k['kern']} {exact}, cos {k['cos_scale'][0]:.6g}/{k['cos_scale'][1]:.6g}")
    return "; ".join(parts) + f"; scale {rc['scale']}; windows {rc['windows']}"


# ============================================================================ `rope`: configs without weights
ROPE_CONFIGS = [
    # name, preset, overrides, layers (enough to hold every layer type)
    ("llama-3.1-8b llama3 x8", "llama-3.1-8b", {}, 2),
    ("llama-3.2-1b llama3 x32", "llama-3.2-1b", {}, 2),
    ("gemma-3-4b linear x8 + local", "gemma-3-4b", {}, 12),
    ("gemma-3-1b global + local", "gemma-3-1b", {"sliding_window": 48}, 6),
    ("qwen3 yarn x4", "qwen3-0.6b", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
                                     "max_position_embeddings": 131072}, 2),
    ("llama yarn x8 mscale", "llama-3.2-1b", {"rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16384,
                                                               "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 32, "beta_slow": 1},
                                              "max_position_embeddings": 131072}, 2),
    ("llama linear x2", "llama-3.2-1b", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 2),
    # factor 1: kern writes theta^(-2i/d) itself as the table, so the table is also the kernel's
    # computed path as kernel_inv_freq emulates it (checked bit for bit below).
    ("llama linear x1 (table == computed)", "llama-3.2-1b", {"rope_scaling": {"rope_type": "linear", "factor": 1.0}}, 2),
    ("mistral-7b-v0.1 window 64", "mistral-7b-v0.1", {"sliding_window": 64}, 2),
    ("smollm2-135m plain", "smollm2-135m", {}, 2),
]


def hf_from_config(model_dir):
    """transformers' model for a config.json alone: the model on the meta device (its attention
    modules' scales and windows), the rotary embedding on the CPU (real frequencies)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    inner = model.model
    rot = type(inner.rotary_emb)(config=cfg)
    return model, rot


def cmd_rope(a):
    import parity
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    presets = parity.read_presets()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    rows, ok = [], True
    t0 = time.time()
    for name, preset, over, layers in ROPE_CONFIGS:
        if a.only and not any(s in name for s in a.only.split(",")):
            continue
        d = os.path.join(a.work, parity.safe_name(name))
        os.makedirs(d)
        # The config.json transformers reads is the one kern writes (random-weights: every key the
        # family's reader resolved, e.g. rope_theta, written out), from the preset with the
        # overrides; a small vocabulary and MLP keep the weights tiny (RoPE does not see them).
        cfg = parity.shape_config({"preset": preset, "config": dict(over, vocab_size=512, intermediate_size=256)}, presets, layers)
        parity.write_json(os.path.join(d, "src-config.json"), cfg)
        row = {"config": name, "preset": preset, "overrides": over, "layers": layers}
        try:
            for argv in (["random-weights", "--config", os.path.join(d, "src-config.json"), "-o", d],
                         ["pack", "--config", os.path.join(d, "config.json"), "-o", d, "--kernels", a.kernels,
                          "--max-tokens", "64", "--max-seqs", "4", "--max-context", "512"]):
                p = subprocess.run([a.kern] + argv, capture_output=True, text=True, timeout=300)
                if p.returncode != 0:
                    raise RuntimeError(f"kern {argv[0]} exited {p.returncode}: {p.stderr.strip().splitlines()[-3:]}")
            row["config_fixups"] = parity.hf_config_fixups(d)
            model, rot = hf_from_config(d)
            rc = rope_check(os.path.join(d, "model.json"), hf_layers(model, rotary=rot))
            row.update(rc)
            row["rope_parameters"] = str(getattr(model.config, "rope_parameters", None))
            if "table == computed" in name:
                import numpy as np
                ml = manifest_layers(os.path.join(d, "model.json"))[0]
                tab = np.asarray(ml["table"]["values"], dtype=np.float64).astype(np.float32)
                comp = kernel_inv_freq(ml["theta"], 2 * len(tab))
                row["table_equals_computed"] = bool((tab.view(np.int32) == comp.view(np.int32)).all())
                if not row["table_equals_computed"]:
                    row["pass"] = False
                    row["problems"] = row["problems"] + [f"kern's factor-1 table differs from the computed-path emulation at "
                                                         f"{int((tab != comp).sum())} of {len(tab)} frequencies"]
        except Exception as e:  # noqa: BLE001 -- one config's failure is its row's
            row.update({"pass": False, "error": f"{type(e).__name__}: {e}"[:400], "problems": [str(e)[:300]]})
        ok &= bool(row["pass"])
        rows.append(row)
        print(f"{'PASS' if row['pass'] else 'FAIL'} {name}: {rope_summary(row)}", flush=True)
        for pr in row.get("problems", [])[:5]:
            print(f"     {pr}", flush=True)
    res = {"check": "rope", "pass": ok, "rows": rows, "elapsed_s": round(time.time() - t0, 1)}
    if a.json:
        parity.write_json(a.json, res)
    fx = sorted({f for r in rows for f in r.get("config_fixups") or []})
    if fx:
        print(f"note: kern's config.json needed rewriting before transformers would read it: {', '.join(fx)}")
    print(f"rope: {'PASS' if ok else 'FAIL'} ({len(rows)} configs, {res['elapsed_s']} s)")
    return 0 if ok else 1


# ============================================================================ `summary`
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def f3(x, spec=".3f"):
    return "?" if x is None else format(x, spec)


def summary_rows(results):
    """(section, check, numbers, verdict) rows from the files the sections wrote."""
    rows = []
    status = load(os.path.join(results, "sections.json")) or {}
    r = load(os.path.join(results, "rope.json"))
    if r:
        for x in r["rows"]:
            n = "error: " + x["error"] if x.get("error") else (
                f"{x['layers']} layers; " + ", ".join(f"{k['hf_layer_type'] or 'all'} {'exact' if k['inexact'] == 0 else str(k['inexact']) + ' x 1ulp'}"
                                                      f" cos {k['cos_scale'][0]:.4g}" for k in x["kinds"])
                + f"; windows {','.join(x['windows'])}")
            rows.append(("rope", x["config"], n, "PASS" if x["pass"] else "FAIL"))
    for sec in ("parity-small", "parity-large"):
        p = load(os.path.join(results, f"{sec}.json"))
        if not p:
            continue
        for s in p.get("shapes", []):
            if s.get("error"):
                rows.append((sec, s["shape"], s["error"][:90], "NOT RUN" if s["error"].startswith("NotStarted") else "FAIL"))
                continue
            lay = s.get("layers")
            lay = f"{lay}/{s['real_layers']}" if s.get("real_layers") and s["real_layers"] != lay else str(lay)
            n = (f"L{lay} e/bound {f3(s['worst_ratio'])} (e_kern {f3(s['max_e_kern'], '.4f')}, e_bf16 {f3(s['max_e_bf16'], '.4f')}), "
                 f"greedy {s['greedy']}, chunked {f3(s['chunked_max_diff'], '.3g')}, rope {s.get('rope') or '-'}")
            rows.append((sec, s["shape"], n, "PASS" if s["pass"] else "FAIL"))
    for name in sorted(os.listdir(results)) if os.path.isdir(results) else []:
        if name.startswith("real-") and name.endswith(".json"):
            r = load(os.path.join(results, name))
            if not r:
                continue
            if r.get("error"):
                rows.append(("real", r.get("model", name), r["error"][:90], "FAIL"))
                continue
            seqs = r.get("sequences", [])
            worst = max((s["max_ratio"] for s in seqs), default=None)
            npass = sum(1 for s in seqs if s["pass"])
            n = (f"{npass}/{len(seqs)} prompts, worst e/bound {f3(worst)}, weights {r.get('weights_summary', '?')}, "
                 f"ids {r.get('ids_summary', '?')}, answer {r.get('answer_summary', '?')}")
            rows.append(("real", r.get("model", name), n, "PASS" if r.get("pass") else "FAIL"))
    s = load(os.path.join(results, "serve.json"))
    if s:
        for m in s.get("models", []):
            n = (f"{m.get('checks_passed', 0)}/{m.get('checks', 0)} checks, ready {m.get('ready_s', '?')} s"
                 + (f"; {m['answer'][:50]!r}" if m.get("answer") else "") + (f"; failed: {', '.join(m['failed'])[:80]}" if m.get("failed") else ""))
            started = not any(str(f).startswith("not started") for f in m.get("failed") or [])
            rows.append(("serve", m["model"], n, "PASS" if m.get("pass") else "FAIL" if started else "NOT RUN"))
    bdir = os.path.join(results, "bench")
    if os.path.isdir(bdir):
        rows += bench_rows(bdir)
    for sec, st in status.items():
        own = {"real-qwen": "real", "serve-gguf": "serve"}.get(sec, sec)
        if st.get("state") != "ran":
            rows.append((sec, "(section)", st.get("why", st.get("state", "")), "NOT RUN" if st.get("state") == "skipped" else "FAIL"))
        elif st.get("rc") == 124:
            rows.append((sec, "(section)", f"stopped at the budget after {st.get('seconds')} s: what had not finished is missing", "NOT RUN"))
        elif st.get("rc") not in (0, None) and not any(r[0] == own for r in rows):
            rows.append((sec, "(section)", f"exit {st['rc']}, no results (see the logs)", "FAIL"))
    return rows


def bench_rows(bdir, ids=None):
    """The families rows of bench.sh's results (bench_table.build): kern, the peer, the floor,
    kern's fraction of it against the Qwen row's; PASS when at or above it."""
    import bench_table
    table, _ = bench_table.build(bdir, None, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "performance.md"))
    out = []
    for row, c in zip(bench_table.ROWS, table):
        if not (row.id in ids if ids else row.families):
            continue
        n = f"kern {c['kern']}; peer {c['peer_graph']}; floor {c['floor']}; {c['fraction']}; target {c['target']}"
        out.append(("bench", row.measure, n, {True: "PASS", False: "FAIL", None: "?"}[c["met"]]))
    return out


def format_summary(rows):
    w = [max([len(r[i]) for r in rows] + [len(h)]) for i, h in enumerate(("section", "check", "numbers", "result"))]
    w[2] = min(w[2], 150)
    head = f"{'section':<{w[0]}}  {'check':<{w[1]}}  {'numbers':<{w[2]}}  result"
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2][:w[2]]:<{w[2]}}  {r[3]}")
    return "\n".join(out)


def cmd_summary(a):
    rows = summary_rows(a.results)
    text = format_summary(rows) if rows else "(no results)"
    fails = sum(1 for r in rows if r[3] == "FAIL")
    notrun = sum(1 for r in rows if r[3] == "NOT RUN")
    text += f"\n\nfamilies: {'PASS' if rows and not fails else 'FAIL'} ({len(rows) - fails - notrun} pass, {fails} fail, {notrun} not run)"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if a.json:
        merged = {}
        for name in sorted(os.listdir(a.results)):
            if name.endswith(".json"):
                merged[name[:-5]] = load(os.path.join(a.results, name))
        merged["table"] = rows
        with open(a.json, "w") as f:
            json.dump(merged, f, indent=1, default=str)
    return 0 if rows and not fails else 1


# ============================================================================ selftest
def selftest():
    import tempfile
    import numpy as np
    n_ok = n_bad = 0

    def check(name, cond):
        nonlocal n_ok, n_bad
        if cond:
            n_ok += 1
        else:
            n_bad += 1
            print(f"selftest FAIL: {name}")

    # the kernel's default frequencies: theta^(-2i/d) in fp32, within an ulp of numpy's fp32 path
    inv = kernel_inv_freq(10000.0, 128)
    ref = (1.0 / (10000.0 ** (np.arange(0, 128, 2, dtype=np.float32) / np.float32(128)))).astype(np.float32)
    check("default frequencies within 2 ulp of numpy's fp32 power", ulps(inv, ref).max() <= 2 and inv[0] == 1.0)
    check("ulps counts fp32 steps", ulps(np.float32([1.0]), np.nextafter(np.float32([1.0]), np.float32(2)))[0] == 1)

    def manifest(tmp, layers, table=None, windows=None, scale=0.125, cos=1.0, theta=10000.0, d=64):
        buffers = {}
        if table is not None:
            buffers["rope.inv_freq"] = {"dtype": "f32", "shape": [len(table)], "from": {"values": [float(x) for x in table]}}
        calls = []
        for l in range(layers):
            tb = {"buf": "rope.inv_freq"} if table is not None else {"null": True}
            calls.append({"label": f"l{l}.qk_norm_rope", "op": "qk_norm_rope",
                          "args": [{"buf": "qkv"}, {"state": "kv"}, {}, {}, {}, {}, {}, {"var": "tokens"}, {"i32": l},
                                   {"f32": theta}, tb, {"f32": cos}]})
            calls.append({"label": f"l{l}.attention", "op": "attention",
                          "args": [{"buf": "attn"}, {"i32": l}, {"i32": (windows or [0] * layers)[l]}]})
        ops = {"attention": {"impl": {"launches": [{"entry": f"attention_prefill_d{d}", "args": [{"param": 0}, {"f32": scale}]},
                                                   {"entry": f"attention_combine_d{d}", "args": [{"param": 0}]}]}}}
        p = os.path.join(tmp, f"m{len(os.listdir(tmp))}.json")
        with open(p, "w") as f:
            json.dump({"buffers": buffers, "ops": ops, "program": {"calls": calls}}, f)
        return p

    def hf(layers, inv, scale=0.125, cos=1.0, windows=None, lt=None):
        return [{"layer_type": lt, "inv_freq": inv, "cos_scale": cos, "scale": scale, "window": (windows or [None] * layers)[l]}
                for l in range(layers)]

    with tempfile.TemporaryDirectory() as tmp:
        base = kernel_inv_freq(10000.0, 64)
        r = rope_check(manifest(tmp, 2), hf(2, base))
        check("computed frequencies equal: pass, exact", r["pass"] and r["inexact"] == 0 and r["layers"] == 2)
        one = base.copy()
        one[5] = np.nextafter(one[5], np.float32(1))
        r = rope_check(manifest(tmp, 2), hf(2, one))
        check("1 ulp off passes, counted", r["pass"] and r["inexact"] == 1 and r["max_ulp"] == 1)
        two = base.copy()
        two[5] = np.nextafter(np.nextafter(two[5], np.float32(1)), np.float32(1))
        r = rope_check(manifest(tmp, 2), hf(2, two))
        check("2 ulp off fails", not r["pass"] and "2 ulp" in r["problems"][0])
        scaled = (base / np.float32(8)).astype(np.float32)
        r = rope_check(manifest(tmp, 2, table=scaled), hf(2, scaled))
        check("a table is used when the manifest has one", r["pass"] and r["kinds"][0]["kern"].startswith("table"))
        r = rope_check(manifest(tmp, 2, table=scaled), hf(2, base))
        check("a table that differs fails", not r["pass"])
        r = rope_check(manifest(tmp, 2, cos=float(np.float32(1.1386294361119891))), hf(2, base, cos=1.1386294361119891))
        check("cos factor within fp32 rounding passes", r["pass"])
        r = rope_check(manifest(tmp, 2, cos=1.0), hf(2, base, cos=1.1386))
        check("a missing YaRN factor fails", not r["pass"] and "cos/sin" in r["problems"][0])
        r = rope_check(manifest(tmp, 2, scale=0.0625), hf(2, base, scale=0.125))
        check("score scale differs: fails", not r["pass"] and "attention scale" in r["problems"][0])
        r = rope_check(manifest(tmp, 3, windows=[48, 48, 0]), hf(3, base, windows=[48, 48, None]))
        check("windows per layer equal: pass", r["pass"] and r["windows"] == ["48", "None"])
        r = rope_check(manifest(tmp, 3, windows=[48, 0, 0]), hf(3, base, windows=[48, 48, None]))
        check("a window missing fails", not r["pass"] and "window" in r["problems"][0])
        r = rope_check(manifest(tmp, 3), hf(2, base))
        check("layer count differs: fails", not r["pass"])
        try:
            p = manifest(tmp, 1)
            m = json.load(open(p))
            m["ops"]["attention"]["impl"]["launches"].append({"entry": "attention_decode_d64", "args": [{"f32": 0.5}]})
            json.dump(m, open(p, "w"))
            manifest_layers(p)
            check("two attention scales are an error", False)
        except ValueError:
            check("two attention scales are an error", True)
        check("summary line", "bit-exact" in rope_summary(rope_check(manifest(tmp, 1), hf(1, base))))

        # summary table from section files
        res = os.path.join(tmp, "res")
        os.makedirs(res)
        json.dump({"check": "rope", "pass": True, "rows": [dict(rope_check(manifest(tmp, 1), hf(1, base)), config="c1")]},
                  open(os.path.join(res, "rope.json"), "w"))
        json.dump({"shapes": [{"shape": "gemma-3-1b-sw48", "layers": 26, "real_layers": 26, "worst_ratio": 0.5, "max_e_kern": 0.1,
                               "max_e_bf16": 0.1, "greedy": "=,=", "chunked_max_diff": 0.01, "rope": "ok", "pass": True},
                              {"shape": "x", "error": "RuntimeError: boom", "pass": False}]}, open(os.path.join(res, "parity-small.json"), "w"))
        json.dump({"model": "smollm2-135m", "pass": True, "sequences": [{"max_ratio": 0.4, "pass": True}], "weights_summary": "9/9",
                   "ids_summary": "4/4", "answer_summary": "Paris"}, open(os.path.join(res, "real-smollm2-135m.json"), "w"))
        json.dump({"models": [{"model": "m", "pass": False, "checks": 5, "checks_passed": 4, "failed": ["chat stream"], "ready_s": 1.2}]},
                  open(os.path.join(res, "serve.json"), "w"))
        json.dump({"bench": {"state": "skipped", "why": "budget: 20 s left, needs 200"}, "rope": {"state": "ran", "rc": 0}},
                  open(os.path.join(res, "sections.json"), "w"))
        rows = summary_rows(res)
        verdicts = {(r[0], r[1]): r[3] for r in rows}
        check("summary: rows of every section", verdicts.get(("rope", "c1")) == "PASS" and verdicts.get(("parity-small", "gemma-3-1b-sw48")) == "PASS"
              and verdicts.get(("parity-small", "x")) == "FAIL" and verdicts.get(("real", "smollm2-135m")) == "PASS"
              and verdicts.get(("serve", "m")) == "FAIL" and verdicts.get(("bench", "(section)")) == "NOT RUN")
        text = format_summary(rows)
        check("summary: a table", text.count("\n") == len(rows) + 1 and "chat stream" in text)
        print(text)
    print(f"selftest: {n_ok} passed, {n_bad} failed")
    return 0 if n_bad == 0 else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rope")
    r.add_argument("--kern", default=".carry/kern")
    r.add_argument("--kernels", default="build/packs")
    r.add_argument("--work", default="/tmp/kern-rope")
    r.add_argument("--json")
    r.add_argument("--only", help="comma-separated substrings of the config names")
    r.set_defaults(f=cmd_rope)
    s = sub.add_parser("summary")
    s.add_argument("results")
    s.add_argument("--out")
    s.add_argument("--json")
    s.set_defaults(f=cmd_summary)
    t = sub.add_parser("selftest")
    t.set_defaults(f=lambda a: selftest())
    a = ap.parse_args(argv)
    return a.f(a)


if __name__ == "__main__":
    sys.exit(main())
