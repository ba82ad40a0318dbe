//! kern-sched: which tokens of which sequences go into the next step, and where their KV
//! lives. Pure and GPU-free: it produces host arrays in the layout of the step ABI
//! (`docs/step-abi.md`) and consumes the sampled ids; the runtime copies the arrays to the GPU.
//!
//! * [`BlockManager`]: the pool of KV pages shared by all sequences (page ids index every
//!   per-token state pool at once);
//! * [`Scheduler`]: continuous batching with chunked prefill — every running sequence's decode
//!   token first, then prompt chunks in arrival order, within the step's token and sequence
//!   budgets; pages allocated on demand, preemption by recompute when the pool runs dry;
//!   finished and aborted sequences free their pages at once;
//! * [`Step`]: one step's ABI arrays, padded to the bucket sizes with the ABI's padding rules.

mod blocks;
pub mod ngram;
mod scheduler;
mod step;

pub use blocks::{page_hash, BlockManager, CacheStats, PageError, PageHash};
pub use scheduler::{AddError, Drafter, Finish, Limits, SpecConfig, SpecStats, SamplingParams, Scheduler, SchedulerConfig, SeqId, SeqOutput};
pub use step::{Step, StepSeq};
