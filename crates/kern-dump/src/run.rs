//! The parent side of `kern dump --out DIR -- CMD ARGS...`: check everything that can be checked
//! before starting CMD, start it unchanged with the injection library in its environment, and
//! pass its exit status through.
//!
//! The program is traced by the CUDA driver loading `CUDA_INJECTION64_PATH` into it at `cuInit`;
//! its child processes inherit the variable and are traced too, each into its own file.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{DumpError, Result};
use crate::format::{is_trace_file_name, NoteLevel, Record, MODULES_DIR};
use crate::reader::list_module_files;

/// File name of the injection library (the `kern-inject` cdylib).
pub const INJECT_LIB_NAME: &str = "libkern_inject.so";
/// Variable the CUDA driver reads to find the injection library.
pub const ENV_INJECTION_PATH: &str = "CUDA_INJECTION64_PATH";
/// Where the injection library writes the dump (absolute path).
pub const ENV_DUMP_DIR: &str = "KERN_DUMP_DIR";
/// `1`: the injection library logs what it sees to stderr; `2`: every launch too.
pub const ENV_VERBOSE: &str = "KERN_DUMP_VERBOSE";
/// Overrides where [`find_inject_lib`] looks for the injection library.
pub const ENV_INJECT_LIB: &str = "KERN_INJECT_LIB";
/// Overrides which CUPTI library the injection library opens.
pub const ENV_CUPTI_LIB: &str = "KERN_CUPTI_LIB";

/// What to run and where to write.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The dump directory; created if missing; must not already hold traces.
    pub out: PathBuf,
    /// `CMD ARGS...`; `CMD` is looked up in `PATH` unless it contains a `/`.
    pub command: Vec<OsString>,
    /// The injection library; `None`: [`find_inject_lib`] decides.
    pub inject_lib: Option<PathBuf>,
    /// 0: quiet; 1: log module loads and the first launches; 2: log every launch.
    pub verbose: u8,
}

/// How the run ended and what it left in the dump directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The code to exit with: the program's exit code, or 128 + signal number.
    pub exit_code: i32,
    /// The signal that ended the program, if one did.
    pub signal: Option<i32>,
    /// Absolute dump directory.
    pub out: PathBuf,
    /// `trace.*.jsonl` files written (one per traced process).
    pub traces: usize,
    /// Files under `modules/`.
    pub module_files: usize,
    /// Things the user should know: notes of level warning/error from the traces (e.g. CUPTI
    /// not found), no trace written, an overridden `CUDA_INJECTION64_PATH`.
    pub warnings: Vec<String>,
}

impl fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.signal {
            Some(sig) => format!("killed by signal {sig}"),
            None => format!("exit code {}", self.exit_code),
        };
        write!(
            f,
            "kern dump: {} process trace(s), {} module file(s) in {} ({how})",
            self.traces,
            self.module_files,
            self.out.display()
        )?;
        for w in &self.warnings {
            write!(f, "\nkern dump: warning: {w}")?;
        }
        Ok(())
    }
}

/// Runs `opts.command` under the injection library and waits for it.
///
/// Errors are only about starting it (command not found, output directory not writable,
/// injection library missing); once it started, its exit status is in the outcome, and the
/// caller should exit with [`RunOutcome::exit_code`].
pub fn run(opts: &RunOptions) -> Result<RunOutcome> {
    let (program, args) = opts.command.split_first().ok_or(DumpError::EmptyCommand)?;
    let resolved = resolve_program(program)?;
    let lib = find_inject_lib(opts.inject_lib.as_deref())?;
    let out = prepare_out_dir(&opts.out)?;

    let mut warnings = Vec::new();
    if let Some(old) = std::env::var_os(ENV_INJECTION_PATH) {
        if old != lib.as_os_str() && !old.is_empty() {
            warnings.push(format!(
                "{ENV_INJECTION_PATH} was set to {}; replaced it for this run",
                Path::new(&old).display()
            ));
        }
    }

    let mut cmd = Command::new(&resolved);
    cmd.arg0(program)
        .args(args)
        .env(ENV_INJECTION_PATH, &lib)
        .env(ENV_DUMP_DIR, &out);
    if opts.verbose > 0 {
        cmd.env(ENV_VERBOSE, opts.verbose.to_string());
    }
    let mut child = cmd.spawn().map_err(|cause| DumpError::Spawn {
        program: program.to_string_lossy().into_owned(),
        cause,
    })?;

    // Like system(3): while the program runs, Ctrl-C and Ctrl-\ are its business; the parent
    // only waits, and then reports how it ended.
    let status = {
        let _ignore = IgnoreInterrupts::new();
        child.wait().map_err(|cause| DumpError::Spawn {
            program: program.to_string_lossy().into_owned(),
            cause,
        })?
    };
    let (exit_code, signal) = match (status.code(), status.signal()) {
        (Some(code), _) => (code, None),
        (None, Some(sig)) => (128 + sig, Some(sig)),
        (None, None) => (1, None),
    };

    let traces = trace_files(&out);
    if traces.is_empty() {
        warnings.push(format!(
            "no trace was written: `{}` never initialized CUDA, or the driver did not load {} \
             (a setuid or statically linked program ignores {ENV_INJECTION_PATH})",
            program.to_string_lossy(),
            lib.display()
        ));
    }
    for t in &traces {
        warnings.extend(trace_warnings(t));
    }
    Ok(RunOutcome {
        exit_code,
        signal,
        out: out.clone(),
        traces: traces.len(),
        module_files: list_module_files(&out).len(),
        warnings,
    })
}

