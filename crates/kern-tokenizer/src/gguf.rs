//! A tokenizer built from GGUF metadata (`tokenizer.ggml.*`): the byte-level BPE that a
//! model's `tokenizer.json` describes, rebuilt from the token list, the merges, the token types
//! and the pre-tokenizer name, so that it gives the same ids.
//!
//! Which `tokenizer.ggml.model` and `tokenizer.ggml.pre` values are known, and what each
//! pre-tokenizer is (normalizer, pre-tokenizer, post-processor, decoder, in the `tokenizers`
//! crate's JSON), is data: `gguf-pre-tokenizers.json` at the crate root. Nothing here names a
//! model family.

use crate::{Result, Tokenizer, TokenizerError};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
};

/// The table of known GGUF tokenizer models and pre-tokenizers.
const TABLE: &str = include_str!("../gguf-pre-tokenizers.json");

/// GGUF token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The tokenizer metadata of a GGUF file, as plain data (a GGUF reader fills it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufTokenizerMeta {
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token of each id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (empty: all normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufTokenizerMeta {
    /// Reads the fields from a JSON object keyed by GGUF key (`"tokenizer.ggml.tokens": [...]`,
    /// ...), as a GGUF reader that turns metadata into JSON would give them. Keys other than
    /// the ones above are ignored.
    pub fn from_json(meta: &Value) -> Result<GgufTokenizerMeta> {
        let bad = |key: &str, want: &str| meta_error(format!("`{key}` is not {want}"));
        let obj = meta
            .as_object()
            .ok_or_else(|| meta_error("the metadata is not a JSON object".into()))?;
        let string = |key: &str| -> Result<Option<String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(key, "a string")),
            }
        };
        let strings = |key: &str| -> Result<Vec<String>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(key, "an array of strings")),
                Some(_) => Err(bad(key, "an array of strings")),
            }
        };
        let id = |key: &str| -> Result<Option<u32>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| bad(key, "a token id")),
            }
        };
        let types = match obj.get("tokenizer.ggml.token_type") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_i64().and_then(|n| i32::try_from(n).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("tokenizer.ggml.token_type", "an array of integers"))?,
            Some(_) => return Err(bad("tokenizer.ggml.token_type", "an array of integers")),
        };
        let add_bos = match obj.get("tokenizer.ggml.add_bos_token") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(bad("tokenizer.ggml.add_bos_token", "a boolean")),
        };
        Ok(GgufTokenizerMeta {
            model: string("tokenizer.ggml.model")?
                .ok_or_else(|| meta_error("`tokenizer.ggml.model` is missing".into()))?,
            pre: string("tokenizer.ggml.pre")?,
            tokens: strings("tokenizer.ggml.tokens")?,
            merges: strings("tokenizer.ggml.merges")?,
            token_types: types,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            add_bos,
            chat_template: string("tokenizer.chat_template")?,
        })
    }
}

fn meta_error(message: String) -> TokenizerError {
    TokenizerError::Gguf { message }
}

/// The `tokenizer.ggml.model` values and `tokenizer.ggml.pre` entries kern knows.
struct Known {
    models: Vec<String>,
    pre: serde_json::Map<String, Value>,
}

