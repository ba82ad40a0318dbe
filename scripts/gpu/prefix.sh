#!/usr/bin/env bash
# Prefix cache on the GPU machine: random-weight Qwen3-4B + the real tokenizer through two
# `kern serve`s (cache on / --no-prefix-cache), driven by scripts/gpu/prefix_check.py.
# Carry: .carry (kern, tok), build/packs. Prints a table last.
set -uo pipefail
K=${KERN:-.carry/kern}
W=${KERN_PREFIX_DIR:-/tmp/kern-prefix}
OUTD=${OUT:-/tmp/kern-out}
mkdir -p "$OUTD" "$W"
d=$W/qwen3-4b
if [[ ! -f $d/model.json ]]; then
  $K random-weights --preset qwen3-4b -o $d >/dev/null 2>&1 || { echo "random-weights failed"; exit 1; }
  cp .carry/tok/tokenizer.json .carry/tok/tokenizer_config.json $d/
  $K pack --config $d/config.json -o $d --kernels build/packs --max-tokens 2048 --max-seqs 128 --max-context 4096 >/dev/null || exit 1
fi
$K serve --model $d --port 8301 --max-batched-tokens 2000 --gpu-mem 0.4 > $W/cached.log 2>&1 & p1=$!
$K serve --model $d --port 8302 --max-batched-tokens 2000 --no-prefix-cache --gpu-mem 0.4 > $W/uncached.log 2>&1 & p2=$!
# (b) a small GPU pool (10 GiB in all: ~1 GiB of KV) with a 32 GiB host tier.
$K serve --model $d --port 8303 --max-batched-tokens 2000 --gpu-mem 10GiB --offload-gib 32 > $W/offload.log 2>&1 & p3=$!
for port in 8301 8302 8303; do
  for _ in $(seq 1 600); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.1; done
done
cat $W/cached.log $W/uncached.log $W/offload.log
python3 scripts/gpu/prefix_check.py http://127.0.0.1:8301 http://127.0.0.1:8302 $OUTD/prefix.json
rc=$?
python3 scripts/gpu/prefix_offload.py http://127.0.0.1:8303 http://127.0.0.1:8302 $OUTD/offload.json
rc2=$?
kill -TERM $p1 $p2 $p3; wait $p1 $p2 $p3
echo "prefix.sh: shared prefix rc=$rc, offload rc=$rc2"
exit $((rc + rc2))
