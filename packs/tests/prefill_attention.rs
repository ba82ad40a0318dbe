//! `--prefill-attention tc` (`PackOptions::prefill_attention`). The attention op launches the
//! tensor-core `attention_prefill_dD` (module `attention_prefill`) for steps with
//! `tokens > seqs` and keeps the `--decode-attention` choice (attention_dD or the split-KV
//! kernels) for the others; the manifests pass `kern check` against the pack's real cubins
//! (draft programs included); `simt` (the default) leaves the manifest as it was; shapes the
//! kernel cannot take are refused.

use kern_manifest::{load, CheckOptions, Manifest};
use kern_packs::config::preset;
use kern_packs::manifest::{check_prefill_tc, PREFILL_ROWS};
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

fn tc_opts(max_tokens: u64, max_seqs: u64, decode_attention: DecodeAttention) -> PackOptions {
    // One copy of each launch (without --pdl-small-steps, whose gated copies tests/pdl.rs covers),
    // so the grids below are the kernels' own.
    PackOptions { kernels: kernels(), max_tokens, max_seqs, max_context: 4096, decode_attention, prefill_attention: PrefillAttention::Tc, pdl_small_steps: false, ..Default::default() }
}

#[test]
fn tc_prefill_attention_passes_kern_check_and_runs_for_prefill_steps_only() {
    for (name, max_tokens, max_seqs) in [("qwen3-0.6b", 256, 64), ("qwen3-4b", 512, 64), ("qwen2.5-0.5b", 64, 256)] {
        let cfg = preset(name).unwrap();
        let (hq, hkv, d) = (cfg.num_attention_heads, cfg.kv_heads(), cfg.head_dim());
        for decode in [DecodeAttention::Plain, DecodeAttention::Split] {
            let out = std::env::temp_dir().join(format!("kern-pack-tc-{}-{name}-{decode}", std::process::id()));
            let m = load(&generate(&cfg, &tc_opts(max_tokens, max_seqs, decode), &out).unwrap(), &CheckOptions::default())
                .unwrap_or_else(|e| panic!("{name} {decode}: {e}"));
            assert!(m.module("attention_prefill").is_some(), "{name} {decode}");
            let tc = format!("attention_prefill_d{d}");
            let dec: Vec<String> = match decode {
                DecodeAttention::Plain => vec![format!("attention_d{d}")],
                DecodeAttention::Split => vec![format!("attention_decode_d{d}"), format!("attention_combine_d{d}")],
            };
            let (mt, ms) = (max_tokens as i64, max_seqs as i64);
            for seqs in [1, 2, 3, 8, 33, ms] {
                for tokens in [1, seqs / 2, seqs - 1, seqs] {
                    if (1..=mt).contains(&tokens) {
                        assert_eq!(live(&m, "attention", tokens, seqs), dec, "{name} {decode}: tokens {tokens} seqs {seqs}");
                    }
                }
            }
            for (tokens, seqs) in [(2, 1), (mt, 1), (mt, ms.min(mt - 1)), (17, 16)] {
                assert_eq!(live(&m, "attention", tokens, seqs), std::slice::from_ref(&tc), "{name} {decode}: tokens {tokens} seqs {seqs}");
            }
            // The tc launch's grid covers every query tile: sum over sequences of
            // ceil(n_i / BQ) <= ceil(tokens / BQ) + seqs, BQ = PREFILL_ROWS / G.
            let op = &m.ops[m.op("attention").unwrap().0];
            let launch = op.launches.iter().find(|l| l.entry == tc).unwrap();
            let bq = (PREFILL_ROWS / (hq / hkv)) as i64;
            for (tokens, seqs) in [(2, 1), (mt, 1), (mt, 7.min(mt - 1))] {
                let v = vars(&m, tokens, seqs);
                assert_eq!(launch.grid[0].eval(&v).unwrap(), (tokens + bq - 1) / bq + seqs, "{name}");
                assert_eq!(launch.grid[1].eval(&v).unwrap(), hkv as i64, "{name}");
            }
            let plain = op.launches.iter().find(|l| l.entry == format!("attention_d{d}"));
            if let Some(p) = plain {
                // attention_dD (decode steps only with tc + plain) takes the same arguments.
                assert_eq!(p.args, launch.args, "{name}");
            }
            std::fs::remove_dir_all(&out).ok();
        }
    }
}

