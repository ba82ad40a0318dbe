"""Replays the tool loop's rounds of scripts/gpu/structured.py in transformers: for each round
(the conversation kern answered, tools offered or not), the same GGUF loaded by transformers
(bf16, greedy) writes its answer, and its calls are read the way kern reads them (tagged or bare
`{"name", "arguments"}` objects). Says per round whether transformers' answer is kern's —
whether a wrong final answer is the model's or kern's.

    python3 scripts/gpu/tool_answer_ref.py OUT/structured.json /tmp/kern-gguf/qwen2.5-coder-0.5b-q4km.gguf
Prints a table last; exits 1 when a round differs.
"""
import json
import os
import re
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

res = json.load(open(sys.argv[1]))
gguf = sys.argv[2]
rounds = res.get("rounds") or []
if not rounds:
    sys.exit("tool_answer_ref: no tool-loop rounds in " + sys.argv[1])
d, f = os.path.split(gguf)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16).cuda().eval()


def normalized(m):
    """OpenAI messages → what chat templates expect: call arguments as objects (kern and vLLM do
    the same before rendering)."""
    m = dict(m)
    if m.get("tool_calls"):
        calls = []
        for t in m["tool_calls"]:
            t = json.loads(json.dumps(t))
            a = t.get("function", {}).get("arguments")
            if isinstance(a, str):
                try:
                    t["function"]["arguments"] = json.loads(a)
                except json.JSONDecodeError:
                    pass
            calls.append(t)
        m["tool_calls"] = calls
    return m


def calls_of(text):
    """(content, [(name, arguments object)]) — tagged calls, or bare call objects before any text."""
    calls = []
    for body in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S):
        try:
            o = json.loads(body)
            calls.append((o.get("name"), o.get("arguments", o.get("parameters"))))
        except json.JSONDecodeError:
            pass
    if calls:
        return text[: text.find("<tool_call>")], calls
    dec, i, rest = json.JSONDecoder(), 0, text
    while True:
        rest = text[i:].lstrip()
        if not rest.startswith("{"):
            break
        try:
            o, n = dec.raw_decode(rest)
        except json.JSONDecodeError:
            break
        if not (isinstance(o, dict) and "name" in o and ("arguments" in o or "parameters" in o)):
            break
        calls.append((o["name"], o.get("arguments", o.get("parameters"))))
        i = len(text) - len(rest) + n
    return (text if not calls else text[i:].strip()), calls


rows, bad = [], 0
for k, r in enumerate(rounds):
    msgs = [normalized(m) for m in r["messages"]]
    enc = tok.apply_chat_template(msgs, tools=r.get("tools"), add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = enc["input_ids"].cuda()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=120, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    hf_content, hf_calls = calls_of(text)
    kern_calls = [(c["name"], json.loads(c["arguments"]) if c.get("arguments") else {}) for c in r.get("calls") or []]
    kern_content = r.get("text") or ""
    # kern's answers are cut at 120 tokens too; compare the calls, and the text where there are none.
    same = (hf_calls == kern_calls) if (hf_calls or kern_calls) else (hf_content.strip() == kern_content.strip())
    bad += not same
    print(f"round {k + 1}: tools {'offered' if r.get('tools') else 'not offered'}")
    print(f"  kern: {len(kern_calls)} call(s), text {kern_content[:200]!r}")
    print(f"  hf  : {len(hf_calls)} call(s), text {text[:200]!r}")
    rows.append((f"round {k + 1} ({len(hf_calls)} call(s) from transformers)", "same as kern" if same else "DIFFERS"))
print("\n== the tool loop's rounds replayed in transformers (bf16, greedy)")
for name, v in rows:
    print(f"{name:<60} {v}")
sys.exit(1 if bad else 0)
