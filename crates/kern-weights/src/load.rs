//! Filling a manifest's weights from a checkpoint: [`check`] before anything is allocated,
//! [`materialize`] for one buffer into host memory, and [`LoadPlan::stream`] for every weight
//! in bounded chunks (the runtime copies each chunk to the GPU as it comes).

use crate::checkpoint::Checkpoint;
use crate::convert::{convert_source, Source};
use crate::error::{Result, WeightsError};
use crate::resolve::{resolve_rank, Resolved};
use kern_manifest::{Buffer, BufferId, Manifest, Role, WeightSource};

/// The default size of one streamed chunk: large enough that per-copy overheads vanish, small
/// enough that a staging buffer of this size is nothing next to the weights.
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// How many missing tensors get similar-name suggestions in one [`check`]: past a handful, the
/// checkpoint is most likely for another naming scheme, and the search costs time.
const SUGGEST_FOR: usize = 8;

/// The weight `buffer` shares memory with, when it is an alias (tied embeddings): the runtime
/// points it at that buffer's memory and loads nothing for it.
pub fn alias_of(buffer: &Buffer) -> Option<BufferId> {
    match buffer.source {
        Some(WeightSource::Alias(target)) => Some(target),
        _ => None,
    }
}

/// Whether `buffer` is filled from the checkpoint: a weight that is not an alias.
pub fn is_loaded(buffer: &Buffer) -> bool {
    buffer.role == Role::Weight && alias_of(buffer).is_none()
}

/// Every problem between the manifest's weights and the checkpoint (missing, misshaped and
/// wrongly typed tensors, concatenations that do not add up), in manifest order. Empty when
/// every weight can be loaded. Run it before allocating device memory.
/// Shard sources take rank 0's slice ([`check_rank`] for another rank).
pub fn check(ckpt: &Checkpoint, buffers: &[Buffer]) -> Vec<WeightsError> {
    check_rank(ckpt, buffers, 0)
}

/// [`check`] for tensor-parallel rank `rank` (issue 17): shard sources take that rank's slice,
/// and a tensor that does not divide into its parts is a problem.
pub fn check_rank(ckpt: &Checkpoint, buffers: &[Buffer], rank: u32) -> Vec<WeightsError> {
    let mut problems = vec![];
    let mut unknown = 0;
    for b in buffers.iter().filter(|b| is_loaded(b)) {
        if let Err(mut p) = resolve_rank(ckpt, b, rank, unknown < SUGGEST_FOR) {
            unknown += p
                .iter()
                .filter(|e| matches!(e, WeightsError::UnknownTensor { .. }))
                .count();
            problems.append(&mut p);
        }
    }
    problems
}

/// Checkpoint tensors that no weight of `buffers` reads (often harmless, such as rotary
/// caches; many of them suggest a manifest for another model). Sorted.
pub fn unused_tensors<'c>(ckpt: &'c Checkpoint, buffers: &[Buffer]) -> Vec<&'c str> {
    let mut used = std::collections::HashSet::new();
    for b in buffers.iter().filter(|b| is_loaded(b)) {
        match &b.source {
            None => {
                used.insert(b.name.as_str());
            }
            Some(s) => used.extend(tensor_names(s)),
        }
    }
    ckpt.names()
        .into_iter()
        .filter(|n| !used.contains(n))
        .collect()
}

/// The checkpoint tensors a source reads.
fn tensor_names(s: &WeightSource) -> Vec<&str> {
    match s {
        WeightSource::Tensor(t) => vec![t.as_str()],
        WeightSource::Concat { tensors, .. } => tensors.iter().map(String::as_str).collect(),
        WeightSource::Alias(_) | WeightSource::Values(_) => vec![],
        WeightSource::Shard { of, .. } => tensor_names(of),
    }
}

/// Fills `out` (exactly the buffer's size) with weight `buffer`: its checkpoint tensor, or its
/// tensors concatenated, converted to the buffer's dtype. Converts straight into `out`, with no
/// other copy of the tensor. Shard sources take rank 0's slice ([`materialize_rank`]).
pub fn materialize(ckpt: &Checkpoint, buffer: &Buffer, out: &mut [u8]) -> Result<()> {
    materialize_rank(ckpt, buffer, 0, out)
}

