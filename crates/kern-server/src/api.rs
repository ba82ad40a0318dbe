//! The handlers: request JSON → engine requests → OpenAI response JSON or SSE.

use crate::chat_out::{self, Shape};
use crate::error::ApiError;
use crate::protocol::{self, Common, Fields, Prompt};
use crate::structured::{self, Requested};
use crate::tools::{self, Choice as ToolChoice};
use kern_engine::constraint::Constraint;
use crate::{AppState, Shared};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request as HttpRequest, State as AxState};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use kern_engine::{Event, FinishReason, Request, RequestHandle, Sampling, State, StopReason, TokenLogprob};
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::Instant;

type ApiResult<T> = Result<T, ApiError>;

pub async fn auth(AxState(s): AxState<AppState>, headers: HeaderMap, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &s.0.cfg.api_key {
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route {uri}: kern serves /v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, /health, /version, /metrics"))
}

pub fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::internal("internal error in kern serve (a bug: please report it with the request)").into_response()
}

pub async fn health(AxState(s): AxState<AppState>) -> Response {
    if s.0.draining.load(Ordering::SeqCst) {
        return ApiError::unavailable("shutting down", 30).into_response();
    }
    match s.0.engine.state() {
        State::Ready => Json(json!({"status": "ok"})).into_response(),
        State::Loading => ApiError::unavailable("Loading model", 5).into_response(),
        State::Draining | State::Stopped => ApiError::unavailable("shutting down", 30).into_response(),
        State::Failed => ApiError::unavailable(format!("the engine has failed: {}", s.0.engine.failure().unwrap_or_default()), 30).into_response(),
    }
}

pub async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub async fn metrics(AxState(s): AxState<AppState>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.0.engine.metrics().render()).into_response()
}

fn max_model_len(s: &Shared) -> ApiResult<usize> {
    s.engine.info().map(|i| i.limits.max_context).ok_or_else(|| ApiError::unavailable("the model is still loading: retry shortly", 5))
}

pub async fn models(AxState(s): AxState<AppState>) -> Json<Value> {
    let s = &s.0;
    let len = s.engine.info().map(|i| i.limits.max_context);
    let data: Vec<Value> = s
        .cfg
        .served_model_names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": s.created, "owned_by": "kern", "root": s.cfg.root, "parent": null, "max_model_len": len, "permission": []}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn parse_body(s: &Shared, body: &Result<Bytes, BytesRejection>) -> ApiResult<Value> {
    let limit = s.cfg.max_body_bytes;
    let size = if limit.is_multiple_of(1 << 20) { format!("{} MiB", limit >> 20) } else { format!("{limit} bytes") };
    let body = body.as_ref().map_err(|e| ApiError { status: e.status(), message: format!("cannot read the request body: {e} (this server takes bodies up to {size})"), param: None, retry_after: None })?;
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn check_model(s: &Shared, model: &Option<String>) -> ApiResult<String> {
    let names = &s.cfg.served_model_names;
    match model {
        None => Ok(names[0].clone()),
        Some(m) if names.iter().any(|n| n == m) => Ok(m.clone()),
        Some(m) => Err(ApiError::not_found(format!("The model `{m}` does not exist (this server serves {})", names.join(", ")))),
    }
}

fn tokenizer<'a>(s: &'a Shared, field: &str) -> ApiResult<&'a kern_tokenizer::Tokenizer> {
    s.tok.as_deref().ok_or_else(|| ApiError::bad(field, format!("this model has no tokenizer.json, so `{field}` needs token ids, not text")))
}

fn encode(s: &Shared, field: &str, text: &str, add_special: bool) -> ApiResult<Vec<u32>> {
    tokenizer(s, field)?.encode(text, add_special).map_err(|e| ApiError::bad(field, format!("cannot tokenize `{field}`: {e}")))
}

fn id(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn lp(x: f32) -> f64 {
    if x.is_finite() {
        x as f64
    } else {
        -9999.0
    }
}

/// One choice's output as it accumulates.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: usize,
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<(FinishReason, Option<StopReason>)>,
    prompt_tokens: usize,
    cached_tokens: usize,
}

