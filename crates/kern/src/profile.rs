//! `kern profile --model DIR`: one step's GPU time per program call, summed per op and per
//! layer, with bytes and bandwidth, as a table, JSON, or a Chrome / Perfetto trace.

use anyhow::{anyhow, Context as _, Result};
use kern_engine::gpu::{GpuModel, LoadOptions};
use kern_engine::profile::{by_layer, by_op, chrome_trace, gbs};
use std::path::PathBuf;
use std::process::ExitCode;

/// Time every call of one decode (or prefill) step of a model, per op and per layer.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern profile --model DIR --batch 1 --context 128\n  kern profile --model DIR --batch 64 --context 256 --trace step.json   (open in ui.perfetto.dev)\n  kern profile --model DIR --prefill --context 2048")]
pub struct Args {
    /// A packed model directory (default: the model scripts/setup.sh installed).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sequences in the step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Prompt tokens per sequence (the decode step attends over them).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Profile the prefill step that computes the prompts instead of a decode step.
    #[arg(long)]
    prefill: bool,
    /// Write a Chrome / Perfetto trace of the step.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Rows of the per-op table.
    #[arg(long, default_value_t = 12)]
    top: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

pub fn run(a: Args) -> Result<ExitCode> {
    if a.batch == 0 || a.context == 0 {
        anyhow::bail!("--batch and --context must be at least 1");
    }
    let dir = crate::model_dir::prepare(a.model.as_deref())?;
    let opts = LoadOptions { device: a.device, gpu_mem: None, graphs: false, capture_at_start: false, devices: Vec::new(), blocking_steps: false, ..Default::default() };
    let mut model = GpuModel::load(&dir, &opts, |_, _| {}).map_err(|e| anyhow!("{e}"))?;
    let (what, calls) = model.profile(a.batch, a.context, a.prefill).map_err(|e| anyhow!("{e}"))?;
    let total: f64 = calls.iter().map(|c| c.ms).sum();
    if let Some(t) = &a.trace {
        std::fs::write(t, serde_json::to_string(&chrome_trace(&calls, &what))?).with_context(|| format!("writing {}", t.display()))?;
    }
    if a.json {
        let j = serde_json::json!({
            "step": what, "total_ms": total,
            "calls": calls.iter().map(|c| serde_json::json!({"label": c.label, "op": c.op, "ms": c.ms, "bytes": c.bytes})).collect::<Vec<_>>(),
            "ops": by_op(&calls).iter().map(|g| serde_json::json!({"op": g.key, "calls": g.calls, "ms": g.ms, "bytes": g.bytes})).collect::<Vec<_>>(),
            "layers": by_layer(&calls).iter().map(|g| serde_json::json!({"layer": g.key, "calls": g.calls, "ms": g.ms})).collect::<Vec<_>>(),
        });
        println!("{j}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("kern profile: {}, {what}: {:.3} ms over {} calls (each call timed alone, eager)", dir.display(), total, calls.len());
    println!("  {:<24} {:>6} {:>10} {:>6} {:>12} {:>9}", "op", "calls", "ms", "%", "bytes", "GB/s");
    for g in by_op(&calls).iter().take(a.top) {
        println!("  {:<24} {:>6} {:>10.3} {:>5.1}% {:>12} {:>9.0}", g.key, g.calls, g.ms, 100.0 * g.ms / total.max(1e-12), g.bytes, gbs(g.bytes, g.ms));
    }
    let layers = by_layer(&calls);
    let slowest: Vec<String> = layers.iter().take(5).map(|g| format!("{} {:.3} ms", g.key, g.ms)).collect();
    println!("  slowest layers: {}", slowest.join(", "));
    if let Some(t) = &a.trace {
        println!("  trace: {} (open in ui.perfetto.dev or chrome://tracing)", t.display());
    }
    Ok(ExitCode::SUCCESS)
}
