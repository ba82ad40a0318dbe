//! kern's GGUF dequantization is bit-exact with the `gguf` Python package.
//!
//! `scripts/gen-gguf-quants.py` (run by `scripts/test.sh` with the pinned gguf package) writes
//! `quants.gguf` — random and edge-value blocks of every type kern dequantizes — and gguf-py's
//! own dequantized float32 output per tensor as `.npy`. Here kern must reproduce every f32 bit
//! pattern (NaN payloads included), and its bf16 must be the f32 rounded to nearest even.
//! With `CI` or `KERN_REQUIRE_TEST_DATA` set (scripts/test.sh sets the latter), missing data
//! is a failure; elsewhere the test says it skipped.

use kern_manifest::DType;
use kern_weights::gguf::{Array, Value};
use kern_weights::Checkpoint;
use std::path::PathBuf;

fn data_dir() -> Option<PathBuf> {
    let base = std::env::var_os("KERN_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/test-data"));
    let dir = base.join("gguf-quants");
    if dir.join("meta.json").is_file() {
        return Some(dir);
    }
    let msg = format!("{} is missing: run `bash scripts/test.sh` (or `.venv-cuda/bin/python scripts/gen-gguf-quants.py {}`)", dir.display(), dir.display());
    if std::env::var_os("CI").is_some() || std::env::var_os("KERN_REQUIRE_TEST_DATA").is_some() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// A little-endian float32 C-order `.npy` (what numpy.save writes for gguf-py's output).
fn read_npy_f32(path: &std::path::Path) -> (Vec<usize>, Vec<u32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..6], b"\x93NUMPY", "{}", path.display());
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        _ => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&b[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"), "{header}");
    let shape_txt = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape: Vec<usize> = shape_txt.split(',').filter(|s| !s.trim().is_empty()).map(|s| s.trim().parse().unwrap()).collect();
    let data = &b[start + hlen..];
    let bits = data.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    assert_eq!(bits.len(), shape.iter().product::<usize>());
    (shape, bits)
}

/// Round-to-nearest-even of f32 bits to bf16 bits, written independently of kern and `half`.
fn rne_bf16(bits: u32) -> u16 {
    let rounded = (u64::from(bits) + 0x7fff + u64::from((bits >> 16) & 1)) >> 16;
    rounded as u16
}

fn is_nan32(b: u32) -> bool {
    b & 0x7fff_ffff > 0x7f80_0000
}

#[test]
fn dequantization_is_bit_exact_with_gguf_py() {
    let Some(dir) = data_dir() else { return };
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let names: Vec<String> = meta["tensors"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    for want in kern_weights::dequant::DEQUANTIZED {
        assert!(names.iter().any(|n| n == want), "the reference data lacks {want}: regenerate it");
    }
    let ckpt = Checkpoint::open(&dir.join("quants.gguf")).unwrap();
    let mut failures = vec![];
    for name in &names {
        let (shape, want) = read_npy_f32(&dir.join(format!("{name}.npy")));
        let view = ckpt.tensor(name).unwrap();
        assert_eq!(view.shape, shape.as_slice(), "{name}: shape");
        assert_eq!(view.ggml.unwrap().name, name);

        let got = ckpt.read_as(name, DType::F32).unwrap();
        let got: Vec<u32> = got.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let bad: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
        if let Some(&i) = bad.first() {
            failures.push(format!("{name} f32: {} of {} elements differ; first at {i}: kern {:#010x}, gguf-py {:#010x}", bad.len(), want.len(), got[i], want[i]));
        }

        let got16 = ckpt.read_as(name, DType::Bf16).unwrap();
        let got16: Vec<u16> = got16.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let bad16: Vec<usize> = (0..want.len())
            .filter(|&i| if is_nan32(want[i]) { got16[i] & 0x7fff <= 0x7f80 } else { got16[i] != rne_bf16(want[i]) })
            .collect();
        if let Some(&i) = bad16.first() {
            failures.push(format!("{name} bf16: {} of {} elements are not the f32 rounded to nearest even; first at {i}: kern {:#06x}, f32 {:#010x}", bad16.len(), want.len(), got16[i], want[i]));
        }
    }
    assert!(failures.is_empty(), "kern's dequantization differs from gguf-py:\n{}", failures.join("\n"));
}

#[test]
fn edge_values_are_in_the_reference() {
    // The reference must exercise the specials, or bit-exactness proves little.
    let Some(dir) = data_dir() else { return };
    for name in ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q2_K", "Q4_1"] {
        let (_, want) = read_npy_f32(&dir.join(format!("{name}.npy")));
        let nan = want.iter().filter(|&&b| is_nan32(b)).count();
        let inf = want.iter().filter(|&&b| b & 0x7fff_ffff == 0x7f80_0000).count();
        // Outputs below f16's smallest normal come from subnormal f16 scales.
        let sub = want.iter().filter(|&&b| b & 0x7fff_ffff != 0 && f32::from_bits(b & 0x7fff_ffff) < 6.1035156e-5).count();
        let zero = want.iter().filter(|&&b| b & 0x7fff_ffff == 0).count();
        assert!(nan > 0 && inf > 0 && sub > 0 && zero > 0, "{name}: nan {nan}, inf {inf}, subnormal {sub}, zero {zero}");
    }
}

#[test]
fn metadata_of_every_type_reads_back() {
    let Some(dir) = data_dir() else { return };
    let ckpt = Checkpoint::open(&dir.join("quants.gguf")).unwrap();
    let g = ckpt.gguf().expect("a GGUF checkpoint");
    assert_eq!(g.version, 3);
    assert_eq!(g.architecture(), Some("kern-test"));
    let get = |k: &str| g.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(get("test.u8"), Value::U8(200));
    assert_eq!(get("test.i8"), Value::I8(-100));
    assert_eq!(get("test.u16"), Value::U16(60000));
    assert_eq!(get("test.i16"), Value::I16(-30000));
    assert_eq!(get("test.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("test.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("test.f32"), Value::F32(0.1));
    assert_eq!(get("test.bool"), Value::Bool(true));
    assert_eq!(get("test.string"), Value::String("héllo ✓".into()));
    assert_eq!(get("test.u64"), Value::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), Value::I64(-(1 << 62)));
    assert_eq!(get("test.f64"), Value::F64(0.1));
    assert_eq!(get("test.strings"), Value::Array(Array::String(vec!["a".into(), "".into(), "Ġthe".into(), "<|im_end|>".into()])));
    assert_eq!(get("test.i32s"), Value::Array(Array::I32(vec![1, -2, 3])));
    assert_eq!(get("test.nested"), Value::Array(Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])));
}
