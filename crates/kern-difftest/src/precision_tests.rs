//! Precision mode's pure parts: layers from labels, the per-layer table, the text score, the
//! gates, the plot and the rendered section.

use super::*;
use crate::report::{IntervalLabel, StepPrecision};

fn err(interval: usize, layer: Option<u32>, a2: f64, e2: f64) -> SyncError {
    SyncError { interval, layer, rel_rms: (e2 / a2).sqrt(), snr_db: crate::stats::snr_db(a2, e2), exact: e2 == 0.0, sum_a2: a2, sum_e2: e2 }
}

/// Three layers of two intervals, plus an embedding before and a head after; the local error is
/// 1e-3 relative everywhere, the carried one grows by 2× per layer.
fn prec() -> Precision {
    let mut steps = Vec::new();
    for (name, decode) in [("prefill 4 seqs / 133 tokens", false), ("decode 1 (4 seqs)", true)] {
        let layers = [None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(2), None];
        let local: Vec<SyncError> = layers.iter().enumerate().map(|(i, &l)| err(i, l, 1.0, if i == 0 { 0.0 } else { 1e-6 })).collect();
        let carried: Vec<SyncError> = layers.iter().enumerate().map(|(i, &l)| err(i, l, 1.0, if i == 0 { 0.0 } else { 1e-6 * 4f64.powi(l.map_or(3, |l| l as i32)) })).collect();
        steps.push(StepPrecision { step: name.into(), decode, local_checked: 8, local_errors: local, carried_errors: carried, ..Default::default() });
    }
    let intervals = (0..8).map(|i| IntervalLabel { a_calls: format!("a{i}"), b_calls: format!("b{i}"), layer: None }).collect();
    Precision { steps, intervals, ..Default::default() }
}

#[test]
fn layers_come_from_the_first_number_of_a_label() {
    assert_eq!(layer_of("l7.o_proj"), Some(7));
    assert_eq!(layer_of("model.layers.18.mlp"), Some(18));
    assert_eq!(layer_of("l12.swiglu … l13.qkv_proj (4 calls)"), Some(12));
    assert_eq!((layer_of("embed"), layer_of("lm_head")), (None, None));
}

#[test]
fn the_layer_table_pools_local_and_carried_errors() {
    let rows = layer_rows(&prec());
    let names: Vec<(i64, &str, &str)> = rows.iter().map(|(x, r)| (*x, r.kind.as_str(), r.layer.as_str())).collect();
    assert_eq!(names[..5], [(-1, "prefill", "in"), (0, "prefill", "0"), (1, "prefill", "1"), (2, "prefill", "2"), (3, "prefill", "out")]);
    assert_eq!(rows.len(), 10, "both step kinds");
    let l1 = &rows[2].1;
    assert_eq!(l1.intervals, 2);
    assert!((l1.local_rel_rms - 1e-3).abs() < 1e-12 && (l1.local_snr_db - 60.0).abs() < 1e-9, "{l1:?}");
    assert!((l1.carried_rel_rms - 2e-3).abs() < 1e-12, "{l1:?}");
    assert!(rows[0].1.local_snr_db.is_infinite() && rows[0].1.local_rel_rms == 0.0, "the exact embedding");
}

#[test]
fn the_plot_has_a_carried_and_a_local_line_per_step_kind() {
    let rows = layer_rows(&prec());
    let p = plot(&rows, "b.json vs a.json");
    let names: Vec<&str> = p.series.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["prefill, carried", "prefill, local", "decode, carried", "decode, local"]);
    assert!(p.log_y && !p.series[0].dashed && p.series[1].dashed);
    assert_eq!(p.x_ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(), ["in", "0", "1", "2", "out"]);
    // The carried error grows along x.
    let ys: Vec<f64> = p.series[0].points.iter().map(|p| p.1).collect();
    assert!(ys[1] < ys[2] && ys[2] < ys[3], "{ys:?}");
    let svg = p.to_svg();
    assert!(svg.contains("prefill, carried") && svg.matches("<polyline").count() >= 4);
}

