//! kern-engine: the serving loop. A request queue, the step loop on its own thread (scheduler →
//! step inputs → program → sampled ids → text), abort, drain, metrics.
//!
//! GPU-free at its boundary: the loop drives a [`Model`]. [`gpu::GpuModel`] runs a manifest's
//! program through `kern-runtime` (the only other implementation); [`fake::FakeModel`] is a
//! deterministic CPU model with a real paged KV store, which the engine's and the server's
//! tests run on. Clients (`kern generate`, `kern serve`) only submit [`Request`]s and read
//! [`Event`]s. A request may carry a [`constraint::Constraint`] (a compiled grammar its output
//! must follow: JSON Schema, regex, choice, Lark), applied as a token mask before sampling.

pub mod bench;
pub mod constraint;
mod engine;
mod mask_phase;
pub mod fake;
pub mod gpu;
pub mod profile;
mod metrics;
mod model;
mod output;
mod request;
pub mod sample;
mod step_loop;

pub use engine::{Engine, EngineConfig, EngineInfo, Phase, Phases, RequestHandle, State, StepRecord, SubmitError};
pub use metrics::Metrics;
pub use model::{Model, ModelError, ModelInfo, StepOutput};
pub use request::{Event, FinishReason, Request, RequestId, Sampling, StopReason, TokenLogprob};
