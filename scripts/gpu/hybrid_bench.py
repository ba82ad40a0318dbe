#!/usr/bin/env python3
"""Issue 30 item 5 ("Measured"): the Gated DeltaNet hybrids' numbers on the GPU — per-sequence state
vs KV at Qwen3-Next-80B-A3B's real shape, kern bench decode / prefill of a reduced-depth
Qwen3-Next-80B-A3B beside the floor of its ACTIVE bytes, and a shared-prefix `kern serve` run of
qwen3-next-small with and without the prefix cache (GDN snapshots).

    python3 scripts/gpu/hybrid_bench.py bench [--kern .carry/kern] [--kernels build/packs]
        [--preset qwen3-next-80b-a3b] [--layers 4] [--context 256] [--steps 64]
        [--prompt-tokens 8192] [--work DIR] [--json FILE] [--budget SECONDS]
    python3 scripts/gpu/hybrid_bench.py serve [--kern .carry/kern] [--kernels build/packs]
        [--tok .carry/tok] [--preset qwen3-next-small] [--requests 16] [--prefix 2000]
        [--distinct 50] [--new 32] [--work DIR] [--json FILE] [--budget SECONDS]
    python3 scripts/gpu/hybrid_bench.py selftest [--kern build/lead/kern] [--kernels build/packs]
        # CPU only, no torch: the arithmetic against hand-computed values, the argument checks, the
        # table, a broken input; with an executable --kern also the full-depth packs (no weights),
        # and bench / serve end to end against kern's CPU fake model (kern bench/serve --fake)

bench:
  1. State vs KV at the REAL full depth (48 layers: 36 GDN, 12 full attention): `kern pack` of the
     preset's config.json alone (pack needs no weights) with --gdn-state f32 and bf16; the manifest's
     `states` (gdn.bytes_per_seq, kv.bytes_per_token) must equal this file's formula
     (per GDN layer (K-1)·conv_dim·2 bf16 conv bytes + Hv·Dk·Dv·s state bytes, s = 4 or 2; per
     full-attention layer 2·Hkv·D·2 KV bytes per token); printed with the context at which one
     sequence's KV equals its state (bytes_per_seq / KV bytes per token).
  2. Decode: `kern random-weights --preset P --layers N` (N = 4 by default: layers 0-2 GDN, layer 3
     full attention, ~14.4 GB), `kern pack` (--max-tokens 2048 --max-seqs 64 --max-context 4096),
     `kern bench --json` at batch 1 and batch 64, context 256. Beside each: the floor of the step's
     ACTIVE bytes at the copy bandwidth kern bench measured (copy_gbs; 4.0 TB/s assumed, and said,
     when it reports none): every non-expert weight (GDN / attention projections, norms, routers,
     the shared expert and its gate, final norm, LM head), the routed experts the step touches
     (k per layer at batch 1; E·(1 − (1 − k/E)^B) expected distinct experts under a uniform
     routing at batch B: AN ESTIMATE — random weights route roughly uniformly, real ones need not),
     the embedding's B rows, the KV kern bench counts (bytes_per_step − weight_bytes) and the GDN
     state read and written once (2 · B · bytes_per_seq). Fraction = floor / measured median.
     The same floor at full depth (48 layers) is printed as an estimate (nothing is measured there:
     148 GiB of weights do not fit one H200).
  3. Prefill of one 8,192-token prompt (a second pack: --max-tokens 8192 --max-seqs 8): ms, tok/s.
  --json FILE (hybrid.sh: $OUT/hybrid-bench.json): every number and kern bench's raw JSON; FILE's
  .txt twin: the table (also printed last).

serve: `kern random-weights --preset qwen3-next-small` + the Qwen3 tokenizer (--tok: tokenizer.json,
  tokenizer_config.json) + `kern pack` (--max-tokens 2048 --max-seqs 16 --max-context 4096); then two
  servers, one after the other (each alone on the GPU, --gpu-mem 0.5): the prefix cache on, and
  --no-prefix-cache. Each gets one warm request — the shared prefix (2,000 tokens, a whole number of
  pages) plus one token: its prefill is cut at the last page boundary, 2,000, so it leaves a GDN
  snapshot exactly at the end of the prefix — then --requests requests of prefix + --distinct own
  tokens, one at a time, streamed, greedy (--new tokens, ignore_eos). Reported: TTFT p50 / min / max
  of the requests, usage.prompt_tokens_details.cached_tokens per request, /metrics' prefix-cache hits
  and snapshots saved / restored, greedy token ids equal between the two servers (reported, not
  required: with the cache the prefill is cut at 2,000 | 2,048 | 2,050, without it at 2,048 | 2,050 —
  another fp32 reassociation of the GDN chunks). Checks (exit 1): every request streamed --new tokens;
  cached server: every request cached_tokens == --prefix, snapshots restored >= --requests (a model
  whose state declares snapshots); uncached: 0 cached tokens; TTFT p50 lower with the cache.
  --json FILE (hybrid.sh: $OUT/hybrid-serve.json), its .txt twin: the table (also printed last).

Exit status: 0 all measured / checked, 1 a failed step or check, 2 bad arguments.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
ASSUMED_GBS = 4000.0  # H200 HBM3e copy bandwidth assumed when kern bench reports none (stated)
PROMPT_ID_MAX = 151643  # Qwen's ordinary vocabulary (no special tokens)


def log(*a):
    print(*a, flush=True)


class InputError(Exception):
    """A broken input (a kern bench JSON without a field, a config without a key): the message
    names the file and what is missing."""


# ============================================================================ configs
def read_presets(path=None):
    """kern's PRESETS (packs/src/config.rs: what `kern random-weights --preset` writes)."""
    path = path or os.path.join(REPO, "packs", "src", "config.rs")
    with open(path) as f:
        text = f.read()
    out = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r'\(\s*"([^"]+)"\s*,\s*r#"(\{.*?\})"#\s*\)', text, re.S)}
    if not out:
        raise InputError(f"{path}: no PRESETS entries found")
    return out


def need(cfg, key, where="config"):
    if key not in cfg:
        raise InputError(f"{where}: no '{key}' (keys: {', '.join(sorted(cfg))})")
    return cfg[key]


def layer_kinds(cfg, where="config"):
    """layer_types, or as transformers / kern derive it: every full_attention_interval-th layer
    (1-based) is full attention, the others GDN."""
    L = need(cfg, "num_hidden_layers", where)
    if cfg.get("layer_types"):
        kinds = list(cfg["layer_types"])
        if len(kinds) != L:
            raise InputError(f"{where}: layer_types has {len(kinds)} entries for {L} layers")
        return kinds
    n = need(cfg, "full_attention_interval", where)
    return ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(L)]


def reduced(cfg, layers):
    """The config of the first `layers` layers (as `kern random-weights --layers` writes it)."""
    c = dict(cfg)
    c["layer_types"] = layer_kinds(cfg)[:layers]
    c["num_hidden_layers"] = layers
    return c


def gdn_dims(cfg, where="config"):
    hk, hv = need(cfg, "linear_num_key_heads", where), need(cfg, "linear_num_value_heads", where)
    dk, dv = need(cfg, "linear_key_head_dim", where), need(cfg, "linear_value_head_dim", where)
    kw = cfg.get("linear_conv_kernel_dim", 4)
    return hk, hv, dk, dv, kw


def state_bytes_per_seq(cfg, state_bytes=4, where="config"):
    """One sequence's GDN state over all GDN layers: the conv state ((K-1) · conv_dim bf16,
    conv_dim = 2·Hk·Dk + Hv·Dv) and the recurrent state (Hv · Dk · Dv at `state_bytes`)."""
    hk, hv, dk, dv, kw = gdn_dims(cfg, where)
    conv = 2 * hk * dk + hv * dv
    n = sum(1 for k in layer_kinds(cfg, where) if k == "linear_attention")
    return n * ((kw - 1) * conv * 2 + hv * dk * dv * state_bytes)


