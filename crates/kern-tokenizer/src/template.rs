//! Hugging Face chat templates (the Jinja `chat_template` of `tokenizer_config.json`,
//! `chat_template.jinja` or GGUF's `tokenizer.chat_template`) rendered with minijinja the way
//! transformers' `apply_chat_template` renders them with Jinja2.
//!
//! What transformers sets up, and kern reproduces:
//! - `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template dropped;
//!   `{% break %}` / `{% continue %}`; the `{% generation %}` tag (kept as a plain block).
//! - Globals `raise_exception(msg)` (→ [`TemplateError::Raised`]), `strftime_now(fmt)` (local
//!   time, Python `strftime` codes), `namespace(...)`, `dict(...)`; the `tojson` filter is
//!   transformers' own (`json.dumps` with `ensure_ascii=False`, optional `indent`, `separators`,
//!   `sort_keys`; Python's separators and float spelling), not Jinja's HTML-escaping one.
//! - Python string / dict / list methods (`.strip()`, `.startswith()`, `.split()`, `.items()`,
//!   ...) through `minijinja-contrib`'s pycompat; `None`, `True`, `False` print as in Python.
//! - The context: the special tokens (`bos_token`, `eos_token`), then `chat_template_kwargs`
//!   (which override them), then `messages`, `tools` (`none` when absent), `documents` (`none`)
//!   and `add_generation_prompt`.
//! - Messages as transformers 5 prepares them: keys whose value is `null` are dropped (but see
//!   `content` below), and a reasoning text given as
//!   `reasoning_content`, `thinking` or `reasoning` is visible under `thinking` and
//!   `reasoning_content` both.
//!
//! Where kern differs from a literal transformers call, on purpose (as vLLM does), to take
//! OpenAI-style requests:
//! - `content` given as a list of parts (`[{"type": "text", "text": "…"}]`) is joined into one
//!   string (parts separated by `\n`) unless the template itself iterates over a message's
//!   content (a `{% for … in …content… %}`, as multimodal templates do), in which case the list
//!   is passed as given. Most text-only templates call string methods on
//!   `content` and would otherwise fail or drop the text. A non-text part (an image) in a joined
//!   message is refused ([`TemplateError::Raised`]). See [`ContentFormat`]. For such templates
//!   a `null` content (OpenAI's assistant message with `tool_calls`) becomes `""` rather than
//!   a missing key.
//! - A tool call's `function.arguments` given as a JSON string (as the OpenAI API sends it) is
//!   parsed into the object it holds, which is what templates (and transformers' docs) expect;
//!   a string that is not a JSON object is passed as given.

use crate::config::kind;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Map;
use std::fmt::Write as _;

/// The name the template is registered under (it appears in error locations: `chat:12`).
const NAME: &str = "chat";
/// An upper bound on the work of one render (minijinja instructions), so that a hostile
/// template cannot hold a server thread: generous for any real conversation.
const FUEL: u64 = 20_000_000;
/// How deep `tojson` descends before it refuses (a guard against self-referencing values).
const JSON_DEPTH: usize = 256;
/// The keys [`ChatTemplate::render`] sets itself; `chat_template_kwargs` may not set them.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template is not valid Jinja (as minijinja reads it).
    #[error("chat template syntax error{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Syntax {
        message: String,
        line: Option<usize>,
    },
    /// The conversation was refused: the template called `raise_exception(message)` (for
    /// example "Conversation roles must alternate user/assistant/user/assistant/..."), or kern
    /// refused the input before rendering (a message that is not an object, an image part for a
    /// text-only template, a reserved key in `chat_template_kwargs`). A client error (HTTP 400).
    #[error("{message}")]
    Raised { message: String },
    /// Rendering failed inside the template (an undefined method, a type error, ...): usually
    /// a template that relies on Jinja2 behavior minijinja lacks, or input the template did not
    /// expect.
    #[error("chat template failed: {message}")]
    Render { message: String },
}

/// How [`ChatTemplate::render`] hands a message's `content` list to the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// Text parts are joined into one string (separated by `\n`); other parts are refused.
    String,
    /// The list is passed as given (the template iterates over the parts itself).
    Parts,
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    content_format: ContentFormat,
}

