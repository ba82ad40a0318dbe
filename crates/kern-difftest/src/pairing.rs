//! From two checked manifests to what can be compared: which buffers are the same on both sides
//! (common buffers), each call's read / write sets, which ops pair up by name and signature,
//! and whether the two manifests can be compared at all. Pure; no GPU.

use crate::matching::{self, CallRw, Matching, Res};
use kern_manifest::manifest::{Binding, BufferId, Manifest, OpId, WeightSource};
use kern_manifest::{Access, DType, OpParam, Role};
use serde::Serialize;
use std::collections::HashMap;

/// A buffer both manifests declare alike: same name, dtype, shape (as written, over the same
/// vars) and role; for weights also the same source (tensor names, concat axis, alias target).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Common {
    pub name: String,
    #[serde(skip)]
    pub a: BufferId,
    #[serde(skip)]
    pub b: BufferId,
    #[serde(serialize_with = "ser_dtype")]
    pub dtype: DType,
    #[serde(skip)]
    pub role: Role,
}

fn ser_dtype<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}

/// An op both manifests declare with the same name and signature.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OpPair {
    pub name: String,
    #[serde(skip)]
    pub a: OpId,
    #[serde(skip)]
    pub b: OpId,
    /// Same kernels (module hashes, entries) and the same launch recipes on both sides.
    pub same_impl: bool,
}

/// Everything the GPU part needs, computed from the manifests alone.
#[derive(Debug)]
pub struct Analysis {
    pub commons: Vec<Common>,
    pub calls_a: Vec<CallRw>,
    pub calls_b: Vec<CallRw>,
    pub ops: Vec<OpPair>,
    /// Ops only A / only B declares (by name), and ops whose signatures differ.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
    pub signature_differs: Vec<String>,
    /// Buffers declared on both sides under one name that are not the same buffer (why).
    pub buffer_differs: Vec<String>,
    pub matching: Matching,
}

/// Why two manifests cannot be compared (exit code 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomparable(pub String);

