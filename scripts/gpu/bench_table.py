#!/usr/bin/env python3
"""The performance table of issue 15 (scripts/gpu/bench.sh; docs/performance.md). Standard library
only (but for `peer`, which runs the PyTorch peer), so the table builds anywhere:

  bench_table.py plan [--families]         the rows bench.sh measures, one per line:
                                           id preset pack kind batch context prompt_tokens
                                           (--families: only issue 24's Llama / Gemma 3 rows)
  bench_table.py ready --kern K --model D  start `kern serve`, time it to /health 200, stop it;
                                           prints {"ready_s": ...}
  bench_table.py peer --peer torch_peer.py --model qwen3-4b --batch 64 --prompt 256 --mode graph
  bench_table.py peer --peer torch_peer.py --model qwen3-4b --prefill 8192
                                           the PyTorch peer at one row's shapes (below); one
                                           JSON line, {"error": ...} and status 1 on failure
  bench_table.py table RESULTS [--work W] [--doc docs/performance.md] [--out FILE]
                                           reads what bench.sh wrote into RESULTS and prints the
                                           table (kern vs peer vs floor, target, met?) and the
                                           top five ops of each row; --doc rewrites the part of
                                           the document between the bench markers; --ref-doc
                                           (default docs/performance.md) gives the Qwen rows'
                                           fractions of the floor when this run has none
  bench_table.py selftest                  the table logic on constructed results

RESULTS holds, per row id: kern-ID.N.json (`kern bench --json`, one run each; the median run
counts), peer-ID-MODE.json (`peer`), profile-ID.json (`kern profile --json`),
ready-ID.N.json (`ready`); a FILE.err beside any of them says why it is missing ("failed …",
"not run …": bench.sh writes it). A row without
numbers reads "not yet measured": nothing here is ever filled in by hand.

Issue 24's rows (Llama-3.1-8B batch 1 and 64, Gemma-3-4B batch 1) are judged by the floor: their
target is kern's fraction of the floor at or above the matching Qwen row's (Qwen3-8B batch 1,
Qwen3-4B batch 64, Qwen3-4B batch 1), measured in the same run or else read from --ref-doc. Their
peer is scripts/gpu/torch_peer_families.py (the same gpt-fast-style decoder for Llama and
Gemma 3), taken when torch_peer.py has no such model.

The peer is ../shared/peers/torch_peer.py used as it is, called in-process because its command
line fixes the prompt at 128 tokens while its run() takes the length. Decode: its run() (eager
prefill, then its one-token step captured in a CUDA graph, optionally after torch.compile), 128
steps timed with CUDA events -> itl_ms. Prefill: its forward over one N-token prompt, eager (a
prompt is not replayed, so no graph), once to warm up and then --reps times with CUDA events ->
prefill_ms (median).
"""
import argparse, glob, json, os, signal, socket, statistics, subprocess, sys, time, urllib.request

# bf16 dense tensor-core peak of the H200 SXM (NVIDIA's datasheet: 989 TFLOP/s, the H100 SXM's
# figure); prefill's target is a fraction of it. BF16_PEAK_TFLOPS overrides it for other GPUs.
BF16_PEAK_TFLOPS = float(os.environ.get("BF16_PEAK_TFLOPS", "989.4"))


class Row:
    def __init__(self, id, measure, preset, pack, kind, target, batch=1, context=128, prompt_tokens=0, families=False):
        self.id, self.measure, self.preset, self.pack, self.kind = id, measure, preset, pack, kind
        self.target, self.batch, self.context, self.prompt_tokens = target, batch, context, prompt_tokens
        self.families = families


