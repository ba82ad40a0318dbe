//! `kern pack --config config.json -o DIR`: write a model's manifest (and the kernels it
//! references) with the model pack that serves the config's `model_type`; `kern random-weights`:
//! seeded random weights with real shapes for benchmarks and parity tests. The engine knows no
//! model: this module only dispatches to the packs by `model_type`.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The packs this kern binary carries: model types → pack.
const PACKS: &[(&str, &str)] = &[("qwen3", "qwen3 (packs/qwen3)"), ("qwen2", "qwen3 (packs/qwen3)")];

/// Write a model's manifest from its Hugging Face config.json, with the pack for its model_type.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  kern pack --config ~/models/Qwen3-4B/config.json -o ~/models/Qwen3-4B")]
pub struct Args {
    /// The model's Hugging Face config.json.
    #[arg(long)]
    config: PathBuf,
    /// Output directory (model.json and the cubins it references).
    #[arg(short, long)]
    out: PathBuf,
    /// Directory with the pack's built kernels (packs/qwen3/build.sh writes build/packs/qwen3).
    #[arg(long, default_value = "build/packs/qwen3")]
    kernels: PathBuf,
    /// Most new tokens in one step (the prefill chunk; the `tokens` var).
    #[arg(long, default_value_t = 512)]
    max_tokens: u64,
    /// Most sequences in one step (the `seqs` var).
    #[arg(long, default_value_t = 64)]
    max_seqs: u64,
    /// Longest context (prompt + generated) a sequence may reach.
    #[arg(long, default_value_t = 4096)]
    max_context: u64,
    /// Tokens per KV-cache page.
    #[arg(long, default_value_t = 16)]
    page_tokens: u64,
}

fn model_type(config: &Path) -> Result<String> {
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    let t = v["model_type"].as_str().ok_or_else(|| anyhow!("{}: no `model_type` field", config.display()))?;
    if !PACKS.iter().any(|(m, _)| *m == t) {
        let list: Vec<String> = PACKS.iter().map(|(m, p)| format!("{m} → {p}")).collect();
        bail!("{}: model_type `{t}` has no pack in this kern; supported: {}", config.display(), list.join(", "));
    }
    Ok(t.to_string())
}

pub fn run(args: Args) -> Result<ExitCode> {
    let _ = model_type(&args.config)?;
    let cfg = kern_pack_qwen3::Config::from_file(&args.config)?;
    let opts = kern_pack_qwen3::PackOptions {
        kernels: args.kernels,
        max_tokens: args.max_tokens,
        max_seqs: args.max_seqs,
        max_context: args.max_context,
        page_tokens: args.page_tokens,
    };
    let path = kern_pack_qwen3::generate(&cfg, &opts, &args.out)?;
    // The generated manifest must pass the same check `kern check` runs.
    let m = crate::check::load(&path, kern_binary::Arch::new(90))?;
    eprintln!("wrote {}:", path.display());
    print!("{}", m.report());
    Ok(ExitCode::SUCCESS)
}

/// Write seeded random weights with real shapes in the Hugging Face layout, plus config.json.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern random-weights --preset qwen3-4b -o /tmp/qwen3-4b\n  kern random-weights --config config.json -o DIR --seed 1")]
pub struct RandomArgs {
    /// A config.json to take the shapes from.
    #[arg(long, conflicts_with = "preset", required_unless_present = "preset")]
    config: Option<PathBuf>,
    /// A built-in shape: qwen3-0.6b, qwen3-4b, qwen3-8b, qwen2.5-0.5b, qwen2.5-1.5b.
    #[arg(long)]
    preset: Option<String>,
    /// Output directory.
    #[arg(short, long)]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest safetensors file; bigger checkpoints are sharded with an index, as on the Hub.
    #[arg(long, default_value = "4GiB", value_parser = kern_runtime::plan::parse_bytes)]
    shard_size: u64,
    /// Override the number of layers (for quick tests with real layer shapes).
    #[arg(long)]
    layers: Option<u64>,
}

pub fn random(args: RandomArgs) -> Result<ExitCode> {
    let mut cfg = match (&args.config, &args.preset) {
        (Some(c), _) => {
            let _ = model_type(c)?;
            kern_pack_qwen3::Config::from_file(c)?
        }
        (None, Some(p)) => kern_pack_qwen3::config::preset(p)?,
        (None, None) => bail!("give --config FILE or --preset NAME"),
    };
    if let Some(l) = args.layers {
        cfg.num_hidden_layers = l;
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(indicatif::ProgressStyle::with_template("{msg} {bar:40} {bytes}/{total_bytes} ({eta})").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.set_message("writing random weights");
    kern_pack_qwen3::random::write(&cfg, args.seed, &args.out, args.shard_size, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish();
    eprintln!("wrote {} (config.json + safetensors, seed {})", args.out.display(), args.seed);
    Ok(ExitCode::SUCCESS)
}
