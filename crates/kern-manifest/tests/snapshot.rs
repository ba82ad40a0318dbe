//! `snapshot` on a per-sequence state (kern 4.1, issue 30): the prefix cache may keep copies of
//! the state at page boundaries. Off unless declared; only for per-sequence states; the prefix
//! cache uses snapshots only when every per-sequence state declares it (a warning says so).

mod common;

use common::check_speculative_edit as check;
use kern_manifest::manifest::StateSize;
use serde_json::{json, Value};

/// The speculative test manifest without its draft (speculative decoding refuses per-sequence
/// states), with the step ABI's `seq_slots` bound.
fn base() -> Value {
    let mut v: Value = common::speculative_manifest();
    let o = v.as_object_mut().unwrap();
    o.remove("speculative");
    o.remove("programs");
    v["buffers"]["seq_slots"] = json!({"dtype": "i32", "shape": ["seqs"], "role": "input"});
    v["step"]["buffers"]["seq_slots"] = json!("seq_slots");
    v
}

#[test]
fn snapshot_is_off_unless_declared_and_written_back_only_where_set() {
    let mut v = base();
    v["states"]["gdn"] = json!({"bytes_per_seq": 4096});
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(m.states.iter().find(|s| s.name == "gdn").unwrap().size, StateSize::PerSeq { bytes: 4096, snapshot: false });
    assert!(m.has_per_seq_state() && !m.per_seq_snapshots());
    v["states"]["gdn"]["snapshot"] = Value::Bool(true);
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    let gdn = m.states.iter().find(|s| s.name == "gdn").unwrap();
    assert_eq!(gdn.snapshot_bytes(), Some(4096));
    assert!(m.per_seq_snapshots());
    assert!(m.report().to_string().contains("snapshots at cached page boundaries"), "{}", m.report());
    let raw = kern_manifest::parse_raw(&serde_json::to_vec(&v).unwrap(), "model.json").unwrap_or_else(|d| panic!("{d}"));
    let text = serde_json::to_string(&raw).unwrap();
    assert_eq!(text.matches("\"snapshot\":true").count(), 1, "{text}");
    assert!(!text.contains("\"snapshot\":false"));
}

#[test]
fn snapshot_on_a_per_token_state_is_an_error_naming_its_path() {
    let mut v = base();
    v["states"]["kv"]["snapshot"] = Value::Bool(true);
    let d = check(&v).unwrap_err().to_string();
    assert!(d.contains("states.kv.snapshot: `snapshot` is for per-sequence states"), "{d}");
    let mut v = base();
    v["states"]["gdn"] = json!({"bytes_per_seq": 64, "snapshot": "yes"});
    let d = check(&v).unwrap_err().to_string();
    assert!(d.contains("states.gdn.snapshot: expected true or false"), "{d}");
}

#[test]
fn a_per_sequence_state_without_snapshot_next_to_one_with_it_is_warned_about() {
    let mut v = base();
    v["states"]["gdn"] = json!({"bytes_per_seq": 4096, "snapshot": true});
    v["states"]["conv"] = json!({"bytes_per_seq": 512});
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    assert!(!m.per_seq_snapshots(), "one per-sequence state cannot be put back");
    let w: Vec<String> = m.warnings.iter().map(|d| d.to_string()).collect();
    assert!(w.iter().any(|l| l.contains("states.conv: warning: other per-sequence states declare `snapshot`") && l.contains("the prefix cache") && l.contains("stays off")), "{w:?}");
    v["states"]["conv"]["snapshot"] = Value::Bool(true);
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    assert!(m.per_seq_snapshots());
    assert!(m.warnings.iter().all(|d| !d.to_string().contains("declare `snapshot`")), "{:?}", m.warnings);
}

#[test]
fn snapshot_needs_schema_4_1() {
    let mut v = base();
    v["schema_version"] = json!("4");
    v["states"] = json!({"kv": {"bytes_per_token": 4096}, "gdn": {"bytes_per_seq": 64, "snapshot": true}});
    let d = check(&v).unwrap_err().to_string();
    assert!(d.contains("`snapshot` at states.gdn.snapshot"), "{d}");
}
