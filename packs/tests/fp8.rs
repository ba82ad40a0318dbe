//! FP8 packs (issue 25): random FP8 checkpoints in the Hugging Face fine-grained layout,
//! `--quant fp8` of a bf16 checkpoint (the same bytes), and manifests over them that pass
//! `kern check` against the real cubins with every weight loading unchanged (`kern_weights::check`)
//! — fused and split projections, both prefill paths, decode-only packs, a config.json alone.

use kern_manifest::{load, CheckOptions, DType};
use kern_packs::fp8::{self, Fp8Options, Fp8Prefill};
use kern_packs::{generate, Config, PackOptions};
use kern_weights::Checkpoint;
use serde_json::{json, Value};
use std::path::Path;
mod common;
use common::kernels;

/// Qwen3-style: hidden 256, 2 heads of `head_dim` over `kv` kv heads, MLP 384, 2 layers, vocab 96.
fn config(head_dim: u64, kv: u64, tied: bool) -> Config {
    Config::from_hf(&json!({"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 384, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": kv, "head_dim": head_dim, "vocab_size": 96, "tie_word_embeddings": tied}))
    .unwrap()
}

fn pack(cfg: &Config, dir: &Path, out: &Path, max_tokens: u64, prefill: Fp8Prefill) -> (kern_manifest::Manifest, Value) {
    let ckpt = Checkpoint::open(dir).unwrap();
    let weights = fp8::checkpoint_weights(&ckpt).unwrap();
    let opts = PackOptions { kernels: kernels(), max_tokens, max_seqs: 4, max_context: 256, fp8: Fp8Options { weights, prefill }, ..Default::default() };
    let path = generate(cfg, &opts, out).unwrap();
    let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{}: {d}", out.display()));
    let problems = kern_weights::check(&ckpt, &m.buffers);
    assert!(problems.is_empty(), "{}: {problems:#?}", out.display());
    assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty(), "every tensor is used");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (m, v)
}

fn entries(v: &Value, op: &str) -> Vec<String> {
    v["ops"][op]["impl"]["launches"].as_array().unwrap_or(&vec![]).iter().map(|l| l["entry"].as_str().unwrap().to_string()).collect()
}

#[test]
fn random_fp8_checkpoint_is_the_quantized_bf16_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(128, 1, true);
    let bf16 = dir.path().join("bf16");
    kern_packs::random::write(&cfg, 3, &bf16, u64::MAX, |_, _| {}).unwrap();
    let rnd = dir.path().join("random-fp8");
    let w = fp8::write_random(&cfg, 3, &rnd, u64::MAX, |_, _| {}).unwrap();
    assert_eq!(w.quantized, 2 * 7);
    // --quant fp8 of the bf16 checkpoint writes the same tensors, byte for byte (sharded here).
    let q = dir.path().join("quantized");
    let w2 = fp8::quantize_checkpoint(&bf16, &q, 200_000, |_, _| {}).unwrap();
    assert_eq!(w2.quantized, 14);
    assert!(q.join(kern_weights::INDEX_FILE).is_file() && w2.files.len() > 2, "sharded with an index: {:?}", w2.files);
    let (a, b, src) = (Checkpoint::open(&rnd).unwrap(), Checkpoint::open(&q).unwrap(), Checkpoint::open(&bf16).unwrap());
    let mut names: Vec<&str> = a.names();
    names.sort();
    let mut bn = b.names();
    bn.sort();
    assert_eq!(names, bn);
    for n in &names {
        let (x, y) = (a.tensor(n).unwrap(), b.tensor(n).unwrap());
        assert_eq!((x.file_dtype, x.shape, x.data), (y.file_dtype, y.shape, y.data), "{n}");
    }
    // The FP8 tensors are the block quantization of the bf16 ones; the rest are the bf16 bytes.
    let wname = "model.layers.1.mlp.down_proj.weight";
    let t = a.tensor(wname).unwrap();
    assert_eq!((t.file_dtype, t.shape), ("F8_E4M3", &[256usize, 384][..]));
    let s = a.tensor(&fp8::scale_name(wname)).unwrap();
    assert_eq!((s.file_dtype, s.shape), ("F32", &[2usize, 3][..]));
    let vals: Vec<f32> = src.read_as(wname, DType::F32).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let want = fp8::quantize(&vals, 256, 384).unwrap();
    assert_eq!(t.data, &want.weight[..]);
    let scales: Vec<f32> = s.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(scales, want.scale_inv);
    for n in ["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_norm.weight"] {
        assert_eq!(a.tensor(n).unwrap().data, src.tensor(n).unwrap().data, "{n} copied");
    }
    // config.json: the family's, plus the quantization_config transformers reads.
    for d in [&rnd, &q] {
        let c: Value = serde_json::from_str(&std::fs::read_to_string(d.join("config.json")).unwrap()).unwrap();
        assert_eq!(c["quantization_config"]["quant_method"], "fp8");
        assert_eq!(c["quantization_config"]["weight_block_size"], json!([128, 128]));
        assert_eq!(c["quantization_config"]["modules_to_not_convert"], json!(["lm_head"]));
        assert_eq!(Config::from_hf(&c).unwrap(), Config::from_hf(&serde_json::from_str::<Value>(&std::fs::read_to_string(bf16.join("config.json")).unwrap()).unwrap()).unwrap());
    }
    assert_eq!(fp8::checkpoint_weights(&a).unwrap().len(), 14);
    // Packing into the checkpoint's own directory is refused (it would hold two checkpoints).
    let e = fp8::quantize_checkpoint(&bf16, &bf16, u64::MAX, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("another directory"), "{e}");
    let e = fp8::quantize_checkpoint(&rnd, &dir.path().join("again"), u64::MAX, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("already quantized"), "{e}");
}

