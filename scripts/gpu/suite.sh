#!/usr/bin/env bash
# kern's GPU suite, run on a machine with an NVIDIA GPU from the repository root, with a release
# build made elsewhere (the GPU machine has no cargo):
#
#   scripts/gpu/prepare-carry.sh          # here: release build + fixtures into .carry/
#   bash scripts/gpu/suite.sh             # there
#
# Runs `kern selftest` (exact results of the examples, parameter packing, graph == eager below a
# bucket, out-of-bounds reporting, launch cost), the examples through `kern run`, and the
# kern-cuda VecAdd example. Prints a short table last.
set -uo pipefail
C=${KERN_CARRY:-.carry}
KERN=$C/kern
OUT=${OUT:-/tmp/kern-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
declare -a rows
row() { rows+=("$(printf '%-44s %s' "$1" "$2")"); }

echo "== kern-cuda example (VecAdd: eager, PDL, 1000-node graph)"
if "$C/vecadd-example" "$C/fixtures/vecadd.sm_90.cubin"; then row "kern-cuda vecadd example" PASS; else row "kern-cuda vecadd example" FAIL; fi

echo "== kern run examples"
check_run() { # name expected-substring command...
  local name=$1 want=$2; shift 2
  local log; log=$("$@" 2>&1); local rc=$?
  echo "$log"
  if [[ $rc -eq 0 && "$log" == *"$want"* ]]; then row "$name" PASS; else row "$name" "FAIL (rc=$rc)"; fi
}
check_run "run examples/vecadd" "[0, 2, 4, 6]" $KERN run examples/vecadd/model.json --input A=range --input B=range --output C=$OUT/C.npy
check_run "run examples/so-extract" "[0, 2, 4, 6]" $KERN run examples/so-extract/model.json --input A=range --input B=range --sync-each
check_run "run examples/triton-add (graph, n=2500)" "[0, 2, 4, 6, 8" $KERN run examples/triton-add/model.json --set n=2500 --input X=range --input Y=range --graph --iters 5
python3 - "$OUT/C.npy" <<'PY' && row "numpy reads kern's .npy" PASS || row "numpy reads kern's .npy" FAIL
import sys, numpy as np
c = np.load(sys.argv[1]); print("C.npy:", c.dtype, c.shape, c); assert (c == np.array([0, 2, 4, 6], np.float32)).all()
PY

echo "== kern selftest"
$KERN selftest --fixtures "$C/fixtures" --examples examples --scratch /tmp/kern-selftest | tee "$OUT/selftest.txt"
st=${PIPESTATUS[0]}
row "kern selftest" "$([[ $st -eq 0 ]] && echo PASS || echo "FAIL (rc=$st)")"

echo
echo "== summary"
printf '%s\n' "${rows[@]}"
