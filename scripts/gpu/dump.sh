#!/usr/bin/env bash
# `kern dump` on the GPU machine (issue 8): capture a CUDA C VecAdd (seed §5's log) and a
# PyTorch Qwen3 program (eager, and with a CUDA graph), check every dumped image with
# `kern inspect`, measure the slowdown against the same programs run plain, and try the bad
# cases. Prints a short table last.
#
#   scripts/gpu/prepare-carry.sh                      # here: release kern + libkern_inject.so
#   bash scripts/gpu/dump.sh                          # there, from the repository root
#
# Settings (environment): KERN (default .carry/kern), INJECT (default .carry/libkern_inject.so),
# KERN_DUMP_OUT (default /tmp/kern-dump-gpu), LAYERS (28), REPEATS (3 timed iterations after a cold one).
#
# Needs there: nvcc (13.0), python3 with torch + transformers, a CUPTI 13 (toolkit or the
# nvidia-cuda-cupti wheel; found automatically, or set KERN_CUPTI_LIB). Builds nothing Rust.
set -uo pipefail

KERN=${KERN:-${KERN_CARRY:-.carry}/kern}
INJECT=${INJECT:-${KERN_CARRY:-.carry}/libkern_inject.so}
[ -x "$KERN" ] || { echo "dump.sh: no kern binary at $KERN (set KERN=...)"; exit 2; }
[ -f "$INJECT" ] || { echo "dump.sh: no injection library at $INJECT (set INJECT=...)"; exit 2; }
# Not $OUT: the device tool sets that to the folder whose files come back.
OUT=${KERN_DUMP_OUT:-/tmp/kern-dump-gpu}
LAYERS=${LAYERS:-28}
REPEATS=${REPEATS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
KERN=$(readlink -f "$KERN")
export KERN_INJECT_LIB=$(readlink -f "$INJECT")
export PYTHONUNBUFFERED=1
rm -rf "$OUT" && mkdir -p "$OUT"
cd "$OUT"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }

echo "== environment"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
nvcc --version | tail -1
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
if [ -z "${KERN_CUPTI_LIB:-}" ]; then
    wheel_cupti=$(python3 - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    for root in nvidia.__path__:
        for p in sorted(glob.glob(os.path.join(root, "*", "lib", "libcupti.so.13*"))):
            print(p); raise SystemExit
except ImportError:
    pass
EOF
)
    for c in /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda/lib64/libcupti.so.13 \
             /usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13 $wheel_cupti; do
        if [ -e "$c" ]; then export KERN_CUPTI_LIB=$c; break; fi
    done
fi
echo "KERN_CUPTI_LIB=${KERN_CUPTI_LIB:-<none found: the injection library searches itself>}"
echo "(a process that already loaded a CUPTI, like PyTorch, keeps its own)"

# Counts from the traces themselves (independent of the CLI's summary format).
count() {
    python3 - "$1" <<'EOF'
import glob, json, os, sys
d = sys.argv[1]
n = dict(procs=0, modules=set(), launches=0, nodes=0, replays=0, kernels=set(), bad=0,
         attribution={}, errors=[])
for path in glob.glob(os.path.join(d, "trace.*.jsonl")):
    n["procs"] += 1
    for line in open(path, encoding="utf-8", errors="replace"):
        try:
            r = json.loads(line)
        except ValueError:
            n["bad"] += 1
            continue
        t = r.get("type")
        if t == "module":
            n["modules"].add(r["sha256"])
        elif t in ("launch", "graph_node"):
            n["launches" if t == "launch" else "nodes"] += 1
            n["kernels"].add(r["kernel"])
            a = r.get("attribution")
            n["attribution"][a] = n["attribution"].get(a, 0) + 1
        elif t == "graph_launch":
            n["replays"] += 1
        elif t == "note" and r.get("level") != "info":
            n["errors"].append(r["message"][:160])
print(json.dumps(dict(procs=n["procs"], modules=len(n["modules"]), launches=n["launches"],
                      graph_nodes=n["nodes"], graph_replays=n["replays"],
                      distinct_kernels=len(n["kernels"]), attribution=n["attribution"],
                      bad_lines=n["bad"], notes=n["errors"])))
EOF
}
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])$2)" "$1"; }

