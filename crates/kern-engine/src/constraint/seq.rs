//! One constrained sequence in the engine loop: its matcher, the mask of its next token
//! (computed on the mask threads as soon as the token before is committed), and the gate
//! that keeps it free until a given token sequence (the end of a reasoning block) appears.

use super::mask::MaskPool;
use super::Constraint;
use llguidance::Matcher;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::mpsc;
use std::time::Instant;

type Computed = (Matcher, Result<Vec<u32>, String>);

enum Slot {
    /// The matcher, no mask computed for its state.
    Idle(Matcher),
    /// A mask thread holds the matcher.
    Computing(mpsc::Receiver<Computed>),
    /// The mask of the matcher's current state.
    Ready(Matcher, Result<Vec<u32>, String>),
    /// Lost (a mask thread panicked): the sequence fails.
    Gone,
}

/// What committing a token did to the constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Advance {
    /// More output may follow.
    Open,
    /// The grammar is complete and allows nothing more: the output ends here.
    Complete,
}

/// Where the output is with respect to the constraint's start.
#[derive(Clone, Debug, PartialEq)]
enum Gate {
    /// Free until the output produces the closing tokens; `tail` holds the last tokens seen.
    Free { tail: Vec<u32> },
    /// At the first token: this token opens a free block (ended by the closing tokens); any
    /// other token is the grammar's.
    First(u32),
    /// The grammar applies.
    Open,
}

impl Gate {
    /// The gate after `token`, and whether the grammar takes the token.
    fn advance(&self, token: u32, close: &[u32]) -> (Gate, bool) {
        match self {
            Gate::Free { tail } => {
                let mut t = tail.clone();
                t.push(token);
                if t.len() > close.len() {
                    t.remove(0);
                }
                (if t == close { Gate::Open } else { Gate::Free { tail: t } }, false)
            }
            Gate::First(open) if *open == token => (Gate::Free { tail: Vec::new() }, false),
            Gate::First(_) | Gate::Open => (Gate::Open, true),
        }
    }
}

pub(crate) struct SeqConstraint {
    slot: Slot,
    /// Observes each mask's computation time.
    timing: Histogram,
    gate: Gate,
    /// The tokens that end a free block (the constraint's `start_after`).
    close: Vec<u32>,
}

impl SeqConstraint {
    pub fn new(c: &Constraint, timing: Histogram) -> SeqConstraint {
        let gate = match (c.start_after.is_empty(), c.opens_with) {
            (true, _) => Gate::Open,
            (false, Some(t)) => Gate::First(t),
            (false, None) => Gate::Free { tail: Vec::new() },
        };
        SeqConstraint { slot: Slot::Idle(c.grammar.matcher()), timing, gate, close: c.start_after.clone() }
    }

    /// Whether the next token is masked.
    pub fn active(&self) -> bool {
        !matches!(self.gate, Gate::Free { .. })
    }

    /// Starts computing the grammar's next mask on a mask thread (no-op when free, computing or
    /// computed).
    pub fn prefetch(&mut self, pool: &MaskPool) {
        if !self.active() {
            return;
        }
        if let Slot::Idle(_) = self.slot {
            let Slot::Idle(mut m) = std::mem::replace(&mut self.slot, Slot::Gone) else { unreachable!() };
            let (tx, rx) = mpsc::channel();
            let timing = self.timing.clone();
            pool.spawn(move || {
                let r = timed(&timing, &mut m);
                let _ = tx.send((m, r));
            });
            self.slot = Slot::Computing(rx);
        }
    }

    /// Waits for a prefetched mask on the calling thread. Called outside the mask threads
    /// before masks are gathered on them: a mask thread blocked on a job queued behind it on the
    /// same pool could wait forever.
    pub fn wait_prefetch(&mut self) {
        let _ = self.settle();
    }

    /// Waits for the computing mask (if any) and hands the matcher back.
    fn settle(&mut self) -> Result<(), String> {
        if let Slot::Computing(rx) = &self.slot {
            self.slot = match rx.recv() {
                Ok((m, r)) => Slot::Ready(m, r),
                Err(_) => Slot::Gone,
            };
        }
        match self.slot {
            Slot::Gone => Err("the grammar's matcher was lost (a mask thread failed)".into()),
            _ => Ok(()),
        }
    }

