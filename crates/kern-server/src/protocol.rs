//! Parse, don't validate: a request body (JSON) → a checked request, or a 400 naming the field.
//!
//! Every field kern reads is listed here. A field kern does not implement is refused by name
//! (never silently ignored) unless it carries its neutral value (`presence_penalty: 0`,
//! `logit_bias: {}`, `n: 1`…), which clients and SDKs often send by default.

use crate::error::ApiError;
use serde_json::{Map, Value};
use std::collections::HashSet;

/// A JSON object's fields, read one by one; `finish` refuses the ones nobody read.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
    seen: HashSet<&'a str>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    pub fn new(v: &'a Value) -> Result<Fields<'a>, ApiError> {
        match v {
            Value::Object(obj) => Ok(Fields { obj, seen: HashSet::new() }),
            other => Err(ApiError::bad_request(format!("the request body must be a JSON object, not {}", type_name(other)))),
        }
    }

    /// The field's value; a JSON null counts as absent.
    pub fn get(&mut self, name: &'a str) -> Option<&'a Value> {
        self.seen.insert(name);
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub fn has(&self, name: &str) -> bool {
        self.obj.get(name).is_some_and(|v| !v.is_null())
    }

    pub fn number(&mut self, name: &'a str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad(name, format!("`{name}` must be a number, not {}", type_name(v)))),
        }
    }

    pub fn int(&mut self, name: &'a str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_i64().or_else(|| v.as_u64().map(|u| u as i64)).map(Some).ok_or_else(|| ApiError::bad(name, format!("`{name}` must be an integer, not {}", if v.is_number() { "a fraction" } else { type_name(v) }))),
        }
    }

    /// An integer in `lo..=hi`.
    pub fn int_in(&mut self, name: &'a str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.int(name)? {
            Some(x) if x < lo || x > hi => Err(ApiError::bad(name, format!("`{name}` must be in {lo}..={hi}, not {x}"))),
            x => Ok(x),
        }
    }

    pub fn bool(&mut self, name: &'a str, default: bool) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be true or false, not {}", type_name(v)))),
        }
    }

    pub fn string(&mut self, name: &'a str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::bad(name, format!("`{name}` must be a string, not {}", type_name(v)))),
        }
    }

    /// A field kern does not implement: accepted only at its neutral value.
    pub fn neutral(&mut self, name: &'a str, is_neutral: impl Fn(&Value) -> bool, what: &str) -> Result<(), ApiError> {
        match self.get(name) {
            Some(v) if !is_neutral(v) => Err(ApiError::bad(name, format!("`{name}` is not supported by kern ({what}); leave it out"))),
            _ => Ok(()),
        }
    }

    /// Refuses every field nobody read.
    pub fn finish(self) -> Result<(), ApiError> {
        let mut unknown: Vec<&String> = self.obj.keys().filter(|k| !self.seen.contains(k.as_str())).collect();
        unknown.sort();
        match unknown.first() {
            None => Ok(()),
            Some(k) => Err(ApiError::bad(k.as_str(), format!("unknown field `{k}`: kern does not support it (remove it from the request)"))),
        }
    }
}

pub fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
pub fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
pub fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Model defaults for unset sampling fields (the model's `generation_config.json`), then
/// OpenAI's.
#[derive(Clone, Debug)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        SamplingDefaults { temperature: 1.0, top_p: 1.0, top_k: 0, min_p: 0.0 }
    }
}

impl SamplingDefaults {
    /// Reads `temperature`, `top_p`, `top_k`, `min_p` from a `generation_config.json` value.
    pub fn from_generation_config(v: &Value) -> SamplingDefaults {
        let d = SamplingDefaults::default();
        let f = |k: &str, x: f32| v.get(k).and_then(Value::as_f64).map_or(x, |y| y as f32);
        let do_sample = v.get("do_sample").and_then(Value::as_bool).unwrap_or(true);
        SamplingDefaults {
            temperature: if do_sample { f("temperature", d.temperature) } else { 0.0 },
            top_p: f("top_p", d.top_p),
            top_k: v.get("top_k").and_then(Value::as_i64).map_or(d.top_k, |k| k.max(0) as i32),
            min_p: f("min_p", d.min_p),
        }
    }
}

/// The fields completions and chat share.
#[derive(Clone, Debug)]
pub struct Common {
    pub model: Option<String>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub skip_special_tokens: bool,
    pub include_stop_str: bool,
}

pub const MAX_N: i64 = 64;
const MAX_STOPS: usize = 16;

