//! `kern serve`: the OpenAI-compatible server. Parses flags, binds the port at once (so
//! `/health` answers 503 while the model loads), starts the engine (`kern-engine`) with the
//! model, and hands both to the HTTP layer (`kern-server`). SIGTERM / Ctrl-C drains: new
//! requests get 503, running ones finish, then the process exits 0. A failed engine (load
//! error, GPU fault) exits 1, so a supervisor restarts it.

use anyhow::{anyhow, bail, Context as _, Result};
use kern_engine::fake::{hash_rule, FakeModel};
use kern_engine::gpu::{GpuMem, LoadOptions};
use kern_engine::{Engine, EngineConfig, Model, ModelInfo};
use kern_server::{AppState, Outcome, SamplingDefaults, ServerConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern serve --model ~/models/Qwen3-4B --port 8000\n  kern serve --model DIR --api-key secret --served-model-name qwen3 --gpu-mem 0.9\n\nThen: curl localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n        -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 32}'")]
pub struct Args {
    /// A packed model directory (model.json, kernels, weights, tokenizer.json); default: the
    /// model `scripts/setup.sh` installed.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at startup).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize (default: the
    /// KERN_API_KEY environment variable, if set).
    #[arg(long)]
    api_key: Option<String>,
    /// The model name clients send and see (repeatable; default: the model directory's name).
    #[arg(long = "served-model-name")]
    served_model_name: Vec<String>,
    /// GPU memory kern may take: a fraction of the device (0.9) or a size (60GiB). Default: all free memory.
    #[arg(long, value_parser = parse_gpu_mem)]
    gpu_mem: Option<GpuMem>,
    /// Snapshot slots of a per-sequence state that declares `snapshot` (a hybrid's recurrent
    /// state): how many prefix-cache snapshots it keeps, each one copy of the state (default: 1/8
    /// of the memory left for states; 0: none, and the prefix cache stays off for such a model;
    /// docs/kv-cache.md).
    #[arg(long, value_name = "N")]
    snapshot_slots: Option<u64>,
    /// Serve only a model whose manifest declares `batch_invariant` (packed with `kern pack
    /// --batch-invariant`), so a greedy request's text does not depend on the requests beside it
    /// (docs/batch-invariance.md); refuse any other model at start.
    #[arg(long)]
    batch_invariant: bool,
    /// Most sequences running at once (default: the manifest's `seqs` max).
    #[arg(long)]
    max_seqs: Option<usize>,
    /// Most new tokens in one step (prefill chunk size; default: the manifest's `tokens` max).
    #[arg(long)]
    max_batched_tokens: Option<usize>,
    /// Most requests waiting for a place before new ones get 503.
    #[arg(long, default_value_t = 4096)]
    max_queue: usize,
    /// Most logprob alternatives per token a request may ask for.
    #[arg(long, default_value_t = 20)]
    max_logprobs: usize,
    #[command(flatten)]
    spec: crate::spec::SpecArgs,
    /// Do not reuse the KV pages of prompt prefixes computed before.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Pinned host memory for the prefix cache's second tier, GiB (0: off): cached KV pages are
    /// written through to it and come back by copy after the GPU evicts them.
    #[arg(long, default_value_t = 0.0)]
    offload_gib: f64,
    /// A Jinja chat template file, instead of the tokenizer's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// How tool calls are parsed from the output: `auto` (the format the chat template writes:
    /// `<tool_call>` JSON → hermes), `hermes`, or `none` (requests with tools other than
    /// `tool_choice: none` get 400).
    #[arg(long, default_value = "auto", value_name = "auto|hermes|none")]
    tool_call_parser: String,
    /// How a reasoning block is split off the output into `reasoning_content`: `auto` (when the
    /// chat template writes `<think>` blocks), `think`, or `none`.
    #[arg(long, default_value = "auto", value_name = "auto|think|none")]
    reasoning_parser: String,
    /// Threads computing constrained requests' token masks (0: one per core but one, at most 16).
    #[arg(long, default_value_t = 0)]
    mask_threads: usize,
    /// Seconds a request's grammar (JSON Schema, regex, Lark) may take to compile before the
    /// request is refused (400).
    #[arg(long, default_value_t = 10.0)]
    grammar_timeout: f64,
    /// Run every step eagerly (no CUDA graphs).
    #[arg(long)]
    no_graph: bool,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// The GPUs of a tensor-parallel model, one per rank (default: --device and the next ones).
    #[arg(long, value_delimiter = ',', value_name = "0,1,…")]
    devices: Vec<usize>,
    /// Serve a deterministic CPU model instead of a GPU one (for testing clients and kern itself).
    #[arg(long, hide = true)]
    fake: bool,
    /// With --fake: a directory with tokenizer.json.
    #[arg(long, hide = true)]
    fake_tokenizer: Option<PathBuf>,
    /// With --fake: KV pages (4 tokens each).
    #[arg(long, hide = true, default_value_t = 4096)]
    fake_pages: usize,
    /// With --fake: fail this step like a GPU fault.
    #[arg(long, hide = true)]
    fake_fail_at_step: Option<usize>,
    /// With --fake: milliseconds per step.
    #[arg(long, hide = true, default_value_t = 0)]
    fake_step_ms: u64,
}

