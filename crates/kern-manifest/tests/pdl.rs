//! `pdl` on a launch (kern 4.1, issue 15): Programmatic Dependent Launch, off unless declared.

mod common;

use common::{check_speculative_edit as check, speculative_manifest as base, stage};
use kern_manifest::{check_bytes, CheckOptions};
use serde_json::Value;
use std::path::Path;

#[test]
fn pdl_is_off_unless_a_launch_declares_it() {
    let mut v = base();
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    assert!(m.ops.iter().flat_map(|o| &o.launches).all(|l| !l.pdl), "no launch declares it");
    v["ops"]["mix"]["impl"]["launches"][0]["pdl"] = Value::Bool(true);
    let m = check(&v).unwrap_or_else(|d| panic!("{d}"));
    let mix = m.ops.iter().find(|o| o.name == "mix").unwrap();
    assert!(mix.launches[0].pdl);
    assert!(m.ops.iter().filter(|o| o.name != "mix").flat_map(|o| &o.launches).all(|l| !l.pdl));
    // The raw manifest writes it back only where it is set.
    let raw = kern_manifest::parse_raw(&serde_json::to_vec(&v).unwrap(), "model.json").unwrap_or_else(|d| panic!("{d}"));
    let text = serde_json::to_string(&raw).unwrap();
    assert_eq!(text.matches("\"pdl\":true").count(), 1, "{text}");
    assert!(!text.contains("\"pdl\":false"));
}

#[test]
fn pdl_is_a_boolean_of_schema_4_1() {
    let mut v = base();
    v["ops"]["mix"]["impl"]["launches"][0]["pdl"] = Value::String("yes".into());
    let d = check(&v).map(|_| ()).unwrap_err().to_string();
    assert!(d.contains("ops.mix.impl.launches[0].pdl") && d.contains("expected true or false"), "{d}");
    // The vecadd example without its buffer roles is schema 4: then `pdl` alone needs 4.1.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/vecadd/model.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&example).unwrap()).unwrap();
    v["schema_version"] = Value::from(4);
    for b in v["buffers"].as_object_mut().unwrap().values_mut() {
        b.as_object_mut().unwrap().remove("role"); // a 4.1 field too
    }
    let staged = stage(&example);
    let as_4 = |v: &Value| check_bytes(&serde_json::to_vec_pretty(v).unwrap(), &staged.manifest, &CheckOptions::default());
    as_4(&v).unwrap_or_else(|d| panic!("the example passes as schema 4: {d}"));
    v["ops"]["vec_add"]["impl"]["launches"][0]["pdl"] = Value::Bool(true);
    let d = as_4(&v).map(|_| ()).unwrap_err().to_string();
    assert!(d.contains("4.1 extensions (`pdl` at ops.vec_add.impl.launches[0].pdl)"), "{d}");
}
