//! One step's inputs in the step ABI's layout (docs/step-abi.md), padded to bucket sizes.
//!
//! Padding rules (what padded rows hold, so that they change nothing that matters):
//! padded tokens have `slot_mapping = -1` (no KV write), token id 0 and position 0; padded
//! sequences have no new tokens (`query_start` repeats the real total), `seq_lens = 0`,
//! `last_token = -1`, a block-table row of -1, and greedy sampling parameters.

/// One sequence's part of a step: `n` new tokens starting at position `start`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSeq {
    pub id: u64,
    /// Position of the first new token (= tokens whose KV is already cached).
    pub start: usize,
    /// New tokens in this step.
    pub n: usize,
    /// Whether this step reaches the sequence's last known token, so its sample is kept.
    pub samples: bool,
}

/// The step ABI arrays of one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub seqs: Vec<StepSeq>,
    /// Real counts (before padding).
    pub real_tokens: usize,
    pub real_seqs: usize,
    /// Padded sizes (the `tokens` and `seqs` var values of the run).
    pub tokens: usize,
    pub num_seqs: usize,
    /// Block-table row length (the `pages` var).
    pub pages: usize,
    pub token_ids: Vec<i32>,
    pub positions: Vec<i32>,
    pub seq_lens: Vec<i32>,
    pub query_start: Vec<i32>,
    pub slot_mapping: Vec<i32>,
    pub block_tables: Vec<i32>,
    pub last_token: Vec<i32>,
    /// Each sequence's slot in the per-sequence state pools (-1 for padded rows).
    pub seq_slots: Vec<i32>,
    pub temperature: Vec<f32>,
    pub top_k: Vec<i32>,
    pub top_p: Vec<f32>,
    pub seeds: Vec<u64>,
    /// Snapshot copies to make **before** the step's program: `(snapshot slot, sequence slot)`
    /// — a sequence that starts at a cached prefix continues from the state saved at its end.
    /// Not step-ABI buffers: the model makes the copies on the step's stream.
    pub snapshot_restores: Vec<(u32, u32)>,
    /// Snapshot copies to make **after** the step's program: `(sequence slot, snapshot slot)` —
    /// the state of a row whose chunk ends at a page boundary, kept for that page.
    pub snapshot_saves: Vec<(u32, u32)>,
}

/// What the step builder needs to know about one sequence.
pub(crate) struct SeqView<'a> {
    pub id: u64,
    /// The sequence's tokens from position `offset` on (the whole sequence from 0, or — for
    /// verify and draft rows — just the last token and the drafts, so a step never copies a
    /// long context).
    pub tokens: &'a [u32],
    pub offset: usize,
    pub pages: &'a [u32],
    pub start: usize,
    pub n: usize,
    pub samples: bool,
    pub slot: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u64,
}

impl Step {
    /// Builds the arrays for `seqs`, padded to `tokens_pad` tokens and `seqs_pad` sequences
    /// (each at least the real count), with block-table rows of `pages` entries.
    pub(crate) fn build(seqs: &[SeqView], tokens_pad: usize, seqs_pad: usize, pages: usize, page_tokens: usize) -> Step {
        let real_tokens: usize = seqs.iter().map(|s| s.n).sum();
        let tokens_pad = tokens_pad.max(real_tokens);
        let seqs_pad = seqs_pad.max(seqs.len());
        let mut st = Step {
            seqs: seqs.iter().map(|s| StepSeq { id: s.id, start: s.start, n: s.n, samples: s.samples }).collect(),
            real_tokens,
            real_seqs: seqs.len(),
            tokens: tokens_pad,
            num_seqs: seqs_pad,
            pages,
            token_ids: Vec::with_capacity(tokens_pad),
            positions: Vec::with_capacity(tokens_pad),
            slot_mapping: Vec::with_capacity(tokens_pad),
            query_start: Vec::with_capacity(seqs_pad + 1),
            block_tables: vec![-1; seqs_pad * pages],
            ..Default::default()
        };
        st.query_start.push(0);
        for (k, s) in seqs.iter().enumerate() {
            for p in s.start..s.start + s.n {
                st.token_ids.push(s.tokens[p - s.offset] as i32);
                st.positions.push(p as i32);
                let page = s.pages[p / page_tokens] as usize;
                st.slot_mapping.push((page * page_tokens + p % page_tokens) as i32);
            }
            let end = st.token_ids.len() as i32;
            st.query_start.push(end);
            st.seq_lens.push((s.start + s.n) as i32);
            st.last_token.push(end - 1);
            st.seq_slots.push(s.slot as i32);
            for (j, &pg) in s.pages.iter().enumerate().take(pages) {
                st.block_tables[k * pages + j] = pg as i32;
            }
            st.temperature.push(s.temperature);
            st.top_k.push(s.top_k);
            st.top_p.push(s.top_p);
            st.seeds.push(s.seed);
        }
        st.token_ids.resize(tokens_pad, 0);
        st.positions.resize(tokens_pad, 0);
        st.slot_mapping.resize(tokens_pad, -1);
        let total = real_tokens as i32;
        st.query_start.resize(seqs_pad + 1, total);
        st.seq_lens.resize(seqs_pad, 0);
        st.last_token.resize(seqs_pad, -1);
        st.seq_slots.resize(seqs_pad, -1);
        st.temperature.resize(seqs_pad, 0.0);
        st.top_k.resize(seqs_pad, 0);
        st.top_p.resize(seqs_pad, 1.0);
        st.seeds.resize(seqs_pad, 0);
        st
    }

    /// A step with no real sequence, padded to `tokens` × `seqs`: every row is padding (no KV
    /// write, nothing sampled that matters). Used to capture CUDA graphs before traffic comes.
    pub fn padding(tokens: usize, seqs: usize, pages: usize, page_tokens: usize) -> Step {
        Step::build(&[], tokens, seqs, pages, page_tokens)
    }

    /// Whether every sequence contributes exactly one token (a pure decode step).
    pub fn is_decode(&self) -> bool {
        self.seqs.iter().all(|s| s.n == 1)
    }
}
