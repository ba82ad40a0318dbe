//! Element types, scalar types, parameter types and typed constants.
//!
//! Parameter types are written as strings: `"out buffer<bf16>"`, `"in buffer<f32>"`,
//! `"inout buffer<u8>"`, scalars (`"i32"`, `"f32"`, …), and the kern 4.1 extensions `"ptr"`
//! (an untyped device pointer) and, for op parameters only, `"state"`. A launch parameter may
//! also be a by-value aggregate, written as an object (`{"struct": {"size": 24, "align": 8}}`).

use schemars::JsonSchema;
use serde::Serialize;
use std::fmt;

/// Element type of a buffer.
///
/// The GGUF block types (`q4_0` … `q6_k`) are opaque: one element is one whole block of
/// values (32 or 256), stored as the GGUF file stores it. A weight of N × K values in `q4_k`
/// has the shape `[N, K / 256]`, and every size stays the shape's product times the element's
/// bytes. Block types are for weights only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F16,
    F32,
    F64,
    /// FP8 E4M3 (`__nv_fp8_e4m3`, `torch.float8_e4m3fn`).
    F8e4m3,
    /// FP8 E5M2 (`__nv_fp8_e5m2`, `torch.float8_e5m2`).
    F8e5m2,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
    /// A GGUF `Q4_0` block: 32 values in 18 bytes (f16 scale, 4-bit values). Weights only.
    Q4_0,
    /// A GGUF `Q4_1` block: 32 values in 20 bytes (f16 scale and min, 4-bit values). Weights only.
    Q4_1,
    /// A GGUF `Q5_0` block: 32 values in 22 bytes (f16 scale, 5-bit values). Weights only.
    Q5_0,
    /// A GGUF `Q5_1` block: 32 values in 24 bytes (f16 scale and min, 5-bit values). Weights only.
    Q5_1,
    /// A GGUF `Q8_0` block: 32 values in 34 bytes (f16 scale, 32 int8). Weights only.
    Q8_0,
    /// A GGUF `Q2_K` block: 256 values in 84 bytes (k-quant). Weights only.
    #[serde(rename = "q2_k")]
    Q2K,
    /// A GGUF `Q3_K` block: 256 values in 110 bytes (k-quant). Weights only.
    #[serde(rename = "q3_k")]
    Q3K,
    /// A GGUF `Q4_K` block: 256 values in 144 bytes (k-quant, 4-bit values). Weights only.
    #[serde(rename = "q4_k")]
    Q4K,
    /// A GGUF `Q5_K` block: 256 values in 176 bytes (k-quant). Weights only.
    #[serde(rename = "q5_k")]
    Q5K,
    /// A GGUF `Q6_K` block: 256 values in 210 bytes (k-quant, 6-bit values). Weights only.
    #[serde(rename = "q6_k")]
    Q6K,
}