fn stop_reason(r: &Option<StopReason>) -> Value {
    match r {
        None => Value::Null,
        Some(StopReason::Text(s)) => Value::String(s.clone()),
        Some(StopReason::Token(t)) => json!(t),
    }
}

/// Engine requests of one HTTP request: prompt i, sample j → choice index i·n + j.
struct Job {
    handles: Vec<RequestHandle>,
    prompt_tokens: usize,
}

fn submit(s: &Shared, prompts: &[Vec<u32>], c: &Common, max_tokens: &dyn Fn(usize) -> usize, logprobs: Option<usize>, arrival: Instant, constraint: Option<Constraint>) -> ApiResult<Job> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down and takes no new requests", 30));
    }
    if !c.stop.is_empty() && s.tok.is_none() {
        return Err(ApiError::bad("stop", "stop strings need the model's tokenizer, and this model has none: use stop_token_ids"));
    }
    let mut handles = Vec::new();
    for p in prompts {
        for j in 0..c.n {
            let req = Request {
                prompt: p.clone(),
                sampling: Sampling { temperature: c.temperature, top_k: c.top_k, top_p: c.top_p, min_p: c.min_p, seed: c.seed.map(|x| x.wrapping_add(j as u64)) },
                max_tokens: max_tokens(p.len()),
                stop: c.stop.clone(),
                include_stop_str: c.include_stop_str,
                stop_token_ids: c.stop_token_ids.clone(),
                ignore_eos: c.ignore_eos,
                logprobs,
                skip_special_tokens: c.skip_special_tokens,
                return_logits: false,
                arrival,
                constraint: constraint.clone(),
            };
            // An error drops the handles submitted so far, which aborts them.
            handles.push(s.engine.submit(req)?);
        }
    }
    Ok(Job { handles, prompt_tokens: prompts.iter().map(Vec::len).sum() })
}

/// Compiles a request's grammar on the blocking pool (never on the async workers, never in the
/// engine loop); its problems are 400s naming the field it came from.
async fn compile(s: &Shared, r: Requested, (start_after, opens_with): (Vec<u32>, Option<u32>)) -> ApiResult<Constraint> {
    if s.engine.grammars().is_none() {
        return Err(ApiError::unavailable("the model is still loading: retry shortly", 5));
    }
    let engine = s.engine.clone();
    let g = r.grammar;
    let compiled = tokio::task::spawn_blocking(move || engine.compile(&g)).await.map_err(|e| ApiError::internal(format!("compiling the grammar: {e}")))?;
    let grammar = compiled.map_err(|e| ApiError::bad(r.field, e.to_string()))?;
    Ok(Constraint { grammar, start_after, opens_with })
}

async fn collect(mut h: RequestHandle) -> ApiResult<Choice> {
    let mut c = Choice::default();
    loop {
        match h.recv().await {
            Some(Event::Output { text, tokens, logprobs, .. }) => {
                c.text.push_str(&text);
                c.tokens += tokens.len();
                c.ids.extend(&tokens);
                c.logprobs.extend(logprobs);
            }
            Some(Event::Finished { reason, stop_reason, prompt_tokens, completion_tokens, cached_tokens }) => {
                c.finish = Some((reason, stop_reason));
                c.prompt_tokens = prompt_tokens;
                c.cached_tokens = cached_tokens;
                debug_assert_eq!(c.tokens, completion_tokens);
                return Ok(c);
            }
            Some(Event::Failed(e)) => return Err(ApiError::internal(e)),
            None => return Err(ApiError::internal("the engine stopped before the request finished")),
        }
    }
}

/// OpenAI's usage object; `cached` prompt tokens came from the prefix cache.
fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Which response format a choice's logprobs take.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Completions,
    Chat,
}

fn token_str(s: &Shared, t: u32) -> String {
    s.tok.as_ref().and_then(|k| k.decode(&[t], false).ok()).unwrap_or_else(|| format!("token_id:{t}"))
}

