//! Precision mode's end-to-end score on real text: both programs teacher-forced over windows of
//! the text (the first half of each window prefilled as context, the second half fed one
//! token per decode step, all windows side by side as sequences), each position's logits
//! compared: KL(A ‖ B), top-1 agreement, and each side's perplexity of the text.

use super::*;
use crate::precision::{TextAccumulator, TextScore};
use std::path::Path;

/// The tokens to score and how they are cut into windows.
#[derive(Debug)]
pub(super) struct TextPlan {
    pub tokens: Vec<u32>,
    pub source: String,
    pub window: usize,
    pub windows: usize,
}

impl TextPlan {
    /// KV pages the windows need together.
    pub fn pages(&self, page_tokens: usize) -> usize {
        self.windows * (self.window.div_ceil(page_tokens) + 1)
    }
}

/// Token ids from a file: integers separated by whitespace or commas.
pub fn parse_token_ids(text: &str) -> Result<Vec<u32>, String> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| s.parse::<u32>().map_err(|e| format!("token {i} `{s}`: {e}")))
        .collect()
}

/// Resolves `--tokens` / `--text` (or the built-in text, or seeded random ids) into windows
/// that fit the manifests' context and sequence limits.
pub(super) fn plan(p: &PrecisionOptions, tok_dir: &Path, vocab: usize, max_context: usize, max_seqs: usize, seed: u64, notes: &mut Vec<String>) -> Result<TextPlan, Incomparable> {
    let tokenize = |text: &str, what: &str| -> Result<Vec<u32>, Incomparable> {
        let tj = tok_dir.join("tokenizer.json");
        if !tj.exists() {
            return Err(Incomparable(format!("{what}: no tokenizer.json in {} to tokenize it (--weights names the directory; or pass token ids with --tokens)", tok_dir.display())));
        }
        kern_tokenizer::Tokenizer::from_dir(tok_dir).and_then(|t| t.encode(text, false)).map_err(|e| Incomparable(format!("{what}: tokenizing with {}: {e}", tj.display())))
    };
    let want = p.window.max(4) * p.max_windows.max(1);
    let (mut tokens, source) = if let Some(f) = &p.tokens {
        let s = std::fs::read_to_string(f).map_err(|e| Incomparable(format!("--tokens {}: {e}", f.display())))?;
        let ids = parse_token_ids(&s).map_err(|e| Incomparable(format!("--tokens {}: {e}", f.display())))?;
        (ids, format!("{} (token ids)", f.display()))
    } else if let Some(f) = &p.text {
        let s = std::fs::read_to_string(f).map_err(|e| Incomparable(format!("--text {}: {e}", f.display())))?;
        (tokenize(&s, &format!("--text {}", f.display()))?, f.display().to_string())
    } else if tok_dir.join("tokenizer.json").exists() {
        (tokenize(TEXT, "the built-in text")?, "the built-in paragraph (pass --text FILE for a real evaluation text)".to_string())
    } else {
        notes.push("precision mode scored seeded random token ids (no --text / --tokens, no tokenizer.json): KL and top-1 mean something, the perplexities do not".into());
        let mut rng = numeric::Rng(seed ^ 0x7e57);
        ((0..want).map(|_| (rng.next_u64() % vocab.max(1) as u64) as u32).collect(), "seeded random token ids".to_string())
    };
    if let Some(bad) = tokens.iter().position(|&t| t as usize >= vocab) {
        return Err(Incomparable(format!("{source}: token {bad} is id {} but the vocabulary has {vocab} entries", tokens[bad])));
    }
    let window = p.window.min(max_context.saturating_sub(1)).min(tokens.len());
    if window < 4 {
        return Err(Incomparable(format!("{source}: {} tokens, a context of {max_context}: at least 4 tokens per window are needed to score a text", tokens.len())));
    }
    let windows = (tokens.len() / window).min(p.max_windows.max(1)).min(max_seqs.max(1));
    tokens.truncate(windows * window);
    Ok(TextPlan { tokens, source, window, windows })
}