impl DType {
    pub const ALL: [DType; 25] = [
        DType::Bf16,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::F8e4m3,
        DType::F8e5m2,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// The GGUF block dtypes, in [`DType::ALL`] order.
    pub const BLOCKS: [DType; 10] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// Bytes per element; for a block dtype, bytes per block (ggml's `type_size`).
    pub fn size(self) -> u64 {
        match self {
            DType::F8e4m3 | DType::F8e5m2 | DType::I8 | DType::U8 | DType::Bool => 1,
            DType::Bf16 | DType::F16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// Values per element: the block size (ggml's `blck_size`) for a block dtype — 32 for
    /// `q4_0` … `q8_0`, 256 for the k-quants — and 1 for every other dtype.
    pub fn block_elems(self) -> u64 {
        match self {
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => 256,
            _ => 1,
        }
    }

    /// Whether one element is a GGUF block of values (weights only).
    pub fn is_block(self) -> bool {
        self.block_elems() > 1
    }

    /// ggml's name for a block dtype (`Q4_K` for `q4_k`); `None` for the plain dtypes.
    pub fn ggml_name(self) -> Option<&'static str> {
        Some(match self {
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q8_0 => "Q8_0",
            DType::Q2K => "Q2_K",
            DType::Q3K => "Q3_K",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            _ => return None,
        })
    }

    /// Bytes of `values` values (not elements) of this dtype, when `values` is a whole number
    /// of blocks (always, for a plain dtype) and the product fits.
    pub fn bytes_for_values(self, values: u64) -> Option<u64> {
        if !values.is_multiple_of(self.block_elems()) {
            return None;
        }
        (values / self.block_elems()).checked_mul(self.size())
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F8e4m3 => "f8e4m3",
            DType::F8e5m2 => "f8e5m2",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::U16 => "u16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    pub fn parse(s: &str) -> Result<DType, String> {
        if let Some(d) = DType::ALL.into_iter().find(|d| d.name() == s) {
            return Ok(d);
        }
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        let hint = match common_alias(s) {
            Some(a) => format!(": write `{a}`"),
            None => match file_type(s) {
                Some(why) => format!(": {why}"),
                None => crate::diag::did_you_mean(s, names.iter().copied()),
            },
        };
        Err(format!(
            "`{s}` is not a dtype{hint}; dtypes are {}",
            names.join(" ")
        ))
    }
}

/// A GGUF *file* type (the quantizer's file-type names, `Q4_K_M`), which is a mix of tensor types.
fn file_type(s: &str) -> Option<String> {
    let l = s.to_ascii_lowercase();
    let base = l
        .strip_suffix("_s")
        .or_else(|| l.strip_suffix("_m"))
        .or_else(|| l.strip_suffix("_l"))?;
    let d = DType::BLOCKS.into_iter().find(|d| d.name() == base)?;
    Some(format!(
        "{s} names a GGUF file's mix of tensor types; each tensor has one type (`{d}`, `q6_k`, …): declare each weight with its tensor's type"
    ))
}

/// What people coming from C++ or PyTorch write for kern's type names.
fn common_alias(s: &str) -> Option<&'static str> {
    Some(match s.trim_start_matches("torch.") {
        "float" | "float32" | "fp32" => "f32",
        "double" | "float64" | "fp64" => "f64",
        "half" | "float16" | "fp16" => "f16",
        "bfloat16" | "bfloat" => "bf16",
        "int" | "int32" => "i32",
        "long" | "int64" => "i64",
        "short" | "int16" => "i16",
        "char" | "int8" => "i8",
        "uint8" | "byte" | "unsigned char" => "u8",
        "uint16" => "u16",
        "uint32" | "unsigned" | "unsigned int" => "u32",
        "uint64" | "unsigned long" | "size_t" => "u64",
        "float8_e4m3fn" | "fp8_e4m3" | "e4m3" | "f8e4m3fn" => "f8e4m3",
        "float8_e5m2" | "fp8_e5m2" | "e5m2" => "f8e5m2",
        // safetensors' names.
        "F8_E4M3" | "f8_e4m3" => "f8e4m3",
        "F8_E5M2" | "f8_e5m2" => "f8e5m2",
        // ggml's names (`Q4_K`, `BF16`) and the underscore-less spellings (`q4k`).
        other => {
            return DType::ALL.into_iter().map(DType::name).find(|n| {
                n.eq_ignore_ascii_case(other) || n.replace('_', "").eq_ignore_ascii_case(other)
            })
        }
    })
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A by-value scalar parameter type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
    Bool,
}

impl Scalar {
    pub const ALL: [Scalar; 11] = [
        Scalar::I8,
        Scalar::I16,
        Scalar::I32,
        Scalar::I64,
        Scalar::U8,
        Scalar::U16,
        Scalar::U32,
        Scalar::U64,
        Scalar::F32,
        Scalar::F64,
        Scalar::Bool,
    ];

