//! Host-side math on a logits row: log-softmax for logprobs, and sampling with temperature,
//! top-k, top-p and min-p for requests the program cannot sample itself. The random stream of
//! a sampled token is (seed, position), as in the step ABI, so a preempted and recomputed
//! sequence draws the same tokens.

use crate::request::{Sampling, TokenLogprob};

/// log-softmax of `row` at `token` and the `top` most likely ids.
pub fn logprobs(row: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |x: f32| (x as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::new();
    if top > 0 {
        let mut idx: Vec<u32> = (0..row.len() as u32).collect();
        let k = top.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        best = idx.into_iter().map(|i| (i, lp(row[i as usize]))).collect();
    }
    TokenLogprob { token, logprob: row.get(token as usize).map_or(f32::NEG_INFINITY, |&x| lp(x)), top: best }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// [`sample`] restricted to the tokens `mask` allows (bit `t % 32` of word `t / 32`; None:
/// every token): a token the mask forbids is never chosen, greedy or sampled — the host's
/// version of a sampler that honours the step ABI's `token_mask`. The truncations (top-k,
/// top-p, min-p) apply to the allowed tokens, as they do when forbidden logits are -inf.
pub fn sample_masked(row: &[f32], mask: Option<&[u32]>, s: &Sampling, seed: u64, position: u64) -> u32 {
    let Some(mask) = mask else { return sample(row, s, seed, position) };
    let mut idx = Vec::new();
    for (w, &bits) in mask.iter().enumerate() {
        let mut b = bits;
        while b != 0 {
            let i = w * 32 + b.trailing_zeros() as usize;
            b &= b - 1;
            if i < row.len() {
                idx.push(i);
            }
        }
    }
    if idx.is_empty() {
        return sample(row, s, seed, position);
    }
    sample_among(row, idx, s, seed, position)
}

/// Samples from `row` with `s`'s truncations; `position` is the sampled token's position.
/// Greedy (temperature 0) is the argmax, lowest id on ties.
pub fn sample(row: &[f32], s: &Sampling, seed: u64, position: u64) -> u32 {
    sample_among(row, (0..row.len()).collect(), s, seed, position)
}

/// [`sample`] over the candidate ids `idx` (ascending) only.
fn sample_among(row: &[f32], mut idx: Vec<usize>, s: &Sampling, seed: u64, position: u64) -> u32 {
    let argmax = || idx.iter().fold((idx.first().copied().unwrap_or(0), f32::NEG_INFINITY), |b, &i| if row[i] > b.1 { (i, row[i]) } else { b }).0 as u32;
    if s.temperature <= 0.0 || idx.is_empty() {
        return argmax();
    }
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    if s.top_k > 0 {
        idx.truncate(s.top_k as usize);
    }
    let max = row[idx[0]];
    let mut p: Vec<f64> = idx.iter().map(|&i| (((row[i] - max) / s.temperature) as f64).exp()).collect();
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    if s.min_p > 0.0 {
        let cut = p[0] * s.min_p as f64;
        let keep = p.iter().take_while(|&&x| x >= cut).count().max(1);
        p.truncate(keep);
    }
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let keep = p.iter().take_while(|&&x| {
            let before = acc;
            acc += x;
            before < s.top_p as f64
        });
        let keep = keep.count().max(1);
        p.truncate(keep);
    }
    let total: f64 = p.iter().sum();
    let u = (splitmix(splitmix(seed) ^ position) >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut acc = 0.0;
    for (j, &x) in p.iter().enumerate() {
        acc += x;
        if u < acc {
            return idx[j] as u32;
        }
    }
    idx[p.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_sorted_alternatives() {
        let row = [1.0f32, 3.0, 2.0, 3.0];
        let lp = logprobs(&row, 2, 3);
        let z: f64 = row.iter().map(|&x| (x as f64).exp()).sum();
        assert!((lp.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2], "ties by id");
        assert!(logprobs(&row, 99, 0).logprob.is_infinite());
    }

    #[test]
    fn min_p_and_top_k_truncate_and_the_stream_is_per_position() {
        let row = [10.0f32, 9.9, 0.0, -5.0];
        let s = Sampling { temperature: 1.0, min_p: 0.5, ..Default::default() };
        for pos in 0..200 {
            assert!(sample(&row, &s, 7, pos) < 2, "min_p keeps only the two likely ids");
            assert_eq!(sample(&row, &s, 7, pos), sample(&row, &s, 7, pos), "same (seed, position), same token");
        }
        let seen: std::collections::HashSet<u32> = (0..200).map(|p| sample(&row, &s, 7, p)).collect();
        assert_eq!(seen.len(), 2, "both survivors are drawn");
        let k1 = Sampling { temperature: 1.0, top_k: 1, ..Default::default() };
        assert!((0..50).all(|p| sample(&row, &k1, 3, p) == 0));
        assert_eq!(sample(&row, &Sampling::default(), 0, 0), 0, "greedy");
    }

    #[test]
    fn a_mask_is_never_crossed() {
        let row = [10.0f32, 9.9, 0.0, -5.0, f32::NAN];
        let only = |bits: u32| [bits];
        assert_eq!(sample_masked(&row, Some(&only(0b0100)), &Sampling::default(), 0, 0), 2, "greedy among the allowed");
        assert_eq!(sample_masked(&row, Some(&only(0b1000)), &Sampling::default(), 0, 0), 3);
        let s = Sampling { temperature: 1.0, top_k: 2, ..Default::default() };
        for pos in 0..100 {
            let t = sample_masked(&row, Some(&only(0b1100)), &s, 9, pos);
            assert!(t == 2 || t == 3, "sampled {t}");
        }
        assert_eq!(sample_masked(&row, None, &Sampling::default(), 0, 0), sample(&row, &Sampling::default(), 0, 0));
    }
}
