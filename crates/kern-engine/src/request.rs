//! What a client asks the engine for, and what comes back on the request's channel.

use crate::constraint::Constraint;
use std::time::Instant;

pub type RequestId = u64;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: i32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off: drop tokens below `min_p` × the top token's probability (sampled on the host).
    pub min_p: f32,
    /// None: the engine draws one.
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: None }
    }
}

/// One generation request, already tokenized and validated by its client.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    /// New tokens at most.
    pub max_tokens: usize,
    /// Strings that end the output; matched on the decoded text across token boundaries and
    /// never emitted (unless `include_stop_str`).
    pub stop: Vec<String>,
    pub include_stop_str: bool,
    /// Token ids that end the output (even with `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Do not stop at the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Return each generated token's logprob and this many alternatives (None: no logprobs).
    pub logprobs: Option<usize>,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// Return each generated token's full last-position logits row (`Event::Output::logits`;
    /// for debugging and parity checks, e.g. `kern generate --dump`).
    pub return_logits: bool,
    /// When the client sent it (TTFT and queue time count from here).
    pub arrival: Instant,
    /// A grammar the output must follow (compiled with `Engine::compile`), None: free.
    pub constraint: Option<Constraint>,
}

impl Request {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt,
            sampling: Sampling::default(),
            max_tokens,
            stop: vec![],
            include_stop_str: false,
            stop_token_ids: vec![],
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            return_logits: false,
            arrival: Instant::now(),
            constraint: None,
        }
    }
}

/// A generated token's log-probability (of the raw logits, before temperature and
/// truncation, as vLLM and other OpenAI-compatible servers report them) and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// (id, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id, a stop id or a stop string.
    Stop,
    /// `max_tokens`, or the model's context is full.
    Length,
    /// Aborted (client gone, or the server shutting down).
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What ended the output when it was stopped by a stop string or stop id (vLLM's
/// `stop_reason`; None for an end-of-sequence id or a length finish).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    Text(String),
    Token(u32),
}

/// An event on a request's channel. `Output`s come in order; exactly one `Finished` or
/// `Failed` ends the stream.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New output: text that is final (whole UTF-8 characters, stop strings held back until
    /// they are ruled out) and the tokens generated since the last event.
    /// `logits` holds the tokens' logits rows only when the request asked for them.
    Output { text: String, tokens: Vec<u32>, logprobs: Vec<TokenLogprob>, logits: Vec<f32> },
    /// `cached_tokens`: prompt tokens found in the prefix cache at admission (not computed).
    Finished { reason: FinishReason, stop_reason: Option<StopReason>, prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize },
    /// The engine failed (a GPU fault): the request is lost; the message names the op.
    Failed(String),
}
