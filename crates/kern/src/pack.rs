//! `kern pack --config config.json -o DIR`: write a model's manifest (and the kernels it
//! references) with the model pack that serves the config's `model_type`; `kern pack --gguf
//! FILE -o DIR`: the same from a GGUF file's metadata, with weight sources naming its tensors
//! and the file linked into DIR; either with `--draft self|layer-skip:L` adds a draft program
//! for speculative decoding (docs/speculative.md); `kern random-weights`:
//! seeded random weights with real shapes for benchmarks and parity tests. The engine knows no
//! model: this module only dispatches to the packs' family table (`kern_packs::FAMILIES`) by
//! `model_type` or GGUF architecture.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;


/// Write a model's manifest from its Hugging Face config.json or from a GGUF file, with the
/// pack for its model type.
#[derive(clap::Args)]
#[command(after_help = "Families (packs/src/families; model_type → family):\n  qwen     qwen3, qwen2                 GGUF qwen3, qwen2   Qwen3 dense (q/k norm), Qwen2 / Qwen2.5 (QKV biases)\n  llama    llama, mistral               GGUF llama          Llama 2 / 3.x (llama3, linear, YaRN RoPE), SmolLM2, TinyLlama, Mistral (sliding window)\n  gemma3   gemma3_text, gemma3 (text)   GGUF gemma3         Gemma 3 text (sliding-window and global layers, (1 + w) norms, GeGLU)\n  qwen3_moe qwen3_moe                   GGUF qwen3moe       Qwen3-MoE (routed experts: Qwen3-30B-A3B, 235B-A22B)\n  qwen3_next qwen3_next                 (no GGUF)           Qwen3-Next (Gated DeltaNet + gated-attention hybrid, MoE with a shared expert; --gdn-state f32|bf16)\n  qwen3_5  qwen3_5_text, qwen3_5 (text) (no GGUF)           Qwen3.5 text (Gated DeltaNet + gated-attention hybrid, dense MLP; --gdn-state f32|bf16)\n\nExamples:\n  kern pack --config ~/models/Qwen3-4B/config.json -o ~/models/Qwen3-4B\n  kern pack --gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -o ~/models/qwen2.5-coder\n  kern pack --config ~/models/Qwen3-4B/config.json -o ~/models/Qwen3-4B --draft layer-skip:9 --draft-k 4\n\nWith --gguf, DIR gets model.json, the cubins, config.json (for reference), the tokenizer and a\nsymbolic link to the GGUF file (none when the file is already in DIR): kern loads the weights from\nit, the projections, LM head and embedding in their blocks (GGUF-native; --dequantize: bf16).")]
pub struct Args {
    /// The model's Hugging Face config.json.
    #[arg(long, conflicts_with = "gguf", required_unless_present = "gguf")]
    config: Option<PathBuf>,
    /// A GGUF file (llama.cpp / Ollama): the config comes from its metadata, the weights from
    /// its tensors. Architectures: qwen2, qwen3, llama, gemma3, qwen3moe.
    #[arg(long)]
    gguf: Option<PathBuf>,
    /// Output directory (model.json and the cubins it references).
    #[arg(short, long)]
    out: PathBuf,
    /// Directory with the packs' built kernels (packs/kernels/build.sh writes build/packs).
    #[arg(long, default_value = "build/packs")]
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
    /// Tensor parallelism: write the manifest of one rank of N (heads and intermediate size
    /// divided across ranks, an all-reduce after the O and down projections;
    /// docs/tensor-parallel.md). `--tp 1` keeps the collectives over a world of one.
    #[arg(long)]
    tp: Option<u64>,
    /// Speculative decoding with a draft that needs no weights of its own (docs/speculative.md):
    /// `self` (the whole target again, with its own KV: a correctness test, slower than no
    /// speculation) or `layer-skip:L` (the target's first L decoder layers, then its final norm
    /// and LM head). The manifest gets the draft program, its `draft_kv` state and a
    /// `speculative` section; serve it with --spec-draft.
    #[arg(long, value_name = "KIND")]
    draft: Option<kern_packs::DraftKind>,
    /// Draft tokens per verify step, 1 to 16 (the manifest's `speculative.k`; default 4).
    #[arg(long, value_name = "K", requires = "draft")]
    draft_k: Option<u64>,
    /// Attention of decode and verify steps (every row one token): `split`, the default
    /// (split-KV kernels that spread each sequence's context over many CTAs, with a chunking
    /// fixed by the row so a row's bits do not depend on the step's size; packs/kernels/KERNELS.md,
    /// attention_decode; Qwen3-4B batch-1 decode 4.95 → 3.39 ms on an H200,
    /// docs/performance.md) or `plain` (the attention kernel of every step).
    #[arg(long, value_name = "KIND", default_value = "split")]
    decode_attention: kern_packs::DecodeAttention,
    /// Attention of steps with more new tokens than sequences (prefill chunks, mixed steps):
    /// `tc`, the default (attention_prefill_dD: FlashAttention-2 style on bf16 tensor cores, P
    /// fed to P·V as two bf16 parts, ~16 bits; packs/kernels/KERNELS.md,
    /// attention_prefill; 7.4× the SIMT kernel on a Qwen3-4B 8,192-token prompt on an H200) or
    /// `simt` (attention_dD, the SIMT fp32 kernel of every step). Decode and verify steps keep
    /// the --decode-attention choice. Needs head_dim 64 or 128 and at most 16 query heads per
    /// kv head.
    #[arg(long, value_name = "KIND", default_value = "tc")]
    prefill_attention: kern_packs::PrefillAttention,
    /// Programmatic Dependent Launch for every kernel: each may start while the kernel before
    /// it finishes (the GEMMs prefetch their weights meanwhile; the others use their `.pdl`
    /// builds, which wait first). docs/manifest.md `pdl`; docs/performance.md has its numbers.
    #[arg(long)]
    pdl: bool,
    /// Programmatic Dependent Launch for steps of at most 8 tokens only (batch-1..8 decode):
    /// `on`, the default, or `off`. `--pdl` (every step) speeds batch 1 up by 2–7% but slows
    /// batch 64 by 2.5% on an H200 (docs/performance.md); this keeps the first without the second.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pdl_small_steps: bool,
    /// The residual stream's dtype: `f32` (exact fp32 adds, as llama.cpp does; the GEMMs'
    /// inputs stay bf16) or `bf16` (rounded after every add, as transformers' bf16 forward).
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    residual: kern_packs::Residual,
    /// GEMMs of steps with 9..64 rows (batched decode, speculative verify steps): `wide`, the
    /// default (gemm_wide.cu: a cluster of 8 CTAs per 64 weight rows, so x is read once per 64
    /// rows of W) or `skinny` (gemm_bf16_m16/m32/m64: each 16 weight rows read every row of x).
    /// Both give a row the same bits as the batch-1 GEMV (packs/kernels/GEMM.md).
    #[arg(long, value_name = "KIND", default_value = "wide")]
    batch_gemm: kern_packs::BatchGemm,
    /// Fused decode GEMVs: `on` (steps of at most 8 tokens run the RMSNorm inside the QKV and
    /// gate-up GEMVs, the SwiGLU inside the down GEMV and the residual adds in the O and down
    /// GEMVs: 7 launches per layer instead of 10, bit-identical; packs/kernels/GEMM.md, "Fused
    /// decode GEMVs") or `off`, the default (the unfused program: on an H200 the fused GEMVs
    /// measured slower than the launches they save, Qwen3-4B batch 1 3.77 vs 3.38 ms). Needs
    /// `--residual f32` and no `--tp` (otherwise the unfused program is written).
    #[arg(long, value_name = "on|off", default_value = "off", value_parser = on_off, action = clap::ArgAction::Set)]
    decode_fusion: bool,
    /// A batch-invariant program (docs/batch-invariance.md): every projection gives a row the
    /// decode GEMV family's bits at every step size (the GEMV family up to 64 rows, the wgmma GEMM
    /// in the GEMV's order above), every step's attention is one kernel (the tensor-core prefill
    /// kernel, or attention_dD at head_dim 256) and a hybrid's Gated DeltaNet layers run the
    /// recurrent rule (fp32 state), so a row's bits do not depend on what else is in its step or on
    /// how its prompt was cut. bf16 weights only. On an H200: a greedy request alone == under 256
    /// streams 32/32 (default packs 14/32); Qwen3-4B 8k prefill +31%, batch 1 +11%, Qwen3-0.6B
    /// batch 1 +24% (docs/batch-invariance.md)
    #[arg(long)]
    batch_invariant: bool,
    /// With --gguf: load every weight dequantized to bf16 (kern's behaviour before GGUF-native
    /// execution) instead of keeping the projections, LM head and embedding in the file's
    /// blocks and running them with the block kernels (the default).
    #[arg(long, requires = "gguf")]
    dequantize: bool,
    /// Quantize the checkpoint beside --config at pack time: `fp8` writes it into -o (another
    /// directory) as a Hugging Face fine-grained FP8 checkpoint — projections as e4m3 with f32
    /// scales per 128 x 128 block (absmax / 448), everything else copied — and packs that. An FP8
    /// checkpoint (quantization_config fp8) packs as it is, without this flag (docs/quantization.md).
    #[arg(long, value_name = "FORMAT", conflicts_with = "gguf")]
    quant: Option<kern_packs::fp8::Quant>,
    /// Prefill (steps of more than 64 rows) of FP8 projections: `dequant` (the default: e4m3 →
    /// bf16 scratch, then the bf16 wgmma GEMM) or `w8a8` (activations quantized per token and
    /// 128 channels, then the FP8 wgmma GEMM, gemm_fp8_wgmma.cu; on an H200 506–619 TF/s at
    /// M = 8192, 0.73× torch's bf16 GEMM: not yet faster than `dequant`, docs/quantization.md).
    #[arg(long, value_name = "KIND", default_value = "dequant")]
    fp8_prefill: kern_packs::fp8::Fp8Prefill,
    /// Gated DeltaNet hybrids (qwen3_next, qwen3_5): the recurrent state's dtype, `f32` (the
    /// default) or `bf16` (half the per-sequence state; packs/kernels/KERNELS.md, Gated DeltaNet).
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    gdn_state: kern_packs::gdn::GdnState,
    /// Mixture-of-experts models (qwen3_moe, qwen3_next): the router logits' dtype, `bf16` (the
    /// default: transformers' bf16 model rounds them so) or `f32` (the router GEMM writes fp32 and
    /// the top-k reads it: the experts an fp32 model picks where bf16 rounding ties or swaps two
    /// logits; docs/moe.md)
    #[arg(long, value_name = "DTYPE", default_value = "bf16")]
    router_logits: kern_packs::moe::RouterLogits,
    /// Mixture-of-experts models: the grouped GEMM of prefill steps (above 64 tokens), `wgmma`
    /// (the default: moe_gemm_w, 128 × 128 tiles on warpgroup MMA) or `mma` (moe_gemm_l, 64 × 128
    /// tiles on mma.sync). Both give every row the bits of the decode kernel moe_gemm_s (docs/moe.md)
    #[arg(long, value_name = "KIND", default_value = "wgmma")]
    moe_gemm: kern_packs::moe::MoeGemm,
}

