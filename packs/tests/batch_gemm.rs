//! Issue 15: `--batch-gemm` (`PackOptions::batch_gemm`). With `wide` (the default) every
//! projection runs `gemm_wide.cu`'s cluster entries for 33..64 rows (and 17..32 when K >= 2560)
//! — grid `ceil(N/64)·8`, a multiple of the cluster size 8 — beside the GEMV for 1..8 rows,
//! gemm_bf16_m16/m32 for the other small steps and wgmma above 64; the
//! manifest passes `kern check` against the pack's real cubins (with PDL and a draft program
//! too); `skinny` keeps the 8-warp `gemm_bf16_m16/m32/m64` and has no `gemm_wide` module; a pack
//! whose steps never reach 9 rows has no `gemm_wide` module either.

use kern_manifest::{load, CheckOptions, Manifest};
use kern_packs::config::preset;
use kern_packs::{generate, BatchGemm, Draft, DraftKind, PackOptions};
mod common;
use common::kernels;

/// The entry of `op` that runs at `m` rows (its var: `tokens`, or `seqs` for the LM head), and
/// its grid's x size. Exactly one launch may run.
fn running(m: &Manifest, op: &str, var: &str, rows: i64) -> (String, i64) {
    let mut v = m.vars_at_max();
    v[m.var(var).unwrap().0] = rows;
    if var == "seqs" {
        v[m.var("tokens").unwrap().0] = rows.min(v[m.var("tokens").unwrap().0]);
    }
    let live: Vec<_> = m.ops[m.op(op).unwrap().0]
        .launches
        .iter()
        .filter(|l| l.runs(&v).unwrap())
        .map(|l| (l.entry.clone(), l.grid[0].eval(&v).unwrap()))
        .collect();
    assert_eq!(live.len(), 1, "{op} at {rows} rows: {live:?}");
    live[0].clone()
}

/// The unfused program (`decode_fusion: false`): its per-projection ops (qkv_proj, ...) show the
/// GEMM choice per row count; the fused ops take the same launches above 8 rows (fused.rs).
fn opts(batch_gemm: BatchGemm) -> PackOptions {
    PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, batch_gemm, decode_fusion: false, ..Default::default() }
}

#[test]
fn wide_batch_gemms_run_for_9_to_64_rows_and_pass_kern_check() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-wide-{}", std::process::id()));
    let m = load(&generate(&cfg, &opts(BatchGemm::Wide), &out).unwrap(), &CheckOptions::default()).unwrap();
    assert!(m.modules.iter().any(|x| x.name == "gemm_wide"), "no gemm_wide module");
    // (op, var, N) of Qwen3-0.6B: qkv 2048 + 2·1024, o 1024, gate_up 2·3072, down 1024, vocab.
    // (op, var, N, K) of Qwen3-0.6B: qkv 2048 + 2·1024, o 1024, gate_up 2·3072, down 1024, vocab.
    for (op, var, n, k) in [("qkv_proj", "tokens", 4096, 1024), ("o_proj", "tokens", 1024, 2048), ("gate_up_proj", "tokens", 6144, 1024), ("down_proj", "tokens", 1024, 3072), ("lm_head", "seqs", 151936, 1024)] {
        let sfx = if op == "lm_head" { "_f32out" } else { "" };
        // 17..32 rows: wide only when K >= 2560 (down_proj's K 3072 here).
        let m32 = if k >= 2560 { "gemm_bf16_w32" } else { "gemm_bf16_m32" };
        for (rows, want) in [(1, "gemv_bf16"), (8, "gemv_bf16"), (9, "gemm_bf16_m16"), (16, "gemm_bf16_m16"), (17, m32), (32, m32), (33, "gemm_bf16_w64"), (64, "gemm_bf16_w64")] {
            let (entry, gx) = running(&m, op, var, rows);
            assert_eq!(entry, format!("{want}{sfx}"), "{op} at {rows} rows");
            let wide = want.contains("_w");
            let want_gx = if wide { (n as i64 + 63) / 64 * 8 } else { (n as i64 + 15) / 16 };
            assert_eq!(gx, want_gx, "{op} at {rows} rows: grid x");
        }
        if var == "tokens" {
            assert!(running(&m, op, var, 65).0.starts_with("gemm_bf16_wgmma"), "{op} at 65 rows");
        }
    }
    // With PDL and a self draft (whose verify steps are the 9..64-row case) it still checks.
    let mut o = opts(BatchGemm::Wide);
    o.pdl = true;
    o.draft = Some(Draft { kind: DraftKind::SelfDraft, k: 4 });
    load(&generate(&cfg, &o, &out.join("pdl")).unwrap(), &CheckOptions::default()).unwrap();
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn skinny_batch_gemms_and_small_packs_have_no_wide_module() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-skinny-{}", std::process::id()));
    let m = load(&generate(&cfg, &opts(BatchGemm::Skinny), &out).unwrap(), &CheckOptions::default()).unwrap();
    assert!(!m.modules.iter().any(|x| x.name == "gemm_wide"));
    for (rows, want) in [(9, "gemm_bf16_m16"), (32, "gemm_bf16_m32"), (64, "gemm_bf16_m64")] {
        assert_eq!(running(&m, "down_proj", "tokens", rows).0, want);
    }
    // Steps of at most 8 rows: only the GEMV, and no module nobody launches.
    let mut small = opts(BatchGemm::Wide);
    small.max_tokens = 8;
    small.max_seqs = 8;
    let m = load(&generate(&cfg, &small, &out.join("small")).unwrap(), &CheckOptions::default()).unwrap();
    assert!(!m.modules.iter().any(|x| x.name == "gemm_wide"));
    assert_eq!(running(&m, "down_proj", "tokens", 8).0, "gemv_bf16");
    let _ = std::fs::remove_dir_all(&out);
}

