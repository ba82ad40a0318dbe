//! The `kern dump` injection library: loaded by the CUDA driver into an unmodified program
//! through `CUDA_INJECTION64_PATH`, it records every module the program loads and every kernel
//! it launches into `$KERN_DUMP_DIR` (format: `kern_dump::format`, `crates/kern-dump/TRACE.md`).
//!
//! The driver calls [`InitializeInjection`] inside `cuInit`, before the program's first CUDA
//! call. It opens CUPTI, subscribes one callback to the RESOURCE domain (module loads, graph
//! events) and to the driver calls that launch kernels, load modules, instantiate and launch
//! graphs, and returns. From then on [`callback`] does the work, on the program's threads.
//!
//! Rules this library keeps so that the program runs exactly as without it:
//! * no panic crosses into C: every entry point runs under `catch_unwind`, and an internal
//!   error disables tracing (said once on stderr) instead of aborting;
//! * a trace failure (disk full, CUPTI missing) is reported and tracing stops; the program
//!   continues;
//! * no lock is held across a driver call (lazy loading may fire a nested callback);
//! * the driver is only queried, never asked to do work (no allocation, no synchronization).
//!
//! Code map: [`ffi`] C layouts and ids; [`dl`], [`cupti`], [`driver`] run-time linking;
//! [`callback`] the event handlers; [`modules`] launch → module attribution; [`params`]
//! parameter bytes; [`tracer`] process state, fork and exit hooks; [`writer`] the trace file.

pub mod callback;
pub mod cupti;
pub mod dl;
pub mod driver;
pub mod ffi;
pub mod modules;
pub mod params;
pub mod spin;
pub mod tracer;
pub mod writer;

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use kern_dump::format::{NoteLevel, MODULES_DIR};
use kern_dump::run::{ENV_DUMP_DIR, ENV_INJECTION_PATH, ENV_VERBOSE};

use crate::cupti::Cupti;
use crate::driver::Driver;
use crate::tracer::{contain, log_line, Tracer};
use crate::writer::HeaderInfo;

/// Kept alive (and its library open) for the life of the process.
static CUPTI: OnceLock<Cupti> = OnceLock::new();
/// 0: not called yet; 1: tracing; -1: failed (the program runs untraced).
static INIT_RESULT: AtomicI32 = AtomicI32::new(0);

/// The entry point the CUDA driver looks up in the library named by `CUDA_INJECTION64_PATH`.
/// Returns 1 when tracing is set up, 0 when it is not (the program then runs untraced; the
/// reason was printed to stderr with a `[kern-dump]` prefix and noted in the trace).
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    match INIT_RESULT.load(Ordering::Acquire) {
        1 => return 1,
        -1 => return 0,
        _ => {}
    }
    let ok = contain("InitializeInjection", false, initialize);
    INIT_RESULT.store(if ok { 1 } else { -1 }, Ordering::Release);
    c_int::from(ok)
}

