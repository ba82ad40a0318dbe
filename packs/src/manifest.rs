//! `kern pack`: a manifest for a dense decoder [`Config`] of any family, wiring the shared
//! kernels into the decoder transformers' `Qwen3Model`, `LlamaModel`, `MistralModel` or
//! `Gemma3TextModel` computes, one step of the step ABI per program run (a varlen batch mixing
//! prefill chunks and decode tokens). What differs between families comes from the config as
//! data — norm form, sandwich norms, activation, biases, q/k norm, embedding scale, RoPE tables
//! and sliding windows per layer — so this builder has no family branches. See
//! `packs/kernels/KERNELS.md` for each kernel's contract.

use crate::config::{Activation, Config, NormKind, RopePairs};
use crate::{io, PackError, Result};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Modules (cubins) the manifest uses, by file stem in the kernel directory.
pub const MODULES: &[&str] = &["rowwise", "rope", "attention", "sampling", "gemm_skinny", "gemm_wgmma"];

#[derive(Clone, Debug)]
pub struct PackOptions {
    /// Directory with the pack's built cubins (`packs/kernels/build.sh` → build/packs).
    pub kernels: PathBuf,
    /// Largest number of new tokens in one step (the `tokens` var): the prefill chunk.
    pub max_tokens: u64,
    /// Largest batch (the `seqs` var).
    pub max_seqs: u64,
    /// Longest context a sequence may reach (prompt + generated).
    pub max_context: u64,
    /// Tokens per KV page.
    pub page_tokens: u64,
    /// Tensor parallelism (issue 17, docs/tensor-parallel.md): `Some(t)` writes the manifest
    /// of one rank of `t` (Megatron-style: column-parallel QKV and gate-up, row-parallel O and
    /// down, an all-reduce after each); `Some(1)` is a world of one with the collectives kept.
    /// `None`: the single-GPU manifest, unchanged.
    pub tp: Option<u64>,
    /// Speculative decoding with a draft that needs no weights of its own (issue 18,
    /// docs/speculative.md): the manifest gets the draft's program (`programs.draft`), its KV
    /// state (`draft_kv`, on the same pages as `kv`) and the `speculative` section. `None`: the
    /// manifest without them, unchanged.
    pub draft: Option<Draft>,
    /// How steps whose rows are all one token (decode and speculative verify steps) run
    /// attention (issue 15): [`DecodeAttention::Split`] (the default) runs the split-KV kernels
    /// for them (batch-invariant: a row's bits do not depend on the step's size);
    /// [`DecodeAttention::Plain`] keeps `attention_dD` for every step.
    pub decode_attention: DecodeAttention,
    /// How steps with more tokens than sequences (prefill chunks, mixed steps) run attention
    /// (`--prefill-attention`): [`PrefillAttention::Tc`] (the default) runs the tensor-core
    /// `attention_prefill_dD` for them; [`PrefillAttention::Simt`] keeps `attention_dD`.
    pub prefill_attention: PrefillAttention,
    /// Programmatic Dependent Launch for every launch (issue 15): each kernel waits with
    /// `griddepcontrol.wait` before touching activations — the GEMMs after their weight
    /// prefetch, the others first thing (their `.pdl` builds, packs/kernels/build.sh) — so each
    /// may start while the kernel before it finishes. Off by default until measured.
    pub pdl: bool,
    /// Programmatic Dependent Launch for steps of at most [`PDL_SMALL_TOKENS`] tokens only
    /// (`--pdl-small-steps`): every launch a batch-1..8 step makes is a PDL launch (the non-GEMM
    /// modules from their `.pdl` builds), larger steps launch without it. Each non-GEMM launch is
    /// written twice, gated by `tokens` (a grid of 0 skips a launch); the GEMM launches are
    /// already per step size (the `gemv_bf16*` ones get the attribute). `--pdl` (every launch)
    /// speeds batch 1 up by 2–7% but slows batch 64 by 2.5% (docs/performance.md). On by default.
    pub pdl_small_steps: bool,
    /// The residual stream's dtype (`--residual`): [`Residual::F32`] (the default) keeps it in
    /// fp32, as llama.cpp does (the `*_f32` kernels of `rowwise`): the norms' outputs, and so
    /// every GEMM's input, are still bf16; [`Residual::Bf16`] rounds it to bf16 after every
    /// add, as transformers' bf16 forward does.
    pub residual: Residual,
    /// The GEMM kernels of steps with 9..64 rows (`--batch-gemm`): [`BatchGemm::Wide`] (the
    /// default) runs `gemm_wide.cu`'s cluster kernels, [`BatchGemm::Skinny`] the 8-warp
    /// `gemm_bf16_m16/m32/m64`. Both give the same bits as the decode GEMV (GEMM.md).
    pub batch_gemm: BatchGemm,
    /// Fused decode GEMVs (issue 15, `--decode-fusion`; [`crate::fused`], GEMM.md "Fused decode
    /// GEMVs"): steps of at most 8 tokens run the RMSNorm inside the QKV and gate-up GEMVs, the
    /// SwiGLU inside the down GEMV and the residual adds in the O and down GEMVs' epilogues —
    /// 7 launches per layer instead of 10, every value bit-identical to the unfused kernels;
    /// larger steps launch the unfused kernels. Needs the fp32 residual and one GPU: with
    /// `--residual bf16` or `--tp` the manifest keeps the unfused program. `false`: the unfused
    /// program everywhere, the default: measured on the H200 (2026-12-02, fused_verify.py and
    /// `kern bench`), the fused GEMVs are slower than the launches they save (Qwen3-4B batch 1:
    /// 3.772 ms fused vs 3.382 ms unfused; GEMM.md "Fused decode GEMVs"). Blocks with four
    /// (1 + w) norms and GeGLU (Gemma 3, issue 24) get the sandwich ops of [`crate::fused`]: the
    /// post-norm, residual add and next pre-norm in the next GEMV's prologue (one-token steps and
    /// one-wave GEMVs), else in one row-wise launch; the residual ping-pongs between `x` and `x2`.
    pub decode_fusion: bool,
    /// GGUF-native weights (issue 25, [`crate::quant`]): the block dtype of each checkpoint
    /// tensor (by its name in the file) that may stay in its blocks. Empty: every weight is
    /// loaded as bf16 (`kern pack --dequantize`, and every safetensors checkpoint).
    pub native: std::collections::BTreeMap<String, kern_manifest::DType>,
    /// FP8 weights (issue 25, [`crate::fp8`]): the checkpoint's block-scaled E4M3 tensors and how
    /// prefill runs them. Empty `weights`: no FP8 pass.
    pub fp8: crate::fp8::Fp8Options,
    /// The Gated DeltaNet recurrent state's dtype (`--gdn-state`, hybrids only; [`crate::gdn`]):
    /// the `_f32` (default) or `_bf16` entries of `gdn.cu`.
    pub gdn_state: crate::gdn::GdnState,
    /// The MoE router logits' dtype (`--router-logits`, MoE families only; [`crate::moe`]):
    /// bf16 (the default) or f32 (the router GEMM's `_f32out` entries, `moe_topk_f32`).
    pub router_logits: crate::moe::RouterLogits,
    /// The MoE prefill grouped GEMM (`--moe-gemm`, [`crate::moe::MoeGemm`]): `moe_gemm_w`
    /// (wgmma, the default) or `moe_gemm_l` (mma.sync); the same bits.
    pub moe_gemm: crate::moe::MoeGemm,
    /// Batch-invariant program (`--batch-invariant`, issue 29, docs/batch-invariance.md): every
    /// projection gives a row the GEMV family's bits at every step size (`gemv_bf16`,
    /// `gemm_bf16_m16`, the wide `gemm_bf16_w32` / `w64` up to 64 rows, `gemm_bf16_wgmma_gv` — the
    /// wgmma GEMM in the GEMV's order — above), every step's attention is one kernel (`attention_prefill_dD`, or `attention_dD` at
    /// head_dim 256), decode steps included, and a hybrid's delta rule is the recurrent one at
    /// every step (fp32 state), so a row's bits do not depend on the step it is in or on how its
    /// prompt was cut. Costs prefill speed (the GEMV-order wgmma's 128-wide tiles and 8-byte
    /// copies) and decode attention (the prefill kernel, no split).
    pub batch_invariant: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            kernels: PathBuf::from("build/packs"),
            max_tokens: 512,
            max_seqs: 64,
            max_context: 4096,
            page_tokens: 16,
            tp: None,
            draft: None,
            decode_attention: DecodeAttention::Split,
            prefill_attention: PrefillAttention::Tc,
            pdl: false,
            pdl_small_steps: true,
            residual: Residual::F32,
            batch_gemm: BatchGemm::Wide,
            decode_fusion: false,
            native: Default::default(),
            fp8: Default::default(),
            gdn_state: Default::default(),
            router_logits: Default::default(),
            moe_gemm: Default::default(),
            batch_invariant: false,
        }
    }
}

/// The residual stream's dtype (`--residual`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Residual {
    /// `bf16`: `x` is bf16, each residual add rounded to bf16 (transformers' bf16 forward).
    Bf16,
    /// `f32` (the default): `x` and `x_last` are fp32 and the adds are exact fp32 adds; the
    /// embedding, the norms and the last-position gather use the `*_f32` entries of `rowwise`.
    /// Measured (docs/gpu-results.md, 2026-12-02): the real Qwen2.5-Coder GGUF passes the
    /// parity rule on 8/8 prompts (bf16: 6/8), random-weight parity's worst error/bound falls
    /// from 0.73 to 0.46–0.57, and a Qwen3-4B decode step costs under 1% more.
    #[default]
    F32,
}

/// The values `--residual` takes, for error messages and help.
pub const RESIDUAL_KINDS: &str = "bf16 (rounded after every add, as transformers), f32 (fp32 adds, as llama.cpp)";

impl std::str::FromStr for Residual {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "bf16" => Ok(Residual::Bf16),
            "f32" => Ok(Residual::F32),
            _ => Err(format!("unknown residual dtype `{s}`: supported: {RESIDUAL_KINDS}")),
        }
    }
}

impl std::fmt::Display for Residual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Residual::Bf16 => "bf16",
            Residual::F32 => "f32",
        })
    }
}

/// The GEMMs of steps with 9..64 rows (`--batch-gemm`): batched decode, speculative verify
/// steps, small prefill chunks. Steps of 1..8 rows always run the GEMV `gemv_bf16`, larger ones
/// the wgmma kernels; every choice here reproduces the GEMV's bits for a row (GEMM.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchGemm {
    /// `skinny`: `gemm_bf16_m16/m32/m64` (gemm_skinny.cu): one CTA per 16 weight rows, whose
    /// 8 warps split K, so each CTA reads every row of x (x traffic 4× the weights at 64 rows).
    Skinny,
    /// `wide` (the default): `gemm_bf16_w32/w64` (gemm_wide.cu): a cluster of 8 CTAs per 64
    /// weight rows, CTA rank v taking the K chunks warp v of the 8-warp family takes; for 33..64
    /// rows, and 17..32 rows when K >= 2560 (where it measured faster; 9..16 rows keep m16).
    #[default]
    Wide,
    /// Set by [`PackOptions::batch_invariant`] (not a `--batch-gemm` value): the GEMV family up to
    /// 64 rows (`gemm_bf16_w64` from 33), `gemm_bf16_wgmma_gv` above — the wgmma GEMM in the GEMV
    /// family's order, whose rows get the GEMV's bits (gemm_wgmma.cu, "GEMV order").
    Invariant,
}

