//! Constrained decoding on the fake model (CPU), whose choices are arbitrary: whatever it
//! picks, a constrained output must follow its grammar — JSON Schema (validated with a JSON
//! Schema validator), JSON object, regex, choice, Lark — through the model's own mask input
//! and through host masking from the logits, with n-gram and draft-program speculative
//! decoding, with a gate that starts the constraint after a token sequence; grammars that cannot
//! compile are refused with a message naming the problem.

use kern_engine::constraint::{Constraint, Grammar, GrammarError, GrammarLimits, JsonOptions};
use kern_engine::fake::{hash_rule, FakeModel};
use kern_engine::{Engine, EngineConfig, Event, FinishReason, Model, ModelInfo, Request, RequestHandle, Sampling};
use kern_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn qwen3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let root = std::env::var_os("KERN_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"));
        Arc::new(Tokenizer::from_dir(&root.join("qwen3-tokenizer")).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-test-data.sh)")))
    })
    .clone()
}

const VOCAB: usize = 151_936;

fn info(seqs: usize) -> ModelInfo {
    ModelInfo { max_step_tokens: 256, max_step_seqs: seqs, pages_per_seq: 256, page_tokens: 4, total_pages: 4096, vocab: VOCAB, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None }
}

/// The tokens a random walk through JSON should prefer so that it ends: closing quotes,
/// brackets and braces, and the end of the sequence.
pub fn closers(tok: &Tokenizer) -> Vec<u32> {
    let mut v: Vec<u32> = ["\"", "}", "]"].iter().map(|s| tok.encode(s, false).unwrap()[0]).collect();
    v.extend(tok.eos_ids());
    v
}

fn start(model: FakeModel, cfg: EngineConfig) -> Engine {
    let tok = qwen3();
    let cfg = EngineConfig { eos: tok.eos_ids().to_vec(), ..cfg };
    let e = Engine::start(cfg, Some(tok), move || Ok(Box::new(model) as Box<dyn Model>));
    e.wait_ready().expect("ready");
    e
}

fn fake(seqs: usize) -> FakeModel {
    FakeModel::new(info(seqs), hash_rule(VOCAB)).with_preferred(closers(&qwen3()))
}

fn run(h: RequestHandle) -> (String, Vec<u32>, FinishReason) {
    let mut h = h;
    let (mut text, mut toks) = (String::new(), vec![]);
    loop {
        match h.blocking_recv() {
            Some(Event::Output { text: t, tokens, .. }) => {
                text.push_str(&t);
                toks.extend(tokens);
            }
            Some(Event::Finished { reason, .. }) => return (text, toks, reason),
            other => panic!("request failed: {other:?}"),
        }
    }
}

fn request(e: &Engine, prompt: Vec<u32>, g: &Grammar, sampling: Sampling, start_after: Vec<u32>) -> RequestHandle {
    let grammar = e.compile(g).unwrap_or_else(|err| panic!("{g:?}: {err}"));
    let req = Request { sampling, constraint: Some(Constraint { grammar, start_after, opens_with: None }), ..Request::new(prompt, 600) };
    e.submit(req).expect("queued")
}

fn schema(s: Value) -> Grammar {
    Grammar::JsonSchema { schema: s, strict: true, options: JsonOptions::default() }
}

fn check_json(schema_v: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema_v).expect("a valid schema");
    if let Err(errs) = validator.validate(&v) {
        panic!("{text} does not validate against {schema_v}: {errs}");
    }
}

const PERSON: &str = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 150}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}, "kind": {"const": "person"}}, "required": ["name", "age", "kind"], "additionalProperties": false}"#;

#[test]
fn json_schema_outputs_validate_greedy_and_sampled_with_a_mask_input_and_on_the_host() {
    let s: Value = serde_json::from_str(PERSON).unwrap();
    for host in [false, true] {
        let model = if host { fake(16).without_token_mask() } else { fake(16) };
        let e = start(model, EngineConfig::default());
        assert_eq!(e.info().unwrap().token_mask, !host);
        // Host masking reads and samples 150k-wide logits rows (slow unoptimized): fewer requests.
        let n = if host { 8 } else { 24 };
        let hs: Vec<RequestHandle> = (0..n)
            .map(|i| {
                let sampling = if i % 2 == 0 { Sampling::default() } else { Sampling { temperature: 0.8, top_p: 0.9, seed: Some(i as u64), ..Default::default() } };
                request(&e, vec![100 + i, 7, 9], &schema(s.clone()), sampling, vec![])
            })
            .collect();
        for h in hs {
            let (text, _, reason) = run(h);
            assert_eq!(reason, FinishReason::Stop, "{text}");
            check_json(&s, &text);
        }
    }
}

