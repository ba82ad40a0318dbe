//! The broken corpus: `tests/manifests/broken/NAME.json` holds one mistake, `NAME.expect` the
//! errors `kern check` must report for it, one per line (`#` lines are comments). A line is
//! one error: its text must appear in one diagnostic line, where `…` stands for anything
//! (a temporary directory). The manifest must report exactly as many errors as there are
//! lines, so a mistake that also causes follow-on errors fails here.
//!
//! Also: several mistakes are all reported, in document order; malformed, huge and deeply
//! nested input get clean errors.

mod common;

use common::{manifests, stage};
use kern_manifest::{check_bytes, load, CheckOptions, Diagnostics};
use std::path::Path;

fn expectations(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// Whether `line` holds the fragments of `pattern` (split at `…`) in order.
fn matches(line: &str, pattern: &str) -> bool {
    let mut rest = line;
    for frag in pattern.split('…') {
        match rest.find(frag) {
            Some(i) => rest = &rest[i + frag.len()..],
            None => return false,
        }
    }
    true
}

fn error_lines(d: &Diagnostics) -> Vec<String> {
    let text = d.to_string();
    text.lines()
        .filter(|l| !l.contains(": warning: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_broken_manifest_fails_with_its_expected_errors() {
    let dir = manifests().join("broken");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
        .collect();
    names.sort();
    assert!(
        names.len() >= 20,
        "the corpus has only {} manifests",
        names.len()
    );
    let mut failures = vec![];
    for name in &names {
        let expect_path = dir.join(format!("{name}.expect"));
        if !expect_path.is_file() {
            failures.push(format!("{name}: no {name}.expect"));
            continue;
        }
        let want = expectations(&expect_path);
        let staged = stage(&dir.join(format!("{name}.json")));
        let got = match load(&staged.manifest, &CheckOptions::default()) {
            Ok(_) => {
                failures.push(format!(
                    "{name}: passed kern check, but should fail with {want:?}"
                ));
                continue;
            }
            Err(d) => d,
        };
        let lines = error_lines(&got);
        for w in &want {
            if !lines.iter().any(|l| matches(l, w)) {
                failures.push(format!(
                    "{name}: no error matches\n    {w}\n  got:\n    {}",
                    lines.join("\n    ")
                ));
            }
        }
        if got.error_count() != want.len() {
            failures.push(format!(
                "{name}: {} errors, expected {}:\n    {}",
                got.error_count(),
                want.len(),
                lines.join("\n    ")
            ));
        }
    }
    // Every .expect has its manifest.
    for e in std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
    {
        if let Some(n) = e.strip_suffix(".expect") {
            if !names.iter().any(|m| m == n) {
                failures.push(format!("{e} has no {n}.json"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} broken manifests misbehave:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

#[test]
fn the_matcher_can_fail() {
    assert!(matches("a: b/x has c", "a: …/x has c"));
    assert!(!matches("a: b/x has c", "a: …/y has c"));
    assert!(!matches("x then y", "y…x"));
}

/// Five mistakes in five sections: all are reported, in the order they appear in the file.
#[test]
fn all_errors_are_reported_in_document_order() {
    let staged = stage(&manifests().join("extensions/model.json"));
    let text = std::fs::read_to_string(&staged.manifest).unwrap();
    let replace = |t: String, a: &str, b: &str| {
        assert!(t.contains(a), "{a}");
        t.replacen(a, b, 1)
    };
    let text = replace(text, r#""seqs": { "max": 256 }"#, r#""seqs": { "max": 0 }"#);
    let text = replace(
        text,
        r#""gdn": { "bytes_per_seq": 1048576 }"#,
        r#""gdn": { "bytes_per_sq": 1048576 }"#,
    );
    let text = replace(
        text,
        r#""tiles": { "dtype": "f32", "shape": ["ceil(tokens/64)*64", 4] }"#,
        r#""tiles": { "dtype": "f32", "shape": ["ceil(tokens/64)*64", "heads"] }"#,
    );
    let text = replace(
        text,
        r#""entry": "_Z7boundedPfi""#,
        r#""entry": "_Z7boundedPfj""#,
    );
    let text = replace(
        text,
        r#"{ "buf": "h" }, { "var": "tokens" }"#,
        r#"{ "buf": "h" }, { "var": "token" }"#,
    );
    let err = check_bytes(text.as_bytes(), &staged.manifest, &CheckOptions::default()).unwrap_err();
    let lines = error_lines(&err);
    let want = [
        "vars.seqs.max: a var's max is at least 1, not 0",
        "states.gdn.bytes_per_sq: unknown field `bytes_per_sq` (did you mean `bytes_per_seq`?)",
        "buffers.tiles.shape[1]: var `heads` is not declared in `vars`",
        "ops.bounded.impl.launches[0].entry: the module has no kernel `_Z7boundedPfj`",
        "program.calls[1].args[1].var: `token` is not a var (did you mean `tokens`?)",
    ];
    assert_eq!(err.error_count(), want.len() + 1, "{err}");
    let mut at = 0;
    for w in want {
        let i = lines[at..]
            .iter()
            .position(|l| l.contains(w))
            .unwrap_or_else(|| panic!("`{w}` missing or out of order in\n{err}"));
        at += i + 1;
    }
    // The misspelt field also leaves the state without a size.
    assert!(
        err.to_string()
            .contains("states.gdn: a state needs its size"),
        "{err}"
    );
}

#[test]
fn huge_manifests_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.json");
    // A sparse file just over the cap: refused from its size alone.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(kern_manifest::DEFAULT_MAX_MANIFEST_BYTES + 1)
        .unwrap();
    let err = load(&path, &CheckOptions::default()).unwrap_err();
    assert_eq!(err.error_count(), 1);
    assert!(
        err.to_string()
            .contains("above kern's limit of 64.0 MiB (67108864 B) for a manifest"),
        "{err}"
    );
    // The same through the in-memory entry point, with a small cap.
    let opts = CheckOptions {
        max_manifest_bytes: 1000,
        ..CheckOptions::default()
    };
    let big = format!("{{\"model\": \"{}\"}}", "x".repeat(2000));
    let err = check_bytes(big.as_bytes(), &path, &opts).unwrap_err();
    assert!(err.to_string().contains("for a manifest"), "{err}");
}

#[test]
fn a_device_file_is_not_read_whole() {
    let opts = CheckOptions {
        max_manifest_bytes: 4096,
        ..CheckOptions::default()
    };
    let err = load(Path::new("/dev/zero"), &opts).unwrap_err();
    assert!(err.to_string().contains("above kern's limit"), "{err}");
}

#[test]
fn deep_nesting_is_a_clean_error() {
    let deep = format!(
        "{{\"schema_version\": 4, \"model\": {}{}}}",
        "[".repeat(50_000),
        "]".repeat(50_000)
    );
    let err = check_bytes(
        deep.as_bytes(),
        Path::new("deep.json"),
        &CheckOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("deep.json:1:"), "{text}");
    assert!(text.contains("nesting is deeper than 128 levels"), "{text}");
}

#[test]
fn malformed_input_gets_line_and_column() {
    let cases: [(&[u8], &str); 5] = [
        (b"", "m.json:1:1: not valid JSON: EOF while parsing a value"),
        (
            b"{\n  \"schema_version\": 4,\n}",
            "m.json:3:1: not valid JSON: trailing comma",
        ),
        (
            b"{\"a\": \xff}",
            "m.json:1:7: not valid JSON: the file is not valid UTF-8",
        ),
        (
            b"{\"schema_version\": 4} {}",
            "m.json:1:23: not valid JSON: trailing characters",
        ),
        (
            b"\"just a string\"",
            "m.json: a manifest is a JSON object, found a string",
        ),
    ];
    for (input, want) in cases {
        let err = check_bytes(input, Path::new("m.json"), &CheckOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string().trim_end(),
            want,
            "for {:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn huge_numbers_and_long_expressions_are_clean_errors() {
    let text = format!(
        r#"{{"schema_version": 4, "model": "m", "vars": {{"n": {{"max": 1e400}}}}, "buffers": {{"b": {{"dtype": "u8", "shape": ["{}"]}}}}}}"#,
        "n+".repeat(2000) + "n"
    );
    let err = check_bytes(
        text.as_bytes(),
        Path::new("m.json"),
        &CheckOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("number out of range"), "{err}");
    let text = format!(
        r#"{{"schema_version": 4, "model": "m", "vars": {{"n": {{"max": 9223372036854775807}}}}, "buffers": {{"b": {{"dtype": "u64", "shape": ["n", "n"]}}, "c": {{"dtype": "u8", "shape": ["{}"]}}}}, "program": {{"calls": []}}}}"#,
        "n+".repeat(2000) + "n"
    );
    let err = check_bytes(
        text.as_bytes(),
        Path::new("m.json"),
        &CheckOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "buffers.b.shape: the buffer's size at the vars' max does not fit in 64 bits"
        ),
        "{text}"
    );
    assert!(text.contains("buffers.c.shape[0]: `n+n+n+"), "{text}");
    assert!(text.contains("longer than 1024 characters"), "{text}");
}
