#!/usr/bin/env bash
# Issue 24 on the GPU machine, one entry point: Llama / Mistral / Gemma 3 beside Qwen — random
# parity, real GGUF models, served through the official openai client, bench rows — run in a
# time-boxed order (most important first), everything written under $OUT, one short table last.
#
#   bash scripts/gpu/families.sh [--sections LIST] [--budget SECONDS] [--dry-run | --selftest]
#
# Sections (default: rope,parity-small,real,serve,parity-large,bench; a section starts only when
# the budget has the time it needs, else its row says NOT RUN):
#   rope          families.py rope: the manifest's RoPE tables / computed frequencies, cos factor,
#                 score scale and windows against transformers for llama3 (x8, x32), linear
#                 (Gemma 3 4B's global layers) with the unscaled local ones, YaRN (with and without
#                 mscale), plain RoPE and a Mistral window — kern pack + CPU only         (~20 s)
#   parity-small  parity.py smollm2-135m, llama-3.2-1b (llama3 RoPE), gemma-3-1b-sw48 (a 48-token
#                 window crossed by prompts, decode and 16-token chunks), mistral-7b-v0.1-sw64 (4096
#                 wide, 8 layers, a 64-token window)                                        (~4 min)
#   real          real_model.py smollm2-135m then gemma-3-270m (the staged GGUFs)           (~3 min)
#   serve         serve_families.py: SmolLM2 and Gemma 3 270M GGUFs, random Llama 3.2 1B and
#                 Gemma 3 1B (window 64) packs — openai chat / stream / completions, /tokenize
#                 ids against the reference tokenizers, greedy == kern generate, 16 streams  (~2.5 min)
#   parity-large  parity.py llama-3.1-8b-l8, mistral-7b-l8, gemma-3-4b-sw96 (12 layers),
#                 llama-3.2-1b-long (positions to 8331, past 8192)                          (~5 min)
#   bench         ROWS=families bash scripts/gpu/bench.sh: Llama-3.1-8B batch 1 and 64, Gemma-3-4B
#                 batch 1 (random weights) beside the PyTorch peer and the floor             (~4 min)
#   real-qwen     real_model.py qwen2.5-coder-0.5b (only when `stage.sh prepare qwen` parts
#                 were staged; not in the default list)                                     (~1.5 min)
# --budget (default 540): seconds this call may use (a device call lasts at most 600).
# --dry-run: the plan, what is carried and staged, the commands; runs nothing. --selftest: the
# scripts' own CPU checks (no GPU, no kern).
#
# Carry (prepared here: bash scripts/gpu/prepare-carry.sh; bash packs/kernels/build.sh;
# bash scripts/gpu/stage.sh wheels; the GGUF parts: bash scripts/gpu/stage.sh prepare, one
# `stage.sh put families N` call each, right before this one): [".carry", "build/packs", ".whl"].
# .carry/fam holds the Llama 3 and Gemma 3 tokenizer files (prepare-carry.sh), .whl/families the
# gguf and openai wheels (stage.sh wheels). Environment: KERN (.carry/kern), KERNELS
# (build/packs), WORK (/tmp/kern-families), OUT (/tmp/kern-out), PARITY_SMALL / PARITY_LARGE
# (shape lists), STEPS (parity steps, default the shapes' own), PARITY_LAYERS (every shape's
# layer count: smoke runs), REAL_STEPS (64), REAL_PACK_ARGS (extra `kern pack --gguf` arguments
# of the real section, e.g. "--dequantize": the bf16 path instead of GGUF-native), DEVICE (cuda; cpu with KERN=scripts/gpu/
# parity_fake_kern.py checks the plumbing of rope / parity / real on a machine without a GPU).
#
# $OUT gets (at most 8 files come back from a device call): families.txt (the table),
# families.json (every section's numbers), families-logs.tgz (logs, per-section results).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
T0=$SECONDS
SECTIONS=rope,parity-small,real,serve,parity-large,bench
BUDGET=540
SECTIONS_TAG=families
SECTION_TAIL=6
# sections_args, log, left, record, run_section
source scripts/gpu/sections.sh
sections_args "$@"
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
W=${WORK:-/tmp/kern-families}
OUTD=${OUT:-/tmp/kern-out}
RES=$W/results
LOGS=$W/logs
GGUF_DIR=${KERN_GGUF_DIR:-/tmp/kern-gguf}
TOK_DIR=/tmp/kern-tok
PARITY_SMALL=${PARITY_SMALL:-smollm2-135m,llama-3.2-1b,gemma-3-1b-sw48,mistral-7b-v0.1-sw64}
PARITY_LARGE=${PARITY_LARGE:-llama-3.1-8b-l8,mistral-7b-l8,gemma-3-4b-sw96,llama-3.2-1b-long}
STEPS_ARG=()
[[ -n ${STEPS:-} ]] && STEPS_ARG=(--steps "$STEPS")
DEVICE=${DEVICE:-cuda}  # torch device of the references (cpu: a plumbing run with scripts/gpu/parity_fake_kern.py as KERN)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# seconds a section needs to be started (its estimate; parity and serve stop starting shapes /
# models on their own before the budget ends)
declare -A NEED=([rope]=20 [parity-small]=120 [real]=100 [serve]=90 [parity-large]=150 [bench]=200 [real-qwen]=90)
declare -A EST=([rope]=20 [parity-small]=240 [real]=180 [serve]=150 [parity-large]=300 [bench]=240 [real-qwen]=90)

