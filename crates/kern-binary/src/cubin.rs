//! Cubins: device ELF files (`e_machine` = EM_CUDA). The ELF structure is read with the
//! `object` crate; the CUDA-specific parts (`.nv.info` records, the arch in `e_flags`, the
//! `.note.nv.cuinfo` note) are read here.
//!
//! A kernel is a symbol with `STT_FUNC`, `STB_GLOBAL` (or `STB_WEAK`, for template instances
//! in relocatable cubins) and `STO_ENTRY` (0x10 in `st_other`).
//! Its metadata is in `.nv.info.<kernel>` (whose `sh_info` is the kernel's `.text` section),
//! plus per-function records in the module-wide `.nv.info`, keyed by symbol index.

use crate::error::{Ctx, LeBytes};
use crate::nvinfo::{self, attr, KParamInfo};
use crate::{demangle, Arch, Compression, Image, ImageKind, Kernel, Param, Result};
use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::Endianness;
use std::collections::HashMap;

/// ELF `e_machine` of NVIDIA device code.
pub const EM_CUDA: u16 = 190;
/// `sh_type` of `.nv.info` sections.
pub const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// `st_other` bit marking a kernel entry point.
pub const STO_ENTRY: u8 = 0x10;

/// Whether `data` starts like an ELF file for EM_CUDA.
pub fn is_cubin(data: &[u8]) -> bool {
    data.starts_with(b"\x7fELF") && data.u16_at(18) == Some(EM_CUDA)
}

/// Reads one cubin. `offset` is where the image sits in the file it came from (for errors).
pub(crate) fn read_cubin(ctx: &Ctx, data: &[u8], offset: u64, compression: Compression) -> Result<Image> {
    let kernels_and_meta = parse(ctx, data)?;
    Ok(Image {
        kind: ImageKind::Cubin,
        arch: Some(kernels_and_meta.arch),
        compressed: compression != Compression::None,
        compression,
        offset,
        container: 0,
        size: data.len() as u64,
        name: None,
        toolkit: kernels_and_meta.toolkit,
        ptx_version: None,
        kernels: kernels_and_meta.kernels,
        data: data.to_vec(),
    })
}

struct Parsed {
    arch: Arch,
    toolkit: Option<String>,
    kernels: Vec<Kernel>,
}

