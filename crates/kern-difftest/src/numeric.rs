//! The numbers: dtype-aware comparison of two tensors (tolerances, ULP distance), logit
//! metrics (KL divergence, top-k overlap), the input distributions of the kernel diff, and the
//! classification of timings. All host-side and pure.

use crate::stats::{error_stats, BiasGate, ErrorStats};
use kern_manifest::DType;
use serde::Serialize;

/// Element tolerance for one dtype: `|a − b| ≤ atol · scale + rtol · |a|`, where `a` is A's
/// value (the reference) and `scale` the RMS of A's finite values (so a tolerance means the
/// same thing for activations of size 0.01 and logits of size 30). A finite value against a
/// non-finite one fails; two non-finite values pass (counted when they differ in kind). A
/// tensor fails when more than `max_mismatch` of its elements (a fraction, rounded down) fail.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
    pub max_mismatch: f64,
}

impl Tolerance {
    /// Defaults per dtype. bf16: torch's rtol (1.6e-2, two bf16 epsilons) — one rounding flip
    /// of a bf16 output is 2^-8 relative and passes; f16 twice its epsilon; f32 1e-5 (two
    /// fp32 accumulation orders of a K = 4096 dot product differ by ~1e-6 of the RMS).
    /// Integers and bools must be equal.
    pub fn default_for(dtype: DType) -> Tolerance {
        let (rtol, atol) = match dtype {
            DType::Bf16 => (1.6e-2, 1e-3),
            DType::F16 => (2e-3, 1e-4),
            DType::F32 => (1e-5, 1e-5),
            DType::F64 => (1e-7, 1e-7),
            DType::F8e4m3 | DType::F8e5m2 => (0.125, 1e-2),
            _ => (0.0, 0.0),
        };
        Tolerance { rtol, atol, max_mismatch: 1e-4 }
    }
}

pub fn is_float(d: DType) -> bool {
    matches!(d, DType::Bf16 | DType::F16 | DType::F32 | DType::F64 | DType::F8e4m3 | DType::F8e5m2)
}

/// The result of comparing A's tensor with B's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// The error statistics beside the tolerance ([`crate::stats`]; floats only).
    pub errors: Option<ErrorStats>,
    /// Why the error is biased (the statistic, its value and threshold), when the bias gate is
    /// on and fails: a divergence even when every element is within tolerance.
    pub bias: Option<String>,
    pub elements: usize,
    /// Elements outside the tolerance (NaN vs number and differing infinities count).
    pub mismatches: usize,
    /// Elements whose bits are equal (exact).
    pub exact: usize,
    pub max_abs: f64,
    /// Max of |a − b| / |a| over elements with a ≠ 0.
    pub max_rel: f64,
    /// Largest distance in units in the last place of the dtype (floats only).
    pub max_ulp: u64,
    /// RMS of A's finite values (the `scale` of the tolerance).
    pub rms: f64,
    /// NaNs in A / in B.
    pub nan_a: usize,
    pub nan_b: usize,
    /// Elements non-finite on both sides but not alike (NaN vs ±inf, +inf vs -inf): accepted.
    pub nonfinite_differ: usize,
    /// Index of the worst element (largest |a − b| relative to its tolerance) and its values.
    pub worst: Option<(usize, f64, f64)>,
    /// Every element's tolerance holds (within the mismatch budget).
    pub pass: bool,
}

impl Stats {
    /// Within tolerance and not biased.
    pub fn ok(&self) -> bool {
        self.pass && self.bias.is_none()
    }

    pub fn mismatch_fraction(&self) -> f64 {
        if self.elements == 0 {
            0.0
        } else {
            self.mismatches as f64 / self.elements as f64
        }
    }
}

/// Decodes little-endian `dtype` bytes as f64 (integers exactly up to 2^53).
pub fn to_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match kern_runtime::data::decode(bytes, dtype) {
        kern_runtime::data::Values::F64(v) => v,
        kern_runtime::data::Values::I64(v) => v.into_iter().map(|x| x as f64).collect(),
        kern_runtime::data::Values::U64(v) => v.into_iter().map(|x| x as f64).collect(),
        kern_runtime::data::Values::Bool(v) => v.into_iter().map(|x| f64::from(u8::from(x))).collect(),
    }
}

