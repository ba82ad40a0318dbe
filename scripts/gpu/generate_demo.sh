#!/usr/bin/env bash
# kern generate end to end on the GPU machine, for README's example and a first speed reading:
# random Qwen3 weights (real shapes) + the real Qwen3 tokenizer, one text prompt streamed, then
# batch-1 decode of a 0.6B and a 4B shape. Expects .carry/kern, build/packs and the
# tokenizer files in .carry/tok (scripts/fetch-test-data.sh fetches them).
set -uo pipefail
K=${KERN:-.carry/kern}
W=${KERN_DEMO_DIR:-/tmp/kern-demo}
for preset in qwen3-0.6b qwen3-4b; do
  d=$W/$preset
  $K random-weights --preset $preset -o $d >/dev/null 2>&1 || { echo "random-weights $preset failed"; exit 1; }
  cp .carry/tok/tokenizer.json .carry/tok/tokenizer_config.json $d/
  $K pack --config $d/config.json -o $d --kernels build/packs --max-tokens 512 --max-seqs 64 --max-context 4096 >/dev/null || exit 1
done
echo "== one text prompt, streamed (random weights: the text is noise, the path is real)"
$K generate --model $W/qwen3-0.6b --prompt "The capital of France is" --max-tokens 24 --temperature 0.7 --top-p 0.9 --seed 1
echo "== batch 1, 256-token prompt, 256 new tokens, greedy"
ids=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(151643)) for _ in range(256)))")
for preset in qwen3-0.6b qwen3-4b; do
  echo "-- $preset"
  $K generate --model $W/$preset --prompt-ids $ids --max-tokens 256 --ignore-eos 2>&1 >/dev/null | tail -1
done
echo "== batch 4 prompts of different lengths, text"
$K generate --model $W/qwen3-0.6b --prompt "Hello" --prompt "Write a haiku about GPUs." --prompt "1, 2, 3," --prompt "日本の首都は" --max-tokens 16 --chat