def kv_bytes_per_token(cfg, where="config"):
    """bf16 K and V of every full-attention layer, one token."""
    hq = need(cfg, "num_attention_heads", where)
    hkv = cfg.get("num_key_value_heads", hq)
    d = cfg.get("head_dim") or need(cfg, "hidden_size", where) // hq
    n = sum(1 for k in layer_kinds(cfg, where) if k == "full_attention")
    return n * 2 * hkv * d * 2


def expected_experts(E, k, batch):
    """Expected distinct experts a step of `batch` tokens touches when each picks k of E uniformly
    at random (without replacement): E · (1 − (1 − k/E)^batch). k at batch 1."""
    if batch <= 1:
        return float(k)
    return E * (1.0 - (1.0 - k / E) ** batch)


def weight_bytes(cfg, experts=None, emb_rows=None, where="config"):
    """bf16 weight bytes of a qwen3_next / qwen3_5 config (A_log and dt_bias fp32, as kern loads
    them). experts: routed experts counted per MoE layer (None: all E); emb_rows: embedding rows
    read (None: the whole table)."""
    H, V = need(cfg, "hidden_size", where), need(cfg, "vocab_size", where)
    hq = need(cfg, "num_attention_heads", where)
    hkv = cfg.get("num_key_value_heads", hq)
    D = cfg.get("head_dim") or H // hq
    hk, hv, dk, dv, kw = gdn_dims(cfg, where)
    E = cfg.get("num_experts", 0) or 0
    I, Is = cfg.get("moe_intermediate_size", 0), cfg.get("shared_expert_intermediate_size", 0) or 0
    step, dense = max(1, cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or [])
    gdn = (H * (2 * hk * dk + 2 * hv * dv + 2 * hv) * 2 + (2 * hk * dk + hv * dv) * kw * 2 + 2 * hv * 4 + dv * 2 + hv * dv * H * 2)
    attn = H * (2 * hq * D + 2 * hkv * D) * 2 + 2 * D * 2 + hq * D * H * 2  # q carries its gate: 2·Hq·D rows
    n_exp = E if experts is None else experts
    total = 0.0
    for l, kind in enumerate(layer_kinds(cfg, where)):
        total += (gdn if kind == "linear_attention" else attn) + 2 * H * 2
        if E and l not in dense and (l + 1) % step == 0:
            total += E * H * 2 + n_exp * 3 * I * H * 2
            if Is:
                total += 3 * Is * H * 2 + H * 2  # shared expert and its sigmoid gate
        else:
            total += 3 * need(cfg, "intermediate_size", where) * H * 2
    total += H * 2  # final norm
    emb = V * H * 2 if emb_rows is None else emb_rows * H * 2
    if cfg.get("tie_word_embeddings"):
        total += V * H * 2  # one table: the LM head reads all of it
    else:
        total += emb + V * H * 2
    return total


def active_bytes(cfg, batch):
    """Weight bytes a decode step of `batch` sequences reads (see the module doc)."""
    E, k = cfg.get("num_experts", 0) or 0, cfg.get("num_experts_per_tok", 0) or 0
    return weight_bytes(cfg, experts=expected_experts(E, k, batch) if E else None, emb_rows=batch)


BF16_PEAK_TFLOPS = 989.0  # H200 dense bf16 (as bench_table.py / moe_check.py)
GDN_CHUNK = 64  # the chunked rule's chunk (packs/kernels/gdn.cu)


def prefill_flops(cfg, tokens, chunk=GDN_CHUNK, where="config"):
    """An ESTIMATE of one `tokens`-token prefill's FLOPs (multiply-add = 2) through `cfg`, by part:
    projections (every token through the GDN in / out projections, the attention's q (+ gate) /
    k / v / o, the router, k routed experts and the shared expert or the dense MLP; the LM head on
    the last token only), causal attention of the full-attention layers (QK^T and PV on the lower
    triangle: 2 · Hq · D · T^2), and the chunked gated delta rule per value head and token
    (K K^T, Q K^T, the WY products of K and V over a chunk of C tokens: 2·C·(3·Dk + 2·Dv); the
    chunk-to-state products Q S, K S and K^T U: 6·Dk·Dv; the C^3/3 triangular solve per chunk
    left out). Returns {"projections", "attention", "gdn_rule", "total"}."""
    H, V = need(cfg, "hidden_size", where), need(cfg, "vocab_size", where)
    hq = need(cfg, "num_attention_heads", where)
    hkv = cfg.get("num_key_value_heads", hq)
    D = cfg.get("head_dim") or H // hq
    hk, hv, dk, dv, _ = gdn_dims(cfg, where)
    E, k = cfg.get("num_experts", 0) or 0, cfg.get("num_experts_per_tok", 0) or 0
    I, Is = cfg.get("moe_intermediate_size", 0), cfg.get("shared_expert_intermediate_size", 0) or 0
    step, dense = max(1, cfg.get("decoder_sparse_step", 1) or 1), set(cfg.get("mlp_only_layers") or [])
    T = float(tokens)
    proj = att = rule = 0.0
    for l, kind in enumerate(layer_kinds(cfg, where)):
        if kind == "linear_attention":
            proj += 2 * T * (H * (2 * hk * dk + 2 * hv * dv + 2 * hv) + hv * dv * H)
            rule += T * hv * (2 * chunk * (3 * dk + 2 * dv) + 6 * dk * dv)
        else:
            proj += 2 * T * (H * (2 * hq * D + 2 * hkv * D) + hq * D * H)
            att += 2 * hq * D * T * T
        if E and l not in dense and (l + 1) % step == 0:
            proj += 2 * T * (E * H + k * 3 * I * H + (3 * Is * H + H if Is else 0))
        else:
            proj += 2 * T * 3 * need(cfg, "intermediate_size", where) * H
    proj += 2 * V * H  # the LM head, last token only
    return {"projections": proj, "attention": att, "gdn_rule": rule, "total": proj + att + rule}


def prefill_vs_peak(cfg, tokens, ms):
    """prefill_flops of the row, its time at the bf16 peak, and kern's rate and fraction of it."""
    f = prefill_flops(cfg, tokens)
    f["bound_ms"] = f["total"] / (BF16_PEAK_TFLOPS * 1e12) * 1e3
    f["tflops"] = f["total"] / (ms * 1e-3) / 1e12 if ms > 0 else 0.0
    f["fraction"] = f["tflops"] / BF16_PEAK_TFLOPS
    return f


def floor_ms(nbytes, gbs):
    """Milliseconds to move `nbytes` at `gbs` GB/s (kern's copy bandwidth counts read + write)."""
    return nbytes / (gbs * 1e9) * 1e3


def crossover_tokens(state, kv_per_token):
    return state / kv_per_token


def decode_floor(cfg, bench, state_per_seq, batch):
    """The active-bytes floor of one kern bench decode row. bench: kern bench's JSON."""
    kv = max(0.0, float(bench["bytes_per_step"]) - float(bench["weight_bytes"]))  # kern's own KV count
    w = active_bytes(cfg, batch)
    st = 2.0 * batch * state_per_seq
    gbs = bench.get("copy_gbs")
    assumed = not gbs
    gbs = float(gbs) if gbs else ASSUMED_GBS
    total = w + kv + st
    f = floor_ms(total, gbs)
    return {"active_weight_bytes": w, "kv_bytes": kv, "state_rw_bytes": st, "floor_bytes": total, "gbs": gbs, "gbs_assumed": assumed,
            "floor_ms": f, "fraction": f / float(bench["median_ms"]) if float(bench["median_ms"]) > 0 else None}


BENCH_FIELDS = {"decode": ("median_ms", "tok_per_s", "bytes_per_step", "weight_bytes", "copy_gbs"), "prefill": ("median_ms", "tok_per_s", "tokens_per_step")}


def check_bench_json(j, kind, where):
    if not isinstance(j, dict):
        raise InputError(f"{where}: kern bench's output is not a JSON object")
    for f in BENCH_FIELDS[kind]:
        if f not in j:
            raise InputError(f"{where}: kern bench's JSON has no '{f}' (has: {', '.join(sorted(j))})")
        if f != "copy_gbs" and not isinstance(j[f], (int, float)):
            raise InputError(f"{where}: kern bench's '{f}' is {j[f]!r}, not a number")
    return j