fn parse_gpu_mem(s: &str) -> Result<GpuMem, String> {
    s.parse()
}

pub fn run(args: Args) -> Result<ExitCode> {
    let t0 = Instant::now();
    let (dir, tok_dir) = if args.fake {
        (PathBuf::from("fake"), args.fake_tokenizer.clone())
    } else {
        let d = crate::model_dir::prepare(args.model.as_deref())?;
        (d.clone(), Some(d))
    };
    if args.batch_invariant && !args.fake {
        let path = dir.join("model.json");
        let bytes = std::fs::read(&path).with_context(|| format!("--batch-invariant: cannot read {}", path.display()))?;
        let raw = kern_manifest::parse_raw(&bytes, &path.display().to_string()).map_err(|d| anyhow!("{d}"))?;
        if !raw.batch_invariant {
            bail!(
                "--batch-invariant: {} does not declare `batch_invariant`, so a row's bits may depend on the requests in its step; repack the model with `kern pack --batch-invariant` (docs/batch-invariance.md), or serve without --batch-invariant",
                path.display()
            );
        }
        eprintln!("kern serve: batch-invariant: the manifest declares it (docs/batch-invariance.md)");
    }
    let tokenizer = match &tok_dir {
        Some(d) if d.join("tokenizer.json").exists() => Some(Arc::new(kern_tokenizer::Tokenizer::from_dir(d)?)),
        Some(d) if !args.fake => {
            eprintln!("kern serve: {} has no tokenizer.json: only token-id prompts will work", d.display());
            None
        }
        _ => None,
    };
    let mut template_src = tokenizer.as_ref().and_then(|t| t.chat_template()).unwrap_or_default().to_string();
    let chat_template = match (&args.chat_template, &tokenizer) {
        (Some(p), tok) => {
            let src = std::fs::read_to_string(p).with_context(|| format!("--chat-template {}", p.display()))?;
            template_src = src.clone();
            let (bos, eos) = tok.as_ref().map_or((None, None), |t| (t.bos_id().and_then(|i| t.token(i)), t.eos_ids().first().and_then(|&i| t.token(i))));
            Some(kern_tokenizer::ChatTemplate::new(&src, bos, eos).map_err(|e| anyhow!("--chat-template {}: {e}", p.display()))?)
        }
        (None, Some(t)) => match t.chat_template_renderer() {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => bail!("the model's chat template does not compile: {e} (give a working one with --chat-template FILE)"),
            None => {
                eprintln!("kern serve: the tokenizer has no chat template: /v1/chat/completions will answer 400 (give one with --chat-template FILE)");
                None
            }
        },
        (None, None) => None,
    };
    let defaults = match tok_dir.as_ref().map(|d| d.join("generation_config.json")) {
        Some(p) if p.exists() => {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p)?).with_context(|| format!("{}", p.display()))?;
            SamplingDefaults::from_generation_config(&v)
        }
        _ => SamplingDefaults::default(),
    };
    let names = if args.served_model_name.is_empty() {
        // A Hugging Face id is served under that id (as vLLM does); a directory under its name.
        let id = args.model.as_deref().filter(|m| !m.exists()).and_then(crate::model_dir::hf_id).map(|(org, name)| format!("{org}/{name}"));
        vec![id.unwrap_or_else(|| dir.file_name().map_or_else(|| "kern".to_string(), |n| n.to_string_lossy().into_owned()))]
    } else {
        args.served_model_name.clone()
    };
    let api_key = args.api_key.clone().or_else(|| std::env::var("KERN_API_KEY").ok().filter(|k| !k.is_empty()));
    let cfg = EngineConfig {
        max_seqs: args.max_seqs,
        max_batched_tokens: args.max_batched_tokens,
        max_queue: args.max_queue,
        eos: tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default(),
        prefix_cache: !args.no_prefix_cache,
        spec: args.spec.config()?,
        offload_bytes: (args.offload_gib.max(0.0) * (1u64 << 30) as f64) as u64,
        record_steps: false,
        mask_threads: args.mask_threads,
        grammar_limits: kern_engine::constraint::GrammarLimits { timeout: Duration::from_secs_f64(args.grammar_timeout.max(0.1)), ..Default::default() },
    };
    let tool_format: Option<Arc<dyn kern_server::tools::ToolFormat>> = match args.tool_call_parser.as_str() {
        "auto" => kern_server::tools::detect(&template_src).map(Arc::from),
        "none" => None,
        name => Some(Arc::from(kern_server::tools::by_name(name).ok_or_else(|| anyhow!("--tool-call-parser {name}: kern knows auto, hermes and none"))?)),
    };
    let reasoning = match args.reasoning_parser.as_str() {
        "auto" => kern_server::reasoning::detect(&template_src),
        "think" => true,
        "none" => false,
        other => bail!("--reasoning-parser {other}: kern knows auto, think and none"),
    };
    if tool_format.is_some() || reasoning {
        eprintln!("kern serve: tool calls parsed as {}; reasoning blocks {}", tool_format.as_ref().map_or("(none)", |f| f.name()), if reasoning { "returned as reasoning_content" } else { "not split off" });
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!("kern serve: listening on http://{local} (model {} loading; /health answers 503 until ready)", names[0]);
        let report = Arc::new(Mutex::new(None));
        let engine = if args.fake {
            let vocab = tokenizer.as_ref().map_or(151_936, |t| t.vocab_size());
            let info = ModelInfo { max_step_tokens: 256, max_step_seqs: 64, pages_per_seq: 256, page_tokens: 4, total_pages: args.fake_pages, vocab, logits: true, gpu_sampling: true, per_seq_state: false, draft_k: None };
            let (fail, delay) = (args.fake_fail_at_step, Duration::from_millis(args.fake_step_ms));
            let draft = args.spec.spec_draft;
            // Its random walk through a grammar ends sooner when it prefers closing tokens.
            let preferred: Vec<u32> = tokenizer.as_ref().map_or_else(Vec::new, |t| ["\"", "}", "]"].iter().filter_map(|s| t.encode(s, false).ok().and_then(|v| v.first().copied())).chain(t.eos_ids().iter().copied()).collect());
            Engine::start(cfg, tokenizer.clone(), move || {
                let mut m = FakeModel::new(info, hash_rule(vocab)).with_preferred(preferred);
                if draft {
                    // The fake's own rule as its draft (always right, greedy).
                    m = m.with_draft(hash_rule(vocab), 4);
                }
                m.fail_at_step = fail;
                m.step_delay = delay;
                Ok(Box::new(m) as Box<dyn Model>)
            })
        } else {
            let opts = LoadOptions { device: args.device, gpu_mem: args.gpu_mem, graphs: !args.no_graph, capture_at_start: !args.no_graph, devices: args.devices.clone(), blocking_steps: false, snapshots: crate::generate::snapshots(args.snapshot_slots) };
            Engine::start(cfg, tokenizer.clone(), crate::generate::loader(dir.clone(), opts, report.clone()))
        };
        let state = AppState::new(engine.clone(), tokenizer, ServerConfig { served_model_names: names, api_key, max_logprobs: args.max_logprobs, defaults, chat_template, root: dir.display().to_string(), max_body_bytes: kern_server::DEFAULT_MAX_BODY_BYTES, tool_format, reasoning });
        // Log readiness (or the load failure) once.
        let watch_engine = engine.clone();
        tokio::spawn(async move {
            let mut st = watch_engine.subscribe();
            while *st.borrow_and_update() == kern_engine::State::Loading {
                if st.changed().await.is_err() {
                    return;
                }
            }
            if let Some(i) = watch_engine.info() {
                let r = report.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let what = r.map_or_else(String::new, |r| format!(": {} of weights on {}, KV pool {} pages × {} tokens", kern_runtime::plan::human(r.weight_bytes), r.device_name, r.pages, r.page_tokens));
                let spec = i.spec.as_ref().map_or_else(String::new, |sp| format!("; speculative decoding ({})", crate::spec::SpecArgs::describe(sp)));
                let masks = if i.token_mask { "by the model's sampler (token_mask)" } else if i.model.logits { "on the host, from the logits" } else { "not at all (no token_mask, no logits)" };
                eprintln!("kern serve: constrained outputs (response_format, tools) are masked {masks}");
                eprintln!(
                    "kern serve: ready in {:.2} s{what}; max context {} tokens, {} sequences × {} tokens per step{spec}",
                    t0.elapsed().as_secs_f64(),
                    i.limits.max_context,
                    i.max_seqs,
                    i.max_batched_tokens
                );
            }
        });
        let shutdown = async {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            {
                let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(t) => t,
                    Err(_) => return std::future::pending().await,
                };
                tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
            eprintln!("kern serve: shutting down: finishing running requests, refusing new ones");
        };
        match kern_server::serve(listener, state, shutdown).await? {
            Outcome::Drained => {
                eprintln!("kern serve: stopped");
                Ok(ExitCode::SUCCESS)
            }
            Outcome::EngineFailed(msg) => {
                eprintln!("kern serve: error: {msg}");
                Ok(ExitCode::FAILURE)
            }
        }
    })
}
