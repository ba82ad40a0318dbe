#!/usr/bin/env bash
# Speculative decoding with n-gram (prompt-lookup) drafts on the GPU machine: random-weight
# Qwen3-4B, greedy, `kern generate` with and without --spec-ngram 4, batch 1 and batch 8.
# Checks that the tokens are identical and reports acceptance and decode speed. Carry .carry
# (kern) and build/packs. Prints a table last.
set -uo pipefail
K=${KERN:-.carry/kern}
W=${KERN_SPEC_DIR:-/tmp/kern-spec}
mkdir -p $W
d=$W/qwen3-4b
if [[ ! -f $d/model.json ]]; then
  $K random-weights --preset qwen3-4b -o $d >/dev/null 2>&1 || { echo "random-weights failed"; exit 1; }
  $K pack --config $d/config.json -o $d --kernels build/packs/qwen3 --max-tokens 512 --max-seqs 64 --max-context 4096 >/dev/null || exit 1
fi
# Prompts whose text repeats (a block of code-like ids written twice, then its start again):
# the shape of an edit request that quotes the code to change.
python3 - $W <<'PY'
import random, sys
w = sys.argv[1]
for i in range(8):
    r = random.Random(i)
    block = [r.randrange(151643) for _ in range(120)]
    open(f"{w}/p{i}.txt", "w").write(",".join(map(str, block + block[:60] + block + block[:20])))
PY
fails=0
for batch in 1 8; do
  args=()
  for i in $(seq 0 $((batch - 1))); do args+=(--prompt-ids "$(cat $W/p$i.txt)"); done
  for mode in plain spec; do
    extra=(); [[ $mode == spec ]] && extra=(--spec-ngram 4)
    $K generate --model $d "${args[@]}" --max-tokens 128 --ignore-eos --dump $W/$mode-$batch "${extra[@]}" >/dev/null 2>$W/$mode-$batch.log || { cat $W/$mode-$batch.log; fails=1; continue; }
    grep -E "decode|speculative" $W/$mode-$batch.log | sed "s/^/[$mode batch $batch] /"
  done
  python3 scripts/gpu/spec_compare.py $W $batch "random qwen3-4b" || fails=1
done
exit $fails
