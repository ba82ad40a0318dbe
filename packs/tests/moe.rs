//! Mixture-of-experts manifests (issue 26): the Qwen3-MoE presets pass `kern check` against the
//! real cubins with the MoE block's calls in every MoE layer and the dense MLP in the others;
//! exactly one grouped GEMM launch runs at every step size; the options an MoE manifest cannot
//! take are refused; and the expert weights load from both layouts — a Hugging Face checkpoint
//! of per-expert tensors (random weights) and a GGUF `qwen3moe` file of stacked [E, rows, cols]
//! tensors — into the same [E, 2I, H] / [E, H, I] bytes.

use kern_manifest::{load, CheckOptions, DType, Manifest};
use kern_packs::config::preset;
use kern_packs::{generate, generate_for_gguf, Config, Draft, DraftKind, PackOptions, Residual};
use kern_weights::Checkpoint;
mod common;
use common::kernels;
use kern_weights::gguf_write::string as strv;

const MOE_CALLS: [&str; 6] = ["router", "moe_select", "experts_gate_up", "experts_swiglu", "experts_down", "moe_combine"];

fn labels(m: &Manifest, l: u64) -> Vec<String> {
    let p = format!("l{l}.");
    m.programs[0].calls.iter().filter_map(|c| c.label.strip_prefix(&p).map(str::to_string)).collect()
}

/// The launches of `op` whose grid is positive at `tokens` (the other vars at their max).
fn live(m: &Manifest, op: &str, tokens: i64) -> Vec<String> {
    let mut vars = m.vars_at_max();
    vars[m.var("tokens").unwrap().0] = tokens;
    let op = &m.ops[m.op(op).unwrap_or_else(|| panic!("no op {op}")).0];
    op.launches.iter().filter(|l| l.runs(&vars).unwrap()).map(|l| l.entry.clone()).collect()
}

#[test]
fn moe_presets_pass_kern_check_with_the_moe_block_in_moe_layers() {
    let dir = tempfile::tempdir().unwrap();
    for (name, max_tokens, pdl_small) in [("qwen3-30b-a3b", 512, true), ("qwen3-30b-a3b", 8192, false), ("qwen3-moe-small", 64, true), ("qwen3-moe-small", 256, false)] {
        let cfg = preset(name).unwrap();
        let moe = cfg.moe.clone().unwrap();
        let opts = PackOptions { kernels: kernels(), max_tokens, pdl_small_steps: pdl_small, ..Default::default() };
        let out = dir.path().join(format!("{name}-{max_tokens}"));
        let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name}: {d}"));
        for l in 0..cfg.num_hidden_layers {
            let got = labels(&m, l);
            let mlp: Vec<&str> = got.iter().map(String::as_str).filter(|s| MOE_CALLS.contains(s) || ["gate_up_proj", "swiglu", "down_proj"].contains(s)).collect();
            if moe.is_moe(l) {
                assert_eq!(mlp, MOE_CALLS, "{name} layer {l}");
            } else {
                assert_eq!(mlp, ["gate_up_proj", "swiglu", "down_proj"], "{name} layer {l}: a dense layer (mlp_only_layers)");
            }
        }
        // Without a dense layer the dense MLP's ops and buffers are left out.
        let dense = (0..cfg.num_hidden_layers).any(|l| !moe.is_moe(l));
        assert_eq!(m.op("gate_up_proj").is_some(), dense, "{name}");
        assert_eq!(m.buffer("gate_up").is_some(), dense, "{name}");
        // Exactly one grouped GEMM launch (two copies under --pdl-small-steps: one per side of
        // 8 tokens) runs at every step size: moe_gemm_s up to 64 tokens, moe_gemm_w above.
        for tokens in [1i64, 2, 8, 9, 63, 64, 65, 300, max_tokens as i64] {
            if tokens > max_tokens as i64 {
                continue;
            }
            for op in ["moe_gate_up", "moe_down"] {
                let want = if tokens <= 64 { "moe_gemm_s" } else { "moe_gemm_w" };
                assert_eq!(live(&m, op, tokens), [want], "{name} {op} tokens={tokens}");
            }
            // Routing: top-k and the permutation in one launch up to 64 tokens, two above.
            let want: &[&str] = if tokens <= 64 { &["moe_topk_route"] } else { &["moe_topk", "moe_route"] };
            assert_eq!(live(&m, "moe_select", tokens), want, "{name} tokens={tokens}");
        }
        // The grouped GEMM's grid covers the worst routing: floor(P / tile) + min(E, P) tiles.
        let mut vars = m.vars_at_max();
        vars[m.var("tokens").unwrap().0] = 1;
        let op = &m.ops[m.op("moe_gate_up").unwrap().0];
        let s = op.launches.iter().find(|l| l.entry == "moe_gemm_s").unwrap();
        assert_eq!(s.grid[0].eval(&vars).unwrap(), (moe.top_k / 16 + moe.top_k.min(moe.num_experts)) as i64, "{name}: batch 1 has k tiles");
        // moe_gemm_w: 256 threads, 128-row tiles, its shared bytes; at the largest step the
        // worst routing's tiles.
        let w = op.launches.iter().find(|l| l.entry == "moe_gemm_w");
        assert_eq!(w.is_some(), max_tokens > 64, "{name} max_tokens {max_tokens}: moe_gemm_w only where a step can exceed 64 tokens");
        if let Some(w) = w {
            assert_eq!((w.block[0].eval(&vars).unwrap(), w.shared.eval(&vars).unwrap()), (256, kern_packs::moe::SMEM_W as i64), "{name}");
            vars[m.var("tokens").unwrap().0] = max_tokens as i64;
            let p = max_tokens as i64 * moe.top_k as i64;
            assert_eq!(w.grid[0].eval(&vars).unwrap(), p / 128 + p.min(moe.num_experts as i64), "{name}: worst-case 128-row tiles");
        }
        // Expert weights: [E·2I, H] and [E·H, I] concatenated from per-expert tensors.
        let gu = m.buffer("model.layers.3.mlp.experts.gate_up_proj.weight").unwrap();
        let shape = m.shape(gu, &m.vars_at_max()).unwrap();
        assert_eq!(shape, [(moe.num_experts * 2 * moe.intermediate) as i64, cfg.hidden_size as i64], "{name}");
    }
}

