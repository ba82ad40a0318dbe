//! Precision mode (`kern test a.json b.json --precision`): for an intentional precision change
//! (bf16 → FP8 weights, GGUF-native blocks, an FP8 KV cache) "equal within bf16 tolerance" is
//! the wrong question. Nothing is judged per element; instead the report says how much
//! precision the change costs and where it is lost:
//! - per interval and per layer, the relative RMS error and SNR of B's outputs — **local**
//!   (B's interval from A's values: the error that layer's kernels add) and **carried** (B
//!   running from its own values: the error that has reached that layer) — pooled over every
//!   compared output of the layer's intervals, per step kind (prefill, decode);
//! - a plot of the carried and local error against the layer ([`plot`], an SVG beside the
//!   JSON);
//! - end to end on real text, teacher-forced ([`TextAccumulator`]): KL(A ‖ B) per position
//!   (mean, p99, max), top-1 agreement, and both perplexities — the gates, from flags
//!   ([`Gates`]). Exit 0 within every gate, 1 beyond one, 2 not comparable.
//!
//! The layer of an interval is the first number in the label of its first call (`l7.o_proj`,
//! `layers.7.mlp` → 7); intervals without one are grouped as `in` (before the first layer) or
//! `out` (after it).

use crate::numeric::{kl_divergence, top_k};
use crate::report::{Precision, SyncError};
use crate::svg::{Plot, Series};
use serde::Serialize;
use std::fmt::Write as _;

/// The thresholds of precision mode (`--max-kld`, `--min-top1`, `--max-ppl-increase`).
/// Defaults are FP8-class: ggml's perplexity tool measures mean KLD 0.0014 for q8_0 and 0.031 for q4_K_M
/// on an 8B model, so a 4-bit format needs `--max-kld 0.05 --min-top1 0.85`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Gates {
    pub max_kld: f64,
    pub min_top1: f64,
    /// Largest relative perplexity increase, `ppl(B) / ppl(A) − 1`.
    pub max_ppl_increase: f64,
}

impl Default for Gates {
    fn default() -> Self {
        Gates { max_kld: 0.01, min_top1: 0.9, max_ppl_increase: 0.02 }
    }
}

/// The layer of a call label: its first number (`l7.o_proj` → 7).
pub fn layer_of(label: &str) -> Option<u32> {
    let start = label.find(|c: char| c.is_ascii_digit())?;
    let digits: String = label[start..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// One layer's error for one step kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerRow {
    /// `in`, a layer number, or `out`.
    pub layer: String,
    /// `prefill` or `decode`.
    pub kind: String,
    pub intervals: usize,
    pub local_rel_rms: f64,
    pub local_snr_db: f64,
    pub carried_rel_rms: f64,
    pub carried_snr_db: f64,
}

/// Position of an interval's layer on the plot's x axis: `in` −1, layers as numbered, `out`
/// one past the last.
fn layer_keys(errors: &[SyncError]) -> Vec<(i64, String)> {
    let last = errors.iter().filter_map(|e| e.layer).max();
    let mut seen_layer = false;
    errors
        .iter()
        .map(|e| match e.layer {
            Some(l) => {
                seen_layer = true;
                (i64::from(l), l.to_string())
            }
            None if !seen_layer => (-1, "in".to_string()),
            None => (last.map_or(0, |l| i64::from(l) + 1), "out".to_string()),
        })
        .collect()
}

fn pool(errors: &[&SyncError]) -> (f64, f64) {
    let (a2, e2): (f64, f64) = errors.iter().fold((0.0, 0.0), |(a, e), s| (a + s.sum_a2, e + s.sum_e2));
    let rel = if a2 > 0.0 { (e2 / a2).sqrt() } else { 0.0 };
    (rel, crate::stats::snr_db(a2, e2))
}

/// Per layer and step kind, from the steps compared interval by interval.
pub fn layer_rows(prec: &Precision) -> Vec<(i64, LayerRow)> {
    let mut out = Vec::new();
    for kind in ["prefill", "decode"] {
        let Some(step) = prec.steps.iter().find(|s| (s.decode == (kind == "decode")) && !s.local_errors.is_empty()) else { continue };
        let keys = layer_keys(&step.local_errors);
        let mut order: Vec<(i64, String)> = keys.clone();
        order.sort();
        order.dedup();
        for (x, name) in order {
            let local: Vec<&SyncError> = step.local_errors.iter().zip(&keys).filter(|(_, k)| k.0 == x).map(|(e, _)| e).collect();
            let idx: Vec<usize> = local.iter().map(|e| e.interval).collect();
            let carried: Vec<&SyncError> = step.carried_errors.iter().filter(|e| idx.contains(&e.interval)).collect();
            let (lr, ls) = pool(&local);
            let (cr, cs) = pool(&carried);
            out.push((x, LayerRow { layer: name, kind: kind.into(), intervals: local.len(), local_rel_rms: lr, local_snr_db: ls, carried_rel_rms: cr, carried_snr_db: cs }));
        }
    }
    out
}

/// The plot: relative RMS error against the layer, carried (solid) and local (dashed), one
/// line each per step kind.
pub fn plot(rows: &[(i64, LayerRow)], title: &str) -> Plot {
    let mut series = Vec::new();
    for kind in ["prefill", "decode"] {
        let pts: Vec<&(i64, LayerRow)> = rows.iter().filter(|(_, r)| r.kind == kind).collect();
        if pts.is_empty() {
            continue;
        }
        series.push(Series { name: format!("{kind}, carried"), points: pts.iter().map(|(x, r)| (*x as f64, r.carried_rel_rms)).collect(), dashed: false });
        series.push(Series { name: format!("{kind}, local"), points: pts.iter().map(|(x, r)| (*x as f64, r.local_rel_rms)).collect(), dashed: true });
    }
    let mut ticks: Vec<(f64, String)> = rows.iter().map(|(x, r)| (*x as f64, r.layer.clone())).collect();
    ticks.sort_by(|a, b| a.0.total_cmp(&b.0));
    ticks.dedup();
    Plot { title: title.into(), x_label: "layer".into(), y_label: "relative RMS error ‖B − A‖ / ‖A‖".into(), x_ticks: ticks, log_y: true, series }
}

/// End to end on a text, teacher-forced.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TextScore {
    /// Where the tokens came from (a file, the built-in text, random ids).
    pub source: String,
    pub windows: usize,
    pub window: usize,
    /// Positions scored (the second half of each window: each has at least window/2 tokens of
    /// context, as ggml's perplexity tool scores).
    pub positions: usize,
    pub ppl_a: f64,
    pub ppl_b: f64,
    /// `ppl_b / ppl_a − 1`.
    pub ppl_increase: f64,
    pub kl_mean: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    pub top1_agree: f64,
}

