#!/usr/bin/env bash
# Speculative decoding with n-gram drafts on the real model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M,
# from its GGUF: /tmp/qwen2.5-coder-0.5b-q4km.gguf, reassembled from /tmp/stage/part.* if needed):
# code-editing chat prompts whose answer repeats the code in the prompt, greedy, batch 1 and 4,
# `kern generate` plain and with each drafter (ngram: --spec-ngram 5; self: a `--draft self`
# pack; skip: a `--draft layer-skip:16` pack, the first 16 of 24 layers on draft_kv — a real,
# imperfect draft; the seed's kv + draft_kv layout on a real model); identical tokens,
# acceptance and speed-up. RESULT lines last.
set -uo pipefail
K=${KERN:-.carry/kern}
G=${KERN_GGUF:-/tmp/qwen2.5-coder-0.5b-q4km.gguf}
W=/tmp/kern-spec-real
mkdir -p $W
[[ -f $G ]] || cat /tmp/stage/part.* > $G
rm -f $W/results.txt
PACK=(--kernels build/packs --max-tokens 512 --max-seqs 32 --max-context 2048)
$K pack --gguf $G -o $W/model "${PACK[@]}" >/dev/null || { echo "pack failed"; exit 1; }
$K pack --gguf $G -o $W/model-self "${PACK[@]}" --draft self --draft-k 4 >/dev/null || { echo "pack --draft self failed"; exit 1; }
$K pack --gguf $G -o $W/model-skip "${PACK[@]}" --draft layer-skip:16 --draft-k 4 >/dev/null || { echo "pack --draft layer-skip failed"; exit 1; }
code1='def total(items):\n    result = 0\n    for item in items:\n        if item.price > 0:\n            result += item.price * item.quantity\n    return result\n\ndef average(items):\n    if not items:\n        return 0\n    return total(items) / len(items)\n'
code2='class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n\n    def is_empty(self):\n        return len(self.items) == 0\n'
code3='fn parse(line: &str) -> Vec<u32> {\n    line.split(\x27,\x27)\n        .map(|s| s.trim().parse().unwrap())\n        .collect()\n}\n\nfn main() {\n    let v = parse("1, 2, 3");\n    println!("{:?}", v);\n}\n'
code4='function add(a, b) {\n  return a + b;\n}\n\nfunction mul(a, b) {\n  return a * b;\n}\n\nmodule.exports = { add, mul };\n'
p1=$(printf "Rename the function total to compute_total everywhere in this code and print the whole updated code:\n\n$code1")
p2=$(printf "Add a method peek that returns the top item without removing it, and print the whole updated class:\n\n$code2")
p3=$(printf "Replace unwrap() with expect(\"bad number\") and print the whole updated program:\n\n$code3")
p4=$(printf "Add a function sub(a, b) and export it too; print the whole updated file:\n\n$code4")
fails=0
for batch in 1 4; do
  args=(--prompt "$p1")
  [[ $batch == 4 ]] && args+=(--prompt "$p2" --prompt "$p3" --prompt "$p4")
  for mode in plain ngram self skip; do
    model=$W/model; extra=()
    case $mode in
      ngram) extra=(--spec-ngram 5) ;;
      self) model=$W/model-self; extra=(--spec-draft) ;;
      skip) model=$W/model-skip; extra=(--spec-draft) ;;
    esac
    $K generate --model $model --chat "${args[@]}" --max-tokens 256 --dump $W/$mode-$batch "${extra[@]}" > $W/$mode-$batch.out 2>$W/$mode-$batch.log || { tail -5 $W/$mode-$batch.log; fails=1; continue; }
    grep -E "decode|speculative" $W/$mode-$batch.log | sed "s/^/[$mode batch $batch] /"
  done
  for mode in ngram self skip; do
    python3 scripts/gpu/spec_compare.py $W $batch "real model" $mode >> $W/results.txt || fails=1
  done
done
echo "== batch 1 answer (layer-skip draft):"; head -c 700 $W/skip-1.out
echo; cat $W/results.txt
exit $fails
