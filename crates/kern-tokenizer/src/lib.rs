//! Tokenizers for kern: a Hugging Face `tokenizer.json` (through the `tokenizers` crate) with
//! the special tokens its `tokenizer_config.json` and `generation_config.json` declare, and
//! [`Detokenizer`], which turns generated ids into text token by token without ever emitting
//! half a UTF-8 character.
//!
//! Nothing here knows a model family: end-of-sequence ids, the BOS token and the chat template
//! come from the files next to `tokenizer.json`. [`chatml`] renders the ChatML prompt format
//! (`<|im_start|>role\n…<|im_end|>\n`) that several families share; other formats belong to
//! the model's chat template.

mod chat;
mod config;
mod detok;
mod template;

pub use chat::chatml;
pub use detok::Detokenizer;
pub use template::{ChatTemplate, ContentFormat, TemplateError};

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The file [`Tokenizer::from_dir`] reads.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` is not one the `tokenizers` crate reads.
    #[error("{}: not a tokenizer.json that kern can read: {message}", path.display())]
    Load { path: PathBuf, message: String },
    /// `tokenizer_config.json` or `generation_config.json` is malformed or disagrees with
    /// `tokenizer.json`.
    #[error("{}: {message}", path.display())]
    Config { path: PathBuf, message: String },
    /// Encoding or decoding failed inside the `tokenizers` crate.
    #[error("cannot {what}: {message}")]
    Run { what: &'static str, message: String },
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// A loaded tokenizer with its special tokens.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    eos: Vec<u32>,
    bos: Option<u32>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    special: HashSet<u32>,
}

impl Tokenizer {
    /// Loads `DIR/tokenizer.json`, with `tokenizer_config.json` and `generation_config.json`
    /// from the same directory when they exist.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        Self::from_file(&dir.join(TOKENIZER_FILE))
    }

    /// Loads a `tokenizer.json`, with `tokenizer_config.json` and `generation_config.json`
    /// from its directory when they exist: `eos_token`, `bos_token`, `chat_template` and
    /// `added_tokens_decoder` from the first, `eos_token_id` (one id or a list) and
    /// `bos_token_id` from the second.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            what: "cannot read the tokenizer",
            source,
        })?;
        let mut inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Load {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let found = config::read(dir, &mut inner)?;
        let special = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
            eos: found.eos,
            bos: found.bos,
            chat_template: found.chat_template,
            bos_token: found.bos_token,
            eos_token: found.eos_token,
            special,
        })
    }

    /// The `tokenizer.json` this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ids of `text`. `add_special_tokens` adds what the tokenizer's post-processor adds
    /// (a BOS token for some models; nothing for others). Special tokens written in `text`
    /// (`<|im_start|>`) become their ids either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Run {
                what: "encode",
                message: e.to_string(),
            })
    }

    /// The text of `ids`; `skip_special` leaves special tokens out. Ids outside the vocabulary
    /// are skipped. Bytes that are not UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Run {
                what: "decode",
                message: e.to_string(),
            })
    }

    /// The end-of-sequence ids: `generation_config.json`'s `eos_token_id` first, then
    /// `tokenizer_config.json`'s `eos_token`, without repeats. Empty when neither file says.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The beginning-of-sequence id, when the configuration names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The id of a token written as in the vocabulary (`"<|im_end|>"`, `"Ġhello"`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of an id.
    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special token (skipped by `decode(…, true)`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Ids the tokenizer knows, added tokens included. A model's embedding may have more rows
    /// (padded to a multiple of 64 or 128); ids past this decode to nothing.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The Jinja chat template: `chat_template.jinja` beside `tokenizer.json` when present,
    /// else `tokenizer_config.json`'s `chat_template`.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The chat template compiled with this tokenizer's `bos_token` and `eos_token` (the
    /// strings `tokenizer_config.json` names); `None` when the tokenizer has no template.
    pub fn chat_template_renderer(&self) -> Option<Result<ChatTemplate, TemplateError>> {
        let source = self.chat_template.as_deref()?;
        Some(ChatTemplate::new(
            source,
            self.bos_token.clone(),
            self.eos_token.clone(),
        ))
    }

    /// A fresh incremental decoder for one sequence.
    pub fn detokenizer(&self, skip_special: bool) -> Detokenizer<'_> {
        Detokenizer::new(self, skip_special)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
