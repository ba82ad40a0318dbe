//! `kern dump`: capture which modules an unmodified CUDA program loads and which kernels it
//! launches, and read the capture back.
//!
//! The capture itself happens inside the traced program, in the `kern-inject` cdylib that the
//! CUDA driver loads through `CUDA_INJECTION64_PATH`. This crate is everything around it:
//!
//! * [`format`](mod@format): the trace records (one JSON object per line), shared with `kern-inject`;
//!   documented for other readers in `TRACE.md`;
//! * [`fastjson`]: the launch record's writer for the hot path;
//! * [`image`]: hash, kind and function symbols of a module image;
//! * [`reader`]: reading a dump directory back;
//! * [`summary`](mod@summary): `kern dump summary DIR`;
//! * [`run`](mod@run): `kern dump --out DIR -- CMD ARGS...`, the launcher.
//!
//! A dump directory holds `trace.<pid>.jsonl` per traced process and `modules/<sha256>.<ext>`
//! per distinct module image.

pub mod error;
pub mod fastjson;
pub mod format;
pub mod image;
pub mod reader;
pub mod run;
pub mod summary;

pub use error::{DumpError, Result};
pub use reader::{read_dump, Dump, ProcessTrace};
pub use run::{find_inject_lib, run, RunOptions, RunOutcome};
pub use summary::{summarize, summary, Summary, DEFAULT_TOP};
