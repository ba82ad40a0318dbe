//! Issue 18 (docs/speculative.md): drafts that need no weights of their own. `--draft self` and
//! `--draft layer-skip:L` add the draft program `programs.draft`, its KV state `draft_kv` and
//! the `speculative` section; the manifest passes `kern check` against the pack's real cubins,
//! the target's program is unchanged, and the draft never binds the target's `kv`.

use kern_manifest::{load, Binding, CheckOptions, Manifest, StateSize};
use kern_packs::config::preset;
use kern_packs::manifest::{check_draft, DEFAULT_DRAFT_K, DRAFT_KINDS, MAX_DRAFT_K};
use kern_packs::{generate, Config, Draft, DraftKind, PackOptions};
use serde_json::{json, Value};
use std::path::Path;
mod common;
use common::kernels;

fn opts(draft: Option<Draft>, tp: Option<u64>) -> PackOptions {
    PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 16, max_context: 1024, tp, draft, ..Default::default() }
}

/// Packs into `out`, checks the manifest as `kern check` does, and returns it with its JSON.
fn pack(cfg: &Config, o: &PackOptions, out: &Path) -> (Manifest, Value) {
    let path = generate(cfg, o, out).unwrap_or_else(|e| panic!("{:?}: {e}", o.draft));
    let m = load(&path, &CheckOptions::default()).unwrap_or_else(|d| panic!("{:?}: {d}", o.draft));
    let json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (m, json)
}

fn per_token(m: &Manifest, state: &str) -> (u64, u32) {
    match m.states[m.state(state).unwrap_or_else(|| panic!("no state {state}")).0].size {
        StateSize::PerToken { bytes, page_tokens } => (bytes, page_tokens),
        StateSize::PerSeq { .. } => panic!("{state} is per sequence"),
    }
}

/// The states a program binds, one entry per binding, by name.
fn state_bindings(m: &Manifest, program: &str) -> Vec<String> {
    let p = m.program(program).unwrap_or_else(|| panic!("no program {program}"));
    p.calls.iter().flat_map(|c| c.args.iter()).filter_map(|b| if let Binding::State(s) = b { Some(m.states[s.0].name.clone()) } else { None }).collect()
}

/// The decoder layer a call belongs to, from its label (`l3.qkv_proj` → 3).
fn layer_of(label: &str) -> Option<u64> {
    label.strip_prefix('l')?.split_once('.')?.0.parse().ok()
}

/// What the draft's calls must be, derived from the target's program without a draft: the
/// calls of layers `>= layers` dropped, every `kv` binding moved to `draft_kv`, and the KV ops
/// renamed (`rename`). In the fused program (`decode_fusion`) the draft's last layer ends as the
/// target's last layer does: its `down_proj_qkv` call (down projection + the next layer's norm
/// and QKV) becomes `down_proj` (op swiglu_down_proj: gate_up, act, W, mlp, tokens).
fn expected_draft(main: &Value, layers: u64, rename: &[(&str, &str)]) -> Vec<Value> {
    let mut calls: Vec<Value> = main["calls"].as_array().unwrap().iter().filter(|c| layer_of(c["label"].as_str().unwrap()).is_none_or(|l| l < layers)).cloned().collect();
    for c in &mut calls {
        if c["label"] == json!(format!("l{}.down_proj_qkv", layers - 1)) {
            let a = c["args"].as_array().unwrap().clone();
            *c = json!({"label": format!("l{}.down_proj", layers - 1), "op": "swiglu_down_proj", "args": [a[0], a[1], a[2], a[3], a[10]]});
        }
        for a in c["args"].as_array_mut().unwrap() {
            if *a == json!({"state": "kv"}) {
                *a = json!({"state": "draft_kv"});
            }
        }
        if let Some((_, to)) = rename.iter().find(|(from, _)| c["op"] == *from) {
            c["op"] = json!(to);
        }
    }
    calls
}

