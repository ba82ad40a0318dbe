//! Matching one manifest weight buffer with the checkpoint tensors that fill it: shapes and
//! dtypes checked, and the buffer's bytes described as a sequence of source slices.

use crate::checkpoint::{block_shape, Checkpoint, TensorView};
use crate::convert::{convertible, is_float, Source};
use crate::error::{dims, WeightsError};
use kern_manifest::{Buffer, DType, Role, WeightSource};

/// A weight buffer whose sources were found and fit: the parts, concatenated along `axis`.
#[derive(Debug)]
pub(crate) struct Resolved<'c> {
    pub dtype: DType,
    /// The buffer's size in bytes.
    pub bytes: u64,
    parts: Vec<Part<'c>>,
    /// Elements before the axis (product of the outer dimensions) and after it.
    outer: u64,
    inner: u64,
    /// Whether parts are cut per outer index (a concatenation or a shard), not taken whole.
    sliced: bool,
}

#[derive(Debug)]
struct Part<'c> {
    view: TensorView<'c>,
    source: Source,
    /// Extent along the concatenation (or shard) axis, in the buffer.
    extent: u64,
    /// The tensor's own extent along that axis, and where this part's slice of it starts (a
    /// shard takes `extent` of `full` from `start`; otherwise `start` = 0, `full` = `extent`).
    full: u64,
    start: u64,
}

