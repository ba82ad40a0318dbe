//! kern-tokenizer on the real Qwen3 tokenizer files (`scripts/fetch-test-data.sh` fetches
//! them): special tokens, encodings equal to the Python `tokenizers` package's, and
//! incremental detokenization.

use kern_tokenizer::{chatml, Detokenizer, Tokenizer};
use std::path::PathBuf;

const ENDOFTEXT: u32 = 151643;
const IM_START: u32 = 151644;
const IM_END: u32 = 151645;

fn data_dir() -> PathBuf {
    let root = match std::env::var_os("KERN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"),
    };
    let dir = root.join("qwen3-tokenizer");
    assert!(
        dir.join("tokenizer.json").is_file() && dir.join("tokenizer_config.json").is_file(),
        "the Qwen3 tokenizer is not in {}: run scripts/fetch-test-data.sh",
        dir.display()
    );
    dir
}

/// Loaded once: parsing the 11 MB tokenizer.json takes seconds in a debug build.
fn qwen3() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_dir(&data_dir()).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn special_tokens() {
    let t = qwen3();
    assert_eq!(t.token_id("<|endoftext|>"), Some(ENDOFTEXT));
    assert_eq!(t.token_id("<|im_start|>"), Some(IM_START));
    assert_eq!(t.token_id("<|im_end|>"), Some(IM_END));
    assert_eq!(t.token(IM_END).as_deref(), Some("<|im_end|>"));
    // tokenizer_config.json: eos_token is <|im_end|>; there is no BOS.
    assert_eq!(t.eos_ids(), &[IM_END]);
    assert_eq!(t.bos_id(), None);
    // 151,643 byte-level BPE tokens and 26 added ones.
    assert_eq!(t.vocab_size(), 151_669);
    assert!(t.is_special(IM_END) && t.is_special(ENDOFTEXT));
    assert!(
        !t.is_special(t.token_id("</think>").unwrap()),
        "</think> is added but not special"
    );
    assert!(!t.is_special(9707));
    assert!(t.chat_template().unwrap().contains("<|im_start|>"));
}

#[test]
fn generation_config_adds_eos_ids() {
    let src = data_dir();
    let d = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    std::fs::write(
        d.path().join("generation_config.json"),
        r#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": true}"#,
    )
    .unwrap();
    let t = Tokenizer::from_file(&d.path().join("tokenizer.json")).unwrap();
    assert_eq!(t.eos_ids(), &[IM_END, ENDOFTEXT]);
    assert_eq!(t.bos_id(), Some(ENDOFTEXT));
    std::fs::write(
        d.path().join("generation_config.json"),
        r#"{"eos_token_id": 151643}"#,
    )
    .unwrap();
    let t = Tokenizer::from_dir(d.path()).unwrap();
    assert_eq!(t.eos_ids(), &[ENDOFTEXT, IM_END]);
    std::fs::write(
        d.path().join("generation_config.json"),
        r#"{"eos_token_id": "x"}"#,
    )
    .unwrap();
    let e = Tokenizer::from_dir(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("eos_token_id"),
        "{e}"
    );
}

#[test]
fn encodings_match_the_python_tokenizers_package() {
    let t = qwen3();
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("data/qwen3-encodings.json")).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() > 80);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(t.encode(text, false).unwrap(), want, "encoding {text:?}");
        // Qwen's post-processor adds nothing.
        assert_eq!(
            t.encode(text, true).unwrap(),
            want,
            "encoding {text:?} with special tokens"
        );
        let decoded = case.get("decoded").and_then(|d| d.as_str()).unwrap_or(text);
        assert_eq!(t.decode(&want, false).unwrap(), decoded);
    }
    assert_eq!(t.encode("Hello world", false).unwrap(), vec![9707, 1879]);
}

#[test]
fn chatml_prompt_encodes_with_special_ids() {
    let t = qwen3();
    let prompt = chatml(&[("user", "What is the capital of France?")]);
    let ids = t.encode(&prompt, false).unwrap();
    assert_eq!(ids[0], IM_START);
    assert_eq!(ids.iter().filter(|&&i| i == IM_START).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == IM_END).count(), 1);
    // "<|im_start|>assistant\n" ends it: the assistant token, then a newline.
    assert_eq!(ids[ids.len() - 3], IM_START);
    assert_eq!(
        t.decode(&ids[ids.len() - 2..], false).unwrap(),
        "assistant\n"
    );
    assert_eq!(
        t.decode(&ids, true).unwrap(),
        "user\nWhat is the capital of France?\nassistant\n"
    );
}