#[test]
fn tc_is_the_default_and_simt_has_no_prefill_module() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-simt-{}", std::process::id()));
    assert_eq!(PackOptions::default().prefill_attention, PrefillAttention::Tc);
    let m = load(&generate(&cfg, &PackOptions { kernels: kernels(), ..Default::default() }, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.module("attention_prefill").is_some());
    assert!(m.module("attention").is_none(), "split decode + tc prefill: attention_dD runs for no step size, its module is not listed");
    assert_eq!(live(&m, "attention", 64, 1), ["attention_prefill_d128"]);
    let simt = PackOptions { kernels: kernels(), prefill_attention: PrefillAttention::Simt, ..Default::default() };
    let m = load(&generate(&cfg, &simt, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.module("attention_prefill").is_none());
    assert_eq!(live(&m, "attention", 64, 1), ["attention_d128"]);
    std::fs::remove_dir_all(&out).ok();
}

/// A layer-skip draft's attention op (its own KV layers) gets the tc kernel too; a self draft
/// shares the target's op.
#[test]
fn tc_prefill_attention_with_a_draft_program() {
    let cfg = preset("qwen3-0.6b").unwrap();
    for decode in [DecodeAttention::Plain, DecodeAttention::Split] {
        for kind in [DraftKind::LayerSkip(4), DraftKind::SelfDraft] {
            let out = std::env::temp_dir().join(format!("kern-pack-tc-draft-{}-{}-{decode}", std::process::id(), kind).replace(':', "-"));
            let opts = PackOptions { draft: Some(Draft { kind, k: 4 }), ..tc_opts(64, 16, decode) };
            let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("{kind}: {e}"));
            let op = if kind == DraftKind::SelfDraft { "attention" } else { "draft_attention" };
            let dec: Vec<&str> = if decode == DecodeAttention::Split { vec!["attention_decode_d128", "attention_combine_d128"] } else { vec!["attention_d128"] };
            assert_eq!(live(&m, op, 5, 5), dec, "{kind} {decode}");
            assert_eq!(live(&m, op, 6, 5), ["attention_prefill_d128"], "{kind} {decode}");
            std::fs::remove_dir_all(&out).ok();
        }
    }
}

#[test]
fn shapes_the_tc_kernel_cannot_take_are_refused() {
    let mut cfg = preset("qwen3-4b").unwrap();
    assert!(check_prefill_tc(&cfg).is_ok());
    cfg.num_key_value_heads = Some(1); // 32 query heads per kv head
    let e = check_prefill_tc(&cfg).unwrap_err();
    assert!(e.contains("32 query heads over 1 kv heads") && e.contains("at most 16") && e.contains("--prefill-attention simt"), "{e}");
    let out = std::env::temp_dir().join(format!("kern-pack-tc-refused-{}", std::process::id()));
    let e = generate(&cfg, &tc_opts(64, 8, DecodeAttention::Plain), &out).unwrap_err().to_string();
    assert!(e.contains("--prefill-attention tc"), "{e}");
    assert!(!out.join("model.json").exists(), "nothing is written for a refused shape");
    std::fs::remove_dir_all(&out).ok();
    let mut cfg = preset("qwen3-4b").unwrap();
    cfg.head_dim = Some(256);
    assert!(check_prefill_tc(&cfg).unwrap_err().contains("head_dim 256"));
    assert_eq!("tc".parse::<PrefillAttention>(), Ok(PrefillAttention::Tc));
    assert_eq!("simt".parse::<PrefillAttention>(), Ok(PrefillAttention::Simt));
    assert!("flash".parse::<PrefillAttention>().unwrap_err().contains("supported: tc"));
    assert_eq!(PrefillAttention::Tc.to_string(), "tc");
}
