//! The one error type of kern-weights. Every message names the file or the manifest buffer it
//! is about, and what to change.

use std::path::PathBuf;

/// Why a checkpoint could not be read, or did not fit a manifest buffer.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file or directory could not be opened, listed or mapped.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },

    /// No checkpoint where one was asked for.
    #[error("{}: {message}", path.display())]
    NotFound { path: PathBuf, message: String },

    /// A safetensors file whose header or layout is broken (corrupt, truncated, offsets out of
    /// bounds).
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    BadFile { path: PathBuf, message: String },

    /// A GGUF file whose header, metadata or tensor infos are broken, at byte `offset`.
    #[error("{}: not a valid GGUF file: at byte {offset}: {message}", path.display())]
    BadGguf { path: PathBuf, offset: u64, message: String },

    /// A GGUF tensor of a block type kern does not dequantize.
    #[error("buffers.{buffer}: checkpoint tensor `{tensor}` is {got}, which kern cannot dequantize (it dequantizes {}): use a GGUF quantized to one of those ({})", crate::dequant::DEQUANTIZED.join(", "), file.display())]
    Quant {
        buffer: String,
        tensor: String,
        got: &'static str,
        file: PathBuf,
    },

    /// `model.safetensors.index.json` is broken, or disagrees with its shards.
    #[error("{}: {message}", path.display())]
    BadIndex { path: PathBuf, message: String },

    /// Two files of one checkpoint hold a tensor of the same name.
    #[error("tensor `{name}` is in both {} and {}: a checkpoint holds each tensor once", first.display(), second.display())]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },

    /// A tensor the manifest asks for is not in the checkpoint.
    #[error("{}checkpoint {} has no tensor `{name}`{}", context(.buffer), checkpoint.display(), suggest(.suggestions))]
    UnknownTensor {
        /// The manifest buffer that asked, when one did.
        buffer: Option<String>,
        name: String,
        checkpoint: PathBuf,
        /// Up to five names of the checkpoint that look alike.
        suggestions: Vec<String>,
    },

    /// The checkpoint tensor's shape is not the one the manifest declares.
    #[error("buffers.{buffer}: checkpoint tensor `{tensor}` has shape {}, the manifest declares {} ({})", dims(.got), dims(.want), file.display())]
    Shape {
        buffer: String,
        tensor: String,
        got: Vec<u64>,
        want: Vec<u64>,
        file: PathBuf,
    },

    /// A GGUF block tensor whose shape is not the block buffer's (issue 25); the message
    /// names the tensor's shape in values and in blocks, the block size and the declared shape.
    #[error("buffers.{buffer}: {message}")]
    BlockShape { buffer: String, message: String },

    /// A block buffer (`q4_k`, …) whose tensor is not a GGUF tensor of that block type: blocks
    /// load only as they are, never converted or quantized.
    #[error("buffers.{buffer}: checkpoint tensor `{tensor}` is {got}; the manifest declares {want}, which takes a GGUF {} tensor's blocks as they are: {} ({})", want.ggml_name().unwrap_or("block"), block_fix(.got, *.want, *.gguf), file.display())]
    BlockType {
        buffer: String,
        tensor: String,
        /// The type as the file names it (`Q6_K`, `BF16`, ...).
        got: String,
        want: kern_manifest::DType,
        /// Whether the tensor is from a GGUF file.
        gguf: bool,
        file: PathBuf,
    },

    /// The tensors of a concatenation do not add up to the buffer.
    #[error("buffers.{buffer}: {message}")]
    Concat { buffer: String, message: String },

    /// A shard (one rank's slice, issue 17) does not fit: the tensor does not divide into the
    /// parts, or a slice is not the buffer's shape.
    #[error("buffers.{buffer}: {message}")]
    Shard { buffer: String, message: String },

    /// The checkpoint tensor's dtype cannot be turned into the buffer's.
    #[error("buffers.{buffer}: checkpoint tensor `{tensor}` is {got}, the manifest declares {want}, and kern converts only between bf16, f16, f32 and f64 ({})", file.display())]
    DType {
        buffer: String,
        tensor: String,
        /// The dtype as the file names it (`BF16`, `I32`, `F8_E8M0`, ...).
        got: String,
        want: &'static str,
        file: PathBuf,
    },

    /// A buffer that cannot be loaded from a checkpoint (not a weight, a shape with vars, an
    /// alias, an output slice of the wrong size).
    #[error("buffers.{buffer}: {message}")]
    Buffer { buffer: String, message: String },

    /// Several problems, each on its own line (from [`crate::LoadPlan::new`]).
    #[error("{} between the manifest and checkpoint {}:\n{}", count(.problems.len()), checkpoint.display(), lines(.problems))]
    Problems {
        checkpoint: PathBuf,
        problems: Vec<WeightsError>,
    },
}

pub type Result<T, E = WeightsError> = std::result::Result<T, E>;

fn context(buffer: &Option<String>) -> String {
    buffer
        .as_ref()
        .map(|b| format!("buffers.{b}: "))
        .unwrap_or_default()
}

fn suggest(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        format!(" (similar names: {})", quoted.join(", "))
    }
}

/// What to do about a tensor of type `got` in a block buffer of `want`.
fn block_fix(got: &str, want: kern_manifest::DType, gguf: bool) -> String {
    let named = crate::gguf::GgmlType::by_name(got).filter(|_| gguf);
    match named.and_then(|t| t.block_dtype()) {
        Some(d) => format!("declare this weight `{d}` and give it to an op that takes `in buffer<{d}>` (a quantized file mixes types: each weight declares its own)"),
        None if gguf && named.is_some_and(|t| t.block_elems == 1) => format!("declare this weight {} (kern does not quantize at load)", named.and_then(|t| t.plain_dtype()).map_or("with a float dtype".to_string(), |d| format!("`{d}`"))),
        None if gguf => "declare this weight with a float dtype (bf16) to have it dequantized".to_string(),
        None => format!("a {want} buffer loads from a GGUF file only; declare this weight with the tensor's own dtype"),
    }
}

pub(crate) fn dims(d: &[u64]) -> String {
    let parts: Vec<String> = d.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn count(n: usize) -> String {
    if n == 1 {
        "1 problem".into()
    } else {
        format!("{n} problems")
    }
}

fn lines(problems: &[WeightsError]) -> String {
    let l: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
    l.join("\n")
}