/// [`to_f64`] with the common float dtypes decoded directly.
fn decode_fast(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::Bf16 => bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::F16 => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        _ => to_f64(bytes, dtype),
    }
}

/// Maps a float's bits to an integer whose order is the float order, so that neighbouring
/// representable values differ by 1 (−0 and +0 coincide).
fn ordered(bits: u64, width: u32) -> i128 {
    let sign = 1u64 << (width - 1);
    let mag = (bits & (sign - 1)) as i128;
    if bits & sign != 0 {
        -mag
    } else {
        mag
    }
}

/// ULP distance between two elements of `dtype` given as raw little-endian bytes.
pub fn ulp_distance(a: &[u8], b: &[u8], dtype: DType) -> u64 {
    let width = (dtype.size() * 8) as u32;
    let rd = |x: &[u8]| {
        let mut v = [0u8; 8];
        v[..x.len()].copy_from_slice(x);
        u64::from_le_bytes(v)
    };
    (ordered(rd(a), width) - ordered(rd(b), width)).unsigned_abs().min(u64::MAX as u128) as u64
}

/// Compares A's tensor with B's (same dtype, raw bytes). Lengths must be equal; a length
/// difference compares the common prefix and counts the rest as mismatches. The error
/// statistics take the tensor as one row; [`compare_rows`] knows the rows.
pub fn compare(a: &[u8], b: &[u8], dtype: DType, tol: &Tolerance) -> Stats {
    compare_rows(a, b, dtype, tol, 0, true)
}

/// [`compare`] with the tensor's row length (its last dimension: the blocks of the bias
/// statistics) and whether the bias gate judges it (`gate`; the statistics are kept either
/// way).
pub fn compare_rows(a: &[u8], b: &[u8], dtype: DType, tol: &Tolerance, row_len: usize, gate: bool) -> Stats {
    let es = dtype.size() as usize;
    let n = a.len().min(b.len()) / es;
    let extra = (a.len().max(b.len()) / es) - n;
    let (fa, fb) = (decode_fast(&a[..n * es], dtype), decode_fast(&b[..n * es], dtype));
    let float = is_float(dtype);
    let (mut sum, mut cnt) = (0.0f64, 0usize);
    for x in fa.iter().filter(|x| x.is_finite()) {
        sum += x * x;
        cnt += 1;
    }
    let rms = if cnt == 0 { 0.0 } else { (sum / cnt as f64).sqrt() };
    let mut s = Stats { elements: n + extra, mismatches: extra, rms, ..Default::default() };
    let mut worst_score = -1.0f64;
    for i in 0..n {
        let (x, y) = (fa[i], fb[i]);
        let (xb, yb) = (&a[i * es..(i + 1) * es], &b[i * es..(i + 1) * es]);
        if xb == yb {
            s.exact += 1;
        }
        s.nan_a += usize::from(x.is_nan());
        s.nan_b += usize::from(y.is_nan());
        let (ok, score) = if !x.is_finite() && !y.is_finite() {
            // Both overflowed: NaN against ±inf, or +inf against -inf, depends on the order
            // of an overflowing sum, which two correct implementations may differ in.
            if !(x.is_nan() && y.is_nan()) && x != y {
                s.nonfinite_differ += 1;
            }
            (true, 0.0)
        } else if !x.is_finite() || !y.is_finite() {
            (false, f64::INFINITY)
        } else {
            let d = (x - y).abs();
            s.max_abs = s.max_abs.max(d);
            if x != 0.0 {
                s.max_rel = s.max_rel.max(d / x.abs());
            }
            let allowed = tol.atol * rms + tol.rtol * x.abs();
            (d <= allowed, if allowed > 0.0 { d / allowed } else if d == 0.0 { 0.0 } else { f64::INFINITY })
        };
        if float && xb != yb {
            s.max_ulp = s.max_ulp.max(ulp_distance(xb, yb, dtype));
        }
        if !ok {
            s.mismatches += 1;
        }
        if score > worst_score && score > 0.0 {
            worst_score = score;
            s.worst = Some((i, x, y));
        }
    }
    let allowed = (tol.max_mismatch * s.elements as f64).floor() as usize;
    s.pass = s.mismatches <= allowed;
    if float {
        let e = error_stats(&fa, &fb, row_len);
        if gate {
            s.bias = BiasGate::for_dtype(dtype).and_then(|g| g.judge(&e));
        }
        s.errors = Some(e);
    }
    s
}

