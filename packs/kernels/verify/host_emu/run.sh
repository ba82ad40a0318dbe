#!/usr/bin/env bash
# Build and run the host emulations (no GPU; g++ with C++20; emu.h runs a CTA's threads as fibers):
#   attention-decode   attention_decode.cu + attention.cu (split decode, attention_dD; windows, D 64/128/256,
#                      batch invariance) vs fp64
#   attention-prefill  attention_prefill.cu (ldmatrix / mma.sync emulated) vs fp64 and attention_dD, windows, per-row invariance across schedules
#   gemv-fused         gemm_skinny.cu's fused decode GEMVs vs rowwise.cu + gemv_bf16, bit for bit
#   rope               rope.cu's qk_norm_rope (inv_freq table, cos_scale, adjacent pairs, Gemma's norm)
#   rowwise-ref        rowwise.cu vs transformers-order references (Gemma3RMSNorm, GeGLU, scaled embedding)
#   sampling           sampling.cu's sample_masked (the step ABI's token mask) vs sample with forbidden logits at -inf
#   gemv-gguf          gemv_gguf.cu: GGUF GEMVs vs fp64, batch invariance; dequant_* vs gguf-py's bits
#   fp8                gemm_fp8.cu (FP8 GEMVs, dequant, activation quantization) and gemm_fp8_wgmma.cu
#                      (W8A8 wgmma GEMM, wgmma emulated from its descriptors) vs the E4M3 definition / fp64
#   moe                moe.cu: router softmax / top-k vs PyTorch's order (bits), permutation vs a stable
#                      counting sort, grouped GEMMs vs fp64 (s = l, batch invariance), combine, the block
#   gdn                gdn.cu (Gated DeltaNet): conv1d + conv state across chunks, chunked and recurrent
#                      gated delta rule vs an fp64 recurrence (fp32 / bf16 states), gated RMSNorm
#   gdn-tc             the same with gdn.cu's chunk products on (emulated) tensor cores (GDN_TC 1)
#   gated              gated.cu (the hybrids' gated attention): qk_norm_rope_gated ([q | gate] rows, (1 + w) q/k
#                      norm, partial RoPE) vs transformers' order and rope.cu, attn_output_gate, gdn_split_proj
#                      (Qwen3-Next's per-key-head regrouping), shared_expert_gate_add, bit for bit
# JOBS (default 2) emulations build and run at once; each one's output is printed whole, in this
# order, with its time. Exit status 1 when any build or check fails.
#   bash packs/kernels/verify/host_emu/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
JOBS="${JOBS:-2}"
# A directory of its own: two runs at once (two checkouts) never overwrite each other's binaries.
BIN="$(mktemp -d "${TMPDIR:-/tmp}/kern-host-emu.XXXXXX")"
trap 'rm -rf "$BIN"' EXIT
CXX=(g++ -std=c++20 -O2 -w -I "$HERE" -include "$HERE/emu.h" -x c++)

NAMES=(attention-decode attention-prefill gemv-fused rope rowwise-ref sampling gemv-gguf moe fp8 gdn gdn-tc gated)
sources() {
    case "$1" in
        attention-decode) echo "attention_decode_emu.cpp attention_emu.cpp" ;;
        attention-prefill) echo "attention_prefill_emu.cpp attention_emu.cpp" ;;
        gemv-fused) echo "gemv_fused_emu.cpp rowwise_emu.cpp" ;;
        rope) echo "rope_emu.cpp" ;;
        rowwise-ref) echo "rowwise_ref_emu.cpp" ;;
        sampling) echo "sampling_emu.cpp" ;;
        gemv-gguf) echo "gemv_gguf_emu.cpp" ;;
        fp8) echo "fp8_emu.cpp fp8_wgmma_emu.cpp" ;;
        moe) echo "moe_emu.cpp rowwise_emu.cpp" ;;
        gdn) echo "gdn_emu.cpp" ;;
        gdn-tc) echo "gdn_tc_emu.cpp" ;;
        gated) echo "gated_emu.cpp" ;;
    esac
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs() { printf '%d.%d s' $(( $1 / 1000 )) $(( $1 % 1000 / 100 )); }

one() {  # build and run one emulation; its output, status and times go to $BIN/<name>.*
    local name="$1" t0 t1 srcs=()
    t0=$(now_ms)
    for s in $(sources "$name"); do srcs+=("$HERE/$s"); done
    if "${CXX[@]}" "${srcs[@]}" -o "$BIN/$name" > "$BIN/$name.out" 2>&1; then
        t1=$(now_ms)
        set +e
        "$BIN/$name" >> "$BIN/$name.out" 2>&1
        echo $? > "$BIN/$name.rc"
        set -e
        echo "build $(secs $(( t1 - t0 ))), run $(secs $(( $(now_ms) - t1 )))" > "$BIN/$name.time"
    else
        echo "BUILD FAILED" >> "$BIN/$name.out"
        echo 2 > "$BIN/$name.rc"
        echo "build failed" > "$BIN/$name.time"
    fi
}

T0=$(now_ms)
for name in "${NAMES[@]}"; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
    one "$name" &
done
wait
fail=()
for name in "${NAMES[@]}"; do
    echo "===== $name ($(cat "$BIN/$name.time"))"
    cat "$BIN/$name.out"
    [[ "$(cat "$BIN/$name.rc")" == 0 ]] || fail+=("$name")
done
if (( ${#fail[@]} )); then
    echo "===== host emulations: ${#NAMES[@]} run, ${#fail[@]} FAILED (${fail[*]}), $(secs $(( $(now_ms) - T0 ))) in all (JOBS=$JOBS)"
    exit 1
fi
echo "===== host emulations: ${#NAMES[@]} run, all passed, $(secs $(( $(now_ms) - T0 ))) in all (JOBS=$JOBS)"
