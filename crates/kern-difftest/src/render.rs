//! The readable report of `kern test`: the verdict, then what a kernel author reads first —
//! the first divergence (tolerance or bias, with the statistic named), where B running from
//! its own values first leaves A, the end-to-end comparison against the noise floor — then the
//! sync points, the kernel diff, the precision diff per step, the precision budget
//! (`--precision`) and the performance diff with bytes and bandwidth.

use crate::numeric::Stats;
use crate::report::{PerfRow, Report, StepPerf, Verdict};
use crate::stats::ErrorStats;
use std::fmt::Write as _;

impl Report {
    /// The readable report.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "kern test {} {}", self.a, self.b);
        if let Some(d) = &self.device {
            let _ = writeln!(o, "  on {d}, seed {}", self.seed);
        }
        let verdict = match self.verdict {
            Verdict::Equal if self.match_only => "COMPARABLE (--match-only: matched, nothing ran)",
            Verdict::Equal if self.precision_mode => "WITHIN THE PRECISION BUDGET",
            Verdict::Equal => "EQUAL within tolerance, unbiased",
            Verdict::Differs if self.precision_mode => "BEYOND THE PRECISION BUDGET",
            Verdict::Differs => "DIFFERS",
            Verdict::Incomparable => "NOT COMPARABLE",
        };
        let _ = writeln!(o, "\nverdict: {verdict} (exit {})", self.exit_code());
        if let Some(r) = &self.reason {
            let _ = writeln!(o, "  {r}");
        }
        self.render_divergence(&mut o);
        self.render_drift(&mut o);
        self.render_end_to_end(&mut o);
        if let Some(b) = &self.budget {
            crate::precision::render(b, &mut o);
        }
        self.render_matching(&mut o);
        self.render_kernels(&mut o);
        self.render_steps(&mut o);
        if let Some(perf) = &self.perf {
            let _ = writeln!(o, "\nperformance diff (median of {} runs, L2 flushed, threshold {:.0}%):", perf.reps, 100.0 * perf.threshold);
            if let Some(g) = perf.copy_gbs {
                let _ = writeln!(o, "  bytes: the buffers each call reads and writes at the step's sizes (KV pages not counted); floor = bytes at the {g:.0} GB/s device copy bandwidth");
            }
            for s in &perf.steps {
                render_perf_step(&mut o, s, perf.copy_gbs);
            }
            let n = perf.regressions();
            if n > 0 {
                let _ = writeln!(o, "  {n} regression(s) over the threshold (flagged; not part of the exit code)");
            }
        }
        for n in &self.notes {
            let _ = writeln!(o, "note: {n}");
        }
        o
    }

    fn render_divergence(&self, o: &mut String) {
        let Some(d) = &self.first_divergence else { return };
        let _ = writeln!(o, "\nfirst divergence — {} step, interval #{}:", d.step, d.interval);
        let _ = writeln!(o, "  A: {}  (op {})", d.a_calls, d.a_ops);
        let _ = writeln!(o, "  B: {}  (op {})", d.b_calls, d.b_ops);
        let _ = writeln!(o, "  output `{}` ({}) from identical inputs: {}", d.buffer, d.dtype, stats_line(&d.stats));
        if let Some(b) = &d.stats.bias {
            let within = if d.stats.pass { "every element within tolerance, but " } else { "" };
            let _ = writeln!(o, "  {within}BIASED — {b}");
        }
        if let Some(e) = &d.stats.errors {
            let _ = writeln!(o, "  error: {}", error_line(e));
        }
        if let Some((i, x, y)) = d.stats.worst {
            let _ = writeln!(o, "  worst element #{i}: A {x:.6e}, B {y:.6e}");
        }
    }

    /// Where B running from its own values leaves A — printed whatever the verdict.
    fn render_drift(&self, o: &mut String) {
        let Some(p) = &self.precision else { return };
        let steps: Vec<_> = p.steps.iter().filter(|s| s.local_checked > 0).collect();
        if steps.is_empty() {
            return;
        }
        let _ = writeln!(o, "\nrun forward (B from its own values, compared with A at every sync point):");
        for s in steps {
            let last = s.carried_errors.last();
            let end = last.map_or(String::new(), |e| format!("; at the last sync point #{} rel RMS {:.3e}", e.interval, e.rel_rms));
            match &s.first_departure {
                None => {
                    let _ = writeln!(o, "  {}: bit-identical to A at every sync point", s.step);
                }
                Some(d) => {
                    let _ = writeln!(
                        o,
                        "  {}: first leaves A at #{} A: {}  ↔  B: {}  (`{}`: {:.2}% of elements differ, max ulp {}, rel RMS {:.3e}){end}",
                        s.step,
                        d.interval,
                        d.a_calls,
                        d.b_calls,
                        d.buffer,
                        100.0 * d.differ,
                        d.max_ulp,
                        d.rel_rms
                    );
                    match &s.first_drift {
                        Some(t) => {
                            let _ = writeln!(o, "    beyond tolerance from #{} A: {}  ↔  B: {}  (`{}`)", t.interval, t.a_calls, t.b_calls, t.buffer);
                        }
                        None => {
                            let _ = writeln!(o, "    within tolerance at every sync point");
                        }
                    }
                }
            }
        }
    }

    fn render_end_to_end(&self, o: &mut String) {
        let Some(p) = &self.precision else { return };
        if p.floor.is_none() && p.floor_judgement.is_empty() {
            return;
        }
        let _ = writeln!(o, "\nend to end, against the noise floor of an honest change (A′: A with B's local errors, signs randomized):");
        if let Some(f) = &p.floor {
            if let Some(l) = &f.logits {
                let _ = writeln!(o, "  floor A′ vs A: KL mean {:.3e} max {:.3e}, top-1 agree {:.1}%, greedy {}/{} agree ({} outputs perturbed, {} without a measured error)", l.kl_mean, l.kl_max, 100.0 * l.top1_agree, f.greedy_agree, f.greedy_positions, f.injected, f.skipped);
            }
        }
        for j in &p.floor_judgement {
            let _ = writeln!(o, "  {j}");
        }
    }

    fn render_matching(&self, o: &mut String) {
        let Some(m) = &self.matching else { return };
        let _ = writeln!(o, "\nsync points: {} interval pairs over {} calls (A) and {} calls (B), {} common buffers", m.intervals, m.calls_a, m.calls_b, m.common_buffers);
        let _ = writeln!(o, "  1:1 {}, fused or split {}", m.one_to_one, m.fused_or_split.len());
        for p in m.fused_or_split.iter().take(20) {
            let _ = writeln!(o, "  #{:<4} {:>5}  A: {}  ↔  B: {}", p.index, p.kind, p.a_calls, p.b_calls);
        }
        if m.fused_or_split.len() > 20 {
            let _ = writeln!(o, "  … {} more", m.fused_or_split.len() - 20);
        }
        for u in &m.unpaired_buffers {
            let _ = writeln!(o, "  buffer `{u}`: written a different number of times on each side; only its last value is a sync point");
        }
        for d in &m.buffer_differs {
            let _ = writeln!(o, "  {d}: not the same buffer, never compared");
        }
    }

    fn render_kernels(&self, o: &mut String) {
        if self.ops.is_empty() && self.ops_only_a.is_empty() && self.ops_only_b.is_empty() {
            return;
        }
        let judged = if self.precision_mode { " — reported, not judged (--precision)" } else { "" };
        let _ = writeln!(o, "\nkernel diff (each op on identical inputs, both sides){judged}:");
        let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  worst (max abs / max rel / max ulp / exact / SNR dB)", "op", "impl", "checks", "fail");
        for d in &self.ops {
            let imp = if d.same_impl { "same" } else { "differ" };
            if let Some(s) = &d.skipped {
                let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  skipped: {s}", d.op, imp, "-", "-");
                continue;
            }
            let w = d.first_failure.as_ref().or(d.worst.as_ref());
            let desc = w.map_or("all bit-exact".to_string(), |c| format!("{} | {} | {} | {}", short_stats(&c.stats), c.shape, c.dist, c.output));
            let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  {}", d.op, imp, d.checks, d.failures, desc);
            if let Some(b) = d.first_failure.as_ref().and_then(|c| c.stats.bias.as_ref()) {
                let _ = writeln!(o, "  {:<24} BIASED — {b}", "");
            }
        }
        if !self.ops_only_a.is_empty() {
            let _ = writeln!(o, "  only in A: {} (covered by the interval comparison)", self.ops_only_a.join(", "));
        }
        if !self.ops_only_b.is_empty() {
            let _ = writeln!(o, "  only in B: {} (covered by the interval comparison)", self.ops_only_b.join(", "));
        }
        if !self.ops_signature_differs.is_empty() {
            let _ = writeln!(o, "  same name, different signature: {} (covered by the interval comparison)", self.ops_signature_differs.join(", "));
        }
    }

    fn render_steps(&self, o: &mut String) {
        let Some(p) = &self.precision else { return };
        let _ = writeln!(o, "\nprecision diff (same step inputs):");
        for s in &p.steps {
            let local = if s.local_checked > 0 { format!("local {} / {} intervals fail", s.local_failures, s.local_checked) } else { "no interval checks".into() };
            let drift = s.first_drift.as_ref().map_or("no drift beyond tolerance".to_string(), |d| format!("drift beyond tolerance from #{} ({} ↔ {}, `{}`)", d.interval, d.a_calls, d.b_calls, d.buffer));
            let _ = writeln!(o, "  {:<28} {local}; {drift}; sampled {}/{} agree", s.step, s.sampled_agree, s.sampled);
        }
        if let Some(l) = &p.logits {
            let _ = writeln!(
                o,
                "  logits over {} positions: KL mean {:.3e} max {:.3e}, top-1 agree {:.1}%, top-5 overlap {:.1}%, max |Δ| {:.3e}, top-5 rule violations {}",
                l.positions,
                l.kl_mean,
                l.kl_max,
                100.0 * l.top1_agree,
                100.0 * l.top5_overlap,
                l.max_abs,
                l.top5_violations
            );
        }
        let differ = p.greedy_positions - p.greedy_agree.min(p.greedy_positions);
        let judged = if differ == 0 {
            String::new()
        } else if p.floor_judgement.is_empty() {
            " — GREEDY TOKENS DIFFER (no noise floor measured)".into()
        } else {
            " — GREEDY TOKENS DIFFER (judged against the noise floor above)".into()
        };
        let _ = writeln!(o, "  greedy tokens: {}/{} agree{}{judged}", p.greedy_agree, p.greedy_positions, p.greedy_first_disagreement.as_ref().map_or(String::new(), |d| format!("; first disagreement {d}")));
        for f in &p.logit_failures {
            let _ = writeln!(o, "  FAIL {f}");
        }
    }
}