impl std::fmt::Display for Incomparable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn source_key(m: &Manifest, s: &Option<WeightSource>) -> String {
    match s {
        None => "none".into(),
        Some(WeightSource::Tensor(t)) => format!("tensor {t}"),
        Some(WeightSource::Concat { tensors, axis, sizes }) => format!("concat {tensors:?} axis {axis} sizes {sizes:?}"),
        Some(WeightSource::Alias(b)) => format!("alias {}", m.buffers[b.0].name),
        // Equal bytes are the same weight.
        Some(WeightSource::Values(v)) => format!("values {}", v.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        Some(WeightSource::Shard { of, shard }) => {
            format!("shard {} dim {} of {} part {}", source_key(m, &Some((**of).clone())), shard.dim, shard.parts, shard.part)
        }
    }
}

fn shape_key(m: &Manifest, b: BufferId) -> String {
    let s: Vec<String> = m.buffers[b.0].shape.iter().map(|e| e.to_string()).collect();
    format!("[{}]", s.join(", "))
}

/// The calls of program 0 (`main`) as read / write sets over `res(buffer)`. Buffers bound to
/// typed op parameters are read (`in`), written (`out`) or both (`inout`); a buffer bound to an
/// untyped `ptr` parameter is taken as read for weights and inputs and as read and written
/// otherwise. States are not part of the matching (their layout belongs to the kernels).
pub fn call_rw(m: &Manifest, res: impl Fn(BufferId) -> Res) -> Vec<CallRw> {
    let Some(p) = m.programs.first() else { return vec![] };
    p.calls
        .iter()
        .map(|c| {
            let op = &m.ops[c.op.0];
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            for (j, b) in c.args.iter().enumerate() {
                let Binding::Buf(id) = b else { continue };
                let id = match &m.buffers[id.0].source {
                    Some(WeightSource::Alias(t)) => *t,
                    _ => *id,
                };
                let access = match op.params.get(j) {
                    Some(OpParam::Buffer { access, .. }) => *access,
                    Some(OpParam::Ptr) => match m.buffers[id.0].role {
                        Role::Weight | Role::Input => Access::In,
                        _ => Access::InOut,
                    },
                    _ => continue,
                };
                if access.reads() {
                    reads.push(res(id));
                }
                if access.writes() {
                    writes.push(res(id));
                }
            }
            CallRw { label: c.label.clone(), op: op.name.clone(), reads, writes }
        })
        .collect()
}

fn launch_key(m: &Manifest, op: OpId) -> String {
    let o = &m.ops[op.0];
    let parts: Vec<String> = o
        .launches
        .iter()
        .map(|l| {
            format!(
                "{}:{} grid {:?} block {:?} shared {} args {:?}",
                m.modules[l.module.0].sha256,
                l.entry,
                l.grid.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                l.block.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                l.shared,
                l.args
            )
        })
        .collect();
    parts.join("; ")
}

/// Compares the two manifests' declarations and matches their programs.
pub fn analyze(a: &Manifest, b: &Manifest) -> Result<Analysis, Incomparable> {
    // Vars: the same names (values are set once for both).
    let mut va: Vec<&str> = a.vars.iter().map(|v| v.name.as_str()).collect();
    let mut vb: Vec<&str> = b.vars.iter().map(|v| v.name.as_str()).collect();
    va.sort();
    vb.sort();
    if va != vb {
        return Err(Incomparable(format!(
            "the manifests declare different vars (A: {}; B: {}): both must size their buffers by the same vars",
            va.join(", "),
            vb.join(", ")
        )));
    }
    match (&a.step, &b.step) {
        (Some(sa), Some(sb)) => {
            if sa.vocab != sb.vocab {
                return Err(Incomparable(format!("step.logits: A's vocabulary is {:?}, B's {:?}: not the same model", sa.vocab, sb.vocab)));
            }
            let pt = |m: &Manifest| {
                m.states.iter().find_map(|s| match s.size {
                    kern_manifest::StateSize::PerToken { page_tokens, .. } => Some(page_tokens),
                    _ => None,
                })
            };
            if pt(a) != pt(b) {
                return Err(Incomparable(format!(
                    "states: A pages its per-token state by {:?} tokens, B by {:?}: one block table must serve both, give them the same page_tokens",
                    pt(a),
                    pt(b)
                )));
            }
        }
        (None, None) => {}
        (sa, _) => {
            let (has, lacks) = if sa.is_some() { ("A", "B") } else { ("B", "A") };
            return Err(Incomparable(format!("{has} binds the step ABI (`step`), {lacks} does not: both or neither must, so both run the same steps")));
        }
    }
    // Common buffers.
    let mut commons = Vec::new();
    let mut buffer_differs = Vec::new();
    let mut ci_a: HashMap<usize, usize> = HashMap::new();
    let mut ci_b: HashMap<usize, usize> = HashMap::new();
    for (i, ba) in a.buffers.iter().enumerate() {
        let Some(jb) = b.buffer(&ba.name) else { continue };
        let bb = &b.buffers[jb.0];
        let (sa, sb) = (shape_key(a, BufferId(i)), shape_key(b, jb));
        let why = if ba.dtype != bb.dtype {
            Some(format!("dtype {} vs {}", ba.dtype, bb.dtype))
        } else if sa != sb {
            Some(format!("shape {sa} vs {sb}"))
        } else if ba.role != bb.role {
            Some(format!("role {:?} vs {:?}", ba.role, bb.role))
        } else if source_key(a, &ba.source) != source_key(b, &bb.source) {
            Some(format!("weight source {} vs {}", source_key(a, &ba.source), source_key(b, &bb.source)))
        } else {
            None
        };
        match why {
            Some(w) => buffer_differs.push(format!("buffers.{}: {w}", ba.name)),
            None => {
                ci_a.insert(i, commons.len());
                ci_b.insert(jb.0, commons.len());
                commons.push(Common { name: ba.name.clone(), a: BufferId(i), b: jb, dtype: ba.dtype, role: ba.role });
            }
        }
    }
    let calls_a = call_rw(a, |id| ci_a.get(&id.0).map_or(Res::Own(id.0), |&c| Res::Common(c)));
    let calls_b = call_rw(b, |id| ci_b.get(&id.0).map_or(Res::Own(id.0), |&c| Res::Common(c)));
    // Ops.
    let (mut ops, mut only_a, mut only_b, mut signature_differs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, oa) in a.ops.iter().enumerate() {
        match b.op(&oa.name) {
            Some(j) if b.ops[j.0].params == oa.params => {
                ops.push(OpPair { name: oa.name.clone(), a: OpId(i), b: j, same_impl: launch_key(a, OpId(i)) == launch_key(b, j) });
            }
            Some(_) => signature_differs.push(oa.name.clone()),
            None => only_a.push(oa.name.clone()),
        }
    }
    for ob in &b.ops {
        if a.op(&ob.name).is_none() {
            only_b.push(ob.name.clone());
        }
    }
    let matching = matching::match_programs(&calls_a, &calls_b).map_err(|e| Incomparable(format!("{}: {}", "the programs cannot be matched", e.0)))?;
    Ok(Analysis { commons, calls_a, calls_b, ops, only_a, only_b, signature_differs, buffer_differs, matching })
}