    pub fn size(self) -> u32 {
        match self {
            Scalar::I8 | Scalar::U8 | Scalar::Bool => 1,
            Scalar::I16 | Scalar::U16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scalar::I8 => "i8",
            Scalar::I16 => "i16",
            Scalar::I32 => "i32",
            Scalar::I64 => "i64",
            Scalar::U8 => "u8",
            Scalar::U16 => "u16",
            Scalar::U32 => "u32",
            Scalar::U64 => "u64",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
            Scalar::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Option<Scalar> {
        Scalar::ALL.into_iter().find(|t| t.name() == s)
    }

    pub fn is_float(self) -> bool {
        matches!(self, Scalar::F32 | Scalar::F64)
    }

    /// The range of an integer type (None for floats and bool).
    pub fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            Scalar::I8 => (i8::MIN.into(), i8::MAX.into()),
            Scalar::I16 => (i16::MIN.into(), i16::MAX.into()),
            Scalar::I32 => (i32::MIN.into(), i32::MAX.into()),
            Scalar::I64 => (i64::MIN.into(), i64::MAX.into()),
            Scalar::U8 => (0, u8::MAX.into()),
            Scalar::U16 => (0, u16::MAX.into()),
            Scalar::U32 => (0, u32::MAX.into()),
            Scalar::U64 => (0, u64::MAX.into()),
            Scalar::F32 | Scalar::F64 | Scalar::Bool => return None,
        })
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a kernel or op uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only read.
    In,
    /// Written (its previous contents are not read).
    Out,
    /// Read and written.
    InOut,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::In => "in",
            Access::Out => "out",
            Access::InOut => "inout",
        }
    }
    pub fn writes(self) -> bool {
        self != Access::In
    }
    pub fn reads(self) -> bool {
        self != Access::Out
    }
}

/// The type of an op parameter (what a program call binds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpParam {
    /// A buffer of one element type; bound with `{"buf": name}`.
    Buffer { access: Access, dtype: DType },
    /// kern 4.1: an untyped device pointer; bound with a buffer, a state, or `{"null": true}`.
    Ptr,
    /// kern 4.1: a state pool's base pointer; bound with `{"state": name}`.
    State,
    /// A by-value scalar; bound with `{"var": name}` (integers) or a typed constant.
    Scalar(Scalar),
}

/// The type of a kernel parameter, as a launch declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelParam {
    Buffer {
        access: Access,
        dtype: DType,
    },
    /// kern 4.1: an untyped device pointer (a Triton scratch pointer, a state pool).
    Ptr,
    Scalar(Scalar),
    /// kern 4.1: a by-value aggregate of `size` bytes aligned to `align` (a C struct, a CuTe
    /// tensor descriptor), built from fields at byte offsets.
    Struct {
        size: u32,
        align: u32,
    },
}

impl KernelParam {
    /// Bytes the parameter occupies in the parameter buffer.
    pub fn size(&self) -> u32 {
        match self {
            KernelParam::Buffer { .. } | KernelParam::Ptr => 8,
            KernelParam::Scalar(s) => s.size(),
            KernelParam::Struct { size, .. } => *size,
        }
    }

    /// Natural alignment in the parameter buffer.
    pub fn align(&self) -> u32 {
        match self {
            KernelParam::Struct { align, .. } => *align,
            other => other.size(),
        }
    }

    pub fn is_pointer(&self) -> bool {
        matches!(self, KernelParam::Buffer { .. } | KernelParam::Ptr)
    }
}

impl fmt::Display for OpParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpParam::Buffer { access, dtype } => write!(f, "{} buffer<{dtype}>", access.name()),
            OpParam::Ptr => f.write_str("ptr"),
            OpParam::State => f.write_str("state"),
            OpParam::Scalar(s) => f.write_str(s.name()),
        }
    }
}

