#!/usr/bin/env bash
# Issue 30 item 2 on the GPU machine: the Gated DeltaNet hybrids (qwen3_next, qwen3_5) — random-
# weight parity against transformers' pure-torch path, and the prefix cache through their
# per-sequence state — time-boxed, everything under $OUT, one short table last.
#
#   bash scripts/gpu/hybrid.sh [--sections LIST] [--budget SECONDS] [--dry-run | --selftest]
#
# Sections (default: emu,parity,prefix; a section starts only when the budget has the time it
# needs, else its row says NOT RUN):
#   emu           the host emulations of gdn.cu and gated.cu (packs/kernels/verify/host_emu, only
#                 those two; g++, no GPU)                                                    (~40 s)
#   parity        hybrid.py parity: qwen3.5-small, qwen3.5-small-d256, qwen3-next-small,
#                 qwen3-next-small-d256 (random weights; prompts 5 / 70 / 300 tokens, 32 greedy
#                 steps; fp32 GDN state): max|kern - fp32| <= 1.5 max|bf16 - fp32| + 0.01 at every
#                 step, greedy tokens vs transformers' own, 16-token chunks and one-chunk runs vs the
#                 batch run, the manifest vs the model (layer kinds, partial RoPE, scales, state size)
#                                                                                            (~4 min)
#   prefix        hybrid.py prefix: qwen3.5-small, qwen3-next-small — the same prompts with the
#                 prefix cache and without, whole and in 16-token chunks: equal tokens, cached
#                 prompt tokens reported (GDN snapshots restored)                           (~1.5 min)
#   parity-bf16   hybrid.py parity of qwen3.5-small and qwen3-next-small packed with
#                 --gdn-state bf16 (not in the default list: the bf16 state's error is compared
#                 against a reference whose state is fp32)                                  (~2 min)
#   bench         hybrid_bench.py bench (issue 30 item 5; not in the default list): GDN state bytes per
#                 sequence (fp32 / bf16) vs KV bytes per token at qwen3-next-80b-a3b's full depth (kern
#                 pack of its config alone), kern bench decode at batch 1 and 64 (context 256) of the
#                 model at BENCH_LAYERS (4) of 48 layers (~14.4 GB of random weights in $WORK) beside the
#                 floor of its ACTIVE bytes (an estimate: uniform routing), prefill of 8,192 tokens  (~4 min)
#   serve         hybrid_bench.py serve (not in the default list): qwen3-next-small + the tokenizer in TOK
#                 through kern serve, cache on / --no-prefix-cache, 16 requests sharing a 2,000-token
#                 prefix one at a time: TTFT p50, cached_tokens, snapshots, greedy equality  (~2 min)
# --budget (default 540): seconds this call may use (a device call lasts at most 600).
# --dry-run: the plan and what is carried; runs nothing. --selftest: the scripts' own CPU checks.
#
# Carry: [".carry/kern" (bash scripts/gpu/prepare-carry.sh), "build/packs" (bash
# packs/kernels/build.sh: gdn.sm_90a.cubin and gated.sm_90a.cubin must be in it)]; serve also needs
# .carry/tok (tokenizer.json, tokenizer_config.json: carry ".carry"). Environment:
# KERN (.carry/kern), KERNELS (build/packs), WORK (/tmp/kern-hybrid), OUT (/tmp/kern-out),
# SHAPES (the parity shapes), PREFIX_SHAPES, STEPS (32), LENGTHS (5,70,300), DEVICE (cuda),
# BENCH_LAYERS (4), BENCH_PRESET (qwen3-next-80b-a3b), TOK (.carry/tok).
#
# $OUT gets: hybrid.txt (the table), hybrid-parity.json / .txt, hybrid-prefix.json,
# hybrid-bench.json, hybrid-serve.json, hybrid-logs.tgz (every section's log and kern's command
# lines / stderr).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
T0=$SECONDS
SECTIONS=emu,parity,prefix
BUDGET=540
SECTIONS_TAG=hybrid
# sections_args, log, left, record, run_section
source scripts/gpu/sections.sh
sections_args "$@"
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
W=${WORK:-/tmp/kern-hybrid}
OUTD=${OUT:-/tmp/kern-out}
RES=$W/results
LOGS=$W/logs
SHAPES=${SHAPES:-qwen3.5-small,qwen3.5-small-d256,qwen3-next-small,qwen3-next-small-d256}
PREFIX_SHAPES=${PREFIX_SHAPES:-qwen3.5-small,qwen3-next-small}
STEPS=${STEPS:-32}
LENGTHS=${LENGTHS:-5,70,300}
DEVICE=${DEVICE:-cuda}
# PACK_ARGS: extra `kern pack` arguments for every section's packs (e.g. PACK_ARGS="--router-logits
# f32": Qwen3-Next's router in fp32, docs/moe.md; PACK_ARGS=--batch-invariant: bit-exact snapshot
# hits, docs/batch-invariance.md).
PACK_EXTRA=()
for x in ${PACK_ARGS:-}; do PACK_EXTRA+=("--pack-arg=$x"); done
# PARITY_ARGS: extra scripts/gpu/parity.py arguments of the parity section, e.g.
# PARITY_ARGS=--forced-routing with PACK_ARGS=--batch-invariant: both references also routed to
# kern's own experts (docs/moe.md, "Parity given kern's routing").
read -r -a PARITY_EXTRA <<<"${PARITY_ARGS:-}"
BENCH_LAYERS=${BENCH_LAYERS:-4}
BENCH_PRESET=${BENCH_PRESET:-qwen3-next-80b-a3b}
TOK=${TOK:-.carry/tok}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
declare -A NEED=([emu]=40 [parity]=120 [prefix]=60 [parity-bf16]=90 [bench]=150 [serve]=60)
declare -A EST=([emu]=40 [parity]=240 [prefix]=90 [parity-bf16]=120 [bench]=240 [serve]=120)

