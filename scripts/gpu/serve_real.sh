#!/usr/bin/env bash
# `kern serve` on the real model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, packed from its GGUF by
# scripts/gpu/real_model.sh into /tmp/kern-real/model): the official openai client asks the
# ChatML question and a code question, streamed and not, and prints the answers.
set -uo pipefail
K=${KERN:-.carry/kern}
M=${1:-/tmp/kern-real/model}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/openai/*.whl && export PYTHONPATH=/tmp/site
$K serve --model $M --port 8200 --served-model-name qwen2.5-coder-0.5b > /tmp/serve-real.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do curl -sf localhost:8200/health >/dev/null && break; sleep 0.05; done
cat /tmp/serve-real.log
python3 - <<'PY'
import openai
c = openai.OpenAI(base_url="http://127.0.0.1:8200/v1", api_key="x")
r = c.chat.completions.create(model="qwen2.5-coder-0.5b", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=32, temperature=0)
print("chat:", repr(r.choices[0].message.content), r.choices[0].finish_reason, r.usage)
assert "Paris" in r.choices[0].message.content
print("stream: ", end="")
for ch in c.chat.completions.create(model="qwen2.5-coder-0.5b", messages=[{"role": "system", "content": "You are a helpful coding assistant."}, {"role": "user", "content": "Write a Python function that reverses a string."}], max_tokens=96, temperature=0, stream=True):
    print(ch.choices[0].delta.content or "", end="", flush=True)
print()
r = c.completions.create(model="qwen2.5-coder-0.5b", prompt="def fibonacci(n):", max_tokens=48, temperature=0, stop=["\n\n\n"])
print("completion:", repr(r.choices[0].text), r.choices[0].finish_reason)
PY
rc=$?
kill -TERM $pid; wait $pid
echo "serve_real: rc=$rc"
exit $rc
