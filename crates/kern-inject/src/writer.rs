//! The per-process trace file: a buffer flushed by size and age, opened at the first record,
//! and re-targeted to a new file in a `fork()` child.
//!
//! Fork protocol (driven by `pthread_atfork` in `tracer`): before the fork the parent flushes,
//! so the child's copy of the buffer holds nothing the parent will not write itself; in the
//! child the buffer is dropped unwritten and the file forgotten, and the next record opens
//! `trace.<child pid>.jsonl` with a header naming the parent in `forked_from`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kern_dump::format::{trace_file_name_n, ProcessRecord, Record, TRACE_VERSION};

/// Flush when this many bytes are buffered.
pub const FLUSH_BYTES: usize = 64 * 1024;
/// Flush when the oldest buffered byte is this old (checked at each record and by the flusher
/// thread), bounding what an exit without atexit (`_exit`, a signal) loses.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// The parts of the `process` record that do not change with the pid.
#[derive(Clone, Debug, Default)]
pub struct HeaderInfo {
    pub argv: Vec<String>,
    pub cuda_driver_version: Option<i32>,
    pub cupti_lib: Option<String>,
    pub cupti_version: Option<u32>,
    pub injection: String,
}

pub struct TraceWriter {
    dir: PathBuf,
    header: HeaderInfo,
    pid: u32,
    forked_from: Option<u32>,
    file: Option<File>,
    path: Option<PathBuf>,
    buf: Vec<u8>,
    last_flush: Instant,
}

impl TraceWriter {
    pub fn new(dir: PathBuf, header: HeaderInfo, pid: u32) -> Self {
        TraceWriter {
            dir,
            header,
            pid,
            forked_from: None,
            file: None,
            path: None,
            buf: Vec::with_capacity(FLUSH_BYTES + 4096),
            last_flush: Instant::now(),
        }
    }

