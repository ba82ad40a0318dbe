#!/usr/bin/env python3
"""GPU check and timing of the Gated DeltaNet kernels (gdn.cu; KERNELS.md "Gated DeltaNet").

usage: python3 packs/kernels/verify/gdn_verify.py [CUBIN_DIR] [--no-timing] [--quick]
       python3 packs/kernels/verify/gdn_verify.py --selftest    # CPU: the references against each other

CUBIN_DIR (default build/packs) must hold gdn.sm_90a.cubin (packs/kernels/build.sh); a missing file
or entry is a FAIL. Needs torch, cupy, numpy. The references are written here in pure torch from
transformers' modeling_qwen3_next.py (torch_causal_conv1d_update, torch_chunk_gated_delta_rule,
torch_recurrent_gated_delta_rule, Qwen3NextRMSNormGated), in fp32, with the q/k L2 norm in fp32
(FLA's use_qk_l2norm_in_kernel: the kernels normalize in fp32, not in bf16 as the torch fallback).

Cases, at Qwen3-Next-80B-A3B's shapes (16 k-heads, 32 v-heads, head dim 128, conv 4) and a small one
(2 k-heads, 4 v-heads), fp32 and bf16 recurrent states: one batch of sequences with prompt lengths
1, 63, 64, 65, 300, 1000 prefilled in varlen steps (each step gives every unfinished prompt its next
piece: 64, 100, 37, 128, 256 … tokens, so prompts are cut across steps and rows of different
lengths share a step; slots permuted; a padded row with slot -1 and two padded tokens per step),
then 4 decode steps of one token per sequence. Prefill steps run gdn_conv, gdn_conv_state,
gdn_chunk_*; decode steps gdn_conv, gdn_conv_state, gdn_recurrent_* (and a second pass with
gdn_chunk_* for the decode too); every step ends with gdn_norm_gated. Each stage is compared with
the reference fed the kernels' own inputs of that stage (errors do not compound):
  conv    y vs bf16(silu(bf16(conv))) of the whole sequence in fp32: within one bf16 unit
  delta   o vs the reference: chunked (chunk 64) over the prompt, then recurrent over the decode
          tokens from the prompt's final state; |o - ref| <= 1/64 |ref| + 2e-3 max|ref| (fp32 state),
          1/16 |ref| + 2e-2 max|ref| (bf16 state)
  state   the recurrent state in the slot after the run vs the reference's final state
          (1e-3 |ref| + 1e-4 max|ref| fp32; 1/64 |ref| + 1e-2 max|ref| bf16) and the conv state =
          the last 3 inputs, bit for bit
  norm    gdn_norm_gated vs Qwen3NextRMSNormGated on the kernels' o: >= 99% bit-identical, the rest
          within 2 bf16 units
Timing (unless --no-timing): gdn_chunk_f32 over one 8192-token prompt at the 80B shapes against
its FLOP bound (fp32 CUDA cores, and the bf16 tensor-core peak for scale) and byte bound; gdn_conv
at 8192 tokens; gdn_recurrent_f32 for 64 decode rows against the state's bytes.
"""
import argparse
import math
import os
import sys
import time

KW = 4
D = 128
BV = 32  # value columns per gdn_chunk_* CTA (GDN_BV in gdn.cu; --bv for experiments with other builds)


def chunk_smem(bv):
    """sizeof(ChunkSmem<128, bv>): gdn_chunk_*'s dynamic shared memory (165120 for bv 32; KERNELS.md)."""
    return 4 * (3 * 64 * (D + 4) + D * (bv + 4) + 64 * (bv + 4) + 2 * 64 * 68 + 5 * 64)


CHUNK_SMEM = chunk_smem(BV)
ENTRIES = ["gdn_conv_f32", "gdn_conv_bf16", "gdn_conv_state_f32", "gdn_conv_state_bf16", "gdn_chunk_f32",
           "gdn_chunk_bf16", "gdn_recurrent_f32", "gdn_recurrent_bf16", "gdn_norm_gated"]
