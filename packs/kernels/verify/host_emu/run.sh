#!/usr/bin/env bash
# Build and run the host emulations of attention_decode.cu, attention_prefill.cu and the fused decode
# GEMVs of gemm_skinny.cu (no GPU): g++ with C++20 and pthreads.
#   bash packs/kernels/verify/host_emu/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# A directory of its own: two runs at once (two checkouts) never overwrite each other's binaries.
BIN="$(mktemp -d "${TMPDIR:-/tmp}/kern-host-emu.XXXXXX")"
trap 'rm -rf "$BIN"' EXIT
OUT="$BIN/attention-decode-emu"
g++ -std=c++20 -O2 -pthread -w -I "$HERE" -include "$HERE/emu.h" -x c++ "$HERE/attention_decode_emu.cpp" "$HERE/attention_emu.cpp" -o "$OUT"
"$OUT"
# attention_prefill.cu (tensor-core prefill attention; ldmatrix / mma.sync emulated in emu.h) vs fp64 and attention_dD
OUT_PREFILL="$BIN/attention-prefill-emu"
g++ -std=c++20 -O2 -pthread -w -I "$HERE" -include "$HERE/emu.h" -x c++ "$HERE/attention_prefill_emu.cpp" "$HERE/attention_emu.cpp" -o "$OUT_PREFILL"
"$OUT_PREFILL"
# gemm_skinny.cu's fused decode GEMVs (mma.sync emulated in emu.h) vs rowwise.cu + gemv_bf16, bit for bit
OUT_GEMV="$BIN/gemv-fused-emu"
g++ -std=c++20 -O2 -pthread -w -I "$HERE" -include "$HERE/emu.h" -x c++ "$HERE/gemv_fused_emu.cpp" "$HERE/rowwise_emu.cpp" -o "$OUT_GEMV"
"$OUT_GEMV"
