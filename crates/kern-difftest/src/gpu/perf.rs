//! The performance diff: every interval pair and the whole step timed on both sides, with the
//! bytes each side's calls move ([`crate::traffic`]) and, for decode-shaped steps, the achieved
//! bandwidth and each side's floor at the device copy bandwidth measured here.

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
        let copy_gbs = self.copy_bandwidth();
        if copy_gbs.is_none() {
            self.notes.push("the device copy bandwidth could not be measured: no floors".into());
        }
        let mut perf = Perf { threshold: thr, reps, l2_flush_bytes: flush.as_ref().map_or(0, |_| FLUSH), steps: vec![], copy_gbs };
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
            let iv_bytes: Vec<(Option<u64>, Option<u64>)> = ivs.iter().map(|iv| (traffic::range_bytes(&self.a.manifest, iv.a.clone(), &sh.va), traffic::range_bytes(&self.b.manifest, iv.b.clone(), &sh.vb))).collect();
            let (whole_a, whole_b) = (traffic::range_bytes(&self.a.manifest, 0..na, &sh.va), traffic::range_bytes(&self.b.manifest, 0..nb, &sh.vb));
            let decode = sh.step.as_ref().is_some_and(|s| s.is_decode());
            let mut step = StepPerf {
                step: sh.name.clone(),
                whole: PerfRow { bytes_a: whole_a, bytes_b: whole_b, ..PerfRow::timed("whole step (eager)", wa, wb, classify(&wa, &wb, thr, floor)) },
                by_op: vec![],
                flagged: vec![],
                intervals_timed: rows.len(),
                decode,
            };
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
                step.by_op.push(PerfRow { bytes_a: whole_a, bytes_b: whole_b, ..PerfRow::timed("whole step (CUDA graph, warm)", a, b, classify(&a, &b, thr, floor)) });
            }
            // Per op (1:1 intervals of one op) and per fusion / split.
            let add = |x: Option<u64>, y: Option<u64>| x.zip(y).map(|(x, y)| x + y);
            // Per op: (name, A ms, B ms, A bytes, B bytes).
            type OpSum = (String, f64, f64, Option<u64>, Option<u64>);
            let mut by: Vec<OpSum> = Vec::new();
            for (k, (iv, (a, b))) in ivs.iter().zip(&rows).enumerate() {
                let oa: Vec<&str> = self.an.calls_a[iv.a.clone()].iter().map(|c| c.op.as_str()).collect();
                let ob: Vec<&str> = self.an.calls_b[iv.b.clone()].iter().map(|c| c.op.as_str()).collect();
                let name = if oa == ob && oa.len() == 1 { oa[0].to_string() } else { format!("{} ↔ {}", oa.join("+"), ob.join("+")) };
                let (ba, bb) = iv_bytes[k];
                match by.iter_mut().find(|x| x.0 == name) {
                    Some(x) => {
                        x.1 += a.median;
                        x.2 += b.median;
                        x.3 = add(x.3, ba);
                        x.4 = add(x.4, bb);
                    }
                    None => by.push((name, a.median, b.median, ba, bb)),
                }
            }
            for (name, a, b, bytes_a, bytes_b) in by {
                let (ta, tb) = (Timing { median: a, q1: a, q3: a, samples: 1 }, Timing { median: b, q1: b, q3: b, samples: 1 });
                // Sums of medians carry no spread: classify by the threshold alone.
                let class = if (b - a).abs() <= thr * a || (b - a).abs() < floor {
                    PerfClass::Same
                } else if b > a {
                    PerfClass::Slower
                } else {
                    PerfClass::Faster
                };
                step.by_op.push(PerfRow { bytes_a, bytes_b, ..PerfRow::timed(name, ta, tb, class) });
            }
            let mut flagged: Vec<(f64, PerfRow)> = Vec::new();
            for (k, (iv, (a, b))) in ivs.iter().zip(&rows).enumerate() {
                let class = classify(a, b, thr, floor);
                if matches!(class, PerfClass::Slower | PerfClass::Faster) {
                    let name = format!("#{k} {} ↔ {}", labels(&self.an.calls_a, &iv.a), labels(&self.an.calls_b, &iv.b));
                    let (bytes_a, bytes_b) = iv_bytes[k];
                    flagged.push(((b.median - a.median).abs(), PerfRow { bytes_a, bytes_b, ..PerfRow::timed(name, *a, *b, class) }));
                }
            }
            flagged.sort_by(|x, y| y.0.total_cmp(&x.0));
            step.flagged = flagged.into_iter().take(10).map(|x| x.1).collect();
            perf.steps.push(step);
        }
        Ok(perf)
    }

    /// Device-to-device copy bandwidth (read + write bytes over time), GB/s: 10 copies of
    /// 256 MiB (far past the L2, so HBM) after 3 warm-ups, timed with events — what a
    /// memory-bound step can reach, as `kern bench` measures it.
    fn copy_bandwidth(&self) -> Option<f64> {
        let ctx = self.a.context();
        let len = 256usize << 20;
        let (src, dst) = (ctx.alloc(len).ok()?, ctx.alloc(len).ok()?);
        let s = self.a.stream();
        for _ in 0..3 {
            dst.copy_from_device_async(0, &src, 0, len, s).ok()?;
        }
        let (start, end) = (kern_cuda::Event::new(ctx, true).ok()?, kern_cuda::Event::new(ctx, true).ok()?);
        start.record(s).ok()?;
        for _ in 0..10 {
            dst.copy_from_device_async(0, &src, 0, len, s).ok()?;
        }
        end.record(s).ok()?;
        s.synchronize().ok()?;
        let ms = kern_cuda::Event::elapsed_ms(&start, &end).ok()? as f64;
        (ms > 0.0).then(|| 10.0 * 2.0 * len as f64 / (ms / 1e3) / 1e9)
    }
}
