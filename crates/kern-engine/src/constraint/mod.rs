//! Constrained decoding: a request's output made to follow a grammar — a JSON Schema, any JSON
//! object, a regular expression, a choice list or a Lark grammar — by a token mask applied to
//! the logits before sampling. Generic over models: the grammar is compiled against the
//! model's vocabulary (token bytes), never against a model family.
//!
//! - [`Grammar`] is what a client asks for; [`Grammars::compile`] turns it into a
//!   [`CompiledGrammar`] (llguidance's parser), on the caller's thread — off the step loop, so a
//!   request waits for its grammar and the batch never does — with a cache, a size limit and a
//!   time limit that fail that one request with a message naming the problem.
//! - [`Constraint`] travels in the engine `Request`: the compiled grammar and an optional gate
//!   (token ids after which the constraint starts, e.g. the end of a reasoning block).
//! - `seq` keeps each constrained sequence's matcher in the engine loop; its next mask is
//!   computed on worker threads as soon as its last token is committed, while the engine thread
//!   emits text and schedules the next step ([`MaskPool`]).
//! - [`TokenMask`] is what a step hands the model: one bitmask row per constrained step row and
//!   a row index per step row (-1: unconstrained, which costs the sampler nothing) — the step
//!   ABI's `token_mask` / `mask_rows` (docs/step-abi.md).

mod compile;
mod grammar;
mod mask;
pub(crate) mod seq;
mod vocab;

pub use compile::{CompiledGrammar, GrammarError, GrammarLimits, Grammars};
pub use grammar::{Grammar, JsonOptions, JSON_WHITESPACE};
pub use mask::{MaskPool, TokenMask};
pub use vocab::{token_bytes, KernTokEnv};

use std::sync::Arc;

/// A request's constraint: its compiled grammar, and when it starts.
#[derive(Clone)]
pub struct Constraint {
    pub grammar: Arc<CompiledGrammar>,
    /// The constraint starts after the output has produced these tokens (in a row): the output
    /// is free up to and including them (a reasoning block ending in `</think>`, say). Empty:
    /// from the first token.
    pub start_after: Vec<u32>,
    /// With `start_after`: a token that opens the free block when the output starts with it
    /// (`<think>`); the first token may then be it or anything the grammar allows, and in the
    /// latter case the constraint applies from there on (a model that did not reason).
    /// None: the output starts inside the block (the prompt opened it).
    pub opens_with: Option<u32>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("grammar", &self.grammar.describe()).field("start_after", &self.start_after).field("opens_with", &self.opens_with).finish()
    }
}
