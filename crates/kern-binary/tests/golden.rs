//! Golden tests: kern-binary against cuobjdump, on real binaries built by
//! `scripts/build-fixtures.sh` (nvcc 13.0.88 and Triton 3.6 from PyPI, no GPU needed).
//!
//! Two kinds of checks:
//! * **cuobjdump agreement**, for every fixture that has a `*.cuobjdump.txt`: every cubin image
//!   (bare, inside a fatbin, inside a host ELF) reports exactly the kernels, parameters
//!   (ordinal, offset, size), parameter bytes, registers, frame size, max threads, required
//!   block, max registers, static shared memory, arch and toolkit cuobjdump prints; fatbin and
//!   host ELF entries match `cuobjdump -lelf -lptx`; compression matches the entry flags.
//! * **hand-written expectations** that do not depend on cuobjdump: the VecAdd and by-value
//!   struct layouts, the vLLM kernel's name and signature, helpers not being kernels, Triton's
//!   hidden parameters and `.reqntid`, image selection, PTX agreeing with SASS.
//!
//! The fixtures directory is `$KERN_FIXTURES` or `<workspace>/build/fixtures`; when it is
//! missing every test fails with "fixtures missing: run scripts/build-fixtures.sh".
//! Each test collects all mismatches before failing, so one run shows everything that differs.

mod common;

use common::cuobjdump::{self, EntryKind, ExpectedKernel};
use common::{dumped_binaries, elf_dump, fixture, raw_fatbin_entries, read_text};
use kern_binary::{Arch, Binary, Compression, FileKind, Image, ImageKind, Kernel};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

// ---------------------------------------------------------------------------------- harness

/// Collects mismatches; `finish` fails the test listing all of them.
#[derive(Default)]
struct Report {
    errors: Vec<String>,
    checks: usize,
}

impl Report {
    fn eq<T: PartialEq + Debug>(&mut self, ctx: &str, field: &str, expected: T, got: T) {
        self.checks += 1;
        if expected != got {
            self.errors.push(format!("{ctx}: {field}: expected {expected:?}, got {got:?}"));
        }
    }
    fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.errors.push(msg());
        }
    }
    fn fail(&mut self, msg: String) {
        self.checks += 1;
        self.errors.push(msg);
    }
    fn finish(self, what: &str) {
        if !self.errors.is_empty() {
            panic!(
                "{what}: {} of {} checks failed:\n  - {}",
                self.errors.len(),
                self.checks,
                self.errors.join("\n  - ")
            );
        }
        eprintln!("{what}: {} checks passed", self.checks);
    }
}

fn load(name: &str) -> Binary {
    let p = fixture(name);
    kern_binary::read_file(&p).unwrap_or_else(|e| panic!("kern_binary::read_file({name}) failed: {e}"))
}

fn arch(s: &str) -> Arch {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

fn arch_str(im: &Image) -> String {
    im.arch.map(|a| a.to_string()).unwrap_or_else(|| "<none>".into())
}

/// Images of one kind, in file order.
fn images_of(b: &Binary, kind: ImageKind) -> Vec<&Image> {
    let mut v: Vec<&Image> = b.images.iter().filter(|im| im.kind == kind).collect();
    v.sort_by_key(|im| im.offset);
    v
}

fn params3(k: &Kernel) -> Vec<(u32, u32, u32)> {
    k.params.iter().map(|p| (p.ordinal, p.offset, p.size)).collect()
}

fn sizes(k: &Kernel) -> Vec<u32> {
    k.params.iter().map(|p| p.size).collect()
}

/// `(ordinal, offset, size)` from `[(offset, size)]`.
fn layout(pairs: &[(u32, u32)]) -> Vec<(u32, u32, u32)> {
    pairs.iter().enumerate().map(|(i, &(o, s))| (i as u32, o, s)).collect()
}

fn kernel<'a>(r: &mut Report, ctx: &str, im: &'a Image, name: &str) -> Option<&'a Kernel> {
    let k = im.kernel(name);
    if k.is_none() {
        let have: Vec<&str> = im.kernels.iter().map(|k| k.name.as_str()).collect();
        r.fail(format!("{ctx}: kernel {name} not found; kernels: {have:?}"));
    }
    k
}

fn only_image<'a>(r: &mut Report, ctx: &str, b: &'a Binary) -> Option<&'a Image> {
    r.eq(ctx, "number of images", 1, b.images.len());
    b.images.first()
}

// ---------------------------------------------------------------------------------- fixtures

#[test]
fn fixtures_present() {
    let dir = common::fixtures_dir();
    let mut r = Report::default();
    for f in common::EXPECTED_FIXTURES {
        r.check(dir.join(f).is_file(), || format!("fixture {f} missing in {}", dir.display()));
    }
    for f in dumped_binaries() {
        r.check(dir.join(&f).is_file(), || format!("{f}.cuobjdump.txt has no binary {f} next to it"));
        r.check(dir.join(format!("{f}.res-usage.txt")).is_file(), || format!("{f}.res-usage.txt missing"));
        r.check(dir.join(format!("{f}.symbols.txt")).is_file(), || format!("{f}.symbols.txt missing"));
        if !f.ends_with(".cubin") {
            r.check(dir.join(format!("{f}.list.txt")).is_file(), || format!("{f}.list.txt missing"));
        }
    }
    r.check(dumped_binaries().len() >= 14, || format!("only {} dumped binaries", dumped_binaries().len()));
    r.finish("fixtures_present");
}

// ---------------------------------------------------------------------------------- the parser

/// An excerpt of `cuobjdump -elf vecadd.sm_90.cubin` (nvcc 13.0.88), to test the parser on
/// known text without the fixtures.
const VECADD_DUMP: &str = "
64-bit ELF: type=ET_EXEC, ABI=8, sm=90, toolkit=13.0, flags=0x6005a04
Sections:
Index Offset   Size ES Align                      Type    Flags Link     Info Name
    1     40    127  0  1                       STRTAB        0    0        0 .shstrtab
    7    524     24  0  4                    CUDA_INFO        0    3        0 .nv.info
    9    56c     64  0  4                    CUDA_INFO       40    3        c .nv.info._Z6VecAddPfS_S_
    c    680    180  0 80                     PROGBITS        6    3        8 .text._Z6VecAddPfS_S_
    e    800    228  0  4                     PROGBITS       42    0        c .nv.constant0._Z6VecAddPfS_S_

