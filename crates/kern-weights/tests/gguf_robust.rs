//! Hostile GGUF files: no byte string makes the reader panic, read out of bounds or allocate
//! beyond what the file's size justifies; errors name the file and a byte offset. Random
//! bytes, random mutations and every truncation of a well-formed file, lying counts, and
//! files that open fine but then have every tensor dequantized.

use kern_manifest::DType;
use kern_weights::gguf::{self, Value};
use kern_weights::{Checkpoint, WeightsError};
use proptest::prelude::*;
use std::path::Path;

mod common;
use common::{s, W};

fn string_array(items: &[&str]) -> Vec<u8> {
    let mut v = 8u32.to_le_bytes().to_vec();
    v.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for i in items {
        s(&mut v, i);
    }
    v
}

/// A well-formed file with a bit of everything: metadata of several types, a nested array,
/// plain and block tensors.
fn sample() -> Vec<u8> {
    let mut w = W::new();
    let mut nested = 9u32.to_le_bytes().to_vec(); // array of arrays
    nested.extend_from_slice(&2u64.to_le_bytes());
    for n in [1u64, 2] {
        nested.extend_from_slice(&4u32.to_le_bytes());
        nested.extend_from_slice(&n.to_le_bytes());
        for k in 0..n {
            nested.extend_from_slice(&(k as u32).to_le_bytes());
        }
    }
    let mut arch = vec![];
    s(&mut arch, "qwen2");
    w.kv("general.architecture", 8, &arch)
        .kv("qwen2.block_count", 4, &2u32.to_le_bytes())
        .kv("qwen2.rope.freq_base", 6, &1e6f32.to_le_bytes())
        .kv("flag", 7, &[1])
        .kv("tokenizer.ggml.tokens", 9, &string_array(&["a", "b", "Ġc"]))
        .kv("nested", 9, &nested);
    let q8: Vec<u8> = (0..2 * 34).map(|i| (i * 37 % 256) as u8).collect();
    let q4k: Vec<u8> = (0..144).map(|i| (i * 91 % 256) as u8).collect();
    let f32s: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.tensor("blk.0.attn_q.weight", &[32, 2], 8, q8)
        .tensor("blk.0.ffn_down.weight", &[256, 1], 12, q4k)
        .tensor("output_norm.weight", &[8], 0, f32s);
    w.bytes()
}

fn parse(bytes: &[u8]) -> Result<gguf::Gguf, WeightsError> {
    gguf::parse(bytes, Path::new("hostile.gguf"))
}

/// The error must be the GGUF error, naming the file and an offset inside it (or its end).
fn check_err(e: &WeightsError, len: usize) {
    match e {
        WeightsError::BadGguf { path, offset, message } => {
            assert_eq!(path, Path::new("hostile.gguf"));
            assert!(*offset as usize <= len, "offset {offset} past the file's {len} bytes: {message}");
            let text = e.to_string();
            assert!(text.starts_with("hostile.gguf: not a valid GGUF file: at byte"), "{text}");
        }
        other => panic!("not a BadGguf error: {other}"),
    }
}

/// Parse, and when it parses, dequantize every tensor it claims (bounds were checked).
fn exercise(bytes: &[u8]) {
    match parse(bytes) {
        Err(e) => check_err(&e, bytes.len()),
        Ok(g) => {
            for t in &g.tensors {
                assert!(t.offset + t.bytes <= bytes.len() as u64);
                if t.ggml_type.dequantizable() {
                    let data = &bytes[t.offset as usize..(t.offset + t.bytes) as usize];
                    let mut out = vec![0f32; t.elements() as usize];
                    kern_weights::dequant::dequantize_f32(t.ggml_type, data, &mut out);
                }
            }
        }
    }
}

#[test]
fn the_sample_parses() {
    let b = sample();
    let g = parse(&b).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture(), Some("qwen2"));
    assert_eq!(g.get("qwen2.block_count").and_then(Value::as_u64), Some(2));
    assert_eq!(g.get("flag"), Some(&Value::Bool(true)));
    let toks = g.get("tokenizer.ggml.tokens").and_then(Value::as_array).and_then(|a| a.as_strings()).unwrap();
    assert_eq!(toks, ["a", "b", "Ġc"]);
    let q = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dims.clone(), q.shape(), q.bytes, q.ggml_type.name), (vec![32, 2], vec![2, 32], 68, "Q8_0"));
    assert_eq!(q.offset % 32, 0);
}

#[test]
fn every_truncation_fails_cleanly() {
    let b = sample();
    for n in 0..b.len() {
        match parse(&b[..n]) {
            Err(e) => check_err(&e, n),
            // Cutting only padding after the last tensor's data is still a valid file.
            Ok(g) => assert!(g.tensors.iter().all(|t| t.offset + t.bytes <= n as u64)),
        }
    }
}

