//! Statistics of the error `B − A` beside the tolerances: what a per-element tolerance cannot
//! see. A kernel whose every element is within a few ulps of the reference can still be wrong
//! if its error is one-sided — an RMSNorm with epsilon 1e-2 instead of 1e-6 shrinks every
//! element of every row by the same relative amount (about eps / 2·mean(x²)), while a correct
//! reimplementation (another GEMM tiling, another reduction order, a fusion) makes errors that
//! are as often up as down and unrelated to the values themselves.
//!
//! For every comparison from identical inputs ([`error_stats`]):
//! - **shift**: the signed error's mean, in units of A's RMS (an additive bias);
//! - **scale**: the least-squares slope of the error on A's values, `Σ e·a / Σ a²` (a
//!   multiplicative bias: the eps case, a wrong scale, truncation instead of rounding);
//! - each with its standard error over **independent blocks**, not elements: the rows of the
//!   buffer (its last dimension). Errors inside one row are correlated in honest kernels too —
//!   a row's norm factor, an attention head's softmax denominator, computed in another order,
//!   move the whole row one way — but that direction is random from row to row. A systematic
//!   fault moves every row the same way. So the blocks are rows; when a buffer has fewer than
//!   [`TARGET_BLOCKS`] rows (a decode step, one token) each row is cut into equal chunks, and
//!   the effect floor below keeps a row-wide honest error from counting as a bias. The
//!   standard errors are cluster-robust (the sandwich estimator over blocks), and `z` is read
//!   against Student's t with `blocks − 1` degrees of freedom;
//! - the error's **correlation** with A, the **relative RMS error** `‖e‖/‖a‖`, the **SNR**
//!   `10·log10(Σa² / Σe²)` dB and the **cosine similarity** of A and B (reported, not gated:
//!   they measure size, which the tolerance already judges, and precision mode reports them).
//!
//! # The gate and its calibration ([`BiasGate`])
//! A comparison is **biased** when, for the shift or the scale, both hold:
//! 1. it is significant: two-sided p < [`P_MAX`] = 1e-6 over at least [`MIN_BLOCKS`] = 8
//!    blocks. A run makes a few thousand such tests (≈ 260 intervals × outputs × 2 steps, and
//!    every op × distribution × shape of the kernel diff, × 2 statistics), so 1e-6 keeps the
//!    chance of one false alarm per run near 1e-3;
//! 2. it is large enough to matter: `|effect| > floor = max(2·u², 2^-17)`, u the unit
//!    roundoff of the output's dtype (bf16 2^-8, f16 2^-11, f32 2^-24, fp8 e4m3 2^-4). Rounding
//!    an fp32 result to bf16 is unbiased to first order, whatever the reduction order; what
//!    remains is second order — a norm's mean square taken over bf16-rounded inputs is high by
//!    about u²/3 of itself, so its scale is off by about −u²/6 — and the floor is 12× that.
//!    2^-17 (128 fp32 ulps) is above what fp32 accumulation order and fast intrinsics
//!    (`rsqrtf`, `__expf`) change systematically (a few fp32 ulps). For bf16 the floor is
//!    2^-15 ≈ 3.05e-5.
//!
//! Measured on the CPU (the unit tests; a hidden size of 2048 (a 1.7B-parameter decoder), bf16 outputs, 133 rows
//! unless said): an RMSNorm's epsilon raised from 1e-6 to `eps` shrinks its output by
//! `eps / (2·(ms + eps))`, ms the row's mean square (≈ 3 at layer 7 of a random-weight 1.7B decoder,
//! ≈ 7 at layer 18):
//!
//! | case | scale | z (blocks) | verdict |
//! |---|---|---|---|
//! | two reduction orders of the sum of squares, ms 3 | −1.4e-6 … −1.9e-6 | −4.0 … −5.6 (133) | pass: 16× under the floor, though significant |
//! | split add + RMSNorm (the sum rounded to bf16 first) | −8.2e-6 | −1.0 (133) | pass |
//! | eps 1e-2, ms 3 / ms 7 | −1.7e-3 / −7.1e-4 | −156 / −97 (133) | fail |
//! | eps 1e-3, ms 3 / ms 7 | −1.7e-4 / −7.5e-5 | −44 / −24 (133) | fail |
//! | eps 1e-3, ms 3, 4 rows (a decode step: 32 chunks) | −1.6e-4 | −7.1 (32) | fail |
//! | eps 1e-4, ms 3 | −1.7e-5 | −12 (133) | pass: under the floor (the limit) |
//!
//! So eps 1e-2 is caught with a 23–55× margin and eps 1e-3 while ms < 16. Every one of these
//! is inside the bf16 tolerance (at most 4 ulps). Also tested: split-K GEMM and a bf16
//! intermediate pass; rows scaled by 1 ± 1e-2 with random signs pass by rows (and would fail
//! if elements were taken as independent); an additive 1e-3 fails on the shift; truncation
//! instead of rounding fails on the scale.