impl fmt::Display for KernelParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelParam::Buffer { access, dtype } => write!(f, "{} buffer<{dtype}>", access.name()),
            KernelParam::Ptr => f.write_str("ptr"),
            KernelParam::Scalar(s) => f.write_str(s.name()),
            KernelParam::Struct { size, align } => {
                write!(f, "struct of {size} bytes aligned to {align}")
            }
        }
    }
}

const PARAM_FORMS: &str = "`in buffer<DTYPE>`, `out buffer<DTYPE>`, `inout buffer<DTYPE>`, `ptr`, or a scalar: i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 bool";

impl OpParam {
    /// Parses `"out buffer<bf16>"`, `"i32"`, `"ptr"`, `"state"`.
    pub fn parse(s: &str) -> Result<OpParam, String> {
        if s.trim() == "state" {
            return Ok(OpParam::State);
        }
        Ok(
            match parse_common(s, "an op parameter type", "`state`, ")? {
                Common::Buffer(access, dtype) => OpParam::Buffer { access, dtype },
                Common::Ptr => OpParam::Ptr,
                Common::Scalar(t) => OpParam::Scalar(t),
            },
        )
    }

    /// Whether this op parameter needs a 4.1 reader.
    pub(crate) fn is_extension(&self) -> bool {
        matches!(self, OpParam::Ptr | OpParam::State)
    }
}

impl KernelParam {
    /// Parses the string forms (`"in buffer<f32>"`, `"i64"`, `"ptr"`); aggregates are objects
    /// and are built by the decoder.
    pub fn parse(s: &str) -> Result<KernelParam, String> {
        if s.trim() == "state" {
            return Err(
                "`state` is for op parameters; a kernel receives a state pool as `ptr`".into(),
            );
        }
        Ok(match parse_common(s, "a kernel parameter type", "")? {
            Common::Buffer(access, dtype) => KernelParam::Buffer { access, dtype },
            Common::Ptr => KernelParam::Ptr,
            Common::Scalar(t) => KernelParam::Scalar(t),
        })
    }
}

enum Common {
    Buffer(Access, DType),
    Ptr,
    Scalar(Scalar),
}

fn parse_common(s: &str, what: &str, extra: &str) -> Result<Common, String> {
    let words: Vec<&str> = s.split_whitespace().collect();
    let bad = |why: String| {
        Err(format!(
            "`{s}` is not {what}: {why} (types are {extra}{PARAM_FORMS})"
        ))
    };
    match words.as_slice() {
        ["ptr"] => Ok(Common::Ptr),
        [t] if t.starts_with("buffer") => bad(format!(
            "a buffer needs a direction: `in {t}`, `out {t}` or `inout {t}`"
        )),
        [t] => match Scalar::parse(t) {
            Some(sc) => Ok(Common::Scalar(sc)),
            None => match common_alias(t) {
                Some(a) if Scalar::parse(a).is_some() => bad(format!("write `{a}`")),
                _ => bad(format!("`{t}` is not a type")),
            },
        },
        [dir, buf] => {
            let access = match *dir {
                "in" => Access::In,
                "out" => Access::Out,
                "inout" => Access::InOut,
                d => return bad(format!("`{d}` is not a direction (in, out, inout)")),
            };
            let Some(inner) = buf
                .strip_prefix("buffer<")
                .and_then(|r| r.strip_suffix('>'))
            else {
                return bad(format!("`{buf}` is not `buffer<DTYPE>`"));
            };
            if inner == "any" || inner.is_empty() {
                return bad(
                    "a buffer has one element type; for an untyped pointer write `ptr`".to_string(),
                );
            }
            match DType::parse(inner) {
                Ok(d) => Ok(Common::Buffer(access, d)),
                Err(e) => bad(e),
            }
        }
        [] => bad("it is empty".into()),
        _ => bad("too many words".into()),
    }
}

/// A typed constant (`{"i64": 2560}`, `{"f32": 1e-6}`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    Bool(bool),
}

