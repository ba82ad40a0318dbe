//! `schema/manifest.schema.json` is generated from the raw types and must be current; and
//! `docs/manifest.md` documents every field the schema (and so kern) accepts.
//!
//! `KERN_BLESS=1 cargo test -p kern-manifest --test schema` rewrites the schema file.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_committed_json_schema_is_current() {
    let path = repo().join("schema/manifest.schema.json");
    let fresh = kern_manifest::json_schema();
    if std::env::var_os("KERN_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "schema/manifest.schema.json is stale: run `cargo run -p kern -- schema > schema/manifest.schema.json` (or KERN_BLESS=1 cargo test -p kern-manifest --test schema)"
    );
}

/// Every property name anywhere in the schema.
fn properties(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let Some(serde_json::Value::Object(props)) = m.get("properties") {
                out.extend(props.keys().cloned());
            }
            m.values().for_each(|x| properties(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| properties(x, out)),
        _ => {}
    }
}

#[test]
fn the_schema_document_names_every_field() {
    let schema: serde_json::Value = serde_json::from_str(&kern_manifest::json_schema()).unwrap();
    let mut names = BTreeSet::new();
    properties(&schema, &mut names);
    assert!(names.len() > 30, "{names:?}");
    let doc = std::fs::read_to_string(repo().join("docs/manifest.md")).expect("docs/manifest.md");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/manifest.md does not document {missing:?}"
    );
    for dtype in kern_manifest::DType::ALL {
        assert!(
            doc.contains(&format!("`{dtype}`")),
            "docs/manifest.md does not list dtype {dtype}"
        );
    }
}

/// A small JSON Schema checker for the keywords the generated schema uses (patterns are not
/// checked). Returns the paths that fail.
fn validate(
    schema: &serde_json::Value,
    root: &serde_json::Value,
    v: &serde_json::Value,
    path: &str,
    errs: &mut Vec<String>,
) {
    use serde_json::Value;
    let Value::Object(s) = schema else { return };
    if let Some(Value::String(r)) = s.get("$ref") {
        let name = r.trim_start_matches("#/$defs/");
        validate(&root["$defs"][name], root, v, path, errs);
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let ok = types.iter().any(|t| match *t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => false,
        });
        if !ok {
            errs.push(format!("{path}: not {types:?}"));
            return;
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            errs.push(format!("{path}: not {c}"));
        }
    }
    if let Some(Value::Array(e)) = s.get("enum") {
        if !e.contains(v) {
            errs.push(format!("{path}: not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            errs.push(format!("{path}: below {min}"));
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            let passing = alts
                .iter()
                .filter(|a| {
                    let mut e = vec![];
                    validate(a, root, v, path, &mut e);
                    e.is_empty()
                })
                .count();
            if passing == 0 || (key == "oneOf" && passing > 1) {
                errs.push(format!("{path}: {passing} of the {key} alternatives match"));
            }
        }
    }
    if let Value::Object(obj) = v {
        let props = s.get("properties").and_then(Value::as_object);
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(ps, root, val, &format!("{path}.{k}"), errs),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => errs.push(format!("{path}.{k}: not allowed")),
                    Some(ap @ Value::Object(_)) => {
                        validate(ap, root, val, &format!("{path}.{k}"), errs)
                    }
                    _ => {}
                },
            }
        }
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    errs.push(format!("{path}: `{r}` missing"));
                }
            }
        }
        for (key, cmp) in [("minProperties", 0), ("maxProperties", 1)] {
            if let Some(n) = s.get(key).and_then(Value::as_u64) {
                let len = obj.len() as u64;
                if (cmp == 0 && len < n) || (cmp == 1 && len > n) {
                    errs.push(format!("{path}: {len} properties, {key} {n}"));
                }
            }
        }
    }
    if let (Value::Array(items), Some(is)) = (v, s.get("items")) {
        for (i, item) in items.iter().enumerate() {
            validate(is, root, item, &format!("{path}[{i}]"), errs);
        }
    }
}

fn schema_errors(manifest: &serde_json::Value) -> Vec<String> {
    let schema: serde_json::Value = serde_json::from_str(&kern_manifest::json_schema()).unwrap();
    let mut errs = vec![];
    validate(&schema, &schema, manifest, "$", &mut errs);
    errs
}

/// The schema accepts every manifest kern accepts, and rejects what kern rejects as
/// structurally wrong: the schema and the decoder agree.
#[test]
fn the_schema_accepts_the_example_manifests_and_rejects_structural_mistakes() {
    for name in [
        "seed_rms_norm",
        "vecadd",
        "triton_rmsnorm",
        "extensions",
        "hf_vecadd",
    ] {
        let path = repo().join("tests/manifests").join(name).join("model.json");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(schema_errors(&v), Vec::<String>::new(), "{name}");
    }
    // The speculative section (issue 18): its test manifest passes, a typo in it does not.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/speculative.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(schema_errors(&v), Vec::<String>::new(), "speculative");
    v["speculative"]["drafts"] = serde_json::json!("draft");
    assert_eq!(schema_errors(&v), vec!["$.speculative.drafts: not allowed".to_string()]);
    for name in [
        "unknown_field_typo",
        "unknown_field_required",
        "wrong_json_type",
        "top_level_array",
        "state_both",
    ] {
        let path = repo()
            .join("tests/manifests/broken")
            .join(format!("{name}.json"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(
            !schema_errors(&v).is_empty(),
            "{name}: the schema accepts it"
        );
    }
}
