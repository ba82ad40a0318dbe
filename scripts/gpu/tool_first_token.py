"""Why does the model under kern write a bare call object where transformers writes `<tool_call>`?
The first assistant token of the tool conversation of scripts/gpu/structured.py, both ways:
kern's prompt ids (`/tokenize` with the messages and tools) against transformers'
`apply_chat_template`, then kern's top-10 logprobs for the first token (`/v1/completions` on
transformers' ids) against transformers' own (the GGUF loaded in bf16).

    python3 scripts/gpu/tool_first_token.py http://127.0.0.1:8300 /tmp/kern-gguf/qwen2.5-coder-0.5b-q4km.gguf
(scripts/gpu/structured.sh runs it when REF_GGUF is set). Prints a table last.
"""
import json
import os
import sys
import urllib.request

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from tool_conversation import TOOLS, first_turn

base, gguf = sys.argv[1], sys.argv[2]
tools = TOOLS
messages = first_turn()


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


model_id = json.loads(urllib.request.urlopen(base + "/v1/models").read())["data"][0]["id"]
kern_ids = post("/tokenize", {"messages": messages, "tools": tools})["tokens"]
d, f = os.path.split(gguf)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
enc = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True)
hf_ids = list(enc["input_ids"])
rows = []
same = kern_ids == hf_ids
if not same:
    i = next((k for k, (a, b) in enumerate(zip(kern_ids, hf_ids)) if a != b), min(len(kern_ids), len(hf_ids)))
    print(f"prompt ids differ at {i} (kern {len(kern_ids)}, transformers {len(hf_ids)} ids)")
    print("  kern:", repr(tok.decode(kern_ids[max(0, i - 8):i + 8])), kern_ids[max(0, i - 8):i + 8])
    print("  hf  :", repr(tok.decode(hf_ids[max(0, i - 8):i + 8])), hf_ids[max(0, i - 8):i + 8])
rows.append(("prompt ids (kern /tokenize vs apply_chat_template)", f"equal ({len(hf_ids)} ids)" if same else "DIFFER"))

r = post("/v1/completions", {"model": model_id, "prompt": hf_ids, "max_tokens": 1, "temperature": 0, "logprobs": 10})
kern_top = r["choices"][0]["logprobs"]["top_logprobs"][0]
kern_top = sorted(kern_top.items(), key=lambda kv: -kv[1])
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16).cuda().eval()
with torch.no_grad():
    logits = m(torch.tensor([hf_ids]).cuda()).logits[0, -1].float()
lp = torch.log_softmax(logits, -1)
v, ix = lp.topk(10)
hf_top = [(tok.decode([int(t)]), float(x), int(t)) for x, t in zip(v, ix)]
print("first token, top 10:")
for k in range(10):
    a = kern_top[k] if k < len(kern_top) else ("", float("nan"))
    b = hf_top[k]
    print(f"  kern {a[0]!r:>16} {a[1]:8.3f}    hf {b[0]!r:>16} {b[1]:8.3f} (id {b[2]})")
tc = tok.convert_tokens_to_ids("<tool_call>")
rows.append(("transformers' first token", f"{hf_top[0][0]!r} (log p {hf_top[0][1]:.3f}); <tool_call> id {tc} log p {float(lp[tc]):.3f}"))
rows.append(("kern's first token", f"{kern_top[0][0]!r} (log p {kern_top[0][1]:.3f}); <tool_call> in kern's top 10: {'<tool_call>' in dict(kern_top)}"))
print("\n== the tool conversation's first token, kern vs transformers")
for name, val in rows:
    print(f"{name:<52} {val}")
