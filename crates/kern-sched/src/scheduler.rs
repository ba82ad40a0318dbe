//! Continuous batching with chunked prefill, on-demand KV pages and preemption by recompute.
//!
//! Each step hands out at most `chunk` new tokens (the step's token budget, vLLM's
//! `max_num_batched_tokens`) to at most `max_seqs` sequences:
//!
//! 1. Running sequences first, oldest first — every decode token before any prefill chunk, so a
//!    long prompt never delays the tokens of sequences already streaming. Each sequence gets the
//!    pages for the tokens it computes *in this step* only (pages are allocated on demand as a
//!    sequence grows, not for its whole budget at admission). When the pool runs dry, the
//!    newest running sequence not yet placed in this step is **preempted**: its pages are
//!    freed, its computed length drops to zero, and it goes back to the *front* of the queue.
//!    Its tokens (prompt and everything generated so far) are kept, so when it is resumed its
//!    whole context is prefilled again and it continues where it stopped — with the same
//!    output, since sampling draws from the stream (seed, position).
//! 2. Then, only if nothing was preempted in this step, waiting sequences in arrival order
//!    (FCFS), each while its first chunk's pages are free and the budgets allow.
//!
//! Finished and aborted sequences free their pages at once. Every id that was added is
//! eventually reported finished (by `commit`) or removed by `abort`: none is lost or
//! duplicated (property-tested below).

use crate::blocks::{BlockManager, CacheStats, PageHash};
use crate::step::{SeqView, Step};
use std::collections::VecDeque;

pub type SeqId = u64;

/// Per-sequence generation parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    pub seed: u64,
    /// New tokens to generate at most.
    pub max_tokens: usize,
    /// Token ids that end the sequence (EOS); ignored with `ignore_eos`.
    pub stop: Vec<u32>,
    pub ignore_eos: bool,
    /// Token ids that end the sequence even with `ignore_eos` (a request's `stop_token_ids`).
    pub stop_always: Vec<u32>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, max_tokens: 16, stop: vec![], ignore_eos: false, stop_always: vec![] }
    }
}

/// Speculative decoding with prompt-lookup (n-gram) drafts.
///
/// A decoding sequence whose last tokens occurred earlier gets up to `k` draft tokens; the step
/// computes its last token and the drafts as `k + 1` rows (each row one position, all sharing the
/// sequence's pages, so row j attends over the drafts before it) and samples each row. Row j's
/// sample is what the target would generate after the first j drafts; drafts are accepted while
/// they equal the previous row's sample. Because the draft is deterministic, this is exactly the
/// speculative rejection rule (accept draft d with probability p(d), else emit a sample of p
/// without d), and since every row samples from the stream (seed, position), the output is
/// token-for-token what decoding without drafts gives — greedy or sampled.
///
/// With [`Drafter::Program`] the drafts come from a draft program instead (a small model, or
/// the first layers of the target, with its own per-token state such as `draft_kv`): the engine
/// runs the draft steps that [`Scheduler::draft_begin`] and [`Scheduler::draft_advance`] build
/// (greedy, so drafts are again deterministic and the same rule is exact), then `schedule`
/// verifies what they proposed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// Most draft tokens per sequence and step.
    pub k: usize,
    /// Shortest and longest n-gram looked up (n-gram drafts).
    pub min_n: usize,
    pub max_n: usize,
    /// Where drafts come from.
    pub drafter: Drafter,
}

impl SpecConfig {
    /// Prompt-lookup drafts of up to `k` tokens, matching 2- to 4-grams.
    pub fn ngram(k: usize) -> SpecConfig {
        SpecConfig { k, min_n: 2, max_n: 4, drafter: Drafter::Ngram }
    }

    /// Drafts of up to `k` tokens from the manifest's draft program.
    pub fn program(k: usize) -> SpecConfig {
        SpecConfig { k, min_n: 0, max_n: 0, drafter: Drafter::Program }
    }
}

/// The source of draft tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Drafter {
    /// Prompt lookup ([`crate::ngram`]): no model.
    #[default]
    Ngram,
    /// A draft program run by the engine through [`Scheduler::draft_begin`] /
    /// [`Scheduler::draft_advance`].
    Program,
}

