//! kern-tokenizer on a small SentencePiece-style tokenizer built here (the Llama 2 layout:
//! `▁` for spaces, byte-fallback tokens `<0xE4>`, a decoder that strips the leading space),
//! and the configuration files beside `tokenizer.json`.

use kern_tokenizer::{Detokenizer, Tokenizer, TokenizerError};
use serde_json::{json, Value};
use std::path::Path;

const WORDS: [&str; 10] = [
    "▁h", "▁he", "ll", "▁hell", "▁hello", "▁w", "or", "▁wor", "ld", "▁world",
];
const MERGES: [&str; 10] = [
    "▁ h",
    "▁h e",
    "l l",
    "▁he ll",
    "▁hell o",
    "▁ w",
    "o r",
    "▁w or",
    "l d",
    "▁wor ld",
];

fn special(id: u32, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": true})
}

/// `<unk>` `<s>` `</s>`, the 256 byte tokens, `▁`, a–z, `,` `!`, and the merged words.
fn sentencepiece_json() -> Value {
    let mut vocab = serde_json::Map::new();
    let mut add = |t: String| {
        let id = vocab.len();
        vocab.insert(t, json!(id));
    };
    for t in ["<unk>", "<s>", "</s>"] {
        add(t.into());
    }
    for b in 0..=255u8 {
        add(format!("<0x{b:02X}>"));
    }
    add("▁".into());
    for c in ('a'..='z').chain([',', '!']) {
        add(c.to_string());
    }
    for w in WORDS {
        add(w.into());
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": MERGES}
    })
}

fn write_dir(files: &[(&str, &Value)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("tokenizer.json"),
        sentencepiece_json().to_string(),
    )
    .unwrap();
    for (name, v) in files {
        std::fs::write(d.path().join(name), v.to_string()).unwrap();
    }
    d
}

fn load(d: &Path) -> Tokenizer {
    Tokenizer::from_dir(d).unwrap_or_else(|e| panic!("{e}"))
}

fn stream(t: &Tokenizer, d: &mut Detokenizer<'_>, ids: &[u32]) -> String {
    let mut out = String::new();
    for &id in ids {
        if let Some(s) = d.push(id).unwrap() {
            assert!(!s.ends_with('\u{FFFD}'), "{s:?}");
            out.push_str(&s);
        }
    }
    out.push_str(&d.finish().unwrap());
    let _ = t;
    out
}

#[test]
fn byte_fallback_and_the_leading_space() {
    let dir = write_dir(&[]);
    let t = load(dir.path());
    let hello = t.token_id("▁hello").unwrap();
    let world = t.token_id("▁world").unwrap();
    assert_eq!(
        t.encode("hello world", true).unwrap(),
        vec![1, hello, world]
    );
    assert_eq!(t.encode("hello world", false).unwrap(), vec![hello, world]);
    let text = "hello wörld 😀!";
    let ids = t.encode(text, false).unwrap();
    let byte = |b: u8| t.token_id(&format!("<0x{b:02X}>")).unwrap();
    assert!(
        ids.contains(&byte(0xC3)) && ids.contains(&byte(0xB6)),
        "ö falls back to bytes: {ids:?}"
    );
    assert!(ids.contains(&byte(0xF0)), "😀 falls back to bytes: {ids:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), text);

    let mut d = t.detokenizer(false);
    assert_eq!(stream(&t, &mut d, &ids), text);
    // One push per byte of 😀: nothing until the fourth.
    let mut d = t.detokenizer(false);
    assert_eq!(d.push(hello).unwrap().as_deref(), Some("hello"));
    let bytes = [byte(0x20), byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)];
    let outs: Vec<Option<String>> = bytes.iter().map(|&b| d.push(b).unwrap()).collect();
    assert_eq!(
        outs,
        vec![Some(" ".into()), None, None, None, Some("😀".into())]
    );
}

fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[test]
fn random_text_streams_like_decode() {
    // Random ids, with characters outside the vocabulary written as their byte-fallback
    // tokens, as a model emits them.
    let dir = write_dir(&[]);
    let t = load(dir.path());
    let byte = |b: u8| t.token_id(&format!("<0x{b:02X}>")).unwrap();
    let first_word = t.token_id("▁").unwrap() as u64;
    let vocab = t.vocab_size() as u64;
    let chars = [
        'ö',
        'é',
        '中',
        '文',
        '😀',
        '👍',
        '\u{1F3FD}',
        'Z',
        '\n',
        ' ',
    ];
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    for round in 0..500 {
        let mut ids = vec![];
        for _ in 0..1 + next() % 16 {
            match next() % 3 {
                0 => {
                    let c = chars[(next() % chars.len() as u64) as usize];
                    ids.extend(c.to_string().bytes().map(byte));
                }
                1 => ids.push((next() % 3) as u32), // <unk> <s> </s>
                _ => ids.push((first_word + next() % (vocab - first_word)) as u32),
            }
        }
        let skip = round % 2 == 1;
        let mut d = t.detokenizer(skip);
        let whole = t.decode(&ids, skip).unwrap();
        assert!(!whole.contains('\u{FFFD}'));
        assert_eq!(stream(&t, &mut d, &ids), whole, "{ids:?}");
    }
}