def parse_bench_stdout(text, kind, where):
    lines = [l for l in text.splitlines() if l.strip().startswith("{")]
    if not lines:
        raise InputError(f"{where}: kern bench printed no JSON line (stdout: {text.strip()[-300:]!r})")
    try:
        j = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: kern bench's JSON does not parse ({e})") from e
    return check_bench_json(j, kind, where)


# ============================================================================ formatting
def gb(b):
    return f"{b / 1e9:.2f} GB"


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def intc(v):
    return f"{int(round(v)):,}"


def short(msg, n=200):
    msg = str(msg)
    return msg if len(msg) <= n else msg[: n - 1] + "…"


def bench_table(r):
    """The bench section's table (a list of lines) from its result dict."""
    lines = [f"== {r['preset']}: GDN state vs KV (full depth), decode and prefill (kern bench{' --fake: the CPU fake, NOT a GPU' if r.get('fake') else ''}, "
             f"random weights, {r['layers']} of {r.get('full_layers', '?')} layers)"]
    if r.get("error"):
        lines.append(f"  {short(r['error'], 400)}")
    s = r.get("state")
    if not s:
        return lines
    L = s["layers"]
    lines.append(f"  GDN state per sequence ({L['gdn']} GDN layers)      fp32 {intc(s['fp32'])} B ({mib(s['fp32'])})   bf16 {intc(s['bf16'])} B ({mib(s['bf16'])})"
                 f"   [{s['source']}]")
    lines.append(f"  KV per token ({L['full']} full-attention layers)     {intc(s['kv_per_token'])} B ({s['kv_per_token'] / 1024:.1f} KiB)")
    lines.append(f"  context where one sequence's KV = its state  fp32 {intc(s['cross_fp32'])} tokens   bf16 {intc(s['cross_bf16'])} tokens")
    for key in ("b1", "b64"):
        row = r["rows"].get(key)
        label = f"  decode batch {r['batches'][key]}, context {r['context']}"
        if not row or "error" in row:
            lines.append(f"{label:<46} {short(row.get('error', 'not run')) if row else 'not run'}")
            continue
        j, fl = row["kern"], row["floor"]
        bw = f"{fl['gbs'] / 1e3:.2f} TB/s" + (" ASSUMED (kern bench reported no copy bandwidth)" if fl["gbs_assumed"] else " measured")
        lines.append(f"{label:<46} {j['median_ms']:.3f} ms ({j['tok_per_s']:,.0f} tok/s)   floor {fl['floor_ms']:.3f} ms "
                     f"({gb(fl['floor_bytes'])} active at {bw})   reaches {fl['fraction']:.0%} of floor")
    row = r["rows"].get("prefill")
    label = f"  prefill, one {r['prompt_tokens']:,}-token prompt"
    if not row or "error" in row:
        lines.append(f"{label:<46} {short(row.get('error', 'not run')) if row else 'not run'}")
    else:
        k = row["kern"]
        lines.append(f"{label:<46} {k['median_ms']:.1f} ms   {k['tok_per_s']:,.0f} tok/s   ({k.get('steps', '?')} step(s), {k.get('timing', '?')} time)")
        fl = row.get("flops")
        if fl:
            lines.append(f"{'    vs the bf16 peak (FLOPs an ESTIMATE)':<46} {fl['total'] / 1e12:.1f} TFLOP (projections {fl['projections'] / 1e12:.1f}, "
                         f"attention {fl['attention'] / 1e12:.1f}, delta rule {fl['gdn_rule'] / 1e12:.1f}): bound {fl['bound_ms']:.1f} ms at "
                         f"{BF16_PEAK_TFLOPS:.0f} TFLOP/s; kern {fl['tflops']:.0f} TFLOP/s = {fl['fraction']:.0%} of peak")
    if r.get("weights_check"):
        lines.append(f"  weights: {r['weights_check']}")
    fd = r.get("full_depth")
    if fd:
        lines.append(f"  full depth ({L['total']} layers), ESTIMATE, not measured: batch 1 floor {fd['b1_ms']:.3f} ms ({gb(fd['b1_bytes'])}), "
                     f"batch {r['batches']['b64']} floor {fd['b64_ms']:.3f} ms ({gb(fd['b64_bytes'])}) at {fd['gbs'] / 1e3:.2f} TB/s")
    lines.append("  floor = active bytes (non-expert weights, the routed experts a step touches — k per layer at batch 1, E(1-(1-k/E)^B)"
                 " under uniform routing at batch B: an ESTIMATE — the embedding's rows, KV, GDN state read + written) / copy bandwidth")
    return lines


def serve_table(r):
    lines = [f"== {r['preset']} shared-prefix serve: {r['requests']} requests = {r['prefix']:,}-token shared prefix + {r['distinct']} own tokens, "
             f"one at a time after a warm request; {r['new']} greedy tokens"]
    lines.append(f"  {'server':<20} {'TTFT p50':>10} {'min':>9} {'max':>9}  {'cached tokens / request':<26} {'snapshots saved/restored':<24}")
    for name, label in (("cached", "prefix cache"), ("uncached", "--no-prefix-cache")):
        s = r["servers"].get(name)
        if not s or "error" in s:
            lines.append(f"  {label:<20} {short(s.get('error', 'not run')) if s else 'not run'}")
            continue
        ct = s["cached_tokens"]
        cts = f"{ct[0]} × {len(ct)}" if ct and len(set(ct)) == 1 else ", ".join(map(str, ct))
        lines.append(f"  {label:<20} {s['ttft_p50_ms']:>7.1f} ms {s['ttft_min_ms']:>6.1f} ms {s['ttft_max_ms']:>6.1f} ms  {cts:<26} "
                     f"{s['snapshots_saved']}/{s['snapshots_restored']}")
    sm = r.get("summary", {})
    if sm:
        lines.append(f"  TTFT p50 {sm.get('ttft_speedup', '–')}× lower with the cache; warm request (prefix + 1, nothing cached) TTFT "
                     f"{sm.get('warm_ttft_ms', '–')} ms; greedy outputs equal cached vs uncached: {sm.get('greedy_equal', '–')} (reported, not required)")
    for c in r.get("checks", []):
        lines.append(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']}{': ' + c['detail'] if c.get('detail') else ''}")
    return lines


def write_outputs(result, lines, json_path):
    text = "\n".join(lines)
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(json_path)[0] + ".txt", "w") as f:
            f.write(text + "\n")
    log("")
    log(text)


# ============================================================================ running kern
class Kern:
    def __init__(self, path, logs, deadline):
        self.path, self.logs, self.deadline = path, logs, deadline
        os.makedirs(logs, exist_ok=True)

    def left(self):
        return self.deadline - time.time()

    def __call__(self, name, args, cap=600, check=True):
        """Runs kern; its stdout is returned, both streams logged to LOGS/NAME.log."""
        t = max(5, min(cap, int(self.left())))
        cmd = [self.path] + [str(a) for a in args]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=t)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), f"timed out after {t} s"
        with open(os.path.join(self.logs, name + ".log"), "w") as f:
            f.write(f"$ {' '.join(cmd)}\n# exit {rc} after {time.time() - t0:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
        log(f"  kern {args[0]} ({name}): exit {rc}, {time.time() - t0:.1f} s")
        if check and rc != 0:
            tail = " | ".join((err or out).strip().splitlines()[-3:])
            raise RuntimeError(f"kern {name} failed (exit {rc}): {tail[:400]} (log: {os.path.join(self.logs, name + '.log')})")
        return out


def pack(kern, name, config, out, kernels, extra):
    os.makedirs(out, exist_ok=True)
    kern(name, ["pack", "--config", config, "-o", out, "--kernels", kernels, *extra])
    with open(os.path.join(out, "model.json")) as f:
        return json.load(f)


def manifest_states(m, where):
    st = m.get("states") or {}
    gdn = [v["bytes_per_seq"] for v in st.values() if "bytes_per_seq" in v]
    kv = [v["bytes_per_token"] for v in st.values() if "bytes_per_token" in v]
    if not gdn or not kv:
        raise InputError(f"{where}: the manifest's states have no bytes_per_seq / bytes_per_token state ({json.dumps(st)[:200]})")
    return sum(gdn), sum(kv), (st.get("kv") or {}).get("page_tokens", 16)


DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u32": 4, "i8": 1, "u8": 1, "e4m3": 1, "f8e4m3": 1, "i64": 8, "u64": 8}


def manifest_weight_bytes(m):
    total = 0
    for b in m["buffers"].values():
        if b.get("role") == "weight":
            total += math.prod(int(d) for d in b["shape"]) * DTYPE_BYTES[b["dtype"]]
    return total


def write_config(cfg, d):
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "config.json")
    with open(p, "w") as f:
        json.dump(cfg, f)
    return p


