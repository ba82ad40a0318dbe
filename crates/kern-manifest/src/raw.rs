//! The manifest as written: one type per JSON object of the schema.
//!
//! These types are what the JSON Schema (`schema/manifest.schema.json`) is generated from, and
//! what a manifest generator builds and serializes. They are read by `decode` (which
//! reports every unknown field and type error with its path) and hold only what the JSON says:
//! names are not resolved and expressions are not parsed until `check` turns a
//! `RawManifest` into a [`crate::Manifest`].
//!
//! Doc comments here become the schema's descriptions. "kern 4.1" marks fields that schema
//! version 4 (seed `000` §7) does not have; a manifest using them declares
//! `"schema_version": "4.1"`.

use crate::types::{DType, KernelParam, OpParam};
use indexmap::IndexMap;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Serialize, Serializer};
use std::borrow::Cow;

/// A kern model manifest: vars, states, buffers, modules, ops and programs.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "kern model manifest")]
pub struct RawManifest {
    /// A JSON Schema reference for editors; kern ignores it.
    #[serde(rename = "$schema", skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// `4` (seed §7), or `"4.1"` for a manifest that uses kern 4.1 extensions.
    pub schema_version: SchemaVersion,
    /// The model's name.
    pub model: String,
    /// Integer variables of one program run (`tokens`, `seqs`) with their upper bounds; shapes,
    /// grids and blocks are expressions over them.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub vars: IndexMap<String, RawVar>,
    /// Per-token or per-sequence state pools (KV cache, recurrent state).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub states: IndexMap<String, RawState>,
    /// Every buffer one program run uses: weights, activations, step inputs and outputs.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub buffers: IndexMap<String, RawBuffer>,
    /// Where kernels come from: device binaries with their sha256.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub modules: IndexMap<String, RawModule>,
    /// Typed operations, each implemented by one or more kernel launches.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub ops: IndexMap<String, RawOp>,
    /// The main program: a chain of op calls (named `main`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<RawProgram>,
    /// More named programs (e.g. `prefill`, `decode`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub programs: IndexMap<String, RawProgram>,
    /// kern 4.1 (step ABI 1, docs/step-abi.md): which buffers the engine fills before a step
    /// and reads after it, for serving (`kern generate`, `kern serve`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<RawStep>,
    /// kern 4.1 (issue 17, docs/tensor-parallel.md): tensor parallelism. The manifest then
    /// describes one rank of `tp`; weights may take a shard of a checkpoint tensor (`shard`,
    /// with the rank in scope as `rank`) and ops may be collectives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel: Option<RawParallel>,
    /// kern 4.1 (issue 18, docs/step-abi.md "Draft programs"): speculative decoding with a
    /// draft program. Names the program in `programs` that drafts tokens, how many per verify
    /// step, its own step bindings and the target buffers it reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<RawSpeculative>,
    /// kern 4.1 (issue 29, docs/batch-invariance.md): the pack's claim that every launch gives a
    /// row the same bits whatever else is in its step and however its prompt was cut. The engine
    /// takes it as declared; `kern serve --batch-invariant` refuses a manifest without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch_invariant: bool,
}

/// kern 4.1 (issue 18): a draft program for speculative decoding. The draft proposes `k`
/// tokens greedily, driven through the step ABI like the main program; `main` verifies them.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSpeculative {
    /// The draft program: a name in `programs`, not `main`. It binds states of its own (e.g.
    /// `draft_kv`), never one that `main` binds.
    pub draft: String,
    /// Draft tokens per verify step, 1 to 16 (the engine's default; a flag may lower it).
    #[schemars(range(min = 1, max = 16))]
    pub k: u32,
    /// Step ABI role → buffer name for the draft program, overriding the top-level `step`
    /// section's `buffers` (default: none; roles not named use the top-level buffers).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub step: IndexMap<String, String>,
    /// Buffers `main` writes and the draft program reads (e.g. hidden states for EAGLE-style
    /// drafts). Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<String>,
}