/// Logprobs in the completions shape (`offset` is the text offset of the first token).
fn completion_logprobs(s: &Shared, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = vec![];
    let mut token_logprobs = vec![];
    let mut top = vec![];
    let mut offsets = vec![];
    for l in lps {
        let t = token_str(s, l.token);
        offsets.push(offset);
        offset += t.len();
        tokens.push(t);
        token_logprobs.push(lp(l.logprob));
        let mut m = Map::new();
        for (id, x) in &l.top {
            m.insert(token_str(s, *id), json!(lp(*x)));
        }
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

fn chat_logprobs(s: &Shared, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, x: f32| {
        let t = token_str(s, id);
        json!({"token": t, "logprob": lp(x), "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = Value::Array(l.top.iter().map(|(id, x)| entry(*id, *x)).collect());
            e
        })
        .collect();
    json!({"content": content})
}

/// The streamed response: each choice's events as chunks, then usage (if asked) and `[DONE]`.
/// The stream owns the handles: a client that goes away drops it, and the requests abort.
#[allow(clippy::too_many_arguments)]
fn sse(state: AppState, job: Job, api: Api, rid: String, model: String, created: u64, c: &Common, echo: Vec<String>, logprobs: bool, token_ids: bool, shape: Option<Shape>) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let (include_usage, continuous) = (c.include_usage, c.continuous_usage);
    let n_choices = job.handles.len();
    let prompt_tokens = job.prompt_tokens;
    let per: Vec<_> = job
        .handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| Box::pin(stream::unfold(Some(h), move |h| async move {
            let mut h = h?;
            let e = h.recv().await;
            let next = if matches!(e, Some(Event::Output { .. })) { Some(h) } else { None };
            Some(((i, e), next))
        })))
        .collect();
    let s = async_stream::stream! {
        let sh = &state.0;
        let object = if api == Api::Chat { "chat.completion.chunk" } else { "text_completion" };
        let chunk = |choice: Value, usage_v: Option<Value>| {
            let mut j = json!({"id": rid, "object": object, "created": created, "model": model, "choices": [choice]});
            if let Some(u) = usage_v { j["usage"] = u; }
            SseEvent::default().data(j.to_string())
        };
        let mut completion = vec![0usize; n_choices];
        let mut cached = 0usize;
        let mut offsets = vec![0usize; n_choices];
        for (i, e) in echo.iter().enumerate() {
            if !e.is_empty() {
                offsets[i] = e.len();
                yield Ok(chunk(json!({"index": i, "text": e, "logprobs": null, "finish_reason": null}), None));
            }
        }
        if api == Api::Chat {
            for i in 0..n_choices {
                yield Ok(chunk(json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}), None));
            }
        }
        // Chat outputs with reasoning or tool calls are taken apart as they stream.
        let mut shapers: Vec<Option<chat_out::Stream>> = (0..n_choices).map(|_| shape.as_ref().filter(|sh| !sh.plain()).map(chat_out::Stream::new)).collect();
        let mut merged = stream::select_all(per);
        while let Some((i, e)) = merged.next().await {
            let cont = |done: &[usize], cached: usize| continuous.then(|| usage(prompt_tokens, done.iter().sum(), cached));
            match e {
                Some(Event::Output { text, tokens, logprobs: lps, .. }) => {
                    completion[i] += tokens.len();
                    let carries = !text.is_empty() || (logprobs && !lps.is_empty()) || (token_ids && !tokens.is_empty());
                    if !carries {
                        continue;
                    }
                    let lpv = if !logprobs { Value::Null } else if api == Api::Chat { chat_logprobs(sh, &lps) } else { completion_logprobs(sh, &lps, offsets[i]) };
                    offsets[i] += text.len();
                    if let Some(st) = shapers[i].as_mut() {
                        let mut deltas = st.push(&text);
                        if deltas.is_empty() && (lpv != Value::Null || token_ids) {
                            deltas.push(json!({"content": ""}));
                        }
                        let (mut lpv, mut tids) = (Some(lpv), token_ids.then(|| json!(tokens)));
                        for d in deltas {
                            let mut choice = json!({"index": i, "delta": d, "logprobs": lpv.take().unwrap_or(Value::Null), "finish_reason": null});
                            if let Some(t) = tids.take() {
                                choice["token_ids"] = t;
                            }
                            yield Ok(chunk(choice, cont(&completion, cached)));
                        }
                        continue;
                    }
                    let mut choice = if api == Api::Chat {
                        json!({"index": i, "delta": {"content": text}, "logprobs": lpv, "finish_reason": null})
                    } else {
                        json!({"index": i, "text": text, "logprobs": lpv, "finish_reason": null})
                    };
                    if token_ids {
                        choice["token_ids"] = json!(tokens);
                    }
                    yield Ok(chunk(choice, cont(&completion, cached)));
                }
                Some(Event::Finished { reason, stop_reason: sr, cached_tokens, .. }) => {
                    cached += cached_tokens;
                    let mut finish = reason.as_str();
                    if let Some(st) = shapers[i].as_mut() {
                        for d in st.finish() {
                            yield Ok(chunk(json!({"index": i, "delta": d, "logprobs": null, "finish_reason": null}), None));
                        }
                        finish = st.finish_reason(reason);
                    }
                    let choice = if api == Api::Chat {
                        json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish, "stop_reason": stop_reason(&sr)})
                    } else {
                        json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason.as_str(), "stop_reason": stop_reason(&sr)})
                    };
                    yield Ok(chunk(choice, cont(&completion, cached)));
                }
                Some(Event::Failed(msg)) => {
                    yield Ok(SseEvent::default().data(ApiError::internal(msg).body().to_string()));
                    yield Ok(SseEvent::default().data("[DONE]"));
                    return;
                }
                None => {
                    yield Ok(SseEvent::default().data(ApiError::internal("the engine stopped before the request finished").body().to_string()));
                    yield Ok(SseEvent::default().data("[DONE]"));
                    return;
                }
            }
        }
        if include_usage {
            let j = json!({"id": rid, "object": object, "created": created, "model": model, "choices": [], "usage": usage(prompt_tokens, completion.iter().sum(), cached)});
            yield Ok(SseEvent::default().data(j.to_string()));
        }
        yield Ok(SseEvent::default().data("[DONE]"));
    };
    Sse::new(s).keep_alive(KeepAlive::default())
}