#[test]
fn moe_options_that_cannot_hold_are_refused_and_others_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = preset("qwen3-moe-small").unwrap();
    let base = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 8, max_context: 512, ..Default::default() };
    let e = generate(&cfg, &PackOptions { tp: Some(2), ..base.clone() }, &dir.path().join("tp")).unwrap_err().to_string();
    assert!(e.contains("--tp") && e.contains("docs/moe.md"), "{e}");
    let e = generate(&cfg, &PackOptions { decode_fusion: true, ..base.clone() }, &dir.path().join("fused")).unwrap_err().to_string();
    assert!(e.contains("--decode-fusion"), "{e}");
    // A bf16 residual, and a layer-skip draft (its program has the MoE calls of its layers).
    for (what, opts) in [
        ("residual bf16", PackOptions { residual: Residual::Bf16, ..base.clone() }),
        ("draft", PackOptions { draft: Some(Draft { kind: DraftKind::LayerSkip(3), k: 4 }), ..base.clone() }),
    ] {
        let m = load(&generate(&cfg, &opts, &dir.path().join(what)).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{what}: {d}"));
        if what == "draft" {
            let draft = m.programs.iter().find(|p| p.name == "draft").unwrap();
            assert!(draft.calls.iter().any(|c| c.label == "l2.moe_combine") && !draft.calls.iter().any(|c| c.label == "l3.moe_combine"));
        }
    }
}

/// A tiny Qwen3-MoE: hidden 128, 2 heads of 64, 1 kv head, layer 0 dense (ffn 256), layer 1 of
/// 8 experts, top-2, expert width 32, vocab 64.
fn tiny_hf() -> Config {
    Config::from_hf(&serde_json::json!({"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 64, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "norm_topk_prob": true, "mlp_only_layers": [0]}))
    .unwrap()
}

fn bytes(ckpt: &Checkpoint, m: &Manifest, name: &str) -> Vec<u8> {
    let b = &m.buffers[m.buffer(name).unwrap_or_else(|| panic!("{name}")).0];
    let mut got = vec![0u8; b.bytes_at_max as usize];
    kern_weights::materialize(ckpt, b, &mut got).unwrap();
    got
}

#[test]
fn expert_weights_load_from_per_expert_safetensors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_hf();
    kern_packs::random::write(&cfg, 3, &dir.path().join("w"), u64::MAX, |_, _| {}).unwrap();
    let ckpt = Checkpoint::open(&dir.path().join("w")).unwrap();
    let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 4, max_context: 256, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &dir.path().join("p")).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert!(kern_weights::check(&ckpt, &m.buffers).is_empty(), "{:#?}", kern_weights::check(&ckpt, &m.buffers));
    assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty(), "every expert tensor is used");
    let got = bytes(&ckpt, &m, "model.layers.1.mlp.experts.gate_up_proj.weight");
    let want: Vec<u8> = (0..8)
        .flat_map(|e| ["gate_proj", "up_proj"].map(|p| format!("model.layers.1.mlp.experts.{e}.{p}.weight")))
        .flat_map(|n| ckpt.read_as(&n, DType::Bf16).unwrap())
        .collect();
    assert!(got == want, "gate_up: expert e's gate rows, then its up rows, for e = 0..E");
    assert!(m.buffer("model.layers.0.mlp.gate_up_proj.weight").is_some(), "layer 0 is dense");
}

