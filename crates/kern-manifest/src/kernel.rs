//! Does a launch agree with the kernel it names? Compares the manifest's parameter list with the
//! image's KPARAM_INFO (count, size, offset under natural alignment), with the demangled C++
//! parameter types where the symbol has them, and the block with `.reqntid` / `.maxntid`.
//!
//! Type comparisons only report what is certain: `float` against `i32` is an error; an
//! element type kern cannot name (`void*`, a struct pointer) says nothing.

use crate::diag::{JsonPath, Sink};
use crate::types::{Access, DType, KernelParam, Scalar};
use kern_binary::{Image, Kernel};

/// Where each parameter goes in the parameter buffer under natural alignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// (offset, size) per parameter.
    pub slots: Vec<(u32, u32)>,
    /// One past the last byte.
    pub end: u32,
}

pub(crate) fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Offsets as the C ABI lays parameters out: each at the next multiple of its alignment.
/// `None` when it does not fit in 32 bits (a hostile `struct` size).
pub(crate) fn layout(params: &[KernelParam]) -> Option<Layout> {
    let mut at: u64 = 0;
    let mut slots = Vec::with_capacity(params.len());
    for p in params {
        let off = align_up(at, u64::from(p.align().max(1)));
        at = off + u64::from(p.size());
        slots.push((u32::try_from(off).ok()?, p.size()));
    }
    Some(Layout {
        slots,
        end: u32::try_from(at).ok()?,
    })
}

/// A demangled C++ parameter type, as far as kern needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cpp {
    Int {
        size: u32,
        signed: bool,
    },
    Float {
        size: u32,
    },
    Bool,
    /// A pointer; `elem` when the pointee is a type kern names, `generic` for `void*`,
    /// `char*` and pointers to pointers (any buffer fits).
    Pointer {
        elem: Option<DType>,
        generic: bool,
        is_const: bool,
    },
    /// A class type passed by value, or anything else.
    Other,
}

const QUALIFIERS: [&str; 6] = [
    "const",
    "volatile",
    "__restrict",
    "__restrict__",
    "restrict",
    "__restrict__const",
];

fn classify(t: &str) -> Cpp {
    let t = t.trim();
    if let Some(star) = t.rfind('*') {
        let after = &t[star + 1..];
        if !after.split_whitespace().all(|w| QUALIFIERS.contains(&w)) {
            return Cpp::Other;
        }
        let pointee = &t[..star];
        if pointee.contains('*') || pointee.contains('(') {
            return Cpp::Pointer {
                elem: None,
                generic: true,
                is_const: false,
            };
        }
        let words: Vec<&str> = pointee.split_whitespace().collect();
        let is_const = words.contains(&"const");
        let base: Vec<&str> = words
            .into_iter()
            .filter(|w| !QUALIFIERS.contains(w))
            .collect();
        let base = base.join(" ");
        let generic = matches!(
            base.as_str(),
            "void" | "char" | "unsigned char" | "signed char" | "std::byte"
        );
        return Cpp::Pointer {
            elem: if generic { None } else { element(&base) },
            generic,
            is_const,
        };
    }
    let words: Vec<&str> = t
        .split_whitespace()
        .filter(|w| !QUALIFIERS.contains(w))
        .collect();
    match words.join(" ").as_str() {
        "float" => Cpp::Float { size: 4 },
        "double" => Cpp::Float { size: 8 },
        "bool" => Cpp::Bool,
        "char" | "signed char" => Cpp::Int {
            size: 1,
            signed: true,
        },
        "unsigned char" => Cpp::Int {
            size: 1,
            signed: false,
        },
        "short" | "short int" => Cpp::Int {
            size: 2,
            signed: true,
        },
        "unsigned short" | "unsigned short int" => Cpp::Int {
            size: 2,
            signed: false,
        },
        "int" | "signed" | "signed int" => Cpp::Int {
            size: 4,
            signed: true,
        },
        "unsigned" | "unsigned int" => Cpp::Int {
            size: 4,
            signed: false,
        },
        "long" | "long int" | "long long" | "long long int" => Cpp::Int {
            size: 8,
            signed: true,
        },
        "unsigned long" | "unsigned long int" | "unsigned long long" | "unsigned long long int" => {
            Cpp::Int {
                size: 8,
                signed: false,
            }
        }
        _ => Cpp::Other,
    }
}

