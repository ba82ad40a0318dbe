//! Issue 15: `--decode-attention split` (`PackOptions::decode_attention`). The attention op gets
//! the split-KV kernels (module `attention_decode`) for steps whose rows are all one token
//! (`tokens <= seqs`) beside `attention_dD` for the others; the manifest passes `kern check`
//! against the pack's real cubins (draft programs included); the scratch holds every decode
//! step's partial results; shapes the kernel cannot take are refused; split is the default and
//! `plain` has none of it.

use kern_manifest::{load, CheckOptions, LaunchArg, Manifest, Value as Scalar};
use kern_packs::config::preset;
use kern_packs::manifest::{check_split_decode, decode_max_chunks, decode_scratch_floats, decode_splits, DECODE_MIN_CHUNK};
use kern_packs::{generate, DecodeAttention, Draft, DraftKind, PackOptions, PrefillAttention};
mod common;
use common::kernels;

fn vars(m: &Manifest, tokens: i64, seqs: i64) -> Vec<i64> {
    let mut v = m.vars_at_max();
    v[m.var("tokens").unwrap().0] = tokens;
    v[m.var("seqs").unwrap().0] = seqs;
    v
}

/// The entries of `op` whose grid is positive at (tokens, seqs): the ones that run.
fn live(m: &Manifest, op: &str, tokens: i64, seqs: i64) -> Vec<String> {
    let v = vars(m, tokens, seqs);
    m.ops[m.op(op).unwrap().0].launches.iter().filter(|l| l.runs(&v).unwrap()).map(|l| l.entry.clone()).collect()
}

fn split_opts(max_tokens: u64, max_seqs: u64) -> PackOptions {
    // Prefill-shaped steps on attention_dD (`--prefill-attention simt`), so each step size shows
    // which decode kernel it takes; tests/prefill_attention.rs covers the tc prefill kernel.
    PackOptions { kernels: kernels(), max_tokens, max_seqs, max_context: 4096, decode_attention: DecodeAttention::Split, prefill_attention: PrefillAttention::Simt, ..Default::default() }
}

