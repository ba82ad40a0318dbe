#!/usr/bin/env bash
# Issue 26 on the GPU machine: Qwen3-MoE parity, routing and benchmark rows, in one call per
# section (docs/moe.md, "GPU runs"). A short table prints last.
#
#   here:  bash scripts/gpu/prepare-carry.sh; bash packs/kernels/build.sh
#   there: bash scripts/gpu/moe.sh                         (carry .carry and build/packs)
#          SECTIONS=parity bash scripts/gpu/moe.sh          (~6 min)
#          SECTIONS=routing bash scripts/gpu/moe.sh         (~3 min)
#          SECTIONS=bench bash scripts/gpu/moe.sh           (~7 min: 61 GB of random weights, 3 kern bench rows)
#          SECTIONS=peer bash scripts/gpu/moe.sh            (~5 min, after bench on the same machine: reuses its weights)
#
# Sections (SECTIONS, comma-separated, default parity,routing,bench,peer; all of them take
# ~20 min, more than one device call allows — run them one call each, back to back, so /tmp
# is kept):
#   parity   scripts/gpu/parity.py (through moe_check.py parity: transformers' experts pinned to
#            its eager loop) at PARITY_SHAPES (default: qwen3-moe-small, a top-8 variant
#            with 32 experts and norm_topk_prob, qwen3-30b-a3b at 2 layers), PARITY_STEPS (32)
#            greedy steps: the rule max|kern - fp32| <= 1.5 max|bf16 - fp32| + 0.01 at every
#            step, greedy tokens, chunked prefill.
#   routing  scripts/gpu/moe_check.py routing at ROUTING_SHAPES (qwen3-moe-small,
#            qwen3-30b-a3b:layers=2), prompts of 37 and 200 tokens (moe_gemm_s and moe_gemm_l):
#            kern's experts equal transformers' on every token whose router logits are not
#            tied within the two sides' difference.
#   bench    kern bench --json on qwen3-30b-a3b random weights (BENCH_LAYERS layers, default: as
#            many of 48 as the free disk holds with 8 GB to spare, ~1.26 GB each): batch 1
#            (context 128), batch 64 (context 256), prefill of one 8,192-token prompt.
#   peer     transformers' own bf16 Qwen3MoeForCausalLM on the same weights (its loop over
#            experts), the same three measures.
# Then moe_check.py table: kern, peer, the floor of the active bytes / FLOPs, the fraction.
#
# Environment: KERN (.carry/kern), KERNELS (build/packs), WORK (/tmp/kern-moe), OUT
# (/tmp/kern-out: results in $OUT/moe: parity.json / .txt, routing.json, bench/*.json, rows.md,
# logs), NO_PEER=1. Exit 1 when a section failed or found a FAIL (the table still prints).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
W=${WORK:-/tmp/kern-moe}
R=${OUT:-/tmp/kern-out}/moe
SECTIONS=${SECTIONS:-parity,routing,bench,peer}
PARITY_SHAPES=${PARITY_SHAPES:-qwen3-moe-small,qwen3-moe-small:num_experts=32:num_experts_per_tok=8:norm_topk_prob=true,qwen3-30b-a3b:layers=2}
ROUTING_SHAPES=${ROUTING_SHAPES:-qwen3-moe-small,qwen3-30b-a3b:layers=2}
T0=$SECONDS
log() { printf '[moe %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { echo "moe.sh: error: $*" >&2; exit 1; }
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
declare -a SUMMARY=()
status=0
note() { SUMMARY+=("$(printf '%-8s %-44s %s' "$1" "$2" "$3")"); }

[[ -x $K ]] || die "$K is not an executable: run scripts/gpu/prepare-carry.sh where cargo is and carry .carry/ (or set KERN)"
[[ -f $KD/moe.sm_90a.cubin && -f $KD/moe.pdl.sm_90a.cubin ]] || die "$KD has no moe cubins: run packs/kernels/build.sh where nvcc is and carry build/packs (or set KERNELS)"
nvidia-smi -L >/dev/null 2>&1 || die "no NVIDIA GPU visible (nvidia-smi -L failed)"
python3 -c "import torch, transformers, numpy, safetensors; assert torch.cuda.is_available()" 2>/dev/null || die "python3 needs torch (with CUDA), transformers, numpy and safetensors"
mkdir -p "$W" "$R/logs"
log "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1); transformers $(python3 -c 'import transformers; print(transformers.__version__)'); sections: $SECTIONS"

# PACK_ARGS: extra `kern pack` arguments of every section's packs (e.g. PACK_ARGS="--router-logits
# f32" or "--moe-gemm mma", docs/moe.md).
PACK_EXTRA=()
for x in ${PACK_ARGS:-}; do PACK_EXTRA+=("--pack-arg=$x"); done
read -r -a PACK_RAW <<<"${PACK_ARGS:-}"
# PARITY_ARGS: extra scripts/gpu/parity.py arguments of the parity section, e.g.
# PARITY_ARGS=--forced-routing with PACK_ARGS=--batch-invariant: both references also routed to
# kern's own experts (docs/moe.md, "Parity given kern's routing").
read -r -a PARITY_EXTRA <<<"${PARITY_ARGS:-}"

# ---------------------------------------------------------------- parity
if has parity; then
  log "parity: $PARITY_SHAPES"
  if OUT="$R" PARITY_JSON="$R/parity.json" PARITY_TXT="$R/parity.txt" PARITY_LOGS="$R/logs/parity" \
      python3 scripts/gpu/moe_check.py parity --kern "$K" --kernels "$KD" --shapes "$PARITY_SHAPES" --steps "${PARITY_STEPS:-32}" \
      --work "$W/parity" "${PACK_EXTRA[@]}" "${PARITY_EXTRA[@]}" >"$R/logs/parity.out" 2>&1; then
    note parity "$PARITY_SHAPES" "PASS (table: $R/parity.txt)"
  else
    status=1
    note parity "$PARITY_SHAPES" "FAIL or error: see $R/logs/parity.out"
  fi
  tail -n 12 "$R/logs/parity.out"
fi

# ---------------------------------------------------------------- routing
if has routing; then
  log "routing: $ROUTING_SHAPES"
  if python3 scripts/gpu/moe_check.py routing --kern "$K" --kernels "$KD" --shapes "$ROUTING_SHAPES" --work "$W/routing" \
      --json "$R/routing.json" "${PACK_EXTRA[@]}" >"$R/logs/routing.out" 2>&1; then
    note routing "$ROUTING_SHAPES" "$(tail -n 1 "$R/logs/routing.out")"
  else
    status=1
    note routing "$ROUTING_SHAPES" "$(tail -n 1 "$R/logs/routing.out" | cut -c1-120) (see $R/logs/routing.out)"
  fi
  grep -E "^ *(bf16|fp32) " "$R/logs/routing.out" | head -n 24 || true
fi

# ---------------------------------------------------------------- bench weights and packs
B=$W/qwen3-30b-a3b
if has bench || has peer; then
  if [[ ! -f $B/.weights-done ]]; then
    free_gb=$(df -BG --output=avail "$W" | tail -n 1 | tr -dc 0-9)
    layers=${BENCH_LAYERS:-$(( (free_gb - 8 - 2) * 100 / 126 ))}
    (( layers > 48 )) && layers=48
    (( layers >= 1 )) || die "bench: $free_gb GB free in $W is not enough for one layer (set WORK to a larger disk)"
    log "bench: random weights, qwen3-30b-a3b at $layers of 48 layers ($free_gb GB free) -> $B"
    rm -rf "$B"
    "$K" random-weights --preset qwen3-30b-a3b --layers "$layers" -o "$B" </dev/null >"$R/logs/weights.log" 2>&1 || die "kern random-weights failed: see $R/logs/weights.log"
    touch "$B/.weights-done"
  fi
  log "bench: $(python3 -c "import json; print(json.load(open('$B/config.json'))['num_hidden_layers'])") layers in $B"
fi
if has bench; then
  mkdir -p "$R/bench" "$B-prefill"
  rm -f "$R"/bench/*.json "$R"/bench/*.err
  "$K" pack --config "$B/config.json" -o "$B" --kernels "$KD" --max-tokens 2048 --max-seqs 64 --max-context 4096 ${PACK_RAW[@]+"${PACK_RAW[@]}"} </dev/null >"$R/logs/pack.log" 2>&1 \
    || die "kern pack (decode) failed: see $R/logs/pack.log"
  for f in "$B"/*.safetensors "$B"/*.safetensors.index.json; do [[ -e $f ]] && ln -sf "$(realpath "$f")" "$B-prefill/"; done
  "$K" pack --config "$B/config.json" -o "$B-prefill" --kernels "$KD" --max-tokens 8192 --max-seqs 8 --max-context 8448 ${PACK_RAW[@]+"${PACK_RAW[@]}"} </dev/null >"$R/logs/pack-prefill.log" 2>&1 \
    || die "kern pack (prefill) failed: see $R/logs/pack-prefill.log"
  bench() {  # bench NAME DIR ARGS...: kern bench --json into $R/bench/NAME.json, or NAME.json.err
    local name=$1 dir=$2 rc=0
    shift 2
    log "bench $name: kern bench --model $dir $*"
    "$K" bench --model "$dir" --json "$@" </dev/null >"$R/bench/$name.json.tmp" 2>"$R/logs/bench-$name.log" || rc=$?
    if [[ $rc -eq 0 ]]; then
      mv "$R/bench/$name.json.tmp" "$R/bench/$name.json"
    else
      status=1
      echo "failed (exit $rc): $(tail -n 2 "$R/logs/bench-$name.log" | tr '\n' ' ' | cut -c1-200)" >"$R/bench/$name.json.err"
      log "FAILED: bench $name (see $R/logs/bench-$name.log)"
    fi
  }
  bench b1 "$B" --batch 1 --context 128 --steps 64
  bench b64 "$B" --batch 64 --context 256 --steps 64
  bench prefill "$B-prefill" --prompt-tokens 8192
  note bench "qwen3-30b-a3b (kern bench)" "$(ls "$R"/bench/*.json 2>/dev/null | wc -l) of 3 rows measured"
fi

# ---------------------------------------------------------------- peer
if has peer && [[ -z ${NO_PEER:-} ]]; then
  mkdir -p "$R/bench"
  log "peer: transformers bf16 on $B"
  if python3 scripts/gpu/moe_check.py peer --model "$B" --json "$R/bench/peer.json" >"$R/logs/peer.out" 2>&1; then
    note peer "transformers Qwen3MoeForCausalLM bf16" "$(grep -c '^peer ' "$R/logs/peer.out") measures"
  else
    status=1
    note peer "transformers Qwen3MoeForCausalLM bf16" "failed: see $R/logs/peer.out"
  fi
fi

# ---------------------------------------------------------------- table
if [[ -d $R/bench && -f $B/config.json ]] && { has bench || has peer; }; then
  echo
  python3 scripts/gpu/moe_check.py table --results "$R/bench" --config "$B/config.json" --md "$R/rows.md" || status=1
fi
echo
echo "moe.sh ($((SECONDS - T0)) s; results in $R):"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
exit $status