/// kern 4.1 (issue 17): how the model is split across GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawParallel {
    /// The tensor-parallel size: how many ranks (GPUs) run the program together, each with its
    /// own shard of the weights. At least 1. The rank (`0..tp`) is the value of `rank` in shard
    /// expressions.
    #[schemars(range(min = 1))]
    pub tp: u32,
}

/// kern 4.1 (issue 17): one rank's part of a checkpoint tensor: the tensor cut along `dim`
/// into `parts` equal slices, slice `part` taken.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawShard {
    /// The dimension the tensor is cut along (0 = outermost). For a concatenation it must be
    /// the concatenation's `axis`.
    pub dim: u32,
    /// How many equal slices; the tensor's extent along `dim` must divide by it.
    #[schemars(range(min = 1))]
    pub parts: u32,
    /// Which slice, `0..parts`: an integer or an expression over `rank` (e.g. `"rank"`, or
    /// `"rank / 2"` for a slice two ranks share).
    pub part: RawExpr,
}

/// kern 4.1 (issue 17): a collective operation, run by the engine through NCCL across the
/// `parallel` ranks instead of kernel launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// Params `["inout buffer<T>"]`: every rank's buffer becomes the element-wise sum over the
    /// ranks (in place; the whole buffer at the run's var values).
    AllReduceSum,
    /// Params `["out buffer<T>", "in buffer<T>"]`: `out` becomes every rank's `in`, laid end to
    /// end in rank order (`out` holds `tp` times `in`'s elements).
    AllGather,
}

impl Collective {
    pub const ALL: [Collective; 2] = [Collective::AllReduceSum, Collective::AllGather];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduceSum => "all_reduce_sum",
            Collective::AllGather => "all_gather",
        }
    }
}

/// kern 4.1: the step ABI binding — ABI role → buffer name.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    /// The step ABI version (1).
    pub abi: u32,
    /// ABI role (`token_ids`, `positions`, `seq_lens`, `query_start`, `slot_mapping`,
    /// `block_tables`, `last_token`, `seq_slots`, `temperature`, `top_k`, `top_p`, `seeds`, `sampled`,
    /// `logits`) → the name of the buffer that plays it.
    pub buffers: IndexMap<String, String>,
    /// The per-token state that `slot_mapping` and `block_tables` page (the KV cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv: Option<String>,
}

/// The schema version a manifest is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SchemaVersion {
    /// `4`: seed `000` §7.
    V4,
    /// `"4.1"`: kern's extensions of issue 3 (dynamic shared memory, null pointers, `ptr` and
    /// `state` parameters, by-value aggregates, buffer roles and weight sources, `page_tokens`,
    /// launch labels).
    V4_1,
}

impl SchemaVersion {
    /// The newest version this kern reads.
    pub const LATEST: SchemaVersion = SchemaVersion::V4_1;

    pub fn as_str(self) -> &'static str {
        match self {
            SchemaVersion::V4 => "4",
            SchemaVersion::V4_1 => "4.1",
        }
    }
}

impl Serialize for SchemaVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SchemaVersion::V4 => s.serialize_u64(4),
            SchemaVersion::V4_1 => s.serialize_str("4.1"),
        }
    }
}

impl JsonSchema for SchemaVersion {
    fn schema_name() -> Cow<'static, str> {
        "SchemaVersion".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "`4` (seed §7) or `\"4.1\"` (kern extensions).",
            "enum": [4, "4.1"]
        })
    }
}

/// An integer variable of a program run.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawVar {
    /// The largest value the var takes; buffers are sized for it. At least 1.
    #[schemars(range(min = 1))]
    pub max: i64,
}

