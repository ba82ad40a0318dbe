//! The `speculative` section (kern 4.1, issue 18): a draft program, driven through the step
//! ABI with its own bindings, proposes `k` tokens that `main` then verifies.
//!
//! What makes a draft safe to run next to its target: it is another program than `main`; it
//! binds no state `main` binds (a draft writing the target's `kv` would corrupt it); every
//! state is per token (the pages of rejected tokens are released, a per-sequence state cannot
//! be rolled back); it writes its `sampled` buffer; and the buffers it reads from the target
//! (`reads`) are ones `main` writes. The program checks below read the raw calls, so their
//! paths are the calls' own (`programs.draft.calls[3].args[1].state`).

use super::step::step_roles;
use super::Checker;
use crate::diag::{did_you_mean, JsonPath};
use crate::manifest::{BufferId, Speculative, StateId, Step};
use crate::raw::{RawCallArg, RawManifest, RawProgram, Role};
use crate::types::{Access, OpParam};
use crate::MAIN_PROGRAM;
use std::collections::BTreeMap;

/// The most draft tokens one verify step checks.
pub(crate) const MAX_K: u32 = 16;

/// One resolved op-parameter binding of a raw call.
struct Bind<'r> {
    call: usize,
    arg: usize,
    raw: &'r RawCallArg,
    param: OpParam,
}

/// A program as written, with its name and JSON path.
struct Prog<'r> {
    name: &'r str,
    raw: &'r RawProgram,
    path: JsonPath,
}

