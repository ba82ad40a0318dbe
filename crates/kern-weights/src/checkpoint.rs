//! Opening a checkpoint: one safetensors file, the shards a `model.safetensors.index.json`
//! names, or one GGUF file. Files are memory-mapped and only their headers are read when
//! opening; tensor bytes are touched when a caller reads a [`TensorView`]'s data.

use crate::error::{Result, WeightsError};
use crate::gguf::{self, GgmlType, Gguf};
use crate::suggest::similar;
use kern_manifest::DType;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The file of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// An opened checkpoint: every tensor's name, dtype, shape and place, with the files mapped.
#[derive(Debug)]
pub struct Checkpoint {
    /// What was opened (a directory, an index file or a safetensors file).
    path: PathBuf,
    files: Vec<Shard>,
    tensors: HashMap<String, Entry>,
    /// The parsed header when the checkpoint is a GGUF file.
    gguf: Option<Gguf>,
    /// safetensors `__metadata__` entries (all shards merged).
    metadata: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    map: Mmap,
}

#[derive(Debug)]
struct Entry {
    shard: usize,
    kind: Kind,
    shape: Vec<usize>,
    /// Byte range of the data in the file.
    start: usize,
    end: usize,
}

/// A tensor's element type as its file states it.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Safetensors(Dtype),
    Gguf(GgmlType),
}

/// One tensor of a checkpoint, borrowed from its memory-mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    /// The file holding it.
    pub file: &'a Path,
    /// kern's name for the element type; `None` for a type kern has no dtype for (F4, F6,
    /// F8_E8M0, the FNUZ FP8 variants, C64).
    pub dtype: Option<DType>,
    /// The element type as the file writes it (`BF16`, `F32`, `I64`, `Q4_K`, ...).
    pub file_dtype: &'static str,
    /// The ggml type, for a tensor of a GGUF file: what a pack asks to choose a kernel
    /// (issue 25). Block types such as Q4_K have no [`TensorView::dtype`] (their shape counts
    /// values, not blocks): a buffer of the block dtype ([`GgmlType::block_dtype`],
    /// [`TensorView::native_dtype`]) takes their bytes unchanged, a float buffer gets them
    /// dequantized.
    pub ggml: Option<GgmlType>,
    /// Dimensions, outermost first.
    pub shape: &'a [usize],
    /// The row-major little-endian elements (for a block type: the blocks, row after row).
    /// Reading them pages the file in.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// The shape as `u64`s (as error messages and manifest shapes compare them).
    pub fn dims(&self) -> Vec<u64> {
        self.shape.iter().map(|&d| d as u64).collect()
    }

    /// The dtype of a buffer that takes this tensor's bytes unchanged: its plain dtype, or for
    /// a GGUF block type the block dtype (`Q4_K` → `q4_k`). `None` for a type kern has no
    /// dtype for.
    pub fn native_dtype(&self) -> Option<DType> {
        self.dtype.or_else(|| self.ggml.and_then(GgmlType::block_dtype))
    }

    /// The shape of that buffer: [`TensorView::dims`], with the last dimension counted in
    /// blocks for a block dtype (`[N, K]` values of Q4_K → `[N, K / 256]`). `None` when there
    /// is no [`TensorView::native_dtype`] or the last dimension is not whole blocks (a GGUF
    /// reader refuses such a file).
    pub fn native_shape(&self) -> Option<Vec<u64>> {
        block_shape(&self.dims(), self.native_dtype()?.block_elems())
    }
}

/// `values` (a shape in values) with its last dimension counted in blocks of `block` values,
/// when it divides; a shape without dimensions is one value.
pub(crate) fn block_shape(values: &[u64], block: u64) -> Option<Vec<u64>> {
    let mut s = values.to_vec();
    match s.last_mut() {
        Some(last) if last.is_multiple_of(block) => *last /= block,
        Some(_) => return None,
        None if block == 1 => {}
        None => return None,
    }
    Some(s)
}