/// Counters of speculative decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Sequence-steps that verified drafts.
    pub drafts: u64,
    /// Draft tokens proposed.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// Steps of the draft program run (draft-program drafting only).
    pub draft_steps: u64,
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most new tokens per step (the `tokens` var's max, or less for smaller prefill chunks).
    pub chunk: usize,
    /// Most sequences per step and running at once (the `seqs` var's max, or less).
    pub max_seqs: usize,
    /// Longest context of a sequence (pages var max × page tokens, or less).
    pub max_context: usize,
    /// Block-table row length (the `pages` var's max).
    pub pages_per_seq: usize,
    /// Speculative decoding with n-gram drafts (None: off).
    pub spec: Option<SpecConfig>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` were generated, or the context is full.
    Length,
}

/// One sequence's result of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqOutput {
    pub id: SeqId,
    /// The generated token.
    pub token: u32,
    /// Row of this sequence in the step's `[seqs, …]` outputs (sampled, logits).
    pub row: usize,
    pub finished: Option<Finish>,
}

/// Why a request was refused by [`Scheduler::add`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoTokens,
    /// The prompt alone does not fit the context.
    #[error("this model's maximum context length is {max_context} tokens, but the prompt has {prompt} tokens: shorten the prompt")]
    PromptTooLong { prompt: usize, max_context: usize },
    /// Prompt + max_tokens do not fit the context.
    #[error("the prompt has {prompt} tokens and up to {max_tokens} more are asked for ({} in all), above this model's maximum context length of {max_context} tokens: lower max_tokens to at most {} or shorten the prompt", prompt + max_tokens, max_context - prompt)]
    TooLong { prompt: usize, max_tokens: usize, max_context: usize },
    /// The sequence could never fit the KV pool, even alone.
    #[error("this request needs {needed} KV pages, the pool has {total} in all: give kern more GPU memory or ask for fewer tokens")]
    PoolTooSmall { needed: usize, total: usize },
}

/// What a request must fit: checked by [`Scheduler::add`], and by a server before it queues a
/// request (so it can answer at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_context: usize,
    pub total_pages: usize,
    pub page_tokens: usize,
}

impl Limits {
    pub fn check(&self, prompt: usize, max_tokens: usize) -> Result<(), AddError> {
        if prompt == 0 {
            return Err(AddError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(AddError::NoTokens);
        }
        let max_context = self.max_context;
        if prompt >= max_context {
            return Err(AddError::PromptTooLong { prompt, max_context });
        }
        if prompt + max_tokens > max_context {
            return Err(AddError::TooLong { prompt, max_tokens, max_context });
        }
        let needed = (prompt + max_tokens).div_ceil(self.page_tokens);
        if needed > self.total_pages {
            return Err(AddError::PoolTooSmall { needed, total: self.total_pages });
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Seq {
    id: SeqId,
    tokens: Vec<u32>,
    /// Tokens whose KV is in the cache.
    computed: usize,
    generated: usize,
    pages: Vec<u32>,
    /// The canonical page and hash of each cached-or-registered full page, in order (a prefix
    /// of `pages`' length).
    chain: Vec<(u32, PageHash)>,
    /// The sequence's slot in the per-sequence state pools while it runs.
    slot: Option<u32>,
    params: SamplingParams,
    /// Tokens whose draft-program state (e.g. `draft_kv`) is written, at the right positions
    /// and with the right tokens (draft-program drafting only). Between a draft round and its
    /// verify step it can be one more than `computed` (the draft has read the last token).
    draft_computed: usize,
    /// Drafts the draft program proposed for the sequence at `tokens.len() == proposed_at`.
    proposed: Vec<u32>,
    proposed_at: usize,
    /// Tokens known when the sequence was last admitted (its prompt, or everything it had when
    /// resumed after a preemption): the rows within them are prefill rows, whose page-boundary
    /// states are snapshotted.
    prefill_end: usize,
    /// With snapshots: where the sequence's prompt branches off a cached prefix that has no
    /// snapshot there (0: nowhere) — a prefill chunk stops there, so the next prompt sharing the
    /// same prefix finds a snapshot at its end.
    branch: usize,
}

impl Seq {
    fn left(&self) -> usize {
        self.tokens.len() - self.computed
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    blocks: BlockManager,
    waiting: VecDeque<Seq>,
    /// In admission order: the last is the newest (the first preempted).
    running: Vec<Seq>,
    next_id: SeqId,
    preemptions: u64,
    /// Free per-sequence slots (one per sequence that can run at once), lowest first.
    free_slots: Vec<u32>,
    /// Drafts of the step last scheduled, by sequence.
    pending_drafts: std::collections::HashMap<SeqId, Vec<u32>>,
    spec_stats: SpecStats,
    /// The draft round in progress (between `draft_begin` and the last `draft_advance`).
    round: Vec<RoundSeq>,
    /// Snapshot saves of the step last scheduled: (sequence, row end, snapshot slot), attached
    /// to the page ending at the row's end when the step is committed.
    pending_saves: Vec<(SeqId, usize, u32)>,
}

/// One sequence of a draft round.
#[derive(Clone, Debug)]
struct RoundSeq {
    id: SeqId,
    /// Position of the sequence's last token (its `computed` when the round began).
    last: usize,
    /// Drafts wanted.
    room: usize,
    /// Rows of this sequence in the draft step being run.
    rows: usize,
    /// First position of the draft-state catch-up in the first step.
    start: usize,
    /// Tokens of draft-state catch-up in the first step (positions `start..`).
    catch_up: usize,
    /// Whether the catch-up is partial (the draft-step budget ran out): no drafts this round.
    partial: bool,
    /// Dropped from the round (aborted while it ran).
    gone: bool,
}

/// Catch-ups of at most this many tokens run as one-token rows (decode-shaped, so the draft
/// step replays a CUDA graph); longer ones (after a prompt) as one varlen row.
const CATCH_UP_ROWS: usize = 4;

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        assert!(cfg.chunk > 0 && cfg.max_seqs > 0, "step budgets must be positive");
        let free_slots = (0..cfg.max_seqs as u32).rev().collect();
        assert!(!(blocks.snapshots() && cfg.spec.is_some()), "speculative decoding cannot roll back a per-sequence state: the engine refuses it");
        Scheduler { cfg, blocks, waiting: VecDeque::new(), running: Vec::new(), next_id: 0, preemptions: 0, free_slots, pending_drafts: Default::default(), spec_stats: SpecStats::default(), round: Vec::new(), pending_saves: Vec::new() }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The longest context a sequence may reach (prompt + generated tokens).
    pub fn max_context(&self) -> usize {
        self.cfg.max_context.min(self.cfg.pages_per_seq * self.blocks.page_tokens())
    }

    /// The limits [`Scheduler::add`] checks a request against.
    pub fn limits(&self) -> Limits {
        Limits { max_context: self.max_context(), total_pages: self.blocks.total_pages(), page_tokens: self.blocks.page_tokens() }
    }

    /// Queues a request; errors say what does not fit.
    pub fn add(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<SeqId, AddError> {
        self.limits().check(prompt.len(), params.max_tokens)?;
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Seq { id, tokens: prompt, computed: 0, generated: 0, pages: Vec::new(), chain: Vec::new(), slot: None, params, draft_computed: 0, proposed: Vec::new(), proposed_at: 0, prefill_end: 0, branch: 0 });
        Ok(id)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Sequences admitted and not finished (they hold KV pages, unless just preempted).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Sequences queued: new ones and preempted ones.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    pub fn free_pages(&self) -> usize {
        self.blocks.free_pages()
    }

    pub fn total_pages(&self) -> usize {
        self.blocks.total_pages()
    }

    pub fn page_tokens(&self) -> usize {
        self.blocks.page_tokens()
    }

    /// Pages held by running sequences.
    pub fn used_pages(&self) -> usize {
        self.running.iter().map(|s| s.pages.len()).sum()
    }

    /// Removes a sequence wherever it is (queued or running) and frees its pages at once.
    /// Returns false for an id that is not (or no longer) here; aborting twice is harmless.
    pub fn abort(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let mut s = self.waiting.remove(i).expect("index from position");
            self.blocks.release(&mut s.pages);
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut s = self.running.remove(i);
            self.blocks.release(&mut s.pages);
            self.free_slots.extend(s.slot.take());
            return true;
        }
        false
    }

    /// Frees the newest running sequence that is not in `keep` and puts it at the front of the
    /// queue; None when every running sequence is kept.
    fn preempt_newest(&mut self, keep: &[SeqId]) -> Option<SeqId> {
        let i = self.running.iter().rposition(|s| !keep.contains(&s.id))?;
        let mut s = self.running.remove(i);
        self.blocks.release(&mut s.pages);
        self.free_slots.extend(s.slot.take());
        s.chain.clear();
        s.computed = 0;
        s.draft_computed = 0;
        s.proposed.clear();
        self.preemptions += 1;
        let id = s.id;
        self.waiting.push_front(s);
        Some(id)
    }

    /// The next step's work, padded by `pad(real_tokens, real_seqs, decode) -> (tokens, seqs)`;
    /// None when nothing can run.
    pub fn schedule(&mut self, pad: impl Fn(usize, usize, bool) -> (usize, usize)) -> Option<Step> {
        // Saves of a step that was never committed: their rows did not run.
        for (_, _, slot) in std::mem::take(&mut self.pending_saves) {
            self.blocks.cancel_snapshot(slot);
        }
        let mut restores: Vec<(u32, u32)> = Vec::new();
        let mut budget = self.cfg.chunk;
        let mut picked: Vec<(SeqId, usize)> = Vec::new();
        let mut preempted = false;
        // Step rows in use: one per sequence, plus one per draft token.
        let mut rows_used = 0;
        let mut drafts: std::collections::HashMap<SeqId, Vec<u32>> = Default::default();
        let max_context = self.max_context();
        // Running sequences: decode tokens first, then prefill chunks (recomputes included).
        let order: Vec<SeqId> = {
            let decodes = self.running.iter().filter(|s| s.left() == 1).map(|s| s.id);
            let prefills = self.running.iter().filter(|s| s.left() > 1).map(|s| s.id);
            decodes.chain(prefills).collect()
        };
        for id in order {
            if rows_used == self.cfg.max_seqs || budget == 0 {
                break;
            }
            let mut draft_ok = true;
            // Until it fits, or is preempted itself (then it is no longer running).
            while let Some(i) = self.running.iter().position(|s| s.id == id) {
                let s = &mut self.running[i];
                let n = chunk_len(&self.blocks, s.computed, s.left().min(budget), s.prefill_end, s.branch);
                let mut draft = Vec::new();
                if let (1, Some(sp), true) = (n, &self.cfg.spec, draft_ok) {
                    let room = sp
                        .k
                        .min(budget - 1)
                        .min(self.cfg.max_seqs - rows_used - 1)
                        .min(s.params.max_tokens.saturating_sub(s.generated + 1))
                        .min(max_context.saturating_sub(s.tokens.len() + 1));
                    draft = match sp.drafter {
                        Drafter::Ngram => crate::ngram::propose(&s.tokens, room, sp.min_n, sp.max_n),
                        Drafter::Program if s.proposed_at == s.tokens.len() => s.proposed.iter().copied().take(room).collect(),
                        Drafter::Program => Vec::new(),
                    };
                }
                if self.blocks.ensure(&mut s.pages, s.computed + n + draft.len()).is_ok() {
                    picked.push((id, n));
                    budget -= n + draft.len();
                    rows_used += 1 + draft.len();
                    if !draft.is_empty() {
                        drafts.insert(id, draft);
                    }
                    break;
                }
                if !draft.is_empty() {
                    draft_ok = false; // try again without drafts before preempting anyone
                    continue;
                }
                let keep: Vec<SeqId> = picked.iter().map(|p| p.0).collect();
                preempted = true;
                if self.preempt_newest(&keep).is_none() {
                    break;
                }
            }
        }
        // Waiting sequences, in order, unless the pool just ran dry. Each first takes the
        // longest cached run of its full pages (never its last token: its logits must be
        // computed), then pages for its first chunk.
        while !preempted && self.running.len() < self.cfg.max_seqs && rows_used < self.cfg.max_seqs && budget > 0 {
            let Some(front) = self.waiting.front_mut() else { break };
            let pt = self.blocks.page_tokens();
            let (hit, hashes) = self.blocks.lookup(&front.tokens, (front.tokens.len() - 1) / pt);
            let cached = hit.len() * pt;
            front.pages = hit;
            front.chain = front.pages.iter().copied().zip(hashes).collect();
            front.computed = cached;
            // Cached pages hold every per-token state, the draft program's included.
            front.draft_computed = cached;
            front.prefill_end = front.tokens.len();
            front.branch = if self.blocks.snapshots() { self.blocks.last_match_pages() * pt } else { 0 };
            let n = chunk_len(&self.blocks, cached, front.left().min(budget), front.prefill_end, front.branch);
            if self.blocks.ensure(&mut front.pages, cached + n).is_err() {
                // Give the hits back; try again after pages are freed.
                self.blocks.release(&mut front.pages);
                front.chain.clear();
                front.computed = 0;
                front.draft_computed = 0;
                break;
            }
            self.blocks.record(front.tokens.len(), cached);
            let mut s = self.waiting.pop_front().expect("front exists");
            let slot = self.free_slots.pop().expect("a slot per running sequence");
            s.slot = Some(slot);
            if let Some(&(last, _)) = s.chain.last().filter(|_| self.blocks.snapshots()) {
                // The hit ends at a page with a snapshot (lookup truncates to one): the state
                // after exactly `cached` tokens goes into the sequence's slot before the step.
                let snap = self.blocks.snapshot_of(last).expect("a hit with snapshots ends at a snapshot");
                restores.push((snap, slot));
                self.blocks.record_snapshot_restore();
            }
            picked.push((s.id, n));
            budget -= n;
            rows_used += 1;
            self.running.push(s);
        }
        if picked.is_empty() {
            return None;
        }
        // Batch rows in admission order; a sequence with drafts takes one row per position.
        let mut rows: Vec<(usize, usize)> = picked.iter().map(|&(id, n)| (self.running.iter().position(|s| s.id == id).expect("picked is running"), n)).collect();
        rows.sort_by_key(|&(i, _)| i);
        // A sequence with drafts: its last token (position `computed`) and the drafts.
        let tails: Vec<Option<Vec<u32>>> = rows
            .iter()
            .map(|&(i, _)| {
                let s = &self.running[i];
                drafts.get(&s.id).map(|d| s.tokens[s.computed..].iter().chain(d).copied().collect())
            })
            .collect();
        let mut views: Vec<SeqView> = Vec::new();
        for (&(i, n), tail) in rows.iter().zip(&tails) {
            let s = &self.running[i];
            match tail {
                Some(t) => views.extend((0..t.len()).map(|j| seq_view(s, t, s.computed, s.computed + j, 1, true))),
                None => views.push(seq_view(s, &s.tokens, 0, s.computed, n, s.computed + n == s.tokens.len())),
            }
        }
        let real_tokens = views.iter().map(|v| v.n).sum();
        let decode = views.iter().all(|v| v.n == 1);
        let (tp, sp) = pad(real_tokens, views.len(), decode);
        let mut step = Step::build(&views, tp, sp, self.cfg.pages_per_seq, self.blocks.page_tokens());
        step.snapshot_restores = restores;
        if self.blocks.snapshots() {
            let pt = self.blocks.page_tokens();
            for &(i, n) in &rows {
                let s = &self.running[i];
                let end = s.computed + n;
                // A prefill row that ends at a page boundary whose page has no snapshot yet.
                if drafts.contains_key(&s.id) || !end.is_multiple_of(pt) || end == 0 || end > s.prefill_end {
                    continue;
                }
                let mut h = s.chain.last().map(|c| c.1);
                for page in s.chain.len()..end / pt {
                    h = Some(crate::blocks::page_hash(h, &s.tokens[page * pt..(page + 1) * pt]));
                }
                if h.is_some_and(|h| self.blocks.has_snapshot(h)) {
                    continue;
                }
                let Some(snap) = self.blocks.reserve_snapshot() else { break };
                step.snapshot_saves.push((s.slot.expect("a running sequence has a slot"), snap));
                self.pending_saves.push((s.id, end, snap));
            }
        }
        self.pending_drafts = drafts;
        Some(step)
    }

    /// Applies a step's sampled ids (one per step row); returns the new tokens. Sequences that
    /// finish release their pages. Rows of sequences aborted since the step was built are
    /// skipped.
    pub fn commit(&mut self, step: &Step, sampled: &[i32]) -> Vec<SeqOutput> {
        let mut out = Vec::new();
        let blocks_pt = self.blocks.page_tokens();
        let max_context = self.max_context();
        let program = self.drafts_from_program();
        let drafts = std::mem::take(&mut self.pending_drafts);
        let saves = std::mem::take(&mut self.pending_saves);
        // Sequences whose row of this step was applied.
        let mut applied: Vec<SeqId> = Vec::new();
        let mut row = 0;
        while row < step.seqs.len() {
            let ss = &step.seqs[row];
            let draft = drafts.get(&ss.id);
            let first = row;
            row += draft.map_or(1, |d| d.len() + 1);
            let Some(s) = self.running.iter_mut().find(|s| s.id == ss.id) else { continue };
            if s.computed != ss.start {
                continue; // preempted and re-admitted since: this row is stale
            }
            applied.push(s.id);
            // Tokens this sequence emits: one per row, while drafts are accepted.
            let emit: Vec<(usize, Option<u32>)> = match draft {
                None if !ss.samples => {
                    s.computed += ss.n;
                    vec![]
                }
                None => {
                    s.computed += ss.n - 1; // the last one is counted with its token below
                    vec![(first, None)]
                }
                Some(d) => {
                    self.spec_stats.drafts += 1;
                    self.spec_stats.draft_tokens += d.len() as u64;
                    (0..=d.len()).map(|j| (first + j, d.get(j).copied())).collect()
                }
            };
            if emit.is_empty() {
                // A partial prefill: register the pages it filled.
                register_full_pages(&mut self.blocks, s, blocks_pt, program);
                continue;
            }
            let emitted_before = s.generated;
            for (k, &(r, next_draft)) in emit.iter().enumerate() {
                let token = sampled.get(r).copied().unwrap_or(0).max(0) as u32;
                s.computed += 1;
                s.tokens.push(token);
                s.generated += 1;
                if k > 0 {
                    self.spec_stats.accepted_tokens += 1;
                }
                let p = &s.params;
                let finished = if p.stop_always.contains(&token) || (!p.ignore_eos && p.stop.contains(&token)) {
                    Some(Finish::Stop)
                } else if s.generated >= p.max_tokens || s.tokens.len() >= max_context {
                    Some(Finish::Length)
                } else {
                    None
                };
                out.push(SeqOutput { id: s.id, token, row: r, finished });
                if finished.is_some() || next_draft != Some(token) {
                    break;
                }
            }
            if let (true, Some(_)) = (program, draft) {
                // The draft program wrote its state for positions `last + 1 ..` with the drafts it
                // read (all but its last proposal); those accepted are now the sequence's tokens.
                let emitted = s.generated - emitted_before;
                if s.draft_computed == ss.start + 1 && emitted > 0 {
                    let read = s.proposed.len().saturating_sub(1);
                    s.draft_computed += (emitted - 1).min(read);
                }
                s.proposed.clear();
            }
            register_full_pages(&mut self.blocks, s, blocks_pt, program);
            if draft.is_some() {
                // Pages taken for rejected drafts go back.
                let keep = self.blocks.pages_for(s.tokens.len());
                self.blocks.truncate(&mut s.pages, keep);
            }
        }
        // Each save the step made is attached to the cached page that ends where its row ended
        // (the canonical page of the sequence's chain there); otherwise its slot is freed.
        let pt = blocks_pt;
        for (id, end, snap) in saves {
            let page = self.running.iter().find(|s| s.id == id).filter(|s| applied.contains(&s.id) && s.computed >= end).and_then(|s| s.chain.get(end / pt - 1)).copied();
            match page {
                Some((p, hash)) => {
                    self.blocks.attach_snapshot(snap, p, hash);
                }
                None => self.blocks.cancel_snapshot(snap),
            }
        }
        let (blocks, slots) = (&mut self.blocks, &mut self.free_slots);
        self.running.retain_mut(|s| {
            let done = out.iter().any(|o| o.id == s.id && o.finished.is_some());
            if done {
                blocks.release(&mut s.pages);
                slots.extend(s.slot.take());
            }
            !done
        });
        out
    }

    /// Checks the page accounting: each page's reference count is the number of running
    /// sequences holding it, free pages are referenced by none, each running sequence holds the
    /// pages its computed tokens need, queued ones hold none, and the pool's own lists agree.
    /// Panics naming the broken rule; for tests and debug builds.
    pub fn check_invariants(&self) {
        self.blocks.check();
        let mut refs = vec![0u32; self.blocks.total_pages()];
        for s in &self.running {
            assert!(s.pages.len() >= self.blocks.pages_for(s.computed), "sequence {} computed {} tokens on {} pages", s.id, s.computed, s.pages.len());
            let mut seen = std::collections::HashSet::new();
            for p in &s.pages {
                assert!(seen.insert(*p), "sequence {} holds page {p} twice", s.id);
                refs[*p as usize] += 1;
            }
        }
        for (p, &r) in refs.iter().enumerate() {
            assert_eq!(r, self.blocks.refs(p as u32), "page {p}: {r} running sequences hold it, its count says {}", self.blocks.refs(p as u32));
        }
        for s in &self.waiting {
            assert!(s.pages.is_empty() && s.computed == 0 && s.slot.is_none(), "queued sequence {} holds pages or a slot", s.id);
        }
        if self.drafts_from_program() {
            for s in &self.running {
                assert!(s.draft_computed <= (s.computed + 1).min(s.tokens.len()), "sequence {}: draft state of {} tokens, {} computed", s.id, s.draft_computed, s.computed);
                let registered = s.chain.len() * self.blocks.page_tokens();
                assert!(registered <= s.draft_computed, "sequence {}: {registered} tokens of pages cached, draft state of only {}", s.id, s.draft_computed);
            }
        }
        assert_eq!(self.blocks.reserved_snapshots(), self.pending_saves.len(), "every reserved snapshot slot belongs to a save of the step in flight");
        let mut slots: Vec<u32> = self.running.iter().map(|s| s.slot.expect("a running sequence has a slot")).chain(self.free_slots.iter().copied()).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..self.cfg.max_seqs as u32).collect::<Vec<_>>(), "every slot is free or held by exactly one running sequence");
    }

    /// Page copies to the host tier to make after the step just committed: `(gpu page, host slot)`.
    pub fn take_stores(&mut self) -> Vec<(u32, u32)> {
        self.blocks.take_stores()
    }

    /// Page copies from the host tier to make before the step just scheduled: `(host slot, gpu page)`.
    pub fn take_restores(&mut self) -> Vec<(u32, u32)> {
        self.blocks.take_restores()
    }

    /// Pages holding a cached prefix (in use or free).
    pub fn cached_pages(&self) -> usize {
        self.blocks.cached_pages()
    }

    fn drafts_from_program(&self) -> bool {
        self.cfg.spec.as_ref().is_some_and(|sp| sp.drafter == Drafter::Program)
    }

    /// The first step of a draft round (draft-program drafting), or None when no sequence drafts
    /// now. Every decoding sequence that may get drafts first catches its draft state up to its
    /// last token (usually that token alone, or two after a round whose drafts were all
    /// accepted; a whole prompt after prefill — in varlen rows within the token budget), and the
    /// row of its last token proposes the first draft. Pages for the drafts and their
    /// verification are taken now; the verify step leaves rows and tokens for them. Rows are
    /// greedy (drafts must be deterministic for the acceptance rule to be exact).
    pub fn draft_begin(&mut self, pad: impl Fn(usize, usize, bool) -> (usize, usize)) -> Option<Step> {
        let k = self.cfg.spec.as_ref().filter(|sp| sp.drafter == Drafter::Program)?.k;
        self.round.clear();
        let max_context = self.max_context();
        // The verify step's budgets (one row per position) and the draft step's own.
        let (mut rows_left, mut budget) = (self.cfg.max_seqs, self.cfg.chunk);
        let (mut d_rows, mut d_tokens) = (self.cfg.max_seqs, self.cfg.chunk);
        for s in self.running.iter_mut() {
            s.proposed.clear();
            if s.left() != 1 {
                continue;
            }
            if rows_left < 2 || budget < 2 || d_rows == 0 || d_tokens == 0 {
                break;
            }
            let room = k
                .min(rows_left - 1)
                .min(budget - 1)
                .min(s.params.max_tokens.saturating_sub(s.generated + 1))
                .min(max_context.saturating_sub(s.tokens.len() + 1));
            if room == 0 {
                continue;
            }
            // At least the last token: its row proposes the first draft (when a round's drafts
            // went unverified, it is read again — the same token at the same position).
            let start = s.draft_computed.min(s.tokens.len() - 1);
            let catch_up = s.tokens.len() - start;
            // The draft state must hold what the target's state holds, bit for bit, or a self
            // draft's near-ties flip. The target computed the prompt prefill-shaped and every
            // generated token decode-shaped, so the draft does too: the prompt's part as one
            // varlen row ending at the prompt (partial: the generated tokens follow next round),
            // the generated tokens as one-token rows.
            let prompt_end = s.tokens.len() - s.generated;
            let (rows, n, partial) = if start < prompt_end && catch_up > 1 {
                let n = (prompt_end - start).min(d_tokens);
                (1, n, n < catch_up)
            } else if catch_up <= CATCH_UP_ROWS.min(d_rows).min(d_tokens) {
                (catch_up, catch_up, false)
            } else {
                let n = catch_up.min(d_tokens);
                (1, n, n < catch_up)
            };
            // Pages through the last verified position (`tokens.len() - 1 + room`).
            if self.blocks.ensure(&mut s.pages, s.tokens.len() + room).is_err() {
                continue;
            }
            d_rows -= rows;
            d_tokens -= n;
            if !partial {
                rows_left -= 1 + room;
                budget -= 1 + room;
            }
            self.round.push(RoundSeq { id: s.id, last: s.tokens.len() - 1, room, rows, start, catch_up: n, partial, gone: false });
        }
        if self.round.is_empty() {
            return None;
        }
        let mut views = Vec::new();
        for r in &self.round {
            let s = self.running.iter().find(|s| s.id == r.id).expect("round sequences run");
            let start = r.start;
            if r.rows == r.catch_up {
                views.extend((start..start + r.catch_up).map(|p| draft_view(s, &s.tokens, 0, p, 1, p == r.last)));
            } else {
                views.push(draft_view(s, &s.tokens, 0, start, r.catch_up, !r.partial));
            }
        }
        Some(self.build_draft_step(&views, pad))
    }

    /// Takes a draft step's sampled ids (one per row) and returns the next draft step, or None
    /// when the round is over (the drafts then wait for [`Scheduler::schedule`] to verify them).
    pub fn draft_advance(&mut self, step: &Step, sampled: &[i32], pad: impl Fn(usize, usize, bool) -> (usize, usize)) -> Option<Step> {
        self.spec_stats.draft_steps += 1;
        let pt = self.blocks.page_tokens();
        let mut row = 0;
        for r in self.round.iter_mut() {
            let rows = r.rows;
            let sample_row = row + rows - 1;
            row += rows;
            if r.gone {
                continue;
            }
            let Some(s) = self.running.iter_mut().find(|s| s.id == r.id) else {
                r.gone = true; // aborted since
                continue;
            };
            if s.tokens.len() != r.last + 1 {
                r.gone = true;
                continue;
            }
            if s.proposed.is_empty() {
                // The first step: the catch-up is written.
                s.draft_computed = r.start + r.catch_up;
                register_full_pages(&mut self.blocks, s, pt, true);
                if r.partial {
                    r.gone = true;
                    continue;
                }
            }
            s.proposed.push(sampled.get(sample_row).copied().unwrap_or(0).max(0) as u32);
            s.proposed_at = s.tokens.len();
            if s.proposed.len() >= r.room {
                r.gone = true;
            }
        }
        debug_assert_eq!(row, step.real_seqs, "one sampled id per draft row");
        self.round.retain(|r| !r.gone);
        if self.round.is_empty() {
            return None;
        }
        // Each sequence reads its newest draft at the position after the previous one.
        for r in self.round.iter_mut() {
            r.rows = 1;
        }
        let views: Vec<SeqView> = self
            .round
            .iter()
            .map(|r| {
                let s = self.running.iter().find(|s| s.id == r.id).expect("round sequences run");
                let newest = s.proposed.len() - 1;
                let at = s.tokens.len() + newest;
                draft_view(s, &s.proposed[newest..], at, at, 1, true)
            })
            .collect();
        Some(self.build_draft_step(&views, pad))
    }

    fn build_draft_step(&self, views: &[SeqView], pad: impl Fn(usize, usize, bool) -> (usize, usize)) -> Step {
        let real_tokens = views.iter().map(|v| v.n).sum();
        let decode = views.iter().all(|v| v.n == 1);
        let (tp, sp) = pad(real_tokens, views.len(), decode);
        Step::build(views, tp, sp, self.cfg.pages_per_seq, self.blocks.page_tokens())
    }

    /// Speculative decoding counters.
    pub fn spec_stats(&self) -> SpecStats {
        self.spec_stats
    }

    /// Prefix-cache counters (tokens queried and hit at admission, pages evicted).
    pub fn cache_stats(&self) -> CacheStats {
        self.blocks.stats()
    }
}

/// One row of a step: `n` tokens from position `start`, with `s`'s pages and parameters;
/// `tokens` holds the sequence's tokens from position `offset` on.
fn seq_view<'a>(s: &'a Seq, tokens: &'a [u32], offset: usize, start: usize, n: usize, samples: bool) -> SeqView<'a> {
    debug_assert!(offset <= start && start + n <= offset + tokens.len(), "the row's tokens are in `tokens`");
    SeqView {
        id: s.id,
        tokens,
        offset,
        pages: &s.pages,
        start,
        n,
        samples,
        slot: s.slot.expect("a running sequence has a slot"),
        temperature: s.params.temperature,
        top_k: s.params.top_k,
        top_p: s.params.top_p,
        seed: s.params.seed,
    }
}

/// How many of the `n` tokens the budget allows from `start` a prefill chunk takes. Without
/// snapshots, all. With snapshots (per-sequence states), chunks end at page boundaries so that
/// the state there can be saved: a chunk that would cross the deepest page boundary before the
/// known tokens' end (`prefill_end`; the deepest point a later identical prompt can hit) — or
/// the point where the prompt branches off a cached prefix without a snapshot there (`branch`),
/// or, with a snapshot interval, the next multiple of it — stops there; a chunk that stops short
/// of the end is cut back to the last page boundary it crosses (unless that leaves nothing:
/// then it runs unaligned, and the next chunk aligns). A decode row (one token past the known
/// ones) is never cut.
fn chunk_len(blocks: &BlockManager, start: usize, n: usize, prefill_end: usize, branch: usize) -> usize {
    if !blocks.snapshots() || start >= prefill_end {
        return n;
    }
    let pt = blocks.page_tokens();
    let end = start + n;
    let last = (prefill_end - 1) / pt * pt;
    let every = blocks.snapshot_interval_tokens();
    let mut stop = start.checked_div(every).map_or(last, |k| ((k + 1) * every).min(last));
    if branch > start {
        stop = stop.min(branch);
    }
    if start < stop && end > stop {
        return stop - start;
    }
    if end < prefill_end {
        let b = end / pt * pt;
        if b > start {
            return b - start;
        }
    }
    n
}

/// A draft-program row: like [`seq_view`], but greedy.
fn draft_view<'a>(s: &'a Seq, tokens: &'a [u32], offset: usize, start: usize, n: usize, samples: bool) -> SeqView<'a> {
    SeqView { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, ..seq_view(s, tokens, offset, start, n, samples) }
}

/// Caches the pages a sequence has filled completely (computed tokens — and with a draft
/// program, tokens whose draft state is written too: a cached page holds every per-token state)
/// and not cached yet.
fn register_full_pages(blocks: &mut BlockManager, s: &mut Seq, pt: usize, draft_program: bool) {
    let done = if draft_program { s.computed.min(s.draft_computed) } else { s.computed };
    while s.chain.len() < done / pt {
        let i = s.chain.len();
        let parent = i.checked_sub(1).map(|j| s.chain[j]);
        let c = blocks.register(s.pages[i], parent, &s.tokens[i * pt..(i + 1) * pt]);
        s.chain.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(chunk: usize, max_seqs: usize, pages: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 1024, pages_per_seq: 64, spec: None }, BlockManager::new(pages, 16))
    }

    fn no_pad(t: usize, s: usize, _: bool) -> (usize, usize) {
        (t, s)
    }

    #[test]
    fn chunked_prefill_then_batched_decode() {
        let mut s = sched(8, 4, 64);
        let a = s.add((0..20).collect(), SamplingParams { max_tokens: 3, ..Default::default() }).unwrap();
        let b = s.add(vec![7, 8, 9], SamplingParams { max_tokens: 2, ..Default::default() }).unwrap();
        // Step 1: 8 tokens of a's prompt (chunk), nothing of b (budget spent).
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(st.seqs.len(), 1);
        assert_eq!((st.seqs[0].id, st.seqs[0].start, st.seqs[0].n, st.seqs[0].samples), (a, 0, 8, false));
        assert!(s.commit(&st, &[99]).is_empty(), "a partial prefill samples nothing");
        // Step 2: 8 more of a.
        let st = s.schedule(no_pad).unwrap();
        assert_eq!((st.seqs[0].start, st.seqs[0].n), (8, 8));
        s.commit(&st, &[99]);
        // Step 3: a's last 4 prompt tokens + b's 3 prompt tokens: both sample.
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(st.seqs.iter().map(|q| (q.id, q.n, q.samples)).collect::<Vec<_>>(), vec![(a, 4, true), (b, 3, true)]);
        assert_eq!(st.query_start, vec![0, 4, 7]);
        assert_eq!(st.last_token, vec![3, 6]);
        assert_eq!(st.seq_lens, vec![20, 3]);
        let out = s.commit(&st, &[100, 200]);
        assert_eq!(out.iter().map(|o| (o.id, o.token)).collect::<Vec<_>>(), vec![(a, 100), (b, 200)]);
        // Step 4: pure decode, one token each, positions 20 and 3.
        let st = s.schedule(no_pad).unwrap();
        assert!(st.is_decode());
        assert_eq!(st.positions, vec![20, 3]);
        assert_eq!(st.token_ids, vec![100, 200]);
        let out = s.commit(&st, &[101, 201]);
        assert_eq!(out[1].finished, Some(Finish::Length), "b reached max_tokens = 2");
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(st.seqs.len(), 1);
        let out = s.commit(&st, &[102]);
        assert_eq!(out[0].finished, Some(Finish::Length));
        assert!(!s.has_work());
        assert_eq!(s.free_pages(), 64, "every page came back");
    }

    #[test]
    fn stop_tokens_and_padding() {
        let mut s = sched(16, 8, 16);
        s.add(vec![1, 2, 3, 4, 5], SamplingParams { max_tokens: 10, stop: vec![7], ..Default::default() }).unwrap();
        let st = s.schedule(|t, q, _| (t.next_power_of_two(), q.next_power_of_two().max(2))).unwrap();
        assert_eq!((st.tokens, st.num_seqs, st.real_tokens, st.real_seqs), (8, 2, 5, 1));
        assert_eq!(&st.slot_mapping[5..], &[-1, -1, -1], "padded tokens write no KV");
        assert_eq!(st.query_start, vec![0, 5, 5], "a padded sequence has no new tokens");
        assert_eq!((st.seq_lens[1], st.last_token[1]), (0, -1));
        assert!(st.block_tables[64..].iter().all(|&p| p == -1));
        let out = s.commit(&st, &[7, 0]);
        assert_eq!(out[0].finished, Some(Finish::Stop));
        assert_eq!(s.free_pages(), 16);
    }

    #[test]
    fn slots_follow_the_pages() {
        let mut s = sched(64, 4, 8);
        // Take page 0 with a first request so the second starts on page 1.
        s.add(vec![1; 10], SamplingParams { max_tokens: 1, ..Default::default() }).unwrap();
        s.add(vec![2; 20], SamplingParams { max_tokens: 1, ..Default::default() }).unwrap();
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(st.block_tables[..2], [0, -1]);
        assert_eq!(st.block_tables[64..66], [1, 2]);
        assert_eq!(st.slot_mapping[10], 16, "second sequence, position 0: page 1");
        assert_eq!(st.slot_mapping[10 + 17], 2 * 16 + 1, "position 17: page 2, offset 1");
    }

    #[test]
    fn requests_that_cannot_fit_are_refused_clearly() {
        let mut s = sched(8, 4, 4);
        assert_eq!(s.add(vec![], SamplingParams::default()).unwrap_err(), AddError::EmptyPrompt);
        let e = s.add(vec![0; 1000], SamplingParams { max_tokens: 100, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("maximum context length of 1024") && e.contains("at most 24"), "{e}");
        let e = s.add(vec![0; 1024], SamplingParams { max_tokens: 1, ..Default::default() }).unwrap_err();
        assert_eq!(e, AddError::PromptTooLong { prompt: 1024, max_context: 1024 });
        let e = s.add(vec![0; 100], SamplingParams { max_tokens: 10, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains("KV pages"), "{e}");
    }

    #[test]
    fn admission_waits_for_pages() {
        let mut s = sched(64, 4, 4);
        s.add(vec![1; 40], SamplingParams { max_tokens: 8, ..Default::default() }).unwrap(); // 3 pages
        s.add(vec![2; 20], SamplingParams { max_tokens: 8, ..Default::default() }).unwrap(); // 2 pages: waits
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(st.seqs.len(), 1);
        assert_eq!(s.running(), 1);
    }

    /// A deterministic "model": the next token is a hash of the whole context, so a sequence
    /// computed twice (after a preemption) gives the same tokens, and a wrong context gives
    /// different ones.
    fn next_token(ctx: &[u32]) -> u32 {
        ctx.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3)) as u32 % 1000
    }

    /// A rule whose outputs often repeat earlier tokens (so n-gram drafts are accepted
    /// sometimes, rejected other times): copy the token 5 back, except where a hash says not to.
    fn repeaty(ctx: &[u32]) -> u32 {
        let h = next_token(ctx);
        if ctx.len() >= 5 && !h.is_multiple_of(3) { ctx[ctx.len() - 5] } else { h }
    }

    /// What `rule` generates after `prompt`, token by token.
    fn reference(rule: fn(&[u32]) -> u32, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        for _ in 0..n {
            let t = rule(&ctx);
            ctx.push(t);
        }
        ctx[prompt.len()..].to_vec()
    }

    /// The model side of a step, as the engine runs it: host-tier restores copied in, every row's
    /// next token computed by `rule` from its context read back through its block table (as the
    /// kernels read KV), the step committed, host-tier stores copied out.
    type Store = Vec<Option<(u32, u32)>>;
    type Rule = fn(&[u32]) -> u32;

    struct Fake {
        kv: Store,
        host: Store,
        pt: usize,
        rule: fn(&[u32]) -> u32,
        /// A draft program: its rule and its own per-token state (`draft_kv`), paged like `kv`
        /// (host tier included).
        draft: Option<(Rule, Store, Store)>,
        /// A per-sequence state: its slots and its snapshot slots.
        seq: Option<SeqState>,
    }

    /// A fake per-sequence state: a rolling hash of every (token, position) of the sequence so
    /// far, and how many tokens it has seen. Each row's next token mixes the state in, so a
    /// wrong state changes outputs; and every row checks that the state it starts from is
    /// exactly what a run without any cache would have at its first position.
    type SeqSlot = Option<(u64, usize)>;
    struct SeqState {
        slots: Vec<SeqSlot>,
        snaps: Vec<SeqSlot>,
        restores: usize,
    }

    fn fold_state(mut st: (u64, usize), tokens: &[u32]) -> (u64, usize) {
        for &t in tokens {
            st.0 = (st.0 ^ ((t as u64) << 20 | st.1 as u64)).wrapping_mul(0x100_0000_01b3).rotate_left(7);
            st.1 += 1;
        }
        st
    }

    const STATE0: (u64, usize) = (0x9e37_79b9_7f4a_7c15, 0);

    /// The next token with the state after `ctx` mixed in.
    fn with_state(rule: fn(&[u32]) -> u32, ctx: &[u32], state: (u64, usize)) -> u32 {
        (rule(ctx) + (state.0 >> 40) as u32 % 7) % 1000
    }

    /// `next_token` of a model with a per-sequence state: what a run without any cache gives.
    fn stateful(ctx: &[u32]) -> u32 {
        with_state(next_token, ctx, fold_state(STATE0, ctx))
    }

    /// Writes a step's new tokens into `kv` and computes every row's next token with `rule` from
    /// its context read back through its block table; a slot never written or holding another
    /// position panics.
    fn run_rows(kv: &mut Store, pt: usize, st: &Step, rule: fn(&[u32]) -> u32, what: &str) -> Vec<i32> {
        for (t, &slot) in st.slot_mapping.iter().enumerate().take(st.real_tokens) {
            kv[slot as usize] = Some((st.token_ids[t] as u32, st.positions[t] as u32));
        }
        (0..st.real_seqs)
            .map(|r| {
                let ctx: Vec<u32> = (0..st.seq_lens[r] as usize)
                    .map(|p| {
                        let page = st.block_tables[r * st.pages + p / pt];
                        let (tok, pos) = kv[page as usize * pt + p % pt].unwrap_or_else(|| panic!("{what} slot of position {p} never written"));
                        assert_eq!(pos as usize, p, "{what} slot holds another position");
                        tok
                    })
                    .collect();
                rule(&ctx) as i32
            })
            .collect()
    }

    fn copy_pages(from: &Store, to: &mut Store, pairs: &[(u32, u32)], pt: usize) {
        for &(a, b) in pairs {
            for k in 0..pt {
                to[b as usize * pt + k] = from[a as usize * pt + k];
            }
        }
    }

    impl Fake {
        fn new(s: &Scheduler, host_slots: usize, rule: fn(&[u32]) -> u32) -> Fake {
            let pt = s.page_tokens();
            Fake { kv: vec![None; s.total_pages() * pt], host: vec![None; host_slots * pt], pt, rule, draft: None, seq: None }
        }

        /// A model with a per-sequence state (see [`SeqState`]) of `snapshots` snapshot slots,
        /// whose rule is `next_token` with the state mixed in ([`stateful`] is its reference).
        fn with_seq_state(mut self, s: &Scheduler, snapshots: usize) -> Fake {
            self.rule = stateful;
            self.seq = Some(SeqState { slots: vec![None; s.config().max_seqs], snaps: vec![None; snapshots], restores: 0 });
            self
        }

        /// A step of the model with a per-sequence state: restores, then the rows (each checks
        /// the state it starts from and advances it), then saves.
        fn run_seq_rows(&mut self, st: &Step) -> Vec<i32> {
            let seq = self.seq.as_mut().expect("a per-sequence state");
            for &(snap, slot) in &st.snapshot_restores {
                seq.slots[slot as usize] = Some(seq.snaps[snap as usize].unwrap_or_else(|| panic!("restoring snapshot slot {snap}, never saved")));
                seq.restores += 1;
            }
            // The KV writes and the contexts read back through the block tables.
            let ctxs: Vec<Vec<u32>> = {
                let mut kv = std::mem::take(&mut self.kv);
                let pt = self.pt;
                run_rows(&mut kv, pt, st, |_| 0, "KV");
                let ctxs = (0..st.real_seqs)
                    .map(|r| (0..st.seq_lens[r] as usize).map(|p| kv[st.block_tables[r * st.pages + p / pt] as usize * pt + p % pt].expect("written").0).collect())
                    .collect();
                self.kv = kv;
                ctxs
            };
            let out = (0..st.real_seqs)
                .map(|r| {
                    let slot = st.seq_slots[r] as usize;
                    let (q0, q1) = (st.query_start[r] as usize, st.query_start[r + 1] as usize);
                    let start = st.positions[q0] as usize;
                    let ctx = &ctxs[r];
                    let before = if start == 0 {
                        STATE0
                    } else {
                        let got = seq.slots[slot].unwrap_or_else(|| panic!("row {r} starts at position {start} from an empty per-sequence slot"));
                        assert_eq!(got.1, start, "row {r} starts at position {start}, its per-sequence slot holds the state after {} tokens", got.1);
                        assert_eq!(got, fold_state(STATE0, &ctx[..start]), "row {r}: the per-sequence state at position {start} is not the state of an uncached run");
                        got
                    };
                    let after = fold_state(before, &ctx[start..start + (q1 - q0)]);
                    seq.slots[slot] = Some(after);
                    with_state(next_token, ctx, after) as i32
                })
                .collect();
            for &(slot, snap) in &st.snapshot_saves {
                seq.snaps[snap as usize] = seq.slots[slot as usize];
            }
            out
        }

        fn with_draft(mut self, rule: fn(&[u32]) -> u32) -> Fake {
            self.draft = Some((rule, vec![None; self.kv.len()], vec![None; self.host.len()]));
            self
        }

        /// A draft round, when the scheduler drafts with a program: its steps run on the draft
        /// state (greedy rows, as the step says).
        fn draft_round(&mut self, s: &mut Scheduler) {
            let Some((rule, dkv, _)) = self.draft.as_mut() else { return };
            let mut next = s.draft_begin(no_pad);
            while let Some(st) = next {
                assert!(st.temperature.iter().all(|&t| t == 0.0), "draft rows are greedy");
                assert!(st.real_tokens <= s.config().chunk && st.real_seqs <= s.config().max_seqs, "a draft step within the step budgets");
                let sampled = run_rows(dkv, self.pt, &st, *rule, "draft KV");
                next = s.draft_advance(&st, &sampled, no_pad);
            }
        }

        fn step(&mut self, s: &mut Scheduler, st: &Step) -> Vec<SeqOutput> {
            let pt = self.pt;
            let restores = s.take_restores();
            copy_pages(&self.host, &mut self.kv, &restores, pt);
            if let Some((_, dkv, dhost)) = self.draft.as_mut() {
                copy_pages(dhost, dkv, &restores, pt);
            }
            let sampled = if self.seq.is_some() { self.run_seq_rows(st) } else { run_rows(&mut self.kv, pt, st, self.rule, "KV") };
            let out = s.commit(st, &sampled);
            let stores = s.take_stores();
            copy_pages(&self.kv, &mut self.host, &stores, pt);
            if let Some((_, dkv, dhost)) = self.draft.as_mut() {
                copy_pages(dkv, dhost, &stores, pt);
            }
            out
        }
    }

    /// One request of [`drive`]: its prompt, max tokens, and the step it is aborted at.
    type Req = (Vec<u32>, usize, Option<usize>);

    /// Runs `reqs` to the end through `fake`, aborting each at its step, checking the step
    /// budgets and the page accounting after every step, that no aborted sequence produces a
    /// token, and finally that every sequence got exactly the rule's tokens (a prefix of them
    /// when aborted) and that every page came back.
    fn drive(s: &mut Scheduler, fake: &mut Fake, reqs: Vec<Req>) -> Result<(), proptest::test_runner::TestCaseError> {
        let (chunk, max_seqs, total) = (s.config().chunk, s.config().max_seqs, s.total_pages());
        // (id, prompt, max tokens, abort at step, tokens so far, aborted)
        #[allow(clippy::type_complexity)]
        let mut live: Vec<(SeqId, Vec<u32>, usize, Option<usize>, Vec<u32>, bool)> = Vec::new();
        for (prompt, max_tokens, abort_at) in reqs {
            match s.add(prompt.clone(), SamplingParams { max_tokens, ..Default::default() }) {
                Ok(id) => live.push((id, prompt, max_tokens, abort_at, vec![], false)),
                Err(AddError::PoolTooSmall { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let mut step_no = 0;
        while s.has_work() {
            for l in live.iter_mut() {
                if l.3 == Some(step_no) && !l.5 {
                    s.abort(l.0);
                    l.5 = true;
                }
            }
            if !s.has_work() {
                break;
            }
            fake.draft_round(s);
            s.check_invariants();
            let st = s.schedule(no_pad).expect("progress");
            proptest::prop_assert!(st.real_tokens <= chunk && st.real_seqs <= max_seqs);
            for o in fake.step(s, &st) {
                let l = live.iter_mut().find(|l| l.0 == o.id).unwrap();
                proptest::prop_assert!(!l.5, "output after abort");
                l.4.push(o.token);
            }
            s.check_invariants();
            step_no += 1;
            proptest::prop_assert!(step_no < 5000, "no progress");
        }
        for (_, prompt, max_tokens, _, got, aborted) in &live {
            let want = reference(fake.rule, prompt, *max_tokens);
            if *aborted {
                proptest::prop_assert!(want.starts_with(got));
            } else {
                proptest::prop_assert_eq!(got, &want);
            }
        }
        proptest::prop_assert_eq!(s.free_pages(), total);
        Ok(())
    }

    /// Runs every queued sequence to the end (no aborts); the tokens each produced, by id, and
    /// the rows computed in all.
    fn run_all(s: &mut Scheduler, fake: &mut Fake) -> (std::collections::HashMap<SeqId, Vec<u32>>, usize, usize) {
        let (mut out, mut computed, mut steps) = (std::collections::HashMap::<SeqId, Vec<u32>>::new(), 0, 0);
        while s.has_work() {
            fake.draft_round(s);
            let st = s.schedule(no_pad).expect("a lone sequence always fits");
            computed += st.real_tokens;
            for o in fake.step(s, &st) {
                out.entry(o.id).or_default().push(o.token);
            }
            s.check_invariants();
            steps += 1;
            assert!(steps < 1000, "no progress");
        }
        (out, computed, steps)
    }

    #[test]
    fn preempted_sequences_resume_with_the_same_output() {
        // 6 pages of 4 tokens: three sequences of 6 + 10 tokens cannot all stay.
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 8, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(6, 4));
        let mut fake = Fake::new(&s, 0, next_token);
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| (0..6).map(|t| t * 7 + i).collect()).collect();
        let ids: Vec<SeqId> = prompts.iter().map(|p| s.add(p.clone(), SamplingParams { max_tokens: 10, ..Default::default() }).unwrap()).collect();
        let (got, _, _) = run_all(&mut s, &mut fake);
        assert!(s.preemptions() > 0, "the pool is too small for all three: someone was preempted");
        for (p, id) in prompts.iter().zip(&ids) {
            assert_eq!(got[id], reference(next_token, p, 10));
        }
        assert_eq!(s.free_pages(), 6);
    }

    #[test]
    fn abort_frees_pages_wherever_the_sequence_is() {
        let mut s = sched(8, 4, 8);
        let a = s.add(vec![1; 20], SamplingParams { max_tokens: 4, ..Default::default() }).unwrap();
        let b = s.add(vec![2; 5], SamplingParams { max_tokens: 4, ..Default::default() }).unwrap();
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(s.running(), 1, "b waits: the chunk budget went to a");
        assert!(s.abort(b), "queued");
        assert!(s.abort(a), "running, mid-prefill");
        assert!(!s.abort(a), "twice is harmless");
        assert_eq!(s.free_pages(), 8);
        assert!(s.commit(&st, &[5]).is_empty(), "a step of an aborted sequence commits nothing");
        assert!(!s.has_work());
        s.check_invariants();
    }

    #[test]
    fn pages_are_taken_as_sequences_grow() {
        let mut s = sched(64, 4, 64);
        s.add(vec![1; 10], SamplingParams { max_tokens: 100, ..Default::default() }).unwrap();
        let st = s.schedule(no_pad).unwrap();
        assert_eq!(s.used_pages(), 1, "10 tokens: one page, not the 7 of the whole budget");
        s.commit(&st, &[3]);
        for _ in 0..7 {
            let st = s.schedule(no_pad).unwrap();
            s.commit(&st, &[3]);
        }
        assert_eq!(s.used_pages(), 2, "17 computed tokens + 1 being computed");
    }

    #[test]
    fn a_cached_prefix_is_not_computed_again_and_gives_the_same_tokens() {
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 4, max_context: 256, pages_per_seq: 64, spec: None }, BlockManager::new(64, 4));
        let mut fake = Fake::new(&s, 0, next_token);
        let system: Vec<u32> = (0..22).map(|t| 500 + t).collect();
        // The tokens of one request, and the tokens its first step computed.
        let mut run = |s: &mut Scheduler, prompt: &[u32]| -> (Vec<u32>, usize) {
            let id = s.add(prompt.to_vec(), SamplingParams { max_tokens: 5, ..Default::default() }).unwrap();
            let first = s.schedule(no_pad).unwrap();
            let n = first.seqs[0].n;
            let mut out: Vec<u32> = fake.step(s, &first).into_iter().map(|o| o.token).collect();
            let (rest, _, _) = run_all(s, &mut fake);
            out.extend(rest.get(&id).cloned().unwrap_or_default());
            (out, n)
        };
        let a: Vec<u32> = system.iter().copied().chain([1, 2, 3]).collect();
        let (out_a, n_a) = run(&mut s, &a);
        assert_eq!((out_a.clone(), n_a), (reference(next_token, &a, 5), 25), "cold: the whole prompt");
        let b: Vec<u32> = system.iter().copied().chain([7, 8]).collect();
        let (out_b, n_b) = run(&mut s, &b);
        assert_eq!(out_b, reference(next_token, &b, 5));
        assert_eq!(n_b, 24 - 20, "5 full pages of the 22-token system prompt hit: 20 tokens");
        assert_eq!(s.cache_stats().hits, 20);
        // The same prompt again: everything but the last page's worth is cached, and at least
        // the last token is computed.
        let (out_a2, n_a2) = run(&mut s, &a);
        assert_eq!(out_a2, out_a);
        assert_eq!(n_a2, 25 - 24, "the last token only");
        assert_eq!(s.free_pages(), 64);
    }

    #[test]
    fn a_prefix_evicted_from_the_gpu_comes_back_from_the_host() {
        // 8 GPU pages: a 6-page prompt, then another 6-page prompt evicts most of it.
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 1, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(8, 4).with_host_tier(32));
        let mut fake = Fake::new(&s, 32, next_token);
        let mut run = |s: &mut Scheduler, prompt: &[u32]| {
            let id = s.add(prompt.to_vec(), SamplingParams { max_tokens: 3, ..Default::default() }).unwrap();
            let (out, computed, _) = run_all(s, &mut fake);
            (out[&id].clone(), computed)
        };
        let a: Vec<u32> = (0..25).collect();
        let b: Vec<u32> = (100..125).collect();
        let (out_a, n) = run(&mut s, &a);
        assert_eq!((out_a.clone(), n), (reference(next_token, &a, 3), 25 + 2));
        run(&mut s, &b);
        let (again, n) = run(&mut s, &a);
        assert_eq!(again, out_a, "the same tokens from restored pages");
        assert_eq!(n, 1 + 2, "all 6 full pages restored: only the last token and the decodes computed");
        assert!(s.cache_stats().host_hits >= 4 * 4, "{:?}", s.cache_stats());
    }

    #[test]
    fn drafts_are_verified_in_one_step_and_accepted_while_they_match() {
        let spec = SpecConfig { k: 4, min_n: 1, max_n: 3, drafter: Drafter::Ngram };
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 8, max_context: 256, pages_per_seq: 64, spec: Some(spec) }, BlockManager::new(64, 4));
        // The rule copies the token 5 back: a prompt of period 5 continues it forever.
        let copy5: fn(&[u32]) -> u32 = |ctx| ctx[ctx.len() - 5];
        let mut fake = Fake::new(&s, 0, copy5);
        let prompt: Vec<u32> = [1, 2, 3, 4, 5].repeat(3);
        let id = s.add(prompt.clone(), SamplingParams { max_tokens: 30, ..Default::default() }).unwrap();
        let (out, _, steps) = run_all(&mut s, &mut fake);
        assert_eq!(out[&id], reference(copy5, &prompt, 30));
        assert!(steps <= 1 + 30 / 5 + 1, "5 tokens per verify step once drafting starts ({steps} steps)");
        let st = s.spec_stats();
        assert_eq!(st.accepted_tokens, st.draft_tokens, "every draft of a perfectly periodic text is right: {st:?}");
        assert!(st.accepted_tokens >= 20, "{st:?}");
    }

    #[test]
    fn a_draft_program_catches_up_then_proposes_and_the_target_verifies() {
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 8, max_context: 256, pages_per_seq: 64, spec: Some(SpecConfig::program(3)) }, BlockManager::new(64, 4));
        let mut fake = Fake::new(&s, 0, next_token).with_draft(next_token);
        let prompt: Vec<u32> = (0..10).collect();
        let id = s.add(prompt.clone(), SamplingParams { max_tokens: 12, ..Default::default() }).unwrap();
        assert!(s.draft_begin(no_pad).is_none(), "nothing decodes yet: no draft round");
        let st = s.schedule(no_pad).unwrap();
        fake.step(&mut s, &st);
        // Round 1: the draft state catches up on the prompt in one varlen row, as the target
        // computed it (prefill-shaped), and stops there: no drafts this round.
        let st = s.draft_begin(no_pad).unwrap();
        assert_eq!((st.real_seqs, st.real_tokens, st.positions[0], st.seq_lens[0]), (1, 10, 0, 10));
        let sampled = run_rows(&mut fake.draft.as_mut().unwrap().1, 4, &st, next_token, "draft");
        assert!(s.draft_advance(&st, &sampled, no_pad).is_none(), "a catch-up that stops at the prompt proposes nothing");
        let st = s.schedule(no_pad).unwrap();
        assert_eq!((st.real_seqs, st.positions[0]), (1, 10), "a plain decode step");
        fake.step(&mut s, &st);
        // Round 2: the generated tokens as one-token rows (decode-shaped, as the target computed
        // them), the last proposing the first draft; then one row per draft.
        let st = s.draft_begin(no_pad).unwrap();
        assert_eq!((st.real_seqs, st.positions[..2].to_vec(), st.seq_lens[..2].to_vec()), (2, vec![10, 11], vec![11, 12]));
        let sampled = run_rows(&mut fake.draft.as_mut().unwrap().1, 4, &st, next_token, "draft");
        let st = s.draft_advance(&st, &sampled, no_pad).unwrap();
        assert_eq!((st.real_tokens, st.positions[0], st.token_ids[0]), (1, 12, sampled[1]), "then one row per draft, at the next position");
        let sampled = run_rows(&mut fake.draft.as_mut().unwrap().1, 4, &st, next_token, "draft");
        let st = s.draft_advance(&st, &sampled, no_pad).unwrap();
        let sampled = run_rows(&mut fake.draft.as_mut().unwrap().1, 4, &st, next_token, "draft");
        assert!(s.draft_advance(&st, &sampled, no_pad).is_none(), "k = 3 drafts: the round is over");
        // The verify step: the last token and the three drafts, one row each.
        let st = s.schedule(no_pad).unwrap();
        assert_eq!((st.real_seqs, st.positions[..4].to_vec()), (4, vec![11, 12, 13, 14]));
        let out = fake.step(&mut s, &st);
        assert_eq!(out.len(), 4, "a perfect draft: all three accepted plus the target's next token");
        // Round 3: all drafts were accepted, so the draft never read its last draft: two
        // one-token catch-up rows (decode-shaped), the second proposing.
        let st = s.draft_begin(no_pad).unwrap();
        assert_eq!((st.real_seqs, st.positions[..2].to_vec()), (2, vec![14, 15]));
        s.draft_advance(&st, &run_rows(&mut fake.draft.as_mut().unwrap().1, 4, &st, next_token, "draft"), no_pad);
        s.check_invariants();
        let (rest, _, _) = run_all(&mut s, &mut fake);
        let got: Vec<u32> = out.iter().map(|o| o.token).chain(rest.get(&id).cloned().unwrap_or_default()).collect();
        assert_eq!(&got[..], &reference(next_token, &prompt, 12)[2..]);
        let sp = s.spec_stats();
        assert_eq!(sp.accepted_tokens, sp.draft_tokens, "the target as its own draft is always right: {sp:?}");
        assert!(sp.draft_steps >= 4, "{sp:?}");
        assert_eq!(s.free_pages(), 64);
    }

    #[test]
    fn a_wrong_draft_changes_no_token() {
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 8, max_context: 256, pages_per_seq: 64, spec: Some(SpecConfig::program(4)) }, BlockManager::new(64, 4));
        let mut fake = Fake::new(&s, 0, repeaty).with_draft(|ctx| ctx[ctx.len() - 5]);
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| (0..12).map(|t| (t * 3 + i) % 7).collect()).collect();
        let ids: Vec<SeqId> = prompts.iter().map(|p| s.add(p.clone(), SamplingParams { max_tokens: 40, ..Default::default() }).unwrap()).collect();
        let (got, _, _) = run_all(&mut s, &mut fake);
        for (p, id) in prompts.iter().zip(&ids) {
            assert_eq!(got[id], reference(repeaty, p, 40));
        }
        let sp = s.spec_stats();
        assert!(sp.accepted_tokens > 0 && sp.accepted_tokens < sp.draft_tokens, "some drafts right, some wrong: {sp:?}");
    }

    /// A case that once broke the draft catch-up split at the prompt's end (a host tier, shared
    /// prefixes, k = 1): the self draft stays exact and is never rejected.
    #[test]
    fn a_self_draft_with_shared_prefixes_and_a_host_tier_stays_exact() {
        let slots = 3;
        let mut s = Scheduler::new(SchedulerConfig { chunk: 23, max_seqs: 5, max_context: 64, pages_per_seq: 16, spec: Some(SpecConfig::program(1)) }, BlockManager::new(18, 4).with_host_tier(slots));
        let mut fake = Fake::new(&s, slots, repeaty).with_draft(repeaty);
        let prefixes: [Vec<u32>; 3] = [(0..13).map(|t| t % 5).collect(), (0..9).map(|t| 100 + t).collect(), (0..4).collect()];
        let reqs = [(1, 0, 13), (2, 1, 13), (0, 0, 7), (0, 3, 3), (0, 0, 1), (0, 0, 1), (0, 0, 1)]
            .into_iter()
            .enumerate()
            .map(|(j, (pre, extra, max_tokens)): (usize, (usize, u32, usize))| (prefixes[pre].iter().copied().chain((0..extra).map(|t| 1000 + t + j as u32)).collect(), max_tokens, None))
            .collect();
        drive(&mut s, &mut fake, reqs).unwrap();
        let sp = s.spec_stats();
        assert_eq!(sp.accepted_tokens, sp.draft_tokens, "{sp:?}");
        assert!(sp.draft_tokens > 0, "{sp:?}");
    }

    /// A scheduler for a model with a per-sequence state: pages of 4 tokens, `snaps` snapshot
    /// slots, a snapshot point every `every` pages (0: none).
    fn snap_sched(chunk: usize, max_seqs: usize, pages: usize, snaps: usize, every: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(pages, 4).with_snapshots(snaps).with_snapshot_interval(every))
    }

    /// Runs one request to the end; its tokens and its first step's row (start, n).
    fn run_one(s: &mut Scheduler, fake: &mut Fake, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, (usize, usize), Step) {
        let id = s.add(prompt.to_vec(), SamplingParams { max_tokens, ..Default::default() }).unwrap();
        let first = s.schedule(no_pad).unwrap();
        let row = (first.seqs[0].start, first.seqs[0].n);
        let mut out: Vec<u32> = fake.step(s, &first).into_iter().map(|o| o.token).collect();
        s.check_invariants();
        let (rest, _, _) = run_all(s, fake);
        out.extend(rest.get(&id).cloned().unwrap_or_default());
        (out, row, first)
    }

    #[test]
    fn a_repeated_prompt_continues_from_the_snapshot_at_its_last_page_boundary() {
        let mut s = snap_sched(64, 4, 32, 8, 0);
        let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, 8);
        let a: Vec<u32> = (0..22).collect();
        // Cold: the prefill stops at 20, the deepest page boundary before the prompt's end, and
        // the state there is saved; the last two tokens follow in the next step.
        let (out, row, first) = run_one(&mut s, &mut fake, &a, 3);
        assert_eq!(out, reference(stateful, &a, 3));
        assert_eq!(row, (0, 20));
        assert_eq!((first.snapshot_saves.len(), first.snapshot_restores.len()), (1, 0));
        assert_eq!(s.cache_stats().snapshots_saved, 1);
        // Again: 5 cached pages, and the state after them restored into the new slot.
        let (again, row, first) = run_one(&mut s, &mut fake, &a, 3);
        assert_eq!(again, out, "the same tokens from the restored state");
        assert_eq!(row, (20, 2));
        assert_eq!(first.snapshot_restores.len(), 1);
        assert!(first.snapshot_saves.is_empty(), "the page at 20 has its snapshot already");
        assert_eq!((s.cache_stats().hits, s.cache_stats().snapshots_restored), (20, 1));
        assert_eq!(fake.seq.as_ref().unwrap().restores, 1);
        // A prompt that shares 18 tokens: pages up to 16 are cached but no snapshot lies within
        // them, so it is computed from the start (the hit would need the state at 16) — and its
        // first chunk stops where it branches off, at 16, so the state there is saved...
        let b: Vec<u32> = a[..18].iter().copied().chain([900, 901, 902]).collect();
        let (out_b, row, first) = run_one(&mut s, &mut fake, &b, 3);
        assert_eq!(out_b, reference(stateful, &b, 3));
        assert_eq!((row, first.snapshot_saves.len()), ((0, 16), 1));
        assert_eq!(s.cache_stats().snapshot_truncated, 16);
        // ... and the next prompt sharing those 16 tokens hits there.
        let b2: Vec<u32> = a[..17].iter().copied().chain([800, 801, 802, 803, 804]).collect();
        let (out_b2, row, first) = run_one(&mut s, &mut fake, &b2, 3);
        assert_eq!(out_b2, reference(stateful, &b2, 3));
        assert_eq!((row.0, first.snapshot_restores.len()), (16, 1));
        // A longer prompt extending `a` (the next turn of a conversation) hits at 20.
        let c: Vec<u32> = a.iter().copied().chain(out.iter().copied()).chain([7, 7, 7, 7, 7]).collect();
        let (out_c, row, _) = run_one(&mut s, &mut fake, &c, 3);
        assert_eq!(out_c, reference(stateful, &c, 3));
        assert_eq!(row.0, 20);
        assert_eq!(s.free_pages(), 32);
    }

    #[test]
    fn a_snapshot_interval_lets_a_shared_system_prompt_hit() {
        let mut s = snap_sched(64, 4, 32, 8, 2);
        let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, 8);
        let system: Vec<u32> = (0..18).collect();
        let a: Vec<u32> = system.iter().copied().chain([50, 51, 52, 53]).collect();
        let id = s.add(a.clone(), SamplingParams { max_tokens: 2, ..Default::default() }).unwrap();
        // Chunks end every 2 pages (8 tokens) and at 20: 0..8, 8..16, 16..20, 20..22.
        let mut rows = vec![];
        let mut got = vec![];
        while s.has_work() {
            let st = s.schedule(no_pad).unwrap();
            rows.push((st.seqs[0].start, st.seqs[0].n, st.snapshot_saves.len()));
            got.extend(fake.step(&mut s, &st).into_iter().filter(|o| o.id == id).map(|o| o.token));
            s.check_invariants();
        }
        assert_eq!(got, reference(stateful, &a, 2));
        assert_eq!(&rows[..4], &[(0, 8, 1), (8, 8, 1), (16, 4, 1), (20, 2, 0)]);
        let b: Vec<u32> = system.iter().copied().chain([60, 61]).collect();
        let (out_b, row, first) = run_one(&mut s, &mut fake, &b, 4);
        assert_eq!(out_b, reference(stateful, &b, 4));
        assert_eq!(row.0, 16, "the system prompt's snapshot at 16");
        assert_eq!(first.snapshot_restores.len(), 1);
    }

    #[test]
    fn snapshots_are_evicted_with_their_pages_and_by_lru() {
        // One snapshot slot: the second prompt's save evicts the first prompt's snapshot.
        let mut s = snap_sched(64, 1, 32, 1, 0);
        let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, 1);
        let a: Vec<u32> = (0..10).collect();
        let b: Vec<u32> = (100..110).collect();
        run_one(&mut s, &mut fake, &a, 2);
        run_one(&mut s, &mut fake, &b, 2);
        assert_eq!(s.cache_stats().snapshots_evicted, 1);
        let (out, row, _) = run_one(&mut s, &mut fake, &a, 2);
        assert_eq!(out, reference(stateful, &a, 2));
        assert_eq!(row.0, 0, "a's pages are cached, its snapshot is gone: no hit");
        // Pages evicted: their snapshots go with them (check_invariants checks each step).
        let mut s = snap_sched(64, 1, 4, 4, 0);
        let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, 4);
        run_one(&mut s, &mut fake, &a, 2);
        run_one(&mut s, &mut fake, &b, 2);
        assert!(s.cache_stats().snapshots_evicted >= 1, "{:?}", s.cache_stats());
        let (out, row, _) = run_one(&mut s, &mut fake, &a, 2);
        assert_eq!((out, row.0), (reference(stateful, &a, 2), 0));
    }

    /// The fake's check is what the property tests rely on: a hit without a restored state
    /// (the prefix cache without snapshots) is caught.
    #[test]
    #[should_panic(expected = "per-sequence")]
    fn a_hit_without_its_state_is_caught() {
        let mut s = Scheduler::new(SchedulerConfig { chunk: 64, max_seqs: 2, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(32, 4));
        let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, 0);
        let a: Vec<u32> = (0..22).collect();
        run_one(&mut s, &mut fake, &a, 3);
        run_one(&mut s, &mut fake, &a, 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Random arrivals, aborts and pool sizes: every sequence either finishes with exactly
        /// the reference tokens or was aborted; pages are never owned twice and all come back.
        #[test]
        fn nothing_lost_duplicated_or_corrupted(
            pages in 4usize..24,
            chunk in 1usize..40,
            max_seqs in 1usize..6,
            reqs in proptest::collection::vec((1usize..20, 1usize..12, 0u32..50, proptest::option::of(0usize..30)), 1..12),
        ) {
            let mut s = Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(pages, 4));
            let mut fake = Fake::new(&s, 0, next_token);
            let reqs = reqs.into_iter().map(|(plen, max_tokens, salt, abort_at)| ((0..plen as u32).map(|t| t * 31 + salt).collect(), max_tokens, abort_at)).collect();
            drive(&mut s, &mut fake, reqs)?;
        }

        /// Shared prefixes, small pools, aborts and preemption with the prefix cache on (and a host
        /// tier or not): every finished sequence gets exactly its reference tokens (cached pages
        /// hold what a recomputation would write), counts return to zero, the pool's lists stay
        /// consistent.
        #[test]
        fn prefix_sharing_under_pressure_keeps_outputs_exact(
            pages in 6usize..30,
            host_slots in proptest::option::of(1usize..12),
            chunk in 1usize..24,
            reqs in proptest::collection::vec((0usize..3, 0usize..9, 1usize..8, proptest::option::of(0usize..40)), 1..14),
        ) {
            let slots = host_slots.unwrap_or(0);
            let mut s = Scheduler::new(SchedulerConfig { chunk, max_seqs: 4, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(pages, 4).with_host_tier(slots));
            let mut fake = Fake::new(&s, slots, next_token);
            let prefixes: [Vec<u32>; 3] = [(0..13).collect(), (0..9).map(|t| 100 + t).collect(), (0..4).collect()];
            let reqs = reqs
                .into_iter()
                .enumerate()
                .map(|(k, (pre, extra, max_tokens, abort_at))| (prefixes[pre].iter().copied().chain((0..extra as u32).map(|t| 1000 + t + k as u32)).collect(), max_tokens, abort_at))
                .collect();
            drive(&mut s, &mut fake, reqs)?;
        }

        /// With drafts (accepted or not), preemption, the prefix cache and aborts, every finished
        /// sequence gets exactly the tokens decoding without drafts gives.
        #[test]
        fn speculative_decoding_changes_no_token(
            pages in 8usize..40,
            k in 1usize..6,
            chunk in 2usize..32,
            max_seqs in 1usize..8,
            reqs in proptest::collection::vec((0u32..4, 1usize..16, 1usize..20, proptest::option::of(0usize..30)), 1..10),
        ) {
            let spec = SpecConfig { k, min_n: 1, max_n: 3, drafter: Drafter::Ngram };
            let mut s = Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: Some(spec) }, BlockManager::new(pages, 4));
            let mut fake = Fake::new(&s, 0, repeaty);
            let reqs = reqs.into_iter().map(|(seed, plen, max_tokens, abort_at)| ((0..plen as u32).map(|t| (t * 7 + seed) % 5).collect(), max_tokens, abort_at)).collect();
            drive(&mut s, &mut fake, reqs)?;
        }

        /// A draft program (the target's own rule, or a wrong one) under preemption, shared
        /// prefixes, a host tier and aborts: outputs stay exact, the draft state is always
        /// written where the draft reads it (the fake panics otherwise — cached pages included),
        /// and the target as its own draft is never rejected.
        #[test]
        fn draft_programs_change_no_token(
            pages in 8usize..40,
            host_slots in proptest::option::of(1usize..12),
            k in 1usize..6,
            chunk in 2usize..32,
            max_seqs in 1usize..8,
            self_draft in proptest::bool::ANY,
            reqs in proptest::collection::vec((0usize..3, 0usize..9, 1usize..20, proptest::option::of(0usize..40)), 1..10),
        ) {
            let slots = host_slots.unwrap_or(0);
            let mut s = Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: Some(SpecConfig::program(k)) }, BlockManager::new(pages, 4).with_host_tier(slots));
            let draft: fn(&[u32]) -> u32 = if self_draft { repeaty } else { |ctx| ctx[ctx.len() / 2] };
            let mut fake = Fake::new(&s, slots, repeaty).with_draft(draft);
            let prefixes: [Vec<u32>; 3] = [(0..13).map(|t| t % 5).collect(), (0..9).map(|t| 100 + t).collect(), (0..4).collect()];
            let reqs = reqs
                .into_iter()
                .enumerate()
                .map(|(j, (pre, extra, max_tokens, abort_at))| (prefixes[pre].iter().copied().chain((0..extra as u32).map(|t| 1000 + t + j as u32)).collect(), max_tokens, abort_at))
                .collect();
            drive(&mut s, &mut fake, reqs)?;
            let sp = s.spec_stats();
            if self_draft {
                proptest::prop_assert_eq!(sp.accepted_tokens, sp.draft_tokens, "{:?}", sp);
            }
        }
        /// A model with a per-sequence state: shared prefixes, small page and snapshot pools
        /// (eviction of both), preemption and aborts. Every row starts from exactly the state an
        /// uncached run has at its position (the fake checks), every finished sequence gets the
        /// uncached run's tokens, and snapshot slots are never owned twice nor outlive their page.
        #[test]
        fn per_sequence_snapshots_keep_outputs_exact(
            pages in 6usize..30,
            snaps in 1usize..8,
            every in 0usize..4,
            chunk in 1usize..24,
            max_seqs in 1usize..5,
            reqs in proptest::collection::vec((0usize..3, 0usize..9, 1usize..8, proptest::option::of(0usize..40)), 1..14),
        ) {
            let mut s = Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(pages, 4).with_snapshots(snaps).with_snapshot_interval(every));
            let mut fake = Fake::new(&s, 0, next_token).with_seq_state(&s, snaps);
            let prefixes: [Vec<u32>; 3] = [(0..13).collect(), (0..9).map(|t| 100 + t).collect(), (0..4).collect()];
            let reqs: Vec<Req> = reqs
                .into_iter()
                .enumerate()
                .map(|(k, (pre, extra, max_tokens, abort_at))| (prefixes[pre].iter().copied().chain((0..extra as u32).map(|t| 1000 + t + k as u32)).collect(), max_tokens, abort_at))
                .collect();
            // Without the prefix cache first: the same reference tokens (drive checks both).
            let mut off = Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 64, pages_per_seq: 16, spec: None }, BlockManager::new(pages, 4).with_prefix_cache(false));
            let mut off_fake = Fake::new(&off, 0, next_token).with_seq_state(&off, 0);
            drive(&mut off, &mut off_fake, reqs.clone())?;
            proptest::prop_assert_eq!(off_fake.seq.as_ref().unwrap().restores, 0);
            drive(&mut s, &mut fake, reqs)?;
            let st = s.cache_stats();
            proptest::prop_assert_eq!(st.snapshots_restored as usize, fake.seq.as_ref().unwrap().restores);
            proptest::prop_assert_eq!(s.blocks.reserved_snapshots(), 0);
        }
    }
}