/// The dtype of a pointee kern recognises.
fn element(base: &str) -> Option<DType> {
    Some(match base {
        "float" => DType::F32,
        "double" => DType::F64,
        "c10::BFloat16"
        | "at::BFloat16"
        | "__nv_bfloat16"
        | "nv_bfloat16"
        | "__bf16"
        | "cutlass::bfloat16_t" => DType::Bf16,
        "c10::Half" | "at::Half" | "__half" | "half" | "_Float16" | "cutlass::half_t" => DType::F16,
        "c10::Float8_e4m3fn" | "__nv_fp8_e4m3" | "cutlass::float_e4m3_t" => DType::F8e4m3,
        "c10::Float8_e5m2" | "__nv_fp8_e5m2" | "cutlass::float_e5m2_t" => DType::F8e5m2,
        "short" => DType::I16,
        "unsigned short" => DType::U16,
        "int" => DType::I32,
        "unsigned int" => DType::U32,
        "long" | "long long" => DType::I64,
        "unsigned long" | "unsigned long long" => DType::U64,
        "bool" => DType::Bool,
        _ => return None,
    })
}

fn is_int_dtype(d: DType) -> bool {
    matches!(
        d,
        DType::I8
            | DType::U8
            | DType::I16
            | DType::U16
            | DType::I32
            | DType::U32
            | DType::I64
            | DType::U64
    )
}

/// What to write in the manifest for a C++ type, when there is one obvious answer.
fn suggestion(c: &Cpp, access_hint: Access) -> Option<String> {
    Some(match c {
        Cpp::Int { size, signed } => {
            let s = match (size, signed) {
                (1, true) => Scalar::I8,
                (1, false) => Scalar::U8,
                (2, true) => Scalar::I16,
                (2, false) => Scalar::U16,
                (4, true) => Scalar::I32,
                (4, false) => Scalar::U32,
                (8, true) => Scalar::I64,
                (8, false) => Scalar::U64,
                _ => return None,
            };
            format!("\"{s}\"")
        }
        Cpp::Float { size: 4 } => "\"f32\"".into(),
        Cpp::Float { size: 8 } => "\"f64\"".into(),
        Cpp::Bool => "\"bool\"".into(),
        Cpp::Pointer {
            elem: Some(d),
            is_const,
            ..
        } => {
            let a = if *is_const { Access::In } else { access_hint };
            format!("\"{} buffer<{d}>\"", a.name())
        }
        Cpp::Pointer { .. } => "\"ptr\" or a buffer type".into(),
        _ => return None,
    })
}

fn scalar_cpp(s: Scalar) -> Cpp {
    match s {
        Scalar::F32 => Cpp::Float { size: 4 },
        Scalar::F64 => Cpp::Float { size: 8 },
        Scalar::Bool => Cpp::Bool,
        Scalar::I8 | Scalar::I16 | Scalar::I32 | Scalar::I64 => Cpp::Int {
            size: s.size(),
            signed: true,
        },
        Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => Cpp::Int {
            size: s.size(),
            signed: false,
        },
    }
}

/// The kernel `entry` in `image`, or an error listing what is there.
pub(crate) fn find_entry(
    image: &Image,
    entry: &str,
    other_images: &[(String, bool)],
) -> Result<usize, String> {
    if let Some(i) = image.kernels.iter().position(|k| k.name == entry) {
        return Ok(i);
    }
    if let Some((arch, _)) = other_images.iter().find(|(_, has)| *has) {
        return Err(format!("`{entry}` is in the module's {arch} image but not in the image kern loads for this GPU"));
    }
    let names: Vec<&str> = image.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut ranked: Vec<(usize, &str)> = names
        .iter()
        .map(|n| (crate::diag::edit_distance(entry, n), *n))
        .collect();
    ranked.sort();
    let shown: Vec<String> = ranked
        .iter()
        .take(3)
        .map(|(_, n)| format!("`{n}`"))
        .collect();
    let what = match names.len() {
        0 => "the image has no kernels".to_string(),
        n if n <= 3 => format!("its kernels are {}", shown.join(", ")),
        n => format!("closest of its {n} kernels: {}", shown.join(", ")),
    };
    Err(format!(
        "the module has no kernel `{entry}` ({what}): copy the symbol from `kern inspect`"
    ))
}