impl Checkpoint {
    /// Opens a checkpoint: a directory holding `model.safetensors.index.json` (sharded) or
    /// `model.safetensors` or exactly one `*.safetensors` file, or else exactly one `*.gguf`
    /// file; or the path of an index file, of one safetensors file or of one GGUF file.
    /// Headers are parsed and checked (offsets inside the file, data sizes matching shapes, no
    /// tensor in two shards); no tensor data is read.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|source| WeightsError::Io {
            path: path.to_path_buf(),
            what: "cannot open the checkpoint",
            source,
        })?;
        if meta.is_dir() {
            let index = path.join(INDEX_FILE);
            if index.is_file() {
                return Self::open_index(path, &index);
            }
            let single = path.join(SINGLE_FILE);
            if single.is_file() {
                return Self::open_files(path, vec![single]);
            }
            let found = files_in(path, "safetensors")?;
            return match found.as_slice() {
                [one] => Self::open_files(path, vec![one.clone()]),
                [] => match files_in(path, "gguf")?.as_slice() {
                    [one] => Self::open_gguf(path, one),
                    [] => Err(WeightsError::NotFound {
                        path: path.to_path_buf(),
                        message: format!("no checkpoint here: expected {INDEX_FILE}, {SINGLE_FILE}, one *.safetensors file or one *.gguf file"),
                    }),
                    many => Err(WeightsError::NotFound {
                        path: path.to_path_buf(),
                        message: format!("{} *.gguf files: keep one model per directory, or open the file itself", many.len()),
                    }),
                },
                many => Err(WeightsError::NotFound {
                    path: path.to_path_buf(),
                    message: format!(
                        "{} *.safetensors files but no {INDEX_FILE} saying which tensor is where: add the index, or open one file",
                        many.len()
                    ),
                }),
            };
        }
        let is_index = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".index.json"));
        if is_index {
            return Self::open_index(path, path);
        }
        if path.extension().is_some_and(|x| x == "gguf") || starts_with_gguf_magic(path) {
            return Self::open_gguf(path, path);
        }
        Self::open_files(path, vec![path.to_path_buf()])
    }

    fn open_gguf(path: &Path, file: &Path) -> Result<Checkpoint> {
        let map = map_file(file)?;
        let header = gguf::parse(&map, file)?;
        if let Some(n) = header.get("split.count").and_then(gguf::Value::as_u64).filter(|&n| n > 1) {
            let no = header.get("split.no").and_then(gguf::Value::as_u64).unwrap_or(0);
            return Err(WeightsError::NotFound {
                path: file.to_path_buf(),
                message: format!(
                    "part {} of a GGUF split into {n} files: merge the parts into one file first (ggml's gguf-split tool: `gguf-split --merge FIRST-PART OUT.gguf`)",
                    no + 1
                ),
            });
        }
        let mut tensors = HashMap::with_capacity(header.tensors.len());
        for t in &header.tensors {
            // parse() checked that offset + bytes lies inside the file and that the element
            // count fits in u64; a shape that does not fit usize is refused here.
            let shape: Option<Vec<usize>> = t.shape().iter().map(|&d| usize::try_from(d).ok()).collect();
            let (Some(shape), Ok(start), Ok(bytes)) = (shape, usize::try_from(t.offset), usize::try_from(t.bytes)) else {
                return Err(WeightsError::BadGguf {
                    path: file.to_path_buf(),
                    offset: t.info_at,
                    message: format!("tensor `{}` is too large for this machine's address space", t.name),
                });
            };
            tensors.insert(
                t.name.clone(),
                Entry { shard: 0, kind: Kind::Gguf(t.ggml_type), shape, start, end: start + bytes },
            );
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            files: vec![Shard { path: file.to_path_buf(), map }],
            tensors,
            gguf: Some(header),
            metadata: BTreeMap::new(),
        })
    }

    fn open_index(path: &Path, index: &Path) -> Result<Checkpoint> {
        let bad = |message: String| WeightsError::BadIndex {
            path: index.to_path_buf(),
            message,
        };
        let text = std::fs::read(index).map_err(|source| WeightsError::Io {
            path: index.to_path_buf(),
            what: "cannot read the index",
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object (tensor name → shard file)".into()))?;
        let dir = match index.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        // Shard file → the tensors the index puts there, in a stable order.
        let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("weight_map.`{name}` is not a file name")))?;
            let rel = Path::new(file);
            if file.is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
                return Err(bad(format!(
                    "weight_map.`{name}` names `{file}`: shard files are plain names inside the checkpoint's directory"
                )));
            }
            shards.entry(file).or_default().push(name);
        }
        if shards.is_empty() {
            return Err(bad("`weight_map` is empty".into()));
        }
        let missing: Vec<String> = shards
            .iter()
            .filter(|(f, _)| !dir.join(f).is_file())
            .map(|(f, t)| {
                format!(
                    "`{f}` (for {} tensor{}, e.g. `{}`)",
                    t.len(),
                    if t.len() == 1 { "" } else { "s" },
                    t[0]
                )
            })
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!(
                "shard files named by the index are missing from {}: {}",
                dir.display(),
                missing.join(", ")
            )));
        }
        let files: Vec<PathBuf> = shards.keys().map(|f| dir.join(f)).collect();
        let ckpt = Self::open_files(path, files)?;
        // The index must agree with the headers: a disagreement means a mixed-up download.
        let mut wrong = vec![];
        for (file, names) in &shards {
            for name in names {
                match ckpt.tensors.get(*name) {
                    None => wrong.push(format!(
                        "it puts `{name}` in `{file}`, which has no such tensor"
                    )),
                    Some(e) if ckpt.files[e.shard].path != dir.join(file) => wrong.push(format!(
                        "it puts `{name}` in `{file}`, but the tensor is in {}",
                        ckpt.files[e.shard].path.display()
                    )),
                    Some(_) => {}
                }
            }
        }
        if let Some(first) = wrong.first() {
            let more = match wrong.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            return Err(bad(format!(
                "the index disagrees with its shards: {first}{more}"
            )));
        }
        Ok(ckpt)
    }

    fn open_files(path: &Path, paths: Vec<PathBuf>) -> Result<Checkpoint> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors: HashMap<String, Entry> = HashMap::new();
        let mut metadata = BTreeMap::new();
        for p in paths {
            let shard = files.len();
            let map = map_file(&p)?;
            let bad = |message: String| WeightsError::BadFile {
                path: p.clone(),
                message,
            };
            let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| bad(explain(e, &map)))?;
            let data_start = 8 + n;
            if let Some(m) = meta.metadata() {
                metadata.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                // read_metadata checked that the offsets tile the data section exactly; the
                // sums cannot overflow because the section lies inside the mapped file.
                let entry = Entry {
                    shard,
                    kind: Kind::Safetensors(info.dtype),
                    shape: info.shape.clone(),
                    start: data_start + s,
                    end: data_start + e,
                };
                if entry.end > map.len() {
                    return Err(bad(format!(
                        "tensor `{name}` runs past the end of the file"
                    )));
                }
                if let Some(prev) = tensors.get(&name) {
                    return Err(WeightsError::Duplicate {
                        name,
                        first: files_path(&files, prev.shard, &p),
                        second: p.clone(),
                    });
                }
                tensors.insert(name, entry);
            }
            files.push(Shard { path: p, map });
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            files,
            tensors,
            gguf: None,
            metadata,
        })
    }

    /// The GGUF header (metadata key/values, tensor infos) when this is a GGUF checkpoint.
    pub fn gguf(&self) -> Option<&Gguf> {
        self.gguf.as_ref()
    }

    /// The safetensors `__metadata__` string pairs (empty for GGUF: see [`Checkpoint::gguf`]).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// `"gguf"` or `"safetensors"`.
    pub fn format(&self) -> &'static str {
        if self.gguf.is_some() {
            "gguf"
        } else {
            "safetensors"
        }
    }

    /// What was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The safetensors files, in the order they were read.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|s| s.path.as_path())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, or an error naming the checkpoint and up to five similar names.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let Some((key, e)) = self.tensors.get_key_value(name) else {
            return Err(self.unknown(name, None, true));
        };
        let shard = &self.files[e.shard];
        let (dtype, file_dtype, ggml) = match e.kind {
            Kind::Safetensors(d) => (kern_dtype(d), dtype_name(d), None),
            Kind::Gguf(t) => (t.plain_dtype(), t.name, Some(t)),
        };
        Ok(TensorView {
            name: key,
            file: &shard.path,
            dtype,
            file_dtype,
            ggml,
            shape: &e.shape,
            data: &shard.map[e.start..e.end],
        })
    }

    /// Tensor `name`, all of it, in dtype `to` (little-endian): a float tensor converted with
    /// one round to nearest even, a GGUF block type dequantized (bit-exact with gguf-py when
    /// `to` is f32) or, when `to` is its block dtype (`q4_k` for Q4_K), its blocks as they are;
    /// other dtypes only as they are. For `kern extract` and tests; loading streams instead
    /// ([`crate::LoadPlan`]).
    pub fn read_as(&self, name: &str, to: DType) -> Result<Vec<u8>> {
        use crate::convert::{convert_source, convertible, is_float, Source};
        let v = self.tensor(name)?;
        let source = match (v.dtype, v.ggml) {
            (_, Some(t)) if to.is_block() && t.block_dtype() == Some(to) => Source::Plain(to),
            (Some(d), Some(_)) if d == to => Source::Plain(d),
            (_, Some(t)) if t.dequantizable() && is_float(to) => Source::Blocks(t),
            (Some(d), _) if convertible(d, to) => Source::Plain(d),
            _ => {
                return Err(WeightsError::NotFound {
                    path: v.file.to_path_buf(),
                    message: match v.ggml {
                        Some(t) if !t.dequantizable() => format!("tensor `{name}`: {}", crate::dequant::unsupported(t)),
                        _ => format!("tensor `{name}` is {} and cannot be converted to {}", v.file_dtype, to.name()),
                    },
                })
            }
        };
        let elems = v.data.len() / source.unit_bytes() * source.unit_elems();
        let mut out = vec![0u8; elems * to.size() as usize];
        convert_source(v.data, source, &mut out, to);
        Ok(out)
    }

    /// The error for a missing tensor; `suggest` = false skips the (quadratic) search for
    /// similar names.
    pub(crate) fn unknown(&self, name: &str, buffer: Option<&str>, suggest: bool) -> WeightsError {
        WeightsError::UnknownTensor {
            buffer: buffer.map(str::to_string),
            name: name.to_string(),
            checkpoint: self.path.clone(),
            suggestions: if suggest {
                similar(name, self.tensors.keys().map(String::as_str), 5)
            } else {
                vec![]
            },
        }
    }
}

