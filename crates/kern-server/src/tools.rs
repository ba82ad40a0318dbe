//! Tool calls: the request's `tools` / `tool_choice` / `parallel_tool_calls`, the grammar that
//! enforces `required` and named choices, and the parsers that turn a model's own tool-call text
//! into OpenAI's `tool_calls` — whole, or as `delta.tool_calls` fragments while it streams.
//!
//! A model family writes tool calls its own way; [`ToolFormat`] is that way (how calls are
//! recognized, and the grammar that forces one). [`Tagged`] is the format whose calls are JSON
//! objects `{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>` (the Hermes
//! format; docs/structured-output.md lists the models that use it). Another format (a JSON object after a
//! marker token, a bracketed list) is another implementation of the trait.

use crate::error::ApiError;
use serde_json::{json, Value};

/// One tool the request offers.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The arguments' JSON Schema (a tool without parameters takes `{}`).
    pub parameters: Value,
    pub strict: bool,
}

/// What the request lets the model do with its tools.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// No calls: the output is text (tools are still shown to the model).
    None,
    /// Text or calls, as the model decides; calls are parsed from the output.
    Auto,
    /// At least one call (a grammar forces it).
    Required,
    /// One call of this function (a grammar forces it).
    Named(String),
}

/// The request's tools, parsed.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// The `tools` array as sent (the chat template renders it).
    pub raw: Value,
    pub choice: Choice,
    pub parallel: bool,
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text, as the model wrote them (`{}` when it gave none).
    pub arguments: String,
}

/// A model's tool-call format.
pub trait ToolFormat: Send + Sync {
    /// A short name (`--tool-call-parser`).
    fn name(&self) -> &'static str;
    /// A Lark grammar (llguidance's dialect) that allows only calls: one of `tools` (all of
    /// them for `required`, the named one otherwise), several when `parallel`.
    fn grammar(&self, tools: &[Tool], parallel: bool) -> String;
    /// A streaming parser of one output.
    fn stream(&self) -> Box<dyn ToolStream>;
}

/// What a streaming parser emits.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text that is not a call.
    Content(String),
    /// Call `index` started: its name is known.
    Start { index: usize, name: String },
    /// More of call `index`'s arguments text.
    Arguments { index: usize, text: String },
}

/// Parses one output as it arrives: `push` each piece of text, `finish` at the end.
pub trait ToolStream: Send {
    fn push(&mut self, text: &str) -> Vec<Piece>;
    fn finish(&mut self) -> Vec<Piece>;
}

/// The whole output parsed: the text before the first call, and the calls. Built from the same
/// streaming parser, so the calls equal what a stream's fragments reassemble to.
pub fn parse(format: &dyn ToolFormat, text: &str) -> (String, Vec<Call>) {
    let mut s = format.stream();
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    assemble(pieces)
}

