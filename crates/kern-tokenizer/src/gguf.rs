//! A tokenizer built from GGUF metadata (`tokenizer.ggml.*`): the tokenizer that a model's
//! `tokenizer.json` describes, rebuilt from the token list, the merges or scores, the token types
//! and the pre-tokenizer name, so that it gives the same ids.
//!
//! Two kinds are rebuilt, picked by `tokenizer.ggml.model` through the data table:
//! byte-level BPE (`gguf_bpe.rs`: the byte-to-unicode alphabet, merges stored in the file) and
//! SentencePiece-style BPE (`gguf_spm.rs`: `▁` for spaces, `<0xXX>` byte fallback, merges rebuilt
//! from the scores as transformers' GGUF loader rebuilds them). This file holds what both share:
//! reading the metadata, checking the token table and the special ids, the added tokens, the
//! BOS/EOS post-processor and the [`Tokenizer`] it ends in.
//!
//! Which `tokenizer.ggml.model`, `tokenizer.ggml.pre` and `general.architecture` values are
//! known, and what each variant is (normalizer, pre-tokenizer, post-processor, decoder, in the
//! `tokenizers` crate's JSON), is data: `gguf-pre-tokenizers.json` at the crate root. Nothing
//! here names a model family.

use crate::{Result, Tokenizer, TokenizerError};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use tokenizers::{AddedToken, PostProcessorWrapper};

