#!/usr/bin/env python3
"""Every family through `kern serve`, driven by the official `openai` client (issue 24 item 6).

    python3 scripts/gpu/serve_families.py [--kern .carry/kern] [--kernels build/packs]
        [--only smollm2,gemma-270m,llama-1b,gemma-1b] [--json FILE] [--work /tmp/kern-serve-fam]
    python3 scripts/gpu/serve_families.py --selftest       # the pure parts (CPU)

Models (each packed here, served alone on its own port, stopped with SIGTERM):
  smollm2     SmolLM2-135M-Instruct Q4_1 GGUF (llama): tokenizer and chat template from the GGUF
  gemma-270m  Gemma 3 270M Q4_K_M GGUF (gemma3, a base model): tokenizer from the GGUF, the chat
              template Gemma 3's own (--chat-template: the GGUF has none)
  llama-1b    random weights, Llama 3.2 1B shapes (llama3 RoPE), Llama 3's tokenizer files
  gemma-1b    random weights, Gemma 3 1B shapes with a 64-token window, Gemma 3's tokenizer files
GGUF files from --gguf-dir (scripts/gpu/stage.sh), tokenizer files from --tok-dir
(families.sh unpacks .carry/fam/*.tgz there).

Checks per model (PASS/FAIL lines, then one JSON object per model in --json):
  - the openai client: models.list; chat and chat streamed (greedy: the streamed text equals the
    whole one, usage counted); completions and completions streamed (the same); a 400 naming a
    bad field;
  - answers: the real models' France prompts mention Paris (SmolLM2 as a chat, Gemma 3 270M as a
    completion);
  - /tokenize: the chat template rendered and tokenized by kern equals the reference tokenizer's
    apply_chat_template ids (a system prompt, several turns, non-ASCII text), and plain prompts
    equal the reference's ids (special tokens as it adds them); references: transformers' GGUF
    tokenizer for SmolLM2, Gemma 3's and Llama 3's official tokenizer files for the others
    (transformers 5.17's GGUF loader gets Gemma 3's SentencePiece vocabulary wrong);
  - greedy through the server equals `kern generate` (one prompt of random ids longer than the
    window where there is one, ignore_eos, token ids);
  - 16 concurrent streams (random ids, 32 new tokens each): every stream exactly 32 token ids,
    usage equal, text == decode(ids); /metrics afterwards: no KV page in use, nothing running;
  - SIGTERM: exit code 0.
"""
import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FRANCE = "What is the capital of France?"
CONVERSATIONS = [
    ("system + user", [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": FRANCE}]),
    ("multi-turn", [{"role": "user", "content": "Hi! Who are you?"}, {"role": "assistant", "content": "I am a small language model."},
                    {"role": "user", "content": "Name a colour of the sky."}]),
    ("non-ASCII", [{"role": "user", "content": "Ünïcödé façade — 你好，世界！Здравствуй, мир. 😀"}]),
    ("system + multi-turn", [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello there"},
                             {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Où est Paris ?"}]),
]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "  leading spaces and\ttabs\nnew lines", "Café, naïve, 東京, مرحبا, 🙂"]

MODELS = {
    "smollm2": dict(name="smollm2-135m-instruct", kind="gguf", file="SmolLM2-135M-Instruct.Q4_1.gguf", ref="gguf",
                    chat_answer="Paris", completion=None),
    "gemma-270m": dict(name="gemma-3-270m", kind="gguf", file="gemma-3-270m-q4_k_m.gguf", ref="gemma3-tokenizer",
                       chat_template_from="gemma3-tokenizer", chat_answer=None,
                       completion=("The capital of Germany is Berlin. The capital of France is", "Paris")),
    "llama-1b": dict(name="llama-3.2-1b-random", kind="random", preset="llama-3.2-1b", config={}, ref="llama3-tokenizer",
                     chat_answer=None, completion=None),
    "gemma-1b": dict(name="gemma-3-1b-sw64-random", kind="random", preset="gemma-3-1b", config={"sliding_window": 64},
                     ref="gemma3-tokenizer", chat_answer=None, completion=None, long_prompt=600),
}


class Checks:
    def __init__(self, model):
        self.model, self.rows = model, []

    def __call__(self, name, ok, detail=""):
        ok = bool(ok)
        print(f"{'PASS' if ok else 'FAIL'} [{self.model}] {name}" + (f": {detail}" if detail else ""), flush=True)
        self.rows.append({"check": name, "pass": ok, "detail": str(detail)[:300]})
        return ok

    def run(self, name, fn):
        """A check that may raise: the exception fails it, the others go on."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self(name, False, f"{type(e).__name__}: {e}")
            return None


def tokenizer_config_template(d):
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        t = json.load(f).get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        t = next((x["template"] for x in t if x.get("name") == "default"), t[0]["template"])
    return t


def unpack_tokenizers(carry_dir, tok_dir):
    """.carry/fam/NAME.tgz -> tok_dir/NAME/ (once)."""
    for name in ("llama3-tokenizer", "gemma3-tokenizer"):
        src = os.path.join(carry_dir, f"{name}.tgz")
        dst = os.path.join(tok_dir, name)
        if os.path.exists(os.path.join(dst, "tokenizer.json")) or not os.path.exists(src):
            continue
        os.makedirs(dst, exist_ok=True)
        with tarfile.open(src) as t:
            t.extractall(dst)


def ids_of(x):
    if hasattr(x, "keys"):
        x = x["input_ids"]
    if len(x) and isinstance(x[0], (list, tuple)):
        x = x[0]
    return [int(t) for t in x]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_kern(kern, argv, log, timeout=600):
    with open(log, "a") as f:
        f.write(f"$ {kern} {' '.join(map(str, argv))}\n")
        f.flush()
        p = subprocess.run([kern] + [str(x) for x in argv], stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        with open(log) as f:
            tail = f.read().strip().splitlines()[-5:]
        raise RuntimeError(f"kern {argv[0]} exited {p.returncode}: {' / '.join(tail)}")


def prepare(key, spec, a):
    """The model directory to serve, packed here; its reference tokenizer; serve's extra args."""
    from transformers import AutoTokenizer
    d = os.path.join(a.work, key)
    log = os.path.join(a.work, f"{key}.log")
    # What the model needs from the carry and the staging, checked before any work.
    need = [os.path.join(a.tok_dir, t, "tokenizer.json") for t in (spec["ref"], spec.get("chat_template_from")) if t and t != "gguf"]
    if spec["kind"] == "gguf":
        need.append(os.path.join(a.gguf_dir, spec["file"]))
    missing = [p for p in need if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)} (tokenizers: .carry/fam from prepare-carry.sh; GGUFs: scripts/gpu/stage.sh)")
    shutil.rmtree(d, ignore_errors=True)
    extra = []
    pack = ["--kernels", a.kernels, "--max-tokens", 512, "--max-seqs", 32, "--max-context", 2048]
    if spec["kind"] == "gguf":
        gguf = os.path.join(a.gguf_dir, spec["file"])
        if not os.path.isfile(gguf):
            raise FileNotFoundError(f"{gguf} is not staged (scripts/gpu/stage.sh)")
        run_kern(a.kern, ["pack", "--gguf", gguf, "-o", d] + pack, log)
        if spec["ref"] == "gguf":
            ref = AutoTokenizer.from_pretrained(a.gguf_dir, gguf_file=spec["file"])
        else:
            ref = AutoTokenizer.from_pretrained(os.path.join(a.tok_dir, spec["ref"]))
        if spec.get("chat_template_from"):
            tpl = os.path.join(a.work, f"{key}.chat_template.jinja")
            with open(tpl, "w") as f:
                f.write(tokenizer_config_template(os.path.join(a.tok_dir, spec["chat_template_from"])))
            extra = ["--chat-template", tpl]
    else:
        import parity
        presets = parity.read_presets()
        os.makedirs(a.work, exist_ok=True)
        src = os.path.join(a.work, f"{key}.config.json")
        parity.write_json(src, parity.shape_config({"preset": spec["preset"], "config": spec["config"]}, presets))
        run_kern(a.kern, ["random-weights", "--config", src, "-o", d, "--seed", 3], log)
        parity.hf_config_fixups(d)
        run_kern(a.kern, ["pack", "--config", os.path.join(d, "config.json"), "-o", d] + pack, log)
        tdir = os.path.join(a.tok_dir, spec["ref"])
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(tdir, f), d)
        ref = AutoTokenizer.from_pretrained(tdir)
    with open(os.path.join(d, "config.json")) as f:
        vocab = int(json.load(f)["vocab_size"])
    return d, ref, extra, vocab


def start(kern, d, name, port, extra, log):
    t0 = time.time()
    f = open(log, "a")
    p = subprocess.Popen([kern, "serve", "--model", d, "--port", str(port), "--served-model-name", name] + extra,
                         stdout=f, stderr=subprocess.STDOUT)
    import httpx
    while time.time() - t0 < 180:
        if p.poll() is not None:
            raise RuntimeError(f"kern serve exited {p.returncode} before it was ready (see {log})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return p, time.time() - t0
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("kern serve not ready after 180 s")


def check_model(key, spec, a, port):
    import httpx
    import openai
    res = {"model": spec["name"], "key": key}
    ck = Checks(spec["name"])
    log = os.path.join(a.work, f"{key}.log")
    t = time.time()
    d, ref, extra, vocab = prepare(key, spec, a)
    res["prepare_s"] = round(time.time() - t, 1)
    rng = random.Random(7)
    id_max = min(vocab, 151643)

    # kern generate's greedy ids for one prompt (batch 1, as the server runs it alone)
    n_long = spec.get("long_prompt", 120)
    gen_prompt = [rng.randrange(id_max) for _ in range(n_long)]
    gdump = os.path.join(a.work, f"{key}-gen")
    ck.run("kern generate", lambda: run_kern(a.kern, ["generate", "--model", d, "--prompt-ids", ",".join(map(str, gen_prompt)),
                                                      "--max-tokens", 32, "--ignore-eos", "--dump", gdump], log))

    p, ready = start(a.kern, d, spec["name"], port, extra, log)
    res["ready_s"] = round(ready, 2)
    base = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    name = spec["name"]
    try:
        ck.run("openai: models.list", lambda: ck("openai: models.list", client.models.list().data[0].id == name))

        def chat():
            msgs = [{"role": "user", "content": FRANCE}]
            r = client.chat.completions.create(model=name, messages=msgs, max_tokens=48, temperature=0)
            text = r.choices[0].message.content or ""
            ck("openai: chat", r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 5,
               repr(text[:80]))
            res["answer"] = text
            if spec.get("chat_answer"):
                ck(f"answer: chat mentions {spec['chat_answer']}", spec["chat_answer"] in text, repr(text[:120]))
            pieces, usage = [], None
            for c in client.chat.completions.create(model=name, messages=msgs, max_tokens=48, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}):
                if c.choices:
                    pieces.append(c.choices[0].delta.content or "")
                if c.usage:
                    usage = c.usage
            ck("openai: chat streamed == whole (greedy)", "".join(pieces) == text and usage is not None
               and usage.completion_tokens == r.usage.completion_tokens, f"{len(pieces)} chunks, {''.join(pieces)[:60]!r}")
        ck.run("openai: chat", chat)

        def completion():
            prompt, want = spec.get("completion") or ("The quick brown fox", None)
            r = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
            text = r.choices[0].text
            ck("openai: completions", r.usage.completion_tokens >= 1, repr(text[:80]))
            if want:
                res["answer"] = text
                ck(f"answer: completion mentions {want}", want in text, repr(text[:120]))
            streamed = "".join(c.choices[0].text for c in client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0, stream=True))
            ck("openai: completions streamed == whole (greedy)", streamed == text, repr(streamed[:60]))
        ck.run("openai: completions", completion)

        def bad_field():
            try:
                client.completions.create(model=name, prompt="x", max_tokens=4, temperature=-1)
                ck("openai: 400 on a bad field", False, "accepted")
            except openai.BadRequestError as e:
                ck("openai: 400 on a bad field", "temperature" in str(e), str(e)[:100])
        ck.run("openai: 400 on a bad field", bad_field)

        def tokenize():
            same = 0
            for label, msgs in CONVERSATIONS:
                k = httpx.post(base + "/tokenize", json={"model": name, "messages": msgs, "add_generation_prompt": True}, timeout=30).json()
                want = ids_of(ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
                if k.get("tokens") == want:
                    same += 1
                else:
                    got = k.get("tokens") or k
                    print(f"  [{name}] chat ids differ ({label}): kern {str(got)[:160]} vs reference {want[:40]}")
            ck("chat template + tokenizer ids == reference", same == len(CONVERSATIONS), f"{same}/{len(CONVERSATIONS)} conversations")
            same = 0
            for text in TEXTS:
                k = httpx.post(base + "/tokenize", json={"model": name, "prompt": text}, timeout=30).json()
                want = ids_of(ref(text)["input_ids"])
                if k.get("tokens") == want:
                    same += 1
                else:
                    print(f"  [{name}] text ids differ ({text[:30]!r}): kern {str(k.get('tokens') or k)[:160]} vs reference {want[:40]}")
            ck("prompt ids == reference", same == len(TEXTS), f"{same}/{len(TEXTS)} texts")
        ck.run("tokenize", tokenize)

        def greedy():
            with open(os.path.join(gdump, "tokens.json")) as f:
                want = json.load(f)["outputs"][0]
            r = httpx.post(base + "/v1/completions", json={"model": name, "prompt": gen_prompt, "max_tokens": len(want), "temperature": 0,
                                                           "ignore_eos": True, "return_token_ids": True}, timeout=120).json()
            got = r["choices"][0]["token_ids"]
            j = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
            ck(f"greedy: server == kern generate ({len(gen_prompt)}-token prompt)", got == want, "identical" if got == want else f"first difference at {j}")
        ck.run("greedy: server == kern generate", greedy)

        def load():
            from tokenizers import Tokenizer
            tk = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            n, new = 16, 32
            prompts = [[rng.randrange(id_max) for _ in range(rng.randint(16, 400))] for _ in range(n)]

            async def one(cl, pr):
                t0 = time.perf_counter()
                ttft, ids, text, usage = None, [], [], None
                body = {"model": name, "prompt": pr, "max_tokens": new, "temperature": 0, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True}, "return_token_ids": True}
                async with cl.stream("POST", base + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line[6:] == "[DONE]":
                            continue
                        j = json.loads(line[6:])
                        if j.get("usage"):
                            usage = j["usage"]
                        for c in j.get("choices", []):
                            if c.get("token_ids") and ttft is None:
                                ttft = time.perf_counter() - t0
                            ids += c.get("token_ids") or []
                            text.append(c.get("text", ""))
                return ids, "".join(text), usage, ttft

            async def all_():
                async with httpx.AsyncClient(timeout=300) as cl:
                    return await asyncio.gather(*[one(cl, pr) for pr in prompts])
            t0 = time.perf_counter()
            out = asyncio.run(all_())
            wall = time.perf_counter() - t0
            counts = sum(len(o[0]) == new for o in out)
            usage_ok = all(o[2] and o[2]["completion_tokens"] == new and o[2]["prompt_tokens"] == len(pr) for o, pr in zip(out, prompts))
            text_ok = sum(tk.decode(o[0], skip_special_tokens=True) == o[1] for o in out)
            res["load"] = {"streams": n, "wall_s": round(wall, 2), "ttft_p50_ms": round(pct([o[3] for o in out if o[3]], 0.5) * 1e3, 1)}
            ck(f"{n} concurrent streams: {new} token ids each, usage, text == decode(ids)", counts == n and usage_ok and text_ok == n,
               f"{counts}/{n} counts, usage {usage_ok}, text {text_ok}/{n}, {wall:.2f} s")
            time.sleep(0.3)
            m = {}
            for line in httpx.get(base + "/metrics").text.splitlines():
                if line.startswith("kern:") and " " in line and "{" not in line:
                    k, v = line.rsplit(" ", 1)
                    m[k] = float(v)
            ck("after the load: no KV page in use, nothing running", m.get("kern:kv_cache_used_pages") == 0 and m.get("kern:num_requests_running") == 0,
               f"pages {m.get('kern:kv_cache_used_pages')}, running {m.get('kern:num_requests_running')}")
        ck.run("concurrent streams", load)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "killed"
        ck("SIGTERM: drains and exits 0", rc == 0, f"exit {rc}")
    res["checks"] = len(ck.rows)
    res["checks_passed"] = sum(1 for r in ck.rows if r["pass"])
    res["failed"] = [r["check"] for r in ck.rows if not r["pass"]]
    res["rows"] = ck.rows
    res["pass"] = not res["failed"]
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--kern", default=".carry/kern")
    ap.add_argument("--kernels", default="build/packs")
    ap.add_argument("--only", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--gguf-dir", default=os.environ.get("KERN_GGUF_DIR", "/tmp/kern-gguf"))
    ap.add_argument("--tok-dir", default="/tmp/kern-tok", help="tokenizer folders (llama3-tokenizer/, gemma3-tokenizer/)")
    ap.add_argument("--carry-dir", default=".carry/fam", help="where the tokenizer .tgz files are, unpacked into --tok-dir")
    ap.add_argument("--work", default="/tmp/kern-serve-fam")
    ap.add_argument("--json")
    ap.add_argument("--port", type=int, default=8310)
    ap.add_argument("--budget", type=float, default=0, help="start no new model after this many seconds (0: no limit)")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.makedirs(a.work, exist_ok=True)
    unpack_tokenizers(a.carry_dir, a.tok_dir)
    keys = [k.strip() for k in a.only.split(",") if k.strip()]
    bad = [k for k in keys if k not in MODELS]
    if bad:
        print(f"serve_families: unknown {bad}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    t0 = time.time()
    out = {"models": []}
    for i, k in enumerate(keys):
        if a.budget and time.time() - t0 > a.budget:
            out["models"].append({"model": MODELS[k]["name"], "key": k, "pass": False, "failed": ["not started: budget"], "checks": 0, "checks_passed": 0})
            continue
        print(f"\n== {k}: {MODELS[k]['name']}", flush=True)
        try:
            r = check_model(k, MODELS[k], a, a.port + i)
        except Exception as e:  # noqa: BLE001 -- this model fails, the next one runs
            traceback.print_exc()
            r = {"model": MODELS[k]["name"], "key": k, "pass": False, "failed": [f"{type(e).__name__}: {e}"[:200]], "checks": 1, "checks_passed": 0}
        out["models"].append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
    print("\n== served")
    for r in out["models"]:
        print(f"{r['model']:<26} {'PASS' if r['pass'] else 'FAIL'}  {r.get('checks_passed', 0)}/{r.get('checks', 0)} checks, ready {r.get('ready_s', '?')} s"
              + (f", answer {r['answer'][:40]!r}" if r.get("answer") else "") + (f"; failed: {', '.join(r['failed'])}" if r.get("failed") else ""))
    return 0 if all(r["pass"] for r in out["models"]) else 1


def selftest():
    import tempfile
    n_ok = n_bad = 0

    def check(name, cond):
        nonlocal n_ok, n_bad
        n_ok += bool(cond)
        n_bad += not cond
        if not cond:
            print(f"selftest FAIL: {name}")

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}, f)
        check("template list: the default one", tokenizer_config_template(tmp) == "D")
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": "S"}, f)
        check("template string", tokenizer_config_template(tmp) == "S")
        src = os.path.join(tmp, "fam")
        os.makedirs(os.path.join(src, "x"))
        with open(os.path.join(src, "x", "tokenizer.json"), "w") as f:
            f.write("{}")
        with tarfile.open(os.path.join(src, "llama3-tokenizer.tgz"), "w:gz") as t:
            t.add(os.path.join(src, "x", "tokenizer.json"), arcname="tokenizer.json")
        unpack_tokenizers(src, os.path.join(tmp, "tok"))
        check("tokenizers unpacked", os.path.exists(os.path.join(tmp, "tok", "llama3-tokenizer", "tokenizer.json")))
    import contextlib
    import io
    c = Checks("m")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        c("a", True)
        c.run("b", lambda: 1 / 0)
    check("checks record failures and exceptions", [r["pass"] for r in c.rows] == [True, False] and "ZeroDivisionError" in c.rows[1]["detail"])
    check("ids_of", ids_of({"input_ids": [[1, 2]]}) == [1, 2])
    check("every model names its reference", all(m["ref"] in ("gguf", "llama3-tokenizer", "gemma3-tokenizer") for m in MODELS.values()))
    print(f"selftest: {n_ok} passed, {n_bad} failed")
    return 0 if n_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