// ------------------------------------------------------------------------------ logits

/// How B's logits differ from A's over the positions (rows) of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LogitStats {
    pub positions: usize,
    /// KL(softmax(A) ‖ softmax(B)) per position: mean and max.
    pub kl_mean: f64,
    pub kl_max: f64,
    /// Share of positions where both argmaxes agree.
    pub top1_agree: f64,
    /// Mean |top-5(A) ∩ top-5(B)| / 5.
    pub top5_overlap: f64,
    pub max_abs: f64,
    /// Positions whose argmaxes differ and where one side's argmax is not in the other's
    /// top 5 (vLLM's `check_logprobs_close` rule).
    pub top5_violations: usize,
}

/// KL(softmax(p) ‖ softmax(q)) in f64 (natural log). Non-finite logits are skipped on both.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let lse = |v: &[f32]| {
        let m = v.iter().copied().filter(|x| x.is_finite()).fold(f32::NEG_INFINITY, f32::max) as f64;
        m + v.iter().filter(|x| x.is_finite()).map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    let mut kl = 0.0;
    for (&x, &y) in p.iter().zip(q) {
        if !x.is_finite() || !y.is_finite() {
            continue;
        }
        let (a, b) = (x as f64 - lp, y as f64 - lq);
        kl += a.exp() * (a - b);
    }
    kl.max(0.0)
}

/// Indices of the `k` largest values (first index wins ties, as torch.argmax).
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let key = |i: usize| if v[i].is_nan() { f32::INFINITY } else { v[i] };
    idx.sort_by(|&i, &j| key(j).total_cmp(&key(i)).then(i.cmp(&j)));
    idx.truncate(k);
    idx
}

/// Logit statistics over `rows` positions of `vocab` logits each.
pub fn logit_stats(a: &[f32], b: &[f32], vocab: usize) -> LogitStats {
    let rows = a.len().min(b.len()) / vocab.max(1);
    let mut s = LogitStats { positions: rows, ..Default::default() };
    if rows == 0 {
        return s;
    }
    let (mut kl_sum, mut agree, mut overlap) = (0.0, 0usize, 0.0);
    for r in 0..rows {
        let (pa, pb) = (&a[r * vocab..(r + 1) * vocab], &b[r * vocab..(r + 1) * vocab]);
        let kl = kl_divergence(pa, pb);
        kl_sum += kl;
        s.kl_max = s.kl_max.max(kl);
        let (ta, tb) = (top_k(pa, 5), top_k(pb, 5));
        if ta[0] == tb[0] {
            agree += 1;
        } else if !tb.contains(&ta[0]) || !ta.contains(&tb[0]) {
            s.top5_violations += 1;
        }
        overlap += ta.iter().filter(|i| tb.contains(i)).count() as f64 / ta.len().max(1) as f64;
        for (x, y) in pa.iter().zip(pb) {
            if x.is_finite() && y.is_finite() {
                s.max_abs = s.max_abs.max((*x as f64 - *y as f64).abs());
            }
        }
    }
    s.kl_mean = kl_sum / rows as f64;
    s.top1_agree = agree as f64 / rows as f64;
    s.top5_overlap = overlap / rows as f64;
    s
}