# ============================================================================ bench
def state_section(kern, a, full, work):
    """Part 1: the full-depth packs (no weights) against the formula."""
    kinds = layer_kinds(full)
    res = {"layers": {"total": len(kinds), "gdn": kinds.count("linear_attention"), "full": kinds.count("full_attention")}}
    formula = {"fp32": state_bytes_per_seq(full, 4), "bf16": state_bytes_per_seq(full, 2), "kv": kv_bytes_per_token(full)}
    got = {}
    for dt, sb in (("fp32", "f32"), ("bf16", "bf16")):
        d = os.path.join(work, f"full-{dt}")
        cfgp = write_config(full, d)
        m = pack(kern, f"pack-full-{dt}", cfgp, d, a.kernels, ["--gdn-state", sb, "--max-seqs", 64])
        g, kv, _ = manifest_states(m, os.path.join(d, "model.json"))
        got[dt], got["kv"] = g, kv
        if dt == "fp32":
            res["manifest_weight_bytes"] = manifest_weight_bytes(m)
    same = got == formula
    res.update({"fp32": got["fp32"], "bf16": got["bf16"], "kv_per_token": got["kv"], "formula": formula,
                "source": "kern pack's manifest = the formula" if same else f"kern pack's manifest; the formula says {formula}: DIFFERENT",
                "formula_matches_manifest": same})
    res["cross_fp32"] = crossover_tokens(got["fp32"], got["kv"])
    res["cross_bf16"] = crossover_tokens(got["bf16"], got["kv"])
    res["formula_weight_bytes"] = weight_bytes(full)
    return res


def bench_steps(a, r, failed, kern, full, work):
    """bench's three parts, filling r (a failure raises: bench records it and writes the table)."""
    log(f"bench 1/3: GDN state vs KV at {a.preset}'s full depth (kern pack of config.json alone, no weights)")
    r["state"] = state_section(kern, a, full, work)
    s = r["state"]
    if not s["formula_matches_manifest"]:
        failed.append("state bytes: the manifest differs from the formula")
    if s["manifest_weight_bytes"] != s["formula_weight_bytes"]:
        r["notes"].append(f"full depth: manifest weights {s['manifest_weight_bytes']} B, formula {s['formula_weight_bytes']:.0f} B")
    log(f"  fp32 {s['fp32']} B, bf16 {s['bf16']} B per sequence; KV {s['kv_per_token']} B per token; "
        f"crossover {s['cross_fp32']:.0f} / {s['cross_bf16']:.0f} tokens; formula {'=' if s['formula_matches_manifest'] else '!='} manifest")

    # ---- the reduced-depth model
    red = reduced(full, a.layers)
    d = os.path.join(work, f"{a.preset}-l{a.layers}")
    dp = d + "-prefill"
    stamp = os.path.join(d, ".weights-done")
    if a.fake:
        log(f"bench 2/3: --fake: no weights; kern bench --fake (kern's CPU model) stands in for the GPU; the floor uses {a.preset} at {a.layers} layers")
        cfgp = write_config(red, d)
    else:
        want = f"{a.preset} {a.layers} seed 0"
        if not (os.path.exists(stamp) and open(stamp).read().strip() == want):
            free = shutil.disk_usage(work).free
            size = weight_bytes(red)
            if free < size * 1.05 + 2e9:
                raise InputError(f"{work}: {free / 1e9:.1f} GB free, the weights need {size / 1e9:.1f} GB (set --work / WORK to a larger disk, or lower --layers)")
            shutil.rmtree(d, ignore_errors=True)
            log(f"bench 2/3: kern random-weights --preset {a.preset} --layers {a.layers} ({size / 1e9:.1f} GB) -> {d}")
            kern("random-weights", ["random-weights", "--preset", a.preset, "--layers", a.layers, "-o", d], cap=400)
            with open(stamp, "w") as f:
                f.write(want + "\n")
        else:
            log(f"bench 2/3: reusing the weights in {d}")
        cfgp = os.path.join(d, "config.json")
        with open(cfgp) as f:
            written = json.load(f)
        if layer_kinds(written, cfgp) != red["layer_types"]:
            raise InputError(f"{cfgp}: layer_types {written.get('layer_types')} differ from the preset's first {a.layers} {red['layer_types']}")
        red = written
    r["layer_kinds"] = layer_kinds(red)
    m = pack(kern, "pack-decode", cfgp, d, a.kernels, ["--max-tokens", 2048, "--max-seqs", max(64, a.batch), "--max-context", 4096, *a.pack_arg])
    state_red, kv_red, _ = manifest_states(m, os.path.join(d, "model.json"))
    r["reduced"] = {"state_bytes_per_seq": state_red, "kv_bytes_per_token": kv_red, "manifest_weight_bytes": manifest_weight_bytes(m),
                    "formula_weight_bytes": weight_bytes(red), "active_b1": active_bytes(red, 1), "active_b64": active_bytes(red, a.batch)}
    if r["reduced"]["manifest_weight_bytes"] != r["reduced"]["formula_weight_bytes"]:
        r["notes"].append(f"reduced depth: manifest weights {r['reduced']['manifest_weight_bytes']} B vs formula {r['reduced']['formula_weight_bytes']:.0f} B")
    os.makedirs(dp, exist_ok=True)
    if not a.fake:
        for f in os.listdir(d):
            if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
                tgt = os.path.join(dp, f)
                if os.path.lexists(tgt):
                    os.remove(tgt)
                os.symlink(os.path.join(d, f), tgt)
    shutil.copy(cfgp, os.path.join(dp, "config.json"))
    pack(kern, "pack-prefill", os.path.join(dp, "config.json"), dp, a.kernels,
         ["--max-tokens", a.prompt_tokens, "--max-seqs", 8, "--max-context", a.prompt_tokens + 256, *a.pack_arg])

    model, model_p = (["--fake"], ["--fake"]) if a.fake else (["--model", d], ["--model", dp])
    runs = (("b1", "decode", [*model, "--batch", 1, "--context", a.context, "--steps", a.steps]),
            ("b64", "decode", [*model, "--batch", a.batch, "--context", a.context, "--steps", a.steps]),
            ("prefill", "prefill", [*model_p, "--prompt-tokens", a.prompt_tokens]))
    log("bench 3/3: kern bench --json (batch 1, batch %d at context %d; prefill of %d tokens)" % (a.batch, a.context, a.prompt_tokens))
    for key, kind, args in runs:
        if kern.left() < 25:
            r["rows"][key] = {"error": f"NOT RUN: the budget ({a.budget} s) is spent"}
            failed.append(f"{key}: not run")
            continue
        try:
            out = kern(f"bench-{key}", ["bench", *args, "--json"], cap=240)
            j = parse_bench_stdout(out, kind, f"kern bench {key}")
            row = {"kern": j}
            if kind == "decode":
                row["floor"] = decode_floor(red, j, state_red, r["batches"][key])
            else:
                row["flops"] = prefill_vs_peak(red, a.prompt_tokens, float(j["median_ms"]))
            r["rows"][key] = row
        except (RuntimeError, InputError) as e:
            r["rows"][key] = {"error": f"FAILED: {e}"}
            failed.append(key)
            log(f"  {key}: {e}")
    b1 = r["rows"].get("b1", {}).get("kern")
    if b1 and not a.fake:
        wb, mw, f = int(b1["weight_bytes"]), r["reduced"]["manifest_weight_bytes"], r["reduced"]["formula_weight_bytes"]
        r["weights_check"] = (f"kern bench loaded {wb:,} B, the manifest's weights {mw:,} B, the floor's formula {f:,.0f} B in all (every expert)"
                              + (": equal" if wb == mw == f else ": NOT EQUAL — the floor's weight count may be off"))
    gbs = next((row["floor"]["gbs"] for k, row in r["rows"].items() if k != "prefill" and "floor" in row), ASSUMED_GBS)
    b1f = active_bytes(full, 1) + 2 * s["fp32"] + a.context * s["kv_per_token"]
    b64f = active_bytes(full, a.batch) + 2 * a.batch * s["fp32"] + a.batch * a.context * s["kv_per_token"]
    r["full_depth"] = {"gbs": gbs, "b1_bytes": b1f, "b64_bytes": b64f, "b1_ms": floor_ms(b1f, gbs), "b64_ms": floor_ms(b64f, gbs),
                       "active_b1": active_bytes(full, 1), "active_b64": active_bytes(full, a.batch)}


