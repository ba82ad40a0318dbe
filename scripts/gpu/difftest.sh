#!/usr/bin/env bash
# The GPU proof of `kern test a.json b.json` (issue 16), on random Qwen3 weights with real shapes:
#   (a) the pack's manifest against itself         -> exit 0, all equal, whole step within noise
#   (b) layer 5's add + RMSNorm split in two kernels -> exit 0, one 1:2 interval, equal
#       (and the reverse: split -> fused, one 2:1 interval, exit 0)
#   (c) layer 7's RMSNorm with epsilon 1.0         -> exit 1, first divergence = l7.input_norm
#   (d) the four decoder GEMMs on gemm_bf16        -> exit 0, kernels differ, timings shown
#   (e) examples/vecadd vs examples/so-extract     -> exit 0 (a manifest without a step ABI)
#   (f) --decode-fusion off (the default) vs the fused decode program (fp32 residual; issue 15)
#                                                   -> exit 0, 2:1 / 3:1 / 4:1 intervals per layer,
#                                                      logits identical (the fused GEMVs are bit-identical)
# Every case's text report is printed (head) and kept with its JSON under $WORK; the checks read
# the JSON. The last lines are a PASS/FAIL table; exit status 1 if any case fails.
#
# Needs (GPU machine, no cargo): .carry/kern (release build: scripts/gpu/prepare-carry.sh),
# build/packs with the pack's cubins INCLUDING elementwise.sm_90a.cubin and
# gemm_bf16.sm_90a.cubin (bash packs/kernels/build.sh), examples/ (in the tree), python3 (stdlib).
#   KERN=.carry/kern KERNELS=build/packs WORK=/tmp/kern-difftest PRESET=qwen3-0.6b
#   KERN_TEST_ARGS="--reps 10"   (added to every kern test; e.g. to make the run shorter)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
K=${KERN:-.carry/kern}
KD=${KERNELS:-build/packs}
W=${WORK:-/tmp/kern-difftest}
PRESET=${PRESET:-qwen3-0.6b}
M=$W/model

fail_setup() { echo "difftest.sh: SETUP FAILED: $*"; echo; echo "RESULT  setup  FAIL  ($*)"; exit 1; }

[[ -x $K ]] || fail_setup "$K is not an executable: run scripts/gpu/prepare-carry.sh where cargo is, carry .carry/"
for stem in rowwise rope attention sampling gemm_skinny gemm_wgmma gemm_bf16 elementwise; do
  [[ -f $KD/$stem.sm_90a.cubin ]] || fail_setup "$KD/$stem.sm_90a.cubin missing: run bash packs/kernels/build.sh and carry build/packs"
done
command -v python3 >/dev/null || fail_setup "python3 not found"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(nvidia-smi not available)"
"$K" --version

rm -rf "$W" && mkdir -p "$M"
echo "== random weights ($PRESET) and the pack's manifest in $M"
"$K" random-weights --preset "$PRESET" -o "$M" >"$W/setup.log" 2>&1 || { cat "$W/setup.log"; fail_setup "kern random-weights failed"; }
# --residual bf16: difftest_variants.py's split variant adds the residual with the bf16 add_inplace.
"$K" pack --config "$M/config.json" -o "$M" --kernels "$KD" --residual bf16 >>"$W/setup.log" 2>&1 || { cat "$W/setup.log"; fail_setup "kern pack failed"; }
python3 scripts/gpu/difftest_variants.py "$M" --kernels "$KD" || fail_setup "difftest_variants.py failed"
for v in self split bad-eps gemm; do
  "$K" check "$M/model.$v.json" >/dev/null 2>"$W/check.$v.err" || { cat "$W/check.$v.err"; fail_setup "kern check model.$v.json failed"; }
done
# (f): the pack with the fused decode GEMVs (fp32 residual) and the same without the fusion.
for v in fused unfused; do
  "$K" pack --config "$M/config.json" -o "$W/$v" --kernels "$KD" --decode-fusion "$([[ $v == fused ]] && echo on || echo off)" >>"$W/setup.log" 2>&1 ||
    { cat "$W/setup.log"; fail_setup "kern pack ($v) failed"; }
done

# run_case NAME A B [extra kern test args...]: text report to $W/NAME.txt, JSON to $W/NAME.json,
# exit code to $W/NAME.rc.
run_case() {
  local name=$1 a=$2 b=$3
  shift 3
  echo
  echo "================================================================ case $name: kern test $(basename "$a") $(basename "$b") $*"
  local t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout 540 "$K" test "$a" "$b" --json-out "$W/$name.json" "$@" ${KERN_TEST_ARGS:-} >"$W/$name.txt" 2>"$W/$name.err"
  local rc=$?
  echo "$rc" >"$W/$name.rc"
  echo "(exit $rc after $(( $(date +%s) - t0 )) s; full report $W/$name.txt, JSON $W/$name.json)"
  [[ $rc == 124 ]] && echo "TIMED OUT after 540 s"
  sed -n '1,60p' "$W/$name.txt"
  [[ $(wc -l <"$W/$name.txt") -gt 60 ]] && { echo "  [...]"; grep -A40 '^performance diff' "$W/$name.txt" | head -40; }
  [[ -s $W/$name.err ]] && { echo "-- stderr:"; tail -20 "$W/$name.err"; }
}

