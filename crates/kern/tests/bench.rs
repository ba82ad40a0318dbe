//! `kern bench` on the CPU model (`--fake`): argument handling and the JSON report's shape (the
//! numbers themselves come from the GPU: scripts/gpu/).

use std::process::Command;

fn kern(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn decode_and_prefill_reports() {
    let (code, out, err) = kern(&["bench", "--fake", "--batch", "3", "--context", "20", "--steps", "10", "--warmup", "2", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["kind"].as_str(), v["batch"].as_u64(), v["steps"].as_u64()), (Some("decode"), Some(3), Some(10)));
    assert_eq!(v["tokens_per_step"], 3.0, "every timed step is a full batch");
    assert!(v["median_ms"].as_f64().unwrap() > 0.0 && v["p90_ms"].as_f64().unwrap() >= v["median_ms"].as_f64().unwrap());
    assert_eq!(v["timing"], "wall");
    assert!(v["floor_ms"].is_null(), "the CPU model measures no bandwidth");
    let (code, out, err) = kern(&["bench", "--fake", "--batch", "2", "--steps", "4", "--spec-ngram", "3", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["spec_draft_tokens"].is_u64() && v["spec_accepted_tokens"].is_u64(), "{v}");
    assert_eq!(v["steps"], 4);
    // The fake's draft program is the model itself: every draft is accepted.
    let (code, out, err) = kern(&["bench", "--fake", "--batch", "2", "--steps", "4", "--spec-draft", "--spec-k", "3", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let (drafted, accepted) = (v["spec_draft_tokens"].as_u64().unwrap(), v["spec_accepted_tokens"].as_u64().unwrap());
    assert!(drafted > 0 && accepted == drafted && v["spec_draft_steps"].as_u64().unwrap() > 0, "{v}");
    assert!(v["tokens_per_step"].as_f64().unwrap() > 2.0, "several tokens per sequence and step: {v}");
    let (code, out, err) = kern(&["bench", "--fake", "--prompt-tokens", "300"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("prefill of one 300-token prompt") && out.contains("tok/s"), "{out}");
}

#[test]
fn bad_arguments_are_refused_clearly() {
    let (code, _, err) = kern(&["bench", "--fake", "--batch", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("--batch"), "{err}");
    let (code, _, err) = kern(&["bench", "--fake", "--batch", "999"]);
    assert_eq!(code, 1);
    assert!(err.contains("--batch 999") && err.contains("256"), "{err}");
}

#[test]
fn profile_without_a_driver_fails_clearly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let model = root.join("examples/perseq");
    let (code, out, err) = kern(&["profile", "--model", model.to_str().unwrap(), "--batch", "2", "--context", "5"]);
    if kern_cuda::driver_available() {
        assert_eq!(code, 0, "with a driver the toy model profiles: {err}");
        assert!(out.contains("running_sum"), "{out}");
    } else {
        assert_eq!(code, 1);
        assert!(err.contains("no CUDA driver found") && !err.contains("panicked"), "{err}");
    }
    let (code, _, err) = kern(&["profile", "--model", model.to_str().unwrap(), "--batch", "0"]);
    assert_eq!(code, 1);
    assert!(err.contains("--batch"), "{err}");
}