def bench(a):
    t_start = time.time()
    deadline = t_start + a.budget
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    logs = a.logs or os.path.join(work, "logs")
    kern = Kern(a.kern, logs, deadline)
    presets = read_presets()
    if a.preset not in presets:
        raise InputError(f"--preset {a.preset}: not one of kern's presets ({', '.join(presets)})")
    full = dict(presets[a.preset])
    if full.get("model_type") not in ("qwen3_next", "qwen3_5_text", "qwen3_5"):
        raise InputError(f"--preset {a.preset}: model_type {full.get('model_type')}, not a Gated DeltaNet hybrid (qwen3_next, qwen3_5)")
    full["layer_types"] = layer_kinds(full)
    if a.layers > full["num_hidden_layers"]:
        raise InputError(f"--layers {a.layers}: {a.preset} has {full['num_hidden_layers']} layers")
    r = {"preset": a.preset, "layers": a.layers, "full_layers": full["num_hidden_layers"], "context": a.context, "prompt_tokens": a.prompt_tokens,
         "batches": {"b1": 1, "b64": a.batch}, "fake": a.fake, "rows": {}, "notes": []}
    failed = []
    try:
        bench_steps(a, r, failed, kern, full, work)
    except (RuntimeError, InputError, OSError) as e:
        r["error"] = f"FAILED: {e}"
        failed.append(str(e))
        log(f"bench: {e}")
    r["failed"] = failed
    r["wall_s"] = round(time.time() - t_start, 1)
    lines = bench_table(r)
    for n in r["notes"]:
        lines.append(f"  note: {n}")
    write_outputs(r, lines, a.json)
    return 1 if failed else 0


# ============================================================================ serve
class ServeError(Exception):
    pass


def start_server(kern_path, args, log_path, timeout):
    """Starts `kern serve ... --port 0`; returns (proc, host, port, startup seconds)."""
    t0 = time.time()
    lf = open(log_path, "w")
    proc = subprocess.Popen([kern_path, "serve", *map(str, args), "--port", "0"], stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT)
    host = port = None
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise ServeError(f"kern serve exited {proc.returncode} before it was ready: {tail(log_path)}")
        if port is None:
            mm = re.search(r"listening on http://([0-9.]+):(\d+)", open(log_path).read())
            if mm:
                host, port = mm.group(1), int(mm.group(2))
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return proc, host, port, time.time() - t0
            except OSError:
                pass
        time.sleep(0.1)
    stop_server(proc)
    raise ServeError(f"kern serve not ready after {timeout} s: {tail(log_path)}")


