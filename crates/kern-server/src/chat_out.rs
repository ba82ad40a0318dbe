//! A chat choice's output shaped for the API: the reasoning block apart (`reasoning_content`,
//! `reasoning`), tool calls parsed from the answer (`tool_calls`, `finish_reason: tool_calls`),
//! the rest as `content` — for a whole message, or as `delta`s while the output streams (a
//! call's id and name once, then its argument fragments, as OpenAI streams them).

use crate::reasoning::{self, Part, Splitter};
use crate::tools::{self, Piece, ToolFormat, ToolStream};
use kern_engine::FinishReason;
use serde_json::{json, Value};
use std::sync::Arc;

/// How a request's chat output is taken apart.
#[derive(Clone)]
pub struct Shape {
    /// Split off a reasoning block; `Some(open)`: the prompt left a block open.
    pub reasoning: Option<bool>,
    /// Parse tool calls in this format (None: `tool_choice: none`, or no tools).
    pub tools: Option<Arc<dyn ToolFormat>>,
}

impl Shape {
    pub fn plain(&self) -> bool {
        self.reasoning.is_none() && self.tools.is_none()
    }
}

fn call_id() -> String {
    format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24])
}

fn finish_reason(reason: FinishReason, calls: bool) -> &'static str {
    if calls && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_str()
    }
}

/// The whole message of a finished choice, and its finish reason.
pub fn message(shape: &Shape, text: &str, reason: FinishReason) -> (Value, &'static str) {
    let (thinking, answer) = match shape.reasoning {
        Some(open) => reasoning::split(text, open),
        None => (None, text.to_string()),
    };
    let (content, calls) = match &shape.tools {
        Some(f) => tools::parse(f.as_ref(), &answer),
        None => (answer, vec![]),
    };
    let tool_calls: Vec<Value> = calls.iter().map(|c| json!({"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect();
    let mut m = json!({"role": "assistant", "content": if content.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(content) }, "tool_calls": tool_calls});
    if let Some(r) = thinking {
        m["reasoning_content"] = Value::String(r.clone());
        m["reasoning"] = Value::String(r);
    }
    (m, finish_reason(reason, !calls.is_empty()))
}

/// One choice's output as it streams.
pub struct Stream {
    splitter: Option<Splitter>,
    tools: Option<Box<dyn ToolStream>>,
    ids: Vec<String>,
}

impl Stream {
    pub fn new(shape: &Shape) -> Stream {
        Stream { splitter: shape.reasoning.map(Splitter::new), tools: shape.tools.as_ref().map(|f| f.stream()), ids: Vec::new() }
    }

    /// The deltas of a piece of output.
    pub fn push(&mut self, text: &str) -> Vec<Value> {
        let parts = match self.splitter.as_mut() {
            Some(s) => s.push(text),
            None => vec![Part::Answer(text.to_string())],
        };
        self.deltas(parts, false)
    }

    /// The deltas held back until the end.
    pub fn finish(&mut self) -> Vec<Value> {
        let parts = self.splitter.as_mut().map(Splitter::finish).unwrap_or_default();
        self.deltas(parts, true)
    }

    pub fn finish_reason(&self, reason: FinishReason) -> &'static str {
        finish_reason(reason, !self.ids.is_empty())
    }

    fn deltas(&mut self, parts: Vec<Part>, end: bool) -> Vec<Value> {
        let mut out = Vec::new();
        let mut answer = String::new();
        for p in parts {
            match p {
                Part::Reasoning(t) => out.push(json!({"reasoning_content": t, "reasoning": t})),
                Part::Answer(t) => answer.push_str(&t),
            }
        }
        let pieces = match self.tools.as_mut() {
            None => {
                if !answer.is_empty() {
                    out.push(json!({"content": answer}));
                }
                return out;
            }
            Some(t) => {
                let mut p = t.push(&answer);
                if end {
                    p.extend(t.finish());
                }
                p
            }
        };
        for p in pieces {
            match p {
                Piece::Content(t) => out.push(json!({"content": t})),
                Piece::Start { index, name } => {
                    let id = call_id();
                    self.ids.push(id.clone());
                    out.push(json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}));
                }
                Piece::Arguments { index, text } => out.push(json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})),
            }
        }
        out
    }
}
