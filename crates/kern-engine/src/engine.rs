//! The engine: a request queue and the step loop on its own thread.
//!
//! [`Engine::start`] spawns the loop thread, which constructs the model there (a CUDA context
//! belongs to the thread that made it) and then runs, step after step:
//!
//! 1. take commands (new requests, aborts, drain) — blocking only when there is no work;
//! 2. `kern-sched` picks the step (decode tokens, prefill chunks, preemption);
//! 3. the model runs it (`Model::step`: step inputs up, program, `sampled` and, when a request
//!    asked for logprobs or host sampling, `logits` back);
//! 4. the scheduler commits the tokens; each request's text is detokenized incrementally, stop
//!    strings are matched, and its new text / tokens / logprobs go into its channel; finished
//!    requests get their last event and free their pages.
//!
//! Clients hold a [`RequestHandle`]; dropping it before the request finished aborts it (a
//! client that disconnects frees its pages at once). A failing step fails every request in
//! flight with the model's message and stops the engine: a GPU fault is sticky.

use crate::metrics::Metrics;
use crate::model::{Model, ModelError, ModelInfo};
use crate::output::TextState;
use crate::request::{Event, FinishReason, Request, RequestId, StopReason, TokenLogprob};
use crate::sample;
use kern_sched::{AddError, BlockManager, Finish, Limits, SamplingParams, Scheduler, SchedulerConfig, SeqId};
use kern_tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc as tmpsc, watch};

/// How the engine schedules.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most sequences running at once (default and cap: the model's `seqs` max).
    pub max_seqs: Option<usize>,
    /// Most new tokens per step (default and cap: the model's `tokens` max).
    pub max_batched_tokens: Option<usize>,
    /// Most requests waiting for admission before new ones are refused.
    pub max_queue: usize,
    /// The model's end-of-sequence ids.
    pub eos: Vec<u32>,
    /// Reuse the KV pages of prompt prefixes computed before (automatic prefix caching).
    pub prefix_cache: bool,
    /// Host memory for the prefix cache's host tier, bytes (0: none).
    pub offload_bytes: u64,
    /// Speculative decoding (None: off): prompt-lookup drafts, or the model's draft program
    /// (`SpecConfig::program(k)`; k = 0 takes the manifest's `speculative.k`).
    pub spec: Option<kern_sched::SpecConfig>,
    /// Keep a record of every step (`Engine::step_records`) and measure the copy bandwidth at
    /// start (`EngineInfo::copy_gbs`): for benchmarks.
    pub record_steps: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_seqs: None, max_batched_tokens: None, max_queue: 4096, eos: vec![], prefix_cache: true, offload_bytes: 0, spec: None, record_steps: false }
    }
}

/// Where the engine is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Loading,
    Ready,
    /// Refusing new requests, finishing the running ones.
    Draining,
    Stopped,
    Failed,
}

/// What the engine settled on once the model was loaded.
#[derive(Clone, Debug)]
pub struct EngineInfo {
    pub model: ModelInfo,
    pub limits: Limits,
    pub max_seqs: usize,
    pub max_batched_tokens: usize,
    /// Seconds from `start` to ready (model load and warm-up).
    pub startup_secs: f64,
    /// Bytes of weights (the model's report).
    pub weight_bytes: u64,
    /// Bytes of per-token state per token (all per-token states).
    pub state_bytes_per_token: u64,
    /// Device copy bandwidth measured at start, GB/s (with `record_steps`).
    pub copy_gbs: Option<f64>,
    /// Speculative decoding as it runs (a draft program's k resolved), None when off.
    pub spec: Option<kern_sched::SpecConfig>,
}

/// One step, as `record_steps` keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// Every row had one token (decode or verify).
    pub decode: bool,
    /// Rows (sequences, or positions of verify rows) and tokens computed.
    pub rows: usize,
    pub tokens: usize,
    /// Sequences taking part, and tokens generated (more than sequences with accepted drafts).
    pub seqs: usize,
    pub generated: usize,
    /// Context tokens the step's rows attend over, summed (KV read).
    pub context: usize,
    /// Host time around the model's step and GPU time of its program (when measured), ms —
    /// the draft program's steps before it included.
    pub wall_ms: f64,
    pub gpu_ms: Option<f32>,
    /// Draft-program steps run before this step (to propose what it verified).
    pub draft_steps: usize,
}

