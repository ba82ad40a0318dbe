//! The one error type of this crate. Messages are written for the person running
//! `kern dump`: they say what failed and what to change, and include their cause (which is
//! therefore not also a `source`, so that it is printed once).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("no command given: usage is `kern dump --out DIR -- CMD ARGS...`")]
    EmptyCommand,

    #[error("`{program}`: command not found (searched PATH)")]
    CommandNotFound { program: String },

    #[error("`{program}`: no such file")]
    NoSuchFile { program: String },

    #[error("`{program}`: not executable ({reason})")]
    NotExecutable { program: String, reason: String },

    #[error("`{program}`: could not start it: {cause}")]
    Spawn {
        program: String,
        cause: std::io::Error,
    },

    #[error("output directory {path} is not writable: {cause}")]
    OutDirNotWritable {
        path: PathBuf,
        cause: std::io::Error,
    },

    #[error(
        "output directory {path} already holds a dump ({file}); choose another --out or remove it"
    )]
    OutDirNotEmpty { path: PathBuf, file: String },

    #[error(
        "injection library {name} not found; looked in: {looked}. Build it with \
         `cargo build --release -p kern-inject` (it lands next to the `kern` binary) or set \
         KERN_INJECT_LIB=/path/to/{name}",
        looked = display_paths(looked)
    )]
    InjectLibMissing { name: String, looked: Vec<PathBuf> },

    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },

    #[error(
        "{dir}: no trace files (trace.<pid>.jsonl): was the program run under `kern dump`, and \
         did it initialize CUDA?"
    )]
    NoTraces { dir: PathBuf },
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "(nowhere)".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub type Result<T, E = DumpError> = std::result::Result<T, E>;
