#!/usr/bin/env bash
# Build and run the host emulation of attention_decode.cu (no GPU): g++ with C++20 and pthreads.
#   bash packs/qwen3/tests/host_emu/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${TMPDIR:-/tmp}/kern-attention-decode-emu"
g++ -std=c++20 -O2 -pthread -w -I "$HERE" -include "$HERE/emu.h" -x c++ "$HERE/attention_decode_emu.cpp" "$HERE/attention_emu.cpp" -o "$OUT"
"$OUT"
