//! The checked manifest: what the runtime accepts.
//!
//! A [`Manifest`] exists only when `kern check` found no error: every name is resolved to an
//! index, every expression parsed and known to use declared vars only, every parameter type
//! parsed, every module loaded, hashed and parsed, and every launch's parameter layout agreed
//! with the kernel image. Fields are public for reading; a `Manifest` is built only by
//! [`crate::load`] / [`crate::check_bytes`], so holding one means those facts hold.

use crate::diag::Diagnostic;
use crate::expr::Expr;
use crate::raw::{Collective, Role, SchemaVersion};
use crate::types::{DType, KernelParam, OpParam, Value};
use kern_binary::{Arch, Binary, Image, Kernel};
use std::collections::HashMap;
use std::path::PathBuf;

/// Index of a var in [`Manifest::vars`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub usize);
/// Index of a state in [`Manifest::states`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateId(pub usize);
/// Index of a buffer in [`Manifest::buffers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub usize);
/// Index of a module in [`Manifest::modules`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub usize);
/// Index of an op in [`Manifest::ops`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub usize);

/// A checked manifest. Vectors keep the manifest's declaration order.
#[derive(Debug)]
pub struct Manifest {
    /// The manifest file, as given.
    pub file: PathBuf,
    /// The directory module paths are relative to.
    pub dir: PathBuf,
    pub schema_version: SchemaVersion,
    pub model: String,
    /// The architecture the kernels were checked for (their images are selected for it).
    pub arch: Arch,
    pub vars: Vec<Var>,
    pub states: Vec<State>,
    pub buffers: Vec<Buffer>,
    pub modules: Vec<Module>,
    pub ops: Vec<Op>,
    /// `program` (named `main`) first, then `programs` in order.
    pub programs: Vec<Program>,
    /// The step ABI binding, when the manifest declares one (`step`).
    pub step: Option<Step>,
    /// What `kern check` warned about (the manifest is usable).
    pub warnings: Vec<Diagnostic>,
    /// Tensor parallelism (`parallel`, issue 17): `None` for a single-GPU manifest.
    pub parallel: Option<Parallel>,
    /// Speculative decoding with a draft program (`speculative`, issue 18).
    pub speculative: Option<Speculative>,
    /// The pack declares its program batch-invariant (`batch_invariant`, issue 29).
    pub batch_invariant: bool,
    pub(crate) index: Names,
}

/// The `speculative` section (issue 18): a draft program proposes `k` tokens per verify step,
/// driven through the step ABI with its own bindings; the target program `main` (always
/// `programs[0]`) verifies them. `kern check` has verified that the draft's states are its own
/// (disjoint from those `main` binds), every state of the manifest is per token, and the draft
/// writes its `step.sampled`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculative {
    /// Index into Manifest::programs of the draft program.
    pub draft: usize,
    /// Draft tokens per verify step (1 to 16).
    pub k: u32,
    /// The draft program's step bindings: the top-level `step` with the overrides applied.
    /// Its `kv` is the first per-token state the draft binds (e.g. `draft_kv`), `None` when it
    /// binds none; it shares the block table with the target's.
    pub step: Step,
    /// Buffers `main` writes and the draft program reads (e.g. hidden states), in the
    /// manifest's order.
    pub reads: Vec<BufferId>,
    /// The states the draft program binds (its own, e.g. draft_kv), in declaration order.
    pub states: Vec<StateId>,
}

/// The `parallel` section: the manifest describes one rank of `tp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallel {
    /// The tensor-parallel size (≥ 1).
    pub tp: u32,
}

impl Manifest {
    /// The tensor-parallel size: 1 without a `parallel` section.
    pub fn tp(&self) -> u32 {
        self.parallel.map_or(1, |p| p.tp)
    }

    /// Whether any state is per sequence.
    pub fn has_per_seq_state(&self) -> bool {
        self.states.iter().any(|s| matches!(s.size, StateSize::PerSeq { .. }))
    }

