//! The model's vocabulary as llguidance sees it: the bytes of every token (special tokens
//! marked, so grammars never produce them as text), the end-of-sequence ids, and tokenization
//! through kern's own tokenizer. The bytes come from the tokenizer's vocabulary and decoder
//! kind (byte-level BPE, or byte-fallback pieces) — what llguidance's `tokenizer.json` reader
//! does, on the loaded tokenizer (also what a GGUF tokenizer is rebuilt into), so neither a
//! second copy of the tokenizer library nor a JSON round trip of a 150k vocabulary is needed.

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
        let mut words = token_bytes(&tok)?;
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

/// Every token's bytes, indexed by id; special added tokens start with llguidance's marker byte
/// 0xFF (never produced as text).
pub fn token_bytes(tok: &Tokenizer) -> Result<Vec<Vec<u8>>, String> {
    use tokenizers::DecoderWrapper as D;
    let inner = tok.inner();
    let (byte_level, byte_fallback) = match inner.get_decoder() {
        Some(D::ByteLevel(_)) => (true, false),
        Some(D::Sequence(s)) => (s.get_decoders().iter().any(|d| matches!(d, D::ByteLevel(_))), s.get_decoders().iter().any(|d| matches!(d, D::ByteFallback(_)))),
        _ => (false, false),
    };
    if !byte_level && !byte_fallback {
        return Err("this tokenizer's token bytes cannot be recovered (its decoder is neither byte-level nor byte-fallback): constrained decoding needs a byte-level or byte-fallback BPE vocabulary".into());
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    let put = |id: u32, b: Vec<u8>, out: &mut Vec<Vec<u8>>| {
        let i = id as usize;
        if out.len() <= i {
            out.resize(i + 1, Vec::new());
        }
        out[i] = b;
    };
    let added = inner.get_added_tokens_decoder();
    for (&id, t) in &added {
        let mut b = t.content.as_bytes().to_vec();
        if t.special {
            b.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
        put(id, b, &mut out);
    }
    let chars = byte_level_chars();
    for (piece, id) in inner.get_vocab(false) {
        if added.contains_key(&id) {
            continue;
        }
        let b = if byte_level {
            piece.chars().map(|c| chars.get(&c).copied().ok_or_else(|| format!("token {id} ({piece:?}) is not byte-level text"))).collect::<Result<Vec<u8>, String>>()?
        } else if let Some(hex) = piece.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).filter(|h| h.len() == 2) {
            vec![u8::from_str_radix(hex, 16).map_err(|_| format!("token {id} ({piece:?}) is not a byte"))?]
        } else {
            piece.replace('\u{2581}', " ").into_bytes()
        };
        put(id, b, &mut out);
    }
    Ok(out)
}

/// The byte-level BPE alphabet: the character that stands for each byte (printable bytes stand
/// for themselves, the others for U+0100 on, in order).
fn byte_level_chars() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut m = std::collections::HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        if printable(b) {
            m.insert(b as char, b);
        } else {
            m.insert(char::from_u32(next).expect("below 0x200"), b);
            next += 1;
        }
    }
    m
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_byte_level_alphabet_covers_every_byte() {
        let m = super::byte_level_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'\u{120}'], b' ', "Ġ is the space");
        assert_eq!(m[&'a'], b'a');
    }
}
