//! Tests of the bias statistics on errors made on the CPU the way real kernels make them:
//! fp32 computations in two orders rounded to bf16 (must pass), and faults that stay within a
//! few ulps per element (must fail, naming the statistic).

use super::*;
use crate::numeric::Rng;

fn bf16(x: f32) -> f64 {
    half::bf16::from_f32(x).to_f64()
}

fn gate() -> BiasGate {
    BiasGate::for_dtype(DType::Bf16).unwrap()
}

/// Inputs of an RMSNorm at `rows × hidden`: bf16 activations of mean square `ms` and bf16
/// weights 1 + N(0, 0.02) (the random-weight packs' norm weights).
fn norm_inputs(rows: usize, hidden: usize, ms: f64, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed);
    let x = (0..rows * hidden).map(|_| bf16((ms.sqrt() * rng.normal()) as f32) as f32).collect();
    let w = (0..hidden).map(|_| bf16((1.0 + 0.02 * rng.normal()) as f32) as f32).collect();
    (x, w)
}

/// RMSNorm in fp32, rounded to bf16. `order` 0: one sequential sum of squares and x·r·w;
/// order 1: 128 strided partial sums reduced as a tree (a block of 128 threads) and (x·w)·r.
fn rms_norm(x: &[f32], w: &[f32], eps: f32, order: u8) -> Vec<f64> {
    let h = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(h) {
        let ss = if order == 0 {
            row.iter().fold(0f32, |s, v| s + v * v)
        } else {
            let mut part = [0f32; 128];
            for (i, v) in row.iter().enumerate() {
                part[i % 128] += v * v;
            }
            let mut n = 128;
            while n > 1 {
                n /= 2;
                for i in 0..n {
                    part[i] += part[i + n];
                }
            }
            part[0]
        };
        let r = 1.0 / (ss / h as f32 + eps).sqrt();
        for (v, g) in row.iter().zip(w) {
            out.push(bf16(if order == 0 { v * r * g } else { (v * g) * r }));
        }
    }
    out
}

#[test]
fn student_t_p_values() {
    assert!((t_two_sided_p(2.0, 10.0) - 0.073_388).abs() < 1e-5, "{}", t_two_sided_p(2.0, 10.0));
    assert!((t_two_sided_p(12.706_2, 1.0) - 0.05).abs() < 1e-4);
    assert!((t_two_sided_p(1.959_96, 1e7) - 0.05).abs() < 1e-4);
    assert!((t_two_sided_p(-3.0, 30.0) - 0.005_4).abs() < 2e-4, "{}", t_two_sided_p(-3.0, 30.0));
    assert_eq!(t_two_sided_p(0.0, 5.0), 1.0);
    assert_eq!(t_two_sided_p(f64::INFINITY, 5.0), 0.0);
    // The thresholds the gate uses: p 1e-6 needs |t| ≈ 5.3 at 132 df, ≈ 6.5 at 31, ≈ 13 at 7.
    assert!(t_two_sided_p(5.5, 132.0) < P_MAX && t_two_sided_p(5.0, 132.0) > P_MAX);
    assert!(t_two_sided_p(7.0, 31.0) < P_MAX && t_two_sided_p(6.0, 31.0) > P_MAX);
    assert!(t_two_sided_p(9.0, 7.0) > P_MAX);
}

#[test]
fn the_gate_floor_per_dtype() {
    assert_eq!(gate().floor, 2f64.powi(-15));
    assert_eq!(BiasGate::for_dtype(DType::F32).unwrap().floor, 2f64.powi(-17));
    assert_eq!(BiasGate::for_dtype(DType::F16).unwrap().floor, 2f64.powi(-17));
    assert_eq!(BiasGate::for_dtype(DType::F8e4m3).unwrap().floor, 2f64.powi(-7));
    assert!(BiasGate::for_dtype(DType::I32).is_none());
}

#[test]
fn size_statistics_of_a_known_error() {
    let a = [1.0, -1.0, 2.0, -2.0];
    let b: Vec<f64> = a.iter().map(|x| 1.1 * x).collect();
    let s = error_stats(&a, &b, 0);
    assert!((s.rel_rms - 0.1).abs() < 1e-12 && (s.snr_db - 20.0).abs() < 1e-9, "{s:?}");
    assert!((s.scale - 0.1).abs() < 1e-12 && (s.corr - 1.0).abs() < 1e-12 && (s.cosine - 1.0).abs() < 1e-12, "{s:?}");
    let same = error_stats(&a, &a, 0);
    assert_eq!((same.rel_rms, same.snr_db, same.cosine, same.shift_z, same.scale_z), (0.0, f64::INFINITY, 1.0, 0.0, 0.0));
    // Non-finite pairs are skipped.
    let s = error_stats(&[1.0, f64::NAN, 3.0], &[1.0, 2.0, f64::INFINITY], 0);
    assert_eq!(s.n, 1);
}

