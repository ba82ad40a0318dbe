//! Issue 15: the fused decode program (`PackOptions::decode_fusion`, off by default;
//! kern_packs::fused). Steps of at most 8 tokens launch the fused GEMVs — 7 kernels per
//! layer instead of 10 — and larger steps launch exactly the unfused program's kernels, in the
//! same order; the fused ops replace the per-projection ones; `--decode-fusion off`,
//! `--residual bf16` and `--tp` write the unfused program; every variant passes `kern check`
//! against the pack's real cubins.

use kern_manifest::{load, CheckOptions, Manifest};
use kern_packs::config::preset;
use kern_packs::fused::FUSED_MAX_TOKENS;
use kern_packs::{generate, DecodeAttention, Draft, DraftKind, PackOptions, PrefillAttention, Residual};
mod common;
use common::kernels;

const FUSED_OPS: [&str; 4] = ["norm_qkv_proj", "o_proj_norm_gate_up", "down_proj_norm_qkv", "swiglu_down_proj"];
const UNFUSED_OPS: [&str; 7] = ["rms_norm", "add_rms_norm", "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "swiglu"];

/// The entries a program launches at (tokens, seqs), in order (launches with a grid > 0).
fn live(m: &Manifest, program: &str, tokens: i64, seqs: i64) -> Vec<String> {
    let mut v = m.vars_at_max();
    v[m.var("tokens").unwrap().0] = tokens;
    v[m.var("seqs").unwrap().0] = seqs;
    let p = m.program(program).unwrap();
    p.calls
        .iter()
        .flat_map(|c| &m.ops[c.op.0].launches)
        .filter(|l| l.grid.iter().all(|g| g.eval(&v).unwrap() > 0))
        .map(|l| l.entry.clone())
        .collect()
}

fn pack(name: &str, what: &str, o: &PackOptions) -> Manifest {
    let out = std::env::temp_dir().join(format!("kern-pack-fused-{}-{name}-{}", std::process::id(), what.replace(' ', "-")));
    let m = load(&generate(&preset(name).unwrap(), o, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name} {what}: {d}"));
    let _ = std::fs::remove_dir_all(&out);
    m
}

/// The unfused launch sequence of a step of at most 8 tokens with each fused group replaced by
/// its fused GEMVs: what the fused program must launch.
fn fuse(unfused: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    let at = |i: usize, e: &str| unfused.get(i).is_some_and(|x| x == e);
    while i < unfused.len() {
        if at(i, "rms_norm_f32") && at(i + 1, "gemv_bf16") {
            out.push("gemv_bf16_rms".into()); // input norm + QKV
            i += 2;
        } else if at(i, "gemv_bf16") && at(i + 1, "add_rms_norm_f32") && at(i + 2, "gemv_bf16") {
            out.extend(["gemv_bf16_add".into(), "gemv_bf16_rms".into()]); // O + add + norm + gate-up
            i += 3;
        } else if at(i, "swiglu") && at(i + 1, "gemv_bf16") && at(i + 2, "add_rms_norm_f32") && at(i + 3, "gemv_bf16") {
            out.extend(["gemv_bf16_swiglu_add".into(), "gemv_bf16_rms".into()]); // SwiGLU + down + add + next norm + QKV
            i += 4;
        } else if at(i, "swiglu") && at(i + 1, "gemv_bf16") {
            out.push("gemv_bf16_swiglu".into()); // the last layer's SwiGLU + down
            i += 2;
        } else {
            out.push(unfused[i].clone());
            i += 1;
        }
    }
    out
}

#[test]
fn fused_program_launches_the_fused_gemvs_up_to_8_tokens_and_the_unfused_kernels_above() {
    for name in ["qwen3-0.6b", "qwen2.5-0.5b"] {
        let cfg = preset(name).unwrap();
        let layers = cfg.num_hidden_layers as usize;
        let base = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, max_context: 1024, decode_fusion: true, ..Default::default() };
        let fused = pack(name, "fused", &base);
        let unfused = pack(name, "unfused", &PackOptions { decode_fusion: false, ..base.clone() });
        for op in FUSED_OPS {
            assert!(fused.op(op).is_some() && unfused.op(op).is_none(), "{name}: {op}");
        }
        for op in UNFUSED_OPS {
            assert!(fused.op(op).is_none() && unfused.op(op).is_some(), "{name}: {op}");
        }
        // Decode and verify steps (tokens <= seqs) and prefill / mixed steps of every size.
        for (tokens, seqs) in [(1, 1), (2, 2), (5, 3), (8, 8), (8, 1), (9, 9), (16, 4), (17, 17), (33, 40), (64, 64), (65, 2), (256, 1)] {
            let (f, u) = (live(&fused, "main", tokens, seqs), live(&unfused, "main", tokens, seqs));
            if tokens as u64 <= FUSED_MAX_TOKENS {
                assert_eq!(f, fuse(&u), "{name}: tokens {tokens} seqs {seqs}");
                assert_eq!(u.len() - f.len(), 3 * layers, "{name}: three launches fewer per layer");
                assert!(!f.iter().any(|e| e == "gemv_bf16" || e == "swiglu" || e == "rms_norm_f32"), "{name}: tokens {tokens}: {f:?}");
                assert_eq!(f.iter().filter(|e| *e == "add_rms_norm_f32").count(), 1, "{name}: tokens {tokens}: only the final norm is row-wise: {f:?}");
            } else {
                assert_eq!(f, u, "{name}: tokens {tokens} seqs {seqs}: the unfused kernels, in order");
            }
        }
        // Batch 1, per layer: RoPE, the two split-attention kernels and 4 fused GEMVs (this
        // layer's O, gate-up and down, the next layer's QKV; layer 0's QKV and the last layer's
        // down are the ends) — 7 launches instead of 10.
        let f1 = live(&fused, "main", 1, 1);
        let per_layer = f1.iter().filter(|e| e.starts_with("gemv_bf16_") && e.as_str() != "gemv_bf16_f32out").count();
        assert_eq!(per_layer, 4 * layers, "{name}: 4 fused GEMVs per layer at batch 1: {f1:?}");
        // The fused GEMVs run gemv_bf16's grid (ceil(N/16) CTAs of 256 threads).
        let mut v = fused.vars_at_max();
        v[fused.var("tokens").unwrap().0] = 1;
        for l in fused.ops.iter().flat_map(|o| &o.launches).filter(|l| l.entry.starts_with("gemv_bf16_") && !l.entry.ends_with("f32out")) {
            // (..., M, N, K) and gemv_bf16_rms (..., M, N, K, eps)
            let n = match l.args[l.args.len() - if l.entry == "gemv_bf16_rms" { 3 } else { 2 }] {
                kern_manifest::LaunchArg::Const(kern_manifest::Value::I32(n)) => n as i64,
                ref a => panic!("{name} {}: N is {a:?}", l.entry),
            };
            assert_eq!(l.grid[0].eval(&v).unwrap(), (n + 15) / 16, "{name} {}", l.entry);
            assert_eq!(l.block[0].eval(&v).unwrap(), 256, "{name} {}", l.entry);
        }
    }
}

#[test]
fn fused_program_variants_pass_kern_check_and_unfusable_ones_stay_unfused() {
    let base = || PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 16, max_context: 1024, decode_fusion: true, ..Default::default() };
    type Variant = (&'static str, fn(&mut PackOptions), bool);
    let variants: [Variant; 10] = [
        ("decode fusion on", |_| {}, true),
        ("off (the default)", |o| o.decode_fusion = PackOptions::default().decode_fusion, false),
        ("pdl", |o| o.pdl = true, true),
        ("plain attention, simt prefill", |o| {
            o.decode_attention = DecodeAttention::Plain;
            o.prefill_attention = PrefillAttention::Simt
        }, true),
        ("self draft", |o| o.draft = Some(Draft { kind: DraftKind::SelfDraft, k: 4 }), true),
        ("layer-skip draft", |o| o.draft = Some(Draft { kind: DraftKind::LayerSkip(3), k: 2 }), true),
        ("8 tokens at most", |o| {
            o.max_tokens = 8;
            o.max_seqs = 8
        }, true),
        ("bf16 residual", |o| o.residual = Residual::Bf16, false),
        ("tp 2", |o| o.tp = Some(2), false),
        ("tp 1", |o| o.tp = Some(1), false),
    ];
    for name in ["qwen3-0.6b", "qwen2.5-0.5b"] {
        for (what, set, want_fused) in variants {
            let mut o = base();
            set(&mut o);
            let m = pack(name, what, &o);
            assert_eq!(m.op("o_proj_norm_gate_up").is_some(), want_fused, "{name} {what}");
            assert_eq!(m.op("o_proj").is_some(), !want_fused, "{name} {what}");
            if o.pdl {
                assert!(m.ops.iter().flat_map(|op| &op.launches).all(|l| l.pdl), "{name} {what}: every launch pdl");
            }
            if let Some(d) = o.draft {
                // The draft's last layer ends with the unfused-add down projection, as the
                // target's: its residual add is the final norm's.
                let p = m.program("draft").unwrap();
                let last = d.layers(preset(name).unwrap().num_hidden_layers) - 1;
                let call = p.calls.iter().find(|c| c.label == format!("l{last}.down_proj")).unwrap_or_else(|| panic!("{name} {what}: no l{last}.down_proj"));
                assert_eq!(m.ops[call.op.0].name, "swiglu_down_proj", "{name} {what}");
                let live = live(&m, "draft", 1, 1);
                assert_eq!(live.iter().filter(|e| e.as_str() == "gemv_bf16_swiglu").count(), 1, "{name} {what}: {live:?}");
            }
            if what == "8 tokens at most" {
                assert!(!m.ops.iter().flat_map(|op| &op.launches).any(|l| l.entry == "gemv_bf16"), "{name}: no plain GEMV left");
            }
        }
    }
}
