#!/usr/bin/env bash
# Build the GPU-binary fixtures that kern-binary's golden tests read (no GPU needed).
#
#   scripts/build-fixtures.sh            # into build/fixtures (gitignored)
#
# Environment:
#   KERN_CUDA_VENV  venv holding the pinned PyPI CUDA compiler + Triton
#                   (default: <repo>/.venv-cuda, created by scripts/setup-toolchain.sh)
#   KERN_FIXTURES   output directory (default: <repo>/build/fixtures)
#
# Sources live in tests/fixtures/. For every cubin / fatbin / host ELF produced, the script also
# writes cuobjdump's view of it, which the golden tests compare kern-binary against:
#   FILE.cuobjdump.txt   cuobjdump -elf FILE        (every embedded ELF: sections, symtab, .nv.info)
#   FILE.res-usage.txt   cuobjdump -res-usage FILE  (REG / STACK / SHARED per function)
#   FILE.symbols.txt     cuobjdump -symbols FILE    (STT_FUNC STB_GLOBAL STO_ENTRY NAME ...)
#   FILE.list.txt        cuobjdump -lelf -lptx FILE (fatbins and host ELFs: the entries)
# The output directory is rebuilt from scratch each run (built in a staging directory, then
# swapped in), so the script is idempotent and never leaves a half-built set behind.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$REPO/tests/fixtures"
VENV="${KERN_CUDA_VENV:-$REPO/.venv-cuda}"
OUT="${KERN_FIXTURES:-$REPO/build/fixtures}"

die() {
    echo "build-fixtures: error: $*" >&2
    exit 1
}

