//! One request's text: incremental detokenization (whole UTF-8 characters only) and stop
//! strings matched on the decoded text across token boundaries. Text that could still turn
//! out to be the start of a stop string is held back (at most the longest stop string's
//! length minus one byte), so a stop string is never emitted, not even in part.

use kern_tokenizer::{Detokenizer, Tokenizer};

pub(crate) struct TextState<'t> {
    detok: Option<Detokenizer<'t>>,
    stop: Vec<String>,
    include_stop: bool,
    /// The decoded output so far.
    text: String,
    /// Bytes of `text` already emitted.
    sent: usize,
    holdback: usize,
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl<'t> TextState<'t> {
    pub fn new(tok: Option<&'t Tokenizer>, prompt: &[u32], skip_special: bool, stop: Vec<String>, include_stop: bool) -> Result<Self, String> {
        let detok = match tok {
            Some(t) => Some(Detokenizer::with_context(t, skip_special, prompt).map_err(|e| e.to_string())?),
            None => None,
        };
        let holdback = stop.iter().map(|s| s.len()).max().unwrap_or(1).saturating_sub(1);
        Ok(TextState { detok, stop, include_stop, text: String::new(), sent: 0, holdback })
    }

    /// Adds a token: the text that is now final, and the stop string if one matched (then the
    /// output ends here).
    pub fn push(&mut self, id: u32) -> Result<(String, Option<String>), String> {
        let Some(d) = self.detok.as_mut() else { return Ok((String::new(), None)) };
        let before = self.text.len();
        if let Some(piece) = d.push(id).map_err(|e| e.to_string())? {
            self.text.push_str(&piece);
        }
        if self.text.len() > before && !self.stop.is_empty() {
            // A match must end in the new text; it cannot start before `sent` (held back).
            let from = floor_boundary(&self.text, before.saturating_sub(self.holdback)).max(self.sent);
            let hit = self.stop.iter().filter_map(|s| self.text[from..].find(s.as_str()).map(|i| (from + i, s))).min_by_key(|(i, s)| (*i, std::cmp::Reverse(s.len())));
            if let Some((at, s)) = hit {
                let s = s.clone();
                let end = if self.include_stop { at + s.len() } else { at };
                let out = self.text[self.sent..end.max(self.sent)].to_string();
                self.sent = end.max(self.sent);
                return Ok((out, Some(s)));
            }
        }
        let safe = floor_boundary(&self.text, self.text.len().saturating_sub(self.holdback));
        if safe > self.sent {
            let out = self.text[self.sent..safe].to_string();
            self.sent = safe;
            Ok((out, None))
        } else {
            Ok((String::new(), None))
        }
    }

    /// The output ends (length or end-of-sequence): everything not emitted yet, including an
    /// incomplete character at the very end (as U+FFFD).
    pub fn finish(&mut self) -> Result<String, String> {
        if let Some(d) = self.detok.as_mut() {
            let rest = d.finish().map_err(|e| e.to_string())?;
            self.text.push_str(&rest);
        }
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::floor_boundary;

    #[test]
    fn boundaries() {
        assert_eq!(floor_boundary("aé", 2), 1);
        assert_eq!(floor_boundary("aé", 9), 3);
    }
}
