//! The HTTP layer against the fake model, over real sockets: every endpoint, SSE framing, error
//! shapes, stop strings and UTF-8 split across tokens in streams, abort on disconnect,
//! preemption, 500 concurrent requests, drain and engine failure.

use kern_engine::fake::{hash_rule, FakeModel, Rule};
use kern_engine::{Engine, EngineConfig, Model, ModelInfo};
use kern_server::{AppState, Outcome, SamplingDefaults, ServerConfig};
use kern_tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn qwen3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let root = std::env::var_os("KERN_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"));
        Arc::new(Tokenizer::from_dir(&root.join("qwen3-tokenizer")).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-test-data.sh)")))
    })
    .clone()
}

const VOCAB: usize = 151_936;

struct Opts {
    pages: usize,
    seqs: usize,
    rule: Option<Rule>,
    delay_ms: u64,
    fail_at: Option<usize>,
    api_key: Option<String>,
    max_queue: usize,
    max_body: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Opts { pages: 4096, seqs: 64, rule: None, delay_ms: 0, fail_at: None, api_key: None, max_queue: 4096, max_body: kern_server::DEFAULT_MAX_BODY_BYTES }
    }
}

struct Server {
    base: String,
    engine: Engine,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<std::io::Result<Outcome>>,
}

async fn server(o: Opts) -> Server {
    let tok = qwen3();
    let info = ModelInfo { max_step_tokens: 256, max_step_seqs: o.seqs, pages_per_seq: 256, page_tokens: 4, total_pages: o.pages, vocab: VOCAB, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None };
    let rule = o.rule.unwrap_or_else(|| hash_rule(VOCAB));
    let (delay, fail) = (o.delay_ms, o.fail_at);
    let cfg = EngineConfig { eos: tok.eos_ids().to_vec(), max_queue: o.max_queue, ..Default::default() };
    let engine = Engine::start(cfg, Some(tok.clone()), move || {
        let mut m = FakeModel::new(info, rule);
        m.step_delay = Duration::from_millis(delay);
        m.fail_at_step = fail;
        Ok(Box::new(m) as Box<dyn Model>)
    });
    let template = tok.chat_template_renderer().expect("the Qwen3 tokenizer has a template").expect("compiles");
    let src = tok.chat_template().unwrap_or_default();
    let (tool_format, reasoning) = (kern_server::tools::detect(src).map(Arc::from), kern_server::reasoning::detect(src));
    let cfg = ServerConfig { served_model_names: vec!["fake".into(), "alias".into()], api_key: o.api_key, max_logprobs: 20, defaults: SamplingDefaults::default(), chat_template: Some(template), root: "fake".into(), max_body_bytes: o.max_body, tool_format, reasoning };
    let state = AppState::new(engine.clone(), Some(tok), cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(kern_server::serve(listener, state, async move {
        let _ = rx.await;
    }));
    let c = reqwest::Client::new();
    let t = Instant::now();
    while c.get(format!("{base}/health")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(t.elapsed() < Duration::from_secs(20), "server not ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Server { base, engine, stop: Some(tx), done }
}

impl Server {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = reqwest::Client::new().post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// A streamed request: the JSON of every `data:` event, and whether `[DONE]` came last.
    async fn stream(&self, path: &str, body: Value) -> (Vec<Value>, bool) {
        let r = reqwest::Client::new().post(format!("{}{path}", self.base)).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let text = r.text().await.unwrap();
        let mut events = vec![];
        let mut done = false;
        for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
            let data = block.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data event: {block:?}"));
            assert!(!done, "nothing after [DONE]");
            if data == "[DONE]" {
                done = true;
            } else {
                events.push(serde_json::from_str(data).unwrap());
            }
        }
        (events, done)
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.engine.metrics().render();
        text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} missing"))
    }

    async fn wait_pages_free(&self) {
        let t = Instant::now();
        while self.metric("kern:kv_cache_used_pages") != 0.0 || self.metric("kern:num_requests_running") != 0.0 {
            assert!(t.elapsed() < Duration::from_secs(10), "pages not freed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn shutdown(mut self) -> Outcome {
        let _ = self.stop.take().unwrap().send(());
        self.done.await.unwrap().unwrap()
    }
}

fn reference_text(prompt: &[u32], n: usize) -> String {
    qwen3().decode(&FakeModel::reference(&hash_rule(VOCAB), prompt, n), true).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endpoints_answer_in_openai_shapes() {
    let s = server(Opts::default()).await;
    let c = reqwest::Client::new();
    let v: Value = c.get(format!("{}/v1/models", s.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "fake");
    assert_eq!(v["data"][0]["max_model_len"], 1024);
    let v: Value = c.get(format!("{}/version", s.base)).send().await.unwrap().json().await.unwrap();
    assert!(v["version"].is_string());
    // Completions: token-id prompt, exact reference text, usage, finish reason.
    let prompt: Vec<u32> = (100..120).collect();
    let (st, v) = s.post("/v1/completions", json!({"model": "fake", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], reference_text(&prompt, 12));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"], json!({"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32, "prompt_tokens_details": {"cached_tokens": 0}}));
    let (_, t) = s.post("/v1/completions", json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "return_token_ids": true})).await;
    assert_eq!(t["choices"][0]["token_ids"], json!(FakeModel::reference(&hash_rule(VOCAB), &prompt, 12)));
    let (events, _) = s.stream("/v1/completions", json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "return_token_ids": true, "stream": true})).await;
    let streamed: Vec<u64> = events.iter().flat_map(|e| e["choices"][0]["token_ids"].as_array().cloned().unwrap_or_default()).map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(json!(streamed), t["choices"][0]["token_ids"], "every token id once, in order");
    // A list of prompts × n: index = prompt·n + sample; the alias name works.
    let (st, v) = s.post("/v1/completions", json!({"model": "alias", "prompt": ["Hello", "World"], "n": 2, "max_tokens": 3, "temperature": 0.8, "seed": 5})).await;
    assert_eq!(st, 200, "{v}");
    let idx: Vec<i64> = v["choices"].as_array().unwrap().iter().map(|c| c["index"].as_i64().unwrap()).collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    // Echo.
    let (_, v) = s.post("/v1/completions", json!({"prompt": "Hello there", "max_tokens": 2, "echo": true, "temperature": 0})).await;
    assert!(v["choices"][0]["text"].as_str().unwrap().starts_with("Hello there"));
    // Chat: the template renders, usage counts the rendered prompt.
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": msgs, "max_completion_tokens": 4, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let (_, t) = s.post("/tokenize", json!({"messages": msgs})).await;
    assert_eq!(v["usage"]["prompt_tokens"], t["count"]);
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    let (_, d) = s.post("/detokenize", json!({"tokens": ids})).await;
    assert!(d["prompt"].as_str().unwrap().contains("<|im_start|>user\nHi<|im_end|>"), "{d}");
    assert!(d["prompt"].as_str().unwrap().ends_with("<|im_start|>assistant\n"));
    let reply_ids = qwen3().encode(v["choices"][0]["message"]["content"].as_str().unwrap(), false).unwrap();
    assert!(reply_ids.len() <= 4);
    let (_, t) = s.post("/tokenize", json!({"prompt": "Hello world", "return_token_strs": true})).await;
    assert_eq!(t["count"], 2);
    assert_eq!(t["token_strs"], json!(["Hello", "Ġworld"]));
    // Logprobs in both shapes.
    let (_, v) = s.post("/v1/completions", json!({"prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 2, "temperature": 0})).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    let (_, v) = s.post("/v1/chat/completions", json!({"messages": msgs, "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "temperature": 0})).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert!(content[0]["bytes"].is_array());
    // Metrics in Prometheus text.
    let m = c.get(format!("{}/metrics", s.base)).send().await.unwrap().text().await.unwrap();
    for name in ["kern:num_requests_running", "kern:num_requests_waiting", "kern:kv_cache_usage_perc", "kern:prompt_tokens_total", "kern:generation_tokens_total", "kern:time_to_first_token_seconds_bucket", "kern:inter_token_latency_seconds_bucket", "kern:e2e_request_latency_seconds_count"] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
    assert_eq!(s.shutdown().await, Outcome::Drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_are_openai_shaped_and_name_the_field() {
    let s = server(Opts::default()).await;
    let err = |v: &Value| (v["error"]["param"].clone(), v["error"]["message"].as_str().unwrap_or_default().to_string(), v["error"]["code"].clone());
    let cases = [
        (json!({"prompt": "x", "temperature": -1}), "temperature"),
        (json!({"prompt": "x", "top_p": 0}), "top_p"),
        (json!({"prompt": "x", "max_tokens": "ten"}), "max_tokens"),
        (json!({"prompt": "x", "n": 0}), "n"),
        (json!({"prompt": "x", "presence_penalty": 0.5}), "presence_penalty"),
        (json!({"prompt": "x", "frobnicate": true}), "frobnicate"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": "x", "stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"prompt": "x", "logprobs": 21}), "logprobs"),
        (json!({"prompt": "x", "echo": true, "logprobs": 1}), "echo"),
        (json!({"prompt": [[1, 2], "x"]}), "prompt"),
        (json!({"prompt": [999999999]}), "prompt"),
        (json!({"prompt": "x", "stop": ["a", ""]}), "stop"),
    ];
    for (body, field) in cases {
        let (st, v) = s.post("/v1/completions", body.clone()).await;
        assert_eq!(st, 400, "{body} → {v}");
        assert_eq!(err(&v).0, field, "{body} → {v}");
        assert_eq!(err(&v).2, 400);
    }
    // Neutral values of unsupported fields are fine.
    let (st, v) = s.post("/v1/completions", json!({"prompt": "x", "max_tokens": 1, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "user": "u", "best_of": 1})).await;
    assert_eq!(st, 200, "{v}");
    // Context limits with the numbers.
    let (st, v) = s.post("/v1/completions", json!({"prompt": vec![1; 1100], "max_tokens": 1})).await;
    assert_eq!(st, 400);
    let (_, m, _) = err(&v);
    assert!(m.contains("1024") && m.contains("1100"), "{m}");
    let (st, v) = s.post("/v1/completions", json!({"prompt": vec![1; 1000], "max_tokens": 100})).await;
    assert_eq!((st, err(&v).0), (400, json!("max_tokens")), "{v}");
    // Chat-specific.
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": [{"role": "wizard", "content": "x"}]})).await;
    assert_eq!((st, err(&v).0), (400, json!("messages[0].role")));
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})).await;
    assert_eq!((st, err(&v).0), (400, json!("top_logprobs")));
    let (st, v) = s.post("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})).await;
    assert_eq!((st, err(&v).0), (400, json!("tools[0].function")));
    // Not JSON; unknown model; unknown route.
    let r = reqwest::Client::new().post(format!("{}/v1/completions", s.base)).body("{not json").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("not valid JSON"));
    let (st, v) = s.post("/v1/completions", json!({"model": "gpt-4", "prompt": "x"})).await;
    assert_eq!(st, 404);
    assert!(err(&v).1.contains("`gpt-4` does not exist"));
    let (st, _) = s.post("/v1/embeddings", json!({})).await;
    assert_eq!(st, 404);
    s.shutdown().await;
}

