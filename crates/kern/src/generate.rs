//! `kern generate --model DIR --prompt …`: load a packed model (manifest + kernels + weights +
//! tokenizer), run several prompts as one varlen batch — chunked prefill, then batched decode
//! replayed from CUDA graphs — and print (or stream) the text with load, prefill and decode
//! speeds. This is the serving loop in its simplest form: scheduler (kern-sched, pure) →
//! step-ABI buffers → program run (kern-runtime) → sampled ids → scheduler.

use anyhow::{anyhow, bail, Context as _, Result};
use kern_manifest::manifest::{BufferId, Step as StepAbi};
use kern_runtime::plan::{self, human, StatePool};
use kern_runtime::{Mode, Runtime};
use kern_sched::{BlockManager, Finish, SamplingParams, Scheduler, SchedulerConfig, Step};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Generate text with a packed model: several prompts in one batch, chunked prefill, CUDA-graph decode.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern generate --model ~/models/Qwen3-4B --prompt 'The capital of France is' --max-tokens 32\n  kern generate --model DIR --prompt-ids 1,2,3 --prompt-ids 4,5 --temperature 0 --dump out/")]
pub struct Args {
    /// A model directory: model.json (from `kern pack`), its cubins, the safetensors weights,
    /// and tokenizer.json for text prompts.
    #[arg(long)]
    model: PathBuf,
    /// A text prompt (repeatable: all prompts run as one batch).
    #[arg(long = "prompt")]
    prompts: Vec<String>,
    /// A prompt as comma-separated token ids (repeatable).
    #[arg(long = "prompt-ids", value_name = "IDS")]
    prompt_ids: Vec<String>,
    /// Wrap text prompts in the ChatML chat template (user turn, then the assistant's).
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
    /// Sampling seed (prompt i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Prefill chunk: most new tokens per step (default: the manifest's `tokens` max).
    #[arg(long)]
    chunk: Option<usize>,
    /// Run decode steps eagerly instead of replaying CUDA graphs.
    #[arg(long)]
    no_graph: bool,
    /// Write tokens.json and each sequence's per-step last-position logits (seqN.logits.npy).
    #[arg(long)]
    dump: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim().parse::<u32>().map_err(|_| anyhow!("--prompt-ids {s}: `{t}` is not a token id")))
        .collect()
}

/// Buffers of the step ABI, resolved once.
struct Abi {
    step: StepAbi,
}

impl Abi {
    fn write(&self, rt: &Runtime, step: &Step) -> Result<()> {
        let s = &self.step;
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let w = |b: BufferId, bytes: Vec<u8>| rt.write_buffer(b, &bytes);
        w(s.token_ids, i32s(&step.token_ids))?;
        w(s.positions, i32s(&step.positions))?;
        w(s.seq_lens, i32s(&step.seq_lens))?;
        w(s.query_start, i32s(&step.query_start))?;
        w(s.slot_mapping, i32s(&step.slot_mapping))?;
        w(s.block_tables, i32s(&step.block_tables))?;
        w(s.last_token, i32s(&step.last_token))?;
        if let Some(sm) = &s.sampling {
            w(sm.temperature, f32s(&step.temperature))?;
            w(sm.top_k, i32s(&step.top_k))?;
            w(sm.top_p, f32s(&step.top_p))?;
            w(sm.seeds, step.seeds.iter().flat_map(|x| x.to_le_bytes()).collect())?;
        }
        Ok(())
    }
}

