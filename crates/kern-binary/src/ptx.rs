//! PTX text: the `.version`, `.target` and each `.entry` with its typed `.param` list and
//! performance directives (`.maxntid`, `.reqntid`, `.minnctapersm`, `.maxnreg`). Parameter
//! offsets are computed as the driver lays them out: each parameter at the next multiple of
//! its alignment (the element size, or an explicit `.align` for byte arrays).

use crate::error::Ctx;
use crate::{demangle, Arch, Compression, Image, ImageKind, Kernel, Param, Result};

/// Upper bound on the parameters of one entry (the 32,764-byte parameter space holds at most
/// that many one-byte parameters); a larger count is a hostile or broken file.
const MAX_PARAMS: usize = 32_764;

/// Whether `data` looks like PTX text.
pub fn is_ptx(data: &[u8]) -> bool {
    let head = &data[..data.len().min(64 * 1024)];
    let Ok(text) = std::str::from_utf8(trim_nul(head)) else {
        // The 64 KiB cut may split a UTF-8 sequence; accept valid prefixes.
        return match std::str::from_utf8(head) {
            Err(e) if e.valid_up_to() > 0 => looks_like_ptx(std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or("")),
            _ => false,
        };
    };
    looks_like_ptx(text)
}

fn looks_like_ptx(text: &str) -> bool {
    text.contains(".version") && (text.contains(".target") || text.contains(".entry"))
}

fn trim_nul(d: &[u8]) -> &[u8] {
    let end = d.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    &d[..end]
}