/// A state pool: exactly one of `bytes_per_token` and `bytes_per_seq`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["bytes_per_token"] }, { "required": ["bytes_per_seq"] }]))]
pub struct RawState {
    /// Bytes of state per cached token (a KV cache: all layers, K and V).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub bytes_per_token: Option<u64>,
    /// Bytes of state per sequence (a recurrent state).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub bytes_per_seq: Option<u64>,
    /// kern 4.1: tokens per page of a per-token pool (default 16).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub page_tokens: Option<u32>,
    /// kern 4.1, per-sequence states only: the state's bytes at the end of a prefix are all a
    /// sequence needs to continue after it, from any slot (default false). The engine may then
    /// keep copies of them (snapshots) at page boundaries of cached prefixes and copy one into a
    /// sequence's slot instead of computing the prefix again (docs/kv-cache.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
}

/// A buffer of one program run.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBuffer {
    pub dtype: DType,
    /// Dimensions, outermost first; each an integer or an expression over vars.
    pub shape: Vec<RawExpr>,
    /// kern 4.1: what the buffer is for (default `activation`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// kern 4.1: for a weight, where its contents come from (default: the checkpoint tensor
    /// with the buffer's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<RawFrom>,
}

/// What a buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Loaded from the checkpoint once; read-only while programs run.
    Weight,
    /// Scratch of one run (the default).
    Activation,
    /// Filled by the engine before a run (token ids, positions, block tables).
    Input,
    /// Read by the engine after a run (logits, sampled ids).
    Output,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Weight => "weight",
            Role::Activation => "activation",
            Role::Input => "input",
            Role::Output => "output",
        }
    }
}

/// Where a weight's contents come from.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RawFrom {
    /// One checkpoint tensor.
    Tensor(RawFromTensor),
    /// Several checkpoint tensors concatenated along an axis (a fused QKV weight).
    Concat(RawFromConcat),
    /// The same memory as another weight buffer (tied embeddings).
    Alias(RawFromAlias),
    /// kern 4.1: the values themselves, written in the manifest (a small table the manifest's
    /// author computes, such as RoPE frequencies).
    Values(RawFromValues),
}

/// `{"values": [NUMBER, …]}`: every element of the buffer, row-major, converted to its dtype
/// (round to nearest even for bf16 / f16; integers must be whole and in range).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFromValues {
    /// The elements, row-major; as many as the buffer's shape holds.
    pub values: Vec<f64>,
}

/// `{"tensor": NAME}` (kern 4.1, issue 17: with an optional `shard`).
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFromTensor {
    /// The checkpoint tensor's name.
    pub tensor: String,
    /// kern 4.1 (issue 17): take one rank's slice of the tensor (needs `parallel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<RawShard>,
}

/// `{"concat": [NAME, …], "axis": N, "sizes": [N, …]}`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFromConcat {
    /// Checkpoint tensor names, in order.
    pub concat: Vec<String>,
    /// The axis they are concatenated along (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub axis: Option<u32>,
    /// Each part's extent along `axis`; when given, they must add up to the buffer's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sizes: Option<Vec<u64>>,
    /// kern 4.1 (issue 17): shard every tensor along `axis` before concatenating (a fused
    /// column-parallel QKV: this rank's q, k and v heads); `sizes` are then the shards' extents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<RawShard>,
}

/// `{"alias": BUFFER}`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawFromAlias {
    /// Another weight buffer with the same dtype and shape.
    pub alias: String,
}

/// An integer expression: a number, or text over vars such as `"ceil(tokens/64)"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum RawExpr {
    Int(i64),
    Text(String),
}

impl std::fmt::Display for RawExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawExpr::Int(i) => write!(f, "{i}"),
            RawExpr::Text(t) => f.write_str(t),
        }
    }
}

/// A device binary holding kernels.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawModule {
    /// A path relative to the manifest's directory (never leaving it), or
    /// `hf:ORG/REPO/PATH`, read from the local Hugging Face cache.
    pub source: String,
    /// SHA-256 of the file, 64 lowercase hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