/// The error `raise_exception` attaches, found again in [`ChatTemplate::render`].
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors are reported here; unknown filters, functions and
    /// methods only when a render reaches them.
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let source = plain_generation_blocks(source);
        let content_format = if iterates_content(&source) {
            ContentFormat::Parts
        } else {
            ContentFormat::String
        };
        env.add_template_owned(NAME, source)
            .map_err(|e| TemplateError::Syntax {
                message: e.detail().unwrap_or("invalid template").to_string(),
                line: e.line(),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
            content_format,
        })
    }

    /// How this template receives list-of-parts `content` (decided from its source).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Overrides the [`ContentFormat`] guessed from the template's source.
    pub fn with_content_format(mut self, format: ContentFormat) -> ChatTemplate {
        self.content_format = format;
        self
    }

    /// The prompt text of a conversation.
    ///
    /// `messages`: a JSON array of OpenAI-style message objects (`role`, `content`,
    /// `tool_calls`, `name`, `tool_call_id`, `reasoning_content`, ...); `tools`: the OpenAI
    /// `tools` array, or `None`; `add_generation_prompt`: open the assistant's turn at the end;
    /// `extra`: `chat_template_kwargs` (such as `enable_thinking`), added to the context.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: Option<&Map<String, serde_json::Value>>,
    ) -> Result<String, TemplateError> {
        let messages = self.prepare_messages(messages)?;
        let mut ctx: Map<String, serde_json::Value> = Map::new();
        if let Some(t) = &self.bos_token {
            ctx.insert("bos_token".into(), t.clone().into());
        }
        if let Some(t) = &self.eos_token {
            ctx.insert("eos_token".into(), t.clone().into());
        }
        if let Some(extra) = extra {
            for (k, v) in extra {
                if RESERVED.contains(&k.as_str()) {
                    return Err(TemplateError::Raised {
                        message: format!(
                            "chat_template_kwargs may not set `{k}`: the request's own field sets it"
                        ),
                    });
                }
                ctx.insert(k.clone(), v.clone());
            }
        }
        ctx.insert("messages".into(), serde_json::Value::Array(messages));
        let tools = match tools {
            None | Some(serde_json::Value::Null) => serde_json::Value::Null,
            Some(t @ serde_json::Value::Array(_)) => t.clone(),
            Some(t) => {
                return Err(TemplateError::Raised {
                    message: format!("`tools` is {}, expected an array of tools", kind(t)),
                })
            }
        };
        ctx.insert("tools".into(), tools);
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());

        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render {
                message: e.to_string(),
            })?;
        template
            .render(Value::from_serialize(&ctx))
            .map_err(render_error)
    }

    /// Checks the messages and brings them into the shape transformers gives templates.
    fn prepare_messages(
        &self,
        messages: &serde_json::Value,
    ) -> Result<Vec<serde_json::Value>, TemplateError> {
        let refuse = |message: String| TemplateError::Raised { message };
        let list = messages.as_array().ok_or_else(|| {
            refuse(format!(
                "`messages` is {}, expected an array of message objects",
                kind(messages)
            ))
        })?;
        if list.is_empty() {
            return Err(refuse(
                "`messages` is empty: a conversation needs at least one message".into(),
            ));
        }
        let mut out = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let obj = m.as_object().ok_or_else(|| {
                refuse(format!(
                    "messages[{i}] is {}, expected an object with `role` and `content`",
                    kind(m)
                ))
            })?;
            // transformers 5 drops keys whose value is None before rendering; a text-only
            // template gets "" for a null `content` instead (OpenAI sends `content: null`
            // beside `tool_calls`, and text templates concatenate the content).
            let mut msg: Map<String, serde_json::Value> = obj
                .iter()
                .filter(|(k, v)| {
                    !v.is_null()
                        || (*k == "content" && self.content_format == ContentFormat::String)
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if self.content_format == ContentFormat::String {
                if let Some(content) = msg.get_mut("content") {
                    match content {
                        serde_json::Value::Null => *content = "".into(),
                        serde_json::Value::Array(parts) => {
                            *content = join_text_parts(i, parts)?.into()
                        }
                        _ => {}
                    }
                }
            }
            if let Some(serde_json::Value::Array(calls)) = msg.get_mut("tool_calls") {
                for call in calls {
                    if let Some(f) = call.get_mut("function").and_then(|f| f.as_object_mut()) {
                        if let Some(serde_json::Value::String(args)) = f.get("arguments") {
                            if let Ok(obj @ serde_json::Value::Object(_)) =
                                serde_json::from_str::<serde_json::Value>(args)
                            {
                                f.insert("arguments".into(), obj);
                            }
                        }
                    }
                }
            }
            out.push(serde_json::Value::Object(alias_reasoning(msg)));
        }
        Ok(out)
    }
}

