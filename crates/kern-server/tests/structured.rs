//! Structured output, tool calls and reasoning over HTTP, against the fake model (whose
//! choices are arbitrary, so only the constraint makes them valid): `response_format` and
//! `structured_outputs` on chat and completions, grammar errors as 400s naming the field,
//! `tool_choice` required / named / auto (a scripted model writing a call with `</tool_call>`
//! inside an argument), streamed `delta.tool_calls` reassembled to the whole response,
//! `reasoning_content` with a constraint gated after the reasoning block, and — when the
//! pinned `openai` package is installed (scripts/test.sh) — the official client's `parse()` with
//! a Pydantic model and a full tool-calling loop (tests/openai_client.py).

use kern_engine::fake::{hash_rule, FakeModel, Rule};
use kern_engine::{Engine, EngineConfig, Model, ModelInfo};
use kern_server::{AppState, SamplingDefaults, ServerConfig};
use kern_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn data() -> PathBuf {
    std::env::var_os("KERN_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"))
}

fn qwen3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| Arc::new(Tokenizer::from_dir(&data().join("qwen3-tokenizer")).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-test-data.sh)")))).clone()
}

const VOCAB: usize = 151_936;
const IM_START: u32 = 151_644;
const THINK: u32 = 151_667;
const END_THINK: u32 = 151_668;

