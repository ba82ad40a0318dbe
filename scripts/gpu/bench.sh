#!/usr/bin/env bash
# Issue 15's performance table, in one call on the GPU machine: random-weight Qwen3-0.6B, -4B and
# -8B packs; `kern bench --json` for every target row (0.6B b1, 4B b1, 4B b64 at 256-token
# contexts, 8B b1, 4B prefill of one 8,192-token prompt, 4B start to ready); the PyTorch peer at
# the same shapes in the same run; `kern profile` of each row for its top five ops; then the
# table (kern vs peer vs floor, fraction, target, met?) printed last and written into
# docs/performance.md. The rows and targets live in scripts/gpu/bench_table.py (`plan`).
#
#   here:  bash scripts/gpu/prepare-carry.sh; bash packs/kernels/build.sh
#          cp ../shared/peers/torch_peer.py .carry/
#   there: bash scripts/gpu/bench.sh        (carry .carry and build/packs; python3 with torch
#                                             for the peer; ~35 GB of free disk)
#
# Environment: KERN (.carry/kern), KERNELS (build/packs), WORK (/tmp/kern-bench: weights
# and packs, reused when already there), OUT (/tmp/kern-out: results in $OUT/bench, the table in
# $OUT/bench/table.md, the rewritten doc in $OUT/bench/performance.md), PEER (torch_peer.py;
# searched in .carry/, ../shared/peers/, shared/peers/), PEER_MODES ("graph"; "graph compile"
# adds torch.compile, 15-200 s per row), ROWS (row ids to run, default all: see `plan`; ROWS=families:
# issue 24's Llama-3.1-8B batch 1 / 64 and Gemma-3-4B batch 1 rows only, with NO_DOC=1 unless
# DOC=1 — their peer is scripts/gpu/torch_peer_families.py, their target the matching Qwen row's
# fraction of the floor, from this run or docs/performance.md),
# REPEAT (3: runs of the prefill and start-to-ready rows, median taken), STEPS (128 decode steps
# timed after 8 warm-up), NO_PROFILE=1, NO_PEER=1, NO_DOC=1 (do not rewrite docs/performance.md).
#
# Each run starts from an empty $OUT/bench (rows outside ROWS read "not yet measured").
# Exit status: 0 when every measurement ran (targets missed are in the table, not an error);
# 1 when setup failed or any measurement failed (the table still prints, with the reasons).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
W=${WORK:-/tmp/kern-bench}
R=${OUT:-/tmp/kern-out}/bench
PEER_MODES=${PEER_MODES:-graph}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-128}
# Extra arguments for every `kern pack` and every `kern bench` (A/B of a lever, e.g.
# PACK_ARGS="--decode-attention plain" or BENCH_ARGS="--blocking-steps").
read -r -a PACK_EXTRA <<<"${PACK_ARGS:-}"
read -r -a BENCH_EXTRA <<<"${BENCH_ARGS:-}"
TABLE="python3 scripts/gpu/bench_table.py"
T0=$SECONDS