pub async fn completions(AxState(state): AxState<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let arrival = Instant::now();
    let s = &state.0;
    let v = parse_body(s, &body)?;
    let mut f = Fields::new(&v)?;
    let c = protocol::common(&mut f, &s.cfg.defaults)?;
    let prompts = protocol::prompts(f.get("prompt"))?;
    let max_tokens = f.int_in("max_tokens", 0, i32::MAX as i64)?.unwrap_or(16) as usize;
    let echo = f.bool("echo", false)?;
    let logprobs = f.int_in("logprobs", 0, s.cfg.max_logprobs as i64)?.map(|x| x as usize);
    let add_special = f.bool("add_special_tokens", true)?;
    let requested = structured::parse(f.get("response_format"), f.get("structured_outputs"))?;
    f.neutral("suffix", protocol::is_empty, "no suffix / fill-in-the-middle")?;
    f.neutral("return_tokens_as_token_ids", |v| v == &Value::Bool(false), "tokens are returned as text")?;
    let token_ids = f.bool("return_token_ids", false)?;
    f.finish()?;
    let model = check_model(s, &c.model)?;
    if echo && logprobs.is_some() {
        return Err(ApiError::bad("echo", "`echo` with `logprobs` asks for prompt logprobs, which kern does not compute: drop one of them"));
    }
    if max_tokens == 0 && !echo {
        return Err(ApiError::bad("max_tokens", "`max_tokens` must be at least 1 (0 is allowed only with `echo`)"));
    }
    let mut ids = Vec::new();
    let mut echo_text = Vec::new();
    for p in &prompts {
        let (t, e) = match p {
            Prompt::Text(t) => (encode(s, "prompt", t, add_special)?, t.clone()),
            Prompt::Ids(i) => (i.clone(), if echo { s.tok.as_ref().and_then(|k| k.decode(i, false).ok()).unwrap_or_default() } else { String::new() }),
        };
        ids.push(t);
        for _ in 0..c.n {
            echo_text.push(if echo { e.clone() } else { String::new() });
        }
    }
    let rid = id("cmpl");
    if max_tokens == 0 {
        // echo only: the prompts back, nothing generated.
        let choices: Vec<Value> = echo_text.iter().enumerate().map(|(i, t)| json!({"index": i, "text": t, "logprobs": null, "finish_reason": "length", "stop_reason": null})).collect();
        let pt: usize = ids.iter().map(Vec::len).sum();
        return Ok(Json(json!({"id": rid, "object": "text_completion", "created": s.created, "model": model, "choices": choices, "usage": usage(pt, 0, 0)})).into_response());
    }
    let constraint = match requested {
        Some(r) => Some(compile(s, r, (vec![], None)).await?),
        None => None,
    };
    let job = submit(s, &ids, &c, &|_| max_tokens, logprobs, arrival, constraint)?;
    let created = unix_now();
    if c.stream {
        return Ok(sse(state.clone(), job, Api::Completions, rid, model, created, &c, echo_text, logprobs.is_some(), token_ids, None).into_response());
    }
    let (choices, usage) = finish_job(job, token_ids, |i, ch, reason, sr| {
        let text = format!("{}{}", echo_text[i], ch.text);
        let lpv = if logprobs.is_some() { completion_logprobs(s, &ch.logprobs, 0) } else { Value::Null };
        json!({"index": i, "text": text, "logprobs": lpv, "finish_reason": reason.as_str(), "stop_reason": sr})
    })
    .await?;
    Ok(Json(json!({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices, "usage": usage})).into_response())
}

