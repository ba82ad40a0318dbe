//! Names that look like a missing one, for "no tensor `X` (similar names: …)" errors.

/// Up to `n` names that look like `name`: within a small edit distance, or sharing its last
/// two dot-separated parts (`….q_proj.weight`). Closest first.
pub(crate) fn similar<'a>(
    name: &str,
    names: impl Iterator<Item = &'a str>,
    n: usize,
) -> Vec<String> {
    let limit = (name.len() / 3).max(3);
    let tail: Vec<&str> = name.rsplit('.').take(2).collect();
    let mut scored: Vec<(usize, &str)> = names
        .filter_map(|c| {
            let shares_tail = tail.len() == 2 && c.rsplit('.').take(2).eq(tail.iter().copied());
            if !shares_tail && c.len().abs_diff(name.len()) > limit {
                return None;
            }
            let d = levenshtein(name.as_bytes(), c.as_bytes());
            (d <= limit || shares_tail).then_some((d, c))
        })
        .collect();
    scored.sort_unstable();
    scored
        .into_iter()
        .take(n)
        .map(|(_, c)| c.to_string())
        .collect()
}

fn levenshtein(a: &[u8], b: &[u8]) -> usize {
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance() {
        assert_eq!(levenshtein(b"kitten", b"sitting"), 3);
        assert_eq!(levenshtein(b"", b"abc"), 3);
        assert_eq!(levenshtein(b"abc", b"abc"), 0);
    }

    #[test]
    fn similar_names_closest_first() {
        let names = [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.1.self_attn.q_proj.weight",
            "model.norm.weight",
            "lm_head.weight",
        ];
        let s = similar(
            "model.layers.0.self_atn.q_proj.weight",
            names.iter().copied(),
            5,
        );
        assert_eq!(s[0], "model.layers.0.self_attn.q_proj.weight");
        assert!(!s.contains(&"lm_head.weight".to_string()), "{s:?}");
        // A different naming scheme still finds the tensors that end alike.
        let s = similar("blk.0.q_proj.weight", names.iter().copied(), 5);
        assert!(
            s.contains(&"model.layers.0.self_attn.q_proj.weight".to_string()),
            "{s:?}"
        );
    }
}
