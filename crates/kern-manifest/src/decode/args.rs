//! Arguments: launch arguments, aggregate fields, call bindings and typed constants, all
//! written as objects with one key naming the kind (`{"param": 0}`, `{"i64": 2560}`).

use super::Dec;
use crate::diag::{did_you_mean, list, JsonPath};
use crate::json::Json;
use crate::raw::*;

impl Dec<'_> {
    /// The one key of a `{"kind": value}` object, after checking there is exactly one.
    fn tagged<'j>(
        &mut self,
        v: &'j Json,
        path: &JsonPath,
        what: &str,
        forms: &str,
    ) -> Option<(&'j str, &'j Json, JsonPath)> {
        let Json::Object(fields) = v else {
            self.sink.error(
                path,
                format!("expected {what} ({forms}), found {}", v.kind()),
            );
            return None;
        };
        match fields.as_slice() {
            [(k, val)] => Some((k.as_str(), val, path.field(k))),
            [] => {
                self.sink
                    .error(path, format!("{what} is empty: write {forms}"));
                None
            }
            many => {
                let keys: Vec<&str> = many.iter().map(|(k, _)| k.as_str()).collect();
                self.sink.error(
                    path,
                    format!("{what} has one key, found {}: write {forms}", list(&keys)),
                );
                None
            }
        }
    }

    fn constant(&mut self, key: &str, v: &Json, path: &JsonPath) -> Option<Option<RawConst>> {
        let int = |d: &mut Self, lo: i128, hi: i128| d.int(v, path, lo, hi);
        let number = |d: &mut Self| match v {
            Json::Number(n) => n.as_f64(),
            other => {
                d.sink
                    .error(path, format!("expected a number, found {}", other.kind()));
                None
            }
        };
        Some(Some(match key {
            "i8" => RawConst::I8(int(self, i8::MIN.into(), i8::MAX.into())? as i8),
            "i16" => RawConst::I16(int(self, i16::MIN.into(), i16::MAX.into())? as i16),
            "i32" => RawConst::I32(int(self, i32::MIN.into(), i32::MAX.into())? as i32),
            "i64" => RawConst::I64(int(self, i64::MIN.into(), i64::MAX.into())? as i64),
            "u8" => RawConst::U8(int(self, 0, u8::MAX.into())? as u8),
            "u16" => RawConst::U16(int(self, 0, u16::MAX.into())? as u16),
            "u32" => RawConst::U32(int(self, 0, u32::MAX.into())? as u32),
            "u64" => RawConst::U64(int(self, 0, u64::MAX.into())? as u64),
            "f32" => {
                let f = number(self)?;
                if f.abs() > f32::MAX as f64 {
                    self.sink.error(path, format!("{f} does not fit in f32: write it as {{\"f64\": …}} if the kernel takes a double"));
                    return None;
                }
                RawConst::F32(f)
            }
            "f64" => RawConst::F64(number(self)?),
            "bool" => match v {
                Json::Bool(b) => RawConst::Bool(*b),
                other => {
                    self.sink.error(
                        path,
                        format!("expected true or false, found {}", other.kind()),
                    );
                    return None;
                }
            },
            _ => return Some(None),
        }))
    }

    fn null(&mut self, v: &Json, path: &JsonPath) -> Option<True> {
        self.ext(path, "`null` arguments");
        match v {
            Json::Bool(true) => Some(True),
            _ => {
                self.sink
                    .error(path, "write a null pointer as {\"null\": true}");
                None
            }
        }
    }

    pub(super) fn launch_arg(&mut self, v: &Json, path: &JsonPath) -> Option<RawLaunchArg> {
        const FORMS: &str = "{\"param\": I}, a typed constant such as {\"i64\": 2560}, {\"null\": true} or {\"struct\": […]}";
        let (key, val, p) = self.tagged(v, path, "an argument", FORMS)?;
        match key {
            "param" => self.u32(val, &p).map(RawLaunchArg::Param),
            "null" => self.null(val, &p).map(RawLaunchArg::Null),
            "struct" => {
                self.ext(&p, "aggregate arguments");
                self.list(val, &p, "a list of fields", |d, v, p| d.field(v, p))
                    .map(RawLaunchArg::Struct)
            }
            k => match self.constant(k, val, &p)? {
                Some(c) => Some(RawLaunchArg::Const(c)),
                None => {
                    let hint = self.arg_hint(k, &["param", "null", "struct"]);
                    self.sink.error(
                        path,
                        format!("`{k}` is not a launch argument{hint}: write {FORMS}"),
                    );
                    None
                }
            },
        }
    }

    fn arg_hint(&self, k: &str, kinds: &[&str]) -> String {
        const CONSTS: [&str; 11] = [
            "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64", "bool",
        ];
        if matches!(k, "buf" | "var" | "state") {
            return format!(
                " (`{k}` bindings are for program calls; a launch passes {{\"param\": I}})"
            );
        }
        did_you_mean(k, kinds.iter().copied().chain(CONSTS))
    }

    fn field(&mut self, v: &Json, path: &JsonPath) -> Option<RawField> {
        const FORMS: &str = "{\"offset\": N, \"param\": I}, {\"offset\": N, \"i64\": 5} or {\"offset\": N, \"null\": true}";
        let Json::Object(fields) = v else {
            self.sink.error(
                path,
                format!("expected a field ({FORMS}), found {}", v.kind()),
            );
            return None;
        };
        let offset = match fields.iter().find(|(k, _)| k == "offset") {
            Some((_, o)) => self.u32(o, &path.field("offset")),
            None => {
                self.sink
                    .error(path, format!("a field needs an `offset`: write {FORMS}"));
                None
            }
        };
        let rest: Vec<&(String, Json)> = fields.iter().filter(|(k, _)| k != "offset").collect();
        let [(key, val)] = rest.as_slice() else {
            let keys: Vec<&str> = rest.iter().map(|(k, _)| k.as_str()).collect();
            self.sink.error(
                path,
                format!(
                    "a field has `offset` and one value, found {}: write {FORMS}",
                    list(&keys)
                ),
            );
            return None;
        };
        let p = path.field(key);
        let value = match key.as_str() {
            "param" => RawFieldValue::Param(self.u32(val, &p)?),
            "null" => RawFieldValue::Null(self.null(val, &p)?),
            k => match self.constant(k, val, &p)? {
                Some(c) => RawFieldValue::Const(c),
                None => {
                    let hint = self.arg_hint(k, &["param", "null"]);
                    self.sink.error(
                        &p,
                        format!("`{k}` is not a field value{hint}: write {FORMS}"),
                    );
                    return None;
                }
            },
        };
        Some(RawField {
            offset: offset?,
            value,
        })
    }

    pub(super) fn call_arg(&mut self, v: &Json, path: &JsonPath) -> Option<RawCallArg> {
        const FORMS: &str = "{\"buf\": NAME}, {\"var\": NAME}, {\"state\": NAME}, a typed constant such as {\"i32\": 6144}, or {\"null\": true}";
        let (key, val, p) = self.tagged(v, path, "an argument", FORMS)?;
        match key {
            "buf" => self.string(val, &p).map(RawCallArg::Buf),
            "var" => self.string(val, &p).map(RawCallArg::Var),
            "state" => {
                self.ext(&p, "`state` arguments");
                self.string(val, &p).map(RawCallArg::State)
            }
            "null" => self.null(val, &p).map(RawCallArg::Null),
            k => match self.constant(k, val, &p)? {
                Some(c) => Some(RawCallArg::Const(c)),
                None => {
                    let hint = if k == "param" {
                        " (`param` is for launches inside an op; a call binds buffers, vars, states and constants)".to_string()
                    } else {
                        did_you_mean(
                            k,
                            [
                                "buf", "var", "state", "null", "i8", "i16", "i32", "i64", "u8",
                                "u16", "u32", "u64", "f32", "f64", "bool",
                            ],
                        )
                    };
                    self.sink.error(
                        path,
                        format!("`{k}` is not a call argument{hint}: write {FORMS}"),
                    );
                    None
                }
            },
        }
    }
}
