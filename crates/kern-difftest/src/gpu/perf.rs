//! The performance diff: every interval pair and the whole step timed on both sides.

use super::*;

impl Session<'_> {
    pub(super) fn perf(&mut self, shapes: &[Shape]) -> Result<Perf, String> {
        const FLUSH: usize = 256 << 20;
        let flush = match self.a.context().alloc(FLUSH) {
            Ok(b) => Some(b),
            Err(e) => {
                self.notes.push(format!("no L2 flush buffer ({e}): timings are warm"));
                None
            }
        };
        let reps = self.opts.perf_reps.max(3);
        let thr = self.opts.perf_threshold;
        let floor = 0.002;
        let mut perf = Perf { threshold: thr, reps, l2_flush_bytes: flush.as_ref().map_or(0, |_| FLUSH), steps: vec![] };
        let ivs = self.an.matching.intervals.clone();
        for sh in shapes {
            self.upload(sh)?;
            let time = |rt: &Runtime, vars: &[i64], r: std::ops::Range<usize>| -> Result<f64, String> { rt.time_calls(0, vars, r, flush.as_ref()).map(f64::from).map_err(|e| e.to_string()) };
            let mut rows = Vec::new();
            for iv in &ivs {
                for _ in 0..2 {
                    time(&self.a, &sh.va, iv.a.clone())?;
                    time(&self.b, &sh.vb, iv.b.clone())?;
                }
                let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
                for _ in 0..reps {
                    ta.push(time(&self.a, &sh.va, iv.a.clone())?);
                    tb.push(time(&self.b, &sh.vb, iv.b.clone())?);
                }
                let (a, b) = (Timing::of(&ta), Timing::of(&tb));
                rows.push((a, b));
            }
            // The whole step: eagerly with a cold L2, and as a CUDA graph for decode steps
            // whose sizes are their own bucket (what the engine replays).
            let (na, nb) = (self.an.calls_a.len(), self.an.calls_b.len());
            let (mut ta, mut tb) = (Vec::new(), Vec::new());
            for i in 0..reps + 2 {
                let (x, y) = (time(&self.a, &sh.va, 0..na)?, time(&self.b, &sh.vb, 0..nb)?);
                if i >= 2 {
                    ta.push(x);
                    tb.push(y);
                }
            }
            let (wa, wb) = (Timing::of(&ta), Timing::of(&tb));
            let mut step = StepPerf {
                step: sh.name.clone(),
                whole: PerfRow { name: "whole step (eager)".into(), a: wa, b: wb, class: classify(&wa, &wb, thr, floor) },
                by_op: vec![],
                flagged: vec![],
                intervals_timed: rows.len(),
            };
            let decode = sh.step.as_ref().is_some_and(|s| s.is_decode());
            if decode && self.a.bucket(&sh.va) == sh.va && self.b.bucket(&sh.vb) == sh.vb {
                let (mut ga, mut gb) = (Vec::new(), Vec::new());
                for i in 0..reps + 2 {
                    let x = self.a.run(0, &sh.va, Mode::Graph).map_err(|e| rt_err("A", e))?.gpu_ms as f64;
                    let y = self.b.run(0, &sh.vb, Mode::Graph).map_err(|e| rt_err("B", e))?.gpu_ms as f64;
                    if i >= 2 {
                        ga.push(x);
                        gb.push(y);
                    }
                }
                let (a, b) = (Timing::of(&ga), Timing::of(&gb));
                step.by_op.push(PerfRow { name: "whole step (CUDA graph, warm)".into(), a, b, class: classify(&a, &b, thr, floor) });
            }
            // Per op (1:1 intervals of one op) and per fusion / split.
            let mut by: Vec<(String, f64, f64)> = Vec::new();
            for (iv, (a, b)) in ivs.iter().zip(&rows) {
                let oa: Vec<&str> = self.an.calls_a[iv.a.clone()].iter().map(|c| c.op.as_str()).collect();
                let ob: Vec<&str> = self.an.calls_b[iv.b.clone()].iter().map(|c| c.op.as_str()).collect();
                let name = if oa == ob && oa.len() == 1 { oa[0].to_string() } else { format!("{} ↔ {}", oa.join("+"), ob.join("+")) };
                match by.iter_mut().find(|x| x.0 == name) {
                    Some(x) => {
                        x.1 += a.median;
                        x.2 += b.median;
                    }
                    None => by.push((name, a.median, b.median)),
                }
            }
            for (name, a, b) in by {
                let (ta, tb) = (Timing { median: a, q1: a, q3: a, samples: 1 }, Timing { median: b, q1: b, q3: b, samples: 1 });
                // Sums of medians carry no spread: classify by the threshold alone.
                let class = if (b - a).abs() <= thr * a || (b - a).abs() < floor {
                    PerfClass::Same
                } else if b > a {
                    PerfClass::Slower
                } else {
                    PerfClass::Faster
                };
                step.by_op.push(PerfRow { name, a: ta, b: tb, class });
            }
            let mut flagged: Vec<(f64, PerfRow)> = Vec::new();
            for (k, (iv, (a, b))) in ivs.iter().zip(&rows).enumerate() {
                let class = classify(a, b, thr, floor);
                if matches!(class, PerfClass::Slower | PerfClass::Faster) {
                    let name = format!("#{k} {} ↔ {}", labels(&self.an.calls_a, &iv.a), labels(&self.an.calls_b, &iv.b));
                    flagged.push(((b.median - a.median).abs(), PerfRow { name, a: *a, b: *b, class }));
                }
            }
            flagged.sort_by(|x, y| y.0.total_cmp(&x.0));
            step.flagged = flagged.into_iter().take(10).map(|x| x.1).collect();
            perf.steps.push(step);
        }
        Ok(perf)
    }
}
