//! The noise floor of an honest change, which the end-to-end comparison (logits, greedy
//! tokens) is judged against, so that "greedy tokens differ" is never silently equal.
//!
//! On random weights the top two logits are often close, so any change — an honest one too —
//! flips a few greedy tokens; a fixed rule ("all tokens agree") would fail honest changes, and
//! none ("informational") lets a real fault through. So `kern test` measures the floor in the
//! same run: **A′ is A run again, teacher-forced like B, with each compared interval's outputs
//! perturbed by B's own local error with random signs** (the error B's interval makes from
//! A's inputs, measured by the interval comparison; each element's error keeps its size, its
//! sign is a coin flip). A′ is an honest change by construction — B's error magnitude, no
//! direction, no relation to A's values — so B's logits should be no further from A's than
//! A′'s are. Decode steps after the first reuse the first decode step's errors (same shape),
//! with fresh signs. Errors B makes only inside states (the KV cache) are not injected.
//!
//! The judgement ([`judge`]), calibrated on what chance alone does with one sample of each:
//! - **greedy tokens**: B's and A′'s disagreements with A are two counts of the same kind; if
//!   B were as honest as A′, each disagreement would be B's or A′'s with probability ½. B is
//!   beyond the floor when `P(X ≥ d_B | X ~ Bin(d_B + d_A′, ½)) <` [`GREEDY_ALPHA`] (0.01): with
//!   A′ at 0, seven disagreements are beyond, six are not.
//! - **KL divergence**: per position, is B's KL to A above A′'s? Beyond the floor when the
//!   sign test gives p < [`KL_ALPHA`] (1e-3) *and* B's mean KL is more than [`KL_RATIO`] (2×)
//!   A′'s and above [`KL_ABS`] (1e-6, fp32 noise on the logits).

use kern_manifest::DType;
use serde::Serialize;

/// One-sided p below which B's greedy disagreements are beyond the floor's.
pub const GREEDY_ALPHA: f64 = 0.01;
/// Sign-test p below which B's per-position KL is beyond the floor's.
pub const KL_ALPHA: f64 = 1e-3;
/// B's mean KL must also be this many times the floor's…
pub const KL_RATIO: f64 = 2.0;
/// …and above this.
pub const KL_ABS: f64 = 1e-6;

/// The elements where B's output differs from A's: their indices and `b − a` (as f32: the
/// difference of two bf16 values is exact in it, and a rounding of an f32 difference does not
/// matter for noise).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SparseError {
    /// Elements of the tensor.
    pub n: usize,
    pub idx: Vec<u32>,
    pub err: Vec<f32>,
}

impl SparseError {
    /// None when the tensors are identical (or any difference is not finite: NaN and inf
    /// differences are not noise to inject).
    pub fn of(a: &[f64], b: &[f64]) -> Option<SparseError> {
        let mut s = SparseError { n: a.len().min(b.len()), ..Default::default() };
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let e = y - x;
            if e != 0.0 && e.is_finite() {
                s.idx.push(i as u32);
                s.err.push(e as f32);
            }
        }
        (!s.idx.is_empty()).then_some(s)
    }
}

/// A's bytes plus the error with a random sign per element (seeded), re-encoded in `dtype`.
/// None when the sizes differ or the dtype is not a float.
pub fn perturb(a: &[u8], dtype: DType, e: &SparseError, seed: u64) -> Option<Vec<u8>> {
    if !crate::numeric::is_float(dtype) || a.len() != e.n * dtype.size() as usize {
        return None;
    }
    let mut v = crate::numeric::to_f64(a, dtype);
    let mut rng = crate::numeric::Rng(seed);
    for (&i, &d) in e.idx.iter().zip(&e.err) {
        let s = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        v[i as usize] += s * f64::from(d);
    }
    kern_runtime::data::encode(&kern_runtime::data::Values::F64(v), dtype).ok()
}

