//! Every generated manifest passes `kern check` against the pack's real cubins.

use kern_manifest::{load, CheckOptions};
use kern_pack_qwen3::config::preset;
use kern_pack_qwen3::{generate, PackOptions};
use std::path::PathBuf;

fn kernels() -> PathBuf {
    let p = std::env::var_os("KERN_PACK_KERNELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build/packs/qwen3"));
    assert!(p.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/qwen3/build.sh", p.display());
    p
}

#[test]
fn presets_generate_manifests_that_pass_kern_check() {
    for name in ["qwen3-0.6b", "qwen3-4b", "qwen3-8b", "qwen2.5-0.5b"] {
        let cfg = preset(name).unwrap();
        let out = std::env::temp_dir().join(format!("kern-pack-{}-{name}", std::process::id()));
        let opts = PackOptions { kernels: kernels(), ..Default::default() };
        let path = generate(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{name}: {d}"));
        let step = m.step.as_ref().expect("step ABI bound");
        assert_eq!(step.vocab, Some(151936), "{name}");
        assert!(step.kv.is_some());
        // Calls per step: embed + first norm + 9 per layer - 1 + 5 at the end; each GEMM call
        // declares one launch per M range (all but one skipped at run time).
        let layers = cfg.num_hidden_layers as usize;
        assert_eq!(m.programs[0].calls.len(), 2 + 9 * layers - 1 + 5, "{name}");
        assert_eq!(m.programs[0].launches(&m), 2 + 9 * layers - 1 + 5 + 4 * (4 * layers) + 3, "{name}");
        // Exactly one GEMM launch has a positive grid for every M.
        let op = &m.ops[m.op("qkv_proj").unwrap().0];
        for tokens in [1i64, 7, 8, 9, 16, 17, 32, 33, 64, 65, 300, 512] {
            let mut vars = m.vars_at_max();
            vars[m.var("tokens").unwrap().0] = tokens;
            let live = op.launches.iter().filter(|l| l.grid.iter().all(|g| g.eval(&vars).unwrap() > 0)).count();
            assert_eq!(live, 1, "{name}: tokens={tokens}");
        }
        let bytes_per_token = cfg.num_hidden_layers * 2 * cfg.kv_heads() * cfg.head_dim() * 2;
        assert!(matches!(m.states[0].size, kern_manifest::StateSize::PerToken { bytes, .. } if bytes == bytes_per_token));
        // Weights: tied models alias the LM head to the embedding.
        let lm = m.buffer("lm_head.weight").unwrap();
        assert_eq!(matches!(m.buffers[lm.0].source, Some(kern_manifest::WeightSource::Alias(_))), cfg.tie_word_embeddings, "{name}");
        if name.starts_with("qwen2") {
            assert!(m.buffer("model.layers.0.self_attn.qkv_proj.bias").is_some());
            assert!(m.buffer("model.layers.0.self_attn.q_norm.weight").is_none());
            // The bias is added once, by the GEMM: the RoPE kernel's flags (last arg) are 0.
            let rope = &m.ops[m.op("qk_norm_rope").unwrap().0].launches[0];
            assert_eq!(rope.args.last(), Some(&kern_manifest::LaunchArg::Const(kern_manifest::Value::I32(0))), "{name}");
            let call = m.programs[0].calls.iter().find(|c| c.label == "l0.qkv_proj").unwrap();
            assert!(matches!(call.args[2], kern_manifest::Binding::Buf(_)), "{name}: the GEMM gets the bias");
        }
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn small_batches_get_only_the_gemm_launches_they_can_reach() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-small-{}", std::process::id()));
    let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 8, max_context: 1024, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(m.ops[m.op("lm_head").unwrap().0].launches.len(), 1, "seqs <= 8: the GEMV only");
    assert_eq!(m.ops[m.op("qkv_proj").unwrap().0].launches.len(), 5);
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn missing_kernels_are_a_clear_error() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let opts = PackOptions { kernels: PathBuf::from("/nonexistent/kernels"), ..Default::default() };
    let e = generate(&cfg, &opts, &std::env::temp_dir().join("kern-pack-missing")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/kernels") && e.contains("packs/qwen3/build.sh"), "{e}");
}