# The targets of issue 15 (H200, bf16, random weights). target = (kind, value): max_ms (decode
# step time at most), min_peak (prefill: fraction of the bf16 peak at least), max_s (seconds).
ROWS = [
    Row("0.6b-b1", "Qwen3-0.6B batch-1 decode step", "qwen3-0.6b", "decode", "decode", ("max_ms", 0.60)),
    Row("4b-b1", "Qwen3-4B batch-1 decode step", "qwen3-4b", "decode", "decode", ("max_ms", 2.36)),
    Row("4b-b64", "Qwen3-4B batch-64 decode step, 256-token contexts", "qwen3-4b", "decode", "decode", ("max_ms", 2.6), batch=64, context=256),
    Row("8b-b1", "Qwen3-8B batch-1 decode step", "qwen3-8b", "decode", "decode", ("max_ms", 4.6)),
    Row("4b-prefill", "Qwen3-4B prefill, one 8,192-token prompt", "qwen3-4b", "prefill", "prefill", ("min_peak", 0.60), context=0, prompt_tokens=8192),
    Row("4b-ready", "Qwen3-4B start to ready, weights in the page cache", "qwen3-4b", "decode", "ready", ("max_s", 5.0), context=0),
    # Issue 24: other families at the Qwen rows' fraction of the floor (min_frac_of: the row id).
    Row("llama8b-b1", "Llama-3.1-8B batch-1 decode step", "llama-3.1-8b", "decode", "decode", ("min_frac_of", "8b-b1"), families=True),
    Row("llama8b-b64", "Llama-3.1-8B batch-64 decode step, 256-token contexts", "llama-3.1-8b", "decode", "decode", ("min_frac_of", "4b-b64"),
        batch=64, context=256, families=True),
    Row("gemma4b-b1", "Gemma-3-4B batch-1 decode step", "gemma-3-4b", "decode", "decode", ("min_frac_of", "4b-b1"), families=True),
]
ROW_BY_ID = {r.id: r for r in ROWS}
PEER_MODES = ("graph", "compile")


def target_text(t, ref=None):
    kind, v = t
    if kind == "min_frac_of":
        r = ROW_BY_ID[v]
        return f"≥ {r.measure.split(' decode')[0]}'s fraction of floor" + (f" ({ref[0]:.0%}, {ref[1]})" if ref else "")
    return {"max_ms": f"≤ {v:.2f} ms", "min_peak": f"≥ {v:.0%} of bf16 peak", "max_s": f"≤ {v:g} s"}[kind]


def doc_fractions(doc):
    """measure -> kern's fraction of the floor, from a performance.md table ("| measure | kern | …
    | 59% of floor | …")."""
    out = {}
    try:
        with open(doc) as f:
            text = f.read()
    except OSError:
        return out
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[5].endswith("of floor"):
            try:
                out[cells[0]] = float(cells[5].split("%")[0]) / 100
            except ValueError:
                pass
    return out


def ref_fraction(results, ref_id, doc_fracs):
    """(fraction, where) of row ref_id: this run's median kern run, else the document's."""
    rs, _ = runs(results, f"kern-{ref_id}") if results else ([], None)
    r = median_run(rs, "median_ms")
    if r and isinstance(r.get("fraction_of_floor"), (int, float)):
        return r["fraction_of_floor"], "this run"
    m = ROW_BY_ID[ref_id].measure
    if m in doc_fracs:
        return doc_fracs[m], "performance.md"
    return None


def read_json(path):
    """The last JSON object line of a file (tools may print other lines first)."""
    with open(path) as f:
        lines = [l for l in f.read().splitlines() if l.strip().startswith("{")]
    if not lines:
        raise ValueError(f"{path}: no JSON line")
    return json.loads(lines[-1])


def why_missing(path):
    err = path + ".err"
    if os.path.exists(err):
        with open(err) as f:
            text = " ".join(f.read().split())
        return text[:140] + "…" if len(text) > 140 else text
    return "not yet measured"


def runs(results, prefix):
    """The JSON of each run RESULTS/PREFIX.N.json, and why there are none."""
    files = sorted(glob.glob(os.path.join(glob.escape(results), glob.escape(prefix) + ".*.json")))
    out = []
    for f in files:
        try:
            out.append(read_json(f))
        except (OSError, ValueError) as e:
            print(f"bench_table: skipping {f}: {e}", file=sys.stderr)
    if files and not out:
        return out, f"unreadable output ({files[0]})"
    return out, why_missing(os.path.join(results, prefix + ".1.json"))


