//! JSON tree → [`RawManifest`], reporting every structural problem with its path.
//!
//! Serde's derive stops at the first unknown field and loses the path, so the raw types are
//! read by hand here: each object reader remembers which keys it asked for, and whatever else
//! the object holds is an unknown field (a typo) reported with "did you mean" and the fields
//! that object does have. A bad entry does not stop its siblings from being read; an entry
//! that cannot be read at all is remembered in [`Broken`] so that references to it are not
//! reported a second time as "unknown".
//!
//! This is also where uses of kern 4.1 extensions are noted, so that a manifest declaring
//! schema version 4 is told which of its fields need 4.1.

use crate::diag::{did_you_mean, list, JsonPath, Sink};
use crate::json::Json;
use crate::raw::*;
use crate::types::{KernelParam, OpParam};

mod args;
use indexmap::IndexMap;
use std::collections::HashSet;

/// Names whose declarations could not be read: references to them are not errors of their own.
#[derive(Debug, Default)]
pub(crate) struct Broken {
    pub vars: HashSet<String>,
    pub states: HashSet<String>,
    pub buffers: HashSet<String>,
    pub modules: HashSet<String>,
    pub ops: HashSet<String>,
    /// Calls that could not be read: (program name, call index).
    pub calls: HashSet<(String, usize)>,
    /// Programs that could not be read (`main` for `program`).
    pub programs: HashSet<String>,
}

pub(crate) struct Decoded {
    pub raw: RawManifest,
    pub broken: Broken,
}

