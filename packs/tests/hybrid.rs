//! Gated DeltaNet hybrids (issue 30: `qwen3_next`, `qwen3_5`): their manifests pass `kern check`
//! against the real cubins (gdn.cu, gated.cu: every launch's parameters against the image's own
//! layout, which a mismatched launch fails — the negative control below), at two small configs per
//! family and Qwen3-Next-80B-A3B's real shape, with fp32 and bf16 states; the per-sequence state's
//! size is KERNELS.md's formula and is declared snapshot-able; the KV cache holds the attention
//! layers only; each layer runs the calls of its kind; exactly one delta-rule kernel runs at every
//! step size (chunked iff tokens > seqs); Qwen3-Next's per-key-head projections are regrouped as
//! transformers' `fix_query_key_value_ordering` reads them; the options a hybrid cannot take are
//! refused; and random checkpoints of both layouts load into the manifests with every tensor used.

use kern_manifest::{load, CheckOptions, DType, Manifest, StateSize};
use kern_packs::config::preset;
use kern_packs::gdn::{self, GdnState, Hybrid};
use kern_packs::{generate, Config, Draft, DraftKind, PackOptions};
use kern_weights::Checkpoint;
mod common;
use common::kernels;

const GDN_CALLS: [&str; 7] = ["gdn_in_proj", "gdn_split", "gdn_conv", "gdn_conv_state", "gdn_rule", "gdn_norm", "gdn_out_proj"];
const ATTN_CALLS: [&str; 5] = ["qkv_proj", "qk_norm_rope", "attention", "attn_output_gate", "o_proj"];
const PRESETS: [&str; 5] = ["qwen3.5-small", "qwen3.5-small-d256", "qwen3-next-small", "qwen3-next-small-d256", "qwen3-next-80b-a3b"];

fn labels(m: &Manifest, l: u64) -> Vec<String> {
    let p = format!("l{l}.");
    m.programs[0].calls.iter().filter_map(|c| c.label.strip_prefix(&p).map(str::to_string)).collect()
}

/// The launches of `op` whose grid is positive at (tokens, seqs) (pages at its max).
fn live(m: &Manifest, op: &str, tokens: i64, seqs: i64) -> Vec<String> {
    let mut vars = m.vars_at_max();
    vars[m.var("tokens").unwrap().0] = tokens;
    vars[m.var("seqs").unwrap().0] = seqs;
    let op = &m.ops[m.op(op).unwrap_or_else(|| panic!("no op {op}")).0];
    op.launches.iter().filter(|l| l.runs(&vars).unwrap()).map(|l| l.entry.clone()).collect()
}

fn int_arg(m: &Manifest, label: &str, i: usize) -> i64 {
    let call = m.programs[0].calls.iter().find(|c| c.label == label).unwrap_or_else(|| panic!("no call {label}"));
    match &call.args[i] {
        kern_manifest::Binding::Const(kern_manifest::Value::I32(v)) => i64::from(*v),
        other => panic!("{label} arg {i}: {other:?}"),
    }
}

