//! What the pack generator's tests share.

use std::path::PathBuf;

/// The pack's built kernels: `$KERN_PACK_KERNELS`, else `<repo>/build/packs`
/// (`bash packs/kernels/build.sh`, which scripts/test.sh runs before `cargo test`).
pub fn kernels() -> PathBuf {
    let p = std::env::var_os("KERN_PACK_KERNELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/packs"));
    assert!(p.join("rowwise.sm_90a.cubin").exists(), "pack kernels missing in {}: run packs/kernels/build.sh", p.display());
    p
}