#[test]
fn blocks_are_rows_or_chunks_of_few_rows() {
    assert_eq!(block_layout(133 * 2048, 2048), (2048, 1));
    assert_eq!(block_layout(4 * 2048, 2048), (256, 8));
    assert_eq!(block_layout(2048, 2048), (64, 32));
    assert_eq!(block_layout(100, 0), (16, 7), "one row of 100: chunks of at least 16");
    let s = error_stats(&vec![1.0; 4 * 2048], &vec![1.0; 4 * 2048], 2048);
    assert_eq!((s.blocks, s.block_len), (32, 256));
}

#[test]
fn rms_norm_in_two_reduction_orders_rounded_to_bf16_passes() {
    // a 1.7B decoder's hidden size, a prefill of 133 tokens and a decode step of 4.
    for (rows, ms, seed) in [(133, 3.0, 1), (133, 7.0, 2), (4, 3.0, 3), (1, 0.5, 4)] {
        let (x, w) = norm_inputs(rows, 2048, ms, seed);
        let (a, b) = (rms_norm(&x, &w, 1e-6, 0), rms_norm(&x, &w, 1e-6, 1));
        let s = error_stats(&a, &b, 2048);
        assert!(gate().judge(&s).is_none(), "rows {rows} ms {ms}: {s:?}");
        assert!(a != b || rows == 1, "the two orders must differ somewhere for the test to mean something");
        if (rows, seed) == (133, 1) {
            // The two orders differ systematically (the sequential sum of 2048 squares is low by
            // ~2e-6 of itself; z −4 here, −5.6 with another seed): significant, and 16× under
            // the floor — why the floor exists.
            assert!(s.p_values().1 < 1e-3 && s.scale.abs() < gate().floor / 8.0, "{s:?}");
        }
    }
}

#[test]
fn a_changed_rms_norm_epsilon_fails_on_the_scale() {
    // eps 1e-6 → 1e-2 and 1e-3 at a 1.7B decoder's shape: every element within a few ulps (inside
    // the bf16 tolerance), every row shrunk alike. ms 3 ≈ layer 7, ms 7 ≈ layer 18 of the
    // random-weight model; 4 rows = a decode step (rows cut into chunks).
    for (rows, ms, eps) in [(133, 3.0, 1e-2), (133, 3.0, 1e-3), (133, 7.0, 1e-3), (4, 3.0, 1e-2), (4, 3.0, 1e-3)] {
        let (x, w) = norm_inputs(rows, 2048, ms, 7);
        let (a, b) = (rms_norm(&x, &w, 1e-6, 0), rms_norm(&x, &w, eps as f32, 1));
        let s = error_stats(&a, &b, 2048);
        let why = gate().judge(&s).unwrap_or_else(|| panic!("rows {rows} ms {ms} eps {eps} not flagged: {s:?}"));
        assert!(why.starts_with("scale bias") && why.contains("shrinks"), "{why}");
        assert!(s.scale < 0.0 && (s.scale / (-eps / (2.0 * ms)) - 1.0).abs() < 0.5, "{s:?}");
        // The tolerance does not see it.
        let bytes = |v: &[f64]| v.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect::<Vec<u8>>();
        let t = crate::numeric::compare(&bytes(&a), &bytes(&b), DType::Bf16, &crate::numeric::Tolerance::default_for(DType::Bf16));
        assert!(t.pass && t.max_ulp <= 4, "rows {rows} eps {eps}: {t:?}");
    }
}

#[test]
fn a_split_add_and_rms_norm_passes() {
    // Fused: the residual sum stays fp32 and the norm reads it. Split: the sum is rounded to
    // bf16 (written, read back) before the norm. Unbiased rounding of the sum: many flips of h.
    let (rows, hidden) = (133, 2048);
    let (x, w) = norm_inputs(rows, hidden, 3.0, 11);
    let (o, _) = norm_inputs(rows, hidden, 0.3, 12);
    let sum32: Vec<f32> = x.iter().zip(&o).map(|(p, q)| p + q).collect();
    let sum16: Vec<f32> = sum32.iter().map(|&v| bf16(v) as f32).collect();
    let (a, b) = (rms_norm(&sum32, &w, 1e-6, 0), rms_norm(&sum16, &w, 1e-6, 0));
    let s = error_stats(&a, &b, hidden);
    assert!(a.iter().zip(&b).filter(|(p, q)| p != q).count() > rows * hidden / 20, "the split must change many elements");
    assert!(gate().judge(&s).is_none(), "{s:?}");
}