/// [`materialize`] for tensor-parallel rank `rank`: a shard source takes that rank's slice.
pub fn materialize_rank(ckpt: &Checkpoint, buffer: &Buffer, rank: u32, out: &mut [u8]) -> Result<()> {
    let r = resolve_rank(ckpt, buffer, rank, true).map_err(|p| one_or_all(ckpt, p))?;
    if out.len() as u64 != r.bytes {
        return Err(WeightsError::Buffer {
            buffer: buffer.name.clone(),
            message: format!(
                "the output slice is {} bytes, the buffer {}",
                out.len(),
                r.bytes
            ),
        });
    }
    let mut at = 0;
    for (src, from) in r.segments() {
        let n = src.len() / from.unit_bytes() * from.unit_elems() * r.dtype.size() as usize;
        convert_source(src, from, &mut out[at..at + n], r.dtype);
        at += n;
    }
    debug_assert_eq!(at, out.len());
    Ok(())
}

fn one_or_all(ckpt: &Checkpoint, mut problems: Vec<WeightsError>) -> WeightsError {
    if problems.len() == 1 {
        problems.pop().expect("one")
    } else {
        WeightsError::Problems {
            checkpoint: ckpt.path().to_path_buf(),
            problems,
        }
    }
}

/// A piece of one weight's bytes, in the buffer's dtype.
#[derive(Clone, Copy, Debug)]
pub struct Chunk<'a> {
    pub buffer: BufferId,
    /// Where the bytes go, from the start of the buffer.
    pub offset: u64,
    /// Either straight from the memory-mapped file or from a staging buffer (converted or
    /// gathered); valid only during the call.
    pub bytes: &'a [u8],
}

/// How far loading is, after each chunk.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub done: u64,
    pub total: u64,
    /// The buffer the last chunk belonged to.
    pub buffer: &'a str,
}

/// Every weight of a manifest matched with a checkpoint, checked, ready to stream.
#[derive(Debug)]
pub struct LoadPlan<'c> {
    buffers: &'c [Buffer],
    items: Vec<(BufferId, Resolved<'c>)>,
    total: u64,
    chunk_bytes: usize,
}

