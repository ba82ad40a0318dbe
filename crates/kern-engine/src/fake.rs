//! A deterministic model on the CPU for testing the engine and the server without a GPU.
//!
//! It behaves like a real program in the ways that can go wrong: it keeps a KV store of
//! `(token, position)` per slot, writes each new token where `slot_mapping` says, and computes
//! a sequence's next token from its context *read back through its block table* — so a
//! sequence given the wrong pages (a page freed too early, reused by another sequence, a
//! preempted sequence resumed badly) produces different tokens, and a slot holding the wrong
//! position is reported as corruption. The next token is a pure function of the context (the
//! `rule`, by default a hash), so tests know every request's exact expected output.
//!
//! A step's token mask (`Model::step_with`) is honoured like a real sampler honours it: a
//! constrained row never gets a token its mask forbids. Its choice among the allowed tokens is
//! as arbitrary as its other choices (a hash of the context), except that tokens given to
//! [`FakeModel::with_preferred`] are taken first half the time when allowed — a test's logit
//! bias, so that a random walk through a grammar (a JSON string, say) ends in a few tokens.
//!
//! With [`FakeModel::with_draft`] it also has a draft program: its own rule over its own
//! per-token state (a second store paged by the same block tables, like `draft_kv`), checked
//! the same way — a draft row reading a position whose draft state was never written fails.
//!
//! With [`FakeModel::with_seq_state`] it also has a per-sequence state with snapshots, like a
//! recurrent state declared `"snapshot": true`: each slot holds a rolling hash of every
//! (token, position) the sequence has been through and how many tokens that is. A row starting
//! at position 0 starts it fresh; any other row checks that its slot holds exactly the state an
//! uncached run has at that position (a wrong or missing restore is a step error), and every
//! row's token mixes the state in ([`FakeModel::reference_with_state`] is the uncached
//! reference). The step's snapshot restores are made before its rows and its saves after them,
//! as the GPU orders them on its stream.

use crate::constraint::TokenMask;
use crate::model::{Model, ModelError, ModelInfo, StepOutput};
use kern_sched::Step;
use std::sync::Arc;
use std::time::Duration;

/// Chooses the next token from a sequence's whole context (greedy).
pub type Rule = Arc<dyn Fn(&[u32]) -> u32 + Send + Sync>;

/// FNV-1a over the context: the default greedy rule, modulo the vocabulary.
pub fn hash_rule(vocab: usize) -> Rule {
    Arc::new(move |ctx: &[u32]| (fnv(ctx.iter().map(|&t| t as u64)) % vocab as u64) as u32)
}

fn fnv(xs: impl Iterator<Item = u64>) -> u64 {
    xs.fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x).wrapping_mul(0x100_0000_01b3))
}

type Store = Vec<Option<(u32, u32)>>;

/// A fake per-sequence state: (rolling hash, tokens seen).
type SeqSlot = Option<(u64, usize)>;

/// The per-sequence state of a fresh sequence.
const STATE0: (u64, usize) = (0x9e37_79b9_7f4a_7c15, 0);

/// The state after `tokens` more tokens.
fn fold_state(mut st: (u64, usize), tokens: &[u32]) -> (u64, usize) {
    for &t in tokens {
        st.0 = (st.0 ^ ((t as u64) << 20 | st.1 as u64)).wrapping_mul(0x100_0000_01b3).rotate_left(7);
        st.1 += 1;
    }
    st
}

/// A token with the state mixed in.
fn mix_state(tok: u32, state: (u64, usize), vocab: usize) -> u32 {
    ((tok as u64 + (state.0 >> 40) % 7) % vocab as u64) as u32
}

/// The per-sequence state's slots and snapshot slots.
struct SeqState {
    slots: Vec<SeqSlot>,
    snaps: Vec<SeqSlot>,
    restores: usize,
}

