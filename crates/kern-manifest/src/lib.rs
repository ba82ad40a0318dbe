//! The kern model manifest: schema v4 (seed `000` §7) and kern's documented extensions, and
//! `kern check`.
//!
//! A model is a JSON manifest of vars, states, buffers, modules (device binaries), ops
//! (kernels with typed signatures and launches) and programs (chains of op calls). This crate
//! reads one in three steps, and the runtime accepts only the result of the last:
//!
//! 1. [`json::parse`]: text → an order-preserving JSON tree (syntax errors with line:column;
//!    size and nesting bounded).
//! 2. `decode`: tree → [`raw::RawManifest`], one type per JSON object, reporting every unknown
//!    field (a typo) and type error with its JSON path.
//! 3. `check`: raw → [`Manifest`]: names resolved to indices, expressions parsed over declared
//!    vars, modules found, hashed and parsed with `kern-binary`, and every launch compared with
//!    its kernel's parameter layout and block limits.
//!
//! Every step collects all problems instead of stopping at the first: [`load`] returns either a
//! `Manifest` (with warnings) or [`Diagnostics`], one line per problem, `FILE: PATH: MESSAGE`.
//! The schema is documented in `docs/manifest.md`; [`json_schema`] generates
//! `schema/manifest.schema.json` from the raw types.

pub mod diag;
pub mod expr;
pub mod json;
pub mod manifest;
pub mod pack;
pub mod raw;
pub mod report;
pub mod source;
pub mod types;

mod check;
mod decode;
mod kernel;

pub use diag::{Diagnostic, Diagnostics, Severity};
pub use expr::{EvalError, Expr};
pub use kern_binary::Arch;
pub use manifest::*;
pub use pack::{ArgValue, PackError};
pub use raw::{Collective, RawManifest, Role, SchemaVersion};
pub use report::CheckReport;
pub use types::{Access, DType, KernelParam, OpParam, Scalar, Value};

use std::io::Read;
use std::path::{Path, PathBuf};

/// The name of the program written as `program` (others live in `programs`).
pub const MAIN_PROGRAM: &str = "main";
/// The name of the rank (`0..tp`) in a weight shard's `part` expression (issue 17).
pub const RANK_VAR: &str = "rank";
/// Tokens per page of a per-token state when the manifest does not say (`page_tokens`).
pub const DEFAULT_PAGE_TOKENS: u32 = 16;
/// The largest manifest [`load`] reads by default.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// The largest module file [`load`] reads by default.
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 4 << 30;

/// How to check a manifest.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// The GPU architecture whose images are selected and checked (default `sm_90`).
    pub arch: Arch,
    /// Manifests larger than this are refused before parsing.
    pub max_manifest_bytes: u64,
    /// Module files larger than this are refused before hashing.
    pub max_module_bytes: u64,
    /// The Hugging Face hub cache for `hf:` sources; `None` reads `HF_HUB_CACHE`, `HF_HOME`,
    /// or `~/.cache/huggingface/hub` (see [`source::hf_cache_dir`]).
    pub hf_cache: Option<PathBuf>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            arch: Arch::new(90),
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            hf_cache: None,
        }
    }
}

/// Reads, parses and checks the manifest at `path`, loading its modules. On success the
/// manifest carries its warnings; on failure every error and warning found is returned.
pub fn load(path: &Path, opts: &CheckOptions) -> Result<Manifest, Diagnostics> {
    let file = path.display().to_string();
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_file() && meta.len() > opts.max_manifest_bytes {
            return Err(too_big(file, meta.len(), opts.max_manifest_bytes));
        }
    }
    // Read at most one byte past the cap: a file that grows, or a device such as /dev/zero,
    // is refused without reading it whole.
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| {
        f.take(opts.max_manifest_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
    });
    if let Err(e) = read {
        return Err(Diagnostics::file_error(
            file,
            format!("cannot read the manifest: {e}"),
        ));
    }
    check_bytes(&bytes, path, opts)
}

fn too_big(file: String, len: u64, cap: u64) -> Diagnostics {
    Diagnostics::file_error(
        file,
        format!(
            "the manifest is {}, above kern's limit of {} for a manifest: is this the right file? (CheckOptions::max_manifest_bytes)",
            report::human_bytes(len),
            report::human_bytes(cap)
        ),
    )
}

/// Checks manifest text that claims to live at `path` (module sources resolve against its
/// directory; nothing is read from `path` itself).
pub fn check_bytes(
    bytes: &[u8],
    path: &Path,
    opts: &CheckOptions,
) -> Result<Manifest, Diagnostics> {
    let file = path.display().to_string();
    if bytes.len() as u64 > opts.max_manifest_bytes {
        return Err(too_big(file, bytes.len() as u64, opts.max_manifest_bytes));
    }
    let mut sink = diag::Sink::default();
    let (raw, broken) = match parse_into(bytes, &mut sink) {
        Some(d) => d,
        None => return Err(Diagnostics::new(file, sink.into_items())),
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let checked = check::check(&raw, &broken, path, &dir, opts, &mut sink);
    let items = sink.into_items();
    match checked {
        Some(mut m) if !items.iter().any(Diagnostic::is_error) => {
            m.warnings = Diagnostics::new(file, items).items;
            Ok(m)
        }
        _ => Err(Diagnostics::new(file, items)),
    }
}

/// Parses and decodes without checking references or loading modules: the manifest as
/// written, or every structural problem (syntax, unknown fields, wrong JSON types).
pub fn parse_raw(bytes: &[u8], file: &str) -> Result<RawManifest, Diagnostics> {
    let mut sink = diag::Sink::default();
    match parse_into(bytes, &mut sink) {
        Some((raw, _)) if sink.error_count() == 0 => Ok(raw),
        _ => Err(Diagnostics::new(file.to_string(), sink.into_items())),
    }
}

fn parse_into(bytes: &[u8], sink: &mut diag::Sink) -> Option<(RawManifest, decode::Broken)> {
    let doc = match json::parse(bytes) {
        Ok(d) => d,
        Err(e) => {
            sink.syntax(e.line, e.column, format!("not valid JSON: {}", e.message));
            return None;
        }
    };
    decode::decode(&doc, sink).map(|d| (d.raw, d.broken))
}

/// The JSON Schema of the manifest (draft 2020-12), generated from [`raw::RawManifest`]: the
/// content of `schema/manifest.schema.json`.
pub fn json_schema() -> String {
    let schema = schemars::schema_for!(raw::RawManifest);
    let mut value = serde_json::to_value(&schema).expect("a JSON Schema serializes");
    drop_null(&mut value);
    sort_keys(&mut value);
    let mut s = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
    s.push('\n');
    s
}

/// Sorts object keys, so the schema text does not depend on whether some crate in the build
/// enabled serde_json's `preserve_order`.
fn sort_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            let mut entries: Vec<(String, serde_json::Value)> = std::mem::take(m).into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (k, mut x) in entries {
                sort_keys(&mut x);
                m.insert(k, x);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

/// Optional fields come out of the derive as "T or null"; a manifest leaves them out instead
/// (kern reads `null` as a type error), so the schema says only T.
fn drop_null(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(types)) = m.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    m.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(any)) = m.get_mut("anyOf") {
                any.retain(|s| s.get("type").is_none_or(|t| t != "null"));
                if any.len() == 1 {
                    if let Some(Value::Object(only)) = any.pop() {
                        m.remove("anyOf");
                        for (k, val) in only {
                            m.entry(k).or_insert(val);
                        }
                    }
                }
            }
            m.values_mut().for_each(drop_null);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_null),
        _ => {}
    }
}
