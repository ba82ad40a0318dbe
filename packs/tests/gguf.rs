//! `kern pack --gguf`: small Qwen2, Qwen3, Llama and Gemma 3 GGUF files written here give a
//! config from their metadata and a manifest whose every weight loads from the file's tensors
//! (each family's names mapped, shapes reversed from GGUF order, tied or separate output),
//! passing `kern check` against the real cubins. Other architectures are refused with the
//! supported list.

use kern_manifest::{load, CheckOptions, DType};
use kern_packs::{generate_for_gguf, PackOptions};
use kern_weights::Checkpoint;
use std::path::{Path, PathBuf};
mod common;
use common::kernels;
use kern_weights::gguf_write::string as strv;

/// Appends a GGUF string to `out`.
fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&strv(v));
}

/// A GGUF v3 file: metadata (key, type id, value bytes) and tensors (name, GGUF dims, type id)
/// with seeded data: Q8_0 blocks with small f16 scales, f32 tensors near 1.
fn gguf(kv: &[(&str, u32, Vec<u8>)], tensors: &[(String, Vec<u64>, u32)]) -> Vec<u8> {
    let mut w = kern_weights::gguf_write::Writer::new();
    for (k, t, v) in kv {
        w.kv(k, *t, v);
    }
    let mut seed = 1u32;
    for (name, dims, ty) in tensors {
        let n: u64 = dims.iter().product();
        let bytes = match ty {
            0 => n * 4,
            2 => n / 32 * 18,
            8 => n / 32 * 34,
            _ => unreachable!(),
        };
        let data = (0..bytes as usize)
            .map(|i| {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                match ty {
                    8 if i % 34 == 1 => 0x20,
                    2 if i % 18 == 1 => 0x20,
                    0 if i % 4 == 3 => 0x3f,
                    _ => (seed >> 24) as u8,
                }
            })
            .collect();
        w.tensor(name, dims, *ty, data);
    }
    w.bytes()
}

fn u32v(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn f32v(v: f32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}


/// A 2-layer model: hidden 128, 2 heads of 64, 1 kv head, ffn 256, vocab 64.
fn model(arch: &str, tied: bool, extra: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let (h, d, hq, hkv, i, v) = (128u64, 64u64, 2u64, 1u64, 256u64, 64u64);
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&v.to_le_bytes());
    for t in 0..v {
        s(&mut tokens, &format!("t{t}"));
    }
    let k = |n: &str| format!("{arch}.{n}");
    let mut kv: Vec<(String, u32, Vec<u8>)> = vec![
        ("general.architecture".into(), 8, strv(arch)),
        (k("block_count"), 4, u32v(2)),
        (k("context_length"), 4, u32v(4096)),
        (k("embedding_length"), 4, u32v(h as u32)),
        (k("feed_forward_length"), 4, u32v(i as u32)),
        (k("attention.head_count"), 4, u32v(hq as u32)),
        (k("attention.head_count_kv"), 4, u32v(hkv as u32)),
        (k("rope.freq_base"), 6, f32v(1e6)),
        (k("attention.layer_norm_rms_epsilon"), 6, f32v(1e-6)),
        ("tokenizer.ggml.tokens".into(), 9, tokens),
    ];
    if arch == "gemma3" {
        kv.push((k("attention.sliding_window"), 4, u32v(32)));
    }
    for (a, b, c) in extra {
        kv.push((a.to_string(), *b, c.clone()));
    }
    let mut t: Vec<(String, Vec<u64>, u32)> = vec![("token_embd.weight".into(), vec![h, v], 8), ("output_norm.weight".into(), vec![h], 0)];
    if !tied {
        t.push(("output.weight".into(), vec![h, v], 8));
    }
    for l in 0..2 {
        let p = format!("blk.{l}");
        t.push((format!("{p}.attn_norm.weight"), vec![h], 0));
        t.push((format!("{p}.attn_q.weight"), vec![h, hq * d], 8));
        t.push((format!("{p}.attn_k.weight"), vec![h, hkv * d], 8));
        t.push((format!("{p}.attn_v.weight"), vec![h, hkv * d], 8));
        if arch == "qwen2" {
            t.push((format!("{p}.attn_q.bias"), vec![hq * d], 0));
            t.push((format!("{p}.attn_k.bias"), vec![hkv * d], 0));
            t.push((format!("{p}.attn_v.bias"), vec![hkv * d], 0));
        } else if arch != "llama" {
            t.push((format!("{p}.attn_q_norm.weight"), vec![d], 0));
            t.push((format!("{p}.attn_k_norm.weight"), vec![d], 0));
        }
        if arch == "gemma3" {
            t.push((format!("{p}.post_attention_norm.weight"), vec![h], 0));
            t.push((format!("{p}.post_ffw_norm.weight"), vec![h], 0));
        }
        t.push((format!("{p}.attn_output.weight"), vec![hq * d, h], 8));
        t.push((format!("{p}.ffn_norm.weight"), vec![h], 0));
        t.push((format!("{p}.ffn_gate.weight"), vec![h, i], 8));
        t.push((format!("{p}.ffn_up.weight"), vec![h, i], 8));
        t.push((format!("{p}.ffn_down.weight"), vec![i, h], 8));
    }
    let kv: Vec<(&str, u32, Vec<u8>)> = kv.iter().map(|(a, b, c)| (a.as_str(), *b, c.clone())).collect();
    gguf(&kv, &t)
}