pub struct FakeModel {
    info: ModelInfo,
    rule: Rule,
    kv: Store,
    /// The host tier's memory, slot-major like the pool.
    host: Store,
    /// The draft program: its rule, its state and that state's host tier.
    draft: Option<(Rule, Store, Store)>,
    /// Draft steps run.
    pub draft_steps: usize,
    /// Sleep per step (to keep requests in flight while a test does something).
    pub step_delay: Duration,
    /// Fail this step (0-based) with a fault naming an op, like a GPU fault would.
    pub fail_at_step: Option<usize>,
    steps: usize,
    /// Whether steps take a token mask (else the engine masks on the host, from the logits).
    mask_input: bool,
    /// Tokens a constrained row prefers (see the module docs).
    preferred: Vec<u32>,
    /// The per-sequence state, with its snapshots (see the module docs).
    seq: Option<SeqState>,
}

impl FakeModel {
    pub fn new(info: ModelInfo, rule: Rule) -> FakeModel {
        let slots = info.total_pages * info.page_tokens;
        FakeModel { info, rule, kv: vec![None; slots], host: Vec::new(), draft: None, draft_steps: 0, step_delay: Duration::ZERO, fail_at_step: None, steps: 0, mask_input: true, preferred: Vec::new(), seq: None }
    }

    /// Adds a draft program proposing `k` tokens per step with `rule` (the model's own rule
    /// makes a perfect draft).
    pub fn with_draft(mut self, rule: Rule, k: usize) -> FakeModel {
        self.info.draft_k = Some(k);
        self.draft = Some((rule, vec![None; self.kv.len()], Vec::new()));
        self
    }

    /// Adds a per-sequence state (see the module docs) with `snapshots` snapshot slots (0: the
    /// model keeps none, so the engine turns the prefix cache off).
    pub fn with_seq_state(mut self, snapshots: usize) -> FakeModel {
        self.info.per_seq_state = true;
        self.seq = Some(SeqState { slots: vec![None; self.info.max_step_seqs], snaps: vec![None; snapshots], restores: 0 });
        self
    }

    /// Snapshots restored so far (with a per-sequence state).
    pub fn snapshot_restores(&self) -> usize {
        self.seq.as_ref().map_or(0, |s| s.restores)
    }

    /// What the model with a per-sequence state ([`FakeModel::with_seq_state`]) generates
    /// greedily after `prompt`, computed without any cache.
    pub fn reference_with_state(rule: &Rule, vocab: usize, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        for _ in 0..n {
            let t = mix_state(rule(&ctx), fold_state(STATE0, &ctx), vocab);
            ctx.push(t);
        }
        ctx.split_off(prompt.len())
    }

    /// Advances each real row's per-sequence state over its new tokens, after checking that
    /// the state it starts from is the uncached one at its position; returns each row's state
    /// after the step (None without a per-sequence state).
    fn advance_seq_state(&mut self, st: &Step, ctxs: &[Vec<u32>]) -> Result<Vec<Option<(u64, usize)>>, ModelError> {
        let Some(seq) = self.seq.as_mut() else { return Ok(vec![None; ctxs.len()]) };
        let mut out = Vec::with_capacity(ctxs.len());
        for (r, ctx) in ctxs.iter().enumerate() {
            let slot = st.seq_slots[r];
            let (q0, q1) = (st.query_start[r] as usize, st.query_start[r + 1] as usize);
            if slot < 0 || slot as usize >= seq.slots.len() {
                return Err(ModelError(format!("row {r}: per-sequence slot {slot} outside the pool of {}", seq.slots.len())));
            }
            let start = ctx.len() - (q1 - q0);
            let before = if start == 0 {
                STATE0
            } else {
                let want = fold_state(STATE0, &ctx[..start]);
                match seq.slots[slot as usize] {
                    Some(got) if got == want => got,
                    got => {
                        return Err(ModelError(format!(
                            "per-sequence state corruption: row {r} starts at position {start}, its slot {slot} holds the state after {} tokens{}",
                            got.map_or(0, |g| g.1),
                            if got.is_some_and(|g| g.1 == start) { " of another prefix" } else { "" }
                        )))
                    }
                }
            };
            let after = fold_state(before, &ctx[start..]);
            seq.slots[slot as usize] = Some(after);
            out.push(Some(after));
        }
        Ok(out)
    }

    /// A model whose steps take no token mask, like a manifest without the `token_mask` input:
    /// the engine then masks constrained rows on the host.
    pub fn without_token_mask(mut self) -> FakeModel {
        self.mask_input = false;
        self
    }

