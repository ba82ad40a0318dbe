//! Byte-level BPE from GGUF metadata: the tokens are written in the byte-to-unicode
//! alphabet and the file stores the merges, ranked by position. The normalizer, pre-tokenizer,
//! post-processor and decoder come from the `pre` entry of `gguf-pre-tokenizers.json` that
//! `tokenizer.ggml.pre` names.

use crate::gguf::{component, list, meta_error, token_type, Built, GgufTokenizerMeta, Known};
use crate::Result;
use serde_json::Value;
use std::collections::HashMap;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::{DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper};

/// The byte-level BPE model and its `pre` entry's components.
pub(crate) fn build(meta: &GgufTokenizerMeta, known: &Known) -> Result<Built> {
    let pre = meta.pre.as_deref().unwrap_or("default");
    let Some(entry) = known.pre.get(pre) else {
        let names: Vec<String> = known.pre.keys().cloned().collect();
        return Err(meta_error(format!(
            "`tokenizer.ggml.pre` is `{pre}`, a pre-tokenizer kern does not know; supported: {} (add an entry to kern-tokenizer's gguf-pre-tokenizers.json with the regex of the model's tokenizer.json)",
            list(&names)
        )));
    };

    // UNUSED (5) fillers (`[PAD…]` rows past the real vocabulary) are left out, so their ids
    // decode to nothing, as with the model's `tokenizer.json`.
    let mut vocab: HashMap<&str, u32> = HashMap::with_capacity(meta.tokens.len());
    for (id, token) in meta.tokens.iter().enumerate() {
        if meta.ty(id) == token_type::UNUSED {
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
    // `bpe` options of the entry: `ignore_merges` (a word that is a token is taken whole, as
    // tiktoken-derived vocabularies expect).
    let ignore_merges = entry
        .pointer("/bpe/ignore_merges")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
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
    Ok(Built {
        inner,
        post: component::<PostProcessorWrapper>(entry, pre, "post_processor")?,
        add_bos_default: false,
        user_defined_in_vocab_only: false,
    })
}