impl<'c> Resolved<'c> {
    /// The source slices whose elements, converted to [`Resolved::dtype`] and laid end to end,
    /// are the buffer's bytes in row-major order. Concatenating along axis 0 is one slice per
    /// part; along axis k, each part contributes one block per index of the outer k
    /// dimensions, interleaved.
    /// A shard takes, per outer index, its slice of the tensor's run along the axis.
    pub fn segments(&self) -> impl Iterator<Item = (&'c [u8], Source)> + '_ {
        let whole = !self.sliced;
        let outer = if whole { 1 } else { self.outer };
        (0..outer).flat_map(move |o| {
            self.parts.iter().map(move |p| {
                if whole {
                    return (p.view.data, p.source);
                }
                // resolve() checked that these are whole numbers of units inside the tensor.
                let block = p.source.bytes_for(p.extent * self.inner).expect("whole units") as usize;
                let start = p
                    .source
                    .bytes_for((o * p.full + p.start) * self.inner)
                    .expect("whole units") as usize;
                (&p.view.data[start..start + block], p.source)
            })
        })
    }
}

/// The buffer's constant shape, or why it has none.
pub(crate) fn constant_shape(b: &Buffer) -> Result<Vec<u64>, WeightsError> {
    b.shape
        .iter()
        .map(|e| match e.as_const() {
            Some(v) if v >= 0 => Ok(v as u64),
            _ => Err(WeightsError::Buffer {
                buffer: b.name.clone(),
                message: format!(
                    "dimension `{e}` is not a non-negative constant: a weight's shape uses no vars"
                ),
            }),
        })
        .collect()
}

/// Checks buffer `b` against the checkpoint; on failure, every problem found.
/// `suggest` = false leaves similar-name suggestions out of missing-tensor errors.
/// A shard source takes rank `rank`'s slice.
pub(crate) fn resolve_rank<'c>(
    ckpt: &'c Checkpoint,
    b: &'c Buffer,
    rank: u32,
    suggest: bool,
) -> Result<Resolved<'c>, Vec<WeightsError>> {
    let fail = |message: String| {
        vec![WeightsError::Buffer {
            buffer: b.name.clone(),
            message,
        }]
    };
    if b.role != Role::Weight {
        return Err(fail(format!(
            "the buffer's role is `{}`, not `weight`: nothing is loaded into it",
            b.role.name()
        )));
    }
    let shape = constant_shape(b).map_err(|e| vec![e])?;
    let bytes = shape
        .iter()
        .try_fold(b.dtype.size(), |acc, &d| acc.checked_mul(d))
        .filter(|&n| usize::try_from(n).is_ok());
    let Some(bytes) = bytes else {
        return Err(fail(format!(
            "shape {} of {} does not fit in memory",
            dims(&shape),
            b.dtype.name()
        )));
    };
    // The manifest's own bytes (kern-manifest checked their count and converted them to
    // the buffer's dtype): one plain part, nothing read from the checkpoint.
    if let Some(WeightSource::Values(data)) = &b.source {
        if data.len() as u64 != bytes {
            return Err(fail(format!("{} bytes of values for a buffer of {bytes} bytes", data.len())));
        }
        let view = TensorView {
            name: &b.name,
            file: ckpt.path(),
            dtype: Some(b.dtype),
            file_dtype: "manifest values",
            ggml: None,
            shape: &[],
            data,
        };
        return Ok(Resolved {
            dtype: b.dtype,
            bytes,
            parts: vec![Part { view, source: Source::Plain(b.dtype), extent: 1, full: 1, start: 0 }],
            outer: 1,
            inner: 1,
            sliced: false,
        });
    }
    let default;
    let source = match &b.source {
        Some(s) => s,
        None => {
            default = WeightSource::Tensor(b.name.clone());
            &default
        }
    };
    let shard_err = |message: String| WeightsError::Shard {
        buffer: b.name.clone(),
        message,
    };
    // (dim, parts, this rank's part)
    let (source, shard) = match source {
        WeightSource::Shard { of, shard } => {
            let part = shard.part_for(rank).map_err(|m| vec![shard_err(m)])?;
            (&**of, Some((shard.dim, shard.parts, part)))
        }
        s => (s, None),
    };
    let (names, axis, sizes): (&[String], usize, Option<&[u64]>) = match source {
        WeightSource::Shard { .. } => {
            return Err(fail("a shard of a shard: kern cuts a tensor or a concatenation once".into()))
        }
        WeightSource::Alias(_) => {
            return Err(fail(
                "the buffer is an alias: it shares another weight's memory, and nothing is loaded into it".into(),
            ))
        }
        WeightSource::Values(_) => unreachable!("handled above"),
        WeightSource::Tensor(name) => (std::slice::from_ref(name), shard.map_or(0, |s| s.0), None),
        WeightSource::Concat { tensors, axis, sizes } => (tensors, *axis, sizes.as_deref()),
    };
    let concat = matches!(source, WeightSource::Concat { .. });
    if let Some((dim, parts, _)) = shard {
        if dim >= shape.len() || dim != axis || parts == 0 {
            return Err(vec![shard_err(format!(
                "a shard along dimension {dim} in {parts} parts does not fit the shape {} (a concatenation is cut along its axis {axis})",
                dims(&shape)
            ))]);
        }
    }
    let concat_err = |message: String| WeightsError::Concat {
        buffer: b.name.clone(),
        message,
    };
    if concat && axis >= shape.len() {
        return Err(vec![concat_err(format!(
            "axis {axis} is not a dimension of the shape {}",
            dims(&shape)
        ))]);
    }
    if let Some(s) = sizes {
        if s.len() != names.len() {
            return Err(vec![concat_err(format!(
                "`sizes` has {} entries for {} tensors",
                s.len(),
                names.len()
            ))]);
        }
    }

    // Values per element: the block size for a block buffer, whose shapes count blocks.
    let block = b.dtype.block_elems();
    // A shape in the buffer's elements, with the values it stands for when they differ.
    let show = |s: &[u64]| {
        if block == 1 {
            return dims(s);
        }
        let mut v = s.to_vec();
        if let Some(last) = v.last_mut() {
            *last = last.saturating_mul(block);
        }
        format!("{} in blocks of {block} values ({} in values)", dims(s), dims(&v))
    };
    let mut problems = vec![];
    let mut parts = vec![];
    for (i, name) in names.iter().enumerate() {
        let view = match ckpt.tensor(name) {
            Ok(v) => v,
            Err(_) => {
                problems.push(ckpt.unknown(name, Some(&b.name), suggest));
                continue;
            }
        };
        let source = match (view.dtype, view.ggml) {
            // A block buffer (issue 25) takes a GGUF tensor of exactly its type, unchanged:
            // its elements are the file's blocks.
            _ if b.dtype.is_block() => match view.ggml {
                Some(t) if t.block_dtype() == Some(b.dtype) => Source::Plain(b.dtype),
                _ => {
                    problems.push(WeightsError::BlockType {
                        buffer: b.name.clone(),
                        tensor: name.clone(),
                        got: view.file_dtype.to_string(),
                        want: b.dtype,
                        gguf: view.ggml.is_some(),
                        file: view.file.to_path_buf(),
                    });
                    continue;
                }
            },
            // A GGUF tensor already in the buffer's dtype is copied; any other float GGUF type
            // (F16 and F32 too) goes through the dequantizer, bit-exact with gguf-py.
            (Some(d), Some(_)) if d == b.dtype => Source::Plain(d),
            (_, Some(t)) if t.dequantizable() && is_float(b.dtype) => Source::Blocks(t),
            (Some(d), _) if convertible(d, b.dtype) => Source::Plain(d),
            (None, Some(t)) if !t.dequantizable() => {
                problems.push(WeightsError::Quant {
                    buffer: b.name.clone(),
                    tensor: name.clone(),
                    got: t.name,
                    file: view.file.to_path_buf(),
                });
                continue;
            }
            _ => {
                problems.push(WeightsError::DType {
                    buffer: b.name.clone(),
                    tensor: name.clone(),
                    got: view.file_dtype.to_string(),
                    want: b.dtype.name(),
                    file: view.file.to_path_buf(),
                });
                continue;
            }
        };
        // The tensor's shape in the buffer's elements: for a block buffer, the last dimension
        // counts blocks (GGUF rows are whole blocks; the reader refuses other files).
        let values = view.dims();
        let Some(got) = block_shape(&values, block) else {
            problems.push(WeightsError::Buffer {
                buffer: b.name.clone(),
                message: format!(
                    "checkpoint tensor `{name}` has shape {}, whose rows are not whole {} blocks of {block} values",
                    dims(&values),
                    b.dtype
                ),
            });
            continue;
        };
        // A shard: the tensor's extent along the axis must divide into the parts; the slice
        // then stands for the tensor in the checks below.
        let mut cut = got.clone();
        let mut slice = (0, got.get(axis).copied().unwrap_or(1));
        if let Some((dim, parts, part)) = shard {
            let Some(&full) = got.get(dim) else {
                problems.push(shard_err(format!(
                    "checkpoint tensor `{name}` has shape {}, with no dimension {dim} to cut",
                    dims(&got)
                )));
                continue;
            };
            if full % parts != 0 {
                let long = if block > 1 && dim + 1 == got.len() {
                    format!("{full} blocks of {block} values ({}) long", b.dtype)
                } else {
                    format!("{full} long")
                };
                problems.push(shard_err(format!(
                    "checkpoint tensor `{name}` is {long} along dimension {dim}, which does not divide into {parts} parts: change `parts` (a divisor of {full}) or the tensor-parallel size"
                )));
                continue;
            }
            cut[dim] = full / parts;
            slice = (part * cut[dim], full);
        }
        let got = cut;
        if !concat {
            if got != shape {
                if shard.is_some() {
                    problems.push(shard_err(format!(
                        "the slice of checkpoint tensor `{name}` has shape {}, the manifest declares {}",
                        show(&got),
                        dims(&shape)
                    )));
                    continue;
                }
                if block > 1 {
                    problems.push(WeightsError::BlockShape {
                        buffer: b.name.clone(),
                        message: format!(
                            "checkpoint tensor `{name}` is {} of shape {} in values, which is {} in blocks of {block} values; the manifest declares {} (a {} buffer counts its last dimension in blocks) ({})",
                            view.file_dtype,
                            dims(&values),
                            dims(&got),
                            dims(&shape),
                            b.dtype,
                            view.file.display()
                        ),
                    });
                    continue;
                }
                problems.push(WeightsError::Shape {
                    buffer: b.name.clone(),
                    tensor: name.clone(),
                    got,
                    want: shape.clone(),
                    file: view.file.to_path_buf(),
                });
                continue;
            }
        } else {
            let fits = got.len() == shape.len()
                && got
                    .iter()
                    .zip(&shape)
                    .enumerate()
                    .all(|(k, (g, w))| k == axis || g == w);
            if !fits {
                let want: Vec<String> = shape
                    .iter()
                    .enumerate()
                    .map(|(k, d)| if k == axis { "*".into() } else { d.to_string() })
                    .collect();
                problems.push(concat_err(format!(
                    "checkpoint tensor `{name}` has shape {}; to be concatenated along axis {axis} into {} it must have shape [{}]",
                    show(&got),
                    dims(&shape),
                    want.join(", ")
                )));
                continue;
            }
            if let Some(&want) = sizes.and_then(|s| s.get(i)) {
                if got[axis] != want {
                    problems.push(concat_err(format!(
                        "checkpoint tensor `{name}` is {} long along axis {axis}, and `sizes` says {want}",
                        got[axis]
                    )));
                    continue;
                }
            }
        }
        let sliced = concat || shard.is_some();
        let extent = if sliced { got[axis] } else { 1 };
        let (start, full) = if shard.is_some() { slice } else { (0, extent) };
        if sliced && (axis > 0 || start > 0) {
            // Each outer index takes `extent × inner` elements of this tensor from `start ×
            // inner` on: with blocks, those must be whole blocks.
            let inner: u64 = shape[axis + 1..].iter().product();
            if source.bytes_for(extent * inner).is_none() || source.bytes_for(start * inner).is_none() {
                problems.push(concat_err(format!(
                    "checkpoint tensor `{name}` is {} in blocks of {} elements, which a {} along axis {axis} would cut: {}",
                    view.file_dtype,
                    source.unit_elems(),
                    if shard.is_some() { "shard" } else { "concatenation" },
                    if shard.is_some() { "shard along another dimension, or load a checkpoint without blocks" } else { "concatenate along axis 0" }
                )));
                continue;
            }
        }
        parts.push(Part {
            view,
            source,
            extent,
            full,
            start,
        });
    }
    if problems.is_empty() && concat {
        let sum: u64 = parts.iter().map(|p| p.extent).sum();
        if sum != shape[axis] {
            let each: Vec<String> = parts.iter().map(|p| p.extent.to_string()).collect();
            problems.push(concat_err(format!(
                "the tensors add up to {sum} along axis {axis} ({}), the manifest declares {}",
                each.join(" + "),
                shape[axis]
            )));
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let outer = shape[..axis.min(shape.len())].iter().product();
    let inner = shape.get(axis + 1..).map_or(1, |s| s.iter().product());
    Ok(Resolved {
        dtype: b.dtype,
        bytes,
        sliced: parts.len() > 1 || shard.is_some(),
        parts,
        outer,
        inner,
    })
}