if [[ $MODE == selftest ]]; then
  rc=0
  bash -n scripts/gpu/hybrid.sh || rc=1
  python3 -m py_compile scripts/gpu/hybrid.py scripts/gpu/parity.py || rc=1
  python3 scripts/gpu/hybrid.py selftest --kern "${KERN:-target/release/kern}" --kernels "$KD" | tail -n 12 || rc=1
  python3 -m py_compile scripts/gpu/hybrid_bench.py || rc=1
  python3 scripts/gpu/hybrid_bench.py selftest --kern "${KERN:-target/release/kern}" --kernels "$KD" --tok "$TOK" >"${TMPDIR:-/tmp}/hybrid_bench-selftest.log" 2>&1 || rc=1
  grep -E "^(FAIL|SKIP)|selftest:" "${TMPDIR:-/tmp}/hybrid_bench-selftest.log"
  echo "hybrid.sh --selftest: $([[ $rc == 0 ]] && echo PASS || echo FAIL)"
  exit $rc
fi

IFS=, read -r -a SECS <<<"$SECTIONS"
for s in "${SECS[@]}"; do
  [[ -n ${EST[$s]:-} ]] || { echo "hybrid.sh: unknown section '$s' (emu parity prefix parity-bf16 bench serve)" >&2; exit 2; }