/// A Llama file with Llama 3.1's `rope_freqs.weight` (32 divisors for head_dim 64).
fn llama3() -> Vec<u8> {
    let (h, d, hq, hkv, i, v) = (128u64, 64u64, 2u64, 1u64, 256u64, 64u64);
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&v.to_le_bytes());
    for t in 0..v {
        s(&mut tokens, &format!("t{t}"));
    }
    let kv: Vec<(&str, u32, Vec<u8>)> = vec![
        ("general.architecture", 8, strv("llama")),
        ("llama.block_count", 4, u32v(1)),
        ("llama.embedding_length", 4, u32v(h as u32)),
        ("llama.feed_forward_length", 4, u32v(i as u32)),
        ("llama.attention.head_count", 4, u32v(hq as u32)),
        ("llama.attention.head_count_kv", 4, u32v(hkv as u32)),
        ("llama.rope.freq_base", 6, f32v(5e5)),
        ("llama.attention.layer_norm_rms_epsilon", 6, f32v(1e-5)),
        ("tokenizer.ggml.tokens", 9, tokens),
    ];
    let mut t: Vec<(String, Vec<u64>, u32)> = vec![("token_embd.weight".into(), vec![h, v], 8), ("output_norm.weight".into(), vec![h], 0), ("rope_freqs.weight".into(), vec![d / 2], 0)];
    for (n, dims, ty) in [("attn_norm", vec![h], 0), ("attn_q", vec![h, hq * d], 8), ("attn_k", vec![h, hkv * d], 8), ("attn_v", vec![h, hkv * d], 8), ("attn_output", vec![hq * d, h], 8), ("ffn_norm", vec![h], 0), ("ffn_gate", vec![h, i], 8), ("ffn_up", vec![h, i], 8), ("ffn_down", vec![i, h], 8)] {
        t.push((format!("blk.0.{n}.weight"), dims, ty));
    }
    gguf(&kv, &t)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn qwen2_and_qwen3_gguf_pack_and_every_weight_loads() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, tied) in [("qwen2", false), ("qwen3", true)] {
        let file = write(dir.path(), &format!("{arch}.gguf"), &model(arch, tied, &[]));
        let ckpt = Checkpoint::open(&file).unwrap();
        let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
        assert_eq!((cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers), (128, 256, 2), "{arch}");
        assert_eq!((cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim(), cfg.vocab_size), (2, 1, 64, 64), "{arch}");
        assert_eq!((cfg.rms_norm_eps, cfg.rope_theta, cfg.max_position_embeddings), (1e-6, 1e6, Some(4096)), "{arch}");
        assert_eq!(cfg.tie_word_embeddings, tied);
        assert_eq!(cfg.qkv_bias(), arch == "qwen2");
        assert_eq!(cfg.qk_norm(), arch == "qwen3");

        let out = dir.path().join(format!("{arch}-packed"));
        let opts = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 4, max_context: 256, ..Default::default() };
        let path = generate_for_gguf(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{arch}: {d}"));
        let problems = kern_weights::check(&ckpt, &m.buffers);
        assert!(problems.is_empty(), "{arch}: {problems:#?}");
        assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty(), "{arch}: every tensor is used");

        // The fused QKV weight is Q, K, V dequantized and stacked: [256, 128] as bf16.
        let qkv = &m.buffers[m.buffer("model.layers.1.self_attn.qkv_proj.weight").unwrap().0];
        let mut got = vec![0u8; qkv.bytes_at_max as usize];
        kern_weights::materialize(&ckpt, qkv, &mut got).unwrap();
        let want: Vec<u8> = ["blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight"]
            .iter()
            .flat_map(|n| ckpt.read_as(n, DType::Bf16).unwrap())
            .collect();
        assert!(got == want, "{arch}: qkv");
        let lm = &m.buffers[m.buffer("lm_head.weight").unwrap().0];
        assert_eq!(matches!(lm.source, Some(kern_manifest::WeightSource::Alias(_))), tied, "{arch}");
    }
}

