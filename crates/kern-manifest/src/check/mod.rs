//! [`RawManifest`] → [`Manifest`]: resolve every name, parse every expression, load every
//! module, and compare every launch with its kernel, collecting all diagnostics.
//!
//! The checker never stops early. Where a declaration is wrong it still produces a stand-in
//! (so that its users are checked too) and the error makes sure the stand-in never leaves:
//! a `Manifest` is returned only when no error was found. Where a stand-in would only cause
//! follow-on errors (a call to an op that could not be read), the user is skipped instead.

mod modules;
mod ops;
mod program;
mod speculative;
mod step;

use crate::decode::Broken;
use crate::diag::{did_you_mean, JsonPath, Sink};
use crate::expr::{Expr, FUNCTIONS};
use crate::manifest::*;
use crate::raw::{RawExpr, RawFrom, RawManifest, Role};
use crate::types::DType;
use crate::CheckOptions;
use std::path::Path;

pub(crate) struct Checker<'a> {
    raw: &'a RawManifest,
    broken: &'a Broken,
    opts: &'a CheckOptions,
    dir: &'a Path,
    sink: &'a mut Sink,
    names: Names,
    vars: Vec<Var>,
    /// Every var at its max, and every var at 1: the corners expressions are evaluated at.
    at_max: Vec<i64>,
    at_min: Vec<i64>,
    states: Vec<State>,
    buffers: Vec<Buffer>,
    /// `None` where the module could not be loaded (the error is reported).
    modules: Vec<Option<Module>>,
    modules_used: Vec<bool>,
    ops: Vec<Op>,
    /// The `parallel` section, when declared and valid.
    parallel: Option<Parallel>,
}

/// Checks a decoded manifest. `Err(())` when any error was reported into `sink`.
pub(crate) fn check(
    raw: &RawManifest,
    broken: &Broken,
    file: &Path,
    dir: &Path,
    opts: &CheckOptions,
    sink: &mut Sink,
) -> Option<Manifest> {
    let mut c = Checker {
        raw,
        broken,
        opts,
        dir,
        sink,
        names: Names::default(),
        vars: vec![],
        at_max: vec![],
        at_min: vec![],
        states: vec![],
        buffers: vec![],
        modules: vec![],
        modules_used: vec![],
        ops: vec![],
        parallel: None,
    };
    let root = JsonPath::root();
    if raw.model.trim().is_empty() {
        c.sink.error(
            &root.field("model"),
            "the model's name is empty: name the model",
        );
    }
    c.parallel();
    c.vars();
    c.states();
    c.buffers();
    c.modules();
    c.ops();
    let programs = c.programs();
    let step = c.step();
    let speculative = c.speculative(step.as_ref());
    // An op that could not be read may be the module's user: say nothing then.
    for (i, used) in c.modules_used.iter().enumerate() {
        if !used && broken.ops.is_empty() {
            let (name, _) = raw.modules.get_index(i).expect("one flag per module");
            c.sink.warn(
                &root.field("modules").entry(name, i),
                format!("no launch uses module `{name}`"),
            );
        }
    }
    if c.sink.error_count() > 0 {
        return None;
    }
    let modules = c.modules.into_iter().collect::<Option<Vec<_>>>()?;
    Some(Manifest {
        file: file.to_path_buf(),
        dir: dir.to_path_buf(),
        schema_version: raw.schema_version,
        model: raw.model.clone(),
        arch: opts.arch,
        vars: c.vars,
        states: c.states,
        buffers: c.buffers,
        modules,
        ops: c.ops,
        programs,
        step,
        warnings: vec![],
        parallel: c.parallel,
        speculative,
        batch_invariant: raw.batch_invariant,
        index: c.names,
    })
}

/// The largest tensor-parallel size `kern check` accepts.
pub(crate) const MAX_TP: u32 = 4096;
use crate::RANK_VAR as RANK;

