//! GGUF (v2 and v3), ggml's model file format: a header, metadata key/values,
//! tensor infos and an aligned data section, all little-endian.
//!
//! [`parse`] reads everything but the tensor data from a byte slice (the memory-mapped file)
//! and checks every count, length, size and offset before using it: a hostile file gets a
//! [`WeightsError::BadGguf`] naming the file and byte offset, never a panic, an out-of-bounds
//! read or an allocation larger than the file justifies (every array is sized by the bytes
//! left, and numeric arrays are stored packed). Tensor dims are kept in GGUF order
//! ([`TensorInfo::dims`], ggml's `ne`, fastest first) and offered row-major
//! ([`TensorInfo::shape`], outermost first, as safetensors and manifests write them).
//!
//! The layout: ggml `docs/gguf.md`, checked against `src/gguf.cpp` and gguf-py's reader
//! (shared/notes/gguf.md §1).

use crate::error::{Result, WeightsError};
use std::path::Path;

/// The first four bytes of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The data-section alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// How deep arrays of arrays may nest (the spec allows nesting; real files never nest).
const MAX_DEPTH: usize = 8;
/// Most items reserved ahead from a count: counts are checked against the bytes left, but a
/// decoded item is larger than its smallest encoding, so a lying count in a large file must
/// not reserve memory ahead; past this, vectors grow only as items are actually read.
const PREALLOC: usize = 4096;

/// Whether `bytes` start like a GGUF file.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// A ggml tensor type: its id in the file, name, and block geometry (gguf-py
/// `GGML_QUANT_SIZES`). Every id gguf-py 0.19 knows is listed, so `kern inspect` names any
/// tensor; [`GgmlType::dequantizable`] says which ones kern can turn into floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    /// Elements per block (1 for plain types).
    pub block_elems: u32,
    /// Bytes per block.
    pub block_bytes: u32,
}

const fn t(id: u32, name: &'static str, block_elems: u32, block_bytes: u32) -> GgmlType {
    GgmlType { id, name, block_elems, block_bytes }
}

