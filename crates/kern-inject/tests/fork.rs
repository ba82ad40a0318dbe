//! Forks and unclean exits with the real tracer (no CUPTI needed: records are emitted
//! directly). One test per binary: the tracer is process-global.
//!
//! * a `fork()` child writes its own `trace.<child>.jsonl` naming its parent, and nothing the
//!   parent buffered before the fork appears twice;
//! * a child that leaves with `exit()` gets an `exit` record (atexit ran);
//! * a child that leaves with `_exit()` (no atexit, like a Python multiprocessing worker)
//!   still has its records on disk, flushed by the flusher thread.

use std::time::Duration;

use kern_dump::format::{NoteLevel, Record};
use kern_dump::reader::read_trace;
use kern_inject::driver::Driver;
use kern_inject::writer::FLUSH_INTERVAL;

fn notes(path: &std::path::Path) -> (Vec<String>, bool, Option<u32>) {
    let t = read_trace(path).unwrap();
    assert!(t.bad_lines.is_empty(), "{:?}", t.bad_lines);
    let msgs = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::Note(n) => Some(n.message.clone()),
            _ => None,
        })
        .collect();
    (
        msgs,
        t.exited_cleanly(),
        t.header.and_then(|h| h.forked_from),
    )
}

fn fork_child(body: impl FnOnce()) -> u32 {
    // SAFETY: the child runs `body` (which only uses the tracer) and exits without returning.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        body();
        unreachable!("the child body exits");
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    pid as u32
}

#[test]
fn forks_and_unclean_exits() {
    let dir = std::env::temp_dir().join(format!("kern-inject-fork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let t = kern_inject::testing::install_tracer(dir.clone(), Driver::default(), 0);
    let parent = std::process::id();

    t.note(NoteLevel::Info, "parent before fork 1".into());
    t.note(NoteLevel::Info, "parent before fork 2".into());

    // A child that exits through exit(): atexit writes the exit record.
    let child1 = fork_child(|| {
        let t = kern_inject::tracer::get().unwrap();
        t.note(NoteLevel::Info, "child 1".into());
        unsafe { libc::exit(0) };
    });

    // A child that leaves with _exit(): only the flusher thread saves its records.
    let child2 = fork_child(|| {
        let t = kern_inject::tracer::get().unwrap();
        t.note(NoteLevel::Info, "child 2".into());
        std::thread::sleep(FLUSH_INTERVAL * 3 + Duration::from_millis(100));
        unsafe { libc::_exit(0) };
    });

    t.note(NoteLevel::Info, "parent after forks".into());
    t.finish("atexit");

    let (p, p_exit, p_fork) = notes(&dir.join(format!("trace.{parent}.jsonl")));
    assert_eq!(
        p,
        [
            "parent before fork 1",
            "parent before fork 2",
            "parent after forks"
        ]
    );
    assert!(p_exit);
    assert_eq!(p_fork, None);

    let (c1, c1_exit, c1_fork) = notes(&dir.join(format!("trace.{child1}.jsonl")));
    assert_eq!(
        c1,
        ["child 1"],
        "nothing of the parent's buffer is repeated in the child"
    );
    assert!(c1_exit, "exit() ran the atexit hook");
    assert_eq!(c1_fork, Some(parent));

    let (c2, c2_exit, c2_fork) = notes(&dir.join(format!("trace.{child2}.jsonl")));
    assert_eq!(
        c2,
        ["child 2"],
        "flushed by the flusher thread before _exit"
    );
    assert!(!c2_exit, "_exit skips atexit");
    assert_eq!(c2_fork, Some(parent));

    let dump = kern_dump::read_dump(&dir).unwrap();
    assert_eq!(dump.traces.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
