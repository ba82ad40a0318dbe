//! Benchmark arithmetic over recorded steps (`EngineConfig::record_steps`): medians and
//! percentiles of step times, and the memory floor of a step — the bytes it must read (weights
//! plus the KV of every row's context) over the copy bandwidth measured in the same run.

use crate::engine::StepRecord;

/// The `q` quantile (0..=1) of `sorted` (nearest rank); NaN for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// The time a step needs at least to read `bytes` at `gbs` GB/s, ms.
pub fn floor_ms(bytes: u64, gbs: f64) -> f64 {
    bytes as f64 / (gbs * 1e9) * 1e3
}

/// Step times of a benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub steps: usize,
    /// Whether the times are GPU times (CUDA events) or host wall times.
    pub gpu_timed: bool,
    pub median_ms: f64,
    pub p90_ms: f64,
    /// Tokens generated per step, mean (a decode step's sequences, more with accepted drafts).
    pub tokens_per_step: f64,
    pub tok_per_s: f64,
    /// Bytes read per step (weights + KV), mean.
    pub bytes_per_step: f64,
    /// The floor of the median step and the fraction of it reached (floor / median).
    pub floor_ms: Option<f64>,
    pub fraction: Option<f64>,
}

/// Summarizes `records` (already filtered to the steps that count).
pub fn summarize(records: &[StepRecord], weight_bytes: u64, state_bytes_per_token: u64, copy_gbs: Option<f64>) -> Summary {
    let gpu_timed = !records.is_empty() && records.iter().all(|r| r.gpu_ms.is_some());
    let mut ms: Vec<f64> = records.iter().map(|r| if gpu_timed { r.gpu_ms.unwrap_or(0.0) as f64 } else { r.wall_ms }).collect();
    ms.sort_by(f64::total_cmp);
    let n = records.len().max(1) as f64;
    let tokens_per_step = records.iter().map(|r| r.generated as f64).sum::<f64>() / n;
    let bytes_per_step = records.iter().map(|r| (weight_bytes + r.context as u64 * state_bytes_per_token) as f64).sum::<f64>() / n;
    let median_ms = percentile(&ms, 0.5);
    let floor = copy_gbs.filter(|&g| g > 0.0 && weight_bytes > 0).map(|g| floor_ms(bytes_per_step as u64, g));
    Summary {
        steps: records.len(),
        gpu_timed,
        median_ms,
        p90_ms: percentile(&ms, 0.9),
        tokens_per_step,
        tok_per_s: if median_ms > 0.0 { tokens_per_step / median_ms * 1e3 } else { f64::NAN },
        bytes_per_step,
        floor_ms: floor,
        fraction: floor.map(|f| f / median_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ms: f32, context: usize) -> StepRecord {
        StepRecord { decode: true, rows: 2, tokens: 2, seqs: 2, generated: 2, context, wall_ms: 99.0, gpu_ms: Some(ms), draft_steps: 0 }
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.9), 9.0);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile(&[3.0], 0.9), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn the_floor_is_weights_plus_kv_over_bandwidth() {
        // 8 GB of weights + 2 rows × 1000 tokens × 1 MB at 4000 GB/s: 10 GB → 2.5 ms.
        let recs = [rec(5.0, 2000), rec(4.0, 2000), rec(6.0, 2000)];
        let s = summarize(&recs, 8_000_000_000, 1_000_000, Some(4000.0));
        assert!(s.gpu_timed);
        assert_eq!(s.median_ms, 5.0);
        assert_eq!(s.bytes_per_step, 10e9);
        assert!((s.floor_ms.unwrap() - 2.5).abs() < 1e-9);
        assert!((s.fraction.unwrap() - 0.5).abs() < 1e-9);
        assert!((s.tok_per_s - 400.0).abs() < 1e-9, "2 tokens per 5 ms");
        // Without a bandwidth (or without weights) there is no floor; wall time when a step
        // has no GPU time.
        let mut w = recs.to_vec();
        w[0].gpu_ms = None;
        let s = summarize(&w, 8_000_000_000, 1_000_000, None);
        assert!(!s.gpu_timed && s.floor_ms.is_none() && s.median_ms == 99.0);
    }
}