.section .symtab
 index           value           size      info    other  shndx    name  
   0               0               0        0        0      0     (null)
 0x3               0               0      0x3        0    0xc     .text._Z6VecAddPfS_S_
 0x5               0               0     0x20     0xa0    0xd     __nv_reservedSMEM_offset_0_alias
 0x8               0           0x180     0x12     0x10    0xc     _Z6VecAddPfS_S_


.nv.info
\t<0x1>
\tAttribute:\tEIATTR_REGCOUNT
\tFormat:\tEIFMT_SVAL
\tValue:\tfunction: _Z6VecAddPfS_S_(0x8)\tregister count: 12
\t<0x2>
\tAttribute:\tEIATTR_FRAME_SIZE
\tFormat:\tEIFMT_SVAL
\tValue:\tfunction: _Z6VecAddPfS_S_(0x8)\tframe size: 0x0


.nv.info._Z6VecAddPfS_S_
\t<0x1>
\tAttribute:\tEIATTR_CUDA_API_VERSION
\tFormat:\tEIFMT_SVAL
\tValue:\t0x82 
\t<0x2>
\tAttribute:\tEIATTR_KPARAM_INFO
\tFormat:\tEIFMT_SVAL
\tValue:\tIndex : 0x0\tOrdinal : 0x2\tOffset  : 0x10\tSize    : 0x8
\t\tPointee's logAlignment : 0x0\tSpace : 0x0\tcbank : 0x1f\tParameter Space : CBANK\t
\t<0x3>
\tAttribute:\tEIATTR_KPARAM_INFO
\tFormat:\tEIFMT_SVAL
\tValue:\tIndex : 0x0\tOrdinal : 0x1\tOffset  : 0x8\tSize    : 0x8
\t\tPointee's logAlignment : 0x0\tSpace : 0x0\tcbank : 0x1f\tParameter Space : CBANK\t
\t<0x4>
\tAttribute:\tEIATTR_KPARAM_INFO
\tFormat:\tEIFMT_SVAL
\tValue:\tIndex : 0x0\tOrdinal : 0x0\tOffset  : 0x0\tSize    : 0x8
\t\tPointee's logAlignment : 0x0\tSpace : 0x0\tcbank : 0x1f\tParameter Space : CBANK\t
\t<0x6>
\tAttribute:\tEIATTR_MAXREG_COUNT
\tFormat:\tEIFMT_HVAL
\tValue:\t0xff
\t<0x9>
\tAttribute:\tEIATTR_CBANK_PARAM_SIZE
\tFormat:\tEIFMT_HVAL
\tValue:\t0x18
\t<0x10>
\tAttribute:\tEIATTR_PARAM_CBANK
\tFormat:\tEIFMT_SVAL
\tValue:\t0x9 0x180210 


.text._Z6VecAddPfS_S_
lmem=0\tsmem=0
0xff017b82 0x00000a00 0x00000800 0x000fe200
";

#[test]
fn cuobjdump_parser_on_known_text() {
    let d = cuobjdump::parse_elf_dump(VECADD_DUMP).unwrap();
    assert!(d.entries.is_empty());
    assert_eq!(d.elfs.len(), 1);
    let e = &d.elfs[0];
    assert_eq!((e.arch.as_str(), e.abi, e.toolkit.as_str(), e.elf_type.as_str()), ("sm_90", 8, "13.0", "ET_EXEC"));
    assert_eq!(e.flags, 0x6005a04);
    assert_eq!(e.sections.len(), 5);
    assert_eq!(e.section(".nv.info._Z6VecAddPfS_S_").unwrap().info, 0xc);
    assert_eq!(e.symbols.len(), 4);
    assert_eq!(e.entry_symbols().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["_Z6VecAddPfS_S_"]);
    let ks = e.kernels().unwrap();
    assert_eq!(
        ks,
        [ExpectedKernel {
            name: "_Z6VecAddPfS_S_".into(),
            sym_index: 8,
            params: vec![(0, 0, 8), (1, 8, 8), (2, 16, 8)],
            param_bytes: 24,
            param_cbank_size: Some(24),
            registers: Some(12),
            frame_bytes: Some(0),
            max_threads: None,
            required_block: None,
            max_registers: Some(255),
            shared_bytes: None,
        }]
    );

    // The ABI 7 header format (Triton's bundled ptxas).
    let d = cuobjdump::parse_elf_dump("64bit elf: type=2, abi=7, sm=90a, toolkit=128, flags = 0x5a0d5a\n").unwrap();
    let e = &d.elfs[0];
    assert_eq!((e.arch.as_str(), e.abi, e.toolkit.as_str(), e.flags), ("sm_90a", 7, "12.8", 0x5a0d5a));

    let l = cuobjdump::parse_list("PTX file    1: v.1.sm_90.ptx\nELF file    1: v.1.sm_90a.cubin\n").unwrap();
    assert_eq!(
        l.iter().map(|e| (e.kind, e.arch.as_str())).collect::<Vec<_>>(),
        [(EntryKind::Ptx, "sm_90"), (EntryKind::Elf, "sm_90a")]
    );

    let ru = cuobjdump::parse_res_usage(
        "\nResource usage:\n Common:\n  GLOBAL:0\n Function _Z6VecAddPfS_S_:\n  REG:12 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0\n",
    )
    .unwrap();
    assert_eq!(ru.len(), 1);
    assert_eq!(ru[0]["_Z6VecAddPfS_S_"].reg, 12);
}

