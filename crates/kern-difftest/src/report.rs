//! The report of `kern test`: what was compared, the first divergence on top, then the kernel
//! diffs, the precision diff and the performance diff; as text or JSON; and the exit code
//! (0 equal within tolerance, 1 a kernel or precision diff fails, 2 not comparable).

use crate::numeric::{LogitStats, PerfClass, Stats, Timing};
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Equal within tolerance: exit 0.
    Equal,
    /// A kernel or precision diff fails: exit 1.
    Differs,
    /// The manifests cannot be compared: exit 2.
    Incomparable,
}

impl Verdict {
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Equal => 0,
            Verdict::Differs => 1,
            Verdict::Incomparable => 2,
        }
    }
}

/// Where A and B first disagree beyond tolerance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    /// The step of the scenario (`prefill 4 seqs / 133 tokens`, `decode 1`, …).
    pub step: String,
    /// Index of the interval pair.
    pub interval: usize,
    /// Call labels of the interval on each side.
    pub a_calls: String,
    pub b_calls: String,
    /// The op(s) of those calls.
    pub a_ops: String,
    pub b_ops: String,
    /// The buffer that differs (the first of the interval's outputs that fails).
    pub buffer: String,
    pub dtype: String,
    pub stats: Stats,
}

/// One comparison of the kernel diff.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// The var values (`tokens=1 seqs=1 pages=256`).
    pub shape: String,
    pub dist: String,
    /// The op parameter compared (`#0 out buffer<bf16>` bound to `h`).
    pub output: String,
    pub stats: Stats,
}