fn render_perf_step(o: &mut String, s: &StepPerf, copy_gbs: Option<f64>) {
    let kind = if s.decode { "decode-shaped: bandwidth-bound" } else { "prefill: compute-bound, bytes only" };
    let _ = writeln!(o, "  {} ({} intervals timed; {kind})", s.step, s.intervals_timed);
    let bw = s.decode && copy_gbs.is_some();
    if bw {
        let _ = writeln!(o, "    {:<30} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9}", "", "A µs", "B µs", "B/A", "A MB", "B MB", "A GB/s", "B GB/s", "A floor", "B floor");
    } else {
        let _ = writeln!(o, "    {:<30} {:>10} {:>10} {:>7} {:>9} {:>9}", "", "A µs", "B µs", "B/A", "A MB", "B MB");
    }
    let row = |o: &mut String, r: &PerfRow| {
        let mb = |b: Option<u64>| b.map_or("-".to_string(), |b| format!("{:.3}", b as f64 / 1e6));
        let mut line = format!("    {:<30} {:>10.1} {:>10.1} {:>7.3} {:>9} {:>9}", trunc(&r.name, 30), 1e3 * r.a.median, 1e3 * r.b.median, r.ratio(), mb(r.bytes_a), mb(r.bytes_b));
        if let (true, Some(g)) = (bw, copy_gbs) {
            let f = |x: Option<f64>, scale: f64, prec: usize| x.map_or("-".to_string(), |v| format!("{:.*}", prec, v * scale));
            let (ga, gb) = r.gbs();
            let (fa, fb) = r.floors_ms(g);
            let _ = write!(line, " {:>7} {:>7} {:>9} {:>9}", f(ga, 1.0, 0), f(gb, 1.0, 0), f(fa, 1e3, 1), f(fb, 1e3, 1));
        }
        let _ = writeln!(o, "{line}  {}", r.class.name());
    };
    row(o, &s.whole);
    for r in &s.by_op {
        row(o, r);
    }
    if !s.flagged.is_empty() {
        let _ = writeln!(o, "    flagged intervals:");
        for r in &s.flagged {
            row(o, r);
        }
    }
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}…")
    }
}

