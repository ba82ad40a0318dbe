//! kern's model packs: everything kern needs to run a family of models, kept out of the engine.
//! A family is a short module ([`families`]: config reading, GGUF names, the config.json it
//! writes back) over shared parts: one normalized [`Config`], one manifest builder, one set of
//! kernels (`packs/kernels`, built by `packs/kernels/build.sh`), one random-weight writer.
//!
//! * [`families`]: the family table (Qwen3/Qwen2, Llama/Mistral, Gemma 3), keyed by
//!   `model_type` and GGUF `general.architecture`;
//! * [`config`]: the normalized decoder config the families fill, and presets with real shapes;
//! * [`rope`]: RoPE scaling (llama3, linear, YaRN, GGUF divisors) as fp32 frequency tables;
//! * [`manifest`]: `kern pack` — a manifest (schema 4.1, step ABI 1) wiring the kernels into a
//!   decoder, optionally with a draft program for speculative decoding that reuses the target's
//!   weights ([`Draft`]: `self`, `layer-skip:L`; docs/speculative.md);
//! * [`fused`]: the fused decode program's ops (RMSNorm, SwiGLU and the residual adds inside
//!   the decode GEMVs for steps of at most 8 tokens, bit-identical to the unfused kernels);
//! * [`gguf`]: weight sources renamed for GGUF files and prefixed checkpoints;
//! * [`quant`]: GGUF-native weights — projections, LM head and embedding kept in the file's
//!   blocks and run by the block GEMVs / dequantize-then-GEMM;
//! * [`gdn`]: Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): the linear-attention layers, their
//!   per-sequence state, and the gated full-attention layers with partial RoPE;
//! * [`moe`]: mixture-of-experts layers (router, permutation, grouped expert GEMMs, combine)
//!   as buffers, ops and calls the builder adds for the layers a [`config::Config`] marks MoE;
//! * [`random`]: seeded random weights in the Hugging Face safetensors layout plus a
//!   `config.json` that transformers loads unchanged.

pub mod config;
pub mod families;
pub mod fp8;
pub mod fused;
pub mod gdn;
pub mod gguf;
pub mod manifest;
pub mod moe;
pub mod quant;
pub mod random;
pub mod rope;

pub use config::{Config, PRESETS};
pub use families::{Family, FAMILIES};
pub use manifest::{generate, generate_for_gguf, BatchGemm, DecodeAttention, Draft, DraftKind, PackOptions, PrefillAttention, Residual};

/// Every `model_type` the packs serve.
pub fn model_types() -> Vec<&'static str> {
    families::model_types()
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Config(String),
    #[error("{file}: {cause}")]
    Io { file: String, cause: std::io::Error },
}

pub type Result<T, E = PackError> = std::result::Result<T, E>;

pub(crate) fn io(file: &std::path::Path) -> impl FnOnce(std::io::Error) -> PackError + '_ {
    move |cause| PackError::Io { file: file.display().to_string(), cause }
}
