//! The launcher's error cases and exit-status pass-through (no GPU needed: the commands are
//! shell one-liners that never touch CUDA).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use kern_dump::{run, DumpError, RunOptions};

fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "kern-dump-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A stand-in injection library: `run` only checks that the file exists; the shell commands
/// below never initialize CUDA, so nothing loads it.
fn fake_lib(dir: &Path) -> PathBuf {
    let p = dir.join("libkern_inject.so");
    std::fs::write(&p, b"not really a library").unwrap();
    p
}

fn opts(out: PathBuf, lib: Option<PathBuf>, cmd: &[&str]) -> RunOptions {
    RunOptions {
        out,
        command: cmd.iter().map(OsString::from).collect(),
        inject_lib: lib,
        verbose: 0,
    }
}

#[test]
fn command_not_found() {
    let d = temp_dir("notfound");
    let err = run(&opts(
        d.join("out"),
        Some(fake_lib(&d)),
        &["kern-no-such-command-xyz", "a"],
    ))
    .unwrap_err();
    assert!(matches!(err, DumpError::CommandNotFound { .. }));
    assert_eq!(
        err.to_string(),
        "`kern-no-such-command-xyz`: command not found (searched PATH)"
    );

    let err = run(&opts(
        d.join("out"),
        Some(fake_lib(&d)),
        &["./no/such/file"],
    ))
    .unwrap_err();
    assert_eq!(err.to_string(), "`./no/such/file`: no such file");

    let err = run(&opts(d.join("out"), Some(fake_lib(&d)), &[])).unwrap_err();
    assert!(matches!(err, DumpError::EmptyCommand));
}

#[test]
fn non_executable_file() {
    let d = temp_dir("noexec");
    let script = d.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let err = run(&opts(
        d.join("out"),
        Some(fake_lib(&d)),
        &[script.to_str().unwrap()],
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("not executable (no execute permission)"),
        "{err}"
    );
}

#[test]
fn output_directory_not_writable() {
    let d = temp_dir("notwritable");
    let file = d.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = file.join("out");
    let err = run(&opts(out.clone(), Some(fake_lib(&d)), &["true"])).unwrap_err();
    assert!(matches!(err, DumpError::OutDirNotWritable { .. }));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "output directory {} is not writable: ",
            out.display()
        )),
        "{msg}"
    );
}

#[test]
fn output_directory_with_an_old_dump_is_refused() {
    let d = temp_dir("olddump");
    let out = d.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("trace.99.jsonl"), b"").unwrap();
    let err = run(&opts(out, Some(fake_lib(&d)), &["true"])).unwrap_err();
    assert!(
        err.to_string()
            .contains("already holds a dump (trace.99.jsonl)"),
        "{err}"
    );
}

#[test]
fn injection_library_missing() {
    let d = temp_dir("nolib");
    let err = run(&opts(
        d.join("out"),
        Some(d.join("nope/libkern_inject.so")),
        &["true"],
    ))
    .unwrap_err();
    assert!(matches!(err, DumpError::InjectLibMissing { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("injection library libkern_inject.so not found; looked in: "),
        "{msg}"
    );
    assert!(msg.contains("nope/libkern_inject.so"), "{msg}");
    assert!(
        msg.contains("cargo build --release -p kern-inject"),
        "{msg}"
    );
}

#[test]
fn exit_code_and_signal_pass_through() {
    let d = temp_dir("exit");
    let lib = fake_lib(&d);
    let o = run(&opts(
        d.join("out7"),
        Some(lib.clone()),
        &["sh", "-c", "exit 7"],
    ))
    .unwrap();
    assert_eq!((o.exit_code, o.signal), (7, None));
    assert_eq!(o.traces, 0);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("no trace was written")),
        "{:?}",
        o.warnings
    );
    assert!(o.to_string().contains("(exit code 7)"));

    let o = run(&opts(d.join("out0"), Some(lib.clone()), &["true"])).unwrap();
    assert_eq!(o.exit_code, 0);

    let o = run(&opts(
        d.join("outkill"),
        Some(lib),
        &["sh", "-c", "kill -9 $$"],
    ))
    .unwrap();
    assert_eq!((o.exit_code, o.signal), (128 + 9, Some(9)));
}

#[test]
fn the_program_sees_the_injection_environment() {
    let d = temp_dir("env");
    let lib = fake_lib(&d);
    let out = d.join("out");
    let lib_abs = std::fs::canonicalize(&lib).unwrap();
    let check = format!(
        "test \"$CUDA_INJECTION64_PATH\" = '{}' && test \"$KERN_DUMP_DIR\" = '{}' && test -d \"$KERN_DUMP_DIR/modules\" && test \"$KERN_DUMP_VERBOSE\" = 1",
        lib_abs.display(),
        std::fs::canonicalize(&d).unwrap().join("out").display()
    );
    let mut o = opts(out, Some(lib), &["sh", "-c", &check]);
    o.verbose = 1;
    assert_eq!(
        run(&o).unwrap().exit_code,
        0,
        "the child did not see the expected environment"
    );
}

#[test]
fn notes_in_traces_become_warnings() {
    let d = temp_dir("notes");
    let out = d.join("out");
    // The "program" writes a trace with an error note, as the injection library does when it
    // cannot find CUPTI.
    let line = r#"{"type":"note","seq":1,"level":"error","message":"CUPTI library not found"}"#;
    let cmd = format!("echo '{line}' > \"$KERN_DUMP_DIR/trace.$$.jsonl\"");
    let o = run(&opts(out, Some(fake_lib(&d)), &["sh", "-c", &cmd])).unwrap();
    assert_eq!(o.traces, 1);
    assert!(
        o.warnings
            .iter()
            .any(|w| w.ends_with(": CUPTI library not found")),
        "{:?}",
        o.warnings
    );
}