#[test]
fn lying_counts_allocate_nothing_huge() {
    let b = sample();
    // The tensor count, the metadata count, the first key's length, the tokens array length.
    for (at, what) in [(8usize, "tensor count"), (16, "metadata count"), (24, "key length")] {
        for v in [u64::MAX, u64::MAX / 2, 1 << 40, 1 << 32] {
            let mut h = b.clone();
            h[at..at + 8].copy_from_slice(&v.to_le_bytes());
            let e = parse(&h).expect_err(what);
            check_err(&e, h.len());
        }
    }
    let needle = b"tokenizer.ggml.tokens";
    let pos = b.windows(needle.len()).position(|w| w == needle).unwrap() + needle.len() + 4 + 4;
    let mut h = b.clone();
    h[pos..pos + 8].copy_from_slice(&(u64::MAX / 8).to_le_bytes());
    let e = parse(&h).unwrap_err();
    assert!(e.to_string().contains("array length"), "{e}");
}

#[test]
fn bad_headers_say_what_is_wrong() {
    let mut b = sample();
    b[4..8].copy_from_slice(&(3u32 << 16).to_le_bytes());
    assert!(parse(&b).unwrap_err().to_string().contains("big-endian"));
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(parse(&b).unwrap_err().to_string().contains("version 1"));
    b[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert!(parse(&b).unwrap_err().to_string().contains("versions 2 and 3"));
    assert!(parse(b"GGML\x03\0\0\0").unwrap_err().to_string().contains("magic"));

    let mut w = W::new();
    w.tensor("x", &[30, 1], 8, vec![0; 34]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("not a whole number of Q8_0 blocks"));
    let mut w = W::new();
    w.tensor("x", &[32], 99, vec![0; 34]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("type id 99"));
    let mut w = W::new();
    w.tensor("x", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("5 dimensions"));
    let mut w = W::new();
    w.tensor("x", &[1 << 40, 1 << 40], 0, vec![0; 4]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("overflow"));
    let mut w = W::new();
    w.tensor("x", &[1 << 20], 0, vec![0; 4]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("run past the end"));
    let mut w = W::new();
    w.tensor("x", &[1], 0, vec![0; 4]).tensor("x", &[1], 0, vec![0; 4]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("appears twice"));
    let mut w = W::new();
    w.kv("k", 7, &[2]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("0 or 1"));
    let mut w = W::new();
    w.kv("general.alignment", 4, &24u32.to_le_bytes());
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("power of two"));
    let mut w = W::new();
    w.kv("k", 13, &[0]);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("unknown value type 13"));
    // Arrays nested deeper than the limit.
    let mut deep = vec![];
    for _ in 0..20 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    deep.extend_from_slice(&0u32.to_le_bytes());
    deep.extend_from_slice(&0u64.to_le_bytes());
    let mut w = W::new();
    w.kv("deep", 9, &deep);
    assert!(parse(&w.bytes()).unwrap_err().to_string().contains("nested"));
}

#[test]
fn checkpoint_refuses_split_files_and_unsupported_types_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = W::new();
    w.kv("split.count", 4, &3u32.to_le_bytes()).kv("split.no", 4, &0u32.to_le_bytes());
    let p = dir.path().join("m-00001-of-00003.gguf");
    std::fs::write(&p, w.bytes()).unwrap();
    let e = Checkpoint::open(&p).unwrap_err().to_string();
    assert!(e.contains("part 1 of a GGUF split into 3 files"), "{e}");

    let mut w = W::new();
    w.tensor("iq", &[256], 16, vec![0; 66]);
    let p = dir.path().join("iq.gguf");
    std::fs::write(&p, w.bytes()).unwrap();
    let c = Checkpoint::open(&p).unwrap();
    assert_eq!(c.tensor("iq").unwrap().file_dtype, "IQ2_XXS");
    let e = c.read_as("iq", DType::Bf16).unwrap_err().to_string();
    assert!(e.contains("cannot dequantize ggml type IQ2_XXS") && e.contains("Q4_K"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes(tail in proptest::collection::vec(any::<u8>(), 0..512), version in 0u32..5) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&tail);
        exercise(&b);
    }

    #[test]
    fn mutations_of_a_valid_file(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut b = sample();
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        exercise(&b);
    }

    #[test]
    fn word_mutations_of_a_valid_file(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 1..4)) {
        // Whole 8-byte words: counts, lengths and offsets take extreme values.
        let mut b = sample();
        for (i, v) in edits {
            let at = i.index(b.len() - 8);
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        exercise(&b);
    }
}