    /// Tokens a constrained row takes first (each half the time) when its mask allows them.
    pub fn with_preferred(mut self, tokens: Vec<u32>) -> FakeModel {
        self.preferred = tokens;
        self
    }

    /// A token of row `r` that `mask` allows: a preferred one (each with probability 1/2 by
    /// the hash `h`), the unconstrained choice `tok` when allowed, else the allowed token of
    /// rank `h mod count`.
    fn constrained(&self, mask: &TokenMask, r: usize, tok: u32, h: u64) -> Result<u32, ModelError> {
        let Some(words) = mask.row(r) else { return Ok(tok) };
        for (i, &p) in self.preferred.iter().enumerate() {
            if mask.allows(r, p) && (h >> (i % 64)) & 1 == 0 {
                return Ok(p);
            }
        }
        if mask.allows(r, tok) {
            return Ok(tok);
        }
        // Rank `k` among the allowed tokens, counted a word at a time.
        let vocab = self.info.vocab;
        let word = |i: usize| {
            let w = words[i];
            let keep = vocab.saturating_sub(i * 32).min(32);
            if keep == 32 { w } else { w & ((1u32 << keep) - 1) }
        };
        let n_words = words.len().min(vocab.div_ceil(32));
        let count: usize = (0..n_words).map(|i| word(i).count_ones() as usize).sum();
        if count == 0 {
            return Err(ModelError(format!("row {r}: the token mask allows no token")));
        }
        let mut k = (h >> 7) as usize % count;
        for i in 0..n_words {
            let mut w = word(i);
            let c = w.count_ones() as usize;
            if k >= c {
                k -= c;
                continue;
            }
            for _ in 0..k {
                w &= w - 1;
            }
            return Ok((i * 32) as u32 + w.trailing_zeros());
        }
        unreachable!("k < count")
    }

    /// A small model: `vocab` ids, steps of 64 tokens × 8 sequences, 4-token pages.
    pub fn small(vocab: usize, total_pages: usize) -> FakeModel {
        let info = ModelInfo { max_step_tokens: 64, max_step_seqs: 8, pages_per_seq: 64, page_tokens: 4, total_pages, vocab, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None };
        FakeModel::new(info, hash_rule(vocab))
    }

    /// What the model generates greedily after `prompt` (the rule applied step by step).
    pub fn reference(rule: &Rule, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        for _ in 0..n {
            let t = rule(&ctx);
            ctx.push(t);
        }
        ctx.split_off(prompt.len())
    }

    /// Logits whose argmax is `token`, with a spread of other values (deterministic).
    fn logits_row(&self, token: u32, ctx_hash: u64, out: &mut Vec<f32>) {
        let v = self.info.vocab;
        // One multiply-xorshift per entry: rows are 150k wide in the tests, built every step.
        out.extend((0..v).map(|i| {
            let mut h = ctx_hash ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h = (h ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            -(((h >> 32) % 1000) as f32) / 250.0
        }));
        let base = out.len() - v;
        out[base + token as usize] = 4.0;
    }
}

impl Model for FakeModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn pad(&self, tokens: usize, seqs: usize, decode: bool) -> (usize, usize) {
        // Pad decode steps like graph buckets do, so padding rules are exercised.
        if decode {
            (tokens.next_power_of_two().min(self.info.max_step_tokens.max(tokens)), seqs.next_power_of_two().min(self.info.max_step_seqs.max(seqs)))
        } else {
            (tokens, seqs)
        }
    }

    fn page_bytes(&self) -> usize {
        self.info.page_tokens * if self.draft.is_some() { 16 } else { 8 }
    }

    fn snapshot_slots(&self) -> usize {
        self.seq.as_ref().map_or(0, |s| s.snaps.len())
    }

    fn init_host_tier(&mut self, slots: usize) -> Result<(), ModelError> {
        self.host = vec![None; slots * self.info.page_tokens];
        if let Some((_, _, dhost)) = self.draft.as_mut() {
            *dhost = vec![None; slots * self.info.page_tokens];
        }
        Ok(())
    }

    fn store_pages(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        let pt = self.info.page_tokens;
        copy_pages(&self.kv, &mut self.host, pairs, pt);
        if let Some((_, dkv, dhost)) = self.draft.as_mut() {
            copy_pages(dkv, dhost, pairs, pt);
        }
        Ok(())
    }