PEAK_FP32 = 67e12      # H100/H200 SXM fp32 CUDA-core peak (FLOP/s)
PEAK_BF16_TC = 989e12  # dense bf16 tensor-core peak
HBM = 4.8e12           # H200 bytes/s


def cdiv(a, b):
    return (a + b - 1) // b


# ============================================================================ references (torch)
def ref_conv(x, w):
    """x: [L, C] bf16 (one sequence from position 0), w: [C, KW] bf16 -> y [L, C] bf16:
    F.silu(conv1d(x)) as transformers' bf16 path rounds it (conv output bf16, silu bf16)."""
    import torch
    import torch.nn.functional as F
    L, C = x.shape
    xt = x.float().t().unsqueeze(0)  # [1, C, L]
    out = F.conv1d(F.pad(xt, (KW - 1, 0)), w.float().unsqueeze(1), groups=C)  # fp32 accumulation
    out = out.to(torch.bfloat16).float()
    return F.silu(out).to(torch.bfloat16)[0].t().contiguous()


def gates(ab, A_log, dt_bias, hv):
    """ab: [L, 2 hv] bf16 (b | a) -> g [L, hv] fp32, beta [L, hv] fp32 (bf16 values)."""
    import torch
    import torch.nn.functional as F
    b, a = ab[:, :hv], ab[:, hv:]
    beta = b.sigmoid().float()                        # bf16 sigmoid, as transformers
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, beta


def split_qkv(y, hk, hv):
    """y: [L, conv_dim] -> q, k [L, hv, D] (repeat-interleaved to hv, fp32, l2-normalized in fp32), v [L, hv, D]."""
    L = y.shape[0]
    q = y[:, :hk * D].float().reshape(L, hk, D)
    k = y[:, hk * D:2 * hk * D].float().reshape(L, hk, D)
    v = y[:, 2 * hk * D:].float().reshape(L, hv, D)
    rep = hv // hk
    q = q.repeat_interleave(rep, dim=1)
    k = k.repeat_interleave(rep, dim=1)
    q = q * (q * q).sum(-1, keepdim=True).add(1e-6).rsqrt()
    k = k * (k * k).sum(-1, keepdim=True).add(1e-6).rsqrt()
    return q, k, v