#[test]
fn draft_manifests_pass_kern_check_with_their_own_kv_and_the_target_unchanged() {
    for (name, tp) in [("qwen3-0.6b", None), ("qwen2.5-0.5b", None), ("qwen3-0.6b", Some(1))] {
        let cfg = preset(name).unwrap();
        let n = cfg.num_hidden_layers;
        let base = std::env::temp_dir().join(format!("kern-pack-draft-{}-{name}-{tp:?}", std::process::id()));
        let (plain, plain_json) = pack(&cfg, &opts(None, tp), &base.join("plain"));
        assert!(plain.speculative.is_none() && plain_json.get("speculative").is_none() && plain_json.get("programs").is_none(), "{name}: no draft without --draft");
        assert!(plain.state("draft_kv").is_none());
        let (kv_bytes, page_tokens) = per_token(&plain, "kv");
        assert_eq!(kv_bytes, n * 2 * cfg.kv_heads() * cfg.head_dim() * 2, "{name}");

        for (kind, k) in [(DraftKind::SelfDraft, 4), (DraftKind::LayerSkip(1), 1), (DraftKind::LayerSkip(n / 4), 7), (DraftKind::LayerSkip(n - 1), 16)] {
            let what = format!("{name} tp {tp:?} --draft {kind} --draft-k {k}");
            let (m, j) = pack(&cfg, &opts(Some(Draft { kind, k }), tp), &base.join(kind.to_string().replace(':', "-")));

            // The speculative section, exactly as kern-manifest reads it.
            assert_eq!(j["speculative"], json!({"draft": "draft", "k": k}), "{what}");
            let spec = m.speculative.as_ref().unwrap_or_else(|| panic!("{what}: checked speculative section"));
            assert_eq!((m.programs[spec.draft].name.as_str(), spec.k), ("draft", k as u32), "{what}");
            assert_eq!(m.programs[0].name, "main", "{what}: the target comes first");

            // draft_kv: the draft's layers' share of kv, paged alike.
            let layers = match kind {
                DraftKind::SelfDraft => n,
                DraftKind::LayerSkip(l) => l,
            };
            let (draft_bytes, draft_page) = per_token(&m, "draft_kv");
            assert_eq!(draft_bytes * n, kv_bytes * layers, "{what}: draft_kv is {layers}/{n} of kv");
            if kind == DraftKind::SelfDraft {
                assert_eq!(draft_bytes, kv_bytes, "{what}");
            }
            assert_eq!((per_token(&m, "kv"), draft_page), ((kv_bytes, page_tokens), page_tokens), "{what}: kv unchanged, same pages");

            // The draft binds draft_kv (twice per layer: RoPE's KV write, attention's read) and
            // never the target's kv; the target binds kv only.
            let draft_states = state_bindings(&m, "draft");
            assert_eq!(draft_states.len() as u64, 2 * layers, "{what}");
            assert!(draft_states.iter().all(|s| s == "draft_kv"), "{what}: {draft_states:?}");
            assert_eq!(spec.states, vec![m.state("draft_kv").unwrap()], "{what}");
            assert!(state_bindings(&m, "main").iter().all(|s| s == "kv"), "{what}");

            // The target's program and ops are those of the manifest without a draft.
            assert_eq!(j["program"], plain_json["program"], "{what}: main unchanged");
            for (op, v) in plain_json["ops"].as_object().unwrap() {
                assert_eq!(&j["ops"][op], v, "{what}: op {op} unchanged");
            }
            assert_eq!(j["buffers"], plain_json["buffers"], "{what}: the draft shares the target's buffers");

            // The draft's calls: the target's, through its first `layers` layers, on draft_kv.
            let rename: &[(&str, &str)] = match kind {
                DraftKind::SelfDraft => &[],
                DraftKind::LayerSkip(_) => &[("qk_norm_rope", "draft_qk_norm_rope"), ("attention", "draft_attention")],
            };
            let want = expected_draft(&plain_json["program"], layers, rename);
            assert_eq!(j["programs"]["draft"]["calls"].as_array().unwrap(), &want, "{what}");
            let draft = m.program("draft").unwrap();
            let mut seen: Vec<u64> = draft.calls.iter().filter_map(|c| layer_of(&c.label)).collect();
            seen.dedup();
            assert_eq!(seen, (0..layers).collect::<Vec<_>>(), "{what}: exactly the first {layers} layers");
            // Unfused (the default, and tp): embed, input norm, 9 calls a layer (+ 2 all-reduces
            // with tp) but the last layer's input norm, 5 at the end; fused (`decode_fusion`):
            // embed, l0.qkv_proj, 4 a layer (rope, attention, o_proj_gate_up, down_proj_qkv /
            // down_proj), 5 at the end.
            let fused = tp.is_none() && PackOptions::default().decode_fusion;
            let want = if fused { 2 + 4 * layers + 5 } else { 2 + if tp.is_some() { 11 } else { 9 } * layers - 1 + 5 };
            assert_eq!(draft.calls.len() as u64, want, "{what}");
            // The same final norm, LM head and sampling into the step's `sampled`, as the target.
            let tail: Vec<&str> = draft.calls.iter().rev().take(5).map(|c| c.label.as_str()).collect();
            assert_eq!(tail, ["sample", "lm_head", "final_norm", "gather.mlp", "gather.residual"], "{what}");
            let sampled = m.buffer("sampled").unwrap();
            assert_eq!(draft.calls.last().unwrap().args[0], Binding::Buf(sampled), "{what}");
            assert_eq!((m.step.as_ref().unwrap().sampled, spec.step.sampled), (sampled, sampled), "{what}: the step's `sampled`, for both programs");
            assert_eq!(spec.step.kv, m.state("draft_kv"), "{what}: the draft's step pages draft_kv");

            // A layer-skip draft's KV ops address a state of L layers per token; nothing else
            // in them differs from the target's.
            match kind {
                DraftKind::SelfDraft => assert!(j["ops"].get("draft_qk_norm_rope").is_none() && j["ops"].get("draft_attention").is_none(), "{what}"),
                DraftKind::LayerSkip(l) => {
                    for (op, num_layers_arg) in [("qk_norm_rope", 12), ("attention", 13)] {
                        let mut want = plain_json["ops"][op].clone();
                        // attention_dD and the split kernel (the default --decode-attention)
                        // take num_layers at the same index; the combine reads no KV.
                        for launch in want["impl"]["launches"].as_array_mut().unwrap() {
                            if launch["entry"].as_str().unwrap().starts_with("attention_combine") {
                                continue;
                            }
                            let arg = &mut launch["args"][num_layers_arg];
                            assert_eq!(*arg, json!({"i32": n}), "{what}: {op}'s num_layers");
                            *arg = json!({"i32": l});
                        }
                        assert_eq!(j["ops"][format!("draft_{op}")], want, "{what}");
                    }
                }
            }
        }
        std::fs::remove_dir_all(&base).ok();
    }
}

