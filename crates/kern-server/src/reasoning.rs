//! Reasoning blocks: a thinking model writes `<think>…</think>` before its answer (or its
//! prompt already opened the block). The block is returned apart from the answer, as
//! `reasoning_content` (and vLLM's newer `reasoning`), whole or streamed; tool calls are parsed
//! from the answer only. A block that never closes (cut by `max_tokens`) is all reasoning.

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a chat template writes reasoning blocks (judged from its source).
pub fn detect(template: &str) -> bool {
    template.contains(OPEN) && template.contains(CLOSE)
}

/// Whether a rendered prompt leaves a reasoning block open (the template opened it for the
/// model), so the output starts inside it.
pub fn open_in_prompt(prompt: &str) -> bool {
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Whether a rendered prompt already closed the block at its end (a template's way of turning
/// thinking off, e.g. `enable_thinking: false` appending `<think>\n\n</think>\n\n`): the output
/// is all answer.
pub fn closed_in_prompt(prompt: &str) -> bool {
    prompt.trim_end().ends_with(CLOSE)
}

/// A piece of output.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Reasoning(String),
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Before the first non-whitespace text: a block may open.
    Start,
    Reasoning,
    /// After the block: leading newlines of the answer are dropped.
    AnswerStart,
    Answer,
}

/// Splits one output into reasoning and answer as it streams.
pub struct Splitter {
    state: State,
    buf: String,
}

impl Splitter {
    /// `open`: the prompt left a block open (the output starts in it).
    pub fn new(open: bool) -> Splitter {
        Splitter { state: if open { State::Reasoning } else { State::Start }, buf: String::new() }
    }

    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        self.step(false)
    }

    pub fn finish(&mut self) -> Vec<Part> {
        self.step(true)
    }

    fn step(&mut self, end: bool) -> Vec<Part> {
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.starts_with(OPEN) {
                        let skip = self.buf.len() - t.len() + OPEN.len();
                        self.buf.drain(..skip);
                        self.state = State::Reasoning;
                        continue;
                    }
                    if !end && (t.is_empty() || OPEN.starts_with(t)) {
                        return out; // could still be the opening tag
                    }
                    self.state = State::Answer;
                }
                State::Reasoning => {
                    if let Some(at) = self.buf.find(CLOSE) {
                        let r: String = self.buf[..at].to_string();
                        self.buf.drain(..at + CLOSE.len());
                        push(&mut out, Part::Reasoning(r));
                        self.state = State::AnswerStart;
                        continue;
                    }
                    let keep = if end { 0 } else { held(&self.buf, CLOSE) };
                    let r: String = self.buf.drain(..self.buf.len() - keep).collect();
                    push(&mut out, Part::Reasoning(r));
                    return out;
                }
                State::AnswerStart => {
                    let t = self.buf.trim_start_matches(['\n', '\r']);
                    if t.is_empty() && !end {
                        self.buf.clear();
                        return out;
                    }
                    self.buf = t.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    let a = std::mem::take(&mut self.buf);
                    push(&mut out, Part::Answer(a));
                    return out;
                }
            }
        }
    }
}

fn push(out: &mut Vec<Part>, p: Part) {
    match &p {
        Part::Reasoning(s) | Part::Answer(s) if s.is_empty() => {}
        _ => out.push(p),
    }
}

/// Bytes at the end of `s` that could be the start of `tag`.
fn held(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])).unwrap_or(0)
}

/// A whole output split: (reasoning, answer). Reasoning is None when there was no block; its
/// text is trimmed of the newlines around it.
pub fn split(text: &str, open: bool) -> (Option<String>, String) {
    let mut s = Splitter::new(open);
    let mut parts = s.push(text);
    parts.extend(s.finish());
    let (mut r, mut a, mut any) = (String::new(), String::new(), open);
    for p in parts {
        match p {
            Part::Reasoning(t) => {
                any = true;
                r.push_str(&t);
            }
            Part::Answer(t) => a.push_str(&t),
        }
    }
    any |= text.trim_start().starts_with(OPEN);
    (any.then(|| r.trim_matches(['\n', '\r']).to_string()), a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_whole_and_streamed_alike() {
        let cases = [
            ("<think>\nplan it\n</think>\n\nThe answer.", false, Some("plan it"), "The answer."),
            ("plan it</think>\n\nThe answer.", true, Some("plan it"), "The answer."),
            ("The answer.", false, None, "The answer."),
            ("<think>\nnever ends", false, Some("never ends"), ""),
            ("  <think>x</think>y", false, Some("x"), "y"),
            ("<thinking is a word", false, None, "<thinking is a word"),
        ];
        for (text, open, r, a) in cases {
            assert_eq!(split(text, open), (r.map(str::to_string), a.to_string()), "{text:?}");
            // Streamed one character at a time, the parts concatenate to the same split.
            let mut s = Splitter::new(open);
            let mut parts = Vec::new();
            for c in text.chars() {
                parts.extend(s.push(&c.to_string()));
            }
            parts.extend(s.finish());
            let rs: String = parts.iter().filter_map(|p| if let Part::Reasoning(t) = p { Some(t.as_str()) } else { None }).collect();
            let ans: String = parts.iter().filter_map(|p| if let Part::Answer(t) = p { Some(t.as_str()) } else { None }).collect();
            assert_eq!(ans, a, "{text:?}");
            assert_eq!(rs.trim_matches('\n'), r.unwrap_or(""), "{text:?}");
        }
        assert!(open_in_prompt("<|im_start|>assistant\n<think>\n") && !open_in_prompt("a <think>x</think> b"));
        assert!(closed_in_prompt("assistant\n<think>\n\n</think>\n\n"));
    }
}