/// Merges the statistics of several runs (weighted by positions).
pub fn merge_logit_stats(parts: &[LogitStats]) -> LogitStats {
    let n: usize = parts.iter().map(|p| p.positions).sum();
    let mut s = LogitStats { positions: n, ..Default::default() };
    if n == 0 {
        return s;
    }
    for p in parts {
        let w = p.positions as f64 / n as f64;
        s.kl_mean += p.kl_mean * w;
        s.top1_agree += p.top1_agree * w;
        s.top5_overlap += p.top5_overlap * w;
        s.kl_max = s.kl_max.max(p.kl_max);
        s.max_abs = s.max_abs.max(p.max_abs);
        s.top5_violations += p.top5_violations;
    }
    s
}

// ------------------------------------------------------------------------------ inputs

/// The input distributions of the kernel diff. Every generator is seeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dist {
    /// N(0, 1).
    Normal,
    /// N(0, 0.02): the scale of weights and residual activations.
    Small,
    /// N(0, 10).
    Wide,
    /// U[-1, 1).
    Uniform,
    /// N(0, 1) with one element in 1000 multiplied by 1000 (outliers).
    Outliers,
    /// All zeros (zero rows: 0/0 in norms).
    Zeros,
    /// ±(0.5..1) × the dtype's largest finite value (overflow behaviour).
    Large,
    /// ±(0.5..1) × the dtype's smallest normal value (denormal behaviour).
    Tiny,
}

impl Dist {
    pub const ALL: [Dist; 8] = [Dist::Normal, Dist::Small, Dist::Wide, Dist::Uniform, Dist::Outliers, Dist::Zeros, Dist::Large, Dist::Tiny];

    pub fn name(self) -> &'static str {
        match self {
            Dist::Normal => "normal(0,1)",
            Dist::Small => "normal(0,0.02)",
            Dist::Wide => "normal(0,10)",
            Dist::Uniform => "uniform(-1,1)",
            Dist::Outliers => "outliers(x1000 @0.1%)",
            Dist::Zeros => "zeros",
            Dist::Large => "near-max",
            Dist::Tiny => "near-min-normal",
        }
    }

    /// `n` values for a buffer of `dtype` (floats only), from `seed`.
    pub fn values(self, n: usize, dtype: DType, seed: u64) -> Vec<f64> {
        let mut rng = Rng(seed ^ 0x5851_f42d_4c95_7f2d);
        let (max, min_normal) = match dtype {
            DType::Bf16 => (3.389_531_389_251_535_5e38, 1.175_494_350_822_287_5e-38),
            DType::F16 => (65504.0, 6.103_515_625e-5),
            DType::F8e4m3 => (448.0, 0.015_625),
            DType::F8e5m2 => (57344.0, 6.103_515_625e-5),
            DType::F64 => (f64::MAX, f64::MIN_POSITIVE),
            _ => (f32::MAX as f64, f32::MIN_POSITIVE as f64),
        };
        (0..n)
            .map(|i| match self {
                Dist::Normal => rng.normal(),
                Dist::Small => 0.02 * rng.normal(),
                Dist::Wide => 10.0 * rng.normal(),
                Dist::Uniform => rng.uniform() * 2.0 - 1.0,
                Dist::Outliers => {
                    let x = rng.normal();
                    if i % 1000 == 997 {
                        x * 1000.0
                    } else {
                        x
                    }
                }
                Dist::Zeros => 0.0,
                Dist::Large | Dist::Tiny => {
                    let m = 0.5 + 0.5 * rng.uniform();
                    let s = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
                    // Just inside the range so that rounding never gives inf.
                    s * m * if self == Dist::Large { max * 0.99 } else { min_normal }
                }
            })
            .collect()
    }
}

/// splitmix64 with Box-Muller normals.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// U[0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        let u1 = (self.uniform() + 1.0 / (1u64 << 53) as f64).min(1.0);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

// ------------------------------------------------------------------------------ timing

/// Robust summary of timing samples (milliseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Timing {
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
    pub samples: usize,
}

impl Timing {
    pub fn of(samples: &[f64]) -> Timing {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Timing::default();
        }
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let pos = p * (v.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        Timing { median: q(0.5), q1: q(0.25), q3: q(0.75), samples: v.len() }
    }
}