/// The kernel diff of one op.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpDiff {
    pub op: String,
    pub same_impl: bool,
    /// Call labels run on each side.
    pub a_call: String,
    pub b_call: String,
    pub checks: usize,
    pub failures: usize,
    /// The first failing check, else the check with the largest max ULP distance.
    pub first_failure: Option<Check>,
    pub worst: Option<Check>,
    /// Why the op was not compared (bindings that differ, …).
    pub skipped: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepPrecision {
    pub step: String,
    pub tokens: usize,
    pub seqs: usize,
    /// Intervals whose outputs were compared from golden inputs (A's values copied into B).
    pub local_checked: usize,
    pub local_failures: usize,
    pub first_local: Option<Divergence>,
    /// Free-running (each side its own values): the first sync point beyond tolerance —
    /// error amplified from upstream, informational.
    pub first_drift: Option<Divergence>,
    pub logits: Option<LogitStats>,
    /// Sequences whose sampled (greedy) token agrees, of all.
    pub sampled_agree: usize,
    pub sampled: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Precision {
    pub steps: Vec<StepPrecision>,
    /// Over every step.
    pub logits: Option<LogitStats>,
    /// Greedy tokens (B's argmax on A's prefix, teacher-forced): positions that agree, of all.
    pub greedy_agree: usize,
    pub greedy_positions: usize,
    /// The first position where they disagree, described.
    pub greedy_first_disagreement: Option<String>,
    /// Gates that failed on the logits (mean KL, top-5 rule).
    pub logit_failures: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerfRow {
    pub name: String,
    pub a: Timing,
    pub b: Timing,
    pub class: PerfClass,
}

impl PerfRow {
    pub fn ratio(&self) -> f64 {
        if self.a.median > 0.0 {
            self.b.median / self.a.median
        } else {
            f64::NAN
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepPerf {
    pub step: String,
    /// The whole step, as the engine runs it (CUDA graph for decode, eager for prefill).
    pub whole: PerfRow,
    /// Per op: the sum over the step's calls of that op (one-sided ops with zero on the other).
    pub by_op: Vec<PerfRow>,
    /// Intervals classified slower or faster, largest difference first (at most 10).
    pub flagged: Vec<PerfRow>,
    pub intervals_timed: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Perf {
    pub threshold: f64,
    pub reps: usize,
    pub l2_flush_bytes: usize,
    pub steps: Vec<StepPerf>,
}

impl Perf {
    pub fn regressions(&self) -> usize {
        self.steps.iter().map(|s| usize::from(s.whole.class == PerfClass::Slower) + s.flagged.iter().filter(|r| r.class == PerfClass::Slower).count()).sum()
    }
}

/// A non-1:1 interval pair (a fusion or split), with labels.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntervalPair {
    pub index: usize,
    pub kind: String,
    pub a_calls: String,
    pub b_calls: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MatchSummary {
    pub calls_a: usize,
    pub calls_b: usize,
    pub intervals: usize,
    pub one_to_one: usize,
    /// Every interval pair that is not 1:1.
    pub fused_or_split: Vec<IntervalPair>,
    /// Common buffers whose writes were paired only at their last value.
    pub unpaired_buffers: Vec<String>,
    /// Same-named buffers that are not the same buffer.
    pub buffer_differs: Vec<String>,
    pub common_buffers: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub a: String,
    pub b: String,
    pub verdict: Verdict,
    /// Why the manifests cannot be compared, or what stopped the run.
    pub reason: Option<String>,
    pub device: Option<String>,
    pub seed: u64,
    pub first_divergence: Option<Divergence>,
    pub matching: Option<MatchSummary>,
    pub ops: Vec<OpDiff>,
    pub ops_only_a: Vec<String>,
    pub ops_only_b: Vec<String>,
    pub ops_signature_differs: Vec<String>,
    pub precision: Option<Precision>,
    pub perf: Option<Perf>,
    pub notes: Vec<String>,
    /// Only the manifests were matched (`--match-only`): nothing ran.
    pub match_only: bool,
}

impl Report {
    pub fn new(a: &str, b: &str) -> Report {
        Report {
            a: a.into(),
            b: b.into(),
            verdict: Verdict::Equal,
            reason: None,
            device: None,
            seed: 0,
            first_divergence: None,
            matching: None,
            ops: vec![],
            ops_only_a: vec![],
            ops_only_b: vec![],
            ops_signature_differs: vec![],
            precision: None,
            perf: None,
            notes: vec![],
            match_only: false,
        }
    }

    pub fn incomparable(a: &str, b: &str, reason: impl Into<String>) -> Report {
        Report { verdict: Verdict::Incomparable, reason: Some(reason.into()), ..Report::new(a, b) }
    }

    /// Sets the verdict from the parts (an incomparable report stays so) and picks the first
    /// divergence: the earliest local interval failure of the earliest step.
    pub fn finish(&mut self) {
        if self.verdict == Verdict::Incomparable {
            return;
        }
        if self.first_divergence.is_none() {
            if let Some(p) = &self.precision {
                self.first_divergence = p.steps.iter().find_map(|s| s.first_local.clone());
            }
        }
        let kernel_fail = self.ops.iter().any(|o| o.failures > 0);
        let precision_fail = self.precision.as_ref().is_some_and(|p| p.steps.iter().any(|s| s.local_failures > 0) || !p.logit_failures.is_empty());
        self.verdict = if kernel_fail || precision_fail || self.first_divergence.is_some() || self.reason.is_some() { Verdict::Differs } else { Verdict::Equal };
    }

    pub fn exit_code(&self) -> u8 {
        self.verdict.exit_code()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The readable report.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "kern test {} {}", self.a, self.b);
        if let Some(d) = &self.device {
            let _ = writeln!(o, "  on {d}, seed {}", self.seed);
        }
        let verdict = match self.verdict {
            Verdict::Equal if self.match_only => "COMPARABLE (--match-only: matched, nothing ran)".to_string(),
            Verdict::Equal => "EQUAL within tolerance".to_string(),
            Verdict::Differs => "DIFFERS".to_string(),
            Verdict::Incomparable => "NOT COMPARABLE".to_string(),
        };
        let _ = writeln!(o, "\nverdict: {verdict} (exit {})", self.exit_code());
        if let Some(r) = &self.reason {
            let _ = writeln!(o, "  {r}");
        }
        if let Some(d) = &self.first_divergence {
            let _ = writeln!(o, "\nfirst divergence — {} step, interval #{}:", d.step, d.interval);
            let _ = writeln!(o, "  A: {}  (op {})", d.a_calls, d.a_ops);
            let _ = writeln!(o, "  B: {}  (op {})", d.b_calls, d.b_ops);
            let _ = writeln!(o, "  output `{}` ({}) from identical inputs: {}", d.buffer, d.dtype, stats_line(&d.stats));
            if let Some((i, x, y)) = d.stats.worst {
                let _ = writeln!(o, "  worst element #{i}: A {x:.6e}, B {y:.6e}");
            }
        }
        if let Some(m) = &self.matching {
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
        if !self.ops.is_empty() || !self.ops_only_a.is_empty() || !self.ops_only_b.is_empty() {
            let _ = writeln!(o, "\nkernel diff (each op on identical inputs, both sides):");
            let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  worst (max abs / max rel / max ulp / exact)", "op", "impl", "checks", "fail");
            for d in &self.ops {
                let imp = if d.same_impl { "same" } else { "differ" };
                if let Some(s) = &d.skipped {
                    let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  skipped: {s}", d.op, imp, "-", "-");
                    continue;
                }
                let w = d.first_failure.as_ref().or(d.worst.as_ref());
                let desc = w.map_or("all bit-exact".to_string(), |c| format!("{} | {} | {} | {}", short_stats(&c.stats), c.shape, c.dist, c.output));
                let _ = writeln!(o, "  {:<24} {:<6} {:>7} {:>6}  {}", d.op, imp, d.checks, d.failures, desc);
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
        if let Some(p) = &self.precision {
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
            let _ = writeln!(o, "  greedy tokens: {}/{} agree{}", p.greedy_agree, p.greedy_positions, p.greedy_first_disagreement.as_ref().map_or(String::new(), |d| format!("; first disagreement {d}")));
            for f in &p.logit_failures {
                let _ = writeln!(o, "  FAIL {f}");
            }
        }
        if let Some(perf) = &self.perf {
            let _ = writeln!(o, "\nperformance diff (median of {} runs, L2 flushed, threshold {:.0}%):", perf.reps, 100.0 * perf.threshold);
            for s in &perf.steps {
                let _ = writeln!(o, "  {} ({} intervals timed)", s.step, s.intervals_timed);
                let _ = writeln!(o, "    {:<30} {:>11} {:>11} {:>7}", "", "A µs", "B µs", "B/A");
                let row = |o: &mut String, r: &PerfRow| {
                    let _ = writeln!(o, "    {:<30} {:>11.1} {:>11.1} {:>7.3}  {}", trunc(&r.name, 30), 1e3 * r.a.median, 1e3 * r.b.median, r.ratio(), r.class.name());
                };
                row(&mut o, &s.whole);
                for r in &s.by_op {
                    row(&mut o, r);
                }
                if !s.flagged.is_empty() {
                    let _ = writeln!(o, "    flagged intervals:");
                    for r in &s.flagged {
                        row(&mut o, r);
                    }
                }
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
    format!("{:.2e} / {:.2e} / {} / {:.1}%", s.max_abs, s.max_rel, s.max_ulp, 100.0 * s.exact as f64 / s.elements.max(1) as f64)
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
mod tests {
    use super::*;
    use crate::numeric::{classify, Timing};

    fn stats(pass: bool) -> Stats {
        Stats { elements: 10, mismatches: usize::from(!pass) * 4, exact: 6, max_abs: 0.5, max_rel: 0.2, max_ulp: 30, rms: 1.0, pass, ..Default::default() }
    }

    fn full() -> Report {
        let mut r = Report::new("a.json", "b.json");
        r.device = Some("NVIDIA H200 (sm_90)".into());
        r.matching = Some(MatchSummary { calls_a: 3, calls_b: 4, intervals: 3, one_to_one: 2, common_buffers: 5, fused_or_split: vec![IntervalPair { index: 1, kind: "1:2".into(), a_calls: "n".into(), b_calls: "add, norm".into() }], ..Default::default() });
        r.ops = vec![OpDiff { op: "gemm".into(), same_impl: false, a_call: "l0.q".into(), b_call: "l0.q".into(), checks: 24, failures: 0, first_failure: None, worst: Some(Check { shape: "tokens=1".into(), dist: "normal(0,1)".into(), output: "#3 `y`".into(), stats: stats(true) }), skipped: None }];
        r.ops_only_b = vec!["add".into()];
        let t = |m: f64| Timing { median: m, q1: m * 0.99, q3: m * 1.01, samples: 20 };
        let row = |n: &str, a: f64, b: f64| PerfRow { name: n.into(), a: t(a), b: t(b), class: classify(&t(a), &t(b), 0.05, 0.0) };
        r.perf = Some(Perf { threshold: 0.05, reps: 20, l2_flush_bytes: 256 << 20, steps: vec![StepPerf { step: "decode 1".into(), whole: row("whole step (eager)", 1.0, 1.3), by_op: vec![row("gemm", 0.5, 0.8)], flagged: vec![row("#0 l0.q ↔ l0.q", 0.5, 0.8)], intervals_timed: 3 }] });
        r.precision = Some(Precision { greedy_agree: 8, greedy_positions: 8, ..Default::default() });
        r
    }

    #[test]
    fn equal_reports_exit_0_and_regressions_do_not_change_it() {
        let mut r = full();
        r.finish();
        assert_eq!((r.verdict, r.exit_code()), (Verdict::Equal, 0));
        let text = r.render();
        let order: Vec<usize> = ["sync points", "kernel diff", "precision diff", "performance diff"].iter().map(|s| text.find(s).unwrap_or_else(|| panic!("{s} missing:\n{text}"))).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(text.contains("SLOWER") && text.contains("regression(s) over the threshold"), "{text}");
        assert!(text.contains("only in B: add"), "{text}");
        assert_eq!(r.perf.as_ref().unwrap().regressions(), 2);
    }

    #[test]
    fn kernel_failures_logit_gates_and_errors_exit_1() {
        let mut r = full();
        r.ops[0].failures = 1;
        r.ops[0].first_failure = Some(Check { shape: "tokens=1".into(), dist: "zeros".into(), output: "#3 `y`".into(), stats: stats(false) });
        r.finish();
        assert_eq!(r.exit_code(), 1);
        assert!(r.render().contains("zeros"));
        let mut r = full();
        r.precision.as_mut().unwrap().logit_failures.push("mean KL divergence 1e-1 > 1e-2".into());
        r.finish();
        assert_eq!(r.exit_code(), 1);
        let mut r = full();
        r.reason = Some("B, prefill, l3.attention: kernel fault".into());
        r.finish();
        assert_eq!(r.exit_code(), 1);
        assert!(r.render().contains("kernel fault"));
        let mut r = Report::incomparable("a", "b", "vars differ");
        r.finish();
        assert_eq!(r.exit_code(), 2);
        let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!((j["verdict"].as_str(), j["reason"].as_str()), (Some("incomparable"), Some("vars differ")));
    }
}