fn u32v(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// The same tiny model as a GGUF `qwen3moe` file (F32 tensors), experts stacked per layer.
fn tiny_gguf() -> Vec<u8> {
    let (h, d, i, e, ie, v) = (128u64, 64u64, 256u64, 8u64, 32u64, 64u64);
    let mut w = kern_weights::gguf_write::Writer::new();
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&v.to_le_bytes());
    for t in 0..v {
        tokens.extend_from_slice(&strv(&format!("t{t}")));
    }
    w.kv("general.architecture", 8, &strv("qwen3moe"));
    for (k, x) in [("block_count", 2), ("context_length", 4096), ("embedding_length", h), ("feed_forward_length", i), ("attention.head_count", 2), ("attention.head_count_kv", 1),
                   ("expert_count", e), ("expert_used_count", 2), ("expert_feed_forward_length", ie)] {
        w.kv(&format!("qwen3moe.{k}"), 4, &u32v(x as u32));
    }
    w.kv("qwen3moe.rope.freq_base", 6, &1e6f32.to_le_bytes());
    w.kv("qwen3moe.attention.layer_norm_rms_epsilon", 6, &1e-6f32.to_le_bytes());
    w.kv("tokenizer.ggml.tokens", 9, &tokens);
    let mut t: Vec<(String, Vec<u64>)> = vec![("token_embd.weight".into(), vec![h, v]), ("output_norm.weight".into(), vec![h]), ("output.weight".into(), vec![h, v])];
    for l in 0..2 {
        let p = format!("blk.{l}");
        for (n, dims) in [("attn_norm", vec![h]), ("attn_q", vec![h, 2 * d]), ("attn_k", vec![h, d]), ("attn_v", vec![h, d]), ("attn_q_norm", vec![d]), ("attn_k_norm", vec![d]),
                          ("attn_output", vec![2 * d, h]), ("ffn_norm", vec![h])] {
            t.push((format!("{p}.{n}.weight"), dims));
        }
        if l == 0 {
            t.extend([(format!("{p}.ffn_gate.weight"), vec![h, i]), (format!("{p}.ffn_up.weight"), vec![h, i]), (format!("{p}.ffn_down.weight"), vec![i, h])]);
        } else {
            // ggml order (fastest first): [H, I, E] for gate / up, [I, H, E] for down.
            t.extend([(format!("{p}.ffn_gate_inp.weight"), vec![h, e]), (format!("{p}.ffn_gate_exps.weight"), vec![h, ie, e]),
                      (format!("{p}.ffn_up_exps.weight"), vec![h, ie, e]), (format!("{p}.ffn_down_exps.weight"), vec![ie, h, e])]);
        }
    }
    let mut seed = 7u32;
    for (name, dims) in t {
        let n: u64 = dims.iter().product();
        let data: Vec<u8> = (0..n)
            .flat_map(|_| {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                (((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1).to_le_bytes()
            })
            .collect();
        w.tensor(&name, &dims, 0, data);
    }
    w.bytes()
}

#[test]
fn stacked_gguf_experts_load_as_the_same_layout() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny-moe.gguf");
    std::fs::write(&file, tiny_gguf()).unwrap();
    let ckpt = Checkpoint::open(&file).unwrap();
    let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
    let moe = cfg.moe.clone().unwrap();
    assert_eq!((moe.num_experts, moe.top_k, moe.intermediate, moe.norm_topk_prob, moe.stacked), (8, 2, 32, true, true));
    assert_eq!(moe.mlp_only_layers, [0], "layer 0 has no router: dense");
    assert_eq!(ckpt.tensor("blk.1.ffn_gate_exps.weight").unwrap().dims(), [8, 32, 128], "3-D GGUF tensors read as [E, rows, cols]");
    let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 4, max_context: 256, ..Default::default() };
    let m = load(&generate_for_gguf(&cfg, &opts, &dir.path().join("p")).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert!(kern_weights::check(&ckpt, &m.buffers).is_empty(), "{:#?}", kern_weights::check(&ckpt, &m.buffers));
    assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty());
    // [E, 2I, H]: per expert, its 32 gate rows then its 32 up rows.
    let got = bytes(&ckpt, &m, "model.layers.1.mlp.experts.gate_up_proj.weight");
    let (g, u) = (ckpt.read_as("blk.1.ffn_gate_exps.weight", DType::Bf16).unwrap(), ckpt.read_as("blk.1.ffn_up_exps.weight", DType::Bf16).unwrap());
    let per = 32 * 128 * 2;
    let want: Vec<u8> = (0..8).flat_map(|e| [&g[e * per..(e + 1) * per], &u[e * per..(e + 1) * per]].concat()).collect();
    assert!(got == want);
    assert_eq!(bytes(&ckpt, &m, "model.layers.1.mlp.experts.down_proj.weight"), ckpt.read_as("blk.1.ffn_down_exps.weight", DType::Bf16).unwrap());
    assert_eq!(kern_packs::families::to_hf_json(&cfg)["mlp_only_layers"], serde_json::json!([0]));
}