/// Finds the injection library: `explicit`, else `$KERN_INJECT_LIB`, else next to the running
/// executable (also `../lib/`, and `../` for test binaries under `target/*/deps/`).
pub fn find_inject_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    let missing = |looked: Vec<PathBuf>| DumpError::InjectLibMissing {
        name: INJECT_LIB_NAME.to_owned(),
        looked,
    };
    if let Some(p) = explicit {
        return absolute_file(p).ok_or_else(|| missing(vec![p.to_owned()]));
    }
    if let Some(p) = std::env::var_os(ENV_INJECT_LIB).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return absolute_file(&p).ok_or_else(|| missing(vec![p]));
    }
    let mut looked = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        for candidate in [
            dir.join(INJECT_LIB_NAME),
            dir.join("../lib").join(INJECT_LIB_NAME),
            dir.join("..").join(INJECT_LIB_NAME),
        ] {
            if let Some(found) = absolute_file(&candidate) {
                return Ok(found);
            }
            looked.push(candidate);
        }
    }
    Err(missing(looked))
}

fn absolute_file(p: &Path) -> Option<PathBuf> {
    let canonical = fs::canonicalize(p).ok()?;
    canonical.is_file().then_some(canonical)
}

/// Finds the program the way a shell would, so that a typo is reported before anything runs.
fn resolve_program(program: &OsStr) -> Result<PathBuf> {
    let name = program.to_string_lossy().into_owned();
    if name.is_empty() {
        return Err(DumpError::EmptyCommand);
    }
    if name.contains('/') {
        let path = PathBuf::from(program);
        let meta = fs::metadata(&path).map_err(|_| DumpError::NoSuchFile {
            program: name.clone(),
        })?;
        check_executable(&name, &meta)?;
        return Ok(path);
    }
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path_var) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        if let Ok(meta) = fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(DumpError::CommandNotFound { program: name })
}

fn check_executable(name: &str, meta: &fs::Metadata) -> Result<()> {
    if meta.is_dir() {
        return Err(DumpError::NotExecutable {
            program: name.to_owned(),
            reason: "it is a directory".into(),
        });
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(DumpError::NotExecutable {
            program: name.to_owned(),
            reason: "no execute permission".into(),
        });
    }
    Ok(())
}

/// Creates the dump directory and proves it writable, so that the program does not run for
/// an hour and then fail to write its trace.
fn prepare_out_dir(out: &Path) -> Result<PathBuf> {
    let not_writable = |cause| DumpError::OutDirNotWritable {
        path: out.to_owned(),
        cause,
    };
    fs::create_dir_all(out).map_err(not_writable)?;
    let abs = fs::canonicalize(out).map_err(not_writable)?;
    for entry in fs::read_dir(&abs).map_err(not_writable)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_trace_file_name(&name) {
            return Err(DumpError::OutDirNotEmpty {
                path: abs,
                file: name,
            });
        }
    }
    let probe = abs.join(format!(".kern-dump-write-test.{}", std::process::id()));
    fs::write(&probe, b"").map_err(not_writable)?;
    let _ = fs::remove_file(&probe);
    fs::create_dir_all(abs.join(MODULES_DIR)).map_err(not_writable)?;
    Ok(abs)
}

fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| is_trace_file_name(&e.file_name().to_string_lossy()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Warnings and errors the injection library noted in one trace. Scans for note lines
/// without parsing the (possibly large) rest of the file.
fn trace_warnings(path: &Path) -> Vec<String> {
    let Ok(text) = fs::read(path) else {
        return Vec::new();
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    text.split(|&b| b == b'\n')
        .filter(|line| line.starts_with(br#"{"type":"note""#))
        .filter_map(|line| serde_json::from_slice::<Record>(line).ok())
        .filter_map(|r| match r {
            Record::Note(n) if n.level != NoteLevel::Info => Some(format!("{name}: {}", n.message)),
            _ => None,
        })
        .collect()
}

/// Ignores SIGINT and SIGQUIT in this process while alive (the child keeps the defaults, as
/// it was started before).
struct IgnoreInterrupts {
    old_int: libc::sighandler_t,
    old_quit: libc::sighandler_t,
}

impl IgnoreInterrupts {
    fn new() -> Self {
        // SAFETY: installing SIG_IGN has no preconditions; the old handlers are restored in Drop.
        unsafe {
            IgnoreInterrupts {
                old_int: libc::signal(libc::SIGINT, libc::SIG_IGN),
                old_quit: libc::signal(libc::SIGQUIT, libc::SIG_IGN),
            }
        }
    }
}

impl Drop for IgnoreInterrupts {
    fn drop(&mut self) {
        // SAFETY: restores the handlers `new` replaced.
        unsafe {
            if self.old_int != libc::SIG_ERR {
                libc::signal(libc::SIGINT, self.old_int);
            }
            if self.old_quit != libc::SIG_ERR {
                libc::signal(libc::SIGQUIT, self.old_quit);
            }
        }
    }
}