#[test]
fn draft_kinds_parse_and_print() {
    assert_eq!("self".parse::<DraftKind>(), Ok(DraftKind::SelfDraft));
    assert_eq!("layer-skip:9".parse::<DraftKind>(), Ok(DraftKind::LayerSkip(9)));
    for k in [DraftKind::SelfDraft, DraftKind::LayerSkip(3)] {
        assert_eq!(k.to_string().parse::<DraftKind>(), Ok(k));
    }
    for bad in ["medusa", "", "Self", "eagle:3", "self:2"] {
        let e = bad.parse::<DraftKind>().unwrap_err();
        assert!(e.contains(&format!("unknown draft kind `{bad}`")) && e.contains("supported: self, layer-skip:L"), "{bad}: {e}");
    }
    assert!(DRAFT_KINDS.starts_with("self, layer-skip:L"));
    let e = "layer-skip".parse::<DraftKind>().unwrap_err();
    assert!(e.contains("needs the number of layers") && e.contains("layer-skip:L"), "{e}");
    for bad in ["layer-skip:", "layer-skip:x", "layer-skip:-1", "layer-skip:1.5", "layer-skip:3:4"] {
        let e = bad.parse::<DraftKind>().unwrap_err();
        assert!(e.contains(&format!("`{bad}`: L must be a whole number of decoder layers")), "{bad}: {e}");
    }
    assert_eq!((DEFAULT_DRAFT_K, MAX_DRAFT_K), (4, 16));
}

#[test]
fn drafts_that_cannot_be_written_are_refused_with_the_reason() {
    let cfg = preset("qwen3-0.6b").unwrap(); // 28 layers
    let out = std::env::temp_dir().join(format!("kern-pack-draft-bad-{}", std::process::id()));
    let refuse = |cfg: &Config, draft: Draft, tp: Option<u64>| {
        let e = generate(cfg, &opts(Some(draft), tp), &out).unwrap_err().to_string();
        assert!(!out.exists(), "nothing is written for a refused draft ({e})");
        assert_eq!(check_draft(cfg, &draft, tp).unwrap_err(), e);
        e
    };
    for l in [0, 28, 29, 1000] {
        let e = refuse(&cfg, Draft { kind: DraftKind::LayerSkip(l), k: 4 }, None);
        assert_eq!(e, format!("--draft layer-skip:{l}: L must be between 1 and 27 (the model has 28 decoder layers; the draft keeps the first L)"));
    }
    for k in [0, 17, 100] {
        let e = refuse(&cfg, Draft { kind: DraftKind::SelfDraft, k }, None);
        assert_eq!(e, format!("--draft-k {k}: the draft proposes 1 to 16 tokens per verify step"));
    }
    let e = refuse(&cfg, Draft { kind: DraftKind::LayerSkip(4), k: 4 }, Some(2));
    assert!(e.contains("--draft with --tp 2") && e.contains("not supported with tensor parallelism yet"), "{e}");
    // Every reason at once.
    let e = refuse(&cfg, Draft { kind: DraftKind::LayerSkip(28), k: 17 }, Some(4));
    assert!(e.contains("layer-skip:28") && e.contains("--draft-k 17") && e.contains("--tp 4"), "{e}");
    // A one-layer model has no layer to skip; it can still draft with itself.
    let mut one = cfg.clone();
    one.num_hidden_layers = 1;
    let e = refuse(&one, Draft { kind: DraftKind::LayerSkip(1), k: 4 }, None);
    assert!(e.contains("the model has 1 decoder layer(s)") && e.contains("--draft self"), "{e}");
    assert!(check_draft(&one, &Draft { kind: DraftKind::SelfDraft, k: 4 }, None).is_ok());
    // The edges pass.
    for (kind, k, tp) in [(DraftKind::LayerSkip(1), 1, None), (DraftKind::LayerSkip(27), 16, Some(1)), (DraftKind::SelfDraft, 4, None)] {
        assert!(check_draft(&cfg, &Draft { kind, k }, tp).is_ok(), "{kind} {k} {tp:?}");
    }
}