    fn restore_pages(&mut self, pairs: &[(u32, u32)]) -> Result<(), ModelError> {
        let pt = self.info.page_tokens;
        copy_pages(&self.host, &mut self.kv, pairs, pt);
        if let Some((_, dkv, dhost)) = self.draft.as_mut() {
            copy_pages(dhost, dkv, pairs, pt);
        }
        Ok(())
    }

    fn draft_step(&mut self, st: &Step) -> Result<Vec<i32>, ModelError> {
        let pt = self.info.page_tokens;
        let Some((rule, dkv, _)) = self.draft.as_mut() else {
            return Err(ModelError("this model declares no draft program".into()));
        };
        self.draft_steps += 1;
        if st.temperature.iter().any(|&t| t != 0.0) {
            return Err(ModelError("draft rows must be greedy".into()));
        }
        let ctxs = rows_from_store(dkv, pt, st, "draft KV")?;
        Ok(ctxs.iter().map(|c| rule(c) as i32).collect())
    }

    fn token_mask(&self) -> bool {
        self.mask_input
    }

    fn step(&mut self, st: &Step, want_logits: bool) -> Result<StepOutput, ModelError> {
        self.step_with(st, want_logits, None, &mut || {})
    }

    fn step_with(&mut self, st: &Step, want_logits: bool, mask: Option<&TokenMask>, while_running: &mut dyn FnMut()) -> Result<StepOutput, ModelError> {
        if mask.is_some_and(TokenMask::any) && !self.mask_input {
            return Err(ModelError("this model applies no token mask".into()));
        }
        while_running();
        if self.fail_at_step == Some(self.steps) {
            return Err(ModelError("call `layer3.attn` (op `attention`): an illegal memory access was encountered (fake fault)".into()));
        }
        self.steps += 1;
        if !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
        let pt = self.info.page_tokens;
        if st.real_tokens > self.info.max_step_tokens.max(st.tokens) || st.num_seqs > self.info.max_step_seqs {
            return Err(ModelError(format!("step of {} tokens × {} seqs is above the model's maxima", st.tokens, st.num_seqs)));
        }
        // Snapshots come back before the rows run, and are saved after them.
        if let Some(seq) = self.seq.as_mut() {
            for &(snap, slot) in &st.snapshot_restores {
                let got = seq.snaps.get(snap as usize).copied().ok_or_else(|| ModelError(format!("snapshot slot {snap} outside the pool")))?;
                let dst = seq.slots.get_mut(slot as usize).ok_or_else(|| ModelError(format!("per-sequence slot {slot} outside the pool")))?;
                *dst = got;
                seq.restores += 1;
            }
        } else if !st.snapshot_restores.is_empty() || !st.snapshot_saves.is_empty() {
            return Err(ModelError("this model has no per-sequence state to snapshot".into()));
        }
        let ctxs = rows_from_store(&mut self.kv, pt, st, "KV")?;
        let states = self.advance_seq_state(st, &ctxs)?;
        if let Some(seq) = self.seq.as_mut() {
            for &(slot, snap) in &st.snapshot_saves {
                let v = seq.slots.get(slot as usize).copied().ok_or_else(|| ModelError(format!("per-sequence slot {slot} outside the pool")))?;
                *seq.snaps.get_mut(snap as usize).ok_or_else(|| ModelError(format!("snapshot slot {snap} outside the pool")))? = v;
            }
        }
        let mut sampled = Vec::with_capacity(st.real_seqs);
        let mut logits = want_logits.then(Vec::new);
        for (r, ctx) in ctxs.iter().enumerate() {
            let len = ctx.len();
            let greedy = (self.rule)(ctx);
            let tok = if st.temperature[r] > 0.0 {
                // Sampled: a function of (seed, position), like the real sampler's RNG stream.
                let h = fnv(ctx.iter().map(|&t| t as u64).chain([st.seeds[r], len as u64, 0x5eed]));
                (h % self.info.vocab as u64) as u32
            } else {
                greedy
            };
            // The per-sequence state takes part in every token.
            let tok = match states[r] {
                Some(state) => mix_state(tok, state, self.info.vocab),
                None => tok,
            };
            // Greedy rows choose without the seed (a greedy choice does not depend on it).
            let seed = if st.temperature[r] > 0.0 { st.seeds[r] } else { 0 };
            let tok = match mask {
                Some(m) => self.constrained(m, r, tok, fnv(ctx.iter().map(|&t| t as u64).chain([seed, len as u64, 0x6d61_736b]))),
                None => Ok(tok),
            }?;
            sampled.push(tok as i32);
            if let Some(l) = logits.as_mut() {
                self.logits_row(tok, fnv(ctx.iter().map(|&t| t as u64)), l);
            }
        }
        Ok(StepOutput { sampled, logits })
    }
}

