//! kern-runtime: from a checked manifest to kernels running on the GPU.
//!
//! * [`plan`] (pure, no GPU): where every buffer lives in one arena, sized at the vars'
//!   maxima, and how a memory budget is split between state pools ([`plan::MemoryPlan`]).
//! * [`exec`]: the [`Runtime`] loads each module once, resolves every entry, cross-checks
//!   each kernel's parameter layout with the driver, prepares every launch's parameter bytes
//!   and runs programs eagerly or as CUDA graphs replayed per var bucket.
//! * [`npy`] and [`data`]: host-side arrays — `.npy` files, dtype conversion, generated inputs.
//!
//! The runtime never calls the driver itself: everything GPU goes through `kern-cuda`.

pub mod data;
pub mod error;
pub mod exec;
pub mod npy;
pub mod plan;

pub use error::{Result, RuntimeError};
pub use exec::{Mode, RunStats, Runtime};
pub use plan::{MemoryPlan, PlanOptions};
