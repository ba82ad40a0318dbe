"""The PyTorch peer of ../shared/peers/torch_peer.py (a gpt-fast-style decoder: static KV cache,
cuBLAS GEMMs, SDPA, the one-token decode step captured in a CUDA graph, optionally after
torch.compile) for the Llama and Gemma 3 shapes, which torch_peer.py (Qwen3 only: q/k norm,
head_dim 128, vocabulary 151936) does not build. Same interface: CFG, run(name, batch, mode,
prompt, new) printing one JSON line; scripts/gpu/bench_table.py's `peer` falls back to this file
for a model torch_peer.py lacks.

Llama: no q/k norm, SwiGLU, head_dim from the config, an untied LM head where the model has one.
Gemma 3: q/k RMSNorm, four (1 + w) norms per block, tanh-GeGLU, the embedding scaled by
sqrt(hidden), head_dim 256, the score scale query_pre_attn_scalar^-0.5, sliding-window layers
(5 of 6) masked to their window. Random bf16 weights with the real shapes (values do not change
the time).

usage: torch_peer_families.py MODEL:BATCH:MODE ...   MODE = graph | compile | eager-cpu (a tiny
forward on the CPU, for checking this file without a GPU)"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

CFG = {
    "llama-3.1-8b": dict(H=4096, L=32, nh=32, nkv=8, hd=128, I=14336, V=128256, tie=False, gemma=False),
    "llama-3.2-1b": dict(H=2048, L=16, nh=32, nkv=8, hd=64, I=8192, V=128256, tie=True, gemma=False),
    "mistral-7b": dict(H=4096, L=32, nh=32, nkv=8, hd=128, I=14336, V=32768, tie=False, gemma=False),
    "gemma-3-4b": dict(H=2560, L=34, nh=8, nkv=4, hd=256, I=10240, V=262208, tie=True, gemma=True, window=1024, qpas=256),
    "gemma-3-1b": dict(H=1152, L=26, nh=4, nkv=1, hd=256, I=6912, V=262144, tie=True, gemma=True, window=512, qpas=256),
    "tiny-llama": dict(H=256, L=2, nh=4, nkv=2, hd=64, I=512, V=1000, tie=False, gemma=False),
    "tiny-gemma": dict(H=256, L=7, nh=2, nkv=1, hd=128, I=512, V=1000, tie=True, gemma=True, window=8, qpas=128),
}


class Decoder:
    def __init__(s, c, B, T, dev):
        g = torch.Generator(device=dev).manual_seed(0)
        w = lambda *sh: torch.randn(*sh, device=dev, generator=g).mul_(0.02).to(torch.bfloat16)
        norm = lambda n: (torch.zeros if c["gemma"] else torch.ones)(n, device=dev, dtype=torch.bfloat16)
        s.c = c
        H, nh, nkv, hd, I, V = c["H"], c["nh"], c["nkv"], c["hd"], c["I"], c["V"]
        s.embed = w(V, H)
        s.lm = s.embed if c["tie"] else w(V, H)
        s.layers = []
        for l in range(c["L"]):
            p = dict(ln1=norm(H), wqkv=w((nh + 2 * nkv) * hd, H), wo=w(H, nh * hd), ln2=norm(H), wgu=w(2 * I, H), wd=w(H, I))
            if c["gemma"]:
                p.update(qn=norm(hd), kn=norm(hd), post_attn=norm(H), post_ffn=norm(H))
            p["sliding"] = bool(c["gemma"] and (l + 1) % 6 != 0)
            s.layers.append(p)
        s.norm = norm(H)
        s.kc = [torch.zeros(B, nkv, T, hd, device=dev, dtype=torch.bfloat16) for _ in range(c["L"])]
        s.vc = [torch.zeros_like(k) for k in s.kc]
        s.rope = {}
        for kind, theta in (("global", 1e6 if c["gemma"] else 5e5), ("local", 1e4)):
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=dev).float() / hd))
            f = torch.outer(torch.arange(T, device=dev).float(), inv)
            s.rope[kind] = (f.cos().to(torch.bfloat16), f.sin().to(torch.bfloat16))
        s.T = T
        s.scale = (c.get("qpas") or hd) ** -0.5
        s.embed_scale = torch.tensor(math.sqrt(H), dtype=torch.bfloat16) if c["gemma"] else None
        tensors = [s.embed, s.norm] + ([] if c["tie"] else [s.lm]) + [v for p in s.layers for v in p.values() if torch.is_tensor(v)]
        s.weight_bytes = sum(t.numel() * 2 for t in tensors)

    def rms(s, x, w, eps=1e-6):
        xf = x.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if s.c["gemma"]:  # Gemma3RMSNorm: (1 + w) in fp32, then rounded
            return (n * (1.0 + w.float())).to(x.dtype)
        return n.to(x.dtype) * w

    def rotate(s, x, pos, kind):
        cos, sin = s.rope[kind][0][pos][None, None], s.rope[kind][1][pos][None, None]
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def forward(s, ids, pos):
        """ids [B,T] token ids, pos [T] absolute positions (shared by all rows)."""
        c = s.c
        B, T = ids.shape
        nh, nkv, hd = c["nh"], c["nkv"], c["hd"]
        x = F.embedding(ids, s.embed)
        if s.embed_scale is not None:
            x = x * s.embed_scale
        kv_idx = torch.arange(s.T, device=ids.device)[None, :]
        causal = kv_idx <= pos[:, None]
        masks = {False: causal[None, None]}
        if c["gemma"]:
            masks[True] = (causal & (kv_idx > pos[:, None] - c["window"]))[None, None]
        for l, p in enumerate(s.layers):
            h = s.rms(x, p["ln1"])
            q, k, v = (h @ p["wqkv"].T).split([nh * hd, nkv * hd, nkv * hd], -1)
            q, k, v = q.view(B, T, nh, hd), k.view(B, T, nkv, hd), v.view(B, T, nkv, hd)
            if c["gemma"]:
                q, k = s.rms(q, p["qn"]), s.rms(k, p["kn"])
            kind = "local" if p["sliding"] else "global"
            q, k = s.rotate(q.transpose(1, 2), pos, kind), s.rotate(k.transpose(1, 2), pos, kind)
            v = v.transpose(1, 2)
            s.kc[l].index_copy_(2, pos, k)
            s.vc[l].index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, s.kc[l], s.vc[l], attn_mask=masks[p["sliding"]], enable_gqa=True, scale=s.scale)
            a = o.transpose(1, 2).reshape(B, T, nh * hd) @ p["wo"].T
            if c["gemma"]:
                x = x + s.rms(a, p["post_attn"])
                h = s.rms(x, p["ln2"])
                gg, u = (h @ p["wgu"].T).chunk(2, -1)
                x = x + s.rms((F.gelu(gg, approximate="tanh") * u) @ p["wd"].T, p["post_ffn"])
            else:
                x = x + a
                h = s.rms(x, p["ln2"])
                gg, u = (h @ p["wgu"].T).chunk(2, -1)
                x = x + (F.silu(gg) * u) @ p["wd"].T
        return (s.rms(x[:, -1], s.norm) @ s.lm.T).argmax(-1)


def run(name, B, mode, prompt=128, new=128, dev="cuda"):
    if mode == "eager-cpu":
        m = Decoder(CFG[name], B, prompt + new + 8, "cpu")
        ids = torch.randint(0, CFG[name]["V"], (B, prompt))
        with torch.inference_mode():
            nxt = m.forward(ids, torch.arange(prompt))
            for j in range(new):
                nxt = m.forward(nxt[:, None], torch.tensor([prompt + j]))
        print(json.dumps(dict(peer="torch-eager-cpu", model=name, batch=B, tokens=int(nxt.numel()), weight_gb=round(m.weight_bytes / 1e9, 4))), flush=True)
        return
    m = Decoder(CFG[name], B, prompt + new + 8, dev)
    ids = torch.randint(0, CFG[name]["V"], (B, prompt), device=dev)
    step = m.forward
    t_compile = 0.0
    if mode == "compile":
        t0 = time.perf_counter()
        step = torch.compile(m.forward, mode="max-autotune-no-cudagraphs", fullgraph=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    nxt = m.forward(ids, torch.arange(prompt, device=dev))
    torch.cuda.synchronize()
    ttft = time.perf_counter() - t
    sid = nxt[:, None].clone()
    spos = torch.tensor([prompt], device=dev)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(3):
            step(sid, spos)
    torch.cuda.current_stream().wait_stream(st)
    if mode == "compile":
        torch.cuda.synchronize()
        t_compile = time.perf_counter() - t0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(sid, spos)
    for _ in range(3):
        g.replay()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    spos.fill_(prompt)
    torch.cuda.synchronize()
    e0.record()
    for _ in range(new):
        g.replay()
        sid.copy_(out[:, None])
        spos.add_(1)
    e1.record()
    torch.cuda.synchronize()
    itl = e0.elapsed_time(e1) / new
    floor = m.weight_bytes / 4.26e12 * 1e3
    print(json.dumps(dict(peer="torch-" + mode, model=name, batch=B, itl_ms=round(itl, 4), decode_tok_s=round(B / itl * 1e3, 1),
                          weight_gb=round(m.weight_bytes / 1e9, 3), floor_ms=round(floor, 4), frac_of_floor=round(floor / itl, 3),
                          prefill_ms=round(ttft * 1e3, 1), compile_s=round(t_compile, 1))), flush=True)
    del m, g
    torch.cuda.empty_cache()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        name, b, mode = spec.split(":")
        try:
            run(name, int(b), mode, **({"prompt": 12, "new": 3} if mode == "eager-cpu" else {}))
        except Exception as e:  # noqa: BLE001
            print(json.dumps(dict(model=name, batch=b, mode=mode, error=repr(e)[:300])), flush=True)