impl Value {
    pub fn scalar(&self) -> Scalar {
        match self {
            Value::I8(_) => Scalar::I8,
            Value::I16(_) => Scalar::I16,
            Value::I32(_) => Scalar::I32,
            Value::I64(_) => Scalar::I64,
            Value::U8(_) => Scalar::U8,
            Value::U16(_) => Scalar::U16,
            Value::U32(_) => Scalar::U32,
            Value::U64(_) => Scalar::U64,
            Value::F32(_) => Scalar::F32,
            Value::F64(_) => Scalar::F64,
            Value::Bool(_) => Scalar::Bool,
        }
    }

    /// The little-endian bytes a kernel receives (`bool` is one byte, 0 or 1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match *self {
            Value::I8(v) => v.to_le_bytes().to_vec(),
            Value::I16(v) => v.to_le_bytes().to_vec(),
            Value::I32(v) => v.to_le_bytes().to_vec(),
            Value::I64(v) => v.to_le_bytes().to_vec(),
            Value::U8(v) => v.to_le_bytes().to_vec(),
            Value::U16(v) => v.to_le_bytes().to_vec(),
            Value::U32(v) => v.to_le_bytes().to_vec(),
            Value::U64(v) => v.to_le_bytes().to_vec(),
            Value::F32(v) => v.to_le_bytes().to_vec(),
            Value::F64(v) => v.to_le_bytes().to_vec(),
            Value::Bool(v) => vec![u8::from(v)],
        }
    }

    /// An integer value of scalar type `t`, when `v` fits.
    pub fn int(t: Scalar, v: i128) -> Option<Value> {
        Some(match t {
            Scalar::I8 => Value::I8(v.try_into().ok()?),
            Scalar::I16 => Value::I16(v.try_into().ok()?),
            Scalar::I32 => Value::I32(v.try_into().ok()?),
            Scalar::I64 => Value::I64(v.try_into().ok()?),
            Scalar::U8 => Value::U8(v.try_into().ok()?),
            Scalar::U16 => Value::U16(v.try_into().ok()?),
            Scalar::U32 => Value::U32(v.try_into().ok()?),
            Scalar::U64 => Value::U64(v.try_into().ok()?),
            Scalar::F32 | Scalar::F64 | Scalar::Bool => return None,
        })
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::I8(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::U8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v:e}"),
            Value::F64(v) => write!(f, "{v:e}"),
            Value::Bool(v) => write!(f, "{v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_seed_param_types() {
        assert_eq!(
            OpParam::parse("out buffer<bf16>"),
            Ok(OpParam::Buffer {
                access: Access::Out,
                dtype: DType::Bf16
            })
        );
        assert_eq!(
            OpParam::parse("in buffer<bf16>"),
            Ok(OpParam::Buffer {
                access: Access::In,
                dtype: DType::Bf16
            })
        );
        assert_eq!(
            OpParam::parse("inout  buffer<f8e4m3>"),
            Ok(OpParam::Buffer {
                access: Access::InOut,
                dtype: DType::F8e4m3
            })
        );
        assert_eq!(OpParam::parse("i32"), Ok(OpParam::Scalar(Scalar::I32)));
        assert_eq!(OpParam::parse("ptr"), Ok(OpParam::Ptr));
        assert_eq!(OpParam::parse("state"), Ok(OpParam::State));
        assert_eq!(
            KernelParam::parse("f32"),
            Ok(KernelParam::Scalar(Scalar::F32))
        );
        assert_eq!(KernelParam::parse("u64").unwrap().size(), 8);
        for s in Scalar::ALL {
            assert_eq!(KernelParam::parse(s.name()), Ok(KernelParam::Scalar(s)));
        }
        for d in DType::ALL {
            let t = format!("inout buffer<{d}>");
            assert_eq!(OpParam::parse(&t).unwrap().to_string(), t);
        }
    }

    #[test]
    fn param_type_errors_say_what_to_write() {
        let e = |s: &str| OpParam::parse(s).unwrap_err();
        assert!(
            e("buffer<bf16>").contains("a buffer needs a direction: `in buffer<bf16>`"),
            "{}",
            e("buffer<bf16>")
        );
        assert!(e("in buffer<bfloat16>").contains("`bfloat16` is not a dtype: write `bf16`"));
        assert!(
            e("in buffer<bf61>").contains("`bf61` is not a dtype (did you mean `bf16`?)"),
            "{}",
            e("in buffer<bf61>")
        );
        assert!(e("int").contains("write `i32`"));
        assert!(e("input buffer<f32>").contains("`input` is not a direction"));
        assert!(e("in buffer<any>").contains("write `ptr`"));
        assert!(e("in tensor<f32>").contains("`tensor<f32>` is not `buffer<DTYPE>`"));
        assert!(e("").contains("it is empty"));
        assert!(KernelParam::parse("state")
            .unwrap_err()
            .contains("as `ptr`"));
    }

    #[test]
    fn block_dtypes_are_whole_blocks() {
        // ggml's GGML_QUANT_SIZES: (values per block, bytes per block).
        let want = [
            ("q4_0", 32, 18),
            ("q4_1", 32, 20),
            ("q5_0", 32, 22),
            ("q5_1", 32, 24),
            ("q8_0", 32, 34),
            ("q2_k", 256, 84),
            ("q3_k", 256, 110),
            ("q4_k", 256, 144),
            ("q5_k", 256, 176),
            ("q6_k", 256, 210),
        ];
        assert_eq!(DType::BLOCKS.len(), want.len());
        for (d, (name, elems, bytes)) in DType::BLOCKS.into_iter().zip(want) {
            assert_eq!(DType::parse(name), Ok(d));
            assert_eq!((d.name(), d.block_elems(), d.size()), (name, elems, bytes));
            assert!(d.is_block());
            assert_eq!(d.ggml_name().unwrap().to_ascii_lowercase(), name);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{name}\""));
            // An uppercase (ggml) or underscore-less name says what to write.
            let e = DType::parse(d.ggml_name().unwrap()).unwrap_err();
            assert!(e.contains(&format!("write `{name}`")), "{e}");
            let e = DType::parse(&name.replace('_', "")).unwrap_err();
            assert!(e.contains(&format!("write `{name}`")), "{e}");
            let t = format!("in buffer<{name}>");
            assert_eq!(OpParam::parse(&t), Ok(OpParam::Buffer { access: Access::In, dtype: d }));
        }
        for d in DType::ALL.into_iter().filter(|d| !d.is_block()) {
            assert_eq!((d.block_elems(), d.ggml_name()), (1, None));
        }
        assert_eq!(DType::ALL.iter().filter(|d| d.is_block()).count(), 10);
        // N × K = 4 × 512 values of q4_k: shape [4, 2], 8 elements of 144 bytes.
        assert_eq!(DType::Q4K.bytes_for_values(4 * 512), Some(8 * 144));
        assert_eq!(DType::Q4K.bytes_for_values(100), None, "not whole blocks");
        assert_eq!(DType::F32.bytes_for_values(3), Some(12));
        let e = DType::parse("Q4_K_M").unwrap_err();
        assert!(e.contains("a GGUF file's mix of tensor types"), "{e}");
        assert!(DType::parse("F8_E4M3").unwrap_err().contains("write `f8e4m3`"));
        assert!(DType::parse("BF16").unwrap_err().contains("write `bf16`"));
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::Bf16.size(), 2);
        assert_eq!(DType::F8e5m2.size(), 1);
        assert_eq!(KernelParam::Struct { size: 24, align: 8 }.align(), 8);
        assert_eq!(KernelParam::Scalar(Scalar::I16).align(), 2);
        assert_eq!(Value::F32(1.0).to_le_bytes(), 1.0f32.to_le_bytes());
        assert_eq!(Value::int(Scalar::U8, 256), None);
        assert_eq!(Value::int(Scalar::I32, -5), Some(Value::I32(-5)));
    }
}
