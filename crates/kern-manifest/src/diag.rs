//! Diagnostics: what is wrong, where (a JSON path such as
//! `ops.rms_norm.impl.launches[0].params[3]`), and what to change.
//!
//! Checking never stops at the first problem: every stage pushes into a `Sink` and goes on,
//! and [`Diagnostics`] sorts what was found into the order it appears in the manifest.

use std::fmt;

/// Whether a diagnostic makes the manifest unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The manifest is wrong; `kern check` fails.
    Error,
    /// Probably a mistake, but the manifest can run (a `const` pointer bound as `out`, an op
    /// parameter no launch uses, an activation read before anything wrote it).
    Warning,
}

/// One finding: where, and what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// JSON path of the offending value (`buffers["model.norm.weight"].shape[0]`); empty for
    /// the whole file.
    pub path: String,
    /// 1-based line and column, for JSON syntax errors (which have no path).
    pub line_col: Option<(usize, usize)>,
    /// What is wrong and what to change.
    pub message: String,
    /// Sort key: positions of the path's segments in the document.
    order: Vec<u32>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Everything found in one manifest file. `Display` writes one line per diagnostic,
/// `FILE: PATH: MESSAGE` (warnings say `warning:` before the message), errors and warnings in
/// the order their paths appear in the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostics {
    /// The manifest file, as given to [`crate::load`].
    pub file: String,
    pub items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub(crate) fn new(file: String, mut items: Vec<Diagnostic>) -> Self {
        // Stable: diagnostics at the same path keep the order they were found in.
        items.sort_by(|a, b| a.order.cmp(&b.order));
        Diagnostics { file, items }
    }

    /// A diagnostics list with one error about the whole file.
    pub(crate) fn file_error(file: String, message: String) -> Self {
        Diagnostics::new(
            file,
            vec![Diagnostic {
                severity: Severity::Error,
                path: String::new(),
                line_col: None,
                message,
                order: vec![],
            }],
        )
    }

    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| d.is_error())
    }
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| !d.is_error())
    }
    pub fn has_errors(&self) -> bool {
        self.errors().next().is_some()
    }
    pub fn error_count(&self) -> usize {
        self.errors().count()
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((l, c)) = self.line_col {
            write!(f, "{l}:{c}: ")?;
        } else if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.items {
            // `file:3:7: msg` for syntax errors, `file: path: msg` otherwise.
            let sep = if d.line_col.is_some() { ":" } else { ": " };
            writeln!(f, "{}{sep}{d}", self.file)?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// A JSON path under construction. Each segment remembers its position in the document (an
/// array index, a map entry's index, or a struct field's rank in the schema), which is how
/// diagnostics are sorted into document order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JsonPath {
    segs: Vec<(Seg, u32)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Every field name of the schema, in the order fields are declared (and written) within their
/// object. A field's rank here orders diagnostics inside one object.
const FIELD_ORDER: &[&str] = &[
    "$schema",
    "schema_version",
    "model",
    "vars",
    "states",
    "buffers",
    "modules",
    "ops",
    "program",
    "programs",
    "draft",
    "k",
    "step",
    "parallel",
    "speculative",
    "reads",
    "abi",
    "kv",
    "max",
    "bytes_per_token",
    "bytes_per_seq",
    "page_tokens",
    "snapshot",
    "dtype",
    "shape",
    "role",
    "from",
    "tensor",
    "concat",
    "axis",
    "sizes",
    "alias",
    "source",
    "sha256",
    "params",
    "impl",
    "launches",
    "label",
    "module",
    "entry",
    "block",
    "grid",
    "shared",
    "args",
    "struct",
    "size",
    "align",
    "offset",
    "calls",
    "op",
];

impl JsonPath {
    pub fn root() -> Self {
        JsonPath::default()
    }

    /// A struct field (ordered by its rank in the schema).
    pub fn field(&self, name: &str) -> Self {
        let rank = FIELD_ORDER
            .iter()
            .position(|f| *f == name)
            .unwrap_or(FIELD_ORDER.len());
        self.push(Seg::Key(name.to_string()), rank as u32)
    }

    /// An entry of a name → value map, at position `pos` in the document.
    pub fn entry(&self, name: &str, pos: usize) -> Self {
        self.push(Seg::Key(name.to_string()), pos as u32)
    }

    /// An array element.
    pub fn index(&self, i: usize) -> Self {
        self.push(Seg::Index(i), i as u32)
    }

    fn push(&self, seg: Seg, pos: u32) -> Self {
        let mut segs = self.segs.clone();
        segs.push((seg, pos));
        JsonPath { segs }
    }

    fn order(&self) -> Vec<u32> {
        self.segs.iter().map(|(_, p)| *p).collect()
    }
}

fn is_plain_key(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (seg, _)) in self.segs.iter().enumerate() {
            match seg {
                Seg::Key(k) if is_plain_key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Key(k) => write!(f, "[{}]", serde_json::Value::String(k.clone()))?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// Collects diagnostics while checking goes on.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    items: Vec<Diagnostic>,
}

impl Sink {
    pub fn error(&mut self, path: &JsonPath, message: impl Into<String>) {
        self.push(Severity::Error, path, message.into());
    }
    pub fn warn(&mut self, path: &JsonPath, message: impl Into<String>) {
        self.push(Severity::Warning, path, message.into());
    }
    fn push(&mut self, severity: Severity, path: &JsonPath, message: String) {
        self.items.push(Diagnostic {
            severity,
            path: path.to_string(),
            line_col: None,
            message,
            order: path.order(),
        });
    }
    pub fn syntax(&mut self, line: usize, column: usize, message: String) {
        self.items.push(Diagnostic {
            severity: Severity::Error,
            path: String::new(),
            line_col: Some((line, column)),
            message,
            order: vec![],
        });
    }
    pub fn error_count(&self) -> usize {
        self.items.iter().filter(|d| d.is_error()).count()
    }
    pub fn into_items(self) -> Vec<Diagnostic> {
        self.items
    }
}

/// Names that are close to `name` (edit distance at most a third of its length, rounded up),
/// closest first: for "did you mean" hints.
pub(crate) fn similar<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<&'a str> {
    let limit = name.chars().count().div_ceil(3).max(1);
    let mut scored: Vec<(usize, &str)> = candidates
        .into_iter()
        .map(|c| (edit_distance(&name.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .collect();
    scored.sort();
    scored.into_iter().map(|(_, c)| c).collect()
}

/// Levenshtein distance over chars.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `` `a`, `b` and `c` ``.
pub(crate) fn list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match quoted.len() {
        0 => "none".into(),
        1 => quoted[0].clone(),
        n => format!("{} and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

/// " (did you mean `x`?)" or "".
pub(crate) fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    match similar(name, candidates).first() {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_print_like_the_issue_says() {
        let p = JsonPath::root()
            .field("ops")
            .entry("rms_norm", 0)
            .field("impl")
            .field("launches")
            .index(0)
            .field("params")
            .index(3);
        assert_eq!(p.to_string(), "ops.rms_norm.impl.launches[0].params[3]");
        let b = JsonPath::root()
            .field("buffers")
            .entry("model.embed_tokens.weight", 2)
            .field("shape")
            .index(0);
        assert_eq!(
            b.to_string(),
            r#"buffers["model.embed_tokens.weight"].shape[0]"#
        );
    }

    #[test]
    fn diagnostics_sort_into_document_order() {
        let mut s = Sink::default();
        let ops = JsonPath::root().field("ops");
        s.error(&ops.entry("b", 1), "second");
        s.error(&JsonPath::root().field("buffers").entry("x", 5), "first");
        s.warn(&ops.entry("a", 0).field("impl"), "a.impl");
        s.error(&ops.entry("a", 0).field("params"), "a.params");
        let d = Diagnostics::new("m.json".into(), s.into_items());
        let msgs: Vec<_> = d.items.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(msgs, ["first", "a.params", "a.impl", "second"]);
        assert_eq!(
            d.to_string().lines().nth(2).unwrap(),
            "m.json: ops.a.impl: warning: a.impl"
        );
    }

    #[test]
    fn similar_names() {
        assert_eq!(similar("parms", ["params", "impl"]), ["params"]);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert!(similar("zzz", ["params"]).is_empty());
    }
}
