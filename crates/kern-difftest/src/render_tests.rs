//! The report on constructed results: a biased divergence inside the tolerance, the drift and
//! the noise floor printed whatever the verdict, greedy tokens never silently equal, the
//! bytes / bandwidth columns of a decode step; text lines and JSON fields.

use crate::noise::{judge, EndToEnd};
use crate::numeric::{compare_rows, PerfClass, Timing, Tolerance};
use crate::report::*;
use kern_manifest::DType;

fn bf16_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect()
}

/// `h` of 133 rows × 2048 from a norm whose epsilon shrank it by 1.7e-3 (layer 7, eps 1e-2).
fn shrunk_h() -> crate::numeric::Stats {
    let mut rng = crate::numeric::Rng(1);
    // The kernels' fp32 results, rounded to bf16 by each.
    let f: Vec<f64> = (0..133 * 2048).map(|_| rng.normal()).collect();
    let a: Vec<f64> = f.iter().map(|&x| half::bf16::from_f64(x).to_f64()).collect();
    let b: Vec<f64> = f.iter().map(|&x| half::bf16::from_f64(x * (1.0 - 1.7e-3)).to_f64()).collect();
    compare_rows(&bf16_bytes(&a), &bf16_bytes(&b), DType::Bf16, &Tolerance::default_for(DType::Bf16), 2048, true)
}

fn departure(interval: usize, labels: &str) -> Departure {
    Departure { step: "prefill 4 seqs / 133 tokens".into(), interval, a_calls: labels.into(), b_calls: labels.into(), buffer: "h".into(), rel_rms: 3.1e-3, max_ulp: 2, differ: 0.42 }
}

fn step(first_local: Option<Divergence>) -> StepPrecision {
    StepPrecision {
        step: "prefill 4 seqs / 133 tokens".into(),
        tokens: 133,
        seqs: 4,
        local_checked: 310,
        local_failures: usize::from(first_local.is_some()),
        first_local,
        first_departure: Some(departure(90, "l7.post_attention_norm")),
        carried_errors: vec![SyncError { interval: 309, rel_rms: 2.5e-2, ..Default::default() }],
        ..Default::default()
    }
}

#[test]
fn a_bias_within_tolerance_is_the_first_divergence_with_its_statistic() {
    let stats = shrunk_h();
    assert!(stats.pass && stats.bias.is_some(), "{stats:?}");
    let div = Divergence {
        step: "prefill 4 seqs / 133 tokens".into(),
        interval: 90,
        a_calls: "l7.post_attention_norm".into(),
        b_calls: "l7.post_attention_norm".into(),
        a_ops: "add_rms_norm".into(),
        b_ops: "add_rms_norm_eps1e-2".into(),
        buffer: "h".into(),
        dtype: "bf16".into(),
        stats,
    };
    let mut r = Report::new("model.json", "model.eps1e-2.json");
    r.precision = Some(Precision { steps: vec![step(Some(div))], greedy_agree: 35, greedy_positions: 36, ..Default::default() });
    r.finish();
    assert_eq!((r.verdict, r.exit_code()), (Verdict::Differs, 1));
    let text = r.render();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("first divergence")).expect(&text);
    assert_eq!(lines[at], "first divergence — prefill 4 seqs / 133 tokens step, interval #90:");
    assert_eq!(lines[at + 1], "  A: l7.post_attention_norm  (op add_rms_norm)");
    assert_eq!(lines[at + 2], "  B: l7.post_attention_norm  (op add_rms_norm_eps1e-2)");
    assert!(lines[at + 3].starts_with("  output `h` (bf16) from identical inputs: 0 of 272384 elements outside tolerance"), "{}", lines[at + 3]);
    assert!(lines[at + 4].starts_with("  every element within tolerance, but BIASED — scale bias: B ≈ (1 − 1.7"), "{}", lines[at + 4]);
    assert!(lines[at + 4].contains("beyond |scale| > 3.05e-5 with p < 1e-6"), "{}", lines[at + 4]);
    assert!(lines[at + 5].starts_with("  error: shift ") && lines[at + 5].contains("over 133 blocks of 2048"), "{}", lines[at + 5]);
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let s = &j["first_divergence"]["stats"];
    assert!(s["bias"].as_str().unwrap().starts_with("scale bias") && s["pass"] == true);
    assert!((s["errors"]["scale"].as_f64().unwrap() + 1.7e-3).abs() < 2e-4, "{s}");
    assert_eq!(s["errors"]["blocks"], 133);
}

