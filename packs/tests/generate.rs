//! Every generated manifest passes `kern check` against the pack's real cubins.

use kern_manifest::{load, CheckOptions};
use kern_packs::config::preset;
use kern_packs::{generate, PackOptions};
use std::path::PathBuf;
mod common;
use common::kernels;

#[test]
fn presets_generate_manifests_that_pass_kern_check() {
    for (name, fused) in ["qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen2.5-0.5b"].into_iter().flat_map(|n| [(n, false), (n, true)]) {
        let cfg = preset(name).unwrap();
        let out = std::env::temp_dir().join(format!("kern-pack-{}-{name}-{fused}", std::process::id()));
        // (the launch counts below are without --pdl-small-steps' second copies; the defaults
        // themselves are checked at the end)
        let opts = PackOptions { kernels: kernels(), decode_fusion: fused, pdl_small_steps: false, ..Default::default() };
        let path = generate(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{name}: {d}"));
        let step = m.step.as_ref().expect("step ABI bound");
        assert_eq!(step.vocab, Some(151936), "{name}");
        assert!(step.kv.is_some());
        // Calls per step. The unfused program (the default): embed + first norm + 9 per layer - 1
        // + 5 at the end. The fused decode program (`decode_fusion`, kern_packs::fused):
        // embed, l0.qkv_proj, 4 per layer (rope, attention, o_proj_gate_up, down_proj_qkv or in
        // the last layer down_proj), 5 at the end. Each projection declares one launch per M
        // range (all but one skipped at run time), plus a fused GEMV for 1..8 rows and the
        // row-wise kernel it replaces (rms_norm_f32, add_rms_norm_f32, swiglu) for larger
        // steps; each attention call three (the default split decode attention: attention_dD,
        // or the split kernel and its combine). The unfused program declares as many launches.
        let layers = cfg.num_hidden_layers as usize;
        assert_eq!(m.programs[0].calls.len(), if fused { 2 + 4 * layers + 5 } else { 2 + 9 * layers - 1 + 5 }, "{name}");
        assert_eq!(m.programs[0].launches(&m), 2 + 9 * layers - 1 + 5 + 4 * (4 * layers) + 2 * layers + 3, "{name}");
        // Exactly one GEMM launch has a positive grid for every M, in every projection; the
        // row-wise kernel beside it only above 8 rows.
        let fused_ops: &[&str] = if fused { &["norm_qkv_proj", "o_proj_norm_gate_up", "down_proj_norm_qkv", "swiglu_down_proj"] } else { &[] };
        for &op_name in fused_ops {
            let op = &m.ops[m.op(op_name).unwrap_or_else(|| panic!("{name}: no op {op_name}")).0];
            // (GEMMs, row-wise kernels above 8 rows): rms_norm_f32; add_rms_norm_f32; swiglu +
            // add_rms_norm_f32; swiglu.
            let (gemms, rows) = match op_name {
                "norm_qkv_proj" | "swiglu_down_proj" => (1, 1),
                "o_proj_norm_gate_up" => (2, 1),
                _ => (2, 2),
            };
            for tokens in [1i64, 7, 8, 9, 16, 17, 32, 33, 64, 65, 300, 512] {
                let mut vars = m.vars_at_max();
                vars[m.var("tokens").unwrap().0] = tokens;
                let live: Vec<&str> = op.launches.iter().filter(|l| l.runs(&vars).unwrap()).map(|l| m.modules[l.module.0].name.as_str()).collect();
                let gemm = live.iter().filter(|m| m.starts_with("gemm_")).count();
                let rowwise = live.iter().filter(|m| **m == "rowwise").count();
                assert_eq!(gemm, gemms, "{name} {op_name}: tokens={tokens}: {live:?}");
                assert_eq!(rowwise, if tokens <= 8 { 0 } else { rows }, "{name} {op_name}: tokens={tokens}: {live:?}");
            }
        }
        if !fused {
            let op = &m.ops[m.op("qkv_proj").unwrap().0];
            for tokens in [1i64, 7, 8, 9, 16, 17, 32, 33, 64, 65, 300, 512] {
                let mut vars = m.vars_at_max();
                vars[m.var("tokens").unwrap().0] = tokens;
                let live = op.launches.iter().filter(|l| l.runs(&vars).unwrap()).count();
                assert_eq!(live, 1, "{name}: tokens={tokens}");
            }
        }
        let bytes_per_token = cfg.num_hidden_layers * 2 * cfg.kv_heads() * cfg.head_dim() * 2;
        assert!(matches!(m.states[0].size, kern_manifest::StateSize::PerToken { bytes, .. } if bytes == bytes_per_token));
        // Weights: tied models alias the LM head to the embedding.
        let lm = m.buffer("lm_head.weight").unwrap();
        assert_eq!(matches!(m.buffers[lm.0].source, Some(kern_manifest::WeightSource::Alias(_))), cfg.tie_word_embeddings, "{name}");
        if name.starts_with("qwen2") {
            assert!(m.buffer("model.layers.0.self_attn.qkv_proj.bias").is_some());
            assert!(m.buffer("model.layers.0.self_attn.q_norm.weight").is_none());
            // The bias is added once, by the GEMM: the RoPE kernel's flags (arg 16) are 0.
            let rope = &m.ops[m.op("qk_norm_rope").unwrap().0].launches[0];
            assert_eq!(rope.args[16], kern_manifest::LaunchArg::Const(kern_manifest::Value::I32(0)), "{name}");
            // norm_qkv_proj: [h, x, norm weight, W, bias, qkv, tokens]; down_proj_norm_qkv passes
            // the next layer's bias the same way.
            // (unfused qkv_proj: [h, W, bias, qkv, tokens])
            let call = m.programs[0].calls.iter().find(|c| c.label == "l0.qkv_proj").unwrap();
            assert!(matches!(call.args[if fused { 4 } else { 2 }], kern_manifest::Binding::Buf(_)), "{name}: the GEMM gets the bias");
            if fused {
                let call = m.programs[0].calls.iter().find(|c| c.label == "l0.down_proj_qkv").unwrap();
                let bias1 = m.buffer("model.layers.1.self_attn.qkv_proj.bias").unwrap();
                assert_eq!(call.args[8], kern_manifest::Binding::Buf(bias1), "{name}: layer 1's QKV bias");
            }
        }
        // The defaults (--pdl-small-steps on) pass the check too.
        if !fused {
            let d = out.join("defaults");
            load(&generate(&cfg, &PackOptions { kernels: kernels(), ..Default::default() }, &d).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{name} defaults: {e}"));
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn small_batches_get_only_the_gemm_launches_they_can_reach() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-small-{}", std::process::id()));
    let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 8, max_context: 1024, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &out.join("unfused")).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(m.ops[m.op("lm_head").unwrap().0].launches.len(), 1, "seqs <= 8: the GEMV only");
    assert_eq!(m.ops[m.op("qkv_proj").unwrap().0].launches.len(), 5);
    // The fused decode program (`decode_fusion`):
    let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 8, max_context: 1024, decode_fusion: true, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    // The fused GEMV (1..8 rows), then rms_norm_f32 and the GEMMs of 9..16, 17..32, 33..64, 65..
    let entries: Vec<&str> = m.ops[m.op("norm_qkv_proj").unwrap().0].launches.iter().map(|l| l.entry.as_str()).collect();
    assert_eq!(entries.len(), 6, "{entries:?}");
    assert_eq!(&entries[..2], ["gemv_bf16_rms", "rms_norm_f32"]);
    // Steps of at most 8 tokens: the fused GEMVs only, no row-wise kernel beside them.
    let opts = PackOptions { kernels: kernels(), max_tokens: 8, max_seqs: 8, max_context: 1024, decode_fusion: true, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &out.join("eight")).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    for (op, want) in [("norm_qkv_proj", vec!["gemv_bf16_rms"]), ("o_proj_norm_gate_up", vec!["gemv_bf16_add", "gemv_bf16_rms"]),
                       ("down_proj_norm_qkv", vec!["gemv_bf16_swiglu_add", "gemv_bf16_rms"]), ("swiglu_down_proj", vec!["gemv_bf16_swiglu"])] {
        let entries: Vec<&str> = m.ops[m.op(op).unwrap().0].launches.iter().map(|l| l.entry.as_str()).collect();
        assert_eq!(entries, want, "{op}");
    }
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn missing_kernels_are_a_clear_error() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let opts = PackOptions { kernels: PathBuf::from("/nonexistent/kernels"), ..Default::default() };
    let e = generate(&cfg, &opts, &std::env::temp_dir().join("kern-pack-missing")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/kernels") && e.contains("packs/kernels/build.sh"), "{e}");
}

/// Issue 17: `--tp 2` writes one rank's manifest: it passes `kern check`, its shapes are the
/// single-GPU shapes with heads and the intermediate size halved, and an all-reduce follows
/// each row-parallel GEMM. Without `tp` the manifest has none of it.
#[test]
fn tensor_parallel_manifests_split_heads_and_intermediate_size() {
    use kern_manifest::{Collective, WeightSource};
    for name in ["qwen3-8b", "qwen3-0.6b", "qwen2.5-1.5b"] {
        let cfg = preset(name).unwrap();
        let base = std::env::temp_dir().join(format!("kern-pack-tp-{}-{name}", std::process::id()));
        // The unfused single-GPU program: what --tp keeps (the residual add of a row-parallel
        // GEMM comes after its all-reduce, so the fused epilogue add cannot hold).
        let unfused = PackOptions { kernels: kernels(), decode_fusion: false, ..Default::default() };
        let one = load(&generate(&cfg, &unfused, &base.join("tp1")).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name} tp1: {d}"));
        let two = load(&generate(&cfg, &PackOptions { kernels: kernels(), tp: Some(2), ..Default::default() }, &base.join("tp2")).unwrap(), &CheckOptions::default())
            .unwrap_or_else(|d| panic!("{name} tp2: {d}"));
        assert_eq!((one.tp(), one.has_collectives()), (1, false), "{name}: no --tp, no parallelism");
        assert_eq!((two.tp(), two.has_collectives()), (2, true), "{name}");
        assert!(two.op("o_proj_norm_gate_up").is_none() && two.op("o_proj").is_some(), "{name}: --tp writes the unfused program");
        let shape = |m: &kern_manifest::Manifest, b: &str| m.shape(m.buffer(b).unwrap_or_else(|| panic!("{b}")), &m.vars_at_max()).unwrap();
        // Column-parallel outputs halve, row-parallel outputs stay whole.
        for (b, dim, split) in [
            ("qkv", 1, true),
            ("attn", 1, true),
            ("gate_up", 1, true),
            ("act", 1, true),
            ("o", 1, false),
            ("mlp", 1, false),
            ("logits", 1, false),
            ("model.layers.0.self_attn.qkv_proj.weight", 0, true),
            ("model.layers.0.self_attn.o_proj.weight", 1, true),
            ("model.layers.0.self_attn.o_proj.weight", 0, false),
            ("model.layers.0.mlp.gate_up_proj.weight", 0, true),
            ("model.layers.0.mlp.down_proj.weight", 1, true),
            ("model.embed_tokens.weight", 0, false),
        ] {
            let (s1, s2) = (shape(&one, b), shape(&two, b));
            let want = if split { s1[dim] / 2 } else { s1[dim] };
            assert_eq!(s2[dim], want, "{name}: {b} dim {dim}: tp1 {s1:?}, tp2 {s2:?}");
            assert_eq!(s1[dim] % 2, 0, "{name}: {b}");
        }
        // The KV state per rank is half.
        let kv = |m: &kern_manifest::Manifest| match m.states[0].size {
            kern_manifest::StateSize::PerToken { bytes, .. } => bytes,
            _ => panic!("per token"),
        };
        assert_eq!(kv(&two) * 2, kv(&one), "{name}");
        // Sources: this rank's slices.
        let src = |b: &str| two.buffers[two.buffer(b).unwrap().0].source.clone().unwrap();
        let WeightSource::Shard { of, shard } = src("model.layers.0.self_attn.qkv_proj.weight") else { panic!("{name}: qkv is sharded") };
        assert!(matches!(*of, WeightSource::Concat { axis: 0, .. }));
        assert_eq!((shard.dim, shard.parts, shard.part_for(1)), (0, 2, Ok(1)));
        let WeightSource::Shard { shard, .. } = src("model.layers.0.mlp.down_proj.weight") else { panic!("{name}: down is sharded") };
        assert_eq!((shard.dim, shard.parts), (1, 2));
        assert!(!matches!(src("model.norm.weight"), WeightSource::Shard { .. }), "{name}: norms are replicated");
        // One all-reduce after each O and down projection, on their outputs.
        let calls = &two.programs[0].calls;
        let layers = cfg.num_hidden_layers as usize;
        assert_eq!(calls.len(), one.programs[0].calls.len() + 2 * layers, "{name}");
        for (i, c) in calls.iter().enumerate() {
            if c.label.ends_with(".o_proj") || c.label.ends_with(".down_proj") {
                let next = &calls[i + 1];
                assert_eq!(two.ops[next.op.0].collective, Some(Collective::AllReduceSum), "{name}: after {}", c.label);
                assert_eq!(next.args[0], c.args[3], "{name}: {} reduces the GEMM's output", next.label);
            }
        }
        assert_eq!(two.programs[0].launches(&two), one.programs[0].launches(&one), "{name}: collectives are no launches");
        // --tp 1: the same shapes as no --tp, with the collectives (a world of one).
        let w1 = load(&generate(&cfg, &PackOptions { kernels: kernels(), tp: Some(1), ..Default::default() }, &base.join("tp1w")).unwrap(), &CheckOptions::default())
            .unwrap_or_else(|d| panic!("{name} --tp 1: {d}"));
        assert_eq!((w1.tp(), w1.has_collectives()), (1, true));
        assert_eq!(shape(&w1, "qkv"), shape(&one, "qkv"));
        std::fs::remove_dir_all(&base).ok();
    }
}

#[test]
fn tensor_parallel_sizes_that_do_not_divide_are_refused() {
    let cfg = preset("qwen3-8b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-tp-bad-{}", std::process::id()));
    let err = generate(&cfg, &PackOptions { kernels: kernels(), tp: Some(3), ..Default::default() }, &out).unwrap_err().to_string();
    assert!(err.contains("--tp 3: num_attention_heads 32 does not divide into 3 ranks"), "{err}");
    assert!(err.contains("num_key_value_heads 8 does not divide into 3 ranks"), "{err}");
    assert!(err.contains("pick a tensor-parallel size that divides them (1, 2, 4, 8)"), "{err}");
    assert!(!out.exists(), "nothing is written for a refused --tp");
    let small = preset("qwen2.5-0.5b").unwrap();
    let err = generate(&small, &PackOptions { kernels: kernels(), tp: Some(4), ..Default::default() }, &out).unwrap_err().to_string();
    assert!(err.contains("num_key_value_heads 2 does not divide into 4 ranks"), "{err}");
    assert!(generate(&cfg, &PackOptions { kernels: kernels(), tp: Some(0), ..Default::default() }, &out).unwrap_err().to_string().contains("at least 1"));
}

/// Issue 17: on random weights, each rank's slices load, and the two ranks' slices put back
/// together are the single-GPU weights (QKV and gate-up by rows, per projection; O and down
/// by columns; replicated weights equal).
#[test]
fn tensor_parallel_slices_reassemble_the_single_gpu_weights() {
    let cfg = kern_packs::Config::from_hf(&serde_json::from_str(
        r#"{"model_type":"qwen2","hidden_size":256,"intermediate_size":512,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":512,"tie_word_embeddings":true}"#,
    )
    .unwrap())
    .unwrap();
    let dir = std::env::temp_dir().join(format!("kern-pack-tp-weights-{}", std::process::id()));
    kern_packs::random::write(&cfg, 7, &dir, 1 << 30, |_, _| {}).unwrap();
    let one = load(&generate(&cfg, &PackOptions { kernels: kernels(), ..Default::default() }, &dir.join("tp1")).unwrap(), &CheckOptions::default()).unwrap();
    let two = load(&generate(&cfg, &PackOptions { kernels: kernels(), tp: Some(2), ..Default::default() }, &dir.join("tp2")).unwrap(), &CheckOptions::default()).unwrap();
    let ckpt = kern_weights::Checkpoint::open(&dir).unwrap();
    for rank in 0..2 {
        let p = kern_weights::check_rank(&ckpt, &two.buffers, rank);
        assert!(p.is_empty(), "rank {rank}: {p:?}");
    }
    let get = |m: &kern_manifest::Manifest, b: &str, rank: u32| -> (Vec<u8>, Vec<i64>) {
        let id = m.buffer(b).unwrap();
        let mut out = vec![0u8; m.buffers[id.0].bytes_at_max as usize];
        kern_weights::materialize_rank(&ckpt, &m.buffers[id.0], rank, &mut out).unwrap();
        (out, m.shape(id, &[]).unwrap_or_else(|_| m.shape(id, &m.vars_at_max()).unwrap()))
    };
    // Rows [lo, hi) of a row-major [rows, cols] bf16 matrix, and columns [lo, hi).
    let rows = |m: &[u8], cols: i64, lo: i64, hi: i64| m[(lo * cols * 2) as usize..(hi * cols * 2) as usize].to_vec();
    let cols = |m: &[u8], ncols: i64, lo: i64, hi: i64| -> Vec<u8> {
        m.chunks((ncols * 2) as usize).flat_map(|r| r[(lo * 2) as usize..(hi * 2) as usize].to_vec()).collect()
    };
    let (hd, h) = (64i64, 256i64);
    // QKV [(4 + 2 + 2) * 64, 256]: full = q | k | v; rank r = q_r | k_r | v_r.
    let name = "model.layers.0.self_attn.qkv_proj.weight";
    let (full, _) = get(&one, name, 0);
    let (r0, s0) = get(&two, name, 0);
    let (r1, _) = get(&two, name, 1);
    assert_eq!(s0, vec![4 * hd, h]);
    let (q, k) = (4 * hd, 2 * hd);
    let part = |r: &[u8], lo: i64, hi: i64| rows(r, h, lo, hi);
    let mut want = vec![];
    for (lo, n) in [(0, q), (q, k), (q + k, k)] {
        want.extend(rows(&full, h, lo, lo + n / 2));
        want.extend(rows(&full, h, lo + n / 2, lo + n));
    }
    let mut got = vec![];
    for (lo, n) in [(0, q / 2), (q / 2, k / 2), (q / 2 + k / 2, k / 2)] {
        got.extend(part(&r0, lo, lo + n));
        got.extend(part(&r1, lo, lo + n));
    }
    assert_eq!(got, want, "qkv: rank slices reassemble q, k and v");
    assert_ne!(r0, r1, "the ranks hold different slices");
    // Bias [8 * 64] the same way (one row of one element each).
    let name = "model.layers.0.self_attn.qkv_proj.bias";
    let (full, _) = get(&one, name, 0);
    let (b0, _) = get(&two, name, 0);
    let (b1, _) = get(&two, name, 1);
    let mut got = vec![];
    for (lo, n) in [(0, q / 2), (q / 2, k / 2), (q / 2 + k / 2, k / 2)] {
        got.extend(rows(&b0, 1, lo, lo + n));
        got.extend(rows(&b1, 1, lo, lo + n));
    }
    assert_eq!(got, full, "bias");
    // O [256, 256] and down [256, 512]: column halves.
    for (name, k) in [("model.layers.0.self_attn.o_proj.weight", 4 * hd), ("model.layers.0.mlp.down_proj.weight", 512)] {
        let (full, _) = get(&one, name, 0);
        for rank in 0..2 {
            let (r, s) = get(&two, name, rank);
            assert_eq!(s, vec![h, k / 2], "{name}");
            assert_eq!(r, cols(&full, k, rank as i64 * k / 2, (rank as i64 + 1) * k / 2), "{name} rank {rank}");
        }
    }
    // Gate-up [1024, 256]: rank r = gate rows of r | up rows of r.
    let name = "model.layers.0.mlp.gate_up_proj.weight";
    let (full, _) = get(&one, name, 0);
    for rank in 0..2i64 {
        let (r, _) = get(&two, name, rank as u32);
        let mut want = rows(&full, h, rank * 256, rank * 256 + 256);
        want.extend(rows(&full, h, 512 + rank * 256, 512 + rank * 256 + 256));
        assert_eq!(r, want, "gate_up rank {rank}");
    }
    // Replicated.
    for name in ["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight"] {
        assert_eq!(get(&two, name, 1).0, get(&one, name, 0).0, "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 24: the Llama, Mistral and Gemma 3 presets pack from the same builder and pass
/// `kern check` against the real cubins; each family's differences show up as data in the
/// manifest: Gemma's four norms, GeGLU, (1 + w) entries, embedding scale, head_dim 256 launches
/// with their dynamic shared memory, per-layer windows and RoPE bases; Llama 3's frequency
/// table; Mistral's window on every layer.
#[test]
fn family_presets_pack_with_their_differences_as_data() {
    use kern_manifest::{Binding, LaunchArg, Value as V};
    for name in ["llama-3.2-1b", "llama-3.1-8b", "smollm2-135m", "mistral-7b", "mistral-7b-v0.1", "gemma-3-270m", "gemma-3-1b", "gemma-3-4b"] {
        let cfg = preset(name).unwrap();
        let out = std::env::temp_dir().join(format!("kern-pack-family-{}-{name}", std::process::id()));
        let path = generate(&cfg, &PackOptions { kernels: kernels(), pdl_small_steps: false, ..Default::default() }, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{name}: {d}"));
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let layers = cfg.num_hidden_layers as usize;
        let gemma = name.starts_with("gemma");
        let calls = &m.programs[0].calls;
        // Two more calls per layer for Gemma's post-attention and post-feedforward norms.
        assert_eq!(calls.len(), 2 + 9 * layers - 1 + 5 + if gemma { 2 * layers } else { 0 }, "{name}");
        assert_eq!(m.step.as_ref().unwrap().vocab.map(|v| v as u64), Some(cfg.vocab_size), "{name}");
        let call = |label: &str| calls.iter().find(|c| c.label == label).unwrap_or_else(|| panic!("{name}: no call {label}"));
        let window = |l: usize| call(&format!("l{l}.attention")).args.last().cloned();
        let emb = &json["ops"]["embedding"]["impl"]["launches"][0]["args"][6]["f32"];
        let rope = |l: usize| call(&format!("l{l}.qk_norm_rope")).args.clone();
        if gemma {
            for op in ["post_norm", "geglu_tanh"] {
                assert!(m.op(op).is_some(), "{name}: op {op}");
            }
            assert!(m.op("swiglu").is_none(), "{name}");
            assert_eq!(json["ops"]["add_rms_norm"]["impl"]["launches"][0]["entry"], "add_rms_norm_f32_off");
            assert_eq!(json["ops"]["add_rms_norm"]["impl"]["launches"][0]["args"][7]["f32"], 1.0, "{name}: offset 1 for Hugging Face weights");
            assert_eq!(emb.as_f64(), Some(f64::from(cfg.embedding_scale())), "{name}");
            assert!(emb.as_f64().unwrap() > 20.0, "{name}: bf16(sqrt(hidden))");
            // Layers 0..4 slide with the model's window, layer 5 is global.
            let w = cfg.sliding_window.unwrap() as i32;
            assert_eq!((window(0), window(5)), (Some(Binding::Const(V::I32(w))), Some(Binding::Const(V::I32(0)))), "{name}");
            // Local layers: base 1e4, no table; global: 1e6 (and the linear table at 4B).
            assert_eq!(rope(0)[9], Binding::Const(V::F32(10000.0)), "{name}");
            assert_eq!(rope(5)[9], Binding::Const(V::F32(1e6)), "{name}");
            assert_eq!(rope(0)[10], Binding::Null, "{name}");
            assert_eq!(rope(5)[10] == Binding::Null, name != "gemma-3-4b", "{name}: a table only for the scaled global RoPE");
            // head_dim 256: SIMT attention for prefill and the d256 split decode, each with the
            // shared memory its struct needs.
            let launches = &m.ops[m.op("attention").unwrap().0].launches;
            let entries: Vec<&str> = launches.iter().map(|l| l.entry.as_str()).collect();
            assert_eq!(entries, ["attention_d256", "attention_decode_d256", "attention_combine_d256"], "{name}");
            assert_eq!(launches[0].shared.as_const(), Some(kern_packs::manifest::ATT_SMEM_D256 as i64), "{name}");
            assert_eq!(launches[1].shared.as_const(), Some(kern_packs::manifest::DEC_SMEM_D256 as i64), "{name}");
            // Attention scale from query_pre_attn_scalar (256): 1/16.
            assert_eq!(launches[0].args[15], LaunchArg::Const(V::F32(1.0 / 16.0)), "{name}");
            // The fused decode program is written for the sandwich block too (issue 24: the
            // post-norm + add + pre-norm prologue GEMVs, GeGLU down GEMVs; packs/tests/fused.rs).
            let fused = load(&generate(&cfg, &PackOptions { kernels: kernels(), decode_fusion: true, ..Default::default() }, &out.join("fused")).unwrap(), &CheckOptions::default())
                .unwrap_or_else(|d| panic!("{name} fused: {d}"));
            assert!(fused.op("postnorm_gate_up_proj").is_some() && fused.op("geglu_down_proj").is_some(), "{name}");
        } else {
            assert!(m.op("post_norm").is_none() && m.op("swiglu").is_some(), "{name}");
            assert_eq!(emb.as_f64(), Some(1.0), "{name}");
            let w = if name == "mistral-7b-v0.1" { 4096 } else { 0 };
            assert_eq!((window(0), window(layers - 1)), (Some(Binding::Const(V::I32(w))), Some(Binding::Const(V::I32(w)))), "{name}");
            let table = m.buffer("rope.inv_freq");
            assert_eq!(table.is_some(), name.starts_with("llama-3"), "{name}: a table for llama3 RoPE only");
            if let Some(t) = table {
                assert_eq!(rope(0)[10], Binding::Buf(t), "{name}");
                assert_eq!(m.buffers[t.0].bytes_at_max, cfg.head_dim() * 2, "{name}: head_dim / 2 fp32 values");
            }
            // The fused decode program is written for the Llama block too.
            load(&generate(&cfg, &PackOptions { kernels: kernels(), decode_fusion: true, ..Default::default() }, &out.join("fused")).unwrap(), &CheckOptions::default())
                .unwrap_or_else(|d| panic!("{name} fused: {d}"));
        }
        std::fs::remove_dir_all(&out).ok();
    }
}