/// The parser on every real dump, cross-checked against itself and `-res-usage` / `-lelf`.
#[test]
fn cuobjdump_parser_on_fixture_dumps() {
    let mut r = Report::default();
    let mut kernels_seen = 0;
    for name in dumped_binaries() {
        let d = elf_dump(&name);
        r.check(!d.elfs.is_empty(), || format!("{name}: parser found no ELF"));
        let usage = cuobjdump::parse_res_usage(&read_text(&format!("{name}.res-usage.txt")))
            .unwrap_or_else(|e| panic!("{name}.res-usage.txt: {e}"));
        r.eq(&name, "ELF count (-elf vs -res-usage)", d.elfs.len(), usage.len());
        let syms = cuobjdump::parse_symbols_entries(&read_text(&format!("{name}.symbols.txt")));
        r.eq(&name, "ELF count (-elf vs -symbols)", d.elfs.len(), syms.len());
        for (i, (e, s)) in d.elfs.iter().zip(&syms).enumerate() {
            let from_elf: BTreeSet<&str> = e.entry_symbols().map(|s| s.name.as_str()).collect();
            let from_syms: BTreeSet<&str> = s.iter().map(String::as_str).collect();
            r.eq(&format!("{name} ELF #{i}"), "STO_ENTRY functions (-symbols vs -elf .symtab)", from_syms, from_elf);
        }
        if let Ok(list) = std::fs::read_to_string(common::fixtures_dir().join(format!("{name}.list.txt"))) {
            let list = cuobjdump::parse_list(&list).unwrap_or_else(|e| panic!("{name}.list.txt: {e}"));
            let from_list: Vec<_> = list.iter().map(|e| (e.kind, e.arch.clone())).collect();
            let from_dump: Vec<_> = d.entries.iter().map(|e| (e.kind, e.arch.clone())).collect();
            r.eq(&name, "entries (-lelf -lptx vs -elf headers)", from_list, from_dump);
        }
        for (i, e) in d.elfs.iter().enumerate() {
            let ctx = format!("{name} ELF #{i} ({})", e.arch);
            r.check(e.arch.starts_with("sm_"), || format!("{ctx}: arch {}", e.arch));
            r.check(!e.sections.is_empty() && !e.symbols.is_empty(), || {
                format!("{ctx}: no sections or symbols parsed")
            });
            r.check(e.info.contains_key(".nv.info") || e.entry_symbols().count() == 0, || {
                format!("{ctx}: no module .nv.info")
            });
            let ks = match e.kernels() {
                Ok(k) => k,
                Err(msg) => {
                    r.fail(format!("{ctx}: {msg}"));
                    continue;
                }
            };
            for k in &ks {
                kernels_seen += 1;
                let kctx = format!("{ctx}: {}", k.name);
                let ords: Vec<u32> = k.params.iter().map(|p| p.0).collect();
                r.eq(&kctx, "KPARAM ordinals", (0..k.params.len() as u32).collect::<Vec<_>>(), ords);
                if let Some(s) = k.param_cbank_size {
                    r.eq(&kctx, "CBANK_PARAM_SIZE vs PARAM_CBANK size", s, k.param_bytes);
                }
                if let Some(last) = k.params.last() {
                    r.check(last.1 + last.2 <= k.param_bytes, || format!("{kctx}: last param ends past param_bytes"));
                }
                r.check(k.registers.is_some(), || format!("{kctx}: no REGCOUNT"));
                match usage.get(i).and_then(|u| u.get(&k.name)) {
                    Some(u) => {
                        r.eq(&kctx, "REG (-res-usage vs REGCOUNT)", u.reg, k.registers.unwrap_or(0) as u64);
                        r.eq(&kctx, "SHARED (-res-usage vs .nv.shared size)", u.shared, k.shared_bytes.unwrap_or(0));
                    }
                    None => r.fail(format!("{kctx}: not in -res-usage")),
                }
            }
        }
    }
    r.check(kernels_seen >= 40, || format!("only {kernels_seen} kernels parsed"));
    r.finish("cuobjdump_parser_on_fixture_dumps");
}

// ---------------------------------------------------------------------------------- cuobjdump agreement

fn compare_kernel(r: &mut Report, ctx: &str, want: &ExpectedKernel, got: &Kernel) {
    let ctx = format!("{ctx}: kernel {}", want.name);
    r.eq(&ctx, "params (ordinal, offset, size)", want.params.clone(), params3(got));
    r.eq(&ctx, "param_bytes", want.param_bytes, got.param_bytes);
    r.eq(&ctx, "registers", want.registers, got.registers);
    r.eq(&ctx, "frame_bytes", want.frame_bytes, got.frame_bytes);
    r.eq(&ctx, "max_threads", want.max_threads, got.max_threads);
    r.eq(&ctx, "required_block", want.required_block, got.required_block);
    r.eq(&ctx, "max_registers", want.max_registers, got.max_registers);
    match want.shared_bytes {
        Some(s) => r.eq(&ctx, "shared_bytes", Some(s), got.shared_bytes),
        // No .nv.shared.<kernel> section: none or zero are both right.
        None => r.check(matches!(got.shared_bytes, None | Some(0)), || {
            format!("{ctx}: shared_bytes: no .nv.shared section, got {:?}", got.shared_bytes)
        }),
    }
}

#[test]
fn cubin_images_match_cuobjdump() {
    let mut r = Report::default();
    for name in dumped_binaries() {
        let d = elf_dump(&name);
        let b = match kern_binary::read_file(fixture(&name)) {
            Ok(b) => b,
            Err(e) => {
                r.fail(format!("{name}: read_file failed: {e}"));
                continue;
            }
        };
        let cubins = images_of(&b, ImageKind::Cubin);
        r.eq(&name, "number of cubin images", d.elfs.len(), cubins.len());
        for (i, (e, im)) in d.elfs.iter().zip(&cubins).enumerate() {
            let ctx = format!("{name} cubin #{i} ({})", e.arch);
            r.eq(&ctx, "arch", e.arch.clone(), arch_str(im));
            r.eq(&ctx, "toolkit", Some(e.toolkit.clone()), im.toolkit.clone());
            let want = match e.kernels() {
                Ok(k) => k,
                Err(msg) => {
                    r.fail(format!("{ctx}: cuobjdump text: {msg}"));
                    continue;
                }
            };
            let want_names: BTreeSet<&str> = want.iter().map(|k| k.name.as_str()).collect();
            let got_names: BTreeSet<&str> = im.kernels.iter().map(|k| k.name.as_str()).collect();
            r.eq(&ctx, "kernel names", want_names, got_names);
            r.eq(&ctx, "kernel count (duplicates?)", want.len(), im.kernels.len());
            for k in &want {
                if let Some(g) = im.kernel(&k.name) {
                    compare_kernel(&mut r, &ctx, k, g);
                }
            }
        }
    }
    r.finish("cubin_images_match_cuobjdump");
}