/// The values `--batch-gemm` takes, for error messages and help.
pub const BATCH_GEMM_KINDS: &str = "wide (the default: gemm_wide.cu, clusters of 8 CTAs per 64 weight rows), skinny (gemm_bf16_m16/m32/m64)";

impl std::str::FromStr for BatchGemm {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "skinny" => Ok(BatchGemm::Skinny),
            "wide" => Ok(BatchGemm::Wide),
            _ => Err(format!("unknown batch GEMM `{s}`: supported: {BATCH_GEMM_KINDS}")),
        }
    }
}

impl std::fmt::Display for BatchGemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BatchGemm::Skinny => "skinny",
            BatchGemm::Wide => "wide",
            BatchGemm::Invariant => "invariant (--batch-invariant)",
        })
    }
}

/// The module of the wide batch GEMMs (`--batch-gemm wide`).
pub const WIDE_MODULE: &str = "gemm_wide";

/// Prefill attention (`--prefill-attention`): which kernel attends for steps with
/// `tokens > seqs` (some row has more than one new token: prefill chunks, mixed steps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillAttention {
    /// `simt`: `attention_dD` (attention.cu, SIMT fp32) for every step.
    Simt,
    /// `tc` (the default): steps with `tokens > seqs` run `attention_prefill_dD` of the module
    /// `attention_prefill` (FlashAttention-2 style on mma.sync bf16 tensor cores, the same
    /// parameters and semantics; packs/kernels/KERNELS.md); steps with `tokens <= seqs` keep the
    /// `--decode-attention` choice. Needs head_dim 64 or 128 and `Hq / Hkv <= 16`.
    #[default]
    Tc,
}

/// The values `--prefill-attention` takes, for error messages and help.
pub const PREFILL_ATTENTION_KINDS: &str = "tc (the default: tensor-core attention_prefill_dD for steps with tokens > seqs), simt (attention_dD for every step)";

impl std::str::FromStr for PrefillAttention {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "simt" => Ok(PrefillAttention::Simt),
            "tc" => Ok(PrefillAttention::Tc),
            _ => Err(format!("unknown prefill attention `{s}`: supported: {PREFILL_ATTENTION_KINDS}")),
        }
    }
}

impl std::fmt::Display for PrefillAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefillAttention::Simt => "simt",
            PrefillAttention::Tc => "tc",
        })
    }
}

/// The module of the tensor-core prefill kernels (`--prefill-attention tc`).
pub const PREFILL_MODULE: &str = "attention_prefill";
/// Query rows per CTA of `attention_prefill_dD`: a tile holds `PREFILL_ROWS / (Hq / Hkv)` tokens.
pub const PREFILL_ROWS: u64 = 64;

/// Whether the tensor-core prefill kernels take `cfg`'s attention shape (`--prefill-attention tc`).
pub fn check_prefill_tc(cfg: &Config) -> std::result::Result<(), String> {
    let (hq, hkv, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let mut why = vec![];
    if d != 64 && d != 128 {
        why.push(format!("head_dim {d} (the kernels are built for 64 and 128)"));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) || hq / hkv > 16 {
        why.push(format!("{hq} query heads over {hkv} kv heads (the kernel takes whole groups of at most 16 query heads per kv head)"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("--prefill-attention tc: {}; pack with --prefill-attention simt", why.join("; ")))
    }
}

/// The prefill attention a pack gets for `asked`: the tensor-core kernels have no head_dim 256
/// build, so such models (Gemma 3) prefill with the SIMT kernel instead of failing to pack.
pub fn prefill_attention_for(cfg: &Config, asked: PrefillAttention) -> PrefillAttention {
    if asked == PrefillAttention::Tc && cfg.head_dim() == 256 {
        PrefillAttention::Simt
    } else {
        asked
    }
}

/// Decode attention (`--decode-attention`): which kernels attend for decode-shaped steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeAttention {
    /// `plain`: `attention_dD` (attention.cu) for every step: one CTA per (sequence, kv head)
    /// at decode, so batch 1 runs `Hkv` CTAs.
    Plain,
    /// `split` (the default): steps with `tokens <= seqs` (every row one token) run the
    /// split-KV kernels of the module `attention_decode` (`attention_decode_dD` over
    /// `seqs × Hkv × Z` CTAs, then `attention_combine_dD`; packs/kernels/KERNELS.md), other steps
    /// the `--prefill-attention` choice. Needs `Hq / Hkv <= 16`. A row's keys are cut into chunks fixed by the row
    /// alone (at most [`decode_max_chunks`]), so its bits are the same in a decode step of any
    /// size and in a speculative verify step (speculative decoding's identical output).
    #[default]
    Split,
}

/// The values `--decode-attention` takes, for error messages and help.
pub const DECODE_ATTENTION_KINDS: &str = "split (the default: split-KV kernels for one-token rows), plain (attention_dD for every step)";

impl std::str::FromStr for DecodeAttention {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "plain" => Ok(DecodeAttention::Plain),
            "split" => Ok(DecodeAttention::Split),
            _ => Err(format!("unknown decode attention `{s}`: supported: {DECODE_ATTENTION_KINDS}")),
        }
    }
}

impl std::fmt::Display for DecodeAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DecodeAttention::Plain => "plain",
            DecodeAttention::Split => "split",
        })
    }
}

/// The module of the split-KV decode kernels (`--decode-attention split`).
pub const DECODE_MODULE: &str = "attention_decode";

/// Split-KV decode attention (packs/kernels/KERNELS.md). A row with `kmax` visible keys is cut
/// into `ceil(kmax / chunk)` chunks of
/// `chunk = max(DECODE_MIN_CHUNK, round_up(ceil(kmax / decode_max_chunks(Hkv)), 32))` keys — a
/// rule of the row and the model only, so a row's bits never depend on the step it runs in — and
/// the step's grid has `Z = decode_splits(seqs, Hkv)` CTAs per (row, kv head), each taking the
/// chunks `z, z + Z, …`. `decode_max_chunks` aims a batch-1 row at `DECODE_TARGET_CTAS` CTAs —
/// about two per SM of the H200's 132 (the kernel fits five per SM); `packs/kernels/verify` use the
/// same numbers. Larger steps aim at `DECODE_GRID_CTAS`.
pub const DECODE_TARGET_CTAS: u64 = 264;
/// The CTAs a decode step's grid aims at (`Z = ceil(DECODE_GRID_CTAS / (seqs · Hkv))`, at most
/// `decode_max_chunks`). With 264 (the first rule) a batch-64 step of Qwen3-4B had Z = 1: each CTA
/// walked its row's chunks one after the other (attention 2.99 ms of a 4B batch-64 step at
/// 256-token contexts, docs/performance.md). 2048 gives that step Z = 4, one CTA per chunk of a
/// 256-key row; a CTA past its row's last chunk exits after reading the row's length.
pub const DECODE_GRID_CTAS: u64 = 2048;
/// The most chunks per (row, kv head) (the kernel takes up to 128).
pub const DECODE_MAX_SPLITS: u64 = 64;
/// The fewest keys in one chunk (rounded up to 32 by the kernel).
pub const DECODE_MIN_CHUNK: u64 = 64;
/// The most query heads per kv head the split kernel takes.
pub const DECODE_MAX_GROUP: u64 = 16;

/// The most chunks of one row (the kernel's `max_chunks`): batch 1's grid z, so a batch-1 step
/// gives every chunk its own CTA and fills the GPU. A constant of the model (its per-rank kv
/// heads), never of the step.
pub fn decode_max_chunks(hkv: u64) -> u64 {
    DECODE_TARGET_CTAS.div_ceil(hkv).clamp(1, DECODE_MAX_SPLITS)
}

/// The grid's z size (CTAs per row and kv head) of a decode step with `seqs` rows and `hkv` kv
/// heads, as the manifest's grid computes it: occupancy only, never the results.
pub fn decode_splits(seqs: u64, hkv: u64) -> u64 {
    DECODE_GRID_CTAS.div_ceil(seqs * hkv).clamp(1, decode_max_chunks(hkv))
}

/// Floats of the split kernel's scratch (`attn_partial`) for every decode step the vars allow
/// (`tokens <= seqs`, so `tokens <= min(max_seqs, max_tokens)`): a header of `tokens` rounded
/// up to 4, then `decode_max_chunks(hkv) × tokens × hq` records of `d + 4` floats.
pub fn decode_scratch_floats(max_tokens: u64, max_seqs: u64, hkv: u64, hq: u64, d: u64) -> u64 {
    let t = max_seqs.min(max_tokens);
    t.div_ceil(4) * 4 + decode_max_chunks(hkv) * t * hq * (d + 4)
}

/// A draft for speculative decoding written from the target's own weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// `self`: the target model itself, every layer, with its KV in `draft_kv`. Every round
    /// runs the whole model k times before the verify step, so it is slower than no
    /// speculation; it exists to test speculation end to end (greedy acceptance must be 100%).
    SelfDraft,
    /// `layer-skip:L`: the first `L` decoder layers of the target, then its final norm, LM head
    /// and sampling (an early exit): L / num_layers of the layers' weight reads per draft token.
    LayerSkip(u64),
}

/// The draft kinds `--draft` takes, for error messages and help.
pub const DRAFT_KINDS: &str = "self, layer-skip:L (the first L decoder layers, 1 to num_layers - 1)";

/// The draft tokens per round when `--draft-k` is not given.
pub const DEFAULT_DRAFT_K: u64 = 4;

/// The most draft tokens per round (`--draft-k`).
pub const MAX_DRAFT_K: u64 = 16;

impl std::str::FromStr for DraftKind {
    type Err = String;

    /// `self` or `layer-skip:L`; the range of L is checked against the config
    /// ([`check_draft`]).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.split_once(':') {
            None if s == "self" => Ok(DraftKind::SelfDraft),
            None if s == "layer-skip" => Err("draft kind `layer-skip` needs the number of layers the draft keeps: layer-skip:L (e.g. layer-skip:4)".into()),
            Some(("layer-skip", l)) => match l.parse::<u64>() {
                Ok(l) => Ok(DraftKind::LayerSkip(l)),
                Err(_) => Err(format!("draft kind `{s}`: L must be a whole number of decoder layers (e.g. layer-skip:4)")),
            },
            _ => Err(format!("unknown draft kind `{s}`: supported: {DRAFT_KINDS}")),
        }
    }
}

impl std::fmt::Display for DraftKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftKind::SelfDraft => write!(f, "self"),
            DraftKind::LayerSkip(l) => write!(f, "layer-skip:{l}"),
        }
    }
}

/// `--draft KIND --draft-k K`: which draft, and how many tokens it proposes per round (the
/// manifest's `speculative.k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draft {
    pub kind: DraftKind,
    pub k: u64,
}

impl Draft {
    /// The decoder layers the draft runs (and keeps KV for) in a model of `layers` layers.
    pub fn layers(&self, layers: u64) -> u64 {
        match self.kind {
            DraftKind::SelfDraft => layers,
            DraftKind::LayerSkip(l) => l,
        }
    }
}

