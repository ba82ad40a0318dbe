"""A PyTorch program for `kern dump` to capture: a transformers Qwen3 with random weights
(Qwen3-0.6B's shape), one 32-token prefill and 8 decode steps, eager or with the decode step
replayed from a CUDA graph.

It is an ordinary program: it knows nothing of kern. Run it plain and under
`kern dump --out DIR -- python3 qwen3_dump_workload.py ...` to compare; the last line it prints
is a JSON object with its timings and the generated tokens (the same with and without the
injection, or the injection changed what the program computes).

    python3 qwen3_dump_workload.py --mode eager|graph [--repeats 3] [--layers 28]
"""

import argparse
import json
import os
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache


def build_model(layers: int) -> tuple[Qwen3ForCausalLM, Qwen3Config]:
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval(), cfg


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["eager", "graph"], required=True)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="timed iterations after the first (cold) one")
    args = ap.parse_args()

    t_start = time.perf_counter()
    model, cfg = build_model(args.layers)
    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prefill), device="cuda", generator=gen)
    P, D = args.prefill, args.decode

    if args.mode == "eager":

        @torch.inference_mode()
        def iteration():
            out = model(input_ids=prompt, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            toks = [tok]
            for _ in range(D):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                toks.append(tok)
            return torch.cat(toks, dim=1)

    else:
        cache = StaticCache(config=cfg, max_cache_len=P + D + 8)
        static_ids = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        static_pos = torch.zeros((1, 1), dtype=torch.long, device="cuda")
        state = {"graph": None, "logits": None}

        def step():
            return model(input_ids=static_ids, position_ids=static_pos, past_key_values=cache, use_cache=True).logits

        @torch.inference_mode()
        def iteration():
            cache.reset()
            out = model(
                input_ids=prompt,
                position_ids=torch.arange(P, device="cuda")[None],
                past_key_values=cache,
                use_cache=True,
            )
            tok = out.logits[:, -1:].argmax(-1)
            toks = [tok]
            for i in range(D):
                static_ids.copy_(tok)
                static_pos.fill_(P + i)
                if state["graph"] is None:
                    # First decode step: run it eagerly on a side stream (loads what it needs),
                    # then capture the same step; later steps are replays. The static cache
                    # advances its write position on the device, so replays append correctly.
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        logits = step()
                    torch.cuda.current_stream().wait_stream(s)
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        state["logits"] = step()
                    state["graph"] = g
                else:
                    state["graph"].replay()
                    logits = state["logits"]
                tok = logits[:, -1:].argmax(-1)
                toks.append(tok)
            return torch.cat(toks, dim=1)

    cold_s, toks = timed(iteration)
    steady = [timed(iteration)[0] for _ in range(args.repeats)]
    result = {
        "mode": args.mode,
        "layers": args.layers,
        "prefill": P,
        "decode": D,
        "cold_s": round(cold_s, 4),
        "steady_s": round(sum(steady) / max(len(steady), 1), 4),
        "steady_min_s": round(min(steady), 4) if steady else None,
        "in_process_total_s": round(time.perf_counter() - t_start, 3),
        "tokens": toks[0].tolist(),
        "traced": bool(os.environ.get("KERN_DUMP_DIR")),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
