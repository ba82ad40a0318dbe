#!/usr/bin/env bash
# Build what the GPU machine runs (it has no cargo) into .carry/ (gitignored): the release kern
# binary (stripped), the injection library, the kern-cuda example, and the test fixtures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --locked -p kern -p kern-cuda --bins --examples
[[ -d crates/kern-inject ]] && cargo build --release --locked -p kern-inject
rm -rf .carry && mkdir -p .carry
strip -o .carry/kern target/release/kern
strip -o .carry/vecadd-example target/release/examples/vecadd
[[ -f target/release/libkern_inject.so ]] && strip -o .carry/libkern_inject.so target/release/libkern_inject.so
cp -r build/fixtures .carry/fixtures
du -sh .carry
