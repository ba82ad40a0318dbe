//! The per-process tracer: the trace writer, the module and graph tables, counters, and the
//! process-level hooks (`pthread_atfork`, `atexit`, a flusher thread).
//!
//! Invariant: no lock here is held while calling into the driver, so a driver call that fires
//! a nested CUPTI callback (a lazy module load) can never deadlock on this library.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use kern_dump::fastjson::write_launch_line;
use kern_dump::format::{ExitRecord, LaunchRecord, NoteLevel, NoteRecord, Record};

use crate::driver::Driver;
use crate::modules::ModuleTable;
use crate::spin::SpinLock;
use crate::writer::{HeaderInfo, TraceWriter, FLUSH_INTERVAL};

/// Writes one line to stderr, never panicking (stderr may be closed in the host program).
pub fn log_line(args: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(format_args!("[kern-dump] {args}\n"));
}

/// Graph bookkeeping: how many kernel nodes each graph has, which graph each executable
/// graph was instantiated from.
#[derive(Debug, Default)]
pub struct GraphTable {
    /// graph → (capture id of its nodes, kernel nodes)
    graphs: HashMap<u64, (Option<u64>, u32)>,
    /// executable graph → (graph, kernel nodes at instantiation)
    execs: HashMap<u64, (u64, u32)>,
}

impl GraphTable {
    /// A kernel node was added to `graph` (by capture `capture_id`, or explicitly).
    pub fn node_added(&mut self, graph: u64, capture_id: Option<u64>) {
        let e = self.graphs.entry(graph).or_insert((capture_id, 0));
        if capture_id.is_some() && e.0 != capture_id {
            // A new capture into a graph handle the driver reused.
            *e = (capture_id, 0);
        }
        e.1 += 1;
    }

    /// Kernel nodes of `graph` seen so far.
    pub fn nodes(&self, graph: u64) -> Option<u32> {
        self.graphs.get(&graph).map(|g| g.1)
    }

    /// Records an instantiation; false if this exact pair was already recorded.
    pub fn instantiated(&mut self, exec: u64, graph: u64) -> bool {
        let nodes = self.nodes(graph).unwrap_or(0);
        match self.execs.insert(exec, (graph, nodes)) {
            Some((g, n)) => g != graph || n != nodes,
            None => true,
        }
    }

    /// (graph, kernel nodes) of an executable graph.
    pub fn exec(&self, exec: u64) -> Option<(u64, u32)> {
        self.execs.get(&exec).copied()
    }
}

/// Totals for the `exit` record.
#[derive(Default)]
pub struct Stats {
    pub modules: AtomicU64,
    pub launches: AtomicU64,
    pub graph_nodes: AtomicU64,
    pub graph_launches: AtomicU64,
}

impl Stats {
    fn reset(&self) {
        for c in [
            &self.modules,
            &self.launches,
            &self.graph_nodes,
            &self.graph_launches,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }
}

pub struct Tracer {
    pub dir: PathBuf,
    pub verbose: u8,
    pub driver: Driver,
    enabled: AtomicBool,
    finished: AtomicBool,
    seq: AtomicU64,
    writer: SpinLock<TraceWriter>,
    pub modules: SpinLock<ModuleTable>,
    pub graphs: SpinLock<GraphTable>,
    /// Bumped whenever a module loads, unloads or gets bound: cached attributions that were
    /// not exact are recomputed.
    pub module_gen: AtomicU64,
    /// Bumped when a module unloads: function handles may be reused, so caches are dropped.
    pub unload_gen: AtomicU64,
    pub stats: Stats,
    /// Launch callbacks the verbose log still prints.
    pub verbose_launches_left: AtomicI64,
    /// The pid whose flusher thread is running (0: none).
    flusher_pid: AtomicU32,
}

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// The tracer of this process, once installed.
pub fn get() -> Option<&'static Tracer> {
    TRACER.get()
}

