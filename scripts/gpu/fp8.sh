#!/usr/bin/env bash
# FP8 on the GPU machine (issue 25, FP8 part): the kernels' checks and timings, then FP8 packs end
# to end through kern. Run from the repository root; prints one table per part, exit 1 on a FAIL.
#
# Carry (from the dev machine):
#   build/packs     the pack's cubins, gemm_fp8* included (bash packs/kernels/build.sh)
#   .carry/kern     release kern (bash scripts/gpu/prepare-carry.sh)
#
#   bash scripts/gpu/fp8.sh                 # kernels (checks + timing), then e2e on Qwen3-4B shapes
#   PART=kernels bash scripts/gpu/fp8.sh    # kernels only (~2 min); QUICK=1 fewer shapes, no timing
#   PART=e2e LAYERS=8 STEPS=16 bash scripts/gpu/fp8.sh   # a shorter end-to-end run
#
# The device call (a single H200 is enough; ~10 min with the full e2e at 36 layers):
#   run(command="bash scripts/gpu/fp8.sh", carry=["build/packs", ".carry"], timeout_s=600)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PART=${PART:-all}
OUT=${OUT:-/tmp}
rc=0
python3 -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cupy', cupy.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
if [[ $PART == all || $PART == kernels ]]; then
  args=()
  [[ -n ${QUICK:-} ]] && args+=(--quick --no-timing)
  python3 packs/kernels/verify/fp8_verify.py build/packs "${args[@]}" 2>&1 | tee "$OUT/fp8_kernels.log" || rc=1
fi
if [[ $PART == all || $PART == e2e ]]; then
  args=(--e2e --kern "${KERN:-.carry/kern}" --kernels build/packs --preset "${PRESET:-qwen3-4b}" --steps "${STEPS:-32}" --prompts "${PROMPTS:-8}")
  [[ -n ${LAYERS:-} ]] && args+=(--layers "$LAYERS")
  python3 packs/kernels/verify/fp8_verify.py "${args[@]}" 2>&1 | tee "$OUT/fp8_e2e.log" || rc=1
fi
exit $rc
