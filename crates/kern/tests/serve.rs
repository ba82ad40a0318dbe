//! `kern serve` as a process, on the deterministic CPU model (`--fake`): it binds, answers, drains
//! on SIGTERM (exit 0, the running stream completes) and exits 1 when the engine faults.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tokenizer_dir() -> PathBuf {
    let d = std::env::var_os("KERN_TEST_DATA").map(PathBuf::from).unwrap_or_else(|| root().join("build/test-data")).join("qwen3-tokenizer");
    assert!(d.join("tokenizer.json").exists(), "run scripts/fetch-test-data.sh");
    d
}

/// Starts `kern serve --fake …` on a free port; returns the child and its address.
fn start(extra: &[&str]) -> (Child, String) {
    let tok = tokenizer_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kern"))
        .args(["serve", "--fake", "--port", "0", "--fake-tokenizer", tok.to_str().unwrap()])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("kern runs");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("kern serve printed its address").unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let t = Instant::now();
    while http(&addr, "GET", "/health", "").0 != 200 {
        assert!(t.elapsed() < Duration::from_secs(20), "not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

/// One HTTP/1.1 request; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, String::new()) };
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map_or(String::new(), |x| x.1.to_string()))
}

fn wait_exit(child: &mut Child) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        assert!(t.elapsed() < Duration::from_secs(30), "kern serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_drains_the_running_stream_then_exits_0() {
    let (mut child, addr) = start(&["--fake-step-ms", "10"]);
    let a = addr.clone();
    let stream = std::thread::spawn(move || http(&a, "POST", "/v1/completions", r#"{"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": true, "stream": true}"#));
    // Wait until the request runs (a loaded CI machine may take a while to get there).
    let t = Instant::now();
    while !http(&addr, "GET", "/metrics", "").1.contains("kern:num_requests_running 1") {
        assert!(t.elapsed() < Duration::from_secs(20), "the request never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let (status, body) = stream.join().unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"finish_reason\":\"length\"") && body.contains("data: [DONE]"), "the stream finished: {body}");
    assert_eq!(wait_exit(&mut child), 0);
}

#[test]
fn an_engine_fault_answers_500_and_exits_1() {
    let (mut child, addr) = start(&["--fake-fail-at-step", "3"]);
    let (status, body) = http(&addr, "POST", "/v1/completions", r#"{"prompt": [1, 2, 3], "max_tokens": 20, "ignore_eos": true}"#);
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("layer3.attn"), "names the op: {body}");
    assert_eq!(wait_exit(&mut child), 1);
}

#[test]
fn help_lists_the_flags_and_a_missing_model_says_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--model", "--host", "--port", "--api-key", "--served-model-name", "--gpu-mem", "--max-seqs", "--max-batched-tokens", "--chat-template", "--snapshot-slots", "--batch-invariant"] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["serve", "--model", "m", "--snapshot-slots", "many"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a snapshot count that is not a number is a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--snapshot-slots"));
    let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["serve", "--model", "/nonexistent/model/dir", "--port", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model/dir"), "{err}");
}

/// `--batch-invariant` serves only a manifest that declares `batch_invariant` (issue 29): another
/// model is refused at start with what to do; a declaring one gets past the check (and then
/// needs a GPU).
#[test]
fn batch_invariant_serving_needs_a_manifest_that_declares_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("kern-serve-invariant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(root.join("examples/perseq/perseq.sm_90.cubin"), dir.join("perseq.sm_90.cubin")).unwrap();
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join("examples/perseq/model.json")).unwrap()).unwrap();
    std::fs::write(dir.join("model.json"), m.to_string()).unwrap();
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_kern")).args(["serve", "--model", dir.to_str().unwrap(), "--port", "0", "--batch-invariant"]).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (code, err) = run();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("does not declare `batch_invariant`") && err.contains("kern pack --batch-invariant"), "{err}");
    m["batch_invariant"] = serde_json::Value::Bool(true);
    std::fs::write(dir.join("model.json"), m.to_string()).unwrap();
    let (_, err) = run();
    assert!(!err.contains("does not declare") && err.contains("batch-invariant: the manifest declares it"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--spec-draft` on the CPU model (its own rule as the draft): the completion equals the one
/// without drafts, and /metrics counts draft steps and accepted drafts.
#[test]
fn a_draft_program_serves_the_same_completion() {
    let body = r#"{"prompt": [5, 6, 7, 8], "max_tokens": 24, "ignore_eos": true, "temperature": 0}"#;
    let tokens = |addr: &str| -> String {
        let (status, b) = http(addr, "POST", "/v1/completions", body);
        assert_eq!(status, 200, "{b}");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let (mut plain, a) = start(&[]);
    let want = tokens(&a);
    plain.kill().unwrap();
    let _ = plain.wait();
    let (mut spec, a) = start(&["--spec-draft", "--spec-k", "3"]);
    assert_eq!(tokens(&a), want);
    let metrics = http(&a, "GET", "/metrics", "").1;
    let value = |name: &str| -> f64 { metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} not in /metrics")) };
    assert!(value("kern:spec_decode_num_draft_steps_total") > 0.0, "{metrics}");
    assert!(value("kern:spec_decode_num_accepted_tokens_total") > 0.0);
    assert_eq!(value("kern:spec_decode_num_accepted_tokens_total"), value("kern:spec_decode_num_draft_tokens_total"), "the model as its own draft");
    spec.kill().unwrap();
    let _ = spec.wait();
}