#[test]
fn hybrid_presets_pass_kern_check_with_their_states_and_layer_kinds() {
    let dir = tempfile::tempdir().unwrap();
    for name in PRESETS {
        for (max_tokens, pdl_small, state) in [(512, true, GdnState::F32), (64, false, GdnState::Bf16), (2048, true, GdnState::F32)] {
            let cfg = preset(name).unwrap();
            let h = cfg.hybrid.clone().unwrap();
            let opts = PackOptions { kernels: kernels(), max_tokens, max_seqs: 32, pdl_small_steps: pdl_small, gdn_state: state, ..Default::default() };
            let out = dir.path().join(format!("{name}-{max_tokens}-{state}"));
            let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name} {max_tokens} {state}: {d}"));
            let what = format!("{name} max_tokens {max_tokens} state {state}");
            // States: the KV cache of the attention layers only; one GDN slot per sequence.
            let attn = gdn::attn_layers(&cfg);
            let lin = gdn::linear_layers(&cfg);
            assert_eq!(attn + lin, cfg.num_hidden_layers);
            assert!(lin > 0 && attn > 0, "{what}: both layer kinds");
            let kv = m.states.iter().find(|s| s.name == "kv").unwrap();
            assert!(matches!(kv.size, StateSize::PerToken { bytes, .. } if bytes == attn * 2 * cfg.kv_heads() * cfg.head_dim() * 2), "{what}: {:?}", kv.size);
            let g = m.states.iter().find(|s| s.name == "gdn").unwrap();
            let conv_bytes = 3 * h.conv_dim() * 2;
            let rec_bytes = h.num_v_heads * 128 * 128 * state.bytes();
            assert_eq!(g.size, StateSize::PerSeq { bytes: lin * (conv_bytes + rec_bytes), snapshot: true }, "{what}");
            assert_eq!(gdn::bytes_per_seq(&cfg, state), lin * (conv_bytes + rec_bytes));
            assert!(m.step.as_ref().unwrap().seq_slots.is_some(), "{what}: seq_slots bound");
            // Calls per layer kind; the layer indices the kernels get.
            for l in 0..cfg.num_hidden_layers {
                let got = labels(&m, l);
                let mixer: Vec<&str> = got.iter().map(String::as_str).filter(|s| GDN_CALLS.contains(s) || ATTN_CALLS.contains(s)).collect();
                if gdn::is_linear(&cfg, l) {
                    assert_eq!(mixer, GDN_CALLS, "{what} layer {l}");
                    // gdn_conv [.., layer], gdn_conv_state [.., layer], gdn_rule [.., layer]
                    assert_eq!(int_arg(&m, &format!("l{l}.gdn_conv"), 9), gdn::linear_index(&cfg, l) as i64, "{what} layer {l}");
                    assert_eq!(int_arg(&m, &format!("l{l}.gdn_rule"), 11), gdn::linear_index(&cfg, l) as i64, "{what} layer {l}");
                } else {
                    assert_eq!(mixer, ATTN_CALLS, "{what} layer {l}");
                    assert_eq!(int_arg(&m, &format!("l{l}.qk_norm_rope"), 8), gdn::attn_index(&cfg, l) as i64, "{what} layer {l}");
                    assert_eq!(int_arg(&m, &format!("l{l}.attention"), 9), gdn::attn_index(&cfg, l) as i64, "{what} layer {l}");
                }
                let mlp: Vec<&str> = got.iter().map(String::as_str).filter(|s| s.starts_with("shared_") || ["router", "moe_combine", "gate_up_proj"].contains(s)).collect();
                match cfg.moe.as_ref().filter(|m| m.is_moe(l)) {
                    Some(_) => assert_eq!(mlp, ["router", "moe_combine", "shared_gate_up", "shared_swiglu", "shared_down", "shared_gate_add"], "{what} layer {l}"),
                    None => assert_eq!(mlp, ["gate_up_proj"], "{what} layer {l}"),
                }
            }
            // Exactly one delta-rule kernel at every step size: the chunked one iff tokens > seqs
            // (two copies of each under --pdl-small-steps, one per side of 8 tokens).
            for seqs in [1i64, 2, 8, 32] {
                for tokens in [1i64, 2, 8, 9, 32, 64, 65, 300, 512, 2048] {
                    if tokens > max_tokens as i64 || tokens < seqs {
                        continue;
                    }
                    let want = if tokens > seqs { format!("gdn_chunk_{state}") } else { format!("gdn_recurrent_{state}") };
                    assert_eq!(live(&m, "gdn_rule", tokens, seqs), [want], "{what} tokens={tokens} seqs={seqs}");
                    assert_eq!(live(&m, "gdn_conv", tokens, seqs), [format!("gdn_conv_{state}")]);
                }
            }
            let rule = &m.ops[m.op("gdn_rule").unwrap().0];
            let chunk = rule.launches.iter().find(|l| l.entry.starts_with("gdn_chunk")).unwrap();
            assert_eq!(chunk.shared.eval(&m.vars_at_max()).unwrap(), gdn::CHUNK_SMEM as i64, "{what}");
            // The gated attention reads its own q rows; the projection holds [q | gate] per head.
            let qkv = m.buffer("qkv").unwrap();
            assert_eq!(m.shape(qkv, &m.vars_at_max()).unwrap()[1], ((2 * cfg.num_attention_heads + 2 * cfg.kv_heads()) * cfg.head_dim()) as i64);
            let a_log = &m.buffers[m.buffer("model.layers.0.linear_attn.A_log").unwrap().0];
            assert_eq!(a_log.dtype, DType::F32, "{what}: A_log as f32");
        }
    }
}