/// Pieces → content and calls.
pub fn assemble(pieces: Vec<Piece>) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls: Vec<Call> = Vec::new();
    for p in pieces {
        match p {
            Piece::Content(t) => content.push_str(&t),
            Piece::Start { name, .. } => calls.push(Call { name, arguments: String::new() }),
            Piece::Arguments { index, text } => {
                if let Some(c) = calls.get_mut(index) {
                    c.arguments.push_str(&text);
                }
            }
        }
    }
    for c in &mut calls {
        if c.arguments.trim().is_empty() {
            c.arguments = "{}".into();
        }
    }
    (content, calls)
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls` (None: no tools).
pub fn parse_request(tools: Option<&Value>, choice: Option<&Value>, parallel: Option<&Value>) -> Result<Option<ToolRequest>, ApiError> {
    let list = match tools {
        None => {
            if choice.is_some_and(|c| c != "none") {
                return Err(ApiError::bad("tool_choice", "`tool_choice` needs `tools`"));
            }
            return Ok(None);
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::bad("tools", "`tools` must be a list of {\"type\": \"function\", \"function\": {…}} objects")),
    };
    if list.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::bad(format!("{p}.type"), format!("`{p}.type` must be \"function\" (the only tool type kern serves)")));
        }
        let f = t.get("function").and_then(Value::as_object).ok_or_else(|| ApiError::bad(format!("{p}.function"), format!("`{p}.function` is required: {{\"name\", \"parameters\"}}")))?;
        let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| ApiError::bad(format!("{p}.function.name"), format!("`{p}.function.name` is required")))?;
        if out.iter().any(|x: &Tool| x.name == name) {
            return Err(ApiError::bad(format!("{p}.function.name"), format!("two tools are named `{name}`")));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => return Err(ApiError::bad(format!("{p}.function.parameters"), format!("`{p}.function.parameters` must be a JSON Schema object"))),
        };
        let strict = f.get("strict").and_then(Value::as_bool).unwrap_or(false);
        out.push(Tool { name: name.to_string(), parameters, strict });
    }
    let choice = match choice {
        None => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(ApiError::bad("tool_choice", format!("`tool_choice` is `{other}`: use none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"))),
        },
        Some(v @ Value::Object(_)) => {
            let name = v.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| ApiError::bad("tool_choice", "`tool_choice` as an object names a function: {\"type\": \"function\", \"function\": {\"name\": …}}"))?;
            if !out.iter().any(|t| t.name == name) {
                return Err(ApiError::bad("tool_choice", format!("`tool_choice` names `{name}`, which is not among `tools`")));
            }
            Choice::Named(name.to_string())
        }
        Some(_) => return Err(ApiError::bad("tool_choice", "`tool_choice` must be a string or a function object")),
    };
    let parallel = match parallel {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("parallel_tool_calls", "`parallel_tool_calls` must be true or false")),
    };
    Ok(Some(ToolRequest { tools: out, raw: Value::Array(list.clone()), choice, parallel }))
}

/// The JSON Schema of one call object `{"name": …, "arguments": …}` of any of `tools`.
pub fn call_schema(tools: &[Tool]) -> Value {
    let one = |t: &Tool| json!({"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters}, "required": ["name", "arguments"], "additionalProperties": false});
    let mut s = if tools.len() == 1 { one(&tools[0]) } else { json!({"anyOf": tools.iter().map(one).collect::<Vec<_>>()}) };
    // Strict tools are enforced keyword by keyword; otherwise keywords the compiler does not
    // support are ignored rather than refused.
    let lenient = tools.iter().any(|t| !t.strict);
    s["x-guidance"] = json!({"whitespace_flexible": true, "whitespace_pattern": kern_engine::constraint::JSON_WHITESPACE, "lenient": lenient});
    s
}

/// Calls between `<tool_call>` and `</tool_call>`, each a JSON object with `name` and
/// `arguments` (the Hermes format).
pub struct Tagged;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ToolFormat for Tagged {
    fn name(&self) -> &'static str {
        "hermes"
    }

    fn grammar(&self, tools: &[Tool], parallel: bool) -> String {
        let call = format!("call: \"{OPEN}\\n\" %json {} \"\\n{CLOSE}\"", call_schema(tools));
        let start = if parallel { "start: call (\"\\n\" call)*" } else { "start: call" };
        format!("{start}\n{call}\n")
    }

    fn stream(&self) -> Box<dyn ToolStream> {
        Box::new(TaggedStream::default())
    }
}

#[derive(Default)]
struct TaggedStream {
    buf: String,
    /// Inside a call: its index and how far its arguments were sent.
    call: Option<CallState>,
    calls: usize,
    /// Whitespace after a call (or before anything), dropped unless text follows.
    pending_ws: String,
    /// Text that is not whitespace was sent: a bare call object can no longer start.
    had_text: bool,
}

struct CallState {
    index: usize,
    named: bool,
    /// Byte offset in `buf` where the arguments value starts, once found.
    args_at: Option<usize>,
    /// Bytes of the arguments value already sent.
    sent: usize,
}

/// What `s` (starting at `{`) is as the start of a bare call object `{"name": "…", "arguments":`
/// (or `"parameters":`), the form small models write without the tags.
#[derive(Debug, PartialEq)]
enum Bare {
    /// It is one: the object's key `arguments` / `parameters` and its colon are complete.
    Call,
    /// It may still become one (it ends inside that prefix).
    Maybe,
    /// It is not one.
    No,
}

fn bare_call(s: &str) -> Bare {
    // Literal pieces of the prefix, matched partially at the end of `s`.
    fn lit<'a>(s: &'a str, l: &str) -> Result<&'a str, Bare> {
        if let Some(r) = s.strip_prefix(l) {
            Ok(r)
        } else if l.starts_with(s) {
            Err(Bare::Maybe)
        } else {
            Err(Bare::No)
        }
    }
    let run = || -> Result<(), Bare> {
        let r = lit(s, "{")?.trim_start();
        let r = lit(r, "\"name\"")?.trim_start();
        let r = lit(r, ":")?.trim_start();
        if r.is_empty() {
            return Err(Bare::Maybe);
        }
        if !r.starts_with('"') {
            return Err(Bare::No);
        }
        let mut de = serde_json::Deserializer::from_str(r).into_iter::<String>();
        match de.next() {
            Some(Ok(_)) => {}
            Some(Err(e)) if e.is_eof() => return Err(Bare::Maybe),
            _ => return Err(Bare::No),
        }
        let r = r[de.byte_offset()..].trim_start();
        let r = lit(r, ",")?.trim_start();
        let r = match lit(r, "\"arguments\"") {
            Ok(r) => r,
            Err(Bare::No) => lit(r, "\"parameters\"")?,
            Err(m) => {
                // Both keys start with `"`: a prefix of either may still become one.
                return Err(if "\"parameters\"".starts_with(r) { Bare::Maybe } else { m });
            }
        };
        lit(r.trim_start(), ":")?;
        Ok(())
    };
    match run() {
        Ok(()) => Bare::Call,
        Err(b) => b,
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])).unwrap_or(0)
}

