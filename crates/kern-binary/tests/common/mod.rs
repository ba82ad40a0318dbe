//! Shared helpers for kern-binary's integration tests: where the fixtures are, cuobjdump's text
//! parsed ([`cuobjdump`]), and an independent minimal reading of fatbin entry headers
//! ([`raw_fatbin_entries`]).
#![allow(dead_code)]

pub mod cuobjdump;

use std::path::{Path, PathBuf};

/// The fixtures directory: `$KERN_FIXTURES`, else `<workspace>/build/fixtures`. Panics (the test
/// fails, never skips) when it is missing.
pub fn fixtures_dir() -> PathBuf {
    let dir = match std::env::var_os("KERN_FIXTURES") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../build/fixtures"),
    };
    if !dir.join("BUILD-INFO.txt").is_file() {
        panic!(
            "fixtures missing: run scripts/build-fixtures.sh (looked in {}; set KERN_FIXTURES to use another directory)",
            dir.display()
        );
    }
    dir
}

/// Path of one fixture; panics when it does not exist.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    if !p.is_file() {
        panic!("fixture {name} missing in {}: run scripts/build-fixtures.sh", fixtures_dir().display());
    }
    p
}

pub fn read_text(name: &str) -> String {
    let p = fixture(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// Every device binary the build script dumped with cuobjdump: the names `X` with an
/// `X.cuobjdump.txt` next to them, sorted.
pub fn dumped_binaries() -> Vec<String> {
    let dir = fixtures_dir();
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".cuobjdump.txt").map(str::to_string))
        .collect();
    v.sort();
    v
}

/// cuobjdump's `-elf` view of fixture `name`.
pub fn elf_dump(name: &str) -> cuobjdump::Dump {
    let file = format!("{name}.cuobjdump.txt");
    cuobjdump::parse_elf_dump(&read_text(&file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The fixtures the build script must have produced (the golden tests check each one exists).
pub const EXPECTED_FIXTURES: &[&str] = &[
    "vecadd.sm_90.cubin",
    "vecadd.sm_90.ptx",
    "vecadd.fatbin",
    "vecadd.zstd.fatbin",
    "vecadd.lz4.fatbin",
    "vecadd.multi.fatbin",
    "libvecadd.so",
    "libvecadd_ext.so",
    "vecadd",
    "vecadd.truncated.cubin",
    "vecadd.ptxas128.sm_80.cubin",
    "vecadd.ptxas128.sm_90.cubin",
    "vecadd.ptxas128.sm_90a.cubin",
    "mixed.sm_90.cubin",
    "mixed.sm_90.ptx",
    "mixed.fatbin",
    "mixed.rdc.sm_90.cubin",
    "vllm_rms_norm.sm_90.cubin",
    "vllm_rms_norm.sm_90.ptx",
    "triton_rmsnorm.cubin",
    "triton_rmsnorm.ptx",
    "triton_rmsnorm.json",
    "triton_add.cubin",
    "triton_add.ptx",
    "triton_add.json",
];

/// A fatbin entry header, read directly from the bytes (independent of kern-binary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    /// Offset of the entry header in the file.
    pub offset: u64,
    pub header_size: u32,
    /// 1 PTX, 2 ELF.
    pub kind: u16,
    pub stored_size: u64,
    pub compressed_size: u32,
    pub arch: u32,
    pub flags: u64,
    pub uncompressed_size: u64,
}

impl RawEntry {
    pub fn payload_offset(&self) -> u64 {
        self.offset + u64::from(self.header_size)
    }
    /// "lz4", "zstd" or "none" from the entry flags (0x2000 LZ4, 0x8000 zstd).
    pub fn compression(&self) -> &'static str {
        if self.flags & 0x2000 != 0 {
            "lz4"
        } else if self.flags & 0x8000 != 0 {
            "zstd"
        } else {
            "none"
        }
    }
}

fn u16_at(d: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(d.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(d: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(d.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(d: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(d.get(o..o + 8)?.try_into().ok()?))
}

/// Every fatbin entry in `data`: containers (magic 0xBA55ED50) found at 8-byte-aligned offsets,
/// then their entries in order. Enough for nvcc's output; not a robust reader.
pub fn raw_fatbin_entries(data: &[u8]) -> Vec<RawEntry> {
    let mut out = Vec::new();
    let mut p = 0usize;
    while p + 16 <= data.len() {
        if u32_at(data, p) != Some(0xBA55_ED50) {
            p += 8;
            continue;
        }
        let hs = u16_at(data, p + 6).unwrap() as usize;
        let body = u64_at(data, p + 8).unwrap() as usize;
        let end = (p + hs + body).min(data.len());
        let mut e = p + hs;
        while e + 0x40 <= end {
            let header_size = u32_at(data, e + 4).unwrap();
            let stored_size = u64_at(data, e + 8).unwrap();
            out.push(RawEntry {
                offset: e as u64,
                header_size,
                kind: u16_at(data, e).unwrap(),
                stored_size,
                compressed_size: u32_at(data, e + 0x10).unwrap(),
                arch: u32_at(data, e + 0x1c).unwrap(),
                flags: u64_at(data, e + 0x28).unwrap(),
                uncompressed_size: u64_at(data, e + 0x38).unwrap(),
            });
            if header_size == 0 {
                break;
            }
            e += header_size as usize + stored_size as usize;
        }
        p = (end + 7) & !7;
    }
    out
}
