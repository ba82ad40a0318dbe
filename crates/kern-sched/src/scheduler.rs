//! Continuous batching with chunked prefill.
//!
//! Each step takes, within the step's budgets (`chunk` tokens, `max_seqs` sequences): first one
//! token from every running sequence whose prompt is fully prefilled (decode), then prompt
//! chunks — from a partially prefilled sequence first, then from waiting sequences in arrival
//! order. A sequence is admitted only when the pages for its whole budget (prompt + max new
//! tokens) are free, so a running sequence never runs out of KV pages mid-way (no preemption
//! needed). Finished sequences free their pages at once.

use crate::blocks::BlockManager;
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
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, max_tokens: 16, stop: vec![], ignore_eos: false }
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most new tokens per step (the `tokens` var's max, or less for smaller prefill chunks).
    pub chunk: usize,
    /// Most sequences per step (the `seqs` var's max).
    pub max_seqs: usize,
    /// Longest context of a sequence (pages var max × page tokens, or less).
    pub max_context: usize,
    /// Block-table row length (the `pages` var's max).
    pub pages_per_seq: usize,
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

#[derive(Debug)]
struct Seq {
    id: SeqId,
    tokens: Vec<u32>,
    /// Tokens whose KV is in the cache.
    computed: usize,
    generated: usize,
    pages: Vec<u32>,
    params: SamplingParams,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    blocks: BlockManager,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    next_id: SeqId,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, blocks: BlockManager) -> Self {
        assert!(cfg.chunk > 0 && cfg.max_seqs > 0, "step budgets must be positive");
        Scheduler { cfg, blocks, waiting: VecDeque::new(), running: Vec::new(), next_id: 0 }
    }

    /// Queues a request; errors say what does not fit.
    pub fn add(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<SeqId, String> {
        if prompt.is_empty() {
            return Err("the prompt is empty: give at least one token".into());
        }
        if params.max_tokens == 0 {
            return Err("max_tokens must be at least 1".into());
        }
        let need = prompt.len() + params.max_tokens;
        let max_ctx = self.cfg.max_context.min(self.cfg.pages_per_seq * self.blocks.page_tokens());
        if need > max_ctx {
            return Err(format!(
                "the prompt has {} tokens and up to {} more are asked for ({need} in all), above the maximum context of {max_ctx} tokens: shorten the prompt or lower max_tokens (or pack the model with a larger --max-context)",
                prompt.len(),
                params.max_tokens
            ));
        }
        let pages = self.blocks.pages_for(need);
        if pages > self.blocks.total_pages() {
            return Err(format!("this request needs {pages} KV pages, the pool has {} in all: give kern more GPU memory or ask for fewer tokens", self.blocks.total_pages()));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Seq { id, tokens: prompt, computed: 0, generated: 0, pages: Vec::new(), params });
        Ok(id)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// The next step's work, padded by `pad(real_tokens, real_seqs) -> (tokens, seqs)`;
    /// None when nothing can run.
    pub fn schedule(&mut self, pad: impl Fn(usize, usize, bool) -> (usize, usize)) -> Option<Step> {
        // Admit waiting sequences whose whole budget of pages is free.
        while self.running.len() < self.cfg.max_seqs {
            let Some(front) = self.waiting.front() else { break };
            let need = front.tokens.len() + front.params.max_tokens;
            if self.blocks.pages_for(need) > self.blocks.free_pages() {
                break;
            }
            let mut s = self.waiting.pop_front().expect("front exists");
            self.blocks.ensure(&mut s.pages, need).expect("checked free pages");
            self.running.push(s);
        }
        let mut budget = self.cfg.chunk;
        let mut picked: Vec<(usize, usize)> = Vec::new(); // (running index, n)
        for (i, s) in self.running.iter().enumerate() {
            if picked.len() == self.cfg.max_seqs || budget == 0 {
                break;
            }
            if s.tokens.len() - s.computed == 1 {
                picked.push((i, 1));
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            if picked.len() == self.cfg.max_seqs || budget == 0 {
                break;
            }
            let left = s.tokens.len() - s.computed;
            if left > 1 {
                let n = left.min(budget);
                picked.push((i, n));
                budget -= n;
            }
        }
        if picked.is_empty() {
            return None;
        }
        picked.sort_by_key(|&(i, _)| i);
        let views: Vec<SeqView> = picked
            .iter()
            .map(|&(i, n)| {
                let s = &self.running[i];
                SeqView {
                    id: s.id,
                    tokens: &s.tokens,
                    pages: &s.pages,
                    start: s.computed,
                    n,
                    samples: s.computed + n == s.tokens.len(),
                    temperature: s.params.temperature,
                    top_k: s.params.top_k,
                    top_p: s.params.top_p,
                    seed: s.params.seed,
                }
            })
            .collect();
        let real_tokens = views.iter().map(|v| v.n).sum();
        let decode = views.iter().all(|v| v.n == 1);
        let (tp, sp) = pad(real_tokens, views.len(), decode);
        Some(Step::build(&views, tp, sp, self.cfg.pages_per_seq, self.blocks.page_tokens()))
    }

    /// Applies a step's sampled ids (one per step row); returns the new tokens. Sequences that
    /// finish release their pages.
    pub fn commit(&mut self, step: &Step, sampled: &[i32]) -> Vec<SeqOutput> {
        let mut out = Vec::new();
        for (row, ss) in step.seqs.iter().enumerate() {
            let Some(s) = self.running.iter_mut().find(|s| s.id == ss.id) else { continue };
            s.computed += ss.n;
            if !ss.samples {
                continue;
            }
            let token = sampled.get(row).copied().unwrap_or(0).max(0) as u32;
            s.tokens.push(token);
            s.generated += 1;
            let finished = if !s.params.ignore_eos && s.params.stop.contains(&token) {
                Some(Finish::Stop)
            } else if s.generated >= s.params.max_tokens || s.tokens.len() >= self.cfg.max_context {
                Some(Finish::Length)
            } else {
                None
            };
            out.push(SeqOutput { id: s.id, token, row, finished });
        }
        let blocks = &mut self.blocks;
        self.running.retain_mut(|s| {
            let done = out.iter().any(|o| o.id == s.id && o.finished.is_some());
            if done {
                blocks.release(&mut s.pages);
            }
            !done
        });
        out
    }

    pub fn free_pages(&self) -> usize {
        self.blocks.free_pages()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(chunk: usize, max_seqs: usize, pages: usize) -> Scheduler {
        Scheduler::new(SchedulerConfig { chunk, max_seqs, max_context: 1024, pages_per_seq: 64 }, BlockManager::new(pages, 16))
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
        assert!(s.add(vec![], SamplingParams::default()).unwrap_err().contains("empty"));
        let e = s.add(vec![0; 1000], SamplingParams { max_tokens: 100, ..Default::default() }).unwrap_err();
        assert!(e.contains("maximum context of 1024"), "{e}");
        let e = s.add(vec![0; 100], SamplingParams { max_tokens: 10, ..Default::default() }).unwrap_err();
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
}
