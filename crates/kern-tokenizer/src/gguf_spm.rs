//! SentencePiece-style BPE from GGUF metadata, rebuilt as transformers' GGUF loader rebuilds it
//! (`integrations/gguf/gguf_tokenizer_mapping.py`), so that the ids are the same.
//!
//! The file has the pieces (`▁` for a space, `<0xXX>` byte tokens for byte fallback), one score
//! per piece and no merges. The merges are rebuilt the way transformers' `generate_merges` does:
//! every split of every token into two tokens is a merge, ranked by the merged token's rank
//! (its score, or its position in the file for vocabularies whose scores are not a merge
//! order), then by the left part's length, then the right part's, all descending, ties kept
//! in generation order. The variant (normalizer, pre-tokenizer, decoder, rank, respelling) is
//! the `sentencepiece` entry of `gguf-pre-tokenizers.json` whose `architectures` holds
//! `general.architecture`, else `default`.
//!
//! Where the GGML runtime (the C++ reference for GGUF files) differs: it merges by score at run time (no merge table) and honors
//! `tokenizer.ggml.add_space_prefix`; transformers ignores that flag for the `default` variant
//! (always a prefix space on the first section) and never adds one for variants without
//! `Metaspace`. kern follows transformers.

use crate::gguf::{component, list, meta_error, Built, GgufTokenizerMeta, Known};
use crate::Result;
use serde_json::Value;
use std::cmp::Ordering;
use std::collections::HashMap;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::{DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper};

/// How merges are ranked (`merge_rank` of a variant).
enum Rank {
    /// By `tokenizer.ggml.scores`, highest first.
    Score,
    /// By position in `tokenizer.ggml.tokens`, first first.
    Position,
}