/// `on` / `off` as a bool (clap value parser).
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{s}`: on or off")),
    }
}

pub(crate) fn model_type(config: &Path) -> Result<String> {
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", config.display()))?;
    let t = v["model_type"].as_str().ok_or_else(|| anyhow!("{}: no `model_type` field", config.display()))?;
    if kern_packs::families::for_model_type(t).is_none() {
        let list: Vec<String> = kern_packs::FAMILIES.iter().map(|f| format!("{} → {}", f.model_types.join(", "), f.name)).collect();
        bail!("{}: model_type `{t}` has no family in this kern; supported: {}", config.display(), list.join("; "));
    }
    Ok(t.to_string())
}

/// The pack options `args` ask for (both the --config and the --gguf path).
fn options(args: &Args) -> kern_packs::PackOptions {
    kern_packs::PackOptions {
        kernels: args.kernels.clone(),
        max_tokens: args.max_tokens,
        max_seqs: args.max_seqs,
        max_context: args.max_context,
        page_tokens: args.page_tokens,
        tp: args.tp,
        draft: args.draft.map(|kind| kern_packs::Draft { kind, k: args.draft_k.unwrap_or(kern_packs::manifest::DEFAULT_DRAFT_K) }),
        decode_attention: args.decode_attention,
        prefill_attention: args.prefill_attention,
        pdl: args.pdl,
        pdl_small_steps: args.pdl_small_steps,
        residual: args.residual,
        batch_gemm: args.batch_gemm,
        decode_fusion: args.decode_fusion,
        // Filled from the GGUF file's tensor types (run_gguf), unless --dequantize.
        native: Default::default(),
        // Filled from the checkpoint's FP8 tensors (kern_packs::fp8::prepare).
        fp8: kern_packs::fp8::Fp8Options { prefill: args.fp8_prefill, ..Default::default() },
        gdn_state: args.gdn_state,
        router_logits: args.router_logits,
        moe_gemm: args.moe_gemm,
        batch_invariant: args.batch_invariant,
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut opts = options(&args);
    if let Some(file) = &args.gguf {
        return run_gguf(file, &opts, &args.out, args.dequantize);
    }
    let config = args.config.as_ref().expect("clap requires --config without --gguf");
    let _ = model_type(config)?;
    let mut cfg = kern_packs::Config::from_file(config)?;
    // A checkpoint beside the config may keep the decoder under another prefix than the
    // family's default (a Gemma 3 checkpoint saved by a newer transformers).
    checkpoint_prefix(config.parent(), &mut cfg);
    let fp8 = kern_packs::fp8::prepare(config, &args.out, args.quant, &cfg, &mut opts)?;
    let path = kern_packs::generate(&cfg, &opts, &args.out)?;
    // The generated manifest must pass the same check `kern check` runs.
    let m = crate::check::load(&path, kern_binary::Arch::new(90))?;
    if let Some((dir, what)) = &fp8 {
        // FP8 weights cannot be converted at load: every one must fit its buffer now.
        if let Ok(ckpt) = kern_weights::Checkpoint::open(dir) {
            let problems: Vec<String> = kern_weights::check(&ckpt, &m.buffers).iter().map(|e| e.to_string()).collect();
            if !problems.is_empty() {
                bail!("{}: the FP8 checkpoint does not fit the manifest:\n  {}", dir.display(), problems.join("\n  "));
            }
        }
        eprintln!("{what}");
    }
    eprintln!("wrote {}:", path.display());
    print!("{}", m.report());
    Ok(ExitCode::SUCCESS)
}

/// The decoder prefix of the checkpoint in `dir`, when one is there and differs from `cfg`'s.
pub(crate) fn checkpoint_prefix(dir: Option<&Path>, cfg: &mut kern_packs::Config) {
    let Some(ckpt) = dir.and_then(|d| kern_weights::Checkpoint::open(d).ok()) else { return };
    if let Some(p) = kern_packs::gguf::decoder_prefix(&ckpt.names(), &cfg.tensor_prefix) {
        cfg.tensor_prefix = p;
    }
}

/// `kern pack --gguf FILE -o DIR`: config from the GGUF metadata, the manifest with GGUF tensor
/// names, FILE linked into DIR, and every weight checked against the file's tensors.
fn run_gguf(file: &Path, opts: &kern_packs::PackOptions, out: &Path, dequantize: bool) -> Result<ExitCode> {
    let ckpt = kern_weights::Checkpoint::open(file)?;
    let g = ckpt.gguf().ok_or_else(|| anyhow!("{}: not a GGUF file", file.display()))?;
    let cfg = kern_packs::families::from_gguf(&ckpt, file).map_err(|e| anyhow!(e))?;
    let mut opts = opts.clone();
    if !dequantize {
        // Every block tensor may stay in its blocks; the pack decides per weight.
        opts.native = ckpt.names().into_iter().filter_map(|n| Some((n.to_string(), ckpt.tensor(n).ok()?.ggml?.block_dtype()?))).collect();
    }
    let opts = &opts;
    let path = kern_packs::generate_for_gguf(&cfg, opts, out)?;
    let hf = serde_json::to_string_pretty(&cfg.to_hf_json())?;
    std::fs::write(out.join("config.json"), hf + "\n").with_context(|| format!("cannot write {}", out.join("config.json").display()))?;
    let linked = link_gguf(file, out)?;
    let tokenizer = match write_tokenizer(g, out) {
        Ok(()) => match add_end_of_turn(&cfg, out) {
            Ok(a) if a.is_empty() => "tokenizer.json + tokenizer_config.json from the GGUF metadata".to_string(),
            Ok(a) => format!("tokenizer.json + tokenizer_config.json from the GGUF metadata, end of turn also at {}", a.join(", ")),
            Err(e) => format!("tokenizer.json + tokenizer_config.json from the GGUF metadata (end-of-turn ids not added: {e:#})"),
        },
        Err(e) => {
            eprintln!("warning: {}: no tokenizer written ({e:#}): text prompts need a tokenizer.json in {}; --prompt-ids works without", file.display(), out.display());
            "no tokenizer".to_string()
        }
    };
    let m = crate::check::load(&path, kern_binary::Arch::new(90))?;
    // Every weight must load from the file as the runtime will open it: through DIR.
    let in_dir = kern_weights::Checkpoint::open(out).with_context(|| format!("{}: the packed directory's weights", out.display()))?;
    // Every rank's slices (one rank without tensor parallelism).
    let problems: Vec<_> = (0..m.tp()).flat_map(|rank| kern_weights::check_rank(&in_dir, &m.buffers, rank)).collect();
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|e| e.to_string()).collect();
        bail!("{}: the GGUF tensors do not fit the manifest:\n  {}", file.display(), lines.join("\n  "));
    }
    eprintln!(
        "wrote {} ({} from {}, {} layers, hidden {}, {} heads / {} kv heads, head_dim {}, vocab {}, {} embeddings); weights: {}; {tokenizer}",
        path.display(),
        cfg.model_type,
        file.display(),
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.kv_heads(),
        cfg.head_dim(),
        cfg.vocab_size,
        if cfg.tie_word_embeddings { "tied" } else { "separate output" },
        linked
    );
    eprintln!("weight formats: {}", formats(&m));
    print!("{}", m.report());
    Ok(ExitCode::SUCCESS)
}

/// The loaded weights by dtype: which stay in the file's blocks, which are bf16 / f32.
fn formats(m: &kern_manifest::Manifest) -> String {
    let mut by: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for b in m.buffers.iter().filter(|b| kern_weights::is_loaded(b)) {
        let e = by.entry(b.dtype.name()).or_default();
        e.0 += 1;
        e.1 += b.bytes_at_max;
    }
    let blocks = m.buffers.iter().filter(|b| kern_weights::is_loaded(b) && b.dtype.is_block()).count();
    let parts: Vec<String> = by.iter().map(|(d, (n, bytes))| format!("{n} {d} ({:.1} MiB)", *bytes as f64 / (1 << 20) as f64)).collect();
    let how = if blocks > 0 { "block dtypes stay in the file's blocks (GGUF-native), bf16 ones are dequantized at load" } else { "every weight dequantized at load" };
    format!("{}: {how}", parts.join(", "))
}

/// Writes DIR/tokenizer.json and tokenizer_config.json (with the chat template) from the
/// GGUF's `tokenizer.*` metadata, so that DIR is a complete model directory.
fn write_tokenizer(g: &kern_weights::gguf::Gguf, out: &Path) -> Result<()> {
    // `general.architecture` picks the SentencePiece variant (Gemma's respelled whitespace).
    let meta: serde_json::Map<String, serde_json::Value> =
        g.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.") || k.as_str() == "general.architecture").map(|(k, v)| (k.clone(), v.to_json())).collect();
    let meta = kern_tokenizer::GgufTokenizerMeta::from_json(&serde_json::Value::Object(meta))?;
    let tok = kern_tokenizer::Tokenizer::from_gguf_metadata(meta)?;
    tok.save_dir(out)?;
    Ok(())
}

/// Adds the family's end-of-turn tokens that the vocabulary has (and the EOS ids do not) to
/// `DIR/generation_config.json`'s `eos_token_id`, so generation stops at the end of a turn.
/// Says which it added.
fn add_end_of_turn(cfg: &kern_packs::Config, out: &Path) -> Result<Vec<String>> {
    let tok = kern_tokenizer::Tokenizer::from_dir(out)?;
    let mut eos: Vec<u32> = tok.eos_ids().to_vec();
    let mut added = vec![];
    for t in kern_packs::families::def(cfg.family).end_of_turn {
        if let Some(id) = tok.token_id(t).filter(|id| !eos.contains(id)) {
            eos.push(id);
            added.push(format!("{t} ({id})"));
        }
    }
    if added.is_empty() {
        return Ok(added);
    }
    let path = out.join("generation_config.json");
    let mut gen: serde_json::Value = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?,
        Err(_) => serde_json::json!({}),
    };
    gen["eos_token_id"] = serde_json::json!(eos);
    std::fs::write(&path, serde_json::to_string_pretty(&gen)? + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    Ok(added)
}

/// Makes FILE the one GGUF file of DIR: nothing when it is already there, else a symbolic link
/// `DIR/<file name>` → FILE's absolute path (replacing an older link). Says what it did.
fn link_gguf(file: &Path, out: &Path) -> Result<String> {
    let abs = std::fs::canonicalize(file).with_context(|| format!("cannot resolve {}", file.display()))?;
    let name = abs.file_name().ok_or_else(|| anyhow!("{}: no file name", file.display()))?;
    let link = out.join(name);
    let same = std::fs::canonicalize(&link).is_ok_and(|p| p == abs);
    let what = if same {
        if link.is_symlink() {
            format!("{} → {}", link.display(), abs.display())
        } else {
            format!("{} (in place)", link.display())
        }
    } else {
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link).with_context(|| format!("cannot replace {}", link.display()))?,
            Ok(_) => bail!("{} exists and is not {}: move it away, or pack into another directory", link.display(), abs.display()),
            Err(_) => {}
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(&abs, &link).with_context(|| format!("cannot link {} → {}", link.display(), abs.display()))?;
        #[cfg(not(unix))]
        std::fs::copy(&abs, &link).with_context(|| format!("cannot copy {} to {}", abs.display(), link.display()))?;
        format!("{} → {}", link.display(), abs.display())
    };
    // kern opens a directory's weights only when it holds exactly one checkpoint.
    let others: Vec<String> = std::fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != &link && p.extension().is_some_and(|x| x == "gguf" || x == "safetensors"))
        .map(|p| p.display().to_string())
        .collect();
    if !others.is_empty() {
        bail!("{} also holds {}: kern loads a directory's weights only when it holds one checkpoint; remove them or pack into another directory", out.display(), others.join(", "));
    }
    Ok(what)
}

/// Write seeded random weights with real shapes in the Hugging Face layout, plus config.json.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  kern random-weights --preset qwen3-4b -o /tmp/qwen3-4b\n  kern random-weights --config config.json -o DIR --seed 1")]
pub struct RandomArgs {
    /// A config.json to take the shapes from.
    #[arg(long, conflicts_with = "preset", required_unless_present = "preset")]
    config: Option<PathBuf>,
    /// A built-in shape (real models' config.json values, e.g. llama-3.1-8b, gemma-3-4b).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(kern_packs::PRESETS.iter().map(|p| p.0)))]
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
    /// `fp8`: the same random weights with the projections quantized (e4m3, f32 scales per
    /// 128 x 128 block) in the Hugging Face fine-grained FP8 layout, config.json with its
    /// quantization_config — what transformers' FP8 loading and `kern pack` both read.
    #[arg(long, value_name = "FORMAT")]
    quant: Option<kern_packs::fp8::Quant>,
}

pub fn random(args: RandomArgs) -> Result<ExitCode> {
    let mut cfg = match (&args.config, &args.preset) {
        (Some(c), _) => {
            let _ = model_type(c)?;
            kern_packs::Config::from_file(c)?
        }
        (None, Some(p)) => kern_packs::config::preset(p)?,
        (None, None) => bail!("give --config FILE or --preset NAME"),
    };
    if let Some(l) = args.layers {
        cfg.num_hidden_layers = l;
        // The first l layers keep their kinds (Gemma's pattern, Mistral's windows).
        cfg.layer_types.truncate(l as usize);
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(indicatif::ProgressStyle::with_template("{msg} {bar:40} {bytes}/{total_bytes} ({eta})").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    bar.set_message("writing random weights");
    let progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    match args.quant {
        Some(kern_packs::fp8::Quant::Fp8) => drop(kern_packs::fp8::write_random(&cfg, args.seed, &args.out, args.shard_size, progress)?),
        None => kern_packs::random::write(&cfg, args.seed, &args.out, args.shard_size, progress)?,
    }
    bar.finish();
    eprintln!("wrote {} (config.json + safetensors, seed {})", args.out.display(), args.seed);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use kern_packs::{Draft, DraftKind};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        pack: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, String> {
        Cli::try_parse_from(std::iter::once("kern-pack").chain(args.iter().copied())).map(|c| c.pack).map_err(|e| e.to_string())
    }

    fn kernels() -> PathBuf {
        // `$KERN_PACK_KERNELS`, else the repo's build (as packs's tests).
        let p = std::env::var_os("KERN_PACK_KERNELS").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/packs"));
        assert!(p.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/kernels/build.sh", p.display());
        p
    }

    /// `kern pack --help` lists every family of the table with its model types and GGUF
    /// architectures (the list is written out in the help; this keeps it true).
    #[test]
    fn help_lists_every_family() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        for f in kern_packs::FAMILIES {
            let line = help.lines().find(|l| l.trim_start().starts_with(&format!("{} ", f.name))).unwrap_or_else(|| panic!("no line for family {}: {help}", f.name));
            for t in f.model_types.iter().chain(f.gguf_architectures) {
                assert!(line.contains(t), "family {}: `{t}` missing from `{line}`", f.name);
            }
        }
    }

    /// `--draft` and `--draft-k` reach the pack options on both paths (--config, --gguf).
    #[test]
    fn draft_flags_reach_the_pack_options() {
        for src in [["--config", "config.json"], ["--gguf", "model.gguf"]] {
            let with = |rest: &[&str]| parse(&[&src[..], &["-o", "out"], rest].concat());
            let draft = |rest: &[&str]| options(&with(rest).unwrap()).draft;
            assert_eq!(draft(&[]), None);
            assert_eq!(draft(&["--draft", "self"]), Some(Draft { kind: DraftKind::SelfDraft, k: 4 }), "k defaults to 4");
            assert_eq!(draft(&["--draft", "layer-skip:3", "--draft-k", "8"]), Some(Draft { kind: DraftKind::LayerSkip(3), k: 8 }));
            // Out-of-range k reaches the pack, which refuses it with the config in hand.
            assert_eq!(draft(&["--draft", "self", "--draft-k", "17"]), Some(Draft { kind: DraftKind::SelfDraft, k: 17 }));
            let e = with(&["--draft-k", "8"]).err().unwrap();
            assert!(e.contains("--draft <KIND>"), "--draft-k alone: {e}");
            let e = with(&["--draft", "medusa"]).err().unwrap();
            assert!(e.contains("unknown draft kind `medusa`") && e.contains("supported: self, layer-skip:L"), "{e}");
        }
    }

    /// `kern pack --config ... --draft` writes a manifest that passes the check (run() loads it
    /// as `kern check` does), and refuses what cannot be drafted before writing anything.
    #[test]
    fn kern_pack_writes_draft_manifests_and_refuses_bad_drafts() {
        let dir = std::env::temp_dir().join(format!("kern-pack-cli-draft-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = kern_packs::config::preset("qwen3-0.6b").unwrap(); // 28 layers
        let config = dir.join("config.json");
        std::fs::write(&config, serde_json::to_string(&cfg.to_hf_json()).unwrap()).unwrap();
        let kernels = kernels();
        let pack = |out: &str, rest: &[&str]| {
            let out = dir.join(out);
            let base = ["--config", config.to_str().unwrap(), "-o", out.to_str().unwrap(), "--kernels", kernels.to_str().unwrap(), "--max-tokens", "64", "--max-seqs", "8", "--max-context", "512"];
            run(parse(&[&base[..], rest].concat()).unwrap()).map(|_| out.join("model.json")).map_err(|e| format!("{e:#}"))
        };
        for (kind, layers) in [("layer-skip:7", 7u64), ("self", 28)] {
            let path = pack(kind, &["--draft", kind, "--draft-k", "5"]).unwrap();
            let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            assert_eq!(m["speculative"], serde_json::json!({"draft": "draft", "k": 5}), "{kind}");
            assert_eq!(m["states"]["draft_kv"]["bytes_per_token"], serde_json::json!(layers * 2 * 8 * 128 * 2), "{kind}");
        }
        let e = pack("bad", &["--draft", "layer-skip:28"]).unwrap_err();
        assert!(e.contains("--draft layer-skip:28: L must be between 1 and 27"), "{e}");
        let e = pack("bad", &["--draft", "self", "--tp", "2"]).unwrap_err();
        assert!(e.contains("not supported with tensor parallelism yet"), "{e}");
        let e = pack("bad", &["--draft", "self", "--draft-k", "0"]).unwrap_err();
        assert!(e.contains("--draft-k 0: the draft proposes 1 to 16 tokens"), "{e}");
        assert!(!dir.join("bad").exists(), "nothing is written for a refused draft");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `--decode-attention` reaches the pack options (default `split`), and `kern pack`
    /// writes a manifest with the split-KV kernels that passes the check (run() loads it as
    /// `kern check` does).
    /// `--residual` reaches the pack options (default f32); a wrong value names the choices.
    #[test]
    fn kern_pack_residual_option() {
        use kern_packs::Residual;
        let r = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).residual);
        assert_eq!(r(&[]).unwrap(), Residual::F32);
        assert_eq!(r(&["--residual", "bf16"]).unwrap(), Residual::Bf16);
        let e = r(&["--residual", "f64"]).unwrap_err();
        assert!(e.contains("unknown residual dtype `f64`") && e.contains("bf16"), "{e}");
    }

    /// `--decode-fusion` reaches the pack options (default on); `kern pack` writes the fused
    /// decode program by default and the unfused one with `off`, both passing the check.
    #[test]
    fn kern_pack_batch_invariant_option() {
        let f = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).batch_invariant);
        assert!(!f(&[]).unwrap());
        assert!(f(&["--batch-invariant"]).unwrap());
    }

    #[test]
    fn kern_pack_decode_fusion_option() {
        let f = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).decode_fusion);
        assert!(!f(&[]).unwrap());
        assert!(f(&["--decode-fusion", "on"]).unwrap());
        assert!(!f(&["--decode-fusion", "off"]).unwrap());
        let e = f(&["--decode-fusion", "yes"]).unwrap_err();
        assert!(e.contains("on or off"), "{e}");

        let dir = std::env::temp_dir().join(format!("kern-pack-cli-fusion-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = kern_packs::config::preset("qwen3-0.6b").unwrap();
        let config = dir.join("config.json");
        std::fs::write(&config, serde_json::to_string(&cfg.to_hf_json()).unwrap()).unwrap();
        let kernels = kernels();
        for (fusion, op) in [("on", "o_proj_norm_gate_up"), ("off", "o_proj")] {
            let out = dir.join(fusion);
            let args = ["--config", config.to_str().unwrap(), "-o", out.to_str().unwrap(), "--kernels", kernels.to_str().unwrap(), "--max-tokens", "64", "--max-seqs", "8", "--max-context", "512", "--decode-fusion", fusion];
            run(parse(&args).unwrap()).unwrap();
            let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
            assert!(m["ops"].get(op).is_some(), "--decode-fusion {fusion}: op {op}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn kern_pack_pdl_small_steps_option() {
        let f = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).pdl_small_steps);
        assert!(f(&[]).unwrap());
        assert!(!f(&["--pdl-small-steps", "off"]).unwrap());
        assert!(f(&["--pdl-small-steps", "on"]).unwrap());
        let e = f(&["--pdl-small-steps", "1"]).unwrap_err();
        assert!(e.contains("on or off"), "{e}");
    }

    #[test]
    fn kern_pack_batch_gemm_option() {
        use kern_packs::BatchGemm;
        let r = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).batch_gemm);
        assert_eq!(r(&[]).unwrap(), BatchGemm::Wide);
        assert_eq!(r(&["--batch-gemm", "skinny"]).unwrap(), BatchGemm::Skinny);
        assert_eq!(r(&["--batch-gemm", "wide"]).unwrap(), BatchGemm::Wide);
        let e = r(&["--batch-gemm", "cublas"]).unwrap_err();
        assert!(e.contains("unknown batch GEMM `cublas`") && e.contains("skinny"), "{e}");
    }

    #[test]
    fn kern_pack_decode_attention_split() {
        use kern_packs::DecodeAttention;
        let da = |rest: &[&str]| parse(&[&["--config", "config.json", "-o", "out"][..], rest].concat()).map(|a| options(&a).decode_attention);
        assert_eq!(da(&[]).unwrap(), DecodeAttention::Split);
        assert_eq!(da(&["--decode-attention", "split"]).unwrap(), DecodeAttention::Split);
        assert_eq!(da(&["--decode-attention", "plain"]).unwrap(), DecodeAttention::Plain);
        let e = da(&["--decode-attention", "flash"]).unwrap_err();
        assert!(e.contains("unknown decode attention `flash`") && e.contains("split"), "{e}");

        let dir = std::env::temp_dir().join(format!("kern-pack-cli-split-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = kern_packs::config::preset("qwen3-0.6b").unwrap();
        let config = dir.join("config.json");
        std::fs::write(&config, serde_json::to_string(&cfg.to_hf_json()).unwrap()).unwrap();
        let kernels = kernels();
        let out = dir.join("split");
        let args = ["--config", config.to_str().unwrap(), "-o", out.to_str().unwrap(), "--kernels", kernels.to_str().unwrap(), "--max-tokens", "64", "--max-seqs", "8", "--max-context", "512", "--decode-attention", "split"];
        run(parse(&args).unwrap()).unwrap();
        let m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("model.json")).unwrap()).unwrap();
        let mut entries: Vec<&str> = m["ops"]["attention"]["impl"]["launches"].as_array().unwrap().iter().map(|l| l["entry"].as_str().unwrap()).collect();
        // --pdl-small-steps (the default) writes a launch that can run at both <= 8 and > 8
        // tokens twice (with and without PDL): here the prefill kernel.
        entries.dedup();
        assert_eq!(entries, ["attention_prefill_d128", "attention_decode_d128", "attention_combine_d128"], "tc prefill (the default), split decode");
        assert!(out.join("attention_decode.pdl.sm_90a.cubin").exists());
        std::fs::remove_dir_all(&dir).ok();
    }
}
