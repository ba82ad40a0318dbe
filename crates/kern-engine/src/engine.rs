//! The engine: a request queue and the step loop on its own thread.
//!
//! [`Engine::start`] spawns the loop thread, which constructs the model there (a CUDA context
//! belongs to the thread that made it) and then steps (`step_loop.rs`: admit → schedule → mask
//! → run → commit → emit).
//!
//! Constrained requests bring a compiled grammar ([`Engine::compile`], called by the client on
//! its own thread before it submits, so compilation never holds the loop).
//!
//! Clients hold a [`RequestHandle`]; dropping it before the request finished aborts it (a
//! client that disconnects frees its pages at once). A failing step fails every request in
//! flight with the model's message and stops the engine: a GPU fault is sticky.

use crate::constraint::{CompiledGrammar, Grammar, GrammarError, GrammarLimits, Grammars};
use crate::metrics::Metrics;
use crate::model::{Model, ModelError, ModelInfo};
use crate::request::{Event, Request, RequestId};
use kern_sched::{AddError, Limits, Scheduler};
use kern_tokenizer::Tokenizer;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
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
    /// Threads computing constrained requests' token masks (0: one per core but one, at most 16).
    pub mask_threads: usize,
    /// Bounds on compiling a request's grammar.
    pub grammar_limits: GrammarLimits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { max_seqs: None, max_batched_tokens: None, max_queue: 4096, eos: vec![], prefix_cache: true, offload_bytes: 0, spec: None, record_steps: false, mask_threads: 0, grammar_limits: GrammarLimits::default() }
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
    /// Whether the model applies token masks itself (the step ABI's `token_mask`); else
    /// constrained rows are masked and sampled on the host from the logits.
    pub token_mask: bool,
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

pub(crate) enum Cmd {
    Add(RequestId, Box<Request>, tmpsc::UnboundedSender<Event>),
    Abort(RequestId),
    Drain,
}

pub(crate) struct Inner {
    cmd: Mutex<mpsc::Sender<Cmd>>,
    pub(crate) state: watch::Sender<State>,
    pub(crate) info: OnceLock<EngineInfo>,
    failure: Mutex<Option<String>>,
    next_id: AtomicU64,
    /// Requests submitted and not finished.
    pub(crate) pending: AtomicUsize,
    running: AtomicUsize,
    pub(crate) metrics: Metrics,
    pub(crate) phases: Mutex<Phases>,
    pub(crate) records: Mutex<Vec<StepRecord>>,
    max_queue: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// The model's grammar compiler, once the model is loaded.
    grammars: OnceLock<Arc<Grammars>>,
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
            tokenizer: tokenizer.clone(),
            grammars: OnceLock::new(),
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
                    if let Some(l) = crate::step_loop::Loop::start(&inner, cfg, tokenizer.as_deref(), model, rx, t0) {
                        l.run();
                    }
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

    /// Compiles a grammar for a constrained request (cached; blocking up to the compile time
    /// limit: call it off any async runtime's worker threads). Err: the request's problem.
    pub fn compile(&self, g: &Grammar) -> Result<Arc<CompiledGrammar>, GrammarError> {
        match self.inner.grammars.get() {
            Some(gs) => gs.compile(g),
            None => Err(GrammarError::Unsupported("the model is still loading: retry shortly".into())),
        }
    }

    /// The grammar compiler (after the model is loaded): its cache and limits.
    pub fn grammars(&self) -> Option<&Arc<Grammars>> {
        self.inner.grammars.get()
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
    if req.constraint.is_some() && !info.token_mask && !info.model.logits {
        return bad("response_format", "this model cannot constrain its output: its manifest binds neither the step ABI's `token_mask` input nor a `logits` output".into());
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

pub(crate) fn needs_host_sampling(m: &ModelInfo, req: &Request) -> bool {
    req.sampling.temperature > 0.0 && (req.sampling.min_p > 0.0 || !m.gpu_sampling)
}

/// Tokens a token-mask row covers: the logits' width, else the tokenizer's vocabulary.
pub(crate) fn mask_vocab(mi: &ModelInfo, tok: Option<&Tokenizer>) -> usize {
    if mi.vocab > 0 {
        mi.vocab
    } else {
        tok.map_or(0, Tokenizer::vocab_size)
    }
}

/// Sets up the grammar compiler once the model is known: a model that neither takes a mask nor
/// returns logits gets one that refuses every grammar, saying why.
pub(crate) fn init_grammars(inner: &Inner, cfg: &EngineConfig, mi: &ModelInfo, token_mask: bool) {
    let refuse = (!token_mask && !mi.logits).then(|| "this model cannot constrain its output: its manifest binds neither the step ABI's `token_mask` input (docs/step-abi.md) nor a `logits` output to mask on the host".to_string());
    let eos = if cfg.eos.is_empty() { inner.tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default() } else { cfg.eos.clone() };
    let vocab = mask_vocab(mi, inner.tokenizer.as_deref());
    let _ = inner.grammars.set(Arc::new(Grammars::new(inner.tokenizer.clone(), vocab, eos, refuse, cfg.grammar_limits.clone())));
}

pub(crate) fn fail(inner: &Inner, msg: String) {
    *inner.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg);
    inner.state.send_replace(State::Failed);
}

pub(crate) fn publish(inner: &Inner, sched: &Scheduler) {
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
    m.snapshots_saved.inc_by(c.snapshots_saved.saturating_sub(m.snapshots_saved.get()));
    m.snapshots_restored.inc_by(c.snapshots_restored.saturating_sub(m.snapshots_restored.get()));
    m.snapshots_evicted.inc_by(c.snapshots_evicted.saturating_sub(m.snapshots_evicted.get()));
    m.cached_pages.set(sched.cached_pages() as i64);
    m.running.set(sched.running() as i64);
    m.waiting.set(sched.waiting() as i64);
    inner.running.store(sched.running(), Ordering::Relaxed);
    let used = sched.used_pages();
    m.kv_used_pages.set(used as i64);
    m.kv_usage.set(used as f64 / sched.total_pages().max(1) as f64);
}