/// The SentencePiece-style BPE model and its variant's components.
pub(crate) fn build(meta: &GgufTokenizerMeta, known: &Known) -> Result<Built> {
    let (name, entry) = variant(meta, known)?;
    let n = meta.tokens.len();
    let rank = match entry.get("merge_rank").and_then(Value::as_str) {
        Some("score") => Rank::Score,
        Some("position") => Rank::Position,
        other => {
            return Err(meta_error(format!(
                "gguf-pre-tokenizers.json: `sentencepiece`.`{name}`.merge_rank is {other:?}, not \"score\" or \"position\""
            )))
        }
    };
    if matches!(rank, Rank::Score) && meta.scores.len() != n {
        return Err(meta_error(format!(
            "`tokenizer.ggml.scores` has {} entries for {n} tokens in `tokenizer.ggml.tokens` (a SentencePiece vocabulary ranks its merges by them)",
            meta.scores.len()
        )));
    }
    if let Some(i) = meta.scores.iter().position(|s| s.is_nan()) {
        return Err(meta_error(format!("`tokenizer.ggml.scores`[{i}] is NaN")));
    }
    if !meta.merges.is_empty() {
        // transformers would take them; no SentencePiece GGUF kern has seen carries any, and
        // rebuilding them from the scores is what the GGML runtime's merging by score amounts to.
        return Err(meta_error(format!(
            "`tokenizer.ggml.merges` has {} merges, but a `{}` vocabulary is expected to have none (its merges come from the scores)",
            meta.merges.len(),
            meta.model
        )));
    }

    // A token of two or more spaces may be stored with real spaces, which the normalizer never
    // leaves in the text: respelled as a run of `▁`, the merges built from it match.
    let respell = entry
        .get("respell_space_tokens")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tokens: Vec<String> = meta
        .tokens
        .iter()
        .map(|t| {
            if respell && t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect();
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (id, token) in tokens.iter().enumerate() {
        if let Some(first) = ids.insert(token.as_str(), id as u32) {
            return Err(meta_error(format!(
                "`tokenizer.ggml.tokens` holds `{token}` twice (ids {first} and {id})"
            )));
        }
    }
    let merges = match rank {
        Rank::Score => merges_by_rank(&tokens, &ids, |i| f64::from(meta.scores[i])),
        Rank::Position => merges_by_rank(&tokens, &ids, |i| -(i as f64)),
    };

    let unk = match entry.get("unk_in_model").and_then(Value::as_bool) {
        Some(true) => meta.unk_id.map(|id| tokens[id as usize].clone()),
        _ => None,
    };
    let vocab: Vocab = ids.into_iter().map(|(t, id)| (t.to_string(), id)).collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| meta_error(format!("cannot build the BPE model: {e}")))?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_normalizer(component::<NormalizerWrapper>(entry, name, "normalizer")?);
    inner.with_pre_tokenizer(component::<PreTokenizerWrapper>(
        entry,
        name,
        "pre_tokenizer",
    )?);
    inner.with_decoder(component::<DecoderWrapper>(entry, name, "decoder")?);
    Ok(Built {
        inner,
        post: None,
        // Files without the flag get BOS: the GGML runtime adds it to SentencePiece vocabularies
        // unless told otherwise, and transformers follows.
        add_bos_default: true,
        user_defined_in_vocab_only: true,
    })
}

/// The `sentencepiece` entry for `general.architecture`: the one whose `architectures` lists
/// it, else `default`.
fn variant<'a>(meta: &GgufTokenizerMeta, known: &'a Known) -> Result<(&'a str, &'a Value)> {
    // Guessing the variant would give another model's ids without a word: refuse instead.
    let Some(arch) = meta.architecture.as_deref() else {
        return Err(meta_error(format!(
            "`general.architecture` is missing: a `{}` (SentencePiece) vocabulary is rebuilt per architecture, so pass that key with the `tokenizer.*` ones",
            meta.model
        )));
    };
    let arch = Some(arch);
    let listed = |e: &Value| {
        e.get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x.as_str().is_some() && x.as_str() == arch))
    };
    if let Some((name, entry)) = known.sentencepiece.iter().find(|(_, e)| listed(e)) {
        return Ok((name.as_str(), entry));
    }
    known
        .sentencepiece
        .get_key_value("default")
        .map(|(k, v)| (k.as_str(), v))
        .ok_or_else(|| {
            let names: Vec<String> = known.sentencepiece.keys().cloned().collect();
            meta_error(format!(
                "gguf-pre-tokenizers.json has no `sentencepiece` variant for `general.architecture` {arch:?} and no `default` (it has {})",
                list(&names)
            ))
        })
}

/// One candidate merge: the ids of its two parts and what ranks it.
struct Candidate {
    left: u32,
    right: u32,
    rank: f64,
    left_len: usize,
    right_len: usize,
}

/// transformers' `generate_merges(vocab, vocab_scores)`: for each token in file order, every
/// split into two tokens (sorted by the parts' ids), then all of them sorted stably by
/// (rank, left length, right length), descending. Lengths count characters, as Python's
/// `len` does; `-0.0` and `0.0` rank alike, as in Python.
fn merges_by_rank(
    tokens: &[String],
    ids: &HashMap<&str, u32>,
    rank: impl Fn(usize) -> f64,
) -> Merges {
    let mut all: Vec<Candidate> = Vec::new();
    let mut local: Vec<Candidate> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let chars = token.chars().count();
        for (k, (at, _)) in token.char_indices().enumerate().skip(1) {
            let (a, b) = token.split_at(at);
            if let (Some(&left), Some(&right)) = (ids.get(a), ids.get(b)) {
                local.push(Candidate {
                    left,
                    right,
                    rank: rank(i),
                    left_len: k,
                    right_len: chars - k,
                });
            }
        }
        local.sort_by_key(|c| (c.left, c.right));
        all.append(&mut local);
    }
    all.sort_by(|x, y| {
        y.rank
            .partial_cmp(&x.rank)
            .unwrap_or(Ordering::Equal)
            .then(y.left_len.cmp(&x.left_len))
            .then(y.right_len.cmp(&x.right_len))
    });
    all.into_iter()
        .map(|c| {
            (
                tokens[c.left as usize].clone(),
                tokens[c.right as usize].clone(),
            )
        })
        .collect()
}
