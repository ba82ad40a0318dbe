#!/usr/bin/env bash
# Real-model parity on the GPU machine (issue 14 item 5): kern vs transformers on the same
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF. See scripts/gpu/real_model.py for what is checked.
#
# Carry (from the dev machine):
#   .carry/kern              release kern (scripts/gpu/prepare-carry.sh)
#   build/packs        the pack's cubins (packs/kernels/build.sh)
#   .whl/real-model          gguf-0.19.0 and accelerate wheels (transformers' GGUF loading needs
#                            both; installed with --no-deps: the machine reaches no registry)
#   the GGUF, in parts of 60 MB (shared/tools/split-for-device FILE DIR), staged into
#   /tmp/stage/ by earlier calls; this script reassembles them into $KERN_GGUF and checks the
#   SHA-256 (or set KERN_GGUF to a file already there).
#
#   bash scripts/gpu/real_model.sh [extra real_model.py args]
#   python3 scripts/gpu/real_layers.py --gguf "$KERN_GGUF"   # afterwards: the error layer by layer
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
GGUF="${KERN_GGUF:-/tmp/qwen2.5-coder-0.5b-q4km.gguf}"
SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
STAGE="${KERN_GGUF_STAGE:-/tmp/stage}"
if [[ ! -f "$GGUF" ]]; then
  ls "$STAGE"/part.* >/dev/null 2>&1 || { echo "real_model: no $GGUF and no parts in $STAGE" >&2; exit 2; }
  cat "$STAGE"/part.* > "$GGUF"
fi
[[ "$(sha256sum "$GGUF" | cut -d' ' -f1)" == "$SHA256" ]] || { echo "real_model: $GGUF has the wrong SHA-256" >&2; exit 2; }
if ! python3 -c "import gguf, accelerate" 2>/dev/null; then
  python3 -m pip install --quiet --no-deps --no-index .whl/real-model/*.whl
fi
python3 -c "import gguf, accelerate, transformers; print('gguf', gguf.__file__, 'transformers', transformers.__version__)"
python3 scripts/gpu/real_model.py --gguf "$GGUF" --kern "${KERN:-.carry/kern}" --kernels build/packs "$@"