/// An operation: a typed signature and the launches that implement it.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawOp {
    /// The op's parameters, which program calls bind.
    pub params: Vec<OpParam>,
    #[serde(rename = "impl")]
    pub implementation: RawImpl,
}

/// How an op runs: kernel launches, or (kern 4.1, issue 17) a collective.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{ "required": ["launches"] }, { "required": ["collective"] }]))]
pub struct RawImpl {
    /// Kernel launches, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub launches: Vec<RawLaunch>,
    /// kern 4.1 (issue 17): a collective across the `parallel` ranks, run through NCCL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collective: Option<Collective>,
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLaunch {
    /// kern 4.1: a name for this launch in reports and diffs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// A key of `modules`.
    pub module: String,
    /// The kernel's symbol in the module (mangled, as in the binary).
    pub entry: String,
    /// The kernel's own parameters, in order.
    pub params: Vec<KernelParam>,
    /// Threads per block: 1 to 3 expressions (missing dimensions are 1).
    pub block: Vec<RawExpr>,
    /// Blocks per grid: 1 to 3 expressions (missing dimensions are 1).
    pub grid: Vec<RawExpr>,
    /// kern 4.1: dynamic shared memory in bytes (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<RawExpr>,
    /// kern 4.1: Programmatic Dependent Launch (default false): the launch may start before the
    /// kernel before it in the stream has finished. Declare it only for a kernel that executes
    /// `griddepcontrol.wait` (`cudaGridDependencySynchronize`) before it reads what earlier
    /// launches wrote and before it writes anything they may still read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pdl: bool,
    /// One value per kernel parameter.
    pub args: Vec<RawLaunchArg>,
}

/// A typed constant: `{"i64": 2560}`, `{"f32": 1e-6}`, `{"bool": true}`.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RawConst {
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    /// Kept as written (a JSON number); rounded to f32 when checked.
    F32(f64),
    F64(f64),
    Bool(bool),
}

/// The value `true`, the only value `{"null": …}` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct True;

impl Serialize for True {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(true)
    }
}

impl JsonSchema for True {
    fn schema_name() -> Cow<'static, str> {
        "True".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "const": true })
    }
}

/// The value a launch passes for one kernel parameter.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RawLaunchArg {
    /// The op's parameter at this index.
    Param(u32),
    /// kern 4.1: a null pointer (for a pointer parameter the kernel does not use, such as
    /// Triton's scratch pointers).
    Null(True),
    /// kern 4.1: a by-value aggregate, built from fields at byte offsets; bytes no field
    /// covers are zero.
    Struct(Vec<RawField>),
    /// A typed constant.
    #[serde(untagged)]
    Const(RawConst),
}

/// One field of a by-value aggregate: `{"offset": 8, "param": 3}`, `{"offset": 0, "i64": 5}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RawField {
    /// Byte offset of the field in the aggregate.
    pub offset: u32,
    #[serde(flatten)]
    pub value: RawFieldValue,
}

/// What a field holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RawFieldValue {
    /// The op's parameter at this index (a pointer is 8 bytes, a scalar its width).
    Param(u32),
    /// A null pointer (8 bytes).
    Null(True),
    #[serde(untagged)]
    Const(RawConst),
}

/// A chain of op calls.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProgram {
    pub calls: Vec<RawCall>,
}

/// One op call.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCall {
    /// A name unique within the program (default: `OP#INDEX`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// A key of `ops`.
    pub op: String,
    /// One binding per op parameter.
    pub args: Vec<RawCallArg>,
}

/// What a call binds to one op parameter.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RawCallArg {
    /// A buffer, by name.
    Buf(String),
    /// A var's value in this run, for an integer parameter.
    Var(String),
    /// kern 4.1: a state pool, for a `state` or `ptr` parameter.
    State(String),
    /// kern 4.1: a null pointer, for a `ptr` parameter.
    Null(True),
    /// A typed constant.
    #[serde(untagged)]
    Const(RawConst),
}

