//! `batch_invariant` (kern 4.1, issue 29): a pack's declaration that its program gives a row the
//! same bits in any step. Off unless declared; a boolean; a 4.1 field; written back only when set.

mod common;

use common::{check_speculative_edit as check, speculative_manifest as base};
use serde_json::Value;

#[test]
fn batch_invariant_is_a_declared_boolean_of_version_4_1() {
    let mut v = base();
    assert!(!check(&v).unwrap_or_else(|d| panic!("{d}")).batch_invariant);
    v["batch_invariant"] = Value::Bool(true);
    assert!(check(&v).unwrap_or_else(|d| panic!("{d}")).batch_invariant);
    let raw = kern_manifest::parse_raw(&serde_json::to_vec(&v).unwrap(), "model.json").unwrap_or_else(|d| panic!("{d}"));
    assert!(serde_json::to_string(&raw).unwrap().contains("\"batch_invariant\":true"));
    v["batch_invariant"] = Value::String("yes".into());
    let d = check(&v).unwrap_err().to_string();
    assert!(d.contains("batch_invariant") && d.contains("expected true or false"), "{d}");
    let mut v = base();
    v["batch_invariant"] = Value::Bool(false);
    let raw = kern_manifest::parse_raw(&serde_json::to_vec(&v).unwrap(), "model.json").unwrap_or_else(|d| panic!("{d}"));
    assert!(!serde_json::to_string(&raw).unwrap().contains("batch_invariant"));
}