/// Reads the whole manifest. `None` only when the top level is not an object.
pub(crate) fn decode(doc: &Json, sink: &mut Sink) -> Option<Decoded> {
    let mut d = Dec {
        sink,
        ext: vec![],
        broken: Broken::default(),
    };
    let root = JsonPath::root();
    let Json::Object(_) = doc else {
        d.sink.error(
            &root,
            format!("a manifest is a JSON object, found {}", doc.kind()),
        );
        return None;
    };
    let mut o = d.obj(doc, &root, "the manifest")?;
    let schema = o.get("$schema").and_then(|(v, p)| d.string(v, &p));
    let version = match o.get("schema_version") {
        Some((v, p)) => d.version(v, &p),
        None => {
            d.sink.error(&root, "`schema_version` is missing: add \"schema_version\": 4 (or \"4.1\" to use kern's extensions)");
            None
        }
    };
    // A stand-in name where the real one could not be read (already reported), so the
    // checker does not also call it blank.
    let model = match o.get("model") {
        Some((v, p)) => d.string(v, &p).unwrap_or_else(|| "?".into()),
        None => {
            d.sink
                .error(&root, "`model` is missing: add \"model\": \"NAME\"");
            "?".into()
        }
    };
    let vars = o
        .get("vars")
        .map(|(v, p)| d.map(v, &p, "vars", |d, v, p| d.var(v, p), |b| &mut b.vars))
        .unwrap_or_default();
    let states = o
        .get("states")
        .map(|(v, p)| d.map(v, &p, "states", |d, v, p| d.state(v, p), |b| &mut b.states))
        .unwrap_or_default();
    let buffers = o
        .get("buffers")
        .map(|(v, p)| {
            d.map(
                v,
                &p,
                "buffers",
                |d, v, p| d.buffer(v, p),
                |b| &mut b.buffers,
            )
        })
        .unwrap_or_default();
    let modules = o
        .get("modules")
        .map(|(v, p)| {
            d.map(
                v,
                &p,
                "modules",
                |d, v, p| d.module(v, p),
                |b| &mut b.modules,
            )
        })
        .unwrap_or_default();
    let ops = o
        .get("ops")
        .map(|(v, p)| d.map(v, &p, "ops", |d, v, p| d.op(v, p), |b| &mut b.ops))
        .unwrap_or_default();
    let program = o.get("program").and_then(|(v, p)| {
        let prog = d.program(v, &p, crate::MAIN_PROGRAM);
        if prog.is_none() {
            d.broken.programs.insert(crate::MAIN_PROGRAM.to_string());
        }
        prog
    });
    let mut programs = IndexMap::new();
    if let Some((v, p)) = o.get("programs") {
        // Not through `map`: each program needs its name while it is read.
        match v {
            Json::Object(entries) => {
                for (pos, (name, value)) in entries.iter().enumerate() {
                    let pp = p.entry(name, pos);
                    if programs.contains_key(name) {
                        d.sink.error(
                            &pp,
                            format!(
                                "`{name}` is declared twice in `programs`: rename or remove one"
                            ),
                        );
                    } else if let Some(prog) = d.program(value, &pp, name) {
                        programs.insert(name.clone(), prog);
                    } else {
                        d.broken.programs.insert(name.clone());
                    }
                }
            }
            other => d.sink.error(
                &p,
                format!(
                    "expected `programs` to be a JSON object of name → program, found {}",
                    other.kind()
                ),
            ),
        }
    }
    let step = o.get("step").and_then(|(v, p)| {
        d.ext(&p, "`step`");
        d.step(v, &p)
    });
    let parallel = o.get("parallel").and_then(|(v, p)| {
        d.ext(&p, "`parallel`");
        d.parallel(v, &p)
    });
    let speculative = o.get("speculative").and_then(|(v, p)| {
        d.ext(&p, "`speculative`");
        d.speculative(v, &p)
    });
    let batch_invariant = o.get("batch_invariant").and_then(|(v, p)| {
        d.ext(&p, "`batch_invariant`");
        match v {
            Json::Bool(b) => Some(*b),
            other => {
                d.sink.error(&p, format!("expected true or false (whether the program gives a row the same bits in any step), found {}", other.kind()));
                None
            }
        }
    });
    o.finish(&mut d);

    let declared = version.unwrap_or(SchemaVersion::LATEST);
    if declared < SchemaVersion::V4_1 && !d.ext.is_empty() {
        let shown: Vec<String> = d
            .ext
            .iter()
            .take(3)
            .map(|(p, what)| format!("{what} at {p}"))
            .collect();
        let more = match d.ext.len() {
            n if n > 3 => format!(", and {} more", n - 3),
            _ => String::new(),
        };
        d.sink.error(
            &root.field("schema_version"),
            format!("this manifest uses kern 4.1 extensions ({}{more}): set \"schema_version\": \"4.1\"", shown.join(", ")),
        );
    }
    let raw = RawManifest {
        schema,
        schema_version: declared,
        model,
        vars,
        states,
        buffers,
        modules,
        ops,
        program,
        programs,
        step,
        parallel,
        speculative,
        batch_invariant: batch_invariant.unwrap_or(false),
    };
    Some(Decoded {
        raw,
        broken: d.broken,
    })
}

struct Dec<'s> {
    sink: &'s mut Sink,
    /// Uses of 4.1 extensions: where, and what.
    ext: Vec<(JsonPath, String)>,
    broken: Broken,
}

/// Reads the fields of one JSON object; whatever was not asked for is an unknown field.
struct Obj<'j> {
    fields: &'j [(String, Json)],
    path: JsonPath,
    what: &'static str,
    asked: Vec<&'static str>,
}

impl<'j> Obj<'j> {
    fn get(&mut self, key: &'static str) -> Option<(&'j Json, JsonPath)> {
        self.asked.push(key);
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| (v, self.path.field(key)))
    }

    fn has(&self, key: &str) -> bool {
        self.fields.iter().any(|(k, _)| k == key)
    }

    fn finish(self, d: &mut Dec) {
        for (k, _) in self.fields {
            if !self.asked.contains(&k.as_str()) {
                let hint = did_you_mean(k, self.asked.iter().copied());
                d.sink.error(
                    &self.path.field(k),
                    format!(
                        "unknown field `{k}`{hint}: {} has {}",
                        self.what,
                        list(&self.asked)
                    ),
                );
            }
        }
    }
}

