//! The report of `kern test`: what was compared, the first divergence on top, then the kernel
//! diffs, the precision diff and the performance diff, as JSON (the text is [`crate::render`]);
//! and the exit code (0 equal within tolerance and unbiased — in precision mode within every
//! gate —, 1 a kernel or precision diff fails, 2 not comparable).

use crate::numeric::{LogitStats, PerfClass, Stats, Timing};
use serde::Serialize;

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

/// The error at one sync point, pooled over the interval's compared float outputs: local
/// (B's interval from A's values) or carried (B running from its own values).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SyncError {
    pub interval: usize,
    /// The layer of the interval's first call (the first number in its label), if any.
    pub layer: Option<u32>,
    /// `sqrt(Σ e² / Σ a²)` and `10·log10(Σ a² / Σ e²)` over the outputs (SNR null when exact).
    pub rel_rms: f64,
    pub snr_db: f64,
    /// Every compared output bit-identical.
    pub exact: bool,
    pub sum_a2: f64,
    pub sum_e2: f64,
}

/// Where B running from its own values first leaves A, with the call labels.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Departure {
    pub step: String,
    pub interval: usize,
    pub a_calls: String,
    pub b_calls: String,
    pub buffer: String,
    pub rel_rms: f64,
    pub max_ulp: u64,
    /// Share of the buffer's elements that differ.
    pub differ: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StepPrecision {
    pub step: String,
    /// A decode step (one token per sequence), else a prefill (or a run without a step ABI).
    pub decode: bool,
    pub tokens: usize,
    pub seqs: usize,
    /// Intervals whose outputs were compared from golden inputs (A's values copied into B).
    pub local_checked: usize,
    pub local_failures: usize,
    pub first_local: Option<Divergence>,
    /// Free-running (each side its own values): the first sync point beyond tolerance —
    /// error amplified from upstream, informational.
    pub first_drift: Option<Divergence>,
    /// Free-running: the first sync point that is not bit-identical (where B leaves A).
    pub first_departure: Option<Departure>,
    /// Per interval: the local error (golden inputs) and the carried error (free-running).
    pub local_errors: Vec<SyncError>,
    pub carried_errors: Vec<SyncError>,
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
    /// Gates that failed on the logits (mean KL, top-5 rule, beyond the noise floor).
    pub logit_failures: Vec<String>,
    /// The noise floor of an honest change the logits and greedy tokens are judged against.
    pub floor: Option<NoiseFloor>,
    /// How B's logits and greedy tokens compare with the floor, one line per judgement.
    pub floor_judgement: Vec<String>,
    /// Every interval's labels and layer (the index is the interval's).
    pub intervals: Vec<IntervalLabel>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntervalLabel {
    pub a_calls: String,
    pub b_calls: String,
    pub layer: Option<u32>,
}

/// A′ against A: A run again with each compared interval's outputs perturbed by B's own local
/// error with random signs (same size, no direction, no relation to A's values), teacher-forced
/// like B. What an honest change with B's error magnitude does to the logits.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NoiseFloor {
    pub logits: Option<LogitStats>,
    pub greedy_agree: usize,
    pub greedy_positions: usize,
    /// Interval outputs perturbed per step (summed over steps), and outputs skipped because
    /// the step's shape had no measured error of that size.
    pub injected: usize,
    pub skipped: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PerfRow {
    pub name: String,
    pub a: Timing,
    pub b: Timing,
    pub class: PerfClass,
    /// Bytes the calls' buffers move on each side (read + written, at the step's var values;
    /// state pools such as the KV cache not counted), when known.
    pub bytes_a: Option<u64>,
    pub bytes_b: Option<u64>,
}

impl PerfRow {
    /// A row without byte counts.
    pub fn timed(name: impl Into<String>, a: Timing, b: Timing, class: PerfClass) -> PerfRow {
        PerfRow { name: name.into(), a, b, class, bytes_a: None, bytes_b: None }
    }

    /// Achieved bandwidth of A and B (GB/s at the median time).
    pub fn gbs(&self) -> (Option<f64>, Option<f64>) {
        let g = |bytes: Option<u64>, t: &Timing| bytes.filter(|_| t.median > 0.0).map(|b| b as f64 / (t.median / 1e3) / 1e9);
        (g(self.bytes_a, &self.a), g(self.bytes_b, &self.b))
    }

    /// Each side's floor in ms: its bytes at `copy_gbs` (the device copy bandwidth).
    pub fn floors_ms(&self, copy_gbs: f64) -> (Option<f64>, Option<f64>) {
        let f = |bytes: Option<u64>| bytes.filter(|_| copy_gbs > 0.0).map(|b| b as f64 / (copy_gbs * 1e9) * 1e3);
        (f(self.bytes_a), f(self.bytes_b))
    }

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
    /// A decode-shaped step (one token per sequence): bandwidth-bound, so the bytes matter.
    pub decode: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Perf {
    pub threshold: f64,
    pub reps: usize,
    pub l2_flush_bytes: usize,
    pub steps: Vec<StepPerf>,
    /// Device-to-device copy bandwidth measured in the same run (read + write), GB/s: the
    /// denominator of the floors.
    pub copy_gbs: Option<f64>,
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
    /// Precision mode (`--precision`): an intentional change, judged by its budget only.
    pub precision_mode: bool,
    pub budget: Option<crate::precision::Budget>,
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
            precision_mode: false,
            budget: None,
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
        if self.precision_mode {
            // An intentional change: only the budget's gates (and a failed run) decide; there
            // is no first divergence, every interval is expected to differ.
            let over = self.budget.as_ref().is_none_or(|b| !b.failures.is_empty());
            self.verdict = if over || self.reason.is_some() { Verdict::Differs } else { Verdict::Equal };
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
        let row = |n: &str, a: f64, b: f64| PerfRow::timed(n, t(a), t(b), classify(&t(a), &t(b), 0.05, 0.0));
        r.perf = Some(Perf { threshold: 0.05, reps: 20, l2_flush_bytes: 256 << 20, copy_gbs: None, steps: vec![StepPerf { step: "decode 1".into(), whole: row("whole step (eager)", 1.0, 1.3), by_op: vec![row("gemm", 0.5, 0.8)], flagged: vec![row("#0 l0.q ↔ l0.q", 0.5, 0.8)], intervals_timed: 3, decode: true }] });
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
