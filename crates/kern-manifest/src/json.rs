//! An order-preserving JSON tree, and the one place manifest text is parsed.
//!
//! Declaration order is meaningful in a manifest (program order, the order buffers are planned
//! in), and a key written twice is a mistake worth reporting, so the tree keeps objects as
//! lists of `(key, value)` pairs instead of a map. Parsing goes through `serde_json`, which
//! bounds nesting (128 levels) so hostile input cannot overflow the stack; every function here
//! that recurses over a [`Json`] is therefore bounded by the same depth.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// A parsed JSON value, objects in source order, duplicate keys kept.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// Why text is not JSON, with a 1-based line and column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl Json {
    /// "a string", "an object": how messages name what was found.
    pub fn kind(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// A `serde_json::Value` with the same content (a duplicate key keeps its last value).
    pub fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => Value::Number(n.clone()),
            Json::String(s) => Value::String(s.clone()),
            Json::Array(a) => Value::Array(a.iter().map(Json::to_value).collect()),
            Json::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
        }
    }
}

/// Parses one JSON document (a leading UTF-8 byte-order mark is allowed).
pub fn parse(bytes: &[u8]) -> Result<Json, SyntaxError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let (line, column) = line_col(bytes, e.valid_up_to());
        SyntaxError {
            line,
            column,
            message: "the file is not valid UTF-8".into(),
        }
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Json::deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    value.map_err(|e| {
        let full = e.to_string();
        // serde_json appends " at line L column C"; the location is reported separately.
        let message = match full.rfind(" at line ") {
            Some(i) => full[..i].to_string(),
            None => full,
        };
        let message = if message.starts_with("recursion limit exceeded") {
            "nesting is deeper than 128 levels (recursion limit exceeded)".to_string()
        } else {
            message
        };
        SyntaxError {
            line: e.line().max(1),
            column: e.column().max(1),
            message,
        }
    })
}

fn line_col(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = offset
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1)
        + 1;
    (line, column)
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("number is not finite"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Json::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            out.push((k, v));
        }
        Ok(Json::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_duplicates() {
        let j = parse(br#"{"b": 1, "a": [true, null, "x"], "b": 2.5}"#).unwrap();
        let Json::Object(o) = j else { panic!() };
        let keys: Vec<_> = o.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a", "b"]);
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let e = parse(b"{\n  \"a\": 1,\n  \"b\": ]\n}").unwrap_err();
        assert_eq!((e.line, e.column), (3, 8));
        assert!(e.message.contains("expected value"), "{}", e.message);
        let e = parse(b"{\"a\": 1} trailing").unwrap_err();
        assert!(e.message.contains("trailing characters"), "{}", e.message);
        let e = parse(b"{\"a\": \xff}").unwrap_err();
        assert_eq!(
            (e.line, e.column, e.message.as_str()),
            (1, 7, "the file is not valid UTF-8")
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let e = parse(deep.as_bytes()).unwrap_err();
        assert!(e.message.contains("deeper than 128"), "{}", e.message);
        // 100 levels are fine.
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn bom_is_skipped() {
        assert_eq!(parse(b"\xef\xbb\xbf{}").unwrap(), Json::Object(vec![]));
    }
}