/// Compares the launch's parameter list with the kernel's. `params_path` is the launch's
/// `params` array.
pub(crate) fn check_params(
    kernel: &Kernel,
    params: &[KernelParam],
    layout: &Layout,
    params_path: &JsonPath,
    sink: &mut Sink,
) {
    let cpp = kernel
        .cpp_params
        .as_ref()
        .filter(|c| c.len() == kernel.params.len());
    if kernel.params.len() != params.len() {
        let theirs: Vec<String> = kernel
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| match cpp.and_then(|c| c.get(i)) {
                Some(t) => format!("{t} ({} B at {})", p.size, p.offset),
                None => format!("{} B at {}", p.size, p.offset),
            })
            .collect();
        sink.error(
            params_path,
            format!(
                "the kernel takes {} parameters, the manifest lists {}: the kernel's are [{}]",
                kernel.params.len(),
                params.len(),
                theirs.join(", ")
            ),
        );
        return;
    }
    let mut offsets_agree = true;
    for (i, (p, k)) in params.iter().zip(&kernel.params).enumerate() {
        let path = params_path.index(i);
        let c = cpp.map(|c| c[i].as_str());
        let class = c.map(classify).unwrap_or(Cpp::Other);
        let access_hint = match p {
            KernelParam::Buffer { access, .. } => *access,
            // A non-const pointer the manifest did not type is most likely an output.
            _ => Access::Out,
        };
        let fix = suggestion(&class, access_hint)
            .map(|s| format!(": write {s}"))
            .unwrap_or_default();
        if p.size() != k.size {
            let named = c.map(|c| format!(" ({c})")).unwrap_or_default();
            let ours = match p {
                KernelParam::Struct { .. } => format!("a struct of {} bytes", p.size()),
                KernelParam::Scalar(s) => s.to_string(),
                other => format!("{other} (8 bytes)"),
            };
            let fix = if fix.is_empty() && !matches!(p, KernelParam::Struct { .. }) && c.is_none() {
                size_fix(k.size)
            } else {
                fix
            };
            sink.error(
                &path,
                format!(
                    "the kernel takes {} bytes{named} here, the manifest says {ours}{fix}",
                    k.size
                ),
            );
            offsets_agree = false;
            continue;
        }
        if offsets_agree && layout.slots[i].0 != k.offset {
            offsets_agree = false;
            let prev_end = if i == 0 {
                0
            } else {
                layout.slots[i - 1].0 + layout.slots[i - 1].1
            };
            let fits = [1u32, 2, 4, 8, 16, 32, 64, 128, 256]
                .into_iter()
                .find(|a| align_up(prev_end.into(), (*a).into()) == u64::from(k.offset));
            let hint = match (p, fits) {
                (KernelParam::Struct { align, .. }, Some(a)) if a != *align => {
                    format!(": set this struct's `align` to {a}")
                }
                _ => ": a parameter before it has the wrong size or alignment".to_string(),
            };
            sink.error(&path, format!("the kernel has this parameter at byte offset {}, the manifest's layout puts it at {}{hint}", k.offset, layout.slots[i].0));
        }
        compare_kind(p, &class, c, k, &path, &fix, sink);
    }
}

fn size_fix(size: u32) -> String {
    match size {
        8 => ": write \"i64\", \"u64\", \"f64\", a buffer type or \"ptr\"".into(),
        4 => ": write \"i32\", \"u32\" or \"f32\"".into(),
        2 => ": write \"i16\" or \"u16\"".into(),
        1 => ": write \"i8\", \"u8\" or \"bool\"".into(),
        n => format!(": write {{\"struct\": {{\"size\": {n}, \"align\": …}}}}"),
    }
}