#[test]
fn text_scores_and_gates() {
    let mut acc = TextAccumulator::default();
    // Vocabulary of 4; the text's token is 2. A is sure of it, B a little less.
    let la = [0.0f32, 0.0, 4.0, 0.0];
    let lb = [0.0f32, 0.0, 3.0, 0.0];
    for _ in 0..10 {
        acc.add(&la, &lb, 2);
    }
    // One position where B's top token differs.
    acc.add(&la, &[0.0, 5.0, 3.0, 0.0], 2);
    assert_eq!(acc.positions(), 11);
    let t = acc.finish("a text".into(), 1, 22);
    assert!((t.top1_agree - 10.0 / 11.0).abs() < 1e-12);
    let p_a = (4f64.exp() / (4f64.exp() + 3.0)).ln();
    assert!((t.ppl_a - (-p_a).exp()).abs() < 1e-9, "{t:?}");
    assert!(t.ppl_b > t.ppl_a && t.ppl_increase > 0.0);
    assert!(t.kl_max >= t.kl_p99 && t.kl_p99 >= t.kl_mean && t.kl_mean > 0.0);
    // Gates: the default top-1 ≥ 90% passes 90.9%; a tight KL gate fails.
    let b = budget(Gates { max_kld: 1.0, min_top1: 0.9, max_ppl_increase: 1.0 }, &prec(), Some(t.clone()));
    assert!(b.failures.is_empty(), "{:?}", b.failures);
    let b = budget(Gates { max_kld: 1e-4, min_top1: 0.95, max_ppl_increase: 0.01 }, &prec(), Some(t));
    assert_eq!(b.failures.len(), 3, "{:?}", b.failures);
    assert!(b.failures[0].contains("--max-kld") && b.failures[1].contains("--min-top1") && b.failures[2].contains("--max-ppl-increase"));
    // Without a text score the gates cannot be judged: a failure, never a silent pass.
    assert_eq!(budget(Gates::default(), &prec(), None).failures.len(), 1);
}

#[test]
fn the_budget_section_and_the_verdict() {
    let mut acc = TextAccumulator::default();
    acc.add(&[1.0, 2.0], &[1.0, 2.0], 1);
    let mut b = budget(Gates::default(), &prec(), Some(acc.finish("tokens.txt".into(), 1, 2)));
    b.plot = Some("diff.layers.svg".into());
    assert_eq!(b.worst_intervals.len(), 10, "the inexact intervals of both steps (14), at most 10");
    let mut o = String::new();
    render(&b, &mut o);
    for want in ["precision budget", "kind", "carried rel", "where precision is lost", "plot: diff.layers.svg", "teacher-forced on tokens.txt", "gates: mean KL ≤ 1.0e-2"] {
        assert!(o.contains(want), "{want}:\n{o}");
    }
    assert!(!o.contains("FAIL"), "{o}");
    let mut r = crate::Report::new("a.json", "b.json");
    r.precision_mode = true;
    r.precision = Some(prec());
    r.budget = Some(b.clone());
    // Kernel failures do not count in precision mode.
    r.ops.push(crate::report::OpDiff { op: "gemm".into(), same_impl: false, a_call: String::new(), b_call: String::new(), checks: 3, failures: 3, first_failure: None, worst: None, skipped: None });
    r.finish();
    assert_eq!(r.exit_code(), 0);
    let text = r.render();
    assert!(text.contains("WITHIN THE PRECISION BUDGET") && text.contains("reported, not judged"), "{text}");
    assert!(r.first_divergence.is_none());
    b.failures.push("mean KL divergence 2e-2 > 1e-2 (--max-kld)".into());
    r.budget = Some(b);
    r.finish();
    assert_eq!(r.exit_code(), 1);
    assert!(r.render().contains("BEYOND THE PRECISION BUDGET"));
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(j["budget"]["layers"][1]["layer"], "0");
    assert!(j["budget"]["layers"][0]["local_snr_db"].is_null(), "an infinite SNR is null in JSON");
}
