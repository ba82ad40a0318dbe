#!/usr/bin/env bash
# Issue 17 on ONE GPU: NCCL collectives with a world of one, and CUDA graphs that capture them.
#   (a) the collectives model (tests/manifests/parallel at tp 1): an all-reduce and an
#       all-gather through NCCL, eager and --graph  ->  C = A + w[0:4], G = C
#   (b) Qwen3 shapes ($PRESET, random weights): `kern pack --tp 1` (an all-reduce after every O
#       and down projection, over a world of one) against the single-GPU manifest on the same
#       weights and step: logits bit-identical, eager (a prefill of 64 tokens) and graph (a
#       decode step at context 300; the graph holds the NCCL calls)
#   (c) the decode step's time, graph-replayed, with and without the world-of-one all-reduces
# The last lines are a PASS/FAIL table; exit 1 if any case fails.
#
# Needs: .carry/kern (scripts/gpu/prepare-carry.sh), .carry/fixtures (vecadd.sm_90.cubin),
# build/packs (bash packs/kernels/build.sh), python3 with numpy, libnccl.so.2 (tp_env.sh).
#   KERN=.carry/kern KERNELS=build/packs FIXTURES=.carry/fixtures WORK=/tmp/kern-tp1 PRESET=qwen3-0.6b
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
FX=${FIXTURES:-.carry/fixtures}
W=${WORK:-/tmp/kern-tp1}
PRESET=${PRESET:-qwen3-0.6b}
PY="python3 scripts/gpu/tp_check.py"
source scripts/gpu/tp_env.sh
declare -a RESULTS
result() { RESULTS+=("RESULT  $1  $2  ($3)"); echo "-> $1: $2 ($3)"; }
fail_setup() { echo "tp1.sh: SETUP FAILED: $*"; echo; echo "RESULT  setup  FAIL  ($*)"; exit 1; }

[[ -x $K ]] || fail_setup "$K is not an executable: run scripts/gpu/prepare-carry.sh where cargo is, carry .carry/"
[[ -f $FX/vecadd.sm_90.cubin ]] || fail_setup "$FX/vecadd.sm_90.cubin missing"
python3 -c "import numpy" || fail_setup "python3 has no numpy"
find_nccl || fail_setup "no libnccl.so.2"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
rm -rf "$W" && mkdir -p "$W"

echo "== (a) collectives over a world of one"
$PY tiny "$W/tiny" "$FX" 1 || fail_setup "tp_check.py tiny"
for mode in eager graph; do
  flag=""; [[ $mode == graph ]] && flag="--graph --iters 3"
  if "$K" run "$W/tiny/model.json" --weights "$W/tiny" --input A=range --output C --output G --out-dir "$W/tiny" $flag 2>&1 | tee "$W/tiny-$mode.log" \
     && $PY tiny-check "$W/tiny" 1; then
    result "a.collectives.$mode" PASS "$(grep -o 'NCCL [0-9.]*' "$W/tiny-$mode.log" | head -1)"
  else
    result "a.collectives.$mode" FAIL "see $W/tiny-$mode.log"
  fi
done

echo "== (b) $PRESET: --tp 1 (all-reduces over one rank) vs the single-GPU manifest"
M=$W/model
"$K" random-weights --preset "$PRESET" -o "$M" >"$W/setup.log" 2>&1 || fail_setup "random-weights (see $W/setup.log)"
"$K" pack --config "$M/config.json" -o "$W/single" --kernels "$KD" >>"$W/setup.log" 2>&1 || fail_setup "pack"
"$K" pack --config "$M/config.json" -o "$W/tp1" --kernels "$KD" --tp 1 >>"$W/setup.log" 2>&1 || fail_setup "pack --tp 1"
pre=$($PY inputs "$W/single/model.json" "$W/in-prefill" --tokens 64) || fail_setup "inputs"
dec=$($PY inputs "$W/single/model.json" "$W/in-decode" --decode-at 300) || fail_setup "inputs"
for v in single tp1; do
  mkdir -p "$W/out-$v-prefill" "$W/out-$v-decode"
  "$K" run "$W/$v/model.json" --weights "$M" --set tokens=64 --set seqs=1 $pre --output logits --output sampled --out-dir "$W/out-$v-prefill" 2>&1 | tail -4
  "$K" run "$W/$v/model.json" --weights "$M" --set tokens=1 --set seqs=1 $dec --output logits --output sampled --out-dir "$W/out-$v-decode" --graph --iters 50 2>&1 | tee "$W/decode-$v.log" | tail -4
done
for step in prefill decode; do
  if $PY compare "$W/out-single-$step/logits.npy" "$W/out-tp1-$step/logits.npy" --exact; then
    result "b.$step.logits" PASS "bit-identical"
  else
    result "b.$step.logits" FAIL "differ"
  fi
done
grep -q "bit-identical" "$W/decode-tp1.log" && grep -q "graph mode" "$W/decode-tp1.log" \
  && result "b.graph_capture" PASS "decode graph with $(( $(python3 -c "import json; print(json.load(open('$W/tp1/model.json'))['program']['calls'].__len__())") )) calls incl. all-reduces replayed" \
  || result "b.graph_capture" FAIL "see $W/decode-tp1.log"

echo "== (c) decode step time, graph replay (median of 50)"
t1=$(grep -o 'GPU time [0-9.]* ms' "$W/decode-single.log" | head -1)
t2=$(grep -o 'GPU time [0-9.]* ms' "$W/decode-tp1.log" | head -1)
result "c.decode_time" INFO "single-GPU manifest: $t1; with world-of-one all-reduces: $t2"

echo
printf '%s\n' "${RESULTS[@]}"
printf '%s\n' "${RESULTS[@]}" | grep -q " FAIL " && exit 1 || exit 0
