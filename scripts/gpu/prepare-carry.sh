#!/usr/bin/env bash
# Build what the GPU machine runs (it has no cargo) into .carry/ (gitignored): the release kern
# binary (stripped), the injection library, the kern-cuda example, the test fixtures, and for
# scripts/gpu/families.sh the Llama 3 / Gemma 3 tokenizer files (.carry/fam) and the PyTorch peer.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --locked -p kern -p kern-cuda --bins --examples
[[ -d crates/kern-inject ]] && cargo build --release --locked -p kern-inject
rm -rf .carry && mkdir -p .carry
strip -o .carry/kern target/release/kern
strip -o .carry/vecadd-example target/release/examples/vecadd
[[ -f target/release/libkern_inject.so ]] && strip -o .carry/libkern_inject.so target/release/libkern_inject.so
cp -r build/fixtures .carry/fixtures
# scripts/gpu/families.sh (issue 24): the Llama 3 and Gemma 3 tokenizer files — random-weight
# Llama / Gemma packs served with a real tokenizer, and Gemma 3's reference token ids — from
# scripts/fetch-test-data.sh's downloads, gzipped (~8 MB); the PyTorch peer beside them.
mkdir -p .carry/fam
for t in llama3-tokenizer gemma3-tokenizer; do
  if [[ -f build/test-data/$t/tokenizer.json && -f build/test-data/$t/tokenizer_config.json ]]; then
    tar -czf .carry/fam/$t.tgz -C build/test-data/$t tokenizer.json tokenizer_config.json
  else
    echo "prepare-carry: build/test-data/$t missing (bash scripts/fetch-test-data.sh): families.sh's serve and Gemma 3 checks need it" >&2
  fi
done
for p in ../shared/peers/torch_peer.py shared/peers/torch_peer.py; do [[ -f $p ]] && { cp "$p" .carry/; break; }; done
du -sh .carry .carry/*