fn parse(ctx: &Ctx, data: &[u8]) -> Result<Parsed> {
    let elf_err = |e: object::read::Error| ctx.err(0, format!("invalid ELF: {e}"));
    if data.get(4) != Some(&elf::ELFCLASS64.0) {
        return Err(ctx.err(4, "not a 64-bit ELF (cubins are ELF64)"));
    }
    let header = FileHeader64::<Endianness>::parse(data).map_err(elf_err)?;
    let endian = header.endian().map_err(elf_err)?;
    let machine = header.e_machine(endian).0;
    if machine != EM_CUDA {
        return Err(ctx.err(18, format!("ELF e_machine is {machine}, not {EM_CUDA} (EM_CUDA): not a cubin")));
    }
    let abi = header.e_ident().abi_version;
    let flags = header.e_flags(endian).0;
    let sm = match abi {
        0..=6 => return Err(ctx.err(8, format!("cubin ELF ABI version {abi} is older than kern reads (7 and 8)"))),
        7 => flags & 0xff,
        _ => (flags >> 8) & 0xff,
    };
    let sections = header.sections(endian, data).map_err(elf_err)?;

    let mut text_to_info: HashMap<u32, (&[u8], u64)> = HashMap::new();
    let mut module_info: Option<(&[u8], u64)> = None;
    let mut shared: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut arch_specific = false;
    let mut toolkit = None;
    for (index, sh) in sections.enumerate() {
        let name = sections.section_name(endian, sh).unwrap_or_default();
        let sh_off = sh.sh_offset(endian);
        if sh.sh_type(endian).0 == SHT_CUDA_INFO {
            let bytes = sh.data(endian, data).map_err(|_| {
                ctx.err(sh_off, format!("section {} lies past the end of the file", String::from_utf8_lossy(name)))
            })?;
            if name == b".nv.info" {
                module_info = Some((bytes, sh_off));
            } else {
                text_to_info.insert(sh.sh_info(endian), (bytes, sh_off));
            }
        } else if let Some(k) = name.strip_prefix(b".nv.shared.") {
            shared.insert(k.to_vec(), sh.sh_size(endian));
        } else if name == b".nv.compat" {
            // EICOMPAT_ATTR_CUDA_ACCELERATOR_TARGET (9) = 1 marks an sm_XXa build.
            if let Ok(bytes) = sh.data(endian, data) {
                if let Ok(recs) = nvinfo::records(ctx, bytes, sh_off) {
                    arch_specific = recs.iter().any(|r| r.attr == 9 && r.format == nvinfo::FMT_BVAL && r.value & 0xff == 1);
                }
            }
        } else if name == b".note.nv.cuinfo" {
            toolkit = sh.data(endian, data).ok().and_then(cuinfo_toolkit);
        }
        let _ = index;
    }

    // Module-wide records keyed by symbol index.
    let mut regcount: HashMap<u32, u32> = HashMap::new();
    let mut frame: HashMap<u32, u32> = HashMap::new();
    if let Some((bytes, off)) = module_info {
        for r in nvinfo::records(ctx, bytes, off)? {
            if r.format != nvinfo::FMT_SVAL || r.payload.len() < 8 {
                continue;
            }
            let (sym, val) = (r.payload.u32_at(0).unwrap_or(0), r.payload.u32_at(4).unwrap_or(0));
            match r.attr {
                attr::REGCOUNT => {
                    regcount.insert(sym, val);
                }
                attr::FRAME_SIZE => {
                    frame.insert(sym, val);
                }
                _ => {}
            }
        }
    }

    let symbols = sections.symbols(endian, data, elf::SHT_SYMTAB).map_err(elf_err)?;
    let mut kernels = Vec::new();
    for (i, sym) in symbols.iter().enumerate() {
        // Entries are global, or weak for template instantiations in relocatable (-rdc)
        // cubins; compiler helpers are functions too but lack the entry flag.
        let is_entry = sym.st_type() == elf::STT_FUNC
            && (sym.st_bind() == elf::STB_GLOBAL || sym.st_bind() == elf::STB_WEAK)
            && sym.st_other().0 & STO_ENTRY != 0;
        if !is_entry {
            continue;
        }
        let name = sym
            .name(endian, symbols.strings())
            .map_err(|_| ctx.err(0, format!("symbol {i} has a name outside the string table")))?;
        let name_str = String::from_utf8_lossy(name).into_owned();
        let kctx = ctx.nested(format!("kernel {name_str}"));
        let mut k = Kernel { name: name_str, ..Default::default() };
        k.demangled = demangle::demangle(&k.name);
        k.cpp_params = k.demangled.as_deref().and_then(demangle::param_types);
        k.cute = crate::cute::decode(&k.name);
        k.registers = regcount.get(&(i as u32)).copied();
        k.frame_bytes = frame.get(&(i as u32)).copied();
        k.shared_bytes = Some(shared.get(name).copied().unwrap_or(0));
        let text_index = u32::from(sym.st_shndx(endian).0);
        if let Some((bytes, off)) = text_to_info.get(&text_index) {
            read_kernel_info(&kctx, &mut k, bytes, *off)?;
        }
        kernels.push(k);
    }
    // ABI 7 marks sm_XXa builds with EF_CUDA_ACCELERATORS (0x800) in e_flags; ABI 8 in
    // `.nv.compat`. ABI 7 keeps the toolkit version (×10) in e_version, ABI 8 in the note.
    if abi == 7 {
        arch_specific |= flags & 0x800 != 0;
        let v = header.e_version(endian);
        if toolkit.is_none() && v >= 10 {
            toolkit = Some(format!("{}.{}", v / 10, v % 10));
        }
    }
    let suffix = if arch_specific { Some('a') } else { None };
    Ok(Parsed { arch: Arch { sm, suffix }, toolkit, kernels })
}

