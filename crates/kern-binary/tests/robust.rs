//! Hostile input: no byte string makes a reader panic, hang, or allocate without bound.
//! Random bytes, random mutations and every truncation of real binaries (the fixtures built by
//! `scripts/build-fixtures.sh`) and of synthetic containers, plus hand-made zip bombs.

use kern_binary::{read, Error};
use proptest::prelude::*;
use std::path::PathBuf;

fn fixtures_dir() -> PathBuf {
    std::env::var_os("KERN_FIXTURES").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/fixtures")
    })
}

/// The real binaries to mutate. Missing fixtures are a failure, not a skip.
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = fixtures_dir();
    let names = [
        "vecadd.sm_90.cubin",
        "vecadd.sm_90.ptx",
        "vecadd.fatbin",
        "vecadd.zstd.fatbin",
        "vecadd.lz4.fatbin",
        "libvecadd.so",
        "triton_rmsnorm.cubin",
        "mixed.sm_90.cubin",
    ];
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            let d = std::fs::read(&p).unwrap_or_else(|e| panic!("fixtures missing ({}: {e}): run scripts/build-fixtures.sh", p.display()));
            (n.to_string(), d)
        })
        .collect()
}

/// A fatbin container holding one PTX entry, optionally compressed.
fn synthetic_fatbin(flags: u64, payload: &[u8], uncompressed: u64) -> Vec<u8> {
    let mut e = Vec::new();
    e.extend_from_slice(&1u16.to_le_bytes()); // PTX
    e.extend_from_slice(&0x0101u16.to_le_bytes());
    e.extend_from_slice(&0x40u32.to_le_bytes());
    let stored = payload.len().div_ceil(8) * 8;
    e.extend_from_slice(&(stored as u64).to_le_bytes());
    let csize = if flags & 0xa000 != 0 { payload.len() as u32 } else { 0 };
    e.extend_from_slice(&csize.to_le_bytes());
    e.extend_from_slice(&0u32.to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    e.extend_from_slice(&9u16.to_le_bytes());
    e.extend_from_slice(&90u32.to_le_bytes());
    e.extend_from_slice(&[0u8; 8]);
    e.extend_from_slice(&(0x11 | flags).to_le_bytes());
    e.extend_from_slice(&[0u8; 8]);
    e.extend_from_slice(&uncompressed.to_le_bytes());
    assert_eq!(e.len(), 0x40);
    e.extend_from_slice(payload);
    e.resize(0x40 + stored, 0);
    let mut f = Vec::new();
    f.extend_from_slice(&0xBA55ED50u32.to_le_bytes());
    f.extend_from_slice(&1u16.to_le_bytes());
    f.extend_from_slice(&16u16.to_le_bytes());
    f.extend_from_slice(&(e.len() as u64).to_le_bytes());
    f.extend_from_slice(&e);
    f
}

const PTX: &[u8] = b".version 9.0\n.target sm_90\n.address_size 64\n.visible .entry k(\n .param .u64 k_param_0,\n .param .u32 k_param_1\n)\n.maxntid 128, 1, 1\n{\n ret;\n}\n";

fn check_no_panic(name: &str, data: &[u8]) {
    // A reader may accept or reject mutated input; it must return, and errors must name the file.
    if let Err(e) = read(data, name) {
        let msg = e.to_string();
        assert!(msg.contains(name), "error does not name the file: {msg}");
    }
}

#[test]
fn synthetic_containers_read_back() {
    let plain = synthetic_fatbin(0, PTX, 0);
    let b = read(&plain, "plain.fatbin").unwrap();
    assert_eq!(b.images[0].kernels[0].params.len(), 2);

    let lz = lz4_flex::block::compress(PTX);
    let b = read(&synthetic_fatbin(0x2000, &lz, PTX.len() as u64), "lz4.fatbin").unwrap();
    assert_eq!(b.images[0].compression, kern_binary::Compression::Lz4);
    assert_eq!(b.images[0].kernels[0].max_threads, Some([128, 1, 1]));

    let zs = ruzstd::encoding::compress_to_vec(PTX, ruzstd::encoding::CompressionLevel::Fastest);
    let b = read(&synthetic_fatbin(0x8000, &zs, PTX.len() as u64), "zstd.fatbin").unwrap();
    assert_eq!(b.images[0].compression, kern_binary::Compression::Zstd);
}

#[test]
fn zip_bombs_are_refused_without_inflating() {
    // 64 MiB of zeros compress to a few KiB; the entry lies that they are 1000 bytes.
    let zeros = vec![0u8; 64 << 20];
    let zs = ruzstd::encoding::compress_to_vec(&zeros[..], ruzstd::encoding::CompressionLevel::Fastest);
    assert!(zs.len() < 64 << 10);
    let e = read(&synthetic_fatbin(0x8000, &zs, 1000), "bomb.fatbin").unwrap_err().to_string();
    assert!(e.contains("bomb.fatbin") && e.contains("declares 1000"), "{e}");

    // Declaring more than kern's per-image cap is refused up front.
    let e = read(&synthetic_fatbin(0x8000, &zs, 1 << 40), "huge.fatbin").unwrap_err().to_string();
    assert!(e.contains("above kern's limit"), "{e}");

    // An LZ4 claim beyond LZ4's maximum ratio is refused before allocating.
    let lz = lz4_flex::block::compress(&zeros[..1 << 20]);
    let e = read(&synthetic_fatbin(0x2000, &lz[..64], 200 << 20), "lz.fatbin").unwrap_err().to_string();
    assert!(e.contains("maximum ratio"), "{e}");
}

#[test]
fn corrupt_headers_name_file_and_offset() {
    let mut f = synthetic_fatbin(0, PTX, 0);
    f[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // container size
    let e = read(&f, "c.fatbin").unwrap_err();
    assert!(matches!(e, Error::Malformed { offset: 8, .. }), "{e}");

    let mut f = synthetic_fatbin(0, PTX, 0);
    f[16 + 8..16 + 16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // entry payload size
    let e = read(&f, "c.fatbin").unwrap_err().to_string();
    assert!(e.contains("c.fatbin") && e.contains("0x18") && e.contains("remain"), "{e}");

    let e = read(b"\x00\x01\x02 not a binary", "junk.bin").unwrap_err().to_string();
    assert!(e.contains("junk.bin") && e.contains("not a GPU binary"), "{e}");
}

#[test]
fn every_truncation_of_real_binaries() {
    for (name, data) in fixtures() {
        // Every prefix for small files; a stride for larger ones keeps this fast in debug.
        let step = (data.len() / 1500).max(1);
        for len in (0..data.len()).step_by(step) {
            check_no_panic(&name, &data[..len]);
        }
    }
}

#[test]
fn single_byte_mutations_of_real_binaries() {
    // Deterministic xorshift so failures reproduce.
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for (name, data) in fixtures() {
        for _ in 0..1500 {
            let mut d = data.clone();
            let n = 1 + (next() % 4) as usize;
            for _ in 0..n {
                let i = (next() % d.len() as u64) as usize;
                d[i] = match next() % 4 {
                    0 => 0xff,
                    1 => 0,
                    _ => next() as u8,
                };
            }
            check_no_panic(&name, &d);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_no_panic("random.bin", &data);
    }

    #[test]
    fn random_bytes_behind_each_magic_never_panic(kind in 0usize..4, tail in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut d: Vec<u8> = match kind {
            0 => b"\x7fELF\x02\x01\x01\x41\x08\x00\x00\x00\x00\x00\x00\x00\x02\x00\xbe\x00".to_vec(),
            1 => b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x3e\x00".to_vec(),
            2 => 0xBA55ED50u32.to_le_bytes().to_vec(),
            _ => b".version 9.0\n.target sm_90\n.entry ".to_vec(),
        };
        d.extend_from_slice(&tail);
        check_no_panic("prefixed.bin", &d);
    }

    #[test]
    fn mutated_synthetic_fatbins_never_panic(flags in prop_oneof![Just(0u64), Just(0x2000u64), Just(0x8000u64)],
                                             muts in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let payload = match flags {
            0x2000 => lz4_flex::block::compress(PTX),
            0x8000 => ruzstd::encoding::compress_to_vec(PTX, ruzstd::encoding::CompressionLevel::Fastest),
            _ => PTX.to_vec(),
        };
        let mut f = synthetic_fatbin(flags, &payload, PTX.len() as u64);
        for (i, b) in muts {
            let n = f.len();
            f[i % n] = b;
        }
        check_no_panic("mut.fatbin", &f);
    }

    #[test]
    fn ptx_fragments_never_panic(body in "[ .a-z0-9_(),\\[\\]{};\n/*]{0,300}") {
        let text = format!(".version 9.0\n.target sm_90\n.entry k{body}");
        check_no_panic("frag.ptx", text.as_bytes());
    }
}