struct Server {
    base: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn server(rule: Rule) -> Server {
    let tok = qwen3();
    let info = ModelInfo { max_step_tokens: 512, max_step_seqs: 32, pages_per_seq: 256, page_tokens: 4, total_pages: 8192, vocab: VOCAB, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None };
    let preferred: Vec<u32> = ["\"", "}", "]"].iter().map(|s| tok.encode(s, false).unwrap()[0]).chain(tok.eos_ids().iter().copied()).collect();
    let engine = Engine::start(EngineConfig { eos: tok.eos_ids().to_vec(), ..Default::default() }, Some(tok.clone()), move || Ok(Box::new(FakeModel::new(info, rule).with_preferred(preferred)) as Box<dyn Model>));
    let src = tok.chat_template().unwrap().to_string();
    let cfg = ServerConfig {
        served_model_names: vec!["fake".into()],
        api_key: None,
        max_logprobs: 20,
        defaults: SamplingDefaults::default(),
        chat_template: Some(tok.chat_template_renderer().unwrap().unwrap()),
        root: "fake".into(),
        max_body_bytes: kern_server::DEFAULT_MAX_BODY_BYTES,
        tool_format: kern_server::tools::detect(&src).map(Arc::from),
        reasoning: kern_server::reasoning::detect(&src),
    };
    let state = AppState::new(engine, Some(tok), cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(kern_server::serve(listener, state, async move {
        let _ = rx.await;
    }));
    let c = reqwest::Client::new();
    let t = Instant::now();
    while c.get(format!("{base}/health")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(t.elapsed() < Duration::from_secs(30), "server not ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Server { base, _stop: tx }
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new().post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    /// A streamed chat: every chunk's JSON.
    async fn stream(&self, body: Value) -> Vec<Value> {
        let r = reqwest::Client::new().post(format!("{}/v1/chat/completions", self.base)).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.unwrap();
        text.split("\n\n").filter_map(|b| b.strip_prefix("data: ")).filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect()
    }
}

fn validate(schema: &Value, text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let val = jsonschema::validator_for(schema).unwrap();
    assert!(val.is_valid(&v), "{text} does not validate against {schema}");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now", "description": "The time"}}
    ])
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The tokens after the last `<|im_start|>` header (role and newline): the generated part.
fn generated(ctx: &[u32]) -> &[u32] {
    let at = ctx.iter().rposition(|&t| t == IM_START).map_or(0, |i| (i + 3).min(ctx.len()));
    &ctx[at..]
}

/// A model that writes `script` and then ends.
fn script_rule(script: Vec<u32>, eos: u32) -> Rule {
    Arc::new(move |ctx: &[u32]| script.get(generated(ctx).len()).copied().unwrap_or(eos))
}

/// A thinking model: `<think>`, three tokens, `</think>`, then arbitrary tokens — unless the
/// prompt already closed the block (thinking off).
fn thinking_rule() -> Rule {
    let free = hash_rule(VOCAB);
    Arc::new(move |ctx: &[u32]| {
        let g = generated(ctx);
        if g.contains(&END_THINK) {
            return free(ctx);
        }
        match g.iter().position(|&t| t == THINK) {
            None => THINK,
            Some(p) if g.len() - p - 1 < 3 => 1000 + (g.len() - p) as u32,
            Some(_) => END_THINK,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_formats_and_structured_outputs_constrain_chat_and_completions() {
    let s = server(hash_rule(VOCAB)).await;
    // This fake model does not reason: thinking off, or its first token could open a block.
    let off = json!({"enable_thinking": false});
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0}, "capital": {"type": "boolean"}}, "required": ["city", "population", "capital"], "additionalProperties": false});
    for stream in [false, true] {
        let body = json!({"messages": user("A city as JSON"), "seed": 7, "max_tokens": 300, "stream": stream, "chat_template_kwargs": off, "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}}});
        let text = if stream {
            s.stream(body).await.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string)).collect::<String>()
        } else {
            let (st, v) = s.post("/v1/chat/completions", body).await;
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        };
        validate(&schema, &text);
    }
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": user("JSON please"), "seed": 7, "max_tokens": 200, "chat_template_kwargs": off, "response_format": {"type": "json_object"}})).await;
    assert_eq!(st, 200, "{v}");
    assert!(serde_json::from_str::<Value>(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap().is_object());
    // Completions take the same fields, and vLLM's structured_outputs.
    let (st, v) = s.post("/v1/completions", json!({"prompt": "Pick:", "seed": 7, "max_tokens": 20, "n": 3, "structured_outputs": {"choice": ["alpha", "beta gamma"]}})).await;
    assert_eq!(st, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert!(["alpha", "beta gamma"].contains(&c["text"].as_str().unwrap()), "{c}");
    }
    let (st, v) = s.post("/v1/completions", json!({"prompt": "Date:", "seed": 7, "max_tokens": 30, "structured_outputs": {"regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"}})).await;
    assert_eq!(st, 200, "{v}");
    let d = v["choices"][0]["text"].as_str().unwrap();
    assert!(d.len() == 10 && d.starts_with("20") && d.as_bytes()[4] == b'-', "{d}");
    let (st, v) = s.post("/v1/completions", json!({"prompt": "x", "seed": 7, "max_tokens": 100, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})).await;
    assert_eq!(st, 200, "{v}");
    validate(&schema, v["choices"][0]["text"].as_str().unwrap());
    let (st, v) = s.post("/v1/completions", json!({"prompt": "x", "seed": 7, "max_tokens": 40, "structured_outputs": {"grammar": "start: \"yes\" | \"no\""}})).await;
    assert_eq!((st, v["choices"][0]["text"].as_str().map(|t| t == "yes" || t == "no")), (200, Some(true)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_that_fail_are_400s_naming_the_field() {
    let s = server(hash_rule(VOCAB)).await;
    let cases = [
        (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}}), "response_format.json_schema.schema", "JSON schema"),
        (json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "array", "uniqueItems": true}}}}), "response_format.json_schema.schema", "uniqueItems"),
        (json!({"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs.regex", "does not parse"),
        (json!({"structured_outputs": {"grammar": "root ::= \"a\""}}), "structured_outputs.grammar", "Lark"),
        (json!({"response_format": {"type": "xml"}}), "response_format.type", "xml"),
        (json!({"structured_outputs": {"json": {"$ref": "https://example.com/remote.json"}}}), "structured_outputs.json", "remote.json"),
    ];
    for (extra, field, says) in cases {
        let mut body = json!({"messages": user("x"), "max_tokens": 5});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (st, v) = s.post("/v1/chat/completions", body).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(field)), "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{v}");
    }
    // Tools and a forced choice decide the output's form: with response_format, a 400.
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": user("x"), "tools": weather_tools(), "tool_choice": "required", "response_format": {"type": "json_object"}})).await;
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("tool_choice")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_tool_choices_are_forced_and_streams_reassemble() {
    let s = server(hash_rule(VOCAB)).await;
    let tools = weather_tools();
    let params = tools[0]["function"]["parameters"].clone();
    for seed in 0..4 {
        // This fake model does not reason: thinking off (the Qwen3 template would expect a block).
        let body = json!({"messages": user("Weather in Paris?"), "tools": tools, "tool_choice": "required", "max_tokens": 400, "seed": seed, "temperature": 0.7, "chat_template_kwargs": {"enable_thinking": false}});
        let (st, v) = s.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200, "{v}");
        let ch = &v["choices"][0];
        assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
        assert!(ch["message"]["content"].is_null(), "{v}");
        let calls = ch["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty());
        for c in calls {
            assert!(c["id"].as_str().unwrap().starts_with("call_") && c["type"] == "function");
            let args = c["function"]["arguments"].as_str().unwrap();
            match c["function"]["name"].as_str().unwrap() {
                "get_weather" => validate(&params, args),
                "now" => assert_eq!(serde_json::from_str::<Value>(args).unwrap(), json!({}), "no parameters: empty arguments"),
                other => panic!("unknown tool {other}"),
            }
        }
        // The same request streamed: id and name once per call, then argument fragments that
        // reassemble to the same calls.
        let mut b = body.clone();
        b["stream"] = json!(true);
        let chunks = s.stream(b).await;
        let mut got: Vec<(String, String)> = Vec::new();
        let mut finish = None;
        for c in &chunks {
            let ch = &c["choices"][0];
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
            for tc in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap() as usize;
                if let Some(name) = tc["function"]["name"].as_str() {
                    assert_eq!(i, got.len(), "a new call's index comes next");
                    assert!(tc["id"].is_string());
                    got.push((name.to_string(), String::new()));
                } else {
                    assert!(tc.get("id").is_none(), "the id is sent once");
                }
                got[i].1.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        let whole: Vec<(String, String)> = calls.iter().map(|c| (c["function"]["name"].as_str().unwrap().to_string(), c["function"]["arguments"].as_str().unwrap().to_string())).collect();
        assert_eq!(got, whole);
        assert_eq!(finish.as_deref(), Some("tool_calls"));
    }
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": user("Time?"), "tools": tools, "tool_choice": {"type": "function", "function": {"name": "now"}}, "max_tokens": 100, "chat_template_kwargs": {"enable_thinking": false}})).await;
    assert_eq!(st, 200, "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "a named choice: exactly one call");
    assert_eq!(calls[0]["function"]["name"], "now");
    assert_eq!(serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap(), json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_calls_are_parsed_from_free_text_and_tool_results_render() {
    let tok = qwen3();
    let text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris </tool_call> Nord\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let s = server(script_rule(tok.encode(text, false).unwrap(), tok.eos_ids()[0])).await;
    let body = json!({"messages": user("Weather?"), "tools": weather_tools(), "max_tokens": 200, "temperature": 0});
    let (st, v) = s.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], "Checking.\n");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let calls: Vec<(&str, &str)> = m["tool_calls"].as_array().unwrap().iter().map(|c| (c["function"]["name"].as_str().unwrap(), c["function"]["arguments"].as_str().unwrap())).collect();
    assert_eq!(calls, vec![("get_weather", "{\"city\": \"Paris </tool_call> Nord\", \"unit\": \"c\"}"), ("now", "{}")]);
    // tool_choice none: the same text is content.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let (_, v) = s.post("/v1/chat/completions", none).await;
    assert_eq!((v["choices"][0]["message"]["content"].as_str(), v["choices"][0]["finish_reason"].as_str()), (Some(text), Some("stop")));
    // A conversation with the calls and their results renders (the template's tool turns).
    let convo = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}, {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}
    ]);
    let (st, v) = s.post("/tokenize", json!({"messages": convo, "tools": weather_tools()})).await;
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let prompt = tok.decode(&ids, false).unwrap();
    assert!(prompt.contains("<tool_response>\n{\"temp\": 21}\n</tool_response>") && prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    let (st, _) = s.post("/v1/chat/completions", json!({"messages": convo, "tools": weather_tools(), "max_tokens": 5})).await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_returned_apart_and_a_constraint_starts_after_it() {
    let s = server(thinking_rule()).await;
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let body = json!({"messages": user("Think, then JSON."), "max_tokens": 200, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": true}}});
    let (st, v) = s.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(m["reasoning_content"].as_str().is_some_and(|r| !r.is_empty() && !r.contains("think>")), "{v}");
    assert_eq!(m["reasoning"], m["reasoning_content"]);
    validate(&schema, m["content"].as_str().unwrap());
    // Streamed: reasoning deltas first, then content deltas that make the same JSON.
    let mut b = body.clone();
    b["stream"] = json!(true);
    let chunks = s.stream(b).await;
    let reasoning: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_string)).collect();
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(reasoning.trim_matches('\n'), m["reasoning_content"].as_str().unwrap());
    assert_eq!(content, m["content"].as_str().unwrap());
    // Thinking off through chat_template_kwargs: the prompt closes the block, no reasoning,
    // and the constraint applies from the first token.
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (st, v) = s.post("/v1/chat/completions", off).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["choices"][0]["message"].get("reasoning_content").is_none(), "{v}");
    validate(&schema, v["choices"][0]["message"]["content"].as_str().unwrap());
}

/// The official Python client against this server: `parse()` with a Pydantic model and a full
/// tool-calling loop (tests/openai_client.py). Needs the pinned `openai` and `pydantic` in
/// `$KERN_CUDA_VENV` (scripts/test.sh installs them); skipped without them unless
/// KERN_REQUIRE_TEST_DATA is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_parses_and_runs_a_tool_loop() {
    let py = std::env::var_os("KERN_CUDA_VENV").map(|v| PathBuf::from(v).join("bin/python")).filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from("python3"));
    let has = std::process::Command::new(&py).args(["-c", "import openai, pydantic"]).output().is_ok_and(|o| o.status.success());
    if !has {
        assert!(std::env::var_os("KERN_REQUIRE_TEST_DATA").is_none(), "{} cannot import openai and pydantic: scripts/test.sh installs them", py.display());
        eprintln!("SKIPPED: {} has no openai / pydantic (scripts/test.sh installs them)", py.display());
        return;
    }
    let s = server(hash_rule(VOCAB)).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let out = tokio::process::Command::new(&py).arg(&script).arg(format!("{}/v1", s.base)).arg("--no-thinking").output().await.unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "openai_client.py failed:\n{log}");
    eprintln!("{log}");
}
