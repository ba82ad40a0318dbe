//! The files beside `tokenizer.json` that say which tokens are special:
//! `tokenizer_config.json` (transformers' tokenizer settings) and `generation_config.json`.

use crate::{Result, TokenizerError};
use serde_json::Value;
use std::path::Path;
use tokenizers::AddedToken;

pub(crate) const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub(crate) const GENERATION_CONFIG: &str = "generation_config.json";
/// transformers ≥ 4.43 saves the chat template in this file beside `tokenizer_config.json`;
/// when present it wins over the configuration's `chat_template`.
pub(crate) const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// What the configuration files say.
#[derive(Default)]
pub(crate) struct Found {
    pub eos: Vec<u32>,
    pub bos: Option<u32>,
    pub chat_template: Option<String>,
    /// `tokenizer_config.json`'s `bos_token` / `eos_token` text (what chat templates see).
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    /// `tokenizer_config.json`'s `add_bos_token` / `add_eos_token`.
    pub add_bos: bool,
    pub add_eos: bool,
}

/// Reads the configuration files in `dir` that exist, registers added tokens that
/// `tokenizer.json` lacks, and resolves the special tokens to ids.
pub(crate) fn read(dir: &Path, tok: &mut tokenizers::Tokenizer) -> Result<Found> {
    let mut found = Found::default();
    let gen_path = dir.join(GENERATION_CONFIG);
    if let Some(gen) = read_json(&gen_path)? {
        let bad = |m: String| config_error(&gen_path, m);
        match gen.get("eos_token_id") {
            None | Some(Value::Null) => {}
            Some(Value::Array(ids)) => {
                for v in ids {
                    found.eos.push(
                        id(v).ok_or_else(|| {
                            bad(format!("`eos_token_id` holds {v}, not a token id"))
                        })?,
                    );
                }
            }
            Some(v) => found.eos.push(id(v).ok_or_else(|| {
                bad(format!(
                    "`eos_token_id` is {v}: expected an id or a list of ids"
                ))
            })?),
        }
        if let Some(v) = gen.get("bos_token_id").filter(|v| !v.is_null()) {
            found.bos =
                Some(id(v).ok_or_else(|| bad(format!("`bos_token_id` is {v}: expected an id")))?);
        }
    }

    let template_path = dir.join(CHAT_TEMPLATE_FILE);
    let template_file = match std::fs::read_to_string(&template_path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(TokenizerError::Io {
                path: template_path,
                what: "cannot read the chat template",
                source,
            })
        }
    };
    let cfg_path = dir.join(TOKENIZER_CONFIG);
    let Some(cfg) = read_json(&cfg_path)? else {
        found.chat_template = template_file;
        return Ok(found);
    };
    let bad = |m: String| config_error(&cfg_path, m);
    if let Some(added) = cfg.get("added_tokens_decoder") {
        let added = added
            .as_object()
            .ok_or_else(|| bad("`added_tokens_decoder` is not an object of id → token".into()))?;
        for (key, t) in added {
            let want: u32 = key.parse().map_err(|_| {
                bad(format!(
                    "`added_tokens_decoder` has key `{key}`, not a token id"
                ))
            })?;
            let token = added_token(t).ok_or_else(|| {
                bad(format!(
                    "added_tokens_decoder.`{key}` has no `content` string"
                ))
            })?;
            match tok.token_to_id(&token.content) {
                Some(have) if have == want => {}
                Some(have) => {
                    return Err(bad(format!(
                        "added_tokens_decoder gives `{}` id {want}, tokenizer.json gives it {have}: the two files are from different tokenizers",
                        token.content
                    )))
                }
                None => {
                    // transformers registers such tokens on load; so does kern, at the id
                    // the configuration gives or not at all.
                    let content = token.content.clone();
                    if token.special {
                        tok.add_special_tokens(&[token]);
                    } else {
                        tok.add_tokens(&[token]);
                    }
                    if tok.token_to_id(&content) != Some(want) {
                        return Err(bad(format!(
                            "added_tokens_decoder declares `{content}` as id {want}, which tokenizer.json does not have; registering it gives another id"
                        )));
                    }
                }
            }
        }
    }
    if let Some(name) = token_name(cfg.get("eos_token")) {
        let id = tok.token_to_id(&name).ok_or_else(|| {
            bad(format!(
                "`eos_token` is `{name}`, which is not a token of tokenizer.json"
            ))
        })?;
        if !found.eos.contains(&id) {
            found.eos.push(id);
        }
        found.eos_token = Some(name);
    }
    if let Some(name) = token_name(cfg.get("bos_token")) {
        let id = tok.token_to_id(&name).ok_or_else(|| {
            bad(format!(
                "`bos_token` is `{name}`, which is not a token of tokenizer.json"
            ))
        })?;
        found.bos.get_or_insert(id);
        found.bos_token = Some(name);
    }
    found.pad_token = token_name(cfg.get("pad_token"));
    found.unk_token = token_name(cfg.get("unk_token"));
    let flag = |key: &str| cfg.get(key).and_then(Value::as_bool).unwrap_or(false);
    found.add_bos = flag("add_bos_token");
    found.add_eos = flag("add_eos_token");
    found.chat_template = match cfg.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some configurations hold several named templates: take the default one.
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        Some(v) => return Err(bad(format!("`chat_template` is {}, not a string", kind(v)))),
    };
    if template_file.is_some() {
        found.chat_template = template_file;
    }
    Ok(found)
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                what: "cannot read the configuration",
                source,
            })
        }
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| config_error(path, format!("not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(config_error(
            path,
            format!("is {}, expected a JSON object", kind(&v)),
        ));
    }
    Ok(Some(v))
}

fn config_error(path: &Path, message: String) -> TokenizerError {
    TokenizerError::Config {
        path: path.to_path_buf(),
        message,
    }
}

fn id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// A special token as transformers writes it: a string, or an object with `content`.
fn token_name(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn added_token(v: &Value) -> Option<AddedToken> {
    let flag = |k: &str, default: bool| v.get(k).and_then(Value::as_bool).unwrap_or(default);
    let content = v.get("content")?.as_str()?;
    let special = flag("special", false);
    Some(
        AddedToken::from(content, special)
            .single_word(flag("single_word", false))
            .lstrip(flag("lstrip", false))
            .rstrip(flag("rstrip", false))
            .normalized(flag("normalized", !special)),
    )
}

/// How a JSON value reads in an error message ("a string", "an array").
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