pub(crate) fn read_ptx(ctx: &Ctx, data: &[u8], offset: u64, compression: Compression) -> Result<Image> {
    let data = trim_nul(data);
    let text = std::str::from_utf8(data).map_err(|e| ctx.err(e.valid_up_to() as u64, "PTX is not valid UTF-8 text"))?;
    let clean = strip_comments(text);
    let mut version = None;
    let mut arch = None;
    let toks = Tokens::new(&clean);
    let mut kernels = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match toks.get(i) {
            ".version" => version = toks.try_get(i + 1).map(str::to_string),
            ".target" => {
                // `.target sm_90a` or `.target sm_90, texmode_independent`.
                if let Some(t) = toks.try_get(i + 1) {
                    arch = t.trim_end_matches(',').parse::<Arch>().ok();
                }
            }
            ".entry" => {
                let (k, next) = parse_entry(ctx, &toks, i + 1)?;
                kernels.push(k);
                i = next;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if version.is_none() {
        return Err(ctx.err(0, "PTX has no .version directive"));
    }
    Ok(Image {
        kind: ImageKind::Ptx,
        arch,
        compressed: compression != Compression::None,
        compression,
        offset,
        container: 0,
        size: data.len() as u64,
        name: None,
        toolkit: None,
        ptx_version: version,
        kernels,
        data: data.to_vec(),
    })
}

/// Replaces `// …` and `/* … */` comments with spaces, keeping byte offsets.
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            out.extend_from_slice(b"  ");
            i += 2;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out.truncate(b.len());
    // Only ASCII bytes were replaced by ASCII spaces, and comment spans never split a
    // multi-byte character at their ends (they start and end on ASCII), so this is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Whitespace-separated tokens, with `(`, `)`, `{`, `}`, `,` and `;` as tokens of their own,
/// each with its byte offset.
struct Tokens<'a> {
    toks: Vec<(&'a str, usize)>,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        let mut toks = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices() {
            let punct = matches!(c, '(' | ')' | '{' | '}' | ',' | ';');
            if c.is_whitespace() || punct {
                if let Some(s) = start.take() {
                    toks.push((&text[s..i], s));
                }
                if punct {
                    toks.push((&text[i..i + 1], i));
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        if let Some(s) = start {
            toks.push((&text[s..], s));
        }
        Tokens { toks }
    }
    fn len(&self) -> usize {
        self.toks.len()
    }
    fn get(&self, i: usize) -> &'a str {
        self.toks.get(i).map_or("", |t| t.0)
    }
    fn try_get(&self, i: usize) -> Option<&'a str> {
        self.toks.get(i).map(|t| t.0)
    }
    fn offset(&self, i: usize) -> u64 {
        self.toks.get(i).or(self.toks.last()).map_or(0, |t| t.1 as u64)
    }
}

/// Parses `NAME ( .param … , … ) directives… {` starting at the name. Returns the kernel and
/// the index of the token after the directives.
fn parse_entry(ctx: &Ctx, t: &Tokens, mut i: usize) -> Result<(Kernel, usize)> {
    let name = t.try_get(i).ok_or_else(|| ctx.err(t.offset(i), ".entry without a name"))?;
    let kctx = ctx.nested(format!("PTX entry {name}"));
    let mut k = Kernel { name: name.to_string(), ..Default::default() };
    k.demangled = demangle::demangle(name);
    k.cpp_params = k.demangled.as_deref().and_then(demangle::param_types);
    k.cute = crate::cute::decode(name);
    i += 1;
    let mut offset = 0u32;
    if t.get(i) == "(" {
        i += 1;
        loop {
            match t.get(i) {
                ")" => {
                    i += 1;
                    break;
                }
                "," => i += 1,
                ".param" => {
                    if k.params.len() >= MAX_PARAMS {
                        return Err(kctx.err(t.offset(i), format!("more than {MAX_PARAMS} parameters")));
                    }
                    let (p, next) = parse_param(&kctx, t, i + 1, k.params.len() as u32, &mut offset)?;
                    k.params.push(p);
                    i = next;
                }
                "" => return Err(kctx.err(t.offset(i), "parameter list is not closed with ')'")),
                other => return Err(kctx.err(t.offset(i), format!("unexpected `{other}` in the parameter list"))),
            }
        }
    }
    k.param_bytes = offset;
    // Performance directives until the body (or `;` for a declaration).
    while let Some(tok) = t.try_get(i) {
        match tok {
            "{" | ";" => break,
            ".maxntid" | ".reqntid" => {
                let (dims, next) = parse_dims(&kctx, t, i + 1)?;
                if tok == ".maxntid" {
                    k.max_threads = Some(dims);
                } else {
                    k.required_block = Some(dims);
                }
                i = next;
            }
            ".minnctapersm" | ".maxnreg" => {
                let v = t.get(i + 1).parse::<u32>().map_err(|_| kctx.err(t.offset(i + 1), format!("{tok} needs a number")))?;
                if tok == ".minnctapersm" {
                    k.min_ctas_per_sm = Some(v);
                } else {
                    k.max_registers = Some(v);
                }
                i += 2;
            }
            _ => i += 1,
        }
    }
    Ok((k, i))
}

fn parse_dims(ctx: &Ctx, t: &Tokens, mut i: usize) -> Result<([u32; 3], usize)> {
    let mut dims = [1u32; 3];
    for (d, slot) in dims.iter_mut().enumerate() {
        let Ok(v) = t.get(i).parse::<u32>() else {
            if d == 0 {
                return Err(ctx.err(t.offset(i), "thread-count directive needs a number"));
            }
            break;
        };
        *slot = v;
        i += 1;
        if t.get(i) == "," {
            i += 1;
        } else {
            break;
        }
    }
    Ok((dims, i))
}

/// Size in bytes of a PTX fundamental type (`.u64`, `.f32`, `.b8`…).
fn type_size(ty: &str) -> Option<u32> {
    let bits: u32 = match ty {
        ".pred" => return Some(1),
        _ => ty.get(2..)?.parse().ok()?,
    };
    let kind = ty.get(1..2)?;
    if !matches!(kind, "u" | "s" | "b" | "f") || !matches!(bits, 8 | 16 | 32 | 64 | 128) {
        // .bf16 / .f16x2 style types.
        return match ty {
            ".bf16" | ".f16" => Some(2),
            ".bf16x2" | ".f16x2" => Some(4),
            _ => None,
        };
    }
    Some(bits / 8)
}

fn parse_param(ctx: &Ctx, t: &Tokens, mut i: usize, ordinal: u32, offset: &mut u32) -> Result<(Param, usize)> {
    let at = t.offset(i);
    let mut ty = None;
    let mut align = None;
    let mut pointer = false;
    let mut name = None;
    while let Some(tok) = t.try_get(i) {
        if tok == "," || tok == ")" {
            break;
        }
        match tok {
            ".ptr" => pointer = true,
            ".align" => {
                let v: u32 = t.get(i + 1).parse().map_err(|_| ctx.err(t.offset(i + 1), ".align needs a number"))?;
                if !v.is_power_of_two() || v > 4096 {
                    return Err(ctx.err(t.offset(i + 1), format!(".align {v} is not a power of two up to 4096")));
                }
                // After `.ptr`, `.align` is the pointee's alignment, not the parameter's.
                if !pointer {
                    align = Some(v);
                }
                i += 1;
            }
            ".global" | ".shared" | ".const" | ".local" => {}
            _ if tok.starts_with('.') && ty.is_none() => ty = Some(tok),
            _ => name = Some(tok),
        }
        i += 1;
    }
    let ty = ty.ok_or_else(|| ctx.err(at, format!("parameter {ordinal} has no type")))?;
    let elem = type_size(ty).ok_or_else(|| ctx.err(at, format!("parameter {ordinal} has unknown type {ty}")))?;
    let count = match name.and_then(|n| n.split_once('[')) {
        Some((_, rest)) => rest
            .strip_suffix(']')
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| ctx.err(at, format!("parameter {ordinal}: bad array size in `{}`", name.unwrap_or(""))))?,
        None => 1,
    };
    let size = elem.checked_mul(count).filter(|&s| s <= 32_764).ok_or_else(|| ctx.err(at, format!("parameter {ordinal} is larger than the 32,764-byte parameter space")))?;
    let a = align.unwrap_or(elem).max(1);
    let off = offset.checked_add(a - 1).map(|o| o / a * a).ok_or_else(|| ctx.err(at, "parameter offsets overflow"))?;
    *offset = off.checked_add(size).filter(|&e| e <= 32_764).ok_or_else(|| ctx.err(at, "parameters exceed the 32,764-byte parameter space"))?;
    Ok((
        Param { ordinal, offset: off, size, align: Some(a), ptx_type: Some(ty.trim_start_matches('.').to_string()), pointer },
        i,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = r#"
//
// Generated by NVIDIA NVVM Compiler
.version 9.0
.target sm_90
.address_size 64
	// .globl	_ZN2ns5mixedIfLi4EEEvcsd2S12S2PT_PKS3_y
.visible .entry _ZN2ns5mixedIfLi4EEEvcsd2S12S2PT_PKS3_y(
	.param .u8 p_0,
	.param .u16 p_1,
	.param .f64 p_2,
	.param .align 8 .b8 p_3[24],
	.param .align 16 .b8 p_4[16],
	.param .u64 .ptr .global .align 4 p_5, /* comment ) */
	.param .u64 p_6,
	.param .u64 p_7
)
.maxntid 256, 1, 1
.minnctapersm 2
{
	ret;
}
.visible .entry add_kernel(
	.param .u64 .ptr .global .align 1 add_kernel_param_0,
	.param .u32 add_kernel_param_3
)
.reqntid 128
{ ret; }
"#;

    #[test]
    fn mixed_layout_matches_the_cubin() {
        let im = read_ptx(&Ctx::new("m.ptx"), MIXED.as_bytes(), 0, Compression::None).unwrap();
        assert_eq!(im.arch.unwrap().to_string(), "sm_90");
        assert_eq!(im.ptx_version.as_deref(), Some("9.0"));
        let k = &im.kernels[0];
        let layout: Vec<(u32, u32)> = k.params.iter().map(|p| (p.offset, p.size)).collect();
        assert_eq!(layout, [(0, 1), (2, 2), (8, 8), (16, 24), (48, 16), (64, 8), (72, 8), (80, 8)]);
        assert_eq!(k.param_bytes, 88);
        assert_eq!(k.max_threads, Some([256, 1, 1]));
        assert_eq!(k.min_ctas_per_sm, Some(2));
        assert!(k.params[5].pointer);
        assert_eq!(k.params[5].align, Some(8));
        let t = &im.kernels[1];
        assert_eq!(t.required_block, Some([128, 1, 1]));
        assert_eq!(t.params[1].offset, 8);
    }

    #[test]
    fn broken_ptx_errors_name_the_offset() {
        let e = read_ptx(&Ctx::new("b.ptx"), b".version 9.0\n.entry k(\n.param .u64 a,\n", 0, Compression::None).unwrap_err();
        assert!(e.to_string().contains("b.ptx") && e.to_string().contains("not closed"), "{e}");
        let e = read_ptx(&Ctx::new("b.ptx"), b".version 9.0\n.entry k(.param .q64 a)", 0, Compression::None).unwrap_err();
        assert!(e.to_string().contains("unknown type"), "{e}");
        let e = read_ptx(&Ctx::new("b.ptx"), b".version 9.0\n.entry k(.param .b8 a[99999999999])", 0, Compression::None).unwrap_err();
        assert!(e.to_string().contains("array size") || e.to_string().contains("larger"), "{e}");
        assert!(read_ptx(&Ctx::new("b.ptx"), b".target sm_90", 0, Compression::None).is_err());
    }
}