use kern_manifest::DType;
use serde::Serialize;

/// Two-sided p-value below which a shift or scale is significant.
pub const P_MAX: f64 = 1e-6;
/// Fewer blocks than this give no bias verdict (too few independent errors to judge).
pub const MIN_BLOCKS: usize = 8;
/// Buffers with fewer rows are cut into chunks until they have about this many blocks.
pub const TARGET_BLOCKS: usize = 32;
/// Chunks are never shorter than this many elements.
const MIN_CHUNK: usize = 16;

/// The error statistics of one comparison (finite element pairs only).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Element pairs where both sides are finite.
    pub n: usize,
    /// Independent blocks the standard errors are taken over, and their length.
    pub blocks: usize,
    pub block_len: usize,
    /// Mean of `B − A` over A's RMS; its z-score (shift / standard error).
    pub shift: f64,
    pub shift_z: f64,
    /// `Σ (B − A)·A / Σ A²`: B ≈ (1 + scale)·A; its z-score.
    pub scale: f64,
    pub scale_z: f64,
    /// Pearson correlation of the error with A.
    pub corr: f64,
    /// `‖B − A‖ / ‖A‖`.
    pub rel_rms: f64,
    /// `10·log10(Σ A² / Σ (B − A)²)`; infinite when B equals A (JSON: null).
    pub snr_db: f64,
    /// `Σ A·B / (‖A‖·‖B‖)`.
    pub cosine: f64,
    /// Sums kept so that comparisons can be pooled (per layer, per step): Σ A², Σ (B − A)².
    pub sum_a2: f64,
    pub sum_e2: f64,
}

impl ErrorStats {
    /// Two-sided p-values of the shift and the scale (1 without enough blocks).
    pub fn p_values(&self) -> (f64, f64) {
        if self.blocks < 2 {
            return (1.0, 1.0);
        }
        let df = (self.blocks - 1) as f64;
        (t_two_sided_p(self.shift_z, df), t_two_sided_p(self.scale_z, df))
    }
}

/// The layout of the blocks for `n` elements in rows of `row_len`: (block length, chunks per
/// row). Rows are kept whole when there are enough of them.
pub fn block_layout(n: usize, row_len: usize) -> (usize, usize) {
    let row_len = if row_len == 0 || row_len > n { n.max(1) } else { row_len };
    let rows = n.div_ceil(row_len);
    if rows >= TARGET_BLOCKS {
        return (row_len, 1);
    }
    let want = TARGET_BLOCKS.div_ceil(rows);
    let len = row_len.div_ceil(want).max(MIN_CHUNK.min(row_len));
    (len, row_len.div_ceil(len))
}