/// Where the JSON object or array starting at `s` (after whitespace) ends: Some(byte after it)
/// once complete; None while open. String-aware, so brackets and tags inside strings do not
/// count.
fn value_end(s: &str) -> Option<usize> {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, c) in s.char_indices() {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

impl TaggedStream {
    fn step(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match &mut self.call {
                None => {
                    // A bare call object (no tags), as small models write them: only before
                    // any text (at the start of the output or right after another call).
                    if !self.had_text {
                        let t = self.buf.trim_start();
                        let lead = self.buf.len() - t.len();
                        if t.starts_with('{') {
                            match bare_call(t) {
                                Bare::Call => {
                                    self.pending_ws.clear();
                                    self.buf.drain(..lead);
                                    self.call = Some(CallState { index: self.calls, named: false, args_at: None, sent: 0 });
                                    self.calls += 1;
                                    continue;
                                }
                                Bare::Maybe if !end => return,
                                _ => {}
                            }
                        }
                    }
                    if let Some(at) = self.buf.find(OPEN) {
                        let before: String = self.buf[..at].to_string();
                        self.text(&before, out);
                        self.pending_ws.clear();
                        self.buf.drain(..at + OPEN.len());
                        self.call = Some(CallState { index: self.calls, named: false, args_at: None, sent: 0 });
                        self.calls += 1;
                        continue;
                    }
                    let keep = if end { 0 } else { partial_suffix(&self.buf, OPEN) };
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.text(&text, out);
                    if end {
                        self.pending_ws.clear();
                    }
                    return;
                }
                Some(c) => {
                    let body = self.buf.trim_start();
                    let lead = self.buf.len() - body.len();
                    // The call object ends when its braces close (tags inside strings do not
                    // count), then `</tool_call>` follows.
                    let obj_end = if body.starts_with('{') { value_end(body).map(|e| lead + e) } else { None };
                    if !c.named {
                        if let Some(name) = early_name(body) {
                            out.push(Piece::Start { index: c.index, name });
                            c.named = true;
                        }
                    }
                    if c.named && c.args_at.is_none() {
                        if let Some(k) = args_start(body) {
                            c.args_at = Some(lead + k);
                        }
                    }
                    if let Some(a) = c.args_at {
                        let avail = &self.buf[a..];
                        let vend = value_end(avail);
                        // While open, hold back a trailing partial escape or multi-byte char: the
                        // fragment text must be whole characters (always true for &str).
                        let upto = vend.unwrap_or(avail.len());
                        if upto > c.sent {
                            out.push(Piece::Arguments { index: c.index, text: avail[c.sent..upto].to_string() });
                            c.sent = upto;
                        }
                    }
                    let closed = obj_end.and_then(|e| {
                        let after = &self.buf[e..];
                        let t = after.trim_start();
                        if t.starts_with(CLOSE) {
                            Some(e + (after.len() - t.len()) + CLOSE.len())
                        } else if end || (!t.is_empty() && !CLOSE.starts_with(t)) {
                            Some(e) // no closing tag: the call ends with its object
                        } else {
                            None
                        }
                    });
                    match closed {
                        Some(n) => {
                            let obj = &self.buf[lead..obj_end.expect("closed")];
                            finish_call(c, obj, out);
                            self.buf.drain(..n);
                            self.call = None;
                            continue;
                        }
                        None if end => {
                            // Cut off inside the call (max_tokens): what was parsed stands.
                            let obj = self.buf[lead..].to_string();
                            finish_call(c, &obj, out);
                            self.buf.clear();
                            self.call = None;
                            return;
                        }
                        None => return,
                    }
                }
            }
        }
    }

    /// Text outside calls; whitespace right after a call is held until text follows it.
    fn text(&mut self, t: &str, out: &mut Vec<Piece>) {
        if t.is_empty() {
            return;
        }
        if (self.calls > 0 || !self.had_text) && t.trim().is_empty() {
            self.pending_ws.push_str(t);
            return;
        }
        self.had_text = true;
        let mut s = std::mem::take(&mut self.pending_ws);
        s.push_str(t);
        out.push(Piece::Content(s));
    }
}

