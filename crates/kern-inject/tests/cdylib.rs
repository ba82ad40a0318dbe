//! The built shared library: it exports `InitializeInjection` (and no Rust symbols), and when
//! CUPTI cannot be found, calling it returns 0 with a clear message and the host goes on.
//!
//! The call happens in a child process (this test binary re-run with an environment variable)
//! that `dlopen`s the real `libkern_inject.so`, exactly as the CUDA driver would.

use std::path::PathBuf;
use std::process::Command;

use object::{Object, ObjectSymbol};

const CHILD_ENV: &str = "KERN_INJECT_TEST_CHILD";

/// The library cargo built for this test run: `target/<profile>/deps/libkern_inject.so`, next
/// to this test binary (`cargo test` does not copy it up to `target/<profile>/`).
fn lib_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let here = deps.join("libkern_inject.so");
    if here.exists() {
        here
    } else {
        deps.parent().unwrap().join("libkern_inject.so")
    }
}

#[test]
fn exports_initialize_injection_only() {
    let bytes =
        std::fs::read(lib_path()).expect("libkern_inject.so was built next to the test binaries");
    let file = object::File::parse(&*bytes).unwrap();
    let exported: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .collect();
    assert!(
        exported.iter().any(|s| s == "InitializeInjection"),
        "{exported:?}"
    );
    assert!(
        !exported.iter().any(|s| s.starts_with("_ZN")),
        "Rust symbols leak: {exported:?}"
    );
}

/// Runs in the child: load the library like the driver does and call the entry point twice.
#[test]
fn child_entry() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let path = std::ffi::CString::new(lib_path().to_str().unwrap()).unwrap();
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        let f = libc::dlsym(h, c"InitializeInjection".as_ptr());
        assert!(!f.is_null());
        let init: extern "C" fn() -> i32 = std::mem::transmute(f);
        println!("RESULT={}", init());
        println!("AGAIN={}", init());
    }
}

fn run_child(envs: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kern-inject-cdylib-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn without_cupti_it_returns_0_says_why_and_notes_it_in_the_trace() {
    let dir = temp_dir("nocupti");
    let (stdout, stderr) = run_child(&[
        ("KERN_CUPTI_LIB", "/nonexistent/libcupti.so.13"),
        ("KERN_DUMP_DIR", dir.to_str().unwrap()),
        ("KERN_DUMP_VERBOSE", "1"),
    ]);
    assert!(
        stdout.contains("RESULT=0") && stdout.contains("AGAIN=0"),
        "{stdout}"
    );
    assert!(
        stderr.contains("[kern-dump] InitializeInjection"),
        "{stderr}"
    );
    assert!(
        stderr.contains("[kern-dump] CUPTI library not found (tried /nonexistent/libcupti.so.13; /nonexistent/libcupti.so.13: cannot open shared object file"),
        "{stderr}"
    );
    assert!(
        stderr.contains("KERN_CUPTI_LIB=/path/to/libcupti.so.13"),
        "{stderr}"
    );

    let dump = kern_dump::read_dump(&dir).unwrap();
    assert_eq!(dump.traces.len(), 1);
    let t = &dump.traces[0];
    assert_ne!(t.pid, std::process::id(), "the child wrote it");
    let notes: Vec<_> = t
        .records
        .iter()
        .filter_map(|r| match r {
            kern_dump::format::Record::Note(n) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0].level, kern_dump::format::NoteLevel::Error);
    assert!(notes[0].message.starts_with("CUPTI library not found"));
    assert!(t.header.as_ref().unwrap().cupti_lib.is_none());
}

#[test]
fn unwritable_dump_dir_returns_0() {
    let dir = temp_dir("nodir");
    std::fs::write(dir.join("file"), b"x").unwrap();
    let (stdout, stderr) = run_child(&[("KERN_DUMP_DIR", dir.join("file/sub").to_str().unwrap())]);
    assert!(stdout.contains("RESULT=0"), "{stdout}");
    assert!(stderr.contains("[kern-dump] cannot create"), "{stderr}");
    assert!(stderr.contains("runs without tracing"), "{stderr}");
}
