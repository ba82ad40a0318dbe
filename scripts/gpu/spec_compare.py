"""Compares `kern generate` with and without speculative decoding (spec.sh, spec_real.sh).

usage: spec_compare.py DIR BATCH LABEL [MODE]

DIR holds plain-BATCH/ and MODE-BATCH/ (--dump directories; MODE defaults to `spec`) and
plain-BATCH.log, MODE-BATCH.log (kern generate's stderr). Prints one RESULT line: tokens
identical, decode speed, acceptance, tokens per sequence verification; exits 1 unless every
sequence's tokens are identical.
"""
import json, re, sys

w, b, label = sys.argv[1:4]
mode = sys.argv[4] if len(sys.argv) > 4 else "spec"
a = json.load(open(f"{w}/plain-{b}/tokens.json"))["outputs"]
s = json.load(open(f"{w}/{mode}-{b}/tokens.json"))["outputs"]
same = sum(x == y for x, y in zip(a, s))
firsts = [next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), None) for x, y in zip(a, s)]
rate = lambda f: float(re.search(r"decode \d+ tokens in \d+ steps, ([\d.]+) tok/s", open(f).read()).group(1))
acc = re.search(r"(\d+) of (\d+) draft tokens accepted \(([\d.]+)%\) in (\d+) sequence verifications", open(f"{w}/{mode}-{b}.log").read())
r0, r1 = rate(f"{w}/plain-{b}.log"), rate(f"{w}/{mode}-{b}.log")
accepted, drafted, pct, verifies = int(acc.group(1)), int(acc.group(2)), acc.group(3), int(acc.group(4))
print(f"RESULT {label} {mode} batch {b}: identical {same}/{len(a)} (first differences at {[f for f in firsts if f is not None]}), "
      f"decode {r0:.1f} -> {r1:.1f} tok/s ({r1 / r0:.2f}x), accepted {accepted}/{drafted} ({pct}%), "
      f"{accepted / max(verifies, 1) + 1:.2f} tokens per verify")
sys.exit(0 if same == len(a) else 1)
