#!/usr/bin/env bash
# Install the pinned CUDA compiler, cuobjdump and Triton from PyPI into <repo>/.venv-cuda, and
# the pinned `gguf` package (llama.cpp's gguf-py; its dequantizer is the reference that
# scripts/gen-gguf-quants.py records for kern's bit-exactness test).
# No GPU and no system CUDA toolkit are needed: kern's tests compile real kernels with these
# to cubins, PTX, fatbins and host .so files, and compare kern's readers with cuobjdump.
#
#   bash scripts/setup-toolchain.sh            # idempotent; ~1 GB installed
#
# The versions are pinned together: an unpinned nvcc resolves to a newer release whose PTX the
# GPU machine's driver (580, CUDA 13.0) may not JIT. See shared/notes/toolchain.md.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KERN_CUDA_VENV:-$REPO/.venv-cuda}"
PY="${PYTHON:-python3}"
PKGS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-cuobjdump==13.2.51
  triton==3.6.0
  gguf==0.19.0
)
STAMP="$VENV/.kern-toolchain"
WANT="${PKGS[*]}"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup-toolchain: $VENV is up to date"
  exit 0
fi
command -v "$PY" >/dev/null || { echo "setup-toolchain: error: $PY not found (need Python 3.9+ with venv)" >&2; exit 1; }
"$PY" -m venv "$VENV" || { echo "setup-toolchain: error: cannot create a venv at $VENV (on Debian: apt-get install python3-venv)" >&2; exit 1; }
"$VENV/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check "${PKGS[@]}"
NVCC=$(ls "$VENV"/lib/python3.*/site-packages/nvidia/cu13/bin/nvcc)
"$NVCC" --version | tail -2
echo "$WANT" > "$STAMP"
echo "setup-toolchain: installed into $VENV"