/// A call object ended: a name never seen (arguments before the name, or no name) is sent now
/// from the parsed object, with its arguments if none were streamed.
fn finish_call(c: &mut CallState, obj: &str, out: &mut Vec<Piece>) {
    let v: Option<Value> = serde_json::from_str(obj).ok();
    if !c.named {
        let name = v.as_ref().and_then(|v| v.get("name")).and_then(Value::as_str).unwrap_or_default().to_string();
        out.push(Piece::Start { index: c.index, name });
        c.named = true;
    }
    if c.sent == 0 {
        let args = v.as_ref().and_then(|v| v.get("arguments").or_else(|| v.get("parameters"))).cloned();
        let text = match args {
            Some(Value::String(s)) => s,
            Some(a) => a.to_string(),
            None => "{}".into(),
        };
        out.push(Piece::Arguments { index: c.index, text });
    }
}

/// The call's name once `"name": "…"` is complete at the object's top level.
fn early_name(body: &str) -> Option<String> {
    let rest = body.strip_prefix('{')?.trim_start();
    let rest = rest.strip_prefix("\"name\"")?.trim_start().strip_prefix(':')?.trim_start();
    if !rest.starts_with('"') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    match de.next() {
        Some(Ok(s)) => Some(s),
        _ => None,
    }
}

/// Offset (in `body`) of the arguments value when `"arguments":` (or `"parameters":`) follows
/// the name and the value is an object or array (a string value is sent whole at the end).
fn args_start(body: &str) -> Option<usize> {
    let rest = body.strip_prefix('{')?.trim_start().strip_prefix("\"name\"")?.trim_start().strip_prefix(':')?.trim_start();
    let mut de = serde_json::Deserializer::from_str(rest).into_iter::<String>();
    de.next()?.ok()?;
    let after_name = &rest[de.byte_offset()..];
    let t = after_name.trim_start().strip_prefix(',')?.trim_start();
    let t = t.strip_prefix("\"arguments\"").or_else(|| t.strip_prefix("\"parameters\""))?.trim_start().strip_prefix(':')?.trim_start();
    t.starts_with(['{', '[']).then(|| body.len() - t.len())
}

impl ToolStream for TaggedStream {
    fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.step(&mut out, false);
        out
    }

    fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.step(&mut out, true);
        out
    }
}

/// The tool-call format a chat template writes, judged from its source.
pub fn detect(template: &str) -> Option<Box<dyn ToolFormat>> {
    template.contains(OPEN).then(|| Box::new(Tagged) as Box<dyn ToolFormat>)
}

/// A format by its `--tool-call-parser` name.
pub fn by_name(name: &str) -> Option<Box<dyn ToolFormat>> {
    match name {
        "hermes" => Some(Box::new(Tagged)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