/// Issue 29 (`PackOptions::batch_invariant`, docs/batch-invariance.md): every projection runs the
/// GEMV family up to 64 rows (`gemm_bf16_w64` for 33..64) and `gemm_bf16_wgmma_gv` (the wgmma
/// GEMM in the GEMV family's order: the same bits per row) above, and every step's attention is the one tensor-core prefill launch, decode steps included; the
/// manifest passes `kern check`; models whose kernels cannot keep a row's bits are refused by name.
#[test]
fn batch_invariant_packs_run_one_arithmetic_at_every_step_size() {
    let cfg = preset("qwen3-0.6b").unwrap();
    let out = std::env::temp_dir().join(format!("kern-pack-invariant-{}", std::process::id()));
    let o = PackOptions { batch_invariant: true, ..opts(BatchGemm::Wide) };
    let m = load(&generate(&cfg, &o, &out).unwrap(), &CheckOptions::default()).unwrap();
    assert!(!m.modules.iter().any(|x| x.name == "attention" || x.name == "attention_decode"), "unused modules");
    assert!(m.batch_invariant, "the manifest declares batch_invariant (kern serve --batch-invariant checks it)");
    let plain = load(&generate(&cfg, &opts(BatchGemm::Wide), &out.join("plain")).unwrap(), &CheckOptions::default()).unwrap();
    assert!(!plain.batch_invariant);
    for (op, var, k) in [("qkv_proj", "tokens", 1024), ("down_proj", "tokens", 3072), ("lm_head", "seqs", 1024)] {
        let sfx = if op == "lm_head" { "_f32out" } else { "" };
        let m32 = if k >= 2560 { "gemm_bf16_w32" } else { "gemm_bf16_m32" };
        let top = if var == "seqs" { 64 } else { 256 };
        for rows in 1..=top {
            let want = match rows {
                1..=8 => "gemv_bf16",
                9..=16 => "gemm_bf16_m16",
                17..=32 => m32,
                33..=64 => "gemm_bf16_w64",
                _ => "gemm_bf16_wgmma_gv",
            };
            assert_eq!(running(&m, op, var, rows).0, format!("{want}{sfx}"), "{op} at {rows} rows");
        }
    }
    // Attention: the prefill kernel alone (its PDL and plain launches split the step sizes at 8
    // tokens), at decode steps (tokens == seqs) and prefill steps; exactly one launch runs.
    let att = &m.ops[m.op("attention").unwrap().0];
    assert!(att.launches.iter().all(|l| l.entry == "attention_prefill_d128"), "{:?}", att.launches.iter().map(|l| &l.entry).collect::<Vec<_>>());
    let mut v = m.vars_at_max();
    for (tokens, seqs) in [(1, 1), (8, 8), (64, 64), (256, 1), (200, 17)] {
        v[m.var("tokens").unwrap().0] = tokens;
        v[m.var("seqs").unwrap().0] = seqs;
        let live = att.launches.iter().filter(|l| l.runs(&v).unwrap()).count();
        assert_eq!(live, 1, "attention at tokens {tokens} seqs {seqs}");
    }
    // Gemma 3's head_dim 256 (no tensor-core prefill kernel for it): attention_dD at every step.
    let g = load(&generate(&preset("gemma-3-4b").unwrap(), &o, &out.join("gemma")).unwrap(), &CheckOptions::default()).unwrap();
    assert!(g.batch_invariant);
    assert!(!g.modules.iter().any(|x| x.name == "attention_prefill" || x.name == "attention_decode"), "unused modules");
    assert_eq!(running(&g, "down_proj", "tokens", 200).0, "gemm_bf16_wgmma_gv");
    one_attention_launch(&g, "attention_d256");
    let _ = std::fs::remove_dir_all(&out);
}

