//! The `step` section (kern 4.1, step ABI 1): which buffers play the roles the engine fills
//! before a step and reads after it. Each role has a fixed dtype, shape (over the vars
//! `tokens`, `seqs` and `pages`) and direction; see `docs/step-abi.md`.

use super::Checker;
use crate::diag::{did_you_mean, JsonPath};
use crate::manifest::{BufferId, Sampling, StateId, StateSize, Step, TokenMask, VarId};
use crate::raw::Role;
use crate::types::DType;

/// Step ABI versions this kern reads.
pub const ABI_VERSIONS: &[u32] = &[1];

struct Spec {
    role: &'static str,
    dtype: DType,
    /// Dimensions over (tokens, seqs, pages); `None` is any constant (the vocabulary).
    shape: &'static [Dim],
    output: bool,
    required: bool,
}

#[derive(Clone, Copy)]
enum Dim {
    Tokens,
    Seqs,
    SeqsPlus1,
    Pages,
    AnyConst,
}

const SPECS: &[Spec] = &[
    Spec { role: "token_ids", dtype: DType::I32, shape: &[Dim::Tokens], output: false, required: true },
    Spec { role: "positions", dtype: DType::I32, shape: &[Dim::Tokens], output: false, required: true },
    Spec { role: "seq_lens", dtype: DType::I32, shape: &[Dim::Seqs], output: false, required: true },
    Spec { role: "query_start", dtype: DType::I32, shape: &[Dim::SeqsPlus1], output: false, required: true },
    Spec { role: "slot_mapping", dtype: DType::I32, shape: &[Dim::Tokens], output: false, required: true },
    Spec { role: "block_tables", dtype: DType::I32, shape: &[Dim::Seqs, Dim::Pages], output: false, required: true },
    Spec { role: "last_token", dtype: DType::I32, shape: &[Dim::Seqs], output: false, required: true },
    Spec { role: "seq_slots", dtype: DType::I32, shape: &[Dim::Seqs], output: false, required: false },
    Spec { role: "temperature", dtype: DType::F32, shape: &[Dim::Seqs], output: false, required: false },
    Spec { role: "top_k", dtype: DType::I32, shape: &[Dim::Seqs], output: false, required: false },
    Spec { role: "top_p", dtype: DType::F32, shape: &[Dim::Seqs], output: false, required: false },
    Spec { role: "seeds", dtype: DType::U64, shape: &[Dim::Seqs], output: false, required: false },
    Spec { role: "sampled", dtype: DType::I32, shape: &[Dim::Seqs], output: true, required: true },
    Spec { role: "logits", dtype: DType::F32, shape: &[Dim::Seqs, Dim::AnyConst], output: true, required: false },
    // Constrained decoding (docs/step-abi.md, "Token masks"): per row, -1 (no constraint) or the
    // row of `token_mask` that holds its allowed tokens as bits (ceil(vocab / 32) words).
    Spec { role: "token_mask", dtype: DType::U32, shape: &[Dim::Seqs, Dim::AnyConst], output: false, required: false },
    Spec { role: "mask_rows", dtype: DType::I32, shape: &[Dim::Seqs], output: false, required: false },
];

const SAMPLING: [&str; 4] = ["temperature", "top_k", "top_p", "seeds"];

/// Every role a checked step binds, with its buffer (the inverse of
/// [`Checker::assemble_step`]).
pub(super) fn step_roles(s: &Step) -> Vec<(&'static str, BufferId)> {
    let mut out = vec![
        ("token_ids", s.token_ids),
        ("positions", s.positions),
        ("seq_lens", s.seq_lens),
        ("query_start", s.query_start),
        ("slot_mapping", s.slot_mapping),
        ("block_tables", s.block_tables),
        ("last_token", s.last_token),
    ];
    out.extend(s.seq_slots.map(|b| ("seq_slots", b)));
    if let Some(x) = &s.sampling {
        out.extend([("temperature", x.temperature), ("top_k", x.top_k), ("top_p", x.top_p), ("seeds", x.seeds)]);
    }
    out.push(("sampled", s.sampled));
    out.extend(s.logits.map(|b| ("logits", b)));
    if let Some(t) = &s.token_mask {
        out.extend([("token_mask", t.mask), ("mask_rows", t.rows)]);
    }
    out
}

fn shape_text(s: &[Dim]) -> String {
    let d: Vec<&str> = s
        .iter()
        .map(|d| match d {
            Dim::Tokens => "tokens",
            Dim::Seqs => "seqs",
            Dim::SeqsPlus1 => "seqs+1",
            Dim::Pages => "pages",
            Dim::AnyConst => "VOCAB",
        })
        .collect();
    format!("[{}]", d.join(", "))
}

/// The step vars: `tokens`, `seqs`, `pages`.
pub(super) type StepVars = (VarId, VarId, VarId);

