//! The engine on the fake model (CPU): outputs equal to the model's reference under
//! preemption and concurrency, stop strings across token boundaries, UTF-8 split across
//! tokens, abort frees pages, a failing step fails the requests in flight, drain, logprobs,
//! host sampling and the queue limit.

use kern_engine::fake::{hash_rule, FakeModel, Rule};
use kern_engine::{Engine, EngineConfig, Event, FinishReason, Model, ModelInfo, Request, RequestHandle, Sampling, State, StopReason, SubmitError};
use kern_tokenizer::Tokenizer;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn qwen3() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let root = std::env::var_os("KERN_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"));
        let dir = root.join("qwen3-tokenizer");
        Arc::new(Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-test-data.sh)")))
    })
    .clone()
}

const VOCAB: usize = 151_936;

fn info(pages: usize, seqs: usize, tokens: usize) -> ModelInfo {
    ModelInfo { max_step_tokens: tokens, max_step_seqs: seqs, pages_per_seq: 64, page_tokens: 4, total_pages: pages, vocab: VOCAB, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None }
}

fn start(model: FakeModel, cfg: EngineConfig, tok: bool) -> Engine {
    let e = Engine::start(cfg, tok.then(qwen3), move || Ok(Box::new(model) as Box<dyn Model>));
    e.wait_ready().expect("ready");
    e
}

struct Collected {
    text: String,
    chunks: Vec<String>,
    tokens: Vec<u32>,
    logprobs: Vec<kern_engine::TokenLogprob>,
    end: Event,
}