    /// Whether the prefix cache may keep snapshots of the per-sequence states: there is at least
    /// one, and every one declares `"snapshot": true` (a cached prefix can continue a sequence
    /// only if all of its per-sequence state can be put back).
    pub fn per_seq_snapshots(&self) -> bool {
        self.has_per_seq_state() && self.states.iter().all(|s| !matches!(s.size, StateSize::PerSeq { snapshot: false, .. }))
    }

    /// Whether any op is a collective (the runtime must run it through NCCL).
    pub fn has_collectives(&self) -> bool {
        self.ops.iter().any(|o| o.collective.is_some())
    }
}

/// One rank's slice of a checkpoint tensor: cut along `dim` into `parts` equal slices, slice
/// `part` (an expression over the rank: `part.eval(&[rank])`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub dim: usize,
    pub parts: u64,
    /// Parsed with one var, the rank (index 0); `kern check` verified it lies in `0..parts`
    /// for every rank `0..tp`.
    pub part: Expr,
}

impl Shard {
    /// The slice rank `rank` takes (0 when the expression cannot be evaluated, which `kern
    /// check` rules out for every rank of the manifest's `tp`).
    pub fn part_for(&self, rank: u32) -> Result<u64, String> {
        let v = self
            .part
            .eval(&[i64::from(rank)])
            .map_err(|e| format!("shard part `{}` at rank {rank}: {e}", self.part))?;
        u64::try_from(v)
            .ok()
            .filter(|&p| p < self.parts)
            .ok_or_else(|| format!("shard part `{}` is {v} at rank {rank}, outside 0..{}", self.part, self.parts))
    }
}

/// Name → index maps.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub vars: HashMap<String, usize>,
    pub states: HashMap<String, usize>,
    pub buffers: HashMap<String, usize>,
    pub modules: HashMap<String, usize>,
    pub ops: HashMap<String, usize>,
    pub programs: HashMap<String, usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Var {
    pub name: String,
    /// The largest value (≥ 1). A run's value is in `1..=max`.
    pub max: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub name: String,
    pub size: StateSize,
}

impl State {
    /// Bytes per sequence of a per-sequence state that may be snapshotted.
    pub fn snapshot_bytes(&self) -> Option<u64> {
        match self.size {
            StateSize::PerSeq { bytes, snapshot: true } => Some(bytes),
            _ => None,
        }
    }
}

/// How a state pool grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSize {
    /// `bytes` per cached token, allocated in pages of `page_tokens` tokens.
    PerToken { bytes: u64, page_tokens: u32 },
    /// `bytes` per sequence. `snapshot`: the manifest declares that a copy of a sequence's
    /// bytes at a prefix's end continues the sequence from any slot (the prefix cache may keep
    /// such copies at page boundaries: docs/kv-cache.md).
    PerSeq { bytes: u64, snapshot: bool },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub dtype: DType,
    /// Dimensions, outermost first. A weight's are constants.
    pub shape: Vec<Expr>,
    pub role: Role,
    /// For weights: where the contents come from.
    pub source: Option<WeightSource>,
    /// Size at every var's max.
    pub bytes_at_max: u64,
}

/// Where a weight's contents come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// One checkpoint tensor.
    Tensor(String),
    /// Checkpoint tensors concatenated along `axis`; `sizes` (each part's extent along the axis)
    /// when the manifest gives them.
    Concat {
        tensors: Vec<String>,
        axis: usize,
        sizes: Option<Vec<u64>>,
    },
    /// The same memory as another weight (tied embeddings); that weight has its own source.
    Alias(BufferId),
    /// One rank's slice (issue 17): `of` is a `Tensor` (sliced along `shard.dim`) or a
    /// `Concat` (every tensor sliced along the concatenation axis, `shard.dim`, then
    /// concatenated; `sizes` are the slices' extents).
    Shard { of: Box<WeightSource>, shard: Shard },
    /// kern 4.1: the buffer's bytes, given in the manifest (`{"values": […]}`), already in the
    /// buffer's dtype (little-endian, row-major); no checkpoint tensor is read.
    Values(Vec<u8>),
}

