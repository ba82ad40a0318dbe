"""Structured output, tool calls and their cost on a real model behind `kern serve`
(scripts/gpu/structured.sh starts the server and runs this): the official openai client.

1. A tool-using conversation end to end: the model's own call (tool_choice auto, forced with
   required if it answers in text), the tool's result sent back, the final answer.
2. JSON-schema outputs on real prompts, each validated (Pydantic models through `parse()`,
   strict json_schema underneath).
3. The cost: decode tok/s at batch 1 and 64 with every request constrained vs none; time to first
   token with a new schema (compiled then) vs the same schema again (cached); the token-mask time
   from /metrics.

    python3 scripts/gpu/structured.py http://127.0.0.1:8300 OUT.json
Prints a table last; exits 1 if a functional check failed.
"""
import json
import statistics
import sys
import threading
import time
import urllib.request
import uuid
from typing import List, Literal, Optional

import openai
from pydantic import BaseModel, Field
from tool_conversation import TOOLS, first_turn

base, out_path = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=600)
model = client.models.list().data[0].id
rows, failures, results = [], [], {}


def row(name, value):
    rows.append((name, value))
    print(f"  {name}: {value}", flush=True)


def check(name, ok, detail=""):
    row(name, "PASS" if ok else f"FAIL {detail}")
    if not ok:
        failures.append(name)


def metric(name):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    vals = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(name + suffix + " "):
                vals[suffix] = float(line.rsplit(" ", 1)[1])
    return vals.get("_sum", 0.0), vals.get("_count", 0.0)


# ---------------------------------------------------------------------------- 1. tool loop
print("== a tool-using conversation", flush=True)
tools = TOOLS
messages = first_turn()
r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=200, temperature=0)
c = r.choices[0]
forced = False
print(f"  auto: finish {c.finish_reason}, content {c.message.content!r}, calls {[t.function for t in c.message.tool_calls or []]}")
if not c.message.tool_calls:
    forced = True
    # One city, one call: a parallel grammar lets a small model repeat the call.
    r = client.chat.completions.create(model=model, messages=messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=200, temperature=0)
    c = r.choices[0]
    print(f"  required: finish {c.finish_reason}, calls {[t.function for t in c.message.tool_calls or []]}")
calls = c.message.tool_calls or []
check("tool call parsed (" + ("forced by tool_choice required" if forced else "the model's own, tool_choice auto") + ")",
      c.finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather" and "city" in json.loads(calls[0].function.arguments),
      repr(c))
# Streamed: the same call from fragments.
frag = {}
extra = {"tool_choice": "required", "parallel_tool_calls": False} if forced else {}
for ch in client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=200, temperature=0, stream=True, **extra):
    for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
        n, a = frag.get(d.index, (None, ""))
        frag[d.index] = (d.function.name or n, a + (d.function.arguments or ""))
check("streamed tool_calls reassemble to the same calls", [frag[i] for i in sorted(frag)] == [(t.function.name, t.function.arguments) for t in calls], f"{frag}")
# The agent loop: run each call, send the results back, until the model answers in text — at
# most 3 rounds with the tools offered; a model that keeps calling gets one last round without
# them (as agent frameworks do for the answering turn). Which round answered is reported.
answered, path = None, []
for rnd in range(4):
    if not calls:
        break
    messages.append(c.message.model_dump(exclude_none=True))
    for t in calls:
        result = {"city": json.loads(t.function.arguments).get("city"), "temperature": 21, "unit": "celsius", "conditions": "sunny"} if t.function.name == "get_weather" else {"time": "14:05"}
        messages.append({"role": "tool", "tool_call_id": t.id, "content": json.dumps(result)})
    offer = rnd < 3
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=120, temperature=0, **({"tools": tools} if offer else {}))
    c = r.choices[0]
    calls = c.message.tool_calls or []
    # What the model saw and wrote (scripts/gpu/tool_answer_ref.py replays it in transformers).
    results.setdefault("rounds", []).append({"messages": list(messages), "tools": tools if offer else None,
                                              "text": r.choices[0].message.content, "calls": [t.function.model_dump() for t in calls]})
    path.append(f"round {rnd + 1}{'' if offer else ' (no tools)'}: {c.finish_reason}, {len(calls)} call(s)")
    print(f"  {path[-1]}: {c.message.content!r}")
    if not calls:
        answered = c
check("final answer after the tool result (" + "; ".join(path) + ")",
      answered is not None and answered.finish_reason == "stop" and "21" in (answered.message.content or ""), repr(answered or c))
results["conversation"] = messages

# ------------------------------------------------------------------- 2. JSON on real prompts
print("== JSON-schema outputs on real prompts (parse() with Pydantic models)", flush=True)


class Person(BaseModel):
    name: str
    age: int = Field(ge=0, le=130)
    occupation: str
    city: str


class Recipe(BaseModel):
    title: str
    servings: int = Field(ge=1, le=20)
    ingredients: List[str] = Field(min_length=2, max_length=12)
    steps: List[str] = Field(min_length=2, max_length=10)
    vegetarian: bool


class Review(BaseModel):
    sentiment: Literal["positive", "negative", "mixed"]
    score: int = Field(ge=1, le=5)
    summary: str


class Event(BaseModel):
    title: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    location: Optional[str]
    attendees: List[str]


class Function(BaseModel):
    name: str = Field(pattern=r"^[a-z_][a-z0-9_]*$")
    language: Literal["python", "rust", "javascript"]
    arguments: List[str]
    returns: str


