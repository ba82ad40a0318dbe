//! Checkpoint reading for kern: safetensors and GGUF files shaped into the weights a manifest
//! declares.
//!
//! A manifest says, for each weight buffer, where its contents come from (`from`): one
//! checkpoint tensor (by default the one named like the buffer), several concatenated along an
//! axis (a fused QKV or gate-up weight), or another weight's memory (tied embeddings). This
//! crate holds no model knowledge: it does what those declarations say and nothing else.
//!
//! 1. [`Checkpoint::open`] maps a single `model.safetensors`, or the shards a
//!    `model.safetensors.index.json` names, and reads only the headers (validated by the
//!    `safetensors` crate: offsets inside the file, sizes matching shapes).
//! 2. [`check`] lists every mismatch between the manifest's weights and the checkpoint at once
//!    (missing tensors with similar names, shapes, dtypes, concatenations), before the runtime
//!    allocates anything.
//! 3. [`LoadPlan::stream`] hands every weight over in bounded chunks, in manifest order, with
//!    the total known up front for a progress bar; [`materialize`] fills one buffer in host
//!    memory. bf16, f16, f32 and f64 convert into each other (round to nearest even) when the
//!    checkpoint's dtype is not the manifest's; other dtypes must match exactly.
//!
//! A shard source (issue 17, tensor parallelism) takes one rank's slice of a tensor, or of
//! every tensor of a concatenation: cut along a dimension into equal parts ([`check_rank`],
//! [`materialize_rank`], [`LoadPlan::for_rank`]; the plain functions are rank 0). A tensor
//! whose extent does not divide into the parts is an error naming it, its extent and the parts.
//!
//! Aliases are never loaded: [`alias_of`] says which buffer's memory an alias shares.
//!
//! GGUF ([`gguf`]): one `.gguf` file (or a directory holding exactly one) opens like a
//! safetensors checkpoint. Its tensors are shown outermost dimension first (GGUF's dims
//! reversed); plain types (F32, F16, BF16, integers) behave like safetensors dtypes, and block
//! types are dequantized into float buffers by [`dequant`] — bit-exact with the `gguf` Python
//! package, on every core — wherever a tensor source reads them (tensor and concat alike).
//!
//! Quantized weights as they are (issue 25): a buffer of a GGUF block dtype (`q4_k`, …, whose
//! element is one block) takes a GGUF tensor of exactly that type, its bytes unchanged. Its
//! shape counts blocks in the last dimension: a tensor of `[N, K]` values is `[N, K / 256]` for
//! `q4_k`. Concatenations and shards work in those elements (whole rows along axis 0, whole
//! blocks along the last axis). A tensor of another type is an error naming both types. A pack
//! learns a tensor's type from [`TensorView::ggml`] (`ckpt.tensor(name)?.ggml`), maps it with
//! [`gguf::GgmlType::block_dtype`] / [`gguf::GgmlType::dtype`] (and back with
//! [`gguf::GgmlType::for_dtype`]), and gets the buffer to declare from
//! [`TensorView::native_dtype`] and [`TensorView::native_shape`]. FP8 safetensors (`F8_E4M3`
//! weights and their `F32` `weight_scale_inv`) load into `f8e4m3` / `f32` buffers unchanged,
//! like every dtype that is not converted.

mod checkpoint;
pub mod convert;
pub mod dequant;
pub mod gguf;
pub mod gguf_write;
mod error;
mod load;
mod resolve;
mod suggest;

pub use checkpoint::{Checkpoint, TensorView, INDEX_FILE, SINGLE_FILE};
pub use error::{Result, WeightsError};
pub use load::{
    alias_of, check, check_rank, is_loaded, materialize, materialize_rank, unused_tensors, Chunk,
    LoadPlan, Progress,
    DEFAULT_CHUNK_BYTES,
};
