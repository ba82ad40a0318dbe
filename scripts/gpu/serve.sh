#!/usr/bin/env bash
# `kern serve` on the GPU machine (issue: kern serve). For random-weight Qwen3-0.6B and -4B
# shapes with the real tokenizer: pack; greedy reference with `kern generate --dump`; start the
# server and time startup to ready (weights in the page cache); drive it with the official
# openai client and a 256-client streaming load (scripts/gpu/serve_check.py); SIGTERM drains it
# (exit 0). Prints a table last.
#
#   here:  bash scripts/gpu/prepare-carry.sh; bash scripts/fetch-test-data.sh
#          mkdir -p .carry/tok && cp build/test-data/qwen3-tokenizer/* .carry/tok/
#          (wheels of openai and its deps in .whl/, see docs/gpu-results.md)
#   there: bash scripts/gpu/serve.sh          (carry .carry .whl build/packs)
# PRESETS (default "qwen3-0.6b qwen3-4b"): random-weight presets, or gguf:PATH for a real model
# packed from its GGUF (e.g. PRESETS=gguf:/tmp/kern-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
# PACK_ARGS="--dequantize --batch-invariant" SERVE_ARGS=--batch-invariant, after
# `stage.sh assemble smol`). PACK_ARGS / SERVE_ARGS: extra `kern pack` / `kern serve` arguments — issue 29's concurrency
# check of the batch-invariant mode is PACK_ARGS=--batch-invariant SERVE_ARGS=--batch-invariant
# (docs/batch-invariance.md): the 256-stream outputs must then equal the alone references.
set -uo pipefail
K=${KERN:-.carry/kern}
W=${KERN_SERVE_DIR:-/tmp/kern-serve}
OUTD=${OUT:-/tmp/kern-out}
mkdir -p "$OUTD" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/openai/*.whl && export PYTHONPATH=/tmp/site
declare -a rows
row() { rows+=("$(printf '%-34s %s' "$1" "$2")"); }
port=8123
for preset in ${PRESETS:-qwen3-0.6b qwen3-4b}; do
  if [[ $preset == gguf:* ]]; then
    # A real model: packed from its GGUF (tokenizer and template from the file).
    g=${preset#gguf:}; preset=$(basename "$g" .gguf); d=$W/$preset; tokdir=$d
    $K pack --gguf "$g" -o $d --kernels build/packs --max-tokens 2048 --max-seqs 256 --max-context 4096 ${PACK_ARGS:-} >/dev/null || { row "$preset pack" FAIL; continue; }
  else
    d=$W/$preset; tokdir=.carry/tok
    $K random-weights --preset $preset -o $d >/dev/null 2>&1 || { row "$preset random-weights" FAIL; continue; }
    cp .carry/tok/tokenizer.json .carry/tok/tokenizer_config.json $d/
    $K pack --config $d/config.json -o $d --kernels build/packs --max-tokens 2048 --max-seqs 256 --max-context 4096 ${PACK_ARGS:-} >/dev/null || { row "$preset pack" FAIL; continue; }
  fi
  # Random prompt ids below the tokenizer's base vocabulary (no added special tokens).
  export PROMPT_ID_MAX=$(python3 -c "from tokenizers import Tokenizer; print(Tokenizer.from_file('$tokdir/tokenizer.json').get_vocab_size(with_added_tokens=False))")
  # Greedy reference: 6 prompts, each alone through kern generate (batch 1, as the server
  # runs them one after another: a different batch composition changes bf16 rounding).
  ok=1
  for i in 0 1 2 3 4 5; do
    ids=$(python3 -c "import random; r=random.Random($i); print(','.join(str(r.randrange($PROMPT_ID_MAX)) for _ in range(r.randint(8, 300))))")
    $K generate --model $d --prompt-ids "$ids" --max-tokens 48 --ignore-eos --dump $W/$preset-gen-$i >/dev/null 2>$W/$preset-gen.log || { cat $W/$preset-gen.log; ok=0; }
  done
  [[ $ok == 1 ]] || { row "$preset generate" FAIL; continue; }
  tail -1 $W/$preset-gen.log
  python3 - $W/$preset <<'PY'
import json, sys
w = sys.argv[1]
parts = [json.load(open(f"{w}-gen-{i}/tokens.json")) for i in range(6)]
json.dump({"prompts": [p["prompts"][0] for p in parts], "outputs": [p["outputs"][0] for p in parts]}, open(f"{w}-gen.json", "w"))
PY
  # Start the server; time to ready.
  t0=$(date +%s.%N)
  $K serve --model $d --port $port --served-model-name $preset ${SERVE_ARGS:-} > $W/$preset-serve.log 2>&1 &
  pid=$!
  ready=""
  for _ in $(seq 1 1200); do
    if curl -sf localhost:$port/health >/dev/null 2>&1; then ready=$(python3 -c "import time; print(f'{time.time()-$t0:.2f}')"); break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  cat $W/$preset-serve.log
  if [[ -z "$ready" ]]; then row "$preset serve ready" FAIL; kill $pid 2>/dev/null; continue; fi
  row "$preset startup to ready" "${ready} s"
  KERN_BATCH_INVARIANT=$([[ " ${SERVE_ARGS:-} " == *" --batch-invariant "* ]] && echo 1 || echo 0) \
    python3 scripts/gpu/serve_check.py http://127.0.0.1:$port $preset $W/$preset-gen.json $tokdir $OUTD/serve-$preset.json
  rc=$?
  row "$preset serve_check" "$([[ $rc == 0 ]] && echo PASS || echo FAIL)"
  python3 - "$OUTD/serve-$preset.json" <<'PY' && true
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['model']}: {r['requests']} streams in {r['wall_s']} s: {r['req_per_s']} req/s, {r['output_tok_per_s']} out tok/s, TTFT p50 {r['ttft_p50_ms']} ms p99 {r['ttft_p99_ms']} ms, ITL p50 {r['itl_p50_ms']} ms p99 {r['itl_p99_ms']} ms, preemptions {r['preemptions']}")
PY
  kill -TERM $pid; wait $pid; src=$?
  row "$preset SIGTERM drain exit code" "$src"
  tail -2 $W/$preset-serve.log
  port=$((port + 1))
done
echo
echo "== results"
for f in $OUTD/serve-*.json; do [[ -f $f ]] && python3 -c "
import json,sys; r=json.load(open('$f'))
print(f\"{r['model']:<12} greedy==generate {r['greedy_identical']}  alone==under-load {r.get('alone_vs_load')}  {r['req_per_s']} req/s  {r['output_tok_per_s']} tok/s  TTFT p50/p99 {r['ttft_p50_ms']}/{r['ttft_p99_ms']} ms  ITL p50/p99 {r['itl_p50_ms']}/{r['itl_p99_ms']} ms\")"; done
printf '%s\n' "${rows[@]}"