#[test]
fn another_gemm_tiling_and_bf16_intermediates_pass() {
    let (m, n, k) = (64, 256, 1024);
    let mut rng = Rng(5);
    let xs: Vec<f32> = (0..m * k).map(|_| bf16(rng.normal() as f32) as f32).collect();
    let ws: Vec<f32> = (0..n * k).map(|_| bf16((0.02 * rng.normal()) as f32) as f32).collect();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..m {
        for j in 0..n {
            let (x, wr) = (&xs[i * k..(i + 1) * k], &ws[j * k..(j + 1) * k]);
            let seq = x.iter().zip(wr).fold(0f32, |s, (p, q)| s + p * q);
            // Split-K in 4 slices of 256, reduced at the end.
            let split: f32 = (0..4).map(|s| x[s * 256..(s + 1) * 256].iter().zip(&wr[s * 256..(s + 1) * 256]).fold(0f32, |t, (p, q)| t + p * q)).sum();
            a.push(bf16(seq));
            b.push(bf16(split));
            // An unfused pipeline: the result took a detour through a bf16 intermediate with
            // noise of up to half an ulp (random, unbiased).
            let ulp = 2f32.powi(seq.abs().log2().floor() as i32 - 7);
            c.push(bf16(seq + (rng.uniform() as f32 - 0.5) * ulp));
        }
    }
    for (name, other) in [("split-K", &b), ("bf16 intermediate", &c)] {
        let s = error_stats(&a, other, n);
        assert!(s.rel_rms > 0.0, "{name}");
        assert!(gate().judge(&s).is_none(), "{name}: {s:?}");
    }
}

#[test]
fn row_correlated_errors_of_random_sign_are_not_a_bias_but_would_be_per_element() {
    // Each row scaled by 1 ± 1e-2 (sign random per row): what a per-row reduction computed in
    // another order does, exaggerated 10^4 times. By rows: no bias. By elements: a false alarm.
    let (rows, hidden) = (133, 1024);
    let mut rng = Rng(9);
    let a: Vec<f64> = (0..rows * hidden).map(|_| bf16(rng.normal() as f32)).collect();
    let mut b = a.clone();
    for r in 0..rows {
        let g = if rng.next_u64() & 1 == 0 { 1.01 } else { 0.99 };
        for v in &mut b[r * hidden..(r + 1) * hidden] {
            *v = bf16((*v * g) as f32);
        }
    }
    let by_rows = error_stats(&a, &b, hidden);
    assert!(gate().judge(&by_rows).is_none(), "{by_rows:?}");
    let by_elements = error_stats(&a, &b, 1);
    assert!(gate().judge(&by_elements).is_some(), "independent elements would call it biased: {by_elements:?}");
}

#[test]
fn an_additive_bias_fails_on_the_shift() {
    let (rows, hidden) = (64, 1024);
    let mut rng = Rng(3);
    let f: Vec<f32> = (0..rows * hidden).map(|_| rng.normal() as f32).collect();
    let a: Vec<f64> = f.iter().map(|&v| bf16(v)).collect();
    let b: Vec<f64> = f.iter().map(|&v| bf16(v + 1e-3)).collect();
    let s = error_stats(&a, &b, hidden);
    let why = gate().judge(&s).expect("a 1e-3 shift is a bias");
    assert!(why.contains("shift bias"), "{why}");
    assert!((s.shift - 1e-3).abs() < 3e-4, "{s:?}");
}

#[test]
fn truncating_instead_of_rounding_fails_on_the_scale() {
    let mut rng = Rng(4);
    let f: Vec<f32> = (0..32 * 2048).map(|_| rng.normal() as f32).collect();
    let a: Vec<f64> = f.iter().map(|&v| bf16(v)).collect();
    let b: Vec<f64> = f.iter().map(|&v| f32::from_bits(v.to_bits() & 0xffff_0000) as f64).collect();
    let s = error_stats(&a, &b, 2048);
    let why = gate().judge(&s).expect("round-toward-zero shrinks every value");
    assert!(why.contains("scale bias") && s.scale < 0.0, "{why}");
}

#[test]
fn a_systematic_error_below_the_floor_passes() {
    // fp32 outputs, every row 1 + 1e-7 (an rsqrtf that is always a little high): significant
    // beyond doubt, but two fp32 ulps, not a fault.
    let mut rng = Rng(8);
    let a: Vec<f64> = (0..64 * 512).map(|_| rng.normal() as f32 as f64).collect();
    let b: Vec<f64> = a.iter().map(|&v| (v * (1.0 + 1e-7)) as f32 as f64).collect();
    let s = error_stats(&a, &b, 512);
    assert!(s.scale_z > 10.0, "{s:?}");
    assert!(BiasGate::for_dtype(DType::F32).unwrap().judge(&s).is_none());
    // With too few blocks there is no verdict at all.
    let s = error_stats(&a[..40], &b[..40].iter().map(|v| v * 1.01).collect::<Vec<_>>(), 0);
    assert!(s.blocks < MIN_BLOCKS && gate().judge(&s).is_none(), "{s:?}");
}