fn known() -> Result<Known> {
    let table: Value = serde_json::from_str(TABLE)
        .map_err(|e| meta_error(format!("gguf-pre-tokenizers.json is not valid JSON: {e}")))?;
    let models = table["models"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let pre = table["pre"].as_object().cloned().unwrap_or_default();
    Ok(Known { models, pre })
}

/// The `tokenizer.ggml.pre` values [`Tokenizer::from_gguf_metadata`] accepts.
pub fn supported_pre_tokenizers() -> Vec<String> {
    known()
        .map(|k| k.pre.keys().cloned().collect())
        .unwrap_or_default()
}

fn component<T: serde::de::DeserializeOwned>(
    entry: &Value,
    pre: &str,
    key: &str,
) -> Result<Option<T>> {
    match entry.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            meta_error(format!(
                "gguf-pre-tokenizers.json: `{pre}`.{key} is not a tokenizers {key}: {e}"
            ))
        }),
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file's metadata describes.
    ///
    /// - `model` must be a byte-level BPE kind and `pre` a known pre-tokenizer (see
    ///   `gguf-pre-tokenizers.json`); others are refused by name, with the supported list.
    /// - Every token keeps its GGUF id. CONTROL (3) tokens become special added tokens and
    ///   USER_DEFINED (4) tokens added tokens, so both are matched whole in text before BPE;
    ///   UNUSED (5) fillers (`[PAD…]` rows past the real vocabulary) are left out, so their
    ///   ids decode to nothing, as with the model's `tokenizer.json`.
    /// - EOS ids: `eos_id`, then `eot_id`; BOS: `bos_id`, added by `encode(…, true)` only when
    ///   `add_bos` is true. The chat template is `chat_template`, with the text of the BOS and
    ///   EOS tokens as `bos_token` / `eos_token`.
    pub fn from_gguf_metadata(meta: GgufTokenizerMeta) -> Result<Tokenizer> {
        let known = known()?;
        if !known.models.contains(&meta.model) {
            return Err(meta_error(format!(
                "`tokenizer.ggml.model` is `{}`; kern builds tokenizers of kind {} (byte-level BPE) only",
                meta.model,
                list(&known.models)
            )));
        }
        let pre = meta.pre.as_deref().unwrap_or("default");
        let Some(entry) = known.pre.get(pre) else {
            let names: Vec<String> = known.pre.keys().cloned().collect();
            return Err(meta_error(format!(
                "`tokenizer.ggml.pre` is `{pre}`, a pre-tokenizer kern does not know; supported: {} (add an entry to kern-tokenizer's gguf-pre-tokenizers.json with the regex of the model's tokenizer.json)",
                list(&names)
            )));
        };
        let n = meta.tokens.len();
        if n == 0 {
            return Err(meta_error(
                "`tokenizer.ggml.tokens` is missing or empty".into(),
            ));
        }
        if u32::try_from(n).is_err() {
            return Err(meta_error(format!(
                "`tokenizer.ggml.tokens` has {n} tokens, more than u32 ids"
            )));
        }
        if !meta.token_types.is_empty() && meta.token_types.len() != n {
            return Err(meta_error(format!(
                "`tokenizer.ggml.token_type` has {} entries for {n} tokens in `tokenizer.ggml.tokens`",
                meta.token_types.len()
            )));
        }
        let ty = |id: usize| {
            meta.token_types
                .get(id)
                .copied()
                .unwrap_or(token_type::NORMAL)
        };
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", meta.bos_id),
            ("tokenizer.ggml.eos_token_id", meta.eos_id),
            ("tokenizer.ggml.padding_token_id", meta.pad_id),
            ("tokenizer.ggml.eot_token_id", meta.eot_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(meta_error(format!(
                        "`{key}` is {id}, past the {n} tokens of `tokenizer.ggml.tokens`"
                    )));
                }
                if ty(id as usize) == token_type::UNUSED {
                    return Err(meta_error(format!(
                        "`{key}` is {id}, an UNUSED (type 5) token `{}`",
                        meta.tokens[id as usize]
                    )));
                }
            }
        }

        let mut vocab: HashMap<&str, u32> = HashMap::with_capacity(n);
        for (id, token) in meta.tokens.iter().enumerate() {
            let t = ty(id);
            if !(1..=6).contains(&t) {
                return Err(meta_error(format!(
                    "`tokenizer.ggml.token_type`[{id}] is {t}, not a GGUF token type (1 normal … 6 byte)"
                )));
            }
            if t == token_type::UNUSED {
                continue;
            }
            if let Some(first) = vocab.insert(token.as_str(), id as u32) {
                return Err(meta_error(format!(
                    "`tokenizer.ggml.tokens` holds `{token}` twice (ids {first} and {id})"
                )));
            }
        }
        let mut merges: Merges = Vec::with_capacity(meta.merges.len());
        for (i, m) in meta.merges.iter().enumerate() {
            // Split at the first space after the first character (a token may start with one).
            let split = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(p, _)| p);
            let Some(p) = split else {
                return Err(meta_error(format!(
                    "`tokenizer.ggml.merges`[{i}] is `{m}`, not two tokens separated by a space"
                )));
            };
            let (a, b) = (&m[..p], &m[p + 1..]);
            let joined = format!("{a}{b}");
            for part in [a, b, joined.as_str()] {
                if !vocab.contains_key(part) {
                    return Err(meta_error(format!(
                        "`tokenizer.ggml.merges`[{i}] `{m}` needs `{part}`, which is not in `tokenizer.ggml.tokens`"
                    )));
                }
            }
            merges.push((a.to_string(), b.to_string()));
        }
        let vocab: Vocab = vocab
            .into_iter()
            .map(|(t, id)| (t.to_string(), id))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| meta_error(format!("cannot build the BPE model: {e}")))?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_normalizer(component::<NormalizerWrapper>(entry, pre, "normalizer")?);
        inner.with_pre_tokenizer(component::<PreTokenizerWrapper>(
            entry,
            pre,
            "pre_tokenizer",
        )?);
        inner.with_decoder(component::<DecoderWrapper>(entry, pre, "decoder")?);
        let mut post = component::<PostProcessorWrapper>(entry, pre, "post_processor")?;
        let add_bos = meta.add_bos.unwrap_or(false);
        if add_bos {
            let bos = meta.bos_id.ok_or_else(|| {
                meta_error(
                    "`tokenizer.ggml.add_bos_token` is true but `tokenizer.ggml.bos_token_id` is missing"
                        .into(),
                )
            })?;
            let text = &meta.tokens[bos as usize];
            let template = tokenizers::processors::template::TemplateProcessing::builder()
                .try_single(format!("{text} $A"))
                .and_then(|b| b.try_pair(format!("{text} $A {text}:1 $B:1")))
                .map_err(|e| meta_error(format!("cannot make the BOS template: {e}")))?
                .special_tokens(vec![(text.clone(), bos)])
                .build()
                .map_err(|e| meta_error(format!("cannot make the BOS template: {e}")))?;
            let mut steps: Vec<PostProcessorWrapper> = post.into_iter().collect();
            steps.push(template.into());
            post = Some(PostProcessorWrapper::Sequence(
                tokenizers::processors::sequence::Sequence::new(steps),
            ));
        }
        inner.with_post_processor(post);

        // Control and user-defined tokens are matched whole; their ids are the vocabulary's.
        let mut special = HashSet::new();
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (id, token) in meta.tokens.iter().enumerate() {
            match ty(id) {
                token_type::CONTROL => {
                    special.insert(id as u32);
                    control.push(AddedToken::from(token.clone(), true).normalized(false));
                }
                token_type::USER_DEFINED => {
                    user.push(AddedToken::from(token.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        // Without token types, the declared special ids are at least matched whole.
        if meta.token_types.is_empty() {
            for id in [meta.bos_id, meta.eos_id, meta.eot_id, meta.pad_id]
                .into_iter()
                .flatten()
            {
                if special.insert(id) {
                    control.push(
                        AddedToken::from(meta.tokens[id as usize].clone(), true).normalized(false),
                    );
                }
            }
        }
        inner.add_special_tokens(&control);
        inner.add_tokens(&user);
        for t in control.iter().chain(&user) {
            let want = vocab_id(&meta.tokens, &t.content);
            if inner.token_to_id(&t.content) != want {
                return Err(meta_error(format!(
                    "added token `{}` did not keep its id {want:?}",
                    t.content
                )));
            }
        }

        let mut eos = Vec::new();
        for id in [meta.eos_id, meta.eot_id].into_iter().flatten() {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
        let name = |id: Option<u32>| id.map(|i| meta.tokens[i as usize].clone());
        Ok(Tokenizer {
            inner,
            path: None,
            eos,
            bos: meta.bos_id,
            chat_template: meta.chat_template.clone(),
            bos_token: name(meta.bos_id),
            eos_token: name(meta.eos_id),
            pad_token: name(meta.pad_id),
            add_bos,
            special,
        })
    }
}

fn vocab_id(tokens: &[String], token: &str) -> Option<u32> {
    tokens.iter().position(|t| t == token).map(|i| i as u32)
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "(none)".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
