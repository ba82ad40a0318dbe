//! `kern bench`: decode and prefill benchmarks through the engine `kern serve` runs. Decode: B
//! requests with C-token prompts decode together; the full-batch decode steps after a warm-up
//! are timed (GPU time by CUDA events) and set against the step's memory floor — the weights
//! plus every row's KV, over the device copy bandwidth measured in the same run. Prefill: one
//! N-token prompt, timed over its prefill steps.

use anyhow::{anyhow, bail, Result};
use kern_engine::bench::{summarize, Summary};
use kern_engine::fake::{hash_rule, FakeModel};
use kern_engine::gpu::LoadOptions;
use kern_engine::{Engine, EngineConfig, Event, Model, ModelInfo, Request, StepRecord};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Benchmark decode (--batch, --context) or prefill (--prompt-tokens) steps of a model.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern bench --model DIR --batch 1 --context 128\n  kern bench --model DIR --batch 64 --context 256 --json\n  kern bench --model DIR --prompt-tokens 8192")]
pub struct Args {
    /// A packed model directory (default: the model scripts/setup.sh installed).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Sequences decoding together.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Prompt tokens of each sequence (its context when decoding starts).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Decode steps timed (after the warm-up).
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Decode steps run before timing (graph capture, caches).
    #[arg(long, default_value_t = 8)]
    warmup: usize,
    /// Speculative decoding (the report adds the acceptance).
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
    /// Benchmark the prefill of one prompt of this many tokens instead of decode.
    #[arg(long)]
    prompt_tokens: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Run decode steps eagerly (no CUDA graphs).
    #[arg(long)]
    no_graph: bool,
    /// Copy each step input with a blocking copy and wait for each run, as kern did before one
    /// pinned upload per step: measures what the host path saves.
    #[arg(long)]
    blocking_steps: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Benchmark the deterministic CPU model (tests the command; the numbers mean nothing).
    #[arg(long, hide = true)]
    fake: bool,
}

fn check_args(a: &Args) -> Result<()> {
    if a.batch == 0 || a.context == 0 || a.steps == 0 {
        bail!("--batch, --context and --steps must be at least 1");
    }
    if a.prompt_tokens == Some(0) {
        bail!("--prompt-tokens must be at least 1");
    }
    Ok(())
}

pub fn run(a: Args) -> Result<ExitCode> {
    check_args(&a)?;
    let spec = a.spec.config()?;
    let cfg = EngineConfig { record_steps: true, prefix_cache: false, spec, ..Default::default() };
    let (engine, name) = if a.fake {
        let info = ModelInfo { max_step_tokens: 8192, max_step_seqs: 256, pages_per_seq: 4096, page_tokens: 16, total_pages: 1 << 16, vocab: 1000, logits: false, gpu_sampling: true, per_seq_state: false, draft_k: None };
        let draft = a.spec.spec_draft;
        let e = Engine::start(cfg, None, move || {
            let mut m = FakeModel::new(info, hash_rule(1000));
            if draft {
                m = m.with_draft(hash_rule(1000), 4);
            }
            m.step_delay = Duration::from_micros(200);
            Ok(Box::new(m) as Box<dyn Model>)
        });
        (e, "fake".to_string())
    } else {
        let dir = crate::model_dir::prepare(a.model.as_deref())?;
        let opts = LoadOptions { device: a.device, gpu_mem: None, graphs: !a.no_graph, capture_at_start: !a.no_graph, devices: Vec::new(), blocking_steps: a.blocking_steps, ..Default::default() };
        let e = Engine::start(cfg, None, crate::generate::loader(dir.clone(), opts, Arc::new(Mutex::new(None))));
        (e, dir.display().to_string())
    };
    let info = engine.wait_ready().map_err(|e| anyhow!("{e}"))?.clone();
    let vocab = if info.model.vocab > 0 { info.model.vocab as u32 } else { 1000 };
    let prompt = |seed: u64, n: usize| -> Vec<u32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % vocab as u64) as u32
            })
            .collect()
    };
    let (kind, records, batch): (&str, Vec<StepRecord>, usize) = match a.prompt_tokens {
        Some(n) => {
            let mut h = engine.submit(Request { ignore_eos: true, ..Request::new(prompt(1, n), 1) }).map_err(|e| anyhow!("the prompt: {e}"))?;
            drain(&mut h)?;
            let recs: Vec<StepRecord> = engine.take_step_records().into_iter().filter(|r| !r.decode || r.tokens > 1 || n == 1).collect();
            ("prefill", recs, 1)
        }
        None => {
            if a.batch > info.max_seqs {
                bail!("--batch {} is above the model's {} sequences per step (pack it with a larger --max-seqs)", a.batch, info.max_seqs);
            }
            // With drafts a step generates up to k + 1 tokens per sequence: ask for enough. Twice
            // the steps needed, because the sequences may not start in the same step (a request
            // submitted while a step runs joins the next one) and only full-batch steps count.
            let per_step = match a.spec.config()? {
                Some(sp) if sp.k == 0 => info.model.draft_k.unwrap_or(16) + 1,
                Some(sp) => sp.k + 1,
                None => 1,
            };
            let max_tokens = (2 * (a.warmup + a.steps + 1) * per_step).min(info.limits.max_context.saturating_sub(a.context).max(1));
            let mut hs = Vec::new();
            for i in 0..a.batch {
                hs.push(engine.submit(Request { ignore_eos: true, ..Request::new(prompt(i as u64 + 1, a.context), max_tokens) }).map_err(|e| anyhow!("sequence {i}: {e}"))?);
            }
            for h in hs.iter_mut() {
                drain(h)?;
            }
            let full: Vec<StepRecord> = engine.take_step_records().into_iter().filter(|r| r.decode && r.seqs == a.batch).collect();
            ("decode", full.into_iter().skip(a.warmup).take(a.steps).collect(), a.batch)
        }
    };
    if records.is_empty() {
        bail!("no {kind} step was recorded");
    }
    let s = if kind == "prefill" {
        // The prefill as a whole: its steps' times add up.
        let total_ms: f64 = records.iter().map(|r| r.gpu_ms.map_or(r.wall_ms, |g| g as f64)).sum();
        let mut one = summarize(&records, 0, 0, None);
        one.median_ms = total_ms;
        one.p90_ms = total_ms;
        one.tokens_per_step = records.iter().map(|r| r.tokens as f64).sum();
        one.tok_per_s = one.tokens_per_step / total_ms * 1e3;
        one
    } else {
        summarize(&records, info.weight_bytes, info.state_bytes_per_token, info.copy_gbs)
    };
    let m = engine.metrics();
    let spec = a.spec.config()?.map(|_| (m.spec_draft_tokens.get(), m.spec_accepted.get(), m.spec_draft_steps.get()));
    report(&a, kind, batch, &name, &info, &s, spec);
    engine.drain();
    engine.join();
    Ok(ExitCode::SUCCESS)
}

