//! The CLI end to end on the host: inspect, extract, check, plan, run without a driver.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kern(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(args).current_dir(root()).output().expect("kern runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    let p = std::env::var_os("KERN_FIXTURES").map(PathBuf::from).unwrap_or_else(|| root().join("build/fixtures"));
    assert!(p.join("vecadd.sm_90.cubin").exists(), "fixtures missing: run scripts/build-fixtures.sh");
    p
}

#[test]
fn inspect_json_has_the_documented_shape() {
    let f = fixtures().join("vecadd.zstd.fatbin");
    let (code, out, err) = kern(&["inspect", "--json", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["images"].as_array().unwrap().len(), 2);
    let cubin = v["images"].as_array().unwrap().iter().find(|i| i["kind"] == "cubin").unwrap();
    assert_eq!(cubin["arch"], "sm_90");
    assert_eq!(cubin["compressed"], true);
    let k = &cubin["kernels"][0];
    assert_eq!(k["name"], "_Z6VecAddPfS_S_");
    assert_eq!(k["demangled"], "VecAdd(float*, float*, float*)");
    assert_eq!(k["param_bytes"], 24);
    assert_eq!(k["params"][2]["offset"], 16);
    assert!(k["registers"].as_u64().unwrap() > 0);
    assert_eq!(v["selected"].as_array().unwrap().len(), 1);
}

#[test]
fn inspect_errors_name_the_file() {
    let (code, _, err) = kern(&["inspect", "Cargo.toml"]);
    assert_eq!(code, 1);
    assert!(err.contains("Cargo.toml") && err.contains("not a GPU binary"), "{err}");
    let (code, _, err) = kern(&["inspect", "does/not/exist.cubin"]);
    assert_eq!(code, 1);
    assert!(err.contains("does/not/exist.cubin"), "{err}");
}

#[test]
fn extract_takes_the_sass_or_the_ptx() {
    let so = fixtures().join("libvecadd.so");
    let dir = std::env::temp_dir().join(format!("kern-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("v.cubin");
    let (code, _, err) = kern(&["extract", so.to_str().unwrap(), "--arch", "sm_90", "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let b = kern_binary_read(&out);
    assert!(b.contains("cubin sm_90"), "{b}");
    let ptx = dir.join("v.ptx");
    let (code, _, err) = kern(&["extract", so.to_str().unwrap(), "--arch", "sm_100", "-o", ptx.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&ptx).unwrap().contains(".entry _Z6VecAddPfS_S_"));
    let (code, _, err) = kern(&["extract", so.to_str().unwrap(), "--arch", "sm_75"]);
    assert_eq!(code, 1);
    assert!(err.contains("no image loads on sm_75"), "{err}");
}

fn kern_binary_read(p: &Path) -> String {
    kern(&["inspect", p.to_str().unwrap()]).1
}

#[test]
fn examples_check_and_plan() {
    for e in ["vecadd", "triton-add", "so-extract"] {
        let m = format!("examples/{e}/model.json");
        let (code, out, err) = kern(&["check", &m]);
        assert_eq!(code, 0, "{e}: {err}");
        assert!(out.contains("ok"), "{out}");
        let (code, out, err) = kern(&["plan", &m, "--gpu-mem", "2GiB"]);
        assert_eq!(code, 0, "{e}: {err}");
        assert!(out.contains("arena:"), "{out}");
    }
}

#[test]
fn run_without_a_driver_fails_clearly() {
    let (code, _, err) = kern(&["run", "examples/vecadd/model.json", "--input", "A=range"]);
    if kern_cuda::driver_available() {
        assert_eq!(code, 0, "with a driver the example runs: {err}");
    } else {
        assert_eq!(code, 1);
        assert!(err.contains("no CUDA driver found"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn schema_subcommand_matches_the_checked_in_schema() {
    let (code, out, _) = kern(&["schema"]);
    assert_eq!(code, 0);
    assert_eq!(out, std::fs::read_to_string(root().join("schema/manifest.schema.json")).unwrap());
}

/// Issue 17: a tensor-parallel manifest takes the multi-GPU path of `kern run`; without a
/// driver it fails as clearly as a single-GPU one, and the TP flags are refused for
/// single-GPU manifests.
#[test]
fn tensor_parallel_run_without_a_driver_fails_clearly() {
    let m = root().join("tests/manifests/parallel/model.json");
    let (code, _, err) = kern(&["run", m.to_str().unwrap(), "--nnodes", "2", "--node-rank", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--node-rank 2 of --nnodes 2"), "{err}");
    if !kern_cuda::driver_available() {
        let (code, _, err) = kern(&["run", m.to_str().unwrap()]);
        assert_eq!(code, 1);
        assert!(err.contains("no CUDA driver found") && !err.contains("panicked"), "{err}");
    }
    let (code, _, err) = kern(&["run", "examples/vecadd/model.json", "--devices", "0,1"]);
    assert_eq!(code, 1);
    assert!(err.contains("--devices and --nnodes are for tensor-parallel manifests"), "{err}");
}