/// transformers' `_alias_reasoning_fields`: `{"thinking": r, **message, "reasoning_content": r}`
/// where r is the first non-null of `reasoning_content`, `thinking`, `reasoning`.
fn alias_reasoning(msg: Map<String, serde_json::Value>) -> Map<String, serde_json::Value> {
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| msg.get(*k).filter(|v| !v.is_null()).cloned());
    let Some(r) = reasoning else { return msg };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    for (k, v) in msg {
        out.insert(k, v);
    }
    out.insert("reasoning_content".into(), r);
    out
}

fn join_text_parts(i: usize, parts: &[serde_json::Value]) -> Result<String, TemplateError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let ty = part.get("type").and_then(|t| t.as_str());
        match (ty, part.get("text").and_then(|t| t.as_str())) {
            (Some("text") | None, Some(text)) => texts.push(text),
            _ => {
                return Err(TemplateError::Raised {
                    message: format!(
                        "messages[{i}].content[{j}] is a `{}` part: this model's chat template takes text only (parts of type `text`)",
                        ty.unwrap_or("untyped")
                    ),
                })
            }
        }
    }
    Ok(texts.join("\n"))
}

/// Whether the template loops over a message's content (`{% for part in message['content'] %}`):
/// then it understands content parts and gets them as given.
fn iterates_content(source: &str) -> bool {
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let tag = after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if let Some(head) = tag.strip_prefix("for") {
            if head.starts_with(char::is_whitespace) {
                if let Some(pos) = head.find(" in ") {
                    if head[pos + 4..].contains("content") {
                        return true;
                    }
                }
            }
        }
        rest = &after[end + 2..];
    }
    false
}

/// transformers' `{% generation %}…{% endgeneration %}` (which marks assistant text for
/// training masks) as `{% if true %}…{% endif %}`, keeping the tags' whitespace control.
fn plain_generation_blocks(source: &str) -> String {
    if !source.contains("generation") {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &after[..end];
        let word = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let lead = if inner.starts_with('-') {
                    "-"
                } else if inner.starts_with('+') {
                    "+"
                } else {
                    ""
                };
                let trail = if inner.ends_with('-') {
                    "-"
                } else if inner.ends_with('+') {
                    "+"
                } else {
                    ""
                };
                let _ = write!(out, "{{%{lead} {r} {trail}%}}");
            }
            None => {
                out.push_str("{%");
                out.push_str(inner);
                out.push_str("%}");
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

fn render_error(e: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return TemplateError::Raised {
                message: r.0.clone(),
            };
        }
        source = s.source();
    }
    TemplateError::Render {
        message: e.to_string(),
    }
}

/// `{{ x }}` as Jinja2 prints it where Python and minijinja spell values differently.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

fn raise_exception(message: Value) -> Result<Value, Error> {
    let message = match message.as_str() {
        Some(s) => s.to_string(),
        None => message.to_string(),
    };
    Err(
        Error::new(ErrorKind::InvalidOperation, "raise_exception() was called")
            .with_source(Raised(message)),
    )
}

