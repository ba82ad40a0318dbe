#!/usr/bin/env python3
"""Helpers of scripts/gpu/moe.sh (issue 26: mixture-of-experts models, Qwen3-MoE).

  moe_check.py routing [--shapes S,...] [--lengths 37,200] [--kern .carry/kern] [--kernels build/packs]
        [--work DIR] [--json FILE] [--device cuda]
      kern's routing against transformers', per MoE layer, on random weights: for each shape (a
      parity.py shape: preset[:key=value...]) `kern random-weights` + `kern pack`, then for each
      prompt length one prefill through the manifest cut after `lL.moe_select` (`kern run`,
      outputs moe_ids / moe_w / moe_logits), and transformers' router (Qwen3MoeForCausalLM in
      bf16 and fp32; forward pre-hooks on every `mlp.gate` catch the hidden states it routes,
      from which the router is computed as transformers does: F.linear, softmax in fp32, topk,
      norm_topk_prob, cast). A token's experts must be the same set on both sides unless the
      row is tied: the gap between transformers' k-th and (k+1)-th bf16 logits is at most the
      spread of the differences between kern's and transformers' logits of that token,
      max(Δ) - min(Δ) with Δ = kern - transformers (the most by which the difference of two
      experts' logits can move from one side to the other; a shift of every logit moves none),
      or one bf16 ulp. Lengths <= 64 run moe_gemm_s, longer ones moe_gemm_l (the earlier layers' outputs
      feed the later layers' routing). Exit 1 when an untied row differs.
  moe_check.py parity [parity.py's arguments]
      scripts/gpu/parity.py with transformers' experts pinned to the eager loop (transformers 5
      picks a grouped-GEMM backend by default; the loop is the reference this issue documents:
      bf16 index_add_ over the experts in ascending order), where set_experts_implementation exists.
  moe_check.py peer --model DIR [--json FILE] [--device cuda]
      transformers' own bf16 model as the peer of the bench rows (its default experts backend,
      named in the table: transformers 5.17 runs torch._grouped_mm):
      batch-1 decode step (128-token prompt), batch-64 decode step (256-token prompts),
      prefill of one 8,192-token prompt; median times.
  moe_check.py table --results DIR --config CONFIG.JSON [--md FILE]
      The bench table from kern bench's JSON (b1.json, b64.json, prefill.json) and peer.json in
      DIR: kern, peer, the floor of the ACTIVE bytes (attention, norms, routers, the experts a
      step reads — k per layer at batch 1, E·(1 − (1 − k/E)^b) under a uniform routing at batch
      b — the LM head and the KV cache, at kern bench's measured copy bandwidth; the embedding
      reads only its rows) and the prefill's active FLOPs at the bf16 peak.
  moe_check.py selftest
      The comparison and floor logic on synthetic data (numpy only, no GPU).
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parity  # noqa: E402
from parity import log  # noqa: E402

BF16_PEAK_TFLOPS = 989.0  # H200 dense bf16 (as bench_table.py)
DEFAULT_SHAPES = "qwen3-moe-small,qwen3-30b-a3b:layers=2"


# ============================================================================ transformers' experts
def pin_eager_experts(model):
    """transformers 5: the experts' loop (`eager`) instead of its default grouped-GEMM backend;
    returns the implementation the model runs (None: a transformers without the choice)."""
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception as e:  # an older 5.x without "eager": keep its default, say so
            log(f"  transformers: set_experts_implementation('eager') failed ({e}); keeping its default")
    return getattr(model.config, "_experts_implementation", None)


def load_hf_eager(*args, **kwargs):
    model, dt = _load_hf(*args, **kwargs)
    impl = pin_eager_experts(model)
    log(f"  transformers: experts implementation {impl or 'the loop (no choice in this version)'}")
    return model, dt


_load_hf = parity.load_hf


# ============================================================================ routing
def bf16_ulp(v):
    v = abs(float(v))
    return 2.0 ** (math.floor(math.log2(v)) - 7) if v > 0 else 2.0 ** -133


def compare_routing(k_ids, k_w, k_logits, h_ids, h_w, h_logits, k):
    """Per token: kern's and transformers' expert sets, ties, weight differences. Arrays [T, k]
    (ids, weights) and [T, E] (logits, as float). Returns a dict of counts and the worst rows."""
    import numpy as np
    T, E = h_logits.shape
    out = {"tokens": int(T), "equal": 0, "tied": 0, "tied_differ": 0, "differ": 0, "w_maxdiff": 0.0, "examples": []}
    for t in range(T):
        z = np.sort(h_logits[t])[::-1]
        gap = float(z[k - 1] - z[k]) if E > k else float("inf")
        # Two experts swap places only if the difference of their logits changes sign between
        # the sides: it moves by Δa - Δb, at most max(Δ) - min(Δ) (up to 2 max|Δ|).
        delta = k_logits[t].astype(np.float64) - h_logits[t].astype(np.float64)
        disc = float(delta.max() - delta.min())
        tied = gap <= max(disc, bf16_ulp(z[k - 1]))
        same = set(int(x) for x in k_ids[t]) == set(int(x) for x in h_ids[t])
        out["tied"] += tied
        if same:
            out["equal"] += 1
            kw = dict(zip(map(int, k_ids[t]), map(float, k_w[t])))
            for e, w in zip(map(int, h_ids[t]), map(float, h_w[t])):
                out["w_maxdiff"] = max(out["w_maxdiff"], abs(kw[e] - w))
        elif tied:
            out["tied_differ"] += 1
        else:
            out["differ"] += 1
            if len(out["examples"]) < 3:
                out["examples"].append({"token": t, "kern": sorted(map(int, k_ids[t])), "hf": sorted(map(int, h_ids[t])), "gap": gap, "logit_spread": disc})
    return out


def hf_routing(model, ids, device, norm, k):
    """Per MoE layer index: (ids [T, k], weights [T, k], logits [T, E]) as transformers routes
    `ids` (one sequence), from the hidden states each `mlp.gate` receives."""
    import torch
    import torch.nn.functional as F
    caught, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "weight"):
            continue  # a dense layer
        def pre(mod, args, i=i):
            caught[i] = args[0].reshape(-1, args[0].shape[-1]).detach()
        hooks.append(gate.register_forward_pre_hook(pre))
    try:
        with torch.inference_mode():
            model(torch.tensor([ids], device=device), use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    out = {}
    with torch.inference_mode():
        for i, h in caught.items():
            w = model.model.layers[i].mlp.gate.weight
            logits = F.linear(h, w)
            probs = F.softmax(logits, dim=-1, dtype=torch.float)
            top_v, top_i = torch.topk(probs, k, dim=-1)
            if norm:
                top_v = top_v / top_v.sum(dim=-1, keepdim=True)
            top_v = top_v.to(logits.dtype)
            out[i] = (top_i.cpu().numpy(), top_v.float().cpu().numpy(), logits.float().cpu().numpy())
    return out


def routing(a):
    import numpy as np
    import torch
    presets = parity.read_presets()
    kern = parity.Kern(a.kern, a.timeout, os.path.join(a.work, "logs"))
    parity.torch_setup(a.device)
    lengths = [int(x) for x in a.lengths.split(",")]
    report, bad = {}, 0
    for spec in a.shapes.split(","):
        shape = parity.parse_shape(spec, presets)
        cfg = parity.shape_config(shape, presets)
        d = os.path.join(a.work, parity.safe_name(spec))
        os.makedirs(d, exist_ok=True)
        parity.write_json(os.path.join(d, "in-config.json"), cfg)
        kern(f"{spec}-weights", ["random-weights", "--config", os.path.join(d, "in-config.json"), "-o", d, "--seed", a.seed])
        kern(f"{spec}-pack", ["pack", "--config", os.path.join(d, "config.json"), "-o", d, "--kernels", a.kernels, "--max-tokens", max(lengths),
                              "--max-seqs", 4, "--max-context", 1024] + list(a.pack_arg))
        k, norm = int(cfg["num_experts_per_tok"]), bool(cfg.get("norm_topk_prob", False))
        model_json = os.path.join(d, "model.json")
        labels = parity.moe_select_labels(model_json)
        prompts = parity.make_prompts(lengths, a.seed, parity.prompt_id_max(cfg["vocab_size"]))
        kern_r = {}
        for pi, ids in enumerate(prompts):
            inputs = parity.step_inputs(model_json, os.path.join(d, f"in-{pi}"), ids)
            for layer, label in sorted(labels.items()):
                cut = os.path.join(d, f"model.cut-{layer}.json")
                parity.cut_after(model_json, label, cut)
                od = os.path.join(d, f"out-{pi}-{layer}")
                kern(f"{spec}-run-{pi}-{layer}", ["run", cut, "--weights", d, "--set", f"tokens={len(ids)}", "--set", "seqs=1", *inputs,
                                                  "--output", "moe_ids", "--output", "moe_w", "--output", "moe_logits", "--out-dir", od])
                kern_r[(pi, layer)] = tuple(np.load(os.path.join(od, f"{n}.npy"))[: len(ids)] for n in ("moe_ids", "moe_w", "moe_logits"))
        rows = []
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            model, _ = parity.load_hf(d, dtype, a.device, "eager")
            for pi, ids in enumerate(prompts):
                hf = hf_routing(model, ids, a.device, norm, k)
                for layer in sorted(hf):
                    ki, kw, kl = kern_r[(pi, layer)]
                    hi, hw, hl = hf[layer]
                    c = compare_routing(ki, kw.astype(np.float64), kl.astype(np.float64), hi, hw, hl, k)
                    c.update({"ref": name, "prompt_tokens": len(ids), "layer": layer, "gemm": "moe_gemm_s" if len(ids) <= 64 else "moe_gemm_l"})
                    rows.append(c)
                    if name == "bf16":
                        bad += c["differ"]
            del model
            parity.free_cuda()
        report[spec] = rows
        log(f"\n{spec}: routing per MoE layer (kern vs transformers bf16 / fp32 router on its own hidden states)")
        log(f"{'ref':>5} {'tokens':>6} {'layer':>5} {'equal':>6} {'tied':>5} {'tied≠':>6} {'DIFFER':>6} {'max|Δw|':>9}")
        for r in rows:
            log(f"{r['ref']:>5} {r['prompt_tokens']:>6} {r['layer']:>5} {r['equal']:>6} {r['tied']:>5} {r['tied_differ']:>6} {r['differ']:>6} {r['w_maxdiff']:>9.2e}")
            for ex in r["examples"]:
                log(f"      differ at token {ex['token']}: kern {ex['kern']} hf {ex['hf']} gap {ex['gap']:.3g} logit spread (kern - hf) {ex['logit_spread']:.3g}")
    if a.json:
        parity.write_json(a.json, report)
    total = sum(r["tokens"] for rows in report.values() for r in rows if r["ref"] == "bf16")
    log(f"\nrouting: {'PASS' if bad == 0 else 'FAIL'}: {bad} untied token-layers differ from transformers bf16 of {total}")
    return 0 if bad == 0 else 1


# ============================================================================ bench
def active_bytes(cfg, batch):
    """Weight bytes a decode step of `batch` sequences reads (bf16): attention, norms, routers,
    the experts it touches (expected, uniform routing), dense MLPs, final norm, LM head."""
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or H // hq
    E, k, I = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    step, dense = max(1, cfg.get("decoder_sparse_step", 1)), set(cfg.get("mlp_only_layers") or [])
    attn = ((hq + 2 * hkv) * D * H + hq * D * H + 2 * H + 2 * D) * 2
    experts = E * (1 - (1 - k / E) ** batch)
    total = 0.0
    for l in range(L):
        total += attn
        if l not in dense and (l + 1) % step == 0:
            total += (E * H + experts * 3 * I * H) * 2
        else:
            total += 3 * cfg["intermediate_size"] * H * 2
    total += (H + V * H) * 2 + batch * H * 2  # final norm, LM head, the embedding's rows
    return total


def active_flops(cfg, tokens):
    """FLOPs of a prefill of one `tokens`-token prompt: 2 × tokens × the active weights of one
    token (k experts), causal attention (QKᵀ and PV over half the square), one LM-head row."""
    per_tok = active_bytes(cfg, 1) / 2 - (cfg["vocab_size"] + 1) * cfg["hidden_size"]  # params, without LM head and embedding row
    hq = cfg["num_attention_heads"]
    D = cfg.get("head_dim") or cfg["hidden_size"] // hq
    attn = 2 * 2 * cfg["num_hidden_layers"] * hq * D * tokens * tokens / 2
    return 2 * tokens * per_tok + attn + 2 * cfg["vocab_size"] * cfg["hidden_size"]


def peer_label(peer):
    """What the peer's experts ran, from peer.json's `experts_implementation` (transformers 5
    picks one: `grouped_mm` is torch._grouped_mm, one grouped GEMM over the experts; `eager` or
    none is its Python loop over experts)."""
    impl = peer.get("experts_implementation") if peer else None
    if impl == "grouped_mm":
        return "experts: torch._grouped_mm"
    if impl in (None, "eager"):
        return "experts: its loop over experts" if peer else "not run"
    return f"experts: {impl}"


def table(a):
    cfg = json.load(open(a.config))
    R = a.results
    def load(n):
        p = os.path.join(R, n)
        return json.load(open(p)) if os.path.exists(p) else None
    peer = load("peer.json") or {}
    rows = []
    for key, batch, what in (("b1", 1, "batch-1 decode step, 128-token context"), ("b64", 64, "batch-64 decode step, 256-token contexts"),
                             ("prefill", 0, "prefill, one 8,192-token prompt")):
        j = load(f"{key}.json")
        err = open(os.path.join(R, f"{key}.json.err")).read().strip() if os.path.exists(os.path.join(R, f"{key}.json.err")) else "not run"
        p = peer.get(key)
        row = {"measure": f"Qwen3-30B-A3B ({cfg['num_hidden_layers']} layers) {what}", "kern": err if j is None else None, "peer": "–", "floor": "–", "fraction": "–"}
        if isinstance(p, (int, float)):
            row["peer"] = f"{p:.2f} ms" if batch else f"{8192 / p * 1e3:,.0f} tok/s ({p:.0f} ms)"
        if j is not None:
            if batch:
                kv = max(0.0, (j.get("bytes_per_step") or 0) - (j.get("weight_bytes") or 0))
                gbs = j.get("copy_gbs")
                row["kern"] = f"{j['median_ms']:.3f} ms ({j['tok_per_s']:,.0f} tok/s)"
                if gbs:
                    floor = (active_bytes(cfg, batch) + kv) / (gbs * 1e9) * 1e3
                    row["floor"] = f"{floor:.3f} ms ({(active_bytes(cfg, batch) + kv) / 1e9:.2f} GB at {gbs / 1e3:.2f} TB/s)"
                    row["fraction"] = f"{floor / j['median_ms']:.0%} of floor"
            else:
                fl = active_flops(cfg, 8192)
                floor = fl / (BF16_PEAK_TFLOPS * 1e12) * 1e3
                row["kern"] = f"{j['tok_per_s']:,.0f} tok/s ({j['median_ms']:.0f} ms)"
                row["floor"] = f"{floor:.1f} ms ({fl / 1e12:.1f} TFLOP at {BF16_PEAK_TFLOPS:g} TFLOP/s)"
                row["fraction"] = f"{floor / j['median_ms']:.0%} of peak"
        rows.append(row)
    lines = [f"| measure | kern | peer: transformers bf16 ({peer_label(peer)}) | floor (active) | kern vs floor |", "|---|---|---|---|---|"]
    lines += [f"| {r['measure']} | {r['kern']} | {r['peer']} | {r['floor']} | {r['fraction']} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    return 0


def peer(a):
    import torch
    parity.torch_setup(a.device)
    from transformers import AutoModelForCausalLM
    t0 = time.time()
    # Straight onto the GPU (device_map): 61 GB of weights are not staged in host memory first.
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa", device_map=a.device).eval()
    load_s = time.time() - t0
    impl = getattr(model.config, "_experts_implementation", None)
    log(f"peer: transformers bf16 loaded in {load_s:.0f} s (experts implementation: {impl or 'the loop'})")
    V = model.config.vocab_size
    g = torch.Generator(device="cpu").manual_seed(0)
    out = {"experts_implementation": impl}

    def timed(fn, n):
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[len(ts) // 2]

    with torch.inference_mode():
        for key, batch, ctx in (("b1", 1, 128), ("b64", 64, 256)):
            ids = torch.randint(0, min(V, parity.PROMPT_ID_MAX), (batch, ctx), generator=g).to(a.device)
            o = model(ids, use_cache=True, logits_to_keep=1)
            past, nxt = o.past_key_values, o.logits[:, -1].argmax(-1, keepdim=True)
            def step():
                nonlocal past, nxt
                o2 = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = o2.past_key_values, o2.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(3):
                step()
            out[key] = timed(step, 16)
            log(f"peer {key}: {out[key]:.2f} ms per step")
            del past, o
            parity.free_cuda()
        ids = torch.randint(0, min(V, parity.PROMPT_ID_MAX), (1, 8192), generator=g).to(a.device)
        out["prefill"] = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), 3)
        log(f"peer prefill 8192: {out['prefill']:.0f} ms")
    parity.write_json(a.json, out)
    return 0


# ============================================================================ selftest
def selftest():
    import numpy as np
    fails = []
    def check(name, cond):
        print(("PASS " if cond else "FAIL ") + name)
        if not cond:
            fails.append(name)
    check("peer label names the experts backend the peer ran",
          peer_label({"experts_implementation": "grouped_mm"}) == "experts: torch._grouped_mm"
          and peer_label({"experts_implementation": "eager"}) == "experts: its loop over experts"
          and peer_label({}) == "not run")
    rng = np.random.default_rng(0)
    T, E, k = 6, 16, 4
    hl = np.round(rng.normal(size=(T, E)) * 64) / 64  # bf16-representable-ish
    hl[1, :] = 0.0
    hl[1, [3, 7, 9]] = 1.0  # token 1: ties at the boundary (k = 4: 3 ones, then 13 zeros)
    order = np.argsort(-hl, axis=1, kind="stable")
    hi, hw = order[:, :k], np.full((T, k), 0.25)
    ki, kw, kl = hi.copy(), hw.copy(), hl.copy()
    c = compare_routing(ki, kw, kl, hi, hw, hl, k)
    check("identical routing: every token equal", c["equal"] == T and c["differ"] == 0)
    check("a tie at the boundary is counted as tied", c["tied"] >= 1)
    ki2 = ki.copy()
    ki2[1, 3] = 12  # token 1's 4th expert: another of the tied zeros
    c = compare_routing(ki2, kw, kl, hi, hw, hl, k)
    check("a different choice among tied logits is excused", c["tied_differ"] == 1 and c["differ"] == 0)
    ki3 = ki.copy()
    ki3[0, 0] = order[0, k + 3]
    kl3 = kl.copy()
    c = compare_routing(ki3, kw, kl3, hi, hw, hl, k)
    gap0 = np.sort(hl[0])[::-1]
    check("an untied difference is an error", (c["differ"] == 1) == (gap0[k - 1] - gap0[k] > bf16_ulp(gap0[k - 1])))
    kl4 = kl.copy()
    kl4[0] += 10.0  # the same shift of every logit moves no difference between two experts
    c = compare_routing(ki3, kw, kl4, hi, hw, hl, k)
    check("a shift of every logit excuses nothing", (c["differ"] == 1) == (gap0[k - 1] - gap0[k] > bf16_ulp(gap0[k - 1])))
    z0 = np.sort(hl[0])[::-1]
    g0 = float(z0[k - 1] - z0[k])
    a, b = int(order[0, k]), int(order[0, k - 1])  # the (k+1)-th expert and the k-th
    ki5 = ki.copy()
    ki5[0, k - 1] = a  # kern swaps the k-th expert for the (k+1)-th
    for frac, excused, what in ((0.6, True, "a swap within the spread (each logit moved by 0.6 gap, opposite ways) is excused"),
                                (0.4, False, "a swap beyond the spread (each moved by 0.4 gap) is an error")):
        kl5 = kl.copy()
        kl5[0, a] += frac * g0
        kl5[0, b] -= frac * g0
        c = compare_routing(ki5, kw, kl5, hi, hw, hl, k)
        check(what, (c["differ"] == 0) == excused)
    cfg = parity.read_presets()["qwen3-30b-a3b"]
    b1, b64 = active_bytes(cfg, 1), active_bytes(cfg, 64)
    # Qwen3-30B-A3B: ~3.3 B active parameters (k = 8 of 128 experts) of ~30.5 B.
    check(f"batch-1 active bytes {b1 / 1e9:.2f} GB ≈ 2 × 3.3 B parameters", 5.5e9 < b1 < 7.0e9)
    check(f"batch-64 active bytes {b64 / 1e9:.1f} GB: nearly every expert", 58e9 < b64 < 62e9)
    fl = active_flops(cfg, 8192)
    check(f"prefill FLOPs {fl / 1e12:.0f} TFLOP ≈ 2 × 8192 × 2.7 B (45) + causal attention (26)", 65e12 < fl < 78e12)
    print(f"{len(fails)} failed" if fails else "all passed")
    return 1 if fails else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["parity"]:  # everything after it is parity.py's
        parity.load_hf = load_hf_eager
        return parity.main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("routing")
    r.add_argument("--shapes", default=DEFAULT_SHAPES)
    r.add_argument("--lengths", default="37,200")
    r.add_argument("--kern", default=".carry/kern")
    r.add_argument("--kernels", default="build/packs")
    r.add_argument("--work", default="/tmp/kern-moe-routing")
    r.add_argument("--json")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--timeout", type=int, default=600)
    r.add_argument("--device", default="cuda")
    r.add_argument("--pack-arg", action="append", default=[], help="extra argument for `kern pack` (repeatable, e.g. --pack-arg=--router-logits --pack-arg=f32)")
    p = sub.add_parser("peer")
    p.add_argument("--model", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--device", default="cuda")
    t = sub.add_parser("table")
    t.add_argument("--results", required=True)
    t.add_argument("--config", required=True)
    t.add_argument("--md")
    sub.add_parser("parity", help="scripts/gpu/parity.py's arguments follow")
    sub.add_parser("selftest")
    a = ap.parse_args(argv)
    if a.cmd == "routing":
        parity.load_hf = load_hf_eager
        return routing(a)
    if a.cmd == "peer":
        return peer(a)
    if a.cmd == "table":
        return table(a)
    return selftest()


if __name__ == "__main__":
    sys.exit(main())