/// Steps of one kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    pub steps: u64,
    /// Tokens computed (prompt tokens for prefill steps, one per sequence for decode).
    pub tokens: u64,
    pub secs: f64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    pub prefill: Phase,
    pub decode: Phase,
}

/// Why a request was not queued.
#[derive(Clone, Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the model is still loading: retry shortly")]
    Loading,
    /// The request itself is wrong: `field` names the request field to change.
    #[error("{message}")]
    Invalid { field: &'static str, message: String },
    #[error("the server is shutting down and takes no new requests")]
    Draining,
    #[error("the queue is full ({waiting} requests wait for {max_queue} places): retry later")]
    QueueFull { waiting: usize, max_queue: usize },
    #[error("the engine has failed: {0}")]
    Failed(String),
}

enum Cmd {
    Add(RequestId, Box<Request>, tmpsc::UnboundedSender<Event>),
    Abort(RequestId),
    Drain,
}

struct Inner {
    cmd: Mutex<mpsc::Sender<Cmd>>,
    state: watch::Sender<State>,
    info: OnceLock<EngineInfo>,
    failure: Mutex<Option<String>>,
    next_id: AtomicU64,
    /// Requests submitted and not finished.
    pending: AtomicUsize,
    running: AtomicUsize,
    metrics: Metrics,
    phases: Mutex<Phases>,
    records: Mutex<Vec<StepRecord>>,
    max_queue: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A handle on the engine; clones share it.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// One request's output stream. Dropping it before the request finished aborts the request.
pub struct RequestHandle {
    pub id: RequestId,
    rx: tmpsc::UnboundedReceiver<Event>,
    engine: Engine,
    done: bool,
}

impl RequestHandle {
    /// The next event; None only if the engine stopped without finishing the request (it
    /// failed), which callers treat like `Event::Failed`.
    pub async fn recv(&mut self) -> Option<Event> {
        let e = self.rx.recv().await;
        self.note(&e);
        e
    }

    /// The next event, blocking the thread (for callers outside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        let e = self.rx.blocking_recv();
        self.note(&e);
        e
    }

    fn note(&mut self, e: &Option<Event>) {
        if matches!(e, None | Some(Event::Finished { .. }) | Some(Event::Failed(_))) {
            self.done = true;
        }
    }
}

impl Drop for RequestHandle {
    fn drop(&mut self) {
        if !self.done {
            self.engine.abort(self.id);
        }
    }
}