/// Where a module was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleSource {
    /// A path relative to the manifest's directory, as written.
    Local(String),
    /// `hf:ORG/REPO/PATH`, found in the local Hugging Face cache.
    HuggingFace { repo: String, path: String },
}

#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub source: ModuleSource,
    /// The file that was read (for a Hugging Face source, inside the cache's snapshot).
    pub path: PathBuf,
    /// The file's SHA-256, lowercase hex (equal to the manifest's).
    pub sha256: String,
    /// The file's size in bytes.
    pub file_bytes: u64,
    /// Everything in the file. The image the runtime loads is [`Module::image`].
    pub binary: Binary,
    /// Index in `binary.images` of the image selected for [`Manifest::arch`].
    pub image: usize,
}

impl Module {
    /// The image kern loads (`cuModuleLoadData` takes `image().data`).
    pub fn image(&self) -> &Image {
        &self.binary.images[self.image]
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub name: String,
    pub params: Vec<OpParam>,
    /// Empty for a collective.
    pub launches: Vec<Launch>,
    /// A collective across the ranks (issue 17), run through NCCL instead of launches.
    pub collective: Option<Collective>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub label: Option<String>,
    pub module: ModuleId,
    /// The kernel symbol.
    pub entry: String,
    /// Index of the kernel in the module's selected image (`image().kernels[kernel]`).
    pub kernel: usize,
    /// The kernel's parameters with their layout (equal to the image's KPARAM_INFO).
    pub params: Vec<LaunchParam>,
    /// Bytes of the parameter buffer (end of the last parameter).
    pub param_bytes: u32,
    /// x, y, z.
    pub block: [Expr; 3],
    pub grid: [Expr; 3],
    /// Dynamic shared memory bytes.
    pub shared: Expr,
    /// Programmatic Dependent Launch: may start before the previous kernel in the stream ends
    /// (the kernel waits with `griddepcontrol.wait` itself; docs/manifest.md).
    pub pdl: bool,
    /// One per parameter.
    pub args: Vec<LaunchArg>,
}

impl Launch {
    /// The kernel this launch runs, in `module`'s selected image.
    pub fn kernel_in<'m>(&self, m: &'m Manifest) -> &'m Kernel {
        &m.modules[self.module.0].image().kernels[self.kernel]
    }

    /// Whether the launch runs at `vars`: a grid dimension of 0 or less skips it
    /// (docs/manifest.md; the executor's rule), checked in x, y, z order.
    pub fn runs(&self, vars: &[i64]) -> Result<bool, crate::expr::EvalError> {
        for g in &self.grid {
            if g.eval(vars)? <= 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// One kernel parameter and where it goes in the parameter buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchParam {
    pub ty: KernelParam,
    pub offset: u32,
    pub size: u32,
}

/// What a launch passes for one kernel parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchArg {
    /// The op parameter at this index.
    Param(usize),
    Const(Value),
    /// A null pointer (8 zero bytes).
    Null,
    /// A by-value aggregate: these fields over zeroed bytes.
    Struct(Vec<Field>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Byte offset inside the aggregate.
    pub offset: u32,
    pub value: FieldValue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FieldValue {
    /// The op parameter at this index (a pointer: 8 bytes; a scalar: its width).
    Param(usize),
    Const(Value),
    Null,
}

/// The step ABI (version 1, `docs/step-abi.md`): the buffers the engine fills before each step
/// and reads after it, checked for dtype, shape and role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub abi: u32,
    /// The vars `tokens`, `seqs` and `pages`.
    pub tokens: VarId,
    pub seqs: VarId,
    pub pages: VarId,
    pub token_ids: BufferId,
    pub positions: BufferId,
    pub seq_lens: BufferId,
    pub query_start: BufferId,
    pub slot_mapping: BufferId,
    pub block_tables: BufferId,
    pub last_token: BufferId,
    /// `[seqs]` i32: each sequence's slot in the per-sequence state pools (needed when the
    /// manifest declares a per-sequence state).
    pub seq_slots: Option<BufferId>,
    /// Per-sequence sampling parameters, when the program samples.
    pub sampling: Option<Sampling>,
    pub sampled: BufferId,
    /// `[seqs, vocab]` f32 last-position logits, when the program exposes them.
    pub logits: Option<BufferId>,
    /// The vocabulary size (the logits' second dimension), when `logits` is bound.
    pub vocab: Option<i64>,
    /// The per-row token masks the sampler honours (constrained decoding), when bound.
    pub token_mask: Option<TokenMask>,
    /// The per-token state paged by `slot_mapping` / `block_tables`.
    pub kv: Option<StateId>,
}

/// The step's token-mask inputs (docs/step-abi.md, "Token masks"): `mask` `[seqs, words]` u32
/// bitmasks, `rows` `[seqs]` i32 (-1: the row is free, else its row of `mask`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenMask {
    pub mask: BufferId,
    pub rows: BufferId,
    /// u32 words per mask row: ceil(vocab / 32).
    pub words: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    pub temperature: BufferId,
    pub top_k: BufferId,
    pub top_p: BufferId,
    pub seeds: BufferId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: String,
    pub calls: Vec<Call>,
}