#[test]
fn other_architectures_and_inconsistent_metadata_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = model("qwen2", true, &[]);
    // Same length as "qwen2": the architecture string only.
    let at = b.windows(5).position(|w| w == b"qwen2").unwrap();
    b[at..at + 5].copy_from_slice(b"mamba");
    let file = write(dir.path(), "mamba.gguf", &b);
    let ckpt = Checkpoint::open(&file).unwrap();
    let e = kern_packs::families::from_gguf(&ckpt, &file).unwrap_err();
    assert!(e.contains("architecture `mamba`") && e.contains("qwen3, qwen2, llama, gemma3") && e.contains("mamba.gguf"), "{e}");

    let file = write(dir.path(), "bad-kl.gguf", &model("qwen3", true, &[("qwen3.attention.key_length", 4, u32v(128))]));
    let ckpt = Checkpoint::open(&file).unwrap();
    let e = kern_packs::families::from_gguf(&ckpt, &file).unwrap_err();
    assert!(e.contains("key_length") && e.contains("head_dim 64"), "{e}");

    let file = write(dir.path(), "longrope.gguf", &model("qwen2", true, &[("qwen2.rope.scaling.type", 8, strv("longrope"))]));
    let ckpt = Checkpoint::open(&file).unwrap();
    let e = kern_packs::families::from_gguf(&ckpt, &file).unwrap_err();
    assert!(e.contains("`longrope`") && e.contains("none, linear and yarn"), "{e}");

    let file = write(dir.path(), "linear-no-factor.gguf", &model("llama", true, &[("llama.rope.scaling.type", 8, strv("linear"))]));
    let ckpt = Checkpoint::open(&file).unwrap();
    let e = kern_packs::families::from_gguf(&ckpt, &file).unwrap_err();
    assert!(e.contains("no factor"), "{e}");
}

/// Issue 18: `kern pack --gguf ... --draft`: the draft program reads the same GGUF-named weights
/// as the target, and the manifest passes `kern check` with its `draft_kv` state.
#[test]
fn gguf_packs_take_a_draft_too() {
    use kern_packs::{Draft, DraftKind};
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "qwen3.gguf", &model("qwen3", true, &[]));
    let ckpt = Checkpoint::open(&file).unwrap();
    let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
    for (kind, layers) in [(DraftKind::LayerSkip(1), 1), (DraftKind::SelfDraft, 2)] {
        let out = dir.path().join(kind.to_string().replace(':', "-"));
        let opts = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 4, max_context: 256, draft: Some(Draft { kind, k: 3 }), ..Default::default() };
        let path = generate_for_gguf(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{kind}: {d}"));
        assert!(kern_weights::check(&ckpt, &m.buffers).is_empty(), "{kind}");
        let spec = m.speculative.as_ref().expect("speculative section");
        assert_eq!((m.programs[spec.draft].name.as_str(), spec.k), ("draft", 3), "{kind}");
        let bytes = |s: &str| match m.states[m.state(s).unwrap().0].size {
            kern_manifest::StateSize::PerToken { bytes, .. } => bytes,
            _ => panic!("per token"),
        };
        // 1 kv head of 64, K and V, bf16: 256 bytes per layer.
        assert_eq!((bytes("kv"), bytes("draft_kv")), (2 * 256, layers * 256), "{kind}");
        let draft = m.program("draft").unwrap();
        let qkv = m.buffer("model.layers.0.self_attn.qkv_proj.weight").unwrap();
        assert!(draft.calls.iter().any(|c| c.args.contains(&kern_manifest::Binding::Buf(qkv))), "{kind}: the draft reads the target's weights");
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(json["buffers"]["model.layers.0.self_attn.qkv_proj.weight"]["from"]["concat"][0], "blk.0.attn_q.weight");
    }
}