impl Session<'_> {
    /// Scores the planned text on both sides (None without a text plan or without logits).
    pub(super) fn score_text(&mut self) -> Result<Option<TextScore>, String> {
        let Some(tp) = self.scoring.take() else { return Ok(None) };
        let result = self.score(&tp);
        self.scoring = Some(tp);
        result
    }

    fn score(&mut self, tp: &TextPlan) -> Result<Option<TextScore>, String> {
        let (Some(abi_a), Some(abi_b)) = (self.a.manifest.step.clone(), self.b.manifest.step.clone()) else { return Ok(None) };
        let (Some(la), Some(lb)) = (abi_a.logits, abi_b.logits) else {
            self.notes.push("precision mode: the step ABI exposes no logits on both sides, so no text was scored".into());
            return Ok(None);
        };
        let half = tp.window / 2;
        let mut s = self.scheduler();
        let mut ids = Vec::new();
        for w in 0..tp.windows {
            let win = &tp.tokens[w * tp.window..(w + 1) * tp.window];
            let params = SamplingParams { max_tokens: tp.window - half, ignore_eos: true, ..Default::default() };
            ids.push(s.add(win[..half].to_vec(), params).map_err(|e| format!("text window {w}: {e}"))?);
        }
        let mut acc = TextAccumulator::default();
        let v = self.vocab;
        let mut steps = 0usize;
        while let Some(st) = s.schedule(|t, q, _| (t, q)) {
            steps += 1;
            let name = format!("text step {steps}");
            let sh = self.step_shape(name.clone(), st.clone());
            self.upload(&sh)?;
            let (na, nb) = (self.an.calls_a.len(), self.an.calls_b.len());
            self.a.run_calls(0, &sh.va, 0..na, false).map_err(|e| rt_err(&format!("A, {name}"), e))?;
            self.b.run_calls(0, &sh.vb, 0..nb, false).map_err(|e| rt_err(&format!("B, {name}"), e))?;
            let fa = read_f32(&self.a, la, st.real_seqs * v).map_err(|e| rt_err("A", e))?;
            let fb = read_f32(&self.b, lb, st.real_seqs * v).map_err(|e| rt_err("B", e))?;
            let mut toks = vec![0i32; st.seqs.len()];
            for (r, ss) in st.seqs.iter().enumerate().take(st.real_seqs) {
                let Some(w) = ids.iter().position(|&id| id == ss.id) else { continue };
                let pos = ss.start + ss.n;
                if !ss.samples || pos >= tp.window {
                    continue;
                }
                // The logits of the row predict the window's token at `pos`; both sides then
                // continue with the text's token (teacher forcing).
                let target = tp.tokens[w * tp.window + pos];
                acc.add(&fa[r * v..(r + 1) * v], &fb[r * v..(r + 1) * v], target as usize);
                toks[r] = target as i32;
            }
            s.commit(&st, &toks);
        }
        Ok(Some(acc.finish(tp.source.clone(), tp.windows, tp.window)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_id_files() {
        assert_eq!(parse_token_ids("1 2,3\n 4,,5\t6\n").unwrap(), vec![1, 2, 3, 4, 5, 6]);
        assert!(parse_token_ids("1 two 3").unwrap_err().contains("token 1 `two`"));
        assert!(parse_token_ids("").unwrap().is_empty());
    }

    #[test]
    fn windows_fit_the_context_and_the_sequences() {
        let dir = std::env::temp_dir().join(format!("kern-difftest-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("ids.txt");
        std::fs::write(&f, (0..1000).map(|i| (i % 50).to_string()).collect::<Vec<_>>().join(" ")).unwrap();
        let p = PrecisionOptions { tokens: Some(f.clone()), window: 256, max_windows: 8, ..Default::default() };
        let mut notes = vec![];
        let t = plan(&p, &dir, 100, 4096, 64, 0, &mut notes).unwrap();
        assert_eq!((t.window, t.windows, t.tokens.len()), (256, 3, 768));
        assert_eq!(t.pages(16), 3 * 17);
        // A short context shrinks the window; few sequences cap the windows.
        let t = plan(&p, &dir, 100, 65, 2, 0, &mut notes).unwrap();
        assert_eq!((t.window, t.windows), (64, 2));
        // Ids beyond the vocabulary, no tokenizer for --text, random ids without either.
        assert!(plan(&p, &dir, 40, 4096, 64, 0, &mut notes).unwrap_err().0.contains("vocabulary has 40"));
        let text = PrecisionOptions { text: Some(f), ..Default::default() };
        assert!(plan(&text, &dir, 100, 4096, 64, 0, &mut notes).unwrap_err().0.contains("no tokenizer.json"));
        let t = plan(&PrecisionOptions::default(), &dir, 100, 4096, 64, 7, &mut notes).unwrap();
        assert_eq!((t.windows, t.window), (8, 256));
        assert!(t.tokens.iter().all(|&x| x < 100) && notes.iter().any(|n| n.contains("random token ids")));
        std::fs::remove_dir_all(&dir).ok();
    }
}