pub fn common<'a>(f: &mut Fields<'a>, d: &SamplingDefaults) -> Result<Common, ApiError> {
    let model = f.string("model")?.map(str::to_string);
    let temperature = f.number("temperature")?.map_or(d.temperature, |x| x as f32);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::bad("temperature", format!("`temperature` must be ≥ 0, not {temperature}")));
    }
    let top_p = f.number("top_p")?.map_or(d.top_p, |x| x as f32);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", format!("`top_p` must be in (0, 1], not {top_p}")));
    }
    // -1 (older vLLM) and 0 both mean off.
    let top_k = f.int_in("top_k", -1, i32::MAX as i64)?.map_or(d.top_k, |k| k.max(0) as i32);
    let min_p = f.number("min_p")?.map_or(d.min_p, |x| x as f32);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(ApiError::bad("min_p", format!("`min_p` must be in [0, 1], not {min_p}")));
    }
    let seed = f.int("seed")?.map(|s| s as u64);
    let stop: Vec<String> = match f.get("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().map(|x| x.as_str().map(str::to_string).ok_or_else(|| ApiError::bad("stop", "`stop` must be a string or a list of strings"))).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop", "`stop` must be a string or a list of strings")),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad("stop", format!("at most {MAX_STOPS} stop strings, not {}", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "stop strings must not be empty"));
    }
    let stop_token_ids: Vec<u32> = match f.get("stop_token_ids") {
        None => vec![],
        Some(Value::Array(a)) => a.iter().map(|x| x.as_u64().filter(|&u| u <= u32::MAX as u64).map(|u| u as u32).ok_or_else(|| ApiError::bad("stop_token_ids", "`stop_token_ids` must be a list of token ids"))).collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop_token_ids", "`stop_token_ids` must be a list of token ids")),
    };
    let ignore_eos = f.bool("ignore_eos", false)?;
    let n = f.int_in("n", 1, MAX_N)?.unwrap_or(1) as usize;
    if f.has("best_of") {
        let b = f.int("best_of")?;
        if b != Some(n as i64) {
            return Err(ApiError::bad("best_of", "`best_of` is not supported by kern (only best_of = n); leave it out"));
        }
    }
    let stream = f.bool("stream", false)?;
    let (mut include_usage, mut continuous_usage) = (false, false);
    if let Some(so) = f.get("stream_options") {
        if !stream {
            return Err(ApiError::bad("stream_options", "`stream_options` needs `stream: true`"));
        }
        let mut sf = Fields::new(so).map_err(|_| ApiError::bad("stream_options", "`stream_options` must be an object"))?;
        include_usage = sf.bool("include_usage", false).map_err(|e| ApiError::bad("stream_options.include_usage", e.message))?;
        continuous_usage = sf.bool("continuous_usage_stats", false).map_err(|e| ApiError::bad("stream_options.continuous_usage_stats", e.message))?;
        sf.finish().map_err(|e| ApiError::bad(format!("stream_options.{}", e.param.clone().unwrap_or_default()), e.message))?;
    }
    let skip_special_tokens = f.bool("skip_special_tokens", true)?;
    let include_stop_str = f.bool("include_stop_str_in_output", false)?;
    f.string("user")?; // accepted, not used
    f.neutral("presence_penalty", is_zero, "no penalties")?;
    f.neutral("frequency_penalty", is_zero, "no penalties")?;
    f.neutral("repetition_penalty", is_one, "no penalties")?;
    f.neutral("logit_bias", is_empty, "no logit bias")?;
    f.neutral("min_tokens", is_zero, "no minimum length")?;
    f.neutral("bad_words", is_empty, "no bad-word lists")?;
    f.neutral("truncate_prompt_tokens", |_| false, "prompts are never truncated")?;
    f.neutral("prompt_logprobs", |_| false, "no prompt logprobs")?;
    f.neutral("guided_json", |_| false, "no guided decoding")?;
    f.neutral("guided_regex", |_| false, "no guided decoding")?;
    f.neutral("priority", is_zero, "FCFS scheduling only")?;
    Ok(Common { model, temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos, n, stream, include_usage, continuous_usage, skip_special_tokens, include_stop_str })
}

/// A completions prompt: texts or token-id lists.
#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

pub fn prompts(v: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    let bad = || ApiError::bad("prompt", "`prompt` must be a string, a list of strings, a list of token ids or a list of token-id lists");
    let ids = |a: &[Value]| a.iter().map(|x| x.as_u64().filter(|&u| u <= u32::MAX as u64).map(|u| u as u32).ok_or_else(bad)).collect::<Result<Vec<u32>, _>>();
    let out = match v {
        None => return Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::bad("prompt", "`prompt` is empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a.iter().map(|s| Prompt::Text(s.as_str().unwrap_or_default().to_string())).collect(),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Prompt::Ids(ids(a)?)],
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a.iter().map(|x| ids(x.as_array().map_or(&[][..], |v| v.as_slice())).map(Prompt::Ids)).collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if out.iter().any(|p| matches!(p, Prompt::Text(s) if s.is_empty()) || matches!(p, Prompt::Ids(i) if i.is_empty())) {
        return Err(ApiError::bad("prompt", "`prompt` is empty: give at least one token"));
    }
    Ok(out)
}
