//! The noise-floor run A′ ([`crate::noise`]): A's program again, on A's runtime with its own
//! KV state, each compared interval's outputs perturbed by B's local error with random signs,
//! teacher-forced with A's tokens like B. A's state is swapped out around each A′ step, so A
//! and B run exactly as without the floor.

use super::precision::{kl_rows, Outputs};
use super::*;
use crate::noise::{perturb, EndToEnd, SparseError};
use crate::report::NoiseFloor;
use kern_cuda::DeviceBuffer;

#[derive(Default)]
pub(super) struct Floor {
    /// A′'s state pools between steps (None before the first step).
    snaps: Option<Vec<Option<DeviceBuffer>>>,
    /// B's local errors by (decode step, interval, common buffer), from the golden steps.
    pub errors: HashMap<(bool, usize, usize), SparseError>,
    e2e: EndToEnd,
    logit_parts: Vec<LogitStats>,
    greedy_agree: usize,
    injected: usize,
    skipped: usize,
    steps: u64,
}

fn all_states(rt: &Runtime) -> Vec<StateId> {
    (0..rt.manifest.states.len()).map(StateId).collect()
}

fn snapshot(rt: &Runtime) -> Result<Vec<Option<DeviceBuffer>>, String> {
    all_states(rt).into_iter().map(|s| rt.snapshot_state(s).map_err(|e| rt_err("A (noise floor)", e))).collect()
}

fn restore(rt: &Runtime, snaps: &[Option<DeviceBuffer>]) -> Result<(), String> {
    for (s, snap) in all_states(rt).into_iter().zip(snaps) {
        if let Some(b) = snap {
            rt.restore_state(s, b).map_err(|e| rt_err("A (noise floor)", e))?;
        }
    }
    Ok(())
}

impl Floor {
    /// Before a step: on the first one, A′ starts from A's state.
    pub fn begin(&mut self, s: &Session) -> Result<(), String> {
        if self.snaps.is_none() {
            self.snaps = Some(snapshot(&s.a)?);
        }
        Ok(())
    }

    /// After A and B ran step `sh` (A's outputs `a`): the same step as A′.
    pub fn run(&mut self, s: &mut Session, sh: &Shape, decode: bool, a: &Outputs) -> Result<(), String> {
        let Some(st) = &sh.step else { return Ok(()) };
        self.steps += 1;
        let post = snapshot(&s.a)?;
        restore(&s.a, self.snaps.as_deref().unwrap_or(&[]))?;
        let ivs = s.an.matching.intervals.clone();
        for (k, iv) in ivs.iter().enumerate() {
            s.a.run_calls(0, &sh.va, iv.a.clone(), false).map_err(|e| format!("A′ (noise floor), {}, {}: {e}", sh.name, labels(&s.an.calls_a, &iv.a)))?;
            for &c in &iv.outputs {
                let Some(err) = self.errors.get(&(decode, k, c)) else { continue };
                let cm = &s.an.commons[c];
                let len = s.a.manifest.buffer_bytes(cm.a, &sh.va).map_err(|e| e.to_string())? as usize;
                let bytes = s.a.read_buffer(cm.a, len).map_err(|e| rt_err("A′", e))?;
                let seed = s.opts.seed ^ (self.steps << 40) ^ ((k as u64) << 16) ^ c as u64;
                match perturb(&bytes, cm.dtype, err, seed) {
                    Some(p) => {
                        s.a.write_buffer(cm.a, &p).map_err(|e| rt_err("A′", e))?;
                        self.injected += 1;
                    }
                    // This step's shape differs from the golden step's (a later prefill chunk).
                    None => self.skipped += 1,
                }
            }
        }
        let f = s.outputs(&s.a, "A′", st)?.ok_or("A′: no step ABI")?;
        self.snaps = Some(snapshot(&s.a)?);
        restore(&s.a, &post)?;
        self.e2e.positions += a.sampled.len();
        let agree = a.sampled.iter().zip(&f.sampled).filter(|(x, y)| x == y).count();
        self.greedy_agree += agree;
        self.e2e.greedy_differ += a.sampled.len() - agree;
        if let (Some(la), Some(lf)) = (&a.logits, &f.logits) {
            self.logit_parts.push(numeric::logit_stats(la, lf, s.vocab));
            self.e2e.kl.extend(kl_rows(la, lf, s.vocab));
        }
        Ok(())
    }

    /// The floor for the report, and what the judgement needs.
    pub fn finish(self) -> (NoiseFloor, EndToEnd) {
        let logits = (!self.logit_parts.is_empty()).then(|| numeric::merge_logit_stats(&self.logit_parts));
        (NoiseFloor { logits, greedy_agree: self.greedy_agree, greedy_positions: self.e2e.positions, injected: self.injected, skipped: self.skipped }, self.e2e)
    }
}