# ------------------------------------------------------------------ toolchain
[[ -d "$VENV" ]] || die "no CUDA venv at $VENV (set KERN_CUDA_VENV, or run scripts/setup-toolchain.sh first)"
shopt -s nullglob
cands=("$VENV"/lib/python3.*/site-packages/nvidia/cu13)
shopt -u nullglob
[[ ${#cands[@]} -ge 1 ]] || die "no nvidia/cu13 package in $VENV (run scripts/setup-toolchain.sh first)"
NV="${cands[0]}"
NVCC="$NV/bin/nvcc"
CUOBJDUMP="$NV/bin/cuobjdump"
PY="$VENV/bin/python"
[[ -x "$NVCC" ]] || die "nvcc missing at $NVCC (run scripts/setup-toolchain.sh first)"
[[ -x "$CUOBJDUMP" ]] || die "cuobjdump missing at $CUOBJDUMP (run scripts/setup-toolchain.sh first)"
[[ -x "$PY" ]] || die "python missing at $PY (run scripts/setup-toolchain.sh first)"
[[ -f "$NV/lib/libcudart_static.a" ]] || die "libcudart_static.a missing in $NV/lib (run scripts/setup-toolchain.sh first)"
export PATH="$NV/bin:$PATH"

# ------------------------------------------------------------------ staging
mkdir -p "$(dirname "$OUT")"
STAGE="$(mktemp -d "${OUT%/}.staging.XXXXXX")"
WORK="$(mktemp -d)"
cleanup() { rm -rf "$STAGE" "$WORK"; }
trap cleanup EXIT
export TMPDIR="$WORK"

# Run commands in the background; `wait_all` fails if any failed (with its log).
pids=()
names=()
bg() {
    local name="$1"
    shift
    ("$@") >"$WORK/$name.log" 2>&1 &
    pids+=("$!")
    names+=("$name")
}
wait_all() {
    local i failed=0
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            echo "build-fixtures: step '${names[$i]}' failed:" >&2
            sed 's/^/    /' "$WORK/${names[$i]}.log" >&2
            failed=1
        fi
    done
    pids=()
    names=()
    [[ $failed -eq 0 ]] || die "build failed"
}

S="$STAGE"
cd "$STAGE"
OPT=(-O3)
# Whole-program cubins / PTX for one SM.
cubin() { "$NVCC" -cubin -arch="$2" "${OPT[@]}" -o "$3" "$SRC/$1"; }
ptx() { "$NVCC" -ptx -arch="$2" "${OPT[@]}" -o "$3" "$SRC/$1"; }
G90=(-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90)

# ------------------------------------------------------------------ vecadd.cu
bg vecadd.cubin cubin vecadd.cu sm_90 "$S/vecadd.sm_90.cubin"
bg vecadd.ptx ptx vecadd.cu sm_90 "$S/vecadd.sm_90.ptx"
bg vecadd.fatbin "$NVCC" -fatbin "${G90[@]}" --compress-mode=none -o "$S/vecadd.fatbin" "$SRC/vecadd.cu"
# zstd (entry flag 0x8000): --compress-mode=size; -compress-all so the small ELF is compressed too.
bg vecadd.zstd "$NVCC" -fatbin "${G90[@]}" --compress-mode=size -Xfatbin -compress-all \
    -o "$S/vecadd.zstd.fatbin" "$SRC/vecadd.cu"
# LZ4 (entry flag 0x2000): --compress-mode=speed; alone it compresses only the PTX entry,
# -compress-all makes fatbinary compress the ELF entry as well.
bg vecadd.lz4 "$NVCC" -fatbin "${G90[@]}" --compress-mode=speed -Xfatbin -compress-all \
    -o "$S/vecadd.lz4.fatbin" "$SRC/vecadd.cu"
bg vecadd.multi "$NVCC" -fatbin --compress-mode=none \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_80,code=compute_80 \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -gencode arch=compute_90a,code=sm_90a \
    -o "$S/vecadd.multi.fatbin" "$SRC/vecadd.cu"
# Host shared object, linked by nvcc: its .nv_fatbin holds two containers (nvlink's empty
# device-link images for sm_80/sm_90, then VecAdd's sm_80 + sm_90 SASS + zstd compute_90 PTX).
bg libvecadd.so "$NVCC" -shared -Xcompiler -fPIC -cudart static -L"$NV/lib" \
    -gencode arch=compute_80,code=sm_80 "${G90[@]}" -o "$S/libvecadd.so" "$SRC/vecadd.cu"
wait_all

# Host shared object built the way PyTorch extensions are (nvcc -c, host compiler links):
# one container, one SASS entry per SM plus one PTX entry.
bg libvecadd_ext.so bash -c '"$1" -c -Xcompiler -fPIC -gencode arch=compute_80,code=sm_80 \
        -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
        -o "$3/vecadd_ext.o" "$4/vecadd.cu" &&
    g++ -shared -o "$2/libvecadd_ext.so" "$3/vecadd_ext.o" -L"$5/lib" -lcudart_static -ldl -lpthread -lrt' \
    _ "$NVCC" "$S" "$WORK" "$SRC" "$NV"
# Host executable (default nvcc path: device code embedded in the host binary).
bg vecadd.exe "$NVCC" -cudart static -L"$NV/lib" "${G90[@]}" -o "$S/vecadd" "$SRC/vecadd.cu"

# ------------------------------------------------------------------ mixed.cu
bg mixed.cubin cubin mixed.cu sm_90 "$S/mixed.sm_90.cubin"
bg mixed.ptx ptx mixed.cu sm_90 "$S/mixed.sm_90.ptx"
wait_all
# nvcc's default compression: PTX entry zstd-compressed, ELF entry stored raw.
bg mixed.fatbin "$NVCC" -fatbin "${G90[@]}" "${OPT[@]}" -o "$S/mixed.fatbin" "$SRC/mixed.cu"
# Relocatable device code (ET_REL): the __noinline__ helpers become STB_GLOBAL functions
# without STO_ENTRY, which must not be reported as kernels.
bg mixed.rdc "$NVCC" -cubin -rdc=true -arch=sm_90 "${OPT[@]}" -o "$S/mixed.rdc.sm_90.cubin" "$SRC/mixed.cu"

# ------------------------------------------------------------------ selftest.cu (GPU suite)
# Kernels for `kern selftest` on the GPU machine (parameter echo, bucket/graph checks, a
# deliberate out-of-bounds write); the host tests only check that they read back.
bg selftest.cubin cubin selftest.cu sm_90 "$S/selftest.sm_90.cubin"

# ------------------------------------------------------------------ vllm_rms_norm.cu
bg vllm.cubin cubin vllm_rms_norm.cu sm_90 "$S/vllm_rms_norm.sm_90.cubin"
bg vllm.ptx ptx vllm_rms_norm.cu sm_90 "$S/vllm_rms_norm.sm_90.ptx"
wait_all

# ------------------------------------------------------------------ CUDA 12 style cubins (ELF ABI 7)
# Triton bundles ptxas 12.8, which writes the older cubin header (EI_ABIVERSION 7: SM in
# e_flags & 0xff, `a` as e_flags bit 0x800). Most prebuilt CUDA 12 kernels look like this.
# nvcc 13's PTX is ISA 9.0; VecAdd uses nothing newer than ISA 8.7, so lower the directive.
shopt -s nullglob
tp=("$VENV"/lib/python3.*/site-packages/triton/backends/nvidia/bin/ptxas)
shopt -u nullglob
[[ ${#tp[@]} -ge 1 && -x "${tp[0]}" ]] || die "triton's bundled ptxas missing in $VENV (run scripts/setup-toolchain.sh first)"
for a in sm_80 sm_90 sm_90a; do
    sed -e 's/^\.version .*/.version 8.7/' -e "s/^\.target .*/.target $a/" "$S/vecadd.sm_90.ptx" >"$WORK/vecadd.isa87.$a.ptx"
    bg "ptxas128.$a" "${tp[0]}" -arch="$a" -o "$S/vecadd.ptxas128.$a.cubin" "$WORK/vecadd.isa87.$a.ptx"
done
wait_all

# ------------------------------------------------------------------ Triton (AOT, no GPU)
mkdir -p "$WORK/triton-cache"
# No line info: it embeds the absolute source path, which would make the cubin (and its
# sha256 in the test manifests) depend on where the repository is checked out.
TRITON_DISABLE_LINE_INFO=1 TRITON_CACHE_DIR="$WORK/triton-cache" "$PY" "$SRC/triton_kernels.py" "$S" >"$WORK/triton.log" 2>&1 ||
    { sed 's/^/    /' "$WORK/triton.log" >&2; die "triton_kernels.py failed"; }

# ------------------------------------------------------------------ derived files
head -c 300 "$S/vecadd.sm_90.cubin" >"$S/vecadd.truncated.cubin"

name=$(
    "$CUOBJDUMP" -symbols "$S/vllm_rms_norm.sm_90.cubin" | awk '/STO_ENTRY/ {print $NF}'
)
want='_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii'
[[ "$name" == "$want" ]] || die "vllm_rms_norm.sm_90.cubin: entry is '$name', want '$want'"

dump() {
    local f="$1"
    "$CUOBJDUMP" -elf "$f" >"$f.cuobjdump.txt"
    "$CUOBJDUMP" -res-usage "$f" >"$f.res-usage.txt"
    "$CUOBJDUMP" -symbols "$f" >"$f.symbols.txt"
    case "$f" in
        *.cubin) ;;
        *) "$CUOBJDUMP" -lelf -lptx "$f" >"$f.list.txt" ;;
    esac
}
for f in *.cubin *.fatbin *.so vecadd; do
    [[ "$f" == *.truncated.cubin ]] && continue
    bg "dump.$f" dump "$f"
done
wait_all

{
    echo "# kern-binary fixtures, built by scripts/build-fixtures.sh"
    echo "nvcc: $("$NVCC" --version | tail -n 2 | tr '\n' ' ')"
    echo "cuobjdump: $("$CUOBJDUMP" --version | tail -n 1)"
    echo "triton: $("$PY" -c 'import triton; print(triton.__version__)')"
    echo "files:"
    ls -1 | grep -v '^BUILD-INFO' | sed 's/^/  /'
} >"$S/BUILD-INFO.txt"

# ------------------------------------------------------------------ swap in
cd "$REPO"
rm -rf "$OUT"
mv "$STAGE" "$OUT"
chmod 755 "$OUT"
echo "build-fixtures: $(find "$OUT" -maxdepth 1 -type f | wc -l) files in $OUT"
