//! The step loop, phase by phase. One turn of [`Loop::run`] reads as the step it performs:
//!
//! ```text
//! admit → schedule → mask → run → commit → emit
//! ```
//!
//! - **admit**: take commands (new requests, aborts, drain) — blocking only when there is no work;
//! - **schedule**: the draft program's rounds (speculative decoding), then `kern-sched` picks the
//!   step (decode tokens, prefill chunks, preemption) and host-tier pages come back;
//! - **mask**: the token mask of every constrained row (computed on the mask threads since the
//!   row's last token was committed; verify rows add the states after their drafts);
//! - **run**: the model runs the step (`Model::step_with`); a model without a mask input gets
//!   its constrained rows masked and sampled on the host from the logits, with the masks
//!   computed while the GPU runs;
//! - **commit**: the scheduler appends the tokens (accepting drafts), each constraint advances
//!   and starts computing its next mask;
//! - **emit**: each request's text is detokenized incrementally, stop strings are matched, and
//!   its new text / tokens / logprobs go into its channel; finished requests get their last
//!   event and free their pages.

use crate::constraint::seq::{Advance, SeqConstraint};
use crate::mask_phase::{compute_masks, constrained_rows, Masks};
use crate::constraint::{MaskPool, TokenMask};
use crate::engine::{Cmd, EngineConfig, EngineInfo, Inner, State, StepRecord};
use crate::model::{Model, ModelInfo, StepOutput};
use crate::output::TextState;
use crate::request::{Event, FinishReason, Request, RequestId, StopReason, TokenLogprob};
use crate::sample;
use kern_sched::{BlockManager, Finish, SamplingParams, Scheduler, SchedulerConfig, SeqId, SeqOutput, Step};
use kern_tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc as tmpsc;

/// A request the loop is working on.
pub(crate) struct Live<'t> {
    pub id: RequestId,
    pub tx: tmpsc::UnboundedSender<Event>,
    pub text: TextState<'t>,
    pub req: Box<Request>,
    pub seed: u64,
    pub host_sample: bool,
    pub generated: usize,
    /// Prompt tokens the prefix cache supplied at the request's first step.
    pub cached: usize,
    pub started: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Its grammar's state, when the request is constrained.
    pub constraint: Option<SeqConstraint>,
}

impl Live<'_> {
    pub fn send(&self, e: Event) {
        // A closed channel means the client is gone; its abort is on the way.
        let _ = self.tx.send(e);
    }
}

/// Why the loop stops: a step failed (every request in flight fails with the message, then the
/// engine), or it ended normally.
enum Stop {
    Fatal(String),
    Ended,
}

/// What the model returned for a step, with what the loop needs to commit and emit it.
struct Ran {
    out: StepOutput,
    sampled: Vec<i32>,
    round: Round,
}

/// The work before a step: when it started, the draft program's steps, pages restored.
struct Round {
    start: Instant,
    draft_steps: usize,
    draft_gpu_ms: f32,
    restored: bool,
}

pub(crate) struct Loop<'t> {
    inner: &'t Inner,
    cfg: EngineConfig,
    tok: Option<&'t Tokenizer>,
    model: Box<dyn Model>,
    mi: ModelInfo,
    sched: Scheduler,
    rx: mpsc::Receiver<Cmd>,
    live: HashMap<SeqId, Live<'t>>,
    seq_of: HashMap<RequestId, SeqId>,
    draining: bool,
    seed_state: u64,
    preemptions: u64,
    draft_program: bool,
    masks: MaskPool,
    /// Tokens a mask row covers: the logits' width, else the tokenizer's vocabulary.
    mask_vocab: usize,
}