#[test]
fn invalid_byte_runs_keep_what_was_streamed() {
    // The ByteFallback decoder replaces a whole run of byte tokens with U+FFFD when the run is
    // not UTF-8, so a later byte can change how earlier ones decode. Text already streamed
    // cannot be taken back: the stream keeps the valid "W", a full decode shows U+FFFD for it.
    // Byte-level BPE (Qwen, GPT-2, Llama 3) decodes lossily per character and has no such case.
    let dir = write_dir(&[]);
    let t = load(dir.path());
    let byte = |b: u8| t.token_id(&format!("<0x{b:02X}>")).unwrap();
    let ids = [byte(b'W'), byte(0xC8), byte(b'!')];
    let mut d = t.detokenizer(false);
    assert_eq!(d.push(ids[0]).unwrap().as_deref(), Some("W"));
    assert_eq!(d.push(ids[1]).unwrap(), None);
    let rest = d.push(ids[2]).unwrap().unwrap_or_default() + &d.finish().unwrap();
    assert_eq!(t.decode(&ids, false).unwrap(), "\u{FFFD}\u{FFFD}\u{FFFD}");
    assert_eq!(rest, "\u{FFFD}\u{FFFD}\u{FFFD}");
}

#[test]
fn context_keeps_the_space_of_the_first_generated_word() {
    let dir = write_dir(&[]);
    let t = load(dir.path());
    let prompt = t.encode("hello", false).unwrap();
    let answer = [t.token_id("▁world").unwrap(), t.token_id("!").unwrap()];
    // Alone, "▁world" starts a text and loses its space; after the prompt it keeps it.
    assert_eq!(t.decode(&answer, false).unwrap(), "world!");
    let mut d = Detokenizer::with_context(&t, false, &prompt).unwrap();
    assert_eq!(stream(&t, &mut d, &answer), " world!");
}

#[test]
fn configuration_files() {
    // eos as an object, bos as a string, a template list, an added token tokenizer.json lacks.
    let cfg = json!({
        "eos_token": {"content": "</s>", "special": true},
        "bos_token": "<s>",
        "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
        "added_tokens_decoder": {
            "2": {"content": "</s>", "special": true},
            "298": {"content": "<|new|>", "special": true}
        }
    });
    let dir = write_dir(&[("tokenizer_config.json", &cfg)]);
    let t = load(dir.path());
    let base = sentencepiece_json()["model"]["vocab"]
        .as_object()
        .unwrap()
        .len();
    assert_eq!(base, 298, "the added token takes the next id");
    assert_eq!(t.eos_ids(), &[2]);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.chat_template(), Some("D"));
    assert_eq!(t.token_id("<|new|>"), Some(298));
    assert!(t.is_special(298));
    assert_eq!(t.vocab_size(), 299);
    assert_eq!(
        t.encode("hello<|new|>", false).unwrap(),
        vec![t.token_id("▁hello").unwrap(), 298]
    );
}

fn load_err(files: &[(&str, &Value)]) -> String {
    let dir = write_dir(files);
    match Tokenizer::from_dir(dir.path()) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn configuration_errors_name_the_file() {
    let e = load_err(&[("tokenizer_config.json", &json!({"eos_token": "<|nope|>"}))]);
    assert!(e.contains("tokenizer_config.json: `eos_token` is `<|nope|>`, which is not a token of tokenizer.json"), "{e}");
    let e = load_err(&[(
        "tokenizer_config.json",
        &json!({"added_tokens_decoder": {"5": {"content": "</s>"}}}),
    )]);
    assert!(
        e.contains("gives `</s>` id 5, tokenizer.json gives it 2"),
        "{e}"
    );
    let e = load_err(&[(
        "tokenizer_config.json",
        &json!({"added_tokens_decoder": {"900": {"content": "<x>"}}}),
    )]);
    assert!(e.contains("declares `<x>` as id 900"), "{e}");
    let e = load_err(&[("tokenizer_config.json", &json!(["not", "an", "object"]))]);
    assert!(
        e.contains("tokenizer_config.json: is an array, expected a JSON object"),
        "{e}"
    );
    let e = load_err(&[("generation_config.json", &json!({"eos_token_id": [2, -1]}))]);
    assert!(
        e.contains("generation_config.json: `eos_token_id` holds -1"),
        "{e}"
    );

    let d = tempfile::tempdir().unwrap();
    let e = Tokenizer::from_dir(d.path()).unwrap_err();
    assert!(matches!(e, TokenizerError::Io { .. }));
    assert!(
        e.to_string()
            .contains("tokenizer.json: cannot read the tokenizer"),
        "{e}"
    );
    std::fs::write(d.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = Tokenizer::from_dir(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json: not a tokenizer.json that kern can read"),
        "{e}"
    );
}