impl<'a> Checker<'a> {
    pub(super) fn speculative(&mut self, step: Option<&Step>) -> Option<Speculative> {
        let manifest: &'a RawManifest = self.raw;
        let raw = manifest.speculative.as_ref()?;
        let root = JsonPath::root();
        let path = root.field("speculative");
        let mut ok = true;
        if raw.k == 0 || raw.k > MAX_K {
            self.sink.error(&path.field("k"), format!("a verify step checks 1 to {MAX_K} draft tokens, not {}", raw.k));
            ok = false;
        }
        // Read from the raw states: a broken declaration's stand-in is not the manifest's.
        for (i, (name, s)) in self.raw.states.iter().enumerate() {
            if s.bytes_per_seq.is_some() && s.bytes_per_token.is_none() {
                self.sink.error(&root.field("states").entry(name, i), format!("state `{name}` is per sequence, and speculative decoding needs every state per token: the tokens a verify step rejects are rolled back by releasing their pages, which a per-sequence state cannot undo (remove `speculative`, or page this state per token)"));
                ok = false;
            }
        }
        let draft = self.draft_program(&raw.draft, &path.field("draft"));
        ok &= draft.is_some();
        let main = self.target_program(&path);
        ok &= main.is_some();

        // The draft's step: the top-level bindings with the overrides applied, each override
        // checked like a `step` role.
        let mut roles = None;
        match (step, &self.raw.step) {
            (Some(top), _) => {
                let vars = (top.tokens, top.seqs, top.pages);
                let sp = path.field("step");
                let mut merged = step_roles(top);
                let mut overrides_ok = true;
                for (pos, (role, buf)) in raw.step.iter().enumerate() {
                    match self.step_role(role, buf, &sp.entry(role, pos), Some(vars)) {
                        Some((r, b)) => match merged.iter_mut().find(|(k, _)| *k == r) {
                            Some(slot) => slot.1 = b,
                            None => merged.push((r, b)),
                        },
                        None => overrides_ok = false,
                    }
                }
                // A rejected override is not merged: the sampling group would only repeat it.
                overrides_ok = overrides_ok && self.sampling_together(|r| merged.iter().any(|(k, _)| *k == r), &sp);
                ok &= overrides_ok;
                roles = overrides_ok.then_some((top, merged));
            }
            (None, None) => {
                self.sink.error(&path, "the draft program is driven through the step ABI: add the top-level `step` section (`speculative.step` only overrides some of its roles for the draft)");
                ok = false;
            }
            // The step section's own errors are reported.
            (None, Some(_)) => ok = false,
        }

        let draft_binds = draft.as_ref().map(|d| self.bindings(d.1.name, d.1.raw));
        let main_binds = main.as_ref().map(|m| self.bindings(m.name, m.raw));

        // The draft's states, and none of them `main`'s.
        let mut states: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        if let Some(binds) = &draft_binds {
            for b in binds {
                if let RawCallArg::State(n) = b.raw {
                    if let Some(&s) = self.names.states.get(n) {
                        states.entry(s).or_default().push((b.call, b.arg));
                    }
                }
            }
        }
        if let (Some((_, d)), Some(m), Some(mb)) = (&draft, &main, &main_binds) {
            for (&s, uses) in &states {
                let Some(first) = mb.iter().find(|b| matches!(b.raw, RawCallArg::State(n) if self.names.states.get(n) == Some(&s))) else {
                    continue;
                };
                let (call, arg) = uses[0];
                let more = match uses.len() - 1 {
                    0 => String::new(),
                    1 => " (and 1 more call of the draft)".into(),
                    n => format!(" (and {n} more calls of the draft)"),
                };
                let name = &self.states[s].name;
                let at = m.path.field("calls").index(first.call);
                self.sink.error(&d.path.field("calls").index(call).field("args").index(arg).field("state"), format!("state `{name}` is the target's (`{MAIN_PROGRAM}` binds it at {at}){more}: target and draft states are disjoint, since a draft writing the target's state would corrupt it; give the draft a state of its own (e.g. `draft_{name}`)"));
                ok = false;
            }
        }

        // `reads`: buffers `main` writes and the draft reads.
        let mut reads = Vec::with_capacity(raw.reads.len());
        for (i, name) in raw.reads.iter().enumerate() {
            let p = path.field("reads").index(i);
            let Some(&b) = self.names.buffers.get(name) else {
                if !self.broken.buffers.contains(name) {
                    let hint = did_you_mean(name, self.raw.buffers.keys().map(String::as_str));
                    self.sink.error(&p, format!("`{name}` is not a buffer{hint}: `reads` names buffers `{MAIN_PROGRAM}` writes and the draft program reads"));
                }
                ok = false;
                continue;
            };
            if raw.reads[..i].contains(name) {
                self.sink.error(&p, format!("`{name}` is listed twice in `reads`: remove one"));
                ok = false;
                continue;
            }
            if self.buffers[b].role == Role::Weight {
                self.sink.error(&p, format!("`{name}` is a weight, which both programs may read anyway: `reads` names buffers `{MAIN_PROGRAM}` writes (such as hidden states) and the draft reads"));
                ok = false;
                continue;
            }
            if let Some(mb) = &main_binds {
                if !self.binds_buffer(mb, b, Access::writes) {
                    self.sink.error(&p, format!("`{MAIN_PROGRAM}` never writes `{name}` (no call binds it to an `out` or `inout` parameter): the draft reads what the target computed"));
                    ok = false;
                }
            }
            if let (Some((_, d)), Some(db)) = (&draft, &draft_binds) {
                if !self.binds_buffer(db, b, Access::reads) {
                    self.sink.error(&p, format!("the draft program `{}` never reads `{name}` (no call binds it to an `in` or `inout` parameter): remove it from `reads`", d.name));
                    ok = false;
                }
            }
            reads.push(BufferId(b));
        }

        // The draft writes the `sampled` the engine reads its tokens from.
        if let (Some((_, d)), Some(db), Some((_, merged))) = (&draft, &draft_binds, &roles) {
            let sampled = merged.iter().find(|(r, _)| *r == "sampled").map(|(_, b)| *b).expect("a checked step binds `sampled`");
            if !self.binds_buffer(db, sampled.0, Access::writes) {
                let buf = &self.buffers[sampled.0].name;
                self.sink.error(&d.path, format!("the draft program never writes `{buf}`, its step's `sampled` (no call binds it to an `out` or `inout` parameter): the engine reads each draft token from it; write it, or bind the buffer the draft samples into with \"speculative\": {{\"step\": {{\"sampled\": \"BUF\"}}}}"));
                ok = false;
            }
        }

        if !ok {
            return None;
        }
        let (draft, _) = draft?;
        let (top, merged) = roles?;
        let states: Vec<StateId> = states.into_keys().map(StateId).collect();
        let kv = states.first().copied();
        let step = self.assemble_step(top.abi, (top.tokens, top.seqs, top.pages), &merged, kv)?;
        Some(Speculative { draft, k: raw.k, step, reads, states })
    }