/// Fatbins and host ELFs: the entries (kind, arch, count, order) match `cuobjdump -lelf -lptx`,
/// and compression matches the entry flags read from the bytes.
#[test]
fn container_entries_match_cuobjdump() {
    let mut r = Report::default();
    let mut n = 0;
    for name in dumped_binaries() {
        let Ok(list) = std::fs::read_to_string(common::fixtures_dir().join(format!("{name}.list.txt"))) else {
            continue;
        };
        n += 1;
        let list = cuobjdump::parse_list(&list).unwrap_or_else(|e| panic!("{name}.list.txt: {e}"));
        let d = elf_dump(&name);
        let b = load(&name);
        let want_kind = if name.ends_with(".fatbin") { FileKind::Fatbin } else { FileKind::HostElf };
        r.eq(&name, "file kind", want_kind, b.kind);
        let mut images: Vec<&Image> = b.images.iter().collect();
        images.sort_by_key(|im| im.offset);
        let want: Vec<(ImageKind, String)> = list
            .iter()
            .map(|e| (if e.kind == EntryKind::Elf { ImageKind::Cubin } else { ImageKind::Ptx }, e.arch.clone()))
            .collect();
        let got: Vec<(ImageKind, String)> = images.iter().map(|im| (im.kind, arch_str(im))).collect();
        r.eq(&name, "entries (kind, arch) in file order", want, got);

        let data = std::fs::read(fixture(&name)).unwrap();
        let raw = raw_fatbin_entries(&data);
        r.eq(&name, "entry count (raw headers)", raw.len(), images.len());
        for (i, (e, im)) in raw.iter().zip(&images).enumerate() {
            let ctx = format!("{name} entry #{i} ({:?} {})", im.kind, arch_str(im));
            let want_comp = match e.compression() {
                "lz4" => Compression::Lz4,
                "zstd" => Compression::Zstd,
                _ => Compression::None,
            };
            r.eq(&ctx, &format!("compression (entry flags {:#x})", e.flags), want_comp, im.compression);
            r.eq(&ctx, "compressed", want_comp != Compression::None, im.compressed);
            if let Some(h) = d.entries.get(i) {
                r.eq(&ctx, "compressed (cuobjdump header)", h.compressed, im.compressed);
            }
            r.check(im.offset == e.offset || im.offset == e.payload_offset(), || {
                format!(
                    "{ctx}: offset {:#x} is neither the entry header ({:#x}) nor its payload ({:#x})",
                    im.offset,
                    e.offset,
                    e.payload_offset()
                )
            });
            r.eq(&ctx, "size == data.len()", im.size, im.data.len() as u64);
            // PTX: the header's sizes count the terminating NUL (and raw entries pad to 8 with
            // NULs); the image's data is the text without them.
            let full = if want_comp != Compression::None { e.uncompressed_size } else { e.stored_size };
            if im.kind == ImageKind::Cubin {
                r.eq(&ctx, "size (entry header's uncompressed / stored size)", full, im.size);
            } else {
                r.check(im.size < full && full - im.size <= 8, || {
                    format!(
                        "{ctx}: PTX size {} vs {full} in the entry header (expected the text without its 1-8 NULs)",
                        im.size
                    )
                });
                r.check(!im.data.ends_with(&[0]), || format!("{ctx}: PTX data ends with a NUL"));
            }
            match im.kind {
                ImageKind::Cubin => r.check(im.data.starts_with(b"\x7fELF"), || format!("{ctx}: data is not an ELF")),
                ImageKind::Ptx => r.check(
                    std::str::from_utf8(&im.data).is_ok_and(|s| s.contains(".version") && s.contains(".target")),
                    || format!("{ctx}: data is not PTX text"),
                ),
            }
        }
    }
    r.check(n >= 8, || format!("only {n} containers checked"));
    r.finish("container_entries_match_cuobjdump");
}

// ---------------------------------------------------------------------------------- hand-written

#[test]
fn bare_files_kinds() {
    let mut r = Report::default();
    for (f, kind, ik) in [
        ("vecadd.sm_90.cubin", FileKind::Cubin, ImageKind::Cubin),
        ("mixed.sm_90.cubin", FileKind::Cubin, ImageKind::Cubin),
        ("mixed.rdc.sm_90.cubin", FileKind::Cubin, ImageKind::Cubin),
        ("triton_add.cubin", FileKind::Cubin, ImageKind::Cubin),
        ("vecadd.sm_90.ptx", FileKind::Ptx, ImageKind::Ptx),
        ("mixed.sm_90.ptx", FileKind::Ptx, ImageKind::Ptx),
        ("triton_rmsnorm.ptx", FileKind::Ptx, ImageKind::Ptx),
    ] {
        let b = load(f);
        r.eq(f, "file kind", kind, b.kind);
        if let Some(im) = only_image(&mut r, f, &b) {
            r.eq(f, "image kind", ik, im.kind);
            r.eq(f, "compressed", false, im.compressed);
            r.eq(f, "compression", Compression::None, im.compression);
            r.eq(f, "offset", 0, im.offset);
            let len = std::fs::metadata(fixture(f)).unwrap().len();
            if ik == ImageKind::Cubin {
                r.eq(f, "size", len, im.size);
            }
        }
        if ik == ImageKind::Ptx {
            let text = read_text(f);
            let version = text.lines().find_map(|l| l.trim().strip_prefix(".version ")).map(|v| v.trim().to_string());
            r.eq(f, "ptx_version", version, b.images[0].ptx_version.clone());
            let target = text.lines().find_map(|l| l.trim().strip_prefix(".target ")).map(|v| v.trim().to_string());
            r.eq(f, "arch (.target)", target, b.images[0].arch.map(|a| a.to_string()));
        }
    }
    r.finish("bare_files_kinds");
}

#[test]
fn truncated_cubin_is_an_error() {
    let p = fixture("vecadd.truncated.cubin");
    match kern_binary::read_file(&p) {
        Ok(b) => panic!("a 300-byte prefix of a cubin was read as {} image(s)", b.images.len()),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("vecadd.truncated.cubin"), "error does not name the file: {msg}");
        }
    }
}

const VECADD: &str = "_Z6VecAddPfS_S_";

