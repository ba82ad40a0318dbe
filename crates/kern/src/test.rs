//! `kern test a.json b.json`: kernel, precision and performance diff between two manifests of
//! one model (crate `kern-difftest`). Exit 0 equal within tolerance and unbiased, 1 a kernel or
//! precision diff fails, 2 the manifests cannot be compared (the reason is printed). With
//! `--precision` (an intentional precision change): exit 0 within the budget's gates, 1 beyond
//! one.

use anyhow::Result;
use kern_binary::Arch;
use std::path::PathBuf;
use std::process::ExitCode;

/// Diff two manifests of one model: every shared op on identical inputs, the programs interval
/// by interval (stops at the first call that diverges), logits and greedy tokens, and timings.
#[derive(clap::Args)]
#[command(after_help = "Exit status: 0 equal within tolerance and unbiased (with --precision: within every gate), 1 a kernel or precision diff fails (beyond a gate), 2 not comparable.\n\nExamples:\n  kern test model.json model.new.json --weights /path/to/checkpoint\n  kern test a.json b.json --json > diff.json\n  kern test a.json b.json --match-only      # no GPU: which intervals pair up\n  kern test bf16.json fp8.json --precision --text wiki.txt --json-out diff.json   # plot: diff.layers.svg")]
pub struct Args {
    /// The reference manifest (A).
    a: PathBuf,
    /// The manifest under test (B).
    b: PathBuf,
    /// Checkpoint both manifests load their weights from (default: A's directory).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// A var's value, VAR=N (manifests without a step ABI; for step manifests a cap). Repeatable.
    #[arg(long = "set", value_name = "VAR=N")]
    sets: Vec<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file (the text report is printed).
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Only load, pair and match the manifests (no GPU needed).
    #[arg(long)]
    match_only: bool,
    /// Architecture whose images are checked with --match-only (the GPU's otherwise).
    #[arg(long, default_value = "sm_90", value_parser = crate::inspect::parse_arch)]
    arch: Arch,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Seed of every generated input (printed in the report).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decode steps after the prefill.
    #[arg(long, default_value_t = 8)]
    decode_steps: usize,
    /// Skip the kernel diff.
    #[arg(long)]
    no_kernel_diff: bool,
    /// Skip the performance diff.
    #[arg(long)]
    no_perf: bool,
    /// Timed runs per interval and side.
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Performance regression threshold, percent.
    #[arg(long, default_value_t = 5.0)]
    perf_threshold: f64,
    /// Largest mean KL divergence of the logits that passes.
    #[arg(long, default_value_t = 1e-2)]
    kl_mean: f64,
    /// Skip the noise-floor run (A again with B's local errors, signs randomized) that the
    /// logits and greedy tokens are judged against.
    #[arg(long)]
    no_noise_floor: bool,
    /// Precision mode: B is an intentional precision change (FP8, GGUF blocks, FP8 KV); no
    /// per-element verdict, per-layer SNR and error growth, KL / top-1 / perplexity on a text.
    #[arg(long)]
    precision: bool,
    /// --precision: largest mean KL(A‖B) over the text's positions.
    #[arg(long, default_value_t = 1e-2, requires = "precision")]
    max_kld: f64,
    /// --precision: smallest top-1 agreement, percent.
    #[arg(long, default_value_t = 90.0, requires = "precision")]
    min_top1: f64,
    /// --precision: largest perplexity increase of B over A, percent.
    #[arg(long, default_value_t = 2.0, requires = "precision")]
    max_ppl_increase: f64,
    /// --precision: a text file to score, tokenized by the tokenizer.json next to the weights.
    #[arg(long, value_name = "FILE", requires = "precision", conflicts_with = "tokens")]
    text: Option<PathBuf>,
    /// --precision: token ids to score (integers separated by spaces, newlines or commas).
    #[arg(long, value_name = "FILE", requires = "precision")]
    tokens: Option<PathBuf>,
    /// --precision: tokens per window (the first half is context, the second half scored).
    #[arg(long, default_value_t = 256, requires = "precision")]
    window: usize,
    /// --precision: at most this many windows (sequences side by side).
    #[arg(long, default_value_t = 8, requires = "precision")]
    windows: usize,
    /// --precision: where the SVG plot of the error through the layers goes (default: beside
    /// --json-out as NAME.layers.svg, else ./kern-test.layers.svg).
    #[arg(long, value_name = "FILE", requires = "precision")]
    plot: Option<PathBuf>,
}

/// The plot's default path: beside the JSON report, else in the working directory.
fn plot_path(args: &Args) -> PathBuf {
    if let Some(p) = &args.plot {
        return p.clone();
    }
    match &args.json_out {
        Some(j) => j.with_extension("layers.svg"),
        None => PathBuf::from("kern-test.layers.svg"),
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let (an, bn) = (args.a.display().to_string(), args.b.display().to_string());
    let mut sets = Vec::new();
    let mut bad = None;
    for s in &args.sets {
        match s.split_once('=').and_then(|(k, v)| v.trim().parse::<i64>().ok().map(|v| (k.trim().to_string(), v))) {
            Some(kv) => sets.push(kv),
            None => bad = Some(format!("--set {s}: write VAR=N with an integer N")),
        }
    }
    let report = if let Some(reason) = bad {
        kern_difftest::Report::incomparable(&an, &bn, reason)
    } else if args.match_only {
        kern_difftest::match_only(&args.a, &args.b, args.arch)
    } else {
        let opts = kern_difftest::Options {
            a: args.a.clone(),
            b: args.b.clone(),
            weights: args.weights.clone(),
            sets,
            device: args.device,
            seed: args.seed,
            decode_steps: args.decode_steps,
            kernel_diff: !args.no_kernel_diff,
            perf: !args.no_perf,
            perf_reps: args.reps,
            perf_threshold: args.perf_threshold / 100.0,
            kl_mean_max: args.kl_mean,
            noise_floor: !args.no_noise_floor,
            precision: args.precision.then(|| kern_difftest::PrecisionOptions {
                gates: kern_difftest::precision::Gates { max_kld: args.max_kld, min_top1: args.min_top1 / 100.0, max_ppl_increase: args.max_ppl_increase / 100.0 },
                text: args.text.clone(),
                tokens: args.tokens.clone(),
                window: args.window,
                max_windows: args.windows,
                plot: Some(plot_path(&args)),
            }),
        };
        kern_difftest::run(&opts)
    };
    if let Some(p) = &args.json_out {
        if let Err(e) = std::fs::write(p, report.to_json() + "\n") {
            eprintln!("error: --json-out {}: {e}", p.display());
            return Ok(ExitCode::from(2));
        }
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    if let (kern_difftest::Verdict::Incomparable, Some(r)) = (report.verdict, &report.reason) {
        eprintln!("error: the manifests cannot be compared: {}", r.lines().next().unwrap_or(""));
    }
    Ok(ExitCode::from(report.exit_code()))
}
