//! `kern generate --model DIR --prompt …`: load a packed model (manifest + kernels + weights +
//! tokenizer), run several prompts as one varlen batch — chunked prefill, then batched decode
//! replayed from CUDA graphs — and print (or stream) the text with load, prefill and decode
//! speeds. A thin client of the serving engine (`kern-engine`), the same loop `kern serve`
//! runs: this file only parses arguments, submits requests and prints.

use anyhow::{anyhow, bail, Context as _, Result};
use kern_engine::gpu::{GpuModel, LoadOptions};
use kern_engine::{Engine, EngineConfig, Event, FinishReason, Model, Request, Sampling};
use kern_runtime::plan::human;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Generate text with a packed model: several prompts in one batch, chunked prefill, CUDA-graph decode.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern generate --chat --prompt 'What is the capital of France?'   (the default model from scripts/setup.sh)\n  kern generate --model ~/models/Qwen3-4B --prompt 'The capital of France is' --max-tokens 32\n  kern generate --model DIR --prompt-ids 1,2,3 --prompt-ids 4,5 --temperature 0 --dump out/")]
pub struct Args {
    /// A model directory: model.json (from `kern pack`), its cubins, the weights, and
    /// tokenizer.json for text prompts; or a Hugging Face id in the local cache. Default: the
    /// model `scripts/setup.sh` installed.
    #[arg(long)]
    model: Option<PathBuf>,
    /// A text prompt (repeatable: all prompts run as one batch).
    #[arg(long = "prompt")]
    prompts: Vec<String>,
    /// A prompt as comma-separated token ids (repeatable).
    #[arg(long = "prompt-ids", value_name = "IDS")]
    prompt_ids: Vec<String>,
    /// Wrap text prompts in the model's chat template (a user turn, then the assistant's; ChatML
    /// when the tokenizer has no template).
    #[arg(long)]
    chat: bool,
    /// New tokens per prompt at most.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p (1: off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens less likely than min-p × the most likely one (0: off; sampled on the host).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Sampling seed (prompt i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Prefill chunk: most new tokens per step (default: the manifest's `tokens` max).
    #[arg(long)]
    chunk: Option<usize>,
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
    /// Do not reuse the KV pages of prompt prefixes the prompts share.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Snapshot slots of a per-sequence state that declares `snapshot` (a hybrid's recurrent
    /// state): how many prefix-cache snapshots it keeps, each one copy of the state (default: 1/8
    /// of the memory left for states; 0: none, and the prefix cache stays off for such a model;
    /// docs/kv-cache.md).
    #[arg(long, value_name = "N")]
    snapshot_slots: Option<u64>,
    /// Run decode steps eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    no_graph: bool,
    /// Write tokens.json and each sequence's per-step last-position logits (seqN.logits.npy).
    #[arg(long)]
    dump: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// The GPUs of a tensor-parallel model, one per rank (default: --device and the next ones).
    #[arg(long, value_delimiter = ',', value_name = "0,1,…")]
    devices: Vec<usize>,
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',').map(|t| t.trim().parse::<u32>().map_err(|_| anyhow!("--prompt-ids {s}: `{t}` is not a token id"))).collect()
}

