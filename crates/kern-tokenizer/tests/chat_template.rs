//! Chat templates rendered by kern (minijinja) against transformers' `apply_chat_template`
//! (Jinja2): `tests/data/qwen3-chat-template.json`, made by `gen_chat_template_cases.py`
//! beside it, holds each conversation and transformers' output. The Qwen3 template comes from
//! the fetched tokenizer (`scripts/fetch-test-data.sh`); other cases carry their template,
//! except those marked `gguf` (the GGUF file's template), which `tests/gguf.rs` checks.
//! `tests/data/gguf-tokenizer-cases.json` (`templates`) adds Llama 3.x's date prologue
//! (`strftime_now`, `date_string`), rendered by transformers in `gen_gguf_tokenizer_cases.py`.

use kern_tokenizer::{ChatTemplate, ContentFormat, TemplateError, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    let root = match std::env::var_os("KERN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"),
    };
    let dir = root.join("qwen3-tokenizer");
    assert!(
        dir.join("tokenizer_config.json").is_file(),
        "the Qwen3 tokenizer is not in {}: run scripts/fetch-test-data.sh",
        dir.display()
    );
    dir
}

fn cases() -> Vec<Value> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3-chat-template.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn render(t: &ChatTemplate, case: &Value) -> Result<String, TemplateError> {
    let tools = case.get("tools").filter(|t| !t.is_null());
    let extra = case.get("kwargs").and_then(Value::as_object);
    t.render(
        &case["messages"],
        tools,
        case["add_generation_prompt"].as_bool().unwrap(),
        extra,
    )
}

#[test]
fn qwen3_template_matches_transformers() {
    let tok = Tokenizer::from_dir(&data_dir()).unwrap();
    let qwen3 = tok
        .chat_template_renderer()
        .expect("Qwen3 has a chat template")
        .unwrap();
    assert_eq!(qwen3.content_format(), ContentFormat::String);
    let mut compared = 0;
    let mut failures = Vec::new();
    for case in cases() {
        if case.get("gguf").is_some() {
            continue; // the GGUF file's template: tests/gguf.rs
        }
        let name = case["name"].as_str().unwrap();
        let own;
        let t = match case.get("template").and_then(Value::as_str) {
            Some(src) => {
                // The case template handles content parts itself (as Jinja2 sees them).
                own = ChatTemplate::new(src, None, Some("<|im_end|>".into()))
                    .unwrap()
                    .with_content_format(ContentFormat::Parts);
                &own
            }
            None => &qwen3,
        };
        let got = render(t, &case);
        match (case.get("expected").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) if got == want => {}
            (Some(want), got) => failures.push(format!("{name}:\n want {want:?}\n  got {got:?}")),
            (None, Err(TemplateError::Raised { message })) => {
                assert_eq!(message, case["error"].as_str().unwrap(), "{name}")
            }
            (None, got) => failures.push(format!("{name}: expected an error, got {got:?}")),
        }
        compared += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(compared >= 17, "only {compared} cases");
}

#[test]
fn qwen3_content_parts_render_as_text() {
    let tok = Tokenizer::from_dir(&data_dir()).unwrap();
    let t = tok.chat_template_renderer().unwrap().unwrap();
    let parts: Value = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]}]);
    assert_eq!(
        t.render(&parts, None, true, None).unwrap(),
        "<|im_start|>user\nWhat is the capital\nof France?<|im_end|>\n<|im_start|>assistant\n"
    );
    // An OpenAI-style assistant tool call: null content, arguments as a JSON string.
    let call: Value = serde_json::json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21"}]);
    // kern gives the text-only template "" for the null content (transformers 5 would drop
    // the key and Jinja2 would then fail on `'</think>' in message.content`), and parses the
    // arguments string into the object the template serializes.
    assert_eq!(
        t.render(&call, None, true, None).unwrap(),
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn chat_template_jinja_file_wins() {
    let src = data_dir();
    let d = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    std::fs::write(
        d.path().join("chat_template.jinja"),
        "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}",
    )
    .unwrap();
    let tok = Tokenizer::from_dir(d.path()).unwrap();
    let t = tok.chat_template_renderer().unwrap().unwrap();
    let m = serde_json::json!([{"role": "user", "content": "hi"}]);
    assert_eq!(
        t.render(&m, None, true, None).unwrap(),
        "user: hi<|im_end|>\n"
    );
    std::fs::write(d.path().join("chat_template.jinja"), "{% if %}").unwrap();
    let tok = Tokenizer::from_dir(d.path()).unwrap();
    let e = tok.chat_template_renderer().unwrap().unwrap_err();
    assert!(matches!(e, TemplateError::Syntax { .. }), "{e:?}");
}

/// Llama 3.x's opening (`date_string` unless given, else `strftime_now("%d %b %Y")`),
/// `messages` reassigned after the system message, `raise_exception` on an unknown role, with
/// the BOS token passed as a keyword (it overrides the tokenizer's, as in transformers).
#[test]
fn llama3_date_prologue_renders_as_transformers_renders_it() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf-tokenizer-cases.json");
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let t = &v["templates"][0];
    let ct = ChatTemplate::new(t["template"].as_str().unwrap(), Some("<s>".into()), None).unwrap();
    let cases = t["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let got = ct.render(
            &case["messages"],
            None,
            case["add_generation_prompt"].as_bool().unwrap(),
            case["kwargs"].as_object(),
        );
        if let Some(err) = case.get("error") {
            match got {
                Err(TemplateError::Raised { message }) => {
                    assert_eq!(message, err.as_str().unwrap())
                }
                other => panic!("{name}: expected the template to raise, got {other:?}"),
            }
            continue;
        }
        // The date transformers rendered is replaced by `{today}`; render it as kern would now
        // (local time, as Python's `datetime.now()`), just before and after, for midnight.
        let want = case["text"].as_str().unwrap();
        let day = || chrono::Local::now().format("%d %b %Y").to_string();
        let before = day();
        let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
        let after = day();
        assert!(
            got == want.replace("{today}", &before) || got == want.replace("{today}", &after),
            "{name}:\n got {got:?}\nwant {want:?}"
        );
    }
}