/// Whether `draft` can be written for `cfg` under tensor parallelism `tp`. Every reason.
pub fn check_draft(cfg: &Config, draft: &Draft, tp: Option<u64>) -> std::result::Result<(), String> {
    let mut why = vec![];
    let n = cfg.num_hidden_layers;
    if let DraftKind::LayerSkip(l) = draft.kind {
        if n < 2 {
            why.push(format!("--draft {}: the model has {n} decoder layer(s); a layer-skip draft keeps fewer layers than the model, so it needs at least 2 (--draft self works)", draft.kind));
        } else if l == 0 || l >= n {
            why.push(format!("--draft {}: L must be between 1 and {} (the model has {n} decoder layers; the draft keeps the first L)", draft.kind, n - 1));
        }
    }
    if !(1..=MAX_DRAFT_K).contains(&draft.k) {
        why.push(format!("--draft-k {}: the draft proposes 1 to {MAX_DRAFT_K} tokens per verify step", draft.k));
    }
    if let Some(t) = tp.filter(|&t| t > 1) {
        why.push(format!("--draft with --tp {t}: speculative drafts are not supported with tensor parallelism yet (pack without --tp, or with --tp 1)"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("; "))
    }
}

/// Writes `out/model.json` and copies the cubins it references into `out`. Weight sources name
/// the Hugging Face safetensors tensors (`model.layers.0.self_attn.q_proj.weight`, ...).
pub fn generate(cfg: &Config, opts: &PackOptions, out: &Path) -> Result<PathBuf> {
    if cfg.tensor_prefix == "model." {
        return write(cfg, opts, out, |_| Ok(()));
    }
    write(cfg, opts, out, |m| crate::gguf::rename_sources(m, &|hf| Some(crate::gguf::with_prefix(hf, &cfg.tensor_prefix))))
}

/// [`generate`] for a GGUF checkpoint: the same manifest, with weight sources naming the GGUF
/// tensors (`blk.0.attn_q.weight`, ...; the family's table, [`crate::families::gguf_name`]).
pub fn generate_for_gguf(cfg: &Config, opts: &PackOptions, out: &Path) -> Result<PathBuf> {
    write(cfg, opts, out, |m| crate::gguf::rename_sources(m, &|hf| crate::families::gguf_name(cfg, hf)))
}

/// Whether `--decode-fusion on` can be written for `cfg`: the fused GEMVs implement blocks with
/// two norms (`w · bf16(x̂)` or zero-centred `(off + w)`) or four zero-centred ones (sandwich:
/// Gemma 3), SwiGLU or GeGLU-tanh MLPs, without O or MLP biases, hidden and intermediate sizes a
/// multiple of 8 (the GEMVs' K).
pub fn fusion_supported(cfg: &Config) -> std::result::Result<(), String> {
    let mut why = vec![];
    if cfg.sandwich_norms && cfg.norm == crate::config::NormKind::Scale {
        why.push("four norms per block with w · bf16(x) norms (the sandwich GEMV has the (off + w) form only)");
    }
    if cfg.o_bias || cfg.mlp_bias {
        why.push("O / MLP biases");
    }
    if !cfg.hidden_size.is_multiple_of(8) || !cfg.intermediate_size.is_multiple_of(8) {
        why.push("a hidden or intermediate size that is not a multiple of 8");
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("--decode-fusion on: the fused decode GEMVs do not implement {} ({}); pack with --decode-fusion off", why.join(", "), cfg.model_type))
    }
}

/// Whether `--batch-invariant` can be written for `cfg` and `opts`. Attention: the tensor-core
/// prefill kernel where it takes the heads (head_dim 64 or 128, at most 16 query heads per kv
/// head), else the SIMT `attention_dD` (head_dim 256: Gemma 3, the hybrids' gated attention) —
/// both keep a row's bits in any step (host emulation). The weights must be bf16 (the FP8 and
/// GGUF-block kernels switch arithmetic with M too). A hybrid's Gated DeltaNet layers run the
/// recurrent rule at every step size (the chunked rule sums a chunk in another order), which
/// walks a row's tokens one by one: the fp32 state then holds the same bits wherever a prompt is
/// cut; the bf16 state, rounded at every step's end, does not, so it is refused.
pub fn check_batch_invariant(cfg: &Config, opts: &PackOptions) -> std::result::Result<(), String> {
    let mut why = vec![];
    if !opts.native.is_empty() {
        why.push("GGUF-native weights (pack with --dequantize)".to_string());
    }
    if !opts.fp8.weights.is_empty() {
        why.push("FP8 weights".to_string());
    }
    if cfg.hybrid.is_some() && opts.gdn_state != crate::gdn::GdnState::F32 {
        why.push("--gdn-state bf16 (the state is rounded at every step's end, so a prompt cut elsewhere rounds elsewhere; pack with --gdn-state f32)".to_string());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("--batch-invariant: not for this model and options: {} ({})", why.join("; "), cfg.model_type))
    }
}

fn write(cfg: &Config, opts: &PackOptions, out: &Path, edit: impl FnOnce(&mut Value) -> Result<()>) -> Result<PathBuf> {
    cfg.validate().map_err(PackError::Config)?;
    if let Some(tp) = opts.tp {
        check_tp(cfg, tp).map_err(PackError::Config)?;
    }
    if let Some(draft) = &opts.draft {
        check_draft(cfg, draft, opts.tp).map_err(PackError::Config)?;
    }
    crate::moe::check(cfg, opts).map_err(PackError::Config)?;
    crate::gdn::check(cfg, opts).map_err(PackError::Config)?;
    if opts.max_tokens == 0 || opts.max_seqs == 0 || opts.max_context == 0 || opts.page_tokens == 0 {
        return Err(PackError::Config("max tokens, seqs, context and page tokens must all be positive".into()));
    }
    if opts.decode_attention == DecodeAttention::Split {
        check_split_decode(cfg).map_err(PackError::Config)?;
    }
    let mut opts = opts.clone();
    opts.prefill_attention = prefill_attention_for(cfg, opts.prefill_attention);
    if opts.batch_invariant {
        check_batch_invariant(cfg, &opts).map_err(PackError::Config)?;
        opts.batch_gemm = BatchGemm::Invariant;
        opts.decode_attention = DecodeAttention::Plain;
        // The tensor-core kernel where it takes the heads, else attention_dD, for every step.
        opts.prefill_attention = if check_prefill_tc(cfg).is_ok() { PrefillAttention::Tc } else { PrefillAttention::Simt };
    }
    let opts = &opts;
    if opts.prefill_attention == PrefillAttention::Tc {
        check_prefill_tc(cfg).map_err(PackError::Config)?;
    }
    if opts.decode_fusion {
        fusion_supported(cfg).map_err(PackError::Config)?;
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut modules = Map::new();
    let split = (opts.decode_attention == DecodeAttention::Split).then_some(DECODE_MODULE);
    let prefill_tc = (opts.prefill_attention == PrefillAttention::Tc).then_some(PREFILL_MODULE);
    // The wide GEMMs run for 9..64 rows: only when a step can have 9 rows (tokens, or seqs for the LM head).
    let wide = (opts.batch_gemm != BatchGemm::Skinny && opts.max_tokens.max(opts.max_seqs) >= 9).then_some(WIDE_MODULE);
    // With split decode and tensor-core prefill, attention_dD runs for no step size; batch-invariant
    // packs run no attention_dD.
    let unused = |m: &&str| {
        (*m == "attention" && split.is_some() && prefill_tc.is_some())
            || (*m == "attention" && opts.batch_invariant && prefill_tc.is_some())
            || (*m == "rope" && cfg.hybrid.is_some())
    };
    for m in MODULES.iter().copied().filter(|m| !unused(m)).chain(split).chain(prefill_tc).chain(wide).chain(crate::moe::module(cfg)).chain(crate::gdn::modules(cfg)) {
        // With --pdl, the build of each non-GEMM module whose kernels wait first (the GEMM
        // kernels always wait after their weight prefetch).
        let file = if (opts.pdl || opts.pdl_small_steps) && !m.starts_with("gemm_") { format!("{m}.pdl.sm_90a.cubin") } else { format!("{m}.sm_90a.cubin") };
        let sha = copy_module(&opts.kernels, &file, out)?;
        modules.insert(m.to_string(), json!({"source": file, "sha256": sha}));
    }
    let mut m = build(cfg, opts, Value::Object(modules));
    if opts.pdl_small_steps && !opts.pdl {
        pdl_for_small_steps(&mut m, opts.max_tokens, opts.max_seqs);
    }
    if opts.pdl {
        for op in m["ops"].as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
            for l in op.get_mut("impl").and_then(|i| i.get_mut("launches")).and_then(Value::as_array_mut).into_iter().flatten() {
                l["pdl"] = json!(true);
            }
        }
    }
    edit(&mut m)?;
    if !opts.native.is_empty() {
        let native = crate::quant::apply(&mut m, &|t| opts.native.get(t).copied(), opts.max_tokens, opts.pdl || opts.pdl_small_steps).map_err(PackError::Config)?;
        for module in native.modules {
            let file = if (opts.pdl || opts.pdl_small_steps) && module == crate::quant::EMBED_MODULE { format!("{module}.pdl.sm_90a.cubin") } else { format!("{module}.sm_90a.cubin") };
            let sha = copy_module(&opts.kernels, &file, out)?;
            m["modules"][module] = json!({"source": file, "sha256": sha});
        }
    }
    if !opts.fp8.weights.is_empty() {
        let fp8 = crate::fp8::apply(&mut m, &opts.fp8, opts.max_tokens, opts.pdl || opts.pdl_small_steps).map_err(PackError::Config)?;
        for module in fp8.modules {
            let file = format!("{module}.sm_90a.cubin");
            let sha = copy_module(&opts.kernels, &file, out)?;
            m["modules"][module] = json!({"source": file, "sha256": sha});
        }
    }
    let path = out.join("model.json");
    let text = serde_json::to_string_pretty(&m).map_err(|e| PackError::Config(e.to_string()))?;
    std::fs::write(&path, text + "\n").map_err(io(&path))?;
    Ok(path)
}