#[test]
fn vecadd_layout() {
    let mut r = Report::default();
    for (f, want_arch, toolkit) in [
        ("vecadd.sm_90.cubin", "sm_90", "13.0"),
        ("vecadd.sm_90.ptx", "sm_90", ""),
        // ELF ABI 7 cubins from ptxas 12.8 (the CUDA 12 header layout).
        ("vecadd.ptxas128.sm_80.cubin", "sm_80", "12.8"),
        ("vecadd.ptxas128.sm_90.cubin", "sm_90", "12.8"),
        ("vecadd.ptxas128.sm_90a.cubin", "sm_90a", "12.8"),
    ] {
        let b = load(f);
        let Some(im) = only_image(&mut r, f, &b) else { continue };
        r.eq(f, "arch", want_arch.to_string(), arch_str(im));
        r.eq(f, "kernel names", vec![VECADD], im.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>());
        if let Some(k) = kernel(&mut r, f, im, VECADD) {
            r.eq(f, "VecAdd params", layout(&[(0, 8), (8, 8), (16, 8)]), params3(k));
            r.eq(f, "VecAdd param_bytes", 24, k.param_bytes);
            r.eq(f, "VecAdd demangled", Some("VecAdd(float*, float*, float*)"), k.demangled.as_deref());
            r.eq(
                f,
                "VecAdd cpp_params",
                Some(vec!["float*".to_string(), "float*".into(), "float*".into()]),
                k.cpp_params.clone(),
            );
            if im.kind == ImageKind::Cubin {
                r.check(k.registers.is_some_and(|n| n > 0 && n <= 255), || {
                    format!("{f}: VecAdd registers {:?}", k.registers)
                });
                r.eq(f, "VecAdd toolkit", Some(toolkit.to_string()), im.toolkit.clone());
            } else {
                r.check(k.params.iter().all(|p| p.pointer || p.ptx_type.as_deref() == Some("u64")), || {
                    format!("{f}: VecAdd PTX params {:?}", k.params)
                });
            }
        }
    }
    r.finish("vecadd_layout");
}

/// Every __global__ in tests/fixtures/mixed.cu, mangled.
const MIXED_KERNELS: &[&str] = &[
    "saxpy_c",
    "no_params",
    "_ZN12kern_fixture3ops5scaleIfLi1EEEvPT_PKS2_S2_i",
    "_ZN12kern_fixture3ops5scaleIfLi4EEEvPT_PKS2_S2_i",
    "_ZN12kern_fixture3ops5scaleIdLi2EEEvPT_PKS2_S2_i",
    "_ZN12kern_fixture3ops5scaleIaLi4EEEvPT_PKS2_S2_i",
    "_Z8by_valuecsd5Mixed4Vec4PKfPfm",
    "_Z7scalarsatimfdbPd",
    "_Z7boundedPfi",
    "_Z8maxreg32Pfi",
    "_Z12shared_tilesPKfPfi",
    "_Z12uses_helpersPfPKiffi",
    "_Z6dividePKfS0_Pfi",
];

#[test]
fn mixed_kernels() {
    let mut r = Report::default();
    for f in ["mixed.sm_90.cubin", "mixed.rdc.sm_90.cubin", "mixed.sm_90.ptx", "mixed.fatbin"] {
        let b = load(f);
        r.check(!b.images.is_empty(), || format!("{f}: no images"));
        for (i, im) in b.images.iter().enumerate() {
            let ctx = format!("{f} image #{i} ({:?} {})", im.kind, arch_str(im));
            let is_cubin = im.kind == ImageKind::Cubin;
            // Exactly the entry points: no __noinline__ helpers, no compiler slow paths.
            let want: BTreeSet<&str> = MIXED_KERNELS.iter().copied().collect();
            let got: BTreeSet<&str> = im.kernels.iter().map(|k| k.name.as_str()).collect();
            r.eq(&ctx, "kernel names", want, got);
            for k in &im.kernels {
                r.check(!k.name.contains("helper_") && !k.name.contains("slowpath"), || {
                    format!("{ctx}: helper function {} reported as a kernel", k.name)
                });
            }

            if let Some(k) = kernel(&mut r, &ctx, im, "_Z8by_valuecsd5Mixed4Vec4PKfPfm") {
                // char, short, double, struct{i64,i32,f32,i64}, struct __align__(16){4 x f32}, ptr, ptr, u64
                let want = layout(&[(0, 1), (2, 2), (8, 8), (16, 24), (48, 16), (64, 8), (72, 8), (80, 8)]);
                r.eq(&ctx, "by_value params", want, params3(k));
                r.eq(&ctx, "by_value param_bytes", 88, k.param_bytes);
                r.eq(
                    &ctx,
                    "by_value demangled",
                    Some("by_value(char, short, double, Mixed, Vec4, float const*, float*, unsigned long)"),
                    k.demangled.as_deref(),
                );
                if !is_cubin && k.params.len() == 8 {
                    let aligns: Vec<Option<u32>> = k.params.iter().map(|p| p.align).collect();
                    r.eq(&ctx, "by_value PTX struct alignments", (Some(8), Some(16)), (aligns[3], aligns[4]));
                }
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "_Z7scalarsatimfdbPd") {
                // i8, u16, i32, u64, f32, f64, bool, double*
                let want = layout(&[(0, 1), (2, 2), (4, 4), (8, 8), (16, 4), (24, 8), (32, 1), (40, 8)]);
                r.eq(&ctx, "scalars params", want, params3(k));
                r.eq(&ctx, "scalars param_bytes", 48, k.param_bytes);
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "saxpy_c") {
                r.eq(&ctx, "saxpy_c params", layout(&[(0, 4), (4, 4), (8, 8), (16, 8)]), params3(k));
                r.eq(&ctx, "saxpy_c demangled (extern \"C\")", None, k.demangled.as_deref());
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "no_params") {
                r.eq(&ctx, "no_params params", 0, k.params.len());
                r.eq(&ctx, "no_params param_bytes", 0, k.param_bytes);
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "_Z7boundedPfi") {
                r.eq(&ctx, "bounded max_threads (__launch_bounds__(256, 2))", Some([256, 1, 1]), k.max_threads);
                if is_cubin {
                    // ptxas turns minBlocks = 2 into a register cap of 65536 / (256 * 2).
                    r.check(k.max_registers.is_some_and(|m| m <= 128), || {
                        format!("{ctx}: bounded max_registers {:?}", k.max_registers)
                    });
                    r.check(k.registers.is_some_and(|m| m <= 128), || {
                        format!("{ctx}: bounded registers {:?}", k.registers)
                    });
                } else {
                    r.eq(&ctx, "bounded min_ctas_per_sm (.minnctapersm)", Some(2), k.min_ctas_per_sm);
                }
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "_Z8maxreg32Pfi") {
                r.eq(&ctx, "maxreg32 max_registers (__maxnreg__(32))", Some(32), k.max_registers);
                if is_cubin {
                    r.check(k.registers.is_some_and(|m| m <= 32), || {
                        format!("{ctx}: maxreg32 registers {:?}", k.registers)
                    });
                }
            }
            if is_cubin {
                if let Some(k) = kernel(&mut r, &ctx, im, "_Z12shared_tilesPKfPfi") {
                    // float[256] + int[32] = 1152 bytes (sm_90 whole-program cubins add 1 KiB reserved).
                    r.check(k.shared_bytes.is_some_and(|s| s >= 1152), || {
                        format!("{ctx}: shared_tiles shared_bytes {:?}", k.shared_bytes)
                    });
                }
                if let Some(k) = kernel(&mut r, &ctx, im, "saxpy_c") {
                    r.check(matches!(k.shared_bytes, None | Some(0)), || {
                        format!("{ctx}: saxpy_c shared_bytes {:?}", k.shared_bytes)
                    });
                }
            }
            for (m, demangled) in [
                (
                    "_ZN12kern_fixture3ops5scaleIfLi1EEEvPT_PKS2_S2_i",
                    "void kern_fixture::ops::scale<float, 1>(float*, float const*, float, int)",
                ),
                (
                    "_ZN12kern_fixture3ops5scaleIfLi4EEEvPT_PKS2_S2_i",
                    "void kern_fixture::ops::scale<float, 4>(float*, float const*, float, int)",
                ),
                (
                    "_ZN12kern_fixture3ops5scaleIdLi2EEEvPT_PKS2_S2_i",
                    "void kern_fixture::ops::scale<double, 2>(double*, double const*, double, int)",
                ),
                (
                    "_ZN12kern_fixture3ops5scaleIaLi4EEEvPT_PKS2_S2_i",
                    "void kern_fixture::ops::scale<signed char, 4>(signed char*, signed char const*, signed char, int)",
                ),
            ] {
                if let Some(k) = kernel(&mut r, &ctx, im, m) {
                    r.eq(&ctx, &format!("{m} demangled"), Some(demangled), k.demangled.as_deref());
                    r.eq(&ctx, &format!("{m} param count"), 4, k.params.len());
                }
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "_ZN12kern_fixture3ops5scaleIaLi4EEEvPT_PKS2_S2_i") {
                r.eq(&ctx, "scale<signed char,4> params", layout(&[(0, 8), (8, 8), (16, 1), (20, 4)]), params3(k));
            }
            if let Some(k) = kernel(&mut r, &ctx, im, "_ZN12kern_fixture3ops5scaleIdLi2EEEvPT_PKS2_S2_i") {
                r.eq(&ctx, "scale<double,2> params", layout(&[(0, 8), (8, 8), (16, 8), (24, 4)]), params3(k));
            }
        }
    }
    r.finish("mixed_kernels");
}

