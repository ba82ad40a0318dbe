//! The GGUF tests' writer: `kern_weights::gguf_write`, under the short names they use.
#![allow(dead_code)]

pub use kern_weights::gguf_write::Writer as W;

/// Appends a GGUF string (u64 length, bytes) to `out`.
pub fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&kern_weights::gguf_write::string(v));
}