/// docs/moe.md, "Expert parallelism, on paper": the declarations a two-rank expert-parallel
/// manifest needs that the manifest already has — the stacked experts cut along the expert
/// dimension (gate and up concatenated along it), an all-reduce of the MoE output — pass
/// `kern check`, and each rank's slices load from the GGUF file. (The rank's first expert as a
/// kernel argument is the kern-manifest change the doc describes; the kernels here still take
/// every expert.)
#[test]
fn expert_parallel_declarations_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny-moe.gguf");
    std::fs::write(&file, tiny_gguf()).unwrap();
    let ckpt = Checkpoint::open(&file).unwrap();
    let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
    let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 4, max_context: 256, ..Default::default() };
    let path = generate_for_gguf(&cfg, &opts, &dir.path().join("p")).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let shard = serde_json::json!({"dim": 0, "parts": 2, "part": "rank"});
    m["parallel"] = serde_json::json!({"tp": 2});
    m["buffers"]["model.layers.1.mlp.experts.down_proj.weight"] =
        serde_json::json!({"dtype": "bf16", "shape": [4, 128, 32], "role": "weight", "from": {"tensor": "blk.1.ffn_down_exps.weight", "shard": shard}});
    m["buffers"]["model.layers.1.mlp.experts.gate_up_proj.weight"] = serde_json::json!({"dtype": "bf16", "shape": [8, 32, 128], "role": "weight",
        "from": {"concat": ["blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight"], "axis": 0, "sizes": [4, 4], "shard": shard}});
    m["ops"]["all_reduce"] = serde_json::json!({"params": ["inout buffer<bf16>"], "impl": {"collective": "all_reduce_sum"}});
    let calls = m["program"]["calls"].as_array_mut().unwrap();
    let at = calls.iter().position(|c| c["label"] == "l1.moe_combine").unwrap();
    calls.insert(at + 1, serde_json::json!({"label": "l1.moe_combine.all_reduce", "op": "all_reduce", "args": [{"buf": "mlp"}]}));
    let ep = dir.path().join("p/model.ep.json");
    std::fs::write(&ep, serde_json::to_string_pretty(&m).unwrap()).unwrap();
    let m = load(&ep, &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!((m.tp(), m.has_collectives()), (2, true));
    for rank in 0..2 {
        let problems = kern_weights::check_rank(&ckpt, &m.buffers, rank);
        assert!(problems.is_empty(), "rank {rank}: {problems:#?}");
    }
    // Rank 1's down experts are experts 4..8 of the file.
    let b = &m.buffers[m.buffer("model.layers.1.mlp.experts.down_proj.weight").unwrap().0];
    let mut got = vec![0u8; b.bytes_at_max as usize];
    kern_weights::materialize_rank(&ckpt, b, 1, &mut got).unwrap();
    let all = ckpt.read_as("blk.1.ffn_down_exps.weight", DType::Bf16).unwrap();
    assert!(got[..] == all[all.len() / 2..]);
}