#[test]
fn the_drift_and_the_floor_are_printed_when_equal_and_greedy_differences_are_named() {
    let mut p = Precision { steps: vec![step(None)], greedy_agree: 35, greedy_positions: 36, ..Default::default() };
    let b = EndToEnd { greedy_differ: 1, positions: 36, kl: vec![1e-3; 36] };
    let f = EndToEnd { greedy_differ: 1, positions: 36, kl: vec![1.1e-3; 36] };
    let (lines, fails) = judge(&b, &f);
    assert!(fails.is_empty());
    p.floor_judgement = lines;
    p.floor = Some(NoiseFloor { greedy_agree: 35, greedy_positions: 36, injected: 120, ..Default::default() });
    let mut r = Report::new("a.json", "b.json");
    r.precision = Some(p);
    r.finish();
    assert_eq!(r.exit_code(), 0);
    let text = r.render();
    assert!(text.contains("verdict: EQUAL within tolerance, unbiased (exit 0)"), "{text}");
    assert!(
        text.contains("  prefill 4 seqs / 133 tokens: first leaves A at #90 A: l7.post_attention_norm  ↔  B: l7.post_attention_norm  (`h`: 42.00% of elements differ, max ulp 2, rel RMS 3.100e-3); at the last sync point #309 rel RMS 2.500e-2"),
        "{text}"
    );
    assert!(text.contains("    within tolerance at every sync point"), "{text}");
    assert!(text.contains("greedy tokens: B differs from A at 1 of 36 positions, the noise floor A′ at 1 of 36 (P(≥ 1 of 2 | honest) = 0.750): within the floor"), "{text}");
    assert!(text.contains("greedy tokens: 35/36 agree — GREEDY TOKENS DIFFER (judged against the noise floor above)"), "{text}");
    // The order: verdict, drift, end to end, then the details.
    let pos = |s: &str| text.find(s).unwrap_or_else(|| panic!("{s}:\n{text}"));
    assert!(pos("verdict:") < pos("run forward") && pos("run forward") < pos("end to end") && pos("end to end") < pos("precision diff (same step inputs)"));
    // Beyond the floor: a failure, exit 1.
    let (_, fails) = judge(&EndToEnd { greedy_differ: 9, ..b }, &EndToEnd { greedy_differ: 0, ..f });
    let mut r2 = r.clone();
    r2.precision.as_mut().unwrap().logit_failures = fails;
    r2.finish();
    assert_eq!(r2.exit_code(), 1);
    assert!(r2.render().contains("FAIL greedy tokens differ at 9 of 36 positions, beyond the noise floor"));
    // Without a floor, differing greedy tokens still say so.
    let mut r3 = r.clone();
    let p3 = r3.precision.as_mut().unwrap();
    p3.floor = None;
    p3.floor_judgement.clear();
    assert!(r3.render().contains("GREEDY TOKENS DIFFER (no noise floor measured)"));
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(j["precision"]["steps"][0]["first_departure"]["a_calls"], "l7.post_attention_norm");
    assert_eq!(j["precision"]["floor"]["injected"], 120);
}

#[test]
fn a_decode_step_shows_bytes_bandwidth_and_floors() {
    let t = |ms: f64| Timing { median: ms, q1: ms, q3: ms, samples: 20 };
    // A moves 8 MB in 4 µs (2000 GB/s), B 4 MB (an FP8 weight) in 2.5 µs (1600 GB/s); at a
    // 4000 GB/s copy bandwidth the floors are 2.0 and 1.0 µs.
    let row = PerfRow { bytes_a: Some(8_000_000), bytes_b: Some(4_000_000), ..PerfRow::timed("gate_up_proj", t(0.004), t(0.0025), PerfClass::Faster) };
    let (ga, gb) = row.gbs();
    assert!((ga.unwrap() - 2000.0).abs() < 1e-9 && (gb.unwrap() - 1600.0).abs() < 1e-9);
    let (fa, fb) = row.floors_ms(4000.0);
    assert!((fa.unwrap() - 0.002).abs() < 1e-12 && (fb.unwrap() - 0.001).abs() < 1e-12);
    let mut r = Report::new("a.json", "b.json");
    let step = |decode: bool| StepPerf { step: if decode { "decode 1 (4 seqs)".into() } else { "prefill 4 seqs / 133 tokens".into() }, whole: row.clone(), by_op: vec![row.clone()], flagged: vec![], intervals_timed: 1, decode };
    r.perf = Some(Perf { threshold: 0.05, reps: 20, l2_flush_bytes: 0, steps: vec![step(false), step(true)], copy_gbs: Some(4000.0) });
    let text = r.render();
    assert!(text.contains("floor = bytes at the 4000 GB/s device copy bandwidth"), "{text}");
    assert!(text.contains("decode 1 (4 seqs) (1 intervals timed; decode-shaped: bandwidth-bound)"), "{text}");
    let line = text.lines().rfind(|l| l.trim_start().starts_with("gate_up_proj")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols, ["gate_up_proj", "4.0", "2.5", "0.625", "8.000", "4.000", "2000", "1600", "2.0", "1.0", "FASTER"], "{line}");
    // The prefill rows have bytes but no bandwidth columns.
    let first = text.lines().find(|l| l.trim_start().starts_with("gate_up_proj")).unwrap();
    assert_eq!(first.split_whitespace().count(), 7, "{first}");
    let j: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(j["perf"]["steps"][1]["by_op"][0]["bytes_b"], 4_000_000);
    assert_eq!(j["perf"]["copy_gbs"], 4000.0);
}
