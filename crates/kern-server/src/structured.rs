//! Structured output fields → a grammar: OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema` with `strict`) and vLLM's `structured_outputs` extension (`json`, `regex`,
//! `choice`, `grammar` in Lark, `json_object`, `whitespace_pattern`). Every problem is a 400
//! naming the field.

use crate::error::ApiError;
use kern_engine::constraint::{Grammar, JsonOptions};
use serde_json::{json, Value};

/// Where a grammar came from: the field its errors name.
#[derive(Clone, Debug)]
pub struct Requested {
    pub grammar: Grammar,
    pub field: String,
}

/// Reads `response_format` and `structured_outputs` (at most one of them constrains).
pub fn parse(response_format: Option<&Value>, structured: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let rf = response_format.map(parse_response_format).transpose()?.flatten();
    let so = structured.map(parse_structured_outputs).transpose()?.flatten();
    match (rf, so) {
        (Some(_), Some(_)) => Err(ApiError::bad("structured_outputs", "give `response_format` or `structured_outputs`, not both")),
        (a, b) => Ok(a.or(b)),
    }
}

fn parse_response_format(v: &Value) -> Result<Option<Requested>, ApiError> {
    let f = "response_format";
    let o = v.as_object().ok_or_else(|| ApiError::bad(f, "`response_format` must be an object: {\"type\": \"text\" | \"json_object\" | \"json_schema\"}"))?;
    let kind = o.get("type").and_then(Value::as_str).ok_or_else(|| ApiError::bad("response_format.type", "`response_format.type` is required: text, json_object or json_schema"))?;
    for k in o.keys() {
        if !matches!(k.as_str(), "type" | "json_schema") {
            return Err(ApiError::bad(format!("response_format.{k}"), format!("unknown field `response_format.{k}`")));
        }
    }
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(Requested { grammar: Grammar::JsonObject { options: JsonOptions::default() }, field: f.into() })),
        "json_schema" => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| ApiError::bad("response_format.json_schema", "`response_format.json_schema` is required with type json_schema: {\"name\", \"schema\", \"strict\"}"))?;
            for k in js.keys() {
                if !matches!(k.as_str(), "name" | "description" | "schema" | "strict") {
                    return Err(ApiError::bad(format!("response_format.json_schema.{k}"), format!("unknown field `response_format.json_schema.{k}`")));
                }
            }
            if let Some(n) = js.get("name") {
                let ok = n.as_str().is_some_and(|s| !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
                if !ok {
                    return Err(ApiError::bad("response_format.json_schema.name", "`response_format.json_schema.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -"));
                }
            }
            let schema = match js.get("schema") {
                None | Some(Value::Null) => json!({}),
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                Some(_) => return Err(ApiError::bad("response_format.json_schema.schema", "`response_format.json_schema.schema` must be a JSON Schema object")),
            };
            let strict = match js.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(ApiError::bad("response_format.json_schema.strict", "`response_format.json_schema.strict` must be true or false")),
            };
            Ok(Some(Requested { grammar: Grammar::JsonSchema { schema, strict, options: JsonOptions::default() }, field: "response_format.json_schema.schema".into() }))
        }
        "structural_tag" => Err(ApiError::bad("response_format.type", "`response_format.type` structural_tag is not supported by kern: use json_schema, or `structured_outputs.grammar` (Lark)")),
        other => Err(ApiError::bad("response_format.type", format!("`response_format.type` is `{other}`: use text, json_object or json_schema"))),
    }
}