const VLLM: &str = "_ZN4vllm15rms_norm_kernelIN3c108BFloat16ELi8ELi2ELb1EEEvPT_PKS3_lllllS6_lfii";

#[test]
fn vllm_rms_norm_signature() {
    let mut r = Report::default();
    for f in ["vllm_rms_norm.sm_90.cubin", "vllm_rms_norm.sm_90.ptx"] {
        let b = load(f);
        let Some(im) = only_image(&mut r, f, &b) else { continue };
        r.eq(f, "kernel names", vec![VLLM], im.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>());
        let Some(k) = kernel(&mut r, f, im, VLLM) else { continue };
        r.eq(f, "param count", 12, k.params.len());
        r.eq(f, "param sizes", vec![8, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4], sizes(k));
        r.eq(
            f,
            "params",
            layout(&[
                (0, 8),
                (8, 8),
                (16, 8),
                (24, 8),
                (32, 8),
                (40, 8),
                (48, 8),
                (56, 8),
                (64, 8),
                (72, 4),
                (76, 4),
                (80, 4),
            ]),
            params3(k),
        );
        r.eq(f, "param_bytes", 84, k.param_bytes);
        r.eq(
            f,
            "demangled",
            Some(
                "void vllm::rms_norm_kernel<c10::BFloat16, 8, 2, true>(c10::BFloat16*, c10::BFloat16 const*, long, long, long, long, long, c10::BFloat16 const*, long, float, int, int)",
            ),
            k.demangled.as_deref(),
        );
        let want_types: Vec<String> = [
            "c10::BFloat16*",
            "c10::BFloat16 const*",
            "long",
            "long",
            "long",
            "long",
            "long",
            "c10::BFloat16 const*",
            "long",
            "float",
            "int",
            "int",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        r.eq(f, "cpp_params", Some(want_types), k.cpp_params.clone());
        if im.kind == ImageKind::Cubin {
            // block_sum's __shared__ float[32].
            r.check(k.shared_bytes.is_some_and(|s| s >= 128), || format!("{f}: shared_bytes {:?}", k.shared_bytes));
        }
    }
    r.finish("vllm_rms_norm_signature");
}

fn triton_param_size(ty: &str) -> Option<u32> {
    if ty.starts_with('*') {
        return Some(8);
    }
    match ty {
        "i1" | "i8" | "u8" => Some(1),
        "i16" | "u16" | "fp16" | "bf16" => Some(2),
        "i32" | "u32" | "fp32" => Some(4),
        "i64" | "u64" | "fp64" => Some(8),
        _ => None,
    }
}

#[test]
fn triton_kernels() {
    let mut r = Report::default();
    for base in ["triton_rmsnorm", "triton_add"] {
        let meta: serde_json::Value = serde_json::from_str(&read_text(&format!("{base}.json"))).unwrap();
        let name = meta["name"].as_str().unwrap().to_string();
        let num_warps = meta["num_warps"].as_u64().unwrap() as u32;
        let sig: Vec<(String, String)> = meta["signature"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap().to_string(), p["type"].as_str().unwrap().to_string()))
            .collect();
        let runtime: Vec<&(String, String)> = sig.iter().filter(|(_, t)| t != "constexpr").collect();
        for ext in ["cubin", "ptx"] {
            let f = format!("{base}.{ext}");
            let b = load(&f);
            let Some(im) = only_image(&mut r, &f, &b) else { continue };
            r.eq(
                &f,
                "kernel names",
                vec![name.as_str()],
                im.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            );
            if ext == "cubin" {
                // Triton compiles for sm_90a (GPUTarget("cuda", 90, 32)) with its bundled ptxas.
                r.eq(&f, "arch", "sm_90a".to_string(), arch_str(im));
            }
            let Some(k) = kernel(&mut r, &f, im, &name) else { continue };
            r.eq(&f, "param count (signature - constexprs + 2 hidden)", runtime.len() + 2, k.params.len());
            let mut want_sizes: Vec<Option<u32>> = runtime.iter().map(|(_, t)| triton_param_size(t)).collect();
            want_sizes.extend([Some(8), Some(8)]);
            r.eq(
                &f,
                "param sizes (last two: global/profile scratch pointers)",
                want_sizes,
                k.params.iter().map(|p| Some(p.size)).collect(),
            );
            r.eq(&f, "required_block (.reqntid = 32 * num_warps)", Some([32 * num_warps, 1, 1]), k.required_block);
            r.eq(&f, "demangled", None, k.demangled.as_deref());
            if ext == "ptx" {
                let n = k.params.len();
                if n >= 2 {
                    r.check(k.params[n - 2].pointer && k.params[n - 1].pointer, || {
                        format!("{f}: hidden params not .ptr: {:?}", &k.params[n - 2..])
                    });
                }
            }
        }
    }
    r.finish("triton_kernels");
}