/// Every type id gguf-py 0.19.0 defines (ids 4, 5 and 31–33, 36–38 were removed from ggml).
pub const TYPES: &[GgmlType] = &[
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 18),
    t(3, "Q4_1", 32, 20),
    t(6, "Q5_0", 32, 22),
    t(7, "Q5_1", 32, 24),
    t(8, "Q8_0", 32, 34),
    t(9, "Q8_1", 32, 40),
    t(10, "Q2_K", 256, 84),
    t(11, "Q3_K", 256, 110),
    t(12, "Q4_K", 256, 144),
    t(13, "Q5_K", 256, 176),
    t(14, "Q6_K", 256, 210),
    t(15, "Q8_K", 256, 292),
    t(16, "IQ2_XXS", 256, 66),
    t(17, "IQ2_XS", 256, 74),
    t(18, "IQ3_XXS", 256, 98),
    t(19, "IQ1_S", 256, 50),
    t(20, "IQ4_NL", 32, 18),
    t(21, "IQ3_S", 256, 110),
    t(22, "IQ2_S", 256, 82),
    t(23, "IQ4_XS", 256, 136),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", 256, 56),
    t(30, "BF16", 1, 2),
    t(34, "TQ1_0", 256, 54),
    t(35, "TQ2_0", 256, 66),
    t(39, "MXFP4", 32, 17),
    t(40, "NVFP4", 64, 36),
    t(41, "Q1_0", 128, 18),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().copied().find(|t| t.id == id)
    }

    pub fn by_name(name: &str) -> Option<GgmlType> {
        TYPES.iter().copied().find(|t| t.name.eq_ignore_ascii_case(name))
    }

    /// kern's dtype for a type whose elements are plain numbers (F32, F16, BF16, F64 and the
    /// integers): those tensors are read like safetensors ones. `None` for block types.
    pub fn plain_dtype(self) -> Option<kern_manifest::DType> {
        use kern_manifest::DType;
        Some(match self.id {
            0 => DType::F32,
            1 => DType::F16,
            30 => DType::Bf16,
            28 => DType::F64,
            24 => DType::I8,
            25 => DType::I16,
            26 => DType::I32,
            27 => DType::I64,
            _ => return None,
        })
    }

    /// kern's block dtype for a GGUF block type a buffer can hold as it is (`Q4_K` → `q4_k`;
    /// issue 25): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K … Q6_K. `None` for plain types and
    /// for the block types kern has no dtype for (Q8_1, Q8_K, the IQ and TQ types, MXFP4, …).
    /// The dtype's [`DType::size`](kern_manifest::DType::size) and
    /// [`DType::block_elems`](kern_manifest::DType::block_elems) are this type's
    /// `block_bytes` and `block_elems`.
    pub fn block_dtype(self) -> Option<kern_manifest::DType> {
        use kern_manifest::DType;
        Some(match self.id {
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            10 => DType::Q2K,
            11 => DType::Q3K,
            12 => DType::Q4K,
            13 => DType::Q5K,
            14 => DType::Q6K,
            _ => return None,
        })
    }

    /// The dtype of a buffer that holds a tensor of this type unchanged: the plain dtype
    /// ([`GgmlType::plain_dtype`]) or the block dtype ([`GgmlType::block_dtype`]); `None` when
    /// kern has neither (such a tensor can still be dequantized into a float buffer when
    /// [`GgmlType::dequantizable`]).
    pub fn dtype(self) -> Option<kern_manifest::DType> {
        self.plain_dtype().or_else(|| self.block_dtype())
    }

    /// The GGUF type whose tensors a buffer of `dtype` holds unchanged: the inverse of
    /// [`GgmlType::dtype`] (`q4_k` → `Q4_K`, `f32` → `F32`); `None` for a dtype GGUF has no
    /// type for (`u8`, FP8, …).
    pub fn for_dtype(dtype: kern_manifest::DType) -> Option<GgmlType> {
        TYPES.iter().copied().find(|t| t.dtype() == Some(dtype))
    }

    /// Whether [`crate::dequant`] turns this type into f32 (bit-exact with gguf-py).
    pub fn dequantizable(self) -> bool {
        crate::dequant::DEQUANTIZED.contains(&self.name)
    }

    /// Bytes of `elems` elements, when `elems` is a whole number of blocks.
    pub fn bytes_for(self, elems: u64) -> Option<u64> {
        if !elems.is_multiple_of(u64::from(self.block_elems)) {
            return None;
        }
        (elems / u64::from(self.block_elems)).checked_mul(u64::from(self.block_bytes))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The type of a metadata value, as the file numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in the file.
    fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored packed by element type (a 150,000-token vocabulary is one
/// `Vec<String>`, not 150,000 boxed values).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value that is non-negative (writers use u32 and u64 interchangeably).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any number, as f64 (exact for f32 and the integers kern meets).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as JSON (arrays in full).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::U8(v) => json!(v),
            Value::I8(v) => json!(v),
            Value::U16(v) => json!(v),
            Value::I16(v) => json!(v),
            Value::U32(v) => json!(v),
            Value::I32(v) => json!(v),
            Value::F32(v) => float_json(f64::from(*v)),
            Value::Bool(v) => json!(v),
            Value::String(v) => json!(v),
            Value::Array(a) => a.to_json(usize::MAX),
            Value::U64(v) => json!(v),
            Value::I64(v) => json!(v),
            Value::F64(v) => float_json(*v),
        }
    }
}