/// Copies the cubin `file` from the kernel directory into `out`; its SHA-256.
fn copy_module(kernels: &Path, file: &str, out: &Path) -> Result<String> {
    let src = kernels.join(file);
    let bytes = std::fs::read(&src)
        .map_err(|e| PackError::Config(format!("{}: {e}: build the pack's kernels first (bash packs/kernels/build.sh) or pass --kernels DIR", src.display())))?;
    let dst = out.join(file);
    std::fs::write(&dst, &bytes).map_err(io(&dst))?;
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

/// The most tokens of a step that `--pdl-small-steps` launches with PDL: the `gemv_bf16` bucket.
pub const PDL_SMALL_TOKENS: u64 = 8;

/// `--pdl-small-steps`: PDL for every launch of a step of at most [`PDL_SMALL_TOKENS`] tokens.
/// A GEMM launch is already specific to its step sizes: the `gemv_bf16*` ones (1..8 rows) get
/// the attribute (also the LM head's, whose rows are the sequences: a prefill step of at most 8
/// sequences launches that one GEMV with PDL). Every other launch is split into a PDL copy whose grid is multiplied by
/// "tokens <= 8" and a plain copy multiplied by "tokens > 8"; a copy that no step the vars allow
/// can run (its grid is 0 for every tokens / seqs: e.g. a decode-only launch above 8 tokens when
/// at most 8 sequences fit, or a launch already gated to more than 8 tokens) is left out, as
/// `kern check` refuses launches that never run.
fn pdl_for_small_steps(m: &mut Value, max_tokens: u64, max_seqs: u64) {
    let small = format!("max(0, min(1, {} - tokens))", PDL_SMALL_TOKENS + 1);
    let large = format!("max(0, min(1, tokens - {PDL_SMALL_TOKENS}))");
    // Whether some (tokens, seqs) the vars allow gives every grid dimension of `l` a positive
    // size (`pages` at its maximum, as the step's block table is sized).
    let var = |n: &str| ["tokens", "seqs", "pages"].iter().position(|v| *v == n);
    let pages = m["vars"]["pages"]["max"].as_i64().unwrap_or(1);
    let sample = |max: u64| (1..=max.min(80) as i64).chain(std::iter::once(max as i64)).collect::<Vec<i64>>();
    let (ts, ss) = (sample(max_tokens), sample(max_seqs));
    let runs = |l: &Value| -> bool {
        let dims: Vec<kern_manifest::Expr> = l["grid"].as_array().into_iter().flatten().filter_map(|g| {
            let text = match g { Value::String(s) => s.clone(), v => v.to_string() };
            kern_manifest::Expr::parse(&text, var).ok()
        }).collect();
        ts.iter().any(|&t| ss.iter().any(|&s| dims.iter().all(|e| e.eval(&[t, s, pages]).is_ok_and(|x| x > 0))))
    };
    for op in m["ops"].as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
        // (get_mut, not indexing: indexing a missing key would insert a null `launches` into an
        // op without launches, such as a collective)
        let Some(launches) = op.get_mut("impl").and_then(|i| i.get_mut("launches")).and_then(Value::as_array_mut) else { continue };
        let mut out = Vec::with_capacity(launches.len() * 2);
        for mut l in launches.drain(..) {
            let module = l["module"].as_str().unwrap_or_default().to_string();
            let entry = l["entry"].as_str().unwrap_or_default().to_string();
            let g0 = match &l["grid"][0] {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            if module.starts_with("gemm_") {
                if entry.starts_with("gemv_bf16") {
                    l["pdl"] = json!(true);
                }
                out.push(l);
            } else {
                let mut a = l.clone();
                a["grid"][0] = json!(format!("({g0}) * {small}"));
                a["pdl"] = json!(true);
                l["grid"][0] = json!(format!("({g0}) * {large}"));
                match (runs(&a), runs(&l)) {
                    (true, true) => out.extend([a, l]),
                    (true, false) => {
                        a["grid"][0] = json!(g0);
                        out.push(a);
                    }
                    (false, _) => {
                        l["grid"][0] = json!(g0);
                        out.push(l);
                    }
                }
            }
        }
        *launches = out;
    }
}

/// Whether the split-KV decode kernels take `cfg`'s attention shape (`--decode-attention split`).
pub fn check_split_decode(cfg: &Config) -> std::result::Result<(), String> {
    let (hq, hkv, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
    let mut why = vec![];
    if d != 64 && d != 128 && d != 256 {
        why.push(format!("head_dim {d} (the kernels are built for 64, 128 and 256)"));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) || hq / hkv > DECODE_MAX_GROUP {
        why.push(format!("{hq} query heads over {hkv} kv heads (the kernel takes whole groups of at most {DECODE_MAX_GROUP} query heads per kv head)"));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("--decode-attention split: {}; pack with --decode-attention plain", why.join("; ")))
    }
}

/// Whether `cfg` splits over `tp` ranks: attention heads, kv heads and the intermediate size
/// divide (each rank keeps whole heads and a GEMM K that is a multiple of 8). Every reason.
pub fn check_tp(cfg: &Config, tp: u64) -> std::result::Result<(), String> {
    if tp == 0 {
        return Err("--tp 0: the tensor-parallel size is at least 1".into());
    }
    let mut why = vec![];
    let (hq, hkv, i) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.intermediate_size);
    if !hq.is_multiple_of(tp) {
        why.push(format!("num_attention_heads {hq} does not divide into {tp} ranks"));
    }
    if !hkv.is_multiple_of(tp) {
        why.push(format!("num_key_value_heads {hkv} does not divide into {tp} ranks (the pack does not replicate kv heads)"));
    }
    if !i.is_multiple_of(tp) || !(i / tp).is_multiple_of(8) {
        why.push(format!("intermediate_size {i} does not divide into {tp} ranks of a multiple of 8 (the down GEMM's K)"));
    }
    if tp > 1 && (cfg.o_bias || cfg.mlp_bias) {
        why.push("the O / down projections have biases, which every rank's partial sum would add once more before the all-reduce (not supported yet)".to_string());
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(format!("--tp {tp}: {}; pick a tensor-parallel size that divides them ({})", why.join("; "), divisors(cfg).join(", ")))
    }
}

/// The tensor-parallel sizes `cfg` allows, as text.
fn divisors(cfg: &Config) -> Vec<String> {
    (1..=cfg.kv_heads()).filter(|&t| check_tp_quiet(cfg, t)).map(|t| t.to_string()).collect()
}

fn check_tp_quiet(cfg: &Config, t: u64) -> bool {
    cfg.num_attention_heads.is_multiple_of(t)
        && cfg.kv_heads().is_multiple_of(t)
        && cfg.intermediate_size.is_multiple_of(t)
        && (cfg.intermediate_size / t).is_multiple_of(8)
}

/// Model dimensions as the manifest writes them: per rank where tensor parallelism splits
/// them (`hq`, `hkv`, `i`, `qkv`), whole otherwise.
struct Dims {
    h: u64,
    i: u64,
    layers: u64,
    /// The softmax-attention layers (the KV cache's): all of them but a hybrid's GDN layers.
    attn_layers: u64,
    hq: u64,
    hkv: u64,
    d: u64,
    v: u64,
    qkv: u64,
}

fn bf16(shape: Value) -> Value {
    json!({"dtype": "bf16", "shape": shape})
}

fn weight(shape: Value, from: Value) -> Value {
    json!({"dtype": "bf16", "shape": shape, "role": "weight", "from": from})
}

fn input(dtype: &str, shape: Value) -> Value {
    json!({"dtype": dtype, "shape": shape, "role": "input"})
}

/// The launches of a GEMM `y[M, N] = x[M, K] · W[N, K]ᵀ (+ bias)` with M = the var `m`: one
/// per M range, each with a grid that is 0 — "skip this launch" (docs/manifest.md) — outside
/// its range, so exactly one runs for any M, chosen from the var's value at run time (or at a
/// CUDA graph's bucket). Ranges and recipes from packs/kernels/GEMM.md and its H200 timings:
/// the GEMV for decode, skinny tensor-core kernels up to 64 rows, wgmma above. The skinny
/// entries are the 8-warp family for every M range, whose per-row reduction order does not
/// depend on M, so a row's bits do not depend on which range ran (speculative verification =
/// plain decoding). The cluster family `*_cC` (split-K over a thread-block cluster) is built
/// and verified but measured slower at M = 1 on the narrow shapes it was made for (GEMM.md,
/// 2026-12-02), so no manifest uses it. With [`BatchGemm::Wide`] the 9..64 ranges run
/// gemm_wide.cu's entries instead (clusters of 8 CTAs, grid `ceil(N/64)·8`), same bits.
fn gemm_launches(n: u64, k: u64, m: &str, m_max: u64, f32_out: bool, batch: BatchGemm) -> Vec<Value> {
    let sfx = if f32_out { "_f32out" } else { "" };
    let out = if f32_out { "out buffer<f32>" } else { "out buffer<bf16>" };
    // 1 when lo <= m <= hi, else 0 (integer expressions have no comparisons).
    let within = |lo: u64, hi: Option<u64>| {
        let lower = format!("max(0, min(1, {m} - {}))", lo - 1);
        match hi {
            Some(hi) => format!("{lower} * max(0, min(1, {} - {m}))", hi + 1),
            None => lower,
        }
    };
    let launch = |module: &str, entry: String, grid: Value, block: u64, shared: u64| {
        json!({
            "module": module, "entry": entry,
            "params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", out, "i32", "i32", "i32"],
            "block": [block], "grid": grid, "shared": shared,
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"i32": n}, {"i32": k}]
        })
    };
    // 128 threads, ceil(n/16)·C CTAs (a multiple of the cluster size C, as the kernel needs).
    let skinny = |entry: &str, lo: u64, hi: u64| launch("gemm_skinny", format!("{entry}{sfx}"), json!([format!("ceil({n}/16) * {}", within(lo, Some(hi)))]), 256, 0);
    let (wg, bn) = if n >= 4096 { ("gemm_bf16_wgmma", 256) } else { ("gemm_bf16_wgmma_n128", 128) };
    // Only the ranges the var can reach: a launch that could never run is an error.
    let mut out = Vec::new();
    // 128 threads, clusters of 8 CTAs (__cluster_dims__): ceil(n/64)·8 CTAs.
    let wide = |entry: &str, lo: u64, hi: u64| launch(WIDE_MODULE, format!("{entry}{sfx}"), json!([format!("ceil({n}/64) * 8 * {}", within(lo, Some(hi)))]), 128, 0);
    for (entry, lo, hi) in [("gemv_bf16", 1, 8), ("gemm_bf16_m16", 9, 16), ("gemm_bf16_m32", 17, 32), ("gemm_bf16_m64", 33, 64)] {
        if lo > m_max {
            continue;
        }
        // Measured (gemm_verify.py, H200, 2026-12-02, GEMM.md): the wide entries win at 33..64
        // rows on every Qwen shape, at 17..32 rows when K >= 2560 (at K <= 2048 a CTA has too
        // few chunks), and lose at 9..16 rows on most shapes, which keep gemm_bf16_m16.
        let use_wide = batch != BatchGemm::Skinny && (lo >= 33 || (lo >= 17 && k >= 2560));
        if batch == BatchGemm::Invariant && lo == 33 {
            // 33..64 rows: gemm_bf16_w64 (the 8-warp family's bits).
            out.push(launch(WIDE_MODULE, format!("gemm_bf16_w64{sfx}"), json!([format!("ceil({n}/64) * 8 * {}", within(33, Some(64)))]), 128, 0));
            continue;
        }
        out.push(if use_wide { wide(&entry.replace("_m", "_w"), lo, hi) } else { skinny(entry, lo, hi) });
    }
    if m_max >= 65 {
        // Invariant: the wgmma GEMM in the GEMV family's order (gemm_wgmma.cu, "GEMV order"):
        // a row's bits equal the GEMV's, so every step size gives a row the same projection.
        let (wg, bn) = if batch == BatchGemm::Invariant { ("gemm_bf16_wgmma_gv", 128) } else { (wg, bn) };
        out.push(launch("gemm_wgmma", format!("{wg}{sfx}"), json!([format!("ceil({m}/128) * {}", within(65, None)), format!("ceil({n}/{bn})")]), 256, 197632));
    }
    out
}