impl Tracer {
    pub fn new(dir: PathBuf, verbose: u8, driver: Driver, header: HeaderInfo) -> Tracer {
        Tracer {
            writer: SpinLock::new(TraceWriter::new(dir.clone(), header, std::process::id())),
            dir,
            verbose,
            driver,
            enabled: AtomicBool::new(true),
            finished: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            modules: SpinLock::new(ModuleTable::new()),
            graphs: SpinLock::new(GraphTable::default()),
            module_gen: AtomicU64::new(0),
            unload_gen: AtomicU64::new(0),
            stats: Stats::default(),
            verbose_launches_left: AtomicI64::new(match verbose {
                0 => 0,
                1 => 64,
                _ => i64::MAX,
            }),
            flusher_pid: AtomicU32::new(0),
        }
    }

    /// Installs `t` as the process tracer and registers the fork and exit hooks. Returns the
    /// installed tracer (the first one, if called twice).
    pub fn install(t: Tracer) -> &'static Tracer {
        let mut fresh = false;
        let t = TRACER.get_or_init(|| {
            fresh = true;
            t
        });
        if fresh {
            // SAFETY: the handlers are `extern "C"` functions that never unwind.
            unsafe {
                libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
                libc::atexit(at_exit);
            }
        }
        t
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn header_mut<R>(&self, f: impl FnOnce(&mut HeaderInfo) -> R) -> R {
        f(self.writer.lock().header_mut())
    }

    /// Writes one record. A write error disables tracing (said once on stderr); the program
    /// is never affected.
    pub fn emit(&self, record: &Record) {
        self.emit_with(|line| {
            serde_json::to_writer(&mut *line, record).map_err(|e| e.to_string())?;
            line.push(b'\n');
            Ok(())
        });
    }

    /// Writes a `launch` (or, if `node`, `graph_node`) record through the fast writer: the
    /// same bytes as [`Tracer::emit`], for the record written on every launch.
    pub fn emit_launch(&self, node: bool, record: &LaunchRecord) {
        self.emit_with(|line| {
            write_launch_line(line, node, record);
            Ok(())
        });
    }

    /// Serializes into this thread's line buffer with `render`, then appends the line. A
    /// write error disables tracing (said once on stderr); the program is never affected.
    fn emit_with(&self, render: impl Fn(&mut Vec<u8>) -> Result<(), String>) {
        if !self.enabled() {
            return;
        }
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let once = |line: &mut Vec<u8>| {
            line.clear();
            render(line)?;
            self.append(line)
        };
        let result = match LINE
            .try_with(|cell| cell.try_borrow_mut().ok().map(|mut line| once(&mut line)))
        {
            Ok(Some(r)) => r,
            // Thread teardown, or a nested call while the buffer is in use: a fresh buffer.
            _ => once(&mut Vec::new()),
        };
        if let Err(e) = result {
            self.disable(&format!("writing the trace failed: {e}"));
        }
    }

    fn append(&self, line: &[u8]) -> Result<(), String> {
        let pid = {
            let mut w = self.writer.lock();
            w.append_line(line).map_err(|e| e.to_string())?;
            if self.finished.load(Ordering::Relaxed) {
                w.flush().map_err(|e| e.to_string())?;
            }
            w.pid()
        };
        self.ensure_flusher(pid);
        Ok(())
    }

    /// Records a note; warnings and errors also go to stderr.
    pub fn note(&self, level: NoteLevel, message: String) {
        if level != NoteLevel::Info || self.verbose > 0 {
            log_line(format_args!("{message}"));
        }
        self.emit(&Record::Note(NoteRecord {
            seq: self.next_seq(),
            level,
            message,
        }));
    }