/// One-sided `P(X ≥ k)` for `X ~ Bin(n, ½)`.
pub fn binomial_tail_half(k: usize, n: usize) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    // Σ_{j ≥ k} C(n, j) / 2^n, in logs (n is at most a few thousand positions).
    let ln_c = |j: usize| ln_fact(n) - ln_fact(j) - ln_fact(n - j) - n as f64 * std::f64::consts::LN_2;
    (k..=n).map(|j| ln_c(j).exp()).sum::<f64>().min(1.0)
}

fn ln_fact(n: usize) -> f64 {
    (2..=n).map(|i| (i as f64).ln()).sum()
}

/// What B and A′ did, end to end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndToEnd {
    /// Greedy positions that disagree with A's, of `positions`.
    pub greedy_differ: usize,
    pub positions: usize,
    /// KL(A ‖ ·) per position with logits.
    pub kl: Vec<f64>,
}

/// B against the floor: (one line per judgement, failures).
pub fn judge(b: &EndToEnd, floor: &EndToEnd) -> (Vec<String>, Vec<String>) {
    let (mut lines, mut fails) = (Vec::new(), Vec::new());
    let (db, df) = (b.greedy_differ, floor.greedy_differ);
    let p = binomial_tail_half(db, db + df);
    let greedy = format!(
        "greedy tokens: B differs from A at {db} of {} positions, the noise floor A′ at {df} of {} (P(≥ {db} of {} | honest) = {:.3})",
        b.positions,
        floor.positions,
        db + df,
        p
    );
    if db > 0 && p < GREEDY_ALPHA {
        lines.push(format!("{greedy}: BEYOND the floor (p < {GREEDY_ALPHA})"));
        fails.push(format!("greedy tokens differ at {db} of {} positions, beyond the noise floor of an honest change ({df}; p {p:.1e} < {GREEDY_ALPHA})", b.positions));
    } else if db > 0 {
        lines.push(format!("{greedy}: within the floor"));
    } else {
        lines.push(format!("{greedy}: all agree"));
    }
    let n = b.kl.len().min(floor.kl.len());
    if n > 0 {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (mb, mf) = (mean(&b.kl[..n]), mean(&floor.kl[..n]));
        let above = (0..n).filter(|&i| b.kl[i] > floor.kl[i]).count();
        let ties = (0..n).filter(|&i| b.kl[i] == floor.kl[i]).count();
        let p = binomial_tail_half(above, n - ties);
        let ratio = if mf > 0.0 { mb / mf } else if mb > 0.0 { f64::INFINITY } else { 1.0 };
        let kl = format!("mean KL(A‖B) {mb:.3e}, the floor's KL(A‖A′) {mf:.3e} (ratio {ratio:.2}; B's above the floor's at {above} of {} positions, sign test p {p:.1e})", n - ties);
        if p < KL_ALPHA && ratio > KL_RATIO && mb > KL_ABS {
            lines.push(format!("{kl}: BEYOND the floor"));
            fails.push(format!("logits: {kl} — beyond the noise floor (p < {KL_ALPHA}, ratio > {KL_RATIO})"));
        } else {
            lines.push(format!("{kl}: within the floor"));
        }
    }
    (lines, fails)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tails() {
        assert_eq!(binomial_tail_half(0, 5), 1.0);
        assert!((binomial_tail_half(1, 1) - 0.5).abs() < 1e-12);
        assert!((binomial_tail_half(7, 7) - 1.0 / 128.0).abs() < 1e-12);
        assert!((binomial_tail_half(3, 4) - 5.0 / 16.0).abs() < 1e-12);
        assert_eq!(binomial_tail_half(3, 2), 0.0);
        assert!((binomial_tail_half(600, 1000) - 1.4e-10).abs() < 1e-10);
    }

    #[test]
    fn sparse_errors_and_sign_randomized_perturbation() {
        let a = [1.0, 2.0, 3.0, 4.0];
        assert!(SparseError::of(&a, &a).is_none());
        let e = SparseError::of(&a, &[1.0, 2.5, 3.0, 3.0]).unwrap();
        assert_eq!((e.idx.clone(), e.err.clone()), (vec![1, 3], vec![0.5, -1.0]));
        let bytes: Vec<u8> = a.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect();
        let mut seen = std::collections::HashSet::new();
        for seed in 0..32 {
            let p = perturb(&bytes, DType::Bf16, &e, seed).unwrap();
            let v = crate::numeric::to_f64(&p, DType::Bf16);
            assert_eq!((v[0], v[2]), (1.0, 3.0), "untouched elements stay");
            assert!(v[1] == 2.5 || v[1] == 1.5, "{v:?}");
            assert!(v[3] == 5.0 || v[3] == 3.0, "{v:?}");
            seen.insert((v[1].to_bits(), v[3].to_bits()));
        }
        assert_eq!(seen.len(), 4, "every sign combination occurs");
        assert!(perturb(&bytes[..6], DType::Bf16, &e, 0).is_none(), "size mismatch");
        assert!(perturb(&[0u8; 16], DType::I32, &e, 0).is_none(), "integers are not perturbed");
    }

    fn e2e(differ: usize, kl: Vec<f64>) -> EndToEnd {
        EndToEnd { greedy_differ: differ, positions: 36, kl }
    }

    #[test]
    fn greedy_disagreements_are_judged_against_the_floor() {
        // The case: 1 of 36 against a floor of 1: within, and said so.
        let (lines, fails) = judge(&e2e(1, vec![]), &e2e(1, vec![]));
        assert!(fails.is_empty() && lines[0].contains("B differs from A at 1 of 36") && lines[0].ends_with("within the floor"), "{lines:?}");
        assert!(judge(&e2e(6, vec![]), &e2e(0, vec![])).1.is_empty(), "6 vs 0: p 1/64");
        let (lines, fails) = judge(&e2e(7, vec![]), &e2e(0, vec![]));
        assert_eq!(fails.len(), 1, "7 vs 0: p 1/128");
        assert!(lines[0].contains("BEYOND"), "{lines:?}");
        assert!(judge(&e2e(9, vec![]), &e2e(4, vec![])).1.is_empty(), "9 vs 4: p 0.13");
        assert!(judge(&e2e(0, vec![]), &e2e(3, vec![])).0[0].ends_with("all agree"));
    }

    #[test]
    fn kl_is_judged_by_sign_and_ratio() {
        let floor: Vec<f64> = (0..36).map(|i| 1e-3 * (1.0 + (i % 5) as f64)).collect();
        // An honest change: B's KL is the floor's, shuffled.
        let honest: Vec<f64> = (0..36).map(|i| floor[(i * 7) % 36]).collect();
        assert!(judge(&e2e(0, honest), &e2e(0, floor.clone())).1.is_empty());
        // Everywhere 3× the floor: beyond.
        let bad: Vec<f64> = floor.iter().map(|k| 3.0 * k).collect();
        let (_, fails) = judge(&e2e(0, bad), &e2e(0, floor.clone()));
        assert!(fails.len() == 1 && fails[0].contains("beyond the noise floor"), "{fails:?}");
        // Consistently above but only by 20 %: not beyond (ratio ≤ 2).
        let slight: Vec<f64> = floor.iter().map(|k| 1.2 * k).collect();
        assert!(judge(&e2e(0, slight), &e2e(0, floor)).1.is_empty());
        // fp32 noise against an exact floor: under the absolute floor.
        assert!(judge(&e2e(0, vec![1e-9; 36]), &e2e(0, vec![0.0; 36])).1.is_empty());
        assert!(!judge(&e2e(0, vec![1e-4; 36]), &e2e(0, vec![0.0; 36])).1.is_empty());
    }
}
