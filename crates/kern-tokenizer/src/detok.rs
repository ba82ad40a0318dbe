//! Incremental detokenization: text for each generated token as soon as it is complete.
//!
//! Decoding one token at a time is wrong in two ways: a token may hold part of a UTF-8
//! character (byte-level BPE splits emoji and CJK characters across tokens; SentencePiece has
//! byte-fallback tokens `<0xE4>`), and some decoders treat a token differently at the start
//! of a text (SentencePiece drops the leading space of the first word). So, as in
//! text-generation-inference and vLLM, the detokenizer decodes a short window: the tokens
//! emitted last (the *prefix*, context only) and the new ones after them. The text beyond
//! the prefix's own decoding is new, and is emitted once it does not end in U+FFFD, the mark
//! of an incomplete character. Then the new tokens become the next prefix.

use crate::{Result, Tokenizer};

/// Tokens of a prompt kept as context by [`Detokenizer::with_context`].
const CONTEXT_TOKENS: usize = 5;

/// Turns one sequence's ids into text, token by token.
///
/// The pushes' texts and `finish()` together equal `decode` of all the ids whenever text, once
/// complete, is not changed by later tokens: always for byte-level BPE (invalid bytes become
/// U+FFFD one character at a time), and for SentencePiece byte fallback as long as each run of
/// byte tokens is UTF-8. A run that turns invalid later makes the `ByteFallback` decoder
/// replace all of it, characters already streamed included; the stream keeps those.
#[derive(Clone, Debug)]
pub struct Detokenizer<'t> {
    tok: &'t Tokenizer,
    skip_special: bool,
    /// The window: `ids[..read]` is the prefix, whose text is `prefix`; `ids[read..]` are
    /// tokens whose text was not emitted yet.
    ids: Vec<u32>,
    read: usize,
    prefix: String,
}

impl<'t> Detokenizer<'t> {
    /// A detokenizer for a sequence with no context: the first token is decoded as the start
    /// of a text.
    pub fn new(tok: &'t Tokenizer, skip_special: bool) -> Self {
        Detokenizer {
            tok,
            skip_special,
            ids: vec![],
            read: 0,
            prefix: String::new(),
        }
    }

    /// A detokenizer for text that continues `prompt`: the prompt's last few ids are context
    /// (never emitted), so the first generated token decodes as it does mid-text (with its
    /// leading space, for SentencePiece).
    pub fn with_context(tok: &'t Tokenizer, skip_special: bool, prompt: &[u32]) -> Result<Self> {
        let ids = prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..].to_vec();
        let prefix = tok.decode(&ids, skip_special)?;
        Ok(Detokenizer {
            tok,
            skip_special,
            read: ids.len(),
            ids,
            prefix,
        })
    }

    /// Adds a generated id; returns the text it completes, if any. `None` means the text so
    /// far ends inside a character (or the token decodes to nothing, like a skipped special
    /// token): the text comes with a later token or from [`Detokenizer::finish`].
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let new = text[shared_prefix(&self.prefix, &text)..].to_string();
        // The tokens just emitted are the context of the next window.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix = self.tok.decode(&self.ids, self.skip_special)?;
        Ok(Some(new))
    }

    /// The text of the ids not emitted yet, even if it ends inside a character (shown as
    /// U+FFFD); call it at the end of the sequence. The detokenizer can go on after it.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.tok.decode(&self.ids, self.skip_special)?;
        let rest = text[shared_prefix(&self.prefix, &text)..].to_string();
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix = self.tok.decode(&self.ids, self.skip_special)?;
        Ok(rest)
    }

    /// Ids pushed whose text was not emitted yet.
    pub fn pending(&self) -> &[u32] {
        &self.ids[self.read..]
    }
}

/// The length of the longest common prefix of `a` and `b`, at a character boundary: all of
/// `a` when `b` starts with it (the usual case).
fn shared_prefix(a: &str, b: &str) -> usize {
    if b.starts_with(a) {
        return a.len();
    }
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::shared_prefix;

    #[test]
    fn shared_prefix_at_char_boundaries() {
        assert_eq!(shared_prefix("abc", "abcdef"), 3);
        assert_eq!(shared_prefix("ab\u{FFFD}", "abé"), 2);
        assert_eq!(shared_prefix("", "x"), 0);
        assert_eq!(shared_prefix("abc", "ab"), 2);
    }
}