done
cmd_of() {
  case $1 in
    emu) echo "g++ packs/kernels/verify/host_emu/{gdn_emu,gated_emu}.cpp; run both" ;;
    parity) echo "python3 scripts/gpu/hybrid.py parity --kern $K --kernels $KD --shapes $SHAPES --lengths $LENGTHS --steps $STEPS --budget BUDGET" ;;
    prefix) echo "python3 scripts/gpu/hybrid.py prefix --kern $K --kernels $KD --shapes $PREFIX_SHAPES --steps $STEPS --budget BUDGET" ;;
    parity-bf16) echo "python3 scripts/gpu/hybrid.py parity --kern $K --kernels $KD --shapes qwen3.5-small,qwen3-next-small --pack-arg=--gdn-state --pack-arg=bf16 ..." ;;
    bench) echo "python3 scripts/gpu/hybrid_bench.py bench --kern $K --kernels $KD --preset $BENCH_PRESET --layers $BENCH_LAYERS --work $W/bench --budget BUDGET (~$(( BENCH_LAYERS * 33 / 10 + 1 )) GB of weights in $W)" ;;
    serve) echo "python3 scripts/gpu/hybrid_bench.py serve --kern $K --kernels $KD --tok $TOK --work $W/serve --budget BUDGET" ;;
  esac
}
if [[ $MODE == dry ]]; then
  echo "hybrid.sh --dry-run: budget $BUDGET s; sections in order:"
  total=0
  for s in "${SECS[@]}"; do
    total=$((total + EST[$s]))
    printf '  %-12s ~%4s s (starts with >= %s s left; cumulative ~%s s%s)\n      %s\n' "$s" "${EST[$s]}" "${NEED[$s]}" "$total" \
      "$([[ $total -gt $BUDGET ]] && echo ', PAST THE BUDGET: another call')" "$(cmd_of "$s")"
  done
  echo "carried here:"
  carried=("$K" "$KD/gdn.sm_90a.cubin" "$KD/gated.sm_90a.cubin" "$KD/gated.pdl.sm_90a.cubin" "$KD/rowwise.sm_90a.cubin")
  [[ ,$SECTIONS, == *,bench,* || ,$SECTIONS, == *,serve,* ]] && carried+=("$KD/moe.pdl.sm_90a.cubin" "$KD/gemm_wgmma.sm_90a.cubin")
  [[ ,$SECTIONS, == *,serve,* ]] && carried+=("$TOK/tokenizer.json" "$TOK/tokenizer_config.json")
  for p in "${carried[@]}"; do
    [[ -e $p ]] && echo "  ok      $p ($(du -sh "$p" | cut -f1))" || echo "  MISSING $p"
  done
  exit 0
fi

