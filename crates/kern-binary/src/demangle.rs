//! Itanium C++ demangling (through `cpp_demangle`) and splitting a demangled signature into
//! its parameter types, so that `kern check` can compare them with a manifest.

use cpp_demangle::{DemangleOptions, ParseOptions, Symbol};

/// Names longer than this are not demangled: real kernel names are far shorter, and the
/// demangler's cost grows with the input.
const MAX_MANGLED_LEN: usize = 16 * 1024;

/// The demangled form of an Itanium-mangled name (`_Z…`), or None when the name is not one
/// (extern "C", Triton, CuTe DSL names) or cannot be demangled.
pub fn demangle(name: &str) -> Option<String> {
    if !name.starts_with("_Z") || name.len() > MAX_MANGLED_LEN {
        return None;
    }
    // cpp_demangle bounds its recursion; catch_unwind is a second fence so that a demangler bug
    // on a hostile name can never take kern down.
    std::panic::catch_unwind(|| {
        let sym = Symbol::new_with_options(name.as_bytes(), &ParseOptions::default().recursion_limit(96)).ok()?;
        sym.demangle_with_options(&DemangleOptions::default().recursion_limit(128)).ok()
    })
    .ok()
    .flatten()
}

/// The parameter types of a demangled function signature: `void f<int, 2>(float*, long)` gives
/// `["float*", "long"]`; `f()` and `f(void)` give an empty list. None when the text does not
/// end in a parameter list.
pub fn param_types(demangled: &str) -> Option<Vec<String>> {
    let s = demangled.trim_end();
    // Strip trailing cv/ref qualifiers of member functions (`) const`).
    let s = s.strip_suffix(" const").unwrap_or(s);
    if !s.ends_with(')') {
        return None;
    }
    // Find the '(' matching the final ')'.
    let bytes = s.as_bytes();
    let mut depth = 0i32;
    let mut open = None;
    for (i, &c) in bytes.iter().enumerate().rev() {
        match c {
            b')' | b'>' | b']' => depth += 1,
            b'(' | b'<' | b'[' => {
                depth -= 1;
                if depth == 0 && c == b'(' {
                    open = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &s[open? + 1..s.len() - 1];
    if inner.trim().is_empty() || inner.trim() == "void" {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(inner[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(inner[start..].trim().to_string());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_names() {
        assert_eq!(demangle("_Z6VecAddPfS_S_").as_deref(), Some("VecAdd(float*, float*, float*)"));
        let v = demangle("_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii").unwrap();
        assert_eq!(
            v,
            "void vllm::rms_norm_kernel<c10::BFloat16, 8, 2, true>(c10::BFloat16*, c10::BFloat16 const*, long, long, long, long, long, c10::BFloat16 const*, long, float, int, int)"
        );
        let p = param_types(&v).unwrap();
        assert_eq!(p.len(), 12);
        assert_eq!(p[1], "c10::BFloat16 const*");
        assert_eq!(p[11], "int");
    }

    #[test]
    fn not_mangled() {
        assert_eq!(demangle("cfun"), None);
        assert_eq!(demangle("kernel_cutlass_kernel_tensorptrf32gmemalign16o1__0"), None);
        assert_eq!(demangle("_Z"), None);
        assert_eq!(demangle("_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ"), None);
    }

    #[test]
    fn params_with_nested_templates_and_function_pointers() {
        assert_eq!(param_types("f()").unwrap(), Vec::<String>::new());
        assert_eq!(param_types("f(void)").unwrap(), Vec::<String>::new());
        assert_eq!(
            param_types("void k<a<b, c>, 3>(Foo<int, (Bar)2>, void (*)(int, int), int)").unwrap(),
            vec!["Foo<int, (Bar)2>", "void (*)(int, int)", "int"]
        );
        assert_eq!(param_types("no params here"), None);
    }

    #[test]
    fn hostile_names_do_not_panic() {
        let deep = format!("_Z{}", "PPPPPPPPPP".repeat(2000));
        let _ = demangle(&deep);
        let long = format!("_Z{}", "A".repeat(MAX_MANGLED_LEN));
        assert_eq!(demangle(&long), None);
    }
}