impl Dec<'_> {
    fn ext(&mut self, path: &JsonPath, what: impl Into<String>) {
        self.ext.push((path.clone(), what.into()));
    }

    fn obj<'j>(&mut self, v: &'j Json, path: &JsonPath, what: &'static str) -> Option<Obj<'j>> {
        let Json::Object(fields) = v else {
            self.sink.error(
                path,
                format!("expected {what} (a JSON object), found {}", v.kind()),
            );
            return None;
        };
        let mut seen = HashSet::with_capacity(fields.len());
        for (k, _) in fields {
            if !seen.insert(k.as_str()) {
                self.sink.error(
                    &path.field(k),
                    format!("`{k}` is written twice in {what}; only the first is read: remove one"),
                );
            }
        }
        Some(Obj {
            fields,
            path: path.clone(),
            what,
            asked: vec![],
        })
    }

    /// A required field: reports its absence.
    fn req<'j>(
        &mut self,
        o: &mut Obj<'j>,
        key: &'static str,
        hint: &str,
    ) -> Option<(&'j Json, JsonPath)> {
        let got = o.get(key);
        if got.is_none() {
            self.sink.error(
                &o.path,
                format!("`{key}` is missing from {}: add \"{key}\": {hint}", o.what),
            );
        }
        got
    }

    fn string(&mut self, v: &Json, path: &JsonPath) -> Option<String> {
        match v {
            Json::String(s) => Some(s.clone()),
            other => {
                self.sink
                    .error(path, format!("expected a string, found {}", other.kind()));
                None
            }
        }
    }

    /// An integer in `[min, max]`.
    fn int(&mut self, v: &Json, path: &JsonPath, min: i128, max: i128) -> Option<i128> {
        let Json::Number(n) = v else {
            self.sink
                .error(path, format!("expected an integer, found {}", v.kind()));
            return None;
        };
        let value = n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from));
        match value {
            Some(i) if (min..=max).contains(&i) => Some(i),
            Some(i) => {
                self.sink.error(
                    path,
                    format!("{i} is out of range: expected {min} to {max}"),
                );
                None
            }
            None => {
                self.sink
                    .error(path, format!("expected an integer, found {n}"));
                None
            }
        }
    }

    fn u32(&mut self, v: &Json, path: &JsonPath) -> Option<u32> {
        self.int(v, path, 0, u32::MAX.into()).map(|i| i as u32)
    }

    fn u64(&mut self, v: &Json, path: &JsonPath) -> Option<u64> {
        self.int(v, path, 0, u64::MAX.into()).map(|i| i as u64)
    }

    fn array<'j>(&mut self, v: &'j Json, path: &JsonPath, what: &str) -> Option<&'j [Json]> {
        match v {
            Json::Array(a) => Some(a),
            other => {
                self.sink.error(
                    path,
                    format!("expected {what} (a JSON array), found {}", other.kind()),
                );
                None
            }
        }
    }

    /// Every element through `f`; `None` if the value is not an array or any element failed.
    fn list<T>(
        &mut self,
        v: &Json,
        path: &JsonPath,
        what: &str,
        mut f: impl FnMut(&mut Self, &Json, &JsonPath) -> Option<T>,
    ) -> Option<Vec<T>> {
        let items = self.array(v, path, what)?;
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match f(self, item, &path.index(i)) {
                Some(t) => out.push(t),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    /// A name → value object. Entries that fail are left out and recorded as broken.
    fn map<T>(
        &mut self,
        v: &Json,
        path: &JsonPath,
        what: &'static str,
        mut f: impl FnMut(&mut Self, &Json, &JsonPath) -> Option<T>,
        slot: impl Fn(&mut Broken) -> &mut HashSet<String>,
    ) -> IndexMap<String, T> {
        let mut out = IndexMap::new();
        let Json::Object(entries) = v else {
            self.sink.error(
                path,
                format!(
                    "expected `{what}` to be a JSON object of name → declaration, found {}",
                    v.kind()
                ),
            );
            return out;
        };
        let mut seen = HashSet::with_capacity(entries.len());
        for (pos, (name, value)) in entries.iter().enumerate() {
            let p = path.entry(name, pos);
            if !seen.insert(name.as_str()) {
                self.sink.error(
                    &p,
                    format!("`{name}` is declared twice in `{what}`: rename or remove one"),
                );
                continue;
            }
            if name.is_empty() {
                self.sink.error(&p, format!("a name in `{what}` is empty"));
            }
            match f(self, value, &p) {
                Some(t) => {
                    out.insert(name.clone(), t);
                }
                None => {
                    slot(&mut self.broken).insert(name.clone());
                }
            }
        }
        out
    }

    fn version(&mut self, v: &Json, path: &JsonPath) -> Option<SchemaVersion> {
        let newer = |s: &str| {
            format!("schema version {s} is newer than this kern reads (4 and \"4.1\"): update kern")
        };
        match v {
            Json::Number(n) if n.as_u64() == Some(4) => Some(SchemaVersion::V4),
            Json::String(s) if s == "4" => Some(SchemaVersion::V4),
            Json::String(s) if s == "4.1" => Some(SchemaVersion::V4_1),
            Json::Number(n) if n.as_f64() == Some(4.1) => {
                self.sink
                    .error(path, "write the version as a string: \"4.1\"");
                Some(SchemaVersion::V4_1)
            }
            Json::Number(n) if n.as_f64().is_some_and(|f| f > 4.1) => {
                self.sink.error(path, newer(&n.to_string()));
                None
            }
            Json::String(s) if s.parse::<f64>().is_ok_and(|f| f > 4.1) => {
                self.sink.error(path, newer(s));
                None
            }
            other => {
                let shown = match other {
                    Json::Number(n) => n.to_string(),
                    Json::String(s) => format!("\"{s}\""),
                    o => o.kind().to_string(),
                };
                self.sink.error(
                    path,
                    format!("kern reads schema versions 4 and \"4.1\", not {shown}"),
                );
                None
            }
        }
    }

    fn var(&mut self, v: &Json, path: &JsonPath) -> Option<RawVar> {
        let mut o = self.obj(v, path, "a var")?;
        let max = self
            .req(&mut o, "max", "N (the largest value)")
            .and_then(|(v, p)| self.int(v, &p, i64::MIN.into(), i64::MAX.into()));
        o.finish(self);
        Some(RawVar { max: max? as i64 })
    }

    fn step(&mut self, v: &Json, path: &JsonPath) -> Option<RawStep> {
        let mut o = self.obj(v, path, "the step ABI binding")?;
        let abi = self.req(&mut o, "abi", "1").and_then(|(v, p)| self.u32(v, &p));
        let buffers = self.req(&mut o, "buffers", "{\"token_ids\": \"BUF\", …}").and_then(|(v, p)| {
            let Json::Object(entries) = v else {
                self.sink.error(&p, format!("expected an object of ABI role → buffer name, found {}", v.kind()));
                return None;
            };
            let mut m = IndexMap::new();
            for (pos, (k, v)) in entries.iter().enumerate() {
                if let Some(s) = self.string(v, &p.entry(k, pos)) {
                    m.insert(k.clone(), s);
                }
            }
            Some(m)
        });
        let kv = o.get("kv").and_then(|(v, p)| self.string(v, &p));
        o.finish(self);
        Some(RawStep { abi: abi?, buffers: buffers?, kv })
    }

    fn parallel(&mut self, v: &Json, path: &JsonPath) -> Option<RawParallel> {
        let mut o = self.obj(v, path, "the parallel section")?;
        let tp = self
            .req(&mut o, "tp", "N (the tensor-parallel size)")
            .and_then(|(v, p)| self.u32(v, &p));
        o.finish(self);
        Some(RawParallel { tp: tp? })
    }

    /// `{"draft": PROGRAM, "k": N, "step": {ROLE: BUF, …}, "reads": [BUF, …]}`.
    fn speculative(&mut self, v: &Json, path: &JsonPath) -> Option<RawSpeculative> {
        let mut o = self.obj(v, path, "the speculative section")?;
        let draft = self
            .req(&mut o, "draft", "\"PROGRAM\" (the draft program, in `programs`)")
            .and_then(|(v, p)| self.string(v, &p));
        let k = self
            .req(&mut o, "k", "N (draft tokens per verify step, 1 to 16)")
            .and_then(|(v, p)| self.u32(v, &p));
        let step = match o.get("step") {
            None => Some(IndexMap::new()),
            Some((v, p)) => self.role_map(v, &p),
        };
        let reads = match o.get("reads") {
            None => Some(vec![]),
            Some((v, p)) => self.list(v, &p, "a list of buffer names", |d, v, p| d.string(v, p)),
        };
        o.finish(self);
        Some(RawSpeculative {
            draft: draft?,
            k: k?,
            step: step?,
            reads: reads?,
        })
    }

    /// `{ROLE: BUFFER, …}`: step ABI role → buffer name.
    fn role_map(&mut self, v: &Json, p: &JsonPath) -> Option<IndexMap<String, String>> {
        let Json::Object(entries) = v else {
            self.sink.error(p, format!("expected an object of ABI role → buffer name, found {}", v.kind()));
            return None;
        };
        let mut m = IndexMap::new();
        let mut ok = true;
        for (pos, (k, v)) in entries.iter().enumerate() {
            if m.contains_key(k) {
                self.sink.error(&p.entry(k, pos), format!("`{k}` is bound twice; only the first is read: remove one"));
                continue;
            }
            match self.string(v, &p.entry(k, pos)) {
                Some(s) => {
                    m.insert(k.clone(), s);
                }
                None => ok = false,
            }
        }
        ok.then_some(m)
    }

    /// `{"dim": D, "parts": N, "part": EXPR}`.
    fn shard(&mut self, v: &Json, path: &JsonPath) -> Option<RawShard> {
        self.ext(path, "`shard`");
        let mut o = self.obj(v, path, "a shard")?;
        let dim = self
            .req(&mut o, "dim", "D (the dimension to cut along)")
            .and_then(|(v, p)| self.u32(v, &p));
        let parts = self
            .req(&mut o, "parts", "N (how many slices)")
            .and_then(|(v, p)| self.u32(v, &p));
        let part = self
            .req(&mut o, "part", "\"rank\" (which slice)")
            .and_then(|(v, p)| self.expr(v, &p));
        o.finish(self);
        Some(RawShard {
            dim: dim?,
            parts: parts?,
            part: part?,
        })
    }

    fn state(&mut self, v: &Json, path: &JsonPath) -> Option<RawState> {
        let mut o = self.obj(v, path, "a state")?;
        let per_token = o.get("bytes_per_token").and_then(|(v, p)| self.u64(v, &p));
        let per_seq = o.get("bytes_per_seq").and_then(|(v, p)| self.u64(v, &p));
        let page_tokens = o.get("page_tokens").and_then(|(v, p)| {
            self.ext(&p, "`page_tokens`");
            self.u32(v, &p)
        });
        let snapshot = o.get("snapshot").and_then(|(v, p)| {
            self.ext(&p, "`snapshot`");
            match v {
                Json::Bool(b) => Some(*b),
                other => {
                    self.sink.error(&p, format!("expected true or false (whether the per-sequence state can be snapshotted), found {}", other.kind()));
                    None
                }
            }
        });
        o.finish(self);
        Some(RawState {
            bytes_per_token: per_token,
            bytes_per_seq: per_seq,
            page_tokens,
            snapshot: snapshot.unwrap_or(false),
        })
    }

    fn expr(&mut self, v: &Json, path: &JsonPath) -> Option<RawExpr> {
        match v {
            Json::String(s) => Some(RawExpr::Text(s.clone())),
            Json::Number(_) => self
                .int(v, path, i64::MIN.into(), i64::MAX.into())
                .map(|i| RawExpr::Int(i as i64)),
            other => {
                self.sink.error(
                    path,
                    format!(
                        "expected an integer or an expression string, found {}",
                        other.kind()
                    ),
                );
                None
            }
        }
    }

    fn dims(&mut self, v: &Json, path: &JsonPath, what: &str) -> Option<Vec<RawExpr>> {
        self.list(v, path, what, |d, v, p| d.expr(v, p))
    }

    fn buffer(&mut self, v: &Json, path: &JsonPath) -> Option<RawBuffer> {
        let mut o = self.obj(v, path, "a buffer")?;
        let dtype = self.req(&mut o, "dtype", "\"bf16\"").and_then(|(v, p)| {
            let s = self.string(v, &p)?;
            crate::types::DType::parse(&s)
                .map_err(|e| self.sink.error(&p, e))
                .ok()
        });
        let shape = self
            .req(&mut o, "shape", "[DIM, …]")
            .and_then(|(v, p)| self.dims(v, &p, "a shape"));
        let role = o.get("role").and_then(|(v, p)| {
            self.ext(&p, "`role`");
            let s = self.string(v, &p)?;
            let role = [Role::Weight, Role::Activation, Role::Input, Role::Output]
                .into_iter()
                .find(|r| r.name() == s);
            if role.is_none() {
                let hint = did_you_mean(&s, ["weight", "activation", "input", "output"]);
                self.sink.error(
                    &p,
                    format!(
                        "`{s}` is not a role{hint}; roles are weight, activation, input and output"
                    ),
                );
            }
            role
        });
        let from = o.get("from").and_then(|(v, p)| {
            self.ext(&p, "`from`");
            self.from(v, &p)
        });
        o.finish(self);
        // A bad `from` or `role` still leaves a usable buffer (its dtype and shape are known);
        // the error has been reported.
        Some(RawBuffer {
            dtype: dtype?,
            shape: shape?,
            role,
            from,
        })
    }

    fn from(&mut self, v: &Json, path: &JsonPath) -> Option<RawFrom> {
        let Json::Object(fields) = v else {
            self.sink.error(
                path,
                format!(
                    "expected {{\"tensor\": …}}, {{\"concat\": […]}}, {{\"alias\": …}} or {{\"values\": […]}}, found {}",
                    v.kind()
                ),
            );
            return None;
        };
        let has = |k: &str| fields.iter().any(|(f, _)| f == k);
        let mut o = self.obj(v, path, "a weight source")?;
        let out = if has("tensor") {
            let t = o.get("tensor").and_then(|(v, p)| self.string(v, &p));
            let shard = o.get("shard").map(|(v, p)| self.shard(v, &p));
            o.finish(self);
            RawFrom::Tensor(RawFromTensor {
                tensor: t?,
                shard: match shard {
                    Some(s) => Some(s?),
                    None => None,
                },
            })
        } else if has("concat") {
            let parts = o.get("concat").and_then(|(v, p)| {
                self.list(v, &p, "a list of tensor names", |d, v, p| d.string(v, p))
            });
            let axis = o.get("axis").and_then(|(v, p)| self.u32(v, &p));
            let sizes = o
                .get("sizes")
                .and_then(|(v, p)| self.list(v, &p, "a list of sizes", |d, v, p| d.u64(v, p)));
            let shard = o.get("shard").map(|(v, p)| self.shard(v, &p));
            let axis_ok = !o.has("axis") || axis.is_some();
            let sizes_ok = !o.has("sizes") || sizes.is_some();
            o.finish(self);
            if !axis_ok || !sizes_ok {
                return None;
            }
            RawFrom::Concat(RawFromConcat {
                concat: parts?,
                axis,
                sizes,
                shard: match shard {
                    Some(s) => Some(s?),
                    None => None,
                },
            })
        } else if has("alias") {
            let a = o.get("alias").and_then(|(v, p)| self.string(v, &p));
            o.finish(self);
            RawFrom::Alias(RawFromAlias { alias: a? })
        } else if has("values") {
            let values = o.get("values").and_then(|(v, p)| {
                self.list(v, &p, "a list of numbers", |d, v, p| match v {
                    Json::Number(n) => n.as_f64(),
                    other => {
                        d.sink.error(p, format!("expected a number, found {}", other.kind()));
                        None
                    }
                })
            });
            o.finish(self);
            RawFrom::Values(RawFromValues { values: values? })
        } else {
            self.sink.error(path, "a weight source is {\"tensor\": NAME}, {\"concat\": [NAME, …], \"axis\": N}, {\"alias\": BUFFER} or {\"values\": [NUMBER, …]}");
            return None;
        };
        Some(out)
    }

    fn module(&mut self, v: &Json, path: &JsonPath) -> Option<RawModule> {
        let mut o = self.obj(v, path, "a module")?;
        let source = self
            .req(&mut o, "source", "\"FILE.cubin\"")
            .and_then(|(v, p)| self.string(v, &p));
        let sha256 = self
            .req(
                &mut o,
                "sha256",
                "\"<64 hex digits>\" (run `sha256sum FILE`)",
            )
            .and_then(|(v, p)| self.string(v, &p));
        o.finish(self);
        Some(RawModule {
            source: source?,
            sha256: sha256?,
        })
    }

    fn op(&mut self, v: &Json, path: &JsonPath) -> Option<RawOp> {
        let mut o = self.obj(v, path, "an op")?;
        let params = self
            .req(&mut o, "params", "[\"out buffer<bf16>\", …]")
            .and_then(|(v, p)| {
                self.list(v, &p, "a list of parameter types", |d, v, p| {
                    let s = d.string(v, p)?;
                    let t = OpParam::parse(&s).map_err(|e| d.sink.error(p, e)).ok()?;
                    if t.is_extension() {
                        d.ext(p, format!("`{t}` parameters"));
                    }
                    Some(t)
                })
            });
        let implementation = self
            .req(&mut o, "impl", "{\"launches\": […]}")
            .and_then(|(v, p)| {
                let mut io = self.obj(v, &p, "an op's impl")?;
                let collective = io.get("collective").and_then(|(v, p)| {
                    self.ext(&p, "`collective`");
                    let s = self.string(v, &p)?;
                    let c = Collective::ALL.into_iter().find(|c| c.name() == s);
                    if c.is_none() {
                        let names = Collective::ALL.map(Collective::name);
                        let hint = did_you_mean(&s, names);
                        self.sink.error(
                            &p,
                            format!("`{s}` is not a collective{hint}; kern has {}", list(&names)),
                        );
                    }
                    c
                });
                let has_collective = io.has("collective");
                let launches = if has_collective && !io.has("launches") {
                    Some(vec![])
                } else {
                    self.req(&mut io, "launches", "[{…}]").and_then(|(v, p)| {
                        self.list(v, &p, "a list of launches", |d, v, p| d.launch(v, p))
                    })
                };
                io.finish(self);
                if has_collective && collective.is_none() {
                    return None;
                }
                Some(RawImpl {
                    launches: launches?,
                    collective,
                })
            });
        o.finish(self);
        Some(RawOp {
            params: params?,
            implementation: implementation?,
        })
    }

    fn launch(&mut self, v: &Json, path: &JsonPath) -> Option<RawLaunch> {
        let mut o = self.obj(v, path, "a launch")?;
        let label = o.get("label").and_then(|(v, p)| {
            self.ext(&p, "launch `label`");
            self.string(v, &p)
        });
        let module = self
            .req(&mut o, "module", "\"MODULE\"")
            .and_then(|(v, p)| self.string(v, &p));
        let entry = self
            .req(&mut o, "entry", "\"KERNEL_SYMBOL\"")
            .and_then(|(v, p)| self.string(v, &p));
        let params = self
            .req(&mut o, "params", "[…] (the kernel's parameter types)")
            .and_then(|(v, p)| {
                self.list(v, &p, "a list of kernel parameter types", |d, v, p| {
                    d.kernel_param(v, p)
                })
            });
        let block = self
            .req(&mut o, "block", "[X, Y, Z]")
            .and_then(|(v, p)| self.dims(v, &p, "[X, Y, Z]"));
        let grid = self
            .req(&mut o, "grid", "[X, Y, Z]")
            .and_then(|(v, p)| self.dims(v, &p, "[X, Y, Z]"));
        let shared = o.get("shared").and_then(|(v, p)| {
            self.ext(&p, "`shared`");
            self.expr(v, &p)
        });
        let pdl = o.get("pdl").and_then(|(v, p)| {
            self.ext(&p, "`pdl`");
            match v {
                Json::Bool(b) => Some(*b),
                other => {
                    self.sink.error(&p, format!("expected true or false (Programmatic Dependent Launch), found {}", other.kind()));
                    None
                }
            }
        });
        let args = self
            .req(&mut o, "args", "[…] (one per kernel parameter)")
            .and_then(|(v, p)| {
                self.list(v, &p, "a list of arguments", |d, v, p| d.launch_arg(v, p))
            });
        o.finish(self);
        Some(RawLaunch {
            label,
            module: module?,
            entry: entry?,
            params: params?,
            block: block?,
            grid: grid?,
            shared,
            pdl: pdl.unwrap_or(false),
            args: args?,
        })
    }

    fn kernel_param(&mut self, v: &Json, path: &JsonPath) -> Option<KernelParam> {
        match v {
            Json::String(s) => {
                let t = KernelParam::parse(s)
                    .map_err(|e| self.sink.error(path, e))
                    .ok()?;
                if t == KernelParam::Ptr {
                    self.ext(path, "`ptr` parameters");
                }
                Some(t)
            }
            Json::Object(_) => {
                self.ext(path, "aggregate parameters");
                let mut o = self.obj(v, path, "an aggregate parameter")?;
                let layout = self
                    .req(&mut o, "struct", "{\"size\": N, \"align\": A}")
                    .and_then(|(v, p)| {
                        let mut lo = self.obj(v, &p, "an aggregate layout")?;
                        let size = self
                            .req(&mut lo, "size", "N (bytes)")
                            .and_then(|(v, p)| self.u32(v, &p));
                        let align = self
                            .req(&mut lo, "align", "A (bytes)")
                            .and_then(|(v, p)| self.u32(v, &p));
                        lo.finish(self);
                        Some(KernelParam::Struct {
                            size: size?,
                            align: align?,
                        })
                    });
                o.finish(self);
                layout
            }
            other => {
                self.sink.error(
                    path,
                    format!(
                        "expected a parameter type (a string, or {{\"struct\": …}}), found {}",
                        other.kind()
                    ),
                );
                None
            }
        }
    }

    fn program(&mut self, v: &Json, path: &JsonPath, name: &str) -> Option<RawProgram> {
        let mut o = self.obj(v, path, "a program")?;
        let calls = self
            .req(&mut o, "calls", "[{\"op\": …, \"args\": […]}, …]")
            .and_then(|(v, p)| {
                let items = self.array(v, &p, "a list of calls")?;
                // A call that cannot be read keeps its place (so later calls keep their indices)
                // and is skipped by the checker; the rest of the program is still checked.
                let calls = items.iter().enumerate().map(|(i, c)| {
                    self.call(c, &p.index(i)).unwrap_or_else(|| {
                        self.broken.calls.insert((name.to_string(), i));
                        RawCall {
                            label: None,
                            op: String::new(),
                            args: vec![],
                        }
                    })
                });
                Some(calls.collect::<Vec<_>>())
            });
        o.finish(self);
        Some(RawProgram { calls: calls? })
    }

    fn call(&mut self, v: &Json, path: &JsonPath) -> Option<RawCall> {
        let mut o = self.obj(v, path, "a call")?;
        let label = o.get("label").and_then(|(v, p)| self.string(v, &p));
        let op = self
            .req(&mut o, "op", "\"OP\"")
            .and_then(|(v, p)| self.string(v, &p));
        let args = self
            .req(&mut o, "args", "[…] (one per op parameter)")
            .and_then(|(v, p)| self.list(v, &p, "a list of arguments", |d, v, p| d.call_arg(v, p)));
        o.finish(self);
        Some(RawCall {
            label,
            op: op?,
            args: args?,
        })
    }
}
