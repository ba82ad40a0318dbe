"""KV offload through `kern serve` (GPU machine): a working set larger than the GPU's KV pool.

usage: prefix_offload.py BASE_OFFLOAD BASE_UNCACHED OUT_JSON

BASE_OFFLOAD serves with a small GPU pool (--gpu-mem) and --offload-gib 32; BASE_UNCACHED with
--no-prefix-cache (both --max-batched-tokens 2000). 16 documents of 2,000 tokens (32,000 tokens,
several times the small pool) are each asked twice, one request at a time: round 1 computes
them (and writes their pages through to host memory), round 2 finds most pages only in host
memory. Reports TTFT of a host hit vs a recompute, the restore copy bandwidth (from /metrics)
against the host→device bandwidth torch measures in the same run, and checks that round-2
greedy outputs equal the uncached server's.
"""
import json, random, sys, time
import httpx
from kern_checks import check, fails, metrics
import torch

off, unc, out_path = sys.argv[1:4]
rng = random.Random(11)
DOCS = [[rng.randrange(151643) for _ in range(2000)] for _ in range(16)]
Q1 = [[rng.randrange(151643) for _ in range(20)] for _ in range(16)]
Q2 = [[rng.randrange(151643) for _ in range(20)] for _ in range(16)]



def ask(base, prompt):
    t0 = time.perf_counter()
    ttft, ids = None, []
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True, "return_token_ids": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    if c.get("token_ids"):
                        ttft = ttft or time.perf_counter() - t0
                        ids += c["token_ids"]
    return ttft, ids


# Host→device bandwidth of pinned memory, measured here (the PCIe / C2C limit).
src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
for _ in range(3):
    dst.copy_(src, non_blocking=True)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10):
    dst.copy_(src, non_blocking=True)
e.record()
torch.cuda.synchronize()
h2d = 10 * (1 << 30) / (s.elapsed_time(e) / 1e3) / 1e9
del src, dst
print(f"torch pinned host→device: {h2d:.1f} GB/s", flush=True)

m0 = metrics(off)
round1 = [ask(off, d + q) for d, q in zip(DOCS, Q1)]
m1 = metrics(off)
round2 = [ask(off, d + q) for d, q in zip(DOCS, Q2)]
m2 = metrics(off)
ref2 = [ask(unc, d + q) for d, q in zip(DOCS, Q2)]
cold = sorted(r[0] for r in round1)
warm = sorted(r[0] for r in round2)
recompute = sorted(r[0] for r in ref2)
host_hits = m2["kern:external_prefix_cache_hits_total"] - m1["kern:external_prefix_cache_hits_total"]
gpu_hits = m2["kern:prefix_cache_hits_total"] - m1["kern:prefix_cache_hits_total"] - host_hits
restored = m2["kern:kv_offload_restored_bytes_total"]
secs = m2["kern:kv_offload_restore_seconds_total"]
bw = restored / secs / 1e9 if secs > 0 else 0.0
same = sum(a[1] == b[1] for a, b in zip(round2, ref2))
res = {
    "h2d_limit_gbs": round(h2d, 1), "restore_gbs": round(bw, 1), "restored_gib": round(restored / 2**30, 2),
    "ttft_cold_p50_ms": round(cold[8] * 1e3, 1), "ttft_host_hit_p50_ms": round(warm[8] * 1e3, 1), "ttft_recompute_p50_ms": round(recompute[8] * 1e3, 1),
    "round2_host_hit_tokens": int(host_hits), "round2_gpu_hit_tokens": int(gpu_hits), "stored_pages": int(m2["kern:kv_offload_stored_pages_total"] - m0["kern:kv_offload_stored_pages_total"]),
    "greedy_identical": f"{same}/16",
}
print(json.dumps(res), flush=True)
check("round 2 hits come from host memory", host_hits >= 8 * 2000, f"{int(host_hits)} host-hit tokens, {int(gpu_hits)} GPU-hit tokens")
check("a host hit is faster than recomputing", warm[8] < recompute[8], f"{res['ttft_host_hit_p50_ms']} vs {res['ttft_recompute_p50_ms']} ms")
check("greedy with host-tier hits == without cache", same == 16, f"{same}/16")
check("restore copies ran at ≥ 30% of the measured host→device bandwidth", bw >= 0.3 * h2d, f"{bw:.1f} of {h2d:.1f} GB/s")
res["fails"] = fails
json.dump(res, open(out_path, "w"))
sys.exit(1 if fails else 0)