fn drain(h: &mut kern_engine::RequestHandle) -> Result<()> {
    loop {
        match h.blocking_recv() {
            Some(Event::Output { .. }) => {}
            Some(Event::Finished { .. }) => return Ok(()),
            Some(Event::Failed(e)) => bail!("{e}"),
            None => bail!("the engine stopped"),
        }
    }
}

fn report(a: &Args, kind: &str, batch: usize, name: &str, info: &kern_engine::EngineInfo, s: &Summary, spec: Option<(u64, u64, u64)>) {
    let gb = |b: f64| b / 1e9;
    if a.json {
        let j = serde_json::json!({
            "model": name, "kind": kind, "batch": batch, "context": a.context, "prompt_tokens": a.prompt_tokens,
            "steps": s.steps, "timing": if s.gpu_timed { "gpu" } else { "wall" },
            "median_ms": s.median_ms, "p90_ms": s.p90_ms, "tokens_per_step": s.tokens_per_step, "tok_per_s": s.tok_per_s,
            "bytes_per_step": s.bytes_per_step, "weight_bytes": info.weight_bytes, "copy_gbs": info.copy_gbs,
            "floor_ms": s.floor_ms, "fraction_of_floor": s.fraction,
            "spec_draft_tokens": spec.map(|x| x.0), "spec_accepted_tokens": spec.map(|x| x.1), "spec_draft_steps": spec.map(|x| x.2),
        });
        println!("{j}");
        return;
    }
    let timing = if s.gpu_timed { "GPU time by CUDA events" } else { "host wall time" };
    match kind {
        "prefill" => {
            println!("kern bench: prefill of one {}-token prompt, {name}", a.prompt_tokens.unwrap_or(0));
            println!("  time      {:.2} ms over {} step(s) ({timing})", s.median_ms, s.steps);
            println!("  tok/s     {:.0}", s.tok_per_s);
        }
        _ => {
            println!("kern bench: decode, batch {batch}, context {} (+{} timed steps after {} warm-up), {name}", a.context, a.steps, a.warmup);
            println!("  step      median {:.3} ms   p90 {:.3} ms   ({} steps, {timing})", s.median_ms, s.p90_ms, s.steps);
            println!("  tok/s     {:.1}", s.tok_per_s);
            if let Some((drafted, accepted, _)) = spec {
                println!("  drafts    {accepted} of {drafted} accepted ({:.1}%), {:.2} tokens per sequence-step", if drafted > 0 { 100.0 * accepted as f64 / drafted as f64 } else { 0.0 }, s.tokens_per_step / batch as f64);
            }
            match (s.floor_ms, info.copy_gbs, s.fraction) {
                (Some(f), Some(g), Some(fr)) => {
                    println!("  floor     {f:.3} ms  ({:.2} GB weights + {:.3} GB KV per step at {g:.0} GB/s copy bandwidth)", gb(info.weight_bytes as f64), gb(s.bytes_per_step - info.weight_bytes as f64));
                    println!("  reached   {:.0}% of the floor", fr * 100.0);
                }
                _ => println!("  floor     unknown (no copy bandwidth measured on this model)"),
            }
        }
    }
}