run_case self "$M/model.json" "$M/model.self.json" --weights "$M"
run_case split "$M/model.json" "$M/model.split.json" --weights "$M"
run_case fuse "$M/model.split.json" "$M/model.json" --weights "$M" --no-perf --no-kernel-diff
run_case bad-eps "$M/model.json" "$M/model.bad-eps.json" --weights "$M" --no-perf
run_case gemm "$M/model.json" "$M/model.gemm.json" --weights "$M"
run_case vecadd examples/vecadd/model.json examples/so-extract/model.json
run_case fused "$W/unfused/model.json" "$W/fused/model.json" --weights "$M"

echo
echo "================================================================ checks"
python3 - "$W" <<'PY'
import json, pathlib, sys
W = pathlib.Path(sys.argv[1])
rows = []

def load(name):
    rc = int((W / f"{name}.rc").read_text().strip()) if (W / f"{name}.rc").exists() else None
    try:
        j = json.loads((W / f"{name}.json").read_text())
    except Exception as e:  # no JSON: the run died before writing it
        j = {"_error": f"no JSON report ({e}); stderr: {(W / f'{name}.err').read_text()[-400:] if (W / f'{name}.err').exists() else ''}"}
    return rc, j

def check(case, what, ok, detail=""):
    rows.append((case, what, bool(ok), detail))

def common(case, j, rc, want_rc, kernel_diff=True):
    check(case, f"exit code {want_rc}", rc == want_rc, f"got {rc}; verdict {j.get('verdict')}; reason: {j.get('reason') or j.get('_error') or '-'}")
    if "_error" in j or j.get("verdict") == "incomparable" or j.get("matching") is None:
        return False
    if kernel_diff:
        ops = j.get("ops", [])
        ran = [o for o in ops if o.get("skipped") is None]
        check(case, "kernel diff ran for every paired op", bool(ran) and all(o["checks"] > 0 for o in ran),
              f"{len(ran)} of {len(ops)} ran; skipped: {[(o['op'], o['skipped']) for o in ops if o.get('skipped')]}")
    return True

def golden_steps(j):
    return [s for s in (j.get("precision") or {}).get("steps", []) if s["local_checked"] > 0]

def no_local_failures(case, j):
    g = golden_steps(j)
    check(case, "interval comparison ran (prefill + decode)", len(g) >= 2 or (case.endswith("vecadd") and len(g) >= 1), f"{[s['step'] for s in g]}")
    bad = [(s["step"], s["local_failures"], (s.get("first_local") or {}).get("a_calls")) for s in g if s["local_failures"]]
    check(case, "no interval beyond tolerance", not bad, f"{bad}")

def kernel_ok(case, j):
    f = [(o["op"], o["failures"], o.get("first_failure")) for o in j.get("ops", []) if o["failures"]]
    check(case, "kernel diff: no failures", not f, json.dumps(f)[:600])

def logits_ok(case, j, exact=False):
    p = j.get("precision") or {}
    l = p.get("logits") or {}
    check(case, "logits compared", l.get("positions", 0) > 0, f"{l}")
    if exact:
        check(case, "logits identical (KL 0, max |d| 0)", l.get("kl_max", 1) == 0 and l.get("max_abs", 1) == 0, f"KL max {l.get('kl_max')}, max abs {l.get('max_abs')}")
    check(case, "greedy tokens all agree" if exact else "greedy tokens: top-5 rule holds",
          (p.get("greedy_agree") == p.get("greedy_positions")) if exact else not p.get("logit_failures"),
          f"{p.get('greedy_agree')}/{p.get('greedy_positions')} agree; {p.get('greedy_first_disagreement')}; gates failed: {p.get('logit_failures')}")

def perf_rows(j):
    return [(s["step"], s["whole"]) for s in (j.get("perf") or {}).get("steps", [])]