#[test]
fn fp8_packs_pass_kern_check_with_every_weight_loading_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    // head_dim 128, 1 kv head: q 256 + k 128 + v 128 rows, every part a multiple of 128 → fused.
    let cfg = config(128, 1, true);
    let ck = dir.path().join("ck");
    fp8::write_random(&cfg, 1, &ck, u64::MAX, |_, _| {}).unwrap();
    let (m, v) = pack(&cfg, &ck, &dir.path().join("dequant"), 512, Fp8Prefill::Dequant);
    let qkv = &m.buffers[m.buffer("model.layers.0.self_attn.qkv_proj.weight").unwrap().0];
    assert_eq!(qkv.dtype, DType::F8e4m3);
    let sc = &m.buffers[m.buffer("model.layers.0.self_attn.qkv_proj.weight.scale_inv").unwrap().0];
    assert_eq!((sc.dtype, sc.bytes_at_max), (DType::F32, 4 * 4 * 2), "[512/128, 256/128] f32");
    // The fused weight and scales are q, k, v stacked.
    let ckpt = Checkpoint::open(&ck).unwrap();
    let mut got = vec![0u8; sc.bytes_at_max as usize];
    kern_weights::materialize(&ckpt, sc, &mut got).unwrap();
    let want: Vec<u8> = ["q_proj", "k_proj", "v_proj"].iter().flat_map(|p| ckpt.tensor(&format!("model.layers.0.self_attn.{p}.weight_scale_inv")).unwrap().data.to_vec()).collect();
    assert_eq!(got, want);
    assert_eq!(entries(&v, "qkv_proj_fp8"), ["gemv_fp8_w8", "gemv_fp8_w8", "dequant_fp8_bf16", "gemm_bf16_wgmma_n128"]);
    assert_eq!(entries(&v, "down_proj_fp8")[2..], ["dequant_fp8_bf16".to_string(), "gemm_bf16_wgmma_n128".to_string()]);
    assert!(v["ops"].get("qkv_proj").is_none() && v["modules"].get("gemm_fp8").is_some() && v["modules"].get("gemm_fp8_wgmma").is_none());
    assert_eq!(v["buffers"]["wscratch"]["shape"], json!([768 * 256]), "the largest projection (gate_up)");
    // The LM head (tied embedding, bf16) keeps the bf16 GEMVs.
    assert!(entries(&v, "lm_head").iter().all(|e| e.starts_with("gemv_bf16") || e.starts_with("gemm_bf16")), "{:?}", entries(&v, "lm_head"));

    // W8A8 prefill: activation quantization, then the FP8 wgmma GEMM.
    let (_, v) = pack(&cfg, &ck, &dir.path().join("w8a8"), 512, Fp8Prefill::W8a8);
    assert_eq!(entries(&v, "gate_up_proj_fp8_w8a8")[2..], ["quant_fp8_act".to_string(), "gemm_fp8_wgmma".to_string()]);
    assert!(v["modules"].get("gemm_fp8_wgmma").is_some() && v["buffers"].get("wscratch").is_none());
    assert_eq!(v["buffers"]["fp8_xq"]["dtype"], "f8e4m3");
    assert_eq!(v["buffers"]["fp8_xs"]["shape"], json!([512 * 3]), "tokens x the largest K / 128 (down: 384)");

    // Decode-only (at most 64 tokens a step): GEMVs only, no scratch.
    let (_, v) = pack(&cfg, &ck, &dir.path().join("decode"), 64, Fp8Prefill::Dequant);
    assert!(entries(&v, "o_proj_fp8").iter().all(|e| e.starts_with("gemv_fp8")));
    assert!(v["buffers"].get("wscratch").is_none());

    // head_dim 64: k and v have 64 rows, not whole scale blocks → one GEMV per part (ldy / col0).
    let cfg64 = config(64, 1, false);
    let ck64 = dir.path().join("ck64");
    fp8::write_random(&cfg64, 2, &ck64, u64::MAX, |_, _| {}).unwrap();
    let (m, v) = pack(&cfg64, &ck64, &dir.path().join("split"), 512, Fp8Prefill::W8a8);
    assert!(m.buffer("model.layers.1.self_attn.qkv_proj.weight.part2.scale_inv").is_some());
    assert!(m.buffer("model.layers.1.self_attn.qkv_proj.weight").is_none(), "the fused weight is gone");
    let e = entries(&v, "qkv_proj_fp8_x3");
    assert_eq!(e.iter().filter(|e| e.starts_with("gemv_fp8")).count(), 6, "3 parts x 2 PDL ranges: {e:?}");
    assert!(e.ends_with(&["dequant_fp8_bf16".into(), "dequant_fp8_bf16".into(), "dequant_fp8_bf16".into(), "gemm_bf16_wgmma_n128".into()]), "a split projection prefills through the scratch: {e:?}");
    assert_eq!(v["ops"]["qkv_proj_fp8_x3"]["impl"]["launches"][1]["args"][9], json!({"i32": 128}), "k's columns start at 128");
    // The untied LM head stays bf16 (not converted).
    assert_eq!(m.buffers[m.buffer("lm_head.weight").unwrap().0].dtype, DType::Bf16);
}