impl Checker<'_> {
    pub(super) fn step(&mut self) -> Option<Step> {
        let raw = self.raw.step.as_ref()?;
        let path = JsonPath::root().field("step");
        let mut ok = true;
        if !ABI_VERSIONS.contains(&raw.abi) {
            self.sink.error(&path.field("abi"), format!("step ABI {} is unknown: this kern reads ABI 1", raw.abi));
            ok = false;
        }
        let var = |name: &str, sink: &mut crate::diag::Sink| -> Option<VarId> {
            let id = self.names.vars.get(name).copied().map(VarId);
            if id.is_none() {
                sink.error(&path, format!("the step ABI sizes its buffers by the var `{name}`: declare it in `vars` (with its max)"));
            }
            id
        };
        let (tokens, seqs, pages) = (var("tokens", self.sink), var("seqs", self.sink), var("pages", self.sink));
        let vars = match (tokens, seqs, pages) {
            (Some(t), Some(s), Some(p)) => Some((t, s, p)),
            _ => None,
        };
        let bpath = path.field("buffers");
        let mut bound: Vec<(&'static str, BufferId)> = Vec::new();
        for (pos, (role, buf)) in raw.buffers.iter().enumerate() {
            match self.step_role(role, buf, &bpath.entry(role, pos), vars) {
                Some(b) => bound.push(b),
                None => ok = false,
            }
        }
        for s in SPECS.iter().filter(|s| s.required) {
            if !raw.buffers.contains_key(s.role) {
                self.sink.error(&bpath, format!("the step ABI role `{}` is not bound: add \"{}\": \"BUF\" (a {} {} {} buffer)", s.role, s.role, if s.output { "output" } else { "input" }, s.dtype.name(), shape_text(s.shape)));
                ok = false;
            }
        }
        ok &= self.sampling_together(|r| raw.buffers.contains_key(r), &bpath);
        ok &= self.mask_together(|r| raw.buffers.contains_key(r), &bpath);
        let kv = raw.kv.as_ref().and_then(|k| match self.names.states.get(k) {
            Some(&i) if matches!(self.states[i].size, StateSize::PerToken { .. }) => Some(StateId(i)),
            Some(_) => {
                self.sink.error(&path.field("kv"), format!("state `{k}` is per sequence: the step's kv must be a per-token (paged) state"));
                ok = false;
                None
            }
            None => {
                let hint = did_you_mean(k, self.names.states.keys().map(String::as_str));
                self.sink.error(&path.field("kv"), format!("no state `{k}`{hint}"));
                ok = false;
                None
            }
        });
        // A per-sequence state is indexed by the sequence's slot, which only `seq_slots` tells.
        if let Some(s) = self.states.iter().find(|s| matches!(s.size, StateSize::PerSeq { .. })) {
            if !raw.buffers.contains_key("seq_slots") {
                self.sink.error(&bpath, format!("state `{}` is per sequence, so its kernels need each sequence's slot: bind the step ABI role \"seq_slots\" to an input i32 [seqs] buffer", s.name));
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        self.assemble_step(raw.abi, vars?, &bound, kv)
    }

    /// Checks that `buf` may play the step ABI role `role` (binding at `p`): the role exists,
    /// the buffer exists, and its dtype, role and shape (when the step vars are known) are the
    /// role's. Reports every problem; the binding when there was none.
    pub(super) fn step_role(&mut self, role: &str, buf: &str, p: &JsonPath, vars: Option<StepVars>) -> Option<(&'static str, BufferId)> {
        let Some(spec) = SPECS.iter().find(|s| s.role == role) else {
            let hint = did_you_mean(role, SPECS.iter().map(|s| s.role));
            self.sink.error(p, format!("`{role}` is not a step ABI role{hint}"));
            return None;
        };
        let Some(&b) = self.names.buffers.get(buf) else {
            let hint = did_you_mean(buf, self.names.buffers.keys().map(String::as_str));
            self.sink.error(p, format!("no buffer `{buf}`{hint}: declare it in `buffers` as {} {}", spec.dtype.name(), shape_text(spec.shape)));
            return None;
        };
        let decl = &self.buffers[b];
        let want_role = if spec.output { Role::Output } else { Role::Input };
        let mut problems = Vec::new();
        if decl.dtype != spec.dtype {
            problems.push(format!("its dtype is {}, the ABI needs {}", decl.dtype.name(), spec.dtype.name()));
        }
        if decl.role != want_role {
            problems.push(format!("its role is {}, the ABI needs \"role\": \"{}\"", decl.role.name(), want_role.name()));
        }
        if let Some((t, s, pg)) = vars {
            if !self.shape_matches(b, spec.shape, t, s, pg) {
                let have: Vec<String> = decl.shape.iter().map(|e| e.to_string()).collect();
                problems.push(format!("its shape is [{}], the ABI needs {}", have.join(", "), shape_text(spec.shape)));
            }
        }
        if !problems.is_empty() {
            self.sink.error(p, format!("buffer `{buf}` cannot be the step's `{role}`: {}", problems.join("; ")));
            return None;
        }
        Some((spec.role, BufferId(b)))
    }

    /// The sampling roles come all together or not at all (`bound` says whether a role is
    /// bound). Reports at `p`; whether they do.
    pub(super) fn sampling_together(&mut self, bound: impl Fn(&str) -> bool, p: &JsonPath) -> bool {
        let given: Vec<&str> = SAMPLING.iter().copied().filter(|r| bound(r)).collect();
        if !given.is_empty() && given.len() != SAMPLING.len() {
            let missing: Vec<&str> = SAMPLING.iter().copied().filter(|r| !bound(r)).collect();
            self.sink.error(p, format!("sampling roles come together: {} bound but {} not", given.join(", "), missing.join(", ")));
            return false;
        }
        true
    }

    /// `token_mask` and `mask_rows` are bound both or neither.
    pub(super) fn mask_together(&mut self, bound: impl Fn(&str) -> bool, p: &JsonPath) -> bool {
        match (bound("token_mask"), bound("mask_rows")) {
            (true, false) | (false, true) => {
                let (given, missing) = if bound("token_mask") { ("token_mask", "mask_rows") } else { ("mask_rows", "token_mask") };
                self.sink.error(p, format!("token mask roles come together: {given} bound but {missing} not"));
                false
            }
            _ => true,
        }
    }

    /// A checked [`Step`] from role bindings already checked one by one, every required role
    /// among them and the sampling roles all or none.
    pub(super) fn assemble_step(&self, abi: u32, (tokens, seqs, pages): StepVars, bound: &[(&'static str, BufferId)], kv: Option<StateId>) -> Option<Step> {
        let get = |r: &str| bound.iter().find(|(k, _)| *k == r).map(|(_, b)| *b);
        let logits = get("logits");
        let vocab = logits.and_then(|b| self.buffers[b.0].shape.get(1).and_then(|e| e.as_const()));
        Some(Step {
            abi,
            tokens,
            seqs,
            pages,
            token_ids: get("token_ids")?,
            positions: get("positions")?,
            seq_lens: get("seq_lens")?,
            query_start: get("query_start")?,
            slot_mapping: get("slot_mapping")?,
            block_tables: get("block_tables")?,
            last_token: get("last_token")?,
            seq_slots: get("seq_slots"),
            sampling: match (get("temperature"), get("top_k"), get("top_p"), get("seeds")) {
                (Some(temperature), Some(top_k), Some(top_p), Some(seeds)) => Some(Sampling { temperature, top_k, top_p, seeds }),
                _ => None,
            },
            sampled: get("sampled")?,
            logits,
            vocab,
            token_mask: match (get("token_mask"), get("mask_rows")) {
                (Some(mask), Some(rows)) => {
                    let words = self.buffers[mask.0].shape.get(1).and_then(|e| e.as_const())?;
                    Some(TokenMask { mask, rows, words })
                }
                _ => None,
            },
            kv,
        })
    }

    /// Whether buffer `b`'s shape equals `want` at several var assignments (all at max, all at
    /// 1, and each of tokens / seqs / pages alone at its max).
    fn shape_matches(&self, b: usize, want: &[Dim], t: VarId, s: VarId, p: VarId) -> bool {
        let shape = &self.buffers[b].shape;
        if shape.len() != want.len() {
            return false;
        }
        let mut points = vec![self.at_max.clone(), self.at_min.clone()];
        for v in [t, s, p] {
            let mut x = self.at_min.clone();
            x[v.0] = self.at_max[v.0];
            points.push(x);
        }
        for vars in &points {
            for (e, d) in shape.iter().zip(want) {
                let Ok(got) = e.eval(vars) else { return false };
                let need = match d {
                    Dim::Tokens => vars[t.0],
                    Dim::Seqs => vars[s.0],
                    Dim::SeqsPlus1 => vars[s.0] + 1,
                    Dim::Pages => vars[p.0],
                    Dim::AnyConst => match e.as_const() {
                        Some(c) if c > 0 => c,
                        _ => return false,
                    },
                };
                if got != need {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `step_roles` lists every role of a step that binds them all, each with its buffer:
    /// a role added to `SPECS` and `Step` but not there would be lost from a draft's step.
    #[test]
    fn step_roles_lists_every_role() {
        let b = |r: &str| BufferId(SPECS.iter().position(|s| s.role == r).unwrap());
        let step = Step {
            abi: 1,
            tokens: VarId(0),
            seqs: VarId(1),
            pages: VarId(2),
            token_ids: b("token_ids"),
            positions: b("positions"),
            seq_lens: b("seq_lens"),
            query_start: b("query_start"),
            slot_mapping: b("slot_mapping"),
            block_tables: b("block_tables"),
            last_token: b("last_token"),
            seq_slots: Some(b("seq_slots")),
            sampling: Some(Sampling { temperature: b("temperature"), top_k: b("top_k"), top_p: b("top_p"), seeds: b("seeds") }),
            sampled: b("sampled"),
            logits: Some(b("logits")),
            vocab: Some(10),
            token_mask: Some(TokenMask { mask: b("token_mask"), rows: b("mask_rows"), words: 1 }),
            kv: None,
        };
        let roles = step_roles(&step);
        assert_eq!(roles.len(), SPECS.len());
        for s in SPECS {
            assert_eq!(roles.iter().find(|(r, _)| *r == s.role).map(|(_, id)| *id), Some(b(s.role)), "{}", s.role);
        }
    }
}