#[test]
fn split_decode_attention_passes_kern_check_and_runs_for_one_token_steps_only() {
    for (name, max_tokens, max_seqs) in [("qwen3-0.6b", 256, 64), ("qwen3-4b", 512, 64), ("qwen2.5-0.5b", 64, 256)] {
        let cfg = preset(name).unwrap();
        let (hq, hkv, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        let out = std::env::temp_dir().join(format!("kern-pack-split-{}-{name}", std::process::id()));
        let m = load(&generate(&cfg, &split_opts(max_tokens, max_seqs), &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (plain, split, combine) = (format!("attention_d{d}"), format!("attention_decode_d{d}"), format!("attention_combine_d{d}"));
        let (mt, ms) = (max_tokens as i64, max_seqs as i64);
        // Decode and verify steps (every row one token, tokens == seqs at their buckets; tokens
        // < seqs only when more sequences are padded): the split kernels. Prefill: attention_dD.
        for seqs in [1, 2, 3, 4, 8, 33, 64, ms] {
            for tokens in [1, seqs / 2, seqs - 1, seqs] {
                if (1..=mt).contains(&tokens) {
                    assert_eq!(live(&m, "attention", tokens, seqs), [split.clone(), combine.clone()], "{name}: tokens {tokens} seqs {seqs}");
                }
            }
        }
        for (tokens, seqs) in [(2, 1), (mt, 1), (mt, ms.min(mt - 1)), (17, 16)] {
            assert_eq!(live(&m, "attention", tokens, seqs), std::slice::from_ref(&plain), "{name}: tokens {tokens} seqs {seqs}");
        }
        let op = &m.ops[m.op("attention").unwrap().0];
        let launch = op.launches.iter().find(|l| l.entry == split).unwrap();
        // The chunking's constants: min_chunk, then max_chunks (a constant of the model, never of
        // the step: batch invariance), then the layer's sliding window (a call argument).
        let n = launch.args.len();
        assert_eq!(launch.args[n - 3], LaunchArg::Const(Scalar::I32(DECODE_MIN_CHUNK as i32)), "{name}");
        let max_chunks = decode_max_chunks(hkv);
        assert_eq!(launch.args[n - 2], LaunchArg::Const(Scalar::I32(max_chunks as i32)), "{name}");
        assert!(matches!(launch.args[n - 1], LaunchArg::Param(_)), "{name}: the window comes from the call");
        assert!((1..=128).contains(&max_chunks), "{name}: the kernel takes 1 to 128 chunks, not {max_chunks}");
        // The grid's z is the documented rule (never above max_chunks: no idle CTAs), and the
        // scratch holds every decode step's header and max_chunks records per (token, head).
        let scratch = &m.buffers[m.buffer("attn_partial").unwrap().0];
        let floats = scratch.bytes_at_max / 4;
        assert_eq!(floats, decode_scratch_floats(max_tokens, max_seqs, hkv, hq, d), "{name}");
        for seqs in 1..=ms {
            let z = launch.grid[2].eval(&vars(&m, 1, seqs)).unwrap();
            assert_eq!(z as u64, decode_splits(seqs as u64, hkv), "{name}: seqs {seqs}");
            assert!(z >= 1 && z as u64 <= max_chunks, "{name}: seqs {seqs}: grid z {z}");
            for tokens in 1..=seqs.min(mt) {
                let need = (tokens as u64).div_ceil(4) * 4 + max_chunks * tokens as u64 * hq * (d + 4);
                assert!(need <= floats, "{name}: tokens {tokens} seqs {seqs}: {need} floats > {floats}");
            }
        }
        // Batch 1 fills the GPU: about two CTAs per SM, every chunk its own CTA.
        assert_eq!(decode_splits(1, hkv), max_chunks, "{name}");
        // A batch-64 step of 8 kv heads has one CTA per chunk of a 256-key row (4 chunks of 64).
        assert_eq!(decode_splits(64, 8), 4);
        assert!(max_chunks * hkv >= 128, "{name}");
        // Every layer's attention call passes the scratch.
        let id = m.buffer("attn_partial").unwrap();
        let calls: Vec<_> = m.programs[0].calls.iter().filter(|c| c.label.ends_with(".attention")).collect();
        assert_eq!(calls.len() as u64, cfg.num_hidden_layers, "{name}");
        assert!(calls.iter().all(|c| c.args[c.args.len() - 2] == kern_manifest::Binding::Buf(id)), "{name}");
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn split_is_the_default_and_plain_has_no_split_kernels() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-plain-{}", std::process::id()));
    assert_eq!(PackOptions::default().decode_attention, DecodeAttention::Split);
    let m = load(&generate(&cfg, &PackOptions { kernels: kernels(), ..Default::default() }, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.module("attention_decode").is_some());
    assert!(m.buffer("attn_partial").is_some());
    assert_eq!(live(&m, "attention", 1, 1), ["attention_decode_d128", "attention_combine_d128"]);
    let opts = PackOptions { kernels: kernels(), decode_attention: DecodeAttention::Plain, prefill_attention: PrefillAttention::Simt, ..Default::default() };
    let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.module("attention_decode").is_none());
    assert!(m.buffer("attn_partial").is_none());
    // One kernel; written twice by --pdl-small-steps (the default): with PDL for steps of at
    // most 8 tokens, without for larger ones.
    let launches = &m.ops[m.op("attention").unwrap().0].launches;
    assert!(launches.iter().all(|l| l.entry == "attention_d128") && launches.len() == 2, "{launches:?}");
    assert_eq!(live(&m, "attention", 1, 1), ["attention_d128"]);
    assert_eq!(live(&m, "attention", 100, 1), ["attention_d128"]);
    std::fs::remove_dir_all(&out).ok();
}

/// A layer-skip draft's attention op (its own KV layers) gets the split kernels too, and the
/// draft program passes the same scratch.
#[test]
fn split_decode_attention_with_a_draft_program() {
    let cfg = preset("qwen3-0.6b").unwrap();
    for kind in [DraftKind::LayerSkip(4), DraftKind::SelfDraft] {
        let out = std::env::temp_dir().join(format!("kern-pack-split-draft-{}-{}", std::process::id(), kind).replace(':', "-"));
        let opts = PackOptions { draft: Some(Draft { kind, k: 4 }), ..split_opts(64, 16) };
        let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let op = if kind == DraftKind::SelfDraft { "attention" } else { "draft_attention" };
        assert_eq!(live(&m, op, 5, 5), ["attention_decode_d128", "attention_combine_d128"], "{kind}");
        assert_eq!(live(&m, op, 6, 5), ["attention_d128"], "{kind}");
        let id = m.buffer("attn_partial").unwrap();
        let draft = m.programs.iter().find(|p| p.name == "draft").expect("draft program");
        assert!(draft.calls.iter().filter(|c| c.label.ends_with(".attention")).all(|c| c.args[c.args.len() - 2] == kern_manifest::Binding::Buf(id)), "{kind}");
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn shapes_the_split_kernel_cannot_take_are_refused() {
    let mut cfg = preset("qwen3-4b").unwrap();
    assert!(check_split_decode(&cfg).is_ok());
    cfg.num_key_value_heads = Some(1); // 32 query heads per kv head
    let e = check_split_decode(&cfg).unwrap_err();
    assert!(e.contains("32 query heads over 1 kv heads") && e.contains("at most 16") && e.contains("--decode-attention plain"), "{e}");
    let out = std::env::temp_dir().join(format!("kern-pack-split-refused-{}", std::process::id()));
    let e = generate(&cfg, &split_opts(64, 8), &out).unwrap_err().to_string();
    assert!(e.contains("--decode-attention split"), "{e}");
    assert!(!out.join("model.json").exists(), "nothing is written for a refused shape");
    // The default (split) refuses it too, naming the way out; the plain manifest still packs it.
    let e = generate(&cfg, &PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 8, ..Default::default() }, &out).unwrap_err().to_string();
    assert!(e.contains("--decode-attention plain"), "{e}");
    let plain = PackOptions { kernels: kernels(), max_tokens: 64, max_seqs: 8, decode_attention: DecodeAttention::Plain, prefill_attention: PrefillAttention::Simt, ..Default::default() };
    assert!(generate(&cfg, &plain, &out).is_ok());
    std::fs::remove_dir_all(&out).ok();
    let mut cfg = preset("qwen3-4b").unwrap();
    cfg.head_dim = Some(256);
    assert!(check_split_decode(&cfg).is_ok(), "head_dim 256 has its split kernel (Gemma 3)");
    cfg.head_dim = Some(96);
    assert!(check_split_decode(&cfg).unwrap_err().contains("head_dim 96"));
    assert_eq!("split".parse::<DecodeAttention>(), Ok(DecodeAttention::Split));
    assert_eq!("plain".parse::<DecodeAttention>(), Ok(DecodeAttention::Plain));
    let e = "flash".parse::<DecodeAttention>().unwrap_err();
    assert!(e.contains("supported: split (the default") && e.contains("plain"), "{e}");
    assert_eq!(DecodeAttention::Split.to_string(), "split");
}