fn collect(mut h: RequestHandle) -> Collected {
    let mut c = Collected { text: String::new(), chunks: vec![], tokens: vec![], logprobs: vec![], end: Event::Failed("no end".into()) };
    while let Some(e) = h.blocking_recv() {
        match e {
            Event::Output { text, tokens, logprobs, .. } => {
                c.text.push_str(&text);
                c.chunks.push(text);
                c.tokens.extend(tokens);
                c.logprobs.extend(logprobs);
            }
            end => {
                c.end = end;
                break;
            }
        }
    }
    c
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn metric(e: &Engine, name: &str) -> f64 {
    let text = e.metrics().render();
    text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(' ')).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[test]
fn many_concurrent_requests_with_preemption_get_exactly_the_reference_tokens() {
    // 40 pages of 4 tokens for 64 requests of up to 60 tokens: constant preemption.
    let rule = hash_rule(VOCAB);
    let e = start(FakeModel::new(info(40, 8, 32), rule.clone()), EngineConfig::default(), false);
    let reqs: Vec<(Vec<u32>, usize)> = (0..64u32).map(|i| ((0..(5 + i % 23)).map(|t| t * 131 + i).collect(), 8 + (i as usize * 7) % 30)).collect();
    let handles: Vec<_> = reqs.iter().map(|(p, n)| e.submit(Request { ignore_eos: true, ..Request::new(p.clone(), *n) }).unwrap()).collect();
    let threads: Vec<_> = handles.into_iter().map(|h| std::thread::spawn(move || collect(h))).collect();
    for ((p, n), t) in reqs.iter().zip(threads) {
        let c = t.join().unwrap();
        assert_eq!(c.tokens, FakeModel::reference(&rule, p, *n), "no token lost, duplicated or changed");
        assert_eq!(c.end, Event::Finished { reason: FinishReason::Length, stop_reason: None, prompt_tokens: p.len(), completion_tokens: *n, cached_tokens: 0 });
    }
    assert!(metric(&e, "kern:num_preemptions_total") > 0.0, "the pool was too small: preemption happened");
    wait_for("pages back", || metric(&e, "kern:kv_cache_used_pages") == 0.0);
    assert_eq!(metric(&e, "kern:num_requests_running"), 0.0);
    let gen: usize = reqs.iter().map(|r| r.1).sum();
    assert_eq!(metric(&e, "kern:generation_tokens_total"), gen as f64);
}

/// A rule that generates `script` after a prompt of `prompt_len` tokens, then repeats it.
fn script_rule(script: Vec<u32>, prompt_len: usize) -> Rule {
    Arc::new(move |ctx: &[u32]| script[(ctx.len() - prompt_len) % script.len()])
}

#[test]
fn stop_strings_split_across_tokens_are_matched_and_never_emitted() {
    let tok = qwen3();
    let text = "The answer is 42.\nDone, truly done.";
    let script = tok.encode(text, false).unwrap();
    let prompt = tok.encode("Q: what is it?", false).unwrap();
    // The stop string starts inside one token and ends inside another.
    let stop = "s 42.\nD";
    let e = start(FakeModel::new(info(64, 8, 64), script_rule(script.clone(), prompt.len())), EngineConfig::default(), true);
    let c = collect(e.submit(Request { stop: vec!["nomatch-xyz".into(), stop.into()], ..Request::new(prompt.clone(), 40) }).unwrap());
    assert_eq!(c.text, "The answer i");
    assert!(c.chunks.iter().all(|ch| !ch.contains('4')), "no part of the stop string streamed: {:?}", c.chunks);
    assert_eq!(c.end, Event::Finished { reason: FinishReason::Stop, stop_reason: Some(StopReason::Text(stop.into())), prompt_tokens: prompt.len(), completion_tokens: c.tokens.len(), cached_tokens: 0 });
    // include_stop_str keeps it; no stop → the whole script (max_tokens = its length).
    let c = collect(e.submit(Request { stop: vec![stop.into()], include_stop_str: true, ..Request::new(prompt.clone(), 40) }).unwrap());
    assert_eq!(c.text, "The answer is 42.\nD");
    let c = collect(e.submit(Request::new(prompt.clone(), script.len())).unwrap());
    assert_eq!(c.text, text);
    wait_for("pages back", || metric(&e, "kern:kv_cache_used_pages") == 0.0);
}

#[test]
fn utf8_split_across_tokens_streams_whole_characters_only() {
    let tok = qwen3();
    let text = "日本語のテキスト🙂👍🏽 ok ñ";
    let script = tok.encode(text, false).unwrap();
    assert!(script.len() > text.chars().count() / 2, "byte-level pieces");
    let prompt = vec![9707u32, 11];
    let e = start(FakeModel::new(info(64, 8, 64), script_rule(script.clone(), prompt.len())), EngineConfig::default(), true);
    let c = collect(e.submit(Request::new(prompt, script.len())).unwrap());
    assert_eq!(c.text, text);
    assert!(c.chunks.iter().all(|ch| !ch.contains('\u{FFFD}')), "{:?}", c.chunks);
    assert!(c.chunks.iter().any(|ch| ch.is_empty()), "some tokens held back half a character");
}

#[test]
fn end_of_sequence_and_stop_token_ids() {
    let eos = 151645u32;
    let prompt = vec![1u32, 2, 3];
    let script = vec![10u32, 11, eos, 12, 13, 14];
    let e = start(FakeModel::new(info(64, 8, 64), script_rule(script, 3)), EngineConfig { eos: vec![eos], ..Default::default() }, false);
    let c = collect(e.submit(Request::new(prompt.clone(), 10)).unwrap());
    assert_eq!(c.tokens, vec![10, 11, eos]);
    assert_eq!(c.end, Event::Finished { reason: FinishReason::Stop, stop_reason: None, prompt_tokens: 3, completion_tokens: 3, cached_tokens: 0 });
    let c = collect(e.submit(Request { ignore_eos: true, stop_token_ids: vec![13], ..Request::new(prompt.clone(), 10) }).unwrap());
    assert_eq!(c.tokens, vec![10, 11, eos, 12, 13]);
    assert_eq!(c.end, Event::Finished { reason: FinishReason::Stop, stop_reason: Some(StopReason::Token(13)), prompt_tokens: 3, completion_tokens: 5, cached_tokens: 0 });
}

#[test]
fn dropping_a_handle_aborts_the_request_and_frees_its_pages() {
    let mut m = FakeModel::new(info(64, 8, 64), hash_rule(VOCAB));
    m.step_delay = Duration::from_millis(5);
    let e = start(m, EngineConfig::default(), false);
    let mut h = e.submit(Request { ignore_eos: true, ..Request::new((0..30).collect(), 200) }).unwrap();
    let first = h.blocking_recv().unwrap();
    assert!(matches!(first, Event::Output { .. }));
    // The gauges are set after the step's events are sent: wait for the step's update (the
    // request runs 200 tokens at 5 ms a step, so its pages stay held meanwhile).
    wait_for("pages in use", || metric(&e, "kern:kv_cache_used_pages") > 0.0);
    drop(h);
    wait_for("the abort", || metric(&e, "kern:kv_cache_used_pages") == 0.0 && metric(&e, "kern:num_requests_running") == 0.0);
    assert!(e.metrics().render().contains("kern:request_success_total{finished_reason=\"abort\"} 1"));
}

#[test]
fn a_failing_step_fails_every_request_in_flight_and_stops_the_engine() {
    let mut m = FakeModel::new(info(64, 8, 64), hash_rule(VOCAB));
    m.fail_at_step = Some(3);
    m.step_delay = Duration::from_millis(5); // all three are queued before the fault
    let e = start(m, EngineConfig::default(), false);
    let hs: Vec<_> = (0..3).map(|i| e.submit(Request { ignore_eos: true, ..Request::new(vec![i + 1; 5], 50) }).unwrap()).collect();
    for h in hs {
        match collect(h).end {
            Event::Failed(msg) => assert!(msg.contains("layer3.attn"), "names the op: {msg}"),
            other => panic!("{other:?}"),
        }
    }
    wait_for("failed state", || e.state() == State::Failed);
    assert!(matches!(e.submit(Request::new(vec![1], 1)), Err(SubmitError::Failed(m)) if m.contains("layer3.attn")));
    e.join();
}

#[test]
fn drain_finishes_running_requests_then_stops() {
    let mut m = FakeModel::new(info(64, 8, 64), hash_rule(VOCAB));
    m.step_delay = Duration::from_millis(2);
    let e = start(m, EngineConfig::default(), false);
    let h = e.submit(Request { ignore_eos: true, ..Request::new(vec![5; 5], 20) }).unwrap();
    e.drain();
    assert!(matches!(e.submit(Request::new(vec![1], 1)), Err(SubmitError::Draining)));
    let c = collect(h);
    assert_eq!(c.tokens.len(), 20, "the running request finished");
    e.join();
    assert_eq!(e.state(), State::Stopped);
}

#[test]
fn logprobs_and_host_sampling() {
    let e = start(FakeModel::new(info(64, 8, 64), hash_rule(VOCAB)), EngineConfig::default(), false);
    let c = collect(e.submit(Request { logprobs: Some(3), ignore_eos: true, ..Request::new(vec![7; 9], 6) }).unwrap());
    assert_eq!(c.logprobs.len(), 6);
    for (lp, t) in c.logprobs.iter().zip(&c.tokens) {
        assert_eq!(lp.token, *t);
        assert_eq!(lp.top.len(), 3);
        assert_eq!(lp.top[0].0, *t, "the fake's chosen token is its argmax");
        assert!(lp.logprob <= 0.0 && (lp.logprob - lp.top[0].1).abs() < 1e-6);
    }
    let sampled = |seed| {
        let s = Sampling { temperature: 1.0, min_p: 0.01, seed: Some(seed), ..Default::default() };
        collect(e.submit(Request { sampling: s, ignore_eos: true, ..Request::new(vec![7; 9], 12) }).unwrap()).tokens
    };
    assert_eq!(sampled(1), sampled(1), "seeded host sampling is reproducible");
    assert_ne!(sampled(1), sampled(2));
}

#[test]
fn invalid_requests_name_the_field() {
    let e = start(FakeModel::new(info(64, 8, 64), hash_rule(VOCAB)), EngineConfig::default(), false);
    let field = |r: Request| match e.submit(r) {
        Err(SubmitError::Invalid { field, message }) => (field, message),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("accepted"),
    };
    let (f, m) = field(Request::new(vec![1; 300], 10));
    assert_eq!(f, "prompt");
    assert!(m.contains("256") && m.contains("300"), "{m}");
    let (f, m) = field(Request::new(vec![1; 200], 100));
    assert_eq!(f, "max_tokens");
    assert!(m.contains("at most 56"), "{m}");
    assert_eq!(field(Request { sampling: Sampling { top_p: 0.0, ..Default::default() }, ..Request::new(vec![1], 1) }).0, "top_p");
    assert_eq!(field(Request { sampling: Sampling { temperature: f32::NAN, ..Default::default() }, ..Request::new(vec![1], 1) }).0, "temperature");
    assert_eq!(field(Request::new(vec![VOCAB as u32], 1)).0, "prompt");
}

#[test]
fn a_full_queue_refuses_new_requests() {
    let mut m = FakeModel::new(info(64, 1, 64), hash_rule(VOCAB));
    m.step_delay = Duration::from_millis(20);
    let e = start(m, EngineConfig { max_queue: 2, ..Default::default() }, false);
    let mut held = vec![];
    let mut refused = 0;
    for _ in 0..5 {
        match e.submit(Request { ignore_eos: true, ..Request::new(vec![1; 4], 50) }) {
            Ok(h) => held.push(h),
            Err(SubmitError::QueueFull { .. }) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert!(refused >= 2, "one runs, two wait, the rest are refused ({refused})");
}

#[test]
fn a_shared_prefix_is_served_from_the_cache_with_identical_outputs() {
    let rule = hash_rule(VOCAB);
    let system: Vec<u32> = (0..200).map(|t| 3000 + t).collect();
    let ask = |e: &Engine, q: u32| {
        let p: Vec<u32> = system.iter().copied().chain([q, q + 1, q + 2]).collect();
        let c = collect(e.submit(Request { ignore_eos: true, ..Request::new(p.clone(), 10) }).unwrap());
        assert_eq!(c.tokens, FakeModel::reference(&rule, &p, 10));
        match c.end {
            Event::Finished { cached_tokens, .. } => cached_tokens,
            other => panic!("{other:?}"),
        }
    };
    let e = start(FakeModel::new(info(256, 8, 64), rule.clone()), EngineConfig::default(), false);
    assert_eq!(ask(&e, 1), 0, "cold");
    assert_eq!(ask(&e, 50), 200, "the 200-token system prompt (50 full pages) comes from the cache");
    assert_eq!(ask(&e, 1), 200, "and the same prompt again: all full pages (its last token is computed)");
    assert_eq!(metric(&e, "kern:prefix_cache_hits_total"), 400.0);
    assert_eq!(metric(&e, "kern:prefix_cache_queries_total"), 3.0 * 203.0);
    let off = start(FakeModel::new(info(256, 8, 64), rule.clone()), EngineConfig { prefix_cache: false, ..Default::default() }, false);
    assert_eq!(ask(&off, 1), 0);
    assert_eq!(ask(&off, 1), 0, "--no-prefix-cache");
}

#[test]
fn an_evicted_prefix_comes_back_from_host_memory() {
    let rule = hash_rule(VOCAB);
    // 40 GPU pages of 4 tokens; each prompt is 120 tokens (30 pages): a second prompt evicts
    // most of the first one's pages, which the host tier (64 pages × 32 B) keeps.
    let e = start(FakeModel::new(info(40, 8, 64), rule.clone()), EngineConfig { offload_bytes: 64 * 32, ..Default::default() }, false);
    let a: Vec<u32> = (0..120).map(|t| 7000 + t).collect();
    let b: Vec<u32> = (0..120).map(|t| 9000 + t).collect();
    let run = |p: &Vec<u32>| {
        let c = collect(e.submit(Request { ignore_eos: true, ..Request::new(p.clone(), 4) }).unwrap());
        assert_eq!(c.tokens, FakeModel::reference(&rule, p, 4), "exact tokens through the host tier");
        match c.end {
            Event::Finished { cached_tokens, .. } => cached_tokens,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(run(&a), 0);
    assert_eq!(run(&b), 0);
    assert_eq!(run(&a), 116, "29 full pages cached (the last page holds the last token)");
    assert!(metric(&e, "kern:external_prefix_cache_hits_total") > 0.0, "some came from the host");
    assert!(metric(&e, "kern:kv_offload_restored_pages_total") > 0.0);
    assert!(metric(&e, "kern:kv_offload_stored_pages_total") >= 60.0);
}

#[test]
fn a_model_with_a_per_sequence_state_computes_every_prompt_in_full() {
    let rule = hash_rule(VOCAB);
    let mut i = info(256, 8, 64);
    i.per_seq_state = true;
    let e = start(FakeModel::new(i, rule.clone()), EngineConfig::default(), false);
    let p: Vec<u32> = (0..100).map(|t| 400 + t).collect();
    for _ in 0..2 {
        let c = collect(e.submit(Request { ignore_eos: true, ..Request::new(p.clone(), 3) }).unwrap());
        assert!(matches!(c.end, Event::Finished { cached_tokens: 0, .. }), "no snapshot of the state at the prefix: no reuse");
    }
}

/// A model with a per-sequence state and snapshots (the fake's rolling hash of every token,
/// mixed into every output, checked at every row against an uncached run): shared prompts,
/// a conversation's next turn, preemption (a small pool) and concurrency. Outputs equal the
/// uncached reference token for token, with the prefix cache on or off, and prefixes are reused.
#[test]
fn a_model_with_snapshots_reuses_prefixes_with_identical_outputs() {
    let rule = hash_rule(VOCAB);
    let system: Vec<u32> = (0..61).map(|t| 3000 + t).collect();
    let prompts: Vec<Vec<u32>> = (0..24u32).map(|i| if i % 3 == 0 { system.clone() } else { system.iter().copied().chain((0..i % 7 + 1).map(|t| 5000 + t * 3 + i)).collect() }).collect();
    let run = |cfg: EngineConfig, pages: usize| {
        let e = start(FakeModel::new(info(pages, 4, 24), rule.clone()).with_seq_state(6), cfg, false);
        // One at first (so the cache has something), then all at once.
        let mut out = vec![collect(e.submit(Request { ignore_eos: true, ..Request::new(prompts[0].clone(), 9) }).unwrap())];
        let handles: Vec<_> = prompts[1..].iter().map(|p| e.submit(Request { ignore_eos: true, ..Request::new(p.clone(), 9) }).unwrap()).collect();
        out.extend(handles.into_iter().map(|h| std::thread::spawn(move || collect(h))).collect::<Vec<_>>().into_iter().map(|t| t.join().unwrap()));
        for (p, c) in prompts.iter().zip(&out) {
            assert!(matches!(c.end, Event::Finished { .. }), "{:?}", c.end);
            assert_eq!(c.tokens, FakeModel::reference_with_state(&rule, VOCAB, p, 9), "the uncached run's tokens");
        }
        let cached: usize = out.iter().map(|c| match c.end { Event::Finished { cached_tokens, .. } => cached_tokens, _ => 0 }).sum();
        (cached, e)
    };
    let (cached, e) = run(EngineConfig::default(), 256);
    assert!(cached >= 7 * 60, "the system prompt's 15 pages end in a snapshot: every repeat hits ({cached} tokens cached)");
    assert!(metric(&e, "kern:prefix_cache_snapshots_restored_total") >= 7.0);
    assert!(metric(&e, "kern:prefix_cache_snapshots_saved_total") >= 1.0);
    let (cached, _) = run(EngineConfig { prefix_cache: false, ..Default::default() }, 256);
    assert_eq!(cached, 0, "--no-prefix-cache");
    // A pool too small for all: preemption, recompute through the cache, evictions.
    let (_, e) = run(EngineConfig::default(), 22);
    assert!(metric(&e, "kern:num_preemptions_total") > 0.0, "the pool was too small: preemption happened");
    // A conversation's next turn finds the first turn's prompt.
    let e = start(FakeModel::new(info(256, 4, 64), rule.clone()).with_seq_state(6), EngineConfig::default(), false);
    let turn1: Vec<u32> = (0..50).map(|t| 700 + t).collect();
    let c1 = collect(e.submit(Request { ignore_eos: true, ..Request::new(turn1.clone(), 6) }).unwrap());
    let turn2: Vec<u32> = turn1.iter().chain(&c1.tokens).copied().chain([9, 9, 9]).collect();
    let c2 = collect(e.submit(Request { ignore_eos: true, ..Request::new(turn2.clone(), 6) }).unwrap());
    assert_eq!(c2.tokens, FakeModel::reference_with_state(&rule, VOCAB, &turn2, 6));
    assert!(matches!(c2.end, Event::Finished { cached_tokens: 48, .. }), "turn 1's snapshot at 48: {:?}", c2.end);
}

#[test]
fn speculative_decoding_and_offload_are_refused_clearly_for_a_per_sequence_state() {
    let seq_model = || FakeModel::new(info(64, 8, 64), hash_rule(VOCAB)).with_seq_state(4);
    let e = Engine::start(EngineConfig { spec: Some(kern_sched::SpecConfig::ngram(3)), ..Default::default() }, None, move || Ok(Box::new(seq_model()) as Box<dyn Model>));
    let err = e.wait_ready().unwrap_err().to_string();
    assert!(err.contains("per-sequence state") && err.contains("cannot be rolled back") && err.contains("--spec-ngram"), "{err}");
    let e = Engine::start(EngineConfig { offload_bytes: 1 << 20, ..Default::default() }, None, move || Ok(Box::new(seq_model()) as Box<dyn Model>));
    let err = e.wait_ready().unwrap_err().to_string();
    assert!(err.contains("per-sequence state") && err.contains("--offload-gib"), "{err}");
}

/// A draft program (the fake's second per-token store, paged like `draft_kv`) proposing for a
/// batch of requests, greedy and sampled, with preemption (a small pool) and the prefix cache
/// (shared prompts): the same tokens as without drafts, and the model as its own draft is never
/// rejected.
#[test]
fn a_draft_program_gives_the_same_tokens_and_a_perfect_draft_is_always_accepted() {
    let rule = hash_rule(VOCAB);
    let wrong: Rule = Arc::new(|ctx: &[u32]| ctx[ctx.len() / 2]);
    let prompts: Vec<Vec<u32>> = (0..10u32).map(|i| (0..(6 + (i % 3) * 9)).map(|t| (t * 37 + (i % 4) * 101) % 1000).collect()).collect();
    let run = |e: &Engine, temperature: f32| -> Vec<Vec<u32>> {
        let hs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| e.submit(Request { ignore_eos: true, sampling: Sampling { temperature, seed: Some(i as u64), ..Default::default() }, ..Request::new(p.clone(), 30) }).unwrap())
            .collect();
        hs.into_iter().map(|h| collect(h).tokens).collect()
    };
    // 30 pages of 4 tokens for 10 requests of up to 54 tokens: preemption.
    let plain = start(FakeModel::new(info(30, 8, 64), rule.clone()), EngineConfig::default(), false);
    let spec = Some(kern_sched::SpecConfig::program(0));
    for (draft, perfect) in [(rule.clone(), true), (wrong, false)] {
        let mut model = FakeModel::new(info(30, 8, 64), rule.clone()).with_draft(draft, 3);
        // Slow enough that every request is queued before the first few steps end (then they
        // all run at once and the small pool must preempt, whatever the machine's load).
        model.step_delay = Duration::from_millis(2);
        let e = start(model, EngineConfig { spec: spec.clone(), offload_bytes: 64 * 64, ..Default::default() }, false);
        assert_eq!(run(&e, 0.0), run(&plain, 0.0), "greedy, perfect draft {perfect}");
        let (drafted, accepted) = (metric(&e, "kern:spec_decode_num_draft_tokens_total"), metric(&e, "kern:spec_decode_num_accepted_tokens_total"));
        assert!(drafted > 100.0 && metric(&e, "kern:spec_decode_num_draft_steps_total") > 0.0, "drafts were proposed and verified ({drafted})");
        if perfect {
            assert_eq!(accepted, drafted, "the model as its own draft is right every time greedy ({accepted} of {drafted})");
        } else {
            assert!(accepted < drafted, "a wrong draft is rejected ({accepted} of {drafted})");
        }
        // Sampled: the greedy draft is a one-hot proposal; the output is still the target's.
        assert_eq!(run(&e, 0.8), run(&plain, 0.8), "sampled, perfect draft {perfect}");
        assert!(metric(&e, "kern:num_preemptions_total") > 0.0, "the pool is small enough to preempt");
    }
}

#[test]
fn a_draft_program_is_refused_clearly_when_the_model_has_none() {
    let e = Engine::start(EngineConfig { spec: Some(kern_sched::SpecConfig::program(0)), ..Default::default() }, None, move || Ok(Box::new(FakeModel::new(info(64, 8, 64), hash_rule(VOCAB))) as Box<dyn Model>));
    let err = e.wait_ready().unwrap_err().to_string();
    assert!(err.contains("declares none") && err.contains("kern pack --draft"), "{err}");
}

#[test]
fn speculative_decoding_gives_the_same_tokens_greedy_and_sampled() {
    // Copy the token 6 back unless a hash says otherwise: n-gram drafts are often right.
    let copy: Rule = Arc::new(|ctx: &[u32]| {
        let h = ctx.iter().fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(t as u64));
        if ctx.len() >= 6 && h % 8 != 0 { ctx[ctx.len() - 6] } else { (h % 1000) as u32 }
    });
    let spec = kern_sched::SpecConfig { k: 4, min_n: 1, max_n: 3, drafter: kern_sched::Drafter::Ngram };
    // 64 rows per step: room for every sequence's drafts.
    let plain = start(FakeModel::new(info(512, 64, 256), copy.clone()), EngineConfig::default(), false);
    let fast = start(FakeModel::new(info(512, 64, 256), copy.clone()), EngineConfig { spec: Some(spec), ..Default::default() }, false);
    let prompts: Vec<Vec<u32>> = (0..6u32).map(|i| (0..(8 + i * 5)).map(|t| (t * 37 + i * 101) % 1000).collect()).collect();
    for temperature in [0.0f32, 0.9] {
        let run = |e: &Engine| -> Vec<Vec<u32>> {
            let hs: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| e.submit(Request { ignore_eos: true, sampling: Sampling { temperature, seed: Some(i as u64), ..Default::default() }, ..Request::new(p.clone(), 40) }).unwrap())
                .collect();
            hs.into_iter().map(|h| collect(h).tokens).collect()
        };
        assert_eq!(run(&fast), run(&plain), "temperature {temperature}");
    }
    let accepted = metric(&fast, "kern:spec_decode_num_accepted_tokens_total");
    // A Python simulation of this rule and drafter accepts 33 of 119 greedy drafts.
    assert!(accepted >= 25.0, "drafts were accepted ({accepted})");
}
