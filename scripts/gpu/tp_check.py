"""Helpers of scripts/gpu/tp.sh and tp1.sh (issue 17): step inputs as .npy for `kern run`,
logit comparisons, and the tiny collectives model of tests/manifests/parallel.

  tp_check.py inputs MODEL.json DIR --tokens T [--decode-at C] [--seed S]
      one sequence: a prefill of T random tokens (default), or one decode token at context C
  tp_check.py compare A.npy B.npy [--exact] [--bound X]
      logits [seqs, vocab]: max |a-b|, top-1 agreement; exit 1 beyond the rule
  tp_check.py tiny DIR FIXTURES TP
      the collectives model of tests/manifests/parallel at tp TP (1 or 2) with a checkpoint,
      for `kern run --weights DIR --input A=range --output C --output G`
  tp_check.py tiny-check DIR TP
      tp 1: C = A + w[0:4], G = C; tp 2: C = 2A + w[0:4] + w[4:8] (the all-reduce of the two
      ranks' A + w-slice), G = [C, C]
  tp_check.py greedy DUMP_A DUMP_B
      two `kern generate --dump` runs of the same prompts (e.g. TP=1 and TP=2): per sequence,
      the tokens are equal, or at the first split j both tokens are within twice the largest
      logit difference of step j in A's logits (a near-tie); exit 1 otherwise
  tp_check.py floor MODEL.json
      bytes of weights one rank reads in a decode step (every weight but the embedding table)
      and the time to read them at 4.8 TB/s (H200 HBM3e peak)
Needs python3 with numpy.
"""
import json, math, os, struct, sys
import numpy as np


def step_inputs(model, out, tokens, decode_at=None, seed=0):
    m = json.load(open(model))
    pages = m["vars"]["pages"]["max"]
    page_tokens = m["states"]["kv"].get("page_tokens", 16)
    vocab = m["buffers"]["logits"]["shape"][1]
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    if decode_at is None:
        ctx, new = tokens, tokens
        pos = np.arange(tokens, dtype=np.int32)
    else:
        ctx, new = decode_at, 1
        pos = np.array([decode_at - 1], dtype=np.int32)
    used = math.ceil(ctx / page_tokens)
    if used > pages:
        sys.exit(f"context {ctx} needs {used} pages, the manifest has {pages}")
    arrays = {
        "token_ids": rng.integers(0, min(vocab, 151643), size=new, dtype=np.int32),
        "positions": pos,
        "seq_lens": np.array([ctx], np.int32),
        "query_start": np.array([0, new], np.int32),
        "slot_mapping": pos.copy(),  # pages 0.. in order: slot = position
        "block_tables": np.array([[p if p < used else -1 for p in range(pages)]], np.int32),
        "last_token": np.array([new - 1], np.int32),
        "temperature": np.zeros(1, np.float32),
        "top_k": np.zeros(1, np.int32),
        "top_p": np.ones(1, np.float32),
        "seeds": np.zeros(1, np.uint64),
    }
    for k, v in arrays.items():
        np.save(os.path.join(out, k + ".npy"), v)
    print(" ".join(f"--input {k}={os.path.join(out, k + '.npy')}" for k in arrays))


def compare(a, b, exact=False, bound=None):
    x, y = np.load(a).astype(np.float64), np.load(b).astype(np.float64)
    if x.shape != y.shape:
        print(f"shapes differ: {x.shape} vs {y.shape}")
        return 1
    d = np.abs(x - y)
    t1x, t1y = x.argmax(-1), y.argmax(-1)
    agree = int((t1x == t1y).sum())
    # Where top-1 differs, is it a near-tie within the difference? (vLLM-style rule)
    ties = all(abs(x[i, t1x[i]] - x[i, t1y[i]]) <= 2 * d[i].max() for i in range(len(t1x)) if t1x[i] != t1y[i])
    print(f"max |a-b| {d.max():.4g}, mean {d.mean():.3g}, top-1 {agree}/{len(t1x)} equal{'' if agree == len(t1x) else (' (the others near-ties)' if ties else ' (NOT near-ties)')}, bit-identical {bool((x == y).all())}")
    if exact:
        return 0 if (x == y).all() else 1
    ok = (bound is None or d.max() <= bound) and (agree == len(t1x) or ties)
    return 0 if ok else 1


def safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def tiny(out, fixtures, tp):
    here = os.path.dirname(os.path.abspath(__file__))
    m = json.load(open(os.path.join(here, "../../tests/manifests/parallel/model.json")))
    m["parallel"]["tp"] = tp
    m["buffers"]["G"]["shape"] = [f"{tp} * n"]  # out = tp x in
    os.makedirs(out, exist_ok=True)
    json.dump(m, open(os.path.join(out, "model.json"), "w"), indent=1)
    import shutil
    shutil.copy(os.path.join(fixtures, "vecadd.sm_90.cubin"), out)
    safetensors(os.path.join(out, "model.safetensors"), {
        "w": np.arange(8) * 10.0, "w2": np.arange(4) + 0.5,
        "q": np.arange(32).reshape(8, 4) * 1.0, "k": np.arange(16).reshape(4, 4) * 2.0})


def tiny_check(out, tp):
    c, g = np.load(os.path.join(out, "C.npy")), np.load(os.path.join(out, "G.npy"))
    a, w = np.arange(4.0), np.arange(8) * 10.0
    want = a + w[0:4] if tp == 1 else 2 * a + w[0:4] + w[4:8]
    ok = np.array_equal(c, want) and np.array_equal(g, np.tile(want, tp))
    print(f"C {c.tolist()} G {g.tolist()} (want C = {want.tolist()}, G = C x {tp}): {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


def greedy(a, b):
    ta, tb = (json.load(open(os.path.join(d, "tokens.json"))) for d in (a, b))
    if ta["prompts"] != tb["prompts"]:
        print("the two runs had different prompts")
        return 1
    ok, parts = True, []
    for i, (x, y) in enumerate(zip(ta["outputs"], tb["outputs"])):
        if len(x) != len(y):
            ok = False
            parts.append(f"seq{i}: {len(x)} vs {len(y)} tokens")
            continue
        j = next((k for k in range(len(x)) if x[k] != y[k]), None)
        if j is None:
            parts.append(f"seq{i}: {len(x)}/{len(x)} equal")
            continue
        la, lb = (np.load(os.path.join(d, f"seq{i}.logits.npy"))[j].astype(np.float64) for d in (a, b))
        d = np.abs(la - lb).max()
        gap = abs(la[x[j]] - la[y[j]])
        tie = gap <= 2 * d
        ok &= bool(tie)
        parts.append(f"seq{i}: split at {j} ({'near-tie' if tie else 'NOT a near-tie'}: gap {gap:.3g}, max |a-b| {d:.3g})")
    print("; ".join(parts))
    return 0 if ok else 1


def floor(model):
    m = json.load(open(model))
    size = {"bf16": 2, "f16": 2, "f32": 4}
    total = 0
    for name, b in m["buffers"].items():
        if b.get("role") != "weight" or name == "model.embed_tokens.weight":
            continue
        if "alias" in b.get("from", {}):
            continue
        total += math.prod(b["shape"]) * size[b["dtype"]]
    # A tied LM head reads the embedding table in full.
    if "alias" in m["buffers"]["lm_head.weight"].get("from", {}):
        e = m["buffers"]["model.embed_tokens.weight"]
        total += math.prod(e["shape"]) * size[e["dtype"]]
    print(f"{total / 1e9:.3f} GB per rank, floor {total / 4.8e12 * 1e3:.3f} ms")


if __name__ == "__main__":
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    if a[0] == "inputs":
        kw = {"tokens": 1, "decode_at": None, "seed": 0}
        rest = a[3:]
        for i in range(0, len(rest), 2):
            kw[rest[i].lstrip("-").replace("-", "_")] = int(rest[i + 1])
        step_inputs(a[1], a[2], **kw)
    elif a[0] == "compare":
        bound = float(a[a.index("--bound") + 1]) if "--bound" in a else None
        sys.exit(compare(a[1], a[2], exact="--exact" in a, bound=bound))
    elif a[0] == "tiny":
        tiny(a[1], a[2], int(a[3]))
    elif a[0] == "tiny-check":
        sys.exit(tiny_check(a[1], int(a[2])))
    elif a[0] == "greedy":
        sys.exit(greedy(a[1], a[2]))
    elif a[0] == "floor":
        floor(a[1])
    else:
        sys.exit(__doc__)
