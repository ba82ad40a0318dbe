//! `kern pack --residual f32` (`PackOptions::residual`): the residual stream `x` / `x_last` is
//! fp32 and every call that touches it uses the `*_f32` entries of `rowwise`; the manifest
//! passes `kern check` against the pack's real cubins with a draft program, tensor parallelism,
//! plain decode attention and PDL (f32 and split decode attention are the defaults);
//! `--residual bf16` has none of them.

use kern_manifest::{load, CheckOptions, DType, Manifest};
use kern_packs::config::preset;
use kern_packs::{generate, DecodeAttention, Draft, DraftKind, PackOptions, Residual};
mod common;
use common::kernels;

/// The kernel entry each call of `program` launches (its op's launches), by call label.
fn entries(m: &Manifest, program: &str, label: &str) -> Vec<String> {
    let p = m.program(program).unwrap();
    let call = p.calls.iter().find(|c| c.label == label).unwrap_or_else(|| panic!("no call {label} in {program}"));
    // (--pdl-small-steps, the default, writes a launch twice: with PDL for small steps, without
    // for large ones; one entry per kernel here)
    let mut e: Vec<String> = m.ops[call.op.0].launches.iter().map(|l| l.entry.clone()).collect();
    e.dedup();
    e
}

fn dtype(m: &Manifest, buf: &str) -> DType {
    m.buffers[m.buffer(buf).unwrap().0].dtype
}

/// A named change to the pack options.
type Variant = (&'static str, fn(&mut PackOptions));

#[test]
fn f32_residual_uses_the_f32_kernels_and_passes_kern_check() {
    let variants: [Variant; 7] = [
        ("default", |_| {}),
        ("decode fusion + layer-skip draft", |o| {
            o.decode_fusion = true;
            o.draft = Some(Draft { kind: DraftKind::LayerSkip(2), k: 3 })
        }),
        ("layer-skip draft", |o| o.draft = Some(Draft { kind: DraftKind::LayerSkip(2), k: 3 })),
        ("tp 2", |o| o.tp = Some(2)),
        // (--pdl with --tp once wrote `"launches": null` into the all_reduce op)
        ("tp 2 + pdl", |o| {
            o.tp = Some(2);
            o.pdl = true
        }),
        ("plain attention + pdl", |o| {
            o.decode_attention = DecodeAttention::Plain;
            o.pdl = true
        }),
        ("self draft", |o| o.draft = Some(Draft { kind: DraftKind::SelfDraft, k: 4 })),
    ];
    for name in ["qwen3-0.6b", "qwen2.5-0.5b"] {
        let cfg = preset(name).unwrap();
        for (what, set) in variants {
            let mut opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 16, max_context: 1024, residual: Residual::F32, ..Default::default() };
            set(&mut opts);
            let out = std::env::temp_dir().join(format!("kern-pack-res32-{}-{name}-{}", std::process::id(), what.replace(' ', "-")));
            let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{name} {what}: {e}"));
            assert_eq!(dtype(&m, "x"), DType::F32, "{name} {what}");
            assert_eq!(dtype(&m, "x_last"), DType::F32, "{name} {what}");
            for bf in ["h", "h_last", "o", "mlp", "mlp_last"] {
                assert_eq!(dtype(&m, bf), DType::Bf16, "{name} {what}: {bf} stays bf16 (a GEMM's input or output)");
            }
            let programs: Vec<&str> = if opts.draft.is_some() { vec!["main", "draft"] } else { vec!["main"] };
            // The fused decode program (`decode_fusion`) runs the norms inside its projection ops
            // (the fused GEMVs for 1..8 rows, the f32 row-wise kernels for larger steps); --tp
            // keeps the unfused program.
            let fused = opts.decode_fusion && opts.tp.is_none();
            let has = |m: &Manifest, prog: &str, label: &str, want: &[&str]| {
                let e = entries(m, prog, label);
                assert!(want.iter().all(|w| e.iter().any(|x| x == w)), "{name} {what} {prog}: {label} runs {e:?}, not all of {want:?}");
            };
            for prog in programs {
                assert_eq!(entries(&m, prog, "embed"), ["embedding_f32"], "{name} {what} {prog}");
                if fused {
                    has(&m, prog, "l0.qkv_proj", &["gemv_bf16_rms", "rms_norm_f32"]);
                    has(&m, prog, "l0.o_proj_gate_up", &["gemv_bf16_add", "add_rms_norm_f32", "gemv_bf16_rms"]);
                    has(&m, prog, "l0.down_proj_qkv", &["gemv_bf16_swiglu_add", "swiglu", "add_rms_norm_f32", "gemv_bf16_rms"]);
                } else {
                    assert_eq!(entries(&m, prog, "l0.input_norm"), ["rms_norm_f32"], "{name} {what} {prog}");
                    assert_eq!(entries(&m, prog, "l0.post_attention_norm"), ["add_rms_norm_f32"], "{name} {what} {prog}");
                    assert_eq!(entries(&m, prog, "l1.input_norm"), ["add_rms_norm_f32"], "{name} {what} {prog}");
                }
                assert_eq!(entries(&m, prog, "gather.residual"), ["gather_last_f32"], "{name} {what} {prog}");
                assert_eq!(entries(&m, prog, "gather.mlp"), ["gather_last"], "{name} {what} {prog}: the MLP output is bf16");
                assert_eq!(entries(&m, prog, "final_norm"), ["add_rms_norm_f32"], "{name} {what} {prog}");
            }
            let _ = std::fs::remove_dir_all(&out);
        }
        // `--residual bf16`: the transformers-shaped manifest, no f32 entry anywhere.
        let out = std::env::temp_dir().join(format!("kern-pack-res16-{}-{name}", std::process::id()));
        let opts = PackOptions { kernels: kernels(), max_tokens: 128, max_seqs: 16, max_context: 1024, residual: Residual::Bf16, ..Default::default() };
        let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap();
        assert_eq!(dtype(&m, "x"), DType::Bf16);
        assert!(m.ops.iter().flat_map(|o| &o.launches).all(|l| !l.entry.ends_with("_f32")), "{name}: no f32 entry with bf16");
        assert!(m.op("gather_last_f32").is_none());
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn residual_names_parse_and_print() {
    assert_eq!(PackOptions::default().residual, Residual::F32, "the default");
    assert_eq!("f32".parse::<Residual>(), Ok(Residual::F32));
    assert_eq!("bf16".parse::<Residual>(), Ok(Residual::Bf16));
    let e = "fp16".parse::<Residual>().unwrap_err();
    assert!(e.contains("unknown residual dtype `fp16`") && e.contains("f32"), "{e}");
    assert_eq!(Residual::F32.to_string(), "f32");
}