/// Kinds that agree in size but not in meaning (`float` vs `i32`, a pointer vs `u64`).
fn compare_kind(
    p: &KernelParam,
    class: &Cpp,
    c: Option<&str>,
    k: &kern_binary::Param,
    path: &JsonPath,
    fix: &str,
    sink: &mut Sink,
) {
    let Some(cname) = c else {
        // No C++ types (Triton, extern "C"): PTX's `.ptr` is still a fact.
        if k.pointer && matches!(p, KernelParam::Scalar(_)) {
            sink.error(path, format!("the kernel takes a pointer here (PTX `.ptr`), the manifest says {p}: write a buffer type or \"ptr\""));
        }
        return;
    };
    match (p, class) {
        (KernelParam::Scalar(s), Cpp::Pointer { .. }) => {
            sink.error(
                path,
                format!("the kernel takes a pointer ({cname}) here, the manifest says {s}{fix}"),
            );
        }
        (
            KernelParam::Buffer { .. } | KernelParam::Ptr,
            Cpp::Int { .. } | Cpp::Float { .. } | Cpp::Bool,
        ) => {
            sink.error(
                path,
                format!("the kernel takes {cname} here, not a pointer; the manifest says {p}{fix}"),
            );
        }
        (
            KernelParam::Struct { .. },
            Cpp::Int { .. } | Cpp::Float { .. } | Cpp::Bool | Cpp::Pointer { .. },
        ) => {
            sink.error(
                path,
                format!("the kernel takes {cname} here, not an aggregate{fix}"),
            );
        }
        (KernelParam::Scalar(s), kind @ (Cpp::Int { .. } | Cpp::Float { .. } | Cpp::Bool)) => {
            let ours = scalar_cpp(*s);
            if ours == *kind {
                return;
            }
            match (&ours, kind) {
                (Cpp::Int { .. }, Cpp::Int { .. })
                | (Cpp::Int { size: 1, .. }, Cpp::Bool)
                | (Cpp::Bool, Cpp::Int { size: 1, .. }) => {
                    sink.warn(path, format!("the kernel takes {cname} here, the manifest says {s} (same size, different signedness or meaning){fix}"));
                }
                _ => sink.error(
                    path,
                    format!("the kernel takes {cname} here, the manifest says {s}{fix}"),
                ),
            }
        }
        (
            KernelParam::Buffer { access, dtype },
            Cpp::Pointer {
                elem,
                generic,
                is_const,
            },
        ) => {
            if let (Some(e), false) = (elem, generic) {
                let same_size_ints =
                    is_int_dtype(*e) && is_int_dtype(*dtype) && e.size() == dtype.size();
                // A kernel reads GGUF blocks through a block struct, `void*`, bytes or words.
                let blocks_as_words = dtype.is_block() && is_int_dtype(*e);
                if e != dtype && !same_size_ints && !blocks_as_words {
                    sink.error(path, format!("the kernel takes {cname} here (buffer<{e}>), the manifest says {p}{fix}"));
                    return;
                }
            }
            if *is_const && access.writes() {
                sink.warn(path, format!("the kernel's parameter is {cname}, which it does not write through, but the manifest says `{}`: write \"in buffer<{dtype}>\"", access.name()));
            }
        }
        _ => {}
    }
}