/// B's time against A's, nvbench-compare style.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PerfClass {
    /// Medians within the threshold.
    Same,
    /// B faster by more than the threshold, interquartile ranges disjoint.
    Faster,
    /// B slower by more than the threshold, interquartile ranges disjoint: a regression.
    Slower,
    /// Beyond the threshold but the ranges overlap: noise, no verdict.
    Ambiguous,
}

impl PerfClass {
    pub fn name(self) -> &'static str {
        match self {
            PerfClass::Same => "same",
            PerfClass::Faster => "FASTER",
            PerfClass::Slower => "SLOWER",
            PerfClass::Ambiguous => "noisy",
        }
    }
}

/// Classifies B against A with a relative threshold (0.05 = 5 %) and an absolute floor in
/// milliseconds below which differences are noise (launch jitter).
pub fn classify(a: &Timing, b: &Timing, threshold: f64, floor_ms: f64) -> PerfClass {
    if a.samples == 0 || b.samples == 0 {
        return PerfClass::Ambiguous;
    }
    let d = b.median - a.median;
    if d.abs() <= threshold * a.median || d.abs() < floor_ms {
        PerfClass::Same
    } else if d > 0.0 && b.q1 > a.q3 {
        PerfClass::Slower
    } else if d < 0.0 && b.q3 < a.q1 {
        PerfClass::Faster
    } else {
        PerfClass::Ambiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()
    }

    #[test]
    fn ulp_distance_counts_representable_steps() {
        let one = half::bf16::from_f32(1.0).to_le_bytes();
        let next = half::bf16::from_bits(half::bf16::from_f32(1.0).to_bits() + 1).to_le_bytes();
        let two_up = half::bf16::from_bits(half::bf16::from_f32(1.0).to_bits() + 2).to_le_bytes();
        assert_eq!(ulp_distance(&one, &one, DType::Bf16), 0);
        assert_eq!(ulp_distance(&one, &next, DType::Bf16), 1);
        assert_eq!(ulp_distance(&two_up, &one, DType::Bf16), 2);
        // Across zero: -min_subnormal .. +min_subnormal is 2 steps; -0 and +0 coincide.
        assert_eq!(ulp_distance(&0x8001u16.to_le_bytes(), &0x0001u16.to_le_bytes(), DType::Bf16), 2);
        assert_eq!(ulp_distance(&0x8000u16.to_le_bytes(), &0x0000u16.to_le_bytes(), DType::Bf16), 0);
        let f = |x: f32| x.to_le_bytes();
        assert_eq!(ulp_distance(&f(1.0), &f(f32::from_bits(1.0f32.to_bits() + 5)), DType::F32), 5);
        assert_eq!(ulp_distance(&f(-1.0), &f(f32::from_bits((-1.0f32).to_bits() + 3)), DType::F32), 3);
    }

    #[test]
    fn one_rounding_flip_passes_bf16_and_a_wrong_scale_fails() {
        let a: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin()).collect();
        let mut b = a.clone();
        let tol = Tolerance::default_for(DType::Bf16);
        let (ab, mut bb) = (bf16s(&a), bf16s(&b));
        // One ulp up on every tenth element.
        for i in (0..1000).step_by(10) {
            let bits = u16::from_le_bytes([bb[2 * i], bb[2 * i + 1]]) + 1;
            bb[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
        }
        let s = compare(&ab, &bb, DType::Bf16, &tol);
        assert!(s.pass, "{s:?}");
        assert_eq!(s.max_ulp, 1);
        assert_eq!(s.exact, 900);
        // Within tolerance, but every flip moves away from zero: a scale bias, so not ok.
        assert!(s.bias.as_deref().is_some_and(|b| b.starts_with("scale bias")) && !s.ok(), "{s:?}");
        assert!(compare_rows(&ab, &bb, DType::Bf16, &tol, 0, false).bias.is_none(), "gate off");
        // A norm with the wrong epsilon: every element 5 % off.
        for x in b.iter_mut() {
            *x *= 1.05;
        }
        let s = compare(&ab, &bf16s(&b), DType::Bf16, &tol);
        assert!(!s.pass);
        assert!(s.mismatch_fraction() > 0.5, "{s:?}");
        assert!((s.max_rel - 0.05).abs() < 0.01, "{s:?}");
        assert!(s.worst.is_some());
    }

    #[test]
    fn identical_bits_pass_with_zero_tolerance_and_nan_rules_hold() {
        let a = bf16s(&[1.0, f32::NAN, f32::INFINITY, -2.0]);
        let zero = Tolerance { rtol: 0.0, atol: 0.0, max_mismatch: 0.0 };
        let s = compare(&a, &a, DType::Bf16, &zero);
        assert!(s.pass && s.exact == 4 && s.nan_a == 1 && s.nan_b == 1, "{s:?}");
        let b = bf16s(&[1.0, 1.0, f32::NEG_INFINITY, -2.0]);
        let s = compare(&a, &b, DType::Bf16, &Tolerance::default_for(DType::Bf16));
        assert_eq!(s.mismatches, 1, "NaN vs number");
        assert_eq!(s.nonfinite_differ, 1, "+inf vs -inf: both overflowed, accepted and counted");
        assert!(!s.pass);
        let c = bf16s(&[f32::INFINITY, 3.0]);
        let s = compare(&c, &bf16s(&[f32::NAN, f32::INFINITY]), DType::Bf16, &Tolerance::default_for(DType::Bf16));
        assert_eq!((s.mismatches, s.nonfinite_differ), (1, 1), "inf vs NaN accepted, a finite value vs inf not");
    }

    #[test]
    fn the_mismatch_budget_is_a_fraction_rounded_down() {
        let a: Vec<f32> = vec![1.0; 20000];
        let mut b = a.clone();
        b[5] = 2.0;
        b[6] = 2.0;
        let tol = Tolerance::default_for(DType::Bf16);
        assert!(compare(&bf16s(&a), &bf16s(&b), DType::Bf16, &tol).pass, "2 of 20000 ≤ 1e-4");
        b[7] = 2.0;
        assert!(!compare(&bf16s(&a), &bf16s(&b), DType::Bf16, &tol).pass, "3 of 20000 > 1e-4");
        // A tiny tensor allows nothing.
        assert!(!compare(&bf16s(&[1.0]), &bf16s(&[2.0]), DType::Bf16, &tol).pass);
    }

    #[test]
    fn integers_must_be_equal() {
        let a: Vec<u8> = [1i32, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [1i32, 2, 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = Tolerance::default_for(DType::I32);
        assert!(compare(&a, &a, DType::I32, &t).pass);
        let s = compare(&a, &b, DType::I32, &t);
        assert!(!s.pass && s.mismatches == 1 && s.max_ulp == 0);
    }

    #[test]
    fn f32_accumulation_order_noise_passes() {
        let a: Vec<f32> = (0..4096).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01).collect();
        let b: Vec<f32> = a.iter().map(|x| x + 2e-6 * 3.0).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert!(compare(&bytes(&a), &bytes(&b), DType::F32, &Tolerance::default_for(DType::F32)).pass);
        let c: Vec<f32> = a.iter().map(|x| x * 1.001).collect();
        assert!(!compare(&bytes(&a), &bytes(&c), DType::F32, &Tolerance::default_for(DType::F32)).pass);
    }

    #[test]
    fn kl_and_top_k() {
        let p = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert!(kl_divergence(&p, &p).abs() < 1e-12);
        // Shifting all logits changes nothing.
        let q: Vec<f32> = p.iter().map(|x| x + 3.0).collect();
        assert!(kl_divergence(&p, &q) < 1e-9);
        // KL of two-point distributions: p = (0.5, 0.5), q = softmax(0, ln 3) = (0.25, 0.75).
        let kl = kl_divergence(&[0.0, 0.0], &[0.0, 3f32.ln()]);
        let want = 0.5 * (0.5f64 / 0.25).ln() + 0.5 * (0.5f64 / 0.75).ln();
        assert!((kl - want).abs() < 1e-6, "{kl} vs {want}");
        assert_eq!(top_k(&p, 2), vec![5, 4]);
        assert_eq!(top_k(&[1.0, 3.0, 3.0], 1), vec![1], "first index wins ties");
        assert_eq!(top_k(&[1.0, f32::NAN, 3.0], 1), vec![1], "NaN is the max, as torch.argmax");
    }

    #[test]
    fn logit_stats_over_positions() {
        let vocab = 8;
        let a: Vec<f32> = (0..3 * vocab).map(|i| (i % vocab) as f32).collect();
        let s = logit_stats(&a, &a, vocab);
        assert_eq!((s.positions, s.top1_agree, s.top5_overlap, s.top5_violations), (3, 1.0, 1.0, 0));
        assert_eq!(s.kl_max, 0.0);
        // Row 1: B's argmax is A's second choice (in A's top 5): a disagreement, no violation.
        let mut b = a.clone();
        b[vocab + 6] = 10.0;
        // Row 2: B's argmax is A's smallest logit: a violation.
        b[2 * vocab] = 100.0;
        let s = logit_stats(&a, &b, vocab);
        assert!((s.top1_agree - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.top5_violations, 1);
        assert!(s.kl_max > s.kl_mean && s.kl_mean > 0.0);
        assert_eq!(s.max_abs, 100.0);
        let m = merge_logit_stats(&[s.clone(), logit_stats(&a, &a, vocab)]);
        assert_eq!(m.positions, 6);
        assert!((m.top1_agree - 4.0 / 6.0).abs() < 1e-9);
        assert_eq!(m.top5_violations, 1);
    }

    #[test]
    fn distributions_are_seeded_and_shaped() {
        for d in Dist::ALL {
            let x = d.values(5000, DType::Bf16, 7);
            assert_eq!(x, d.values(5000, DType::Bf16, 7), "{}", d.name());
            assert!(x.iter().all(|v| v.is_finite()), "{}", d.name());
            let bytes = kern_runtime::data::encode(&kern_runtime::data::Values::F64(x.clone()), DType::Bf16).unwrap();
            assert!(to_f64(&bytes, DType::Bf16).iter().all(|v| v.is_finite()), "{} stays finite in bf16", d.name());
        }
        let n = Dist::Normal.values(20000, DType::F32, 1);
        let mean = n.iter().sum::<f64>() / n.len() as f64;
        let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n.len() as f64;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{mean} {var}");
        assert_ne!(Dist::Normal.values(10, DType::F32, 1), Dist::Normal.values(10, DType::F32, 2));
        let o = Dist::Outliers.values(2000, DType::F32, 1);
        assert!(o.iter().any(|x| x.abs() > 50.0));
        assert!(Dist::Zeros.values(10, DType::F16, 1).iter().all(|&x| x == 0.0));
        assert!(Dist::Large.values(100, DType::F16, 1).iter().all(|x| x.abs() >= 32000.0 && x.abs() <= 65504.0));
        assert!(Dist::Tiny.values(100, DType::F16, 1).iter().all(|x| x.abs() < 1e-4 && *x != 0.0));
    }

    #[test]
    fn timing_classes() {
        let t = |m: f64, spread: f64| Timing { median: m, q1: m - spread, q3: m + spread, samples: 20 };
        assert_eq!(classify(&t(1.0, 0.01), &t(1.02, 0.01), 0.05, 0.0), PerfClass::Same);
        assert_eq!(classify(&t(1.0, 0.01), &t(1.5, 0.01), 0.05, 0.0), PerfClass::Slower);
        assert_eq!(classify(&t(1.0, 0.01), &t(0.5, 0.01), 0.05, 0.0), PerfClass::Faster);
        assert_eq!(classify(&t(1.0, 0.3), &t(1.2, 0.3), 0.05, 0.0), PerfClass::Ambiguous);
        assert_eq!(classify(&t(0.002, 0.0), &t(0.004, 0.0), 0.05, 0.003), PerfClass::Same, "below the floor");
        let s = Timing::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.median, s.q1, s.q3, s.samples), (3.0, 2.0, 4.0, 5));
    }
}
