//! Hash, kind and entry symbols of real cubins (built by nvcc 13.0, see tests/data/src).

use std::path::PathBuf;

use kern_dump::format::ModuleKind;
use kern_dump::image::{cubin_symbols, sha256_hex, sniff_kind};

fn modules() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/two-processes/modules")
}

#[test]
fn fixture_cubins_are_named_by_their_hash_and_list_their_kernels() {
    let mut seen = 0;
    for entry in std::fs::read_dir(modules()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert_eq!(sha256_hex(&bytes), stem);
        assert_eq!(sniff_kind(&bytes), ModuleKind::Cubin);
        let mut entries = cubin_symbols(&bytes).unwrap().entries;
        entries.sort();
        let expected: &[&str] = match &stem[..8] {
            "1cb896cd" => &["_Z5ScalePffi", "_Z6VecAddPfS_S_"],
            "64cbfa57" => &["_Z4FillPfi", "_Z6VecAddPfS_S_"],
            "9cf9283e" => &["_Z6UnusedPf"],
            other => panic!("unexpected fixture {other}"),
        };
        assert_eq!(entries, expected);
        seen += 1;
    }
    assert_eq!(seen, 3);
}
