//! The `speculative` section (kern 4.1, issue 18): a draft program with its own state
//! (`draft_kv`) and step bindings. `tests/data/speculative.json` passes against the fixture
//! kernels; each test below breaks one rule and expects exactly its errors, with their paths.

mod common;

use common::{
    check_speculative_edit as check, speculative_edit_errors as errors, speculative_manifest as base,
    speculative_manifest_path as data, stage,
};
use kern_manifest::{check_bytes, parse_raw, CheckOptions, Manifest};
use serde_json::{json, Value};
use std::path::Path;

fn passes(v: &Value) -> Manifest {
    check(v).unwrap_or_else(|d| panic!("should pass kern check:\n{d}"))
}

/// Exactly `want.len()` errors, each containing its fragment, in that order.
fn assert_errors(v: &Value, want: &[&str]) {
    let got = errors(v);
    assert_eq!(got.len(), want.len(), "errors: {got:#?}\nexpected: {want:#?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g.contains(w), "`{g}` does not contain `{w}`\nall: {got:#?}");
    }
}

#[test]
fn a_draft_program_passes_and_resolves() {
    let m = passes(&base());
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let s = m.speculative.as_ref().expect("the speculative section is checked");
    assert_eq!(m.programs[s.draft].name, "draft");
    assert_ne!(s.draft, 0, "programs[0] is main");
    assert_eq!(m.programs[0].name, "main");
    assert_eq!(s.k, 4);
    let top = m.step.as_ref().unwrap();
    // The override, and the top-level bindings for every other role.
    assert_eq!(s.step.sampled, m.buffer("draft_sampled").unwrap());
    assert_eq!(top.sampled, m.buffer("sampled").unwrap());
    assert_eq!(s.step.token_ids, top.token_ids);
    assert_eq!(s.step.block_tables, top.block_tables);
    assert_eq!(s.step.sampling, top.sampling);
    assert!(s.step.sampling.is_some());
    assert_eq!((s.step.logits, s.step.vocab), (None, None));
    assert_eq!((s.step.tokens, s.step.seqs, s.step.pages), (top.tokens, top.seqs, top.pages));
    // The draft pages its own state; the target's step keeps `kv`.
    assert_eq!(s.step.kv, m.state("draft_kv"));
    assert_eq!(top.kv, m.state("kv"));
    assert_eq!(s.states, vec![m.state("draft_kv").unwrap()]);
    assert_eq!(s.reads, vec![m.buffer("hidden").unwrap()]);
    // What the engine takes.
    let (draft, k, step) = m.speculative.as_ref().map(|s| (s.draft, s.k, &s.step)).unwrap();
    assert_eq!((m.programs[draft].name.as_str(), k, step.sampled), ("draft", 4, m.buffer("draft_sampled").unwrap()));
    let r = m.report();
    assert_eq!(r.speculative, Some(("draft".to_string(), 4)));
    assert!(
        r.to_string().contains("  speculative draft program draft, k = 4 draft tokens per verify step\n"),
        "{r}"
    );
}

#[test]
fn k_is_1_to_16() {
    for k in [1, 16] {
        let mut v = base();
        v["speculative"]["k"] = json!(k);
        assert_eq!(passes(&v).speculative.unwrap().k, k);
    }
    for k in [0, 17] {
        let mut v = base();
        v["speculative"]["k"] = json!(k);
        assert_errors(&v, &[&format!("speculative.k: a verify step checks 1 to 16 draft tokens, not {k}")]);
    }
}

#[test]
fn the_step_overrides_and_reads_are_optional() {
    // Without overrides the draft's step is the top-level one (here: it must then write `sampled`).
    let mut v = base();
    v["speculative"].as_object_mut().unwrap().remove("step");
    v["programs"]["draft"]["calls"][2]["args"][1] = json!({"buf": "sampled"});
    let m = passes(&v);
    let s = m.speculative.as_ref().unwrap();
    let top = m.step.as_ref().unwrap();
    assert_eq!((s.step.sampled, s.step.kv), (top.sampled, m.state("draft_kv")));
    // Without `reads`, nothing is read from the target, and the draft reading `hidden`
    // (an activation it never writes) is the usual warning.
    let mut v = base();
    v["speculative"].as_object_mut().unwrap().remove("reads");
    let m = passes(&v);
    assert!(m.speculative.as_ref().unwrap().reads.is_empty());
    let w: Vec<String> = m.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].starts_with("programs.draft.calls[0].args[0]: warning: `hidden` is an activation that no call writes"), "{w:?}");
}

#[test]
fn a_manifest_without_the_section_is_unchanged() {
    let mut v = base();
    v.as_object_mut().unwrap().remove("speculative");
    let m = passes(&v);
    assert!(m.speculative.is_none());
    let with = passes(&base());
    assert_eq!(m.step, with.step);
    assert_eq!(m.programs, with.programs);
    assert_eq!(m.report().speculative, None);
    assert!(!m.report().to_string().contains("speculative draft"));
    // The draft's read of `hidden` is now an ordinary program's: the usual warning.
    assert_eq!(m.warnings.len(), 1, "{:?}", m.warnings);
}