def median_run(rs, key):
    """The run whose `key` is the median (the lower one of an even count)."""
    rs = sorted((r for r in rs if isinstance(r.get(key), (int, float))), key=lambda r: r[key])
    return rs[(len(rs) - 1) // 2] if rs else None


def config_of(work, preset):
    p = os.path.join(work, preset, "config.json") if work else None
    if p and os.path.exists(p):
        with open(p) as f:
            return json.load(f)
    return None


def prefill_flop(cfg, n):
    """FLOPs of a causal prefill of n tokens: 2 per multiply-add of every projection for every
    token, causal attention (QKᵀ and PV over i + 1 keys for token i), and the LM head for the last
    token only (kern computes logits for the last position). Norms, RoPE and activations are not
    counted (a fraction of a percent)."""
    h, L, nh, nkv = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // nh
    i, v = cfg["intermediate_size"], cfg["vocab_size"]
    per_layer = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * i
    linear = 2 * n * L * per_layer
    attention = L * 2 * 2 * nh * hd * n * (n + 1) // 2
    return linear + attention + 2 * h * v


def ms(x, digits=3):
    return f"{x:.{digits}f} ms"


def peer_cell(results, row, mode):
    path = os.path.join(results, f"peer-{row.id}-{mode}.json")
    if not os.path.exists(path):
        return why_missing(path)
    try:
        p = read_json(path)
    except (OSError, ValueError) as e:
        return f"unreadable: {e}"
    if "error" in p:
        return "failed: " + str(p["error"])[:100]
    if row.kind == "prefill" and isinstance(p.get("prefill_ms"), (int, float)):
        return ms(p["prefill_ms"], 1)
    if isinstance(p.get("itl_ms"), (int, float)):
        return ms(p["itl_ms"])
    return "no time in its output"


def build(results, work, ref_doc=None):
    """Rows of the table (dicts of cells) and each row's top-five ops."""
    table, tops = [], []
    doc_fracs = doc_fractions(ref_doc) if ref_doc else {}
    for row in ROWS:
        ref = ref_fraction(results, row.target[1], doc_fracs) if row.target[0] == "min_frac_of" else None
        c = {"measure": row.measure, "target": target_text(row.target, ref), "kern": None, "floor": "–", "fraction": "–", "met": None}
        c["peer_graph"] = peer_cell(results, row, "graph") if row.kind != "ready" else "n/a"
        c["peer_compile"] = peer_cell(results, row, "compile") if row.kind == "decode" else "n/a"
        kind, goal = row.target
        if row.kind == "ready":
            rs, why = runs(results, f"ready-{row.id}")
            r = median_run(rs, "ready_s")
            if r:
                c["kern"] = f"{r['ready_s']:.2f} s" + (f" (median of {len(rs)})" if len(rs) > 1 else "")
                c["met"] = r["ready_s"] <= goal
            else:
                c["kern"] = why
        else:
            rs, why = runs(results, f"kern-{row.id}")
            r = median_run(rs, "median_ms")
            if not r:
                c["kern"] = why
            elif row.kind == "decode":
                p90 = f"p90 {r['p90_ms']:.3f}, " if isinstance(r.get("p90_ms"), (int, float)) else ""
                c["kern"] = f"{ms(r['median_ms'])} ({p90}{r.get('tok_per_s', 0):,.0f} tok/s)"
                if isinstance(r.get("floor_ms"), (int, float)):
                    gbs = r.get("copy_gbs")
                    c["floor"] = ms(r["floor_ms"]) + (f" at {gbs / 1e3:.2f} TB/s" if isinstance(gbs, (int, float)) else "")
                frac = r.get("fraction_of_floor")
                if isinstance(frac, (int, float)):
                    c["fraction"] = f"{frac:.0%} of floor"
                if kind == "min_frac_of":
                    c["met"] = None if ref is None or not isinstance(frac, (int, float)) else frac >= ref[0]
                else:
                    c["met"] = r["median_ms"] <= goal
            else:  # prefill
                n = r.get("prompt_tokens") or row.prompt_tokens
                c["kern"] = f"{ms(r['median_ms'], 1)} ({r.get('tok_per_s', 0):,.0f} tok/s" + (f", median of {len(rs)})" if len(rs) > 1 else ")")
                cfg = config_of(work, row.preset)
                if cfg is None:
                    c["fraction"] = "no config.json to count FLOPs"
                else:
                    flop = prefill_flop(cfg, n)
                    tflops = flop / (r["median_ms"] / 1e3) / 1e12
                    c["floor"] = f"{ms(flop / (BF16_PEAK_TFLOPS * 1e12) * 1e3, 1)} ({flop / 1e12:.1f} TFLOP at {BF16_PEAK_TFLOPS:g} TFLOP/s)"
                    c["fraction"] = f"{tflops / BF16_PEAK_TFLOPS:.0%} of peak ({tflops:.0f} TFLOP/s)"
                    c["met"] = tflops / BF16_PEAK_TFLOPS >= goal
        tops.append((row, top_ops(results, row)))
        table.append(c)
    return table, tops


def top_ops(results, row):
    if row.kind == "ready":
        return None, "n/a (no step)"
    path = os.path.join(results, f"profile-{row.id}.json")
    if not os.path.exists(path):
        return None, why_missing(path)
    try:
        p = read_json(path)
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"
    return p, None


def cell(v):
    """A table cell: one line, with no `|` to split it (error messages are free text)."""
    return " ".join(v.split()).replace("|", "\\|") if isinstance(v, str) else v


def render(table, tops, results):
    out = []
    meta = os.path.join(results, "gpu.txt") if results else None
    if meta and os.path.exists(meta):
        with open(meta) as f:
            out.append(f"Measured on: {' '.join(f.read().split())}")
            out.append("")
    out.append("| measure | kern | peer: torch + CUDA graph | peer: torch.compile + CUDA graph | floor | kern vs floor | target | met? |")
    out.append("|---|---|---|---|---|---|---|---|")
    for c in table:
        c = {k: cell(v) for k, v in c.items()}
        met = {True: "**yes**", False: "**no**", None: "–"}[c["met"]]
        out.append(f"| {c['measure']} | {c['kern']} | {c['peer_graph']} | {c['peer_compile']} | {c['floor']} | {c['fraction']} | {c['target']} | {met} |")
    out.append("")
    out.append("Top five ops of each row (`kern profile`: every call of one step timed alone, eagerly):")
    out.append("")
    for row, (p, why) in tops:
        if p is None:
            out.append(f"- **{row.measure}**: {cell(why)}")
            continue
        total = p.get("total_ms") or 0.0
        ops = p.get("ops", [])[:5]
        out.append(f"- **{row.measure}** — {p.get('step', '')}, {total:.3f} ms over {len(p.get('calls', []))} calls:")
        out.append("")
        out.append("  | op | calls | ms | % of step | GB/s |")
        out.append("  |---|---|---|---|---|")
        for o in ops:
            share = 100 * o["ms"] / total if total > 0 else 0.0
            gbs = o.get("bytes", 0) / (o["ms"] / 1e3) / 1e9 if o["ms"] > 0 else 0.0
            out.append(f"  | {cell(o['op'])} | {o['calls']} | {o['ms']:.3f} | {share:.1f}% | {gbs:,.0f} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


BEGIN, END = "<!-- bench.sh: table begin -->", "<!-- bench.sh: table end -->"


def write_doc(doc, text):
    with open(doc) as f:
        old = f.read()
    if BEGIN not in old or END not in old or old.index(BEGIN) > old.index(END):
        raise SystemExit(f"bench_table: {doc} has no `{BEGIN}` … `{END}` section to rewrite")
    head, rest = old.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(head + BEGIN + "\n" + text + END + tail)


def cmd_table(a):
    if a.results and not os.path.isdir(a.results):
        raise SystemExit(f"bench_table: {a.results} is not a directory")
    table, tops = build(a.results or "", a.work, a.ref_doc)
    text = render(table, tops, a.results)
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.doc:
        write_doc(a.doc, text)


def cmd_plan(a):
    for r in ROWS:
        if getattr(a, "families", False) and not r.families:
            continue
        print(r.id, r.preset, r.pack, r.kind, r.batch, r.context, r.prompt_tokens)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd_ready(a):
    port = free_port()
    log = open(a.log, "w") if a.log else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen([a.kern, "serve", "--model", a.model, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    ready = None
    try:
        while time.perf_counter() - t0 < a.timeout:
            if p.poll() is not None:
                raise SystemExit(f"bench_table ready: kern serve exited with {p.returncode} before it was ready" + (f" (see {a.log})" if a.log else ""))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        ready = time.perf_counter() - t0
                        break
            except OSError:
                pass
            time.sleep(0.02)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if ready is None:
        raise SystemExit(f"bench_table ready: kern serve was not ready after {a.timeout} s")
    print(json.dumps({"ready_s": round(ready, 3), "model": a.model}))


def load_peer(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("torch_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def peer_prefill(peer, name, n, reps):
    import torch
    m = peer.Qwen3(peer.CFG[name], 1, n + 8, "cuda")
    ids = torch.randint(0, peer.V, (1, n), device="cuda")
    pos = torch.arange(n, device="cuda")
    with torch.inference_mode():
        m.forward(ids, pos)  # warm-up: cuBLAS heuristics, SDPA backend selection, allocator
        times = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
            torch.cuda.synchronize()
            e0.record()
            m.forward(ids, pos)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
    med = statistics.median(times)
    return dict(peer="torch-eager", model=name, batch=1, prompt_tokens=n, prefill_ms=round(med, 2), prefill_tok_s=round(n / med * 1e3), reps=reps)


def cmd_peer(a):
    try:
        peer = load_peer(a.peer)
        if a.model not in peer.CFG:  # Llama / Gemma 3: the same decoder for their shapes
            fam = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer_families.py")
            peer = load_peer(fam)
            if a.model not in peer.CFG:
                raise ValueError(f"neither peer has a model {a.model!r} (they have {sorted(peer.CFG)})")
        if a.prefill:
            print(json.dumps(peer_prefill(peer, a.model, a.prefill, a.reps)), flush=True)
        else:
            peer.run(a.model, a.batch, a.mode, prompt=a.prompt, new=a.new)  # prints its JSON line
    except Exception as e:  # reported in the table, not hidden
        print(json.dumps(dict(model=a.model, batch=a.batch, mode=a.mode, error=repr(e)[:300])), flush=True)
        sys.exit(1)


def selftest():
    """The table on constructed results: the new rows judged against a Qwen row's fraction."""
    import tempfile
    n_ok = n_bad = 0

    def check(name, cond):
        nonlocal n_ok, n_bad
        n_ok += bool(cond)
        n_bad += not cond
        if not cond:
            print(f"selftest FAIL: {name}")

    with tempfile.TemporaryDirectory() as tmp:
        res = os.path.join(tmp, "r")
        os.makedirs(res)
        doc = os.path.join(tmp, "perf.md")
        with open(doc, "w") as f:
            f.write("| measure | kern | p | c | floor | kern vs floor | target | met? |\n|---|---|---|---|---|---|---|---|\n"
                    "| Qwen3-8B batch-1 decode step | 4.972 ms | x | x | 3.932 ms | 79% of floor | ≤ 4.60 ms | **no** |\n"
                    "| Qwen3-4B batch-1 decode step | 3.274 ms | x | x | 1.941 ms | 59% of floor | ≤ 2.36 ms | **no** |\n")
        check("fractions read from the document", doc_fractions(doc) == {"Qwen3-8B batch-1 decode step": 0.79, "Qwen3-4B batch-1 decode step": 0.59})

        def kern_json(id, ms, frac):
            with open(os.path.join(res, f"kern-{id}.1.json"), "w") as f:
                f.write(json.dumps({"median_ms": ms, "p90_ms": ms * 1.01, "tok_per_s": 1000 / ms, "floor_ms": ms * frac,
                                    "fraction_of_floor": frac, "copy_gbs": 4200.0}) + "\n")
        kern_json("llama8b-b1", 5.0, 0.80)   # >= 79% (document): met
        kern_json("gemma4b-b1", 3.0, 0.50)   # < 59% (document): not met
        kern_json("4b-b64", 7.0, 0.38)       # this run's Qwen row
        kern_json("llama8b-b64", 9.0, 0.40)  # >= 38% (this run): met
        table, _ = build(res, None, doc)
        by = {c["measure"]: c for c in table}
        l1, g1, l64 = by[ROW_BY_ID["llama8b-b1"].measure], by[ROW_BY_ID["gemma4b-b1"].measure], by[ROW_BY_ID["llama8b-b64"].measure]
        check("llama b1 met against the document's 79%", l1["met"] is True and "79%" in l1["target"] and "performance.md" in l1["target"])
        check("gemma b1 not met against 59%", g1["met"] is False and g1["fraction"] == "50% of floor")
        check("llama b64 against this run's 4B b64", l64["met"] is True and "this run" in l64["target"])
        check("unmeasured rows say so", by[ROW_BY_ID["8b-b1"].measure]["kern"] == "not yet measured")
        table, _ = build(res, None, os.path.join(tmp, "missing.md"))
        check("no reference: met unknown", {c["measure"]: c for c in table}[ROW_BY_ID["llama8b-b1"].measure]["met"] is None)
        text = render(*build(res, None, doc), res)
        check("rendered", "Llama-3.1-8B batch-1 decode step" in text and "**yes**" in text and "**no**" in text)
    check("plan --families lists the three rows", [r.id for r in ROWS if r.families] == ["llama8b-b1", "llama8b-b64", "gemma4b-b1"])
    print(f"selftest: {n_ok} passed, {n_bad} failed")
    return 0 if n_bad == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan")
    pl.add_argument("--families", action="store_true", help="only issue 24's rows")
    pl.set_defaults(f=cmd_plan)
    sub.add_parser("selftest").set_defaults(f=lambda a: sys.exit(selftest()))
    t = sub.add_parser("table")
    t.add_argument("results", nargs="?", default="", help="bench.sh's results directory (none: every row not yet measured)")
    t.add_argument("--work", help="bench.sh's work directory (PRESET/config.json gives prefill's FLOPs)")
    t.add_argument("--doc", help="rewrite the table section of this markdown file")
    t.add_argument("--out", help="also write the table to this file")
    t.add_argument("--ref-doc", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "performance.md"),
                   help="the Qwen rows' fractions of the floor when this run has none (default docs/performance.md)")
    t.set_defaults(f=cmd_table)
    r = sub.add_parser("ready")
    r.add_argument("--kern", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--log")
    r.add_argument("--timeout", type=float, default=300)
    r.set_defaults(f=cmd_ready)
    pe = sub.add_parser("peer")
    pe.add_argument("--peer", required=True, help="torch_peer.py")
    pe.add_argument("--model", required=True, help="a key of the peer's CFG: qwen3-0.6b, qwen3-4b, qwen3-8b")
    pe.add_argument("--batch", type=int, default=1)
    pe.add_argument("--prompt", type=int, default=128, help="prompt tokens before decode")
    pe.add_argument("--new", type=int, default=128, help="decode steps timed")
    pe.add_argument("--mode", default="graph", choices=["graph", "compile"])
    pe.add_argument("--prefill", type=int, help="time the prefill of one prompt of this many tokens instead")
    pe.add_argument("--reps", type=int, default=3)
    pe.set_defaults(f=cmd_peer)
    a = ap.parse_args()
    a.f(a)


if __name__ == "__main__":
    main()