impl Engine {
    /// Starts the engine thread: `load` builds the model there; `tokenizer` detokenizes (and
    /// is needed for stop strings).
    pub fn start<F>(cfg: EngineConfig, tokenizer: Option<Arc<Tokenizer>>, load: F) -> Engine
    where
        F: FnOnce() -> Result<Box<dyn Model>, ModelError> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let (state, _) = watch::channel(State::Loading);
        let inner = Arc::new(Inner {
            cmd: Mutex::new(tx),
            state,
            info: OnceLock::new(),
            failure: Mutex::new(None),
            next_id: AtomicU64::new(1),
            pending: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            metrics: Metrics::new(),
            phases: Mutex::new(Phases::default()),
            records: Mutex::new(Vec::new()),
            max_queue: cfg.max_queue,
            thread: Mutex::new(None),
        });
        let engine = Engine { inner: inner.clone() };
        let handle = std::thread::Builder::new()
            .name("kern-engine".into())
            .spawn(move || {
                let t0 = Instant::now();
                // A bug must not leave a server that accepts requests nobody computes: a panic
                // in the loop fails the engine like a GPU fault does.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let model = match load() {
                        Ok(m) => m,
                        Err(e) => return fail(&inner, format!("loading the model: {e}")),
                    };
                    run(&inner, cfg, tokenizer.as_deref(), model, rx, t0);
                }));
                if let Err(p) = r {
                    let what = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                    fail(&inner, format!("the engine thread panicked (a bug in kern; please report it): {what}"));
                }
            })
            .expect("spawning the engine thread");
        *engine.inner.thread.lock().expect("fresh lock") = Some(handle);
        engine
    }

    pub fn state(&self) -> State {
        *self.inner.state.borrow()
    }

    /// Watches the state (the server waits on it for ready, drain and failure).
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.inner.state.subscribe()
    }

    /// The model's limits, once loaded.
    pub fn info(&self) -> Option<&EngineInfo> {
        self.inner.info.get()
    }

    /// Why the engine failed, once it has.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The steps recorded so far (with `EngineConfig::record_steps`), taken.
    pub fn take_step_records(&self) -> Vec<StepRecord> {
        std::mem::take(&mut *self.inner.records.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Steps so far, split into prefill (any prompt chunk) and pure decode steps; time is host
    /// wall time around the model's step (inputs up, program, outputs back).
    pub fn phases(&self) -> Phases {
        *self.inner.phases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until the model is loaded (Ok) or loading failed (Err with the reason).
    pub fn wait_ready(&self) -> Result<&EngineInfo, String> {
        let mut rx = self.subscribe();
        loop {
            match *rx.borrow_and_update() {
                State::Loading => {}
                State::Failed => return Err(self.failure().unwrap_or_else(|| "the engine failed".into())),
                _ => return self.info().ok_or_else(|| "the engine stopped before it was ready".into()),
            }
            // No runtime here: poll the watch's version cheaply.
            if rx.has_changed().is_err() {
                return Err("the engine thread ended".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Validates and queues a request.
    pub fn submit(&self, req: Request) -> Result<RequestHandle, SubmitError> {
        match self.state() {
            State::Loading => return Err(SubmitError::Loading),
            State::Draining | State::Stopped => return Err(SubmitError::Draining),
            State::Failed => return Err(SubmitError::Failed(self.failure().unwrap_or_default())),
            State::Ready => {}
        }
        let info = self.info().expect("ready means loaded");
        validate(info, &req)?;
        let pending = self.inner.pending.load(Ordering::Relaxed);
        let waiting = pending.saturating_sub(self.inner.running.load(Ordering::Relaxed));
        if waiting >= self.inner.max_queue {
            return Err(SubmitError::QueueFull { waiting, max_queue: self.inner.max_queue });
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tmpsc::unbounded_channel();
        self.inner.pending.fetch_add(1, Ordering::Relaxed);
        let sent = self.inner.cmd.lock().unwrap_or_else(|p| p.into_inner()).send(Cmd::Add(id, Box::new(req), tx));
        if sent.is_err() {
            self.inner.pending.fetch_sub(1, Ordering::Relaxed);
            return Err(SubmitError::Failed(self.failure().unwrap_or_else(|| "the engine thread has stopped".into())));
        }
        Ok(RequestHandle { id, rx, engine: self.clone(), done: false })
    }

    /// Aborts a request: its pages are freed before the next step. Unknown or finished ids
    /// are ignored.
    pub fn abort(&self, id: RequestId) {
        let _ = self.inner.cmd.lock().unwrap_or_else(|p| p.into_inner()).send(Cmd::Abort(id));
    }

    /// Stops taking requests; the engine stops once the running and queued ones finish.
    pub fn drain(&self) {
        self.inner.state.send_if_modified(|s| {
            if *s == State::Ready || *s == State::Loading {
                *s = State::Draining;
                true
            } else {
                false
            }
        });
        let _ = self.inner.cmd.lock().unwrap_or_else(|p| p.into_inner()).send(Cmd::Drain);
    }

    /// Waits for the engine thread to end (after a drain or a failure).
    pub fn join(&self) {
        let h = self.inner.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

fn validate(info: &EngineInfo, req: &Request) -> Result<(), SubmitError> {
    let bad = |field, message: String| Err(SubmitError::Invalid { field, message });
    if let Err(e) = info.limits.check(req.prompt.len(), req.max_tokens) {
        let field = match e {
            AddError::EmptyPrompt | AddError::PromptTooLong { .. } => "prompt",
            _ => "max_tokens",
        };
        return bad(field, e.to_string());
    }
    let vocab = info.model.vocab;
    if vocab > 0 {
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return bad("prompt", format!("token id {t} is outside the vocabulary (0..{vocab})"));
        }
    }
    let s = &req.sampling;
    if !(s.temperature >= 0.0 && s.temperature.is_finite()) {
        return bad("temperature", format!("temperature must be a finite number ≥ 0, not {}", s.temperature));
    }
    if !(s.top_p > 0.0 && s.top_p <= 1.0) {
        return bad("top_p", format!("top_p must be in (0, 1], not {}", s.top_p));
    }
    if !(0.0..=1.0).contains(&s.min_p) {
        return bad("min_p", format!("min_p must be in [0, 1], not {}", s.min_p));
    }
    if s.top_k < 0 {
        return bad("top_k", format!("top_k must be 0 (off) or positive, not {}", s.top_k));
    }
    let host = needs_host_sampling(&info.model, req);
    if (host || req.logprobs.is_some() || req.return_logits) && !info.model.logits {
        let field = if req.logprobs.is_some() { "logprobs" } else if req.return_logits { "return_logits" } else if s.min_p > 0.0 { "min_p" } else { "temperature" };
        return bad(field, format!("`{field}` needs the model's logits, and this model's manifest binds no `logits` step output"));
    }
    if let Some(n) = req.logprobs {
        if vocab > 0 && n > vocab {
            return bad("logprobs", format!("at most {vocab} alternatives exist"));
        }
    }
    Ok(())
}

fn needs_host_sampling(m: &ModelInfo, req: &Request) -> bool {
    req.sampling.temperature > 0.0 && (req.sampling.min_p > 0.0 || !m.gpu_sampling)
}

fn fail(inner: &Inner, msg: String) {
    *inner.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
    inner.state.send_replace(State::Failed);
}

/// Fails every request in flight with `msg`, then the engine (a step's failure is sticky).
fn fail_all(inner: &Inner, live: &mut HashMap<SeqId, Live>, msg: String) {
    for (_, lv) in live.drain() {
        inner.pending.fetch_sub(1, Ordering::Relaxed);
        lv.send(Event::Failed(msg.clone()));
    }
    fail(inner, msg);
}

/// A request the loop is working on.
struct Live<'t> {
    id: RequestId,
    tx: tmpsc::UnboundedSender<Event>,
    text: TextState<'t>,
    req: Box<Request>,
    seed: u64,
    host_sample: bool,
    generated: usize,
    /// Prompt tokens the prefix cache supplied at the request's first step.
    cached: usize,
    started: Option<Instant>,
    last_token: Option<Instant>,
}

impl Live<'_> {
    fn send(&self, e: Event) {
        // A closed channel means the client is gone; its abort is on the way.
        let _ = self.tx.send(e);
    }
}

fn run(inner: &Inner, cfg: EngineConfig, tok: Option<&Tokenizer>, mut model: Box<dyn Model>, rx: mpsc::Receiver<Cmd>, t0: Instant) {
    if let Err(e) = model.warm_up(&mut |_, _| {}) {
        return fail(inner, format!("warming up the model: {e}"));
    }
    let mi = model.info().clone();
    let mut cfg = cfg;
    if mi.per_seq_state && cfg.prefix_cache {
        // A per-sequence state at a prefix's end is not snapshotted, so a cached prefix could
        // not restore it: such models compute every prompt in full.
        cfg.prefix_cache = false;
    }
    if mi.per_seq_state {
        // Draft rows would each advance the sequence's state.
        cfg.spec = None;
    }
    if let Some(sp) = cfg.spec.as_mut().filter(|sp| sp.drafter == kern_sched::Drafter::Program) {
        let Some(k) = mi.draft_k else {
            return fail(inner, "speculative decoding with a draft program: this model declares none (no `speculative` section in its manifest): pack it with `kern pack --draft ...`, or draft with n-grams (--spec-ngram)".into());
        };
        if sp.k == 0 {
            sp.k = k;
        }
    }
    let draft_program = cfg.spec.as_ref().is_some_and(|sp| sp.drafter == kern_sched::Drafter::Program);
    let mut host_slots = 0;
    if cfg.offload_bytes > 0 {
        if !cfg.prefix_cache {
            return fail(inner, "KV offload needs the prefix cache (it keeps cached pages in host memory): drop --no-prefix-cache".into());
        }
        let pb = model.page_bytes() as u64;
        if pb == 0 {
            return fail(inner, "this model cannot offload KV pages to host memory".into());
        }
        host_slots = (cfg.offload_bytes / pb) as usize;
        if let Err(e) = model.init_host_tier(host_slots) {
            return fail(inner, format!("allocating {} host slots for KV offload: {e}", host_slots));
        }
    }
    let max_seqs = cfg.max_seqs.unwrap_or(mi.max_step_seqs).clamp(1, mi.max_step_seqs.max(1));
    let chunk = cfg.max_batched_tokens.unwrap_or(mi.max_step_tokens).clamp(1, mi.max_step_tokens.max(1));
    let mut sched = Scheduler::new(
        SchedulerConfig { chunk, max_seqs, max_context: mi.max_context(), pages_per_seq: mi.pages_per_seq, spec: cfg.spec.clone() },
        BlockManager::new(mi.total_pages, mi.page_tokens).with_prefix_cache(cfg.prefix_cache).with_host_tier(host_slots),
    );
    let m = &inner.metrics;
    m.kv_total_pages.set(mi.total_pages as i64);
    let copy_gbs = if cfg.record_steps { model.measure_copy_bandwidth() } else { None };
    let state_bytes_per_token = (model.page_bytes() / mi.page_tokens.max(1)) as u64;
    let _ = inner.info.set(EngineInfo {
        model: mi.clone(),
        limits: sched.limits(),
        max_seqs,
        max_batched_tokens: chunk,
        startup_secs: t0.elapsed().as_secs_f64(),
        weight_bytes: model.weight_bytes(),
        state_bytes_per_token,
        copy_gbs,
        spec: cfg.spec.clone(),
    });
    inner.state.send_if_modified(|s| {
        if *s == State::Loading {
            *s = State::Ready;
            true
        } else {
            false
        }
    });

    let mut live: HashMap<SeqId, Live> = HashMap::new();
    let mut seq_of: HashMap<RequestId, SeqId> = HashMap::new();
    let mut draining = *inner.state.borrow() == State::Draining;
    let mut seed_state = t0.elapsed().as_nanos() as u64 ^ 0x6b65_726e;
    let mut preemptions = 0u64;
    let finish = |lv: Live, reason: FinishReason, stop: Option<StopReason>| {
        let now = Instant::now();
        m.e2e.observe(now.duration_since(lv.req.arrival).as_secs_f64());
        m.generation_len.observe(lv.generated as f64);
        m.finished(reason.as_str());
        inner.pending.fetch_sub(1, Ordering::Relaxed);
        lv.send(Event::Finished { reason, stop_reason: stop, prompt_tokens: lv.req.prompt.len(), completion_tokens: lv.generated, cached_tokens: lv.cached });
    };
    loop {
        // 1. Commands: wait for one only when there is nothing to compute.
        loop {
            let cmd = if sched.has_work() {
                match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else if draining {
                inner.state.send_replace(State::Stopped);
                return;
            } else {
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
            match cmd {
                Cmd::Add(id, req, tx) => {
                    let text = match TextState::new(tok, &req.prompt, req.skip_special_tokens, req.stop.clone(), req.include_stop_str) {
                        Ok(t) => t,
                        Err(e) => {
                            inner.pending.fetch_sub(1, Ordering::Relaxed);
                            let _ = tx.send(Event::Failed(format!("detokenizer: {e}")));
                            continue;
                        }
                    };
                    let seed = req.sampling.seed.unwrap_or_else(|| {
                        seed_state = seed_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        seed_state >> 1
                    });
                    let params = SamplingParams {
                        temperature: req.sampling.temperature,
                        top_k: req.sampling.top_k,
                        top_p: req.sampling.top_p,
                        seed,
                        max_tokens: req.max_tokens,
                        stop: cfg.eos.clone(),
                        ignore_eos: req.ignore_eos,
                        stop_always: req.stop_token_ids.clone(),
                    };
                    match sched.add(req.prompt.clone(), params) {
                        Ok(seq) => {
                            m.prompt_tokens.inc_by(req.prompt.len() as u64);
                            m.prompt_len.observe(req.prompt.len() as f64);
                            seq_of.insert(id, seq);
                            let host_sample = needs_host_sampling(&mi, &req);
                            live.insert(seq, Live { id, tx, text, req, seed, host_sample, generated: 0, cached: 0, started: None, last_token: None });
                        }
                        Err(e) => {
                            inner.pending.fetch_sub(1, Ordering::Relaxed);
                            let _ = tx.send(Event::Failed(e.to_string()));
                        }
                    }
                }
                Cmd::Abort(id) => {
                    if let Some(seq) = seq_of.remove(&id) {
                        sched.abort(seq);
                        if let Some(lv) = live.remove(&seq) {
                            finish(lv, FinishReason::Abort, None);
                        }
                    }
                }
                Cmd::Drain => {
                    draining = true;
                    inner.state.send_if_modified(|s| {
                        let change = *s == State::Ready;
                        if change {
                            *s = State::Draining;
                        }
                        change
                    });
                }
            }
            publish(inner, &sched);
        }
        publish(inner, &sched);
        if !sched.has_work() {
            continue;
        }

        // 2. Drafts from the draft program (greedy steps on its own state), then the step that
        // verifies them.
        let round_start = Instant::now();
        let (mut draft_steps, mut draft_gpu_ms) = (0usize, 0f32);
        if draft_program {
            let mut next = sched.draft_begin(|t, s, d| model.pad(t, s, d));
            while let Some(ds) = next {
                let sampled = match model.draft_step(&ds) {
                    Ok(s) => s,
                    Err(e) => return fail_all(inner, &mut live, format!("the draft program failed in a step: {e}")),
                };
                draft_steps += 1;
                draft_gpu_ms += model.last_gpu_ms().unwrap_or(0.0);
                next = sched.draft_advance(&ds, &sampled, |t, s, d| model.pad(t, s, d));
            }
        }
        let Some(step) = sched.schedule(|t, s, d| model.pad(t, s, d)) else {
            // Cannot happen with the admission checks (a lone request always fits); fail the
            // queue's front rather than spin.
            let msg = format!("no request can be scheduled ({} of {} KV pages free)", sched.free_pages(), sched.total_pages());
            return fail_all(inner, &mut live, msg);
        };
        let now = Instant::now();
        for ss in &step.seqs {
            if let Some(lv) = live.get_mut(&ss.id) {
                if lv.started.is_none() {
                    lv.started = Some(now);
                    lv.cached = ss.start;
                    m.queue_time.observe(now.duration_since(lv.req.arrival).as_secs_f64());
                }
            }
        }
        let restores = sched.take_restores();
        if !restores.is_empty() {
            if let Err(e) = model.restore_pages(&restores) {
                return fail_all(inner, &mut live, format!("restoring KV pages from host memory: {e}"));
            }
        }
        let want_logits = step.seqs.iter().any(|ss| ss.samples && live.get(&ss.id).is_some_and(|lv| lv.host_sample || lv.req.logprobs.is_some() || lv.req.return_logits));
        // 3. The model.
        let out = match model.step(&step, want_logits) {
            Ok(o) => o,
            Err(e) => {
                return fail_all(inner, &mut live, format!("the model failed in a step: {e}"));
            }
        };
        m.steps.inc();
        m.iteration_tokens.observe(step.real_tokens as f64);
        if !restores.is_empty() || m.restore_bytes.get() > 0 {
            let (bytes, secs) = model.restore_timing();
            m.restore_bytes.inc_by(bytes.saturating_sub(m.restore_bytes.get()));
            let before = m.restore_secs.get();
            if secs > before {
                m.restore_secs.inc_by(secs - before);
            }
        }

        let vocab = mi.vocab;
        let row_logits = |row: usize| out.logits.as_ref().and_then(|l| l.get(row * vocab..(row + 1) * vocab));
        let mut sampled = out.sampled.clone();
        for (row, ss) in step.seqs.iter().enumerate() {
            if let (true, Some(lv)) = (ss.samples, live.get(&ss.id)) {
                if lv.host_sample {
                    if let (Some(l), Some(slot)) = (row_logits(row), sampled.get_mut(row)) {
                        *slot = sample::sample(l, &lv.req.sampling, lv.seed, step.seq_lens[row] as u64) as i32;
                    }
                }
            }
        }
        // 4. Commit and stream.
        let outs = sched.commit(&step, &sampled);
        {
            // Prefill counts the tokens computed; decode the tokens generated (with drafts, a
            // step generates several per sequence).
            let mut ps = inner.phases.lock().unwrap_or_else(|p| p.into_inner());
            let (ph, n) = if step.is_decode() { (&mut ps.decode, outs.len()) } else { (&mut ps.prefill, step.real_tokens) };
            ph.steps += 1;
            ph.tokens += n as u64;
            ph.secs += round_start.elapsed().as_secs_f64();
        }
        if cfg.record_steps {
            let rec = StepRecord {
                decode: step.is_decode(),
                rows: step.real_seqs,
                tokens: step.real_tokens,
                seqs: {
                    let mut ids: Vec<u64> = step.seqs.iter().map(|s| s.id).collect();
                    ids.dedup();
                    ids.len()
                },
                generated: outs.len(),
                context: step.seq_lens.iter().take(step.real_seqs).map(|&l| l.max(0) as usize).sum(),
                wall_ms: round_start.elapsed().as_secs_f64() * 1e3,
                gpu_ms: model.last_gpu_ms().map(|g| g + draft_gpu_ms),
                draft_steps,
            };
            inner.records.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
        }
        let stores = sched.take_stores();
        if !stores.is_empty() {
            if let Err(e) = model.store_pages(&stores) {
                return fail_all(inner, &mut live, format!("copying KV pages to host memory: {e}"));
            }
        }
        let now = Instant::now();
        for o in outs {
            let Some(lv) = live.get_mut(&o.id) else { continue };
            lv.generated += 1;
            m.generation_tokens.inc();
            match lv.last_token {
                None => m.ttft.observe(now.duration_since(lv.req.arrival).as_secs_f64()),
                Some(t) => m.itl.observe(now.duration_since(t).as_secs_f64()),
            }
            lv.last_token = Some(now);
            let lps: Vec<TokenLogprob> = match (lv.req.logprobs, row_logits(o.row)) {
                (Some(n), Some(l)) => vec![sample::logprobs(l, o.token, n)],
                _ => vec![],
            };
            let (mut text, hit) = match lv.text.push(o.token) {
                Ok(x) => x,
                Err(e) => {
                    let lv = live.remove(&o.id).expect("present");
                    seq_of.remove(&lv.id);
                    sched.abort(o.id);
                    inner.pending.fetch_sub(1, Ordering::Relaxed);
                    lv.send(Event::Failed(format!("detokenizing token {}: {e}", o.token)));
                    continue;
                }
            };
            let end = match (hit, o.finished) {
                (Some(s), _) => Some((FinishReason::Stop, Some(StopReason::Text(s)))),
                (None, Some(Finish::Stop)) => Some((FinishReason::Stop, lv.req.stop_token_ids.contains(&o.token).then_some(StopReason::Token(o.token)))),
                (None, Some(Finish::Length)) => Some((FinishReason::Length, None)),
                (None, None) => None,
            };
            if matches!(end, Some((_, None | Some(StopReason::Token(_))))) {
                // Not a stop string: flush what was held back.
                match lv.text.finish() {
                    Ok(rest) => text.push_str(&rest),
                    Err(e) => text.push_str(&format!("\u{FFFD}[{e}]")),
                }
            }
            let logits = if lv.req.return_logits { row_logits(o.row).map(<[f32]>::to_vec).unwrap_or_default() } else { vec![] };
            lv.send(Event::Output { text, tokens: vec![o.token], logprobs: lps, logits });
            if let Some((reason, stop)) = end {
                let lv = live.remove(&o.id).expect("present");
                seq_of.remove(&lv.id);
                sched.abort(o.id); // frees the pages of a stop-string finish (a no-op otherwise)
                finish(lv, reason, stop);
            }
        }
        if sched.preemptions() > preemptions {
            m.preemptions.inc_by(sched.preemptions() - preemptions);
            preemptions = sched.preemptions();
        }
        publish(inner, &sched);
    }
}

fn publish(inner: &Inner, sched: &Scheduler) {
    let m = &inner.metrics;
    let sp = sched.spec_stats();
    m.spec_drafts.inc_by(sp.drafts.saturating_sub(m.spec_drafts.get()));
    m.spec_draft_tokens.inc_by(sp.draft_tokens.saturating_sub(m.spec_draft_tokens.get()));
    m.spec_accepted.inc_by(sp.accepted_tokens.saturating_sub(m.spec_accepted.get()));
    m.spec_draft_steps.inc_by(sp.draft_steps.saturating_sub(m.spec_draft_steps.get()));
    let c = sched.cache_stats();
    m.prefix_queries.inc_by(c.queries.saturating_sub(m.prefix_queries.get()));
    m.prefix_hits.inc_by(c.hits.saturating_sub(m.prefix_hits.get()));
    m.host_hits.inc_by(c.host_hits.saturating_sub(m.host_hits.get()));
    m.stored_pages.inc_by(c.stored.saturating_sub(m.stored_pages.get()));
    m.restored_pages.inc_by(c.restored.saturating_sub(m.restored_pages.get()));
    m.cached_pages.set(sched.cached_pages() as i64);
    m.running.set(sched.running() as i64);
    m.waiting.set(sched.waiting() as i64);
    inner.running.store(sched.running(), Ordering::Relaxed);
    let used = sched.used_pages();
    m.kv_used_pages.set(used as i64);
    m.kv_usage.set(used as f64 / sched.total_pages().max(1) as f64);
}