/// Pushes every id and checks what comes out: the concatenation equals `decode(all)`, and no
/// push returns text with U+FFFD unless the full decoding has one there too.
fn stream(t: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<Option<String>> {
    let mut d = t.detokenizer(skip_special);
    let mut outs: Vec<Option<String>> = ids.iter().map(|&i| d.push(i).unwrap()).collect();
    let rest = d.finish().unwrap();
    let whole = t.decode(ids, skip_special).unwrap();
    let mut joined: String = outs.iter().flatten().map(String::as_str).collect();
    joined.push_str(&rest);
    assert_eq!(joined, whole, "ids {ids:?} (skip_special {skip_special})");
    if !whole.contains('\u{FFFD}') {
        assert!(!joined.contains('\u{FFFD}'));
        assert!(
            rest.is_empty(),
            "nothing is left for finish() when the text is complete"
        );
    }
    outs.push(Some(rest));
    outs
}

#[test]
fn detokenizer_streams_mixed_text() {
    let t = qwen3();
    let text = "Hello 世界! Emoji 😀👍🏽👨‍👩‍👧 and code `x += 1;`\n\t中文字符，日本語。 done";
    let ids = t.encode(text, false).unwrap();
    let outs = stream(t, &ids, false);
    assert!(outs.iter().flatten().all(|s| !s.contains('\u{FFFD}')));
    // Emoji are split over several tokens: some pushes must wait.
    assert!(outs.iter().any(Option::is_none), "{outs:?}");
    // Special tokens stream as their text, or as nothing when skipped.
    let ids = t.encode(&chatml(&[("user", "你好")]), false).unwrap();
    stream(t, &ids, false);
    let skipped = stream(t, &ids, true);
    assert!(skipped.iter().flatten().all(|s| !s.contains("<|")));
}

/// GPT-2's byte → character table, which byte-level BPE vocabularies are written in.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap()
}

#[test]
fn detokenizer_waits_for_characters_split_over_byte_tokens() {
    let t = qwen3();
    let text = "é😀中";
    // One token per byte: 2 + 4 + 3 of them.
    let ids: Vec<u32> = text
        .bytes()
        .map(|b| {
            t.token_id(&byte_char(b).to_string())
                .unwrap_or_else(|| panic!("byte {b:#x}"))
        })
        .collect();
    assert_eq!(ids.len(), 9);
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    let outs = stream(t, &ids, false);
    let want: Vec<Option<String>> = [
        None,
        Some("é"),
        None,
        None,
        None,
        Some("😀"),
        None,
        None,
        Some("中"),
        Some(""),
    ]
    .into_iter()
    .map(|o| o.map(str::to_string))
    .collect();
    assert_eq!(outs, want);
}

#[test]
fn detokenizer_on_random_ids() {
    let t = qwen3();
    let vocab = t.vocab_size() as u64;
    // The byte tokens and the specials are where things go wrong: draw them often.
    let bytes: Vec<u32> = (0..=255u8)
        .map(|b| t.token_id(&byte_char(b).to_string()).unwrap())
        .collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..400 {
        let len = 1 + (next() % 24) as usize;
        let ids: Vec<u32> = (0..len)
            .map(|_| match next() % 4 {
                0 => bytes[(next() % 256) as usize],
                1 => 151_643 + (next() % 26) as u32,
                _ => (next() % vocab) as u32,
            })
            .collect();
        stream(t, &ids, round % 2 == 0);
    }
}

#[test]
fn detokenizer_with_prompt_context() {
    let t = qwen3();
    let prompt = t.encode("The capital of France is", false).unwrap();
    let answer = t.encode(" Paris. 巴黎 🇫🇷", false).unwrap();
    let mut d = Detokenizer::with_context(t, false, &prompt).unwrap();
    let mut out = String::new();
    for &id in &answer {
        if let Some(s) = d.push(id).unwrap() {
            out.push_str(&s);
        }
    }
    out.push_str(&d.finish().unwrap());
    assert_eq!(out, " Paris. 巴黎 🇫🇷");
    assert!(d.pending().is_empty());
}
