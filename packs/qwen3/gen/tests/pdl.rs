//! Issue 15: `kern pack --pdl` (`PackOptions::pdl`) makes every launch a Programmatic Dependent
//! Launch: the GEMM modules as they are (their kernels wait after the weight prefetch), every
//! other module from its `.pdl` build (each kernel waits first: packs/qwen3/build.sh,
//! KERN_PDL_WAIT); the manifest passes `kern check` against those cubins; the default manifest
//! has neither.

use kern_manifest::{load, CheckOptions};
use kern_pack_qwen3::config::preset;
use kern_pack_qwen3::{generate, DecodeAttention, PackOptions};
mod common;
use common::kernels;

#[test]
fn pdl_launches_everything_from_the_waiting_builds() {
    let cfg = preset("qwen3-0.6b").unwrap();
    for (pdl, decode_attention) in [(false, DecodeAttention::Plain), (true, DecodeAttention::Plain), (true, DecodeAttention::Split)] {
        let out = std::env::temp_dir().join(format!("kern-pack-pdl-{}-{pdl}-{decode_attention:?}", std::process::id()));
        let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, pdl, decode_attention, ..Default::default() };
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