fn is_ident(s: &str) -> bool {
    let mut ch = s.chars();
    ch.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && ch.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Checker<'_> {
    fn section(&self, name: &str) -> JsonPath {
        JsonPath::root().field(name)
    }

    /// Parses an expression, resolving var names (a var whose declaration was broken still
    /// resolves, to its stand-in, so its users are not also reported).
    fn expr(&mut self, raw: &RawExpr, path: &JsonPath) -> Option<Expr> {
        match raw {
            RawExpr::Int(i) => Some(Expr::constant(*i)),
            RawExpr::Text(t) => match Expr::parse(t, |n| self.names.vars.get(n).copied()) {
                Ok(e) => Some(e),
                Err(e) => {
                    let hint = match &e {
                        crate::expr::ParseError::UndeclaredVars { names, .. } => {
                            let declared: Vec<&str> =
                                self.vars.iter().map(|v| v.name.as_str()).collect();
                            let dym = did_you_mean(&names[0], declared.iter().copied());
                            if declared.is_empty() {
                                ": declare it in `vars` with its max".to_string()
                            } else if dym.is_empty() {
                                format!("; the declared vars are {}", declared.join(", "))
                            } else {
                                dym
                            }
                        }
                        _ => String::new(),
                    };
                    self.sink.error(path, format!("{e}{hint}"));
                    None
                }
            },
        }
    }

    /// Evaluates at the vars' max and at 1, reporting what goes wrong. Returns the value at
    /// max and at min.
    fn eval_corners(&mut self, e: &Expr, path: &JsonPath) -> Option<(i64, i64)> {
        let max = e
            .eval(&self.at_max)
            .map_err(|err| self.sink.error(path, format!("{err} at the vars' max")))
            .ok()?;
        let min = e
            .eval(&self.at_min)
            .map_err(|err| self.sink.error(path, format!("{err} when every var is 1")))
            .ok()?;
        Some((max, min))
    }

    fn parallel(&mut self) {
        let Some(par) = &self.raw.parallel else {
            return;
        };
        let p = self.section("parallel").field("tp");
        if par.tp == 0 || par.tp > MAX_TP {
            self.sink.error(
                &p,
                format!("the tensor-parallel size is 1 to {MAX_TP}, not {}", par.tp),
            );
            // A stand-in, so shards and collectives are still checked.
            self.parallel = Some(Parallel { tp: 1 });
        } else {
            self.parallel = Some(Parallel { tp: par.tp });
        }
    }

    /// A `shard` on a weight source: `base` is the tensor or concatenation it cuts; `axis` the
    /// concatenation's axis.
    fn shard(
        &mut self,
        sh: &crate::raw::RawShard,
        base: WeightSource,
        b: &crate::raw::RawBuffer,
        axis: Option<usize>,
        p: &JsonPath,
    ) -> WeightSource {
        let dim = sh.dim as usize;
        let Some(par) = self.parallel else {
            self.sink.error(p, "a shard is one rank's slice of a tensor: declare the ranks with \"parallel\": {\"tp\": N} at the top level");
            return base;
        };
        if dim >= b.shape.len() {
            self.sink.error(
                &p.field("dim"),
                format!("dimension {dim} does not exist: the buffer has {} dimensions", b.shape.len()),
            );
        } else if let Some(axis) = axis.filter(|&a| a != dim) {
            self.sink.error(&p.field("dim"), format!("a sharded concatenation is cut along its axis: set `dim` to {axis} (or shard the tensors of a concatenation along axis {dim})"));
        }
        if sh.parts == 0 {
            self.sink.error(&p.field("parts"), "a tensor is cut into at least 1 part");
        }
        let pp = p.field("part");
        let part = match &sh.part {
            RawExpr::Int(i) => Some(Expr::constant(*i)),
            RawExpr::Text(t) => match Expr::parse(t, |n| (n == RANK).then_some(0)) {
                Ok(e) => Some(e),
                Err(crate::expr::ParseError::UndeclaredVars { names, .. }) => {
                    self.sink.error(&pp, format!("`{}` is not known here: a shard's part is an expression over `{RANK}` (the rank, 0 to tp-1) alone", names[0]));
                    None
                }
                Err(e) => {
                    self.sink.error(&pp, e.to_string());
                    None
                }
            },
        };
        let Some(part) = part else { return base };
        let shard = Shard {
            dim,
            parts: u64::from(sh.parts),
            part,
        };
        if sh.parts > 0 {
            for rank in 0..par.tp {
                if let Err(e) = shard.part_for(rank) {
                    self.sink.error(&pp, format!("{e}: every rank of tp = {} needs a slice in 0..{}", par.tp, sh.parts));
                    break;
                }
            }
        }
        WeightSource::Shard {
            of: Box::new(base),
            shard,
        }
    }

    fn vars(&mut self) {
        let path = self.section("vars");
        for (i, (name, v)) in self.raw.vars.iter().enumerate() {
            let p = path.entry(name, i);
            if !is_ident(name) {
                self.sink.error(&p, format!("`{name}` cannot be a var name: expressions need a letter or `_` followed by letters, digits or `_`"));
            } else if FUNCTIONS.contains(&name.as_str()) {
                self.sink.error(
                    &p,
                    format!(
                        "`{name}` is an expression function and cannot be a var name: rename it"
                    ),
                );
            }
            let max = if v.max < 1 {
                self.sink.error(
                    &p.field("max"),
                    format!("a var's max is at least 1, not {}", v.max),
                );
                1
            } else {
                v.max
            };
            self.names.vars.insert(name.clone(), self.vars.len());
            self.vars.push(Var {
                name: name.clone(),
                max,
            });
        }
        // Stand-ins for vars whose declarations could not be read (already reported).
        for name in &self.broken.vars {
            self.names.vars.entry(name.clone()).or_insert_with(|| {
                self.vars.push(Var {
                    name: name.clone(),
                    max: 1,
                });
                self.vars.len() - 1
            });
        }
        self.at_max = self.vars.iter().map(|v| v.max).collect();
        self.at_min = vec![1; self.vars.len()];
    }

    fn states(&mut self) {
        let path = self.section("states");
        for (i, (name, s)) in self.raw.states.iter().enumerate() {
            let p = path.entry(name, i);
            let size = match (s.bytes_per_token, s.bytes_per_seq) {
                (Some(_), Some(_)) => {
                    self.sink.error(&p, "a state is either per token or per sequence: keep one of `bytes_per_token` and `bytes_per_seq`");
                    StateSize::PerSeq { bytes: 1, snapshot: false }
                }
                (None, None) => {
                    self.sink.error(&p, "a state needs its size: add `bytes_per_token` (a KV cache) or `bytes_per_seq` (a recurrent state)");
                    StateSize::PerSeq { bytes: 1, snapshot: false }
                }
                (Some(bytes), None) => {
                    let page_tokens = s.page_tokens.unwrap_or(crate::DEFAULT_PAGE_TOKENS);
                    if page_tokens == 0 {
                        self.sink
                            .error(&p.field("page_tokens"), "`page_tokens` is at least 1");
                    }
                    if s.snapshot {
                        self.sink.error(&p.field("snapshot"), "`snapshot` is for per-sequence states (a per-token state is cached page by page already): remove it from this per-token state");
                    }
                    StateSize::PerToken { bytes, page_tokens }
                }
                (None, Some(bytes)) => {
                    if s.page_tokens.is_some() {
                        self.sink.error(&p.field("page_tokens"), "`page_tokens` is for per-token states: remove it from this per-sequence state");
                    }
                    StateSize::PerSeq { bytes, snapshot: s.snapshot }
                }
            };
            let bytes = match size {
                StateSize::PerToken { bytes, .. } | StateSize::PerSeq { bytes, .. } => bytes,
            };
            if bytes == 0 {
                let f = if s.bytes_per_token.is_some() {
                    "bytes_per_token"
                } else {
                    "bytes_per_seq"
                };
                self.sink
                    .error(&p.field(f), "a state's size is at least 1 byte");
            }
            self.names.states.insert(name.clone(), self.states.len());
            self.states.push(State {
                name: name.clone(),
                size,
            });
        }
        // Snapshots are used only when every per-sequence state can be put back.
        let snap = |s: &State| match s.size {
            StateSize::PerSeq { snapshot, .. } => Some(snapshot),
            StateSize::PerToken { .. } => None,
        };
        if let Some(without) = self.states.iter().position(|s| snap(s) == Some(false)) {
            if self.states.iter().any(|s| snap(s) == Some(true)) {
                let name = self.states[without].name.clone();
                self.sink.warn(
                    &path.entry(&name, without),
                    format!("other per-sequence states declare `snapshot`, this one does not: the prefix cache needs all of a sequence's per-sequence state back, so it stays off for this model; add `\"snapshot\": true` here if a copy of `{name}`'s bytes at a prefix's end continues a sequence"),
                );
            }
        }
    }

    fn buffers(&mut self) {
        let path = self.section("buffers");
        for (i, (name, b)) in self.raw.buffers.iter().enumerate() {
            let p = path.entry(name, i);
            let role = b.role.unwrap_or(Role::Activation);
            let mut shape = Vec::with_capacity(b.shape.len());
            let mut bytes: Option<u64> = Some(b.dtype.size());
            for (d, dim) in b.shape.iter().enumerate() {
                let dp = p.field("shape").index(d);
                let Some(e) = self.expr(dim, &dp) else {
                    shape.push(Expr::constant(0));
                    bytes = None;
                    continue;
                };
                if role == Role::Weight && e.uses_vars() {
                    self.sink.error(
                        &dp,
                        format!("a weight's shape is fixed, but `{e}` uses vars: write the number"),
                    );
                }
                match self.eval_corners(&e, &dp) {
                    Some((max, min)) if max < 0 || min < 0 => {
                        let (v, when) = if max < 0 {
                            (max, "at the vars' max")
                        } else {
                            (min, "when every var is 1")
                        };
                        self.sink.error(
                            &dp,
                            format!("`{e}` is {v} {when}: a dimension cannot be negative"),
                        );
                        bytes = None;
                    }
                    Some((max, _)) => {
                        if let Some(b) = bytes {
                            bytes = b.checked_mul(max as u64);
                            if bytes.is_none() {
                                self.sink.error(
                                    &p.field("shape"),
                                    "the buffer's size at the vars' max does not fit in 64 bits",
                                );
                            }
                        }
                    }
                    None => bytes = None,
                }
                shape.push(e);
            }
            if b.dtype.is_block() && role != Role::Weight {
                self.sink.error(&p.field("dtype"), format!("`{}` is a block dtype (one element is a block of {} values, as the GGUF file stores it), for weights only, and this buffer's role is `{}`: set \"role\": \"weight\", or give it a plain dtype", b.dtype, b.dtype.block_elems(), role.name()));
            }
            let source = match (&b.from, role) {
                (Some(_), r) if r != Role::Weight => {
                    self.sink.error(&p.field("from"), format!("`from` is only for weights, and this buffer's role is `{}`: set \"role\": \"weight\" or remove `from`", r.name()));
                    None
                }
                (None, Role::Weight) => Some(WeightSource::Tensor(name.clone())),
                (Some(RawFrom::Tensor(t)), _) => {
                    if t.tensor.is_empty() {
                        self.sink
                            .error(&p.field("from").field("tensor"), "the tensor name is empty");
                    }
                    let base = WeightSource::Tensor(t.tensor.clone());
                    Some(match &t.shard {
                        Some(sh) => self.shard(sh, base, b, None, &p.field("from").field("shard")),
                        None => base,
                    })
                }
                (Some(RawFrom::Concat(c)), _) => {
                    let base = self.concat(c, b, &p.field("from"));
                    Some(match &c.shard {
                        Some(sh) => {
                            let axis = c.axis.unwrap_or(0) as usize;
                            self.shard(sh, base, b, Some(axis), &p.field("from").field("shard"))
                        }
                        None => base,
                    })
                }
                // Resolved once every buffer is known.
                (Some(RawFrom::Alias(_)), _) => Some(WeightSource::Alias(BufferId(usize::MAX))),
                (Some(RawFrom::Values(v)), _) => {
                    let elems = bytes.map(|n| n / b.dtype.size());
                    let vp = p.field("from").field("values");
                    if b.dtype.is_block() {
                        self.sink.error(&vp, format!("`values` cannot be written as {}: blocks come from a GGUF file (`tensor` or `concat`); give the buffer a plain dtype", b.dtype));
                        None
                    } else if elems != Some(v.values.len() as u64) {
                        let want = elems.map_or("a constant number of".into(), |n| n.to_string());
                        self.sink.error(&vp, format!("{} values for a buffer of {want} elements (its shape): give one value per element, row-major", v.values.len()));
                        None
                    } else {
                        match values_bytes(&v.values, b.dtype) {
                            Ok(bytes) => Some(WeightSource::Values(bytes)),
                            Err((i, why)) => {
                                self.sink.error(&vp.index(i), why);
                                None
                            }
                        }
                    }
                }
                (None, _) => None,
            };
            self.names.buffers.insert(name.clone(), self.buffers.len());
            self.buffers.push(Buffer {
                name: name.clone(),
                dtype: b.dtype,
                shape,
                role,
                source,
                bytes_at_max: bytes.unwrap_or(0),
            });
        }
        self.aliases();
    }

    fn concat(
        &mut self,
        c: &crate::raw::RawFromConcat,
        b: &crate::raw::RawBuffer,
        p: &JsonPath,
    ) -> WeightSource {
        let axis = c.axis.unwrap_or(0) as usize;
        if c.concat.is_empty() {
            self.sink
                .error(&p.field("concat"), "`concat` lists at least one tensor");
        }
        if axis >= b.shape.len() {
            self.sink.error(
                &p.field("axis"),
                format!(
                    "axis {axis} does not exist: the buffer has {} dimensions",
                    b.shape.len()
                ),
            );
        } else if let Some(sizes) = &c.sizes {
            if sizes.len() != c.concat.len() {
                self.sink.error(
                    &p.field("sizes"),
                    format!(
                        "`sizes` has {} entries for {} tensors: give one per tensor",
                        sizes.len(),
                        c.concat.len()
                    ),
                );
            } else if let RawExpr::Int(want) = b.shape[axis] {
                let sum = sizes.iter().try_fold(0u64, |a, s| a.checked_add(*s));
                if sum != u64::try_from(want).ok() {
                    let shown = sum.map_or("more than 2^64".into(), |s| s.to_string());
                    self.sink.error(
                        &p.field("sizes"),
                        format!("the parts add up to {shown} along axis {axis}, but the buffer's shape has {want} there: fix `sizes` or the shape"),
                    );
                }
            }
        }
        WeightSource::Concat {
            tensors: c.concat.clone(),
            axis,
            sizes: c.sizes.clone(),
        }
    }

    /// Resolves `{"alias": B}`: B must be a weight (not itself an alias) of the same dtype and
    /// shape.
    fn aliases(&mut self) {
        let path = self.section("buffers");
        for i in 0..self.buffers.len() {
            let Some(WeightSource::Alias(_)) = self.buffers[i].source else {
                continue;
            };
            let (name, raw) = self
                .raw
                .buffers
                .get_index(i)
                .expect("one buffer per raw buffer");
            let Some(RawFrom::Alias(a)) = &raw.from else {
                continue;
            };
            let p = path.entry(name, i).field("from").field("alias");
            let Some(&t) = self.names.buffers.get(&a.alias) else {
                if !self.broken.buffers.contains(&a.alias) {
                    let hint = did_you_mean(&a.alias, self.raw.buffers.keys().map(String::as_str));
                    self.sink.error(
                        &p,
                        format!(
                            "`{}` is not a buffer{hint}: an alias names another weight buffer",
                            a.alias
                        ),
                    );
                }
                continue;
            };
            let target = &self.buffers[t];
            let msg = if t == i {
                Some(
                    "a buffer cannot alias itself: name the weight it shares memory with"
                        .to_string(),
                )
            } else if target.role != Role::Weight {
                Some(format!(
                    "`{}` is not a weight (its role is `{}`): an alias shares a weight's memory",
                    a.alias,
                    target.role.name()
                ))
            } else if matches!(target.source, Some(WeightSource::Alias(_))) {
                Some(format!(
                    "`{}` is itself an alias: alias the buffer it aliases",
                    a.alias
                ))
            } else if target.dtype != self.buffers[i].dtype {
                Some(format!(
                    "`{}` is {} but this buffer is {}: an alias has the same dtype",
                    a.alias, target.dtype, self.buffers[i].dtype
                ))
            } else if target.shape != self.buffers[i].shape {
                let show = |s: &[Expr]| {
                    format!(
                        "[{}]",
                        s.iter()
                            .map(|e| e.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                Some(format!(
                    "`{}` has shape {} but this buffer has {}: an alias has the same shape",
                    a.alias,
                    show(&target.shape),
                    show(&self.buffers[i].shape)
                ))
            } else {
                None
            };
            match msg {
                Some(m) => self.sink.error(&p, m),
                None => self.buffers[i].source = Some(WeightSource::Alias(BufferId(t))),
            }
        }
    }
}

/// The largest dynamic + static shared memory one block may use, by SM (opt-in maximum).
pub(crate) fn max_shared_per_block(sm: u32) -> Option<u64> {
    Some(match sm {
        70 | 72 => 96 * 1024,
        75 => 64 * 1024,
        80 | 87 => 163 * 1024,
        86 | 89 | 120 | 121 => 99 * 1024,
        90 | 100 | 101 | 103 | 110 => 227 * 1024,
        _ => return None,
    })
}

/// `values` as the little-endian bytes of `dtype` (round to nearest even for the floats),
/// or the first value that does not fit, with why.
fn values_bytes(values: &[f64], dtype: DType) -> Result<Vec<u8>, (usize, String)> {
    let mut out = Vec::with_capacity(values.len() * dtype.size() as usize);
    for (i, &v) in values.iter().enumerate() {
        let whole = |lo: f64, hi: f64| -> Result<i128, (usize, String)> {
            if v.fract() != 0.0 || !(lo..=hi).contains(&v) {
                return Err((i, format!("{v} is not a whole number in the range of {}", dtype.name())));
            }
            Ok(v as i128)
        };
        match dtype {
            DType::F64 => out.extend(v.to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::Bf16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
            DType::I8 => out.extend((whole(-128.0, 127.0)? as i8).to_le_bytes()),
            DType::U8 | DType::Bool => out.extend((whole(0.0, 255.0)? as u8).to_le_bytes()),
            DType::I16 => out.extend((whole(-32768.0, 32767.0)? as i16).to_le_bytes()),
            DType::U16 => out.extend((whole(0.0, 65535.0)? as u16).to_le_bytes()),
            DType::I32 => out.extend((whole(-2147483648.0, 2147483647.0)? as i32).to_le_bytes()),
            DType::U32 => out.extend((whole(0.0, 4294967295.0)? as u32).to_le_bytes()),
            DType::I64 => out.extend((whole(-9.007199254740992e15, 9.007199254740992e15)? as i64).to_le_bytes()),
            DType::U64 => out.extend((whole(0.0, 9.007199254740992e15)? as u64).to_le_bytes()),
            DType::F8e4m3 | DType::F8e5m2 => {
                return Err((i, format!("`values` cannot be written as {}: give the buffer a wider dtype", dtype.name())))
            }
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => {
                return Err((i, format!("`values` cannot be written as {}: blocks come from a GGUF file", dtype.name())))
            }
        }
    }
    Ok(out)
}