struct Phase {
    tokens: usize,
    secs: f64,
    steps: usize,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let t0 = Instant::now();
    let dir = &args.model;
    let manifest_path = dir.join("model.json");
    if !manifest_path.exists() {
        bail!("{}: no model.json: run `kern pack --config {}/config.json -o {}` first", dir.display(), dir.display(), dir.display());
    }
    if args.prompts.is_empty() && args.prompt_ids.is_empty() {
        bail!("give at least one --prompt TEXT or --prompt-ids 1,2,3");
    }
    let tokenizer = if dir.join("tokenizer.json").exists() {
        Some(kern_tokenizer::Tokenizer::from_dir(dir)?)
    } else if !args.prompts.is_empty() {
        bail!("{}: no tokenizer.json, so text prompts cannot be encoded: copy the model's tokenizer.json (and tokenizer_config.json) there, or give --prompt-ids", dir.display());
    } else {
        None
    };
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for p in &args.prompts {
        let tok = tokenizer.as_ref().expect("checked above");
        let text = if args.chat { kern_tokenizer::chatml(&[("user", p.as_str())]) } else { p.clone() };
        prompts.push(tok.encode(&text, false)?);
    }
    for p in &args.prompt_ids {
        prompts.push(parse_ids(p)?);
    }

    let ctx = kern_cuda::Context::new(args.device)?;
    let props = ctx.props().clone();
    let arch = kern_binary::Arch::new(props.cc_major * 10 + props.cc_minor);
    let m = crate::check::load(&manifest_path, arch)?;
    let abi = Abi { step: m.step.clone().ok_or_else(|| anyhow!("{}: the manifest has no `step` section: kern generate drives a model through the step ABI (docs/step-abi.md)", manifest_path.display()))? };
    let ckpt = kern_weights::Checkpoint::open(dir).with_context(|| format!("{}: the model's weights", dir.display()))?;
    let problems = kern_weights::check(&ckpt, &m.buffers);
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
        bail!("the checkpoint does not match the manifest:\n  {}", lines.join("\n  "));
    }
    let (free, total) = ctx.mem_info()?;
    let p = plan::plan(&m, &plan::PlanOptions { budget: Some(free as u64), reserve: (1u64 << 30).min(free as u64 / 8) })
        .map_err(|e| anyhow!("{e} ({} has {} free of {})", props.name, human(free as u64), human(total as u64)))?;
    let (pages_total, page_tokens) = p
        .states
        .iter()
        .zip(&m.states)
        .find_map(|(pool, _)| match pool {
            StatePool::PerToken { pages, page_tokens, .. } => Some((*pages as usize, *page_tokens as usize)),
            _ => None,
        })
        .ok_or_else(|| anyhow!("the manifest has no per-token (KV) state to page"))?;
    let var_max = |v: kern_manifest::manifest::VarId| m.vars[v.0].max as usize;
    let (tokens_max, seqs_max, pages_max) = (var_max(abi.step.tokens), var_max(abi.step.seqs), var_max(abi.step.pages));
    let mut rt = Runtime::new(&ctx, m, p)?;

    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(indicatif::ProgressStyle::with_template("loading weights {bar:40} {bytes}/{total_bytes} {bytes_per_sec}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    let loaded = rt.load_weights(&ckpt, |d, t| {
        bar.set_length(t);
        bar.set_position(d);
    })?;
    bar.finish_and_clear();
    let load_secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "loaded {} in {load_secs:.2} s: {} of weights, KV pool {} pages × {page_tokens} tokens = {} tokens, on {} ({arch})",
        dir.display(),
        human(loaded),
        pages_total,
        pages_total * page_tokens,
        props.name
    );

    let chunk = args.chunk.unwrap_or(tokens_max).clamp(1, tokens_max);
    let cfg = SchedulerConfig { chunk, max_seqs: seqs_max, max_context: pages_max * page_tokens, pages_per_seq: pages_max };
    let mut sched = Scheduler::new(cfg, BlockManager::new(pages_total, page_tokens));
    let stop: Vec<u32> = tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default();
    let mut ids = Vec::new();
    for (i, pr) in prompts.iter().enumerate() {
        let params = SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed.wrapping_add(i as u64),
            max_tokens: args.max_tokens,
            stop: stop.clone(),
            ignore_eos: args.ignore_eos,
        };
        ids.push(sched.add(pr.clone(), params).map_err(|e| anyhow!("prompt {i}: {e}"))?);
    }

    let vocab = abi.step.vocab.unwrap_or(0) as usize;
    let want_logits = args.dump.is_some() && abi.step.logits.is_some();
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    let mut finish: Vec<Option<Finish>> = vec![None; prompts.len()];
    let stream_one = prompts.len() == 1 && tokenizer.is_some() && !args.prompts.is_empty();
    let mut detok = if stream_one { Some(tokenizer.as_ref().expect("checked").detokenizer(true)) } else { None };
    let (mut prefill, mut decode) = (Phase { tokens: 0, secs: 0.0, steps: 0 }, Phase { tokens: 0, secs: 0.0, steps: 0 });
    let use_graph = !args.no_graph;
    let bucket = |n: usize, max: usize| kern_runtime::exec::bucket(n as i64, max as i64) as usize;
    let vars_index = (abi.step.tokens.0, abi.step.seqs.0, abi.step.pages.0);
    let nvars = rt.manifest.vars.len();
    while sched.has_work() {
        let step = sched
            .schedule(|t, s, decode| if decode && use_graph { (bucket(t, tokens_max), bucket(s, seqs_max)) } else { (t, s) })
            .ok_or_else(|| anyhow!("no sequence can run: out of KV pages ({} free)", sched.free_pages()))?;
        let ts = Instant::now();
        abi.write(&rt, &step)?;
        let mut vars = vec![1i64; nvars];
        vars[vars_index.0] = step.tokens as i64;
        vars[vars_index.1] = step.num_seqs as i64;
        vars[vars_index.2] = pages_max as i64;
        let graph = step.is_decode() && use_graph;
        rt.run(0, &vars, if graph { Mode::Graph } else { Mode::Eager { sync_each: false } })?;
        let sampled_bytes = rt.read_buffer(abi.step.sampled, step.real_seqs * 4)?;
        let sampled: Vec<i32> = sampled_bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let step_logits = if want_logits {
            let b = rt.read_buffer(abi.step.logits.expect("checked"), step.real_seqs * vocab * 4)?;
            Some(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<f32>>())
        } else {
            None
        };
        let outs = sched.commit(&step, &sampled);
        let secs = ts.elapsed().as_secs_f64();
        let phase = if step.is_decode() { &mut decode } else { &mut prefill };
        phase.tokens += if step.is_decode() { step.real_seqs } else { step.real_tokens };
        phase.secs += secs;
        phase.steps += 1;
        for o in outs {
            let i = ids.iter().position(|&x| x == o.id).expect("our sequence");
            outputs[i].push(o.token);
            finish[i] = o.finished;
            if let Some(l) = &step_logits {
                logits[i].extend_from_slice(&l[o.row * vocab..(o.row + 1) * vocab]);
            }
            if let Some(d) = detok.as_mut() {
                if let Some(text) = d.push(o.token)? {
                    print!("{text}");
                    let _ = std::io::stdout().flush();
                }
            }
        }
    }
    if let Some(d) = detok.as_mut() {
        println!("{}", d.finish()?);
    } else {
        for (i, out) in outputs.iter().enumerate() {
            let text = match &tokenizer {
                Some(t) => format!("{:?}", t.decode(out, true)?),
                None => format!("{out:?}"),
            };
            println!("[{i}] {} prompt tokens → {} new ({}): {text}", prompts[i].len(), out.len(), match finish[i] {
                Some(Finish::Stop) => "stop",
                Some(Finish::Length) => "length",
                None => "running",
            });
        }
    }
    let rate = |p: &Phase| if p.secs > 0.0 { p.tokens as f64 / p.secs } else { 0.0 };
    eprintln!(
        "load {load_secs:.2} s | prefill {} tokens in {} steps, {:.0} tok/s | decode {} tokens in {} steps, {:.1} tok/s ({:.2} ms/step){}",
        prefill.tokens,
        prefill.steps,
        rate(&prefill),
        decode.tokens,
        decode.steps,
        rate(&decode),
        if decode.steps > 0 { decode.secs * 1000.0 / decode.steps as f64 } else { 0.0 },
        if use_graph { ", CUDA graphs" } else { ", eager" }
    );
    if let Some(d) = &args.dump {
        write_dump(d, &prompts, &outputs, &logits, vocab)?;
    }
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