/// Llama and Gemma 3 GGUF files: every tensor is used under the family's names; a Llama file's
/// q/k rows are rotated as adjacent pairs (llama.cpp permuted them) and its `rope_freqs.weight`
/// becomes the manifest's frequency table; a Gemma 3 file's norms already hold the `1 +`
/// (offset 0), its every 6th layer is global and the rest have the file's window.
#[test]
fn llama_and_gemma3_gguf_pack_with_their_conventions() {
    use kern_packs::config::{NormKind, RopePairs};
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama", "gemma3"] {
        let file = write(dir.path(), &format!("{arch}.gguf"), &model(arch, arch == "gemma3", &[]));
        let ckpt = Checkpoint::open(&file).unwrap();
        let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
        let out = dir.path().join(format!("{arch}-packed"));
        let opts = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 4, max_context: 256, ..Default::default() };
        let path = generate_for_gguf(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{arch}: {d}"));
        let problems = kern_weights::check(&ckpt, &m.buffers);
        assert!(problems.is_empty(), "{arch}: {problems:#?}");
        assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty(), "{arch}: every tensor is used");
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let rope = &json["ops"]["qk_norm_rope"]["impl"]["launches"][0]["args"][16]["i32"];
        if arch == "llama" {
            assert_eq!((cfg.rope_pairs, cfg.norm, cfg.qk_norm()), (RopePairs::Adjacent, NormKind::Scale, false));
            assert_eq!(rope.as_i64(), Some(8), "adjacent pairs, no q/k norm");
        } else {
            assert_eq!((cfg.norm, cfg.rope_pairs, cfg.window(0), cfg.window(1), cfg.head_dim()), (NormKind::Offset(0.0), RopePairs::Halves, Some(32), Some(32), 64));
            assert_eq!(rope.as_i64(), Some(1 + 4), "q/k norm in Gemma's fp32 form");
            assert_eq!(json["buffers"]["model.layers.1.post_attention_layernorm.weight"]["from"]["tensor"], "blk.1.post_attention_norm.weight");
            assert_eq!(json["buffers"]["model.layers.1.pre_feedforward_layernorm.weight"]["from"]["tensor"], "blk.1.ffn_norm.weight");
            assert_eq!(json["ops"]["add_rms_norm"]["impl"]["launches"][0]["entry"], "add_rms_norm_f32_off");
        }
    }
    let file = write(dir.path(), "llama3.gguf", &llama3());
    let ckpt = Checkpoint::open(&file).unwrap();
    let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
    let kern_packs::rope::RopeScaling::Divisors(div) = &cfg.rope_scaling else { panic!("{:?}", cfg.rope_scaling) };
    let out = dir.path().join("llama3-packed");
    let opts = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 4, max_context: 256, ..Default::default() };
    let path = generate_for_gguf(&cfg, &opts, &out).unwrap();
    let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("llama3: {d}"));
    assert!(kern_weights::check(&ckpt, &m.buffers).is_empty());
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let table: Vec<f64> = json["buffers"]["rope.inv_freq"]["from"]["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let want: Vec<f32> = (0..32).map(|i| (1.0 / 5e5f64.powf(2.0 * i as f64 / 64.0)) as f32).collect();
    assert_eq!(table.len(), 32);
    for i in 0..32 {
        let expect = f64::from(want[i] / div[i]);
        assert!((table[i] - expect).abs() <= expect.abs() * 1e-6, "{i}: {} vs {expect}", table[i]);
    }
    // The table is an argument of every layer's RoPE call.
    let rope_call = m.program("main").unwrap().calls.iter().find(|c| c.label == "l0.qk_norm_rope").unwrap();
    assert_eq!(rope_call.args[10], kern_manifest::Binding::Buf(m.buffer("rope.inv_freq").unwrap()));
}

