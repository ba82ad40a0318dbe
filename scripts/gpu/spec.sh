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
declare -a rows
row() { rows+=("$(printf '%-40s %s' "$1" "$2")"); }
fails=0
for batch in 1 8; do
  args=()
  for i in $(seq 0 $((batch - 1))); do args+=(--prompt-ids "$(cat $W/p$i.txt)"); done
  for mode in plain spec; do
    extra=(); [[ $mode == spec ]] && extra=(--spec-ngram 4)
    $K generate --model $d "${args[@]}" --max-tokens 128 --ignore-eos --dump $W/$mode-$batch "${extra[@]}" >/dev/null 2>$W/$mode-$batch.log || { cat $W/$mode-$batch.log; fails=1; continue; }
    grep -E "decode|speculative" $W/$mode-$batch.log | sed "s/^/[$mode batch $batch] /"
  done
  python3 - $W $batch <<'PY' || fails=1
import json, re, sys
w, b = sys.argv[1], sys.argv[2]
a = json.load(open(f"{w}/plain-{b}/tokens.json"))["outputs"]
s = json.load(open(f"{w}/spec-{b}/tokens.json"))["outputs"]
same = sum(x == y for x, y in zip(a, s))
firsts = [next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, s)]
rate = lambda f: float(re.search(r"decode \d+ tokens in \d+ steps, ([\d.]+) tok/s", open(f).read()).group(1))
acc = re.search(r"(\d+) of (\d+) draft tokens accepted \(([\d.]+)%\)", open(f"{w}/spec-{b}.log").read())
r0, r1 = rate(f"{w}/plain-{b}.log"), rate(f"{w}/spec-{b}.log")
print(f"RESULT batch {b}: identical {same}/{len(a)} (first differences at {[f for f in firsts if f is not None]}), "
      f"decode {r0:.1f} → {r1:.1f} tok/s ({r1 / r0:.2f}×), accepted {acc.group(1)}/{acc.group(2)} ({acc.group(3)}%)")
sys.exit(0 if same == len(a) else 1)
PY
done
exit $fails