/// Accumulates [`TextScore`] position by position.
#[derive(Clone, Debug, Default)]
pub struct TextAccumulator {
    nll_a: f64,
    nll_b: f64,
    kl: Vec<f64>,
    agree: usize,
}

fn log_prob(logits: &[f32], i: usize) -> f64 {
    let m = logits.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits.iter().filter(|x| x.is_finite()).map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    logits.get(i).map_or(f64::NEG_INFINITY, |&x| x as f64 - lse)
}

impl TextAccumulator {
    /// One position: A's and B's logits and the text's next token.
    pub fn add(&mut self, la: &[f32], lb: &[f32], target: usize) {
        self.nll_a -= log_prob(la, target);
        self.nll_b -= log_prob(lb, target);
        self.kl.push(kl_divergence(la, lb));
        self.agree += usize::from(top_k(la, 1) == top_k(lb, 1));
    }

    pub fn positions(&self) -> usize {
        self.kl.len()
    }

    pub fn finish(mut self, source: String, windows: usize, window: usize) -> TextScore {
        let n = self.kl.len();
        let mut s = TextScore { source, windows, window, positions: n, ..Default::default() };
        if n == 0 {
            return s;
        }
        let nf = n as f64;
        s.ppl_a = (self.nll_a / nf).exp();
        s.ppl_b = (self.nll_b / nf).exp();
        s.ppl_increase = s.ppl_b / s.ppl_a - 1.0;
        s.kl_mean = self.kl.iter().sum::<f64>() / nf;
        self.kl.sort_by(f64::total_cmp);
        s.kl_max = self.kl[n - 1];
        s.kl_p99 = self.kl[((0.99 * (n - 1) as f64).round() as usize).min(n - 1)];
        s.top1_agree = self.agree as f64 / nf;
        s
    }
}

/// The precision-mode part of the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Budget {
    pub gates: Option<Gates>,
    pub layers: Vec<LayerRow>,
    /// The intervals with the largest local error (where precision is lost), at most 10.
    pub worst_intervals: Vec<WorstInterval>,
    pub text: Option<TextScore>,
    /// Gates that fail.
    pub failures: Vec<String>,
    /// The plot written beside the JSON.
    pub plot: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorstInterval {
    pub step: String,
    pub interval: usize,
    pub a_calls: String,
    pub b_calls: String,
    pub rel_rms: f64,
    pub snr_db: f64,
}