/// Checks a block against `.reqntid` / `.maxntid`. `block` is the launch's block expressions,
/// `at_max` their values at the vars' max.
pub(crate) fn check_block(
    kernel: &Kernel,
    block: &[crate::expr::Expr; 3],
    at_max: [i64; 3],
    path: &JsonPath,
    sink: &mut Sink,
) {
    let shown = |b: [i64; 3]| format!("[{}, {}, {}]", b[0], b[1], b[2]);
    if let Some(req) = kernel.required_block {
        let req64 = req.map(i64::from);
        if block.iter().any(|e| e.uses_vars()) {
            sink.error(path, format!("the kernel requires a block of exactly {} (.reqntid), so `block` must be that constant, not an expression over vars", shown(req64)));
        } else if at_max != req64 {
            sink.error(
                path,
                format!(
                    "block is {} but the kernel requires exactly {} (.reqntid): write {}",
                    shown(at_max),
                    shown(req64),
                    shown(req64)
                ),
            );
        }
        return;
    }
    if let Some(max) = kernel.max_threads {
        let limit: i64 = max.iter().map(|&m| i64::from(m)).product();
        let threads = at_max
            .iter()
            .try_fold(1i64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(i64::MAX);
        if threads > limit {
            let when = if block.iter().any(|e| e.uses_vars()) {
                " at the vars' max"
            } else {
                ""
            };
            sink.error(path, format!("block {} has {threads} threads{when}, above the kernel's maximum of {limit} (.maxntid / __launch_bounds__)", shown(at_max)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;
    use kern_binary::Param;

    fn p(ordinal: u32, offset: u32, size: u32) -> Param {
        Param {
            ordinal,
            offset,
            size,
            align: None,
            ptx_type: None,
            pointer: false,
        }
    }

    /// The seed's rms_norm kernel as kern-binary describes it.
    fn rms_norm_kernel() -> Kernel {
        let cpp = [
            "c10::BFloat16*",
            "c10::BFloat16 const*",
            "long",
            "long",
            "long",
            "long",
            "long",
            "c10::BFloat16 const*",
            "long",
            "float",
            "int",
            "int",
        ];
        let sizes = [8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4];
        let mut at = 0;
        let params = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                at = align_up(at, s);
                let q = p(i as u32, at as u32, s as u32);
                at += s;
                q
            })
            .collect();
        Kernel {
            name: "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii"
                .into(),
            cpp_params: Some(cpp.iter().map(|s| s.to_string()).collect()),
            params,
            param_bytes: 84,
            max_threads: Some([1024, 1, 1]),
            ..Default::default()
        }
    }

    fn seed_params() -> Vec<KernelParam> {
        [
            "out buffer<bf16>",
            "in buffer<bf16>",
            "i64",
            "i64",
            "i64",
            "i64",
            "i64",
            "in buffer<bf16>",
            "i64",
            "f32",
            "i32",
            "i32",
        ]
        .iter()
        .map(|s| KernelParam::parse(s).unwrap())
        .collect()
    }

    fn run(k: &Kernel, params: &[KernelParam]) -> Vec<String> {
        let mut sink = Sink::default();
        let path = JsonPath::root()
            .field("ops")
            .entry("rms_norm", 0)
            .field("impl")
            .field("launches")
            .index(0)
            .field("params");
        check_params(k, params, &layout(params).unwrap(), &path, &mut sink);
        Diagnostics::new("m".into(), sink.into_items())
            .items
            .iter()
            .map(|d| d.to_string())
            .collect()
    }

    #[test]
    fn the_seed_op_matches_its_kernel() {
        assert_eq!(
            run(&rms_norm_kernel(), &seed_params()),
            Vec::<String>::new()
        );
        assert_eq!(layout(&seed_params()).unwrap().end, 84);
    }

    #[test]
    fn the_issue_s_example_message() {
        let mut params = seed_params();
        params[3] = KernelParam::Scalar(Scalar::I32);
        assert_eq!(
            run(&rms_norm_kernel(), &params),
            ["ops.rms_norm.impl.launches[0].params[3]: the kernel takes 8 bytes (long) here, the manifest says i32: write \"i64\""]
        );
    }

    #[test]
    fn kind_mismatches_of_equal_size() {
        let mut params = seed_params();
        params[9] = KernelParam::Scalar(Scalar::I32); // float
        params[2] = KernelParam::parse("in buffer<bf16>").unwrap(); // long
        params[1] = KernelParam::parse("in buffer<f32>").unwrap(); // c10::BFloat16 const*
        params[0] = KernelParam::Scalar(Scalar::U64); // c10::BFloat16*
        let got = run(&rms_norm_kernel(), &params);
        assert_eq!(got.len(), 4, "{got:#?}");
        assert!(got[0].ends_with("params[0]: the kernel takes a pointer (c10::BFloat16*) here, the manifest says u64: write \"out buffer<bf16>\""), "{}", got[0]);
        assert!(got[1].contains("params[1]: the kernel takes c10::BFloat16 const* here (buffer<bf16>), the manifest says in buffer<f32>: write \"in buffer<bf16>\""), "{}", got[1]);
        assert!(
            got[2].contains("params[2]: the kernel takes long here, not a pointer"),
            "{}",
            got[2]
        );
        assert!(
            got[3].contains(
                "params[9]: the kernel takes float here, the manifest says i32: write \"f32\""
            ),
            "{}",
            got[3]
        );
    }

    #[test]
    fn const_pointer_written_is_a_warning_and_signedness_too() {
        let mut params = seed_params();
        params[1] = KernelParam::parse("out buffer<bf16>").unwrap();
        params[10] = KernelParam::Scalar(Scalar::U32);
        let got = run(&rms_norm_kernel(), &params);
        assert_eq!(got.len(), 2);
        assert!(
            got[0].contains("params[1]: warning: the kernel's parameter is c10::BFloat16 const*"),
            "{}",
            got[0]
        );
        assert!(
            got[1]
                .contains("params[10]: warning: the kernel takes int here, the manifest says u32"),
            "{}",
            got[1]
        );
    }

    #[test]
    fn count_mismatch_lists_the_kernel_s_params() {
        let mut params = seed_params();
        params.pop();
        let got = run(&rms_norm_kernel(), &params);
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("params: the kernel takes 12 parameters, the manifest lists 11: the kernel's are [c10::BFloat16* (8 B at 0),"), "{}", got[0]);
    }

    /// binary-formats.md: `char, short, double, struct{i64,i32,f32,i64}, struct __align__(16)
    /// {4×f32}, ptr, ptr, u64` = (0,1) (2,2) (8,8) (16,24) (48,16) (64,8) (72,8) (80,8).
    fn mixed() -> (Kernel, Vec<KernelParam>) {
        let k = Kernel {
            name: "mixed".into(),
            params: vec![
                p(0, 0, 1),
                p(1, 2, 2),
                p(2, 8, 8),
                p(3, 16, 24),
                p(4, 48, 16),
                p(5, 64, 8),
                p(6, 72, 8),
                p(7, 80, 8),
            ],
            param_bytes: 88,
            ..Default::default()
        };
        let params = vec![
            KernelParam::Scalar(Scalar::I8),
            KernelParam::Scalar(Scalar::I16),
            KernelParam::Scalar(Scalar::F64),
            KernelParam::Struct { size: 24, align: 8 },
            KernelParam::Struct {
                size: 16,
                align: 16,
            },
            KernelParam::Ptr,
            KernelParam::parse("out buffer<f32>").unwrap(),
            KernelParam::Scalar(Scalar::U64),
        ];
        (k, params)
    }

    #[test]
    fn aggregates_and_alignment() {
        let (k, mut params) = mixed();
        assert_eq!(run(&k, &params), Vec::<String>::new());
        params[4] = KernelParam::Struct { size: 16, align: 8 };
        assert_eq!(
            run(&k, &params),
            ["ops.rms_norm.impl.launches[0].params[4]: the kernel has this parameter at byte offset 48, the manifest's layout puts it at 40: set this struct's `align` to 16"]
        );
        let (k, mut params) = mixed();
        params[3] = KernelParam::Struct { size: 20, align: 8 };
        let got = run(&k, &params);
        assert_eq!(got, ["ops.rms_norm.impl.launches[0].params[3]: the kernel takes 24 bytes here, the manifest says a struct of 20 bytes"]);
    }

    #[test]
    fn classify_cpp_types() {
        assert_eq!(
            classify("long"),
            Cpp::Int {
                size: 8,
                signed: true
            }
        );
        assert_eq!(
            classify("unsigned long long"),
            Cpp::Int {
                size: 8,
                signed: false
            }
        );
        assert_eq!(
            classify("float const* __restrict__"),
            Cpp::Pointer {
                elem: Some(DType::F32),
                generic: false,
                is_const: true
            }
        );
        assert_eq!(
            classify("__nv_bfloat16*"),
            Cpp::Pointer {
                elem: Some(DType::Bf16),
                generic: false,
                is_const: false
            }
        );
        assert_eq!(
            classify("void*"),
            Cpp::Pointer {
                elem: None,
                generic: true,
                is_const: false
            }
        );
        assert_eq!(
            classify("float**"),
            Cpp::Pointer {
                elem: None,
                generic: true,
                is_const: false
            }
        );
        assert_eq!(classify("vllm::Params"), Cpp::Other);
        assert_eq!(
            classify("cute::Tensor<float*, cute::Layout<int> >"),
            Cpp::Other
        );
        assert_eq!(
            classify("int const*"),
            Cpp::Pointer {
                elem: Some(DType::I32),
                generic: false,
                is_const: true
            }
        );
    }

    #[test]
    fn blocks() {
        let e = |s: &str| crate::expr::Expr::parse(s, |n| (n == "n").then_some(0)).unwrap();
        let run = |k: &Kernel, b: [&str; 3], at: [i64; 3]| {
            let mut sink = Sink::default();
            check_block(
                k,
                &[e(b[0]), e(b[1]), e(b[2])],
                at,
                &JsonPath::root().field("block"),
                &mut sink,
            );
            sink.into_items()
                .into_iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
        };
        let req = Kernel {
            required_block: Some([128, 1, 1]),
            ..Default::default()
        };
        assert!(run(&req, ["128", "1", "1"], [128, 1, 1]).is_empty());
        assert_eq!(run(&req, ["256", "1", "1"], [256, 1, 1]), ["block: block is [256, 1, 1] but the kernel requires exactly [128, 1, 1] (.reqntid): write [128, 1, 1]"]);
        assert!(run(&req, ["n", "1", "1"], [128, 1, 1])[0].contains("must be that constant"));
        let max = Kernel {
            max_threads: Some([256, 1, 1]),
            ..Default::default()
        };
        assert!(run(&max, ["16", "16", "1"], [16, 16, 1]).is_empty());
        assert_eq!(run(&max, ["n", "1", "1"], [512, 1, 1]), ["block: block [512, 1, 1] has 512 threads at the vars' max, above the kernel's maximum of 256 (.maxntid / __launch_bounds__)"]);
    }
}
