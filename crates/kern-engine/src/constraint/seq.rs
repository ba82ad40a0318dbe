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

pub(crate) struct SeqConstraint {
    slot: Slot,
    /// Observes each mask's computation time.
    timing: Histogram,
    gate: Vec<u32>,
    /// The last generated tokens while the gate is closed.
    tail: Vec<u32>,
    open: bool,
}

impl SeqConstraint {
    pub fn new(c: &Constraint, timing: Histogram) -> SeqConstraint {
        SeqConstraint { slot: Slot::Idle(c.grammar.matcher()), timing, gate: c.start_after.clone(), tail: Vec::new(), open: c.start_after.is_empty() }
    }

    /// Whether the constraint applies to the next token.
    pub fn active(&self) -> bool {
        self.open
    }

    /// Starts computing the next token's mask on a mask thread (no-op when closed, computing
    /// or computed).
    pub fn prefetch(&mut self, pool: &MaskPool) {
        if !self.open {
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

    /// The mask of the next token (computing it now if no thread has); None when the
    /// constraint has not started.
    pub fn mask(&mut self) -> Result<Option<&[u32]>, String> {
        if !self.open {
            return Ok(None);
        }
        self.settle()?;
        if let Slot::Idle(_) = self.slot {
            let Slot::Idle(mut m) = std::mem::replace(&mut self.slot, Slot::Gone) else { unreachable!() };
            let r = timed(&self.timing, &mut m);
            self.slot = Slot::Ready(m, r);
        }
        match &self.slot {
            Slot::Ready(_, Ok(v)) => Ok(Some(v)),
            Slot::Ready(_, Err(e)) => Err(format!("the grammar failed: {e}")),
            _ => unreachable!("settled"),
        }
    }

    /// Masks of the rows after the next one in a verify step: row j's mask is the state after
    /// the first j drafts. A draft the grammar forbids ends the list (its row and the rows after
    /// it are discarded anyway: the row before it cannot sample it). The matcher is rolled back.
    pub fn draft_masks(&mut self, drafts: &[u32]) -> Result<Vec<Vec<u32>>, String> {
        if !self.open || drafts.is_empty() {
            return Ok(vec![]);
        }
        self.mask()?;
        let Slot::Ready(m, _) = &mut self.slot else { unreachable!("mask() leaves it ready") };
        let mut out = Vec::new();
        let mut consumed = 0;
        for &d in drafts {
            if m.is_stopped() || m.try_consume_tokens(&[d]).map_err(|e| e.to_string())? == 0 {
                break;
            }
            consumed += 1;
            if m.is_stopped() {
                break;
            }
            out.push(timed(&self.timing, m).map_err(|e| format!("the grammar failed: {e}"))?);
        }
        m.rollback(consumed).map_err(|e| format!("rolling the grammar back over rejected drafts: {e}"))?;
        Ok(out)
    }

    /// Commits a generated token: the gate may open; an open constraint advances (a token it
    /// forbids is an error: the model's sampler did not apply the mask).
    pub fn commit(&mut self, token: u32) -> Result<Advance, String> {
        if !self.open {
            self.tail.push(token);
            if self.tail.len() > self.gate.len() {
                self.tail.remove(0);
            }
            self.open = self.tail == self.gate;
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
