#!/usr/bin/env bash
# Real-model parity on the GPU machine (issue 14 item 5, issue 24): kern vs transformers on the
# same GGUF, for one model of scripts/gpu/real_model.py's table (default: Qwen2.5-Coder-0.5B-
# Instruct Q4_K_M; also smollm2-135m and gemma-3-270m). See real_model.py for what is checked;
# scripts/gpu/families.sh runs the SmolLM2 and Gemma 3 ones with everything else of issue 24.
#
# Carry (from the dev machine):
#   .carry/kern              release kern (scripts/gpu/prepare-carry.sh; .carry/fam: Gemma 3's
#                            tokenizer files, the reference for gemma-3-270m)
#   build/packs              the pack's cubins (packs/kernels/build.sh)
#   .whl/families            gguf wheel (transformers' GGUF loading; scripts/gpu/stage.sh wheels;
#                            .whl/real-model is taken too if it is there)
#   the GGUF: staged by scripts/gpu/stage.sh (prepare here; `put SET N` there, one part per call)
#   and assembled into /tmp/kern-gguf/ — or the Qwen file in 60 MB parts of
#   shared/tools/split-for-device in /tmp/stage/ as before — or KERN_GGUF=/path/to/file.gguf.
#
#   MODEL=smollm2-135m bash scripts/gpu/real_model.sh [extra real_model.py args]
#   python3 scripts/gpu/real_layers.py --gguf "$KERN_GGUF"   # afterwards: the error layer by layer (Qwen)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MODEL=${MODEL:-qwen2.5-coder-0.5b}
case $MODEL in
  qwen2.5-coder-0.5b) SET=qwen; FILE=qwen2.5-coder-0.5b-q4km.gguf ;;
  smollm2-135m) SET=families; FILE=SmolLM2-135M-Instruct.Q4_1.gguf ;;
  gemma-3-270m) SET=families; FILE=gemma-3-270m-q4_k_m.gguf ;;
  *) echo "real_model: unknown MODEL=$MODEL (qwen2.5-coder-0.5b, smollm2-135m, gemma-3-270m)" >&2; exit 2 ;;
esac
GGUF_DIR=${KERN_GGUF_DIR:-/tmp/kern-gguf}
GGUF="${KERN_GGUF:-$GGUF_DIR/$FILE}"
if [[ ! -f "$GGUF" ]]; then
  if ! bash scripts/gpu/stage.sh assemble "$SET"; then
    # The older staging of the Qwen file: split-for-device parts in /tmp/stage.
    STAGE="${KERN_GGUF_STAGE:-/tmp/stage}"
    if [[ $SET == qwen ]] && ls "$STAGE"/part.* >/dev/null 2>&1; then
      mkdir -p "$GGUF_DIR" && cat "$STAGE"/part.* > "$GGUF"
      [[ "$(sha256sum "$GGUF" | cut -d' ' -f1)" == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32" ]] \
        || { echo "real_model: $GGUF has the wrong SHA-256" >&2; exit 2; }
    else
      echo "real_model: no $GGUF and no staged parts (scripts/gpu/stage.sh)" >&2; exit 2
    fi
  fi
fi
if ! python3 -c "import gguf" 2>/dev/null; then
  python3 -m pip install --quiet --no-deps --no-index --no-compile --upgrade --target /tmp/site $(ls .whl/families/*.whl .whl/real-model/*.whl 2>/dev/null) \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import gguf, transformers; print('gguf', gguf.__file__, 'transformers', transformers.__version__)"
ARGS=()
if [[ $MODEL == gemma-3-270m ]]; then
  T=/tmp/kern-tok/gemma3-tokenizer
  [[ -f $T/tokenizer.json ]] || { mkdir -p "$T" && tar -xzf .carry/fam/gemma3-tokenizer.tgz -C "$T"; }
  ARGS+=(--ref-tokenizer "$T")
fi
python3 scripts/gpu/real_model.py --model "$MODEL" --gguf "$GGUF" --kern "${KERN:-.carry/kern}" --kernels build/packs "${ARGS[@]}" "$@"