fn files_path(files: &[Shard], i: usize, current: &Path) -> PathBuf {
    files
        .get(i)
        .map(|s| s.path.clone())
        .unwrap_or_else(|| current.to_path_buf())
}

fn starts_with_gguf_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && gguf::is_gguf(&magic)
}

/// The `*.{ext}` files directly inside `dir` (following symbolic links), sorted.
fn files_in(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let io = |source| WeightsError::Io {
        path: dir.to_path_buf(),
        what: "cannot list the directory",
        source,
    };
    let mut out = vec![];
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let p = entry.map_err(io)?.path();
        if p.extension().is_some_and(|x| x == ext) && p.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(|source| WeightsError::Io {
        path: path.to_path_buf(),
        what: "cannot open the checkpoint file",
        source,
    })?;
    // SAFETY: the map is only read, through bounds-checked slices. Like every reader that maps
    // model files (safetensors' own docs, candle), this assumes no other process truncates or
    // rewrites the file while kern has it open; a truncation would end the process with
    // SIGBUS rather than read wrong bytes silently.
    unsafe { Mmap::map(&file) }.map_err(|source| WeightsError::Io {
        path: path.to_path_buf(),
        what: "cannot memory-map the checkpoint file",
        source,
    })
}

/// A safetensors error in words, with the numbers that show what is wrong.
fn explain(e: SafeTensorError, bytes: &[u8]) -> String {
    let len = bytes.len();
    let header = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    match e {
        SafeTensorError::HeaderTooSmall => format!(
            "the file is {len} bytes, too short for the 8-byte header length that starts a safetensors file"
        ),
        SafeTensorError::HeaderTooLarge => format!(
            "the header length ({} bytes) is above the safetensors limit of 100 MB: the header is corrupt or this is not a safetensors file",
            header.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeaderLength => format!(
            "the header length ({} bytes) runs past the end of the file ({len} bytes): the file is truncated or not a safetensors file",
            header.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeader(u) => format!("the header is not UTF-8 ({u}): the header is corrupt"),
        SafeTensorError::InvalidHeaderDeserialization(j) => {
            format!("the header is not valid safetensors JSON ({j}): the header is corrupt")
        }
        SafeTensorError::MetadataIncompleteBuffer => format!(
            "the tensor data the header describes does not end where the file ends ({len} bytes): the file is truncated or has trailing bytes"
        ),
        SafeTensorError::InvalidOffset(name) => format!(
            "tensor `{name}` has data offsets that leave a gap or overlap the previous tensor"
        ),
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's data offsets do not cover exactly its shape times its dtype size".into()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows when multiplied out".into(),
        other => other.to_string(),
    }
}

pub(crate) fn kern_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::F8_E5M2 => DType::F8e5m2,
        Dtype::F8_E4M3 => DType::F8e4m3,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::Bf16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::U64 => DType::U64,
        _ => return None,
    })
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::BOOL => "BOOL",
        Dtype::F4 => "F4",
        Dtype::F6_E2M3 => "F6_E2M3",
        Dtype::F6_E3M2 => "F6_E3M2",
        Dtype::U8 => "U8",
        Dtype::I8 => "I8",
        Dtype::F8_E5M2 => "F8_E5M2",
        Dtype::F8_E4M3 => "F8_E4M3",
        Dtype::F8_E8M0 => "F8_E8M0",
        Dtype::F8_E4M3FNUZ => "F8_E4M3FNUZ",
        Dtype::F8_E5M2FNUZ => "F8_E5M2FNUZ",
        Dtype::I16 => "I16",
        Dtype::U16 => "U16",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::I32 => "I32",
        Dtype::U32 => "U32",
        Dtype::F32 => "F32",
        Dtype::C64 => "C64",
        Dtype::F64 => "F64",
        Dtype::I64 => "I64",
        Dtype::U64 => "U64",
        _ => "an unknown dtype",
    }
}