impl Program {
    /// Kernel launches in one run of this program.
    pub fn launches(&self, m: &Manifest) -> usize {
        self.calls
            .iter()
            .map(|c| m.ops[c.op.0].launches.len())
            .sum()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Unique within the program (`OP#INDEX` when the manifest gives none).
    pub label: String,
    pub op: OpId,
    /// One per op parameter.
    pub args: Vec<Binding>,
}

/// What a call binds to one op parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Binding {
    Buf(BufferId),
    /// The var's value in this run.
    Var(VarId),
    /// The state pool's base pointer.
    State(StateId),
    Const(Value),
    /// A null pointer.
    Null,
}

impl Manifest {
    pub fn var(&self, name: &str) -> Option<VarId> {
        self.index.vars.get(name).copied().map(VarId)
    }
    pub fn state(&self, name: &str) -> Option<StateId> {
        self.index.states.get(name).copied().map(StateId)
    }
    pub fn buffer(&self, name: &str) -> Option<BufferId> {
        self.index.buffers.get(name).copied().map(BufferId)
    }
    pub fn module(&self, name: &str) -> Option<ModuleId> {
        self.index.modules.get(name).copied().map(ModuleId)
    }
    pub fn op(&self, name: &str) -> Option<OpId> {
        self.index.ops.get(name).copied().map(OpId)
    }
    /// A program by name (`main` is the one written as `program`).
    pub fn program(&self, name: &str) -> Option<&Program> {
        self.index.programs.get(name).map(|&i| &self.programs[i])
    }

    /// Every var at its max, indexed like `vars`: the values buffers are sized for.
    pub fn vars_at_max(&self) -> Vec<i64> {
        self.vars.iter().map(|v| v.max).collect()
    }

    /// A buffer's size in bytes for the given var values.
    pub fn buffer_bytes(&self, b: BufferId, vars: &[i64]) -> Result<u64, crate::expr::EvalError> {
        let buf = &self.buffers[b.0];
        let overflow =
            || crate::expr::EvalError::Overflow(format!("the size of buffer `{}`", buf.name));
        self.shape(b, vars)?
            .into_iter()
            .try_fold(buf.dtype.size(), |acc, d| {
                acc.checked_mul(u64::try_from(d).map_err(|_| overflow())?)
                    .ok_or_else(overflow)
            })
    }

    /// A buffer's shape for the given var values.
    pub fn shape(&self, b: BufferId, vars: &[i64]) -> Result<Vec<i64>, crate::expr::EvalError> {
        self.buffers[b.0]
            .shape
            .iter()
            .map(|e| e.eval(vars))
            .collect()
    }
}