/// A body over the limit: 413, still OpenAI's error shape. The limit is small here so the whole
/// body is written before the server answers (a 64 MiB body races the server's early reply and
/// closed connection: the client then sees a broken pipe instead of the 413).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_limit_is_413() {
    let s = server(Opts { max_body: 1024, ..Default::default() }).await;
    let c = reqwest::Client::new();
    let r = c.post(format!("{}/v1/completions", s.base)).header("content-type", "application/json").body(vec![b' '; 1025]).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 413, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("up to 1024 bytes"), "{v}");
    // At the limit it is read (and refused only for what it says).
    let mut body = br#"{"prompt": "x", "max_tokens": 1}"#.to_vec();
    body.resize(1024, b' ');
    let r = c.post(format!("{}/v1/completions", s.base)).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap_or_default());
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_key_is_required_on_v1() {
    let s = server(Opts { api_key: Some("sekrit".into()), ..Default::default() }).await;
    let c = reqwest::Client::new();
    let r = c.post(format!("{}/v1/completions", s.base)).json(&json!({"prompt": "x", "max_tokens": 1})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 401);
    let r = c.post(format!("{}/v1/completions", s.base)).bearer_auth("wrong").json(&json!({"prompt": "x", "max_tokens": 1})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c.post(format!("{}/v1/completions", s.base)).bearer_auth("sekrit").json(&json!({"prompt": "x", "max_tokens": 1})).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(c.get(format!("{}/health", s.base)).send().await.unwrap().status().as_u16(), 200, "health needs no key");
    s.shutdown().await;
}

fn script_rule(script: Vec<u32>, prompt_len: usize) -> Rule {
    Arc::new(move |ctx: &[u32]| script[(ctx.len() - prompt_len) % script.len()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_hold_back_stop_strings_and_split_characters() {
    let tok = qwen3();
    let text = "Zürich 日本🙂 says: END_OF_IT now";
    let script = tok.encode(text, false).unwrap();
    let prompt = vec![40u32, 41, 42];
    let s = server(Opts { rule: Some(script_rule(script.clone(), prompt.len())), ..Default::default() }).await;
    let body = json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": true, "stop": ["D_OF"], "stream_options": {"include_usage": true}});
    let (events, done) = s.stream("/v1/completions", body).await;
    assert!(done, "[DONE] ends the stream");
    let pieces: Vec<&str> = events.iter().filter(|e| !e["choices"].as_array().unwrap().is_empty()).map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(pieces.concat(), "Zürich 日本🙂 says: EN");
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    let last_choice = events.iter().rev().find(|e| !e["choices"].as_array().unwrap().is_empty()).unwrap();
    assert_eq!(last_choice["choices"][0]["finish_reason"], "stop");
    assert_eq!(last_choice["choices"][0]["stop_reason"], "D_OF");
    let usage = events.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 3);
    assert!(events[..events.len() - 1].iter().all(|e| e.get("usage").is_none()), "usage only in the last chunk");
    // Chat stream: role first, then content, then finish; no usage without include_usage.
    let (events, done) = s.stream("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true})).await;
    assert!(done);
    assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert!(events.iter().all(|e| e.get("usage").is_none()));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_aborts_its_request() {
    let s = server(Opts { delay_ms: 5, ..Default::default() }).await;
    for stream in [true, false] {
        let body = json!({"prompt": [1, 2, 3], "max_tokens": 1000, "ignore_eos": true, "stream": stream});
        let url = format!("{}/v1/completions", s.base);
        let (hang_up, hang_up_rx) = tokio::sync::oneshot::channel::<()>();
        let req = tokio::spawn(async move {
            let mut r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
            if stream {
                // Read one chunk of the stream, then hang up when told.
                let _ = r.chunk().await;
            }
            let _ = hang_up_rx.await;
        });
        let t = Instant::now();
        while s.metric("kern:kv_cache_used_pages") == 0.0 {
            assert!(t.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if stream {
            let _ = hang_up.send(());
            req.await.unwrap();
        } else {
            // The non-streaming client's future is dropped mid-request.
            req.abort();
            drop(hang_up);
        }
        s.wait_pages_free().await;
    }
    let m = s.engine.metrics().render();
    assert!(m.contains("kern:request_success_total{finished_reason=\"abort\"} 2"), "{m}");
    assert!(s.metric("kern:generation_tokens_total") < 1000.0, "aborted long before max_tokens");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_hundred_concurrent_requests_lose_and_duplicate_nothing_even_under_preemption() {
    // 300 pages of 4 tokens for 500 requests of up to ~90 tokens: constant preemption.
    let s = server(Opts { pages: 300, seqs: 32, ..Default::default() }).await;
    let base = s.base.clone();
    let mut tasks = vec![];
    for i in 0..500u32 {
        let url = format!("{base}/v1/completions");
        tasks.push(tokio::spawn(async move {
            let prompt: Vec<u32> = (0..(3 + i % 40)).map(|t| 1000 + t * 7 + i).collect();
            let n = 10 + (i as usize % 37);
            let stream = i % 2 == 0;
            let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true, "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }});
            let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status().as_u16(), 200);
            let (text, completion) = if stream {
                let body = r.text().await.unwrap();
                let mut text = String::new();
                let mut usage = 0;
                for data in body.split("\n\n").filter_map(|b| b.strip_prefix("data: ")) {
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: Value = serde_json::from_str(data).unwrap();
                    if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
                        text.push_str(c["text"].as_str().unwrap());
                    }
                    if let Some(u) = v.get("usage") {
                        usage = u["completion_tokens"].as_u64().unwrap();
                    }
                }
                (text, usage)
            } else {
                let v: Value = r.json().await.unwrap();
                (v["choices"][0]["text"].as_str().unwrap().to_string(), v["usage"]["completion_tokens"].as_u64().unwrap())
            };
            assert_eq!(completion as usize, n, "request {i}");
            assert_eq!(text, reference_text(&prompt, n), "request {i}");
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(s.metric("kern:generation_tokens_total"), total as f64);
    assert!(s.metric("kern:num_preemptions_total") > 0.0, "the pool forced preemptions");
    s.wait_pages_free().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_503_with_retry_after() {
    let s = server(Opts { seqs: 1, delay_ms: 20, max_queue: 1, ..Default::default() }).await;
    let c = reqwest::Client::new();
    let mut codes = vec![];
    let mut held = vec![];
    for _ in 0..4 {
        let f = c.post(format!("{}/v1/completions", s.base)).json(&json!({"prompt": [1, 2], "max_tokens": 200, "ignore_eos": true, "stream": true})).send();
        let r = f.await.unwrap();
        codes.push(r.status().as_u16());
        if r.status().as_u16() == 503 {
            assert!(r.headers().contains_key("retry-after"));
            assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], 503);
        } else {
            held.push(r);
        }
    }
    assert!(codes.contains(&503), "{codes:?}");
    drop(held);
    s.wait_pages_free().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_drains_running_streams_and_refuses_new_requests() {
    let s = server(Opts { delay_ms: 3, ..Default::default() }).await;
    let url = format!("{}/v1/completions", s.base);
    let running = tokio::spawn(async move {
        let r = reqwest::Client::new().post(url).json(&json!({"prompt": [5, 6], "max_tokens": 60, "ignore_eos": true, "stream": true})).send().await.unwrap();
        r.text().await.unwrap()
    });
    while s.metric("kern:num_requests_running") == 0.0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let base = s.base.clone();
    let engine = s.engine.clone();
    let stop = tokio::spawn(s.shutdown());
    while engine.state() == kern_engine::State::Ready {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // New work is refused while the running stream finishes.
    if let Ok(r) = reqwest::Client::new().post(format!("{base}/v1/completions")).json(&json!({"prompt": [1], "max_tokens": 1})).send().await {
        assert_eq!(r.status().as_u16(), 503);
    }
    let body = running.await.unwrap();
    assert!(body.trim_end().ends_with("data: [DONE]"));
    assert!(body.contains("\"finish_reason\":\"length\""), "the running request finished");
    assert_eq!(stop.await.unwrap(), Outcome::Drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_engine_fault_fails_requests_with_500_naming_the_op() {
    let s = server(Opts { fail_at: Some(4), delay_ms: 2, ..Default::default() }).await;
    let (st, v) = s.post("/v1/completions", json!({"prompt": [1, 2], "max_tokens": 50, "ignore_eos": true})).await;
    assert_eq!(st, 500);
    assert!(v["error"]["message"].as_str().unwrap().contains("layer3.attn"), "{v}");
    let r = reqwest::Client::new().get(format!("{}/health", s.base)).send().await;
    if let Ok(r) = r {
        assert_eq!(r.status().as_u16(), 503);
    }
    match s.done.await.unwrap().unwrap() {
        Outcome::EngineFailed(m) => assert!(m.contains("layer3.attn")),
        other => panic!("{other:?}"),
    }
}