#[test]
fn regex_choice_lark_and_json_object() {
    let e = start(fake(8), EngineConfig::default());
    let (t, _, _) = run(request(&e, vec![1, 2, 3], &Grammar::Regex(r"[0-9]{3}-[a-z]{2,4}".into()), Sampling::default(), vec![]));
    let re = regex_lite(&t);
    assert!(re, "{t:?}");
    let choices = vec!["red".to_string(), "green".into(), "blue sky".into()];
    for i in 0..8 {
        let (t, _, r) = run(request(&e, vec![5, i], &Grammar::Choice(choices.clone()), Sampling::default(), vec![]));
        assert!(choices.contains(&t) && r == FinishReason::Stop, "{t:?}");
    }
    let (t, _, _) = run(request(&e, vec![9], &Grammar::Lark(r#"start: "yes" | "no" | "n=" /[0-9]+/"#.into()), Sampling::default(), vec![]));
    assert!(t == "yes" || t == "no" || (t.starts_with("n=") && t[2..].chars().all(|c| c.is_ascii_digit())), "{t:?}");
    let (t, _, _) = run(request(&e, vec![11, 12], &Grammar::JsonObject { options: JsonOptions::default() }, Sampling::default(), vec![]));
    assert!(serde_json::from_str::<Value>(&t).unwrap_or_else(|err| panic!("{err}: {t}")).is_object(), "{t}");
}

/// `ddd-letters` with 2..4 lowercase letters.
fn regex_lite(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() >= 6 && b.len() <= 8 && b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-' && b[4..].iter().all(u8::is_ascii_lowercase)
}

#[test]
fn speculative_decoding_keeps_outputs_valid() {
    let s: Value = serde_json::from_str(PERSON).unwrap();
    let tok = qwen3();
    // N-gram drafts (prompt lookup) from a prompt holding JSON-like text, and a draft program
    // that proposes arbitrary tokens: drafts the grammar forbids are rejected and rolled back.
    let prompt = tok.encode(r#"{"name": "Ann", "age": 31, "kind": "person"} {"name": "Bo", "age": 4, "kind": "person"}"#, false).unwrap();
    for spec in [kern_sched::SpecConfig::ngram(4), kern_sched::SpecConfig::program(3)] {
        let program = spec.drafter == kern_sched::Drafter::Program;
        let model = if program { fake(16).with_draft(hash_rule(VOCAB), 3) } else { fake(16) };
        let e = start(model, EngineConfig { spec: Some(spec), ..Default::default() });
        let hs: Vec<RequestHandle> = (0..8u32).map(|i| request(&e, [prompt.clone(), vec![i]].concat(), &schema(s.clone()), Sampling::default(), vec![])).collect();
        for h in hs {
            let (text, _, _) = run(h);
            check_json(&s, &text);
        }
    }
}

#[test]
fn a_gated_constraint_starts_after_its_tokens() {
    let tok = qwen3();
    let end = tok.encode("</think>", false).unwrap();
    // The rule emits a reasoning block first: `</think>` after 5 free tokens.
    let gate = end.clone();
    let rule: kern_engine::fake::Rule = Arc::new(move |ctx: &[u32]| if ctx.len() == 8 { gate[0] } else { 1000 + ctx.len() as u32 });
    let model = FakeModel::new(info(8), rule).with_preferred(closers(&tok));
    let e = start(model, EngineConfig::default());
    let g = Grammar::Choice(vec!["alpha".into(), "beta".into()]);
    let (text, toks, _) = run(request(&e, vec![1, 2, 3], &g, Sampling::default(), end.clone()));
    let at = toks.iter().position(|&t| t == end[0]).expect("the gate token");
    assert_eq!(at, 5, "five free tokens, then the gate: {toks:?}");
    let after = tok.decode(&toks[at + 1..], true).unwrap();
    assert!(after == "alpha" || after == "beta", "{text:?} → {after:?}");
}

#[test]
fn grammars_that_cannot_compile_are_refused_with_the_reason() {
    let limits = GrammarLimits { max_source_bytes: 4096, timeout: Duration::from_secs(20), ..Default::default() };
    let e = start(fake(8), EngineConfig { grammar_limits: limits, ..Default::default() });
    let bad = |g: Grammar| e.compile(&g).err().unwrap_or_else(|| panic!("{g:?} compiled"));
    let err = bad(schema(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]})));
    assert!(matches!(err, GrammarError::Invalid { .. }) && err.to_string().contains("missing"), "{err}");
    let err = bad(schema(json!({"type": "integer", "minimum": 5, "maximum": 1})));
    assert!(err.to_string().contains("JSON schema cannot be used"), "{err}");
    let err = bad(Grammar::Regex("[a-".into()));
    assert!(err.to_string().contains("does not parse"), "{err}");
    let err = bad(Grammar::Lark("start: undefined_rule".into()));
    assert!(err.to_string().contains("undefined_rule"), "{err}");
    let big = json!({"type": "object", "description": "x".repeat(5000)});
    assert!(matches!(bad(schema(big)), GrammarError::TooLarge { .. }));
    // A cached grammar is the same compiled object.
    let g = schema(json!({"type": "string"}));
    assert!(!e.grammars().unwrap().is_cached(&g));
    let a = e.compile(&g).unwrap();
    assert!(e.grammars().unwrap().is_cached(&g));
    assert!(Arc::ptr_eq(&a, &e.compile(&g).unwrap()));
}

#[test]
fn a_model_without_mask_input_or_logits_refuses_constraints() {
    let mut i = info(8);
    i.logits = false;
    let e = start(FakeModel::new(i, hash_rule(VOCAB)).without_token_mask(), EngineConfig::default());
    let err = e.compile(&Grammar::Regex("a".into())).unwrap_err();
    assert!(err.to_string().contains("token_mask"), "{err}");
}

#[test]
fn token_bytes_equal_llguidance_s_own_tokenizer_json_reader() {
    let tok = qwen3();
    let ours = kern_engine::constraint::token_bytes(&tok).unwrap();
    let json: Value = serde_json::from_str(&tok.inner().to_string(false).unwrap()).unwrap();
    let theirs = llguidance::token_bytes_from_tokenizer_json(&json).unwrap();
    assert_eq!(ours.len(), theirs.len());
    let diff: Vec<usize> = (0..ours.len()).filter(|&i| ours[i] != theirs[i]).collect();
    assert!(diff.is_empty(), "{} tokens differ, e.g. {:?}", diff.len(), diff.iter().take(5).map(|&i| (i, &ours[i], &theirs[i])).collect::<Vec<_>>());
}

#[test]
fn whitespace_in_json_is_capped_even_for_a_model_that_wants_only_whitespace() {
    // A model that prefers whitespace over everything (the runaway that pads JSON until
    // max_tokens): the grammar allows at most 20 whitespace characters between two tokens, so
    // the output still ends, valid.
    let tok = qwen3();
    let mut preferred: Vec<u32> = [" ", "\n", "\t", "  ", "\n\n", "    "].iter().map(|s| tok.encode(s, false).unwrap()[0]).collect();
    preferred.extend(closers(&tok));
    let e = start(FakeModel::new(info(8), hash_rule(VOCAB)).with_preferred(preferred), EngineConfig::default());
    let s: Value = serde_json::from_str(PERSON).unwrap();
    for i in 0..4u32 {
        let (text, toks, reason) = run(request(&e, vec![40 + i], &schema(s.clone()), Sampling::default(), vec![]));
        assert_eq!(reason, FinishReason::Stop, "{} tokens: {text:?}", toks.len());
        check_json(&s, &text);
        let longest = text.split(|c: char| !c.is_whitespace()).map(str::len).max().unwrap_or(0);
        assert!(longest <= 20, "a whitespace run of {longest}: {text:?}");
        assert!(longest >= 4, "the model did pad: {text:?}");
    }
}
