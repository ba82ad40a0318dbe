//! The Qwen model pack: everything kern needs to run Qwen3 dense models (and Qwen2 / Qwen2.5,
//! which add QKV biases and drop the q/k norms), kept out of the engine.
//!
//! * [`config`]: the Hugging Face `config.json` fields the pack reads, and presets with real
//!   shapes (for random weights);
//! * [`manifest`]: `kern pack` — a manifest (schema 4.1, step ABI 1) wiring the pack's kernels
//!   (`packs/kernels`, built by `packs/kernels/build.sh`) into a decoder, optionally with
//!   a draft program for speculative decoding that reuses the target's weights ([`Draft`]:
//!   `self`, `layer-skip:L`; docs/speculative.md);
//! * [`fused`]: the fused decode program's ops (RMSNorm, SwiGLU and the residual adds inside
//!   the decode GEMVs for steps of at most 8 tokens, bit-identical to the unfused kernels);
//! * [`gguf`]: the config from a GGUF file's metadata (`qwen2`, `qwen3`) and the Hugging Face
//!   → GGUF tensor names, for `kern pack --gguf`;
//! * [`random`]: seeded random weights in the Hugging Face safetensors layout plus a
//!   `config.json` that transformers loads unchanged.

pub mod config;
pub mod fused;
pub mod gguf;
pub mod manifest;
pub mod random;

pub use config::{Config, PRESETS};
pub use manifest::{generate, generate_for_gguf, BatchGemm, DecodeAttention, Draft, DraftKind, PackOptions, PrefillAttention, Residual};

/// The `model_type` values this pack serves.
pub const MODEL_TYPES: &[&str] = &["qwen3", "qwen2"];

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
