//! `kern test` end to end on the host: exit codes, the report and its JSON, and a clear exit 2
//! (never a panic) where no GPU is present.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kern(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(args).current_dir(root()).output().expect("kern runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const VECADD: &str = "examples/vecadd/model.json";

#[test]
fn without_a_gpu_kern_test_exits_2_with_the_reason() {
    let (code, out, err) = kern(&["test", VECADD, VECADD]);
    assert!(!err.contains("panicked"), "{err}");
    if kern_cuda::driver_available() {
        assert_eq!(code, 0, "with a driver a manifest equals itself:\n{out}\n{err}");
        assert!(out.contains("verdict: EQUAL"), "{out}");
    } else {
        assert_eq!(code, 2, "{out}\n{err}");
        assert!(out.contains("NOT COMPARABLE") && out.contains("no CUDA driver found"), "{out}");
        assert!(out.contains("--match-only"), "the report says what works without a GPU: {out}");
        assert!(err.contains("cannot be compared"), "{err}");
    }
}

#[test]
fn match_only_needs_no_gpu_and_prints_json() {
    let (code, out, err) = kern(&["test", VECADD, VECADD, "--match-only", "--json"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(j["verdict"], "equal");
    assert_eq!(j["matching"]["intervals"], 1);
    assert_eq!(j["matching"]["one_to_one"], 1);
    assert_eq!(j["ops"][0]["op"], "vec_add");
    assert_eq!(j["ops"][0]["same_impl"], true);
}

#[test]
fn unusable_arguments_and_manifests_exit_2() {
    let (code, out, _) = kern(&["test", VECADD, VECADD, "--set", "n"]);
    assert_eq!(code, 2);
    assert!(out.contains("--set n: write VAR=N"), "{out}");
    let (code, out, _) = kern(&["test", VECADD, "no/such/model.json", "--match-only"]);
    assert_eq!(code, 2);
    assert!(out.contains("no/such/model.json"), "{out}");
    // Two different models: their vars differ, or they share no value.
    let (code, out, _) = kern(&["test", VECADD, "examples/triton-add/model.json", "--match-only"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("NOT COMPARABLE"), "{out}");
}
