//! A step's token mask (the step ABI's `token_mask` and `mask_rows`), and the worker threads
//! that compute masks.

/// The token masks of one step's rows.
///
/// `rows[r]` is the row of `bits` that constrains step row `r`, or -1 when row `r` is free —
/// a free row costs the sampler one integer read. `bits` holds `words` u32 per constrained row:
/// bit `t % 32` of word `t / 32` set means token `t` may be sampled. Tokens past the last word
/// are never allowed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenMask {
    pub words: usize,
    pub rows: Vec<i32>,
    pub bits: Vec<u32>,
}

impl TokenMask {
    /// A mask of `seqs` free rows over a `vocab`-token vocabulary.
    pub fn free(seqs: usize, vocab: usize) -> TokenMask {
        TokenMask { words: vocab.div_ceil(32), rows: vec![-1; seqs], bits: Vec::new() }
    }

    /// Constrains step row `row` with `mask` (its first `words` words; missing words disallow).
    pub fn set(&mut self, row: usize, mask: &[u32]) {
        let k = self.bits.len() / self.words.max(1);
        self.bits.extend(mask.iter().take(self.words));
        self.bits.resize((k + 1) * self.words, 0);
        self.rows[row] = k as i32;
    }

    /// Whether any row is constrained.
    pub fn any(&self) -> bool {
        !self.bits.is_empty()
    }

    /// The bitmask of step row `row`, None when it is free.
    pub fn row(&self, row: usize) -> Option<&[u32]> {
        let k = *self.rows.get(row)?;
        (k >= 0).then(|| &self.bits[k as usize * self.words..(k as usize + 1) * self.words])
    }

    /// Whether step row `row` may sample `token`.
    pub fn allows(&self, row: usize, token: u32) -> bool {
        match self.row(row) {
            None => true,
            Some(m) => m.get(token as usize / 32).is_some_and(|w| (w >> (token % 32)) & 1 == 1),
        }
    }
}

/// Threads that compute masks, so the engine thread never does.
pub struct MaskPool {
    pool: rayon::ThreadPool,
}

impl MaskPool {
    /// `threads` workers (0: one per core but one — the engine thread's — at most 16: a batch of
    /// 64 constrained rows at a few hundred microseconds a mask wants them all).
    pub fn new(threads: usize) -> MaskPool {
        let n = if threads == 0 { std::thread::available_parallelism().map_or(2, |n| n.get()).saturating_sub(1).clamp(1, 16) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(|i| format!("kern-mask-{i}")).build().expect("starting the mask threads");
        MaskPool { pool }
    }

    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        self.pool.spawn(job);
    }

    /// Runs `f` inside the pool (its parallel iterators use the pool's threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_index_their_bits() {
        let mut m = TokenMask::free(4, 70);
        assert_eq!(m.words, 3);
        assert!(!m.any() && m.allows(0, 69));
        m.set(2, &[0b101, 0, 1 << 5]);
        assert_eq!(m.rows, vec![-1, -1, 0, -1]);
        assert!(m.allows(2, 0) && !m.allows(2, 1) && m.allows(2, 2) && m.allows(2, 69) && !m.allows(2, 68));
        assert!(!m.allows(2, 96), "past the words: never");
        m.set(0, &[1]);
        assert_eq!(m.rows[0], 1);
        assert_eq!(m.row(0).unwrap(), &[1, 0, 0]);
        assert!(m.allows(1, 5), "a free row allows everything");
    }
}
