//! Issue 15: `kern pack --pdl` (`PackOptions::pdl`) marks exactly the GEMM launches — whose
//! kernels wait with `griddepcontrol.wait` before touching activations — as Programmatic
//! Dependent Launches; the manifest passes `kern check` against the real cubins; the default has
//! none.

use kern_manifest::{load, CheckOptions};
use kern_pack_qwen3::config::preset;
use kern_pack_qwen3::{generate, PackOptions};
use std::path::PathBuf;

fn kernels() -> PathBuf {
    let p = std::env::var_os("KERN_PACK_KERNELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../build/packs/qwen3"));
    assert!(p.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/qwen3/build.sh", p.display());
    p
}

#[test]
fn pdl_marks_the_gemm_launches_only() {
    let cfg = preset("qwen3-0.6b").unwrap();
    for pdl in [false, true] {
        let out = std::env::temp_dir().join(format!("kern-pack-pdl-{}-{pdl}", std::process::id()));
        let opts = PackOptions { kernels: kernels(), max_tokens: 256, max_seqs: 64, pdl, ..Default::default() };
        let m = load(&generate(&cfg, &opts, &out).unwrap(), &CheckOptions::default()).unwrap_or_else(|e| panic!("pdl {pdl}: {e}"));
        let mut marked = 0;
        for op in &m.ops {
            for l in &op.launches {
                let module = &m.modules[l.module.0].name;
                let gemm = module.starts_with("gemm_");
                assert_eq!(l.pdl, pdl && gemm, "op {} launch {} ({module})", op.name, l.entry);
                marked += usize::from(l.pdl);
            }
        }
        // qkv, o, gate_up, down (tokens up to 256): a GEMV, three skinny and one wgmma launch
        // each; lm_head (seqs up to 64) has no wgmma launch.
        assert_eq!(marked, if pdl { 4 * 5 + 4 } else { 0 });
        let _ = std::fs::remove_dir_all(&out);
    }
}