impl Serialize for OpParam {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

const SCALAR_PATTERN: &str = "i8|i16|i32|i64|u8|u16|u32|u64|f32|f64|bool";
/// `(in|out|inout) +buffer<(bf16|…|q6_k)>`: every dtype kern names.
fn buffer_pattern() -> String {
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    format!("(in|out|inout) +buffer<({})>", names.join("|"))
}

impl JsonSchema for OpParam {
    fn schema_name() -> Cow<'static, str> {
        "OpParam".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An op parameter type: `in|out|inout buffer<DTYPE>`, a scalar (i8 … f64, bool), or (kern 4.1) `ptr` or `state`.",
            "type": "string",
            "pattern": format!("^ *({}|{SCALAR_PATTERN}|ptr|state) *$", buffer_pattern())
        })
    }
}

impl Serialize for KernelParam {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self {
            KernelParam::Struct { size, align } => {
                #[derive(Serialize)]
                struct Layout {
                    size: u32,
                    align: u32,
                }
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(
                    "struct",
                    &Layout {
                        size: *size,
                        align: *align,
                    },
                )?;
                m.end()
            }
            other => s.collect_str(other),
        }
    }
}

impl JsonSchema for KernelParam {
    fn schema_name() -> Cow<'static, str> {
        "KernelParam".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A kernel parameter type: `in|out|inout buffer<DTYPE>`, a scalar, (kern 4.1) `ptr`, or (kern 4.1) a by-value aggregate `{\"struct\": {\"size\": N, \"align\": A}}`.",
            "oneOf": [
                {
                    "type": "string",
                    "pattern": format!("^ *({}|{SCALAR_PATTERN}|ptr) *$", buffer_pattern())
                },
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["struct"],
                    "properties": {
                        "struct": {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["size", "align"],
                            "properties": {
                                "size": { "description": "Bytes.", "type": "integer", "minimum": 1 },
                                "align": { "description": "Alignment in bytes: a power of two, at most 256.", "type": "integer", "minimum": 1 }
                            }
                        }
                    }
                }
            ]
        })
    }
}

impl JsonSchema for RawField {
    fn schema_name() -> Cow<'static, str> {
        "RawField".into()
    }
    // Written by hand: a field is `offset` plus exactly one value key, which derived schemas
    // of a flattened enum cannot say.
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut props = serde_json::Map::new();
        props.insert("offset".into(), serde_json::json!({"description": "Byte offset of the field in the aggregate.", "type": "integer", "minimum": 0}));
        props.insert("param".into(), serde_json::json!({"description": "The op's parameter at this index (a pointer is 8 bytes, a scalar its width).", "type": "integer", "minimum": 0}));
        props.insert(
            "null".into(),
            serde_json::json!({"description": "A null pointer (8 bytes).", "const": true}),
        );
        for (name, min, max) in [
            ("i8", i8::MIN as i128, i8::MAX as i128),
            ("i16", i16::MIN.into(), i16::MAX.into()),
            ("i32", i32::MIN.into(), i32::MAX.into()),
            ("i64", i64::MIN.into(), i64::MAX.into()),
            ("u8", 0, u8::MAX.into()),
            ("u16", 0, u16::MAX.into()),
            ("u32", 0, u32::MAX.into()),
            ("u64", 0, u64::MAX.into()),
        ] {
            props.insert(
                name.into(),
                serde_json::json!({"type": "integer", "minimum": min, "maximum": max}),
            );
        }
        props.insert("f32".into(), serde_json::json!({"type": "number"}));
        props.insert("f64".into(), serde_json::json!({"type": "number"}));
        props.insert("bool".into(), serde_json::json!({"type": "boolean"}));
        json_schema!({
            "description": "One field of a by-value aggregate: `offset` and exactly one value (`param`, `null`, or a typed constant such as `i64`).",
            "type": "object",
            "required": ["offset"],
            "properties": props,
            "additionalProperties": false,
            "minProperties": 2,
            "maxProperties": 2
        })
    }
}