/// Compressed fatbins decompress to the same images, with the same kernels, as the raw one.
#[test]
fn compressed_fatbins() {
    let mut r = Report::default();
    let plain = load("vecadd.fatbin");
    for im in &plain.images {
        r.eq("vecadd.fatbin", "compression", (false, Compression::None), (im.compressed, im.compression));
    }
    for (f, comp) in [("vecadd.zstd.fatbin", Compression::Zstd), ("vecadd.lz4.fatbin", Compression::Lz4)] {
        let b = load(f);
        r.eq(f, "file kind", FileKind::Fatbin, b.kind);
        r.eq(f, "image count", plain.images.len(), b.images.len());
        for kind in [ImageKind::Cubin, ImageKind::Ptx] {
            let (a, c) = (images_of(&plain, kind), images_of(&b, kind));
            r.eq(f, &format!("{kind:?} image count"), a.len(), c.len());
            for (p, z) in a.iter().zip(&c) {
                let ctx = format!("{f} {kind:?} {}", arch_str(z));
                r.eq(&ctx, "compressed, compression", (true, comp), (z.compressed, z.compression));
                r.eq(&ctx, "arch", arch_str(p), arch_str(z));
                // PTX stored raw is NUL-padded to 8 bytes; compare the text.
                let trim = |d: &[u8]| d.iter().rposition(|&c| c != 0).map(|e| d[..=e].to_vec()).unwrap_or_default();
                r.check(trim(&p.data) == trim(&z.data), || {
                    format!("{ctx}: decompressed bytes differ from vecadd.fatbin's")
                });
                let names = |im: &Image| {
                    im.kernels
                        .iter()
                        .map(|k| (k.name.clone(), params3(k), k.param_bytes, k.registers))
                        .collect::<Vec<_>>()
                };
                r.eq(&ctx, "kernels (name, params, param_bytes, registers)", names(p), names(z));
            }
        }
        // The decompressed cubin is the same one nvcc -cubin writes (modulo nothing: same ptxas run).
        if let Some(c) = images_of(&b, ImageKind::Cubin).first() {
            let bare = load("vecadd.sm_90.cubin");
            let names =
                |im: &Image| im.kernels.iter().map(|k| (k.name.clone(), params3(k), k.param_bytes)).collect::<Vec<_>>();
            r.eq(f, "kernels vs vecadd.sm_90.cubin", names(&bare.images[0]), names(c));
        }
    }
    // nvcc's default: the PTX entry zstd-compressed, the ELF entry raw.
    let m = load("mixed.fatbin");
    for im in &m.images {
        let want = if im.kind == ImageKind::Ptx { (true, Compression::Zstd) } else { (false, Compression::None) };
        r.eq("mixed.fatbin", &format!("{:?} compression", im.kind), want, (im.compressed, im.compression));
    }
    r.finish("compressed_fatbins");
}

/// `Binary::select` on multi-arch containers.
#[test]
fn image_selection() {
    let mut r = Report::default();
    for f in ["libvecadd.so", "libvecadd_ext.so"] {
        let b = load(f);
        r.eq(f, "file kind", FileKind::HostElf, b.kind);
        match b.select(arch("sm_90")) {
            Some((_, im)) => {
                r.eq(f, "select(sm_90) kind", ImageKind::Cubin, im.kind);
                r.eq(f, "select(sm_90) arch", "sm_90".to_string(), arch_str(im));
                // libvecadd.so also holds nvlink's kernel-less sm_80/sm_90 images: the chosen
                // one must be the one with the kernel.
                r.check(im.kernel(VECADD).is_some(), || {
                    format!("{f}: select(sm_90) chose an image without VecAdd (offset {:#x})", im.offset)
                });
            }
            None => r.fail(format!("{f}: select(sm_90) found nothing")),
        }
        match b.select(arch("sm_80")) {
            Some((_, im)) => {
                r.eq(f, "select(sm_80)", (ImageKind::Cubin, "sm_80".to_string()), (im.kind, arch_str(im)));
                r.check(im.kernel(VECADD).is_some(), || format!("{f}: select(sm_80) chose an image without VecAdd"));
            }
            None => r.fail(format!("{f}: select(sm_80) found nothing")),
        }
        match b.select(arch("sm_100")) {
            Some((_, im)) => {
                r.eq(f, "select(sm_100)", (ImageKind::Ptx, "sm_90".to_string()), (im.kind, arch_str(im)));
                r.check(im.kernel(VECADD).is_some(), || format!("{f}: select(sm_100) PTX without VecAdd"));
            }
            None => r.fail(format!("{f}: select(sm_100) found nothing (the compute_90 PTX should JIT)")),
        }
        r.check(b.select(arch("sm_75")).is_none(), || format!("{f}: select(sm_75) found an image"));
    }
    let f = "vecadd.multi.fatbin";
    let b = load(f);
    let sel = |a: &str| b.select(arch(a)).map(|(_, im)| (im.kind, arch_str(im)));
    let sm90 = sel("sm_90");
    r.check(matches!(&sm90, Some((ImageKind::Cubin, a)) if a.starts_with("sm_90")), || {
        format!("{f}: select(sm_90) = {sm90:?}")
    });
    r.eq(f, "select(sm_80)", Some((ImageKind::Cubin, "sm_80".to_string())), sel("sm_80"));
    r.eq(f, "select(sm_86)", Some((ImageKind::Ptx, "sm_80".to_string())), sel("sm_86"));
    r.eq(f, "select(sm_100)", Some((ImageKind::Ptx, "sm_90".to_string())), sel("sm_100"));
    r.eq(f, "select(sm_75)", None, sel("sm_75"));
    let archs: Vec<String> = images_of(&b, ImageKind::Cubin).iter().map(|im| arch_str(im)).collect();
    r.eq(f, "cubin archs", vec!["sm_80".to_string(), "sm_90".into(), "sm_90a".into()], archs);
    r.finish("image_selection");
}