fn copy_pages(from: &Store, to: &mut Store, pairs: &[(u32, u32)], pt: usize) {
    for &(a, b) in pairs {
        for k in 0..pt {
            to[b as usize * pt + k] = from[a as usize * pt + k];
        }
    }
}

/// Writes a step's new tokens into `store` where `slot_mapping` says, then reads each real row's
/// context back through its block table; a slot never written, or holding another position, is
/// corruption.
fn rows_from_store(store: &mut Store, pt: usize, st: &Step, what: &str) -> Result<Vec<Vec<u32>>, ModelError> {
    for t in 0..st.tokens {
        let slot = st.slot_mapping[t];
        if slot < 0 {
            continue;
        }
        let slot = slot as usize;
        if slot >= store.len() {
            return Err(ModelError(format!("slot {slot} outside the {what} pool")));
        }
        store[slot] = Some((st.token_ids[t] as u32, st.positions[t] as u32));
    }
    let mut rows = Vec::with_capacity(st.real_seqs);
    for r in 0..st.real_seqs {
        let len = st.seq_lens[r] as usize;
        let mut ctx = Vec::with_capacity(len);
        for p in 0..len {
            let page = st.block_tables[r * st.pages + p / pt];
            if page < 0 {
                return Err(ModelError(format!("row {r}: no page for position {p}")));
            }
            match store[page as usize * pt + p % pt] {
                Some((tok, pos)) if pos as usize == p => ctx.push(tok),
                other => return Err(ModelError(format!("{what} corruption: row {r} position {p} reads {other:?}"))),
            }
        }
        rows.push(ctx);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kern_sched::{BlockManager, SamplingParams, Scheduler, SchedulerConfig};

    /// Runs `prompt` to the end on `m` through `s`; the first step's error, if any.
    fn run(s: &mut Scheduler, m: &mut FakeModel, prompt: &[u32]) -> Result<Vec<u32>, ModelError> {
        let id = s.add(prompt.to_vec(), SamplingParams { max_tokens: 3, ..Default::default() }).unwrap();
        let mut out = vec![];
        while let Some(st) = s.schedule(|t, q, _| (t, q)) {
            let o = m.step(&st, false)?;
            out.extend(s.commit(&st, &o.sampled).into_iter().filter(|o| o.id == id).map(|o| o.token));
        }
        Ok(out)
    }

    #[test]
    fn the_per_sequence_state_is_checked_at_every_row() {
        let mut m = FakeModel::small(1000, 32).with_seq_state(4);
        let cfg = SchedulerConfig { chunk: 64, max_seqs: 8, max_context: 64, pages_per_seq: 16, spec: None };
        let p: Vec<u32> = (0..22).collect();
        // With snapshots: the second run hits and restores, with the uncached tokens.
        let mut s = Scheduler::new(cfg.clone(), BlockManager::new(32, 4).with_snapshots(4));
        let want = FakeModel::reference_with_state(&m.rule.clone(), 1000, &p, 3);
        assert_eq!(run(&mut s, &mut m, &p).unwrap(), want);
        assert_eq!(run(&mut s, &mut m, &p).unwrap(), want);
        assert_eq!(m.snapshot_restores(), 1);
        // The prefix cache without snapshots: the hit starts from a slot that holds another
        // sequence's state, and the model says so.
        let mut m = FakeModel::small(1000, 32).with_seq_state(0);
        let mut s = Scheduler::new(cfg, BlockManager::new(32, 4));
        run(&mut s, &mut m, &p).unwrap();
        let e = run(&mut s, &mut m, &p).unwrap_err().to_string();
        assert!(e.contains("per-sequence state corruption: row 0 starts at position 20"), "{e}");
    }
}