def ref_chunk(q, k, v, g, beta, state=None, chunk=64):
    """torch_chunk_gated_delta_rule (transformers), one sequence: q, k, v [L, H, D] (q, k already
    normalized), g, beta [L, H]; returns o [L, H, D] fp32 and the final state [H, D, D]."""
    import torch
    import torch.nn.functional as F
    dt = q.dtype
    q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))  # [H, L, D]
    g, beta = g.t().contiguous(), beta.t().contiguous()
    H, L, Dk = k.shape
    pad = (chunk - L % chunk) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    T = L + pad
    q = q * (1 / Dk ** 0.5)
    v_beta = v * beta[..., None]
    k_beta = k * beta[..., None]
    q, k, v, k_beta, v_beta = (t.reshape(H, -1, chunk, t.shape[-1]) for t in (q, k, v, k_beta, v_beta))
    g = g.reshape(H, -1, chunk).cumsum(-1)
    mask = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), diagonal=0)
    decay = ((g[..., :, None] - g[..., None, :]).tril().exp()).tril()
    attn = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(mask, 0)
    for i in range(1, chunk):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(chunk, dtype=dt, device=q.device)
    v = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp()[..., None])
    S = torch.zeros(H, Dk, v.shape[-1], dtype=dt, device=q.device) if state is None else state.to(dt).clone()
    out = torch.zeros_like(v)
    mask = torch.triu(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), diagonal=1)
    for i in range(T // chunk):
        qi, ki, vi = q[:, i], k[:, i], v[:, i]
        a = (qi @ ki.transpose(-1, -2) * decay[:, i]).masked_fill_(mask, 0)
        v_new = vi - k_cumdecay[:, i] @ S
        out[:, i] = (qi * g[:, i, :, None].exp()) @ S + a @ v_new
        S = S * g[:, i, -1, None, None].exp() + (ki * (g[:, i, -1, None] - g[:, i]).exp()[..., None]).transpose(-1, -2) @ v_new
    out = out.reshape(H, -1, out.shape[-1])[:, :L]
    return out.transpose(0, 1).contiguous(), S


def ref_recurrent(q, k, v, g, beta, state=None):
    """torch_recurrent_gated_delta_rule (transformers), one sequence; same shapes as ref_chunk."""
    import torch
    L, H, Dk = k.shape
    S = torch.zeros(H, Dk, v.shape[-1], dtype=q.dtype, device=q.device) if state is None else state.clone()
    q = q * (1 / Dk ** 0.5)
    out = torch.zeros(L, H, v.shape[-1], dtype=q.dtype, device=q.device)
    for t in range(L):
        S = S * g[t].exp()[:, None, None]
        kv = (S * k[t][:, :, None]).sum(-2)
        delta = (v[t] - kv) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = (S * q[t][:, :, None]).sum(-2)
    return out, S


def ref_norm(x, z, w, eps=1e-6):
    """Qwen3NextRMSNormGated: x, z [N, D] bf16, w [D] bf16."""
    import torch
    import torch.nn.functional as F
    h = x.float()
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    h = w * h.to(torch.bfloat16)
    h = h * F.silu(z.float())
    return h.to(torch.bfloat16)


# ============================================================================ kernels
class K:
    def __init__(self, cubin_dir):
        import cupy
        import numpy as np
        import torch
        self.cupy, self.np, self.torch = cupy, np, torch
        self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        self.fns, self.missing = {}, []
        path = os.path.join(cubin_dir, "gdn.sm_90a.cubin")
        if not os.path.exists(path):
            self.missing.append(f"no file {path}")
            return
        mod = cupy.RawModule(path=path)
        for n in ENTRIES:
            try:
                f = mod.get_function(n)
                dyn = CHUNK_SMEM if n.startswith("gdn_chunk") else 0
                if dyn:
                    try:
                        f.max_dynamic_shared_size_bytes = dyn
                    except AttributeError:
                        cupy.cuda.driver.funcSetAttribute(f.kernel.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dyn)
                self.fns[n] = (f, dyn)
            except Exception as e:  # noqa: BLE001
                self.missing.append(f"{n}: {e!r}")

    def p(self, t):
        return self.np.uint64(0 if t is None else t.data_ptr())

    def i(self, v):
        return self.np.int32(v)

    def launch(self, name, grid, block, args):
        f, dyn = self.fns[name]
        with self.stream:
            f(grid, (block, 1, 1), args, shared_mem=dyn)

    # the manifest's recipes (KERNELS.md)
    def conv(self, suf, y, x, w, state, qs, pos, slots, seqs, tokens, ld_x, ld_y, hk, hv, layer, nl):
        C = (2 * hk + hv) * D
        self.launch(f"gdn_conv_{suf}", (cdiv(C, 1024), cdiv(tokens, 16), 1), 128,
                    (self.p(y), self.p(x), self.p(w), self.p(state), self.p(qs), self.p(pos), self.p(slots), self.i(seqs),
                     self.i(tokens), self.i(ld_x), self.i(ld_y), self.i(hk), self.i(hv), self.i(layer), self.i(nl)))

    def conv_state(self, suf, x, state, qs, pos, slots, seqs, ld_x, hk, hv, layer, nl):
        C = (2 * hk + hv) * D
        self.launch(f"gdn_conv_state_{suf}", (cdiv(C, 256), seqs, 1), 128,
                    (self.p(x), self.p(state), self.p(qs), self.p(pos), self.p(slots), self.i(seqs), self.i(ld_x),
                     self.i(hk), self.i(hv), self.i(layer), self.i(nl)))

    def delta(self, kind, suf, o, y, b, a, A_log, dt_bias, state, qs, pos, slots, seqs, ld_y, ld_ab, ld_o, hk, hv, layer, nl):
        args = (self.p(o), self.p(y), self.p(b), self.p(a), self.p(A_log), self.p(dt_bias), self.p(state), self.p(qs),
                self.p(pos), self.p(slots), self.i(seqs), self.i(ld_y), self.i(ld_ab), self.i(ld_o), self.i(hk), self.i(hv),
                self.i(layer), self.i(nl))
        if kind == "chunk":
            self.launch(f"gdn_chunk_{suf}", (seqs, hv, D // BV), 256, args)
        else:
            self.launch(f"gdn_recurrent_{suf}", (seqs, hv, 2), D, args)

    def norm(self, out, x, z, w, n, heads, ld_x, ld_z, ld_out, eps=1e-6):
        self.launch("gdn_norm_gated", (n, cdiv(heads, 8), 1), 256,
                    (self.p(out), self.p(x), self.p(z), self.p(w), self.i(n), self.i(heads), self.i(ld_x), self.i(ld_z),
                     self.i(ld_out), self.np.float32(eps)))


# ============================================================================ the run
class Run:
    def __init__(self, k, quick):
        self.k, self.torch, self.quick = k, k.torch, quick
        self.rows, self.passes, self.fails = [], 0, 0

    def report(self, ok, case, what, err="", tol=""):
        self.rows.append((case, what, err, tol, "PASS" if ok else "FAIL"))
        print(f"{'PASS' if ok else 'FAIL'} {case}: {what} {err}", flush=True)
        if ok:
            self.passes += 1
        else:
            self.fails += 1

    @staticmethod
    def worst(k, r, rel, absf):
        """max |k - r| / (rel |r| + absf max|r|) (<= 1 passes) and max |k - r|."""
        k, r = k.double(), r.double()
        if not bool(k.isfinite().all()):
            return float("inf"), float("nan")
        d = (k - r).abs()
        tol = rel * r.abs() + absf * r.abs().max().clamp_min(1e-30)
        return float((d / tol).max()), float(d.max())

    def case(self, hk, hv, suf, decode_kind, lens, pieces, n_decode, seed):
        torch = self.torch
        dev = "cuda"
        gen = torch.Generator(device="cpu").manual_seed(seed)
        C = (2 * hk + hv) * D
        name = f"Hk{hk} Hv{hv} {suf}-state decode={decode_kind}"
        w = (torch.randn(C, KW, generator=gen) * 0.5).to(torch.bfloat16).to(dev)
        A = torch.empty(hv).uniform_(0.0, 1.0, generator=gen)
        A_log = torch.where(torch.arange(hv) % 2 == 0, torch.log(0.05 + 15.95 * A), torch.log(0.001 + 0.03 * A)).float().to(dev)
        dt_bias = (torch.randn(hv, generator=gen) * 0.5).to(torch.bfloat16).float().to(dev)
        nw = (1 + 0.3 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(dev)
        total = [L + n_decode for L in lens]
        xs = [torch.randn(T, C, generator=gen).to(torch.bfloat16).to(dev) for T in total]
        abs_ = [torch.cat([torch.randn(T, hv, generator=gen) * 1.5, torch.randn(T, hv, generator=gen) * 2 - 1], 1)
                .to(torch.bfloat16).to(dev) for T in total]
        zs = [torch.randn(T, hv * D, generator=gen).to(torch.bfloat16).to(dev) for T in total]
        ns = len(lens)
        nl, layer = 2, 1
        sb = 4 if suf == "f32" else 2
        layer_bytes = (KW - 1) * C * 2 + hv * D * D * sb
        seq_bytes = nl * layer_bytes
        nslots = ns + 2
        slot_of = [(i * 3 + 1) % nslots for i in range(ns)]
        state = torch.randint(0, 256, (nslots * seq_bytes,), dtype=torch.uint8, generator=gen).to(dev) | 0x41
        ys = [torch.full((T, C), float("nan"), dtype=torch.bfloat16, device=dev) for T in total]
        os_ = [torch.full((T, hv * D), float("nan"), dtype=torch.bfloat16, device=dev) for T in total]
        nouts = [torch.full((T, hv * D), float("nan"), dtype=torch.bfloat16, device=dev) for T in total]
        done = [0] * ns
        pi = 0
        pad_ok = True
        k = self.k

        def step(rows, kind):
            nonlocal pad_ok
            qs, pos, slots = [0], [], []
            for (s, st, n) in rows:
                pos += list(range(st, st + n))
                qs.append(qs[-1] + n)
                slots.append(slot_of[s])
            qs.append(qs[-1])
            slots.append(-1)
            seqs, real = len(slots), qs[-1]
            tokens = real + 2
            pos += [0, 0]
            ld_x, ld_y, ld_ab, ld_o = C + 8, C + 16, 2 * hv + 2, hv * D + 8
            x = torch.full((tokens, ld_x), 7.0, dtype=torch.bfloat16, device=dev)
            ab = torch.full((tokens, ld_ab), 0.5, dtype=torch.bfloat16, device=dev)
            z = torch.zeros(tokens, hv * D, dtype=torch.bfloat16, device=dev)
            t = 0
            for (s, st, n) in rows:
                x[t:t + n, :C] = xs[s][st:st + n]
                ab[t:t + n, :2 * hv] = abs_[s][st:st + n]
                z[t:t + n] = zs[s][st:st + n]
                t += n
            y = torch.full((tokens, ld_y), float("nan"), dtype=torch.bfloat16, device=dev)
            o = torch.full((tokens, ld_o), float("nan"), dtype=torch.bfloat16, device=dev)
            no = torch.full((tokens, ld_o), float("nan"), dtype=torch.bfloat16, device=dev)
            qs_t = torch.tensor(qs, dtype=torch.int32, device=dev)
            pos_t = torch.tensor(pos, dtype=torch.int32, device=dev)
            sl_t = torch.tensor(slots, dtype=torch.int32, device=dev)
            k.conv(suf, y, x, w, state, qs_t, pos_t, sl_t, seqs, tokens, ld_x, ld_y, hk, hv, layer, nl)
            k.conv_state(suf, x, state, qs_t, pos_t, sl_t, seqs, ld_x, hk, hv, layer, nl)
            k.delta(kind, suf, o, y, ab, ab[:, hv:], A_log, dt_bias, state, qs_t, pos_t, sl_t, seqs, ld_y, ld_ab, ld_o,
                    hk, hv, layer, nl)
            k.norm(no, o, z, nw, tokens, hv, ld_o, hv * D, ld_o)
            torch.cuda.synchronize()
            pad_ok &= bool((y[real:, :C] == 0).all()) and bool(o[real:].isnan().all()) and bool(o[:, hv * D:].isnan().all())
            t = 0
            for (s, st, n) in rows:
                ys[s][st:st + n] = y[t:t + n, :C]
                os_[s][st:st + n] = o[t:t + n, :hv * D]
                nouts[s][st:st + n] = no[t:t + n, :hv * D]
                t += n

        while any(done[s] < lens[s] for s in range(ns)):
            rows = []
            for s in range(ns):
                if done[s] < lens[s]:
                    n = min(pieces[pi % len(pieces)], lens[s] - done[s])
                    pi += 1
                    rows.append((s, done[s], n))
                    done[s] += n
            step(rows, "chunk")
        for _ in range(n_decode):
            step([(s, done[s], 1) for s in range(ns)], decode_kind)
            done = [d + 1 for d in done]

        # references, stage by stage, on the kernels' own inputs
        o_rel, o_abs = (1 / 64, 2e-3) if suf == "f32" else (1 / 16, 2e-2)
        s_rel, s_abs = (1e-3, 1e-4) if suf == "f32" else (1 / 64, 1e-2)
        wy = wo = ws = 0.0
        ey = eo = es = 0.0
        conv_exact = True
        same = total_n = 0
        worst_units = 0
        for s in range(ns):
            yr = ref_conv(xs[s], w)
            a, e = self.worst(ys[s], yr, 1 / 128, 0)
            wy, ey = max(wy, a), max(ey, e)
            q, kk, v = split_qkv(ys[s], hk, hv)
            g, beta = gates(abs_[s], A_log, dt_bias, hv)
            L = lens[s]
            o1, S1 = ref_chunk(q[:L], kk[:L], v[:L], g[:L], beta[:L])
            o2, S2 = ref_recurrent(q[L:], kk[L:], v[L:], g[L:], beta[L:], S1)
            oref = torch.cat([o1, o2]).reshape(-1, hv * D)
            a, e = self.worst(os_[s].float(), oref, o_rel, o_abs)
            wo, eo = max(wo, a), max(eo, e)
            base = slot_of[s] * seq_bytes + layer * layer_bytes
            rec = state[base + (KW - 1) * C * 2: base + layer_bytes]
            Sk = rec.view(torch.float32 if suf == "f32" else torch.bfloat16).float().reshape(hv, D, D)
            a, e = self.worst(Sk, S2, s_rel, s_abs)
            ws, es = max(ws, a), max(es, e)
            cs = state[base: base + (KW - 1) * C * 2].view(torch.bfloat16).reshape(KW - 1, C)
            T = total[s]
            want = torch.zeros(KW - 1, C, dtype=torch.bfloat16, device=dev)
            m = min(T, KW - 1)
            want[KW - 1 - m:] = xs[s][T - m:]
            conv_exact &= bool((cs.view(torch.int16) == want.view(torch.int16)).all())
            nref = ref_norm(os_[s].reshape(-1, D), zs[s].reshape(-1, D), nw)
            got = nouts[s].reshape(-1, D)
            same += int((got.view(torch.int16) == nref.view(torch.int16)).sum())
            total_n += got.numel()
            gi, wi = got.view(torch.int16).int(), nref.view(torch.int16).int()
            units = torch.where((gi < 0) != (wi < 0), torch.full_like(gi, 99), (gi - wi).abs())
            units = torch.where((got.float() == 0) & (nref.float() == 0), torch.zeros_like(units), units)
            worst_units = max(worst_units, int(units.max()))
        self.report(wy <= 1, name, "conv y vs fp32 reference (one bf16 unit)", f"max_abs {ey:.3g}, worst/tol {wy:.3f}")
        self.report(conv_exact, name, "conv state = last 3 inputs (bits)")
        self.report(wo <= 1, name, "delta o vs chunked+recurrent reference", f"max_abs {eo:.3g}, worst/tol {wo:.3f}")
        self.report(ws <= 1, name, "final recurrent state vs reference", f"max_abs {es:.3g}, worst/tol {ws:.3f}")
        self.report(same >= 0.99 * total_n and worst_units <= 2, name, "gdn_norm_gated vs Qwen3NextRMSNormGated",
                    f"{100 * same / max(1, total_n):.2f}% identical, worst {worst_units} units")
        self.report(pad_ok, name, "padded tokens: y zeros, o untouched; o's guard columns untouched")

    def correctness(self):
        lens = [1, 63, 64, 65, 300, 1000]
        pieces = [64, 100, 37, 128, 256, 1, 65]
        if self.quick:
            lens = [1, 63, 64, 65, 300]
        for (hk, hv) in ((16, 32), (2, 4)):
            for suf in ("f32", "bf16"):
                self.case(hk, hv, suf, "recurrent", lens, pieces, 4, 1000 + hk + (suf == "bf16"))
        self.case(2, 4, "f32", "chunk", lens, pieces, 4, 77)

    # -------------------------------------------------------------- timing
    def time_us(self, fn, reps=20):
        """Mean µs of one call over `reps` back-to-back launches (3 timed batches, the best), so host
        launch overhead does not count."""
        torch = self.torch
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = float("inf")
        for _ in range(3):
            e0.record()
            for _ in range(reps):
                fn()
            e1.record()
            e1.synchronize()
            best = min(best, e0.elapsed_time(e1) * 1e3 / reps)
        return best

    def bench(self):
        torch, k = self.torch, self.k
        dev = "cuda"
        hk, hv, T = 16, 32, 8192
        C = (2 * hk + hv) * D
        y = (torch.randn(T, C, device=dev) * 0.5).to(torch.bfloat16)
        ab = torch.randn(T, 2 * hv, device=dev).to(torch.bfloat16)
        A_log = torch.log(torch.rand(hv, device=dev) * 16 + 0.01)
        dt_bias = torch.zeros(hv, device=dev)
        o = torch.empty(T, hv * D, dtype=torch.bfloat16, device=dev)
        layer_bytes = (KW - 1) * C * 2 + hv * D * D * 4
        state = torch.zeros(layer_bytes, dtype=torch.uint8, device=dev)
        qs = torch.tensor([0, T], dtype=torch.int32, device=dev)
        pos = torch.arange(T, dtype=torch.int32, device=dev)
        slots = torch.zeros(1, dtype=torch.int32, device=dev)
        us = self.time_us(reps=3, fn=lambda: k.delta("chunk", "f32", o, y, ab, ab[:, hv:], A_log, dt_bias, state, qs, pos, slots, 1, C,
                                          2 * hv, hv * D, hk, hv, 0, 1))
        nc = T // 64
        Cc = 64
        flop = 2 * nc * hv * (2.5 * Cc * Cc * D + 3 * Cc * D * D)  # KKᵀ, QKᵀ, W, U, PV' (half-triangles) + WS, QS, KᵀV'
        byts = T * (2 * hk * D + hv * D) * 2 + T * hv * D * 2 + 2 * hv * D * D * 4 + T * 2 * hv * 2
        print(f"\ngdn_chunk_f32, one 8192-token prompt, Hk 16 Hv 32 D 128 (grid 1 x 32 x {D // BV} = {32 * D // BV} CTAs): {us:.0f} us",
              flush=True)
        print(f"  {flop / 1e9:.1f} GFLOP -> {flop / us / 1e6:.2f} TFLOP/s; bounds: fp32 CUDA cores {flop / PEAK_FP32 * 1e6:.0f} us, "
              f"bf16 tensor cores {flop / PEAK_BF16_TC * 1e6:.0f} us, bytes ({byts / 1e6:.0f} MB) {byts / HBM * 1e6:.0f} us", flush=True)
        nb = 16  # the same 8192 tokens as 16 prompts of 512 (a batch of prefill rows)
        stb = torch.zeros(nb * layer_bytes, dtype=torch.uint8, device=dev)
        qsn = torch.arange(0, T + 1, T // nb, dtype=torch.int32, device=dev)
        posn = (torch.arange(T, dtype=torch.int32, device=dev) % (T // nb)).int()
        sln = torch.arange(nb, dtype=torch.int32, device=dev)
        usb = self.time_us(reps=3, fn=lambda: k.delta("chunk", "f32", o, y, ab, ab[:, hv:], A_log, dt_bias, stb, qsn, posn, sln,
                                                       nb, C, 2 * hv, hv * D, hk, hv, 0, 1))
        print(f"gdn_chunk_f32, 16 prompts of 512 tokens (grid 16 x 32 x {D // BV}): {usb:.0f} us "
              f"({flop / usb / 1e6:.2f} TFLOP/s)", flush=True)
        x = y
        yo = torch.empty_like(y)
        wc = torch.ones(C, KW, dtype=torch.bfloat16, device=dev)
        us2 = self.time_us(lambda: k.conv("f32", yo, x, wc, state, qs, pos, slots, 1, T, C, C, hk, hv, 0, 1))
        cb = 2 * T * C * 2
        print(f"gdn_conv_f32, 8192 tokens x {C} channels: {us2:.0f} us (bytes {cb / 1e6:.0f} MB -> bound {cb / HBM * 1e6:.0f} us)", flush=True)
        B = 64
        st = torch.zeros(B * layer_bytes, dtype=torch.uint8, device=dev)
        yb = y[:B].contiguous()
        ob = o[:B]
        qsb = torch.arange(B + 1, dtype=torch.int32, device=dev)
        posb = torch.full((B,), 100, dtype=torch.int32, device=dev)
        slb = torch.arange(B, dtype=torch.int32, device=dev)
        us3 = self.time_us(lambda: k.delta("recurrent", "f32", ob, yb, ab, ab[:, hv:], A_log, dt_bias, st, qsb, posb, slb, B,
                                           C, 2 * hv, hv * D, hk, hv, 0, 1))
        sbytes = B * hv * D * D * 4 * 2
        nw_ = torch.ones(D, dtype=torch.bfloat16, device=dev)
        z = torch.randn(T, hv * D, device=dev).to(torch.bfloat16)
        us4 = self.time_us(lambda: k.norm(o, o, z, nw_, T, hv, hv * D, hv * D, hv * D))
        nbytes = 3 * T * hv * D * 2
        print(f"gdn_norm_gated, 8192 tokens x {hv} heads: {us4:.0f} us (bytes {nbytes / 1e6:.0f} MB -> bound "
              f"{nbytes / HBM * 1e6:.0f} us)", flush=True)
        print(f"gdn_recurrent_f32, {B} decode rows: {us3:.0f} us (state read + write {sbytes / 1e6:.0f} MB -> bound "
              f"{sbytes / HBM * 1e6:.0f} us)", flush=True)

    def table(self):
        print("\n| case | check | error | status |\n|---|---|---|---|")
        for (case, what, err, _tol, st) in self.rows:
            print(f"| {case} | {what} | {err} | {st} |")


def selftest():
    """CPU: ref_chunk == ref_recurrent in fp64 (the transcription of the chunked form is right)."""
    import torch
    torch.manual_seed(0)
    ok = True
    for L in (1, 63, 64, 65, 200):
        H = 3
        q = torch.randn(L, H, D, dtype=torch.float64)
        k = torch.randn(L, H, D, dtype=torch.float64)
        q = q / q.norm(dim=-1, keepdim=True)
        k = k / k.norm(dim=-1, keepdim=True)
        v = torch.randn(L, H, D, dtype=torch.float64)
        g = -torch.rand(L, H, dtype=torch.float64) * 2
        beta = torch.rand(L, H, dtype=torch.float64)
        S0 = torch.randn(H, D, D, dtype=torch.float64) * 0.1
        o1, S1 = ref_chunk(q, k, v, g, beta, S0)
        o2, S2 = ref_recurrent(q, k, v, g, beta, S0)
        e = max(float((o1 - o2).abs().max()), float((S1 - S2).abs().max()))
        print(f"{'PASS' if e < 1e-9 else 'FAIL'} selftest L={L}: chunked vs recurrent reference (fp64) max diff {e:.2e}")
        ok &= e < 1e-9
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", default="build/packs")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--quick", action="store_true", help="prompts up to 300 tokens")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--bv", type=int, default=32, help="GDN_BV of the build (experiments; the pack's is 32)")
    a = ap.parse_args()
    global BV, CHUNK_SMEM
    BV, CHUNK_SMEM = a.bv, chunk_smem(a.bv)
    if a.selftest:
        return selftest()
    import torch
    if not torch.cuda.is_available():
        print("FAIL no CUDA device", flush=True)
        return 1
    torch.cuda.set_device(0)
    k = K(a.dir)
    if k.missing:
        for m in k.missing:
            print(f"FAIL missing cubin entry: {m}", flush=True)
        print(f"gdn_verify: {len(k.missing)} entries missing in {a.dir}: build it with packs/kernels/build.sh", flush=True)
        return 1
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cupy {k.cupy.__version__}, cubins {a.dir}", flush=True)
    r = Run(k, a.quick)
    t0 = time.time()
    try:
        r.correctness()
    except Exception as e:  # noqa: BLE001 - a fault poisons the context: report and stop
        r.report(False, "run", "correctness run aborted", repr(e))
        print(f"gdn_verify: {r.passes} passed, {r.fails} failed (aborted)", flush=True)
        return 1
    r.table()
    if not a.no_timing:
        try:
            r.bench()
        except Exception as e:  # noqa: BLE001
            r.report(False, "timing", "timing run aborted", repr(e))
    print(f"\ngdn_verify: {r.passes} passed, {r.fails} failed ({time.time() - t0:.0f} s)", flush=True)
    return 1 if r.fails else 0


if __name__ == "__main__":
    sys.exit(main())
