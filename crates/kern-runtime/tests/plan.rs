//! The memory plan on manifests without kernels: arena layout, aliases, state budgets.

use kern_manifest::{check_bytes, CheckOptions};
use kern_runtime::plan::{plan, PlanOptions, StatePool, ALIGN};
use std::path::Path;

fn manifest(json: &str) -> kern_manifest::Manifest {
    check_bytes(json.as_bytes(), Path::new("/tmp/plan-test/model.json"), &CheckOptions::default()).unwrap_or_else(|d| panic!("{d}"))
}

const M: &str = r#"{
  "schema_version": "4.1", "model": "plan-test",
  "vars": {"tokens": {"max": 100}, "seqs": {"max": 8}},
  "states": {"kv": {"bytes_per_token": 1000, "page_tokens": 16}, "draft": {"bytes_per_token": 24, "page_tokens": 16},
             "rnn": {"bytes_per_seq": 4096}},
  "buffers": {
    "embed": {"dtype": "bf16", "shape": [10, 4], "role": "weight", "from": {"tensor": "model.embed_tokens.weight"}},
    "x": {"dtype": "f32", "shape": ["tokens", 3]},
    "lm_head": {"dtype": "bf16", "shape": [10, 4], "role": "weight", "from": {"alias": "embed"}},
    "ids": {"dtype": "i32", "shape": ["seqs"], "role": "input"}
  },
  "program": {"calls": []}
}"#;

#[test]
fn arena_layout_and_aliases() {
    let m = manifest(M);
    let p = plan(&m, &PlanOptions::default()).unwrap();
    assert_eq!(p.buffers[0].offset, 0);
    assert_eq!(p.buffers[0].bytes, 80);
    assert_eq!(p.buffers[1].offset, ALIGN);
    assert_eq!(p.buffers[1].bytes, 1200, "x is sized at tokens' max");
    assert_eq!(p.buffers[2].offset, 0, "the alias shares embed's memory");
    assert!(p.buffers[2].alias_of.is_some());
    assert_eq!(p.buffers[3].offset, 2 * ALIGN + 1280 - 256, "ids follows x, 256-aligned");
    assert_eq!(p.arena_bytes % ALIGN, 0);
    assert_eq!(p.by_role[0], 80, "weights counted once");
    // No budget: no pages.
    assert!(matches!(p.states[0], StatePool::PerToken { pages: 0, .. }));
}

#[test]
fn budget_split_between_states() {
    let m = manifest(M);
    let budget = 10 << 20;
    let p = plan(&m, &PlanOptions { budget: Some(budget), reserve: 1 << 20, max_pages: None }).unwrap();
    // Per-seq first: 8 slots of 4096 bytes.
    assert_eq!(p.states[2], StatePool::PerSeq { bytes_per_seq: 4096, slots: 8, pool_bytes: 8 * 4096 });
    let remaining = budget - p.arena_bytes - (1 << 20) - 8 * 4096;
    let pages = remaining / (16 * (1000 + 24));
    assert_eq!(p.states[0], StatePool::PerToken { bytes_per_token: 1000, page_tokens: 16, pages, pool_bytes: pages * 16 * 1000 });
    assert!(matches!(p.states[1], StatePool::PerToken { pages: q, .. } if q == pages), "per-token states share pages");
    assert_eq!(p.token_capacity, Some(pages * 16));
    assert!(p.total_bytes() <= budget);
    // A page cap below what the budget holds: every per-token pool stops there.
    let capped = plan(&m, &PlanOptions { budget: Some(budget), reserve: 1 << 20, max_pages: Some(7) }).unwrap();
    assert!(matches!(capped.states[0], StatePool::PerToken { pages: 7, pool_bytes, .. } if pool_bytes == 7 * 16 * 1000));
    assert!(matches!(capped.states[1], StatePool::PerToken { pages: 7, .. }));
    assert_eq!(capped.token_capacity, Some(7 * 16));
}

#[test]
fn too_small_budget_says_what_is_needed() {
    let m = manifest(M);
    let e = plan(&m, &PlanOptions { budget: Some(1000), reserve: 0, max_pages: None }).unwrap_err().to_string();
    assert!(e.contains("needs") && e.contains("budget is 1000 B"), "{e}");
}

#[test]
fn per_token_states_must_share_page_size() {
    let m = manifest(&M.replace(r#""draft": {"bytes_per_token": 24, "page_tokens": 16}"#, r#""draft": {"bytes_per_token": 24, "page_tokens": 32}"#));
    let e = plan(&m, &PlanOptions { budget: Some(1 << 30), reserve: 0, max_pages: None }).unwrap_err().to_string();
    assert!(e.contains("states.") && e.contains("page_tokens"), "{e}");
}

#[test]
fn snapshot_slots_come_out_of_the_pages_budget() {
    use kern_runtime::plan::{plan_with, Snapshots, SNAPSHOT_SHARE};
    let budget = 10 << 20;
    let opts = PlanOptions { budget: Some(budget), reserve: 1 << 20, max_pages: None };
    // Without `snapshot`: no snapshot slots.
    assert_eq!(plan(&manifest(M), &opts).unwrap().snapshot_slots, 0);
    let m = manifest(&M.replace(r#""rnn": {"bytes_per_seq": 4096}"#, r#""rnn": {"bytes_per_seq": 4096, "snapshot": true}"#));
    let p = plan(&m, &opts).unwrap();
    let left = budget - p.arena_bytes - (1 << 20) - 8 * 4096;
    let snaps = left / SNAPSHOT_SHARE.1 * SNAPSHOT_SHARE.0 / 4096;
    assert_eq!((p.snapshot_slots, p.snapshot_slot_bytes), (snaps, 4096), "auto: 1/8 of what is left");
    let pages = (left - snaps * 4096) / (16 * (1000 + 24));
    assert!(matches!(p.states[0], StatePool::PerToken { pages: q, .. } if q == pages), "the pages get the rest");
    assert!(p.total_bytes() <= budget);
    // A count asked for; zero; too many.
    let p = plan_with(&m, &opts, Snapshots::Slots(5)).unwrap();
    assert_eq!((p.snapshot_slots, p.snapshot_bytes()), (5, 5 * 4096));
    assert_eq!(plan_with(&m, &opts, Snapshots::Slots(0)).unwrap().snapshot_bytes(), 0);
    let e = plan_with(&m, &opts, Snapshots::Slots(1 << 20)).unwrap_err().to_string();
    assert!(e.contains("snapshot slots") && e.contains("ask for fewer"), "{e}");
    // Never more snapshots than pages (each belongs to one cached page).
    let capped = plan(&m, &PlanOptions { max_pages: Some(7), ..opts.clone() }).unwrap();
    assert_eq!(capped.snapshot_slots, 7);
    // No budget: no pages, no snapshots.
    assert_eq!(plan(&m, &PlanOptions::default()).unwrap().snapshot_slots, 0);
    // A slot much smaller than a page group: 1/8 of the memory would be more slots than the
    // pages left after them; the plan stops at one slot per page.
    let tiny = manifest(&M.replace(r#""rnn": {"bytes_per_seq": 4096}"#, r#""rnn": {"bytes_per_seq": 4, "snapshot": true}"#));
    let big = PlanOptions { budget: Some(1 << 30), ..opts.clone() };
    let p = plan(&tiny, &big).unwrap();
    let StatePool::PerToken { pages, .. } = p.states[0] else { panic!("kv first") };
    assert!(p.snapshot_slots > 0 && p.snapshot_slots <= pages, "{} slots, {pages} pages", p.snapshot_slots);
    assert!(p.total_bytes() <= 1 << 30);
}
