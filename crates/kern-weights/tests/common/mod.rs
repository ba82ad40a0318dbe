//! What kern-weights' integration tests share: the GGUF writer (`kern_weights::gguf_write`, under
//! the short names the tests use) and a manifest weight buffer.
#![allow(dead_code, unused_imports)]

pub use kern_weights::gguf_write::Writer as W;

/// Appends a GGUF string (u64 length, bytes) to `out`.
pub fn s(out: &mut Vec<u8>, v: &str) {
    out.extend_from_slice(&kern_weights::gguf_write::string(v));
}

/// A weight buffer of the manifest: `name`, dtype, constant shape, where it comes from.
pub fn weight(name: &str, dtype: kern_manifest::DType, shape: &[i64], source: Option<kern_manifest::WeightSource>) -> kern_manifest::Buffer {
    kern_manifest::Buffer {
        name: name.into(),
        dtype,
        shape: shape.iter().map(|&d| kern_manifest::Expr::constant(d)).collect(),
        role: kern_manifest::Role::Weight,
        source,
        bytes_at_max: shape.iter().product::<i64>() as u64 * dtype.size(),
    }
}