/// The statistics of `b − a` (A the reference), with rows of `row_len` elements (the buffer's
/// last dimension; 0 = one row). Pairs where either side is not finite are skipped.
pub fn error_stats(a: &[f64], b: &[f64], row_len: usize) -> ErrorStats {
    let n_all = a.len().min(b.len());
    let row_len = if row_len == 0 || row_len > n_all { n_all.max(1) } else { row_len };
    let (chunk, per_row) = block_layout(n_all, row_len);
    // Per block: count, Σe, Σe·a, Σa².
    let nblocks = n_all.div_ceil(row_len) * per_row;
    let mut blk = vec![(0usize, 0.0f64, 0.0f64, 0.0f64); nblocks];
    let (mut n, mut sa, mut se, mut saa, mut see, mut sea, mut sbb, mut sab) = (0usize, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for i in 0..n_all {
        let (x, y) = (a[i], b[i]);
        if !x.is_finite() || !y.is_finite() {
            continue;
        }
        let e = y - x;
        let k = (i / row_len) * per_row + (i % row_len) / chunk;
        let bk = &mut blk[k];
        bk.0 += 1;
        bk.1 += e;
        bk.2 += e * x;
        bk.3 += x * x;
        n += 1;
        sa += x;
        se += e;
        saa += x * x;
        see += e * e;
        sea += e * x;
        sbb += y * y;
        sab += x * y;
    }
    let mut s = ErrorStats { n, sum_a2: saa, sum_e2: see, ..Default::default() };
    if n == 0 {
        s.snr_db = f64::INFINITY;
        s.cosine = 1.0;
        return s;
    }
    let used: Vec<_> = blk.into_iter().filter(|b| b.0 > 0).collect();
    s.blocks = used.len();
    s.block_len = chunk.min(row_len);
    let nf = n as f64;
    let rms_a = (saa / nf).sqrt();
    // Shift: m = Σe / n, cluster-robust variance K/(K−1) · Σ_k (S_k − m·n_k)² / n².
    let m = se / nf;
    let k = s.blocks as f64;
    let corr_k = if s.blocks > 1 { k / (k - 1.0) } else { 0.0 };
    let var_m = corr_k * used.iter().map(|b| (b.1 - m * b.0 as f64).powi(2)).sum::<f64>() / (nf * nf);
    s.shift = if rms_a > 0.0 { m / rms_a } else { 0.0 };
    s.shift_z = z_of(m, var_m, s.blocks);
    // Scale: g = Σe·a / Σa², variance K/(K−1) · Σ_k (N_k − g·D_k)² / (Σa²)².
    if saa > 0.0 {
        let g = sea / saa;
        let var_g = corr_k * used.iter().map(|b| (b.2 - g * b.3).powi(2)).sum::<f64>() / (saa * saa);
        s.scale = g;
        s.scale_z = z_of(g, var_g, s.blocks);
    }
    let cov = sea / nf - (se / nf) * (sa / nf);
    let (var_e, var_a) = (see / nf - (se / nf).powi(2), saa / nf - (sa / nf).powi(2));
    s.corr = if var_e > 0.0 && var_a > 0.0 { (cov / (var_e * var_a).sqrt()).clamp(-1.0, 1.0) } else { 0.0 };
    s.rel_rms = if saa > 0.0 { (see / saa).sqrt() } else if see > 0.0 { f64::INFINITY } else { 0.0 };
    s.snr_db = snr_db(saa, see);
    s.cosine = if saa > 0.0 && sbb > 0.0 { sab / (saa * sbb).sqrt() } else if saa == 0.0 && sbb == 0.0 { 1.0 } else { 0.0 };
    s
}

/// `10·log10(signal / noise)`: infinite without noise, −infinite without signal.
pub fn snr_db(signal: f64, noise: f64) -> f64 {
    if noise <= 0.0 {
        f64::INFINITY
    } else if signal <= 0.0 {
        f64::NEG_INFINITY
    } else {
        10.0 * (signal / noise).log10()
    }
}

fn z_of(est: f64, var: f64, blocks: usize) -> f64 {
    if blocks < 2 || est == 0.0 {
        0.0
    } else if var <= 0.0 {
        // Every block moved exactly alike: as systematic as it gets.
        est.signum() * f64::INFINITY
    } else {
        est / var.sqrt()
    }
}

/// The bias gate for one dtype: significance and the smallest effect that matters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BiasGate {
    pub p_max: f64,
    pub min_blocks: usize,
    /// Smallest |shift| (in A's RMS) or |scale| that counts.
    pub floor: f64,
}