def stop_server(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def tail(path, n=2):
    """The log's error lines (else its last n lines), and where the log is."""
    try:
        lines = open(path).read().strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    errs = [l for l in lines if "error" in l.lower() or "panicked" in l]
    return " | ".join((errs or lines)[-n:])[:400] + f" (log: {path})"


def stream_completion(host, port, prompt, new, timeout=300):
    """One streamed greedy completion: (ttft seconds, token ids, usage)."""
    body = {"prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServeError(f"/v1/completions answered {resp.status}: {resp.read()[:300]!r}")
        ttft, ids, usage = None, [], None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            j = json.loads(data)
            for c in j.get("choices") or []:
                if c.get("token_ids"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    ids += c["token_ids"]
            if j.get("usage"):
                usage = j["usage"]
    finally:
        conn.close()
    return ttft, ids, usage


def get_metrics(host, port):
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kern:") and " " in line and "{" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def cached_tokens(usage):
    if usage is None:
        raise InputError("the stream ended without a usage chunk (stream_options.include_usage)")
    return int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)


def make_prompts(prefix, distinct, requests, seed=7, id_max=PROMPT_ID_MAX):
    import random
    rng = random.Random(seed)
    shared = [rng.randrange(id_max) for _ in range(prefix)]
    warm = shared + [rng.randrange(id_max)]
    reqs = [shared + [rng.randrange(id_max) for _ in range(distinct)] for _ in range(requests)]
    return warm, reqs


def p50(v):
    return statistics.median(v) if v else float("nan")


def workload(kern_path, serve_args, log_path, warm, reqs, new, timeout):
    proc, host, port, ready = start_server(kern_path, serve_args, log_path, timeout)
    try:
        m0 = get_metrics(host, port)
        wt, wids, wu = stream_completion(host, port, warm, new)
        m1 = get_metrics(host, port)
        outs = [stream_completion(host, port, p, new) for p in reqs]
        m2 = get_metrics(host, port)
    finally:
        rc = stop_server(proc)
    d = lambda k, a, b: int(b.get(k, 0) - a.get(k, 0))  # noqa: E731
    ttfts = [o[0] * 1e3 for o in outs if o[0] is not None]
    return {"ready_s": round(ready, 2), "exit_code": rc, "warm_ttft_ms": round(wt * 1e3, 2) if wt else None, "warm_cached_tokens": cached_tokens(wu),
            "ttft_ms": [round(t, 2) for t in ttfts], "ttft_p50_ms": p50(ttfts), "ttft_min_ms": min(ttfts, default=float("nan")),
            "ttft_max_ms": max(ttfts, default=float("nan")), "cached_tokens": [cached_tokens(o[2]) for o in outs],
            "completion_tokens": [len(o[1]) for o in outs], "outputs": [o[1] for o in outs],
            "prefix_cache_hits": d("kern:prefix_cache_hits_total", m1, m2), "prompt_tokens": d("kern:prompt_tokens_total", m1, m2),
            "snapshots_saved": d("kern:prefix_cache_snapshots_saved_total", m0, m2), "snapshots_restored": d("kern:prefix_cache_snapshots_restored_total", m1, m2)}


def serve(a):
    t_start = time.time()
    work = os.path.abspath(a.work)
    logs = a.logs or os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    kern = Kern(a.kern, logs, t_start + a.budget)
    r = {"preset": "fake" if a.fake else a.preset, "requests": a.requests, "prefix": a.prefix, "distinct": a.distinct, "new": a.new,
         "fake": a.fake, "servers": {}, "checks": []}
    checks = r["checks"]

    def check(name, ok, detail=""):
        checks.append({"name": name, "ok": bool(ok), "detail": detail})
        log(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    if a.fake:
        if not os.path.exists(os.path.join(a.tok, "tokenizer.json")):
            raise InputError(f"--tok {a.tok}: no tokenizer.json")
        base, snap, pt = ["--fake", "--fake-tokenizer", a.tok], False, 4
    else:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            if not os.path.exists(os.path.join(a.tok, f)):
                raise InputError(f"--tok {a.tok}: no {f} (mkdir -p .carry/tok && cp build/test-data/qwen3-tokenizer/* .carry/tok/, and carry .carry)")
        d = os.path.join(work, a.preset)
        stamp = os.path.join(d, ".weights-done")
        if not os.path.exists(stamp):
            shutil.rmtree(d, ignore_errors=True)
            log(f"serve: kern random-weights --preset {a.preset} -> {d}")
            kern("random-weights", ["random-weights", "--preset", a.preset, "-o", d], cap=300)
            open(stamp, "w").close()
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(a.tok, f), d)
        m = pack(kern, "pack", os.path.join(d, "config.json"), d, a.kernels,
                 ["--max-tokens", 2048, "--max-seqs", 16, "--max-context", max(4096, a.prefix + a.distinct + a.new + 64), *a.pack_arg])
        snap = any(v.get("snapshot") for v in (m.get("states") or {}).values())
        pt = (m["states"].get("kv") or {}).get("page_tokens", 16)
        base = ["--model", d, "--gpu-mem", a.gpu_mem]
    if a.prefix % pt:
        raise InputError(f"--prefix {a.prefix} is not a whole number of {pt}-token pages (the snapshot sits at a page boundary)")
    warm, reqs = make_prompts(a.prefix, a.distinct, a.requests)
    for name, extra in (("cached", []), ("uncached", ["--no-prefix-cache"])):
        left = t_start + a.budget - time.time()
        if left < 20:
            r["servers"][name] = {"error": f"NOT RUN: the budget ({a.budget} s) is spent"}
            check(f"{name}: ran", False, "budget")
            continue
        log(f"serve: {name}: kern serve {' '.join(map(str, base + extra))}")
        try:
            r["servers"][name] = workload(a.kern, base + extra, os.path.join(logs, f"serve-{name}.log"), warm, reqs, a.new, min(180, left))
        except (ServeError, InputError, OSError) as e:
            r["servers"][name] = {"error": f"FAILED: {e}"}
            check(f"{name}: ran", False, "see the row above")
            continue
        s = r["servers"][name]
        log(f"  {name}: ready in {s['ready_s']} s, TTFT p50 {s['ttft_p50_ms']:.1f} ms, cached tokens {s['cached_tokens']}, "
            f"snapshots saved {s['snapshots_saved']} restored {s['snapshots_restored']}, exit {s['exit_code']}")
        check(f"{name}: every request streamed {a.new} tokens", all(n == a.new for n in s["completion_tokens"]), str(s["completion_tokens"]))
    c, u = r["servers"].get("cached", {}), r["servers"].get("uncached", {})
    if "ttft_ms" in c:
        check(f"cached: every request reports cached_tokens == {a.prefix}", all(x == a.prefix for x in c["cached_tokens"]), str(c["cached_tokens"]))
        check(f"cached: /metrics prefix-cache hits == {a.requests} × {a.prefix}", c["prefix_cache_hits"] == a.requests * a.prefix, str(c["prefix_cache_hits"]))
        if snap:
            check(f"cached: GDN snapshots restored >= {a.requests}", c["snapshots_restored"] >= a.requests, str(c["snapshots_restored"]))
    if "ttft_ms" in u:
        check("uncached: no cached tokens", all(x == 0 for x in u["cached_tokens"]) and u["prefix_cache_hits"] == 0, str(u["cached_tokens"]))
    if "ttft_ms" in c and "ttft_ms" in u:
        eq = sum(x == y for x, y in zip(c["outputs"], u["outputs"]))
        speed = u["ttft_p50_ms"] / c["ttft_p50_ms"] if c["ttft_p50_ms"] > 0 else float("inf")
        r["summary"] = {"ttft_speedup": round(speed, 2), "greedy_equal": f"{eq}/{a.requests}", "warm_ttft_ms": c["warm_ttft_ms"],
                        "first_differing": next((i for i, (x, y) in enumerate(zip(c["outputs"], u["outputs"])) if x != y), None)}
        if not a.fake:  # the fake's steps take no time: its TTFTs are noise
            check("TTFT p50 lower with the prefix cache", c["ttft_p50_ms"] < u["ttft_p50_ms"], f"{u['ttft_p50_ms']:.1f} -> {c['ttft_p50_ms']:.1f} ms")
    r["wall_s"] = round(time.time() - t_start, 1)
    write_outputs(r, serve_table(r), a.json)
    return 0 if all(x["ok"] for x in checks) else 1


# ============================================================================ selftest
def selftest(a):
    fails = []

    def check(name, cond, detail=""):
        print(("PASS " if cond else "FAIL ") + name + (f": {detail}" if detail and not cond else ""), flush=True)
        if not cond:
            fails.append(name)

    presets = read_presets()
    full = presets["qwen3-next-80b-a3b"]
    # ---- state bytes, by hand: 36 GDN layers, Hk 16, Hv 32, Dk = Dv = 128, K 4:
    # conv_dim = 2·16·128 + 32·128 = 8,192; conv state 3·8,192·2 = 49,152 B; fp32 S 32·128·128·4 =
    # 2,097,152 B; (49,152 + 2,097,152)·36 = 77,266,944; bf16 S 1,048,576: 39,518,208.
    # KV: 12 full layers · 2 · 2 kv heads · 256 · 2 B = 24,576 B per token.
    check("layer kinds: 36 GDN + 12 full, layer 3 full", layer_kinds(full).count("linear_attention") == 36 and layer_kinds(full)[3] == "full_attention"
          and layer_kinds(full)[:3] == ["linear_attention"] * 3)
    check("fp32 state bytes per sequence = 77,266,944 (hand)", state_bytes_per_seq(full, 4) == 77_266_944, str(state_bytes_per_seq(full, 4)))
    check("bf16 state bytes per sequence = 39,518,208 (hand)", state_bytes_per_seq(full, 2) == 39_518_208, str(state_bytes_per_seq(full, 2)))
    check("KV bytes per token = 24,576 (hand)", kv_bytes_per_token(full) == 24_576, str(kv_bytes_per_token(full)))
    tiny = {"hidden_size": 8, "vocab_size": 10, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 4,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 3, "shared_expert_intermediate_size": 5,
            "layer_types": ["linear_attention", "full_attention"], "num_hidden_layers": 2}
    pf = prefill_flops(tiny, 10, chunk=8)
    check("prefill FLOPs by part (hand: projections 23,200, attention 1,600, delta rule 8,320)",
          pf == {"projections": 23200.0, "attention": 1600.0, "gdn_rule": 8320.0, "total": 33120.0}, str(pf))
    pv = prefill_vs_peak(tiny, 10, 1.0)
    check("prefill vs peak: rate and fraction from the FLOPs and the time", abs(pv["tflops"] - prefill_flops(tiny, 10)["total"] / 1e-3 / 1e12) < 1e-15
          and abs(pv["fraction"] - pv["tflops"] / BF16_PEAK_TFLOPS) < 1e-15)
    check("crossover fp32 3,144 / bf16 1,608 tokens (hand)", crossover_tokens(77_266_944, 24_576) == 3144 and crossover_tokens(39_518_208, 24_576) == 1608)
    small = presets["qwen3-next-small"]  # 6 GDN layers (Hk 4, Hv 8): conv_dim 2,048; (3·2,048·2 + 8·128²·4)·6 = 3,219,456
    check("qwen3-next-small fp32 state = 3,219,456 (hand; kern pack printed the same)", state_bytes_per_seq(small, 4) == 3_219_456, str(state_bytes_per_seq(small, 4)))
    # ---- weight bytes, by hand (bf16; A_log, dt_bias fp32). Per GDN layer: in_proj 2048·12,352·2 =
    # 50,593,792 + conv 8,192·4·2 = 65,536 + A_log/dt_bias 256 + norm 256 + out 4,096·2,048·2 =
    # 16,777,216 → 67,437,056; per attention layer: qkv 2048·9,216·2 = 37,748,736 + q/k norms 1,024 +
    # o 16,777,216 → 54,526,976; per layer: norms 8,192, router 512·2048·2 = 2,097,152, experts
    # 512·3·512·2048·2 = 3,221,225,472, shared 6,291,456 + gate 4,096. 36·3,297,063,424 +
    # 12·3,284,153,344 + embedding + LM head 1,244,659,712 + final norm 4,096 = 159,348,787,200 B,
    # which is also what `kern pack` prints for the full config ("weight 148.4 GiB (159348787200 B)").
    check("80B total weights = 159,348,787,200 B (hand = kern pack)", weight_bytes(full) == 159_348_787_200, f"{weight_bytes(full):.0f}")
    # batch 1: 10 of 512 experts per layer: 48 · 502 · 6,291,456 fewer, the embedding's one row.
    b1 = 159_348_787_200 - 48 * 502 * 6_291_456 - 151936 * 2048 * 2 + 2048 * 2
    check("80B batch-1 active bytes = 7,127,537,664 (hand)", b1 == 7_127_537_664 and active_bytes(full, 1) == b1, f"{active_bytes(full, 1):.0f}")
    red = reduced(full, 4)
    check("4-layer total = 14,420,007,424 B (hand: 3 GDN + 1 attention layer + embedding, LM head, norm)",
          weight_bytes(red) == 3 * 3_297_063_424 + 3_284_153_344 + 1_244_659_712 + 4096 == 14_420_007_424, f"{weight_bytes(red):.0f}")
    check("4-layer batch-1 active = 1,164,438,016 B (hand)", active_bytes(red, 1) == 14_420_007_424 - 4 * 502 * 6_291_456 - 622_329_856 + 4096 == 1_164_438_016,
          f"{active_bytes(red, 1):.0f}")
    # expected distinct experts: E=4, k=2, B=2: 4·(1 − ½²) = 3; B=1: k; E=512, k=10, B=64: 512·(1 − (502/512)^64) ≈ 367.1
    check("expected experts 4·(1-(1/2)^2) = 3, batch 1 = k", abs(expected_experts(4, 2, 2) - 3.0) < 1e-12 and expected_experts(512, 10, 1) == 10)
    check("expected experts 512, k 10, batch 64 ≈ 367.1", abs(expected_experts(512, 10, 64) - 367.1) < 0.1, f"{expected_experts(512, 10, 64):.3f}")
    ab64 = active_bytes(red, 64)
    want64 = 1_164_438_016 + 4 * (expected_experts(512, 10, 64) - 10) * 6_291_456 + 63 * 4096
    check("4-layer batch-64 active = batch-1 + 4·(367.1 − 10) experts + 63 rows", abs(ab64 - want64) < 1, f"{ab64:.0f} vs {want64:.0f}")
    # ---- floors: 1e9 B at 4,000 GB/s = 0.25 ms; a decode row: 1,164,438,016 weights + KV 2,048·260 + 2·6,438,912 state
    check("floor: 1 GB at 4 TB/s = 0.25 ms", abs(floor_ms(1e9, 4000) - 0.25) < 1e-12)
    j = {"median_ms": 0.5, "tok_per_s": 2000.0, "bytes_per_step": 14_420_007_424 + 2048 * 260, "weight_bytes": 14_420_007_424, "copy_gbs": 3200.0}
    fl = decode_floor(red, check_bench_json(j, "decode", "test"), 6_438_912, 1)
    want = 1_164_438_016 + 2048 * 260 + 2 * 6_438_912
    check("decode floor bytes = active + kern's KV + 2 × state (hand)", abs(fl["floor_bytes"] - want) < 1 and fl["kv_bytes"] == 2048 * 260, f"{fl['floor_bytes']:.0f} vs {want}")
    check("decode floor ms at the measured 3.2 TB/s, fraction = floor / median", abs(fl["floor_ms"] - want / 3.2e12 * 1e3) < 1e-9
          and abs(fl["fraction"] - fl["floor_ms"] / 0.5) < 1e-12 and not fl["gbs_assumed"])
    fl0 = decode_floor(red, dict(j, copy_gbs=None), 6_438_912, 1)
    check("no copy bandwidth: 4.0 TB/s assumed and flagged", fl0["gbs"] == 4000.0 and fl0["gbs_assumed"])
    # ---- broken inputs: clear errors
    for bad, field in ((dict(j, median_ms=None), "median_ms"), ({k: v for k, v in j.items() if k != "weight_bytes"}, "weight_bytes")):
        try:
            check_bench_json(bad, "decode", "b64.json")
            check(f"a bench JSON with a broken '{field}' is refused", False)
        except InputError as e:
            check(f"a bench JSON with a broken '{field}' is refused, naming it and the file", field in str(e) and "b64.json" in str(e), str(e))
    try:
        parse_bench_stdout("error: no CUDA driver found\n", "prefill", "kern bench prefill")
        check("kern bench without a JSON line is refused", False)
    except InputError as e:
        check("kern bench without a JSON line is refused clearly", "printed no JSON" in str(e) and "no CUDA driver" in str(e), str(e))
    try:
        state_bytes_per_seq({k: v for k, v in full.items() if k != "linear_num_value_heads"})
        check("a config without linear_num_value_heads is refused", False)
    except InputError as e:
        check("a config without linear_num_value_heads is refused, naming it", "linear_num_value_heads" in str(e), str(e))
    try:
        cached_tokens(None)
        check("a stream without usage is refused", False)
    except InputError as e:
        check("a stream without usage is refused clearly", "usage" in str(e))
    # ---- arguments
    ap = parser()
    x = ap.parse_args(["bench"])
    check("bench defaults: .carry/kern, build/packs, 4 layers, context 256, batch 64, 8,192-token prefill",
          (x.kern, x.kernels, x.layers, x.context, x.batch, x.prompt_tokens, x.preset) == (".carry/kern", "build/packs", 4, 256, 64, 8192, "qwen3-next-80b-a3b"))
    x = ap.parse_args(["bench", "--layers", "8", "--kern", "k", "--pack-arg=--gdn-state", "--pack-arg=bf16", "--budget", "100"])
    check("bench flags: --layers 8, --pack-arg twice, --budget", x.layers == 8 and x.pack_arg == ["--gdn-state", "bf16"] and x.budget == 100 and x.kern == "k")
    x = ap.parse_args(["serve"])
    check("serve defaults: 16 requests, 2,000 + 50 tokens, 32 new, qwen3-next-small, .carry/tok",
          (x.requests, x.prefix, x.distinct, x.new, x.preset, x.tok) == (16, 2000, 50, 32, "qwen3-next-small", ".carry/tok"))
    for bad in (["bench", "--layers", "0"], ["serve", "--requests", "0"], ["serve", "--prefix", "-1"], ["bench", "--nonsense"], ["frobnicate"]):
        rc = main(bad, _quiet=True)
        check(f"bad arguments {' '.join(bad)} → exit 2", rc == 2, str(rc))
    # ---- tables
    st = {"layers": {"total": 48, "gdn": 36, "full": 12}, "fp32": 77_266_944, "bf16": 39_518_208, "kv_per_token": 24_576, "source": "kern pack's manifest = the formula",
          "cross_fp32": 3144.0, "cross_bf16": 1608.0}
    res = {"preset": "qwen3-next-80b-a3b", "layers": 4, "context": 256, "prompt_tokens": 8192, "batches": {"b1": 1, "b64": 64}, "state": st,
           "rows": {"b1": {"kern": j, "floor": fl}, "b64": {"error": "FAILED: kern bench-b64 failed (exit 1): out of memory"},
                    "prefill": {"kern": {"median_ms": 123.45, "tok_per_s": 66358.0, "tokens_per_step": 8192}}},
           "full_depth": {"gbs": 3200.0, "b1_ms": 2.5, "b1_bytes": 8e9, "b64_ms": 40.0, "b64_bytes": 1.28e11}}
    t = "\n".join(bench_table(res))
    print(t)
    check("bench table: state, KV, crossover, the rows, the failure, the estimate note",
          "fp32 77,266,944 B (73.7 MiB)" in t and "bf16 39,518,208 B" in t and "24,576 B (24.0 KiB)" in t and "fp32 3,144 tokens" in t
          and "0.500 ms (2,000 tok/s)" in t and f"{fl['fraction']:.0%} of floor" in t and "3.20 TB/s measured" in t and "out of memory" in t
          and "123.5 ms   66,358 tok/s" in t and "ESTIMATE" in t)
    sres = {"preset": "qwen3-next-small", "requests": 2, "prefix": 2000, "distinct": 50, "new": 32,
            "servers": {"cached": {"ttft_p50_ms": 10.04, "ttft_min_ms": 9.0, "ttft_max_ms": 12.0, "cached_tokens": [2000, 2000], "snapshots_saved": 3, "snapshots_restored": 2},
                        "uncached": {"error": "FAILED: kern serve exited 1"}},
            "summary": {"ttft_speedup": 3.1, "greedy_equal": "2/2", "warm_ttft_ms": 40.0}, "checks": [{"name": "x", "ok": True}, {"name": "y", "ok": False, "detail": "z"}]}
    t = "\n".join(serve_table(sres))
    print(t)
    check("serve table: TTFT, cached tokens, snapshots, failure, checks", "10.0 ms" in t and "2000 × 2" in t and "3/2" in t and "exited 1" in t
          and "3.1× lower" in t and "PASS x" in t and "FAIL y: z" in t)
    p = make_prompts(32, 5, 3)
    check("prompts: warm = prefix + 1, requests share the prefix and differ after it", len(p[0]) == 33 and all(q[:32] == p[0][:32] and len(q) == 37 for q in p[1])
          and len({tuple(q) for q in p[1]}) == 3)
    # ---- with kern: the full-depth packs (no weights), and bench / serve against kern's fake model
    if a.kern and os.access(a.kern, os.X_OK):
        with tempfile.TemporaryDirectory(prefix="hybrid-bench-selftest-") as tmp:
            try:
                kern = Kern(a.kern, os.path.join(tmp, "logs"), time.time() + 300)
                s = state_section(kern, argparse.Namespace(kernels=a.kernels), dict(full, layer_types=layer_kinds(full)), tmp)
                check("kern pack of the full 80B config (no weights): state and KV = the formula", s["formula_matches_manifest"], json.dumps(s["formula"]))
                check("kern pack of the full 80B config: weight bytes = the formula", s["manifest_weight_bytes"] == s["formula_weight_bytes"],
                      f"{s['manifest_weight_bytes']} vs {s['formula_weight_bytes']:.0f}")
                m = pack(kern, "pack-small", write_config(dict(small, layer_types=layer_kinds(small)), os.path.join(tmp, "small")), os.path.join(tmp, "small"), a.kernels, [])
                check("kern pack of qwen3-next-small: weight bytes = the formula", manifest_weight_bytes(m) == weight_bytes(small), f"{manifest_weight_bytes(m)} vs {weight_bytes(small):.0f}")
            except (RuntimeError, InputError, OSError) as e:
                check("kern pack of the configs", False, str(e))
            out = os.path.join(tmp, "bench.json")
            rc = main(["bench", "--fake", "--kern", a.kern, "--kernels", a.kernels, "--work", os.path.join(tmp, "bench"), "--json", out, "--steps", "8", "--budget", "120"])
            ok = rc == 0 and os.path.exists(out) and os.path.exists(out[:-5] + ".txt")
            j = json.load(open(out)) if os.path.exists(out) else {}
            check("bench --fake end to end (kern bench --fake): exit 0, JSON and table written, rows measured",
                  ok and all("kern" in j["rows"].get(k, {}) for k in ("b1", "b64", "prefill")) and j["rows"]["b64"]["floor"]["gbs_assumed"], f"rc {rc}")
            tok = a.tok if os.path.exists(os.path.join(a.tok, "tokenizer.json")) else None
            if tok:
                out = os.path.join(tmp, "serve.json")
                rc = main(["serve", "--fake", "--kern", a.kern, "--tok", tok, "--work", os.path.join(tmp, "serve"), "--json", out,
                           "--requests", "4", "--prefix", "400", "--distinct", "20", "--new", "8", "--budget", "120"])
                j = json.load(open(out)) if os.path.exists(out) else {}
                check("serve --fake end to end (kern serve --fake): exit 0, every request hit the 400-token prefix, uncached none",
                      rc == 0 and j["servers"]["cached"]["cached_tokens"] == [400] * 4 and j["servers"]["uncached"]["cached_tokens"] == [0] * 4
                      and j["summary"]["greedy_equal"] == "4/4", f"rc {rc}")
            else:
                print(f"SKIP serve --fake: no tokenizer.json in {a.tok}")
    else:
        print(f"SKIP the kern pack / --fake runs: {a.kern!r} is not an executable kern (--kern)")
    print(f"hybrid_bench.py selftest: {len(fails)} failed" if fails else "hybrid_bench.py selftest: all passed")
    return 1 if fails else 0


# ============================================================================ arguments
class _Parser(argparse.ArgumentParser):
    quiet = False

    def error(self, message):
        if not self.quiet:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def positive(v):
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{v}: must be at least 1")
    return n


def nonneg(v):
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{v}: must be at least 0")
    return n


def parser(quiet=False):
    _Parser.quiet = quiet
    ap = _Parser(prog="hybrid_bench.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    b = sub.add_parser("bench", help="state vs KV, kern bench decode / prefill of a reduced-depth Qwen3-Next-80B-A3B")
    s = sub.add_parser("serve", help="shared-prefix kern serve with and without the prefix cache")
    for p in (b, s):
        p.add_argument("--kern", default=".carry/kern")
        p.add_argument("--kernels", default="build/packs")
        p.add_argument("--json", help="results file (its .txt: the table)")
        p.add_argument("--logs", help="kern's logs (default WORK/logs)")
        p.add_argument("--budget", type=positive, default=600, help="seconds this run may use")
        p.add_argument("--pack-arg", action="append", default=[], help="extra kern pack argument (repeat; --pack-arg=--gdn-state --pack-arg=bf16)")
        p.add_argument("--fake", action="store_true", help="kern's CPU fake model instead of the GPU (selftest)")
    b.add_argument("--preset", default="qwen3-next-80b-a3b")
    b.add_argument("--layers", type=positive, default=4)
    b.add_argument("--context", type=positive, default=256)
    b.add_argument("--batch", type=positive, default=64)
    b.add_argument("--steps", type=positive, default=64)
    b.add_argument("--prompt-tokens", type=positive, default=8192)
    b.add_argument("--work", default="/tmp/kern-hybrid/bench")
    s.add_argument("--preset", default="qwen3-next-small")
    s.add_argument("--tok", default=".carry/tok")
    s.add_argument("--requests", type=positive, default=16)
    s.add_argument("--prefix", type=nonneg, default=2000)
    s.add_argument("--distinct", type=positive, default=50)
    s.add_argument("--new", type=positive, default=32)
    s.add_argument("--gpu-mem", default="0.5", help="kern serve --gpu-mem (each server runs alone)")
    s.add_argument("--work", default="/tmp/kern-hybrid/serve")
    t = sub.add_parser("selftest", help="CPU checks (no GPU, no torch)")
    t.add_argument("--kern", default="build/lead/kern")
    t.add_argument("--kernels", default="build/packs")
    t.add_argument("--tok", default=".carry/tok")
    return ap


def main(argv=None, _quiet=False):
    argv = sys.argv[1:] if argv is None else argv
    try:
        a = parser(_quiet).parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        if a.cmd == "bench":
            return bench(a)
        if a.cmd == "serve":
            return serve(a)
        return selftest(a)
    except InputError as e:
        print(f"hybrid_bench.py {a.cmd}: {e}", file=sys.stderr)
        return 2 if a.cmd != "selftest" else 1
    except RuntimeError as e:
        print(f"hybrid_bench.py {a.cmd}: {e}", file=sys.stderr)
        return 1


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: a running kern serve is stopped, a kern bench killed (subprocess.run)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
