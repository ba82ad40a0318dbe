#!/usr/bin/env bash
# Issue 17 on TWO GPUs of one host (nvidia-h200-x2): tensor parallelism at TP=2.
#   (a) the collectives model (tests/manifests/parallel at tp 2): each rank adds its slice of
#       w, the all-reduce sums the ranks, the all-gather lays them end to end, eager and graph
#       ->  C = 2A + w[0:4] + w[4:8], G = [C, C]
#   (b) $PRESET (default qwen3-8b, random weights, the same checkpoint for both): a prefill of
#       64 tokens at TP=2 against TP=1: logits within the bound, top-1 equal (or a near-tie);
#       the two ranks' logits and sampled ids bit-identical (replicated sampling)
#   (c) batch-1 decode step time (context 300, CUDA graph replayed, median of 100) at TP=1 and
#       TP=2, against the floor of one rank's weights at 4.8 TB/s (issue target: <= 2.8 ms)
#   (d) all-reduce time per layer: TP=2 decode step minus the same manifest without its
#       all-reduce calls (results then wrong; timing only), over the layers
#   (e) greedy decoding through the serving engine (`kern generate --devices 0,1`, the engine
#       on kern_runtime::ParallelRuntime): four prompts, 64 tokens, at TP=2 and TP=1 on the same
#       weights: tokens equal, or at the first split both tokens within the logits' difference
#       there (a near-tie) — tp_check.py greedy
#   (f) the random-weight parity rule at TP=2 (scripts/gpu/parity.py on $PRESET with
#       --pack-arg=--tp --pack-arg=2 --kern-arg=--devices --kern-arg=0,1): kern's logits within
#       1.5 x bf16's error against fp32 + 0.01 at every step, greedy vs transformers' own
# The last lines are a PASS/FAIL table; exit 1 if any case fails.
#
# Needs: 2 GPUs, .carry/kern, .carry/fixtures, build/packs, python3 with numpy,
# libnccl.so.2 (tp_env.sh), ~40 GB of disk for the 8B random weights.
#   KERN=.carry/kern KERNELS=build/packs FIXTURES=.carry/fixtures WORK=/tmp/kern-tp PRESET=qwen3-8b BOUND=0.5
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
FX=${FIXTURES:-.carry/fixtures}
W=${WORK:-/tmp/kern-tp}
PRESET=${PRESET:-qwen3-8b}
BOUND=${BOUND:-0.5}
PY="python3 scripts/gpu/tp_check.py"
source scripts/gpu/tp_env.sh
declare -a RESULTS
result() { RESULTS+=("RESULT  $1  $2  ($3)"); echo "-> $1: $2 ($3)"; }
fail_setup() { echo "tp.sh: SETUP FAILED: $*"; echo; echo "RESULT  setup  FAIL  ($*)"; exit 1; }

[[ -x $K ]] || fail_setup "$K is not an executable: run scripts/gpu/prepare-carry.sh where cargo is, carry .carry/"
[[ -f $FX/vecadd.sm_90.cubin ]] || fail_setup "$FX/vecadd.sm_90.cubin missing"
python3 -c "import numpy" || fail_setup "python3 has no numpy"
find_nccl || fail_setup "no libnccl.so.2"
n=$(nvidia-smi -L 2>/dev/null | wc -l); [[ $n -ge 2 ]] || fail_setup "$n GPU(s): TP=2 needs two (use tp1.sh on one)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
rm -rf "$W" && mkdir -p "$W"

echo "== (a) collectives over two ranks"
$PY tiny "$W/tiny" "$FX" 2 || fail_setup "tp_check.py tiny"
for mode in eager graph; do
  flag=""; [[ $mode == graph ]] && flag="--graph --iters 3"
  if "$K" run "$W/tiny/model.json" --devices 0,1 --weights "$W/tiny" --input A=range --output C --output G --out-dir "$W/tiny" $flag 2>&1 | tee "$W/tiny-$mode.log" \
     && $PY tiny-check "$W/tiny" 2; then
    result "a.collectives.$mode" PASS "$(grep -o 'NCCL [0-9.]*' "$W/tiny-$mode.log" | head -1)"
  else
    result "a.collectives.$mode" FAIL "see $W/tiny-$mode.log"
  fi
done

echo "== (b) $PRESET: TP=2 vs TP=1 on the same weights"
M=$W/model
"$K" random-weights --preset "$PRESET" -o "$M" >"$W/setup.log" 2>&1 || fail_setup "random-weights (see $W/setup.log)"
"$K" pack --config "$M/config.json" -o "$W/tp1" --kernels "$KD" >>"$W/setup.log" 2>&1 || fail_setup "pack"
"$K" pack --config "$M/config.json" -o "$W/tp2" --kernels "$KD" --tp 2 >>"$W/setup.log" 2>&1 || fail_setup "pack --tp 2"
pre=$($PY inputs "$W/tp1/model.json" "$W/in-prefill" --tokens 64) || fail_setup "inputs"
dec=$($PY inputs "$W/tp1/model.json" "$W/in-decode" --decode-at 300) || fail_setup "inputs"
mkdir -p "$W/out-tp1" "$W/out-tp2"
"$K" run "$W/tp1/model.json" --weights "$M" --set tokens=64 --set seqs=1 $pre --output logits --output sampled --out-dir "$W/out-tp1" 2>&1 | tail -3
"$K" run "$W/tp2/model.json" --devices 0,1 --weights "$M" --set tokens=64 --set seqs=1 $pre --output logits --output sampled --out-dir "$W/out-tp2" 2>&1 | tee "$W/prefill-tp2.log" | tail -5
if out=$($PY compare "$W/out-tp1/logits.npy" "$W/out-tp2/logits.npy" --bound "$BOUND"); then
  result "b.prefill.logits" PASS "$out; bound $BOUND"