impl<'t> Loop<'t> {
    /// Prepares the model (warm-up, host tier) and the scheduler, publishes the engine's info and
    /// turns it ready; None (after failing the engine) when the model cannot run.
    pub fn start(inner: &'t Inner, mut cfg: EngineConfig, tok: Option<&'t Tokenizer>, mut model: Box<dyn Model>, rx: mpsc::Receiver<Cmd>, t0: Instant) -> Option<Loop<'t>> {
        let fail = |msg: String| {
            crate::engine::fail(inner, msg);
            None
        };
        if let Err(e) = model.warm_up(&mut |_, _| {}) {
            return fail(format!("warming up the model: {e}"));
        }
        let mi = model.info().clone();
        // A per-sequence state at a prefix's end is kept only in snapshots: a model without
        // snapshot slots computes every prompt in full.
        let snapshots = if mi.per_seq_state { model.snapshot_slots() } else { 0 };
        if mi.per_seq_state && snapshots == 0 {
            cfg.prefix_cache = false;
        }
        if mi.per_seq_state && cfg.spec.is_some() {
            // Each draft row would advance the sequence's state, and rejected drafts cannot be
            // taken back out of it (only pages can be released).
            return fail("speculative decoding needs every state of the model per token (the tokens a verify step rejects are rolled back by releasing their pages), and this model declares a per-sequence state (a recurrent state, say), which cannot be rolled back: run it without --spec-ngram / --spec-draft".into());
        }
        if let Some(sp) = cfg.spec.as_mut().filter(|sp| sp.drafter == kern_sched::Drafter::Program) {
            let Some(k) = mi.draft_k else {
                return fail("speculative decoding with a draft program: this model declares none (no `speculative` section in its manifest): pack it with `kern pack --draft ...`, or draft with n-grams (--spec-ngram)".into());
            };
            if sp.k == 0 {
                sp.k = k;
            }
        }
        let draft_program = cfg.spec.as_ref().is_some_and(|sp| sp.drafter == kern_sched::Drafter::Program);
        let mut host_slots = 0;
        if cfg.offload_bytes > 0 {
            if mi.per_seq_state {
                return fail("KV offload keeps cached pages in host memory, but this model declares a per-sequence state, whose snapshots stay on the GPU: a page restored from the host could never be used (a hit needs the state at its end): drop --offload-gib".into());
            }
            if !cfg.prefix_cache {
                return fail("KV offload needs the prefix cache (it keeps cached pages in host memory): drop --no-prefix-cache".into());
            }
            let pb = model.page_bytes() as u64;
            if pb == 0 {
                return fail("this model cannot offload KV pages to host memory".into());
            }
            host_slots = (cfg.offload_bytes / pb) as usize;
            if let Err(e) = model.init_host_tier(host_slots) {
                return fail(format!("allocating {} host slots for KV offload: {e}", host_slots));
            }
        }
        let max_seqs = cfg.max_seqs.unwrap_or(mi.max_step_seqs).clamp(1, mi.max_step_seqs.max(1));
        let chunk = cfg.max_batched_tokens.unwrap_or(mi.max_step_tokens).clamp(1, mi.max_step_tokens.max(1));
        let sched = Scheduler::new(
            SchedulerConfig { chunk, max_seqs, max_context: mi.max_context(), pages_per_seq: mi.pages_per_seq, spec: cfg.spec.clone() },
            {
                let blocks = BlockManager::new(mi.total_pages, mi.page_tokens).with_prefix_cache(cfg.prefix_cache).with_host_tier(host_slots);
                if snapshots > 0 && cfg.prefix_cache {
                    blocks.with_snapshots(snapshots)
                } else {
                    blocks
                }
            },
        );
        inner.metrics.kv_total_pages.set(mi.total_pages as i64);
        let copy_gbs = if cfg.record_steps { model.measure_copy_bandwidth() } else { None };
        let state_bytes_per_token = (model.page_bytes() / mi.page_tokens.max(1)) as u64;
        let token_mask = model.token_mask();
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
            token_mask,
        });
        crate::engine::init_grammars(inner, &cfg, &mi, token_mask);
        inner.state.send_if_modified(|s| {
            if *s == State::Loading {
                *s = State::Ready;
                true
            } else {
                false
            }
        });
        let draining = *inner.state.borrow() == State::Draining;
        let masks = MaskPool::new(cfg.mask_threads);
        let mask_vocab = crate::engine::mask_vocab(&mi, tok);
        Some(Loop { inner, seed_state: t0.elapsed().as_nanos() as u64 ^ 0x6b65_726e, cfg, tok, model, mi, sched, rx, live: HashMap::new(), seq_of: HashMap::new(), draining, preemptions: 0, draft_program, masks, mask_vocab })
    }

    /// Steps until the engine drains or a step fails.
    pub fn run(mut self) {
        loop {
            if !self.admit() {
                return;
            }
            let r = self.schedule().and_then(|(step, round)| {
                // A model that applies the mask needs it before the step; host masking computes
                // it while the model runs (run_step).
                let mask = if self.model.token_mask() { self.mask(&step) } else { None };
                let ran = self.run_step(&step, mask, round)?;
                let outs = self.commit(&step, &ran)?;
                self.emit(&ran, outs);
                Ok(())
            });
            match r {
                Ok(()) | Err(Stop::Ended) => {}
                Err(Stop::Fatal(msg)) => return self.fail_all(msg),
            }
        }
    }

    // ------------------------------------------------------------------------------- admit

    /// Takes commands: waits for one only when there is nothing to compute. False: the loop
    /// ends (drained, or every engine handle is gone).
    fn admit(&mut self) -> bool {
        loop {
            let cmd = if self.sched.has_work() {
                match self.rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return false,
                }
            } else if self.draining {
                self.inner.state.send_replace(State::Stopped);
                return false;
            } else {
                match self.rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            };
            match cmd {
                Cmd::Add(id, req, tx) => self.add(id, req, tx),
                Cmd::Abort(id) => {
                    if let Some(seq) = self.seq_of.remove(&id) {
                        self.sched.abort(seq);
                        if let Some(lv) = self.live.remove(&seq) {
                            self.finish(lv, FinishReason::Abort, None);
                        }
                    }
                }
                Cmd::Drain => {
                    self.draining = true;
                    self.inner.state.send_if_modified(|s| {
                        let change = *s == State::Ready;
                        if change {
                            *s = State::Draining;
                        }
                        change
                    });
                }
            }
            self.publish();
        }
        self.publish();
        true
    }

    fn add(&mut self, id: RequestId, req: Box<Request>, tx: tmpsc::UnboundedSender<Event>) {
        let refuse = |inner: &Inner, msg: String| {
            inner.pending.fetch_sub(1, Ordering::Relaxed);
            let _ = tx.send(Event::Failed(msg));
        };
        let text = match TextState::new(self.tok, &req.prompt, req.skip_special_tokens, req.stop.clone(), req.include_stop_str) {
            Ok(t) => t,
            Err(e) => return refuse(self.inner, format!("detokenizer: {e}")),
        };
        let seed = req.sampling.seed.unwrap_or_else(|| {
            self.seed_state = self.seed_state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.seed_state >> 1
        });
        let params = SamplingParams {
            temperature: req.sampling.temperature,
            top_k: req.sampling.top_k,
            top_p: req.sampling.top_p,
            seed,
            max_tokens: req.max_tokens,
            stop: self.cfg.eos.clone(),
            ignore_eos: req.ignore_eos,
            stop_always: req.stop_token_ids.clone(),
        };
        match self.sched.add(req.prompt.clone(), params) {
            Ok(seq) => {
                let m = &self.inner.metrics;
                m.prompt_tokens.inc_by(req.prompt.len() as u64);
                m.prompt_len.observe(req.prompt.len() as f64);
                self.seq_of.insert(id, seq);
                let host_sample = crate::engine::needs_host_sampling(&self.mi, &req);
                let mut constraint = req.constraint.as_ref().map(|c| SeqConstraint::new(c, self.inner.metrics.mask_secs.clone()));
                if let Some(c) = constraint.as_mut() {
                    // Its first mask is computed while the prompt is.
                    c.prefetch(&self.masks);
                }
                self.live.insert(seq, Live { id, tx, text, req, seed, host_sample, generated: 0, cached: 0, started: None, last_token: None, constraint });
            }
            Err(e) => refuse(self.inner, e.to_string()),
        }
    }

    // ---------------------------------------------------------------------------- schedule

    /// The draft program's rounds (greedy steps on its own state), then the step that verifies
    /// them; host-tier pages the step reads are restored before it.
    fn schedule(&mut self) -> Result<(Step, Round), Stop> {
        if !self.sched.has_work() {
            return Err(Stop::Ended);
        }
        let round_start = Instant::now();
        let (mut draft_steps, mut draft_gpu_ms) = (0usize, 0f32);
        if self.draft_program {
            let model = &mut self.model;
            let mut next = self.sched.draft_begin(|t, s, d| model.pad(t, s, d));
            while let Some(ds) = next {
                let sampled = model.draft_step(&ds).map_err(|e| Stop::Fatal(format!("the draft program failed in a step: {e}")))?;
                draft_steps += 1;
                draft_gpu_ms += model.last_gpu_ms().unwrap_or(0.0);
                next = self.sched.draft_advance(&ds, &sampled, |t, s, d| model.pad(t, s, d));
            }
        }
        let model = &self.model;
        let Some(step) = self.sched.schedule(|t, s, d| model.pad(t, s, d)) else {
            // Cannot happen with the admission checks (a lone request always fits); fail rather
            // than spin.
            return Err(Stop::Fatal(format!("no request can be scheduled ({} of {} KV pages free)", self.sched.free_pages(), self.sched.total_pages())));
        };
        let now = Instant::now();
        for ss in &step.seqs {
            if let Some(lv) = self.live.get_mut(&ss.id) {
                if lv.started.is_none() {
                    lv.started = Some(now);
                    lv.cached = ss.start;
                    self.inner.metrics.queue_time.observe(now.duration_since(lv.req.arrival).as_secs_f64());
                }
            }
        }
        let restores = self.sched.take_restores();
        if !restores.is_empty() {
            self.model.restore_pages(&restores).map_err(|e| Stop::Fatal(format!("restoring KV pages from host memory: {e}")))?;
        }
        Ok((step, Round { start: round_start, draft_steps, draft_gpu_ms, restored: !restores.is_empty() }))
    }

    // -------------------------------------------------------------------------------- mask

    /// The step's token mask: None when no row is constrained. A constraint that fails (its
    /// grammar errs) fails its request, not the step: its row goes free and its output is
    /// dropped at commit.
    fn mask(&mut self, step: &Step) -> Option<TokenMask> {
        let groups = constrained_rows(&self.live, step);
        if groups.is_empty() {
            return None;
        }
        let (mask, failed) = compute_masks(&mut self.live, &self.masks, &self.inner.metrics, step, groups, self.mask_vocab);
        for (seq, e) in failed {
            self.fail_request(seq, e);
        }
        mask
    }

    // --------------------------------------------------------------------------------- run

    /// The model runs the step. Rows to sample on the host (a min-p request, a model that only
    /// samples greedily, or a constrained row when the model takes no mask) are sampled from the
    /// logits once they are back.
    fn run_step(&mut self, step: &Step, mask: Option<TokenMask>, round: Round) -> Result<Ran, Stop> {
        let host_groups = if self.model.token_mask() { Vec::new() } else { constrained_rows(&self.live, step) };
        let on_host = !host_groups.is_empty();
        let want_logits = on_host || step.seqs.iter().any(|ss| ss.samples && self.live.get(&ss.id).is_some_and(|lv| lv.host_sample || lv.req.logprobs.is_some() || lv.req.return_logits));
        // Host masking: the masks are computed (or their threads waited for) while the GPU runs.
        let mut host: Option<Masks> = None;
        let out = {
            let (live, pool, metrics, vocab) = (&mut self.live, &self.masks, &self.inner.metrics, self.mask_vocab);
            let mut overlap = || {
                if on_host {
                    host = Some(compute_masks(live, pool, metrics, step, host_groups.clone(), vocab));
                }
            };
            self.model.step_with(step, want_logits, mask.as_ref(), &mut overlap).map_err(|e| Stop::Fatal(format!("the model failed in a step: {e}")))?
        };
        let mask = match host {
            Some((m, failed)) => {
                for (seq, e) in failed {
                    self.fail_request(seq, e);
                }
                m
            }
            None => mask,
        };
        let m = &self.inner.metrics;
        m.steps.inc();
        m.iteration_tokens.observe(step.real_tokens as f64);
        if round.restored || m.restore_bytes.get() > 0 {
            let (bytes, secs) = self.model.restore_timing();
            m.restore_bytes.inc_by(bytes.saturating_sub(m.restore_bytes.get()));
            let before = m.restore_secs.get();
            if secs > before {
                m.restore_secs.inc_by(secs - before);
            }
        }
        let vocab = self.mi.vocab;
        let mut sampled = out.sampled.clone();
        for (row, ss) in step.seqs.iter().enumerate().take(step.real_seqs) {
            let Some(lv) = self.live.get(&ss.id).filter(|_| ss.samples) else { continue };
            let row_mask = if on_host { mask.as_ref().and_then(|mk| mk.row(row)) } else { None };
            if !(lv.host_sample || row_mask.is_some()) {
                continue;
            }
            let l = out.logits.as_ref().and_then(|l| l.get(row * vocab..(row + 1) * vocab));
            if let (Some(l), Some(slot)) = (l, sampled.get_mut(row)) {
                *slot = sample::sample_masked(l, row_mask, &lv.req.sampling, lv.seed, step.seq_lens[row] as u64) as i32;
            }
        }
        Ok(Ran { out, sampled, round })
    }

    // ------------------------------------------------------------------------------ commit

    /// The scheduler appends the tokens; the step's timing is recorded; host-tier stores start;
    /// each constraint advances by its tokens and starts computing its next mask.
    fn commit(&mut self, step: &Step, ran: &Ran) -> Result<Vec<SeqOutput>, Stop> {
        let outs = self.sched.commit(step, &ran.sampled);
        {
            // Prefill counts the tokens computed; decode the tokens generated (with drafts, a
            // step generates several per sequence).
            let mut ps = self.inner.phases.lock().unwrap_or_else(|p| p.into_inner());
            let (ph, n) = if step.is_decode() { (&mut ps.decode, outs.len()) } else { (&mut ps.prefill, step.real_tokens) };
            ph.steps += 1;
            ph.tokens += n as u64;
            ph.secs += ran.round.start.elapsed().as_secs_f64();
        }
        if self.cfg.record_steps {
            let mut ids: Vec<u64> = step.seqs.iter().map(|s| s.id).collect();
            ids.dedup();
            let rec = StepRecord {
                decode: step.is_decode(),
                rows: step.real_seqs,
                tokens: step.real_tokens,
                seqs: ids.len(),
                generated: outs.len(),
                context: step.seq_lens.iter().take(step.real_seqs).map(|&l| l.max(0) as usize).sum(),
                wall_ms: ran.round.start.elapsed().as_secs_f64() * 1e3,
                gpu_ms: self.model.last_gpu_ms().map(|g| g + ran.round.draft_gpu_ms),
                draft_steps: ran.round.draft_steps,
            };
            self.inner.records.lock().unwrap_or_else(|p| p.into_inner()).push(rec);
        }
        let stores = self.sched.take_stores();
        if !stores.is_empty() {
            self.model.store_pages(&stores).map_err(|e| Stop::Fatal(format!("copying KV pages to host memory: {e}")))?;
        }
        Ok(outs)
    }

    // -------------------------------------------------------------------------------- emit

    /// Each output token: its constraint advances, its text is detokenized and stop strings are
    /// matched, its event is sent; finished requests end. Constraints that advanced start their
    /// next masks first, so the mask threads work while this thread detokenizes.
    fn emit(&mut self, ran: &Ran, outs: Vec<SeqOutput>) {
        let mut complete: Vec<SeqId> = Vec::new();
        let mut failed: Vec<(SeqId, String)> = Vec::new();
        for o in &outs {
            let Some(c) = self.live.get_mut(&o.id).and_then(|lv| lv.constraint.as_mut()) else { continue };
            match c.commit(o.token) {
                Ok(Advance::Open) => {}
                Ok(Advance::Complete) => complete.push(o.id),
                Err(e) => failed.push((o.id, e)),
            }
        }
        for o in outs.iter().filter(|o| o.finished.is_none() && !complete.contains(&o.id)) {
            if let Some(c) = self.live.get_mut(&o.id).and_then(|lv| lv.constraint.as_mut()) {
                c.prefetch(&self.masks);
            }
        }
        for (id, e) in failed {
            self.fail_request(id, e);
        }
        let vocab = self.mi.vocab;
        let row_logits = |row: usize| ran.out.logits.as_ref().and_then(|l| l.get(row * vocab..(row + 1) * vocab));
        let now = Instant::now();
        let m = &self.inner.metrics;
        for o in outs {
            let Some(lv) = self.live.get_mut(&o.id) else { continue };
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
                    self.fail_request(o.id, format!("detokenizing token {}: {e}", o.token));
                    continue;
                }
            };
            let grammar_done = complete.contains(&o.id) && o.finished.is_none();
            let end = match (hit, o.finished) {
                (Some(s), _) => Some((FinishReason::Stop, Some(StopReason::Text(s)))),
                (None, Some(Finish::Stop)) => Some((FinishReason::Stop, lv.req.stop_token_ids.contains(&o.token).then_some(StopReason::Token(o.token)))),
                (None, Some(Finish::Length)) => Some((FinishReason::Length, None)),
                // The grammar allows nothing more: the output is complete.
                (None, None) if grammar_done => Some((FinishReason::Stop, None)),
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
                let lv = self.live.remove(&o.id).expect("present");
                self.seq_of.remove(&lv.id);
                self.sched.abort(o.id); // frees the pages of a stop-string finish (a no-op otherwise)
                self.finish(lv, reason, stop);
            }
        }
        if self.sched.preemptions() > self.preemptions {
            m.preemptions.inc_by(self.sched.preemptions() - self.preemptions);
            self.preemptions = self.sched.preemptions();
        }
        self.publish();
    }

    // ------------------------------------------------------------------------------- endings

    fn finish(&self, lv: Live, reason: FinishReason, stop: Option<StopReason>) {
        let m = &self.inner.metrics;
        m.e2e.observe(Instant::now().duration_since(lv.req.arrival).as_secs_f64());
        m.generation_len.observe(lv.generated as f64);
        m.finished(reason.as_str());
        self.inner.pending.fetch_sub(1, Ordering::Relaxed);
        lv.send(Event::Finished { reason, stop_reason: stop, prompt_tokens: lv.req.prompt.len(), completion_tokens: lv.generated, cached_tokens: lv.cached });
    }

    /// Fails one request (its pages are freed at once); the others go on.
    fn fail_request(&mut self, seq: SeqId, msg: String) {
        if let Some(lv) = self.live.remove(&seq) {
            self.seq_of.remove(&lv.id);
            self.sched.abort(seq);
            self.inner.pending.fetch_sub(1, Ordering::Relaxed);
            lv.send(Event::Failed(msg));
        }
    }

    /// Fails the engine (a step's failure is sticky), then every request in flight with `msg` —
    /// in that order, so a client that sees its request fail finds the engine failed too.
    fn fail_all(mut self, msg: String) {
        crate::engine::fail(self.inner, msg.clone());
        for (_, lv) in self.live.drain() {
            self.inner.pending.fetch_sub(1, Ordering::Relaxed);
            lv.send(Event::Failed(msg.clone()));
        }
    }

    fn publish(&self) {
        crate::engine::publish(self.inner, &self.sched);
    }
}
