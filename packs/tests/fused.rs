//! Issue 15: the fused decode program (`PackOptions::decode_fusion`, off by default;
//! kern_packs::fused). Steps of at most 8 tokens launch the fused GEMVs — 7 kernels per
//! layer instead of 10 — and larger steps launch exactly the unfused program's kernels, in the
//! same order; the fused ops replace the per-projection ones; `--decode-fusion off`,
//! `--residual bf16` and `--tp` write the unfused program; every variant passes `kern check`
//! against the pack's real cubins.

use kern_manifest::{load, CheckOptions, Manifest};
use kern_packs::config::preset;
use kern_packs::fused::{FUSED_MAX_TOKENS, POSTNORM_MAX_CTAS, SANDWICH_FUSED_MAX_TOKENS};
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
        .filter(|l| l.runs(&v).unwrap())
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

// ---- Sandwich-norm blocks (issue 24: Gemma 3's four (1 + w) norms, GeGLU-tanh).

const SANDWICH_OPS: [&str; 6] = ["norm_qkv_proj", "o_proj", "postnorm_gate_up_proj", "geglu_down_proj", "postnorm_qkv_proj", "post_norm"];
const SANDWICH_UNUSED: [&str; 6] = ["rms_norm", "add_rms_norm", "qkv_proj", "gate_up_proj", "down_proj", "geglu_tanh"];

/// The unfused Gemma launch sequence of a step of `tokens` tokens with each group the fused
/// sandwich program replaces: what it must launch. Up to SANDWICH_FUSED_MAX_TOKENS tokens the
/// post-norm + add-norm + GEMV triples become `gemv_bf16_postnorm_rms` where that GEMV's grid is one
/// wave (`fuse_gu`: the gate-up's; `fuse_qkv`: the next QKV's), the GeGLU + down pair
/// `gemv_bf16_geglu`; every other post-norm + add-norm pair becomes `postnorm_add_rms_norm_f32_off`;
/// up to 8 tokens layer 0's norm + QKV is `gemv_bf16_rms_off`.
fn fuse_sandwich(unfused: &[String], tokens: i64, fuse_gu: bool, fuse_qkv: bool) -> Vec<String> {
    let small = tokens as u64 <= SANDWICH_FUSED_MAX_TOKENS;
    let mut out: Vec<String> = Vec::new();
    let (mut i, mut pairs) = (0, 0);
    let at = |i: usize, e: &str| unfused.get(i).is_some_and(|x| x == e);
    while i < unfused.len() {
        if tokens as u64 <= FUSED_MAX_TOKENS && at(i, "rms_norm_f32_off") && at(i + 1, "gemv_bf16") {
            out.push("gemv_bf16_rms_off".into()); // layer 0's input norm + QKV
            i += 2;
        } else if at(i, "rms_norm_off") && at(i + 1, "add_rms_norm_f32_off") {
            let fuse = if pairs % 2 == 0 { fuse_gu } else { fuse_qkv }; // gate-up, next QKV, gate-up, ...
            pairs += 1;
            if small && fuse && at(i + 2, "gemv_bf16") {
                out.push("gemv_bf16_postnorm_rms".into());
                i += 3;
            } else {
                out.push("postnorm_add_rms_norm_f32_off".into());
                i += 2;
            }
        } else if small && at(i, "geglu_tanh") && at(i + 1, "gemv_bf16") {
            out.push("gemv_bf16_geglu".into()); // GeGLU + down
            i += 2;
        } else {
            out.push(unfused[i].clone());
            i += 1;
        }
    }
    out
}