#[test]
fn a_launch_whose_params_differ_from_the_cubin_fails_kern_check() {
    // The negative control of the test above: drop gdn_rule's last kernel parameter (num_layers),
    // then give the gated rope one parameter too many; kern check names the launch each time.
    let dir = tempfile::tempdir().unwrap();
    let cfg = preset("qwen3.5-small").unwrap();
    let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 8, ..Default::default() };
    let path = generate(&cfg, &opts, &dir.path().join("p")).unwrap();
    let good: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for (op, edit) in [("gdn_rule", 0), ("qk_norm_rope", 1)] {
        let mut m = good.clone();
        for l in m["ops"][op]["impl"]["launches"].as_array_mut().unwrap() {
            if edit == 0 {
                l["params"].as_array_mut().unwrap().pop();
                l["args"].as_array_mut().unwrap().pop();
            } else {
                l["params"].as_array_mut().unwrap().push(serde_json::json!("i32"));
                l["args"].as_array_mut().unwrap().push(serde_json::json!({"i32": 0}));
            }
        }
        let bad = dir.path().join(format!("p/bad-{op}.json"));
        std::fs::write(&bad, serde_json::to_string(&m).unwrap()).unwrap();
        let e = load(&bad, &CheckOptions::default()).err().unwrap_or_else(|| panic!("{op}: a wrong parameter list passed kern check")).to_string();
        assert!(e.contains(op) || e.contains("gdn_") || e.contains("qk_norm_rope_gated"), "{op}: {e}");
    }
}

#[test]
fn hybrid_options_that_cannot_hold_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let base = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 8, max_context: 512, ..Default::default() };
    for name in ["qwen3.5-small", "qwen3-next-small"] {
        let cfg = preset(name).unwrap();
        for (what, opts, want) in [
            ("tp", PackOptions { tp: Some(2), ..base.clone() }, "--tp"),
            ("draft", PackOptions { draft: Some(Draft { kind: DraftKind::SelfDraft, k: 4 }), ..base.clone() }, "--draft"),
            ("fusion", PackOptions { decode_fusion: true, ..base.clone() }, "--decode-fusion"),
        ] {
            let e = generate(&cfg, &opts, &dir.path().join(format!("{name}-{what}"))).unwrap_err().to_string();
            assert!(e.contains(want), "{name} {what}: {e}");
        }
    }
}

/// The GDN projection's columns as transformers' `fix_query_key_value_ordering` (Qwen3-Next) or
/// the separate projections (Qwen3.5) give them: for each of q|k|v, z, b, a, the source column
/// of every output column, computed by the same view / split / reshape / cat steps.
fn transformers_order(h: &Hybrid) -> [Vec<u64>; 4] {
    let (hk, hv, d) = (h.num_k_heads, h.num_v_heads, 128u64);
    let r = hv / hk;
    if !h.grouped {
        // in_proj_qkv | in_proj_z | in_proj_b | in_proj_a, concatenated in that order.
        let (conv, vd) = ((2 * hk + hv) * d, hv * d);
        return [(0..conv).collect(), (conv..conv + vd).collect(), (conv + vd..conv + vd + hv).collect(), (conv + vd + hv..conv + vd + 2 * hv).collect()];
    }
    // mixed_qkvz.view(hk, 2d + 2rd); split [d, d, rd, rd] along the last dim.
    let gw = 2 * d + 2 * r * d;
    let qkvz: Vec<Vec<u64>> = (0..hk).map(|g| (g * gw..(g + 1) * gw).collect()).collect();
    let part = |rows: &Vec<Vec<u64>>, lo: u64, n: u64| -> Vec<u64> { rows.iter().flat_map(|row| row[lo as usize..(lo + n) as usize].to_vec()).collect() };
    let (q, k, v, z) = (part(&qkvz, 0, d), part(&qkvz, d, d), part(&qkvz, 2 * d, r * d), part(&qkvz, 2 * d + r * d, r * d));
    // in_proj_ba after in_proj_qkvz in the concatenated weight: view(hk, 2r), split [r, r].
    let base = hk * gw;
    let ba: Vec<Vec<u64>> = (0..hk).map(|g| (base + g * 2 * r..base + (g + 1) * 2 * r).collect()).collect();
    let (b, a) = (part(&ba, 0, r), part(&ba, r, r));
    // cat((q, k, v)) over the flattened heads.
    [[q, k, v].concat(), z, b, a]
}

#[test]
fn the_projection_split_matches_transformers_ordering() {
    for (hk, hv) in [(16u64, 32u64), (4, 8), (2, 4), (2, 2), (1, 3)] {
        for grouped in [true, false] {
            let h = Hybrid { num_k_heads: hk, num_v_heads: hv, key_head_dim: 128, value_head_dim: 128, conv_kernel: 4, rotary_dim: 64, partial_rotary_factor: 0.25, grouped };
            let want = transformers_order(&h);
            assert_eq!(want.iter().map(Vec::len).sum::<usize>() as u64, h.proj_dim());
            for (part, cols) in want.iter().enumerate() {
                let got: Vec<u64> = (0..cols.len() as u64).map(|c| gdn::split_source(&h, part, c)).collect();
                assert_eq!(&got, cols, "Hk {hk} Hv {hv} grouped {grouped} part {part}");
            }
            // Every projection column lands in exactly one output.
            let mut all: Vec<u64> = want.concat();
            all.sort_unstable();
            assert_eq!(all, (0..h.proj_dim()).collect::<Vec<_>>());
        }
    }
}

