//! Programs: each call names an op and binds every op parameter to a buffer, var, state or
//! constant of the right kind. Also warns about activations read before anything wrote them.

use super::ops::{const_example, value};
use super::Checker;
use crate::diag::{did_you_mean, JsonPath};
use crate::manifest::*;
use crate::raw::{RawCallArg, RawProgram, Role};
use crate::types::{Access, OpParam};
use std::collections::{HashMap, HashSet};

impl Checker<'_> {
    pub(super) fn programs(&mut self) -> Vec<Program> {
        let root = JsonPath::root();
        let mut out = vec![];
        if self.raw.program.is_none()
            && self.raw.programs.is_empty()
            && self.broken.programs.is_empty()
        {
            self.sink.error(
                &root,
                "the manifest has no program: add \"program\": {\"calls\": […]}",
            );
        }
        if let Some(p) = &self.raw.program {
            let prog = self.program(crate::MAIN_PROGRAM, p, &root.field("program"));
            self.names.programs.insert(prog.name.clone(), out.len());
            out.push(prog);
        }
        for (i, (name, p)) in self.raw.programs.iter().enumerate() {
            let path = root.field("programs").entry(name, i);
            if name == crate::MAIN_PROGRAM && self.raw.program.is_some() {
                self.sink.error(
                    &path,
                    format!("`{name}` is the name of `program`: rename this one"),
                );
                continue;
            }
            let prog = self.program(name, p, &path);
            self.names.programs.insert(prog.name.clone(), out.len());
            out.push(prog);
        }
        out
    }

    fn program(&mut self, name: &str, raw: &RawProgram, p: &JsonPath) -> Program {
        let mut calls = vec![];
        let mut labels: HashMap<String, usize> = HashMap::new();
        for (i, c) in raw.calls.iter().enumerate() {
            if self.broken.calls.contains(&(name.to_string(), i)) {
                continue;
            }
            let cp = p.field("calls").index(i);
            let label = c.label.clone().unwrap_or_else(|| format!("{}#{i}", c.op));
            if let Some(first) = labels.get(&label) {
                self.sink.error(&cp.field("label"), format!("calls[{first}] already has the label `{label}`: labels are unique within a program"));
            } else {
                labels.insert(label.clone(), i);
            }
            let Some(&op) = self.names.ops.get(&c.op) else {
                if !self.broken.ops.contains(&c.op) {
                    let hint = did_you_mean(&c.op, self.raw.ops.keys().map(String::as_str));
                    self.sink.error(
                        &cp.field("op"),
                        format!("`{}` is not an op{hint}: declare it in `ops`", c.op),
                    );
                }
                continue;
            };
            let params = self.ops[op].params.clone();
            if c.args.len() != params.len() {
                let sig: Vec<String> = params.iter().map(|t| t.to_string()).collect();
                self.sink.error(
                    &cp.field("args"),
                    format!(
                        "`{}` takes {} arguments ({}), the call gives {}",
                        c.op,
                        params.len(),
                        sig.join(", "),
                        c.args.len()
                    ),
                );
                continue;
            }
            let mut args = Vec::with_capacity(params.len());
            let mut ok = true;
            for (j, (a, t)) in c.args.iter().zip(&params).enumerate() {
                match self.binding(a, t, &c.op, j, &cp.field("args").index(j)) {
                    Some(b) => args.push(b),
                    None => ok = false,
                }
            }
            if !ok {
                continue;
            }
            if self.ops[op].collective == Some(crate::raw::Collective::AllGather) {
                self.all_gather(&args, &cp.field("args"));
            }
            calls.push((
                i,
                Call {
                    label,
                    op: OpId(op),
                    args,
                },
            ));
        }
        // A draft program reads buffers the target wrote (`speculative.reads`).
        let filled: HashSet<usize> = match &self.raw.speculative {
            Some(s) if s.draft == name => s.reads.iter().filter_map(|r| self.names.buffers.get(r).copied()).collect(),
            _ => HashSet::new(),
        };
        self.dataflow(&calls, p, &filled);
        Program {
            name: name.to_string(),
            calls: calls.into_iter().map(|(_, c)| c).collect(),
        }
    }

    /// An all-gather's `out` holds `tp` times `in`'s elements (at every var's max and at 1), and
    /// is another buffer.
    fn all_gather(&mut self, args: &[Binding], p: &JsonPath) {
        let (Some(Binding::Buf(out)), Some(Binding::Buf(inp))) = (args.first(), args.get(1)) else {
            return;
        };
        // Without `parallel` the op has been reported already.
        let Some(par) = self.parallel else { return };
        let tp = i128::from(par.tp);
        if out == inp {
            self.sink.error(p, "an all-gather writes every rank's part into `out`: bind another buffer than `in`");
            return;
        }
        for (vars, when) in [(&self.at_max, "at the vars' max"), (&self.at_min, "when every var is 1")] {
            let elems = |b: &Buffer| -> Option<i128> {
                b.shape.iter().try_fold(1i128, |acc, e| Some(acc * i128::from(e.eval(vars).ok()?)))
            };
            let (o, i) = (&self.buffers[out.0], &self.buffers[inp.0]);
            if let (Some(eo), Some(ei)) = (elems(o), elems(i)) {
                if eo != tp * ei {
                    self.sink.error(&p.index(0), format!("`{}` has {eo} elements {when}, and an all-gather over tp = {tp} of `{}` ({ei} elements) fills {}: size `out` to tp × `in`", o.name, i.name, tp * ei));
                    return;
                }
            }
        }
    }

    fn binding(
        &mut self,
        a: &RawCallArg,
        t: &OpParam,
        op: &str,
        j: usize,
        p: &JsonPath,
    ) -> Option<Binding> {
        let wanted = match t {
            OpParam::Buffer { dtype, .. } => {
                format!("bind {{\"buf\": NAME}} with a buffer of {dtype}")
            }
            OpParam::Ptr => "bind a buffer, a state or {\"null\": true}".into(),
            OpParam::State => "bind {\"state\": NAME}".into(),
            OpParam::Scalar(s) if s.int_range().is_some() => {
                format!("bind {{\"var\": NAME}} or {}", const_example(*s))
            }
            OpParam::Scalar(s) => format!("bind {}", const_example(*s)),
        };
        let this = format!("params[{j}] of `{op}` is `{t}`");
        match a {
            RawCallArg::Buf(name) => {
                let Some(&b) = self.names.buffers.get(name) else {
                    if !self.broken.buffers.contains(name) {
                        let hint = did_you_mean(name, self.raw.buffers.keys().map(String::as_str));
                        self.sink.error(
                            &p.field("buf"),
                            format!("`{name}` is not a buffer{hint}: declare it in `buffers`"),
                        );
                    }
                    return None;
                };
                let buf = &self.buffers[b];
                match t {
                    OpParam::Buffer { access, dtype } => {
                        if buf.dtype != *dtype {
                            self.sink.error(
                                p,
                                format!(
                                    "`{name}` is {} but {this}: bind a buffer of {dtype}",
                                    buf.dtype
                                ),
                            );
                            return None;
                        }
                        if access.writes() && buf.role == Role::Weight {
                            self.sink.error(p, format!("`{name}` is a weight, which programs only read, but {this}: bind an activation or output buffer"));
                            return None;
                        }
                        Some(Binding::Buf(BufferId(b)))
                    }
                    OpParam::Ptr => Some(Binding::Buf(BufferId(b))),
                    _ => {
                        self.sink
                            .error(p, format!("{this}, not a buffer: {wanted}"));
                        None
                    }
                }
            }
            RawCallArg::Var(name) => {
                let Some(&v) = self.names.vars.get(name) else {
                    if !self.broken.vars.contains(name) {
                        let hint = did_you_mean(name, self.raw.vars.keys().map(String::as_str));
                        self.sink.error(
                            &p.field("var"),
                            format!("`{name}` is not a var{hint}: declare it in `vars`"),
                        );
                    }
                    return None;
                };
                match t {
                    OpParam::Scalar(s) => {
                        match s.int_range() {
                            Some((_, hi)) if i128::from(self.vars[v].max) <= hi => {
                                Some(Binding::Var(VarId(v)))
                            }
                            Some(_) => {
                                self.sink.error(p, format!("var `{name}` goes up to {}, which does not fit in {s}: {this}", self.vars[v].max));
                                None
                            }
                            None => {
                                self.sink
                                    .error(p, format!("a var is an integer but {this}: {wanted}"));
                                None
                            }
                        }
                    }
                    _ => {
                        self.sink
                            .error(p, format!("{this}, not an integer: {wanted}"));
                        None
                    }
                }
            }
            RawCallArg::State(name) => {
                let Some(&s) = self.names.states.get(name) else {
                    if !self.broken.states.contains(name) {
                        let hint = did_you_mean(name, self.raw.states.keys().map(String::as_str));
                        self.sink.error(
                            &p.field("state"),
                            format!("`{name}` is not a state{hint}: declare it in `states`"),
                        );
                    }
                    return None;
                };
                match t {
                    OpParam::State | OpParam::Ptr => Some(Binding::State(StateId(s))),
                    _ => {
                        self.sink.error(p, format!("{this}, not a state: {wanted}"));
                        None
                    }
                }
            }
            RawCallArg::Null(_) => match t {
                OpParam::Ptr => Some(Binding::Null),
                _ => {
                    self.sink.error(
                        p,
                        format!("{{\"null\": true}} is for `ptr` parameters, but {this}: {wanted}"),
                    );
                    None
                }
            },
            RawCallArg::Const(c) => {
                let v = value(c);
                match t {
                    OpParam::Scalar(s) if *s == v.scalar() => Some(Binding::Const(v)),
                    OpParam::Scalar(s) => {
                        self.sink.error(p, format!("{this} and this constant is {}: constants are typed exactly, write {}", v.scalar(), const_example(*s)));
                        None
                    }
                    _ => {
                        self.sink
                            .error(p, format!("{this}, not a scalar: {wanted}"));
                        None
                    }
                }
            }
        }
    }

    /// Warns about an activation or output read before the call that first writes it, about
    /// one declared `activation`/`output` that no call writes, and about an output bound to
    /// two parameters of one call. Buffers a v4 manifest leaves without a role and never
    /// writes are taken to be filled from outside (weights, inputs) and not warned about, as
    /// are those in `filled` (a draft program's `speculative.reads`, which the target writes).
    fn dataflow(&mut self, calls: &[(usize, Call)], p: &JsonPath, filled: &HashSet<usize>) {
        let access = |t: &OpParam| match t {
            OpParam::Buffer { access, .. } => Some(*access),
            _ => None,
        };
        let mut first_write: HashMap<usize, usize> = HashMap::new();
        for (i, c) in calls {
            for (a, t) in c.args.iter().zip(&self.ops[c.op.0].params) {
                if let (Binding::Buf(b), Some(acc)) = (a, access(t)) {
                    if acc.writes() {
                        first_write.entry(b.0).or_insert(*i);
                    }
                }
            }
        }
        let mut warned: HashSet<usize> = HashSet::new();
        for (i, c) in calls {
            let op = &self.ops[c.op.0];
            let ap = p.field("calls").index(*i).field("args");
            for (j, (a, t)) in c.args.iter().zip(&op.params).enumerate() {
                let (Binding::Buf(b), Some(acc)) = (a, access(t)) else {
                    continue;
                };
                let buf = &self.buffers[b.0];
                let explicit = self
                    .raw
                    .buffers
                    .get_index(b.0)
                    .is_some_and(|(_, r)| r.role.is_some());
                if acc.reads()
                    && matches!(buf.role, Role::Activation | Role::Output)
                    && !warned.contains(&b.0)
                    && !filled.contains(&b.0)
                {
                    let msg = match first_write.get(&b.0) {
                        Some(&w) if w > *i => Some(format!("`{}` is read here before calls[{w}] first writes it: is the program out of order?", buf.name)),
                        Some(&w) if w == *i && acc == Access::In => None,
                        Some(_) => None,
                        None if explicit => Some(format!("`{}` is an {} that no call writes: should its role be `input` or `weight`?", buf.name, buf.role.name())),
                        None => None,
                    };
                    if let Some(m) = msg {
                        warned.insert(b.0);
                        self.sink.warn(&ap.index(j), m);
                    }
                }
                if acc.writes() {
                    let other = c
                        .args
                        .iter()
                        .enumerate()
                        .find(|(k, o)| *k != j && *o == a)
                        .map(|(k, _)| k);
                    if let Some(k) = other {
                        // Two writers of one buffer are reported once, at the first.
                        if k > j || !access(&op.params[k]).is_some_and(Access::writes) {
                            self.sink.warn(
                                &ap.index(j),
                                format!("`{}` is bound to params[{j}] (`{}`) and to params[{k}] of `{}`: kernels rarely allow an output to alias another argument", buf.name, acc.name(), op.name),
                            );
                        }
                    }
                }
            }
        }
    }
}