/// Loads the model for the engine, with a progress bar for the weights; the load report
/// goes to `report`.
pub fn loader(dir: PathBuf, opts: LoadOptions, report: Arc<Mutex<Option<kern_engine::gpu::LoadReport>>>) -> impl FnOnce() -> Result<Box<dyn Model>, kern_engine::ModelError> + Send + 'static {
    move || {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(indicatif::ProgressStyle::with_template("loading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
        let m = GpuModel::load(&dir, &opts, |d, t| {
            bar.set_length(t);
            bar.set_position(d);
        });
        bar.finish_and_clear();
        let m = m?;
        *report.lock().unwrap_or_else(|p| p.into_inner()) = Some(m.report.clone());
        Ok(Box::new(m) as Box<dyn Model>)
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let t0 = Instant::now();
    let dir = &crate::model_dir::prepare(args.model.as_deref())?;
    if !dir.join("model.json").exists() {
        bail!("{}: no model.json: run `kern pack --config {}/config.json -o {}` first", dir.display(), dir.display(), dir.display());
    }
    if args.prompts.is_empty() && args.prompt_ids.is_empty() {
        bail!("give at least one --prompt TEXT or --prompt-ids 1,2,3");
    }
    let tokenizer = if dir.join("tokenizer.json").exists() {
        Some(Arc::new(kern_tokenizer::Tokenizer::from_dir(dir)?))
    } else if !args.prompts.is_empty() {
        bail!("{}: no tokenizer.json, so text prompts cannot be encoded: copy the model's tokenizer.json (and tokenizer_config.json) there, or give --prompt-ids", dir.display());
    } else {
        None
    };
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    // --chat: the model's own chat template (as `kern serve` renders it), else ChatML.
    let template = match (args.chat, tokenizer.as_ref().and_then(|t| t.chat_template_renderer())) {
        (true, Some(Ok(t))) => Some(t),
        (true, Some(Err(e))) => bail!("the model's chat template does not compile: {e}"),
        _ => None,
    };
    for p in &args.prompts {
        let tok = tokenizer.as_ref().expect("checked above");
        let text = match (&template, args.chat) {
            (Some(t), _) => t.render(&serde_json::json!([{"role": "user", "content": p}]), None, true, None).map_err(|e| anyhow!("--prompt {p:?}: the chat template refused it: {e}"))?,
            (None, true) => kern_tokenizer::chatml(&[("user", p.as_str())]),
            (None, false) => p.clone(),
        };
        prompts.push(tok.encode(&text, false)?);
    }
    for p in &args.prompt_ids {
        prompts.push(parse_ids(p)?);
    }

    let report = Arc::new(Mutex::new(None));
    let opts = LoadOptions { device: args.device, gpu_mem: None, graphs: !args.no_graph, capture_at_start: false, devices: args.devices.clone(), blocking_steps: false, snapshots: snapshots(args.snapshot_slots) };
    let cfg = EngineConfig {
        max_batched_tokens: args.chunk,
        eos: tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default(),
        prefix_cache: !args.no_prefix_cache,
        spec: args.spec.config()?,
        ..Default::default()
    };
    let engine = Engine::start(cfg, tokenizer.clone(), loader(dir.clone(), opts, report.clone()));
    engine.wait_ready().map_err(|e| anyhow!("{e}"))?;
    let load_secs = t0.elapsed().as_secs_f64();
    if let Some(r) = report.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
        eprintln!(
            "loaded {} in {load_secs:.2} s: {} of weights, KV pool {} pages × {} tokens = {} tokens, on {}",
            dir.display(),
            human(r.weight_bytes),
            r.pages,
            r.page_tokens,
            r.pages * r.page_tokens,
            r.device_name
        );
    }

    // --dump writes logits when the model has them (tokens.json either way).
    let want_logits = args.dump.is_some() && engine.info().is_some_and(|i| i.model.logits);
    let mut handles = Vec::new();
    for (i, pr) in prompts.iter().enumerate() {
        let req = Request {
            sampling: Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p, seed: Some(args.seed.wrapping_add(i as u64)) },
            ignore_eos: args.ignore_eos,
            return_logits: want_logits,
            ..Request::new(pr.clone(), args.max_tokens)
        };
        handles.push(engine.submit(req).map_err(|e| anyhow!("prompt {i}: {e}"))?);
    }
    let stream_one = prompts.len() == 1 && tokenizer.is_some() && !args.prompts.is_empty();
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut finish: Vec<Option<FinishReason>> = vec![None; prompts.len()];
    let mut cached = 0usize;
    let mut text: Vec<String> = vec![String::new(); prompts.len()];
    for (i, h) in handles.iter_mut().enumerate() {
        loop {
            match h.blocking_recv() {
                Some(Event::Output { text: t, tokens, logits: l, .. }) => {
                    outputs[i].extend(tokens);
                    logits[i].extend(l);
                    if stream_one {
                        print!("{t}");
                        let _ = std::io::stdout().flush();
                    }
                    text[i].push_str(&t);
                }
                Some(Event::Finished { reason, cached_tokens, .. }) => {
                    finish[i] = Some(reason);
                    cached += cached_tokens;
                    break;
                }
                Some(Event::Failed(e)) => bail!("prompt {i}: {e}"),
                None => bail!("prompt {i}: the engine stopped: {}", engine.failure().unwrap_or_default()),
            }
        }
    }
    if stream_one {
        println!();
    } else {
        for (i, out) in outputs.iter().enumerate() {
            let shown = match &tokenizer {
                Some(_) => format!("{:?}", text[i]),
                None => format!("{out:?}"),
            };
            println!("[{i}] {} prompt tokens → {} new ({}): {shown}", prompts[i].len(), out.len(), finish[i].map_or("running", |f| f.as_str()));
        }
    }
    let ph = engine.phases();
    let rate = |p: &kern_engine::Phase| if p.secs > 0.0 { p.tokens as f64 / p.secs } else { 0.0 };
    eprintln!(
        "load {load_secs:.2} s | prefix cache {cached} of {} prompt tokens | prefill {} tokens in {} steps, {:.0} tok/s | decode {} tokens in {} steps, {:.1} tok/s ({:.2} ms/step){}",
        prompts.iter().map(Vec::len).sum::<usize>(),
        ph.prefill.tokens,
        ph.prefill.steps,
        rate(&ph.prefill),
        ph.decode.tokens,
        ph.decode.steps,
        rate(&ph.decode),
        if ph.decode.steps > 0 { ph.decode.secs * 1000.0 / ph.decode.steps as f64 } else { 0.0 },
        if args.no_graph { ", eager" } else { ", CUDA graphs" }
    );
    if let Some(sp) = engine.info().and_then(|i| i.spec.clone()) {
        let m = engine.metrics();
        let (drafted, accepted) = (m.spec_draft_tokens.get(), m.spec_accepted.get());
        let steps = m.spec_draft_steps.get();
        eprintln!(
            "speculative ({}): {accepted} of {drafted} draft tokens accepted ({:.1}%) in {} sequence verifications{}",
            crate::spec::SpecArgs::describe(&sp),
            if drafted > 0 { 100.0 * accepted as f64 / drafted as f64 } else { 0.0 },
            m.spec_drafts.get(),
            if steps > 0 { format!(", {steps} draft-program steps") } else { String::new() }
        );
    }
    let vocab = engine.info().map_or(0, |i| i.model.vocab);
    if let Some(d) = &args.dump {
        write_dump(d, &prompts, &outputs, &logits, vocab)?;
    }
    engine.drain();
    engine.join();
    Ok(ExitCode::SUCCESS)
}

fn write_dump(dir: &Path, prompts: &[Vec<u32>], outputs: &[Vec<u32>], logits: &[Vec<f32>], vocab: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let j = serde_json::json!({"prompts": prompts, "outputs": outputs});
    std::fs::write(dir.join("tokens.json"), serde_json::to_string(&j)?)?;
    for (i, l) in logits.iter().enumerate() {
        if vocab == 0 || l.is_empty() {
            continue;
        }
        let bytes: Vec<u8> = l.iter().flat_map(|x| x.to_le_bytes()).collect();
        kern_runtime::npy::write(&dir.join(format!("seq{i}.logits.npy")), &bytes, kern_manifest::DType::F32, &[(l.len() / vocab) as u64, vocab as u64], false)?;
    }
    eprintln!("wrote {}", dir.display());
    Ok(())
}

/// `--snapshot-slots`: the count given, or the plan's default.
pub fn snapshots(n: Option<u64>) -> kern_runtime::plan::Snapshots {
    n.map_or(kern_runtime::plan::Snapshots::Auto, kern_runtime::plan::Snapshots::Slots)
}