/// `--router-logits f32`: the router GEMM writes fp32 logits (its `_f32out` entries at every
/// step size), the top-k reads them (`moe_topk_route_f32` / `moe_topk_f32`), and the manifest
/// passes `kern check` against the real cubins (the entries' parameter types included); the
/// default stays bf16. Qwen3-Next's MoE (512 experts, a shared expert) too: its shared expert's
/// GEMMs keep bf16 outputs.
#[test]
fn router_logits_f32_is_an_fp32_router_gemm_and_top_k() {
    let dir = tempfile::tempdir().unwrap();
    for (name, max_tokens) in [("qwen3-moe-small", 256), ("qwen3-next-small", 256)] {
        let cfg = preset(name).unwrap();
        for f32_logits in [false, true] {
            let router_logits = if f32_logits { kern_packs::moe::RouterLogits::F32 } else { Default::default() };
            let opts = PackOptions { kernels: kernels(), max_tokens, router_logits, ..Default::default() };
            let out = dir.path().join(format!("{name}-{f32_logits}"));
            let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name} f32={f32_logits}: {d}"));
            let logits = m.buffer("moe_logits").unwrap();
            assert_eq!(m.buffers[logits.0].dtype, if f32_logits { DType::F32 } else { DType::Bf16 }, "{name}");
            let sfx = if f32_logits { "_f32" } else { "" };
            for tokens in [1i64, 8, 9, 64, 65, max_tokens as i64] {
                let select: Vec<String> = if tokens <= 64 { vec![format!("moe_topk_route{sfx}")] } else { vec![format!("moe_topk{sfx}"), "moe_route".into()] };
                assert_eq!(live(&m, "moe_select", tokens), select, "{name} f32={f32_logits} tokens={tokens}");
                let router = live(&m, "moe_router", tokens);
                assert_eq!(router.len(), 1, "{name} tokens={tokens}: one router launch, {router:?}");
                assert_eq!(router[0].ends_with("_f32out"), f32_logits, "{name} tokens={tokens}: {router:?}");
            }
            if m.op("shared_gate_up").is_some() {
                assert!(live(&m, "shared_gate_up", 1).iter().all(|e| !e.ends_with("_f32out")), "{name}: the shared expert stays bf16");
            }
        }
    }
    // A dense model has no router: the option is refused by name, not ignored.
    let opts = PackOptions { kernels: kernels(), router_logits: kern_packs::moe::RouterLogits::F32, ..Default::default() };
    let e = generate(&preset("qwen3-0.6b").unwrap(), &opts, &dir.path().join("dense")).unwrap_err().to_string();
    assert!(e.contains("--router-logits f32") && e.contains("no mixture-of-experts router"), "{e}");
}

/// `--moe-gemm mma`: prefill steps run `moe_gemm_l` (mma.sync, 64-row tiles, 128 threads) instead
/// of the default `moe_gemm_w`; decode steps run `moe_gemm_s` either way; both manifests pass
/// `kern check` against the real cubins; a dense model refuses the option by name.
#[test]
fn moe_gemm_mma_keeps_the_mma_sync_prefill_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = preset("qwen3-moe-small").unwrap();
    for (kind, want) in [(kern_packs::moe::MoeGemm::Wgmma, "moe_gemm_w"), (kern_packs::moe::MoeGemm::Mma, "moe_gemm_l")] {
        let opts = PackOptions { kernels: kernels(), max_tokens: 256, moe_gemm: kind, ..Default::default() };
        let m = load(&generate(&cfg, &opts, &dir.path().join(kind.to_string())).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{kind}: {d}"));
        for op in ["moe_gate_up", "moe_down"] {
            assert_eq!(live(&m, op, 64), ["moe_gemm_s"], "{kind} {op}");
            assert_eq!(live(&m, op, 65), [want], "{kind} {op}");
            assert_eq!(live(&m, op, 256), [want], "{kind} {op}");
        }
    }
    let opts = PackOptions { kernels: kernels(), moe_gemm: kern_packs::moe::MoeGemm::Mma, ..Default::default() };
    let e = generate(&preset("qwen3-0.6b").unwrap(), &opts, &dir.path().join("dense")).unwrap_err().to_string();
    assert!(e.contains("--moe-gemm mma") && e.contains("no mixture-of-experts layer"), "{e}");
}
