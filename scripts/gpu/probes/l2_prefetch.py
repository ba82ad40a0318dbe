#!/usr/bin/env python3
"""Probe (issue 15): can the weights of the next projection be streamed into L2 while a
latency-bound kernel (rope + attention at batch 1) leaves DRAM idle, so the projection then runs
from L2?  Sequence per repetition: gemv(qkv) -> busy(~BUSY us, optionally prefetching W_o into L2)
-> gemv(o), with weight sets rotated so nothing is L2-resident from the previous repetition.
Prints the median time of the whole sequence and of gemv(o) alone, with and without the prefetch.

usage: python3 scripts/gpu/probes/l2_prefetch.py build/packs .carry/probes/l2_prefetch.cubin
"""
import sys

import cupy
import numpy as np
import torch


def main():
    kdir, probe = sys.argv[1], sys.argv[2]
    gemv = cupy.RawModule(path=f"{kdir}/gemm_skinny.sm_90a.cubin").get_function("gemv_bf16")
    busy = cupy.RawModule(path=probe).get_function("busy_prefetch")
    dev = torch.device("cuda:0")
    stream = torch.cuda.current_stream()
    cs = cupy.cuda.ExternalStream(stream.cuda_stream)
    g = torch.Generator(device=dev)
    g.manual_seed(7)
    rows = []
    for label, (nq, kq), (no, ko) in [("4B qkv→o", (6144, 2560), (2560, 4096)),
                                      ("8B qkv→o", (6144, 4096), (4096, 4096)),
                                      ("4B o→gate_up(first 24 MB)", (2560, 4096), (19456, 2560))]:
        sets = 6
        Wq = [(torch.randn(nq, kq, generator=g, device=dev) * 0.02).to(torch.bfloat16) for _ in range(sets)]
        Wo = [(torch.randn(no, ko, generator=g, device=dev) * 0.02).to(torch.bfloat16) for _ in range(sets)]
        xq = torch.randn(1, kq, generator=g, device=dev).to(torch.bfloat16)
        xo = torch.randn(1, ko, generator=g, device=dev).to(torch.bfloat16)
        yq = torch.empty(1, nq, dtype=torch.bfloat16, device=dev)
        yo = torch.empty(1, no, dtype=torch.bfloat16, device=dev)
        ob = no * ko * 2
        pf_bytes = min(ob, 24 << 20)

        def launch_gemv(x, W, y, n, k):
            with cs:
                gemv(((n + 15) // 16, 1, 1), (256, 1, 1),
                     (np.uint64(x.data_ptr()), np.uint64(W.data_ptr()), np.uint64(0), np.uint64(y.data_ptr()),
                      np.int32(1), np.int32(n), np.int32(k)))

        def launch_busy(p, nbytes, ns):
            with cs:
                busy((1, 1, 1), (128, 1, 1), (np.uint64(p), np.int64(nbytes), np.int64(ns)))

        for busy_us in (10, 20):
            res = {}
            for mode in ("none", "prefetch"):
                tot, oo = [], []
                for rep in range(60):
                    i = rep % sets
                    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                    torch.cuda._sleep(2_000_000)
                    e[0].record()
                    launch_gemv(xq, Wq[i], yq, nq, kq)
                    launch_busy(Wo[i].data_ptr(), pf_bytes if mode == "prefetch" else 0, busy_us * 1000)
                    e[1].record()
                    launch_gemv(xo, Wo[i], yo, no, ko)
                    e[2].record()
                    torch.cuda.synchronize()
                    if rep >= 6:
                        tot.append(e[0].elapsed_time(e[2]) * 1e3)
                        oo.append(e[1].elapsed_time(e[2]) * 1e3)
                res[mode] = (float(np.median(tot)), float(np.median(oo)))
            rows.append((label, busy_us, res, ob))
        del Wq, Wo
        torch.cuda.empty_cache()
    print(f"\n{'sequence':28s} {'busy us':>7s} {'total none':>10s} {'total pf':>9s} {'o none us':>9s} {'o pf us':>8s} "
          f"{'o none GB/s':>11s} {'o pf GB/s':>9s}")
    for label, busy_us, res, ob in rows:
        (tn, on), (tp, op) = res["none"], res["prefetch"]
        print(f"{label:28s} {busy_us:7d} {tn:10.2f} {tp:9.2f} {on:9.2f} {op:8.2f} {ob / on / 1e3:11.0f} {ob / op / 1e3:9.0f}")


if __name__ == "__main__":
    main()
