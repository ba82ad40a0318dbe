//! What a client constrains its output with, and how each kind becomes an llguidance grammar.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// Whitespace JSON may have between two tokens (at most this many characters in a row). Free
/// whitespace lets a model pad its JSON until `max_tokens` runs out (a known failure of
/// constrained JSON); 20 still fits pretty-printed JSON nested a few levels deep.
pub const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,20}";

/// How JSON is laid out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct JsonOptions {
    /// A regular expression for the whitespace between JSON tokens (None: [`JSON_WHITESPACE`];
    /// empty: none).
    pub whitespace_pattern: Option<String>,
}

/// A constraint on a request's output.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// JSON valid against a JSON Schema. `strict`: every keyword must be enforced, and a schema
    /// using one the compiler cannot enforce is refused; not strict: such keywords are ignored
    /// (the output is still JSON of the schema's shape as far as it is understood).
    JsonSchema { schema: Value, strict: bool, options: JsonOptions },
    /// Any JSON object.
    JsonObject { options: JsonOptions },
    /// Text matching a regular expression (Rust `regex` syntax), anchored at both ends.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar in llguidance's dialect (`%json {…}` embeds a JSON Schema).
    Lark(String),
}

impl Grammar {
    /// A stable text that identifies the grammar (the compile cache's key).
    pub fn key(&self) -> String {
        match self {
            Grammar::JsonSchema { schema, strict, options } => format!("json_schema:{strict}:{:?}:{schema}", options.whitespace_pattern),
            Grammar::JsonObject { options } => format!("json_object:{:?}", options.whitespace_pattern),
            Grammar::Regex(r) => format!("regex:{r}"),
            Grammar::Choice(c) => format!("choice:{}", Value::from(c.clone())),
            Grammar::Lark(l) => format!("lark:{l}"),
        }
    }

    /// A short description for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonSchema { .. } => "JSON schema",
            Grammar::JsonObject { .. } => "JSON object",
            Grammar::Regex(_) => "regular expression",
            Grammar::Choice(_) => "choice list",
            Grammar::Lark(_) => "grammar",
        }
    }

    /// The source's size in bytes (checked against the size limit before compiling).
    pub fn source_len(&self) -> usize {
        match self {
            Grammar::JsonSchema { schema, .. } => schema.to_string().len(),
            Grammar::JsonObject { .. } => 16,
            Grammar::Regex(r) => r.len(),
            Grammar::Choice(c) => c.iter().map(|s| s.len() + 3).sum(),
            Grammar::Lark(l) => l.len(),
        }
    }

    /// llguidance's grammar for it; Err names what is wrong with the request.
    pub(crate) fn to_llg(&self) -> Result<TopLevelGrammar, String> {
        match self {
            Grammar::JsonSchema { schema, strict, options } => Ok(TopLevelGrammar::from_json_schema(json_with_options(schema.clone(), *strict, options))),
            Grammar::JsonObject { options } => Ok(TopLevelGrammar::from_json_schema(json_with_options(json!({"type": "object"}), true, options))),
            Grammar::Regex(r) => {
                // Compile once with the regex crate's parser for a clear message on bad syntax.
                regex_syntax::Parser::new().parse(r).map_err(|e| format!("the regular expression does not parse: {e}"))?;
                Ok(TopLevelGrammar::from_regex(r))
            }
            Grammar::Choice(c) => {
                if c.is_empty() {
                    return Err("the choice list is empty".into());
                }
                let alts: Vec<String> = c.iter().map(|s| escape_regex(s)).collect();
                Ok(TopLevelGrammar::from_regex(&format!("(?:{})", alts.join("|"))))
            }
            Grammar::Lark(l) => {
                if l.contains("::=") {
                    return Err("this looks like a GBNF/EBNF grammar (`::=`): kern takes Lark grammars (`rule: …`, llguidance's syntax)".into());
                }
                Ok(TopLevelGrammar::from_lark(l.clone()))
            }
        }
    }
}

/// `schema` with llguidance's JSON options (`x-guidance`) set, unless it sets its own.
fn json_with_options(schema: Value, strict: bool, o: &JsonOptions) -> Value {
    // An empty pattern: no whitespace between JSON tokens at all.
    let opts = match o.whitespace_pattern.as_deref() {
        Some("") => json!({"whitespace_flexible": false, "lenient": !strict}),
        p => json!({"whitespace_flexible": true, "whitespace_pattern": p.unwrap_or(JSON_WHITESPACE), "lenient": !strict}),
    };
    match schema {
        Value::Object(mut m) => {
            m.entry("x-guidance").or_insert(opts);
            Value::Object(m)
        }
        // `true` / `false` schemas: wrapped, so the options have an object to live in.
        other => json!({"allOf": [other], "x-guidance": opts}),
    }
}

/// `s` as a regular expression matching exactly `s`.
pub(crate) fn escape_regex(s: &str) -> String {
    regex_syntax::escape(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_go_into_the_schema_unless_it_has_its_own() {
        let s = json_with_options(json!({"type": "string"}), true, &JsonOptions::default());
        assert_eq!(s["x-guidance"]["lenient"], false);
        assert_eq!(s["x-guidance"]["whitespace_pattern"], JSON_WHITESPACE);
        let own = json_with_options(json!({"x-guidance": {"whitespace_flexible": false}}), false, &JsonOptions::default());
        assert_eq!(own["x-guidance"], json!({"whitespace_flexible": false}));
        assert!(json_with_options(json!(true), false, &JsonOptions::default())["allOf"].is_array());
    }

    #[test]
    fn bad_sources_are_named() {
        assert!(Grammar::Regex("(".into()).to_llg().unwrap_err().contains("does not parse"));
        assert!(Grammar::Lark("root ::= \"a\"".into()).to_llg().unwrap_err().contains("GBNF"));
        assert!(Grammar::Choice(vec![]).to_llg().unwrap_err().contains("empty"));
        assert_eq!(escape_regex("a.b|c"), r"a\.b\|c");
    }
}