/// Waits for every choice of a job that is not streamed and writes each with `shape(index,
/// choice, finish reason, stop reason)`; the choices and the usage object.
async fn finish_job(job: Job, token_ids: bool, shape: impl Fn(usize, &Choice, FinishReason, Value) -> Value) -> ApiResult<(Vec<Value>, Value)> {
    let prompt_tokens = job.prompt_tokens;
    let results = futures_util::future::join_all(job.handles.into_iter().map(collect)).await;
    let mut choices = Vec::new();
    let (mut completion, mut cached) = (0, 0);
    for (i, r) in results.into_iter().enumerate() {
        let ch = r?;
        completion += ch.tokens;
        cached += ch.cached_tokens;
        let (reason, sr) = ch.finish.clone().unwrap_or((FinishReason::Abort, None));
        let mut choice = shape(i, &ch, reason, stop_reason(&sr));
        if token_ids {
            choice["token_ids"] = json!(ch.ids);
        }
        choices.push(choice);
    }
    Ok((choices, usage(prompt_tokens, completion, cached)))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Checks `messages` enough to give a 400 naming the message at fault.
fn check_messages(v: Option<&Value>) -> ApiResult<Value> {
    let Some(Value::Array(msgs)) = v else {
        return Err(ApiError::bad("messages", "`messages` is required: a list of {role, content} objects"));
    };
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "`messages` is empty"));
    }
    for (i, m) in msgs.iter().enumerate() {
        let p = format!("messages[{i}]");
        let Some(o) = m.as_object() else { return Err(ApiError::bad(p.clone(), format!("`{p}` must be an object with `role` and `content`"))) };
        match o.get("role").and_then(Value::as_str) {
            Some("system" | "user" | "assistant" | "tool" | "developer") => {}
            Some(r) => return Err(ApiError::bad(format!("{p}.role"), format!("`{p}.role` is `{r}`: use system, developer, user, assistant or tool"))),
            None => return Err(ApiError::bad(format!("{p}.role"), format!("`{p}.role` is required"))),
        }
        match o.get("content") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    if part.get("type").and_then(Value::as_str) != Some("text") || !part.get("text").is_some_and(Value::is_string) {
                        return Err(ApiError::bad(format!("{p}.content[{j}]"), format!("`{p}.content[{j}]`: kern takes text parts only (`{{\"type\": \"text\", \"text\": …}}`)")));
                    }
                }
            }
            Some(_) => return Err(ApiError::bad(format!("{p}.content"), format!("`{p}.content` must be a string or a list of text parts"))),
        }
    }
    // A message without `content` (an assistant turn that only calls tools, as clients send
    // it with None fields dropped) gets a null one: templates concatenate `content`, and the
    // renderer gives text templates "" for null.
    let msgs = msgs
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(o) = m.as_object_mut() {
                o.entry("content").or_insert(Value::Null);
            }
            m
        })
        .collect();
    Ok(Value::Array(msgs))
}