impl<'c> LoadPlan<'c> {
    /// Checks every weight of `buffers` (a manifest's, in declaration order; aliases are
    /// skipped) against `ckpt`. Fails with [`WeightsError::Problems`] listing every problem.
    pub fn new(ckpt: &'c Checkpoint, buffers: &'c [Buffer]) -> Result<LoadPlan<'c>> {
        Self::for_rank(ckpt, buffers, 0)
    }

    /// [`LoadPlan::new`] for tensor-parallel rank `rank` (issue 17): shard sources take that
    /// rank's slice. `new` is rank 0.
    pub fn for_rank(ckpt: &'c Checkpoint, buffers: &'c [Buffer], rank: u32) -> Result<LoadPlan<'c>> {
        let problems = check_rank(ckpt, buffers, rank);
        if !problems.is_empty() {
            return Err(WeightsError::Problems {
                checkpoint: ckpt.path().to_path_buf(),
                problems,
            });
        }
        let mut items = vec![];
        for (i, b) in buffers.iter().enumerate().filter(|(_, b)| is_loaded(b)) {
            let r = resolve_rank(ckpt, b, rank, false).map_err(|p| one_or_all(ckpt, p))?;
            items.push((BufferId(i), r));
        }
        let total = items.iter().map(|(_, r)| r.bytes).sum();
        Ok(LoadPlan {
            buffers,
            items,
            total,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        })
    }

    /// [`LoadPlan::new`] over a checked manifest's buffers.
    pub fn for_manifest(ckpt: &'c Checkpoint, manifest: &'c Manifest) -> Result<LoadPlan<'c>> {
        Self::new(ckpt, &manifest.buffers)
    }

    /// Sets the largest chunk [`LoadPlan::stream`] hands over (at least 8 bytes; an element
    /// larger than a chunk, such as a 144-byte `q4_k` block, is handed over in pieces).
    pub fn with_chunk_bytes(mut self, n: usize) -> Self {
        self.chunk_bytes = n.max(8);
        self
    }

    /// Bytes all loaded weights take (aliases count once, at their target).
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// The buffers that are loaded, in manifest order, with their sizes in bytes.
    pub fn buffers(&self) -> impl Iterator<Item = (BufferId, u64)> + '_ {
        self.items.iter().map(|(id, r)| (*id, r.bytes))
    }

    /// Alias buffers and the buffer whose memory each shares.
    pub fn aliases(&self) -> impl Iterator<Item = (BufferId, BufferId)> + '_ {
        self.buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.role == Role::Weight)
            .filter_map(|(i, b)| alias_of(b).map(|t| (BufferId(i), t)))
    }

    /// Hands every loaded weight to `sink` in chunks of at most the chunk size, buffer after
    /// buffer in manifest order, each buffer's chunks in increasing offset and covering it
    /// exactly once; calls `progress` after each chunk. A tensor that needs no conversion is
    /// handed over from the mapped file without a copy; conversion and interleaving go through
    /// one staging buffer of the chunk size. The first error from `sink` stops the stream.
    pub fn stream<E: From<WeightsError>>(
        &self,
        mut sink: impl FnMut(Chunk<'_>) -> Result<(), E>,
        mut progress: impl FnMut(Progress<'_>),
    ) -> Result<(), E> {
        let cap = self.chunk_bytes;
        // Slices at least this long go straight from the file; shorter ones are gathered, so
        // an interleaved concatenation does not become thousands of tiny copies.
        let direct = (cap / 4).max(1);
        let mut staging: Vec<u8> = Vec::with_capacity(cap);
        let mut done = 0u64;
        for (id, r) in &self.items {
            let name = self.buffers[id.0].name.as_str();
            let mut emitted = 0u64;
            let mut emit = |bytes: &[u8], emitted: &mut u64| -> Result<(), E> {
                sink(Chunk {
                    buffer: *id,
                    offset: *emitted,
                    bytes,
                })?;
                *emitted += bytes.len() as u64;
                done += bytes.len() as u64;
                progress(Progress {
                    done,
                    total: self.total,
                    buffer: name,
                });
                Ok(())
            };
            let out_size = r.dtype.size() as usize;
            for (src, from) in r.segments() {
                if from == Source::Plain(r.dtype) && src.len() >= direct {
                    if !staging.is_empty() {
                        emit(&staging, &mut emitted)?;
                        staging.clear();
                    }
                    for piece in src.chunks(cap) {
                        emit(piece, &mut emitted)?;
                    }
                    continue;
                }
                // Units (elements, or ggml blocks) convert whole.
                let (in_size, unit_out) = (from.unit_bytes(), from.unit_elems() * out_size);
                let mut rest = src;
                while !rest.is_empty() {
                    let room = (cap - staging.len()) / unit_out;
                    if room == 0 && staging.is_empty() {
                        // One unit is larger than a chunk (a tiny chunk size): convert it on
                        // its own and hand it over in pieces.
                        let mut one = vec![0u8; unit_out];
                        convert_source(&rest[..in_size], from, &mut one, r.dtype);
                        for piece in one.chunks(cap) {
                            emit(piece, &mut emitted)?;
                        }
                        rest = &rest[in_size..];
                        continue;
                    }
                    if room == 0 {
                        emit(&staging, &mut emitted)?;
                        staging.clear();
                        continue;
                    }
                    let n = room.min(rest.len() / in_size);
                    let at = staging.len();
                    staging.resize(at + n * unit_out, 0);
                    convert_source(&rest[..n * in_size], from, &mut staging[at..], r.dtype);
                    rest = &rest[n * in_size..];
                }
            }
            if !staging.is_empty() {
                emit(&staging, &mut emitted)?;
                staging.clear();
            }
            if emitted != r.bytes {
                return Err(E::from(WeightsError::Buffer {
                    buffer: name.to_string(),
                    message: format!("kern bug: streamed {emitted} bytes of {}", r.bytes),
                }));
            }
        }
        Ok(())
    }
}