#[test]
fn kern_pack_fp8_from_a_config_alone_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(128, 1, true);
    // A config.json that declares FP8, with no weights beside it: the weights are named from it.
    let only = dir.path().join("only");
    std::fs::create_dir_all(&only).unwrap();
    let mut c = cfg.to_hf_json();
    c["quantization_config"] = fp8::quantization_config(&["lm_head".into()]);
    std::fs::write(only.join("config.json"), c.to_string()).unwrap();
    let mut opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 4, max_context: 256, ..Default::default() };
    let got = fp8::prepare(&only.join("config.json"), &dir.path().join("out"), None, &cfg, &mut opts).unwrap();
    assert!(got.is_some());
    assert_eq!(opts.fp8.weights.len(), 14);
    assert_eq!(opts.fp8.weights["model.layers.1.mlp.up_proj.weight"], "model.layers.1.mlp.up_proj.weight_scale_inv");
    let path = generate(&cfg, &opts, &dir.path().join("out")).unwrap();
    load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    // Without quantization_config and FP8 tensors: nothing to do.
    let plain = dir.path().join("plain");
    kern_packs::random::write(&cfg, 0, &plain, u64::MAX, |_, _| {}).unwrap();
    let mut o2 = PackOptions::default();
    assert!(fp8::prepare(&plain.join("config.json"), &dir.path().join("o2"), None, &cfg, &mut o2).unwrap().is_none());
    // --quant fp8 through prepare: quantized into out, which then holds the checkpoint.
    let out = dir.path().join("q");
    let (d, what) = fp8::prepare(&plain.join("config.json"), &out, Some(fp8::Quant::Fp8), &cfg, &mut o2).unwrap().unwrap();
    assert_eq!(d, out);
    assert!(what.contains("quantized 14 projection weights"), "{what}");
    assert!(Checkpoint::open(&out).is_ok() && out.join("config.json").is_file());
    // A GPTQ config is refused by the family reader, by name.
    let e = Config::from_hf(&json!({"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 96,
        "quantization_config": {"quant_method": "gptq", "bits": 4}}))
    .unwrap_err();
    assert!(e.contains("`gptq`"), "{e}");
}