/// The toolkit version from `.note.nv.cuinfo` (desc: u16 note version, u16 virtual SM, u32
/// toolkit version × 10).
fn cuinfo_toolkit(note: &[u8]) -> Option<String> {
    let namesz = note.u32_at(0)? as usize;
    let descsz = note.u32_at(4)? as usize;
    let desc_off = 12usize.checked_add(namesz.checked_add(3)? & !3)?;
    let desc = note.slice_at(desc_off, descsz)?;
    let v = desc.u32_at(4)?;
    Some(format!("{}.{}", v / 10, v % 10))
}

fn read_kernel_info(ctx: &Ctx, k: &mut Kernel, bytes: &[u8], base: u64) -> Result<()> {
    let mut params: Vec<(KParamInfo, u64)> = Vec::new();
    let mut param_bytes = None;
    let mut cbank_size = None;
    for r in nvinfo::records(ctx, bytes, base)? {
        let at = base + r.offset as u64;
        let words = || {
            nvinfo::u32s(r.payload)
                .filter(|w| w.len() == 3)
                .map(|w| [w[0], w[1], w[2]])
                .ok_or_else(|| ctx.err(at, format!("attribute {:#04x} should hold three u32 (x, y, z), has {} bytes", r.attr, r.payload.len())))
        };
        match (r.attr, r.format) {
            (attr::KPARAM_INFO, nvinfo::FMT_SVAL) => {
                let p = KParamInfo::parse(r.payload)
                    .ok_or_else(|| ctx.err(at, format!("KPARAM_INFO payload is {} bytes, expected 12", r.payload.len())))?;
                params.push((p, at));
            }
            (attr::MAX_THREADS, nvinfo::FMT_SVAL) => k.max_threads = Some(words()?),
            (attr::REQNTID, nvinfo::FMT_SVAL) => k.required_block = Some(words()?),
            (attr::MAXREG_COUNT, nvinfo::FMT_HVAL) => k.max_registers = Some(u32::from(r.value)),
            (attr::CBANK_PARAM_SIZE, nvinfo::FMT_HVAL) => param_bytes = Some(u32::from(r.value)),
            (attr::PARAM_CBANK, nvinfo::FMT_SVAL) => cbank_size = r.payload.u16_at(6).map(u32::from),
            _ => {}
        }
    }
    // Records come in reverse ordinal order; ordinals must be exactly 0..n.
    params.sort_by_key(|(p, _)| p.ordinal);
    for (i, (p, at)) in params.iter().enumerate() {
        if usize::from(p.ordinal) != i {
            return Err(ctx.err(*at, format!("KPARAM_INFO ordinals are not 0..{}: ordinal {} at position {i} (duplicate or missing parameter)", params.len(), p.ordinal)));
        }
        if !p.in_cbank {
            return Err(ctx.err(*at, format!("parameter {} is not in the constant bank; kern does not know this layout", p.ordinal)));
        }
    }
    k.params = params
        .iter()
        .map(|(p, _)| Param {
            ordinal: u32::from(p.ordinal),
            offset: u32::from(p.offset),
            size: p.size,
            align: None,
            ptx_type: None,
            pointer: false,
        })
        .collect();
    let computed = k.params.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
    k.param_bytes = param_bytes.or(cbank_size).unwrap_or(computed);
    if computed > k.param_bytes {
        return Err(ctx.err(base, format!("parameters end at byte {computed}, past the declared parameter size {}", k.param_bytes)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_toolkit() {
        let note = hex("0c00000008000000e80300004e564944494120436f72700002005a0082000000");
        assert_eq!(cuinfo_toolkit(&note).as_deref(), Some("13.0"));
        assert_eq!(cuinfo_toolkit(&note[..20]), None);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn non_cuda_elf_is_rejected() {
        let mut d = vec![0u8; 64];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        d[6] = 1;
        d[18] = 62; // x86-64
        let e = parse(&Ctx::new("x.o"), &d).err().unwrap().to_string();
        assert!(e.contains("x.o"), "{e}");
    }
}