fn render_chat(s: &Shared, messages: &Value, tools: Option<&Value>, add_generation_prompt: bool, kwargs: Option<&Map<String, Value>>) -> ApiResult<String> {
    let t = s.cfg.chat_template.as_ref().ok_or_else(|| ApiError::bad("messages", "this model has no chat template (no `chat_template` in tokenizer_config.json): start `kern serve` with --chat-template FILE, or use /v1/completions"))?;
    t.render(messages, tools, add_generation_prompt, kwargs).map_err(|e| ApiError::bad("messages", format!("the chat template refused the conversation: {e}")))
}

pub async fn chat(AxState(state): AxState<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Response> {
    let arrival = Instant::now();
    let s = &state.0;
    let v = parse_body(s, &body)?;
    let mut f = Fields::new(&v)?;
    let c = protocol::common(&mut f, &s.cfg.defaults)?;
    let messages = check_messages(f.get("messages"))?;
    let max_completion = f.int_in("max_completion_tokens", 1, i32::MAX as i64)?;
    let max_tokens_field = f.int_in("max_tokens", 1, i32::MAX as i64)?;
    let want_logprobs = f.bool("logprobs", false)?;
    let top = f.int_in("top_logprobs", 0, s.cfg.max_logprobs as i64)?;
    if top.is_some_and(|t| t > 0) && !want_logprobs {
        return Err(ApiError::bad("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    let add_generation_prompt = f.bool("add_generation_prompt", true)?;
    f.neutral("continue_final_message", |v| v == &Value::Bool(false), "the final message is never continued")?;
    let add_special = f.bool("add_special_tokens", false)?;
    let kwargs = match f.get("chat_template_kwargs") {
        None => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => return Err(ApiError::bad("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    };
    let tool_req = tools::parse_request(f.get("tools"), f.get("tool_choice"), f.get("parallel_tool_calls"))?;
    f.neutral("functions", protocol::is_empty, "the legacy `functions` field: use `tools`")?;
    f.neutral("function_call", |_| false, "the legacy `function_call` field: use `tool_choice`")?;
    let requested = structured::parse(f.get("response_format"), f.get("structured_outputs"))?;
    f.neutral("echo", |v| v == &Value::Bool(false), "chat does not echo")?;
    let token_ids = f.bool("return_token_ids", false)?;
    f.finish()?;
    let model = check_model(s, &c.model)?;
    // Tool calls are parsed in the model's own format; without one, tools cannot be served.
    let tool_format = match &tool_req {
        Some(t) if t.choice != ToolChoice::None => Some(s.cfg.tool_format.clone().ok_or_else(|| ApiError::bad("tools", "this model's chat template writes no tool-call format kern can parse: start `kern serve` with --tool-call-parser hermes if the model writes <tool_call> JSON, or send tool_choice: none"))?),
        _ => None,
    };
    let text = render_chat(s, &messages, tool_req.as_ref().map(|t| &t.raw), add_generation_prompt, kwargs)?;
    let ids = encode(s, "messages", &text, add_special)?;
    // A reasoning block: open in the prompt, closed by it (thinking off), or to be opened by
    // the model; a constraint starts after it.
    let reasoning = s.cfg.reasoning.then(|| crate::reasoning::open_in_prompt(&text));
    let gate = match reasoning {
        Some(open) if !crate::reasoning::closed_in_prompt(&text) => {
            let close = encode(s, "messages", crate::reasoning::CLOSE, false)?;
            // A model that may open the block itself: its first token is `<think>` or already
            // the grammar's (a model that skips reasoning is constrained at once).
            let opens = encode(s, "messages", crate::reasoning::OPEN, false)?;
            (close, if open { None } else { <[u32; 1]>::try_from(opens.as_slice()).ok().map(|[t]| t) })
        }
        _ => (vec![], None),
    };
    let forced = match (&tool_req, &tool_format) {
        (Some(t), Some(fmt)) if matches!(t.choice, ToolChoice::Required | ToolChoice::Named(_)) => {
            if requested.is_some() {
                return Err(ApiError::bad("tool_choice", "`tool_choice` required or a named function decides the output's form: drop `response_format` / `structured_outputs`, or use tool_choice auto"));
            }
            let chosen: Vec<tools::Tool> = match &t.choice {
                ToolChoice::Named(n) => t.tools.iter().filter(|x| &x.name == n).cloned().collect(),
                _ => t.tools.clone(),
            };
            let parallel = t.parallel && t.choice == ToolChoice::Required;
            Some(Requested { grammar: kern_engine::constraint::Grammar::Lark(fmt.grammar(&chosen, parallel)), field: "tools".into() })
        }
        _ => requested,
    };
    let constraint = match forced {
        Some(r) => Some(compile(s, r, gate).await?),
        None => None,
    };
    let shape = Shape { reasoning, tools: tool_format };
    let limit = max_model_len(s)?;
    let asked = max_completion.or(max_tokens_field).map(|x| x as usize);
    let logprobs = want_logprobs.then(|| top.unwrap_or(0) as usize);
    let job = submit(s, std::slice::from_ref(&ids), &c, &|p| asked.unwrap_or(limit.saturating_sub(p).max(1)), logprobs, arrival, constraint)?;
    let rid = id("chatcmpl");
    let created = unix_now();
    if c.stream {
        return Ok(sse(state.clone(), job, Api::Chat, rid, model, created, &c, vec![], logprobs.is_some(), token_ids, Some(shape)).into_response());
    }
    let (choices, usage) = finish_job(job, token_ids, |i, ch, reason, sr| {
        let lpv = if logprobs.is_some() { chat_logprobs(s, &ch.logprobs) } else { Value::Null };
        let (message, finish) = chat_out::message(&shape, &ch.text, reason);
        json!({"index": i, "message": message, "logprobs": lpv, "finish_reason": finish, "stop_reason": sr})
    })
    .await?;
    Ok(Json(json!({"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices, "usage": usage})).into_response())
}

pub async fn tokenize(AxState(state): AxState<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let s = &state.0;
    let v = parse_body(s, &body)?;
    let mut f = Fields::new(&v)?;
    let model = f.string("model")?.map(str::to_string);
    check_model(s, &model)?;
    let return_strs = f.bool("return_token_strs", false)?;
    let ids = if f.has("messages") {
        let messages = check_messages(f.get("messages"))?;
        let agp = f.bool("add_generation_prompt", true)?;
        let add_special = f.bool("add_special_tokens", false)?;
        let kwargs = match f.get("chat_template_kwargs") {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(_) => return Err(ApiError::bad("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
        };
        let tools = f.get("tools").filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        f.finish()?;
        let text = render_chat(s, &messages, tools, agp, kwargs)?;
        encode(s, "messages", &text, add_special)?
    } else {
        let prompt = f.string("prompt")?.ok_or_else(|| ApiError::bad("prompt", "give `prompt` (text) or `messages`"))?;
        let add_special = f.bool("add_special_tokens", true)?;
        f.finish()?;
        encode(s, "prompt", prompt, add_special)?
    };
    let mut out = json!({"count": ids.len(), "max_model_len": max_model_len(s)?, "tokens": ids});
    if return_strs {
        out["token_strs"] = json!(ids.iter().map(|&t| s.tok.as_ref().and_then(|k| k.token(t)).unwrap_or_default()).collect::<Vec<_>>());
    }
    Ok(Json(out))
}

pub async fn detokenize(AxState(state): AxState<AppState>, body: Result<Bytes, BytesRejection>) -> ApiResult<Json<Value>> {
    let s = &state.0;
    let v = parse_body(s, &body)?;
    let mut f = Fields::new(&v)?;
    let model = f.string("model")?.map(str::to_string);
    check_model(s, &model)?;
    let tokens: Vec<u32> = match f.get("tokens") {
        Some(Value::Array(a)) => a.iter().map(|x| x.as_u64().filter(|&u| u <= u32::MAX as u64).map(|u| u as u32).ok_or_else(|| ApiError::bad("tokens", "`tokens` must be a list of token ids"))).collect::<Result<_, _>>()?,
        _ => return Err(ApiError::bad("tokens", "`tokens` is required: a list of token ids")),
    };
    f.finish()?;
    let tok = tokenizer(s, "tokens")?;
    let vocab = s.engine.info().map_or(tok.vocab_size(), |i| i.model.vocab.max(tok.vocab_size()));
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad("tokens", format!("token id {t} is outside the vocabulary (0..{vocab})")));
    }
    let text = tok.decode(&tokens, false).map_err(|e| ApiError::bad("tokens", e.to_string()))?;
    Ok(Json(json!({"prompt": text})))
}