    /// The mask of the next token (computing it now if no thread has); None when free. At the
    /// first token of a gate that may open a block, the opening token is allowed too.
    pub fn mask(&mut self) -> Result<Option<&[u32]>, String> {
        if !self.active() {
            return Ok(None);
        }
        self.settle()?;
        if let Slot::Idle(_) = self.slot {
            let Slot::Idle(mut m) = std::mem::replace(&mut self.slot, Slot::Gone) else { unreachable!() };
            let r = timed(&self.timing, &mut m);
            self.slot = Slot::Ready(m, r);
        }
        let first = if let Gate::First(t) = self.gate { Some(t) } else { None };
        match &mut self.slot {
            Slot::Ready(_, Ok(v)) => {
                if let Some(t) = first {
                    if let Some(w) = v.get_mut(t as usize / 32) {
                        *w |= 1 << (t % 32);
                    }
                }
                Ok(Some(v))
            }
            Slot::Ready(_, Err(e)) => Err(format!("the grammar failed: {e}")),
            _ => unreachable!("settled"),
        }
    }

    /// Masks of the rows after the next one in a verify step (row j: the state after the first
    /// j drafts; None: a free row). A draft the grammar forbids ends the list: its row and the
    /// rows after it are never emitted (the row before cannot sample it). The matcher is
    /// rolled back.
    pub fn draft_masks(&mut self, drafts: &[u32]) -> Result<Vec<Option<Vec<u32>>>, String> {
        if drafts.is_empty() {
            return Ok(vec![]);
        }
        self.settle()?;
        let mut m = match std::mem::replace(&mut self.slot, Slot::Gone) {
            Slot::Idle(m) | Slot::Ready(m, _) => m,
            _ => unreachable!("settled"),
        };
        let (mut gate, mut out, mut consumed) = (self.gate.clone(), Vec::new(), 0);
        let r = (|| {
            for &d in drafts {
                let (next, eat) = gate.advance(d, &self.close);
                if eat {
                    if m.is_stopped() || m.try_consume_tokens(&[d]).map_err(|e| e.to_string())? == 0 {
                        break;
                    }
                    consumed += 1;
                }
                gate = next;
                if gate != Gate::Open {
                    out.push(None);
                    continue;
                }
                let t = Instant::now();
                let mask = m.compute_mask_or_eos().map_err(|e| format!("the grammar failed: {e}"))?;
                self.timing.observe(t.elapsed().as_secs_f64());
                out.push(Some(mask.as_slice().to_vec()));
                if m.is_stopped() {
                    break;
                }
            }
            m.rollback(consumed).map_err(|e| format!("rolling the grammar back over rejected drafts: {e}"))
        })();
        // The mask computed for the current state (if any) was consumed above: recompute later.
        self.slot = Slot::Idle(m);
        r.map(|_| out)
    }

    /// Commits a generated token: the gate may open; an open constraint advances (a token it
    /// forbids is an error: the model's sampler did not apply the mask).
    pub fn commit(&mut self, token: u32) -> Result<Advance, String> {
        let (next, eat) = self.gate.advance(token, &self.close);
        self.gate = next;
        if !eat {
            return Ok(Advance::Open);
        }
        self.settle()?;
        let mut m = match std::mem::replace(&mut self.slot, Slot::Gone) {
            Slot::Idle(m) | Slot::Ready(m, _) => m,
            _ => unreachable!("settled"),
        };
        let r = m.consume_token(token);
        let stopped = m.is_stopped();
        self.slot = Slot::Idle(m);
        r.map_err(|e| format!("token {token} is not allowed by the grammar ({}): the model's sampler ignored the token mask", e.to_string().lines().next().unwrap_or_default()))?;
        Ok(if stopped { Advance::Complete } else { Advance::Open })
    }
}

/// The matcher's mask, its computation time observed.
fn timed(h: &Histogram, m: &mut Matcher) -> Result<Vec<u32>, String> {
    let t = Instant::now();
    let r = m.compute_mask().map(|v| v.as_slice().to_vec()).map_err(|e| e.to_string());
    h.observe(t.elapsed().as_secs_f64());
    r
}