selftest() {
  local rc=0 f
  for f in scripts/gpu/*.py; do python3 -m py_compile "$f" || { echo "py_compile FAIL $f"; rc=1; }; done
  for f in scripts/gpu/*.sh; do bash -n "$f" || { echo "bash -n FAIL $f"; rc=1; }; done
  echo "== parity.py --selftest"; python3 scripts/gpu/parity.py --selftest | tail -n 1 || rc=1
  echo "== families.py selftest"; python3 scripts/gpu/families.py selftest | tail -n 1 || rc=1
  echo "== real_model.py --selftest"; python3 scripts/gpu/real_model.py --selftest | tail -n 1 || rc=1
  echo "== serve_families.py --selftest"; python3 scripts/gpu/serve_families.py --selftest | tail -n 1 || rc=1
  echo "== bench_table.py selftest"; python3 scripts/gpu/bench_table.py selftest | tail -n 1 || rc=1
  if python3 -c "import torch" 2>/dev/null; then
    echo "== torch_peer_families.py (tiny shapes, CPU)"
    python3 scripts/gpu/torch_peer_families.py tiny-llama:2:eager-cpu tiny-gemma:2:eager-cpu | grep -v error || rc=1
  else
    echo "== torch_peer_families.py: skipped (no torch here)"
  fi
  echo "families.sh --selftest: $([[ $rc == 0 ]] && echo PASS || echo FAIL)"
  return $rc
}
[[ $MODE == selftest ]] && { selftest; exit $?; }

# ---- the plan
IFS=, read -r -a SECS <<<"$SECTIONS"
for s in "${SECS[@]}"; do
  [[ -n ${EST[$s]:-} ]] || { echo "families.sh: unknown section '$s' (rope parity-small real serve parity-large bench real-qwen)" >&2; exit 2; }
done
cmd_of() {
  case $1 in
    rope) echo "python3 scripts/gpu/families.py rope --kern $K --kernels $KD --work $W/rope --json $RES/rope.json" ;;
    parity-small) echo "python3 scripts/gpu/parity.py --kern $K --kernels $KD --shapes $PARITY_SMALL ${STEPS_ARG[*]} --work $W/parity --budget BUDGET" ;;
    parity-large) echo "python3 scripts/gpu/parity.py --kern $K --kernels $KD --shapes $PARITY_LARGE ${STEPS_ARG[*]} --work $W/parity --budget BUDGET" ;;
    real) echo "python3 scripts/gpu/real_model.py --model smollm2-135m ...; python3 scripts/gpu/real_model.py --model gemma-3-270m --ref-tokenizer $TOK_DIR/gemma3-tokenizer ..." ;;
    real-qwen) echo "python3 scripts/gpu/real_model.py --model qwen2.5-coder-0.5b ..." ;;
    serve) echo "python3 scripts/gpu/serve_families.py --kern $K --kernels $KD --gguf-dir $GGUF_DIR --tok-dir $TOK_DIR --json $RES/serve.json --budget BUDGET" ;;
    bench) echo "ROWS=families OUT=$W/bench-out KERN=$K KERNELS=$KD WORK=$W/bench bash scripts/gpu/bench.sh" ;;
  esac
}
if [[ $MODE == dry ]]; then
  echo "families.sh --dry-run: budget $BUDGET s; sections in order:"
  total=0
  for s in "${SECS[@]}"; do
    total=$((total + EST[$s]))
    printf '  %-13s ~%4s s (starts with >= %s s left; cumulative ~%s s%s)\n      %s\n' "$s" "${EST[$s]}" "${NEED[$s]}" "$total" \
      "$([[ $total -gt $BUDGET ]] && echo ', PAST THE BUDGET: another call')" "$(cmd_of "$s")"
  done
  echo "carried / staged here:"
  for p in "$K" "$KD/rowwise.sm_90a.cubin" .carry/fam/llama3-tokenizer.tgz .carry/fam/gemma3-tokenizer.tgz .carry/torch_peer.py; do
    [[ -e $p ]] && echo "  ok      $p ($(du -sh "$p" | cut -f1))" || echo "  MISSING $p"
  done
  n=$(ls .whl/families/*.whl 2>/dev/null | wc -l); echo "  $([[ $n -gt 0 ]] && echo 'ok     ' || echo MISSING) .whl/families ($n wheels)"
  for set in families qwen; do
    [[ -f build/stage/$set/SHA256SUMS ]] && echo "  ok      build/stage/$set: $(ls build/stage/$set/part.* | wc -l) parts" || echo "  -       build/stage/$set (stage.sh prepare $set)"
  done
  echo "  carry size: $(du -csh .carry "$KD" .whl 2>/dev/null | tail -n 1 | cut -f1) (+ the working tree; at most 64 MiB a call)"
  bash scripts/gpu/stage.sh status 2>/dev/null | sed 's/^/  /'
  exit 0
fi

# ---- setup: checked before anything runs
rm -rf "$RES" "$LOGS"
mkdir -p "$RES" "$LOGS" "$OUTD" "$TOK_DIR"
: >"$RES/sections.tsv"
[[ -x $K ]] || { echo "families.sh: $K is not executable: run scripts/gpu/prepare-carry.sh where cargo is and carry .carry" >&2; exit 2; }
[[ -d $KD ]] || { echo "families.sh: $KD missing: bash packs/kernels/build.sh and carry build/packs" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1 | head -n 2
df -h /tmp | tail -n 1
if ! python3 -c "import gguf, openai" 2>/dev/null; then
  if ls .whl/families/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/families/*.whl >"$LOGS/pip.log" 2>&1 \
      || log "pip install of .whl/families failed (see $LOGS/pip.log)"
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
python3 -c "import gguf, openai, transformers, torch; print('python', __import__('sys').version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'openai', openai.__version__, 'gguf', gguf.__file__)" 2>&1 | tail -n 1
for t in llama3-tokenizer gemma3-tokenizer; do
  if [[ -f .carry/fam/$t.tgz && ! -f $TOK_DIR/$t/tokenizer.json ]]; then mkdir -p "$TOK_DIR/$t" && tar -xzf .carry/fam/$t.tgz -C "$TOK_DIR/$t"; fi
done
staged=""
if bash scripts/gpu/stage.sh assemble families >"$LOGS/stage.log" 2>&1; then staged=families; fi
log "GGUFs: $([[ -n $staged ]] && echo "assembled in $GGUF_DIR" || echo "not staged ($(tail -n 1 "$LOGS/stage.log"))")"

real_models() {  # MODEL...: one real_model.py per model, each only with time for it
  local m ok=0 l
  for m in "$@"; do
    l=$(left)
    if [[ $l -lt 60 ]]; then echo "real_model $m: not started (${l} s left)"; ok=1; continue; fi
    args=(--model "$m" --kern "$K" --kernels "$KD" --work "$W/real-$m" --json "$RES/real-$m.json" --txt "$RES/real-$m.txt" --steps "${REAL_STEPS:-64}" --device "$DEVICE")
    [[ $m == gemma-3-270m ]] && args+=(--ref-tokenizer "$TOK_DIR/gemma3-tokenizer")
    for x in ${REAL_PACK_ARGS:-}; do args+=("--pack-arg=$x"); done
    REAL_LOGS=$LOGS/real-$m-kern timeout --signal=TERM --kill-after=20 "$l" python3 scripts/gpu/real_model.py "${args[@]}" || ok=1
  done
  return $ok
}

for s in "${SECS[@]}"; do
  case $s in
    rope) run_section rope python3 scripts/gpu/families.py rope --kern "$K" --kernels "$KD" --work "$W/rope" --json "$RES/rope.json" ;;
    parity-small|parity-large)
      shapes=$PARITY_SMALL; [[ $s == parity-large ]] && shapes=$PARITY_LARGE
      # parity.py starts no new shape after its --budget: leave ~90 s for the one in flight.
      pb=$(( $(left) - 90 )); [[ $pb -lt 1 ]] && pb=1
      run_section "$s" env PARITY_JSON="$RES/$s.json" PARITY_TXT="$RES/$s.txt" PARITY_LOGS="$LOGS/$s-kern" \
        python3 scripts/gpu/parity.py --kern "$K" --kernels "$KD" --shapes "$shapes" "${STEPS_ARG[@]}" --work "$W/parity" --budget "$pb" --device "$DEVICE" ;;
    real|real-qwen)
      if [[ $s == real-qwen ]]; then
        if bash scripts/gpu/stage.sh assemble qwen >>"$LOGS/stage.log" 2>&1; then run_section "$s" real_models qwen2.5-coder-0.5b
        else record "$s" skipped "" 0 "the qwen GGUF is not staged (stage.sh prepare qwen; put qwen N)"; fi
      elif [[ -n $staged ]]; then run_section "$s" real_models smollm2-135m gemma-3-270m
      else record "$s" skipped "" 0 "the GGUFs are not staged (stage.sh put families N for each part, right before this call)"; fi ;;
    serve)
      only=llama-1b,gemma-1b
      [[ -n $staged ]] && only=smollm2,gemma-270m,llama-1b,gemma-1b
      sb=$(( $(left) - 45 )); [[ $sb -lt 1 ]] && sb=1
      run_section serve python3 scripts/gpu/serve_families.py --kern "$K" --kernels "$KD" --only "$only" --gguf-dir "$GGUF_DIR" \
        --tok-dir "$TOK_DIR" --work "$W/serve" --json "$RES/serve.json" --budget "$sb"
      [[ -z $staged ]] && record serve-gguf skipped "" 0 "the GGUFs are not staged: SmolLM2 / Gemma 3 270M not served" ;;
    bench)
      run_section bench env ROWS=families OUT="$W/bench-out" KERN="$K" KERNELS="$KD" WORK="$W/bench" bash scripts/gpu/bench.sh
      [[ -d $W/bench-out/bench ]] && cp -r "$W/bench-out/bench" "$RES/bench" ;;
  esac
done

# ---- results: the table last
python3 - "$RES/sections.tsv" "$RES/sections.json" <<'PY'
import json, sys
out = {}
for line in open(sys.argv[1]):
    name, state, rc, secs, why = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    out[name] = {"state": state, "rc": int(rc) if rc not in ("", "-") else None, "seconds": int(secs or 0), "why": why}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
tar -czf "$OUTD/families-logs.tgz" -C "$W" results logs 2>/dev/null
if [[ $(stat -c %s "$OUTD/families-logs.tgz") -gt 15000000 ]]; then  # a file comes back up to 16 MiB
  tar -czf "$OUTD/families-logs.tgz" -C "$W" results --exclude='*-kern' logs
fi
echo
echo "== families ($((SECONDS - T0)) s of a $BUDGET s budget; sections: $SECTIONS; logs in $OUTD/families-logs.tgz)"
python3 scripts/gpu/families.py summary "$RES" --out "$OUTD/families.txt" --json "$OUTD/families.json"