/// The table of known GGUF tokenizer models, pre-tokenizers and SentencePiece variants.
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
    /// `general.architecture`: picks the SentencePiece variant (see the data table).
    pub architecture: Option<String>,
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token of each id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`, one per token (SentencePiece vocabularies; may be empty).
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges`: `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (empty: all normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (read, and reported; see the data table for who honors
    /// it).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl GgufTokenizerMeta {
    /// Reads the fields from a JSON object keyed by GGUF key (`"tokenizer.ggml.tokens": [...]`,
    /// `"general.architecture": "..."`), as a GGUF reader that turns metadata into JSON would
    /// give them. Keys other than the ones above are ignored.
    pub fn from_json(meta: &Value) -> Result<GgufTokenizerMeta> {
        let bad = |key: &str, want: &str| meta_error(format!("`{key}` is not {want}"));
        let obj = meta
            .as_object()
            .ok_or_else(|| meta_error("the metadata is not a JSON object".into()))?;
        let get = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let string = |key: &str| -> Result<Option<String>> {
            match get(key) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(bad(key, "a string")),
            }
        };
        // An array of `T`, each element read by `f`; absent is empty.
        fn array<T>(
            v: Option<&Value>,
            f: impl Fn(&Value) -> Option<T>,
        ) -> std::result::Result<Vec<T>, ()> {
            match v {
                None => Ok(Vec::new()),
                Some(Value::Array(a)) => a.iter().map(f).collect::<Option<Vec<_>>>().ok_or(()),
                Some(_) => Err(()),
            }
        }
        let strings = |key: &str| {
            array(get(key), |v| v.as_str().map(str::to_string))
                .map_err(|()| bad(key, "an array of strings"))
        };
        let id = |key: &str| -> Result<Option<u32>> {
            get(key)
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| bad(key, "a token id"))
                })
                .transpose()
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            get(key)
                .map(|v| v.as_bool().ok_or_else(|| bad(key, "a boolean")))
                .transpose()
        };
        let types_key = "tokenizer.ggml.token_type";
        let scores_key = "tokenizer.ggml.scores";
        Ok(GgufTokenizerMeta {
            architecture: string("general.architecture")?,
            model: string("tokenizer.ggml.model")?
                .ok_or_else(|| meta_error("`tokenizer.ggml.model` is missing".into()))?,
            pre: string("tokenizer.ggml.pre")?,
            tokens: strings("tokenizer.ggml.tokens")?,
            // GGUF scores are f32; JSON carries them as (exact) doubles.
            scores: array(get(scores_key), |v| v.as_f64().map(|x| x as f32))
                .map_err(|()| bad(scores_key, "an array of numbers"))?,
            merges: strings("tokenizer.ggml.merges")?,
            token_types: array(get(types_key), |v| {
                v.as_i64().and_then(|n| i32::try_from(n).ok())
            })
            .map_err(|()| bad(types_key, "an array of integers"))?,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: string("tokenizer.chat_template")?,
        })
    }

    /// The type of token `id` (NORMAL when the file gives no types).
    pub(crate) fn ty(&self, id: usize) -> i32 {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(token_type::NORMAL)
    }
}

pub(crate) fn meta_error(message: String) -> TokenizerError {
    TokenizerError::Gguf { message }
}

/// The kinds of tokenizer `models` maps a `tokenizer.ggml.model` value to.
const BYTE_LEVEL_BPE: &str = "byte-level-bpe";
const SENTENCEPIECE_BPE: &str = "sentencepiece-bpe";

/// The `tokenizer.ggml.model` values, `tokenizer.ggml.pre` entries and SentencePiece variants
/// kern knows.
pub(crate) struct Known {
    /// `tokenizer.ggml.model` value → kind.
    pub models: serde_json::Map<String, Value>,
    pub pre: serde_json::Map<String, Value>,
    pub sentencepiece: serde_json::Map<String, Value>,
}

fn known() -> Result<Known> {
    let table: Value = serde_json::from_str(TABLE)
        .map_err(|e| meta_error(format!("gguf-pre-tokenizers.json is not valid JSON: {e}")))?;
    let section = |key: &str| table[key].as_object().cloned().unwrap_or_default();
    Ok(Known {
        models: section("models"),
        pre: section("pre"),
        sentencepiece: section("sentencepiece"),
    })
}

/// The `tokenizer.ggml.pre` values [`Tokenizer::from_gguf_metadata`] accepts for byte-level BPE.
pub fn supported_pre_tokenizers() -> Vec<String> {
    known()
        .map(|k| k.pre.keys().cloned().collect())
        .unwrap_or_default()
}

/// One component (`normalizer`, `decoder`, ...) of a table entry, as the `tokenizers` type.
pub(crate) fn component<T: serde::de::DeserializeOwned>(
    entry: &Value,
    name: &str,
    key: &str,
) -> Result<Option<T>> {
    match entry.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            meta_error(format!(
                "gguf-pre-tokenizers.json: `{name}`.{key} is not a tokenizers {key}: {e}"
            ))
        }),
    }
}

/// What a kind-specific builder hands back: the `tokenizers` tokenizer with its model,
/// normalizer, pre-tokenizer and decoder set, and the post-processor the table gives (BOS/EOS
/// are added on top here).
pub(crate) struct Built {
    pub inner: tokenizers::Tokenizer,
    pub post: Option<PostProcessorWrapper>,
    /// `add_bos` when the file does not say.
    pub add_bos_default: bool,
    /// Adds USER_DEFINED tokens only when the model's vocabulary has them as written (a
    /// whitespace token respelled with `▁` is then not added: transformers' rule).
    pub user_defined_in_vocab_only: bool,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file's metadata describes.
    ///
    /// - `model` picks the kind (`gguf-pre-tokenizers.json`, `models`): byte-level BPE, whose
    ///   `pre` must be a known pre-tokenizer, or SentencePiece-style BPE, whose variant is picked
    ///   by `architecture`. Unknown values are refused by name, with the supported list.
    /// - Every token keeps its GGUF id. CONTROL (3) tokens become special added tokens and
    ///   USER_DEFINED (4) tokens added tokens, so both are matched whole in text before the
    ///   model runs; the BOS, EOS, UNK and PAD tokens are special added tokens too (transformers
    ///   registers its named special tokens so).
    /// - EOS ids: `eos_id`, then `eot_id`; BOS: `bos_id`, added by `encode(…, true)` when
    ///   `add_bos` is true (default: false for byte-level BPE, true for SentencePiece, as
    ///   transformers and the GGML runtime have it); EOS likewise with `add_eos` (default false). The
    ///   chat template is `chat_template`, with the BOS and EOS tokens' text as `bos_token` /
    ///   `eos_token`.
    pub fn from_gguf_metadata(meta: GgufTokenizerMeta) -> Result<Tokenizer> {
        let known = known()?;
        let kind = known.models.get(&meta.model).and_then(Value::as_str);
        let Some(kind) = kind else {
            let names: Vec<String> = known.models.keys().cloned().collect();
            return Err(meta_error(format!(
                "`tokenizer.ggml.model` is `{}`; kern builds tokenizers of kind {} only",
                meta.model,
                list(&names)
            )));
        };
        check_tokens(&meta)?;
        let built = match kind {
            BYTE_LEVEL_BPE => crate::gguf_bpe::build(&meta, &known)?,
            SENTENCEPIECE_BPE => crate::gguf_spm::build(&meta, &known)?,
            other => {
                return Err(meta_error(format!(
                    "gguf-pre-tokenizers.json: `models`.`{}` is `{other}`, not `{BYTE_LEVEL_BPE}` or `{SENTENCEPIECE_BPE}`",
                    meta.model
                )))
            }
        };
        finish(meta, built)
    }
}

/// The checks both kinds share: a token table, one type per token, special ids inside it.
fn check_tokens(meta: &GgufTokenizerMeta) -> Result<()> {
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
    if let Some((id, t)) = meta
        .token_types
        .iter()
        .enumerate()
        .find(|(_, t)| !(1..=6).contains(*t))
    {
        return Err(meta_error(format!(
            "`tokenizer.ggml.token_type`[{id}] is {t}, not a GGUF token type (1 normal … 6 byte)"
        )));
    }
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", meta.bos_id),
        ("tokenizer.ggml.eos_token_id", meta.eos_id),
        ("tokenizer.ggml.unknown_token_id", meta.unk_id),
        ("tokenizer.ggml.padding_token_id", meta.pad_id),
        ("tokenizer.ggml.eot_token_id", meta.eot_id),
    ] {
        if let Some(id) = id {
            if id as usize >= n {
                return Err(meta_error(format!(
                    "`{key}` is {id}, past the {n} tokens of `tokenizer.ggml.tokens`"
                )));
            }
            if meta.ty(id as usize) == token_type::UNUSED {
                return Err(meta_error(format!(
                    "`{key}` is {id}, an UNUSED (type 5) token `{}`",
                    meta.tokens[id as usize]
                )));
            }
        }
    }
    Ok(())
}

/// Adds the added tokens and the BOS/EOS post-processor to a built model; makes the
/// [`Tokenizer`].
fn finish(meta: GgufTokenizerMeta, built: Built) -> Result<Tokenizer> {
    let Built {
        mut inner,
        post,
        add_bos_default,
        user_defined_in_vocab_only,
    } = built;
    let add_bos = meta.add_bos.unwrap_or(add_bos_default);
    let add_eos = meta.add_eos.unwrap_or(false);
    inner.with_post_processor(bos_eos(&meta, post, add_bos, add_eos)?);

    // Control and user-defined tokens are matched whole; their ids are the vocabulary's.
    let mut special = HashSet::new();
    let mut control = Vec::new();
    let mut user = Vec::new();
    let mut want: HashMap<&str, u32> = HashMap::new();
    for (id, token) in meta.tokens.iter().enumerate() {
        match meta.ty(id) {
            token_type::CONTROL => {
                special.insert(id as u32);
                control.push(AddedToken::from(token.clone(), true).normalized(false));
                want.insert(token, id as u32);
            }
            token_type::USER_DEFINED => {
                if user_defined_in_vocab_only && inner.token_to_id(token).is_none() {
                    continue;
                }
                user.push(AddedToken::from(token.clone(), false).normalized(false));
                want.insert(token, id as u32);
            }
            _ => {}
        }
    }
    // The named special tokens are special even when their type is not CONTROL (an UNKNOWN
    // `<unk>`), unless they are already added; without types, the end-of-turn token too.
    let eot = meta.eot_id.filter(|_| meta.token_types.is_empty());
    for id in [meta.bos_id, meta.eos_id, meta.unk_id, meta.pad_id, eot]
        .into_iter()
        .flatten()
    {
        let token = &meta.tokens[id as usize];
        if !want.contains_key(token.as_str()) && special.insert(id) {
            control.push(AddedToken::from(token.clone(), true).normalized(false));
            want.insert(token, id);
        }
    }
    inner.add_special_tokens(&control);
    inner.add_tokens(&user);
    for (token, id) in &want {
        if inner.token_to_id(token) != Some(*id) {
            return Err(meta_error(format!(
                "added token `{token}` did not keep its id {id} (is it spelled differently in the vocabulary?)"
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
        bos_token: name(meta.bos_id),
        eos_token: name(meta.eos_id),
        pad_token: name(meta.pad_id),
        unk_token: name(meta.unk_id),
        add_bos,
        add_eos,
        special,
        chat_template: meta.chat_template,
    })
}

/// The table's post-processor followed by a template that adds BOS and/or EOS, as
/// transformers' `update_post_processor` writes it (`<bos>:0 $A:0 <eos>:0`).
fn bos_eos(
    meta: &GgufTokenizerMeta,
    post: Option<PostProcessorWrapper>,
    add_bos: bool,
    add_eos: bool,
) -> Result<Option<PostProcessorWrapper>> {
    if !add_bos && !add_eos {
        return Ok(post);
    }
    let token = |add: bool, key: &str, id: Option<u32>| -> Result<Option<(String, u32)>> {
        if !add {
            return Ok(None);
        }
        let id = id.ok_or_else(|| {
            meta_error(format!(
                "`tokenizer.ggml.add_{key}_token` is true but `tokenizer.ggml.{key}_token_id` is missing"
            ))
        })?;
        Ok(Some((meta.tokens[id as usize].clone(), id)))
    };
    let bos = token(add_bos, "bos", meta.bos_id)?;
    let eos = token(add_eos, "eos", meta.eos_id)?;
    let seq = |s: &str, type_id: u32| {
        let mut parts = Vec::new();
        if let Some((t, _)) = &bos {
            parts.push(format!("{t}:{type_id}"));
        }
        parts.push(format!("{s}:{type_id}"));
        if let Some((t, _)) = &eos {
            parts.push(format!("{t}:{type_id}"));
        }
        parts.join(" ")
    };
    let specials: Vec<(String, u32)> = bos.iter().chain(eos.iter()).cloned().collect();
    let template = tokenizers::processors::template::TemplateProcessing::builder()
        .try_single(seq("$A", 0))
        .and_then(|b| b.try_pair(format!("{} {}", seq("$A", 0), seq("$B", 1))))
        .map_err(|e| meta_error(format!("cannot make the BOS/EOS template: {e}")))?
        .special_tokens(specials)
        .build()
        .map_err(|e| meta_error(format!("cannot make the BOS/EOS template: {e}")))?;
    let mut steps: Vec<PostProcessorWrapper> = post.into_iter().collect();
    steps.push(template.into());
    Ok(Some(if steps.len() == 1 {
        steps.pop().expect("one step")
    } else {
        PostProcessorWrapper::Sequence(tokenizers::processors::sequence::Sequence::new(steps))
    }))
}

/// `a`, `b` as an error message lists names.
pub(crate) fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "(none)".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
