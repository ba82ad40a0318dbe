//! kern-runtime: from a checked manifest to kernels running on the GPU.
//!
//! * [`plan`] (pure, no GPU): where every buffer lives in one arena, sized at the vars'
//!   maxima, and how a memory budget is split between state pools ([`plan::MemoryPlan`]).
//! * [`exec`]: the [`Runtime`] loads each module once, resolves every entry, cross-checks
//!   each kernel's parameter layout with the driver, prepares every launch's parameter bytes
//!   and runs programs eagerly or as CUDA graphs replayed per var bucket.
//! * [`parallel`]: tensor parallelism — one [`Runtime`] per local GPU with its NCCL
//!   communicator, step inputs broadcast, ranks run side by side, collectives captured in
//!   each rank's CUDA graphs (issue 17).
//! * [`staging`] (issue 15): the page-locked staging behind [`Runtime::upload`] and
//!   [`Runtime::read_into`], a step's non-blocking input copies and its one readback.
//! * [`npy`] and [`data`]: host-side arrays — `.npy` files, dtype conversion, generated inputs.
//!
//! The runtime never calls the driver itself: everything GPU goes through `kern-cuda`.

pub mod data;
pub mod error;
pub mod exec;
pub mod npy;
pub mod parallel;
pub mod plan;
pub mod staging;

pub use error::{Result, RuntimeError};
pub use exec::{Mode, RunStats, Runtime};
pub use parallel::{ParallelRuntime, RankSetup};
pub use plan::{MemoryPlan, PlanOptions};