fn parse_structured_outputs(v: &Value) -> Result<Option<Requested>, ApiError> {
    let o = v.as_object().ok_or_else(|| ApiError::bad("structured_outputs", "`structured_outputs` must be an object with one of json, regex, choice, grammar, json_object"))?;
    let mut whitespace = None;
    let mut found: Vec<(&str, Grammar)> = Vec::new();
    for (k, x) in o {
        let field = format!("structured_outputs.{k}");
        if x.is_null() {
            continue;
        }
        match k.as_str() {
            "json" => {
                let schema = match x {
                    Value::String(s) => serde_json::from_str(s).map_err(|e| ApiError::bad(field.clone(), format!("`{field}` is a string that is not JSON: {e}")))?,
                    Value::Object(_) | Value::Bool(_) => x.clone(),
                    _ => return Err(ApiError::bad(field, "`structured_outputs.json` must be a JSON Schema (an object, or its JSON text)")),
                };
                found.push(("json", Grammar::JsonSchema { schema, strict: false, options: JsonOptions::default() }));
            }
            "json_object" => match x {
                Value::Bool(true) => found.push(("json_object", Grammar::JsonObject { options: JsonOptions::default() })),
                Value::Bool(false) => {}
                _ => return Err(ApiError::bad(field, "`structured_outputs.json_object` must be true or false")),
            },
            "regex" => found.push(("regex", Grammar::Regex(x.as_str().ok_or_else(|| ApiError::bad(field.clone(), "`structured_outputs.regex` must be a string"))?.to_string()))),
            "choice" => {
                let list = x.as_array().filter(|a| !a.is_empty()).ok_or_else(|| ApiError::bad(field.clone(), "`structured_outputs.choice` must be a non-empty list of strings"))?;
                let c: Vec<String> = list.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| ApiError::bad(field.clone(), "`structured_outputs.choice` must be a non-empty list of strings"))).collect::<Result<_, _>>()?;
                found.push(("choice", Grammar::Choice(c)));
            }
            "grammar" => found.push(("grammar", Grammar::Lark(x.as_str().ok_or_else(|| ApiError::bad(field.clone(), "`structured_outputs.grammar` must be a string (a Lark grammar)"))?.to_string()))),
            "whitespace_pattern" => whitespace = Some(x.as_str().ok_or_else(|| ApiError::bad(field.clone(), "`structured_outputs.whitespace_pattern` must be a string (a regular expression)"))?.to_string()),
            "disable_any_whitespace" => {
                if x == &Value::Bool(true) {
                    whitespace = Some(String::new());
                }
            }
            "structural_tag" => return Err(ApiError::bad(field, "`structured_outputs.structural_tag` is not supported by kern: use `grammar` (Lark)")),
            _ => return Err(ApiError::bad(field.clone(), format!("unknown field `{field}`: use one of json, regex, choice, grammar, json_object (and whitespace_pattern)"))),
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::bad("structured_outputs", format!("`structured_outputs` gives {}: give one", names.join(" and "))));
    }
    let Some((name, mut g)) = found.pop() else {
        return Err(ApiError::bad("structured_outputs", "`structured_outputs` is empty: give one of json, regex, choice, grammar, json_object"));
    };
    if let (Some(ws), Grammar::JsonSchema { options, .. } | Grammar::JsonObject { options }) = (whitespace, &mut g) {
        // An empty pattern: no whitespace between JSON tokens at all.
        options.whitespace_pattern = Some(ws);
    }
    Ok(Some(Requested { grammar: g, field: format!("structured_outputs.{name}") }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(rf: Option<Value>, so: Option<Value>) -> String {
        parse(rf.as_ref(), so.as_ref()).unwrap_err().param.unwrap()
    }

    #[test]
    fn fields_become_grammars_or_name_their_problem() {
        assert!(parse(Some(&json!({"type": "text"})), None).unwrap().is_none());
        let r = parse(Some(&json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": true}})), None).unwrap().unwrap();
        assert!(matches!(r.grammar, Grammar::JsonSchema { strict: true, .. }));
        assert!(matches!(parse(None, Some(&json!({"choice": ["a", "b"]}))).unwrap().unwrap().grammar, Grammar::Choice(_)));
        assert!(matches!(parse(None, Some(&json!({"json": "{\"type\": \"string\"}"}))).unwrap().unwrap().grammar, Grammar::JsonSchema { .. }));
        let ws = parse(None, Some(&json!({"json": {"type": "object"}, "whitespace_pattern": " ?"}))).unwrap().unwrap();
        assert!(matches!(ws.grammar, Grammar::JsonSchema { options: JsonOptions { whitespace_pattern: Some(ref p) }, .. } if p == " ?"));
        assert_eq!(err(Some(json!({"type": "yaml"})), None), "response_format.type");
        assert_eq!(err(Some(json!({"type": "json_schema"})), None), "response_format.json_schema");
        assert_eq!(err(Some(json!({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}})), None), "response_format.json_schema.name");
        assert_eq!(err(Some(json!({"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}})), None), "response_format.json_schema.extra");
        assert_eq!(err(None, Some(json!({"regex": "a", "choice": ["b"]}))), "structured_outputs");
        assert_eq!(err(None, Some(json!({"yaml": "a"}))), "structured_outputs.yaml");
        assert_eq!(err(None, Some(json!({"choice": []}))), "structured_outputs.choice");
        assert_eq!(err(Some(json!({"type": "json_object"})), Some(json!({"regex": "a"}))), "structured_outputs");
    }
}