fn strftime_now(format: &str) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` is not a strftime format"),
        ));
    }
    let mut s = String::new();
    write!(
        s,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format the time with `{format}`"),
        )
    })?;
    Ok(Value::from(s))
}

/// How `tojson` writes JSON: Python's `json.dumps` options.
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// i.e. Python's `json.dumps` with those arguments.
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let pick = |pos: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(name)?;
        Ok(match (pos, kw) {
            (Some(_), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson got `{name}` twice"),
                ))
            }
            (p, k) => p.or(k).filter(|v| !v.is_none() && !v.is_undefined()),
        })
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent is {v}, expected a number or a string"),
                    )
                })?;
                " ".repeat(n.clamp(0, 64) as usize)
            }
        }),
    };
    let (item_sep, key_sep) = match pick(separators, "separators")? {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(v) => {
            let a = v
                .get_item_by_index(0)
                .ok()
                .and_then(|x| x.as_str().map(String::from));
            let b = v
                .get_item_by_index(1)
                .ok()
                .and_then(|x| x.as_str().map(String::from));
            match (a, b, v.len()) {
                (Some(a), Some(b), Some(2)) => (a, b),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: separators is {v}, expected two strings"),
                    ))
                }
            }
        }
    };
    let sort_keys = kwargs
        .get::<Option<Value>>("sort_keys")?
        .is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(v: &Value, style: &JsonStyle, depth: usize, out: &mut String) -> Result<(), Error> {
    if depth > JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply (a cycle?)",
        ));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                let _ = write!(out, "{v}");
            } else {
                let f = f64::try_from(v.clone()).map_err(|_| {
                    Error::new(ErrorKind::InvalidOperation, "tojson: unreadable number")
                })?;
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => {
            write_json_str(v.as_str().unwrap_or_default(), style.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                let name = match key.as_str() {
                    Some(s) => s.to_string(),
                    None if key.is_none() => "null".to_string(),
                    None if key.kind() == ValueKind::Bool => {
                        (if key.is_true() { "true" } else { "false" }).to_string()
                    }
                    None => key.to_string(),
                };
                entries.push((name, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(style, depth + 1, out);
                write_json_str(k, style.ensure_ascii, out);
                out.push_str(&style.key_sep);
                write_json(item, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push('}');
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn newline(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// A JSON string as Python's `json.dumps` writes it.
fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` (and so `json.dumps`) spells it: `1.0`, `0.0001`, `1e-05`,
/// `1e+16`, `NaN`, `Infinity`.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    let sci = format!("{f:e}"); // shortest round-trip digits: "1.5e16", "-2e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(src: &str, messages: serde_json::Value) -> Result<String, TemplateError> {
        ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into()))?
            .render(&messages, None, false, None)
    }

    #[test]
    fn python_floats() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (1e100, "1e+100"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let m = json!([{"role": "user", "content": "x"}]);
        let t = ChatTemplate::new(
            "{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ tools[0] | tojson(separators=(',', ':'), sort_keys=true) }}|{{ 'é\"\n' | tojson(ensure_ascii=true) }}|{{ 'é😀' | tojson }}",
            None,
            None,
        )
        .unwrap();
        let tools = json!([{"z": 1, "a": [1.5, true, null, {}], "é": []}]);
        let out = t.render(&m, Some(&tools), false, None).unwrap();
        assert_eq!(
            out,
            "[{\"z\": 1, \"a\": [1.5, true, null, {}], \"é\": []}]|[\n  {\n    \"z\": 1,\n    \"a\": [\n      1.5,\n      true,\n      null,\n      {}\n    ],\n    \"é\": []\n  }\n]|{\"a\":[1.5,true,null,{}],\"z\":1,\"é\":[]}|\"\\u00e9\\\"\\n\"|\"é😀\""
        );
    }

    #[test]
    fn raise_exception_is_a_client_error() {
        let e = render(
            "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}",
            json!([{"role": "assistant", "content": "x"}]),
        )
        .unwrap_err();
        match e {
            TemplateError::Raised { message } => {
                assert_eq!(message, "Conversation must start with a user message")
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = ChatTemplate::new("line one\n{% if x %}\n{{ y }", None, None).unwrap_err();
        assert!(
            matches!(e, TemplateError::Syntax { line: Some(3), .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("line 3"), "{e}");
    }

    #[test]
    fn render_errors_name_the_problem() {
        let e = render(
            "{{ messages[0].content.nosuchmethod() }}",
            json!([{"role": "user", "content": "x"}]),
        )
        .unwrap_err();
        assert!(matches!(e, TemplateError::Render { .. }), "{e:?}");
        assert!(e.to_string().contains("nosuchmethod"), "{e}");
    }

    #[test]
    fn python_methods_loop_controls_namespace_and_tokens() {
        let src = "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index0 == 2 %}{% break %}{% endif %}{% if m.role == 'skip' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}[{{ m.content.strip().upper() }}|{{ m.content.startswith(' a') }}|{{ m.content.split(',')[-1] }}]{% endfor %}{{ ns.n }}{{ none }}{{ eos_token }}\n";
        let out = render(
            src,
            json!([{"role": "user", "content": " a,b "}, {"role": "skip", "content": "z"}, {"role": "user", "content": "never"}]),
        )
        .unwrap();
        assert_eq!(out, "<s>[A,B|True|b ]1None</s>");
    }

    #[test]
    fn trim_and_lstrip_blocks_as_transformers() {
        let src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
        assert_eq!(
            render(
                src,
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
            )
            .unwrap(),
            "a\nb\n"
        );
    }

    #[test]
    fn content_parts_joined_or_passed() {
        let parts = json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]);
        let t = ChatTemplate::new("{{ messages[0].content }}", None, None).unwrap();
        assert_eq!(t.content_format(), ContentFormat::String);
        assert_eq!(t.render(&parts, None, false, None).unwrap(), "a\nb");
        let t = ChatTemplate::new(
            "{% for p in messages[0]['content'] %}({{ p.text }}){% endfor %}",
            None,
            None,
        )
        .unwrap();
        assert_eq!(t.content_format(), ContentFormat::Parts);
        assert_eq!(t.render(&parts, None, false, None).unwrap(), "(a)(b)");
        let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
        let e = render("{{ messages[0].content }}", image).unwrap_err();
        assert!(
            matches!(e, TemplateError::Raised { .. }) && e.to_string().contains("image_url"),
            "{e}"
        );
    }

    #[test]
    fn null_keys_dropped_arguments_parsed_reasoning_aliased() {
        let out = render(
            "{{ messages[0].content is defined }}|{{ messages[0].tool_calls[0].function.arguments.city }}|{{ messages[0].reasoning_content }}{% for m in messages[0]['content'] %}{% endfor %}",
            json!([{"role": "assistant", "content": null, "name": null, "thinking": "hmm",
                    "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}}]}]),
        )
        .unwrap();
        assert_eq!(out, "False|Paris|hmm");
        let t = ChatTemplate::new(
            "{{ messages[0].content | length }}|{{ messages[0].name is defined }}",
            None,
            None,
        )
        .unwrap();
        let m = json!([{"role": "assistant", "content": null, "name": null}]);
        assert_eq!(t.render(&m, None, false, None).unwrap(), "0|False");
    }

    #[test]
    fn bad_input_is_refused() {
        let t = ChatTemplate::new("x", None, None).unwrap();
        for (m, what) in [
            (json!({"role": "user"}), "expected an array"),
            (json!([]), "empty"),
            (json!(["hi"]), "messages[0] is a string"),
        ] {
            let e = t.render(&m, None, false, None).unwrap_err();
            assert!(
                matches!(e, TemplateError::Raised { .. }) && e.to_string().contains(what),
                "{e}"
            );
        }
        let m = json!([{"role": "user", "content": "x"}]);
        let extra: Map<String, serde_json::Value> =
            [("messages".to_string(), json!([]))].into_iter().collect();
        assert!(t.render(&m, None, false, Some(&extra)).is_err());
        assert!(t.render(&m, Some(&json!({"a": 1})), false, None).is_err());
    }

    #[test]
    fn strftime_now_and_generation_tags() {
        let out = render(
            "{{ strftime_now('%Y') | length }}{%- generation -%} x {%- endgeneration %}",
            json!([{"role": "user", "content": "x"}]),
        )
        .unwrap();
        assert_eq!(out, "4x");
        assert!(render(
            "{{ strftime_now('%Q') }}",
            json!([{"role": "user", "content": "x"}])
        )
        .is_err());
    }

    #[test]
    fn runaway_templates_stop() {
        let e = render(
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            json!([{"role": "user", "content": "x"}]),
        )
        .unwrap_err();
        assert!(matches!(e, TemplateError::Render { .. }), "{e:?}");
    }
}
