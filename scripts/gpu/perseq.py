"""Per-sequence state slots on the GPU (examples/perseq: a toy model whose per-sequence state is
the running sum of the sequence's token ids; see examples/perseq/perseq.cu).

    python3 scripts/gpu/perseq.py [--kern .carry/kern]

Runs `kern generate` on 12 prompts (more than the manifest's 8 sequences, so slots are reused
after sequences finish) with 7-token prefill chunks (the state carries across chunks), and
checks every generated token against the rule computed here. A slot shared by two running
sequences, not reset for a new one, or lost between chunks gives other tokens.
"""
import argparse, json, os, random, subprocess, sys, tempfile

from perseq_rule import rule

ap = argparse.ArgumentParser()
ap.add_argument("--kern", default=".carry/kern")
a = ap.parse_args()


rng = random.Random(3)
prompts = [[rng.randrange(1000) for _ in range(rng.randint(1, 40))] for _ in range(12)]
out = tempfile.mkdtemp()
args = [a.kern, "generate", "--model", "examples/perseq", "--max-tokens", "30", "--ignore-eos", "--chunk", "7", "--dump", out]
for p in prompts:
    args += ["--prompt-ids", ",".join(map(str, p))]
r = subprocess.run(args, capture_output=True, text=True)
print(r.stderr[-2000:])
if r.returncode != 0:
    print("FAIL kern generate", r.returncode)
    sys.exit(1)
got = json.load(open(os.path.join(out, "tokens.json")))["outputs"]
ok = 0
for i, (p, g) in enumerate(zip(prompts, got)):
    ctx, want = list(p), []
    for _ in range(30):
        t = rule(ctx)
        want.append(t)
        ctx.append(t)
    ok += g == want
    if g != want:
        print(f"FAIL prompt {i} ({len(p)} tokens): first difference at {next(j for j, (x, y) in enumerate(zip(g, want)) if x != y)}")
print(f"{'PASS' if ok == 12 else 'FAIL'} per-sequence state slots: {ok}/12 sequences exact (12 prompts, 8 slots, 7-token chunks)")
sys.exit(0 if ok == 12 else 1)