fn short_stats(s: &Stats) -> String {
    let snr = s.errors.as_ref().map_or("-".to_string(), |e| if e.snr_db.is_infinite() { "exact".into() } else { format!("{:.1}", e.snr_db) });
    format!("{:.2e} / {:.2e} / {} / {:.1}% / {snr}", s.max_abs, s.max_rel, s.max_ulp, 100.0 * s.exact as f64 / s.elements.max(1) as f64)
}

/// The error statistics in one line.
pub fn error_line(e: &ErrorStats) -> String {
    let snr = if e.snr_db.is_infinite() { "exact".to_string() } else { format!("{:.1} dB", e.snr_db) };
    format!(
        "shift {:+.2e} (z {:+.1}), scale {:+.2e} (z {:+.1}) over {} blocks of {}; corr(error, A) {:+.3}; rel RMS {:.3e}; SNR {snr}; cosine {:.7}",
        e.shift, e.shift_z, e.scale, e.scale_z, e.blocks, e.block_len, e.corr, e.rel_rms, e.cosine
    )
}

/// One line describing a comparison.
pub fn stats_line(s: &Stats) -> String {
    format!(
        "{} of {} elements outside tolerance ({:.3}%), max abs {:.3e}, max rel {:.3e}, max ulp {}, bit-exact {:.1}%, rms {:.3e}",
        s.mismatches,
        s.elements,
        100.0 * s.mismatch_fraction(),
        s.max_abs,
        s.max_rel,
        s.max_ulp,
        100.0 * s.exact as f64 / s.elements.max(1) as f64,
        s.rms
    )
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
