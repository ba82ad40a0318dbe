//! Shared by the integration tests: where the repository's test manifests and the built GPU
//! fixtures are, and how to lay a manifest out next to the fixtures it names.
//!
//! Test manifests name their modules by file name (`"source": "vecadd.sm_90.cubin"`); the
//! cubins are built by `scripts/build-fixtures.sh` into `build/fixtures/`. Each test copies the
//! manifest and the fixtures into a fresh temporary directory, so module paths resolve exactly
//! as they would next to a real model. Missing fixtures fail the test (never a silent skip).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The fixtures the test manifests use, with the sha256 the manifests record. The pinned
/// toolchain builds them reproducibly (checked by building twice).
pub const FIXTURES: &[(&str, &str)] = &[
    (
        "vecadd.sm_90.cubin",
        "baa44daeba36f7604ee455d8a694b610f8f3b6b26b7bf8dd7940cffef4f585c8",
    ),
    (
        "vllm_rms_norm.sm_90.cubin",
        "5cd4832bcaa8139831dd317ff873ebfda336e5209a4d3ab32ca46edc4287ee4c",
    ),
    (
        "mixed.sm_90.cubin",
        "ff7222a63fd2a1a860ce8d36bd2962d15ee1852ff02efdc3aadccae91904174f",
    ),
    (
        "triton_rmsnorm.cubin",
        "94c81d8bc4d20c7b3d28063de7e7af209870850ba7ef849580b3196e4837742c",
    ),
    (
        "vecadd.ptxas128.sm_80.cubin",
        "bdf35877593ea7964cd5b0de404ed3ca5891ed392fd0118e1fb2dafe23b800c6",
    ),
];

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

pub fn manifests() -> PathBuf {
    repo().join("tests/manifests")
}

/// `build/fixtures` (or `$KERN_FIXTURES`, as for scripts/build-fixtures.sh).
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("KERN_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("build/fixtures"));
    for (name, _) in FIXTURES {
        let f = dir.join(name);
        assert!(
            f.is_file(),
            "fixtures missing: run scripts/build-fixtures.sh (no {})",
            f.display()
        );
    }
    dir
}

/// A temporary directory holding `manifest` (as `model.json`, or under its own name with
/// `keep_name`) and copies of every fixture.
pub struct Staged {
    pub dir: tempfile::TempDir,
    pub manifest: PathBuf,
}

pub fn stage(manifest: &Path) -> Staged {
    let fx = fixtures();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for (name, _) in FIXTURES {
        std::fs::copy(fx.join(name), model.join(name)).unwrap();
    }
    let target = model.join(manifest.file_name().unwrap());
    std::fs::copy(manifest, &target).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    Staged {
        dir,
        manifest: target,
    }
}

/// `tests/data/speculative.json`: the 4.1 manifest most extension tests edit.
pub fn speculative_manifest_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/speculative.json")
}

/// That manifest as JSON, to edit.
pub fn speculative_manifest() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(speculative_manifest_path()).unwrap()).unwrap()
}

/// Checks an edited copy of it, staged beside its fixtures.
pub fn check_speculative_edit(v: &serde_json::Value) -> Result<kern_manifest::Manifest, kern_manifest::Diagnostics> {
    let staged = stage(&speculative_manifest_path());
    kern_manifest::check_bytes(&serde_json::to_vec_pretty(v).unwrap(), &staged.manifest, &kern_manifest::CheckOptions::default())
}

/// The error lines (`PATH: MESSAGE`, without the file) of an edited copy that must fail.
pub fn speculative_edit_errors(v: &serde_json::Value) -> Vec<String> {
    match check_speculative_edit(v) {
        Ok(_) => panic!("passed kern check, but should fail"),
        Err(d) => d.errors().map(|e| e.to_string()).collect(),
    }
}