/// The PTX reader's layout agrees with the cubin's for the same source.
#[test]
fn ptx_params_agree_with_cubin() {
    let mut r = Report::default();
    let compare = |ctx: &str, ptx: &Image, cubin: &Image, r: &mut Report| {
        let pn: BTreeSet<&str> = ptx.kernels.iter().map(|k| k.name.as_str()).collect();
        let cn: BTreeSet<&str> = cubin.kernels.iter().map(|k| k.name.as_str()).collect();
        r.eq(ctx, "kernel names (PTX vs cubin)", cn, pn);
        for ck in &cubin.kernels {
            if let Some(pk) = ptx.kernel(&ck.name) {
                let kctx = format!("{ctx}: {}", ck.name);
                r.eq(&kctx, "params (cubin vs PTX)", params3(ck), params3(pk));
                r.eq(&kctx, "param_bytes (cubin vs PTX)", ck.param_bytes, pk.param_bytes);
                r.eq(&kctx, "required_block (cubin vs PTX)", ck.required_block, pk.required_block);
                r.eq(&kctx, "max_threads (cubin vs PTX)", ck.max_threads, pk.max_threads);
            }
        }
    };
    for (p, c) in [
        ("vecadd.sm_90.ptx", "vecadd.sm_90.cubin"),
        ("mixed.sm_90.ptx", "mixed.sm_90.cubin"),
        ("vllm_rms_norm.sm_90.ptx", "vllm_rms_norm.sm_90.cubin"),
        ("triton_rmsnorm.ptx", "triton_rmsnorm.cubin"),
        ("triton_add.ptx", "triton_add.cubin"),
    ] {
        let (pb, cb) = (load(p), load(c));
        if let (Some(pi), Some(ci)) = (pb.images.first(), cb.images.first()) {
            compare(&format!("{p} vs {c}"), pi, ci, &mut r);
        }
    }
    // Inside containers: each PTX entry against the cubin of the same SM.
    for f in [
        "vecadd.fatbin",
        "vecadd.zstd.fatbin",
        "vecadd.lz4.fatbin",
        "vecadd.multi.fatbin",
        "mixed.fatbin",
        "libvecadd.so",
        "libvecadd_ext.so",
        "vecadd",
    ] {
        let b = load(f);
        let mut pairs = 0;
        for p in images_of(&b, ImageKind::Ptx) {
            let c = images_of(&b, ImageKind::Cubin).into_iter().rfind(|c| c.arch == p.arch && !c.kernels.is_empty());
            if let Some(c) = c {
                pairs += 1;
                compare(&format!("{f} PTX {} vs cubin", arch_str(p)), p, c, &mut r);
            }
        }
        r.check(pairs >= 1, || format!("{f}: no PTX/cubin pair of the same arch"));
    }
    r.finish("ptx_params_agree_with_cubin");
}

/// The arch-specific flag of sm_90a cubins: nvcc 13 (ELF ABI 8) writes the same e_flags for
/// sm_90 and sm_90a and marks the `a` in `.nv.compat` (EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET = 1;
/// sm_80 cubins have no `.nv.compat` at all); ptxas 12.8 (ABI 7: Triton, CUDA 12 builds) marks it
/// in e_flags bit 0x800 and writes no `.nv.compat`. cuobjdump's header shows `sm=90a` for both.
#[test]
fn arch_specific_cubins() {
    let mut r = Report::default();
    let d = elf_dump("vecadd.multi.fatbin");
    let by_arch: BTreeMap<&str, Option<u64>> =
        d.elfs.iter().map(|e| (e.arch.as_str(), e.accelerator_target())).collect();
    r.eq(
        "vecadd.multi.fatbin",
        ".nv.compat accelerator target per arch (cuobjdump)",
        BTreeMap::from([("sm_80", None), ("sm_90", Some(0)), ("sm_90a", Some(1))]),
        by_arch,
    );
    let flags: BTreeSet<u64> = d.elfs.iter().filter(|e| e.arch.starts_with("sm_90")).map(|e| e.flags).collect();
    r.eq("vecadd.multi.fatbin", "sm_90 and sm_90a e_flags identical", 1, flags.len());
    for (f, want) in [
        ("triton_add.cubin", "sm_90a"),
        ("triton_rmsnorm.cubin", "sm_90a"),
        ("vecadd.ptxas128.sm_90.cubin", "sm_90"),
        ("vecadd.ptxas128.sm_90a.cubin", "sm_90a"),
    ] {
        let d = elf_dump(f);
        r.eq(f, "ELF ABI (cuobjdump)", 7, d.elfs[0].abi);
        r.eq(f, "arch (cuobjdump)", want, d.elfs[0].arch.as_str());
        r.eq(f, ".nv.compat (cuobjdump)", None, d.elfs[0].accelerator_target());
        r.eq(f, "e_flags bit 0x800 (cuobjdump)", want.ends_with('a'), d.elfs[0].flags & 0x800 != 0);
        r.eq(f, "arch (kern-binary)", want.to_string(), arch_str(&load(f).images[0]));
    }
    r.finish("arch_specific_cubins");
}