log() { printf '[bench %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { echo "bench.sh: error: $*" >&2; exit 1; }
failures=0

# measure WHAT OUTFILE CMD...: runs CMD with stdout into OUTFILE and stderr into OUTFILE.log; on
# failure writes OUTFILE.err (the reason the table prints) and counts it, without stopping.
measure() {
  local what=$1 out=$2 rc=0
  shift 2
  rm -f "$out" "$out.err"
  "$@" </dev/null >"$out.tmp" 2>"$out.log" || rc=$?
  if [[ $rc -eq 0 ]]; then
    mv "$out.tmp" "$out"
  else
    local why
    # The tool's own error (a JSON "error" field), else the end of its stderr.
    why=$(sed -n 's/.*"error": *"\(.*\)".*/\1/p' "$out.tmp" 2>/dev/null | tail -n 1)
    [[ -n $why ]] || why=$(tail -n 3 "$out.log" | tr '\n' ' ' | cut -c1-300)
    echo "failed (exit $rc): $why" >"$out.err"
    rm -f "$out.tmp"
    failures=$((failures + 1))
    log "FAILED: $what (exit $rc; see $out.log)"
  fi
}
# skip OUTFILE REASON: records why a measurement was not run.
skip() { rm -f "$1"; echo "not run: $2" >"$1.err"; }

# --- setup: everything a run needs is checked before anything runs.
[[ -x $K ]] || die "$K is not an executable: run scripts/gpu/prepare-carry.sh where cargo is and carry .carry/ (or set KERN)"
[[ -d $KD ]] || die "$KD (the Qwen pack's built kernels) is missing: run packs/kernels/build.sh where nvcc is and carry build/packs (or set KERNELS)"
command -v python3 >/dev/null || die "python3 is needed (the table, the start-to-ready timer, the peer)"
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU visible (nvidia-smi -L failed)"
mkdir -p "$W" "$R"
plan=$($TABLE plan) || die "scripts/gpu/bench_table.py plan failed"
if [[ ${ROWS:-} == families ]]; then
  ROWS=$($TABLE plan --families | cut -d' ' -f1 | tr '\n' ' ' | sed 's/ $//')
  [[ -n ${DOC:-} ]] || NO_DOC=1
  log "ROWS=families: $ROWS (NO_DOC=${NO_DOC:-})"
fi
if [[ -n ${ROWS:-} ]]; then
  for id in $ROWS; do grep -q "^$id " <<<"$plan" || die "ROWS: no row '$id' (rows: $(cut -d' ' -f1 <<<"$plan" | tr '\n' ' '))"; done
  plan=$(grep -E "^($(tr ' ' '|' <<<"$ROWS")) " <<<"$plan")
fi
rm -f "$R"/*.json "$R"/*.err "$R"/*.log "$R"/*.tmp
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed -n 1p || true; "$K" --version 2>/dev/null || true; date -u +%Y-%m-%dT%H:%MZ; } | tr '\n' ';' | sed 's/;$//; s/;/; /g' >"$R/gpu.txt"
log "GPU: $(cat "$R/gpu.txt")"

peer=""
if [[ -z ${NO_PEER:-} ]]; then
  # The last one (Llama / Gemma 3 only) serves issue 24's rows when torch_peer.py is not carried.
  for p in "${PEER:-}" .carry/torch_peer.py ../shared/peers/torch_peer.py shared/peers/torch_peer.py scripts/gpu/torch_peer_families.py; do
    [[ -n $p && -f $p ]] && { peer=$p; break; }
  done
  if [[ -z $peer ]]; then
    peer_why="torch_peer.py not found (set PEER, or copy ../shared/peers/torch_peer.py to .carry/)"
  elif ! python3 -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'" 2>"$R/peer-torch.log"; then
    peer_why="python3 has no usable torch ($(tail -n 1 "$R/peer-torch.log"))"
    peer=""
  fi
  [[ -n $peer ]] && log "peer: $peer (modes: $PEER_MODES)" || log "peer NOT RUN: $peer_why"
else
  peer_why="NO_PEER is set"
fi

# --- weights and packs: random weights per preset, a decode pack in the weights' directory, and
# for prefill a pack with 8,192-token steps beside it (the weights linked in).
presets=$(awk '{print $2}' <<<"$plan" | sort -u)
for preset in $presets; do
  d=$W/$preset
  if [[ -f $d/config.json && -f $d/.weights-done ]]; then
    log "$preset: reusing the random weights in $d"
  else
    log "$preset: writing random weights to $d"
    rm -rf "$d"
    "$K" random-weights --preset "$preset" -o "$d" </dev/null >"$W/$preset-weights.log" 2>&1 || die "kern random-weights --preset $preset failed: see $W/$preset-weights.log"
    touch "$d/.weights-done"
  fi
done
# pack_dir PRESET PACK: the directory a row of that preset and pack runs on.
pack_dir() { [[ $2 == decode ]] && echo "$W/$1" || echo "$W/$1-$2"; }
declare -A pack_ok=()
while read -r preset pack; do
  d=$W/$preset
  out=$(pack_dir "$preset" "$pack")
  case $pack in
    decode) args=(--max-tokens 2048 --max-seqs 64 --max-context 4096) ;;
    prefill) args=(--max-tokens 8192 --max-seqs 8 --max-context 8448)
      mkdir -p "$out"
      # Only the checkpoint: kern pack writes the rest (a linked file would be written through).
      for f in "$d"/*.safetensors "$d"/*.safetensors.index.json; do [[ -e $f ]] && ln -sf "$(realpath "$f")" "$out/"; done ;;
    *) die "bench_table.py plan names an unknown pack '$pack'" ;;
  esac
  log "$preset: kern pack ($pack: ${args[*]}) -> $out"
  if "$K" pack --config "$d/config.json" -o "$out" --kernels "$KD" "${args[@]}" ${PACK_EXTRA[@]+"${PACK_EXTRA[@]}"} </dev/null >"$W/$preset-$pack-pack.log" 2>&1; then
    pack_ok[$preset-$pack]=1
  else
    log "FAILED: kern pack $preset ($pack): see $W/$preset-$pack-pack.log"
    failures=$((failures + 1))
  fi
done < <(awk '{print $2, $3}' <<<"$plan" | sort -u)

# --- the rows: kern, then the peer at the same shapes, then the profile.
while read -r id preset pack kind batch context ptoks; do
  dir=$(pack_dir "$preset" "$pack")
  if [[ -z ${pack_ok[$preset-$pack]:-} ]]; then
    for f in "$R/kern-$id.1.json" "$R/ready-$id.1.json" "$R/profile-$id.json" "$R/peer-$id-graph.json" "$R/peer-$id-compile.json"; do
      skip "$f" "kern pack failed (see $W/$preset-$pack-pack.log)"
    done
    continue
  fi
  case $kind in
    decode)
      log "$id: kern bench --batch $batch --context $context"
      measure "kern bench $id" "$R/kern-$id.1.json" "$K" bench --model "$dir" --batch "$batch" --context "$context" --steps "$STEPS" --warmup 8 --json ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"}
      [[ -f $R/kern-$id.1.json ]] && log "$id: $(python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); print(f\"median {r['median_ms']:.3f} ms, floor {r['floor_ms']}\")" "$R/kern-$id.1.json" 2>/dev/null || echo '(unreadable)')"
      prof=(--batch "$batch" --context "$context")
      peer_args=(--batch "$batch" --prompt "$context") ;;
    prefill)
      for i in $(seq 1 "$REPEAT"); do
        log "$id: kern bench --prompt-tokens $ptoks (run $i of $REPEAT)"
        measure "kern bench $id run $i" "$R/kern-$id.$i.json" "$K" bench --model "$dir" --prompt-tokens "$ptoks" --json ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"}
      done
      prof=(--prefill --batch 1 --context "$ptoks")
      peer_args=(--prefill "$ptoks") ;;
    ready)
      for i in $(seq 1 "$REPEAT"); do
        log "$id: kern serve to /health 200 (run $i of $REPEAT)"
        measure "start to ready $id run $i" "$R/ready-$id.$i.json" $TABLE ready --kern "$K" --model "$dir" --log "$R/ready-$id.$i.serve.log"
      done
      continue ;;
    *) die "bench_table.py plan names an unknown kind '$kind'" ;;
  esac
  for mode in graph compile; do
    f=$R/peer-$id-$mode.json
    if [[ -z $peer ]]; then skip "$f" "$peer_why"; continue; fi
    if [[ " $PEER_MODES " != *" $mode "* ]]; then skip "$f" "PEER_MODES=\"$PEER_MODES\""; continue; fi
    if [[ $kind == prefill && $mode == compile ]]; then skip "$f" "the peer's prefill is one eager forward"; continue; fi
    log "$id: peer ($mode)"
    measure "peer $id $mode" "$f" $TABLE peer --peer "$peer" --model "$preset" --mode "$mode" "${peer_args[@]}"
  done
  if [[ -n ${NO_PROFILE:-} ]]; then
    skip "$R/profile-$id.json" "NO_PROFILE is set"
  else
    log "$id: kern profile ${prof[*]}"
    measure "kern profile $id" "$R/profile-$id.json" "$K" profile --model "$dir" "${prof[@]}" --json
  fi
done <<<"$plan"

# --- the table, last.
doc_args=()
if [[ -z ${NO_DOC:-} ]]; then
  cp docs/performance.md "$R/performance.md"
  doc_args=(--doc "$R/performance.md")
fi
echo
echo "== performance table ($((SECONDS - T0)) s; results in $R)"
$TABLE table "$R" --work "$W" --out "$R/table.md" "${doc_args[@]}" || die "bench_table.py table failed"
if [[ -z ${NO_DOC:-} ]]; then
  cp "$R/performance.md" docs/performance.md
  echo "(docs/performance.md rewritten here and copied to $R/performance.md: bring it back to commit it)"
fi
if [[ $failures -gt 0 ]]; then
  echo "bench.sh: $failures measurement(s) failed: their rows say why; logs in $R and $W" >&2
  exit 1
fi
