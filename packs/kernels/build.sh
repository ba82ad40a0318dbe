#!/usr/bin/env bash
# Build the packs' kernels: every packs/kernels/*.cu becomes
#   build/packs/<stem>.sm_90a.cubin     (the image the manifest loads)
#   build/packs/<stem>.sm_90a.ptx       (PTX of the same source, for reading and JIT)
#   build/packs/<stem>.resource.txt     (ptxas -v: registers, smem, stack, spills per entry)
# and a source with a `// KERN_PDL_VARIANT` line (in its first 40 lines) is built a second time
# with -DKERN_PDL into <stem>.pdl.sm_90a.cubin / .ptx / .resource.txt: every kernel first waits
# for its predecessor (griddepcontrol.wait), for packs made with `kern pack --pdl`.
# plus build/packs/SHA256SUMS (cubins and PTX) and BUILD-INFO.txt.
# The verification probes (packs/kernels/verify/k16_probe.cu: does a wgmma k16 step round like
# mma.sync m16n8k16?) are built the same way into build/packs/<stem>.sm_90a.cubin; no pack uses
# them (packs/kernels/verify/k16_probe.py does).
#
#   bash packs/kernels/build.sh            # idempotent; rebuilds everything (~seconds)
#
# Environment:
#   KERN_CUDA_VENV   venv with the pinned PyPI nvcc 13.0.88 (default <repo>/.venv-cuda, made by
#                    scripts/setup-toolchain.sh); NVCC=/path/to/nvcc overrides it; when neither
#                    exists, an `nvcc` on PATH is used (the GPU machine has 13.0.88 installed).
#   KERN_PACK_OUT    output directory (default <repo>/build/packs)
#   JOBS             parallel compiles (default 2)
#
# Flags: -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17, NO --use_fast_math by default
# (the numerics must match PyTorch's library functions). A source may add flags with a line
#   // KERN_NVCC_FLAGS: --use_fast_math -maxrregcount=128
# (read from its first 40 lines; documented in KERNELS.md).
# The output directory is built in a staging directory and swapped in, so a failed build never
# leaves a half-built set behind.
set -euo pipefail

PACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$PACK/../.." && pwd)"
SRC="$PACK"
OUT="${KERN_PACK_OUT:-$REPO/build/packs}"
JOBS="${JOBS:-2}"
ARCH=(-gencode arch=compute_90a,code=sm_90a)
BASE_FLAGS=(-O3 -std=c++17)
WANT_VERSION="13.0.88"

die() {
    echo "packs/kernels/build.sh: error: $*" >&2
    exit 1
}

# ------------------------------------------------------------------ compiler
if [[ -n "${NVCC:-}" ]]; then
    [[ -x "$NVCC" ]] || die "NVCC=$NVCC is not an executable"