rm -rf "$RES" "$LOGS"
mkdir -p "$RES" "$LOGS" "$OUTD"
: >"$RES/sections.tsv"
[[ -x $K ]] || { echo "hybrid.sh: $K is not executable: run scripts/gpu/prepare-carry.sh where cargo is and carry .carry/kern" >&2; exit 2; }
for f in gdn gated; do
  [[ -f $KD/$f.sm_90a.cubin && -f $KD/$f.pdl.sm_90a.cubin ]] || { echo "hybrid.sh: $KD/$f(.pdl).sm_90a.cubin missing: bash packs/kernels/build.sh and carry build/packs" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -n 2
python3 -c "import torch, transformers; print('python', __import__('sys').version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -n 1

emu() {
  set -o pipefail
  local d rc=0 n
  d=$(mktemp -d)
  for n in gdn gated; do
    g++ -std=c++20 -O2 -w -I packs/kernels/verify/host_emu -include packs/kernels/verify/host_emu/emu.h -x c++ \
      "packs/kernels/verify/host_emu/${n}_emu.cpp" -o "$d/$n" && "$d/$n" | tail -n 3 || rc=1
  done
  rm -rf "$d"
  return $rc
}
export -f emu

for s in "${SECS[@]}"; do
  pb=$(( $(left) - 80 )); [[ $pb -lt 1 ]] && pb=1
  case $s in
    emu) run_section emu bash -c emu ;;
    parity)
      run_section parity env OUT="$RES" PARITY_JSON="$RES/hybrid-parity.json" PARITY_TXT="$RES/hybrid-parity.txt" PARITY_LOGS="$LOGS/parity-kern" \
        python3 scripts/gpu/hybrid.py parity --kern "$K" --kernels "$KD" --shapes "$SHAPES" --lengths "$LENGTHS" --steps "$STEPS" \
        --work "$W/parity" --budget "$pb" --device "$DEVICE" "${PACK_EXTRA[@]}" "${PARITY_EXTRA[@]}" ;;
    parity-bf16)
      run_section parity-bf16 env OUT="$RES" PARITY_JSON="$RES/hybrid-parity-bf16.json" PARITY_TXT="$RES/hybrid-parity-bf16.txt" PARITY_LOGS="$LOGS/parity-bf16-kern" \
        python3 scripts/gpu/hybrid.py parity --kern "$K" --kernels "$KD" --shapes qwen3.5-small,qwen3-next-small --lengths "$LENGTHS" --steps "$STEPS" \
        --work "$W/parity-bf16" --budget "$pb" --device "$DEVICE" --pack-arg=--gdn-state --pack-arg=bf16 ;;
    prefix)
      run_section prefix env OUT="$RES" python3 scripts/gpu/hybrid.py prefix --kern "$K" --kernels "$KD" --shapes "$PREFIX_SHAPES" \
        --steps "$STEPS" --work "$W/prefix" --budget "$pb" "${PACK_EXTRA[@]}" ;;
    bench)
      bb=$(( $(left) - 20 )); [[ $bb -lt 1 ]] && bb=1
      run_section bench python3 scripts/gpu/hybrid_bench.py bench --kern "$K" --kernels "$KD" --preset "$BENCH_PRESET" --layers "$BENCH_LAYERS" --work "$W/bench" \
        --logs "$LOGS/bench-kern" --json "$RES/hybrid-bench.json" --budget "$bb" "${PACK_EXTRA[@]}" ;;
    serve)
      bb=$(( $(left) - 20 )); [[ $bb -lt 1 ]] && bb=1
      run_section serve python3 scripts/gpu/hybrid_bench.py serve --kern "$K" --kernels "$KD" --tok "$TOK" --work "$W/serve" \
        --logs "$LOGS/serve-kern" --json "$RES/hybrid-serve.json" --budget "$bb" "${PACK_EXTRA[@]}" ;;
  esac
done

# ---- results: the table last
{
  echo "== hybrids ($((SECONDS - T0)) s of a $BUDGET s budget; sections: $SECTIONS)"
  while IFS=$'\t' read -r name state rc secs why; do
    verdict="NOT RUN"
    [[ $state == ran ]] && verdict=$([[ $rc == 0 ]] && echo PASS || echo "FAIL (exit $rc)")
    printf '  %-12s %-14s %4s s  %s\n' "$name" "$verdict" "$secs" "$why"
  done <"$RES/sections.tsv"
  for f in hybrid-parity.txt hybrid-parity-bf16.txt; do
    [[ -f $RES/$f ]] && { echo; cat "$RES/$f"; }
  done
  [[ -f $LOGS/prefix.log ]] && { echo; grep -A8 "^== prefix cache of the hybrids" "$LOGS/prefix.log"; }
  [[ -f $LOGS/emu.log ]] && { echo; echo "== host emulations"; grep -E "passed|FAIL" "$LOGS/emu.log" | tail -n 6; }
  for f in hybrid-bench.txt hybrid-serve.txt; do
    [[ -f $RES/$f ]] && { echo; cat "$RES/$f"; }
  done
} | tee "$OUTD/hybrid.txt"
for f in hybrid-parity.json hybrid-parity.txt hybrid-parity-bf16.json hybrid-prefix.json hybrid-bench.json hybrid-serve.json; do
  [[ -f $RES/$f ]] && cp "$RES/$f" "$OUTD/"
done
tar -czf "$OUTD/hybrid-logs.tgz" -C "$W" results logs 2>/dev/null
if [[ $(stat -c %s "$OUTD/hybrid-logs.tgz") -gt 15000000 ]]; then
  tar -czf "$OUTD/hybrid-logs.tgz" -C "$W" --exclude='*-kern' results logs
fi
awk -F'\t' '$2 == "ran" && $3 != 0 { bad = 1 } END { exit bad }' "$RES/sections.tsv"
