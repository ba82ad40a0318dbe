//! Tokenizers for kern: a Hugging Face `tokenizer.json` (through the `tokenizers` crate) with
//! the special tokens its `tokenizer_config.json` and `generation_config.json` declare, or the
//! same tokenizer rebuilt from a GGUF file's `tokenizer.ggml.*` metadata
//! ([`Tokenizer::from_gguf_metadata`]); chat templates ([`ChatTemplate`], Hugging Face Jinja
//! rendered by minijinja as transformers renders it); and [`Detokenizer`], which turns
//! generated ids into text token by token without ever emitting half a UTF-8 character.
//!
//! Nothing here knows a model family: end-of-sequence ids, the BOS token and the chat template
//! come from the files next to `tokenizer.json` (or from the GGUF metadata), and the GGUF
//! pre-tokenizers are a data table (`gguf-pre-tokenizers.json`). [`chatml`] renders the ChatML
//! prompt format (`<|im_start|>role\n…<|im_end|>\n`) that several families share.

mod chat;
mod config;
mod detok;
mod gguf;
mod gguf_bpe;
mod gguf_spm;
mod template;

pub use chat::chatml;
pub use detok::Detokenizer;
pub use gguf::{supported_pre_tokenizers, token_type, GgufTokenizerMeta};
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
    /// GGUF tokenizer metadata that kern cannot build a tokenizer from.
    #[error("GGUF tokenizer metadata: {message}")]
    Gguf { message: String },
    /// Encoding or decoding failed inside the `tokenizers` crate.
    #[error("cannot {what}: {message}")]
    Run { what: &'static str, message: String },
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;

/// A loaded tokenizer with its special tokens.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: Option<PathBuf>,
    eos: Vec<u32>,
    bos: Option<u32>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    add_bos: bool,
    add_eos: bool,
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
            path: Some(path.to_path_buf()),
            eos: found.eos,
            bos: found.bos,
            chat_template: found.chat_template,
            bos_token: found.bos_token,
            eos_token: found.eos_token,
            pad_token: found.pad_token,
            unk_token: found.unk_token,
            add_bos: found.add_bos,
            add_eos: found.add_eos,
            special,
        })
    }

    /// The `tokenizer.json` this was loaded from (`None` when built from GGUF metadata).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
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

    /// The beginning-of-sequence id, when the configuration names one. Whether `encode(…,
    /// true)` adds it is the tokenizer's post-processor's business (see [`Tokenizer::add_bos`]).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// Whether the model expects a BOS token first (`add_bos_token` of
    /// `tokenizer_config.json` or `tokenizer.ggml.add_bos_token`). A tokenizer built from GGUF
    /// metadata then adds it in `encode(…, true)`.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(…, true)` appends the EOS token (`add_eos_token` of
    /// `tokenizer_config.json` or `tokenizer.ggml.add_eos_token`; rare).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The unknown token's text (`unk_token`), when the configuration names one.
    pub fn unk_token(&self) -> Option<&str> {
        self.unk_token.as_deref()
    }

    /// The special tokens' text: (`bos_token`, `eos_token`, `pad_token`).
    pub fn special_token_names(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        (
            self.bos_token.as_deref(),
            self.eos_token.as_deref(),
            self.pad_token.as_deref(),
        )
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

    /// Writes `tokenizer.json` and `tokenizer_config.json` (special tokens, `add_bos_token`,
    /// `add_eos_token`, `chat_template`, `added_tokens_decoder`) into `dir`, creating it, so that
    /// [`Tokenizer::from_dir`] (and transformers) load the same tokenizer back. When the EOS
    /// ids are more than `eos_token` alone (a GGUF end-of-turn id), `generation_config.json`
    /// gets them too (`eos_token_id`, `bos_token_id`), unless the directory has one already.
    pub fn save_dir(&self, dir: &Path) -> Result<()> {
        let io = |path: PathBuf, what: &'static str| {
            move |source| TokenizerError::Io { path, what, source }
        };
        std::fs::create_dir_all(dir)
            .map_err(io(dir.to_path_buf(), "cannot create the directory"))?;
        let tok_path = dir.join(TOKENIZER_FILE);
        let text = self
            .inner
            .to_string(false)
            .map_err(|e| TokenizerError::Run {
                what: "serialize the tokenizer",
                message: e.to_string(),
            })?;
        std::fs::write(&tok_path, text)
            .map_err(io(tok_path.clone(), "cannot write the tokenizer"))?;

        let mut added = serde_json::Map::new();
        let mut decoder: Vec<_> = self.inner.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_by_key(|(id, _)| *id);
        for (id, t) in decoder {
            added.insert(
                id.to_string(),
                serde_json::json!({
                    "content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                    "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special,
                }),
            );
        }
        let cfg = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "unk_token": self.unk_token,
            "clean_up_tokenization_spaces": false,
            "chat_template": self.chat_template,
            "added_tokens_decoder": added,
        });
        let cfg_path = dir.join(config::TOKENIZER_CONFIG);
        let text = serde_json::to_string_pretty(&cfg).expect("a JSON value serializes");
        std::fs::write(&cfg_path, text + "\n").map_err(io(
            cfg_path.clone(),
            "cannot write the tokenizer configuration",
        ))?;

        let eos_token_id = self.eos_token.as_deref().and_then(|t| self.token_id(t));
        let gen_path = dir.join(config::GENERATION_CONFIG);
        if self.eos.iter().any(|&id| Some(id) != eos_token_id) && !gen_path.exists() {
            let gen = serde_json::json!({"bos_token_id": self.bos, "eos_token_id": self.eos});
            let text = serde_json::to_string_pretty(&gen).expect("a JSON value serializes");
            std::fs::write(&gen_path, text + "\n").map_err(io(
                gen_path.clone(),
                "cannot write the generation configuration",
            ))?;
        }
        Ok(())
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