else
    VENV="${KERN_CUDA_VENV:-$REPO/.venv-cuda}"
    shopt -s nullglob
    cands=("$VENV"/lib/python3.*/site-packages/nvidia/cu13/bin/nvcc)
    shopt -u nullglob
    if [[ ${#cands[@]} -ge 1 && -x "${cands[0]}" ]]; then
        NVCC="${cands[0]}"
    elif command -v nvcc >/dev/null 2>&1; then
        NVCC="$(command -v nvcc)"
    else
        die "nvcc not found: no venv at $VENV (run scripts/setup-toolchain.sh, or set KERN_CUDA_VENV), no NVCC=, and no nvcc on PATH"
    fi
fi
NVCC_VERSION="$("$NVCC" --version | sed -n 's/.*V\([0-9][0-9.]*\).*/\1/p' | tail -n 1)"
[[ -n "$NVCC_VERSION" ]] || die "$NVCC --version printed no version"
if [[ "$NVCC_VERSION" != "$WANT_VERSION" ]]; then
    echo "packs/kernels/build.sh: warning: nvcc $NVCC_VERSION, the pack is pinned to $WANT_VERSION (cubins will differ)" >&2
fi
# nvcc needs its own bin dir on PATH (ptxas, cudafe++, fatbinary)
export PATH="$(dirname "$NVCC"):$PATH"

# ------------------------------------------------------------------ sources
shopt -s nullglob
sources=("$SRC"/*.cu)
shopt -u nullglob
[[ ${#sources[@]} -ge 1 ]] || die "no kernels in $SRC"
shopt -s nullglob
probes=("$SRC"/verify/k16_probe.cu)
shopt -u nullglob

mkdir -p "$(dirname "$OUT")"
STAGE="$(mktemp -d "${OUT%/}.staging.XXXXXX")"
WORK="$(mktemp -d)"
cleanup() { rm -rf "$STAGE" "$WORK"; }
trap cleanup EXIT
export TMPDIR="$WORK"

extra_flags() {  # the source's own flags, from a `// KERN_NVCC_FLAGS:` line
    sed -n '1,40s#^[[:space:]]*//[[:space:]]*KERN_NVCC_FLAGS:[[:space:]]*##p' "$1" | head -n 1
}

pdl_variant() {  # whether the source asks for a -DKERN_PDL build too
    sed -n '1,40p' "$1" | grep -q '^[[:space:]]*//[[:space:]]*KERN_PDL_VARIANT'
}

compile_one() {  # compile_one SRC.cu [pdl]  -> cubin + ptx + resource.txt in $STAGE
    local src="$1" stem out extra
    stem="$(basename "$src" .cu)"
    out="$stem"
    extra="$(extra_flags "$src")"
    # shellcheck disable=SC2206
    local xf=($extra)
    if [[ "${2:-}" == pdl ]]; then
        out="$stem.pdl"
        xf+=(-DKERN_PDL)
    fi
    # Compile from the source directory with a relative path: nothing machine-specific ends up
    # in the outputs (checked by the reproducibility test in KERNELS.md).
    (
        cd "$(dirname "$src")"
        "$NVCC" -cubin "${ARCH[@]}" "${BASE_FLAGS[@]}" "${xf[@]}" -Xptxas -v \
            -o "$STAGE/$out.sm_90a.cubin" "$stem.cu" 2>"$STAGE/$out.resource.txt" ||
            { cat "$STAGE/$out.resource.txt"; exit 1; }
        "$NVCC" -ptx -arch=compute_90a "${BASE_FLAGS[@]}" "${xf[@]}" \
            -o "$STAGE/$out.sm_90a.ptx" "$stem.cu"
    )
}

# ------------------------------------------------------------------ parallel compile
t_start=$(date +%s.%N)
pids=()
names=()
failed=0
reap_one() {  # wait for the oldest job
    local pid="${pids[0]}" name="${names[0]}"
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
    if ! wait "$pid"; then
        echo "packs/kernels/build.sh: $name failed:" >&2
        sed 's/^/    /' "$WORK/$name.log" >&2
        failed=1
    fi
}
jobs_list=()
for src in "${sources[@]}"; do
    jobs_list+=("$src|")
    pdl_variant "$src" && jobs_list+=("$src|pdl")
done
for src in "${probes[@]}"; do
    jobs_list+=("$src|")
done
for job in "${jobs_list[@]}"; do
    src="${job%%|*}"
    variant="${job#*|}"
    name="$(basename "$src" .cu)${variant:+.$variant}"
    while [[ ${#pids[@]} -ge $JOBS ]]; do reap_one; done
    compile_one "$src" "$variant" >"$WORK/$name.log" 2>&1 &
    pids+=("$!")
    names+=("$name")
done
while [[ ${#pids[@]} -gt 0 ]]; do reap_one; done
[[ $failed -eq 0 ]] || die "build failed"

# ------------------------------------------------------------------ report
cd "$STAGE"
spills=""
for r in *.resource.txt; do
    if grep -Eq '[1-9][0-9]* bytes spill (stores|loads)' "$r"; then
        spills+=" ${r%.resource.txt}"
    fi
done
[[ -z "$spills" ]] || echo "packs/kernels/build.sh: warning: register spills in:$spills (see *.resource.txt)" >&2
sha256sum -- *.cubin *.ptx >SHA256SUMS
{
    echo "# kern pack kernels, built by packs/kernels/build.sh"
    echo "nvcc: $NVCC_VERSION"
    echo "flags: ${ARCH[*]} ${BASE_FLAGS[*]} (+ per-file KERN_NVCC_FLAGS)"
    for src in "${sources[@]}" "${probes[@]}"; do
        x="$(extra_flags "$src")"
        [[ -z "$x" ]] || echo "  $(basename "$src"): $x"
    done
    [[ ${#probes[@]} -eq 0 ]] || echo "verification probes (no pack uses them): ${probes[*]##*/}"
} >BUILD-INFO.txt

# ------------------------------------------------------------------ swap in
cd "$REPO"
rm -rf "$OUT"
mv "$STAGE" "$OUT"
chmod 755 "$OUT"
t_end=$(date +%s.%N)
awk -v n="${#sources[@]}" -v p="${#probes[@]}" -v o="$OUT" -v a="$t_start" -v b="$t_end" \
    'BEGIN { printf "packs/kernels/build.sh: %d sources (+ %d probe) -> %s (%.1f s)\n", n, p, o, b - a }'