fn build(cfg: &Config, opts: &PackOptions, modules: Value) -> Value {
    // One rank's share: whole heads, a slice of the intermediate size (check_tp ran).
    let tp = opts.tp.unwrap_or(1);
    let d = Dims {
        h: cfg.hidden_size,
        i: cfg.intermediate_size / tp,
        layers: cfg.num_hidden_layers,
        attn_layers: crate::gdn::attn_layers(cfg),
        hq: cfg.num_attention_heads / tp,
        hkv: cfg.kv_heads() / tp,
        d: cfg.head_dim(),
        v: cfg.vocab_size,
        // A hybrid's q projection writes [q | gate] per head (crate::gdn).
        qkv: (cfg.num_attention_heads * if cfg.hybrid.is_some() { 2 } else { 1 } + 2 * cfg.kv_heads()) / tp * cfg.head_dim(),
    };
    let gated = cfg.hybrid.is_some();
    // The q projection's rows per head: q, or [q | gate].
    let q_rows = if gated { 2 * d.hq * d.d } else { d.hq * d.d };
    // Column-parallel weights are cut along their output rows (dim 0), row-parallel ones along
    // their input columns (dim 1); each rank takes the part of its rank.
    let shard = |dim: u64| json!({"dim": dim, "parts": tp, "part": "rank"});
    let with_shard = |mut from: Value, dim: u64| {
        if opts.tp.is_some() {
            from["shard"] = shard(dim);
        }
        from
    };
    let pages = opts.max_context.div_ceil(opts.page_tokens);
    let eps = cfg.rms_norm_eps;
    let bias = cfg.qkv_bias();
    let qk_norm = cfg.qk_norm();
    let sandwich = cfg.sandwich_norms;

    // ---- buffers: step inputs, activations, weights, outputs
    let mut b = Map::new();
    for (name, dtype, shape) in [
        ("token_ids", "i32", json!(["tokens"])),
        ("positions", "i32", json!(["tokens"])),
        ("seq_lens", "i32", json!(["seqs"])),
        ("query_start", "i32", json!(["seqs+1"])),
        ("slot_mapping", "i32", json!(["tokens"])),
        ("block_tables", "i32", json!(["seqs", "pages"])),
        ("last_token", "i32", json!(["seqs"])),
        ("temperature", "f32", json!(["seqs"])),
        ("top_k", "i32", json!(["seqs"])),
        ("top_p", "f32", json!(["seqs"])),
        ("seeds", "u64", json!(["seqs"])),
        // Constrained decoding (docs/step-abi.md, "Token masks"): per row -1 (free) or its row
        // of allowed-token bits; the sampler never picks a token whose bit is 0.
        ("token_mask", "u32", json!(["seqs", d.v.div_ceil(32)])),
        ("mask_rows", "i32", json!(["seqs"])),
    ] {
        b.insert(name.into(), input(dtype, shape));
    }
    let f32_res = opts.residual == Residual::F32;
    // The residual stream: bf16, or fp32 with `--residual f32`.
    let res = |shape: Value| if f32_res { json!({"dtype": "f32", "shape": shape}) } else { bf16(shape) };
    let rt = if f32_res { "f32" } else { "bf16" };
    b.insert("x".into(), res(json!(["tokens", d.h])));
    // The fused program (crate::fused): with sandwich norms its residual ping-pongs between x and x2.
    let fused = opts.decode_fusion && f32_res && opts.tp.is_none();
    let x2 = fused && sandwich;
    if x2 {
        b.insert("x2".into(), res(json!(["tokens", d.h])));
    }
    b.insert("h".into(), bf16(json!(["tokens", d.h])));
    b.insert("qkv".into(), bf16(json!(["tokens", d.qkv])));
    b.insert("attn".into(), bf16(json!(["tokens", d.hq * d.d])));
    if gated {
        // The gated attention's normalized, rotated q (attention reads it instead of qkv's rows).
        b.insert("q".into(), bf16(json!(["tokens", d.hq * d.d])));
    }
    let split = opts.decode_attention == DecodeAttention::Split;
    if split {
        // The split kernel's fp32 partial results (decode steps only), sized for every decode
        // step the vars allow.
        let n = decode_scratch_floats(opts.max_tokens, opts.max_seqs, d.hkv, d.hq, d.d);
        b.insert("attn_partial".into(), json!({"dtype": "f32", "shape": [n]}));
    }
    b.insert("o".into(), bf16(json!(["tokens", d.h])));
    if sandwich {
        // The post-attention and post-MLP norms' outputs (Gemma 3), added to the residual.
        b.insert("o_norm".into(), bf16(json!(["tokens", d.h])));
        b.insert("mlp_norm".into(), bf16(json!(["tokens", d.h])));
    }
    b.insert("gate_up".into(), bf16(json!(["tokens", 2 * d.i])));
    b.insert("act".into(), bf16(json!(["tokens", d.i])));
    b.insert("mlp".into(), bf16(json!(["tokens", d.h])));
    b.insert("x_last".into(), res(json!(["seqs", d.h])));
    b.insert("mlp_last".into(), bf16(json!(["seqs", d.h])));
    b.insert("h_last".into(), bf16(json!(["seqs", d.h])));
    b.insert("logits".into(), json!({"dtype": "f32", "shape": ["seqs", d.v], "role": "output"}));
    b.insert("sampled".into(), json!({"dtype": "i32", "shape": ["seqs"], "role": "output"}));

    b.insert("model.embed_tokens.weight".into(), weight(json!([d.v, d.h]), json!({"tensor": "model.embed_tokens.weight"})));
    for l in 0..d.layers {
        let p = format!("model.layers.{l}");
        b.insert(format!("{p}.input_layernorm.weight"), weight(json!([d.h]), json!({"tensor": format!("{p}.input_layernorm.weight")})));
        // A GDN layer's token mixer: its projections, conv, gates and norm (crate::gdn).
        if !crate::gdn::layer_weights(cfg, l, &mut b) {
            b.insert(
                format!("{p}.self_attn.qkv_proj.weight"),
                weight(
                    json!([d.qkv, d.h]),
                    with_shard(json!({"concat": [format!("{p}.self_attn.q_proj.weight"), format!("{p}.self_attn.k_proj.weight"), format!("{p}.self_attn.v_proj.weight")],
                           "axis": 0, "sizes": [q_rows, d.hkv * d.d, d.hkv * d.d]}), 0),
                ),
            );
            if bias {
                b.insert(
                    format!("{p}.self_attn.qkv_proj.bias"),
                    weight(
                        json!([d.qkv]),
                        with_shard(json!({"concat": [format!("{p}.self_attn.q_proj.bias"), format!("{p}.self_attn.k_proj.bias"), format!("{p}.self_attn.v_proj.bias")],
                               "axis": 0, "sizes": [d.hq * d.d, d.hkv * d.d, d.hkv * d.d]}), 0),
                    ),
                );
            }
            if qk_norm {
                b.insert(format!("{p}.self_attn.q_norm.weight"), weight(json!([d.d]), json!({"tensor": format!("{p}.self_attn.q_norm.weight")})));
                b.insert(format!("{p}.self_attn.k_norm.weight"), weight(json!([d.d]), json!({"tensor": format!("{p}.self_attn.k_norm.weight")})));
            }
            b.insert(format!("{p}.self_attn.o_proj.weight"), weight(json!([d.h, d.hq * d.d]), with_shard(json!({"tensor": format!("{p}.self_attn.o_proj.weight")}), 1)));
            if cfg.o_bias {
                // A row-parallel GEMM's bias is added once, after the all-reduce would sum it tp
                // times: with tensor parallelism each rank adds its share (bias / tp is not exact),
                // so --tp refuses O / MLP biases (check_tp).
                b.insert(format!("{p}.self_attn.o_proj.bias"), weight(json!([d.h]), json!({"tensor": format!("{p}.self_attn.o_proj.bias")})));
            }
        }
        b.insert(format!("{p}.post_attention_layernorm.weight"), weight(json!([d.h]), json!({"tensor": format!("{p}.post_attention_layernorm.weight")})));
        if sandwich {
            for n in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                b.insert(format!("{p}.{n}.weight"), weight(json!([d.h]), json!({"tensor": format!("{p}.{n}.weight")})));
            }
        }
        if crate::moe::layer_weights(cfg, l, &mut b) {
            continue; // a mixture-of-experts layer: its router and experts instead (crate::moe)
        }
        b.insert(
            format!("{p}.mlp.gate_up_proj.weight"),
            weight(json!([2 * d.i, d.h]), with_shard(json!({"concat": [format!("{p}.mlp.gate_proj.weight"), format!("{p}.mlp.up_proj.weight")], "axis": 0, "sizes": [d.i, d.i]}), 0)),
        );
        b.insert(format!("{p}.mlp.down_proj.weight"), weight(json!([d.h, d.i]), with_shard(json!({"tensor": format!("{p}.mlp.down_proj.weight")}), 1)));
        if cfg.mlp_bias {
            b.insert(
                format!("{p}.mlp.gate_up_proj.bias"),
                weight(json!([2 * d.i]), with_shard(json!({"concat": [format!("{p}.mlp.gate_proj.bias"), format!("{p}.mlp.up_proj.bias")], "axis": 0, "sizes": [d.i, d.i]}), 0)),
            );
            b.insert(format!("{p}.mlp.down_proj.bias"), weight(json!([d.h]), json!({"tensor": format!("{p}.mlp.down_proj.bias")})));
        }
    }
    // RoPE frequency tables of scaled RoPEs (llama3, linear, YaRN, GGUF divisors), written into
    // the manifest; plain RoPE passes a null table and the kernel computes theta^(-2i/d).
    let ropes = rope_kinds(cfg);
    for r in &ropes {
        if let Some(t) = &r.table {
            let values: Vec<f64> = t.iter().map(|&x| f64::from(x)).collect();
            b.insert(r.buffer.clone(), json!({"dtype": "f32", "shape": [t.len()], "role": "weight", "from": {"values": values}}));
        }
    }
    b.insert("model.norm.weight".into(), weight(json!([d.h]), json!({"tensor": "model.norm.weight"})));
    let lm_head = if cfg.tie_word_embeddings { json!({"alias": "model.embed_tokens.weight"}) } else { json!({"tensor": "lm_head.weight"}) };
    b.insert("lm_head.weight".into(), weight(json!([d.v, d.h]), lm_head));

    // ---- ops
    let bq = 32 / (d.hq / d.hkv);
    let attn_entry = format!("attention_d{}", d.d);
    // Qwen2's QKV bias is added by the qkv GEMM's fp32 epilogue (one rounding, like
    // F.linear), so the RoPE kernel's own bias flag (bit 1) stays off: setting both would add
    // it twice.
    // Flags of qk_norm_rope (rope.cu): 1 q/k norm, 4 the norm in Gemma's fp32 (off + w) form,
    // 8 adjacent RoPE pairs (GGUF llama).
    let (norm_f32, norm_off) = match cfg.norm {
        NormKind::Scale => (0, 0.0),
        NormKind::Offset(off) => (4, off),
    };
    let rope_flags = i64::from(qk_norm) * (1 + norm_f32) + if cfg.rope_pairs == RopePairs::Adjacent { 8 } else { 0 };
    // The KV kernels address a layer of a per-token state by (layer, num_layers): a state
    // holding `num_layers` layers per token (`kv`: all of them; a layer-skip draft's
    // `draft_kv`: its first L). The state and the layer index are call arguments, and so are
    // the layer's RoPE base, frequency table (null: computed from the base) and cos/sin scale:
    // Gemma's sliding and global layers rotate differently (rope_kinds).
    let rope_op = |num_layers: u64| {
        json!({
            "params": ["inout buffer<bf16>", "state", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<i32>", "i32", "i32",
                       "f32", "ptr", "f32"],
            "impl": {"launches": [{
                "module": "rope", "entry": "qk_norm_rope",
                "params": ["inout buffer<bf16>", "ptr", "in buffer<bf16>", "in buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "in buffer<i32>",
                           "i32", "i32", "i32", "i32", "i32", "i32", "i32", "f32", "f32", "i32", "ptr", "f32", "f32"],
                "block": [256], "grid": ["tokens", d.qkv / d.d / 8 + u64::from(!(d.qkv / d.d).is_multiple_of(8))],
                "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6},
                         {"param": 7}, {"i32": d.hq}, {"i32": d.hkv}, {"i32": d.d}, {"param": 8}, {"i32": num_layers},
                         {"i32": opts.page_tokens}, {"param": 9}, {"f32": eps}, {"i32": rope_flags}, {"param": 10}, {"param": 11},
                         {"f32": norm_off}]}]}})
    };
    let scale = cfg.attn_scale();
    // Attention's q rows: qkv's, or the gated attention's own q buffer (crate::gdn).
    let q_ld = if gated { d.hq * d.d } else { d.qkv };
    // --prefill-attention tc: steps with tokens > seqs launch attention_prefill_dD (attention_dD's
    // params and args; PREFILL_ROWS / G tokens per CTA), the others keep the decode choice.
    let tc = opts.prefill_attention == PrefillAttention::Tc;
    let tc_launch = |l: &Value| {
        let mut l = l.clone();
        l["module"] = json!(PREFILL_MODULE);
        l["entry"] = json!(format!("attention_prefill_d{}", d.d));
        l["grid"][0] = json!(format!("(ceil(tokens/{})+seqs) * max(0, min(1, tokens - seqs))", PREFILL_ROWS / (d.hq / d.hkv)));
        l
    };
    // The layer's sliding window (0: none) is the op's last parameter, a call argument.
    let window_param = if split { 11 } else { 10 };
    let attention_op = |num_layers: u64| {
        let mut plain = json!({
            "module": "attention", "entry": attn_entry,
            "params": ["out buffer<bf16>", "in buffer<bf16>", "ptr", "in buffer<i32>", "in buffer<i32>", "in buffer<i32>",
                       "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "f32", "i32"],
            "block": [128], "grid": [format!("ceil(tokens/{bq})+seqs"), d.hkv],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5},
                     {"param": 6}, {"param": 7}, {"param": 8}, {"i32": q_ld}, {"i32": d.hq}, {"i32": d.hkv}, {"param": 9},
                     {"i32": num_layers}, {"i32": opts.page_tokens}, {"f32": scale}, {"param": window_param}]});
        if d.d == 256 {
            plain["shared"] = json!(ATT_SMEM_D256);
        }
        let mut params = json!(["out buffer<bf16>", "in buffer<bf16>", "state", "in buffer<i32>", "in buffer<i32>", "in buffer<i32>", "i32", "i32", "i32", "i32"]);
        if !split {
            params.as_array_mut().expect("array").push(json!("i32"));
        }
        if opts.batch_invariant && !tc {
            // One kernel for every step: attention_dD (head_dim 256), decode rows included.
            return json!({"params": params, "impl": {"launches": [plain]}});
        }
        if opts.batch_invariant {
            // One kernel for every step: the tensor-core prefill kernel, decode rows included
            // (its per-row bits do not depend on the step: host emulation, docs/batch-invariance.md).
            let mut all = tc_launch(&plain);
            all["grid"][0] = json!(format!("ceil(tokens/{})+seqs", PREFILL_ROWS / (d.hq / d.hkv)));
            return json!({"params": params, "impl": {"launches": [all]}});
        }
        if !split && tc {
            let mut decode = plain.clone();
            decode["grid"][0] = json!(format!("(ceil(tokens/{bq})+seqs) * max(0, min(1, seqs - tokens + 1))"));
            return json!({"params": params, "impl": {"launches": [tc_launch(&plain), decode]}});
        }
        if !split {
            return json!({"params": params, "impl": {"launches": [plain]}});
        }
        // Per-size choice (docs/manifest.md: a grid <= 0 skips its launch): steps with
        // tokens <= seqs (every row one token: decode and verify steps, at their CUDA-graph
        // buckets too) run the split-KV kernels, the others attention_dD. The last param is
        // the scratch (attn_partial) the combine reads.
        let decode = "max(0, min(1, seqs - tokens + 1))";
        let mut prefill = plain;
        prefill["grid"][0] = json!(format!("(ceil(tokens/{bq})+seqs) * max(0, min(1, tokens - seqs))"));
        if tc {
            prefill = tc_launch(&prefill);
        }
        // The grid's z (CTAs per row and kv head, decode_splits) is for occupancy only: the
        // kernel's chunking is fixed by the row and the constant max_chunks (its last arg).
        let splits = format!("min({}, cdiv({DECODE_GRID_CTAS}, seqs * {}))", decode_max_chunks(d.hkv), d.hkv);
        let mut params = params;
        params.as_array_mut().expect("array").extend([json!("out buffer<f32>"), json!("i32")]);
        let mut decode_launch = json!({"module": DECODE_MODULE, "entry": format!("attention_decode_d{}", d.d),
             "params": ["out buffer<f32>", "in buffer<bf16>", "ptr", "in buffer<i32>", "in buffer<i32>", "in buffer<i32>",
                        "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32", "f32", "i32", "i32", "i32"],
             "block": [128], "grid": [format!("tokens * {decode}"), d.hkv, splits],
             "args": [{"param": 10}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5},
                      {"param": 6}, {"param": 7}, {"param": 8}, {"i32": q_ld}, {"i32": d.hq}, {"i32": d.hkv}, {"param": 9},
                      {"i32": num_layers}, {"i32": opts.page_tokens}, {"f32": scale}, {"i32": DECODE_MIN_CHUNK},
                      {"i32": decode_max_chunks(d.hkv)}, {"param": window_param}]});
        if d.d == 256 {
            decode_launch["shared"] = json!(DEC_SMEM_D256);
        }
        json!({"params": params, "impl": {"launches": [
            prefill,
            decode_launch,
            {"module": DECODE_MODULE, "entry": format!("attention_combine_d{}", d.d),
             "params": ["out buffer<bf16>", "in buffer<f32>", "i32", "i32"],
             "block": [d.d], "grid": [format!("tokens * {decode}"), d.hq],
             "args": [{"param": 0}, {"param": 10}, {"param": 7}, {"i32": d.hq}]}
        ]}})
    };
    // The MLP's activation op (and kernel entry): SwiGLU or tanh-GeGLU.
    let act_op = match cfg.activation {
        Activation::Silu => "swiglu",
        Activation::GeluTanh => "geglu_tanh",
    };
    let mut ops = json!({
        "embedding": {"params": [format!("out buffer<{rt}>"), "in buffer<bf16>", "in buffer<i32>", "i32"], "impl": {"launches": [{
            "module": "rowwise", "entry": if f32_res { "embedding_f32" } else { "embedding" },
            "params": [format!("out buffer<{rt}>"), "in buffer<bf16>", "in buffer<i32>", "i32", "i32", "i32", "f32"],
            "block": [128], "grid": ["tokens"],
            "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"i32": d.h}, {"i32": d.v}, {"f32": cfg.embedding_scale()}]}]}},
        "rms_norm": rms_norm(rt, d.h, eps, cfg.norm),
        "add_rms_norm": add_rms_norm("tokens", d.h, eps, opts.residual, cfg.norm),
        "add_rms_norm_last": add_rms_norm("seqs", d.h, eps, opts.residual, cfg.norm),
        "qkv_proj": {"params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": gemm_launches(d.qkv, d.h, "tokens", opts.max_tokens, false, opts.batch_gemm)}},
        "o_proj": {"params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": gemm_launches(d.h, d.hq * d.d, "tokens", opts.max_tokens, false, opts.batch_gemm)}},
        "gate_up_proj": {"params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": gemm_launches(2 * d.i, d.h, "tokens", opts.max_tokens, false, opts.batch_gemm)}},
        "down_proj": {"params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<bf16>", "i32"], "impl": {"launches": gemm_launches(d.h, d.i, "tokens", opts.max_tokens, false, opts.batch_gemm)}},
        "lm_head": {"params": ["in buffer<bf16>", "in buffer<bf16>", "ptr", "out buffer<f32>", "i32"], "impl": {"launches": gemm_launches(d.v, d.h, "seqs", opts.max_seqs, true, opts.batch_gemm)}},
        "qk_norm_rope": rope_op(d.attn_layers),
        "attention": attention_op(d.attn_layers),
        act_op: {"params": ["out buffer<bf16>", "in buffer<bf16>", "i32"], "impl": {"launches": [{
            "module": "rowwise", "entry": act_op, "params": ["out buffer<bf16>", "in buffer<bf16>", "i32", "i32"],
            "block": [256], "grid": ["tokens"], "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"i32": d.i}]}]}},
        "gather_last": {"params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "i32", "i32"], "impl": {"launches": [{
            "module": "rowwise", "entry": "gather_last",
            "params": ["out buffer<bf16>", "in buffer<bf16>", "in buffer<i32>", "i32", "i32", "i32"],
            "block": [128], "grid": ["seqs"], "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"i32": d.h}]}]}},
        "sample": {"params": ["out buffer<i32>", "in buffer<f32>", "in buffer<f32>", "in buffer<i32>", "in buffer<f32>", "in buffer<u64>", "in buffer<i32>",
                             "in buffer<u32>", "in buffer<i32>", "i32"],
            "impl": {"launches": [{
                "module": "sampling", "entry": "sample_masked",
                "params": ["out buffer<i32>", "in buffer<f32>", "in buffer<f32>", "in buffer<i32>", "in buffer<f32>", "in buffer<u64>", "in buffer<i32>",
                           "in buffer<u32>", "in buffer<i32>", "i32", "i32", "i32"],
                "block": [512], "grid": ["seqs"],
                "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"param": 5}, {"param": 6},
                         {"param": 7}, {"param": 8}, {"i32": d.v.div_ceil(32)}, {"param": 9}, {"i32": d.v}]}]}}
    });

    if gated {
        // The hybrids' attention prologue (q [| gate] rows, partial RoPE) and output gate (crate::gdn).
        let (rope, gate) = crate::gdn::gated_attention_ops(cfg, d.hq, d.hkv, d.d, d.attn_layers, opts.page_tokens, rope_flags, norm_off);
        ops["qk_norm_rope"] = rope;
        ops["attn_output_gate"] = gate;
    }
    if sandwich {
        // Gemma 3's post-attention and post-MLP norms: a bf16 activation in, a bf16 one out.
        ops["post_norm"] = rms_norm("bf16", d.h, eps, cfg.norm);
    }
    if f32_res {
        ops["gather_last_f32"] = json!({"params": ["out buffer<f32>", "in buffer<f32>", "in buffer<i32>", "i32", "i32"], "impl": {"launches": [{
            "module": "rowwise", "entry": "gather_last_f32",
            "params": ["out buffer<f32>", "in buffer<f32>", "in buffer<i32>", "i32", "i32", "i32"],
            "block": [128], "grid": ["seqs"], "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"i32": d.h}]}]}});
    }
    if opts.tp.is_some() {
        ops["all_reduce"] = json!({"params": ["inout buffer<bf16>"], "impl": {"collective": "all_reduce_sum"}});
    }
    // The fused decode program (crate::fused): its ops replace the per-kernel ones it does not
    // call (a sandwich block keeps the plain O projection and, for the last layer, post_norm).
    let norm_off = match cfg.norm {
        NormKind::Scale => None,
        NormKind::Offset(off) => Some(off),
    };
    let sizes = crate::fused::Sizes {
        h: d.h,
        i: d.i,
        qkv: d.qkv,
        attn: d.hq * d.d,
        eps,
        max_tokens: opts.max_tokens,
        norm_off,
        gelu: cfg.activation == Activation::GeluTanh,
        sandwich,
    };
    if fused {
        let o = ops.as_object_mut().expect("ops");
        for unused in ["rms_norm", "add_rms_norm", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", act_op] {
            if !(sandwich && unused == "o_proj") {
                o.remove(unused);
            }
        }
        o.extend(crate::fused::ops(&sizes, |n, k| gemm_launches(n, k, "tokens", opts.max_tokens, false, opts.batch_gemm)));
    }
    let down_op = crate::fused::down_op_name(&sizes);
    crate::moe::extend(cfg, opts, &mut b, &mut ops, |n, k, f32_out| gemm_launches(n, k, "tokens", opts.max_tokens, f32_out, opts.batch_gemm));
    crate::gdn::extend(cfg, opts, &mut b, &mut ops, |n, k| gemm_launches(n, k, "tokens", opts.max_tokens, false, opts.batch_gemm));
    // After a row-parallel GEMM each rank holds a partial sum of the full output.
    let all_reduce = |label: String, b: &str| json!({"label": label, "op": "all_reduce", "args": [{"buf": b}]});

    // ---- the program: one step
    let buf = |n: &str| json!({"buf": n});
    let var = |n: &str| json!({"var": n});
    // The calls of one step through the embedding, the first `layers` decoder layers (their KV
    // in the state `kv`, through the ops `rope` and `attention`, which address a state of
    // `layers` layers per token), the final norm, the LM head and sampling. The target's
    // program has every layer; a draft's has its own KV state.
    // The fused program (crate::fused) has the same embedding, attention and tail; per layer
    // l0.qkv_proj (norm_qkv_proj: layer 0's input norm and QKV), then lL.qk_norm_rope,
    // lL.attention, lL.o_proj_gate_up (o_proj_norm_gate_up: O, residual add, post-attention
    // norm, gate-up), lL.down_proj_qkv (down_proj_norm_qkv: SwiGLU, down, residual add, and the
    // NEXT layer's input norm and QKV), or in the last layer lL.down_proj (swiglu_down_proj),
    // whose residual add the final norm makes as before.
    // The MLP's output as the residual adds it: after Gemma's post-feedforward norm, or as is.
    let mlp_out = if sandwich { "mlp_norm" } else { "mlp" };
    let program = |layers: u64, kv: &str, rope: &str, attention: &str| -> Vec<Value> {
        let mut calls = vec![json!({"label": "embed", "op": "embedding", "args": [buf("x"), buf("model.embed_tokens.weight"), buf("token_ids"), var("tokens")]})];
        let qkv_bias = |l: u64| if bias { buf(&format!("model.layers.{l}.self_attn.qkv_proj.bias")) } else { json!({"null": true}) };
        if fused {
            calls.push(json!({"label": "l0.qkv_proj", "op": "norm_qkv_proj",
                "args": [buf("h"), buf("x"), buf("model.layers.0.input_layernorm.weight"), buf("model.layers.0.self_attn.qkv_proj.weight"), qkv_bias(0), buf("qkv"), var("tokens")]}));
        } else {
            calls.push(json!({"label": "l0.input_norm", "op": "rms_norm", "args": [buf("h"), buf("x"), buf("model.layers.0.input_layernorm.weight"), var("tokens")]}));
        }
        for l in 0..layers {
            let p = format!("model.layers.{l}");
            let bias_buf = qkv_bias(l);
            // A hybrid's GDN layer (crate::gdn) mixes tokens from h into o without the KV cache;
            // attention layers address the cache by their index among attention layers.
            let linear = crate::gdn::is_linear(cfg, l);
            let al = crate::gdn::attn_index(cfg, l);
            if linear {
                calls.extend(crate::gdn::calls(cfg, l));
            } else {
                if !fused {
                    calls.push(json!({"label": format!("l{l}.qkv_proj"), "op": "qkv_proj", "args": [buf("h"), buf(&format!("{p}.self_attn.qkv_proj.weight")), bias_buf, buf("qkv"), var("tokens")]}));
                }
                // Unused norm / bias pointers are never read by the kernel (flags); bind a weight.
                let qn = if qk_norm { format!("{p}.self_attn.q_norm.weight") } else { format!("{p}.input_layernorm.weight") };
                let kn = if qk_norm { format!("{p}.self_attn.k_norm.weight") } else { format!("{p}.input_layernorm.weight") };
                let rb = if bias { format!("{p}.self_attn.qkv_proj.bias") } else { format!("{p}.input_layernorm.weight") };
                let r = &ropes[rope_of(cfg, l)];
                let table = if r.table.is_some() { buf(&r.buffer) } else { json!({"null": true}) };
                if gated {
                    calls.push(json!({"label": format!("l{l}.qk_norm_rope"), "op": rope,
                        "args": [buf("q"), buf("qkv"), {"state": kv}, buf(&qn), buf(&kn), buf("positions"), buf("slot_mapping"), var("tokens"), {"i32": al}]}));
                } else {
                    calls.push(json!({"label": format!("l{l}.qk_norm_rope"), "op": rope,
                        "args": [buf("qkv"), {"state": kv}, buf(&qn), buf(&kn), buf(&rb), buf("positions"), buf("slot_mapping"), var("tokens"), {"i32": al},
                                 {"f32": r.theta}, table, {"f32": r.cos_scale}]}));
                }
                let mut attn_args = vec![buf("attn"), buf(if gated { "q" } else { "qkv" }), json!({"state": kv}), buf("block_tables"), buf("seq_lens"), buf("query_start"), var("seqs"), var("tokens"), var("pages"), json!({"i32": al})];
                if split {
                    attn_args.push(buf("attn_partial"));
                }
                attn_args.push(json!({"i32": cfg.window(l).unwrap_or(0)}));
                calls.push(json!({"label": format!("l{l}.attention"), "op": attention, "args": attn_args}));
            }
            if fused && sandwich {
                // The residual arrives in x, leaves the attention half in x2 and the MLP half in x
                // again (crate::fused: every CTA of a prologue GEMV reads x_in while its pieces' owners
                // write x_out); the last layer's stays in x2 for the final norm.
                calls.push(json!({"label": format!("l{l}.o_proj"), "op": "o_proj",
                    "args": [buf("attn"), buf(&format!("{p}.self_attn.o_proj.weight")), json!({"null": true}), buf("o"), var("tokens")]}));
                calls.push(json!({"label": format!("l{l}.post_attention_norm_gate_up"), "op": "postnorm_gate_up_proj",
                    "args": [buf("o"), buf("x"), buf(&format!("{p}.post_attention_layernorm.weight")), buf("x2"), buf(&format!("{p}.pre_feedforward_layernorm.weight")),
                             buf("h"), buf(&format!("{p}.mlp.gate_up_proj.weight")), json!({"null": true}), buf("gate_up"), var("tokens")]}));
                calls.push(json!({"label": format!("l{l}.down_proj"), "op": down_op,
                    "args": [buf("gate_up"), buf("act"), buf(&format!("{p}.mlp.down_proj.weight")), buf("mlp"), var("tokens")]}));
                if l + 1 < layers {
                    let next = format!("model.layers.{}", l + 1);
                    calls.push(json!({"label": format!("l{l}.post_feedforward_norm_qkv"), "op": "postnorm_qkv_proj",
                        "args": [buf("mlp"), buf("x2"), buf(&format!("{p}.post_feedforward_layernorm.weight")), buf("x"), buf(&format!("{next}.input_layernorm.weight")),
                                 buf("h"), buf(&format!("{next}.self_attn.qkv_proj.weight")), qkv_bias(l + 1), buf("qkv"), var("tokens")]}));
                } else {
                    calls.push(json!({"label": format!("l{l}.post_feedforward_norm"), "op": "post_norm",
                        "args": [buf("mlp_norm"), buf("mlp"), buf(&format!("{p}.post_feedforward_layernorm.weight")), var("tokens")]}));
                }
                continue;
            }
            if fused {
                calls.push(json!({"label": format!("l{l}.o_proj_gate_up"), "op": "o_proj_norm_gate_up",
                    "args": [buf("attn"), buf(&format!("{p}.self_attn.o_proj.weight")), buf("o"), buf("x"), buf(&format!("{p}.post_attention_layernorm.weight")),
                             buf("h"), buf(&format!("{p}.mlp.gate_up_proj.weight")), buf("gate_up"), var("tokens")]}));
                let down = buf(&format!("{p}.mlp.down_proj.weight"));
                if l + 1 < layers {
                    let next = format!("model.layers.{}", l + 1);
                    calls.push(json!({"label": format!("l{l}.down_proj_qkv"), "op": "down_proj_norm_qkv",
                        "args": [buf("gate_up"), buf("act"), down, buf("mlp"), buf("x"), buf(&format!("{next}.input_layernorm.weight")), buf("h"),
                                 buf(&format!("{next}.self_attn.qkv_proj.weight")), qkv_bias(l + 1), buf("qkv"), var("tokens")]}));
                } else {
                    calls.push(json!({"label": format!("l{l}.down_proj"), "op": down_op, "args": [buf("gate_up"), buf("act"), down, buf("mlp"), var("tokens")]}));
                }
                continue;
            }
            let opt_bias = |on: bool, name: String| if on { buf(&name) } else { json!({"null": true}) };
            if gated && !linear {
                // attn · sigmoid(gate), the gate from the q projection's rows (crate::gdn).
                calls.push(json!({"label": format!("l{l}.attn_output_gate"), "op": "attn_output_gate", "args": [buf("attn"), buf("qkv"), var("tokens")]}));
            }
            if !linear {
                calls.push(json!({"label": format!("l{l}.o_proj"), "op": "o_proj",
                    "args": [buf("attn"), buf(&format!("{p}.self_attn.o_proj.weight")), opt_bias(cfg.o_bias, format!("{p}.self_attn.o_proj.bias")), buf("o"), var("tokens")]}));
            }
            if opts.tp.is_some() {
                calls.push(all_reduce(format!("l{l}.o_proj.all_reduce"), "o"));
            }
            if sandwich {
                // Gemma 3: h = x + post_attention_norm(attn); the MLP reads pre_feedforward_norm(h).
                calls.push(json!({"label": format!("l{l}.post_attention_norm"), "op": "post_norm", "args": [buf("o_norm"), buf("o"), buf(&format!("{p}.post_attention_layernorm.weight")), var("tokens")]}));
                calls.push(json!({"label": format!("l{l}.pre_feedforward_norm"), "op": "add_rms_norm", "args": [buf("h"), buf("x"), buf("o_norm"), buf(&format!("{p}.pre_feedforward_layernorm.weight")), var("tokens")]}));
            } else {
                calls.push(json!({"label": format!("l{l}.post_attention_norm"), "op": "add_rms_norm", "args": [buf("h"), buf("x"), buf("o"), buf(&format!("{p}.post_attention_layernorm.weight")), var("tokens")]}));
            }
            if crate::moe::is_moe_layer(cfg, l) {
                // A mixture-of-experts layer (crate::moe): router, top-k, permutation, experts, combine.
                calls.extend(crate::moe::calls(cfg, l));
            } else {
                calls.push(json!({"label": format!("l{l}.gate_up_proj"), "op": "gate_up_proj",
                    "args": [buf("h"), buf(&format!("{p}.mlp.gate_up_proj.weight")), opt_bias(cfg.mlp_bias, format!("{p}.mlp.gate_up_proj.bias")), buf("gate_up"), var("tokens")]}));
                calls.push(json!({"label": format!("l{l}.{act_op}"), "op": act_op, "args": [buf("act"), buf("gate_up"), var("tokens")]}));
                calls.push(json!({"label": format!("l{l}.down_proj"), "op": "down_proj",
                    "args": [buf("act"), buf(&format!("{p}.mlp.down_proj.weight")), opt_bias(cfg.mlp_bias, format!("{p}.mlp.down_proj.bias")), buf("mlp"), var("tokens")]}));
            }
            if opts.tp.is_some() {
                calls.push(all_reduce(format!("l{l}.down_proj.all_reduce"), "mlp"));
            }
            if sandwich {
                calls.push(json!({"label": format!("l{l}.post_feedforward_norm"), "op": "post_norm", "args": [buf("mlp_norm"), buf("mlp"), buf(&format!("{p}.post_feedforward_layernorm.weight")), var("tokens")]}));
            }
            if l + 1 < layers {
                calls.push(json!({"label": format!("l{}.input_norm", l + 1), "op": "add_rms_norm",
                    "args": [buf("h"), buf("x"), buf(mlp_out), buf(&format!("model.layers.{}.input_layernorm.weight", l + 1)), var("tokens")]}));
            }
        }
        // Only the last position of each sequence goes through the final norm and the LM head.
        let gather_res = if f32_res { "gather_last_f32" } else { "gather_last" };
        // (the fused sandwich program's last layer leaves the residual in x2)
        let x_final = if x2 { "x2" } else { "x" };
        calls.push(json!({"label": "gather.residual", "op": gather_res, "args": [buf("x_last"), buf(x_final), buf("last_token"), var("seqs"), var("tokens")]}));
        calls.push(json!({"label": "gather.mlp", "op": "gather_last", "args": [buf("mlp_last"), buf(mlp_out), buf("last_token"), var("seqs"), var("tokens")]}));
        calls.push(json!({"label": "final_norm", "op": "add_rms_norm_last", "args": [buf("h_last"), buf("x_last"), buf("mlp_last"), buf("model.norm.weight"), var("seqs")]}));
        calls.push(json!({"label": "lm_head", "op": "lm_head", "args": [buf("h_last"), buf("lm_head.weight"), {"null": true}, buf("logits"), var("seqs")]}));
        calls.push(json!({"label": "sample", "op": "sample",
            "args": [buf("sampled"), buf("logits"), buf("temperature"), buf("top_k"), buf("top_p"), buf("seeds"), buf("seq_lens"),
                     buf("token_mask"), buf("mask_rows"), var("seqs")]}));
        calls
    };
    let calls = program(d.layers, "kv", "qk_norm_rope", "attention");

    // This rank's kv heads only.
    let bytes_per_token = d.attn_layers * 2 * d.hkv * d.d * 2;
    let model = match opts.tp {
        Some(t) => format!("{}-h{}-l{}-tp{t}", cfg.model_type, d.h, d.layers),
        None => format!("{}-h{}-l{}", cfg.model_type, d.h, d.layers),
    };
    let mut m = json!({
        "schema_version": "4.1",
        "model": model,
        "vars": {"tokens": {"max": opts.max_tokens}, "seqs": {"max": opts.max_seqs}, "pages": {"max": pages}},
        "states": {"kv": {"bytes_per_token": bytes_per_token, "page_tokens": opts.page_tokens}},
        "buffers": Value::Object(b),
        "modules": modules,
        "ops": ops,
        "program": {"calls": calls},
        "step": {
            "abi": 1,
            "kv": "kv",
            "buffers": {
                "token_ids": "token_ids", "positions": "positions", "seq_lens": "seq_lens", "query_start": "query_start",
                "slot_mapping": "slot_mapping", "block_tables": "block_tables", "last_token": "last_token",
                "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seeds": "seeds",
                "token_mask": "token_mask", "mask_rows": "mask_rows",
                "sampled": "sampled", "logits": "logits"
            }
        }
    });
    if cfg.hybrid.is_some() {
        // Every GDN layer's conv and recurrent state in one slot per sequence (crate::gdn), which
        // the prefix cache may snapshot at page boundaries.
        m["states"][crate::gdn::STATE] = json!({"bytes_per_seq": crate::gdn::bytes_per_seq(cfg, opts.gdn_state), "snapshot": true});
        m["step"]["buffers"]["seq_slots"] = json!("seq_slots");
    }
    if opts.batch_invariant {
        m["batch_invariant"] = json!(true);
    }
    if let Some(t) = opts.tp {
        m["parallel"] = json!({"tp": t});
    }
    if let Some(draft) = &opts.draft {
        // The draft's KV lives in its own per-token state on the same pages (one block table,
        // one slot mapping): the target's `kv` is never bound by the draft's program.
        let layers = draft.layers(d.layers);
        m["states"]["draft_kv"] = json!({"bytes_per_token": layers * 2 * d.hkv * d.d * 2, "page_tokens": opts.page_tokens});
        let calls = match draft.kind {
            // The target's layer count: the target's KV ops address draft_kv's layers too.
            DraftKind::SelfDraft => program(d.layers, "draft_kv", "qk_norm_rope", "attention"),
            DraftKind::LayerSkip(l) => {
                m["ops"]["draft_qk_norm_rope"] = rope_op(l);
                m["ops"]["draft_attention"] = attention_op(l);
                program(l, "draft_kv", "draft_qk_norm_rope", "draft_attention")
            }
        };
        m["programs"] = json!({"draft": {"calls": calls}});
        m["speculative"] = json!({"draft": "draft", "k": draft.k});
    }
    m
}

/// The op `residual += x; out = rmsnorm(residual)` over `rows` rows, in the norm's form.
fn add_rms_norm(rows: &str, h: u64, eps: f64, residual: Residual, norm: NormKind) -> Value {
    let (entry, res) = match residual {
        Residual::Bf16 => ("add_rms_norm", "inout buffer<bf16>"),
        Residual::F32 => ("add_rms_norm_f32", "inout buffer<f32>"),
    };
    let mut l = json!({
        "module": "rowwise", "entry": entry,
        "params": ["out buffer<bf16>", res, "in buffer<bf16>", "in buffer<bf16>", "i32", "i32", "f32"],
        "block": [128], "grid": [rows],
        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"i32": h}, {"f32": eps}]});
    with_offset(&mut l, norm);
    json!({"params": ["out buffer<bf16>", res, "in buffer<bf16>", "in buffer<bf16>", "i32"], "impl": {"launches": [l]}})
}

/// The op `out = rmsnorm(x)` for an `x` of dtype `dt` (the residual's, or bf16 for Gemma's
/// post norms), in the norm's form.
fn rms_norm(dt: &str, h: u64, eps: f64, norm: NormKind) -> Value {
    let mut l = json!({
        "module": "rowwise", "entry": if dt == "f32" { "rms_norm_f32" } else { "rms_norm" },
        "params": ["out buffer<bf16>", format!("in buffer<{dt}>"), "in buffer<bf16>", "i32", "i32", "f32"],
        "block": [128], "grid": ["tokens"],
        "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"i32": h}, {"f32": eps}]});
    with_offset(&mut l, norm);
    json!({"params": ["out buffer<bf16>", format!("in buffer<{dt}>"), "in buffer<bf16>", "i32"], "impl": {"launches": [l]}})
}

/// A zero-centred norm ([`NormKind::Offset`]) runs the `_off` entry, with the offset as its
/// last argument.
fn with_offset(l: &mut Value, norm: NormKind) {
    if let NormKind::Offset(off) = norm {
        let entry = format!("{}_off", l["entry"].as_str().unwrap_or_default());
        l["entry"] = json!(entry);
        l["params"].as_array_mut().expect("params").push(json!("f32"));
        l["args"].as_array_mut().expect("args").push(json!({"f32": off}));
    }
}

/// Shared memory of `attention_d256` (attention.cu's `AttSmem<256>`: q 32 × 256 bf16, two
/// stages of 32-key K and V tiles, P 4 × 8 × 32 fp32, two ints): above the 48 KiB a kernel
/// may declare statically, so the launch gives it dynamically.
pub const ATT_SMEM_D256: u64 = 32 * 256 * 2 + 2 * 2 * 32 * 256 * 2 + 4 * 8 * 32 * 4 + 16;
/// Shared memory of `attention_decode_d256` (`DecSmem<256>`: q 16 × 256 fp32, two stages of K
/// and V tiles, P 4 × 4 × 32 fp32, four ints).
pub const DEC_SMEM_D256: u64 = 16 * 256 * 4 + 2 * 2 * 32 * 256 * 2 + 4 * 4 * 32 * 4 + 16;

/// One RoPE of the model: its base, frequency table (scaled RoPEs) and cos/sin factor, and
/// the manifest buffer the table goes into.
pub(crate) struct RopeKind {
    pub buffer: String,
    pub theta: f64,
    pub table: Option<Vec<f32>>,
    pub cos_scale: f32,
}

/// The RoPEs of `cfg`: [0] for full-attention layers (and every layer of a model with one
/// RoPE), [1] for sliding-window layers with a local base (Gemma 3: unscaled).
pub(crate) fn rope_kinds(cfg: &Config) -> Vec<RopeKind> {
    let d = cfg.head_dim();
    let mut v = vec![RopeKind {
        buffer: "rope.inv_freq".into(),
        theta: cfg.rope_theta,
        table: crate::rope::inv_freq(cfg.rope_theta, d, &cfg.rope_scaling),
        cos_scale: crate::rope::cos_scale(&cfg.rope_scaling),
    }];
    if let Some(t) = cfg.rope_local_theta {
        v.push(RopeKind { buffer: "rope.local.inv_freq".into(), theta: t, table: None, cos_scale: 1.0 });
    }
    v
}

/// Which of [`rope_kinds`] layer `l` uses.
pub(crate) fn rope_of(cfg: &Config, l: u64) -> usize {
    usize::from(cfg.rope_local_theta.is_some() && cfg.layer_type(l) == crate::config::LayerType::Sliding)
}