    /// Stops tracing in this process, saying why once. Whatever is buffered is still flushed.
    pub fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            log_line(format_args!(
                "{why}; tracing disabled in pid {}, the program continues",
                std::process::id()
            ));
            let _ = self.writer.lock().flush();
        }
    }

    /// Stops tracing without a message (the reason was already noted).
    pub fn stop(&self) {
        self.enabled.store(false, Ordering::Relaxed);
        self.flush();
    }

    pub fn flush(&self) {
        let _ = self.writer.lock().flush();
    }

    /// The `exit` record and a final flush (from `atexit`).
    pub fn finish(&self, how: &str) {
        if self.finished.swap(true, Ordering::Relaxed) {
            return;
        }
        let opened = self.writer.lock().is_open();
        if opened && self.enabled() {
            let s = &self.stats;
            self.emit(&Record::Exit(ExitRecord {
                seq: self.next_seq(),
                how: how.to_owned(),
                modules: s.modules.load(Ordering::Relaxed),
                launches: s.launches.load(Ordering::Relaxed),
                graph_nodes: s.graph_nodes.load(Ordering::Relaxed),
                graph_launches: s.graph_launches.load(Ordering::Relaxed),
            }));
        }
        self.flush();
        if self.verbose > 0 && opened {
            if let Some(p) = self.writer.lock().path() {
                log_line(format_args!("trace written: {}", p.display()));
            }
        }
    }

    /// Starts the thread that flushes a stale buffer, once per process (again in a fork child,
    /// which does not inherit threads).
    fn ensure_flusher(&self, pid: u32) {
        let running = self.flusher_pid.load(Ordering::Relaxed);
        if running == pid
            || self
                .flusher_pid
                .compare_exchange(running, pid, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("kern-dump-flush".into())
            .spawn(move || loop {
                std::thread::sleep(FLUSH_INTERVAL);
                let Some(t) = get() else { return };
                if t.flusher_pid.load(Ordering::Relaxed) != pid {
                    return;
                }
                let _ = t.writer.lock().flush_if_stale();
            });
        if spawned.is_err() {
            // No thread: records still flush by size, by age at the next record, and at exit.
            self.flusher_pid.store(pid, Ordering::Relaxed);
        }
    }

    /// `pthread_atfork` child handler body: see `writer` for the protocol.
    fn after_fork_child(&self) {
        // SAFETY: in the child only this thread exists, so no other guard can be live.
        unsafe {
            self.writer.force_unlock();
            self.modules.force_unlock();
            self.graphs.force_unlock();
        }
        self.writer.lock().after_fork_child(std::process::id());
        self.flusher_pid.store(0, Ordering::Relaxed);
        self.seq.store(0, Ordering::Relaxed);
        self.stats.reset();
        self.finished.store(false, Ordering::Relaxed);
    }
}

/// Runs `f`, turning a panic into "tracing disabled" instead of unwinding into C.
pub fn contain<R>(what: &str, default: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            match get() {
                Some(t) => t.disable(&format!("internal error in {what}")),
                None => log_line(format_args!(
                    "internal error in {what}; the program continues untraced"
                )),
            }
            default
        }
    }
}

extern "C" fn fork_prepare() {
    contain("fork prepare", (), || {
        if let Some(t) = get() {
            let _ = t.writer.lock().before_fork();
        }
    })
}

extern "C" fn fork_parent() {}

extern "C" fn fork_child() {
    contain("fork child", (), || {
        if let Some(t) = get() {
            t.after_fork_child();
        }
    })
}

extern "C" fn at_exit() {
    contain("exit", (), || {
        if let Some(t) = get() {
            t.finish("atexit");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_table_links_execs_to_node_counts() {
        let mut g = GraphTable::default();
        g.node_added(7, Some(1));
        g.node_added(7, Some(1));
        assert!(g.instantiated(70, 7));
        assert!(
            !g.instantiated(70, 7),
            "the same instantiation twice is not new"
        );
        assert_eq!(g.exec(70), Some((7, 2)));
        // A new capture into the reused handle restarts the count; the old exec keeps its own.
        g.node_added(7, Some(2));
        assert_eq!(g.nodes(7), Some(1));
        assert_eq!(g.exec(70), Some((7, 2)));
        // Explicitly added nodes (no capture id) accumulate.
        g.node_added(8, None);
        g.node_added(8, None);
        assert_eq!(g.nodes(8), Some(2));
    }
}