cases = [
    (Person, "Extract the person: 'Maria Lopez, a 34-year-old architect, moved to Barcelona last spring.'"),
    (Recipe, "Give me a simple pancake recipe."),
    (Review, "Classify this review: 'The battery lasts forever but the screen scratches far too easily.'"),
    (Event, "Extract the event: 'PyCon US 2025 takes place on 2025-05-14 in Pittsburgh; Ana and Ben will attend.'"),
    (Function, "Describe a Python function that checks whether a string is a palindrome."),
]
ok_n = 0
for cls, prompt in cases:
    try:
        p = client.beta.chat.completions.parse(model=model, messages=[{"role": "user", "content": prompt}], response_format=cls, max_tokens=400, temperature=0)
        m = p.choices[0].message
        good = p.choices[0].finish_reason == "stop" and isinstance(m.parsed, cls)
        print(f"  {cls.__name__}: {m.parsed!r}" if good else f"  {cls.__name__}: FAILED {p.choices[0].finish_reason} {m.content!r}")
        ok_n += good
    except Exception as e:  # noqa: BLE001 - a failure is reported, the run goes on
        print(f"  {cls.__name__}: FAILED {e}")
check(f"parse() outputs valid ({ok_n}/{len(cases)})", ok_n == len(cases))

# ---------------------------------------------------------------------------- 3. cost
print("== cost", flush=True)
LONG = {"type": "array", "minItems": 400, "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "email": {"type": "string", "maxLength": 40}}, "required": ["name", "age", "email"], "additionalProperties": False}}
PROMPT = [{"role": "user", "content": "List fictional people as a JSON array of objects with name, age and email."}]


def one_stream(constrained, max_tokens, stamps):
    extra = {"ignore_eos": True}
    kw = {}
    if constrained:
        kw["response_format"] = {"type": "json_schema", "json_schema": {"name": "people", "schema": LONG}}
    t_first, t_last, n = None, None, 0
    for ch in client.chat.completions.create(model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0, stream=True,
                                             stream_options={"include_usage": True}, extra_body=extra, **kw):
        now = time.perf_counter()
        if ch.choices and ch.choices[0].delta.content:
            t_first = t_first or now
            t_last = now
        if ch.usage:
            n = ch.usage.completion_tokens
    stamps.append((t_first, t_last, n))


def decode_rate(batch, constrained, max_tokens=256):
    stamps = []
    ts = [threading.Thread(target=one_stream, args=(constrained, max_tokens, stamps)) for _ in range(batch)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # Decode throughput: every token after each request's first, over the span from the first
    # first token to the last token (prefill of the batch mostly before it).
    toks = sum(s[2] - 1 for s in stamps)
    span = max(s[1] for s in stamps) - min(s[0] for s in stamps)
    return toks / span, stamps


one_stream(True, 8, [])  # compile the schema once: decode rates exclude compilation
for batch in (1, 64):
    free, _ = decode_rate(batch, False)
    cons, _ = decode_rate(batch, True)
    results[f"decode_b{batch}"] = {"free_tok_s": free, "constrained_tok_s": cons}
    row(f"decode tok/s batch {batch}: none / every request constrained", f"{free:.1f} / {cons:.1f} ({(cons / free - 1) * 100:+.1f}%)")


def ttft(schema):
    t = time.perf_counter()
    for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "A JSON object please."}], max_tokens=4, temperature=0, stream=True,
                                             response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}):
        if ch.choices and (ch.choices[0].delta.content or ch.choices[0].finish_reason):
            return time.perf_counter() - t
    return time.perf_counter() - t


def fresh_schema():
    # The same shape with fresh property names: a cache miss every time.
    k = uuid.uuid4().hex[:8]
    return {"type": "object", "properties": {f"title_{k}": {"type": "string"}, f"year_{k}": {"type": "integer"}, f"tags_{k}": {"type": "array", "items": {"type": "string"}},
            f"author_{k}": {"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}}, "required": ["name"]}},
            "required": [f"title_{k}", f"year_{k}"]}


free_ttft = []
for _ in range(5):
    t = time.perf_counter()
    for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "A JSON object please."}], max_tokens=4, temperature=0, stream=True):
        if ch.choices and (ch.choices[0].delta.content or ch.choices[0].finish_reason):
            break
    free_ttft.append(time.perf_counter() - t)
new, cached = [], []
for _ in range(5):
    s = fresh_schema()
    new.append(ttft(s))
    cached.append(ttft(s))
results["ttft_ms"] = {"free": [x * 1e3 for x in free_ttft], "new_schema": [x * 1e3 for x in new], "cached_schema": [x * 1e3 for x in cached]}
row("TTFT ms (median of 5): unconstrained / new schema / cached schema",
    f"{statistics.median(free_ttft) * 1e3:.1f} / {statistics.median(new) * 1e3:.1f} / {statistics.median(cached) * 1e3:.1f}")
s, n = metric("kern:token_mask_seconds")
w, wn = metric("kern:token_mask_wait_seconds")
results["mask"] = {"mean_us": s / max(n, 1) * 1e6, "masks": n, "wait_mean_us": w / max(wn, 1) * 1e6}
row("token mask: mean CPU time per row / mean wait per step", f"{s / max(n, 1) * 1e6:.0f} µs over {int(n)} masks / {w / max(wn, 1) * 1e6:.0f} µs")

json.dump(results, open(out_path, "w"), indent=1, default=str)
print("\n== structured output on", model)
for name, value in rows:
    print(f"{name:<72} {value}")
sys.exit(1 if failures else 0)