/// `attention` has the one launch `entry`, and it runs at decode, prefill and mixed steps.
fn one_attention_launch(m: &kern_manifest::Manifest, entry: &str) {
    let att = &m.ops[m.op("attention").unwrap().0];
    assert!(att.launches.iter().all(|l| l.entry == entry), "{:?}", att.launches.iter().map(|l| &l.entry).collect::<Vec<_>>());
    let mut v = m.vars_at_max();
    for (tokens, seqs) in [(1, 1), (8, 8), (16, 16), (256, 1), (200, 17)] {
        v[m.var("tokens").unwrap().0] = tokens;
        v[m.var("seqs").unwrap().0] = seqs;
        let live = att.launches.iter().filter(|l| l.runs(&v).unwrap()).count();
        assert_eq!(live, 1, "{entry} at tokens {tokens} seqs {seqs}");
    }
}

/// The Gated DeltaNet hybrids under `--batch-invariant`: the recurrent delta rule (fp32 state)
/// is the one GDN launch at every step size, prefill chunks included (no chunked rule); the
/// attention layers take the tensor-core kernel (head_dim 128) or attention_dD (256) at every
/// step; the projections, the MoE router and the shared expert run the GEMV family up to 64 rows
/// and the GEMV-order wgmma above;
/// `kern check` passes; the bf16 state is refused by name.
#[test]
fn batch_invariant_hybrids_run_the_recurrent_rule_at_every_step_size() {
    let out = std::env::temp_dir().join(format!("kern-pack-invariant-hybrid-{}", std::process::id()));
    let o = PackOptions { batch_invariant: true, ..opts(BatchGemm::Wide) };
    for (name, att) in [("qwen3.5-small", "attention_prefill_d128"), ("qwen3-next-small-d256", "attention_d256"), ("qwen3-next-small", "attention_prefill_d128")] {
        let cfg = preset(name).unwrap();
        let m = load(&generate(&cfg, &o, &out.join(name)).unwrap(), &CheckOptions::default()).unwrap_or_else(|d| panic!("{name}: {d}"));
        assert!(m.batch_invariant, "{name}");
        one_attention_launch(&m, att);
        let rule = &m.ops[m.op("gdn_rule").unwrap().0];
        // (Two copies under --pdl-small-steps, one per side of 8 tokens; exactly one runs.)
        assert!(rule.launches.iter().all(|l| l.entry == "gdn_recurrent_f32"), "{name}: {:?}", rule.launches.iter().map(|l| &l.entry).collect::<Vec<_>>());
        let mut v = m.vars_at_max();
        for (tokens, seqs) in [(1, 1), (8, 8), (9, 9), (256, 1), (200, 17)] {
            v[m.var("tokens").unwrap().0] = tokens;
            v[m.var("seqs").unwrap().0] = seqs;
            let live: Vec<i64> = rule.launches.iter().map(|l| l.grid[0].eval(&v).unwrap()).filter(|&x| x > 0).collect();
            assert_eq!(live, [seqs], "{name}: one launch, a CTA row per sequence, at tokens {tokens} seqs {seqs}");
        }
        for op in ["gdn_in_proj", "gdn_out_proj", "moe_router", "shared_gate_up"] {
            if m.op(op).is_some() {
                assert_eq!(running(&m, op, "tokens", 200).0, "gemm_bf16_wgmma_gv", "{name} {op} at 200 rows");
                assert_eq!(running(&m, op, "tokens", 64).0, "gemm_bf16_w64", "{name} {op} at 64 rows");
                assert_eq!(running(&m, op, "tokens", 1).0, "gemv_bf16", "{name} {op} at 1 row");
            }
        }
    }
    let bf16 = PackOptions { gdn_state: kern_packs::gdn::GdnState::Bf16, ..o.clone() };
    let e = generate(&preset("qwen3.5-small").unwrap(), &bf16, &out.join("bf16")).unwrap_err().to_string();
    assert!(e.contains("--batch-invariant") && e.contains("--gdn-state bf16"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}
