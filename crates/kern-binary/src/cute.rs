//! CuTe DSL kernel names. The DSL does not use the Itanium ABI: it builds the name as
//! `kernel_` + CLEAN("cutlass_" + function + "_" + argument tokens) truncated to 180 chars, +
//! `_` + an instance number, where CLEAN deletes ` - ! [ ] # , . < > ( ) " : { } = % ? @ ;`
//! and spaces. A tensor argument `tensor<ptr<f32,gmem,align<16>> o (256,64):(1,256)>` thus
//! becomes `tensorptrf32gmemalign16o256641256`. This module decodes what survives: element
//! type, memory space, alignment and the layout's digits (whose separators are gone, so shapes
//! and strides cannot be told apart; we say so rather than guess). IR-typed scalars add no token.

use serde::Serialize;

/// The DSL's name length limit before the instance suffix.
const CUTE_TRUNCATE: usize = 180;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CuteName {
    /// The Python `@cute.kernel` function name.
    pub function: String,
    /// The DSL's instance number (the trailing `_N`).
    pub instance: Option<u64>,
    pub args: Vec<CuteArg>,
    /// True when the name reached the DSL's length limit, so trailing arguments may be lost.
    pub truncated: bool,
    /// What could not be decoded, in words.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CuteArg {
    /// The token as it appears in the name.
    pub token: String,
    /// `tensor`, or `unknown` for a token kern cannot read.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub align: Option<u32>,
    /// The layout's digits with its separators removed (`1` for a dynamic shape of stride 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout_digits: Option<String>,
}

// Longest first, so that `bf16` is not read as `b` + `f16`.
const ELEMENTS: &[&str] = &[
    "float8e4m3fn", "float8e5m2", "f8E4M3FN", "f8E5M2", "f8E4M3", "f8E8M0FNU", "f8e4m3", "f8e5m2", "bf16", "tf32", "f64",
    "f32", "f16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "i1", "b1",
];
const SPACES: &[&str] = &["gmem", "smem", "rmem", "tmem", "generic"];

/// Decodes a CuTe DSL name, or None when `name` is not one.
pub fn decode(name: &str) -> Option<CuteName> {
    let body = name.strip_prefix("kernel_cutlass_")?;
    let mut notes = Vec::new();
    let (body, instance) = match body.rsplit_once('_') {
        Some((b, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => (b, n.parse().ok()),
        _ => {
            notes.push("no trailing instance number".to_string());
            (body, None)
        }
    };
    let truncated = "cutlass_".len() + body.len() >= CUTE_TRUNCATE;
    let parts: Vec<&str> = body.split('_').collect();
    // The function name is everything before the first argument token; function names may
    // contain underscores, so we look for the first part that reads as an argument.
    let first_arg = parts.iter().position(|p| p.starts_with("tensor")).unwrap_or(parts.len());
    let function = parts[..first_arg].join("_");
    let mut args = Vec::new();
    for tok in &parts[first_arg..] {
        if tok.is_empty() {
            continue;
        }
        args.push(decode_arg(tok));
    }
    if args.iter().any(|a| a.kind == "unknown") {
        notes.push("some argument tokens are not tensors kern can read (shown as unknown)".to_string());
    }
    if args.iter().any(|a| a.layout_digits.as_deref().is_some_and(|d| d.len() > 1)) {
        notes.push("layout digits lost their separators in the name: shape and stride cannot be split unambiguously".to_string());
    }
    if truncated {
        notes.push(format!("the name reached the DSL's {CUTE_TRUNCATE}-character limit: trailing arguments may be missing"));
    }
    notes.push("scalar arguments (e.g. Int32) leave no token in the name".to_string());
    Some(CuteName { function, instance, args, truncated, notes })
}

fn decode_arg(tok: &str) -> CuteArg {
    let unknown = || CuteArg {
        token: tok.to_string(),
        kind: "unknown".into(),
        element: None,
        memory: None,
        align: None,
        layout_digits: None,
    };
    let Some(rest) = tok.strip_prefix("tensorptr") else { return unknown() };
    let Some(element) = ELEMENTS.iter().find(|e| rest.starts_with(**e)) else { return unknown() };
    let rest = &rest[element.len()..];
    let Some(memory) = SPACES.iter().find(|s| rest.starts_with(**s)) else { return unknown() };
    let rest = &rest[memory.len()..];
    let (align, rest) = match rest.strip_prefix("align") {
        Some(r) => {
            let digits: String = r.chars().take_while(|c| c.is_ascii_digit()).collect();
            (digits.parse().ok(), &r[digits.len()..])
        }
        None => (None, rest),
    };
    let layout_digits = rest.strip_prefix('o').map(|d| d.to_string());
    CuteArg {
        token: tok.to_string(),
        kind: "tensor".into(),
        element: Some(element.to_string()),
        memory: Some(memory.to_string()),
        align,
        layout_digits,
    }
}

impl std::fmt::Display for CuteName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(", self.function)?;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            match (&a.element, &a.memory) {
                (Some(e), Some(m)) => {
                    write!(f, "Tensor<{e}, {m}")?;
                    if let Some(al) = a.align {
                        write!(f, ", align={al}")?;
                    }
                    if let Some(l) = &a.layout_digits {
                        write!(f, ", layout={l}")?;
                    }
                    write!(f, ">")?;
                }
                _ => write!(f, "?{}", a.token)?,
            }
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_example() {
        let n = decode("kernel_cutlass_kernel_tensorptrf32gmemalign16o1_tensorptrf32gmemalign16o1_tensorptrf32gmemalign16o1__0").unwrap();
        assert_eq!(n.function, "kernel");
        assert_eq!(n.instance, Some(0));
        assert_eq!(n.args.len(), 3);
        assert_eq!(n.args[0].element.as_deref(), Some("f32"));
        assert_eq!(n.args[0].memory.as_deref(), Some("gmem"));
        assert_eq!(n.args[0].align, Some(16));
        assert_eq!(n.args[0].layout_digits.as_deref(), Some("1"));
        assert_eq!(n.to_string(), "kernel(Tensor<f32, gmem, align=16, layout=1>, Tensor<f32, gmem, align=16, layout=1>, Tensor<f32, gmem, align=16, layout=1>)");
    }

    #[test]
    fn underscored_function_and_unknown_tokens() {
        let n = decode("kernel_cutlass_my_gemm_kernel_tensorptrbf16smemalign128o256641256_weird42_3").unwrap();
        assert_eq!(n.function, "my_gemm_kernel");
        assert_eq!(n.instance, Some(3));
        assert_eq!(n.args[0].element.as_deref(), Some("bf16"));
        assert_eq!(n.args[0].memory.as_deref(), Some("smem"));
        assert_eq!(n.args[1].kind, "unknown");
        assert!(n.notes.iter().any(|s| s.contains("separators")));
        assert!(decode("_Z3foov").is_none());
    }
}
