//! The SentencePiece-style GGUF tokenizer's `default` variant (transformers' LlamaTokenizer:
//! a prefix space through Metaspace, merges ranked by score) on small synthetic vocabularies,
//! id for id against transformers' GGUF loader, and the errors bad SentencePiece metadata gets.
//!
//! The vocabularies are in the committed fixture `tests/data/gguf-tokenizer-cases.json`
//! (`synthetic`: written as GGUF by gguf-py and loaded back by transformers in
//! `tests/data/gen_gguf_tokenizer_cases.py`), so these tests need no downloaded data. Their
//! scores tie in threes, so the order of equal-score merges (generation order) is tested too.

use kern_tokenizer::{GgufTokenizerMeta, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn synthetic() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf-tokenizer-cases.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["synthetic"].take()
}

/// The synthetic metadata with a variant's flags.
fn meta_with(base: &Value, flags: &Value) -> GgufTokenizerMeta {
    let mut m = base.clone();
    for (k, v) in flags.as_object().unwrap() {
        m[k] = v.clone();
    }
    GgufTokenizerMeta::from_json(&m).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn synthetic_vocabularies_match_transformers() {
    let syn = synthetic();
    let variants = syn["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 2);
    for (name, v) in variants {
        let t = Tokenizer::from_gguf_metadata(meta_with(&syn["meta"], &v["flags"]))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.add_bos(), v["add_bos_token"].as_bool().unwrap(), "{name}");
        assert_eq!(t.add_eos(), v["add_eos_token"].as_bool().unwrap(), "{name}");
        let d = tempfile::tempdir().unwrap();
        t.save_dir(d.path()).unwrap();
        let back = Tokenizer::from_dir(d.path()).unwrap();
        let texts = v["texts"].as_array().unwrap();
        assert!(texts.len() >= 80, "{name}: {} texts", texts.len());
        let mut failures = Vec::new();
        for case in texts {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            let got = t.encode(text, true).unwrap();
            if got != want {
                failures.push(format!("{text:?}:\n want {want:?}\n  got {got:?}"));
                continue;
            }
            assert_eq!(
                t.encode(text, false).unwrap(),
                ids(&case["ids_no_special"]),
                "{name}: {text:?} without special tokens"
            );
            assert_eq!(
                t.decode(&got, false).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{name}: {text:?} decoded"
            );
            assert_eq!(
                back.encode(text, true).unwrap(),
                got,
                "{name}: {text:?} saved"
            );
            // Streamed token by token, the text is the same (Strip drops the first space only).
            let mut d = t.detokenizer(false);
            let mut streamed = String::new();
            for &id in &got {
                streamed.extend(d.push(id).unwrap());
            }
            streamed.push_str(&d.finish().unwrap());
            assert_eq!(
                streamed,
                t.decode(&got, false).unwrap(),
                "{name}: {text:?} streamed"
            );
        }
        assert!(
            failures.is_empty(),
            "{name}: {} of {} texts differ:\n{}",
            failures.len(),
            texts.len(),
            failures.join("\n")
        );
    }
}

/// transformers ignores `add_space_prefix: false` for this variant (the GGML runtime would not
/// prepend the space); kern follows transformers, and the fixture shows it.
#[test]
fn add_space_prefix_false_still_prefixes_as_transformers_does() {
    let syn = synthetic();
    let v = &syn["variants"]["add_eos, no add_bos, add_space_prefix false"];
    assert_eq!(v["flags"]["tokenizer.ggml.add_space_prefix"], false);
    let t = Tokenizer::from_gguf_metadata(meta_with(&syn["meta"], &v["flags"])).unwrap();
    let case = v["texts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["text"] == "Hello world")
        .unwrap();
    let got = t.encode("Hello world", false).unwrap();
    assert_eq!(got, ids(&case["ids_no_special"]));
    assert!(
        t.token(got[0]).unwrap().starts_with('\u{2581}'),
        "the first piece carries the prefix space: {:?}",
        t.token(got[0])
    );
    assert_eq!(
        t.encode("Hello world", true).unwrap().last(),
        Some(&2),
        "add_eos"
    );
}

#[test]
fn bad_sentencepiece_metadata_is_refused_by_name() {
    let syn = synthetic();
    let base = meta_with(&syn["meta"], &serde_json::json!({}));
    assert!(Tokenizer::from_gguf_metadata(base.clone()).is_ok());
    let check = |f: &dyn Fn(&mut GgufTokenizerMeta), want: &str| {
        let mut m = base.clone();
        f(&mut m);
        let e = Tokenizer::from_gguf_metadata(m).unwrap_err().to_string();
        assert!(e.contains(want), "{e}\n  does not contain {want:?}");
    };
    check(
        &|m| m.architecture = None,
        "`general.architecture` is missing",
    );
    check(
        &|m| {
            m.scores.pop();
        },
        "`tokenizer.ggml.scores` has 760 entries for 761 tokens",
    );
    check(
        &|m| m.scores.clear(),
        "`tokenizer.ggml.scores` has 0 entries",
    );
    check(
        &|m| m.scores[9] = f32::NAN,
        "`tokenizer.ggml.scores`[9] is NaN",
    );
    check(
        &|m| m.merges = vec!["a b".into()],
        "`tokenizer.ggml.merges` has 1 merges",
    );
    check(&|m| m.tokens[300] = "<s>".into(), "holds `<s>` twice");
    check(
        &|m| {
            m.add_eos = Some(true);
            m.eos_id = None
        },
        "`tokenizer.ggml.add_eos_token` is true but `tokenizer.ggml.eos_token_id` is missing",
    );
    check(
        &|m| m.unk_id = Some(761),
        "`tokenizer.ggml.unknown_token_id` is 761, past the 761 tokens",
    );
    // A variant that ranks by position needs no scores.
    let mut m = base.clone();
    m.architecture = Some("gemma3".into());
    m.scores.clear();
    assert!(Tokenizer::from_gguf_metadata(m).is_ok());

    let mut json = syn["meta"].clone();
    json["tokenizer.ggml.scores"] = serde_json::json!(["x"]);
    let e = GgufTokenizerMeta::from_json(&json).unwrap_err().to_string();
    assert!(
        e.contains("`tokenizer.ggml.scores` is not an array of numbers"),
        "{e}"
    );
    let mut json = syn["meta"].clone();
    json["tokenizer.ggml.add_eos_token"] = serde_json::json!(1);
    let e = GgufTokenizerMeta::from_json(&json).unwrap_err().to_string();
    assert!(
        e.contains("`tokenizer.ggml.add_eos_token` is not a boolean"),
        "{e}"
    );
    let mut json = syn["meta"].clone();
    json["general.architecture"] = serde_json::json!(3);
    let e = GgufTokenizerMeta::from_json(&json).unwrap_err().to_string();
    assert!(e.contains("`general.architecture` is not a string"), "{e}");
}
