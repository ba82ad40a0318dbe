//! The model's vocabulary as llguidance sees it: the bytes of every token (special tokens
//! marked, so grammars never produce them as text), the end-of-sequence ids, and tokenization
//! through kern's own tokenizer. Built from the tokenizer's `tokenizer.json` form (also what a
//! GGUF tokenizer is rebuilt into), so no second copy of the Hugging Face tokenizer library is
//! needed.

use kern_tokenizer::Tokenizer;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use std::sync::Arc;

pub struct KernTokEnv {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl KernTokEnv {
    /// The vocabulary of `tok`, padded with empty (never allowed) tokens to `n_vocab` (the
    /// logits' width, which may exceed the tokenizer's count); `eos`: the ids that end a
    /// sequence (allowed once the grammar is complete).
    pub fn new(tok: Arc<Tokenizer>, n_vocab: usize, eos: &[u32]) -> Result<KernTokEnv, String> {
        let json = tok.inner().to_string(false).map_err(|e| format!("serializing the tokenizer: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| format!("reading the tokenizer's JSON: {e}"))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&v).map_err(|e| format!("this tokenizer's token bytes cannot be recovered ({e}): constrained decoding needs a byte-level or byte-fallback BPE vocabulary"))?;
        let n = n_vocab.max(words.len());
        words.resize(n, Vec::new());
        let Some(&first) = eos.first() else {
            return Err("constrained decoding needs the model's end-of-sequence token, and none is known (no eos in the tokenizer's config)".into());
        };
        let info = TokRxInfo::new(n as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        Ok(KernTokEnv { trie, tok })
    }

    pub fn into_env(self) -> llguidance::toktrie::TokEnv {
        Arc::new(self)
    }
}

impl TokenizerEnv for KernTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // The model's own tokenization when the bytes are text; the trie's greedy one otherwise
        // (a byte sequence that is not UTF-8 has no canonical tokenization anyway).
        match std::str::from_utf8(s) {
            Ok(text) => self.tok.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
