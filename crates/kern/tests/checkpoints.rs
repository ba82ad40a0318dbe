//! `kern inspect`, `kern extract` and `kern pack --gguf` on checkpoints written here: a small
//! GGUF file (metadata of several types, Q8_0 and F32 tensors, a tiny Qwen2 model) and a
//! safetensors file.

use std::path::{Path, PathBuf};
use std::process::Command;
use kern_weights::gguf_write::string as strv;

fn kern(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(args).current_dir(root()).output().expect("kern runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kern-ckpt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Appends a GGUF string to `out`.
fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&strv(v));
}

/// GGUF v3 with metadata (key, type, value bytes) and tensors (name, GGUF dims, type, data).
fn gguf(kv: &[(String, u32, Vec<u8>)], tensors: &[(String, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let mut w = kern_weights::gguf_write::Writer::new();
    for (k, t, v) in kv {
        w.kv(k, *t, v);
    }
    for (name, dims, ty, data) in tensors {
        w.tensor(name, dims, *ty, data.clone());
    }
    w.bytes()
}


/// Q8_0 blocks with scale 0.5 and q = i − 16 in each block.
fn q8(blocks: usize) -> Vec<u8> {
    let mut v = vec![];
    for _ in 0..blocks {
        v.extend_from_slice(&[0x00, 0x38]); // f16 0.5
        v.extend((0..32).map(|i| (i as i8 - 16) as u8));
    }
    v
}

fn f32s(n: usize, f: impl Fn(usize) -> f32) -> Vec<u8> {
    (0..n).flat_map(|i| f(i).to_le_bytes()).collect()
}

fn small_gguf(dir: &Path) -> PathBuf {
    let mut tokens = 8u32.to_le_bytes().to_vec();
    tokens.extend_from_slice(&40u64.to_le_bytes());
    for t in 0..40 {
        s(&mut tokens, &format!("tok{t}"));
    }
    let kv = vec![
        ("general.architecture".to_string(), 8, strv("qwen2")),
        ("general.name".to_string(), 8, strv("tiny")),
        ("qwen2.block_count".to_string(), 4, 1u32.to_le_bytes().to_vec()),
        ("qwen2.rope.freq_base".to_string(), 6, 1e6f32.to_le_bytes().to_vec()),
        ("tokenizer.ggml.tokens".to_string(), 9, tokens),
    ];
    let tensors = vec![
        ("w".to_string(), vec![64, 3], 8, q8(6)),
        ("norm".to_string(), vec![4], 0, f32s(4, |i| i as f32 + 0.25)),
    ];
    let p = dir.join("small.gguf");
    std::fs::write(&p, gguf(&kv, &tensors)).unwrap();
    p
}

/// A safetensors file with one F32 tensor `a` [2, 3] and metadata.
fn small_safetensors(dir: &Path) -> PathBuf {
    let header = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#;
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(&f32s(6, |i| i as f32 * 1.5));
    let p = dir.join("model.safetensors");
    std::fs::write(&p, b).unwrap();
    p
}

/// The elements of a little-endian `.npy` of 4- or 2-byte elements, with its dtype and shape.
fn npy(path: &Path) -> (String, Vec<usize>, Vec<u8>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let (hlen, start) = if b[6] == 1 { (u16::from_le_bytes([b[8], b[9]]) as usize, 10) } else { (u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize, 12) };
    let h = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    let descr = h.split("'descr': '").nth(1).unwrap().split('\'').next().unwrap().to_string();
    let shape = h.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape = shape.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().unwrap()).collect();
    (descr, shape, b[start + hlen..].to_vec())
}

#[test]
fn inspect_lists_gguf_metadata_and_tensors() {
    let d = scratch("inspect");
    let g = small_gguf(&d);
    let (code, out, err) = kern(&["inspect", g.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    for want in ["GGUF v3, 2 tensor(s)", "general.architecture", "\"qwen2\"", "qwen2.rope.freq_base", "1e6", "[string × 40] [\"tok0\", \"tok1\"", "…]", "Q8_0", "[3, 64]", "204", "F32", "by type: F32 ×1"] {
        assert!(out.contains(want), "expected `{want}` in:\n{out}");
    }
    let (code, out, err) = kern(&["inspect", "--json", g.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["version"], 3);
    assert_eq!(v["metadata"]["qwen2.block_count"], 1);
    assert_eq!(v["metadata"]["tokenizer.ggml.tokens"]["len"], 40);
    assert_eq!(v["metadata"]["tokenizer.ggml.tokens"]["head"][1], "tok1");
    let w = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "w").unwrap();
    assert_eq!(w["type"], "Q8_0");
    assert_eq!(w["shape"], serde_json::json!([3, 64]));
    assert_eq!(w["dims"], serde_json::json!([64, 3]));
    assert_eq!(w["bytes"], 204);

    let st = small_safetensors(&d);
    for target in [st.to_str().unwrap(), d.join("model.safetensors").to_str().unwrap()] {
        let (code, out, err) = kern(&["inspect", target]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("safetensors, 1 tensor(s)") && out.contains("[2, 3]") && out.contains("format") && out.contains("\"pt\""), "{out}");
    }
    let (code, _, err) = kern(&["inspect", "--timing", g.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("timing:") && err.contains("MB/s"), "{err}");
}

#[test]
fn extract_writes_one_tensor_dequantized_or_as_bf16_bits() {
    let d = scratch("extract");
    let g = small_gguf(&d);
    let out = d.join("w.npy");
    let (code, _, err) = kern(&["extract", g.to_str().unwrap(), "--tensor", "w", "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("float32, shape [3, 64]") && err.contains("Q8_0"), "{err}");
    let (descr, shape, data) = npy(&out);
    assert_eq!((descr.as_str(), shape), ("<f4", vec![3, 64]));
    let vals: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(*v, 0.5 * ((i % 32) as f32 - 16.0), "element {i}");
    }
    let raw = d.join("w16.npy");
    let (code, _, err) = kern(&["extract", g.to_str().unwrap(), "--tensor", "w", "--raw", "-o", raw.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (descr, _, data) = npy(&raw);
    assert_eq!(descr, "<u2");
    let bits: Vec<u16> = data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert_eq!(bits[0], 0xc100, "-8.0 in bf16");

    let (code, _, err) = kern(&["extract", g.to_str().unwrap(), "--tensor", "nrom"]);
    assert_eq!(code, 1);
    assert!(err.contains("no tensor `nrom`") && err.contains("`norm`"), "{err}");
    let (code, _, err) = kern(&["extract", g.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("give --tensor NAME"), "{err}");

    let st = small_safetensors(&d);
    let out = d.join("a.npy");
    let (code, _, err) = kern(&["extract", st.to_str().unwrap(), "--tensor", "a", "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (_, shape, data) = npy(&out);
    assert_eq!(shape, vec![2, 3]);
    assert_eq!(f32::from_le_bytes(data[20..24].try_into().unwrap()), 7.5);
}

#[test]
fn extract_from_a_gpu_binary_still_needs_an_arch() {
    let (code, _, err) = kern(&["extract", "Cargo.toml"]);
    assert_eq!(code, 1);
    assert!(err.contains("--arch"), "{err}");
}

/// A 1-layer Qwen2 GGUF: hidden 128, 2 heads of 64, 1 kv head, ffn 256, vocab 32, tied.
fn tiny_qwen2(dir: &Path, arch: &str) -> PathBuf {
    let (h, d, i, v) = (128u64, 64u64, 256u64, 32u64);
    let u = |x: u64| (x as u32).to_le_bytes().to_vec();
    let k = |n: &str| format!("{arch}.{n}");
    let kv = vec![
        ("general.architecture".to_string(), 8, strv(arch)),
        (k("block_count"), 4, u(1)),
        (k("context_length"), 4, u(2048)),
        (k("embedding_length"), 4, u(h)),
        (k("feed_forward_length"), 4, u(i)),
        (k("attention.head_count"), 4, u(2)),
        (k("attention.head_count_kv"), 4, u(1)),
        (k("attention.layer_norm_rms_epsilon"), 6, 1e-6f32.to_le_bytes().to_vec()),
    ];
    // A byte-level BPE vocabulary of 32 tokens with one merge: enough for a tokenizer.json.
    let mut kv = kv;
    let mut toks: Vec<String> = "abcdefghijklmnopqrstuvwxyz".chars().map(String::from).collect();
    toks.extend(["ab", "Ġ", "Ċ", "<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    let string_array = |items: &[String]| {
        let mut o = 8u32.to_le_bytes().to_vec();
        o.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for i in items {
            s(&mut o, i);
        }
        o
    };
    let mut types = 5u32.to_le_bytes().to_vec();
    types.extend_from_slice(&(toks.len() as u64).to_le_bytes());
    for (n, _) in toks.iter().enumerate() {
        types.extend_from_slice(&(if n >= 29 { 3i32 } else { 1 }).to_le_bytes());
    }
    kv.push(("tokenizer.ggml.model".into(), 8, strv("gpt2")));
    kv.push(("tokenizer.ggml.pre".into(), 8, strv("qwen2")));
    kv.push(("tokenizer.ggml.tokens".into(), 9, string_array(&toks)));
    kv.push(("tokenizer.ggml.token_type".into(), 9, types));
    kv.push(("tokenizer.ggml.merges".into(), 9, string_array(&["a b".to_string()])));
    kv.push(("tokenizer.ggml.eos_token_id".into(), 4, u(31)));
    kv.push(("tokenizer.chat_template".into(), 8, strv("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")));
    let mat = |name: &str, cols: u64, rows: u64| (name.to_string(), vec![cols, rows], 8u32, q8((cols * rows / 32) as usize));
    let vec_ = |name: &str, n: u64| (name.to_string(), vec![n], 0u32, f32s(n as usize, |_| 1.0));
    let t = vec![
        mat("token_embd.weight", h, v),
        vec_("output_norm.weight", h),
        vec_("blk.0.attn_norm.weight", h),
        mat("blk.0.attn_q.weight", h, 2 * d),
        mat("blk.0.attn_k.weight", h, d),
        mat("blk.0.attn_v.weight", h, d),
        vec_("blk.0.attn_q.bias", 2 * d),
        vec_("blk.0.attn_k.bias", d),
        vec_("blk.0.attn_v.bias", d),
        mat("blk.0.attn_output.weight", 2 * d, h),
        vec_("blk.0.ffn_norm.weight", h),
        mat("blk.0.ffn_gate.weight", h, i),
        mat("blk.0.ffn_up.weight", h, i),
        mat("blk.0.ffn_down.weight", i, h),
    ];
    let p = dir.join(format!("tiny-{arch}.gguf"));
    std::fs::write(&p, gguf(&kv, &t)).unwrap();
    p
}

#[test]
fn pack_from_gguf_links_the_file_and_checks_every_weight() {
    // `$KERN_PACK_KERNELS`, else the repo's build (as packs's tests).
    let kernels = std::env::var_os("KERN_PACK_KERNELS").map(PathBuf::from).unwrap_or_else(|| root().join("build/packs"));
    assert!(kernels.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/kernels/build.sh", kernels.display());
    let d = scratch("pack");
    let g = tiny_qwen2(&d, "qwen2");
    let out = d.join("packed");
    let args = ["pack", "--gguf", g.to_str().unwrap(), "-o", out.to_str().unwrap(), "--kernels", kernels.to_str().unwrap(), "--max-tokens", "64", "--max-seqs", "4", "--max-context", "256"];
    let (code, _, err) = kern(&args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("qwen2 from") && err.contains("tied embeddings"), "{err}");
    let link = out.join("tiny-qwen2.gguf");
    assert!(link.is_symlink() && std::fs::canonicalize(&link).unwrap() == std::fs::canonicalize(&g).unwrap());
    assert!(out.join("config.json").is_file());
    assert!(out.join("tokenizer.json").is_file() && out.join("tokenizer_config.json").is_file(), "{err}");
    let tc = std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap();
    assert!(tc.contains("<|im_start|>{{ m.content }}"), "{tc}");
    let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
    assert_eq!(m["buffers"]["model.layers.0.self_attn.qkv_proj.weight"]["from"]["concat"][0], "blk.0.attn_q.weight");
    assert_eq!(m["buffers"]["lm_head.weight"]["from"]["alias"], "model.embed_tokens.weight");
    // Packing again is idempotent (the link is kept).
    let (code, _, err) = kern(&args);
    assert_eq!(code, 0, "{err}");
    let (code, out_text, err) = kern(&["inspect", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out_text.contains("GGUF v3"), "{out_text}");

    let other = tiny_qwen2(&d, "mamba");
    let (code, _, err) = kern(&["pack", "--gguf", other.to_str().unwrap(), "-o", d.join("l").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("architecture `mamba`") && err.contains("qwen3, qwen2, llama, gemma3"), "{err}");
}