/// Issue 25: `kern pack --gguf` keeps the projections, the LM head and the embedding in the
/// file's blocks (GGUF-native): their buffers are block dtypes whose shape counts blocks, every
/// one loads the file's bytes unchanged, the GEMVs run up to 64 rows and larger steps
/// dequantize into one scratch matrix for the bf16 GEMM. A projection whose parts have different
/// block types (v in Q4_0 here, q and k in Q8_0) is split into one GEMV per part writing its
/// columns of the fused output.
#[test]
fn gguf_native_weights_stay_in_their_blocks() {
    use kern_manifest::DType;
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "qwen3.gguf", &model_with_v_type("qwen3", 2));
    let ckpt = Checkpoint::open(&file).unwrap();
    let cfg = kern_packs::families::from_gguf(&ckpt, &file).unwrap();
    let native = ckpt.names().into_iter().filter_map(|n| Some((n.to_string(), ckpt.tensor(n).ok()?.ggml?.block_dtype()?))).collect();
    let out = dir.path().join("native");
    let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 4, max_context: 512, native, ..Default::default() };
    let path = generate_for_gguf(&cfg, &opts, &out).unwrap();
    let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert!(kern_weights::check(&ckpt, &m.buffers).is_empty(), "{:#?}", kern_weights::check(&ckpt, &m.buffers));
    assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty());
    let dtype = |b: &str| m.buffers[m.buffer(b).unwrap_or_else(|| panic!("no buffer {b}")).0].dtype;
    // Layer 0: q, k, v all Q8_0 → one fused q8_0 weight of [256, 128 / 32] blocks.
    assert_eq!(dtype("model.layers.0.self_attn.qkv_proj.weight"), DType::Q8_0);
    let qkv0 = &m.buffers[m.buffer("model.layers.0.self_attn.qkv_proj.weight").unwrap().0];
    assert_eq!(qkv0.bytes_at_max, 256 * 4 * 34);
    // Layer 1: v is Q4_0 → three parts, the fused buffer gone.
    assert!(m.buffer("model.layers.1.self_attn.qkv_proj.weight").is_none());
    assert_eq!((dtype("model.layers.1.self_attn.qkv_proj.weight.part0"), dtype("model.layers.1.self_attn.qkv_proj.weight.part2")), (DType::Q8_0, DType::Q4_0));
    // Norms stay bf16; the separate output (Q8_0) and the embedding are blocks.
    assert_eq!((dtype("model.norm.weight"), dtype("lm_head.weight"), dtype("model.embed_tokens.weight")), (DType::Bf16, DType::Q8_0, DType::Q8_0));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let call = |label: &str| m.programs[0].calls.iter().find(|c| c.label == label).unwrap();
    let op_name = |label: &str| m.ops[call(label).op.0].name.clone();
    assert_eq!(op_name("l0.qkv_proj"), "qkv_proj_q8_0");
    assert_eq!(op_name("l1.qkv_proj"), "qkv_proj_q8_0_q8_0_q4_0");
    assert_eq!(op_name("embed"), "embedding_q8_0");
    // Which launches run at a step of `tokens` rows.
    let live = |op: &str, tokens: i64| -> Vec<String> {
        let o = &m.ops[m.op(op).unwrap().0];
        let mut vars = m.vars_at_max();
        vars[m.var("tokens").unwrap().0] = tokens;
        vars[m.var("seqs").unwrap().0] = tokens.min(4);
        o.launches.iter().filter(|l| l.runs(&vars).unwrap()).map(|l| l.entry.clone()).collect()
    };
    assert_eq!(live("qkv_proj_q8_0_q8_0_q4_0", 1), ["gemv_q8_0_w8", "gemv_q8_0_w8", "gemv_q4_0_w8"]);
    assert_eq!(live("qkv_proj_q8_0_q8_0_q4_0", 64), ["gemv_q8_0_w8", "gemv_q8_0_w8", "gemv_q4_0_w8"]);
    assert_eq!(live("qkv_proj_q8_0_q8_0_q4_0", 65), ["dequant_q8_0_bf16", "dequant_q8_0_bf16", "dequant_q4_0_bf16", "gemm_bf16_wgmma_n128"]);
    // The split GEMVs write their columns of the 256-wide row: col0 0, 128, 192.
    let o = &json["ops"]["qkv_proj_q8_0_q8_0_q4_0"]["impl"]["launches"];
    let cols: Vec<i64> = (0..3).map(|i| o[i]["args"][8]["i32"].as_i64().unwrap()).collect();
    assert_eq!(cols, [0, 128, 192]);
    assert!(o.as_array().unwrap().iter().all(|l| l["module"] != "gemm_wgmma" || l["args"][1]["param"].is_u64()), "the GEMM reads the scratch");
    assert!(m.buffer(kern_packs::quant::SCRATCH).is_some());
    // --dequantize (no native map): the bf16 manifest, as before.
    let plain = generate_for_gguf(&cfg, &PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 4, max_context: 512, ..Default::default() }, &dir.path().join("bf16")).unwrap();
    let p = load(&plain, &CheckOptions::default()).unwrap();
    assert!(p.buffers.iter().all(|b| !b.dtype.is_block()));
}