# (a) itself
rc, j = load("self")
if common("a self", j, rc, 0):
    kernel_ok("a self", j)
    check("a self", "every op: same implementation, bit-exact", all(o["same_impl"] and o.get("worst") is None for o in j["ops"]),
          f"{[(o['op'], o.get('worst')) for o in j['ops'] if o.get('worst')]}"[:400])
    m = j["matching"]
    check("a self", "intervals 1:1 only", m["fused_or_split"] == [] and m["intervals"] == m["calls_a"], f"{m['intervals']} intervals, {m['calls_a']} calls")
    no_local_failures("a self", j)
    logits_ok("a self", j, exact=True)
    pr = perf_rows(j)
    check("a self", "whole step timed", len(pr) >= 2, f"{len(pr)} steps")
    for step, w in pr:
        r = w["b"]["median"] / w["a"]["median"] if w["a"]["median"] else float("nan")
        check("a self", f"whole step within noise ({step})", 0.9 <= r <= 1.1, f"A {1e3*w['a']['median']:.1f} us, B {1e3*w['b']['median']:.1f} us, B/A {r:.3f}, {w['class']}")

# (b) split, and the reverse
for case, name, kind, al, bl in [("b split", "split", "1:2", "l5.input_norm", "l5.residual_add, l5.input_norm"),
                                 ("b fuse (reverse)", "fuse", "2:1", "l5.residual_add, l5.input_norm", "l5.input_norm")]:
    rc, j = load(name)
    if common(case, j, rc, 0, kernel_diff=(name == "split")):
        kernel_ok(case, j)
        fs = j["matching"]["fused_or_split"]
        check(case, f"exactly one {kind} interval at layer 5", len(fs) == 1 and fs[0]["kind"] == kind and fs[0]["a_calls"] == al and fs[0]["b_calls"] == bl, f"{fs}")
        no_local_failures(case, j)
        logits_ok(case, j)

# (c) wrong epsilon in layer 7
rc, j = load("bad-eps")
if common("c bad-eps", j, rc, 1):
    kernel_ok("c bad-eps", j)
    d = j.get("first_divergence") or {}
    check("c bad-eps", "first divergence is l7.input_norm on both sides",
          d.get("a_calls") == "l7.input_norm" and d.get("b_calls") == "l7.input_norm" and d.get("b_ops") == "add_rms_norm_bad_eps",
          f"A {d.get('a_calls')} ({d.get('a_ops')}), B {d.get('b_calls')} ({d.get('b_ops')}), buffer {d.get('buffer')}, step {d.get('step')}")
    g = golden_steps(j)
    check("c bad-eps", "exactly one interval fails per compared step", g and all(s["local_failures"] == 1 for s in g),
          f"{[(s['step'], s['local_failures']) for s in g]}")

# (d) GEMM swap
rc, j = load("gemm")
if common("d gemm", j, rc, 0):
    kernel_ok("d gemm", j)
    differ = sorted(o["op"] for o in j["ops"] if not o["same_impl"])
    check("d gemm", "the four GEMM ops differ in implementation", differ == sorted(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]), f"{differ}")
    no_local_failures("d gemm", j)
    logits_ok("d gemm", j)
    shown = []
    for s in (j.get("perf") or {}).get("steps", []):
        for r in s["by_op"]:
            if r["name"] in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
                shown.append(f"{s['step']}: {r['name']} {1e3*r['a']['median']:.1f} -> {1e3*r['b']['median']:.1f} us ({r['class']})")
    check("d gemm", "GEMM timings shown per op", len(shown) >= 4, "; ".join(shown)[:900])

# (e) a manifest without a step ABI
rc, j = load("vecadd")
if common("e vecadd", j, rc, 0):
    kernel_ok("e vecadd", j)
    no_local_failures("e vecadd", j)

# (f) the fused decode program against the unfused one
rc, j = load("fused")
if common("f fused", j, rc, 0):
    kernel_ok("f fused", j)
    fs = j["matching"]["fused_or_split"]
    kinds = sorted({f["kind"] for f in fs})
    check("f fused", "fusion intervals: 2:1, 3:1 and 4:1 only", kinds == ["2:1", "3:1", "4:1"], f"{kinds}; {fs[:3]}")
    no_local_failures("f fused", j)
    logits_ok("f fused", j, exact=True)
    pr = perf_rows(j)
    for step, w in pr:
        r = w["b"]["median"] / w["a"]["median"] if w["a"]["median"] else float("nan")
        check("f fused", f"whole step timed ({step})", True, f"unfused {1e3*w['a']['median']:.1f} us, fused {1e3*w['b']['median']:.1f} us, B/A {r:.3f}, {w['class']}")

print()
print(f"{'case':<18} {'check':<52} result")
ok = True
for case, what, good, detail in rows:
    print(f"{case:<18} {what:<52} {'PASS' if good else 'FAIL'}" + ("" if good else f"   <- {detail}"))
    ok &= good
print()
for case, what, good, detail in rows:
    if good and detail and ("whole step" in what or "GEMM timings" in what or "first divergence" in what):
        print(f"  {case}: {detail}")
print(f"RESULT  difftest  {'PASS' if ok else 'FAIL'}  ({sum(g for _, _, g, _ in rows)}/{len(rows)} checks)")
sys.exit(0 if ok else 1)
PY
