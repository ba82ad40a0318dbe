//! Prompt-lookup (n-gram) drafting: propose the tokens that followed the most recent earlier
//! occurrence of the sequence's last n tokens. Weight-free, and right exactly where outputs repeat
//! their input — code edits, quotes, summaries that copy names.

/// Up to `k` draft tokens continuing `tokens`: for n from `max_n` down to `min_n`, the last n
/// tokens are looked up earlier in `tokens` (most recent occurrence first); the first match
/// proposes what followed it. Empty when nothing matches.
pub fn propose(tokens: &[u32], k: usize, min_n: usize, max_n: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_n == 0 || len < min_n + 1 {
        return Vec::new();
    }
    for n in (min_n..=max_n.min(len - 1)).rev() {
        let tail = &tokens[len - n..];
        // Occurrences ending before the tail itself, most recent first.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == tail {
                let from = start + n;
                let take = k.min(len - from);
                if take > 0 {
                    return tokens[from..from + take].to_vec();
                }
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn the_longest_recent_match_proposes_its_continuation() {
        //            a  b  c  d  e  a  b  c
        let t = [1, 2, 3, 4, 5, 1, 2, 3];
        assert_eq!(propose(&t, 3, 1, 3), vec![4, 5, 1]);
        assert_eq!(propose(&t, 10, 1, 3), vec![4, 5, 1, 2, 3], "at most what follows");
        // The most recent occurrence wins: [7, 8] follows "1" last.
        assert_eq!(propose(&[1, 9, 1, 7, 8, 1], 2, 1, 1), vec![7, 8]);
        assert!(propose(&[1, 2, 3], 4, 2, 3).is_empty(), "no repeat");
        assert!(propose(&t, 0, 1, 3).is_empty());
        assert!(propose(&[5], 3, 1, 3).is_empty());
    }
}