/// The budget: per-layer rows, the worst intervals, the text score judged by the gates.
pub fn budget(gates: Gates, prec: &Precision, text: Option<TextScore>) -> Budget {
    let layers = layer_rows(prec).into_iter().map(|(_, r)| r).collect();
    let mut worst: Vec<WorstInterval> = prec
        .steps
        .iter()
        .flat_map(|s| {
            s.local_errors.iter().filter(|e| !e.exact).map(|e| {
                let l = prec.intervals.get(e.interval);
                WorstInterval { step: s.step.clone(), interval: e.interval, a_calls: l.map_or(String::new(), |l| l.a_calls.clone()), b_calls: l.map_or(String::new(), |l| l.b_calls.clone()), rel_rms: e.rel_rms, snr_db: e.snr_db }
            })
        })
        .collect();
    worst.sort_by(|a, b| b.rel_rms.total_cmp(&a.rel_rms));
    worst.truncate(10);
    let mut failures = Vec::new();
    match &text {
        Some(t) if t.positions > 0 => {
            if t.kl_mean > gates.max_kld {
                failures.push(format!("mean KL divergence {:.3e} > {:.3e} (--max-kld)", t.kl_mean, gates.max_kld));
            }
            if t.top1_agree < gates.min_top1 {
                failures.push(format!("top-1 agreement {:.2}% < {:.2}% (--min-top1)", 100.0 * t.top1_agree, 100.0 * gates.min_top1));
            }
            if t.ppl_increase > gates.max_ppl_increase {
                failures.push(format!("perplexity {:.4} → {:.4} (+{:.2}%) > +{:.2}% (--max-ppl-increase)", t.ppl_a, t.ppl_b, 100.0 * t.ppl_increase, 100.0 * gates.max_ppl_increase));
            }
        }
        _ => failures.push("no position of the text was scored (the step ABI exposes no logits?): the end-to-end gates cannot be judged".into()),
    }
    Budget { gates: Some(gates), layers, worst_intervals: worst, text, failures, plot: None }
}

fn db(x: f64) -> String {
    if x.is_infinite() && x > 0.0 {
        "exact".into()
    } else {
        format!("{x:.1}")
    }
}

/// The precision-mode section of the text report.
pub fn render(b: &Budget, o: &mut String) {
    let _ = writeln!(o, "\nprecision budget (intentional change: nothing judged per element):");
    if !b.layers.is_empty() {
        let _ = writeln!(o, "  per layer, pooled over its sync points (local: from A's values; carried: B from its own):");
        let _ = writeln!(o, "    {:<8} {:<8} {:>5} {:>12} {:>10} {:>12} {:>10}", "kind", "layer", "ivs", "local rel", "local SNR", "carried rel", "carr. SNR");
        for r in &b.layers {
            let _ = writeln!(o, "    {:<8} {:<8} {:>5} {:>12.3e} {:>10} {:>12.3e} {:>10}", r.kind, r.layer, r.intervals, r.local_rel_rms, db(r.local_snr_db), r.carried_rel_rms, db(r.carried_snr_db));
        }
    }
    if !b.worst_intervals.is_empty() {
        let _ = writeln!(o, "  where precision is lost (largest local error):");
        for w in &b.worst_intervals {
            let _ = writeln!(o, "    #{:<4} rel {:.3e}  SNR {:>6} dB  {}  A: {}  ↔  B: {}", w.interval, w.rel_rms, db(w.snr_db), w.step, w.a_calls, w.b_calls);
        }
    }
    if let Some(p) = &b.plot {
        let _ = writeln!(o, "  plot: {p}");
    }
    if let Some(t) = &b.text {
        let _ = writeln!(o, "  end to end, teacher-forced on {} ({} windows of {} tokens, {} positions scored):", t.source, t.windows, t.window, t.positions);
        let _ = writeln!(o, "    KL(A‖B) mean {:.3e}, p99 {:.3e}, max {:.3e}; top-1 agree {:.2}%; perplexity A {:.4}, B {:.4} ({:+.2}%)", t.kl_mean, t.kl_p99, t.kl_max, 100.0 * t.top1_agree, t.ppl_a, t.ppl_b, 100.0 * t.ppl_increase);
    }
    if let Some(g) = &b.gates {
        let _ = writeln!(o, "  gates: mean KL ≤ {:.1e}, top-1 ≥ {:.1}%, perplexity increase ≤ {:.1}%", g.max_kld, 100.0 * g.min_top1, 100.0 * g.max_ppl_increase);
    }
    for f in &b.failures {
        let _ = writeln!(o, "  FAIL {f}");
    }
}

#[cfg(test)]
#[path = "precision_tests.rs"]
mod tests;