#[test]
fn the_draft_is_another_declared_program() {
    let mut v = base();
    v["speculative"]["draft"] = json!("drfat");
    assert_errors(&v, &["speculative.draft: `drfat` is not a program (did you mean `draft`?): declare the draft program in `programs`"]);
    let mut v = base();
    v["speculative"]["draft"] = json!("main");
    assert_errors(&v, &["speculative.draft: `main` is the target program, which verifies the drafts"]);
}

#[test]
fn the_target_is_main_and_comes_first() {
    // `programs` only, `draft` before `main`: the engine would step the draft.
    let mut v = base();
    let main = v.as_object_mut().unwrap().remove("program").unwrap();
    let draft = v["programs"]["draft"].take();
    v["programs"] = json!({"draft": draft, "main": main});
    assert_errors(&v, &["programs.main: with `speculative`, the target program `main` comes first"]);
    // `main` first in `programs` is the same as `program` (edited as text: a `Value` may not
    // keep the order of keys).
    let text = std::fs::read_to_string(data()).unwrap();
    let replace = |t: String, a: &str, b: &str| {
        assert!(t.contains(a), "{a}");
        t.replacen(a, b, 1)
    };
    let text = replace(text, r#""program": {"calls": ["#, r#""programs": {"main": {"calls": ["#);
    let text = replace(text, "  ]},\n  \"programs\": {\n", "  ]},\n");
    let staged = stage(&data());
    let m = check_bytes(text.as_bytes(), &staged.manifest, &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!((m.programs[0].name.as_str(), m.programs[1].name.as_str()), ("main", "draft"));
    assert_eq!(m.speculative.as_ref().unwrap().draft, 1);
    // No `main`.
    let mut v = base();
    let main = v.as_object_mut().unwrap().remove("program").unwrap();
    let draft = v["programs"]["draft"].take();
    v["programs"] = json!({"target": main, "draft": draft});
    assert_errors(&v, &["speculative: speculative decoding verifies the drafts with the program `main`"]);
}

#[test]
fn a_step_section_is_required() {
    let mut v = base();
    v.as_object_mut().unwrap().remove("step");
    assert_errors(&v, &["speculative: the draft program is driven through the step ABI: add the top-level `step` section"]);
    // A broken `step` is reported once, there.
    let mut v = base();
    v["step"]["abi"] = json!(2);
    assert_errors(&v, &["step.abi: step ABI 2 is unknown"]);
}

#[test]
fn step_overrides_are_checked_like_step_roles() {
    let mut v = base();
    v["speculative"]["step"] = json!({"sampled": "draft_sampled", "sampeld": "draft_sampled"});
    assert_errors(&v, &["speculative.step.sampeld: `sampeld` is not a step ABI role (did you mean `sampled`?)"]);
    let mut v = base();
    v["speculative"]["step"] = json!({"sampled": "draft_h"});
    assert_errors(&v, &["speculative.step.sampled: buffer `draft_h` cannot be the step's `sampled`: its dtype is f32, the ABI needs i32; its role is activation, the ABI needs \"role\": \"output\"; its shape is [tokens, 64], the ABI needs [seqs]"]);
    let mut v = base();
    v["speculative"]["step"] = json!({"sampled": "draft_smapled"});
    assert_errors(&v, &["speculative.step.sampled: no buffer `draft_smapled` (did you mean `draft_sampled`?)"]);
    // An input role overridden with a buffer of the right kind.
    let mut v = base();
    v["buffers"]["draft_positions"] = json!({"dtype": "i32", "shape": ["tokens"], "role": "input"});
    v["speculative"]["step"]["positions"] = json!("draft_positions");
    let m = passes(&v);
    let s = m.speculative.as_ref().unwrap();
    assert_eq!(s.step.positions, m.buffer("draft_positions").unwrap());
    assert_eq!(m.step.as_ref().unwrap().positions, m.buffer("positions").unwrap());
}

#[test]
fn sampling_roles_are_all_or_none_after_merging() {
    // A target without sampling roles; the draft adds all four, or only one.
    let mut v = base();
    for r in ["temperature", "top_k", "top_p", "seeds"] {
        v["step"]["buffers"].as_object_mut().unwrap().remove(r);
    }
    let m = passes(&v);
    assert!(m.step.as_ref().unwrap().sampling.is_none());
    assert!(m.speculative.as_ref().unwrap().step.sampling.is_none());
    let mut all = v.clone();
    for r in ["temperature", "top_k", "top_p", "seeds"] {
        all["speculative"]["step"][r] = json!(r);
    }
    let m = passes(&all);
    assert!(m.step.as_ref().unwrap().sampling.is_none());
    assert!(m.speculative.as_ref().unwrap().step.sampling.is_some());
    let mut one = v;
    one["speculative"]["step"]["temperature"] = json!("temperature");
    assert_errors(&one, &["speculative.step: sampling roles come together: temperature bound but top_k, top_p, seeds not"]);
}

#[test]
fn draft_states_are_disjoint_from_the_targets() {
    let mut v = base();
    v["programs"]["draft"]["calls"][1]["args"][1] = json!({"state": "kv"});
    assert_errors(&v, &["programs.draft.calls[1].args[1].state: state `kv` is the target's (`main` binds it at program.calls[0]): target and draft states are disjoint"]);
    // Reported once per state, however many calls bind it.
    let mut v = base();
    let calls = v["programs"]["draft"]["calls"].as_array_mut().unwrap();
    calls[1]["args"][1] = json!({"state": "kv"});
    let again = json!({"label": "layer2", "op": "layer", "args": [{"buf": "draft_h"}, {"state": "kv"}]});
    calls.insert(2, again);
    assert_errors(&v, &["programs.draft.calls[1].args[1].state: state `kv` is the target's (`main` binds it at program.calls[0]) (and 1 more call of the draft)"]);
}

#[test]
fn every_state_is_per_token() {
    let mut v = base();
    v["states"]["gdn"] = json!({"bytes_per_seq": 4096});
    v["buffers"]["seq_slots"] = json!({"dtype": "i32", "shape": ["seqs"], "role": "input"});
    v["step"]["buffers"]["seq_slots"] = json!("seq_slots");
    // Without `speculative` this is a valid manifest.
    let mut plain = v.clone();
    plain.as_object_mut().unwrap().remove("speculative");
    passes(&plain);
    assert_errors(&v, &["states.gdn: state `gdn` is per sequence, and speculative decoding needs every state per token"]);
}

#[test]
fn the_draft_writes_its_sampled_buffer() {
    let mut v = base();
    v["programs"]["draft"]["calls"][2]["args"][1] = json!({"buf": "sampled"});
    assert_errors(&v, &["programs.draft: the draft program never writes `draft_sampled`, its step's `sampled`"]);
    // Without the override the draft's `sampled` is the target's.
    let mut v = base();
    v["speculative"].as_object_mut().unwrap().remove("step");
    assert_errors(&v, &["programs.draft: the draft program never writes `sampled`, its step's `sampled`"]);
}

#[test]
fn reads_are_buffers_main_writes_and_the_draft_reads() {
    let cases: [(Value, &str); 5] = [
        (json!(["hiden"]), "speculative.reads[0]: `hiden` is not a buffer (did you mean `hidden`?)"),
        (json!(["hidden", "hidden"]), "speculative.reads[1]: `hidden` is listed twice in `reads`"),
        (json!(["draft_h"]), "speculative.reads[0]: `main` never writes `draft_h` (no call binds it to an `out` or `inout` parameter)"),
        (json!(["hidden", "sampled"]), "speculative.reads[1]: the draft program `draft` never reads `sampled` (no call binds it to an `in` or `inout` parameter)"),
        (json!(["w"]), "speculative.reads[0]: `w` is a weight"),
    ];
    for (reads, want) in cases {
        let mut v = base();
        v["buffers"]["w"] = json!({"dtype": "f32", "shape": [64], "role": "weight"});
        v["speculative"]["reads"] = reads;
        assert_errors(&v, &[want]);
    }
}

#[test]
fn the_section_is_decoded_strictly() {
    let mut v = base();
    v["speculative"]["kk"] = json!(4);
    assert_errors(&v, &["speculative.kk: unknown field `kk` (did you mean `k`?): the speculative section has `draft`, `k`, `step` and `reads`"]);
    let mut v = base();
    v["speculative"].as_object_mut().unwrap().remove("k");
    assert_errors(&v, &["speculative: `k` is missing from the speculative section"]);
    let mut v = base();
    v["speculative"]["reads"] = json!("hidden");
    assert_errors(&v, &["speculative.reads: expected a list of buffer names (a JSON array), found a string"]);
    let mut v = base();
    v["speculative"]["step"] = json!({"sampled": 3});
    assert_errors(&v, &["speculative.step.sampled: expected a string, found a number"]);
}

#[test]
fn the_section_needs_schema_4_1() {
    let text = r#"{"schema_version": 4, "model": "m", "program": {"calls": []},
                   "speculative": {"draft": "d", "k": 1}}"#;
    let err = check_bytes(text.as_bytes(), Path::new("m.json"), &CheckOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("m.json: schema_version: this manifest uses kern 4.1 extensions (`speculative` at speculative): set \"schema_version\": \"4.1\""),
        "{text}"
    );
}

#[test]
fn the_raw_section_round_trips() {
    let text = std::fs::read_to_string(data()).unwrap();
    let raw = parse_raw(text.as_bytes(), "speculative.json").unwrap();
    let s = raw.speculative.as_ref().unwrap();
    assert_eq!((s.draft.as_str(), s.k, s.reads.as_slice()), ("draft", 4, &["hidden".to_string()][..]));
    assert_eq!(s.step.get("sampled").map(String::as_str), Some("draft_sampled"));
    let again = serde_json::to_value(&raw).unwrap();
    assert_eq!(again, base());
}