else
  result "b.prefill.logits" FAIL "$out; bound $BOUND"
fi
[[ $(grep -c "bit-identical" "$W/prefill-tp2.log") -ge 2 ]] \
  && result "b.replicated_outputs" PASS "logits and sampled equal on both ranks" \
  || result "b.replicated_outputs" FAIL "see $W/prefill-tp2.log"

echo "== (c) batch-1 decode step, graph replay"
"$K" run "$W/tp1/model.json" --weights "$M" --set tokens=1 --set seqs=1 $dec --output sampled --out-dir "$W/out-tp1" --graph --iters 100 2>&1 | tee "$W/decode-tp1.log" | tail -2
"$K" run "$W/tp2/model.json" --devices 0,1 --weights "$M" --set tokens=1 --set seqs=1 $dec --output sampled --out-dir "$W/out-tp2" --graph --iters 100 2>&1 | tee "$W/decode-tp2.log" | tail -3
t1=$(grep -o 'GPU time [0-9.]*' "$W/decode-tp1.log" | grep -o '[0-9.]*$' | head -1)
t2=$(grep -o 'GPU time [0-9.]*' "$W/decode-tp2.log" | grep -o '[0-9.]*$' | head -1)
fl=$($PY floor "$W/tp2/model.json")
ok=$(python3 -c "print('PASS' if '$t2' and float('$t2') <= 2.8 else 'FAIL')" 2>/dev/null || echo FAIL)
result "c.decode_step" "$ok" "TP=1 ${t1:-?} ms, TP=2 ${t2:-?} ms (slowest rank); TP=2 $fl; target <= 2.8 ms"

echo "== (d) all-reduce time per layer"
python3 - "$W/tp2/model.json" "$W/tp2/model.noar.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["program"]["calls"] = [c for c in m["program"]["calls"] if c["op"] != "all_reduce"]
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
"$K" run "$W/tp2/model.noar.json" --devices 0,1 --weights "$M" --set tokens=1 --set seqs=1 $dec --output sampled --out-dir "$W/out-tp2" --graph --iters 100 2>&1 | tee "$W/decode-noar.log" | tail -2
t3=$(grep -o 'GPU time [0-9.]*' "$W/decode-noar.log" | grep -o '[0-9.]*$' | head -1)
layers=$(python3 -c "import json; print(json.load(open('$M/config.json'))['num_hidden_layers'])")
per=$(python3 -c "print(f'{(float(\"$t2\") - float(\"$t3\")) / $layers * 1000:.1f} us per layer (2 all-reduces of [1, hidden] bf16)')" 2>/dev/null || echo "?")
result "d.all_reduce" INFO "TP=2 step ${t2:-?} ms, without all-reduces ${t3:-?} ms: $per"

echo "== (e) greedy 64 steps through the engine, TP=2 vs TP=1"
ids=$(python3 -c "
import numpy as np
r = np.random.default_rng(7)
print(' '.join('--prompt-ids ' + ','.join(str(int(x)) for x in r.integers(0, 151643, size=n)) for n in (5, 37, 120, 251)))")
for t in 1 2; do
  dev=""; [[ $t == 2 ]] && dev="--devices 0,1"
  "$K" pack --config "$M/config.json" -o "$W/g$t" --kernels "$KD" --max-tokens 256 --max-seqs 8 --max-context 1024 $([[ $t == 2 ]] && echo --tp 2) >>"$W/setup.log" 2>&1 || fail_setup "pack g$t"
  ln -sf "$M"/*.safetensors* "$W/g$t/" 2>/dev/null
  "$K" generate --model "$W/g$t" $ids --max-tokens 64 --temperature 0 --ignore-eos --dump "$W/dump-tp$t" $dev 2>&1 | tee "$W/generate-tp$t.log" | tail -3
done
if out=$($PY greedy "$W/dump-tp1" "$W/dump-tp2"); then
  result "e.greedy_64" PASS "$out"
else
  result "e.greedy_64" FAIL "$out"
fi

echo "== (f) parity rule at TP=2 (parity.py)"
if python3 scripts/gpu/parity.py --kern "$K" --kernels "$KD" --shapes "$PRESET" --steps 64 --work "$W/parity" \
     --pack-arg=--tp --pack-arg=2 --kern-arg=--devices --kern-arg=0,1 2>&1 | tee "$W/parity.log" | tail -8; then
  result "f.parity_tp2" PASS "$(grep -m1 "$PRESET" "$W/parity.log" | tail -1 | cut -c1-160)"
else
  result "f.parity_tp2" FAIL "see $W/parity.log"
fi
echo
printf '%s\n' "${RESULTS[@]}"
printf '%s\n' "${RESULTS[@]}" | grep -q " FAIL " && exit 1 || exit 0
