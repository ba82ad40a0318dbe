//! What `kern test` is asked to do: the options of the GPU run and of precision mode.

use std::path::PathBuf;

/// What `kern test` is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    pub a: PathBuf,
    pub b: PathBuf,
    /// The checkpoint both load their weights from (default: A's directory).
    pub weights: Option<PathBuf>,
    /// `VAR=N` values for manifests without a step ABI, and caps for those with one.
    pub sets: Vec<(String, i64)>,
    pub device: usize,
    pub seed: u64,
    /// Decode steps after the prefill.
    pub decode_steps: usize,
    pub kernel_diff: bool,
    pub perf: bool,
    pub perf_reps: usize,
    /// Relative threshold for performance regressions (0.05 = 5 %).
    pub perf_threshold: f64,
    /// Gate on the mean KL divergence of the logits.
    pub kl_mean_max: f64,
    /// Measure the noise floor of an honest change (A′, [`crate::noise`]) and judge the
    /// logits and greedy tokens against it (equal mode only).
    pub noise_floor: bool,
    /// Precision mode (`--precision`): an intentional change, judged by its budget.
    pub precision: Option<PrecisionOptions>,
}

/// What precision mode is asked to do.
#[derive(Clone, Debug)]
pub struct PrecisionOptions {
    pub gates: crate::precision::Gates,
    /// A text file tokenized by the checkpoint's tokenizer (`--text`), or token ids (`--tokens`).
    pub text: Option<PathBuf>,
    pub tokens: Option<PathBuf>,
    /// Tokens per window (the first half is context, the second half is scored) and at most
    /// how many windows.
    pub window: usize,
    pub max_windows: usize,
    /// Where the SVG plot goes.
    pub plot: Option<PathBuf>,
}

impl Default for PrecisionOptions {
    fn default() -> Self {
        PrecisionOptions { gates: Default::default(), text: None, tokens: None, window: 256, max_windows: 8, plot: None }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            a: PathBuf::new(),
            b: PathBuf::new(),
            weights: None,
            sets: vec![],
            device: 0,
            seed: 0,
            decode_steps: 8,
            kernel_diff: true,
            perf: true,
            perf_reps: 20,
            perf_threshold: 0.05,
            kl_mean_max: 1e-2,
            noise_floor: true,
            precision: None,
        }
    }
}