# Every dumped image must pass `kern inspect`.
inspect_all() {
    local dir=$1 ok=0 bad=0
    for f in "$dir"/modules/*; do
        [ -e "$f" ] || continue
        if "$KERN" inspect "$f" > "$f.inspect.txt" 2>&1; then ok=$((ok + 1)); else bad=$((bad + 1)); echo "inspect failed: $f"; tail -3 "$f.inspect.txt"; fi
    done
    echo "kern inspect: $ok passed, $bad failed in $dir/modules"
    [ "$bad" -eq 0 ] || fail "kern inspect failed on $bad image(s) of $dir"
    inspected=$((inspected + ok)); inspect_failed=$((inspect_failed + bad))
}
inspected=0
inspect_failed=0

echo
echo "== (a) VecAdd (seed §5)"
# The seed's VecAdd program (§3), as the fixtures hold it.
cp "$HERE/../../tests/fixtures/vecadd.cu" vecadd.cu || fail "no tests/fixtures/vecadd.cu"
nvcc -arch=sm_90 -o vecadd vecadd.cu || fail "nvcc vecadd"
t0=$(now); ./vecadd; rc=$?; t1=$(now)
vec_plain=$(secs "$t0" "$t1")
[ $rc -eq 0 ] || fail "vecadd plain exit $rc"
t0=$(now); KERN_DUMP_VERBOSE=1 "$KERN" dump --out "$OUT/dump-vecadd" -- ./vecadd; rc=$?; t1=$(now)
vec_dump=$(secs "$t0" "$t1")
[ $rc -eq 0 ] || fail "vecadd under kern dump exit $rc"
"$KERN" dump summary "$OUT/dump-vecadd" || fail "kern dump summary vecadd"
inspect_all "$OUT/dump-vecadd"
vec=$(count "$OUT/dump-vecadd")
echo "counts: $vec"
grep -h '"type":"launch"' "$OUT"/dump-vecadd/trace.*.jsonl | head -3
grep -q '"kernel":"_Z6VecAddPfS_S_"' "$OUT"/dump-vecadd/trace.*.jsonl || fail "no VecAdd launch recorded"
grep -q '"kernel":"_Z6VecAddPfS_S_".*"attribution":"function_module"' "$OUT"/dump-vecadd/trace.*.jsonl \
    || fail "VecAdd launch not attributed exactly"

echo
echo "== (a') VecAdd with CUDA_MODULE_LOADING=EAGER (modules load before any launch: attribution by deduction)"
CUDA_MODULE_LOADING=EAGER "$KERN" dump --out "$OUT/vecadd-eager" -- ./vecadd || fail "vecadd eager-loading exit $?"
vec_eager=$(count "$OUT/vecadd-eager")
echo "counts: $vec_eager"
inspect_all "$OUT/vecadd-eager"

echo
echo "== (b) Qwen3 (random weights, $LAYERS layers, prefill 32 + 8 decode steps), eager and CUDA graph"
declare -A plain_wall dump_wall plain_json dump_json counts
for mode in eager graph; do
    args=(python3 "$HERE/qwen3_dump_workload.py" --mode "$mode" --layers "$LAYERS" --repeats "$REPEATS")
    # The workload's last line is its JSON result; keep only that line from its output.
    t0=$(now); plain_json[$mode]=$("${args[@]}" | grep '^{"mode"' | tail -1); rc=$?; t1=$(now)
    plain_wall[$mode]=$(secs "$t0" "$t1")
    [ $rc -eq 0 ] || fail "qwen3 $mode plain exit $rc"
    t0=$(now); dump_json[$mode]=$("$KERN" dump --out "$OUT/qwen3-$mode" -- "${args[@]}" | grep '^{"mode"' | tail -1); rc=$?; t1=$(now)
    dump_wall[$mode]=$(secs "$t0" "$t1")
    [ $rc -eq 0 ] || fail "qwen3 $mode under kern dump exit $rc"
    echo "plain: ${plain_json[$mode]}"
    echo "dump:  ${dump_json[$mode]}"
    "$KERN" dump summary "$OUT/qwen3-$mode" || fail "kern dump summary qwen3-$mode"
    inspect_all "$OUT/qwen3-$mode"
    counts[$mode]=$(count "$OUT/qwen3-$mode")
    echo "counts: ${counts[$mode]}"
    same=$(python3 -c "import json,sys; a,b=(json.loads(x) for x in sys.argv[1:]); print(a['tokens']==b['tokens'])" "${plain_json[$mode]}" "${dump_json[$mode]}" 2>/dev/null)
    echo "generated tokens identical with and without injection: $same"
done
[ "$(field "${counts[graph]}" "['graph_replays']")" -gt 0 ] 2>/dev/null || fail "no graph replay recorded in graph mode"

echo
echo "== (c) bad cases"
"$KERN" dump --out "$OUT/bad-notfound" -- kern-no-such-command-xyz; rc=$?
echo "-> exit $rc (expect non-zero and '\`kern-no-such-command-xyz\`: command not found (searched PATH)')"
[ $rc -ne 0 ] || fail "command not found gave exit 0"
"$KERN" dump --out "$OUT/bad-exit7" -- sh -c 'exit 7'; rc=$?
echo "-> exit $rc (expect 7)"
[ $rc -eq 7 ] || fail "exit code not passed through ($rc)"
"$KERN" dump --out /proc/kern-dump-not-writable -- true; rc=$?
echo "-> exit $rc (expect non-zero, 'not writable')"
[ $rc -ne 0 ] || fail "unwritable out dir gave exit 0"
KERN_CUPTI_LIB=/nonexistent/libcupti.so.13 "$KERN" dump --out "$OUT/bad-nocupti" -- ./vecadd; rc=$?
echo "-> exit $rc (expect 0: the program runs untraced, with a [kern-dump] CUPTI message)"
[ $rc -eq 0 ] || fail "program failed when CUPTI is missing ($rc)"
KERN_INJECT_LIB=/nonexistent/libkern_inject.so "$KERN" dump --out "$OUT/bad-nolib" -- ./vecadd; rc=$?
echo "-> exit $rc (expect non-zero, 'injection library ... not found')"
[ $rc -ne 0 ] || fail "missing injection library gave exit 0"

echo
echo "== table"
python3 - "$vec" "$vec_plain" "$vec_dump" "${counts[eager]}" "${plain_wall[eager]}" "${dump_wall[eager]}" \
    "${plain_json[eager]}" "${dump_json[eager]}" "${counts[graph]}" "${plain_wall[graph]}" "${dump_wall[graph]}" \
    "${plain_json[graph]}" "${dump_json[graph]}" "$inspected" "$inspect_failed" "$failures" <<'EOF'
import json, sys
a = sys.argv[1:]
def row(name, c, pw, dw, pj=None, dj=None):
    c = json.loads(c)
    pw, dw = float(pw), float(dw)
    cold = steady = "-"
    if pj and dj:
        try:
            p, d = json.loads(pj), json.loads(dj)
            cold = f"{d['cold_s'] / p['cold_s']:.2f}x"
            steady = f"{d['steady_s'] / p['steady_s']:.2f}x ({p['steady_s']*1e3:.1f}->{d['steady_s']*1e3:.1f} ms)"
        except Exception:
            pass
    print(f"| {name:<13} | {c['procs']:>5} | {c['modules']:>7} | {c['launches']:>8} | {c['graph_nodes']:>6} | "
          f"{c['distinct_kernels']:>8} | {c['graph_replays']:>7} | {pw:>7.2f}s -> {dw:>6.2f}s ({dw / pw:.2f}x) | {cold:>6} | {steady} |")
    if c["attribution"]:
        print(f"|   attribution: {c['attribution']}  unreadable lines: {c['bad_lines']}  notes: {c['notes'][:2]}")
print("| program       | procs | modules | launches | nodes  | kernels  | replays | process wall, plain -> dump  | cold   | steady iteration (plain -> dump) |")
print("|---|---|---|---|---|---|---|---|---|---|")
row("vecadd", a[0], a[1], a[2])
row("qwen3 eager", a[3], a[4], a[5], a[6], a[7])
row("qwen3 graph", a[8], a[9], a[10], a[11], a[12])
print(f"kern inspect: {a[13]} images passed, {a[14]} failed;  script failures: {a[15]}")
EOF
echo "dumps are in $OUT"
exit $((failures > 0))
