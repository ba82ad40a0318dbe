//! Issue 15: `kern pack --pdl` (`PackOptions::pdl`) makes every launch a Programmatic Dependent
//! Launch: the GEMM modules as they are (their kernels wait after the weight prefetch), every
//! other module from its `.pdl` build (each kernel waits first: packs/kernels/build.sh,
//! KERN_PDL_WAIT); the manifest passes `kern check` against those cubins; without it and
//! without `--pdl-small-steps` (on by default: every launch of a step of at most 8 tokens) a
//! manifest has neither.

use kern_manifest::{load, CheckOptions};
use kern_packs::config::preset;
use kern_packs::{generate, DecodeAttention, PackOptions};
mod common;
use common::kernels;

#[test]
fn pdl_launches_everything_from_the_waiting_builds() {
    let cfg = preset("qwen3-0.6b").unwrap();
    for (pdl, decode_attention) in [(false, DecodeAttention::Plain), (true, DecodeAttention::Plain), (true, DecodeAttention::Split)] {
        let out = std::env::temp_dir().join(format!("kern-pack-pdl-{}-{pdl}-{decode_attention:?}", std::process::id()));
        // (pdl false: no PDL at all, so without --pdl-small-steps, the default)
        let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, pdl, pdl_small_steps: false, decode_attention, ..Default::default() };
        let path = generate(&cfg, &opts, &out).unwrap();
        let m = load(&path, &CheckOptions::default()).unwrap_or_else(|e| panic!("pdl {pdl}: {e}"));
        let launches: Vec<_> = m.ops.iter().flat_map(|o| &o.launches).collect();
        assert!(launches.len() > 20);
        assert!(launches.iter().all(|l| l.pdl == pdl), "every launch pdl = {pdl}");
        for module in &m.modules {
            let file = module.path.file_name().unwrap().to_str().unwrap();
            let want = if pdl && !module.name.starts_with("gemm_") { format!("{}.pdl.sm_90a.cubin", module.name) } else { format!("{}.sm_90a.cubin", module.name) };
            assert_eq!(file, want, "module {}", module.name);
        }
        // The .pdl builds differ from the plain ones by the wait only: same kernels, same
        // parameters (kern check matched every launch against them above).
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// `kern pack --pdl-small-steps on`: a step of at most 8 tokens launches every kernel with PDL,
/// a larger one none (the GEMMs of 9+ rows and the plain copies of the other launches) but the
/// LM head's GEMV when it has at most 8 sequences; the
/// non-GEMM modules come from their `.pdl` builds; it passes `kern check` with the fused program
/// and with steps that never exceed 8 tokens; every step launches the same kernels, in the same
/// order, as without the option.
#[test]
fn pdl_small_steps_marks_every_launch_of_small_steps_only() {
    use kern_packs::manifest::PDL_SMALL_TOKENS;
    let cfg = preset("qwen3-0.6b").unwrap();
    // (fused program, max tokens)
    for (decode_fusion, max_tokens) in [(false, 256), (true, 256), (false, 8)] {
        let out = std::env::temp_dir().join(format!("kern-pack-pdl-small-{}-{decode_fusion}-{max_tokens}", std::process::id()));
        let base = PackOptions { kernels: kernels(), max_tokens, max_seqs: 64.min(max_tokens), decode_fusion, ..Default::default() };
        let plain = load(&generate(&cfg, &base, &out.join("plain")).unwrap(), &CheckOptions::default()).unwrap();
        let opts = PackOptions { pdl_small_steps: true, ..base };
        let m = load(&generate(&cfg, &opts, &out.join("small")).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("pdl-small-steps: {e}"));
        for module in &m.modules {
            let file = module.path.file_name().unwrap().to_str().unwrap();
            let want = if module.name.starts_with("gemm_") { format!("{}.sm_90a.cubin", module.name) } else { format!("{}.pdl.sm_90a.cubin", module.name) };
            assert_eq!(file, want, "module {}", module.name);
        }
        // The launches that run at (tokens, seqs), in program order: (entry, pdl).
        let live = |m: &kern_manifest::Manifest, tokens: i64, seqs: i64| -> Vec<(String, bool)> {
            let mut v = m.vars_at_max();
            v[m.var("tokens").unwrap().0] = tokens;
            v[m.var("seqs").unwrap().0] = seqs;
            m.programs[0].calls.iter().flat_map(|c| &m.ops[c.op.0].launches).filter(|l| l.runs(&v).unwrap()).map(|l| (l.entry.clone(), l.pdl)).collect()
        };
        for (tokens, seqs) in [(1, 1), (3, 2), (8, 8), (8, 1), (9, 9), (17, 3), (64, 64), (256, 1)] {
            if tokens > max_tokens as i64 || seqs > (64.min(max_tokens)) as i64 {
                continue;
            }
            let (got, want) = (live(&m, tokens, seqs), live(&plain, tokens, seqs));
            let entries = |x: &[(String, bool)]| x.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>();
            assert_eq!(entries(&got), entries(&want), "tokens {tokens} seqs {seqs}: the same kernels in the same order");
            // Above 8 tokens only the LM head's GEMV (its rows are the step's sequences, at most 8
            // here) keeps the attribute.
            let small = tokens as u64 <= PDL_SMALL_TOKENS;
            assert!(got.iter().all(|(e, pdl)| *pdl == (small || e == "gemv_bf16_f32out")), "tokens {tokens}: pdl must be {small} for every launch: {got:?}");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}
