//! The precision diff: both programs over the scheduled steps, interval by interval from golden
//! inputs on the first prefill and the first decode step (each interval's own error, judged by
//! tolerance and bias), B then running from its own values (where it leaves A, how the error
//! grows), logits and greedy tokens on every step, judged against the noise floor A′
//! ([`super::floor`]).

use super::floor::Floor;
use super::*;
use crate::noise::{EndToEnd, SparseError};
use crate::precision::layer_of;
use crate::report::{Departure, IntervalLabel, SyncError};

/// One side's outputs of a step: the sampled tokens and, when exposed, the logits.
pub(super) struct Outputs {
    pub sampled: Vec<i32>,
    pub logits: Option<Vec<f32>>,
}

/// KL(A ‖ B) of every row of `vocab` logits.
pub(super) fn kl_rows(a: &[f32], b: &[f32], vocab: usize) -> Vec<f64> {
    a.chunks_exact(vocab.max(1)).zip(b.chunks_exact(vocab.max(1))).map(|(x, y)| numeric::kl_divergence(x, y)).collect()
}

impl Session<'_> {
    pub(super) fn outputs(&self, rt: &Runtime, side: &str, st: &Step) -> Result<Option<Outputs>, String> {
        let Some(abi) = &rt.manifest.step else { return Ok(None) };
        let sampled = read_i32(rt, abi.sampled, st.real_seqs).map_err(|e| rt_err(side, e))?;
        let logits = match abi.logits {
            Some(l) => Some(read_f32(rt, l, st.real_seqs * self.vocab).map_err(|e| rt_err(side, e))?),
            None => None,
        };
        Ok(Some(Outputs { sampled, logits }))
    }

    pub(super) fn precision(&mut self, report: &mut Report) -> Result<Vec<Shape>, String> {
        let mut prec = Precision::default();
        let ivs = self.an.matching.intervals.clone();
        prec.intervals = ivs
            .iter()
            .map(|iv| IntervalLabel { a_calls: labels(&self.an.calls_a, &iv.a), b_calls: labels(&self.an.calls_b, &iv.b), layer: self.an.calls_a.get(iv.a.start).and_then(|c| layer_of(&c.label)) })
            .collect();
        let mut perf_shapes = Vec::new();
        let mut logit_parts: Vec<LogitStats> = Vec::new();
        let shapes: Vec<Shape>;
        let mut sched = None;
        if self.a.manifest.step.is_some() {
            let mut s = self.scheduler();
            let mc = self.max_context().saturating_sub(self.opts.decode_steps + 2).max(1);
            for (k, &l) in PROMPTS.iter().take(self.max_seqs).enumerate() {
                let params = SamplingParams { max_tokens: self.opts.decode_steps + 1, ignore_eos: true, ..Default::default() };
                s.add(self.prompt(l.min(mc), k), params).map_err(|e| format!("the scenario's prompt {k}: {e}"))?;
            }
            sched = Some(s);
            shapes = vec![];
        } else {
            shapes = vec![Shape { name: "run".into(), step: None, va: self.vars(&self.a.manifest, &[]), vb: self.vars(&self.b.manifest, &[]) }];
        }
        // The noise floor: only for a change meant to be equal, and only with a step ABI (A′
        // is compared on its sampled tokens and logits).
        let mut floor = (self.opts.noise_floor && self.opts.precision.is_none() && sched.is_some()).then(Floor::default);
        let mut b_e2e = EndToEnd::default();
        let (mut golden_prefill, mut golden_decode) = (false, false);
        let mut k = 0usize;
        let mut decode_no = 0usize;
        loop {
            let sh = match &mut sched {
                Some(s) => {
                    let Some(st) = s.schedule(|t, q, _| (t, q)) else { break };
                    let name = if st.is_decode() {
                        decode_no += 1;
                        format!("decode {decode_no} ({} seqs)", st.real_seqs)
                    } else {
                        format!("prefill {} seqs / {} tokens", st.real_seqs, st.real_tokens)
                    };
                    self.step_shape(name, st)
                }
                None => match shapes.get(k) {
                    Some(s) => s.clone(),
                    None => break,
                },
            };
            k += 1;
            let decode = sh.step.as_ref().is_some_and(|s| s.is_decode());
            let golden = if decode { !std::mem::replace(&mut golden_decode, true) } else { !std::mem::replace(&mut golden_prefill, true) };
            if golden {
                perf_shapes.push(sh.clone());
            }
            if let Some(f) = &mut floor {
                f.begin(self)?;
            }
            self.upload(&sh)?;
            let mut sp = StepPrecision { step: sh.name.clone(), decode, tokens: sh.step.as_ref().map_or(0, |s| s.real_tokens), seqs: sh.step.as_ref().map_or(0, |s| s.real_seqs), ..Default::default() };
            if golden {
                self.intervals(&sh, &mut sp, floor.as_mut().map(|f| &mut f.errors))?;
            } else {
                let (na, nb) = (self.an.calls_a.len(), self.an.calls_b.len());
                self.a.run_calls(0, &sh.va, 0..na, false).map_err(|e| rt_err(&format!("A, {}", sh.name), e))?;
                self.b.run_calls(0, &sh.vb, 0..nb, false).map_err(|e| rt_err(&format!("B, {}", sh.name), e))?;
            }
            // Outputs of the step: sampled tokens and logits.
            let mut sampled_a = Vec::new();
            if let Some(st) = &sh.step {
                let (Some(oa), Some(ob)) = (self.outputs(&self.a, "A", st)?, self.outputs(&self.b, "B", st)?) else { return Err("one manifest has a step ABI and the other not".into()) };
                let (ra, rb) = (&oa.sampled, &ob.sampled);
                if let (Some(fa), Some(fb)) = (&oa.logits, &ob.logits) {
                    let ls = numeric::logit_stats(fa, fb, self.vocab);
                    sp.logits = Some(ls.clone());
                    logit_parts.push(ls);
                    b_e2e.kl.extend(kl_rows(fa, fb, self.vocab));
                }
                sp.sampled = ra.len();
                sp.sampled_agree = ra.iter().zip(rb).filter(|(x, y)| x == y).count();
                prec.greedy_positions += ra.len();
                prec.greedy_agree += sp.sampled_agree;
                if prec.greedy_first_disagreement.is_none() {
                    if let Some(q) = ra.iter().zip(rb).position(|(x, y)| x != y) {
                        let extra = oa.logits.as_ref().zip(ob.logits.as_ref()).map_or(String::new(), |(fa, fb)| {
                            let v = self.vocab;
                            let (ta, tb) = (numeric::top_k(&fa[q * v..(q + 1) * v], 5), numeric::top_k(&fb[q * v..(q + 1) * v], 5));
                            format!(" (A's token in B's top 5: {}, B's in A's: {})", tb.contains(&(ra[q] as usize)), ta.contains(&(rb[q] as usize)))
                        });
                        prec.greedy_first_disagreement = Some(format!("at {}, sequence {q}: A {} vs B {}{extra}", sh.name, ra[q], rb[q]));
                    }
                }
                if let Some(f) = &mut floor {
                    f.run(self, &sh, decode, &oa)?;
                }
                sampled_a = oa.sampled;
            }
            prec.steps.push(sp);
            if let (Some(s), Some(st)) = (&mut sched, &sh.step) {
                // Teacher forcing: both sides (and A′) continue with A's tokens.
                let toks: Vec<i32> = sampled_a.iter().map(|&t| t.clamp(0, self.vocab as i32 - 1)).collect();
                s.commit(st, &toks);
            }
        }
        if !logit_parts.is_empty() {
            let l = numeric::merge_logit_stats(&logit_parts);
            if l.kl_mean > self.opts.kl_mean_max {
                prec.logit_failures.push(format!("mean KL divergence {:.3e} > {:.1e} (--kl-mean)", l.kl_mean, self.opts.kl_mean_max));
            }
            if l.top5_violations > 0 {
                prec.logit_failures.push(format!("{} position(s) where one side's top token is not in the other's top 5", l.top5_violations));
            }
            prec.logits = Some(l);
        }
        if let Some(f) = floor {
            b_e2e.positions = prec.greedy_positions;
            b_e2e.greedy_differ = prec.greedy_positions - prec.greedy_agree;
            let (floor_report, floor_e2e) = f.finish();
            let (lines, fails) = crate::noise::judge(&b_e2e, &floor_e2e);
            prec.floor_judgement = lines;
            prec.logit_failures.extend(fails);
            prec.floor = Some(floor_report);
        }
        report.precision = Some(prec);
        Ok(perf_shapes)
    }

    /// Reads the common buffer `c` of both sides at the shape's var values.
    fn read_common(&self, c: usize, sh: &Shape) -> Result<(Vec<u8>, Vec<u8>), String> {
        let cm = &self.an.commons[c];
        let len = self.a.manifest.buffer_bytes(cm.a, &sh.va).map_err(|e| e.to_string())? as usize;
        let ra = self.a.read_buffer(cm.a, len).map_err(|e| rt_err("A", e))?;
        let rb = self.b.read_buffer(cm.b, len).map_err(|e| rt_err("B", e))?;
        Ok((ra, rb))
    }

    fn divergence(&self, sh: &Shape, k: usize, c: usize, stats: numeric::Stats) -> Divergence {
        let iv = &self.an.matching.intervals[k];
        let ops = |calls: &[crate::matching::CallRw], r: &std::ops::Range<usize>| {
            let mut v: Vec<&str> = calls[r.clone()].iter().map(|c| c.op.as_str()).collect();
            v.dedup();
            v.join(", ")
        };
        Divergence {
            step: sh.name.clone(),
            interval: k,
            a_calls: labels(&self.an.calls_a, &iv.a),
            b_calls: labels(&self.an.calls_b, &iv.b),
            a_ops: ops(&self.an.calls_a, &iv.a),
            b_ops: ops(&self.an.calls_b, &iv.b),
            buffer: self.an.commons[c].name.clone(),
            dtype: self.an.commons[c].dtype.name().into(),
            stats,
        }
    }

    /// A's and B's bytes of common buffer `c` compared with the row length of A's buffer and
    /// the bias gate on or off.
    fn compare_common(&self, c: usize, sh: &Shape, ra: &[u8], rb: &[u8], gate: bool) -> numeric::Stats {
        let cm = &self.an.commons[c];
        numeric::compare_rows(ra, rb, cm.dtype, &Tolerance::default_for(cm.dtype), row_len(&self.a.manifest, cm.a, &sh.va), gate)
    }

    /// One step interval by interval: local (B from A's values at each entry: tolerance and
    /// bias), then B free-running against A's values at each sync point (where B leaves A,
    /// the carried error). B's local errors go to `errors` for the noise floor.
    fn intervals(&mut self, sh: &Shape, sp: &mut StepPrecision, mut errors: Option<&mut HashMap<(bool, usize, usize), SparseError>>) -> Result<(), String> {
        let mut snaps = Vec::new();
        for &(sa, sb) in &self.states {
            snaps.push(self.b.snapshot_state(sb).map_err(|e| rt_err("B", e))?);
            self.b.copy_state_from(sb, &self.a, sa).map_err(|e| rt_err("B", e))?;
        }
        let decode = sp.decode;
        let ivs = self.an.matching.intervals.clone();
        let layer = |k: usize| self.an.calls_a.get(ivs[k].a.start).and_then(|c| layer_of(&c.label));
        let mut golden_out: Vec<Vec<(usize, Vec<u8>)>> = Vec::with_capacity(ivs.len());
        for (k, iv) in ivs.iter().enumerate() {
            for &c in &iv.inputs {
                let cm = &self.an.commons[c];
                if matches!(cm.role, Role::Weight | Role::Input) {
                    continue;
                }
                self.b.copy_buffer_from(cm.b, &self.a, cm.a).map_err(|e| rt_err("B", e))?;
            }
            self.a.run_calls(0, &sh.va, iv.a.clone(), false).map_err(|e| format!("A, {}, {}: {e}", sh.name, labels(&self.an.calls_a, &iv.a)))?;
            self.b.run_calls(0, &sh.vb, iv.b.clone(), false).map_err(|e| format!("B, {}, {}: {e}", sh.name, labels(&self.an.calls_b, &iv.b)))?;
            let mut outs = Vec::new();
            let mut failed = false;
            let mut err = SyncError { interval: k, layer: layer(k), exact: true, ..Default::default() };
            for &c in &iv.outputs {
                let (ra, rb) = self.read_common(c, sh)?;
                let st = self.compare_common(c, sh, &ra, &rb, true);
                pool_into(&mut err, &st, ra == rb);
                if ra != rb {
                    if let Some(map) = errors.as_deref_mut() {
                        let dt = self.an.commons[c].dtype;
                        if numeric::is_float(dt) {
                            if let Some(e) = SparseError::of(&numeric::to_f64(&ra, dt), &numeric::to_f64(&rb, dt)) {
                                map.insert((decode, k, c), e);
                            }
                        }
                    }
                }
                if !st.ok() && !failed {
                    failed = true;
                    if sp.first_local.is_none() {
                        sp.first_local = Some(self.divergence(sh, k, c, st));
                    }
                }
                outs.push((c, ra));
            }
            sp.local_errors.push(finish_pool(err));
            sp.local_checked += 1;
            sp.local_failures += usize::from(failed);
            golden_out.push(outs);
        }
        // B free-running from its own state.
        for (&(_, sb), snap) in self.states.iter().zip(&snaps) {
            if let Some(s) = snap {
                self.b.restore_state(sb, s).map_err(|e| rt_err("B", e))?;
            }
        }
        for (k, iv) in ivs.iter().enumerate() {
            self.b.run_calls(0, &sh.vb, iv.b.clone(), false).map_err(|e| format!("B, {}, {}: {e}", sh.name, labels(&self.an.calls_b, &iv.b)))?;
            let mut err = SyncError { interval: k, layer: layer(k), exact: true, ..Default::default() };
            for (c, ra) in &golden_out[k] {
                let cm = &self.an.commons[*c];
                let rb = self.b.read_buffer(cm.b, ra.len()).map_err(|e| rt_err("B", e))?;
                let st = self.compare_common(*c, sh, ra, &rb, false);
                pool_into(&mut err, &st, *ra == rb);
                if sp.first_departure.is_none() && *ra != rb {
                    sp.first_departure = Some(Departure {
                        step: sh.name.clone(),
                        interval: k,
                        a_calls: labels(&self.an.calls_a, &iv.a),
                        b_calls: labels(&self.an.calls_b, &iv.b),
                        buffer: cm.name.clone(),
                        rel_rms: st.errors.as_ref().map_or(f64::NAN, |e| e.rel_rms),
                        max_ulp: st.max_ulp,
                        differ: 1.0 - st.exact as f64 / st.elements.max(1) as f64,
                    });
                }
                if sp.first_drift.is_none() && !st.pass {
                    sp.first_drift = Some(self.divergence(sh, k, *c, st));
                }
            }
            sp.carried_errors.push(finish_pool(err));
        }
        Ok(())
    }
}

/// Adds one output's error sums to an interval's pooled error.
fn pool_into(err: &mut SyncError, st: &numeric::Stats, same_bytes: bool) {
    if let Some(e) = &st.errors {
        err.sum_a2 += e.sum_a2;
        err.sum_e2 += e.sum_e2;
    }
    err.exact &= same_bytes;
}

fn finish_pool(mut err: SyncError) -> SyncError {
    err.rel_rms = if err.sum_a2 > 0.0 { (err.sum_e2 / err.sum_a2).sqrt() } else { 0.0 };
    err.snr_db = crate::stats::snr_db(err.sum_a2, err.sum_e2);
    err
}