#[test]
fn the_state_size_is_kernels_md_formula() {
    let cfg = preset("qwen3-next-80b-a3b").unwrap();
    assert_eq!((gdn::linear_layers(&cfg), gdn::attn_layers(&cfg)), (36, 12));
    assert_eq!(gdn::bytes_per_seq(&cfg, GdnState::F32), 77_266_944);
    assert_eq!(gdn::bytes_per_seq(&cfg, GdnState::Bf16), 39_518_208);
    // Layer i of Qwen3-Next is GDN layer i - i/4 (KERNELS.md).
    for l in (0..48).filter(|l| (l + 1) % 4 != 0) {
        assert_eq!(gdn::linear_index(&cfg, l), l - l / 4);
    }
    let small = preset("qwen3.5-small").unwrap();
    assert_eq!(gdn::bytes_per_seq(&small, GdnState::F32), 6 * (3 * (2 * 4 + 8) * 128 * 2 + 8 * 128 * 128 * 4));
}

/// A tiny hybrid of `family`: hidden 256, 4 layers (GDN, GDN, attention, GDN... as the interval
/// says), attention heads 2 / 1 of 128, GDN heads 1 / 2, vocab 64.
fn tiny(model_type: &str) -> Config {
    let mut v = serde_json::json!({"model_type": model_type, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 64, "linear_num_key_heads": 1,
        "linear_num_value_heads": 2, "full_attention_interval": 2, "tie_word_embeddings": false});
    if model_type == "qwen3_next" {
        for (k, x) in [("num_experts", 8), ("num_experts_per_tok", 2), ("moe_intermediate_size", 64), ("shared_expert_intermediate_size", 96)] {
            v[k] = x.into();
        }
        v["mlp_only_layers"] = serde_json::json!([1]);
    }
    Config::from_hf(&v).unwrap()
}

#[test]
fn random_checkpoints_of_both_layouts_load_with_every_tensor_used() {
    let dir = tempfile::tempdir().unwrap();
    for t in ["qwen3_5_text", "qwen3_next"] {
        let cfg = tiny(t);
        let w = dir.path().join(format!("{t}-w"));
        kern_packs::random::write(&cfg, 5, &w, u64::MAX, |_, _| {}).unwrap();
        // The config.json written beside the weights reads back as the same config.
        let back = Config::from_file(&w.join("config.json")).unwrap();
        assert_eq!(back, Config { max_position_embeddings: Some(32768), ..cfg.clone() }, "{t}");
        let ckpt = Checkpoint::open(&w).unwrap();
        let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 4, max_context: 256, ..Default::default() };
        let m = load(&generate(&cfg, &opts, &dir.path().join(format!("{t}-p"))).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{t}: {d}"));
        let problems = kern_weights::check(&ckpt, &m.buffers);
        assert!(problems.is_empty(), "{t}: {problems:#?}");
        assert!(kern_weights::unused_tensors(&ckpt, &m.buffers).is_empty(), "{t}: unused {:?}", kern_weights::unused_tensors(&ckpt, &m.buffers));
        let bytes = |name: &str| {
            let b = &m.buffers[m.buffer(name).unwrap_or_else(|| panic!("{name}")).0];
            let mut got = vec![0u8; b.bytes_at_max as usize];
            kern_weights::materialize(&ckpt, b, &mut got).unwrap();
            got
        };
        // The projection weight is the family's tensors concatenated (rows in checkpoint order;
        // gdn_split_proj regroups the GEMM's output).
        let p = "model.layers.0.linear_attn";
        let parts: &[&str] = if t == "qwen3_next" { &["in_proj_qkvz", "in_proj_ba"] } else { &["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"] };
        let want: Vec<u8> = parts.iter().flat_map(|n| ckpt.read_as(&format!("{p}.{n}.weight"), DType::Bf16).unwrap()).collect();
        assert!(bytes(&format!("{p}.in_proj.weight")) == want, "{t}: in_proj");
        // A_log: the bf16 values, as f32.
        assert_eq!(bytes(&format!("{p}.A_log")), ckpt.read_as(&format!("{p}.A_log"), DType::F32).unwrap(), "{t}: A_log");
    }
}
