//! kern-difftest: `kern test a.json b.json` — does manifest B still compute the model manifest A
//! computes, where does it first go wrong, and is it faster?
//!
//! A kernel author changes a kernel (same interface, better implementation), fuses two
//! (A + B → C) or splits one (C → A + B), updates the cubin and the manifest, and runs
//! `kern test old.json new.json`. Both manifests are loaded onto one GPU (two runtimes in one
//! context, each loading its weights through its own weight sources from the same checkpoint),
//! and three diffs are made:
//!
//! 1. **Kernel diff** ([`gpu`]): every op whose name and signature both manifests declare is run
//!    alone, A's implementation and B's, on identical inputs drawn from several distributions
//!    ([`numeric::Dist`]: normal at three scales, uniform, outliers, zeros, near the dtype's
//!    max, near its smallest normal) at several step shapes (one token, an odd multi-sequence
//!    prefill, the largest step), and every output is compared with dtype-aware tolerances
//!    ([`numeric::compare`]: max abs, max rel, mismatch fraction, ULP distance, bit-exact
//!    share) and the bias statistics ([`stats`]: a one-sided error within the tolerance is a
//!    divergence too). Ops only one side has are listed and covered by the interval comparison.
//! 2. **Precision diff**: both programs run the same scheduled steps (a multi-sequence prefill,
//!    then decode steps, teacher-forced with A's greedy tokens). On the first prefill and the
//!    first decode step the programs advance interval by interval ([`matching`]): before each
//!    interval, B's inputs are set to A's values (golden inputs), so the comparison of its
//!    outputs measures *that interval's* error only; the first interval beyond tolerance or
//!    biased is the first divergence, named by its call labels on both sides. B is then also
//!    run forward from its own values and compared at every sync point (where it first leaves
//!    A, where it passes the tolerance, the carried error per interval). Every step's logits
//!    are compared (KL divergence, top-1 agreement, top-5 overlap, max abs difference) and its
//!    greedy tokens, judged against the noise floor of an honest change ([`noise`]: A run again
//!    with B's local errors, signs randomized).
//! 3. **Performance diff**: every interval pair timed on both sides (CUDA events, warm-up,
//!    median of many runs, L2 flushed before each, A and B interleaved), summed per op, and
//!    the whole step; slower / faster beyond a threshold with disjoint interquartile ranges are
//!    flagged. Each row has the bytes its calls move ([`traffic`]) and, for decode-shaped
//!    steps, the achieved bandwidth and each side's floor at the measured copy bandwidth.
//!
//! **Precision mode** ([`precision`], `--precision`) is for intentional precision changes:
//! nothing is judged per element; per interval and layer the local and carried error (relative
//! RMS, SNR), a plot ([`svg`]), and KL / top-1 / perplexity on a text, judged by gates.
//!
//! The [`report::Report`] puts the first divergence on top; `--json` prints it as JSON. Exit
//! codes: 0 equal within tolerance and unbiased (precision mode: within every gate), 1 a kernel
//! or precision diff fails (beyond a gate), 2 not comparable.
//!
//! # Sync points: the matching rule
//!
//! Only buffers take part; each call's read and write sets come from its op's typed
//! parameters (`in` read, `out` written, `inout` both; a buffer bound to an untyped `ptr` is
//! read if it is a weight or input, else read and written). States (the KV cache) are not sync
//! points — their layout belongs to the kernels — but both sides start each compared step from
//! A's state contents, so a wrong state write shows up at the first interval that reads it.
//!
//! 1. **Common buffers**: a buffer both manifests declare with the same name, dtype, shape (as
//!    written) and role — for weights also the same source. Only common buffers are compared.
//! 2. **Versions**: the k-th write of a buffer creates its version k (version 0 is its content
//!    before the program). A version is *observed* if a later call reads it or it is the last
//!    one. A common buffer's observed versions are paired in order, A's i-th with B's i-th;
//!    when their numbers differ (an in-place chain of different length whose intermediate
//!    values are read) only the last versions are paired and the buffer is reported.
//! 3. **Components**: a graph over the calls of both programs links the A-writer and the
//!    B-writer of every paired version, and, within one program, the writer of every unpaired
//!    version with all its readers (a value only one side has can never be compared, so its
//!    producer and consumers must stay in one interval). Connected components with calls on
//!    both sides are intervals.
//! 4. **Monotone and contiguous**: components are taken as index ranges and merged while two
//!    overlap on either side or their order differs between A and B (reordered independent
//!    calls). Calls that belong to no two-sided component (dead writes, one-sided scratch)
//!    join the next interval; trailing ones the last. The result is an ordered list of
//!    interval pairs `(A[i..j], B[k..l])` that cover both programs.
//! 5. **Sync point** after each pair: the common buffers written inside whose current versions
//!    are paired are its outputs (compared there); the common buffers B reads at the interval's
//!    entry whose entry versions are paired are its inputs (copied from A for the local
//!    comparison).
//!
//! So a kernel swapped for another with the same interface gives 1:1 intervals; a fusion
//! `A: add, norm` → `B: add_norm` shows up as one 2:1 interval (the residual and the normalized
//! output are written inside and paired); a split is the mirror image, 1:2. Two programs with
//! no paired version cannot be compared (exit 2), never paired by position.

pub mod gpu;
pub mod matching;
pub mod numeric;
pub mod pairing;
pub mod noise;
pub mod precision;
mod render;
pub mod report;
pub mod stats;
pub mod svg;
pub mod traffic;

pub use gpu::{run, Options, PrecisionOptions};
pub use pairing::{analyze, Analysis, Incomparable};
pub use render::{error_line, stats_line};
pub use report::{Report, Verdict};

/// The manifest-only part of `kern test` (no GPU): loads both manifests for `arch`, pairs the
/// ops and matches the programs. Loading or matching errors give an incomparable report.
pub fn match_only(a: &std::path::Path, b: &std::path::Path, arch: kern_manifest::Arch) -> Report {
    let (an, bn) = (a.display().to_string(), b.display().to_string());
    let load = |p: &std::path::Path| {
        kern_manifest::load(p, &kern_manifest::CheckOptions { arch, ..Default::default() })
            .map_err(|d| format!("{}: the manifest does not check ({} error(s); `kern check {}` lists them):\n{d}", p.display(), d.error_count(), p.display()))
    };
    let (ma, mb) = match (load(a), load(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return Report::incomparable(&an, &bn, e),
    };
    match pairing::analyze(&ma, &mb) {
        Ok(analysis) => {
            let mut r = Report::new(&an, &bn);
            gpu::describe(&mut r, &analysis);
            r.ops = analysis
                .ops
                .iter()
                .map(|o| report::OpDiff { op: o.name.clone(), same_impl: o.same_impl, a_call: String::new(), b_call: String::new(), checks: 0, failures: 0, first_failure: None, worst: None, skipped: Some("--match-only: not run".into()) })
                .collect();
            r.match_only = true;
            r.finish();
            r
        }
        Err(e) => Report::incomparable(&an, &bn, e.0),
    }
}