fn pack_cfg(cfg: &kern_packs::config::Config, what: &str, o: &PackOptions) -> Manifest {
    let out = std::env::temp_dir().join(format!("kern-pack-fused-{}-{}-{}", std::process::id(), cfg.model_type, what.replace(' ', "-")));
    let m = load(&generate(cfg, o, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{what}: {d}"));
    let _ = std::fs::remove_dir_all(&out);
    m
}

/// The residual buffers of a program's calls: the sandwich prologue ops read x_in (arg 1) and
/// write x_out (arg 3), never the same buffer, each reading what the one before wrote, starting
/// from the embedding's `x`; the final gather reads the last one.
fn check_residual_ping_pong(m: &Manifest, program: &str, what: &str) {
    let name = |b: &kern_manifest::Binding| match b {
        kern_manifest::Binding::Buf(id) => m.buffers[id.0].name.clone(),
        other => panic!("{what}: {other:?}"),
    };
    let p = m.program(program).unwrap();
    let mut cur = "x".to_string();
    let mut n = 0;
    for c in &p.calls {
        let op = &m.ops[c.op.0].name;
        if op.starts_with("postnorm_") {
            let (xin, xout) = (name(&c.args[1]), name(&c.args[3]));
            assert_eq!(xin, cur, "{what} {}: reads the residual the previous half wrote", c.label);
            assert_ne!(xin, xout, "{what} {}: x_out must be another buffer than x_in", c.label);
            cur = xout;
            n += 1;
        }
        if c.label == "gather.residual" {
            assert_eq!(name(&c.args[1]), cur, "{what}: the final norm gathers the last residual");
        }
    }
    assert!(n > 0, "{what}: no sandwich prologue op");
}

#[test]
fn fused_sandwich_program_launches_the_fused_gemvs_up_to_8_tokens_and_the_unfused_kernels_above() {
    for name in ["gemma-3-270m", "gemma-3-4b"] {
        let cfg = preset(name).unwrap();
        let layers = cfg.num_hidden_layers as usize;
        let base = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, max_context: 1024, decode_fusion: true, ..Default::default() };
        let fused = pack(name, "fused", &base);
        let unfused = pack(name, "unfused", &PackOptions { decode_fusion: false, ..base.clone() });
        for op in SANDWICH_OPS {
            assert!(fused.op(op).is_some(), "{name}: fused has {op}");
        }
        for op in SANDWICH_UNUSED {
            assert!(fused.op(op).is_none() && unfused.op(op).is_some(), "{name}: {op}");
        }
        assert!(fused.buffer("x2").is_some() && unfused.buffer("x2").is_none(), "{name}: the second residual buffer");
        check_residual_ping_pong(&fused, "main", name);
        // The prologue GEMV is fused where its grid is one wave (270M's gate-up and QKV, 4B's QKV).
        let one_wave = |n: u64| n.div_ceil(16) <= POSTNORM_MAX_CTAS;
        let (fuse_gu, fuse_qkv) = (one_wave(2 * cfg.intermediate_size), one_wave((cfg.num_attention_heads + 2 * cfg.kv_heads()) * cfg.head_dim()));
        assert_eq!((fuse_gu, fuse_qkv), (name == "gemma-3-270m", true), "{name}");
        for (tokens, seqs) in [(1, 1), (2, 2), (5, 3), (8, 8), (8, 1), (9, 9), (16, 4), (17, 17), (33, 40), (64, 64), (65, 2), (256, 1)] {
            let (f, u) = (live(&fused, "main", tokens, seqs), live(&unfused, "main", tokens, seqs));
            assert_eq!(f, fuse_sandwich(&u, tokens, fuse_gu, fuse_qkv), "{name}: tokens {tokens} seqs {seqs}");
            if tokens as u64 <= SANDWICH_FUSED_MAX_TOKENS {
                // layer 0's norm; per layer the post-attention pair (+ gate-up when fused) and GeGLU;
                // per layer but the last the post-feedforward pair (+ QKV when fused)
                let want = 1 + layers * (2 + usize::from(fuse_gu)) + (layers - 1) * (1 + usize::from(fuse_qkv));
                assert_eq!(u.len() - f.len(), want, "{name}: tokens {tokens}");
                for gone in ["rms_norm_f32_off", "add_rms_norm_f32_off", "geglu_tanh"] {
                    let want = usize::from(gone == "add_rms_norm_f32_off"); // the final norm
                    assert_eq!(f.iter().filter(|e| *e == gone).count(), want, "{name}: tokens {tokens}: {gone}: {f:?}");
                }
                assert_eq!(f.iter().filter(|e| *e == "rms_norm_off").count(), 1, "{name}: only the last layer's post-feedforward norm is row-wise");
            } else {
                assert_eq!(f.iter().filter(|e| *e == "postnorm_add_rms_norm_f32_off").count(), 2 * layers - 1, "{name}: tokens {tokens}");
                assert_eq!(u.len() - f.len(), 2 * layers - 1 + usize::from(tokens as u64 <= FUSED_MAX_TOKENS), "{name}: tokens {tokens}");
            }
        }
        // Batch 1, per layer: the next QKV, RoPE, the two split-attention kernels, O, gate-up (with
        // the row-wise post-norm pair where the gate-up GEMV is more than a wave), GeGLU + down —
        // 7 or 8 launches instead of 12.
        let (f1, u1) = (live(&fused, "main", 1, 1), live(&unfused, "main", 1, 1));
        let per = |v: &[String], e: &str| v.iter().filter(|x| *x == e).count();
        let fused_postnorm = layers * usize::from(fuse_gu) + (layers - 1) * usize::from(fuse_qkv);
        assert_eq!(per(&f1, "gemv_bf16_postnorm_rms"), fused_postnorm, "{name}");
        assert_eq!(per(&f1, "postnorm_add_rms_norm_f32_off"), 2 * layers - 1 - fused_postnorm, "{name}");
        assert_eq!(per(&f1, "gemv_bf16_geglu"), layers, "{name}");
        assert_eq!(per(&f1, "gemv_bf16"), layers + 2 * layers - 1 - fused_postnorm, "{name}: the O projections and the unfused prologues' GEMVs");
        let layer = |v: &[String]| (v.len() - per(v, "embedding_f32") - 5) as f64 / layers as f64; // minus embedding, gathers, final norm, LM head, sample
        let want = if fuse_gu { 7.1 } else { 8.1 };
        assert!(layer(&u1) >= 11.9 && layer(&f1) <= want, "{name}: launches per layer {} -> {}: {f1:?}", layer(&u1), layer(&f1));
        // The fused GEMVs run gemv_bf16's grid (ceil(N/16) CTAs of 256 threads).
        let mut v = fused.vars_at_max();
        v[fused.var("tokens").unwrap().0] = 1;
        for l in fused.ops.iter().flat_map(|o| &o.launches).filter(|l| l.entry.starts_with("gemv_bf16_") && !l.entry.ends_with("f32out")) {
            // N: (..., M, N, K), (..., M, N, K, eps, off), (..., M, N, K, eps)
            let back = match l.entry.as_str() {
                "gemv_bf16_rms_off" | "gemv_bf16_postnorm_rms" => 4,
                "gemv_bf16_rms" => 3,
                _ => 2,
            };
            let n = match l.args[l.args.len() - back] {
                kern_manifest::LaunchArg::Const(kern_manifest::Value::I32(n)) => n as i64,
                ref a => panic!("{name} {}: N is {a:?}", l.entry),
            };
            assert_eq!(l.grid[0].eval(&v).unwrap(), (n + 15) / 16, "{name} {}", l.entry);
            assert_eq!(l.block[0].eval(&v).unwrap(), 256, "{name} {}", l.entry);
        }
    }
}

#[test]
fn fused_sandwich_variants_pass_kern_check_and_unfusable_ones_stay_unfused() {
    let base = || PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 16, max_context: 1024, decode_fusion: true, ..Default::default() };
    type Variant = (&'static str, fn(&mut PackOptions), bool);
    let variants: [Variant; 8] = [
        ("decode fusion on", |_| {}, true),
        ("off (the default)", |o| o.decode_fusion = PackOptions::default().decode_fusion, false),
        ("pdl", |o| o.pdl = true, true),
        ("plain attention", |o| o.decode_attention = DecodeAttention::Plain, true),
        ("self draft", |o| o.draft = Some(Draft { kind: DraftKind::SelfDraft, k: 4 }), true),
        ("layer-skip draft", |o| o.draft = Some(Draft { kind: DraftKind::LayerSkip(3), k: 2 }), true),
        ("8 tokens at most", |o| {
            o.max_tokens = 8;
            o.max_seqs = 8
        }, true),
        ("bf16 residual", |o| o.residual = Residual::Bf16, false),
    ];
    for name in ["gemma-3-270m", "gemma-3-1b"] {
        for (what, set, want_fused) in variants {
            let mut o = base();
            set(&mut o);
            let m = pack(name, what, &o);
            assert_eq!(m.op("postnorm_gate_up_proj").is_some(), want_fused, "{name} {what}");
            assert_eq!(m.op("add_rms_norm").is_some(), !want_fused, "{name} {what}");
            if want_fused {
                check_residual_ping_pong(&m, "main", &format!("{name} {what}"));
            }
            if o.pdl {
                assert!(m.ops.iter().flat_map(|op| &op.launches).all(|l| l.pdl), "{name} {what}: every launch pdl");
            }
            if let Some(d) = o.draft {
                // The draft's layers ping-pong too; its last layer ends with the GeGLU down
                // projection and the post-feedforward norm, whose residual add is the final norm's.
                check_residual_ping_pong(&m, "draft", &format!("{name} {what} (draft)"));
                let p = m.program("draft").unwrap();
                let last = d.layers(preset(name).unwrap().num_hidden_layers) - 1;
                let call = p.calls.iter().find(|c| c.label == format!("l{last}.down_proj")).unwrap_or_else(|| panic!("{name} {what}: no l{last}.down_proj"));
                assert_eq!(m.ops[call.op.0].name, "geglu_down_proj", "{name} {what}");
                let live = live(&m, "draft", 1, 1);
                assert_eq!(live.iter().filter(|e| e.as_str() == "gemv_bf16_geglu").count(), d.layers(preset(name).unwrap().num_hidden_layers) as usize, "{name} {what}: {live:?}");
            }
            if what == "8 tokens at most" {
                let entries: Vec<&str> = m.ops.iter().flat_map(|op| &op.launches).map(|l| l.entry.as_str()).collect();
                assert!(entries.contains(&"gemv_bf16_geglu") && entries.contains(&"gemv_bf16_postnorm_rms"), "{name}: {entries:?}");
                assert!(!entries.iter().any(|e| e.starts_with("gemm_")), "{name}: no GEMM of more than 8 rows: {entries:?}");
            }
        }
    }
}

#[test]
fn fused_program_of_other_blocks_picks_entries_from_the_config() {
    let o = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 8, max_context: 512, decode_fusion: true, ..Default::default() };
    let entries = |m: &Manifest| -> Vec<String> { live(m, "main", 1, 1) };
    // Two (1 + w) norms per block and GeGLU (Gemma 3 without its sandwich norms): the Qwen-shaped
    // ops with the _off norms and the GeGLU down GEMVs.
    let mut c = preset("gemma-3-270m").unwrap();
    c.sandwich_norms = false;
    let m = pack_cfg(&c, "two-off-norms-geglu", &o);
    let e = entries(&m);
    for want in ["gemv_bf16_rms_off", "gemv_bf16_add", "gemv_bf16_geglu_add", "gemv_bf16_geglu"] {
        assert!(e.iter().any(|x| x == want), "{want}: {e:?}");
    }
    assert!(m.op("geglu_down_proj").is_some() && m.op("o_proj_norm_gate_up").is_some() && m.buffer("x2").is_none());
    let large = live(&m, "main", 9, 9);
    assert!(large.iter().any(|x| x == "add_rms_norm_f32_off") && large.iter().any(|x| x == "geglu_tanh"), "{large:?}");
    // Qwen's block with GeGLU: w · bf16(x̂) norms, GeGLU down GEMVs.
    let mut c = preset("qwen3-0.6b").unwrap();
    c.activation = kern_packs::config::Activation::GeluTanh;
    let e = entries(&pack_cfg(&c, "qwen-geglu", &o));
    assert!(e.iter().any(|x| x == "gemv_bf16_rms") && e.iter().any(|x| x == "gemv_bf16_geglu_add"), "{e:?}");
    // Refused: four norms per block with w · bf16(x̂) norms (the sandwich GEMV has the (off + w) form only).
    let mut c = preset("gemma-3-270m").unwrap();
    c.norm = kern_packs::config::NormKind::Scale;
    let out = std::env::temp_dir().join(format!("kern-pack-fused-{}-refused", std::process::id()));
    let err = generate(&c, &o, &out).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&out);
    assert!(err.contains("four norms per block") && err.contains("--decode-fusion off"), "{err}");
}