/// `model`'s qwen3 file with layer 1's `attn_v` of GGUF type `ty`.
fn model_with_v_type(arch: &str, ty: u32) -> Vec<u8> {
    let (h, d, hq, hkv, i, v) = (128u64, 64u64, 2u64, 1u64, 256u64, 64u64);
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&v.to_le_bytes());
    for t in 0..v {
        s(&mut tokens, &format!("t{t}"));
    }
    let k = |n: &str| format!("{arch}.{n}");
    let kv: Vec<(String, u32, Vec<u8>)> = vec![
        ("general.architecture".into(), 8, strv(arch)),
        (k("block_count"), 4, u32v(2)),
        (k("context_length"), 4, u32v(4096)),
        (k("embedding_length"), 4, u32v(h as u32)),
        (k("feed_forward_length"), 4, u32v(i as u32)),
        (k("attention.head_count"), 4, u32v(hq as u32)),
        (k("attention.head_count_kv"), 4, u32v(hkv as u32)),
        (k("rope.freq_base"), 6, f32v(1e6)),
        (k("attention.layer_norm_rms_epsilon"), 6, f32v(1e-6)),
        ("tokenizer.ggml.tokens".into(), 9, tokens),
    ];
    let mut t: Vec<(String, Vec<u64>, u32)> = vec![("token_embd.weight".into(), vec![h, v], 8), ("output_norm.weight".into(), vec![h], 0), ("output.weight".into(), vec![h, v], 8)];
    for l in 0..2 {
        let p = format!("blk.{l}");
        t.push((format!("{p}.attn_norm.weight"), vec![h], 0));
        t.push((format!("{p}.attn_q.weight"), vec![h, hq * d], 8));
        t.push((format!("{p}.attn_k.weight"), vec![h, hkv * d], 8));
        t.push((format!("{p}.attn_v.weight"), vec![h, hkv * d], if l == 1 { ty } else { 8 }));
        t.push((format!("{p}.attn_q_norm.weight"), vec![d], 0));
        t.push((format!("{p}.attn_k_norm.weight"), vec![d], 0));
        t.push((format!("{p}.attn_output.weight"), vec![hq * d, h], 8));
        t.push((format!("{p}.ffn_norm.weight"), vec![h], 0));
        t.push((format!("{p}.ffn_gate.weight"), vec![h, i], 8));
        t.push((format!("{p}.ffn_up.weight"), vec![h, i], 8));
        t.push((format!("{p}.ffn_down.weight"), vec![i, h], 8));
    }
    let kv: Vec<(&str, u32, Vec<u8>)> = kv.iter().map(|(a, b, c)| (a.as_str(), *b, c.clone())).collect();
    gguf(&kv, &t)
}