/// Unit roundoff (half an ulp at 1) of a float dtype; None for integers.
pub fn unit_roundoff(d: DType) -> Option<f64> {
    let mantissa = match d {
        DType::Bf16 => 7,
        DType::F16 => 10,
        DType::F32 => 23,
        DType::F64 => 52,
        DType::F8e4m3 => 3,
        DType::F8e5m2 => 2,
        _ => return None,
    };
    Some(2f64.powi(-(mantissa + 1)))
}

impl BiasGate {
    /// The calibrated gate (module docs): p < 1e-6 over ≥ 8 blocks, effect > max(2u², 2^-17).
    /// None for dtypes that are not floats.
    pub fn for_dtype(d: DType) -> Option<BiasGate> {
        let u = unit_roundoff(d)?;
        Some(BiasGate { p_max: P_MAX, min_blocks: MIN_BLOCKS, floor: (2.0 * u * u).max(2f64.powi(-17)) })
    }

    /// Why `s` is biased (the statistic, its value and the threshold it passes), or None.
    pub fn judge(&self, s: &ErrorStats) -> Option<String> {
        if s.blocks < self.min_blocks {
            return None;
        }
        let (p_shift, p_scale) = s.p_values();
        let mut why = Vec::new();
        if p_scale < self.p_max && s.scale.abs() > self.floor {
            let dir = if s.scale < 0.0 { "shrinks" } else { "grows" };
            why.push(format!(
                "scale bias: B ≈ (1 {} {:.2e})·A — every block's error follows A's values ({dir} them; corr {:+.2}); z {:+.1} over {} blocks (p {}), beyond |scale| > {:.2e} with p < {:.0e}",
                if s.scale < 0.0 { "−" } else { "+" },
                s.scale.abs(),
                s.corr,
                s.scale_z,
                s.blocks,
                fmt_p(p_scale),
                self.floor,
                self.p_max
            ));
        }
        if p_shift < self.p_max && s.shift.abs() > self.floor {
            why.push(format!(
                "shift bias: mean error {:+.2e} of A's RMS, one-sided; z {:+.1} over {} blocks (p {}), beyond |shift| > {:.2e} with p < {:.0e}",
                s.shift,
                s.shift_z,
                s.blocks,
                fmt_p(p_shift),
                self.floor,
                self.p_max
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

fn fmt_p(p: f64) -> String {
    if p < 1e-300 {
        "< 1e-300".into()
    } else {
        format!("{p:.1e}")
    }
}

// ------------------------------------------------------------------------------ Student's t

/// Two-sided p-value of `t` under Student's t with `df` degrees of freedom:
/// `I_{df/(df+t²)}(df/2, 1/2)`.
pub fn t_two_sided_p(t: f64, df: f64) -> f64 {
    if t.is_nan() || df <= 0.0 {
        return 1.0;
    }
    if t.is_infinite() {
        return 0.0;
    }
    let x = df / (df + t * t);
    reg_inc_beta(0.5 * df, 0.5, x).clamp(0.0, 1.0)
}

fn ln_gamma(x: f64) -> f64 {
    // Lanczos (g = 7, n = 9), accurate to ~1e-15 for x > 0.
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized incomplete beta `I_x(a, b)` by its continued fraction (modified Lentz).
fn reg_inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - reg_inc_beta(b, a, 1.0 - x);
    }
    const TINY: f64 = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..500 {
        let m = m as f64;
        let aa = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        for (num, first) in [(aa, true), (-(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)), false)] {
            d = 1.0 + num * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + num / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if !first && (del - 1.0).abs() < 1e-15 {
                return (ln_front.exp() * h / a).min(1.0);
            }
        }
    }
    (ln_front.exp() * h / a).min(1.0)
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
