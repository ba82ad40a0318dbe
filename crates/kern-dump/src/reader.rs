//! Reading a dump directory back: every `trace.*.jsonl`, record by record.
//!
//! A traced process may have been killed mid-write, so a line that does not parse is kept as a
//! [`BadLine`] instead of failing the whole read; the summary reports how many there were.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{DumpError, Result};
use crate::format::{is_trace_file_name, ProcessRecord, Record, MODULES_DIR};

/// All traces of one dump directory.
#[derive(Clone, Debug)]
pub struct Dump {
    pub dir: PathBuf,
    /// Sorted by pid, then file name.
    pub traces: Vec<ProcessTrace>,
    /// Files under `modules/` (name only), sorted.
    pub module_files: Vec<String>,
}

/// One `trace.<pid>.jsonl`.
#[derive(Clone, Debug)]
pub struct ProcessTrace {
    pub path: PathBuf,
    /// From the `process` record, else from the file name (0 if neither says).
    pub pid: u32,
    pub header: Option<ProcessRecord>,
    /// Every record after the header, in file order (sort by [`Record::seq`] for event order:
    /// launches are written when their call returns, so two threads' records interleave).
    pub records: Vec<Record>,
    pub bad_lines: Vec<BadLine>,
}

/// A line that is not a valid record (typically the last line of a killed process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based.
    pub line: usize,
    pub error: String,
}

impl ProcessTrace {
    /// Whether the process ended through `exit()` (the trace has an `exit` record).
    pub fn exited_cleanly(&self) -> bool {
        self.records.iter().any(|r| matches!(r, Record::Exit(_)))
    }
}

/// Reads every trace of the dump in `dir`. Fails when `dir` cannot be read or holds no trace.
pub fn read_dump(dir: &Path) -> Result<Dump> {
    let entries = fs::read_dir(dir).map_err(|cause| DumpError::Io {
        path: dir.to_owned(),
        cause,
    })?;
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|cause| DumpError::Io {
            path: dir.to_owned(),
            cause,
        })?;
        let name = entry.file_name();
        if is_trace_file_name(&name.to_string_lossy()) {
            paths.push(entry.path());
        }
    }
    if paths.is_empty() {
        return Err(DumpError::NoTraces {
            dir: dir.to_owned(),
        });
    }
    let mut traces = paths
        .iter()
        .map(|p| read_trace(p))
        .collect::<Result<Vec<_>>>()?;
    traces.sort_by(|a, b| a.pid.cmp(&b.pid).then_with(|| a.path.cmp(&b.path)));
    Ok(Dump {
        dir: dir.to_owned(),
        traces,
        module_files: list_module_files(dir),
    })
}

/// Names of the files under `dir/modules` (temporary files of an interrupted write excluded).
pub fn list_module_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir.join(MODULES_DIR)) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// Reads one trace file.
pub fn read_trace(path: &Path) -> Result<ProcessTrace> {
    let bytes = fs::read(path).map_err(|cause| DumpError::Io {
        path: path.to_owned(),
        cause,
    })?;
    Ok(parse_trace(&String::from_utf8_lossy(&bytes), path))
}

/// Parses the text of one trace file; `path` names it in the result.
pub fn parse_trace(text: &str, path: &Path) -> ProcessTrace {
    let mut header = None;
    let mut records = Vec::new();
    let mut bad_lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(Record::Process(p)) if header.is_none() => header = Some(p),
            Ok(r) => records.push(r),
            Err(e) => bad_lines.push(BadLine {
                line: i + 1,
                error: e.to_string(),
            }),
        }
    }
    let pid = header
        .as_ref()
        .map(|h| h.pid)
        .unwrap_or_else(|| pid_from_file_name(path).unwrap_or(0));
    ProcessTrace {
        path: path.to_owned(),
        pid,
        header,
        records,
        bad_lines,
    }
}

fn pid_from_file_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("trace.")?.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_kept_not_fatal() {
        let text = "{\"type\":\"note\",\"seq\":1,\"level\":\"info\",\"message\":\"hi\"}\n{\"type\":\"launch\",\"seq\":2,";
        let t = parse_trace(text, Path::new("/x/trace.77.jsonl"));
        assert_eq!(t.pid, 77);
        assert_eq!(t.records.len(), 1);
        assert_eq!(t.bad_lines.len(), 1);
        assert_eq!(t.bad_lines[0].line, 2);
        assert!(!t.exited_cleanly());
    }

    #[test]
    fn pid_from_names() {
        assert_eq!(pid_from_file_name(Path::new("trace.12.jsonl")), Some(12));
        assert_eq!(pid_from_file_name(Path::new("trace.12.3.jsonl")), Some(12));
        assert_eq!(pid_from_file_name(Path::new("trace.x.jsonl")), None);
    }
}