    pub fn header_mut(&mut self) -> &mut HeaderInfo {
        &mut self.header
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The trace file, once opened.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    pub fn has_pending(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Appends one serialized record (ending in `\n`), opening the file first if needed.
    pub fn append_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.file.is_none() {
            self.open()?;
        }
        self.buf.extend_from_slice(line);
        if self.buf.len() >= FLUSH_BYTES || self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes out the buffer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.last_flush = Instant::now();
        if self.buf.is_empty() {
            return Ok(());
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let result = file.write_all(&self.buf);
        self.buf.clear();
        result
    }

    /// Flushes when something has waited longer than [`FLUSH_INTERVAL`] (the flusher thread).
    pub fn flush_if_stale(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() && self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()
        } else {
            Ok(())
        }
    }

    /// In the parent, just before `fork()`.
    pub fn before_fork(&mut self) -> io::Result<()> {
        self.flush()
    }

    /// In the child, just after `fork()`: forget the parent's file and anything buffered.
    pub fn after_fork_child(&mut self, child_pid: u32) {
        self.buf.clear();
        // Dropping closes the child's copy of the descriptor; the parent's stays open.
        self.file = None;
        self.path = None;
        self.forked_from = Some(self.pid);
        self.pid = child_pid;
        self.last_flush = Instant::now();
    }

    fn open(&mut self) -> io::Result<()> {
        let mut n = 0;
        let (file, path) = loop {
            let path = self.dir.join(trace_file_name_n(self.pid, n));
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(f) => break (f, path),
                // The OS reused a pid within one dump: keep both traces.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
            }
        };
        self.file = Some(file);
        self.path = Some(path);
        let header = Record::Process(ProcessRecord {
            version: TRACE_VERSION,
            pid: self.pid,
            // SAFETY: getppid cannot fail.
            ppid: unsafe { libc::getppid() } as u32,
            forked_from: self.forked_from,
            argv: self.header.argv.clone(),
            start_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            cuda_driver_version: self.header.cuda_driver_version,
            cupti_lib: self.header.cupti_lib.clone(),
            cupti_version: self.header.cupti_version,
            injection: self.header.injection.clone(),
        });
        serde_json::to_writer(&mut self.buf, &header).map_err(io::Error::other)?;
        self.buf.push(b'\n');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kern_dump::reader::read_trace;

    fn temp_dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("kern-inject-writer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn note(seq: u64) -> Vec<u8> {
        format!("{{\"type\":\"note\",\"seq\":{seq},\"level\":\"info\",\"message\":\"n{seq}\"}}\n")
            .into_bytes()
    }

    #[test]
    fn header_first_then_records_buffered_until_flush() {
        let d = temp_dir("basic");
        let mut w = TraceWriter::new(
            d.clone(),
            HeaderInfo {
                injection: "t".into(),
                ..Default::default()
            },
            4242,
        );
        assert!(!w.is_open());
        w.append_line(&note(1)).unwrap();
        let path = w.path().unwrap().to_owned();
        assert_eq!(path, d.join("trace.4242.jsonl"));
        assert!(w.has_pending(), "a small record stays buffered");
        assert_eq!(std::fs::read(&path).unwrap().len(), 0);
        w.flush().unwrap();
        let t = read_trace(&path).unwrap();
        assert_eq!(t.header.as_ref().unwrap().pid, 4242);
        assert_eq!(t.records.len(), 1);
    }

    #[test]
    fn size_threshold_flushes() {
        let d = temp_dir("size");
        let mut w = TraceWriter::new(d, HeaderInfo::default(), 7);
        let line = note(1);
        for _ in 0..(FLUSH_BYTES / line.len() + 2) {
            w.append_line(&line).unwrap();
        }
        let written = std::fs::metadata(w.path().unwrap()).unwrap().len() as usize;
        assert!(written >= FLUSH_BYTES, "{written}");
    }

    #[test]
    fn reused_pid_gets_a_second_file() {
        let d = temp_dir("reuse");
        std::fs::write(d.join("trace.9.jsonl"), b"").unwrap();
        let mut w = TraceWriter::new(d.clone(), HeaderInfo::default(), 9);
        w.append_line(&note(1)).unwrap();
        assert_eq!(w.path().unwrap(), d.join("trace.9.1.jsonl"));
    }

    #[test]
    fn fork_protocol_writes_each_record_once() {
        let d = temp_dir("fork");
        let mut parent = TraceWriter::new(d.clone(), HeaderInfo::default(), 100);
        parent.append_line(&note(1)).unwrap();
        parent.append_line(&note(2)).unwrap();

        // prepare: the parent flushes; the child gets a copy of the (now empty) state.
        parent.before_fork().unwrap();
        assert!(!parent.has_pending());
        let mut child = TraceWriter::new(d.clone(), HeaderInfo::default(), 100);
        child.file = parent.file.as_ref().map(|f| f.try_clone().unwrap());
        child.path = parent.path.clone();
        child.buf = parent.buf.clone();
        child.after_fork_child(101);
        assert!(!child.is_open());

        child.append_line(&note(10)).unwrap();
        parent.append_line(&note(3)).unwrap();
        child.flush().unwrap();
        parent.flush().unwrap();

        let p = read_trace(&d.join("trace.100.jsonl")).unwrap();
        let c = read_trace(&d.join("trace.101.jsonl")).unwrap();
        assert_eq!(
            p.records.iter().filter_map(|r| r.seq()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(
            c.records.iter().filter_map(|r| r.seq()).collect::<Vec<_>>(),
            [10]
        );
        let ch = c.header.unwrap();
        assert_eq!((ch.pid, ch.forked_from), (101, Some(100)));
        assert_eq!(p.header.unwrap().forked_from, None);
    }

    #[test]
    fn open_failure_names_the_file() {
        let mut w = TraceWriter::new(
            PathBuf::from("/nonexistent/kern/dir"),
            HeaderInfo::default(),
            5,
        );
        let err = w.append_line(&note(1)).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/kern/dir/trace.5.jsonl"), "{err}");
    }
}
