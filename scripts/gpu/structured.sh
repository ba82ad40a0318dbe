#!/usr/bin/env bash
# Structured output, tool calling and their cost on the GPU (issue 27): `kern serve` on the default
# model (Qwen2.5-Coder-0.5B-Instruct, packed from its GGUF by scripts/gpu/real_model.sh into
# /tmp/kern-real/model, or any packed model directory as $1), driven by the official openai client
# (scripts/gpu/structured.py): a tool-using conversation end to end (call → tool result → final
# answer), JSON-schema outputs on real prompts validated through parse() with Pydantic models, and
# the cost — decode tok/s at batch 1 and 64 with every request constrained vs none, time to first
# token with a new schema vs a cached one, the token-mask time. The server log says whether masks
# are applied by the model's sampler (a manifest with the step ABI's token_mask) or on the host
# from the logits (one without). Prints a table last.
#
#   here:  bash scripts/gpu/prepare-carry.sh
#          (wheels of openai==1.109.1, pydantic==2.12.5 and their dependencies in .whl/openai/,
#           as for scripts/gpu/serve.sh)
#   there: bash scripts/gpu/real_model.sh && bash scripts/gpu/structured.sh   (carry .carry .whl build/packs)
set -uo pipefail
K=${KERN:-.carry/kern}
M=${1:-/tmp/kern-real/model}
OUTD=${OUT:-/tmp/kern-out}
PORT=${PORT:-8300}
mkdir -p "$OUTD"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/openai/*.whl $(ls .whl/families/gguf-*.whl 2>/dev/null) && export PYTHONPATH=/tmp/site
[[ -f "$M/model.json" ]] || { echo "structured: no packed model at $M (run scripts/gpu/real_model.sh, or give a model directory)"; exit 1; }
# 64 sequences at once for the batch-64 rate; the grammar limit as served.
$K serve --model "$M" --port $PORT --served-model-name default --max-seqs 64 > "$OUTD/structured-serve.log" 2>&1 &
pid=$!
ready=""
for _ in $(seq 1 1200); do
  if curl -sf localhost:$PORT/health >/dev/null 2>&1; then ready=1; break; fi
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
cat "$OUTD/structured-serve.log"
if [[ -z "$ready" ]]; then echo "structured: kern serve did not become ready"; kill $pid 2>/dev/null; exit 1; fi
python3 scripts/gpu/structured.py http://127.0.0.1:$PORT "$OUTD/structured.json"
rc=$?
# REF_GGUF=the model's GGUF (with the gguf wheel importable): the tool loop replayed in
# transformers, and the first token of the tool conversation both ways.
if [[ -n "${REF_GGUF:-}" ]]; then
  python3 scripts/gpu/tool_first_token.py http://127.0.0.1:$PORT "$REF_GGUF" 2>&1 | grep -v -i warn
  python3 scripts/gpu/tool_answer_ref.py "$OUTD/structured.json" "$REF_GGUF" 2>&1 | grep -v -i warn
fi
curl -s localhost:$PORT/metrics | grep -E "^kern:token_mask" > "$OUTD/structured-metrics.txt"
kill -TERM $pid; wait $pid
echo "structured: rc=$rc (results in $OUTD/structured.json, server log $OUTD/structured-serve.log)"
exit $rc