    /// The draft program: its index in the checked programs, and as written.
    fn draft_program(&mut self, name: &str, p: &JsonPath) -> Option<(usize, Prog<'a>)> {
        if name == MAIN_PROGRAM {
            self.sink.error(p, format!("`{MAIN_PROGRAM}` is the target program, which verifies the drafts: the draft is another program in `programs`"));
            return None;
        }
        let raw: &'a RawManifest = self.raw;
        match (raw.programs.get_full(name), self.names.programs.get(name)) {
            (Some((pos, n, prog)), Some(&i)) => Some((i, Prog { name: n, raw: prog, path: JsonPath::root().field("programs").entry(n, pos) })),
            _ if self.broken.programs.contains(name) => None,
            _ => {
                let hint = did_you_mean(name, raw.programs.keys().map(String::as_str).filter(|n| *n != MAIN_PROGRAM));
                self.sink.error(p, format!("`{name}` is not a program{hint}: declare the draft program in `programs`"));
                None
            }
        }
    }

    /// The target program, `main`, as written. The engine steps `programs[0]`, so `main` must
    /// be it.
    fn target_program(&mut self, path: &JsonPath) -> Option<Prog<'a>> {
        let raw: &'a RawManifest = self.raw;
        let root = JsonPath::root();
        let found = match &raw.program {
            Some(p) => Some(Prog { name: MAIN_PROGRAM, raw: p, path: root.field("program") }),
            None => raw.programs.get_full(MAIN_PROGRAM).map(|(pos, n, p)| Prog { name: n, raw: p, path: root.field("programs").entry(n, pos) }),
        };
        match (found, self.names.programs.get(MAIN_PROGRAM)) {
            (Some(m), Some(0)) => Some(m),
            (Some(m), Some(_)) => {
                self.sink.error(&m.path, format!("with `speculative`, the target program `{MAIN_PROGRAM}` comes first (the engine steps the first program): write it as `program`"));
                None
            }
            _ if self.broken.programs.contains(MAIN_PROGRAM) => None,
            _ => {
                self.sink.error(path, format!("speculative decoding verifies the drafts with the program `{MAIN_PROGRAM}`: write the target program as `program`"));
                None
            }
        }
    }

    /// Every binding of a program's calls that resolved to an op with as many parameters (the
    /// others are reported by the program checks).
    fn bindings<'r>(&self, name: &str, prog: &'r RawProgram) -> Vec<Bind<'r>> {
        let mut out = vec![];
        for (i, c) in prog.calls.iter().enumerate() {
            if self.broken.calls.contains(&(name.to_string(), i)) {
                continue;
            }
            let Some(&op) = self.names.ops.get(&c.op) else { continue };
            let params = &self.ops[op].params;
            if params.len() != c.args.len() {
                continue;
            }
            for (j, (a, t)) in c.args.iter().zip(params).enumerate() {
                out.push(Bind { call: i, arg: j, raw: a, param: *t });
            }
        }
        out
    }

    /// Whether some binding passes buffer `b` to a buffer parameter whose access `want`s.
    fn binds_buffer(&self, binds: &[Bind], b: usize, want: fn(Access) -> bool) -> bool {
        binds.iter().any(|x| {
            matches!(x.raw, RawCallArg::Buf(n) if self.names.buffers.get(n) == Some(&b))
                && matches!(x.param, OpParam::Buffer { access, .. } if want(access))
        })
    }
}
