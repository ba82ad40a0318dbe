"""The prefix cache of a model with a per-sequence state, on the GPU (issue 30): examples/perseq
(a running sum of the sequence's token ids per slot) with `"snapshot": true` on its state.

    python3 scripts/gpu/perseq_snapshots.py [--kern .carry/kern]

Runs `kern generate` on 20 prompts sharing prefixes (more than the manifest's 8 sequences, so
later prompts are admitted after earlier ones cached their pages and snapshots), with the prefix
cache and without it, whole and in 7-token chunks, and checks every generated token against
the rule computed here. A snapshot restored into the wrong slot, taken at the wrong length, or
not restored gives other tokens; the run with the cache must also report cached prompt tokens
(its snapshots were saved and restored through GpuModel's device copies).
"""
import argparse, json, os, random, re, shutil, subprocess, sys, tempfile

from perseq_rule import rule

ap = argparse.ArgumentParser()
ap.add_argument("--kern", default=".carry/kern")
a = ap.parse_args()


model = tempfile.mkdtemp()
m = json.load(open("examples/perseq/model.json"))
m["states"]["sum"]["snapshot"] = True
json.dump(m, open(os.path.join(model, "model.json"), "w"), indent=1)
shutil.copy("examples/perseq/perseq.sm_90.cubin", model)
r = subprocess.run([a.kern, "check", os.path.join(model, "model.json")], capture_output=True, text=True)
print(r.stdout[-1500:], r.stderr[-1500:])
if r.returncode != 0 or "snapshots at cached page boundaries" not in r.stdout + r.stderr:
    print("FAIL kern check")
    sys.exit(1)

rng = random.Random(30)
base = [rng.randrange(1000) for _ in range(40)]
prompts = []
for i in range(20):
    k = i % 4
    if k == 0:
        prompts.append(list(base))  # the same prompt: hits at 32
    elif k == 1:
        prompts.append(base + [rng.randrange(1000) for _ in range(rng.randint(1, 30))])  # extends it
    elif k == 2:
        prompts.append(base[:rng.randint(1, 39)] + [rng.randrange(1000) for _ in range(5)])  # diverges
    else:
        prompts.append([rng.randrange(1000) for _ in range(rng.randint(1, 60))])
N = 20
fails = 0
for label, extra, want_cached in [("cache", [], True), ("cache, 7-token chunks", ["--chunk", "7"], True), ("no cache", ["--no-prefix-cache"], False)]:
    out = tempfile.mkdtemp()
    args = [a.kern, "generate", "--model", model, "--max-tokens", str(N), "--ignore-eos", "--dump", out] + extra
    for p in prompts:
        args += ["--prompt-ids", ",".join(map(str, p))]
    r = subprocess.run(args, capture_output=True, text=True)
    print(r.stderr[-1500:])
    if r.returncode != 0:
        print(f"FAIL kern generate ({label})", r.returncode)
        sys.exit(1)
    got = json.load(open(os.path.join(out, "tokens.json")))["outputs"]
    ok = 0
    for i, (p, g) in enumerate(zip(prompts, got)):
        ctx, want = list(p), []
        for _ in range(N):
            t = rule(ctx)
            want.append(t)
            ctx.append(t)
        ok += g == want
        if g != want:
            print(f"FAIL {label}: prompt {i} ({len(p)} tokens): first difference at {next(j for j, (x, y) in enumerate(zip(g, want)) if x != y)}")
    cached = int(re.search(r"prefix cache (\d+) of", r.stderr).group(1))
    good = ok == len(prompts) and (cached > 0) == want_cached
    fails += not good
    print(f"{'PASS' if good else 'FAIL'} {label}: {ok}/{len(prompts)} sequences exact, {cached} prompt tokens from the cache")
sys.exit(1 if fails else 0)