fn float_json(v: f64) -> serde_json::Value {
    // JSON has no inf/NaN: write those as strings.
    serde_json::Number::from_f64(v).map_or_else(|| serde_json::Value::String(v.to_string()), serde_json::Value::Number)
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// The first `limit` elements as JSON.
    pub fn to_json(&self, limit: usize) -> serde_json::Value {
        fn take<T: Clone + Into<serde_json::Value>>(v: &[T], n: usize) -> serde_json::Value {
            serde_json::Value::Array(v[..v.len().min(n)].iter().cloned().map(Into::into).collect())
        }
        match self {
            Array::U8(v) => take(v, limit),
            Array::I8(v) => take(v, limit),
            Array::U16(v) => take(v, limit),
            Array::I16(v) => take(v, limit),
            Array::U32(v) => take(v, limit),
            Array::I32(v) => take(v, limit),
            Array::F32(v) => v.iter().take(limit).map(|x| float_json(f64::from(*x))).collect(),
            Array::Bool(v) => take(v, limit),
            Array::String(v) => take(v, limit),
            Array::Array(v) => v.iter().take(limit).map(|a| a.to_json(limit)).collect(),
            Array::U64(v) => take(v, limit),
            Array::I64(v) => take(v, limit),
            Array::F64(v) => v.iter().take(limit).map(|x| float_json(*x)).collect(),
        }
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order (ggml's `ne`): `dims[0]` is the fastest-varying dimension (the row length).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Where the data starts, from the start of the file.
    pub offset: u64,
    /// Data size in bytes.
    pub bytes: u64,
    /// Where the tensor info starts in the file (for error messages).
    pub info_at: u64,
}

impl TensorInfo {
    /// Dimensions outermost first (the reverse of [`TensorInfo::dims`]): a linear layer's
    /// GGUF dims [in, out] are the row-major shape [out, in], the bytes already in that order.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    pub fn elements(&self) -> u64 {
        // parse() checked that the product fits.
        self.dims.iter().product()
    }
}

/// A parsed GGUF header: everything but the tensor data.
#[derive(Clone, Debug, PartialEq)]
pub struct Gguf {
    pub version: u32,
    /// Key/value pairs in file order (keys are unique).
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order (names are unique).
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the data section starts in the file.
    pub data_start: u64,
}

impl Gguf {
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// `general.architecture`: the model family, which only a model pack interprets.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Bounds-checked little-endian reads over the file's bytes.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn err(&self, at: usize, message: String) -> WeightsError {
        WeightsError::BadGguf { path: self.path.to_path_buf(), offset: at as u64, message }
    }

    fn left(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(
                self.pos,
                format!("{what} needs {n} bytes, the file has {} left: the file is truncated or corrupt", self.left()),
            ));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n > self.left() {
            return Err(self.err(at, format!("{what}: a string of {n} bytes, but the file has {} left", self.left())));
        }
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.err(at + 8 + e.utf8_error().valid_up_to(), format!("{what} is not UTF-8")))
    }

    /// A count of items each at least `min` bytes long, checked against the bytes left.
    fn count(&mut self, min: u64, what: &str) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        if n.checked_mul(min).is_none_or(|b| b > self.left()) {
            return Err(self.err(
                at,
                format!("{what} is {n}, but {} bytes are left, room for at most {} (at {min} bytes each)", self.left(), self.left() / min),
            ));
        }
        Ok(n as usize)
    }

    fn value_type(&mut self, what: &str) -> Result<ValueType> {
        let at = self.pos;
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| self.err(at, format!("{what}: unknown value type {id} (GGUF defines 0..=12)")))
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>(key)?[0]),
            ValueType::I8 => Value::I8(self.arr::<1>(key)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr(key)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr(key)?)),
            ValueType::U32 => Value::U32(self.u32(key)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr(key)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr(key)?)),
            ValueType::Bool => Value::Bool(self.bool(key)?),
            ValueType::String => Value::String(self.string(key)?),
            ValueType::Array => Value::Array(self.array(key, depth)?),
            ValueType::U64 => Value::U64(self.u64(key)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.arr(key)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.arr(key)?)),
        })
    }

    fn bool(&mut self, what: &str) -> Result<bool> {
        let at = self.pos;
        match self.arr::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.err(at, format!("{what}: a bool must be 0 or 1, this one is {b}"))),
        }
    }

    fn array(&mut self, key: &str, depth: usize) -> Result<Array> {
        let at = self.pos;
        if depth >= MAX_DEPTH {
            return Err(self.err(at, format!("`{key}`: arrays nested more than {MAX_DEPTH} deep")));
        }
        let elem = self.value_type(&format!("`{key}`: array element type"))?;
        let n = self.count(elem.min_bytes(), &format!("`{key}`: array length"))?;
        macro_rules! many {
            ($variant:ident, $f:expr) => {{
                let mut v = Vec::with_capacity(n.min(PREALLOC));
                for _ in 0..n {
                    v.push($f(&mut *self)?);
                }
                Array::$variant(v)
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n as u64, key)?.to_vec()),
            ValueType::I8 => Array::I8(self.take(n as u64, key)?.iter().map(|&b| b as i8).collect()),
            ValueType::U16 => Array::U16(self.take(2 * n as u64, key)?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()),
            ValueType::I16 => Array::I16(self.take(2 * n as u64, key)?.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()),
            ValueType::U32 => Array::U32(self.take(4 * n as u64, key)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect()),
            ValueType::I32 => Array::I32(self.take(4 * n as u64, key)?.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4"))).collect()),
            ValueType::F32 => Array::F32(self.take(4 * n as u64, key)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4"))).collect()),
            ValueType::U64 => Array::U64(self.take(8 * n as u64, key)?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect()),
            ValueType::I64 => Array::I64(self.take(8 * n as u64, key)?.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8"))).collect()),
            ValueType::F64 => Array::F64(self.take(8 * n as u64, key)?.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8"))).collect()),
            ValueType::Bool => many!(Bool, |r: &mut Self| r.bool(key)),
            ValueType::String => many!(String, |r: &mut Self| r.string(key)),
            ValueType::Array => many!(Array, |r: &mut Self| r.array(key, depth + 1)),
        })
    }
}

/// Parses a GGUF file's header, metadata and tensor infos from `bytes` (the whole file);
/// `path` names the file in errors. Every tensor's data is checked to lie inside `bytes`.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Gguf> {
    let mut r = Reader { b: bytes, pos: 0, path };
    let magic = r.arr::<4>("the magic")?;
    if magic != MAGIC {
        return Err(r.err(0, format!("the file starts with {magic:02x?}, not the GGUF magic `GGUF`")));
    }
    let version = r.u32("the version")?;
    if version & 0xffff == 0 && version != 0 {
        return Err(r.err(4, format!("version {version:#x} looks byte-swapped: a big-endian GGUF file, which kern does not read (convert it to little-endian)")));
    }
    match version {
        2 | 3 => {}
        1 => return Err(r.err(4, "GGUF version 1 (32-bit counts) is obsolete: convert the file with a current ggml converter".into())),
        v => return Err(r.err(4, format!("GGUF version {v}: kern reads versions 2 and 3"))),
    }
    // Smallest tensor info: empty name (8), n_dims (4), type (4), offset (8).
    let n_tensors = r.count(24, "the tensor count")?;
    // Smallest key/value: empty key (8), type (4), a one-byte value.
    let n_kv = r.count(13, "the metadata count")?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv.min(PREALLOC));
    let mut keys = std::collections::HashSet::with_capacity(n_kv.min(PREALLOC));
    for i in 0..n_kv {
        let at = r.pos;
        let key = r.string(&format!("metadata key {i}"))?;
        if key.is_empty() {
            return Err(r.err(at, format!("metadata key {i} is empty")));
        }
        if !keys.insert(key.clone()) {
            return Err(r.err(at, format!("metadata key `{key}` appears twice")));
        }
        let ty = r.value_type(&format!("`{key}`: value type"))?;
        let v = r.value(ty, &key, 0)?;
        metadata.push((key, v));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 30 => a,
            _ => return Err(r.err(0, format!("`general.alignment` is {v:?}: it must be a power of two (32 by default)"))),
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors.min(PREALLOC));
    let mut names = std::collections::HashSet::with_capacity(n_tensors.min(PREALLOC));
    for i in 0..n_tensors {
        let info_at = r.pos;
        let name = r.string(&format!("the name of tensor {i}"))?;
        if !names.insert(name.clone()) {
            return Err(r.err(info_at, format!("tensor `{name}` appears twice")));
        }
        let at = r.pos;
        let n_dims = r.u32(&format!("tensor `{name}`: dimension count"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(r.err(at, format!("tensor `{name}` has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let at = r.pos;
            let d = r.u64(&format!("tensor `{name}`: dimensions"))?;
            if d > i64::MAX as u64 {
                return Err(r.err(at, format!("tensor `{name}`: dimension {d} is negative as ggml's int64")));
            }
            dims.push(d);
        }
        let at = r.pos;
        let id = r.u32(&format!("tensor `{name}`: type"))?;
        let ggml_type = GgmlType::from_id(id).ok_or_else(|| r.err(at, format!("tensor `{name}` has type id {id}, which no ggml type has")))?;
        let elems = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(u64::from(ggml_type.block_elems)) {
            return Err(r.err(at, format!("tensor `{name}`: rows of {row} elements are not a whole number of {ggml_type} blocks ({} elements)", ggml_type.block_elems)));
        }
        let size = elems.and_then(|e| ggml_type.bytes_for(e));
        let Some(size) = size else {
            return Err(r.err(at, format!("tensor `{name}`: dims {dims:?} overflow when multiplied out")));
        };
        let at = r.pos;
        let offset = r.u64(&format!("tensor `{name}`: offset"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(r.err(at, format!("tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment}")));
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset, bytes: size, info_at: info_at as u64 });
    }

    let end = r.pos as u64;
    let data_start = end.div_ceil(alignment) * alignment;
    let len = bytes.len() as u64;
    for ti in &mut tensors {
        let rel = ti.offset;
        let fits = data_start.checked_add(rel).and_then(|s| s.checked_add(ti.bytes)).is_some_and(|e| e <= len);
        if !fits {
            return Err(r.err(
                ti.info_at as usize,
                format!(
                    "tensor `{}`: {} bytes at data offset {rel} run past the end of the file ({len} bytes, data section from byte {data_start}): the file is truncated",
                    ti.name, ti.bytes
                ),
            ));
        }
        ti.offset = data_start + rel;
    }
    Ok(Gguf { version, metadata, tensors, alignment, data_start })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_table_is_consistent() {
        let mut ids = std::collections::HashSet::new();
        for t in TYPES {
            assert!(ids.insert(t.id), "{} twice", t.id);
            assert_eq!(GgmlType::by_name(t.name), Some(*t));
        }
        assert_eq!(GgmlType::from_id(12).unwrap().name, "Q4_K");
        assert_eq!(GgmlType::from_id(4), None);
    }

    #[test]
    fn block_dtypes_have_the_types_geometry() {
        use kern_manifest::DType;
        let mut blocks = vec![];
        for t in TYPES {
            if let Some(d) = t.block_dtype() {
                assert_eq!((d.size(), d.block_elems()), (u64::from(t.block_bytes), u64::from(t.block_elems)), "{t}");
                assert_eq!(d.ggml_name(), Some(t.name));
                assert!(t.plain_dtype().is_none() && t.dequantizable(), "{t}");
                blocks.push(d);
            }
            if let Some(d) = t.dtype() {
                assert_eq!(GgmlType::for_dtype(d), Some(*t), "{t}");
            }
        }
        assert_eq!(blocks, DType::BLOCKS, "every block dtype has its ggml type, in order");
        assert_eq!(GgmlType::for_dtype(DType::Q4K).map(|t| t.name), Some("Q4_K"));
        assert_eq!(GgmlType::for_dtype(DType::F8e4m3), None);
        assert_eq!(GgmlType::by_name("Q8_K").unwrap().dtype(), None);
    }
}