fn initialize() -> bool {
    // This copy of std belongs to the library alone, so the hook affects only our panics.
    std::panic::set_hook(Box::new(|info| {
        log_line(format_args!("internal error: {info}"))
    }));
    let verbose: u8 = std::env::var(ENV_VERBOSE)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if verbose > 0 {
        log_line(format_args!("InitializeInjection  (the CUDA driver calls this in cuInit, before the first CUDA call)"));
        log_line(format_args!(
            "  {ENV_INJECTION_PATH}={}",
            std::env::var(ENV_INJECTION_PATH).unwrap_or_default()
        ));
    }
    let dir = match std::env::var_os(ENV_DUMP_DIR).filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            let d = std::env::current_dir()
                .unwrap_or_default()
                .join("kern-dump");
            log_line(format_args!(
                "{ENV_DUMP_DIR} is not set; writing to {}",
                d.display()
            ));
            d
        }
    };
    if verbose > 0 {
        log_line(format_args!("  {ENV_DUMP_DIR}={}", dir.display()));
    }
    if let Err(e) = std::fs::create_dir_all(dir.join(MODULES_DIR)) {
        log_line(format_args!(
            "cannot create {}: {e}; pid {} runs without tracing",
            dir.join(MODULES_DIR).display(),
            std::process::id()
        ));
        return false;
    }

    let driver = Driver::load();
    let header = HeaderInfo {
        argv: process_argv(),
        cuda_driver_version: driver.version(),
        cupti_lib: None,
        cupti_version: None,
        injection: format!("kern-inject {}", env!("CARGO_PKG_VERSION")),
    };
    let t = Tracer::install(Tracer::new(dir, verbose, driver, header));

    let cupti = match Cupti::load() {
        Ok(c) => c,
        Err(nf) => {
            t.note(
                NoteLevel::Error,
                format!(
                    "CUPTI library not found (tried {}; {}). Install it (CUDA toolkit: \
                     /usr/local/cuda/extras/CUPTI/lib64; pip: nvidia-cuda-cupti) and set \
                     KERN_CUPTI_LIB=/path/to/libcupti.so.13 or add its directory to \
                     LD_LIBRARY_PATH. pid {} runs without tracing",
                    summarize_tried(&nf.tried),
                    nf.first_error,
                    std::process::id()
                ),
            );
            t.finish("tracing disabled: no CUPTI");
            t.stop();
            return false;
        }
    };
    let (path, version) = (cupti.path.clone(), cupti.version());
    t.header_mut(|h| {
        h.cupti_lib = Some(path.clone());
        h.cupti_version = version;
    });
    if verbose > 0 {
        log_line(format_args!(
            "  CUPTI: {path} (version {})",
            version.map_or("?".to_owned(), |v| v.to_string())
        ));
    }
    let cupti = CUPTI.get_or_init(|| cupti);

    let subscriber = match cupti.subscribe(callback::cupti_callback) {
        Ok(s) => s,
        Err(e) => {
            t.note(
                NoteLevel::Error,
                format!(
                    "{e} (is another CUPTI tool, such as a profiler, attached?); pid {} runs without tracing",
                    std::process::id()
                ),
            );
            t.finish("tracing disabled: no CUPTI subscription");
            t.stop();
            return false;
        }
    };
    if let Err(e) = cupti.enable_domain(subscriber, ffi::DOMAIN_RESOURCE) {
        t.note(
            NoteLevel::Error,
            format!(
                "{e}: module loads cannot be seen; pid {} runs without tracing",
                std::process::id()
            ),
        );
        t.finish("tracing disabled: no RESOURCE callbacks");
        t.stop();
        return false;
    }
    let mut missing = Vec::new();
    for &id in ffi::cbid::ALL {
        if cupti
            .enable_callback(subscriber, ffi::DOMAIN_DRIVER_API, id)
            .is_err()
        {
            missing.push(ffi::api_of(id).name());
        }
    }
    if !missing.is_empty() {
        t.note(
            NoteLevel::Warning,
            format!(
                "this CUPTI cannot trace {}; those calls are not recorded",
                missing.join(", ")
            ),
        );
    }
    if verbose > 0 {
        log_line(format_args!(
            "CUPTI subscribed: RESOURCE/* + DRIVER_API/{{cuLaunchKernel{{,Ex,CooperativeKernel}}{{,_ptsz}}, cuGraphLaunch, \
             cuGraphInstantiate*, cuGraphAddKernelNode, cuModuleLoad*, cuLibrary*, ...}}"
        ));
    }
    true
}

fn summarize_tried(tried: &[String]) -> String {
    const SHOWN: usize = 6;
    if tried.len() <= SHOWN {
        tried.join(", ")
    } else {
        format!(
            "{}, and {} more",
            tried[..SHOWN].join(", "),
            tried.len() - SHOWN
        )
    }
}

fn process_argv() -> Vec<String> {
    match std::fs::read("/proc/self/cmdline") {
        Ok(bytes) => bytes
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        Err(_) => std::env::args().collect(),
    }
}

/// Hooks for tests: a tracer without CUPTI, to exercise the trace file, fork and exit paths
/// in a process that has no GPU.
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// Installs a tracer writing to `dir` with the given (fake) driver and no CUPTI: the test
    /// then calls [`callback::cupti_callback`] itself, as CUPTI would.
    pub fn install_tracer(dir: PathBuf, driver: Driver, verbose: u8) -> &'static Tracer {
        std::fs::create_dir_all(dir.join(MODULES_DIR)).unwrap();
        let header = HeaderInfo {
            argv: process_argv(),
            injection: "kern-inject test".into(),
            ..Default::default()
        };
        Tracer::install(Tracer::new(dir, verbose, driver, header))
    }
}
